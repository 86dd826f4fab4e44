/* SPDX-License-Identifier: MIT */
/*
 * libhybd - write the slow path of a hybd block driver in user space.
 *
 * A driver fills a struct hybd_config and a struct hybd_driver (one handler
 * per operation), creates the device, starts it and waits:
 *
 *	hybd_config_init(&cfg);
 *	cfg.size = 64 << 20;
 *	hybd_dev_create(&cfg, &my_driver, my_state, &dev);
 *	hybd_dev_start(dev);		// /dev/hybdN exists from here on
 *	hybd_dev_wait(dev);		// until the device is deleted
 *	hybd_dev_delete(dev);
 *
 * or, for the common case, in one call that also owns SIGINT/SIGTERM:
 *
 *	hybd_config_init(&cfg);
 *	cfg.size = 64 << 20;
 *	return hybd_run(&cfg, &my_driver, my_state) ? 1 : 0;
 *
 * Threads.  The library runs one worker thread per hardware queue, beside
 * the CPUs that submit to that queue (HYBD_CFG_QUEUE_AFFINITY pins it on
 * them).  A worker calls the handlers for
 * the requests of its queue, one at a time; handlers of different queues
 * run concurrently.  A handler that blocks holds its whole queue, so there
 * are two ways to reach a real queue depth:
 *
 *  - asynchronous handlers: return HYBD_IO_ASYNC and complete later with
 *    hybd_io_complete().  A backend with a file descriptor (an io_uring, a
 *    socket) is served by the same worker: register the fd from the
 *    queue_init() hook with hybd_queue_watch_fd(), and the worker waits for
 *    the queue's submissions and that fd at once, calling your callback
 *    when the fd is readable.  Completions made in the worker thread are
 *    handed to the kernel in one system call per batch.
 *  - a thread pool: hybd_config.queue_threads = N runs the handlers of each
 *    queue in N threads, so N blocking handlers can be in flight per queue.
 *    By default a worker with a pool runs on one CPU with the pool's
 *    threads (hybd_dev_start()), so that handing a request over wakes no
 *    other CPU: the pool overlaps handlers that wait, not ones that
 *    compute.  A driver whose handlers compute on large requests spreads
 *    that work itself, as examples/encrypt's crypto helpers do (threads of
 *    its own, not pinned), or sets HYBD_CFG_POOL_SPREAD.
 *
 * Compatibility.  struct hybd_driver and struct hybd_config may grow: the
 * hybd_dev_create() and hybd_run() macros pass the sizes the caller was
 * compiled with, and the library reads no field beyond them, so a binary
 * built against an older hybd.h keeps working with a newer libhybd.
 *
 * Errors: every function that can fail returns a negative errno value and
 * never sets errno.  A human-readable explanation of the last failure in the
 * calling thread is available from hybd_errmsg().
 */
#ifndef LIBHYBD_HYBD_H
#define LIBHYBD_HYBD_H

#include <stdint.h>

#include "uapi/hybd.h"

#ifdef __cplusplus
extern "C" {
#endif

#include <stddef.h>

#define HYBD_LIB_VERSION_MAJOR	1
#define HYBD_LIB_VERSION_MINOR	16
/* what hybd_lib_version() returns for a given version */
#define HYBD_LIB_VERSION(major, minor)	(((major) << 16) | (minor))

/* A device served by this process (opaque). */
struct hybd_dev;
/* One hardware queue of such a device, and its worker (opaque). */
struct hybd_queue;
/* One request handed to a handler (opaque). */
struct hybd_io;

/*
 * hybd_lib_version - the version of the libhybd actually running, which
 * may be newer than the hybd.h a program was built with.
 * RETURN VALUE: HYBD_LIB_VERSION(major, minor).
 */
unsigned int hybd_lib_version(void);

/* hybd_config.lib_flags */
#define HYBD_CFG_NO_AFFINITY	(1U << 0)	/* do not pin workers to CPUs */
/*
 * Since 1.6: hybd_dev_create() (and hybd_run()) take over the existing
 * device dev_id instead of adding one: a device WAITING for a new server
 * (its server died in recovery mode), or a live one, whose server is asked
 * to hand over (HYBD_CTL_HANDOVER: it drains and exits) first.  The
 * device keeps its own parameters: the config's size, if set, must match
 * them, and the driver must have a handler for each of the device's ops;
 * the other device fields of the config are ignored.  hybd_dev_start()
 * then resumes the device: the requests the old server left are issued
 * again to the new one.  Needs HYBD_F_RECOVERY.
 */
#define HYBD_CFG_ATTACH		(1U << 1)
/*
 * Since 1.8: pin each worker on the CPUs that submit to its queue, the
 * placement before 1.8 (see hybd_dev_start()).  Best only when the
 * submitters leave those CPUs idle between requests.
 */
#define HYBD_CFG_QUEUE_AFFINITY	(1U << 2)
/*
 * Since 1.12: a worker with a pool and the pool's threads run where the
 * worker alone would (beside the queue's CPUs, the placement before 1.12),
 * not on one CPU of those (see hybd_dev_start()).  For pools whose
 * handlers compute more than they wait.
 */
#define HYBD_CFG_POOL_SPREAD	(1U << 3)

/*
 * Device parameters.  Always start from hybd_config_init(); the kernel checks
 * every value against the limits in uapi/hybd.h and hybd_errmsg() names the
 * one it refused.
 */
struct hybd_config {
	uint64_t size;			/* bytes; no default, must be set */
	uint32_t logical_block_size;	/* bytes */
	uint32_t physical_block_size;	/* bytes; 0: same as logical */
	uint32_t max_io_bytes;		/* largest request, per tag buffer */
	uint32_t nr_queues;		/* hardware queues = worker threads */
	uint32_t queue_depth;		/* requests in flight per queue */
	uint32_t ops;			/* HYBD_OPF_* the device accepts */
	uint32_t flags;			/* HYBD_DEV_F_* */
	/*
	 * How long a worker that runs out of requests busy-polls for more
	 * before it sleeps: the workers here, and with HYBD_DEV_F_REMAP_POLL
	 * in @flags the kernel's remap workers, which poll only while their
	 * CPU has nothing else to run.  CPU spent to spare submitters a
	 * sleeping worker's wakeup.  0 (default): never; at most 1 ms.
	 */
	uint32_t poll_ns;
	int32_t dev_id;			/* wanted N of /dev/hybdN; -1: any */
	uint32_t lib_flags;		/* HYBD_CFG_* */
	uint32_t max_discard_bytes;	/* 0: kernel default */
	uint32_t discard_granularity;	/* 0: logical block size */
	uint32_t max_write_zeroes_bytes; /* 0: kernel default */
	uint32_t io_timeout;		/* seconds a request may take; 0: none */
	/* since 1.3 */
	uint32_t queue_threads;		/* handler threads per queue; 0, 1: the
					 * worker itself (at most 256) */
	uint32_t io_priv_size;		/* bytes of hybd_io_data() per request
					 * (at most 1 MiB) */
	/* since 1.6 */
	uint32_t recovery_timeout;	/* seconds to hold I/O for a new
					 * server when this one dies; 0: fail
					 * it at once (HYBD_F_RECOVERY) */
	uint32_t reserved[6];		/* zero (set by hybd_config_init) */
};

/* hybd_config_init()'s memory budget: at most this many queues... */
#define HYBD_DEFAULT_QUEUES_MAX	8
/* ...each of HYBD_DEFAULT_DEPTH requests of up to HYBD_DEFAULT_MAX_IO */
#define HYBD_DEFAULT_DEPTH	64
#define HYBD_DEFAULT_MAX_IO	(128U << 10)

/*
 * hybd_config_init - fill @cfg with the defaults.
 *
 * size 0 (the caller must set it), 4 KiB logical and physical blocks, one
 * queue per online CPU up to HYBD_DEFAULT_QUEUES_MAX (blk-mq maps several
 * CPUs to a queue beyond that), depth 64, 128 KiB max I/O (larger requests
 * are split by the block layer), no busy-polling, a 30 s I/O timeout (a
 * request the handlers have not completed by then fails with EIO), any
 * device id, workers placed beside their queues' CPUs (hybd_dev_start()),
 * handlers run by the worker.
 *
 * Memory: each queue pins depth * max_io bytes of kernel memory shared with
 * the server (plus its rings), so these defaults pin at most 8 MiB per
 * queue and 64 MiB per device, whatever the number of CPUs; the kernel
 * refuses more than HYBD_MAX_DEV_BUF per device.  `hybdctl info` shows the
 * figure (mem_bytes).
 *
 * Operations: ops is 0, which means "what the driver's handlers support"
 * (see struct hybd_driver), and flags is HYBD_DEV_F_WRITE_CACHE, which
 * means "a volatile write cache if the driver has a .flush handler".
 * Clear HYBD_DEV_F_WRITE_CACHE to refuse flush and FUA; set ops to choose
 * the operations explicitly (each then needs its handler).  Without a
 * driver (hybd_ctl_add()), ops 0 means every operation.
 */
void hybd_config_init(struct hybd_config *cfg);

/*
 * What a handler returns: 0 on success, a negative errno on failure (the
 * request fails with an I/O error), or HYBD_IO_ASYNC when it keeps the
 * request and completes it later with hybd_io_complete().  Any other value
 * fails the request with -EIO.
 */
#define HYBD_IO_ASYNC	1

/*
 * What a handler's negative errno becomes for the reader (the block layer's
 * status): -EOPNOTSUPP, -ENOSPC, -ENODATA (a medium error), -ETIMEDOUT and
 * -EILSEQ (an integrity error) keep their meaning; every other errno is an
 * I/O error (EIO).  -EAGAIN and -ENOMEM do not mean "retry": the request
 * fails.  ENOSPC reaches a writer as ENOSPC, the others as EIO.
 */

/*
 * The driver: one handler per operation, and optional hooks.  The
 * operations the device offers follow the handlers (unless
 * hybd_config.ops says otherwise): .read is mandatory, .write makes the
 * device writable, .flush gives it a volatile write cache with flush and
 * FUA (a write with HYBD_IO_F_FUA must be durable when it completes;
 * without .flush, every completed write must be durable), .discard and
 * .write_zeroes offer those.  A request for an operation whose handler is
 * NULL fails with -EOPNOTSUPP; hybd_dev_create() refuses explicit ops that
 * announce an operation without its handler.
 *
 * Offsets and lengths are in bytes, and the library has checked them:
 * [offset, offset + len) lies on the device, and a read or write is 1 to
 * max_io_bytes long (a malformed request fails with -EIO before any
 * handler sees it).  @buf is the request's data buffer in the shared ring;
 * it stays valid until the request is completed.  discard and write_zeroes
 * carry no data and may be longer than max_io_bytes.  A write with
 * HYBD_IO_F_FUA in hybd_io_flags() must be durable when it completes.
 */
struct hybd_driver {
	int (*read)(struct hybd_io *io, void *buf, uint64_t offset,
		    uint32_t len);
	int (*write)(struct hybd_io *io, const void *buf, uint64_t offset,
		     uint32_t len);
	int (*flush)(struct hybd_io *io);
	int (*discard)(struct hybd_io *io, uint64_t offset, uint32_t len);
	int (*write_zeroes)(struct hybd_io *io, uint64_t offset, uint32_t len);

	/* since 1.3; every hook is optional */

	/*
	 * queue_init - called in each worker thread before it serves its
	 * queue, e.g. to set up a per-queue io_uring: hybd_queue_set_priv(),
	 * hybd_queue_watch_fd().  A negative errno fails hybd_dev_start().
	 */
	int (*queue_init)(struct hybd_queue *q);
	/*
	 * queue_exit - called in the worker thread when it stops, after its
	 * thread pool (if any) has stopped; only for queues whose
	 * queue_init succeeded.  Requests still kept (HYBD_IO_ASYNC) must
	 * not be completed after it returns.
	 */
	void (*queue_exit)(struct hybd_queue *q);
	/*
	 * queue_idle - called in the worker thread when it has handed every
	 * visible request to a handler and is about to wait, and while it
	 * hands the queue over to a new server: the place to submit a batch
	 * of backend I/O prepared by the handlers (one io_uring_submit() for
	 * all of them).  It may be called with nothing prepared.
	 */
	void (*queue_idle)(struct hybd_queue *q);
	/*
	 * ready - hybd_run() only: called once /dev/hybdN exists (after
	 * hybd_dev_start()), e.g. to print its name or tell a supervisor.
	 */
	void (*ready)(struct hybd_dev *dev);

	/* since 1.4 */

	/*
	 * prepare - hybd_run() only: called once the device is added (its
	 * id is known: hybd_dev_id()) and before hybd_dev_start(), so that
	 * no request can arrive yet: the place to attach a fast path and
	 * seed its maps from the driver's own state.  It runs in the
	 * thread that called hybd_run(), with SIGINT and SIGTERM blocked,
	 * before any worker exists (so before queue_init).  A negative
	 * errno (a positive value is -EINVAL) ends hybd_run() with it and
	 * the device is deleted; hybd_errmsg() then names the hook, so
	 * report the details from the hook itself.
	 */
	int (*prepare)(struct hybd_dev *dev);

	/* since 1.10 */

	/*
	 * resize - someone asks for the device to become @size bytes
	 * (hybd_ctl_resize(), `hybdctl resize`): may it?  Return 0 to
	 * accept, or a negative errno to refuse (the resize then fails with
	 * it, and nothing changes).  To accept a grow, have the storage for
	 * the new blocks ready: they may be read and written as soon as the
	 * hook returns.  To accept a shrink, let go of nothing yet: the
	 * resize can still fail after the answer (the requests in flight do
	 * not end in time, the caller is interrupted), and the blocks beyond
	 * the new end are then still the device's; the resized hook says
	 * when it happened.  Called in queue 0's worker while all workers
	 * serve (requests anywhere on the device may run meanwhile).
	 * Answer within the device's I/O timeout (30 s without one).  A
	 * driver with this hook gets HYBD_DEV_F_RESIZE (if the module can
	 * resize); without it, only the driver itself resizes
	 * (hybd_dev_resize()).
	 */
	int (*resize)(struct hybd_dev *dev, uint64_t size);

	/*
	 * resized - the device is now @new_size bytes, no longer @old_size:
	 * the kernel has committed a resize (asked through the resize hook,
	 * or made by the driver with hybd_dev_resize()).  After a shrink, no
	 * request beyond @new_size is in flight and none can come: the
	 * driver may now let go of what lies beyond.  Called once per
	 * change, in order, never two at once: in queue 0's worker, or for
	 * the driver's own hybd_dev_resize() in its caller's thread before
	 * it returns.  hybd_dev_size() is @new_size.  Optional.
	 */
	void (*resized)(struct hybd_dev *dev, uint64_t old_size,
			uint64_t new_size);
};

/*
 * hybd_dev_create - add a device and prepare to serve it.  (A macro: the
 * library learns the sizes of @cfg and @drv that the caller knows.)
 *
 * Adds the device through /dev/hybd-control, opens its server node
 * /dev/hybdN-srv and maps the rings of every queue.  No block device exists
 * yet: call hybd_dev_start().  @drv is copied; @priv is returned by
 * hybd_dev_priv() and hybd_io_priv().
 *
 * RETURN VALUE: 0 and *@devp set, or a negative errno: -ENOENT when the
 * module is not loaded, -EINVAL for a parameter the kernel (or the
 * library: io_priv_size, queue_threads, explicit ops without their
 * handler, structs smaller than libhybd 1.0's) refused, -E2BIG when the
 * caller's structs set fields this (older) libhybd does not know.
 * queue_threads above queue_depth is lowered to it.
 */
#define hybd_dev_create(cfg, drv, priv, devp)				\
	hybd_dev_create_sized((cfg), sizeof(*(cfg)), (drv), sizeof(*(drv)), \
			      (priv), (devp))
int hybd_dev_create_sized(const struct hybd_config *cfg, size_t cfg_size,
			  const struct hybd_driver *drv, size_t drv_size,
			  void *priv, struct hybd_dev **devp);

/*
 * hybd_run - create, start and serve a device until it is deleted or the
 * process gets SIGINT or SIGTERM, then delete it (gracefully: the kernel
 * writes back what it holds through the workers first).  (A macro, like
 * hybd_dev_create().)
 *
 * Blocks SIGINT and SIGTERM in the calling thread (the caller's mask is
 * restored on return) and takes them through a signalfd: call it from the
 * main thread before creating other threads, or block them in those too.
 * Calls @drv->ready once the block device exists, and, when NOTIFY_SOCKET
 * is set (systemd Type=notify), sends READY=1 there.
 *
 * RETURN VALUE: 0 after a signal or a delete from outside (`hybdctl del`),
 * or a negative errno: the device could not be created or started, or a
 * worker failed (see hybd_errmsg()).
 */
#define hybd_run(cfg, drv, priv)					\
	hybd_run_sized((cfg), sizeof(*(cfg)), (drv), sizeof(*(drv)), (priv))
int hybd_run_sized(const struct hybd_config *cfg, size_t cfg_size,
		   const struct hybd_driver *drv, size_t drv_size, void *priv);

/*
 * hybd_dev_start - start the workers, then the block device.
 *
 * Spawns one worker thread per queue with every signal blocked; waits for
 * each queue_init hook; then asks the
 * kernel to add /dev/hybdN.  That blocks while the
 * kernel scans the partition table, which the workers already serve.  A
 * device is started once.
 *
 * Where the workers run: beside their submitters.  blk-mq sends a queue
 * the requests submitted on its CPUs (hybd_queue_cpus()); a worker that
 * shared those CPUs would take turns with its submitter, one request per
 * turn.  So each worker may run on every CPU the process may use except
 * its own queue's, and the scheduler picks an idle one; with one queue
 * (or nothing beside) it may run anywhere the process may.
 *
 * Since 1.12 a worker with a pool (queue_threads > 1) runs on one of those
 * CPUs, its home, with the pool's threads: a pool thread free to run
 * elsewhere is woken on an idle CPU, an idle CPU's wakeup per request.
 * The home is the first CPU beside the queue's own, counting up from them
 * and going round, that no other queue of the device has taken (if any is
 * left); with nothing beside, one counting down from the last CPU the
 * process may use, by device id and queue.  Threads that a queue_init hook
 * or a handler starts inherit the home: pin them elsewhere if they
 * compute.  The cost: the pool's handlers share one CPU, and a submitter
 * the scheduler leaves on that CPU takes turns with them;
 * HYBD_CFG_POOL_SPREAD gives pools the worker's placement without one.
 *
 * Not pinned at all with HYBD_CFG_NO_AFFINITY; on the queue's own CPUs
 * with HYBD_CFG_QUEUE_AFFINITY (the placement before 1.8), pool and all.
 *
 * RETURN VALUE: 0, or a negative errno (workers are stopped again):
 * -EALREADY if started before, what a queue_init hook returned.
 */
int hybd_dev_start(struct hybd_dev *dev);

/*
 * hybd_dev_stop - stop and join the workers.
 *
 * Requests that arrive afterwards wait until the device is deleted (then
 * they fail).  Completions of requests a handler kept (HYBD_IO_ASYNC) are
 * still accepted.  Use hybd_dev_delete() for an orderly shutdown.
 *
 * RETURN VALUE: 0, or -EINVAL if the device was never started.
 */
int hybd_dev_stop(struct hybd_dev *dev);

/*
 * hybd_dev_wait - wait until every worker has exited.
 *
 * Workers exit when the device is deleted (by hybd_ctl_del() from another
 * thread, or `hybdctl del`), when hybd_dev_stop() is called, or on an
 * unexpected error.  May run in another thread than the other hybd_dev_*
 * calls, including hybd_dev_delete().
 *
 * They also exit, one queue after the other, when a new server takes the
 * device over (HYBD_CFG_ATTACH in another process): each worker stops
 * taking requests, waits for the ones its handlers hold (asynchronous ones
 * too) and hands their completions to the kernel; what it did not take
 * goes to the new server.  hybd_dev_handed_over() then says so, and
 * hybd_dev_delete() lets the device go without deleting it.
 *
 * RETURN VALUE: 0 if the workers exited because the device went away, was
 * stopped or handed over, the negative errno that made a worker give up
 * otherwise, -EINVAL if the device was never started.
 */
int hybd_dev_wait(struct hybd_dev *dev);

/*
 * hybd_dev_add_backing - register @fd, an open regular file or block
 * device, as a backing target of @dev, where a fast path may serve
 * requests in the kernel (since 1.6; HYBD_F_BACKING).  @flags:
 * HYBD_BACKING_F_WRITE if requests may write to it (@fd must be open for
 * writing, without O_APPEND, and not be an append-only file: remapped
 * writes go where their requests say).  The kernel keeps its own
 * reference: @fd may be closed.  It must support direct I/O, and the
 * device's logical block size must be a multiple of the alignment that
 * needs.  *@size (if not NULL) is set to the
 * target's size in bytes.  Targets go when the device's server node is
 * closed (the process exits or hands over).
 * RETURN VALUE: the target's index (0 .. HYBD_MAX_BACKINGS - 1), or -errno
 * (see HYBD_SRV_ADD_BACKING in uapi/hybd.h; hybd_errmsg() says which).
 */
int hybd_dev_add_backing(struct hybd_dev *dev, int fd, unsigned int flags,
			 uint64_t *size);

/*
 * hybd_dev_del_backing - drop backing target @index of @dev.
 * RETURN VALUE: 0, or -errno (-ENOENT: no target there).
 */
int hybd_dev_del_backing(struct hybd_dev *dev, unsigned int index);

/*
 * hybd_dev_remap_barrier - wait until every remap a fast path made before
 * the call has completed (since 1.7; HYBD_F_REMAP).  A server that moves
 * data a program remaps to updates the program's map, calls this, and
 * only then overwrites or reuses the old place: no remap still reads it.
 * After hybd_dev_del_backing() it also means the kernel no longer uses
 * the deleted target's file, and has synced what remapped writes left
 * there.  Waits as long as the backing I/O takes.
 * RETURN VALUE: 0, or -errno (a sync of a deleted target failed).
 */
int hybd_dev_remap_barrier(struct hybd_dev *dev);

/*
 * hybd_dev_serving - are the device's workers serving it?  (Since 1.16.)
 * Workers stop when the device is deleted (from anywhere), stopped,
 * handed over, or on an error (hybd_dev_wait() says which).  A binding
 * that must know whether hybd_dev_delete() will drain gracefully through
 * the workers (completions still flowing) or fail what is outstanding
 * asks this first.
 * RETURN VALUE: 1 while at least one worker runs, else 0.
 */
int hybd_dev_serving(struct hybd_dev *dev);

/*
 * hybd_dev_handed_over - did a new server take the device over?  (Since
 * 1.6.)  RETURN VALUE: 1 once a worker has handed its queue over, else 0.
 */
int hybd_dev_handed_over(const struct hybd_dev *dev);

/*
 * hybd_dev_delete - delete the device and free @dev.
 *
 * While the workers run, this is graceful: the kernel removes /dev/hybdN,
 * completing every outstanding request through the workers (asynchronous
 * ones too), then the workers exit.  If that fails (-EINTR, ...) nothing
 * changed and @dev stays valid.
 *
 * A device this process handed over to a new server is not deleted: @dev
 * is freed and its server node closed, and the new server serves on.
 *
 * If the device is not being served (never started, stopped, or workers
 * exited), @dev is freed in every case: its rings are unmapped and the
 * server node closed, which fails whatever is outstanding, and the return
 * value says whether the kernel device could be deleted.  No handler may
 * call hybd_io_complete() after that.
 *
 * RETURN VALUE: 0 (also when someone else deleted the device already), or a
 * negative errno.
 */
int hybd_dev_delete(struct hybd_dev *dev);

/* hybd_dev_id - N of /dev/hybdN.  RETURN VALUE: the id (>= 0). */
int hybd_dev_id(const struct hybd_dev *dev);

/* hybd_dev_path - RETURN VALUE: "/dev/hybdN", valid as long as @dev. */
const char *hybd_dev_path(const struct hybd_dev *dev);

/*
 * hybd_dev_config - the device's configuration as the kernel made it
 * (since 1.9): the driver's struct hybd_config with every default
 * resolved (nr_queues, queue_depth, max_io_bytes, block sizes, ops and
 * flags as offered, the discard and write-zeroes limits as the kernel
 * applies them), the device's id, and with HYBD_CFG_ATTACH the existing
 * device's own parameters.  Valid as long as @dev; a handler reaches it through
 * hybd_queue_dev(hybd_io_hwq(io)).
 */
const struct hybd_config *hybd_dev_config(const struct hybd_dev *dev);

/*
 * hybd_dev_size - the device's size in bytes now (since 1.10): as
 * created, then as resized (hybd_dev_resize(), a resize the kernel
 * committed; while the resize hook's accepted grow waits for the kernel,
 * already the new size).  hybd_dev_config()->size follows it too.  The
 * library fails requests beyond it with -EIO before any handler sees
 * them.
 */
uint64_t hybd_dev_size(const struct hybd_dev *dev);

/*
 * hybd_dev_resize - the driver resizes its own live device to @size bytes
 * (since 1.10; HYBD_F_RESIZE), under I/O: grow once the storage for the
 * new blocks is ready, shrink before letting go of the old ones.  A
 * shrink first waits for the requests in flight to end, holding new ones
 * back: not from a worker (-EDEADLK), whose own requests it would wait
 * for.  It is refused while a fast path is attached (-EBUSY), which could
 * otherwise serve blocks beyond the new end after a later grow.  The
 * resize hook is not called; the resized hook is, as for every change
 * (here, in the caller's thread, before it returns).  The block layer sees
 * the new size at once and announces it (a change uevent with RESIZE=1).
 * RETURN VALUE: 0 or -errno (include/uapi/hybd.h, HYBD_SRV_RESIZE).
 */
int hybd_dev_resize(struct hybd_dev *dev, uint64_t size);

/* hybd_dev_priv - RETURN VALUE: the @priv given to hybd_dev_create(). */
void *hybd_dev_priv(const struct hybd_dev *dev);

/*
 * hybd_io_complete - complete a request a handler kept (HYBD_IO_ASYNC).
 *
 * @result is 0 or a negative errno.  Callable from any thread, once per
 * request; a second call for the same request is ignored.  From the
 * queue's worker (a watched fd's callback, queue_idle, a handler), the
 * completion goes to the kernel with the worker's next system call,
 * batched with the others; from any other thread, immediately (one system
 * call).  @io must not be used afterwards.
 */
void hybd_io_complete(struct hybd_io *io, int result);

/*
 * hybd_io_complete_batch - complete @n kept requests, @ios[i] with
 * @results[i], handing them to the kernel with one system call per run
 * of consecutive requests of the same queue (none from that queue's
 * worker thread, as above): group them by queue.  Callable from any
 * thread.
 */
void hybd_io_complete_batch(struct hybd_io *const *ios, const int *results,
			    unsigned int n);

/*
 * hybd_io_data - the request's private data: hybd_config.io_priv_size
 * bytes, 64-byte aligned, one area per tag (reused by the tag's next
 * request: the library does not clear it).  NULL if io_priv_size is 0.
 */
void *hybd_io_data(const struct hybd_io *io);
/* RETURN VALUE: the request's byte offset on the device. */
uint64_t hybd_io_offset(const struct hybd_io *io);
/* RETURN VALUE: its length in bytes (0 for a flush). */
uint32_t hybd_io_len(const struct hybd_io *io);
/* RETURN VALUE: its data buffer (read, write), NULL for other operations. */
void *hybd_io_buf(const struct hybd_io *io);
/* RETURN VALUE: the hardware queue the request came on. */
struct hybd_queue *hybd_io_hwq(const struct hybd_io *io);

/*
 * Queues.  A worker serves each hardware queue; its hooks and a watched
 * fd's callbacks run in that thread.
 */

/* RETURN VALUE: queue @index of @dev (0..nr_queues-1), NULL if none. */
struct hybd_queue *hybd_dev_queue(struct hybd_dev *dev, unsigned int index);
/* RETURN VALUE: the number of hardware queues of @dev. */
unsigned int hybd_dev_nr_queues(const struct hybd_dev *dev);
/* RETURN VALUE: the queue's index. */
unsigned int hybd_queue_index(const struct hybd_queue *q);
/* RETURN VALUE: the device the queue belongs to. */
struct hybd_dev *hybd_queue_dev(const struct hybd_queue *q);
/* Store @priv for this queue (NULL until set); hybd_queue_priv() gets it. */
void hybd_queue_set_priv(struct hybd_queue *q, void *priv);
/* RETURN VALUE: what hybd_queue_set_priv() stored. */
void *hybd_queue_priv(const struct hybd_queue *q);

/* A watched fd became readable (or has an error): see hybd_queue_watch_fd */
typedef void (*hybd_fd_cb)(struct hybd_queue *q, int fd, void *arg);

/* at most this many fds per queue */
#define HYBD_QUEUE_MAX_FDS	8

/*
 * hybd_queue_watch_fd - make the queue's worker wait for @fd too.
 *
 * From then on the worker sleeps in poll() on the queue's submissions (an
 * eventfd the kernel signals) and on each watched fd, and calls
 * @cb(q, fd, @arg) in the worker thread whenever @fd is readable (POLLIN,
 * or POLLERR/POLLHUP); @cb must consume what made it readable, or it is
 * called again at once.  For an io_uring, watch its ring fd (POLLIN when
 * completions are waiting) and reap them in @cb.  Call it from the
 * worker thread: the first fd from queue_init (the worker chooses how it
 * waits before serving), more from queue_init or later.  A watched fd
 * that is closed while watched stops the worker (-EBADF).  The fd stays
 * the caller's to close, after the worker stopped (queue_exit).
 *
 * RETURN VALUE: 0, -EINVAL (bad fd, no @cb, not the worker thread, a first
 * fd after queue_init), -ENOSPC (more than HYBD_QUEUE_MAX_FDS),
 * -EOPNOTSUPP (the module lacks HYBD_F_EVENTFD).
 */
int hybd_queue_watch_fd(struct hybd_queue *q, int fd, hybd_fd_cb cb,
			void *arg);

/*
 * A watched fd is ready (since 1.11): @revents is what poll() reported for
 * it, the events asked for that fired (POLLIN, POLLOUT, POLLPRI) and
 * POLLERR or POLLHUP, which poll() reports whatever was asked.
 */
typedef void (*hybd_fd_events_cb)(struct hybd_queue *q, int fd,
				  unsigned int revents, void *arg);

/*
 * hybd_queue_watch_fd_events - hybd_queue_watch_fd() for the events of
 * your choice (since 1.11): @events is a mask of POLLIN, POLLOUT and
 * POLLPRI (0 waits for errors and hangups only), and @cb is told which
 * fired.  A socket whose client library has to send before it can read
 * (libnbd: nbd_aio_get_direction()) asks for POLLOUT while its send
 * buffer is full, and only then: a socket that can be written is always
 * POLLOUT, so the worker would call @cb at once, again and again.  The
 * rules of hybd_queue_watch_fd() hold otherwise (the worker thread, the
 * first fd from queue_init, HYBD_QUEUE_MAX_FDS).
 * RETURN VALUE: 0, or those of hybd_queue_watch_fd(), -EINVAL for other
 * events, -EEXIST if the queue watches @fd already.
 */
int hybd_queue_watch_fd_events(struct hybd_queue *q, int fd,
			       unsigned int events, hybd_fd_events_cb cb,
			       void *arg);

/*
 * hybd_queue_fd_events - change the events the worker waits for on
 * watched @fd (since 1.11; any fd watched by either call), from the
 * worker thread (a callback, a handler, queue_idle).  Takes effect at the
 * worker's next wait; cheap enough to call after every request.
 * RETURN VALUE: 0, -EINVAL (not the worker thread, bad events), -ENOENT
 * (the queue does not watch @fd).
 */
int hybd_queue_fd_events(struct hybd_queue *q, int fd, unsigned int events);

/*
 * hybd_queue_unwatch_fd - stop watching @fd (since 1.11), from the worker
 * thread, e.g. before closing a connection that will be replaced by a new
 * one (watched again with hybd_queue_watch_fd_events()): a watched fd
 * closed while watched stops the worker.  The callback is not called for
 * @fd once this returns, and its slot is free again at the next wait.  The
 * worker stays in event mode with no fd watched.
 * RETURN VALUE: 0, -EINVAL (not the worker thread), -ENOENT (not watched).
 */
int hybd_queue_unwatch_fd(struct hybd_queue *q, int fd);

/*
 * hybd_queue_cpus - the CPUs that submit to queue @index of @dev (blk-mq's
 * mapping), the ones its worker is pinned to.  Stores up to @room CPU
 * numbers in @cpus, in ascending order.
 * RETURN VALUE: how many CPUs map to the queue (may exceed @room), or
 * -errno (-EOPNOTSUPP: the module lacks HYBD_F_QUEUE_CPUS, -EINVAL: no
 * such queue).
 */
int hybd_queue_cpus(const struct hybd_dev *dev, unsigned int index,
		    unsigned int *cpus, unsigned int room);

/* Request accessors: valid from the handler call until completion. */
/* RETURN VALUE: enum hybd_io_op (HYBD_OP_READ, ...). */
enum hybd_io_op hybd_io_op(const struct hybd_io *io);
/* RETURN VALUE: HYBD_IO_F_* (FUA, NOUNMAP, SYNC, META). */
uint32_t hybd_io_flags(const struct hybd_io *io);
/* RETURN VALUE: the hardware queue, 0..nr_queues-1. */
unsigned int hybd_io_queue(const struct hybd_io *io);
/* RETURN VALUE: the tag, 0..queue_depth-1, unique in the queue while open. */
unsigned int hybd_io_tag(const struct hybd_io *io);
/* RETURN VALUE: the device the request belongs to. */
struct hybd_dev *hybd_io_dev(const struct hybd_io *io);
/* RETURN VALUE: the device's @priv (see hybd_dev_create()). */
void *hybd_io_priv(const struct hybd_io *io);

/*
 * Control node helpers (/dev/hybd-control), for tools and tests.  Each opens
 * the control node for the duration of the call; -ENOENT means the module is
 * not loaded.
 */

/* hybd_ctl_features - ABI version and HYBD_F_* bits.  RETURN VALUE: 0/-errno */
int hybd_ctl_features(struct hybd_ctl_features *f);

/*
 * hybd_ctl_list - ids of the existing devices.
 *
 * Stores up to @room ids in @ids (which may be NULL if @room is 0).
 * RETURN VALUE: the number of devices, which may exceed @room, or -errno.
 */
int hybd_ctl_list(uint32_t *ids, uint32_t room);

/* hybd_ctl_info - state, parameters, counters.  RETURN VALUE: 0 or -errno. */
int hybd_ctl_info(uint32_t id, struct hybd_dev_info *info);

/*
 * hybd_ctl_stats - the device's counters and latency histograms.
 *
 * Fills @st with the totals over all hardware queues (st->total) and the
 * number of queues (st->nr_queues); stores up to @room per-queue entries in
 * @queues (which may be NULL if @room is 0).  Counters only grow while the
 * device exists; subtract two snapshots for rates.
 * RETURN VALUE: the number of hardware queues, which may exceed @room, or
 * -errno (-ENODEV: no such device).
 */
int hybd_ctl_stats(uint32_t id, struct hybd_ctl_stats *st,
		   struct hybd_queue_stat *queues, uint32_t room);

/*
 * hybd_ctl_del - delete device @id.  A served device is drained through its
 * server first; its workers then exit.  A server that does not complete
 * what is outstanding holds the delete up to the device's I/O timeout.
 * RETURN VALUE: 0 or -errno (-EINTR: a signal interrupted the wait; the
 * delete goes on in the kernel).
 */
int hybd_ctl_del(uint32_t id);

/*
 * hybd_ctl_del_flags - hybd_ctl_del() with HYBD_DEL_F_* flags:
 * HYBD_DEL_F_FORCE fails every outstanding request at once (data not yet
 * written by the server is lost), also for a delete already under way.
 * RETURN VALUE: 0 or -errno (-EOPNOTSUPP: a flag the kernel does not know).
 */
int hybd_ctl_del_flags(uint32_t id, uint32_t flags);

/*
 * hybd_ctl_handover - ask the server of live device @id to drain and exit,
 * so that a new server can take it over (since 1.6; HYBD_F_RECOVERY).  The
 * device then holds its I/O for the new server (HYBD_CFG_ATTACH) for its
 * recovery timeout, or HYBD_HANDOVER_TIMEOUT seconds if it has none.
 * RETURN VALUE: 0 (also if the device has no server), or -errno (-ENODEV:
 * no such device, or it is not live).
 */
int hybd_ctl_handover(uint32_t id);

/*
 * hybd_ctl_resize - resize live device @id to @size bytes (since 1.10;
 * HYBD_F_RESIZE): its server's resize hook is asked first, and may refuse.
 * A shrink is refused while a fast path is attached.  Needs a server with a
 * resize hook (-EOPNOTSUPP otherwise).
 * RETURN VALUE: 0 or -errno, hybd_errmsg() saying why in words
 * (include/uapi/hybd.h, HYBD_CTL_RESIZE).
 */
int hybd_ctl_resize(uint32_t id, uint64_t size);

/*
 * hybd_ctl_add - add a device described by @cfg without serving it.  It
 * stays in the "added" state until deleted; used to check parameters.
 * RETURN VALUE: 0 and *@id_out set (if not NULL), or -errno.
 */
int hybd_ctl_add(const struct hybd_config *cfg, uint32_t *id_out);

/*
 * The BPF fast path.
 *
 * A fast path is a .bpf.o built against bpf/hybd.bpf.h: one struct
 * hybd_bpf_ops (HYBD_OPS_DEFINE) and the maps its callbacks use.  Attaching
 * opens the object, sets the ops' dev_id, loads it (the kernel's verifier
 * checks every program) and attaches it to the device through a BPF link.
 * Any number of programs may be loaded, one is attached per device.
 *
 * The program lives as long as its link: by default that is the
 * struct hybd_bpf handle (hybd_bpf_close() or the process's exit detaches
 * it).  With HYBD_BPF_F_PIN the link and the maps are pinned under
 * /sys/fs/bpf/hybd/<id>/ (link, maps/<name>) and outlive the process, which
 * is what `hybdctl attach` does; bpffs is mounted there if it is not.
 *
 * Sizing: the loader sets the program's hybd_dev_blocks to the device's
 * size in 4 KiB blocks, and gives every map declared HYBD_PER_BLOCK one
 * entry per block (at most the max_entries it declares): see hybd.bpf.h.
 *
 * Replacing keeps state: the new program takes over the old program's maps
 * that have the same name and shape (type, key and value size, entries,
 * flags), so fds the slow path holds to them stay valid and what they
 * know carries over (the replace is atomic: every request is seen by one
 * program or the other).  Maps that differ are new; give a map a new name
 * when its meaning changes.  .bss/.data/.rodata are never carried over.
 *
 * A failed load leaves the verifier's verdict in hybd_errmsg(): a first
 * line naming the program refused and the verifier's reason, then libbpf's
 * messages with the end of the verifier log (its start is cut if the whole
 * does not fit in the message's 4 KiB).
 */

/* A loaded fast path and its link (opaque). */
struct hybd_bpf;

/* hybd_bpf_attach() flags */
/* pin link and maps under /sys/fs/bpf/hybd/<id>/: they outlive the process */
#define HYBD_BPF_F_PIN		(1U << 0)
/*
 * with HYBD_BPF_F_PIN: swap the new program into the device's pinned link
 * atomically (bpf_link_update: every request sees the old program or the
 * new one, none is lost).  -ENOENT if the device has no pinned program.
 */
#define HYBD_BPF_F_REPLACE	(1U << 1)

/*
 * hybd_bpf_attach - load @path and attach it to device @dev_id.
 *
 * @flags: HYBD_BPF_F_*.  Checks first that the module is loaded, offers
 * HYBD_F_BPF and has BTF (else "kernel too old", "no BTF for the hybd
 * module", ...).  On success *@bp is a handle for the maps and for
 * hybd_bpf_replace(), hybd_bpf_detach() and hybd_bpf_close().
 *
 * RETURN VALUE: 0, or -errno: -ENOENT (module not loaded, no such file,
 * nothing to replace), -ENODEV (no such device), -EBUSY (the device has a
 * fast path already, or one that is not pinned and cannot be replaced),
 * -EACCES or -EINVAL (the verifier refused a program: see hybd_errmsg();
 * or a HYBD_PER_BLOCK map that is not an array), -EOPNOTSUPP (no BPF
 * support in this kernel or module).
 */
int hybd_bpf_attach(uint32_t dev_id, const char *path, unsigned int flags,
		    struct hybd_bpf **bp);

/*
 * hybd_bpf_replace - swap the program of @b's link for the one in @path,
 * atomically (requests see the old program or the new one).  The new
 * program takes over the old one's maps of the same name and shape (see
 * "Replacing keeps state" above); the others are dropped, and pins follow
 * the new program's maps.  Fds from hybd_bpf_map_fd() belong to the old
 * program and are closed: ask again; fds from hybd_bpf_map_open_pinned()
 * stay valid for the maps carried over.
 * RETURN VALUE: 0, or -errno (@b unchanged, the old program still runs).
 */
int hybd_bpf_replace(struct hybd_bpf *b, const char *path);

/*
 * hybd_bpf_detach - detach @b's program and free @b, pinned or not.  The
 * kernel stops calling the program before this returns.
 * RETURN VALUE: 0, or -errno (@b is freed in every case).
 */
int hybd_bpf_detach(struct hybd_bpf *b);

/*
 * hybd_bpf_close - free @b.  An unpinned program is detached with it; a
 * pinned one stays attached (hybd_bpf_detach_pinned() removes it).
 */
void hybd_bpf_close(struct hybd_bpf *b);

/*
 * hybd_bpf_detach_pinned - remove the pinned fast path of device @dev_id
 * (what `hybdctl detach` does), from any process.  Returns once the kernel
 * has stopped calling the program (or after a few seconds).
 * RETURN VALUE: 0, or -ENOENT if the device has no fast path (a pin left
 * from an earlier device with that id is removed too), -EBUSY if its fast
 * path is not pinned (the process that attached it holds it), -ENODEV if
 * there is no such device, -errno.
 */
int hybd_bpf_detach_pinned(uint32_t dev_id);

/*
 * hybd_bpf_map_fd - fd of the program's map @name (as in the .bpf.c), for
 * bpf_map_lookup_elem() & co.: the slow path shares state with the fast
 * path this way.  The fd belongs to @b: do not close it.
 * RETURN VALUE: the fd, or -ENOENT.
 */
int hybd_bpf_map_fd(struct hybd_bpf *b, const char *name);

/*
 * hybd_bpf_map_open_pinned - open the map @name of the fast path pinned
 * for device @dev_id (HYBD_BPF_F_PIN), from any process.
 * RETURN VALUE: a new fd, which the caller closes, or -errno.
 */
int hybd_bpf_map_open_pinned(uint32_t dev_id, const char *name);

/*
 * hybd_bpf_map_fill - set entries @first .. @first + @count - 1 of the
 * array map @map_fd to *@value (the map's value size), in batches of
 * 1024 per system call: how a slow path seeds or updates a per-block map
 * of its fast path, e.g. marks a range of blocks it knows hold zeros after
 * a discard.  Mind the order: state the fast path may serve from must be
 * true before it is published (see docs/writing-a-driver.md).
 * RETURN VALUE: 0, or -errno (-EINVAL: not an array map, -ERANGE: past its
 * end).
 */
int hybd_bpf_map_fill(int map_fd, uint32_t first, uint32_t count,
		      const void *value);

/*
 * hybd_bpf_map_mmap - map the values of the array map @map_fd, which the
 * program declares BPF_F_MMAPABLE, into this process (shared, writable
 * unless the program's side is read-only), and set *@bytes to the length
 * to munmap() it with.  The slow path then reads and changes entries with
 * plain loads and C11 atomics, no system call per change: how it keeps a
 * HYBD_BLOCK_BITMAP (hybd.bpf.h) of its fast path exact, setting and
 * clearing bits with atomic_fetch_or() and atomic_fetch_and() on the
 * 64-bit words.  The mapping keeps the map alive after the program goes.
 * Since 1.5.
 * RETURN VALUE: the mapping, or NULL (see hybd_errmsg(): not a map, not an
 * mmapable array, mmap() failed).
 */
void *hybd_bpf_map_mmap(int map_fd, size_t *bytes);

/*
 * Parsing helpers for command lines.
 */

/*
 * hybd_parse_dev - parse "/dev/hybd3", "hybd3" or "3".
 * RETURN VALUE: 0 and *@id set, -EINVAL if malformed, -ERANGE if the id is
 * not below HYBD_MAX_DEVICES.
 */
int hybd_parse_dev(const char *s, uint32_t *id);

/*
 * hybd_parse_size - parse a byte count: decimal digits with an optional
 * binary suffix K, M, G or T (any case, optionally followed by "iB").
 * RETURN VALUE: 0 and *@bytes set, -EINVAL if malformed, -ERANGE on
 * overflow.
 */
int hybd_parse_size(const char *s, uint64_t *bytes);

/*
 * hybd_parse_ops - parse a comma-separated list of operation names (see
 * hybd_opf_name(); "write_zeroes" is accepted too) into HYBD_OPF_* bits.
 * An empty string gives 0.  RETURN VALUE: 0 and *@ops set, or -EINVAL.
 */
int hybd_parse_ops(const char *s, uint32_t *ops);

/*
 * hybd_opf_name - name of one HYBD_OPF_* bit: "read", "write", "flush",
 * "fua", "discard" or "write-zeroes".  RETURN VALUE: the name, or NULL if
 * @opf is not exactly one known bit.
 */
const char *hybd_opf_name(uint32_t opf);

/*
 * hybd_errmsg - what went wrong in the last failed hybd_* call of the
 * calling thread, e.g. "logical block size 1000: must be a power of two
 * between 512 and 4096".  Does not include strerror() of the errno.
 * One line, but after a failed BPF load, where the lines after the first
 * carry libbpf's and the verifier's messages.
 * RETURN VALUE: a thread-local string, overwritten by the next failure.
 */
const char *hybd_errmsg(void);

#ifdef __cplusplus
}
#endif

#endif /* LIBHYBD_HYBD_H */
