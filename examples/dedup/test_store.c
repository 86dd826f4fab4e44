// SPDX-License-Identifier: MIT
/*
 * test_store - the dedup store engine's tests, on the host, without hybd:
 * space accounting, reuse, concurrency, crashes between commits, and
 * damaged stores.  `make test-store` runs them in a temporary directory
 * ($TMPDIR or /tmp); each prints "ok <name>" or fails with a message.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store.h"

static char path[256];

/*
 * Power loss, simulated under the engine: the test is linked with
 * -Wl,--wrap=pwrite,--wrap=fdatasync, so every pwrite() of store.c comes
 * here first.  The first write to a 4 KiB page of the store after a
 * fdatasync() keeps the page's content from before it (zeros past the
 * end); power_loss() then reverts a random half of the pages written
 * since the last fdatasync(), as a page cache that wrote back some dirty
 * pages and lost the others would.
 */
ssize_t __real_pwrite(int fd, const void *buf, size_t n, off_t off);
int __real_fdatasync(int fd);

struct preimage {
	off_t page;
	char data[DD_BLOCK_SIZE];
};

static struct preimage *dirty_pages;
static size_t nr_dirty, dirty_room;
static ino_t store_ino;		/* 0: the simulation is off */

static bool is_store(int fd)
{
	struct stat st;

	return store_ino && !fstat(fd, &st) && st.st_ino == store_ino;
}

/*
 * And a write that fails, or a process that dies, at the store's pwrite()
 * number fail_pwrite_at or die_pwrite_at (counted in pwrites since the
 * simulation was turned on; 0: never).
 */
static unsigned int pwrites, fail_pwrite_at, die_pwrite_at;

ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	off_t page;
	size_t i;

	if (!is_store(fd))
		return __real_pwrite(fd, buf, n, off);
	pwrites++;
	if (pwrites == die_pwrite_at)
		raise(SIGKILL);
	if (pwrites == fail_pwrite_at) {
		errno = ENOSPC;
		return -1;
	}
	for (page = off / DD_BLOCK_SIZE * DD_BLOCK_SIZE; page < off + (off_t)n;
	     page += DD_BLOCK_SIZE) {
		for (i = 0; i < nr_dirty && dirty_pages[i].page != page; i++)
			;
		if (i < nr_dirty)
			continue;
		if (nr_dirty == dirty_room) {
			dirty_room = dirty_room ? 2 * dirty_room : 256;
			dirty_pages = realloc(dirty_pages,
					      dirty_room * sizeof(*dirty_pages));
			if (!dirty_pages)
				abort();
		}
		memset(dirty_pages[nr_dirty].data, 0, DD_BLOCK_SIZE);
		if (pread(fd, dirty_pages[nr_dirty].data, DD_BLOCK_SIZE, page) < 0)
			abort();
		dirty_pages[nr_dirty++].page = page;
	}
	return __real_pwrite(fd, buf, n, off);
}

static unsigned int crash_at, syncs;	/* lose power at sync number */
static bool fail_sync;			/* the next one fails with EIO */
static void crash_now(void);

int __wrap_fdatasync(int fd)
{
	if (!is_store(fd))
		return __real_fdatasync(fd);
	if (fail_sync) {
		fail_sync = false;
		errno = EIO;
		return -1;
	}
	if (crash_at && ++syncs == crash_at)
		crash_now();		/* does not return */
	nr_dirty = 0;
	return __real_fdatasync(fd);
}

/* Lose a random half of what was written since the last fdatasync(). */
static size_t power_loss(unsigned int *seed)
{
	int fd = open(path, O_RDWR);
	size_t i, lost = 0;

	if (fd < 0)
		abort();
	for (i = 0; i < nr_dirty; i++)
		if (rand_r(seed) % 2) {
			if (__real_pwrite(fd, dirty_pages[i].data, DD_BLOCK_SIZE,
					  dirty_pages[i].page) != DD_BLOCK_SIZE)
				abort();
			lost++;
		}
	nr_dirty = 0;
	close(fd);
	return lost;
}

static void __attribute__((noreturn, format(printf, 1, 2)))
die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "FAIL: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

#define CHECK(cond, ...) do { if (!(cond)) die(__VA_ARGS__); } while (0)
#define OK(call) do { int r_ = (call); \
	CHECK(!r_, "%s: %d (%s)", #call, r_, dd_errmsg()); } while (0)

/* Block content number @n: distinct for distinct n, never all zero. */
static void pattern(void *buf, uint64_t n)
{
	uint64_t *p = buf;
	unsigned int i;

	p[0] = n + 1;
	for (i = 1; i < DD_BLOCK_SIZE / 8; i++)
		p[i] = (n + 1) * 0x9e3779b97f4a7c15ULL + i;
}

static uint64_t content_of(const void *buf)
{
	const uint64_t *p = buf;
	char want[DD_BLOCK_SIZE];

	pattern(want, p[0] - 1);
	return memcmp(want, buf, sizeof(want)) ? UINT64_MAX : p[0] - 1;
}

static struct dd_store *fresh(uint64_t blocks)
{
	struct dd_store *s;

	unlink(path);
	OK(dd_format(path, blocks * DD_BLOCK_SIZE, 0));
	OK(dd_open(path, 0, &s));
	return s;
}

static uint64_t file_size(void)
{
	struct stat st;

	CHECK(!stat(path, &st), "stat %s", path);
	return st.st_size;
}

static long check_clean(void)
{
	struct dd_store *s;
	FILE *null = fopen("/dev/null", "w");
	long problems;

	OK(dd_open(path, DD_O_RDONLY, &s));
	problems = dd_check(s, null);
	fclose(null);
	dd_close(s);
	return problems;
}

/* Same content twice costs one chunk; zeros none; discards free them. */
static void test_accounting(void)
{
	char buf[DD_BLOCK_SIZE], got[DD_BLOCK_SIZE];
	struct dd_store *s = fresh(4096);
	struct dd_stats st;
	uint64_t i, size;

	for (i = 0; i < 1024; i++) {
		pattern(buf, i);
		OK(dd_write(s, i, buf));
		OK(dd_write(s, 2048 + i, buf));
	}
	memset(buf, 0, sizeof(buf));
	for (i = 1024; i < 2048; i++)
		OK(dd_write(s, i, buf));
	OK(dd_commit(s));
	dd_stats(s, &st);
	CHECK(st.mapped_blocks == 2048, "mapped %" PRIu64, st.mapped_blocks);
	CHECK(st.chunks_used == 1024, "chunks %" PRIu64, st.chunks_used);
	CHECK(st.zero_writes == 1024, "zero writes %" PRIu64, st.zero_writes);
	for (i = 0; i < 4096; i++) {
		OK(dd_read(s, i, got));
		if (i < 1024 || (i >= 2048 && i < 3072))
			pattern(buf, i % 2048);
		else
			memset(buf, 0, sizeof(buf));
		CHECK(!memcmp(buf, got, sizeof(buf)), "block %" PRIu64, i);
	}
	size = file_size();

	/* both copies gone: the chunks are free after the commit */
	OK(dd_write_hole(s, 0, 1024));
	OK(dd_write_hole(s, 2048, 1024));
	dd_stats(s, &st);
	CHECK(st.chunks_used == 0 && st.chunks_pending == 1024,
	      "used %" PRIu64 " pending %" PRIu64, st.chunks_used,
	      st.chunks_pending);
	/* new content reuses them without a flush: the writer commits */
	for (i = 0; i < 1024; i++) {
		pattern(buf, 5000 + i);
		OK(dd_write(s, i, buf));
	}
	OK(dd_commit(s));
	CHECK(file_size() == size, "the store grew: %" PRIu64 " -> %" PRIu64,
	      size, file_size());
	dd_close(s);
	CHECK(check_clean() == 0, "check after reuse");
	printf("ok accounting\n");
}

/* A commit keeps everything; reopening finds it, holes included. */
static void test_reopen(void)
{
	char buf[DD_BLOCK_SIZE], got[DD_BLOCK_SIZE];
	struct dd_store *s = fresh(3000);
	struct dd_stats st;
	uint64_t i;

	for (i = 0; i < 3000; i++) {
		pattern(buf, i % 700);
		OK(dd_write(s, i, buf));
	}
	OK(dd_write_hole(s, 100, 50));
	OK(dd_commit(s));
	dd_close(s);
	CHECK(dd_open(path, 0, &s) == 0, "reopen: %s", dd_errmsg());
	CHECK(dd_open(path, 0, &(struct dd_store *){ NULL }) == -EBUSY,
	      "a second opener is refused");
	dd_stats(s, &st);
	CHECK(st.mapped_blocks == 2950 && st.chunks_used == 700,
	      "mapped %" PRIu64 " used %" PRIu64, st.mapped_blocks,
	      st.chunks_used);
	for (i = 0; i < 3000; i++) {
		OK(dd_read(s, i, got));
		if (i >= 100 && i < 150) {
			CHECK(dd_is_hole(s, i), "block %" PRIu64 " hole", i);
			memset(buf, 0, sizeof(buf));
		} else {
			pattern(buf, i % 700);
		}
		CHECK(!memcmp(buf, got, sizeof(buf)), "block %" PRIu64, i);
	}
	dd_close(s);
	printf("ok reopen\n");
}

/* Threads write their own blocks with shared contents, commits run. */
#define THREADS		4
#define PER_THREAD	512

struct worker {
	struct dd_store *s;
	unsigned int id;
	uint64_t last[PER_THREAD];
};

static void *work(void *arg)
{
	struct worker *w = arg;
	char buf[DD_BLOCK_SIZE], got[DD_BLOCK_SIZE];
	unsigned int seed = w->id, i;

	for (i = 0; i < 20000; i++) {
		uint64_t slot = rand_r(&seed) % PER_THREAD;
		uint64_t blk = slot * THREADS + w->id;

		if (rand_r(&seed) % 4 == 0) {
			OK(dd_read(w->s, blk, got));
			if (w->last[slot] == UINT64_MAX) {
				memset(buf, 0, sizeof(buf));
			} else {
				pattern(buf, w->last[slot]);
			}
			CHECK(!memcmp(buf, got, sizeof(buf)),
			      "thread %u block %" PRIu64, w->id, blk);
		} else if (rand_r(&seed) % 10 == 0) {
			OK(dd_write_hole(w->s, blk, 1));
			w->last[slot] = UINT64_MAX;
		} else {
			w->last[slot] = rand_r(&seed) % 300;
			pattern(buf, w->last[slot]);
			OK(dd_write(w->s, blk, buf));
		}
		if (i % 2000 == 0)
			OK(dd_commit(w->s));
	}
	return NULL;
}

/*
 * Unique overwrites from 8 threads on a small store fill its data area
 * again and again: a writer that finds no free chunk while another
 * commits must wait for that commit, not fail with ENOSPC.
 */
struct churner {
	struct dd_store *s;
	unsigned int id;
};

static void *churn(void *arg)
{
	struct churner *c = arg;
	char buf[DD_BLOCK_SIZE];
	unsigned int round, i;

	for (round = 0; round < 100; round++)
		for (i = 0; i < 32; i++) {
			pattern(buf, 1000000 + ((uint64_t)c->id << 20) +
				round * 32 + i);
			OK(dd_write(c->s, c->id * 32 + i, buf));
		}
	return NULL;
}

static void test_full_churn(void)
{
	struct dd_store *s = fresh(256);
	struct churner c[8];
	pthread_t t[8];
	unsigned int i;

	for (i = 0; i < 8; i++) {
		c[i].s = s;
		c[i].id = i;
		pthread_create(&t[i], NULL, churn, &c[i]);
	}
	for (i = 0; i < 8; i++)
		pthread_join(t[i], NULL);
	OK(dd_commit(s));
	dd_close(s);
	CHECK(check_clean() == 0, "check after the churn");
	printf("ok full churn\n");
}

static void test_threads(void)
{
	struct dd_store *s = fresh(THREADS * PER_THREAD);
	struct worker w[THREADS];
	pthread_t t[THREADS];
	struct dd_stats st;
	unsigned int i;

	for (i = 0; i < THREADS; i++) {
		w[i].s = s;
		w[i].id = i;
		memset(w[i].last, 0xff, sizeof(w[i].last));
		pthread_create(&t[i], NULL, work, &w[i]);
	}
	for (i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	OK(dd_commit(s));
	dd_stats(s, &st);
	CHECK(st.chunks_used <= 300, "%" PRIu64 " chunks for 300 contents",
	      st.chunks_used);
	dd_close(s);
	CHECK(check_clean() == 0, "check after the threads");
	printf("ok threads (%" PRIu64 " commits)\n", st.commits);
}

/*
 * A child commits generation A, then writes generation B without a
 * commit and is killed at a random moment: every block reads A or B
 * (the allocator's own commits may have kept some of B), never anything
 * else, and the store checks clean.
 */
static void test_kill(void)
{
	const uint64_t blocks = 2048;
	char buf[DD_BLOCK_SIZE];
	unsigned int round;

	for (round = 0; round < 10; round++) {
		struct dd_store *s = fresh(blocks);
		uint64_t i, a = 0, b = 0;
		pid_t pid;
		int status;

		for (i = 0; i < blocks; i++) {
			pattern(buf, i);
			OK(dd_write(s, i, buf));
		}
		OK(dd_commit(s));
		dd_close(s);

		pid = fork();
		if (!pid) {
			OK(dd_open(path, 0, &s));
			for (i = 0;; i = (i + 7) % blocks) {
				pattern(buf, blocks + i);
				OK(dd_write(s, i, buf));
				if (i % 64 == 3)
					OK(dd_write_hole(s, i, 1));
			}
		}
		usleep(20000 + rand() % 200000);
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		CHECK(WIFSIGNALED(status), "the child died of itself");

		OK(dd_open(path, 0, &s));
		for (i = 0; i < blocks; i++) {
			uint64_t n;

			OK(dd_read(s, i, buf));
			if (dd_is_hole(s, i)) {
				b++;
				continue;
			}
			n = content_of(buf);
			CHECK(n == i || n == blocks + i,
			      "round %u block %" PRIu64 ": content %" PRIu64,
			      round, i, n);
			n == i ? a++ : b++;
		}
		dd_close(s);
		CHECK(check_clean() == 0, "check after kill %u", round);
		printf("ok kill %u (%" PRIu64 " old, %" PRIu64 " new)\n", round,
		       a, b);
	}
}

/*
 * Power loss in a child that writes, overwrites and punches holes with
 * shared contents, commits now and then (the allocator commits on its
 * own too), and loses power at a random fdatasync() -- before a commit's
 * data is durable, or between its map writes and the end -- or at the
 * end.  Afterwards every block reads its content at the last completed
 * commit or one written after it, never anything else, and the store
 * checks clean.
 */
#define PL_BLOCKS	1024
#define PL_CONTENTS	4000

struct pl_state {
	/* per block: the content at the last commit (0: a hole), and the
	 * contents written since (bit n: content n, bit 0: a hole)
	 */
	uint64_t committed[PL_BLOCKS];
	uint8_t since[PL_BLOCKS][PL_CONTENTS / 8 + 1];
	uint64_t ops, lost;
};

static unsigned int pl_seed;
static struct pl_state *pl;

static void crash_now(void)
{
	pl->lost = power_loss(&pl_seed);
	_exit(0);
}

static void pl_child(void)
{
	char buf[DD_BLOCK_SIZE];
	struct dd_store *s;
	uint64_t i, blk, n;
	struct stat st;

	OK(dd_open(path, 0, &s));
	CHECK(!stat(path, &st), "stat");
	store_ino = st.st_ino;
	for (i = 0; i < pl->ops; i++) {
		blk = rand_r(&pl_seed) % PL_BLOCKS;
		n = rand_r(&pl_seed) % (PL_CONTENTS + 1);
		if (n == PL_CONTENTS) {
			n = 0;
			OK(dd_write_hole(s, blk, 1));
		} else {
			pattern(buf, ++n);
			OK(dd_write(s, blk, buf));
		}
		pl->since[blk][n / 8] |= 1 << (n % 8);
		if (rand_r(&pl_seed) % 500 == 0) {
			OK(dd_commit(s));
			/* what the map says now is the durable state */
			for (blk = 0; blk < PL_BLOCKS; blk++) {
				OK(dd_read(s, blk, buf));
				pl->committed[blk] = dd_is_hole(s, blk) ? 0 :
						     content_of(buf);
				memset(pl->since[blk], 0, sizeof(pl->since[blk]));
			}
		}
	}
	crash_now();
}

static void test_power_loss(void)
{
	char buf[DD_BLOCK_SIZE];
	unsigned int round, mid = 0;
	uint64_t blk, n;

	pl = mmap(NULL, sizeof(*pl), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(pl != MAP_FAILED, "mmap");
	for (round = 0; round < 30; round++) {
		struct dd_store *s = fresh(PL_BLOCKS);
		int status;
		pid_t pid;

		memset(pl, 0, sizeof(*pl));
		for (blk = 0; blk < PL_BLOCKS; blk++) {
			pl->committed[blk] = 1 + rand() % PL_CONTENTS;
			pattern(buf, pl->committed[blk]);
			OK(dd_write(s, blk, buf));
		}
		OK(dd_commit(s));
		dd_close(s);
		pl->ops = 1000 + rand() % 6000;
		pl_seed = rand();
		/* a commit is two fdatasync()s; 0: only at the end */
		crash_at = round % 3 ? 1 + rand() % 24 : 0;
		syncs = 0;

		pid = fork();
		if (!pid)
			pl_child();
		waitpid(pid, &status, 0);
		CHECK(WIFEXITED(status) && !WEXITSTATUS(status),
		      "round %u: the child failed", round);

		OK(dd_open(path, 0, &s));
		for (blk = 0; blk < PL_BLOCKS; blk++) {
			OK(dd_read(s, blk, buf));
			n = dd_is_hole(s, blk) ? 0 : content_of(buf);
			CHECK(n != UINT64_MAX, "round %u block %" PRIu64
			      ": garbage after power loss", round, blk);
			CHECK(n == pl->committed[blk] ||
			      (pl->since[blk][n / 8] & (1 << (n % 8))),
			      "round %u block %" PRIu64 ": content %" PRIu64
			      ", committed %" PRIu64, round, blk, n,
			      pl->committed[blk]);
		}
		dd_close(s);
		CHECK(check_clean() == 0, "check after power loss %u", round);
		mid += crash_at != 0;
	}
	printf("ok power loss (30 rounds, %u of them in the middle of a run)\n",
	       mid);
	munmap(pl, sizeof(*pl));
}

static void patch(off_t off, const void *bytes, size_t len);

/*
 * A failed fdatasync() may have dropped dirty pages for good: the store
 * takes no change after it, and a new open starts from the durable map.
 */
static void test_sync_failure(void)
{
	char buf[DD_BLOCK_SIZE], got[DD_BLOCK_SIZE];
	struct dd_store *s = fresh(64);
	struct stat st;

	pattern(buf, 1);
	OK(dd_write(s, 0, buf));
	OK(dd_commit(s));
	CHECK(!stat(path, &st), "stat");
	store_ino = st.st_ino;
	pattern(buf, 2);
	OK(dd_write(s, 1, buf));
	fail_sync = true;
	CHECK(dd_commit(s) == -EIO, "the commit reports the failed sync");
	CHECK(dd_write(s, 2, buf) == -EIO, "a write after it: %s",
	      dd_errmsg());
	CHECK(dd_write_hole(s, 0, 1) == -EIO, "a discard after it");
	CHECK(dd_commit(s) == -EIO, "a commit after it");
	store_ino = 0;
	nr_dirty = 0;	/* no later test's power_loss() reverts this store's */
	dd_close(s);
	OK(dd_open(path, 0, &s));
	pattern(buf, 1);
	OK(dd_read(s, 0, got));
	CHECK(!memcmp(buf, got, sizeof(buf)), "the committed block");
	CHECK(dd_is_hole(s, 1), "the block the failed commit would have kept");
	OK(dd_write(s, 1, buf));
	OK(dd_commit(s));
	dd_close(s);
	printf("ok sync failure\n");
}

/*
 * A commit cut short between its map pages: content P moved from block
 * 1024 (map page 1, not written) to block 0 (page 0, written), so the
 * durable map has P in two chunks.  check calls it a note, not damage;
 * the next open merges the two, and its commit makes that durable.
 */
static void test_torn_duplicate(void)
{
	char buf[DD_BLOCK_SIZE], got[DD_BLOCK_SIZE], page1[DD_BLOCK_SIZE];
	struct dd_store *s = fresh(4096);
	struct dd_stats st;
	const off_t page1_off = 4096 + 4096;	/* map_off + one page */
	int fd;

	pattern(buf, 1);
	OK(dd_write(s, 1024, buf));
	OK(dd_commit(s));
	fd = open(path, O_RDONLY);
	CHECK(pread(fd, page1, sizeof(page1), page1_off) == sizeof(page1),
	      "read map page 1");
	close(fd);
	pattern(buf, 2);
	OK(dd_write(s, 1024, buf));
	pattern(buf, 1);
	OK(dd_write(s, 0, buf));
	OK(dd_commit(s));
	dd_close(s);
	patch(page1_off, page1, sizeof(page1));

	CHECK(check_clean() == 0, "a cut-short commit is not damage");
	OK(dd_open(path, 0, &s));
	dd_stats(s, &st);
	CHECK(st.chunks_used == 1 && st.chunks_pending == 1,
	      "merged: used %" PRIu64 " pending %" PRIu64, st.chunks_used,
	      st.chunks_pending);
	OK(dd_read(s, 0, got));
	CHECK(!memcmp(buf, got, sizeof(buf)), "block 0");
	OK(dd_read(s, 1024, got));
	CHECK(!memcmp(buf, got, sizeof(buf)), "block 1024");
	OK(dd_commit(s));
	dd_close(s);
	OK(dd_open(path, DD_O_RDONLY, &s));
	dd_stats(s, &st);
	CHECK(st.chunks_used == 1, "one chunk after the merge's commit");
	dd_close(s);
	printf("ok torn duplicate\n");
}

static void patch(off_t off, const void *bytes, size_t len)
{
	int fd = open(path, O_RDWR);

	CHECK(fd >= 0 && pwrite(fd, bytes, len, off) == (ssize_t)len,
	      "patching %s", path);
	close(fd);
}

static void expect_open_fails(int err, const char *words)
{
	struct dd_store *s;
	int ret = dd_open(path, 0, &s);

	CHECK(ret == err, "open: %d, wanted %d (%s)", ret, err, dd_errmsg());
	CHECK(strstr(dd_errmsg(), words), "message \"%s\" lacks \"%s\"",
	      dd_errmsg(), words);
}

static void test_damage(void)
{
	char buf[DD_BLOCK_SIZE];
	struct dd_store *s = fresh(1024);
	uint32_t bad = 999999;
	FILE *null;
	uint64_t i;

	for (i = 0; i < 64; i++) {
		pattern(buf, i);
		OK(dd_write(s, i, buf));
	}
	OK(dd_commit(s));
	dd_close(s);

	/* a chunk's content changes behind the store's back */
	patch(4096 + 1024 * 4 + ((1024 + 1024) * 32 + 4095) / 4096 * 4096 + 17,
	      "X", 1);
	CHECK(check_clean() == 1, "a damaged chunk is one problem");

	/* a map entry points past the end */
	patch(4096 + 5 * 4, &bad, 4);
	expect_open_fails(-EUCLEAN, "past the end");
	OK(dd_open(path, DD_O_RDONLY, &s));
	null = fopen("/dev/null", "w");
	CHECK(dd_check(s, null) == 2, "check: bad entry + bad chunk");
	fclose(null);
	dd_close(s);

	/* the superblock */
	patch(8, "\x02\0\0\0", 4);
	expect_open_fails(-EUCLEAN, "checksum");
	CHECK(truncate(path, 2048) == 0, "truncate");
	expect_open_fails(-EUCLEAN, "truncated");
	s = fresh(16);
	dd_close(s);
	patch(0, "NOTASTORE", 9);
	expect_open_fails(-EINVAL, "not a dedup store");

	/* a version from the future, with a valid checksum */
	s = fresh(16);
	dd_close(s);
	{
		/* the version is at byte 8, the crc of bytes 0-83 at 84 */
		char sb[88];
		int fd = open(path, O_RDWR);
		uint32_t v = 2, crc;
		extern unsigned long crc32(unsigned long, const unsigned char *,
					   unsigned int);

		CHECK(pread(fd, sb, sizeof(sb), 0) == sizeof(sb), "read sb");
		memcpy(sb + 8, &v, 4);
		crc = crc32(0, (unsigned char *)sb, 84);
		memcpy(sb + 84, &crc, 4);
		CHECK(pwrite(fd, sb, sizeof(sb), 0) == sizeof(sb), "write sb");
		close(fd);
	}
	expect_open_fails(-EPROTO, "format version 2");

	/* format refuses a store without --force */
	CHECK(dd_format(path, 1 << 20, 0) == -EEXIST, "format over a store");
	OK(dd_format(path, 1 << 20, DD_F_FORCE));

	/* a short file that is no store is not called a truncated one */
	CHECK(truncate(path, 0) == 0, "truncate");
	patch(0, "hello\n", 6);
	expect_open_fails(-EINVAL, "not a dedup store");

	printf("ok damage\n");
}

/* The store's chunk id of block @blk (0: a hole). */
static uint64_t chunk_of(struct dd_store *s, uint64_t blk)
{
	uint64_t off = dd_block_offset(s, blk);

	return off ? (off - dd_block_offset(s, 0)) / DD_BLOCK_SIZE : UINT64_MAX;
}

/*
 * How many of blocks @blk..+@n lie in consecutive chunks, in their order,
 * from the first on.
 */
static uint64_t run_of(struct dd_store *s, uint64_t blk, uint64_t n)
{
	uint64_t first = dd_block_offset(s, blk), i;

	for (i = 0; i < n; i++)
		if (!first || dd_block_offset(s, blk + i) !=
			      first + i * DD_BLOCK_SIZE)
			break;
	return i;
}

static bool consecutive(struct dd_store *s, uint64_t blk, uint64_t n)
{
	return run_of(s, blk, n) == n;
}

/* Every chunk is in use, free or pending, once. */
static void check_chunks_add_up(struct dd_store *s, const char *when)
{
	struct dd_stats st;

	dd_stats(s, &st);
	CHECK(st.chunks_used + st.chunks_free + st.chunks_pending ==
	      st.chunks_capacity, "%s: %" PRIu64 " used + %" PRIu64
	      " free + %" PRIu64 " pending != %" PRIu64, when, st.chunks_used,
	      st.chunks_free, st.chunks_pending, st.chunks_capacity);
}

/*
 * 128 KiB writes of new data, as the server gets them: 4 handler threads
 * of each of 2 queues write 32-block requests at once.  Each request's
 * blocks lie in consecutive chunks of the store (what the fast path needs
 * to remap a read of them), on a fresh store and when reusing freed
 * chunks.  (With a chunk per block, as before, no request of 8 threads
 * did, and no reused one even of one thread: the free stack gave freed
 * chunks back in the reverse order.)
 */
#define EXT_BLOCKS	32
#define EXT_THREADS	8
#define EXT_COUNT	64	/* 8 MiB */

struct extent_writer {
	struct dd_store *s;
	_Atomic unsigned int *next;
	uint64_t gen;
};

static void *write_extents(void *arg)
{
	struct extent_writer *w = arg;
	static __thread char buf[EXT_BLOCKS * DD_BLOCK_SIZE];
	unsigned int e, i;

	while ((e = (*w->next)++) < EXT_COUNT) {
		for (i = 0; i < EXT_BLOCKS; i++)
			pattern(buf + i * DD_BLOCK_SIZE,
				w->gen + e * EXT_BLOCKS + i);
		OK(dd_write_extent(w->s, (uint64_t)e * EXT_BLOCKS, EXT_BLOCKS,
				   buf));
	}
	return NULL;
}

static void extents_generation(struct dd_store *s, uint64_t gen)
{
	struct extent_writer w[EXT_THREADS];
	pthread_t t[EXT_THREADS];
	_Atomic unsigned int next = 0;
	char got[DD_BLOCK_SIZE];
	unsigned int i;
	uint64_t blk;

	for (i = 0; i < EXT_THREADS; i++) {
		w[i] = (struct extent_writer){ s, &next, gen };
		pthread_create(&t[i], NULL, write_extents, &w[i]);
	}
	for (i = 0; i < EXT_THREADS; i++)
		pthread_join(t[i], NULL);
	for (i = 0; i < EXT_COUNT; i++) {
		uint64_t n = run_of(s, i * EXT_BLOCKS, EXT_BLOCKS);

		CHECK(n == EXT_BLOCKS, "generation %" PRIu64 ": request %u is "
		      "not one extent: block %" PRIu64 " at chunk %" PRIu64
		      ", block %" PRIu64 " at chunk %" PRIu64, gen, i,
		      i * EXT_BLOCKS + n - 1,
		      chunk_of(s, i * EXT_BLOCKS + n - 1), i * EXT_BLOCKS + n,
		      chunk_of(s, i * EXT_BLOCKS + n));
	}
	for (blk = 0; blk < EXT_COUNT * EXT_BLOCKS; blk++) {
		OK(dd_read(s, blk, got));
		CHECK(content_of(got) == gen + blk, "generation %" PRIu64
		      " block %" PRIu64 ": content %" PRIu64, gen, blk,
		      content_of(got));
	}
}

static void test_extents(void)
{
	const uint64_t blocks = EXT_COUNT * EXT_BLOCKS;
	char buf[EXT_BLOCKS * DD_BLOCK_SIZE], got[DD_BLOCK_SIZE];
	struct dd_store *s = fresh(blocks + 64);
	struct dd_stats st, st0;
	uint64_t i, c;

	extents_generation(s, 0);
	OK(dd_commit(s));
	/*
	 * overwritten: new chunks, then (once RECLAIM_MIN wait) the old ones
	 * a writer's commit frees
	 */
	extents_generation(s, 100000);
	OK(dd_commit(s));
	/*
	 * and reused, as runs again (whether the store grows meanwhile, up to
	 * RECLAIM_MIN chunks, depends on when the writers find the free
	 * chunks gone: test_accounting checks the policy)
	 */
	extents_generation(s, 200000);
	OK(dd_commit(s));
	dd_stats(s, &st);
	CHECK(st.chunks_used == blocks && st.mapped_blocks == blocks,
	      "used %" PRIu64 " mapped %" PRIu64, st.chunks_used,
	      st.mapped_blocks);
	check_chunks_add_up(s, "after the generations");

	/*
	 * One request of everything: a duplicate of stored content (block
	 * 0's), zeros, new content twice, new content: the new contents
	 * take consecutive chunks in the order of their first blocks, the
	 * rest take none.
	 */
	dd_stats(s, &st0);
	for (i = 0; i < EXT_BLOCKS; i++)
		pattern(buf + i * DD_BLOCK_SIZE, 900000 + i);
	pattern(buf + 3 * DD_BLOCK_SIZE, 200000);	/* block 0's */
	memset(buf + 5 * DD_BLOCK_SIZE, 0, 2 * DD_BLOCK_SIZE);
	pattern(buf + 9 * DD_BLOCK_SIZE, 900000 + 8);	/* as block 8 */
	OK(dd_write_extent(s, blocks, EXT_BLOCKS, buf));
	dd_stats(s, &st);
	CHECK(st.chunks_used == st0.chunks_used + EXT_BLOCKS - 4 &&
	      st.dedup_hits == st0.dedup_hits + 2 &&
	      st.zero_writes == st0.zero_writes + 2,
	      "mixed: %" PRIu64 " new chunks, %" PRIu64 " hits, %" PRIu64
	      " zeros", st.chunks_used - st0.chunks_used,
	      st.dedup_hits - st0.dedup_hits,
	      st.zero_writes - st0.zero_writes);
	CHECK(chunk_of(s, blocks + 3) == chunk_of(s, 0) &&
	      chunk_of(s, blocks + 9) == chunk_of(s, blocks + 8) &&
	      dd_is_hole(s, blocks + 5) && dd_is_hole(s, blocks + 6),
	      "mixed: duplicates and zeros");
	for (i = 0, c = chunk_of(s, blocks); i < EXT_BLOCKS; i++) {
		if (i == 3 || i == 5 || i == 6 || i == 9)
			continue;
		CHECK(chunk_of(s, blocks + i) == c, "mixed: block %" PRIu64
		      " at chunk %" PRIu64 ", not %" PRIu64, i,
		      chunk_of(s, blocks + i), c);
		c++;
	}
	for (i = 0; i < EXT_BLOCKS; i++) {
		OK(dd_read(s, blocks + i, got));
		CHECK(!memcmp(got, buf + i * DD_BLOCK_SIZE, DD_BLOCK_SIZE),
		      "mixed: block %" PRIu64, i);
	}
	check_chunks_add_up(s, "after the mixed request");
	OK(dd_commit(s));
	dd_close(s);
	CHECK(check_clean() == 0, "check after the extents");
	printf("ok extents\n");
}

/*
 * A run taken and not used.  In the server: a write that fails (here the
 * 20th of its 64 chunk writes, ENOSPC) maps nothing, drops the references
 * it took and gives back every chunk of its run, which the next write
 * takes whole again.  In a crash: a process killed in the middle of
 * writing a run (its chunks written, nothing pointing at them) leaves a
 * store that opens with every chunk either in use by the committed map or
 * free -- none lost, none used twice -- and checks clean.
 */
static void test_run_unused(void)
{
	const uint64_t blocks = 256;
	char buf[EXT_BLOCKS * DD_BLOCK_SIZE], got[DD_BLOCK_SIZE];
	struct dd_store *s = fresh(blocks);
	struct dd_stats st0, st;
	unsigned int round;
	uint64_t i, first;
	struct stat fst;
	pid_t pid;
	int status;

	for (i = 0; i < EXT_BLOCKS; i++)
		pattern(buf + i * DD_BLOCK_SIZE, i);
	OK(dd_write_extent(s, 0, EXT_BLOCKS, buf));
	OK(dd_commit(s));
	/* a failed write: block 0 a duplicate, the rest new */
	for (i = 1; i < EXT_BLOCKS; i++)
		pattern(buf + i * DD_BLOCK_SIZE, 1000 + i);
	dd_stats(s, &st0);
	CHECK(!stat(path, &fst), "stat");
	store_ino = fst.st_ino;
	pwrites = 0;
	fail_pwrite_at = 20;
	CHECK(dd_write_extent(s, EXT_BLOCKS, EXT_BLOCKS, buf) == -ENOSPC,
	      "the write fails: %s", dd_errmsg());
	fail_pwrite_at = 0;
	/* off, and nothing of this store is lost by a later power_loss() */
	store_ino = 0;
	nr_dirty = 0;
	dd_stats(s, &st);
	CHECK(st.chunks_used == st0.chunks_used &&
	      st.chunks_free == st0.chunks_free &&
	      st.chunks_pending == st0.chunks_pending &&
	      st.mapped_blocks == st0.mapped_blocks,
	      "a failed write changed the accounting: used %" PRIu64
	      " free %" PRIu64 " pending %" PRIu64 " mapped %" PRIu64,
	      st.chunks_used, st.chunks_free, st.chunks_pending,
	      st.mapped_blocks);
	for (i = EXT_BLOCKS; i < 2 * EXT_BLOCKS; i++)
		CHECK(dd_is_hole(s, i), "block %" PRIu64 " mapped by a failed write", i);
	OK(dd_write_extent(s, EXT_BLOCKS, EXT_BLOCKS, buf));
	CHECK(consecutive(s, EXT_BLOCKS + 1, EXT_BLOCKS - 1) &&
	      chunk_of(s, EXT_BLOCKS + 1) == EXT_BLOCKS,
	      "the run given back is taken again whole: block %d at chunk %"
	      PRIu64, EXT_BLOCKS + 1, chunk_of(s, EXT_BLOCKS + 1));
	OK(dd_commit(s));
	check_chunks_add_up(s, "after the failed write");
	dd_close(s);
	CHECK(check_clean() == 0, "check after the failed write");

	for (round = 0; round < 4; round++) {
		/* killed in its runs' chunk writes or a commit: pwrite 1..195 */
		unsigned int at = 1 + rand() % (3 * (2 * EXT_BLOCKS + 1));

		fflush(stdout);
		pid = fork();
		if (!pid) {
			OK(dd_open(path, 0, &s));
			CHECK(!stat(path, &fst), "stat");
			store_ino = fst.st_ino;
			pwrites = 0;
			die_pwrite_at = at;
			/* three requests over blocks 64..159: 96 new chunks */
			for (first = 0; first < 3 * EXT_BLOCKS;
			     first += EXT_BLOCKS) {
				for (i = 0; i < EXT_BLOCKS; i++)
					pattern(buf + i * DD_BLOCK_SIZE,
						10000 * (round + 1) + first + i);
				OK(dd_write_extent(s, 2 * EXT_BLOCKS + first,
						   EXT_BLOCKS, buf));
				OK(dd_commit(s));	/* a map page */
			}
			_exit(0);	/* not reached: 195 pwrites */
		}
		waitpid(pid, &status, 0);
		CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		      "round %u: the child was not killed at pwrite %u", round,
		      at);
		CHECK(check_clean() == 0, "check after a kill in a run");
		OK(dd_open(path, 0, &s));
		check_chunks_add_up(s, "reopened after a kill in a run");
		dd_stats(s, &st);
		/*
		 * the requests committed before the kill, whole (one map
		 * page), and nothing of the others; block EXT_BLOCKS has
		 * block 0's content
		 */
		CHECK(st.mapped_blocks % EXT_BLOCKS == 0 &&
		      st.mapped_blocks >= 2 * EXT_BLOCKS &&
		      st.chunks_used == st.mapped_blocks - 1,
		      "round %u: %" PRIu64 " mapped, %" PRIu64 " used", round,
		      st.mapped_blocks, st.chunks_used);
		for (i = 2 * EXT_BLOCKS; i < blocks; i++) {
			OK(dd_read(s, i, got));
			CHECK(i < st.mapped_blocks ?
			      content_of(got) == 10000 * (round + 1) + i -
						 2 * EXT_BLOCKS :
			      dd_is_hole(s, i), "round %u: block %" PRIu64
			      " after the kill", round, i);
		}
		/*
		 * Fill the device with new content: every chunk the dead run
		 * took is free again, none is given twice (every block reads
		 * its own content, the committed ones included).
		 */
		for (first = 2 * EXT_BLOCKS; first < blocks;
		     first += EXT_BLOCKS) {
			for (i = 0; i < EXT_BLOCKS; i++)
				pattern(buf + i * DD_BLOCK_SIZE,
					50000 * (round + 1) + first + i);
			OK(dd_write_extent(s, first, EXT_BLOCKS, buf));
			CHECK(consecutive(s, first, EXT_BLOCKS),
			      "round %u: request at %" PRIu64 " is not one extent",
			      round, first);
		}
		for (i = 0; i < blocks; i++) {
			uint64_t want = i <= EXT_BLOCKS ? i % EXT_BLOCKS :
					i < 2 * EXT_BLOCKS ? 1000 + i - EXT_BLOCKS :
					50000 * (round + 1) + i;

			OK(dd_read(s, i, got));
			CHECK(content_of(got) == want, "round %u block %" PRIu64
			      ": content %" PRIu64 ", not %" PRIu64, round, i,
			      content_of(got), want);
		}
		/* and back to the committed state for the next round */
		OK(dd_write_hole(s, 2 * EXT_BLOCKS, blocks - 2 * EXT_BLOCKS));
		OK(dd_commit(s));
		check_chunks_add_up(s, "after refilling");
		dd_close(s);
		CHECK(check_clean() == 0, "check after refilling");
		printf("ok run unused: killed at pwrite %u, %" PRIu64
		       " blocks committed\n", at, st.mapped_blocks);
	}
	printf("ok run unused\n");
}

static const struct {
	const char *name;
	void (*fn)(void);
} tests[] = {
	{ "extents", test_extents },
	{ "run_unused", test_run_unused },
	{ "accounting", test_accounting },
	{ "reopen", test_reopen },
	{ "threads", test_threads },
	{ "full_churn", test_full_churn },
	{ "kill", test_kill },
	{ "power_loss", test_power_loss },
	{ "damage", test_damage },
	{ "torn_duplicate", test_torn_duplicate },
	{ "sync_failure", test_sync_failure },
};

/* test_store [NAME...]: the tests named, or all of them */
int main(int argc, char **argv)
{
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	unsigned int i;
	int a;

	snprintf(path, sizeof(path), "%s/test_store.%d", tmp, getpid());
	srand(time(NULL));
	for (i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		for (a = 1; a < argc && strcmp(argv[a], tests[i].name); a++)
			;
		if (argc == 1 || a < argc)
			tests[i].fn();
	}
	unlink(path);
	printf("all store tests passed\n");
	return 0;
}
