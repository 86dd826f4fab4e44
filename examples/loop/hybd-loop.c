// SPDX-License-Identifier: MIT
/*
 * hybd-loop - a block device over a file, served through io_uring: the
 * kernel loop device, in user space, with one thread per queue.
 *
 *   hybd-loop [--queues N] [--depth N] [--max-io BYTES] [--buffered]
 *             [--block-size BYTES] [--io-timeout SECONDS] [--id N]
 *             [--bpf PROG.bpf.o] [--recovery SECONDS] [--attach]
 *             [--remap[=ro]] [--poll-ns NS] [--front] [--always-uring] FILE
 *
 * The device has FILE's size (a multiple of 4 KiB); FILE is a regular file
 * or a block device (which takes no discards).  It prints "ready
 * /dev/hybdN" once the disk exists and serves it until SIGINT or SIGTERM
 * (or `hybdctl del`), then prints one line of statistics per queue:
 *
 *   hybd-loop: queue 0: requests=N max_inflight=M
 *
 * How it works: each queue's worker owns an io_uring (queue_init).  A
 * handler turns a request into an SQE on it and returns HYBD_IO_ASYNC; when
 * the worker has handed out every visible request it submits the batch
 * (queue_idle), and when the ring's fd is readable it reaps the CQEs and
 * completes the requests (hybd_queue_watch_fd).  So one thread keeps up to
 * the queue depth in flight, and neither side costs more than one system
 * call per batch.
 *
 * A file that cannot do non-blocking I/O (one on tmpfs) would cost a
 * thread hop per request in io_uring (its io-wq); its reads and writes are
 * done by the worker itself, in place (it says so at start), unless
 * --always-uring.
 *
 * By default the file is opened O_DIRECT, so the page cache is not used
 * twice (a file system on /dev/hybdN has its own); --buffered does not.
 * Flush is fdatasync(); a FUA write is written with RWF_DSYNC (a FUA
 * write-zeroes is followed by fdatasync()); discard
 * punches a hole; write-zeroes punches one too, or zeroes the range in
 * place (keeping it allocated) when the request says NOUNMAP.
 *
 * A write is in FILE (or its page cache) once it completes, so the device
 * may outlive this process: --recovery SECONDS holds its I/O that long for
 * a new hybd-loop when this one dies, and `--attach --id N FILE` is that new
 * one (it takes a live device over too: the old server hands over and
 * exits).  The new one must serve the same FILE.
 *
 * --remap registers FILE as the device's backing target 0, so that a fast
 * path can have the kernel serve requests on it: with bpf/loop.bpf.o
 * (--bpf, or `hybdctl attach` later) every request is remapped to the same
 * offset of FILE and this process serves nothing; without a program, or
 * for what the kernel refuses, it serves as before.  Both write FILE at
 * the same offsets with direct I/O, so they never disagree.  --remap=ro
 * registers it read-only: the kernel refuses to remap writes, discards
 * and write-zeroes (-EROFS), which the program then passes here.
 *
 * --poll-ns NS sets the device's poll_ns: a worker that runs out of
 * requests busy-polls that long for more before it sleeps, with --remap
 * the kernel's remap workers too if the kernel has feature remap_poll
 * (HYBD_DEV_F_REMAP_POLL; they poll only while their CPU has nothing else
 * to run).  It spends CPU to spare
 * submitters the wakeup of a sleeping worker.
 *
 * --front gives the device a bio-based front (HYBD_DEV_F_BIO_FRONT): with
 * --remap on a block device and loop.bpf.o, whose map() remaps every read
 * and write, /dev/hybdN clones each bio onto FILE as dm-linear would,
 * without a request of its own; the rest goes to the request-based disk
 * behind it (hybdNq) as before.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "hybd.h"

struct loop {
	int fd;
	unsigned int depth;
	struct hybd_bpf *fast_path;	/* --bpf */
	const char *bpf_path;
	bool remap;			/* --remap */
	bool remap_ro;			/* --remap=ro */
	/* FILE cannot do non-blocking I/O: reads and writes done in place */
	bool sync_rw;
	const char *path;
};

/* One queue: its ring and what it has done. */
struct loop_queue {
	struct io_uring ring;
	unsigned int inflight, max_inflight;
	uint64_t requests;
};

/*
 * Per request (hybd_io_data()): how much of a read or write is done, for
 * short transfers, which are resubmitted for the rest.
 */
struct loop_req {
	uint32_t done;
};

static struct io_uring_sqe *get_sqe(struct loop_queue *lq)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&lq->ring);

	/* the ring has room for a queue's depth; if not, make room */
	if (!sqe) {
		io_uring_submit(&lq->ring);
		sqe = io_uring_get_sqe(&lq->ring);
	}
	return sqe;
}

/* Queue the (rest of the) read or write of @io; HYBD_IO_ASYNC or -errno. */
static int queue_rw(struct hybd_io *io)
{
	struct loop *lo = hybd_io_priv(io);
	struct loop_queue *lq = hybd_queue_priv(hybd_io_hwq(io));
	struct loop_req *req = hybd_io_data(io);
	char *buf = (char *)hybd_io_buf(io) + req->done;
	uint64_t off = hybd_io_offset(io) + req->done;
	uint32_t len = hybd_io_len(io) - req->done;
	struct io_uring_sqe *sqe = get_sqe(lq);

	if (!sqe)
		return -EBUSY;
	if (hybd_io_op(io) == HYBD_OP_READ) {
		io_uring_prep_read(sqe, lo->fd, buf, len, off);
	} else {
		io_uring_prep_write(sqe, lo->fd, buf, len, off);
		if (hybd_io_flags(io) & HYBD_IO_F_FUA)
			sqe->rw_flags = RWF_DSYNC;
	}
	io_uring_sqe_set_data(sqe, io);
	return HYBD_IO_ASYNC;
}

/* Account for a request handed to the ring. */
static int started(struct hybd_io *io, int ret)
{
	struct loop_queue *lq = hybd_queue_priv(hybd_io_hwq(io));

	if (ret == HYBD_IO_ASYNC) {
		lq->requests++;
		if (++lq->inflight > lq->max_inflight)
			lq->max_inflight = lq->inflight;
	}
	return ret;
}

/*
 * A file that cannot do non-blocking I/O (tmpfs, say): io_uring would hand
 * each read and write to a thread of its own (io-wq), one more wakeup per
 * request, and a thread per request in flight.  The worker does them in
 * place instead, as the kernel loop's worker does.
 */
static int sync_rw(struct hybd_io *io, void *buf, uint64_t offset,
		   uint32_t len)
{
	struct loop *lo = hybd_io_priv(io);
	struct loop_queue *lq = hybd_queue_priv(hybd_io_hwq(io));
	bool rd = hybd_io_op(io) == HYBD_OP_READ;
	int flags = !rd && (hybd_io_flags(io) & HYBD_IO_F_FUA) ? RWF_DSYNC : 0;
	uint32_t done = 0;

	lq->requests++;
	while (done < len) {
		struct iovec iov = { (char *)buf + done, len - done };
		ssize_t n = rd ? preadv2(lo->fd, &iov, 1, offset + done, 0) :
				 pwritev2(lo->fd, &iov, 1, offset + done,
					  flags);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;	/* end of file inside the device */
		done += n;
	}
	return 0;
}

static int loop_read(struct hybd_io *io, void *buf, uint64_t offset,
		     uint32_t len)
{
	struct loop *lo = hybd_io_priv(io);
	struct loop_req *req = hybd_io_data(io);

	if (lo->sync_rw)
		return sync_rw(io, buf, offset, len);
	req->done = 0;
	return started(io, queue_rw(io));
}

/*
 * Can @fd do non-blocking reads (FMODE_NOWAIT)?  Asked with a read of the
 * first block that may not wait: a file that cannot says EOPNOTSUPP.
 */
static bool can_nowait(int fd)
{
	struct iovec iov = { .iov_len = 4096 };
	bool ret = true;

	iov.iov_base = aligned_alloc(4096, 4096);
	if (!iov.iov_base)
		return true;
	if (preadv2(fd, &iov, 1, 0, RWF_NOWAIT) < 0 && errno == EOPNOTSUPP)
		ret = false;
	free(iov.iov_base);
	return ret;
}

static int loop_write(struct hybd_io *io, const void *buf, uint64_t offset,
		      uint32_t len)
{
	return loop_read(io, (void *)buf, offset, len);
}

static int loop_flush(struct hybd_io *io)
{
	struct loop *lo = hybd_io_priv(io);
	struct loop_queue *lq = hybd_queue_priv(hybd_io_hwq(io));
	struct io_uring_sqe *sqe = get_sqe(lq);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_fsync(sqe, lo->fd, IORING_FSYNC_DATASYNC);
	io_uring_sqe_set_data(sqe, io);
	return started(io, HYBD_IO_ASYNC);
}

static int loop_fallocate(struct hybd_io *io, int mode, uint64_t offset,
			  uint32_t len)
{
	struct loop *lo = hybd_io_priv(io);
	struct loop_queue *lq = hybd_queue_priv(hybd_io_hwq(io));
	struct io_uring_sqe *sqe = get_sqe(lq);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_fallocate(sqe, lo->fd, mode, offset, len);
	io_uring_sqe_set_data(sqe, io);
	return started(io, HYBD_IO_ASYNC);
}

static int loop_discard(struct hybd_io *io, uint64_t offset, uint32_t len)
{
	return loop_fallocate(io, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      offset, len);
}

static int loop_write_zeroes(struct hybd_io *io, uint64_t offset,
			     uint32_t len)
{
	int mode = FALLOC_FL_KEEP_SIZE |
		   (hybd_io_flags(io) & HYBD_IO_F_NOUNMAP ?
		    FALLOC_FL_ZERO_RANGE : FALLOC_FL_PUNCH_HOLE);
	struct loop *lo = hybd_io_priv(io);

	/*
	 * With FUA (a zero write that a fast path passed as a write-zeroes,
	 * HYBD_BPF_PASS_ZEROES) it must be durable when it completes: rare
	 * enough to be done here, synchronously.
	 */
	if (hybd_io_flags(io) & HYBD_IO_F_FUA)
		return fallocate(lo->fd, mode, offset, len) ||
		       fdatasync(lo->fd) ? -errno : 0;
	return loop_fallocate(io, mode, offset, len);
}

/* The ring has completions: finish their requests (batched by libhybd). */
static void loop_reap(struct hybd_queue *q, int fd, void *arg)
{
	struct loop_queue *lq = hybd_queue_priv(q);
	struct io_uring_cqe *cqe;
	unsigned int head, seen = 0;
	bool resubmitted = false;

	(void)fd, (void)arg;
	io_uring_for_each_cqe(&lq->ring, head, cqe) {
		struct hybd_io *io = io_uring_cqe_get_data(cqe);
		enum hybd_io_op op = hybd_io_op(io);
		struct loop_req *req = hybd_io_data(io);
		int res = cqe->res;

		seen++;
		if (res > 0 && (op == HYBD_OP_READ || op == HYBD_OP_WRITE)) {
			req->done += res;
			res = 0;
			if (req->done < hybd_io_len(io)) {
				/* short: the rest goes out again */
				res = queue_rw(io);
				if (res == HYBD_IO_ASYNC) {
					resubmitted = true;
					continue;
				}
			}
		} else if (res == 0 && op == HYBD_OP_READ) {
			res = -EIO;	/* end of file inside the device */
		}
		lq->inflight--;
		hybd_io_complete(io, res);
	}
	io_uring_cq_advance(&lq->ring, seen);
	if (resubmitted)
		io_uring_submit(&lq->ring);
}

/*
 * Everything visible is handed out: submit it in one go.  What completed
 * during the submission (a read the page cache or tmpfs had) is reaped at
 * once, from the ring in memory: the worker then hands it to the kernel
 * without first sleeping in poll() to learn what it can see already.
 */
static void loop_idle(struct hybd_queue *q)
{
	struct loop_queue *lq = hybd_queue_priv(q);

	if (io_uring_sq_ready(&lq->ring))
		io_uring_submit(&lq->ring);
	if (io_uring_cq_ready(&lq->ring))
		loop_reap(q, lq->ring.ring_fd, NULL);
}

static int loop_queue_init(struct hybd_queue *q)
{
	struct loop *lo = hybd_dev_priv(hybd_queue_dev(q));
	struct loop_queue *lq = calloc(1, sizeof(*lq));
	int ret;

	if (!lq)
		return -ENOMEM;
	/* room for every request of the queue, and their resubmissions */
	ret = io_uring_queue_init(2 * lo->depth, &lq->ring, 0);
	if (ret) {
		free(lq);
		return ret;
	}
	hybd_queue_set_priv(q, lq);
	ret = hybd_queue_watch_fd(q, lq->ring.ring_fd, loop_reap, NULL);
	if (ret) {
		io_uring_queue_exit(&lq->ring);
		free(lq);
	}
	return ret;
}

static void loop_queue_exit(struct hybd_queue *q)
{
	struct loop_queue *lq = hybd_queue_priv(q);

	/* the kernel failed whatever is left when the device went away;
	 * the ring's own I/O is waited for by io_uring_queue_exit()
	 */
	fprintf(stderr, "hybd-loop: queue %u: requests=%" PRIu64
		" max_inflight=%u\n", hybd_queue_index(q), lq->requests,
		lq->max_inflight);
	io_uring_queue_exit(&lq->ring);
	free(lq);
}

static void loop_ready(struct hybd_dev *dev)
{
	struct loop *lo = hybd_dev_priv(dev);
	int ret;

	if (lo->bpf_path) {
		ret = hybd_bpf_attach(hybd_dev_id(dev), lo->bpf_path, 0,
				      &lo->fast_path);
		if (ret)
			fprintf(stderr, "hybd-loop: %s: %s\n", lo->bpf_path,
				hybd_errmsg());
		else
			printf("fast path %s attached\n", lo->bpf_path);
	}
	printf("ready %s\n", hybd_dev_path(dev));
	fflush(stdout);
}

/* --remap: before any request, FILE becomes backing target 0. */
static int loop_prepare(struct hybd_dev *dev)
{
	struct loop *lo = hybd_dev_priv(dev);
	int index;

	if (!lo->remap)
		return 0;
	index = hybd_dev_add_backing(dev, lo->fd,
				     lo->remap_ro ? 0 : HYBD_BACKING_F_WRITE,
				     NULL);
	if (index < 0) {
		fprintf(stderr, "hybd-loop: --remap: %s\n", hybd_errmsg());
		return index;
	}
	if (index != 0) {
		fprintf(stderr, "hybd-loop: --remap: FILE is backing target %d, not 0\n",
			index);
		return -EEXIST;
	}
	printf("backing target 0: %s%s\n", lo->path,
	       lo->remap_ro ? " (read-only)" : "");
	return 0;
}

static const struct hybd_driver loop_driver = {
	.read		= loop_read,
	.write		= loop_write,
	.flush		= loop_flush,
	.discard	= loop_discard,
	.write_zeroes	= loop_write_zeroes,
	.queue_init	= loop_queue_init,
	.queue_exit	= loop_queue_exit,
	.queue_idle	= loop_idle,
	.ready		= loop_ready,
	.prepare	= loop_prepare,
};

/*
 * Over a block device: no discard, which a device may not be able to do
 * without writing (fallocate() would fail it); write-zeroes zeroes out.
 */
static const struct hybd_driver loop_bdev_driver = {
	.read		= loop_read,
	.write		= loop_write,
	.flush		= loop_flush,
	.write_zeroes	= loop_write_zeroes,
	.queue_init	= loop_queue_init,
	.queue_exit	= loop_queue_exit,
	.queue_idle	= loop_idle,
	.ready		= loop_ready,
	.prepare	= loop_prepare,
};

static const char usage[] =
	"usage: hybd-loop [--queues N] [--depth N] [--max-io BYTES] [--buffered]\n"
	"                 [--block-size BYTES] [--io-timeout SECONDS] [--id N]\n"
	"                 [--bpf PROG.bpf.o] [--recovery SECONDS] [--attach]\n"
	"                 [--remap[=ro]] [--poll-ns NS] [--front] [--always-uring] FILE\n";

static uint64_t number(const char *name, const char *s)
{
	uint64_t v;

	if (hybd_parse_size(s, &v)) {
		fprintf(stderr, "hybd-loop: --%s %s: %s\n", name, s,
			hybd_errmsg());
		exit(2);
	}
	return v;
}

/* A count of nanoseconds; the library refuses more than it takes. */
static uint32_t nanoseconds(const char *name, const char *s)
{
	unsigned long long v;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-') {
		fprintf(stderr, "hybd-loop: --%s %s: not a number of nanoseconds\n",
			name, s);
		exit(2);
	}
	return v > UINT32_MAX ? UINT32_MAX : v;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "queues", required_argument, NULL, 'q' },
		{ "depth", required_argument, NULL, 'd' },
		{ "max-io", required_argument, NULL, 'm' },
		{ "buffered", no_argument, NULL, 'B' },
		{ "io-timeout", required_argument, NULL, 't' },
		{ "id", required_argument, NULL, 'i' },
		{ "bpf", required_argument, NULL, 'b' },
		{ "recovery", required_argument, NULL, 'R' },
		{ "attach", no_argument, NULL, 'A' },
		{ "remap", optional_argument, NULL, 'r' },
		{ "block-size", required_argument, NULL, 'l' },
		{ "always-uring", no_argument, NULL, 'U' },
		{ "poll-ns", required_argument, NULL, 'P' },
		{ "front", no_argument, NULL, 'F' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct loop lo = { .fd = -1 };
	struct hybd_config cfg;
	uint64_t size;
	int c, i = 0, flags = O_RDWR | O_CLOEXEC | O_DIRECT, ret;
	bool always_uring = false;
	struct stat st;

	hybd_config_init(&cfg);
	while ((c = getopt_long(argc, argv, "h", opts, &i)) != -1) {
		const char *name = opts[i].name;

		switch (c) {
		case 'q': cfg.nr_queues = number(name, optarg); break;
		case 'd': cfg.queue_depth = number(name, optarg); break;
		case 'm': cfg.max_io_bytes = number(name, optarg); break;
		case 'B': flags &= ~O_DIRECT; break;
		case 'U': always_uring = true; break;
		case 't': cfg.io_timeout = number(name, optarg); break;
		case 'i': cfg.dev_id = number(name, optarg); break;
		case 'b': lo.bpf_path = optarg; break;
		case 'R': cfg.recovery_timeout = number(name, optarg); break;
		case 'A': cfg.lib_flags |= HYBD_CFG_ATTACH; break;
		case 'r':
			lo.remap = true;
			if (optarg && strcmp(optarg, "ro")) {
				fprintf(stderr, "hybd-loop: --remap=%s: only ro may follow\n",
					optarg);
				return 2;
			}
			lo.remap_ro = optarg;
			break;
		case 'l': cfg.logical_block_size = number(name, optarg); break;
		case 'P': cfg.poll_ns = nanoseconds(name, optarg); break;
		case 'F': cfg.flags |= HYBD_DEV_F_BIO_FRONT; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind != argc - 1) {
		fputs(usage, stderr);
		return 2;
	}

	lo.fd = open(argv[optind], flags);
	if (lo.fd < 0 || fstat(lo.fd, &st)) {
		fprintf(stderr, "hybd-loop: %s: %s\n", argv[optind],
			strerror(errno));
		return 1;
	}
	size = st.st_size;
	if (S_ISBLK(st.st_mode) && ioctl(lo.fd, BLKGETSIZE64, &size))
		size = 0;
	if ((!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) || !size ||
	    size % 4096) {
		fprintf(stderr, "hybd-loop: %s: not a regular file or block device of a multiple of 4 KiB\n",
			argv[optind]);
		return 1;
	}
	if (lo.remap && !(flags & O_DIRECT)) {
		fprintf(stderr, "hybd-loop: --remap and --buffered do not mix: the kernel's remaps use direct I/O\n");
		return 2;
	}
	/* the kernel's remap workers poll as ours do, if it can */
	if (lo.remap && cfg.poll_ns) {
		struct hybd_ctl_features f;

		ret = hybd_ctl_features(&f);
		if (!ret && (f.features & HYBD_F_REMAP_POLL))
			cfg.flags |= HYBD_DEV_F_REMAP_POLL;
		else if (!ret)
			fprintf(stderr, "hybd-loop: --poll-ns: this kernel's remap workers do not poll (no feature remap_poll)\n");
		else
			fprintf(stderr, "hybd-loop: --poll-ns: cannot ask the kernel whether its remap workers poll: %s\n",
				hybd_errmsg());
	}
	lo.path = argv[optind];
	lo.sync_rw = !always_uring && !can_nowait(lo.fd);
	if (lo.sync_rw)
		printf("%s cannot do non-blocking I/O: reads and writes are done by the workers\n",
		       lo.path);
	cfg.size = size;
	cfg.io_priv_size = sizeof(struct loop_req);
	if (cfg.lib_flags & HYBD_CFG_ATTACH) {
		struct hybd_dev_info di;

		/* the rings are sized by the device's depth, not ours */
		if (cfg.dev_id < 0 || lo.bpf_path) {
			fprintf(stderr, "hybd-loop: --attach needs --id N, and takes no --bpf\n");
			return 2;
		}
		if (hybd_ctl_info(cfg.dev_id, &di)) {
			fprintf(stderr, "hybd-loop: %s\n", hybd_errmsg());
			return 1;
		}
		cfg.queue_depth = di.params.basic.queue_depth;
	}
	lo.depth = cfg.queue_depth;

	ret = hybd_run(&cfg, S_ISBLK(st.st_mode) ? &loop_bdev_driver :
			   &loop_driver, &lo);
	hybd_bpf_close(lo.fast_path);
	close(lo.fd);
	if (ret) {
		fprintf(stderr, "hybd-loop: %s\n", hybd_errmsg());
		return 1;
	}
	return 0;
}
