// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * dedup: the fast path of examples/dedup, a deduplicating block device
 * whose slow path (dedup.c) keeps a content-addressed store in a backing
 * file.  The device has 4 KiB logical blocks, so every request is whole,
 * aligned blocks.
 *
 * Reads of up to DEDUP_MAX_BLOCKS blocks complete here when every block
 * is either known to read as zeros (dedup_zero, kept exact by the slow
 * path) or held by the cache with its current version stamp; anything
 * else goes to the slow path, whose successful reads fill the cache in
 * complete().  Writes, discards and write-zeroes always go to the slow
 * path: they bump the blocks' versions (submit and complete) and drop
 * their cached copies, and a write whose payload is all zeros is handed
 * over as a write-zeroes, without its payload (HYBD_BPF_PASS_ZEROES).
 *
 * The cache is cache.bpf.c's: direct-mapped 4 KiB slots, each guarded by
 * a sequence count (odd while a fill writes it; a hit copies, then checks
 * the count did not move) and valid only for the version stamp stored
 * with it.
 */
#include "hybd_versions.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define DEDUP_MAX_BLOCKS	32	/* 128 KiB: the largest read served */
#define DEDUP_INVAL_MAX		256	/* 1 MiB: slots a write drops at most */

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

struct dedup_slot {
	__u64 seq;	/* odd while a fill writes the slot */
	__u64 blk;	/* block + 1; 0 = empty */
	__u64 stamp;	/* the version stamp the data is valid for */
	__u8 data[HYBD_BLOCK_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, DEDUP_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct dedup_slot);
} dedup_cache SEC(".maps");

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
 * read counts in reads and in one of zero_hits, cache_hits, read_misses;
 * the hit rate is (zero_hits + cache_hits) / reads.
 */
__u64 reads;		/* reads seen by submit() */
__u64 zero_hits;	/* reads served entirely as zeros */
__u64 cache_hits;	/* reads served with at least one cached block */
__u64 read_misses;	/* reads passed to the slow path */
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

static __always_inline struct dedup_slot *dedup_slot_of(__u64 blk)
{
	__u32 key = blk % DEDUP_CACHE_SLOTS;

	return bpf_map_lookup_elem(&dedup_cache, &key);
}

/* An aligned read of 1..DEDUP_MAX_BLOCKS whole blocks: what is served. */
static __always_inline bool dedup_read_blocks(const struct hybd_bpf_io *io,
					      __u64 *first, __u64 *count)
{
	if (io->op != HYBD_OP_READ || !io->bytes ||
	    io->bytes % HYBD_BLOCK_SIZE || io->sector % HYBD_SECTORS_PER_BLOCK)
		return false;
	hybd_io_blocks(io, first, count);
	return *count <= DEDUP_MAX_BLOCKS;
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

/* Drop the cached copies of a write's blocks (frees slots early; the
 * versions alone already keep them from being served). */
static __always_inline void dedup_invalidate(const struct hybd_bpf_io *io)
{
	__u64 first, count, i;
	struct dedup_slot *s;

	hybd_io_blocks(io, &first, &count);
	for (i = 0; i < DEDUP_INVAL_MAX && i < count; i++) {
		s = dedup_slot_of(first + i);
		if (s && s->blk == first + i + 1)
			s->blk = 0;
	}
}

/*
 * Copy block @blk from its slot into the read at @off, if the slot holds
 * it with its current stamp: 0, or -1 (a miss, or the slot changed while
 * it was copied: the slow path then overwrites what was copied).
 */
static __always_inline int dedup_copy_cached(struct hybd_bpf_io *io,
					     __u64 blk, __u32 off)
{
	struct dedup_slot *s = dedup_slot_of(blk);
	__u64 stamp = hybd_ver_stamp(blk), seq;

	if (!s || !stamp)
		return -1;
	seq = __sync_fetch_and_add(&s->seq, 0);
	if (seq & 1 || s->blk != blk + 1 || s->stamp != stamp)
		return -1;
	if (hybd_bpf_io_copy_in(io, off, s->data, sizeof(s->data)))
		return -1;
	if (__sync_fetch_and_add(&s->seq, 0) != seq) {
		dedup_count(races);
		return -1;
	}
	return 0;
}

static __always_inline int dedup_read(struct hybd_bpf_io *io)
{
	struct dedup_zblock *zeros;
	__u64 first, count, i;
	bool cached = false;
	__u32 key = 0;
	int ret;

	dedup_count(reads);
	if (!dedup_read_blocks(io, &first, &count)) {
		io->scratch = 0;	/* never filled */
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
	for (i = 0; i < DEDUP_MAX_BLOCKS && i < count; i++) {
		if (dedup_known_zero(first + i)) {
			ret = hybd_bpf_io_copy_in(io, i * HYBD_BLOCK_SIZE,
						  zeros->data,
						  sizeof(zeros->data));
		} else {
			ret = dedup_copy_cached(io, first + i,
						i * HYBD_BLOCK_SIZE);
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
miss:
	dedup_count(read_misses);
	return HYBD_BPF_PASS;
}

int BPF_STRUCT_OPS(dedup_submit, struct hybd_bpf_io *io)
{
	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		dedup_invalidate(io);
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

/* Fill @blk's slot with the block at @off of the read, valid for @stamp. */
static __always_inline void dedup_fill(struct hybd_bpf_io *io, __u64 blk,
				       __u32 off, __u64 stamp)
{
	struct dedup_slot *s = dedup_slot_of(blk);
	__u64 seq;

	if (!s)
		return;
	/* take the slot: even -> odd, or leave it to whoever has it */
	seq = s->seq;
	if (seq & 1 || __sync_val_compare_and_swap(&s->seq, seq, seq + 1) != seq)
		return;
	s->blk = 0;
	if (!hybd_bpf_io_copy_out(io, off, s->data, sizeof(s->data))) {
		s->stamp = stamp;
		s->blk = blk + 1;
		dedup_count(fills);
	}
	/* release: odd -> even, ordered after the fill's stores */
	hybd_atomic_fetch_add(&s->seq, 1);
}

void BPF_STRUCT_OPS(dedup_complete, struct hybd_bpf_io *io)
{
	__u64 stamps[DEDUP_MAX_BLOCKS];
	__u64 first, count, i, sum = 1, ver, *v;

	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		return;
	}
	if (!io->own || io->result || !io->scratch ||
	    !dedup_read_blocks(io, &first, &count))
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
	for (i = 0; i < DEDUP_MAX_BLOCKS && i < count; i++) {
		v = hybd_ver_slot(first + i);
		if (!v)
			return;
		ver = *(volatile __u64 *)v;
		stamps[i] = ver + 1;
		sum += ver;
	}
	if (sum != io->scratch)
		return;

	for (i = 0; i < DEDUP_MAX_BLOCKS && i < count; i++) {
		/* served from dedup_zero: no slot needed */
		if (dedup_known_zero(first + i))
			continue;
		dedup_fill(io, first + i, i * HYBD_BLOCK_SIZE, stamps[i]);
	}
}

HYBD_OPS_DEFINE(dedup_ops,
	.submit   = (void *)dedup_submit,
	.complete = (void *)dedup_complete,
	.name     = "dedup");
