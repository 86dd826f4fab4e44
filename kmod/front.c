// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - the bio-based front (HYBD_DEV_F_BIO_FRONT).
 *
 * /dev/hybdN is then a bio-based disk in front of the device's blk-mq
 * disk, which is hidden (hybdNq), as nvme's multipath head is in front of
 * its paths.  The front runs the program's map() on each read and write
 * bio and clones one it remaps onto its block-device target there and
 * then, as dm-linear maps a bio: no request, no tag, no second plug, no
 * second dispatch.  Everything else goes on, as it is, to the blk-mq disk,
 * where submit() and the server see it as on any device.
 *
 * A front's ->submit_bio always runs with current->bio_list set, so the
 * clone only joins that list: the block layer submits it once the call
 * returns.  So unlike queue_rq (hybd_remap_may_clone()), the front never
 * submits from inside a plug's flush or a caller's lock, and batched
 * submissions (io_uring, aio) are cloned too.
 *
 * A front remap holds dev->remap_srcu from map() to its end, as a
 * request's remap does: HYBD_SRV_REMAP_BARRIER, a shrink and a delete
 * wait for it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blkdev.h>
#include <linux/pagemap.h>
#include <trace/events/block.h>

#include "hybd.h"

static struct bio_set hybd_front_bs;
/* fronts added and not yet freed: module exit waits for their ->free_disk */
static atomic_t hybd_fronts = ATOMIC_INIT(0);

/* Go on to the blk-mq disk behind the front, as the bio is. */
static void hybd_front_pass(struct hybd_dev *dev, struct bio *bio)
{
	sector_t sector = bio->bi_iter.bi_sector;
	dev_t front = bio_dev(bio);

	bio_set_dev(bio, dev->disk->part0);
	trace_block_bio_remap(bio, front, sector);
	submit_bio_noacct(bio);
}

/*
 * Whether the kernel can take @f's remap here: a block device, whose
 * page cache holds none of the range (a clone would not keep it coherent,
 * the workers' direct I/O does; as there, a best effort against a program
 * reading the target meanwhile), that can say it would wait if the
 * submitter must not (else a REQ_NOWAIT clone fails every time), and
 * that is writable for a write (hybd_bdev_writable(): direct I/O refuses
 * a read-only or swap device, a bio would not).  A REQ_NOWAIT clone the
 * target would split ends with BLK_STS_AGAIN, which goes back to the
 * submitter, as dm's does: io_uring submits it again from its workers,
 * where it may wait.
 */
static bool hybd_front_may_clone(struct hybd_front_io *f, struct bio *bio)
{
	struct hybd_backing *b = f->target;
	struct block_device *bdev;

	if (!b->bdev)
		return false;
	bdev = file_bdev(b->file);
	if (bdev->bd_mapping->nrpages &&
	    filemap_range_has_page(bdev->bd_mapping, f->pos,
				   f->pos + f->bio.bytes - 1))
		return false;
	if ((bio->bi_opf & REQ_NOWAIT) && !bdev_nowait(bdev))
		return false;
	return bio_data_dir(bio) != WRITE || hybd_bdev_writable(bdev);
}

static void hybd_front_end(struct bio *clone)
{
	struct hybd_front_io *f = container_of(clone, struct hybd_front_io,
					       clone);
	struct hybd_dev *dev = f->dev;
	struct bio *orig = f->orig;
	blk_status_t sts = clone->bi_status;
	int idx = f->srcu_idx;
	bool nowait = clone->bi_opf & REQ_NOWAIT;
	bool waited;

	/*
	 * A REQ_NOWAIT clone a blk-mq target could not take without waiting
	 * (it would split it, or is out of tags) ends with BLK_STS_AGAIN
	 * before any of it is issued (a bio-based one may have issued a first
	 * piece); that goes back, and the submitter starts it again where it
	 * may wait (io_uring: from its workers, through the front again).
	 * NOTSUPP: the target stopped honouring REQ_NOWAIT since
	 * hybd_front_may_clone() (a dm table reload).
	 */
	if (nowait && sts == BLK_STS_NOTSUPP)
		sts = BLK_STS_AGAIN;
	/*
	 * Ended where it was submitted: the block layer's would-block ends
	 * run in the submitting task's submit_bio() (current->bio_list);
	 * a target's own AGAIN (loop, ublk end some failed I/O so, REQ_NOWAIT
	 * or not) comes from its completion, and is an error.
	 */
	waited = nowait && sts == BLK_STS_AGAIN && in_task() &&
		 current->bio_list;
	/*
	 * Counted before the bio ends, so that a flush the submitter sends
	 * once it has seen the write end syncs it (hybd_remap_flush()).  Any
	 * end counts, AGAIN too: a failed write may have changed some of the
	 * range, loop and ublk targets end a failed write with AGAIN even
	 * without REQ_NOWAIT, and a bio-based target may have issued a first
	 * piece before its AGAIN.  An extra sync costs less than a lost one.
	 */
	if (f->bio.op == HYBD_OP_WRITE)
		atomic64_inc(&f->target->written);
	f->bio.result = blk_status_to_errno(sts);
	f->bio.path = HYBD_BPF_PATH_REMAP;
	hybd_bpf_complete_front(dev, f);
	hybd_count_front(f->q, &f->bio, f->start_ns, waited);
	hybd_front_drop(dev, f);
	if (f->acct)
		bio_end_io_acct(orig, f->acct_start);
	bio_put(clone);
	orig->bi_status = sts;
	bio_endio(orig);
	/* last: the delete waits for it before it frees the device */
	srcu_up_read(&dev->remap_srcu, idx);
}

/*
 * Run map() on a read or write and, if it remapped and the kernel can
 * take it, start the clone.  Return: whether it did; else the bio is the
 * caller's to pass, untouched.
 */
static bool hybd_front_map(struct hybd_dev *dev, struct bio *bio)
{
	bool write = bio_data_dir(bio) == WRITE;
	struct hybd_front_io *f;
	struct bio *clone;
	blk_opf_t opf;
	u32 cpu;
	int ret;

	clone = bio_alloc_clone(NULL, bio, GFP_NOWAIT | __GFP_NOWARN,
				&hybd_front_bs);
	if (!clone)
		return false;
	f = container_of(clone, struct hybd_front_io, clone);
	cpu = raw_smp_processor_id();
	f->dev = dev;
	f->q = &dev->queues[dev->cpu_queue[cpu]];
	f->target = NULL;
	f->orig = bio;
	f->in_map = false;
	f->bpf_gen = 0;
	f->bio = (struct hybd_bpf_io) {
		.op	= write ? HYBD_OP_WRITE : HYBD_OP_READ,
		.flags	= hybd_bio_flags(bio->bi_opf),
		.sector	= bio->bi_iter.bi_sector,
		.bytes	= bio->bi_iter.bi_size,
		.dev_id	= dev->id,
		.queue	= f->q->id,
		.tag	= HYBD_BPF_TAG_FRONT,
	};

	/* a dead device fails everything, the fast path included */
	if (READ_ONCE(f->q->dead))
		goto pass;
	rcu_read_lock();
	ret = hybd_bpf_map(dev, f);
	rcu_read_unlock();
	if (ret != HYBD_BPF_REMAPPED)
		goto pass;
	if (!hybd_front_may_clone(f, bio)) {
		hybd_front_drop(dev, f);
		srcu_up_read(&dev->remap_srcu, f->srcu_idx);
		goto pass;
	}

	bio_set_dev(clone, file_bdev(f->target->file));
	/* the submitter's cgroup, not this task's (writeback's kworker) */
	bio_clone_blkg_association(clone, bio);
	opf = write ? REQ_OP_WRITE : REQ_OP_READ;
	/*
	 * Without a write cache (the device's, or as sysfs says now of the
	 * front or of the disk behind it: "write through" makes the block
	 * layer drop flushes), what a write completed must stay.
	 */
	if (write && ((bio->bi_opf & REQ_FUA) || !hybd_dev_write_cached(dev)))
		opf |= REQ_FUA;
	/* REQ_ALLOC_CACHE: bio_put() gives it back to the per-CPU cache */
	/* REQ_NOWAIT stays: BLK_STS_AGAIN goes back, as dm's does */
	clone->bi_opf = opf | (bio->bi_opf & (HYBD_CLONE_KEEP | REQ_NOWAIT)) |
			(clone->bi_opf & REQ_ALLOC_CACHE);
	clone->bi_iter.bi_sector = f->pos >> SECTOR_SHIFT;
	clone->bi_end_io = hybd_front_end;
	f->start_ns = ktime_get_ns();
	f->acct = blk_queue_io_stat(bio->bi_bdev->bd_disk->queue);
	if (f->acct)
		f->acct_start = bio_start_io_acct(bio);
	trace_block_bio_remap(clone, bio_dev(bio), bio->bi_iter.bi_sector);
	/* joins current->bio_list: it goes once this submit_bio returns */
	submit_bio_noacct(clone);
	return true;
pass:
	bio_put(clone);
	return false;
}

static void hybd_front_submit_bio(struct bio *bio)
{
	struct hybd_dev *dev = bio->bi_bdev->bd_disk->private_data;

	bio = bio_split_to_limits(bio);
	if (!bio)
		return;
	/*
	 * A bio is checked against the capacity before it waits at a frozen
	 * queue: one that waited out a shrink may end beyond the new end.
	 */
	if (bio_sectors(bio) &&
	    bio_end_sector(bio) > get_capacity(bio->bi_bdev->bd_disk)) {
		bio_io_error(bio);
		return;
	}
	/*
	 * Flushes (with or without data) go through the blk-mq disk's flush
	 * sequence; what is not a read or write has no map(), and a write to
	 * a device without writes is the blk-mq disk's to refuse.
	 */
	if ((bio_op(bio) == REQ_OP_READ ||
	     (bio_op(bio) == REQ_OP_WRITE &&
	      (dev->params.basic.ops & HYBD_OPF_WRITE))) &&
	    !(bio->bi_opf & REQ_PREFLUSH) && bio->bi_iter.bi_size &&
	    READ_ONCE(dev->front_maps) && hybd_front_map(dev, bio))
		return;
	hybd_front_pass(dev, bio);
}

/*
 * The last reference to the front is gone: no bio it passed can still be
 * on its way, so the disk behind it may go.  Only a deleted front is
 * freed, and its private data is that disk by then (hybd_front_deleted()).
 * Nothing to open or release: the device itself goes with its delete.
 * The module may be freed once the count is seen at zero, while this
 * returns: the window every driver's ->free_disk has, module_put() having
 * come first in bdev_release().
 */
static void hybd_front_free_disk(struct gendisk *front)
{
	put_disk(front->private_data);
	if (atomic_dec_and_test(&hybd_fronts))
		wake_up_var(&hybd_fronts);
}

static const struct block_device_operations hybd_front_fops = {
	.owner		= THIS_MODULE,
	.submit_bio	= hybd_front_submit_bio,
	.free_disk	= hybd_front_free_disk,
};

/**
 * hybd_front_is() - whether @disk is @dev's front
 * @dev: the device
 * @disk: a disk
 *
 * Return: true if it is.
 */
bool hybd_front_is(struct hybd_dev *dev, struct gendisk *disk)
{
	return disk->fops == &hybd_front_fops &&
	       READ_ONCE(disk->private_data) == dev;
}

/**
 * hybd_front_alloc() - a front for @dev
 * @dev: the device, whose blk-mq disk is allocated, not yet added
 * @lim: the blk-mq disk's limits, as hybd_set_limits() makes them
 *
 * The front honours REQ_NOWAIT (a clone keeps it; what it passes, the
 * blk-mq disk honours): without BLK_FEAT_NOWAIT io_uring would hand every
 * I/O to its workers.  It has no poll: neither has the blk-mq disk.
 *
 * Return: the disk, or an ERR_PTR.
 */
struct gendisk *hybd_front_alloc(struct hybd_dev *dev,
				 struct queue_limits *lim)
{
	struct gendisk *disk;

	lim->features |= BLK_FEAT_NOWAIT | BLK_FEAT_IO_STAT;
	disk = blk_alloc_disk(lim, NUMA_NO_NODE);
	if (IS_ERR(disk))
		return disk;
	disk->fops = &hybd_front_fops;
	disk->private_data = dev;
	return disk;
}

/**
 * hybd_front_added() - the front of @dev is added, in front of @disk
 * @dev: the device
 * @disk: the blk-mq disk behind the front, added
 *
 * A bio the front passes joins its submitter's bio_list and reaches @disk
 * only after ->submit_bio returned and the front's queue was let go of, so
 * a delete may meanwhile reach its put_disk(@disk).  Whoever owns such a
 * bio holds a reference to the front until the bio completes (an open
 * file, a partition, a stacked driver), though: the front keeps its own
 * reference to @disk until its ->free_disk, which only an added disk gets.
 */
void hybd_front_added(struct hybd_dev *dev, struct gendisk *disk)
{
	get_device(disk_to_dev(disk));
	atomic_inc(&hybd_fronts);
}

/**
 * hybd_front_deleted() - @front is deleted: it only waits to be freed
 * @front: the front, after del_gendisk() and the end of its remaps
 * @disk: the disk behind it, whose reference the front holds
 *
 * ->submit_bio cannot run any more, nor can anything else that reads the
 * front's private data as its device (its sysfs attributes went with
 * del_gendisk()): from here it is the disk behind, for ->free_disk, so
 * that a front held open long after its delete keeps that disk only, not
 * the device (its rings, threads and an owner's charge).  A comparison
 * with a device (hybd_front_is()) finds it no longer that device's.
 */
void hybd_front_deleted(struct gendisk *front, struct gendisk *disk)
{
	WRITE_ONCE(front->private_data, disk);
}

/**
 * hybd_front_drop() - let go of what a front remap took
 * @dev: the device
 * @f: the remap; remap_srcu stays held, the caller's to release
 */
void hybd_front_drop(struct hybd_dev *dev, struct hybd_front_io *f)
{
	hybd_remap_unuse(dev, f->target, f->bio.op);
	f->target = NULL;
}

int hybd_front_init(void)
{
	return bioset_init(&hybd_front_bs, BIO_POOL_SIZE,
			   offsetof(struct hybd_front_io, clone),
			   BIOSET_PERCPU_CACHE);
}

void hybd_front_exit(void)
{
	/*
	 * A front held open after its delete is freed when the holder lets
	 * go: module_put() comes just before that, so rmmod may get here
	 * first.  ->free_disk still runs module code.
	 */
	wait_var_event(&hybd_fronts, !atomic_read(&hybd_fronts));
	bioset_exit(&hybd_front_bs);
}
