# SPDX-License-Identifier: GPL-2.0
"""A server that dies (SIGKILL) must not take anything with it: its
in-flight and later requests fail with EIO within seconds, the device turns
dead and can be deleted, and other devices carry on."""

import errno
import os
import subprocess
import time

import pytest

from hybdlib import (T_IO, stack_of, state_of, assert_data, del_device,
                     device_ids, direct_read, direct_write, hybdctl, info,
                     io_errno, need_tool, pattern, reap, run, wait_for)

MiB = 1 << 20
# after the kill, in-flight I/O must fail within this (TCG is slow, but an
# error needs no server)
FAIL_WITHIN = 20

# ext4 and the page cache report the errors they see; that is expected
IO_ERRORS = (r"I/O error|Buffer I/O|EXT4-fs|JBD2|lost (async )?page write|"
             r"Aborting journal|Remounting filesystem|writeback error")


def read_errno(dev, offset=0, length=4096):
    """(errno or 0, seconds) of one O_DIRECT read."""
    t0 = time.monotonic()
    e = io_errno(direct_read, dev, offset, length)
    return e, time.monotonic() - t0


def start_fio(dev, runtime=120, extra=()):
    exe = need_tool("fio")
    return subprocess.Popen(
        [exe, "--name=load", f"--filename={dev}", "--direct=1",
         "--ioengine=libaio", "--iodepth=16", "--numjobs=2", "--rw=randrw",
         "--bs=4k", "--size=16M", "--time_based", f"--runtime={runtime}",
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")


def wait_exit(proc, timeout):
    """The process's exit status, or fail showing where it is stuck."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        state, stack = state_of(proc.pid), stack_of(proc.pid)
        reap(proc)
        pytest.fail(f"still running {timeout}s after the server died "
                    f"(state {state}), kernel stack:\n{stack}", pytrace=False)
    return proc.returncode


def test_kill_under_load_fails_inflight_io_and_leaves_a_dead_deletable_device(
        ramdisk, spawned):
    survivor = ramdisk(size="32M")
    keep = pattern("survivor", 4 * MiB)
    direct_write(survivor.dev, 0, keep)

    victim = ramdisk(size="32M")
    load = start_fio(victim.dev)
    spawned.append(load)
    # a verifying job on the survivor runs through the kill
    exe = need_tool("fio")
    other = subprocess.Popen(
        [exe, "--name=other", f"--filename={survivor.dev}", "--direct=1",
         "--ioengine=libaio", "--iodepth=8", "--rw=randrw", "--bs=4k",
         f"--offset={8 * MiB}", "--size=4M", "--time_based", "--runtime=15",
         "--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    spawned.append(other)

    wait_for(lambda: info(victim.dev)["stats"]["slow_done"] > 200, 60,
             "fio's I/O to flow")
    assert load.poll() is None, f"fio ended early: {load.communicate()}"

    victim.kill()
    t0 = time.monotonic()
    rc = wait_exit(load, FAIL_WITHIN)
    took = time.monotonic() - t0
    out, err = load.communicate()
    assert rc != 0, f"fio succeeded although its server died\n{out[-2000:]}"
    assert took < FAIL_WITHIN

    i = info(victim.id)
    assert i["state"] == "dead"
    assert i["server_pid"] == 0
    assert i["stats"]["failed_dead"] > 0, i["stats"]

    # later I/O fails at once, without a server to ask
    e, took = read_errno(victim.dev, 8192)
    assert e == errno.EIO, f"read on a dead device: {errno.errorcode.get(e, e)}"
    assert took < 5, f"the failing read took {took:.1f}s"

    rc, _, err = del_device(victim.id)
    assert rc == 0, err
    wait_for(lambda: not os.path.exists(victim.dev), 10,
             f"{victim.dev} to disappear")
    assert victim.id not in device_ids()

    assert wait_exit(other, T_IO) == 0, other.communicate()
    assert_data(survivor.dev, 0, keep, "survivor after the other's death")
    assert info(survivor.dev)["state"] == "live"


def test_kill_when_idle_makes_the_device_dead(ramdisk):
    srv = ramdisk(size="16M")
    direct_write(srv.dev, 0, pattern("idle", MiB))
    srv.kill()
    wait_for(lambda: info(srv.id)["state"] == "dead", 10, "state dead")
    e, took = read_errno(srv.dev)
    assert e == errno.EIO, errno.errorcode.get(e, e)
    assert took < 5
    assert info(srv.id)["stats"]["failed_dead"] > 0
    rc, _, err = hybdctl("del", srv.dev)
    assert rc == 0, err
    assert srv.id not in device_ids()


@pytest.mark.kmsg_allow(IO_ERRORS)
def test_kill_under_mounted_ext4_lets_sync_and_umount_finish(ramdisk, tmp_path):
    mkfs = need_tool("mkfs.ext4")
    srv = ramdisk(size="64M")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run([mkfs, "-F", "-q", srv.dev], timeout=T_IO, check=True)
    run(["mount", "-t", "ext4", srv.dev, mnt], timeout=T_IO, check=True)
    try:
        (mnt / "before").write_bytes(pattern("fs", MiB))
        run(["sync"], timeout=T_IO, check=True)
        # dirty data in the page cache when the server goes
        (mnt / "after").write_bytes(pattern("fs2", 4 * MiB))
        srv.kill()
        # both may report errors; neither may hang
        run(["sync"], timeout=FAIL_WITHIN * 3)
    finally:
        res = run(["umount", mnt], timeout=FAIL_WITHIN * 3)
        if res.returncode != 0:
            run(["umount", "-l", mnt], timeout=FAIL_WITHIN)
    assert res.returncode == 0, f"umount: {res.stderr}"
    assert info(srv.id)["state"] == "dead"
    rc, _, err = del_device(srv.id)
    assert rc == 0, err
