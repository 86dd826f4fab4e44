/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR MIT) */
/*
 * hybd - hybrid kernel/user block drivers: the user-space ABI.
 *
 * This header is shared by the kernel module (kmod/), the C library
 * (libhybd/) and BPF programs (bpf/).  It holds only what crosses the
 * kernel/user boundary.
 *
 * Two kinds of character devices exist:
 *
 *   /dev/hybd-control   misc device: add, delete, list and query devices
 *                       (HYBD_CTL_* ioctls).
 *   /dev/hybdN-srv      one per device: the slow-path server opens it
 *                       (exclusively), mmaps one area per hardware queue and
 *                       runs the HYBD_SRV_* ioctls.
 *
 * and the block device itself is /dev/hybdN.
 *
 * Growth rules: every structure starts with a __u32 len that the caller sets
 * to the size it knows.  The kernel accepts shorter structures from older
 * callers (missing fields read as zero) and longer ones from newer callers as
 * long as every byte it does not know is zero (else -E2BIG).  Reserved fields
 * must be zero (-EINVAL).  Unknown flag, feature or type bits are rejected
 * (-EOPNOTSUPP).
 */
#ifndef _UAPI_HYBD_H
#define _UAPI_HYBD_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define HYBD_ABI_VERSION	1

#define HYBD_CONTROL_NAME	"hybd-control"
#define HYBD_SRV_NAME_FMT	"hybd%u-srv"
#define HYBD_DISK_NAME_FMT	"hybd%u"

/* Limits enforced by the kernel. */
#define HYBD_MAX_DEVICES	64
#define HYBD_MAX_QUEUES		64
#define HYBD_MAX_QUEUE_DEPTH	1024
#define HYBD_MAX_IO_BYTES	(1U << 20)	/* per request, per tag buffer */
#define HYBD_MAX_QUEUE_BUF	(256U << 20)	/* depth * max_io per queue */
/* nr_hw_queues * depth * max_io: the data buffers a device pins */
#define HYBD_MAX_DEV_BUF	(1ULL << 30)
#define HYBD_MAX_POLL_NS	1000000U	/* 1 ms */
#define HYBD_MAX_DEV_SIZE	(1ULL << 50)	/* 1 PiB */
#define HYBD_MAX_IO_TIMEOUT	3600U		/* seconds */
#define HYBD_MAX_RECOVERY_TIMEOUT 86400U	/* seconds */
/* how long a device handed over (HYBD_CTL_HANDOVER) waits for the new
 * server when it has no recovery_timeout of its own
 */
#define HYBD_HANDOVER_TIMEOUT	30U		/* seconds */
#define HYBD_DEV_ID_ANY		((__u32)-1)

/*
 * Feature bits (HYBD_CTL_GET_FEATURES).  Each names a behaviour user space
 * may rely on; a later kernel only adds bits.
 */
/* per-queue rings, one copy each way, batched commit+wait ioctl */
#define HYBD_F_RINGS		(1ULL << 0)
/* bounded in-kernel busy-poll before a worker sleeps (poll_ns) */
#define HYBD_F_POLL		(1ULL << 1)
/* completions carry the descriptor's seq; stale ones are rejected */
#define HYBD_F_SEQ_CHECK	(1ULL << 2)
/* BPF fast path (struct hybd_bpf_ops) can be attached to a device */
#define HYBD_F_BPF		(1ULL << 3)
/*
 * hybd_param_basic.io_timeout: a request the server has not completed in
 * time fails with EIO (counted in timed_out); its late completion is
 * rejected.  A server whose process is exiting is detected at the latest
 * when one of its requests times out (or every 30 s without io_timeout).
 */
#define HYBD_F_IO_TIMEOUT	(1ULL << 4)
/*
 * HYBD_CTL_DEL returns -EINTR when its caller is killed (the delete goes on
 * in the kernel), and HYBD_DEL_F_FORCE fails outstanding I/O at once.
 */
#define HYBD_F_DEL_FORCE	(1ULL << 5)
/*
 * HYBD_SRV_SET_EVENTFD and HYBD_SRV_IO_ARM: a worker can wait for its
 * queue's submissions with poll()/epoll/io_uring on an eventfd, beside its
 * backend's own file descriptors.
 */
#define HYBD_F_EVENTFD		(1ULL << 6)
/* HYBD_SRV_QUEUE_CPUS: which CPUs submit to a hardware queue */
#define HYBD_F_QUEUE_CPUS	(1ULL << 7)
/* hybd_dev_info.mem_bytes, and the HYBD_MAX_DEV_BUF limit */
#define HYBD_F_MEM_INFO		(1ULL << 8)
/*
 * A fast path's submit() may return HYBD_BPF_PASS_ZEROES for a write
 * (counted in bpf_pass_zeroes); offered with HYBD_F_BPF only.
 */
#define HYBD_F_PASS_ZEROES	(1ULL << 9)
/*
 * Recovery (see "Recovery and handover" below): hybd_param_basic.
 * recovery_timeout, the WAITING state, a new server opening and starting
 * a device whose server went away, HYBD_CTL_HANDOVER and
 * HYBD_RING_DRAIN, and the held/reissued counters.
 */
#define HYBD_F_RECOVERY		(1ULL << 10)
/* HYBD_SRV_ADD_BACKING and HYBD_SRV_DEL_BACKING: backing targets */
#define HYBD_F_BACKING		(1ULL << 11)
/*
 * The remap fast path (offered with HYBD_F_BPF and HYBD_F_BACKING):
 * hybd_bpf_io_remap(), HYBD_BPF_REMAPPED, hybd_bpf_io.path, the remapped,
 * remap_refused and remap_waited counters, and HYBD_SRV_REMAP_BARRIER.
 */
#define HYBD_F_REMAP		(1ULL << 12)
/* HYBD_CTL_RESIZE, HYBD_SRV_RESIZE, HYBD_DEV_F_RESIZE, HYBD_RING_RESIZE */
#define HYBD_F_RESIZE		(1ULL << 13)
/* HYBD_DEV_F_UNPRIVILEGED: devices of users without CAP_SYS_ADMIN */
#define HYBD_F_UNPRIVILEGED	(1ULL << 14)
/* HYBD_DEV_F_REMAP_POLL (offered with HYBD_F_REMAP) */
#define HYBD_F_REMAP_POLL	(1ULL << 15)
/*
 * HYBD_DEV_F_BIO_FRONT, hybd_bpf_ops.map and the remap_front counter
 * (offered with HYBD_F_REMAP)
 */
#define HYBD_F_BIO_FRONT	(1ULL << 16)

/*
 * Supported operations (hybd_param_basic.ops).  READ is mandatory; a
 * device without WRITE is read-only and offers nothing but READ.  FLUSH
 * and FUA exist only with a volatile write cache, and a write cache needs
 * FLUSH (the kernel could otherwise never make data durable).
 */
#define HYBD_OPF_READ		(1U << 0)
#define HYBD_OPF_WRITE		(1U << 1)
#define HYBD_OPF_FLUSH		(1U << 2)	/* needs HYBD_DEV_F_WRITE_CACHE */
#define HYBD_OPF_FUA		(1U << 3)	/* needs HYBD_DEV_F_WRITE_CACHE */
#define HYBD_OPF_DISCARD	(1U << 4)
#define HYBD_OPF_WRITE_ZEROES	(1U << 5)
#define HYBD_OPF_ALL		0x3fU

/* Device flags (hybd_param_basic.flags). */
/* the device has a volatile write cache: flush requests reach the server */
#define HYBD_DEV_F_WRITE_CACHE	(1U << 0)
/*
 * the server takes an all-zero write that a fast path recognised as a
 * write-zeroes of the same range (HYBD_BPF_PASS_ZEROES): it must make the
 * range read as zeros with the write's semantics (FUA honoured); needs
 * HYBD_OPF_WRITE_ZEROES; offered with HYBD_F_PASS_ZEROES
 */
#define HYBD_DEV_F_ZERO_WRITES	(1U << 1)
/*
 * the server answers resize requests (HYBD_CTL_RESIZE: HYBD_RING_RESIZE,
 * HYBD_SRV_RESIZE_F_ANSWER); offered with HYBD_F_RESIZE.  Without it only
 * the server itself resizes its device (HYBD_SRV_RESIZE).
 */
#define HYBD_DEV_F_RESIZE	(1U << 2)
/*
 * An unprivileged device (HYBD_F_UNPRIVILEGED), owned by the user who adds
 * it; mandatory for a caller without CAP_SYS_ADMIN, allowed for one with
 * it.  Whoever may open /dev/hybd-control (root only, unless the
 * administrator gives a group access to it) may add one.  Only its owner
 * (the caller's effective uid when it was added) or CAP_SYS_ADMIN may
 * delete it, hand it over, resize it, or open its server node (made with
 * the owner's uid and gid, mode 0600).  Its block device's node is the
 * administrator's to give: /sys/block/hybdN/hybd/owner_uid and owner_gid
 * name the owner for a udev rule.  The kernel does not scan it for
 * partitions (its content is the user's), and a backing target its server
 * registers must be a file or device the server may itself read (and
 * write, HYBD_BACKING_F_WRITE), on local storage: a block device (not
 * a loop or nbd device), or a file on tmpfs or on a file system built on
 * block devices that is not FUSE
 * (-EPERM otherwise: a remap on FUSE, NFS, 9p or virtiofs waits for
 * whoever serves it, and neither the I/O timeout nor a forced delete
 * ends a remap).  It always has an I/O timeout: 0 becomes
 * 30 s, and an io_timeout or recovery_timeout above the module parameter
 * max_user_timeout (120 s) fails with -EPERM.  Limits: per user,
 * max_user_devices and max_user_mem_mb (what its devices pin: rings,
 * tags, what they have per possible CPU, their kernel threads and a
 * fixed part; charged from the add until the device is freed,
 * which is after its delete if a server still holds its node), charged
 * to the owner or, in user namespaces, to the user (not root) who made
 * the outermost one; for all users together, max_unpriv_devices.  An add
 * beyond them fails with -EDQUOT.  At most 10 resizes in 5 s (-EBUSY).  Attaching a fast path needs
 * CAP_SYS_ADMIN (loading it the BPF capabilities): an administrator
 * attaches one to a user's device.
 */
#define HYBD_DEV_F_UNPRIVILEGED	(1U << 3)
/*
 * The kernel's remap workers poll too (HYBD_F_REMAP_POLL): one that runs
 * out of remapped reads and writes polls for more for up to poll_ns, while
 * its CPU has nothing else to run, before it lets go; CPU spent, in
 * kernel threads, so that submitters on other CPUs need not wake it.
 * Needs CAP_SYS_ADMIN: an unprivileged device with it fails with -EPERM
 * (the CPU would be no one's to account or limit).  Without poll_ns, or
 * without the BPF fast path (no remaps), it does nothing.
 */
#define HYBD_DEV_F_REMAP_POLL	(1U << 4)
/*
 * A bio-based front (HYBD_F_BIO_FRONT): /dev/hybdN takes bios itself and
 * runs the program's map() on each read and write first; one it remaps to
 * a block-device target is cloned onto the target there and then, as
 * dm-linear does, without a request, a tag or a second trip through
 * blk-mq.  Everything else (no map(), map() passed, a flush, a discard,
 * a file target, a remap the kernel cannot take at once) goes on, as it
 * is, to the request-based disk behind the front, hybdNq: hidden, no
 * node in /dev, where submit() and the server see it as on any device.
 * The block device's queue settings (scheduler, nr_requests) are then
 * hybdNq's, in /sys/block/hybdNq/queue.  Needs CAP_SYS_ADMIN (-EPERM on
 * an unprivileged device).
 */
#define HYBD_DEV_F_BIO_FRONT	(1U << 5)
#define HYBD_DEV_F_ALL		0x3fU

/* Parameter block types (hybd_params.types). */
#define HYBD_PARAM_BASIC	(1U << 0)	/* mandatory */
#define HYBD_PARAM_DISCARD	(1U << 1)
#define HYBD_PARAM_ALL		0x3U

struct hybd_param_basic {
	__u64	dev_size;	/* bytes, a multiple of logical_bs, > 0 */
	__u32	logical_bs;	/* power of two, 512..4096 */
	__u32	physical_bs;	/* power of two, logical_bs..65536; 0: = logical */
	__u32	max_io_bytes;	/* multiple of 4096, 4096..HYBD_MAX_IO_BYTES */
	__u16	nr_hw_queues;	/* 1..HYBD_MAX_QUEUES */
	__u16	queue_depth;	/* 1..HYBD_MAX_QUEUE_DEPTH */
	__u32	ops;		/* HYBD_OPF_* */
	__u32	flags;		/* HYBD_DEV_F_* */
	/*
	 * busy-poll before sleeping, 0..HYBD_MAX_POLL_NS: a worker in
	 * HYBD_SRV_IO_WAIT, and with HYBD_DEV_F_REMAP_POLL a remap worker
	 */
	__u32	poll_ns;
	__u32	io_timeout;	/* seconds, 0..HYBD_MAX_IO_TIMEOUT; 0: none
				 * (HYBD_DEV_F_UNPRIVILEGED: 30 s) */
	/*
	 * seconds, 0..HYBD_MAX_RECOVERY_TIMEOUT (HYBD_F_RECOVERY): when the
	 * server goes away, hold I/O this long for a new one; 0: fail at once
	 */
	__u32	recovery_timeout;
	__u32	reserved0;
	__u64	reserved[3];
};

/* Only with HYBD_OPF_DISCARD or HYBD_OPF_WRITE_ZEROES; byte limits are
 * multiples of logical_bs, the granularity a power of two >= logical_bs.
 */
struct hybd_param_discard {
	__u32	max_discard_bytes;	/* 0: default (max multiple of lbs < 4 GiB) */
	__u32	discard_granularity;	/* 0: logical_bs; else power of two */
	__u32	max_write_zeroes_bytes;	/* 0: default, as discard */
	__u32	reserved0;
	__u64	reserved[2];
};

struct hybd_params {
	__u32	len;		/* sizeof(struct hybd_params) */
	__u32	types;		/* HYBD_PARAM_* present below */
	struct hybd_param_basic		basic;
	struct hybd_param_discard	discard;
};

/*
 * Parameter that made HYBD_CTL_ADD fail (hybd_ctl_add.err_param), so that
 * user space can say which value was wrong, not only the errno.
 */
enum hybd_param_err {
	HYBD_PERR_NONE = 0,
	HYBD_PERR_LEN,		/* len too small / unknown trailing bytes */
	HYBD_PERR_TYPES,	/* unknown type bits or basic missing */
	HYBD_PERR_RESERVED,	/* a reserved field is not zero */
	HYBD_PERR_DEV_ID,	/* id out of range or in use */
	HYBD_PERR_SIZE,
	HYBD_PERR_LOGICAL_BS,
	HYBD_PERR_PHYSICAL_BS,
	HYBD_PERR_MAX_IO,
	HYBD_PERR_QUEUES,
	HYBD_PERR_DEPTH,
	HYBD_PERR_QUEUE_BUF,	/* depth * max_io_bytes too large */
	HYBD_PERR_OPS,
	HYBD_PERR_FLAGS,
	HYBD_PERR_POLL,
	HYBD_PERR_DISCARD,
	HYBD_PERR_IO_TIMEOUT,
	HYBD_PERR_DEV_BUF,	/* nr_hw_queues * depth * max_io too large */
	HYBD_PERR_RECOVERY,	/* recovery_timeout out of range */
	HYBD_PERR_MAX,
};

/* HYBD_CTL_ADD: create a device (no block device until the server starts) */
struct hybd_ctl_add {
	__u32	len;		/* sizeof(struct hybd_ctl_add) */
	__u32	dev_id;		/* in: wanted id or HYBD_DEV_ID_ANY; out: id */
	__u32	err_param;	/* out: enum hybd_param_err on failure */
	__u32	reserved0;
	__u64	reserved[2];
	struct hybd_params params;
};

/*
 * HYBD_CTL_DEL: remove the block device, then the device.  While a server
 * serves it, data the block layer still holds (dirty pages, requests in
 * flight) reaches the server first; the first of them that times out (the
 * I/O timeout, or 30 s without one) fails everything outstanding, so a
 * server that does not help holds the delete up to one timeout.  The
 * caller may be killed while it waits (-EINTR): the delete goes on in the
 * kernel, and another HYBD_CTL_DEL (HYBD_DEL_F_FORCE to end it) waits for
 * the same delete.  HYBD_DEL_F_FORCE fails at once what the server holds;
 * requests the fast path remapped end when their targets end them (see
 * HYBD_SRV_REMAP_BARRIER).
 */
#define HYBD_DEL_F_FORCE	(1U << 0)	/* fail outstanding I/O at once */
#define HYBD_DEL_F_ALL		0x1U

struct hybd_ctl_dev {
	__u32	len;
	__u32	dev_id;
	__u32	flags;		/* HYBD_DEL_F_* */
	__u32	reserved0;
};

/* Device states (hybd_dev_info.state). */
enum hybd_dev_state {
	HYBD_STATE_ADDED = 0,	/* created, waiting for a server to start it */
	HYBD_STATE_LIVE,	/* block device present, server attached */
	HYBD_STATE_DEAD,	/* server gone: every request fails with EIO */
	HYBD_STATE_DELETING,
	/*
	 * HYBD_F_RECOVERY: the server went away (or handed over) and I/O is
	 * held for a new one until hybd_dev_info.recovery_left_ms runs out
	 */
	HYBD_STATE_WAITING,
};

/* Counters, summed over the hardware queues. */
struct hybd_dev_stats {
	__u64	slow_issued;	/* requests published to the server */
	__u64	slow_done;	/* completions accepted from the server */
	__u64	slow_errors;	/* ...of which carried an error */
	__u64	fast_done;	/* completed by the BPF fast path */
	__u64	fast_errors;	/* ...of which with an error status */
	__u64	failed_dead;	/* failed because no server was there */
	__u64	reads;
	__u64	writes;
	__u64	flushes;
	__u64	fua;
	__u64	discards;
	__u64	write_zeroes;
	/* completion-ring protocol violations, each rejected */
	__u64	rej_bad_tag;	/* tag >= queue depth */
	__u64	rej_not_outstanding;	/* tag not in flight (duplicates too) */
	__u64	rej_stale_seq;	/* seq does not match the tag's request */
	/* result not 0 or -errno: the request fails with EIO (and counts
	 * in slow_errors too)
	 */
	__u64	rej_bad_result;
	__u64	rej_ring_index;	/* cq tail moved by more than the ring size */
	__u64	bpf_bad_ret;	/* fast path returned outside the contract */
	__u64	timed_out;	/* not completed within io_timeout: EIO */
	__u64	bpf_unfilled;	/* fast path DONE, read not filled: EIO */
	/* writes the fast path sent to the server as write-zeroes */
	__u64	bpf_pass_zeroes;
	/* HYBD_F_RECOVERY: requests published while no server was there */
	__u64	held;
	/* HYBD_F_RECOVERY: requests issued again to a new server */
	__u64	reissued;
	/*
	 * HYBD_F_REMAP: requests the fast path served on a backing target
	 * (part of fast_done; failed ones count in fast_errors too)
	 */
	__u64	remapped;
	/* HYBD_F_REMAP: hybd_bpf_io_remap() calls refused with an errno */
	__u64	remap_refused;
	/*
	 * HYBD_F_REMAP: times a remapped read or write asked not to wait
	 * (IOCB_NOWAIT) could not start without it (a file system that must
	 * allocate blocks, take a lock, or fall back to buffered I/O, a
	 * frozen file system, a block device out of tags or needing a
	 * split) and was started again from a worker of
	 * its own, where it may wait; in a bio-based front, a REQ_NOWAIT
	 * bio its block-device target could not take without waiting,
	 * which went back to the submitter with EAGAIN (io_uring submits it
	 * again from its workers) (a module that predates the counter
	 * leaves it 0)
	 */
	__u64	remap_waited;
	/*
	 * HYBD_F_REMAP: remapped reads and writes on a block device target
	 * that queue_rq started itself, in the submitter's context, as
	 * clones of their bios (inside the submitter's submit_bio(), or from
	 * blk-mq's work); the others (on files, from a plug's flush, where
	 * the target's page cache holds the range, or when no clone could be
	 * had at once) start in a worker (a module that predates the counter
	 * leaves it 0)
	 */
	__u64	remap_direct;
	/*
	 * HYBD_F_REMAP: runs of the workers that start remapped reads and
	 * writes on files (and the block-device ones queue_rq did not
	 * start) in batches, each taking what waits and what comes while it
	 * runs: each costs at most one wakeup, and a run may find nothing
	 * (a module that predates the counter leaves it 0)
	 */
	__u64	remap_runs;
	/*
	 * HYBD_DEV_F_REMAP_POLL: times such a worker, out of requests, found
	 * more by polling for them (a module that predates the counter
	 * leaves it 0)
	 */
	__u64	remap_polled;
	/*
	 * HYBD_DEV_F_BIO_FRONT: reads and writes map() remapped in the
	 * front, cloned onto their block-device target without a request,
	 * as they end (part of remapped; a module that predates the counter
	 * leaves it 0)
	 */
	__u64	remap_front;
	__u64	reserved[2];
};

/* HYBD_CTL_INFO */
struct hybd_dev_info {
	__u32	len;		/* in: sizeof(struct hybd_dev_info) */
	__u32	dev_id;		/* in */
	__u32	state;		/* out: enum hybd_dev_state */
	/* out: the server's pid in the caller's pid namespace; 0 if there is
	 * none or it is not visible there
	 */
	__s32	server_pid;
	__u32	disk_major;	/* out: 0 until started */
	__u32	disk_minor;
	__u32	bpf_link_id;	/* out: link of the attached fast path, 0 if none */
	__u32	bpf_attaches;	/* out: attach + replace count since creation */
	char	bpf_name[16];	/* out: the attached ops' name */
	/* out: bytes of the areas shared with the server (rings,
	 * descriptors and data buffers of every queue), the bulk of what
	 * the device pins
	 */
	__u64	mem_bytes;
	/* out, HYBD_F_RECOVERY: in WAITING, ms left before held I/O fails */
	__u32	recovery_left_ms;
	/* out, HYBD_F_RECOVERY: how often a new server took the device over */
	__u32	recoveries;
	/* out, HYBD_F_RECOVERY: ns spent WAITING since creation, in total */
	__u64	no_server_ns;
	/*
	 * out, HYBD_F_UNPRIVILEGED: the owner of an unprivileged device, as
	 * the caller's user namespace sees it; (__u32)-1 for a device of
	 * the administrator's
	 */
	__u32	owner_uid;
	__u32	owner_gid;
	struct hybd_params	params;	/* out */
	struct hybd_dev_stats	stats;	/* out */
};

/* HYBD_CTL_LIST */
struct hybd_ctl_list {
	__u32	len;
	__u32	count;		/* in: room in ids; out: devices that exist */
	__u64	ids;		/* user pointer to __u32[count] */
};

/*
 * Latency histograms: bucket i counts requests whose latency, from
 * queue_rq to completion, was in [2^i, 2^(i+1)) ns (bucket 0 also < 1 ns).
 */
#define HYBD_LAT_BUCKETS	32

struct hybd_queue_stat {
	struct hybd_dev_stats	c;
	__u64	fast_lat[HYBD_LAT_BUCKETS];
	__u64	slow_lat[HYBD_LAT_BUCKETS];
};

/* HYBD_CTL_STATS: the device's totals and, optionally, each queue's */
struct hybd_ctl_stats {
	__u32	len;
	__u32	dev_id;		/* in */
	__u32	nr_queues;	/* out */
	__u32	queue_room;	/* in: entries at queues (0: totals only) */
	__u64	queues;		/* in: user pointer to hybd_queue_stat[room] */
	__u64	reserved[2];
	struct hybd_queue_stat	total;	/* out */
};

/* HYBD_CTL_GET_FEATURES */
struct hybd_ctl_features {
	__u32	len;
	__u32	abi_version;	/* out: HYBD_ABI_VERSION */
	__u64	features;	/* out: HYBD_F_* */
	__u64	reserved[2];
};

#define HYBD_IOC_MAGIC		0xb7
#define HYBD_CTL_GET_FEATURES	_IOWR(HYBD_IOC_MAGIC, 0x00, struct hybd_ctl_features)
#define HYBD_CTL_ADD		_IOWR(HYBD_IOC_MAGIC, 0x01, struct hybd_ctl_add)
#define HYBD_CTL_DEL		_IOW(HYBD_IOC_MAGIC, 0x02, struct hybd_ctl_dev)
#define HYBD_CTL_INFO		_IOWR(HYBD_IOC_MAGIC, 0x03, struct hybd_dev_info)
#define HYBD_CTL_LIST		_IOWR(HYBD_IOC_MAGIC, 0x04, struct hybd_ctl_list)
#define HYBD_CTL_STATS		_IOWR(HYBD_IOC_MAGIC, 0x05, struct hybd_ctl_stats)
/*
 * HYBD_CTL_HANDOVER (HYBD_F_RECOVERY): ask the server of a live device to
 * drain and leave, for a new server to take over (struct hybd_ctl_dev,
 * flags 0).  Sets HYBD_RING_DRAIN and wakes every worker.  The device
 * then keeps its I/O when the old server's file is released, as in
 * recovery mode, for recovery_timeout (or HYBD_HANDOVER_TIMEOUT if it has
 * none).  0 also if no server is attached (WAITING); -ENODEV for a device
 * that is not live.
 */
#define HYBD_CTL_HANDOVER	_IOW(HYBD_IOC_MAGIC, 0x06, struct hybd_ctl_dev)

/*
 * HYBD_CTL_RESIZE (HYBD_F_RESIZE): change the size of a live device whose
 * server answers resizes (HYBD_DEV_F_RESIZE), under I/O.  @size is in
 * bytes, a multiple of the logical block size, 1..HYBD_MAX_DEV_SIZE.
 *
 * The server is asked first (HYBD_RING_RESIZE on queue 0), with nothing
 * held back, and may refuse (its errno is returned); it must answer
 * within the device's I/O timeout (HYBD_RESIZE_TIMEOUT without one), or
 * the resize fails with -ETIMEDOUT and nothing changes.  A grow then sets
 * the new size.  A shrink then waits for the requests in flight to end
 * (and, on a device with a bio front, what it remapped) while holding new
 * ones back (the queue is frozen, at most as long as the server may take
 * to answer, all waits together; -EBUSY if they do not end in time,
 * -EINTR on a signal: nothing changes), sets the size and lets requests
 * in again.  Either way the new size is published last, in every ring
 * header's dev_size: a server lets go of blocks beyond a shrunk end only
 * once it sees it there, so that a resize that fails after the server
 * accepted it loses nothing.  The block layer ends requests beyond the
 * end itself (reads there see the end of the device).  The new size is
 * announced to user space with a change uevent (RESIZE=1), as for any
 * disk, after the queue runs again; a file system on it is grown or
 * shrunk by its own tools.
 *
 * A fast path's state about blocks beyond a shrunk end could outlive
 * them, and be served again after a grow: a shrink is refused (-EBUSY)
 * while a fast path is attached; detach it first.  After a grow, the
 * program's per-block maps (sized when it was loaded) do not cover the new
 * blocks: a lookup there finds nothing, and the program passes those
 * requests on.  Errors: -ENODEV (no such device, or dead or deleting),
 * -EAGAIN (not live: not started, or waiting for a server; or the server
 * that was asked, or asked, was replaced before the size was set: its
 * successor did not consent; nothing changed), -EOPNOTSUPP
 * (the server does not answer resizes: no HYBD_DEV_F_RESIZE; or unknown
 * flags), -EINVAL (@size, reserved), -EBUSY (above, or another resize under way), -ETIMEDOUT,
 * -EINTR (a signal while waiting: nothing changed), or the server's own
 * errno.  Equal to the current size: 0 at once.
 */
#define HYBD_RESIZE_TIMEOUT	30	/* seconds */

struct hybd_ctl_resize {
	__u32	len;
	__u32	dev_id;
	__u64	size;		/* bytes */
	__u32	flags;		/* none defined: 0 */
	__u32	reserved0;
	__u64	reserved[2];
};
#define HYBD_CTL_RESIZE		_IOW(HYBD_IOC_MAGIC, 0x07, struct hybd_ctl_resize)

/*
 * ---------------------------------------------------------------------
 * The server side: /dev/hybdN-srv
 * ---------------------------------------------------------------------
 *
 * One process at a time may open the server node.  When its last reference
 * goes (exit, crash, close), the device becomes DEAD: every outstanding and
 * later request fails with an I/O error, and the device can be deleted.
 *
 * Recovery and handover (HYBD_F_RECOVERY).  On a live device with a
 * recovery_timeout, or one handed over (HYBD_CTL_HANDOVER), the release
 * does not fail anything: the kernel accepts the completions the server
 * had posted, and the device goes WAITING.  Requests in flight stay in
 * flight; new ones run through the fast path as usual, and what it passes
 * is held (counted in held).  A new process may then open the server node,
 * map the queues and call HYBD_SRV_START, which resumes the device: every
 * request still in flight is issued again (counted in reissued), in the
 * order it was first issued, as slots 0..n-1 of a rewound ring (every
 * index in the header is reset: sq_tail = n, the others 0), with a new
 * seq and, for a write, its payload copied again.  A resumed server must
 * not consume before HYBD_SRV_START returns, and reads its indices from
 * the header after it.  If no server has resumed the device when the
 * timeout runs out, everything held fails with EIO and the device is DEAD.
 * A delete of a WAITING device fails what it holds at once.  While a
 * device waits, whatever freezes its request queue (an I/O scheduler
 * switch, a change of its limits, a CPU going offline) waits with it, up
 * to the recovery timeout: held requests are still in flight.  The I/O
 * timeout does not fail a request in recovery mode: it counts it in
 * timed_out and holds it for a new server, and fails it only if it is
 * still not done recovery_timeout later (the same holds, with
 * HYBD_HANDOVER_TIMEOUT, for HYBD_HANDOVER_TIMEOUT seconds after a
 * handover on a device without a recovery timeout).  HYBD_SRV_IO with
 * WAIT or ARM on a device that waits for HYBD_SRV_START is -EBUSY.  A
 * server process that is gone while its file stays open elsewhere (a
 * child holding it) is failed like a dead one recovery_timeout after an
 * I/O timeout first notices it: no new server can take that device over.
 *
 * Each hardware queue q has its own shared area, mmapped at offset
 * q * hybd_srv_info.queue_stride, hybd_srv_info.queue_map_size bytes long:
 *
 *   +0                 struct hybd_ring_hdr
 *   +sq_off            __u32 sq[ring_entries]       kernel -> server: tags
 *   +cq_off            struct hybd_cqe cq[ring_entries]   server -> kernel
 *   +desc_off          struct hybd_io_desc desc[queue_depth]  (per tag)
 *   +data_off          data[queue_depth][max_io_bytes]        (per tag)
 *
 * Indices are free-running __u32 counters; slot = index & (ring_entries-1).
 *
 * Submission: the kernel fills desc[tag] (and data[tag] for writes), stores
 * the tag at sq[tail], and publishes sq_tail once per batch.  The server
 * consumes from sq_head to sq_tail and stores sq_head.
 *
 * Completion: the server writes data[tag] (reads), then a struct hybd_cqe at
 * cq[cq_tail] and advances cq_tail; the kernel consumes them on the next
 * HYBD_SRV_IO and stores cq_head.
 *
 * Memory ordering (what a server on a weakly ordered CPU may rely on):
 * - the kernel stores hdr->sq_tail with release semantics after the
 *   descriptors and write data it covers, and HYBD_SRV_IO returns sq_tail
 *   after an acquire of the same value: load hdr->sq_tail with acquire (or
 *   use the returned value) before reading desc[] and data[];
 * - the kernel loads hdr->cq_tail with acquire: store it with release
 *   after the cqes and read data it covers;
 * - the kernel stores hdr->cq_head with release after it has read the
 *   cqes before it: a server may reuse a cq slot once it has loaded
 *   hdr->cq_head (acquire) past it.
 * - hdr->flags is written by the kernel only, under its queue lock.
 *
 * The kernel never trusts this memory: it keeps its own copy of every
 * request's state, reads each completion once, and rejects and counts any
 * that is not for an outstanding tag with the matching seq.
 *
 * The per-tag data buffer belongs to the request until it completes.  A
 * request that timed out (io_timeout) is failed by the kernel and its tag
 * may be reused at once, buffer included: a server still working on a
 * timed-out request can corrupt the payload of the tag's next request.
 * Choose an I/O timeout no healthy server misses; a server that misses it
 * should be restarted.
 */
#define HYBD_RING_NEED_WAKEUP	(1U << 0)	/* worker sleeps in HYBD_SRV_IO */
#define HYBD_RING_DEAD		(1U << 1)	/* device is dead/deleted */
/*
 * HYBD_CTL_HANDOVER: a new server waits to take over.  Stop consuming,
 * complete (and commit) what was taken, then close the server node; what
 * was not consumed goes to the new server.  The kernel goes on publishing
 * until the node is closed.
 */
#define HYBD_RING_DRAIN		(1U << 2)
/*
 * Queue 0 only, HYBD_CTL_RESIZE: may the device become resize_size
 * bytes?  Answer with HYBD_SRV_RESIZE (HYBD_SRV_RESIZE_F_ANSWER, gen =
 * resize_gen, read with acquire after the flag): 0 to accept (a grow: the
 * storage is ready and requests up to the new end are served; a shrink:
 * nothing is let go of yet), or a negative errno to refuse.  The resize
 * may still fail after an answer (the requests in flight did not end in
 * time, a signal): the size has changed only when dev_size says so.  The
 * worker is kicked (HYBD_SRV_IO returns, the eventfd is signalled) when
 * the flag is set.
 */
#define HYBD_RING_RESIZE	(1U << 3)

struct hybd_ring_hdr {
	__u32	sq_tail;	/* written by the kernel */
	__u32	sq_head;	/* written by the server */
	__u32	cq_tail;	/* written by the server */
	__u32	cq_head;	/* written by the kernel */
	__u32	flags;		/* HYBD_RING_*, written by the kernel */
	__u32	ring_entries;	/* power of two >= queue_depth */
	__u32	queue_depth;
	__u32	max_io_bytes;
	__u32	sq_off;
	__u32	cq_off;
	__u32	desc_off;
	__u32	data_off;
	__u32	queue_id;
	/* HYBD_RING_RESIZE (queue 0): the request's number and size */
	__u32	resize_gen;
	__u64	resize_size;
	/*
	 * HYBD_F_RESIZE: the device's size in bytes, as the block layer has
	 * it: stored with release after every change (HYBD_CTL_RESIZE,
	 * HYBD_SRV_RESIZE), on every queue, then queue 0 is kicked.  Once a
	 * server has loaded a smaller value (acquire), no request beyond it
	 * is in flight or can come: it may let go of what lies beyond.
	 * The header of a module without HYBD_F_RESIZE ends before
	 * resize_gen; dev_size is there when sq_off is past it.
	 */
	__u64	dev_size;
};

/* hybd_io_desc.op */
enum hybd_io_op {
	HYBD_OP_READ = 0,
	HYBD_OP_WRITE = 1,
	HYBD_OP_FLUSH = 2,
	HYBD_OP_DISCARD = 3,
	HYBD_OP_WRITE_ZEROES = 4,
	HYBD_OP_MAX,
};

/* hybd_io_desc.flags */
#define HYBD_IO_F_FUA		(1U << 0)	/* write must be durable on return */
#define HYBD_IO_F_NOUNMAP	(1U << 1)	/* write-zeroes: keep allocated */
#define HYBD_IO_F_SYNC		(1U << 2)
#define HYBD_IO_F_META		(1U << 3)

struct hybd_io_desc {
	__u8	op;		/* enum hybd_io_op */
	__u8	reserved0;
	__u16	flags;		/* HYBD_IO_F_* */
	__u32	nr_bytes;	/* data ops: <= max_io_bytes */
	__u64	sector;		/* 512-byte units */
	__u64	seq;		/* echo in hybd_cqe.seq */
	__u64	reserved1;
};

/*
 * hybd_cqe.result (and a BPF submit()'s -errno) as the block layer and the
 * reader see it: -EOPNOTSUPP, -ENOSPC, -ENODATA (medium error), -ETIMEDOUT
 * and -EILSEQ (integrity error) keep their meaning; every other errno is
 * an I/O error (EIO), in particular -EAGAIN and -ENOMEM, which inside the
 * block layer mean "retry later", not "this request failed".
 */
struct hybd_cqe {
	__u32	tag;
	__s32	result;		/* 0 or -errno (-1..-4095) */
	__u64	seq;		/* hybd_io_desc.seq of the request */
};

/* HYBD_SRV_GET_INFO: what the server needs to map its queues */
struct hybd_srv_info {
	__u32	len;
	__u32	dev_id;
	__u32	nr_hw_queues;
	__u32	queue_depth;
	__u32	max_io_bytes;
	__u32	ring_entries;
	__u64	queue_stride;	/* mmap offset of queue q = q * queue_stride */
	__u64	queue_map_size;	/* bytes to map per queue */
	struct hybd_params params;
	__u64	reserved[4];
};

/* HYBD_SRV_IO flags */
#define HYBD_SRV_IO_WAIT	(1U << 0)	/* block until submissions arrive */
/* don't block: signal the queue's eventfd when submissions arrive */
#define HYBD_SRV_IO_ARM		(1U << 1)
#define HYBD_SRV_IO_ALL		0x3U

/*
 * HYBD_SRV_IO: commit the completions posted in queue q's cq, then (with
 * HYBD_SRV_IO_WAIT) busy-poll for poll_ns and sleep until the kernel has
 * published submissions or someone kicks the queue.
 * Returns >= 0 on success: the number of completions accepted, and sq_tail,
 * the limit to consume to.  Only a call with HYBD_SRV_IO_WAIT marks the
 * submissions up to sq_tail as seen (the next wait sleeps until there are
 * newer ones); a plain commit, e.g. from a thread completing asynchronously,
 * does not.  -ENODEV once the device is dead or
 * deleted, -EINTR on a signal.
 *
 * HYBD_SRV_IO_ARM (HYBD_F_EVENTFD) is the non-blocking form of WAIT, for a
 * worker that waits in poll()/epoll/io_uring instead: it marks the
 * submissions up to the returned sq_tail as seen, and arms the queue's
 * eventfd (HYBD_SRV_SET_EVENTFD; -EINVAL without one), which the kernel
 * signals once when newer submissions are published, and whenever the
 * queue is kicked or dies.  The protocol: ARM; if sq_tail moved, consume
 * up to it and ARM again; else wait for the eventfd (and read it).  WAIT
 * and ARM together are -EINVAL.
 */
struct hybd_srv_io {
	__u32	len;
	__u16	queue;
	__u16	flags;		/* HYBD_SRV_IO_* */
	__u32	sq_tail;	/* out: published submissions (as in the hdr) */
	__u32	reserved0;
};

#define HYBD_SRV_GET_INFO	_IOWR(HYBD_IOC_MAGIC, 0x40, struct hybd_srv_info)
/* add the block device; the workers must already be serving the queues */
#define HYBD_SRV_START		_IO(HYBD_IOC_MAGIC, 0x41)
#define HYBD_SRV_IO		_IOWR(HYBD_IOC_MAGIC, 0x42, struct hybd_srv_io)
/* wake every worker sleeping on queue number arg (they return 0) */
#define HYBD_SRV_KICK		_IO(HYBD_IOC_MAGIC, 0x43)

/*
 * HYBD_SRV_SET_EVENTFD: the eventfd (eventfd(2)) the kernel signals for
 * queue @queue (see HYBD_SRV_IO_ARM); -1 removes it.  The kernel holds its
 * own reference until it is replaced or the server node is closed.  Both
 * the old and the new eventfd are signalled: ARM again after a change.
 */
struct hybd_srv_eventfd {
	__u32	len;
	__u32	queue;
	__s32	fd;
	__u32	reserved0;
};
#define HYBD_SRV_SET_EVENTFD	_IOW(HYBD_IOC_MAGIC, 0x44, struct hybd_srv_eventfd)

/*
 * HYBD_SRV_QUEUE_CPUS: the CPUs whose submissions go to hardware queue
 * @queue (blk-mq's mapping, as made when the device was added), as a
 * bitmap at @mask: CPU n is bit n % 8 of byte n / 8.  nr_cpus is set to
 * the number of CPU ids the kernel may use, and the kernel writes
 * (nr_cpus + 7) / 8 bytes, no more; -ENOSPC (nr_cpus set) if mask_bytes
 * is smaller.  A server pins the queue's worker there: a completion then
 * wakes the submitter on a CPU that shares its caches.
 */
struct hybd_srv_queue_cpus {
	__u32	len;
	__u32	queue;		/* in */
	__u32	nr_cpus;	/* out */
	__u32	mask_bytes;	/* in: size of the buffer at mask */
	__u64	mask;		/* in: user pointer to the bitmap */
	__u32	flags;		/* none defined: 0 */
	__u32	reserved0;
};
#define HYBD_SRV_QUEUE_CPUS	_IOWR(HYBD_IOC_MAGIC, 0x45, struct hybd_srv_queue_cpus)

/*
 * HYBD_SRV_ADD_BACKING (HYBD_F_BACKING): register an open regular file or
 * block device as a backing target of the device, for the fast path to
 * serve requests on.  The kernel takes its own reference to the file (the
 * server may close its descriptor) and checks it: it must be open for
 * reading (and writing with HYBD_BACKING_F_WRITE), support direct I/O,
 * and the device's logical block size must be a multiple of the
 * alignment its direct I/O needs of offsets and lengths (dio_align: what
 * the file system reports with STATX_DIOALIGN, else its disk's logical
 * block size, else 512).  A regular file may be empty (it may grow: a
 * remap may reach up to its current size).  Out: the index (0 ..
 * HYBD_MAX_BACKINGS - 1), the target's size and dio_align.  Errors:
 * -EBADF (no such descriptor, or not open for what flags ask), -EINVAL (not
 * a regular file or block device, an empty block device, misaligned,
 * reserved bits, HYBD_BACKING_F_WRITE on a descriptor opened O_APPEND),
 * -EPERM (HYBD_BACKING_F_WRITE on an append-only file: remapped writes
 * are not appends), -EOPNOTSUPP (unknown flags, no direct I/O), -ELOOP (its
 * I/O may come back to the device, see below), -ENOSPC (every index
 * taken), -E2BIG (see the growth rules), -EINTR (killed while the check,
 * one at a time for all devices, was under way).
 *
 * A remap whose I/O comes back to its own device waits for tags its own
 * requests hold: the device would hang.  The kernel refuses (-ELOOP) the
 * device itself or a partition of it; a file on a file system that keeps
 * anything on it (its data, a btrfs device, an XFS log or realtime
 * device, an ext4 journal), also through overlayfs; another hybd device
 * whose targets lead back to it, followed 8 devices deep, each device
 * once (deeper is refused, as is a stack of more than 1024 targets and
 * devices); and a dm or md device while a stacking driver (dm, md, btrfs)
 * claims the device, as what such a device is built on is not seen.  It
 * cannot see what a loop device, nbd or another user-space server does
 * with its I/O: a stack through one of those is the server's to avoid.
 * The stack is checked when the target is registered, not if it is
 * rebuilt later (a dm table reloaded).
 *
 * Targets go when the server node is released, or one by one with
 * HYBD_SRV_DEL_BACKING (arg: the index; -ENOENT if none is there).  A
 * target taken off while remapped writes to it are in flight, or may not
 * be durable yet, is kept (its file stays open) until they have ended and
 * the kernel has synced it (at once, in a worker; HYBD_SRV_REMAP_BARRIER
 * waits for it): a flush covers every remapped write completed before it,
 * also on targets taken off since, whatever the program makes of the
 * flush: remapped, passed to the server, completed or failed, it waits
 * for those targets to be synced first (in a worker), and a failed sync
 * fails it.  On a device without a write
 * cache (HYBD_DEV_F_WRITE_CACHE unset, or "write through" written to its
 * disk's or front's queue/write_cache in sysfs since), every remapped
 * write, discard and write-zeroes is durable when it completes (a data
 * sync of its range, a FUA write in the front).
 */
#define HYBD_MAX_BACKINGS	16
#define HYBD_BACKING_F_WRITE	(1U << 0)	/* requests may write to it */
#define HYBD_BACKING_F_ALL	0x1U

struct hybd_srv_backing {
	__u32	len;
	__s32	fd;		/* in */
	__u32	flags;		/* in: HYBD_BACKING_F_* */
	__u32	index;		/* out */
	__u64	size;		/* out: bytes */
	__u32	dio_align;	/* out: bytes */
	__u32	reserved0;
	__u64	reserved[2];
};
#define HYBD_SRV_ADD_BACKING	_IOWR(HYBD_IOC_MAGIC, 0x46, struct hybd_srv_backing)
#define HYBD_SRV_DEL_BACKING	_IO(HYBD_IOC_MAGIC, 0x47)

/*
 * HYBD_SRV_REMAP_BARRIER (HYBD_F_REMAP, no argument): returns once every
 * remap whose submit() began before the call has completed.  A server
 * that moves data a program may remap to (a block rewritten elsewhere, a
 * chunk freed and reused) updates the program's map first, then calls
 * this, and only then overwrites or reuses the old place: a remap that
 * read the old mapping is over, and every later one sees the new mapping.
 * Together with HYBD_SRV_DEL_BACKING it also means the kernel no longer
 * uses the deleted target's file: what remapped writes left there is
 * synced (as a flush would: -errno if that fails) and the kernel has
 * dropped its reference (the file's last close, if that was it, may
 * follow a moment later: the kernel defers closing files its workers
 * drop).  It waits for the backing I/O, as long as that takes.
 *
 * A remapped request is the target's I/O, issued by the module's
 * workers: it is not charged to the submitter's cgroup (io.max and the
 * like apply to the device's own requests only), and it ends when the
 * target ends it.  Neither the I/O timeout nor HYBD_DEL_F_FORCE fails it:
 * a target that hangs holds its requests, and a delete, as long as it
 * hangs.
 */
#define HYBD_SRV_REMAP_BARRIER	_IO(HYBD_IOC_MAGIC, 0x48)

/*
 * HYBD_SRV_RESIZE (HYBD_F_RESIZE), two uses:
 * - flags 0: the server resizes its own device to @size, as
 *   HYBD_CTL_RESIZE does (a shrink waits for the requests in flight to
 *   end, and is refused while a fast path is attached) but without asking
 *   it: a grow only once it serves the new blocks, a shrink before it lets
 *   go of the old ones (the ring headers' dev_size says when it may).  Not from a worker holding requests on a shrink:
 *   the shrink would wait for them until -EBUSY.
 * - HYBD_SRV_RESIZE_F_ANSWER: answer resize request @gen (HYBD_RING_RESIZE)
 *   with @result, 0 or a negative errno; @size is ignored.  -ESTALE if
 *   that request is not the one waiting (it timed out, or was
 *   interrupted).
 * The same errors as HYBD_CTL_RESIZE otherwise.
 */
#define HYBD_SRV_RESIZE_F_ANSWER	(1U << 0)
#define HYBD_SRV_RESIZE_F_ALL		0x1U

struct hybd_srv_resize {
	__u32	len;
	__u32	flags;		/* HYBD_SRV_RESIZE_F_* */
	__u64	size;		/* bytes */
	__u32	gen;		/* HYBD_SRV_RESIZE_F_ANSWER: resize_gen */
	__s32	result;		/* HYBD_SRV_RESIZE_F_ANSWER: 0 or -errno */
	__u64	reserved[2];
};
#define HYBD_SRV_RESIZE		_IOW(HYBD_IOC_MAGIC, 0x49, struct hybd_srv_resize)

/*
 * ---------------------------------------------------------------------
 * The BPF fast path
 * ---------------------------------------------------------------------
 *
 * A program is a struct_ops map of type struct hybd_bpf_ops, attached to
 * one device (dev_id, set by the loader) through a BPF link.  submit()
 * runs in queue_rq for every request; complete() runs when a request the
 * program passed to the slow path, or remapped, has finished, before the
 * block layer sees it, so the program can cache the data just read.
 * Neither may sleep: submit() runs under RCU, and complete() in the
 * server's system call or, for a remap, wherever the backing I/O ends (a
 * kernel worker, a softirq, or the target's hard interrupt).
 *
 * Attaching and replacing need CAP_SYS_ADMIN (as adding a device does;
 * -EPERM) and a device that is added or live (-ENODEV for a dead or
 * deleting one); hybd's kfuncs are for struct hybd_bpf_ops programs only.
 * A program belongs to the device it was attached to: deleting the device
 * drops it (its link stays, attached to nothing), and a later device with
 * the same id never sees it.  A loaded struct_ops map is attached once:
 * after it left its device (detached, replaced, or the device deleted) its
 * maps have missed writes, and attaching or replacing with it again fails
 * with -ESTALE; load the object again.
 */

/*
 * submit() return values; -errno (-1..-4095) completes with that error.
 *
 * HYBD_BPF_DONE ends the request in the kernel and the server never sees
 * it: for a read, the program must have filled the whole payload first
 * (hybd_bpf_io_zero(), or hybd_bpf_io_copy_in() from offset 0 up, in
 * order), else the read fails with EIO and counts in bpf_unfilled; for a
 * write, flush, discard or write-zeroes, DONE means the server never
 * stores, flushes or discards anything: the program has taken that on.
 *
 * HYBD_BPF_PASS_ZEROES (HYBD_F_PASS_ZEROES) is for a write only: the
 * program has checked that the payload is all zero
 * (hybd_bpf_io_is_zero()); on a device whose server asked for it
 * (HYBD_DEV_F_ZERO_WRITES), the server gets the request as
 * HYBD_OP_WRITE_ZEROES of the same range and flags (FUA included) plus
 * HYBD_IO_F_NOUNMAP (a write of zeros provisions what it writes), and the
 * payload is not copied to it.  The program takes responsibility for the
 * payload being zero, as it does for DONE.  On a device without
 * HYBD_DEV_F_ZERO_WRITES, or for a write longer than its
 * max_write_zeroes_bytes, it is the same as HYBD_BPF_PASS (the write goes
 * as it is): a server never gets a write-zeroes it did not agree to.  For any other operation it is
 * outside the contract: counted in bpf_bad_ret and the request fails with
 * EIO.  complete() still sees io->op == HYBD_OP_WRITE (the program's view
 * of a request never changes), with the server's result.
 */
#define HYBD_BPF_DONE		0	/* completed in the kernel, success */
#define HYBD_BPF_PASS		1	/* goes to the user-space server */
#define HYBD_BPF_PASS_ZEROES	2	/* a zero write: goes as write-zeroes */
/*
 * HYBD_BPF_REMAPPED (HYBD_F_REMAP): submit() called hybd_bpf_io_remap()
 * for the request, which returned 0; the kernel serves the request on that
 * backing target, without the server, and complete() runs when it is done
 * (io->path is HYBD_BPF_PATH_REMAP).  Returned without a successful remap,
 * it is outside the contract (bpf_bad_ret, EIO).  A remap the program made
 * but did not return REMAPPED for is dropped.
 *
 * What the kernel does, at the target's byte offset the program gave:
 *   READ, WRITE    on a block device, clones of the request's bios (no
 *                  copy), submitted by queue_rq in the submitter's own
 *                  context, as dm-linear maps a bio (from a plug's flush,
 *                  direct I/O from the device's kernel worker); FUA, or a
 *                  write on a device without a write cache, is a FUA
 *                  write.  Where the target's page cache holds any of
 *                  the range, direct I/O from the worker instead, which
 *                  keeps that cache coherent.  On a
 *                  file, direct I/O on the request's own pages (no copy),
 *                  from the device's kernel worker; FUA becomes a data
 *                  sync of the range; an I/O that stops short goes on
 *                  from where it stopped, and a read that gets nothing
 *                  more (the file ends: it was truncated under it) reads
 *                  as zeros past what it got, as with the loop driver;
 *   FLUSH          fdatasync of the named target and of every target
 *                  written through a remap since its last flush (also
 *                  those taken off the device since);
 *   DISCARD        a file: punch a hole (nothing if its file system
 *                  cannot); a block device: a discard if it takes them,
 *                  else nothing (a discard is a hint);
 *   WRITE_ZEROES   a file: punch a hole, or zero the range for NOUNMAP
 *                  (and where holes cannot be punched); a block device:
 *                  zero-out.
 * The request ends with the status of that I/O.  hybd_bpf_io_remap()
 * refuses (-EINVAL) a read or write whose memory the target's direct I/O
 * cannot take as it is: each segment's address and length aligned as the
 * target needs (a target with 4 KiB sectors, and a buffer that starts
 * 512 bytes into a page); the program passes it to the server then.
 *
 * Consistency with the slow path: a remap reads and writes the target as
 * it is when the kernel gets to it.  A server that moves data a program
 * remaps to updates the program's map first, then calls
 * HYBD_SRV_REMAP_BARRIER, and only then reuses the old place.
 */
#define HYBD_BPF_REMAPPED	3

/* hybd_bpf_io.path in complete(): who served the request */
#define HYBD_BPF_PATH_SLOW	0	/* the server */
#define HYBD_BPF_PATH_REMAP	1	/* a backing target, remapped */

/* hybd_bpf_io.tag in map(), and in complete() for what map() remapped */
#define HYBD_BPF_TAG_FRONT	0xffffU

/*
 * The request as a program sees it.  Read-only but for scratch, which
 * submit() may write and complete() reads back (e.g. a version stamp).
 */
struct hybd_bpf_io {
	__u32	op;		/* enum hybd_io_op */
	__u32	flags;		/* HYBD_IO_F_* */
	__u64	sector;		/* 512-byte units */
	__u32	bytes;		/* payload length (0 for flush) */
	__u32	dev_id;
	__u16	queue;		/* hardware queue */
	__u16	tag;
	__s32	result;		/* complete(): 0 or -errno from the server */
	/*
	 * complete(): 1 if this program's submit() passed the request, so
	 * scratch is its own; 0 if it was submitted before this program was
	 * attached (or by a program it replaced).  complete() runs for every
	 * slow-path completion either way, so that writes issued before an
	 * attach still invalidate what the new program caches.
	 */
	__u32	own;
	__u32	path;		/* complete(): HYBD_BPF_PATH_* */
	__u64	scratch;	/* program-owned, per request */
#ifdef __KERNEL__
	/*
	 * Not the program's (it is not in the programs' view of the struct,
	 * and the kernel never sets it).  A struct of scalars only is one
	 * the verifier lets a program pass a kfunc from its own stack or
	 * maps; with a pointer in it, the kfuncs take only the io the
	 * kernel gave.
	 */
	void	*kernel_only;
#endif
};

#define HYBD_BPF_NAME_LEN	16

/**
 * struct hybd_bpf_ops - a fast path
 * @dev_id: the device to attach to
 * @flags: none defined: must be zero
 * @name: shown by info and stats
 */
struct hybd_bpf_ops {
	/**
	 * @submit: called for every request, before the server sees it.
	 *
	 * A read's payload is not the device's data yet: the kfuncs that
	 * read a payload refuse it here.  May write io->scratch.
	 *
	 * Context: queue_rq, under RCU; must not sleep.
	 *
	 * Return: HYBD_BPF_DONE (see above), HYBD_BPF_PASS,
	 * HYBD_BPF_PASS_ZEROES for a write, HYBD_BPF_REMAPPED after a
	 * successful hybd_bpf_io_remap() (see above), or -errno to fail
	 * the request; anything else fails it with EIO and counts in
	 * bpf_bad_ret.
	 */
	int	(*submit)(struct hybd_bpf_io *io);
	/**
	 * @complete: called when the server, or a remap, has finished a
	 * request (optional), before the block layer sees it; io->result is
	 * its status, io->path who served it (HYBD_BPF_PATH_*), io->own
	 * whether this program's submit() passed or remapped it.  A read's
	 * payload is readable only if io->result is 0.
	 *
	 * For a bio the front remapped (io->tag HYBD_BPF_TAG_FRONT),
	 * io->result -EAGAIN most often means the bio asked not to wait and
	 * the block layer could not take it so (remap_waited counts those;
	 * a blk-mq target did none of it, a bio-based one may have done a
	 * first part): if its submitter starts it again, all of it comes
	 * back through map().  That is not the target failing, and a
	 * program that picks among targets must not take -EAGAIN alone for
	 * a path error; loop and ublk targets also end some failed I/O with
	 * AGAIN, which the program cannot tell apart from it yet.
	 *
	 * Context: the server's commit (process context, under RCU), or for
	 * a remap the request's or the clone's completion, in any context
	 * (a remap worker, a softirq, the target's hard interrupt or its own
	 * worker, or the submitter's own submit_bio()); must not sleep.
	 *
	 * Return: nothing; the request ends with that status.
	 */
	void	(*complete)(struct hybd_bpf_io *io);
	/**
	 * @map: on a device with a bio-based front (HYBD_DEV_F_BIO_FRONT),
	 * called for every read and write bio the front takes, before any
	 * request exists: it may only remap (hybd_bpf_io_remap()) or pass
	 * (optional; without it the front passes everything).
	 *
	 * io->tag is HYBD_BPF_TAG_FRONT and io->queue the submitting CPU's
	 * queue; the kfuncs that move data refuse such an io (-EINVAL), and
	 * io->scratch goes to complete() only for a remap.  What map() passes
	 * goes on to the request-based disk, where submit() sees it as a
	 * request as on any device, maybe merged with others: map() must
	 * leave no trace of a bio it passes (no counting, no state), since
	 * the kernel may also drop its remap and pass the bio (a file
	 * target, a target's page cache holding the range, a submitter that
	 * must not wait on a target that may, no memory at once).
	 *
	 * complete() runs for a remap map() made, with io->path
	 * HYBD_BPF_PATH_REMAP and io->tag HYBD_BPF_TAG_FRONT.
	 *
	 * Context: the submitter's submit_bio(), under RCU; must not sleep.
	 *
	 * Return: HYBD_BPF_REMAPPED after a successful hybd_bpf_io_remap()
	 * on a block-device target, or HYBD_BPF_PASS; anything else passes
	 * the bio and counts in bpf_bad_ret.
	 */
	int	(*map)(struct hybd_bpf_io *io);
	__u32	dev_id;
	__u32	flags;
	char	name[HYBD_BPF_NAME_LEN];
};

#endif /* _UAPI_HYBD_H */
