// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - a new device's parameters, checked (HYBD_CTL_ADD): every field
 * against the UAPI's limits, defaults filled in, and the field at fault
 * named (enum hybd_param_err) for the caller's message.
 */
#include <linux/log2.h>
#include <linux/sizes.h>

#include "hybd.h"

/* Fail with @err and say which field was wrong. */
#define PERR(field, err) ({ *err_param = (field); (err); })

static int hybd_discard_check(struct hybd_params *p, u32 *err_param)
{
	struct hybd_param_discard *d = &p->discard;
	u32 lbs = p->basic.logical_bs;
	/* largest multiple of the block size that fits in 32 bits */
	u32 dflt = round_down(UINT_MAX, lbs);

	if (!(p->types & HYBD_PARAM_DISCARD)) {
		memset(d, 0, sizeof(*d));
	} else {
		if (d->reserved0 || d->reserved[0] || d->reserved[1])
			return PERR(HYBD_PERR_RESERVED, -EINVAL);
		if (!(p->basic.ops &
		      (HYBD_OPF_DISCARD | HYBD_OPF_WRITE_ZEROES)))
			return PERR(HYBD_PERR_DISCARD, -EINVAL);
		if (d->max_discard_bytes % lbs ||
		    d->max_write_zeroes_bytes % lbs)
			return PERR(HYBD_PERR_DISCARD, -EINVAL);
		if (d->discard_granularity &&
		    (!is_power_of_2(d->discard_granularity) ||
		     d->discard_granularity < lbs))
			return PERR(HYBD_PERR_DISCARD, -EINVAL);
	}
	if (!d->max_discard_bytes)
		d->max_discard_bytes = dflt;
	if (!d->max_write_zeroes_bytes)
		d->max_write_zeroes_bytes = dflt;
	if (!d->discard_granularity)
		d->discard_granularity = lbs;
	return 0;
}

/**
 * hybd_params_check() - validate and complete a device's parameters
 * @p: parameters from user space; defaults are filled in
 * @err_param: set to the enum hybd_param_err of the first bad field
 *
 * Return: 0, -EINVAL for a malformed value, -ERANGE for one out of range,
 * -EOPNOTSUPP for unknown bits.
 */
int hybd_params_check(struct hybd_params *p, u32 *err_param)
{
	struct hybd_param_basic *b = &p->basic;
	u32 wc_ops = HYBD_OPF_FLUSH | HYBD_OPF_FUA;
	int i;

	if (p->len != sizeof(*p))
		return PERR(HYBD_PERR_LEN, -EINVAL);
	if (p->types & ~HYBD_PARAM_ALL)
		return PERR(HYBD_PERR_TYPES, -EOPNOTSUPP);
	if (!(p->types & HYBD_PARAM_BASIC))
		return PERR(HYBD_PERR_TYPES, -EINVAL);
	for (i = 0; i < ARRAY_SIZE(b->reserved); i++)
		if (b->reserved[i])
			return PERR(HYBD_PERR_RESERVED, -EINVAL);
	if (b->reserved0)
		return PERR(HYBD_PERR_RESERVED, -EINVAL);

	if (!is_power_of_2(b->logical_bs) || b->logical_bs < SECTOR_SIZE ||
	    b->logical_bs > PAGE_SIZE)
		return PERR(HYBD_PERR_LOGICAL_BS, -EINVAL);
	if (!b->physical_bs)
		b->physical_bs = b->logical_bs;
	if (!is_power_of_2(b->physical_bs) || b->physical_bs < b->logical_bs ||
	    b->physical_bs > SZ_64K)
		return PERR(HYBD_PERR_PHYSICAL_BS, -EINVAL);
	if (!b->dev_size || b->dev_size % b->logical_bs)
		return PERR(HYBD_PERR_SIZE, -EINVAL);
	if (b->dev_size > HYBD_MAX_DEV_SIZE)
		return PERR(HYBD_PERR_SIZE, -ERANGE);
	if (!b->max_io_bytes || b->max_io_bytes % PAGE_SIZE)
		return PERR(HYBD_PERR_MAX_IO, -EINVAL);
	if (b->max_io_bytes > HYBD_MAX_IO_BYTES)
		return PERR(HYBD_PERR_MAX_IO, -ERANGE);
	if (!b->nr_hw_queues || b->nr_hw_queues > HYBD_MAX_QUEUES)
		return PERR(HYBD_PERR_QUEUES, -ERANGE);
	if (!b->queue_depth || b->queue_depth > HYBD_MAX_QUEUE_DEPTH)
		return PERR(HYBD_PERR_DEPTH, -ERANGE);
	if ((u64)b->queue_depth * b->max_io_bytes > HYBD_MAX_QUEUE_BUF)
		return PERR(HYBD_PERR_QUEUE_BUF, -ERANGE);
	/* as asked, before blk-mq caps the queues at the number of CPUs */
	if ((u64)b->nr_hw_queues * b->queue_depth * b->max_io_bytes >
	    HYBD_MAX_DEV_BUF)
		return PERR(HYBD_PERR_DEV_BUF, -ERANGE);

	if (b->ops & ~HYBD_OPF_ALL)
		return PERR(HYBD_PERR_OPS, -EOPNOTSUPP);
	if (!(b->ops & HYBD_OPF_READ))
		return PERR(HYBD_PERR_OPS, -EINVAL);
	/* nothing but reads makes sense on a read-only device */
	if (!(b->ops & HYBD_OPF_WRITE) && b->ops != HYBD_OPF_READ)
		return PERR(HYBD_PERR_OPS, -EINVAL);
	if (b->flags & ~HYBD_DEV_F_ALL)
		return PERR(HYBD_PERR_FLAGS, -EOPNOTSUPP);
	/* flush and FUA exist only with a volatile write cache, and a cache
	 * the server cannot be asked to flush would lose data
	 */
	if ((b->ops & wc_ops) && !(b->flags & HYBD_DEV_F_WRITE_CACHE))
		return PERR(HYBD_PERR_OPS, -EINVAL);
	if ((b->flags & HYBD_DEV_F_WRITE_CACHE) &&
	    !(b->ops & HYBD_OPF_FLUSH))
		return PERR(HYBD_PERR_FLAGS, -EINVAL);
	/* zero writes come as write-zeroes: the server must take those */
	if ((b->flags & HYBD_DEV_F_ZERO_WRITES) &&
	    !(b->ops & HYBD_OPF_WRITE_ZEROES))
		return PERR(HYBD_PERR_FLAGS, -EINVAL);
	if (b->poll_ns > HYBD_MAX_POLL_NS)
		return PERR(HYBD_PERR_POLL, -ERANGE);
	if (b->io_timeout > HYBD_MAX_IO_TIMEOUT)
		return PERR(HYBD_PERR_IO_TIMEOUT, -ERANGE);
	if (b->recovery_timeout > HYBD_MAX_RECOVERY_TIMEOUT)
		return PERR(HYBD_PERR_RECOVERY, -ERANGE);

	return hybd_discard_check(p, err_param);
}
