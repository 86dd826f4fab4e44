#!/bin/sh
# Install everything hybd needs on a Debian 12 (bookworm) machine.
# Idempotent: when every package is present it only checks and returns.
set -eu

DEB_PKGS="build-essential linux-image-6.12-amd64 linux-headers-6.12-amd64 \
clang-14 llvm-14 libbpf-dev bpftool libelf-dev zlib1g-dev liburing-dev dwarves pkg-config \
fio qemu-system-x86 busybox-static nbdkit nbd-client util-linux e2fsprogs \
kmod python3-pytest python3-matplotlib python3-venv pipx udev"
BACKPORTS_PKGS="libbpf-dev bpftool"

missing=""
for p in $DEB_PKGS; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' ||
		missing="$missing $p"
done
# libbpf must be >= 1.4 for module-defined struct_ops
if dpkg-query -W -f='${Version}' libbpf-dev 2>/dev/null | grep -q '^1:\?0\|^1\.[0-3]\.'; then
	missing="$missing libbpf-dev"
fi

# virtme-ng is installed with pipx into VNG_BIN (on root's default PATH);
# look there too, whatever the caller's PATH, so that the `make test` that
# installs it also finds it (tools/vm-run does the same).
VNG_BIN=/usr/local/bin
case :$PATH: in *:$VNG_BIN:*) ;; *) PATH=$PATH:$VNG_BIN; export PATH ;; esac
have_vng() { command -v vng >/dev/null 2>&1; }

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
	       $SUDO apt-get install -y -qq --no-install-recommends $DEB_PKGS; } \
	     >"$log" 2>&1; then
		tail -n 40 "$log"
		echo "deps: apt-get failed (full log: $log)" >&2
		exit 1
	fi
	rm -f "$log"
fi

if ! have_vng; then
	# pipx comes with DEB_PKGS; Debian's pip refuses system-wide installs
	# (PEP 668), so there is no other way.  The venv goes to /opt/pipx, the
	# command to $VNG_BIN, whoever runs this.
	echo "deps: installing virtme-ng from PyPI (pipx)"
	$SUDO env PIPX_HOME=/opt/pipx PIPX_BIN_DIR=$VNG_BIN pipx install virtme-ng >/dev/null ||
		{ echo "deps: pipx install virtme-ng failed" >&2; exit 1; }
	have_vng || { echo "deps: vng not found in $VNG_BIN after pipx install" >&2; exit 1; }
fi
echo "deps: done"
