// SPDX-License-Identifier: MIT
/*
 * The control node /dev/hybd-control: add, delete, list and query devices.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/capability.h>

#include "hybd_internal.h"

/* The default number of queues on a machine with @cpus CPUs online. */
unsigned int hybd__default_queues(long cpus)
{
	if (cpus < 1)
		return 1;
	return cpus > HYBD_DEFAULT_QUEUES_MAX ? HYBD_DEFAULT_QUEUES_MAX : cpus;
}

void hybd_config_init(struct hybd_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->logical_block_size = 4096;
	cfg->physical_block_size = 4096;
	cfg->max_io_bytes = HYBD_DEFAULT_MAX_IO;
	cfg->nr_queues = hybd__default_queues(sysconf(_SC_NPROCESSORS_ONLN));
	cfg->queue_depth = HYBD_DEFAULT_DEPTH;
	cfg->ops = 0;				/* what the handlers support */
	cfg->flags = HYBD_DEV_F_WRITE_CACHE;	/* if there is a .flush */
	cfg->io_timeout = 30;
	cfg->dev_id = -1;
}

/* The operations @drv has handlers for (HYBD_OPF_*). */
uint32_t hybd__driver_ops(const struct hybd_driver *drv)
{
	uint32_t ops = 0;

	if (drv->read)
		ops |= HYBD_OPF_READ;
	if (drv->write)
		ops |= HYBD_OPF_WRITE;
	if (drv->write && drv->flush)
		ops |= HYBD_OPF_FLUSH | HYBD_OPF_FUA;
	if (drv->discard)
		ops |= HYBD_OPF_DISCARD;
	if (drv->write_zeroes)
		ops |= HYBD_OPF_WRITE_ZEROES;
	return ops;
}

/*
 * ops 0 in @cfg: offer what @have (a driver's handlers) supports, flush
 * and FUA only with HYBD_DEV_F_WRITE_CACHE, which stays only with flush.
 * Explicit ops are left alone.  Writes only make sense with a write
 * handler: a read-only device offers nothing else.
 */
int hybd__resolve_ops(struct hybd_config *cfg, uint32_t have)
{
	if (cfg->ops)
		return 0;
	cfg->ops = have;
	if (!(cfg->ops & HYBD_OPF_WRITE))
		cfg->ops &= HYBD_OPF_READ;
	if (!(cfg->flags & HYBD_DEV_F_WRITE_CACHE))
		cfg->ops &= ~(HYBD_OPF_FLUSH | HYBD_OPF_FUA);
	if (!(cfg->ops & HYBD_OPF_FLUSH))
		cfg->flags &= ~HYBD_DEV_F_WRITE_CACHE;
	if (!(cfg->ops & HYBD_OPF_READ))
		return hybd__err(-EINVAL, "the driver has no read handler");
	return 0;
}

/*
 * Translate @cfg into the kernel's parameter block.  Only what the block
 * cannot express is refused here; every limit is the kernel's to check.
 */
int hybd__config_to_params(const struct hybd_config *cfg_in,
			   struct hybd_params *p)
{
	struct hybd_config c = *cfg_in, *cfg = &c;
	unsigned int i;
	int ret;

	/* no driver here: ops 0 offers every operation */
	ret = hybd__resolve_ops(cfg, HYBD_OPF_ALL);
	if (ret)
		return ret;

	for (i = 0; i < sizeof(cfg->reserved) / sizeof(cfg->reserved[0]); i++) {
		if (cfg->reserved[i])
			return hybd__err(-EINVAL,
					 "hybd_config.reserved must be zero (start from hybd_config_init())");
	}
	/* out of range, as the kernel says of what fits its fields */
	if (cfg->nr_queues > UINT16_MAX)
		return hybd__err(-ERANGE,
				 "number of queues %u: must be between 1 and %u",
				 cfg->nr_queues, HYBD_MAX_QUEUES);
	if (cfg->queue_depth > UINT16_MAX)
		return hybd__err(-ERANGE,
				 "queue depth %u: must be between 1 and %u",
				 cfg->queue_depth, HYBD_MAX_QUEUE_DEPTH);
	if (cfg->dev_id < -1)
		return hybd__err(-EINVAL,
				 "device id %d: must be -1 (any) or between 0 and %u",
				 cfg->dev_id, HYBD_MAX_DEVICES - 1);
	if (cfg->lib_flags & ~(HYBD_CFG_NO_AFFINITY | HYBD_CFG_ATTACH |
			       HYBD_CFG_QUEUE_AFFINITY | HYBD_CFG_POOL_SPREAD))
		return hybd__err(-EINVAL, "library flags 0x%x: unknown bits",
				 cfg->lib_flags);

	memset(p, 0, sizeof(*p));
	p->len = sizeof(*p);
	p->types = HYBD_PARAM_BASIC;
	p->basic.dev_size = cfg->size;
	p->basic.logical_bs = cfg->logical_block_size;
	p->basic.physical_bs = cfg->physical_block_size;
	p->basic.max_io_bytes = cfg->max_io_bytes;
	p->basic.nr_hw_queues = cfg->nr_queues;
	p->basic.queue_depth = cfg->queue_depth;
	p->basic.ops = cfg->ops;
	p->basic.flags = cfg->flags;
	p->basic.poll_ns = cfg->poll_ns;
	p->basic.io_timeout = cfg->io_timeout;
	p->basic.recovery_timeout = cfg->recovery_timeout;
	if (cfg->max_discard_bytes || cfg->discard_granularity ||
	    cfg->max_write_zeroes_bytes) {
		p->types |= HYBD_PARAM_DISCARD;
		p->discard.max_discard_bytes = cfg->max_discard_bytes;
		p->discard.discard_granularity = cfg->discard_granularity;
		p->discard.max_write_zeroes_bytes = cfg->max_write_zeroes_bytes;
	}
	return 0;
}

static int ctl_open_err(int err)
{
	switch (err) {
	case -ENOENT:
		return hybd__err(err, "hybd module not loaded (%s missing)",
				 HYBD_CONTROL_PATH);
	case -ENXIO:
	case -ENODEV:
		return hybd__err(err, "hybd module not loaded (%s has no driver)",
				 HYBD_CONTROL_PATH);
	case -EACCES:
	case -EPERM:
		return hybd__err(err, "cannot open %s: permission denied",
				 HYBD_CONTROL_PATH);
	default:
		return hybd__err(err, "cannot open %s", HYBD_CONTROL_PATH);
	}
}

/* Message for an ioctl that failed with @err; @id < 0: not about a device. */
static int ctl_err(int err, const char *cmd, long id)
{
	switch (err) {
	case -ENOTTY:
		return hybd__err(err,
				 "the loaded module does not know %s (ABI mismatch)",
				 cmd);
	case -EPERM:
	case -EACCES:
		return hybd__err(err, "%s: permission denied", cmd);
	case -EINTR:
		return hybd__err(err, "%s: interrupted", cmd);
	}
	if (id < 0)
		return hybd__err(err, "%s failed", cmd);
	switch (err) {
	case -ENODEV:
	case -ENOENT:
	case -ENXIO:
		return hybd__err(err, "no device hybd%ld", id);
	case -EBUSY:
		return hybd__err(err, "device hybd%ld is busy", id);
	default:
		return hybd__err(err, "%s for hybd%ld failed", cmd, id);
	}
}

#define CTL_QUIET_OPEN	(1U << 0)	/* no message if the node can't open */
#define CTL_QUIET_IOCTL	(1U << 1)	/* no message if the ioctl fails */

static int ctl_open(unsigned int quiet)
{
	int fd = open(HYBD_CONTROL_PATH, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		return quiet & CTL_QUIET_OPEN ? -errno : ctl_open_err(-errno);
	return fd;
}

/*
 * One ioctl on a freshly opened control node.  Returns the ioctl's value or
 * -errno.  The query ioctls are restarted after a signal; ADD and DEL are
 * not, they may have done part of their work.
 */
static int ctl_ioctl(unsigned long cmd, const char *name, long id, void *arg,
		     unsigned int quiet)
{
	int fd, ret;

	fd = ctl_open(quiet);
	if (fd < 0)
		return fd;
	do {
		ret = ioctl(fd, cmd, arg);
		if (ret < 0)
			ret = -errno;
	} while (ret == -EINTR && cmd != HYBD_CTL_ADD && cmd != HYBD_CTL_DEL);
	close(fd);
	if (ret < 0 && !(quiet & CTL_QUIET_IOCTL))
		ctl_err(ret, name, id);
	return ret;
}

int hybd_ctl_features(struct hybd_ctl_features *f)
{
	int ret;

	if (!f)
		return hybd__err(-EINVAL, "hybd_ctl_features: no buffer");
	memset(f, 0, sizeof(*f));
	f->len = sizeof(*f);
	ret = ctl_ioctl(HYBD_CTL_GET_FEATURES, "HYBD_CTL_GET_FEATURES", -1, f,
			0);
	return ret < 0 ? ret : 0;
}

int hybd_ctl_list(uint32_t *ids, uint32_t room)
{
	struct hybd_ctl_list l = {
		.len = sizeof(l),
		.count = ids ? room : 0,
		.ids = (uintptr_t)ids,
	};
	int ret;

	ret = ctl_ioctl(HYBD_CTL_LIST, "HYBD_CTL_LIST", -1, &l, 0);
	if (ret < 0)
		return ret;
	if (l.count > INT32_MAX)
		return hybd__err(-EOVERFLOW, "HYBD_CTL_LIST: absurd count %u",
				 l.count);
	return l.count;
}

int hybd_ctl_info(uint32_t id, struct hybd_dev_info *info)
{
	int ret;

	if (!info)
		return hybd__err(-EINVAL, "hybd_ctl_info: no buffer");
	memset(info, 0, sizeof(*info));
	info->len = sizeof(*info);
	info->dev_id = id;
	ret = ctl_ioctl(HYBD_CTL_INFO, "HYBD_CTL_INFO", id, info, 0);
	return ret < 0 ? ret : 0;
}

int hybd_ctl_stats(uint32_t id, struct hybd_ctl_stats *st,
		   struct hybd_queue_stat *queues, uint32_t room)
{
	int ret;

	if (!st || (room && !queues))
		return hybd__err(-EINVAL, "hybd_ctl_stats: no buffer");
	memset(st, 0, sizeof(*st));
	st->len = sizeof(*st);
	st->dev_id = id;
	st->queue_room = room;
	st->queues = (uintptr_t)queues;
	ret = ctl_ioctl(HYBD_CTL_STATS, "HYBD_CTL_STATS", id, st, 0);
	if (ret < 0)
		return ret;
	if (st->nr_queues > INT32_MAX)
		return hybd__err(-EOVERFLOW, "HYBD_CTL_STATS: absurd queue count %u",
				 st->nr_queues);
	return st->nr_queues;
}

int hybd_ctl_handover(uint32_t id)
{
	struct hybd_ctl_dev d = { .len = sizeof(d), .dev_id = id };
	int ret;

	ret = ctl_ioctl(HYBD_CTL_HANDOVER, "HYBD_CTL_HANDOVER", id, &d, 0);
	return ret < 0 ? ret : 0;
}

/* Why a resize of hybd@id to @size failed, in words (-errno kept). */
int hybd__resize_err(int err, uint32_t id, uint64_t size)
{
	const char *why;

	switch (err) {
	case -EINVAL:
		why = "the size must be a non-zero multiple of the logical block size, at most 1 PiB";
		break;
	case -EOPNOTSUPP:
		why = "its server does not take resizes (its driver has no resize hook), or the module is too old";
		break;
	case -EAGAIN:
		why = "it is not live (not started yet, or waiting for a new server), or its server was replaced before the size was set (the new one did not agree to it)";
		break;
	case -EBUSY:
		why = "a fast path is attached (detach it to shrink), requests in flight did not end in time, or another resize is under way";
		break;
	case -ETIMEDOUT:
		why = "its server did not answer in time";
		break;
	case -ENODEV:
		why = "no such device, or it is dead or being deleted";
		break;
	case -ENOTTY:
		why = "the loaded module cannot resize (ABI mismatch)";
		break;
	default:
		return hybd__err(err, "cannot resize hybd%u to %" PRIu64 " bytes",
				 id, size);
	}
	return hybd__err(err, "cannot resize hybd%u to %" PRIu64 " bytes: %s",
			 id, size, why);
}

int hybd_ctl_resize(uint32_t id, uint64_t size)
{
	struct hybd_ctl_resize r = { .len = sizeof(r), .dev_id = id,
				     .size = size };
	int ret;

	ret = ctl_ioctl(HYBD_CTL_RESIZE, "HYBD_CTL_RESIZE", id, &r,
			CTL_QUIET_IOCTL);
	if (ret == -EPERM || ret == -EACCES)
		return ctl_err(ret, "HYBD_CTL_RESIZE", id);
	return ret < 0 ? hybd__resize_err(ret, id, size) : 0;
}

/* HYBD_CTL_DEL that leaves the message alone (to undo a half-made device). */
int hybd__ctl_del(uint32_t id)
{
	struct hybd_ctl_dev d = { .len = sizeof(d), .dev_id = id };
	int ret;

	ret = ctl_ioctl(HYBD_CTL_DEL, "HYBD_CTL_DEL", id, &d,
			CTL_QUIET_OPEN | CTL_QUIET_IOCTL);
	return ret < 0 ? ret : 0;
}

int hybd_ctl_del_flags(uint32_t id, uint32_t flags)
{
	struct hybd_ctl_dev d = { .len = sizeof(d), .dev_id = id,
				  .flags = flags };
	int ret;

	ret = ctl_ioctl(HYBD_CTL_DEL, "HYBD_CTL_DEL", id, &d, 0);
	if (ret == -EINTR)
		return hybd__err(ret,
				 "deleting hybd%u: interrupted (the delete goes on in the kernel)",
				 id);
	if (ret == -EOPNOTSUPP && flags)
		return hybd__err(ret,
				 "deleting hybd%u: the loaded module does not know flags 0x%x",
				 id, flags);
	return ret < 0 ? ret : 0;
}

int hybd_ctl_del(uint32_t id)
{
	return hybd_ctl_del_flags(id, 0);
}

int hybd_ctl_add(const struct hybd_config *cfg, uint32_t *id_out)
{
	struct hybd_params p;
	int ret;

	if (!cfg)
		return hybd__err(-EINVAL, "hybd_ctl_add: no configuration");
	ret = hybd__config_to_params(cfg, &p);
	if (ret)
		return ret;
	return hybd__ctl_add_params(&p, cfg->dev_id, id_out);
}

/* Does the caller have CAP_SYS_ADMIN in its effective set? */
static bool sys_admin(void)
{
	struct __user_cap_header_struct hdr = {
		.version = _LINUX_CAPABILITY_VERSION_3,
	};
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];

	if (syscall(SYS_capget, &hdr, data))
		return geteuid() == 0;
	return data[CAP_TO_INDEX(CAP_SYS_ADMIN)].effective &
	       CAP_TO_MASK(CAP_SYS_ADMIN);
}

/*
 * HYBD_CTL_ADD with parameters already made from a config (dev_id -1:
 * any).  A caller without CAP_SYS_ADMIN adds an unprivileged device, its
 * own (HYBD_DEV_F_UNPRIVILEGED).
 */
int hybd__ctl_add_params(const struct hybd_params *p, int32_t dev_id,
			 uint32_t *id_out)
{
	struct hybd_ctl_add add;
	char msg[256];
	int fd, ret;

	memset(&add, 0, sizeof(add));
	add.params = *p;
	if (!sys_admin())
		add.params.basic.flags |= HYBD_DEV_F_UNPRIVILEGED;
	add.len = sizeof(add);
	add.dev_id = dev_id < 0 ? HYBD_DEV_ID_ANY : (uint32_t)dev_id;

	fd = ctl_open(0);
	if (fd < 0)
		return fd;
	ret = ioctl(fd, HYBD_CTL_ADD, &add) < 0 ? -errno : 0;
	close(fd);
	if (ret) {
		hybd__param_errmsg(msg, sizeof(msg), &add.params, dev_id,
				   add.err_param, ret);
		return hybd__err(ret, "%s", msg);
	}
	if (id_out)
		*id_out = add.dev_id;
	return 0;
}
