// SPDX-License-Identifier: MIT
/*
 * hybdctl: the attached program's own counters (stats --maps).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/btf.h>

#include "hybdctl.h"

/*
 * The attached program's own counters: its global variables, which libbpf
 * keeps in one array map per section (.bss, .data; "cache.bss").  They are
 * found from the device's link, not from the pins (libhybd pins no
 * internal map, and a program a driver attached is not pinned at all):
 * link -> struct_ops map, whose value holds the id of each callback's
 * program -> the maps those programs use -> the ones whose BTF value type
 * is a .bss or .data DATASEC, read and shown variable by variable.
 */

#define MAX_OPS_PROGS	16
#define MAX_PROG_MAPS	64
#define MAX_ARRAY_SHOWN	64	/* elements of an array of integers */
#define MAX_HEX_SHOWN	64	/* bytes of anything else */

void prog_counters_free(struct prog_counters *pc)
{
	size_t i;

	for (i = 0; i < pc->nr; i++) {
		free(pc->v[i].name);
		free(pc->v[i].text);
		free(pc->v[i].json);
	}
	free(pc->v);
	memset(pc, 0, sizeof(*pc));
}

static const struct btf_type *skip_mods(const struct btf *btf, __u32 *id)
{
	const struct btf_type *t = btf__type_by_id(btf, *id);

	while (t && (btf_is_mod(t) || btf_is_typedef(t))) {
		*id = t->type;
		t = btf__type_by_id(btf, *id);
	}
	return t;
}

/* An integer of 1, 2, 4 or 8 bytes (or an enum): its size, or 0. */
static unsigned int int_size(const struct btf_type *t, int *is_signed)
{
	*is_signed = 0;
	if (btf_is_int(t)) {
		if (btf_int_offset(t) || btf_int_bits(t) != t->size * 8)
			return 0;	/* a bit field */
		*is_signed = !!(btf_int_encoding(t) & BTF_INT_SIGNED);
	} else if (btf_is_any_enum(t)) {
		*is_signed = btf_kflag(t);
	} else {
		return 0;
	}
	return t->size == 1 || t->size == 2 || t->size == 4 || t->size == 8 ?
	       t->size : 0;
}

static void put_int(FILE *f, const unsigned char *p, unsigned int size,
		    int is_signed)
{
	uint64_t u = 0;
	int64_t i;

	switch (size) {
	case 1: { uint8_t v; memcpy(&v, p, 1); u = v; i = (int8_t)v; break; }
	case 2: { uint16_t v; memcpy(&v, p, 2); u = v; i = (int16_t)v; break; }
	case 4: { uint32_t v; memcpy(&v, p, 4); u = v; i = (int32_t)v; break; }
	default: memcpy(&u, p, 8); i = (int64_t)u; break;
	}
	if (is_signed)
		fprintf(f, "%" PRId64, i);
	else
		fprintf(f, "%" PRIu64, u);
}

/*
 * Format the variable of type @id at @p (@size bytes): an integer in
 * decimal, an array of up to MAX_ARRAY_SHOWN integers as a list, anything
 * else of up to MAX_HEX_SHOWN bytes in hex, larger ones not at all.
 */
static void format_var(const struct btf *btf, __u32 id, const unsigned char *p,
		       __u32 size, FILE *text, FILE *json)
{
	const struct btf_type *t = skip_mods(btf, &id), *et;
	unsigned int isz, i, n;
	__u32 eid;
	int sgn;

	if (t && (isz = int_size(t, &sgn)) && isz == size) {
		put_int(text, p, isz, sgn);
		put_int(json, p, isz, sgn);
		return;
	}
	if (t && btf_is_array(t)) {
		eid = btf_array(t)->type;
		et = skip_mods(btf, &eid);
		n = btf_array(t)->nelems;
		isz = et ? int_size(et, &sgn) : 0;
		if (isz && (uint64_t)n * isz == size && n <= MAX_ARRAY_SHOWN) {
			fputc('[', text);
			fputc('[', json);
			for (i = 0; i < n; i++) {
				fputs(i ? ", " : "", text);
				fputs(i ? "," : "", json);
				put_int(text, p + i * isz, isz, sgn);
				put_int(json, p + i * isz, isz, sgn);
			}
			fputc(']', text);
			fputc(']', json);
			return;
		}
	}
	if (size > MAX_HEX_SHOWN) {
		fprintf(text, "(%u bytes, not shown)", size);
		fputs("null", json);
		return;
	}
	fputs("0x", text);
	fputs("\"0x", json);
	for (i = 0; i < size; i++) {
		fprintf(text, "%02x", p[i]);
		fprintf(json, "%02x", p[i]);
	}
	fputc('"', json);
}

static int counters_add(struct prog_counters *pc, const char *map,
			const char *name)
{
	struct prog_counter *v = realloc(pc->v, (pc->nr + 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	pc->v = v;
	v += pc->nr;
	memset(v, 0, sizeof(*v));
	snprintf(v->map, sizeof(v->map), "%s", map);
	v->name = strdup(name);
	if (!v->name)
		return -ENOMEM;
	pc->nr++;
	return 0;
}

/* The variables of map @map_id, if it holds a .bss or .data section. */
static int read_global_map(struct prog_counters *pc, __u32 map_id)
{
	const struct btf_var_secinfo *vs;
	struct bpf_map_info mi;
	__u32 len = sizeof(mi), key = 0, i;
	const struct btf_type *t, *var;
	struct prog_counter *v;
	struct btf *btf = NULL;
	unsigned char *val = NULL;
	const char *sec;
	size_t tsz, jsz;
	FILE *text, *json;
	int fd, ret;

	fd = bpf_map_get_fd_by_id(map_id);
	if (fd < 0)
		return fd == -ENOENT ? 0 : fd;	/* gone meanwhile */
	memset(&mi, 0, sizeof(mi));
	ret = bpf_map_get_info_by_fd(fd, &mi, &len);
	if (ret || mi.type != BPF_MAP_TYPE_ARRAY || !mi.btf_id ||
	    !mi.btf_value_type_id || !mi.value_size)
		goto out;
	btf = btf__load_from_kernel_by_id(mi.btf_id);
	if (!btf) {
		ret = -errno;
		goto out;
	}
	t = btf__type_by_id(btf, mi.btf_value_type_id);
	sec = t ? btf__name_by_offset(btf, t->name_off) : NULL;
	if (!t || !btf_is_datasec(t) || !sec ||
	    (strncmp(sec, ".bss", 4) && strncmp(sec, ".data", 5)))
		goto out;	/* a map, .rodata or .kconfig */
	val = calloc(1, mi.value_size);
	if (!val) {
		ret = -ENOMEM;
		goto out;
	}
	ret = bpf_map_lookup_elem(fd, &key, val);
	if (ret)
		goto out;
	vs = btf_var_secinfos(t);
	for (i = 0; i < btf_vlen(t); i++, vs++) {
		var = btf__type_by_id(btf, vs->type);
		if (!var || !btf_is_var(var) ||
		    (uint64_t)vs->offset + vs->size > mi.value_size)
			continue;
		ret = counters_add(pc, mi.name,
				   btf__name_by_offset(btf, var->name_off));
		if (ret)
			goto out;
		v = &pc->v[pc->nr - 1];
		text = open_memstream(&v->text, &tsz);
		json = open_memstream(&v->json, &jsz);
		if (text && json)
			format_var(btf, var->type, val + vs->offset, vs->size,
				   text, json);
		if (text)
			fclose(text);
		if (json)
			fclose(json);
		if (!v->text || !v->json) {
			ret = -ENOMEM;
			goto out;
		}
	}
out:
	free(val);
	btf__free(btf);
	close(fd);
	return ret;
}

/* The BTF of vmlinux, loaded once (several MB: --watch asks again). */
static struct btf *vmlinux_btf(void)
{
	static struct btf *btf;

	if (!btf)
		btf = btf__load_vmlinux_btf();
	return btf;
}

/*
 * The ids of the programs of struct_ops map @fd (at most @room): the
 * kernel's view of the map's value has each callback's program id where
 * the user space value had its fd.  Returns the count or -errno.
 */
static int ops_prog_ids(int fd, __u32 *ids, int room)
{
	const struct btf_type *vt, *dt;
	const struct btf_member *m;
	struct bpf_map_info mi;
	__u32 len = sizeof(mi), key = 0, id, i, j;
	struct btf *base, *btf = NULL;
	unsigned char *val = NULL;
	size_t data_off = 0, psz;
	int n = 0, ret, found = 0;
	uint64_t prog;

	memset(&mi, 0, sizeof(mi));
	ret = bpf_map_get_info_by_fd(fd, &mi, &len);
	if (ret)
		return ret;
	base = vmlinux_btf();
	if (!base)
		return -errno;
	if (mi.btf_vmlinux_id)
		btf = btf__load_from_kernel_by_id_split(mi.btf_vmlinux_id, base);
	else
		btf = btf__parse_split("/sys/kernel/btf/hybd", base);
	if (!btf)
		return -errno;
	val = calloc(1, mi.value_size);
	ret = val ? bpf_map_lookup_elem(fd, &key, val) : -ENOMEM;
	if (ret)
		goto out;
	/* struct bpf_struct_ops_hybd_bpf_ops { common; struct hybd_bpf_ops data; } */
	vt = btf__type_by_id(btf, mi.btf_vmlinux_value_type_id);
	ret = -ENOENT;
	if (!vt || !btf_is_struct(vt))
		goto out;
	m = btf_members(vt);
	for (i = 0; i < btf_vlen(vt) && !found; i++, m++) {
		if (!strcmp(btf__name_by_offset(btf, m->name_off), "data")) {
			data_off = btf_member_bit_offset(vt, i) / 8;
			id = m->type;
			found = 1;
		}
	}
	dt = found ? skip_mods(btf, &id) : NULL;
	if (!dt || !btf_is_struct(dt))
		goto out;
	psz = btf__pointer_size(btf);
	if (psz != 4 && psz != 8)
		psz = sizeof(void *);
	m = btf_members(dt);
	for (i = 0; i < btf_vlen(dt); i++, m++) {
		const struct btf_type *mt;
		size_t off = data_off + btf_member_bit_offset(dt, i) / 8;

		id = m->type;
		mt = skip_mods(btf, &id);
		if (!mt || !btf_is_ptr(mt) || off + psz > mi.value_size)
			continue;
		id = mt->type;
		mt = skip_mods(btf, &id);
		if (!mt || !btf_is_func_proto(mt))
			continue;
		prog = 0;
		memcpy(&prog, val + off, psz);	/* little-endian hosts */
		if (!prog)
			continue;
		for (j = 0; j < (__u32)n && ids[j] != prog; j++)
			;
		if (j == (__u32)n && n < room)
			ids[n++] = (__u32)prog;
	}
	ret = n;
out:
	free(val);
	btf__free(btf);
	return ret;
}

/* The maps the programs @ids use, unique; returns the count or -errno. */
static int progs_map_ids(const __u32 *ids, int n, __u32 *maps, int room)
{
	__u32 used[MAX_PROG_MAPS], len, k, j;
	struct bpf_prog_info pi;
	int i, fd, nr = 0, ret;

	for (i = 0; i < n; i++) {
		fd = bpf_prog_get_fd_by_id(ids[i]);
		if (fd < 0)
			return fd;
		memset(&pi, 0, sizeof(pi));
		pi.nr_map_ids = MAX_PROG_MAPS;
		pi.map_ids = (__u64)(uintptr_t)used;
		len = sizeof(pi);
		ret = bpf_prog_get_info_by_fd(fd, &pi, &len);
		close(fd);
		if (ret)
			return ret;
		for (k = 0; k < pi.nr_map_ids && k < MAX_PROG_MAPS; k++) {
			for (j = 0; j < (__u32)nr && maps[j] != used[k]; j++)
				;
			if (j == (__u32)nr && nr < room)
				maps[nr++] = used[k];
		}
	}
	return nr;
}

/* The device's link: by the id info gives, else its pin. */
static int device_link_fd(uint32_t dev_id, const struct hybd_dev_info *info)
{
	char pin[64];
	int fd = -ENOENT;

	if (info->bpf_link_id)
		fd = bpf_link_get_fd_by_id(info->bpf_link_id);
	if (fd < 0) {
		snprintf(pin, sizeof(pin), "/sys/fs/bpf/hybd/%u/link", dev_id);
		fd = bpf_obj_get(pin);
	}
	return fd;
}

/* Fill @pc with the counters of @dev_id's fast path.  Returns 0 or -errno. */
int read_prog_counters(uint32_t dev_id, const struct hybd_dev_info *info,
		       struct prog_counters *pc)
{
	__u32 progs[MAX_OPS_PROGS], maps[MAX_PROG_MAPS], len;
	struct bpf_link_info li;
	int fd, mfd, n, i, ret;
	const char *what = "the link";

	memset(pc, 0, sizeof(*pc));
	if (!has_bpf(info))
		return 0;
	pc->attached = 1;
	fd = device_link_fd(dev_id, info);
	if (fd < 0) {
		ret = fd;
		goto fail;
	}
	memset(&li, 0, sizeof(li));
	len = sizeof(li);
	ret = bpf_link_get_info_by_fd(fd, &li, &len);
	close(fd);
	if (!ret && li.type != BPF_LINK_TYPE_STRUCT_OPS)
		ret = -EINVAL;
	if (ret)
		goto fail;
	what = "the struct_ops map";
	mfd = bpf_map_get_fd_by_id(li.struct_ops.map_id);
	if (mfd < 0) {
		ret = mfd;
		goto fail;
	}
	n = ops_prog_ids(mfd, progs, MAX_OPS_PROGS);
	close(mfd);
	if (n < 0) {
		ret = n;
		goto fail;
	}
	what = "the programs";
	n = progs_map_ids(progs, n, maps, MAX_PROG_MAPS);
	if (n < 0) {
		ret = n;
		goto fail;
	}
	what = "a map";
	for (i = 0; i < n; i++) {
		ret = read_global_map(pc, maps[i]);
		if (ret)
			goto fail;
	}
	return 0;
fail:
	snprintf(pc->err, sizeof(pc->err), "cannot read %s: %s", what,
		 strerror(-ret));
	return ret;
}

void prog_counters_text(const struct hybd_dev_info *info,
			const struct prog_counters *pc)
{
	const char *map = "";
	char desc[64];
	size_t i;

	putchar('\n');
	if (!pc->attached) {
		printf("fast-path counters: no fast path attached\n");
		return;
	}
	bpf_desc(info, desc, sizeof(desc));
	if (pc->err[0]) {
		printf("fast-path counters of %s: %s\n", desc, pc->err);
		return;
	}
	if (!pc->nr) {
		printf("fast-path counters of %s: no counters\n", desc);
		return;
	}
	printf("fast-path counters of %s:\n", desc);
	for (i = 0; i < pc->nr; i++) {
		if (strcmp(map, pc->v[i].map)) {
			map = pc->v[i].map;
			printf("  %s\n", map);
		}
		printf("    %-24s %s\n", pc->v[i].name, pc->v[i].text);
	}
}

/* The "maps" member: {"cache.bss":{"hits":1,...}}, {} or null. */
void prog_counters_json(const struct prog_counters *pc)
{
	const char *map = NULL;
	size_t i;

	printf("\"maps\":");
	if (!pc->attached || pc->err[0]) {
		printf("null");
		return;
	}
	putchar('{');
	for (i = 0; i < pc->nr; i++) {
		if (!map || strcmp(map, pc->v[i].map)) {
			if (map)
				printf("},");
			map = pc->v[i].map;
			print_json_string(map, strlen(map));
			printf(":{");
		} else {
			putchar(',');
		}
		print_json_string(pc->v[i].name, strlen(pc->v[i].name));
		printf(":%s", pc->v[i].json);
	}
	printf("%s}", map ? "}" : "");
}
