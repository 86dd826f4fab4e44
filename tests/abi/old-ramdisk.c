// SPDX-License-Identifier: MIT
/*
 * old-ramdisk - a driver built against libhybd 1.2's hybd.h (kept verbatim
 * in hybd-1.2.h), linked against the libhybd.so being tested: the ABI test.
 *
 * struct hybd_driver had five handlers then, and hybd_dev_create() was a
 * function (hybd_dev_create@LIBHYBD_1.0).  The driver is placed in front
 * of bytes that would crash the library if it read fields of a newer
 * layout (queue_init, ...) from it.  Prints "ready /dev/hybdN"; serves
 * until SIGTERM, then deletes the device and prints "old-ramdisk: done".
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybd-1.2.h"

static unsigned char *mem;

static int rd_read(struct hybd_io *io, void *buf, uint64_t off, uint32_t len)
{
	(void)io;
	memcpy(buf, mem + off, len);
	return 0;
}

static int rd_write(struct hybd_io *io, const void *buf, uint64_t off,
		    uint32_t len)
{
	(void)io;
	memcpy(mem + off, buf, len);
	return 0;
}

static int rd_flush(struct hybd_io *io)
{
	(void)io;
	return 0;
}

int main(void)
{
	struct {
		struct hybd_driver drv;
		unsigned char poison[64];	/* not a driver field */
	} d;
	struct hybd_config cfg;
	struct hybd_dev *dev;
	sigset_t set;
	int sig, ret;

	memset(&d, 0xa5, sizeof(d));
	memset(&d.drv, 0, sizeof(d.drv));
	d.drv.read = rd_read;
	d.drv.write = rd_write;
	d.drv.flush = rd_flush;

	hybd_config_init(&cfg);
	cfg.size = 8 << 20;
	/* 1.2's defaults announced every operation: say what we have */
	cfg.ops = HYBD_OPF_READ | HYBD_OPF_WRITE | HYBD_OPF_FLUSH |
		  HYBD_OPF_FUA;
	mem = calloc(1, cfg.size);

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);

	ret = hybd_dev_create(&cfg, &d.drv, NULL, &dev);
	if (!ret)
		ret = hybd_dev_start(dev);
	if (ret) {
		fprintf(stderr, "old-ramdisk: %s\n", hybd_errmsg());
		return 1;
	}
	printf("ready %s\n", hybd_dev_path(dev));
	fflush(stdout);
	sigwait(&set, &sig);
	ret = hybd_dev_delete(dev);
	printf("old-ramdisk: done %d\n", ret);
	return ret ? 1 : 0;
}
