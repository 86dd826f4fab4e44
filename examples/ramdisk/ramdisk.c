// SPDX-License-Identifier: MIT
/*
 * ramdisk - the smallest useful hybd driver: a disk that lives in memory.
 *
 *   ramdisk [--size BYTES] [--queues N] [--depth N] [--max-io BYTES]
 *           [--lbs N] [--pbs N] [--poll-ns N] [--no-write-cache] [--id N]
 *           [--io-timeout SECONDS] [--max-write-zeroes BYTES]
 *           [--zero-writes] [--bpf PROG.bpf.o] [--backing FILE | --null]
 *           [--recovery SECONDS] [--attach] [--queue-affinity]
 *           [--max-size BYTES] [--front]
 *
 * It creates /dev/hybdN, prints "ready /dev/hybdN" once the disk exists and
 * serves it until SIGINT or SIGTERM.  Then it deletes the device (the
 * kernel first writes back what it still holds, through us) and prints how
 * many requests of each kind it served.
 *
 * --bpf attaches a fast path (bpf/cache.bpf.o, ...) before "ready", held by
 * this process rather than pinned: it goes when the ramdisk does.
 *
 * Discarded and write-zeroed ranges read back as zeros.  Nothing is cached
 * on the way to memory: a flush has nothing to do (it is only counted) and
 * a FUA write is as durable as it gets once copied.
 *
 * --backing FILE keeps the disk in FILE instead, mapped shared: its data
 * outlives the process (a crash included: what was written is in the
 * page cache), and the next ramdisk on FILE serves it again.  The device
 * has FILE's size unless --size says otherwise (FILE then grows to it);
 * a flush and a FUA write msync() what they must make durable.
 *
 * --null serves no data at all, as ublk's null target and null_blk without
 * memory_backed do: every request succeeds at once, writes are dropped and
 * reads return whatever the request's buffer held.  It measures the
 * framework alone (the bench's "hybd null" line), not a disk.
 *
 * --recovery SECONDS: if this process dies, the kernel holds the device's
 * I/O that long for a new server.  --attach (with --id N) is that new
 * server: it takes device N over, a waiting one, or a live one whose
 * server it asks to hand over (which then exits with "handed over").
 * Only a --backing disk keeps its data across that.
 *
 * --max-size BYTES: how far `hybdctl resize` may grow the disk (its size
 * by default: it may only shrink).  The memory is reserved, not used,
 * until written; a --backing FILE grows and shrinks with the disk.  What
 * a shrink cut off reads as zeros when a grow brings it back.
 *
 * --front gives the disk a bio-based front (HYBD_DEV_F_BIO_FRONT): a
 * program's map() may remap bios there; what it passes, and everything
 * without a program, reaches this server as before.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hybd.h"

struct ramdisk {
	unsigned char *mem;		/* max_size bytes reserved */
	bool backed;			/* --backing: mem maps a file */
	int fd;				/* --backing: the file */
	_Atomic uint64_t size;		/* the disk's size now */
	uint64_t max_size;		/* --max-size */
	atomic_ulong reads, writes, flushes, fua, discards, write_zeroes;
};

static void count(atomic_ulong *counter)
{
	atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
}

/*
 * The handlers.  The library has checked that [offset, offset + len) lies
 * on the device, so they only move bytes.  They run in the worker thread
 * of the request's queue, several queues at once.
 */
static int ramdisk_read(struct hybd_io *io, void *buf, uint64_t offset,
			uint32_t len)
{
	struct ramdisk *rd = hybd_io_priv(io);

	memcpy(buf, rd->mem + offset, len);
	count(&rd->reads);
	return 0;
}

static int ramdisk_write(struct hybd_io *io, const void *buf, uint64_t offset,
			 uint32_t len)
{
	struct ramdisk *rd = hybd_io_priv(io);

	memcpy(rd->mem + offset, buf, len);
	count(&rd->writes);
	if (hybd_io_flags(io) & HYBD_IO_F_FUA) {
		count(&rd->fua);
		if (rd->backed) {
			/* msync wants a page-aligned start */
			uint64_t start = offset & ~(uint64_t)4095;

			if (msync(rd->mem + start, offset + len - start,
				  MS_SYNC))
				return -EIO;
		}
	}
	return 0;
}

static int ramdisk_flush(struct hybd_io *io)
{
	struct ramdisk *rd = hybd_io_priv(io);

	count(&rd->flushes);
	if (rd->backed && msync(rd->mem, atomic_load(&rd->size), MS_SYNC))
		return -EIO;
	return 0;
}

static int ramdisk_discard(struct hybd_io *io, uint64_t offset, uint32_t len)
{
	struct ramdisk *rd = hybd_io_priv(io);

	memset(rd->mem + offset, 0, len);
	count(&rd->discards);
	return 0;
}

static int ramdisk_write_zeroes(struct hybd_io *io, uint64_t offset,
				uint32_t len)
{
	struct ramdisk *rd = hybd_io_priv(io);

	memset(rd->mem + offset, 0, len);
	count(&rd->write_zeroes);
	return 0;
}

/*
 * `hybdctl resize`: up to --max-size.  A grow's storage is there already
 * (reserved memory, or the file grown now); a shrink lets go of nothing
 * until it has happened (ramdisk_resized()).
 */
static int ramdisk_resize(struct hybd_dev *dev, uint64_t size)
{
	struct ramdisk *rd = hybd_dev_priv(dev);

	if (size > rd->max_size)
		return -ENOSPC;
	if (rd->backed && size > atomic_load(&rd->size) &&
	    ftruncate(rd->fd, size))
		return -errno;
	return 0;
}

/*
 * The disk is @size bytes now.  After a shrink nothing beyond is in
 * flight: let go of it (the file shrinks, the memory goes back), so that
 * it reads as zeros if a grow brings it back.  A failure here leaves
 * stale data beyond the end, which a later grow would show: say so.
 */
static void ramdisk_resized(struct hybd_dev *dev, uint64_t old, uint64_t size)
{
	struct ramdisk *rd = hybd_dev_priv(dev);
	uint64_t page = 4096, cut;

	atomic_store(&rd->size, size);
	if (size >= old)
		return;
	if (rd->backed) {
		if (ftruncate(rd->fd, size))
			perror("ramdisk: shrinking the backing file");
	} else if (rd->mem) {
		cut = (size + page - 1) & ~(page - 1);
		memset(rd->mem + size, 0, (cut < old ? cut : old) - size);
		if (cut < old && madvise(rd->mem + cut, old - cut,
					 MADV_DONTNEED))
			perror("ramdisk: returning the cut-off memory");
	}
}

static const struct hybd_driver ramdisk_driver = {
	.read		= ramdisk_read,
	.write		= ramdisk_write,
	.flush		= ramdisk_flush,
	.discard	= ramdisk_discard,
	.write_zeroes	= ramdisk_write_zeroes,
	.resize		= ramdisk_resize,
	.resized	= ramdisk_resized,
};

/* --null: the requests are counted, their data is never touched. */
static int null_read(struct hybd_io *io, void *buf, uint64_t offset,
		     uint32_t len)
{
	struct ramdisk *rd = hybd_io_priv(io);

	(void)buf; (void)offset; (void)len;
	count(&rd->reads);
	return 0;
}

static int null_write(struct hybd_io *io, const void *buf, uint64_t offset,
		      uint32_t len)
{
	struct ramdisk *rd = hybd_io_priv(io);

	(void)buf; (void)offset; (void)len;
	count(&rd->writes);
	if (hybd_io_flags(io) & HYBD_IO_F_FUA)
		count(&rd->fua);
	return 0;
}

static int null_range(struct hybd_io *io, uint64_t offset, uint32_t len)
{
	struct ramdisk *rd = hybd_io_priv(io);

	(void)offset; (void)len;
	count(hybd_io_op(io) == HYBD_OP_DISCARD ? &rd->discards :
						  &rd->write_zeroes);
	return 0;
}

static const struct hybd_driver null_driver = {
	.read		= null_read,
	.write		= null_write,
	.flush		= ramdisk_flush,
	.discard	= null_range,
	.write_zeroes	= null_range,
	.resize		= ramdisk_resize,
	.resized	= ramdisk_resized,
};

static int fail(const char *what, int err)
{
	fprintf(stderr, "ramdisk: %s (%s)\n", what, strerror(-err));
	return 1;
}

/* A number, with an optional K/M/G/T suffix; exits on a bad one. */
static uint64_t number(const char *opt, const char *arg, uint64_t max)
{
	uint64_t v;

	if (hybd_parse_size(arg, &v) < 0 || v > max) {
		fprintf(stderr, "ramdisk: --%s: bad value '%s'\n", opt, arg);
		exit(2);
	}
	return v;
}

static const char usage[] =
	"usage: ramdisk [--size BYTES] [--queues N] [--depth N] [--max-io BYTES]\n"
	"               [--lbs N] [--pbs N] [--poll-ns N] [--no-write-cache] [--id N]\n"
	"               [--io-timeout SECONDS] [--max-write-zeroes BYTES]\n"
	"               [--zero-writes] [--bpf PROG.bpf.o] [--backing FILE | --null]\n"
	"               [--recovery SECONDS] [--attach] [--queue-affinity]\n"
	"               [--max-size BYTES] [--front]\n";

static const char *bpf_path;	/* --bpf */
static const char *backing;	/* --backing */
static bool null_mode;		/* --null */
static bool size_given;
static uint64_t max_size;	/* --max-size */

static void parse_args(int argc, char **argv, struct hybd_config *cfg)
{
	static const struct option opts[] = {
		{ "size", required_argument, NULL, 's' },
		{ "queues", required_argument, NULL, 'q' },
		{ "depth", required_argument, NULL, 'd' },
		{ "max-io", required_argument, NULL, 'm' },
		{ "lbs", required_argument, NULL, 'l' },
		{ "pbs", required_argument, NULL, 'p' },
		{ "poll-ns", required_argument, NULL, 'P' },
		{ "no-write-cache", no_argument, NULL, 'W' },
		{ "id", required_argument, NULL, 'i' },
		{ "io-timeout", required_argument, NULL, 't' },
		{ "max-write-zeroes", required_argument, NULL, 'z' },
		/* take zero writes a fast path passes as write-zeroes */
		{ "zero-writes", no_argument, NULL, 'Z' },
		{ "bpf", required_argument, NULL, 'b' },
		{ "backing", required_argument, NULL, 'B' },
		{ "recovery", required_argument, NULL, 'R' },
		{ "attach", no_argument, NULL, 'A' },
		{ "null", no_argument, NULL, 'N' },
		/* workers on their queues' CPUs (the placement before 1.8) */
		{ "queue-affinity", no_argument, NULL, 'Q' },
		{ "max-size", required_argument, NULL, 'X' },
		{ "front", no_argument, NULL, 'F' },
		{ NULL, 0, NULL, 0 },
	};
	int c, i = 0;

	while ((c = getopt_long(argc, argv, "", opts, &i)) != -1) {
		const char *name = opts[i].name;

		switch (c) {
		case 's':
			cfg->size = number(name, optarg, UINT64_MAX);
			size_given = true;
			break;
		case 'q': cfg->nr_queues = number(name, optarg, UINT32_MAX); break;
		case 'd': cfg->queue_depth = number(name, optarg, UINT32_MAX); break;
		case 'm': cfg->max_io_bytes = number(name, optarg, UINT32_MAX); break;
		case 'l': cfg->logical_block_size = number(name, optarg, UINT32_MAX); break;
		case 'p': cfg->physical_block_size = number(name, optarg, UINT32_MAX); break;
		case 'P': cfg->poll_ns = number(name, optarg, UINT32_MAX); break;
		case 'i': cfg->dev_id = number(name, optarg, INT32_MAX); break;
		case 't': cfg->io_timeout = number(name, optarg, UINT32_MAX); break;
		case 'z': cfg->max_write_zeroes_bytes = number(name, optarg, UINT32_MAX); break;
		case 'Z': cfg->flags |= HYBD_DEV_F_ZERO_WRITES; break;
		case 'b': bpf_path = optarg; break;
		case 'B': backing = optarg; break;
		case 'R': cfg->recovery_timeout = number(name, optarg, UINT32_MAX); break;
		case 'A': cfg->lib_flags |= HYBD_CFG_ATTACH; break;
		case 'N': null_mode = true; break;
		case 'Q': cfg->lib_flags |= HYBD_CFG_QUEUE_AFFINITY; break;
		case 'X': max_size = number(name, optarg, UINT64_MAX); break;
		case 'F': cfg->flags |= HYBD_DEV_F_BIO_FRONT; break;
		case 'W':
			/* nothing cached: no flush, no FUA */
			cfg->flags &= ~HYBD_DEV_F_WRITE_CACHE;
			cfg->ops &= ~(HYBD_OPF_FLUSH | HYBD_OPF_FUA);
			break;
		default:
			fputs(usage, stderr);
			exit(2);
		}
	}
	if ((cfg->lib_flags & HYBD_CFG_ATTACH) && (cfg->dev_id < 0 || bpf_path)) {
		fputs("ramdisk: --attach needs --id N, and takes no --bpf (a fast path that outlives servers is pinned: hybdctl attach)\n",
		      stderr);
		exit(2);
	}
	if (null_mode && backing) {
		fputs("ramdisk: --null keeps no data: it takes no --backing\n",
		      stderr);
		exit(2);
	}
}

/* --backing: map FILE (grown to --size if that was given) shared. */
static int map_backing(struct ramdisk *rd, struct hybd_config *cfg)
{
	int fd = open(backing, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	struct stat st;

	if (fd < 0 || fstat(fd, &st)) {
		fprintf(stderr, "ramdisk: %s: %s\n", backing, strerror(errno));
		return 1;
	}
	if (!size_given)
		cfg->size = st.st_size;
	if (!cfg->size) {
		fprintf(stderr, "ramdisk: %s is empty: give --size\n", backing);
		close(fd);
		return 1;
	}
	if ((uint64_t)st.st_size < cfg->size && ftruncate(fd, cfg->size)) {
		fprintf(stderr, "ramdisk: %s: %s\n", backing, strerror(errno));
		close(fd);
		return 1;
	}
	/* beyond the file's end too, for grows; never touched there */
	rd->max_size = max_size > cfg->size ? max_size : cfg->size;
	rd->mem = mmap(NULL, rd->max_size, PROT_READ | PROT_WRITE, MAP_SHARED,
		       fd, 0);
	if (rd->mem == MAP_FAILED) {
		fprintf(stderr, "ramdisk: mapping %s: %s\n", backing,
			strerror(errno));
		close(fd);
		return 1;
	}
	rd->fd = fd;
	rd->backed = true;
	return 0;
}

static sigset_t stop_signals;
static atomic_int stopping;
static struct hybd_bpf *fast_path;	/* --bpf */

/*
 * SIGINT/SIGTERM: detach the fast path, then delete the device.  The kernel
 * first writes back what it holds, through our workers, then they exit and
 * hybd_dev_wait() returns.
 */
static void *signal_thread(void *dev)
{
	int sig;

	sigwait(&stop_signals, &sig);
	stopping = 1;
	hybd_bpf_detach(fast_path);
	fast_path = NULL;
	hybd_ctl_del(hybd_dev_id(dev));
	return NULL;
}

int main(int argc, char **argv)
{
	struct ramdisk rd = { 0 };
	struct hybd_config cfg;
	struct hybd_dev *dev;
	pthread_t thread;
	int ret;

	hybd_config_init(&cfg);
	cfg.size = 64 << 20;
	parse_args(argc, argv, &cfg);

	if (backing) {
		ret = map_backing(&rd, &cfg);
		if (ret)
			return ret;
	} else {
		rd.max_size = max_size > cfg.size ? max_size : cfg.size;
	}
	if (!backing && !null_mode) {
		/* reserved, not used: pages come (zeroed) when written */
		rd.mem = mmap(NULL, rd.max_size ? rd.max_size : 1,
			      PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (rd.mem == MAP_FAILED)
			return fail("cannot allocate the disk's memory", -errno);
	}
	rd.size = cfg.size;

	/* Signals wait for signal_thread; the library's workers never see them. */
	sigemptyset(&stop_signals);
	sigaddset(&stop_signals, SIGINT);
	sigaddset(&stop_signals, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

	ret = hybd_dev_create(&cfg, null_mode ? &null_driver : &ramdisk_driver,
			      &rd, &dev);
	if (ret)
		return fail(hybd_errmsg(), ret);
	ret = hybd_dev_start(dev);
	if (!ret && bpf_path)
		ret = hybd_bpf_attach(hybd_dev_id(dev), bpf_path, 0, &fast_path);
	if (ret) {
		fail(hybd_errmsg(), ret);
		hybd_dev_delete(dev);
		return 1;
	}
	if (fast_path)
		printf("fast path %s attached\n", bpf_path);
	printf("ready %s\n", hybd_dev_path(dev));
	fflush(stdout);
	pthread_create(&thread, NULL, signal_thread, dev);

	/* Returns once the device is gone: deleted by us, or by someone else. */
	ret = hybd_dev_wait(dev);
	if (ret)
		fail(hybd_errmsg(), ret);
	else if (hybd_dev_handed_over(dev))
		printf("ramdisk: %s handed over to a new server\n",
		       hybd_dev_path(dev));
	else if (!stopping)
		fprintf(stderr, "ramdisk: %s was deleted underneath us\n",
			hybd_dev_path(dev));
	if (ret || (!stopping && !hybd_dev_handed_over(dev))) {
		/* an unpinned fast path goes with the process */
		hybd_dev_delete(dev);
		return 1;
	}
	if (stopping)
		pthread_join(thread, NULL);
	hybd_dev_delete(dev);

	printf("ramdisk: reads=%lu writes=%lu flushes=%lu fua=%lu discards=%lu write_zeroes=%lu\n",
	       atomic_load(&rd.reads), atomic_load(&rd.writes),
	       atomic_load(&rd.flushes), atomic_load(&rd.fua),
	       atomic_load(&rd.discards), atomic_load(&rd.write_zeroes));
	if (rd.backed) {
		ret = msync(rd.mem, atomic_load(&rd.size), MS_SYNC);
		munmap(rd.mem, rd.max_size);
		close(rd.fd);
		if (ret)
			return fail("msync of the backing file", -errno);
	} else if (rd.mem) {
		munmap(rd.mem, rd.max_size ? rd.max_size : 1);
	}
	return 0;
}
