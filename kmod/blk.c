// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - blk-mq side: every request is published to its hardware queue's
 * submission ring, and the server is woken once per batch, only if it
 * sleeps.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blkdev.h>
#include <linux/bvec.h>
#include <linux/sort.h>

#include "hybd.h"

static int hybd_init_hctx(struct blk_mq_hw_ctx *hctx, void *data,
			  unsigned int hctx_idx)
{
	struct hybd_dev *dev = data;

	hctx->driver_data = &dev->queues[hctx_idx];
	dev->queues[hctx_idx].hctx = hctx;
	return 0;
}

/* Map a request to the ring's opcode; -1 for what we never offered. */
static int hybd_rq_op(struct request *rq)
{
	switch (req_op(rq)) {
	case REQ_OP_READ:
		return HYBD_OP_READ;
	case REQ_OP_WRITE:
		return HYBD_OP_WRITE;
	case REQ_OP_FLUSH:
		return HYBD_OP_FLUSH;
	case REQ_OP_DISCARD:
		return HYBD_OP_DISCARD;
	case REQ_OP_WRITE_ZEROES:
		return HYBD_OP_WRITE_ZEROES;
	default:
		return -1;
	}
}

/* The HYBD_IO_F_* a bio's or request's flags give. */
u16 hybd_bio_flags(blk_opf_t opf)
{
	u16 flags = 0;

	if (opf & REQ_FUA)
		flags |= HYBD_IO_F_FUA;
	if (opf & REQ_NOUNMAP)
		flags |= HYBD_IO_F_NOUNMAP;
	if (opf & REQ_SYNC)
		flags |= HYBD_IO_F_SYNC;
	if (opf & REQ_META)
		flags |= HYBD_IO_F_META;
	return flags;
}

/* The HYBD_OPF_* bit that offers @op. */
static u32 hybd_op_bit(int op)
{
	static const u32 bits[HYBD_OP_MAX] = {
		[HYBD_OP_READ]		= HYBD_OPF_READ,
		[HYBD_OP_WRITE]		= HYBD_OPF_WRITE,
		[HYBD_OP_FLUSH]		= HYBD_OPF_FLUSH,
		[HYBD_OP_DISCARD]	= HYBD_OPF_DISCARD,
		[HYBD_OP_WRITE_ZEROES]	= HYBD_OPF_WRITE_ZEROES,
	};

	return bits[op];
}

static void hybd_count_op(struct hybd_queue *q, int op, u16 flags)
{
	switch (op) {
	case HYBD_OP_READ:
		hybd_stat_inc(q, reads);
		break;
	case HYBD_OP_WRITE:
		hybd_stat_inc(q, writes);
		if (flags & HYBD_IO_F_FUA)
			hybd_stat_inc(q, fua);
		break;
	case HYBD_OP_FLUSH:
		hybd_stat_inc(q, flushes);
		break;
	case HYBD_OP_DISCARD:
		hybd_stat_inc(q, discards);
		break;
	case HYBD_OP_WRITE_ZEROES:
		hybd_stat_inc(q, write_zeroes);
		break;
	}
}

/**
 * hybd_errno_status() - the block status for a server's or program's errno
 * @err: 0 or a negative errno
 *
 * Only errnos with a meaning for a block device keep it; everything else
 * (-EAGAIN, -ENOMEM and the like, which the block layer reserves for its
 * own retry logic) is an I/O error.  The set is documented in uapi/hybd.h.
 *
 * Return: the blk_status_t to end the request with.
 */
blk_status_t hybd_errno_status(int err)
{
	switch (err) {
	case 0:
		return BLK_STS_OK;
	case -EOPNOTSUPP:
		return BLK_STS_NOTSUPP;
	case -ENOSPC:
		return BLK_STS_NOSPC;
	case -ENODATA:
		return BLK_STS_MEDIUM;
	case -ETIMEDOUT:
		return BLK_STS_TIMEOUT;
	case -EILSEQ:
		return BLK_STS_PROTECTION;
	default:
		return BLK_STS_IOERR;
	}
}

/**
 * hybd_rq_copy() - copy between a request's pages and a buffer
 * @rq: the request
 * @off: byte offset into the request's payload
 * @buf: the buffer; NULL (with @to_rq) zeroes the range instead
 * @len: bytes to copy; @off + @len must not pass blk_rq_bytes(@rq)
 * @to_rq: direction: @buf into the request, or the request into @buf
 */
void hybd_rq_copy(struct request *rq, u32 off, void *buf, u32 len, bool to_rq)
{
	struct req_iterator iter;
	struct bio_vec bv;

	if (!len)
		return;
	rq_for_each_segment(bv, rq, iter) {
		u32 n;

		if (off >= bv.bv_len) {
			off -= bv.bv_len;
			continue;
		}
		bv.bv_offset += off;
		bv.bv_len -= off;
		off = 0;
		n = min(bv.bv_len, len);
		bv.bv_len = n;
		if (!buf)
			memzero_bvec(&bv);
		else if (to_rq)
			memcpy_to_bvec(&bv, buf);
		else
			memcpy_from_bvec(buf, &bv);
		if (buf)
			buf += n;
		len -= n;
		if (!len)
			break;
	}
}

/*
 * Make the filled slots visible; caller holds q->lock.  A parked queue has
 * nobody to see them: they wait for the resume, which rewinds the ring.
 */
static bool hybd_publish(struct hybd_queue *q)
{
	if (q->parked || q->sq_published == q->sq_tail)
		return false;
	/*
	 * Descriptors, data and slots before the tail: the first pairs with
	 * the server's load-acquire of hdr->sq_tail, the second with
	 * hybd_srv_io()'s load-acquire of sq_published, whose value the
	 * server uses without reading the header.
	 */
	smp_store_release(&q->hdr->sq_tail, q->sq_tail);
	/* the same, for hybd_srv_io() */
	smp_store_release(&q->sq_published, q->sq_tail);
	return true;
}

/*
 * Wake the worker if it sleeps, or signal it if it is armed.  Pairs with
 * the barrier between setting need_wakeup (efd_armed) and re-checking for
 * work in hybd_queue_wait() (hybd_srv_io()).
 */
static void hybd_kick_worker(struct hybd_queue *q)
{
	/* order the publish before reading need_wakeup and efd_armed */
	smp_mb();
	if (READ_ONCE(q->need_wakeup))
		wake_up(&q->wq);
	hybd_queue_signal_armed(q);
}

/*
 * Drop q->lock, publishing first if the batch ends here (@publish), and
 * wake the worker if that made anything new visible.
 */
static void hybd_unlock_publish(struct hybd_queue *q, bool publish)
{
	bool published = publish && hybd_publish(q);

	spin_unlock(&q->lock);
	if (published)
		hybd_kick_worker(q);
}

/*
 * A dispatch batch ends (bd->last): publish what its earlier requests left
 * in the ring.  The fast path fills nothing, so it takes no lock unless a
 * slow-path request of the batch waits; the batch's own slots were filled
 * on this CPU, so the unlocked look sees them.
 */
static void hybd_end_batch(struct hybd_queue *q)
{
	if (READ_ONCE(q->sq_published) == READ_ONCE(q->sq_tail))
		return;
	spin_lock(&q->lock);
	hybd_unlock_publish(q, true);
}

/* A request the fast path completed, in queue_rq or by a remap: count it. */
static void hybd_count_fast(struct hybd_queue *q, struct hybd_tag *t, int ret)
{
	hybd_stat_inc(q, fast_done);
	if (ret)
		hybd_stat_inc(q, fast_errors);
	hybd_count_op(q, t->bio.op, t->bio.flags);
	hybd_lat_add(q, fast_lat, t->start_ns);
}

/*
 * A request that came through the front counts in the front's iostats,
 * as nvme's multipath head counts what its paths serve: the front is
 * the disk users see (and set from its add on: the partition scan during
 * it counts on the disk behind only).
 */
static void hybd_front_acct_start(struct hybd_queue *q, struct hybd_tag *t,
				  struct request *rq)
{
	struct gendisk *front = READ_ONCE(q->dev->front);

	t->front_acct = front && blk_queue_io_stat(front->queue);
	if (t->front_acct)
		t->acct_start = bdev_start_io_acct(front->part0, req_op(rq),
						   jiffies);
}

/**
 * hybd_end_request() - end a request hybd started
 * @q: its queue
 * @rq: the request
 * @sts: its status
 *
 * blk_mq_end_request(), and the front's iostats for it.
 */
void hybd_end_request(struct hybd_queue *q, struct request *rq,
		      blk_status_t sts)
{
	struct hybd_tag *t = &q->tags[rq->tag];

	if (t->front_acct) {
		t->front_acct = false;
		bdev_end_io_acct(q->dev->front->part0, req_op(rq),
				 blk_rq_sectors(rq), t->acct_start);
	}
	blk_mq_end_request(rq, sts);
}

/*
 * A read or write the front remapped has ended: count it.  @waited: a
 * REQ_NOWAIT clone ended with AGAIN in the submitter's own submit_bio(),
 * which the submitter starts again where it may wait; not a remap, nor an
 * error.  Any other AGAIN is an error.
 */
void hybd_count_front(struct hybd_queue *q, const struct hybd_bpf_io *io,
		      u64 start_ns, bool waited)
{
	if (waited) {
		hybd_stat_inc(q, remap_waited);
		return;
	}
	hybd_stat_inc(q, remap_front);
	hybd_stat_inc(q, remapped);
	hybd_stat_inc(q, fast_done);
	if (io->result)
		hybd_stat_inc(q, fast_errors);
	hybd_count_op(q, io->op, io->flags);
	hybd_lat_add(q, fast_lat, start_ns);
}

/* The fast path completed the request in queue_rq: count it, end it. */
static blk_status_t hybd_end_fast(struct hybd_queue *q, struct request *rq,
				  struct hybd_tag *t, int ret, bool last)
{
	hybd_count_fast(q, t, ret);
	if (last)
		hybd_end_batch(q);
	hybd_end_request(q, rq, hybd_errno_status(ret));
	return BLK_STS_OK;
}

/* ->complete of a remapped request (hybd_remap_complete()): end it. */
static void hybd_complete_rq(struct request *rq)
{
	struct hybd_queue *q = rq->mq_hctx->driver_data;
	struct hybd_tag *t = &q->tags[rq->tag];
	int err = hybd_remap_end(q, rq);

	hybd_count_fast(q, t, err);
	hybd_end_request(q, rq, hybd_errno_status(err));
}

/*
 * Put tag @t in the next submission slot with a new seq, its descriptor as
 * the kernel keeps it (t->srv_op, t->srv_flags, t->bio); caller holds
 * q->lock.
 */
static void hybd_issue(struct hybd_queue *q, struct hybd_tag *t, u32 tag)
{
	struct hybd_io_desc *desc = &q->desc[tag];

	t->seq = ++q->next_seq;
	t->state = HYBD_TAG_INFLIGHT;
	t->overdue_ns = 0;
	WRITE_ONCE(desc->op, t->srv_op);
	WRITE_ONCE(desc->flags, t->srv_flags);
	WRITE_ONCE(desc->nr_bytes, t->bio.bytes);
	WRITE_ONCE(desc->sector, t->bio.sector);
	WRITE_ONCE(desc->seq, t->seq);
	WRITE_ONCE(q->sq[q->sq_tail & (q->dev->ring_entries - 1)], tag);
	/* hybd_end_batch() looks without the lock */
	WRITE_ONCE(q->sq_tail, q->sq_tail + 1);
}

/*
 * Give tag @t's request to the server, as the program passed it (@ret:
 * HYBD_BPF_PASS or HYBD_BPF_PASS_ZEROES); @last: publish the batch.
 * Caller is in an RCU read-side section (the ring).
 */
static void hybd_to_server(struct hybd_queue *q, struct hybd_tag *t, int ret,
			   bool last)
{
	struct request *rq = t->rq;
	int op = t->bio.op, srv_op = op;
	u16 flags = t->bio.flags;

	/*
	 * What the server gets: a write the program found all zero goes as
	 * a write-zeroes of the same range and flags, without its payload.
	 * Everything else (t->bio for complete(), the per-kind counters,
	 * the completion, which looks at req_op()) sees the write it is.
	 */
	if (ret == HYBD_BPF_PASS_ZEROES) {
		/* a write of zeros provisions what it writes: keep it so */
		srv_op = HYBD_OP_WRITE_ZEROES;
		flags |= HYBD_IO_F_NOUNMAP;
	}

	/* the tag's buffer is ours until the request completes */
	if (srv_op == HYBD_OP_WRITE)
		hybd_rq_copy(rq, 0, q->data + (size_t)rq->tag *
			     q->dev->params.basic.max_io_bytes,
			     t->bio.bytes, false);

	spin_lock(&q->lock);
	if (q->dead) {
		hybd_stat_inc(q, failed_dead);
		hybd_unlock_publish(q, last);
		hybd_end_request(q, rq, BLK_STS_IOERR);
		return;
	}

	t->srv_op = srv_op;
	t->srv_flags = flags;
	hybd_issue(q, t, rq->tag);

	hybd_stat_inc(q, slow_issued);
	if (q->parked)
		hybd_stat_inc(q, held);
	if (srv_op != op)
		hybd_stat_inc(q, bpf_pass_zeroes);
	hybd_count_op(q, op, flags);
	hybd_unlock_publish(q, last);
}

static blk_status_t __hybd_queue_rq(struct hybd_queue *q,
				    const struct blk_mq_queue_data *bd,
				    struct hybd_tag **issue)
{
	struct request *rq = bd->rq;
	unsigned int tag = rq->tag;
	u32 bytes = blk_rq_bytes(rq);
	int op = hybd_rq_op(rq);
	struct hybd_tag *t;
	u16 flags;
	int ret;

	/* the queue limits offer nothing else, but trust no upper layer */
	if (op < 0 || !(q->dev->params.basic.ops & hybd_op_bit(op)) ||
	    ((rq->cmd_flags & REQ_FUA) &&
	     !(q->dev->params.basic.ops & HYBD_OPF_FUA)))
		return BLK_STS_NOTSUPP;
	if (WARN_ON_ONCE(tag >= q->dev->params.basic.queue_depth))
		return BLK_STS_IOERR;
	if ((op == HYBD_OP_READ || op == HYBD_OP_WRITE) &&
	    bytes > q->dev->params.basic.max_io_bytes)
		return BLK_STS_IOERR;
	/*
	 * A bio is checked against the capacity before it waits at a frozen
	 * queue: one that waited out a shrink may end beyond the new end.
	 */
	if (blk_rq_sectors(rq) &&
	    blk_rq_pos(rq) + blk_rq_sectors(rq) > get_capacity(rq->q->disk))
		return BLK_STS_IOERR;

	flags = hybd_bio_flags(rq->cmd_flags);
	blk_mq_start_request(rq);

	t = &q->tags[tag];
	hybd_front_acct_start(q, t, rq);
	t->rq = rq;
	t->start_ns = ktime_get_ns();
	t->bio = (struct hybd_bpf_io) {
		.op	= op,
		.flags	= flags,
		.sector	= blk_rq_pos(rq),
		.bytes	= op == HYBD_OP_FLUSH ? 0 : bytes,
		.dev_id	= q->dev->id,
		.queue	= q->id,
		.tag	= tag,
	};
	/* a dead device fails everything, the fast path included */
	if (READ_ONCE(q->dead))
		ret = HYBD_BPF_PASS;
	else
		ret = hybd_bpf_submit(q, t);
	if (ret == HYBD_BPF_REMAPPED) {
		if (hybd_remap_start(q, t, bd->last))
			*issue = t;
		if (bd->last)
			hybd_end_batch(q);
		return BLK_STS_OK;
	}
	/*
	 * A flush covers the remapped writes completed before it, whatever
	 * the program made of it: the targets they are on are synced first,
	 * in a worker, and then the verdict goes on (hybd_flush_synced()).
	 * Not on a dead device: it fails at once.
	 */
	if (op == HYBD_OP_FLUSH && !READ_ONCE(q->dead) &&
	    hybd_remap_flush_needed(q->dev)) {
		hybd_remap_sync_first(q, t, ret);
		if (bd->last)
			hybd_end_batch(q);
		return BLK_STS_OK;
	}
	if (ret != HYBD_BPF_PASS && ret != HYBD_BPF_PASS_ZEROES)
		return hybd_end_fast(q, rq, t, ret, bd->last);
	hybd_to_server(q, t, ret, bd->last);
	return BLK_STS_OK;
}

/**
 * hybd_flush_synced() - a flush's remapped writes are synced: go on
 * @q: its queue
 * @t: its tag, which hybd_remap_sync_first() took
 * @err: the sync's error, or 0
 *
 * As queue_rq would have with the program's verdict: to the server, or
 * ended (with the sync's error if there was one).
 *
 * Context: the tag's work (may sleep).
 */
void hybd_flush_synced(struct hybd_queue *q, struct hybd_tag *t, int err)
{
	int verdict = t->remap.verdict;

	WRITE_ONCE(t->state, HYBD_TAG_IDLE);
	if (verdict == HYBD_BPF_PASS || verdict == HYBD_BPF_PASS_ZEROES) {
		if (!err) {
			rcu_read_lock();
			hybd_to_server(q, t, verdict, true);
			rcu_read_unlock();
			return;
		}
		/* passed, so the program hears how it ended, as for a timeout */
		t->bio.result = err;
		hybd_bpf_complete(q, t);
	}
	err = err ?: verdict;
	hybd_count_fast(q, t, err);
	hybd_end_request(q, t->rq, hybd_errno_status(err));
}

/*
 * The tag set is BLK_MQ_F_BLOCKING so that a remap on a block device can
 * be started here, in the submitter's context, where submit_bio() may
 * sleep (hybd_remap_issue()).  All else runs in an RCU read-side section,
 * as in a queue_rq that does not block: the program and what it reads,
 * the ring, and what waits for them with synchronize_rcu() (a detach, a
 * remap barrier, a target's removal).
 */
static blk_status_t hybd_queue_rq(struct blk_mq_hw_ctx *hctx,
				  const struct blk_mq_queue_data *bd)
{
	struct hybd_queue *q = hctx->driver_data;
	struct hybd_tag *issue = NULL;
	blk_status_t sts;

	rcu_read_lock();
	sts = __hybd_queue_rq(q, bd, &issue);
	/* the issue may sleep: the batch's earlier requests go first */
	if (issue)
		hybd_end_batch(q);
	rcu_read_unlock();
	if (issue)
		hybd_remap_issue(q, issue);
	return sts;
}

/* blk-mq stopped a batch early: publish what queue_rq left unpublished. */
static void hybd_commit_rqs(struct blk_mq_hw_ctx *hctx)
{
	struct hybd_queue *q = hctx->driver_data;

	rcu_read_lock();
	spin_lock(&q->lock);
	hybd_unlock_publish(q, true);
	rcu_read_unlock();
}

/*
 * A request has waited for io_timeout seconds (or, without one, for the
 * liveness interval).  A server whose process is exiting fails everything,
 * even while something else keeps its file open; a live one that missed
 * the timeout fails this request only, and its late completion is
 * rejected (the tag is no longer in flight, or carries a newer seq).
 *
 * In recovery mode nothing fails while a new server may still come: a
 * request waits for the recovery timeout (WAITING), and one that a live
 * server let time out is counted and held, to be issued again if the
 * server is replaced, and fails only recovery_timeout seconds later.
 */
/*
 * The server's process is gone but its file is not released (a child
 * holds it, or the release is under way).  Without recovery that is the
 * end; with it, the release normally comes at once and holds the I/O
 * for a new server, but a file that stays open would hold it for ever: so
 * it fails too once the recovery timeout has passed since we first saw
 * the process gone.
 */
static bool hybd_dev_gone_for_good(struct hybd_dev *dev, u32 recovery)
{
	bool over;

	if (!recovery)
		return true;
	spin_lock(&dev->state_lock);
	if (!dev->gone_since)
		dev->gone_since = jiffies ?: 1;
	over = time_after_eq(jiffies, dev->gone_since + recovery * HZ);
	spin_unlock(&dev->state_lock);
	return over;
}

static enum blk_eh_timer_return hybd_timeout(struct request *rq)
{
	struct hybd_queue *q = rq->mq_hctx->driver_data;
	struct hybd_dev *dev = q->dev;
	struct hybd_tag *t = &q->tags[rq->tag];
	enum hybd_dev_state state = READ_ONCE(dev->state);
	u32 recovery = hybd_dev_recovery_secs(dev);
	bool mine = false, overdue = false, was_overdue = false;
	u64 now;

	/*
	 * A delete that a server does not help along (it writes back what
	 * the block layer holds, wave after wave of requests), or a dead
	 * server: fail everything, so that a delete takes one timeout at
	 * most.  hybd_dev_kill() ends @rq too if it was in flight; if not,
	 * queue_rq fails it.
	 */
	if (state == HYBD_STATE_DELETING) {
		hybd_dev_kill(dev);
		return BLK_EH_DONE;
	}
	/* no server: the recovery timeout decides (hybd_dev_lose_server()) */
	if (state == HYBD_STATE_WAITING)
		return BLK_EH_RESET_TIMER;
	if (hybd_dev_server_gone(dev)) {
		if (!hybd_dev_gone_for_good(dev, recovery))
			return BLK_EH_RESET_TIMER;
		hybd_dev_kill(dev);
		return BLK_EH_DONE;
	}
	if (!dev->params.basic.io_timeout)
		return BLK_EH_RESET_TIMER;

	now = ktime_get_ns();
	spin_lock(&q->lock);
	if (READ_ONCE(t->state) == HYBD_TAG_INFLIGHT && t->rq == rq) {
		was_overdue = t->overdue_ns;
		if (!recovery) {
			mine = true;
		} else if (!t->overdue_ns) {
			t->overdue_ns = now;
			overdue = true;
		} else if (now - t->overdue_ns >=
			   (u64)recovery * NSEC_PER_SEC) {
			mine = true;
		}
		if (mine)
			t->state = HYBD_TAG_IDLE;
	}
	spin_unlock(&q->lock);
	/* once per request, also when a handover's hold ran out meanwhile */
	if (overdue || (mine && !was_overdue))
		hybd_stat_inc(q, timed_out);
	/* being completed right now, not published yet, or held: not ours */
	if (!mine)
		return BLK_EH_RESET_TIMER;

	hybd_stat_inc(q, slow_errors);
	/* the program learns of it: a write may or may not have happened */
	t->bio.result = -EIO;
	hybd_bpf_complete(q, t);
	hybd_end_request(q, rq, BLK_STS_IOERR);
	return BLK_EH_DONE;
}

const struct blk_mq_ops hybd_mq_ops = {
	.queue_rq	= hybd_queue_rq,
	.commit_rqs	= hybd_commit_rqs,
	.complete	= hybd_complete_rq,
	.init_hctx	= hybd_init_hctx,
	.timeout	= hybd_timeout,
};

static int hybd_reissue_cmp(const void *a, const void *b)
{
	const struct hybd_reissue *x = a, *y = b;

	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/**
 * hybd_queue_resume() - give a new server what its predecessor left
 * @q: a parked queue
 * @list: room for queue_depth entries
 *
 * Every request in flight is issued again, in the order it was first
 * issued, as slots 0..n-1 of a rewound ring with every index reset, each
 * with a new seq (a completion for the old one is stale).  A write's
 * payload is copied again: the old server could write its buffer.  While
 * that copy runs the tags are REISSUE, which no completion, timeout or
 * kill ends, so their requests stay alive; a kill meanwhile leaves them to
 * us, and we fail them.
 *
 * Return: 0, or -ENODEV if the queue died meanwhile.
 */
int hybd_queue_resume(struct hybd_queue *q, struct hybd_reissue *list)
{
	u32 depth = q->dev->params.basic.queue_depth;
	u32 max_io = q->dev->params.basic.max_io_bytes;
	unsigned int tag, i, n = 0;
	struct hybd_tag *t;
	bool dead;
	u8 state;

	spin_lock(&q->lock);
	for (tag = 0; tag < depth; tag++) {
		if (READ_ONCE(q->tags[tag].state) == HYBD_TAG_INFLIGHT)
			q->tags[tag].state = HYBD_TAG_REISSUE;
	}
	spin_unlock(&q->lock);

	for (tag = 0; tag < depth; tag++) {
		t = &q->tags[tag];
		/* only we move a tag out of REISSUE */
		if (READ_ONCE(t->state) != HYBD_TAG_REISSUE ||
		    t->srv_op != HYBD_OP_WRITE)
			continue;
		hybd_rq_copy(t->rq, 0, q->data + (size_t)tag * max_io,
			     t->bio.bytes, false);
		cond_resched();
	}

	spin_lock(&q->lock);
	dead = q->dead;
	/* and the requests queued since, never published: parked */
	for (tag = 0; tag < depth; tag++) {
		t = &q->tags[tag];
		/* a remap's end writes it without the lock */
		state = READ_ONCE(t->state);
		if (state == HYBD_TAG_REISSUE ||
		    (!dead && state == HYBD_TAG_INFLIGHT)) {
			list[n].seq = t->seq;
			list[n].tag = tag;
			n++;
		}
	}
	if (dead) {
		for (i = 0; i < n; i++)
			q->tags[list[i].tag].state = HYBD_TAG_IDLE;
		spin_unlock(&q->lock);
		for (i = 0; i < n; i++) {
			hybd_stat_inc(q, failed_dead);
			hybd_end_request(q, q->tags[list[i].tag].rq,
					   BLK_STS_IOERR);
		}
		return -ENODEV;
	}
	sort(list, n, sizeof(*list), hybd_reissue_cmp, NULL);

	WRITE_ONCE(q->sq_tail, 0);
	q->cq_head = 0;
	WRITE_ONCE(q->hdr->sq_tail, 0);
	WRITE_ONCE(q->hdr->sq_head, 0);
	WRITE_ONCE(q->hdr->cq_tail, 0);
	WRITE_ONCE(q->hdr->cq_head, 0);
	/* a handover asked for since the resume began stands */
	if (!READ_ONCE(q->dev->handover))
		WRITE_ONCE(q->hdr->flags, q->hdr->flags & ~HYBD_RING_DRAIN);
	WRITE_ONCE(q->kicked, false);
	for (i = 0; i < n; i++) {
		hybd_issue(q, &q->tags[list[i].tag], list[i].tag);
		hybd_stat_inc(q, reissued);
	}
	q->parked = false;
	/* the new server has seen nothing: everything up to n is new */
	WRITE_ONCE(q->sq_returned, 0);
	/* descriptors, slots, reset indices: pairs with the server's acquire */
	smp_store_release(&q->hdr->sq_tail, q->sq_tail);
	/* the same for hybd_srv_io(), as in hybd_publish() */
	smp_store_release(&q->sq_published, q->sq_tail);
	spin_unlock(&q->lock);
	hybd_queue_wake(q);
	return 0;
}

/**
 * hybd_queue_fail_all() - mark a queue dead and fail its outstanding requests
 * @q: the queue
 *
 * Every request the server had not completed ends with BLK_STS_IOERR, and
 * every later one fails in queue_rq.  Exactly one side ends a request: the
 * tag's state moves from INFLIGHT under @q->lock.  A request being issued
 * again (REISSUE) is left to hybd_queue_resume(), which sees the queue dead
 * and fails it.
 */
void hybd_queue_fail_all(struct hybd_queue *q)
{
	unsigned int depth = q->dev->params.basic.queue_depth;
	struct request *rq;
	unsigned int tag;

	spin_lock(&q->lock);
	WRITE_ONCE(q->dead, true);
	if (q->hdr)
		WRITE_ONCE(q->hdr->flags, q->hdr->flags | HYBD_RING_DEAD);
	spin_unlock(&q->lock);

	for (tag = 0; tag < depth; tag++) {
		spin_lock(&q->lock);
		rq = NULL;
		if (READ_ONCE(q->tags[tag].state) == HYBD_TAG_INFLIGHT) {
			q->tags[tag].state = HYBD_TAG_IDLE;
			rq = q->tags[tag].rq;
			hybd_stat_inc(q, failed_dead);
		}
		spin_unlock(&q->lock);
		if (rq)
			hybd_end_request(q, rq, BLK_STS_IOERR);
	}
	hybd_queue_wake(q);
}
