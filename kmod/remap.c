// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - remaps: requests a fast path served on a backing target.
 *
 * A remapped request on a file is direct I/O on the request's own pages,
 * started from a worker (a file system may take its time in the call), as
 * the loop driver does.  One on a block device is started by queue_rq
 * itself, as clones of the request's bios (hybd_remap_issue()); what a
 * worker does for it is only a fallback, as direct I/O on the device.
 *
 * Each queue's reads and writes are started in batches by a work of the
 * queue's (on the submitter's CPU for a request alone, else beside the
 * submitters or unbound: hybd_remap_queue(), hybd_remap_kick()), without
 * waiting where the target can tell (IOCB_NOWAIT);
 * what would wait is started again from a work of the tag's own, as are
 * flushes, discards and write-zeroes, so that it holds no batch behind it.
 * Every remap also holds dev->remap_srcu from its submit() to its end,
 * which is what HYBD_SRV_REMAP_BARRIER waits for.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blkdev.h>
#include <linux/bvec.h>
#include <linux/falloc.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/pagemap.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/sched/isolation.h>
#include <linux/sched/mm.h>
#include <linux/sched/stat.h>
#include <linux/slab.h>
#include <linux/uio.h>

#include "hybd.h"

/**
 * hybd_remap_barrier() - HYBD_SRV_REMAP_BARRIER
 * @dev: the device
 *
 * A remap holds remap_srcu from hybd_bpf_io_remap() to its end, and its
 * submit() ran under RCU before that: once both grace periods are over,
 * every submit() that began before the call is over, and so is any remap
 * it made.  Targets taken off before the call are then synced (if remapped
 * writes went to them) and let go of: their files are the server's again.
 *
 * Return: 0, or the error of such a sync.
 */
long hybd_remap_barrier(struct hybd_dev *dev)
{
	int ret;

	synchronize_rcu();
	synchronize_srcu(&dev->remap_srcu);
	/* and the targets taken off before are synced and let go of */
	mutex_lock(&dev->retired_lock);
	ret = hybd_backing_reap(dev, true);
	mutex_unlock(&dev->retired_lock);
	return ret;
}

/*
 * Whether direct I/O on @b can take the pages of @bio and the bios
 * chained after it (a request's) as they are: every segment's address and
 * length aligned as the target needs.  (The queue guarantees sectors; a
 * target with 4 KiB blocks needs more.)
 */
static bool hybd_remap_mem_ok(struct bio *bio, struct hybd_backing *b)
{
	u32 mem_mask = b->mem_align - 1, len_mask = b->dio_align - 1;
	struct bvec_iter it;
	struct bio_vec bv;

	if (mem_mask < SECTOR_SIZE && len_mask < SECTOR_SIZE)
		return true;
	for (; bio; bio = bio->bi_next)
		bio_for_each_bvec(bv, bio, it)
			if ((bv.bv_offset & mem_mask) ||
			    (bv.bv_len & len_mask))
				return false;
	return true;
}

/*
 * The checks of a remap of @io, on @bio and those chained after it, to
 * target @index at @offset: 0 with the target referenced (and counted
 * as a writer for what writes) in *@bp, else an errno (see
 * hybd_remap_prepare()).
 */
static int hybd_remap_take(struct hybd_dev *dev, const struct hybd_bpf_io *io,
			   struct bio *bio, u32 index, u64 offset,
			   struct hybd_backing **bp)
{
	struct hybd_backing *b;
	u64 size;
	int ret = -EINVAL;

	if (index >= HYBD_MAX_BACKINGS)
		return -EINVAL;
	b = rcu_dereference(dev->backing[index]);
	/* a delete took it off meanwhile and let go of the last reference */
	if (!b || !kref_get_unless_zero(&b->ref))
		return -ENOENT;
	if (io->op != HYBD_OP_FLUSH) {
		/* io->bytes is whole device blocks, which @b can take */
		if (!IS_ALIGNED(offset, b->dio_align))
			goto out_put;
		if (hybd_remap_is_rw(io->op) && !hybd_remap_mem_ok(bio, b))
			goto out_put;
		/*
		 * A file may have grown since (a store appends); one that
		 * shrank reads as zeros past its end, up to the size it had.
		 */
		size = b->size;
		if (!b->bdev)
			size = max_t(u64, size, i_size_read(file_inode(b->file)));
		ret = -ERANGE;
		if (offset > size || io->bytes > size - offset)
			goto out_put;
		ret = -EROFS;
		if (io->op != HYBD_OP_READ &&
		    !(b->flags & HYBD_BACKING_F_WRITE))
			goto out_put;
	}
	if (hybd_remap_writes(io->op))
		atomic_inc(&b->writers);
	*bp = b;
	return 0;
out_put:
	hybd_backing_put(b);
	return ret;
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
 * index out of range, or an offset or request memory the target's direct
 * I/O cannot take, -ENOENT if no target is there, -ERANGE if the range
 * does not fit in the target (its size at registration, or a file's
 * current size if larger), -EROFS for a write, discard or write-zeroes on
 * a target registered without HYBD_BACKING_F_WRITE.
 */
int hybd_remap_prepare(struct hybd_queue *q, struct hybd_tag *t, u32 index,
		       u64 offset)
{
	int ret;

	if (!t->in_submit)
		return -EPERM;
	if (t->remap.target)
		return -EALREADY;
	ret = hybd_remap_take(q->dev, &t->bio, t->rq->bio, index, offset,
			      &t->remap.target);
	if (ret)
		return ret;
	t->remap.pos = offset;
	t->remap.srcu_idx = srcu_down_read(&q->dev->remap_srcu);
	return 0;
}

/**
 * hybd_remap_prepare_front() - hybd_remap_prepare() for a bio in the front
 * @f: the bio; map() runs for it
 * @index: the target
 * @offset: byte offset on the target
 *
 * Context: map(), under RCU.
 * Return: as hybd_remap_prepare(); -EPERM outside map().
 */
int hybd_remap_prepare_front(struct hybd_front_io *f, u32 index, u64 offset)
{
	int ret;

	if (!f->in_map)
		return -EPERM;
	if (f->target)
		return -EALREADY;
	ret = hybd_remap_take(f->dev, &f->bio, f->orig, index, offset,
			      &f->target);
	if (ret)
		return ret;
	f->pos = offset;
	f->srcu_idx = srcu_down_read(&f->dev->remap_srcu);
	return 0;
}

/**
 * hybd_remap_drop() - let go of what hybd_remap_prepare() took
 * @q: the request's queue
 * @t: its tag
 *
 * For a remap that ended, or one submit() made and then did not return
 * HYBD_BPF_REMAPPED for.
 */
void hybd_remap_drop(struct hybd_queue *q, struct hybd_tag *t)
{
	hybd_remap_unuse(q->dev, t->remap.target, t->bio.op);
	t->remap.target = NULL;
	srcu_up_read(&q->dev->remap_srcu, t->remap.srcu_idx);
}

/**
 * hybd_remap_unuse() - let go of a remap's target, which it used for @op
 * @dev: the device
 * @target: the target, referenced by hybd_remap_take()
 * @op: the remap's operation
 *
 * For a request's remap and a front's alike; remap_srcu is the caller's.
 */
void hybd_remap_unuse(struct hybd_dev *dev, struct hybd_backing *target,
		      u32 op)
{
	/*
	 * After the end counted it in @written; fully ordered: the last
	 * write to a target taken off queues the reap, or the settling sees
	 * no writer (pairs with hybd_backing_settle()).
	 */
	if (hybd_remap_writes(op) &&
	    !atomic_dec_return(&target->writers) && READ_ONCE(target->settled))
		queue_work(dev->remap_wq, &dev->reap_work);
	hybd_backing_put(target);
}

static void hybd_remap_queue(struct hybd_queue *q, struct hybd_tag *t,
			     bool last);

/* Start a read or write again from its tag's own work, where it may wait. */
static void hybd_remap_wait(struct hybd_queue *q, struct hybd_remap *r)
{
	hybd_stat_inc(q, remap_waited);
	queue_work(q->dev->remap_wq, &r->work);
}

/*
 * End a remapped request, in any context.  A device of one queue has its
 * completions that blk-mq does not send to another CPU go through the
 * block softirq, which a task (a worker) hands to ksoftirqd: two more
 * context switches a request.  A task with interrupts on ends it itself
 * instead, as blk-mq's local path does (rq_affinity is not followed
 * there: it completes on the task's CPU).
 */
static void hybd_remap_complete(struct request *rq)
{
	if (in_task() && !irqs_disabled() && rq->q->nr_hw_queues == 1)
		blk_mq_complete_request_direct(rq, rq->q->mq_ops->complete);
	else
		blk_mq_complete_request(rq);
}

/*
 * One direct I/O call is over (r->ret is set): if it was asked not to
 * wait and could not do without, start it again where it may; go on from
 * where it stopped if it made progress short of the end (a file system
 * may do less than asked); else end the request (hybd_remap_complete():
 * blk-mq's completion, or at once), where hybd_remap_end() runs.  A read
 * that gets nothing more has hit the file's end: the rest reads as zeros
 * there, as with the loop driver.
 */
static void hybd_remap_put(struct hybd_remap *r)
{
	struct hybd_tag *t = container_of(r, struct hybd_tag, remap);
	struct hybd_queue *q = t->rq->mq_hctx->driver_data;

	/* the submitter's, or the I/O's, whichever is last */
	if (!atomic_dec_and_test(&r->ref))
		return;
	if (t->bio.op == HYBD_OP_WRITE && !r->target->bdev)
		kiocb_end_write(&r->iocb);
	/*
	 * It would have waited (at once, or later, as a block device's
	 * BLK_STS_AGAIN), or cannot do without waiting at all (ext4 falling
	 * back to buffered I/O, a block device that lost REQ_NOWAIT): what it
	 * may have done is done again, the same bytes at the same place.
	 */
	if (r->nowait && (r->ret == -EAGAIN || r->ret == -EOPNOTSUPP)) {
		hybd_remap_wait(q, r);
		return;
	}
	if (r->ret > 0 && r->done + r->ret < t->bio.bytes) {
		u32 done = r->done + r->ret;

		/*
		 * Direct I/O goes on from aligned offsets only.  A read that
		 * stopped elsewhere stopped at the file's end; a write goes
		 * on from its last whole block, if that is progress.
		 */
		if (t->bio.op == HYBD_OP_WRITE)
			done = round_down(done, r->target->dio_align);
		if (done > r->done && IS_ALIGNED(done, r->target->dio_align)) {
			r->done = done;
			hybd_remap_queue(q, t, true);
			return;
		}
	}
	if (r->ret > 0)
		r->done += r->ret;
	if (r->ret >= 0)
		r->ret = r->done;
	kfree(r->bvec);
	r->bvec = NULL;
	/*
	 * A read that ended short (a file's end off a dio_align boundary) is
	 * zero-filled to its end, up to max_io_bytes, by hybd_remap_end() in
	 * the completion's context: not in the target's hard interrupt, nor
	 * with interrupts off.
	 */
	if (r->ret >= 0 && r->done < t->bio.bytes &&
	    (in_hardirq() || irqs_disabled())) {
		r->finish = true;
		queue_work(q->dev->remap_wq, &r->work);
		return;
	}
	hybd_remap_complete(t->rq);
}

static void hybd_remap_rw_done(struct kiocb *iocb, long ret)
{
	struct hybd_remap *r = container_of(iocb, struct hybd_remap, iocb);

	r->ret = ret;
	hybd_remap_put(r);
}

/**
 * hybd_dev_write_cached() - whether flushes make @dev's writes durable
 * @dev: the device, started
 *
 * Its parameters say it has a volatile write cache, and neither its disk
 * nor its front was set to "write through" in sysfs since: the block
 * layer then drops flushes and FUA before they reach the device, so a
 * remapped write must be durable when it completes.
 */
bool hybd_dev_write_cached(struct hybd_dev *dev)
{
	struct gendisk *front = READ_ONCE(dev->front);

	return (dev->params.basic.flags & HYBD_DEV_F_WRITE_CACHE) &&
	       blk_queue_write_cache(dev->disk->queue) &&
	       (!front || blk_queue_write_cache(front->queue));
}

static bool hybd_remap_cached(struct hybd_tag *t)
{
	struct hybd_queue *q = t->rq->mq_hctx->driver_data;

	return hybd_dev_write_cached(q->dev);
}

/*
 * Whether @t's I/O on @file can be asked not to wait: the file honours
 * IOCB_NOWAIT and, on a block device, the bio needs no split (a REQ_NOWAIT
 * bio that would be split fails with BLK_STS_AGAIN): within the size the
 * target takes (a split rounds down to a physical block), no gap its
 * virtual boundary refuses, no more segments than it takes.  The target's
 * limits are read as they are: one changing meanwhile costs a retry.
 */
static bool hybd_remap_can_nowait(struct hybd_tag *t, struct file *file)
{
	u32 bytes = t->bio.bytes - t->remap.done;
	unsigned int segs = 0, pages, off;
	struct request_queue *tq;
	struct req_iterator it;
	unsigned long vmask;
	struct bio_vec bv;
	u32 prev_end = 0;

	if (!(file->f_mode & FMODE_NOWAIT))
		return false;
	if (!t->remap.target->bdev)
		return true;
	tq = bdev_get_queue(file_bdev(file));
	if (bytes + queue_physical_block_size(tq) - SECTOR_SIZE >
	    queue_max_bytes(tq) || tq->limits.chunk_sectors)
		return false;
	vmask = queue_virt_boundary(tq);
	rq_for_each_bvec(bv, t->rq, it) {
		if (vmask && segs && ((prev_end & vmask) ||
				      (bv.bv_offset & vmask)))
			return false;
		prev_end = bv.bv_offset + bv.bv_len;
		/*
		 * A segment holds at least a page and its boundaries are
		 * page-aligned or wider: within a page, one; else at most
		 * two a page.
		 */
		off = offset_in_page(bv.bv_offset);
		pages = DIV_ROUND_UP(off + bv.bv_len, PAGE_SIZE);
		segs += pages == 1 ? 1 : 2 * pages;
	}
	return segs <= queue_max_segments(tq);
}

/*
 * A read or write: direct I/O on the request's bio_vecs, from byte
 * r->done on, asynchronous where the target can do it.  If @nowait and
 * the target can tell, it is asked not to wait (IOCB_NOWAIT, no
 * allocation that waits, no wait for a frozen file system), and what
 * would wait goes to the tag's own work.  The bio_vecs of a request made
 * of several bios are gathered into one array first.
 */
static void hybd_remap_rw(struct hybd_tag *t, bool nowait)
{
	struct hybd_remap *r = &t->remap;
	struct request *rq = t->rq;
	struct hybd_queue *q = rq->mq_hctx->driver_data;
	struct file *file = r->target->file;
	bool write = t->bio.op == HYBD_OP_WRITE;
	struct req_iterator it;
	const struct bio_vec *bvec;
	struct bio_vec bv, *vecs;
	struct iov_iter iter;
	unsigned int nr = 0;
	size_t skip = 0;
	ssize_t ret;

	rq_for_each_bvec(bv, rq, it)
		nr++;
	r->nowait = nowait && hybd_remap_can_nowait(t, file);
	if (rq->bio != rq->biotail) {
		if (!r->bvec) {
			vecs = kmalloc_array(nr, sizeof(*vecs), nowait ?
					     GFP_NOWAIT | __GFP_NOWARN :
					     GFP_NOIO);
			if (!vecs && nowait) {
				hybd_remap_wait(q, r);
				return;
			}
			if (!vecs) {
				r->ret = -ENOMEM;
				hybd_remap_complete(rq);
				return;
			}
			r->bvec = vecs;
			rq_for_each_bvec(bv, rq, it)
				*vecs++ = bv;
		}
		bvec = r->bvec;
	} else {
		/* a split bio may start inside its first bio_vec */
		bvec = __bvec_iter_bvec(rq->bio->bi_io_vec, rq->bio->bi_iter);
		skip = hybd_bvec_iter_offset(&rq->bio->bi_iter);
	}
	iov_iter_bvec(&iter, write ? ITER_SOURCE : ITER_DEST, bvec, nr,
		      blk_rq_bytes(rq));
	iter.iov_offset = skip;
	iov_iter_advance(&iter, r->done);

	memset(&r->iocb, 0, sizeof(r->iocb));
	r->iocb.ki_filp = file;
	r->iocb.ki_pos = r->pos + r->done;
	/* IOCB_WRITE: a stacked file (overlayfs) ends its freeze protection */
	r->iocb.ki_flags = IOCB_DIRECT | (write ? IOCB_WRITE : 0);
	/* without a write cache, what a write completed must stay */
	if (write && ((rq->cmd_flags & REQ_FUA) || !hybd_remap_cached(t)))
		r->iocb.ki_flags |= IOCB_DSYNC;
	if (r->nowait)
		r->iocb.ki_flags |= IOCB_NOWAIT;
	r->iocb.ki_ioprio = req_get_ioprio(rq);
	r->iocb.ki_complete = hybd_remap_rw_done;
	if (write && !r->target->bdev) {
		struct super_block *sb = file_inode(file)->i_sb;

		/*
		 * Freeze protection is a regular file's, as aio takes it
		 * (kiocb_start_write()); the batch never waits for a frozen
		 * file system, the tag's own work does.
		 */
		if (nowait && !sb_start_write_trylock(sb)) {
			hybd_remap_wait(q, r);
			return;
		}
		if (!nowait)
			sb_start_write(sb);
		/* held until kiocb_end_write(), maybe in another context */
		__sb_writers_release(sb, SB_FREEZE_WRITE);
	}
	/* the bio_vec array must outlive the call even if the I/O is done */
	atomic_set(&r->ref, 2);
	if (write)
		ret = file->f_op->write_iter(&r->iocb, &iter);
	else
		ret = file->f_op->read_iter(&r->iocb, &iter);
	hybd_remap_put(r);
	if (ret != -EIOCBQUEUED)
		hybd_remap_rw_done(&r->iocb, ret);
}

/*
 * A flush: fdatasync the named target (if any: a flush the program did
 * not remap names none), every other target remapped writes completed on
 * since it was last synced, and the retired ones that may still hold such
 * writes (letting go of those done with).
 */
static int hybd_remap_flush(struct hybd_dev *dev, struct hybd_backing *named)
{
	struct hybd_backing *sync[HYBD_MAX_BACKINGS], *b;
	unsigned int i, n = 0;
	int ret;

	rcu_read_lock();
	for (i = 0; i < HYBD_MAX_BACKINGS; i++) {
		b = rcu_dereference(dev->backing[i]);
		if (b && b != named && hybd_backing_dirty(b) &&
		    kref_get_unless_zero(&b->ref))
			sync[n++] = b;
	}
	rcu_read_unlock();

	ret = named ? hybd_backing_sync(named, true) : 0;
	for (i = 0; i < n; i++) {
		ret = ret ?: hybd_backing_sync(sync[i], false);
		hybd_backing_put(sync[i]);
	}
	mutex_lock(&dev->retired_lock);
	ret = ret ?: hybd_backing_reap(dev, true);
	mutex_unlock(&dev->retired_lock);
	return ret;
}

/**
 * hybd_bdev_writable() - whether a clone may write to @bdev
 * @bdev: a block-device target
 *
 * What its own write paths check and a bio does not: not read-only (a
 * bio there is only warned of), not an active swap device.
 */
bool hybd_bdev_writable(struct block_device *bdev)
{
	return !bdev_read_only(bdev) && !IS_SWAPFILE(bdev->bd_mapping->host);
}

/*
 * A discard on block-device target @file, as its own BLKDISCARD does it:
 * refused where it may not write, and what its page cache holds of the
 * range goes first (a program read the disk there), the cache locked
 * until the discard is done so that no read brings it back meanwhile.
 * Dropped outright only if the target was opened exclusively: else a
 * file system may be mounted on it, and its buffers are invalidated
 * only where nobody uses them (truncate_bdev_range()'s rule).
 */
static int hybd_remap_discard_bdev(struct file *file, loff_t pos, u32 bytes)
{
	struct block_device *bdev = file_bdev(file);
	struct address_space *mapping = bdev->bd_mapping;
	loff_t end = pos + bytes - 1;
	int ret;

	if (!bdev_max_discard_sectors(bdev))
		return 0;
	if (!hybd_bdev_writable(bdev))
		return bdev_read_only(bdev) ? -EPERM : -ETXTBSY;
	filemap_invalidate_lock(mapping);
	if (file->f_flags & O_EXCL) {
		truncate_inode_pages_range(mapping, pos, end);
		ret = 0;
	} else {
		ret = invalidate_inode_pages2_range(mapping, pos >> PAGE_SHIFT,
						    end >> PAGE_SHIFT);
	}
	if (!ret)
		ret = blkdev_issue_discard(bdev, pos >> SECTOR_SHIFT,
					   bytes >> SECTOR_SHIFT, GFP_NOIO);
	filemap_invalidate_unlock(mapping);
	return ret;
}

/*
 * A discard or write-zeroes, as the loop driver does them on a file: a
 * hole, or zeroed blocks where a hole will not do (NOUNMAP, or a file
 * system without holes).  A discard is a hint: on a block device it is a
 * discard if the device takes them, else nothing; on a file that cannot
 * punch holes, nothing.
 */
static int hybd_remap_fallocate(struct hybd_tag *t)
{
	struct hybd_remap *r = &t->remap;
	struct hybd_backing *b = r->target;
	bool zeroes = t->bio.op == HYBD_OP_WRITE_ZEROES;
	int ret;

	if (b->bdev && !zeroes)
		return hybd_remap_discard_bdev(b->file, r->pos, t->bio.bytes);
	ret = -EOPNOTSUPP;
	if (!b->bdev && !(zeroes && (t->bio.flags & HYBD_IO_F_NOUNMAP))) {
		ret = vfs_fallocate(b->file,
				    FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE,
				    r->pos, t->bio.bytes);
		if (ret == -EOPNOTSUPP && !zeroes)
			return 0;
	}
	if (ret == -EOPNOTSUPP)
		ret = vfs_fallocate(b->file,
				    FALLOC_FL_KEEP_SIZE | FALLOC_FL_ZERO_RANGE,
				    r->pos, t->bio.bytes);
	/* without a write cache, what completed must stay */
	if (!ret && !hybd_remap_cached(t))
		ret = vfs_fsync_range(b->file, r->pos,
				      r->pos + t->bio.bytes - 1, 1);
	return ret;
}

/*
 * Where the remap workers run: as the loop driver's, they may be the
 * writeback that reclaim, or a dirty-page throttle, waits for.  The
 * target's file system must not recurse into I/O for its allocations,
 * and a write that falls back to the page cache is throttled against its
 * own dirty pages only, not against those the device is there to write.
 */
static unsigned int hybd_remap_worker_enter(void)
{
	return memalloc_flags_save(PF_MEMALLOC_NOIO | PF_LOCAL_THROTTLE);
}

static void hybd_remap_worker_exit(unsigned int pflags)
{
	memalloc_flags_restore(pflags);
}

/*
 * A tag's own work: what may wait, and must not hold its queue's batch
 * behind it.  A flush (fsync), a discard or write-zeroes (fallocate), or
 * a read or write the target could not start without waiting (a file
 * system's locks or block allocation, a block device out of tags); or
 * only the completion of a short read that ended in a hard interrupt.
 */
static void hybd_remap_work(struct work_struct *work)
{
	struct hybd_remap *r = container_of(work, struct hybd_remap, work);
	struct hybd_tag *t = container_of(r, struct hybd_tag, remap);
	struct hybd_queue *q = t->rq->mq_hctx->driver_data;
	unsigned int pflags;

	if (r->finish) {
		r->finish = false;
		hybd_remap_complete(t->rq);
		return;
	}
	pflags = hybd_remap_worker_enter();
	if (r->sync_first) {
		r->sync_first = false;
		hybd_flush_synced(q, t, hybd_remap_flush(q->dev, NULL));
		hybd_remap_worker_exit(pflags);
		return;
	}
	switch (t->bio.op) {
	case HYBD_OP_READ:
	case HYBD_OP_WRITE:
		hybd_remap_rw(t, false);
		break;
	case HYBD_OP_FLUSH:
		r->ret = hybd_remap_flush(q->dev, r->target);
		hybd_remap_complete(t->rq);
		break;
	default:
		r->ret = hybd_remap_fallocate(t);
		hybd_remap_complete(t->rq);
		break;
	}
	hybd_remap_worker_exit(pflags);
}

/* At most this many other queues are looked at for a place beside. */
#define HYBD_REMAP_BESIDE_SCAN	8

/* A CPU of @o's that a bound worker may use: online, not isolated. */
static unsigned int hybd_remap_cpu_of(struct hybd_queue *o, unsigned int hint)
{
	const struct cpumask *mask = o->hctx->cpumask;
	unsigned int cpu;

	/* blk-mq has left the isolated CPUs out of the mask */
	if (hint < nr_cpu_ids && cpumask_test_cpu(hint, mask) &&
	    cpu_online(hint) && housekeeping_test_cpu(hint, HK_TYPE_WQ))
		return hint;
	for_each_cpu_and(cpu, mask, cpu_online_mask)
		if (housekeeping_test_cpu(cpu, HK_TYPE_WQ))
			return cpu;
	return nr_cpu_ids;
}

/*
 * A CPU beside @q's submitters for its batch: one of another of the
 * device's queues, a queue with no remap in flight (none of the device's
 * submitters keeps it busy), so that the worker does not take turns with
 * them.  The queue chosen last while it stays idle (the worker keeps its
 * cache), else the next one after it.  That a queue has no remap in
 * flight says nothing of the other tasks on its CPUs: the worker then
 * shares one as an unbound worker would.
 * Return: nr_cpu_ids if there is none (a single queue, every queue busy).
 */
static unsigned int hybd_remap_beside(struct hybd_queue *q)
{
	struct hybd_dev *dev = q->dev;
	unsigned int nr = dev->params.basic.nr_hw_queues;
	unsigned int qi = READ_ONCE(q->beside_queue), n, cpu;
	struct hybd_queue *o;

	for (n = 0; n < min(nr, HYBD_REMAP_BESIDE_SCAN + 1);
	     n++, qi = qi + 1 < nr ? qi + 1 : 0) {
		o = &dev->queues[qi];
		if (o == q || atomic_read(&o->remaps))
			continue;
		cpu = hybd_remap_cpu_of(o, READ_ONCE(q->beside_cpu));
		if (cpu >= nr_cpu_ids)
			continue;
		if (qi != READ_ONCE(q->beside_queue))
			WRITE_ONCE(q->beside_queue, qi);
		if (cpu != READ_ONCE(q->beside_cpu))
			WRITE_ONCE(q->beside_cpu, cpu);
		return cpu;
	}
	return nr_cpu_ids;
}

/*
 * Queue @q's batch work: beside its submitters if a queue there is idle,
 * else unbound.  (A CPU that goes offline meanwhile only moves the work:
 * queue_work_on() then runs it on another.)
 */
static void hybd_remap_kick(struct hybd_queue *q)
{
	unsigned int cpu = hybd_remap_beside(q);

	if (cpu < nr_cpu_ids)
		queue_work_on(cpu, q->dev->remap_beside_wq,
			      &q->remap_beside_work);
	else
		queue_work(q->dev->remap_batch_wq, &q->remap_work);
}

/*
 * Whether a batch worker running takes what a submitter has just added to
 * @q's list before it ends (hybd_remap_batch()), so that nothing need be
 * queued.  Pairs with the batch's fully ordered atomic_dec_return()
 * before its last look at the list: the add's cmpxchg in
 * llist_add_batch(), which succeeded, is fully ordered before this read.
 */
static bool hybd_remap_batch_takes(struct hybd_queue *q)
{
	return atomic_read(&q->remap_batching);
}

/*
 * Hand @first and those after it, oldest first, to the batch worker.
 * Reversed, they go on the list (a stack) in one push, newest on top, as
 * if pushed one by one in their order: the worker's llist_reverse_order()
 * restores it, behind any pushed meanwhile.  @first ends up the last.
 */
static void hybd_remap_requeue(struct hybd_queue *q, struct llist_node *first)
{
	struct llist_node *top = llist_reverse_order(first);

	if (llist_add_batch(top, first, &q->remap_list) &&
	    !hybd_remap_batch_takes(q))
		hybd_remap_kick(q);
}

/* Start the requests of @list, oldest first; return how many. */
static unsigned int hybd_remap_start_list(struct llist_node *list)
{
	struct hybd_remap *r, *next;
	unsigned int n = 0;

	/*
	 * A tag may be remapped again, or go on from a short I/O, as soon as
	 * it is started: the next node is read before it starts.
	 */
	llist_for_each_entry_safe(r, next, list, node) {
		hybd_remap_rw(container_of(r, struct hybd_tag, remap), true);
		n++;
		cond_resched();
	}
	return n;
}

/*
 * A batch worker that started requests ran out of them: on a device that
 * asked for it (HYBD_DEV_F_REMAP_POLL), poll for more for up to poll_ns,
 * as a server's worker does (hybd_queue_wait()), so that a submitter on
 * another CPU finds it awake.  Only while nothing else wants the CPU:
 * single_task_running() is a hint, as for KVM's halt polling (a kworker
 * may move meanwhile), and a task woken here ends the poll.
 * It stops at the end of its run's time (@until).
 * Return: whether requests came.
 */
static bool hybd_remap_poll(struct hybd_queue *q, unsigned long until)
{
	const struct hybd_param_basic *b = &q->dev->params.basic;
	u64 end;

	if (!(b->flags & HYBD_DEV_F_REMAP_POLL) || !b->poll_ns)
		return false;
	end = ktime_get_ns() + b->poll_ns;
	do {
		cpu_relax();
		if (!llist_empty(&q->remap_list)) {
			hybd_stat_inc(q, remap_polled);
			return true;
		}
	} while (ktime_get_ns() < end && time_before(jiffies, until) &&
		 !need_resched() && single_task_running());
	return false;
}

/*
 * A queue's reads and writes: start the batches that wait, in the order
 * they came.  Targets that can say they would wait (FMODE_NOWAIT: most
 * file systems, block devices) are asked not to, and what would wait goes
 * to its tag's own work.  Others are called as they are, as the loop
 * driver calls its file: whatever one does in the call (tmpfs: the copy)
 * keeps the rest of the batch waiting meanwhile.
 *
 * Requests that come in while a batch runs join the list and wait for it
 * (@remap_batching): the worker takes them when it is done, and so on
 * until the list stays empty, without a work queued or a worker woken
 * for each.  A worker faster than its submitters would otherwise sleep
 * after nearly every request, and each submitter would pay a cross-CPU
 * wakeup for the next one.  With HYBD_DEV_F_REMAP_POLL, a worker that
 * finds the list empty polls it for a while first (hybd_remap_poll()).
 * A run takes about a queue depth of requests, or what comes until the
 * jiffy ticks, and then queues the work again, so that other works of its
 * pool, and the rescuer of a workqueue under memory pressure, move on.
 * A call that blocks in a batch (a target that cannot say it would, one
 * that waits anyway, a block device's fallback for a bio that needs a
 * split) holds what comes meanwhile too, as it holds the rest of its
 * batch; before batches took what came, that kicked the queue's works,
 * of which only the unbound one could run beside a stuck beside work.
 *
 * A request queued @alone (the local work, on its CPU) is started alone:
 * whatever joined it before this ran goes to the batch worker, so that
 * a burst never stays on one CPU, behind a submitter that may not let
 * the worker run.
 */
static void hybd_remap_batch(struct hybd_queue *q, bool alone)
{
	unsigned int budget = q->dev->params.basic.queue_depth, n = 0, m;
	unsigned long until = jiffies + 1;
	struct llist_node *list;
	unsigned int pflags;

	hybd_stat_inc(q, remap_runs);
	pflags = hybd_remap_worker_enter();
	if (alone) {
		list = llist_reverse_order(llist_del_all(&q->remap_list));
		if (list && list->next) {
			hybd_remap_requeue(q, list->next);
			list->next = NULL;
		}
		hybd_remap_start_list(list);
		goto out;
	}
	/*
	 * Unordered: a submitter that reads it before it is seen queues the
	 * work, and one that reads it after has added before this worker's
	 * llist_del_all() (a fully ordered xchg) or its last look below.
	 */
	atomic_inc(&q->remap_batching);
	do {
		list = llist_reverse_order(llist_del_all(&q->remap_list));
		m = hybd_remap_start_list(list);
		n += m;
	} while (n < budget && time_before(jiffies, until) &&
		 (!llist_empty(&q->remap_list) ||
		  (m && hybd_remap_poll(q, until))));
	/*
	 * Every batch that ends looks at the list again, after a fully
	 * ordered atomic_dec_return(): a request queued meanwhile is seen
	 * here, or its submitter saw the count without this batch, and
	 * either queued a work itself or counted on another batch, which
	 * looks when it ends (pairs with hybd_remap_batch_takes()).  So is
	 * what waits when a run ends out of budget or time.
	 */
	(void)atomic_dec_return(&q->remap_batching);
	if (!llist_empty(&q->remap_list))
		hybd_remap_kick(q);
out:
	hybd_remap_worker_exit(pflags);
}

static void hybd_remap_batch_work(struct work_struct *work)
{
	hybd_remap_batch(container_of(work, struct hybd_queue, remap_work),
			 false);
}

static void hybd_remap_beside_work(struct work_struct *work)
{
	hybd_remap_batch(container_of(work, struct hybd_queue,
				      remap_beside_work), false);
}

static void hybd_remap_local_work(struct work_struct *work)
{
	hybd_remap_batch(container_of(work, struct hybd_queue,
				      remap_local_work), true);
}

/*
 * Queue a read or write for its queue's workers (any context): the first
 * on an empty list queues a work, which takes those that follow, unless a
 * batch runs, which takes it (hybd_remap_batch_takes()).  A
 * request alone on its queue (no other in flight, and none behind it in
 * its dispatch: @last) from a submitter that waits for it is started by
 * a worker of the CPU that queued it, which the submitter leaves idle:
 * no other CPU to wake.  A submitter that does not wait would take turns
 * with that worker on its CPU (its wakeup preempts the submitter), one
 * request a turn while the other CPUs idle: a request marked REQ_NOWAIT
 * (io_uring's, which reaps its completions later) goes to the batch
 * worker, as batches do under load, so that what the target does in the
 * call (a copy) runs beside the submitters (hybd_remap_kick()).  (An aio
 * submitter does not mark its requests: it still takes turns.)  The works
 * may run at once, on separate batches.
 */
static void hybd_remap_queue(struct hybd_queue *q, struct hybd_tag *t,
			     bool last)
{
	/* once on the list, the request may be started and over */
	bool waits = !(t->rq->cmd_flags & REQ_NOWAIT);

	if (!llist_add(&t->remap.node, &q->remap_list))
		return;
	if (hybd_remap_batch_takes(q))
		return;
	if (last && atomic_read(&q->remaps) == 1 && waits)
		queue_work(q->dev->remap_local_wq, &q->remap_local_work);
	else
		hybd_remap_kick(q);
}

/*
 * A read or write on a block device target is started by queue_rq itself,
 * in the submitter's context, as clones of the request's bios on the
 * target: no worker to wake, no copy (clones share the request's
 * bio_vecs, which hybd_remap_prepare() checked).  The tag set is
 * BLK_MQ_F_BLOCKING for this: submit_bio_noacct() may sleep.
 *
 * Only where submitting cannot reach back into what called queue_rq:
 *  - inside a submit_bio() (a submitter's direct issue), with nothing
 *    waiting on current->bio_list: the block layer holds the clones
 *    there and submits them once that returns, as dm-linear's go.  (A
 *    split's remainder waiting there may wait for our tag: the clones
 *    would wait behind it.)
 *  - with neither a bio_list nor a plug (blk-mq's work): they go at once.
 * In a plug's flush (io_uring submitting more than two at once, aio, a
 * file system's writeback) they would join the plug being flushed; under
 * a caller's RCU or lock (a request-based dm device above, which issues
 * into queue_rq) they must not sleep.  There, and when a clone cannot be
 * had at once, the request goes to the workers.
 */
static struct bio_set hybd_remap_bs;

static bool hybd_remap_may_clone(struct hybd_tag *t, struct block_device *bdev)
{
	struct bio_list *pending = current->bio_list;

	if (!preemptible() || rcu_preempt_depth())
		return false;
	if (pending ? !bio_list_empty(&pending[0]) ||
		      !bio_list_empty(&pending[1]) : current->plug != NULL)
		return false;
	/*
	 * Direct I/O writes back and drops what the target's page cache
	 * holds of the range (a program read the disk there); a clone would
	 * not: then the workers' direct I/O keeps that cache coherent.
	 */
	if (bdev->bd_mapping->nrpages &&
	    filemap_range_has_page(bdev->bd_mapping, t->remap.pos,
				   t->remap.pos + t->bio.bytes - 1))
		return false;
	/* a submitter that must not wait, on a target that cannot say so */
	if ((t->rq->cmd_flags & REQ_NOWAIT) && !bdev_nowait(bdev))
		return false;
	/* direct I/O refuses it (EPERM, ETXTBSY); a bio would not be */
	return t->bio.op != HYBD_OP_WRITE || hybd_bdev_writable(bdev);
}

static void hybd_remap_bio_done(struct bio *clone)
{
	struct hybd_tag *t = clone->bi_private;
	struct hybd_remap *r = &t->remap;
	int err = blk_status_to_errno(clone->bi_status);

	/* a REQ_NOWAIT clone the target could not take without waiting */
	if ((clone->bi_opf & REQ_NOWAIT) && err == -EOPNOTSUPP)
		err = -EAGAIN;
	bio_put(clone);
	if (err)
		cmpxchg(&r->ret, 0, err);	/* the first error wins */
	if (!atomic_dec_and_test(&r->ref))
		return;
	/* all of it again, where it may wait (no tag, a split) */
	if (r->ret == -EAGAIN) {
		r->ret = 0;
		hybd_remap_wait(t->rq->mq_hctx->driver_data, r);
		return;
	}
	if (!r->ret)
		r->ret = t->bio.bytes;
	hybd_remap_complete(t->rq);
}

/* Clone @t's bios onto its target and submit them; false: not started. */
static bool hybd_remap_bio(struct hybd_queue *q, struct hybd_tag *t)
{
	struct hybd_remap *r = &t->remap;
	struct request *rq = t->rq;
	struct block_device *bdev = file_bdev(r->target->file);
	bool write = t->bio.op == HYBD_OP_WRITE;
	sector_t sector = r->pos >> SECTOR_SHIFT;
	blk_opf_t opf, keep = HYBD_CLONE_KEEP;
	struct bio_list clones;
	struct bio *bio, *clone;
	unsigned int nr = 0, noio;

	if (!hybd_remap_may_clone(t, bdev))
		return false;
	/* a submitter's REQ_NOWAIT stays: BLK_STS_AGAIN goes to a worker */
	keep |= REQ_NOWAIT;
	opf = write ? REQ_OP_WRITE : REQ_OP_READ;
	/* without a write cache, what a write completed must stay */
	if (write && ((rq->cmd_flags & REQ_FUA) || !hybd_remap_cached(t)))
		opf |= REQ_FUA;
	bio_list_init(&clones);
	/*
	 * Never wait for a clone: the pool is shared, and clones held here
	 * or parked on current->bio_list would be what it waits for.
	 */
	__rq_for_each_bio(bio, rq) {
		clone = bio_alloc_clone(bdev, bio, GFP_NOWAIT | __GFP_NOWARN,
					&hybd_remap_bs);
		if (!clone)
			goto fail;
		/* REQ_ALLOC_CACHE: bio_put() gives it back to the cache */
		clone->bi_opf = opf | (bio->bi_opf & keep) |
				(clone->bi_opf & REQ_ALLOC_CACHE);
		clone->bi_iter.bi_sector = sector;
		sector += bio_sectors(bio);
		clone->bi_end_io = hybd_remap_bio_done;
		clone->bi_private = t;
		bio_list_add(&clones, clone);
		nr++;
	}
	r->ret = 0;
	atomic_set(&r->ref, nr);
	hybd_stat_inc(q, remap_direct);
	/* the target's splits allocate: not with I/O to this device */
	noio = memalloc_noio_save();
	/* the last clone may end the request: @t is not looked at after */
	while ((clone = bio_list_pop(&clones)))
		submit_bio_noacct(clone);
	memalloc_noio_restore(noio);
	return true;
fail:
	while ((clone = bio_list_pop(&clones)))
		bio_put(clone);
	return false;
}

/**
 * hybd_remap_issue() - start a read or write on a block device target
 * @q: its queue
 * @t: its tag, for which hybd_remap_start() returned true
 *
 * Context: queue_rq, outside its RCU read-side section; may sleep.
 */
void hybd_remap_issue(struct hybd_queue *q, struct hybd_tag *t)
{
	if (!hybd_remap_bio(q, t))
		hybd_remap_queue(q, t, true);
}

int hybd_remap_init(void)
{
	/*
	 * A clone of a bio that came with REQ_ALLOC_CACHE (io_uring's) comes
	 * from a per-CPU cache, as dm's clones do: no slab round trip.
	 */
	return bioset_init(&hybd_remap_bs, BIO_POOL_SIZE, 0,
			   BIOSET_PERCPU_CACHE);
}

void hybd_remap_exit(void)
{
	bioset_exit(&hybd_remap_bs);
}

void hybd_remap_init_queue(struct hybd_queue *q)
{
	unsigned int i;

	init_llist_head(&q->remap_list);
	atomic_set(&q->remaps, 0);
	atomic_set(&q->remap_batching, 0);
	INIT_WORK(&q->remap_work, hybd_remap_batch_work);
	INIT_WORK(&q->remap_local_work, hybd_remap_local_work);
	INIT_WORK(&q->remap_beside_work, hybd_remap_beside_work);
	/* queues start beside different ones */
	q->beside_queue = (q->id + 1) % q->dev->params.basic.nr_hw_queues;
	q->beside_cpu = nr_cpu_ids;
	for (i = 0; i < q->dev->params.basic.queue_depth; i++)
		INIT_WORK(&q->tags[i].remap.work, hybd_remap_work);
}

/**
 * hybd_remap_start() - serve a remapped request
 * @q: its queue
 * @t: its tag, remapped by submit()
 * @last: no other request follows it in this dispatch (bd->last)
 *
 * Context: queue_rq, in its RCU read-side section; does not sleep.
 * Return: true if queue_rq is to start it itself, after that section
 * (hybd_remap_issue(): a read or write on a block device); else it
 * starts in a worker.
 */
bool hybd_remap_start(struct hybd_queue *q, struct hybd_tag *t, bool last)
{
	t->remap.ret = 0;
	t->remap.done = 0;
	WRITE_ONCE(t->state, HYBD_TAG_REMAP);
	if (hybd_remap_is_rw(t->bio.op)) {
		atomic_inc(&q->remaps);
		if (t->remap.target->bdev)
			return true;
		hybd_remap_queue(q, t, last);
	} else {
		/*
		 * The tag's last remap has ended: its work is not pending (it
		 * may still be running, to its end; it is queued again).
		 */
		WARN_ON_ONCE(!queue_work(q->dev->remap_wq, &t->remap.work));
	}
	return false;
}

/**
 * hybd_remap_flush_needed() - whether a flush has remapped writes to sync
 * @dev: the device
 *
 * Remapped writes completed on a target since it was last synced, or a
 * target taken off that the kernel has not let go of (it may still hold
 * some): a flush must sync them, whatever the program makes of it (a
 * program may pass flushes while map() remaps writes; a remap of the
 * flush may fail because its target went).  Writes count once completed,
 * so what this misses completed after the flush was submitted: not the
 * flush's to cover.
 *
 * Context: queue_rq, in its RCU read-side section.
 */
bool hybd_remap_flush_needed(struct hybd_dev *dev)
{
	struct hybd_backing *b;
	unsigned int i;

	for (i = 0; i < HYBD_MAX_BACKINGS; i++) {
		b = rcu_dereference(dev->backing[i]);
		if (b && hybd_backing_dirty(b))
			return true;
	}
	/*
	 * A target not found above was counted before it left the table:
	 * pairs with the barrier in hybd_backing_take().
	 */
	smp_rmb();
	return atomic_read(&dev->nr_retired);
}

/**
 * hybd_remap_sync_first() - sync before a flush goes on
 * @q: its queue
 * @t: its tag: a flush the program did not remap
 * @verdict: the program's verdict, which goes on after the sync
 *
 * The tag's work syncs (hybd_remap_flush()), then hands the request back
 * to hybd_flush_synced().  As a remap, only that ends it meanwhile.
 *
 * Context: queue_rq, in its RCU read-side section; does not sleep.
 */
void hybd_remap_sync_first(struct hybd_queue *q, struct hybd_tag *t,
			   int verdict)
{
	t->remap.verdict = verdict;
	t->remap.sync_first = true;
	WRITE_ONCE(t->state, HYBD_TAG_REMAP);
	/* as hybd_remap_start(): the tag's last work has ended */
	WARN_ON_ONCE(!queue_work(q->dev->remap_wq, &t->remap.work));
}

/**
 * hybd_remap_end() - a remapped request is done: its status, complete()
 * @q: its queue
 * @rq: the request
 *
 * Context: blk-mq's completion: the caller of hybd_remap_complete() (a
 * worker, queue_rq when a clone ends at once, the target's completion,
 * which may be a hard interrupt), blk-mq's softirq, or its IPI.
 * Return: 0 or the -errno to end the request with; the caller ends it.
 */
int hybd_remap_end(struct hybd_queue *q, struct request *rq)
{
	struct hybd_tag *t = &q->tags[rq->tag];
	struct hybd_remap *r = &t->remap;
	long ret = r->ret;
	int err = 0;

	if (hybd_remap_is_rw(t->bio.op)) {
		WARN_ON_ONCE(atomic_dec_return(&q->remaps) < 0);
		if (ret < 0)
			err = ret;
		else if (ret < t->bio.bytes && t->bio.op == HYBD_OP_WRITE)
			err = -EIO;
		else if (ret < t->bio.bytes)
			/* the file ended (truncated): the rest reads as 0 */
			hybd_rq_copy(rq, ret, NULL, t->bio.bytes - ret, true);
	} else {
		err = ret;
	}
	/*
	 * A flush must sync it, even after a failed write, which may have
	 * changed some of the range.  Without a write cache it is durable
	 * already, but counted all the same: sysfs may have turned the
	 * cache on since it started, and an extra sync costs less than a
	 * lost one.
	 */
	if (hybd_remap_writes(t->bio.op))
		atomic64_inc(&r->target->written);

	t->bio.result = err;
	t->bio.path = HYBD_BPF_PATH_REMAP;
	hybd_bpf_complete(q, t);
	hybd_remap_drop(q, t);
	hybd_stat_inc(q, remapped);
	WRITE_ONCE(t->state, HYBD_TAG_IDLE);
	return err;
}
