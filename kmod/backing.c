// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - backing targets and remaps.
 *
 * A server registers files and block devices with its device
 * (HYBD_SRV_ADD_BACKING); a fast path's submit() may then remap a request
 * to a byte offset on one of them (hybd_bpf_io_remap()), and the kernel
 * serves it there: direct I/O on the request's own pages, started from a
 * worker (queue_rq must not sleep, the file system may), as the loop
 * driver does.  A block device target goes the same way: its direct I/O
 * builds bios on the request's pages, without a copy.
 *
 * Each queue's reads and writes are started in batches by one work of
 * the queue's, without waiting where the target can tell (IOCB_NOWAIT);
 * what would wait is started again from a work of the tag's own, as are
 * flushes, discards and write-zeroes, so that it holds no batch behind it.
 *
 * A target is counted: the registration holds one reference, each remap
 * in flight another, and the last put lets the file go.  Remaps find a
 * target under RCU (queue_rq), so the memory goes after a grace period.
 * Every remap also holds dev->remap_srcu from its submit() to its end,
 * which is what HYBD_SRV_REMAP_BARRIER waits for.
 *
 * A target taken off the device is retired, not dropped at once: it stays
 * on dev->retired while remapped writes to it are in flight or may not be
 * durable yet, so that a flush still covers every write completed before
 * it.  Flushes, barriers and registrations let go of the retired targets
 * that are done with (hybd_backing_reap()); the device's end, of all.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blkdev.h>
#include <linux/bvec.h>
#include <linux/falloc.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/stat.h>
#include <linux/uaccess.h>
#include <linux/uio.h>

#include "hybd.h"

/**
 * struct hybd_backing - a backing target
 * @ref: the registration's reference, and one per remap in flight
 * @file: the kernel's own reference to the file; put with the last @ref
 * @size: bytes, at registration; remaps stay inside (or inside a file's
 *	current size, if it grew)
 * @flags: HYBD_BACKING_F_*
 * @dio_align: what direct I/O on it needs of offsets and lengths, bytes
 * @mem_align: what it needs of memory addresses, bytes
 * @bdev: whether it is a block device (else a regular file)
 * @written: remapped writes, discards and write-zeroes completed on a
 *	device with a write cache (without one, each is synced as it ends)
 * @synced: @written as it was before the last fdatasync that succeeded
 * @writers: remapped writes, discards and write-zeroes in flight
 * @node: on dev->retired once taken off the device
 * @settled: taken off for a grace period: no new remap can reach it
 * @rcu: freed after a grace period: queue_rq looks targets up under RCU
 */
struct hybd_backing {
	struct kref	ref;
	struct file	*file;
	u64		size;
	u32		flags;
	u32		dio_align;
	u32		mem_align;
	bool		bdev;
	atomic64_t	written;
	atomic64_t	synced;
	atomic_t	writers;
	struct list_head node;
	bool		settled;
	struct rcu_head	rcu;
};

/*
 * What direct I/O on @file needs: the file system says (STATX_DIOALIGN)
 * where it knows; otherwise its device's limits (a block device's own, as
 * vfs_getattr() does not ask them), or a sector without one.
 */
static int hybd_backing_dio(struct file *file, struct block_device *bdev,
			    u32 *align, u32 *mem_align)
{
	struct kstat st = {};
	int ret;

	/* the server may serve the file system itself: no round trip */
	ret = vfs_getattr_nosec(&file->f_path, &st, STATX_DIOALIGN,
				AT_STATX_DONT_SYNC);
	if (ret)
		return ret;
	if (st.result_mask & STATX_DIOALIGN) {
		/* 0: no direct I/O on this file */
		if (!st.dio_offset_align || !st.dio_mem_align)
			return -EOPNOTSUPP;
		*align = st.dio_offset_align;
		*mem_align = st.dio_mem_align;
	} else if (bdev) {
		*align = bdev_logical_block_size(bdev);
		*mem_align = bdev_dma_alignment(bdev) + 1;
	} else {
		*align = SECTOR_SIZE;
		*mem_align = SECTOR_SIZE;
	}
	if (!is_power_of_2(*align) || !is_power_of_2(*mem_align))
		return -EINVAL;
	return 0;
}

/*
 * A target's stack: what its I/O goes through before it is stored.  A
 * remap whose I/O comes back to its own device waits for a tag that the
 * remapped requests may all hold: the device hangs.  Registrations check
 * it one at a time, so that no two of them close a cycle between them.
 */
static DEFINE_MUTEX(hybd_stack_lock);

/* how many hybd devices deep a stack is followed before it is refused */
#define HYBD_STACK_DEPTH	8

/*
 * Whether a block device of @dev's disk (the whole disk or a partition)
 * is claimed by file system @sb (its data, a btrfs device, an XFS log or
 * realtime device, an ext4 journal) or, if @sb is NULL, by anything but
 * a file system (a stacking driver: dm, md; btrfs too, which claims its
 * devices without holder operations).
 */
static bool hybd_disk_claimed(struct hybd_dev *dev, struct super_block *sb)
{
	struct gendisk *disk = READ_ONCE(dev->disk);
	struct block_device *part;
	unsigned long idx;
	bool claimed = false;

	if (!disk)
		return false;
	/* partitions' block devices are freed after a grace period */
	rcu_read_lock();
	xa_for_each(&disk->part_tbl, idx, part) {
		void *holder = READ_ONCE(part->bd_holder);

		if (!holder)
			continue;
		if (sb ? holder == sb :
		    READ_ONCE(part->bd_holder_ops) != &fs_holder_ops) {
			claimed = true;
			break;
		}
	}
	rcu_read_unlock();
	return claimed;
}

static int hybd_stack_check(struct hybd_dev *dev, struct file *file,
			    unsigned int depth);

/*
 * Whether I/O to @disk may reach @dev: @dev's own disk; a dm or md device
 * (whose devices are its own to know) while a stacking driver claims
 * @dev; another hybd device, through its targets.
 */
static int hybd_stack_check_disk(struct hybd_dev *dev, struct gendisk *disk,
				 unsigned int depth)
{
	struct file *files[HYBD_MAX_BACKINGS];
	struct hybd_backing *t;
	struct hybd_dev *other;
	unsigned int i, n = 0;
	int ret = 0;

	if (hybd_dev_owns_disk(dev, disk))
		return -ELOOP;
#ifdef CONFIG_BLOCK_HOLDER_DEPRECATED
	if (!list_empty_careful(&disk->slave_bdevs) &&
	    hybd_disk_claimed(dev, NULL))
		return -ELOOP;
#endif
	other = hybd_dev_get_by_disk(disk);
	if (!other)
		return 0;
	if (depth >= HYBD_STACK_DEPTH) {
		ret = -ELOOP;
		goto out;
	}
	mutex_lock(&other->backing_lock);
	for (i = 0; i < HYBD_MAX_BACKINGS; i++) {
		t = rcu_dereference_protected(other->backing[i],
				lockdep_is_held(&other->backing_lock));
		if (t)
			files[n++] = get_file(t->file);
	}
	mutex_unlock(&other->backing_lock);
	for (i = 0; i < n; i++) {
		if (!ret)
			ret = hybd_stack_check(dev, files[i], depth + 1);
		fput(files[i]);
	}
out:
	hybd_dev_put(other);
	return ret;
}

/*
 * Whether I/O to @file may come back to @dev (-ELOOP), as far as the
 * kernel can tell: through the block devices below it, overlayfs, the
 * devices a file system claims, and other hybd devices' targets.  What a
 * loop device, nbd or another user-space server does with its I/O is
 * theirs: not seen.  Called under hybd_stack_lock.
 */
static int hybd_stack_check(struct hybd_dev *dev, struct file *file,
			    unsigned int depth)
{
	struct inode *inode = file_inode(file);
	struct super_block *sb;

	lockdep_assert_held(&hybd_stack_lock);
	if (S_ISBLK(inode->i_mode))
		return hybd_stack_check_disk(dev, file_bdev(file)->bd_disk,
					     depth);
	/* overlayfs: the file system that holds the data */
	sb = d_real_inode(file->f_path.dentry)->i_sb;
	if (hybd_disk_claimed(dev, sb))
		return -ELOOP;
	/* none: memory (tmpfs), or elsewhere (NFS, FUSE) */
	if (!sb->s_bdev)
		return 0;
	return hybd_stack_check_disk(dev, sb->s_bdev->bd_disk, depth);
}

/*
 * Check @file as a target of @dev: its size and direct I/O alignment.  A
 * regular file may be empty (a store that appends).
 */
static int hybd_backing_check(struct hybd_dev *dev, struct file *file,
			      struct hybd_backing *t)
{
	struct inode *inode = file_inode(file);
	struct block_device *bdev;
	int ret;

	if (!(file->f_mode & FMODE_READ))
		return -EBADF;
	if ((t->flags & HYBD_BACKING_F_WRITE) && !(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (S_ISBLK(inode->i_mode)) {
		bdev = file_bdev(file);
		t->size = bdev_nr_bytes(bdev);
		t->bdev = true;
		if (!t->size)
			return -EINVAL;
	} else if (S_ISREG(inode->i_mode)) {
		bdev = inode->i_sb->s_bdev;
		t->size = i_size_read(inode);
	} else {
		return -EINVAL;
	}
	if (!(file->f_mode & FMODE_CAN_ODIRECT))
		return -EOPNOTSUPP;
	/*
	 * A remapped write goes where its request says, as if the file were
	 * opened without O_APPEND (the kiocb has no IOCB_APPEND): refused
	 * where only appends are allowed (chattr +a), and on a descriptor
	 * that asked for them.
	 */
	if (t->flags & HYBD_BACKING_F_WRITE) {
		if (IS_APPEND(inode))
			return -EPERM;
		if (file->f_flags & O_APPEND)
			return -EINVAL;
	}
	/* remaps to it would queue behind themselves: a deadlock */
	ret = hybd_stack_check(dev, file, 0);
	if (ret)
		return ret;
	ret = hybd_backing_dio(file, bdev, &t->dio_align, &t->mem_align);
	if (ret)
		return ret;
	/*
	 * Offsets and lengths of whole device blocks must do.  The memory of
	 * each request is checked when it is remapped.
	 */
	if (dev->params.basic.logical_bs % t->dio_align)
		return -EINVAL;
	return 0;
}

/*
 * Take target @i off @dev, onto dev->retired (in the same critical
 * section, so that a flush finds it in one place or the other); under
 * @backing_lock.  hybd_backing_settle() decides what to keep.
 */
static struct hybd_backing *hybd_backing_take(struct hybd_dev *dev,
					      unsigned int i)
{
	struct hybd_backing *t;

	t = rcu_dereference_protected(dev->backing[i],
				      lockdep_is_held(&dev->backing_lock));
	if (t) {
		list_add_tail(&t->node, &dev->retired);
		RCU_INIT_POINTER(dev->backing[i], NULL);
	}
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

/* Let go of every target on @list. */
static void hybd_backing_put_all(struct list_head *list)
{
	struct hybd_backing *t, *next;

	list_for_each_entry_safe(t, next, list, node) {
		list_del(&t->node);
		hybd_backing_put(t);
	}
}

/* Whether a remap of @op writes to its target (what a flush must sync). */
static bool hybd_remap_writes(u32 op)
{
	return op != HYBD_OP_READ && op != HYBD_OP_FLUSH;
}

/* Whether @op is a read or write: direct I/O, started from a batch. */
static bool hybd_remap_is_rw(u32 op)
{
	return op == HYBD_OP_READ || op == HYBD_OP_WRITE;
}

/* Whether remapped writes on @t completed since its last sync. */
static bool hybd_backing_dirty(struct hybd_backing *t)
{
	return atomic64_read(&t->written) != atomic64_read(&t->synced);
}

/*
 * Sync @b if remapped writes completed on it since it was last synced
 * (or always, @named: whatever wrote to it, the server too).  A remapped
 * write counts once it has completed, so a flush covers what completed
 * before it and never claims what it did not wait for.
 */
static int hybd_remap_sync(struct hybd_backing *b, bool named)
{
	s64 seen = atomic64_read(&b->written);
	s64 old = atomic64_read(&b->synced);
	int err;

	if (!named && seen == old)
		return 0;
	err = vfs_fsync(b->file, 1);
	if (err)
		return err;
	while (old < seen && !atomic64_try_cmpxchg(&b->synced, &old, seen))
		;
	return 0;
}

/*
 * Whether retired target @t is done with: no remap can reach it, none
 * writes to it, and what they wrote is synced.  Reads in flight hold
 * their own reference.
 */
static bool hybd_backing_done_with(struct hybd_backing *t)
{
	/* pairs with the release in hybd_remap_drop(): @written is final */
	return READ_ONCE(t->settled) && !atomic_read_acquire(&t->writers) &&
	       !hybd_backing_dirty(t);
}

/*
 * Let go of the retired targets that are done with, syncing the dirty
 * ones first if @sync; caller holds @retired_lock.  @backing_lock is not
 * held across the syncs: registrations and deletes never wait for them.
 * The targets being looked at are off the list meanwhile; whoever else
 * would sync them waits for @retired_lock.
 *
 * Return: 0, or the first sync's error.
 */
static int hybd_backing_reap(struct hybd_dev *dev, bool sync)
{
	struct hybd_backing *t, *next;
	LIST_HEAD(list);
	LIST_HEAD(drop);
	int ret = 0;

	lockdep_assert_held(&dev->retired_lock);
	mutex_lock(&dev->backing_lock);
	list_splice_init(&dev->retired, &list);
	mutex_unlock(&dev->backing_lock);
	list_for_each_entry_safe(t, next, &list, node) {
		if (sync)
			ret = ret ?: hybd_remap_sync(t, false);
		if (hybd_backing_done_with(t))
			list_move(&t->node, &drop);
	}
	mutex_lock(&dev->backing_lock);
	list_splice(&list, &dev->retired);
	mutex_unlock(&dev->backing_lock);
	hybd_backing_put_all(&drop);
	return ret;
}

/* Reap without syncing, unless a flush or barrier is at it already. */
static void hybd_backing_try_reap(struct hybd_dev *dev)
{
	if (!mutex_trylock(&dev->retired_lock))
		return;
	hybd_backing_reap(dev, false);
	mutex_unlock(&dev->retired_lock);
}

/**
 * hybd_backing_reap_work() - sync the retired targets, let go of those done
 * @work: the device's reap_work
 *
 * So that a target taken off is not kept until the device goes: the
 * server's death or HYBD_SRV_DEL_BACKING with remapped writes in flight
 * or not yet durable would otherwise keep its file open (its file system
 * busy, an unlinked file's space taken) until a flush or a barrier.
 */
void hybd_backing_reap_work(struct work_struct *work)
{
	struct hybd_dev *dev = container_of(work, struct hybd_dev, reap_work);
	unsigned int pflags = memalloc_noio_save();

	mutex_lock(&dev->retired_lock);
	hybd_backing_reap(dev, true);
	mutex_unlock(&dev->retired_lock);
	memalloc_noio_restore(pflags);
}

/*
 * Targets @old[0..@n-1] were taken off @dev: once no submit() can find
 * them any more, they are settled, and let go of if done with: at once
 * if nothing is to be synced, else by the reap work, which also takes
 * those still written to once their last write ends (hybd_remap_drop()).
 */
static void hybd_backing_settle(struct hybd_dev *dev,
				struct hybd_backing **old, unsigned int n)
{
	unsigned int i;

	if (!n)
		return;
	synchronize_rcu();
	for (i = 0; i < n; i++)
		WRITE_ONCE(old[i]->settled, true);
	/* pairs with hybd_remap_drop(): settled, then writers read */
	smp_mb();
	hybd_backing_try_reap(dev);
	queue_work(dev->remap_wq, &dev->reap_work);
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

	ret = hybd_copy_in(&b, sizeof(b), sizeof(b), arg);
	if (ret)
		return ret;
	if (b.reserved0 || b.reserved[0] || b.reserved[1])
		return -EINVAL;
	if (b.flags & ~HYBD_BACKING_F_ALL)
		return -EOPNOTSUPP;
	file = fget(b.fd);
	if (!file)
		return -EBADF;
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t) {
		ret = -ENOMEM;
		goto out;
	}
	t->flags = b.flags;
	/* until it is installed: see hybd_stack_lock */
	mutex_lock(&hybd_stack_lock);
	ret = hybd_backing_check(dev, file, t);
	if (ret) {
		mutex_unlock(&hybd_stack_lock);
		goto out;
	}
	kref_init(&t->ref);
	INIT_LIST_HEAD(&t->node);
	t->file = file;
	/* once published, a delete may free it at any time */
	b.size = t->size;
	b.dio_align = t->dio_align;

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
	mutex_unlock(&hybd_stack_lock);
	if (ret)
		goto out;
	hybd_backing_try_reap(dev);

	b.index = i;
	/* registered: a caller that cannot read the answer can still DEL */
	if (copy_to_user(arg, &b, sizeof(b)))
		return -EFAULT;
	return 0;
out:
	kfree(t);
	fput(file);
	return ret;
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
	hybd_backing_settle(dev, &t, 1);
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
	hybd_backing_settle(dev, old, n);
}

/**
 * hybd_backing_free_retired() - the device goes: let go of what it kept
 * @dev: the device; no request is left
 */
void hybd_backing_free_retired(struct hybd_dev *dev)
{
	hybd_backing_put_all(&dev->retired);
}

/* ---- remaps ---- */

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
 * Whether direct I/O on @b can take @rq's pages as they are: every
 * segment's address and length aligned as the target needs.  (The queue
 * guarantees sectors; a target with 4 KiB blocks needs more.)
 */
static bool hybd_remap_mem_ok(struct request *rq, struct hybd_backing *b)
{
	u32 mem_mask = b->mem_align - 1, len_mask = b->dio_align - 1;
	struct req_iterator it;
	struct bio_vec bv;

	if (mem_mask < SECTOR_SIZE && len_mask < SECTOR_SIZE)
		return true;
	rq_for_each_bvec(bv, rq, it)
		if ((bv.bv_offset & mem_mask) || (bv.bv_len & len_mask))
			return false;
	return true;
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
	const struct hybd_bpf_io *io = &t->bio;
	struct hybd_backing *b;
	u64 size;
	int ret = -EINVAL;

	if (!t->in_submit)
		return -EPERM;
	if (t->remap.target)
		return -EALREADY;
	if (index >= HYBD_MAX_BACKINGS)
		return -EINVAL;
	b = rcu_dereference(q->dev->backing[index]);
	/* a delete took it off meanwhile and let go of the last reference */
	if (!b || !kref_get_unless_zero(&b->ref))
		return -ENOENT;
	if (io->op != HYBD_OP_FLUSH) {
		/* io->bytes is whole device blocks, which @b can take */
		if (!IS_ALIGNED(offset, b->dio_align))
			goto out_put;
		if (hybd_remap_is_rw(io->op) &&
		    !hybd_remap_mem_ok(t->rq, b))
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
	t->remap.target = b;
	t->remap.pos = offset;
	t->remap.srcu_idx = srcu_down_read(&q->dev->remap_srcu);
	return 0;
out_put:
	hybd_backing_put(b);
	return ret;
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
	struct hybd_backing *target = t->remap.target;

	/*
	 * After hybd_remap_end() counted it in @written; fully ordered: the
	 * last write to a target taken off queues the reap, or the settling
	 * sees no writer (pairs with hybd_backing_settle()).
	 */
	if (hybd_remap_writes(t->bio.op) &&
	    !atomic_dec_return(&target->writers) && READ_ONCE(target->settled))
		queue_work(q->dev->remap_wq, &q->dev->reap_work);
	hybd_backing_put(t->remap.target);
	t->remap.target = NULL;
	srcu_up_read(&q->dev->remap_srcu, t->remap.srcu_idx);
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
 * One direct I/O call is over (r->ret is set): if it was asked not to
 * wait and could not do without, start it again where it may; go on from
 * where it stopped if it made progress short of the end (a file system
 * may do less than asked); else end the request in its completion
 * context, where blk-mq calls hybd_remap_end().  A read that gets nothing
 * more has hit the file's end: the rest reads as zeros there, as with the
 * loop driver.
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
	 * the completion's context: not in the target's hard interrupt.
	 */
	if (r->ret >= 0 && r->done < t->bio.bytes && in_hardirq()) {
		r->finish = true;
		queue_work(q->dev->remap_wq, &r->work);
		return;
	}
	blk_mq_complete_request(t->rq);
}

static void hybd_remap_rw_done(struct kiocb *iocb, long ret)
{
	struct hybd_remap *r = container_of(iocb, struct hybd_remap, iocb);

	r->ret = ret;
	hybd_remap_put(r);
}

/* Whether the device has a volatile write cache: flushes make it durable. */
static bool hybd_remap_cached(struct hybd_tag *t)
{
	struct hybd_queue *q = t->rq->mq_hctx->driver_data;

	return q->dev->params.basic.flags & HYBD_DEV_F_WRITE_CACHE;
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
	struct bio_vec bv, *bvec;
	struct iov_iter iter;
	unsigned int nr = 0;
	size_t skip = 0;
	ssize_t ret;

	rq_for_each_bvec(bv, rq, it)
		nr++;
	r->nowait = nowait && hybd_remap_can_nowait(t, file);
	if (rq->bio != rq->biotail) {
		if (!r->bvec) {
			bvec = kmalloc_array(nr, sizeof(*bvec), nowait ?
					     GFP_NOWAIT : GFP_NOIO);
			if (!bvec && nowait) {
				hybd_remap_wait(q, r);
				return;
			}
			if (!bvec) {
				r->ret = -ENOMEM;
				blk_mq_complete_request(rq);
				return;
			}
			r->bvec = bvec;
			rq_for_each_bvec(bv, rq, it)
				*bvec++ = bv;
		}
		bvec = r->bvec;
	} else {
		/* a split bio may start inside its first bio_vec */
		bvec = __bvec_iter_bvec(rq->bio->bi_io_vec, rq->bio->bi_iter);
		skip = rq->bio->bi_iter.bi_bvec_done;
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
 * A flush: fdatasync the named target, every other target remapped
 * writes completed on since it was last synced, and the retired ones that
 * may still hold such writes (letting go of those done with).
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

	ret = hybd_remap_sync(named, true);
	for (i = 0; i < n; i++) {
		ret = ret ?: hybd_remap_sync(sync[i], false);
		hybd_backing_put(sync[i]);
	}
	mutex_lock(&dev->retired_lock);
	ret = ret ?: hybd_backing_reap(dev, true);
	mutex_unlock(&dev->retired_lock);
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

	if (b->bdev && !zeroes) {
		struct block_device *bdev = file_bdev(b->file);

		if (!bdev_max_discard_sectors(bdev))
			return 0;
		return blkdev_issue_discard(bdev, r->pos >> SECTOR_SHIFT,
					    t->bio.bytes >> SECTOR_SHIFT,
					    GFP_NOIO);
	}
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
		blk_mq_complete_request(t->rq);
		return;
	}
	pflags = hybd_remap_worker_enter();
	switch (t->bio.op) {
	case HYBD_OP_READ:
	case HYBD_OP_WRITE:
		hybd_remap_rw(t, false);
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
	hybd_remap_worker_exit(pflags);
}

/*
 * Hand @first and those after it, oldest first, to the unbound worker.
 * Reversed, they go on the list (a stack) in one push, newest on top, as
 * if pushed one by one in their order: the worker's llist_reverse_order()
 * restores it, behind any pushed meanwhile.  @first ends up the last.
 */
static void hybd_remap_requeue(struct hybd_queue *q, struct llist_node *first)
{
	struct llist_node *top = llist_reverse_order(first);

	if (llist_add_batch(top, first, &q->remap_list))
		queue_work(q->dev->remap_batch_wq, &q->remap_work);
}

/*
 * A queue's reads and writes: start the batch that waits, in the order
 * it came.  Targets that can say they would wait (FMODE_NOWAIT: most file
 * systems, block devices) are asked not to, and what would wait goes to
 * its tag's own work.  Others are called as they are, as the loop driver
 * calls its file: whatever one does in the call (tmpfs: the copy) keeps
 * the rest of the batch waiting meanwhile.  Requests that came in since
 * queued a work again: one batch a run, so that the rescuer of a
 * workqueue under memory pressure moves on to the other queues' works.
 *
 * A request queued @alone (the local work, on its CPU) is started alone:
 * whatever joined it before this ran goes to the unbound worker, so that
 * a burst never stays on one CPU, behind a submitter that may not let
 * the worker run.
 */
static void hybd_remap_batch(struct hybd_queue *q, bool alone)
{
	struct llist_node *list;
	struct hybd_remap *r, *next;
	unsigned int pflags;

	list = llist_reverse_order(llist_del_all(&q->remap_list));
	if (alone && list && list->next) {
		hybd_remap_requeue(q, list->next);
		list->next = NULL;
	}
	pflags = hybd_remap_worker_enter();
	/*
	 * A tag may be remapped again, or go on from a short I/O, as soon as
	 * it is started: the next node is read before it starts.
	 */
	llist_for_each_entry_safe(r, next, list, node) {
		hybd_remap_rw(container_of(r, struct hybd_tag, remap), true);
		cond_resched();
	}
	hybd_remap_worker_exit(pflags);
}

static void hybd_remap_batch_work(struct work_struct *work)
{
	hybd_remap_batch(container_of(work, struct hybd_queue, remap_work),
			 false);
}

static void hybd_remap_local_work(struct work_struct *work)
{
	hybd_remap_batch(container_of(work, struct hybd_queue,
				      remap_local_work), true);
}

/*
 * Queue a read or write for its queue's workers (any context): the first
 * on an empty list queues a work, which takes those that follow.  A
 * request alone on its queue (no other in flight, and none behind it in
 * its dispatch: @last) from a submitter that waits for it is started by
 * a worker of the CPU that queued it, which the submitter leaves idle:
 * no other CPU to wake.  A submitter that does not wait would take turns
 * with that worker on its CPU (its wakeup preempts the submitter), one
 * request a turn while the other CPUs idle: a request marked REQ_NOWAIT
 * (io_uring's, which reaps its completions later) goes to the unbound
 * worker, as batches do under load, so that what the target does in the
 * call (a copy) runs beside the submitters, as in the loop driver.  (An
 * aio submitter does not mark its requests: it still takes turns.)  Both
 * works may run at once, on separate batches.
 */
static void hybd_remap_queue(struct hybd_queue *q, struct hybd_tag *t,
			     bool last)
{
	if (!llist_add(&t->remap.node, &q->remap_list))
		return;
	if (last && atomic_read(&q->remaps) == 1 &&
	    !(t->rq->cmd_flags & REQ_NOWAIT))
		queue_work(q->dev->remap_local_wq, &q->remap_local_work);
	else
		queue_work(q->dev->remap_batch_wq, &q->remap_work);
}

void hybd_remap_init_queue(struct hybd_queue *q)
{
	unsigned int i;

	init_llist_head(&q->remap_list);
	atomic_set(&q->remaps, 0);
	INIT_WORK(&q->remap_work, hybd_remap_batch_work);
	INIT_WORK(&q->remap_local_work, hybd_remap_local_work);
	for (i = 0; i < q->dev->params.basic.queue_depth; i++)
		INIT_WORK(&q->tags[i].remap.work, hybd_remap_work);
}

/**
 * hybd_remap_start() - serve a remapped request
 * @q: its queue
 * @t: its tag, remapped by submit()
 * @last: no other request follows it in this dispatch (bd->last)
 *
 * Context: queue_rq; does not sleep (the I/O starts in a worker).
 */
void hybd_remap_start(struct hybd_queue *q, struct hybd_tag *t, bool last)
{
	t->remap.ret = 0;
	t->remap.done = 0;
	WRITE_ONCE(t->state, HYBD_TAG_REMAP);
	if (hybd_remap_is_rw(t->bio.op)) {
		atomic_inc(&q->remaps);
		hybd_remap_queue(q, t, last);
	} else {
		/*
		 * The tag's last remap has ended: its work is not pending (it
		 * may still be running, to its end; it is queued again).
		 */
		WARN_ON_ONCE(!queue_work(q->dev->remap_wq, &t->remap.work));
	}
}

/**
 * hybd_remap_end() - a remapped request is done: its status, complete()
 * @q: its queue
 * @rq: the request
 *
 * Context: blk-mq's completion: the caller of blk_mq_complete_request()
 * (the worker, or the target's completion, which may be a hard interrupt),
 * or blk-mq's softirq.
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
	 * changed some of the range; without a write cache it is synced.
	 */
	if (hybd_remap_writes(t->bio.op) && hybd_remap_cached(t))
		atomic64_inc(&r->target->written);

	t->bio.result = err;
	t->bio.path = HYBD_BPF_PATH_REMAP;
	hybd_bpf_complete(q, t);
	hybd_remap_drop(q, t);
	hybd_stat_inc(q, remapped);
	WRITE_ONCE(t->state, HYBD_TAG_IDLE);
	return err;
}
