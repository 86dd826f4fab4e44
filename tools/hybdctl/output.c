// SPDX-License-Identifier: MIT
/*
 * hybdctl: what several commands print - sizes, states, operations and the
 * device counters, as text and as JSON.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "hybdctl.h"

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
	STAT(remap_refused), STAT(remap_waited), STAT(remap_direct),
	STAT(remap_runs), STAT(remap_polled), STAT(remap_front),
};

const char *state_name(uint32_t state)
{
	return state < ARRAY_SIZE(state_names) ? state_names[state] : "unknown";
}

/* "64 MiB" when exact, else "1.5 GiB"; "" below 1 KiB. */
const char *human_size(uint64_t bytes, char *buf, size_t size)
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

void print_json_string(const char *s, size_t max)
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

void print_ops_json(uint32_t ops)
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

void ops_string(uint32_t ops, char *buf, size_t size)
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

int has_bpf(const struct hybd_dev_info *info)
{
	return info->bpf_link_id || info->bpf_name[0];
}

/* The "bpf" member of a device's JSON object, with its trailing comma. */
void bpf_json(const struct hybd_dev_info *info)
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

void counters_json(const struct hybd_dev_stats *c)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(stat_fields); i++)
		printf("%s\"%s\":%" PRIu64, i ? "," : "", stat_fields[i].name,
		       stat_value(c, stat_fields[i].off));
}

const char *state_text(const struct hybd_dev_info *info, char *buf,
		       size_t size)
{
	if (info->state == HYBD_STATE_WAITING)
		snprintf(buf, size, "waiting:%us",
			 (info->recovery_left_ms + 999) / 1000);
	else
		snprintf(buf, size, "%s", state_name(info->state));
	return buf;
}

void counters_text(const struct hybd_dev_stats *c)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(stat_fields); i++)
		printf("  %-22s %" PRIu64 "\n", stat_fields[i].name,
		       stat_value(c, stat_fields[i].off));
}

/* "cache (link 12)" of a device's info, or "" if it has no fast path. */
void bpf_desc(const struct hybd_dev_info *info, char *buf, size_t size)
{
	buf[0] = '\0';
	if (has_bpf(info))
		snprintf(buf, size, "%.*s (link %u)",
			 (int)sizeof(info->bpf_name), info->bpf_name,
			 info->bpf_link_id);
}
