/* SPDX-License-Identifier: MIT */
/*
 * The harness every unit test shares: CHECK() counts a passed or failed
 * condition and names a failed one with its file and line; main() ends
 * with "return unit_report();".
 *
 * A test that defines UNIT_SHOW_ERRMSG before including this also prints
 * hybd_errmsg() after each failure.
 */
#ifndef UNIT_H
#define UNIT_H

#include <stdio.h>

#ifdef UNIT_SHOW_ERRMSG
#include "hybd.h"
#endif

static int passed, failed;

#define CHECK(cond) unit_check(!!(cond), #cond, __FILE__, __LINE__)

static inline void unit_check(int ok, const char *what, const char *file,
			      int line)
{
	if (ok) {
		passed++;
		return;
	}
	failed++;
#ifdef UNIT_SHOW_ERRMSG
	fprintf(stderr, "%s:%d: FAILED: %s (message: \"%s\")\n", file, line,
		what, hybd_errmsg());
#else
	fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what);
#endif
}

/* Print the totals; returns the test's exit status. */
static inline int unit_report(void)
{
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}

#endif /* UNIT_H */
