// SPDX-License-Identifier: MIT
/*
 * slowdrv - a memory disk with only .read and .write, run by hybd_run(),
 * whose handlers may block: for the tests of the operations that follow the
 * handlers, the thread pool, worker placement and hybd_run()'s signals.
 *
 *   slowdrv [--size BYTES] [--queues N] [--threads N] [--delay-ms N]
 *           [--idle-batch] [--recovery SECONDS] [--attach --id N]
 *           [--queue-affinity | --no-affinity | --pool-spread]
 *   slowdrv --after-delete
 *
 * Prints "ready /dev/hybdN", "config id=N size=... queues=... depth=...
 * max_io=... lbs=... pbs=... ops=0x.. flags=0x.. io_timeout=..."
 * (hybd_dev_config()), then one line per queue
 * "queue Q cpus C1,C2,..." (hybd_queue_cpus()), once the disk exists.  On
 * the way out (SIGINT/SIGTERM or a delete from outside) it prints
 * "slowdrv: requests=N max_concurrent=M exit=R": the most handlers that
 * ran at once, and hybd_run()'s result.
 *
 * --idle-batch: the way an io_uring driver batches (examples/loop): each
 * handler copies its data and keeps the request (HYBD_IO_ASYNC), and
 * queue_idle completes what the handlers kept, as one io_uring_submit()
 * would start it.  Each queue watches an eventfd that never fires, so the
 * worker runs in event mode.  For the handover test: a request kept must
 * end even when the handover is seen before the worker idles.
 * --recovery and --attach --id N: as hybd-loop's (a new slowdrv starts
 * with zeroed memory: for tests that read only).
 *
 * --queue-affinity, --no-affinity, --pool-spread: HYBD_CFG_QUEUE_AFFINITY,
 * _NO_AFFINITY, _POOL_SPREAD.
 *
 * --after-delete: create and start with the explicit calls, delete the
 * device from outside (hybd_ctl_del), wait for the workers, and only then
 * ask for queue 0's CPUs (the server's node outlives the device) and print
 * "after-delete: N" (or the error), then free the device.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "hybd.h"

struct slow {
	unsigned char *mem;
	unsigned int delay_ms;
	atomic_uint running, max_running;
	atomic_ulong requests;
	bool idle_batch;
	unsigned int depth;
};

/* --idle-batch: a queue's requests kept until queue_idle */
struct batch {
	int efd;
	unsigned int n;
	struct hybd_io *io[];
};

static void enter(struct slow *s)
{
	unsigned int now = atomic_fetch_add(&s->running, 1) + 1;
	unsigned int max = atomic_load(&s->max_running);

	while (now > max && !atomic_compare_exchange_weak(&s->max_running,
							  &max, now))
		;
	atomic_fetch_add(&s->requests, 1);
	if (s->delay_ms) {
		struct timespec ts = {
			.tv_sec = s->delay_ms / 1000,
			.tv_nsec = (s->delay_ms % 1000) * 1000000L,
		};

		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
}

/* Done now, or (--idle-batch) kept for queue_idle. */
static int slow_done(struct slow *s, struct hybd_io *io)
{
	struct batch *b;

	atomic_fetch_sub(&s->running, 1);
	if (!s->idle_batch)
		return 0;
	b = hybd_queue_priv(hybd_io_hwq(io));
	if (b->n == s->depth)	/* one per tag: cannot happen */
		return 0;
	b->io[b->n++] = io;
	return HYBD_IO_ASYNC;
}

static int slow_read(struct hybd_io *io, void *buf, uint64_t off, uint32_t len)
{
	struct slow *s = hybd_io_priv(io);

	enter(s);
	memcpy(buf, s->mem + off, len);
	return slow_done(s, io);
}

static int slow_write(struct hybd_io *io, const void *buf, uint64_t off,
		      uint32_t len)
{
	struct slow *s = hybd_io_priv(io);

	enter(s);
	memcpy(s->mem + off, buf, len);
	return slow_done(s, io);
}

static void never(struct hybd_queue *q, int fd, void *arg)
{
	(void)q, (void)fd, (void)arg;
}

static int batch_init(struct hybd_queue *q)
{
	struct slow *s = hybd_dev_priv(hybd_queue_dev(q));
	struct batch *b = calloc(1, sizeof(*b) + s->depth * sizeof(b->io[0]));
	int ret;

	if (!b)
		return -ENOMEM;
	b->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (b->efd < 0) {
		free(b);
		return -errno;
	}
	hybd_queue_set_priv(q, b);
	ret = hybd_queue_watch_fd(q, b->efd, never, NULL);
	if (ret) {
		close(b->efd);
		free(b);
	}
	return ret;
}

static void batch_idle(struct hybd_queue *q)
{
	struct batch *b = hybd_queue_priv(q);
	unsigned int i;

	for (i = 0; i < b->n; i++)
		hybd_io_complete(b->io[i], 0);
	b->n = 0;
}

static void batch_exit(struct hybd_queue *q)
{
	struct batch *b = hybd_queue_priv(q);

	close(b->efd);
	free(b);
}

static void slow_ready(struct hybd_dev *dev)
{
	const struct hybd_config *c = hybd_dev_config(dev);
	unsigned int q, i, cpus[1024];
	int n;

	printf("ready %s\n", hybd_dev_path(dev));
	printf("config id=%d size=%llu queues=%u depth=%u max_io=%u lbs=%u pbs=%u ops=0x%x flags=0x%x io_timeout=%u\n",
	       c->dev_id, (unsigned long long)c->size, c->nr_queues,
	       c->queue_depth, c->max_io_bytes, c->logical_block_size,
	       c->physical_block_size, c->ops, c->flags, c->io_timeout);
	for (q = 0; q < hybd_dev_nr_queues(dev); q++) {
		n = hybd_queue_cpus(dev, q, cpus, 1024);
		printf("queue %u cpus ", q);
		for (i = 0; n > 0 && i < (unsigned int)n && i < 1024; i++)
			printf("%s%u", i ? "," : "", cpus[i]);
		printf("%s\n", n < 0 ? hybd_errmsg() : "");
	}
	fflush(stdout);
}

static const struct hybd_driver slow_driver = {
	.read = slow_read,
	.write = slow_write,
	.ready = slow_ready,
};

static const struct hybd_driver batch_driver = {
	.read = slow_read,
	.write = slow_write,
	.ready = slow_ready,
	.queue_init = batch_init,
	.queue_idle = batch_idle,
	.queue_exit = batch_exit,
};

static int after_delete(struct hybd_config *cfg, struct slow *s)
{
	unsigned int cpus[1024];
	struct hybd_dev *dev;
	int ret, n;

	ret = hybd_dev_create(cfg, &slow_driver, s, &dev);
	if (!ret)
		ret = hybd_dev_start(dev);
	if (!ret)
		ret = hybd_ctl_del(hybd_dev_id(dev));
	if (!ret)
		ret = hybd_dev_wait(dev);
	if (ret) {
		fprintf(stderr, "slowdrv: %s\n", hybd_errmsg());
		return 1;
	}
	n = hybd_queue_cpus(dev, 0, cpus, 1024);
	printf("after-delete: %d %s\n", n, n < 0 ? hybd_errmsg() : "");
	hybd_dev_delete(dev);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "size", required_argument, NULL, 's' },
		{ "queues", required_argument, NULL, 'q' },
		{ "threads", required_argument, NULL, 't' },
		{ "delay-ms", required_argument, NULL, 'd' },
		{ "after-delete", no_argument, NULL, 'A' },
		{ "idle-batch", no_argument, NULL, 'b' },
		{ "recovery", required_argument, NULL, 'R' },
		{ "attach", no_argument, NULL, 'a' },
		{ "id", required_argument, NULL, 'i' },
		{ "queue-affinity", no_argument, NULL, 'Q' },
		{ "no-affinity", no_argument, NULL, 'N' },
		{ "pool-spread", no_argument, NULL, 'P' },
		{ NULL, 0, NULL, 0 },
	};
	struct slow s = { 0 };
	struct hybd_config cfg;
	int c, ret, after = 0;

	hybd_config_init(&cfg);
	cfg.size = 16 << 20;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's': cfg.size = strtoull(optarg, NULL, 0); break;
		case 'q': cfg.nr_queues = atoi(optarg); break;
		case 't': cfg.queue_threads = atoi(optarg); break;
		case 'd': s.delay_ms = atoi(optarg); break;
		case 'A': after = 1; break;
		case 'b': s.idle_batch = true; break;
		case 'R': cfg.recovery_timeout = atoi(optarg); break;
		case 'a': cfg.lib_flags |= HYBD_CFG_ATTACH; break;
		case 'i': cfg.dev_id = atoi(optarg); break;
		case 'Q': cfg.lib_flags |= HYBD_CFG_QUEUE_AFFINITY; break;
		case 'N': cfg.lib_flags |= HYBD_CFG_NO_AFFINITY; break;
		case 'P': cfg.lib_flags |= HYBD_CFG_POOL_SPREAD; break;
		default: return 2;
		}
	}
	if (cfg.lib_flags & HYBD_CFG_ATTACH) {
		struct hybd_dev_info di;

		/* the device's depth, not ours */
		if (hybd_ctl_info(cfg.dev_id, &di)) {
			fprintf(stderr, "slowdrv: %s\n", hybd_errmsg());
			return 1;
		}
		cfg.queue_depth = di.params.basic.queue_depth;
	}
	s.depth = cfg.queue_depth;
	s.mem = calloc(1, cfg.size);
	if (!s.mem)
		return 1;
	if (after)
		return after_delete(&cfg, &s);
	ret = hybd_run(&cfg, s.idle_batch ? &batch_driver : &slow_driver, &s);
	if (ret)
		fprintf(stderr, "slowdrv: %s\n", hybd_errmsg());
	printf("slowdrv: requests=%lu max_concurrent=%u exit=%d\n",
	       atomic_load(&s.requests), atomic_load(&s.max_running), ret);
	free(s.mem);
	return ret ? 1 : 0;
}
