// SPDX-License-Identifier: GPL-2.0
/*
 * mapfill - a device's pinned fast-path maps from the slow path's side,
 * through libhybd (hybd_bpf_map_open_pinned, hybd_bpf_map_fill):
 *
 *   mapfill get DEV_ID MAP KEY              prints the u64 at KEY
 *   mapfill fill DEV_ID MAP FIRST COUNT VALUE
 *                                           sets FIRST..FIRST+COUNT-1
 *
 * Exit 0, or 1 with hybd_errmsg() on stderr.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/bpf.h>

#include "hybd.h"

static int fail(const char *what)
{
	fprintf(stderr, "mapfill: %s: %s\n", what, hybd_errmsg());
	return 1;
}

int main(int argc, char **argv)
{
	uint64_t value;
	uint32_t key;
	int fd, ret;

	if (argc < 5)
		return 2;
	fd = hybd_bpf_map_open_pinned(strtoul(argv[2], NULL, 0), argv[3]);
	if (fd < 0)
		return fail(argv[3]);
	if (!strcmp(argv[1], "get") && argc == 5) {
		key = strtoul(argv[4], NULL, 0);
		if (bpf_map_lookup_elem(fd, &key, &value)) {
			fprintf(stderr, "mapfill: lookup %u: %s\n", key,
				strerror(errno));
			return 1;
		}
		printf("%" PRIu64 "\n", value);
		return 0;
	}
	if (!strcmp(argv[1], "fill") && argc == 7) {
		value = strtoull(argv[6], NULL, 0);
		ret = hybd_bpf_map_fill(fd, strtoul(argv[4], NULL, 0),
					strtoul(argv[5], NULL, 0), &value);
		close(fd);
		return ret ? fail("fill") : 0;
	}
	return 2;
}
