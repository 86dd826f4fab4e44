// SPDX-License-Identifier: GPL-2.0
/*
 * flushverdict: remaps reads and writes onto target 0 at the same offset
 * (as bpf/loop.bpf.o does), and answers a flush with FLUSH_VERDICT
 * instead of remapping it: whatever the verdict, the kernel must sync the
 * target the writes went to before the flush completes.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#ifndef FLUSH_VERDICT
#error "build with -DFLUSH_VERDICT=HYBD_BPF_PASS, HYBD_BPF_DONE or -E..."
#endif

int BPF_STRUCT_OPS(flushverdict_submit, struct hybd_bpf_io *io)
{
	if (io->op == HYBD_OP_FLUSH)
		return FLUSH_VERDICT;
	if (!hybd_bpf_io_remap(io, 0, io->sector * 512))
		return HYBD_BPF_REMAPPED;
	return HYBD_BPF_PASS;
}

HYBD_OPS_DEFINE(flushverdict_ops,
	.submit = (void *)flushverdict_submit,
	.name   = "flushverdict");
