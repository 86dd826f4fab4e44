// SPDX-License-Identifier: MIT
/*
 * hybdctl: stats - the device counters, latency histograms, --watch.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hybdctl.h"

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
	printf("remapped: %" PRIu64 " (%.1f%% of all; served on a backing target, counted in fast path)  remap_refused: %" PRIu64 "  remap_waited: %" PRIu64 " (started again where the target may wait)  remap_direct: %" PRIu64 " (started by queue_rq itself on a block device)\n",
	       (uint64_t)c->remapped, share(c->remapped, all),
	       (uint64_t)c->remap_refused, (uint64_t)c->remap_waited,
	       (uint64_t)c->remap_direct);
	printf("remap_runs: %" PRIu64 " (runs of the remap workers)  remap_polled: %" PRIu64 " (times one found more by polling)  remap_front: %" PRIu64 " (remapped by map() in the bio-based front)\n",
	       (uint64_t)c->remap_runs, (uint64_t)c->remap_polled,
	       (uint64_t)c->remap_front);
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

int cmd_stats(int argc, char **argv)
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
