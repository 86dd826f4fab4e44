// SPDX-License-Identifier: MIT
/*
 * One version for the project: VERSION (passed in as HYBD_VERSION) names
 * the module, libhybd's file and the pkg-config package; the API version
 * hybd.h announces must be its MAJOR.MINOR, so that bumping one without
 * the other fails here.
 */
#include <stdio.h>
#include <string.h>

#include "hybd.h"
#include "unit.h"

int main(void)
{
	char api[32];
	size_t len;

	snprintf(api, sizeof(api), "%d.%d.", HYBD_LIB_VERSION_MAJOR,
		 HYBD_LIB_VERSION_MINOR);
	len = strlen(api);
	if (strncmp(HYBD_VERSION, api, len))
		fprintf(stderr, "VERSION is %s but hybd.h says %d.%d: bump both\n",
			HYBD_VERSION, HYBD_LIB_VERSION_MAJOR,
			HYBD_LIB_VERSION_MINOR);
	CHECK(!strncmp(HYBD_VERSION, api, len));
	/* MAJOR.MINOR.PATCH, digits only: the soname is built from it */
	CHECK(strspn(HYBD_VERSION, "0123456789.") == strlen(HYBD_VERSION));
	CHECK(strchr(HYBD_VERSION + len, '.') == NULL);
	CHECK(HYBD_VERSION[len] != '\0');
	return unit_report();
}
