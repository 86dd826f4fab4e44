# SPDX-License-Identifier: GPL-2.0
"""Recovery mode and live handover (HYBD_F_RECOVERY).

A device added with a recovery timeout keeps its I/O when its server dies:
requests in flight and new ones are held (the fast path serves on), a new
server takes the device over (ramdisk --attach) and gets every held
request exactly once.  A live server hands its device to a new one with no
failed request.  The data lives in a file (ramdisk --backing) so that it
survives the servers.

The kill and handover counts are smaller in `make test` than in
`make test-long` (HYBD_LONG=1).
"""

import errno
import os
import random
import re
import shutil
import subprocess
import threading
import time

import pytest

import hybd_uapi as uapi
import klog
from hybdbpf import fastpath, need_bpf, prog  # noqa: F401 (fixture)
from hybdlib import (LONG, LOOP, RAMDISK, REPO, T_CMD, T_IO, direct_read,
                     direct_write, fio, fio_verify, free_id, hybdctl, info,
                     io_uring_usable, need_built, need_tool, pattern, record,
                     run, variants, wait_for)

MiB = 1 << 20
KILLS = 20 if LONG else 5
HANDOVERS = 20 if LONG else 5
IO_ERRORS = (r"I/O error|Buffer I/O|EXT4-fs error|JBD2|lost (async )?page "
             r"write|Aborting journal|Remounting filesystem|writeback error")


def seeded(name):
    seed = int(os.environ.get("HYBD_TEST_SEED", time.time_ns() % 10**9))
    print(f"{name}: seed {seed} (HYBD_TEST_SEED={seed} replays it)")
    return random.Random(seed)


def stats(dev):
    return info(dev)["stats"]


def state(dev_id):
    with uapi.Control() as ctl:
        e, rec = uapi.info_recovery(ctl, dev_id)
    assert e == 0, os.strerror(e)
    return rec


class Background:
    """Run fn() again and again (once if once) in a thread until stop();
    the first exception is re-raised by stop()."""

    def __init__(self, fn, once=False):
        self.fn, self.error, self.runs = fn, None, 0
        self.once = once
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        try:
            while not self._stop.is_set():
                self.fn()
                self.runs += 1
                if self.once:
                    break
        except BaseException as e:     # pylint: disable=broad-except
            self.error = e

    def alive(self):
        return self.thread.is_alive()

    def stop(self, timeout=T_IO):
        self._stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the I/O loop did not finish"
        if self.error:
            raise self.error


def read_hot(dev, off, data):
    """Read data back one 4 KiB block at a time, in a thread: a read the
    cache misses while no server is attached would wait, so a miss fails
    the test after T_CMD instead of hanging it."""
    box = {}

    def reader():
        box["got"] = b"".join(direct_read(dev, o, 4096)
                              for o in range(off, off + len(data), 4096))
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(T_CMD)
    assert not t.is_alive(), "hot reads did not complete: not from the cache"
    assert box["got"] == data


def attach(ramdisk, srv, backing, **opts):
    """A new ramdisk that takes srv's device over (--attach)."""
    new = ramdisk(size=None, id=srv.id, backing=backing, attach=True, **opts)
    assert new.dev == srv.dev
    return new


def let_run(load, rng, longest):
    """Let the load (a Background) run for a random moment; it must still
    be running."""
    time.sleep(rng.uniform(0.2, longest))
    assert load.alive(), "the I/O loop ended early"


def kill_and_replace(ramdisk, srv, backing, rng, load, while_down=None):
    """Let the load run a moment, SIGKILL the server, wait for the device
    to hold its I/O, run while_down(srv), let requests pile up, and return
    a new server that took the device over.  The kill comes while
    requests are in flight: a slow guest (the debug kernel) may still be
    starting fio, or fio may be between two runs, and a kill with nothing
    in flight tests no takeover."""
    inflight = f"/sys/block/{os.path.basename(srv.dev)}/inflight"

    def busy():
        with open(inflight) as f:
            return sum(int(n) for n in f.read().split()) > 0

    let_run(load, rng, 1.5)
    wait_for(busy, T_IO, f"requests in flight on {srv.dev}")
    srv.kill()
    wait_waiting(srv)
    if while_down:
        while_down(srv)
    time.sleep(rng.uniform(0, 0.5))
    return attach(ramdisk, srv, backing)


def wait_waiting(srv):
    wait_for(lambda: state(srv.id)["state"] == uapi.STATE_WAITING, T_CMD,
             f"{srv.dev} waiting for a server")


def assert_clean_counters(dev, kills):
    """Every request was completed once, by the fast path or a server, and
    none failed."""
    s = stats(dev)
    assert s["slow_issued"] == s["slow_done"], s
    assert (s["slow_errors"], s["fast_errors"], s["failed_dead"],
            s["timed_out"]) == (0, 0, 0, 0), s
    assert s["fast_done"] + s["slow_done"] == (
        s["reads"] + s["writes"] + s["flushes"] + s["discards"] +
        s["write_zeroes"]), s
    rec = state(int(dev.removeprefix("/dev/hybd")))
    assert rec["recoveries"] == kills, rec
    record(os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0],
           f"{kills} takeovers; " + " ".join(
               f"{k}={s[k]}" for k in ("slow_issued", "slow_done",
                                       "fast_done", "held", "reissued",
                                       "rej_stale_seq")) +
           f" no_server={rec['no_server_ns'] / 1e9:.1f}s")
    return s


@pytest.mark.time_limit(1800)
@pytest.mark.parametrize("bs,fast", variants(
    [pytest.param("512", False, id="512"), pytest.param("4k", False, id="4k"),
     pytest.param("128k", False, id="128k"),
     pytest.param("4k", True, id="4k-cache")],
    # the smallest and largest requests, and the fast path (test-long:
    # 4 KiB without it too)
    ["512", "128k", "4k-cache"]))
def test_recovery_fio_verify_across_sigkills(ramdisk, fastpath, tmp_path, bs,
                                            fast):
    """fio --verify (QD32, 2 queues) runs while the server is SIGKILLed and
    replaced again and again: no verify error, no I/O error, every request
    completed exactly once; with the cache fast path, hot blocks are served
    while no server is there."""
    rng = seeded("recovery")
    backing = tmp_path / "disk.img"
    lbs = "512" if bs == "512" else "4096"
    srv = ramdisk(size="64M", queues=2, depth=64, lbs=lbs, backing=backing,
                  recovery=120, io_timeout=30)
    # the cache is direct-mapped (8192 slots): fio's blocks (the first
    # 16 MiB) and the hot ones (at 60 MiB) never share a slot
    hot_off, hot = 60 * MiB, pattern("hot", 256 << 10)
    if fast:
        need_bpf()
        fastpath.attach(prog("cache"), srv.dev)
        direct_write(srv.dev, hot_off, hot)
        read_hot(srv.dev, hot_off, hot)     # one-block reads fill it
    log = klog.Kmsg()
    per_job = "8M" if bs == "512" or fast else "16M"
    fio = Background(lambda: fio_verify(srv.dev, bs, per_job, 2))
    def hot_from_the_cache(down):
        before = stats(down.dev)["fast_done"]
        read_hot(down.dev, hot_off, hot)
        assert stats(down.dev)["fast_done"] - before >= 64
        assert state(down.id)["state"] == uapi.STATE_WAITING

    try:
        for _ in range(KILLS):
            srv = kill_and_replace(ramdisk, srv, backing, rng, fio,
                                   hot_from_the_cache if fast else None)
    finally:
        fio.stop()
    assert fio.runs >= 1
    s = assert_clean_counters(srv.dev, KILLS)
    assert s["reissued"] > 0, s
    if fast:
        hybdctl("detach", srv.dev)
    bad = [l for l in log.read_new() if re.search(IO_ERRORS, l)]
    log.close()
    assert not bad, bad
    srv.stop()


@pytest.mark.time_limit(1800)
def test_recovery_ext4_survives_server_kills(ramdisk, tmp_path):
    """ext4 on the device while a copy loop writes, copies and fsyncs
    files: the server is killed and replaced 5 times; no I/O error reaches
    the kernel log or the loop, fsck is clean, and every file reads back
    after a remount (from the device, not the page cache)."""
    mkfs, fsck = need_tool("mkfs.ext4"), need_tool("fsck.ext4")
    rng = seeded("ext4")
    backing = tmp_path / "disk.img"
    srv = ramdisk(size="128M", queues=2, backing=backing, recovery=120)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run([mkfs, "-F", "-q", srv.dev], timeout=T_IO, check=True)
    run(["mount", "-t", "ext4", srv.dev, mnt], check=True)
    log = klog.Kmsg()
    want = {}

    def copy_round(n=[0]):
        i = n[0]
        n[0] += 1
        data = pattern(f"ext4-{i}", (1 + i % 4) * MiB + 4096 * (i % 7))
        src, dst = mnt / f"f{i % 8}", mnt / f"g{i % 8}"
        with open(src, "wb") as f:
            f.write(data)
            os.fsync(f.fileno())
        shutil.copyfile(src, dst)
        with open(dst, "rb+") as f:
            os.fsync(f.fileno())
        assert src.read_bytes() == data and dst.read_bytes() == data
        want[src.name] = want[dst.name] = data

    loop = Background(copy_round)
    mounted = True
    try:
        for _ in range(KILLS):
            srv = kill_and_replace(ramdisk, srv, backing, rng, loop)
        loop.stop()
        assert loop.runs >= KILLS, loop.runs
        run(["umount", mnt], check=True)
        mounted = False
        res = run([fsck, "-fn", srv.dev], timeout=T_IO)
        assert res.returncode == 0, res.stdout + res.stderr
        run(["mount", "-t", "ext4", srv.dev, mnt], check=True)
        mounted = True
        for name, data in want.items():
            assert (mnt / name).read_bytes() == data, name
    finally:
        if loop.alive():
            loop._stop.set()
        if mounted:
            run(["umount", mnt])
    bad = [l for l in log.read_new() if re.search(IO_ERRORS, l)]
    log.close()
    assert not bad, bad
    assert_clean_counters(srv.dev, KILLS)
    srv.stop()


def test_recovery_held_read_completes_after_restart(ramdisk, tmp_path):
    """A read that arrives while no server is attached waits, is counted as
    held, and completes with the right data once a new server is there."""
    backing = tmp_path / "disk.img"
    srv = ramdisk(size="16M", backing=backing, recovery=60)
    data = pattern("held", MiB)
    direct_write(srv.dev, 2 * MiB, data)
    srv.kill()
    wait_waiting(srv)
    rec = state(srv.id)
    assert 0 < rec["recovery_left_ms"] <= 60000 and rec["server_pid"] == 0, rec
    res = {}
    reader = threading.Thread(
        target=lambda: res.update(d=direct_read(srv.dev, 2 * MiB, MiB)))
    reader.start()
    wait_for(lambda: stats(srv.dev)["held"] > 0, T_CMD, "a held request")
    time.sleep(0.5)
    assert reader.is_alive() and state(srv.id)["state"] == uapi.STATE_WAITING
    i = info(srv.dev)
    assert i["state"] == "waiting" and i["recovery_timeout"] == 60, i
    rc, out, _ = hybdctl("list")
    assert rc == 0 and f"/dev/hybd{srv.id}" in out and "waiting:" in out, out
    srv = attach(ramdisk, srv, backing)
    reader.join(T_CMD)
    assert not reader.is_alive()
    assert res["d"] == data
    rec = state(srv.id)
    assert rec["recoveries"] == 1 and rec["no_server_ns"] > 0.5e9, rec
    assert rec["server_pid"] == srv.pid, rec
    srv.stop()


@pytest.mark.kmsg_allow(IO_ERRORS)
def test_recovery_timeout_fails_held_io(ramdisk, tmp_path):
    """No new server: after the recovery timeout, held I/O fails with EIO,
    the device is dead and can be deleted."""
    srv = ramdisk(size="16M", backing=tmp_path / "disk.img", recovery=3)
    srv.kill()
    wait_waiting(srv)
    t0 = time.monotonic()
    dd = run(["dd", f"if={srv.dev}", "of=/dev/null", "bs=4k", "count=1",
              "iflag=direct"], timeout=T_CMD)
    took = time.monotonic() - t0
    assert dd.returncode != 0 and "Input/output error" in dd.stderr, dd.stderr
    assert took < 3 + 30, took     # the timeout, plus slack for a slow guest
    assert info(srv.dev)["state"] == "dead"
    assert stats(srv.dev)["failed_dead"] >= 1
    rc, out, err = hybdctl("del", srv.dev)
    assert rc == 0, out + err


@pytest.mark.kmsg_allow(IO_ERRORS)
def test_recovery_delete_while_waiting_fails_held_io(ramdisk, tmp_path):
    """A delete of a device that holds I/O for a server fails that I/O at
    once and finishes."""
    srv = ramdisk(size="16M", backing=tmp_path / "disk.img", recovery=600)
    srv.kill()
    wait_waiting(srv)
    dd = subprocess.Popen(["dd", f"if={srv.dev}", "of=/dev/null", "bs=4k",
                           "count=1", "iflag=direct"], stderr=subprocess.PIPE,
                          text=True)
    try:
        wait_for(lambda: stats(srv.dev)["held"] > 0, T_CMD, "a held request")
        rc, out, err = hybdctl("del", "--in-use", srv.dev, timeout=T_CMD)
        assert rc == 0, out + err
        _, derr = dd.communicate(timeout=T_CMD)
    finally:
        if dd.poll() is None:
            dd.kill()
    assert dd.returncode != 0 and "Input/output error" in derr, derr
    assert not os.path.exists(srv.dev)


def test_recovery_off_still_fails_fast(ramdisk, tmp_path):
    """Without a recovery timeout a dead server's device is dead at once:
    nothing is held."""
    srv = ramdisk(size="16M", backing=tmp_path / "disk.img")
    srv.kill()
    wait_for(lambda: info(srv.dev)["state"] == "dead", T_CMD, "dead")
    assert info(srv.dev)["recovery_timeout"] == 0
    assert stats(srv.dev)["held"] == 0
    rc, out, err = hybdctl("del", srv.dev)
    assert rc == 0, out + err


@pytest.mark.time_limit(1800)
@pytest.mark.parametrize("recovery", [0, 60], ids=["plain", "recovery"])
def test_handover_under_fio_verify(ramdisk, fastpath, tmp_path, recovery):
    """A new server takes the device over from a live one again and again
    (the old one drains and exits 0) while fio --verify runs, every other
    time together with `hybdctl attach --replace` of the fast path: both
    halves of the driver are upgraded with no failed request."""
    rng = seeded("handover")
    backing = tmp_path / "disk.img"
    srv = ramdisk(size="64M", queues=2, backing=backing,
                  recovery=recovery or None)
    need_bpf()
    fastpath.attach(prog("cache"), srv.dev)
    fio = Background(lambda: fio_verify(srv.dev, "4k", "16M", 2))
    try:
        for i in range(HANDOVERS):
            let_run(fio, rng, 1.0)
            old = srv
            srv = attach(ramdisk, old, backing)
            assert old.wait() == 0, old.output()
            assert any("handed over" in l for l in old.out), old.output()
            if i % 2:
                fastpath.attach(prog("cache"), srv.dev, replace=True)
    finally:
        fio.stop()
    assert_clean_counters(srv.dev, HANDOVERS)
    i = info(srv.dev)
    assert i["bpf_attaches"] == 1 + HANDOVERS // 2, i
    hybdctl("detach", srv.dev)
    srv.stop()


SLOWDRV = REPO / "tests" / "helpers" / "slowdrv"


def fio_reads(dev, per_job="8M", jobs=2):
    """Random 4 KiB reads at QD32 over jobs regions of dev: all of them
    done, none failed."""
    rc, data, res = fio([
        "--name=reads", f"--filename={dev}", "--direct=1",
        "--ioengine=" + ("io_uring" if io_uring_usable() else "libaio"),
        "--iodepth=32", "--rw=randread", "--bs=4k", f"--size={per_job}",
        f"--offset_increment={per_job}", f"--numjobs={jobs}"])
    assert rc == 0, f"fio exit {rc}\n{res.stderr}"
    want = int(per_job.removesuffix("M")) * MiB // 4096
    for job in data["jobs"]:
        assert job["error"] == 0, job
        assert job["read"]["total_ios"] == want, job["read"]


@pytest.mark.time_limit(1800)
def test_handover_ends_requests_kept_for_queue_idle(servers):
    """A driver that starts its backend I/O in queue_idle (as an io_uring
    driver batches its submissions) in event mode, handed over under
    QD32 reads: the requests its handlers kept when the handover came are
    started and end, so the old server leaves and the new one takes over
    at once.  (libhybd once saw the handover between a drain and the idle
    that follows it, never idled again, and waited for them forever.)"""
    need_built(SLOWDRV, "tests/helpers/slowdrv")
    rng = seeded("idle-batch")
    # each handler takes 2 ms: the worker spends its time draining, where
    # the handover is most often seen
    opts = ["--idle-batch", "--delay-ms", "2"]
    srv = servers.start([SLOWDRV, *opts, "--queues", "2", "--recovery",
                         "60"])
    load = Background(lambda: fio_reads(srv.dev))
    try:
        for _ in range(HANDOVERS):
            # fio takes a while to start under TCG: hand over while the
            # reads flow
            done = stats(srv.dev)["slow_done"]
            wait_for(lambda: stats(srv.dev)["slow_done"] >= done + 64,
                     T_IO, "reads being served")
            let_run(load, rng, 0.5)
            old = srv
            srv = servers.start([SLOWDRV, *opts, "--attach", "--id",
                                 old.id])
            assert srv.dev == old.dev
            assert old.wait() == 0, old.output()
    finally:
        load.stop()
    assert load.runs > 0
    assert_clean_counters(srv.dev, HANDOVERS)
    srv.stop()


@pytest.mark.time_limit(1800)
def test_event_mode_server_hands_over_and_recovers(servers, tmp_path):
    """hybd-loop's workers wait on their io_uring (event mode), with
    requests in flight inside it: taken over by a new hybd-loop, every
    other time by a handover and otherwise after a SIGKILL, under
    fio --verify, they lose nothing."""
    need_built(LOOP, "examples/loop/hybd-loop")
    rng = seeded("loop")
    img = tmp_path / "loop.img"
    with open(img, "wb") as f:
        f.truncate(64 * MiB)
    srv = servers.start([LOOP, "--queues", "2", "--recovery", "60", img])
    fio = Background(lambda: fio_verify(srv.dev, "4k", "16M", 2))
    try:
        for i in range(HANDOVERS):
            let_run(fio, rng, 1.0)
            old = srv
            if i % 2:
                old.kill()
                wait_waiting(old)
            srv = servers.start([LOOP, "--attach", "--id", old.id, img])
            assert srv.dev == old.dev
            if not i % 2:
                assert old.wait() == 0, old.output()
    finally:
        fio.stop()
    assert_clean_counters(srv.dev, HANDOVERS)
    srv.stop()


def test_attach_refusals(ramdisk, tmp_path):
    """--attach to nothing, to a dead device, or with a size that does not
    match: a clear error, and nothing changes."""
    missing = free_id()
    res = run([RAMDISK, "--attach", "--id", str(missing), "--size", "16M"],
              timeout=T_CMD)
    assert res.returncode == 1 and "No such device" in res.stderr, res.stderr

    srv = ramdisk(size="16M", backing=tmp_path / "a.img")
    res = run([RAMDISK, "--attach", "--id", str(srv.id), "--size", "32M"],
              timeout=T_CMD)
    assert res.returncode == 1, res.stderr
    assert "has 16777216 bytes, the driver's config says 33554432" in \
        res.stderr, res.stderr
    # refused before the old server was asked to leave: it serves on
    assert info(srv.dev)["state"] == "live" and srv.alive()
    direct_write(srv.dev, 0, pattern("still", 4096))
    srv.kill()
    wait_for(lambda: info(srv.dev)["state"] == "dead", T_CMD, "dead")
    res = run([RAMDISK, "--attach", "--id", str(srv.id), "--size", "16M"],
              timeout=T_CMD)
    assert res.returncode == 1 and "is dead or being deleted" in res.stderr, \
        res.stderr
    hybdctl("del", srv.dev)

    res = run([RAMDISK, "--attach", "--size", "16M"], timeout=T_CMD)
    assert res.returncode == 2 and "--attach needs --id" in res.stderr


def test_handover_ioctl_errors(ramdisk):
    srv = ramdisk(size="16M")
    with uapi.Control() as ctl:
        assert uapi.handover(ctl, free_id()) == errno.ENODEV
        assert uapi.handover(ctl, srv.id, flags=1) == errno.EOPNOTSUPP
        assert uapi.handover(ctl, srv.id, reserved0=1) == errno.EINVAL
    assert info(srv.dev)["state"] == "live"
    srv.stop()
