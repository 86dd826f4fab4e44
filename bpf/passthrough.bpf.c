// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * passthrough: every request goes to the slow path.  It measures what the
 * hook itself costs.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

int BPF_STRUCT_OPS(passthrough_submit, struct hybd_bpf_io *io)
{
	return HYBD_BPF_PASS;
}

HYBD_OPS_DEFINE(passthrough_ops,
	.submit = (void *)passthrough_submit,
	.name   = "passthrough");
