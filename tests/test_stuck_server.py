# SPDX-License-Identifier: GPL-2.0
"""A stuck or dying server never hangs the machine.

- a request the server does not complete within the device's I/O timeout
  fails with EIO and is counted; its late completion is rejected;
- `del` returns within a bounded time whatever the server does: the I/O
  timeout ends a stuck drain, `--force` fails outstanding I/O at once, and
  the waiting `hybdctl del` can be killed (the delete goes on);
- a server killed while its own delete drains dirty data exits;
- a server whose child keeps the server node open is still seen to die;
- deletes racing with fio on two queues at QD32, whatever the server's
  state (serving, stopped, dead, waiting for recovery, under a mount),
  return and leave nothing behind.

Tests that leave a task blocked arm the hung-task detector at a short
interval, so that a task stuck in the kernel fails them.
"""

import errno
import fcntl
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from hybdlib import (HYBDCTL, LONG, T_STOP, add_device, device_ids, list_devices,
                     direct_read, direct_write, free_id, hybdctl, info,
                     io_errno, io_uring_usable, need_tool, pattern, reap,
                     stack_of, state_of, variants, wait_for)

MiB = 1 << 20
HUNG_TASK_SECS = 5
# what a bounded wait may take under TCG, with margin
BOUND = 30
# HYBD_SRV_START = _IO(0xb7, 0x41)
SRV_START = 0xB741

# the block layer logs the I/O errors these tests cause on purpose
IO_ERRORS = (r"I/O error|Buffer I/O|lost (async )?page write|"
             r"writeback error")


@pytest.fixture
def short_hung_task(request):
    """kernel.hung_task_timeout_secs = 5 for the test (or what its
    hung_task_secs mark says): any task blocked in D state that long is
    reported (and the kernel-log check fails it)."""
    mark = request.node.get_closest_marker("hung_task_secs")
    path = Path("/proc/sys/kernel/hung_task_timeout_secs")
    old = path.read_text().strip()
    path.write_text(str(mark.args[0] if mark else HUNG_TASK_SECS))
    yield
    path.write_text(old)


def start_reader(dev, offset=0):
    """One 4 KiB O_DIRECT read in a child process (dd)."""
    return subprocess.Popen(
        ["dd", f"if={dev}", "of=/dev/null", "bs=4096", "count=1",
         f"skip={offset // 4096}", "iflag=direct", "status=none"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_exit(proc, timeout, what):
    """proc's exit status; fail, showing where it is stuck, after timeout."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        state, stack = state_of(proc.pid), stack_of(proc.pid)
        reap(proc)
        pytest.fail(f"{what} still running after {timeout}s (state {state}), "
                    f"kernel stack:\n{stack}", pytrace=False)


def assert_reader_failed(reader, what):
    rc = wait_exit(reader, BOUND, what)
    _, err = reader.communicate()
    assert rc != 0 and "Input/output error" in err, (rc, err)


def blocked_in_kernel(proc):
    """True once proc sleeps (S or D) rather than runs."""
    return state_of(proc.pid)[:1] in ("S", "D")


def thread_states(pid):
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("State:"):
                    states.append(line.split()[1])
        except OSError:
            pass
    return states


def stop_server(srv):
    """SIGSTOP; wait until its workers are stopped (a thread waiting in a
    killable sleep in the kernel, e.g. in HYBD_CTL_DEL, stays there)."""
    os.kill(srv.pid, signal.SIGSTOP)
    wait_for(lambda: "T" in thread_states(srv.pid) and
             "R" not in thread_states(srv.pid), 10, "server stopped")


def resume_and_reap(srv):
    """SIGCONT a stopped server whose device is gone: it must exit."""
    os.kill(srv.pid, signal.SIGCONT)
    srv.wait(T_STOP)


def outstanding_read(srv):
    reader = start_reader(srv.dev)
    wait_for(lambda: info(srv.dev)["stats"]["slow_issued"] >
             info(srv.dev)["stats"]["slow_done"], 10, "the read to reach the ring")
    assert reader.poll() is None, reader.communicate()
    return reader


# ----------------------------------------------------------- I/O timeout

@pytest.mark.kmsg_allow(IO_ERRORS)
def test_late_server_request_times_out_and_its_completion_is_rejected(badserver):
    srv = badserver("late", "--io-timeout", "1")
    assert info(srv.dev)["io_timeout"] == 1
    t0 = time.monotonic()
    e = io_errno(direct_read, srv.dev, 0, 4096)
    took = time.monotonic() - t0
    assert e == errno.EIO, errno.errorcode.get(e, e)
    assert took < BOUND, f"the timed-out read took {took:.1f}s"

    # the server answers 3 s late: rejected, never applied to anything
    def rejected():
        s = info(srv.dev)["stats"]
        return s["rej_not_outstanding"] + s["rej_stale_seq"] >= 1 and s
    s = wait_for(rejected, BOUND, "the late completion to be rejected")
    assert s["timed_out"] >= 1, s
    assert s["slow_errors"] >= 1, s
    assert info(srv.dev)["state"] == "live"
    srv.stop()


@pytest.mark.kmsg_allow(IO_ERRORS)
# the delete's worker waits for the 8 s I/O timeout: legitimately blocked
# that long, not hung
@pytest.mark.hung_task_secs(15)
def test_del_of_a_stopped_server_ends_with_the_io_timeout(ramdisk,
                                                          short_hung_task):
    # 8 s: the read must still be outstanding when the delete starts,
    # after a few hybdctl calls that take seconds in the debug kernel
    srv = ramdisk(size="16M", io_timeout=8)
    direct_write(srv.dev, 0, pattern("stuck", MiB))
    stop_server(srv)
    reader = outstanding_read(srv)

    t0 = time.monotonic()
    rc, _, err = hybdctl("del", "--in-use", srv.dev, timeout=BOUND * 2)
    took = time.monotonic() - t0
    assert rc == 0, err
    assert took < BOUND, f"del took {took:.1f}s with an 8 s I/O timeout"
    assert srv.id not in device_ids()
    assert_reader_failed(reader, "the read of the stopped server")
    resume_and_reap(srv)


@pytest.mark.kmsg_allow(IO_ERRORS)
def test_del_force_fails_the_io_of_a_stopped_server_at_once(ramdisk,
                                                            short_hung_task):
    srv = ramdisk(size="16M", io_timeout=0)
    assert info(srv.dev)["io_timeout"] == 0
    stop_server(srv)
    reader = outstanding_read(srv)

    t0 = time.monotonic()
    rc, _, err = hybdctl("del", "--force", srv.dev, timeout=BOUND * 2)
    took = time.monotonic() - t0
    assert rc == 0, err
    assert took < 15, f"del --force took {took:.1f}s"
    assert srv.id not in device_ids()
    assert_reader_failed(reader, "the read of the stopped server")
    resume_and_reap(srv)


@pytest.mark.kmsg_allow(IO_ERRORS)
def test_waiting_del_is_killable_and_a_forced_del_ends_the_delete(ramdisk):
    srv = ramdisk(size="16M", io_timeout=0)
    stop_server(srv)
    reader = outstanding_read(srv)

    waiting = subprocess.Popen([str(HYBDCTL), "del", "--in-use", srv.dev],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    wait_for(lambda: info(srv.id)["state"] == "deleting", 10, "state deleting")
    time.sleep(2)
    assert waiting.poll() is None, "del returned while the server held I/O"
    # list and info answer while the delete waits
    rc, out, err = hybdctl("list", "--json", timeout=10)
    assert rc == 0 and f'"id":{srv.id}' in out.replace(" ", ""), (out, err)

    waiting.kill()
    wait_exit(waiting, 10, "the killed hybdctl del")
    assert info(srv.id)["state"] == "deleting"

    rc, _, err = hybdctl("del", "--force", str(srv.id), timeout=BOUND * 2)
    assert rc == 0, err
    assert srv.id not in device_ids()
    assert_reader_failed(reader, "the read of the stopped server")
    resume_and_reap(srv)


# ------------------------------------------------------- a dying server

def state_or_gone(dev_id):
    """The device's state, or None once it is gone."""
    for d in list_devices():
        if d["id"] == dev_id:
            return d["state"]
    return None


@pytest.mark.kmsg_allow(IO_ERRORS)
def test_server_killed_while_its_own_delete_drains_dirty_data(badserver,
                                                              short_hung_task):
    """The review's reproducer: a server deletes its device on SIGTERM (as
    the ramdisk does); killed while del_gendisk() waits for its writes, it
    must still exit, and the delete must finish.  The server answers 3 s
    late and the device has no I/O timeout: only its death can end this."""
    srv = badserver("late", "--io-timeout", "0")
    # dirty pages, kept dirty: the last close would write them back
    fd = os.open(srv.dev, os.O_WRONLY)
    try:
        os.pwrite(fd, pattern("dirty", 4 * MiB), 0)

        os.kill(srv.pid, signal.SIGTERM)
        wait_for(lambda: state_or_gone(srv.id) != "live", 10,
                 "the delete to start")
        time.sleep(1)
        # the drain must still be under way, or this proves nothing
        assert state_or_gone(srv.id) == "deleting"
        os.kill(srv.pid, signal.SIGKILL)

        rc = wait_exit(srv.proc, BOUND, "the killed server")
        assert rc == -signal.SIGKILL
        wait_for(lambda: state_or_gone(srv.id) is None, BOUND,
                 "the device to be deleted")
    finally:
        os.close(fd)


@pytest.mark.kmsg_allow(IO_ERRORS)
def test_a_child_holding_the_server_node_does_not_keep_a_dead_server_alive(
        badserver, spawned):
    srv = badserver("fork-child", "--io-timeout", "0")
    m = wait_for(lambda: next((re.match(r"child (\d+)", l) for l in srv.out
                               if l.startswith("child ")), None), 10,
                 "the child's pid")
    child = int(m.group(1))
    try:
        # the child has the descriptor but not the rings (VM_DONTCOPY)
        fds = [os.readlink(f"/proc/{child}/fd/{f}")
               for f in os.listdir(f"/proc/{child}/fd")]
        assert any(re.search(r"hybd\d+-srv", f) for f in fds), fds
        maps = Path(f"/proc/{child}/maps").read_text()
        assert not re.search(r"hybd\d+-srv", maps), maps

        data = pattern("child", 64 << 10)
        direct_write(srv.dev, 0, data)
        assert direct_read(srv.dev, 0, len(data)) == data

        srv.kill()
        reader = start_reader(srv.dev)
        spawned.append(reader)
        assert_reader_failed(reader, "a read after the server's death")
        assert info(srv.id)["state"] == "dead"
    finally:
        os.kill(child, signal.SIGKILL)
    rc, _, err = hybdctl("del", str(srv.id))
    assert rc == 0, err


# ---------------------------------------------------------------- races

DELETE_ROUNDS = 20 if LONG else 2
FS_ERRORS = (r"|EXT4-fs|JBD2|Aborting journal|Remounting filesystem|"
             r"shut ?down")


@pytest.mark.time_limit(3600 if LONG else 900)
@pytest.mark.kmsg_allow(IO_ERRORS + FS_ERRORS)
@pytest.mark.parametrize("how,engine", variants(
    [pytest.param(h, e, id=f"{h}-{e}")
     for h in ("served", "stalled", "dead", "waiting", "mounted")
     for e in ("libaio", "io_uring")],
    # each server state once, both engines (test-long: every pair)
    ["served-io_uring", "stalled-libaio", "dead-io_uring", "waiting-libaio",
     "mounted-io_uring"]))
def test_delete_under_fio_on_two_queues_at_qd32(ramdisk, tmp_path, how,
                                                engine):
    """Delete a device while fio runs on it (2 jobs, 2 queues, QD32) in
    every state its server can be in: serving, stopped (SIGSTOP), dead,
    dead with recovery (I/O held for a new server), and under a mounted
    file system.  The delete returns, fio gets errors and exits, the id
    is free again (and reused by the next round)."""
    if engine == "io_uring" and not io_uring_usable():
        pytest.skip("io_uring is not usable here")
    exe = need_tool("fio")
    mkfs = need_tool("mkfs.ext4") if how == "mounted" else None
    dev_id = free_id()
    rng = random.Random(6)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for i in range(DELETE_ROUNDS):
        srv = ramdisk(size="64M", queues=2, depth=32, id=dev_id,
                      io_timeout=5, recovery=60 if how == "waiting" else None)
        assert srv.id == dev_id
        target, size = srv.dev, "32M"
        if how == "mounted":
            subprocess.run([mkfs, "-F", "-q", srv.dev], check=True,
                           timeout=300)
            subprocess.run(["mount", "-t", "ext4", srv.dev, mnt], check=True,
                           timeout=120)
            target, size = mnt / "fio.dat", "16M"
        load = subprocess.Popen(
            [exe, "--name=race", f"--filename={target}", "--direct=1",
             f"--ioengine={engine}", "--iodepth=32", "--numjobs=2",
             "--rw=randrw", "--bs=4k", f"--size={size}", "--time_based",
             "--runtime=120", "--group_reporting"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd="/tmp")
        try:
            wait_for(lambda: info(dev_id)["stats"]["slow_done"] > 64, 60,
                     "fio's I/O to flow")
            time.sleep(rng.uniform(0, 0.5))
            if how == "stalled":
                stop_server(srv)
            elif how in ("dead", "waiting"):
                srv.kill()
                want = "dead" if how == "dead" else "waiting"
                wait_for(lambda: info(dev_id)["state"] == want, BOUND, want)
            t0 = time.monotonic()
            rc, _, err = hybdctl("del", "--in-use", str(dev_id),
                                 timeout=BOUND * 2)
            took = time.monotonic() - t0
            assert rc == 0, f"round {i}: {err}"
            assert took < BOUND, f"round {i}: del took {took:.1f}s"
            wait_exit(load, BOUND, f"round {i}: fio after the delete")
            assert load.returncode != 0, f"round {i}: fio saw no error"
        finally:
            reap(load)
            if how == "mounted":
                res = subprocess.run(["umount", mnt], capture_output=True,
                                     text=True, timeout=120)
                if res.returncode:
                    subprocess.run(["umount", "-l", mnt], timeout=60)
        if how == "stalled":
            resume_and_reap(srv)
        else:
            srv.wait(T_STOP)
        assert dev_id not in device_ids(), f"round {i}"


# ----------------------------------------------------- review, kmod side

def test_queue_count_is_what_blk_mq_gives(ramdisk):
    """blk-mq gives at most one hardware queue per CPU: the device, its
    rings and `info` say how many it really has (review finding 9)."""
    cpus = os.cpu_count()
    srv = ramdisk(size="16M", queues=cpus + 6)
    i = info(srv.dev)
    assert i["nr_hw_queues"] == cpus, i
    name = os.path.basename(srv.dev)
    assert len(list(Path(f"/sys/block/{name}/mq").iterdir())) == cpus
    data = pattern("queues", MiB)
    direct_write(srv.dev, 0, data)
    assert direct_read(srv.dev, 0, MiB) == data
    srv.stop()


def test_server_pid_is_shown_in_the_callers_pid_namespace(ramdisk):
    """A server outside the caller's pid namespace is not shown by a pid
    that means something else there (review finding 11)."""
    unshare = need_tool("unshare")
    srv = ramdisk(size="16M")
    assert info(srv.dev)["server_pid"] == srv.pid
    res = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc",
         str(HYBDCTL), "info",
         srv.dev, "--json"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert re.search(r'"server_pid":\s*0\b', res.stdout), res.stdout
    srv.stop()


@pytest.mark.kmsg_allow(IO_ERRORS)
@pytest.mark.parametrize("mode,want", [
    ("eagain", errno.EIO),
    ("enomem", errno.EIO),
    ("enospc", errno.ENOSPC),
    ("eopnotsupp", errno.EOPNOTSUPP),
])
def test_server_errnos_reach_the_reader_as_documented(badserver, mode, want):
    """-EAGAIN and -ENOMEM mean retry-later inside the block layer; from a
    server they are I/O errors (review finding 11)."""
    srv = badserver(mode)
    e = io_errno(direct_read, srv.dev, 0, 4096)
    assert e == want, f"{mode}: got {errno.errorcode.get(e, e)}"
    srv.stop()



@pytest.mark.kmsg_allow(IO_ERRORS + r"|EXT4-fs|JBD2|Aborting journal|"
                        r"Remounting filesystem|shut ?down")
def test_del_of_a_device_with_a_mounted_file_system_returns(ramdisk, tmp_path):
    """Deleting a device under a mounted file system writes back what the
    server can still take, shuts the file system down and returns; the
    mount can then be unmounted."""
    mkfs = need_tool("mkfs.ext4")
    srv = ramdisk(size="64M", io_timeout=5)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run([mkfs, "-F", "-q", srv.dev], check=True, timeout=300)
    subprocess.run(["mount", "-t", "ext4", srv.dev, mnt], check=True,
                   timeout=120)
    try:
        (mnt / "file").write_bytes(pattern("mounted", 4 * MiB))
        t0 = time.monotonic()
        rc, _, err = hybdctl("del", "--in-use", srv.dev, timeout=BOUND * 2)
        took = time.monotonic() - t0
        assert rc == 0, err
        assert took < BOUND, f"del under a mount took {took:.1f}s"
        assert srv.id not in device_ids()
        srv.wait(T_STOP)
        assert "deleted underneath us" in "".join(srv.err), srv.output()
    finally:
        res = subprocess.run(["umount", mnt], capture_output=True, text=True,
                             timeout=120)
        if res.returncode:
            subprocess.run(["umount", "-l", mnt], timeout=60)
    assert res.returncode == 0, res.stderr


@pytest.mark.kmsg_allow(IO_ERRORS)
def test_del_of_a_stopped_server_is_one_timeout_not_one_per_wave(
        ramdisk, short_hung_task):
    """A delete writes back what the block layer holds: with a stopped
    server every wave of queue-depth requests would wait a full timeout.
    The first timeout of a deleting device fails everything instead."""
    srv = ramdisk(size="16M", io_timeout=2, depth=4, max_io="4K")
    fd = os.open(srv.dev, os.O_WRONLY)
    try:
        os.pwrite(fd, pattern("waves", MiB), 0)	# 256 requests of 4 KiB
        stop_server(srv)
        t0 = time.monotonic()
        rc, _, err = hybdctl("del", "--in-use", srv.dev, timeout=BOUND * 4)
        took = time.monotonic() - t0
    finally:
        os.close(fd)
    assert rc == 0, err
    assert took < BOUND, f"del took {took:.1f}s for 64 waves of 2 s timeouts"
    assert srv.id not in device_ids()
    resume_and_reap(srv)


@pytest.mark.kmsg_allow(IO_ERRORS)
def test_del_while_start_scans_partitions_with_nobody_serving(added_devices):
    """HYBD_SRV_START waits for add_disk()'s partition scan, which nobody
    serves here; a delete then waits for the start (and, under lockdep,
    once reported recursive locking on the module's workqueue), and a
    forced delete ends both."""
    dev_id = add_device("--size", "16M", "--io-timeout", "0")
    added_devices.append(dev_id)
    fd = os.open(f"/dev/hybd{dev_id}-srv", os.O_RDWR)
    result = {}

    def start():
        try:
            fcntl.ioctl(fd, SRV_START)
            result["start"] = 0
        except OSError as e:
            result["start"] = e.errno

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    try:
        time.sleep(2)
        assert starter.is_alive(), f"START returned unserved: {result}"
        waiting = subprocess.Popen([str(HYBDCTL), "del", str(dev_id)],
                                   stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        wait_for(lambda: state_or_gone(dev_id) == "deleting", 10,
                 "state deleting")
        time.sleep(1)
        assert waiting.poll() is None
        rc, _, err = hybdctl("del", "--force", str(dev_id), timeout=BOUND)
        assert rc == 0, err
        assert wait_exit(waiting, BOUND, "the first del") == 0
        starter.join(BOUND)
        assert not starter.is_alive(), "START still waiting after the delete"
        assert result["start"] in (errno.ENODEV, errno.EIO), result
        assert state_or_gone(dev_id) is None
    finally:
        os.close(fd)
