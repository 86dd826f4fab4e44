#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Compile the programs under EXAMPLES: libhybd.3's against libhybd/hybd.h
# (C), hybd-bpf.7's against bpf/hybd.bpf.h (BPF).  A page whose example no
# longer builds against the headers it documents fails.
#
#   TOP=.. CC=cc CLANG=clang-14 ./check-examples.sh

set -e
top=${TOP:-..}
cc=${CC:-cc}
clang=${CLANG:-clang}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Each .EX block after .SH EXAMPLES of page $1 into $tmp/$2N.c, roff
# escapes undone.
extract() {
	awk -v out="$tmp/$2" '
		/^\.SH /	{ ex = ($0 ~ /^\.SH EXAMPLES/) }
		ex && /^\.EX/	{ code = 1; n++; next }
		ex && /^\.EE/	{ code = 0 }
		code		{ print > (out n ".c") }' "$1"
	for f in "$tmp/$2"*.c; do
		[ -e "$f" ] || { echo "$1: no example under EXAMPLES" >&2; exit 1; }
		sed -i -e 's/\\e/\\/g' -e 's/\\-/-/g' -e "s/\\\\(aq/'/g" \
		       -e 's/\\(dq/"/g' -e 's/\\(ti/~/g' -e 's/\\&//g' "$f"
	done
}

extract libhybd.3 libhybd
for f in "$tmp"/libhybd*.c; do
	echo "  CC      libhybd.3: example $(basename "$f" .c | tr -dc 0-9)"
	$cc -Wall -Wextra -Wno-unused-parameter -Werror -fsyntax-only \
	    -I"$top/libhybd" -I"$top/include" "$f"
done

extract hybd-bpf.7 bpf
for f in "$tmp"/bpf*.c; do
	echo "  BPF     hybd-bpf.7: example $(basename "$f" .c | tr -dc 0-9)"
	$clang -g -O2 -target bpf -mcpu=v3 -D__TARGET_ARCH_x86 -Wall -Werror \
	       -I"$top/include" -I"$top/bpf" \
	       -I"/usr/include/$(uname -m)-linux-gnu" -c "$f" -o "${f%.c}.o"
done
