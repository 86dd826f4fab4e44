// SPDX-License-Identifier: GPL-2.0
/*
 * passzeroes: submit() returns HYBD_BPF_PASS_ZEROES for a write whose
 * payload hybd_bpf_io_is_zero() finds all zero, and HYBD_BPF_PASS for
 * everything else, so that the server gets zero writes as write-zeroes.
 *
 * It marks the writes it sends that way (io->scratch) and counts, in
 * complete(), how its marked requests come back: as the writes they are,
 * with result 0 (zeroes_done), or otherwise (zeroes_odd, which must stay 0:
 * the program's view of a request never changes).
 *
 *   -DZERO_READS     also returns PASS_ZEROES for every read: outside the
 *                    contract, the kernel must fail those with EIO
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define ZEROES_MARK	0x5a45524fULL	/* "ZERO" */

__u64 zeroes_passed;	/* writes submit() returned PASS_ZEROES for */
__u64 zeroes_done;	/* ...that complete() saw as writes, result 0 */
__u64 zeroes_odd;	/* ...that complete() saw any other way */

int BPF_STRUCT_OPS(passzeroes_submit, struct hybd_bpf_io *io)
{
#ifdef ZERO_READS
	if (io->op == HYBD_OP_READ)
		return HYBD_BPF_PASS_ZEROES;
#endif
	if (io->op == HYBD_OP_WRITE && hybd_bpf_io_is_zero(io) == 1) {
		io->scratch = ZEROES_MARK;
		hybd_atomic_fetch_add(&zeroes_passed, 1);
		return HYBD_BPF_PASS_ZEROES;
	}
	return HYBD_BPF_PASS;
}

void BPF_STRUCT_OPS(passzeroes_complete, struct hybd_bpf_io *io)
{
	if (!io->own || io->scratch != ZEROES_MARK)
		return;
	if (io->op == HYBD_OP_WRITE && !io->result)
		hybd_atomic_fetch_add(&zeroes_done, 1);
	else
		hybd_atomic_fetch_add(&zeroes_odd, 1);
}

HYBD_OPS_DEFINE(passzeroes_ops,
	.submit   = (void *)passzeroes_submit,
	.complete = (void *)passzeroes_complete,
	.name     = "passzeroes");
