// SPDX-License-Identifier: MIT
/*
 * dedup - a deduplicating block device: every distinct 4 KiB block is
 * stored once, in a store file (or block device), and survives crashes.
 *
 *   dedup format --size SIZE [--force] STORE
 *   dedup serve [--queues N] [--depth N] [--threads N] [--id N]
 *               [--max-io SIZE] [--io-timeout SECONDS]
 *               [--bpf PROG.bpf.o | --no-fast-path] [--no-remap] STORE
 *   dedup check STORE
 *   dedup status [--json] /dev/hybdN | STORE
 *
 * serve prints "ready /dev/hybdN" once the disk exists and serves it until
 * SIGINT or SIGTERM (or `hybdctl del`); a flush or a FUA write makes what
 * was written durable (store.c, README.md).  Its fast path (dedup.bpf.o,
 * next to this program unless --bpf says otherwise) answers reads of holes
 * and of cached blocks in the kernel, has the kernel read other mapped
 * blocks straight from the store (a remap: the store is registered as the
 * device's read-only backing target 0; --no-remap does not), and sends
 * all-zero writes here without their payload; serve keeps the program's
 * dedup_zero and dedup_chunk maps exact, and waits for remaps before it
 * reuses a freed chunk.
 *
 * status of a served device reads what its server publishes in
 * /run/hybd-dedup/hybdN.stats (refreshed every STATS_PERIOD_MS) and the
 * device's counters; status of a store that nobody serves reads the store.
 */
#define _GNU_SOURCE
#include <bpf/bpf.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hybd.h"
#include "store.h"

#define RUN_DIR			"/run/hybd-dedup"
#define STATS_MAGIC		0x44445354u	/* "DDST" */
#define STATS_PERIOD_MS		100
#define ZERO_MAP		"dedup_zero"
#define CHUNK_MAP		"dedup_chunk"

/* What a server publishes for `dedup status` (a shared mapping). */
struct live_stats {
	uint32_t magic;
	uint32_t size;			/* sizeof(struct live_stats) */
	int32_t pid;
	uint32_t dev_id;
	_Atomic uint64_t seq;		/* odd while being updated */
	uint64_t updated_ns;		/* CLOCK_MONOTONIC */
	uint32_t fast_path;		/* 1: the program is attached */
	uint32_t reserved;
	char store[PATH_MAX];
	struct dd_stats st;
	uint64_t slow_reads, slow_writes, flushes, errors;
};

struct server {
	struct dd_store *s;
	const char *store_path;
	const char *bpf_path;
	bool bpf_required;		/* --bpf given: failing is fatal */
	struct hybd_bpf *bpf;
	pthread_mutex_t bpf_lock;	/* detaching it on a failed update */
	int zero_fd;
	_Atomic uint32_t zero_entries;	/* 0: dedup_zero is not kept */
	int chunk_fd;
	_Atomic uint32_t chunk_entries;	/* 0: dedup_chunk is not kept */
	bool no_remap;			/* --no-remap */
	struct hybd_dev *dev;		/* for the remap barrier */
	struct live_stats *live;
	int live_fd;			/* flock()ed while we serve */
	char live_path[64];
	pthread_t stats_thread;
	volatile bool stopping;
	_Atomic uint64_t slow_reads, slow_writes, flushes, errors;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/* ---- the handlers ---- */

static void report(struct server *sv, const char *what, int ret)
{
	/* the first few, then one in a thousand: a full disk fails many */
	uint64_t n = atomic_fetch_add(&sv->errors, 1);

	if (n < 10 || n % 1000 == 0)
		fprintf(stderr, "dedup: %s: %s (%s)\n", what, dd_errmsg(),
			strerror(-ret));
}

static int commit(struct server *sv)
{
	int ret = dd_commit(sv->s);

	atomic_fetch_add(&sv->flushes, 1);
	if (ret)
		report(sv, "flush", ret);
	return ret;
}

static int dedup_read(struct hybd_io *io, void *buf, uint64_t off,
		      uint32_t len)
{
	struct server *sv = hybd_io_priv(io);
	uint32_t i;
	int ret;

	atomic_fetch_add(&sv->slow_reads, 1);
	for (i = 0; i < len / DD_BLOCK_SIZE; i++) {
		ret = dd_read(sv->s, (off >> DD_BLOCK_SHIFT) + i,
			      (char *)buf + (size_t)i * DD_BLOCK_SIZE);
		if (ret) {
			report(sv, "read", ret);
			return ret;
		}
	}
	return 0;
}

static int dedup_write(struct hybd_io *io, const void *buf, uint64_t off,
		       uint32_t len)
{
	struct server *sv = hybd_io_priv(io);
	int ret;

	atomic_fetch_add(&sv->slow_writes, 1);
	/*
	 * The request's blocks at once: their new contents get consecutive
	 * chunks, so that reading them back is one remap (dedup.bpf.c), even
	 * while the other handler threads write too.
	 */
	ret = dd_write_extent(sv->s, off >> DD_BLOCK_SHIFT,
			      len >> DD_BLOCK_SHIFT, buf);
	if (ret) {
		report(sv, "write", ret);
		return ret;
	}
	return hybd_io_flags(io) & HYBD_IO_F_FUA ? commit(sv) : 0;
}

static int dedup_flush(struct hybd_io *io)
{
	return commit(hybd_io_priv(io));
}

/*
 * discard and write-zeroes: holes; also an all-zero write the fast path
 * passed as a write-zeroes (with NOUNMAP: a hole is as provisioned as a
 * dedup block gets, it costs no space either way).
 */
static int dedup_hole(struct hybd_io *io, uint64_t off, uint32_t len)
{
	struct server *sv = hybd_io_priv(io);
	int ret;

	atomic_fetch_add(&sv->slow_writes, 1);
	ret = dd_write_hole(sv->s, off >> DD_BLOCK_SHIFT,
			    len >> DD_BLOCK_SHIFT);
	if (ret) {
		report(sv, hybd_io_op(io) == HYBD_OP_DISCARD ? "discard" :
		       "write-zeroes", ret);
		return ret;
	}
	return hybd_io_flags(io) & HYBD_IO_F_FUA ? commit(sv) : 0;
}

/* ---- the fast path ---- */

static uint32_t map_entries(int fd)
{
	struct bpf_map_info info = { 0 };
	uint32_t len = sizeof(info);

	return bpf_map_get_info_by_fd(fd, &info, &len) ? 0 : info.max_entries;
}

/*
 * The kernel refused an array update (it cannot, short of a bug): the
 * maps no longer follow the store, so the program must go.  It is gone
 * before this returns, and so before the request that changed the block
 * completes.
 */
static void map_update_failed(struct server *sv, const char *map,
			      uint32_t key, int err)
{
	pthread_mutex_lock(&sv->bpf_lock);
	if (sv->bpf) {
		fprintf(stderr, "dedup: updating %s[%u]: %s; detaching the fast path\n",
			map, key, strerror(err));
		atomic_store(&sv->zero_entries, 0);
		atomic_store(&sv->chunk_entries, 0);
		hybd_bpf_detach(sv->bpf);
		sv->bpf = NULL;
	}
	pthread_mutex_unlock(&sv->bpf_lock);
}

/*
 * A block's map entry changed (under its lock): what the fast path may
 * serve.  dedup_chunk first: a block that stops being a hole is never a
 * hole pointing nowhere, and one that becomes a hole reads as zeros from
 * dedup_zero before its chunk may go.
 */
static void map_changed(void *arg, uint64_t blk, uint64_t old_off,
			uint64_t new_off)
{
	struct server *sv = arg;
	uint32_t key = blk, zero = !new_off;

	if (blk < atomic_load(&sv->chunk_entries) &&
	    bpf_map_update_elem(sv->chunk_fd, &key, &new_off, BPF_ANY))
		map_update_failed(sv, CHUNK_MAP, key, errno);
	if (!old_off == !new_off)
		return;
	if (blk < atomic_load(&sv->zero_entries) &&
	    bpf_map_update_elem(sv->zero_fd, &key, &zero, BPF_ANY))
		map_update_failed(sv, ZERO_MAP, key, errno);
}

/*
 * A commit is about to let freed chunks be reused: no remap that found
 * one of them in dedup_chunk (which no longer has them) may still read.
 */
static int chunks_reusable(void *arg)
{
	struct server *sv = arg;
	int ret = hybd_dev_remap_barrier(sv->dev);

	if (ret)
		fprintf(stderr, "dedup: %s; freed chunks wait\n", hybd_errmsg());
	return ret;
}

/*
 * --remap (the default): the store becomes the device's read-only backing
 * target 0, and dedup_chunk says where each block's chunk is in it.  A
 * store the kernel cannot read with direct I/O is served without.
 */
static int setup_remap(struct server *sv, struct hybd_dev *dev)
{
	uint64_t blk, n = dd_nr_blocks(sv->s), off;
	uint32_t key;
	int index;

	sv->chunk_fd = hybd_bpf_map_fd(sv->bpf, CHUNK_MAP);
	if (sv->no_remap || sv->chunk_fd < 0)
		return 0;
	index = hybd_dev_add_backing(dev, dd_fd(sv->s), 0, NULL);
	if (index != 0) {
		fprintf(stderr, "dedup: no remapped reads: %s\n",
			index < 0 ? hybd_errmsg() : "target 0 is taken");
		if (index > 0)
			hybd_dev_del_backing(dev, index);
		return 0;
	}
	atomic_store(&sv->chunk_entries, map_entries(sv->chunk_fd));
	if (n > sv->chunk_entries)
		n = sv->chunk_entries;
	for (blk = 0; blk < n; blk++) {
		off = dd_block_offset(sv->s, blk);
		key = blk;
		if (off && bpf_map_update_elem(sv->chunk_fd, &key, &off,
					       BPF_ANY)) {
			fprintf(stderr, "dedup: seeding %s: %s\n", CHUNK_MAP,
				strerror(errno));
			return -errno;
		}
	}
	sv->dev = dev;
	dd_set_reuse_cb(sv->s, chunks_reusable, sv);
	printf("remapped reads on\n");
	return 0;
}

/*
 * Attach the program and tell it where the holes are, before the device
 * starts: every block the map says is a hole is one now, and from here on
 * zero_changed() follows each change under the block's lock.
 */
static int attach_fast_path(struct server *sv, struct hybd_dev *dev)
{
	uint64_t blk, first, n = dd_nr_blocks(sv->s);
	const uint32_t one = 1;
	int ret;

	ret = hybd_bpf_attach(hybd_dev_id(dev), sv->bpf_path, HYBD_BPF_F_PIN,
			      &sv->bpf);
	if (ret) {
		fprintf(stderr, "dedup: %s: %s\n", sv->bpf_path, hybd_errmsg());
		return ret;
	}
	sv->zero_fd = hybd_bpf_map_fd(sv->bpf, ZERO_MAP);
	if (sv->zero_fd < 0) {
		fprintf(stderr, "dedup: %s has no map %s: not dedup's fast path\n",
			sv->bpf_path, ZERO_MAP);
		ret = -ENOENT;
		goto fail;
	}
	atomic_store(&sv->zero_entries, map_entries(sv->zero_fd));
	if (n > sv->zero_entries)
		n = sv->zero_entries;
	for (blk = 0; blk < n; blk = first) {
		for (; blk < n && !dd_is_hole(sv->s, blk); blk++)
			;
		for (first = blk; first < n && dd_is_hole(sv->s, first); first++)
			;
		if (first > blk) {
			ret = hybd_bpf_map_fill(sv->zero_fd, blk, first - blk,
						&one);
			if (ret) {
				fprintf(stderr, "dedup: seeding %s: %s\n",
					ZERO_MAP, hybd_errmsg());
				goto fail;
			}
		}
	}
	ret = setup_remap(sv, dev);
	if (ret)
		goto fail;
	dd_set_map_cb(sv->s, map_changed, sv);
	return 0;
fail:
	atomic_store(&sv->chunk_entries, 0);
	hybd_bpf_detach(sv->bpf);
	sv->bpf = NULL;
	sv->zero_fd = -1;
	sv->chunk_fd = -1;
	return ret;
}

/* ---- what status reads ---- */

static void publish(struct server *sv)
{
	struct live_stats *l = sv->live;
	/* taken first: what completed before this instant is in the copy */
	uint64_t when = now_ns();
	struct dd_stats st;

	dd_stats(sv->s, &st);
	atomic_fetch_add(&l->seq, 1);
	l->st = st;
	l->slow_reads = atomic_load(&sv->slow_reads);
	l->slow_writes = atomic_load(&sv->slow_writes);
	l->flushes = atomic_load(&sv->flushes);
	l->errors = atomic_load(&sv->errors);
	l->updated_ns = when;
	atomic_fetch_add(&l->seq, 1);
}

static void *stats_loop(void *arg)
{
	struct server *sv = arg;
	const struct timespec period = { 0, STATS_PERIOD_MS * 1000000L };

	while (!sv->stopping) {
		publish(sv);
		nanosleep(&period, NULL);
	}
	return NULL;
}

static int live_open(struct server *sv, struct hybd_dev *dev)
{
	int fd;

	char tmp[sizeof(sv->live_path) + 8];

	snprintf(sv->live_path, sizeof(sv->live_path), RUN_DIR "/hybd%d.stats",
		 hybd_dev_id(dev));
	/* filled under another name: a reader never maps a short file */
	snprintf(tmp, sizeof(tmp), "%s.new", sv->live_path);
	mkdir(RUN_DIR, 0755);
	fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	/*
	 * Locked as long as this process lives: `dedup status` tells a
	 * server that is gone by the lock, not by a pid that may be reused.
	 */
	if (fd < 0 || ftruncate(fd, sizeof(*sv->live)) ||
	    flock(fd, LOCK_EX | LOCK_NB)) {
		fprintf(stderr, "dedup: %s: %s (no status)\n", tmp,
			strerror(errno));
		if (fd >= 0)
			close(fd);
		return 0;
	}
	sv->live = mmap(NULL, sizeof(*sv->live), PROT_READ | PROT_WRITE,
			MAP_SHARED, fd, 0);
	if (sv->live == MAP_FAILED) {
		close(fd);
		sv->live = NULL;
		return 0;
	}
	sv->live_fd = fd;
	sv->live->size = sizeof(*sv->live);
	sv->live->pid = getpid();
	sv->live->dev_id = hybd_dev_id(dev);
	sv->live->fast_path = !!sv->bpf;
	if (!realpath(sv->store_path, sv->live->store))
		snprintf(sv->live->store, sizeof(sv->live->store), "%s",
			 sv->store_path);
	publish(sv);
	sv->live->magic = STATS_MAGIC;
	if (rename(tmp, sv->live_path) ||
	    pthread_create(&sv->stats_thread, NULL, stats_loop, sv)) {
		fprintf(stderr, "dedup: %s: %s (no status)\n", sv->live_path,
			strerror(errno));
		unlink(tmp);
		unlink(sv->live_path);
		munmap(sv->live, sizeof(*sv->live));
		close(sv->live_fd);
		sv->live = NULL;
	}
	return 0;
}

static void live_close(struct server *sv)
{
	if (!sv->live)
		return;
	sv->stopping = true;
	pthread_join(sv->stats_thread, NULL);
	unlink(sv->live_path);
	munmap(sv->live, sizeof(*sv->live));
	close(sv->live_fd);
	sv->live = NULL;
}

static int dedup_prepare(struct hybd_dev *dev)
{
	struct server *sv = hybd_dev_priv(dev);
	int ret;

	if (sv->bpf_path) {
		ret = attach_fast_path(sv, dev);
		if (ret && sv->bpf_required)
			return ret;
	}
	return live_open(sv, dev);
}

static void dedup_ready(struct hybd_dev *dev)
{
	struct server *sv = hybd_dev_priv(dev);

	printf("fast path %s\n", sv->bpf ? "attached" : "off");
	printf("ready %s\n", hybd_dev_path(dev));
	fflush(stdout);
}

static const struct hybd_driver dedup_driver = {
	.read		= dedup_read,
	.write		= dedup_write,
	.flush		= dedup_flush,
	.discard	= dedup_hole,
	.write_zeroes	= dedup_hole,
	.prepare	= dedup_prepare,
	.ready		= dedup_ready,
};

/* ---- commands ---- */

static uint64_t number(const char *cmd, const char *name, const char *s)
{
	uint64_t v;

	if (hybd_parse_size(s, &v)) {
		fprintf(stderr, "dedup %s: --%s %s: %s\n", cmd, name, s,
			hybd_errmsg());
		exit(2);
	}
	return v;
}

/* dedup.bpf.o next to this program */
static char *default_bpf(void)
{
	static char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 32);
	char *slash;

	if (n <= 0)
		return NULL;
	path[n] = 0;
	slash = strrchr(path, '/');
	strcpy(slash ? slash + 1 : path, "dedup.bpf.o");
	return access(path, R_OK) ? NULL : path;
}

static const char serve_usage[] =
	"usage: dedup serve [--queues N] [--depth N] [--threads N] [--id N]\n"
	"                   [--max-io SIZE] [--io-timeout SECONDS]\n"
	"                   [--bpf PROG.bpf.o | --no-fast-path]\n"
	"                   [--no-remap]\n"
	"                   STORE\n";

static int cmd_serve(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "queues", required_argument, NULL, 'q' },
		{ "depth", required_argument, NULL, 'd' },
		{ "threads", required_argument, NULL, 'T' },
		{ "id", required_argument, NULL, 'i' },
		{ "io-timeout", required_argument, NULL, 't' },
		{ "max-io", required_argument, NULL, 'm' },
		{ "bpf", required_argument, NULL, 'b' },
		{ "no-fast-path", no_argument, NULL, 'n' },
		{ "no-remap", no_argument, NULL, 'R' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct server sv = { .zero_fd = -1, .chunk_fd = -1,
			     .bpf_lock = PTHREAD_MUTEX_INITIALIZER };
	struct hybd_config cfg;
	bool fast = true;
	int c, i = 0, ret;

	hybd_config_init(&cfg);
	cfg.logical_block_size = DD_BLOCK_SIZE;
	cfg.physical_block_size = DD_BLOCK_SIZE;
	cfg.queue_threads = 4;
	while ((c = getopt_long(argc, argv, "h", opts, &i)) != -1) {
		const char *name = opts[i].name;

		switch (c) {
		case 'q': cfg.nr_queues = number("serve", name, optarg); break;
		case 'd': cfg.queue_depth = number("serve", name, optarg); break;
		case 'T': cfg.queue_threads = number("serve", name, optarg); break;
		case 'i': cfg.dev_id = number("serve", name, optarg); break;
		case 't': cfg.io_timeout = number("serve", name, optarg); break;
		case 'm': cfg.max_io_bytes = number("serve", name, optarg); break;
		case 'b': sv.bpf_path = optarg; sv.bpf_required = true; break;
		case 'n': fast = false; break;
		case 'R': sv.no_remap = true; break;
		case 'h': fputs(serve_usage, stdout); return 0;
		default: fputs(serve_usage, stderr); return 2;
		}
	}
	if (optind != argc - 1) {
		fputs(serve_usage, stderr);
		return 2;
	}
	if (!fast && sv.bpf_required) {
		fprintf(stderr, "dedup serve: --bpf and --no-fast-path contradict each other\n");
		return 2;
	}
	if (fast && !sv.bpf_path) {
		sv.bpf_path = default_bpf();
		if (!sv.bpf_path)
			fprintf(stderr, "dedup: no dedup.bpf.o next to this program: no fast path\n");
	}
	if (!fast)
		sv.bpf_path = NULL;
	if (sv.bpf_path) {
		struct hybd_ctl_features f;

		/* the program passes zero writes as write-zeroes: take them */
		if (!hybd_ctl_features(&f) && (f.features & HYBD_F_PASS_ZEROES)) {
			cfg.flags |= HYBD_DEV_F_ZERO_WRITES;
		} else {
			fprintf(stderr, "dedup: the hybd module cannot pass zero writes as write-zeroes (pass_zeroes): no fast path\n");
			if (sv.bpf_required)
				return 1;
			sv.bpf_path = NULL;
		}
	}
	sv.store_path = argv[optind];

	ret = dd_open(sv.store_path, 0, &sv.s);
	if (ret) {
		fprintf(stderr, "dedup: %s\n", dd_errmsg());
		return 1;
	}
	cfg.size = dd_nr_blocks(sv.s) * DD_BLOCK_SIZE;

	ret = hybd_run(&cfg, &dedup_driver, &sv);
	live_close(&sv);
	dd_set_map_cb(sv.s, NULL, NULL);
	dd_set_reuse_cb(sv.s, NULL, NULL);
	if (sv.bpf)
		hybd_bpf_detach(sv.bpf);
	if (ret)
		fprintf(stderr, "dedup: %s\n", hybd_errmsg());
	/* the device wrote back what it held; make it durable */
	if (dd_commit(sv.s)) {
		fprintf(stderr, "dedup: final commit: %s\n", dd_errmsg());
		ret = ret ? ret : -EIO;
	}
	dd_close(sv.s);
	return ret ? 1 : 0;
}

static int cmd_format(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "size", required_argument, NULL, 's' },
		{ "force", no_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static const char usage[] =
		"usage: dedup format [--size SIZE] [--force] STORE\n";
	unsigned int flags = 0;
	uint64_t size = 0;
	int c, i = 0;

	while ((c = getopt_long(argc, argv, "h", opts, &i)) != -1) {
		switch (c) {
		case 's': size = number("format", "size", optarg); break;
		case 'f': flags |= DD_F_FORCE; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind != argc - 1) {
		fputs(usage, stderr);
		return 2;
	}
	if (dd_format(argv[optind], size, flags)) {
		fprintf(stderr, "dedup format: %s\n", dd_errmsg());
		return 1;
	}
	return 0;
}

static int cmd_check(int argc, char **argv)
{
	struct dd_store *s;
	long problems;

	if (argc != 2 || argv[1][0] == '-') {
		fputs("usage: dedup check STORE\n",
		      argc == 2 && !strcmp(argv[1], "--help") ? stdout : stderr);
		return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
	}
	if (dd_open(argv[1], DD_O_RDONLY, &s)) {
		fprintf(stderr, "dedup check: %s\n", dd_errmsg());
		return 1;
	}
	problems = dd_check(s, stdout);
	dd_close(s);
	if (problems < 0) {
		fprintf(stderr, "dedup check: %s\n", dd_errmsg());
		return 1;
	}
	return problems ? 1 : 0;
}

/* ---- status ---- */

struct status {
	const char *source;		/* "server" or "store" */
	char store[PATH_MAX];
	int dev_id;			/* -1: not served */
	int pid;
	bool fast_path;
	struct dd_stats st;
	uint64_t reads, fast_reads;	/* the device's, since it started */
	uint64_t remapped;		/* of fast_reads, remapped to the store */
};

static int live_read(uint32_t id, struct status *out)
{
	char path[64];
	struct live_stats *l, copy = { 0 };
	uint64_t since = now_ns(), seq;
	struct stat st;
	int fd, tries;

	snprintf(path, sizeof(path), RUN_DIR "/hybd%u.stats", id);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "dedup status: hybd%u is not served by dedup (no %s)\n",
			id, path);
		return -1;
	}
	if (fstat(fd, &st) || st.st_size != sizeof(*l)) {
		close(fd);
		fprintf(stderr, "dedup status: %s: not a dedup status file\n",
			path);
		return -1;
	}
	l = mmap(NULL, sizeof(*l), PROT_READ, MAP_SHARED, fd, 0);
	if (l == MAP_FAILED || l->magic != STATS_MAGIC ||
	    l->size != sizeof(*l)) {
		fprintf(stderr, "dedup status: %s: not a dedup status file\n",
			path);
		close(fd);
		return -1;
	}
	/* its server holds it locked while it lives (see live_open()) */
	if (!flock(fd, LOCK_SH | LOCK_NB)) {
		fprintf(stderr, "dedup status: hybd%u: its server (pid %d) is gone\n",
			id, l->pid);
		close(fd);
		munmap(l, sizeof(*l));
		return -1;
	}
	close(fd);
	/* a snapshot taken after we asked: what we wrote before is in it */
	for (tries = 0; tries < 200; tries++) {
		seq = atomic_load(&l->seq);
		if (!(seq & 1)) {
			memcpy(&copy, l, sizeof(copy));
			if (atomic_load(&l->seq) == seq && copy.updated_ns > since)
				break;
		}
		usleep(STATS_PERIOD_MS * 1000 / 4);
	}
	munmap(l, sizeof(*l));
	if (tries == 200) {
		fprintf(stderr, "dedup status: hybd%u: its server (pid %d) published nothing for 5 s\n",
			id, copy.pid);
		return -1;
	}
	out->source = "server";
	snprintf(out->store, sizeof(out->store), "%s", copy.store);
	out->dev_id = id;
	out->pid = copy.pid;
	out->fast_path = copy.fast_path;
	out->st = copy.st;
	return 0;
}

static void print_status(const struct status *s, bool json)
{
	const struct dd_stats *st = &s->st;
	uint64_t logical = st->mapped_blocks * DD_BLOCK_SIZE;
	uint64_t unique = st->chunks_used * DD_BLOCK_SIZE;
	double ratio = unique ? (double)logical / unique : 0;
	double hit = s->reads ? (double)s->fast_reads / s->reads : 0;

	if (json) {
		printf("{\"source\": \"%s\", \"store\": \"%s\", \"device\": ",
		       s->source, s->store);
		if (s->dev_id >= 0)
			printf("\"/dev/hybd%d\", \"pid\": %d, ", s->dev_id,
			       s->pid);
		else
			printf("null, \"pid\": null, ");
		printf("\"blocks\": %" PRIu64 ", \"logical_bytes\": %" PRIu64
		       ", \"unique_bytes\": %" PRIu64 ", \"dedup_ratio\": %.4f"
		       ", \"zero_blocks\": %" PRIu64 ", \"free_chunks\": %" PRIu64
		       ", \"pending_chunks\": %" PRIu64
		       ", \"capacity_chunks\": %" PRIu64
		       ", \"store_bytes\": %" PRIu64 ", \"commits\": %" PRIu64
		       ", \"dedup_hits\": %" PRIu64 ", \"zero_writes\": %" PRIu64
		       ", \"fast_path\": %s, \"reads\": %" PRIu64
		       ", \"fast_reads\": %" PRIu64 ", \"remapped_reads\": %" PRIu64
		       ", \"hit_rate\": %.4f}\n",
		       st->nr_blocks, logical, unique, ratio,
		       st->nr_blocks - st->mapped_blocks, st->chunks_free,
		       st->chunks_pending, st->chunks_capacity, st->file_bytes,
		       st->commits, st->dedup_hits, st->zero_writes,
		       s->fast_path ? "true" : "false", s->reads, s->fast_reads,
		       s->remapped, hit);
		return;
	}
	printf("store:          %s\n", s->store);
	if (s->dev_id >= 0)
		printf("device:         /dev/hybd%d (server pid %d)\n",
		       s->dev_id, s->pid);
	else
		printf("device:         none (not served)\n");
	printf("size:           %" PRIu64 " MiB (%" PRIu64 " blocks)\n",
	       st->nr_blocks * DD_BLOCK_SIZE >> 20, st->nr_blocks);
	printf("logical data:   %.1f MiB (%" PRIu64 " blocks)\n",
	       logical / 1048576.0, st->mapped_blocks);
	printf("stored data:    %.1f MiB (%" PRIu64 " unique blocks)\n",
	       unique / 1048576.0, st->chunks_used);
	printf("dedup ratio:    %.2f\n", ratio);
	printf("zero blocks:    %" PRIu64 " (holes: read as zeros, stored nowhere)\n",
	       st->nr_blocks - st->mapped_blocks);
	printf("free chunks:    %" PRIu64 " (+ %" PRIu64
	       " after the next flush), of %" PRIu64 "\n",
	       st->chunks_free, st->chunks_pending, st->chunks_capacity);
	printf("store file:     %.1f MiB\n", st->file_bytes / 1048576.0);
	if (s->dev_id >= 0)
		printf("fast path:      %s, %" PRIu64 " of %" PRIu64
		       " reads served in the kernel (%.1f%%), %" PRIu64
		       " of them read from the store by a remap\n",
		       s->fast_path ? "attached" : "off", s->fast_reads,
		       s->reads, hit * 100, s->remapped);
}

static int cmd_status(int argc, char **argv)
{
	static const char usage[] =
		"usage: dedup status [--json] /dev/hybdN | STORE\n";
	struct status s = { .dev_id = -1 };
	struct hybd_ctl_stats cs;
	bool json = false;
	const char *what;
	uint32_t id;

	if (argc == 3 && !strcmp(argv[1], "--json")) {
		json = true;
		what = argv[2];
	} else if (argc == 2 && !strcmp(argv[1], "--help")) {
		fputs(usage, stdout);
		return 0;
	} else if (argc == 2 && argv[1][0] != '-') {
		what = argv[1];
	} else {
		fputs(usage, stderr);
		return 2;
	}

	if (!strncmp(what, "/dev/hybd", 9) && !hybd_parse_dev(what, &id)) {
		if (live_read(id, &s))
			return 1;
		if (hybd_ctl_stats(id, &cs, NULL, 0) >= 0) {
			s.reads = cs.total.c.reads;
			s.fast_reads = cs.total.c.fast_done;
			s.remapped = cs.total.c.remapped;
		}
	} else {
		struct dd_store *st;

		if (dd_open(what, DD_O_RDONLY, &st)) {
			fprintf(stderr, "dedup status: %s\n", dd_errmsg());
			return 1;
		}
		s.source = "store";
		if (!realpath(what, s.store))
			snprintf(s.store, sizeof(s.store), "%s", what);
		dd_stats(st, &s.st);
		dd_close(st);
	}
	print_status(&s, json);
	return 0;
}

static const char usage[] =
	"usage: dedup format --size SIZE [--force] STORE\n"
	"       dedup serve [options] STORE      (dedup serve --help)\n"
	"       dedup check STORE\n"
	"       dedup status [--json] /dev/hybdN | STORE\n";

int main(int argc, char **argv)
{
	if (argc < 2) {
		fputs(usage, stderr);
		return 2;
	}
	if (!strcmp(argv[1], "format"))
		return cmd_format(argc - 1, argv + 1);
	if (!strcmp(argv[1], "serve"))
		return cmd_serve(argc - 1, argv + 1);
	if (!strcmp(argv[1], "check"))
		return cmd_check(argc - 1, argv + 1);
	if (!strcmp(argv[1], "status"))
		return cmd_status(argc - 1, argv + 1);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		fputs(usage, stdout);
		return 0;
	}
	fprintf(stderr, "dedup: unknown command '%s'\n%s", argv[1], usage);
	return 2;
}
