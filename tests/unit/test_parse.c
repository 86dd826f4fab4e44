// SPDX-License-Identifier: MIT
/*
 * Command-line parsers: hybd_parse_dev, hybd_parse_size, hybd_parse_ops,
 * hybd_opf_name.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "hybd.h"
#include "unit.h"

static void dev_ok(const char *s, uint32_t want)
{
	uint32_t id = 12345;
	int ret = hybd_parse_dev(s, &id);

	if (ret || id != want)
		fprintf(stderr, "hybd_parse_dev(\"%s\") = %d, id %u; want %u\n",
			s, ret, id, want);
	CHECK(ret == 0 && id == want);
}

static void dev_bad(const char *s, int want)
{
	uint32_t id = 12345;
	int ret = hybd_parse_dev(s, &id);

	if (ret != want)
		fprintf(stderr, "hybd_parse_dev(\"%s\") = %d; want %d\n", s,
			ret, want);
	CHECK(ret == want && id == 12345);
	CHECK(hybd_errmsg()[0] != '\0');
}

static void size_ok(const char *s, uint64_t want)
{
	uint64_t v = 12345;
	int ret = hybd_parse_size(s, &v);

	if (ret || v != want)
		fprintf(stderr, "hybd_parse_size(\"%s\") = %d, %llu; want %llu\n",
			s, ret, (unsigned long long)v,
			(unsigned long long)want);
	CHECK(ret == 0 && v == want);
}

static void size_bad(const char *s, int want)
{
	uint64_t v = 12345;
	int ret = hybd_parse_size(s, &v);

	if (ret != want)
		fprintf(stderr, "hybd_parse_size(\"%s\") = %d; want %d\n", s,
			ret, want);
	CHECK(ret == want && v == 12345);
}

static void ops_ok(const char *s, uint32_t want)
{
	uint32_t ops = 0xdead;
	int ret = hybd_parse_ops(s, &ops);

	if (ret || ops != want)
		fprintf(stderr, "hybd_parse_ops(\"%s\") = %d, 0x%x; want 0x%x\n",
			s, ret, ops, want);
	CHECK(ret == 0 && ops == want);
}

static void ops_bad(const char *s)
{
	uint32_t ops = 0xdead;
	int ret = hybd_parse_ops(s, &ops);

	if (ret != -EINVAL)
		fprintf(stderr, "hybd_parse_ops(\"%s\") = %d; want -EINVAL\n",
			s, ret);
	CHECK(ret == -EINVAL && ops == 0xdead);
}

int main(void)
{
	uint32_t id;

	dev_ok("0", 0);
	dev_ok("7", 7);
	dev_ok("63", 63);
	dev_ok("hybd0", 0);
	dev_ok("hybd12", 12);
	dev_ok("/dev/hybd3", 3);
	dev_ok("/dev/hybd63", 63);
	dev_bad("64", -ERANGE);
	dev_bad("hybd64", -ERANGE);
	dev_bad("/dev/hybd99999999999999999999", -ERANGE);
	dev_bad("", -EINVAL);
	dev_bad("hybd", -EINVAL);
	dev_bad("/dev/hybd", -EINVAL);
	dev_bad("/dev/sda", -EINVAL);
	dev_bad("/dev/3", -EINVAL);
	dev_bad("dev/hybd3", -EINVAL);
	dev_bad("/dev/hybd3-srv", -EINVAL);
	dev_bad("hybd-control", -EINVAL);
	dev_bad("3x", -EINVAL);
	dev_bad("-1", -EINVAL);
	dev_bad("+1", -EINVAL);
	dev_bad(" 3", -EINVAL);
	dev_bad("0x3", -EINVAL);
	CHECK(hybd_parse_dev("/dev/sda", &id) == -EINVAL &&
	      strstr(hybd_errmsg(), "'/dev/sda' is not a hybd device"));
	CHECK(hybd_parse_dev(NULL, &id) == -EINVAL);

	size_ok("0", 0);
	size_ok("4096", 4096);
	size_ok("4k", 4096);
	size_ok("4K", 4096);
	size_ok("4KiB", 4096);
	size_ok("64M", 64ULL << 20);
	size_ok("64mib", 64ULL << 20);
	size_ok("1G", 1ULL << 30);
	size_ok("2T", 2ULL << 40);
	size_ok("18446744073709551615", UINT64_MAX);
	size_ok("16777215T", 16777215ULL << 40);
	size_bad("18446744073709551616", -ERANGE);
	size_bad("99999999999999999999999", -ERANGE);
	size_bad("16777216T", -ERANGE);
	size_bad("", -EINVAL);
	size_bad("M", -EINVAL);
	size_bad("-1", -EINVAL);
	size_bad(" 5", -EINVAL);
	size_bad("5 ", -EINVAL);
	size_bad("1.5G", -EINVAL);
	size_bad("4KB", -EINVAL);
	size_bad("10Q", -EINVAL);
	size_bad("0x10", -EINVAL);
	size_bad("1P", -EINVAL);
	size_bad(NULL, -EINVAL);

	ops_ok("read", HYBD_OPF_READ);
	ops_ok("read,write", HYBD_OPF_READ | HYBD_OPF_WRITE);
	ops_ok("read,write,flush,fua,discard,write-zeroes", HYBD_OPF_ALL);
	ops_ok("write_zeroes", HYBD_OPF_WRITE_ZEROES);
	ops_ok("all", HYBD_OPF_ALL);
	ops_ok("discard,discard", HYBD_OPF_DISCARD);
	ops_ok("", 0);
	ops_bad("bogus");
	ops_bad("read,,write");
	ops_bad("read,");
	ops_bad(",read");
	ops_bad("Read");
	ops_bad("read write");
	CHECK(hybd_parse_ops("read,frob", &id) == -EINVAL &&
	      strstr(hybd_errmsg(), "unknown operation 'frob'"));

	CHECK(!strcmp(hybd_opf_name(HYBD_OPF_READ), "read"));
	CHECK(!strcmp(hybd_opf_name(HYBD_OPF_WRITE), "write"));
	CHECK(!strcmp(hybd_opf_name(HYBD_OPF_FLUSH), "flush"));
	CHECK(!strcmp(hybd_opf_name(HYBD_OPF_FUA), "fua"));
	CHECK(!strcmp(hybd_opf_name(HYBD_OPF_DISCARD), "discard"));
	CHECK(!strcmp(hybd_opf_name(HYBD_OPF_WRITE_ZEROES), "write-zeroes"));
	CHECK(hybd_opf_name(0) == NULL);
	CHECK(hybd_opf_name(HYBD_OPF_READ | HYBD_OPF_WRITE) == NULL);
	CHECK(hybd_opf_name(1U << 6) == NULL);
	CHECK(hybd_opf_name(1U << 31) == NULL);

	return unit_report();
}
