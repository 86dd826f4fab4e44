// SPDX-License-Identifier: MIT
/*
 * badserver - a hybd server that breaks the completion-ring protocol on
 * purpose, so that tests can check that the kernel rejects, counts and
 * survives it.
 *
 *   badserver MODE [--size BYTES] [--io-timeout SECONDS] [--recovery SECONDS]
 *
 * It adds a device (1 queue, depth 16, 4 KiB blocks, read and write only,
 * no write cache, 16 MiB unless --size), serves it correctly from a
 * zero-filled memory disk while HYBD_SRV_START scans the partitions, prints
 * "ready /dev/hybdN", and from then on misbehaves on every request:
 *
 *   good             no misbehaviour
 *   unknown-tag      a completion for tag depth+100 first, then the right one
 *   double-complete  the right completion, committed, then the same again
 *   stale-seq        a completion with seq+12345 first, then the right one
 *   bad-result       result 4242 (not 0 or -errno) instead of the right one
 *   garbage-ring     cq_tail jumps by 0x10000 and is committed, then the
 *                    right completion is posted from the new tail
 *   eagain, enomem, enospc, eopnotsupp
 *                    every request fails with that errno
 *   late             every request is completed 3 s late, with a second
 *                    thread committing meanwhile (for the I/O timeout)
 *   fork-child       serves correctly, but forks a child right after
 *                    "ready" that sleeps, holding the server node open
 *                    (the child's pid is printed as "child PID")
 *   two-waiters      serves correctly; before HYBD_SRV_START, while the
 *                    serving thread sleeps in HYBD_SRV_IO, a second thread
 *                    waits on the queue too and leaves on a signal (EINTR):
 *                    the serving thread must still be woken
 *   resize-silent    serves correctly and says it answers resizes
 *                    (HYBD_DEV_F_RESIZE), but never does
 *   resize-garbage   serves correctly; answers a resize with result 4242,
 *                    then for the wrong request, then with 0 (the disk
 *                    does not grow: requests beyond it fail); exits 1 if
 *                    the kernel takes either bad answer
 *   resize-hold      serves correctly; on a resize request takes no
 *                    request for 1 s (what comes stays in flight), then
 *                    accepts it ("accepted GEN") and takes none for 3 s
 *   self-resize      serves correctly; after "ready", resizes its own
 *                    device (HYBD_SRV_RESIZE) to half its size and back,
 *                    printing "size BYTES published BYTES" after each
 *                    (the second: the ring header's dev_size then)
 *   backing-fd3      serves correctly; after "ready", registers the file
 *                    open at descriptor 3 (inherited) as a writable
 *                    backing target and prints "backing 0" or "backing
 *                    ERRNO" (the kernel's errno, a number)
 *
 * In every mode, a change of the ring header's dev_size (the size the
 * kernel committed) is printed as "dev_size BYTES".
 *
 * --io-timeout sets the device's I/O timeout (default: libhybd's, 30 s).
 * --recovery sets its recovery timeout: killed, it holds the device's I/O
 * that long for a new server (examples/ramdisk --attach).
 *
 * SIGINT/SIGTERM: delete the device and exit 0.  The device deleted by
 * someone else: exit 0.  Anything else going wrong: exit 1.
 *
 * It speaks the raw UAPI (only hybd_ctl_add() and the parsers come from
 * libhybd) so that nothing between it and the kernel tidies up its mess.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hybd.h"

#define DEPTH		16
#define SECTOR_SHIFT	9

enum mode {
	GOOD, UNKNOWN_TAG, DOUBLE_COMPLETE, STALE_SEQ, BAD_RESULT, GARBAGE_RING,
	E_AGAIN, E_NOMEM, E_NOSPC, E_OPNOTSUPP, LATE, FORK_CHILD, TWO_WAITERS,
	RESIZE_SILENT, RESIZE_GARBAGE, SELF_RESIZE, BACKING_FD3, RESIZE_HOLD,
};

static const char *const mode_names[] = {
	[GOOD] = "good",
	[UNKNOWN_TAG] = "unknown-tag",
	[DOUBLE_COMPLETE] = "double-complete",
	[STALE_SEQ] = "stale-seq",
	[BAD_RESULT] = "bad-result",
	[GARBAGE_RING] = "garbage-ring",
	[E_AGAIN] = "eagain",
	[E_NOMEM] = "enomem",
	[E_NOSPC] = "enospc",
	[E_OPNOTSUPP] = "eopnotsupp",
	[LATE] = "late",
	[FORK_CHILD] = "fork-child",
	[TWO_WAITERS] = "two-waiters",
	[RESIZE_SILENT] = "resize-silent",
	[RESIZE_GARBAGE] = "resize-garbage",
	[SELF_RESIZE] = "self-resize",
	[BACKING_FD3] = "backing-fd3",
	[RESIZE_HOLD] = "resize-hold",
};

static const int mode_errno[] = {
	[E_AGAIN] = EAGAIN,
	[E_NOMEM] = ENOMEM,
	[E_NOSPC] = ENOSPC,
	[E_OPNOTSUPP] = EOPNOTSUPP,
};

#define NR_MODES	(sizeof(mode_names) / sizeof(mode_names[0]))

static struct {
	enum mode mode;
	atomic_int misbehave;	/* set once HYBD_SRV_START returned */
	int fd;
	uint32_t id;
	uint64_t size;
	uint32_t io_timeout;
	uint32_t recovery_timeout;	/* --recovery, 0: none */
	unsigned char *disk;

	struct hybd_ring_hdr *hdr;
	uint32_t *sq;
	struct hybd_cqe *cq;
	struct hybd_io_desc *desc;
	unsigned char *data;
	uint32_t entries, depth, max_io;
	uint32_t sq_head, cq_tail;
	int serve_err;
} srv;

static void die(const char *what, int err)
{
	fprintf(stderr, "badserver: %s (%s)\n", what, strerror(err));
	if (srv.id != HYBD_DEV_ID_ANY)
		hybd_ctl_del(srv.id);
	exit(1);
}

/* HYBD_SRV_IO: commit what is posted, and wait for work if @flags says so. */
static int srv_io(uint16_t flags)
{
	struct hybd_srv_io io = {
		.len = sizeof(io),
		.queue = 0,
		.flags = flags,
	};
	int ret;

	do {
		ret = ioctl(srv.fd, HYBD_SRV_IO, &io);
	} while (ret < 0 && errno == EINTR);
	return ret < 0 ? -errno : ret;
}

/* Put a completion on the ring, committing first if the ring is full. */
static void post(uint32_t tag, int32_t result, uint64_t seq)
{
	struct hybd_cqe *cqe;

	while (srv.cq_tail - __atomic_load_n(&srv.hdr->cq_head,
					     __ATOMIC_ACQUIRE) >= srv.entries) {
		if (srv_io(0) < 0)
			return;
	}
	cqe = &srv.cq[srv.cq_tail & (srv.entries - 1)];
	cqe->tag = tag;
	cqe->result = result;
	cqe->seq = seq;
	srv.cq_tail++;
	__atomic_store_n(&srv.hdr->cq_tail, srv.cq_tail, __ATOMIC_RELEASE);
}

/* Do the request's I/O on the memory disk; returns 0 or -errno. */
static int do_io(uint32_t tag, const struct hybd_io_desc *d)
{
	unsigned char *buf = srv.data + (size_t)tag * srv.max_io;
	uint64_t off = d->sector << SECTOR_SHIFT;

	if (d->nr_bytes > srv.max_io || off > srv.size ||
	    d->nr_bytes > srv.size - off)
		return -EIO;
	switch (d->op) {
	case HYBD_OP_READ:
		memcpy(buf, srv.disk + off, d->nr_bytes);
		return 0;
	case HYBD_OP_WRITE:
		memcpy(srv.disk + off, buf, d->nr_bytes);
		return 0;
	default:
		return -EOPNOTSUPP;
	}
}

static void serve_one(uint32_t tag)
{
	const struct hybd_io_desc *shared = &srv.desc[tag];
	struct hybd_io_desc d = {
		.op = __atomic_load_n(&shared->op, __ATOMIC_RELAXED),
		.nr_bytes = __atomic_load_n(&shared->nr_bytes, __ATOMIC_RELAXED),
		.sector = __atomic_load_n(&shared->sector, __ATOMIC_RELAXED),
		.seq = __atomic_load_n(&shared->seq, __ATOMIC_RELAXED),
	};
	int res = do_io(tag, &d);

	if (!atomic_load(&srv.misbehave)) {
		post(tag, res, d.seq);
		return;
	}
	switch (srv.mode) {
	case GOOD:
	case FORK_CHILD:
	case TWO_WAITERS:
	case RESIZE_SILENT:
	case RESIZE_GARBAGE:
	case SELF_RESIZE:
	case BACKING_FD3:
	case RESIZE_HOLD:
		post(tag, res, d.seq);
		break;
	case E_AGAIN:
	case E_NOMEM:
	case E_NOSPC:
	case E_OPNOTSUPP:
		post(tag, -mode_errno[srv.mode], d.seq);
		break;
	case LATE:
		/* the kernel may have failed and reused the tag meanwhile */
		sleep(3);
		post(tag, res, d.seq);
		break;
	case UNKNOWN_TAG:
		post(srv.depth + 100, res, d.seq);
		post(tag, res, d.seq);
		break;
	case DOUBLE_COMPLETE:
		post(tag, res, d.seq);
		srv_io(0);
		post(tag, res, d.seq);
		srv_io(0);
		break;
	case STALE_SEQ:
		post(tag, res, d.seq + 12345);
		post(tag, res, d.seq);
		break;
	case BAD_RESULT:
		post(tag, 4242, d.seq);
		break;
	case GARBAGE_RING:
		srv.cq_tail += 0x10000;
		__atomic_store_n(&srv.hdr->cq_tail, srv.cq_tail,
				 __ATOMIC_RELEASE);
		srv_io(0);
		post(tag, res, d.seq);
		break;
	}
}

/* HYBD_SRV_RESIZE; 0 or -errno */
static int srv_resize(uint32_t flags, uint64_t size, uint32_t gen,
		      int32_t result)
{
	struct hybd_srv_resize r = {
		.len = sizeof(r), .flags = flags, .size = size, .gen = gen,
		.result = result,
	};

	return ioctl(srv.fd, HYBD_SRV_RESIZE, &r) < 0 ? -errno : 0;
}

/* RESIZE_GARBAGE: two bad answers the kernel must refuse, then a good one */
static void answer_resize(void)
{
	static uint32_t answered;
	uint32_t gen = __atomic_load_n(&srv.hdr->resize_gen, __ATOMIC_ACQUIRE);
	int ret;

	if (gen == answered)
		return;
	answered = gen;
	ret = srv_resize(HYBD_SRV_RESIZE_F_ANSWER, 0, gen, 4242);
	if (ret != -EINVAL)
		die("a resize answer of 4242 was not refused with EINVAL",
		    ret ? -ret : EPROTO);
	ret = srv_resize(HYBD_SRV_RESIZE_F_ANSWER, 0, gen + 1, 0);
	if (ret != -ESTALE)
		die("an answer to the wrong resize was not refused with ESTALE",
		    ret ? -ret : EPROTO);
	ret = srv_resize(HYBD_SRV_RESIZE_F_ANSWER, 0, gen, 0);
	if (ret)
		die("the resize answer was refused", -ret);
}

/*
 * RESIZE_HOLD: let requests come, accept, and keep them in flight for 3 s
 * more, so that the kernel's drain after the answer has one to wait for.
 */
static void accept_and_hold(void)
{
	static uint32_t answered;
	uint32_t gen = __atomic_load_n(&srv.hdr->resize_gen, __ATOMIC_ACQUIRE);
	int ret;

	if (gen == answered)
		return;
	answered = gen;
	sleep(1);
	ret = srv_resize(HYBD_SRV_RESIZE_F_ANSWER, 0, gen, 0);
	if (ret)
		die("the resize answer was refused", -ret);
	printf("accepted %u\n", gen);
	fflush(stdout);
	sleep(3);
}

/* The size the kernel committed last, from the ring header */
static unsigned long long published(void)
{
	return __atomic_load_n(&srv.hdr->dev_size, __ATOMIC_ACQUIRE);
}

/* Say when the kernel's committed size changes. */
static void report_dev_size(void)
{
	static uint64_t seen;
	uint64_t size = __atomic_load_n(&srv.hdr->dev_size, __ATOMIC_ACQUIRE);

	if (!seen)
		seen = size;
	if (size == seen)
		return;
	seen = size;
	printf("dev_size %llu\n", (unsigned long long)size);
	fflush(stdout);
}

/* The serving loop: commit and wait, then drain the submission ring. */
static void *serve(void *arg)
{
	uint32_t tail;
	int ret, pending;

	(void)arg;
	for (;;) {
		/* our own commits may have made the kernel think we saw these */
		pending = __atomic_load_n(&srv.hdr->sq_tail, __ATOMIC_ACQUIRE) !=
			  srv.sq_head;
		ret = srv_io(pending ? 0 : HYBD_SRV_IO_WAIT);
		if (ret < 0) {
			if (ret != -ENODEV) {
				fprintf(stderr, "badserver: HYBD_SRV_IO: %s\n",
					strerror(-ret));
				srv.serve_err = 1;
			}
			break;
		}
		report_dev_size();
		if ((srv.mode == RESIZE_GARBAGE || srv.mode == RESIZE_HOLD) &&
		    (__atomic_load_n(&srv.hdr->flags, __ATOMIC_ACQUIRE) &
		     HYBD_RING_RESIZE)) {
			if (srv.mode == RESIZE_GARBAGE)
				answer_resize();
			else
				accept_and_hold();
		}
		tail = __atomic_load_n(&srv.hdr->sq_tail, __ATOMIC_ACQUIRE);
		while (srv.sq_head != tail) {
			uint32_t tag = srv.sq[srv.sq_head++ & (srv.entries - 1)];

			if (tag < srv.depth)
				serve_one(tag);
		}
		__atomic_store_n(&srv.hdr->sq_head, srv.sq_head,
				 __ATOMIC_RELEASE);
	}
	kill(getpid(), SIGUSR1);	/* wake main */
	return NULL;
}

static void setup(void)
{
	struct hybd_srv_info info = { .len = sizeof(info) };
	struct hybd_config cfg;
	char path[64];
	void *area;
	int ret, tries;

	hybd_config_init(&cfg);
	cfg.size = srv.size;
	cfg.nr_queues = 1;
	cfg.queue_depth = DEPTH;
	cfg.logical_block_size = 4096;
	cfg.physical_block_size = 4096;
	cfg.ops = HYBD_OPF_READ | HYBD_OPF_WRITE;
	cfg.flags = 0;
	if (srv.mode == RESIZE_SILENT || srv.mode == RESIZE_GARBAGE ||
	    srv.mode == RESIZE_HOLD)
		cfg.flags |= HYBD_DEV_F_RESIZE;
	if (srv.io_timeout != UINT32_MAX)
		cfg.io_timeout = srv.io_timeout;
	cfg.recovery_timeout = srv.recovery_timeout;
	ret = hybd_ctl_add(&cfg, &srv.id);
	if (ret) {
		srv.id = HYBD_DEV_ID_ANY;
		die(hybd_errmsg(), -ret);
	}

	snprintf(path, sizeof(path), "/dev/" HYBD_SRV_NAME_FMT, srv.id);
	for (tries = 0; tries < 200; tries++) {
		srv.fd = open(path, O_RDWR | O_CLOEXEC);
		if (srv.fd >= 0 || errno != ENOENT)
			break;
		usleep(10000);	/* udev may still be creating it */
	}
	if (srv.fd < 0)
		die(path, errno);
	if (ioctl(srv.fd, HYBD_SRV_GET_INFO, &info) < 0)
		die("HYBD_SRV_GET_INFO", errno);
	area = mmap(NULL, info.queue_map_size, PROT_READ | PROT_WRITE,
		    MAP_SHARED, srv.fd, 0);
	if (area == MAP_FAILED)
		die("mmap of queue 0", errno);

	srv.hdr = area;
	srv.entries = srv.hdr->ring_entries;
	srv.depth = srv.hdr->queue_depth;
	srv.max_io = srv.hdr->max_io_bytes;
	srv.sq = (uint32_t *)((char *)area + srv.hdr->sq_off);
	srv.cq = (struct hybd_cqe *)((char *)area + srv.hdr->cq_off);
	srv.desc = (struct hybd_io_desc *)((char *)area + srv.hdr->desc_off);
	srv.data = (unsigned char *)area + srv.hdr->data_off;
	srv.sq_head = srv.hdr->sq_head;
	srv.cq_tail = srv.hdr->cq_tail;
	if (!srv.entries || (srv.entries & (srv.entries - 1)) ||
	    srv.depth != DEPTH || srv.depth > srv.entries)
		die("unexpected ring header", EPROTO);
}

/* LATE: keep committing (without waiting) so that the kernel sees traffic */
static void *commit_loop(void *arg)
{
	(void)arg;
	while (srv_io(0) >= 0)
		usleep(100000);
	return NULL;
}

/*
 * FORK_CHILD: a child that inherits the server node's descriptor (not its
 * mappings: the kernel marks them VM_DONTCOPY) and just sleeps, as a
 * helper process a real server might fork would.
 */
static void fork_child(void)
{
	pid_t pid = fork();

	if (pid < 0)
		die("fork", errno);
	if (pid == 0) {
		for (;;)
			pause();
	}
	printf("child %d\n", (int)pid);
	fflush(stdout);
}

static void on_sigusr2(int sig)
{
	(void)sig;
}

/* TWO_WAITERS: wait once on queue 0; the result (0 or errno) at @arg */
static void *wait_once(void *arg)
{
	struct hybd_srv_io io = {
		.len = sizeof(io),
		.queue = 0,
		.flags = HYBD_SRV_IO_WAIT,
	};
	sigset_t usr2;

	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	pthread_sigmask(SIG_UNBLOCK, &usr2, NULL);
	*(int *)arg = ioctl(srv.fd, HYBD_SRV_IO, &io) < 0 ? errno : 0;
	return NULL;
}

/*
 * TWO_WAITERS: a second waiter comes while the serving thread sleeps
 * (nothing is submitted before HYBD_SRV_START) and leaves on a signal.
 */
static void second_waiter(void)
{
	struct sigaction sa = { .sa_handler = on_sigusr2 };	/* no SA_RESTART */
	pthread_t waiter;
	int ret, result = -1;

	if (sigaction(SIGUSR2, &sa, NULL) < 0)
		die("sigaction", errno);
	usleep(200000);		/* the serving thread is asleep by now */
	ret = pthread_create(&waiter, NULL, wait_once, &result);
	if (ret)
		die("cannot start the second waiter", ret);
	usleep(200000);
	pthread_kill(waiter, SIGUSR2);
	pthread_join(waiter, NULL);
	if (result != EINTR)
		die("the second waiter did not end with EINTR",
		    result ? result : EPROTO);
}

static void usage(void)
{
	size_t i;

	fprintf(stderr,
		"usage: badserver MODE [--size BYTES] [--io-timeout SECONDS] [--recovery SECONDS]\nmodes:");
	for (i = 0; i < NR_MODES; i++)
		fprintf(stderr, " %s", mode_names[i]);
	fprintf(stderr, "\n");
	exit(2);
}

int main(int argc, char **argv)
{
	pthread_t thread, committer;
	sigset_t sigs;
	size_t i;
	int arg, sig, ret;

	srv.id = HYBD_DEV_ID_ANY;
	srv.size = 16 << 20;
	srv.io_timeout = UINT32_MAX;
	if (argc < 2 || argc % 2)
		usage();
	for (i = 0; i < NR_MODES && strcmp(argv[1], mode_names[i]); i++)
		;
	if (i == NR_MODES)
		usage();
	srv.mode = i;
	for (arg = 2; arg < argc; arg += 2) {
		uint64_t v;

		if (hybd_parse_size(argv[arg + 1], &v) < 0)
			usage();
		if (!strcmp(argv[arg], "--size"))
			srv.size = v;
		else if (!strcmp(argv[arg], "--io-timeout") && v < UINT32_MAX)
			srv.io_timeout = v;
		else if (!strcmp(argv[arg], "--recovery") && v < UINT32_MAX)
			srv.recovery_timeout = v;
		else
			usage();
	}
	srv.disk = calloc(1, srv.size ? srv.size : 1);
	if (!srv.disk)
		die("cannot allocate the disk", ENOMEM);

	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);

	setup();
	ret = pthread_create(&thread, NULL, serve, NULL);
	if (ret)
		die("cannot start the serving thread", ret);
	if (srv.mode == TWO_WAITERS)
		second_waiter();
	if (ioctl(srv.fd, HYBD_SRV_START, 0) < 0)
		die("HYBD_SRV_START", errno);
	atomic_store(&srv.misbehave, 1);
	printf("ready /dev/" HYBD_DISK_NAME_FMT "\n", srv.id);
	fflush(stdout);
	if (srv.mode == LATE) {
		/* commits go on while the serving thread sleeps */
		ret = pthread_create(&committer, NULL, commit_loop, NULL);
		if (ret)
			die("cannot start the committing thread", ret);
	}
	if (srv.mode == FORK_CHILD)
		fork_child();
	if (srv.mode == BACKING_FD3) {
		struct hybd_srv_backing b = {
			.len = sizeof(b), .fd = 3, .flags = HYBD_BACKING_F_WRITE,
		};

		ret = ioctl(srv.fd, HYBD_SRV_ADD_BACKING, &b) < 0 ? errno : 0;
		printf("backing %d\n", ret);
		fflush(stdout);
	}
	if (srv.mode == SELF_RESIZE) {
		/* from this thread, not the serving one: a shrink drains */
		ret = srv_resize(0, srv.size / 2, 0, 0);
		if (ret)
			die("HYBD_SRV_RESIZE to half", -ret);
		printf("size %llu published %llu\n",
		       (unsigned long long)srv.size / 2, published());
		ret = srv_resize(0, srv.size, 0, 0);
		if (ret)
			die("HYBD_SRV_RESIZE back", -ret);
		printf("size %llu published %llu\n",
		       (unsigned long long)srv.size, published());
		fflush(stdout);
	}

	sigwait(&sigs, &sig);
	if (sig != SIGUSR1) {
		/* the kernel drains the disk through the serving thread */
		ret = hybd_ctl_del(srv.id);
		if (ret && ret != -ENODEV)
			fprintf(stderr, "badserver: %s (%s)\n", hybd_errmsg(),
				strerror(-ret));
	}
	pthread_join(thread, NULL);
	return srv.serve_err;
}
