// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * dedup: the fast path of examples/dedup, a deduplicating block device
 * whose slow path (dedup.c) keeps a content-addressed store in a backing
 * file.  The device has 4 KiB logical blocks, so every request is whole,
 * aligned blocks.
 *
 * Reads of up to DEDUP_MAX_BLOCKS blocks complete here when every block
 * is either known to read as zeros (dedup_zero, kept exact by the slow
 * path) or held by the cache with its current version stamp.  A read whose
 * blocks are all stored, in chunks that lie one after the other in the
 * store (dedup_chunk, kept exact by the slow path too, which gives the new
 * blocks of each write consecutive chunks), is remapped: the kernel reads
 * it straight from the store, registered as backing target 0 -- up to
 * DEDUP_MAX_REMAP blocks, hybd's largest request.  Anything else goes to
 * the slow path.  Successful reads, served by
 * the slow path or a remap, fill the cache in complete().  Writes, discards and write-zeroes always go to the slow
 * path: they bump the blocks' versions (submit and complete) and drop
 * their cached copies, and a write whose payload is all zeros is handed
 * over as a write-zeroes, without its payload (HYBD_BPF_PASS_ZEROES).
 *
 * The cache is hybd_cache.bpf.h's, as in bpf/cache.bpf.c: direct-mapped
 * 4 KiB slots, each guarded by a sequence count and valid only for the
 * version stamp stored with it.  Built with -DDEDUP_NO_CACHE
 * (dedup-nocache.bpf.o) it has none: holes and remaps only.
 */
#include "hybd_cache.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define DEDUP_MAX_BLOCKS	32	/* 128 KiB: the largest read served here */
/*
 * The largest read remapped: hybd's largest request (1 MiB), so that a
 * device made with a larger max_io_bytes than dedup serve's 128 KiB still
 * has its large reads of one extent read by the kernel.
 */
#define DEDUP_MAX_REMAP		(HYBD_MAX_IO_BYTES / HYBD_BLOCK_SIZE)

#ifndef DEDUP_CACHE_SLOTS
#define DEDUP_CACHE_SLOTS	8192	/* 32 MiB of data */
#endif

/*
 * Known-zero blocks, written by the slow path only (an interface with
 * dedup.c: keep the name and shape).  1: the block reads as zeros (never
 * written, discarded, written with zeros); 0: anything else, or unknown.
 * Blocks past its end are unknown.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1U << 22);
	__type(key, __u32);
	__type(value, __u32);
} dedup_zero SEC(".maps") HYBD_PER_BLOCK;

/*
 * Where each block's chunk is in the store, written by the slow path only
 * (an interface with dedup.c): its byte offset, 0 for a hole or unknown.
 * The slow path changes an entry before the request that changed the
 * block completes, and reuses a chunk only after a remap barrier
 * (hybd_dev_remap_barrier()) that follows the entry's change: a remap
 * that read an old offset is over before anything else is written there.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1U << 22);
	__type(key, __u32);
	__type(value, __u64);
} dedup_chunk SEC(".maps") HYBD_PER_BLOCK;

#define DEDUP_STORE	0	/* the backing target: the store */

HYBD_CACHE_DEFINE(dedup_cache, DEDUP_CACHE_SLOTS);

/*
 * A block of zeros, the source for the known-zero blocks of a read that
 * also has cached ones.  Nothing writes it.  (A map rather than a
 * global: hybdctl stats --maps shows every global.)
 */
struct dedup_zblock {
	__u8 data[HYBD_BLOCK_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dedup_zblock);
} dedup_zblock SEC(".maps");

/*
 * Counters: global variables, which libbpf keeps in the object's .bss map
 * ("dedup.bss"); `hybdctl stats DEV --maps` shows them by name.  Every
 * read counts in reads and in one of zero_hits, cache_hits, remap_hits,
 * read_misses; the hit rate is (zero_hits + cache_hits + remap_hits) /
 * reads.
 */
__u64 reads;		/* reads seen by submit() */
__u64 zero_hits;	/* reads served entirely as zeros */
__u64 cache_hits;	/* reads served with at least one cached block */
__u64 read_misses;	/* reads passed to the slow path */
__u64 remap_hits;	/* reads remapped to the store */
__u64 fills;		/* blocks the slow path's reads filled in */
__u64 races;		/* hits given up because a fill took the slot */
__u64 zero_writes;	/* writes passed as write-zeroes */

/* a fetching add, as every atomic here (see hybd_atomic_fetch_add()) */
#define dedup_count(counter)	hybd_atomic_fetch_add(&(counter), 1)

static __always_inline bool dedup_known_zero(__u64 blk)
{
	__u32 key = blk;
	__u32 *z;

	if (blk > 0xffffffffULL)
		return false;
	z = bpf_map_lookup_elem(&dedup_zero, &key);
	return z && *z == 1;
}

/*
 * A multi-block read has one io->scratch, so its stamp is
 *
 *	1 + the sum of its blocks' versions
 *
 * (0 if a version slot is missing: no stamp, no fill).  Versions only
 * ever grow (every change is hybd_ver_bump()'s +1, and a u64 does not
 * wrap), so each block's version at complete() is at least the one at
 * submit(), and the sum is unchanged iff every block's version is.  This
 * holds when blocks share a version slot too: a shared slot is counted
 * once per block, each time no smaller.
 */
static __always_inline __u64 dedup_stamp(__u64 first, __u64 count)
{
	__u64 sum = 1, i, *v;

	for (i = 0; i < DEDUP_MAX_BLOCKS && i < count; i++) {
		v = hybd_ver_slot(first + i);
		if (!v)
			return 0;
		sum += *v;
	}
	return sum;
}

/*
 * The store offset of a read whose blocks are all stored in consecutive
 * chunks, or 0.  Every block of the read is looked at, up to
 * DEDUP_MAX_REMAP (a larger read is never passed here): a read of more
 * would remap data the loop did not check.
 */
static __always_inline __u64 dedup_extent(__u64 first, __u64 count)
{
	__u64 start = 0, i, *off;
	__u32 key;

	if (first + count > 0xffffffffULL || !count ||
	    count > DEDUP_MAX_REMAP)
		return 0;
	for (i = 0; i < DEDUP_MAX_REMAP && i < count; i++) {
		key = first + i;
		off = bpf_map_lookup_elem(&dedup_chunk, &key);
		if (!off || !*off)
			return 0;
		if (!i)
			start = *off;
		else if (*off != start + i * HYBD_BLOCK_SIZE)
			return 0;
	}
	return start;
}

static __always_inline int dedup_read(struct hybd_bpf_io *io)
{
	__u64 store_off;
	struct dedup_zblock *zeros;
	__u64 first, count, i;
	bool cached = false;
	__u32 key = 0;
	int ret;

	dedup_count(reads);
	if (!hybd_io_read_blocks(io, DEDUP_MAX_BLOCKS, &first, &count)) {
		io->scratch = 0;	/* never filled */
		/* too large for holes and the cache, not for a remap */
		if (hybd_io_read_blocks(io, DEDUP_MAX_REMAP, &first, &count))
			goto remap;
		goto miss;
	}

	for (i = 0; i < DEDUP_MAX_BLOCKS && i < count; i++)
		if (!dedup_known_zero(first + i))
			break;
	if (i == count) {
		if (hybd_bpf_io_zero(io))
			goto pass;
		dedup_count(zero_hits);
		return HYBD_BPF_DONE;
	}

	/* every block in order from offset 0, or none of the read */
	zeros = bpf_map_lookup_elem(&dedup_zblock, &key);
	if (!zeros)
		goto pass;
#ifdef DEDUP_NO_CACHE
	goto pass;
#endif
	for (i = 0; i < DEDUP_MAX_BLOCKS && i < count; i++) {
		if (dedup_known_zero(first + i)) {
			ret = hybd_bpf_io_copy_in(io, i * HYBD_BLOCK_SIZE,
						  zeros->data,
						  sizeof(zeros->data));
		} else {
			ret = hybd_cache_copy_in(&dedup_cache,
						 DEDUP_CACHE_SLOTS, io,
						 first + i,
						 i * HYBD_BLOCK_SIZE,
						 hybd_ver_stamp(first + i));
			if (ret == HYBD_CACHE_RACE)
				dedup_count(races);
			cached = true;
		}
		if (ret)
			goto pass;
	}
	if (cached)
		dedup_count(cache_hits);
	else
		dedup_count(zero_hits);	/* the zeros came one by one */
	return HYBD_BPF_DONE;
pass:
	/* before the slow path can read anything: see dedup_stamp() */
	io->scratch = dedup_stamp(first, count);
remap:
	store_off = dedup_extent(first, count);
	if (store_off && !hybd_bpf_io_remap(io, DEDUP_STORE, store_off)) {
		dedup_count(remap_hits);
		return HYBD_BPF_REMAPPED;
	}
miss:
	dedup_count(read_misses);
	return HYBD_BPF_PASS;
}

int BPF_STRUCT_OPS(dedup_submit, struct hybd_bpf_io *io)
{
	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		hybd_cache_drop(&dedup_cache, DEDUP_CACHE_SLOTS, io);
		if (io->op == HYBD_OP_WRITE && hybd_bpf_io_is_zero(io) == 1) {
			dedup_count(zero_writes);
			return HYBD_BPF_PASS_ZEROES;
		}
		return HYBD_BPF_PASS;
	}
	if (io->op != HYBD_OP_READ)
		return HYBD_BPF_PASS;	/* flush: the server's */
	return dedup_read(io);
}

/* what dedup_fill_one() needs of a complete(): on complete()'s stack */
struct dedup_fill {
	struct hybd_bpf_io *io;
	__u64 first;
	__u64 stamps[DEDUP_MAX_BLOCKS];
};

/*
 * Fill block @i's slot of the read the struct dedup_fill at @data is for.
 * A bpf_loop() callback: the verifier checks it once, where an open loop
 * over 32 blocks with two outcomes each (known zero, filled) made 7.3's
 * verifier walk past its million instructions.
 */
static long dedup_fill_one(__u64 i, void *data)
{
	struct dedup_fill *f = data;

	if (i >= DEDUP_MAX_BLOCKS)
		return 1;
	/* served from dedup_zero: no slot needed */
	if (dedup_known_zero(f->first + i))
		return 0;
	if (hybd_cache_fill(&dedup_cache, DEDUP_CACHE_SLOTS, f->io,
			    f->first + i, i * HYBD_BLOCK_SIZE, f->stamps[i]))
		dedup_count(fills);
	return 0;
}

void BPF_STRUCT_OPS(dedup_complete, struct hybd_bpf_io *io)
{
	struct dedup_fill fill;
	__u64 first, count, i, sum = 1, ver, *v;

	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		return;
	}
	if (!io->own || io->result || !io->scratch ||
	    !hybd_io_read_blocks(io, DEDUP_MAX_BLOCKS, &first, &count))
		return;

	/*
	 * Recompute the sum (see dedup_stamp()), keeping each block's stamp
	 * as read for it: if the sum still equals io->scratch, every version
	 * read here is the one at submit(), so these are the stamps the
	 * read's data is valid for.  They are stored with the data, never a
	 * version read again later: a write that bumped a block in between
	 * (both its submit and complete) would have it stored with the data
	 * the write replaced, and served.
	 */
	__builtin_memset(&fill, 0, sizeof(fill));
	for (i = 0; i < DEDUP_MAX_BLOCKS && i < count; i++) {
		v = hybd_ver_slot(first + i);
		if (!v)
			return;
		ver = *(volatile __u64 *)v;
		fill.stamps[i] = ver + 1;
		sum += ver;
	}
	if (sum != io->scratch)
		return;
#ifdef DEDUP_NO_CACHE
	return;
#endif
	fill.io = io;
	fill.first = first;
	bpf_loop(count < DEDUP_MAX_BLOCKS ? count : DEDUP_MAX_BLOCKS,
		 dedup_fill_one, &fill, 0);
}

HYBD_OPS_DEFINE(dedup_ops,
	.submit   = (void *)dedup_submit,
	.complete = (void *)dedup_complete,
	.name     = "dedup");
