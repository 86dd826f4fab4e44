// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - the server node, /dev/hybdN-srv, and the rings behind it.
 *
 * Everything the server can write (indices, completion entries, data) is
 * read once and checked; the kernel's own view of each request lives in
 * struct hybd_tag, which the server cannot reach.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blkdev.h>
#include <linux/eventfd.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/sched/signal.h>
#include <linux/sched/stat.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>

#include "hybd.h"

/* completions taken from the ring per hold of the queue lock */
#define HYBD_COMMIT_BATCH	32
/* at most this many rings' worth of completions per HYBD_SRV_IO call */
#define HYBD_COMMIT_ROUNDS	4

/**
 * hybd_queue_area_size() - lay out a queue's shared area
 * @p: device parameters
 * @ring_entries: ring size, a power of two
 * @sq_off: out, offset of the submission ring
 * @cq_off: out, offset of the completion ring
 * @desc_off: out, offset of the descriptors
 * @data_off: out, offset of the data buffers (page aligned)
 *
 * Return: the area's size in bytes, page aligned.
 */
size_t hybd_queue_area_size(const struct hybd_params *p, u32 ring_entries,
			    u32 *sq_off, u32 *cq_off, u32 *desc_off,
			    u32 *data_off)
{
	size_t off = ALIGN(sizeof(struct hybd_ring_hdr), SMP_CACHE_BYTES);

	*sq_off = off;
	off = ALIGN(off + ring_entries * sizeof(u32), SMP_CACHE_BYTES);
	*cq_off = off;
	off = ALIGN(off + ring_entries * sizeof(struct hybd_cqe),
		    SMP_CACHE_BYTES);
	*desc_off = off;
	off = PAGE_ALIGN(off + p->basic.queue_depth *
			 sizeof(struct hybd_io_desc));
	*data_off = off;
	return PAGE_ALIGN(off + (size_t)p->basic.queue_depth *
			  p->basic.max_io_bytes);
}

int hybd_queue_alloc(struct hybd_dev *dev, struct hybd_queue *q,
		     unsigned int id)
{
	u32 sq_off, cq_off, desc_off, data_off;
	struct hybd_ring_hdr *hdr;

	q->dev = dev;
	q->id = id;
	spin_lock_init(&q->lock);
	init_waitqueue_head(&q->wq);

	q->tags = kcalloc(dev->params.basic.queue_depth, sizeof(*q->tags),
			  GFP_KERNEL);
	if (!q->tags)
		return -ENOMEM;
	hybd_remap_init_queue(q);
	q->stats = alloc_percpu(struct hybd_queue_stats);
	if (!q->stats)
		return -ENOMEM;

	q->area_size = hybd_queue_area_size(&dev->params, dev->ring_entries,
					    &sq_off, &cq_off, &desc_off,
					    &data_off);
	/* zeroed, and mappable with remap_vmalloc_range() */
	q->area = vmalloc_user(q->area_size);
	if (!q->area)
		return -ENOMEM;

	hdr = q->area;
	hdr->ring_entries = dev->ring_entries;
	hdr->queue_depth = dev->params.basic.queue_depth;
	hdr->max_io_bytes = dev->params.basic.max_io_bytes;
	hdr->sq_off = sq_off;
	hdr->cq_off = cq_off;
	hdr->desc_off = desc_off;
	hdr->data_off = data_off;
	hdr->queue_id = id;
	hdr->dev_size = dev->params.basic.dev_size;

	q->sq = q->area + sq_off;
	q->cq = q->area + cq_off;
	q->desc = q->area + desc_off;
	q->data = q->area + data_off;
	q->hdr = hdr;
	return 0;
}

void hybd_queue_free(struct hybd_queue *q)
{
	/* dropped when the server's file was released */
	WARN_ON_ONCE(rcu_access_pointer(q->efd));
	vfree(q->area);
	q->area = NULL;
	q->hdr = NULL;
	kfree(q->tags);
	q->tags = NULL;
	free_percpu(q->stats);
	q->stats = NULL;
}

/* Signal the eventfd of a worker that waits outside HYBD_SRV_IO, if any. */
static void hybd_queue_signal(struct hybd_queue *q)
{
	struct eventfd_ctx *efd;

	rcu_read_lock();
	efd = rcu_dereference(q->efd);
	if (efd)
		eventfd_signal(efd);
	rcu_read_unlock();
}

/* The queue was kicked or died: wake its worker, wherever it waits. */
void hybd_queue_wake(struct hybd_queue *q)
{
	wake_up_all(&q->wq);
	hybd_queue_signal(q);
}

/*
 * Submissions were published (and a full barrier orders that before this
 * call): signal an armed worker, once per HYBD_SRV_IO_ARM.
 */
void hybd_queue_signal_armed(struct hybd_queue *q)
{
	if (READ_ONCE(q->efd_armed) && xchg(&q->efd_armed, false))
		hybd_queue_signal(q);
}

/* Replace @q's eventfd; the old one is returned, for after a grace period. */
static struct eventfd_ctx *hybd_queue_swap_eventfd(struct hybd_queue *q,
						   struct eventfd_ctx *efd)
{
	struct eventfd_ctx *old;

	spin_lock(&q->lock);
	old = rcu_replace_pointer(q->efd, efd, lockdep_is_held(&q->lock));
	WRITE_ONCE(q->efd_armed, false);
	spin_unlock(&q->lock);
	return old;
}

/* The server is gone: drop the eventfds of all queues of @dev. */
static void hybd_dev_drop_eventfds(struct hybd_dev *dev)
{
	struct eventfd_ctx *old[HYBD_MAX_QUEUES];
	unsigned int i, nr = dev->params.basic.nr_hw_queues;
	bool any = false;

	for (i = 0; i < nr; i++) {
		old[i] = hybd_queue_swap_eventfd(&dev->queues[i], NULL);
		any |= old[i] != NULL;
	}
	if (!any)
		return;
	synchronize_rcu();	/* no hybd_queue_signal() still uses them */
	for (i = 0; i < nr; i++) {
		if (old[i])
			eventfd_ctx_put(old[i]);
	}
}

/*
 * Finish one accepted completion, outside the queue lock: the data, then
 * the program's complete() hook, then the block layer.
 */
static void hybd_end_slow(struct hybd_queue *q, struct hybd_tag *t, int res,
			  bool bad)
{
	struct request *rq = t->rq;
	blk_status_t sts = BLK_STS_OK;

	if (bad)
		sts = BLK_STS_IOERR;
	else if (res)
		sts = hybd_errno_status(res);
	else if (req_op(rq) == REQ_OP_READ)
		hybd_rq_copy(rq, 0, q->data + (size_t)rq->tag *
			     q->dev->params.basic.max_io_bytes,
			     blk_rq_bytes(rq), true);
	t->bio.result = bad ? -EIO : res;
	hybd_bpf_complete(q, t);
	hybd_end_request(q, rq, sts);
}

/**
 * hybd_queue_commit() - accept the completions the server posted
 * @q: the queue
 *
 * Each completion must name a tag in flight with the seq it was issued
 * with and carry 0 or -errno; anything else is rejected and counted.  A
 * completion with an impossible result still ends its request, with an
 * error, so that it does not wait forever.
 *
 * Return: the number of requests completed.
 */
int hybd_queue_commit(struct hybd_queue *q)
{
	u32 mask = q->dev->ring_entries - 1;
	u32 depth = q->dev->params.basic.queue_depth;
	/* a server that keeps posting cannot keep us here for ever */
	int budget = HYBD_COMMIT_ROUNDS * q->dev->ring_entries;
	struct {
		struct hybd_tag *t;
		int res;
		bool bad;
	} batch[HYBD_COMMIT_BATCH];
	int done = 0;

	for (;;) {
		unsigned int n = 0, i;
		u32 tail, avail;

		spin_lock(&q->lock);
		if (q->dead) {
			spin_unlock(&q->lock);
			break;
		}
		/* entries before the tail: pairs with the server's release */
		tail = smp_load_acquire(&q->hdr->cq_tail);
		avail = tail - q->cq_head;
		if (avail > q->dev->ring_entries) {
			/* the server moved its tail past anything possible */
			hybd_stat_inc(q, rej_ring_index);
			q->cq_head = tail;
			avail = 0;
		}
		while (avail-- && n < HYBD_COMMIT_BATCH) {
			struct hybd_cqe *cqe = &q->cq[q->cq_head++ & mask];
			u32 tag = READ_ONCE(cqe->tag);
			s32 res = READ_ONCE(cqe->result);
			u64 seq = READ_ONCE(cqe->seq);
			struct hybd_tag *t;

			if (tag >= depth) {
				hybd_stat_inc(q, rej_bad_tag);
				continue;
			}
			t = &q->tags[tag];
			if (READ_ONCE(t->state) != HYBD_TAG_INFLIGHT) {
				hybd_stat_inc(q, rej_not_outstanding);
				continue;
			}
			if (seq != t->seq) {
				hybd_stat_inc(q, rej_stale_seq);
				continue;
			}
			t->state = HYBD_TAG_IDLE;
			batch[n].t = t;
			batch[n].res = res;
			batch[n].bad = res > 0 || res < -MAX_ERRNO;
			if (batch[n].bad)
				hybd_stat_inc(q, rej_bad_result);
			if (res)
				hybd_stat_inc(q, slow_errors);
			hybd_stat_inc(q, slow_done);
			hybd_lat_add(q, slow_lat, t->start_ns);
			n++;
		}
		/* we are done reading the cqes before it: the server may
		 * reuse their slots once it sees this (load-acquire)
		 */
		smp_store_release(&q->hdr->cq_head, q->cq_head);
		spin_unlock(&q->lock);

		for (i = 0; i < n; i++)
			hybd_end_slow(q, batch[i].t, batch[i].res,
				      batch[i].bad);
		done += n;
		budget -= HYBD_COMMIT_BATCH;
		if (n < HYBD_COMMIT_BATCH || budget <= 0)
			break;
		cond_resched();
	}
	return done;
}

static bool hybd_queue_has_work(struct hybd_queue *q)
{
	return READ_ONCE(q->sq_published) != READ_ONCE(q->sq_returned) ||
	       READ_ONCE(q->dead) || READ_ONCE(q->kicked);
}

/*
 * Busy-poll for up to poll_ns, then sleep.  The kernel only wakes a worker
 * that has said it sleeps (need_wakeup), so a polling worker costs the
 * submitter nothing.
 */
static int hybd_queue_wait(struct hybd_queue *q)
{
	u32 poll_ns = q->dev->params.basic.poll_ns;
	int ret = 0;

	if (poll_ns && !hybd_queue_has_work(q)) {
		u64 end = ktime_get_ns() + poll_ns;

		do {
			cpu_relax();
			if (hybd_queue_has_work(q))
				return 0;
			/* spinning only helps if nobody else wants this CPU:
			 * the submitter may be the task we keep from running
			 */
		} while (ktime_get_ns() < end && !need_resched() &&
			 single_task_running() && !signal_pending(current));
	}

	/*
	 * The flags word is the kernel's, changed under the queue lock only.
	 * Wakeups stop when the last waiter leaves: a server may have another
	 * thread waiting on the queue still.
	 */
	spin_lock(&q->lock);
	if (!q->waiters++) {
		WRITE_ONCE(q->need_wakeup, true);
		WRITE_ONCE(q->hdr->flags,
			   q->hdr->flags | HYBD_RING_NEED_WAKEUP);
	}
	spin_unlock(&q->lock);
	/* pairs with hybd_kick_worker(): publish, barrier, read need_wakeup */
	smp_mb();
	ret = wait_event_interruptible(q->wq, hybd_queue_has_work(q));
	spin_lock(&q->lock);
	if (!--q->waiters) {
		WRITE_ONCE(q->need_wakeup, false);
		WRITE_ONCE(q->hdr->flags,
			   q->hdr->flags & ~HYBD_RING_NEED_WAKEUP);
	}
	spin_unlock(&q->lock);
	return ret;
}

static long hybd_srv_io(struct hybd_dev *dev, struct hybd_srv_io __user *arg)
{
	struct hybd_srv_io io;
	struct hybd_queue *q;
	u32 consume;
	int done, ret;

	ret = hybd_copy_in(&io, sizeof(io), sizeof(io), arg);
	if (ret)
		return ret;
	if (io.flags & ~HYBD_SRV_IO_ALL)
		return -EOPNOTSUPP;
	if (io.reserved0)
		return -EINVAL;
	if (io.queue >= dev->params.basic.nr_hw_queues)
		return -EINVAL;
	q = &dev->queues[io.queue];
	consume = io.flags & (HYBD_SRV_IO_WAIT | HYBD_SRV_IO_ARM);
	if (consume == (HYBD_SRV_IO_WAIT | HYBD_SRV_IO_ARM))
		return -EINVAL;
	if ((io.flags & HYBD_SRV_IO_ARM) && !rcu_access_pointer(q->efd))
		return -EINVAL;
	/* a new server consumes only once HYBD_SRV_START has resumed it */
	if (consume && READ_ONCE(q->parked))
		return -EBUSY;

	done = hybd_queue_commit(q);
	if (io.flags & HYBD_SRV_IO_WAIT) {
		ret = hybd_queue_wait(q);
		if (ret) {
			/*
			 * A fatal signal is for the whole server process: its
			 * workers are going away, and whoever else holds the
			 * file will not serve the queues.  In recovery mode
			 * the file's release holds the I/O instead.
			 */
			if (fatal_signal_pending(current) &&
			    !hybd_dev_recovery_secs(dev) &&
			    hybd_dev_is_server(dev))
				hybd_dev_kill(dev);
			return -EINTR;
		}
	} else if (io.flags & HYBD_SRV_IO_ARM) {
		WRITE_ONCE(q->efd_armed, true);
		/* pairs with hybd_kick_worker(): publish, mb, read armed */
		smp_mb();
	}
	if (READ_ONCE(q->dead))
		return -ENODEV;

	/*
	 * Only the worker (WAIT or ARM) consumes: a commit from another thread must
	 * not make the worker's next wait miss submissions it never saw.
	 * Acquire: the descriptors before it (hybd_publish()).
	 */
	io.sq_tail = smp_load_acquire(&q->sq_published);
	if (consume) {
		/* a kick seen before what the kicker wrote is read (resize.c) */
		smp_store_mb(q->kicked, false);
		WRITE_ONCE(q->sq_returned, io.sq_tail);
	}
	if (put_user(io.sq_tail, &arg->sq_tail))
		return -EFAULT;
	return done;
}

static long hybd_srv_get_info(struct hybd_dev *dev, void __user *arg)
{
	struct hybd_srv_info info;
	u32 len;

	if (get_user(len, (u32 __user *)arg))
		return -EFAULT;
	if (len < offsetofend(struct hybd_srv_info, queue_map_size))
		return -EINVAL;

	memset(&info, 0, sizeof(info));
	info.len = sizeof(info);
	info.dev_id = dev->id;
	info.nr_hw_queues = dev->params.basic.nr_hw_queues;
	info.queue_depth = dev->params.basic.queue_depth;
	info.max_io_bytes = dev->params.basic.max_io_bytes;
	info.ring_entries = dev->ring_entries;
	info.queue_stride = dev->queue_stride;
	info.queue_map_size = dev->queues[0].area_size;
	info.params = dev->params;
	if (copy_to_user(arg, &info, min_t(size_t, len, sizeof(info))))
		return -EFAULT;
	return 0;
}

static long hybd_srv_kick(struct hybd_dev *dev, unsigned long queue)
{
	struct hybd_queue *q;

	if (queue >= dev->params.basic.nr_hw_queues)
		return -EINVAL;
	q = &dev->queues[queue];
	WRITE_ONCE(q->kicked, true);
	/* kicked before the waiter's condition check in wake_up_all() */
	smp_mb();
	hybd_queue_wake(q);
	return 0;
}

static long hybd_srv_set_eventfd(struct hybd_dev *dev, void __user *arg)
{
	struct eventfd_ctx *efd = NULL, *old;
	struct hybd_srv_eventfd e;
	struct hybd_queue *q;
	int ret;

	ret = hybd_copy_in(&e, sizeof(e), sizeof(e), arg);
	if (ret)
		return ret;
	if (e.reserved0)
		return -EINVAL;
	if (e.queue >= dev->params.basic.nr_hw_queues)
		return -EINVAL;
	if (e.fd != -1) {
		efd = eventfd_ctx_fdget(e.fd);
		if (IS_ERR(efd))
			return PTR_ERR(efd);
	}
	q = &dev->queues[e.queue];
	old = hybd_queue_swap_eventfd(q, efd);
	/*
	 * A worker armed on the old eventfd, or about to wait on the new
	 * one, may have missed a publish while neither was armed: wake it on
	 * both, it ARMs again.
	 */
	if (old)
		eventfd_signal(old);
	hybd_queue_signal(q);
	if (old) {
		synchronize_rcu();
		eventfd_ctx_put(old);
	}
	return 0;
}

static long hybd_srv_queue_cpus(struct hybd_dev *dev, void __user *arg)
{
	struct hybd_srv_queue_cpus __user *uqc = arg;
	u32 bytes = DIV_ROUND_UP(nr_cpu_ids, BITS_PER_BYTE);
	struct hybd_srv_queue_cpus qc;
	unsigned int cpu;
	long ret = 0;
	u8 *mask;

	ret = hybd_copy_in(&qc, sizeof(qc), sizeof(qc), uqc);
	if (ret)
		return ret;
	if (qc.reserved0)
		return -EINVAL;
	if (qc.flags)
		return -EOPNOTSUPP;
	if (qc.queue >= dev->params.basic.nr_hw_queues)
		return -EINVAL;
	if (put_user(nr_cpu_ids, &uqc->nr_cpus))
		return -EFAULT;
	if (qc.mask_bytes < bytes)
		return -ENOSPC;

	mask = kzalloc(bytes, GFP_KERNEL);
	if (!mask)
		return -ENOMEM;
	for_each_possible_cpu(cpu) {
		if (dev->cpu_queue[cpu] == qc.queue)
			mask[cpu / BITS_PER_BYTE] |= BIT(cpu % BITS_PER_BYTE);
	}
	if (copy_to_user(u64_to_user_ptr(qc.mask), mask, bytes))
		ret = -EFAULT;
	kfree(mask);
	return ret;
}

static long hybd_srv_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	struct hybd_dev *dev = file->private_data;

	switch (cmd) {
	case HYBD_SRV_IO:
		return hybd_srv_io(dev, (void __user *)arg);
	case HYBD_SRV_GET_INFO:
		return hybd_srv_get_info(dev, (void __user *)arg);
	case HYBD_SRV_START:
		return hybd_dev_start(dev);
	case HYBD_SRV_KICK:
		return hybd_srv_kick(dev, arg);
	case HYBD_SRV_SET_EVENTFD:
		return hybd_srv_set_eventfd(dev, (void __user *)arg);
	case HYBD_SRV_QUEUE_CPUS:
		return hybd_srv_queue_cpus(dev, (void __user *)arg);
	case HYBD_SRV_ADD_BACKING:
		return hybd_backing_add(dev, (void __user *)arg);
	case HYBD_SRV_DEL_BACKING:
		return hybd_backing_del(dev, arg);
	case HYBD_SRV_REMAP_BARRIER:
		return arg ? -EINVAL : hybd_remap_barrier(dev);
	case HYBD_SRV_RESIZE:
		return hybd_srv_resize(dev, (void __user *)arg);
	default:
		return -ENOTTY;
	}
}

static int hybd_srv_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct hybd_dev *dev = file->private_data;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	size_t len = vma->vm_end - vma->vm_start;
	struct hybd_queue *q;
	u64 qid;

	if (off % dev->queue_stride)
		return -EINVAL;
	qid = div64_u64(off, dev->queue_stride);
	if (qid >= dev->params.basic.nr_hw_queues)
		return -EINVAL;
	q = &dev->queues[qid];
	if (len > q->area_size)
		return -EINVAL;
	/* the area is shared with the kernel: never copy-on-write it */
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	/*
	 * A child of the server does not inherit the rings: a mapping would
	 * keep the server's file, and so a dead server, alive.
	 */
	vm_flags_set(vma, VM_DONTCOPY);
	return remap_vmalloc_range(vma, q->area, 0);
}

static int hybd_srv_open(struct inode *inode, struct file *file)
{
	struct hybd_dev *dev = hybd_dev_get(iminor(inode));
	int ret = 0;

	if (!dev)
		return -ENODEV;
	if (!hybd_owner_may_manage(dev)) {
		ret = -EPERM;
		goto out_put;
	}

	/* a new device, or one waiting for a new server to resume it */
	spin_lock(&dev->state_lock);
	if (dev->state != HYBD_STATE_ADDED && dev->state != HYBD_STATE_WAITING &&
	    dev->state != HYBD_STATE_LIVE)
		ret = -ENODEV;
	else if (dev->server_open)
		ret = -EBUSY;
	else if (dev->state == HYBD_STATE_LIVE)
		ret = -ENODEV;	/* cannot be: a live device has its server */
	if (!ret) {
		dev->server_open = true;
		put_pid(dev->server_pid);
		dev->server_pid = get_pid(task_tgid(current));
	}
	spin_unlock(&dev->state_lock);
	if (ret)
		goto out_put;

	file->private_data = dev;
	return nonseekable_open(inode, file);

out_put:
	hybd_dev_put(dev);
	return ret;
}

/*
 * The server's last reference is gone (close, exit or crash): nobody will
 * complete the outstanding requests, so they fail now, and so does all
 * later I/O; or, in recovery mode, they wait for a new server.
 */
static int hybd_srv_release(struct inode *inode, struct file *file)
{
	struct hybd_dev *dev = file->private_data;

	hybd_dev_lose_server(dev);
	hybd_dev_drop_eventfds(dev);
	hybd_backing_drop_all(dev);
	spin_lock(&dev->state_lock);
	dev->server_open = false;
	spin_unlock(&dev->state_lock);
	hybd_dev_put(dev);
	return 0;
}

const struct file_operations hybd_srv_fops = {
	.owner		= THIS_MODULE,
	.open		= hybd_srv_open,
	.release	= hybd_srv_release,
	.mmap		= hybd_srv_mmap,
	.unlocked_ioctl	= hybd_srv_ioctl,
	.compat_ioctl	= compat_ptr_ioctl,
};
