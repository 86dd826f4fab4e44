# SPDX-License-Identifier: GPL-2.0
"""Backing targets (HYBD_SRV_ADD_BACKING, HYBD_F_BACKING): a server
registers open files and block devices with its device; the kernel checks
each (readable, writable if asked, direct I/O, alignment against the
device's block size), keeps its own reference, and lets go of it on
HYBD_SRV_DEL_BACKING or when the server node is closed.  The targets are
where the fast path's remap (issue 11) will serve requests."""

import errno
import os
import signal
import struct
import subprocess
import time

import pytest

import hybd_uapi as u
from hybdlib import (REPO, T_CMD, T_IO, loop_device, need_built, need_tool,
                     record, run, wait_for)

MiB = 1 << 20


class Served:
    """A device added with the raw ioctl and its server node open, as a
    server holds it (nothing is started: targets are the node's)."""

    def __init__(self, lbs=4096):
        self.ctl = u.Control()
        e, self.id, perr = u.add(self.ctl, b=u.basic(lbs=lbs))
        assert e == 0, (u.errname(e), perr)
        path = f"/dev/hybd{self.id}-srv"
        wait_for(lambda: os.path.exists(path), T_CMD, path)
        self.fd = os.open(path, os.O_RDWR)

    def add(self, fd, flags=0, length=None, reserved0=0, reserved=(0, 0),
            tail=b""):
        """HYBD_SRV_ADD_BACKING: (errno, index, size, dio_align); @tail:
        bytes after the structure, which len then covers (a newer
        caller's)."""
        size = struct.calcsize(u.SRV_BACKING_FMT)
        if length is None:
            length = size + len(tail)
        buf = bytearray(struct.pack(u.SRV_BACKING_FMT, length, fd, flags,
                                    0xFFFF, 0, 0, reserved0, *reserved))
        buf += tail
        e = u.ioctl(self.fd, u.SRV_ADD_BACKING, buf)
        _, _, _, index, tsize, align, _, _, _ = struct.unpack_from(
            u.SRV_BACKING_FMT, buf)
        return e, index, tsize, align

    def delete(self, index):
        r = u._libc.ioctl(self.fd, u.SRV_DEL_BACKING, index)
        return u.ctypes.get_errno() if r < 0 else 0

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self):
        self.close()
        u.delete(self.ctl, self.id)
        self.ctl.close()


@pytest.fixture
def served():
    made = []

    def make(**kw):
        s = Served(**kw)
        made.append(s)
        return s
    yield make
    for s in made:
        s.remove()


@pytest.fixture
def dio_fs(tmp_path):
    """An ext4 file system on a loop device (direct I/O works there, as
    on the disks a driver keeps its data on): (mount point, loop device).
    Ask for it before `served`: the nodes close (and let go of their
    files) before it is unmounted."""
    mkfs = need_tool("mkfs.ext4")
    img = tmp_path / "fs.img"
    with open(img, "wb") as f:
        f.truncate(128 * MiB)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with loop_device(img) as loop:
        run([mkfs, "-F", "-q", loop], timeout=T_IO, check=True)
        run(["mount", "-t", "ext4", loop, mnt], check=True)
        try:
            yield mnt, loop
        finally:
            run(["umount", mnt], check=True)


def test_backing_files_get_indices_and_give_them_back(dio_fs, served):
    mnt, _ = dio_fs
    s = served()
    path = mnt / "data"
    with open(path, "wb") as f:
        f.truncate(8 * MiB)
    fds = []
    try:
        for i in range(u.MAX_BACKINGS):
            fds.append(os.open(path, os.O_RDWR))
            e, index, size, align = s.add(fds[-1], u.BACKING_F_WRITE)
            assert (e, index, size) == (0, i, 8 * MiB), (u.errname(e), index)
            assert align in (512, 4096), align
        fds.append(os.open(path, os.O_RDONLY))
        assert s.add(fds[-1])[0] == errno.ENOSPC
        # a freed index is reused; a free one cannot be freed again
        assert s.delete(3) == 0
        assert s.delete(3) == errno.ENOENT
        assert s.add(fds[-1])[:2] == (0, 3)
        assert s.delete(u.MAX_BACKINGS) == errno.EINVAL
        for i in range(u.MAX_BACKINGS):
            assert s.delete(i) == 0, i
    finally:
        for fd in fds:
            os.close(fd)


def test_backing_refuses_what_it_cannot_use(dio_fs, served, tmp_path):
    mnt, _ = dio_fs
    s = served()
    path, empty = mnt / "data", mnt / "empty"
    with open(path, "wb") as f:
        f.truncate(MiB)
    empty.touch()
    ro = os.open(path, os.O_RDONLY)
    wo = os.open(path, os.O_WRONLY)
    rw = os.open(path, os.O_RDWR)
    rfd, wfd = os.pipe()
    null = os.open("/dev/null", os.O_RDWR)
    dirfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    efd = os.open(empty, os.O_RDWR)
    # remapped writes land where their request says: never appends
    apfd = os.open(path, os.O_RDWR | os.O_APPEND)
    aonly = mnt / "append-only"
    with open(aonly, "wb") as f:
        f.truncate(MiB)
    run([need_tool("chattr"), "+a", aonly], check=True)
    aofd = os.open(aonly, os.O_RDWR | os.O_APPEND)
    try:
        cases = [
            ("read-only fd, write asked", dict(fd=ro, flags=u.BACKING_F_WRITE),
             errno.EBADF),
            ("write-only fd", dict(fd=wo), errno.EBADF),
            ("no such fd", dict(fd=-1), errno.EBADF),
            ("a pipe", dict(fd=rfd), errno.EINVAL),
            ("a character device", dict(fd=null), errno.EINVAL),
            ("a directory", dict(fd=dirfd), errno.EINVAL),
            ("unknown flag", dict(fd=rw, flags=2), errno.EOPNOTSUPP),
            ("reserved0", dict(fd=rw, reserved0=1), errno.EINVAL),
            ("reserved", dict(fd=rw, reserved=(0, 1)), errno.EINVAL),
            ("short len", dict(fd=rw, length=8), errno.EINVAL),
            ("a longer struct's unknown bytes",
             dict(fd=rw, tail=b"\0\0\0\0\0\0\0\1"), errno.E2BIG),
            ("O_APPEND, write asked", dict(fd=apfd, flags=u.BACKING_F_WRITE),
             errno.EINVAL),
            ("append-only file, write asked",
             dict(fd=aofd, flags=u.BACKING_F_WRITE), errno.EPERM),
        ]
        for what, kw, want in cases:
            e = s.add(**kw)[0]
            assert e == want, (what, u.errname(e))
        # none of them took an index: the first good one gets 0
        assert s.add(ro)[:2] == (0, 0)
        # an empty file is a target (a store that appends): size 0
        assert s.add(efd)[:3] == (0, 1, 0)
        # a newer caller's longer struct, its unknown bytes zero
        assert s.add(rw, tail=bytes(8))[:2] == (0, 2)
        # append-only files are read as any other
        assert s.add(aofd)[:2] == (0, 3)
        assert s.add(apfd)[:2] == (0, 4)
    finally:
        for fd in (ro, wo, rw, rfd, wfd, null, dirfd, efd, apfd, aofd):
            os.close(fd)
        run([need_tool("chattr"), "-a", aonly], check=True)


def test_server_ioctls_follow_the_growth_rules(served):
    """HYBD_SRV_IO and HYBD_SRV_QUEUE_CPUS, as the control ioctls: shorter
    than the first version is EINVAL, longer is taken if the bytes the
    kernel does not know are zero, else E2BIG."""
    s = served()
    io_size = struct.calcsize(u.SRV_IO_FMT)

    def srv_io(length, tail):
        # flags 0: a commit (nothing to commit), no wait
        buf = bytearray(struct.pack(u.SRV_IO_FMT, length, 0, 0, 0, 0)) + tail
        return u.ioctl(s.fd, u.SRV_IO, buf)

    assert srv_io(io_size, b"") == 0
    assert srv_io(io_size + 8, bytes(8)) == 0
    assert srv_io(io_size + 8, b"\1" + bytes(7)) == errno.E2BIG
    assert srv_io(io_size - 4, b"") == errno.EINVAL

    mask = u.ctypes.create_string_buffer(64)
    qc_size = struct.calcsize(u.SRV_QUEUE_CPUS_FMT)

    def queue_cpus(length, tail):
        buf = bytearray(struct.pack(u.SRV_QUEUE_CPUS_FMT, length, 0, 0,
                                    len(mask), u.ctypes.addressof(mask),
                                    0, 0)) + tail
        e = u.ioctl(s.fd, u.SRV_QUEUE_CPUS, buf)
        return e, struct.unpack_from(u.SRV_QUEUE_CPUS_FMT, buf)[2]

    e, nr_cpus = queue_cpus(qc_size, b"")
    assert e == 0 and nr_cpus >= os.cpu_count()
    assert queue_cpus(qc_size + 8, bytes(8))[0] == 0
    assert queue_cpus(qc_size + 8, bytes(7) + b"\1")[0] == errno.E2BIG
    assert queue_cpus(qc_size - 8, b"")[0] == errno.EINVAL


def test_backing_block_devices_and_alignment(served, tmp_path):
    img = tmp_path / "disk.img"
    with open(img, "wb") as f:
        f.truncate(16 * MiB)
    with loop_device(img, "-b", "4096") as loop:
        fd = os.open(loop, os.O_RDWR)
        try:
            s = served(lbs=4096)
            e, index, size, align = s.add(fd, u.BACKING_F_WRITE)
            assert (e, index, size, align) == (0, 0, 16 * MiB, 4096), \
                u.errname(e)
            # a 512-byte-block device cannot do direct I/O on 4096-byte
            # sectors
            s512 = served(lbs=512)
            assert s512.add(fd)[0] == errno.EINVAL
            # the reference is the target's: losetup -d must wait for it
            s.close()
        finally:
            os.close(fd)


def free_bytes(mnt):
    st = os.statvfs(mnt)
    return st.f_bfree * st.f_frsize


def register_unlinked(s, mnt):
    """Register a new 32 MiB file of mnt with s, then unlink it: returns
    its index and the free bytes before the unlink."""
    path = mnt / "big"
    with open(path, "wb") as f:
        f.write(os.urandom(MiB) * 32)
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDWR)
    e, index, _, _ = s.add(fd, u.BACKING_F_WRITE)
    assert e == 0, u.errname(e)
    os.close(fd)
    return index, unlink_synced(mnt, path)


def unlink_synced(mnt, path):
    """Unlink path, a file of mnt, and sync; mnt's free bytes before."""
    before = free_bytes(mnt)
    os.unlink(path)
    subprocess.run(["sync"], check=True)
    return before


def wait_freed(mnt, before, want=30 * MiB):
    wait_for(lambda: free_bytes(mnt) - before >= want, T_CMD,
             "the unlinked file's space to come back")


def unlink_and_wait_freed(mnt, path, want=30 * MiB):
    """Unlink path, a file of mnt nothing else holds open any more, and
    wait for want bytes of its space to come back."""
    wait_freed(mnt, unlink_synced(mnt, path), want)


def test_backing_reference_goes_with_the_server_node(dio_fs, served):
    """The kernel's reference keeps an unlinked file's space until the
    server node is closed, and not a moment longer."""
    mnt, _ = dio_fs
    s = served()
    _, before = register_unlinked(s, mnt)
    # still held: the kernel's reference
    assert free_bytes(mnt) - before < 16 * MiB, (before, free_bytes(mnt))
    s.close()
    wait_freed(mnt, before)


def test_backing_reference_goes_with_its_delete(dio_fs, served):
    """HYBD_SRV_DEL_BACKING of a target nothing remapped to lets go of
    the file at once, and HYBD_SRV_REMAP_BARRIER has nothing to wait
    for."""
    mnt, _ = dio_fs
    s = served()
    index, before = register_unlinked(s, mnt)
    assert s.delete(index) == 0
    wait_freed(mnt, before)
    assert u._libc.ioctl(s.fd, u.SRV_REMAP_BARRIER, 0) == 0


STACKDRV = REPO / "tests" / "helpers" / "stackdrv"


class Stacker:
    """tests/helpers/stackdrv: a running device whose server registers a
    target each time it is asked."""

    def __init__(self, servers, request, *args):
        need_built(STACKDRV, "tests/helpers/stackdrv")
        self.request = request
        self.srv = servers.start([STACKDRV, *args, request])
        self.dev = self.srv.dev

    def add(self, path):
        """Register path: "index N" or "error ENAME: why"."""
        self.request.write_text(str(path))
        seen = len(self.srv.out)
        self.srv.proc.send_signal(signal.SIGUSR1)
        prefix = f"add {path}: "

        def answer():
            for line in self.srv.out[seen:]:
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
            return None
        wait_for(answer, T_CMD, f"{self.dev}'s answer for {path}")
        return answer()


def test_targets_whose_io_may_come_back_are_refused(servers, tmp_path):
    """A remap whose I/O comes back to its own device would wait for the
    tags its requests hold: HYBD_SRV_ADD_BACKING refuses, with ELOOP, the
    device itself, a file on a file system on it (also through overlayfs,
    and when only the file system's journal is there), a dm device built
    on it, and another hybd device whose target it is; what cannot come
    back is taken."""
    mkfs = need_tool("mkfs.ext4")
    a = Stacker(servers, tmp_path / "request")

    def refused(path):
        """A new 1 MiB file at path, which A must refuse."""
        with open(path, "wb") as f:
            f.truncate(MiB)
        answer = a.add(path)
        assert answer.startswith("error ELOOP"), (path, answer)
    ok_file = tmp_path / "plain.img"
    with open(ok_file, "wb") as f:
        f.truncate(MiB)
    assert a.add(ok_file) == "index 0"
    assert a.add(a.dev).startswith("error ELOOP"), a.dev

    # another hybd device: B may take A, then A may not take B
    b = Stacker(servers, tmp_path / "request")
    assert b.add(a.dev) == "index 0"
    assert a.add(b.dev).startswith("error ELOOP")
    c = Stacker(servers, tmp_path / "request")
    assert a.add(c.dev) == "index 1"

    # a dm device on A
    dm = f"hybd-stack-{os.getpid()}"
    sectors = int(run(["blockdev", "--getsz", a.dev], check=True).stdout)
    run([need_tool("dmsetup"), "create", dm, "--table",
         f"0 {sectors} linear {a.dev} 0"], check=True)
    try:
        assert a.add(f"/dev/mapper/{dm}").startswith("error ELOOP")
    finally:
        # udev may still be probing the new dm device: --retry waits
        run(["dmsetup", "remove", "--retry", dm], check=True)

    # a file system on A, directly and under an overlay
    mnt, lower, ovl = (tmp_path / n for n in ("mnt", "lower", "ovl"))
    for d in (mnt, lower, ovl):
        d.mkdir()
    run([mkfs, "-F", "-q", a.dev], timeout=T_IO, check=True)
    run(["mount", a.dev, mnt], check=True)
    try:
        (mnt / "upper").mkdir()
        (mnt / "work").mkdir()
        refused(mnt / "data")
        run(["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={lower},upperdir={mnt / 'upper'},"
             f"workdir={mnt / 'work'}", ovl], check=True)
        try:
            refused(ovl / "data")
        finally:
            run(["umount", ovl], check=True)
    finally:
        run(["umount", mnt], check=True)

    # a file system elsewhere whose journal is on A
    run([mkfs, "-F", "-q", "-O", "journal_dev", "-b", "4096", a.dev],
        timeout=T_IO, check=True)
    img = tmp_path / "fs.img"
    with open(img, "wb") as f:
        f.truncate(64 * MiB)
    with loop_device(img) as loop:
        run([mkfs, "-F", "-q", "-b", "4096", "-J", f"device={a.dev}", loop],
            timeout=T_IO, check=True)
        run(["mount", loop, mnt], check=True)
        try:
            refused(mnt / "data")
        finally:
            run(["umount", mnt], check=True)
    # and nothing was taken but the three good ones
    assert a.add(ok_file) == "index 2"


def test_loop_check_follows_each_device_once(servers, tmp_path):
    """A fanned-out stack: each of seven devices takes the next one's node
    16 times over, the last has 15 files.  Followed path by path, adding
    the second device to the first walks 16^7 leaves under the global
    stack lock, for minutes, while every other ADD_BACKING waits; each
    device followed once, it is a few hundred.  The cycle the fan-out
    makes possible is still refused, from the far end."""
    devs = [Stacker(servers, tmp_path / f"request{i}") for i in range(8)]
    for i in range(15):
        leaf = tmp_path / f"leaf{i}.img"
        with open(leaf, "wb") as f:
            f.truncate(MiB)
        assert devs[7].add(leaf) == f"index {i}"
    t0 = time.monotonic()
    for upper, lower in reversed(list(zip(devs, devs[1:]))):
        for i in range(16):
            assert upper.add(lower.dev) == f"index {i}", (upper.dev, i)
    took = time.monotonic() - t0
    # 112 registrations, each a walk of at most 8 devices' targets once
    assert took < T_CMD, took
    # the last device's I/O must not come back through the fan-out
    assert devs[7].add(devs[0].dev).startswith("error ELOOP")
    record("test_loop_check_follows_each_device_once",
           f"112 registrations in {took:.2f}s")
