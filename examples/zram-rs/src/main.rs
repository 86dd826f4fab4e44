// SPDX-License-Identifier: MIT
//! zram-rs: a compressed RAM block device written with the `hybd` crate,
//! with the kernel's zram as its peer.  Blocks are compressed (lz4, or
//! zstd with `--algo zstd`) in this process's memory; same-filled blocks take none; `--mem-limit` bounds
//! what the compressed data may take (writes beyond fail with ENOSPC);
//! discard frees.  With `--fastpath zram.bpf.o`, reads of blocks that hold
//! zeros (never written, discarded, or written with zeros) complete in the
//! kernel.  The contents live in this process: when it ends, they are
//! gone, also in recovery mode (a new server finds an empty disk).
//!
//! Usage: zram-rs --size SIZE [--algo lz4|zstd] [--mem-limit SIZE] [--queues N] [--depth N]
//!        [--threads N] [--fastpath zram.bpf.o] [--stats FILE]
//!        [--recovery-timeout SECS] [--take-over ID --discard-contents]
//!        [--id N]

mod store;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hybd::{Builder, DeviceRef, Errno, FastPath, Handler, MappedWords, Ops, Request};
use store::{Algo, Store, ZeroBits, BLOCK};

struct Args {
    size: u64,
    algo: Algo,
    mem_limit: u64,
    queues: u32,
    depth: u32,
    threads: u32,
    fastpath: Option<PathBuf>,
    stats: Option<PathBuf>,
    recovery_timeout: u32,
    take_over: Option<u32>,
    discard_contents: bool,
    id: Option<u32>,
}

fn usage(msg: &str) -> ! {
    eprintln!("zram-rs: {msg}");
    eprintln!(
        "usage: zram-rs --size SIZE [--algo lz4|zstd] [--mem-limit SIZE] [--queues N]\n\
         \x20              [--depth N] [--threads N] [--fastpath zram.bpf.o] [--stats FILE]\n\
         \x20              [--recovery-timeout SECS]\n\
         \x20              [--take-over ID --discard-contents] [--id N]"
    );
    std::process::exit(2);
}

/// "64M", "1G", "4096": binary suffixes K, M, G, T.
fn parse_size(s: &str) -> Option<u64> {
    let (num, shift) = match s.as_bytes().last()?.to_ascii_uppercase() {
        b'K' => (&s[..s.len() - 1], 10),
        b'M' => (&s[..s.len() - 1], 20),
        b'G' => (&s[..s.len() - 1], 30),
        b'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

fn parse_args() -> Args {
    let mut a = Args {
        size: 0,
        algo: Algo::Lz4,
        mem_limit: 0,
        queues: 0,
        depth: 0,
        threads: 0,
        fastpath: None,
        stats: None,
        recovery_timeout: 0,
        take_over: None,
        discard_contents: false,
        id: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(opt) = it.next() {
        if opt == "--discard-contents" {
            a.discard_contents = true;
            continue;
        }
        let val = it
            .next()
            .unwrap_or_else(|| usage(&format!("{opt} needs a value")));
        let num = |v: &str| {
            v.parse::<u32>()
                .unwrap_or_else(|_| usage(&format!("{opt} {v}: not a number")))
        };
        let size =
            |v: &str| parse_size(v).unwrap_or_else(|| usage(&format!("{opt} {v}: not a size")));
        match opt.as_str() {
            "--size" => a.size = size(&val),
            "--algo" => {
                a.algo = Algo::parse(&val)
                    .unwrap_or_else(|| usage(&format!("--algo {val}: lz4 or zstd")))
            }
            "--mem-limit" => a.mem_limit = size(&val),
            "--queues" => a.queues = num(&val),
            "--depth" => a.depth = num(&val),
            "--threads" => a.threads = num(&val),
            "--fastpath" => a.fastpath = Some(val.into()),
            "--stats" => a.stats = Some(val.into()),
            "--recovery-timeout" => a.recovery_timeout = num(&val),
            "--take-over" => a.take_over = Some(num(&val)),
            "--id" => a.id = Some(num(&val)),
            _ => usage(&format!("unknown option {opt}")),
        }
    }
    if a.take_over.is_none() && (a.size == 0 || a.size % BLOCK as u64 != 0) {
        usage("--size: a multiple of 4 KiB is needed");
    }
    a
}

/// The fast path's bitmap, mapped: the store keeps it exact.
struct Bits(MappedWords);

impl ZeroBits for Bits {
    fn set(&self, blk: u64, zero: bool) {
        self.0.words().set(blk, zero)
    }
}

/// The driver; `run()` holds one `Arc` of it, `main()` another, to stop
/// the stats thread once the device is gone.
struct Zram {
    store: Arc<Store>,
    fastpath: Option<PathBuf>,
    attached: Mutex<Option<FastPath>>,
    full_said: AtomicBool,
    stats: Option<PathBuf>,
    stop: Arc<AtomicBool>,
    stats_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Zram {
    fn blocks(req: &Request) -> (u64, usize) {
        (req.offset() / BLOCK as u64, req.len() / BLOCK)
    }
}

impl Handler for Zram {
    fn ops(&self) -> Ops {
        Ops::READ | Ops::WRITE | Ops::DISCARD | Ops::WRITE_ZEROES
    }

    fn read(&self, mut req: Request) {
        let (first, n) = Self::blocks(&req);
        for (i, chunk) in req.buf_mut().chunks_exact_mut(BLOCK).take(n).enumerate() {
            self.store.read(first + i as u64, chunk);
        }
        req.complete(Ok(()));
    }

    fn write(&self, req: Request) {
        let (first, _) = Self::blocks(&req);
        let stored = {
            let data = req.buf();
            data.chunks_exact(BLOCK)
                .enumerate()
                .all(|(i, chunk)| self.store.write(first + i as u64, chunk).is_ok())
        };
        if !stored {
            if !self.full_said.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "zram-rs: the memory limit ({} bytes of compressed data) is reached: \
                     writes that need more fail with ENOSPC (discard frees)",
                    self.store.stats().mem_limit
                );
            }
            return req.complete(Err(Errno::ENOSPC));
        }
        req.complete(Ok(()));
    }

    fn discard(&self, req: Request) {
        let (first, n) = Self::blocks(&req);
        for b in first..first + n as u64 {
            self.store.discard(b);
        }
        req.complete(Ok(()));
    }

    fn write_zeroes(&self, req: Request) {
        // zeros take no memory either way: a hole
        self.discard(req);
    }

    fn prepare(&self, dev: &DeviceRef) -> Result<(), Errno> {
        // started here, where run() has SIGINT and SIGTERM blocked: the
        // thread inherits the mask, so the signals reach run()
        if let Some(path) = self.stats.clone() {
            let (store, stop) = (self.store.clone(), self.stop.clone());
            *self.stats_thread.lock().unwrap() = Some(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    write_stats(&store, &path);
                    std::thread::sleep(Duration::from_millis(500));
                }
                write_stats(&store, &path);
            }));
        }
        let Some(path) = &self.fastpath else {
            return Ok(());
        };
        let fp = FastPath::attach(dev.id(), path, false).map_err(|e| {
            eprintln!("zram-rs: attaching {}: {e}", path.display());
            e.errno
        })?;
        let words = fp
            .map("zram_zeros")
            .and_then(|m| m.mmap_words())
            .map_err(|e| {
                eprintln!("zram-rs: {}: its map zram_zeros: {e}", path.display());
                e.errno
            })?;
        // every block is empty: reads as zeros, before the first request
        for w in words.words() {
            w.store(!0, Ordering::Release);
        }
        self.store.set_zero_bits(Box::new(Bits(words)));
        *self.attached.lock().unwrap() = Some(fp);
        Ok(())
    }

    fn ready(&self, dev: &DeviceRef) {
        println!("ready {}", dev.path());
    }
}

fn write_stats(store: &Store, path: &PathBuf) {
    let s = store.stats();
    let ratio = if s.compr_data_size == 0 {
        0.0
    } else {
        s.orig_data_size as f64 / s.compr_data_size as f64
    };
    let json = format!(
        "{{\"comp_algorithm\": \"{}\", \"orig_data_size\": {}, \"compr_data_size\": {}, \"mem_used\": {}, \"mem_limit\": {}, \
         \"same_pages\": {}, \"huge_pages\": {}, \"limit_refusals\": {}, \"ratio\": {:.3}}}\n",
        store.algo().name(),
        s.orig_data_size,
        s.compr_data_size,
        s.mem_used,
        s.mem_limit,
        s.same_pages,
        s.huge_pages,
        s.limit_refusals,
        ratio
    );
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, json)
        .and_then(|()| std::fs::rename(&tmp, path))
        .is_err()
    {
        eprintln!("zram-rs: cannot write {}", path.display());
    }
}

/// Swap on this device must not wait for itself: its memory stays in RAM
/// and its threads allocate as I/O flushers (hybd::keep_off_swap()).
/// Without the privileges for that, say that it must not carry swap.
fn keep_off_swap() {
    if let Err(e) = hybd::keep_off_swap() {
        eprintln!("zram-rs: {e}: do not use this device as swap (it could wait for itself)");
    }
}

fn main() {
    let a = parse_args();
    keep_off_swap();
    let mut b = Builder::new(a.size)
        .logical_block_size(BLOCK as u32)
        .write_cache(false)
        .recovery_timeout(a.recovery_timeout);
    if let Some(id) = a.take_over {
        if !a.discard_contents {
            eprintln!(
                "zram-rs: taking over /dev/hybd{id} starts it empty: its contents lived in the old \
                 server's memory, and a live device's would be lost.  Pass --discard-contents to \
                 do it anyway"
            );
            std::process::exit(1);
        }
        b = b.take_over(id);
    }
    if let Some(id) = a.id {
        b = b.id(id);
    }
    if a.queues != 0 {
        b = b.queues(a.queues);
    }
    if a.depth != 0 {
        b = b.depth(a.depth);
    }
    if a.threads != 0 {
        b = b.queue_threads(a.threads);
    }
    let size = if a.size != 0 {
        a.size
    } else {
        take_over_size(a.take_over.unwrap())
    };
    let zram = Arc::new(Zram {
        store: Arc::new(Store::new(size / BLOCK as u64, a.mem_limit, a.algo)),
        fastpath: a.fastpath.clone(),
        attached: Mutex::new(None),
        full_said: AtomicBool::new(false),
        stats: a.stats.clone(),
        stop: Arc::new(AtomicBool::new(false)),
        stats_thread: Mutex::new(None),
    });
    let res = b.run(zram.clone());
    zram.stop.store(true, Ordering::Relaxed);
    if let Some(t) = zram.stats_thread.lock().unwrap().take() {
        let _ = t.join();
    }
    if let Err(e) = res {
        eprintln!("zram-rs: {e}");
        std::process::exit(1);
    }
}

/// The size of device `id`, which a take-over keeps.
fn take_over_size(id: u32) -> u64 {
    match hybd::ctl::info(id) {
        Ok(info) => info.params.basic.dev_size,
        Err(e) => {
            eprintln!("zram-rs: /dev/hybd{id}: {e}");
            std::process::exit(1);
        }
    }
}
