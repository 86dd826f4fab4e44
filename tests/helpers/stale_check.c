// SPDX-License-Identifier: GPL-2.0
/*
 * stale_check - concurrent overlapping reads and writes on a small hot
 * range of a block device, checking that no read returns data older than
 * a write that had completed before the read was issued.
 *
 *   stale_check DEV [--blocks K] [--offset BYTES] [--writers W]
 *               [--readers R] [--seconds S] [--max-reads N]
 *               [--stop-after-stale N] [--write-delay-us U] [--seed N]
 *               [--read-blocks N]
 *
 * Every 4 KiB block of the range holds (magic, block number, generation)
 * and a payload derived from both.  Block b belongs to writer b % W, so
 * each block's generations strictly increase; a writer publishes
 * completed[b] = g once pwrite() of generation g has returned.  A reader
 * takes lo = completed[b] BEFORE it issues pread(), and then:
 *
 *   STALE    the generation read is below lo: the device returned data
 *            that a completed write had replaced;
 *   TORN     the block mixes generations, and a write of it was in
 *            flight during the read: allowed, only counted;
 *   CORRUPT  the magic, block number or payload is wrong although no
 *            write was in flight, or the generation was never issued.
 *
 * With --read-blocks N (at most 32), each read covers N consecutive blocks
 * of the range in one request, and each block of it is judged on its own:
 * what a fast path that serves multi-block reads must get right.
 *
 * Threads are spread over the online CPUs (readers and writers on each),
 * so that with one hardware queue per CPU a write can be served on one
 * queue while a read of the same block is in flight on another.
 *
 * Prints "reads=N writes=M stale=S corrupt=C torn=T errors=E seconds=T";
 * exits 0 if all is well, 3 if it saw stale reads (and nothing corrupt),
 * 4 if it saw corrupt blocks, 1 on an I/O error or bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK		4096U
#define MAGIC		0x68796264636b3031ULL	/* "hybdck01" */
#define MAX_THREADS	64
#define MAX_REPORTS	10

struct block_hdr {
	uint64_t magic;
	uint64_t blk;
	uint64_t gen;
	uint64_t reserved;
};

struct cfg {
	const char *dev;
	uint64_t first_blk;	/* absolute block number of the range */
	unsigned int blocks;
	unsigned int writers;
	unsigned int readers;
	double seconds;
	uint64_t max_reads;
	uint64_t stop_after_stale;
	unsigned int write_delay_us;
	uint64_t seed;
	unsigned int read_blocks;	/* blocks per read */
};

static struct cfg cfg = {
	.blocks = 32,
	.writers = 2,
	.readers = 2,
	.seconds = 10,
	.seed = 1,
	.read_blocks = 1,
};

static int dev_fd;
static atomic_bool stop;
/* per block: last generation whose pwrite() returned, and last issued */
static _Atomic uint64_t *completed;
static _Atomic uint64_t *issued;

static atomic_ulong nr_reads, nr_writes, nr_stale, nr_torn, nr_corrupt;
static atomic_ulong nr_errors;
static atomic_uint nr_reports;

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* The content of generation @gen of block @blk. */
static void fill_block(uint64_t *buf, uint64_t blk, uint64_t gen)
{
	struct block_hdr *h = (struct block_hdr *)buf;
	uint64_t x = (blk << 32) ^ gen ^ MAGIC;
	size_t i;

	h->magic = MAGIC;
	h->blk = blk;
	h->gen = gen;
	h->reserved = 0;
	for (i = sizeof(*h) / 8; i < BLOCK / 8; i++)
		buf[i] = splitmix64(&x);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void report(const char *what, uint64_t blk, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void report(const char *what, uint64_t blk, const char *fmt, ...)
{
	va_list ap;

	if (atomic_fetch_add(&nr_reports, 1) >= MAX_REPORTS)
		return;
	fprintf(stderr, "stale_check: %s block %" PRIu64 ": ", what, blk);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void *alloc_block(void)
{
	void *p;

	if (posix_memalign(&p, BLOCK, BLOCK))
		return NULL;
	return p;
}

static bool io_blocks(bool write, void *buf, uint64_t blk, unsigned int nr)
{
	off_t off = (off_t)blk * BLOCK;
	size_t len = (size_t)nr * BLOCK;
	ssize_t n;

	do {
		n = write ? pwrite(dev_fd, buf, len, off) :
			    pread(dev_fd, buf, len, off);
	} while (n < 0 && errno == EINTR);
	if (n == (ssize_t)len)
		return true;
	fprintf(stderr, "stale_check: %s block %" PRIu64 ": %s\n",
		write ? "pwrite" : "pread", blk,
		n < 0 ? strerror(errno) : "short transfer");
	atomic_fetch_add(&nr_errors, 1);
	atomic_store(&stop, true);
	return false;
}

static bool io_block(bool write, void *buf, uint64_t blk)
{
	return io_blocks(write, buf, blk, 1);
}

struct thread {
	pthread_t tid;
	unsigned int idx;	/* writer or reader number */
	unsigned int cpu;
	bool writer;
	uint64_t rng;
};

static void pin(unsigned int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	/* best effort: a CPU may be offline or outside our cpuset */
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void *writer(void *arg)
{
	struct thread *t = arg;
	uint64_t *buf = alloc_block();
	unsigned int own = (cfg.blocks - t->idx + cfg.writers - 1) / cfg.writers;

	if (!buf)
		return NULL;
	pin(t->cpu);
	while (!atomic_load(&stop)) {
		unsigned int i = t->idx + cfg.writers *
				 (unsigned int)(splitmix64(&t->rng) % own);
		uint64_t gen = atomic_load(&issued[i]) + 1;

		fill_block(buf, cfg.first_blk + i, gen);
		atomic_store(&issued[i], gen);
		if (!io_block(true, buf, cfg.first_blk + i))
			break;
		atomic_store_explicit(&completed[i], gen, memory_order_release);
		atomic_fetch_add(&nr_writes, 1);
		if (cfg.write_delay_us)
			usleep(cfg.write_delay_us);
	}
	free(buf);
	return NULL;
}

/*
 * The verdict on one read of block @blk (range index @i): @lo is the last
 * generation completed before the read was issued, @hi the last one
 * issued when it had returned.  With hi == lo no write of the block was
 * in flight, so the block must be generation lo, intact.  With hi > lo a
 * write overlapped the read, and a device may return a mix of two
 * generations (the ramdisk copies with memcpy): that is TORN, counted but
 * allowed.  A valid header older than lo is STALE either way: at the
 * time the read was issued nothing older was on the device.
 */
static void check_block(const uint64_t *buf, uint64_t *want, uint64_t blk,
			uint64_t lo, uint64_t hi)
{
	const struct block_hdr *h = (const struct block_hdr *)buf;
	bool header_ok = h->magic == MAGIC && h->blk == blk && h->gen <= hi;
	bool intact = false;

	if (header_ok) {
		fill_block(want, blk, h->gen);
		intact = !memcmp(buf, want, BLOCK);
	}
	if (header_ok && h->gen < lo) {
		uint64_t stale = atomic_fetch_add(&nr_stale, 1) + 1;

		report("STALE", blk, "read generation %" PRIu64 "%s, generation %"
		       PRIu64 " had completed before the read was issued",
		       h->gen, intact ? "" : " (torn)", lo);
		if (cfg.stop_after_stale && stale >= cfg.stop_after_stale)
			atomic_store(&stop, true);
		return;
	}
	if (header_ok && intact)
		return;
	if (hi > lo) {
		atomic_fetch_add(&nr_torn, 1);
		return;
	}
	atomic_fetch_add(&nr_corrupt, 1);
	if (!header_ok)
		report("CORRUPT", blk, "header: magic %#" PRIx64 " block %"
		       PRIu64 " generation %" PRIu64 " (last written %" PRIu64
		       ")", h->magic, h->blk, h->gen, hi);
	else
		report("CORRUPT", blk, "payload of generation %" PRIu64
		       " is wrong, and no write was in flight", h->gen);
}

static void *reader(void *arg)
{
	struct thread *t = arg;
	unsigned int nr = cfg.read_blocks, span = cfg.blocks - nr + 1, j;
	uint64_t *buf = NULL, *want = alloc_block(), lo[32], hi, reads;

	if (posix_memalign((void **)&buf, BLOCK, (size_t)nr * BLOCK))
		buf = NULL;
	if (!buf || !want)
		goto out;
	pin(t->cpu);
	while (!atomic_load(&stop)) {
		unsigned int i = splitmix64(&t->rng) % span;
		uint64_t blk = cfg.first_blk + i;

		for (j = 0; j < nr; j++)
			lo[j] = atomic_load_explicit(&completed[i + j],
						     memory_order_acquire);
		if (!io_blocks(false, buf, blk, nr))
			break;
		for (j = 0; j < nr; j++) {
			hi = atomic_load(&issued[i + j]);
			check_block(buf + (size_t)j * (BLOCK / 8), want, blk + j,
				    lo[j], hi);
		}
		reads = atomic_fetch_add(&nr_reads, 1) + 1;
		if (cfg.max_reads && reads >= cfg.max_reads)
			atomic_store(&stop, true);
	}
out:
	free(buf);
	free(want);
	return NULL;
}

/* Generation 0 of every block, before any thread starts. */
static bool init_range(void)
{
	uint64_t *buf = alloc_block();
	unsigned int i;
	bool ok = true;

	if (!buf)
		return false;
	for (i = 0; i < cfg.blocks && ok; i++) {
		fill_block(buf, cfg.first_blk + i, 0);
		ok = io_block(true, buf, cfg.first_blk + i);
	}
	free(buf);
	return ok;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: stale_check DEV [--blocks K] [--offset BYTES] [--writers W]\n"
		"                   [--readers R] [--seconds S] [--max-reads N]\n"
		"                   [--stop-after-stale N] [--write-delay-us U] [--seed N]\n"
		"                   [--read-blocks N]\n");
}

static bool parse_u64(const char *s, uint64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoull(s, &end, 0);
	return !errno && end != s && !*end && s[0] != '-';
}

static int parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "blocks", required_argument, NULL, 'b' },
		{ "offset", required_argument, NULL, 'o' },
		{ "writers", required_argument, NULL, 'w' },
		{ "readers", required_argument, NULL, 'r' },
		{ "seconds", required_argument, NULL, 's' },
		{ "max-reads", required_argument, NULL, 'm' },
		{ "stop-after-stale", required_argument, NULL, 'x' },
		{ "write-delay-us", required_argument, NULL, 'd' },
		{ "seed", required_argument, NULL, 'S' },
		{ "read-blocks", required_argument, NULL, 'R' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	char *end;
	uint64_t v;
	int c;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c == 'h') {
			usage(stdout);
			exit(0);
		}
		if (c == '?')
			return -1;
		if (c == 's') {
			cfg.seconds = strtod(optarg, &end);
			if (*end || cfg.seconds <= 0)
				goto bad;
			continue;
		}
		if (!parse_u64(optarg, &v))
			goto bad;
		switch (c) {
		case 'b': cfg.blocks = v; if (v != cfg.blocks) goto bad; break;
		case 'o': if (v % BLOCK) goto bad; cfg.first_blk = v / BLOCK; break;
		case 'w': cfg.writers = v; if (v != cfg.writers) goto bad; break;
		case 'r': cfg.readers = v; if (v != cfg.readers) goto bad; break;
		case 'm': cfg.max_reads = v; break;
		case 'x': cfg.stop_after_stale = v; break;
		case 'd': cfg.write_delay_us = v; if (v > 1000000) goto bad; break;
		case 'S': cfg.seed = v; break;
		case 'R': if (!v || v > 32) goto bad; cfg.read_blocks = v; break;
		}
		continue;
bad:
		fprintf(stderr, "stale_check: bad value: %s\n", optarg);
		return -1;
	}
	if (optind != argc - 1)
		return -1;
	cfg.dev = argv[optind];
	if (!cfg.blocks || !cfg.writers || cfg.writers > cfg.blocks ||
	    !cfg.readers || cfg.writers + cfg.readers > MAX_THREADS ||
	    cfg.read_blocks > cfg.blocks) {
		fprintf(stderr, "stale_check: need 1 <= writers <= blocks, "
			"readers >= 1, at most %d threads, read-blocks <= blocks\n",
			MAX_THREADS);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct thread th[MAX_THREADS];
	unsigned int nthreads, i, ncpu;
	double start, elapsed;
	uint64_t stale, corrupt;

	if (parse_args(argc, argv)) {
		usage(stderr);
		return 1;
	}
	dev_fd = open(cfg.dev, O_RDWR | O_DIRECT);
	if (dev_fd < 0) {
		fprintf(stderr, "stale_check: %s: %s\n", cfg.dev, strerror(errno));
		return 1;
	}
	completed = calloc(cfg.blocks, sizeof(*completed));
	issued = calloc(cfg.blocks, sizeof(*issued));
	if (!completed || !issued) {
		fprintf(stderr, "stale_check: out of memory\n");
		return 1;
	}
	if (!init_range())
		return 1;

	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu < 1)
		ncpu = 1;
	nthreads = cfg.writers + cfg.readers;
	start = now();
	for (i = 0; i < nthreads; i++) {
		struct thread *t = &th[i];

		t->writer = i < cfg.writers;
		t->idx = t->writer ? i : i - cfg.writers;
		/* writers and readers alike alternate over the CPUs */
		t->cpu = t->idx % ncpu;
		if (!t->writer)
			t->cpu = (t->idx + 1) % ncpu;
		t->rng = cfg.seed * 1000003ULL + i;
		if (pthread_create(&t->tid, NULL, t->writer ? writer : reader,
				   t)) {
			fprintf(stderr, "stale_check: cannot create a thread\n");
			atomic_store(&stop, true);
			nthreads = i;
			atomic_fetch_add(&nr_errors, 1);
			break;
		}
	}
	while (!atomic_load(&stop) && now() - start < cfg.seconds)
		usleep(10000);
	atomic_store(&stop, true);
	for (i = 0; i < nthreads; i++)
		pthread_join(th[i].tid, NULL);
	elapsed = now() - start;
	close(dev_fd);

	stale = atomic_load(&nr_stale);
	corrupt = atomic_load(&nr_corrupt);
	printf("reads=%lu writes=%lu stale=%" PRIu64 " corrupt=%" PRIu64
	       " torn=%lu errors=%lu seconds=%.1f\n", atomic_load(&nr_reads),
	       atomic_load(&nr_writes), stale, corrupt, atomic_load(&nr_torn),
	       atomic_load(&nr_errors), elapsed);
	if (corrupt)
		return 4;
	if (atomic_load(&nr_errors))
		return 1;
	return stale ? 3 : 0;
}
