# What every user-space Makefile shares (libhybd, tools, examples, tests).
# A Makefile sets TOP (the top of the tree, relative to itself) and then
#
#   include $(TOP)/mk/user.mk
#
# Its first goal stays "all", whatever rules this file brings in.
#
# CPPFLAGS, CFLAGS and LDFLAGS are the caller's, as a distribution passes
# them (make CFLAGS='-O2 -g -fstack-protector-strong' LDFLAGS=-Wl,-z,relro):
# what the build needs (warnings, -pthread, the include paths, -fPIC) is
# added to them, never replaced by them.

CC ?= gcc
CFLAGS ?= -O2 -g
override CFLAGS += -Wall -Wextra -pthread -I$(TOP)/include

# The project's version: one line in $(TOP)/VERSION (the tree's own file,
# not the system's: reading it here is fine)
HYBD_VERSION := $(shell cat $(TOP)/VERSION)

# Q=@ (quiet, as the top-level Makefile sets it): one line per step.
ifeq ($(Q),@)
MSG = @printf '  %-7s %s\n'
else
MSG = @:
endif

.DEFAULT_GOAL := all
.DELETE_ON_ERROR:
.PHONY: all clean
