#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# bpf-atomics.sh OBJ... - every BPF program the project ships uses only
# fetching atomics.  A BPF atomic add whose result is unused compiles to a
# non-fetching add, which arm64's JIT emits as STADD: unordered.  The
# programs' atomics publish cache slots and versions, so each must be a
# fetching one (BPF_FETCH: "lock *(u64 *)(...)" in the disassembly is the
# non-fetching form).  A check of built objects: it runs on the host, in
# `make unit`, not in the guest, where llvm-objdump takes most of a minute
# to start under TCG.
set -u

objdump=$(command -v llvm-objdump-14 || command -v llvm-objdump) || {
	echo "bpf-atomics: llvm-objdump not found (make guest-deps installs llvm-14)"
	exit 1
}
[ $# -gt 0 ] || { echo "bpf-atomics: no BPF objects given (make bpf)"; exit 1; }
bad=0
for obj in "$@"; do
	if ! out=$("$objdump" -d --no-show-raw-insn "$obj" 2>&1); then
		echo "bpf-atomics: $obj: $out"
		bad=1
		continue
	fi
	lines=$(printf '%s\n' "$out" | grep -E 'lock \*\(u[0-9]+ \*\)')
	if [ -n "$lines" ]; then
		echo "bpf-atomics: $obj has non-fetching atomics:"
		printf '%s\n' "$lines" | sed 's/^/    /'
		bad=1
	fi
done
[ $bad -eq 0 ] && echo "bpf-atomics: $# objects, fetching atomics only"
exit $bad
