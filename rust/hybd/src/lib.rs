// SPDX-License-Identifier: MIT
//! Write the slow path of a hybd block
//! driver in safe Rust, and attach its BPF fast path.
//!
//! A driver is a [`Handler`]: one method per operation, each given the
//! [`Request`] by value.  A request is completed exactly once, with
//! [`Request::complete`], in the handler or later from any thread or async
//! task; the compiler refuses a second completion, and one dropped without
//! a completion fails with EIO and is counted.  [`Builder`] sets the
//! device's parameters, [`Device`] serves it, [`FastPath`] attaches a
//! `.bpf.o` that serves what it can in the kernel, [`ctl`] reaches any
//! device by id.
//!
//! A RAM disk, whole (`examples/ramdisk.rs`, which the guest tests run):
#![doc = concat!("\n```no_run\n", include_str!("../examples/ramdisk.rs"), "\n```\n")]
//!
//! The same, served by hand and completed from another thread:
//!
//! ```no_run
//! # use hybd::{Builder, Handler, Request};
//! struct Zeros;
//! impl Handler for Zeros {
//!     fn read(&self, mut req: Request) {
//!         std::thread::spawn(move || {
//!             req.buf_mut().fill(0);
//!             req.complete(Ok(()));
//!         });
//!     }
//! }
//! let dev = Builder::new(16 << 20).create(Zeros)?;
//! dev.start()?;
//! println!("{}", dev.path());
//! dev.wait()?;            // until `hybdctl del`
//! dev.delete()?;
//! # Ok::<(), hybd::Error>(())
//! ```
//!
//! Nothing in a driver needs `unsafe`.  The crate's own `unsafe` blocks
//! each say what they rely on.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod bpf;
pub mod ctl;
mod device;
mod error;
mod queue;
mod request;
mod run;

pub use bpf::{detach_pinned, open_pinned_map, FastPath, Map, MappedWords, OwnedMap};
pub use device::{Builder, Device, DeviceRef, Handler, Ops};
pub use error::{Errno, Error, Result};
pub use hybd_sys as sys;
pub use queue::Queue;
pub use request::{Buf, BufMut, IoFlags, Op, Request};

/// A line on stderr that cannot panic (a closed stderr is ignored): for
/// the trampolines, which must not unwind into C.
pub(crate) fn say(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "hybd: {args}");
}

/// Keep this process off the swap it may serve: lock its memory
/// (`mlockall`, current and future: it would otherwise be swapped out to
/// itself) and make its threads, which inherit it, I/O flushers
/// (`PR_SET_IO_FLUSHER`: no reclaim through I/O while they allocate).
/// Call it before creating the device.  Both need privileges
/// (CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK, CAP_SYS_RESOURCE); the
/// error says which failed, and a device whose server could not do both
/// must not carry swap.
pub fn keep_off_swap() -> Result<()> {
    // SAFETY: plain system call without pointers.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        return Err(Error::new(Errno::last(), "mlockall (memory not locked)"));
    }
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: as above.
    if unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) } != 0 {
        return Err(Error::new(
            Errno::last(),
            "PR_SET_IO_FLUSHER (not an I/O flusher)",
        ));
    }
    Ok(())
}
