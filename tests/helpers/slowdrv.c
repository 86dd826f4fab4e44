// SPDX-License-Identifier: MIT
/*
 * slowdrv - a memory disk with only .read and .write, run by hybd_run(),
 * whose handlers may block: for the tests of the operations that follow the
 * handlers, the thread pool, worker placement and hybd_run()'s signals.
 *
 *   slowdrv [--size BYTES] [--queues N] [--threads N] [--delay-ms N]
 *   slowdrv --after-delete
 *
 * Prints "ready /dev/hybdN", then one line per queue
 * "queue Q cpus C1,C2,..." (hybd_queue_cpus()), once the disk exists.  On
 * the way out (SIGINT/SIGTERM or a delete from outside) it prints
 * "slowdrv: requests=N max_concurrent=M exit=R": the most handlers that
 * ran at once, and hybd_run()'s result.
 *
 * --after-delete: create and start with the explicit calls, delete the
 * device from outside (hybd_ctl_del), wait for the workers, and only then
 * ask for queue 0's CPUs (the server's node outlives the device) and print
 * "after-delete: N" (or the error), then free the device.
 */
#include <errno.h>
#include <getopt.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hybd.h"

struct slow {
	unsigned char *mem;
	unsigned int delay_ms;
	atomic_uint running, max_running;
	atomic_ulong requests;
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

static int slow_read(struct hybd_io *io, void *buf, uint64_t off, uint32_t len)
{
	struct slow *s = hybd_io_priv(io);

	enter(s);
	memcpy(buf, s->mem + off, len);
	atomic_fetch_sub(&s->running, 1);
	return 0;
}

static int slow_write(struct hybd_io *io, const void *buf, uint64_t off,
		      uint32_t len)
{
	struct slow *s = hybd_io_priv(io);

	enter(s);
	memcpy(s->mem + off, buf, len);
	atomic_fetch_sub(&s->running, 1);
	return 0;
}

static void slow_ready(struct hybd_dev *dev)
{
	unsigned int q, i, cpus[1024];
	int n;

	printf("ready %s\n", hybd_dev_path(dev));
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
		default: return 2;
		}
	}
	s.mem = calloc(1, cfg.size);
	if (!s.mem)
		return 1;
	if (after)
		return after_delete(&cfg, &s);
	ret = hybd_run(&cfg, &slow_driver, &s);
	if (ret)
		fprintf(stderr, "slowdrv: %s\n", hybd_errmsg());
	printf("slowdrv: requests=%lu max_concurrent=%u exit=%d\n",
	       atomic_load(&s.requests), atomic_load(&s.max_running), ret);
	free(s.mem);
	return ret ? 1 : 0;
}
