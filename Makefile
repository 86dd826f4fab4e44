# hybd - top-level build.
#
#   make            build the module, libhybd, hybdctl and the examples
#   make deps       install what building and running hybd need (Debian 12:
#                   compiler, kernel headers, clang, libbpf >= 1.4, bpftool)
#   make guest-deps deps, plus what the test guest needs (the 6.12 kernel
#                   image and headers, qemu, virtme-ng, fio, nbdkit, pytest)
#   make test       guest-deps + build, then the whole suite in one guest boot,
#                   each behaviour once, within 30 minutes of pytest
#                   (PYTEST_ARGS="-k bpf" selects tests)
#   make test KVER=7.3  the same on another supported kernel (6.12, 7.2,
#                   7.3: tools/kernels list, docs/kernels.md): Debian's
#                   image of it boots, the module is built against its
#                   headers; fetched once into /var/cache/hybd (HYBD_CACHE)
#   make test-kernels  make test on every supported kernel in turn, then
#                   one table (kernel, passed, failed, skipped, time)
#   make test-long  the same with the variants crossed and the full
#                   reliability counts (20 kills, handovers and deletes per
#                   case, 100,000 fuzz calls)
#   make test-debug guest-deps + build, then the whole suite in a debug kernel
#                   (KASAN, lockdep, KFENCE, UBSAN, kmemleak...) built once by
#                   tools/debug-kernel and cached in /var/cache/hybd (HYBD_CACHE);
#                   the first run builds it: about 15 min on 2 idle cores
#                   (35-66 beside test guests);
#                   KVER=7.3 builds Debian's linux-source-7.3 instead;
#                   PART=1, 2 or 3 runs one part (under 2 h each)
#   make bench      guest-deps + bench-deps + build, then hybd against
#                   null_blk, ublk, loop, dm-crypt and nbd in one clean
#                   guest (BENCH_ARGS="--only loop" selects lines); refuses
#                   to run beside another QEMU guest or on a busy host
#                   (BENCH_ARGS="--force" measures anyway)
#   make bench-deps rublk (ublk's server, the slow path's peer), built once
#                   with cargo into /var/cache/hybd (HYBD_CACHE)
#   make demo       guest-deps + build, then the ramdisk/fast-path demo in a guest
#   make install    libhybd, its headers and pkg-config files (hybd.pc),
#                   zram-rs and its zram.bpf.o,
#                   hybd.bpf.h and the sample programs, hybdctl, the man
#                   pages, the licences (DESTDIR, PREFIX=/usr/local,
#                   LIBDIR...: mk/dirs.mk)
#   make uninstall  remove what install wrote (same variables)
#   make dkms-install  the module's sources to /usr/src/hybd-<version>, then
#                   dkms add, build, install (KVER=<release>: that kernel)
#   make dkms-uninstall  dkms remove, and the sources
#   make dkms-src   only the sources and dkms.conf, under DESTDIR (a package)
#   make help       this text
#
# The user-space parts take CPPFLAGS, CFLAGS and LDFLAGS as a distribution
# passes them (make CFLAGS='-O2 -g -fstack-protector-strong'): the flags
# the build needs are added to them.  VERSION holds the project's version:
# the module's MODULE_VERSION, libhybd's file name, the pkg-config and DKMS
# versions.
#
# KDIR selects the kernel to build the module against; the default is the
# newest Debian 6.12 headers installed by `make deps` (or KVER=<release> for
# /usr/src/linux-headers-<release>).  On a real host running a >= 6.12
# kernel: make KDIR=/lib/modules/$(uname -r)/build
#
# Nothing is read from the installed system when this file is parsed: `make
# test` installs the headers (deps) before the build looks for them, so the
# default KDIR is found by the recipes that use it, when they run.

# (recursively expanded, used only in recipes, never exported)
kdir_found = $(or $(KDIR),$(if $(KVER),/usr/src/linux-headers-$(KVER),$(shell \
	ls -d /usr/src/linux-headers-6.12.*-amd64 2>/dev/null | sort -V | tail -n 1)))
kdir = $(or $(kdir_found),$(error no /usr/src/linux-headers-6.12.*-amd64: \
	run 'make deps' or set KDIR))

V ?= 0
ifeq ($(V),1)
Q :=
else
Q := @
MAKEFLAGS += --no-print-directory
endif
export Q V

# directories of `make install` (variables only); the tree's own VERSION
include mk/dirs.mk
HYBD_VERSION := $(shell cat VERSION)
# where DKMS takes a module's sources from (DESTDIR: a package's staging)
DKMS_SRC = $(DESTDIR)/usr/src/hybd-$(HYBD_VERSION)

.PHONY: all deps guest-deps bench-deps kmod lib tools examples bpf rust test test-long test-debug bench \
	test-kernels \
	demo clean check unit help install uninstall dkms-src dkms-install \
	dkms-uninstall

all: kmod lib tools examples bpf rust

# the Rust workspace (rust/: hybd-sys, hybd; examples/zram-rs), built with
# tools/cargo.sh into $(HYBD_CACHE)/cargo, outside the tree
rust: lib
	$(Q)./tools/cargo.sh build --release --workspace --bins --examples $(if $(Q),--quiet)

# what building and running need; guest-deps adds the test guest's tooling
deps:
	$(Q)./tools/deps.sh

guest-deps:
	$(Q)./tools/deps.sh --guest

bench-deps:
	$(Q)./tools/bench-deps.sh

# With KVER (a supported kernel: 6.12, 7.2, 7.3; tools/kernels list), the
# module is built against that kernel's Debian headers in a copy,
# results/kmod-<release>/, and the test and bench guests boot that kernel.
kmod:
ifeq ($(KVER),)
	$(Q)$(MAKE) -C $(kdir) M=$(CURDIR)/kmod modules $(if $(filter 1,$(V)),V=1,)
else
	$(Q)./tools/kernels prepare $(KVER)
	$(Q)./tools/kernels kmod $(KVER) $(if $(filter 1,$(V)),V=1,) >/dev/null
endif

# what tools/vm-run needs to boot KVER with its module (nothing without)
vm_env = $(if $(KVER),eval "$$(./tools/kernels env $(KVER))" && \
	export HYBD_VM_KERNEL HYBD_KMOD &&)

lib:
	$(Q)$(MAKE) -C libhybd

tools: lib
	$(Q)$(MAKE) -C tools

examples: lib
	$(Q)$(MAKE) -C examples/ramdisk
	$(Q)$(MAKE) -C examples/loop
	$(Q)$(MAKE) -C examples/dedup
	$(Q)$(MAKE) -C examples/encrypt
	$(Q)$(MAKE) -C examples/nbd
	$(Q)$(MAKE) -C examples/zram-rs
	$(Q)$(MAKE) -C tests/helpers
	$(Q)$(MAKE) -C tests/abi

bpf:
	$(Q)$(MAKE) -C bpf
	$(Q)if [ -f tests/bpf/Makefile ]; then $(MAKE) -C tests/bpf; fi

# The unit tests of pure user-space code run on the host; everything that
# needs the module runs in one guest boot (tools/vm-run).
unit: lib bpf examples rust
	$(Q)./tools/cargo.sh test --workspace --release $(if $(Q),--quiet)
	$(Q)if ./tools/cargo.sh clippy --version >/dev/null 2>&1; then \
		./tools/cargo.sh clippy --workspace --all-targets --release $(if $(Q),--quiet) -- -D warnings; \
	else echo "unit: no clippy with this cargo (Debian's cargo-web has none; rustup's has): not run"; fi
	$(Q)if ./tools/cargo.sh fmt --version >/dev/null 2>&1; then \
		./tools/cargo.sh fmt --check; \
	else echo "unit: no rustfmt with this cargo: the Rust layout is not checked"; fi
	$(Q)$(MAKE) -C man check check-examples
	$(Q)$(MAKE) -C tests/unit run
	$(Q)$(MAKE) -C examples/dedup test-store
	$(Q)$(MAKE) -C examples/encrypt test-xts
	$(Q)./tests/unit/bpf-atomics.sh bpf/*.bpf.o examples/*/*.bpf.o

# The suite takes about 20 minutes of pytest on a 2-core machine under TCG,
# within a budget of 30 (tools/suite-verdict --budget, run by .ci/run); the
# guest gets an hour (pytest 50 minutes of it, tools/vm-run), so that a
# hang fails inside CI's 90 minutes with its log kept.
test: guest-deps
	$(Q)$(MAKE) all
	$(Q)$(MAKE) unit
	$(Q)$(vm_env) HYBD_VM_TIMEOUT=$${HYBD_VM_TIMEOUT:-3600} \
		./tools/vm-run tests $(PYTEST_ARGS)

# The suite on each supported kernel, one guest boot each (tools/test-kernels)
test-kernels: guest-deps
	$(Q)./tools/test-kernels

# The same suite with every variant of a parametrized test crossed with
# every other (tests/hybdlib.py: variants()) and the full counts of the
# reliability tests: 20 server kills and handovers per case, 20 deletes per
# state, 100,000 fuzz calls, 50 attach/replace/detach steps, 10 dedup kills
# per case.
test-long: guest-deps
	$(Q)$(MAKE) all
	$(Q)$(MAKE) unit
	$(Q)$(vm_env) HYBD_LONG=1 HYBD_VM_TIMEOUT=$${HYBD_VM_TIMEOUT:-10800} \
		./tools/vm-run tests $(PYTEST_ARGS)

# The module is built against the debug kernel's tree in a copy of kmod/
# (results/debug-kmod), so kmod/hybd.ko stays the regular one.
test-debug: guest-deps
	$(Q)$(MAKE) lib tools examples bpf rust
	$(Q)KVER=$(KVER) HYBD_DEBUG_PART=$(PART) ./tools/debug-kernel test $(PYTEST_ARGS)

# bench-deps may fail (no Rust toolchain): the ublk lines then say why
# they were not measured, the rest is measured all the same (and make bench
# exits 1, as for any line not measured)
bench: guest-deps
	$(Q)./tools/bench-deps.sh || echo "make bench: no rublk: the ublk lines will not be measured"
	$(Q)$(MAKE) all
	$(Q)$(vm_env) ./tools/vm-run bench $(BENCH_ARGS)

demo: guest-deps
	$(Q)$(MAKE) all
	$(Q)./tools/vm-run demo

# The user-space product (the module goes through DKMS, below).  Builds
# what is missing first, as the user who runs it: run `make` before `sudo
# make install`.
install: tools
	$(Q)$(MAKE) -C libhybd install
	$(Q)$(MAKE) -C tools install
	$(Q)$(MAKE) -C bpf install
	$(Q)$(MAKE) -C man install
	$(Q)$(MAKE) -C examples/zram-rs install
	$(INSTALL) -d $(DESTDIR)$(DOCDIR)/LICENSES
	$(INSTALL) -m 644 $(wildcard LICENSES/*) $(DESTDIR)$(DOCDIR)/LICENSES/

uninstall:
	$(Q)$(MAKE) -C libhybd uninstall
	$(Q)$(MAKE) -C tools uninstall
	$(Q)$(MAKE) -C examples/zram-rs uninstall
	$(Q)$(MAKE) -C bpf uninstall
	$(Q)$(MAKE) -C man uninstall
	rm -f $(addprefix $(DESTDIR)$(DOCDIR)/,$(wildcard LICENSES/*))
	rmdir $(DESTDIR)$(DOCDIR)/LICENSES $(DESTDIR)$(DOCDIR) 2>/dev/null || :

# The module's sources as DKMS wants them: dkms.conf (versioned), kmod/,
# the UAPI header and VERSION, in the tree's layout (kmod/Kbuild reads
# ../include and ../VERSION).
kmod_src = $(filter-out %.mod.c kmod/compat-gen.h,$(wildcard kmod/*.c kmod/*.h)) \
	kmod/conftest.sh
dkms-src:
	rm -rf $(DKMS_SRC)
	$(INSTALL) -d $(DKMS_SRC)/kmod $(DKMS_SRC)/include/uapi
	$(INSTALL) -m 644 kmod/Kbuild $(kmod_src) $(DKMS_SRC)/kmod/
	chmod 755 $(DKMS_SRC)/kmod/conftest.sh
	$(INSTALL) -m 644 include/uapi/hybd.h $(DKMS_SRC)/include/uapi/
	$(INSTALL) -m 644 VERSION $(DKMS_SRC)/
	sed 's/@VERSION@/$(HYBD_VERSION)/' dkms.conf >$(DKMS_SRC)/dkms.conf

# As root.  The kernel is the running one, or KVER=<release> (its headers
# under /lib/modules/<release>/build).  A version added before is removed
# first, so that this can be run again after a change.
dkms_k = $(if $(KVER),-k $(KVER))
dkms-install:
	@command -v dkms >/dev/null || { echo "dkms is not installed (apt-get install dkms)"; exit 1; }
	$(Q)if dkms status -m hybd -v $(HYBD_VERSION) | grep -q .; then \
		dkms remove -m hybd -v $(HYBD_VERSION) --all; fi
	$(Q)$(MAKE) dkms-src DESTDIR=
	dkms add -m hybd -v $(HYBD_VERSION)
	dkms build -m hybd -v $(HYBD_VERSION) $(dkms_k)
	dkms install -m hybd -v $(HYBD_VERSION) $(dkms_k)

dkms-uninstall:
	@command -v dkms >/dev/null || { echo "dkms is not installed"; exit 1; }
	$(Q)if dkms status -m hybd -v $(HYBD_VERSION) | grep -q .; then \
		dkms remove -m hybd -v $(HYBD_VERSION) --all; fi
	rm -rf /usr/src/hybd-$(HYBD_VERSION)

check:
	$(Q)KDIR=$(kdir_found) ./tools/checkpatch.sh

help:
	@sed -n '3,/^$$/s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))

clean:
	$(Q)rm -f kmod/*.o kmod/*.ko kmod/*.mod kmod/*.mod.c kmod/.*.cmd \
		kmod/Module.symvers kmod/modules.order kmod/compat-gen.h
	$(Q)$(MAKE) -C libhybd clean
	$(Q)$(MAKE) -C tools clean
	$(Q)$(MAKE) -C examples/ramdisk clean
	$(Q)$(MAKE) -C examples/loop clean
	$(Q)$(MAKE) -C examples/dedup clean
	$(Q)$(MAKE) -C examples/encrypt clean
	$(Q)$(MAKE) -C examples/zram-rs clean
	$(Q)$(MAKE) -C examples/nbd clean
	$(Q)$(MAKE) -C tests/helpers clean
	$(Q)$(MAKE) -C tests/abi clean
	$(Q)$(MAKE) -C tests/unit clean
	$(Q)$(MAKE) -C bpf clean
	$(Q)if [ -f tests/bpf/Makefile ]; then $(MAKE) -C tests/bpf clean; fi
