# SPDX-License-Identifier: GPL-2.0
"""Fixtures for hybd's suite.  It runs as root inside the guest that
tools/vm-run boots, with kmod/hybd.ko loaded.

- every test fails if the kernel logged a splat while it ran (klog.py),
  or if records of the log were lost before the check read them;
  @pytest.mark.kmsg_allow(regex, ...) exempts lines a test expects;
- every test fails if it left a device, a server, a BPF link or pin, or a
  mount behind (leaks.py), which is then taken away;
- ramdisk(**opts) / badserver(mode) start servers and always clean up;
- hybdctl(*args) -> (rc, stdout, stderr), info(dev) -> dict.
"""

import os
import shutil
import signal
import stat
from pathlib import Path

import pytest

import hybd_uapi as uapi
import hybdlib
import klog
import leaks
from hybdlib import (BADSERVER, CONTROL, RAMDISK, Server, need_built,
                     ramdisk_args, reap)


@pytest.fixture(scope="session", autouse=True)
def _root_and_module():
    if os.geteuid() != 0:
        pytest.exit("the suite runs as root in the guest: tools/vm-run tests",
                    returncode=4)
    if not os.path.exists(CONTROL):
        pytest.fail(f"{CONTROL} missing: the hybd module is not loaded "
                    f"(tools/vm-run tests loads {hybdlib.KMOD})", pytrace=False)


# Every test is bounded, also those that forget a timeout somewhere;
# @pytest.mark.time_limit(seconds) changes the bound.
TEST_TIME_LIMIT = 600


class TimeLimitExceeded(Exception):
    pass


def _children_report():
    """Our child processes with their state and kernel stack."""
    out = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            out.append(f"pid {pid} ({hybdlib.state_of(pid)}): "
                       f"{cmd.decode(errors='replace')}\n{hybdlib.stack_of(pid)}")
    return "\n".join(out) or "(no child processes)"


@pytest.fixture(autouse=True)
def tmp_path_freed(request):
    """A test's tmp_path goes with the test.  pytest keeps every test's
    directory until the session ends, and the guest's /tmp is a tmpfs in
    its memory: the files a run's tests write (disk images filled by fio)
    added up until the debug kernel's guest, with less memory to spare,
    ran out of space for the later tests.  Torn down last (autouse, set up
    first), after the test's own fixtures let go of its files."""
    yield
    # the value the test got, if it asked for one (funcargs: no fixture
    # is requested here, where tmp_path is finalized already)
    path = request.node.funcargs.get("tmp_path")
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def time_limit(request):
    """SIGALRM after the test's time limit: the test fails wherever it
    waits (unless it is stuck in the kernel itself)."""
    mark = request.node.get_closest_marker("time_limit")
    limit = mark.args[0] if mark else TEST_TIME_LIMIT

    def expired(signum, frame):
        raise TimeLimitExceeded(f"test still running after its {limit}s limit; "
                            f"children:\n{_children_report()}")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(autouse=True)
def kernel_log(request):
    """Fails the test if the kernel logged a BUG, WARNING, Oops, hung task,
    lockup, RCU stall... while it (and its fixtures) ran."""
    try:
        kmsg = klog.Kmsg()
    except OSError as e:
        pytest.fail(f"cannot open /dev/kmsg: {e}", pytrace=False)
    yield kmsg
    lines = kmsg.read_new()
    kmsg.close()
    if kmsg.lost:
        pytest.fail(f"{kmsg.lost} kernel log records were overwritten before "
                    f"this test's check read them: the check is incomplete",
                    pytrace=False)
    allow = []
    for mark in request.node.iter_markers("kmsg_allow"):
        allow += mark.args
    bad = klog.bad_lines(lines, allow)
    allowed = [l for l in klog.bad_lines(lines) if l not in bad]
    if allowed and os.environ.get("HYBD_RESULTS"):
        # so that the runner's scan of the whole log does not count them
        with open(os.path.join(os.environ["HYBD_RESULTS"], "kmsg-allowed.txt"),
                  "a", encoding="utf-8") as f:
            f.writelines(l + "\n" for l in allowed)
    if bad:
        pytest.fail("kernel log during this test:\n  " + "\n  ".join(bad),
                    pytrace=False)


@pytest.fixture(autouse=True)
def leaks_checked(time_limit, kernel_log):
    """Fails the test if it left a hybd device, a server process (or any
    process holding a /dev/hybd* node), a BPF pin, struct_ops map or link,
    or a mount of a hybd device behind, after its own fixtures' teardown;
    then takes it away, so that one leak does not fail the next tests.
    (It uses time_limit and kernel_log so that its teardown runs before
    theirs: bounded, and inside the window of the kernel log check.)"""
    before = leaks.snapshot()
    yield
    left = leaks.settled(before)
    if not left:
        return
    stuck = leaks.cleanup(before, left)
    msg = "the test left behind:\n  " + leaks.describe(left)
    if stuck:
        msg += "\nand the cleanup failed: " + "; ".join(stuck)
    pytest.fail(msg, pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _kernel_release(record_testsuite_property):
    """The guest kernel's release in junit.xml, for tools/suite-verdict
    (which skips are expected depends on it)."""
    record_testsuite_property("kernel", os.uname().release)


def pytest_deselected(items):
    """Deselected tests (-k, -m, --deselect) by node id, in the results
    directory, for tools/suite-verdict: junit.xml does not list them."""
    results = os.environ.get("HYBD_RESULTS")
    if results:
        with open(os.path.join(results, "deselected.txt"), "a",
                  encoding="utf-8") as f:
            f.writelines(item.nodeid + "\n" for item in items)


@pytest.fixture
def hybdctl():
    """hybdctl(*args) -> (rc, stdout, stderr)."""
    return hybdlib.hybdctl


@pytest.fixture
def info():
    """info(dev) -> hybdctl info DEV --json, parsed."""
    return hybdlib.info


class _Servers:
    """Starts servers for one test; at teardown kills what is left and
    deletes every device they created."""

    def __init__(self):
        self.servers = []

    def start(self, cmd, **kw):
        srv = Server(cmd, **kw)
        self.servers.append(srv)
        return srv

    def cleanup(self):
        stuck = []
        for srv in self.servers:
            srv.cleanup()
            if srv.alive():
                stuck.append(f"{srv.cmd[0]} (pid {srv.pid}) would not die")
        # usually gone already (ENODEV); a dead device is deleted here
        _delete_quietly(srv.id for srv in self.servers if srv.id is not None)
        return stuck


def _delete_quietly(ids):
    """Delete devices with HYBD_CTL_DEL directly (teardown must not depend
    on the CLI), ignoring those already gone."""
    if not os.path.exists(CONTROL):
        return
    with uapi.Control() as ctl:
        for dev_id in ids:
            uapi.delete(ctl, dev_id)


@pytest.fixture
def servers():
    s = _Servers()
    yield s
    stuck = s.cleanup()
    if stuck:
        pytest.fail("; ".join(stuck), pytrace=False)


@pytest.fixture
def ramdisk(servers):
    """ramdisk(**opts) starts examples/ramdisk/ramdisk with those options
    (size="64M", queues=2, no_write_cache=True, ...) and returns a Server
    once it printed `ready /dev/hybdN`."""
    def start(**opts):
        need_built(RAMDISK, "examples/ramdisk/ramdisk")
        opts.setdefault("size", "64M")
        return servers.start([RAMDISK, *ramdisk_args(opts)])
    return start


@pytest.fixture
def open_control():
    """The administrator lets everyone open the control node (for
    unprivileged devices); its mode is put back afterwards."""
    mode = os.stat(CONTROL).st_mode
    os.chmod(CONTROL, 0o666)
    yield
    os.chmod(CONTROL, stat.S_IMODE(mode))


@pytest.fixture
def badserver(servers):
    """badserver(mode, *args) starts tests/helpers/badserver MODE ARGS."""
    def start(mode, *args):
        need_built(BADSERVER, "tests/helpers/badserver")
        return servers.start([BADSERVER, mode, *args])
    return start


@pytest.fixture
def added_devices():
    """Devices made with `hybdctl add` in a test: append their ids; they are
    deleted at teardown."""
    ids = []
    yield ids
    _delete_quietly(ids)


@pytest.fixture
def spawned():
    """Processes a test starts with subprocess.Popen: append them; they are
    killed (bounded) at teardown."""
    procs = []
    yield procs
    for p in procs:
        reap(p)
