/* SPDX-License-Identifier: MIT */
/* What hybd-sys binds: libhybd's public API and the uapi it includes. */
#include <hybd.h>
