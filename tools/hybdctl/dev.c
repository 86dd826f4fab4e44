// SPDX-License-Identifier: MIT
/*
 * hybdctl: a device's life - list, info, features, add, del.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybdctl.h"

static const struct {
	uint64_t bit;
	const char *name;
} feature_names[] = {
	{ HYBD_F_RINGS, "rings" },
	{ HYBD_F_POLL, "poll" },
	{ HYBD_F_SEQ_CHECK, "seq_check" },
	{ HYBD_F_BPF, "bpf" },
	{ HYBD_F_IO_TIMEOUT, "io_timeout" },
	{ HYBD_F_DEL_FORCE, "del_force" },
	{ HYBD_F_EVENTFD, "eventfd" },
	{ HYBD_F_QUEUE_CPUS, "queue_cpus" },
	{ HYBD_F_MEM_INFO, "mem_info" },
	{ HYBD_F_PASS_ZEROES, "pass_zeroes" },
	{ HYBD_F_RECOVERY, "recovery" },
	{ HYBD_F_BACKING, "backing" },
	{ HYBD_F_REMAP, "remap" },
	{ HYBD_F_RESIZE, "resize" },
	{ HYBD_F_UNPRIVILEGED, "unprivileged" },
	{ HYBD_F_REMAP_POLL, "remap_poll" },
	{ HYBD_F_BIO_FRONT, "bio_front" },
};

/* The ids of every device; *ids is malloc'd.  Returns the count or -errno. */
static int get_ids(uint32_t **ids)
{
	uint32_t room = HYBD_MAX_DEVICES;
	uint32_t *buf = NULL, *tmp;
	int n;

	for (;;) {
		tmp = realloc(buf, room * sizeof(*buf));
		if (!tmp) {
			free(buf);
			return -ENOMEM;
		}
		buf = tmp;
		n = hybd_ctl_list(buf, room);
		if (n < 0 || (uint32_t)n <= room)
			break;
		room = n;	/* more devices appeared meanwhile */
	}
	if (n < 0)
		free(buf);
	else
		*ids = buf;
	return n;
}

int cmd_list(int argc, char **argv)
{
	struct hybd_dev_info info;
	uint32_t *ids;
	int json = 0, n, i, ret, shown = 0;
	char size[32];

	ret = json_opt_only("list", argc, argv, &json);
	if (ret >= 0)
		return ret;
	n = get_ids(&ids);
	if (n < 0)
		return failed("list", n);

	if (json)
		putchar('[');
	else
		printf("%-4s %-12s %-9s %-10s %6s %6s %8s\n", "ID", "DEVICE",
		       "STATE", "SIZE", "QUEUES", "DEPTH", "SERVER");
	for (i = 0; i < n; i++) {
		const struct hybd_param_basic *b = &info.params.basic;

		ret = hybd_ctl_info(ids[i], &info);
		if (ret == -ENODEV)
			continue;	/* deleted since the list was taken */
		if (ret < 0) {
			free(ids);
			if (json)
				printf("]\n");
			return failed("list", ret);
		}
		if (json) {
			/* the columns of the text, by info --json's names */
			printf("%s{\"id\":%u,\"path\":\"/dev/hybd%u\","
			       "\"state\":\"%s\",\"size\":%" PRIu64 ","
			       "\"nr_hw_queues\":%u,\"queue_depth\":%u,"
			       "\"server_pid\":%d,\"recovery_left_ms\":%u}",
			       shown ? "," : "", ids[i],
			       ids[i], state_name(info.state),
			       (uint64_t)b->dev_size, b->nr_hw_queues,
			       b->queue_depth, info.server_pid,
			       info.recovery_left_ms);
		} else {
			char dev[24], state[24];

			snprintf(dev, sizeof(dev), "/dev/hybd%u", ids[i]);
			human_size(b->dev_size, size, sizeof(size));
			state_text(&info, state, sizeof(state));
			printf("%-4u %-12s %-9s %-10s %6u %6u ", ids[i], dev,
			       state, size, b->nr_hw_queues, b->queue_depth);
			if (info.server_pid)
				printf("%8d\n", info.server_pid);
			else
				printf("%8s\n", "-");
		}
		shown++;
	}
	if (json)
		printf("]\n");
	free(ids);
	return EXIT_SUCCESS;
}

static void info_json(uint32_t id, const struct hybd_dev_info *info)
{
	const struct hybd_param_basic *b = &info->params.basic;
	const struct hybd_param_discard *d = &info->params.discard;

	printf("{\"id\":%u,\"path\":\"/dev/hybd%u\",\"state\":\"%s\","
	       "\"server_pid\":%d,", id, id, state_name(info->state),
	       info->server_pid);
	if (info->disk_major)
		printf("\"disk\":\"%u:%u\",", info->disk_major,
		       info->disk_minor);
	else
		printf("\"disk\":null,");
	printf("\"size\":%" PRIu64 ",\"logical_block_size\":%u,"
	       "\"physical_block_size\":%u,\"nr_hw_queues\":%u,"
	       "\"queue_depth\":%u,\"max_io_bytes\":%u,\"ops\":",
	       (uint64_t)b->dev_size, b->logical_bs, b->physical_bs,
	       b->nr_hw_queues, b->queue_depth, b->max_io_bytes);
	print_ops_json(b->ops);
	printf(",\"write_cache\":%s,\"zero_writes\":%s,\"poll_ns\":%u,"
	       "\"remap_poll\":%s,\"bio_front\":%s,\"io_timeout\":%u,",
	       b->flags & HYBD_DEV_F_WRITE_CACHE ? "true" : "false",
	       b->flags & HYBD_DEV_F_ZERO_WRITES ? "true" : "false",
	       b->poll_ns,
	       b->flags & HYBD_DEV_F_REMAP_POLL ? "true" : "false",
	       b->flags & HYBD_DEV_F_BIO_FRONT ? "true" : "false",
	       b->io_timeout);
	printf("\"recovery_timeout\":%u,\"recovery_left_ms\":%u,"
	       "\"recoveries\":%u,\"no_server_ns\":%" PRIu64 ",",
	       b->recovery_timeout, info->recovery_left_ms, info->recoveries,
	       (uint64_t)info->no_server_ns);
	printf("\"max_discard_bytes\":%u,\"discard_granularity\":%u,"
	       "\"max_write_zeroes_bytes\":%u,", d->max_discard_bytes,
	       d->discard_granularity, d->max_write_zeroes_bytes);
	printf("\"mem_bytes\":%" PRIu64 ",", (uint64_t)info->mem_bytes);
	if (info->owner_uid != UINT32_MAX)
		printf("\"owner_uid\":%u,\"owner_gid\":%u,", info->owner_uid,
		       info->owner_gid);
	else
		printf("\"owner_uid\":null,\"owner_gid\":null,");
	bpf_json(info);
	printf("\"bpf_attaches\":%u,\"stats\":{", info->bpf_attaches);
	counters_json(&info->stats);
	printf("}}\n");
}

static void info_text(uint32_t id, const struct hybd_dev_info *info)
{
	const struct hybd_param_basic *b = &info->params.basic;
	const struct hybd_param_discard *d = &info->params.discard;
	char buf[128], hs[32];

	printf("%-24s %u\n", "id", id);
	printf("%-24s /dev/hybd%u\n", "path", id);
	if (info->state == HYBD_STATE_WAITING)
		printf("%-24s waiting for a server (held I/O fails in %u.%03u s)\n",
		       "state", info->recovery_left_ms / 1000,
		       info->recovery_left_ms % 1000);
	else
		printf("%-24s %s\n", "state", state_name(info->state));
	if (info->server_pid)
		printf("%-24s %d\n", "server_pid", info->server_pid);
	else
		printf("%-24s none\n", "server_pid");
	if (info->disk_major)
		printf("%-24s %u:%u\n", "disk", info->disk_major,
		       info->disk_minor);
	else
		printf("%-24s none\n", "disk");
	printf("%-24s %" PRIu64 " (%s)\n", "size", (uint64_t)b->dev_size,
	       human_size(b->dev_size, hs, sizeof(hs)));
	printf("%-24s %u\n", "logical_block_size", b->logical_bs);
	printf("%-24s %u\n", "physical_block_size", b->physical_bs);
	printf("%-24s %u\n", "nr_hw_queues", b->nr_hw_queues);
	printf("%-24s %u\n", "queue_depth", b->queue_depth);
	printf("%-24s %u (%s)\n", "max_io_bytes", b->max_io_bytes,
	       human_size(b->max_io_bytes, hs, sizeof(hs)));
	ops_string(b->ops, buf, sizeof(buf));
	printf("%-24s %s\n", "ops", buf);
	printf("%-24s %s\n", "write_cache",
	       b->flags & HYBD_DEV_F_WRITE_CACHE ? "on" : "off");
	if (b->flags & HYBD_DEV_F_ZERO_WRITES)
		printf("%-24s %s\n", "zero_writes",
		       "on (zero writes may come as write-zeroes)");
	printf("%-24s %u\n", "poll_ns", b->poll_ns);
	if (b->flags & HYBD_DEV_F_REMAP_POLL)
		printf("%-24s %s\n", "remap_poll",
		       "on (the kernel's remap workers poll for poll_ns)");
	if (b->flags & HYBD_DEV_F_BIO_FRONT)
		printf("%-24s %s\n", "bio_front",
		       "on (map() remaps bios in front of hybdNq)");
	if (b->io_timeout)
		printf("%-24s %u s\n", "io_timeout", b->io_timeout);
	else
		printf("%-24s none\n", "io_timeout");
	if (b->recovery_timeout)
		printf("%-24s %u s\n", "recovery_timeout",
		       b->recovery_timeout);
	else
		printf("%-24s none\n", "recovery_timeout");
	printf("%-24s %u\n", "recoveries", info->recoveries);
	printf("%-24s %.3f s\n", "no_server_time",
	       info->no_server_ns / 1e9);
	/* the limits of operations the device offers, only */
	if (b->ops & HYBD_OPF_DISCARD) {
		printf("%-24s %u\n", "max_discard_bytes",
		       d->max_discard_bytes);
		printf("%-24s %u\n", "discard_granularity",
		       d->discard_granularity);
	}
	if (b->ops & HYBD_OPF_WRITE_ZEROES)
		printf("%-24s %u\n", "max_write_zeroes_bytes",
		       d->max_write_zeroes_bytes);
	printf("%-24s %" PRIu64 " (%s)\n", "mem_bytes",
	       (uint64_t)info->mem_bytes,
	       human_size(info->mem_bytes, hs, sizeof(hs)));
	if (info->owner_uid != UINT32_MAX)
		printf("%-24s uid %u, gid %u (unprivileged)\n", "owner",
		       info->owner_uid, info->owner_gid);
	if (has_bpf(info))
		printf("%-24s %.*s (link %u)\n", "bpf",
		       (int)sizeof(info->bpf_name), info->bpf_name,
		       info->bpf_link_id);
	else
		printf("%-24s none\n", "bpf");
	printf("%-24s %u\n", "bpf_attaches", info->bpf_attaches);
	printf("stats:\n");
	counters_text(&info->stats);
}

int cmd_info(int argc, char **argv)
{
	struct hybd_dev_info info;
	int json = 0, ret;
	uint32_t id;

	ret = parse_json_opt("info", argc, argv, &json);
	if (ret < 0)
		ret = one_dev_arg("info", argc, argv, &id);
	if (ret >= 0)
		return ret;
	ret = hybd_ctl_info(id, &info);
	if (ret < 0)
		return failed("info", ret);
	if (json)
		info_json(id, &info);
	else
		info_text(id, &info);
	return EXIT_SUCCESS;
}

int cmd_del(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "force", no_argument, NULL, 'f' },
		{ "in-use", no_argument, NULL, 'u' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	uint32_t id, flags = 0;
	int c, ret, check = 1;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			flags |= HYBD_DEL_F_FORCE;
			check = 0;
			break;
		case 'u':
			check = 0;
			break;
		case 'h':
			return command_help("del");
		default:
			return option_error("del", c, argv, opts);
		}
	}
	ret = one_dev_arg("del", argc, argv, &id);
	if (ret >= 0)
		return ret;
	if (check) {
		ret = check_in_use(id);
		if (ret >= 0)
			return ret;
	}
	ret = hybd_ctl_del_flags(id, flags);
	if (ret < 0)
		return failed("del", ret);
	return EXIT_SUCCESS;
}

/*
 * The loaded module's version (MODULE_VERSION, from the project's VERSION
 * file), or NULL if it has none or it cannot be read.
 */
static const char *module_version(char *buf, size_t size)
{
	FILE *f = fopen("/sys/module/hybd/version", "re");
	size_t len;

	if (!f)
		return NULL;
	if (!fgets(buf, (int)size, f))
		buf[0] = '\0';
	fclose(f);
	len = strcspn(buf, "\n");
	buf[len] = '\0';
	return len ? buf : NULL;
}

int cmd_features(int argc, char **argv)
{
	struct hybd_ctl_features f;
	int json = 0, ret, n = 0;
	char lib[32], mod_buf[64];
	const char *mod;
	size_t i;

	ret = json_opt_only("features", argc, argv, &json);
	if (ret >= 0)
		return ret;
	ret = hybd_ctl_features(&f);
	if (ret < 0)
		return failed("features", ret);
	/* the libhybd API this hybdctl was built against */
	/* the library that runs, which may be newer than our hybd.h */
	snprintf(lib, sizeof(lib), "%u.%u", hybd_lib_version() >> 16,
		 hybd_lib_version() & 0xffff);
	mod = module_version(mod_buf, sizeof(mod_buf));

	if (json) {
		printf("{\"abi_version\":%u,\"features\":%" PRIu64 ",\"names\":[",
		       f.abi_version, (uint64_t)f.features);
		for (i = 0; i < ARRAY_SIZE(feature_names); i++) {
			if (f.features & feature_names[i].bit)
				printf("%s\"%s\"", n++ ? "," : "",
				       feature_names[i].name);
		}
		printf("],\"library_version\":\"%s\",\"module_version\":", lib);
		if (mod)
			print_json_string(mod, strlen(mod));
		else
			printf("null");
		printf("}\n");
		return EXIT_SUCCESS;
	}
	printf("%-15s %u\n", "abi_version", f.abi_version);
	printf("%-15s 0x%" PRIx64, "features", (uint64_t)f.features);
	for (i = 0; i < ARRAY_SIZE(feature_names); i++) {
		if (f.features & feature_names[i].bit)
			printf(" %s", feature_names[i].name);
	}
	putchar('\n');
	printf("%-15s %s\n", "library_version", lib);
	printf("%-15s %s\n", "module_version", mod ? mod : "unknown");
	return EXIT_SUCCESS;
}

/* A plain decimal number that fits in 32 bits; -1 when fine. */
static int parse_u32(const char *opt, const char *s, uint32_t *v)
{
	char *end;
	unsigned long long n;

	errno = 0;
	n = strtoull(s, &end, 10);
	if (s[0] < '0' || s[0] > '9' || *end || errno || n > UINT32_MAX)
		return usage_error("add", "%s: '%s' is not a number below 2^32",
				   opt, s);
	*v = n;
	return -1;
}

/* A byte count (with suffix) that fits in 32 bits; -1 when fine. */
static int parse_bytes32(const char *opt, const char *s, uint32_t *v)
{
	uint64_t n;

	if (hybd_parse_size(s, &n) < 0)
		return usage_error("add", "%s: %s", opt, hybd_errmsg());
	if (n > UINT32_MAX)
		return usage_error("add", "%s: %s does not fit in 32 bits", opt,
				   s);
	*v = n;
	return -1;
}

enum {
	OPT_SIZE = 256, OPT_LBS, OPT_PBS, OPT_QUEUES, OPT_DEPTH, OPT_MAX_IO,
	OPT_OPS, OPT_NO_WC, OPT_POLL, OPT_ID, OPT_MAX_DISCARD,
	OPT_DISCARD_GRAN, OPT_MAX_WZ, OPT_IO_TIMEOUT, OPT_RECOVERY,
};

int cmd_add(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "size", required_argument, NULL, OPT_SIZE },
		{ "lbs", required_argument, NULL, OPT_LBS },
		{ "pbs", required_argument, NULL, OPT_PBS },
		{ "queues", required_argument, NULL, OPT_QUEUES },
		{ "depth", required_argument, NULL, OPT_DEPTH },
		{ "max-io", required_argument, NULL, OPT_MAX_IO },
		{ "ops", required_argument, NULL, OPT_OPS },
		{ "no-write-cache", no_argument, NULL, OPT_NO_WC },
		{ "poll-ns", required_argument, NULL, OPT_POLL },
		{ "io-timeout", required_argument, NULL, OPT_IO_TIMEOUT },
		{ "recovery", required_argument, NULL, OPT_RECOVERY },
		{ "id", required_argument, NULL, OPT_ID },
		{ "max-discard", required_argument, NULL, OPT_MAX_DISCARD },
		{ "discard-granularity", required_argument, NULL,
		  OPT_DISCARD_GRAN },
		{ "max-write-zeroes", required_argument, NULL, OPT_MAX_WZ },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct hybd_config cfg;
	int c, ret = -1, ops_given = 0;
	uint32_t id;

	hybd_config_init(&cfg);
	cfg.size = 64 << 20;
	optind = 1;
	opterr = 0;
	while (ret < 0 &&
	       (c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case OPT_SIZE:
			if (hybd_parse_size(optarg, &cfg.size) < 0)
				ret = usage_error("add", "--size: %s",
						  hybd_errmsg());
			break;
		case OPT_LBS:
			ret = parse_bytes32("--lbs", optarg,
					    &cfg.logical_block_size);
			break;
		case OPT_PBS:
			ret = parse_bytes32("--pbs", optarg,
					    &cfg.physical_block_size);
			break;
		case OPT_QUEUES:
			ret = parse_u32("--queues", optarg, &cfg.nr_queues);
			break;
		case OPT_DEPTH:
			ret = parse_u32("--depth", optarg, &cfg.queue_depth);
			break;
		case OPT_MAX_IO:
			ret = parse_bytes32("--max-io", optarg,
					    &cfg.max_io_bytes);
			break;
		case OPT_OPS:
			if (hybd_parse_ops(optarg, &cfg.ops) < 0)
				ret = usage_error("add", "--ops: %s",
						  hybd_errmsg());
			ops_given = 1;
			break;
		case OPT_NO_WC:
			cfg.flags &= ~HYBD_DEV_F_WRITE_CACHE;
			break;
		case OPT_POLL:
			ret = parse_u32("--poll-ns", optarg, &cfg.poll_ns);
			break;
		case OPT_IO_TIMEOUT:
			ret = parse_u32("--io-timeout", optarg,
					&cfg.io_timeout);
			break;
		case OPT_RECOVERY:
			ret = parse_u32("--recovery", optarg,
					&cfg.recovery_timeout);
			break;
		case OPT_ID:
			ret = parse_u32("--id", optarg, &id);
			if (ret < 0 && id > INT32_MAX)
				ret = usage_error("add", "--id: %s is too large",
						  optarg);
			cfg.dev_id = id;
			break;
		case OPT_MAX_DISCARD:
			ret = parse_bytes32("--max-discard", optarg,
					    &cfg.max_discard_bytes);
			break;
		case OPT_DISCARD_GRAN:
			ret = parse_bytes32("--discard-granularity", optarg,
					    &cfg.discard_granularity);
			break;
		case OPT_MAX_WZ:
			ret = parse_bytes32("--max-write-zeroes", optarg,
					    &cfg.max_write_zeroes_bytes);
			break;
		case 'h':
			return command_help("add");
		default:
			ret = option_error("add", c, argv, opts);
			break;
		}
	}
	if (ret >= 0)
		return ret;
	if (optind < argc)
		return usage_error("add", "unexpected argument '%s'",
				   argv[optind]);
	/* without a write cache there is nothing to flush */
	if (!(cfg.flags & HYBD_DEV_F_WRITE_CACHE) && !ops_given)
		cfg.ops &= ~(HYBD_OPF_FLUSH | HYBD_OPF_FUA);

	ret = hybd_ctl_add(&cfg, &id);
	if (ret < 0)
		return failed("add", ret);
	printf("%u\n", id);
	return EXIT_SUCCESS;
}

int cmd_resize(int argc, char **argv)
{
	struct hybd_dev_info info;
	uint64_t size;
	uint32_t id;
	char hs[32];
	int json = 0, ret;

	ret = parse_json_opt("resize", argc, argv, &json);
	if (ret < 0 && json)
		ret = usage_error("resize", "--json makes no sense here");
	if (ret >= 0)
		return ret;
	if (argc - optind != 2)
		return usage_error("resize", "%s", argc - optind < 2 ?
				   "wants DEV and SIZE" : "too many arguments");
	if (hybd_parse_dev(argv[optind], &id) < 0)
		return usage_error("resize", "%s", hybd_errmsg());
	if (hybd_parse_size(argv[optind + 1], &size) < 0)
		return usage_error("resize", "SIZE: %s", hybd_errmsg());
	ret = hybd_ctl_resize(id, size);
	if (ret < 0)
		return failed("resize", ret);
	if (!hybd_ctl_info(id, &info))
		size = info.params.basic.dev_size;
	printf("/dev/hybd%u is %" PRIu64 " bytes (%s)\n", id, size,
	       human_size(size, hs, sizeof(hs)));
	return EXIT_SUCCESS;
}
