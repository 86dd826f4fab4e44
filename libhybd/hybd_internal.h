/* SPDX-License-Identifier: MIT */
/*
 * libhybd private declarations.  Nothing here is part of the ABI; the unit
 * tests include it to reach the pure helpers.
 */
#ifndef LIBHYBD_INTERNAL_H
#define LIBHYBD_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "hybd.h"

#define HYBD_DEV_DIR		"/dev/"
#define HYBD_CONTROL_PATH	HYBD_DEV_DIR HYBD_CONTROL_NAME
#define HYBD_SECTOR_SHIFT	9
/* hybd_errmsg()'s buffer: room for a verifier log excerpt too */
#define HYBD_ERRMSG_MAX		4096

#define hybd_load_acquire(p)	__atomic_load_n((p), __ATOMIC_ACQUIRE)
#define hybd_store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define hybd_read_once(p)	__atomic_load_n((p), __ATOMIC_RELAXED)
#define hybd_write_once(p, v)	__atomic_store_n((p), (v), __ATOMIC_RELAXED)

static inline int hybd__is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

/* struct hybd_driver as libhybd 1.0-1.2 knew it: the five handlers */
#define HYBD_DRIVER_SIZE_1_0	offsetof(struct hybd_driver, queue_init)
/* the largest io_priv_size and queue_threads */
#define HYBD_MAX_IO_PRIV	(1U << 20)
#define HYBD_MAX_QUEUE_THREADS	256

struct hybd_queue;

struct hybd_io {
	struct hybd_queue	*q;
	uint64_t		seq;	/* echoed in the completion */
	uint64_t		offset;	/* bytes */
	uint32_t		len;
	uint32_t		tag;
	uint16_t		flags;	/* HYBD_IO_F_* */
	uint8_t			op;	/* enum hybd_io_op */
	uint8_t			busy;	/* handed to a handler, not completed */
	void			*data;	/* hybd_io_data() */
	struct hybd_io		*next;	/* in the queue's pool list */
};

struct hybd_watch {
	int			fd;	/* -1: unwatched, the slot is dropped
					 * before the next poll */
	short			events;	/* POLLIN, POLLOUT, ... */
	hybd_fd_cb		cb;	/* hybd_queue_watch_fd() */
	hybd_fd_events_cb	ecb;	/* hybd_queue_watch_fd_events() */
	void			*arg;
};

/* The handler threads of a queue (hybd_config.queue_threads > 1). */
struct hybd_pool {
	pthread_mutex_t		lock;
	pthread_cond_t		cond;
	struct hybd_io		*head, **tailp;	/* requests waiting */
	bool			stop;
	unsigned int		nr_threads;
	pthread_t		*threads;
};

/* One hardware queue: its shared area and its worker. */
struct hybd_queue {
	struct hybd_dev		*dev;
	unsigned int		id;

	void			*area;	/* mmap of queue_map_size bytes */
	size_t			area_size;
	struct hybd_ring_hdr	*hdr;
	uint32_t		*sq;
	struct hybd_cqe		*cq;
	struct hybd_io_desc	*desc;
	unsigned char		*data;
	uint32_t		ring_mask;	/* ring_entries - 1 */
	uint32_t		depth;
	uint32_t		max_io;

	uint32_t		sq_head;	/* our copy: we own hdr->sq_head */
	pthread_mutex_t		cq_lock;	/* worker vs async completions */
	uint32_t		cq_tail;	/* under cq_lock; we own it */
	unsigned int		completers;	/* atomic: hybd_io_complete()
						 * callers inside, not worker */

	struct hybd_io		*ios;		/* [depth] */
	void			*io_data;	/* [depth][io_priv_size] */
	void			*priv;		/* hybd_queue_set_priv() */
	pthread_t		thread;
	bool			has_thread;
	int			init_state;	/* 0: running queue_init, 1:
						 * done, < 0: it failed */
	char			init_msg[256];	/* hybd_errmsg() of a failure */

	/* event mode: the worker polls the eventfd and the watched fds */
	int			efd;
	bool			event_mode;	/* chosen after queue_init */
	unsigned int		nr_watch;
	struct hybd_watch	watch[HYBD_QUEUE_MAX_FDS];

	struct hybd_pool	*pool;
} __attribute__((aligned(64)));

struct hybd_dev {
	uint32_t		id;
	int			srv_fd;
	char			path[32];
	uint64_t		size;
	uint32_t		lib_flags;
	uint32_t		io_priv_size;	/* rounded up to 64 */
	uint32_t		queue_threads;
	uint64_t		features;	/* HYBD_F_* of the module */
	struct hybd_driver	drv;		/* zero beyond the caller's */
	/* the caller's, with the kernel's parameters (hybd_dev_config()) */
	struct hybd_config	cfg;
	void			*priv;

	unsigned int		nr_queues;
	struct hybd_queue	*queues;	/* [nr_queues] */

	int			stop;		/* atomic: workers must exit */
	bool			started;	/* HYBD_SRV_START succeeded */
	bool			attached;	/* HYBD_CFG_ATTACH: resume it */
	int			handed_over;	/* atomic: a worker drained */
	uint32_t		resize_gen;	/* queue 0's worker: last answered */
	/*
	 * Resizes (dev.c): the size the kernel committed last as seen in
	 * queue 0's dev_size, a grow accepted but not committed yet (0:
	 * none), under @resize_lock; the library serves the larger.
	 */
	pthread_mutex_t		resize_lock;
	uint64_t		committed;	/* atomic reads outside the lock */
	uint64_t		grow_pending;
	bool			has_dev_size;	/* the module publishes dev_size */
	pthread_mutex_t		lock;		/* protects what follows */
	pthread_cond_t		cond;
	unsigned int		nr_running;	/* workers alive */
	unsigned int		nr_waiters;	/* threads in hybd_dev_wait() */
	int			worker_err;	/* first fatal worker error */
	/*
	 * a worker saw the device deleted (-ENODEV): its id may belong to
	 * someone else's device by now, so nothing deletes by id any more
	 */
	bool			gone;
};

/* errors.c */
int hybd__err(int err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
int hybd__param_errmsg(char *buf, size_t size, const struct hybd_params *p,
		       int32_t dev_id, uint32_t err_param, int err);

/* parse.c */
void hybd__ops_str(uint32_t ops, char *buf, size_t size);

/* ctl.c */
int hybd__ctl_del(uint32_t id);
int hybd__resize_err(int err, uint32_t id, uint64_t size);
int hybd__ctl_add_params(const struct hybd_params *p, int32_t dev_id,
			 uint32_t *id_out);
int hybd__config_to_params(const struct hybd_config *cfg,
			   struct hybd_params *p);
int hybd__resolve_ops(struct hybd_config *cfg, uint32_t have);
uint32_t hybd__driver_ops(const struct hybd_driver *drv);
unsigned int hybd__default_queues(long cpus);

/* bpf.c */
size_t hybd__bpf_log_condense(char *out, size_t size, const char *log);
void hybd__bpf_pin_path(char *buf, size_t size, uint32_t dev_id,
			const char *what);

/* bpf_maps.c */
struct bpf_object;
int hybd__bpf_size_maps(struct bpf_object *obj, uint32_t dev_id,
			const char *path);
void hybd__bpf_reuse_maps(struct bpf_object *obj,
			  int (*old)(void *ctx, const char *name), void *ctx);

/* queue.c */
int hybd__queue_init(struct hybd_queue *q, struct hybd_dev *dev,
		     unsigned int id, void *area, size_t size,
		     const struct hybd_srv_info *info);
void hybd__queue_exit(struct hybd_queue *q);
unsigned int hybd__queue_drain(struct hybd_queue *q);
void *hybd__worker(void *arg);
void hybd__worker_stopped(struct hybd_queue *q, int err);
bool hybd__on_worker(void);

/* dev.c */
void hybd__resize_answer(struct hybd_dev *dev, struct hybd_ring_hdr *hdr);
void hybd__resize_check(struct hybd_dev *dev, struct hybd_ring_hdr *hdr);

#endif /* LIBHYBD_INTERNAL_H */
