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

struct hybd_queue;

struct hybd_io {
	struct hybd_queue	*q;
	uint64_t		seq;	/* echoed in the completion */
	uint32_t		tag;
	uint16_t		flags;	/* HYBD_IO_F_* */
	uint8_t			op;	/* enum hybd_io_op */
	uint8_t			busy;	/* handed to a handler, not completed */
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
	pthread_t		thread;
	bool			has_thread;
} __attribute__((aligned(64)));

struct hybd_dev {
	uint32_t		id;
	int			srv_fd;
	char			path[32];
	uint64_t		size;
	uint32_t		lib_flags;
	struct hybd_driver	drv;
	void			*priv;

	unsigned int		nr_queues;
	struct hybd_queue	*queues;	/* [nr_queues] */

	int			stop;		/* atomic: workers must exit */
	bool			started;	/* HYBD_SRV_START succeeded */
	pthread_mutex_t		lock;		/* protects what follows */
	pthread_cond_t		cond;
	unsigned int		nr_running;	/* workers alive */
	unsigned int		nr_waiters;	/* threads in hybd_dev_wait() */
	int			worker_err;	/* first fatal worker error */
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
int hybd__config_to_params(const struct hybd_config *cfg,
			   struct hybd_params *p);

/* bpf.c */
size_t hybd__bpf_log_condense(char *out, size_t size, const char *log);

/* queue.c */
int hybd__queue_init(struct hybd_queue *q, struct hybd_dev *dev,
		     unsigned int id, void *area, size_t size,
		     const struct hybd_srv_info *info);
void hybd__queue_exit(struct hybd_queue *q);
unsigned int hybd__queue_drain(struct hybd_queue *q);
void *hybd__worker(void *arg);

#endif /* LIBHYBD_INTERNAL_H */
