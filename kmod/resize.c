// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - online resize: HYBD_CTL_RESIZE (the server is asked first) and
 * HYBD_SRV_RESIZE (the server's own resize, or its answer).
 *
 * Two phases.  The server is asked first, while the queue runs: it
 * accepts or refuses, and lets go of nothing.  The kernel then commits:
 * a grow needs nothing of the block layer but the new capacity (requests
 * beyond the old end can only come after it); a shrink must not leave a
 * request beyond the new end in flight, nor let one in, so the queue is
 * frozen (drained, new requests held back) around the capacity change
 * alone.  The committed size is published last, in the ring headers:
 * only then may the server let go of what a shrink cut off, so that a
 * resize that fails after the answer (a drain that does not end, a
 * signal) loses nothing.  Nothing waits for the server while the queue
 * is frozen, and the change uevent, which allocates and takes a global
 * mutex, is sent once requests flow again.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blk-mq.h>
#include <linux/blkdev.h>
#include <linux/kobject.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/wait.h>

#include "hybd.h"

/* How long a server may take to answer, and a shrink to drain. */
static unsigned long hybd_resize_timeout(struct hybd_dev *dev)
{
	u32 secs = dev->params.basic.io_timeout;

	return (secs ? secs : HYBD_RESIZE_TIMEOUT) * HZ;
}

/* The state a resize needs: live, and with a server (not waiting). */
static bool hybd_resize_askable(struct hybd_dev *dev)
{
	return READ_ONCE(dev->state) == HYBD_STATE_LIVE;
}

/* Why not, when not askable: -EAGAIN (waiting for a server), -ENODEV. */
static int hybd_resize_not_live(struct hybd_dev *dev)
{
	switch (READ_ONCE(dev->state)) {
	case HYBD_STATE_ADDED:
	case HYBD_STATE_WAITING:
		return -EAGAIN;
	case HYBD_STATE_LIVE:
		return 0;
	default:
		return -ENODEV;
	}
}

/* Queue 0's HYBD_RING_RESIZE: set with the request, or cleared. */
static void hybd_resize_flag(struct hybd_queue *q, u32 gen, u64 size)
{
	spin_lock(&q->lock);
	if (gen) {
		WRITE_ONCE(q->hdr->resize_size, size);
		/* the server loads the flag, then gen, each with acquire */
		smp_store_release(&q->hdr->resize_gen, gen);
		/* pairs with the server's acquire of the flag */
		smp_store_release(&q->hdr->flags,
				  q->hdr->flags | HYBD_RING_RESIZE);
	} else {
		WRITE_ONCE(q->hdr->flags, q->hdr->flags & ~HYBD_RING_RESIZE);
	}
	spin_unlock(&q->lock);
}

/*
 * As HYBD_SRV_KICK: the worker returns from HYBD_SRV_IO and looks at its
 * ring header.  The barrier orders kicked before the waiter's condition
 * check in wake_up_all().
 */
static void hybd_resize_kick(struct hybd_queue *q)
{
	/* the header before kicked: the worker reads it once woken */
	smp_mb();
	WRITE_ONCE(q->kicked, true);
	smp_mb();	/* kicked before the waiters' condition is checked */
	hybd_queue_wake(q);
}

/*
 * Freeze @q: drain it, holding new requests back, until @end (jiffies)
 * at most and only until a signal, checked every tenth of a second.
 *
 * Return: 0 (frozen: the caller unfreezes), -EBUSY (not drained in time),
 * -EINTR.
 */
static int hybd_resize_freeze(struct request_queue *q, unsigned long end)
{
	int ret = 0;

	blk_freeze_queue_start(q);
	while (!blk_mq_freeze_queue_wait_timeout(q, HZ / 10)) {
		if (signal_pending(current))
			ret = -EINTR;
		else if (time_after(jiffies, end))
			ret = -EBUSY;
		if (ret) {
			hybd_unfreeze_queue(q);
			return ret;
		}
	}
	return 0;
}

/*
 * Wait for the remaps the front started to end (an SRCU grace period of
 * @ssp), until @end (jiffies) at most and only until a signal: a remap on
 * a target that holds its I/O (a suspended dm device, a hung server
 * behind it) must not hang the resize.  Looked at after a jiffy (a grace
 * period with no remap in flight is that short), then every tenth of a
 * second.
 *
 * Return: 0, -EBUSY (not over in time), -EINTR.
 */
static int hybd_resize_srcu_wait(struct srcu_struct *ssp, unsigned long end)
{
	unsigned long cookie = start_poll_synchronize_srcu(ssp);
	long nap = 1;

	while (!poll_state_synchronize_srcu(ssp, cookie)) {
		if (signal_pending(current))
			return -EINTR;
		if (time_after(jiffies, end))
			return -EBUSY;
		schedule_timeout_interruptible(nap);
		nap = HZ / 10;
	}
	return 0;
}

/*
 * The size is @size: in the device's parameters, then in every ring
 * header (release: a server that loads it sees the capacity changed, and
 * on a shrink no request beyond it), and queue 0's worker is told.
 */
static void hybd_resize_publish(struct hybd_dev *dev, u64 size)
{
	unsigned int i;

	WRITE_ONCE(dev->params.basic.dev_size, size);
	for (i = 0; i < dev->params.basic.nr_hw_queues; i++)	/* after set_capacity() */
		smp_store_release(&dev->queues[i].hdr->dev_size, size);
	hybd_resize_kick(&dev->queues[0]);
}

/* The change uevent set_capacity_and_notify() sends, from a running queue */
static void hybd_resize_uevent(struct gendisk *disk)
{
	char *envp[] = { "RESIZE=1", NULL };

	if (disk_live(disk))
		kobject_uevent_env(&disk_to_dev(disk)->kobj, KOBJ_CHANGE,
				   envp);
}

/*
 * Ask the server (through queue 0) and wait: its answer, or -errno.
 * @recoveries: the device's count of takeovers when the question was
 * posted (which server was asked).
 */
static int hybd_resize_ask(struct hybd_dev *dev, u64 size, u32 *recoveries)
{
	struct hybd_queue *q = &dev->queues[0];
	long left;
	int ret;
	u32 gen;

	spin_lock(&dev->state_lock);
	*recoveries = dev->recoveries;
	gen = ++dev->resize_gen ?: ++dev->resize_gen;	/* never 0 */
	dev->resize_asking = true;
	dev->resize_answered = false;
	spin_unlock(&dev->state_lock);

	hybd_resize_flag(q, gen, size);
	hybd_resize_kick(q);

	left = wait_event_interruptible_timeout(dev->resize_wq,
			READ_ONCE(dev->resize_answered) ||
			!hybd_resize_askable(dev),
			hybd_resize_timeout(dev));

	spin_lock(&dev->state_lock);
	dev->resize_asking = false;
	if (dev->resize_answered)
		ret = dev->resize_result;
	else if (left < 0)
		ret = -EINTR;
	else if (!hybd_resize_askable(dev))
		ret = hybd_resize_not_live(dev) ?: -ENODEV;
	else
		ret = -ETIMEDOUT;
	spin_unlock(&dev->state_lock);
	hybd_resize_flag(q, 0, 0);
	return ret;
}

/**
 * hybd_dev_resize() - change the size of a live device
 * @dev: the device; the caller holds a reference
 * @size: the new size in bytes
 * @ask: ask the server first (HYBD_CTL_RESIZE); false: the server asks
 *
 * Return: 0 or -errno (include/uapi/hybd.h, HYBD_CTL_RESIZE).
 */
int hybd_dev_resize(struct hybd_dev *dev, u64 size, bool ask)
{
	struct gendisk *disk = NULL, *front = NULL;
	unsigned int noio = 0;
	unsigned long deadline;
	u32 recoveries;
	bool shrink;
	u64 old;
	int ret;

	if (!size || size % dev->params.basic.logical_bs ||
	    size > HYBD_MAX_DEV_SIZE)
		return -EINVAL;
	if (ask && !(dev->params.basic.flags & HYBD_DEV_F_RESIZE))
		return -EOPNOTSUPP;
	if (!mutex_trylock(&dev->resize_lock))
		return -EBUSY;

	spin_lock(&dev->state_lock);
	/* the server that asks (!@ask), or see hybd_resize_ask() */
	recoveries = dev->recoveries;
	switch (dev->state) {
	case HYBD_STATE_LIVE:
		disk = dev->disk;
		front = dev->front;
		ret = disk ? 0 : -EAGAIN;
		break;
	case HYBD_STATE_ADDED:
	case HYBD_STATE_WAITING:
		ret = -EAGAIN;
		break;
	default:
		ret = -ENODEV;
		break;
	}
	/* a delete may put the disk meanwhile: keep it until we are done */
	if (!ret) {
		get_device(disk_to_dev(disk));
		if (front)
			get_device(disk_to_dev(front));
	}
	spin_unlock(&dev->state_lock);
	if (ret)
		goto out_unlock;

	old = READ_ONCE(dev->params.basic.dev_size);
	if (size == old)
		goto out_put;
	/* a user's device: a few resizes a second, each a uevent */
	if (dev->unpriv && !__ratelimit(&dev->resize_rs)) {
		ret = -EBUSY;
		goto out_put;
	}
	shrink = size < old;
	/* no program may learn of the blocks cut off until it is done */
	if (shrink) {
		ret = hybd_bpf_block(dev, true);
		if (ret)
			goto out_put;
	}
	if (ask) {
		ret = hybd_resize_ask(dev, size, &recoveries);
		if (ret)
			goto out_unblock;
	}
	/* the drain's three waits share one deadline */
	deadline = jiffies + hybd_resize_timeout(dev);
	/*
	 * Nothing done while a queue is frozen may recurse into I/O through
	 * reclaim (lockdep ties fs_reclaim to the freeze); a freeze started
	 * by hand (hybd_resize_freeze()) does not make that so, as
	 * blk_mq_freeze_queue() does.
	 */
	if (shrink)
		noio = memalloc_noio_save();
	if (shrink && front) {
		/*
		 * No bio in the front, and none of the remaps it started
		 * (the program is off: it maps no more), before the disk
		 * behind it drains.
		 */
		ret = hybd_resize_freeze(front->queue, deadline);
		if (!ret) {
			ret = hybd_resize_srcu_wait(&dev->remap_srcu,
						    deadline);
			if (ret)
				hybd_unfreeze_queue(front->queue);
		}
		if (ret) {
			memalloc_noio_restore(noio);
			goto out_unblock;
		}
	}
	if (shrink) {
		ret = hybd_resize_freeze(disk->queue, deadline);
		if (ret) {
			if (front)
				hybd_unfreeze_queue(front->queue);
			memalloc_noio_restore(noio);
			goto out_unblock;
		}
	}
	/*
	 * The server may have gone meanwhile (the device is waiting, or a
	 * successor took it over already: LIVE again, but not by the server
	 * that consented): its successor was not asked.
	 */
	spin_lock(&dev->state_lock);
	ret = hybd_resize_not_live(dev);
	if (!ret && dev->recoveries != recoveries)
		ret = -EAGAIN;
	if (!ret) {	/* nothing in flight beyond the new end, when a shrink */
		/* behind first: what the front takes, it can take */
		set_capacity(disk, size >> SECTOR_SHIFT);
		if (front)
			set_capacity(front, size >> SECTOR_SHIFT);
	}
	spin_unlock(&dev->state_lock);
	if (shrink) {
		hybd_unfreeze_queue(disk->queue);
		if (front)
			hybd_unfreeze_queue(front->queue);
		memalloc_noio_restore(noio);
	}
	if (ret)
		goto out_unblock;
	hybd_resize_publish(dev, size);
	hybd_resize_uevent(front ?: disk);
	pr_info_ratelimited("hybd%u: resized from %llu to %llu bytes\n",
			    dev->id, old, size);
out_unblock:
	if (shrink)
		hybd_bpf_block(dev, false);
out_put:
	if (front)
		put_device(disk_to_dev(front));
	put_device(disk_to_dev(disk));
out_unlock:
	mutex_unlock(&dev->resize_lock);
	return ret;
}

/* The server's answer to request @gen. */
static int hybd_resize_answer(struct hybd_dev *dev, u32 gen, s32 result)
{
	int ret = 0;

	if (result > 0 || result < -MAX_ERRNO)
		return -EINVAL;
	spin_lock(&dev->state_lock);
	if (!dev->resize_asking || dev->resize_answered ||
	    gen != dev->resize_gen) {
		ret = -ESTALE;
	} else {
		dev->resize_result = result;
		WRITE_ONCE(dev->resize_answered, true);
	}
	spin_unlock(&dev->state_lock);
	if (!ret)
		wake_up_all(&dev->resize_wq);
	return ret;
}

/* HYBD_SRV_RESIZE */
long hybd_srv_resize(struct hybd_dev *dev, void __user *arg)
{
	struct hybd_srv_resize r;
	int ret;

	ret = hybd_copy_in(&r, sizeof(r), sizeof(r), arg);
	if (ret)
		return ret;
	if (r.flags & ~HYBD_SRV_RESIZE_F_ALL)
		return -EOPNOTSUPP;
	if (r.reserved[0] || r.reserved[1])
		return -EINVAL;
	if (r.flags & HYBD_SRV_RESIZE_F_ANSWER)
		return hybd_resize_answer(dev, r.gen, r.result);
	if (r.gen || r.result)
		return -EINVAL;
	return hybd_dev_resize(dev, r.size, false);
}

/* HYBD_CTL_RESIZE */
long hybd_ctl_resize(void __user *arg)
{
	struct hybd_ctl_resize r;
	struct hybd_dev *dev;
	int ret;

	ret = hybd_copy_in(&r, sizeof(r), sizeof(r), arg);
	if (ret)
		return ret;
	if (r.flags)
		return -EOPNOTSUPP;
	if (r.reserved0 || r.reserved[0] || r.reserved[1])
		return -EINVAL;
	dev = hybd_dev_get(r.dev_id);
	if (!dev)
		return -ENODEV;
	ret = -EPERM;
	if (hybd_owner_may_manage(dev))
		ret = hybd_dev_resize(dev, r.size, true);
	hybd_dev_put(dev);
	return ret;
}

/* The device left LIVE (dead, waiting, deleting): a resize stops asking. */
void hybd_resize_wake(struct hybd_dev *dev)
{
	wake_up_all(&dev->resize_wq);
}
