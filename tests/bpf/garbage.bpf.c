// SPDX-License-Identifier: GPL-2.0
/*
 * garbage: submit() returns GARBAGE_RET for reads, a value outside the
 * contract (neither DONE, PASS, PASS_ZEROES nor -1..-4095), and passes
 * everything else.  The kernel must count it in bpf_bad_ret and fail the read with
 * EIO, and writes must keep working.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#ifndef GARBAGE_RET
#define GARBAGE_RET	12345
#endif

int BPF_STRUCT_OPS(garbage_submit, struct hybd_bpf_io *io)
{
	if (io->op == HYBD_OP_READ)
		return GARBAGE_RET;
	return HYBD_BPF_PASS;
}

HYBD_OPS_DEFINE(garbage_ops,
	.submit = (void *)garbage_submit,
	.name   = "garbage");
