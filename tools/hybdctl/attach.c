// SPDX-License-Identifier: MIT
/*
 * hybdctl: the fast path - attach, attach --replace, detach.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybdctl.h"

int cmd_attach(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "replace", no_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct hybd_dev_info before, after;
	unsigned int flags = HYBD_BPF_F_PIN;
	const char *path;
	struct hybd_bpf *b;
	char old[64], now[64];
	uint32_t id;
	int c, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'r':
			flags |= HYBD_BPF_F_REPLACE;
			break;
		case 'h':
			return command_help("attach");
		default:
			return option_error("attach", c, argv, opts);
		}
	}
	if (argc - optind != 2)
		return usage_error("attach", "%s",
				   argc - optind < 2 ?
				   "wants PROG.bpf.o and DEV" :
				   "too many arguments");
	path = argv[optind];
	if (hybd_parse_dev(argv[optind + 1], &id) < 0)
		return usage_error("attach", "%s", hybd_errmsg());

	old[0] = '\0';
	if ((flags & HYBD_BPF_F_REPLACE) && !hybd_ctl_info(id, &before))
		bpf_desc(&before, old, sizeof(old));
	ret = hybd_bpf_attach(id, path, flags, &b);
	if (ret < 0)
		return failed(flags & HYBD_BPF_F_REPLACE ? "attach --replace" :
			      "attach", ret);
	/* pinned: the program stays attached after this handle goes */
	hybd_bpf_close(b);

	if (hybd_ctl_info(id, &after) || !has_bpf(&after)) {
		printf("attached %s to /dev/hybd%u\n", path, id);
		return EXIT_SUCCESS;
	}
	bpf_desc(&after, now, sizeof(now));
	printf("attached %s to /dev/hybd%u\n", now, id);
	if (old[0])
		printf("replaced %s\n", old);
	return EXIT_SUCCESS;
}

int cmd_detach(int argc, char **argv)
{
	struct hybd_dev_info info;
	char desc[64];
	int ret;
	uint32_t id;

	ret = dev_arg_only("detach", argc, argv, &id);
	if (ret >= 0)
		return ret;
	desc[0] = '\0';
	if (!hybd_ctl_info(id, &info))
		bpf_desc(&info, desc, sizeof(desc));
	ret = hybd_bpf_detach_pinned(id);
	if (ret < 0)
		return failed("detach", ret);
	printf("detached %s from /dev/hybd%u\n", desc[0] ? desc : "the fast path",
	       id);
	return EXIT_SUCCESS;
}
