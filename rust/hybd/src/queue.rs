// SPDX-License-Identifier: MIT
//! A hardware queue, as its hooks see it, and the fds its worker watches.

use std::os::fd::{AsRawFd, RawFd};
use std::os::raw::{c_int, c_uint, c_void};

use hybd_sys as sys;

use crate::error::{check, Result};

type Callback = Box<dyn FnMut(&Queue, u32)>;

struct Watch {
    fd: RawFd,
    cb: Callback,
}

/// The crate's own per-queue state, behind `hybd_queue_priv()`: the
/// watched fds' callbacks, as raw pointers from `Box::into_raw` (libhybd
/// holds them too, and a callback runs through its own).  One unwatched
/// goes to `unwatched` and is freed at the next safe point, so that a
/// callback may unwatch its own fd.  Made in the queue_init trampoline and
/// freed in queue_exit's (or when queue_init fails), in the worker thread.
#[derive(Default)]
pub(crate) struct QueueState {
    watches: Vec<*mut Watch>,
    unwatched: Vec<*mut Watch>,
}

impl QueueState {
    fn reap(&mut self) {
        for w in self.unwatched.drain(..) {
            // SAFETY: from Box::into_raw, unwatched, and no callback runs.
            drop(unsafe { Box::from_raw(w) });
        }
    }
}

impl Drop for QueueState {
    fn drop(&mut self) {
        self.unwatched.append(&mut self.watches);
        self.reap();
    }
}

/// A hardware queue, lent to [`crate::Handler`]'s queue hooks, which run in
/// the queue's worker thread.  Not `Send`: what it offers is for that
/// thread only.
pub struct Queue {
    q: *mut sys::hybd_queue,
}

impl Queue {
    /// # Safety
    /// `q` is a queue of a live device, and the caller is its worker.
    pub(crate) unsafe fn from_raw(q: *mut sys::hybd_queue) -> Queue {
        Queue { q }
    }

    /// The queue's index, `0..nr_queues`.
    pub fn index(&self) -> usize {
        // SAFETY: q is valid while the hook runs (from_raw's contract).
        unsafe { sys::hybd_queue_index(self.q) as usize }
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut QueueState) -> R) -> R {
        // SAFETY: the trampolines set the priv to a QueueState before any
        // hook gets a Queue and free it after the last; only the worker
        // thread touches it, and only here, where no user code runs, so no
        // two borrows of it overlap.
        f(unsafe { &mut *(sys::hybd_queue_priv(self.q) as *mut QueueState) })
    }

    /// Make the worker wait for `fd` too, and call `cb(queue, revents)` in
    /// the worker thread when it is ready: `events` is a mask of
    /// `libc::POLLIN`, `POLLOUT`, `POLLPRI` (errors and hangups are always
    /// reported).  The callback must consume what made the fd ready, or it
    /// is called again at once.  The first fd must be watched from
    /// [`crate::Handler::queue_init`]; at most 8 per queue.  The fd stays
    /// the caller's, and must stay open until it is unwatched or the queue
    /// stops ([`crate::Handler::queue_exit`]): a watched fd that is closed
    /// stops the worker.
    pub fn watch_fd(
        &self,
        fd: &impl AsRawFd,
        events: u32,
        cb: impl FnMut(&Queue, u32) + 'static,
    ) -> Result<()> {
        let fd = fd.as_raw_fd();
        let w = Box::into_raw(Box::new(Watch {
            fd,
            cb: Box::new(cb),
        }));
        // SAFETY: w stays allocated until libhybd promises not to call back
        // for it (unwatch, queue exit).
        let ret = unsafe {
            sys::hybd_queue_watch_fd_events(
                self.q,
                fd,
                events as c_uint,
                Some(on_ready),
                w as *mut c_void,
            )
        };
        if ret < 0 {
            // SAFETY: libhybd did not take it.
            drop(unsafe { Box::from_raw(w) });
            return check(ret).map(drop);
        }
        self.with_state(|st| st.watches.push(w));
        Ok(())
    }

    /// Change the events waited for on a watched fd (at the next wait).
    pub fn set_fd_events(&self, fd: &impl AsRawFd, events: u32) -> Result<()> {
        // SAFETY: q is valid; libhybd checks that fd is watched.
        check(unsafe { sys::hybd_queue_fd_events(self.q, fd.as_raw_fd(), events as c_uint) })
            .map(drop)
    }

    /// Stop watching `fd`; its callback is dropped.
    pub fn unwatch_fd(&self, fd: &impl AsRawFd) -> Result<()> {
        let fd = fd.as_raw_fd();
        // SAFETY: q is valid; once this returns, libhybd calls no callback
        // for fd, so its Watch may go.
        check(unsafe { sys::hybd_queue_unwatch_fd(self.q, fd) })?;
        self.with_state(|st| {
            // SAFETY: the pointers are live Watches (from into_raw).
            let (gone, kept) = st.watches.iter().partition(|&&w| unsafe { (*w).fd } == fd);
            st.watches = kept;
            st.unwatched.extend::<Vec<_>>(gone);
        });
        Ok(())
    }
}

unsafe extern "C" fn on_ready(
    q: *mut sys::hybd_queue,
    _fd: c_int,
    revents: c_uint,
    arg: *mut c_void,
) {
    // SAFETY: this runs in the queue's worker, whose queue q is.
    let queue = unsafe { Queue::from_raw(q) };
    // no callback runs: what was unwatched may go
    queue.with_state(QueueState::reap);
    // SAFETY: arg is the Watch registered with this callback, allocated
    // until unwatched and reaped, which cannot happen while it runs; the
    // state only holds its pointer, so this is the one reference.
    let w = unsafe { &mut *(arg as *mut Watch) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (w.cb)(&queue, revents)));
    if r.is_err() {
        crate::say(format_args!(
            "a watched fd's callback panicked (queue {})",
            queue.index()
        ));
    }
}

/// Set up the crate's state of a queue (queue_init trampoline).
///
/// # Safety
/// In q's worker, before any hook gets q.
pub(crate) unsafe fn state_init(q: *mut sys::hybd_queue) {
    let st = Box::into_raw(Box::<QueueState>::default());
    // SAFETY: q is valid (caller); the state is ours until state_free().
    unsafe { sys::hybd_queue_set_priv(q, st as *mut c_void) };
}

/// Free it (queue_exit trampoline, or a failed queue_init).
///
/// # Safety
/// In q's worker, after the last hook; libhybd calls no watched fd's
/// callback any more.
pub(crate) unsafe fn state_free(q: *mut sys::hybd_queue) {
    // SAFETY: the priv is the Box state_init() made, or NULL.
    unsafe {
        let p = sys::hybd_queue_priv(q) as *mut QueueState;
        if !p.is_null() {
            sys::hybd_queue_set_priv(q, std::ptr::null_mut());
            drop(Box::from_raw(p));
        }
    }
}
