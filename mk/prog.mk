# Programs linked statically against libhybd.a: each of $(PROGS) is built
# from its own .c file.  A Makefile sets TOP and PROGS, then
#
#   include $(TOP)/mk/prog.mk
#
# and gets "all" and "clean".  Headers that only some programs need go in
# EXTRA_HDRS, other libraries in PROG_LIBS, set before the include.

include $(TOP)/mk/user.mk

override CFLAGS += -I$(TOP)/libhybd
LIBHYBD := $(TOP)/libhybd/libhybd.a
# what libhybd.a needs (its fast-path loader): libbpf and libbpf's own
LIBHYBD_LIBS := -lbpf -lelf -lz -pthread
HDRS := $(TOP)/libhybd/hybd.h $(TOP)/include/uapi/hybd.h $(EXTRA_HDRS)
# this directory as seen from the top, for the quiet messages
SUBDIR := $(patsubst $(abspath $(TOP))/%,%,$(CURDIR))

.PHONY: FORCE

all: $(PROGS)

$(PROGS): %: %.c $(HDRS) $(LIBHYBD)
	$(MSG) CC $(SUBDIR)/$@
	$(Q)$(CC) $(CFLAGS) $(CPPFLAGS) $(LDFLAGS) -o $@ $< $(LIBHYBD) $(LIBHYBD_LIBS) $(PROG_LIBS)

# libhybd's own Makefile knows when it is out of date.
$(LIBHYBD): FORCE
	$(Q)$(MAKE) -s -q -C $(TOP)/libhybd libhybd.a 2>/dev/null || \
		$(MAKE) --no-print-directory -C $(TOP)/libhybd libhybd.a

clean:
	$(Q)rm -f $(PROGS)
