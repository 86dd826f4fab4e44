# What every user-space Makefile shares (libhybd, tools, examples, tests).
# A Makefile sets TOP (the top of the tree, relative to itself) and then
#
#   include $(TOP)/mk/user.mk
#
# Its first goal stays "all", whatever rules this file brings in.

CC ?= gcc
CFLAGS ?= -O2 -g
override CFLAGS += -Wall -Wextra -pthread -I$(TOP)/include

# Q=@ (quiet, as the top-level Makefile sets it): one line per step.
ifeq ($(Q),@)
MSG = @printf '  %-7s %s\n'
else
MSG = @:
endif

.DEFAULT_GOAL := all
.DELETE_ON_ERROR:
.PHONY: all clean
