// SPDX-License-Identifier: GPL-2.0
/*
 * tcpca_kfunc: a struct_ops of another kind (a TCP congestion control,
 * struct tcp_congestion_ops) whose ssthresh() calls hybd_bpf_io_zero().
 * hybd's kfuncs belong to struct hybd_bpf_ops programs only: the verifier
 * must refuse this one for the call itself.  Built with -DNO_KFUNC it makes
 * no call and must load: the test's control that the object is otherwise
 * fine.  Only loaded, never attached.
 */
#include "hybd.bpf.h"

char LICENSE[] SEC("license") = "GPL";

struct sock;

/* the members this program sets; libbpf matches them by name */
struct tcp_congestion_ops {
	__u32 (*ssthresh)(struct sock *sk);
	void (*cong_avoid)(struct sock *sk, __u32 ack, __u32 acked);
	__u32 (*undo_cwnd)(struct sock *sk);
	char name[16];
};

SEC("struct_ops/tcpca_ssthresh")
__u32 BPF_PROG(tcpca_ssthresh, struct sock *sk)
{
#ifndef NO_KFUNC
	hybd_bpf_io_zero((struct hybd_bpf_io *)sk);
#endif
	return 2;
}

SEC("struct_ops/tcpca_cong_avoid")
void BPF_PROG(tcpca_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
}

SEC("struct_ops/tcpca_undo_cwnd")
__u32 BPF_PROG(tcpca_undo_cwnd, struct sock *sk)
{
	return 2;
}

SEC(".struct_ops.link")
struct tcp_congestion_ops tcpca_kfunc = {
	.ssthresh   = (void *)tcpca_ssthresh,
	.cong_avoid = (void *)tcpca_cong_avoid,
	.undo_cwnd  = (void *)tcpca_undo_cwnd,
	.name       = "hybd_kfunc_test",
};
