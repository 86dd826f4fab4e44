// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - the life of a device.
 *
 *   ADDED --(server opens node, HYBD_SRV_START)--> LIVE
 *   ADDED/LIVE --(server's file released, or its process exits)--> DEAD
 *                                                  (all I/O fails)
 *   LIVE --(the same, with a recovery timeout or after a handover)-->
 *          WAITING (I/O held) --(a new server's HYBD_SRV_START)--> LIVE
 *   WAITING --(recovery timeout)--> DEAD
 *   any --(HYBD_CTL_DEL or module unload)--> DELETING, then gone
 *
 * Nothing that waits holds a lock: add_disk() and del_gendisk() run in
 * works, their callers wait killably, and @dev->state_lock is a spinlock.
 * A server that dies while add_disk() or del_gendisk() waits for its I/O
 * fails that I/O, and so does the I/O timeout for a server that is stuck.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blkdev.h>
#include <linux/log2.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "hybd.h"

static const struct block_device_operations hybd_bdev_fops = {
	.owner		= THIS_MODULE,
};

static void hybd_dev_free(struct kref *ref)
{
	struct hybd_dev *dev = container_of(ref, struct hybd_dev, ref);
	unsigned int i;

	/*
	 * The tails of the last remap works (the requests are all over).
	 * The local work is the one that queues the others (a burst's
	 * followers): it goes first.  A batch work queues one only for a
	 * list that is not empty, which no request is left to fill.
	 */
	if (dev->remap_local_wq)
		destroy_workqueue(dev->remap_local_wq);
	if (dev->remap_batch_wq)
		destroy_workqueue(dev->remap_batch_wq);
	if (dev->remap_beside_wq)
		destroy_workqueue(dev->remap_beside_wq);
	if (dev->remap_wq)
		destroy_workqueue(dev->remap_wq);
	hybd_backing_free_retired(dev);
	if (dev->queues) {
		for (i = 0; i < dev->params.basic.nr_hw_queues; i++)
			hybd_queue_free(&dev->queues[i]);
		kfree(dev->queues);
	}
	put_pid(dev->server_pid);
	kfree(dev->cpu_queue);
	mutex_destroy(&dev->backing_lock);
	mutex_destroy(&dev->retired_lock);
	cleanup_srcu_struct(&dev->remap_srcu);
	hybd_owner_release(dev);
	kfree(dev);
}

/**
 * hybd_dev_owns_disk() - whether @disk is @dev's block device
 * @dev: the device
 * @disk: a disk
 *
 * Also while add_disk() runs for it, before @dev->disk is set.
 *
 * Return: true if it is.
 */
bool hybd_dev_owns_disk(struct hybd_dev *dev, struct gendisk *disk)
{
	return (disk->fops == &hybd_bdev_fops && disk->private_data == dev) ||
	       hybd_front_is(dev, disk);
}

void hybd_dev_put(struct hybd_dev *dev)
{
	kref_put(&dev->ref, hybd_dev_free);
}

static int hybd_dev_init_tag_set(struct hybd_dev *dev)
{
	struct blk_mq_tag_set *set = &dev->tag_set;
	u32 tmo = dev->params.basic.io_timeout;

	set->ops = &hybd_mq_ops;
	set->nr_hw_queues = dev->params.basic.nr_hw_queues;
	set->queue_depth = dev->params.basic.queue_depth;
	set->numa_node = NUMA_NO_NODE;
	set->timeout = tmo ? tmo * HZ : HYBD_LIVENESS_TIMEOUT;
	/*
	 * BLOCKING: queue_rq starts remaps on block devices (hybd_queue_rq()).
	 * No I/O scheduler unless asked for, one queue or many, as for loop:
	 * blk-mq gives a one-queue device mq-deadline, whose lock and insert
	 * every request would pay instead of being issued directly, while
	 * what lies below (a server's disk, a remap target) has its own.
	 */
	set->flags = HYBD_MQ_F_MERGE | BLK_MQ_F_BLOCKING |
		     BLK_MQ_F_NO_SCHED_BY_DEFAULT;
	set->driver_data = dev;
	return blk_mq_alloc_tag_set(set);
}

/* devtmpfs makes an unprivileged device's server node its owner's */
static const struct device_type hybd_srv_type = {
	.name		= "hybd_srv",
	.devnode	= hybd_srv_devnode,
};

static void hybd_srv_dev_release(struct device *d)
{
	kfree(d);
}

static int hybd_dev_add_srv_node(struct hybd_dev *dev)
{
	dev_t devt = MKDEV(MAJOR(hybd_srv_devt), dev->id);
	struct device *d;
	int ret;

	/*
	 * A dynamic cdev: it outlives us while a file still references it,
	 * and it is freed by its own kobject.
	 */
	dev->cdev = cdev_alloc();
	if (!dev->cdev)
		return -ENOMEM;
	dev->cdev->owner = THIS_MODULE;
	dev->cdev->ops = &hybd_srv_fops;
	ret = cdev_add(dev->cdev, devt, 1);
	if (ret) {
		kobject_put(&dev->cdev->kobj);
		dev->cdev = NULL;
		return ret;
	}
	/* device_create(), with a type: its devnode names the owner */
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d) {
		ret = -ENOMEM;
		goto out_cdev;
	}
	device_initialize(d);
	d->devt = devt;
	d->class = hybd_class;
	d->type = &hybd_srv_type;
	d->release = hybd_srv_dev_release;
	dev_set_drvdata(d, dev);
	ret = dev_set_name(d, HYBD_SRV_NAME_FMT, dev->id);
	if (!ret)
		ret = device_add(d);
	if (ret) {
		put_device(d);
		goto out_cdev;
	}
	dev->srv_dev = d;
	return 0;

out_cdev:
	cdev_del(dev->cdev);
	dev->cdev = NULL;
	return ret;
}

static void hybd_dev_del_srv_node(struct hybd_dev *dev)
{
	if (dev->srv_dev)
		device_destroy(hybd_class, dev->srv_dev->devt);
	dev->srv_dev = NULL;
	if (dev->cdev)
		cdev_del(dev->cdev);
	dev->cdev = NULL;
}

static void hybd_dev_start_work(struct work_struct *work);
static void hybd_dev_del_work(struct work_struct *work);
static void hybd_dev_recovery_work(struct work_struct *work);

/**
 * hybd_dev_create() - create a device from checked parameters
 * @p: parameters, already through hybd_params_check()
 * @id: wanted id or HYBD_DEV_ID_ANY
 *
 * The device has its queues and server node; the block device appears when
 * the server starts it.  blk-mq may give fewer hardware queues than asked
 * (never more than CPUs): the device's params say how many it has.  The
 * device is published in the table only once it is complete, so that
 * nobody can find (and delete) a device whose creation may still fail.
 *
 * Return: the device with one reference for the caller (the table holds
 * another), or an ERR_PTR.
 */
struct hybd_dev *hybd_dev_create(const struct hybd_params *p, u32 id)
{
	struct hybd_dev *dev;
	unsigned int i, nr;
	int ret;

	dev = kzalloc(sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return ERR_PTR(-ENOMEM);
	if (init_srcu_struct(&dev->remap_srcu)) {
		kfree(dev);
		return ERR_PTR(-ENOMEM);
	}
	kref_init(&dev->ref);
	spin_lock_init(&dev->state_lock);
	mutex_init(&dev->backing_lock);
	INIT_LIST_HEAD(&dev->retired);
	mutex_init(&dev->retired_lock);
	INIT_WORK(&dev->reap_work, hybd_backing_reap_work);
	init_completion(&dev->started);
	init_completion(&dev->deleted);
	INIT_WORK(&dev->start_work, hybd_dev_start_work);
	INIT_WORK(&dev->del_work, hybd_dev_del_work);
	INIT_DELAYED_WORK(&dev->recovery_work, hybd_dev_recovery_work);
	mutex_init(&dev->resize_lock);
	init_waitqueue_head(&dev->resize_wq);
	dev->params = *p;
	dev->state = HYBD_STATE_ADDED;
	ret = hybd_owner_init(dev);
	if (ret)
		goto out_free;
	dev->ring_entries = roundup_pow_of_two(p->basic.queue_depth);

	ret = hybd_dev_init_tag_set(dev);
	if (ret)
		goto out_free;
	dev->cpu_queue = kmemdup(dev->tag_set.map[HCTX_TYPE_DEFAULT].mq_map,
				 nr_cpu_ids * sizeof(*dev->cpu_queue),
				 GFP_KERNEL);
	if (!dev->cpu_queue) {
		ret = -ENOMEM;
		goto out_tag_set;
	}
	/* blk-mq caps the hardware queues at the number of CPUs */
	nr = min_t(unsigned int, dev->tag_set.nr_hw_queues,
		   p->basic.nr_hw_queues);
	dev->params.basic.nr_hw_queues = nr;

	dev->queues = kcalloc(nr, sizeof(*dev->queues), GFP_KERNEL);
	if (!dev->queues) {
		ret = -ENOMEM;
		goto out_tag_set;
	}
	for (i = 0; i < nr; i++) {
		ret = hybd_queue_alloc(dev, &dev->queues[i], i);
		if (ret)
			goto out_tag_set;
	}
	dev->queue_stride = PAGE_ALIGN(dev->queues[0].area_size);

	ret = hybd_dev_reserve_id(dev, id);
	if (ret)
		goto out_tag_set;
	/*
	 * Each queue's reads and writes start in batches (remap.c), since a
	 * file system may do a remap's I/O in the worker (a copy, a page
	 * cache fill), which should not take the submitting CPU:
	 *  - a request alone from a worker of its CPU.  Even so a wakeup of
	 *    it can preempt a submitter that goes on (fio at depth), which
	 *    would then submit one request at a time, each served on its CPU
	 *    while the others idle: hybd_remap_queue() keeps io_uring's
	 *    requests off it; one that waits leaves it the CPU at once.
	 *  - under load, from a worker beside the submitter: on a CPU of
	 *    another of the device's queues, one with no remap in flight.
	 *    An unbound worker is woken next to its waker, where it takes
	 *    turns with the submitter while the other CPUs idle.  That one
	 *    is WQ_CPU_INTENSIVE: a batch that does not sleep (a tmpfs
	 *    copy) must not hold back the other works of that CPU's pool.
	 *  - when every queue is busy, from an unbound worker, as loop's.
	 * No batch workqueue is WQ_HIGHPRI: a batch worker that preempts its
	 * submitter gets one request a turn.  What may wait (a flush, a read
	 * or write that would block) runs in a work of its tag's, beside
	 * them.
	 */
	dev->remap_wq = alloc_workqueue("hybd%u_remap",
					WQ_MEM_RECLAIM | WQ_UNBOUND | WQ_HIGHPRI,
					0, dev->id);
	dev->remap_batch_wq = alloc_workqueue("hybd%u_batch",
					      WQ_MEM_RECLAIM | WQ_UNBOUND, 0,
					      dev->id);
	dev->remap_local_wq = alloc_workqueue("hybd%u_local",
					      WQ_MEM_RECLAIM | HYBD_WQ_PERCPU,
					      0, dev->id);
	dev->remap_beside_wq = alloc_workqueue("hybd%u_beside",
					       WQ_MEM_RECLAIM | HYBD_WQ_PERCPU |
					       WQ_CPU_INTENSIVE, 0, dev->id);
	if (!dev->remap_wq || !dev->remap_batch_wq || !dev->remap_local_wq ||
	    !dev->remap_beside_wq) {
		ret = -ENOMEM;
		goto out_id;
	}
	ret = hybd_dev_add_srv_node(dev);
	if (ret)
		goto out_id;

	kref_get(&dev->ref);	/* the caller's */
	hybd_dev_publish(dev);	/* the table's, from here on */
	return dev;

out_id:
	hybd_dev_remove_id(dev);
out_tag_set:
	blk_mq_free_tag_set(&dev->tag_set);
out_free:
	hybd_dev_put(dev);
	return ERR_PTR(ret);
}

static void hybd_set_limits(struct hybd_dev *dev, struct queue_limits *lim)
{
	const struct hybd_param_basic *b = &dev->params.basic;
	const struct hybd_param_discard *d = &dev->params.discard;

	lim->logical_block_size = b->logical_bs;
	lim->physical_block_size = b->physical_bs;
	lim->io_min = b->physical_bs;
	lim->max_hw_sectors = b->max_io_bytes >> SECTOR_SHIFT;
	lim->max_segments = max_t(unsigned int, BLK_MAX_SEGMENTS,
				  b->max_io_bytes >> PAGE_SHIFT);
	/*
	 * A remapped write is direct I/O from the request's own pages: a
	 * target that checksums them at submit (btrfs, integrity metadata)
	 * must not see them change.  Any device may get a fast path that
	 * remaps, later than a file system on it learns this: always.
	 */
	lim->features |= BLK_FEAT_STABLE_WRITES;
	if (b->flags & HYBD_DEV_F_WRITE_CACHE)
		lim->features |= BLK_FEAT_WRITE_CACHE;
	if (b->ops & HYBD_OPF_FUA)
		lim->features |= BLK_FEAT_FUA;
	if (b->ops & HYBD_OPF_DISCARD) {
		lim->max_hw_discard_sectors = d->max_discard_bytes >>
					      SECTOR_SHIFT;
		lim->discard_granularity = d->discard_granularity;
	}
	if (b->ops & HYBD_OPF_WRITE_ZEROES)
		lim->max_write_zeroes_sectors = d->max_write_zeroes_bytes >>
						SECTOR_SHIFT;
}

/*
 * add_disk() scans partitions, and that I/O is served by the very process
 * that asked to start.  It runs here, in a work, so that the server can
 * be killed at any point: its death fails the I/O and this returns.
 */
static void hybd_dev_start_work(struct work_struct *work)
{
	struct hybd_dev *dev = container_of(work, struct hybd_dev, start_work);
	bool front = dev->params.basic.flags & HYBD_DEV_F_BIO_FRONT;
	struct gendisk *disk, *fdisk = NULL;
	struct queue_limits lim = { };
	int ret = 0;

	spin_lock(&dev->state_lock);
	if (dev->state != HYBD_STATE_ADDED)
		ret = -ENODEV;
	spin_unlock(&dev->state_lock);
	if (ret)
		goto out;

	hybd_set_limits(dev, &lim);
	disk = blk_mq_alloc_disk(&dev->tag_set, &lim, dev);
	if (IS_ERR(disk)) {
		ret = PTR_ERR(disk);
		goto out;
	}
	disk->fops = &hybd_bdev_fops;
	disk->private_data = dev;
	snprintf(disk->disk_name, DISK_NAME_LEN, HYBD_DISK_NAME_FMT, dev->id);
	set_capacity(disk, dev->params.basic.dev_size >> SECTOR_SHIFT);
	if (!(dev->params.basic.ops & HYBD_OPF_WRITE))
		set_disk_ro(disk, true);
	/* a user's content: no partition table parsed from it */
	if (dev->unpriv)
		disk->flags |= GENHD_FL_NO_PART;
	if (front) {
		/*
		 * Behind a front: hybdNq, no node, no partitions, no uevents;
		 * only the front sends it bios.
		 */
		/* the blk-mq disk's own, not what blk-mq made of them */
		lim = (struct queue_limits) { };
		hybd_set_limits(dev, &lim);
		fdisk = hybd_front_alloc(dev, &lim);
		if (IS_ERR(fdisk)) {
			ret = PTR_ERR(fdisk);
			put_disk(disk);
			goto out;
		}
		snprintf(fdisk->disk_name, DISK_NAME_LEN, HYBD_DISK_NAME_FMT,
			 dev->id);
		strlcat(disk->disk_name, "q", DISK_NAME_LEN);
		disk->flags |= GENHD_FL_HIDDEN;
		set_capacity(fdisk, get_capacity(disk));
		if (!(dev->params.basic.ops & HYBD_OPF_WRITE))
			set_disk_ro(fdisk, true);
	}

	ret = device_add_disk(NULL, disk, front ? NULL : hybd_disk_groups);
	if (ret) {
		put_disk(disk);
		if (fdisk)
			put_disk(fdisk);
		goto out;
	}
	/*
	 * The front's bios go to the disk behind it from here: set before
	 * the front's add scans its partitions through it.
	 */
	if (fdisk) {
		WRITE_ONCE(dev->disk, disk);
		ret = device_add_disk(NULL, fdisk, hybd_disk_groups);
		if (ret) {
			put_disk(fdisk);
			WRITE_ONCE(dev->disk, NULL);
			del_gendisk(disk);
			put_disk(disk);
			goto out;
		}
		hybd_front_added(dev, disk);
	}
	/*
	 * A delete waits for this work before it looks at dev->disk; a
	 * server that died while we scanned made the device DEAD already,
	 * and a delete that started meanwhile makes this start fail.
	 */
	spin_lock(&dev->state_lock);
	dev->disk = disk;
	dev->front = fdisk;
	if (dev->state == HYBD_STATE_ADDED)
		dev->state = HYBD_STATE_LIVE;
	else if (dev->state == HYBD_STATE_DELETING)
		ret = -ENODEV;
	spin_unlock(&dev->state_lock);
out:
	if (ret && ret != -ENODEV) {
		/* nothing was added: the server may try again */
		spin_lock(&dev->state_lock);
		dev->start_queued = false;
		spin_unlock(&dev->state_lock);
	}
	dev->start_ret = ret;
	complete_all(&dev->started);
	hybd_dev_put(dev);
}

/* Leaving WAITING: count the time spent there; caller holds state_lock. */
static void hybd_dev_end_waiting(struct hybd_dev *dev)
{
	dev->no_server_ns += ktime_get_ns() - dev->waiting_since;
	WRITE_ONCE(dev->handover, false);
}

/*
 * A new server resumes a WAITING device: every queue gets what its
 * predecessor left, and what was held since.
 */
static int hybd_dev_resume(struct hybd_dev *dev)
{
	struct hybd_reissue *list;
	unsigned int i;
	int ret = 0;

	list = kvmalloc_array(dev->params.basic.queue_depth, sizeof(*list),
			      GFP_KERNEL);
	if (!list)
		return -ENOMEM;
	spin_lock(&dev->state_lock);
	if (dev->state == HYBD_STATE_WAITING) {
		hybd_dev_end_waiting(dev);
		dev->state = HYBD_STATE_LIVE;
		dev->recoveries++;
	} else {
		ret = dev->state == HYBD_STATE_LIVE ? -EALREADY : -ENODEV;
	}
	spin_unlock(&dev->state_lock);
	if (!ret) {
		if (cancel_delayed_work(&dev->recovery_work))
			hybd_dev_put(dev);	/* the work's */
		for (i = 0; i < dev->params.basic.nr_hw_queues; i++) {
			if (hybd_queue_resume(&dev->queues[i], list))
				ret = -ENODEV;
		}
		if (!ret)
			pr_info("hybd%u: resumed by a new server (pid %d)\n",
				dev->id, task_tgid_vnr(current));
	}
	kvfree(list);
	return ret;
}

/**
 * hybd_dev_start() - add the block device, or resume a waiting one
 * @dev: a device in the ADDED state whose server is serving the queues,
 *	 or one WAITING for a new server (which consumes only afterwards)
 *
 * Return: 0, -EALREADY if started, -ENODEV if dead or deleted, -EINTR if
 * the caller was killed while the partitions were scanned (the device is
 * then killed by the server's exit).
 */
int hybd_dev_start(struct hybd_dev *dev)
{
	int ret = 0;

	if (READ_ONCE(dev->state) == HYBD_STATE_WAITING)
		return hybd_dev_resume(dev);

	spin_lock(&dev->state_lock);
	if (dev->start_queued || dev->state == HYBD_STATE_LIVE)
		ret = -EALREADY;
	else if (dev->state != HYBD_STATE_ADDED)
		ret = -ENODEV;
	else
		dev->start_queued = true;
	spin_unlock(&dev->state_lock);
	if (ret)
		return ret;

	kref_get(&dev->ref);	/* the work's */
	queue_work(hybd_wq, &dev->start_work);
	if (wait_for_completion_killable(&dev->started))
		return -EINTR;
	return dev->start_ret;
}

/**
 * hybd_dev_kill() - the server is gone: fail every request, now and later
 * @dev: the device
 *
 * (A request a resume is issuing again is failed by the resume.)
 *
 * Safe to call more than once, from the server file's release, the I/O
 * timeout handler and a delete; it never sleeps.
 */
void hybd_dev_kill(struct hybd_dev *dev)
{
	unsigned int i;

	for (i = 0; i < dev->params.basic.nr_hw_queues; i++)
		hybd_queue_fail_all(&dev->queues[i]);

	spin_lock(&dev->state_lock);
	if (dev->state == HYBD_STATE_WAITING)
		hybd_dev_end_waiting(dev);
	if (dev->state == HYBD_STATE_ADDED || dev->state == HYBD_STATE_LIVE ||
	    dev->state == HYBD_STATE_WAITING)
		dev->state = HYBD_STATE_DEAD;
	spin_unlock(&dev->state_lock);
	hybd_resize_wake(dev);
}

/**
 * hybd_dev_recovery_secs() - how long the device holds I/O for a new server
 * @dev: the device
 *
 * Return: its recovery_timeout; else HYBD_HANDOVER_TIMEOUT if a handover
 * was asked for less than that long ago; else 0 (no recovery: a lost
 * server fails everything).
 */
u32 hybd_dev_recovery_secs(struct hybd_dev *dev)
{
	if (dev->params.basic.recovery_timeout)
		return dev->params.basic.recovery_timeout;
	/* a handover the old server ignores does not last */
	if (READ_ONCE(dev->handover) &&
	    time_before(jiffies, READ_ONCE(dev->handover_until)))
		return HYBD_HANDOVER_TIMEOUT;
	return 0;
}

/* The recovery timeout ran out with no new server: fail what is held. */
static void hybd_dev_recovery_work(struct work_struct *work)
{
	struct hybd_dev *dev = container_of(to_delayed_work(work),
					    struct hybd_dev, recovery_work);
	bool expired;

	spin_lock(&dev->state_lock);
	expired = dev->state == HYBD_STATE_WAITING;
	if (expired) {
		/* a resume from here on finds the device dead */
		hybd_dev_end_waiting(dev);
		dev->state = HYBD_STATE_DEAD;
	}
	spin_unlock(&dev->state_lock);
	if (expired) {
		pr_warn("hybd%u: no server came back within the recovery timeout: failing held I/O\n",
			dev->id);
		hybd_dev_kill(dev);
	}
	hybd_dev_put(dev);	/* ours */
}

/**
 * hybd_dev_lose_server() - the server's file is gone
 * @dev: the device
 *
 * Without recovery, every request fails, now and later (hybd_dev_kill()).
 * A live device in recovery mode (or handed over) goes WAITING instead:
 * the completions the server posted are taken, the queues are parked and
 * the recovery timeout starts.  A device already WAITING (a new server
 * left before it resumed) keeps waiting on the same timeout.
 */
void hybd_dev_lose_server(struct hybd_dev *dev)
{
	bool orphan, waiting;
	unsigned int i;
	u32 secs;

	/*
	 * Under state_lock, so that a handover is not missed and a delete
	 * that sees WAITING finds the work armed (it cancels it).
	 */
	spin_lock(&dev->state_lock);
	secs = hybd_dev_recovery_secs(dev);
	waiting = dev->state == HYBD_STATE_WAITING;
	orphan = secs && dev->state == HYBD_STATE_LIVE;
	if (orphan) {
		dev->state = HYBD_STATE_WAITING;
		dev->waiting_since = ktime_get_ns();
		dev->recovery_deadline = jiffies + secs * HZ;
		dev->gone_since = 0;
		kref_get(&dev->ref);	/* the work's */
		if (!queue_delayed_work(hybd_wq, &dev->recovery_work,
					secs * HZ))
			kref_put(&dev->ref, hybd_dev_free);	/* not the last */
	}
	spin_unlock(&dev->state_lock);
	if (waiting)
		return;
	hybd_resize_wake(dev);
	if (!orphan) {
		hybd_dev_kill(dev);
		return;
	}

	for (i = 0; i < dev->params.basic.nr_hw_queues; i++) {
		struct hybd_queue *q = &dev->queues[i];

		/* what it finished is done: its area is nobody's now */
		hybd_queue_commit(q);
		spin_lock(&q->lock);
		q->parked = true;
		spin_unlock(&q->lock);
	}
	pr_info("hybd%u: server gone, holding I/O for a new one for %u s\n",
		dev->id, secs);
}

/**
 * hybd_dev_handover() - ask the live server to drain and leave
 * @dev: the device
 *
 * Return: 0 (also when no server is attached), -ENODEV if not live.
 */
int hybd_dev_handover(struct hybd_dev *dev)
{
	unsigned int i;
	int ret = 0;

	spin_lock(&dev->state_lock);
	if (dev->state == HYBD_STATE_LIVE && dev->server_open) {
		WRITE_ONCE(dev->handover_until,
			   jiffies + HYBD_HANDOVER_TIMEOUT * HZ);
		WRITE_ONCE(dev->handover, true);
	} else if (dev->state != HYBD_STATE_WAITING)
		ret = -ENODEV;
	spin_unlock(&dev->state_lock);
	if (ret || !READ_ONCE(dev->handover))
		return ret;

	for (i = 0; i < dev->params.basic.nr_hw_queues; i++) {
		struct hybd_queue *q = &dev->queues[i];

		spin_lock(&q->lock);
		WRITE_ONCE(q->hdr->flags, q->hdr->flags | HYBD_RING_DRAIN);
		WRITE_ONCE(q->kicked, true);
		spin_unlock(&q->lock);
		/* kicked before the waiter's condition check */
		smp_mb();
		hybd_queue_wake(q);
	}
	return 0;
}

/**
 * hybd_dev_is_server() - is the calling process the device's server?
 * @dev: the device
 *
 * Return: true if the caller's thread group opened the server node (a
 * child or another holder of the file is not the server).
 */
bool hybd_dev_is_server(struct hybd_dev *dev)
{
	bool ret;

	spin_lock(&dev->state_lock);
	ret = dev->server_open && dev->server_pid == task_tgid(current);
	spin_unlock(&dev->state_lock);
	return ret;
}

/**
 * hybd_dev_server_gone() - is the process serving the device exiting?
 * @dev: the device
 *
 * The server's file can outlive its process (a child that inherited the
 * descriptor, a file passed on): a server is gone as soon as its thread
 * group exits or is killed, whoever still holds the file.
 *
 * Return: true if a server opened the device and its process is exiting
 * or gone.
 */
bool hybd_dev_server_gone(struct hybd_dev *dev)
{
	struct task_struct *task;
	struct pid *pid;
	bool gone;

	spin_lock(&dev->state_lock);
	pid = dev->server_open ? get_pid(dev->server_pid) : NULL;
	spin_unlock(&dev->state_lock);
	if (!pid)
		return false;

	/*
	 * Killed or exit_group(): SIGNAL_GROUP_EXIT.  Every thread gone by
	 * exit() leaves a zombie leader with no live thread.  A leader that
	 * called pthread_exit() while the workers run is alive, and so is a
	 * server that execs (its file is close-on-exec, or it serves on).
	 */
	rcu_read_lock();
	task = pid_task(pid, PIDTYPE_TGID);
	gone = !task || (READ_ONCE(task->signal->flags) & SIGNAL_GROUP_EXIT) ||
	       !atomic_read(&task->signal->live);
	rcu_read_unlock();
	put_pid(pid);
	return gone;
}

/*
 * Remove the block device and everything else.  A live server keeps
 * serving while the disk goes, so that data the block layer still holds
 * (dirty pages, requests in flight) reaches it; a stuck one is ended by the
 * I/O timeout, a dead one has failed everything already, and a forced
 * delete failed it all before this ran.
 */
static void hybd_dev_del_work(struct work_struct *work)
{
	struct hybd_dev *dev = container_of(work, struct hybd_dev, del_work);
	struct gendisk *disk, *front;

	/* a start finishes first: it may be adding the disk right now */
	flush_work(&dev->start_work);
	spin_lock(&dev->state_lock);
	disk = dev->disk;
	front = dev->front;
	spin_unlock(&dev->state_lock);

	/*
	 * The front goes first, while the disk behind it still serves what
	 * it writes back.  Its queue is held only within submit_bio, not
	 * until a remap ends: the remaps it started end before the device
	 * can be freed (and before the front's iostats go).
	 */
	if (front) {
		del_gendisk(front);
		synchronize_srcu(&dev->remap_srcu);
		hybd_front_deleted(front, disk);
	}
	if (disk)
		del_gendisk(disk);
	hybd_dev_kill(dev);
	/* armed by a server lost while the delete began: no later than here */
	if (cancel_delayed_work_sync(&dev->recovery_work))
		hybd_dev_put(dev);	/* the work's */
	hybd_bpf_dev_gone(dev);
	if (disk) {
		spin_lock(&dev->state_lock);
		dev->disk = NULL;
		dev->front = NULL;
		spin_unlock(&dev->state_lock);
		/* a front keeps @disk until its own last reference goes */
		put_disk(disk);
		if (front)
			put_disk(front);
	}
	blk_mq_free_tag_set(&dev->tag_set);
	hybd_dev_del_srv_node(dev);
	/* the id (and the names hybdN, hybdN-srv) can be reused from here */
	hybd_dev_remove_id(dev);

	complete_all(&dev->deleted);
	hybd_dev_put(dev);	/* the table's */
}

/**
 * hybd_dev_delete() - remove the device
 * @dev: the device; the caller holds a reference
 * @flags: HYBD_DEL_F_*; with HYBD_DEL_F_FORCE, outstanding I/O fails now
 * @killable: whether a fatal signal ends the wait (not the delete)
 *
 * The first call starts the delete in a work; every call waits for it.
 *
 * Return: 0 once the device is gone, -EINTR if the caller was killed first
 * (the delete goes on).
 */
int hybd_dev_delete(struct hybd_dev *dev, u32 flags, bool killable)
{
	bool first, waiting;

	spin_lock(&dev->state_lock);
	first = !dev->del_queued;
	dev->del_queued = true;
	waiting = dev->state == HYBD_STATE_WAITING;
	if (waiting)
		hybd_dev_end_waiting(dev);
	dev->state = HYBD_STATE_DELETING;
	spin_unlock(&dev->state_lock);
	hybd_resize_wake(dev);

	/* held I/O has nobody to serve it: it fails now */
	if (waiting && cancel_delayed_work(&dev->recovery_work))
		hybd_dev_put(dev);	/* the work's */
	if ((flags & HYBD_DEL_F_FORCE) || waiting)
		hybd_dev_kill(dev);
	if (first)
		queue_work(hybd_wq, &dev->del_work);	/* takes the table's ref */

	if (!killable) {
		/* module exit: nothing to interrupt, and nobody to wait for */
		wait_for_completion(&dev->deleted);
		return 0;
	}
	return wait_for_completion_killable(&dev->deleted) ? -EINTR : 0;
}
