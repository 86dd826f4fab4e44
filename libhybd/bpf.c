// SPDX-License-Identifier: MIT
/*
 * The fast path's loader: open a .bpf.o, point its struct hybd_bpf_ops at a
 * device, load it, attach it through a BPF link, and optionally pin link
 * and maps under /sys/fs/bpf/hybd/<id>/ so they outlive this process (that
 * is what `hybdctl attach` does).
 *
 * Loading is generic (bpf_object__open_file), not a skeleton: any program
 * built against bpf/hybd.bpf.h can be attached.  Its maps (sized from the
 * device, carried over by a replace, reached from the slow path) are
 * bpf_maps.c's.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include "hybd_internal.h"

#define BPFFS		"/sys/fs/bpf"
#define BPFFS_MAGIC	0xcafe4a11
#define HYBD_PIN_DIR	BPFFS "/hybd"
#define HYBD_BTF_PATH	"/sys/kernel/btf/hybd"
#define HYBD_OPS_TYPE	"hybd_bpf_ops"

/* how long detach waits for the kernel to drop an unpinned link */
#define HYBD_DETACH_WAIT_MS	5000

struct hybd_bpf {
	uint32_t		dev_id;
	uint32_t		link_id;
	struct bpf_object	*obj;
	struct bpf_map		*ops_map;
	/* our own link, or NULL when the pin holds it (replaced via F_REPLACE) */
	struct bpf_link		*link;
	bool			pinned;
};

/*
 * libbpf's messages, the verifier log above all, collected while this
 * thread loads an object, for hybd_errmsg().  libbpf has one process-wide
 * print callback: ours is installed while at least one thread loads, and
 * hands every other message to the callback it replaced.
 */
#define LOG_CAP		(1U << 20)	/* collected per load, at most */
#define LOG_MSG_HEAD	(8U << 10)	/* a longer message keeps its head */
#define LOG_MSG_TAIL	(48U << 10)	/* ...and its tail */

struct load_log {
	char	*buf;
	size_t	len;
	size_t	size;
};

static __thread struct load_log *cur_log;
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int print_users;
static libbpf_print_fn_t prev_print;

static void log_append(struct load_log *log, const char *s, size_t n)
{
	size_t want = log->len + n + 1;
	char *p;

	if (want > LOG_CAP)
		return;
	if (want > log->size) {
		size_t size = log->size ? log->size : 4096;

		while (size < want)
			size *= 2;
		p = realloc(log->buf, size);
		if (!p)
			return;
		log->buf = p;
		log->size = size;
	}
	memcpy(log->buf + log->len, s, n);
	log->len += n;
	log->buf[log->len] = '\0';
}

static int hybd_bpf_print(enum libbpf_print_level level, const char *fmt,
			  va_list ap)
{
	struct load_log *log = cur_log;
	static const char cut[] = "\n[...]\n";
	va_list aq;
	char *msg;
	int n;

	if (!log) {
		libbpf_print_fn_t prev = __atomic_load_n(&prev_print,
							 __ATOMIC_RELAXED);

		return prev ? prev(level, fmt, ap) : 0;
	}
	if (level == LIBBPF_DEBUG)
		return 0;
	va_copy(aq, ap);
	n = vsnprintf(NULL, 0, fmt, aq);
	va_end(aq);
	if (n <= 0)
		return 0;
	msg = malloc((size_t)n + 1);
	if (!msg)
		return 0;
	vsnprintf(msg, (size_t)n + 1, fmt, ap);
	if ((size_t)n <= LOG_MSG_HEAD + LOG_MSG_TAIL) {
		log_append(log, msg, n);
	} else {
		/* a huge verifier log: its start and its end say it all */
		log_append(log, msg, LOG_MSG_HEAD);
		log_append(log, cut, sizeof(cut) - 1);
		log_append(log, msg + n - LOG_MSG_TAIL, LOG_MSG_TAIL);
	}
	free(msg);
	return 0;
}

/* Collect libbpf's messages of this thread into @log until log_end(). */
static void log_begin(struct load_log *log)
{
	memset(log, 0, sizeof(*log));
	pthread_mutex_lock(&print_lock);
	if (!print_users++) {
		libbpf_print_fn_t old = libbpf_set_print(hybd_bpf_print);

		__atomic_store_n(&prev_print, old == hybd_bpf_print ? NULL : old,
				 __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&print_lock);
	cur_log = log;
}

static void log_end(void)
{
	cur_log = NULL;
	pthread_mutex_lock(&print_lock);
	if (!--print_users)
		libbpf_set_print(__atomic_load_n(&prev_print, __ATOMIC_RELAXED));
	pthread_mutex_unlock(&print_lock);
}

static void log_free(struct load_log *log)
{
	free(log->buf);
	memset(log, 0, sizeof(*log));
}

/* Start of the longest run of whole lines at the end of [s, s+len) that
 * fits in @room bytes (s + len if none does). */
static const char *tail_lines(const char *s, size_t len, size_t room)
{
	const char *p;

	if (len <= room)
		return s;
	for (p = s + len - room; p < s + len; p++) {
		if (p > s && p[-1] == '\n')
			return p;
	}
	return s + len;
}

static size_t count_lines(const char *s, const char *end)
{
	size_t n = 0;

	for (; s < end; s++)
		n += *s == '\n';
	return n;
}

/* Append [s, s+n) to out, as far as it fits; returns the new length. */
static size_t put(char *out, size_t size, size_t len, const char *s, size_t n)
{
	if (len + 1 >= size)
		return len;
	if (n > size - 1 - len)
		n = size - 1 - len;
	memcpy(out + len, s, n);
	out[len + n] = '\0';
	return len + n;
}

/*
 * Shorten libbpf's messages @log to fit @size bytes of @out.  A verifier
 * log (between libbpf's BEGIN and END PROG LOAD LOG lines) loses its first
 * lines, never its last ones: the verdict is at the end.  Everything else
 * is kept, its head if it is long.  Returns the length of @out.
 */
size_t hybd__bpf_log_condense(char *out, size_t size, const char *log)
{
	static const char begin_mark[] = "-- BEGIN PROG LOAD LOG --\n";
	static const char end_mark[] = "-- END PROG LOAD LOG --";
	const char *body, *body_end, *post, *from;
	size_t len = 0, pre_len, post_len, room, total = strlen(log);
	char note[64];

	if (!size)
		return 0;
	out[0] = '\0';
	body = strstr(log, begin_mark);
	body_end = body ? strstr(body, end_mark) : NULL;
	if (!body_end) {
		/* no verifier log: keep the end, the last message is the one */
		from = tail_lines(log, total, size - 1);
		if (from != log) {
			snprintf(note, sizeof(note), "[... %zu lines]\n",
				 count_lines(log, from));
			from = tail_lines(log, total, size - 1 - strlen(note));
			len = put(out, size, len, note, strlen(note));
		}
		return put(out, size, len, from, log + total - from);
	}
	body += sizeof(begin_mark) - 1;
	post = body_end;
	pre_len = body - log;
	post_len = log + total - post;
	/* what surrounds the verifier log gets at most a quarter each */
	if (pre_len > size / 4)
		pre_len = size / 4;
	if (post_len > size / 4)
		post_len = size / 4;
	len = put(out, size, len, body - pre_len, pre_len);
	room = size - 1 - len - post_len;
	from = tail_lines(body, body_end - body, room);
	if (from != body) {
		snprintf(note, sizeof(note),
			 "[... %zu earlier lines of the verifier log]\n",
			 count_lines(body, from));
		from = tail_lines(body, body_end - body,
				  room > strlen(note) ? room - strlen(note) : 0);
		len = put(out, size, len, note, strlen(note));
	}
	len = put(out, size, len, from, body_end - from);
	return put(out, size, len, post, post_len);
}

/*
 * The verifier's verdict: the last line of its log that is not one of the
 * statistics lines that follow it, nor of the explanation that newer
 * verifiers (7.x) add after it ("Verification failed: ...", "Reason:",
 * "Suggestion:").  Copied to @buf; "" if none.
 */
static void verifier_verdict(const char *log, char *buf, size_t size)
{
	const char *body = strstr(log, "-- BEGIN PROG LOAD LOG --\n");
	const char *end = body ? strstr(body, "-- END PROG LOAD LOG --") : NULL;
	const char *line, *eol, *why;

	buf[0] = '\0';
	if (!end)
		return;
	body = strchr(body, '\n') + 1;
	why = strstr(body, "\nVerification failed:");
	if (why && why < end)
		end = why + 1;
	for (eol = end; eol > body; eol = line) {
		line = eol - 1;
		while (line > body && line[-1] != '\n')
			line--;
		if (eol - line <= 1 || !strncmp(line, "processed ", 10) ||
		    !strncmp(line, "verification time", 17) ||
		    !strncmp(line, "stack depth", 11) ||
		    !strncmp(line, "[...]", 5))
			continue;
		snprintf(buf, size, "%.*s", (int)(eol - 1 - line), line);
		return;
	}
}

/* The program the verifier refused, from libbpf's "prog 'X': BPF program
 * load failed" line.  Copied to @buf; "" if none. */
static void failed_prog(const char *log, char *buf, size_t size)
{
	const char *p = strstr(log, "': BPF program load failed");
	const char *q;

	buf[0] = '\0';
	if (!p)
		return;
	for (q = p; q > log && q[-1] != '\''; q--)
		;
	if (q > log)
		snprintf(buf, size, "%.*s", (int)(p - q), q);
}

/*
 * Record the failure of @what: a summary line, then libbpf's messages
 * (condensed).  Returns @err.
 */
static int log_err(int err, const struct load_log *log, const char *what)
{
	char *msg = malloc(HYBD_ERRMSG_MAX);
	char prog[64], verdict[256];
	int n;

	if (!msg)
		return hybd__err(err, "%s failed", what);
	prog[0] = verdict[0] = '\0';
	if (log->buf) {
		failed_prog(log->buf, prog, sizeof(prog));
		verifier_verdict(log->buf, verdict, sizeof(verdict));
	}
	if (prog[0])
		n = snprintf(msg, HYBD_ERRMSG_MAX,
			     "%s failed: the verifier refused program '%s'%s%s",
			     what, prog, verdict[0] ? ": " : "", verdict);
	else
		n = snprintf(msg, HYBD_ERRMSG_MAX, "%s failed", what);
	if (n < 0 || n >= HYBD_ERRMSG_MAX - 2 || !log->len) {
		hybd__err(err, "%s", msg);
	} else {
		msg[n++] = '\n';
		hybd__bpf_log_condense(msg + n, HYBD_ERRMSG_MAX - n, log->buf);
		/* no trailing newline: hybd_errmsg() is a sentence */
		n = strlen(msg);
		while (n && msg[n - 1] == '\n')
			msg[--n] = '\0';
		hybd__err(err, "%s", msg);
	}
	free(msg);
	return err;
}

/*
 * Say plainly why a fast path cannot work here, before libbpf says it in
 * its own words.
 */
static int hybd_bpf_check_kernel(void)
{
	struct hybd_ctl_features f;
	struct utsname u;
	int maj = 0, min = 0, ret;

	ret = hybd_ctl_features(&f);
	if (ret)
		return ret;	/* "module not loaded" and friends */
	if (!(f.features & HYBD_F_BPF))
		return hybd__err(-EOPNOTSUPP,
				 "the hybd module has no BPF fast path (struct_ops registration failed; see dmesg)");
	if (access(HYBD_BTF_PATH, R_OK)) {
		if (!uname(&u) && sscanf(u.release, "%d.%d", &maj, &min) == 2 &&
		    (maj < 6 || (maj == 6 && min < 9)))
			return hybd__err(-EOPNOTSUPP,
					 "kernel %s too old: module struct_ops need Linux >= 6.9 (6.12 tested)",
					 u.release);
		return hybd__err(-EOPNOTSUPP,
				 "no BTF for the hybd module (%s missing): kernel needs CONFIG_DEBUG_INFO_BTF_MODULES=y and a module built with BTF",
				 HYBD_BTF_PATH);
	}
	return 0;
}

static int hybd_bpffs_ready(void)
{
	struct statfs st;

	if (!statfs(BPFFS, &st) && (unsigned long)st.f_type == BPFFS_MAGIC)
		return 0;
	if (mount("bpf", BPFFS, "bpf", 0, NULL))
		return hybd__err(-errno, "cannot mount bpffs at %s: %s", BPFFS,
				 strerror(errno));
	return 0;
}

void hybd__bpf_pin_path(char *buf, size_t size, uint32_t dev_id,
			const char *what)
{
	snprintf(buf, size, HYBD_PIN_DIR "/%u%s%s", dev_id, what ? "/" : "",
		 what ? what : "");
}

static int hybd_mkdir(const char *path)
{
	if (mkdir(path, 0700) && errno != EEXIST)
		return -errno;
	return 0;
}

/* Is @map's value a struct hybd_bpf_ops (by its BTF name)? */
static bool is_hybd_ops(const struct bpf_object *obj,
			const struct bpf_map *map)
{
	const struct btf *btf = bpf_object__btf(obj);
	const struct btf_type *t;
	const char *name;

	if (!btf)
		return false;
	t = btf__type_by_id(btf, bpf_map__btf_value_type_id(map));
	if (!t)
		return false;
	name = btf__name_by_offset(btf, t->name_off);
	return name && !strcmp(name, HYBD_OPS_TYPE);
}

/* (a map the old program lacks leaves a message a later failure replaces) */
static int old_pinned_map(void *ctx, const char *name)
{
	return hybd_bpf_map_open_pinned(*(uint32_t *)ctx, name);
}

static int old_object_map(void *ctx, const char *name)
{
	struct bpf_map *map = bpf_object__find_map_by_name(ctx, name);
	int fd = map ? bpf_map__fd(map) : -1;

	return fd < 0 ? -ENOENT : fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

/*
 * What @path is, if not an ELF file libbpf could open: said in words, with
 * the errno a user expects of a missing file or a directory.
 */
static int check_object_file(const char *path)
{
	unsigned char magic[4];
	struct stat st;
	ssize_t n;
	int fd;

	if (stat(path, &st))
		return hybd__err(-errno, "cannot open BPF object %s: %s", path,
				 strerror(errno));
	if (S_ISDIR(st.st_mode))
		return hybd__err(-EISDIR, "%s is a directory, not a BPF object",
				 path);
	if (!S_ISREG(st.st_mode))
		return hybd__err(-EINVAL, "%s is not a regular file: not a BPF object",
				 path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return hybd__err(-errno, "cannot open BPF object %s: %s", path,
				 strerror(errno));
	n = read(fd, magic, sizeof(magic));
	close(fd);
	if (n != sizeof(magic) || memcmp(magic, "\177ELF", 4))
		return hybd__err(-ENOEXEC,
				 "%s is not a BPF object (an ELF file from clang -target bpf)",
				 path);
	return 0;
}

/* Open @path and find its one struct hybd_bpf_ops map; set dev_id. */
static int hybd_bpf_open(const char *path, uint32_t dev_id,
			 struct bpf_object **objp, struct bpf_map **mapp)
{
	struct bpf_object *obj;
	struct bpf_map *map, *ops = NULL;
	struct hybd_bpf_ops *init;
	struct load_log log;
	char what[PATH_MAX + 32];
	size_t size = 0;
	int ret;

	ret = check_object_file(path);
	if (ret)
		return ret;
	log_begin(&log);
	obj = bpf_object__open_file(path, NULL);
	ret = obj ? 0 : -errno;
	log_end();
	if (!obj) {
		if (ret <= -LIBBPF_ERRNO__LIBELF) {
			/* libbpf's own codes, which strerror() does not know */
			char why[128];

			libbpf_strerror(ret, why, sizeof(why));
			hybd__err(-EINVAL, "%s is not a BPF object hybd can load: %s",
				  path, why);
		} else if (ret == -ENOENT || ret == -EACCES)
			hybd__err(ret, "cannot open BPF object %s: %s", path,
				  strerror(-ret));
		else {
			snprintf(what, sizeof(what), "opening BPF object %s",
				 path);
			log_err(ret, &log, what);
		}
		log_free(&log);
		return ret;
	}
	log_free(&log);

	bpf_object__for_each_map(map, obj) {
		if (bpf_map__type(map) != BPF_MAP_TYPE_STRUCT_OPS)
			continue;
		if (ops) {
			bpf_object__close(obj);
			return hybd__err(-EINVAL,
					 "%s defines more than one struct_ops map (%s, %s): one program per object",
					 path, bpf_map__name(ops),
					 bpf_map__name(map));
		}
		ops = map;
	}
	if (!ops) {
		bpf_object__close(obj);
		return hybd__err(-EINVAL,
				 "%s has no struct hybd_bpf_ops (define one with HYBD_OPS_DEFINE)",
				 path);
	}
	init = bpf_map__initial_value(ops, &size);
	if (!is_hybd_ops(obj, ops) || !init ||
	    size < sizeof(struct hybd_bpf_ops)) {
		bpf_object__close(obj);
		return hybd__err(-EINVAL,
				 "%s: struct_ops map %s is not a struct hybd_bpf_ops",
				 path, bpf_map__name(ops));
	}
	if (!(bpf_map__map_flags(ops) & BPF_F_LINK)) {
		bpf_object__close(obj);
		return hybd__err(-EINVAL,
				 "%s: struct_ops map %s is not in section .struct_ops.link (define it with HYBD_OPS_DEFINE)",
				 path, bpf_map__name(ops));
	}
	init->dev_id = dev_id;
	ret = hybd__bpf_size_maps(obj, dev_id, path);
	if (ret) {
		bpf_object__close(obj);
		return ret;
	}
	*objp = obj;
	*mapp = ops;
	return 0;
}

static int hybd_bpf_load(struct bpf_object *obj, const char *path)
{
	char what[PATH_MAX + 16];
	struct load_log log;
	int ret;

	log_begin(&log);
	ret = bpf_object__load(obj);
	log_end();
	if (ret) {
		ret = ret < 0 ? ret : -EINVAL;
		snprintf(what, sizeof(what), "loading %s", path);
		log_err(ret, &log, what);
	}
	log_free(&log);
	return ret;
}

/* Remove every pinned map of device @dev_id (maps/ stays). */
static void hybd_bpf_unpin_maps(uint32_t dev_id)
{
	char path[PATH_MAX], dir[64];
	struct dirent *de;
	DIR *d;

	hybd__bpf_pin_path(dir, sizeof(dir), dev_id, "maps");
	d = opendir(dir);
	if (!d)
		return;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		unlink(path);
	}
	closedir(d);
}

/*
 * Pin every map but the struct_ops one and libbpf's internal ones
 * (.rodata, .bss: not shared state), replacing what was pinned before.
 */
static int hybd_bpf_pin_maps(struct hybd_bpf *b)
{
	char path[PATH_MAX], dir[64];
	struct bpf_map *map;
	int ret;

	hybd__bpf_pin_path(dir, sizeof(dir), b->dev_id, "maps");
	ret = hybd_mkdir(dir);
	if (ret)
		return hybd__err(ret, "cannot create %s: %s", dir,
				 strerror(-ret));
	hybd_bpf_unpin_maps(b->dev_id);
	bpf_object__for_each_map(map, b->obj) {
		if (map == b->ops_map || bpf_map__is_internal(map))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, bpf_map__name(map));
		ret = bpf_map__pin(map, path);
		if (ret)
			return hybd__err(ret, "cannot pin map at %s: %s", path,
					 strerror(-ret));
	}
	return 0;
}

static void hybd_bpf_unpin_all(uint32_t dev_id)
{
	char path[PATH_MAX];

	hybd_bpf_unpin_maps(dev_id);
	hybd__bpf_pin_path(path, sizeof(path), dev_id, "maps");
	rmdir(path);
	hybd__bpf_pin_path(path, sizeof(path), dev_id, "link");
	unlink(path);
	hybd__bpf_pin_path(path, sizeof(path), dev_id, NULL);
	rmdir(path);
}

static uint32_t link_id_of(int fd)
{
	struct bpf_link_info li;
	uint32_t len = sizeof(li);

	memset(&li, 0, sizeof(li));
	if (bpf_link_get_info_by_fd(fd, &li, &len))
		return 0;
	return li.id;
}

/*
 * The pinned link of @dev_id: an fd (*@id its link id), or -errno.  A pin
 * whose link is not the device's current one is a leftover (of a device
 * deleted since, whose id was reused): it is removed, and -ENOENT.  A
 * kernel that reports link id 0 (it read the id before the link had one)
 * is taken at its word that a program is attached.
 */
static int pinned_link(uint32_t dev_id, uint32_t *id)
{
	struct hybd_dev_info info;
	char pin[PATH_MAX];
	int fd, ret;

	hybd__bpf_pin_path(pin, sizeof(pin), dev_id, "link");
	fd = bpf_obj_get(pin);
	if (fd < 0)
		return -errno;
	*id = link_id_of(fd);
	ret = hybd_ctl_info(dev_id, &info);
	if (ret && ret != -ENODEV) {
		close(fd);
		return ret;
	}
	if (!*id || ret || !info.bpf_name[0] ||
	    (info.bpf_link_id && info.bpf_link_id != *id)) {
		close(fd);
		hybd_bpf_unpin_all(dev_id);
		return -ENOENT;
	}
	return fd;
}

/*
 * Unpinning drops the link's last reference from an RCU callback: the
 * kernel releases the program a little later.  Wait for it, so that
 * detach means detached.
 */
static void wait_released(uint32_t dev_id, uint32_t link_id)
{
	struct timespec ts = { 0, 10 * 1000 * 1000 };
	struct hybd_dev_info info;
	int i;

	for (i = 0; link_id && i < HYBD_DETACH_WAIT_MS / 10; i++) {
		if (hybd_ctl_info(dev_id, &info) || !info.bpf_name[0] ||
		    (info.bpf_link_id && info.bpf_link_id != link_id))
			return;
		nanosleep(&ts, NULL);
	}
}

/*
 * Message for an attach or replace (@what: "attaching to", "replacing the
 * fast path of") that the kernel refused with @err.
 */
static int update_err(uint32_t dev_id, int err, const char *what)
{
	switch (err) {
	case -EPERM:
		return hybd__err(err,
				 "%s hybd%u needs CAP_SYS_ADMIN (CAP_BPF and CAP_PERFMON are not enough)",
				 what, dev_id);
	case -ESTALE:
		return hybd__err(err,
				 "%s hybd%u: this loaded program was attached before and missed the device's writes since; load it again",
				 what, dev_id);
	case -ENODEV:
		return hybd__err(err, "%s hybd%u failed: the device is gone",
				 what, dev_id);
	default:
		return hybd__err(err, "%s hybd%u failed: %s", what, dev_id,
				 strerror(-err));
	}
}

/* Message for an attach that the kernel refused with @err. */
static int attach_err(uint32_t dev_id, int err)
{
	struct hybd_dev_info info;

	switch (err) {
	case -EBUSY:
		if (!hybd_ctl_info(dev_id, &info) && info.bpf_name[0])
			return hybd__err(err,
					 "hybd%u already has a fast path: %.*s (link %u); detach or replace it",
					 dev_id, (int)sizeof(info.bpf_name),
					 info.bpf_name, info.bpf_link_id);
		return hybd__err(err, "hybd%u already has a fast path", dev_id);
	case -ENODEV:
		if (!hybd_ctl_info(dev_id, &info))
			return hybd__err(err,
					 "hybd%u is %s: it takes no fast path",
					 dev_id, info.state == HYBD_STATE_DEAD ?
					 "dead (its server is gone)" :
					 "being deleted");
		return hybd__err(err, "no device hybd%u", dev_id);
	default:
		return update_err(dev_id, err, "attaching to");
	}
}

/*
 * Message for a replace or detach (@verb) that finds no pinned program:
 * -EBUSY if the device has one that a process holds, else -ENOENT.
 */
static int not_pinned_err(uint32_t dev_id, const char *verb)
{
	struct hybd_dev_info info;
	int ret;

	ret = hybd_ctl_info(dev_id, &info);
	if (ret)
		return ret;	/* no such device, no module: said already */
	if (info.bpf_name[0] || info.bpf_link_id)
		return hybd__err(-EBUSY,
				 "the fast path of hybd%u (%.*s, link %u) is not pinned: only the process that attached it can %s it",
				 dev_id, (int)sizeof(info.bpf_name),
				 info.bpf_name, info.bpf_link_id, verb);
	return hybd__err(-ENOENT, "hybd%u has no fast path to %s", dev_id,
			 verb);
}

/*
 * Swap the program of device @dev_id's pinned link for @b's map.
 *
 * libbpf (1.4) writes a struct_ops map's value, which the kernel needs
 * before a link can take the map, only on the way to attaching it: in
 * bpf_map__attach_struct_ops() and bpf_link__update_map(), and the latter
 * wants a link this process created.  So the caller has tried to attach
 * @b's map, which the device refused (-EBUSY) with the value written, and
 * the link update below finds the map ready.
 */
static int hybd_bpf_swap_pinned(struct hybd_bpf *b)
{
	uint32_t id = 0;
	int fd, ret;

	fd = pinned_link(b->dev_id, &id);
	if (fd < 0)
		return not_pinned_err(b->dev_id, "replace");
	ret = bpf_link_update(fd, bpf_map__fd(b->ops_map), NULL);
	ret = ret < 0 ? -errno : 0;
	close(fd);
	if (ret)
		return update_err(b->dev_id, ret, "replacing the fast path of");
	b->link_id = id;
	return 0;
}

static void hybd_bpf_free(struct hybd_bpf *b)
{
	if (!b)
		return;
	/* closes our link fd: a pinned link stays, an unpinned one goes */
	bpf_link__destroy(b->link);
	bpf_object__close(b->obj);
	free(b);
}

/* bpffs mounted, /sys/fs/bpf/hybd/<id>/ there; the link's pin path. */
static int hybd_bpf_pin_dir(uint32_t dev_id, char *pin, size_t size)
{
	int ret;

	ret = hybd_bpffs_ready();
	if (ret)
		return ret;
	hybd__bpf_pin_path(pin, size, dev_id, NULL);
	ret = hybd_mkdir(HYBD_PIN_DIR);
	if (!ret)
		ret = hybd_mkdir(pin);
	if (ret)
		return hybd__err(ret, "cannot create %s: %s", pin,
				 strerror(-ret));
	hybd__bpf_pin_path(pin, size, dev_id, "link");
	return 0;
}

int hybd_bpf_attach(uint32_t dev_id, const char *path, unsigned int flags,
		    struct hybd_bpf **bp)
{
	char pin[PATH_MAX];
	struct hybd_bpf *b;
	uint32_t id;
	int ret, fd;

	if (!bp || !path)
		return hybd__err(-EINVAL, "hybd_bpf_attach: no path or handle");
	*bp = NULL;
	if (flags & ~(HYBD_BPF_F_PIN | HYBD_BPF_F_REPLACE))
		return hybd__err(-EINVAL, "unknown attach flags 0x%x", flags);
	if ((flags & HYBD_BPF_F_REPLACE) && !(flags & HYBD_BPF_F_PIN))
		return hybd__err(-EINVAL,
				 "replace works on the pinned program; attach with HYBD_BPF_F_PIN or use hybd_bpf_replace()");
	ret = hybd_bpf_check_kernel();
	if (ret)
		return ret;

	b = calloc(1, sizeof(*b));
	if (!b)
		return hybd__err(-ENOMEM, "out of memory");
	b->dev_id = dev_id;
	ret = hybd_bpf_open(path, dev_id, &b->obj, &b->ops_map);
	if (ret)
		goto out_free;
	if (flags & HYBD_BPF_F_REPLACE)
		hybd__bpf_reuse_maps(b->obj, old_pinned_map, &dev_id);
	ret = hybd_bpf_load(b->obj, path);
	if (ret)
		goto out_free;

	if (flags & HYBD_BPF_F_PIN) {
		ret = hybd_bpf_pin_dir(dev_id, pin, sizeof(pin));
		if (ret)
			goto out_free;
		/* drops a leftover pin of an earlier device with this id */
		fd = pinned_link(dev_id, &id);
		if (fd >= 0)
			close(fd);
		if (fd >= 0 && !(flags & HYBD_BPF_F_REPLACE)) {
			ret = attach_err(dev_id, -EBUSY);
			goto out_free;
		}
		if (fd < 0 && (flags & HYBD_BPF_F_REPLACE)) {
			ret = not_pinned_err(dev_id, "replace");
			goto out_free;
		}
	}

	b->link = bpf_map__attach_struct_ops(b->ops_map);
	if (b->link && (flags & HYBD_BPF_F_REPLACE)) {
		/* the program went away since we looked: not ours to add */
		bpf_link__destroy(b->link);
		b->link = NULL;
		ret = hybd__err(-ENOENT, "hybd%u has no fast path to replace",
				dev_id);
		goto out_free;
	}
	if (!b->link) {
		ret = -errno;
		if (ret == -EBUSY && (flags & HYBD_BPF_F_REPLACE)) {
			ret = hybd_bpf_swap_pinned(b);
			if (!ret)
				ret = hybd_bpf_pin_maps(b);
			if (ret)
				goto out_free;
			b->pinned = true;
			*bp = b;
			return 0;
		}
		attach_err(dev_id, ret);
		goto out_free;
	}
	b->link_id = link_id_of(bpf_link__fd(b->link));

	if (flags & HYBD_BPF_F_PIN) {
		unlink(pin);
		ret = bpf_link__pin(b->link, pin);
		if (ret)
			hybd__err(ret, "cannot pin the link at %s: %s", pin,
				  strerror(-ret));
		else
			ret = hybd_bpf_pin_maps(b);
		if (ret) {
			hybd_bpf_unpin_all(dev_id);
			goto out_free;
		}
		b->pinned = true;
	}
	*bp = b;
	return 0;

out_free:
	hybd_bpf_free(b);
	return ret;
}

int hybd_bpf_replace(struct hybd_bpf *b, const char *path)
{
	struct bpf_object *obj, *old_obj;
	struct bpf_map *map, *old_map;
	struct bpf_link *link;
	int ret;

	if (!b || !path)
		return hybd__err(-EINVAL, "hybd_bpf_replace: no handle or path");
	ret = hybd_bpf_open(path, b->dev_id, &obj, &map);
	if (ret)
		return ret;
	hybd__bpf_reuse_maps(obj, old_object_map, b->obj);
	ret = hybd_bpf_load(obj, path);
	if (ret)
		goto out_close;

	if (b->link) {
		ret = bpf_link__update_map(b->link, map);
		if (ret)
			update_err(b->dev_id, ret, "replacing the fast path of");
	} else {
		/* the pin holds the link: see hybd_bpf_swap_pinned() */
		link = bpf_map__attach_struct_ops(map);
		ret = link ? 0 : -errno;
		if (link) {
			/* the device had lost its program meanwhile */
			bpf_link__destroy(link);
			ret = not_pinned_err(b->dev_id, "replace");
		} else if (ret != -EBUSY) {
			attach_err(b->dev_id, ret);
		} else {
			old_map = b->ops_map;
			b->ops_map = map;
			ret = hybd_bpf_swap_pinned(b);
			b->ops_map = old_map;
		}
	}
	if (ret)
		goto out_close;

	/* the link holds the new map now; the old object can go */
	old_obj = b->obj;
	b->obj = obj;
	b->ops_map = map;
	bpf_object__close(old_obj);
	if (b->pinned)
		return hybd_bpf_pin_maps(b);
	return 0;

out_close:
	bpf_object__close(obj);
	return ret;
}

int hybd_bpf_detach(struct hybd_bpf *b)
{
	uint32_t dev_id, link_id;
	bool pinned;

	if (!b)
		return 0;
	dev_id = b->dev_id;
	link_id = b->link_id;
	pinned = b->pinned;
	if (pinned)
		hybd_bpf_unpin_all(dev_id);
	hybd_bpf_free(b);
	/* an unpinned link went with its fd; a pin goes a little later */
	if (pinned)
		wait_released(dev_id, link_id);
	return 0;
}

void hybd_bpf_close(struct hybd_bpf *b)
{
	hybd_bpf_free(b);
}

int hybd_bpf_detach_pinned(uint32_t dev_id)
{
	uint32_t id = 0;
	int fd;

	fd = pinned_link(dev_id, &id);
	if (fd == -ENOENT)
		return not_pinned_err(dev_id, "detach");
	if (fd < 0)
		return hybd__err(fd, "cannot open the pinned link of hybd%u: %s",
				 dev_id, strerror(-fd));
	close(fd);
	hybd_bpf_unpin_all(dev_id);
	wait_released(dev_id, id);
	return 0;
}

int hybd_bpf_map_fd(struct hybd_bpf *b, const char *name)
{
	struct bpf_map *map;

	if (!b || !name)
		return hybd__err(-EINVAL, "hybd_bpf_map_fd: no handle or name");
	map = bpf_object__find_map_by_name(b->obj, name);
	if (!map)
		return hybd__err(-ENOENT, "the fast path has no map named %s",
				 name);
	return bpf_map__fd(map);
}
