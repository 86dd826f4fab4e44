/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * hybd_cache.bpf.h - a direct-mapped cache of 4 KiB blocks for fast paths
 * that keep copies of what the slow path read (include it instead of
 * hybd_versions.bpf.h, which it includes).
 *
 * A slot holds one block, the version stamp its data is valid for
 * (hybd_versions.bpf.h), and a sequence count: odd while a fill writes
 * the slot.  A hit copies the data into the read, then checks that the
 * count did not move; if it did, the copy may be torn and the read must
 * go to the slow path (which overwrites whatever was copied).  A slot is
 * served only while its stamp is the block's current one, so a fill that
 * raced with a write is never served after that write.
 *
 *	HYBD_CACHE_DEFINE(my_cache, 8192);	// 32 MiB of blocks
 *
 *	submit(), a read:	hybd_cache_copy_in(&my_cache, 8192, io, blk,
 *						   off, hybd_ver_stamp(blk))
 *	complete(), a read the versions allow (see hybd_versions.bpf.h):
 *				hybd_cache_fill(&my_cache, 8192, io, blk, off,
 *						stamp)
 *	submit(), a write:	hybd_cache_drop(&my_cache, 8192, io)
 *				(optional: frees the slots early; the
 *				versions alone keep them from being served)
 *
 * Reads of several blocks take one stamp for all of them
 * (hybd_ver_stamp_blocks()) and fill with hybd_cache_fill_blocks().
 *
 * bpf/cache.bpf.c and examples/encrypt's program serve reads of up to 32
 * blocks from it with these two; examples/dedup's program stamps and
 * fills block by block.
 */
#ifndef __HYBD_CACHE_BPF_H
#define __HYBD_CACHE_BPF_H

#include "hybd_versions.bpf.h"

struct hybd_cache_slot {
	__u64 seq;	/* odd while a fill writes the slot */
	__u64 blk;	/* block + 1; 0 = empty */
	__u64 stamp;	/* the version stamp the data is valid for */
	__u8 data[HYBD_BLOCK_SIZE];
};

/* An array map of @slots cache slots named @name. */
#define HYBD_CACHE_DEFINE(name, slots)				\
	struct {							\
		__uint(type, BPF_MAP_TYPE_ARRAY);			\
		__uint(max_entries, (slots));				\
		__type(key, __u32);					\
		__type(value, struct hybd_cache_slot);			\
	} name SEC(".maps")

/* what hybd_cache_copy_in() returns */
#define HYBD_CACHE_HIT		0
#define HYBD_CACHE_MISS		1	/* not cached, or not for this stamp */
#define HYBD_CACHE_RACE		2	/* a fill took the slot meanwhile */

static __always_inline struct hybd_cache_slot *
hybd_cache_slot_of(void *cache, __u32 slots, __u64 blk)
{
	__u32 key = blk % slots;

	return bpf_map_lookup_elem(cache, &key);
}

/*
 * Copy block @blk into the read @io at byte @off if the cache holds it for
 * @stamp (hybd_ver_stamp(blk) now; 0 never hits).
 */
static __always_inline int hybd_cache_copy_in(void *cache, __u32 slots,
					      struct hybd_bpf_io *io, __u64 blk,
					      __u32 off, __u64 stamp)
{
	struct hybd_cache_slot *s = hybd_cache_slot_of(cache, slots, blk);
	__u64 seq;

	if (!s || !stamp)
		return HYBD_CACHE_MISS;
	seq = __sync_fetch_and_add(&s->seq, 0);
	if (seq & 1 || s->blk != blk + 1 || s->stamp != stamp)
		return HYBD_CACHE_MISS;
	if (hybd_bpf_io_copy_in(io, off, s->data, sizeof(s->data)))
		return HYBD_CACHE_MISS;
	if (__sync_fetch_and_add(&s->seq, 0) != seq)
		return HYBD_CACHE_RACE;
	return HYBD_CACHE_HIT;
}

/*
 * Fill @blk's slot with the block at byte @off of the read @io, valid for
 * @stamp: the stamp the read was given in submit() when the versions say
 * it still holds (never a version read again later: a write that came
 * and went in between would have its old data stored under its new
 * version).  A slot another fill holds is left alone.
 * RETURN VALUE: true if the slot was filled.
 */
static __always_inline bool hybd_cache_fill(void *cache, __u32 slots,
					    struct hybd_bpf_io *io, __u64 blk,
					    __u32 off, __u64 stamp)
{
	struct hybd_cache_slot *s = hybd_cache_slot_of(cache, slots, blk);
	bool filled = false;
	__u64 seq;

	if (!s)
		return false;
	/* take the slot: even -> odd, or leave it to whoever has it */
	seq = s->seq;
	if (seq & 1 || __sync_val_compare_and_swap(&s->seq, seq, seq + 1) != seq)
		return false;
	s->blk = 0;
	if (!hybd_bpf_io_copy_out(io, off, s->data, sizeof(s->data))) {
		s->stamp = stamp;
		s->blk = blk + 1;
		filled = true;
	}
	/* release: odd -> even, ordered after the fill's stores */
	hybd_atomic_fetch_add(&s->seq, 1);
	return filled;
}

/*
 * complete() of a read of blocks @first .. @first + @count - 1 (at most
 * HYBD_VER_MAX_BLOCKS, the read's byte 0 being @first's) whose submit()
 * set io->scratch = hybd_ver_stamp_blocks(first, count): if no block's
 * version moved since, fill the block's slots, except those of blocks set
 * in @skip (a HYBD_BLOCK_BITMAP of blocks the program serves from
 * elsewhere, e.g. holes; NULL: none), and count each fill in *@fills (if
 * not NULL).
 *
 * The sum is recomputed keeping each block's stamp as read for it: if it
 * still equals io->scratch, every version read here is the one at
 * submit(), so these are the stamps the read's data is valid for.  They
 * are stored with the data, never a version read again later: a write
 * that bumped a block in between (both its submit and complete) would have
 * it stored with the data the write replaced, and served.
 *
 * (No count is returned: a value that depends on each block's outcome
 * would make the verifier walk every combination of them.)
 */
static __always_inline void hybd_cache_fill_blocks(void *cache, __u32 slots,
						   struct hybd_bpf_io *io,
						   __u64 first, __u64 count,
						   void *skip, __u64 *fills)
{
	__u64 stamps[HYBD_VER_MAX_BLOCKS];
	__u64 i, sum = 1, ver, *v;

	if (!io->scratch || count > HYBD_VER_MAX_BLOCKS)
		return;
	for (i = 0; i < HYBD_VER_MAX_BLOCKS && i < count; i++) {
		v = hybd_ver_slot(first + i);
		if (!v)
			return;
		ver = *(volatile __u64 *)v;
		stamps[i] = ver + 1;
		sum += ver;
	}
	if (sum != io->scratch)
		return;
	for (i = 0; i < HYBD_VER_MAX_BLOCKS && i < count; i++) {
		if (skip && hybd_bitmap_test(skip, first + i) == 1)
			continue;
		if (hybd_cache_fill(cache, slots, io, first + i,
				    i * HYBD_BLOCK_SIZE, stamps[i]) && fills)
			hybd_atomic_fetch_add(fills, 1);
	}
}

/* Empty the slots of a write's blocks (up to 256 of them). */
static __always_inline void hybd_cache_drop(void *cache, __u32 slots,
					    const struct hybd_bpf_io *io)
{
	struct hybd_cache_slot *s;
	__u64 first, count, i;

	hybd_io_blocks(io, &first, &count);
	for (i = 0; i < 256 && i < count; i++) {
		s = hybd_cache_slot_of(cache, slots, first + i);
		if (s && s->blk == first + i + 1)
			s->blk = 0;
	}
}

#endif /* __HYBD_CACHE_BPF_H */
