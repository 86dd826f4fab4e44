// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - backing targets: the registry.
 *
 * A server registers files and block devices with its device
 * (HYBD_SRV_ADD_BACKING); a fast path's submit() may then remap a request
 * to a byte offset on one of them (hybd_bpf_io_remap()), and remap.c
 * serves it there.  Each registration is checked: what it can do (direct
 * I/O, alignment, writes that are not appends) and that its I/O cannot
 * come back to the device (the stack below it).
 *
 * A target is counted: the registration holds one reference, each remap
 * in flight another, and the last put lets the file go.  Remaps find a
 * target under RCU (queue_rq), so the memory goes after a grace period.
 *
 * A target taken off the device is retired, not dropped at once: it stays
 * on dev->retired while remapped writes to it are in flight or may not be
 * durable yet, so that a flush still covers every write completed before
 * it.  The reap work, flushes and barriers sync the retired targets and
 * let go of those done with (hybd_backing_reap()); the device's end, of
 * all.
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
 * How many targets and hybd devices one check looks at before it gives
 * up (-ELOOP): each device is followed once, so this is reached only by
 * a stack of some 60 devices with 16 targets each.
 */
#define HYBD_STACK_NODES	1024

/*
 * One check of a new target of @dev: the hybd devices whose targets were
 * followed already (by id: a device two targets lead to is walked once,
 * so that fanned-out stacks cost their size, not 16^depth), and what was
 * looked at so far.
 */
struct hybd_stack_walk {
	struct hybd_dev	*dev;
	struct xarray	seen;
	unsigned int	nodes;
};

/*
 * Whether a holder's operations are a file system's: those freeze and
 * thaw it with the device (fs_holder_ops), while a stacking driver's have
 * no freeze (md's) or are none (dm's, and btrfs's in 6.12, which claims
 * its devices without them).  fs_holder_ops itself is private to
 * fs/super.c in 7.3, so it cannot be compared with.
 */
static bool hybd_holder_is_fs(const struct blk_holder_ops *ops)
{
	return ops && ops->freeze;
}

/*
 * Whether a block device of @dev's disk (the whole disk or a partition)
 * is claimed by file system @sb (its data, a btrfs device, an XFS log or
 * realtime device, an ext4 journal) or, if @sb is NULL, by anything but
 * a file system (a stacking driver: dm, md).
 */
static bool hybd_disk_claimed(struct hybd_dev *dev, struct super_block *sb)
{
	struct gendisk *disk = hybd_dev_bdisk(dev);
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
		    !hybd_holder_is_fs(READ_ONCE(part->bd_holder_ops))) {
			claimed = true;
			break;
		}
	}
	rcu_read_unlock();
	return claimed;
}

static int hybd_stack_check(struct hybd_stack_walk *w, struct file *file,
			    unsigned int depth);

/*
 * Whether I/O to @disk may reach w->dev: its own disk; a dm or md device
 * (whose devices are its own to know) while a stacking driver claims
 * w->dev; another hybd device, through its targets, unless this walk
 * followed that device already.  -EINTR if the caller is killed.
 */
static int hybd_stack_check_disk(struct hybd_stack_walk *w,
				 struct gendisk *disk, unsigned int depth)
{
	struct file *files[HYBD_MAX_BACKINGS];
	struct hybd_dev *dev = w->dev;
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
	if (depth >= HYBD_STACK_DEPTH || ++w->nodes > HYBD_STACK_NODES) {
		ret = -ELOOP;
		goto out;
	}
	if (fatal_signal_pending(current)) {
		ret = -EINTR;
		goto out;
	}
	/*
	 * Followed already: its targets were found not to lead back, or are
	 * being followed below (a device on its own path would be a cycle
	 * that the checks before this one refused).
	 */
	ret = xa_insert(&w->seen, other->id, xa_mk_value(0), GFP_KERNEL);
	if (ret) {
		ret = ret == -EBUSY ? 0 : ret;
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
			ret = hybd_stack_check(w, files[i], depth + 1);
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
static int hybd_stack_check(struct hybd_stack_walk *w, struct file *file,
			    unsigned int depth)
{
	struct inode *inode = file_inode(file);
	struct super_block *sb;

	lockdep_assert_held(&hybd_stack_lock);
	if (++w->nodes > HYBD_STACK_NODES)
		return -ELOOP;
	if (S_ISBLK(inode->i_mode))
		return hybd_stack_check_disk(w, file_bdev(file)->bd_disk,
					     depth);
	/* overlayfs: the file system that holds the data */
	sb = d_real_inode(file->f_path.dentry)->i_sb;
	if (hybd_disk_claimed(w->dev, sb))
		return -ELOOP;
	/* none: memory (tmpfs), or elsewhere (NFS, FUSE) */
	if (!sb->s_bdev)
		return 0;
	return hybd_stack_check_disk(w, sb->s_bdev->bd_disk, depth);
}

/* The whole check of @file as a new target of @dev (hybd_stack_check()). */
static int hybd_stack_check_new(struct hybd_dev *dev, struct file *file)
{
	struct hybd_stack_walk w = { .dev = dev };
	int ret;

	xa_init(&w.seen);
	ret = hybd_stack_check(&w, file, 0);
	xa_destroy(&w.seen);
	return ret;
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
	ret = hybd_stack_check_new(dev, file);
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
		/*
		 * Counted before it leaves the table: a flush that no longer
		 * finds it there finds the count (hybd_remap_flush_needed()).
		 */
		atomic_inc(&dev->nr_retired);
		/* pairs with the smp_rmb() in hybd_remap_flush_needed() */
		smp_mb__after_atomic();
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

void hybd_backing_put(struct hybd_backing *t)
{
	kref_put(&t->ref, hybd_backing_release);
}

/* Let go of every retired target on @list. */
static void hybd_backing_put_all(struct hybd_dev *dev, struct list_head *list)
{
	struct hybd_backing *t, *next;

	list_for_each_entry_safe(t, next, list, node) {
		list_del(&t->node);
		hybd_backing_put(t);
		atomic_dec(&dev->nr_retired);
	}
}

/* Whether remapped writes on @t completed since its last sync. */
bool hybd_backing_dirty(struct hybd_backing *t)
{
	return atomic64_read(&t->written) != atomic64_read(&t->synced);
}

/*
 * Sync @b if remapped writes completed on it since it was last synced
 * (or always, @named: whatever wrote to it, the server too).  A remapped
 * write counts once it has completed, so a flush covers what completed
 * before it and never claims what it did not wait for.
 */
int hybd_backing_sync(struct hybd_backing *b, bool named)
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
int hybd_backing_reap(struct hybd_dev *dev, bool sync)
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
			ret = ret ?: hybd_backing_sync(t, false);
		if (hybd_backing_done_with(t))
			list_move(&t->node, &drop);
	}
	mutex_lock(&dev->backing_lock);
	list_splice(&list, &dev->retired);
	mutex_unlock(&dev->backing_lock);
	hybd_backing_put_all(dev, &drop);
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
	struct hybd_backing *t = NULL;
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
	ret = hybd_owner_may_use_file(dev, file,
				      b.flags & HYBD_BACKING_F_WRITE);
	if (ret)
		goto out;
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t) {
		ret = -ENOMEM;
		goto out;
	}
	t->flags = b.flags;
	/*
	 * Until it is installed: see hybd_stack_lock.  Killable: a check
	 * bounded by HYBD_STACK_NODES may still take a while on a slow
	 * machine, and others wait for it here.
	 */
	ret = mutex_lock_killable(&hybd_stack_lock);
	if (ret)
		goto out;
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
	hybd_backing_put_all(dev, &dev->retired);
}
