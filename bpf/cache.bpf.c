// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * cache: a read cache of 4 KiB blocks in a direct-mapped array.
 *
 * Fills come from the slow path's reads, in complete().  Writes, discards
 * and write-zeroes bump the blocks' versions in submit() and complete();
 * a read is stamped with its block's version in submit(), and its data is
 * kept only if the version is unchanged when it completes.  An entry is
 * served only while its version is the block's current one, so a fill
 * that raced with a write is never served after that write.
 *
 * Slots are guarded by a sequence count: a fill holds it odd while it
 * copies; a hit copies, then checks the count did not move, and falls back
 * to the slow path if it did (which overwrites the copied bytes).
 */
#include "hybd_versions.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/*
 * Built with -DCACHE_NO_VERSION_STAMPS this is the naive cache that only
 * invalidates on write: the consistency test must catch it serving stale
 * data.  Never use it for anything else.
 */
#ifdef CACHE_NO_VERSION_STAMPS
#define cache_ver_bump(io)		do { } while (0)
#define cache_ver_unchanged(blk, stamp)	true
#else
#define cache_ver_bump(io)		hybd_ver_bump(io)
#define cache_ver_unchanged(blk, stamp)	hybd_ver_unchanged(blk, stamp)
#endif

#ifndef CACHE_SLOTS
#define CACHE_SLOTS	8192		/* 32 MiB of data */
#endif

struct cache_slot {
	__u64 seq;	/* odd while a fill writes the slot */
	__u64 blk;	/* block + 1; 0 = empty */
	__u64 stamp;	/* the version stamp the data is valid for */
	__u8 data[HYBD_BLOCK_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct cache_slot);
} cache_slots SEC(".maps");

/*
 * Counters: global variables, which libbpf keeps in the object's .bss map
 * ("cache.bss"); `hybdctl stats DEV --maps` shows them by name.
 */
__u64 hits;	/* reads served from the cache */
__u64 misses;	/* cached-size reads passed to the slow path */
__u64 fills;	/* blocks the slow path's reads filled in */
__u64 races;	/* hits given up because a fill overwrote the slot */

/* a fetching add, as every atomic here (see hybd_atomic_fetch_add()) */
#define cache_count(counter)	hybd_atomic_fetch_add(&(counter), 1)

static __always_inline struct cache_slot *cache_slot_of(__u64 blk)
{
	__u32 key = blk % CACHE_SLOTS;

	return bpf_map_lookup_elem(&cache_slots, &key);
}

/* Drop the cached copies of a write's blocks (frees slots early). */
static __always_inline void cache_invalidate(const struct hybd_bpf_io *io)
{
	__u64 first, count, i;
	struct cache_slot *s;

	hybd_io_blocks(io, &first, &count);
	for (i = 0; i < 256 && i < count; i++) {
		s = cache_slot_of(first + i);
		if (s && s->blk == first + i + 1)
			s->blk = 0;
	}
}

int BPF_STRUCT_OPS(cache_submit, struct hybd_bpf_io *io)
{
	struct cache_slot *s;
	__u64 blk, stamp, seq;

	if (hybd_io_changes_data(io)) {
		cache_ver_bump(io);
		cache_invalidate(io);
		return HYBD_BPF_PASS;
	}
	if (!hybd_io_one_block(io, &blk))
		return HYBD_BPF_PASS;

	stamp = hybd_ver_stamp(blk);
	io->scratch = stamp;
	s = cache_slot_of(blk);
	if (!s || !stamp)
		return HYBD_BPF_PASS;

	seq = __sync_fetch_and_add(&s->seq, 0);
	if (seq & 1 || s->blk != blk + 1 || s->stamp != stamp)
		goto miss;
	if (hybd_bpf_io_copy_in(io, 0, s->data, sizeof(s->data)))
		goto miss;
	if (__sync_fetch_and_add(&s->seq, 0) != seq) {
		cache_count(races);
		goto miss;
	}
	cache_count(hits);
	return HYBD_BPF_DONE;
miss:
	cache_count(misses);
	return HYBD_BPF_PASS;
}

void BPF_STRUCT_OPS(cache_complete, struct hybd_bpf_io *io)
{
	struct cache_slot *s;
	__u64 blk, seq;

	if (hybd_io_changes_data(io)) {
		cache_ver_bump(io);
		return;
	}
	if (!io->own || io->result || !hybd_io_one_block(io, &blk))
		return;
	if (!cache_ver_unchanged(blk, io->scratch))
		return;
	s = cache_slot_of(blk);
	if (!s)
		return;

	/* take the slot: even -> odd, or leave it to whoever has it */
	seq = s->seq;
	if (seq & 1 || __sync_val_compare_and_swap(&s->seq, seq, seq + 1) != seq)
		return;
	s->blk = 0;
	if (!hybd_bpf_io_copy_out(io, 0, s->data, sizeof(s->data))) {
		s->stamp = io->scratch;
		s->blk = blk + 1;
		cache_count(fills);
	}
	/* release: odd -> even, ordered after the fill's stores */
	hybd_atomic_fetch_add(&s->seq, 1);
}

HYBD_OPS_DEFINE(cache_ops,
	.submit   = (void *)cache_submit,
	.complete = (void *)cache_complete,
	.name     = "cache");
