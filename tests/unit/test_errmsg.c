// SPDX-License-Identifier: MIT
/*
 * Configuration and messages: hybd_config_init defaults, the translation to
 * the kernel's parameter block, and the err_param -> sentence mapping for
 * HYBD_CTL_ADD failures.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hybd_internal.h"
#include "unit.h"

/* The message for @perr/@err with @p must be exactly @want. */
static void msg_is(const struct hybd_params *p, int32_t dev_id, uint32_t perr,
		   int err, const char *want)
{
	char buf[512];

	hybd__param_errmsg(buf, sizeof(buf), p, dev_id, perr, err);
	if (strcmp(buf, want))
		fprintf(stderr, "err_param %u, err %d:\n  got  \"%s\"\n  want \"%s\"\n",
			perr, err, buf, want);
	CHECK(!strcmp(buf, want));
}

/* A valid parameter block, as hybd_config_init() + 64 MiB would send. */
static void good_params(struct hybd_params *p)
{
	struct hybd_config cfg;

	hybd_config_init(&cfg);
	cfg.size = 64 << 20;
	hybd__config_to_params(&cfg, p);
}

static void test_config_init(void)
{
	struct hybd_config cfg;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned int i;

	memset(&cfg, 0xff, sizeof(cfg));
	hybd_config_init(&cfg);
	CHECK(cfg.size == 0);
	CHECK(cfg.logical_block_size == 4096);
	CHECK(cfg.physical_block_size == 4096);
	CHECK(cfg.max_io_bytes == (128U << 10));
	CHECK(cfg.nr_queues == (cpus > 8 ? 8 : (uint32_t)cpus));
	CHECK(cfg.queue_depth == 64);
	CHECK(cfg.ops == 0);		/* from the handlers */
	CHECK(cfg.flags == HYBD_DEV_F_WRITE_CACHE);
	CHECK(cfg.queue_threads == 0 && cfg.io_priv_size == 0);
	CHECK(cfg.poll_ns == 0);
	CHECK(cfg.dev_id == -1);
	CHECK(cfg.lib_flags == 0);
	CHECK(!cfg.max_discard_bytes && !cfg.discard_granularity &&
	      !cfg.max_write_zeroes_bytes);
	for (i = 0; i < sizeof(cfg.reserved) / sizeof(cfg.reserved[0]); i++)
		CHECK(cfg.reserved[i] == 0);
}

/*
 * The defaults' memory: on a host with 64 CPUs (or 1024), a default device
 * pins at most 64 MiB of data buffers, and 8 MiB per queue.
 */
static void test_default_memory(void)
{
	static const long cpus[] = { 1, 2, 3, 8, 9, 64, 1024 };
	struct hybd_config cfg;
	unsigned int i;

	CHECK(hybd__default_queues(0) == 1 && hybd__default_queues(-1) == 1);
	for (i = 0; i < sizeof(cpus) / sizeof(cpus[0]); i++) {
		uint64_t per_queue, total;

		hybd_config_init(&cfg);
		cfg.nr_queues = hybd__default_queues(cpus[i]);
		per_queue = (uint64_t)cfg.queue_depth * cfg.max_io_bytes;
		total = per_queue * cfg.nr_queues;
		CHECK(cfg.nr_queues >= 1 && cfg.nr_queues <= 8);
		CHECK(cfg.nr_queues == (cpus[i] < 8 ? cpus[i] : 8));
		CHECK(per_queue <= (8U << 20));
		CHECK(total <= (64U << 20));
		CHECK(total <= HYBD_MAX_DEV_BUF);
	}
}

/* ops 0 follows the handlers; explicit ops are left alone */
static void test_resolve_ops(void)
{
	static int (*const rd)(struct hybd_io *, void *, uint64_t, uint32_t) =
		(void *)1;
	static int (*const wr)(struct hybd_io *, const void *, uint64_t,
			       uint32_t) = (void *)1;
	struct hybd_driver drv = { .read = rd, .write = wr };
	struct hybd_config cfg;

	/* read and write only: no cache, nothing else */
	hybd_config_init(&cfg);
	CHECK(hybd__resolve_ops(&cfg, hybd__driver_ops(&drv)) == 0);
	CHECK(cfg.ops == (HYBD_OPF_READ | HYBD_OPF_WRITE));
	CHECK(cfg.flags == 0);

	/* a flush handler brings the cache, flush and FUA */
	drv.flush = (int (*)(struct hybd_io *))1;
	hybd_config_init(&cfg);
	CHECK(hybd__resolve_ops(&cfg, hybd__driver_ops(&drv)) == 0);
	CHECK(cfg.ops == (HYBD_OPF_READ | HYBD_OPF_WRITE | HYBD_OPF_FLUSH |
			  HYBD_OPF_FUA));
	CHECK(cfg.flags == HYBD_DEV_F_WRITE_CACHE);

	/* ...unless the cache is refused */
	hybd_config_init(&cfg);
	cfg.flags &= ~HYBD_DEV_F_WRITE_CACHE;
	CHECK(hybd__resolve_ops(&cfg, hybd__driver_ops(&drv)) == 0);
	CHECK(cfg.ops == (HYBD_OPF_READ | HYBD_OPF_WRITE));

	/* discard and write-zeroes follow their handlers */
	drv.discard = (int (*)(struct hybd_io *, uint64_t, uint32_t))1;
	hybd_config_init(&cfg);
	CHECK(hybd__resolve_ops(&cfg, hybd__driver_ops(&drv)) == 0);
	CHECK(cfg.ops & HYBD_OPF_DISCARD);
	CHECK(!(cfg.ops & HYBD_OPF_WRITE_ZEROES));

	/* read-only: a write-side handler without .write offers nothing */
	drv.write = NULL;
	hybd_config_init(&cfg);
	CHECK(hybd__resolve_ops(&cfg, hybd__driver_ops(&drv)) == 0);
	CHECK(cfg.ops == HYBD_OPF_READ && cfg.flags == 0);

	/* no read handler: refused */
	drv.read = NULL;
	hybd_config_init(&cfg);
	CHECK(hybd__resolve_ops(&cfg, hybd__driver_ops(&drv)) == -EINVAL);
	CHECK(!strcmp(hybd_errmsg(), "the driver has no read handler"));

	/* explicit ops stay as they are (hybd_dev_create checks handlers) */
	hybd_config_init(&cfg);
	cfg.ops = HYBD_OPF_READ | HYBD_OPF_DISCARD;
	CHECK(hybd__resolve_ops(&cfg, 0) == 0);
	CHECK(cfg.ops == (HYBD_OPF_READ | HYBD_OPF_DISCARD));
}

static void test_config_to_params(void)
{
	struct hybd_config cfg;
	struct hybd_params p;

	hybd_config_init(&cfg);
	cfg.size = 1 << 30;
	cfg.logical_block_size = 512;
	cfg.physical_block_size = 8192;
	cfg.max_io_bytes = 65536;
	cfg.nr_queues = 3;
	cfg.queue_depth = 128;
	cfg.ops = HYBD_OPF_READ | HYBD_OPF_WRITE;
	cfg.flags = 0;
	cfg.poll_ns = 5000;
	cfg.io_timeout = 12;
	CHECK(hybd__config_to_params(&cfg, &p) == 0);
	CHECK(p.len == sizeof(p));
	CHECK(p.types == HYBD_PARAM_BASIC);
	CHECK(p.basic.dev_size == 1 << 30);
	CHECK(p.basic.logical_bs == 512 && p.basic.physical_bs == 8192);
	CHECK(p.basic.max_io_bytes == 65536);
	CHECK(p.basic.nr_hw_queues == 3 && p.basic.queue_depth == 128);
	CHECK(p.basic.ops == (HYBD_OPF_READ | HYBD_OPF_WRITE));
	CHECK(p.basic.flags == 0 && p.basic.poll_ns == 5000);
	CHECK(p.basic.io_timeout == 12 && p.basic.reserved0 == 0);
	CHECK(!p.basic.reserved[0] && !p.basic.reserved[1] && !p.basic.reserved[2]);
	CHECK(p.discard.max_discard_bytes == 0);

	/* the discard block goes along only when something is set in it */
	cfg.discard_granularity = 4096;
	CHECK(hybd__config_to_params(&cfg, &p) == 0);
	CHECK(p.types == (HYBD_PARAM_BASIC | HYBD_PARAM_DISCARD));
	CHECK(p.discard.discard_granularity == 4096);

	/* what the 16-bit fields cannot carry is refused, not truncated */
	hybd_config_init(&cfg);
	cfg.nr_queues = 65536 + 2;
	CHECK(hybd__config_to_params(&cfg, &p) == -ERANGE);
	CHECK(!strcmp(hybd_errmsg(),
		      "number of queues 65538: must be between 1 and 64"));
	hybd_config_init(&cfg);
	cfg.queue_depth = 70000;
	CHECK(hybd__config_to_params(&cfg, &p) == -ERANGE);
	CHECK(!strcmp(hybd_errmsg(),
		      "queue depth 70000: must be between 1 and 1024"));
	hybd_config_init(&cfg);
	cfg.dev_id = -2;
	CHECK(hybd__config_to_params(&cfg, &p) == -EINVAL);
	CHECK(strstr(hybd_errmsg(), "device id -2") != NULL);
	hybd_config_init(&cfg);
	cfg.reserved[3] = 1;
	CHECK(hybd__config_to_params(&cfg, &p) == -EINVAL);
	hybd_config_init(&cfg);
	cfg.lib_flags = 1U << 7;
	CHECK(hybd__config_to_params(&cfg, &p) == -EINVAL);
}

static void test_param_messages(void)
{
	struct hybd_params p;
	char want[256];

	good_params(&p);
	p.basic.logical_bs = 1000;
	msg_is(&p, -1, HYBD_PERR_LOGICAL_BS, -EINVAL,
	       "logical block size 1000: must be a power of two between 512 and 4096");

	good_params(&p);
	p.basic.physical_bs = 2048;
	msg_is(&p, -1, HYBD_PERR_PHYSICAL_BS, -EINVAL,
	       "physical block size 2048: must be 0 (same as logical) or a power of two between the logical block size (4096) and 65536");

	good_params(&p);
	p.basic.dev_size = 0;
	msg_is(&p, -1, HYBD_PERR_SIZE, -EINVAL,
	       "device size 0: must be a non-zero multiple of the logical block size (4096)");
	p.basic.dev_size = 4097;
	msg_is(&p, -1, HYBD_PERR_SIZE, -EINVAL,
	       "device size 4097: must be a non-zero multiple of the logical block size (4096)");
	p.basic.dev_size = 1ULL << 60;
	msg_is(&p, -1, HYBD_PERR_SIZE, -ERANGE,
	       "device size 1152921504606846976: too large, at most 1125899906842624 (1 PiB)");
	/* too large first, also where it is no multiple of the block size */
	p.basic.dev_size = UINT64_MAX;
	msg_is(&p, -1, HYBD_PERR_SIZE, -EINVAL,
	       "device size 18446744073709551615: too large, at most 1125899906842624 (1 PiB)");

	good_params(&p);
	p.basic.max_io_bytes = 5000;
	msg_is(&p, -1, HYBD_PERR_MAX_IO, -EINVAL,
	       "max I/O size 5000: must be a multiple of 4096 between 4096 and 1048576");

	good_params(&p);
	p.basic.nr_hw_queues = 0;
	msg_is(&p, -1, HYBD_PERR_QUEUES, -ERANGE,
	       "number of queues 0: must be between 1 and 64");

	good_params(&p);
	p.basic.queue_depth = 2000;
	msg_is(&p, -1, HYBD_PERR_DEPTH, -ERANGE,
	       "queue depth 2000: must be between 1 and 1024");

	good_params(&p);
	p.basic.queue_depth = 1024;
	p.basic.max_io_bytes = 1 << 20;
	msg_is(&p, -1, HYBD_PERR_QUEUE_BUF, -ERANGE,
	       "queue depth 1024 x max I/O size 1048576 = 1073741824 bytes of buffers per queue: must not exceed 268435456 (256 MiB)");

	good_params(&p);
	p.basic.nr_hw_queues = 8;
	p.basic.queue_depth = 256;
	p.basic.max_io_bytes = 1 << 20;
	msg_is(&p, -1, HYBD_PERR_DEV_BUF, -ERANGE,
	       "8 queues x depth 256 x max I/O size 1048576 = 2147483648 bytes of buffers per device: must not exceed 1073741824 (1 GiB)");

	good_params(&p);
	p.basic.ops = HYBD_OPF_WRITE;
	msg_is(&p, -1, HYBD_PERR_OPS, -EINVAL,
	       "operations write: read is mandatory");
	p.basic.ops = HYBD_OPF_READ | (1U << 9);
	msg_is(&p, -1, HYBD_PERR_OPS, -EOPNOTSUPP,
	       "operations read,0x200: unknown bits 0x200 (known: 0x3f)");
	p.basic.ops = HYBD_OPF_READ | HYBD_OPF_DISCARD;
	msg_is(&p, -1, HYBD_PERR_OPS, -EINVAL,
	       "operations read,discard: without write, read must be the only operation");
	p.basic.ops = HYBD_OPF_READ | HYBD_OPF_WRITE | HYBD_OPF_FUA;
	p.basic.flags = 0;
	msg_is(&p, -1, HYBD_PERR_OPS, -EINVAL,
	       "operations read,write,fua: flush and fua need the volatile write cache");

	good_params(&p);
	p.basic.flags = 0x81;
	msg_is(&p, -1, HYBD_PERR_FLAGS, -EOPNOTSUPP,
	       "device flags 0x81: unknown bits 0x80 (known: 0x3f)");
	p.basic.flags = HYBD_DEV_F_ZERO_WRITES;
	p.basic.ops = HYBD_OPF_READ | HYBD_OPF_WRITE;
	msg_is(&p, -1, HYBD_PERR_FLAGS, -EINVAL,
	       "device flags 0x2: zero writes as write-zeroes need the write-zeroes operation");
	p.basic.flags = HYBD_DEV_F_WRITE_CACHE;
	p.basic.ops = HYBD_OPF_READ | HYBD_OPF_WRITE;
	msg_is(&p, -1, HYBD_PERR_FLAGS, -EINVAL,
	       "device flags 0x1: a volatile write cache needs the flush operation");
	p.basic.flags = HYBD_DEV_F_UNPRIVILEGED | HYBD_DEV_F_REMAP_POLL;
	msg_is(&p, -1, HYBD_PERR_FLAGS, -EPERM,
	       "device flags 0x18: an unprivileged device's remap workers may not poll (HYBD_DEV_F_REMAP_POLL)");
	/* a kernel from before the flag */
	p.basic.flags = HYBD_DEV_F_REMAP_POLL;
	msg_is(&p, -1, HYBD_PERR_FLAGS, -EOPNOTSUPP,
	       "device flags 0x10: polling remap workers (HYBD_DEV_F_REMAP_POLL) need kernel feature remap_poll");
	p.basic.flags = HYBD_DEV_F_UNPRIVILEGED | HYBD_DEV_F_BIO_FRONT;
	msg_is(&p, -1, HYBD_PERR_FLAGS, -EPERM,
	       "device flags 0x28: an unprivileged device may not have a bio-based front (HYBD_DEV_F_BIO_FRONT)");
	p.basic.flags = HYBD_DEV_F_BIO_FRONT;
	msg_is(&p, -1, HYBD_PERR_FLAGS, -EOPNOTSUPP,
	       "device flags 0x20: a bio-based front (HYBD_DEV_F_BIO_FRONT) needs kernel feature bio_front");

	good_params(&p);
	p.basic.poll_ns = 2000000;
	msg_is(&p, -1, HYBD_PERR_POLL, -ERANGE,
	       "poll time 2000000 ns: must be at most 1000000 ns (1 ms)");

	good_params(&p);
	p.basic.io_timeout = 7200;
	msg_is(&p, -1, HYBD_PERR_IO_TIMEOUT, -ERANGE,
	       "I/O timeout 7200 s: must be at most 3600 s (0: none)");

	good_params(&p);
	p.types |= HYBD_PARAM_DISCARD;
	p.discard.discard_granularity = 1000;
	msg_is(&p, -1, HYBD_PERR_DISCARD, -EINVAL,
	       "discard granularity 1000: must be 0 (the logical block size) or a power of two >= the logical block size (4096)");
	p.discard.discard_granularity = 0;
	p.discard.max_discard_bytes = 1000;
	msg_is(&p, -1, HYBD_PERR_DISCARD, -EINVAL,
	       "max discard 1000 / max write-zeroes 0 bytes: must be multiples of the logical block size (4096)");
	p.basic.ops = HYBD_OPF_READ;
	msg_is(&p, -1, HYBD_PERR_DISCARD, -EINVAL,
	       "discard limits given but neither discard nor write-zeroes is enabled");

	good_params(&p);
	msg_is(&p, 70, HYBD_PERR_DEV_ID, -ERANGE,
	       "device id 70: must be between 0 and 63");
	msg_is(&p, 5, HYBD_PERR_DEV_ID, -EEXIST,
	       "device id 5 is already in use");
	msg_is(&p, -1, HYBD_PERR_DEV_ID, -ENOSPC,
	       "no free device id (at most 64 devices)");

	snprintf(want, sizeof(want),
		 "parameter block of %zu bytes not understood by the kernel (libhybd and module ABI mismatch)",
		 sizeof(p));
	msg_is(&p, -1, HYBD_PERR_LEN, -E2BIG, want);
	p.types = 0x10;
	msg_is(&p, -1, HYBD_PERR_TYPES, -EOPNOTSUPP,
	       "parameter types 0x10: the basic block is mandatory, known types are 0x3");
	msg_is(&p, -1, HYBD_PERR_RESERVED, -EINVAL,
	       "a reserved parameter field is not zero");

	/* no err_param: the errno alone */
	msg_is(&p, -1, HYBD_PERR_NONE, -ENOMEM,
	       "the kernel is out of memory for the device");
	msg_is(&p, -1, HYBD_PERR_NONE, -EPERM,
	       "permission denied (a user without CAP_SYS_ADMIN may add only an unprivileged device, HYBD_DEV_F_UNPRIVILEGED)");
	msg_is(&p, -1, HYBD_PERR_NONE, -ENOTTY,
	       "the loaded module does not know HYBD_CTL_ADD (ABI mismatch)");
	msg_is(&p, -1, HYBD_PERR_NONE, -EIO, "adding the device failed");
	msg_is(&p, -1, 999, -EIO, "adding the device failed");
}

int main(void)
{
	test_config_init();
	test_default_memory();
	test_resolve_ops();
	test_config_to_params();
	test_param_messages();

	return unit_report();
}
