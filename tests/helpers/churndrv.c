// SPDX-License-Identifier: MIT
/*
 * churndrv - a loop device over FILE whose backing target comes and goes
 * under I/O: for the test of HYBD_SRV_DEL_BACKING with remaps in flight.
 *
 *   churndrv --bpf PROG.o [--churn-ms N] [--gap-ms N] [--no-write-cache] FILE
 *
 * FILE is backing target 0 and the slow path's own file (pread, pwrite,
 * fdatasync).  PROG.o (bpf/loop.bpf.o) is attached once the disk exists,
 * and remaps every request to target 0.  A thread then takes target 0 off
 * the device (HYBD_SRV_DEL_BACKING) every --churn-ms (default 50), leaves
 * it off for --gap-ms (default 10: the program's remaps are refused with
 * -ENOENT meanwhile, and the slow path serves them), and registers the
 * file again, which must come back as target 0.
 *
 * Prints "ready /dev/hybdN" once the disk exists.  SIGUSR1 stops the
 * churn with the target registered, and prints "churn stopped: churns=N"
 * (the times the target went and came back).  On the way out
 * (SIGINT/SIGTERM) it prints "churndrv: churns=N requests=M errors=E
 * exit=R": the requests the slow path served, and the calls that failed
 * (a delete, a registration, a handler's I/O).
 */
#define _GNU_SOURCE
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hybd.h"

static atomic_bool stop_churn;

static void on_usr1(int sig)
{
	(void)sig;
	atomic_store(&stop_churn, true);
}

struct churn {
	int fd;
	const char *bpf_path;
	struct hybd_bpf *bpf;
	unsigned int churn_ms, gap_ms;
	pthread_t thread;
	atomic_bool started;
	atomic_ulong churns, requests, errors;
	struct hybd_dev *dev;
};

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* A handler's result: 0, or -errno counted as an error. */
static int io_result(struct churn *c, ssize_t got, uint32_t len)
{
	atomic_fetch_add(&c->requests, 1);
	if (got == (ssize_t)len)
		return 0;
	atomic_fetch_add(&c->errors, 1);
	return got < 0 ? -errno : -EIO;
}

static int churn_read(struct hybd_io *io, void *buf, uint64_t off,
		      uint32_t len)
{
	struct churn *c = hybd_io_priv(io);

	return io_result(c, pread(c->fd, buf, len, off), len);
}

static int churn_write(struct hybd_io *io, const void *buf, uint64_t off,
		       uint32_t len)
{
	struct churn *c = hybd_io_priv(io);

	return io_result(c, pwrite(c->fd, buf, len, off), len);
}

static int churn_flush(struct hybd_io *io)
{
	struct churn *c = hybd_io_priv(io);

	atomic_fetch_add(&c->requests, 1);
	if (!fdatasync(c->fd))
		return 0;
	atomic_fetch_add(&c->errors, 1);
	return -errno;
}

static void *churn_thread(void *arg)
{
	struct churn *c = arg;
	int index;

	while (!atomic_load(&stop_churn)) {
		sleep_ms(c->churn_ms);
		if (hybd_dev_del_backing(c->dev, 0)) {
			fprintf(stderr, "churndrv: del: %s\n", hybd_errmsg());
			atomic_fetch_add(&c->errors, 1);
			break;
		}
		sleep_ms(c->gap_ms);
		index = hybd_dev_add_backing(c->dev, c->fd,
					     HYBD_BACKING_F_WRITE, NULL);
		if (index != 0) {
			fprintf(stderr, "churndrv: add: %d %s\n", index,
				index < 0 ? hybd_errmsg() : "");
			atomic_fetch_add(&c->errors, 1);
			break;
		}
		atomic_fetch_add(&c->churns, 1);
	}
	printf("churn stopped: churns=%lu\n", atomic_load(&c->churns));
	fflush(stdout);
	return NULL;
}

/* The churn ends before the device does: it must not outlive @dev. */
static void churn_end(struct churn *c)
{
	atomic_store(&stop_churn, true);
	if (atomic_exchange(&c->started, false))
		pthread_join(c->thread, NULL);
}

static void churn_queue_exit(struct hybd_queue *q)
{
	churn_end(hybd_dev_priv(hybd_queue_dev(q)));
}

static int churn_prepare(struct hybd_dev *dev)
{
	struct churn *c = hybd_dev_priv(dev);
	int index;

	index = hybd_dev_add_backing(dev, c->fd, HYBD_BACKING_F_WRITE, NULL);
	if (index < 0) {
		fprintf(stderr, "churndrv: %s\n", hybd_errmsg());
		return index;
	}
	return index ? -EEXIST : 0;
}

static void churn_ready(struct hybd_dev *dev)
{
	struct churn *c = hybd_dev_priv(dev);

	if (hybd_bpf_attach(hybd_dev_id(dev), c->bpf_path, 0, &c->bpf)) {
		fprintf(stderr, "churndrv: %s: %s\n", c->bpf_path,
			hybd_errmsg());
		atomic_fetch_add(&c->errors, 1);
	}
	c->dev = dev;
	if (!pthread_create(&c->thread, NULL, churn_thread, c))
		atomic_store(&c->started, true);
	else
		atomic_fetch_add(&c->errors, 1);
	printf("ready %s\n", hybd_dev_path(dev));
	fflush(stdout);
}

static const struct hybd_driver churn_driver = {
	.read = churn_read,
	.write = churn_write,
	.flush = churn_flush,
	.queue_exit = churn_queue_exit,
	.prepare = churn_prepare,
	.ready = churn_ready,
};

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "bpf", required_argument, NULL, 'b' },
		{ "churn-ms", required_argument, NULL, 'c' },
		{ "gap-ms", required_argument, NULL, 'g' },
		{ "no-write-cache", no_argument, NULL, 'w' },
		{ NULL, 0, NULL, 0 },
	};
	struct churn c = { .churn_ms = 50, .gap_ms = 10 };
	struct hybd_config cfg;
	struct sigaction sa = { .sa_handler = on_usr1 };
	struct stat st;
	int opt, ret;

	hybd_config_init(&cfg);
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'b': c.bpf_path = optarg; break;
		case 'c': c.churn_ms = atoi(optarg); break;
		case 'g': c.gap_ms = atoi(optarg); break;
		case 'w': cfg.flags &= ~HYBD_DEV_F_WRITE_CACHE; break;
		default: return 2;
		}
	}
	if (optind != argc - 1 || !c.bpf_path) {
		fprintf(stderr, "usage: churndrv --bpf PROG.o [--churn-ms N] [--gap-ms N] [--no-write-cache] FILE\n");
		return 2;
	}
	c.fd = open(argv[optind], O_RDWR | O_DIRECT | O_CLOEXEC);
	if (c.fd < 0 || fstat(c.fd, &st)) {
		perror(argv[optind]);
		return 1;
	}
	sigaction(SIGUSR1, &sa, NULL);
	cfg.size = st.st_size;
	ret = hybd_run(&cfg, &churn_driver, &c);
	if (ret)
		fprintf(stderr, "churndrv: %s\n", hybd_errmsg());
	churn_end(&c);
	if (c.bpf)
		hybd_bpf_close(c.bpf);
	printf("churndrv: churns=%lu requests=%lu errors=%lu exit=%d\n",
	       atomic_load(&c.churns), atomic_load(&c.requests),
	       atomic_load(&c.errors), ret);
	close(c.fd);
	return ret ? 1 : 0;
}
