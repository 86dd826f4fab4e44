// SPDX-License-Identifier: MIT
/*
 * hybd-nbd - a remote NBD export as a local disk, through libnbd.
 *
 *   hybd-nbd [--queues N] [--depth N] [--max-io BYTES] [--id N]
 *            [--io-timeout SECONDS] [--reconnect-limit SECONDS]
 *            [--recovery SECONDS] [--attach] [--bpf nbd.bpf.o]
 *            [--sndbuf BYTES] [--structured-replies] URI
 *
 * URI is libnbd's (nbd_connect_uri(3)): nbd://HOST[:PORT][/EXPORT],
 * nbd+unix:///EXPORT?socket=PATH, and nbds://... for TLS (which is then
 * required).  The device has the export's size (rounded down to 4 KiB) and
 * the operations the server offers: flush and FUA, trim (discard) and
 * write-zeroes map to NBD_CMD_FLUSH, NBD_CMD_FLAG_FUA, NBD_CMD_TRIM and
 * NBD_CMD_WRITE_ZEROES (NO_HOLE when the request says NOUNMAP).  It prints
 * "ready /dev/hybdN" once the disk exists and serves it until SIGINT or
 * SIGTERM (or `hybdctl del`), then one line of counters per queue.
 *
 * Connections.  Each hardware queue's worker owns one libnbd handle (one
 * TCP or Unix connection) and drives it asynchronously: a handler issues
 * the NBD command and returns HYBD_IO_ASYNC; the worker polls the socket
 * (for POLLOUT too while libnbd has a request half sent:
 * hybd_queue_watch_fd_events(), nbd_aio_get_direction()) and completes
 * requests from libnbd's completion callbacks.  Several queues need a
 * server that offers multi-conn (a flush on one connection then covers
 * the writes completed on the others); without it the device gets one
 * queue, so one connection, and says so.
 *
 * Reconnects.  When a connection drops (the server restarted, the network
 * broke, the server sent something libnbd refuses), that queue holds the
 * requests it had in flight and those that arrive, and connects again
 * with a backoff (50 ms doubling to 1 s).  Once connected it issues the
 * held requests again, in order; nothing reaches the file system above.
 * A write may so reach the server twice (same data, same place), which
 * any block device takes.  After --reconnect-limit seconds (default 30)
 * without a connection, the held requests fail with EIO, and so does
 * every new one until a connection is back (the queue keeps trying).
 * The device's I/O timeout is the limit plus 30 s unless --io-timeout
 * says otherwise, so the kernel never gives up on a request first.
 *
 * Replies.  The connections that carry requests ask for simple replies,
 * as the kernel's nbd client does: a read's reply is then a header and
 * the data, one send for the server and two receives here, where a
 * structured reply is a chunk header, an offset and the data: one send
 * more for the server, two receives more here, each a system call (with
 * both on two vCPUs, 0.88x the QD32 IOPS in the bench).  What structured
 * replies would buy, a hole's zeros not sent, the zero map serves in the
 * kernel (--bpf).
 * --structured-replies asks for them anyway: for a sparse export read
 * without the fast path over a slow link.  Block status, which needs
 * them, has its own connection (see the fast path).
 *
 * --sndbuf BYTES fixes the sockets' send buffer (SO_SNDBUF) instead of
 * the kernel's autotuning: for a link where a large buffer only adds
 * latency, and for the tests, which need libnbd to wait for POLLOUT.
 *
 * Fast path.  --bpf nbd.bpf.o (built beside this program) attaches the
 * program before the device takes requests and seeds its zero map from
 * NBD_CMD_BLOCK_STATUS over the whole export: reads of blocks the server
 * says read as zeros, and reads the program has cached, are served in the
 * kernel.  Every write, trim and write-zeroes clears its blocks' zero
 * bits here before it is sent, so before it can complete; the cache keeps
 * itself exact with version stamps (see nbd.bpf.c).  The zero map is
 * learned once: blocks that become zero later are not served as such.
 *
 * Crashes.  --recovery SECONDS gives the device a recovery timeout: if
 * this process dies, the kernel holds the I/O that long for a new
 * hybd-nbd started with --attach --id N on the same URI, which gets the
 * requests the old one left.  All state is the server's, so nothing else
 * is needed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <libnbd.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "hybd.h"

#define BACKOFF_MIN_MS		50
#define BACKOFF_MAX_MS		1000
#define CONNECT_TIMEOUT_MS	5000
#define TICK_MS			100

/* The device: what the server offers, and the options. */
struct nbdx {
	const char *uri;
	uint64_t size;			/* the export's, rounded down */
	bool multi_conn, can_flush, can_fua, can_trim, can_zero, read_only;
	uint64_t reconnect_limit_ms;
	atomic_uint_fast64_t reconnects, reissued, failed_down;
	/* --bpf: the fast path and its zero map (nbd_zero, mmapped) */
	const char *bpf_path;
	struct hybd_bpf *fast_path;
	_Atomic uint64_t *zero;
	size_t zero_bytes;
	uint64_t zero_blocks;		/* blocks seeded as zero */
	int sndbuf;			/* --sndbuf; 0: autotuned */
	bool structured;		/* --structured-replies */
};

enum nq_state { NQ_UP, NQ_CONNECTING, NQ_DOWN };

/* A request, in hybd_io_data(): on its queue's in-flight or held list. */
struct nreq {
	struct nreq *prev, *next;
	struct hybd_io *io;
	struct nq *nq;
};

/* One queue: its connection and its requests. */
struct nq {
	struct hybd_queue *q;
	struct nbdx *nx;
	struct nbd_handle *h;
	enum nq_state state;
	int fd;				/* the watched socket, or -1 */
	unsigned int events;		/* what we poll it for */
	int tfd;			/* a timerfd, ticking while not up */
	bool closing;			/* nbd_close() runs: ignore callbacks */
	bool gave_up;			/* down for longer than the limit */
	bool lost;			/* a command saw the connection go */
	uint64_t down_since, next_try, connect_deadline;	/* ms */
	unsigned int backoff;		/* ms */
	struct nreq inflight, held;	/* list heads */
	uint64_t requests, reconnects, reissued;
	uint64_t pollout;		/* waits for the socket to take more */
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void list_init(struct nreq *head)
{
	head->prev = head->next = head;
}

static bool list_empty(const struct nreq *head)
{
	return head->next == head;
}

static void list_del(struct nreq *r)
{
	r->prev->next = r->next;
	r->next->prev = r->prev;
	r->prev = r->next = r;
}

static void list_add_tail(struct nreq *head, struct nreq *r)
{
	r->prev = head->prev;
	r->next = head;
	head->prev->next = r;
	head->prev = r;
}

/* Move every entry of @from before those of @to, keeping their order. */
static void list_splice_head(struct nreq *from, struct nreq *to)
{
	if (list_empty(from))
		return;
	from->prev->next = to->next;
	to->next->prev = from->prev;
	to->next = from->next;
	from->next->prev = to;
	list_init(from);
}

/* Errors that mean "the connection went", not "the server refused". */
static bool connection_error(int err)
{
	return err == ENOTCONN || err == ESHUTDOWN || err == ECONNRESET ||
	       err == EPIPE || err == ECONNABORTED;
}

/* libnbd's completion callback of every command. */
static int req_done(void *user_data, int *error)
{
	struct nreq *r = user_data;
	struct nq *nq = r->nq;
	int err = *error;

	/* a handle being closed aborts its commands: they are held */
	if (nq->closing)
		return 1;
	/* the connection went (or the server is shutting down: it will):
	 * the command stays in flight, to be issued again on a new one
	 */
	if (connection_error(err)) {
		nq->lost = true;
		return 1;
	}
	list_del(r);
	hybd_io_complete(r->io, err ? -err : 0);
	return 1;
}

static void go_down(struct nq *nq, const char *why);

/* Hand @r to the server; it is on the in-flight list afterwards. */
static void issue(struct nq *nq, struct nreq *r)
{
	struct hybd_io *io = r->io;
	nbd_completion_callback cb = { .callback = req_done, .user_data = r };
	uint64_t off = hybd_io_offset(io);
	uint32_t len = hybd_io_len(io), flags = 0;
	int64_t cookie = -1;
	int err;

	if (hybd_io_flags(io) & HYBD_IO_F_FUA)
		flags |= LIBNBD_CMD_FLAG_FUA;
	list_add_tail(&nq->inflight, r);
	switch (hybd_io_op(io)) {
	case HYBD_OP_READ:
		cookie = nbd_aio_pread(nq->h, hybd_io_buf(io), len, off, cb, 0);
		break;
	case HYBD_OP_WRITE:
		cookie = nbd_aio_pwrite(nq->h, hybd_io_buf(io), len, off, cb,
					flags);
		break;
	case HYBD_OP_FLUSH:
		cookie = nbd_aio_flush(nq->h, cb, 0);
		break;
	case HYBD_OP_DISCARD:
		cookie = nbd_aio_trim(nq->h, len, off, cb, flags);
		break;
	case HYBD_OP_WRITE_ZEROES:
		if (hybd_io_flags(io) & HYBD_IO_F_NOUNMAP)
			flags |= LIBNBD_CMD_FLAG_NO_HOLE;
		cookie = nbd_aio_zero(nq->h, len, off, cb, flags);
		break;
	default:
		list_del(r);
		hybd_io_complete(io, -EOPNOTSUPP);
		return;
	}
	nq->requests++;
	if (cookie >= 0)
		return;
	/* not issued: the callback will not be called */
	err = nbd_get_errno();
	if (nbd_aio_is_dead(nq->h) || nbd_aio_is_closed(nq->h) ||
	    connection_error(err)) {
		go_down(nq, nbd_get_error());	/* r is held with the rest */
		return;
	}
	list_del(r);
	fprintf(stderr, "hybd-nbd: queue %u: %s\n", hybd_queue_index(nq->q),
		nbd_get_error());
	hybd_io_complete(io, err ? -err : -EIO);
}

/* Fail what waits for a connection: the limit passed. */
static void fail_held(struct nq *nq)
{
	struct nreq *r;

	while (!list_empty(&nq->held)) {
		r = nq->held.next;
		list_del(r);
		atomic_fetch_add(&nq->nx->failed_down, 1);
		hybd_io_complete(r->io, -EIO);
	}
}

static void arm_tick(struct nq *nq, bool on)
{
	struct itimerspec its = { 0 };

	if (on) {
		its.it_value.tv_nsec = TICK_MS * 1000000L;
		its.it_interval.tv_nsec = TICK_MS * 1000000L;
	}
	timerfd_settime(nq->tfd, 0, &its, NULL);
}

/* --sndbuf: a fixed send buffer (a slow link, or a test of POLLOUT). */
static void set_sndbuf(struct nq *nq)
{
	if (nq->nx->sndbuf && nq->fd >= 0 &&
	    setsockopt(nq->fd, SOL_SOCKET, SO_SNDBUF, &nq->nx->sndbuf,
		       sizeof(nq->nx->sndbuf)))
		fprintf(stderr, "hybd-nbd: queue %u: SO_SNDBUF: %s\n",
			hybd_queue_index(nq->q), strerror(errno));
}

/* Poll the socket for what libnbd waits for. */
static void update_events(struct nq *nq)
{
	unsigned int dir, ev = 0;

	if (nq->fd < 0 || !nq->h)
		return;
	dir = nbd_aio_get_direction(nq->h);
	if (dir & LIBNBD_AIO_DIRECTION_READ)
		ev |= POLLIN;
	if (dir & LIBNBD_AIO_DIRECTION_WRITE)
		ev |= POLLOUT;
	if (ev != nq->events && !hybd_queue_fd_events(nq->q, nq->fd, ev)) {
		nq->events = ev;
		if (ev & POLLOUT)
			nq->pollout++;
	}
}

/* Drop the connection; hold its requests; reconnect from the ticks. */
static void go_down(struct nq *nq, const char *why)
{
	struct nbd_handle *h = nq->h;
	uint64_t now = now_ms();

	if (nq->state == NQ_UP || !nq->down_since)
		fprintf(stderr, "hybd-nbd: queue %u: connection lost (%s), reconnecting\n",
			hybd_queue_index(nq->q), why ? why : "?");
	if (nq->fd >= 0)
		hybd_queue_unwatch_fd(nq->q, nq->fd);
	nq->fd = -1;
	nq->events = 0;
	nq->h = NULL;
	nq->lost = false;
	if (h) {
		nq->closing = true;
		nbd_close(h);
		nq->closing = false;
	}
	/* what was in flight goes first, in the order it was issued */
	list_splice_head(&nq->inflight, &nq->held);
	if (!nq->down_since) {
		nq->down_since = now;
		nq->backoff = BACKOFF_MIN_MS;
	} else if (nq->state == NQ_CONNECTING) {
		nq->backoff = nq->backoff * 2 > BACKOFF_MAX_MS ?
			      BACKOFF_MAX_MS : nq->backoff * 2;
	}
	nq->next_try = now + nq->backoff;
	nq->state = NQ_DOWN;
	arm_tick(nq, true);
}

static struct nbd_handle *new_handle(struct nq *nq)
{
	struct nbd_handle *h = nbd_create();
	char name[32];

	if (!h)
		return NULL;
	snprintf(name, sizeof(name), "hybd-nbd-q%u",
		 nq ? hybd_queue_index(nq->q) : 0);
	nbd_set_handle_name(h, name);
	/* the URI is the operator's: its ?tls-psk-file= & co. may be read */
	nbd_set_uri_allow_local_file(h, true);
	/*
	 * libnbd zeroes a read's buffer before the read by default, in case
	 * a caller used it after a failed read: 8 us of the workers' 105 per
	 * 4 KiB read under TCG (perf).  A failed read fails its request here,
	 * and its buffer (the tag's, the device's own data) is not returned.
	 */
	nbd_set_pread_initialize(h, false);
	/* a queue's connection: simple replies unless asked (see Replies) */
	if (nq && !nq->nx->structured &&
	    nbd_set_request_structured_replies(h, false) < 0) {
		nbd_close(h);
		return NULL;
	}
	return h;
}

static void sock_ready(struct hybd_queue *q, int fd, unsigned int revents,
		       void *arg);

/* Start connecting again (asynchronously). */
static void try_connect(struct nq *nq)
{
	int ret;

	nq->h = new_handle(nq);
	if (!nq->h) {
		go_down(nq, nbd_get_error());
		return;
	}
	nq->state = NQ_CONNECTING;
	nq->connect_deadline = now_ms() + CONNECT_TIMEOUT_MS;
	if (nbd_aio_connect_uri(nq->h, nq->nx->uri) < 0) {
		go_down(nq, nbd_get_error());
		return;
	}
	nq->fd = nbd_aio_get_fd(nq->h);
	nq->events = 0;
	set_sndbuf(nq);
	ret = nq->fd < 0 ? -EBADF :
	      hybd_queue_watch_fd_events(nq->q, nq->fd, 0, sock_ready, nq);
	if (ret) {
		nq->fd = -1;
		go_down(nq, hybd_errmsg());
		return;
	}
	update_events(nq);
}

/* Connected again: issue what waited. */
static void came_up(struct nq *nq)
{
	struct nreq held, *r;

	nq->state = NQ_UP;
	nq->reconnects++;
	atomic_fetch_add(&nq->nx->reconnects, 1);
	fprintf(stderr, "hybd-nbd: queue %u: reconnected after %" PRIu64 " ms\n",
		hybd_queue_index(nq->q), now_ms() - nq->down_since);
	nq->down_since = 0;
	nq->gave_up = false;
	arm_tick(nq, false);
	list_init(&held);
	list_splice_head(&nq->held, &held);
	while (!list_empty(&held) && nq->state == NQ_UP) {
		r = held.next;
		list_del(r);
		nq->reissued++;
		atomic_fetch_add(&nq->nx->reissued, 1);
		issue(nq, r);
	}
	/* a connection that dropped again meanwhile holds the rest */
	list_splice_head(&held, &nq->held);
}

/* Replies read at most in one wakeup of the worker (see read_replies). */
#define REPLY_BURST 16

/*
 * libnbd reads one reply a notification.  While replies are queued on the
 * socket, read them in one go: each further one costs a FIONREAD here
 * instead of a poll() and a commit of the worker's, and their requests
 * complete together.  Not after the last in flight (a QD1 reply), which
 * would pay the FIONREAD for nothing.
 */
static int read_replies(struct nq *nq)
{
	int ret, avail, n = 0;

	for (;;) {
		ret = nbd_aio_notify_read(nq->h);
		if (ret < 0 || ++n == REPLY_BURST || nbd_aio_is_dead(nq->h) ||
		    nbd_aio_is_closed(nq->h) ||
		    !(nbd_aio_get_direction(nq->h) & LIBNBD_AIO_DIRECTION_READ) ||
		    nbd_aio_in_flight(nq->h) <= 0)
			return ret;
		if (ioctl(nq->fd, FIONREAD, &avail) || avail <= 0)
			return 0;
	}
}

/* The socket is ready for what libnbd waits for. */
static void sock_ready(struct hybd_queue *q, int fd, unsigned int revents,
		       void *arg)
{
	struct nq *nq = arg;
	unsigned int dir;
	int ret = 0;

	(void)q, (void)fd;
	if (!nq->h)
		return;
	dir = nbd_aio_get_direction(nq->h);
	if ((dir & LIBNBD_AIO_DIRECTION_READ) &&
	    (revents & (POLLIN | POLLERR | POLLHUP)))
		ret = read_replies(nq);
	else if ((dir & LIBNBD_AIO_DIRECTION_WRITE) &&
		 (revents & (POLLOUT | POLLERR | POLLHUP)))
		ret = nbd_aio_notify_write(nq->h);
	else if (revents & (POLLERR | POLLHUP))
		ret = -1;
	if (ret < 0 || nbd_aio_is_dead(nq->h) || nbd_aio_is_closed(nq->h) ||
	    nq->lost) {
		go_down(nq, ret < 0 ? nbd_get_error() :
			nq->lost ? "the server is shutting down" :
			"the server closed the connection");
		return;
	}
	if (nq->state == NQ_CONNECTING && nbd_aio_is_ready(nq->h))
		came_up(nq);
	update_events(nq);
}

/* While not up: count the time, try again, give up on the held. */
static void tick(struct hybd_queue *q, int fd, unsigned int revents,
		 void *arg)
{
	struct nq *nq = arg;
	uint64_t expirations, now = now_ms();

	(void)q, (void)revents;
	(void)!read(fd, &expirations, sizeof(expirations));
	if (nq->state == NQ_UP)
		return;
	if (!nq->gave_up && now - nq->down_since >= nq->nx->reconnect_limit_ms) {
		fprintf(stderr, "hybd-nbd: queue %u: no connection for %" PRIu64
			" ms: failing requests until it is back\n",
			hybd_queue_index(nq->q), now - nq->down_since);
		nq->gave_up = true;
	}
	if (nq->gave_up)
		fail_held(nq);
	if (nq->state == NQ_CONNECTING && now >= nq->connect_deadline)
		go_down(nq, "connect timed out");
	else if (nq->state == NQ_DOWN && now >= nq->next_try)
		try_connect(nq);
}

/*
 * A request that changes blocks: they no longer read as zeros for the fast
 * path.  Done before the request is sent, so before it can complete: the
 * fast path never serves zeros for a block after a write to it completed.
 * (Only the seeding in prepare sets bits, before any request.)
 */
static void zero_clear(struct nbdx *nx, uint64_t off, uint32_t len)
{
	uint64_t b = off / 4096, end = (off + len + 4095) / 4096;
	uint64_t words = nx->zero_bytes / 8;

	for (; b < end; b++) {
		if (b / 64 >= words)
			return;
		if (b % 64 == 0 && end - b >= 64) {
			atomic_store(&nx->zero[b / 64], 0);
			b += 63;
			continue;
		}
		atomic_fetch_and(&nx->zero[b / 64], ~(1ULL << (b % 64)));
	}
}

/* Every handler: issue now, hold for a connection, or fail. */
static int submit(struct hybd_io *io)
{
	struct nq *nq = hybd_queue_priv(hybd_io_hwq(io));
	struct nreq *r = hybd_io_data(io);
	enum hybd_io_op op = hybd_io_op(io);

	if (nq->nx->zero && (op == HYBD_OP_WRITE || op == HYBD_OP_DISCARD ||
			     op == HYBD_OP_WRITE_ZEROES))
		zero_clear(nq->nx, hybd_io_offset(io), hybd_io_len(io));

	r->io = io;
	r->nq = nq;
	list_init(r);
	if (nq->state == NQ_UP) {
		issue(nq, r);
	} else if (nq->gave_up) {
		atomic_fetch_add(&nq->nx->failed_down, 1);
		return -EIO;
	} else {
		list_add_tail(&nq->held, r);
	}
	return HYBD_IO_ASYNC;
}

static int hn_read(struct hybd_io *io, void *buf, uint64_t off, uint32_t len)
{
	(void)buf, (void)off, (void)len;
	return submit(io);
}

static int hn_write(struct hybd_io *io, const void *buf, uint64_t off,
		     uint32_t len)
{
	(void)buf, (void)off, (void)len;
	return submit(io);
}

static int hn_flush(struct hybd_io *io)
{
	return submit(io);
}

static int hn_nodata(struct hybd_io *io, uint64_t off, uint32_t len)
{
	(void)off, (void)len;
	return submit(io);
}

/* Requests issued since the last wait may have left data unsent. */
static void queue_idle(struct hybd_queue *q)
{
	update_events(hybd_queue_priv(q));
}

static int queue_init(struct hybd_queue *q)
{
	struct nbdx *nx = hybd_dev_priv(hybd_queue_dev(q));
	struct nq *nq = calloc(1, sizeof(*nq));
	int ret;

	if (!nq)
		return -ENOMEM;
	nq->q = q;
	nq->nx = nx;
	nq->fd = -1;
	list_init(&nq->inflight);
	list_init(&nq->held);
	nq->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (nq->tfd < 0) {
		free(nq);
		return -errno;
	}
	hybd_queue_set_priv(q, nq);
	ret = hybd_queue_watch_fd_events(q, nq->tfd, POLLIN, tick, nq);
	if (ret)
		goto fail;
	/* the first connection synchronously: a failure fails the start */
	nq->h = new_handle(nq);
	if (!nq->h || nbd_connect_uri(nq->h, nx->uri) < 0) {
		fprintf(stderr, "hybd-nbd: queue %u: %s\n", hybd_queue_index(q),
			nbd_get_error());
		ret = -EIO;
		goto fail;
	}
	nq->fd = nbd_aio_get_fd(nq->h);
	set_sndbuf(nq);
	ret = hybd_queue_watch_fd_events(q, nq->fd, POLLIN, sock_ready, nq);
	if (ret)
		goto fail;
	nq->events = POLLIN;
	nq->state = NQ_UP;
	return 0;
fail:
	if (nq->h)
		nbd_close(nq->h);
	close(nq->tfd);
	free(nq);
	hybd_queue_set_priv(q, NULL);
	return ret;
}

static void queue_exit(struct hybd_queue *q)
{
	struct nq *nq = hybd_queue_priv(q);

	fprintf(stderr, "hybd-nbd: queue %u: requests=%" PRIu64
		" reconnects=%" PRIu64 " reissued=%" PRIu64 " pollout=%" PRIu64
		"\n", hybd_queue_index(q), nq->requests, nq->reconnects,
		nq->reissued, nq->pollout);
	if (nq->h) {
		if (nq->state == NQ_UP)
			nbd_shutdown(nq->h, 0);
		nq->closing = true;
		nbd_close(nq->h);
	}
	list_splice_head(&nq->inflight, &nq->held);
	fail_held(nq);
	close(nq->tfd);
	free(nq);
}

struct seed {
	struct nbdx *nx;
	uint64_t next;			/* the first byte not described yet */
};

/* base:allocation extents: set the bits of whole blocks that read as 0 */
static int seed_extents(void *user_data, const char *metacontext,
			uint64_t offset, uint32_t *entries, size_t nr_entries,
			int *error)
{
	struct seed *sd = user_data;
	struct nbdx *nx = sd->nx;
	uint64_t off = offset, b, end;
	size_t i;

	(void)error;
	if (strcmp(metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION))
		return 0;
	for (i = 0; i + 1 < nr_entries; i += 2) {
		uint64_t len = entries[i];

		if (entries[i + 1] & LIBNBD_STATE_ZERO) {
			b = (off + 4095) / 4096;
			end = (off + len) / 4096;
			for (; b < end && b / 64 < nx->zero_bytes / 8; b++) {
				atomic_fetch_or(&nx->zero[b / 64],
						1ULL << (b % 64));
				nx->zero_blocks++;
			}
		}
		off += len;
	}
	if (off > sd->next)
		sd->next = off;
	return 0;
}

/* Learn the export's zero blocks (before any request can arrive). */
static int seed_zero_map(struct nbdx *nx)
{
	struct nbd_handle *h = new_handle(NULL);
	struct seed sd = { .nx = nx };
	nbd_extent_callback cb = { .callback = seed_extents, .user_data = &sd };
	uint64_t off = 0, len;

	if (!h || nbd_add_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) < 0 ||
	    nbd_connect_uri(h, nx->uri) < 0)
		goto fail;
	if (nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) != 1) {
		printf("the server has no block status: holes are not served by the fast path\n");
		nbd_shutdown(h, 0);
		nbd_close(h);
		return 0;
	}
	while (off < nx->size) {
		len = nx->size - off > (1ULL << 30) ? 1ULL << 30 : nx->size - off;
		sd.next = off;
		if (nbd_block_status(h, len, off, cb, 0) < 0)
			goto fail;
		/* the server describes a prefix at least */
		if (sd.next <= off)
			break;
		off = sd.next;
	}
	nbd_shutdown(h, 0);
	nbd_close(h);
	return 0;
fail:
	fprintf(stderr, "hybd-nbd: block status: %s\n", nbd_get_error());
	if (h)
		nbd_close(h);
	return -EIO;
}

/* --bpf: attach the fast path and seed its zero map, before requests. */
static int prepare(struct hybd_dev *dev)
{
	struct nbdx *nx = hybd_dev_priv(dev);
	int ret, fd;

	if (!nx->bpf_path)
		return 0;
	ret = hybd_bpf_attach(hybd_dev_id(dev), nx->bpf_path, 0,
			      &nx->fast_path);
	if (ret) {
		fprintf(stderr, "hybd-nbd: %s: %s\n", nx->bpf_path,
			hybd_errmsg());
		return ret;
	}
	fd = hybd_bpf_map_fd(nx->fast_path, "nbd_zero");
	if (fd < 0) {
		fprintf(stderr, "hybd-nbd: %s has no nbd_zero map\n",
			nx->bpf_path);
		return fd;
	}
	nx->zero = hybd_bpf_map_mmap(fd, &nx->zero_bytes);
	if (!nx->zero) {
		fprintf(stderr, "hybd-nbd: nbd_zero: %s\n", hybd_errmsg());
		return -ENOMEM;
	}
	ret = seed_zero_map(nx);
	if (ret)
		return ret;
	printf("fast path %s attached, %" PRIu64 " blocks known zero\n",
	       nx->bpf_path, nx->zero_blocks);
	return 0;
}

static void ready(struct hybd_dev *dev)
{
	printf("ready %s\n", hybd_dev_path(dev));
	fflush(stdout);
}

static struct hybd_driver driver = {
	.read		= hn_read,
	.queue_init	= queue_init,
	.queue_exit	= queue_exit,
	.queue_idle	= queue_idle,
	.ready		= ready,
	.prepare	= prepare,
};

/* Connect once to learn the export's size and what the server offers. */
static int probe(struct nbdx *nx)
{
	struct nbd_handle *h = new_handle(NULL);
	int64_t size;

	if (!h || nbd_connect_uri(h, nx->uri) < 0) {
		fprintf(stderr, "hybd-nbd: cannot connect to %s: %s\n", nx->uri,
			nbd_get_error());
		if (h)
			nbd_close(h);
		return -1;
	}
	size = nbd_get_size(h);
	nx->multi_conn = nbd_can_multi_conn(h) == 1;
	nx->can_flush = nbd_can_flush(h) == 1;
	nx->can_fua = nbd_can_fua(h) == 1;
	nx->can_trim = nbd_can_trim(h) == 1;
	nx->can_zero = nbd_can_zero(h) == 1;
	nx->read_only = nbd_is_read_only(h) != 0;
	nbd_shutdown(h, 0);
	nbd_close(h);
	if (size < 4096) {
		fprintf(stderr, "hybd-nbd: %s: an export of %" PRId64 " bytes is too small\n",
			nx->uri, size);
		return -1;
	}
	nx->size = (uint64_t)size & ~4095ULL;
	if (nx->size != (uint64_t)size)
		fprintf(stderr, "hybd-nbd: the export's last %" PRIu64 " bytes are not served (not a whole 4 KiB block)\n",
			(uint64_t)size - nx->size);
	return 0;
}

static const char usage[] =
	"usage: hybd-nbd [--queues N] [--depth N] [--max-io BYTES] [--id N]\n"
	"                [--io-timeout SECONDS] [--reconnect-limit SECONDS]\n"
	"                [--recovery SECONDS] [--attach] [--bpf nbd.bpf.o]\n"
	"                [--sndbuf BYTES] [--structured-replies] URI\n";

static uint64_t number(const char *name, const char *s, uint64_t max)
{
	uint64_t v;

	if (hybd_parse_size(s, &v)) {
		fprintf(stderr, "hybd-nbd: --%s %s: %s\n", name, s,
			hybd_errmsg());
		exit(2);
	}
	if (v > max) {
		fprintf(stderr, "hybd-nbd: --%s %s: at most %" PRIu64 "\n",
			name, s, max);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "queues", required_argument, NULL, 'q' },
		{ "depth", required_argument, NULL, 'd' },
		{ "max-io", required_argument, NULL, 'm' },
		{ "id", required_argument, NULL, 'i' },
		{ "io-timeout", required_argument, NULL, 't' },
		{ "reconnect-limit", required_argument, NULL, 'L' },
		{ "recovery", required_argument, NULL, 'R' },
		{ "attach", no_argument, NULL, 'A' },
		{ "bpf", required_argument, NULL, 'b' },
		{ "sndbuf", required_argument, NULL, 'S' },
		{ "structured-replies", no_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct nbdx nx = { .reconnect_limit_ms = 30000 };
	struct hybd_config cfg;
	bool timeout_set = false, queues_set = false;
	int c, i = 0, ret;

	hybd_config_init(&cfg);
	while ((c = getopt_long(argc, argv, "h", opts, &i)) != -1) {
		const char *name = opts[i].name;

		switch (c) {
		case 'q': cfg.nr_queues = number(name, optarg, UINT32_MAX); queues_set = true; break;
		case 'd': cfg.queue_depth = number(name, optarg, UINT32_MAX); break;
		case 'm': cfg.max_io_bytes = number(name, optarg, UINT32_MAX); break;
		case 'i': cfg.dev_id = number(name, optarg, INT32_MAX); break;
		case 't': cfg.io_timeout = number(name, optarg, UINT32_MAX); timeout_set = true; break;
		case 'L': nx.reconnect_limit_ms = number(name, optarg, 1000000) * 1000; break;
		case 'R': cfg.recovery_timeout = number(name, optarg, UINT32_MAX); break;
		case 'A': cfg.lib_flags |= HYBD_CFG_ATTACH; break;
		case 'b': nx.bpf_path = optarg; break;
		case 'S': nx.sndbuf = number(name, optarg, INT32_MAX / 2); break;
		case 's': nx.structured = true; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind != argc - 1) {
		fputs(usage, stderr);
		return 2;
	}
	nx.uri = argv[optind];
	if ((cfg.lib_flags & HYBD_CFG_ATTACH) && cfg.dev_id < 0) {
		fputs("hybd-nbd: --attach needs --id N\n", stderr);
		return 2;
	}
	if (probe(&nx))
		return 1;

	cfg.size = nx.size;
	cfg.io_priv_size = sizeof(struct nreq);
	if (!timeout_set)
		cfg.io_timeout = nx.reconnect_limit_ms / 1000 + 30;
	if (!nx.multi_conn && cfg.nr_queues != 1) {
		fprintf(stderr, "hybd-nbd: the server does not offer multi-conn: one connection, so one hardware queue%s\n",
			queues_set ? " (--queues ignored)" : "");
		cfg.nr_queues = 1;
	}
	if (!nx.read_only) {
		driver.write = hn_write;
		if (nx.can_flush)
			driver.flush = hn_flush;
		if (nx.can_trim)
			driver.discard = hn_nodata;
		if (nx.can_zero)
			driver.write_zeroes = hn_nodata;
	}
	/* explicit ops: FUA only if the server has it */
	cfg.ops = HYBD_OPF_READ;
	if (driver.write)
		cfg.ops |= HYBD_OPF_WRITE;
	if (driver.flush)
		cfg.ops |= HYBD_OPF_FLUSH | (nx.can_fua ? HYBD_OPF_FUA : 0);
	else
		cfg.flags &= ~HYBD_DEV_F_WRITE_CACHE;
	if (driver.discard)
		cfg.ops |= HYBD_OPF_DISCARD;
	if (driver.write_zeroes)
		cfg.ops |= HYBD_OPF_WRITE_ZEROES;
	if (cfg.lib_flags & HYBD_CFG_ATTACH)
		cfg.ops = 0;	/* the device keeps its own */

	printf("%s: %" PRIu64 " bytes, multi-conn %s, flush %s, fua %s, trim %s, zero %s%s\n",
	       nx.uri, nx.size, nx.multi_conn ? "yes" : "no",
	       nx.can_flush ? "yes" : "no", nx.can_fua ? "yes" : "no",
	       nx.can_trim ? "yes" : "no", nx.can_zero ? "yes" : "no",
	       nx.read_only ? ", read-only" : "");
	fflush(stdout);
	ret = hybd_run(&cfg, &driver, &nx);
	if (nx.zero)
		munmap((void *)nx.zero, nx.zero_bytes);
	hybd_bpf_close(nx.fast_path);
	fprintf(stderr, "hybd-nbd: reconnects=%" PRIu64 " reissued=%" PRIu64
		" failed_while_down=%" PRIu64 "\n",
		(uint64_t)atomic_load(&nx.reconnects),
		(uint64_t)atomic_load(&nx.reissued),
		(uint64_t)atomic_load(&nx.failed_down));
	if (ret) {
		fprintf(stderr, "hybd-nbd: %s\n", hybd_errmsg());
		return 1;
	}
	return 0;
}
