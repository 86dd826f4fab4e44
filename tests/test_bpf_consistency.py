# SPDX-License-Identifier: GPL-2.0
"""The cache program under concurrent overlapping reads and writes of a
small hot range, over two hardware queues: no read ever returns data that
a write completed before the read was issued had replaced, while the
cache serves most reads.  The same load catches the naive cache (no
version stamps) serving stale data within seconds: the test can fail."""

import re

import pytest

import hybd_uapi as uapi
from hybdbpf import delta, fastpath, need_bpf, prog, settle, stats
from hybdlib import REPO, need_built, run

assert fastpath      # a fixture, used by name

STALE_CHECK = REPO / "tests" / "helpers" / "stale_check"
RESULT_RE = re.compile(
    r"^reads=(\d+) writes=(\d+) stale=(\d+) corrupt=(\d+) torn=(\d+) "
    r"errors=(\d+) seconds=([\d.]+)$", re.M)
RESULT_KEYS = ("reads", "writes", "stale", "corrupt", "torn", "errors")

# The load: 2 writers and 2 readers spread over both vCPUs (so over both
# hardware queues), 32 hot blocks.  With the naive cache, a read's fill
# lands after a write it raced with on the other queue: stale reads show
# within a second under TCG.
LOAD = ["--blocks", "32", "--writers", "2", "--readers", "2"]
SECONDS = 15            # the correct cache's run
NAIVE_SECONDS = 30      # the naive one stops at its first stale reads


@pytest.fixture(autouse=True)
def _bpf():
    need_bpf()


@pytest.fixture
def hot_disk(ramdisk):
    srv = ramdisk(size="16M", queues=2, depth=32, max_io="128K")
    settle()
    return srv


def stale_check(dev, seconds, *extra):
    """Run the helper; returns (exit status, counters, output)."""
    need_built(STALE_CHECK, "tests/helpers/stale_check")
    res = run([STALE_CHECK, dev, *LOAD, "--seconds", str(seconds), *extra],
              timeout=seconds + 120)
    out = res.stdout + res.stderr
    m = RESULT_RE.search(res.stdout)
    assert m, f"stale_check: exit {res.returncode}, no result line:\n{out}"
    counts = dict(zip(RESULT_KEYS, map(int, m.groups()[:6])))
    counts["seconds"] = float(m.group(7))
    return res.returncode, counts, out


def per_queue(dev_id):
    with uapi.Control() as ctl:
        e, queues = uapi.queue_stats(ctl, dev_id)
    assert e == 0, f"HYBD_CTL_STATS: {uapi.errname(e)}"
    return queues


def test_cache_serves_no_stale_read_under_overlapping_writes(hot_disk,
                                                             fastpath):
    srv = hot_disk
    fastpath.attach(prog("cache"), srv.dev)
    before, q_before = stats(srv.dev), per_queue(srv.id)

    rc, c, out = stale_check(srv.dev, SECONDS)
    d = delta(stats(srv.dev), before)
    print(f"cache: {c}, fast_done {d['fast_done']}, slow_done {d['slow_done']}")

    assert c["errors"] == 0, out
    assert c["stale"] == 0, f"the cache served stale data:\n{out}"
    assert c["corrupt"] == 0, out
    assert rc == 0, out
    assert c["reads"] > 1000 and c["writes"] > 100, c
    # a test where nothing hits proves nothing: a good share are hits
    # (about 70% here; each write makes the next read of its block a miss)
    assert d["fast_done"] * 10 >= c["reads"] * 4, (
        f"only {d['fast_done']} of {c['reads']} reads were cache hits")
    assert d["fast_errors"] == 0 and d["bpf_bad_ret"] == 0, d
    # both queues carried reads and writes
    for q, (a, b) in enumerate(zip(per_queue(srv.id), q_before)):
        assert a["reads"] > b["reads"] and a["writes"] > b["writes"], (
            f"queue {q} carried no reads or no writes: {b} -> {a}")


def test_naive_cache_is_caught(hot_disk, fastpath):
    srv = hot_disk
    fastpath.attach(prog("cache-nostamp"), srv.dev)
    before = stats(srv.dev)

    rc, c, out = stale_check(srv.dev, NAIVE_SECONDS, "--stop-after-stale", "3")
    d = delta(stats(srv.dev), before)
    print(f"cache-nostamp: {c}, fast_done {d['fast_done']}")

    assert c["errors"] == 0 and c["corrupt"] == 0, out
    assert c["stale"] > 0, (
        f"the naive cache served no stale read in {c['seconds']}s "
        f"({c['reads']} reads, {d['fast_done']} hits): the test cannot "
        f"tell a broken cache from a correct one")
    assert rc == 3, out
