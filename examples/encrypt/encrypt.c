// SPDX-License-Identifier: MIT
/*
 * encrypt - an encrypted block device, byte for byte what dm-crypt writes
 * in plain mode with aes-xts-plain64: the backing store it serves opens
 * with `cryptsetup open --type plain`, and the other way round.
 *
 *   encrypt --key-file FILE|- [--key-size 256|512] [--sector-size 512|4096]
 *           [--iv-large-sectors] [--allow-discards] [--cache] [--direct]
 *           [--queues N] [--depth N] [--threads N] [--crypt-threads N]
 *           [--max-io BYTES]
 *           [--id N] [--io-timeout SECONDS] [--bpf PROG.bpf.o | --no-fast-path]
 *           BACKING
 *
 * BACKING is a regular file or a block device; the device has its size,
 * rounded down to 4 KiB.  The key (32 or 64 bytes: AES-128 or AES-256 in
 * XTS mode, as dm-crypt's key sizes 256 and 512) is read from FILE, or
 * standard input for "-", and must be exactly that long.  It prints
 * "ready /dev/hybdN" once the disk exists and serves it until SIGINT or
 * SIGTERM (or `hybdctl del`).
 *
 * Each sector (512 or 4096 bytes, --sector-size) is one XTS data unit
 * whose tweak is its number as a 64-bit little-endian integer (plain64):
 * the number of 512-byte sectors before it, or with --iv-large-sectors of
 * sector-size ones (dm-crypt's iv_large_sectors).  The AES is OpenSSL's
 * (libcrypto EVP, ECB), the XTS mode around it xts.c's, many sectors per
 * call; each handler thread has its own contexts.  Requests of 64 KiB and
 * more are en- or decrypted in pieces by the handler and --crypt-threads
 * helpers (default: one fewer than the CPUs it may use; 0: none), which
 * run on any CPU, as dm-crypt's kcryptd.
 *
 * The one difference from dm-crypt: a 4 KiB block that was never written
 * (a hole of a sparse backing file, or one a discard punched) reads as
 * zeros here, where dm-crypt returns the decryption of the zeros on disk.
 * Both halves agree on it: the slow path keeps a bitmap of the holes,
 * built from the file's holes at start (SEEK_HOLE) and changed by every
 * write and discard, and shares it with the fast path (encrypt.bpf.c),
 * which serves reads of holes as zeros in the kernel.  A write of part of
 * a hole (512-byte sectors) fills the rest of its block with encrypted
 * zeros, so that the block reads the same both ways afterwards.
 *
 * Discard punches holes in the backing file (or discards on a block
 * device) only with --allow-discards, as dm-crypt: it shows which blocks
 * are in use.  --cache attaches encrypt-cache.bpf.o, which also keeps
 * plaintext blocks in a kernel map (README.md: what that costs).
 *
 * The key: never on the command line, locked in memory (mlockall, and
 * its own locked page, kept out of core dumps), wiped when the server
 * exits, and never printed.
 */
#define _GNU_SOURCE
#include <bpf/bpf.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/fs.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "hybd.h"
#include "xts.h"

#define BLK_SHIFT	12
#define BLK_SIZE	(1U << BLK_SHIFT)	/* what a hole bit covers */
#define MAX_IO		(1U << 20)		/* --max-io at most */
#define MAX_IO_BLOCKS	(MAX_IO / BLK_SIZE + 1)	/* unaligned: +1 */
#define NR_STRIPES	256			/* locks of hole blocks */
#define HOLES_MAP	"encrypt_holes"

typedef _Atomic uint64_t bitmap_t;

struct crypt {
	int fd;				/* the backing store */
	const char *path;
	bool is_file;			/* a regular file */
	bool holes_tracked;		/* its holes read as zeros (is_file) */
	bool allow_discards;
	uint64_t size;			/* of the device, bytes */
	uint64_t nr_blocks;		/* 4 KiB blocks */
	unsigned int sector_size, sector_shift;
	unsigned int iv_shift;		/* bytes -> IV: 9, or sector_shift */
	uint32_t max_io;

	const EVP_CIPHER *cipher;
	unsigned char *key;		/* its own locked page */
	size_t key_len;

	/*
	 * Holes, one bit per block: the slow path's (whole device), and
	 * the fast path's map when it is attached (mapped; @fast_words of
	 * it cover the device's first blocks).  A bit is set after the
	 * block became a hole and cleared after the write that filled it,
	 * in both.
	 */
	bitmap_t *holes;
	bitmap_t *fast;
	size_t fast_bytes;
	uint64_t fast_words;
	pthread_mutex_t stripes[NR_STRIPES];

	const char *bpf_path;
	bool bpf_required;
	bool cache;			/* --cache: the program has one */
	struct hybd_bpf *bpf;

	_Atomic uint64_t reads, writes, flushes, discards, zero_blocks,
		padded_blocks, errors;
	_Atomic uint64_t helped;	/* pieces the crypto helpers ran */
};

/* ---- the holes ---- */

static bool hole(const struct crypt *c, uint64_t blk)
{
	return atomic_load(&c->holes[blk / 64]) & (1ULL << (blk % 64));
}

static void hole_set(struct crypt *c, uint64_t blk)
{
	uint64_t bit = 1ULL << (blk % 64);

	atomic_fetch_or(&c->holes[blk / 64], bit);
	if (blk / 64 < c->fast_words)
		atomic_fetch_or(&c->fast[blk / 64], bit);
}

/* the fast path's first: it never serves zeros the slow path would not */
static void hole_clear(struct crypt *c, uint64_t blk)
{
	uint64_t bit = 1ULL << (blk % 64);

	if (blk / 64 < c->fast_words)
		atomic_fetch_and(&c->fast[blk / 64], ~bit);
	atomic_fetch_and(&c->holes[blk / 64], ~bit);
}

/*
 * The holes of the backing file as they are now: every block with no
 * data in it (SEEK_DATA/SEEK_HOLE).  A file system whose blocks are larger
 * than ours would allocate a neighbour with a write, and the neighbour
 * would then read as raw zeros after a restart: no holes there.
 */
static int scan_holes(struct crypt *c, blksize_t fs_block)
{
	uint64_t words = (c->nr_blocks + 63) / 64, blk;
	off_t data, end = 0;

	c->holes = calloc(words ? words : 1, sizeof(*c->holes));
	if (!c->holes)
		return -ENOMEM;
	if (!c->is_file)
		return 0;
	if (fs_block > BLK_SIZE) {
		fprintf(stderr, "encrypt: %s: the file system's blocks are %ld bytes, not 4096: holes are not tracked\n",
			c->path, (long)fs_block);
		return 0;
	}
	c->holes_tracked = true;
	for (blk = 0; blk < c->nr_blocks; blk++)
		c->holes[blk / 64] |= 1ULL << (blk % 64);
	while ((uint64_t)end < c->size) {
		data = lseek(c->fd, end, SEEK_DATA);
		if (data < 0 && errno == ENXIO)
			break;			/* no data after end */
		if (data >= 0)
			end = lseek(c->fd, data, SEEK_HOLE);
		if (data < 0 || end < 0) {
			fprintf(stderr, "encrypt: %s: cannot find its holes (%s): none are tracked\n",
				c->path, strerror(errno));
			memset(c->holes, 0, words * sizeof(*c->holes));
			c->holes_tracked = false;
			return 0;
		}
		for (blk = data >> BLK_SHIFT;
		     blk < c->nr_blocks && blk << BLK_SHIFT < (uint64_t)end;
		     blk++)
			c->holes[blk / 64] &= ~(1ULL << (blk % 64));
	}
	return 0;
}

/* Mark @blk's stripe in @want, a mask of NR_STRIPES bits. */
static void stripe_want(uint64_t *want, uint64_t blk)
{
	unsigned int s = blk % NR_STRIPES;

	want[s / 64] |= 1ULL << (s % 64);
}

static bool stripe_wanted(const uint64_t *want, uint64_t blk)
{
	unsigned int s = blk % NR_STRIPES;

	return want[s / 64] & (1ULL << (s % 64));
}

/* Lock the stripes set in @want, in order. */
static void stripes_lock(struct crypt *c, const uint64_t *want)
{
	for (unsigned int i = 0; i < NR_STRIPES; i++)
		if (stripe_wanted(want, i))
			pthread_mutex_lock(&c->stripes[i]);
}

static void stripes_unlock(struct crypt *c, const uint64_t *want)
{
	for (unsigned int i = NR_STRIPES; i-- > 0; )
		if (stripe_wanted(want, i))
			pthread_mutex_unlock(&c->stripes[i]);
}

/* ---- the crypto ---- */

/* What each handler thread keeps: its contexts and a bounce buffer. */
struct worker {
	struct xts xts;
	unsigned char *bounce;		/* max_io + a block on each side */
};

static pthread_key_t worker_key;

static void worker_free(void *arg)
{
	struct worker *w = arg;

	xts_fini(&w->xts);	/* wipes the key schedules */
	free(w->bounce);
	free(w);
}

/* This thread's; a crypto helper (@bounce false) writes nothing. */
static struct worker *worker_get_for(struct crypt *c, bool bounce)
{
	struct worker *w = pthread_getspecific(worker_key);

	if (w)
		return w;
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	if (bounce)
		w->bounce = aligned_alloc(BLK_SIZE, c->max_io + 2 * BLK_SIZE);
	if ((bounce && !w->bounce) || xts_init(&w->xts, c->key, c->key_len) ||
	    pthread_setspecific(worker_key, w)) {
		worker_free(w);
		return NULL;
	}
	return w;
}

static struct worker *worker_get(struct crypt *c)
{
	return worker_get_for(c, true);
}

/*
 * Large requests are en- and decrypted by several threads: the handler
 * cuts one into pieces, helper threads (--crypt-threads, not pinned)
 * claim pieces while the handler works through the others itself, and
 * the handler waits for the last piece.  A handler whose helpers are
 * busy elsewhere does every piece itself.  This is what dm-crypt's
 * unbound kcryptd workqueue gives it: one stream's crypto on every CPU,
 * where a queue's worker alone would use one.
 */
#define PAR_MIN		(64U << 10)	/* requests from this size are cut */
#define PAR_PIECE_MIN	(16U << 10)
#define MAX_HELPERS	15

/* Bytes [at, at + n) of a request, with thread @w's contexts. */
typedef int piece_fn(const struct crypt *c, struct worker *w, void *arg,
		     uint32_t at, uint32_t n);

struct par_job {
	struct par_job *next;		/* in par.jobs while pieces are left */
	pthread_cond_t done;		/* the last piece finished, or a helper left */
	piece_fn *fn;
	void *arg;
	uint32_t piece, len;		/* bytes */
	unsigned int nr, claimed, finished, users;	/* under par.lock */
	int err;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work;		/* a job was posted, or stop */
	struct par_job *jobs;
	const struct crypt *c;
	unsigned int nr_threads;	/* started */
	unsigned int live;		/* of those, taking pieces */
	bool stop;
	pthread_t threads[MAX_HELPERS];
} par = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.work = PTHREAD_COND_INITIALIZER,
};

/* En- or decrypt @len bytes at device byte @off here, in this thread. */
static int xts_here(const struct crypt *c, struct worker *w, bool enc,
		    uint64_t off, unsigned char *out, const unsigned char *in,
		    uint32_t len)
{
	return xts_crypt(&w->xts, enc, out, in, len, c->sector_size, off,
			 c->iv_shift) ? -EIO : 0;
}

/*
 * Claim the job's next piece and run it, par.lock held (dropped while
 * it runs).  False when no piece was left.
 */
static bool par_run_piece(struct par_job *j, struct worker *w)
{
	struct par_job **pp;
	uint32_t at, n;
	int ret;

	if (j->claimed == j->nr)
		return false;
	at = j->claimed++ * j->piece;
	if (j->claimed == j->nr) {	/* nothing more to hand out */
		for (pp = &par.jobs; *pp; pp = &(*pp)->next) {
			if (*pp == j) {
				*pp = j->next;
				break;
			}
		}
	}
	n = j->len - at < j->piece ? j->len - at : j->piece;
	pthread_mutex_unlock(&par.lock);
	ret = j->fn(par.c, w, j->arg, at, n);
	pthread_mutex_lock(&par.lock);
	if (ret && !j->err)
		j->err = ret;
	if (++j->finished == j->nr)
		pthread_cond_signal(&j->done);
	return true;
}

static void *par_helper(void *arg)
{
	struct crypt *c = arg;
	struct worker *w = worker_get_for(c, false);

	if (!w) {
		fprintf(stderr, "encrypt: a crypto helper has no memory: the handlers do its share\n");
		return NULL;
	}
	pthread_mutex_lock(&par.lock);
	par.live++;
	for (;;) {
		struct par_job *j = par.jobs;

		if (!j) {
			if (par.stop)
				break;
			pthread_cond_wait(&par.work, &par.lock);
			continue;
		}
		j->users++;
		while (par_run_piece(j, w))
			atomic_fetch_add(&c->helped, 1);
		if (!--j->users)
			pthread_cond_signal(&j->done);
	}
	par.live--;
	pthread_mutex_unlock(&par.lock);
	return NULL;
}

/*
 * Run @fn over [0, @len) of a request: at once in this thread if it is
 * small, else in pieces (whole sectors) shared with the helpers.  The
 * first error any piece returned.
 */
static int par_for(const struct crypt *c, struct worker *w, uint32_t len,
		   piece_fn *fn, void *arg)
{
	struct par_job j = { .fn = fn, .arg = arg, .len = len };
	unsigned int live;
	uint32_t piece;

	if (len < PAR_MIN || !par.nr_threads)
		return fn(c, w, arg, 0, len);
	/* the job is sized and posted under one hold of the lock */
	pthread_mutex_lock(&par.lock);
	live = par.live;
	if (!live) {
		pthread_mutex_unlock(&par.lock);
		return fn(c, w, arg, 0, len);
	}
	/* two pieces for each thread that may take part */
	piece = len / (2 * (live + 1));
	if (piece < PAR_PIECE_MIN)
		piece = PAR_PIECE_MIN;
	piece = (piece + c->sector_size - 1) & ~(c->sector_size - 1);
	j.piece = piece;
	j.nr = (len + piece - 1) / piece;
	pthread_cond_init(&j.done, NULL);
	j.next = par.jobs;
	par.jobs = &j;
	pthread_cond_broadcast(&par.work);
	while (par_run_piece(&j, w))
		;
	/* only pieces a helper has begun are left: wait for those */
	while (j.finished < j.nr || j.users)
		pthread_cond_wait(&j.done, &par.lock);
	pthread_mutex_unlock(&par.lock);
	pthread_cond_destroy(&j.done);
	return j.err;
}

struct xts_args {
	bool enc;
	unsigned char *out;
	const unsigned char *in;
	uint64_t off;
};

static int xts_piece(const struct crypt *c, struct worker *w, void *arg,
		     uint32_t at, uint32_t n)
{
	const struct xts_args *a = arg;

	return xts_here(c, w, a->enc, a->off + at, a->out + at, a->in + at, n);
}

/*
 * En- (enc) or decrypt @len bytes (whole sectors) that belong at byte @off
 * of the device, from @in to @out (the same buffer, or apart).
 */
static int xts(const struct crypt *c, struct worker *w, bool enc,
	       uint64_t off, unsigned char *out, const unsigned char *in,
	       uint32_t len)
{
	struct xts_args a = { .enc = enc, .out = out, .in = in, .off = off };

	return par_for(c, w, len, xts_piece, &a);
}

/*
 * Start @n helpers, from the main thread before hybd_run(): so they are
 * not pinned as the queue workers are, and, with every signal blocked,
 * leave SIGINT and SIGTERM to the library.  A helper that cannot start is
 * one fewer; the server runs with the others.
 */
static void par_start(const struct crypt *c, unsigned int n)
{
	sigset_t all, old;
	int ret = 0;

	par.c = c;
	sigfillset(&all);	/* helpers never take signals */
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (; par.nr_threads < n; par.nr_threads++) {
		ret = pthread_create(&par.threads[par.nr_threads], NULL,
				     par_helper, (void *)c);
		if (ret)
			break;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret)
		fprintf(stderr, "encrypt: started %u of %u crypto helpers: %s\n",
			par.nr_threads, n, strerror(ret));
}

static void par_stop(void)
{
	unsigned int i;

	pthread_mutex_lock(&par.lock);
	par.stop = true;
	pthread_cond_broadcast(&par.work);
	pthread_mutex_unlock(&par.lock);
	for (i = 0; i < par.nr_threads; i++)
		pthread_join(par.threads[i], NULL);
	par.nr_threads = 0;
}

/* ---- the handlers ---- */

static void report(struct crypt *c, const char *what, uint64_t off, int ret)
{
	uint64_t n = atomic_fetch_add(&c->errors, 1);

	if (n < 10 || n % 1000 == 0)
		fprintf(stderr, "encrypt: %s at %" PRIu64 ": %s\n", what, off,
			strerror(-ret));
}

static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	ssize_t n;

	while (len) {
		n = pread(fd, buf, len, off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;	/* the backing store shrank */
		buf = (char *)buf + n;
		len -= n;
		off += n;
	}
	return 0;
}

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off,
		       int flags)
{
	struct iovec iov;
	ssize_t n;

	while (len) {
		iov.iov_base = (void *)buf;
		iov.iov_len = len;
		n = pwritev2(fd, &iov, 1, off, flags);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENOSPC;
		buf = (const char *)buf + n;
		len -= n;
		off += n;
	}
	return 0;
}

struct read_args {
	unsigned char *buf;
	uint64_t off;
	const bool *holes;		/* of the request's blocks */
};

/* Bytes [at, at + n) of a read: zeros for holes, the rest decrypted. */
static int read_piece(const struct crypt *c, struct worker *w, void *arg,
		      uint32_t at, uint32_t n)
{
	const struct read_args *a = arg;
	uint64_t first = a->off >> BLK_SHIFT;
	uint32_t done, run;
	int ret;

	for (done = at; done < at + n; done += run) {
		bool is_hole = a->holes[((a->off + done) >> BLK_SHIFT) - first];

		run = c->sector_size;
		while (done + run < at + n &&
		       a->holes[((a->off + done + run) >> BLK_SHIFT) - first] ==
		       is_hole)
			run += c->sector_size;
		if (is_hole) {
			memset(a->buf + done, 0, run);
			continue;
		}
		ret = xts_here(c, w, false, a->off + done, a->buf + done,
			       a->buf + done, run);
		if (ret)
			return ret;
	}
	return 0;
}

static int crypt_read(struct hybd_io *io, void *buf, uint64_t off,
		      uint32_t len)
{
	struct crypt *c = hybd_io_priv(io);
	struct worker *w = worker_get(c);
	uint64_t first = off >> BLK_SHIFT, blk;
	bool holes[MAX_IO_BLOCKS];
	struct read_args a = { .buf = buf, .off = off, .holes = holes };
	uint32_t nr_holes = 0;
	int ret;

	if (!w)
		return -ENOMEM;
	atomic_fetch_add(&c->reads, 1);
	/*
	 * Which blocks are holes, before reading: a write that fills one
	 * now has its data read below, or zeros, never the raw zeros of
	 * the hole decrypted.
	 */
	for (blk = first; blk <= (off + len - 1) >> BLK_SHIFT; blk++) {
		holes[blk - first] = hole(c, blk);
		nr_holes += holes[blk - first];
	}
	if (nr_holes < blk - first) {	/* any data */
		ret = pread_full(c->fd, buf, len, off);
		if (ret) {
			report(c, "read", off, ret);
			return ret;
		}
	}
	if (nr_holes)
		atomic_fetch_add(&c->zero_blocks, nr_holes);
	/* runs of sectors: zeros for holes, decrypted data for the rest */
	ret = par_for(c, w, len, read_piece, &a);
	if (ret)
		report(c, "decrypt", off, ret);
	return ret;
}

/*
 * A write.  Blocks that are holes are filled under their stripe's lock:
 * the parts of them the write does not cover are written as encrypted
 * zeros (what they read as), so that two writes into one hole, or a write
 * racing with the fill, cannot undo each other.  Other blocks need no lock
 * unless discards may punch them: then every block's lock is taken, so
 * that a discard cannot mark a block as a hole after a write it raced
 * with put data there (the bit would hide data that a restart would find).
 */
static int crypt_write(struct hybd_io *io, const void *buf, uint64_t off,
		       uint32_t len)
{
	static const unsigned char zeros[BLK_SIZE];
	struct crypt *c = hybd_io_priv(io);
	struct worker *w = worker_get(c);
	uint64_t first = off >> BLK_SHIFT, last = (off + len - 1) >> BLK_SHIFT;
	uint64_t want[NR_STRIPES / 64] = { 0 }, start = off, end = off + len;
	uint64_t blk;
	int flags = hybd_io_flags(io) & HYBD_IO_F_FUA ? RWF_DSYNC : 0;
	bool locked = false;
	int ret;

	if (!w)
		return -ENOMEM;
	atomic_fetch_add(&c->writes, 1);
	for (blk = first; blk <= last; blk++) {
		if (hole(c, blk) || (c->allow_discards && c->holes_tracked)) {
			stripe_want(want, blk);
			locked = true;
		}
	}
	if (locked) {
		stripes_lock(c, want);
		/* only a block that is still a hole under its lock is padded */
		if (off % BLK_SIZE && hole(c, first))
			start = first << BLK_SHIFT;
		if (end % BLK_SIZE && hole(c, last))
			end = (last + 1) << BLK_SHIFT;
	}
	/* the padding (less than a block each side) encrypted from zeros */
	ret = xts(c, w, true, start, w->bounce, zeros, off - start);
	if (!ret)
		ret = xts(c, w, true, off, w->bounce + (off - start), buf,
			  len);
	if (!ret)
		ret = xts(c, w, true, off + len,
			  w->bounce + (off + len - start), zeros,
			  end - (off + len));
	if (ret) {
		report(c, "encrypt", start, ret);
		goto out;
	}
	ret = pwrite_full(c->fd, w->bounce, end - start, start, flags);
	if (ret) {
		report(c, "write", start, ret);
		/*
		 * Part of it may have reached the file: make the holes it
		 * was filling holes again, or their padding would read as
		 * zeros now and as noise after a restart.
		 */
		for (blk = first; locked && blk <= last; blk++)
			if (stripe_wanted(want, blk) && hole(c, blk))
				fallocate(c->fd, FALLOC_FL_PUNCH_HOLE |
					  FALLOC_FL_KEEP_SIZE,
					  blk << BLK_SHIFT, BLK_SIZE);
		goto out;
	}
	if (locked) {
		/* the holes whose lock we hold (a discard takes it too) */
		for (blk = first; blk <= last; blk++)
			if (stripe_wanted(want, blk) && hole(c, blk))
				hole_clear(c, blk);
		/* blocks whose rest was written as zeros */
		atomic_fetch_add(&c->padded_blocks,
				 (start < off) + (end > off + len) -
				 (start < off && end > off + len &&
				  first == last));
	}
out:
	if (locked)
		stripes_unlock(c, want);
	return ret;
}

static int crypt_flush(struct hybd_io *io)
{
	struct crypt *c = hybd_io_priv(io);
	int ret = 0;

	atomic_fetch_add(&c->flushes, 1);
	if (fdatasync(c->fd)) {
		ret = -errno;
		report(c, "flush", 0, ret);
	}
	return ret;
}

/*
 * --allow-discards: a file gets the whole blocks of the range punched out
 * (holes, then, for both halves, where holes are tracked); what a discard
 * leaves in the partial blocks at its ends is undefined, so they keep
 * their data.  A block device is asked to discard the range.  A backing
 * store that cannot discard is no error: a discard is a hint.
 */
static int crypt_discard(struct hybd_io *io, uint64_t off, uint32_t len)
{
	struct crypt *c = hybd_io_priv(io);
	uint64_t first = (off + BLK_SIZE - 1) >> BLK_SHIFT;
	uint64_t end = (off + len) >> BLK_SHIFT, blk;
	uint64_t want[NR_STRIPES / 64] = { 0 }, range[2] = { off, len };
	int ret = 0;

	atomic_fetch_add(&c->discards, 1);
	if (!c->is_file) {
		if (ioctl(c->fd, BLKDISCARD, range) && errno != EOPNOTSUPP)
			ret = -errno;
		goto out;
	}
	if (first >= end)
		return 0;
	if (end - first >= NR_STRIPES)
		memset(want, 0xff, sizeof(want));
	else
		for (blk = first; blk < end; blk++)
			stripe_want(want, blk);
	stripes_lock(c, want);
	if (fallocate(c->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      first << BLK_SHIFT, (end - first) << BLK_SHIFT)) {
		if (errno != EOPNOTSUPP)
			ret = -errno;
	} else if (c->holes_tracked) {
		for (blk = first; blk < end; blk++)
			hole_set(c, blk);
	}
	stripes_unlock(c, want);
out:
	if (ret)
		report(c, "discard", off, ret);
	return ret;
}

/* ---- the fast path ---- */

/*
 * Attach the program and hand it the holes, before the device starts;
 * from here on every change is made to its bitmap too.
 */
static int attach_fast_path(struct crypt *c, struct hybd_dev *dev)
{
	/*
	 * Pinned, `hybdctl stats --maps` shows its counters; but a program
	 * with the plaintext cache is not: it goes with this process, even
	 * a killed one, and its cache with it.
	 */
	unsigned int flags = c->cache ? 0 : HYBD_BPF_F_PIN;
	struct bpf_map_info info = { 0 };
	uint32_t len = sizeof(info);
	uint64_t words = (c->nr_blocks + 63) / 64, i;
	int ret, fd;

	ret = hybd_bpf_attach(hybd_dev_id(dev), c->bpf_path, flags, &c->bpf);
	if (ret) {
		fprintf(stderr, "encrypt: %s: %s\n", c->bpf_path, hybd_errmsg());
		return ret;
	}
	fd = hybd_bpf_map_fd(c->bpf, HOLES_MAP);
	if (fd < 0 || bpf_map_get_info_by_fd(fd, &info, &len) ||
	    info.type != BPF_MAP_TYPE_ARRAY || info.key_size != 4 ||
	    info.value_size != 8) {
		fprintf(stderr, "encrypt: %s has no map %s (an array of 64-bit words): not encrypt's fast path\n",
			c->bpf_path, HOLES_MAP);
		ret = -ENOENT;
		goto fail;
	}
	c->fast = hybd_bpf_map_mmap(fd, &c->fast_bytes);
	if (!c->fast) {
		fprintf(stderr, "encrypt: %s\n", hybd_errmsg());
		ret = -EINVAL;
		goto fail;
	}
	if (words > info.max_entries) {
		fprintf(stderr, "encrypt: %s covers the first %" PRIu64
			" MiB of the device: holes past them are read by the slow path\n",
			HOLES_MAP, (uint64_t)info.max_entries * 64 * BLK_SIZE >> 20);
		words = info.max_entries;
	}
	for (i = 0; i < words; i++)
		atomic_store(&c->fast[i], atomic_load(&c->holes[i]));
	c->fast_words = words;
	return 0;
fail:
	hybd_bpf_detach(c->bpf);
	c->bpf = NULL;
	return ret;
}

static void detach_fast_path(struct crypt *c)
{
	c->fast_words = 0;
	if (c->fast)
		munmap((void *)c->fast, c->fast_bytes);
	c->fast = NULL;
	if (c->bpf)
		hybd_bpf_detach(c->bpf);
	c->bpf = NULL;
}

static int crypt_prepare(struct hybd_dev *dev)
{
	struct crypt *c = hybd_dev_priv(dev);
	int ret;

	if (!c->bpf_path)
		return 0;
	ret = attach_fast_path(c, dev);
	return c->bpf_required ? ret : 0;
}

static void crypt_ready(struct hybd_dev *dev)
{
	struct crypt *c = hybd_dev_priv(dev);

	printf("fast path %s\n", c->bpf ? c->bpf_path : "off");
	printf("dm-crypt: cryptsetup open --type plain --cipher aes-xts-plain64 --key-size %zu%s%s --key-file KEYFILE %s NAME\n",
	       c->key_len * 8,
	       c->sector_size == 512 ? "" : " --sector-size 4096",
	       c->sector_size != 512 && c->iv_shift != 9 ?
	       " --iv-large-sectors" : "", c->path);
	printf("ready %s\n", hybd_dev_path(dev));
	fflush(stdout);
}

/* ---- the key ---- */

/*
 * Read exactly @c->key_len bytes from @path ("-": standard input) into a
 * page of their own, locked and kept out of core dumps.
 */
static int read_key(struct crypt *c, const char *path)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t got = 0;
	ssize_t n;
	int fd;

	c->key = mmap(NULL, page, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (c->key == MAP_FAILED) {
		c->key = NULL;
		fprintf(stderr, "encrypt: no memory for the key\n");
		return -1;
	}
	if (mlock(c->key, page) || madvise(c->key, page, MADV_DONTDUMP)) {
		fprintf(stderr, "encrypt: cannot lock the key in memory: %s\n",
			strerror(errno));
		return -1;
	}
	fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : 0;
	if (fd < 0) {
		fprintf(stderr, "encrypt: key file %s: %s\n", path,
			strerror(errno));
		return -1;
	}
	/* one byte more than the key: a longer file is an error */
	while (got <= c->key_len) {
		n = read(fd, c->key + got, c->key_len + 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += n;
	}
	if (n < 0)
		fprintf(stderr, "encrypt: key file %s: %s\n", path,
			strerror(errno));
	if (fd)
		close(fd);
	if (n < 0)
		return -1;
	if (got != c->key_len) {
		fprintf(stderr, "encrypt: key file %s: %s%zu bytes, --key-size %zu needs exactly %zu\n",
			path, got > c->key_len ? "more than " : "",
			got > c->key_len ? c->key_len : got, c->key_len * 8,
			c->key_len);
		return -1;
	}
	return 0;
}

static void wipe_key(struct crypt *c)
{
	long page = sysconf(_SC_PAGESIZE);

	if (!c->key)
		return;
	OPENSSL_cleanse(c->key, page);
	munlock(c->key, page);
	munmap(c->key, page);
	c->key = NULL;
}

/* OpenSSL takes the key?  (XTS refuses one whose two halves are equal.) */
static int check_key(struct crypt *c)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int ok = ctx && EVP_CipherInit_ex2(ctx, c->cipher, c->key, NULL, 1,
					   NULL);

	EVP_CIPHER_CTX_free(ctx);
	if (ok)
		return 0;
	ERR_clear_error();
	fprintf(stderr, "encrypt: OpenSSL refuses the key for %s%s\n",
		EVP_CIPHER_get0_name(c->cipher),
		CRYPTO_memcmp(c->key, c->key + c->key_len / 2, c->key_len / 2) ?
		"" : " (its two halves are equal, which XTS forbids)");
	return -1;
}

/* ---- the command ---- */

static const char usage[] =
	"usage: encrypt --key-file FILE|- [--key-size 256|512] [--sector-size 512|4096]\n"
	"               [--iv-large-sectors] [--allow-discards] [--cache] [--direct]\n"
	"               [--queues N] [--depth N] [--threads N] [--crypt-threads N]\n"
	"               [--max-io BYTES] [--id N]\n"
	"               [--io-timeout SECONDS] [--bpf PROG.bpf.o | --no-fast-path]\n"
	"               BACKING\n";

static uint64_t number(const char *name, const char *s)
{
	uint64_t v;

	if (hybd_parse_size(s, &v)) {
		fprintf(stderr, "encrypt: --%s %s: %s\n", name, s,
			hybd_errmsg());
		exit(2);
	}
	return v;
}

/* @name next to this program, if it is there */
static char *next_to_me(const char *name)
{
	static char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 64);
	char *slash;

	if (n <= 0)
		return NULL;
	path[n] = 0;
	slash = strrchr(path, '/');
	strcpy(slash ? slash + 1 : path, name);
	return access(path, R_OK) ? NULL : path;
}

/* Open the backing store and size the device from it. */
static int open_backing(struct crypt *c, bool direct)
{
	struct stat st;
	uint64_t bytes;

	c->fd = open(c->path, O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0));
	if (c->fd < 0 || fstat(c->fd, &st)) {
		fprintf(stderr, "encrypt: %s: %s\n", c->path, strerror(errno));
		return -1;
	}
	/*
	 * Nobody else may write it while it is served: a block device is
	 * claimed as dm-crypt claims it (O_EXCL: not if mounted or mapped),
	 * a file locked against a second server.
	 */
	if (S_ISBLK(st.st_mode)) {
		int fd = open(c->path, O_RDWR | O_CLOEXEC | O_EXCL |
			      (direct ? O_DIRECT : 0));

		if (fd < 0) {
			fprintf(stderr, "encrypt: %s: %s (in use?)\n", c->path,
				strerror(errno));
			return -1;
		}
		close(c->fd);
		c->fd = fd;
	} else if (S_ISREG(st.st_mode) && flock(c->fd, LOCK_EX | LOCK_NB)) {
		fprintf(stderr, "encrypt: %s: %s\n", c->path,
			errno == EWOULDBLOCK ? "served by another process" :
			strerror(errno));
		return -1;
	}
	if (S_ISREG(st.st_mode)) {
		c->is_file = true;
		bytes = st.st_size;
	} else if (S_ISBLK(st.st_mode)) {
		if (ioctl(c->fd, BLKGETSIZE64, &bytes)) {
			fprintf(stderr, "encrypt: %s: %s\n", c->path,
				strerror(errno));
			return -1;
		}
	} else {
		fprintf(stderr, "encrypt: %s: not a regular file or a block device\n",
			c->path);
		return -1;
	}
	c->size = bytes & ~(uint64_t)(BLK_SIZE - 1);
	if (!c->size) {
		fprintf(stderr, "encrypt: %s: smaller than 4 KiB\n", c->path);
		return -1;
	}
	if (c->size != bytes)
		fprintf(stderr, "encrypt: %s: serving its first %" PRIu64
			" bytes (a multiple of 4 KiB)\n", c->path, c->size);
	c->nr_blocks = c->size >> BLK_SHIFT;
	if (scan_holes(c, st.st_blksize)) {
		fprintf(stderr, "encrypt: no memory for the hole bitmap\n");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "key-file", required_argument, NULL, 'k' },
		{ "key-size", required_argument, NULL, 'K' },
		{ "sector-size", required_argument, NULL, 's' },
		{ "iv-large-sectors", no_argument, NULL, 'L' },
		{ "allow-discards", no_argument, NULL, 'D' },
		{ "cache", no_argument, NULL, 'C' },
		{ "direct", no_argument, NULL, 'O' },
		{ "queues", required_argument, NULL, 'q' },
		{ "depth", required_argument, NULL, 'd' },
		{ "threads", required_argument, NULL, 'T' },
		{ "crypt-threads", required_argument, NULL, 'P' },
		{ "max-io", required_argument, NULL, 'm' },
		{ "id", required_argument, NULL, 'i' },
		{ "io-timeout", required_argument, NULL, 't' },
		{ "bpf", required_argument, NULL, 'b' },
		{ "no-fast-path", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct hybd_driver drv = {
		.read		= crypt_read,
		.write		= crypt_write,
		.flush		= crypt_flush,
		.prepare	= crypt_prepare,
		.ready		= crypt_ready,
	};
	struct crypt c = { .fd = -1 };
	const char *key_file = NULL;
	uint64_t key_bits = 512, sector = 512, max_io = 0, helpers;
	cpu_set_t cpus;
	bool iv_large = false, direct = false, fast = true;
	struct hybd_config cfg;
	int opt, i = 0, ret;

	hybd_config_init(&cfg);
	/* one per CPU this process may use, beyond the first */
	helpers = sched_getaffinity(0, sizeof(cpus), &cpus) ? 0 :
		  CPU_COUNT(&cpus) - 1;
	if (helpers > MAX_HELPERS)
		helpers = MAX_HELPERS;
	while ((opt = getopt_long(argc, argv, "h", opts, &i)) != -1) {
		const char *name = opts[i].name;

		switch (opt) {
		case 'k': key_file = optarg; break;
		case 'K': key_bits = number(name, optarg); break;
		case 's': sector = number(name, optarg); break;
		case 'L': iv_large = true; break;
		case 'D': c.allow_discards = true; break;
		case 'C': c.cache = true; break;
		case 'O': direct = true; break;
		case 'q': cfg.nr_queues = number(name, optarg); break;
		case 'd': cfg.queue_depth = number(name, optarg); break;
		case 'T': cfg.queue_threads = number(name, optarg); break;
		case 'P': helpers = number(name, optarg); break;
		case 'm': max_io = number(name, optarg); break;
		case 'i': cfg.dev_id = number(name, optarg); break;
		case 't': cfg.io_timeout = number(name, optarg); break;
		case 'b': c.bpf_path = optarg; c.bpf_required = true; break;
		case 'n': fast = false; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind != argc - 1) {
		fputs(usage, stderr);
		return 2;
	}
	c.path = argv[optind];
	if (!key_file) {
		fprintf(stderr, "encrypt: --key-file FILE (or - for standard input) is required: keys never come from the command line\n");
		return 2;
	}
	if (key_bits != 256 && key_bits != 512) {
		fprintf(stderr, "encrypt: --key-size %" PRIu64 ": aes-xts-plain64 takes 256 (AES-128) or 512 (AES-256)\n",
			key_bits);
		return 2;
	}
	if (sector != 512 && sector != 4096) {
		fprintf(stderr, "encrypt: --sector-size %" PRIu64 ": 512 or 4096\n",
			sector);
		return 2;
	}
	if (helpers > MAX_HELPERS) {
		fprintf(stderr, "encrypt: --crypt-threads %" PRIu64 ": at most %u\n",
			helpers, MAX_HELPERS);
		return 2;
	}
	if (iv_large && sector == 512)
		iv_large = false;	/* the same thing */
	if (max_io && (max_io > MAX_IO || max_io % BLK_SIZE)) {
		fprintf(stderr, "encrypt: --max-io %" PRIu64 ": a multiple of 4096, at most %u\n",
			max_io, MAX_IO);
		return 2;
	}
	if (max_io)
		cfg.max_io_bytes = max_io;
	if (!fast && c.bpf_required) {
		fprintf(stderr, "encrypt: --bpf and --no-fast-path contradict each other\n");
		return 2;
	}
	if (fast && !c.bpf_path) {
		const char *obj = c.cache ? "encrypt-cache.bpf.o" :
			"encrypt.bpf.o";

		c.bpf_path = next_to_me(obj);
		if (!c.bpf_path)
			fprintf(stderr, "encrypt: no %s next to this program: no fast path\n",
				obj);
		if (!c.bpf_path && c.cache)
			return 1;	/* asked for, not there */
	}
	if (!fast)
		c.bpf_path = NULL;

	/* nothing of the key may reach swap or a core dump */
	prctl(PR_SET_DUMPABLE, 0);
	if (mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)) {
		fprintf(stderr, "encrypt: cannot lock memory (mlockall): %s\n",
			strerror(errno));
		return 1;
	}
	c.key_len = key_bits / 8;
	c.cipher = key_bits == 256 ? EVP_aes_128_xts() : EVP_aes_256_xts();
	c.sector_size = sector;
	c.sector_shift = sector == 512 ? 9 : 12;
	c.iv_shift = iv_large ? c.sector_shift : 9;
	c.max_io = cfg.max_io_bytes;
	ret = 1;
	if (read_key(&c, key_file) || check_key(&c) || open_backing(&c, direct))
		goto out;
	for (i = 0; i < NR_STRIPES; i++)
		pthread_mutex_init(&c.stripes[i], NULL);
	if (pthread_key_create(&worker_key, worker_free)) {
		fprintf(stderr, "encrypt: pthread_key_create failed\n");
		goto out;
	}

	cfg.size = c.size;
	cfg.logical_block_size = sector;
	cfg.physical_block_size = BLK_SIZE;
	if (c.allow_discards) {
		drv.discard = crypt_discard;
		cfg.discard_granularity = c.is_file ? BLK_SIZE : sector;
	}
	par_start(&c, helpers);
	ret = hybd_run(&cfg, &drv, &c) ? 1 : 0;
	if (ret)
		fprintf(stderr, "encrypt: %s\n", hybd_errmsg());
	detach_fast_path(&c);
	if (fdatasync(c.fd) && !ret) {
		fprintf(stderr, "encrypt: %s: %s\n", c.path, strerror(errno));
		ret = 1;
	}
	fprintf(stderr, "encrypt: reads=%" PRIu64 " writes=%" PRIu64
		" flushes=%" PRIu64 " discards=%" PRIu64 " zero_blocks=%" PRIu64
		" padded_blocks=%" PRIu64 " errors=%" PRIu64
		" helped=%" PRIu64 "\n",
		c.reads, c.writes, c.flushes, c.discards, c.zero_blocks,
		c.padded_blocks, c.errors, c.helped);
	par_stop();	/* before the key's wipe: helpers hold its schedule */
out:
	wipe_key(&c);
	if (c.fd >= 0)
		close(c.fd);
	free(c.holes);
	return ret;
}
