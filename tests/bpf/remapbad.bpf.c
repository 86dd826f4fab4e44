// SPDX-License-Identifier: GPL-2.0
/*
 * remapbad: every misuse of hybd_bpf_io_remap(), one per 4 KiB block of a
 * read (block % 8 picks the case), each answer kept in a global for the
 * test to compare with the errno it must be:
 *
 *   0  an index no target is registered at            -ENOENT
 *   1  an offset past the target's end                -ERANGE
 *   2  an offset the target's direct I/O cannot take  -EINVAL
 *   3  index HYBD_MAX_BACKINGS                        -EINVAL
 *   4  a second remap of the same request             -EALREADY (the
 *      first one succeeded: the program then passes, which drops it)
 *   5  a good remap, returned REMAPPED                0 (served there)
 *   6  REMAPPED returned without a remap              outside the
 *      contract: EIO, bpf_bad_ret
 *   7  a good remap, then -ENODATA returned           the remap dropped,
 *      the read fails with ENODATA
 *
 * Writes are remapped to target 0, which the test registers read-only
 * (-EROFS), then passed; complete() tries a remap too (-EPERM).  Every
 * refused request is passed, so the server serves it.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define BLK	4096

__s64 got0, got1, got2, got3, got4, got4_first, got5, got7, got_write;
__s64 got_complete;
__u64 remapped_reads, completes_remap, completes_slow;

int BPF_STRUCT_OPS(remapbad_submit, struct hybd_bpf_io *io)
{
	__u64 off = io->sector * 512;
	int ret;

	if (io->op == HYBD_OP_WRITE) {
		got_write = hybd_bpf_io_remap(io, 0, off);
		return HYBD_BPF_PASS;
	}
	if (io->op != HYBD_OP_READ)
		return HYBD_BPF_PASS;

	switch ((off / BLK) % 8) {
	case 0:
		got0 = hybd_bpf_io_remap(io, 7, off);
		return HYBD_BPF_PASS;
	case 1:
		got1 = hybd_bpf_io_remap(io, 0, 1ULL << 50);
		return HYBD_BPF_PASS;
	case 2:
		got2 = hybd_bpf_io_remap(io, 0, off + 1);
		return HYBD_BPF_PASS;
	case 3:
		got3 = hybd_bpf_io_remap(io, HYBD_MAX_BACKINGS, off);
		return HYBD_BPF_PASS;
	case 4:
		got4_first = hybd_bpf_io_remap(io, 0, off);
		got4 = hybd_bpf_io_remap(io, 0, off);
		return HYBD_BPF_PASS;
	case 5:
		ret = hybd_bpf_io_remap(io, 0, off);
		got5 = ret;
		if (ret)
			return HYBD_BPF_PASS;
		__sync_fetch_and_add(&remapped_reads, 1);
		return HYBD_BPF_REMAPPED;
	case 6:
		return HYBD_BPF_REMAPPED;
	default:
		got7 = hybd_bpf_io_remap(io, 0, off);
		return -ENODATA;
	}
}

void BPF_STRUCT_OPS(remapbad_complete, struct hybd_bpf_io *io)
{
	if (io->path == HYBD_BPF_PATH_REMAP)
		__sync_fetch_and_add(&completes_remap, 1);
	else
		__sync_fetch_and_add(&completes_slow, 1);
	got_complete = hybd_bpf_io_remap(io, 0, 0);
}

HYBD_OPS_DEFINE(remapbad_ops,
	.submit		= (void *)remapbad_submit,
	.complete	= (void *)remapbad_complete,
	.name		= "remapbad");
