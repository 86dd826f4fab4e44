# SPDX-License-Identifier: GPL-2.0
"""Unprivileged devices (HYBD_DEV_F_UNPRIVILEGED): a user without any
capability, given access to /dev/hybd-control by the administrator,
creates, serves, uses and deletes a device of their own, and nothing else.

The users are bare uids (no passwd entry is needed): USER owns the
devices, OTHER tries to touch them.  The administrator's part (the control
node's mode, the udev rule that gives the user the block device's node)
is done here by hand.
"""
import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import hybd_uapi as uapi
from hybdlib import (BADSERVER, HYBDCTL, LOOP, RAMDISK, REPO, T_IO,
                     as_user, device_ids, need_built, pattern, run, wait_for)

USER = 4242
OTHER = 4343
MiB = 1 << 20
PARAMS = Path("/sys/module/hybd/parameters")


@pytest.fixture
def user_dir():
    d = tempfile.mkdtemp(prefix="hybd-user-")
    os.chown(d, USER, USER)
    yield Path(d)
    run(["rm", "-rf", d])


def give_disk(dev):
    """What the udev rule does: the owner from sysfs gets the node."""
    name = os.path.basename(dev)
    uid = Path(f"/sys/block/{name}/hybd/owner_uid").read_text().strip()
    gid = Path(f"/sys/block/{name}/hybd/owner_gid").read_text().strip()
    os.chown(dev, int(uid), int(gid))
    return int(uid), int(gid)


def hybdctl_as(uid, *args):
    res = run(as_user(uid, [HYBDCTL, *args]))
    return res.returncode, res.stdout, res.stderr


def raw_as(uid, code):
    """Python code run as uid with hybd_uapi imported as u; its stdout."""
    prog = (f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r})\n"
            "import errno, os, hybd_uapi as u\n" + code)
    res = run(as_user(uid, [sys.executable, "-c", prog]))
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_user_creates_serves_uses_and_deletes(servers, open_control,
                                              user_dir):
    need_built(RAMDISK, "examples/ramdisk/ramdisk")
    srv = servers.start(as_user(USER, [RAMDISK, "--size", "32M",
                                       "--queues", "2"]))
    srv_node = Path(f"/dev/hybd{srv.id}-srv")
    st = os.stat(srv_node)
    # the kernel makes it 0600; a udev's rules may add the owner's group
    assert (st.st_uid, st.st_gid) == (USER, USER)
    assert stat.S_IMODE(st.st_mode) & 0o007 == 0, oct(st.st_mode)
    assert give_disk(srv.dev) == (USER, USER)
    rc, out, err = hybdctl_as(USER, "info", srv.dev, "--json")
    assert rc == 0, err
    info = json.loads(out)
    assert (info["owner_uid"], info["owner_gid"]) == (USER, USER)

    # the user's own I/O, verified
    res = run(as_user(USER, [
        "fio", "--name=v", f"--filename={srv.dev}", "--direct=1",
        "--ioengine=libaio", "--iodepth=16", "--rw=randrw", "--bs=4k",
        "--size=16M", "--verify=crc32c", "--verify_fatal=1",
        "--do_verify=1"]), timeout=T_IO, cwd=user_dir)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr

    # no partition table is read from a user's content
    mbr = bytearray(512)
    mbr[446:462] = bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + \
        (2048).to_bytes(4, "little") + (8192).to_bytes(4, "little")
    mbr[510:512] = b"\x55\xaa"
    with open(srv.dev, "r+b", buffering=0) as f:
        f.write(mbr)
    run(["blockdev", "--rereadpt", srv.dev])
    assert not os.path.exists(f"{srv.dev}p1")
    assert not list(Path(f"/sys/block/hybd{srv.id}").glob(f"hybd{srv.id}p*"))

    # the owner deletes it (ramdisk does on SIGTERM, as the user)
    srv.stop()
    assert srv.id not in device_ids()


def test_other_users_are_refused(servers, open_control, user_dir):
    srv = servers.start(as_user(USER, [RAMDISK, "--size", "32M",
                                       "--max-size", "64M"]))
    for args, words in ((["del", srv.dev], "Operation not permitted"),
                        (["del", "--force", srv.dev], "Operation not permitted"),
                        (["resize", srv.dev, "64M"], "Operation not permitted")):
        rc, _, err = hybdctl_as(OTHER, *args)
        assert rc == 1 and words in err, (args, err)
    # looking is allowed
    rc, out, err = hybdctl_as(OTHER, "info", srv.dev)
    assert rc == 0 and f"uid {USER}" in out, err
    # handover, and the server node, even with its mode opened up
    os.chmod(f"/dev/hybd{srv.id}-srv", 0o666)
    out = raw_as(OTHER, f"""
with u.Control() as ctl:
    print("handover", u.handover(ctl, {srv.id}))
try:
    os.close(os.open("/dev/hybd{srv.id}-srv", os.O_RDWR))
    print("open 0")
except OSError as e:
    print("open", e.errno)
""")
    assert out.split() == ["handover", str(errno.EPERM),
                           "open", str(errno.EPERM)], out
    # the owner resizes, an administrator deletes
    rc, _, err = hybdctl_as(USER, "resize", srv.dev, "64M")
    assert rc == 0, err
    assert srv.alive()
    res = run([HYBDCTL, "del", srv.dev])
    assert res.returncode == 0, res.stderr
    wait_for(lambda: srv.id not in device_ids(), 30, "the device to go")
    srv.proc.wait(timeout=30)     # "deleted underneath us"


def test_unprivileged_adds_are_limited(open_control):
    saved = {p: (PARAMS / p).read_text().strip()
             for p in ("max_user_devices", "max_user_mem_mb")}
    made = []
    try:
        (PARAMS / "max_user_devices").write_text("2")
        for _ in range(2):
            rc, out, err = hybdctl_as(USER, "add", "--size", "16M",
                                      "--depth", "4", "--max-io", "4k")
            assert rc == 0, err
            made.append(int(out))
        rc, _, err = hybdctl_as(USER, "add", "--size", "16M")
        assert rc == 1 and "max_user_devices" in err, err
        # another user has its own count
        rc, out, err = hybdctl_as(OTHER, "add", "--size", "16M", "--depth",
                                  "4", "--max-io", "4k")
        assert rc == 0, err
        made.append(int(out))
        rc, _, err = hybdctl_as(OTHER, "del", str(made.pop()))
        assert rc == 0, err

        (PARAMS / "max_user_devices").write_text("8")
        (PARAMS / "max_user_mem_mb").write_text("1")
        # 1 queue x 16 x 128 KiB = 2 MiB of buffers
        rc, _, err = hybdctl_as(USER, "add", "--size", "16M", "--queues",
                                "1", "--depth", "16", "--max-io", "128k")
        assert rc == 1 and "max_user_mem_mb" in err, err

        # a privileged device, without the flag: refused
        out = raw_as(USER, """
with u.Control() as ctl:
    e, _, _ = u.add(ctl)
    print(e)
""")
        assert int(out) == errno.EPERM
        # remap workers that poll: kernel threads' CPU, no one's to limit
        out = raw_as(USER, """
with u.Control() as ctl:
    e, _, p = u.add(ctl, b=u.basic(flags=u.DEV_F_UNPRIVILEGED |
                                   u.DEV_F_REMAP_POLL, poll_ns=50000))
    print(e, p)
""")
        assert out.split() == [str(errno.EPERM), str(uapi.PERR_FLAGS)], out
        # a bio-based front: a second disk, for an administrator's map()
        out = raw_as(USER, """
with u.Control() as ctl:
    e, _, p = u.add(ctl, b=u.basic(flags=u.DEV_F_UNPRIVILEGED |
                                   u.DEV_F_BIO_FRONT))
    print(e, p)
""")
        assert out.split() == [str(errno.EPERM), str(uapi.PERR_FLAGS)], out
        # the owner deletes its own
        for dev_id in made:
            rc, _, err = hybdctl_as(USER, "del", str(dev_id))
            assert rc == 0, err
        made.clear()
    finally:
        for p, v in saved.items():
            (PARAMS / p).write_text(v)
        with uapi.Control() as ctl:
            for dev_id in made:
                uapi.delete(ctl, dev_id)


def test_a_deleted_device_counts_until_it_is_freed(open_control):
    """A process that keeps the server node open keeps the device's
    memory (the kernel frees it with the last reference, not at delete):
    it stays charged to its user until then."""
    need_built(BADSERVER, "tests/helpers/badserver")
    saved = (PARAMS / "max_user_devices").read_text().strip()
    made, child = [], None
    try:
        (PARAMS / "max_user_devices").write_text("1")
        srv = subprocess.Popen(as_user(USER, [BADSERVER, "fork-child"]),
                               stdout=subprocess.PIPE, text=True)
        lines = []
        while not any(line.startswith("child ") for line in lines):
            line = srv.stdout.readline()
            assert line, f"badserver ended: {lines}"
            lines.append(line)
        child = int(next(line for line in lines
                         if line.startswith("child ")).split()[1])
        dev_id = int(re.search(r"hybd(\d+)", next(
            line for line in lines if line.startswith("ready "))).group(1))
        rc, _, err = hybdctl_as(USER, "del", str(dev_id))
        assert rc == 0, err
        srv.wait(T_IO)
        assert dev_id not in device_ids()
        # deleted, but its child still holds the node: still charged
        rc, _, err = hybdctl_as(USER, "add", "--size", "16M")
        assert rc == 1 and "max_user_devices" in err, err
        os.kill(child, signal.SIGKILL)
        child = None

        def add():
            rc, out, _ = hybdctl_as(USER, "add", "--size", "16M")
            if rc == 0:
                made.append(int(out))
            return rc == 0
        wait_for(add, T_IO, "the charge returned when the device is freed")
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        (PARAMS / "max_user_devices").write_text(saved)
        with uapi.Control() as ctl:
            for dev_id in made:
                uapi.delete(ctl, dev_id)


def test_all_users_together_and_timeouts_are_limited(open_control):
    """max_unpriv_devices caps every user's devices together; an
    unprivileged device always has an I/O timeout, and no timeout beyond
    max_user_timeout."""
    saved = (PARAMS / "max_unpriv_devices").read_text().strip()
    made = []
    try:
        (PARAMS / "max_unpriv_devices").write_text("1")
        rc, out, err = hybdctl_as(USER, "add", "--size", "16M",
                                  "--io-timeout", "0")
        assert rc == 0, err
        made.append(int(out))
        rc, _, err = hybdctl_as(OTHER, "add", "--size", "16M")
        assert rc == 1 and "max_unpriv_devices" in err, err
        # none asked for: 30 s all the same
        rc, out, err = hybdctl_as(USER, "info", str(made[0]), "--json")
        assert rc == 0, err
        assert json.loads(out)["io_timeout"] == 30
        (PARAMS / "max_unpriv_devices").write_text("8")
        for opt in ("--io-timeout", "--recovery"):
            rc, _, err = hybdctl_as(USER, "add", "--size", "16M", opt, "121")
            assert rc == 1 and "too long for an unprivileged device" in err, err
        rc, out, err = hybdctl_as(USER, "add", "--size", "16M",
                                  "--io-timeout", "120")
        assert rc == 0, err
        made.append(int(out))
    finally:
        (PARAMS / "max_unpriv_devices").write_text(saved)
        with uapi.Control() as ctl:
            for dev_id in made:
                uapi.delete(ctl, dev_id)


def test_backing_target_must_be_the_servers_own(servers, open_control,
                                                user_dir, tmp_path):
    need_built(BADSERVER, "tests/helpers/badserver")
    need_built(LOOP, "examples/loop/hybd-loop")
    # the user's own file: taken
    mine = user_dir / "mine"
    with open(mine, "wb") as f:
        f.truncate(16 * MiB)
    os.chown(mine, USER, USER)
    srv = servers.start(as_user(USER, [LOOP, "--remap", mine]))
    data = pattern(8, 64 << 10)
    with open(srv.dev, "r+b", buffering=0) as f:
        f.write(data)
    srv.stop()
    assert mine.read_bytes()[:len(data)] == data

    # root's file, whose descriptor the server was handed: refused
    theirs = tmp_path / "theirs"
    with open(theirs, "wb") as f:
        f.truncate(16 * MiB)
    os.chmod(theirs, 0o600)
    assert backing_answer_as_user(servers, theirs) == errno.EACCES


def test_unprivileged_targets_are_on_local_storage(servers, open_control):
    """A user's device may not remap onto a file whose I/O waits for a
    server elsewhere (FUSE, NFS, 9p, virtiofs): a remap there is failed
    neither by the I/O timeout nor by a forced delete, so the user could
    hold the device, its id and the module.  The guest's results
    directory is such a file system (virtme-ng shares it with 9p or
    virtiofs); the user's own file there is refused with EPERM, where one
    on tmpfs is taken (test_backing_target_must_be_the_servers_own)."""
    need_built(BADSERVER, "tests/helpers/badserver")
    results = os.environ.get("HYBD_RESULTS")
    assert results, "no HYBD_RESULTS: the suite runs in the guest"
    fstype = mount_type(results)
    assert fstype in ("9p", "virtiofs", "fuse", "nfs", "nfs4"), fstype
    remote = Path(results) / f"user-target-{os.getpid()}"
    with open(remote, "wb") as f:
        f.truncate(16 * MiB)
    os.chown(remote, USER, USER)
    try:
        assert backing_answer_as_user(servers, remote) == errno.EPERM, fstype
    finally:
        remote.unlink()


def backing_answer_as_user(servers, path):
    """tests/helpers/badserver backing-fd3 run as USER with path opened
    (by root) as its descriptor 3: the errno of its registration, 0 if
    taken.  Our own descriptor 3 (maybe /dev/kmsg's) is put back."""
    fd = os.open(path, os.O_RDWR)
    try:
        saved = os.dup(3)
    except OSError:
        saved = None
    try:
        os.dup2(fd, 3)
        srv = servers.start(as_user(USER, [BADSERVER, "backing-fd3"]),
                            pass_fds=(3,))
        wait_for(lambda: any(l.startswith("backing ") for l in srv.out), 30,
                 "the backing answer")
        line = [l for l in srv.out if l.startswith("backing ")][0]
        srv.stop()
        return int(line.split()[1])
    finally:
        os.close(fd)
        if saved is None:
            os.close(3)
        else:
            os.dup2(saved, 3)
            os.close(saved)


def mount_type(path):
    """The type of the file system path is on (/proc/self/mountinfo)."""
    best, fstype = "", None
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mnt = fields[4]
            sep = fields.index("-")
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and \
                    len(mnt) >= len(best):
                best, fstype = mnt, fields[sep + 1]
    return fstype
