// SPDX-License-Identifier: MIT
/*
 * store.c - the content-addressed block store behind examples/dedup.
 *
 * On disk (README.md has the full description and the crash argument):
 *
 *	block 0		superblock
 *	map		one little-endian u32 per device block: 0 = a hole,
 *			else the id of the chunk holding its content
 *	chunk table	one SHA-256 per chunk id (id 1 first)
 *	data		chunk id c at data_off + (c - 1) * 4096
 *
 * In memory the map is authoritative; reference counts and the hash index
 * are derived from it when the store is opened and kept up to date since.
 * Durability rests on three rules:
 *
 *  1. a chunk's data and its chunk-table entry are written before any map
 *     entry points to it, and made durable (fdatasync) before the map
 *     page that does is written;
 *  2. map pages are written to disk only by a commit (a flush), from a
 *     snapshot taken while no map change is half done;
 *  3. a chunk whose last reference went away is reused only after the
 *     commit that wrote the map without that reference.
 *
 * So whatever subset of a commit's map pages reached the disk before a
 * crash, every block maps to the content it had at that commit or at the
 * one before it (never to garbage), and after a completed commit every
 * write completed before it reads back.
 *
 * Concurrency: a block's map entry changes under one of NR_STRIPES
 * rwlocks (readers hold it across their pread, so the chunk they read
 * cannot be freed and reused under them); the index is split into buckets
 * with NR_BUCKET_LOCKS mutexes; chunk allocation takes one mutex to take
 * a write's run of consecutive chunks or to give chunks back.  Hashing,
 * compression of zeros and the data I/O run outside every lock, so
 * handler threads of all queues work in parallel.
 * A commit holds off map changes only while it copies the dirty map pages
 * (memcpy), never across its I/O.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "store.h"

#define DD_MAGIC		"HYBDDDUP"
#define DD_HASH_SHA256		1
#define MAP_PER_PAGE		(DD_BLOCK_SIZE / sizeof(uint32_t))
#define NR_STRIPES		4096
#define NR_BUCKET_LOCKS		256
/* chunks in flight per handler thread are few: this covers them all */
#define CHUNK_SLACK		1024
/*
 * Freed chunks are reused after a commit: a writer that finds no free
 * chunk commits when at least this many wait, or when the data area is
 * full, rather than growing the store file.
 */
#define RECLAIM_MIN		1024
/* how far below its top the free stack is searched for a run */
#define RUN_SCAN		4096
#define IO_PIECE		(1U << 20)

/* The superblock, little-endian, at offset 0. */
struct dd_super {
	char magic[8];
	uint32_t version;
	uint32_t block_size;
	uint64_t nr_blocks;
	uint64_t nr_chunks;
	uint64_t map_off;
	uint64_t table_off;
	uint64_t data_off;
	uint8_t uuid[16];
	uint64_t created;	/* seconds since the epoch */
	uint32_t hash_alg;	/* DD_HASH_SHA256 */
	uint32_t crc;		/* crc32 (zlib) of every byte before it */
};

struct dd_store {
	int fd;
	unsigned int flags;
	uint64_t nr_blocks, nr_chunks;
	uint64_t map_off, table_off, data_off;

	uint32_t *map;			/* [nr_blocks]: chunk id, 0 = hole */
	_Atomic uint64_t *dirty;	/* bitmap of map pages */
	uint64_t nr_pages;
	pthread_rwlock_t stripe[NR_STRIPES];
	/* map changes hold it shared, the commit's snapshot exclusive */
	pthread_rwlock_t commit_lock;
	pthread_mutex_t commit_mutex;	/* one commit at a time */

	/* chunks, by id (1..nr_chunks); ref and the chains under buckets */
	uint32_t *ref;
	uint8_t (*hash)[DD_HASH_SIZE];
	uint32_t *next;
	uint32_t *bucket;
	uint64_t bucket_mask;
	pthread_mutex_t bucket_lock[NR_BUCKET_LOCKS];

	/* allocation, under alloc_lock */
	pthread_mutex_t alloc_lock;
	uint32_t *free_stack;
	uint64_t nr_free;
	uint32_t *pending[2];		/* freed, waiting for a commit */
	uint64_t nr_pending[2];
	unsigned int cur;		/* the pending list filling now */
	uint64_t next_new;		/* first id never used in the file */

	EVP_MD *md;
	dd_map_cb map_cb;
	void *map_arg;
	dd_reuse_cb reuse_cb;		/* under commit_mutex */
	void *reuse_arg;

	_Atomic uint64_t mapped_blocks, chunks_used, commits, dedup_hits,
			 zero_writes;
	/*
	 * An fdatasync() failed: the kernel may have dropped the dirty pages
	 * it could not write and will not report it again, so no later
	 * commit could know what is on disk.  Every change fails from then
	 * on; a new open rebuilds the state from the durable map.
	 */
	_Atomic int failed;
	/* dd_check(): map entries dd_open() found out of range */
	uint64_t bad_entries;
	/* contents stored twice (a cut-short commit): read-only, counted;
	 * else merged at open, dup_of[c] = the chunk kept
	 */
	uint64_t duplicates, merged;
	uint32_t *dup_of;
};

static __thread char errbuf[512];

const char *dd_errmsg(void)
{
	return errbuf;
}

static int __attribute__((format(printf, 2, 3))) fail(int err,
						      const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	return err;
}

static uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done,
				  off + done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENODATA;	/* past the end of the file */
		done += n;
	}
	return 0;
}

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(fd, (const char *)buf + done, len - done,
				   off + done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENOSPC;
		done += n;
	}
	return 0;
}

static bool all_zero(const void *buf)
{
	const uint64_t *p = buf;
	unsigned int i;

	for (i = 0; i < DD_BLOCK_SIZE / sizeof(*p); i++)
		if (p[i])
			return false;
	return true;
}

/* ---- geometry ---- */

struct geometry {
	uint64_t nr_blocks, nr_chunks, map_off, table_off, data_off;
};

static void geometry_of(uint64_t nr_blocks, struct geometry *g)
{
	g->nr_blocks = nr_blocks;
	g->nr_chunks = nr_blocks + CHUNK_SLACK;
	g->map_off = DD_BLOCK_SIZE;
	g->table_off = g->map_off + round_up(nr_blocks * 4, DD_BLOCK_SIZE);
	g->data_off = g->table_off +
		      round_up(g->nr_chunks * DD_HASH_SIZE, DD_BLOCK_SIZE);
}

/* The whole store's size when every chunk is in use. */
static uint64_t geometry_full(const struct geometry *g)
{
	return g->data_off + g->nr_chunks * DD_BLOCK_SIZE;
}

static uint32_t super_crc(const struct dd_super *sb)
{
	return crc32(0, (const Bytef *)sb, offsetof(struct dd_super, crc));
}

/* ---- format ---- */

static int dev_size(int fd, const struct stat *st, uint64_t *size)
{
	if (S_ISBLK(st->st_mode))
		return ioctl(fd, BLKGETSIZE64, size) ? -errno : 0;
	*size = st->st_size;
	return 0;
}

int dd_format(const char *path, uint64_t size, unsigned int flags)
{
	struct dd_super sb = { 0 };
	struct geometry g;
	char *block = NULL;
	struct stat st;
	uint64_t have;
	int fd, ret;

	if (size % DD_BLOCK_SIZE)
		return fail(-EINVAL, "size %" PRIu64 ": not a multiple of 4 KiB",
			    size);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return fail(-errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) || dev_size(fd, &st, &have)) {
		ret = fail(-errno, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
		ret = fail(-EINVAL, "%s: not a file or a block device", path);
		goto out;
	}
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		ret = fail(-EBUSY, "%s: in use by a dedup server", path);
		goto out;
	}
	if (!size && S_ISREG(st.st_mode)) {
		ret = fail(-EINVAL, "%s: a file needs --size", path);
		goto out;
	}
	if (!size) {
		/* a block device: the largest device whose store fits */
		uint64_t blocks = have / DD_BLOCK_SIZE;
		uint64_t n = blocks > CHUNK_SLACK + 3 ?
			(blocks - CHUNK_SLACK - 3) * DD_BLOCK_SIZE /
			(DD_BLOCK_SIZE + 4 + DD_HASH_SIZE) : 0;

		/* room for every block to be unique, and the metadata */
		for (; n; n--) {
			geometry_of(n, &g);
			if (geometry_full(&g) <= have)
				break;
		}
		size = n * DD_BLOCK_SIZE;
		if (!size) {
			ret = fail(-ENOSPC, "%s: too small for a store", path);
			goto out;
		}
	}
	geometry_of(size / DD_BLOCK_SIZE, &g);
	if (g.nr_chunks > UINT32_MAX) {
		ret = fail(-EFBIG, "size %" PRIu64 ": at most %" PRIu64
			   " bytes per store", size,
			   (uint64_t)(UINT32_MAX - CHUNK_SLACK) * DD_BLOCK_SIZE);
		goto out;
	}
	if (S_ISBLK(st.st_mode) && geometry_full(&g) > have) {
		ret = fail(-ENOSPC, "%s: %" PRIu64 " bytes, a %" PRIu64
			   "-byte device needs %" PRIu64, path, have, size,
			   geometry_full(&g));
		goto out;
	}
	block = calloc(1, IO_PIECE);
	if (!block) {
		ret = fail(-ENOMEM, "out of memory");
		goto out;
	}
	/* what is there may be someone's data: only --force overwrites it */
	if (!(flags & DD_F_FORCE) && have) {
		bool store = have >= sizeof(sb) &&
			     !pread_full(fd, block, sizeof(sb), 0) &&
			     !memcmp(block, DD_MAGIC, 8);

		ret = fail(-EEXIST, "%s: %s (--force to overwrite it)", path,
			   store ? "holds a dedup store already" :
			   "is not empty");
		goto out;
	}

	/*
	 * Empty metadata: zeros, allocated now so that a commit does not run
	 * out of space on a file system that allocates in place (one that
	 * copies on write, btrfs or XFS with reflinks, may still).  Where
	 * fallocate() is not offered, writing the zeros allocates them.
	 */
	if (S_ISREG(st.st_mode) &&
	    (ftruncate(fd, 0) || ftruncate(fd, g.data_off))) {
		ret = fail(-errno, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode) || fallocate(fd, 0, 0, g.data_off)) {
		uint64_t off;

		if (S_ISREG(st.st_mode) && errno != EOPNOTSUPP) {
			ret = fail(-errno, "%s: cannot allocate %" PRIu64
				   " bytes of metadata: %s", path, g.data_off,
				   strerror(errno));
			goto out;
		}
		memset(block, 0, IO_PIECE);
		for (off = DD_BLOCK_SIZE; off < g.data_off; off += IO_PIECE) {
			ret = pwrite_full(fd, block,
					  g.data_off - off < IO_PIECE ?
					  g.data_off - off : IO_PIECE, off);
			if (ret) {
				fail(ret, "%s: %s", path, strerror(-ret));
				goto out;
			}
		}
	}

	memcpy(sb.magic, DD_MAGIC, sizeof(sb.magic));
	sb.version = htole32(DD_VERSION);
	sb.block_size = htole32(DD_BLOCK_SIZE);
	sb.nr_blocks = htole64(g.nr_blocks);
	sb.nr_chunks = htole64(g.nr_chunks);
	sb.map_off = htole64(g.map_off);
	sb.table_off = htole64(g.table_off);
	sb.data_off = htole64(g.data_off);
	if (getrandom(sb.uuid, sizeof(sb.uuid), 0) != sizeof(sb.uuid))
		memset(sb.uuid, 0, sizeof(sb.uuid));
	sb.created = htole64(time(NULL));
	sb.hash_alg = htole32(DD_HASH_SHA256);
	sb.crc = htole32(super_crc(&sb));
	memset(block, 0, DD_BLOCK_SIZE);
	memcpy(block, &sb, sizeof(sb));
	/* the metadata is durable before the superblock says it is there */
	if (fdatasync(fd) ||
	    (ret = pwrite_full(fd, block, DD_BLOCK_SIZE, 0)) || fsync(fd)) {
		ret = ret ? ret : -errno;
		fail(ret, "%s: %s", path, strerror(-ret));
		goto out;
	}
	ret = 0;
out:
	free(block);
	close(fd);
	return ret;
}

/* ---- the index ---- */

static uint64_t hash_key(const uint8_t *h)
{
	uint64_t k;

	memcpy(&k, h, sizeof(k));
	return k;
}

static pthread_mutex_t *bucket_lock_of(struct dd_store *s, uint64_t b)
{
	return &s->bucket_lock[b % NR_BUCKET_LOCKS];
}

/* The chunk in bucket @b holding @h, or 0; with the bucket's lock held. */
static uint32_t index_find(struct dd_store *s, uint64_t b, const uint8_t *h)
{
	uint32_t c;

	for (c = s->bucket[b]; c; c = s->next[c])
		if (!memcmp(s->hash[c], h, DD_HASH_SIZE))
			break;
	return c;
}

/* The chunk holding @h, with a reference taken, or 0. */
static uint32_t index_get(struct dd_store *s, const uint8_t *h)
{
	uint64_t b = hash_key(h) & s->bucket_mask;
	pthread_mutex_t *lock = bucket_lock_of(s, b);
	uint32_t c;

	pthread_mutex_lock(lock);
	c = index_find(s, b, h);
	if (c)
		s->ref[c]++;
	pthread_mutex_unlock(lock);
	return c;
}

/*
 * Make @c (written, with content @h) findable with one reference, unless
 * another writer stored the same content meanwhile: then take a reference
 * on that chunk and return it instead (the caller gives @c back).
 */
static uint32_t index_insert(struct dd_store *s, const uint8_t *h,
			     uint32_t c)
{
	uint64_t b = hash_key(h) & s->bucket_mask;
	pthread_mutex_t *lock = bucket_lock_of(s, b);
	uint32_t o;

	pthread_mutex_lock(lock);
	o = index_find(s, b, h);
	if (o) {
		s->ref[o]++;
		pthread_mutex_unlock(lock);
		return o;
	}
	memcpy(s->hash[c], h, DD_HASH_SIZE);
	s->ref[c] = 1;
	s->next[c] = s->bucket[b];
	s->bucket[b] = c;
	pthread_mutex_unlock(lock);
	atomic_fetch_add(&s->chunks_used, 1);
	return c;
}

/* Drop a map entry's reference; with commit_lock held shared. */
static void chunk_put(struct dd_store *s, uint32_t c)
{
	uint64_t b = hash_key(s->hash[c]) & s->bucket_mask;
	pthread_mutex_t *lock = bucket_lock_of(s, b);
	uint32_t *pp;

	pthread_mutex_lock(lock);
	if (--s->ref[c]) {
		pthread_mutex_unlock(lock);
		return;
	}
	for (pp = &s->bucket[b]; *pp != c; pp = &s->next[*pp])
		;
	*pp = s->next[c];
	pthread_mutex_unlock(lock);

	atomic_fetch_sub(&s->chunks_used, 1);
	pthread_mutex_lock(&s->alloc_lock);
	s->pending[s->cur][s->nr_pending[s->cur]++] = c;
	pthread_mutex_unlock(&s->alloc_lock);
}

/* ---- allocation ---- */

/*
 * A chunk no map entry ever pointed to goes straight back, on top of the
 * free stack, out of its order (a run given back goes highest first, so
 * that the next write finds it whole on top).
 */
static void chunk_unused(struct dd_store *s, uint32_t c)
{
	pthread_mutex_lock(&s->alloc_lock);
	s->free_stack[s->nr_free++] = c;
	pthread_mutex_unlock(&s->alloc_lock);
}

/*
 * Take the first run of @want consecutive free chunks from the free stack
 * (nr_free > 0), looking from the top down as far as RUN_SCAN entries, or
 * the longest run there if none is that long; with alloc_lock held.  The
 * stack is kept in order, highest id at the bottom (load_chunks(),
 * free_merge()), so a run is a stretch of it, lowest id uppermost.
 * RETURN VALUE: how many it took, the first in *@first.
 */
static uint32_t take_run(struct dd_store *s, uint32_t want, uint32_t *first)
{
	uint32_t *st = s->free_stack;
	uint64_t lo = s->nr_free > RUN_SCAN ? s->nr_free - RUN_SCAN : 0;
	uint64_t top = s->nr_free - 1, bottom, best = top, best_len = 0, len;

	for (;;) {
		/* st[bottom..top] holds ids st[top], st[top] + 1, ... */
		for (bottom = top; bottom > lo && top - bottom + 1 < want &&
		     st[bottom - 1] == st[bottom] + 1; bottom--)
			;
		len = top - bottom + 1;
		if (len > best_len) {
			best_len = len;
			best = top;
		}
		if (len >= want || bottom <= lo)
			break;
		top = bottom - 1;
	}
	*first = st[best];
	/* the run is st[best - best_len + 1..best]: close the gap */
	memmove(st + best - best_len + 1, st + best + 1,
		(s->nr_free - best - 1) * sizeof(*st));
	s->nr_free -= best_len;
	return best_len;
}

/*
 * Push @n freed chunks, highest id first in @batch, onto the free stack,
 * merged into its order (highest at the bottom): chunks freed side by
 * side by different commits come together again.  With alloc_lock held;
 * it moves only the entries below the highest of @batch.
 */
static void free_merge(struct dd_store *s, const uint32_t *batch, uint64_t n)
{
	uint32_t *st = s->free_stack;
	uint64_t i = s->nr_free, k = s->nr_free + n;

	s->nr_free = k;
	/* from the top down, the lower of the two uppermost goes up */
	while (n) {
		if (i && st[i - 1] < batch[n - 1])
			st[--k] = st[--i];
		else
			st[--k] = batch[--n];
	}
}

/*
 * Up to @want free chunks with consecutive ids, the first in *@first, so
 * that the blocks of one write that need new chunks lie one after the
 * other in the store, as a remapped read of them needs (dedup.bpf.c).
 * Freed chunks are reused before the data area grows, as ever:
 *
 *  - free chunks, the first run of @want found near the top of the free
 *    stack, else the longest there (take_run()); if that takes the last
 *    one and the run ends where the never-used chunks begin, it goes on
 *    there;
 *  - else never-used chunks from next_new, unless many freed chunks wait
 *    for a commit (or the area is full): then commit, which frees them,
 *    rather than grow.  Chunks waiting in either pending list (the one a
 *    commit is writing out now included) count: committing waits for
 *    that commit, and so frees them.
 *
 * Everything is taken in one hold of alloc_lock: writers running at once
 * get runs of their own, never chunks interleaved with each other's.  A
 * fragmented free stack gives short runs (a single chunk at worst): the
 * caller asks again for the rest.
 * RETURN VALUE: how many (1..@want), or a negative errno.
 */
static int chunk_alloc_run(struct dd_store *s, uint32_t want, uint32_t *first)
{
	bool grown_once = false, grow;
	uint64_t pend, waiting, n;
	int ret;

	for (;;) {
		pthread_mutex_lock(&s->alloc_lock);
		pend = s->nr_pending[s->cur];
		waiting = pend + s->nr_pending[s->cur ^ 1];
		grow = s->next_new <= s->nr_chunks &&
		       (pend < RECLAIM_MIN || grown_once);
		if (s->nr_free) {
			n = take_run(s, want, first);
		} else if (grow) {
			*first = s->next_new;
			n = 0;
		} else {
			pthread_mutex_unlock(&s->alloc_lock);
			if (!waiting)
				return fail(-ENOSPC, "the store is full: all %" PRIu64
					    " chunks are in use", s->nr_chunks);
			/* each round commits: every freed chunk is free after it */
			ret = dd_commit(s);
			if (ret)
				return ret;
			grown_once = true;
			continue;
		}
		if (n < want && !s->nr_free && grow &&
		    *first + n == s->next_new) {
			uint64_t more = s->nr_chunks + 1 - s->next_new;

			if (more > want - n)
				more = want - n;
			s->next_new += more;
			n += more;
		}
		pthread_mutex_unlock(&s->alloc_lock);
		return n;
	}
}

/* ---- the map ---- */

static pthread_rwlock_t *stripe_of(struct dd_store *s, uint64_t blk)
{
	return &s->stripe[blk % NR_STRIPES];
}

static uint64_t chunk_off(const struct dd_store *s, uint32_t c)
{
	return c ? s->data_off + (uint64_t)(c - 1) * DD_BLOCK_SIZE : 0;
}

/* Point @blk at chunk @c (0: a hole), whose reference the caller holds. */
static void map_set(struct dd_store *s, uint64_t blk, uint32_t c)
{
	pthread_rwlock_t *stripe = stripe_of(s, blk);
	uint64_t page = blk / MAP_PER_PAGE;
	uint32_t old;

	pthread_rwlock_rdlock(&s->commit_lock);
	pthread_rwlock_wrlock(stripe);
	old = s->map[blk];
	s->map[blk] = c;
	if (old != c)
		atomic_fetch_or(&s->dirty[page / 64], 1ULL << (page % 64));
	if (!old != !c) {
		if (c)
			atomic_fetch_add(&s->mapped_blocks, 1);
		else
			atomic_fetch_sub(&s->mapped_blocks, 1);
	}
	if (old != c && s->map_cb)
		s->map_cb(s->map_arg, blk, chunk_off(s, old), chunk_off(s, c));
	pthread_rwlock_unlock(stripe);
	/* no reader holds the old chunk now: readers hold the stripe */
	if (old)
		chunk_put(s, old);
	pthread_rwlock_unlock(&s->commit_lock);
}

int dd_read(struct dd_store *s, uint64_t blk, void *buf)
{
	pthread_rwlock_t *stripe;
	uint32_t c;
	int ret = 0;

	if (blk >= s->nr_blocks)
		return fail(-EINVAL, "block %" PRIu64 " is past the end", blk);
	stripe = stripe_of(s, blk);
	pthread_rwlock_rdlock(stripe);
	c = s->map[blk];
	if (!c)
		memset(buf, 0, DD_BLOCK_SIZE);
	else
		ret = pread_full(s->fd, buf, DD_BLOCK_SIZE, chunk_off(s, c));
	pthread_rwlock_unlock(stripe);
	if (ret)
		return fail(ret == -ENODATA ? -EIO : ret,
			    "block %" PRIu64 ": chunk %u: %s", blk, c,
			    ret == -ENODATA ? "past the end of the store" :
			    strerror(-ret));
	return 0;
}

static int refuse_failed(void)
{
	return fail(-EIO, "the store could not be synced earlier: it takes no change until it is opened again (restart the server)");
}

/* What each block of a write becomes (write_piece()). */
enum {
	W_HOLE,		/* zeros: no chunk */
	W_FOUND,	/* stored already: a reference taken */
	W_NEW,		/* new content: a chunk of the write's run */
	W_SAME,		/* the same new content as an earlier block of it */
};

/* the blocks of a write handled at once: 1 MiB, hybd's largest request */
#define PIECE_BLOCKS	256

struct piece {
	uint8_t kind[PIECE_BLOCKS];
	uint32_t chunk[PIECE_BLOCKS];	/* W_SAME: the earlier block's index */
	uint8_t hash[PIECE_BLOCKS][DD_HASH_SIZE];
};

/* One more reference to chunk @c, of which the caller holds one. */
static void chunk_ref(struct dd_store *s, uint32_t c)
{
	pthread_mutex_t *lock = bucket_lock_of(s, hash_key(s->hash[c]) &
					       s->bucket_mask);

	pthread_mutex_lock(lock);
	s->ref[c]++;
	pthread_mutex_unlock(lock);
}

/*
 * A write failed before any of its blocks was mapped: drop the references
 * it took and give back the chunks it took (highest first, so that a run
 * goes back whole, lowest on top).
 */
static void piece_undo(struct dd_store *s, struct piece *p, uint32_t n)
{
	uint32_t i;

	for (i = n; i-- > 0;) {
		if (p->kind[i] == W_FOUND) {
			pthread_rwlock_rdlock(&s->commit_lock);
			chunk_put(s, p->chunk[i]);
			pthread_rwlock_unlock(&s->commit_lock);
		} else if (p->kind[i] == W_NEW && p->chunk[i]) {
			chunk_unused(s, p->chunk[i]);
		}
	}
}

/*
 * Blocks @blk..@blk + @n - 1 (@n <= PIECE_BLOCKS), in three steps, none
 * under a lock across its I/O or hashing:
 *
 *  1. hash every block and look its content up (a reference taken when
 *     found); zeros become holes;
 *  2. take chunks for the new contents, one run of consecutive chunks
 *     for all of them when the allocator has one (chunk_alloc_run()),
 *     and write content and hash to each -- rule 1: before anything
 *     points there;
 *  3. make the new chunks findable, then point the map entries at their
 *     chunks, block by block in order.
 *
 * So a write of new data lies in the store as it lies on the device,
 * whatever other writers do meanwhile, and a read of it can be remapped
 * whole.  A failure before step 3 maps nothing and gives back all it took.
 */
static int write_piece(struct dd_store *s, uint64_t blk, uint32_t n,
		       const char *buf, struct piece *p)
{
	uint32_t i, j, c, first = 0, nr_new = 0;
	int ret;

	for (i = 0; i < n; i++) {
		const char *src = buf + (size_t)i * DD_BLOCK_SIZE;

		p->chunk[i] = 0;
		if (all_zero(src)) {
			p->kind[i] = W_HOLE;
			continue;
		}
		if (!EVP_Digest(src, DD_BLOCK_SIZE, p->hash[i], NULL, s->md,
				NULL)) {
			piece_undo(s, p, i);
			return fail(-EIO, "SHA-256 failed");
		}
		c = index_get(s, p->hash[i]);
		if (c) {
			p->kind[i] = W_FOUND;
			p->chunk[i] = c;
			continue;
		}
		/* the same new content twice in one write is stored once */
		for (j = 0; j < i; j++)
			if (p->kind[j] == W_NEW &&
			    !memcmp(p->hash[j], p->hash[i], DD_HASH_SIZE))
				break;
		p->kind[i] = j < i ? W_SAME : W_NEW;
		p->chunk[i] = j < i ? j : 0;
		nr_new += j == i;
	}

	for (i = 0; nr_new;) {
		ret = chunk_alloc_run(s, nr_new, &first);
		if (ret < 0) {
			piece_undo(s, p, n);
			return ret;
		}
		for (; ret; i++)
			if (p->kind[i] == W_NEW) {
				p->chunk[i] = first++;
				ret--;
				nr_new--;
			}
	}
	/* rule 1: content and hash are on disk before anything points there */
	for (i = 0; i < n; i++) {
		if (p->kind[i] != W_NEW)
			continue;
		c = p->chunk[i];
		ret = pwrite_full(s->fd, buf + (size_t)i * DD_BLOCK_SIZE,
				  DD_BLOCK_SIZE, chunk_off(s, c));
		if (!ret)
			ret = pwrite_full(s->fd, p->hash[i], DD_HASH_SIZE,
					  s->table_off +
					  (uint64_t)(c - 1) * DD_HASH_SIZE);
		if (ret) {
			piece_undo(s, p, n);
			return fail(ret, "block %" PRIu64 ": writing chunk %u: %s",
				    blk + i, c, strerror(-ret));
		}
	}

	/* every reference the map entries need is held before the first */
	for (i = 0; i < n; i++) {
		if (p->kind[i] == W_NEW) {
			c = index_insert(s, p->hash[i], p->chunk[i]);
			if (c != p->chunk[i]) {
				/* another writer stored it meanwhile */
				chunk_unused(s, p->chunk[i]);
				atomic_fetch_add(&s->dedup_hits, 1);
				p->chunk[i] = c;
			}
		} else if (p->kind[i] == W_SAME) {
			p->chunk[i] = p->chunk[p->chunk[i]];
			chunk_ref(s, p->chunk[i]);
			atomic_fetch_add(&s->dedup_hits, 1);
		} else if (p->kind[i] == W_FOUND) {
			atomic_fetch_add(&s->dedup_hits, 1);
		} else {
			atomic_fetch_add(&s->zero_writes, 1);
		}
	}
	for (i = 0; i < n; i++)
		map_set(s, blk + i, p->chunk[i]);
	return 0;
}

int dd_write_extent(struct dd_store *s, uint64_t blk, uint64_t count,
		    const void *buf)
{
	struct piece p;
	uint64_t done;
	uint32_t n;
	int ret;

	if (atomic_load(&s->failed))
		return refuse_failed();
	if (blk >= s->nr_blocks || count > s->nr_blocks - blk)
		return fail(-EINVAL, "blocks %" PRIu64 "+%" PRIu64
			    " are past the end", blk, count);
	for (done = 0; done < count; done += n) {
		n = count - done < PIECE_BLOCKS ? count - done : PIECE_BLOCKS;
		ret = write_piece(s, blk + done, n, (const char *)buf +
				  done * DD_BLOCK_SIZE, &p);
		if (ret)
			return ret;
	}
	return 0;
}

int dd_write(struct dd_store *s, uint64_t blk, const void *buf)
{
	return dd_write_extent(s, blk, 1, buf);
}

int dd_write_hole(struct dd_store *s, uint64_t blk, uint64_t count)
{
	uint64_t i;

	if (atomic_load(&s->failed))
		return refuse_failed();
	if (blk > s->nr_blocks || count > s->nr_blocks - blk)
		return fail(-EINVAL, "blocks %" PRIu64 "+%" PRIu64
			    " are past the end", blk, count);
	for (i = 0; i < count; i++)
		map_set(s, blk + i, 0);
	return 0;
}

bool dd_is_hole(struct dd_store *s, uint64_t blk)
{
	pthread_rwlock_t *stripe = stripe_of(s, blk);
	bool hole;

	pthread_rwlock_rdlock(stripe);
	hole = !s->map[blk];
	pthread_rwlock_unlock(stripe);
	return hole;
}

void dd_set_map_cb(struct dd_store *s, dd_map_cb cb, void *arg)
{
	pthread_rwlock_wrlock(&s->commit_lock);
	s->map_cb = cb;
	s->map_arg = arg;
	pthread_rwlock_unlock(&s->commit_lock);
}

void dd_set_reuse_cb(struct dd_store *s, dd_reuse_cb cb, void *arg)
{
	pthread_mutex_lock(&s->commit_mutex);
	s->reuse_cb = cb;
	s->reuse_arg = arg;
	pthread_mutex_unlock(&s->commit_mutex);
}

uint64_t dd_block_offset(struct dd_store *s, uint64_t blk)
{
	pthread_rwlock_t *stripe = stripe_of(s, blk);
	uint64_t off;

	pthread_rwlock_rdlock(stripe);
	off = chunk_off(s, s->map[blk]);
	pthread_rwlock_unlock(stripe);
	return off;
}

int dd_fd(const struct dd_store *s)
{
	return s->fd;
}

uint64_t dd_nr_blocks(const struct dd_store *s)
{
	return s->nr_blocks;
}

/* ---- commit ---- */

static int snap_room(uint32_t **snap, uint64_t **pages, uint64_t *room,
		     uint64_t n)
{
	uint32_t *ns = realloc(*snap, n * DD_BLOCK_SIZE);
	uint64_t *np;

	if (ns)
		*snap = ns;
	np = ns ? realloc(*pages, n * sizeof(**pages)) : NULL;
	if (np)
		*pages = np;
	if (!ns || !np)
		return fail(-ENOMEM, "commit: out of memory");
	*room = n;
	return 0;
}

static int chunk_id_desc(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

int dd_commit(struct dd_store *s)
{
	uint64_t words = (s->nr_pages + 63) / 64, w, i, n = 0, *pages = NULL;
	uint64_t room = 0;
	uint32_t *snap = NULL;
	unsigned int old;
	int ret = 0;

	if (s->flags & DD_O_RDONLY)
		return 0;
	if (atomic_load(&s->failed))
		return refuse_failed();
	pthread_mutex_lock(&s->commit_mutex);

	/*
	 * Room for the dirty pages, counted before writers are held off (a
	 * few more may be dirty by then: counted again under the lock).
	 */
	for (w = 0; w < words; w++)
		n += __builtin_popcountll(s->dirty[w]);
	ret = snap_room(&snap, &pages, &room, n + 16);
	if (ret)
		goto out;

	/* rule 2: a snapshot of the map with no change half done */
	pthread_rwlock_wrlock(&s->commit_lock);
	for (w = 0, n = 0; w < words; w++)
		n += __builtin_popcountll(s->dirty[w]);
	if (n > room) {
		ret = snap_room(&snap, &pages, &room, n);
		if (ret) {
			pthread_rwlock_unlock(&s->commit_lock);
			goto out;
		}
	}
	for (w = 0, n = 0; w < words; w++) {
		uint64_t bits = s->dirty[w];

		s->dirty[w] = 0;
		while (bits) {
			uint64_t page = w * 64 + __builtin_ctzll(bits);
			uint64_t first = page * MAP_PER_PAGE;
			uint32_t *dst = snap + n * MAP_PER_PAGE;

			bits &= bits - 1;
			for (i = 0; i < MAP_PER_PAGE; i++)
				dst[i] = first + i < s->nr_blocks ?
					 htole32(s->map[first + i]) : 0;
			pages[n++] = page;
		}
	}
	pthread_mutex_lock(&s->alloc_lock);
	old = s->cur;
	s->cur ^= 1;
	pthread_mutex_unlock(&s->alloc_lock);
	pthread_rwlock_unlock(&s->commit_lock);

	if (!n && !s->nr_pending[old])
		goto out;
	/* rule 1: what the snapshot points to is durable first */
	if (fdatasync(s->fd)) {
		ret = fail(-errno, "commit: fdatasync: %s", strerror(errno));
		atomic_store(&s->failed, ret);
		goto undo;
	}
	for (i = 0; i < n; i++) {
		ret = pwrite_full(s->fd, snap + i * MAP_PER_PAGE, DD_BLOCK_SIZE,
				  s->map_off + pages[i] * DD_BLOCK_SIZE);
		if (ret) {
			fail(ret, "commit: writing the map: %s", strerror(-ret));
			goto undo;
		}
	}
	if (fdatasync(s->fd)) {
		ret = fail(-errno, "commit: fdatasync: %s", strerror(errno));
		atomic_store(&s->failed, ret);
		goto undo;
	}
	/*
	 * Nothing points at what this commit freed, in memory or on disk;
	 * but a read the fast path remapped before the map changed may still
	 * be reading it: wait for those.  If that fails, keep the chunks
	 * waiting: the commit itself is done.
	 */
	if (s->nr_pending[old] && s->reuse_cb && s->reuse_cb(s->reuse_arg)) {
		atomic_fetch_add(&s->commits, 1);
		goto keep_pending;
	}
	/*
	 * rule 3: what this commit freed may be reused from now on, merged
	 * into the free stack's order, so that chunks freed side by side are
	 * reused as a run (chunk_alloc_run()), not in the reverse of the
	 * order they were freed in.  Sorted outside alloc_lock: only this
	 * commit touches pending[old] now, writers free into pending[cur].
	 */
	qsort(s->pending[old], s->nr_pending[old], sizeof(uint32_t),
	      chunk_id_desc);
	pthread_mutex_lock(&s->alloc_lock);
	free_merge(s, s->pending[old], s->nr_pending[old]);
	s->nr_pending[old] = 0;
	pthread_mutex_unlock(&s->alloc_lock);
	atomic_fetch_add(&s->commits, 1);
	goto out;

undo:
	/* the next commit writes it all again; nothing freed is reused */
	for (i = 0; i < n; i++)
		atomic_fetch_or(&s->dirty[pages[i] / 64], 1ULL << (pages[i] % 64));
keep_pending:
	pthread_mutex_lock(&s->alloc_lock);
	memcpy(s->pending[s->cur] + s->nr_pending[s->cur], s->pending[old],
	       s->nr_pending[old] * sizeof(uint32_t));
	s->nr_pending[s->cur] += s->nr_pending[old];
	s->nr_pending[old] = 0;
	pthread_mutex_unlock(&s->alloc_lock);
out:
	pthread_mutex_unlock(&s->commit_mutex);
	free(snap);
	free(pages);
	return ret;
}

/* ---- open ---- */

static int read_super(struct dd_store *s, const char *path, uint64_t size)
{
	struct dd_super sb;
	struct geometry g;
	int ret;

	memset(&sb, 0, sizeof(sb));
	ret = pread_full(s->fd, &sb, size < sizeof(sb) ? size : sizeof(sb), 0);
	if (ret)
		return fail(ret, "%s: reading the superblock: %s", path,
			    strerror(-ret));
	/* what does not start like a store is not one, whatever its size */
	if (memcmp(sb.magic, DD_MAGIC, sizeof(sb.magic)))
		return fail(-EINVAL, "%s: not a dedup store (no %s magic): run 'dedup format'",
			    path, DD_MAGIC);
	if (size < DD_BLOCK_SIZE)
		return fail(-EUCLEAN, "%s: truncated: %" PRIu64
			    " bytes, not even a superblock", path, size);
	if (le32toh(sb.crc) != super_crc(&sb))
		return fail(-EUCLEAN, "%s: the superblock is corrupt (checksum mismatch)",
			    path);
	if (le32toh(sb.version) != DD_VERSION)
		return fail(-EPROTO, "%s: format version %u; this dedup reads version %u",
			    path, le32toh(sb.version), DD_VERSION);
	if (le32toh(sb.block_size) != DD_BLOCK_SIZE ||
	    le32toh(sb.hash_alg) != DD_HASH_SHA256)
		return fail(-EUCLEAN, "%s: block size %u or hash %u unknown",
			    path, le32toh(sb.block_size),
			    le32toh(sb.hash_alg));
	if (le64toh(sb.nr_blocks) > UINT32_MAX - CHUNK_SLACK)
		return fail(-EUCLEAN, "%s: the superblock's geometry is inconsistent",
			    path);
	geometry_of(le64toh(sb.nr_blocks), &g);
	if (!g.nr_blocks || g.nr_chunks > UINT32_MAX ||
	    g.nr_chunks != le64toh(sb.nr_chunks) ||
	    g.map_off != le64toh(sb.map_off) ||
	    g.table_off != le64toh(sb.table_off) ||
	    g.data_off != le64toh(sb.data_off))
		return fail(-EUCLEAN, "%s: the superblock's geometry is inconsistent",
			    path);
	if (size < g.data_off)
		return fail(-EUCLEAN, "%s: truncated: its metadata ends at byte %" PRIu64
			    ", the store has %" PRIu64, path, g.data_off, size);
	s->nr_blocks = g.nr_blocks;
	s->nr_chunks = g.nr_chunks;
	s->map_off = g.map_off;
	s->table_off = g.table_off;
	s->data_off = g.data_off;
	return 0;
}

static int alloc_arrays(struct dd_store *s)
{
	uint64_t nb = 1;

	while (nb < s->nr_chunks)
		nb <<= 1;
	s->bucket_mask = nb - 1;
	s->nr_pages = (s->nr_blocks + MAP_PER_PAGE - 1) / MAP_PER_PAGE;
	s->map = calloc(s->nr_blocks, sizeof(*s->map));
	s->dirty = calloc((s->nr_pages + 63) / 64, sizeof(*s->dirty));
	s->ref = calloc(s->nr_chunks + 1, sizeof(*s->ref));
	s->hash = calloc(s->nr_chunks + 1, sizeof(*s->hash));
	s->next = calloc(s->nr_chunks + 1, sizeof(*s->next));
	s->bucket = calloc(nb, sizeof(*s->bucket));
	s->free_stack = calloc(s->nr_chunks, sizeof(*s->free_stack));
	s->pending[0] = calloc(s->nr_chunks, sizeof(uint32_t));
	s->pending[1] = calloc(s->nr_chunks, sizeof(uint32_t));
	if (!s->map || !s->dirty || !s->ref || !s->hash || !s->next ||
	    !s->bucket || !s->free_stack || !s->pending[0] || !s->pending[1])
		return fail(-ENOMEM, "out of memory for a store of %" PRIu64
			    " blocks", s->nr_blocks);
	return 0;
}

static int load_map(struct dd_store *s, const char *path, uint64_t size,
		    uint32_t *max_ref)
{
	uint64_t blk, data_chunks = (size - s->data_off) / DD_BLOCK_SIZE;
	uint32_t *piece = malloc(IO_PIECE);
	int ret = 0;

	if (!piece)
		return fail(-ENOMEM, "out of memory");
	*max_ref = 0;
	for (blk = 0; blk < s->nr_blocks; blk++) {
		uint64_t i = blk % (IO_PIECE / 4);
		uint32_t c;

		if (!i) {
			uint64_t left = (s->nr_blocks - blk) * 4;

			ret = pread_full(s->fd, piece,
					 round_up(left < IO_PIECE ? left : IO_PIECE,
						  DD_BLOCK_SIZE),
					 s->map_off + blk * 4);
			if (ret) {
				fail(ret, "%s: reading the map: %s", path,
				     strerror(-ret));
				break;
			}
		}
		c = le32toh(piece[i]);
		if (!c)
			continue;
		if (c > s->nr_chunks || c > data_chunks) {
			/* only check goes on, and reports it */
			s->bad_entries++;
			if (s->flags & DD_O_RDONLY)
				continue;
			ret = fail(-EUCLEAN, "%s: corrupt: block %" PRIu64
				   " maps to chunk %u, past the end of the store (run 'dedup check')",
				   path, blk, c);
			break;
		}
		s->map[blk] = c;
		s->ref[c]++;
		s->mapped_blocks++;
		if (c > *max_ref)
			*max_ref = c;
	}
	free(piece);
	return ret;
}

/*
 * A commit that a crash cut short can leave the same content in two
 * chunks: a block in a map page that reached the disk points to the
 * chunk a block in a page that did not still points to.  Both are
 * durable and correct; keep one.  Every map entry of a duplicate moves to
 * its twin (the pages are written by the next commit), and the duplicate
 * waits, like any freed chunk, for that commit before it is reused.
 */
static void merge_duplicates(struct dd_store *s)
{
	uint64_t blk, page;
	uint32_t c, o;

	for (blk = 0; blk < s->nr_blocks; blk++) {
		c = s->map[blk];
		o = c ? s->dup_of[c] : 0;
		if (!o)
			continue;
		s->map[blk] = o;
		s->ref[o]++;
		page = blk / MAP_PER_PAGE;
		s->dirty[page / 64] |= 1ULL << (page % 64);
		if (!--s->ref[c])
			s->pending[s->cur][s->nr_pending[s->cur]++] = c;
		s->merged++;
	}
}

static int load_chunks(struct dd_store *s, const char *path)
{
	uint8_t (*piece)[DD_HASH_SIZE] = malloc(IO_PIECE);
	const uint64_t per = IO_PIECE / DD_HASH_SIZE;
	uint64_t c;
	int ret = 0;

	if (!piece)
		return fail(-ENOMEM, "out of memory");
	for (c = 1; c < s->next_new; c++) {
		uint64_t i = (c - 1) % per;

		if (!i) {
			uint64_t left = (s->next_new - c) * DD_HASH_SIZE;

			ret = pread_full(s->fd, piece,
					 round_up(left < IO_PIECE ? left : IO_PIECE,
						  DD_BLOCK_SIZE),
					 s->table_off + (c - 1) * DD_HASH_SIZE);
			if (ret) {
				fail(ret, "%s: reading the chunk table: %s",
				     path, strerror(-ret));
				break;
			}
		}
		if (s->ref[c]) {
			uint64_t b = hash_key(piece[i]) & s->bucket_mask;
			uint32_t o;

			memcpy(s->hash[c], piece[i], DD_HASH_SIZE);
			o = index_find(s, b, piece[i]);
			if (o && !(s->flags & DD_O_RDONLY)) {
				/* merged into chunk o below */
				if (!s->dup_of) {
					s->dup_of = calloc(s->nr_chunks + 1,
							   sizeof(*s->dup_of));
					if (!s->dup_of) {
						ret = fail(-ENOMEM, "out of memory");
						break;
					}
				}
				s->dup_of[c] = o;
				continue;
			}
			if (o)
				s->duplicates++;
			s->next[c] = s->bucket[b];
			s->bucket[b] = c;
			s->chunks_used++;
		}
	}
	if (!ret && s->dup_of)
		merge_duplicates(s);
	/* free ids, lowest on top (merged duplicates wait in pending) */
	for (c = s->next_new - 1; c >= 1; c--)
		if (!s->ref[c] && !(s->dup_of && s->dup_of[c]))
			s->free_stack[s->nr_free++] = c;
	free(piece);
	return ret;
}

int dd_open(const char *path, unsigned int flags, struct dd_store **out)
{
	struct dd_store *s;
	pthread_rwlockattr_t attr;
	uint64_t size, data_chunks;
	uint32_t max_ref = 0;
	struct stat st;
	unsigned int i;
	int ret;

	s = calloc(1, sizeof(*s));
	if (!s)
		return fail(-ENOMEM, "out of memory");
	s->flags = flags;
	s->fd = open(path, (flags & DD_O_RDONLY ? O_RDONLY : O_RDWR) |
		     O_CLOEXEC);
	if (s->fd < 0) {
		ret = fail(-errno, "%s: %s", path, strerror(errno));
		free(s);
		return ret;
	}
	for (i = 0; i < NR_STRIPES; i++)
		pthread_rwlock_init(&s->stripe[i], NULL);
	for (i = 0; i < NR_BUCKET_LOCKS; i++)
		pthread_mutex_init(&s->bucket_lock[i], NULL);
	/* a commit must not wait behind a stream of writers */
	pthread_rwlockattr_init(&attr);
	pthread_rwlockattr_setkind_np(&attr,
			PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&s->commit_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	pthread_mutex_init(&s->commit_mutex, NULL);
	pthread_mutex_init(&s->alloc_lock, NULL);

	if (!(flags & DD_O_NOLOCK) &&
	    flock(s->fd, (flags & DD_O_RDONLY ? LOCK_SH : LOCK_EX) | LOCK_NB)) {
		ret = fail(-EBUSY, "%s: in use by a dedup server", path);
		goto fail;
	}
	if (fstat(s->fd, &st) || dev_size(s->fd, &st, &size)) {
		ret = fail(-errno, "%s: %s", path, strerror(errno));
		goto fail;
	}
	ret = read_super(s, path, size);
	if (ret)
		goto fail;
	ret = alloc_arrays(s);
	if (ret)
		goto fail;
	s->md = EVP_MD_fetch(NULL, "SHA256", NULL);
	if (!s->md) {
		ret = fail(-ENOPKG, "OpenSSL offers no SHA-256");
		goto fail;
	}
	ret = load_map(s, path, size, &max_ref);
	if (ret)
		goto fail;
	/* chunks in the file past the last one in use are reused first */
	data_chunks = (size - s->data_off) / DD_BLOCK_SIZE;
	if (data_chunks > s->nr_chunks)
		data_chunks = s->nr_chunks;
	s->next_new = (data_chunks > max_ref ? data_chunks : max_ref) + 1;
	ret = load_chunks(s, path);
	if (ret)
		goto fail;
	*out = s;
	return 0;
fail:
	dd_close(s);
	return ret;
}

void dd_close(struct dd_store *s)
{
	if (!s)
		return;
	close(s->fd);
	EVP_MD_free(s->md);
	free(s->map);
	free(s->dirty);
	free(s->ref);
	free(s->hash);
	free(s->next);
	free(s->bucket);
	free(s->free_stack);
	free(s->pending[0]);
	free(s->pending[1]);
	free(s->dup_of);
	free(s);
}

/* ---- statistics and check ---- */

void dd_stats(struct dd_store *s, struct dd_stats *st)
{
	struct stat fst;

	memset(st, 0, sizeof(*st));
	st->nr_blocks = s->nr_blocks;
	st->mapped_blocks = atomic_load(&s->mapped_blocks);
	st->chunks_used = atomic_load(&s->chunks_used);
	pthread_mutex_lock(&s->alloc_lock);
	st->chunks_free = s->nr_free + (s->nr_chunks + 1 - s->next_new);
	st->chunks_pending = s->nr_pending[0] + s->nr_pending[1];
	pthread_mutex_unlock(&s->alloc_lock);
	st->chunks_capacity = s->nr_chunks;
	if (!fstat(s->fd, &fst))
		st->file_bytes = fst.st_size;
	st->commits = atomic_load(&s->commits);
	st->dedup_hits = atomic_load(&s->dedup_hits);
	st->zero_writes = atomic_load(&s->zero_writes);
}

long dd_check(struct dd_store *s, FILE *out)
{
	uint8_t *buf = malloc(DD_BLOCK_SIZE), h[DD_HASH_SIZE];
	long problems = 0;
	uint64_t c, refs = 0;
	int ret;

	if (!buf)
		return fail(-ENOMEM, "out of memory");
	if (s->bad_entries) {
		fprintf(out, "map: %" PRIu64 " blocks point past the end of the store\n",
			s->bad_entries);
		problems += s->bad_entries;
	}
	for (c = 1; c < s->next_new; c++) {
		if (!s->ref[c])
			continue;
		refs += s->ref[c];
		ret = pread_full(s->fd, buf, DD_BLOCK_SIZE, chunk_off(s, c));
		if (ret) {
			fprintf(out, "chunk %" PRIu64 " (%u references): unreadable: %s\n",
				c, s->ref[c], strerror(-ret));
			problems++;
			continue;
		}
		if (!EVP_Digest(buf, DD_BLOCK_SIZE, h, NULL, s->md, NULL)) {
			free(buf);
			return fail(-EIO, "SHA-256 failed");
		}
		if (memcmp(h, s->hash[c], DD_HASH_SIZE)) {
			fprintf(out, "chunk %" PRIu64 " (%u references): content does not match its SHA-256\n",
				c, s->ref[c]);
			problems++;
		}
		if (all_zero(buf)) {
			fprintf(out, "chunk %" PRIu64 ": holds zeros (zero blocks are holes)\n",
				c);
			problems++;
		}

	}
	/*
	 * The same content in two chunks is no damage: a commit cut short
	 * by a crash leaves it (see merge_duplicates()), and the next
	 * server merges them.
	 */
	if (s->duplicates)
		fprintf(out, "note: %" PRIu64 " content%s stored twice (a commit cut short by a crash); 'dedup serve' merges them\n",
			s->duplicates, s->duplicates == 1 ? "" : "s");
	if (refs != s->mapped_blocks) {
		fprintf(out, "reference counts: %" PRIu64 " references for %" PRIu64
			" mapped blocks\n", refs, (uint64_t)s->mapped_blocks);
		problems++;
	}
	fprintf(out, "%s: %" PRIu64 " blocks, %" PRIu64 " mapped, %" PRIu64
		" chunks in use, %ld problem%s\n", problems ? "damaged" : "clean",
		s->nr_blocks, (uint64_t)s->mapped_blocks,
		(uint64_t)s->chunks_used, problems, problems == 1 ? "" : "s");
	free(buf);
	return problems;
}
