// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * cacheplain.bpf.c - a cache map shaped as bpf/cache.bpf.c's (cache_slots:
 * hybd_cache.bpf.h's slots), but without hybd_versions: complete() stores
 * every one-block read stamped 1, and nothing ever drops it.  For the test
 * that an atomic replace by bpf/cache.bpf.o does not carry such a cache
 * over without the versions its stamps were taken from: the new versions
 * start at 0, whose stamp is 1, and the stale data would be served.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* struct hybd_cache_slot's layout, without hybd_cache.bpf.h's versions */
struct plain_slot {
	__u64 seq;
	__u64 blk;
	__u64 stamp;
	__u8 data[HYBD_BLOCK_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8192);	/* cache.bpf.c's CACHE_SLOTS */
	__type(key, __u32);
	__type(value, struct plain_slot);
} cache_slots SEC(".maps");

int BPF_STRUCT_OPS(cacheplain_submit, struct hybd_bpf_io *io)
{
	return HYBD_BPF_PASS;
}

void BPF_STRUCT_OPS(cacheplain_complete, struct hybd_bpf_io *io)
{
	__u64 blk = io->sector >> 3;
	struct plain_slot *s;
	__u32 key = blk % 8192;

	if (io->op != HYBD_OP_READ || io->result ||
	    io->bytes != HYBD_BLOCK_SIZE || io->sector & 7)
		return;
	s = bpf_map_lookup_elem(&cache_slots, &key);
	if (!s || hybd_bpf_io_copy_out(io, 0, s->data, sizeof(s->data)))
		return;
	s->stamp = 1;
	s->blk = blk + 1;
}

HYBD_OPS_DEFINE(cacheplain_ops,
	.submit   = (void *)cacheplain_submit,
	.complete = (void *)cacheplain_complete,
	.name     = "cacheplain");
