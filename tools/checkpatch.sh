#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Run the kernel's checkpatch.pl over the module and the UAPI header.
# Uses $CHECKPATCH, else $KDIR/scripts/checkpatch.pl (Debian's headers
# package does not ship it; a kernel source tree does).
set -eu
cd "$(dirname "$0")/.."
cp=${CHECKPATCH:-${KDIR:-/lib/modules/$(uname -r)/build}/scripts/checkpatch.pl}
if [ ! -f "$cp" ]; then
	echo "checkpatch: $cp not found; set CHECKPATCH=/path/to/checkpatch.pl" >&2
	exit 77
fi
exec perl "$cp" --no-tree --terse --show-types -f \
	kmod/*.c kmod/hybd.h kmod/compat.h include/uapi/hybd.h
