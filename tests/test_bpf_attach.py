# SPDX-License-Identifier: GPL-2.0
"""The BPF fast path, attached with hybdctl: attach, replace and detach
under verified I/O lose and duplicate nothing; a program sees only its own
device; the sample programs serve what they should (cache hits, zeros) and
nothing they should not; a program that breaks the return contract, fails
requests on purpose or is refused by the verifier is handled and reported
as documented."""

import errno
import json
import os
import re
import subprocess
import threading
import time

import pytest

from hybdbpf import (BLOCK, attached, delta, detach, detach_ok, dev_info,
                     disk_completed_ios, fastpath, need_bpf, pin_dir, prog,
                     read_blocks, read_errno, settle, stats, suite_prog,
                     write_errno)
from hybdlib import (LONG, T_IO, direct_read, direct_write, hybdctl,
                     hybdctl_json, io_uring_usable, need_tool, pattern, reap,
                     sysfs_queue, wait_for)

assert fastpath      # a fixture, used by name

MiB = 1 << 20
CPUS = os.cpu_count() or 1
QUEUES = 2


@pytest.fixture(autouse=True)
def _bpf():
    need_bpf()


def small_ramdisk(ramdisk, **opts):
    """A ramdisk with modest per-queue buffers (depth * max_io each), once
    udev has finished probing it."""
    opts.setdefault("size", "64M")
    opts.setdefault("queues", QUEUES)
    opts.setdefault("depth", 32)
    opts.setdefault("max_io", "128K")
    srv = ramdisk(**opts)
    settle()
    return srv


# ------------------------------------------ attach/replace/detach under I/O

# make test walks the plan once (8 steps: each action, each program
# loaded); `make test-long` walks it with each program in each place and
# more (50 steps)
CYCLES = 50 if LONG else 8
CYCLE_PROGS = ("cache", "zero", "passthrough")
# attach, replace twice (a replaced link replaced again), detach, then two
# attaches detached right away: under TCG each load costs hybdctl ~5 s,
# mostly libbpf reading the kernel's BTF, so detaches are the cheap steps
CYCLE_ACTIONS = ("attach", "replace", "replace", "detach",
                 "attach", "detach", "attach", "detach")
FIO_SECONDS = 15        # one fio run; runs follow each other until the end
# fio, one job per hardware queue: 4 KiB blocks and a mix, run by run
FIO_BS = (["--bs=4k"], ["--bssplit=4k/40:8k/20:16k/20:64k/20"])


def fio_cmd(dev, run_no):
    """Verified random read/write over every hardware queue, a job per
    queue in its own region, each verifying what it wrote every 32 writes
    (a time_based job has no final verify pass).  At nice 19: the I/O
    keeps flowing, but hybdctl is not starved of the two vCPUs, which
    would make the cycles take minutes under TCG."""
    per_job = 8 * MiB
    engine = "io_uring" if io_uring_usable() else "libaio"
    return [
        "nice", "-n", "19", need_tool("fio"), "--output-format=json",
        "--verify_state_save=0", f"--filename={dev}", "--direct=1",
        f"--ioengine={engine}", "--iodepth=8", "--rw=randrw",
        "--verify=crc32c", "--verify_fatal=1", "--verify_backlog=32",
        "--do_verify=1", "--time_based", f"--runtime={FIO_SECONDS}",
        f"--cpus_allowed=0-{CPUS - 1}", "--cpus_allowed_policy=split",
        "--name=verify", *FIO_BS[run_no % len(FIO_BS)], f"--size={per_job}",
        f"--numjobs={QUEUES}", f"--offset_increment={per_job}",
    ]


class FioLoop:
    """fio runs, one after the other, until stop(); each must pass."""

    def __init__(self, dev):
        self.dev = dev
        self.runs, self.failures = [], []
        self.proc = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            self.proc = subprocess.Popen(
                fio_cmd(self.dev, len(self.runs)), cwd="/tmp", text=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE)
            try:
                out, err = self.proc.communicate(timeout=FIO_SECONDS + T_IO)
            except subprocess.TimeoutExpired:
                reap(self.proc)
                self.failures.append("fio did not finish")
                return
            self.runs.append(self._check(self.proc.returncode, out, err))

    def _check(self, rc, out, err):
        if rc != 0:
            self.failures.append(f"fio exit {rc}\n{err}\n{out[-3000:]}")
            return None
        jobs = json.loads(out[out.index("{"):])["jobs"]
        for j in jobs:
            if j["error"] or not (j["read"]["total_ios"] and
                                  j["write"]["total_ios"]):
                self.failures.append(
                    f"fio job {j['jobname']}: error {j['error']}, "
                    f"{j['read']['total_ios']} reads, "
                    f"{j['write']['total_ios']} writes")
        return sum(j["read"]["total_ios"] + j["write"]["total_ios"]
                   for j in jobs)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        self._stop.set()
        self._thread.join(FIO_SECONDS + T_IO + 30)
        return not self._thread.is_alive()

    def kill(self):
        self._stop.set()
        if self.proc is not None:
            reap(self.proc)


def cycle_plan():
    """(action, program) per step; each attach or replace loads the next
    program in turn, so that each is attached, replaced and replaced by
    each other."""
    plan, loads = [], 0
    for i in range(CYCLES):
        action = CYCLE_ACTIONS[i % len(CYCLE_ACTIONS)]
        if action == "detach":
            plan.append((action, None))
        else:
            plan.append((action, CYCLE_PROGS[loads % len(CYCLE_PROGS)]))
            loads += 1
    return plan


@pytest.fixture
def fio_loop():
    loops = []
    yield lambda dev: loops.append(FioLoop(dev)) or loops[-1]
    for loop in loops:
        loop.kill()


def test_attach_replace_detach_cycles_under_fio_verify(ramdisk, fastpath,
                                                       fio_loop):
    srv = small_ramdisk(ramdisk)
    assert sysfs_queue(srv.dev, "iostats") == "1"
    attaches0 = dev_info(srv.dev)["bpf_attaches"]
    fio = fio_loop(srv.dev)
    wait_for(fio.running, 30, "fio to start")
    time.sleep(2)       # every job issuing before the first attach

    link, links, grants, idle = None, set(), 0, 0
    start = time.monotonic()
    for step, (action, name) in enumerate(cycle_plan()):
        where = f"step {step}: {action} {name or ''}"
        idle += not fio.running()
        if action == "detach":
            detach_ok(srv.dev)
            assert dev_info(srv.dev)["bpf"] is None, where
            assert not pin_dir(srv.id).exists(), where
            link = None
            continue
        got = fastpath.attach(prog(name), srv.dev,
                              replace=action == "replace")
        grants += 1
        if action == "replace":
            assert got == link, f"{where}: replace made a new link"
        else:
            assert got not in links, f"{where}: link id {got} reused"
            links.add(got)
            link = got
        assert dev_info(srv.dev)["bpf"] == (name, link), where
        if step % 10 == 0:
            assert attached(srv.dev) == (name, link), f"hybdctl info, {where}"
    cycling = time.monotonic() - start
    if link is not None:
        detach_ok(srv.dev)
    assert fio.stop(), "the last fio run did not end"
    assert not fio.failures, "\n".join(fio.failures)
    # between two runs, fio is starting: most steps must meet a running one
    assert idle <= CYCLES // 5, f"{idle} of {CYCLES} steps without fio"

    # every request the block layer completed was completed once, by one side
    s = stats(srv.dev)
    ios = disk_completed_ios(srv.dev)
    assert s["failed_dead"] == 0, s
    assert s["slow_issued"] == s["slow_done"], s
    assert s["fast_done"] + s["slow_done"] + s["failed_dead"] == ios, (
        f"/sys/block/hybd{srv.id}/stat: {ios} requests completed; hybd: "
        f"fast {s['fast_done']} + slow {s['slow_done']} (+ dead "
        f"{s['failed_dead']}): {s}")
    for k in ("bpf_bad_ret", "fast_errors", "slow_errors"):
        assert s[k] == 0, s
    assert s["fast_done"] > 0, f"cache and zero served nothing: {s}"
    assert dev_info(srv.dev)["bpf_attaches"] - attaches0 == grants

    # hybdctl stats: per-queue counters and histograms add up to the totals
    st = hybdctl_json("stats", srv.dev, "--per-queue")
    assert len(st["queues"]) == QUEUES, st
    for k in ("fast_done", "slow_done", "slow_issued"):
        assert st[k] == s[k], (k, st[k], s[k])
        assert sum(q[k] for q in st["queues"]) == st[k], k
    assert sum(st["fast_lat"]) == st["fast_done"], st["fast_lat"]
    assert sum(st["slow_lat"]) == st["slow_done"], st["slow_lat"]
    per_queue = [q["fast_done"] + q["slow_done"] for q in st["queues"]]
    assert all(per_queue), f"a hardware queue carried no I/O: {per_queue}"
    print(f"{CYCLES} steps ({grants} attach/replace) in {cycling:.1f}s, "
          f"{len(fio.runs)} fio runs ({sum(fio.runs)} I/Os); fast "
          f"{s['fast_done']} slow {s['slow_done']}, per queue {per_queue}")


# ------------------------------------------------------- what a program sees

def test_program_serves_only_the_device_it_is_attached_to(ramdisk, fastpath):
    a = small_ramdisk(ramdisk, size="16M")
    b = small_ramdisk(ramdisk, size="16M")
    blocks = 32
    for srv in (a, b):
        direct_write(srv.dev, 0, pattern(srv.dev, blocks * BLOCK))
    fastpath.attach(prog("cache"), a.dev)
    assert attached(b.dev) is None

    for srv in (b, a):
        passes = []
        for _ in range(2):
            before = stats(srv.dev)
            got = read_blocks(srv.dev, 0, blocks)
            assert got == pattern(srv.dev, blocks * BLOCK), srv.dev
            passes.append(delta(stats(srv.dev), before))
        if srv is b:
            assert all(p["fast_done"] == 0 and p["slow_done"] == blocks
                       for p in passes), passes
        else:
            assert passes[1]["fast_done"] >= blocks * 9 // 10, passes

    # a program that fails every read of A leaves B's reads alone
    fastpath.attach(suite_prog("garbage"), a.dev, replace=True)
    assert read_errno(a.dev, 0) == errno.EIO
    before = stats(b.dev)
    assert read_blocks(b.dev, 0, blocks) == pattern(b.dev, blocks * BLOCK)
    d = delta(stats(b.dev), before)
    assert d["fast_done"] == 0 and d["bpf_bad_ret"] == 0, d


def test_cache_serves_hits_with_the_written_data(ramdisk, fastpath):
    srv = small_ramdisk(ramdisk, size="16M")
    blocks = 64
    fastpath.attach(prog("cache"), srv.dev)
    data = pattern("cache-hits", blocks * BLOCK)
    direct_write(srv.dev, 0, data)

    passes = []
    for _ in range(2):
        before = stats(srv.dev)
        assert read_blocks(srv.dev, 0, blocks) == data
        passes.append(delta(stats(srv.dev), before))
    assert passes[0]["slow_done"] >= blocks * 9 // 10, passes
    assert passes[1]["fast_done"] >= blocks * 9 // 10, passes
    assert passes[1]["fast_errors"] == 0, passes

    # an overwrite replaces the cached copy: the new data, never the old
    new = pattern("cache-overwrite", 4 * BLOCK)
    direct_write(srv.dev, 10 * BLOCK, new)
    before = stats(srv.dev)
    for _ in range(2):
        assert read_blocks(srv.dev, 10, 4) == new
        assert read_blocks(srv.dev, 6, 4) == data[6 * BLOCK:10 * BLOCK]
    d = delta(stats(srv.dev), before)
    # the old neighbours stayed cached, the new blocks were cached again
    assert d["fast_done"] >= 12, d


def test_cache_serves_multi_block_reads_it_fully_covers(ramdisk, fastpath):
    """A 64 KiB read is served in the kernel once all of its 16 blocks
    are cached (a first 64 KiB read fills them); a read with one block
    overwritten since goes to the server, and gets the new data."""
    srv = small_ramdisk(ramdisk, size="16M")
    fastpath.attach(prog("cache"), srv.dev)
    data = pattern("cache-multi", 16 * BLOCK)
    direct_write(srv.dev, 0, data)
    settle()
    got = []
    for _ in range(3):
        before = stats(srv.dev)
        assert direct_read(srv.dev, 0, 16 * BLOCK) == data
        d = delta(stats(srv.dev), before)
        got.append((d["fast_done"], d["slow_done"]))
    assert got == [(0, 1), (1, 0), (1, 0)], got
    new = pattern("cache-multi-new", BLOCK)
    direct_write(srv.dev, 5 * BLOCK, new)
    want = data[:5 * BLOCK] + new + data[6 * BLOCK:]
    before = stats(srv.dev)
    assert direct_read(srv.dev, 0, 16 * BLOCK) == want
    assert direct_read(srv.dev, 0, 16 * BLOCK) == want
    d = delta(stats(srv.dev), before)
    assert (d["fast_done"], d["slow_done"], d["fast_errors"]) == (1, 1, 0), d


def test_zero_serves_never_written_blocks_and_forgets_written_ones(
        ramdisk, fastpath):
    srv = small_ramdisk(ramdisk, size="16M")
    fastpath.attach(prog("zero"), srv.dev)
    first, blocks = 256, 32       # 1 MiB in: never written

    passes = []
    for _ in range(2):
        before = stats(srv.dev)
        assert read_blocks(srv.dev, first, blocks) == bytes(blocks * BLOCK)
        passes.append(delta(stats(srv.dev), before))
    assert passes[0]["slow_done"] == blocks, passes
    assert passes[1]["fast_done"] == blocks, passes
    assert passes[1]["slow_done"] == 0, passes

    # one block written: it reads back, its neighbours are still known zeros
    data = pattern("zero-written", BLOCK)
    mid = first + blocks // 2
    direct_write(srv.dev, mid * BLOCK, data)
    for _ in range(2):
        before = stats(srv.dev)
        assert read_blocks(srv.dev, mid, 1) == data
        d = delta(stats(srv.dev), before)
        assert d["slow_done"] == 1 and d["fast_done"] == 0, d
    before = stats(srv.dev)
    assert read_blocks(srv.dev, mid - 1, 1) == bytes(BLOCK)
    assert read_blocks(srv.dev, mid + 1, 1) == bytes(BLOCK)
    d = delta(stats(srv.dev), before)
    assert d["fast_done"] == 2 and d["slow_done"] == 0, d


# ------------------------------------------------ contract breakers, errors

GARBAGE = ("garbage", "garbage-three", "garbage-neg")   # 12345, 3, -4096


def test_out_of_contract_return_fails_reads_with_eio_and_is_counted(
        ramdisk, fastpath):
    srv = small_ramdisk(ramdisk, size="16M")
    old = pattern("garbage-old", 8 * BLOCK)
    direct_write(srv.dev, 0, old)
    written = {}

    for i, name in enumerate(GARBAGE):
        fastpath.attach(suite_prog(name), srv.dev, replace=i > 0)
        before = stats(srv.dev)
        for blk in range(4):
            assert read_errno(srv.dev, blk * BLOCK) == errno.EIO, (name, blk)
        d = delta(stats(srv.dev), before)
        assert d["bpf_bad_ret"] == 4 and d["fast_errors"] == 4, (name, d)
        assert d["fast_done"] == 4 and d["slow_issued"] == 0, (name, d)

        # writes pass to the server and work
        blk = 4 + i
        written[blk] = pattern(f"garbage-{name}", BLOCK)
        before = stats(srv.dev)
        assert write_errno(srv.dev, blk * BLOCK, written[blk]) == 0, name
        d = delta(stats(srv.dev), before)
        assert d["slow_done"] == 1 and d["bpf_bad_ret"] == 0, (name, d)

    detach_ok(srv.dev)
    expect = bytearray(old)
    for blk, data in written.items():
        expect[blk * BLOCK:(blk + 1) * BLOCK] = data
    before = stats(srv.dev)
    assert read_blocks(srv.dev, 0, 8) == bytes(expect)
    d = delta(stats(srv.dev), before)
    assert d["bpf_bad_ret"] == 0 and d["fast_done"] == 0, d


# (program, op it fails, errno the caller sees): blk keeps ENOSPC
# (BLK_STS_NOSPC); EPERM and -4095 have no block status and become EIO
FAILOPS = [("nospc-write", "write", errno.ENOSPC),
           ("eperm-read", "read", errno.EIO),
           ("maxerr-read", "read", errno.EIO)]


def test_valid_errno_fails_exactly_the_chosen_requests(ramdisk, fastpath):
    srv = small_ramdisk(ramdisk, size="16M")
    old = pattern("failop", 4 * BLOCK)
    direct_write(srv.dev, 0, old)

    for i, (name, op, err) in enumerate(FAILOPS):
        fastpath.attach(suite_prog(name), srv.dev, replace=i > 0)
        new = pattern(f"failop-{name}", BLOCK)
        before = stats(srv.dev)
        if op == "write":
            assert write_errno(srv.dev, BLOCK, new) == err, name
            # reads pass, and the failed write changed nothing
            assert read_blocks(srv.dev, 0, 4) == old, name
        else:
            assert read_errno(srv.dev, BLOCK) == err, name
            # writes pass
            assert write_errno(srv.dev, BLOCK, new) == 0, name
            old = old[:BLOCK] + new + old[2 * BLOCK:]
        d = delta(stats(srv.dev), before)
        assert d["fast_done"] == 1 and d["fast_errors"] == 1, (name, d)
        assert d["bpf_bad_ret"] == 0, (name, d)

    detach_ok(srv.dev)
    assert read_blocks(srv.dev, 0, 4) == old


# ------------------------------------------------------------- hybdctl errors

# (program, what the verifier says)
# (program, what the log says, whether the summary line says it too: the
# verifier's last word, not the explanation 7.x's verifier adds after it);
# a forged io is refused in 6.12's words or in 7.x's
BADVERIFY = [("badverify", r"only hybd_bpf_io\.scratch is writable", False),
             ("badverify-map", r"invalid access to map value", False),
             ("badverify-forge",
              r"must point to scalar|is fp expected STRUCT hybd_bpf_io", True)]


def test_verifier_refusal_is_reported_and_attaches_nothing(ramdisk,
                                                           fastpath):
    srv = small_ramdisk(ramdisk, size="16M")
    attaches0 = dev_info(srv.dev)["bpf_attaches"]
    fastpath.ids.add(srv.id)        # so that a wrongly pinned link goes

    for name, msg, in_summary in BADVERIFY:
        rc, out, err = hybdctl("attach", suite_prog(name), srv.dev)
        assert rc == 1, f"{name}: exit {rc}\n{out}{err}"
        assert re.search(msg, err), f"{name}: no verifier message in:\n{err}"
        if in_summary:
            assert re.search(msg, err.splitlines()[0]), \
                f"{name}: the summary misses the verdict:\n{err}"
        assert attached(srv.dev) is None, name
        assert dev_info(srv.dev)["bpf_attaches"] == attaches0, name
        assert not pin_dir(srv.id).exists(), name

    # the device still works, and a good program attaches afterwards
    data = pattern("after-badverify", BLOCK)
    direct_write(srv.dev, 0, data)
    fastpath.attach(prog("passthrough"), srv.dev)
    assert read_blocks(srv.dev, 0, 1) == data


def test_attach_of_what_is_no_bpf_object_says_so_once(ramdisk, tmp_path):
    """A text file, a directory, a missing file: each refusal names the
    problem in words, once (not libbpf's 'Unknown error 4001')."""
    srv = small_ramdisk(ramdisk, size="16M")
    text = tmp_path / "notes.bpf.o"
    text.write_text("not an ELF file\n")
    missing = os.strerror(errno.ENOENT)
    for path, want in ((text, "is not a BPF object"),
                       (tmp_path, "is a directory"),
                       (tmp_path / "none.bpf.o", missing)):
        rc, out, err = hybdctl("attach", path, srv.dev)
        assert rc == 1, f"{path}: exit {rc}\n{out}{err}"
        assert want in err and "Unknown error" not in err, err
        assert err.count(missing) <= 1, err
        assert attached(srv.dev) is None, path


def test_second_attach_replace_and_detach_of_nothing_fail(ramdisk,
                                                          fastpath):
    srv = small_ramdisk(ramdisk, size="16M")
    rc, out, err = detach(srv.dev)
    assert rc == 1 and re.search(r"no fast path", err), (
        f"detach of nothing: exit {rc}\n{out}{err}")
    rc, out, err = hybdctl("attach", prog("passthrough"), srv.dev,
                           "--replace")
    assert rc == 1 and re.search(r"nothing to replace|no fast path", err), (
        f"replace of nothing: exit {rc}\n{out}{err}")
    assert attached(srv.dev) is None

    link = fastpath.attach(prog("cache"), srv.dev)
    rc, out, err = hybdctl("attach", prog("passthrough"), srv.dev)
    assert rc == 1 and re.search(r"already has a fast path", err), (
        f"second attach: exit {rc}\n{out}{err}")
    assert attached(srv.dev) == ("cache", link)
    detach_ok(srv.dev)
    assert attached(srv.dev) is None
    assert not pin_dir(srv.id).exists()
