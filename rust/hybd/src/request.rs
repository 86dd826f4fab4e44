//! One request handed to a handler, and its completion.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use hybd_sys as sys;

use crate::Errno;

/// An operation, as a request carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Read `len` bytes at `offset` into the buffer.
    Read,
    /// Write the buffer's `len` bytes at `offset`.
    Write,
    /// Make every completed write durable.
    Flush,
    /// The range's data may go; reads of it return anything until written.
    Discard,
    /// The range reads as zeros afterwards.
    WriteZeroes,
}

/// What a request's flags say (`HYBD_IO_F_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IoFlags(pub u32);

impl IoFlags {
    /// A write that must be durable when it completes.
    pub fn fua(self) -> bool {
        self.0 & sys::HYBD_IO_F_FUA != 0
    }
    /// A write-zeroes that must keep the range allocated.
    pub fn nounmap(self) -> bool {
        self.0 & sys::HYBD_IO_F_NOUNMAP != 0
    }
    /// The submitter waits for it.
    pub fn sync(self) -> bool {
        self.0 & sys::HYBD_IO_F_SYNC != 0
    }
    /// File-system metadata.
    pub fn meta(self) -> bool {
        self.0 & sys::HYBD_IO_F_META != 0
    }
}

/// What every request of a device shares with the device: whether
/// libhybd's side of it still exists, so that a completion never reaches
/// freed memory.  Completions hold the lock shared; the device takes it
/// exclusively to free libhybd's side.
pub(crate) struct Shared {
    pub(crate) live: RwLock<bool>,
    pub(crate) dropped: AtomicU64,
}

impl Shared {
    pub(crate) fn new() -> Arc<Shared> {
        Arc::new(Shared { live: RwLock::new(true), dropped: AtomicU64::new(0) })
    }
}

/// A request the device's handler received.  It must be completed exactly
/// once, with [`Request::complete`], which consumes it: the type system
/// rules out a second completion.  It may be completed in the handler or
/// later, from any thread or async task (it is `Send`).  One dropped
/// without a completion fails with EIO and is counted
/// ([`crate::Device::dropped_requests`]) and reported on stderr.
///
/// ```compile_fail
/// fn twice(req: hybd::Request) {
///     req.complete(Ok(()));
///     req.complete(Ok(())); // error: use of moved value
/// }
/// ```
pub struct Request {
    io: NonNull<sys::hybd_io>,
    shared: Arc<Shared>,
    done: bool,
}

// SAFETY: libhybd's hybd_io_complete() may be called from any thread
// (hybd.h), and the accessors only read the request's fields, which nobody
// changes until it is completed; the data buffer belongs to this request
// alone until then.  Shared is Send + Sync.
unsafe impl Send for Request {}

impl Request {
    /// # Safety
    /// `io` is a request libhybd handed to a handler, not yet completed,
    /// of the device that `shared` belongs to.
    pub(crate) unsafe fn new(io: *mut sys::hybd_io, shared: Arc<Shared>) -> Request {
        Request { io: NonNull::new(io).expect("libhybd passed a NULL request"), shared, done: false }
    }

    fn raw(&self) -> *const sys::hybd_io {
        self.io.as_ptr()
    }

    /// The operation.
    pub fn op(&self) -> Op {
        // SAFETY: the request is open (not completed) while self exists.
        match unsafe { sys::hybd_io_op(self.raw()) } {
            sys::HYBD_OP_READ => Op::Read,
            sys::HYBD_OP_WRITE => Op::Write,
            sys::HYBD_OP_FLUSH => Op::Flush,
            sys::HYBD_OP_DISCARD => Op::Discard,
            sys::HYBD_OP_WRITE_ZEROES => Op::WriteZeroes,
            // libhybd fails unknown operations before any handler
            other => unreachable!("libhybd handed over operation {other}"),
        }
    }

    /// The byte offset on the device.
    pub fn offset(&self) -> u64 {
        // SAFETY: as in op().
        unsafe { sys::hybd_io_offset(self.raw()) }
    }

    /// The length in bytes (0 for a flush).  libhybd has checked that
    /// `offset..offset + len` lies on the device.
    pub fn len(&self) -> usize {
        // SAFETY: as in op().
        unsafe { sys::hybd_io_len(self.raw()) as usize }
    }

    /// Whether the request has no data (a flush).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its flags.
    pub fn flags(&self) -> IoFlags {
        // SAFETY: as in op().
        IoFlags(unsafe { sys::hybd_io_flags(self.raw()) })
    }

    /// The hardware queue it came on, `0..nr_queues`.
    pub fn queue(&self) -> usize {
        // SAFETY: as in op().
        unsafe { sys::hybd_io_queue(self.raw()) as usize }
    }

    /// Its tag, unique within its queue while it is open.
    pub fn tag(&self) -> usize {
        // SAFETY: as in op().
        unsafe { sys::hybd_io_tag(self.raw()) as usize }
    }

    fn data(&self) -> Option<(*mut u8, usize)> {
        // SAFETY: as in op(); the buffer is NULL for operations without data.
        let p = unsafe { sys::hybd_io_buf(self.raw()) } as *mut u8;
        (!p.is_null()).then(|| (p, self.len()))
    }

    /// A write's data (empty for operations without data).
    pub fn buf(&self) -> &[u8] {
        match self.data() {
            // SAFETY: the buffer is the request's own in the shared ring,
            // len bytes, valid until completion, which needs self by value.
            Some((p, n)) => unsafe { std::slice::from_raw_parts(p, n) },
            None => &[],
        }
    }

    /// Where a read's data goes (empty for operations without data).
    pub fn buf_mut(&mut self) -> &mut [u8] {
        match self.data() {
            // SAFETY: as in buf(); &mut self makes this the only view.
            Some((p, n)) => unsafe { std::slice::from_raw_parts_mut(p, n) },
            None => &mut [],
        }
    }

    /// Complete the request: `Ok(())`, or the errno it fails with (ENOSPC,
    /// EOPNOTSUPP, ENODATA keep their meaning for the block layer; the
    /// others become EIO).  After the device was deleted this does nothing:
    /// libhybd failed the request already.
    pub fn complete(mut self, result: Result<(), Errno>) {
        self.finish(match result {
            Ok(()) => 0,
            Err(e) => -e.0.abs().max(1),
        }, false);
    }

    fn finish(&mut self, result: i32, first_drop: bool) {
        self.done = true;
        let live = self.shared.live.read().unwrap_or_else(|e| e.into_inner());
        if !*live {
            return;
        }
        if first_drop {
            eprintln!(
                "hybd: a request ({:?} of {} bytes at {}) was dropped without a completion: \
                 it fails with EIO (further drops are only counted)",
                self.op(),
                self.len(),
                self.offset()
            );
        }
        // SAFETY: the request is open and its device's libhybd side exists
        // while `live` is held true (Device frees it only under the write
        // lock); done is set, so this is the only completion.
        unsafe { sys::hybd_io_complete(self.io.as_ptr(), result) };
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if !self.done {
            let first = self.shared.dropped.fetch_add(1, Ordering::Relaxed) == 0;
            self.finish(-libc::EIO, first);
        }
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("op", &self.op())
            .field("offset", &self.offset())
            .field("len", &self.len())
            .field("queue", &self.queue())
            .field("tag", &self.tag())
            .finish()
    }
}
