// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - backing targets and remaps.
 *
 * A server registers files and block devices with its device
 * (HYBD_SRV_ADD_BACKING); a fast path's submit() may then remap a request
 * to a byte offset on one of them (hybd_bpf_io_remap()), and the kernel
 * serves it there: direct I/O on the request's own pages, from a worker
 * (queue_rq must not sleep, the file system may), as the loop driver does.
 *
 * A target is counted: the registration holds one reference, each remap
 * in flight another, and the last put lets the file go.  Remaps find a
 * target under RCU (queue_rq), so the memory goes after a grace period.
 * Every remap also holds dev->remap_srcu from its submit() to its end,
 * which is what HYBD_SRV_REMAP_BARRIER waits for.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blkdev.h>
#include <linux/bvec.h>
#include <linux/falloc.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/rcupdate.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/uio.h>

#include "hybd.h"

struct workqueue_struct *hybd_remap_wq;

/**
 * struct hybd_backing - a backing target
 * @ref: the registration's reference, and one per remap in flight
 * @file: the kernel's own reference to the file; put with the last @ref
 * @size: bytes, at registration; remaps stay inside (or inside a file's
 *	current size, if it grew)
 * @flags: HYBD_BACKING_F_*
 * @dio_align: what direct I/O on it needs, bytes
 * @bdev: whether it is a block device (else a regular file)
 * @written: remapped writes, discards and write-zeroes completed
 * @synced: @written as it was before the last fdatasync that succeeded
 * @rcu: freed after a grace period: queue_rq looks targets up under RCU
 */
struct hybd_backing {
	struct kref	ref;
	struct file	*file;
	u64		size;
	u32		flags;
	u32		dio_align;
	bool		bdev;
	atomic64_t	written;
	atomic64_t	synced;
	struct rcu_head	rcu;
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
	struct block_device *bdev = NULL;

	if (!(file->f_mode & FMODE_READ))
		return -EBADF;
	if ((flags & HYBD_BACKING_F_WRITE) && !(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (S_ISBLK(inode->i_mode)) {
		bdev = I_BDEV(file->f_mapping->host);
		*size = bdev_nr_bytes(bdev);
	} else if (S_ISREG(inode->i_mode)) {
		bdev = sb->s_bdev;
		*size = i_size_read(inode);
	} else {
		return -EINVAL;
	}
	*align = bdev ? bdev_logical_block_size(bdev) : SECTOR_SIZE;
	if (!(file->f_mode & FMODE_CAN_ODIRECT))
		return -EOPNOTSUPP;
	if (!*size || dev->params.basic.logical_bs % *align)
		return -EINVAL;
	/*
	 * The request's pages go to the target as they are: our queue's
	 * memory alignment (the default, a sector) must do for it.
	 */
	if (bdev && bdev_dma_alignment(bdev) > SECTOR_SIZE - 1)
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
	kref_init(&t->ref);
	t->file = file;
	t->flags = b.flags;
	t->bdev = S_ISBLK(file_inode(file)->i_mode);

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

/* Take target @i off @dev; the caller puts the registration's reference. */
static struct hybd_backing *hybd_backing_take(struct hybd_dev *dev,
					      unsigned int i)
{
	struct hybd_backing *t;

	t = rcu_dereference_protected(dev->backing[i],
				      lockdep_is_held(&dev->backing_lock));
	RCU_INIT_POINTER(dev->backing[i], NULL);
	return t;
}

static void hybd_backing_release(struct kref *ref)
{
	struct hybd_backing *t = container_of(ref, struct hybd_backing, ref);

	/* fput() defers itself when called from a completion's softirq */
	fput(t->file);
	kfree_rcu(t, rcu);
}

static void hybd_backing_put(struct hybd_backing *t)
{
	kref_put(&t->ref, hybd_backing_release);
}

/**
 * hybd_backing_del() - HYBD_SRV_DEL_BACKING
 * @dev: the device
 * @index: the target's index
 *
 * No remap finds the target once this returns; those in flight keep their
 * reference until they end (HYBD_SRV_REMAP_BARRIER waits for them).
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
	for (i = 0; i < n; i++)
		hybd_backing_put(old[i]);
}

/* ---- remaps ---- */

/**
 * hybd_remap_barrier() - HYBD_SRV_REMAP_BARRIER
 * @dev: the device
 *
 * A remap holds remap_srcu from hybd_bpf_io_remap() to its end, and its
 * submit() ran under RCU before that: once both grace periods are over,
 * every submit() that began before the call is over, and so is any remap
 * it made.
 *
 * Return: 0.
 */
long hybd_remap_barrier(struct hybd_dev *dev)
{
	synchronize_rcu();
	synchronize_srcu(&dev->remap_srcu);
	return 0;
}

/**
 * hybd_remap_prepare() - check a remap and take what it needs
 * @q: the request's queue
 * @t: its tag; submit() runs for it
 * @index: the target
 * @offset: byte offset on the target
 *
 * Context: submit(), under RCU.
 * Return: 0 with the target referenced and remap_srcu held; -EPERM outside
 * submit(), -EALREADY if the request is remapped already, -EINVAL for an
 * index out of range or an offset the target's direct I/O cannot take,
 * -ENOENT if no target is there, -ERANGE if the range does not fit in the
 * target (its size at registration, or a file's current size if larger),
 * -EROFS for a write, discard or write-zeroes on a target
 * registered without HYBD_BACKING_F_WRITE.
 */
int hybd_remap_prepare(struct hybd_queue *q, struct hybd_tag *t, u32 index,
		       u64 offset)
{
	const struct hybd_bpf_io *io = &t->bio;
	struct hybd_backing *b;
	u64 size;

	if (!t->in_submit)
		return -EPERM;
	if (t->remap.target)
		return -EALREADY;
	if (index >= HYBD_MAX_BACKINGS)
		return -EINVAL;
	b = rcu_dereference(q->dev->backing[index]);
	if (!b)
		return -ENOENT;
	if (io->op != HYBD_OP_FLUSH) {
		/* io->bytes is whole device blocks, which @b can take */
		if (offset % b->dio_align)
			return -EINVAL;
		/*
		 * A file may have grown since (a store appends); one that
		 * shrank reads as zeros past its end, up to the size it had.
		 */
		size = b->size;
		if (!b->bdev)
			size = max_t(u64, size, i_size_read(file_inode(b->file)));
		if (offset > size || io->bytes > size - offset)
			return -ERANGE;
		if (io->op != HYBD_OP_READ &&
		    !(b->flags & HYBD_BACKING_F_WRITE))
			return -EROFS;
	}
	/* a delete took it off meanwhile and let go of the last reference */
	if (!kref_get_unless_zero(&b->ref))
		return -ENOENT;
	t->remap.target = b;
	t->remap.pos = offset;
	t->remap.srcu_idx = srcu_down_read(&q->dev->remap_srcu);
	return 0;
}

/* Let go of what hybd_remap_prepare() took. */
static void hybd_remap_release(struct hybd_queue *q, struct hybd_tag *t)
{
	hybd_backing_put(t->remap.target);
	t->remap.target = NULL;
	srcu_up_read(&q->dev->remap_srcu, t->remap.srcu_idx);
}

/**
 * hybd_remap_drop() - submit() remapped, then returned something else
 * @q: the request's queue
 * @t: its tag
 */
void hybd_remap_drop(struct hybd_queue *q, struct hybd_tag *t)
{
	hybd_remap_release(q, t);
}

/*
 * The I/O is over (r->ret is set): end the request in its completion
 * context, where blk-mq calls hybd_remap_end().
 */
static void hybd_remap_put(struct hybd_remap *r)
{
	struct hybd_tag *t = container_of(r, struct hybd_tag, remap);

	/* the submitter's, or the I/O's, whichever is last */
	if (!atomic_dec_and_test(&r->ref))
		return;
	kfree(r->bvec);
	r->bvec = NULL;
	if (t->bio.op == HYBD_OP_WRITE)
		kiocb_end_write(&r->iocb);
	blk_mq_complete_request(t->rq);
}

static void hybd_remap_rw_done(struct kiocb *iocb, long ret)
{
	struct hybd_remap *r = container_of(iocb, struct hybd_remap, iocb);

	r->ret = ret;
	hybd_remap_put(r);
}

/*
 * A read or write: direct I/O on the request's bio_vecs, asynchronous
 * where the target can do it.  The bio_vecs of a request made of several
 * bios are gathered into one array first.
 */
static void hybd_remap_rw(struct hybd_tag *t)
{
	struct hybd_remap *r = &t->remap;
	struct request *rq = t->rq;
	struct file *file = r->target->file;
	bool write = t->bio.op == HYBD_OP_WRITE;
	struct req_iterator it;
	struct bio_vec bv, *bvec;
	struct iov_iter iter;
	unsigned int nr = 0;
	size_t skip = 0;
	ssize_t ret;

	rq_for_each_bvec(bv, rq, it)
		nr++;
	if (rq->bio != rq->biotail) {
		bvec = kmalloc_array(nr, sizeof(*bvec), GFP_NOIO);
		if (!bvec) {
			r->ret = -ENOMEM;
			blk_mq_complete_request(rq);
			return;
		}
		r->bvec = bvec;
		rq_for_each_bvec(bv, rq, it)
			*bvec++ = bv;
		bvec = r->bvec;
	} else {
		/* a split bio may start inside its first bio_vec */
		bvec = __bvec_iter_bvec(rq->bio->bi_io_vec, rq->bio->bi_iter);
		skip = rq->bio->bi_iter.bi_bvec_done;
	}
	iov_iter_bvec(&iter, write ? ITER_SOURCE : ITER_DEST, bvec, nr,
		      blk_rq_bytes(rq));
	iter.iov_offset = skip;

	memset(&r->iocb, 0, sizeof(r->iocb));
	r->iocb.ki_filp = file;
	r->iocb.ki_pos = r->pos;
	r->iocb.ki_flags = IOCB_DIRECT;
	if (write && (rq->cmd_flags & REQ_FUA))
		r->iocb.ki_flags |= IOCB_DSYNC;
	r->iocb.ki_ioprio = req_get_ioprio(rq);
	r->iocb.ki_complete = hybd_remap_rw_done;
	/* the bio_vec array must outlive the call even if the I/O is done */
	atomic_set(&r->ref, 2);
	if (write) {
		kiocb_start_write(&r->iocb);
		ret = file->f_op->write_iter(&r->iocb, &iter);
	} else {
		ret = file->f_op->read_iter(&r->iocb, &iter);
	}
	hybd_remap_put(r);
	if (ret != -EIOCBQUEUED)
		hybd_remap_rw_done(&r->iocb, ret);
}

/*
 * A flush: fdatasync the named target, whatever wrote to it (the server
 * too), and every other target that remapped writes completed on since
 * it was last synced.  A remapped write counts once it has completed, so
 * a flush covers what completed before it and never claims what it did
 * not wait for.
 */
static int hybd_remap_flush(struct hybd_dev *dev, struct hybd_backing *named)
{
	struct hybd_backing *sync[HYBD_MAX_BACKINGS];
	unsigned int i, n = 0;
	int ret = 0;

	sync[n++] = named;
	rcu_read_lock();
	for (i = 0; i < HYBD_MAX_BACKINGS; i++) {
		struct hybd_backing *b = rcu_dereference(dev->backing[i]);

		if (b && b != named &&
		    atomic64_read(&b->written) != atomic64_read(&b->synced) &&
		    kref_get_unless_zero(&b->ref))
			sync[n++] = b;
	}
	rcu_read_unlock();

	for (i = 0; i < n; i++) {
		s64 seen = atomic64_read(&sync[i]->written);
		s64 old = atomic64_read(&sync[i]->synced);
		int err = vfs_fsync(sync[i]->file, 1);

		if (err)
			ret = ret ?: err;
		else
			while (old < seen &&
			       !atomic64_try_cmpxchg(&sync[i]->synced, &old,
						     seen))
				;
		if (i)
			hybd_backing_put(sync[i]);
	}
	return ret;
}

/*
 * A discard or write-zeroes, as the loop driver does them: a hole, or
 * zeroed blocks for a write-zeroes that must not unmap.  A discard is a
 * hint: a target that cannot drop blocks without writing them keeps them.
 */
static int hybd_remap_fallocate(struct hybd_tag *t)
{
	struct hybd_remap *r = &t->remap;
	int mode = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE;
	int ret;

	if (t->bio.op == HYBD_OP_WRITE_ZEROES &&
	    ((t->bio.flags & HYBD_IO_F_NOUNMAP) || r->target->bdev))
		mode = FALLOC_FL_KEEP_SIZE | FALLOC_FL_ZERO_RANGE;
	ret = vfs_fallocate(r->target->file, mode, r->pos, t->bio.bytes);
	if (ret == -EOPNOTSUPP && t->bio.op == HYBD_OP_DISCARD)
		ret = 0;
	return ret;
}

static void hybd_remap_work(struct work_struct *work)
{
	struct hybd_remap *r = container_of(work, struct hybd_remap, work);
	struct hybd_tag *t = container_of(r, struct hybd_tag, remap);
	struct hybd_queue *q = t->rq->mq_hctx->driver_data;
	unsigned int noio;

	/*
	 * We may be the writeback that reclaim waits for: the target's file
	 * system must not recurse into I/O for its allocations (as loop).
	 */
	noio = memalloc_noio_save();
	switch (t->bio.op) {
	case HYBD_OP_READ:
	case HYBD_OP_WRITE:
		hybd_remap_rw(t);
		break;
	case HYBD_OP_FLUSH:
		r->ret = hybd_remap_flush(q->dev, r->target);
		blk_mq_complete_request(t->rq);
		break;
	default:
		r->ret = hybd_remap_fallocate(t);
		blk_mq_complete_request(t->rq);
		break;
	}
	memalloc_noio_restore(noio);
}

void hybd_remap_init_tag(struct hybd_tag *t)
{
	INIT_WORK(&t->remap.work, hybd_remap_work);
}

/**
 * hybd_remap_start() - serve a remapped request
 * @q: its queue
 * @t: its tag, remapped by submit()
 *
 * Context: queue_rq; does not sleep (the I/O starts in a worker).
 */
void hybd_remap_start(struct hybd_queue *q, struct hybd_tag *t)
{
	t->remap.ret = 0;
	WRITE_ONCE(t->state, HYBD_TAG_REMAP);
	queue_work(hybd_remap_wq, &t->remap.work);
}

/* Zero a request's payload from byte @off to its end. */
static void hybd_rq_zero_from(struct request *rq, u32 off)
{
	struct req_iterator iter;
	struct bio_vec bv;

	rq_for_each_segment(bv, rq, iter) {
		if (off >= bv.bv_len) {
			off -= bv.bv_len;
			continue;
		}
		bv.bv_offset += off;
		bv.bv_len -= off;
		off = 0;
		memzero_bvec(&bv);
	}
}

/**
 * hybd_remap_end() - a remapped request is done: its status, complete()
 * @q: its queue
 * @rq: the request
 *
 * Context: blk-mq's completion (softirq, or the caller of
 * blk_mq_complete_request()).
 * Return: 0 or the -errno to end the request with; the caller ends it.
 */
int hybd_remap_end(struct hybd_queue *q, struct request *rq)
{
	struct hybd_tag *t = &q->tags[rq->tag];
	struct hybd_remap *r = &t->remap;
	long ret = r->ret;
	int err = 0;

	if (t->bio.op == HYBD_OP_READ || t->bio.op == HYBD_OP_WRITE) {
		if (ret < 0)
			err = ret;
		else if (ret < t->bio.bytes && t->bio.op == HYBD_OP_WRITE)
			err = -EIO;
		else if (ret < t->bio.bytes)
			/* the file ends early (truncated): the rest reads 0 */
			hybd_rq_zero_from(rq, ret);
	} else {
		err = ret;
	}
	if (!err && t->bio.op != HYBD_OP_READ && t->bio.op != HYBD_OP_FLUSH)
		atomic64_inc(&r->target->written);

	t->bio.result = err;
	t->bio.path = HYBD_BPF_PATH_REMAP;
	hybd_bpf_complete(q, t);
	hybd_remap_release(q, t);
	hybd_stat_inc(q, remapped);
	WRITE_ONCE(t->state, HYBD_TAG_IDLE);
	return err;
}
