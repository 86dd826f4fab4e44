/* SPDX-License-Identifier: MIT */
/*
 * hybdctl's internals: what its files share.
 *
 *   main.c      the command table, help, and what every command parses
 *               (DEV, --json) and reports (usage errors, failures)
 *   output.c    what several commands print: sizes, states, operations,
 *               the device counters, as text and as JSON
 *   dev.c       a device's life: list, info, features, add, del
 *   inuse.c     del's check that nothing uses the device
 *   attach.c    the fast path: attach, attach --replace, detach
 *   counters.c  the attached program's own counters (stats --maps)
 *   stats.c     stats: counters, latency histograms, --watch
 */
#ifndef HYBDCTL_H
#define HYBDCTL_H

#include <stddef.h>
#include <stdint.h>
#include <getopt.h>

#include <bpf/bpf.h>

#include "hybd.h"

#define EXIT_FAILED	1	/* the operation failed */
#define EXIT_USAGE	2	/* the command line is wrong */

#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))

/* main.c: the commands' common command-line handling */

/* Report libhybd's message for @err (a -errno); returns EXIT_FAILED. */
int failed(const char *cmd, int err);
/* Report a command-line error with a pointer to --help; EXIT_USAGE. */
int usage_error(const char *cmd, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Explain getopt_long()'s '?' or ':' @c; EXIT_USAGE. */
int option_error(const char *cmd, int c, char **argv,
		 const struct option *opts);
/* The command's help on stdout; EXIT_SUCCESS. */
int command_help(const char *cmd);
/*
 * The parsers below return -1 when the command line is fine, else the
 * exit code to return (after --help, or after a usage error).
 */
int parse_json_opt(const char *cmd, int argc, char **argv, int *json);
int json_opt_only(const char *cmd, int argc, char **argv, int *json);
int one_dev_arg(const char *cmd, int argc, char **argv, uint32_t *id);
int dev_arg_only(const char *cmd, int argc, char **argv, uint32_t *id);

/* output.c */
const char *state_name(uint32_t state);
/* "waiting:12s" for a device holding I/O for a new server, else the name */
const char *state_text(const struct hybd_dev_info *info, char *buf,
		       size_t size);
/* "64 MiB" when exact, else "1.5 GiB"; "" below 1 KiB */
const char *human_size(uint64_t bytes, char *buf, size_t size);
/* "read,write,flush", or "none" */
void ops_string(uint32_t ops, char *buf, size_t size);
int has_bpf(const struct hybd_dev_info *info);
/* "cache (link 12)", or "" if the device has no fast path */
void bpf_desc(const struct hybd_dev_info *info, char *buf, size_t size);
/* at most @max bytes of @s, quoted and escaped */
void print_json_string(const char *s, size_t max);
void print_ops_json(uint32_t ops);
/* the "bpf" member of a device's JSON object, with its trailing comma */
void bpf_json(const struct hybd_dev_info *info);
/* the device counters: "name":value,... (JSON) or one per line (text) */
void counters_json(const struct hybd_dev_stats *c);
void counters_text(const struct hybd_dev_stats *c);

/* inuse.c: is device @id in use?  EXIT_FAILED (and why) if so, else -1 */
int check_in_use(uint32_t id);

/* counters.c: the global variables of a device's fast path */
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

/* Fill @pc with the counters of @dev_id's fast path; 0 or -errno. */
int read_prog_counters(uint32_t dev_id, const struct hybd_dev_info *info,
		       struct prog_counters *pc);
void prog_counters_text(const struct hybd_dev_info *info,
			const struct prog_counters *pc);
/* the "maps" member: {"cache.bss":{"hits":1,...}}, {} or null */
void prog_counters_json(const struct prog_counters *pc);
void prog_counters_free(struct prog_counters *pc);

/* the commands */
int cmd_list(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_features(int argc, char **argv);
int cmd_add(int argc, char **argv);
int cmd_del(int argc, char **argv);
int cmd_resize(int argc, char **argv);
int cmd_attach(int argc, char **argv);
int cmd_detach(int argc, char **argv);
int cmd_stats(int argc, char **argv);

#endif /* HYBDCTL_H */
