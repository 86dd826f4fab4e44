//! Write the slow path of a [hybd](https://example.invalid/hybd) block
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
pub use request::{IoFlags, Op, Request};
