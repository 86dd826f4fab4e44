// SPDX-License-Identifier: GPL-2.0
/*
 * hybd - the BPF fast path: a struct_ops type, struct hybd_bpf_ops, that a
 * program attaches to one device through a BPF link, and the kfuncs that
 * move data between a request and BPF memory.
 *
 * submit() runs in queue_rq for every request and either completes it
 * (HYBD_BPF_DONE or -errno), remaps it to a backing target the kernel
 * serves it on (hybd_bpf_io_remap(), HYBD_BPF_REMAPPED), or passes it to
 * the server (HYBD_BPF_PASS; a write it found all zero may go as a
 * write-zeroes, HYBD_BPF_PASS_ZEROES).  complete() runs for a request when
 * the server, or the remap, has finished it.  On a device with a
 * bio-based front, map() runs on each read and write bio first, and may
 * only remap or pass (front.c); its io is a struct hybd_front_io's, which
 * io->tag tells (HYBD_BPF_TAG_FRONT), and has no request to move data to
 * or from.
 *
 * Each attach or replace makes a struct hybd_bpf_prog: the ops, the
 * generation stamped on the requests it passes, and the device it belongs
 * to.  The device points at it through one RCU pointer, so a request sees
 * one program with its own generation, or none, and is completed exactly
 * once either way.  The program is tied to the device object, never to an
 * id that a later device may reuse; and an ops that left its device never
 * comes back (its maps missed what the device did meanwhile).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bpf.h>
#include <linux/bpf_verifier.h>
#include <linux/btf.h>
#include <linux/btf_ids.h>
#include <linux/blk-mq.h>
#include <linux/bvec.h>
#include <linux/module.h>
#include <linux/string.h>

#include "hybd.h"

/**
 * struct hybd_bpf_prog - a program attached to a device
 * @ops: the kernel's copy of the struct_ops map's value
 * @gen: the device's generation when it was attached; tags carry it
 * @dev: the device, referenced
 * @link: the BPF link, or NULL (a map registered without one); its id is
 *	read at info time, since a link has none yet during reg()
 * @node: in hybd_bpf_progs
 * @rcu: freed after a grace period: submit() and complete() read it under
 *	RCU, once per call
 */
struct hybd_bpf_prog {
	struct hybd_bpf_ops	*ops;
	u32			gen;
	struct hybd_dev		*dev;
	struct bpf_link		*link;
	struct list_head	node;
	struct rcu_head		rcu;
};

/*
 * Set in the kernel's copy of hybd_bpf_ops.flags (user space must pass 0)
 * once the ops has left its device: detached, replaced, or the device was
 * deleted.  Its maps missed every write since, so it is never registered
 * again: a loader attaches a fresh load instead.
 */
#define HYBD_BPF_OPS_RETIRED	(1U << 31)

/*
 * hybd_bpf_lock protects hybd_bpf_progs, every dev->bpf_prog, bpf_gen,
 * bpf_attaches and bpf_gone, and the RETIRED flag.  hybd_bpf_progs holds
 * each device's current program, so that unreg() and update() find the
 * device of an ops without looking its id up.
 */
static DEFINE_MUTEX(hybd_bpf_lock);
static LIST_HEAD(hybd_bpf_progs);
static const struct btf *hybd_btf;

/*
 * struct hybd_bpf_io's id in the module's BTF as loaded, which the
 * verifier uses: read from the ops' own prototypes (hybd_op_io_id()) when
 * a program is checked, never from a BTF_ID_LIST.  A module's BTF built
 * with a distilled base (Kbuild asks pahole >= 1.26 for one out of tree:
 * Debian's 7.x) is relocated when the module loads, and the ids that
 * resolve_btfids wrote into .BTF_ids stay the ones from before (the
 * kernel relocates kfunc sets and dtor ids only).  0 until a program was
 * checked; then no write passes hybd_ops_btf_struct_access().
 */
static u32 hybd_io_btf_id;

/*
 * The struct an op of hybd_bpf_ops takes (@member: a pointer to a
 * function whose first argument points to struct hybd_bpf_io, for every
 * op), by walking the module's BTF; 0 if it is not of that shape.
 */
static u32 hybd_op_io_id(const struct btf_member *member)
{
	const struct btf_type *t;
	u32 id;

	t = btf_type_by_id(hybd_btf, member->type);
	if (!t || !btf_type_is_ptr(t))
		return 0;
	t = btf_type_by_id(hybd_btf, t->type);
	if (!t || !btf_type_is_func_proto(t) || !btf_type_vlen(t))
		return 0;
	t = btf_type_by_id(hybd_btf, btf_params(t)[0].type);
	if (!t || !btf_type_is_ptr(t))
		return 0;
	id = t->type;
	t = btf_type_by_id(hybd_btf, id);
	if (!t || !btf_type_is_struct(t) ||
	    t->size != sizeof(struct hybd_bpf_io))
		return 0;
	return id;
}

static struct hybd_tag *hybd_io_tag(struct hybd_bpf_io *io)
{
	return container_of(io, struct hybd_tag, bio);
}

/* An io of the front's: a bio, no request (no payload kfuncs). */
static bool hybd_io_front(const struct hybd_bpf_io *io)
{
	return io->tag == HYBD_BPF_TAG_FRONT;
}

/*
 * Whether a request's payload may be read: a write's always; a read's only
 * in complete() after the server succeeded, when it is the device's data
 * (in submit() it is whatever the pages held, and after a failure too).
 */
static bool hybd_io_readable(struct hybd_bpf_io *io)
{
	if (hybd_io_front(io))
		return false;
	switch (io->op) {
	case HYBD_OP_WRITE:
		return true;
	case HYBD_OP_READ:
		return hybd_io_tag(io)->bpf_data;
	default:
		return false;
	}
}

__bpf_kfunc_start_defs();

/**
 * hybd_bpf_io_zero() - fill a read request with zeros
 * @io: the request, a read
 *
 * Fills the whole payload: submit() may then return HYBD_BPF_DONE.
 *
 * Context: submit() or complete(); does not sleep.
 * Return: 0, or -EINVAL if @io is not a read, or is a front's bio.
 */
__bpf_kfunc int hybd_bpf_io_zero(struct hybd_bpf_io *io)
{
	struct hybd_tag *t = hybd_io_tag(io);

	if (io->op != HYBD_OP_READ || hybd_io_front(io))
		return -EINVAL;
	hybd_rq_copy(t->rq, 0, NULL, io->bytes, true);
	t->bpf_filled = io->bytes;
	return 0;
}

/**
 * hybd_bpf_io_copy_in() - copy BPF memory into a read request's payload
 * @io: the request, a read
 * @off: byte offset into the payload
 * @src: BPF memory (a map value, stack)
 * @src__sz: bytes to copy; @off + @src__sz must not pass io->bytes
 *
 * The kernel counts as filled the prefix of the payload that copies
 * starting at or before its end have covered: fill a read from offset 0
 * up, in order, before submit() returns HYBD_BPF_DONE for it.
 *
 * Context: submit() or complete(); does not sleep.
 * Return: 0, -EINVAL if @io is not a read or is a front's bio, -ERANGE if
 * out of bounds.
 */
__bpf_kfunc int hybd_bpf_io_copy_in(struct hybd_bpf_io *io, u32 off,
				    const void *src, u32 src__sz)
{
	struct hybd_tag *t = hybd_io_tag(io);

	if (io->op != HYBD_OP_READ || hybd_io_front(io))
		return -EINVAL;
	if ((u64)off + src__sz > io->bytes)
		return -ERANGE;
	hybd_rq_copy(t->rq, off, (void *)src, src__sz, true);
	if (off <= t->bpf_filled && off + src__sz > t->bpf_filled)
		t->bpf_filled = off + src__sz;
	return 0;
}

/**
 * hybd_bpf_io_copy_out() - copy a request's payload into BPF memory
 * @io: the request: a write (submit or complete) or a read in complete()
 *      that the server succeeded, whose payload is the data it returned
 * @off: byte offset into the payload
 * @dst: BPF memory (a map value, stack)
 * @dst__sz: bytes to copy; @off + @dst__sz must not pass io->bytes
 *
 * Context: submit() or complete(); does not sleep.
 * Return: 0, -EINVAL for a request without payload, a read in submit()
 * or a read the server failed, a front's bio, -ERANGE if out of bounds.
 */
__bpf_kfunc int hybd_bpf_io_copy_out(struct hybd_bpf_io *io, u32 off,
				     void *dst, u32 dst__sz)
{
	if (!hybd_io_readable(io))
		return -EINVAL;
	if ((u64)off + dst__sz > io->bytes)
		return -ERANGE;
	hybd_rq_copy(hybd_io_tag(io)->rq, off, dst, dst__sz, false);
	return 0;
}

/**
 * hybd_bpf_io_is_zero() - test whether a request's payload is all zero
 * @io: the request: a write, or a read in complete() that the server
 *      succeeded
 *
 * Context: submit() or complete(); does not sleep.
 * Return: 1 if every byte is zero, 0 if not, -EINVAL for a request without
 * payload, a read in submit() or a read the server failed, a front's bio.
 */
__bpf_kfunc int hybd_bpf_io_is_zero(struct hybd_bpf_io *io)
{
	struct req_iterator iter;
	struct request *rq;
	struct bio_vec bv;

	if (!hybd_io_readable(io))
		return -EINVAL;
	rq = hybd_io_tag(io)->rq;
	rq_for_each_segment(bv, rq, iter) {
		void *p = bvec_kmap_local(&bv);
		bool nz = memchr_inv(p, 0, bv.bv_len);

		kunmap_local(p);
		if (nz)
			return 0;
	}
	return 1;
}

/**
 * hybd_bpf_io_remap() - serve the request on a backing target
 * @io: the request
 * @index: the target, as HYBD_SRV_ADD_BACKING returned it
 * @offset: byte offset on the target where the request's range starts
 *          (ignored for a flush)
 *
 * On success submit() returns HYBD_BPF_REMAPPED and the kernel does the
 * I/O (see HYBD_BPF_REMAPPED in uapi/hybd.h); on an error the request is
 * untouched and the program may pass it, serve it or fail it.  Refusals
 * count in remap_refused.
 *
 * In map() (a front's bio), only a read or write on a block device target
 * is taken; the kernel passes the bio otherwise.
 *
 * Context: submit() or map() only; does not sleep.
 * Return: 0; -EPERM outside submit() and map(), -EALREADY if remapped already,
 * -EINVAL for an index out of range or an @offset the target's direct I/O
 * cannot take, -ENOENT if no target is registered there, -ERANGE if the
 * range passes the target's end, -EROFS for a write, discard or
 * write-zeroes on a read-only target.
 */
__bpf_kfunc int hybd_bpf_io_remap(struct hybd_bpf_io *io, u32 index,
				  u64 offset)
{
	struct hybd_front_io *f;
	struct hybd_queue *q;
	struct hybd_tag *t;
	int ret;

	if (hybd_io_front(io)) {
		f = container_of(io, struct hybd_front_io, bio);
		q = f->q;
		ret = hybd_remap_prepare_front(f, index, offset);
	} else {
		t = hybd_io_tag(io);
		q = t->rq->mq_hctx->driver_data;
		ret = hybd_remap_prepare(q, t, index, offset);
	}
	if (ret)
		hybd_stat_inc(q, remap_refused);
	return ret;
}

__bpf_kfunc_end_defs();

BTF_KFUNCS_START(hybd_kfunc_ids)
BTF_ID_FLAGS(func, hybd_bpf_io_zero, KF_TRUSTED_ARGS)
BTF_ID_FLAGS(func, hybd_bpf_io_copy_in, KF_TRUSTED_ARGS)
BTF_ID_FLAGS(func, hybd_bpf_io_copy_out, KF_TRUSTED_ARGS)
BTF_ID_FLAGS(func, hybd_bpf_io_is_zero, KF_TRUSTED_ARGS)
BTF_ID_FLAGS(func, hybd_bpf_io_remap, KF_TRUSTED_ARGS)
BTF_KFUNCS_END(hybd_kfunc_ids)

/*
 * The kfuncs work on a struct hybd_bpf_io that only hybd_bpf_ops programs
 * are given: refuse them to every other program, struct_ops of other
 * kinds included.
 */
static int hybd_kfunc_filter(const struct bpf_prog *prog, u32 kfunc_id)
{
	/*
	 * A filter sees the kfuncs of its own BTF only: hybd's.  (Not
	 * btf_id_set8_contains(&hybd_kfunc_ids, ...): the kernel relocates
	 * a copy of the set, @kfunc_id is an id of the relocated BTF, and
	 * hybd_kfunc_ids keeps the ids from before.)  The module's BTF has
	 * one struct_ops type: hybd_bpf_ops.
	 */
	if (prog->type == BPF_PROG_TYPE_STRUCT_OPS && hybd_btf &&
	    prog->aux->attach_btf == hybd_btf)
		return 0;
	return -EACCES;
}

static const struct btf_kfunc_id_set hybd_kfunc_set = {
	.owner	= THIS_MODULE,
	.set	= &hybd_kfunc_ids,
	.filter	= hybd_kfunc_filter,
};

/* ---- the struct_ops type ---- */

static int hybd_ops_init(struct btf *btf)
{
	hybd_btf = btf;
	return 0;
}

static bool hybd_ops_is_valid_access(int off, int size,
				     enum bpf_access_type type,
				     const struct bpf_prog *prog,
				     struct bpf_insn_access_aux *info)
{
	return bpf_tracing_btf_ctx_access(off, size, type, prog, info);
}

/* Programs may write io->scratch and nothing else. */
static int hybd_ops_btf_struct_access(struct bpf_verifier_log *log,
				      const struct bpf_reg_state *reg,
				      int off, int size)
{
	u32 io_id = READ_ONCE(hybd_io_btf_id);

	if (io_id && reg->btf == hybd_btf && reg->btf_id == io_id &&
	    off >= offsetof(struct hybd_bpf_io, scratch) &&
	    off + size <= offsetofend(struct hybd_bpf_io, scratch))
		return NOT_INIT;
	bpf_log(log, "hybd: only hybd_bpf_io.scratch is writable (off %d size %d)\n",
		off, size);
	return -EACCES;
}

static const struct bpf_verifier_ops hybd_verifier_ops = {
	.get_func_proto		= bpf_base_func_proto,
	.is_valid_access	= hybd_ops_is_valid_access,
	.btf_struct_access	= hybd_ops_btf_struct_access,
};

/*
 * The hooks run where sleeping is not allowed.  Called before the
 * verifier walks the program: the io's id is known before any write to
 * it is checked.
 */
static int hybd_ops_check_member(const struct btf_type *t,
				 const struct btf_member *member,
				 const struct bpf_prog *prog)
{
	u32 id;

	if (prog->sleepable)
		return -EINVAL;
	id = hybd_op_io_id(member);
	if (id)
		WRITE_ONCE(hybd_io_btf_id, id);
	return 0;
}

static int hybd_ops_init_member(const struct btf_type *t,
				const struct btf_member *member,
				void *kdata, const void *udata)
{
	const struct hybd_bpf_ops *uops = udata;
	struct hybd_bpf_ops *kops = kdata;
	u32 moff = __btf_member_bit_offset(t, member) / 8;

	switch (moff) {
	case offsetof(struct hybd_bpf_ops, dev_id):
		kops->dev_id = uops->dev_id;
		return 1;
	case offsetof(struct hybd_bpf_ops, flags):
		if (uops->flags)
			return -EINVAL;
		kops->flags = 0;
		return 1;
	case offsetof(struct hybd_bpf_ops, name):
		if (strnlen(uops->name, sizeof(uops->name)) >=
		    sizeof(uops->name))
			return -EINVAL;
		strscpy(kops->name, uops->name, sizeof(kops->name));
		return 1;
	}
	return 0;
}

static int hybd_ops_validate(void *kdata)
{
	struct hybd_bpf_ops *ops = kdata;

	return ops->submit ? 0 : -EINVAL;
}

/* The program of @ops, if it is attached; under hybd_bpf_lock. */
static struct hybd_bpf_prog *hybd_bpf_find(struct hybd_bpf_ops *ops)
{
	struct hybd_bpf_prog *p;

	list_for_each_entry(p, &hybd_bpf_progs, node)
		if (p->ops == ops)
			return p;
	return NULL;
}

/* May @ops be registered, as far as its own past goes? */
static int hybd_bpf_ops_usable(struct hybd_bpf_ops *ops)
{
	if (ops->flags & HYBD_BPF_OPS_RETIRED)
		return -ESTALE;
	if (hybd_bpf_find(ops))
		return -EBUSY;
	return 0;
}

/*
 * Make @p its device's program, with a new generation; under
 * hybd_bpf_lock.  The device's previous program, if any, is the caller's
 * to take off the list.
 */
static void hybd_bpf_install(struct hybd_bpf_prog *p)
{
	struct hybd_dev *dev = p->dev;

	if (!++dev->bpf_gen)	/* 0 means "no program" */
		++dev->bpf_gen;
	p->gen = dev->bpf_gen;
	dev->bpf_attaches++;
	WRITE_ONCE(dev->front_maps, !!p->ops->map);
	list_add(&p->node, &hybd_bpf_progs);
	rcu_assign_pointer(dev->bpf_prog, p);
}

/* Take @p off its device for good; under hybd_bpf_lock. */
static void hybd_bpf_uninstall(struct hybd_bpf_prog *p)
{
	p->ops->flags |= HYBD_BPF_OPS_RETIRED;
	list_del(&p->node);
	WARN_ON_ONCE(rcu_access_pointer(p->dev->bpf_prog) != p);
	RCU_INIT_POINTER(p->dev->bpf_prog, NULL);
	WRITE_ONCE(p->dev->front_maps, false);
}

/* Free an uninstalled program once no submit() or complete() can see it. */
static void hybd_bpf_prog_release(struct hybd_bpf_prog *p)
{
	synchronize_rcu();
	hybd_dev_put(p->dev);
	kfree(p);
}

/*
 * A device takes a program while it is added, live or waiting for a new
 * server (the fast path serves on meanwhile).  The state is only
 * a courtesy (a clear -ENODEV for a dead or deleting device); bpf_gone,
 * set by hybd_bpf_dev_gone() under hybd_bpf_lock, is what makes an attach
 * and a delete exclude each other.
 */
static bool hybd_bpf_dev_takes_prog(struct hybd_dev *dev)
{
	enum hybd_dev_state state = READ_ONCE(dev->state);

	return !dev->bpf_gone &&
	       (state == HYBD_STATE_ADDED || state == HYBD_STATE_LIVE ||
		state == HYBD_STATE_WAITING);
}

/**
 * hybd_bpf_block() - keep programs off @dev (a shrink), or let them on
 * @dev: the device
 * @block: true to keep them off
 *
 * Return: 0, or -EBUSY if @block and a program is attached.
 */
int hybd_bpf_block(struct hybd_dev *dev, bool block)
{
	int ret = 0;

	mutex_lock(&hybd_bpf_lock);
	if (block && rcu_access_pointer(dev->bpf_prog))
		ret = -EBUSY;
	else
		dev->bpf_blocked = block;
	mutex_unlock(&hybd_bpf_lock);
	return ret;
}

/**
 * hybd_ops_reg() - attach a program to the device named by its dev_id
 * @kdata: the kernel's struct hybd_bpf_ops
 * @link: the link being created, or NULL
 *
 * Context: process context (BPF_LINK_CREATE), may sleep.
 * Return: 0; -EPERM without CAP_SYS_ADMIN, -ENODEV if the device does not
 * exist or is dead or being deleted, -EBUSY if it has a program (or this
 * one is attached already) or is being shrunk, -ESTALE if this ops was
 * attached before.
 */
static int hybd_ops_reg(void *kdata, struct bpf_link *link)
{
	struct hybd_bpf_ops *ops = kdata;
	struct hybd_bpf_prog *p;
	struct hybd_dev *dev;
	int ret;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	dev = hybd_dev_get(ops->dev_id);
	if (!dev)
		return -ENODEV;
	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p) {
		hybd_dev_put(dev);
		return -ENOMEM;
	}
	p->ops = ops;
	p->dev = dev;		/* the device reference is p's */
	p->link = link;

	mutex_lock(&hybd_bpf_lock);
	ret = hybd_bpf_ops_usable(ops);
	if (!ret && !hybd_bpf_dev_takes_prog(dev))
		ret = -ENODEV;
	if (!ret && (rcu_access_pointer(dev->bpf_prog) || dev->bpf_blocked))
		ret = -EBUSY;
	if (!ret)
		hybd_bpf_install(p);
	mutex_unlock(&hybd_bpf_lock);

	if (ret) {
		hybd_dev_put(dev);
		kfree(p);
	}
	return ret;
}

/**
 * hybd_ops_unreg() - detach a program from the device it was attached to
 * @kdata: the kernel's struct hybd_bpf_ops
 * @link: its link, or NULL
 *
 * Acts on the device object the program was attached to, which may have
 * been deleted since (then there is nothing left to do), never on whatever
 * device has its id now.  @kdata is never registered again.
 *
 * Context: process context, may sleep.  No submit() or complete() of
 * @kdata runs once it returns.
 */
static void hybd_ops_unreg(void *kdata, struct bpf_link *link)
{
	struct hybd_bpf_ops *ops = kdata;
	struct hybd_bpf_prog *p;

	mutex_lock(&hybd_bpf_lock);
	ops->flags |= HYBD_BPF_OPS_RETIRED;
	p = hybd_bpf_find(ops);
	if (p)
		hybd_bpf_uninstall(p);
	mutex_unlock(&hybd_bpf_lock);
	if (p)
		hybd_bpf_prog_release(p);
}

/**
 * hybd_ops_update() - replace a device's program under its link
 * @kdata: the new struct hybd_bpf_ops, for the same dev_id
 * @old_kdata: the one attached now
 * @link: the link
 *
 * Every request sees the old program or the new one: the new one gets a
 * new generation, so complete() never tells it a request the old one
 * passed is its own.
 *
 * Context: process context (BPF_LINK_UPDATE), may sleep.
 * Return: 0; -EPERM without CAP_SYS_ADMIN, -EINVAL for another dev_id,
 * -ENODEV if the device was deleted, -EBUSY if @kdata is attached
 * elsewhere, -ESTALE if it was attached before.
 */
static int hybd_ops_update(void *kdata, void *old_kdata, struct bpf_link *link)
{
	struct hybd_bpf_ops *ops = kdata, *old_ops = old_kdata;
	struct hybd_bpf_prog *p, *old;
	int ret;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (ops->dev_id != old_ops->dev_id)
		return -EINVAL;
	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return -ENOMEM;

	mutex_lock(&hybd_bpf_lock);
	old = hybd_bpf_find(old_ops);
	ret = old ? 0 : -ENODEV;
	if (!ret && ops != old_ops)
		ret = hybd_bpf_ops_usable(ops);
	if (!ret && ops != old_ops) {
		/* the old program's device reference moves to the new one */
		p->ops = ops;
		p->dev = old->dev;
		p->link = link;
		old_ops->flags |= HYBD_BPF_OPS_RETIRED;
		list_del(&old->node);
		hybd_bpf_install(p);
		p = NULL;
	} else {
		old = NULL;
	}
	mutex_unlock(&hybd_bpf_lock);

	kfree(p);
	if (old)
		kfree_rcu(old, rcu);
	return ret;
}

static int hybd_stub_submit(struct hybd_bpf_io *io)
{
	return HYBD_BPF_PASS;
}

static void hybd_stub_complete(struct hybd_bpf_io *io)
{
}

static int hybd_stub_map(struct hybd_bpf_io *io)
{
	return HYBD_BPF_PASS;
}

static struct hybd_bpf_ops hybd_bpf_stubs = {
	.submit		= hybd_stub_submit,
	.complete	= hybd_stub_complete,
	.map		= hybd_stub_map,
};

static struct bpf_struct_ops hybd_bpf_struct_ops = {
	.verifier_ops	= &hybd_verifier_ops,
	.init		= hybd_ops_init,
	.check_member	= hybd_ops_check_member,
	.init_member	= hybd_ops_init_member,
	.validate	= hybd_ops_validate,
	.reg		= hybd_ops_reg,
	.unreg		= hybd_ops_unreg,
	.update		= hybd_ops_update,
	.name		= "hybd_bpf_ops",
	.cfi_stubs	= &hybd_bpf_stubs,
	.owner		= THIS_MODULE,
};

/**
 * hybd_bpf_init() - register the struct_ops type and the kfuncs
 *
 * Return: 0 or -errno; on failure the module works without a fast path.
 */
int hybd_bpf_init(void)
{
	int ret;

	ret = register_btf_kfunc_id_set(BPF_PROG_TYPE_STRUCT_OPS,
					&hybd_kfunc_set);
	if (ret)
		return ret;
	ret = register_bpf_struct_ops(&hybd_bpf_struct_ops, hybd_bpf_ops);
	if (ret)
		return ret;
	/*
	 * Without module BTF the kernel only warns and registers nothing;
	 * our init() callback ran only if the type really exists.
	 */
	return hybd_btf ? 0 : -ENOENT;
}

/**
 * hybd_bpf_dev_gone() - the device is being deleted: drop its program
 * @dev: the device
 *
 * The program's link stays until its owner closes it, attached to nothing;
 * no program can be attached to @dev any more.
 *
 * Context: process context, may sleep.  No submit() or complete() runs for
 * @dev once it returns.
 */
void hybd_bpf_dev_gone(struct hybd_dev *dev)
{
	struct hybd_bpf_prog *p;

	mutex_lock(&hybd_bpf_lock);
	dev->bpf_gone = true;
	p = rcu_dereference_protected(dev->bpf_prog,
				      lockdep_is_held(&hybd_bpf_lock));
	if (p)
		hybd_bpf_uninstall(p);
	mutex_unlock(&hybd_bpf_lock);
	if (p)
		hybd_bpf_prog_release(p);
	else
		synchronize_rcu();
}

void hybd_bpf_fill_info(struct hybd_dev *dev, struct hybd_dev_info *info)
{
	struct hybd_bpf_prog *p;

	mutex_lock(&hybd_bpf_lock);
	p = rcu_dereference_protected(dev->bpf_prog,
				      lockdep_is_held(&hybd_bpf_lock));
	if (p) {
		strscpy(info->bpf_name, p->ops->name, sizeof(info->bpf_name));
		info->bpf_link_id = p->link ? p->link->id : 0;
	}
	info->bpf_attaches = dev->bpf_attaches;
	mutex_unlock(&hybd_bpf_lock);
}

/*
 * The program returned HYBD_BPF_PASS_ZEROES: a write goes to the server as
 * a write-zeroes if the server asked for that (HYBD_DEV_F_ZERO_WRITES,
 * which needs write-zeroes) and takes one that long, else as it is; any
 * other request is outside the contract.
 */
static int hybd_bpf_pass_zeroes(struct hybd_queue *q, struct hybd_tag *t)
{
	const struct hybd_params *p = &q->dev->params;

	if (t->bio.op != HYBD_OP_WRITE) {
		hybd_stat_inc(q, bpf_bad_ret);
		return -EIO;
	}
	if (!(p->basic.flags & HYBD_DEV_F_ZERO_WRITES) ||
	    t->bio.bytes > p->discard.max_write_zeroes_bytes)
		return HYBD_BPF_PASS;
	return HYBD_BPF_PASS_ZEROES;
}

/**
 * hybd_bpf_submit() - run the attached program's submit() on a request
 * @q: the request's queue
 * @t: the request's tag, with t->rq and t->bio set
 *
 * Context: queue_rq, under RCU.
 * Return: HYBD_BPF_PASS when the server must handle the request as it is
 * (also when no program is attached), HYBD_BPF_REMAPPED when a backing
 * target serves it (hybd_remap_start()), HYBD_BPF_PASS_ZEROES when it must
 * get a write as a write-zeroes of the same range (only for a write, on a
 * device that takes it), else a blk_status_t-worthy errno or 0
 * (HYBD_BPF_DONE): the caller ends the request.  A return value outside
 * the contract, and HYBD_BPF_DONE for a read whose payload the program did
 * not fill, are counted and become -EIO.
 */
int hybd_bpf_submit(struct hybd_queue *q, struct hybd_tag *t)
{
	struct hybd_bpf_prog *p = rcu_dereference(q->dev->bpf_prog);
	int ret;

	if (!p) {
		t->bpf_gen = 0;
		return HYBD_BPF_PASS;
	}
	t->bpf_gen = p->gen;
	t->bpf_filled = 0;
	t->bpf_data = false;	/* a read's payload is not the device's yet */
	t->in_submit = true;
	ret = p->ops->submit(&t->bio);
	t->in_submit = false;
	if (ret == HYBD_BPF_REMAPPED && t->remap.target)
		return ret;
	/* a remap the program did not go on with */
	if (t->remap.target)
		hybd_remap_drop(q, t);

	if (ret == HYBD_BPF_DONE) {
		if (t->bio.op == HYBD_OP_READ &&
		    t->bpf_filled < t->bio.bytes) {
			hybd_stat_inc(q, bpf_unfilled);
			return -EIO;
		}
		return ret;
	}
	if (ret == HYBD_BPF_PASS)
		return ret;
	if (ret == HYBD_BPF_PASS_ZEROES)
		return hybd_bpf_pass_zeroes(q, t);
	if (ret < 0 && ret >= -MAX_ERRNO)
		return ret;
	/* what the fast path did wrong (REMAPPED without a remap too): EIO */
	hybd_stat_inc(q, bpf_bad_ret);
	return -EIO;
}

/**
 * hybd_bpf_complete() - run complete() for a request the server, or a
 * remap, finished
 * @q: the request's queue
 * @t: the tag; t->bio.result holds the result, t->bio.path who served it
 *
 * Runs for every slow-path completion while a program is attached, also
 * for requests submitted before it was (io->own tells): a write that was
 * in flight when a cache program arrived must still invalidate it.
 *
 * Context: the server's commit (process context), or a remap's completion
 * (any task, a softirq or the target's hard interrupt), before the request
 * ends.
 */
void hybd_bpf_complete(struct hybd_queue *q, struct hybd_tag *t)
{
	struct hybd_bpf_prog *p;

	rcu_read_lock();
	p = rcu_dereference(q->dev->bpf_prog);
	if (p && p->ops->complete) {
		t->bio.own = t->bpf_gen && t->bpf_gen == p->gen;
		t->bpf_data = !t->bio.result;
		p->ops->complete(&t->bio);
	}
	rcu_read_unlock();
}

/**
 * hybd_bpf_map() - run the attached program's map() on a front's bio
 * @dev: the device
 * @f: the bio, with f->bio set
 *
 * Context: the front's submit_bio, under RCU.
 * Return: HYBD_BPF_REMAPPED with f->target set and remap_srcu held, or
 * HYBD_BPF_PASS (also without a program or a map()); a return value
 * outside map()'s contract passes the bio and counts in bpf_bad_ret.
 */
int hybd_bpf_map(struct hybd_dev *dev, struct hybd_front_io *f)
{
	struct hybd_bpf_prog *p = rcu_dereference(dev->bpf_prog);
	int ret;

	if (!p || !p->ops->map)
		return HYBD_BPF_PASS;
	f->bpf_gen = p->gen;
	f->in_map = true;
	ret = p->ops->map(&f->bio);
	f->in_map = false;
	if (ret == HYBD_BPF_REMAPPED && f->target)
		return ret;
	/* a remap the program did not go on with */
	if (f->target) {
		hybd_front_drop(dev, f);
		srcu_up_read(&dev->remap_srcu, f->srcu_idx);
	}
	if (ret != HYBD_BPF_PASS)
		hybd_stat_inc(f->q, bpf_bad_ret);
	return HYBD_BPF_PASS;
}

/**
 * hybd_bpf_complete_front() - run complete() for a remap map() made
 * @dev: the device
 * @f: the bio; f->bio.result holds its status
 *
 * Context: the target's completion (any context).
 */
void hybd_bpf_complete_front(struct hybd_dev *dev, struct hybd_front_io *f)
{
	struct hybd_bpf_prog *p;

	rcu_read_lock();
	p = rcu_dereference(dev->bpf_prog);
	if (p && p->ops->complete) {
		f->bio.own = f->bpf_gen == p->gen;
		p->ops->complete(&f->bio);
	}
	rcu_read_unlock();
}
