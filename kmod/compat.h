/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hybd - the one place where the kernels hybd supports differ.
 *
 * What each kernel offers is tested when the module is built, by compiling
 * against its headers (conftest.sh, run by Kbuild, writes compat-gen.h),
 * not read from its version number: a distribution kernel that backports
 * an API gets the right branch.  The rest of the module calls the helpers
 * below and never tests a version itself.
 *
 * The floor is Linux 6.12, the first LTS with everything the design needs
 * (conftest.sh refuses an older kernel, naming what it lacks):
 *   - struct_ops defined by a module, register_bpf_struct_ops() (6.9), with
 *     kfunc sets filtered per program (6.9): the fast path;
 *   - queue_limits set atomically, with the features in them (6.11): every
 *     device's limits, and online resize;
 *   - block devices opened as files, bdev_file_open_by_dev() (6.9): backing
 *     targets.
 */
#ifndef _HYBD_COMPAT_H
#define _HYBD_COMPAT_H

#include <linux/blk-mq.h>
#include <linux/btf.h>
#include <linux/bvec.h>
#include <linux/workqueue.h>

#include "compat-gen.h"

/*
 * Merging: a flag to ask for until Linux 6.14, the default after (the
 * flag is gone).
 */
#ifdef HYBD_HAVE_BLK_MQ_F_SHOULD_MERGE
#define HYBD_MQ_F_MERGE		BLK_MQ_F_SHOULD_MERGE
#else
#define HYBD_MQ_F_MERGE		0
#endif

/*
 * End a freeze begun with blk_freeze_queue_start().  From Linux 6.14
 * blk_mq_freeze_queue() saves the task's memalloc flags for
 * blk_mq_unfreeze_queue() to restore; a freeze started by hand saved
 * none, and ends with the _nomemrestore variant.  (Both release what
 * lockdep took as the freeze's lock, which 6.12.117 already has.)
 */
static inline void hybd_unfreeze_queue(struct request_queue *q)
{
#ifdef HYBD_HAVE_UNFREEZE_NOMEMRESTORE
	blk_mq_unfreeze_queue_nomemrestore(q);
#else
	blk_mq_unfreeze_queue(q);
#endif
}

/* Bytes of the current bio_vec already done (renamed bi_offset in 7.x). */
static inline unsigned int hybd_bvec_iter_offset(const struct bvec_iter *it)
{
#ifdef HYBD_HAVE_BVEC_ITER_BVEC_DONE
	return it->bi_bvec_done;
#else
	return it->bi_offset;
#endif
}

/*
 * A workqueue bound to CPUs says so with WQ_PERCPU where the kernel has
 * the flag (6.17, and 6.12.y from a backport: 6.12.117 has it), before
 * unbound becomes the default; 7.x warns about a workqueue that says
 * neither.  Without the flag, bound is the default.
 */
#ifdef HYBD_HAVE_WQ_PERCPU
#define HYBD_WQ_PERCPU		WQ_PERCPU
#else
#define HYBD_WQ_PERCPU		0
#endif

/*
 * kfuncs taking only trusted pointers: a flag to ask for until the
 * verifier made it the default for every kfunc (the flag is gone in 7.x,
 * where a kfunc's pointer arguments are trusted unless marked otherwise).
 */
#ifndef KF_TRUSTED_ARGS
#define KF_TRUSTED_ARGS		0
#endif

#endif /* _HYBD_COMPAT_H */
