// SPDX-License-Identifier: GPL-2.0
/*
 * failop: submit() fails every request of one kind (FAIL_OP) with a valid
 * errno (-FAIL_ERRNO) and passes the others.  The block layer turns the
 * errno into a status (errno_to_blk_status) and back into what the caller
 * sees (blk_status_to_errno): ENOSPC survives, one it has no status for
 * becomes EIO.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#if !defined(FAIL_OP) || !defined(FAIL_ERRNO)
#error "build with -DFAIL_OP=HYBD_OP_... -DFAIL_ERRNO=E..."
#endif

int BPF_STRUCT_OPS(failop_submit, struct hybd_bpf_io *io)
{
	if (io->op == FAIL_OP)
		return -(FAIL_ERRNO);
	return HYBD_BPF_PASS;
}

HYBD_OPS_DEFINE(failop_ops,
	.submit = (void *)failop_submit,
	.name   = "failop");
