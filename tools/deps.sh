#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Install what hybd needs on a Debian 12 (bookworm) machine.
#
#   tools/deps.sh            what building and running hybd need on this
#                            host (`make deps`): compiler, kernel headers,
#                            clang, libbpf >= 1.4, bpftool, pahole, pkg-config,
#                            Rust >= 1.81 (Debian's cargo-web unless a
#                            toolchain is there)
#   tools/deps.sh --guest    that, plus what the test guest needs (`make
#                            guest-deps`, run by make test, bench, demo): the
#                            Debian 6.12 kernel image and headers, qemu,
#                            virtme-ng, fio, nbdkit, pytest...
#   tools/deps.sh --list [--guest]
#                            print the Debian packages instead (to install
#                            them yourself)
#   tools/deps.sh --libbpf-ok VERSION
#                            exit 0 if a libbpf-dev of that Debian version
#                            is new enough, else say why not and exit 1
#
# Idempotent: when every package is present it only checks and returns.
set -eu

# Kernel headers: the running kernel's when Debian has them and it is a
# 6.12 or newer one (the module needs module-defined struct_ops), else
# Debian's 6.12, which `make` builds against by default.
host_headers() {
	rel=$(uname -r)
	if dpkg --compare-versions "${rel%%-*}" ge 6.12 2>/dev/null &&
	   { installed "linux-headers-$rel" ||
	     apt-cache show "linux-headers-$rel" >/dev/null 2>&1; }; then
		echo "linux-headers-$rel"
	else
		echo linux-headers-6.12-amd64
	fi
}

# building: the module (headers, pahole for its BTF), libhybd and hybdctl
# (libbpf, libelf, zlib), the BPF programs (clang); running: insmod, bpftool
BUILD_PKGS="build-essential clang-14 libbpf-dev bpftool libelf-dev zlib1g-dev liburing-dev libssl-dev libnbd-dev \
dwarves pkg-config kmod udev"
# the test guest: the kernel it boots and the headers the module is built
# against for it, qemu and virtme-ng (from PyPI, below), and what the
# suite, the benchmark and the demo run in it
GUEST_PKGS="linux-image-6.12-amd64 linux-headers-6.12-amd64 qemu-system-x86 \
busybox-static fio nbdkit nbd-client iproute2 util-linux e2fsprogs llvm-14 cryptsetup-bin dmsetup debootstrap \
python3-pytest python3-matplotlib python3-venv pipx"
# from bookworm-backports: bookworm's libbpf 1.1 cannot load struct_ops
# of a module's type.  libdw1 with them: libbpf-dev brings backports'
# libelf1, and bookworm's libdw1 (which dwarves and the headers need)
# pins bookworm's libelf1, so apt refuses the second install on a fresh
# machine ("held broken packages")
BACKPORTS_PKGS="libbpf-dev bpftool libdw1"
LIBBPF_MIN=1.4

# libbpf-dev's Debian version (epoch and revision included) is enough?
libbpf_ok() {
	v=${1#*:}		# the epoch orders nothing here
	[ -n "$v" ] && dpkg --compare-versions "$v" ge "$LIBBPF_MIN"
}

libbpf_too_old() {
	cat >&2 <<EOF
deps: libbpf-dev $1 is too old: hybd needs libbpf >= $LIBBPF_MIN (loading a
      struct_ops of a kernel module's type; Debian 12 itself ships 1.1).
      On Debian 12 it comes from bookworm-backports:
        echo 'deb http://deb.debian.org/debian bookworm-backports main' |
          sudo tee /etc/apt/sources.list.d/backports.list
        sudo apt-get update
        sudo apt-get install -t bookworm-backports libbpf-dev bpftool
EOF
}

RUST_MIN=1.81
rust_ok() {
	for c in "$(command -v cargo || true)" "${HOME:-/root}/.cargo/bin/cargo" /usr/bin/cargo; do
		[ -n "$c" ] && [ -x "$c" ] || continue
		v=$("$c" --version 2>/dev/null | awk '{print $2}')
		[ -n "$v" ] && dpkg --compare-versions "$v" ge "$RUST_MIN" && return 0
	done
	return 1
}

installed() {
	dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed'
}

GUEST=0
LIST=0
while [ $# -gt 0 ]; do
	case $1 in
	--guest) GUEST=1 ;;
	--list) LIST=1 ;;
	--libbpf-ok)
		[ $# -ge 2 ] || { echo "usage: $0 --libbpf-ok VERSION" >&2; exit 2; }
		if libbpf_ok "$2"; then
			echo "deps: libbpf-dev $2 is fine (>= $LIBBPF_MIN)"
			exit 0
		fi
		libbpf_too_old "$2"
		exit 1
		;;
	-h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "usage: $0 [--guest] [--list]" >&2; exit 2 ;;
	esac
	shift
done

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
	echo "deps: this installs Debian 12 packages, and this is not Debian." >&2
	echo "deps: hybd needs: gcc, make, the headers of a >= 6.12 kernel built with" >&2
	echo "      CONFIG_DEBUG_INFO_BTF_MODULES, pahole, clang, libbpf >= $LIBBPF_MIN," >&2
	echo "      libelf, zlib, pkg-config, bpftool (and for the test guest: qemu," >&2
	echo "      virtme-ng, fio, nbdkit, nbd-client, pytest, matplotlib)." >&2
	exit 1
fi

PKGS="$BUILD_PKGS $(host_headers)"
# Rust >= RUST_MIN for the crates under rust/ and examples/zram-rs (bindgen
# uses clang-14's libclang): a toolchain already there (rustup's too), else
# Debian's rustc-web and cargo-web, which bookworm keeps current for
# Firefox (bookworm's own rustc, 1.63, is too old)
rust_ok || PKGS="$PKGS rustc-web cargo-web"
[ $GUEST -eq 0 ] || PKGS="$PKGS $GUEST_PKGS"
# each once (the host's headers may be the guest's)
PKGS=$(printf '%s\n' $PKGS | awk '!seen[$0]++' | tr '\n' ' ')
PKGS=${PKGS% }
if [ $LIST -eq 1 ]; then
	echo "$PKGS (libbpf-dev and bpftool from bookworm-backports)"
	[ $GUEST -eq 0 ] || echo "virtme-ng from PyPI (pipx)"
	exit 0
fi

missing=""
for p in $PKGS; do
	installed "$p" || missing="$missing $p"
done
# libbpf-dev from bookworm itself (1.1) is replaced by the backport
if installed libbpf-dev &&
   ! libbpf_ok "$(dpkg-query -W -f='${Version}' libbpf-dev)"; then
	missing="$missing libbpf-dev"
fi

# virtme-ng is installed with pipx into VNG_BIN (on root's default PATH);
# look there too, whatever the caller's PATH, so that the `make test` that
# installs it also finds it (tools/vm-run does the same).
VNG_BIN=/usr/local/bin
case :$PATH: in *:$VNG_BIN:*) ;; *) PATH=$PATH:$VNG_BIN; export PATH ;; esac
have_vng() { [ $GUEST -eq 0 ] || command -v vng >/dev/null 2>&1; }

if [ -z "$missing" ] && have_vng; then
	echo "deps: all present"
	exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo

if [ -n "$missing" ]; then
	echo "deps: installing:$missing"
	if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
		echo "deb http://deb.debian.org/debian bookworm-backports main" |
			$SUDO tee /etc/apt/sources.list.d/hybd-backports.list >/dev/null
	fi
	export DEBIAN_FRONTEND=noninteractive
	log=$(mktemp /tmp/hybd-deps.XXXXXX)
	# shellcheck disable=SC2086
	if ! { $SUDO apt-get update -qq &&
	       $SUDO apt-get install -y -qq --no-install-recommends \
			-t bookworm-backports $BACKPORTS_PKGS &&
	       $SUDO apt-get install -y -qq --no-install-recommends $PKGS; } \
	     >"$log" 2>&1; then
		tail -n 40 "$log"
		echo "deps: apt-get failed (full log: $log)" >&2
		exit 1
	fi
	rm -f "$log"
fi

# whatever apt did, a libbpf older than 1.4 is refused here, not by a
# build or a load that fails later without saying why
v=$(dpkg-query -W -f='${Version}' libbpf-dev 2>/dev/null || true)
if ! libbpf_ok "$v"; then
	libbpf_too_old "${v:-(none)}"
	exit 1
fi

if ! have_vng; then
	# pipx comes with GUEST_PKGS; Debian's pip refuses system-wide installs
	# (PEP 668), so there is no other way.  The venv goes to /opt/pipx, the
	# command to $VNG_BIN, whoever runs this.
	echo "deps: installing virtme-ng from PyPI (pipx)"
	$SUDO env PIPX_HOME=/opt/pipx PIPX_BIN_DIR=$VNG_BIN pipx install virtme-ng >/dev/null ||
		{ echo "deps: pipx install virtme-ng failed" >&2; exit 1; }
	have_vng || { echo "deps: vng not found in $VNG_BIN after pipx install" >&2; exit 1; }
fi
echo "deps: done"
