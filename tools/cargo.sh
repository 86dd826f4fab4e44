#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# cargo.sh - run cargo on hybd's Rust workspace (rust/: the hybd-sys and
# hybd crates, examples/zram-rs) with its target directory outside the
# tree, in $HYBD_CACHE/cargo/target (default /var/cache/hybd), so that
# builds are cached across clean clones; rust/target when that is not
# writable.
#
#   tools/cargo.sh ARGS...      cargo ARGS in rust/ (build, test, clippy...)
#   tools/cargo.sh --target-dir print the target directory
#
# cargo is the one on PATH, else rustup's (~/.cargo/bin), else Debian's
# cargo-web (/usr/bin/cargo), which `make deps` installs when there is no
# toolchain new enough (Rust >= 1.81; Debian 12's own cargo is 1.65).
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${HYBD_CACHE:-/var/cache/hybd}
# an existing one is used as it is (the test guest sees it read-only)
if [ -d "$CACHE/cargo/target" ] ||
   { mkdir -p "$CACHE/cargo" 2>/dev/null && [ -w "$CACHE/cargo" ]; }; then
	target=$CACHE/cargo/target
else
	target=$REPO/rust/target
fi
if [ "${1:-}" = --target-dir ]; then
	echo "$target"
	exit 0
fi
cargo=$(command -v cargo || true)
for c in "${HOME:-/root}/.cargo/bin/cargo" /usr/bin/cargo; do
	[ -n "$cargo" ] || { [ -x "$c" ] && cargo=$c; } || true
done
if [ -z "$cargo" ]; then
	echo "cargo.sh: no cargo: run 'make deps' (Debian's cargo-web), or install Rust >= 1.81 (https://rustup.rs)" >&2
	exit 1
fi
cd "$REPO/rust"
CARGO_TARGET_DIR=$target exec "$cargo" "$@"
