// SPDX-License-Identifier: MIT
/*
 * hybdctl: del's check that nothing uses the device - mounts, swap,
 * holders, loop devices, openers, and an exclusive-open probe.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hybdctl.h"

/* del checks the disk and this many of its partitions */
#define HYBD_MAX_PARTS_SHOWN	64

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
int check_in_use(uint32_t id)
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
