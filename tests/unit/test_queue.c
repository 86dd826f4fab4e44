// SPDX-License-Identifier: MIT
/*
 * The worker's ring logic against a queue area laid out in ordinary memory:
 * this test plays the kernel (fills descriptors and the submission ring,
 * reads the completion ring) and checks what the library posts, including
 * for corrupt descriptors and asynchronous completions.  No system call is
 * needed: the commits the library attempts go to fd -1 and fail harmlessly.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybd_internal.h"
#include "unit.h"

#define DEPTH		8
#define ENTRIES		8
#define MAX_IO		8192
#define DISK_SIZE	(1 << 20)
#define SQ_OFF		64
#define CQ_OFF		128
#define DESC_OFF	256
#define DATA_OFF	4096
#define AREA_SIZE	(DATA_OFF + DEPTH * MAX_IO)

/* What the handlers saw and what they are told to return. */
static struct {
	unsigned char disk[DISK_SIZE];
	int calls;
	int ret;			/* returned by the handlers */
	enum hybd_io_op op;
	uint32_t flags;
	uint64_t off;
	uint32_t len;
	struct hybd_io *held;		/* kept by an HYBD_IO_ASYNC handler */
	int complete_inline;		/* ...which completes it at once */
} t;

static void seen(struct hybd_io *io, uint64_t off, uint32_t len)
{
	t.calls++;
	t.op = hybd_io_op(io);
	t.flags = hybd_io_flags(io);
	t.off = off;
	t.len = len;
	if (t.ret == HYBD_IO_ASYNC)
		t.held = io;
	if (t.complete_inline)
		hybd_io_complete(io, 0);
}

static int h_read(struct hybd_io *io, void *buf, uint64_t off, uint32_t len)
{
	seen(io, off, len);
	memcpy(buf, t.disk + off, len);
	return t.ret;
}

static int h_write(struct hybd_io *io, const void *buf, uint64_t off,
		   uint32_t len)
{
	seen(io, off, len);
	memcpy(t.disk + off, buf, len);
	return t.ret;
}

static int h_flush(struct hybd_io *io)
{
	seen(io, 0, 0);
	return t.ret;
}

static int h_discard(struct hybd_io *io, uint64_t off, uint32_t len)
{
	seen(io, off, len);
	return t.ret;
}

static const struct hybd_driver driver = {
	.read = h_read,
	.write = h_write,
	.flush = h_flush,
	.discard = h_discard,
	.write_zeroes = h_discard,
};

/* The fake queue area and the kernel's side of it. */
static unsigned char *area;
static struct hybd_ring_hdr *hdr;
static uint32_t k_sq_tail, k_cq_head;
static struct hybd_dev dev;
static struct hybd_queue q;
static int priv_cookie;

static void layout(void)
{
	memset(area, 0, AREA_SIZE);
	hdr = (struct hybd_ring_hdr *)area;
	hdr->ring_entries = ENTRIES;
	hdr->queue_depth = DEPTH;
	hdr->max_io_bytes = MAX_IO;
	hdr->sq_off = SQ_OFF;
	hdr->cq_off = CQ_OFF;
	hdr->desc_off = DESC_OFF;
	hdr->data_off = DATA_OFF;
	hdr->queue_id = 0;
}

static const struct hybd_srv_info info = {
	.ring_entries = ENTRIES,
	.queue_depth = DEPTH,
	.max_io_bytes = MAX_IO,
};

static void *data(uint32_t tag)
{
	return area + DATA_OFF + (size_t)tag * MAX_IO;
}

/* Publish one request, as queue_rq does. */
static void submit(uint32_t tag, uint8_t op, uint16_t flags, uint64_t sector,
		   uint32_t bytes, uint64_t seq)
{
	struct hybd_io_desc *d = (struct hybd_io_desc *)(area + DESC_OFF);
	uint32_t *sq = (uint32_t *)(area + SQ_OFF);

	if (tag < DEPTH) {
		d[tag].op = op;
		d[tag].flags = flags;
		d[tag].nr_bytes = bytes;
		d[tag].sector = sector;
		d[tag].seq = seq;
	}
	sq[k_sq_tail++ & (ENTRIES - 1)] = tag;
	__atomic_store_n(&hdr->sq_tail, k_sq_tail, __ATOMIC_RELEASE);
}

/* Completions posted since the last call (consumed, as a commit does). */
static int reap(struct hybd_cqe *out, int room)
{
	struct hybd_cqe *cq = (struct hybd_cqe *)(area + CQ_OFF);
	uint32_t tail = __atomic_load_n(&hdr->cq_tail, __ATOMIC_ACQUIRE);
	int n = 0;

	while (k_cq_head != tail && n < room)
		out[n++] = cq[k_cq_head++ & (ENTRIES - 1)];
	hdr->cq_head = k_cq_head;
	return n;
}

/* Serve one request; expect exactly one completion (tag, res, seq). */
static void one(uint32_t tag, uint8_t op, uint16_t flags, uint64_t sector,
		uint32_t bytes, uint64_t seq, int32_t want_res)
{
	struct hybd_cqe c[4];
	int n;

	submit(tag, op, flags, sector, bytes, seq);
	CHECK(hybd__queue_drain(&q) == 1);
	CHECK(hdr->sq_head == k_sq_tail);
	n = reap(c, 4);
	CHECK(n == 1);
	if (n != 1)
		return;
	if (c[0].result != want_res)
		fprintf(stderr, "tag %u op %u: result %d, want %d\n", tag, op,
			c[0].result, want_res);
	CHECK(c[0].tag == tag && c[0].seq == seq && c[0].result == want_res);
}

static void test_init_checks(void)
{
	struct hybd_queue bad;

	layout();
	hdr->queue_id = 1;
	CHECK(hybd__queue_init(&bad, &dev, 0, area, AREA_SIZE, &info) == -EPROTO);
	CHECK(strstr(hybd_errmsg(), "(queue_id)") != NULL);
	layout();
	hdr->ring_entries = 12;
	CHECK(hybd__queue_init(&bad, &dev, 0, area, AREA_SIZE, &info) == -EPROTO);
	layout();
	hdr->ring_entries = 4;	/* fewer than the depth */
	CHECK(hybd__queue_init(&bad, &dev, 0, area, AREA_SIZE, &info) == -EPROTO);
	layout();
	hdr->cq_off = 132;	/* misaligned */
	CHECK(hybd__queue_init(&bad, &dev, 0, area, AREA_SIZE, &info) == -EPROTO);
	CHECK(strstr(hybd_errmsg(), "(cq_off)") != NULL);
	layout();
	hdr->data_off = DATA_OFF + 1;	/* buffers past the end */
	CHECK(hybd__queue_init(&bad, &dev, 0, area, AREA_SIZE, &info) == -EPROTO);
	layout();
	hdr->desc_off = 0xfffffff8;
	CHECK(hybd__queue_init(&bad, &dev, 0, area, AREA_SIZE, &info) == -EPROTO);
	layout();
	hdr->sq_off = 8;	/* inside the header */
	CHECK(hybd__queue_init(&bad, &dev, 0, area, AREA_SIZE, &info) == -EPROTO);
	layout();
	hdr->max_io_bytes = MAX_IO * 2;
	CHECK(hybd__queue_init(&bad, &dev, 0, area, AREA_SIZE, &info) == -EPROTO);
	layout();
	CHECK(hybd__queue_init(&bad, &dev, 0, area, 16, &info) == -EPROTO);
}

static void test_sync(void)
{
	memset(data(0), 0xa5, 4096);
	one(0, HYBD_OP_WRITE, HYBD_IO_F_FUA, 8, 4096, 100, 0);
	CHECK(t.op == HYBD_OP_WRITE && t.off == 4096 && t.len == 4096);
	CHECK(t.flags == HYBD_IO_F_FUA);
	CHECK(t.disk[4096] == 0xa5 && t.disk[8191] == 0xa5 && !t.disk[8192]);

	memset(data(1), 0, 4096);
	one(1, HYBD_OP_READ, 0, 8, 4096, 101, 0);
	CHECK(((unsigned char *)data(1))[0] == 0xa5 &&
	      ((unsigned char *)data(1))[4095] == 0xa5);

	one(2, HYBD_OP_FLUSH, 0, 0, 0, 102, 0);
	CHECK(t.op == HYBD_OP_FLUSH);
	/* discard and write-zeroes carry no data: longer than max_io is fine */
	one(3, HYBD_OP_DISCARD, 0, 16, 65536, 103, 0);
	CHECK(t.op == HYBD_OP_DISCARD && t.off == 8192 && t.len == 65536);
	one(3, HYBD_OP_WRITE_ZEROES, HYBD_IO_F_NOUNMAP, 0, DISK_SIZE, 104, 0);
	CHECK(t.op == HYBD_OP_WRITE_ZEROES && t.len == DISK_SIZE &&
	      t.flags == HYBD_IO_F_NOUNMAP);
	/* the last byte of the disk is fine */
	one(4, HYBD_OP_READ, 0, DISK_SIZE / 512 - 1, 512, 105, 0);

	/* handler results: -errno passes, anything else becomes -EIO */
	t.ret = -ENOSPC;
	one(5, HYBD_OP_WRITE, 0, 0, 512, 106, -ENOSPC);
	t.ret = 7;
	one(5, HYBD_OP_WRITE, 0, 0, 512, 107, -EIO);
	t.ret = -5000;
	one(5, HYBD_OP_WRITE, 0, 0, 512, 108, -EIO);
	t.ret = 0;
}

static void test_corrupt(void)
{
	struct hybd_cqe c[4];
	int calls = t.calls;

	one(0, HYBD_OP_MAX, 0, 0, 512, 200, -EIO);	/* unknown op */
	one(0, 0xff, 0, 0, 512, 201, -EIO);
	one(1, HYBD_OP_READ, 0, 0, 0, 202, -EIO);	/* empty */
	one(1, HYBD_OP_READ, 0, 0, MAX_IO + 512, 203, -EIO);	/* too long */
	one(1, HYBD_OP_WRITE, 0, 0, 0xffffffff, 204, -EIO);
	one(2, HYBD_OP_READ, 0, DISK_SIZE / 512, 512, 205, -EIO); /* past end */
	one(2, HYBD_OP_READ, 0, DISK_SIZE / 512 - 1, 1024, 206, -EIO);
	one(2, HYBD_OP_READ, 0, ~0ULL >> 1, 512, 207, -EIO);	/* overflows */
	one(2, HYBD_OP_DISCARD, 0, 8, DISK_SIZE, 208, -EIO);
	CHECK(t.calls == calls);	/* no handler saw any of these */

	/* a tag out of range cannot be completed: skipped, nothing posted */
	submit(DEPTH + 100, HYBD_OP_READ, 0, 0, 512, 209);
	submit(0xffffffff, HYBD_OP_READ, 0, 0, 512, 210);
	CHECK(hybd__queue_drain(&q) == 2);
	CHECK(reap(c, 4) == 0);
	CHECK(hdr->sq_head == k_sq_tail);

	/* a tail beyond a ring's worth: at most a ring is consumed */
	__atomic_store_n(&hdr->sq_tail, k_sq_tail + 1000, __ATOMIC_RELEASE);
	CHECK(hybd__queue_drain(&q) == ENTRIES);
	k_sq_tail += ENTRIES;
	CHECK(hdr->sq_head == k_sq_tail);
	hdr->sq_tail = k_sq_tail;
	reap(c, 4);
	reap(c, 4);
}

static void test_no_handler(void)
{
	dev.drv.discard = NULL;
	dev.drv.flush = NULL;
	one(3, HYBD_OP_DISCARD, 0, 0, 4096, 300, -EOPNOTSUPP);
	one(3, HYBD_OP_FLUSH, 0, 0, 0, 301, -EOPNOTSUPP);
	dev.drv = driver;
}

static void *complete_later(void *arg)
{
	hybd_io_complete(arg, -EAGAIN);
	return NULL;
}

static void test_async(void)
{
	struct hybd_cqe c[4];
	struct hybd_io *io;
	pthread_t thr;

	t.ret = HYBD_IO_ASYNC;
	t.held = NULL;
	submit(6, HYBD_OP_READ, HYBD_IO_F_SYNC, 2, 512, 400);
	CHECK(hybd__queue_drain(&q) == 1);
	CHECK(reap(c, 4) == 0);		/* nothing until completed */
	io = t.held;
	CHECK(io != NULL);
	if (!io)
		return;
	CHECK(hybd_io_tag(io) == 6 && hybd_io_queue(io) == 0);
	CHECK(hybd_io_op(io) == HYBD_OP_READ);
	CHECK(hybd_io_flags(io) == HYBD_IO_F_SYNC);
	CHECK(hybd_io_dev(io) == &dev && hybd_io_priv(io) == &priv_cookie);

	/* the tag comes again while held: only the newcomer fails */
	t.ret = 0;
	submit(6, HYBD_OP_READ, 0, 2, 512, 401);
	CHECK(hybd__queue_drain(&q) == 1);
	CHECK(reap(c, 4) == 1 && c[0].tag == 6 && c[0].seq == 401 &&
	      c[0].result == -EIO);

	/* completed from another thread, with the original seq */
	pthread_create(&thr, NULL, complete_later, io);
	pthread_join(thr, NULL);
	CHECK(reap(c, 4) == 1 && c[0].tag == 6 && c[0].seq == 400 &&
	      c[0].result == -EAGAIN);
	CHECK(q.completers == 0);

	/* a second completion of the same request is ignored */
	hybd_io_complete(io, 0);
	CHECK(reap(c, 4) == 0);

	/* completed inside the handler, then HYBD_IO_ASYNC returned */
	t.ret = HYBD_IO_ASYNC;
	t.complete_inline = 1;
	submit(7, HYBD_OP_WRITE, 0, 0, 512, 402);
	CHECK(hybd__queue_drain(&q) == 1);
	t.complete_inline = 0;
	CHECK(reap(c, 4) == 1 && c[0].tag == 7 && c[0].seq == 402 &&
	      c[0].result == 0);
	/* a positive result is not a valid completion */
	t.held = NULL;
	submit(7, HYBD_OP_WRITE, 0, 0, 512, 403);
	CHECK(hybd__queue_drain(&q) == 1);
	if (t.held)
		hybd_io_complete(t.held, 4242);
	CHECK(reap(c, 4) == 1 && c[0].seq == 403 && c[0].result == -EIO);
	t.ret = 0;
}

/* Many requests per drain, wrapping the ring indices several times. */
static void test_batches(void)
{
	struct hybd_cqe c[ENTRIES];
	uint64_t seq = 1000;
	int round, i, n, ok = 1;

	for (round = 0; round < 50; round++) {
		for (i = 0; i < DEPTH; i++)
			submit(i, HYBD_OP_READ, 0, i, 512, seq + i);
		if (hybd__queue_drain(&q) != DEPTH)
			ok = 0;
		n = reap(c, ENTRIES);
		if (n != DEPTH)
			ok = 0;
		for (i = 0; i < n; i++) {
			if (c[i].tag != (uint32_t)i || c[i].seq != seq + i ||
			    c[i].result)
				ok = 0;
		}
		seq += DEPTH;
	}
	CHECK(ok);
	CHECK(hdr->sq_head == k_sq_tail && hdr->cq_tail == k_cq_head);
}

static void ev_cb(struct hybd_queue *cq, int fd, unsigned int revents,
		  void *arg)
{
	(void)cq; (void)fd; (void)revents; (void)arg;
}

/* The 1.11 watch calls belong to the worker thread: this one is not. */
static void test_watch_outside_worker(void)
{
	CHECK(hybd_queue_watch_fd_events(&q, 0, POLLIN | POLLOUT, ev_cb,
					 NULL) == -EINVAL);
	CHECK(strstr(hybd_errmsg(), "queue's worker") != NULL);
	CHECK(hybd_queue_fd_events(&q, 0, POLLOUT) == -EINVAL);
	CHECK(hybd_queue_unwatch_fd(&q, 0) == -EINVAL);
	CHECK(q.nr_watch == 0);
}

int main(void)
{
	area = aligned_alloc(4096, AREA_SIZE);
	if (!area)
		return 1;
	dev.srv_fd = -1;
	dev.size = DISK_SIZE;
	dev.drv = driver;
	dev.priv = &priv_cookie;
	pthread_mutex_init(&dev.lock, NULL);
	pthread_cond_init(&dev.cond, NULL);

	test_init_checks();
	layout();
	/* start the free-running indices near the wrap */
	k_sq_tail = k_cq_head = 0xfffffff0U;
	hdr->sq_tail = hdr->sq_head = k_sq_tail;
	hdr->cq_tail = hdr->cq_head = k_cq_head;
	CHECK(hybd__queue_init(&q, &dev, 0, area, AREA_SIZE, &info) == 0);

	test_sync();
	test_corrupt();
	test_no_handler();
	test_async();
	test_batches();
	test_watch_outside_worker();

	hybd__queue_exit(&q);
	free(area);
	return unit_report();
}
