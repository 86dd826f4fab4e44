// SPDX-License-Identifier: MIT
/*
 * Error reporting: every failure returns -errno and leaves a sentence in a
 * thread-local buffer that hybd_errmsg() returns.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "hybd_internal.h"

static __thread char hybd_msg[HYBD_ERRMSG_MAX];

const char *hybd_errmsg(void)
{
	return hybd_msg;
}

/* Record a message for the caller and pass @err through. */
int hybd__err(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(hybd_msg, sizeof(hybd_msg), fmt, ap);
	va_end(ap);
	return err;
}

static int dev_id_errmsg(char *buf, size_t size, int32_t dev_id, int err)
{
	if (dev_id < 0 || err == -ENOSPC)
		return snprintf(buf, size,
				"no free device id (at most %u devices)",
				HYBD_MAX_DEVICES);
	if (err == -EEXIST || err == -EBUSY)
		return snprintf(buf, size, "device id %d is already in use",
				dev_id);
	return snprintf(buf, size, "device id %d: must be between 0 and %u",
			dev_id, HYBD_MAX_DEVICES - 1);
}

static int ops_errmsg(char *buf, size_t size, const struct hybd_param_basic *b)
{
	const uint32_t wc_ops = HYBD_OPF_FLUSH | HYBD_OPF_FUA;
	char names[96];

	hybd__ops_str(b->ops, names, sizeof(names));
	if (b->ops & ~HYBD_OPF_ALL)
		return snprintf(buf, size,
				"operations %s: unknown bits 0x%x (known: 0x%x)",
				names, b->ops & ~HYBD_OPF_ALL, HYBD_OPF_ALL);
	if (!(b->ops & HYBD_OPF_READ))
		return snprintf(buf, size,
				"operations %s: read is mandatory", names);
	if (!(b->ops & HYBD_OPF_WRITE) && b->ops != HYBD_OPF_READ)
		return snprintf(buf, size,
				"operations %s: without write, read must be the only operation",
				names);
	if ((b->ops & wc_ops) && !(b->flags & HYBD_DEV_F_WRITE_CACHE))
		return snprintf(buf, size,
				"operations %s: flush and fua need the volatile write cache",
				names);
	return snprintf(buf, size, "operations %s: refused by the kernel",
			names);
}

static int flags_errmsg(char *buf, size_t size,
			const struct hybd_param_basic *b, int err)
{
	if (b->flags & ~HYBD_DEV_F_ALL)
		return snprintf(buf, size,
				"device flags 0x%x: unknown bits 0x%x (known: 0x%x)",
				b->flags, b->flags & ~HYBD_DEV_F_ALL,
				HYBD_DEV_F_ALL);
	if ((b->flags & HYBD_DEV_F_REMAP_POLL) && err == -EOPNOTSUPP)
		return snprintf(buf, size,
				"device flags 0x%x: polling remap workers (HYBD_DEV_F_REMAP_POLL) need kernel feature remap_poll",
				b->flags);
	if ((b->flags & HYBD_DEV_F_BIO_FRONT) && err == -EOPNOTSUPP)
		return snprintf(buf, size,
				"device flags 0x%x: a bio-based front (HYBD_DEV_F_BIO_FRONT) needs kernel feature bio_front",
				b->flags);
	if ((b->flags & HYBD_DEV_F_ZERO_WRITES) &&
	    !(b->ops & HYBD_OPF_WRITE_ZEROES))
		return snprintf(buf, size,
				"device flags 0x%x: zero writes as write-zeroes need the write-zeroes operation",
				b->flags);
	if ((b->flags & HYBD_DEV_F_WRITE_CACHE) &&
	    !(b->ops & HYBD_OPF_FLUSH))
		return snprintf(buf, size,
				"device flags 0x%x: a volatile write cache needs the flush operation",
				b->flags);
	if ((b->flags & HYBD_DEV_F_UNPRIVILEGED) &&
	    (b->flags & HYBD_DEV_F_REMAP_POLL))
		return snprintf(buf, size,
				"device flags 0x%x: an unprivileged device's remap workers may not poll (HYBD_DEV_F_REMAP_POLL)",
				b->flags);
	if ((b->flags & HYBD_DEV_F_UNPRIVILEGED) &&
	    (b->flags & HYBD_DEV_F_BIO_FRONT))
		return snprintf(buf, size,
				"device flags 0x%x: an unprivileged device may not have a bio-based front (HYBD_DEV_F_BIO_FRONT)",
				b->flags);
	return snprintf(buf, size, "device flags 0x%x: refused by the kernel",
			b->flags);
}

static int discard_errmsg(char *buf, size_t size, const struct hybd_params *p)
{
	const struct hybd_param_discard *d = &p->discard;
	uint32_t lbs = p->basic.logical_bs;

	if (!(p->basic.ops & (HYBD_OPF_DISCARD | HYBD_OPF_WRITE_ZEROES)))
		return snprintf(buf, size,
				"discard limits given but neither discard nor write-zeroes is enabled");
	if (d->discard_granularity &&
	    (!hybd__is_pow2(d->discard_granularity) || d->discard_granularity < lbs))
		return snprintf(buf, size,
				"discard granularity %u: must be 0 (the logical block size) or a power of two >= the logical block size (%u)",
				d->discard_granularity, lbs);
	return snprintf(buf, size,
			"max discard %u / max write-zeroes %u bytes: must be multiples of the logical block size (%u)",
			d->max_discard_bytes, d->max_write_zeroes_bytes, lbs);
}

static int generic_errmsg(char *buf, size_t size, int err)
{
	switch (err) {
	case -ENOSPC:
		return snprintf(buf, size,
				"no free device id (at most %u devices)",
				HYBD_MAX_DEVICES);
	case -ENOMEM:
		return snprintf(buf, size,
				"the kernel is out of memory for the device");
	case -EPERM:
	case -EACCES:
		return snprintf(buf, size,
				"permission denied (a user without CAP_SYS_ADMIN may add only an unprivileged device, HYBD_DEV_F_UNPRIVILEGED)");
	case -EDQUOT:
		return snprintf(buf, size,
				"this user has as many unprivileged devices, or as much kernel memory in them, as the module allows (its parameters max_user_devices and max_user_mem_mb), or all users together have max_unpriv_devices");
	case -ENOTTY:
		return snprintf(buf, size,
				"the loaded module does not know HYBD_CTL_ADD (ABI mismatch)");
	case -EINTR:
		return snprintf(buf, size, "adding the device was interrupted");
	default:
		return snprintf(buf, size, "adding the device failed");
	}
}

/*
 * Say which parameter HYBD_CTL_ADD refused, with its value and the allowed
 * range.  @p holds what was sent, @dev_id the id asked for (-1: any),
 * @err_param and @err what the kernel answered.  Returns snprintf()'s count.
 */
int hybd__param_errmsg(char *buf, size_t size, const struct hybd_params *p,
		       int32_t dev_id, uint32_t err_param, int err)
{
	const struct hybd_param_basic *b = &p->basic;

	switch (err_param) {
	case HYBD_PERR_LEN:
		return snprintf(buf, size,
				"parameter block of %u bytes not understood by the kernel (libhybd and module ABI mismatch)",
				p->len);
	case HYBD_PERR_TYPES:
		return snprintf(buf, size,
				"parameter types 0x%x: the basic block is mandatory, known types are 0x%x",
				p->types, HYBD_PARAM_ALL);
	case HYBD_PERR_RESERVED:
		return snprintf(buf, size,
				"a reserved parameter field is not zero");
	case HYBD_PERR_DEV_ID:
		return dev_id_errmsg(buf, size, dev_id, err);
	case HYBD_PERR_SIZE:
		if (b->dev_size > HYBD_MAX_DEV_SIZE)
			return snprintf(buf, size,
					"device size %" PRIu64 ": too large, at most %" PRIu64 " (1 PiB)",
					(uint64_t)b->dev_size,
					(uint64_t)HYBD_MAX_DEV_SIZE);
		if (!b->dev_size || !b->logical_bs ||
		    b->dev_size % b->logical_bs)
			return snprintf(buf, size,
					"device size %" PRIu64 ": must be a non-zero multiple of the logical block size (%u)",
					(uint64_t)b->dev_size, b->logical_bs);
		return snprintf(buf, size,
				"device size %" PRIu64 ": larger than the kernel allows",
				(uint64_t)b->dev_size);
	case HYBD_PERR_LOGICAL_BS:
		return snprintf(buf, size,
				"logical block size %u: must be a power of two between 512 and 4096",
				b->logical_bs);
	case HYBD_PERR_PHYSICAL_BS:
		return snprintf(buf, size,
				"physical block size %u: must be 0 (same as logical) or a power of two between the logical block size (%u) and 65536",
				b->physical_bs, b->logical_bs);
	case HYBD_PERR_MAX_IO:
		return snprintf(buf, size,
				"max I/O size %u: must be a multiple of 4096 between 4096 and %u",
				b->max_io_bytes, HYBD_MAX_IO_BYTES);
	case HYBD_PERR_QUEUES:
		return snprintf(buf, size,
				"number of queues %u: must be between 1 and %u",
				b->nr_hw_queues, HYBD_MAX_QUEUES);
	case HYBD_PERR_DEPTH:
		return snprintf(buf, size,
				"queue depth %u: must be between 1 and %u",
				b->queue_depth, HYBD_MAX_QUEUE_DEPTH);
	case HYBD_PERR_QUEUE_BUF:
		return snprintf(buf, size,
				"queue depth %u x max I/O size %u = %" PRIu64 " bytes of buffers per queue: must not exceed %u (256 MiB)",
				b->queue_depth, b->max_io_bytes,
				(uint64_t)b->queue_depth * b->max_io_bytes,
				HYBD_MAX_QUEUE_BUF);
	case HYBD_PERR_DEV_BUF:
		return snprintf(buf, size,
				"%u queues x depth %u x max I/O size %u = %" PRIu64 " bytes of buffers per device: must not exceed %" PRIu64 " (1 GiB)",
				b->nr_hw_queues, b->queue_depth, b->max_io_bytes,
				(uint64_t)b->nr_hw_queues * b->queue_depth *
				b->max_io_bytes,
				(uint64_t)HYBD_MAX_DEV_BUF);
	case HYBD_PERR_OPS:
		return ops_errmsg(buf, size, b);
	case HYBD_PERR_FLAGS:
		return flags_errmsg(buf, size, b, err);
	case HYBD_PERR_POLL:
		if (b->poll_ns <= HYBD_MAX_POLL_NS)
			return snprintf(buf, size,
					"poll time %u ns: busy-polling is not supported by the kernel",
					b->poll_ns);
		return snprintf(buf, size,
				"poll time %u ns: must be at most %u ns (1 ms)",
				b->poll_ns, HYBD_MAX_POLL_NS);
	case HYBD_PERR_DISCARD:
		return discard_errmsg(buf, size, p);
	case HYBD_PERR_IO_TIMEOUT:
		if (err == -EPERM)
			return snprintf(buf, size,
					"I/O timeout %u s: too long for an unprivileged device (at most the module parameter max_user_timeout, 120 s by default)",
					b->io_timeout);
		return snprintf(buf, size,
				"I/O timeout %u s: must be at most %u s (0: none)",
				b->io_timeout, HYBD_MAX_IO_TIMEOUT);
	case HYBD_PERR_RECOVERY:
		if (err == -EPERM)
			return snprintf(buf, size,
					"recovery timeout %u s: too long for an unprivileged device (at most the module parameter max_user_timeout, 120 s by default)",
					b->recovery_timeout);
		return snprintf(buf, size,
				"recovery timeout %u s: must be at most %u s (0: none)",
				b->recovery_timeout, HYBD_MAX_RECOVERY_TIMEOUT);
	default:
		return generic_errmsg(buf, size, err);
	}
}
