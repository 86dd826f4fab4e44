// SPDX-License-Identifier: MIT
/*
 * One hardware queue: its shared rings and the worker thread serving it.
 *
 * The worker loops on HYBD_SRV_IO(WAIT), which hands the kernel the
 * completions posted since the last call and sleeps until submissions
 * arrive; it then drains the submission ring, calls a handler per request
 * and posts each result on the completion ring.  Completions may also come
 * from other threads (HYBD_IO_ASYNC, the pool), hence the per-queue
 * cq_lock.
 *
 * A queue with watched fds runs in event mode instead: HYBD_SRV_IO(ARM)
 * commits and arms the queue's eventfd without sleeping, and the worker
 * sleeps in poll() on that eventfd and the watched fds.
 *
 * Everything read from the shared area is checked: the kernel owns it, but
 * a wild write elsewhere in this process must cost a request, not a crash.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "hybd_internal.h"

/* The worker of the queue this thread serves, NULL in other threads. */
static __thread struct hybd_queue *hybd_current_queue;

/*
 * Does [off, off + len) fit in @size after a header of @hdr bytes, with
 * @off aligned to @align?
 */
static int region_ok(uint64_t off, uint64_t len, uint64_t align, size_t size,
		     size_t hdr)
{
	return off >= hdr && !(off % align) && off <= size && len <= size - off;
}

int hybd__queue_init(struct hybd_queue *q, struct hybd_dev *dev,
		     unsigned int id, void *area, size_t size,
		     const struct hybd_srv_info *info)
{
	struct hybd_ring_hdr *hdr = area;
	uint32_t entries, depth, max_io, sq_off, cq_off, desc_off, data_off;
	const char *what = NULL;
	unsigned int i;
	/* the header of the first modules; the rings tell how long it is */
	size_t hdr_size = offsetof(struct hybd_ring_hdr, resize_gen);

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
			    sizeof(*q->sq), size, hdr_size))
		what = "sq_off";
	else if (!region_ok(cq_off, (uint64_t)entries * sizeof(*q->cq),
			    sizeof(uint64_t), size, hdr_size))
		what = "cq_off";
	else if (!region_ok(desc_off, (uint64_t)depth * sizeof(*q->desc),
			    sizeof(uint64_t), size, hdr_size))
		what = "desc_off";
	else if (!region_ok(data_off, (uint64_t)depth * max_io, 1, size,
			    hdr_size))
		what = "data_off";
	if (what)
		return hybd__err(-EPROTO,
				 "queue %u: the kernel's ring header is inconsistent (%s)",
				 id, what);

	memset(q, 0, sizeof(*q));
	q->efd = -1;
	q->ios = calloc(depth, sizeof(*q->ios));
	if (!q->ios)
		return hybd__err(-ENOMEM, "queue %u: no memory for %u requests",
				 id, depth);
	if (dev->io_priv_size) {
		q->io_data = aligned_alloc(64, (size_t)depth *
						   dev->io_priv_size);
		if (!q->io_data) {
			free(q->ios);
			return hybd__err(-ENOMEM,
					 "queue %u: no memory for %u x %u bytes of request data",
					 id, depth, dev->io_priv_size);
		}
		memset(q->io_data, 0, (size_t)depth * dev->io_priv_size);
	}
	for (i = 0; i < depth; i++) {
		q->ios[i].q = q;
		q->ios[i].tag = i;
		if (q->io_data)
			q->ios[i].data = (char *)q->io_data +
					 (size_t)i * dev->io_priv_size;
	}
	q->dev = dev;
	q->id = id;
	q->area = area;
	q->area_size = size;
	q->hdr = hdr;
	/* dev_size is there if the rings start after it (HYBD_F_RESIZE) */
	if (id == 0)
		dev->has_dev_size = (dev->features & HYBD_F_RESIZE) &&
				    sq_off >= sizeof(*hdr);
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
	if (q->efd >= 0)
		close(q->efd);
	q->efd = -1;
	pthread_mutex_destroy(&q->cq_lock);
	free(q->ios);
	q->ios = NULL;
	free(q->io_data);
	q->io_data = NULL;
}

/*
 * HYBD_SRV_IO with @flags on queue sio->queue: commit what is posted (and
 * wait or arm).  Returns the completions taken, or -errno.
 */
static int srv_io(int srv_fd, struct hybd_srv_io *sio, uint16_t flags)
{
	int ret;

	sio->len = sizeof(*sio);
	sio->flags = flags;
	sio->reserved0 = 0;
	do {
		ret = ioctl(srv_fd, HYBD_SRV_IO, sio);
	} while (ret < 0 && errno == EINTR);
	return ret < 0 ? -errno : ret;
}

/* Hand the completions posted on queue sio->queue to the kernel. */
static int srv_commit(int srv_fd, struct hybd_srv_io *sio)
{
	return srv_io(srv_fd, sio, 0);
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
	hybd_write_once(&q->cq_tail, q->cq_tail + 1);	/* see uncommitted() */
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

/*
 * Complete @n requests of queue @q from a thread other than its worker:
 * post them and commit now.  The kernel then takes every submission
 * published so far as seen by the server, so unless the worker has
 * consumed up to the tail we got back, kick it or it may sleep on them.
 * Once posted, a request can finish and a graceful delete return;
 * hybd_dev_delete() waits for completers to leave before it unmaps the
 * queue.
 */
static void complete_foreign(struct hybd_queue *q, struct hybd_io *const *ios,
			     const int *results, unsigned int n)
{
	struct hybd_srv_io sio = { .queue = q->id };
	unsigned int i, posted = 0;

	__atomic_add_fetch(&q->completers, 1, __ATOMIC_SEQ_CST);
	for (i = 0; i < n; i++)
		posted += io_finish(ios[i], results[i]);
	if (posted && srv_commit(q->dev->srv_fd, &sio) >= 0 &&
	    sio.sq_tail != hybd_load_acquire(&q->hdr->sq_head))
		ioctl(q->dev->srv_fd, HYBD_SRV_KICK, (unsigned long)q->id);
	__atomic_sub_fetch(&q->completers, 1, __ATOMIC_RELEASE);
}

void hybd_io_complete(struct hybd_io *io, int result)
{
	/* The worker hands its own completions over when it next waits. */
	if (hybd_current_queue == io->q)
		io_finish(io, result);
	else
		complete_foreign(io->q, &io, &result, 1);
}

void hybd_io_complete_batch(struct hybd_io *const *ios, const int *results,
			    unsigned int n)
{
	unsigned int i, j;

	/* one commit per run of requests of the same queue */
	for (i = 0; i < n; i = j) {
		struct hybd_queue *q = ios[i]->q;

		for (j = i + 1; j < n && ios[j]->q == q; j++)
			;
		if (hybd_current_queue == q) {
			while (i < j) {
				io_finish(ios[i], results[i]);
				i++;
			}
		} else {
			complete_foreign(q, ios + i, results + i, j - i);
		}
	}
}

static int in_range(const struct hybd_dev *dev, uint64_t sector, uint32_t len)
{
	uint64_t size = hybd_dev_size(dev);
	uint64_t sectors = size >> HYBD_SECTOR_SHIFT;

	return sector <= sectors &&
	       len <= size - (sector << HYBD_SECTOR_SHIFT);
}

/* Call the handler for @io.  Returns what the handler did, or -errno. */
static int io_dispatch(struct hybd_queue *q, struct hybd_io *io)
{
	const struct hybd_driver *drv = &q->dev->drv;
	void *buf = hybd_io_buf(io);	/* NULL but for reads and writes */
	uint64_t off = io->offset;
	uint32_t len = io->len;

	switch (io->op) {
	case HYBD_OP_READ:
		return drv->read ? drv->read(io, buf, off, len) : -EOPNOTSUPP;
	case HYBD_OP_WRITE:
		return drv->write ? drv->write(io, buf, off, len) : -EOPNOTSUPP;
	case HYBD_OP_DISCARD:
		return drv->discard ? drv->discard(io, off, len) : -EOPNOTSUPP;
	case HYBD_OP_WRITE_ZEROES:
		return drv->write_zeroes ? drv->write_zeroes(io, off, len) :
					   -EOPNOTSUPP;
	case HYBD_OP_FLUSH:
		return drv->flush ? drv->flush(io) : -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

/* Run the handler of @io and complete it unless it kept it. */
static void io_run(struct hybd_queue *q, struct hybd_io *io)
{
	int ret = io_dispatch(q, io);

	if (ret != HYBD_IO_ASYNC)
		hybd_io_complete(io, ret);
}

/* A handler thread of the pool: run requests until told to stop. */
static void *pool_thread(void *arg)
{
	struct hybd_queue *q = arg;
	struct hybd_pool *p = q->pool;
	struct hybd_io *io;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->head && !p->stop)
			pthread_cond_wait(&p->cond, &p->lock);
		io = p->head;
		if (!io)
			break;		/* stopping, and nothing left */
		p->head = io->next;
		if (!p->head)
			p->tailp = &p->head;
		pthread_mutex_unlock(&p->lock);
		io_run(q, io);
		pthread_mutex_lock(&p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void pool_push(struct hybd_pool *p, struct hybd_io *io)
{
	io->next = NULL;
	pthread_mutex_lock(&p->lock);
	*p->tailp = io;
	p->tailp = &io->next;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

/* Stop the pool's threads once they have run what is queued; free it. */
static void pool_stop(struct hybd_queue *q)
{
	struct hybd_pool *p = q->pool;
	unsigned int i;

	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	for (i = 0; i < p->nr_threads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p->threads);
	free(p);
	q->pool = NULL;
}

/*
 * Start @n handler threads for @q.  They inherit the worker's CPU: one, if
 * the library placed it (hybd_dev_start()).
 */
static int pool_start(struct hybd_queue *q, unsigned int n)
{
	struct hybd_pool *p = calloc(1, sizeof(*p));
	char name[16];
	int ret;

	_Static_assert(HYBD_MAX_DEVICES <= 1000 && HYBD_MAX_QUEUES <= 1000,
		       "\"hybdNNN-qNNNp\" must fit a thread's 16-byte name");

	if (!p || !(p->threads = calloc(n, sizeof(*p->threads)))) {
		free(p);
		return hybd__err(-ENOMEM, "queue %u: no memory for %u threads",
				 q->id, n);
	}
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->tailp = &p->head;
	q->pool = p;
	/* "hybd3-q1p": the worker is "hybd3-q1" (the limits keep both whole) */
	snprintf(name, sizeof(name), "hybd%u-q%up", q->dev->id, q->id);
	for (; p->nr_threads < n; p->nr_threads++) {
		ret = pthread_create(&p->threads[p->nr_threads], NULL,
				     pool_thread, q);
		if (ret) {
			pool_stop(q);
			return hybd__err(-ret,
					 "queue %u: cannot start handler thread %u",
					 q->id, p->nr_threads);
		}
		pthread_setname_np(p->threads[p->nr_threads], name);
	}
	return 0;
}

/*
 * Is the request the kernel described sane?  A malformed one fails with
 * -EIO before any handler sees it.
 */
static int io_check(const struct hybd_queue *q, const struct hybd_io_desc *d)
{
	switch (d->op) {
	case HYBD_OP_FLUSH:
		return 0;
	case HYBD_OP_READ:
	case HYBD_OP_WRITE:
		if (!d->nr_bytes || d->nr_bytes > q->max_io)
			return -EIO;
		/* fall through */
	case HYBD_OP_DISCARD:
	case HYBD_OP_WRITE_ZEROES:
		return in_range(q->dev, d->sector, d->nr_bytes) ? 0 : -EIO;
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
	io->offset = d.sector << HYBD_SECTOR_SHIFT;
	io->len = d.op == HYBD_OP_FLUSH ? 0 : d.nr_bytes;
	__atomic_store_n(&io->busy, 1, __ATOMIC_RELAXED);

	ret = io_check(q, &d);
	if (ret)
		io_finish(io, ret);
	else if (q->pool)
		pool_push(q->pool, io);
	else
		io_run(q, io);
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

/* Completions posted by this worker that the kernel has not taken yet? */
static bool uncommitted(struct hybd_queue *q)
{
	return hybd_read_once(&q->cq_tail) !=
	       hybd_load_acquire(&q->hdr->cq_head);
}

/* HYBD_SRV_IO on the worker's queue; -ENODEV: the device is gone. */
static int worker_io(struct hybd_queue *q, uint16_t flags)
{
	struct hybd_srv_io sio = { .queue = q->id };
	int ret = srv_io(q->dev->srv_fd, &sio, flags);

	return ret < 0 ? ret : 0;
}

/* Is this thread a queue's worker? */
bool hybd__on_worker(void)
{
	return hybd_current_queue != NULL;
}

/* Queue 0 only: is a resize waiting for the server's answer? */
static bool resize_asked(struct hybd_queue *q)
{
	return q->id == 0 &&
	       (hybd_load_acquire(&q->hdr->flags) & HYBD_RING_RESIZE);
}

/* Has a new server asked for the queue (HYBD_CTL_HANDOVER)? */
static bool handing_over(struct hybd_queue *q)
{
	return hybd_load_acquire(&q->hdr->flags) & HYBD_RING_DRAIN;
}

static bool holds_requests(struct hybd_queue *q)
{
	unsigned int i;

	for (i = 0; i < q->depth; i++) {
		if (__atomic_load_n(&q->ios[i].busy, __ATOMIC_ACQUIRE))
			return true;
	}
	return false;
}

/*
 * The watched fds as poll() takes them, after dropping the slots that
 * were unwatched since the last wait.  RETURN VALUE: how many.
 */
static unsigned int watch_pollfds(struct hybd_queue *q, struct pollfd *pfd)
{
	unsigned int i, n = 0;

	for (i = 0; i < q->nr_watch; i++) {
		if (q->watch[i].fd < 0)
			continue;
		if (n != i)
			q->watch[n] = q->watch[i];
		pfd[n].fd = q->watch[n].fd;
		pfd[n].events = q->watch[n].events;
		pfd[n].revents = 0;
		n++;
	}
	q->nr_watch = n;
	return n;
}

/*
 * Call the callbacks of the first @n watches whose fds fired.  A callback
 * may watch more fds (appended, seen at the next wait), unwatch some or
 * change their events: a slot whose fd is no longer the one polled is
 * skipped.
 */
static int watch_dispatch(struct hybd_queue *q, const struct pollfd *pfd,
			  unsigned int n)
{
	struct hybd_watch *w;
	unsigned int i;

	for (i = 0; i < n; i++) {
		w = &q->watch[i];
		if (!pfd[i].revents || w->fd != pfd[i].fd)
			continue;
		if (pfd[i].revents & POLLNVAL)
			return hybd__err(-EBADF,
					 "queue %u: watched fd %d was closed",
					 q->id, w->fd);
		if (w->ecb)
			w->ecb(q, w->fd, (unsigned short)pfd[i].revents,
			       w->arg);
		else
			w->cb(q, w->fd, w->arg);
	}
	return 0;
}

/*
 * HYBD_RING_DRAIN: take nothing more; finish what the handlers hold
 * (serving the watched fds meanwhile), hand every completion to the
 * kernel, and leave.  What we did not take goes to the new server.
 *
 * The handlers may have prepared backend I/O that only queue_idle
 * submits (event mode drains again before it idles, and the drain flag
 * can be seen in between): idle first, and after every round of
 * callbacks, or those requests would never finish and the handover
 * would wait for them forever.
 */
static int worker_hand_over(struct hybd_queue *q)
{
	const struct hybd_driver *drv = &q->dev->drv;
	struct pollfd pfd[HYBD_QUEUE_MAX_FDS];
	unsigned int n;
	int ret;

	for (;;) {
		if (drv->queue_idle)
			drv->queue_idle(q);
		ret = worker_io(q, 0);
		if (ret)
			return ret;
		if (!holds_requests(q) && !uncommitted(q))
			break;
		n = watch_pollfds(q, pfd);
		if (!n) {
			usleep(1000);
			continue;
		}
		if (poll(pfd, n, 1) <= 0)
			continue;
		ret = watch_dispatch(q, pfd, n);
		if (ret)
			return ret;
	}
	hybd_store_release(&q->dev->handed_over, 1);
	return 0;
}

/*
 * The classic loop: commit and sleep in the kernel.  Wait only if no
 * submission is visible already (another thread's commit may have made the
 * kernel think we saw them: never sleep on them).
 */
static int worker_loop_wait(struct hybd_queue *q)
{
	const struct hybd_driver *drv = &q->dev->drv;
	int stop, pending, ret;

	for (;;) {
		stop = hybd_load_acquire(&q->dev->stop);
		pending = hybd_load_acquire(&q->hdr->sq_tail) != q->sq_head;
		ret = worker_io(q, stop || pending ? 0 : HYBD_SRV_IO_WAIT);
		if (ret || stop)
			return ret;
		if (handing_over(q))
			return worker_hand_over(q);
		/* a change before a new question: in order */
		if (q->id == 0)
			hybd__resize_check(q->dev, q->hdr);
		if (resize_asked(q))
			hybd__resize_answer(q->dev, q->hdr);
		if (hybd__queue_drain(q) && drv->queue_idle)
			drv->queue_idle(q);
	}
}

/*
 * Event mode: HYBD_SRV_IO(ARM) commits and arms the eventfd; the worker
 * sleeps in poll() on it and on the watched fds.  It sleeps only when an
 * ARM found nothing new and nothing it posted since is uncommitted.
 *
 * Woken by the eventfd, it first takes what was published and calls the
 * handlers, and only then reads the eventfd and arms again: a request's
 * backend I/O starts two system calls sooner.  (Reading the eventfd late
 * loses nothing: what is published after the drain is seen by the ARM
 * that follows, which the loop repeats until it finds nothing new.)
 */
static int worker_loop_poll(struct hybd_queue *q)
{
	const struct hybd_driver *drv = &q->dev->drv;
	struct pollfd pfd[1 + HYBD_QUEUE_MAX_FDS];
	bool early = false;
	unsigned int n;
	uint64_t count;
	int stop, ret;

	for (;;) {
		stop = hybd_load_acquire(&q->dev->stop);
		if (!early || stop) {
			ret = worker_io(q, stop ? 0 : HYBD_SRV_IO_ARM);
			if (ret || stop)
				return ret;
		}
		if (handing_over(q))
			return worker_hand_over(q);
		/* a change before a new question: in order */
		if (q->id == 0)
			hybd__resize_check(q->dev, q->hdr);
		if (resize_asked(q))
			hybd__resize_answer(q->dev, q->hdr);
		if (hybd__queue_drain(q) && !early)
			continue;
		if (drv->queue_idle)
			drv->queue_idle(q);
		if (early) {
			early = false;
			(void)!read(q->efd, &count, sizeof(count));
			continue;
		}
		if (uncommitted(q))
			continue;

		pfd[0].fd = q->efd;
		pfd[0].events = POLLIN;
		n = watch_pollfds(q, pfd + 1);
		if (poll(pfd, 1 + n, -1) < 0) {
			if (errno == EINTR)
				continue;
			return hybd__err(-errno, "queue %u: poll failed", q->id);
		}
		ret = watch_dispatch(q, pfd + 1, n);
		if (ret)
			return ret;
		/* the eventfd: submissions first (see above) */
		early = pfd[0].revents != 0;
	}
}

/* Give the kernel our eventfd for this queue (event mode). */
static int worker_set_eventfd(struct hybd_queue *q)
{
	struct hybd_srv_eventfd e = { .len = sizeof(e), .queue = q->id };

	q->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (q->efd < 0)
		return hybd__err(-errno, "queue %u: cannot create an eventfd",
				 q->id);
	e.fd = q->efd;
	if (ioctl(q->dev->srv_fd, HYBD_SRV_SET_EVENTFD, &e) < 0)
		return hybd__err(-errno,
				 "queue %u: HYBD_SRV_SET_EVENTFD failed", q->id);
	return 0;
}

/* Tell hybd_dev_start() how queue_init went (1: fine, < 0: failed). */
static void worker_report(struct hybd_queue *q, int state)
{
	struct hybd_dev *dev = q->dev;

	if (state < 0)
		snprintf(q->init_msg, sizeof(q->init_msg), "%s", hybd_errmsg());
	pthread_mutex_lock(&dev->lock);
	q->init_state = state;
	pthread_cond_broadcast(&dev->cond);
	pthread_mutex_unlock(&dev->lock);
}

void *hybd__worker(void *arg)
{
	struct hybd_queue *q = arg;
	const struct hybd_driver *drv = &q->dev->drv;
	char name[16];
	int err = 0;


	/* "hybd3-q1": for top, gdb and the tests */
	snprintf(name, sizeof(name), "hybd%u-q%u", q->dev->id, q->id);
	pthread_setname_np(pthread_self(), name);
	hybd_current_queue = q;
	if (drv->queue_init) {
		err = drv->queue_init(q);
		if (err > 0 || err < -4095)
			err = -EIO;
		if (err) {
			hybd__err(err, "queue %u: the driver's queue_init failed",
				  q->id);
			goto out_report;
		}
	}
	q->event_mode = q->nr_watch > 0;
	if (q->event_mode)
		err = worker_set_eventfd(q);
	if (!err && q->dev->queue_threads > 1)
		err = pool_start(q, q->dev->queue_threads);
	if (err) {
		if (drv->queue_exit)
			drv->queue_exit(q);
		goto out_report;
	}
	worker_report(q, 1);

	/* -ENODEV: the device is gone, a normal end (hybd__worker_stopped) */
	err = q->event_mode ? worker_loop_poll(q) : worker_loop_wait(q);

	pool_stop(q);
	if (drv->queue_exit)
		drv->queue_exit(q);
	hybd__worker_stopped(q, err);
	return NULL;

out_report:
	worker_report(q, err);
	hybd__worker_stopped(q, 0);
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

uint64_t hybd_io_offset(const struct hybd_io *io)
{
	return io->offset;
}

uint32_t hybd_io_len(const struct hybd_io *io)
{
	return io->len;
}

void *hybd_io_buf(const struct hybd_io *io)
{
	if (io->op != HYBD_OP_READ && io->op != HYBD_OP_WRITE)
		return NULL;
	return io->q->data + (size_t)io->tag * io->q->max_io;
}

void *hybd_io_data(const struct hybd_io *io)
{
	return io->data;
}

struct hybd_queue *hybd_io_hwq(const struct hybd_io *io)
{
	return io->q;
}

unsigned int hybd_queue_index(const struct hybd_queue *q)
{
	return q->id;
}

struct hybd_dev *hybd_queue_dev(const struct hybd_queue *q)
{
	return q->dev;
}

void hybd_queue_set_priv(struct hybd_queue *q, void *priv)
{
	q->priv = priv;
}

void *hybd_queue_priv(const struct hybd_queue *q)
{
	return q->priv;
}

static int watch_add(struct hybd_queue *q, int fd, unsigned int events,
		     hybd_fd_cb cb, hybd_fd_events_cb ecb, void *arg,
		     const char *fn)
{
	unsigned int i, used = 0;

	if (hybd_current_queue != q)
		return hybd__err(-EINVAL,
				 "%s: call it from the queue's worker (queue_init)",
				 fn);
	if (fd < 0 || (!cb && !ecb))
		return hybd__err(-EINVAL, "%s: bad fd %d or no callback",
				 fn, fd);
	if (events & ~(unsigned int)(POLLIN | POLLOUT | POLLPRI))
		return hybd__err(-EINVAL,
				 "%s: events %#x: only POLLIN, POLLOUT, POLLPRI",
				 fn, events);
	if (!(q->dev->features & HYBD_F_EVENTFD))
		return hybd__err(-EOPNOTSUPP,
				 "the hybd module cannot signal an eventfd (HYBD_F_EVENTFD): update it");
	for (i = 0; i < q->nr_watch; i++) {
		if (q->watch[i].fd == fd)
			return hybd__err(-EEXIST, "%s: queue %u watches fd %d already",
					 fn, q->id, fd);
		used += q->watch[i].fd >= 0;
	}
	/* unwatched slots are reused only at the next wait, which may
	 * leave the array full for a callback that swaps many fds
	 */
	if (used == HYBD_QUEUE_MAX_FDS || q->nr_watch == HYBD_QUEUE_MAX_FDS)
		return hybd__err(-ENOSPC, "queue %u watches %u fds already",
				 q->id, HYBD_QUEUE_MAX_FDS);
	/* a watch added while serving takes effect at the next wait; the
	 * switch to event mode happens only before serving
	 */
	if (q->init_state && !q->event_mode)
		return hybd__err(-EINVAL,
				 "queue %u: watch the first fd from queue_init",
				 q->id);
	q->watch[q->nr_watch].fd = fd;
	q->watch[q->nr_watch].events = (short)events;
	q->watch[q->nr_watch].cb = cb;
	q->watch[q->nr_watch].ecb = ecb;
	q->watch[q->nr_watch].arg = arg;
	q->nr_watch++;
	return 0;
}

int hybd_queue_watch_fd(struct hybd_queue *q, int fd, hybd_fd_cb cb,
			void *arg)
{
	if (!cb)
		return hybd__err(-EINVAL, "hybd_queue_watch_fd: bad fd %d or no callback",
				 fd);
	return watch_add(q, fd, POLLIN, cb, NULL, arg, "hybd_queue_watch_fd");
}

int hybd_queue_watch_fd_events(struct hybd_queue *q, int fd,
			       unsigned int events, hybd_fd_events_cb cb,
			       void *arg)
{
	if (!cb)
		return hybd__err(-EINVAL, "hybd_queue_watch_fd_events: bad fd %d or no callback",
				 fd);
	return watch_add(q, fd, events, NULL, cb, arg,
			 "hybd_queue_watch_fd_events");
}

static struct hybd_watch *watch_find(struct hybd_queue *q, int fd,
				     const char *fn)
{
	unsigned int i;

	if (hybd_current_queue != q) {
		hybd__err(-EINVAL, "%s: call it from the queue's worker", fn);
		return NULL;
	}
	for (i = 0; fd >= 0 && i < q->nr_watch; i++)
		if (q->watch[i].fd == fd)
			return &q->watch[i];
	hybd__err(-ENOENT, "%s: queue %u does not watch fd %d", fn, q->id, fd);
	return NULL;
}

int hybd_queue_fd_events(struct hybd_queue *q, int fd, unsigned int events)
{
	struct hybd_watch *w = watch_find(q, fd, "hybd_queue_fd_events");

	if (!w)
		return hybd_current_queue != q ? -EINVAL : -ENOENT;
	if (events & ~(unsigned int)(POLLIN | POLLOUT | POLLPRI))
		return hybd__err(-EINVAL,
				 "hybd_queue_fd_events: events %#x: only POLLIN, POLLOUT, POLLPRI",
				 events);
	w->events = (short)events;
	return 0;
}

int hybd_queue_unwatch_fd(struct hybd_queue *q, int fd)
{
	struct hybd_watch *w = watch_find(q, fd, "hybd_queue_unwatch_fd");

	if (!w)
		return hybd_current_queue != q ? -EINVAL : -ENOENT;
	w->fd = -1;
	return 0;
}
