// SPDX-License-Identifier: MIT
/*
 * hybdctl - list, inspect, add and delete hybd devices.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybd.h"

#define EXIT_FAILED	1	/* the operation failed */
#define EXIT_USAGE	2	/* the command line is wrong */

static const char usage_text[] =
"Usage: hybdctl COMMAND [ARGS]\n"
"\n"
"Commands:\n"
"  list [--json]           list the devices\n"
"  info DEV [--json]       show a device's state, parameters and counters\n"
"  features [--json]       show the module's ABI version and features\n"
"  add [OPTIONS]           add a device without a server (it stays \"added\")\n"
"                          and print its id\n"
"  del DEV                 delete a device (a served one is drained first)\n"
"  help, --help            show this help\n"
"  version, --version      show the version\n"
"\n"
"DEV is /dev/hybdN, hybdN or N.\n"
"\n"
"add options (BYTES takes a K, M, G or T suffix):\n"
"  --size BYTES            device size (default 64M)\n"
"  --lbs BYTES             logical block size (default 4096)\n"
"  --pbs BYTES             physical block size (default 4096)\n"
"  --queues N              hardware queues (default: one per online CPU)\n"
"  --depth N               queue depth (default 64)\n"
"  --max-io BYTES          largest request (default 1M)\n"
"  --ops LIST              comma-separated: read,write,flush,fua,discard,\n"
"                          write-zeroes or all (default all)\n"
"  --no-write-cache        no volatile write cache (drops flush and fua from\n"
"                          the default ops)\n"
"  --poll-ns N             worker busy-poll before sleeping (default 0)\n"
"  --id N                  wanted device id (default: any free one)\n"
"  --max-discard BYTES     discard limit (default: the kernel's)\n"
"  --discard-granularity BYTES\n"
"  --max-write-zeroes BYTES\n"
"\n"
"Exit status: 0 success, 1 the operation failed, 2 usage error.\n";

static const char *const state_names[] = {
	[HYBD_STATE_ADDED] = "added",
	[HYBD_STATE_LIVE] = "live",
	[HYBD_STATE_DEAD] = "dead",
	[HYBD_STATE_DELETING] = "deleting",
};

#define STAT(field) { #field, offsetof(struct hybd_dev_stats, field) }
static const struct {
	const char *name;
	size_t off;
} stat_fields[] = {
	STAT(slow_issued), STAT(slow_done), STAT(slow_errors),
	STAT(fast_done), STAT(fast_errors), STAT(failed_dead),
	STAT(reads), STAT(writes), STAT(flushes), STAT(fua), STAT(discards),
	STAT(write_zeroes), STAT(rej_bad_tag), STAT(rej_not_outstanding),
	STAT(rej_stale_seq), STAT(rej_bad_result), STAT(rej_ring_index),
	STAT(bpf_bad_ret),
};

static const struct {
	uint64_t bit;
	const char *name;
} feature_names[] = {
	{ HYBD_F_RINGS, "rings" },
	{ HYBD_F_POLL, "poll" },
	{ HYBD_F_SEQ_CHECK, "seq_check" },
	{ HYBD_F_BPF, "bpf" },
};

#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))

/* The operation failed: say what and why, return the exit code. */
static int failed(const char *cmd, int err)
{
	fprintf(stderr, "hybdctl: %s: %s (%s)\n", cmd, hybd_errmsg(),
		strerror(-err));
	return EXIT_FAILED;
}

static int usage_error(const char *cmd, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "hybdctl: %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'hybdctl --help'.\n");
	return EXIT_USAGE;
}

static const char *state_name(uint32_t state)
{
	return state < ARRAY_SIZE(state_names) ? state_names[state] : "unknown";
}

/* "64 MiB" when exact, else "1.5 GiB"; "" below 1 KiB. */
static const char *human_size(uint64_t bytes, char *buf, size_t size)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	unsigned int i;

	buf[0] = '\0';
	for (i = ARRAY_SIZE(units); i-- > 0;) {
		uint64_t unit = 1ULL << (10 * (i + 1));

		if (bytes < unit)
			continue;
		if (bytes % unit == 0)
			snprintf(buf, size, "%" PRIu64 " %s", bytes / unit,
				 units[i]);
		else
			snprintf(buf, size, "%.1f %s", (double)bytes / unit,
				 units[i]);
		break;
	}
	return buf;
}

static void print_json_string(const char *s, size_t max)
{
	size_t i;

	putchar('"');
	for (i = 0; i < max && s[i]; i++) {
		unsigned char c = s[i];

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

/* getopt_long with only --json (and --help); returns -1 when fine. */
static int parse_json_opt(const char *cmd, int argc, char **argv, int *json)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			*json = 1;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return EXIT_SUCCESS;
		default:
			return usage_error(cmd, "unknown option '%s'",
					   argv[optind - 1]);
		}
	}
	return -1;
}

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

static int cmd_list(int argc, char **argv)
{
	struct hybd_dev_info info;
	uint32_t *ids;
	int json = 0, n, i, ret, shown = 0;
	char size[32];

	ret = parse_json_opt("list", argc, argv, &json);
	if (ret >= 0)
		return ret;
	if (optind < argc)
		return usage_error("list", "unexpected argument '%s'",
				   argv[optind]);
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
			printf("%s{\"id\":%u,\"state\":\"%s\",\"size\":%" PRIu64
			       ",\"server_pid\":%d}", shown ? "," : "",
			       ids[i], state_name(info.state),
			       (uint64_t)b->dev_size, info.server_pid);
		} else {
			char dev[24];

			snprintf(dev, sizeof(dev), "/dev/hybd%u", ids[i]);
			human_size(b->dev_size, size, sizeof(size));
			printf("%-4u %-12s %-9s %-10s %6u %6u ", ids[i], dev,
			       state_name(info.state), size, b->nr_hw_queues,
			       b->queue_depth);
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

static void print_ops_json(uint32_t ops)
{
	uint32_t bit;
	int first = 1;

	putchar('[');
	for (bit = 1; bit; bit <<= 1) {
		const char *name = hybd_opf_name(bit);

		if (!(ops & bit) || !name)
			continue;
		printf("%s\"%s\"", first ? "" : ",", name);
		first = 0;
	}
	putchar(']');
}

static void ops_string(uint32_t ops, char *buf, size_t size)
{
	size_t len = 0;
	uint32_t bit;

	buf[0] = '\0';
	for (bit = 1; bit; bit <<= 1) {
		const char *name = hybd_opf_name(bit);

		if ((ops & bit) && name && len < size)
			len += snprintf(buf + len, size - len, "%s%s",
					len ? "," : "", name);
	}
	if (!len)
		snprintf(buf, size, "none");
}

static int has_bpf(const struct hybd_dev_info *info)
{
	return info->bpf_link_id || info->bpf_name[0];
}

static uint64_t stat_value(const struct hybd_dev_stats *s, size_t off)
{
	uint64_t v;

	memcpy(&v, (const char *)s + off, sizeof(v));
	return v;
}

static void info_json(uint32_t id, const struct hybd_dev_info *info)
{
	const struct hybd_param_basic *b = &info->params.basic;
	const struct hybd_param_discard *d = &info->params.discard;
	size_t i;

	printf("{\"id\":%u,\"state\":\"%s\",\"server_pid\":%d,", id,
	       state_name(info->state), info->server_pid);
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
	printf(",\"write_cache\":%s,\"poll_ns\":%u,",
	       b->flags & HYBD_DEV_F_WRITE_CACHE ? "true" : "false",
	       b->poll_ns);
	printf("\"max_discard_bytes\":%u,\"discard_granularity\":%u,"
	       "\"max_write_zeroes_bytes\":%u,", d->max_discard_bytes,
	       d->discard_granularity, d->max_write_zeroes_bytes);
	if (has_bpf(info)) {
		printf("\"bpf\":{\"name\":");
		print_json_string(info->bpf_name, sizeof(info->bpf_name));
		printf(",\"link_id\":%u},", info->bpf_link_id);
	} else {
		printf("\"bpf\":null,");
	}
	printf("\"bpf_attaches\":%u,\"stats\":{", info->bpf_attaches);
	for (i = 0; i < ARRAY_SIZE(stat_fields); i++)
		printf("%s\"%s\":%" PRIu64, i ? "," : "", stat_fields[i].name,
		       stat_value(&info->stats, stat_fields[i].off));
	printf("}}\n");
}

static void info_text(uint32_t id, const struct hybd_dev_info *info)
{
	const struct hybd_param_basic *b = &info->params.basic;
	const struct hybd_param_discard *d = &info->params.discard;
	char buf[128], hs[32];
	size_t i;

	printf("%-24s %u\n", "id", id);
	printf("%-24s /dev/hybd%u\n", "path", id);
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
	printf("%-24s %u\n", "poll_ns", b->poll_ns);
	printf("%-24s %u\n", "max_discard_bytes", d->max_discard_bytes);
	printf("%-24s %u\n", "discard_granularity", d->discard_granularity);
	printf("%-24s %u\n", "max_write_zeroes_bytes",
	       d->max_write_zeroes_bytes);
	if (has_bpf(info))
		printf("%-24s %.*s (link %u)\n", "bpf",
		       (int)sizeof(info->bpf_name), info->bpf_name,
		       info->bpf_link_id);
	else
		printf("%-24s none\n", "bpf");
	printf("%-24s %u\n", "bpf_attaches", info->bpf_attaches);
	printf("stats:\n");
	for (i = 0; i < ARRAY_SIZE(stat_fields); i++)
		printf("  %-22s %" PRIu64 "\n", stat_fields[i].name,
		       stat_value(&info->stats, stat_fields[i].off));
}

/* Parse the single DEV argument of info/del; -1 when fine. */
static int one_dev_arg(const char *cmd, int argc, char **argv, uint32_t *id)
{
	if (optind >= argc)
		return usage_error(cmd, "missing DEV");
	if (optind + 1 < argc)
		return usage_error(cmd, "unexpected argument '%s'",
				   argv[optind + 1]);
	if (hybd_parse_dev(argv[optind], id) < 0)
		return usage_error(cmd, "%s", hybd_errmsg());
	return -1;
}

static int cmd_info(int argc, char **argv)
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

static int cmd_del(int argc, char **argv)
{
	int json = 0, ret;
	uint32_t id;

	ret = parse_json_opt("del", argc, argv, &json);
	if (ret < 0 && json)
		ret = usage_error("del", "--json makes no sense here");
	if (ret < 0)
		ret = one_dev_arg("del", argc, argv, &id);
	if (ret >= 0)
		return ret;
	ret = hybd_ctl_del(id);
	if (ret < 0)
		return failed("del", ret);
	return EXIT_SUCCESS;
}

static int cmd_features(int argc, char **argv)
{
	struct hybd_ctl_features f;
	int json = 0, ret, n = 0;
	size_t i;

	ret = parse_json_opt("features", argc, argv, &json);
	if (ret >= 0)
		return ret;
	if (optind < argc)
		return usage_error("features", "unexpected argument '%s'",
				   argv[optind]);
	ret = hybd_ctl_features(&f);
	if (ret < 0)
		return failed("features", ret);

	if (json) {
		printf("{\"abi_version\":%u,\"features\":%" PRIu64 ",\"names\":[",
		       f.abi_version, (uint64_t)f.features);
		for (i = 0; i < ARRAY_SIZE(feature_names); i++) {
			if (f.features & feature_names[i].bit)
				printf("%s\"%s\"", n++ ? "," : "",
				       feature_names[i].name);
		}
		printf("]}\n");
		return EXIT_SUCCESS;
	}
	printf("%-12s %u\n", "abi_version", f.abi_version);
	printf("%-12s 0x%" PRIx64, "features", (uint64_t)f.features);
	for (i = 0; i < ARRAY_SIZE(feature_names); i++) {
		if (f.features & feature_names[i].bit)
			printf(" %s", feature_names[i].name);
	}
	putchar('\n');
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
	OPT_DISCARD_GRAN, OPT_MAX_WZ,
};

static int cmd_add(int argc, char **argv)
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
	       (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
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
			fputs(usage_text, stdout);
			return EXIT_SUCCESS;
		case ':':
		case '?':
		default:
			ret = usage_error("add", "unknown option or missing value: '%s'",
					  argv[optind - 1]);
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

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
} commands[] = {
	{ "list", cmd_list },
	{ "info", cmd_info },
	{ "features", cmd_features },
	{ "add", cmd_add },
	{ "del", cmd_del },
};

int main(int argc, char **argv)
{
	const char *cmd;
	size_t i;

	if (argc < 2) {
		fputs(usage_text, stderr);
		return EXIT_USAGE;
	}
	cmd = argv[1];
	if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") ||
	    !strcmp(cmd, "-h")) {
		fputs(usage_text, stdout);
		return EXIT_SUCCESS;
	}
	if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		printf("hybdctl %d.%d (hybd ABI %d)\n", HYBD_LIB_VERSION_MAJOR,
		       HYBD_LIB_VERSION_MINOR, HYBD_ABI_VERSION);
		return EXIT_SUCCESS;
	}
	for (i = 0; i < ARRAY_SIZE(commands); i++) {
		if (!strcmp(cmd, commands[i].name))
			return commands[i].fn(argc - 1, argv + 1);
	}
	fprintf(stderr, "hybdctl: unknown command '%s'\nTry 'hybdctl --help'.\n",
		cmd);
	return EXIT_USAGE;
}
