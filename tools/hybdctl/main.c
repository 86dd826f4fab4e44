// SPDX-License-Identifier: MIT
/*
 * hybdctl - list, inspect, add and delete hybd devices; attach, replace and
 * detach their BPF fast path; show their counters and latency histograms.
 *
 * This file: the command table, the help, and the command-line handling
 * every command shares.  hybdctl.h says where the rest is.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybdctl.h"

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

static const char resize_opts[] =
"  -h, --help    show this help\n";

static const char resize_more[] =
"SIZE is in bytes, with an optional suffix (K, M, G, T: powers of 1024),\n"
"a multiple of the logical block size.  The device's server is asked first\n"
"(its driver's resize hook) and may refuse; a device whose server cannot\n"
"answer resizes says so.  A shrink waits for the requests in flight to end\n"
"and is refused while a fast path is attached (detach it first).  The\n"
"block layer sees the new size at once; a file system on the device is\n"
"resized by its own tools (resize2fs, xfs_growfs).\n";

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

/*
 * The operation failed: say what and why, return the exit code.  The
 * errno's text follows libhybd's message unless that says it already.  A
 * message of several lines (a refused BPF program) has its summary first;
 * the details follow, indented.
 */
int failed(const char *cmd, int err)
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

int usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "hybdctl: %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'hybdctl %s --help'.\n", cmd);
	return EXIT_USAGE;
}

/*
 * getopt_long() returned '?' or ':' (@c) for the option at argv[optind - 1]:
 * say which option was wrong and how, as a usage error.  @opts are the
 * command's long options.
 */
int option_error(const char *cmd, int c, char **argv,
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

/* getopt_long with only --json (and --help); returns -1 when fine. */
int parse_json_opt(const char *cmd, int argc, char **argv, int *json)
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
int json_opt_only(const char *cmd, int argc, char **argv, int *json)
{
	int ret = parse_json_opt(cmd, argc, argv, json);

	if (ret < 0 && optind < argc)
		ret = usage_error(cmd, "unexpected argument '%s'",
				  argv[optind]);
	return ret;
}

/* Parse the single DEV argument of info/del; -1 when fine. */
int one_dev_arg(const char *cmd, int argc, char **argv, uint32_t *id)
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
int dev_arg_only(const char *cmd, int argc, char **argv, uint32_t *id)
{
	int json = 0, ret = parse_json_opt(cmd, argc, argv, &json);

	if (ret < 0 && json)
		ret = usage_error(cmd, "--json makes no sense here");
	if (ret < 0)
		ret = one_dev_arg(cmd, argc, argv, id);
	return ret;
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
	{ "resize", cmd_resize, "DEV SIZE",
	  "grow or shrink a live device, asking its server", resize_opts,
	  resize_more },
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

int command_help(const char *name)
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
