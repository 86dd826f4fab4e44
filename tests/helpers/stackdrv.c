// SPDX-License-Identifier: MIT
/*
 * stackdrv - a memory disk that registers backing targets while it runs:
 * for the tests of the kernel's check that a target's I/O cannot come
 * back to the device (-ELOOP), whose stacks need the device to exist
 * first.
 *
 *   stackdrv [--size BYTES] [--front] [--io-timeout SECONDS] REQUEST_FILE
 *
 * Serves a zero-filled memory disk (1 queue, 4 KiB blocks, 64 MiB unless
 * --size; with a bio-based front if --front) and prints "ready
 * /dev/hybdN".  It takes resizes up to its first size (`hybdctl
 * resize`), has a write cache (its flushes do nothing) and takes discards
 * (zeroes).  On each SIGUSR1 it reads a path
 * from REQUEST_FILE, opens it for reading and writing, registers it as a
 * writable backing target (hybd_dev_add_backing()), closes it, and prints
 * "add PATH: index N" or "add PATH: error ENAME: message".  Nothing is
 * remapped: no program is attached.  SIGINT/SIGTERM: delete the device,
 * exit 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hybd.h"

static unsigned char *mem;
static const char *request_file;

static int mem_read(struct hybd_io *io, void *buf, uint64_t off, uint32_t len)
{
	(void)io;
	memcpy(buf, mem + off, len);
	return 0;
}

static int mem_write(struct hybd_io *io, const void *buf, uint64_t off,
		     uint32_t len)
{
	(void)io;
	memcpy(mem + off, buf, len);
	return 0;
}

/* One request: the path in the request file, registered. */
static void add_one(struct hybd_dev *dev)
{
	char path[4096];
	FILE *f = fopen(request_file, "r");
	int fd, ret;

	if (!f || !fgets(path, sizeof(path), f)) {
		printf("add ?: error %s: cannot read %s\n",
		       strerrorname_np(errno ? errno : EINVAL), request_file);
		if (f)
			fclose(f);
		return;
	}
	fclose(f);
	path[strcspn(path, "\n")] = '\0';
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		printf("add %s: error %s: open: %s\n", path,
		       strerrorname_np(errno), strerror(errno));
		return;
	}
	ret = hybd_dev_add_backing(dev, fd, HYBD_BACKING_F_WRITE, NULL);
	close(fd);
	if (ret < 0)
		printf("add %s: error %s: %s\n", path, strerrorname_np(-ret),
		       hybd_errmsg());
	else
		printf("add %s: index %d\n", path, ret);
}

static void *requests(void *arg)
{
	struct hybd_dev *dev = arg;
	sigset_t usr1;
	int sig;

	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	for (;;) {
		if (sigwait(&usr1, &sig))
			return NULL;
		add_one(dev);
		fflush(stdout);
	}
}

static void ready(struct hybd_dev *dev)
{
	pthread_t thread;

	printf("ready %s\n", hybd_dev_path(dev));
	fflush(stdout);
	if (pthread_create(&thread, NULL, requests, dev)) {
		fprintf(stderr, "stackdrv: cannot start the request thread\n");
		exit(1);
	}
	pthread_detach(thread);
}

/* memory: nothing to make durable, but a write cache for flushes to reach */
static int mem_flush(struct hybd_io *io)
{
	(void)io;
	return 0;
}

/* a discard zeroes: what a program does not remap reads back as 0 */
static int mem_discard(struct hybd_io *io, uint64_t off, uint32_t len)
{
	(void)io;
	memset(mem + off, 0, len);
	return 0;
}

static uint64_t mem_size;

/* any size the memory holds: a shrink keeps it all, a grow finds zeros */
static int mem_resize(struct hybd_dev *dev, uint64_t size)
{
	(void)dev;
	return size <= mem_size ? 0 : -ENOSPC;
}

static const struct hybd_driver driver = {
	.read = mem_read,
	.write = mem_write,
	.ready = ready,
	.resize = mem_resize,
	.flush = mem_flush,
	.discard = mem_discard,
};

static int usage(void)
{
	fprintf(stderr, "usage: stackdrv [--size BYTES] [--front] [--io-timeout SECONDS] REQUEST_FILE\n");
	return 2;
}

int main(int argc, char **argv)
{
	uint64_t size = 64 << 20, timeout = UINT64_MAX;
	struct hybd_config cfg;
	bool front = false;
	sigset_t usr1;
	int arg;

	for (arg = 1; arg < argc - 1; arg++) {
		if (!strcmp(argv[arg], "--front")) {
			front = true;
		} else if (!strcmp(argv[arg], "--size") && arg + 2 < argc) {
			if (hybd_parse_size(argv[++arg], &size) < 0 || !size)
				return usage();
		} else if (!strcmp(argv[arg], "--io-timeout") &&
			   arg + 2 < argc) {
			if (hybd_parse_size(argv[++arg], &timeout) < 0 ||
			    timeout >= UINT32_MAX)
				return usage();
		} else {
			return usage();
		}
	}
	if (arg != argc - 1)
		return usage();
	request_file = argv[arg];
	mem_size = size;
	mem = calloc(1, size);
	if (!mem) {
		fprintf(stderr, "stackdrv: cannot allocate the disk\n");
		return 1;
	}
	/* every thread leaves SIGUSR1 to the request thread's sigwait() */
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &usr1, NULL);

	hybd_config_init(&cfg);
	cfg.size = size;
	cfg.nr_queues = 1;
	if (timeout != UINT64_MAX)	/* else libhybd's */
		cfg.io_timeout = timeout;
	if (front)
		cfg.flags |= HYBD_DEV_F_BIO_FRONT;
	if (hybd_run(&cfg, &driver, NULL)) {
		fprintf(stderr, "stackdrv: %s\n", hybd_errmsg());
		return 1;
	}
	return 0;
}
