# SPDX-License-Identifier: GPL-2.0
"""Helpers for hybd's tests: commands with bounded time, hybdctl, direct I/O,
and the server processes (ramdisk, badserver).

Everything here runs as root inside the guest (tools/vm-run tests).  Every
wait is bounded: under TCG a 4 KiB read through a user-space server costs
~0.3-1 ms, so the bounds are generous, but a kernel bug must never hang the
suite.
"""

import json
import mmap
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

# struct hybd_dev_stats' names, in order (hybdctl info --json's): one list
from hybd_uapi import STATS_FIELDS  # noqa: F401 (re-exported)

REPO = Path(__file__).resolve().parent.parent
HYBDCTL = REPO / "tools" / "hybdctl" / "hybdctl"
RAMDISK = REPO / "examples" / "ramdisk" / "ramdisk"
# the Rust workspace's binaries (tools/cargo.sh --target-dir: outside the
# tree, in HYBD_CACHE)
CARGO_RELEASE = Path(os.environ.get(
    "HYBD_CARGO_TARGET",
    os.path.join(os.environ.get("HYBD_CACHE", "/var/cache/hybd"),
                 "cargo", "target"))) / "release"
ZRAM_RS = CARGO_RELEASE / "zram-rs"
RUST_RAMDISK = CARGO_RELEASE / "examples" / "ramdisk"
BADSERVER = REPO / "tests" / "helpers" / "badserver"
DEDUP = REPO / "examples" / "dedup" / "dedup"
LOOP = REPO / "examples" / "loop" / "hybd-loop"
ENCRYPT = REPO / "examples" / "encrypt" / "encrypt"
CONTROL = "/dev/hybd-control"
KMOD = os.environ.get("HYBD_KMOD", str(REPO / "kmod" / "hybd.ko"))

# bounds, in seconds: how long before a step counts as hung, never how
# fast it must be.  The debug kernel (tools/debug-kernel: KASAN, lockdep)
# verifies a BPF program several times slower, more so on a loaded host:
# there they are 3 times as long.
_SLOW = 3 if "hybd-debug" in os.uname().release else 1
# the factor itself, for a test's own time_limit
SLOW = _SLOW
T_CMD = 60 * _SLOW      # a control command (hybdctl attach, rmmod, ...)
T_READY = 60 * _SLOW    # a server printing its ready line
T_STOP = 60 * _SLOW     # a server exiting after SIGTERM
T_IO = 300          # a bounded I/O job (fio, dd, mkfs)
# a BPF object's load and attach: the verifier walks up to a quarter of
# its million instructions for the shipped programs (cache.bpf.o: 229k on
# 6.12, 254k on 7.3), which took more than 180 s under KASAN and TCG
T_ATTACH = 60 * (8 if _SLOW > 1 else 1)
# make test-long: the full kill, handover, delete and fuzz counts, and
# every variant of a parametrized test crossed with every other
LONG = os.environ.get("HYBD_LONG") == "1"


def variants(every, picked):
    """The cases of a parametrized test that this run takes: all of
    `every` (pytest.param()s with ids) in make test-long; in make test only
    those whose id is in `picked`, chosen so that each behaviour (each value
    of each parameter) still runs once: make test has a time budget
    (tools/suite-verdict --budget), crossing variants is test-long's."""
    if LONG:
        return list(every)
    ids = [p.id for p in every]
    unknown = set(picked) - set(ids)
    assert not unknown, f"variants(): no case {sorted(unknown)} in {ids}"
    chosen = [p for p in every if p.id in picked]
    for i in range(len(every[0].values)):
        lost = ({p.values[i] for p in every} -
                {p.values[i] for p in chosen})
        assert not lost, (f"variants(): {sorted(map(str, lost))} of "
                          f"parameter {i} would never run in make test")
    return chosen

COUNTERS_RE = re.compile(
    r"^ramdisk: reads=(\d+) writes=(\d+) flushes=(\d+) fua=(\d+) "
    r"discards=(\d+) write_zeroes=(\d+)\s*$")
COUNTER_NAMES = ("reads", "writes", "flushes", "fua", "discards", "write_zeroes")

# enum hybd_dev_state, as hybdctl names them
STATES = ("added", "live", "dead", "deleting", "waiting")

REJ_FIELDS = tuple(f for f in STATS_FIELDS if f.startswith("rej_"))


# ----------------------------------------------------------------- commands

def stack_of(pid):
    try:
        return Path(f"/proc/{pid}/stack").read_text()
    except OSError:
        return "(no /proc/PID/stack)"


def state_of(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "gone"


def reap(proc, timeout=10):
    """SIGKILL proc and wait for it, bounded.  Returns False if it would not
    die (stuck in the kernel, e.g. uninterruptible sleep)."""
    if proc.poll() is not None:
        return True
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def record(what, text):
    """Keep a measurement for the run's report: appended to
    RESULTS/records.txt (the guest's results directory), if there is one."""
    where = os.environ.get("HYBD_RESULTS")
    if where:
        with open(os.path.join(where, "records.txt"), "a",
                  encoding="utf-8") as f:
            f.write(f"{what}: {text}\n")


def run(cmd, timeout=T_CMD, input=None, check=False, env=None, cwd=None):
    """Run cmd (a list), bounded by timeout.

    Returns a CompletedProcess with text stdout/stderr.  On timeout the test
    fails, showing where the process is stuck in the kernel.  With check, a
    non-zero exit fails the test too.
    """
    cmd = [str(c) for c in cmd]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None
                            else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            cwd=cwd)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        state, stack = state_of(proc.pid), stack_of(proc.pid)
        died = reap(proc)
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n"
                    f"state {state}{'' if died else ', would not die'}, "
                    f"kernel stack:\n{stack}", pytrace=False)
    res = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check and res.returncode != 0:
        pytest.fail(f"{' '.join(cmd)}: exit {res.returncode}\n"
                    f"stdout: {out}\nstderr: {err}", pytrace=False)
    return res


def need_tool(name):
    """The path of an external tool, or skip the test saying which."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


def as_user(uid, cmd):
    """cmd run as uid:uid with no supplementary groups and no capability
    (setpriv), as an unprivileged user would run it."""
    need_tool("setpriv")
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", *[str(c) for c in cmd]]


def need_built(path, what):
    """Fail (not skip): the project's own binaries are built by `make`."""
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"{path} not built ({what}); run make", pytrace=False)
    return str(path)


def wait_for(pred, timeout, what, interval=0.1):
    """Poll pred() until it returns a true value; fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        val = pred()
        if val:
            return val
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}",
                        pytrace=False)
        time.sleep(interval)


# ------------------------------------------------------------------ hybdctl

def hybdctl(*args, timeout=T_CMD):
    """Run tools/hybdctl/hybdctl; returns (rc, stdout, stderr)."""
    need_built(HYBDCTL, "tools/hybdctl/hybdctl")
    res = run([HYBDCTL, *args], timeout=timeout)
    return res.returncode, res.stdout, res.stderr


def hybdctl_json(*args):
    rc, out, err = hybdctl(*args, "--json")
    assert rc == 0, f"hybdctl {' '.join(args)} --json: exit {rc}: {err}"
    try:
        return json.loads(out)
    except ValueError as e:
        pytest.fail(f"hybdctl {' '.join(args)} --json: not JSON ({e}):\n{out}",
                    pytrace=False)


def io_uring_usable():
    """Whether this kernel lets us use io_uring (fio's io_uring engine)."""
    try:
        return Path("/proc/sys/kernel/io_uring_disabled").read_text().strip() == "0"
    except OSError:
        return True


def info(dev):
    """hybdctl info DEV --json, parsed."""
    return hybdctl_json("info", str(dev))


def list_devices():
    """hybdctl list --json, parsed: [{"id":..,"state":..,"size":..}]."""
    return hybdctl_json("list")


def device_ids():
    return sorted(d["id"] for d in list_devices())


def add_device(*args):
    """hybdctl add ARGS; returns the new id."""
    rc, out, err = hybdctl("add", *args)
    assert rc == 0, f"hybdctl add {' '.join(args)}: exit {rc}: {err}"
    m = re.search(r"\d+", out)
    assert m, f"hybdctl add printed no id: {out!r}"
    return int(m.group(0))


def del_device(dev):
    return hybdctl("del", str(dev))


def free_id():
    """An id no device uses now."""
    used = set(device_ids())
    return next(i for i in range(63, -1, -1) if i not in used)


def dev_path(dev_id):
    return f"/dev/hybd{dev_id}"


# --------------------------------------------------------------- data, I/O

def pattern(seed, size):
    """size deterministic pseudo-random bytes."""
    return random.Random(seed).randbytes(size)


def _aligned(size):
    return mmap.mmap(-1, max(size, mmap.PAGESIZE))


def direct_write(dev, offset, data, extra_flags=0):
    """Write data at offset with O_DIRECT (offset, len: multiples of the
    logical block size)."""
    buf = _aligned(len(data))
    buf[:len(data)] = data
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT | extra_flags)
    try:
        with memoryview(buf) as view:
            done = 0
            while done < len(data):
                n = os.pwritev(fd, [view[done:len(data)]], offset + done)
                assert n > 0, f"short write on {dev} at {offset + done}"
                done += n
    finally:
        os.close(fd)
        buf.close()


def direct_read(dev, offset, length):
    """Read length bytes at offset with O_DIRECT."""
    buf = _aligned(length)
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        with memoryview(buf) as view:
            done = 0
            while done < length:
                n = os.preadv(fd, [view[done:length]], offset + done)
                assert n > 0, f"short read on {dev} at {offset + done}"
                done += n
            data = bytes(view[:length])
        return data
    finally:
        os.close(fd)
        buf.close()


def io_errno(op, *args, **kwargs):
    """Run op (direct_read, direct_write, ...): the errno it failed with,
    or 0."""
    try:
        op(*args, **kwargs)
        return 0
    except OSError as e:
        return e.errno


def first_difference(a, b):
    """'' if equal, else where they first differ (for assert messages)."""
    if a == b:
        return ""
    if len(a) != len(b):
        return f"lengths differ: {len(a)} != {len(b)}"
    for i in range(len(a)):
        if a[i] != b[i]:
            return f"first difference at byte {i}: {a[i]:#x} != {b[i]:#x}"
    return ""


def assert_data(dev, offset, expected, what="data"):
    got = direct_read(dev, offset, len(expected))
    assert got == expected, (f"{what} on {dev} at offset {offset}: "
                             f"{first_difference(got, expected)}")


def sysfs_queue(dev, attr):
    name = os.path.basename(dev)
    return Path(f"/sys/block/{name}/queue/{attr}").read_text().strip()


def fio(args, timeout=T_IO):
    """Run fio with JSON output; returns (rc, parsed json or None, result).
    It runs in /tmp: with verify it would write state files into its
    working directory, and the repository is read-only in the guest."""
    exe = need_tool("fio")
    res = run([exe, "--output-format=json", "--verify_state_save=0", *args],
              timeout=timeout, cwd="/tmp")
    data = None
    # fio may print warnings before the JSON document
    start = res.stdout.find("{")
    if start >= 0:
        try:
            data = json.loads(res.stdout[start:])
        except ValueError:
            data = None
    return res.returncode, data, res


def fio_verify(dev, bs, per_job, jobs, iodepth=32, engine=None, extra=()):
    """fio --verify random read/write on dev: jobs jobs of per_job bytes
    each (their regions side by side), spread over the CPUs, with fio's
    extra arguments (e.g. --fsync=N).  Asserts that fio succeeded, that
    every job wrote and read back all it wrote without an error; returns
    fio's jobs."""
    if engine is None:
        engine = "io_uring" if io_uring_usable() else "libaio"
    cpus = os.cpu_count() or 1
    rc, data, res = fio([
        "--name=verify", f"--filename={dev}", "--direct=1",
        f"--ioengine={engine}", f"--iodepth={iodepth}", "--rw=randrw",
        f"--bs={bs}", f"--size={per_job}", f"--offset_increment={per_job}",
        f"--numjobs={jobs}", "--verify=crc32c", "--verify_fatal=1",
        "--do_verify=1", f"--cpus_allowed=0-{cpus - 1}",
        "--cpus_allowed_policy=split", *extra,
    ])
    assert rc == 0, f"fio exit {rc}\n{res.stderr}\n{res.stdout[-3000:]}"
    assert data is not None, f"fio printed no JSON\n{res.stdout[-3000:]}"
    assert len(data["jobs"]) == jobs
    for j in data["jobs"]:
        assert j["error"] == 0, f"fio job error {j['error']}"
        # the verify pass reads back every block the job wrote
        assert j["write"]["total_ios"] > 0
        assert j["read"]["total_ios"] >= j["write"]["total_ios"]
    return data["jobs"]


@contextmanager
def loop_device(backing, *args):
    """backing attached to a kernel loop device (losetup ARGS, e.g. "-b",
    "4096"); detached afterwards."""
    losetup = need_tool("losetup")
    if not os.path.exists("/dev/loop-control"):
        run(["modprobe", "loop"], check=True)
        wait_for(lambda: os.path.exists("/dev/loop-control"), 10,
                 "/dev/loop-control")
    res = run([losetup, "--find", "--show", *args, str(backing)], timeout=60)
    assert res.returncode == 0, f"losetup: {res.stderr}"
    loop = res.stdout.strip()
    try:
        yield loop
    finally:
        res = run([losetup, "-d", loop], timeout=60)
        assert res.returncode == 0, f"losetup -d {loop}: {res.stderr}"


def delete_dead(srv, detach=False):
    """Wait for srv's device to be dead (its server gone), detach its
    pinned fast path if asked, delete it and wait for its node to go."""
    wait_for(lambda: info(srv.id)["state"] == "dead", 10, f"{srv.dev} dead")
    if detach:
        hybdctl("detach", srv.dev)
    rc, out, err = hybdctl("del", srv.dev)
    assert rc == 0, f"hybdctl del {srv.dev}: exit {rc}: {out}{err}"
    wait_for(lambda: not os.path.exists(srv.dev), 10, f"{srv.dev} to go")


# ------------------------------------------------------------------ servers

class Server:
    """A server process (ramdisk, badserver) serving one hybd device.

    Waits for its `ready /dev/hybdN` line.  .dev, .id, .proc; .stop() sends
    SIGTERM and returns the final counters (ramdisk) as a dict; .kill() sends
    SIGKILL.  Its output is collected by threads, so it can never block on a
    full pipe.
    """

    def __init__(self, cmd, ready_timeout=T_READY, pass_fds=()):
        self.cmd = [str(c) for c in cmd]
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     pass_fds=pass_fds)
        self.out, self.err = [], []
        self._ready = threading.Event()
        self.dev = None
        self.id = None
        self.counters = None
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out, True),
                             daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err, False),
                             daemon=True),
        ]
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + ready_timeout
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                break
        if not self._ready.is_set():
            # the ready line may have raced with the exit
            for t in self._threads:
                t.join(timeout=1)
        if self.dev is None:
            died = self.proc.poll()
            reap(self.proc)
            why = (f"exited with {died}" if died is not None
                   else f"not ready after {ready_timeout}s")
            pytest.fail(f"{' '.join(self.cmd)}: {why}\nstdout: {''.join(self.out)}"
                        f"stderr: {''.join(self.err)}", pytrace=False)

    def _pump(self, stream, sink, is_stdout):
        for line in stream:
            sink.append(line)
            if is_stdout and self.dev is None:
                m = re.match(r"^ready (/dev/hybd(\d+))\s*$", line)
                if m:
                    self.dev, self.id = m.group(1), int(m.group(2))
                    self._ready.set()

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def output(self):
        return f"stdout: {''.join(self.out)}stderr: {''.join(self.err)}"

    def _finish(self, timeout):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            state, stack = state_of(self.proc.pid), stack_of(self.proc.pid)
            reap(self.proc)
            pytest.fail(f"{self.cmd[0]} did not exit within {timeout}s "
                        f"(state {state}), kernel stack:\n{stack}", pytrace=False)
        for t in self._threads:
            t.join(timeout=5)
        self._close_pipes()

    def _close_pipes(self):
        """Close our ends of its stdout and stderr once their readers are
        done: a test that starts many servers must not pile up pipes."""
        for t, stream in zip(self._threads, (self.proc.stdout, self.proc.stderr)):
            if not t.is_alive():
                stream.close()

    def wait(self, timeout=T_STOP):
        """Wait for the process to exit by itself; its exit status."""
        self._finish(timeout)
        return self.proc.returncode

    def stop(self, timeout=T_STOP):
        """SIGTERM, wait; the server must delete its device and exit 0.
        Returns the `ramdisk: reads=...` counters as a dict (None for a
        server that prints none)."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        self._finish(timeout)
        assert self.proc.returncode == 0, (
            f"{self.cmd[0]} exited with {self.proc.returncode} after SIGTERM\n"
            f"{self.output()}")
        for line in self.out:
            m = COUNTERS_RE.match(line)
            if m:
                self.counters = dict(zip(COUNTER_NAMES, map(int, m.groups())))
        return self.counters

    def kill(self, timeout=T_STOP):
        """SIGKILL, wait (bounded)."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self._finish(timeout)

    def cleanup(self):
        """Teardown: make sure the process is gone; never raises."""
        reap(self.proc)
        for t in self._threads:
            t.join(timeout=1)
        self._close_pipes()


class RamdiskMemory:
    """The bytes of a ramdisk as its server holds them, read from the
    server's memory (/proc/PID/mem): data that neither the page cache nor
    the device served, e.g. to check that a write really reached the
    server.

    Finding the disk's memory writes a marker block at offset 0 with
    O_DIRECT (so do it before writing there): the disk is the anonymous
    writable mapping that starts with the marker, within its first page.
    """

    def __init__(self, srv, size):
        self.pid = srv.pid
        marker = pattern(f"ramdisk-memory-{srv.pid}", 4096)
        direct_write(srv.dev, 0, marker)
        found = []
        with open(f"/proc/{self.pid}/maps", encoding="utf-8") as maps, \
                open(f"/proc/{self.pid}/mem", "rb", buffering=0) as mem:
            for line in maps:
                f = line.split()
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                if not f[1].startswith("rw") or len(f) > 5 or hi - lo < size:
                    continue
                mem.seek(lo)
                head = mem.read(2 * 4096)
                at = head.find(marker)
                if at >= 0:
                    found.append(lo + at)
        assert len(found) == 1, (
            f"the ramdisk's memory: {len(found)} mappings start with the marker")
        self.base = found[0]
        self.size = size

    def read(self, offset, length):
        assert 0 <= offset and offset + length <= self.size
        with open(f"/proc/{self.pid}/mem", "rb", buffering=0) as mem:
            mem.seek(self.base + offset)
            return mem.read(length)


def ramdisk_args(opts):
    """Keyword options to ramdisk flags: size="64M" -> --size 64M,
    no_write_cache=True -> --no-write-cache, None/False -> omitted."""
    args = []
    for key, val in opts.items():
        flag = "--" + key.replace("_", "-")
        if val is None or val is False:
            continue
        if val is True:
            args.append(flag)
        else:
            args += [flag, str(val)]
    return args
