// SPDX-License-Identifier: MIT
/*
 * One hardware queue: its shared rings and the worker thread serving it.
 *
 * The worker loops on HYBD_SRV_IO(WAIT), which hands the kernel the
 * completions posted since the last call and sleeps until submissions
 * arrive; it then drains the submission ring, calls a handler per request
 * and posts each result on the completion ring.  Completions may also come
 * from other threads (HYBD_IO_ASYNC), hence the per-queue cq_lock.
 *
 * Everything read from the shared area is checked: the kernel owns it, but
 * a wild write elsewhere in this process must cost a request, not a crash.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "hybd_internal.h"

/* The worker of the queue this thread serves, NULL in other threads. */
static __thread struct hybd_queue *hybd_current_queue;

/* Does [off, off + len) fit in @size, with @off aligned to @align? */
static int region_ok(uint64_t off, uint64_t len, uint64_t align, size_t size)
{
	return off >= sizeof(struct hybd_ring_hdr) && !(off % align) &&
	       off <= size && len <= size - off;
}

int hybd__queue_init(struct hybd_queue *q, struct hybd_dev *dev,
		     unsigned int id, void *area, size_t size,
		     const struct hybd_srv_info *info)
{
	struct hybd_ring_hdr *hdr = area;
	uint32_t entries, depth, max_io, sq_off, cq_off, desc_off, data_off;
	const char *what = NULL;
	unsigned int i;

	if (size < sizeof(*hdr))
		return hybd__err(-EPROTO, "queue %u: %zu-byte mapping too small",
				 id, size);
	entries = hybd_read_once(&hdr->ring_entries);
	depth = hybd_read_once(&hdr->queue_depth);
	max_io = hybd_read_once(&hdr->max_io_bytes);
	sq_off = hybd_read_once(&hdr->sq_off);
	cq_off = hybd_read_once(&hdr->cq_off);
	desc_off = hybd_read_once(&hdr->desc_off);
	data_off = hybd_read_once(&hdr->data_off);

	if (hybd_read_once(&hdr->queue_id) != id)
		what = "queue_id";
	else if (!hybd__is_pow2(entries) || entries < depth ||
		 entries != info->ring_entries)
		what = "ring_entries";
	else if (!depth || depth != info->queue_depth)
		what = "queue_depth";
	else if (!max_io || max_io != info->max_io_bytes)
		what = "max_io_bytes";
	else if (!region_ok(sq_off, (uint64_t)entries * sizeof(*q->sq),
			    sizeof(*q->sq), size))
		what = "sq_off";
	else if (!region_ok(cq_off, (uint64_t)entries * sizeof(*q->cq),
			    sizeof(uint64_t), size))
		what = "cq_off";
	else if (!region_ok(desc_off, (uint64_t)depth * sizeof(*q->desc),
			    sizeof(uint64_t), size))
		what = "desc_off";
	else if (!region_ok(data_off, (uint64_t)depth * max_io, 1, size))
		what = "data_off";
	if (what)
		return hybd__err(-EPROTO,
				 "queue %u: the kernel's ring header is inconsistent (%s)",
				 id, what);

	memset(q, 0, sizeof(*q));
	q->ios = calloc(depth, sizeof(*q->ios));
	if (!q->ios)
		return hybd__err(-ENOMEM, "queue %u: no memory for %u requests",
				 id, depth);
	for (i = 0; i < depth; i++) {
		q->ios[i].q = q;
		q->ios[i].tag = i;
	}
	q->dev = dev;
	q->id = id;
	q->area = area;
	q->area_size = size;
	q->hdr = hdr;
	q->sq = (uint32_t *)((char *)area + sq_off);
	q->cq = (struct hybd_cqe *)((char *)area + cq_off);
	q->desc = (struct hybd_io_desc *)((char *)area + desc_off);
	q->data = (unsigned char *)area + data_off;
	q->ring_mask = entries - 1;
	q->depth = depth;
	q->max_io = max_io;
	q->sq_head = hybd_read_once(&hdr->sq_head);
	q->cq_tail = hybd_read_once(&hdr->cq_tail);
	pthread_mutex_init(&q->cq_lock, NULL);
	return 0;
}

void hybd__queue_exit(struct hybd_queue *q)
{
	pthread_mutex_destroy(&q->cq_lock);
	free(q->ios);
	q->ios = NULL;
}

/* Hand the completions posted on queue sio->queue to the kernel. */
static int srv_commit(int srv_fd, struct hybd_srv_io *sio)
{
	int ret;

	sio->len = sizeof(*sio);
	sio->flags = 0;
	do {
		ret = ioctl(srv_fd, HYBD_SRV_IO, sio);
	} while (ret < 0 && errno == EINTR);
	return ret < 0 ? -errno : ret;
}

/*
 * Put one completion on the ring.  It cannot be full: each cqe is for a tag
 * in flight and the ring has room for every tag.  If the kernel lags anyway,
 * hand it what is there; if it is gone, the completion has nowhere to go.
 */
static void queue_post(struct hybd_queue *q, uint32_t tag, int32_t result,
		       uint64_t seq)
{
	struct hybd_srv_io sio = { .queue = q->id };
	struct hybd_cqe *cqe;
	unsigned int tries = 0;

	pthread_mutex_lock(&q->cq_lock);
	while (q->cq_tail - hybd_load_acquire(&q->hdr->cq_head) > q->ring_mask) {
		if (srv_commit(q->dev->srv_fd, &sio) < 0 || ++tries > 1000) {
			pthread_mutex_unlock(&q->cq_lock);
			return;
		}
		sched_yield();
	}
	cqe = &q->cq[q->cq_tail & q->ring_mask];
	hybd_write_once(&cqe->tag, tag);
	hybd_write_once(&cqe->result, result);
	hybd_write_once(&cqe->seq, seq);
	q->cq_tail++;
	hybd_store_release(&q->hdr->cq_tail, q->cq_tail);
	pthread_mutex_unlock(&q->cq_lock);
}

/* Post @io's result, once.  Returns 1 if posted, 0 if already completed. */
static int io_finish(struct hybd_io *io, int result)
{
	uint64_t seq = io->seq;

	if (result > 0 || result < -4095)
		result = -EIO;	/* the kernel accepts 0 or -errno only */
	if (!__atomic_exchange_n(&io->busy, 0, __ATOMIC_ACQ_REL))
		return 0;
	queue_post(io->q, io->tag, result, seq);
	return 1;
}

void hybd_io_complete(struct hybd_io *io, int result)
{
	struct hybd_queue *q = io->q;
	struct hybd_srv_io sio = { .queue = q->id };

	/* The worker hands its own completions over when it next waits. */
	if (hybd_current_queue == q) {
		io_finish(io, result);
		return;
	}

	/*
	 * Another thread: commit now.  The kernel then takes every submission
	 * published so far as seen by the server, so unless the worker has
	 * consumed up to the tail we got back, kick it or it may sleep on
	 * them.  Once posted, the request can finish and a graceful delete
	 * return; hybd_dev_delete() waits for completers to leave before it
	 * unmaps the queue.
	 */
	__atomic_add_fetch(&q->completers, 1, __ATOMIC_SEQ_CST);
	if (io_finish(io, result) && srv_commit(q->dev->srv_fd, &sio) >= 0 &&
	    sio.sq_tail != hybd_load_acquire(&q->hdr->sq_head))
		ioctl(q->dev->srv_fd, HYBD_SRV_KICK, (unsigned long)q->id);
	__atomic_sub_fetch(&q->completers, 1, __ATOMIC_RELEASE);
}

static int in_range(const struct hybd_dev *dev, uint64_t sector, uint32_t len)
{
	uint64_t sectors = dev->size >> HYBD_SECTOR_SHIFT;

	return sector <= sectors &&
	       len <= dev->size - (sector << HYBD_SECTOR_SHIFT);
}

/* Call the handler for @d.  Returns what the handler did, or -errno. */
static int io_dispatch(struct hybd_queue *q, struct hybd_io *io,
		       const struct hybd_io_desc *d)
{
	const struct hybd_driver *drv = &q->dev->drv;
	uint64_t off = d->sector << HYBD_SECTOR_SHIFT;
	void *buf = q->data + (size_t)io->tag * q->max_io;
	uint32_t len = d->nr_bytes;

	if (d->op >= HYBD_OP_MAX)
		return -EIO;
	if (d->op == HYBD_OP_FLUSH)
		return drv->flush ? drv->flush(io) : -EOPNOTSUPP;
	if (!in_range(q->dev, d->sector, len))
		return -EIO;

	switch (d->op) {
	case HYBD_OP_READ:
		if (!len || len > q->max_io)
			return -EIO;
		return drv->read ? drv->read(io, buf, off, len) : -EOPNOTSUPP;
	case HYBD_OP_WRITE:
		if (!len || len > q->max_io)
			return -EIO;
		return drv->write ? drv->write(io, buf, off, len) : -EOPNOTSUPP;
	case HYBD_OP_DISCARD:
		return drv->discard ? drv->discard(io, off, len) : -EOPNOTSUPP;
	case HYBD_OP_WRITE_ZEROES:
		return drv->write_zeroes ? drv->write_zeroes(io, off, len) :
					   -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

/* Take one request off the submission ring and serve it. */
static void queue_handle(struct hybd_queue *q, uint32_t tag)
{
	const struct hybd_io_desc *shared;
	struct hybd_io_desc d;
	struct hybd_io *io;
	int ret;

	if (tag >= q->depth)
		return;		/* no request to complete: nothing we can do */

	/* Read the descriptor once; what we check is what we use. */
	shared = &q->desc[tag];
	memset(&d, 0, sizeof(d));
	d.op = hybd_read_once(&shared->op);
	d.flags = hybd_read_once(&shared->flags);
	d.nr_bytes = hybd_read_once(&shared->nr_bytes);
	d.sector = hybd_read_once(&shared->sector);
	d.seq = hybd_read_once(&shared->seq);

	io = &q->ios[tag];
	if (__atomic_load_n(&io->busy, __ATOMIC_ACQUIRE)) {
		/* A tag we still hold came again: fail the newcomer only. */
		queue_post(q, tag, -EIO, d.seq);
		return;
	}
	io->seq = d.seq;
	io->op = d.op;
	io->flags = d.flags;
	__atomic_store_n(&io->busy, 1, __ATOMIC_RELAXED);

	ret = io_dispatch(q, io, &d);
	if (ret != HYBD_IO_ASYNC)
		io_finish(io, ret);
}

/*
 * Serve every submission published so far.  Returns how many there were.
 * Called by the worker only.
 */
unsigned int hybd__queue_drain(struct hybd_queue *q)
{
	uint32_t head = q->sq_head;
	uint32_t tail = hybd_load_acquire(&q->hdr->sq_tail);
	unsigned int n = 0;

	/* The kernel never has more than a ring's worth outstanding. */
	if (tail - head > q->ring_mask + 1)
		tail = head + q->ring_mask + 1;
	while (head != tail) {
		queue_handle(q, hybd_read_once(&q->sq[head & q->ring_mask]));
		head++;
		n++;
	}
	q->sq_head = head;
	hybd_store_release(&q->hdr->sq_head, head);
	return n;
}

void *hybd__worker(void *arg)
{
	struct hybd_queue *q = arg;
	struct hybd_dev *dev = q->dev;
	struct hybd_srv_io sio;
	int err = 0, stop, pending;

	hybd_current_queue = q;
	for (;;) {
		/*
		 * Commit, and wait unless told to stop or submissions are
		 * already visible (another thread's commit may have made the
		 * kernel think we saw them: never sleep on them).
		 */
		stop = hybd_load_acquire(&dev->stop);
		pending = hybd_load_acquire(&q->hdr->sq_tail) != q->sq_head;
		memset(&sio, 0, sizeof(sio));
		sio.len = sizeof(sio);
		sio.queue = q->id;
		sio.flags = stop || pending ? 0 : HYBD_SRV_IO_WAIT;
		if (ioctl(dev->srv_fd, HYBD_SRV_IO, &sio) < 0) {
			if (errno == EINTR)
				continue;
			if (errno != ENODEV)	/* ENODEV: device gone */
				err = -errno;
			break;
		}
		if (stop)
			break;
		hybd__queue_drain(q);
	}

	pthread_mutex_lock(&dev->lock);
	if (err && !dev->worker_err)
		dev->worker_err = err;
	if (!--dev->nr_running)
		pthread_cond_broadcast(&dev->cond);
	pthread_mutex_unlock(&dev->lock);
	return NULL;
}

enum hybd_io_op hybd_io_op(const struct hybd_io *io)
{
	return (enum hybd_io_op)io->op;
}

uint32_t hybd_io_flags(const struct hybd_io *io)
{
	return io->flags;
}

unsigned int hybd_io_queue(const struct hybd_io *io)
{
	return io->q->id;
}

unsigned int hybd_io_tag(const struct hybd_io *io)
{
	return io->tag;
}

struct hybd_dev *hybd_io_dev(const struct hybd_io *io)
{
	return io->q->dev;
}

void *hybd_io_priv(const struct hybd_io *io)
{
	return io->q->dev->priv;
}
