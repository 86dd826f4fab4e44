// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - the control node, /dev/hybd-control.
 *
 * Every structure starts with its length so that old and new user space
 * keep working: shorter means older (missing fields are zero), longer is
 * accepted when the bytes we do not know are zero.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "hybd.h"

/**
 * hybd_copy_in() - copy a len-prefixed structure in from user space
 * @dst: the kernel's structure
 * @size: its size
 * @min: the size of the structure's first version
 * @src: the user's, whose first __u32 is its length
 *
 * The UAPI's growth rules (copy_struct_from_user()): a shorter (older)
 * structure is zero-extended, a longer (newer) one is taken if what the
 * kernel does not know of it is zero.
 *
 * Return: 0, -EFAULT, -EINVAL (shorter than @min) or -E2BIG (a non-zero
 * byte past @size).
 */
int hybd_copy_in(void *dst, size_t size, size_t min, const void __user *src)
{
	u32 len;

	if (get_user(len, (const u32 __user *)src))
		return -EFAULT;
	if (len < min)
		return -EINVAL;
	return copy_struct_from_user(dst, size, src, len);
}

/* Copy out at most as much as the caller said it has room for. */
static int hybd_copy_out(void __user *dst, const void *src, size_t size)
{
	u32 len;

	if (get_user(len, (const u32 __user *)dst))
		return -EFAULT;
	if (copy_to_user(dst, src, min_t(size_t, len, size)))
		return -EFAULT;
	return 0;
}

static long hybd_ctl_features(void __user *arg)
{
	struct hybd_ctl_features f;
	int ret;

	ret = hybd_copy_in(&f, sizeof(f), offsetofend(typeof(f), features),
			   arg);
	if (ret)
		return ret;
	memset(&f, 0, sizeof(f));
	f.len = sizeof(f);
	f.abi_version = HYBD_ABI_VERSION;
	f.features = HYBD_F_RINGS | HYBD_F_POLL | HYBD_F_SEQ_CHECK |
		     HYBD_F_IO_TIMEOUT | HYBD_F_DEL_FORCE | HYBD_F_EVENTFD |
		     HYBD_F_QUEUE_CPUS | HYBD_F_MEM_INFO | HYBD_F_RECOVERY |
		     HYBD_F_BACKING | HYBD_F_RESIZE | HYBD_F_UNPRIVILEGED;
	if (hybd_bpf_ready)
		f.features |= HYBD_F_BPF | HYBD_F_PASS_ZEROES | HYBD_F_REMAP |
			      HYBD_F_REMAP_POLL | HYBD_F_BIO_FRONT;
	return hybd_copy_out(arg, &f, sizeof(f));
}

static long hybd_ctl_add(struct hybd_ctl_add __user *arg)
{
	struct hybd_ctl_add add;
	struct hybd_dev *dev;
	u32 err = HYBD_PERR_NONE, len;
	int ret;

	ret = hybd_copy_in(&add, sizeof(add), sizeof(add), arg);
	if (ret) {
		err = HYBD_PERR_LEN;
		goto out;
	}
	if (add.reserved0 || add.reserved[0] || add.reserved[1]) {
		err = HYBD_PERR_RESERVED;
		ret = -EINVAL;
		goto out;
	}
	if (add.dev_id != HYBD_DEV_ID_ANY && add.dev_id >= HYBD_MAX_DEVICES) {
		err = HYBD_PERR_DEV_ID;
		ret = -ERANGE;
		goto out;
	}
	ret = hybd_params_check(&add.params, &err);
	if (ret)
		goto out;
	ret = hybd_owner_check(&add.params, &err);
	if (ret)
		goto out;

	dev = hybd_dev_create(&add.params, add.dev_id);
	if (IS_ERR(dev)) {
		ret = PTR_ERR(dev);
		if (ret == -EEXIST || ret == -ENOSPC)
			err = HYBD_PERR_DEV_ID;
		goto out;
	}
	if (put_user(dev->id, &arg->dev_id) ||
	    copy_to_user(&arg->params, &dev->params, sizeof(dev->params))) {
		/* the device goes on being deleted if we are killed */
		hybd_dev_delete(dev, 0, true);
		hybd_dev_put(dev);
		return -EFAULT;
	}
	hybd_dev_put(dev);
	return 0;
out:
	/* a structure too short to hold err_param gets only the errno */
	if (get_user(len, &arg->len))
		return -EFAULT;
	if (len >= offsetofend(struct hybd_ctl_add, err_param) &&
	    put_user(err, &arg->err_param))
		return -EFAULT;
	return ret;
}

/*
 * Copy in and check a struct hybd_ctl_dev whose flags may be @flags_ok;
 * the device it names, with a reference, in *@devp.
 */
static int hybd_ctl_dev_get(void __user *arg, u32 flags_ok,
			    struct hybd_ctl_dev *cmd, struct hybd_dev **devp)
{
	int ret;

	ret = hybd_copy_in(cmd, sizeof(*cmd), sizeof(*cmd), arg);
	if (ret)
		return ret;
	if (cmd->flags & ~flags_ok)
		return -EOPNOTSUPP;
	if (cmd->reserved0)
		return -EINVAL;
	*devp = hybd_dev_get(cmd->dev_id);
	if (!*devp)
		return -ENODEV;
	/* delete and hand over: the owner's or an administrator's */
	if (!hybd_owner_may_manage(*devp)) {
		hybd_dev_put(*devp);
		return -EPERM;
	}
	return 0;
}

static long hybd_ctl_del(void __user *arg)
{
	struct hybd_ctl_dev cmd;
	struct hybd_dev *dev;
	int ret;

	ret = hybd_ctl_dev_get(arg, HYBD_DEL_F_ALL, &cmd, &dev);
	if (ret)
		return ret;
	ret = hybd_dev_delete(dev, cmd.flags, true);
	hybd_dev_put(dev);
	return ret;
}

static long hybd_ctl_handover(void __user *arg)
{
	struct hybd_ctl_dev cmd;
	struct hybd_dev *dev;
	int ret;

	ret = hybd_ctl_dev_get(arg, 0, &cmd, &dev);
	if (ret)
		return ret;
	ret = hybd_dev_handover(dev);
	hybd_dev_put(dev);
	return ret;
}

static long hybd_ctl_info(void __user *arg)
{
	struct hybd_dev_info *info;
	struct hybd_dev *dev;
	int ret;

	info = kzalloc(sizeof(*info), GFP_KERNEL);
	if (!info)
		return -ENOMEM;
	ret = hybd_copy_in(info, sizeof(*info),
			   offsetofend(struct hybd_dev_info, dev_id), arg);
	if (ret)
		goto out;

	dev = hybd_dev_get(info->dev_id);
	if (!dev) {
		ret = -ENODEV;
		goto out;
	}
	hybd_dev_fill_info(dev, info);
	hybd_dev_put(dev);
	ret = hybd_copy_out(arg, info, sizeof(*info));
out:
	kfree(info);
	return ret;
}

static long hybd_ctl_list(void __user *arg)
{
	struct hybd_ctl_list cmd;
	u32 *ids;
	int n, ret;

	ret = hybd_copy_in(&cmd, sizeof(cmd), sizeof(cmd), arg);
	if (ret)
		return ret;
	ids = kcalloc(HYBD_MAX_DEVICES, sizeof(*ids), GFP_KERNEL);
	if (!ids)
		return -ENOMEM;
	n = hybd_dev_list(ids, HYBD_MAX_DEVICES);
	ret = -EFAULT;
	if (copy_to_user(u64_to_user_ptr(cmd.ids), ids,
			 min_t(u32, cmd.count, n) * sizeof(*ids)))
		goto out;
	if (put_user(n, &((struct hybd_ctl_list __user *)arg)->count))
		goto out;
	ret = 0;
out:
	kfree(ids);
	return ret;
}

static long hybd_ctl_stats(struct hybd_ctl_stats __user *arg)
{
	struct hybd_ctl_stats *st;
	struct hybd_queue_stat *qs;
	struct hybd_dev *dev;
	unsigned int i, nr;
	int ret;

	st = kzalloc(sizeof(*st), GFP_KERNEL);
	qs = kzalloc(sizeof(*qs), GFP_KERNEL);
	ret = -ENOMEM;
	if (!st || !qs)
		goto out;
	ret = hybd_copy_in(st, sizeof(*st), sizeof(*st), arg);
	if (ret)
		goto out;
	if (st->reserved[0] || st->reserved[1]) {
		ret = -EINVAL;
		goto out;
	}
	dev = hybd_dev_get(st->dev_id);
	if (!dev) {
		ret = -ENODEV;
		goto out;
	}
	nr = dev->params.basic.nr_hw_queues;
	memset(&st->total, 0, sizeof(st->total));
	for (i = 0; i < nr; i++) {
		memset(qs, 0, sizeof(*qs));
		hybd_queue_stat_add(&dev->queues[i], qs);
		hybd_queue_stat_add(&dev->queues[i], &st->total);
		if (i < st->queue_room &&
		    copy_to_user(u64_to_user_ptr(st->queues) + i * sizeof(*qs),
				 qs, sizeof(*qs))) {
			ret = -EFAULT;
			break;
		}
	}
	hybd_dev_put(dev);
	if (ret)
		goto out;
	st->nr_queues = nr;
	st->len = sizeof(*st);
	ret = hybd_copy_out(arg, st, sizeof(*st));
out:
	kfree(qs);
	kfree(st);
	return ret;
}

static long hybd_ctl_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	/*
	 * Whoever may open the node (root only, unless the administrator
	 * gives a group access) may look; adding checks the caller's
	 * privilege and limits, and the commands on a device its owner
	 * (owner.c).
	 */
	switch (cmd) {
	case HYBD_CTL_GET_FEATURES:
		return hybd_ctl_features(uarg);
	case HYBD_CTL_ADD:
		return hybd_ctl_add(uarg);
	case HYBD_CTL_DEL:
		return hybd_ctl_del(uarg);
	case HYBD_CTL_INFO:
		return hybd_ctl_info(uarg);
	case HYBD_CTL_LIST:
		return hybd_ctl_list(uarg);
	case HYBD_CTL_STATS:
		return hybd_ctl_stats(uarg);
	case HYBD_CTL_HANDOVER:
		return hybd_ctl_handover(uarg);
	case HYBD_CTL_RESIZE:
		return hybd_ctl_resize(uarg);
	default:
		return -ENOTTY;
	}
}

static const struct file_operations hybd_ctl_fops = {
	.owner		= THIS_MODULE,
	.open		= nonseekable_open,
	.unlocked_ioctl	= hybd_ctl_ioctl,
	.compat_ioctl	= compat_ptr_ioctl,
};

static struct miscdevice hybd_ctl_misc = {
	.minor		= MISC_DYNAMIC_MINOR,
	.name		= HYBD_CONTROL_NAME,
	.fops		= &hybd_ctl_fops,
	.mode		= 0600,
};

int hybd_ctl_init(void)
{
	return misc_register(&hybd_ctl_misc);
}

void hybd_ctl_exit(void)
{
	misc_deregister(&hybd_ctl_misc);
}
