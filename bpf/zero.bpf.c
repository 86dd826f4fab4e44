// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * zero: reads of blocks known to hold zeros complete in the kernel.
 *
 * A block becomes known-zero when the slow path returns zeros for it (the
 * first read of a never-written block teaches it), or when the driver
 * seeds zero_known through the shared map; any write, discard or
 * write-zeroes overlapping it makes it unknown again.  known is stored as
 * "version + 1 at which the block was zero", so a stale mark can never be
 * served after a write.
 */
#include "hybd_versions.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define ZERO_MAX_BLOCKS	256	/* 1 MiB: the largest read served here */

/* one stamp per block, for devices up to 4 GiB; beyond, blocks are
 * never known to be zero
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1U << 20);
	__type(key, __u32);
	__type(value, __u64);
} zero_known SEC(".maps") HYBD_PER_BLOCK;

/*
 * Counters: global variables, which libbpf keeps in the object's .bss map
 * ("zero.bss"); `hybdctl stats DEV --maps` shows them by name.
 */
__u64 reads_served;	/* reads completed with zeros in the kernel */
__u64 reads_passed;	/* reads looked up and passed to the slow path */
__u64 blocks_learned;	/* blocks a slow-path read showed to be zero */

static __always_inline bool zero_block_known(__u64 blk)
{
	__u32 key = blk;
	__u64 *known;

	if (blk > 0xffffffffULL)
		return false;
	known = bpf_map_lookup_elem(&zero_known, &key);
	return known && *known && *known == hybd_ver_stamp(blk);
}

int BPF_STRUCT_OPS(zero_submit, struct hybd_bpf_io *io)
{
	__u64 first, count, blk, i;

	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		return HYBD_BPF_PASS;
	}
	if (io->op != HYBD_OP_READ || io->bytes % HYBD_BLOCK_SIZE ||
	    io->sector % HYBD_SECTORS_PER_BLOCK)
		return HYBD_BPF_PASS;

	hybd_io_blocks(io, &first, &count);
	if (count > ZERO_MAX_BLOCKS)
		return HYBD_BPF_PASS;
	for (i = 0; i < ZERO_MAX_BLOCKS && i < count; i++)
		if (!zero_block_known(first + i))
			goto miss;
	if (hybd_bpf_io_zero(io))
		goto pass;
	hybd_atomic_fetch_add(&reads_served, 1);
	return HYBD_BPF_DONE;
miss:
	if (hybd_io_one_block(io, &blk))
		io->scratch = hybd_ver_stamp(blk);
pass:
	hybd_atomic_fetch_add(&reads_passed, 1);
	return HYBD_BPF_PASS;
}

void BPF_STRUCT_OPS(zero_complete, struct hybd_bpf_io *io)
{
	__u64 blk, stamp;
	__u32 key;

	if (hybd_io_changes_data(io)) {
		hybd_ver_bump(io);
		return;
	}
	if (!io->own || io->result || !hybd_io_one_block(io, &blk))
		return;
	if (!hybd_ver_unchanged(blk, io->scratch))
		return;
	if (hybd_bpf_io_is_zero(io) != 1)
		return;
	/* map helpers take BPF memory, not the context: copy the stamp */
	stamp = io->scratch;
	key = blk;
	if (!bpf_map_update_elem(&zero_known, &key, &stamp, BPF_ANY))
		hybd_atomic_fetch_add(&blocks_learned, 1);
}

HYBD_OPS_DEFINE(zero_ops,
	.submit   = (void *)zero_submit,
	.complete = (void *)zero_complete,
	.name     = "zero");
