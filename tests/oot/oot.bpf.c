// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * oot.bpf.c - a fast path as a user would build it outside hybd's tree:
 * reads of blocks never written are zeros (the driver's memory starts
 * so); everything else goes to the slow path.  Counts what it served.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

__u64 zero_reads;

int BPF_STRUCT_OPS(oot_submit, struct hybd_bpf_io *io)
{
	/* the last 4 MiB of a 16 MiB disk are never written by the test */
	if (io->op == HYBD_OP_READ && io->sector >= (12ULL << 20) >> 9 &&
	    !hybd_bpf_io_zero(io)) {
		hybd_atomic_fetch_add(&zero_reads, 1);
		return HYBD_BPF_DONE;
	}
	return HYBD_BPF_PASS;
}

HYBD_OPS_DEFINE(oot_ops,
	.submit = (void *)oot_submit,
	.name   = "oot");
