// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * cache: a read cache of 4 KiB blocks in a direct-mapped array.
 *
 * Fills come from the slow path's reads, in complete().  Writes, discards
 * and write-zeroes bump the blocks' versions in submit() and complete();
 * a read is stamped with its blocks' versions in submit()
 * (hybd_ver_stamp_blocks()), and its data is kept only if no version
 * moved when it completes.  An entry is served only while its version is
 * the block's current one, so a fill that raced with a write is never
 * served after that write.  A read of up to CACHE_MAX_BLOCKS aligned
 * blocks is served when the cache holds every one of them.
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
/* (without bumps every version stays 0: every stamp holds) */
#ifdef CACHE_NO_VERSION_STAMPS
#define cache_ver_bump(io)		do { } while (0)
#else
#define cache_ver_bump(io)		hybd_ver_bump(io)
#endif

/* 128 KiB: the largest read served (HYBD_VER_MAX_BLOCKS) */
#define CACHE_MAX_BLOCKS	HYBD_VER_MAX_BLOCKS

#ifndef CACHE_SLOTS
#define CACHE_SLOTS	8192		/* 32 MiB of data */
#endif

HYBD_CACHE_DEFINE(cache_slots, CACHE_SLOTS);

/*
 * Counters: global variables, which libbpf keeps in the object's .bss map
 * ("cache.bss"); `hybdctl stats DEV --maps` shows them by name.
 */
__u64 hits;	/* reads served from the cache, all their blocks */
__u64 misses;	/* cached-size reads passed to the slow path */
__u64 fills;	/* blocks the slow path's reads filled in */
__u64 races;	/* hits given up because a fill overwrote the slot */

/* a fetching add, as every atomic here (see hybd_atomic_fetch_add()) */
#define cache_count(counter)	hybd_atomic_fetch_add(&(counter), 1)

int BPF_STRUCT_OPS(cache_submit, struct hybd_bpf_io *io)
{
	__u64 first, count, i;
	int ret;

	if (hybd_io_changes_data(io)) {
		cache_ver_bump(io);
		hybd_cache_drop(&cache_slots, CACHE_SLOTS, io);
		return HYBD_BPF_PASS;
	}
	if (!hybd_io_read_blocks(io, CACHE_MAX_BLOCKS, &first, &count))
		return HYBD_BPF_PASS;

	/* before anything is read: complete() checks no version moved */
	io->scratch = hybd_ver_stamp_blocks(first, count);
	/* every block in order from offset 0, or the read passes */
	for (i = 0; i < CACHE_MAX_BLOCKS && i < count; i++) {
		ret = hybd_cache_copy_in(&cache_slots, CACHE_SLOTS, io,
					 first + i, i * HYBD_BLOCK_SIZE,
					 hybd_ver_stamp(first + i));
		if (ret == HYBD_CACHE_RACE)
			cache_count(races);
		if (ret != HYBD_CACHE_HIT)
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
	__u64 first, count;

	if (hybd_io_changes_data(io)) {
		cache_ver_bump(io);
		return;
	}
	if (!io->own || io->result || !io->scratch ||
	    !hybd_io_read_blocks(io, CACHE_MAX_BLOCKS, &first, &count))
		return;
	hybd_cache_fill_blocks(&cache_slots, CACHE_SLOTS, io, first, count,
			       NULL, &fills);
}

HYBD_OPS_DEFINE(cache_ops,
	.submit   = (void *)cache_submit,
	.complete = (void *)cache_complete,
	.name     = "cache");
