// SPDX-License-Identifier: MIT
/*
 * libhybd - a fast path's maps: sized from the device before the program
 * is loaded (HYBD_PER_BLOCK, HYBD_BLOCK_BITMAP, hybd_dev_blocks), carried
 * over by an atomic replace, and reached from the slow path (a pinned
 * map opened, filled, mmapped).
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include "hybd_internal.h"

/* hybd.bpf.h's HYBD_PER_BLOCK and HYBD_BLOCK_BITMAP, and their block */
#define HYBD_PER_BLOCK_TAG	"hybd:per_block"
#define HYBD_BLOCK_BITMAP_TAG	"hybd:block_bitmap"
#define HYBD_BPF_BLOCK		4096

/* Is map @name tagged @tag (HYBD_PER_BLOCK_TAG...) in @btf? */
static bool map_has_tag(const struct btf *btf, const char *name,
			const char *tag)
{
	unsigned int i, n = btf__type_cnt(btf);

	for (i = 1; i < n; i++) {
		const struct btf_type *t = btf__type_by_id(btf, i), *v;

		if (!btf_is_decl_tag(t) || btf_decl_tag(t)->component_idx != -1)
			continue;
		if (strcmp(btf__name_by_offset(btf, t->name_off), tag))
			continue;
		v = btf__type_by_id(btf, t->type);
		if (v && btf_is_var(v) &&
		    !strcmp(btf__name_by_offset(btf, v->name_off), name))
			return true;
	}
	return false;
}

/* Set the .rodata variable @var (a __u64) of @obj to @val, if it has one. */
static void set_rodata_u64(struct bpf_object *obj, const char *var,
			   uint64_t val)
{
	const struct btf *btf = bpf_object__btf(obj);
	const struct btf_var_secinfo *vs;
	const struct btf_type *sec;
	struct bpf_map *map;
	unsigned int i;
	size_t size;
	char *data;
	int id;

	if (!btf)
		return;
	id = btf__find_by_name_kind(btf, ".rodata", BTF_KIND_DATASEC);
	if (id < 0)
		return;
	sec = btf__type_by_id(btf, id);
	bpf_object__for_each_map(map, obj) {
		const char *name = bpf_map__name(map);
		size_t len = strlen(name);

		if (!bpf_map__is_internal(map) || len < 7 ||
		    strcmp(name + len - 7, ".rodata"))
			continue;
		data = bpf_map__initial_value(map, &size);
		if (!data)
			return;
		vs = btf_var_secinfos(sec);
		for (i = 0; i < btf_vlen(sec); i++, vs++) {
			const struct btf_type *v = btf__type_by_id(btf, vs->type);

			if (strcmp(btf__name_by_offset(btf, v->name_off), var) ||
			    vs->size != sizeof(val) ||
			    vs->offset + sizeof(val) > size)
				continue;
			memcpy(data + vs->offset, &val, sizeof(val));
		}
		return;
	}
}

/*
 * Size @obj for device @dev_id (hybd.bpf.h): hybd_dev_blocks, each
 * HYBD_PER_BLOCK map to one entry per block and each HYBD_BLOCK_BITMAP map
 * to one 64-bit word per 64 blocks, capped at what the map declares.
 */
int hybd__bpf_size_maps(struct bpf_object *obj, uint32_t dev_id,
			 const char *path)
{
	const struct btf *btf = bpf_object__btf(obj);
	struct hybd_dev_info info;
	struct bpf_map *map;
	uint64_t blocks, want;
	int ret;

	ret = hybd_ctl_info(dev_id, &info);
	if (ret)
		return ret;
	blocks = (info.params.basic.dev_size + HYBD_BPF_BLOCK - 1) /
		 HYBD_BPF_BLOCK;
	set_rodata_u64(obj, "hybd_dev_blocks", blocks);
	if (!btf)
		return 0;
	bpf_object__for_each_map(map, obj) {
		const char *name = bpf_map__name(map);
		uint32_t cap = bpf_map__max_entries(map);

		if (map_has_tag(btf, name, HYBD_PER_BLOCK_TAG)) {
			want = blocks;
		} else if (map_has_tag(btf, name, HYBD_BLOCK_BITMAP_TAG)) {
			if (bpf_map__value_size(map) != sizeof(uint64_t))
				return hybd__err(-EINVAL,
						 "%s: map %s is HYBD_BLOCK_BITMAP but its values are not 64-bit words",
						 path, name);
			want = (blocks + 63) / 64;
		} else {
			continue;
		}
		if (bpf_map__type(map) != BPF_MAP_TYPE_ARRAY)
			return hybd__err(-EINVAL,
					 "%s: map %s is sized by the device but not an array",
					 path, name);
		ret = bpf_map__set_max_entries(map, want < cap ?
					       (uint32_t)(want ? want : 1) :
					       cap);
		if (ret)
			return hybd__err(ret, "%s: cannot size map %s", path,
					 name);
	}
	return 0;
}

/*
 * An atomic replace hands the new program the maps of the old one that
 * have the same name and shape (type, key and value size, entries,
 * flags): every request was seen by one program or the other, so their
 * state is still true, and the slow path's fds to them stay valid.  @old
 * gives the old program's fd for a name (-errno if none; we close it).
 *
 * What a program keeps is valid for the version stamps it was stored
 * with: if the new program has hybd_versions and cannot take the old
 * one's (none, or another shape), new versions start from 0, where an
 * old stamp may match again.  Then it takes none of the old maps.
 */
#define REUSE_MAPS_MAX		64		/* more start afresh */
#define HYBD_VERSIONS_MAP	"hybd_versions"	/* hybd_versions.bpf.h's */

void hybd__bpf_reuse_maps(struct bpf_object *obj,
			   int (*old)(void *ctx, const char *name), void *ctx)
{
	struct bpf_map *map, *maps[REUSE_MAPS_MAX];
	int fds[REUSE_MAPS_MAX];
	unsigned int i, n = 0;
	struct bpf_map_info info;
	bool versions = true;
	uint32_t len;
	int fd;

	bpf_object__for_each_map(map, obj) {
		if (bpf_map__is_internal(map) ||
		    bpf_map__type(map) == BPF_MAP_TYPE_STRUCT_OPS)
			continue;
		fd = old(ctx, bpf_map__name(map));
		memset(&info, 0, sizeof(info));
		len = sizeof(info);
		if (fd >= 0 && n < REUSE_MAPS_MAX &&
		    !bpf_map_get_info_by_fd(fd, &info, &len) &&
		    info.type == bpf_map__type(map) &&
		    info.key_size == bpf_map__key_size(map) &&
		    info.value_size == bpf_map__value_size(map) &&
		    info.max_entries == bpf_map__max_entries(map) &&
		    info.map_flags == bpf_map__map_flags(map)) {
			maps[n] = map;
			fds[n++] = fd;
			continue;
		}
		if (fd >= 0)
			close(fd);
		if (!strcmp(bpf_map__name(map), HYBD_VERSIONS_MAP))
			versions = false;
	}
	for (i = 0; i < n; i++) {
		if (versions)
			bpf_map__reuse_fd(maps[i], fds[i]);	/* dups fd */
		close(fds[i]);
	}
}

int hybd_bpf_map_open_pinned(uint32_t dev_id, const char *name)
{
	char path[PATH_MAX];
	int fd;

	if (!name || !name[0] || strchr(name, '/'))
		return hybd__err(-EINVAL, "bad map name '%s'", name ? name : "");
	hybd__bpf_pin_path(path, sizeof(path), dev_id, "maps");
	snprintf(path + strlen(path), sizeof(path) - strlen(path), "/%s",
		 name);
	fd = bpf_obj_get(path);
	if (fd < 0)
		return hybd__err(-errno, "no pinned map %s for hybd%u (%s)",
				 name, dev_id, path);
	return fd;
}

int hybd_bpf_map_fill(int map_fd, uint32_t first, uint32_t count,
		      const void *value)
{
	struct bpf_map_info info;
	uint32_t len = sizeof(info), i, n, done = 0;
	uint32_t keys[1024];
	unsigned char *vals;
	int ret = 0;

	memset(&info, 0, sizeof(info));
	if (bpf_map_get_info_by_fd(map_fd, &info, &len))
		return hybd__err(-errno, "hybd_bpf_map_fill: fd %d is not a map",
				 map_fd);
	if (info.type != BPF_MAP_TYPE_ARRAY || info.key_size != 4)
		return hybd__err(-EINVAL,
				 "hybd_bpf_map_fill: map %s is not an array",
				 info.name);
	if (first > info.max_entries || count > info.max_entries - first)
		return hybd__err(-ERANGE,
				 "hybd_bpf_map_fill: entries %u..%u are past the end of %s (%u entries)",
				 first, first + count - 1, info.name,
				 info.max_entries);
	vals = malloc((size_t)info.value_size * 1024);
	if (!vals)
		return hybd__err(-ENOMEM, "out of memory");
	for (i = 0; i < 1024; i++)
		memcpy(vals + (size_t)i * info.value_size, value,
		       info.value_size);
	while (done < count) {
		n = count - done < 1024 ? count - done : 1024;
		for (i = 0; i < n; i++)
			keys[i] = first + done + i;
		ret = bpf_map_update_batch(map_fd, keys, vals, &n, NULL);
		if (ret) {
			ret = hybd__err(-errno,
					"hybd_bpf_map_fill: updating %s failed",
					info.name);
			break;
		}
		done += n;
	}
	free(vals);
	return ret;
}

void *hybd_bpf_map_mmap(int map_fd, size_t *bytes)
{
	struct bpf_map_info info;
	uint32_t len = sizeof(info);
	long page = sysconf(_SC_PAGESIZE);
	size_t size;
	void *p;

	if (!bytes) {
		hybd__err(-EINVAL, "hybd_bpf_map_mmap: bytes is NULL");
		return NULL;
	}
	memset(&info, 0, sizeof(info));
	if (bpf_map_get_info_by_fd(map_fd, &info, &len)) {
		hybd__err(-errno, "hybd_bpf_map_mmap: fd %d is not a map",
			  map_fd);
		return NULL;
	}
	if (info.type != BPF_MAP_TYPE_ARRAY ||
	    !(info.map_flags & BPF_F_MMAPABLE)) {
		hybd__err(-EINVAL,
			  "hybd_bpf_map_mmap: map %s is not an array declared BPF_F_MMAPABLE",
			  info.name);
		return NULL;
	}
	/* the kernel lays the values out back to back, each rounded to 8 */
	size = (size_t)info.max_entries * ((info.value_size + 7) & ~7U);
	size = (size + page - 1) / page * page;
	p = mmap(NULL, size, info.map_flags & BPF_F_RDONLY_PROG ?
		 PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, map_fd, 0);
	if (p == MAP_FAILED) {
		hybd__err(-errno, "hybd_bpf_map_mmap: cannot map %s", info.name);
		return NULL;
	}
	*bytes = size;
	return p;
}
