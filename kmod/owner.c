// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - unprivileged devices (HYBD_DEV_F_UNPRIVILEGED): who may do what
 * to a device, and how much a user without CAP_SYS_ADMIN may add.
 *
 * An unprivileged device belongs to the effective uid that added it.  Its
 * owner or an administrator may delete it, hand it over, resize it and
 * serve it; anyone who may open the control node may list and inspect it.
 * What it costs the kernel is bounded per paying user (the owner, or the
 * user behind its user namespaces) and for all users together: a number
 * of devices and the memory they pin, charged at creation and returned
 * when the device is freed (not when it is deleted: a server may map its
 * rings after that), under one lock so that two adds cannot both take
 * the last place.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cred.h>
#include <linux/fs.h>
#include <linux/log2.h>
#include <linux/magic.h>
#include <linux/major.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uidgid.h>
#include <linux/user_namespace.h>

#include "hybd.h"

static unsigned int max_user_devices = 8;
module_param(max_user_devices, uint, 0644);
MODULE_PARM_DESC(max_user_devices,
		 "unprivileged devices a user may have (default 8)");

static unsigned int max_user_mem_mb = 512;
module_param(max_user_mem_mb, uint, 0644);
MODULE_PARM_DESC(max_user_mem_mb,
		 "MiB of kernel memory a user's unprivileged devices may pin (default 512)");

static unsigned int max_unpriv_devices = HYBD_MAX_DEVICES / 2;
module_param(max_unpriv_devices, uint, 0644);
MODULE_PARM_DESC(max_unpriv_devices,
		 "unprivileged devices of all users together (default half the table: 32)");

static unsigned int max_user_timeout = 120;
module_param(max_user_timeout, uint, 0644);
MODULE_PARM_DESC(max_user_timeout,
		 "longest io_timeout and recovery_timeout of an unprivileged device, seconds (default 120)");

/* an unprivileged device's io_timeout when it asks for none */
#define HYBD_USER_IO_TIMEOUT	30

/*
 * What a device costs besides its rings, its tags and what it has per
 * CPU: its disks, their queues and sysfs, its workqueues.  An estimate,
 * on the safe side.
 */
#define HYBD_OWNER_DEV_COST	(256U << 10)
/* a tag's request and its hybd_tag, with slack for the scheduler's */
#define HYBD_OWNER_TAG_COST	1024U
/*
 * The remap workqueues' rescuers: a kernel thread each, its stack and
 * task, for each WQ_MEM_RECLAIM workqueue hybd_dev_create() allocates
 * (remap, batch, local, beside: keep in step).
 */
#define HYBD_OWNER_RESCUERS	4U
#define HYBD_OWNER_THREAD_COST	(THREAD_SIZE + (16U << 10))
/*
 * Per possible CPU, besides each queue's statistics: the two per-CPU
 * workqueues' pool_workqueues, the two unbound ones' per-CPU pointers,
 * and blk-mq's software queue of each disk (the front has none).
 */
#define HYBD_OWNER_CPU_COST	(2U * 512U + 2U * 64U + 2U * 1024U)

/*
 * A user's charge.  It lives from the first add until the last of the
 * user's devices is freed: the rings of a deleted device stay while a
 * server still maps them, and count until then.
 */
struct hybd_user {
	struct list_head	node;
	kuid_t			uid;
	u32			devices;
	u64			mem;
};

/* the users' charges and the total of unprivileged devices */
static DEFINE_SPINLOCK(hybd_user_lock);
static LIST_HEAD(hybd_users);
static u32 hybd_unpriv_devices;

/*
 * What a device with @p pins: its rings, its tags, what it has per
 * possible CPU (each queue's statistics are per CPU: a 64-queue device on
 * a machine of 256 possible CPUs has megabytes of them), its rescuer
 * threads, its fixed part.
 */
u64 hybd_owner_charge(const struct hybd_params *p)
{
	u32 sq_off, cq_off, desc_off, data_off;
	u64 cpus = num_possible_cpus();
	size_t area;
	/* blk-mq gives no more hardware queues than CPUs */
	u32 nr = min_t(u32, p->basic.nr_hw_queues, nr_cpu_ids);

	area = hybd_queue_area_size(p, roundup_pow_of_two(p->basic.queue_depth),
				    &sq_off, &cq_off, &desc_off, &data_off);
	return (u64)nr *
	       (area + (u64)p->basic.queue_depth * HYBD_OWNER_TAG_COST) +
	       cpus * ((u64)nr * sizeof(struct hybd_queue_stats) +
		       HYBD_OWNER_CPU_COST) +
	       HYBD_OWNER_RESCUERS * HYBD_OWNER_THREAD_COST +
	       HYBD_OWNER_DEV_COST;
}

/*
 * Who pays for the caller's device: its effective uid, or, inside user
 * namespaces, the user (not root) who made the outermost of them that a
 * user made.  Otherwise a user given subordinate uids could take a
 * limit's worth under each of them.  Namespaces root made (a container
 * runtime's) are the administrator's partition: there the effective uid
 * pays, which is distinct per container when the runtime maps each to
 * its own range.
 */
static kuid_t hybd_owner_payer(void)
{
	struct user_namespace *ns;
	kuid_t payer = current_euid();

	for (ns = current_user_ns(); ns != &init_user_ns; ns = ns->parent) {
		if (!uid_eq(ns->owner, GLOBAL_ROOT_UID))
			payer = ns->owner;
	}
	return payer;
}

static struct hybd_user *hybd_user_find(kuid_t uid)
{
	struct hybd_user *u;

	list_for_each_entry(u, &hybd_users, node) {
		if (uid_eq(u->uid, uid))
			return u;
	}
	return NULL;
}

/*
 * hybd_owner_check() - may the caller add a device with @p, and with what
 * timeouts?  In the caller's context, before anything is allocated.
 *
 * An unprivileged device always has an I/O timeout (HYBD_USER_IO_TIMEOUT
 * for 0) and none, nor a recovery timeout, beyond max_user_timeout: its
 * server, which may be hostile, must not hold a request (and whoever
 * issued it: udev, a mount) for ever.
 *
 * Return: 0, or -EPERM (no CAP_SYS_ADMIN and not HYBD_DEV_F_UNPRIVILEGED,
 * HYBD_DEV_F_REMAP_POLL or HYBD_DEV_F_BIO_FRONT on an unprivileged device,
 * or a timeout beyond
 * the limit: *@err names it).
 */
int hybd_owner_check(struct hybd_params *p, u32 *err)
{
	struct hybd_param_basic *b = &p->basic;
	u32 limit = READ_ONCE(max_user_timeout);

	if (!(b->flags & HYBD_DEV_F_UNPRIVILEGED)) {
		if (capable(CAP_SYS_ADMIN))
			return 0;
		*err = HYBD_PERR_FLAGS;
		return -EPERM;
	}
	/*
	 * Kernel threads' CPU, which no limit of the owner's would bound; a
	 * front serves only what an administrator's program maps, and a
	 * second disk is more of the kernel's for a user to drive.
	 */
	if (b->flags & (HYBD_DEV_F_REMAP_POLL | HYBD_DEV_F_BIO_FRONT)) {
		*err = HYBD_PERR_FLAGS;
		return -EPERM;
	}
	if (!b->io_timeout)
		b->io_timeout = min(HYBD_USER_IO_TIMEOUT, limit ?: 1);
	if (b->io_timeout > limit) {
		*err = HYBD_PERR_IO_TIMEOUT;
		return -EPERM;
	}
	if (b->recovery_timeout > limit) {
		*err = HYBD_PERR_RECOVERY;
		return -EPERM;
	}
	return 0;
}

/*
 * hybd_owner_init() - at creation, in the caller's context: whose device
 * it is, and charge its cost to the user who pays for it.
 *
 * Return: 0, -EDQUOT (a limit), -ENOMEM.  The charge is returned by
 * hybd_owner_release() when the device is freed.
 */
int hybd_owner_init(struct hybd_dev *dev)
{
	struct hybd_user *u, *fresh;
	u64 limit = (u64)READ_ONCE(max_user_mem_mb) << 20;
	kuid_t payer;
	int ret = 0;

	dev->unpriv = dev->params.basic.flags & HYBD_DEV_F_UNPRIVILEGED;
	if (!dev->unpriv)
		return 0;
	dev->owner_uid = current_euid();
	dev->owner_gid = current_egid();
	payer = hybd_owner_payer();

	ratelimit_state_init(&dev->resize_rs, 5 * HZ, 10);
	/* refusals are counted, not logged (this would say "suppressed") */
	ratelimit_set_flags(&dev->resize_rs, RATELIMIT_MSG_ON_RELEASE);

	fresh = kzalloc(sizeof(*fresh), GFP_KERNEL_ACCOUNT);
	if (!fresh)
		return -ENOMEM;
	dev->charge = hybd_owner_charge(&dev->params);

	spin_lock(&hybd_user_lock);
	u = hybd_user_find(payer);
	if (hybd_unpriv_devices >= READ_ONCE(max_unpriv_devices) ||
	    (u && u->devices >= READ_ONCE(max_user_devices)) ||
	    (u ? u->mem : 0) + dev->charge > limit ||
	    !READ_ONCE(max_user_devices)) {
		ret = -EDQUOT;
		goto out;
	}
	if (!u) {
		u = fresh;
		fresh = NULL;
		u->uid = payer;
		list_add(&u->node, &hybd_users);
	}
	u->devices++;
	u->mem += dev->charge;
	hybd_unpriv_devices++;
	dev->payer = payer;
	dev->charged = true;
out:
	spin_unlock(&hybd_user_lock);
	kfree(fresh);
	return ret;
}

/* The device is freed (rings and all): return its charge. */
void hybd_owner_release(struct hybd_dev *dev)
{
	struct hybd_user *u, *gone = NULL;

	if (!dev->charged)
		return;
	spin_lock(&hybd_user_lock);
	u = hybd_user_find(dev->payer);
	if (!WARN_ON_ONCE(!u)) {
		u->devices--;
		u->mem -= dev->charge;
		if (!u->devices) {
			list_del(&u->node);
			gone = u;
		}
	}
	hybd_unpriv_devices--;
	spin_unlock(&hybd_user_lock);
	dev->charged = false;
	kfree(gone);
}

/* Delete, hand over, resize, serve: the owner's or an administrator's. */
bool hybd_owner_may_manage(struct hybd_dev *dev)
{
	if (dev->unpriv && uid_eq(current_euid(), dev->owner_uid))
		return true;
	return capable(CAP_SYS_ADMIN);
}

/*
 * Whether @file keeps its data on this machine, where a remap's I/O ends
 * in bounded time: a block device (not a loop device, whose file may be
 * anywhere, nor nbd), or a file on a file system built on block devices
 * (FS_REQUIRES_DEV: btrfs has no s_bdev; not FUSE's fuseblk, whose
 * daemon answers), or on tmpfs (memory).  Not a file on FUSE, NFS, 9p,
 * virtiofs and the like: a remap there waits for whoever serves it, and
 * remaps are failed neither by the I/O timeout nor by a forced delete.
 */
static bool hybd_owner_file_is_local(struct file *file)
{
	struct super_block *sb;
	unsigned int major;

	if (S_ISBLK(file_inode(file)->i_mode)) {
		major = file_bdev(file)->bd_disk->major;
		return major != LOOP_MAJOR && major != NBD_MAJOR;
	}
	/* overlayfs: the file system that holds the data */
	sb = d_real_inode(file->f_path.dentry)->i_sb;
	if (sb->s_magic == TMPFS_MAGIC)
		return true;
	return (sb->s_type->fs_flags & FS_REQUIRES_DEV) &&
	       sb->s_magic != FUSE_SUPER_MAGIC;
}

/*
 * A backing target of an unprivileged device: on local storage
 * (-EPERM: its user could otherwise hold the device's I/O, its id and
 * the module forever), and the server must be allowed to read it (and
 * write it, for @write) itself, whoever opened @file.
 */
int hybd_owner_may_use_file(struct hybd_dev *dev, struct file *file,
			    bool write)
{
	if (!dev->unpriv)
		return 0;
	if (!hybd_owner_file_is_local(file))
		return -EPERM;
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
