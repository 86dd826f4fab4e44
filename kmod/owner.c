// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - unprivileged devices (HYBD_DEV_F_UNPRIVILEGED): who may do what
 * to a device, and how much a user without CAP_SYS_ADMIN may add.
 *
 * An unprivileged device belongs to the effective uid that added it.  Its
 * owner or an administrator may delete it, hand it over, resize it and
 * serve it; anyone who may open the control node may list and inspect it.
 * What it costs the kernel is bounded per user: a number of devices and
 * the memory their rings pin, counted the same way for the limit and for
 * the devices already there, and checked under one lock so that two adds
 * of one user cannot both take the last place.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cred.h>
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/uidgid.h>

#include "hybd.h"

static unsigned int max_user_devices = 8;
module_param(max_user_devices, uint, 0644);
MODULE_PARM_DESC(max_user_devices,
		 "unprivileged devices a user may have (default 8)");

static unsigned int max_user_mem_mb = 512;
module_param(max_user_mem_mb, uint, 0644);
MODULE_PARM_DESC(max_user_mem_mb,
		 "MiB of ring buffers a user's unprivileged devices may pin (default 512)");

/* held from the limits' check until the device is in the table */
static DEFINE_MUTEX(hybd_user_lock);

/* What the rings of a device with @p cost: the per-request buffers. */
u64 hybd_owner_charge(const struct hybd_params *p)
{
	return (u64)p->basic.nr_hw_queues * p->basic.queue_depth *
	       p->basic.max_io_bytes;
}

/**
 * hybd_owner_add_begin() - may the caller add a device with @p?
 * @p: the checked parameters
 *
 * Return: 0 with hybd_user_lock held for an unprivileged device (the
 * caller ends with hybd_owner_add_end()), 0 for an administrator's, or
 * -EPERM (no CAP_SYS_ADMIN, and not HYBD_DEV_F_UNPRIVILEGED), -EDQUOT (a
 * limit), -EINTR.
 */
int hybd_owner_add_begin(const struct hybd_params *p)
{
	u64 mem, limit = (u64)max_user_mem_mb << 20;
	u32 devices;

	if (!(p->basic.flags & HYBD_DEV_F_UNPRIVILEGED))
		return capable(CAP_SYS_ADMIN) ? 0 : -EPERM;
	if (mutex_lock_interruptible(&hybd_user_lock))
		return -EINTR;
	hybd_dev_user_usage(current_euid(), &devices, &mem);
	if (devices >= READ_ONCE(max_user_devices) ||
	    mem + hybd_owner_charge(p) > limit) {
		mutex_unlock(&hybd_user_lock);
		return -EDQUOT;
	}
	return 0;
}

void hybd_owner_add_end(const struct hybd_params *p)
{
	if (p->basic.flags & HYBD_DEV_F_UNPRIVILEGED)
		mutex_unlock(&hybd_user_lock);
}

/* At creation, in the caller's context: whose device it is. */
void hybd_owner_init(struct hybd_dev *dev)
{
	dev->unpriv = dev->params.basic.flags & HYBD_DEV_F_UNPRIVILEGED;
	if (dev->unpriv) {
		dev->owner_uid = current_euid();
		dev->owner_gid = current_egid();
	}
}

/* Delete, hand over, resize, serve: the owner's or an administrator's. */
bool hybd_owner_may_manage(struct hybd_dev *dev)
{
	if (dev->unpriv && uid_eq(current_euid(), dev->owner_uid))
		return true;
	return capable(CAP_SYS_ADMIN);
}

/*
 * A backing target of an unprivileged device: the server must be allowed
 * to read it (and write it, for @write) itself, whoever opened @file.
 */
int hybd_owner_may_use_file(struct hybd_dev *dev, struct file *file,
			    bool write)
{
	if (!dev->unpriv)
		return 0;
	return inode_permission(file_mnt_idmap(file), file_inode(file),
				MAY_READ | (write ? MAY_WRITE : 0));
}

/* The owner for HYBD_CTL_INFO, as the caller's user namespace sees it. */
void hybd_owner_fill_info(struct hybd_dev *dev, struct hybd_dev_info *info)
{
	info->owner_uid = dev->unpriv ?
		from_kuid_munged(current_user_ns(), dev->owner_uid) : (u32)-1;
	info->owner_gid = dev->unpriv ?
		from_kgid_munged(current_user_ns(), dev->owner_gid) : (u32)-1;
}

/* /sys/block/hybdN/hybd/owner_uid, owner_gid: for udev; empty if none */
static ssize_t owner_uid_show(struct device *d, struct device_attribute *attr,
			      char *buf)
{
	struct hybd_dev *dev = dev_to_disk(d)->private_data;

	if (!dev->unpriv)
		return sysfs_emit(buf, "\n");
	return sysfs_emit(buf, "%u\n", from_kuid(&init_user_ns,
						   dev->owner_uid));
}
static DEVICE_ATTR_RO(owner_uid);

static ssize_t owner_gid_show(struct device *d, struct device_attribute *attr,
			      char *buf)
{
	struct hybd_dev *dev = dev_to_disk(d)->private_data;

	if (!dev->unpriv)
		return sysfs_emit(buf, "\n");
	return sysfs_emit(buf, "%u\n", from_kgid(&init_user_ns,
						   dev->owner_gid));
}
static DEVICE_ATTR_RO(owner_gid);

static struct attribute *hybd_disk_attrs[] = {
	&dev_attr_owner_uid.attr,
	&dev_attr_owner_gid.attr,
	NULL,
};

static const struct attribute_group hybd_disk_group = {
	.name	= "hybd",
	.attrs	= hybd_disk_attrs,
};

const struct attribute_group *hybd_disk_groups[] = {
	&hybd_disk_group,
	NULL,
};

/*
 * The server node's owner in devtmpfs: an unprivileged device's owner.
 * Asked again for the name alone (@uid and @gid NULL) when the node goes.
 */
char *hybd_srv_devnode(const struct device *d, umode_t *mode, kuid_t *uid,
		       kgid_t *gid)
{
	struct hybd_dev *dev = dev_get_drvdata(d);

	if (dev && dev->unpriv && uid && gid) {
		*uid = dev->owner_uid;
		*gid = dev->owner_gid;
		if (mode)
			*mode = 0600;
	}
	return NULL;
}
