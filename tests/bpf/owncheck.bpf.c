// SPDX-License-Identifier: GPL-2.0
/*
 * owncheck: OWN_MAPS struct hybd_bpf_ops maps (own0, own1, ...) in one
 * object, so that a test can attach and replace many times with one load.
 * Each map's submit() stamps io->scratch with its own mark and passes the
 * request; its complete() checks that io->own says exactly whether the
 * mark is its own:
 *
 *   own_stats[0]  own, the mark is ours                     (right)
 *   own_stats[1]  not own, the mark is not ours             (right)
 *   own_stats[2]  own, but another program's mark (or none) (WRONG: a
 *                 program would trust scratch it never wrote)
 *   own_stats[3]  not own, but our mark                     (WRONG)
 *
 * A map is attached at most once in a test, so "our mark" means that this
 * attachment's submit() passed the request.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define OWN_MARK	0x6f776e0000000000ULL	/* "own" */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} own_stats SEC(".maps");

static __always_inline void own_count(__u32 what)
{
	__u64 *n = bpf_map_lookup_elem(&own_stats, &what);

	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline void own_check(const struct hybd_bpf_io *io,
				      __u64 mark)
{
	bool mine = io->scratch == mark;

	if (io->own)
		own_count(mine ? 0 : 2);
	else
		own_count(mine ? 3 : 1);
}

#define OWN_OPS(i)							\
int BPF_STRUCT_OPS(own##i##_submit, struct hybd_bpf_io *io)		\
{									\
	io->scratch = OWN_MARK + i;					\
	return HYBD_BPF_PASS;						\
}									\
									\
void BPF_STRUCT_OPS(own##i##_complete, struct hybd_bpf_io *io)		\
{									\
	own_check(io, OWN_MARK + i);					\
}									\
									\
HYBD_OPS_DEFINE(own##i,							\
	.submit   = (void *)own##i##_submit,				\
	.complete = (void *)own##i##_complete,				\
	.name     = "own" #i)

OWN_OPS(0);
OWN_OPS(1);
OWN_OPS(2);
OWN_OPS(3);
OWN_OPS(4);
OWN_OPS(5);
OWN_OPS(6);
OWN_OPS(7);
OWN_OPS(8);
OWN_OPS(9);
OWN_OPS(10);
OWN_OPS(11);
OWN_OPS(12);
OWN_OPS(13);
OWN_OPS(14);
OWN_OPS(15);
