// SPDX-License-Identifier: MIT
//! The compressed block store: 4 KiB blocks, each empty, a repeated
//! 64-bit word (same-filled, as zram stores them: no memory), compressed
//! (lz4 or zstd, one for the whole store), or kept whole when compression
//! cannot make it small enough.  Memory is bounded: a write that would
//! take the store past its limit fails.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// The store's block size: a page, as zram's.
pub const BLOCK: usize = 4096;
/// Blocks per lock: 2 MiB of the device.
const SHARD_BLOCKS: usize = 512;
/// A block that compresses to more than this is kept whole (zram's
/// "huge" pages: a compressed copy that large saves too little to pay
/// for its decompression).
const HUGE: usize = BLOCK * 3 / 4;

/// The store's compressor, as zram's `comp_algorithm` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// lz4's block format (`lz4_flex`, pure Rust): zram's default.
    Lz4,
    /// zstd at its default level, 3 (libzstd, through the `zstd` crate),
    /// as zram's zstd: smaller, slower.
    Zstd,
}

impl Algo {
    /// "lz4" or "zstd", as zram's `comp_algorithm` takes them.
    pub fn parse(s: &str) -> Option<Algo> {
        match s {
            "lz4" => Some(Algo::Lz4),
            "zstd" => Some(Algo::Zstd),
            _ => None,
        }
    }

    /// Its name in `comp_algorithm`.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Lz4 => "lz4",
            Algo::Zstd => "zstd",
        }
    }

    fn compress(self, data: &[u8]) -> Vec<u8> {
        match self {
            Algo::Lz4 => lz4_flex::block::compress(data),
            Algo::Zstd => ZSTD.with(|z| {
                let mut z = z.borrow_mut();
                let (c, _) = z.get_or_insert_with(zstd_contexts);
                // a block needs at most compress_bound(4096) bytes: the
                // vector has them, so compression cannot fail for room
                c.compress(data).expect("zstd compresses a block")
            }),
        }
    }

    fn decompress(self, src: &[u8], out: &mut [u8]) {
        // only this store's compressor wrote it: it decompresses, whole
        let n = match self {
            Algo::Lz4 => {
                lz4_flex::block::decompress_into(src, out).expect("a corrupt lz4 block in memory")
            }
            Algo::Zstd => ZSTD.with(|z| {
                let mut z = z.borrow_mut();
                let (_, d) = z.get_or_insert_with(zstd_contexts);
                d.decompress_to_buffer(src, out)
                    .expect("a corrupt zstd block in memory")
            }),
        };
        assert_eq!(n, BLOCK, "a compressed block is a whole block");
    }
}

/// zstd's default level, zram's too.
const ZSTD_LEVEL: i32 = 3;

type ZstdContexts = (
    zstd::bulk::Compressor<'static>,
    zstd::bulk::Decompressor<'static>,
);

thread_local! {
    /// One compression and one decompression context per thread (a
    /// context is ~1 MiB at level 3: made once, reused for every block).
    static ZSTD: std::cell::RefCell<Option<ZstdContexts>> =
        const { std::cell::RefCell::new(None) };
}

fn zstd_contexts() -> ZstdContexts {
    (
        zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("a zstd context"),
        zstd::bulk::Decompressor::new().expect("a zstd context"),
    )
}

/// A block's content.
enum Slot {
    /// Never written, or discarded: reads as zeros.
    Empty,
    /// Every 64-bit word is this one.
    Same(u64),
    /// Compressed with the store's algorithm.
    Packed(Box<[u8]>),
    /// Stored as written.
    Whole(Box<[u8]>),
}

impl Slot {
    /// Bytes of the store's memory this slot holds beyond its own entry.
    fn bytes(&self) -> u64 {
        match self {
            Slot::Empty | Slot::Same(_) => 0,
            Slot::Packed(b) | Slot::Whole(b) => b.len() as u64,
        }
    }
}

/// The store's counters, as zram's `mm_stat` has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of data stored (every non-empty block, 4 KiB each).
    pub orig_data_size: u64,
    /// Bytes the compressed and whole blocks take.
    pub compr_data_size: u64,
    /// Bytes of memory the store uses: compr_data_size plus one entry
    /// per block of the device.
    pub mem_used: u64,
    /// The limit on compr_data_size (0: none).
    pub mem_limit: u64,
    /// Blocks stored as a repeated word (zeros included).
    pub same_pages: u64,
    /// Blocks kept whole.
    pub huge_pages: u64,
    /// Writes refused by the limit.
    pub limit_refusals: u64,
}

/// Why a write was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

/// What a block holds after a write, for the fast path's bitmap.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// It reads as zeros.
    Zeros,
    /// Anything else.
    Data,
}

/// One bit per block that says "reads as zeros", which a fast path reads
/// without the store's locks (zram.bpf.c's `zram_zeros`).  The store
/// keeps it exact: under the block's lock, a bit is cleared before the
/// slot takes data and set after it became empty or zeros, so a reader
/// that sees a set bit never misses data a completed write stored.
pub trait ZeroBits: Send + Sync {
    /// Set (`true`) or clear block `blk`'s bit.
    fn set(&self, blk: u64, zero: bool);
}

impl ZeroBits for [std::sync::atomic::AtomicU64] {
    fn set(&self, blk: u64, zero: bool) {
        if let Some(w) = self.get((blk / 64) as usize) {
            let bit = 1u64 << (blk % 64);
            if zero {
                w.fetch_or(bit, std::sync::atomic::Ordering::Release);
            } else {
                w.fetch_and(!bit, std::sync::atomic::Ordering::AcqRel);
            }
        }
    }
}

/// The store.
pub struct Store {
    shards: Vec<Mutex<Vec<Slot>>>,
    zeros: std::sync::OnceLock<Box<dyn ZeroBits>>,
    blocks: u64,
    limit: u64,
    algo: Algo,
    compr: AtomicU64,
    stored: AtomicU64,
    same: AtomicU64,
    huge: AtomicU64,
    refused: AtomicU64,
}

/// If every 64-bit word of `b` is the same, that word.
pub fn same_filled(b: &[u8]) -> Option<u64> {
    let mut words = b
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().unwrap()));
    let first = words.next()?;
    words.all(|w| w == first).then_some(first)
}

impl Store {
    /// A store of `blocks` blocks whose compressed data may take at most
    /// `limit` bytes (0: no limit), compressed with `algo`.
    pub fn new(blocks: u64, limit: u64, algo: Algo) -> Store {
        let n = (blocks as usize).div_ceil(SHARD_BLOCKS);
        let shards = (0..n)
            .map(|i| {
                let len = SHARD_BLOCKS.min(blocks as usize - i * SHARD_BLOCKS);
                Mutex::new((0..len).map(|_| Slot::Empty).collect())
            })
            .collect();
        Store {
            shards,
            zeros: std::sync::OnceLock::new(),
            blocks,
            limit,
            algo,
            compr: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            same: AtomicU64::new(0),
            huge: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Keep `bits` exact from now on (every block is empty: set them all
    /// first).  Before any request, as the fast path attaches.
    pub fn set_zero_bits(&self, bits: Box<dyn ZeroBits>) {
        if self.zeros.set(bits).is_err() {
            panic!("the store keeps one set of zero bits");
        }
    }

    fn with_slot<R>(&self, blk: u64, f: impl FnOnce(&mut Slot) -> R) -> R {
        let b = blk as usize;
        let mut shard = self.shards[b / SHARD_BLOCKS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        f(&mut shard[b % SHARD_BLOCKS])
    }

    /// Read block `blk` into `out` (one block).
    pub fn read(&self, blk: u64, out: &mut [u8]) {
        self.with_slot(blk, |s| match s {
            Slot::Empty => out.fill(0),
            Slot::Same(w) => {
                for c in out.chunks_exact_mut(8) {
                    c.copy_from_slice(&w.to_ne_bytes());
                }
            }
            Slot::Whole(b) => out.copy_from_slice(b),
            Slot::Packed(b) => self.algo.decompress(b, out),
        })
    }

    /// Count the change from `old` to `new` (stored, same-filled, whole).
    fn count(&self, old: &Slot, new: &Slot) {
        let stored = |s: &Slot| !matches!(s, Slot::Empty);
        let same = |s: &Slot| matches!(s, Slot::Same(_));
        let huge = |s: &Slot| matches!(s, Slot::Whole(_));
        for (c, f) in [
            (&self.stored, &stored as &dyn Fn(&Slot) -> bool),
            (&self.same, &same),
            (&self.huge, &huge),
        ] {
            match (f(old), f(new)) {
                (false, true) => drop(c.fetch_add(1, Relaxed)),
                (true, false) => drop(c.fetch_sub(1, Relaxed)),
                _ => {}
            }
        }
    }

    /// Swap block `blk`'s slot for `new`.  Growth is reserved against the
    /// limit atomically, so concurrent writers cannot pass it together.
    fn replace(&self, blk: u64, new: Slot) -> Result<(), Full> {
        self.with_slot(blk, |s| {
            let (ob, nb) = (s.bytes(), new.bytes());
            if nb > ob {
                let grow = nb - ob;
                let fits = |c: u64| (self.limit == 0 || c + grow <= self.limit).then_some(c + grow);
                if self.compr.fetch_update(Relaxed, Relaxed, fits).is_err() {
                    self.refused.fetch_add(1, Relaxed);
                    return Err(Full);
                }
            } else {
                self.compr.fetch_sub(ob - nb, Relaxed);
            }
            self.count(s, &new);
            let zero = matches!(new, Slot::Empty | Slot::Same(0));
            if let (Some(z), false) = (self.zeros.get(), zero) {
                z.set(blk, false);
            }
            *s = new;
            if let (Some(z), true) = (self.zeros.get(), zero) {
                z.set(blk, true);
            }
            Ok(())
        })
    }

    /// Store `data` (one block) as block `blk`.
    pub fn write(&self, blk: u64, data: &[u8]) -> Result<Written, Full> {
        // compress outside the lock: only the swap is under it
        let (slot, w) = match same_filled(data) {
            Some(0) => (Slot::Same(0), Written::Zeros),
            Some(word) => (Slot::Same(word), Written::Data),
            None => {
                let c = self.algo.compress(data);
                if c.len() > HUGE {
                    (Slot::Whole(data.into()), Written::Data)
                } else {
                    (Slot::Packed(c.into_boxed_slice()), Written::Data)
                }
            }
        };
        self.replace(blk, slot).map(|()| w)
    }

    /// Block `blk` reads as zeros from now on and holds no memory.
    pub fn discard(&self, blk: u64) {
        // freeing never exceeds the limit
        let _ = self.replace(blk, Slot::Empty);
    }

    /// Its compressor.
    pub fn algo(&self) -> Algo {
        self.algo
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        let compr = self.compr.load(Relaxed);
        Stats {
            orig_data_size: self.stored.load(Relaxed) * BLOCK as u64,
            compr_data_size: compr,
            mem_used: compr + self.blocks * std::mem::size_of::<Slot>() as u64,
            mem_limit: self.limit,
            same_pages: self.same.load(Relaxed),
            huge_pages: self.huge.load(Relaxed),
            limit_refusals: self.refused.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_block(seed: u8) -> Vec<u8> {
        // compressible: words of a small alphabet
        (0..BLOCK)
            .map(|i| b"hybd zram block "[(i + seed as usize) % 16])
            .collect()
    }

    fn random_block(seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..BLOCK)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn same_fill_detection() {
        assert_eq!(same_filled(&[0u8; BLOCK]), Some(0));
        let w = 0x0123_4567_89ab_cdefu64.to_ne_bytes();
        let b: Vec<u8> = w.iter().copied().cycle().take(BLOCK).collect();
        assert_eq!(same_filled(&b), Some(0x0123_4567_89ab_cdef));
        let mut c = b.clone();
        c[BLOCK - 1] ^= 1;
        assert_eq!(same_filled(&c), None);
        // a repeated byte pattern whose words differ is not same-filled
        let d: Vec<u8> = (0..BLOCK).map(|i| (i % 3) as u8).collect();
        assert_eq!(same_filled(&d), None);
    }

    #[test]
    fn every_kind_reads_back() {
        for algo in [Algo::Lz4, Algo::Zstd] {
            every_kind_reads_back_with(algo);
        }
    }

    fn every_kind_reads_back_with(algo: Algo) {
        let s = Store::new(16, 0, algo);
        let mut out = vec![0xaau8; BLOCK];
        s.read(3, &mut out);
        assert_eq!(out, vec![0u8; BLOCK], "a never-written block reads zeros");

        let text = text_block(1);
        let rnd = random_block(7);
        let same: Vec<u8> = 7u64
            .to_ne_bytes()
            .iter()
            .copied()
            .cycle()
            .take(BLOCK)
            .collect();
        assert_eq!(s.write(0, &text), Ok(Written::Data));
        assert_eq!(s.write(1, &rnd), Ok(Written::Data));
        assert_eq!(s.write(2, &same), Ok(Written::Data));
        assert_eq!(s.write(3, &[0u8; BLOCK]), Ok(Written::Zeros));
        for (blk, want) in [(0, &text), (1, &rnd), (2, &same)] {
            s.read(blk, &mut out);
            assert_eq!(&out, want, "block {blk}");
        }
        s.read(3, &mut out);
        assert_eq!(out, vec![0u8; BLOCK]);

        let st = s.stats();
        assert_eq!(st.orig_data_size, 4 * BLOCK as u64);
        assert_eq!(st.same_pages, 2);
        assert_eq!(st.huge_pages, 1, "random data is kept whole");
        assert!(st.compr_data_size > BLOCK as u64, "{st:?}");
        assert!(
            st.compr_data_size < 2 * BLOCK as u64,
            "text compresses: {st:?}"
        );
    }

    #[test]
    fn zstd_packs_text_tighter_than_lz4_and_both_read_back() {
        // a page of varied text: lines of a log, each different
        let text: Vec<u8> = (0..)
            .flat_map(|i: u32| {
                format!(
                    "{i:08} hybd zram-rs wrote block {} of {}\n",
                    i * 7 % 13,
                    i % 5
                )
                .into_bytes()
            })
            .take(BLOCK)
            .collect();
        let size = |algo| {
            let s = Store::new(1, 0, algo);
            s.write(0, &text).unwrap();
            let mut out = vec![0u8; BLOCK];
            s.read(0, &mut out);
            assert_eq!(out, text, "{algo:?}");
            s.stats().compr_data_size
        };
        let (lz4, zstd) = (size(Algo::Lz4), size(Algo::Zstd));
        assert!(0 < zstd && zstd < lz4, "zstd {zstd} bytes, lz4 {lz4}");
        assert_eq!(Algo::parse("zstd"), Some(Algo::Zstd));
        assert_eq!(Algo::parse("lz4").map(Algo::name), Some("lz4"));
        assert_eq!(Algo::parse("deflate"), None);
    }

    #[test]
    fn overwrite_and_discard_give_memory_back() {
        let s = Store::new(8, 0, Algo::Lz4);
        s.write(5, &random_block(1)).unwrap();
        assert_eq!(s.stats().compr_data_size, BLOCK as u64);
        s.write(5, &text_block(0)).unwrap();
        let small = s.stats().compr_data_size;
        assert!(small > 0 && small < BLOCK as u64 / 4, "{small}");
        assert_eq!(s.stats().huge_pages, 0);
        s.discard(5);
        let st = s.stats();
        assert_eq!(
            (st.compr_data_size, st.orig_data_size, st.same_pages),
            (0, 0, 0)
        );
        let mut out = vec![1u8; BLOCK];
        s.read(5, &mut out);
        assert_eq!(out, vec![0u8; BLOCK], "a discarded block reads zeros");
    }

    #[test]
    fn the_limit_refuses_what_does_not_fit_and_keeps_the_old_data() {
        let s = Store::new(8, 2 * BLOCK as u64, Algo::Lz4);
        s.write(0, &random_block(1)).unwrap();
        s.write(1, &random_block(2)).unwrap();
        assert_eq!(s.write(2, &random_block(3)), Err(Full));
        assert_eq!(s.stats().limit_refusals, 1);
        // same-filled blocks need no memory: still accepted
        assert_eq!(s.write(2, &[0u8; BLOCK]), Ok(Written::Zeros));
        // a smaller replacement is accepted, a refused one changes nothing
        let old = random_block(1);
        assert_eq!(s.write(0, &text_block(3)), Ok(Written::Data));
        s.write(0, &old).unwrap();
        assert_eq!(s.write(3, &random_block(9)), Err(Full));
        let mut out = vec![0u8; BLOCK];
        s.read(0, &mut out);
        assert_eq!(out, old);
        assert!(s.stats().compr_data_size <= 2 * BLOCK as u64);
        // freeing makes room
        s.discard(1);
        assert_eq!(s.write(3, &random_block(9)), Ok(Written::Data));
    }

    #[test]
    fn the_zero_bits_follow_the_data() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let bits: std::sync::Arc<[AtomicU64]> = (0..2).map(|_| AtomicU64::new(!0)).collect();
        struct Shared(std::sync::Arc<[AtomicU64]>);
        impl ZeroBits for Shared {
            fn set(&self, blk: u64, zero: bool) {
                self.0[..].set(blk, zero)
            }
        }
        let s = Store::new(100, 0, Algo::Lz4);
        s.set_zero_bits(Box::new(Shared(bits.clone())));
        let bit = |b: u64| bits[(b / 64) as usize].load(Ordering::Relaxed) >> (b % 64) & 1;
        s.write(70, &text_block(0)).unwrap();
        assert_eq!(bit(70), 0);
        s.write(70, &[0u8; BLOCK]).unwrap();
        assert_eq!(bit(70), 1, "zeros written: reads as zeros");
        let ones: Vec<u8> = vec![0xff; BLOCK];
        s.write(3, &ones).unwrap();
        assert_eq!(bit(3), 0, "a same-filled block of ones is data");
        s.discard(3);
        assert_eq!(bit(3), 1);
        // a refused write changes no bit
        let t = Store::new(8, 1, Algo::Lz4);
        let tb: std::sync::Arc<[AtomicU64]> = (0..1).map(|_| AtomicU64::new(!0)).collect();
        t.set_zero_bits(Box::new(Shared(tb.clone())));
        assert_eq!(t.write(1, &random_block(4)), Err(Full));
        assert_eq!(tb[0].load(Ordering::Relaxed), !0);
    }

    #[test]
    fn a_partial_last_shard() {
        let blocks = SHARD_BLOCKS as u64 + 3;
        let s = Store::new(blocks, 0, Algo::Lz4);
        let t = text_block(2);
        s.write(blocks - 1, &t).unwrap();
        let mut out = vec![0u8; BLOCK];
        s.read(blocks - 1, &mut out);
        assert_eq!(out, t);
        assert_eq!(s.blocks, blocks);
    }

    #[test]
    fn concurrent_writers_keep_the_accounting_exact() {
        let s = std::sync::Arc::new(Store::new(1024, 0, Algo::Lz4));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let blk = (i * 7 + t) % 1024;
                        match i % 3 {
                            0 => drop(s.write(blk, &random_block(i + t))),
                            1 => drop(s.write(blk, &text_block(i as u8))),
                            _ => s.discard(blk),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // recount from the slots themselves
        let mut compr = 0;
        let mut stored = 0;
        for sh in &s.shards {
            for slot in sh.lock().unwrap().iter() {
                compr += slot.bytes();
                stored += !matches!(slot, Slot::Empty) as u64;
            }
        }
        let st = s.stats();
        assert_eq!(st.compr_data_size, compr);
        assert_eq!(st.orig_data_size, stored * BLOCK as u64);
    }
}
