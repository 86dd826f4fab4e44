// SPDX-License-Identifier: MIT
//! Builder::run: serve a device until it is deleted or a signal says stop.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::device::{Builder, Handler};
use crate::error::{Error, Result};
use crate::Errno;

/// SIGINT and SIGTERM blocked in this thread, the old mask put back on drop.
struct Blocked {
    set: libc::sigset_t,
    old: libc::sigset_t,
}

impl Blocked {
    fn new() -> Blocked {
        // SAFETY: sigset_t is plain data that sigemptyset() initialises;
        // pthread_sigmask() changes only this thread's mask.
        unsafe {
            let mut set = std::mem::zeroed();
            let mut old = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            Blocked { set, old }
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in new(), in the same thread
        // (Blocked is not Send: sigset_t holds no pointer, but run() keeps
        // it on its stack).
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

fn fd(ret: i32, what: &str) -> Result<OwnedFd> {
    if ret < 0 {
        return Err(Error::new(Errno::last(), format!("{what} failed")));
    }
    // SAFETY: ret is a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret) })
}

/// systemd's Type=notify: READY=1 to $NOTIFY_SOCKET, as hybd_run() does.
fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)
            .and_then(|a| sock.send_to_addr(b"READY=1", &a))
    } else {
        sock.send_to(b"READY=1", &path)
    };
    if let Err(e) = sent {
        crate::say(format_args!("NOTIFY_SOCKET: {e}"));
    }
}

pub(crate) fn run<H: Handler>(b: Builder, handler: H) -> Result<()> {
    let blocked = Blocked::new();
    // SAFETY: the set is initialised; a new fd is returned or -1.
    let sigfd = fd(
        unsafe { libc::signalfd(-1, &blocked.set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) },
        "signalfd",
    )?;
    // SAFETY: plain system call.
    let done = fd(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) }, "eventfd")?;

    let dev = b.create(handler)?;
    dev.handler()
        .prepare(&dev)
        .map_err(|e| Error::new(e, "the prepare hook failed"))?;
    dev.start()?;
    dev.handler().ready(&dev);
    notify_ready();

    let waited = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let r = dev.wait();
            let one = 1u64;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(done.as_raw_fd(), &one as *const u64 as *const _, 8) };
            r
        });
        let mut fds = [
            libc::pollfd {
                fd: sigfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: done.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: fds is a live array of two pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                if Errno::last().0 == libc::EINTR {
                    continue;
                }
                // cannot wait for a signal: ask for the delete now
                // SAFETY: plain control call (the workers serve: our id).
                unsafe { hybd_sys::hybd_ctl_del(dev.id()) };
                break;
            }
            if fds[1].revents != 0 {
                break;
            }
            if fds[0].revents != 0 {
                let mut info = [0u8; 128]; // struct signalfd_siginfo
                                           // SAFETY: reads at most 128 bytes into the buffer.
                unsafe { libc::read(sigfd.as_raw_fd(), info.as_mut_ptr() as *mut _, info.len()) };
                // graceful: the kernel drains through the workers, which
                // then exit and the waiter says so
                // SAFETY: plain control call.
                unsafe { hybd_sys::hybd_ctl_del(dev.id()) };
            }
        }
        waiter
            .join()
            .unwrap_or_else(|_| Err(Error::new(Errno::EIO, "the waiter panicked")))
    });
    let deleted = dev.delete();
    // a SIGINT or SIGTERM that came during the delete is consumed here,
    // not delivered (and fatal) once the mask is restored
    let mut info = [0u8; 128];
    // SAFETY: non-blocking reads of at most 128 bytes into the buffer.
    while unsafe { libc::read(sigfd.as_raw_fd(), info.as_mut_ptr() as *mut _, info.len()) } > 0 {}
    drop(blocked);
    waited.and(deleted)
}
