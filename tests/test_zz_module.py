# SPDX-License-Identifier: GPL-2.0
"""Module unload and reload (runs last: the file name sorts last).  rmmod
is refused while anything uses the module and changes nothing then; with
only server-less (added or dead) devices left, rmmod tears them down and
insmod works again.  The module is left loaded for the runner's own final
rmmod check."""

import ctypes
import errno
import os
import re
import time
from pathlib import Path

import pytest

import hybd_uapi as uapi
import hybdbpf
from hybdlib import (SLOW, CONTROL, KMOD, RAMDISK, T_CMD, Server, add_device,
                     assert_data, direct_write, info, list_devices, need_built,
                     pattern, run, wait_for)

MiB = 1 << 20


def loaded():
    return Path("/sys/module/hybd").exists()


def insmod():
    run(["insmod", KMOD], timeout=T_CMD, check=True)
    wait_for(lambda: os.path.exists(CONTROL), 10, f"{CONTROL} after insmod")


@pytest.fixture
def keep_loaded():
    """Whatever happens, the module is loaded again afterwards."""
    yield
    if not loaded():
        insmod()


def assert_rmmod_refused():
    res = run(["rmmod", "hybd"], timeout=T_CMD)
    assert res.returncode != 0, "rmmod succeeded while the module was in use"
    assert re.search(r"in use|busy", res.stderr, re.I), res.stderr
    assert loaded() and os.path.exists(CONTROL)


def test_rmmod_is_refused_while_a_server_runs(ramdisk, keep_loaded):
    srv = ramdisk(size="16M")
    data = pattern("rmmod", MiB)
    direct_write(srv.dev, 0, data)

    assert_rmmod_refused()

    assert info(srv.dev)["state"] == "live"
    assert_data(srv.dev, 0, data, "after the refused rmmod")
    more = pattern("rmmod2", MiB)
    direct_write(srv.dev, 2 * MiB, more)
    assert_data(srv.dev, 2 * MiB, more, "written after the refused rmmod")
    srv.stop()


def test_rmmod_is_refused_while_the_control_node_is_open(keep_loaded):
    fd = os.open(CONTROL, os.O_RDWR)
    try:
        assert_rmmod_refused()
    finally:
        os.close(fd)


def test_rmmod_tears_down_serverless_devices_and_insmod_works_again(
        ramdisk, added_devices, keep_loaded):
    dead = ramdisk(size="16M")
    dead.kill()
    wait_for(lambda: info(dead.id)["state"] == "dead", 10, "state dead")
    added = [add_device("--size", "16M"),
             add_device("--size", "32M", "--queues", "2")]
    added_devices.extend(added)
    assert {info(i)["state"] for i in added} == {"added"}

    res = run(["rmmod", "hybd"], timeout=120)
    assert res.returncode == 0, f"rmmod: {res.stderr}"
    wait_for(lambda: not loaded(), 10, "/sys/module/hybd to go")
    assert not os.path.exists(CONTROL)
    assert not os.path.exists(dead.dev)
    assert not list(Path("/sys/block").glob("hybd*"))

    insmod()
    assert list_devices() == []
    srv = ramdisk(size="16M")
    data = pattern("reloaded", MiB)
    direct_write(srv.dev, 0, data)
    assert_data(srv.dev, 0, data, "after reload")
    counters = srv.stop()
    assert counters["writes"] > 0, counters


# ------------------------------------------------------ load/unload loop

LOOPS = 100
BPF_EVERY = 10          # a program load costs seconds under TCG
NR_finit_module, NR_delete_module = 313, 176      # x86-64

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def finit_module(path):
    """insmod without a process (one costs about a second under TCG)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.syscall(ctypes.c_long(NR_finit_module), ctypes.c_long(fd),
                         b"", ctypes.c_long(0)) != 0:
            e = ctypes.get_errno()
            pytest.fail(f"finit_module({path}): {os.strerror(e)}", pytrace=False)
    finally:
        os.close(fd)
    wait_for(lambda: os.path.exists(CONTROL), 10, f"{CONTROL} after insmod")


def delete_module(timeout=30):
    """rmmod hybd, retrying while a reference that goes asynchronously (a
    struct_ops map is freed after an RCU grace period) still holds it."""
    deadline = time.monotonic() + timeout
    while True:
        if _libc.syscall(ctypes.c_long(NR_delete_module), b"hybd",
                         ctypes.c_long(os.O_NONBLOCK)) == 0:
            break
        e = ctypes.get_errno()
        if e not in (errno.EBUSY, errno.EAGAIN) or time.monotonic() > deadline:
            pytest.fail(f"delete_module(hybd): {os.strerror(e)}", pytrace=False)
        time.sleep(0.2)
    wait_for(lambda: not loaded(), 10, "/sys/module/hybd to go")


def module_range():
    """(start, end) of the loaded module's memory, from /proc/modules: the
    addresses a kmemleak backtrace shows for hybd once it is unloaded."""
    for line in Path("/proc/modules").read_text().splitlines():
        f = line.split()
        if f[0] == "hybd" and len(f) >= 6 and f[5].startswith("0x"):
            start = int(f[5], 16)
            return start, start + int(f[1])
    return None


class Phases:
    """Seconds spent per phase of the cycles, for the report."""

    def __init__(self):
        self.spent = {}
        self._t = None

    def __call__(self, name):
        now = time.monotonic()
        if self._t is not None:
            self.spent[self._name] = self.spent.get(self._name, 0) + now - self._t
        self._name, self._t = name, now

    def report(self):
        return ", ".join(f"{k} {v:.1f}s" for k, v in self.spent.items())


def one_cycle(n, with_bpf, phase, ranges):
    """insmod; a ramdisk and a server-less device; verified I/O (through
    the cache program with_bpf); delete both; rmmod.  Adds the module's
    address range to ranges."""
    phase("insmod")
    finit_module(KMOD)
    where = module_range()
    if where:
        ranges.append(where)
    phase("server start")
    srv = Server([RAMDISK, "--size", "8M", "--queues", "2", "--depth", "16",
                  "--max-io", "128K"])
    try:
        phase("add")
        with uapi.Control() as ctl:
            e, extra, _ = uapi.add(ctl, b=uapi.basic(size=4 * MiB))
        assert e == 0, f"HYBD_CTL_ADD: {uapi.errname(e)}"
        phase("io")
        data = pattern(f"loop{n}", 64 * 1024)
        offset = (n % 64) * 64 * 1024
        direct_write(srv.dev, offset, data)
        assert_data(srv.dev, offset, data, f"cycle {n}")
        if with_bpf:
            phase("bpf")
            hybdbpf.attach_ok(hybdbpf.prog("cache"), srv.dev)
            passes = []
            for _ in range(2):
                before = hybdbpf.stats(srv.dev)
                got = hybdbpf.read_blocks(srv.dev, offset // 4096, 16)
                assert got == data, f"cycle {n}: read through the cache"
                passes.append(hybdbpf.delta(hybdbpf.stats(srv.dev), before))
            assert passes[1]["fast_done"] >= 14, (n, passes)
            hybdbpf.detach_ok(srv.dev)
        phase("delete")
        with uapi.Control() as ctl:
            assert uapi.delete(ctl, extra) == 0
        srv.stop()
    finally:
        srv.cleanup()
    phase("rmmod")
    delete_module()
    phase("other")


# /proc/slabinfo and /proc/meminfo, with the slab caches shrunk first (so
# that per-CPU partial slabs do not hide freed objects) and RCU-deferred
# frees given time to run.

def shrink_slabs():
    for cache in Path("/sys/kernel/slab").iterdir():
        try:
            (cache / "shrink").write_text("1")
        except OSError:
            pass


def slab_objects():
    """{cache: (active objects, object size)}."""
    out = {}
    for line in Path("/proc/slabinfo").read_text().splitlines()[2:]:
        f = line.split()
        out[f[0]] = (int(f[1]), int(f[3]))
    return out


def meminfo(*keys):
    vals = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":", 1)
        if k in keys:
            vals[k] = int(v.split()[0]) * 1024
    return vals


def user_processes():
    """{comm: count} of the user-space processes (the noise's sources)."""
    out = {}
    for p in Path("/proc").iterdir():
        try:
            if not p.name.isdigit() or not os.readlink(p / "exe"):
                continue
            comm = (p / "comm").read_text().strip()
        except OSError:
            continue
        out[comm] = out.get(comm, 0) + 1
    return out


def memory(samples=3):
    """The counters, each the smallest of a few samples a second apart:
    what is leaked stays, what is on its way out (a process exiting, a
    file closing) shows in some samples only."""
    # udev's workers linger a few seconds after the last event
    deadline = time.monotonic() + 20
    while "(udev-worker)" in user_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    snaps = []
    for _ in range(samples):
        # the shrinkers, among them kfree_rcu()'s (its batches otherwise
        # wait up to 5 s), then their RCU grace period
        Path("/proc/sys/vm/drop_caches").write_text("2")
        time.sleep(1)
        shrink_slabs()
        snaps.append({"slab": slab_objects(),
                      **meminfo("Slab", "SUnreclaim", "VmallocUsed")})
    out = {k: min(s[k] for s in snaps) for k in snaps[0] if k != "slab"}
    out["slab"] = {c: min((s["slab"].get(c, (1 << 62, 0)) for s in snaps))
                   for c in snaps[0]["slab"]}
    out["processes"] = user_processes()
    return out


def growth(before, after):
    """{counter: growth}: bytes for the meminfo counters, objects for each
    slab cache ("slab NAME")."""
    out = {k: after[k] - before[k] for k in after
           if k not in ("slab", "processes")}
    for cache, (objs, _) in after["slab"].items():
        out[f"slab {cache}"] = objs - before["slab"].get(cache, (0, 0))[0]
    return out


# What counts as a leak.  A leak in every cycle grows a counter by at least
# one object per cycle, LOOPS / 2 over each half of the loop; what changes
# for other reasons (a udev worker, a file of the runner, RCU) comes once,
# in one half.  Measured on the Debian guest with memory()'s settling, over
# 100 cycles: caches moved by up to +-150 objects in one half, never by more
# than (11, 30) or (19, 52) in both; Slab and SUnreclaim by up to +-470 KiB,
# VmallocUsed by up to +-280 KiB.  An eventfd left open in every cycle (one
# kmalloc-64 object) showed as exactly (+50, +50).  So a counter leaks if
# it grew in both halves by:
HALF_OBJECTS = 40                   # objects, for each slab cache
HALF_BYTES = {"SUnreclaim": 256 << 10, "VmallocUsed": 512 << 10}


def leaked(halves):
    """{counter: (first half, second half)} of the counters that grew in
    both halves beyond the limits above."""
    out = {}
    for k in set(halves[0]) | set(halves[1]):
        limit = HALF_OBJECTS if k.startswith("slab ") else HALF_BYTES.get(k)
        a, b = halves[0].get(k, 0), halves[1].get(k, 0)
        if limit is not None and a >= limit and b >= limit:
            out[k] = (a, b)
    return out


KMEMLEAK = Path("/sys/kernel/debug/kmemleak")
ADDR_RE = re.compile(r"\[<([0-9a-f]+)>\]")
OBJECT_RE = re.compile(r"^unreferenced object (0x[0-9a-f]+)")


def kmemleak_hybd(ranges):
    """{object address: report} of the unreferenced objects kmemleak finds
    whose allocation backtrace is in hybd: by name while it is loaded, by
    address (any range the module occupied) once it is unloaded.  No
    `clear`: that would hide earlier tests' leaks from the runner's final
    scan; the caller compares with what was there before."""
    # an object is reported once it is older than 5 s and was found
    # unreferenced; a second scan drops transient false positives
    time.sleep(5)
    for _ in range(2):
        KMEMLEAK.write_text("scan")
    out = {}
    for report in re.split(r"(?m)^(?=unreferenced object)",
                           KMEMLEAK.read_text()):
        m = OBJECT_RE.match(report)
        if not m:
            continue
        addrs = [int(a, 16) for a in ADDR_RE.findall(report)]
        if "hybd" in report or any(lo <= a < hi for a in addrs
                                   for lo, hi in ranges):
            out[m.group(1)] = report
    return out


@pytest.mark.time_limit(900 * SLOW)
def test_load_unload_loop_leaks_no_memory(keep_loaded):
    """100 times: insmod, a ramdisk and an added device, verified I/O
    (every BPF_EVERY-th time through the cache program, attached and
    detached), delete, rmmod.  Then no slab cache, nor vmalloc, grew in
    both halves of the loop (see HALF_OBJECTS), and kmemleak, where the
    kernel has it (the debug kernel), finds no unreferenced hybd object."""
    need_built(RAMDISK, "examples/ramdisk/ramdisk")
    hybdbpf.need_bpf()
    delete_module()
    phase = Phases()
    ranges = []         # every address range the module occupied
    # one cycle first: what the kernel allocates once and keeps (the first
    # program load, caches created on first use) is not a leak
    one_cycle(0, True, phase, ranges)
    known = kmemleak_hybd(ranges) if KMEMLEAK.exists() else {}
    snaps = [memory()]
    t0 = time.monotonic()
    for n in range(1, LOOPS + 1):
        one_cycle(n, n % BPF_EVERY == 0, phase, ranges)
        if n == LOOPS // 2:
            snaps.append(memory())
    took = time.monotonic() - t0
    snaps.append(memory())
    finit_module(KMOD)

    halves = [growth(snaps[0], snaps[1]), growth(snaps[1], snaps[2])]
    grew = growth(snaps[0], snaps[2])
    report = [f"{LOOPS} cycles in {took:.1f}s, bpf every {BPF_EVERY}: "
              f"{phase.report()}",
              "growth: counter total (first half, second half)"]
    for k, v in sorted(grew.items(), key=lambda kv: -abs(kv[1])):
        a, b = halves[0].get(k, 0), halves[1].get(k, 0)
        if v or a:
            report.append(f"{k}: {v:+d} ({a:+d}, {b:+d})")
    report += [f"processes at snapshot {i}: {s['processes']}"
               for i, s in enumerate(snaps)]
    if os.environ.get("HYBD_RESULTS"):
        Path(os.environ["HYBD_RESULTS"], "module-loop.txt").write_text(
            "\n".join(report) + "\n")
    print("\n".join(report[:40]))

    bad = leaked(halves)
    assert not bad, (f"memory grew in both halves of {LOOPS} load/unload "
                     f"cycles: {bad}; see module-loop.txt")
    if KMEMLEAK.exists():
        found = kmemleak_hybd(ranges)
        new = [r for addr, r in found.items() if addr not in known]
        assert not new, (f"kmemleak: {len(new)} hybd objects leaked:\n"
                         + "\n".join(new[:5]))
