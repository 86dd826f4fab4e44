// SPDX-License-Identifier: MIT
/*
 * failnth.so - fail the Nth allocation the kernel makes inside one chosen
 * system call of a program, through the kernel's fault injection
 * (/proc/thread-self/fail-nth: CONFIG_FAULT_INJECTION, with CONFIG_FAILSLAB
 * and CONFIG_FAIL_PAGE_ALLOC for the allocators).  Loaded with LD_PRELOAD:
 *
 *   HYBD_FAIL_IOCTL=REQ    the call: the first ioctl() with request REQ
 *                          (decimal or 0x hex)
 *   HYBD_FAIL_NTH=N        fail the Nth fault-injection point it reaches
 *   HYBD_FAIL_REPORT=FILE  gets "injected" (the Nth point was reached and
 *                          failed) or "not-reached" (the call made fewer)
 *
 * Only the first matching call is armed; every later one runs normally.  A
 * test walks N = 1, 2, ... until "not-reached": then every allocation of
 * that call has been failed once.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*ioctl_fn)(int, unsigned long, ...);

static int armed = 1;

static void report(const char *what)
{
	const char *path = getenv("HYBD_FAIL_REPORT");
	int fd;

	if (!path)
		return;
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, what, strlen(what)) < 0)
		perror("failnth: report");
	close(fd);
}

/* The injection file of this thread, opened before the call: -1 if none. */
static int open_fail_nth(void)
{
	int fd = open("/proc/thread-self/fail-nth", O_RDWR | O_CLOEXEC);

	if (fd < 0)
		fprintf(stderr, "failnth: /proc/thread-self/fail-nth: %s\n",
			strerror(errno));
	return fd;
}

int ioctl(int fd, unsigned long req, ...)
{
	static ioctl_fn real;
	const char *want = getenv("HYBD_FAIL_IOCTL");
	const char *nth = getenv("HYBD_FAIL_NTH");
	char buf[16] = "";
	int ret, saved, nfd = -1;
	ssize_t len;
	va_list ap;
	void *arg;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real)
		real = (ioctl_fn)dlsym(RTLD_NEXT, "ioctl");
	if (armed && want && nth && strtoul(want, NULL, 0) == req) {
		armed = 0;
		nfd = open_fail_nth();
	}
	if (nfd >= 0 && write(nfd, nth, strlen(nth)) < 0) {
		fprintf(stderr, "failnth: fail-nth %s: %s\n", nth,
			strerror(errno));
		close(nfd);
		nfd = -1;
	}
	ret = real(fd, req, arg);
	saved = errno;
	if (nfd >= 0) {
		/* 0: the fault was injected; N > 0: N points were left */
		len = pread(nfd, buf, sizeof(buf) - 1, 0);
		if (write(nfd, "0", 1) < 0)	/* disarm, whatever happened */
			perror("failnth: disarm");
		close(nfd);
		buf[len > 0 ? len : 0] = '\0';
		report(len > 0 && atoi(buf) == 0 ? "injected" : "not-reached");
	}
	errno = saved;
	return ret;
}
