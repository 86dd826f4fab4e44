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
 * The slots and their sequence counts are hybd_cache.bpf.h's.
 */
#include "hybd_cache.bpf.h"

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

HYBD_CACHE_DEFINE(cache_slots, CACHE_SLOTS);

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

int BPF_STRUCT_OPS(cache_submit, struct hybd_bpf_io *io)
{
	__u64 blk, stamp;
	int ret;

	if (hybd_io_changes_data(io)) {
		cache_ver_bump(io);
		hybd_cache_drop(&cache_slots, CACHE_SLOTS, io);
		return HYBD_BPF_PASS;
	}
	if (!hybd_io_one_block(io, &blk))
		return HYBD_BPF_PASS;

	stamp = hybd_ver_stamp(blk);
	io->scratch = stamp;
	ret = hybd_cache_copy_in(&cache_slots, CACHE_SLOTS, io, blk, 0, stamp);
	if (ret == HYBD_CACHE_HIT) {
		cache_count(hits);
		return HYBD_BPF_DONE;
	}
	if (ret == HYBD_CACHE_RACE)
		cache_count(races);
	cache_count(misses);
	return HYBD_BPF_PASS;
}

void BPF_STRUCT_OPS(cache_complete, struct hybd_bpf_io *io)
{
	__u64 blk;

	if (hybd_io_changes_data(io)) {
		cache_ver_bump(io);
		return;
	}
	if (!io->own || io->result || !hybd_io_one_block(io, &blk))
		return;
	if (!cache_ver_unchanged(blk, io->scratch))
		return;
	if (hybd_cache_fill(&cache_slots, CACHE_SLOTS, io, blk, 0, io->scratch))
		cache_count(fills);
}

HYBD_OPS_DEFINE(cache_ops,
	.submit   = (void *)cache_submit,
	.complete = (void *)cache_complete,
	.name     = "cache");
