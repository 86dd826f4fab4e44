// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * loop: a whole loop device in BPF.  Every request is remapped to the
 * same byte offset on backing target 0, which the server registered
 * (hybd-loop --remap FILE): the kernel reads and writes the file with
 * direct I/O on the request's own pages, flushes with fdatasync, and
 * punches holes for discards, as the kernel loop device does.  The server
 * only sets the device up, and serves what the kernel refuses (nothing,
 * while the target is registered) and everything while no program is
 * attached.
 *
 * On a device with a bio-based front (hybd-loop --front), map() remaps
 * each read and write bio there, before it becomes a request; it counts
 * nothing, since what it passes (or the kernel passes for it) reaches
 * submit() too.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define LOOP_TARGET	0

/* Counters in loop.bss: `hybdctl stats DEV --maps` shows them. */
__u64 remapped;		/* requests handed to the backing target */
__u64 passed;		/* refused by the kernel: the server serves them */
__u64 remap_errors;	/* remapped requests that completed with an error */
__u64 mapped;		/* bios map() remapped in the front, as they end */

int BPF_STRUCT_OPS(loop_submit, struct hybd_bpf_io *io)
{
	if (!hybd_bpf_io_remap(io, LOOP_TARGET, io->sector * 512)) {
		hybd_atomic_fetch_add(&remapped, 1);
		return HYBD_BPF_REMAPPED;
	}
	hybd_atomic_fetch_add(&passed, 1);
	return HYBD_BPF_PASS;
}

int BPF_STRUCT_OPS(loop_map, struct hybd_bpf_io *io)
{
	if (!hybd_bpf_io_remap(io, LOOP_TARGET, io->sector * 512))
		return HYBD_BPF_REMAPPED;
	return HYBD_BPF_PASS;
}

void BPF_STRUCT_OPS(loop_complete, struct hybd_bpf_io *io)
{
	if (io->tag == HYBD_BPF_TAG_FRONT)
		hybd_atomic_fetch_add(&mapped, 1);
	if (io->path == HYBD_BPF_PATH_REMAP && io->result)
		hybd_atomic_fetch_add(&remap_errors, 1);
}

HYBD_OPS_DEFINE(loop_ops,
	.submit		= (void *)loop_submit,
	.complete	= (void *)loop_complete,
	.map		= (void *)loop_map,
	.name		= "loop");
