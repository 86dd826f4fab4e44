# hybd - top-level build.
#
#   make            build the module, libhybd, hybdctl and the examples
#   make deps       install every package the project needs (Debian 12)
#   make test       deps + build, then the whole suite in one guest boot
#                   (PYTEST_ARGS="-k bpf" selects tests)
#   make bench      deps + build, then the latency comparison in one guest
#   make demo       deps + build, then the ramdisk/fast-path demo in a guest
#
# KDIR selects the kernel to build the module against; the default is the
# Debian 6.12 headers installed by `make deps`.  On a real host running a
# >= 6.12 kernel: make KDIR=/lib/modules/$(uname -r)/build

KVER_DEFAULT := $(shell ls -d /usr/src/linux-headers-6.12.*-amd64 2>/dev/null | sort -V | tail -1 | sed 's|/usr/src/linux-headers-||')
KVER ?= $(KVER_DEFAULT)
KDIR ?= /usr/src/linux-headers-$(KVER)
export KDIR KVER

V ?= 0
ifeq ($(V),1)
Q :=
else
Q := @
MAKEFLAGS += --no-print-directory
endif
export Q V

.PHONY: all deps kmod lib tools examples bpf test bench demo clean check unit

all: kmod lib tools examples bpf

deps:
	$(Q)./tools/deps.sh

kmod:
	$(Q)$(MAKE) -C $(KDIR) M=$(CURDIR)/kmod modules $(if $(filter 1,$(V)),V=1,)

lib:
	$(Q)$(MAKE) -C libhybd

tools: lib
	$(Q)$(MAKE) -C tools

examples: lib
	$(Q)$(MAKE) -C examples/ramdisk
	$(Q)$(MAKE) -C tests/helpers

bpf:
	$(Q)$(MAKE) -C bpf
	$(Q)if [ -f tests/bpf/Makefile ]; then $(MAKE) -C tests/bpf; fi

# The unit tests of pure user-space code run on the host; everything that
# needs the module runs in one guest boot (tools/vm-run).
unit: lib
	$(Q)$(MAKE) -C tests/unit run

test: deps
	$(Q)$(MAKE) all
	$(Q)$(MAKE) unit
	$(Q)./tools/vm-run tests $(PYTEST_ARGS)

bench: deps
	$(Q)$(MAKE) all
	$(Q)./tools/vm-run bench

demo: deps
	$(Q)$(MAKE) all
	$(Q)./tools/vm-run demo

check:
	$(Q)./tools/checkpatch.sh

clean:
	$(Q)$(MAKE) -C $(KDIR) M=$(CURDIR)/kmod clean 2>/dev/null || true
	$(Q)$(MAKE) -C libhybd clean
	$(Q)$(MAKE) -C tools clean
	$(Q)$(MAKE) -C examples/ramdisk clean
	$(Q)$(MAKE) -C tests/helpers clean
	$(Q)$(MAKE) -C tests/unit clean
	$(Q)$(MAKE) -C bpf clean
	$(Q)if [ -f tests/bpf/Makefile ]; then $(MAKE) -C tests/bpf clean; fi
