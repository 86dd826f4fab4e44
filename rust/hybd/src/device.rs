// SPDX-License-Identifier: MIT
//! The device: its parameters, its handler, its life.

use std::ffi::CStr;
use std::os::fd::AsRawFd;
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hybd_sys as sys;

use crate::error::{check, Error, Result};
use crate::queue::{self, Queue};
use crate::request::{Request, Shared};
use crate::Errno;

/// The operations a device offers, as its [`Handler`] says
/// ([`Handler::ops`]).  [`Ops::FLUSH`] also gives the device a volatile
/// write cache with FUA (unless [`Builder::write_cache`] turns it off).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ops(u32);

impl Ops {
    /// Reads (every device has them).
    pub const READ: Ops = Ops(1 << 0);
    /// Writes: the device is writable.
    pub const WRITE: Ops = Ops(1 << 1);
    /// Flushes, and a volatile write cache.
    pub const FLUSH: Ops = Ops(1 << 2);
    /// Discards.
    pub const DISCARD: Ops = Ops(1 << 3);
    /// Write-zeroes.
    pub const WRITE_ZEROES: Ops = Ops(1 << 4);
    /// Resizes asked from outside ([`Handler::resize`] answers them).
    pub const RESIZE: Ops = Ops(1 << 5);

    /// Whether every operation of `other` is in `self`.
    pub const fn contains(self, other: Ops) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Ops {
    type Output = Ops;
    fn bitor(self, rhs: Ops) -> Ops {
        Ops(self.0 | rhs.0)
    }
}

/// What a driver does with each request, and its optional hooks.
///
/// Handlers run in the queues' worker threads (or their pools:
/// [`Builder::queue_threads`]), several at once on different queues, hence
/// `Send + Sync`.  Each gets the [`Request`] by value and completes it,
/// there or later from anywhere.  A handler that panics fails its request
/// with EIO; the worker goes on.
pub trait Handler: Send + Sync + 'static {
    /// The operations the device offers; each needs its method.
    /// Default: reads and writes.
    fn ops(&self) -> Ops {
        Ops::READ | Ops::WRITE
    }

    /// Read `req.len()` bytes at `req.offset()` into `req.buf_mut()`.
    fn read(&self, req: Request);

    /// Write `req.buf()` at `req.offset()`; with `req.flags().fua()`, it is
    /// durable when completed.  Without [`Ops::FLUSH`], every completed
    /// write must be durable.
    fn write(&self, req: Request) {
        req.complete(Err(Errno::EOPNOTSUPP));
    }

    /// Make every completed write durable.
    fn flush(&self, req: Request) {
        req.complete(Err(Errno::EOPNOTSUPP));
    }

    /// The range's data may go.
    fn discard(&self, req: Request) {
        req.complete(Err(Errno::EOPNOTSUPP));
    }

    /// The range reads as zeros afterwards.
    fn write_zeroes(&self, req: Request) {
        req.complete(Err(Errno::EOPNOTSUPP));
    }

    /// In each queue's worker before it serves: set up per-queue backends,
    /// watch their fds ([`Queue::watch_fd`]).  An error fails
    /// [`Device::start`].
    fn queue_init(&self, _queue: &Queue) -> std::result::Result<(), Errno> {
        Ok(())
    }

    /// In the worker when it stops (only after a successful queue_init).
    fn queue_exit(&self, _queue: &Queue) {}

    /// In the worker when it has handed out every visible request and is
    /// about to wait: submit what the handlers prepared, in one batch.
    fn queue_idle(&self, _queue: &Queue) {}

    /// May the device become `size` bytes?  Only with [`Ops::RESIZE`]; see
    /// `resize` in `hybd.h` for when the storage must be ready.
    fn resize(&self, _size: u64) -> std::result::Result<(), Errno> {
        Err(Errno::EOPNOTSUPP)
    }

    /// The device is now `new_size` bytes, no longer `old_size`.
    fn resized(&self, _old_size: u64, _new_size: u64) {}

    /// [`Builder::run`] only: the device exists (its id is known) and
    /// serves nothing yet: attach a fast path, seed its maps.
    fn prepare(&self, _dev: &DeviceRef) -> std::result::Result<(), Errno> {
        Ok(())
    }

    /// [`Builder::run`] only: `/dev/hybdN` exists.
    fn ready(&self, _dev: &DeviceRef) {}
}

/// A handler shared with the rest of the driver: the device holds one
/// `Arc`, the driver keeps another (to read its state, or to serve two
/// devices from one), and every call goes to the same `H`.
impl<H: Handler + ?Sized> Handler for Arc<H> {
    fn ops(&self) -> Ops {
        (**self).ops()
    }
    fn read(&self, req: Request) {
        (**self).read(req)
    }
    fn write(&self, req: Request) {
        (**self).write(req)
    }
    fn flush(&self, req: Request) {
        (**self).flush(req)
    }
    fn discard(&self, req: Request) {
        (**self).discard(req)
    }
    fn write_zeroes(&self, req: Request) {
        (**self).write_zeroes(req)
    }
    fn queue_init(&self, queue: &Queue) -> std::result::Result<(), Errno> {
        (**self).queue_init(queue)
    }
    fn queue_exit(&self, queue: &Queue) {
        (**self).queue_exit(queue)
    }
    fn queue_idle(&self, queue: &Queue) {
        (**self).queue_idle(queue)
    }
    fn resize(&self, size: u64) -> std::result::Result<(), Errno> {
        (**self).resize(size)
    }
    fn resized(&self, old_size: u64, new_size: u64) {
        (**self).resized(old_size, new_size)
    }
    fn prepare(&self, dev: &DeviceRef) -> std::result::Result<(), Errno> {
        (**self).prepare(dev)
    }
    fn ready(&self, dev: &DeviceRef) {
        (**self).ready(dev)
    }
}

struct Inner<H> {
    handler: H,
    shared: Arc<Shared>,
}

/// A device's parameters: start from [`Builder::new`], which takes
/// libhybd's defaults (`hybd_config_init()`).  The kernel checks every
/// value; a refusal names the parameter ([`Error::message`]).
#[derive(Clone)]
pub struct Builder {
    cfg: sys::hybd_config,
}

impl Builder {
    /// A device of `size` bytes with libhybd's defaults: 4 KiB blocks, a
    /// queue per CPU (at most 8), depth 64, 128 KiB requests, a 30 s I/O
    /// timeout, a write cache if the handler flushes.
    pub fn new(size: u64) -> Builder {
        let mut cfg = sys::hybd_config::default();
        // SAFETY: cfg is a valid hybd_config to fill.
        unsafe { sys::hybd_config_init(&mut cfg) };
        cfg.size = size;
        Builder { cfg }
    }

    fn flag(mut self, bit: u32, on: bool) -> Builder {
        if on {
            self.cfg.flags |= bit;
        } else {
            self.cfg.flags &= !bit;
        }
        self
    }

    fn lib_flag(mut self, bit: u32, on: bool) -> Builder {
        if on {
            self.cfg.lib_flags |= bit;
        } else {
            self.cfg.lib_flags &= !bit;
        }
        self
    }

    /// The logical block size, 512 to 4096 bytes.
    pub fn logical_block_size(mut self, bytes: u32) -> Builder {
        self.cfg.logical_block_size = bytes;
        self
    }

    /// The physical block size (0: the logical one).
    pub fn physical_block_size(mut self, bytes: u32) -> Builder {
        self.cfg.physical_block_size = bytes;
        self
    }

    /// The largest request, in bytes (larger ones are split).
    pub fn max_io_bytes(mut self, bytes: u32) -> Builder {
        self.cfg.max_io_bytes = bytes;
        self
    }

    /// Hardware queues, each with its worker thread.
    pub fn queues(mut self, n: u32) -> Builder {
        self.cfg.nr_queues = n;
        self
    }

    /// Requests in flight per queue.
    pub fn depth(mut self, n: u32) -> Builder {
        self.cfg.queue_depth = n;
        self
    }

    /// Handler threads per queue (a pool; 0 or 1: the worker itself), for
    /// handlers that block.
    pub fn queue_threads(mut self, n: u32) -> Builder {
        self.cfg.queue_threads = n;
        self
    }

    /// Seconds a request may take before it fails with EIO (0: none).
    pub fn io_timeout(mut self, secs: u32) -> Builder {
        self.cfg.io_timeout = secs;
        self
    }

    /// Recovery: when this server dies, hold the device's I/O this many
    /// seconds for a new server ([`Builder::take_over`]); 0 fails it at
    /// once.
    pub fn recovery_timeout(mut self, secs: u32) -> Builder {
        self.cfg.recovery_timeout = secs;
        self
    }

    /// The wanted N of `/dev/hybdN` (default: any).
    pub fn id(mut self, id: u32) -> Builder {
        self.cfg.dev_id = id as i32;
        self
    }

    /// Take over existing device `id` instead of adding one: one waiting
    /// for a new server after a crash, or a live one, whose server is
    /// asked to hand over first.  The device keeps its own parameters.
    pub fn take_over(self, id: u32) -> Builder {
        self.id(id).lib_flag(sys::HYBD_CFG_ATTACH, true)
    }

    /// A volatile write cache (flush, FUA) when the handler flushes
    /// (default on); off: every write is durable when completed.
    pub fn write_cache(self, on: bool) -> Builder {
        self.flag(sys::HYBD_DEV_F_WRITE_CACHE, on)
    }

    /// A device an unprivileged user may create and own (the
    /// administrator opens `/dev/hybd-control` to them; limits apply).
    pub fn unprivileged(self, on: bool) -> Builder {
        self.flag(sys::HYBD_DEV_F_UNPRIVILEGED, on)
    }

    /// Busy-poll this long for more requests before sleeping (at most
    /// 1 ms; 0: never).
    pub fn poll_ns(mut self, ns: u32) -> Builder {
        self.cfg.poll_ns = ns;
        self
    }

    /// The largest discard, and its granularity (0: defaults).
    pub fn discard_limits(mut self, max_bytes: u32, granularity: u32) -> Builder {
        self.cfg.max_discard_bytes = max_bytes;
        self.cfg.discard_granularity = granularity;
        self
    }

    /// The largest write-zeroes (0: the default).
    pub fn max_write_zeroes_bytes(mut self, bytes: u32) -> Builder {
        self.cfg.max_write_zeroes_bytes = bytes;
        self
    }

    /// Do not pin the workers to CPUs.
    pub fn no_affinity(self, on: bool) -> Builder {
        self.lib_flag(sys::HYBD_CFG_NO_AFFINITY, on)
    }

    /// Pools run where the worker alone would, not on one CPU.
    pub fn pool_spread(self, on: bool) -> Builder {
        self.lib_flag(sys::HYBD_CFG_POOL_SPREAD, on)
    }

    /// The raw configuration, for a field this crate has no setter for.
    pub fn config_mut(&mut self) -> &mut sys::hybd_config {
        &mut self.cfg
    }

    /// Add the device (or take it over) and map its rings; no block device
    /// exists until [`Device::start`].
    pub fn create<H: Handler>(self, handler: H) -> Result<Device<H>> {
        let ops = handler.ops();
        let inner = Arc::new(Inner {
            handler,
            shared: Shared::new(),
        });
        let drv = driver::<H>(ops);
        let mut dev = std::ptr::null_mut();
        // SAFETY: cfg and drv are valid and sized as passed; priv points to
        // the Inner that the Device keeps alive until libhybd's side is
        // freed (no callback runs after hybd_dev_delete()).
        check(unsafe {
            sys::hybd_dev_create_sized(
                &self.cfg,
                std::mem::size_of::<sys::hybd_config>(),
                &drv,
                std::mem::size_of::<sys::hybd_driver>(),
                Arc::as_ptr(&inner) as *mut c_void,
                &mut dev,
            )
        })?;
        Ok(Device {
            r: DeviceRef { dev },
            inner: Some(inner),
            started: AtomicBool::new(false),
            life: Mutex::new(()),
        })
    }

    /// Create, prepare ([`Handler::prepare`]), start, announce
    /// ([`Handler::ready`]) and serve the device until it is deleted from
    /// outside (`hybdctl del`) or the process gets SIGINT or SIGTERM; then
    /// delete it, gracefully.  Blocks SIGINT and SIGTERM in the calling
    /// thread (restored on return): call it before starting other threads,
    /// or block them there too.
    pub fn run<H: Handler>(self, handler: H) -> Result<()> {
        crate::run::run(self, handler)
    }
}

/// The C driver whose handlers call H's.  Only the operations in `ops`
/// get a handler: libhybd offers what has one.
fn driver<H: Handler>(ops: Ops) -> sys::hybd_driver {
    sys::hybd_driver {
        read: Some(t_read::<H>),
        write: ops.contains(Ops::WRITE).then_some(t_write::<H> as _),
        flush: ops.contains(Ops::FLUSH).then_some(t_flush::<H> as _),
        discard: ops.contains(Ops::DISCARD).then_some(t_discard::<H> as _),
        write_zeroes: ops
            .contains(Ops::WRITE_ZEROES)
            .then_some(t_write_zeroes::<H> as _),
        queue_init: Some(t_queue_init::<H>),
        queue_exit: Some(t_queue_exit::<H>),
        queue_idle: Some(t_queue_idle::<H>),
        ready: None,
        prepare: None,
        resize: ops.contains(Ops::RESIZE).then_some(t_resize::<H> as _),
        resized: Some(t_resized::<H>),
    }
}

/// # Safety
/// `p` is the priv given to hybd_dev_create_sized(): a live Inner<H>.
unsafe fn inner<'a, H: Handler>(p: *mut c_void) -> &'a Inner<H> {
    // SAFETY: the caller's contract.
    unsafe { &*(p as *const Inner<H>) }
}

fn guarded(what: &str, f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        crate::say(format_args!(
            "the {what} handler panicked; its request fails with EIO"
        ));
    }
}

/// A handler's errno as libhybd takes it: negative, never 0.
fn neg(e: Errno) -> c_int {
    -(e.0.unsigned_abs().clamp(1, 4095) as c_int)
}

/// Hand `io` to `call` as a Request; the completion is the Request's, so
/// libhybd is told the handler kept it.
///
/// # Safety
/// io is a request libhybd hands to a handler of a device of Inner<H>.
unsafe fn dispatch<H: Handler>(io: *mut sys::hybd_io, what: &str, call: fn(&H, Request)) -> c_int {
    // SAFETY: io is valid (caller), its priv is the device's Inner<H>.
    let inner = unsafe { inner::<H>(sys::hybd_io_priv(io)) };
    // SAFETY: io is open and of this device.
    let req = unsafe { Request::new(io, inner.shared.clone()) };
    guarded(what, || call(&inner.handler, req));
    sys::HYBD_IO_ASYNC as c_int
}

unsafe extern "C" fn t_read<H: Handler>(
    io: *mut sys::hybd_io,
    _: *mut c_void,
    _: u64,
    _: u32,
) -> c_int {
    // SAFETY: libhybd calls this with an open request of our device.
    unsafe { dispatch::<H>(io, "read", |h, r| h.read(r)) }
}

unsafe extern "C" fn t_write<H: Handler>(
    io: *mut sys::hybd_io,
    _: *const c_void,
    _: u64,
    _: u32,
) -> c_int {
    // SAFETY: as t_read.
    unsafe { dispatch::<H>(io, "write", |h, r| h.write(r)) }
}

unsafe extern "C" fn t_flush<H: Handler>(io: *mut sys::hybd_io) -> c_int {
    // SAFETY: as t_read.
    unsafe { dispatch::<H>(io, "flush", |h, r| h.flush(r)) }
}

unsafe extern "C" fn t_discard<H: Handler>(io: *mut sys::hybd_io, _: u64, _: u32) -> c_int {
    // SAFETY: as t_read.
    unsafe { dispatch::<H>(io, "discard", |h, r| h.discard(r)) }
}

unsafe extern "C" fn t_write_zeroes<H: Handler>(io: *mut sys::hybd_io, _: u64, _: u32) -> c_int {
    // SAFETY: as t_read.
    unsafe { dispatch::<H>(io, "write_zeroes", |h, r| h.write_zeroes(r)) }
}

/// # Safety
/// q is a queue of a device of Inner<H>, in its worker.
unsafe fn queue_inner<'a, H: Handler>(q: *mut sys::hybd_queue) -> &'a Inner<H> {
    // SAFETY: the queue's device's priv is its Inner<H> (caller).
    unsafe { inner::<H>(sys::hybd_dev_priv(sys::hybd_queue_dev(q))) }
}

unsafe extern "C" fn t_queue_init<H: Handler>(q: *mut sys::hybd_queue) -> c_int {
    // SAFETY: libhybd calls this in q's worker before serving it.
    unsafe { queue::state_init(q) };
    let inner = unsafe { queue_inner::<H>(q) };
    let queue = unsafe { Queue::from_raw(q) };
    let r = catch_unwind(AssertUnwindSafe(|| inner.handler.queue_init(&queue)));
    let ret = match r {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => neg(e),
        Err(_) => {
            crate::say(format_args!(
                "queue_init panicked (queue {})",
                queue.index()
            ));
            -libc::EIO
        }
    };
    // queue_exit is not called for it: no callback can come any more
    // SAFETY: in the worker, after its last hook.
    unsafe { queue::state_free(q) };
    ret
}

unsafe extern "C" fn t_queue_exit<H: Handler>(q: *mut sys::hybd_queue) {
    // SAFETY: in q's worker as it stops, after a successful queue_init.
    let inner = unsafe { queue_inner::<H>(q) };
    let queue = unsafe { Queue::from_raw(q) };
    guarded("queue_exit", || inner.handler.queue_exit(&queue));
    // SAFETY: the last hook of this queue has run.
    unsafe { queue::state_free(q) };
}

unsafe extern "C" fn t_queue_idle<H: Handler>(q: *mut sys::hybd_queue) {
    // SAFETY: in q's worker, between queue_init and queue_exit.
    let inner = unsafe { queue_inner::<H>(q) };
    let queue = unsafe { Queue::from_raw(q) };
    guarded("queue_idle", || inner.handler.queue_idle(&queue));
}

unsafe extern "C" fn t_resize<H: Handler>(dev: *mut sys::hybd_dev, size: u64) -> c_int {
    // SAFETY: libhybd calls this for our live device.
    let inner = unsafe { inner::<H>(sys::hybd_dev_priv(dev)) };
    match catch_unwind(AssertUnwindSafe(|| inner.handler.resize(size))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => neg(e),
        Err(_) => -libc::EIO,
    }
}

unsafe extern "C" fn t_resized<H: Handler>(dev: *mut sys::hybd_dev, old: u64, new: u64) {
    // SAFETY: as t_resize.
    let inner = unsafe { inner::<H>(sys::hybd_dev_priv(dev)) };
    guarded("resized", || inner.handler.resized(old, new));
}

/// What can be asked of a device, owned ([`Device`] derefs to it) or lent
/// to a hook ([`Handler::prepare`], [`Handler::ready`]).
pub struct DeviceRef {
    pub(crate) dev: *mut sys::hybd_dev,
}

// SAFETY: libhybd's hybd_dev_* calls that DeviceRef offers may be made
// from any thread (hybd.h); it holds no thread-bound state.
unsafe impl Send for DeviceRef {}
// SAFETY: as Send; the calls it offers take no &mut of the device.
unsafe impl Sync for DeviceRef {}

impl DeviceRef {
    /// N of `/dev/hybdN`.
    pub fn id(&self) -> u32 {
        // SAFETY: dev is valid while self is.
        unsafe { sys::hybd_dev_id(self.dev) as u32 }
    }

    /// `/dev/hybdN`.
    pub fn path(&self) -> String {
        // SAFETY: a NUL-terminated string valid as long as dev.
        unsafe { CStr::from_ptr(sys::hybd_dev_path(self.dev)) }
            .to_string_lossy()
            .into_owned()
    }

    /// The size in bytes now.
    pub fn size(&self) -> u64 {
        // SAFETY: dev is valid.
        unsafe { sys::hybd_dev_size(self.dev) }
    }

    /// The configuration as the kernel made it (every default resolved).
    pub fn config(&self) -> sys::hybd_config {
        // SAFETY: a valid pointer as long as dev; copied.
        unsafe { *sys::hybd_dev_config(self.dev) }
    }

    /// The number of hardware queues.
    pub fn nr_queues(&self) -> usize {
        // SAFETY: dev is valid.
        unsafe { sys::hybd_dev_nr_queues(self.dev) as usize }
    }

    /// Register an open file or block device as a backing target a fast
    /// path may remap to (`writable`: remapped writes too).  Returns its
    /// index and size in bytes.  The kernel keeps its own reference.
    pub fn add_backing(&self, file: &impl AsRawFd, writable: bool) -> Result<(u32, u64)> {
        let mut size = 0u64;
        let flags = if writable {
            sys::HYBD_BACKING_F_WRITE
        } else {
            0
        };
        // SAFETY: dev is valid; the fd is borrowed for the call.
        let idx = check(unsafe {
            sys::hybd_dev_add_backing(self.dev, file.as_raw_fd(), flags, &mut size)
        })?;
        Ok((idx as u32, size))
    }

    /// Drop backing target `index`.
    pub fn del_backing(&self, index: u32) -> Result<()> {
        // SAFETY: dev is valid.
        check(unsafe { sys::hybd_dev_del_backing(self.dev, index) }).map(drop)
    }

    /// Wait until every remap a fast path made before the call completed.
    pub fn remap_barrier(&self) -> Result<()> {
        // SAFETY: dev is valid.
        check(unsafe { sys::hybd_dev_remap_barrier(self.dev) }).map(drop)
    }

    /// Resize the live device (not from a handler: a shrink waits for the
    /// requests in flight).  The resized hook runs before this returns.
    pub fn resize(&self, size: u64) -> Result<()> {
        // SAFETY: dev is valid.
        check(unsafe { sys::hybd_dev_resize(self.dev, size) }).map(drop)
    }

    /// Whether a new server took the device over.
    pub fn handed_over(&self) -> bool {
        // SAFETY: dev is valid.
        unsafe { sys::hybd_dev_handed_over(self.dev) != 0 }
    }

    /// The CPUs that submit to queue `index`.
    pub fn queue_cpus(&self, index: usize) -> Result<Vec<u32>> {
        let mut cpus = vec![0u32; 1024];
        // SAFETY: dev is valid; cpus has the room passed.
        let n = check(unsafe {
            sys::hybd_queue_cpus(self.dev, index as u32, cpus.as_mut_ptr(), cpus.len() as u32)
        })? as usize;
        cpus.truncate(n.min(cpus.len()));
        Ok(cpus)
    }
}

/// A device served by this process.  Dropping it deletes it, gracefully
/// while its workers serve ([`Device::delete`]).
pub struct Device<H: Handler> {
    r: DeviceRef,
    inner: Option<Arc<Inner<H>>>,
    started: AtomicBool,
    /// start and stop, one at a time (libhybd's are not safe to race)
    life: Mutex<()>,
}

impl<H: Handler> std::ops::Deref for Device<H> {
    type Target = DeviceRef;
    fn deref(&self) -> &DeviceRef {
        &self.r
    }
}

impl<H: Handler> Device<H> {
    /// The handler.
    pub fn handler(&self) -> &H {
        &self.inner.as_ref().expect("a live device").handler
    }

    /// Start the workers, then `/dev/hybdN` (once).
    pub fn start(&self) -> Result<()> {
        let _life = self.life.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: dev is valid; start and stop do not race (life).
        check(unsafe { sys::hybd_dev_start(self.r.dev) })?;
        self.started.store(true, Ordering::Release);
        Ok(())
    }

    /// Stop and join the workers; requests wait until the delete.
    pub fn stop(&self) -> Result<()> {
        let _life = self.life.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: dev is valid; start and stop do not race (life).
        check(unsafe { sys::hybd_dev_stop(self.r.dev) }).map(drop)
    }

    /// Whether the workers serve the device (they stop when it is
    /// deleted, stopped, handed over, or on an error).
    pub fn serving(&self) -> bool {
        // SAFETY: dev is valid.
        unsafe { sys::hybd_dev_serving(self.r.dev) != 0 }
    }

    /// Wait until every worker exited: the device was deleted from
    /// outside, stopped, or handed over (Ok), or a worker failed.
    pub fn wait(&self) -> Result<()> {
        // SAFETY: dev is valid; hybd_dev_wait() may run in any thread.
        check(unsafe { sys::hybd_dev_wait(self.r.dev) }).map(drop)
    }

    /// How many requests handlers dropped without completing them (each
    /// failed with EIO).
    pub fn dropped_requests(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.shared.dropped.load(Ordering::Relaxed))
    }

    /// Delete the device.  While the workers serve, the kernel first
    /// drains it through them (dirty data reaches the handlers); requests
    /// still held afterwards are failed, and completing them does nothing.
    /// A device handed over to a new server is let go of, not deleted.
    pub fn delete(mut self) -> Result<()> {
        self.delete_inner()
    }

    fn delete_inner(&mut self) -> Result<()> {
        let Some(inner) = self.inner.take() else {
            return Ok(());
        };
        let started = self.started.load(Ordering::Acquire);
        // SAFETY (both calls): dev is valid until hybd_dev_delete().
        if started && self.serving() && !self.r.handed_over() {
            // graceful: the kernel drains through the workers, and the
            // handlers' completions must reach libhybd meanwhile.  The
            // workers serve, so the id is still this device's.
            let ret = unsafe { sys::hybd_ctl_del(self.r.id()) };
            if ret < 0 && ret != -libc::ENODEV && ret != -libc::ENOENT {
                self.inner = Some(inner);
                return Err(Error::from_lib(ret));
            }
        }
        if started {
            // the workers end: the device is gone, they were stopped, or
            // they hand over once the requests their handlers hold are
            // completed (which still reach libhybd here)
            unsafe { sys::hybd_dev_wait(self.r.dev) };
        }
        // from here no request touches libhybd's side of the device
        inner.shared.close();
        let dev = std::mem::replace(&mut self.r.dev, std::ptr::null_mut());
        // SAFETY: no worker runs, no completion can come (closed); dev is
        // freed in every case and not used again.
        let ret = unsafe { sys::hybd_dev_delete(dev) };
        drop(inner);
        check(ret).map(drop)
    }
}

impl<H: Handler> Drop for Device<H> {
    fn drop(&mut self) {
        if self.r.dev.is_null() {
            return;
        }
        let path = self.r.path();
        if let Err(e) = self.delete_inner() {
            crate::say(format_args!("deleting {path} failed: {e}"));
            // not deleted: the workers may still call the handler, which
            // must stay (a leak, not a use after free)
            if let Some(inner) = self.inner.take() {
                std::mem::forget(inner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    struct Sized64(AtomicU64);

    impl Handler for Sized64 {
        fn ops(&self) -> Ops {
            Ops::READ | Ops::RESIZE
        }
        fn read(&self, req: Request) {
            req.complete(Ok(()));
        }
        fn resize(&self, size: u64) -> std::result::Result<(), Errno> {
            self.0.store(size, Ordering::SeqCst);
            Ok(())
        }
    }

    fn as_handler<H: Handler>(h: H) -> H {
        h
    }

    #[test]
    fn an_arc_of_a_handler_is_that_handler() {
        let mine = Arc::new(Sized64(AtomicU64::new(0)));
        let given = as_handler(mine.clone());
        assert_eq!(given.ops(), Ops::READ | Ops::RESIZE);
        given.resize(1 << 30).unwrap();
        assert_eq!(mine.0.load(Ordering::SeqCst), 1 << 30);
        let shared: Arc<dyn Handler> = mine.clone();
        let given = as_handler(shared);
        given.resize(4096).unwrap();
        assert_eq!(mine.0.load(Ordering::SeqCst), 4096);
        assert_eq!(given.ops(), Ops::READ | Ops::RESIZE);
    }
}
