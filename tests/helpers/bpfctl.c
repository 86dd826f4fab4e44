// SPDX-License-Identifier: GPL-2.0
/*
 * bpfctl - drive libbpf step by step for the fast-path tests: what
 * `hybdctl attach` never does on purpose (attach a loaded map a second
 * time, keep a link across a device's deletion, replace through many maps
 * of one object, attach without CAP_SYS_ADMIN, load a struct_ops of
 * another kind).
 *
 *   bpfctl load PATH
 *	open and load PATH, attach nothing; exit 0 if it loaded, 1 if not,
 *	with libbpf's messages (the verifier's log) on stderr.  Once
 *	loaded, one line per program on stdout: "NAME VERIFIED_INSNS",
 *	the instructions the verifier walked (its limit is 1M).
 *
 *   bpfctl run
 *	read commands from stdin, one per line; answer each with one line,
 *	"ok [VALUE...]" or "err ERRNO":
 *
 *	open OBJ PATH DEV_ID    load PATH as OBJ; every struct hybd_bpf_ops
 *	                        map in it is pointed at device DEV_ID
 *	attach LINK OBJ MAP     a new link for OBJ's struct_ops map MAP
 *	                        (bpf_map__attach_struct_ops; it may be called
 *	                        again on the same map); ok LINK_ID
 *	update LINK OBJ MAP     swap LINK's map for OBJ's MAP (link update)
 *	detach LINK             BPF_LINK_DETACH; LINK's fd stays open
 *	close LINK              close LINK's fd
 *	lookup OBJ MAP KEY      the value at KEY (u32) of an array map: ok and
 *	                        the value's u64 words, summed over the CPUs
 *	                        for a per-CPU map
 *	caps drop|raise         take CAP_SYS_ADMIN out of the effective set,
 *	                        or put it back (CAP_BPF, CAP_PERFMON stay)
 *	quit
 *
 * Names are single words.  libbpf's messages go to stderr.
 */
#include <errno.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include "uapi/hybd.h"

#define MAX_NAMED	64
#define NAME_LEN	32

struct named {
	char name[NAME_LEN];
	struct bpf_object *obj;
	struct bpf_link *link;
};

static struct named objs[MAX_NAMED], links[MAX_NAMED];

static struct named *find(struct named *tab, const char *name, bool create)
{
	struct named *free_slot = NULL;
	int i;

	for (i = 0; i < MAX_NAMED; i++) {
		if (tab[i].name[0] && !strcmp(tab[i].name, name))
			return &tab[i];
		if (!tab[i].name[0] && !free_slot)
			free_slot = &tab[i];
	}
	if (!create || !free_slot || strlen(name) >= NAME_LEN)
		return NULL;
	strcpy(free_slot->name, name);
	return free_slot;
}

static void reply_err(int err)
{
	printf("err %d\n", err < 0 ? -err : err);
}

static bool is_hybd_ops(const struct bpf_object *obj,
			const struct bpf_map *map)
{
	const struct btf *btf = bpf_object__btf(obj);
	const struct btf_type *t;
	const char *name;

	if (!btf || bpf_map__type(map) != BPF_MAP_TYPE_STRUCT_OPS)
		return false;
	t = btf__type_by_id(btf, bpf_map__btf_value_type_id(map));
	name = t ? btf__name_by_offset(btf, t->name_off) : NULL;
	return name && !strcmp(name, "hybd_bpf_ops");
}

static int open_obj(const char *path, long dev_id, struct bpf_object **objp)
{
	struct bpf_object *obj;
	struct hybd_bpf_ops *ops;
	struct bpf_map *map;
	size_t size;
	int err;

	obj = bpf_object__open_file(path, NULL);
	if (!obj)
		return -errno;
	bpf_object__for_each_map(map, obj) {
		if (!is_hybd_ops(obj, map))
			continue;
		ops = bpf_map__initial_value(map, &size);
		if (!ops || size < sizeof(*ops)) {
			bpf_object__close(obj);
			return -EINVAL;
		}
		ops->dev_id = dev_id;
	}
	err = bpf_object__load(obj);
	if (err) {
		bpf_object__close(obj);
		return err < 0 ? err : -EINVAL;
	}
	*objp = obj;
	return 0;
}

static struct bpf_map *obj_map(const char *obj_name, const char *map_name)
{
	struct named *o = find(objs, obj_name, false);

	if (!o || !o->obj)
		return NULL;
	return bpf_object__find_map_by_name(o->obj, map_name);
}

static uint32_t link_id(struct bpf_link *link)
{
	struct bpf_link_info li;
	uint32_t len = sizeof(li);

	memset(&li, 0, sizeof(li));
	if (bpf_link_get_info_by_fd(bpf_link__fd(link), &li, &len))
		return 0;
	return li.id;
}

static int lookup(struct bpf_map *map, uint32_t key)
{
	size_t vsize = bpf_map__value_size(map), words = vsize / 8, i, c;
	bool percpu = bpf_map__type(map) == BPF_MAP_TYPE_PERCPU_ARRAY;
	int cpus = percpu ? libbpf_num_possible_cpus() : 1;
	uint64_t *val, sum;
	int err;

	if (cpus < 1 || !words || vsize % 8)
		return -EINVAL;
	val = calloc(cpus, vsize);
	if (!val)
		return -ENOMEM;
	err = bpf_map__lookup_elem(map, &key, sizeof(key), val,
				   vsize * cpus, 0);
	if (err) {
		free(val);
		return err;
	}
	printf("ok");
	for (i = 0; i < words; i++) {
		for (sum = 0, c = 0; c < (size_t)cpus; c++)
			sum += val[c * words + i];
		printf(" %" PRIu64, sum);
	}
	printf("\n");
	free(val);
	return 0;
}

/* CAP_SYS_ADMIN in or out of the effective set; the rest unchanged. */
static int set_sys_admin(bool on)
{
	struct __user_cap_header_struct hdr = {
		.version = _LINUX_CAPABILITY_VERSION_3,
	};
	struct __user_cap_data_struct data[2];

	if (syscall(SYS_capget, &hdr, data))
		return -errno;
	if (on)
		data[0].effective |= 1U << CAP_SYS_ADMIN;
	else
		data[0].effective &= ~(1U << CAP_SYS_ADMIN);
	if (syscall(SYS_capset, &hdr, data))
		return -errno;
	return 0;
}

static void run_one(int argc, char **argv)
{
	struct bpf_object *obj;
	struct bpf_map *map;
	struct named *n;
	char *end;
	long num;
	int err;

	if (!strcmp(argv[0], "open") && argc == 4) {
		num = strtol(argv[3], &end, 0);
		n = find(objs, argv[1], true);
		if (*end || !n || n->obj)
			return reply_err(EINVAL);
		err = open_obj(argv[2], num, &obj);
		if (err) {
			n->name[0] = '\0';
			return reply_err(err);
		}
		n->obj = obj;
		printf("ok\n");
	} else if (!strcmp(argv[0], "attach") && argc == 4) {
		map = obj_map(argv[2], argv[3]);
		n = find(links, argv[1], true);
		if (!map || !n || n->link)
			return reply_err(EINVAL);
		n->link = bpf_map__attach_struct_ops(map);
		if (!n->link) {
			err = -errno;
			n->name[0] = '\0';
			return reply_err(err);
		}
		printf("ok %u\n", link_id(n->link));
	} else if (!strcmp(argv[0], "update") && argc == 4) {
		map = obj_map(argv[2], argv[3]);
		n = find(links, argv[1], false);
		if (!map || !n)
			return reply_err(EINVAL);
		err = bpf_link__update_map(n->link, map);
		if (err)
			return reply_err(err);
		printf("ok\n");
	} else if (!strcmp(argv[0], "detach") && argc == 2) {
		n = find(links, argv[1], false);
		if (!n)
			return reply_err(EINVAL);
		err = bpf_link__detach(n->link);
		if (err)
			return reply_err(err);
		printf("ok\n");
	} else if (!strcmp(argv[0], "close") && argc == 2) {
		n = find(links, argv[1], false);
		if (!n)
			return reply_err(EINVAL);
		bpf_link__destroy(n->link);
		memset(n, 0, sizeof(*n));
		printf("ok\n");
	} else if (!strcmp(argv[0], "lookup") && argc == 4) {
		num = strtol(argv[3], &end, 0);
		map = obj_map(argv[1], argv[2]);
		if (*end || !map)
			return reply_err(EINVAL);
		err = lookup(map, num);
		if (err)
			return reply_err(err);
	} else if (!strcmp(argv[0], "caps") && argc == 2 &&
		   (!strcmp(argv[1], "drop") || !strcmp(argv[1], "raise"))) {
		err = set_sys_admin(!strcmp(argv[1], "raise"));
		if (err)
			return reply_err(err);
		printf("ok\n");
	} else {
		reply_err(EINVAL);
	}
}

static int run(void)
{
	char line[4096], *argv[8], *tok, *save;
	int argc, i;

	while (fgets(line, sizeof(line), stdin)) {
		argc = 0;
		for (tok = strtok_r(line, " \t\n", &save); tok && argc < 8;
		     tok = strtok_r(NULL, " \t\n", &save))
			argv[argc++] = tok;
		if (!argc)
			continue;
		if (!strcmp(argv[0], "quit"))
			break;
		run_one(argc, argv);
		fflush(stdout);
	}
	for (i = 0; i < MAX_NAMED; i++)
		bpf_link__destroy(links[i].link);
	for (i = 0; i < MAX_NAMED; i++)
		bpf_object__close(objs[i].obj);
	return 0;
}

/* "NAME VERIFIED_INSNS" for each program of a loaded object */
static int print_verified(struct bpf_object *obj)
{
	struct bpf_prog_info info;
	struct bpf_program *p;
	__u32 len;
	int err;

	bpf_object__for_each_program(p, obj) {
		if (!bpf_program__autoload(p))
			continue;
		memset(&info, 0, sizeof(info));
		len = sizeof(info);
		err = bpf_prog_get_info_by_fd(bpf_program__fd(p), &info, &len);
		if (err) {
			fprintf(stderr, "bpfctl: %s: no program info: %s\n",
				bpf_program__name(p), strerror(-err));
			return err;
		}
		printf("%s %u\n", bpf_program__name(p), info.verified_insns);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct bpf_object *obj;
	int err;

	if (argc == 3 && !strcmp(argv[1], "load")) {
		err = open_obj(argv[2], 0, &obj);
		if (err) {
			fprintf(stderr, "bpfctl: loading %s failed: %s\n",
				argv[2], strerror(-err));
			return 1;
		}
		err = print_verified(obj);
		bpf_object__close(obj);
		return err ? 1 : 0;
	}
	if (argc == 2 && !strcmp(argv[1], "run"))
		return run();
	fprintf(stderr, "usage: bpfctl load PATH | bpfctl run (commands on stdin)\n");
	return 2;
}
