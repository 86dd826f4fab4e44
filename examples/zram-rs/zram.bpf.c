// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * zram: the fast path of examples/zram-rs, a compressed RAM disk whose
 * slow path (src/main.rs, Rust) compresses and decompresses in user
 * space.  A read of blocks that all read as zeros (never written,
 * discarded, or written with zeros) completes here: bit b of zram_zeros
 * says so for 4 KiB block b, and the slow path's store keeps the bits
 * exact (src/store.rs: cleared under the block's lock before data is
 * stored there, set after it became zeros).  Everything else, writes
 * included, goes to the slow path.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* The largest read served here: 1 MiB, the largest request split. */
#define ZRAM_MAX_BLOCKS	256

/* An interface with src/main.rs: keep the name and shape. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1U << 22);		/* 1 TiB of blocks */
	__type(key, __u32);
	__type(value, __u64);
} zram_zeros SEC(".maps") HYBD_BLOCK_BITMAP;

/* in "zram.bss": `hybdctl stats DEV --maps` */
__u64 zero_reads;	/* reads completed here, as zeros */
__u64 passed_reads;	/* reads that need the slow path */

int BPF_STRUCT_OPS(zram_submit, struct hybd_bpf_io *io)
{
	__u64 first, count, i;

	if (io->op != HYBD_OP_READ)
		return HYBD_BPF_PASS;
	hybd_io_blocks(io, &first, &count);
	for (i = 0; i < ZRAM_MAX_BLOCKS && i < count; i++)
		if (hybd_bitmap_test(&zram_zeros, first + i) != 1)
			break;
	if (count && i == count && !hybd_bpf_io_zero(io)) {
		hybd_atomic_fetch_add(&zero_reads, 1);
		return HYBD_BPF_DONE;
	}
	hybd_atomic_fetch_add(&passed_reads, 1);
	return HYBD_BPF_PASS;
}

HYBD_OPS_DEFINE(zram_ops,
	.submit = (void *)zram_submit,
	.name   = "zram");
