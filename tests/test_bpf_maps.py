# SPDX-License-Identifier: GPL-2.0
"""The fast path's maps as libhybd's loader makes them: sized from the
device (HYBD_PER_BLOCK, hybd_dev_blocks), kept across an atomic replace,
absent from programs that do not use them, and seeded from the slow path
(hybd_bpf_map_fill)."""

import json

import pytest

from hybdbpf import (dev_id_of, fastpath, need_bpf, pin_dir,  # noqa: F401
                     prog, read_blocks, settle, stats, delta, suite_prog)
from hybdlib import (REPO, direct_write, hybdctl, need_built, need_tool,
                     pattern, run)

MAPFILL = REPO / "tests" / "helpers" / "mapfill"
BLOCK = 4096


def pinned_map(dev, name):
    """bpftool's view of a pinned map of the device's fast path."""
    bpftool = need_tool("bpftool")
    path = pin_dir(dev_id_of(dev)) / "maps" / name
    res = run([bpftool, "-j", "map", "show", "pinned", str(path)], check=True)
    return json.loads(res.stdout)


def mapfill(*args):
    need_built(MAPFILL, "tests/helpers/mapfill")
    res = run([MAPFILL, *[str(a) for a in args]])
    return res.returncode, res.stdout, res.stderr


def map_fill(dev, name, first, count, value):
    rc, _, err = mapfill("fill", dev_id_of(dev), name, first, count, value)
    assert rc == 0, err


def map_lookup(dev, name, key):
    rc, out, err = mapfill("get", dev_id_of(dev), name, key)
    assert rc == 0, err
    return int(out)


@pytest.fixture(autouse=True)
def _bpf():
    need_bpf()


@pytest.mark.parametrize("size,blocks", [("64M", 16384), ("8G", 1 << 20)])
def test_per_block_maps_are_sized_from_the_device(ramdisk, added_devices,
                                                  fastpath, size, blocks):
    """64 MiB: one entry per 4 KiB block; 8 GiB: the maps' caps (the
    versions then share slots, zero knows the first 4 GiB)."""
    if size == "64M":
        dev = ramdisk(size=size).dev
    else:
        rc, out, err = hybdctl("add", "--size", size)
        assert rc == 0, err
        added_devices.append(int(out))
        dev = f"/dev/hybd{int(out)}"
    fastpath.attach(prog("zero"), dev)
    assert pinned_map(dev, "zero_known")["max_entries"] == blocks
    assert pinned_map(dev, "hybd_versions")["max_entries"] == blocks


def test_a_program_without_versions_has_no_versions_map(ramdisk, fastpath):
    dev = ramdisk(size="16M").dev
    fastpath.attach(prog("passthrough"), dev)
    maps = pin_dir(dev_id_of(dev)) / "maps"
    assert "hybd_versions" not in [p.name for p in maps.iterdir()]


def test_replace_keeps_same_named_maps_and_what_they_know(ramdisk, fastpath):
    """zero learns a block; a replace by zero again keeps the map (same id,
    same content) and serves the block from the kernel at once."""
    dev = ramdisk(size="16M").dev
    settle()
    fastpath.attach(prog("zero"), dev)
    before_ids = {n: pinned_map(dev, n)["id"]
                  for n in ("zero_known", "hybd_versions")}
    # a never-written block read once is learned as zero
    assert read_blocks(dev, 100, 1) == bytes(BLOCK)
    learned = map_lookup(dev, "zero_known", 100)
    assert learned != 0
    fastpath.attach(prog("zero"), dev, replace=True)
    after_ids = {n: pinned_map(dev, n)["id"]
                 for n in ("zero_known", "hybd_versions")}
    assert after_ids == before_ids
    assert map_lookup(dev, "zero_known", 100) == learned
    s0 = stats(dev)
    assert read_blocks(dev, 100, 1) == bytes(BLOCK)
    d = delta(stats(dev), s0)
    assert d["fast_done"] == 1 and d["slow_issued"] == 0, d
    # and writes after the replace still make it forget
    data = pattern("after-replace", BLOCK)
    direct_write(dev, 100 * BLOCK, data)
    assert read_blocks(dev, 100, 1) == data


def test_replace_by_a_different_program_keeps_only_what_it_shares(
        ramdisk, fastpath):
    dev = ramdisk(size="16M").dev
    fastpath.attach(prog("zero"), dev)
    ver_id = pinned_map(dev, "hybd_versions")["id"]
    fastpath.attach(prog("cache"), dev, replace=True)
    names = {p.name for p in (pin_dir(dev_id_of(dev)) / "maps").iterdir()}
    assert "zero_known" not in names
    assert pinned_map(dev, "hybd_versions")["id"] == ver_id


def test_replace_takes_no_cache_without_the_versions_it_was_stamped_with(
        ramdisk, fastpath):
    """A program whose cache map has bpf/cache.bpf.o's name and shape but
    no hybd_versions (cacheplain: it stamps everything 1 and never drops
    a block) is replaced by cache.bpf.o: its versions would start at 0,
    whose stamp is 1 again, so the old cache must not be carried over,
    or the block's old data is served."""
    dev = ramdisk(size="16M").dev
    settle()
    old = pattern("plain-old", BLOCK)
    direct_write(dev, 7 * BLOCK, old)
    fastpath.attach(suite_prog("cacheplain"), dev)
    assert read_blocks(dev, 7, 1) == old     # kept, stamped 1
    new = pattern("plain-new", BLOCK)
    direct_write(dev, 7 * BLOCK, new)        # cacheplain keeps the old one
    fastpath.attach(prog("cache"), dev, replace=True)
    assert read_blocks(dev, 7, 1) == new


def test_slow_path_seeds_a_per_block_map(ramdisk, fastpath):
    """hybd_bpf_map_fill from the slow path's side: mark never-written
    blocks known-zero (stamp = version 0 + 1) and the kernel serves them
    without asking the server; the same stamp on a block written since
    is stale (its version moved) and is not served."""
    dev = ramdisk(size="16M").dev
    settle()
    fastpath.attach(prog("zero"), dev)
    data = pattern("seeded", BLOCK)
    direct_write(dev, 40 * BLOCK, data)
    assert map_lookup(dev, "hybd_versions", 40) >= 2
    map_fill(dev, "zero_known", 32, 16, 1)
    assert [map_lookup(dev, "zero_known", k) for k in (31, 32, 47, 48)] == \
        [0, 1, 1, 0]
    s0 = stats(dev)
    assert read_blocks(dev, 32, 8) == bytes(8 * BLOCK)
    d = delta(stats(dev), s0)
    assert d["fast_done"] == 8 and d["slow_issued"] == 0, d
    assert read_blocks(dev, 40, 1) == data
    # past the end of the map: a clear error, nothing written
    rc, _, err = mapfill("fill", dev_id_of(dev), "zero_known", 4090, 10, 1)
    assert rc == 1 and "past the end" in err, err
