// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - hybrid kernel/user block drivers.
 *
 * Module init/exit and the table of devices.  A device is referenced by the
 * table (until deleted) and by its server file (until released); the last
 * reference frees it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/xarray.h>

#include "hybd.h"

struct workqueue_struct *hybd_wq;
struct class *hybd_class;
dev_t hybd_srv_devt;
bool hybd_bpf_ready;

static DEFINE_XARRAY_ALLOC(hybd_devs);
static DEFINE_MUTEX(hybd_devs_lock);

/**
 * hybd_dev_get() - look up a device by id and take a reference
 * @id: device id
 *
 * Return: the device, or NULL.  Drop the reference with hybd_dev_put().
 */
struct hybd_dev *hybd_dev_get(u32 id)
{
	struct hybd_dev *dev;

	mutex_lock(&hybd_devs_lock);
	dev = xa_load(&hybd_devs, id);
	if (dev)
		kref_get(&dev->ref);
	mutex_unlock(&hybd_devs_lock);
	return dev;
}

/**
 * hybd_dev_get_by_disk() - the device whose block device @disk is, referenced
 * @disk: a disk
 *
 * Return: the device, or NULL (not a live hybd device's disk).  Drop the
 * reference with hybd_dev_put().
 */
struct hybd_dev *hybd_dev_get_by_disk(struct gendisk *disk)
{
	struct hybd_dev *dev;
	unsigned long id;

	mutex_lock(&hybd_devs_lock);
	xa_for_each(&hybd_devs, id, dev) {
		if (hybd_dev_owns_disk(dev, disk)) {
			kref_get(&dev->ref);
			mutex_unlock(&hybd_devs_lock);
			return dev;
		}
	}
	mutex_unlock(&hybd_devs_lock);
	return NULL;
}

/**
 * hybd_dev_reserve_id() - give a new device an id, not yet published
 * @dev: the device
 * @id: wanted id or HYBD_DEV_ID_ANY
 *
 * The id is taken, but hybd_dev_get() does not find the device until
 * hybd_dev_publish().
 *
 * Return: 0, -EEXIST if @id is taken, -ENOSPC if every id is.
 */
int hybd_dev_reserve_id(struct hybd_dev *dev, u32 id)
{
	int ret;

	mutex_lock(&hybd_devs_lock);
	if (id == HYBD_DEV_ID_ANY) {
		/* storing NULL in an allocating xarray reserves the index */
		ret = xa_alloc(&hybd_devs, &dev->id, NULL,
			       XA_LIMIT(0, HYBD_MAX_DEVICES - 1), GFP_KERNEL);
		if (ret == -EBUSY)
			ret = -ENOSPC;
	} else {
		ret = xa_insert(&hybd_devs, id, NULL, GFP_KERNEL);
		if (ret == -EBUSY)
			ret = -EEXIST;
		else if (!ret)
			dev->id = id;
	}
	mutex_unlock(&hybd_devs_lock);
	return ret;
}

/* Make a complete device findable; the table owns a reference from now. */
void hybd_dev_publish(struct hybd_dev *dev)
{
	mutex_lock(&hybd_devs_lock);
	/* the slot is reserved: storing into it allocates nothing */
	WARN_ON(xa_store(&hybd_devs, dev->id, dev, GFP_KERNEL));
	mutex_unlock(&hybd_devs_lock);
}

/* Forget the device's id (reserved or published); it can be reused. */
void hybd_dev_remove_id(struct hybd_dev *dev)
{
	void *cur;

	mutex_lock(&hybd_devs_lock);
	cur = xa_load(&hybd_devs, dev->id);
	if (cur == dev || !cur)
		xa_erase(&hybd_devs, dev->id);
	mutex_unlock(&hybd_devs_lock);
}

/**
 * hybd_dev_list() - the ids of every device
 * @ids: array of @room entries
 * @room: size of @ids
 *
 * Return: the number of devices, which may exceed @room.
 */
int hybd_dev_list(u32 *ids, u32 room)
{
	struct hybd_dev *dev;
	unsigned long idx;
	int n = 0;

	mutex_lock(&hybd_devs_lock);
	xa_for_each(&hybd_devs, idx, dev) {
		if (n < room)
			ids[n] = idx;
		n++;
	}
	mutex_unlock(&hybd_devs_lock);
	return n;
}

static void hybd_delete_all(void)
{
	struct hybd_dev *dev;
	unsigned long idx;

	for (;;) {
		idx = 0;
		mutex_lock(&hybd_devs_lock);
		dev = xa_find(&hybd_devs, &idx, ULONG_MAX, XA_PRESENT);
		if (dev)
			kref_get(&dev->ref);
		mutex_unlock(&hybd_devs_lock);
		if (!dev)
			break;
		hybd_dev_delete(dev, 0, false);
		hybd_dev_put(dev);
	}
}

static int __init hybd_init(void)
{
	int ret;

	/*
	 * add_disk() and del_gendisk() run here.  No WQ_MEM_RECLAIM: nothing
	 * in reclaim waits for these works, and the delete work flushes the
	 * start work, which a rescuer thread could not do for itself.
	 */
	hybd_wq = alloc_workqueue("hybd", WQ_UNBOUND, 0);
	if (!hybd_wq)
		return -ENOMEM;
	ret = alloc_chrdev_region(&hybd_srv_devt, 0, HYBD_MAX_DEVICES,
				  "hybd-srv");
	if (ret)
		goto out_wq;

	hybd_class = class_create("hybd");
	if (IS_ERR(hybd_class)) {
		ret = PTR_ERR(hybd_class);
		goto out_chrdev;
	}

	/* without BPF support the module still works, minus the fast path */
	ret = hybd_bpf_init();
	if (ret)
		pr_warn("BPF fast path unavailable (%d)\n", ret);
	hybd_bpf_ready = !ret;

	ret = hybd_remap_init();
	if (ret)
		goto out_class;
	ret = hybd_front_init();
	if (ret)
		goto out_remap;

	ret = hybd_ctl_init();
	if (ret)
		goto out_front;

	pr_info("loaded: version %s, ABI %u\n", HYBD_VERSION, HYBD_ABI_VERSION);
	return 0;

out_front:
	hybd_front_exit();
out_remap:
	hybd_remap_exit();
out_class:
	class_destroy(hybd_class);
out_chrdev:
	unregister_chrdev_region(hybd_srv_devt, HYBD_MAX_DEVICES);
out_wq:
	destroy_workqueue(hybd_wq);
	return ret;
}

/*
 * Unloading is refused by the module refcount while a server node or the
 * control node is open; devices without a server are torn down here (a
 * device waiting for a new server fails what it holds).
 */
static void __exit hybd_exit(void)
{
	hybd_ctl_exit();
	hybd_delete_all();
	/* the tails of the last start and delete works */
	destroy_workqueue(hybd_wq);
	hybd_front_exit();
	hybd_remap_exit();
	class_destroy(hybd_class);
	unregister_chrdev_region(hybd_srv_devt, HYBD_MAX_DEVICES);
	pr_info("unloaded\n");
}

module_init(hybd_init);
module_exit(hybd_exit);

MODULE_DESCRIPTION("hybd: hybrid kernel/user block drivers with a BPF fast path");
MODULE_AUTHOR("The hybd developers");
MODULE_LICENSE("GPL");
MODULE_VERSION(HYBD_VERSION);
