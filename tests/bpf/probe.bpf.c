// SPDX-License-Identifier: GPL-2.0
/*
 * probe: calls the kfuncs that read a request's payload where a read's
 * payload is not (yet, or any more) the device's data, and records what
 * they returned, so that a test can check they refuse.  Every request
 * passes to the server.
 *
 * probe_ret[slot] = { calls, last return value }, for reads only:
 *
 *   0  copy_out() in submit()              1  is_zero() in submit()
 *   2  copy_out() in complete(), result 0  3  is_zero() there
 *   4  copy_out() in complete() after the server failed the read
 *   5  is_zero() there
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

struct probe_val {
	__u64 calls;
	__s64 ret;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 6);
	__type(key, __u32);
	__type(value, struct probe_val);
} probe_ret SEC(".maps");

static __always_inline void probe_record(__u32 slot, int ret)
{
	struct probe_val *v = bpf_map_lookup_elem(&probe_ret, &slot);

	if (!v)
		return;
	__sync_fetch_and_add(&v->calls, 1);
	v->ret = ret;
}

static __always_inline void probe_reads(struct hybd_bpf_io *io, __u32 slot)
{
	__u8 buf[64];

	probe_record(slot, hybd_bpf_io_copy_out(io, 0, buf, sizeof(buf)));
	probe_record(slot + 1, hybd_bpf_io_is_zero(io));
}

int BPF_STRUCT_OPS(probe_submit, struct hybd_bpf_io *io)
{
	if (io->op == HYBD_OP_READ)
		probe_reads(io, 0);
	return HYBD_BPF_PASS;
}

void BPF_STRUCT_OPS(probe_complete, struct hybd_bpf_io *io)
{
	if (io->op == HYBD_OP_READ)
		probe_reads(io, io->result ? 4 : 2);
}

HYBD_OPS_DEFINE(probe_ops,
	.submit   = (void *)probe_submit,
	.complete = (void *)probe_complete,
	.name     = "probe");
