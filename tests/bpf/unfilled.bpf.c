// SPDX-License-Identifier: GPL-2.0
/*
 * unfilled: submit() completes 4 KiB reads as DONE having filled only part
 * of the payload, or nothing, so that the kernel must fail them with EIO
 * (and count them in bpf_unfilled) rather than hand the reader whatever
 * the pages held.  Other requests pass.
 *
 *   (default)        DONE without filling anything
 *   -DFILL=HALF      the first 2 KiB, then DONE
 *   -DFILL=GAP       only the last 2 KiB, then DONE
 *   -DFILL=HALVES    the first 2 KiB, then the second: all of it (DONE works)
 *
 * What it copies in is FILL_BYTE everywhere.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define NONE	0
#define HALF	1
#define GAP	2
#define HALVES	3

#ifndef FILL
#define FILL	NONE
#endif

#define HALF_BYTES	(HYBD_BLOCK_SIZE / 2)
#define FILL_BYTE	0xa5

static __u8 fill_src[HALF_BYTES] = { [0 ... HALF_BYTES - 1] = FILL_BYTE };

int BPF_STRUCT_OPS(unfilled_submit, struct hybd_bpf_io *io)
{
	if (io->op != HYBD_OP_READ || io->bytes != HYBD_BLOCK_SIZE)
		return HYBD_BPF_PASS;
	if (FILL == HALF || FILL == HALVES)
		hybd_bpf_io_copy_in(io, 0, fill_src, sizeof(fill_src));
	if (FILL == GAP || FILL == HALVES)
		hybd_bpf_io_copy_in(io, HALF_BYTES, fill_src, sizeof(fill_src));
	return HYBD_BPF_DONE;
}

HYBD_OPS_DEFINE(unfilled_ops,
	.submit = (void *)unfilled_submit,
	.name   = "unfilled");
