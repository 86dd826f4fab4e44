// SPDX-License-Identifier: GPL-2.0
/*
 * frontbad: map() on a device with a bio-based front, misused one way per
 * 4 KiB block of a read (block % 8 picks the case); what each kfunc
 * answers is kept in a global for the test to compare:
 *
 *   0  returns 12345                                 passed, bpf_bad_ret
 *   1  the payload kfuncs (zero, copy_in, copy_out,  -EINVAL each; then a
 *      is_zero) on a bio                             good remap, PASS:
 *                                                    dropped, passed
 *   2  a good remap, REMAPPED                        cloned in the front
 *   3  REMAPPED without a remap                      passed, bpf_bad_ret
 *   4  a second remap of the same bio                -EALREADY; the first
 *                                                    stands: cloned
 *   5  an index no target is registered at           -ENOENT, passed
 *   6  an offset past the target's end               -ERANGE, passed
 *   7  PASS                                          passed
 *
 * Writes are remapped to target 0 (read-only in the test: -EROFS) and
 * passed.  submit() passes everything and counts the reads that reach
 * it, per case (subN); complete() counts the front's remaps and tries a remap (-EPERM).
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define BLK	4096

__s64 got_zero, got_copy_in, got_copy_out, got_is_zero, got4_first, got4;
__s64 got5, got6, got_write, got_complete;
__u64 sub0, sub1, sub2, sub3, sub4, sub5, sub6, sub7;
__u64 front_completes, front_tag_seen;

int BPF_STRUCT_OPS(frontbad_map, struct hybd_bpf_io *io)
{
	__u64 off = io->sector * 512;
	char buf[16] = {};

	if (io->tag == HYBD_BPF_TAG_FRONT)
		front_tag_seen = 1;
	if (io->op == HYBD_OP_WRITE) {
		got_write = hybd_bpf_io_remap(io, 0, off);
		return HYBD_BPF_PASS;
	}
	switch ((off / BLK) % 8) {
	case 0:
		return 12345;
	case 1:
		got_zero = hybd_bpf_io_zero(io);
		got_copy_in = hybd_bpf_io_copy_in(io, 0, buf, sizeof(buf));
		got_copy_out = hybd_bpf_io_copy_out(io, 0, buf, sizeof(buf));
		got_is_zero = hybd_bpf_io_is_zero(io);
		hybd_bpf_io_remap(io, 0, off);
		return HYBD_BPF_PASS;
	case 2:
		if (hybd_bpf_io_remap(io, 0, off))
			return HYBD_BPF_PASS;
		return HYBD_BPF_REMAPPED;
	case 3:
		return HYBD_BPF_REMAPPED;
	case 4:
		got4_first = hybd_bpf_io_remap(io, 0, off);
		got4 = hybd_bpf_io_remap(io, 0, off);
		return HYBD_BPF_REMAPPED;
	case 5:
		got5 = hybd_bpf_io_remap(io, 7, off);
		return HYBD_BPF_PASS;
	case 6:
		got6 = hybd_bpf_io_remap(io, 0, 1ULL << 50);
		return HYBD_BPF_PASS;
	default:
		return HYBD_BPF_PASS;
	}
}

int BPF_STRUCT_OPS(frontbad_submit, struct hybd_bpf_io *io)
{
	__u64 *n;

	if (io->op != HYBD_OP_READ)
		return HYBD_BPF_PASS;
	switch ((io->sector * 512 / BLK) % 8) {
	case 0: n = &sub0; break;
	case 1: n = &sub1; break;
	case 2: n = &sub2; break;
	case 3: n = &sub3; break;
	case 4: n = &sub4; break;
	case 5: n = &sub5; break;
	case 6: n = &sub6; break;
	default: n = &sub7; break;
	}
	__sync_fetch_and_add(n, 1);
	return HYBD_BPF_PASS;
}

void BPF_STRUCT_OPS(frontbad_complete, struct hybd_bpf_io *io)
{
	if (io->tag != HYBD_BPF_TAG_FRONT)
		return;
	if (io->path == HYBD_BPF_PATH_REMAP && io->own)
		__sync_fetch_and_add(&front_completes, 1);
	got_complete = hybd_bpf_io_remap(io, 0, 0);
}

HYBD_OPS_DEFINE(frontbad_ops,
	.submit		= (void *)frontbad_submit,
	.complete	= (void *)frontbad_complete,
	.map		= (void *)frontbad_map,
	.name		= "frontbad");
