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
 * each read and write bio there, before it becomes a request.
 *
 * There is no complete(): each member a program defines runs on every
 * I/O, and this one would have nothing to do there.  The kernel counts
 * what it remapped, in the front and as requests, and the errors
 * (`hybdctl stats`: remapped, remap_front, remap_refused, fast_errors).
 * Built with -DLOOP_COUNT (loop-count.bpf.o, the tests'), it also counts
 * in its .bss, from submit() and complete().
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define LOOP_TARGET	0

#ifdef LOOP_COUNT
/* `hybdctl stats DEV --maps` shows them */
__u64 remapped;		/* requests handed to the backing target */
__u64 passed;		/* refused by the kernel: the server serves them */
__u64 remap_errors;	/* remapped requests and bios that ended in error */
__u64 mapped;		/* bios map() remapped in the front, as they end */
__u64 again;		/* front bios the target could not take at once */
#define LOOP_INC(counter)	hybd_atomic_fetch_add(&(counter), 1)
#else
#define LOOP_INC(counter)	do { } while (0)
#endif

int BPF_STRUCT_OPS(loop_submit, struct hybd_bpf_io *io)
{
	if (!hybd_bpf_io_remap(io, LOOP_TARGET, io->sector * 512)) {
		LOOP_INC(remapped);
		return HYBD_BPF_REMAPPED;
	}
	LOOP_INC(passed);
	return HYBD_BPF_PASS;
}

int BPF_STRUCT_OPS(loop_map, struct hybd_bpf_io *io)
{
	if (!hybd_bpf_io_remap(io, LOOP_TARGET, io->sector * 512))
		return HYBD_BPF_REMAPPED;
	return HYBD_BPF_PASS;
}

#ifdef LOOP_COUNT
void BPF_STRUCT_OPS(loop_complete, struct hybd_bpf_io *io)
{
	/* a REQ_NOWAIT bio, not started: its submitter starts it again */
	if (io->result == -EAGAIN) {
		LOOP_INC(again);
		return;
	}
	if (io->tag == HYBD_BPF_TAG_FRONT)
		LOOP_INC(mapped);
	if (io->path == HYBD_BPF_PATH_REMAP && io->result)
		LOOP_INC(remap_errors);
}
#define LOOP_COMPLETE	.complete = (void *)loop_complete,
#else
#define LOOP_COMPLETE
#endif

HYBD_OPS_DEFINE(loop_ops,
	.submit		= (void *)loop_submit,
	.map		= (void *)loop_map,
	LOOP_COMPLETE
	.name		= "loop");
