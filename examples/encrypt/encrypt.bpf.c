// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * encrypt: the fast path of examples/encrypt, an AES-XTS block device
 * byte-compatible with dm-crypt whose slow path (encrypt.c) encrypts and
 * decrypts in user space.
 *
 * Built twice from this file:
 *
 *   encrypt.bpf.o        reads of never-written blocks complete here, as
 *                        zeros: every 4 KiB block they touch is a hole
 *                        in encrypt_holes, the bitmap the slow path keeps
 *                        exact (it maps it and flips bits atomically).
 *   encrypt-cache.bpf.o  (-DENCRYPT_CACHE, `encrypt --cache`) that, plus
 *                        a cache of plaintext blocks the slow path read,
 *                        for aligned reads of up to 32 blocks that it and
 *                        the holes cover entirely.  Plaintext in kernel
 *                        memory, readable by root through the map: off by
 *                        default (README.md).
 *
 * Writes and discards always go to the slow path: the data must be
 * encrypted, and only the slow path changes the holes.  The cache build
 * bumps the blocks' versions for them (submit and complete) and drops
 * their copies, so a read the slow path served before a write is never
 * filled in after it (hybd_versions.bpf.h).
 */
#ifdef ENCRYPT_CACHE
#include "hybd_cache.bpf.h"
#else
#include "hybd.bpf.h"
#endif

char LICENSE[] SEC("license") = "GPL";

#define ENCRYPT_MAX_BLOCKS	32	/* 128 KiB: the largest read cached */

#ifndef ENCRYPT_CACHE_SLOTS
#define ENCRYPT_CACHE_SLOTS	8192	/* 32 MiB of plaintext */
#endif

/*
 * Holes: bit b (word b / 64, bit b % 64) set when 4 KiB block b reads as
 * zeros because nothing was ever written there (a hole of the sparse
 * backing file: never written, or discarded with --allow-discards).  Set
 * and cleared by the slow path only, through a mapping of the map (an
 * interface with encrypt.c: keep the name and shape).  A clear bit, or a
 * block past the end, means "ask the slow path".
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1U << 22);		/* 1 TiB of blocks */
	__type(key, __u32);
	__type(value, __u64);
} encrypt_holes SEC(".maps") HYBD_BLOCK_BITMAP;

/*
 * Counters (globals, in "encrypt.bss": `hybdctl stats DEV --maps`).  Every
 * read counts in reads and in one of hole_hits, cache_hits, read_misses.
 */
__u64 reads;		/* reads seen by submit() */
__u64 hole_hits;	/* reads served entirely as zeros */
__u64 cache_hits;	/* reads served with at least one cached block */
__u64 read_misses;	/* reads passed to the slow path */
__u64 fills;		/* blocks the slow path's reads filled in */
__u64 races;		/* hits given up because a fill took the slot */

#define encrypt_count(counter)	hybd_atomic_fetch_add(&(counter), 1)

static __always_inline bool encrypt_hole(__u64 blk)
{
	return hybd_bitmap_test(&encrypt_holes, blk) == 1;
}

#ifdef ENCRYPT_CACHE
HYBD_CACHE_DEFINE(encrypt_cache, ENCRYPT_CACHE_SLOTS);

/* A block of zeros for the holes of a read that also has cached blocks. */
struct encrypt_zblock {
	__u8 data[HYBD_BLOCK_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct encrypt_zblock);
} encrypt_zblock SEC(".maps");

/* Every block from the holes or the cache, in order, or none. */
static __always_inline int encrypt_read_cached(struct hybd_bpf_io *io)
{
	struct encrypt_zblock *zeros;
	__u64 first, count, i;
	__u32 key = 0;
	int ret;

	if (!hybd_io_read_blocks(io, ENCRYPT_MAX_BLOCKS, &first, &count)) {
		io->scratch = 0;	/* never filled */
		return HYBD_BPF_PASS;
	}
	zeros = bpf_map_lookup_elem(&encrypt_zblock, &key);
	if (!zeros)
		goto pass;
	for (i = 0; i < ENCRYPT_MAX_BLOCKS && i < count; i++) {
		if (encrypt_hole(first + i)) {
			ret = hybd_bpf_io_copy_in(io, i * HYBD_BLOCK_SIZE,
						  zeros->data,
						  sizeof(zeros->data));
		} else {
			ret = hybd_cache_copy_in(&encrypt_cache,
						 ENCRYPT_CACHE_SLOTS, io,
						 first + i,
						 i * HYBD_BLOCK_SIZE,
						 hybd_ver_stamp(first + i));
			if (ret == HYBD_CACHE_RACE)
				encrypt_count(races);
		}
		if (ret)
			goto pass;
	}
	encrypt_count(cache_hits);
	return HYBD_BPF_DONE;
pass:
	/* before the slow path can read anything */
	io->scratch = hybd_ver_stamp_blocks(first, count);
	return HYBD_BPF_PASS;
}
#endif /* ENCRYPT_CACHE */

static __always_inline int encrypt_read(struct hybd_bpf_io *io)
{
	__u64 first, count, i;

	encrypt_count(reads);
	hybd_io_blocks(io, &first, &count);
	/* a read of holes only: up to 1 MiB, the largest request split */
	for (i = 0; i < 256 && i < count; i++)
		if (!encrypt_hole(first + i))
			break;
	if (count && i == count && !hybd_bpf_io_zero(io)) {
		encrypt_count(hole_hits);
		return HYBD_BPF_DONE;
	}
#ifdef ENCRYPT_CACHE
	if (encrypt_read_cached(io) == HYBD_BPF_DONE)
		return HYBD_BPF_DONE;
#endif
	encrypt_count(read_misses);
	return HYBD_BPF_PASS;
}

int BPF_STRUCT_OPS(encrypt_submit, struct hybd_bpf_io *io)
{
	if (io->op == HYBD_OP_READ)
		return encrypt_read(io);
#ifdef ENCRYPT_CACHE
	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		hybd_cache_drop(&encrypt_cache, ENCRYPT_CACHE_SLOTS, io);
	}
#endif
	return HYBD_BPF_PASS;
}

#ifdef ENCRYPT_CACHE
void BPF_STRUCT_OPS(encrypt_complete, struct hybd_bpf_io *io)
{
	__u64 first, count;

	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		return;
	}
	if (!io->own || io->result || !io->scratch ||
	    !hybd_io_read_blocks(io, ENCRYPT_MAX_BLOCKS, &first, &count))
		return;
	/* holes are served from encrypt_holes: no slot for them */
	hybd_cache_fill_blocks(&encrypt_cache, ENCRYPT_CACHE_SLOTS, io, first,
			       count, &encrypt_holes, &fills);
}

HYBD_OPS_DEFINE(encrypt_ops,
	.submit   = (void *)encrypt_submit,
	.complete = (void *)encrypt_complete,
	.name     = "encrypt_cache");
#else
HYBD_OPS_DEFINE(encrypt_ops,
	.submit   = (void *)encrypt_submit,
	.name     = "encrypt");
#endif
