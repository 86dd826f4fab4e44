#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# bench-deps.sh - what `make bench` needs beyond `make guest-deps`: ublk's
# server, the peer of hybd's slow path, built once into a cache outside the
# tree and reused by every later run.
#
#   tools/bench-deps.sh          install rublk RUBLK_VERSION unless it is
#                                there; print where it is
#   tools/bench-deps.sh --check  exit 0 if it is there, else 1 (no install)
#
# rublk (https://crates.io/crates/rublk) is ublk's Rust server; its null and
# loop targets are the bench's ublk lines.  It is built with cargo from
# crates.io (--locked: the versions its Cargo.lock names), without default
# features, into $HYBD_CACHE/rublk-<version>; $HYBD_CACHE/rublk points at the
# one in use.  Its build needs libclang (bindgen), which clang-14 from `make
# deps` brings.  About 3 to 7 minutes on 2 cores, once.
#
# Environment: HYBD_CACHE (default /var/cache/hybd), CARGO (default: cargo
# on PATH, else ~/.cargo/bin/cargo, as rustup installs it).
set -eu

RUBLK_VERSION=0.2.15
CACHE=${HYBD_CACHE:-/var/cache/hybd}
DEST=$CACHE/rublk-$RUBLK_VERSION
LINK=$CACHE/rublk

installed() {
	[ -x "$DEST/bin/rublk" ] &&
		"$DEST/bin/rublk" --version 2>/dev/null | grep -q " $RUBLK_VERSION\$"
}

link() {
	ln -sfn "rublk-$RUBLK_VERSION" "$LINK"
	echo "bench-deps: rublk $RUBLK_VERSION: $LINK/bin/rublk"
}

case ${1:-} in
--check) installed && exit 0; exit 1 ;;
"") ;;
-h|--help) sed -n '4,19s/^# \{0,1\}//p' "$0"; exit 0 ;;
*) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

if installed; then
	link
	exit 0
fi

cargo=${CARGO:-$(command -v cargo || true)}
# rustup's place, also for sudo (whose PATH and HOME are root's)
for home in "${HOME:-}" ${SUDO_USER:+"$(getent passwd "$SUDO_USER" | cut -d: -f6)"}; do
	[ -z "$cargo" ] && [ -n "$home" ] && [ -x "$home/.cargo/bin/cargo" ] &&
		cargo=$home/.cargo/bin/cargo
done
if [ -z "$cargo" ]; then
	cat >&2 <<EOF
bench-deps: cargo not found: rublk (ublk's server, the bench's ublk lines)
            is built from crates.io with a Rust toolchain >= 1.74.  Install
            one (https://rustup.rs, or Debian's rustc-web/cargo-web), then run
            'make bench-deps' again; without it the ublk lines are not measured.
EOF
	exit 1
fi

if ! mkdir -p "$CACHE" 2>/dev/null || [ ! -w "$CACHE" ]; then
	echo "bench-deps: cannot write $CACHE: run as root, or set HYBD_CACHE to a directory of yours" >&2
	exit 1
fi
echo "bench-deps: building rublk $RUBLK_VERSION with $cargo into $DEST (once; minutes)"
log=$CACHE/rublk-$RUBLK_VERSION.build.log
# a half-built tree from an interrupted run is not reused
rm -rf "$DEST.tmp"
if ! "$cargo" install rublk --version "$RUBLK_VERSION" --locked \
	--no-default-features --root "$DEST.tmp" >"$log" 2>&1; then
	echo "bench-deps: cargo install rublk failed; the end of $log:" >&2
	tail -n 15 "$log" >&2
	rm -rf "$DEST.tmp"
	exit 1
fi
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
installed || { echo "bench-deps: $DEST/bin/rublk does not say it is $RUBLK_VERSION" >&2; exit 1; }
link
