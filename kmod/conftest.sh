#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# conftest.sh - what the kernel being built against offers, tested by
# compiling against its headers (as OpenZFS's configure and many DKMS
# modules do), so that a backport that moves an API between versions is
# followed without a version number in the code.
#
#   conftest.sh OUT RELEASE CC [CFLAGS...]
#
# Kbuild runs it with the kernel's own compiler and flags (kmod/Kbuild);
# it writes OUT, a header of HYBD_HAVE_* defines that kmod/compat.h reads,
# and fails, naming the feature, if the kernel lacks one hybd needs.  Each
# test is a small C file compiled with -fsyntax-only: it compiles if the
# kernel has the feature.
set -u

out=$1 release=$2
shift 2
dir=$(mktemp -d "${TMPDIR:-/tmp}/hybd-conftest.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
defs=$dir/defs.h
: >"$defs"

# compiles NAME CC [CFLAGS...]: true if the C on stdin compiles
compiles() {
	name=$1
	shift
	cat >"$dir/$name.c"
	"$@" -fsyntax-only "$dir/$name.c" >"$dir/$name.log" 2>&1
}

# have NAME CC [CFLAGS...]: define HYBD_HAVE_NAME if the C on stdin compiles
have() {
	feature=$1
	shift
	if compiles "$feature" "$@"; then
		printf '#define HYBD_HAVE_%s 1\n' "$feature" >>"$defs"
	else
		printf '/* #undef HYBD_HAVE_%s */\n' "$feature" >>"$defs"
	fi
}

# need NAME WHAT CC [CFLAGS...]: fail the build, naming WHAT, unless the C on stdin compiles
need() {
	name=$1 what=$2
	shift 2
	if ! compiles "$name" "$@"; then
		echo "hybd: this kernel lacks $what, which hybd needs (Linux >= 6.12 has it)." >&2
		echo "hybd: the test that failed ($name):" >&2
		sed 's/^/    /' "$dir/$name.log" | head -n 8 >&2
		exit 1
	fi
}

# A test that fails for a reason of its own (flags, a header that does not
# compile alone) would read as a feature the kernel lacks: first, a file
# that only includes what the module includes must compile.
if ! compiles baseline "$@" <<'EOF'
#include <linux/module.h>
#include <linux/blk-mq.h>
#include <linux/bpf.h>
#include <linux/btf.h>
EOF
then
	echo "hybd: the feature tests cannot compile against this kernel's headers:" >&2
	sed 's/^/    /' "$dir/baseline.log" | head -n 20 >&2
	exit 1
fi

# either NAME1 or NAME2 (each a have test just run) must hold, and not
# both: one of two spellings of one API
one_of() {
	a=$(grep -c "define HYBD_HAVE_$1 " "$defs")
	b=$(grep -c "define HYBD_HAVE_$2 " "$defs")
	if [ "$a$b" != 10 ] && [ "$a$b" != 01 ]; then
		echo "hybd: the feature tests found $([ "$a$b" = 11 ] && echo both || echo neither) of $1 and $2:" >&2
		sed 's/^/    /' "$dir/$1.log" "$dir/$2.log" | head -n 20 >&2
		exit 1
	fi
}

# ---- the floor: what the design cannot do without ----------------------

# the fast path needs BPF, its JIT (struct_ops trampolines) and the
# module's BTF (libbpf finds the struct_ops type there)
need bpf_config "CONFIG_BPF_SYSCALL, CONFIG_BPF_JIT and CONFIG_DEBUG_INFO_BTF_MODULES" "$@" <<'EOF'
#if !defined(CONFIG_BPF_SYSCALL) || !defined(CONFIG_BPF_JIT) || \
	!defined(CONFIG_DEBUG_INFO_BTF_MODULES)
#error a configuration without what the fast path needs
#endif
EOF

# the fast path is a struct_ops the module defines (Linux 6.9)
need struct_ops "module-defined BPF struct_ops (register_bpf_struct_ops)" "$@" <<'EOF'
#include <linux/bpf.h>
struct hybd_conftest_ops { int (*op)(void); };
static int f(struct bpf_struct_ops *st_ops)
{
	return register_bpf_struct_ops(st_ops, hybd_conftest_ops);
}
EOF

# kfuncs registered for struct_ops programs (Linux 6.9: BPF_PROG_TYPE_STRUCT_OPS
# in register_btf_kfunc_id_set, with a filter)
need kfunc_filter "kfunc sets with a filter (btf_kfunc_id_set.filter)" "$@" <<'EOF'
#include <linux/btf.h>
static struct btf_kfunc_id_set s = { .filter = NULL };
EOF

# the block layer's atomic limits, features in them (Linux 6.11)
need queue_limits "queue_limits with features (BLK_FEAT_WRITE_CACHE, queue_limits_start_update)" "$@" <<'EOF'
#include <linux/blkdev.h>
static void f(struct request_queue *q)
{
	struct queue_limits lim = queue_limits_start_update(q);

	lim.features |= BLK_FEAT_WRITE_CACHE;
	queue_limits_commit_update(q, &lim);
}
EOF

# backing targets are opened as files (Linux 6.9)
need bdev_file "bdev_file_open_by_dev and file_bdev" "$@" <<'EOF'
#include <linux/blkdev.h>
static struct block_device *f(dev_t d)
{
	return file_bdev(bdev_file_open_by_dev(d, BLK_OPEN_READ, NULL, NULL));
}
EOF

# ---- what moved between supported kernels ------------------------------

# Linux 6.14 made merging the default and dropped the flag
have BLK_MQ_F_SHOULD_MERGE "$@" <<'EOF'
#include <linux/blk-mq.h>
static unsigned int f = BLK_MQ_F_SHOULD_MERGE;
EOF

# Linux 6.14: the freeze returns the task's memalloc flags and the
# unfreeze takes them back; a freeze started with blk_freeze_queue_start()
# ends with the _nomemrestore one
have UNFREEZE_NOMEMRESTORE "$@" <<'EOF'
#include <linux/blk-mq.h>
static void f(struct request_queue *q) { blk_mq_unfreeze_queue_nomemrestore(q); }
EOF
have UNFREEZE_QUEUE_ALONE "$@" <<'EOF'
#include <linux/blk-mq.h>
static void f(struct request_queue *q) { blk_mq_unfreeze_queue(q); }
EOF
one_of UNFREEZE_NOMEMRESTORE UNFREEZE_QUEUE_ALONE

# Linux 6.17: a per-CPU workqueue says so (WQ_PERCPU), before the default
# becomes unbound; one that says neither gets a warning from 7.x
have WQ_PERCPU "$@" <<'EOF'
#include <linux/workqueue.h>
static unsigned int f = WQ_PERCPU;
EOF

# the offset into the current bio_vec: bi_bvec_done, bi_offset from 7.x
have BVEC_ITER_BVEC_DONE "$@" <<'EOF'
#include <linux/bvec.h>
static unsigned int f(struct bvec_iter *it) { return it->bi_bvec_done; }
EOF
have BVEC_ITER_OFFSET "$@" <<'EOF'
#include <linux/bvec.h>
static unsigned int f(struct bvec_iter *it) { return it->bi_offset; }
EOF
one_of BVEC_ITER_BVEC_DONE BVEC_ITER_OFFSET

{
	echo "/* generated by kmod/conftest.sh: what Linux $release offers */"
	cat "$defs"
} >"$out.tmp" && mv "$out.tmp" "$out"
