// SPDX-License-Identifier: MIT
/*
 * Command-line parsing helpers shared by hybdctl, the examples and tests.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "hybd_internal.h"

/* Indexed by bit number of HYBD_OPF_*. */
static const char *const hybd_opf_names[] = {
	"read", "write", "flush", "fua", "discard", "write-zeroes",
};

#define HYBD_NR_OPF	(sizeof(hybd_opf_names) / sizeof(hybd_opf_names[0]))

static int is_digit(char c)
{
	return c >= '0' && c <= '9';
}

const char *hybd_opf_name(uint32_t opf)
{
	unsigned int bit;

	if (!opf || (opf & (opf - 1)))
		return NULL;
	bit = __builtin_ctz(opf);
	return bit < HYBD_NR_OPF ? hybd_opf_names[bit] : NULL;
}

/* "read,write,0x40" for the known and unknown bits of @ops; "none" for 0. */
void hybd__ops_str(uint32_t ops, char *buf, size_t size)
{
	size_t len = 0;
	uint32_t bit;

	if (!size)
		return;
	buf[0] = '\0';
	for (bit = 0; bit < HYBD_NR_OPF; bit++) {
		if (ops & (1U << bit))
			len += snprintf(buf + len, len < size ? size - len : 0,
					"%s%s", len ? "," : "",
					hybd_opf_names[bit]);
	}
	ops &= ~((1U << HYBD_NR_OPF) - 1);
	if (ops)
		len += snprintf(buf + len, len < size ? size - len : 0,
				"%s0x%x", len ? "," : "", ops);
	if (!len)
		snprintf(buf, size, "none");
}

int hybd_parse_dev(const char *s, uint32_t *id)
{
	const char *p = s;
	uint64_t v = 0;

	if (!s || !id)
		return hybd__err(-EINVAL, "no device given");
	if (!strncmp(p, "/dev/", 5)) {
		p += 5;
		if (strncmp(p, "hybd", 4))
			goto bad;
	}
	if (!strncmp(p, "hybd", 4))
		p += 4;
	if (!is_digit(*p))
		goto bad;
	for (; is_digit(*p); p++) {
		if (v < UINT32_MAX)
			v = v * 10 + (*p - '0');
	}
	if (*p)
		goto bad;
	if (v >= HYBD_MAX_DEVICES)
		return hybd__err(-ERANGE,
				 "device '%s': the id must be between 0 and %u",
				 s, HYBD_MAX_DEVICES - 1);
	*id = v;
	return 0;
bad:
	return hybd__err(-EINVAL,
			 "'%s' is not a hybd device (expected /dev/hybdN, hybdN or N)",
			 s);
}

int hybd_parse_size(const char *s, uint64_t *bytes)
{
	unsigned int shift = 0;
	uint64_t v = 0;
	const char *p;

	if (!s || !bytes)
		return hybd__err(-EINVAL, "no size given");
	if (!is_digit(*s))
		goto bad;
	for (p = s; is_digit(*p); p++) {
		unsigned int digit = *p - '0';

		if (v > UINT64_MAX / 10 || v * 10 > UINT64_MAX - digit)
			goto range;
		v = v * 10 + digit;
	}
	switch (*p) {
	case 'k': case 'K':
		shift = 10;
		break;
	case 'm': case 'M':
		shift = 20;
		break;
	case 'g': case 'G':
		shift = 30;
		break;
	case 't': case 'T':
		shift = 40;
		break;
	}
	if (shift) {
		p++;
		if (!strcasecmp(p, "ib"))
			p += 2;
	}
	if (*p)
		goto bad;
	if (v > (UINT64_MAX >> shift))
		goto range;
	*bytes = v << shift;
	return 0;
bad:
	return hybd__err(-EINVAL,
			 "'%s' is not a size (expected bytes, optionally followed by K, M, G or T)",
			 s);
range:
	return hybd__err(-ERANGE, "size '%s' is too large", s);
}

int hybd_parse_ops(const char *s, uint32_t *ops)
{
	uint32_t mask = 0;
	const char *p = s;
	unsigned int i;

	if (!s || !ops)
		return hybd__err(-EINVAL, "no operation list given");
	while (*p) {
		size_t len = strcspn(p, ",");
		uint32_t bit = 0;

		for (i = 0; i < HYBD_NR_OPF; i++) {
			if (strlen(hybd_opf_names[i]) == len &&
			    !strncmp(p, hybd_opf_names[i], len))
				bit = 1U << i;
		}
		if (len == 12 && !strncmp(p, "write_zeroes", len))
			bit = HYBD_OPF_WRITE_ZEROES;
		if (len == 3 && !strncmp(p, "all", len))
			bit = HYBD_OPF_ALL;
		if (!bit)
			return hybd__err(-EINVAL,
					 "unknown operation '%.*s' (known: read, write, flush, fua, discard, write-zeroes, all)",
					 (int)len, p);
		mask |= bit;
		p += len;
		if (*p == ',' && !*++p)
			return hybd__err(-EINVAL,
					 "operation list '%s' ends with a comma",
					 s);
	}
	*ops = mask;
	return 0;
}
