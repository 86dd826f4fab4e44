// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * nbd.bpf.c - hybd-nbd's fast path: reads of holes and repeated reads
 * served in the kernel, without a network round trip.
 *
 * Two sources, for reads of 1..32 aligned 4 KiB blocks:
 *
 *  - nbd_zero, a HYBD_BLOCK_BITMAP of the blocks known to read as zeros.
 *    hybd-nbd seeds it before the device takes requests, from the
 *    server's NBD_CMD_BLOCK_STATUS replies (base:allocation, the ZERO
 *    flag), and from then on only clears bits: for every write, trim and
 *    write-zeroes, before it is sent (so before it can complete).  This
 *    program only reads it.  A read whose blocks are all set is zeroed
 *    here.
 *  - a direct-mapped cache of blocks (hybd_cache.bpf.h) filled from the
 *    slow path's reads in complete(), with version stamps
 *    (hybd_versions.bpf.h): every request that changes data bumps its
 *    blocks' versions in submit() and complete(), a read is stamped in
 *    submit(), and its data is kept only if no version moved meanwhile;
 *    a slot is served only while its stamp is current.  A read served
 *    from the cache has every block in it.
 *
 * Everything else goes to hybd-nbd.  Counters (the .bss map, `hybdctl
 * stats DEV --maps`): reads = zero_hits + cache_hits + misses, fills.
 */
#include "hybd_cache.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define NBD_MAX_BLOCKS	HYBD_VER_MAX_BLOCKS	/* 128 KiB reads */

#ifndef NBD_CACHE_SLOTS
#define NBD_CACHE_SLOTS	8192			/* 32 MiB of blocks */
#endif

/* 1: the block reads as zeros at the server; 0: anything else */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1 << 22);		/* cap: 1 TiB of blocks */
	__type(key, __u32);
	__type(value, __u64);
} nbd_zero SEC(".maps") HYBD_BLOCK_BITMAP;

HYBD_CACHE_DEFINE(nbd_cache, NBD_CACHE_SLOTS);

__u64 reads;		/* reads of 1..32 aligned blocks: the ones below */
__u64 zero_hits;	/* reads served as zeros from nbd_zero */
__u64 cache_hits;	/* reads served from the cache */
__u64 misses;		/* reads of 1..32 blocks passed to hybd-nbd */
__u64 fills;		/* blocks the slow path's reads put in the cache */

#define nbd_count(counter)	hybd_atomic_fetch_add(&(counter), 1)

static __always_inline bool all_zero(__u64 first, __u64 count)
{
	__u64 i;

	for (i = 0; i < NBD_MAX_BLOCKS && i < count; i++)
		if (hybd_bitmap_test(&nbd_zero, first + i) != 1)
			return false;
	return true;
}

int BPF_STRUCT_OPS(nbd_submit, struct hybd_bpf_io *io)
{
	__u64 first, count, i;

	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		hybd_cache_drop(&nbd_cache, NBD_CACHE_SLOTS, io);
		return HYBD_BPF_PASS;
	}
	if (!hybd_io_read_blocks(io, NBD_MAX_BLOCKS, &first, &count))
		return HYBD_BPF_PASS;
	nbd_count(reads);
	if (all_zero(first, count) && !hybd_bpf_io_zero(io)) {
		nbd_count(zero_hits);
		return HYBD_BPF_DONE;
	}
	/* before anything is read: complete() checks no version moved */
	io->scratch = hybd_ver_stamp_blocks(first, count);
	for (i = 0; i < NBD_MAX_BLOCKS && i < count; i++)
		if (hybd_cache_copy_in(&nbd_cache, NBD_CACHE_SLOTS, io,
				       first + i, i * HYBD_BLOCK_SIZE,
				       hybd_ver_stamp(first + i)) !=
		    HYBD_CACHE_HIT)
			goto miss;
	nbd_count(cache_hits);
	return HYBD_BPF_DONE;
miss:
	nbd_count(misses);
	return HYBD_BPF_PASS;
}

void BPF_STRUCT_OPS(nbd_complete, struct hybd_bpf_io *io)
{
	__u64 first, count;

	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		return;
	}
	if (!io->own || io->result || !io->scratch ||
	    !hybd_io_read_blocks(io, NBD_MAX_BLOCKS, &first, &count))
		return;
	/* zero blocks are served from nbd_zero: no slot for them */
	hybd_cache_fill_blocks(&nbd_cache, NBD_CACHE_SLOTS, io, first, count,
			       &nbd_zero, &fills);
}

HYBD_OPS_DEFINE(nbd_ops,
	.submit   = (void *)nbd_submit,
	.complete = (void *)nbd_complete,
	.name     = "nbd");
