/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * hybd_versions.bpf.h - per-block versions for fast paths that cache what
 * the slow path returned (include it instead of hybd.bpf.h; a program
 * that does not include it does not pay for the map).
 *
 * The race they close: the slow path reads a block, a write on another
 * queue replaces it and completes, and only then does the read's
 * complete() run.  Its data must not be cached.  The pattern:
 *
 *	submit(), complete():  every request that changes data:
 *				hybd_ver_bump(io);
 *	submit(), a read:	io->scratch = hybd_ver_stamp(blk);
 *	complete(), a read:	if (io->own && !io->result &&
 *				    hybd_ver_unchanged(blk, io->scratch))
 *					fill, keeping io->scratch with it;
 *	submit(), a hit:	serve only if the entry's stamp equals
 *				hybd_ver_stamp(blk) now.
 *
 * hybd_versions has one slot per block of the device (HYBD_PER_BLOCK),
 * up to HYBD_VER_SLOTS_MAX; larger devices share slots (see
 * hybd_ver_slot()).  Its name is the same in every program, so an atomic
 * replace (hybdctl attach --replace) hands it to the new program.
 */
#ifndef __HYBD_VERSIONS_BPF_H
#define __HYBD_VERSIONS_BPF_H

#include "hybd.bpf.h"

#ifndef HYBD_VER_SLOTS_MAX
#define HYBD_VER_SLOTS_MAX	(1U << 20)	/* 8 MiB of versions */
#endif

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HYBD_VER_SLOTS_MAX);
	__type(key, __u32);
	__type(value, __u64);
} hybd_versions SEC(".maps") HYBD_PER_BLOCK;

/* Version slots in use: one per block, striped beyond HYBD_VER_SLOTS_MAX. */
static __always_inline __u64 hybd_ver_slots(void)
{
	__u64 n = hybd_dev_blocks;

	return n && n < HYBD_VER_SLOTS_MAX ? n : HYBD_VER_SLOTS_MAX;
}

/*
 * A block's version slot.  Blocks share a slot when the device has more
 * than HYBD_VER_SLOTS_MAX of them: a write then also changes the version
 * of the blocks it shares with, which only costs those a cache fill,
 * never serves anything stale.
 */
static __always_inline __u64 *hybd_ver_slot(__u64 blk)
{
	__u32 key = blk % hybd_ver_slots();

	return bpf_map_lookup_elem(&hybd_versions, &key);
}

struct hybd_ver_range {
	__u64 first;
};

static long hybd_ver_bump_one(__u64 i, void *ctx)
{
	struct hybd_ver_range *r = ctx;
	__u64 *v = hybd_ver_slot(r->first + i);

	if (v)
		hybd_atomic_fetch_add(v, 1);
	return 0;
}

/*
 * Call from BOTH submit() and complete() for every request that changes
 * data.  Two bumps bracket the write: a read stamped before or during it
 * sees a different version when it completes and is not cached.
 */
static __always_inline void hybd_ver_bump(const struct hybd_bpf_io *io)
{
	struct hybd_ver_range r;
	__u64 count;

	hybd_io_blocks(io, &r.first, &count);
	/* past every slot once, each shared slot is bumped already */
	if (count > hybd_ver_slots())
		count = hybd_ver_slots();
	bpf_loop(count, hybd_ver_bump_one, &r, 0);
}

/* A stamp for io->scratch: the block's version + 1 (0 means "no stamp"). */
static __always_inline __u64 hybd_ver_stamp(__u64 blk)
{
	__u64 *v = hybd_ver_slot(blk);

	return v ? *v + 1 : 0;
}

/* True if nothing changed the block since @stamp was taken. */
static __always_inline bool hybd_ver_unchanged(__u64 blk, __u64 stamp)
{
	return stamp && hybd_ver_stamp(blk) == stamp;
}

/*
 * Reads of several blocks: one io->scratch, so one stamp for all of them,
 *
 *	1 + the sum of the blocks' versions
 *
 * (0 if a version slot is missing: no stamp, no fill).  Versions only ever
 * grow (every change is hybd_ver_bump()'s +1, and a u64 does not wrap), so
 * each block's version at complete() is at least the one at submit(), and
 * the sum is unchanged iff every block's is.  This holds when blocks share
 * a slot too: a shared slot is counted once per block, each time no
 * smaller.  hybd_cache_fill_blocks() (hybd_cache.bpf.h) is its complete()
 * side.  Up to HYBD_VER_MAX_BLOCKS blocks.
 */
#define HYBD_VER_MAX_BLOCKS	32

static __always_inline __u64 hybd_ver_stamp_blocks(__u64 first, __u64 count)
{
	__u64 sum = 1, i, *v;

	if (count > HYBD_VER_MAX_BLOCKS)
		return 0;
	for (i = 0; i < HYBD_VER_MAX_BLOCKS && i < count; i++) {
		v = hybd_ver_slot(first + i);
		if (!v)
			return 0;
		sum += *v;
	}
	return sum;
}

#endif /* __HYBD_VERSIONS_BPF_H */
