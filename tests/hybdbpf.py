# SPDX-License-Identifier: GPL-2.0
"""Helpers for the fast-path tests (test_bpf_*.py): attaching programs with
hybdctl, reading the counters the kernel and hybd keep, and 4 KiB O_DIRECT
reads one request at a time (the unit the sample programs serve).

Every test that attaches uses the `fastpath` fixture (import it into the
test module): whatever a test leaves attached or pinned is detached at
teardown, before its servers stop, so that a pinned link never outlives
its test (it would keep the module loaded and the device id busy).
"""

import mmap
import os
import queue
import re
import shutil
import struct
import subprocess
import threading
from pathlib import Path

import pytest

import hybd_uapi as uapi
from hybdlib import (REPO, T_ATTACH, T_CMD, direct_read, direct_write, hybdctl, info,
                     io_errno, need_built, reap, run, wait_for)

BLOCK = 4096
PROGS = REPO / "bpf"
TEST_PROGS = REPO / "tests" / "bpf"
PIN_ROOT = Path("/sys/fs/bpf/hybd")
BPFCTL = REPO / "tests" / "helpers" / "bpfctl"

ATTACHED_RE = re.compile(
    r"^attached (\S+) \(link (\d+)\) to (/dev/hybd\d+)\s*$", re.M)


def prog(name):
    """bpf/NAME.bpf.o, the sample programs."""
    path = PROGS / f"{name}.bpf.o"
    if not path.is_file():
        pytest.fail(f"{path} not built; run make", pytrace=False)
    return str(path)


def suite_prog(name):
    """tests/bpf/NAME.bpf.o, the programs only the suite attaches."""
    path = TEST_PROGS / f"{name}.bpf.o"
    if not path.is_file():
        pytest.fail(f"{path} not built; run make", pytrace=False)
    return str(path)


def dev_id_of(dev):
    m = re.search(r"(\d+)$", str(dev))
    assert m, f"not a hybd device: {dev}"
    return int(m.group(1))


def attach(path, dev, replace=False):
    """hybdctl attach PATH DEV [--replace]; returns (rc, stdout, stderr)."""
    args = ["attach", path, str(dev)] + (["--replace"] if replace else [])
    return hybdctl(*args, timeout=T_ATTACH)


def attach_ok(path, dev, replace=False):
    """Attach (or replace) and check what hybdctl says; returns the link
    id it printed."""
    rc, out, err = attach(path, dev, replace)
    verb = "replace" if replace else "attach"
    assert rc == 0, f"hybdctl {verb} {path} {dev}: exit {rc}\n{out}{err}"
    m = ATTACHED_RE.search(out)
    assert m, f"hybdctl {verb}: unexpected output {out!r}"
    assert m.group(3) == str(dev), out
    assert int(m.group(2)) > 0, f"hybdctl {verb}: no link id: {out!r}"
    return int(m.group(2))


def detach(dev):
    return hybdctl("detach", str(dev))


def detach_ok(dev):
    rc, out, err = detach(dev)
    assert rc == 0, f"hybdctl detach {dev}: exit {rc}\n{out}{err}"


def pin_dir(dev_id):
    return PIN_ROOT / str(dev_id)


def unpin(dev_id):
    """Remove what hybdctl pinned for a device id, without hybdctl (the
    device may be gone already).  Unpinning the link detaches it."""
    d = pin_dir(dev_id)
    if d.exists():
        shutil.rmtree(d, ignore_errors=True)
    return not d.exists()


def attached(dev):
    """(name, link id) of the device's fast path, or None, as hybdctl info
    --json shows it."""
    b = info(dev)["bpf"]
    return None if b is None else (b["name"], b["link_id"])


def settle():
    """Wait for udev to finish with new devices: its probe of a disk that
    just appeared reads it, and would count in a test's deltas."""
    udevadm = shutil.which("udevadm")
    if udevadm:
        run([udevadm, "settle", "--timeout=30"])


class FastPath:
    """The devices a test attached programs to; see `fastpath`."""

    def __init__(self):
        self.ids = set()

    def attach(self, path, dev, replace=False):
        self.ids.add(dev_id_of(dev))
        return attach_ok(path, dev, replace)

    def cleanup(self):
        left = []
        for dev_id in sorted(self.ids):
            if not pin_dir(dev_id).exists():
                continue
            rc, _, _ = detach(f"/dev/hybd{dev_id}")
            if rc != 0 or pin_dir(dev_id).exists():
                left.append(dev_id)
                unpin(dev_id)
        return left


@pytest.fixture
def fastpath(servers):
    """fastpath.attach(prog, dev[, replace]) -> link id; everything is
    detached at teardown (servers still running), and a test that leaves
    a pin `hybdctl detach` cannot remove fails."""
    fp = FastPath()
    yield fp
    left = fp.cleanup()
    if left:
        pytest.fail(f"hybdctl detach did not remove the pins of {left}",
                    pytrace=False)


# ------------------------------------------------------------- counters

def dev_info(dev):
    """HYBD_CTL_INFO straight from the control node (no process to start,
    which costs a second under TCG): {"bpf": (name, link id) or None,
    "bpf_attaches": n, "stats": {counter: value}}."""
    buf = bytearray(uapi.INFO_SIZE)
    struct.pack_into("<II", buf, 0, uapi.INFO_SIZE, dev_id_of(dev))
    with uapi.Control() as ctl:
        e = uapi.ioctl(ctl.fd, uapi.CTL_INFO, buf)
    assert e == 0, f"HYBD_CTL_INFO {dev}: {uapi.errname(e)}"
    (_, _, _, _, _, _, link_id, attaches, name, *_) = struct.unpack_from(
        uapi.INFO_HDR_FMT, buf)
    name = name.split(b"\0", 1)[0].decode()
    off = struct.calcsize(uapi.INFO_HDR_FMT) + uapi.PARAMS_SIZE
    vals = struct.unpack_from(f"<{uapi.NR_STATS}Q", buf, off)
    return {"bpf": (name, link_id) if name or link_id else None,
            "bpf_attaches": attaches,
            "stats": dict(zip(uapi.STATS_FIELDS, vals))}


def stats(dev):
    """The device's struct hybd_dev_stats, by field name."""
    return dev_info(dev)["stats"]


def delta(after, before):
    return {k: after[k] - before[k] for k in after if k in before}


# /sys/block/<dev>/stat, Linux >= 5.5 (Documentation/block/stat.rst):
# read I/Os, merges, sectors, ticks; write the same four; in_flight,
# io_ticks, time_in_queue; discard four; flush I/Os, flush ticks.
STAT_READ_IOS, STAT_WRITE_IOS, STAT_IN_FLIGHT = 0, 4, 8
STAT_DISCARD_IOS, STAT_FLUSH_IOS = 11, 15


def disk_stat(dev):
    name = os.path.basename(str(dev))
    fields = [int(x) for x in
              Path(f"/sys/block/{name}/stat").read_text().split()]
    assert len(fields) >= 17, f"/sys/block/{name}/stat: {fields}"
    return fields


def disk_completed_ios(dev):
    """Requests the block layer saw complete on dev (all kinds), once none
    is in flight."""
    def settled():
        f = disk_stat(dev)
        return f if f[STAT_IN_FLIGHT] == 0 else None
    f = wait_for(settled, 30, f"{dev}: in_flight 0")
    return (f[STAT_READ_IOS] + f[STAT_WRITE_IOS] + f[STAT_DISCARD_IOS] +
            f[STAT_FLUSH_IOS])


# ------------------------------------------------------------------ I/O

def read_blocks(dev, first, count):
    """Read blocks [first, first + count) with one 4 KiB O_DIRECT pread
    each; returns the data."""
    buf = mmap.mmap(-1, BLOCK)
    out = bytearray()
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        with memoryview(buf) as view:
            for blk in range(first, first + count):
                n = os.preadv(fd, [view], blk * BLOCK)
                assert n == BLOCK, f"short read of block {blk} on {dev}: {n}"
                out += view
    finally:
        os.close(fd)
        buf.close()
    return bytes(out)


def read_errno(dev, offset, length=BLOCK):
    """One O_DIRECT read; returns the errno it failed with, or 0."""
    return io_errno(direct_read, dev, offset, length)


def write_errno(dev, offset, data):
    """One O_DIRECT write; returns the errno it failed with, or 0."""
    return io_errno(direct_write, dev, offset, data)


def need_bpf():
    """Skip unless the loaded module offers the fast path (HYBD_F_BPF, and
    BTF for libbpf to find struct hybd_bpf_ops in)."""
    with uapi.Control() as ctl:
        e, _, feats = uapi.features(ctl)
    assert e == 0, f"HYBD_CTL_GET_FEATURES: {uapi.errname(e)}"
    if not feats & uapi.F_BPF:
        pytest.skip("the hybd module has no BPF fast path (HYBD_F_BPF)")
    if not Path("/sys/kernel/btf/hybd").exists():
        pytest.skip("no BTF for the hybd module (/sys/kernel/btf/hybd)")


# --------------------------------------------------------------- bpfctl

class BpfCtl:
    """tests/helpers/bpfctl run: libbpf driven one command at a time (see
    bpfctl.c).  cmd(...) returns (errno, [words]): (0, values) for "ok",
    (E, []) for "err E".  Its links are closed when it quits."""

    def __init__(self):
        need_built(BPFCTL, "tests/helpers/bpfctl")
        self.proc = subprocess.Popen(
            [str(BPFCTL), "run"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        self.err = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True),
                         daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False),
                         daemon=True).start()

    def _pump(self, stream, is_stdout):
        for line in stream:
            if is_stdout:
                self.lines.put(line)
            else:
                self.err.append(line)
        if is_stdout:
            self.lines.put(None)

    def cmd(self, *words, timeout=T_CMD):
        line = " ".join(str(w) for w in words)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        try:
            reply = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"bpfctl: no answer to {line!r} in {timeout}s",
                        pytrace=False)
        if reply is None:
            pytest.fail(f"bpfctl exited on {line!r}: {''.join(self.err)}",
                        pytrace=False)
        words = reply.split()
        if words[0] == "ok":
            return 0, [int(w) for w in words[1:]]
        assert words[0] == "err" and len(words) == 2, reply
        return int(words[1]), []

    def ok(self, *words, timeout=T_CMD):
        """cmd() that must succeed; returns the values."""
        e, vals = self.cmd(*words, timeout=timeout)
        assert e == 0, (f"bpfctl {' '.join(map(str, words))}: "
                        f"{os.strerror(e)}\n{''.join(self.err)[-3000:]}")
        return vals

    def open(self, name, path, dev):
        """Load PATH as NAME, its hybd ops pointed at device DEV."""
        self.ok("open", name, path, dev_id_of(dev), timeout=2 * T_CMD)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=T_CMD)
            except (OSError, subprocess.TimeoutExpired):
                pass
        return reap(self.proc)


@pytest.fixture
def bpfctl(servers):
    """bpfctl() starts a tests/helpers/bpfctl; every one is told to quit
    (closing its links) at teardown, before the servers stop."""
    ctls = []

    def start():
        ctls.append(BpfCtl())
        return ctls[-1]
    yield start
    for c in ctls:
        c.close()
