/* SPDX-License-Identifier: MIT */
/*
 * store.h - the content-addressed block store behind examples/dedup.
 *
 * A store is a file (or a block device) holding a device of nr_blocks
 * 4 KiB blocks, each either a hole (reads as zeros) or a reference to a
 * chunk: one distinct 4 KiB content, stored once, found again by its
 * SHA-256.  The engine is thread-safe and knows nothing of hybd: the
 * server (dedup.c) calls it from its handler threads, and the host's unit
 * tests call it directly.  The on-disk format and the crash-consistency
 * argument are in README.md.
 *
 * Every function that can fail returns a negative errno and leaves a
 * human-readable reason in dd_errmsg() (per thread).
 */
#ifndef DEDUP_STORE_H
#define DEDUP_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define DD_BLOCK_SHIFT	12
#define DD_BLOCK_SIZE	(1U << DD_BLOCK_SHIFT)
#define DD_HASH_SIZE	32			/* SHA-256 */
#define DD_VERSION	1			/* the on-disk format's */

struct dd_store;

/*
 * Called with the block's lock held whenever a block's map entry changes,
 * in the order the map changes, with the byte offsets in the store of the
 * chunk it pointed to and points to now (0: a hole): the server mirrors
 * it into the fast path's maps (dedup_zero, dedup_chunk).
 */
typedef void (*dd_map_cb)(void *arg, uint64_t blk, uint64_t old_off,
			  uint64_t new_off);

/*
 * Called by a commit, without any lock of the store's held, right before
 * the chunks freed before it become reusable: the server waits there
 * until no remap the fast path made to them can still be reading them
 * (hybd_dev_remap_barrier()).  A nonzero return keeps them waiting for
 * the next commit.
 */
typedef int (*dd_reuse_cb)(void *arg);

/* dd_open() flags */
#define DD_O_RDONLY	(1U << 0)	/* check, status: change nothing */
#define DD_O_NOLOCK	(1U << 1)	/* do not take the store's lock */

/* dd_format() flags */
#define DD_F_FORCE	(1U << 0)	/* overwrite what looks like a store */

/*
 * dd_format - write an empty store for a device of @size bytes (a multiple
 * of 4 KiB; 0 on a block device: as large as fits).  The metadata regions
 * are allocated now, so that a commit never runs out of space.
 */
int dd_format(const char *path, uint64_t size, unsigned int flags);

/*
 * dd_open - open a store, check its superblock and load its metadata
 * (the block map, the chunk table of the chunks in use).  Takes an
 * exclusive lock on it unless DD_O_NOLOCK (a second server is refused).
 * With DD_O_RDONLY a corrupt map is reported by dd_check() instead of
 * refused here.
 */
int dd_open(const char *path, unsigned int flags, struct dd_store **out);

/* Flushes nothing: call dd_commit() first to keep what was written. */
void dd_close(struct dd_store *s);

/* RETURN VALUE: the device's size in blocks. */
uint64_t dd_nr_blocks(const struct dd_store *s);

/* Report map changes to @cb (NULL: stop); see dd_map_cb. */
void dd_set_map_cb(struct dd_store *s, dd_map_cb cb, void *arg);

/* Ask @cb before freed chunks are reused (NULL: stop); see dd_reuse_cb. */
void dd_set_reuse_cb(struct dd_store *s, dd_reuse_cb cb, void *arg);

/* RETURN VALUE: true if block @blk reads as zeros (a hole) now. */
bool dd_is_hole(struct dd_store *s, uint64_t blk);

/*
 * RETURN VALUE: the byte offset in the store of block @blk's chunk, 0 for
 * a hole.  The chunk may move once the block's lock is dropped: the
 * answer is for seeding the fast path's map before any I/O runs.
 */
uint64_t dd_block_offset(struct dd_store *s, uint64_t blk);

/* RETURN VALUE: the store's open file descriptor (owned by the store). */
int dd_fd(const struct dd_store *s);

/*
 * Block I/O, from any thread.  A write of zeros makes a hole;
 * dd_write_hole() makes holes of a range (discard, write-zeroes).  None
 * of them is durable before the next dd_commit().
 *
 * dd_write_extent() writes @count blocks from @blk, one request's: the
 * blocks whose content is new get consecutive chunks, in the order of the
 * blocks, whenever the free chunks allow (always on a store that has not
 * had chunks freed), whatever other writers do meanwhile, so that a read
 * of the same blocks is one extent of the store (the fast path remaps
 * only such reads).  dd_write() is a write of one block.
 */
int dd_read(struct dd_store *s, uint64_t blk, void *buf);
int dd_write(struct dd_store *s, uint64_t blk, const void *buf);
int dd_write_extent(struct dd_store *s, uint64_t blk, uint64_t count,
		    const void *buf);
int dd_write_hole(struct dd_store *s, uint64_t blk, uint64_t count);

/*
 * dd_commit - make every write completed before the call durable (a
 * flush).  Concurrent writes go on meanwhile; they are in this commit or
 * the next.
 */
int dd_commit(struct dd_store *s);

/* What dd_stats() reports. */
struct dd_stats {
	uint64_t nr_blocks;		/* the device's blocks */
	uint64_t mapped_blocks;		/* blocks that are not holes */
	uint64_t chunks_used;		/* distinct contents stored */
	uint64_t chunks_free;		/* reusable slots in the data area */
	uint64_t chunks_pending;	/* freed, reusable after a commit */
	uint64_t chunks_capacity;	/* the most the store can hold */
	uint64_t file_bytes;		/* the store's size on disk */
	uint64_t commits;		/* since open */
	uint64_t dedup_hits;		/* writes that found their chunk */
	uint64_t zero_writes;		/* block writes that made a hole */
};

void dd_stats(struct dd_store *s, struct dd_stats *st);

/*
 * dd_check - verify a store opened with DD_O_RDONLY: every map entry is a
 * hole or a chunk of the data area, every chunk in use hashes to its
 * chunk-table entry, and no content is stored twice.  Writes one line per
 * problem (and a summary) to @out.
 * RETURN VALUE: the number of problems found (0: clean), or -errno when
 * the store cannot be read.
 */
long dd_check(struct dd_store *s, FILE *out);

/* The reason for the calling thread's last failure. */
const char *dd_errmsg(void);

#endif /* DEDUP_STORE_H */
