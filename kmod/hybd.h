/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hybd - internal definitions shared by the module's files.
 *
 *   main.c     module init/exit, the device table
 *   ctl.c      /dev/hybd-control: add, delete, list, info
 *   params.c   a new device's parameters, checked
 *   dev.c      a device's life: create, start (add_disk), recovery,
 *              handover, kill, delete
 *   info.c     what a device reports: counters, state, parameters
 *   blk.c      blk-mq ops: queue_rq publishes requests to the ring
 *   ring.c     /dev/hybdN-srv: open/release/mmap, commit and wait
 *   bpf.c      the fast path: struct_ops and kfuncs
 *   backing.c  backing targets a server registers (HYBD_SRV_ADD_BACKING)
 *   remap.c    requests the fast path remapped, served on those targets
 *   front.c    the bio-based front (HYBD_DEV_F_BIO_FRONT): map() on bios
 */
#ifndef _HYBD_H
#define _HYBD_H

#include <linux/ratelimit.h>
#include <linux/blk-mq.h>
#include <linux/cdev.h>
#include <linux/fs.h>
#include <linux/completion.h>
#include <linux/kref.h>
#include <linux/llist.h>
#include <linux/log2.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/srcu.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include "uapi/hybd.h"
#include "compat.h"

struct hybd_bpf_prog;
struct hybd_backing;

/* without an I/O timeout, how often a request checks its server lives */
#define HYBD_LIVENESS_TIMEOUT	(30 * HZ)

/* Per-tag state, kept in kernel memory: the ring is never trusted. */
enum hybd_tag_state {
	HYBD_TAG_IDLE = 0,
	HYBD_TAG_INFLIGHT,	/* published to the server, not completed */
	/*
	 * being issued again to a resumed server (hybd_queue_resume()): no
	 * completion, timeout or kill ends it, the resume does
	 */
	HYBD_TAG_REISSUE,
	/*
	 * served on a backing target (a remap): only its own completion
	 * ends it; kills, timeouts and resumes leave it alone
	 */
	HYBD_TAG_REMAP,
};

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

/* Whether a remap of @op writes to its target (what a flush must sync). */
static inline bool hybd_remap_writes(u32 op)
{
	return op != HYBD_OP_READ && op != HYBD_OP_FLUSH;
}

/*
 * What a clone (queue_rq's, the front's) keeps of its bio's flags: hints
 * for the target's scheduler and throttling, not how the bio was
 * submitted (REQ_POLLED, the bio's allocation cache: the clone has its
 * own bit, from bio_alloc_clone()) nor its durability, which is set anew.
 */
#define HYBD_CLONE_KEEP	(REQ_SYNC | REQ_META | REQ_PRIO | REQ_IDLE | \
			 REQ_BACKGROUND | REQ_RAHEAD | REQ_FAILFAST_MASK)

/* Whether @op is a read or write: direct I/O, started from a batch. */
static inline bool hybd_remap_is_rw(u32 op)
{
	return op == HYBD_OP_READ || op == HYBD_OP_WRITE;
}

/* A remap in progress, in its tag (remap.c). */
struct hybd_remap {
	struct hybd_backing	*target;	/* referenced */
	u64			pos;		/* byte offset in the target */
	int			srcu_idx;	/* dev->remap_srcu, held */
	/* the last call's bytes or -errno; at the end, all bytes done */
	long			ret;
	u32			done;		/* bytes done by earlier calls */
	struct bio_vec		*bvec;		/* a multi-bio request's */
	atomic_t		ref;		/* submitter + completion */
	bool			nowait;		/* the call has IOCB_NOWAIT */
	bool			finish;		/* work: only complete it */
	/*
	 * work: a flush the program did not remap, with remapped writes
	 * to sync first (hybd_remap_sync_first()); then @verdict, the
	 * program's, goes on
	 */
	bool			sync_first;
	int			verdict;
	struct kiocb		iocb;
	/* a read or write waits on its queue's remap_list */
	struct llist_node	node;
	/*
	 * what may block runs in a work of its own: a flush, discard or
	 * write-zeroes, and a read or write the target could not start
	 * without waiting
	 */
	struct work_struct	work;
};

/**
 * struct hybd_front_io - a read or write bio in the front (front.c)
 * @bio: what map() and complete() see
 * @dev: the device
 * @q: the submitting CPU's queue, for the counters
 * @target: hybd_bpf_io_remap()'s target, referenced, or NULL
 * @pos: byte offset in @target
 * @srcu_idx: dev->remap_srcu, held while @target is set, until the end
 * @bpf_gen: the generation of the program whose map() ran
 * @in_map: map() runs: remap is allowed
 * @acct: iostats started, at @acct_start
 * @acct_start: bio_start_io_acct()'s
 * @start_ns: for the fast path's latency histogram
 * @orig: the bio
 * @clone: its clone on @target; last, the bioset's front_pad is the rest
 */
struct hybd_front_io {
	struct hybd_bpf_io	bio;
	struct hybd_dev		*dev;
	struct hybd_queue	*q;
	struct hybd_backing	*target;
	u64			pos;
	int			srcu_idx;
	u32			bpf_gen;
	bool			in_map;
	bool			acct;
	unsigned long		acct_start;
	u64			start_ns;
	struct bio		*orig;
	struct bio		clone;
};

struct hybd_tag {
	struct request	*rq;
	u64		seq;
	u64		start_ns;
	u64		overdue_ns;	/* recovery mode: when it timed out */
	u32		bpf_gen;	/* generation of the program that passed it */
	u32		bpf_filled;	/* read bytes the kfuncs filled, a prefix */
	u8		state;
	u8		srv_op;		/* the desc as published, for a reissue */
	u16		srv_flags;
	bool		bpf_data;	/* a read's payload is the device's data */
	bool		in_submit;	/* submit() runs: remap is allowed */
	/* counted in the front's iostats, from @acct_start (jiffies) */
	bool		front_acct;
	unsigned long	acct_start;
	struct hybd_bpf_io bio;		/* what the BPF program sees */
	struct hybd_remap remap;
};

/*
 * Per-queue counters, per CPU so that no path takes a lock to count:
 * updated with this_cpu_inc() (preemption-safe), summed on demand into
 * struct hybd_dev_stats.
 */
struct hybd_queue_stats {
	u64 slow_issued, slow_done, slow_errors;
	u64 fast_done, fast_errors;
	u64 failed_dead;
	u64 reads, writes, flushes, fua, discards, write_zeroes;
	u64 rej_bad_tag, rej_not_outstanding, rej_stale_seq;
	u64 rej_bad_result, rej_ring_index;
	u64 bpf_bad_ret, bpf_unfilled, bpf_pass_zeroes;
	u64 timed_out;
	u64 held, reissued;
	u64 remapped, remap_refused, remap_waited, remap_direct;
	u64 remap_runs, remap_polled, remap_front;
	u64 fast_lat[HYBD_LAT_BUCKETS];
	u64 slow_lat[HYBD_LAT_BUCKETS];
};

#define hybd_stat_inc(q, field)	this_cpu_inc((q)->stats->field)

struct hybd_queue {
	struct hybd_dev		*dev;
	unsigned int		id;

	/* the area mmapped by the server: header, rings, descriptors, data */
	void			*area;
	size_t			area_size;
	struct hybd_ring_hdr	*hdr;
	u32			*sq;
	struct hybd_cqe		*cq;
	struct hybd_io_desc	*desc;
	u8			*data;

	/*
	 * @lock protects the tag states, the kernel's ring indices, @dead
	 * and hdr->flags.  queue_rq can run on several CPUs for one hctx,
	 * and the server may commit from several threads.
	 */
	spinlock_t		lock;
	struct hybd_tag		*tags;
	u32			sq_tail;	/* next slot the kernel fills */
	u32			sq_published;	/* tail the server may see */
	u32			sq_returned;	/* tail last returned to server */
	u32			cq_head;	/* next cqe the kernel reads */
	u64			next_seq;
	bool			dead;
	/*
	 * No server consumes (recovery): queue_rq fills the ring but does
	 * not publish, and the resume rewinds it.
	 */
	bool			parked;
	struct hybd_queue_stats __percpu *stats;

	/*
	 * Workers sleeping in HYBD_SRV_IO (@waiters, under @lock): queue_rq
	 * wakes only while there is one (@need_wakeup).
	 */
	wait_queue_head_t	wq;
	unsigned int		waiters;
	bool			need_wakeup;
	bool			kicked;
	/*
	 * A worker that waits elsewhere (HYBD_SRV_IO_ARM): its eventfd,
	 * replaced under @lock, read under RCU; signalled once per arming
	 * for submissions, and on every kick and death.
	 */
	struct eventfd_ctx __rcu *efd;
	bool			efd_armed;

	/*
	 * Remapped reads and writes wait here for @remap_local_work (one
	 * alone on the queue: on its CPU), @remap_beside_work (on
	 * @beside_cpu, a CPU of an idle queue) or @remap_work (unbound),
	 * which start the batch they find one after another, without waiting
	 * where the target can say so: one worker's wakeup for a whole batch.
	 * While @remap_batching counts a batch work, which will look at the
	 * list again before it ends, a request joins the list and nothing
	 * more: no work to queue, no worker to wake.
	 */
	struct llist_head	remap_list;
	atomic_t		remaps;		/* reads, writes in flight */
	atomic_t		remap_batching;
	struct work_struct	remap_work;
	struct work_struct	remap_local_work;
	struct work_struct	remap_beside_work;
	/* where it last went: hints, read and set racily */
	unsigned int		beside_queue;
	unsigned int		beside_cpu;
	struct blk_mq_hw_ctx	*hctx;		/* for its CPUs */
};

struct hybd_dev {
	struct kref		ref;
	u32			id;
	struct hybd_params	params;
	/* HYBD_DEV_F_UNPRIVILEGED: whose it is (owner.c), set at creation */
	bool			unpriv;
	kuid_t			owner_uid;
	kgid_t			owner_gid;
	/* what it costs and who pays, until it is freed (owner.c) */
	bool			charged;
	kuid_t			payer;
	u64			charge;
	u32			ring_entries;
	u64			queue_stride;

	/*
	 * @state_lock protects what follows up to @disk.  It is a spinlock,
	 * never held across anything that waits, so that list/info, a dying
	 * server and the I/O timeout never wait for a stuck start or delete.
	 */
	spinlock_t		state_lock;
	enum hybd_dev_state	state;
	bool			server_open;
	struct pid		*server_pid;	/* the server's thread group */
	bool			start_queued;
	bool			del_queued;
	/* recovery: HYBD_CTL_HANDOVER asked the server to leave, until then */
	bool			handover;
	unsigned long		handover_until;	/* jiffies */
	/* recovery: when a timeout first saw the server's process gone */
	unsigned long		gone_since;	/* jiffies, 0: not seen */
	u64			waiting_since;	/* ktime ns, in WAITING */
	u64			no_server_ns;	/* WAITING before that */
	unsigned long		recovery_deadline;	/* jiffies */
	u32			recoveries;
	struct gendisk		*disk;		/* set once add_disk() is done */
	/*
	 * HYBD_DEV_F_BIO_FRONT: the bio-based disk in front of @disk, which
	 * is then hidden; set with @disk
	 */
	struct gendisk		*front;

	/*
	 * add_disk() and del_gendisk() run in works on hybd_wq, so that the
	 * callers (the server, hybdctl) wait killably; module exit drains
	 * the workqueue, so no work's tail runs after rmmod.
	 */
	int			start_ret;
	struct work_struct	start_work;
	struct completion	started;
	struct work_struct	del_work;
	struct completion	deleted;
	/* recovery: ends WAITING when no server came; holds a reference */
	struct delayed_work	recovery_work;

	struct blk_mq_tag_set	tag_set;
	/*
	 * blk-mq's CPU -> queue map as it was at creation (nr_cpu_ids
	 * entries), for HYBD_SRV_QUEUE_CPUS: the tag set's own is freed by a
	 * delete while the server's file may still ask.
	 */
	u32			*cpu_queue;
	struct hybd_queue	*queues;

	struct cdev		*cdev;
	struct device		*srv_dev;

	/* backing targets; written under @backing_lock, read under RCU */
	struct mutex		backing_lock;
	struct hybd_backing __rcu *backing[HYBD_MAX_BACKINGS];
	/*
	 * targets taken off that a flush must still sync, or that remaps
	 * still use (struct hybd_backing.node); under @backing_lock
	 */
	struct list_head	retired;
	/* targets taken off and not let go of yet (on @retired or reaped) */
	atomic_t		nr_retired;
	/* held while retired targets are synced and let go of */
	struct mutex		retired_lock;
	/*
	 * Syncs and lets go of the retired targets done with (remap_wq):
	 * queued when targets are taken off, and when the last remapped
	 * write to a retired one ends
	 */
	struct work_struct	reap_work;
	/* every remap holds it from its submit() to its end: the barrier */
	struct srcu_struct	remap_srcu;
	/*
	 * Remaps start their backing I/O from the device's own workqueues,
	 * each with a rescuer, so that under memory pressure one device's
	 * I/O stacked on another's never waits for a worker: @remap_wq for
	 * what may wait (a tag's own work), @remap_batch_wq,
	 * @remap_local_wq and @remap_beside_wq for the queues' batches
	 * (unbound, on the CPU that queued them, and on one it chose), so
	 * that works that wait never hold a batch back for want of a worker.
	 */
	struct workqueue_struct	*remap_wq;
	struct workqueue_struct	*remap_batch_wq;
	struct workqueue_struct	*remap_local_wq;
	struct workqueue_struct	*remap_beside_wq;

	/* the BPF fast path; written under hybd_bpf_lock, read under RCU */
	struct hybd_bpf_prog __rcu *bpf_prog;
	u32			bpf_gen;	/* bumped on attach/replace */
	u32			bpf_attaches;
	bool			bpf_gone;	/* deleted: takes no program */
	bool			bpf_blocked;	/* being shrunk: takes none */
	/* the program has a map(): the front runs it */
	bool			front_maps;

	/* resizes (resize.c), one at a time */
	struct mutex		resize_lock;
	/* the question to the server; under @state_lock */
	u32			resize_gen;
	bool			resize_asking;
	bool			resize_answered;
	int			resize_result;
	wait_queue_head_t	resize_wq;
	/* an unprivileged device's resizes (and their uevents) */
	struct ratelimit_state	resize_rs;
};

/* main.c */
extern struct workqueue_struct *hybd_wq;
extern struct class *hybd_class;
extern dev_t hybd_srv_devt;
extern bool hybd_bpf_ready;
struct hybd_dev *hybd_dev_get(u32 id);
struct hybd_dev *hybd_dev_get_by_disk(struct gendisk *disk);
int hybd_dev_reserve_id(struct hybd_dev *dev, u32 id);
void hybd_dev_publish(struct hybd_dev *dev);
void hybd_dev_remove_id(struct hybd_dev *dev);
int hybd_dev_list(u32 *ids, u32 room);

/* ctl.c */
int hybd_copy_in(void *dst, size_t size, size_t min, const void __user *src);
int hybd_ctl_init(void);
void hybd_ctl_exit(void);

/* dev.c */
struct hybd_dev *hybd_dev_create(const struct hybd_params *p, u32 id);
int hybd_dev_start(struct hybd_dev *dev);
void hybd_dev_kill(struct hybd_dev *dev);
u32 hybd_dev_recovery_secs(struct hybd_dev *dev);
void hybd_dev_lose_server(struct hybd_dev *dev);
int hybd_dev_handover(struct hybd_dev *dev);
bool hybd_dev_server_gone(struct hybd_dev *dev);
bool hybd_dev_is_server(struct hybd_dev *dev);
int hybd_dev_delete(struct hybd_dev *dev, u32 flags, bool killable);
void hybd_dev_put(struct hybd_dev *dev);
bool hybd_dev_owns_disk(struct hybd_dev *dev, struct gendisk *disk);

/*
 * The disk users open: the front if the device has one (the disk behind
 * it is set first); NULL until started.
 */
static inline struct gendisk *hybd_dev_bdisk(struct hybd_dev *dev)
{
	if (dev->params.basic.flags & HYBD_DEV_F_BIO_FRONT)
		return READ_ONCE(dev->front);
	return READ_ONCE(dev->disk);
}

/* params.c */
int hybd_params_check(struct hybd_params *p, u32 *err_param);

/* info.c */
void hybd_dev_fill_info(struct hybd_dev *dev, struct hybd_dev_info *info);
void hybd_queue_stat_add(struct hybd_queue *q, struct hybd_queue_stat *dst);

/* blk.c */
extern const struct blk_mq_ops hybd_mq_ops;
void hybd_queue_fail_all(struct hybd_queue *q);
struct hybd_reissue {
	u64	seq;
	u32	tag;
};
int hybd_queue_resume(struct hybd_queue *q, struct hybd_reissue *list);
void hybd_rq_copy(struct request *rq, u32 off, void *buf, u32 len, bool to_rq);
u16 hybd_bio_flags(blk_opf_t opf);
void hybd_end_request(struct hybd_queue *q, struct request *rq,
		      blk_status_t sts);
void hybd_count_front(struct hybd_queue *q, const struct hybd_bpf_io *io,
		      u64 start_ns, bool waited);
void hybd_flush_synced(struct hybd_queue *q, struct hybd_tag *t, int err);

/* bpf.c */
int hybd_bpf_init(void);
void hybd_bpf_dev_gone(struct hybd_dev *dev);
int hybd_bpf_block(struct hybd_dev *dev, bool block);
int hybd_bpf_submit(struct hybd_queue *q, struct hybd_tag *t);
void hybd_bpf_complete(struct hybd_queue *q, struct hybd_tag *t);
void hybd_bpf_fill_info(struct hybd_dev *dev, struct hybd_dev_info *info);
int hybd_bpf_map(struct hybd_dev *dev, struct hybd_front_io *f);
void hybd_bpf_complete_front(struct hybd_dev *dev, struct hybd_front_io *f);

/* front.c */
int hybd_front_init(void);
void hybd_front_exit(void);
bool hybd_front_is(struct hybd_dev *dev, struct gendisk *disk);
struct gendisk *hybd_front_alloc(struct hybd_dev *dev,
				 struct queue_limits *lim);
void hybd_front_added(struct hybd_dev *dev, struct gendisk *disk);
void hybd_front_deleted(struct gendisk *front, struct gendisk *disk);
void hybd_front_drop(struct hybd_dev *dev, struct hybd_front_io *f);

static inline unsigned int hybd_lat_bucket(u64 start_ns)
{
	u64 d = ktime_get_ns() - start_ns;

	return d ? min_t(unsigned int, ilog2(d), HYBD_LAT_BUCKETS - 1) : 0;
}

#define hybd_lat_add(q, hist, start_ns) \
	this_cpu_inc((q)->stats->hist[hybd_lat_bucket(start_ns)])

blk_status_t hybd_errno_status(int err);

/* backing.c */
long hybd_backing_add(struct hybd_dev *dev, void __user *arg);
long hybd_backing_del(struct hybd_dev *dev, unsigned long index);
void hybd_backing_drop_all(struct hybd_dev *dev);
void hybd_backing_free_retired(struct hybd_dev *dev);
void hybd_backing_reap_work(struct work_struct *work);
void hybd_backing_put(struct hybd_backing *t);
bool hybd_backing_dirty(struct hybd_backing *t);
int hybd_backing_sync(struct hybd_backing *b, bool named);
int hybd_backing_reap(struct hybd_dev *dev, bool sync);

/* remap.c */
long hybd_remap_barrier(struct hybd_dev *dev);

/* owner.c */
extern const struct attribute_group *hybd_disk_groups[];
u64 hybd_owner_charge(const struct hybd_params *p);
int hybd_owner_check(struct hybd_params *p, u32 *err);
int hybd_owner_init(struct hybd_dev *dev);
void hybd_owner_release(struct hybd_dev *dev);
bool hybd_owner_may_manage(struct hybd_dev *dev);
int hybd_owner_may_use_file(struct hybd_dev *dev, struct file *file,
			    bool write);
void hybd_owner_fill_info(struct hybd_dev *dev, struct hybd_dev_info *info);
char *hybd_srv_devnode(const struct device *d, umode_t *mode, kuid_t *uid,
		       kgid_t *gid);

/* resize.c */
int hybd_dev_resize(struct hybd_dev *dev, u64 size, bool ask);
long hybd_srv_resize(struct hybd_dev *dev, void __user *arg);
long hybd_ctl_resize(void __user *arg);
void hybd_resize_wake(struct hybd_dev *dev);

/* remap.c */
void hybd_remap_init_queue(struct hybd_queue *q);
bool hybd_dev_write_cached(struct hybd_dev *dev);
bool hybd_bdev_writable(struct block_device *bdev);
int hybd_remap_prepare(struct hybd_queue *q, struct hybd_tag *t, u32 index,
		       u64 offset);
void hybd_remap_drop(struct hybd_queue *q, struct hybd_tag *t);
void hybd_remap_unuse(struct hybd_dev *dev, struct hybd_backing *target,
		      u32 op);
bool hybd_remap_start(struct hybd_queue *q, struct hybd_tag *t, bool last);
bool hybd_remap_flush_needed(struct hybd_dev *dev);
void hybd_remap_sync_first(struct hybd_queue *q, struct hybd_tag *t,
			   int verdict);
void hybd_remap_issue(struct hybd_queue *q, struct hybd_tag *t);
int hybd_remap_init(void);
void hybd_remap_exit(void);
int hybd_remap_end(struct hybd_queue *q, struct request *rq);
int hybd_remap_prepare_front(struct hybd_front_io *f, u32 index, u64 offset);

/* ring.c */
extern const struct file_operations hybd_srv_fops;
int hybd_queue_alloc(struct hybd_dev *dev, struct hybd_queue *q,
		     unsigned int id);
void hybd_queue_free(struct hybd_queue *q);
void hybd_queue_wake(struct hybd_queue *q);
void hybd_queue_signal_armed(struct hybd_queue *q);
int hybd_queue_commit(struct hybd_queue *q);
size_t hybd_queue_area_size(const struct hybd_params *p, u32 ring_entries,
			    u32 *sq_off, u32 *cq_off, u32 *desc_off,
			    u32 *data_off);

#endif /* _HYBD_H */
