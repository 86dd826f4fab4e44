/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * hybd.bpf.h - everything a hybd fast-path program needs.
 *
 * A fast path is a struct hybd_bpf_ops with two callbacks (and a third,
 * optional, for devices with a bio-based front):
 *
 *   submit(io)    runs in the block driver's queue_rq for EVERY request
 *                 (read, write, flush, discard, write-zeroes).  Return
 *                 HYBD_BPF_DONE to complete it right here, -EIO & co. to
 *                 fail it, HYBD_BPF_PASS to hand it to the user-space
 *                 server, or, for a write whose payload is all zero,
 *                 HYBD_BPF_PASS_ZEROES to hand it over as a write-zeroes.
 *                 Or call hybd_bpf_io_remap() and return
 *                 HYBD_BPF_REMAPPED: the kernel serves the request on a
 *                 backing file or block device the server registered.
 *   complete(io)  runs when the server (or a remap) finished a request,
 *                 before the block layer sees it: io->result is its
 *                 status, io->path who served it and, if the status is 0,
 *                 a read's payload holds the data, so you can cache it.
 *   map(io)       (optional) on a device added with HYBD_DEV_F_BIO_FRONT,
 *                 runs on each read and write bio before it becomes a
 *                 request; may only remap (hybd_bpf_io_remap(), then
 *                 HYBD_BPF_REMAPPED) or pass (HYBD_BPF_PASS).  A remap
 *                 onto a block device is cloned there, without a request;
 *                 the rest reaches submit() as usual, so map() must not
 *                 count or remember what it passes.  io->tag is
 *                 HYBD_BPF_TAG_FRONT; the data kfuncs refuse such an io.
 *
 * DONE means the server never sees the request:
 *   - a read must be filled, all of it, before submit() returns DONE:
 *     hybd_bpf_io_zero(), or hybd_bpf_io_copy_in() from offset 0 up, in
 *     order (the kernel tracks the filled prefix).  A read completed
 *     without that fails with EIO and counts in bpf_unfilled: the reader
 *     never gets whatever the pages held before.
 *   - a write, flush, discard or write-zeroes completed with DONE is never
 *     stored, flushed or discarded by the server: the program has taken
 *     that on itself.
 * PASS_ZEROES is for writes only (any other request fails with EIO and
 * counts in bpf_bad_ret): check hybd_bpf_io_is_zero() first, the kernel
 * does not.  The server gets a write-zeroes of the same range and flags
 * (FUA included) and none of the payload; on a device without
 * write-zeroes, or past its max_write_zeroes_bytes, the write goes as it
 * is (as PASS).  complete() still sees io->op == HYBD_OP_WRITE.
 * A read's payload is readable (copy_out, is_zero) only in complete() with
 * io->result 0; in submit() it is not the device's data yet, and after a
 * failure it is nobody's: both return -EINVAL there.
 *
 * Attaching needs CAP_SYS_ADMIN, and the kfuncs are for struct
 * hybd_bpf_ops programs only.  A loaded object attaches once: after it
 * was detached or replaced, or its device deleted, its maps have missed
 * writes, and the kernel refuses it (-ESTALE); load it again.  (A loader
 * that hands an old object's maps to a program attached later, not by an
 * atomic replace, must empty them itself: writes went by unseen.)
 *
 * A program reads like a list of callbacks:
 *
 *	int BPF_STRUCT_OPS(mine_submit, struct hybd_bpf_io *io)
 *	{
 *		return HYBD_BPF_PASS;
 *	}
 *
 *	HYBD_OPS_DEFINE(mine_ops,
 *		.submit = (void *)mine_submit,
 *		.name   = "mine");
 *
 * and is attached with `hybdctl attach mine.bpf.o /dev/hybd0`; the loader
 * sets .dev_id.
 *
 * Consistency: a program that caches read data must never serve data that
 * an overlapping write has replaced.  The versions of hybd_versions.bpf.h
 * make the correct pattern short: bump on every write's submit AND
 * complete, stamp a read at submit (io->scratch), and keep the read's data
 * only if the block's version still equals the stamp at complete.  See
 * cache.bpf.c.
 */
#ifndef __HYBD_BPF_H
#define __HYBD_BPF_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/errno.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "uapi/hybd.h"

/* ---- kfuncs: moving data between a request and BPF memory ---- */

/* Fill a read with zeros, all of it.  0, or -EINVAL if not a read. */
extern int hybd_bpf_io_zero(struct hybd_bpf_io *io) __ksym;
/* Copy src__sz bytes of BPF memory into a read's payload at off; extends
 * the filled prefix if off is within it. */
extern int hybd_bpf_io_copy_in(struct hybd_bpf_io *io, __u32 off,
			       const void *src, __u32 src__sz) __ksym;
/* Copy dst__sz bytes of the payload at off out (write: submit/complete;
 * read: complete with io->result 0, else -EINVAL). */
extern int hybd_bpf_io_copy_out(struct hybd_bpf_io *io, __u32 off,
				void *dst, __u32 dst__sz) __ksym;
/* 1 if the payload is all zero, 0 if not, -EINVAL without a readable
 * payload (as copy_out). */
extern int hybd_bpf_io_is_zero(struct hybd_bpf_io *io) __ksym;

/* ---- kfunc: serving a request on a backing target (HYBD_F_REMAP) ---- */

/*
 * In submit() or map() only: have the kernel serve the whole request on backing
 * target @index (registered by the server, hybd_dev_add_backing()) at
 * byte @offset, with direct I/O on the request's own pages; then return
 * HYBD_BPF_REMAPPED.  complete() runs when it is done, with io->path ==
 * HYBD_BPF_PATH_REMAP.  A flush fdatasyncs the target (offset ignored).
 *
 * 0, or it refuses (counted in remap_refused) and the request is still
 * yours to pass, serve or fail: -ENOENT no target at @index, -ERANGE the
 * range passes the target's end, -EINVAL @offset not aligned for the
 * target's direct I/O (or @index >= HYBD_MAX_BACKINGS), -EROFS a write,
 * discard or write-zeroes on a read-only target, -EALREADY remapped
 * already, -EPERM outside submit() and map().
 *
 * A target reads what is there when the kernel gets to it: a program
 * that remaps through a map the server updates relies on the server
 * updating the map before it moves the data, and calling
 * hybd_dev_remap_barrier() before it reuses the old place.
 */
extern int hybd_bpf_io_remap(struct hybd_bpf_io *io, __u32 index,
			     __u64 offset) __ksym;

/* ---- ordered atomics ---- */

/*
 * *p += v, returning the old value, as a fetching atomic instruction
 * (BPF_FETCH), which every JIT emits fully ordered (arm64: LDADDAL).  Use
 * it wherever the add publishes stores made before it.  A plain
 * __sync_fetch_and_add() whose result is unused compiles to a
 * non-fetching add, which orders nothing on arm64 (STADD): the empty asm
 * makes the result used.
 */
static __always_inline __u64 hybd_atomic_fetch_add(__u64 *p, __u64 v)
{
	__u64 old = __sync_fetch_and_add(p, v);

	asm volatile("" : : "r"(old) : "memory");
	return old;
}

/* ---- defining the ops ---- */

#define BPF_STRUCT_OPS(name, args...) \
	SEC("struct_ops/" #name) BPF_PROG(name, ##args)

/* One struct_ops map, attached through a link (atomic replace works). */
#define HYBD_OPS_DEFINE(ops_name, ...) \
	SEC(".struct_ops.link") struct hybd_bpf_ops ops_name = { __VA_ARGS__ }

/* ---- requests in blocks ---- */

#define HYBD_BLOCK_SHIFT	12			/* 4 KiB */
#define HYBD_BLOCK_SIZE		(1U << HYBD_BLOCK_SHIFT)
#define HYBD_SECTORS_PER_BLOCK	(HYBD_BLOCK_SIZE >> 9)

static __always_inline bool hybd_io_changes_data(const struct hybd_bpf_io *io)
{
	return io->op == HYBD_OP_WRITE || io->op == HYBD_OP_DISCARD ||
	       io->op == HYBD_OP_WRITE_ZEROES;
}

/* First block and number of blocks a request touches (partial included). */
static __always_inline void hybd_io_blocks(const struct hybd_bpf_io *io,
					   __u64 *first, __u64 *count)
{
	__u64 start = io->sector << 9, end = start + io->bytes;

	*first = start >> HYBD_BLOCK_SHIFT;
	*count = io->bytes ?
		 ((end + HYBD_BLOCK_SIZE - 1) >> HYBD_BLOCK_SHIFT) - *first : 0;
}

/* A read of exactly one aligned block: the unit a cache serves. */
static __always_inline bool hybd_io_one_block(const struct hybd_bpf_io *io,
					      __u64 *blk)
{
	if (io->op != HYBD_OP_READ || io->bytes != HYBD_BLOCK_SIZE ||
	    io->sector % HYBD_SECTORS_PER_BLOCK)
		return false;
	*blk = io->sector / HYBD_SECTORS_PER_BLOCK;
	return true;
}

/*
 * A read of 1..@max whole aligned blocks: the unit a block cache or a
 * block map serves.  Sets *@first and *@count.
 */
static __always_inline bool hybd_io_read_blocks(const struct hybd_bpf_io *io,
						__u64 max, __u64 *first,
						__u64 *count)
{
	if (io->op != HYBD_OP_READ || !io->bytes ||
	    io->bytes % HYBD_BLOCK_SIZE || io->sector % HYBD_SECTORS_PER_BLOCK)
		return false;
	hybd_io_blocks(io, first, count);
	return *count <= max;
}

/* ---- sized at load from the device ---- */

/*
 * The device's size in 4 KiB blocks (rounded up), set by libhybd's loader
 * before the program is loaded (0 if another loader loaded it).
 */
const volatile __u64 hybd_dev_blocks;

/*
 * A map declared HYBD_PER_BLOCK (an ARRAY) gets one entry per 4 KiB block
 * of the device, at most the max_entries it declares (its cap), when
 * libhybd loads it:
 *
 *	struct {
 *		__uint(type, BPF_MAP_TYPE_ARRAY);
 *		__uint(max_entries, 1 << 22);	// cap: 16 GiB of blocks
 *		__type(key, __u32);
 *		__type(value, __u64);
 *	} my_blocks SEC(".maps") HYBD_PER_BLOCK;
 *
 * A lookup past its end returns NULL: treat that as "unknown".
 */
#define HYBD_PER_BLOCK	__attribute__((btf_decl_tag("hybd:per_block")))

/*
 * A map declared HYBD_BLOCK_BITMAP (an ARRAY of __u64) gets one bit per
 * 4 KiB block of the device, block b being bit b % 64 of entry b / 64, at
 * most the max_entries it declares, when libhybd (>= 1.5) loads it.
 * Declared BPF_F_MMAPABLE, the slow path maps it (hybd_bpf_map_mmap()) and
 * flips bits with atomic operations while the program reads them:
 *
 *	struct {
 *		__uint(type, BPF_MAP_TYPE_ARRAY);
 *		__uint(map_flags, BPF_F_MMAPABLE);
 *		__uint(max_entries, 1 << 22);	// cap: 1 TiB of blocks
 *		__type(key, __u32);
 *		__type(value, __u64);
 *	} my_bits SEC(".maps") HYBD_BLOCK_BITMAP;
 */
#define HYBD_BLOCK_BITMAP __attribute__((btf_decl_tag("hybd:block_bitmap")))

/* Block @blk's bit in the HYBD_BLOCK_BITMAP @map: 0, 1, or -1 past its end. */
static __always_inline int hybd_bitmap_test(void *map, __u64 blk)
{
	__u32 key = blk / 64;
	__u64 *w;

	if (blk / 64 > 0xffffffffULL)
		return -1;
	w = bpf_map_lookup_elem(map, &key);
	if (!w)
		return -1;
	return (*(volatile __u64 *)w >> (blk % 64)) & 1;
}

#endif /* __HYBD_BPF_H */
