// SPDX-License-Identifier: MIT
/*
 * Without the module (no /dev/hybd-control) every entry point that needs it
 * fails with -ENOENT and says "hybd module not loaded"; configuration
 * mistakes are reported before the control node is even looked for.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hybd.h"

/* each failure also prints the library's message */
#define UNIT_SHOW_ERRMSG
#include "unit.h"

#define NOT_LOADED	"hybd module not loaded (/dev/hybd-control missing)"

static int handler_rw(struct hybd_io *io, void *buf, uint64_t off,
		      uint32_t len)
{
	(void)io, (void)buf, (void)off, (void)len;
	return 0;
}

static int handler_w(struct hybd_io *io, const void *buf, uint64_t off,
		     uint32_t len)
{
	(void)io, (void)buf, (void)off, (void)len;
	return 0;
}

static int handler_flush(struct hybd_io *io)
{
	(void)io;
	return 0;
}

static int handler_range(struct hybd_io *io, uint64_t off, uint32_t len)
{
	(void)io, (void)off, (void)len;
	return 0;
}

static void test_ctl(void)
{
	struct hybd_ctl_features f;
	struct hybd_dev_info info;
	struct hybd_config cfg;
	uint32_t ids[4], id = 77;

	CHECK(hybd_ctl_features(&f) == -ENOENT);
	CHECK(!strcmp(hybd_errmsg(), NOT_LOADED));
	CHECK(hybd_ctl_list(ids, 4) == -ENOENT);
	CHECK(!strcmp(hybd_errmsg(), NOT_LOADED));
	CHECK(hybd_ctl_list(NULL, 0) == -ENOENT);
	CHECK(hybd_ctl_info(0, &info) == -ENOENT);
	CHECK(!strcmp(hybd_errmsg(), NOT_LOADED));
	CHECK(hybd_ctl_del(3) == -ENOENT);
	CHECK(!strcmp(hybd_errmsg(), NOT_LOADED));

	hybd_config_init(&cfg);
	cfg.size = 1 << 20;
	CHECK(hybd_ctl_add(&cfg, &id) == -ENOENT && id == 77);
	CHECK(!strcmp(hybd_errmsg(), NOT_LOADED));
}

static void test_dev_create(void)
{
	struct hybd_driver drv = {
		.read = handler_rw,
		.write = handler_w,
		.flush = handler_flush,
		.discard = handler_range,
		.write_zeroes = handler_range,
	};
	struct hybd_dev *dev = (struct hybd_dev *)&drv;
	struct hybd_config cfg;

	hybd_config_init(&cfg);
	cfg.size = 1 << 20;
	CHECK(hybd_dev_create(&cfg, &drv, NULL, &dev) == -ENOENT);
	CHECK(!strcmp(hybd_errmsg(), NOT_LOADED));
	CHECK(dev == (struct hybd_dev *)&drv);	/* untouched on failure */

	/* by default the operations follow the handlers... */
	drv.discard = NULL;
	CHECK(hybd_dev_create(&cfg, &drv, NULL, &dev) == -ENOENT);
	/* ...explicit ones need theirs: checked before the control node */
	cfg.ops = HYBD_OPF_ALL;
	CHECK(hybd_dev_create(&cfg, &drv, NULL, &dev) == -EINVAL);
	CHECK(!strcmp(hybd_errmsg(),
		      "operation discard is enabled but the driver has no discard handler"));
	cfg.ops &= ~HYBD_OPF_DISCARD;
	CHECK(hybd_dev_create(&cfg, &drv, NULL, &dev) == -ENOENT);

	drv.write = NULL;
	cfg.ops = HYBD_OPF_READ | HYBD_OPF_FUA;
	CHECK(hybd_dev_create(&cfg, &drv, NULL, &dev) == -EINVAL);
	CHECK(strstr(hybd_errmsg(), "no write handler") != NULL);

	cfg.queue_depth = 100000;
	cfg.ops = HYBD_OPF_READ;
	/* out of range, as the kernel says of a depth of 0 */
	CHECK(hybd_dev_create(&cfg, &drv, NULL, &dev) == -ERANGE);
	CHECK(strstr(hybd_errmsg(), "queue depth 100000") != NULL);

	/* structs that grow: older callers' are shorter, newer ones' longer */
	{
		struct {
			struct hybd_driver d;
			void *newer[2];
		} big = { .d = drv };

		hybd_config_init(&cfg);
		cfg.size = 1 << 20;
		CHECK(hybd_dev_create_sized(&cfg, sizeof(cfg), &drv,
					    sizeof(void *) * 4, NULL,
					    &dev) == -EINVAL);
		CHECK(strstr(hybd_errmsg(), "struct hybd_driver of") != NULL);
		/* five handlers: what libhybd 1.0-1.2 callers pass */
		CHECK(hybd_dev_create_sized(&cfg, sizeof(cfg), &drv,
					    sizeof(void *) * 5, NULL,
					    &dev) == -ENOENT);
		CHECK(hybd_dev_create_sized(&cfg, sizeof(cfg), &big.d,
					    sizeof(big), NULL, &dev) == -ENOENT);
		big.newer[1] = &big;
		CHECK(hybd_dev_create_sized(&cfg, sizeof(cfg), &big.d,
					    sizeof(big), NULL, &dev) == -E2BIG);
		CHECK(strstr(hybd_errmsg(), "does not know") != NULL);
		CHECK(hybd_dev_create_sized(&cfg, sizeof(cfg) - 4, &drv,
					    sizeof(drv), NULL,
					    &dev) == -EINVAL);
		CHECK(hybd_lib_version() ==
		      HYBD_LIB_VERSION(HYBD_LIB_VERSION_MAJOR,
				       HYBD_LIB_VERSION_MINOR));
	}

	CHECK(hybd_dev_create(NULL, &drv, NULL, &dev) == -EINVAL);
	CHECK(hybd_dev_create(&cfg, NULL, NULL, &dev) == -EINVAL);
	CHECK(hybd_dev_create(&cfg, &drv, NULL, NULL) == -EINVAL);
}

int main(void)
{
	if (!access("/dev/hybd-control", F_OK)) {
		printf("skipped: /dev/hybd-control exists (the module is loaded)\n");
		return unit_report();
	}
	test_ctl();
	test_dev_create();

	return unit_report();
}
