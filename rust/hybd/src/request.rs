// SPDX-License-Identifier: MIT
//! One request handed to a handler, and its completion.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

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
/// libhybd's side of it still exists.  A request that touches libhybd's
/// memory (its buffer, its completion) first enters (`users` + 1, then
/// `live` read); the device, to free its side, clears `live` and waits
/// until no user is left.  Nothing ever waits for the device, so a thread
/// that holds one request's buffer while completing another cannot
/// deadlock against a delete.
pub(crate) struct Shared {
    live: AtomicBool,
    users: AtomicUsize,
    pub(crate) dropped: AtomicU64,
}

pub(crate) struct Entered<'a>(&'a Shared);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    pub(crate) fn new() -> Arc<Shared> {
        Arc::new(Shared {
            live: AtomicBool::new(true),
            users: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    /// Some while libhybd's side exists, and until the guard drops.
    pub(crate) fn enter(&self) -> Option<Entered<'_>> {
        // SeqCst on both sides: the device's store of live and its load of
        // users cannot both miss this thread's add and load (Dekker)
        self.users.fetch_add(1, Ordering::SeqCst);
        let e = Entered(self);
        self.live.load(Ordering::SeqCst).then_some(e)
    }

    /// From now on no request reaches libhybd's side of the device; wait
    /// for those that are in it.
    pub(crate) fn close(&self) {
        self.live.store(false, Ordering::SeqCst);
        while self.users.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

/// A request the device's handler received.  It must be completed exactly
/// once, with [`Request::complete`], which consumes it: the type system
/// rules out a second completion.  It may be completed in the handler or
/// later, from any thread or async task (it is `Send`).  One dropped
/// without a completion fails with EIO and is counted
/// ([`crate::Device::dropped_requests`]) and reported on stderr.  A
/// request that outlives its device's delete is harmless: its buffer is
/// then a private one, and its completion does nothing (libhybd failed
/// it already).
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
    op: Op,
    flags: IoFlags,
    offset: u64,
    len: usize,
    queue: usize,
    tag: usize,
    data: *mut u8,
}

// SAFETY: libhybd's hybd_io_complete() may be called from any thread
// (hybd.h); the request's fields were copied at creation, and its data
// buffer belongs to this request alone until it is completed, reached only
// through &self / &mut self while the device's side exists (Shared).
unsafe impl Send for Request {}

/// A request's data, readable: the request's buffer in the shared ring,
/// or, once its device was deleted, zeros of a private copy.
pub struct Buf<'a> {
    _in: Option<Entered<'a>>,
    data: Data<'a>,
}

/// Where a read's data goes: the request's buffer, or, once its device was
/// deleted, a private one that nothing reads.
pub struct BufMut<'a> {
    _in: Option<Entered<'a>>,
    data: DataMut<'a>,
}

enum Data<'a> {
    Ring(&'a [u8]),
    Gone(Vec<u8>),
}

enum DataMut<'a> {
    Ring(&'a mut [u8]),
    Gone(Vec<u8>),
}

impl std::ops::Deref for Buf<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.data {
            Data::Ring(s) => s,
            Data::Gone(v) => v,
        }
    }
}

impl std::ops::Deref for BufMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.data {
            DataMut::Ring(s) => s,
            DataMut::Gone(v) => v,
        }
    }
}

impl std::ops::DerefMut for BufMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.data {
            DataMut::Ring(s) => s,
            DataMut::Gone(v) => v,
        }
    }
}

impl Request {
    /// # Safety
    /// `io` is a request libhybd hands to a handler now, not yet
    /// completed, of the device that `shared` belongs to.
    pub(crate) unsafe fn new(io: *mut sys::hybd_io, shared: Arc<Shared>) -> Request {
        let io = NonNull::new(io).expect("libhybd passed a NULL request");
        let p = io.as_ptr();
        // SAFETY: the request is valid during the handler call (caller).
        let (op, flags, offset, len, queue, tag, data) = unsafe {
            (
                sys::hybd_io_op(p),
                sys::hybd_io_flags(p),
                sys::hybd_io_offset(p),
                sys::hybd_io_len(p) as usize,
                sys::hybd_io_queue(p) as usize,
                sys::hybd_io_tag(p) as usize,
                sys::hybd_io_buf(p) as *mut u8,
            )
        };
        let op = match op {
            sys::HYBD_OP_READ => Op::Read,
            sys::HYBD_OP_WRITE => Op::Write,
            sys::HYBD_OP_FLUSH => Op::Flush,
            sys::HYBD_OP_DISCARD => Op::Discard,
            sys::HYBD_OP_WRITE_ZEROES => Op::WriteZeroes,
            // libhybd fails unknown operations before any handler
            other => unreachable!("libhybd handed over operation {other}"),
        };
        Request {
            io,
            shared,
            done: false,
            op,
            flags: IoFlags(flags),
            offset,
            len,
            queue,
            tag,
            data,
        }
    }

    /// The operation.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The byte offset on the device.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The length in bytes (0 for a flush).  libhybd has checked that
    /// `offset..offset + len` lies on the device.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the request has no data (a flush).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its flags.
    pub fn flags(&self) -> IoFlags {
        self.flags
    }

    /// The hardware queue it came on, `0..nr_queues`.
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// Its tag, unique within its queue while it is open.
    pub fn tag(&self) -> usize {
        self.tag
    }

    /// A write's data (empty for operations without data).
    pub fn buf(&self) -> Buf<'_> {
        if self.data.is_null() {
            return Buf {
                _in: None,
                data: Data::Ring(&[]),
            };
        }
        match self.shared.enter() {
            // SAFETY: the request's own len bytes in the shared ring,
            // mapped while the device's side exists, which the guard
            // keeps; completion needs self by value, so no completion
            // ends it meanwhile.
            Some(e) => Buf {
                _in: Some(e),
                data: Data::Ring(unsafe { std::slice::from_raw_parts(self.data, self.len) }),
            },
            None => Buf {
                _in: None,
                data: Data::Gone(vec![0; self.len]),
            },
        }
    }

    /// Where a read's data goes (empty for operations without data).
    pub fn buf_mut(&mut self) -> BufMut<'_> {
        if self.data.is_null() {
            return BufMut {
                _in: None,
                data: DataMut::Ring(&mut []),
            };
        }
        match self.shared.enter() {
            // SAFETY: as in buf(); &mut self makes this the only view.
            Some(e) => BufMut {
                _in: Some(e),
                data: DataMut::Ring(unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }),
            },
            None => BufMut {
                _in: None,
                data: DataMut::Gone(vec![0; self.len]),
            },
        }
    }

    /// Complete the request: `Ok(())`, or the errno it fails with (ENOSPC,
    /// EOPNOTSUPP, ENODATA keep their meaning for the block layer; the
    /// others become EIO).  After the device was deleted this does nothing:
    /// libhybd failed the request already.
    pub fn complete(mut self, result: Result<(), Errno>) {
        let r = match result {
            Ok(()) => 0,
            Err(e) => -(e.0.unsigned_abs().clamp(1, 4095) as i32),
        };
        self.finish(r, false);
    }

    fn finish(&mut self, result: i32, first_drop: bool) {
        self.done = true;
        let Some(_in) = self.shared.enter() else {
            return;
        };
        if first_drop {
            crate::say(format_args!(
                "a request ({:?} of {} bytes at {}) was dropped without a completion: \
                 it fails with EIO (further drops are only counted)",
                self.op, self.len, self.offset
            ));
        }
        // SAFETY: the request is open and its device's libhybd side exists
        // while entered; done is set, so this is the only completion.
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn close_waits_for_those_inside_and_shuts_out_the_rest() {
        let s = Shared::new();
        let inside = s.enter().expect("live");
        let nested = s.enter().expect("entering twice never waits");
        let (s2, t0) = (s.clone(), std::time::Instant::now());
        let closer = std::thread::spawn(move || {
            s2.close();
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!closer.is_finished(), "close returned with a user inside");
        drop(nested);
        drop(inside);
        assert!(closer.join().unwrap() >= Duration::from_millis(50));
        assert!(s.enter().is_none(), "entered a closed device");
        assert_eq!(s.users.load(Ordering::SeqCst), 0);
    }
}
