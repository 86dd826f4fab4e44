# SPDX-License-Identifier: GPL-2.0
"""The dedup example's fast path alone: examples/dedup/dedup.bpf.o passes
the verifier and serves what it should, attached to the ramdisk standing
in for dedup's slow path, so that each behaviour (holes from dedup_zero,
multi-block cache hits, invalidation, zero writes) is seen apart from the
store (test_dedup.py drives the real driver).

The ramdisk does not keep dedup_zero: the test fills it through the
pinned map for blocks the ramdisk holds zeros in, as dedup serve does.
"""
import errno

import pytest

from hybdbpf import (BLOCK, delta, dev_id_of, fastpath, need_bpf, pin_dir,
                     settle, stats)
from hybdlib import (REPO, direct_read, direct_write, hybdctl_json, io_errno,
                     need_built, pattern, run)

assert fastpath      # a fixture, used by name

DEDUP = REPO / "examples" / "dedup" / "dedup.bpf.o"
MAPFILL = REPO / "tests" / "helpers" / "mapfill"

COUNTERS = {"reads", "zero_hits", "cache_hits", "read_misses", "fills",
            "races", "zero_writes", "remap_hits"}


@pytest.fixture(autouse=True)
def _bpf():
    need_bpf()


def dedup_prog():
    if not DEDUP.is_file():
        pytest.fail(f"{DEDUP} not built; run make -C examples/dedup",
                    pytrace=False)
    return str(DEDUP)


def counters(dev):
    """(the device's stats, dedup's .bss counters) from hybdctl stats
    --maps --json."""
    st = hybdctl_json("stats", str(dev), "--maps")
    names = [m for m in st["maps"] if m.endswith(".bss")]
    assert len(names) == 1, st["maps"]
    return stats(dev), st["maps"][names[0]]


def changes(before, after):
    """(device stats delta, counters delta) between two counters()."""
    return (delta(after[0], before[0]),
            {k: after[1][k] - before[1][k] for k in before[1]})


def mark_zero(dev, first, count):
    """What the slow path does for blocks it knows read as zeros."""
    need_built(MAPFILL, "tests/helpers/mapfill")
    res = run([MAPFILL, "fill", dev_id_of(dev), "dedup_zero", first, count,
               1])
    assert res.returncode == 0, res.stderr


def write(dev, blk, data):
    """An O_DIRECT write of whole blocks, one request; then udev's probe
    of the closed device, so that it does not count in the next delta."""
    direct_write(dev, blk * BLOCK, data)
    settle()


def read(dev, blk, count):
    """One O_DIRECT read request of count blocks."""
    return direct_read(dev, blk * BLOCK, count * BLOCK)


def pass_zeroes_supported():
    return "pass_zeroes" in hybdctl_json("features")["names"]


def test_dedup_fast_path_loads_and_serves(ramdisk, fastpath):
    srv = ramdisk(size="16M", lbs=4096, queues=2, depth=32, max_io="128K",
                  zero_writes=True)
    settle()
    dev = srv.dev
    fastpath.attach(dedup_prog(), dev)
    maps = {p.name for p in (pin_dir(dev_id_of(dev)) / "maps").iterdir()}
    assert {"dedup_zero", "dedup_chunk", "dedup_cache",
            "hybd_versions"} <= maps, maps
    assert set(counters(dev)[1]) == COUNTERS

    # known-zero blocks (never written: the ramdisk holds zeros there),
    # 16 of them read as one 64 KiB request: zeros from the kernel
    zfirst, blocks = 256, 16
    mark_zero(dev, zfirst, blocks)
    c0 = counters(dev)
    assert read(dev, zfirst, blocks) == bytes(blocks * BLOCK)
    d, c = changes(c0, counters(dev))
    assert c["zero_hits"] >= 1 and c["reads"] >= 1, c
    assert d["fast_done"] >= 1 and d["fast_errors"] == 0, d

    # a written 64 KiB read twice: the slow path fills 16 blocks, then
    # the cache serves the same bytes
    data = pattern("dedup-cache", blocks * BLOCK)
    write(dev, 0, data)
    c0 = counters(dev)
    assert read(dev, 0, blocks) == data
    c1 = counters(dev)
    assert read(dev, 0, blocks) == data
    d1, first = changes(c0, c1)
    d2, second = changes(c1, counters(dev))
    assert first["read_misses"] >= 1 and first["fills"] >= blocks, first
    assert second["cache_hits"] >= 1 and second["races"] == 0, second
    assert d2["fast_done"] >= 1 and d2["fast_errors"] == 0, d2

    # cached blocks and known-zero ones in one read: 16 + 4 blocks
    mark_zero(dev, blocks, 4)
    c0 = counters(dev)
    assert read(dev, 0, blocks + 4) == data + bytes(4 * BLOCK)
    d, c = changes(c0, counters(dev))
    assert c["cache_hits"] >= 1, c
    assert d["fast_done"] >= 1 and d["fast_errors"] == 0, d

    # an overwrite of 4 of the cached blocks: the next reads return the
    # new data, never the cached copy, and the cache fills again
    new = pattern("dedup-overwrite", 4 * BLOCK)
    write(dev, 4, new)
    expect = data[:4 * BLOCK] + new + data[8 * BLOCK:]
    c0 = counters(dev)
    assert read(dev, 0, blocks) == expect
    assert read(dev, 0, blocks) == expect
    d, c = changes(c0, counters(dev))
    assert c["read_misses"] >= 1 and c["cache_hits"] >= 1, c
    assert d["fast_errors"] == 0, d

    # an all-zero write is passed as a write-zeroes (HYBD_BPF_PASS_ZEROES)
    # to the server, which asked for that (--zero-writes)
    assert pass_zeroes_supported()
    c0 = counters(dev)
    e = io_errno(direct_write, dev, 8 * BLOCK, bytes(4 * BLOCK))
    settle()
    d, c = changes(c0, counters(dev))
    assert c["zero_writes"] == 1, c
    assert e == 0, errno.errorcode.get(e, e)
    assert d["bpf_pass_zeroes"] == 1 and d["bpf_bad_ret"] == 0, d
    expect = expect[:8 * BLOCK] + bytes(4 * BLOCK) + expect[12 * BLOCK:]
    for _ in range(2):
        assert read(dev, 0, blocks) == expect
    print(f"dedup counters: {counters(dev)[1]}")
