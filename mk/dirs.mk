# Where `make install` puts things, GNU style.  Every directory can be set
# on the command line or in the environment, and DESTDIR stages the whole
# tree somewhere else (a package build, tests/test_install.py):
#
#   make install DESTDIR=/tmp/stage PREFIX=/usr LIBDIR=/usr/lib/x86_64-linux-gnu
#
# Only variables: including this file reads nothing from the system.

PREFIX ?= /usr/local
EXEC_PREFIX ?= $(PREFIX)
# hybdctl is an administrator's command (section 8), like bpftool
SBINDIR ?= $(EXEC_PREFIX)/sbin
BINDIR ?= $(EXEC_PREFIX)/bin
LIBDIR ?= $(EXEC_PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR ?= $(PREFIX)/share
MANDIR ?= $(DATADIR)/man
DOCDIR ?= $(DATADIR)/doc/hybd
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
# hybd.h, uapi/hybd.h and hybd.bpf.h: the pkg-config Cflags point here, so
# that a driver says #include <hybd.h> (or <hybd/hybd.h> without them)
HYBD_INCDIR ?= $(INCLUDEDIR)/hybd
# the sample fast paths, source and object
BPFDIR ?= $(DATADIR)/hybd/bpf
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions

# udev reads no rule under /usr/local: a local install puts its rule in
# /etc; a package sets UDEVRULESDIR=/usr/lib/udev/rules.d
UDEVRULESDIR ?= /etc/udev/rules.d
INSTALL ?= install
