// SPDX-License-Identifier: MIT
/*
 * hybdctl - list, inspect, add and delete hybd devices; attach, replace and
 * detach their BPF fast path; show their counters and latency histograms.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/btf.h>

#include "hybd.h"

#define EXIT_FAILED	1	/* the operation failed */
#define EXIT_USAGE	2	/* the command line is wrong */

/*
 * Help.  Each command has a synopsis, a one-line summary (both shown by
 * `hybdctl --help`) and the text `hybdctl COMMAND --help` adds: its options
 * and what else it does.  The table of commands is at the end of the file.
 */
static const char general_help[] =
"DEV is /dev/hybdN, hybdN or N.  'hybdctl COMMAND --help' shows a command's\n"
"options.\n"
"\n"
"Exit status: 0 success; 1 the operation failed (the device does not exist,\n"
"the kernel refused, del found the device in use, ...); 2 usage error (an\n"
"unknown command or option, a missing or malformed argument).\n";

static const char list_opts[] =
"  --json        one JSON array of objects with the columns' values: id,\n"
"                path, state, size (bytes), nr_hw_queues, queue_depth,\n"
"                server_pid (0: no server), recovery_left_ms (waiting: how\n"
"                long held I/O waits for a new server)\n"
"  -h, --help    show this help\n";

static const char info_opts[] =
"  --json        one JSON object; the counters are in \"stats\"\n"
"  -h, --help    show this help\n";

static const char info_more[] =
"Shows the attached fast path (name, link id) and how many times one was\n"
"attached or replaced.  \"disk\" (major:minor) exists once a server has\n"
"started the device.\n";

static const char features_opts[] =
"  --json        one JSON object\n"
"  -h, --help    show this help\n";

static const char add_opts[] =
"  --size BYTES            device size (default 64M)\n"
"  --lbs BYTES             logical block size (default 4096)\n"
"  --pbs BYTES             physical block size (default 4096)\n"
"  --queues N              hardware queues (default: one per online CPU,\n"
"                          at most 8)\n"
"  --depth N               queue depth (default 64)\n"
"  --max-io BYTES          largest request (default 128K)\n"
"  --ops LIST              comma-separated: read,write,flush,fua,discard,\n"
"                          write-zeroes or all (default all)\n"
"  --no-write-cache        no volatile write cache (drops flush and fua from\n"
"                          the default ops)\n"
"  --poll-ns N             worker busy-poll before sleeping (default 0)\n"
"  --io-timeout SECONDS    fail a request the server has not completed in\n"
"                          time with EIO (default 30; 0: wait for ever)\n"
"  --recovery SECONDS      when the server dies, hold I/O this long for a\n"
"                          new one (default 0: fail it at once)\n"
"  --id N                  wanted device id (default: any free one)\n"
"  --max-discard BYTES     discard limit (default: the kernel's)\n"
"  --discard-granularity BYTES\n"
"  --max-write-zeroes BYTES\n"
"  -h, --help              show this help\n";

static const char add_more[] =
"BYTES takes a K, M, G or T suffix.  The device stays \"added\" (no\n"
"/dev/hybdN) until a server starts it; it is a way to check parameters.\n"
"Prints the new device's id.\n";

static const char del_opts[] =
"  --in-use      delete it even while it is in use; outstanding I/O is\n"
"                still drained through the server\n"
"  --force       delete it even while it is in use, and fail its\n"
"                outstanding I/O at once (data the server has not written\n"
"                is lost), also for a delete already under way\n"
"  -h, --help    show this help\n";

static const char del_more[] =
"Without --in-use or --force, del refuses (exit 1) a device that is in\n"
"use, naming the user: a file system mounted on it or on a partition, a\n"
"swap area, a holder (device-mapper, md, ...), a loop device backed by\n"
"it, a process that has it or a partition open (pid and command), or an\n"
"exclusive claim it cannot name (a mount in another mount namespace...).\n"
"The server's own node (/dev/hybdN-srv) does not count, nor a process\n"
"that closes the device within 3 s (udev probes every new disk).  A\n"
"device being deleted already is not checked.\n"
"\n"
"A served device is drained first: a server that does not answer holds\n"
"the delete up to the device's I/O timeout (30 s without one).  A signal\n"
"interrupts the wait; the delete goes on in the kernel.\n";

static const char attach_opts[] =
"  --replace     swap PROG for DEV's attached program atomically (no\n"
"                request is lost)\n"
"  -h, --help    show this help\n";

static const char attach_more[] =
"Loads PROG.bpf.o, built against bpf/hybd.bpf.h, and attaches it to DEV.\n"
"Link and maps are pinned under /sys/fs/bpf/hybd/N/ and stay after\n"
"hybdctl exits.  A program the verifier refuses is reported with the end\n"
"of its log.\n";

static const char detach_opts[] =
"  -h, --help    show this help\n";

static const char detach_more[] =
"Removes the pins; the kernel stops calling the program before this\n"
"returns.\n";

static const char stats_opts[] =
"  --json        one object: every counter, fast_lat and slow_lat (32\n"
"                counts, bucket i is [2^i, 2^(i+1)) ns), *_est (p50, p99,\n"
"                mean in ns), queues (--per-queue), maps (--maps)\n"
"  --per-queue   each hardware queue too\n"
"  --maps        the attached program's own counters: its global\n"
"                variables (.bss, .data), by map and name\n"
"  --watch S     again every S seconds (decimals are fine) with the fast\n"
"                and slow completion rates, until Ctrl-C; with --json one\n"
"                object per line\n"
"  -h, --help    show this help\n";

static const char stats_more[] =
"Fast- and slow-path completions, errors, rejected completions, requests\n"
"by kind and both latency histograms (from submission to completion, in\n"
"log2 buckets; p50/p99/mean are estimates from them).\n"
"\n"
"--maps shows each global variable of the program that is an integer (in\n"
"decimal) or an array of integers; anything else in hex, or not at all\n"
"above 64 bytes (null in JSON).  A program without global variables has\n"
"\"no counters\" (\"maps\": {}); without a fast path, \"maps\" is null.\n"
"They are found from the device's BPF link, so a program a driver\n"
"attached without pinning shows them too.\n";

static const char *const state_names[] = {
	[HYBD_STATE_ADDED] = "added",
	[HYBD_STATE_LIVE] = "live",
	[HYBD_STATE_DEAD] = "dead",
	[HYBD_STATE_DELETING] = "deleting",
	[HYBD_STATE_WAITING] = "waiting",
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
	STAT(bpf_bad_ret), STAT(timed_out), STAT(bpf_unfilled),
	STAT(bpf_pass_zeroes), STAT(held), STAT(reissued), STAT(remapped),
	STAT(remap_refused), STAT(remap_waited),
};

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
};

#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))

/* del checks the disk and this many of its partitions */
#define HYBD_MAX_PARTS_SHOWN	64

/*
 * The operation failed: say what and why, return the exit code.  The
 * errno's text follows libhybd's message unless that says it already.  A
 * message of several lines (a refused BPF program) has its summary first;
 * the details follow, indented.
 */
static int failed(const char *cmd, int err)
{
	const char *msg = hybd_errmsg(), *nl = strchr(msg, '\n'), *p;
	const char *why = strerror(-err);
	char tail[128] = "";

	if (!strstr(msg, why))
		snprintf(tail, sizeof(tail), " (%s)", why);
	if (!nl) {
		fprintf(stderr, "hybdctl: %s: %s%s\n", cmd, msg, tail);
		return EXIT_FAILED;
	}
	fprintf(stderr, "hybdctl: %s: %.*s%s\n", cmd, (int)(nl - msg), msg,
		tail);
	for (p = nl + 1; *p; p = nl + 1) {
		nl = strchr(p, '\n');
		if (!nl)
			nl = p + strlen(p);
		fprintf(stderr, "  %.*s\n", (int)(nl - p), p);
		if (!*nl)
			break;
	}
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
	fprintf(stderr, "\nTry 'hybdctl %s --help'.\n", cmd);
	return EXIT_USAGE;
}

/* The command's help on stdout; EXIT_SUCCESS.  Defined after the table. */
static int command_help(const char *cmd);

/*
 * getopt_long() returned '?' or ':' (@c) for the option at argv[optind - 1]:
 * say which option was wrong and how, as a usage error.  @opts are the
 * command's long options.
 */
static int option_error(const char *cmd, int c, char **argv,
			const struct option *opts)
{
	const char *arg = argv[optind - 1], *eq;
	size_t len;

	if (c == ':')
		return usage_error(cmd, "option '%s' needs a value", arg);
	if (optopt && (arg[0] != '-' || arg[1] != '-'))
		return usage_error(cmd, "unknown option '-%c'", optopt);
	/* "--json=x": a known option given a value it does not take */
	eq = strchr(arg, '=');
	len = eq ? (size_t)(eq - arg) : 0;
	for (; eq && opts->name; opts++) {
		if (len > 2 && !strncmp(opts->name, arg + 2, len - 2) &&
		    opts->has_arg == no_argument)
			return usage_error(cmd, "option '--%s' takes no value",
					   opts->name);
	}
	return usage_error(cmd, "unknown option '%s'", arg);
}

/* "waiting:12s" for a device holding I/O for a new server (list). */
static const char *state_text(const struct hybd_dev_info *info, char *buf,
			      size_t size);

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
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			*json = 1;
			break;
		case 'h':
			return command_help(cmd);
		default:
			return option_error(cmd, c, argv, opts);
		}
	}
	return -1;
}

/* No argument but --json (and --help), for list and features; -1 when fine. */
static int json_opt_only(const char *cmd, int argc, char **argv, int *json)
{
	int ret = parse_json_opt(cmd, argc, argv, json);

	if (ret < 0 && optind < argc)
		ret = usage_error(cmd, "unexpected argument '%s'",
				  argv[optind]);
	return ret;
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

/* The "bpf" member of a device's JSON object, with its trailing comma. */
static void bpf_json(const struct hybd_dev_info *info)
{
	if (has_bpf(info)) {
		printf("\"bpf\":{\"name\":");
		print_json_string(info->bpf_name, sizeof(info->bpf_name));
		printf(",\"link_id\":%u},", info->bpf_link_id);
	} else {
		printf("\"bpf\":null,");
	}
}

static uint64_t stat_value(const struct hybd_dev_stats *s, size_t off)
{
	uint64_t v;

	memcpy(&v, (const char *)s + off, sizeof(v));
	return v;
}

static void counters_json(const struct hybd_dev_stats *c)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(stat_fields); i++)
		printf("%s\"%s\":%" PRIu64, i ? "," : "", stat_fields[i].name,
		       stat_value(c, stat_fields[i].off));
}

static const char *state_text(const struct hybd_dev_info *info, char *buf,
			      size_t size)
{
	if (info->state == HYBD_STATE_WAITING)
		snprintf(buf, size, "waiting:%us",
			 (info->recovery_left_ms + 999) / 1000);
	else
		snprintf(buf, size, "%s", state_name(info->state));
	return buf;
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
	       "\"io_timeout\":%u,",
	       b->flags & HYBD_DEV_F_WRITE_CACHE ? "true" : "false",
	       b->flags & HYBD_DEV_F_ZERO_WRITES ? "true" : "false",
	       b->poll_ns, b->io_timeout);
	printf("\"recovery_timeout\":%u,\"recovery_left_ms\":%u,"
	       "\"recoveries\":%u,\"no_server_ns\":%" PRIu64 ",",
	       b->recovery_timeout, info->recovery_left_ms, info->recoveries,
	       (uint64_t)info->no_server_ns);
	printf("\"max_discard_bytes\":%u,\"discard_granularity\":%u,"
	       "\"max_write_zeroes_bytes\":%u,", d->max_discard_bytes,
	       d->discard_granularity, d->max_write_zeroes_bytes);
	printf("\"mem_bytes\":%" PRIu64 ",", (uint64_t)info->mem_bytes);
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
	size_t i;

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

/* DEV alone (--json makes no sense), for del and detach; -1 when fine. */
static int dev_arg_only(const char *cmd, int argc, char **argv, uint32_t *id)
{
	int json = 0, ret = parse_json_opt(cmd, argc, argv, &json);

	if (ret < 0 && json)
		ret = usage_error(cmd, "--json makes no sense here");
	if (ret < 0)
		ret = one_dev_arg(cmd, argc, argv, id);
	return ret;
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

/* ------------------------------------------------------- del's in-use check */

/* One block device of a disk: the whole disk or a partition. */
struct blk_node {
	dev_t devt;
	char name[64];		/* hybd0, hybd0p1: /dev/<name> */
};

/* What del found using a disk. */
struct in_use {
	struct blk_node nodes[HYBD_MAX_PARTS_SHOWN];
	size_t nr_nodes;
	char *why;		/* the reasons, "; "-separated */
	size_t len, size;
	int nr;			/* reasons found, also those not in @why */
	int explained;		/* a reason that explains an exclusive claim */
};

/* how long del lets transient openers (udev's probe) go away */
#define IN_USE_SETTLE_MS	3000
/* how long the probing open may take */
#define IN_USE_PROBE_MS		5000
/* openers named per block device */
#define IN_USE_PIDS_SHOWN	5

static void in_use_add(struct in_use *u, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void in_use_add(struct in_use *u, const char *fmt, ...)
{
	char *item, *p, *end;
	va_list ap;
	size_t n;
	int ret;

	u->nr++;
	va_start(ap, fmt);
	ret = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (ret < 0)
		return;
	n = ret;
	item = malloc(n + 1);
	if (!item)
		return;
	va_start(ap, fmt);
	vsnprintf(item, n + 1, fmt, ap);
	va_end(ap);
	/* said already (a mount point mounted over itself): once is enough */
	for (p = u->why; p && p < u->why + u->len; p = end + 2) {
		end = strstr(p, "; ");
		if (!end)
			end = u->why + u->len;
		if ((size_t)(end - p) == n && !memcmp(p, item, n))
			goto out;
	}
	/* room for "; ", it and a NUL */
	if (u->len + n + 3 > u->size) {
		size_t size = (u->len + n + 3) * 2;

		p = realloc(u->why, size);
		if (!p)
			goto out;
		u->why = p;
		u->size = size;
	}
	if (u->len) {
		memcpy(u->why + u->len, "; ", 2);
		u->len += 2;
	}
	memcpy(u->why + u->len, item, n + 1);
	u->len += n;
out:
	free(item);
}

/* The first line of a small file, without its newline; -1 if unreadable. */
static int read_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "re");
	int ok;

	if (!f)
		return -1;
	ok = fgets(buf, size, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

/* "major:minor" of a sysfs dev file; -1 if unreadable. */
static int read_devt(const char *path, dev_t *devt)
{
	unsigned int maj, min;
	char buf[32];

	if (read_line(path, buf, sizeof(buf)) ||
	    sscanf(buf, "%u:%u", &maj, &min) != 2)
		return -1;
	*devt = makedev(maj, min);
	return 0;
}

static const struct blk_node *node_of(const struct in_use *u, dev_t devt)
{
	size_t i;

	for (i = 0; i < u->nr_nodes; i++) {
		if (u->nodes[i].devt == devt)
			return &u->nodes[i];
	}
	return NULL;
}

/* The node a path names: "/dev/<name>", or a block special file of ours. */
static const struct blk_node *node_of_path(const struct in_use *u,
					   const char *path)
{
	struct stat st;
	size_t i;

	for (i = 0; i < u->nr_nodes; i++) {
		if (!strncmp(path, "/dev/", 5) &&
		    !strcmp(path + 5, u->nodes[i].name))
			return &u->nodes[i];
	}
	if (path[0] == '/' && !stat(path, &st) && S_ISBLK(st.st_mode))
		return node_of(u, st.st_rdev);
	return NULL;
}

/* The disk @devt of device @id and its partitions, from sysfs. */
static void find_nodes(struct in_use *u, dev_t devt, uint32_t id)
{
	char dir[64], path[PATH_MAX], link[PATH_MAX];
	struct blk_node *n = &u->nodes[0];
	struct dirent *de;
	ssize_t len;
	DIR *d;

	snprintf(dir, sizeof(dir), "/sys/dev/block/%u:%u", major(devt),
		 minor(devt));
	n->devt = devt;
	len = readlink(dir, link, sizeof(link) - 1);
	link[len > 0 ? len : 0] = '\0';
	if (strrchr(link, '/'))
		snprintf(n->name, sizeof(n->name), "%s", strrchr(link, '/') + 1);
	else
		snprintf(n->name, sizeof(n->name), "hybd%u", id);
	u->nr_nodes = 1;
	d = opendir(dir);
	if (!d)
		return;
	while ((de = readdir(d)) && u->nr_nodes < ARRAY_SIZE(u->nodes)) {
		n = &u->nodes[u->nr_nodes];
		snprintf(path, sizeof(path), "%s/%s/partition", dir, de->d_name);
		if (de->d_name[0] == '.' || access(path, F_OK))
			continue;
		snprintf(path, sizeof(path), "%s/%s/dev", dir, de->d_name);
		if (read_devt(path, &n->devt))
			continue;
		snprintf(n->name, sizeof(n->name), "%.63s", de->d_name);
		u->nr_nodes++;
	}
	closedir(d);
}

/* Undo the octal escapes (\040) of /proc/self/mountinfo and /proc/swaps. */
static void unescape(char *s)
{
	char *out = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' &&
		    s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
			*out++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 |
					(s[3] - '0'));
			s += 3;
		} else {
			*out++ = *s;
		}
	}
	*out = '\0';
}

/*
 * Mounts in our mount namespace of any node: by the major:minor field or
 * by the source (btrfs shows an anonymous major:minor).
 */
static void check_mounts(struct in_use *u)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL, *tok, *save, *mnt, *src;
	const struct blk_node *n;
	unsigned int maj, min;
	size_t cap = 0;
	int field, dash;

	if (!f)
		return;
	while (getline(&line, &cap, f) > 0) {
		mnt = src = NULL;
		maj = min = 0;
		dash = 0;
		field = 0;
		for (tok = strtok_r(line, " \n", &save); tok;
		     tok = strtok_r(NULL, " \n", &save), field++) {
			if (field == 2 && sscanf(tok, "%u:%u", &maj, &min) != 2)
				maj = min = 0;
			else if (field == 4)
				mnt = tok;
			else if (!dash && field > 5 && !strcmp(tok, "-"))
				dash = field;
			else if (dash && field == dash + 2)
				src = tok;
		}
		if (!mnt)
			continue;
		n = node_of(u, makedev(maj, min));
		if (!n && src) {
			unescape(src);
			n = node_of_path(u, src);
		}
		if (!n)
			continue;
		unescape(mnt);
		in_use_add(u, "/dev/%s is mounted on %s", n->name, mnt);
		u->explained = 1;
	}
	free(line);
	fclose(f);
}

static void check_swaps(struct in_use *u)
{
	FILE *f = fopen("/proc/swaps", "re");
	const struct blk_node *n;
	char *line = NULL;
	size_t cap = 0;

	if (!f)
		return;
	while (getline(&line, &cap, f) > 0) {
		line[strcspn(line, " \t\n")] = '\0';
		unescape(line);
		n = node_of_path(u, line);
		if (n) {
			in_use_add(u, "/dev/%s is in use as swap", n->name);
			u->explained = 1;
		}
	}
	free(line);
	fclose(f);
}

/* holders/ of each node: device-mapper, md, bcache... on top of it. */
static void check_holders(struct in_use *u)
{
	char path[PATH_MAX], name[128];
	struct dirent *de;
	size_t i;
	DIR *d;

	for (i = 0; i < u->nr_nodes; i++) {
		snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/holders",
			 major(u->nodes[i].devt), minor(u->nodes[i].devt));
		d = opendir(path);
		if (!d)
			continue;
		while ((de = readdir(d))) {
			if (de->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "/sys/class/block/%s/dm/name",
				 de->d_name);
			if (read_line(path, name, sizeof(name)) || !name[0])
				in_use_add(u, "/dev/%s is held by %s",
					   u->nodes[i].name, de->d_name);
			else
				in_use_add(u, "/dev/%s is held by %s (%s)",
					   u->nodes[i].name, de->d_name, name);
			u->explained = 1;
		}
		closedir(d);
	}
}

/* A loop device keeps its backing file open from the kernel. */
static void check_loops(struct in_use *u)
{
	char path[PATH_MAX], file[PATH_MAX];
	const struct blk_node *n;
	struct dirent *de;
	DIR *d = opendir("/sys/block");

	if (!d)
		return;
	while ((de = readdir(d))) {
		if (strncmp(de->d_name, "loop", 4))
			continue;
		snprintf(path, sizeof(path), "/sys/block/%s/loop/backing_file",
			 de->d_name);
		if (read_line(path, file, sizeof(file)))
			continue;
		n = node_of_path(u, file);
		if (n)
			in_use_add(u, "/dev/%s backs /dev/%s", n->name,
				   de->d_name);
	}
	closedir(d);
}

/* Does process @pid have a node open?  Its descriptors, followed. */
static void pid_opens(const char *pid, const struct in_use *u, int *open)
{
	char dir[64], path[PATH_MAX], target[16];
	const struct blk_node *n;
	struct dirent *de;
	struct stat st;
	DIR *d;

	snprintf(dir, sizeof(dir), "/proc/%.20s/fd", pid);
	d = opendir(dir);
	if (!d)
		return;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		/* sockets, pipes, anon inodes: nothing to stat */
		if (readlink(path, target, sizeof(target)) < 1 ||
		    target[0] != '/')
			continue;
		if (stat(path, &st) || !S_ISBLK(st.st_mode))
			continue;
		n = node_of(u, st.st_rdev);
		if (n)
			open[n - u->nodes] = 1;
	}
	closedir(d);
}

/*
 * The processes that hold a node open, as "pid 12 (cat), pid 34 (fio)"
 * per node in @who (empty if none).  Returns how many nodes are open.
 */
static int scan_openers(const struct in_use *u,
			char who[][IN_USE_PIDS_SHOWN * 40 + 32])
{
	int open[HYBD_MAX_PARTS_SHOWN], shown[HYBD_MAX_PARTS_SHOWN] = { 0 };
	int more[HYBD_MAX_PARTS_SHOWN] = { 0 }, nodes = 0;
	char self[16], comm[32], path[64];
	struct dirent *de;
	size_t i, len;
	DIR *d;

	for (i = 0; i < u->nr_nodes; i++)
		who[i][0] = '\0';
	d = opendir("/proc");
	if (!d)
		return 0;
	snprintf(self, sizeof(self), "%d", (int)getpid());
	while ((de = readdir(d))) {
		if (!isdigit((unsigned char)de->d_name[0]) ||
		    !strcmp(de->d_name, self))
			continue;
		memset(open, 0, sizeof(open));
		pid_opens(de->d_name, u, open);
		for (i = 0; i < u->nr_nodes; i++) {
			if (!open[i])
				continue;
			if (shown[i] == IN_USE_PIDS_SHOWN) {
				more[i]++;
				continue;
			}
			snprintf(path, sizeof(path), "/proc/%.20s/comm",
				 de->d_name);
			if (read_line(path, comm, sizeof(comm)))
				snprintf(comm, sizeof(comm), "?");
			len = strlen(who[i]);
			snprintf(who[i] + len, sizeof(who[i]) - len,
				 "%spid %s (%s)", len ? ", " : "", de->d_name,
				 comm);
			nodes += !shown[i]++;
		}
	}
	closedir(d);
	for (i = 0; i < u->nr_nodes; i++) {
		len = strlen(who[i]);
		if (more[i])
			snprintf(who[i] + len, sizeof(who[i]) - len,
				 " and %d more", more[i]);
	}
	return nodes;
}

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/*
 * Processes with a node open, fuser-style.  One that closes it within
 * IN_USE_SETTLE_MS is not counted: udev probes every new disk.
 */
static void check_openers(struct in_use *u)
{
	static char who[HYBD_MAX_PARTS_SHOWN][IN_USE_PIDS_SHOWN * 40 + 32];
	unsigned int waited;
	size_t i;

	for (waited = 0; scan_openers(u, who) && waited < IN_USE_SETTLE_MS;
	     waited += 100)
		sleep_ms(100);
	for (i = 0; i < u->nr_nodes; i++) {
		if (!who[i][0])
			continue;
		in_use_add(u, "/dev/%s is open in %s", u->nodes[i].name, who[i]);
		u->explained = 1;	/* one of them may hold it exclusively */
	}
}

/*
 * What the checks above cannot see (a mount in another mount namespace, a
 * btrfs or md member, a process in another pid namespace...): an exclusive
 * open of the whole disk fails with EBUSY while it or a partition is
 * claimed.  Opening a block device can wait (for the disk's open mutex,
 * or a partition scan a stuck server does not serve), so a child does it,
 * and a child that does not answer in time is left to finish alone.
 */
static void probe_exclusive(struct in_use *u)
{
	const struct blk_node *n = &u->nodes[0];
	unsigned int waited;
	char path[80];
	struct stat st;
	int status, fd;
	pid_t pid, got;

	snprintf(path, sizeof(path), "/dev/%s", n->name);
	if (stat(path, &st) || !S_ISBLK(st.st_mode) || st.st_rdev != n->devt)
		return;		/* no node to open: the checks above must do */
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return;
	if (!pid) {
		/* read-only: closing it makes no inotify write event */
		fd = open(path, O_RDONLY | O_EXCL | O_NONBLOCK | O_CLOEXEC);
		_exit(fd < 0 ? (errno & 0xff) : 0);
	}
	for (waited = 0; waited < IN_USE_PROBE_MS; waited += 10) {
		got = waitpid(pid, &status, WNOHANG);
		if (got == pid || (got < 0 && errno != EINTR))
			break;
		sleep_ms(10);
	}
	if (waited >= IN_USE_PROBE_MS) {
		kill(pid, SIGKILL);
		in_use_add(u, "%s cannot be checked: opening it took over %u s (is its server stopped?)",
			   path, IN_USE_PROBE_MS / 1000);
		return;
	}
	if (got == pid && WIFEXITED(status) && WEXITSTATUS(status) == EBUSY &&
	    !u->explained)
		in_use_add(u, "%s is claimed exclusively (a mount in another mount namespace, a RAID or volume member, ...)",
			   path);
}

/*
 * Is device @id in use?  Prints why and returns EXIT_FAILED if it is, -1
 * if it is not (or cannot be checked: no block device yet, a delete under
 * way, an error the delete itself will report).
 */
static int check_in_use(uint32_t id)
{
	struct hybd_dev_info info;
	struct in_use u;

	if (hybd_ctl_info(id, &info) || !info.disk_major ||
	    info.state == HYBD_STATE_DELETING)
		return -1;
	memset(&u, 0, sizeof(u));
	find_nodes(&u, makedev(info.disk_major, info.disk_minor), id);
	check_mounts(&u);
	check_swaps(&u);
	check_holders(&u);
	check_loops(&u);
	check_openers(&u);
	if (info.state == HYBD_STATE_LIVE || info.state == HYBD_STATE_DEAD)
		probe_exclusive(&u);
	if (!u.nr)
		return -1;
	fprintf(stderr, "hybdctl: del: %s (use --in-use or --force to delete anyway)\n",
		u.len ? u.why : "the device is in use");
	free(u.why);
	return EXIT_FAILED;
}

static int cmd_del(int argc, char **argv)
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

static int cmd_features(int argc, char **argv)
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

/* ------------------------------------------------------------ fast path */

/* "cache (link 12)" of a device's info, or "" if it has no fast path. */
static void bpf_desc(const struct hybd_dev_info *info, char *buf, size_t size)
{
	buf[0] = '\0';
	if (has_bpf(info))
		snprintf(buf, size, "%.*s (link %u)",
			 (int)sizeof(info->bpf_name), info->bpf_name,
			 info->bpf_link_id);
}

static int cmd_attach(int argc, char **argv)
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

static int cmd_detach(int argc, char **argv)
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

/* ------------------------------------------------------ program counters */

/*
 * The attached program's own counters: its global variables, which libbpf
 * keeps in one array map per section (.bss, .data; "cache.bss").  They are
 * found from the device's link, not from the pins (libhybd pins no
 * internal map, and a program a driver attached is not pinned at all):
 * link -> struct_ops map, whose value holds the id of each callback's
 * program -> the maps those programs use -> the ones whose BTF value type
 * is a .bss or .data DATASEC, read and shown variable by variable.
 */

/* one variable: its map and name, its value as text and as JSON */
struct prog_counter {
	char map[BPF_OBJ_NAME_LEN];
	char *name;
	char *text;
	char *json;
};

struct prog_counters {
	int attached;			/* a fast path is attached */
	size_t nr;
	struct prog_counter *v;
	char err[160];			/* why they could not be read, or "" */
};

#define MAX_OPS_PROGS	16
#define MAX_PROG_MAPS	64
#define MAX_ARRAY_SHOWN	64	/* elements of an array of integers */
#define MAX_HEX_SHOWN	64	/* bytes of anything else */

static void prog_counters_free(struct prog_counters *pc)
{
	size_t i;

	for (i = 0; i < pc->nr; i++) {
		free(pc->v[i].name);
		free(pc->v[i].text);
		free(pc->v[i].json);
	}
	free(pc->v);
	memset(pc, 0, sizeof(*pc));
}

static const struct btf_type *skip_mods(const struct btf *btf, __u32 *id)
{
	const struct btf_type *t = btf__type_by_id(btf, *id);

	while (t && (btf_is_mod(t) || btf_is_typedef(t))) {
		*id = t->type;
		t = btf__type_by_id(btf, *id);
	}
	return t;
}

/* An integer of 1, 2, 4 or 8 bytes (or an enum): its size, or 0. */
static unsigned int int_size(const struct btf_type *t, int *is_signed)
{
	*is_signed = 0;
	if (btf_is_int(t)) {
		if (btf_int_offset(t) || btf_int_bits(t) != t->size * 8)
			return 0;	/* a bit field */
		*is_signed = !!(btf_int_encoding(t) & BTF_INT_SIGNED);
	} else if (btf_is_any_enum(t)) {
		*is_signed = btf_kflag(t);
	} else {
		return 0;
	}
	return t->size == 1 || t->size == 2 || t->size == 4 || t->size == 8 ?
	       t->size : 0;
}

static void put_int(FILE *f, const unsigned char *p, unsigned int size,
		    int is_signed)
{
	uint64_t u = 0;
	int64_t i;

	switch (size) {
	case 1: { uint8_t v; memcpy(&v, p, 1); u = v; i = (int8_t)v; break; }
	case 2: { uint16_t v; memcpy(&v, p, 2); u = v; i = (int16_t)v; break; }
	case 4: { uint32_t v; memcpy(&v, p, 4); u = v; i = (int32_t)v; break; }
	default: memcpy(&u, p, 8); i = (int64_t)u; break;
	}
	if (is_signed)
		fprintf(f, "%" PRId64, i);
	else
		fprintf(f, "%" PRIu64, u);
}

/*
 * Format the variable of type @id at @p (@size bytes): an integer in
 * decimal, an array of up to MAX_ARRAY_SHOWN integers as a list, anything
 * else of up to MAX_HEX_SHOWN bytes in hex, larger ones not at all.
 */
static void format_var(const struct btf *btf, __u32 id, const unsigned char *p,
		       __u32 size, FILE *text, FILE *json)
{
	const struct btf_type *t = skip_mods(btf, &id), *et;
	unsigned int isz, i, n;
	__u32 eid;
	int sgn;

	if (t && (isz = int_size(t, &sgn)) && isz == size) {
		put_int(text, p, isz, sgn);
		put_int(json, p, isz, sgn);
		return;
	}
	if (t && btf_is_array(t)) {
		eid = btf_array(t)->type;
		et = skip_mods(btf, &eid);
		n = btf_array(t)->nelems;
		isz = et ? int_size(et, &sgn) : 0;
		if (isz && (uint64_t)n * isz == size && n <= MAX_ARRAY_SHOWN) {
			fputc('[', text);
			fputc('[', json);
			for (i = 0; i < n; i++) {
				fputs(i ? ", " : "", text);
				fputs(i ? "," : "", json);
				put_int(text, p + i * isz, isz, sgn);
				put_int(json, p + i * isz, isz, sgn);
			}
			fputc(']', text);
			fputc(']', json);
			return;
		}
	}
	if (size > MAX_HEX_SHOWN) {
		fprintf(text, "(%u bytes, not shown)", size);
		fputs("null", json);
		return;
	}
	fputs("0x", text);
	fputs("\"0x", json);
	for (i = 0; i < size; i++) {
		fprintf(text, "%02x", p[i]);
		fprintf(json, "%02x", p[i]);
	}
	fputc('"', json);
}

static int counters_add(struct prog_counters *pc, const char *map,
			const char *name)
{
	struct prog_counter *v = realloc(pc->v, (pc->nr + 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	pc->v = v;
	v += pc->nr;
	memset(v, 0, sizeof(*v));
	snprintf(v->map, sizeof(v->map), "%s", map);
	v->name = strdup(name);
	if (!v->name)
		return -ENOMEM;
	pc->nr++;
	return 0;
}

/* The variables of map @map_id, if it holds a .bss or .data section. */
static int read_global_map(struct prog_counters *pc, __u32 map_id)
{
	const struct btf_var_secinfo *vs;
	struct bpf_map_info mi;
	__u32 len = sizeof(mi), key = 0, i;
	const struct btf_type *t, *var;
	struct prog_counter *v;
	struct btf *btf = NULL;
	unsigned char *val = NULL;
	const char *sec;
	size_t tsz, jsz;
	FILE *text, *json;
	int fd, ret;

	fd = bpf_map_get_fd_by_id(map_id);
	if (fd < 0)
		return fd == -ENOENT ? 0 : fd;	/* gone meanwhile */
	memset(&mi, 0, sizeof(mi));
	ret = bpf_map_get_info_by_fd(fd, &mi, &len);
	if (ret || mi.type != BPF_MAP_TYPE_ARRAY || !mi.btf_id ||
	    !mi.btf_value_type_id || !mi.value_size)
		goto out;
	btf = btf__load_from_kernel_by_id(mi.btf_id);
	if (!btf) {
		ret = -errno;
		goto out;
	}
	t = btf__type_by_id(btf, mi.btf_value_type_id);
	sec = t ? btf__name_by_offset(btf, t->name_off) : NULL;
	if (!t || !btf_is_datasec(t) || !sec ||
	    (strncmp(sec, ".bss", 4) && strncmp(sec, ".data", 5)))
		goto out;	/* a map, .rodata or .kconfig */
	val = calloc(1, mi.value_size);
	if (!val) {
		ret = -ENOMEM;
		goto out;
	}
	ret = bpf_map_lookup_elem(fd, &key, val);
	if (ret)
		goto out;
	vs = btf_var_secinfos(t);
	for (i = 0; i < btf_vlen(t); i++, vs++) {
		var = btf__type_by_id(btf, vs->type);
		if (!var || !btf_is_var(var) ||
		    (uint64_t)vs->offset + vs->size > mi.value_size)
			continue;
		ret = counters_add(pc, mi.name,
				   btf__name_by_offset(btf, var->name_off));
		if (ret)
			goto out;
		v = &pc->v[pc->nr - 1];
		text = open_memstream(&v->text, &tsz);
		json = open_memstream(&v->json, &jsz);
		if (text && json)
			format_var(btf, var->type, val + vs->offset, vs->size,
				   text, json);
		if (text)
			fclose(text);
		if (json)
			fclose(json);
		if (!v->text || !v->json) {
			ret = -ENOMEM;
			goto out;
		}
	}
out:
	free(val);
	btf__free(btf);
	close(fd);
	return ret;
}

/* The BTF of vmlinux, loaded once (several MB: --watch asks again). */
static struct btf *vmlinux_btf(void)
{
	static struct btf *btf;

	if (!btf)
		btf = btf__load_vmlinux_btf();
	return btf;
}

/*
 * The ids of the programs of struct_ops map @fd (at most @room): the
 * kernel's view of the map's value has each callback's program id where
 * the user space value had its fd.  Returns the count or -errno.
 */
static int ops_prog_ids(int fd, __u32 *ids, int room)
{
	const struct btf_type *vt, *dt;
	const struct btf_member *m;
	struct bpf_map_info mi;
	__u32 len = sizeof(mi), key = 0, id, i, j;
	struct btf *base, *btf = NULL;
	unsigned char *val = NULL;
	size_t data_off = 0, psz;
	int n = 0, ret, found = 0;
	uint64_t prog;

	memset(&mi, 0, sizeof(mi));
	ret = bpf_map_get_info_by_fd(fd, &mi, &len);
	if (ret)
		return ret;
	base = vmlinux_btf();
	if (!base)
		return -errno;
	if (mi.btf_vmlinux_id)
		btf = btf__load_from_kernel_by_id_split(mi.btf_vmlinux_id, base);
	else
		btf = btf__parse_split("/sys/kernel/btf/hybd", base);
	if (!btf)
		return -errno;
	val = calloc(1, mi.value_size);
	ret = val ? bpf_map_lookup_elem(fd, &key, val) : -ENOMEM;
	if (ret)
		goto out;
	/* struct bpf_struct_ops_hybd_bpf_ops { common; struct hybd_bpf_ops data; } */
	vt = btf__type_by_id(btf, mi.btf_vmlinux_value_type_id);
	ret = -ENOENT;
	if (!vt || !btf_is_struct(vt))
		goto out;
	m = btf_members(vt);
	for (i = 0; i < btf_vlen(vt) && !found; i++, m++) {
		if (!strcmp(btf__name_by_offset(btf, m->name_off), "data")) {
			data_off = btf_member_bit_offset(vt, i) / 8;
			id = m->type;
			found = 1;
		}
	}
	dt = found ? skip_mods(btf, &id) : NULL;
	if (!dt || !btf_is_struct(dt))
		goto out;
	psz = btf__pointer_size(btf);
	if (psz != 4 && psz != 8)
		psz = sizeof(void *);
	m = btf_members(dt);
	for (i = 0; i < btf_vlen(dt); i++, m++) {
		const struct btf_type *mt;
		size_t off = data_off + btf_member_bit_offset(dt, i) / 8;

		id = m->type;
		mt = skip_mods(btf, &id);
		if (!mt || !btf_is_ptr(mt) || off + psz > mi.value_size)
			continue;
		id = mt->type;
		mt = skip_mods(btf, &id);
		if (!mt || !btf_is_func_proto(mt))
			continue;
		prog = 0;
		memcpy(&prog, val + off, psz);	/* little-endian hosts */
		if (!prog)
			continue;
		for (j = 0; j < (__u32)n && ids[j] != prog; j++)
			;
		if (j == (__u32)n && n < room)
			ids[n++] = (__u32)prog;
	}
	ret = n;
out:
	free(val);
	btf__free(btf);
	return ret;
}

/* The maps the programs @ids use, unique; returns the count or -errno. */
static int progs_map_ids(const __u32 *ids, int n, __u32 *maps, int room)
{
	__u32 used[MAX_PROG_MAPS], len, k, j;
	struct bpf_prog_info pi;
	int i, fd, nr = 0, ret;

	for (i = 0; i < n; i++) {
		fd = bpf_prog_get_fd_by_id(ids[i]);
		if (fd < 0)
			return fd;
		memset(&pi, 0, sizeof(pi));
		pi.nr_map_ids = MAX_PROG_MAPS;
		pi.map_ids = (__u64)(uintptr_t)used;
		len = sizeof(pi);
		ret = bpf_prog_get_info_by_fd(fd, &pi, &len);
		close(fd);
		if (ret)
			return ret;
		for (k = 0; k < pi.nr_map_ids && k < MAX_PROG_MAPS; k++) {
			for (j = 0; j < (__u32)nr && maps[j] != used[k]; j++)
				;
			if (j == (__u32)nr && nr < room)
				maps[nr++] = used[k];
		}
	}
	return nr;
}

/* The device's link: by the id info gives, else its pin. */
static int device_link_fd(uint32_t dev_id, const struct hybd_dev_info *info)
{
	char pin[64];
	int fd = -ENOENT;

	if (info->bpf_link_id)
		fd = bpf_link_get_fd_by_id(info->bpf_link_id);
	if (fd < 0) {
		snprintf(pin, sizeof(pin), "/sys/fs/bpf/hybd/%u/link", dev_id);
		fd = bpf_obj_get(pin);
	}
	return fd;
}

/* Fill @pc with the counters of @dev_id's fast path.  Returns 0 or -errno. */
static int read_prog_counters(uint32_t dev_id, const struct hybd_dev_info *info,
			      struct prog_counters *pc)
{
	__u32 progs[MAX_OPS_PROGS], maps[MAX_PROG_MAPS], len;
	struct bpf_link_info li;
	int fd, mfd, n, i, ret;
	const char *what = "the link";

	memset(pc, 0, sizeof(*pc));
	if (!has_bpf(info))
		return 0;
	pc->attached = 1;
	fd = device_link_fd(dev_id, info);
	if (fd < 0) {
		ret = fd;
		goto fail;
	}
	memset(&li, 0, sizeof(li));
	len = sizeof(li);
	ret = bpf_link_get_info_by_fd(fd, &li, &len);
	close(fd);
	if (!ret && li.type != BPF_LINK_TYPE_STRUCT_OPS)
		ret = -EINVAL;
	if (ret)
		goto fail;
	what = "the struct_ops map";
	mfd = bpf_map_get_fd_by_id(li.struct_ops.map_id);
	if (mfd < 0) {
		ret = mfd;
		goto fail;
	}
	n = ops_prog_ids(mfd, progs, MAX_OPS_PROGS);
	close(mfd);
	if (n < 0) {
		ret = n;
		goto fail;
	}
	what = "the programs";
	n = progs_map_ids(progs, n, maps, MAX_PROG_MAPS);
	if (n < 0) {
		ret = n;
		goto fail;
	}
	what = "a map";
	for (i = 0; i < n; i++) {
		ret = read_global_map(pc, maps[i]);
		if (ret)
			goto fail;
	}
	return 0;
fail:
	snprintf(pc->err, sizeof(pc->err), "cannot read %s: %s", what,
		 strerror(-ret));
	return ret;
}

static void prog_counters_text(const struct hybd_dev_info *info,
			       const struct prog_counters *pc)
{
	const char *map = "";
	char desc[64];
	size_t i;

	putchar('\n');
	if (!pc->attached) {
		printf("fast-path counters: no fast path attached\n");
		return;
	}
	bpf_desc(info, desc, sizeof(desc));
	if (pc->err[0]) {
		printf("fast-path counters of %s: %s\n", desc, pc->err);
		return;
	}
	if (!pc->nr) {
		printf("fast-path counters of %s: no counters\n", desc);
		return;
	}
	printf("fast-path counters of %s:\n", desc);
	for (i = 0; i < pc->nr; i++) {
		if (strcmp(map, pc->v[i].map)) {
			map = pc->v[i].map;
			printf("  %s\n", map);
		}
		printf("    %-24s %s\n", pc->v[i].name, pc->v[i].text);
	}
}

/* The "maps" member: {"cache.bss":{"hits":1,...}}, {} or null. */
static void prog_counters_json(const struct prog_counters *pc)
{
	const char *map = NULL;
	size_t i;

	printf("\"maps\":");
	if (!pc->attached || pc->err[0]) {
		printf("null");
		return;
	}
	putchar('{');
	for (i = 0; i < pc->nr; i++) {
		if (!map || strcmp(map, pc->v[i].map)) {
			if (map)
				printf("},");
			map = pc->v[i].map;
			print_json_string(map, strlen(map));
			printf(":{");
		} else {
			putchar(',');
		}
		print_json_string(pc->v[i].name, strlen(pc->v[i].name));
		printf(":%s", pc->v[i].json);
	}
	printf("%s}", map ? "}" : "");
}

/* ---------------------------------------------------------------- stats */

/* Bucket i of a latency histogram holds [2^i, 2^(i+1)) ns; 0 also < 1. */
static double bucket_lo(unsigned int i)
{
	return i ? (double)(1ULL << i) : 0.0;
}

static double bucket_hi(unsigned int i)
{
	return (double)(1ULL << (i + 1));
}

static uint64_t lat_count(const __u64 *h)
{
	uint64_t n = 0;
	unsigned int i;

	for (i = 0; i < HYBD_LAT_BUCKETS; i++)
		n += h[i];
	return n;
}

/*
 * Estimated @q quantile (0 < q <= 1) in ns: the bucket that holds it, and
 * a linear guess inside it.  The truth is anywhere in that bucket.
 */
static double lat_quantile(const __u64 *h, double q)
{
	double target = q * (double)lat_count(h), cum = 0;
	unsigned int i;

	for (i = 0; i < HYBD_LAT_BUCKETS; i++) {
		if (!h[i])
			continue;
		if (cum + (double)h[i] >= target)
			return bucket_lo(i) + (bucket_hi(i) - bucket_lo(i)) *
			       (target - cum) / (double)h[i];
		cum += (double)h[i];
	}
	return 0;
}

/* Estimated mean in ns: every request at its bucket's middle. */
static double lat_mean(const __u64 *h)
{
	uint64_t n = lat_count(h);
	double sum = 0;
	unsigned int i;

	for (i = 0; i < HYBD_LAT_BUCKETS; i++)
		sum += (double)h[i] * (bucket_lo(i) + bucket_hi(i)) / 2;
	return n ? sum / (double)n : 0;
}

/* A time in us: 3 significant digits, at least the whole microseconds. */
static const char *fmt_us(double ns, char *buf, size_t size)
{
	double us = ns / 1000;

	if (us == 0)
		snprintf(buf, size, "0");
	else if (us < 1)
		snprintf(buf, size, "%.3f", us);
	else if (us < 10)
		snprintf(buf, size, "%.2f", us);
	else if (us < 100)
		snprintf(buf, size, "%.1f", us);
	else
		snprintf(buf, size, "%.0f", us);
	return buf;
}

#define BAR_WIDTH	40

static void print_histogram(const char *title, const __u64 *h)
{
	uint64_t n = lat_count(h), max = 0;
	char a[24], b[24], c[24];
	unsigned int i, first = HYBD_LAT_BUCKETS, last = 0, w;

	printf("%s latency: ", title);
	if (!n) {
		printf("no requests\n");
		return;
	}
	printf("%" PRIu64 " requests, p50 ~%s us, p99 ~%s us, mean ~%s us\n",
	       n, fmt_us(lat_quantile(h, 0.50), a, sizeof(a)),
	       fmt_us(lat_quantile(h, 0.99), b, sizeof(b)),
	       fmt_us(lat_mean(h), c, sizeof(c)));
	for (i = 0; i < HYBD_LAT_BUCKETS; i++) {
		if (!h[i])
			continue;
		if (i < first)
			first = i;
		last = i;
		if (h[i] > max)
			max = h[i];
	}
	for (i = first; i <= last; i++) {
		/* at least one '#' for a bucket that is not empty */
		w = h[i] ? (unsigned int)((double)h[i] * (BAR_WIDTH - 1) /
					  (double)max) + 1 : 0;
		printf("  %9s - %-9s us %12" PRIu64 "%s%.*s\n",
		       fmt_us(bucket_lo(i), a, sizeof(a)),
		       fmt_us(bucket_hi(i), b, sizeof(b)), (uint64_t)h[i],
		       w ? "  " : "", (int)w,
		       "########################################");
	}
}

/* Every request the block layer handed us ended one of these ways. */
static uint64_t completions(const struct hybd_dev_stats *c)
{
	return c->fast_done + c->slow_done + c->failed_dead;
}

static double share(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)part / (double)whole : 0;
}

/* "2.62 us", or "-" for an empty histogram. */
static void p50_text(const __u64 *h, char *buf, size_t size)
{
	char us[24];

	if (lat_count(h))
		snprintf(buf, size, "%s us",
			 fmt_us(lat_quantile(h, 0.5), us, sizeof(us)));
	else
		snprintf(buf, size, "-");
}

static void stats_text(uint32_t id, const struct hybd_dev_info *info,
		       const struct hybd_ctl_stats *st,
		       const struct hybd_queue_stat *qs, uint32_t nq)
{
	const struct hybd_dev_stats *c = &st->total.c;
	uint64_t all = completions(c);
	char desc[64];
	uint32_t q;

	bpf_desc(info, desc, sizeof(desc));
	printf("/dev/hybd%u: %u queue%s, fast path %s, %u attach%s\n", id,
	       st->nr_queues, st->nr_queues == 1 ? "" : "s",
	       desc[0] ? desc : "none", info->bpf_attaches,
	       info->bpf_attaches == 1 ? "" : "es");
	printf("%-22s %14s %14s %14s\n", "", "fast path", "slow path",
	       "no server");
	printf("%-22s %14" PRIu64 " %14" PRIu64 " %14" PRIu64 "\n",
	       "completed", (uint64_t)c->fast_done, (uint64_t)c->slow_done,
	       (uint64_t)c->failed_dead);
	printf("%-22s %13.1f%% %13.1f%% %13.1f%%\n", "  share",
	       share(c->fast_done, all), share(c->slow_done, all),
	       share(c->failed_dead, all));
	printf("%-22s %14" PRIu64 " %14" PRIu64 "\n", "  with an error",
	       (uint64_t)c->fast_errors, (uint64_t)c->slow_errors);
	printf("%-22s %14s %14" PRIu64 "\n", "issued to the server", "",
	       (uint64_t)c->slow_issued);
	printf("requests:  reads %" PRIu64 "  writes %" PRIu64 "  flushes %"
	       PRIu64 "  fua %" PRIu64 "  discards %" PRIu64
	       "  write_zeroes %" PRIu64 "\n", (uint64_t)c->reads,
	       (uint64_t)c->writes, (uint64_t)c->flushes, (uint64_t)c->fua,
	       (uint64_t)c->discards, (uint64_t)c->write_zeroes);
	printf("rejected:  bad_tag %" PRIu64 "  not_outstanding %" PRIu64
	       "  stale_seq %" PRIu64 "  bad_result %" PRIu64
	       "  ring_index %" PRIu64 "\n", (uint64_t)c->rej_bad_tag,
	       (uint64_t)c->rej_not_outstanding, (uint64_t)c->rej_stale_seq,
	       (uint64_t)c->rej_bad_result, (uint64_t)c->rej_ring_index);
	printf("bpf_bad_ret: %" PRIu64 " (fast-path returns outside the contract, failed with EIO)\n",
	       (uint64_t)c->bpf_bad_ret);
	printf("bpf_unfilled: %" PRIu64 " (reads the fast path completed without filling them, failed with EIO)\n",
	       (uint64_t)c->bpf_unfilled);
	printf("bpf_pass_zeroes: %" PRIu64 " (zero writes the fast path sent to the server as write-zeroes)\n",
	       (uint64_t)c->bpf_pass_zeroes);
	printf("held: %" PRIu64 " (requests that arrived while no server was attached)  reissued: %" PRIu64 " (issued again to a new server)\n",
	       (uint64_t)c->held, (uint64_t)c->reissued);
	printf("remapped: %" PRIu64 " (%.1f%% of all; served on a backing target, counted in fast path)  remap_refused: %" PRIu64 "  remap_waited: %" PRIu64 " (started again where the target may wait)\n",
	       (uint64_t)c->remapped, share(c->remapped, all),
	       (uint64_t)c->remap_refused, (uint64_t)c->remap_waited);
	putchar('\n');
	print_histogram("fast path", st->total.fast_lat);
	print_histogram("slow path", st->total.slow_lat);
	printf("(p50, p99 and mean are estimates from the log2 buckets)\n");

	if (!qs)
		return;
	putchar('\n');
	printf("%5s %12s %12s %8s %12s %12s %12s %11s %8s %8s %10s %10s\n",
	       "queue", "fast", "slow", "errors", "reads", "writes", "remapped",
	       "pass_zeroes", "bad_ret", "rejected", "fast p50", "slow p50");
	for (q = 0; q < nq; q++) {
		const struct hybd_dev_stats *d = &qs[q].c;
		char f50[32], s50[32];

		p50_text(qs[q].fast_lat, f50, sizeof(f50));
		p50_text(qs[q].slow_lat, s50, sizeof(s50));
		printf("%5u %12" PRIu64 " %12" PRIu64 " %8" PRIu64 " %12" PRIu64
		       " %12" PRIu64 " %12" PRIu64 " %11" PRIu64 " %8" PRIu64
		       " %8" PRIu64 " %10s %10s\n",
		       q, (uint64_t)d->fast_done, (uint64_t)d->slow_done,
		       (uint64_t)(d->fast_errors + d->slow_errors),
		       (uint64_t)d->reads, (uint64_t)d->writes,
		       (uint64_t)d->remapped, (uint64_t)d->bpf_pass_zeroes,
		       (uint64_t)d->bpf_bad_ret,
		       (uint64_t)(d->rej_bad_tag + d->rej_not_outstanding +
				  d->rej_stale_seq + d->rej_bad_result +
				  d->rej_ring_index), f50, s50);
	}
	if (nq < st->nr_queues)
		printf("(%u more queues not shown)\n", st->nr_queues - nq);
}

static void histogram_json(const char *name, const __u64 *h)
{
	unsigned int i;

	printf("\"%s\":[", name);
	for (i = 0; i < HYBD_LAT_BUCKETS; i++)
		printf("%s%" PRIu64, i ? "," : "", (uint64_t)h[i]);
	printf("],\"%s_est\":{\"count\":%" PRIu64 ",\"p50_ns\":%.0f,"
	       "\"p99_ns\":%.0f,\"mean_ns\":%.0f}", name, lat_count(h),
	       lat_quantile(h, 0.50), lat_quantile(h, 0.99), lat_mean(h));
}

/*
 * One stats object; @rate (fast, slow per second) only with --watch, @pc
 * only with --maps.
 */
static void stats_json(uint32_t id, const struct hybd_dev_info *info,
		       const struct hybd_ctl_stats *st,
		       const struct hybd_queue_stat *qs, uint32_t nq,
		       const double *rate, double now,
		       const struct prog_counters *pc)
{
	uint32_t q;

	printf("{\"id\":%u,\"path\":\"/dev/hybd%u\",\"nr_queues\":%u,", id,
	       id, st->nr_queues);
	bpf_json(info);
	printf("\"bpf_attaches\":%u,", info->bpf_attaches);
	if (now > 0) {
		printf("\"time\":%.3f,", now);
		if (rate)
			printf("\"fast_per_s\":%.1f,\"slow_per_s\":%.1f,",
			       rate[0], rate[1]);
		else
			printf("\"fast_per_s\":null,\"slow_per_s\":null,");
	}
	counters_json(&st->total.c);
	putchar(',');
	histogram_json("fast_lat", st->total.fast_lat);
	putchar(',');
	histogram_json("slow_lat", st->total.slow_lat);
	if (qs) {
		printf(",\"queues\":[");
		for (q = 0; q < nq; q++) {
			printf("%s{\"queue\":%u,", q ? "," : "", q);
			counters_json(&qs[q].c);
			putchar(',');
			histogram_json("fast_lat", qs[q].fast_lat);
			putchar(',');
			histogram_json("slow_lat", qs[q].slow_lat);
			putchar('}');
		}
		putchar(']');
	}
	if (pc) {
		putchar(',');
		prog_counters_json(pc);
	}
	printf("}\n");
}

static volatile sig_atomic_t stop_watch;

static void on_stop_signal(int sig)
{
	(void)sig;
	stop_watch = 1;
}

/* @clock's time in seconds. */
static double clock_s(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sleep until monotonic time @until or a stop signal. */
static void sleep_until(double until)
{
	struct timespec ts;
	double left;

	while (!stop_watch && (left = until - clock_s(CLOCK_MONOTONIC)) > 0) {
		ts.tv_sec = (time_t)left;
		ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
		nanosleep(&ts, NULL);
	}
}

static int cmd_stats(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "per-queue", no_argument, NULL, 'q' },
		{ "maps", no_argument, NULL, 'm' },
		{ "watch", required_argument, NULL, 'w' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c, ret, json = 0, per_queue = 0, tty = isatty(STDOUT_FILENO);
	int maps = 0, maps_failed = 0;
	struct hybd_queue_stat *qs = NULL;
	struct prog_counters pc;
	struct hybd_dev_info info;
	struct hybd_ctl_stats st;
	double watch = 0, t, t0 = 0, rate[2], next = 0;
	uint64_t fast0 = 0, slow0 = 0;
	uint32_t id, nq = 0;
	struct sigaction sa;
	char *end, clock[32];
	time_t wall;
	int n = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			json = 1;
			break;
		case 'q':
			per_queue = 1;
			break;
		case 'm':
			maps = 1;
			break;
		case 'w':
			watch = strtod(optarg, &end);
			if (end == optarg || *end || !(watch >= 0.1) ||
			    watch > 86400)
				return usage_error("stats",
						   "--watch: '%s' is not a number of seconds between 0.1 and 86400",
						   optarg);
			break;
		case 'h':
			return command_help("stats");
		default:
			return option_error("stats", c, argv, opts);
		}
	}
	ret = one_dev_arg("stats", argc, argv, &id);
	if (ret >= 0)
		return ret;
	if (per_queue) {
		qs = calloc(HYBD_MAX_QUEUES, sizeof(*qs));
		if (!qs) {
			fprintf(stderr, "hybdctl: stats: out of memory\n");
			return EXIT_FAILED;
		}
	}
	if (watch) {
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_stop_signal;
		sigemptyset(&sa.sa_mask);
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
	}

	do {
		ret = hybd_ctl_stats(id, &st, qs, qs ? HYBD_MAX_QUEUES : 0);
		if (ret < 0)
			break;
		nq = (uint32_t)ret < HYBD_MAX_QUEUES ? (uint32_t)ret :
		     HYBD_MAX_QUEUES;
		t = clock_s(CLOCK_MONOTONIC);
		/* the program's name and link; the counters stand without */
		if (hybd_ctl_info(id, &info))
			memset(&info, 0, sizeof(info));
		if (maps && read_prog_counters(id, &info, &pc))
			maps_failed = 1;
		if (n) {
			rate[0] = (double)(st.total.c.fast_done - fast0) / (t - t0);
			rate[1] = (double)(st.total.c.slow_done - slow0) / (t - t0);
		}
		if (json) {
			stats_json(id, &info, &st, qs, nq, n ? rate : NULL,
				   watch ? clock_s(CLOCK_REALTIME) : 0,
				   maps ? &pc : NULL);
		} else {
			if (watch) {
				if (tty)
					fputs("\033[H\033[J", stdout);
				else if (n)
					putchar('\n');
				wall = time(NULL);
				strftime(clock, sizeof(clock), "%H:%M:%S",
					 localtime(&wall));
				printf("%s  every %gs  ", clock, watch);
				if (n)
					printf("fast %.0f/s  slow %.0f/s\n",
					       rate[0], rate[1]);
				else
					printf("fast -/s  slow -/s\n");
			}
			stats_text(id, &info, &st, qs, nq);
			if (maps)
				prog_counters_text(&info, &pc);
		}
		if (maps && pc.err[0] && json)
			fprintf(stderr, "hybdctl: stats: fast-path counters: %s\n",
				pc.err);
		if (maps)
			prog_counters_free(&pc);
		fflush(stdout);
		fast0 = st.total.c.fast_done;
		slow0 = st.total.c.slow_done;
		t0 = t;
		n++;
		if (watch) {
			next = (next ? next : t) + watch;
			sleep_until(next);
		}
	} while (watch && !stop_watch);
	free(qs);
	if (ret < 0)
		return failed("stats", ret);
	return maps_failed ? EXIT_FAILED : EXIT_SUCCESS;
}

static const struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *args;	/* the synopsis after the name */
	const char *summary;	/* one line */
	const char *opts;	/* its options, --help included */
	const char *more;	/* what else --help says, or NULL */
} commands[] = {
	{ "list", cmd_list, "[--json]", "list the devices", list_opts, NULL },
	{ "info", cmd_info, "DEV [--json]",
	  "show a device's state, parameters and counters", info_opts,
	  info_more },
	{ "features", cmd_features, "[--json]",
	  "show the module's ABI version and features", features_opts, NULL },
	{ "add", cmd_add, "[OPTIONS]",
	  "add a device without a server and print its id", add_opts,
	  add_more },
	{ "del", cmd_del, "DEV [--in-use | --force]",
	  "delete a device (refused while mounted or open)", del_opts,
	  del_more },
	{ "attach", cmd_attach, "PROG.bpf.o DEV [--replace]",
	  "load a BPF fast path and attach it to DEV", attach_opts,
	  attach_more },
	{ "detach", cmd_detach, "DEV", "detach DEV's fast path", detach_opts,
	  detach_more },
	{ "stats", cmd_stats,
	  "DEV [--json] [--per-queue] [--maps] [--watch SECONDS]",
	  "fast- and slow-path counters, latency histograms", stats_opts,
	  stats_more },
};

static const struct command *find_command(const char *name)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(commands); i++) {
		if (!strcmp(name, commands[i].name))
			return &commands[i];
	}
	return NULL;
}

#define SYNOPSIS_WIDTH	30

static void usage(FILE *f)
{
	size_t i;
	int n;

	fprintf(f, "Usage: hybdctl COMMAND [ARGS]\n"
		"       hybdctl COMMAND --help\n\nCommands:\n");
	for (i = 0; i < ARRAY_SIZE(commands); i++) {
		n = fprintf(f, "  %s %s", commands[i].name, commands[i].args);
		if (n < SYNOPSIS_WIDTH)
			fprintf(f, "%*s%s\n", SYNOPSIS_WIDTH - n, "",
				commands[i].summary);
		else
			fprintf(f, "\n%*s%s\n", SYNOPSIS_WIDTH, "",
				commands[i].summary);
	}
	fprintf(f, "  %-*s%s\n", SYNOPSIS_WIDTH - 2, "help [COMMAND], --help",
		"show this help, or a command's");
	fprintf(f, "  %-*s%s\n\n%s", SYNOPSIS_WIDTH - 2, "version, --version",
		"show the version", general_help);
}

static int command_help(const char *name)
{
	const struct command *c = find_command(name);

	if (!c) {
		usage(stdout);
		return EXIT_SUCCESS;
	}
	printf("Usage: hybdctl %s %s\n\n%c%s.\n\n", c->name, c->args,
	       toupper((unsigned char)c->summary[0]), c->summary + 1);
	printf("Options:\n%s", c->opts);
	if (c->more)
		printf("\n%s", c->more);
	return EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
	const struct command *c;
	const char *cmd;

	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	cmd = argv[1];
	if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") ||
	    !strcmp(cmd, "-h")) {
		if (argc > 3 || (argc == 3 && !find_command(argv[2]))) {
			fprintf(stderr, "hybdctl: help: %s '%s'\n"
				"Try 'hybdctl --help'.\n", argc > 3 ?
				"unexpected argument" : "unknown command",
				argv[argc > 3 ? 3 : 2]);
			return EXIT_USAGE;
		}
		return command_help(argc == 3 ? argv[2] : "");
	}
	if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		if (argc > 2) {
			fprintf(stderr, "hybdctl: version: unexpected argument '%s'\n"
				"Try 'hybdctl --help'.\n", argv[2]);
			return EXIT_USAGE;
		}
		printf("hybdctl %d.%d (hybd ABI %d)\n", HYBD_LIB_VERSION_MAJOR,
		       HYBD_LIB_VERSION_MINOR, HYBD_ABI_VERSION);
		return EXIT_SUCCESS;
	}
	c = find_command(cmd);
	if (c)
		return c->fn(argc - 1, argv + 1);
	fprintf(stderr, "hybdctl: unknown command '%s'\nTry 'hybdctl --help'.\n",
		cmd);
	return EXIT_USAGE;
}
