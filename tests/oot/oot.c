// SPDX-License-Identifier: MIT
/*
 * oot - a hybd driver built outside hybd's tree, against an installed
 * libhybd: its Makefile knows nothing of hybd but what
 * `pkg-config --cflags --libs hybd` says.
 *
 *   oot [SIZE_MIB]
 *
 * A disk in memory (16 MiB by default) with a read and a write handler and
 * nothing else.  It prints "ready /dev/hybdN" once the disk exists, serves
 * it until SIGINT or SIGTERM, then deletes it (the kernel hands the
 * workers what it still holds first) and prints "oot: reads=N writes=N".
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hybd.h>

struct disk {
	unsigned char *mem;
	atomic_ulong reads, writes;
};

static int disk_read(struct hybd_io *io, void *buf, uint64_t offset,
		     uint32_t len)
{
	struct disk *d = hybd_io_priv(io);

	memcpy(buf, d->mem + offset, len);
	atomic_fetch_add(&d->reads, 1);
	return 0;
}

static int disk_write(struct hybd_io *io, const void *buf, uint64_t offset,
		      uint32_t len)
{
	struct disk *d = hybd_io_priv(io);

	memcpy(d->mem + offset, buf, len);
	atomic_fetch_add(&d->writes, 1);
	return 0;
}

static const struct hybd_driver disk_driver = {
	.read = disk_read,
	.write = disk_write,
};

static int fail(const char *what, int err)
{
	fprintf(stderr, "oot: %s: %s (%s)\n", what, hybd_errmsg(),
		strerror(-err));
	return 1;
}

int main(int argc, char **argv)
{
	struct disk d = { 0 };
	struct hybd_config cfg;
	struct hybd_dev *dev;
	sigset_t stop;
	int ret, sig;

	hybd_config_init(&cfg);
	cfg.size = (argc > 1 ? strtoull(argv[1], NULL, 10) : 16) << 20;
	/* the operations follow the handlers: read and write, no cache */

	d.mem = calloc(1, cfg.size ? cfg.size : 1);
	if (!d.mem)
		return fail("memory", -ENOMEM);

	/* the signals wait for sigwait() below; workers inherit the mask */
	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &stop, NULL);

	ret = hybd_dev_create(&cfg, &disk_driver, &d, &dev);
	if (ret)
		return fail("create", ret);
	ret = hybd_dev_start(dev);
	if (ret) {
		fail("start", ret);
		hybd_dev_delete(dev);
		return 1;
	}
	printf("ready %s\n", hybd_dev_path(dev));
	fflush(stdout);

	sigwait(&stop, &sig);
	ret = hybd_dev_delete(dev);
	if (ret)
		return fail("delete", ret);
	printf("oot: reads=%lu writes=%lu\n", atomic_load(&d.reads),
	       atomic_load(&d.writes));
	free(d.mem);
	return 0;
}
