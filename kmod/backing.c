// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - backing targets: the files and block devices a server registers
 * with its device (HYBD_SRV_ADD_BACKING), where the fast path will serve
 * requests in the kernel.
 *
 * The device holds its own reference to each file, from the registration
 * until HYBD_SRV_DEL_BACKING or the release of the server node; readers
 * find a target under RCU, and a target is put only after a grace period.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blkdev.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/rcupdate.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "hybd.h"

struct hybd_backing {
	struct file	*file;
	u64		size;
	u32		flags;		/* HYBD_BACKING_F_* */
	u32		dio_align;
};

/*
 * Check @file as a target of @dev; its size and direct I/O alignment.
 * A block device's alignment is its logical block size; a regular file's
 * is its file system's device's (or 512 for one without a device).
 */
static int hybd_backing_check(struct hybd_dev *dev, struct file *file,
			      u32 flags, u64 *size, u32 *align)
{
	struct inode *inode = file_inode(file);
	struct super_block *sb = inode->i_sb;

	if (!(file->f_mode & FMODE_READ))
		return -EBADF;
	if ((flags & HYBD_BACKING_F_WRITE) && !(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (S_ISBLK(inode->i_mode)) {
		struct block_device *bdev = I_BDEV(file->f_mapping->host);

		*size = bdev_nr_bytes(bdev);
		*align = bdev_logical_block_size(bdev);
	} else if (S_ISREG(inode->i_mode)) {
		*size = i_size_read(inode);
		*align = sb->s_bdev ? bdev_logical_block_size(sb->s_bdev) :
				      SECTOR_SIZE;
	} else {
		return -EINVAL;
	}
	if (!(file->f_mode & FMODE_CAN_ODIRECT))
		return -EOPNOTSUPP;
	if (!*size || dev->params.basic.logical_bs % *align)
		return -EINVAL;
	return 0;
}

/**
 * hybd_backing_add() - HYBD_SRV_ADD_BACKING
 * @dev: the device
 * @arg: struct hybd_srv_backing in user space
 *
 * Return: 0 with the index, size and alignment written back, or -errno.
 */
long hybd_backing_add(struct hybd_dev *dev, void __user *arg)
{
	struct hybd_srv_backing b;
	struct hybd_backing *t;
	struct file *file;
	unsigned int i;
	int ret;

	if (copy_from_user(&b, arg, sizeof(b)))
		return -EFAULT;
	if (b.len < sizeof(b) || b.reserved0 || b.reserved[0] || b.reserved[1])
		return -EINVAL;
	if (b.flags & ~HYBD_BACKING_F_ALL)
		return -EOPNOTSUPP;
	file = fget(b.fd);
	if (!file)
		return -EBADF;
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	ret = t ? hybd_backing_check(dev, file, b.flags, &t->size,
				     &t->dio_align) : -ENOMEM;
	if (ret)
		goto out;
	t->file = file;
	t->flags = b.flags;

	ret = -ENOSPC;
	mutex_lock(&dev->backing_lock);
	for (i = 0; i < HYBD_MAX_BACKINGS; i++) {
		if (rcu_access_pointer(dev->backing[i]))
			continue;
		rcu_assign_pointer(dev->backing[i], t);
		ret = 0;
		break;
	}
	mutex_unlock(&dev->backing_lock);
	if (ret)
		goto out;

	b.index = i;
	b.size = t->size;
	b.dio_align = t->dio_align;
	/* registered: a caller that cannot read the answer can still DEL */
	if (copy_to_user(arg, &b, sizeof(b)))
		return -EFAULT;
	return 0;
out:
	kfree(t);
	fput(file);
	return ret;
}

/* Take target @i off @dev; the caller puts it after a grace period. */
static struct hybd_backing *hybd_backing_take(struct hybd_dev *dev,
					      unsigned int i)
{
	struct hybd_backing *t;

	t = rcu_dereference_protected(dev->backing[i],
				      lockdep_is_held(&dev->backing_lock));
	RCU_INIT_POINTER(dev->backing[i], NULL);
	return t;
}

static void hybd_backing_put(struct hybd_backing *t)
{
	fput(t->file);
	kfree(t);
}

/**
 * hybd_backing_del() - HYBD_SRV_DEL_BACKING
 * @dev: the device
 * @index: the target's index
 *
 * Return: 0, -EINVAL for an index out of range, -ENOENT if none is there.
 */
long hybd_backing_del(struct hybd_dev *dev, unsigned long index)
{
	struct hybd_backing *t;

	if (index >= HYBD_MAX_BACKINGS)
		return -EINVAL;
	mutex_lock(&dev->backing_lock);
	t = hybd_backing_take(dev, index);
	mutex_unlock(&dev->backing_lock);
	if (!t)
		return -ENOENT;
	synchronize_rcu();
	hybd_backing_put(t);
	return 0;
}

/**
 * hybd_backing_drop_all() - the server is gone: let go of its targets
 * @dev: the device
 */
void hybd_backing_drop_all(struct hybd_dev *dev)
{
	struct hybd_backing *old[HYBD_MAX_BACKINGS];
	unsigned int i, n = 0;

	mutex_lock(&dev->backing_lock);
	for (i = 0; i < HYBD_MAX_BACKINGS; i++) {
		old[n] = hybd_backing_take(dev, i);
		if (old[n])
			n++;
	}
	mutex_unlock(&dev->backing_lock);
	if (!n)
		return;
	synchronize_rcu();
	for (i = 0; i < n; i++)
		hybd_backing_put(old[i]);
}
