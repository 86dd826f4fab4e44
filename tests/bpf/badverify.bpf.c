// SPDX-License-Identifier: GPL-2.0
/*
 * badverify: programs the verifier must refuse, so that `hybdctl attach`
 * is seen to fail with the verifier's reason and to attach nothing.
 *
 * By default submit() writes io->op, which the module's
 * btf_struct_access refuses (only io->scratch is writable).  With
 * -DBAD_MAP_READ it reads the word after an 8-byte map value instead;
 * with -DFORGED_IO it passes hybd_bpf_io_remap() an io of its own making,
 * on its stack, which would have the kernel trust what the program wrote.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#ifdef BAD_MAP_READ
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} badverify_word SEC(".maps");

int BPF_STRUCT_OPS(badverify_submit, struct hybd_bpf_io *io)
{
	__u32 key = 0;
	__u64 *v = bpf_map_lookup_elem(&badverify_word, &key);

	/* v[1] is past the end of the value */
	if (v)
		io->scratch = v[1];
	return HYBD_BPF_PASS;
}
#elif defined(FORGED_IO)
int BPF_STRUCT_OPS(badverify_submit, struct hybd_bpf_io *io)
{
	struct hybd_bpf_io forged = {
		.op = HYBD_OP_READ, .bytes = 4096, .tag = HYBD_BPF_TAG_FRONT,
	};

	if (!hybd_bpf_io_remap(&forged, 0, 0))
		return HYBD_BPF_REMAPPED;
	return HYBD_BPF_PASS;
}
#else
int BPF_STRUCT_OPS(badverify_submit, struct hybd_bpf_io *io)
{
	io->op = HYBD_OP_WRITE;
	return HYBD_BPF_PASS;
}
#endif

HYBD_OPS_DEFINE(badverify_ops,
	.submit = (void *)badverify_submit,
	.name   = "badverify");
