// SPDX-License-Identifier: MIT
/*
 * The fast-path loader without a kernel: the verifier log is condensed to
 * fit hybd_errmsg() and keeps its verdict (the end), argument checks come
 * before anything else, and without the module every entry point says so.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybd_internal.h"
#include "unit.h"

#define NOT_LOADED	"hybd module not loaded (/dev/hybd-control missing)"
#define BEGIN		"libbpf: prog 'p_submit': -- BEGIN PROG LOAD LOG --\n"
#define END		"-- END PROG LOAD LOG --\n"
#define VERDICT		"R1 invalid mem access 'scalar'\n"
#define NOTE_END	" earlier lines of the verifier log]\n"
#define STATS_LINE	"processed 12 insns (limit 1000000) max_states_per_insn 0\n"

/* A verifier log of @lines numbered instruction lines, as libbpf prints it. */
static char *make_log(unsigned int lines)
{
	size_t size = 1024 + (size_t)lines * 64;
	char *log = malloc(size);
	size_t len;
	unsigned int i;

	len = snprintf(log, size,
		       "libbpf: prog 'p_submit': BPF program load failed: Permission denied\n"
		       BEGIN);
	for (i = 0; i < lines; i++)
		len += snprintf(log + len, size - len,
				"%u: (79) r1 = *(u64 *)(r6 +%u)  ; R6=ctx()\n",
				i, i * 8);
	snprintf(log + len, size - len,
		 VERDICT STATS_LINE END
		 "libbpf: prog 'p_submit': failed to load: -13\n"
		 "libbpf: failed to load object 'p.bpf.o'\n");
	return log;
}

static void test_short_log_kept_whole(void)
{
	char *log = make_log(3);
	char out[4096];
	size_t n;

	n = hybd__bpf_log_condense(out, sizeof(out), log);
	CHECK(n == strlen(log));
	CHECK(!strcmp(out, log));
	free(log);
}

static void test_long_log_keeps_its_end(void)
{
	char *log = make_log(5000);
	char out[4096];
	const char *p;
	size_t n;

	n = hybd__bpf_log_condense(out, sizeof(out), log);
	CHECK(n == strlen(out));
	CHECK(n < sizeof(out) && n > sizeof(out) / 2);
	/* the verdict, the statistics and libbpf's lines around survive */
	CHECK(strstr(out, VERDICT STATS_LINE END) != NULL);
	CHECK(strstr(out, "BPF program load failed: Permission denied\n"));
	CHECK(strstr(out, BEGIN "[... ") != NULL);
	CHECK(strstr(out, NOTE_END) != NULL);
	CHECK(strstr(out, "failed to load object 'p.bpf.o'\n") != NULL);
	/* the last instruction line is whole, the first is gone */
	CHECK(strstr(out, "\n4999: (79) r1 = *(u64 *)(r6 +39992)  ; R6=ctx()\n"));
	CHECK(!strstr(out, "\n0: (79)"));
	/* what follows the note is a whole instruction line */
	p = strstr(out, NOTE_END);
	CHECK(p && isdigit((unsigned char)p[strlen(NOTE_END)]));
	free(log);
}

static void test_tiny_buffers(void)
{
	char *log = make_log(100);
	char out[64];

	CHECK(hybd__bpf_log_condense(out, 0, log) == 0);
	CHECK(hybd__bpf_log_condense(out, 1, log) == 0 && !out[0]);
	CHECK(hybd__bpf_log_condense(out, sizeof(out), log) < sizeof(out));
	free(log);
}

static void test_log_without_verifier_part(void)
{
	char log[8192], out[256];
	size_t len = 0;
	int i;

	for (i = 0; i < 200; i++)
		len += snprintf(log + len, sizeof(log) - len,
				"libbpf: message %d\n", i);
	hybd__bpf_log_condense(out, sizeof(out), log);
	CHECK(strlen(out) < sizeof(out));
	CHECK(!strncmp(out, "[... ", 5));
	CHECK(strstr(out, "libbpf: message 199\n") != NULL);
	CHECK(!strstr(out, "libbpf: message 0\n"));

	hybd__bpf_log_condense(out, sizeof(out), "libbpf: one line\n");
	CHECK(!strcmp(out, "libbpf: one line\n"));
}

static void test_arguments_and_no_module(void)
{
	struct hybd_queue_stat qs[2];
	struct hybd_ctl_stats st;
	struct hybd_bpf *b = (struct hybd_bpf *)&st;

	CHECK(hybd_bpf_attach(0, "x.bpf.o", 1U << 7, &b) == -EINVAL);
	CHECK(b == NULL);
	CHECK(strstr(hybd_errmsg(), "unknown attach flags 0x80"));
	CHECK(hybd_bpf_attach(0, "x.bpf.o", HYBD_BPF_F_REPLACE, &b) == -EINVAL);
	CHECK(hybd_bpf_attach(0, NULL, 0, &b) == -EINVAL);
	CHECK(hybd_bpf_map_open_pinned(0, "../link") == -EINVAL);
	CHECK(hybd_bpf_map_fd(NULL, "cache_slots") == -EINVAL);
	CHECK(hybd_bpf_detach(NULL) == 0);
	hybd_bpf_close(NULL);

	CHECK(hybd_bpf_attach(0, "x.bpf.o", HYBD_BPF_F_PIN, &b) == -ENOENT);
	CHECK(!strcmp(hybd_errmsg(), NOT_LOADED));
	CHECK(hybd_ctl_stats(0, &st, qs, 2) == -ENOENT);
	CHECK(!strcmp(hybd_errmsg(), NOT_LOADED));
	CHECK(hybd_ctl_stats(0, NULL, NULL, 0) == -EINVAL);
	CHECK(hybd_ctl_stats(0, &st, NULL, 2) == -EINVAL);
}

int main(void)
{
	test_short_log_kept_whole();
	test_long_log_keeps_its_end();
	test_tiny_buffers();
	test_log_without_verifier_part();
	test_arguments_and_no_module();

	return unit_report();
}
