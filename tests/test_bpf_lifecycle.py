# SPDX-License-Identifier: GPL-2.0
"""A fast-path program's life on its device, driven step by step through
libbpf (tests/helpers/bpfctl): io->own is exact across replaces; a loaded
map that left its device (detached, replaced, or its device deleted)
cannot come back with what it cached; a program belongs to the device it
was attached to, not to its id; a dead device takes no program, and an
attach racing a delete leaves nothing behind."""

import errno
import json
import random
import subprocess
import threading
import time

import pytest

import hybd_uapi as uapi
from hybdbpf import (BLOCK, bpfctl, delta, dev_info, need_bpf, prog,
                     read_blocks, settle, stats, suite_prog)
from hybdlib import (T_IO, device_ids, direct_write, need_tool, pattern,
                     reap, wait_for)

assert bpfctl      # a fixture, used by name

OWN_MAPS = 16       # owncheck.bpf.c: own0 .. own15
STATE_DEAD = 2      # enum hybd_dev_state


@pytest.fixture(autouse=True)
def _bpf():
    need_bpf()


def small_ramdisk(ramdisk, **opts):
    opts.setdefault("size", "16M")
    opts.setdefault("queues", 2)
    opts.setdefault("depth", 16)
    opts.setdefault("max_io", "128K")
    srv = ramdisk(**opts)
    settle()
    return srv


def ename(e):
    return errno.errorcode.get(e, "success")


# --------------------------------------------------- io->own and replace

@pytest.fixture
def fio_bg():
    procs = []

    def start(dev, seconds):
        exe = need_tool("fio")
        p = subprocess.Popen(
            [exe, "--output-format=json", f"--filename={dev}", "--direct=1",
             "--ioengine=libaio", "--iodepth=16", "--rw=randrw", "--bs=4k",
             "--size=8M", "--numjobs=2", "--time_based",
             f"--runtime={seconds}", "--name=own"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd="/tmp")
        procs.append(p)
        return p
    yield start
    for p in procs:
        reap(p)


def test_own_says_exactly_whose_submit_passed_the_request(ramdisk, bpfctl,
                                                          fio_bg):
    srv = small_ramdisk(ramdisk)
    ctl = bpfctl()
    ctl.open("o", suite_prog("owncheck"), srv.dev)
    ctl.ok("attach", "l", "o", "own0")
    fio = fio_bg(srv.dev, 60)
    wait_for(lambda: stats(srv.dev)["slow_done"] > 200, 60, "fio's I/O")

    for i in range(1, OWN_MAPS):
        time.sleep(0.3)
        ctl.ok("update", "l", "o", f"own{i}")
        assert dev_info(srv.dev)["bpf"][0] == f"own{i}"
    time.sleep(0.3)
    fio.kill()
    fio.wait(T_IO)

    right_own, right_foreign, trusted_foreign, lost_own = (
        ctl.ok("lookup", "o", "own_stats", k)[0] for k in range(4))
    print(f"own {right_own}, foreign {right_foreign}, wrong: own but "
          f"foreign {trusted_foreign}, ours but not own {lost_own}")
    assert trusted_foreign == 0, (
        f"{trusted_foreign} completions said own=1 to a program whose "
        f"submit() had not passed them")
    assert lost_own == 0, (
        f"{lost_own} completions said own=0 to the program that passed them")
    assert right_own > 100, right_own
    # requests passed by one program and completed under the next: what
    # the replaces had to get right (or the test proved nothing)
    assert right_foreign > 0, "no request crossed a replace"


# ----------------------------------------- a map that left comes back?

BLOCKS = 16


def warm_cache(srv, data):
    """Write data, read it twice: the second pass is served by the cache.
    (Large buffers are compared into a bool: pytest's diff of two 64 KiB
    byte strings takes minutes under TCG.)"""
    direct_write(srv.dev, 0, data)
    same = read_blocks(srv.dev, 0, BLOCKS) == data
    assert same, "the first read returned other data"
    before = stats(srv.dev)
    same = read_blocks(srv.dev, 0, BLOCKS) == data
    assert same, "the second read returned other data"
    d = delta(stats(srv.dev), before)
    assert d["fast_done"] >= BLOCKS - 2, f"the cache served nothing: {d}"


def test_relinking_a_detached_cache_serves_no_stale_data(ramdisk, bpfctl):
    srv = small_ramdisk(ramdisk)
    old, new = pattern("relink-old", BLOCKS * BLOCK), pattern(
        "relink-new", BLOCKS * BLOCK)
    ctl = bpfctl()
    ctl.open("c", prog("cache"), srv.dev)
    ctl.ok("attach", "l1", "c", "cache_ops")
    warm_cache(srv, old)

    ctl.ok("detach", "l1")
    assert dev_info(srv.dev)["bpf"] is None
    direct_write(srv.dev, 0, new)       # the cache never sees this write

    e, _ = ctl.cmd("attach", "l2", "c", "cache_ops")
    fresh = read_blocks(srv.dev, 0, BLOCKS) == new
    assert fresh, (
        f"the re-linked cache map (attach: {ename(e)}) served the data "
        f"written before it was detached")
    assert e == errno.ESTALE, (
        f"re-attaching a map that was detached: {ename(e)}, not ESTALE")
    assert dev_info(srv.dev)["bpf"] is None


def test_replacing_back_to_a_replaced_cache_serves_no_stale_data(ramdisk,
                                                                  bpfctl):
    srv = small_ramdisk(ramdisk)
    old, new = pattern("back-old", BLOCKS * BLOCK), pattern(
        "back-new", BLOCKS * BLOCK)
    ctl = bpfctl()
    ctl.open("c", prog("cache"), srv.dev)
    ctl.open("p", prog("passthrough"), srv.dev)
    link, = ctl.ok("attach", "l", "c", "cache_ops")
    warm_cache(srv, old)

    ctl.ok("update", "l", "p", "passthrough_ops")
    direct_write(srv.dev, 0, new)       # passes by the cache

    e, _ = ctl.cmd("update", "l", "c", "cache_ops")
    fresh = read_blocks(srv.dev, 0, BLOCKS) == new
    assert fresh, (
        f"the cache replaced back in (update: {ename(e)}) served the data "
        f"written while it was replaced")
    assert e == errno.ESTALE, (
        f"replacing back to a map that was replaced: {ename(e)}, not ESTALE")
    assert dev_info(srv.dev)["bpf"] == ("passthrough", link)


# ------------------------------------- programs belong to device objects

def test_old_link_of_a_deleted_device_leaves_the_new_device_alone(ramdisk,
                                                                 bpfctl):
    first = small_ramdisk(ramdisk)
    dev_id = first.id
    data = pattern("id-reuse", BLOCKS * BLOCK)
    ctl = bpfctl()
    ctl.open("c", prog("cache"), first.dev)
    ctl.ok("attach", "old", "c", "cache_ops")
    warm_cache(first, data)
    first.stop()                        # deletes the device; the link stays
    wait_for(lambda: dev_id not in device_ids(), 30, f"hybd{dev_id} to go")

    second = small_ramdisk(ramdisk, id=dev_id)
    assert second.dev == first.dev
    # the same loaded map again: it cached the first device's data
    e, _ = ctl.cmd("attach", "new", "c", "cache_ops")
    fresh = read_blocks(second.dev, 0, BLOCKS) == bytes(BLOCKS * BLOCK)
    assert fresh, (
        f"the new hybd{dev_id} (attach of the old map: {ename(e)}) returned "
        f"the deleted device's cached data")
    assert e == errno.ESTALE, (
        f"attaching a map whose device was deleted: {ename(e)}, not ESTALE")
    ctl.open("p", prog("passthrough"), second.dev)
    link, = ctl.ok("attach", "new", "p", "passthrough_ops")
    assert dev_info(second.dev)["bpf"] == ("passthrough", link)

    # the old link goes: the new device's program stays
    ctl.ok("detach", "old")
    ctl.ok("close", "old")
    assert dev_info(second.dev)["bpf"] == ("passthrough", link), (
        "detaching the deleted device's link removed the program of the "
        "device that reused its id")
    zeros = read_blocks(second.dev, 0, 1) == bytes(BLOCK)
    assert zeros, "the new device's first block is not zeros"


def test_attach_to_a_dead_device_is_refused(ramdisk, bpfctl):
    srv = small_ramdisk(ramdisk)
    ctl = bpfctl()
    ctl.open("p", prog("passthrough"), srv.dev)
    srv.kill()          # SIGKILL: the device stays, dead, until deleted
    wait_for(lambda: uapi_state(srv.id) == STATE_DEAD, 30,
             f"hybd{srv.id} to be dead")
    e, _ = ctl.cmd("attach", "l", "p", "passthrough_ops")
    assert e == errno.ENODEV, (
        f"attach to a dead device: {ename(e)}, not ENODEV")
    assert dev_info(srv.dev)["bpf"] is None
    assert dev_info(srv.dev)["bpf_attaches"] == 0


def uapi_state(dev_id):
    with uapi.Control() as ctl:
        e, state, _ = uapi.info_state(ctl, dev_id)
    return state if e == 0 else None


RACES = OWN_MAPS


def test_attach_racing_delete_leaves_no_program_or_link(bpfctl,
                                                        added_devices):
    """Attach and delete the same device at about the same time, RACES
    times: the attach succeeds (and the delete then drops the program) or
    fails with ENODEV; either way the id, reused, starts with nothing."""
    with uapi.Control() as c:
        e, dev_id, _ = uapi.add(c)
    assert e == 0, uapi.errname(e)
    added_devices.append(dev_id)
    ctl = bpfctl()
    ctl.open("o", suite_prog("owncheck"), dev_id)
    rng = random.Random(7)
    outcomes = {}

    for i in range(RACES):
        if i:
            with uapi.Control() as c:
                e, got, _ = uapi.add(c, dev_id=dev_id)
            assert e == 0 and got == dev_id, uapi.errname(e)
        res = {}

        def delete():
            time.sleep(rng.uniform(0, 0.004))
            with uapi.Control() as c:
                res["del"] = uapi.delete(c, dev_id)
        t = threading.Thread(target=delete)
        t.start()
        res["attach"], _ = ctl.cmd("attach", f"l{i}", "o", f"own{i}")
        t.join(30)
        assert not t.is_alive(), "the delete did not return"
        assert res["del"] == 0, uapi.errname(res["del"])
        assert res["attach"] in (0, errno.ENODEV), ename(res["attach"])
        outcomes[ename(res["attach"])] = outcomes.get(
            ename(res["attach"]), 0) + 1
        assert dev_id not in device_ids()
        if res["attach"] == 0:
            ctl.ok("detach", f"l{i}")
            ctl.ok("close", f"l{i}")

        # the id reused: nothing of the race is left on it
        with uapi.Control() as c:
            e, got, _ = uapi.add(c, dev_id=dev_id)
        assert e == 0 and got == dev_id, uapi.errname(e)
        d = dev_info(dev_id)
        assert d["bpf"] is None and d["bpf_attaches"] == 0, d
        with uapi.Control() as c:
            assert uapi.delete(c, dev_id) == 0
    print(f"attach outcomes over {RACES} races: {json.dumps(outcomes)}")
