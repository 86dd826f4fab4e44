// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - blk-mq side: every request is published to its hardware queue's
 * submission ring, and the server is woken once per batch, only if it
 * sleeps.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/blkdev.h>
#include <linux/bvec.h>

#include "hybd.h"

static int hybd_init_hctx(struct blk_mq_hw_ctx *hctx, void *data,
			  unsigned int hctx_idx)
{
	struct hybd_dev *dev = data;

	hctx->driver_data = &dev->queues[hctx_idx];
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

static u16 hybd_rq_flags(struct request *rq)
{
	u16 flags = 0;

	if (rq->cmd_flags & REQ_FUA)
		flags |= HYBD_IO_F_FUA;
	if (rq->cmd_flags & REQ_NOUNMAP)
		flags |= HYBD_IO_F_NOUNMAP;
	if (rq->cmd_flags & REQ_SYNC)
		flags |= HYBD_IO_F_SYNC;
	if (rq->cmd_flags & REQ_META)
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
 * @buf: the buffer
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
		if (to_rq)
			memcpy_to_bvec(&bv, buf);
		else
			memcpy_from_bvec(buf, &bv);
		buf += n;
		len -= n;
		if (!len)
			break;
	}
}

/* Make the filled slots visible; caller holds q->lock. */
static bool hybd_publish(struct hybd_queue *q)
{
	if (q->sq_published == q->sq_tail)
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
 * The fast path completed the request: count it, end it, and publish what
 * earlier requests of the batch left in the ring.
 */
static blk_status_t hybd_end_fast(struct hybd_queue *q, struct request *rq,
				  struct hybd_tag *t, int ret, bool last)
{
	hybd_stat_inc(q, fast_done);
	if (ret)
		hybd_stat_inc(q, fast_errors);
	hybd_count_op(q, t->bio.op, t->bio.flags);
	hybd_lat_add(q, fast_lat, t->start_ns);
	if (last) {
		spin_lock(&q->lock);
		hybd_unlock_publish(q, true);
	}

	blk_mq_end_request(rq, hybd_errno_status(ret));
	return BLK_STS_OK;
}

static blk_status_t hybd_queue_rq(struct blk_mq_hw_ctx *hctx,
				  const struct blk_mq_queue_data *bd)
{
	struct hybd_queue *q = hctx->driver_data;
	struct request *rq = bd->rq;
	unsigned int tag = rq->tag;
	u32 bytes = blk_rq_bytes(rq);
	struct hybd_io_desc *desc;
	int op = hybd_rq_op(rq);
	struct hybd_tag *t;
	int srv_op, ret;
	u16 flags;

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

	flags = hybd_rq_flags(rq);
	blk_mq_start_request(rq);

	t = &q->tags[tag];
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
	if (ret != HYBD_BPF_PASS && ret != HYBD_BPF_PASS_ZEROES)
		return hybd_end_fast(q, rq, t, ret, bd->last);

	/*
	 * What the server gets: a write the program found all zero goes as
	 * a write-zeroes of the same range and flags, without its payload.
	 * Everything else (t->bio for complete(), the per-kind counters,
	 * the completion, which looks at req_op()) sees the write it is.
	 */
	srv_op = op;
	if (ret == HYBD_BPF_PASS_ZEROES) {
		/* a write of zeros provisions what it writes: keep it so */
		srv_op = HYBD_OP_WRITE_ZEROES;
		flags |= HYBD_IO_F_NOUNMAP;
	}

	/* the tag's buffer is ours until the request completes */
	if (srv_op == HYBD_OP_WRITE)
		hybd_rq_copy(rq, 0, q->data + (size_t)tag *
			     q->dev->params.basic.max_io_bytes, bytes, false);

	spin_lock(&q->lock);
	if (q->dead) {
		hybd_stat_inc(q, failed_dead);
		hybd_unlock_publish(q, bd->last);
		return BLK_STS_IOERR;
	}

	t->seq = ++q->next_seq;
	t->state = HYBD_TAG_INFLIGHT;

	desc = &q->desc[tag];
	WRITE_ONCE(desc->op, srv_op);
	WRITE_ONCE(desc->flags, flags);
	WRITE_ONCE(desc->nr_bytes, op == HYBD_OP_FLUSH ? 0 : bytes);
	WRITE_ONCE(desc->sector, blk_rq_pos(rq));
	WRITE_ONCE(desc->seq, t->seq);
	WRITE_ONCE(q->sq[q->sq_tail & (q->dev->ring_entries - 1)], tag);
	q->sq_tail++;

	hybd_stat_inc(q, slow_issued);
	if (srv_op != op)
		hybd_stat_inc(q, bpf_pass_zeroes);
	hybd_count_op(q, op, flags);
	hybd_unlock_publish(q, bd->last);
	return BLK_STS_OK;
}

/* blk-mq stopped a batch early: publish what queue_rq left unpublished. */
static void hybd_commit_rqs(struct blk_mq_hw_ctx *hctx)
{
	struct hybd_queue *q = hctx->driver_data;

	spin_lock(&q->lock);
	hybd_unlock_publish(q, true);
}

/*
 * A request has waited for io_timeout seconds (or, without one, for the
 * liveness interval).  A server whose process is exiting fails everything,
 * even while something else keeps its file open; a live one that missed
 * the timeout fails this request only, and its late completion is
 * rejected (the tag is no longer in flight, or carries a newer seq).
 */
static enum blk_eh_timer_return hybd_timeout(struct request *rq)
{
	struct hybd_queue *q = rq->mq_hctx->driver_data;
	struct hybd_dev *dev = q->dev;
	struct hybd_tag *t = &q->tags[rq->tag];
	bool mine = false;

	/*
	 * A dead server, or a delete that a server does not help along (it
	 * writes back what the block layer holds, wave after wave of
	 * requests): fail everything, so that a delete takes one timeout at
	 * most.  hybd_dev_kill() ends @rq too if it was in flight; if not,
	 * queue_rq fails it.
	 */
	if (hybd_dev_server_gone(dev) ||
	    READ_ONCE(dev->state) == HYBD_STATE_DELETING) {
		hybd_dev_kill(dev);
		return BLK_EH_DONE;
	}
	if (!dev->params.basic.io_timeout)
		return BLK_EH_RESET_TIMER;

	spin_lock(&q->lock);
	if (t->state == HYBD_TAG_INFLIGHT && t->rq == rq) {
		t->state = HYBD_TAG_IDLE;
		mine = true;
	}
	spin_unlock(&q->lock);
	/* being completed right now, or not published yet: not ours to end */
	if (!mine)
		return BLK_EH_RESET_TIMER;

	hybd_stat_inc(q, timed_out);
	hybd_stat_inc(q, slow_errors);
	/* the program learns of it: a write may or may not have happened */
	t->bio.result = -EIO;
	hybd_bpf_complete(q, t);
	blk_mq_end_request(rq, BLK_STS_IOERR);
	return BLK_EH_DONE;
}

const struct blk_mq_ops hybd_mq_ops = {
	.queue_rq	= hybd_queue_rq,
	.commit_rqs	= hybd_commit_rqs,
	.init_hctx	= hybd_init_hctx,
	.timeout	= hybd_timeout,
};

/**
 * hybd_queue_fail_all() - mark a queue dead and fail its outstanding requests
 * @q: the queue
 *
 * Every request the server had not completed ends with BLK_STS_IOERR, and
 * every later one fails in queue_rq.  Exactly one side ends a request: the
 * tag's state moves from INFLIGHT under @q->lock.
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
		if (q->tags[tag].state == HYBD_TAG_INFLIGHT) {
			q->tags[tag].state = HYBD_TAG_IDLE;
			rq = q->tags[tag].rq;
			hybd_stat_inc(q, failed_dead);
		}
		spin_unlock(&q->lock);
		if (rq)
			blk_mq_end_request(rq, BLK_STS_IOERR);
	}
	hybd_queue_wake(q);
}
