# SPDX-License-Identifier: GPL-2.0
"""Online resize: `hybdctl resize` (HYBD_CTL_RESIZE, the server's resize
hook asked first) and a server's own HYBD_SRV_RESIZE, under I/O.

What is checked: the block layer's size (sysfs) and hybdctl info follow;
data below the end survives grows and shrinks, fio --verify included; a
grown range is readable and writable, a shrunk end reads as the end of the
device, and what a shrink cut off reads as zeros when a grow brings it
back; ext4 grows online with resize2fs; every refusal has its errno and
changes nothing (a server that refuses, does not answer, or answers
garbage; a device without a resize hook, not live, or with a fast path
attached on a shrink; bad sizes).
"""
import errno
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import hybd_uapi as uapi
from hybdlib import (HYBDCTL, LOOP, REPO, T_CMD, T_IO, direct_read,
                     direct_write, fio_verify, free_id, hybdctl, info,
                     need_built, need_tool, pattern, run, wait_for)

MiB = 1 << 20
CACHE_BPF = REPO / "bpf" / "cache.bpf.o"


def disk_bytes(dev):
    """The block layer's size of dev, from sysfs."""
    name = os.path.basename(dev)
    return int(Path(f"/sys/block/{name}/size").read_text()) * 512


def resize(dev, size):
    return hybdctl("resize", dev, str(size))


def resized(dev, size):
    rc, out, err = resize(dev, size)
    assert rc == 0, f"hybdctl resize {dev} {size}: exit {rc}: {err}"
    assert out.strip().endswith(f"is {size} bytes ({size // MiB} MiB)"), out
    assert disk_bytes(dev) == size
    assert info(dev)["size"] == size


def refused(dev, size, words):
    before = disk_bytes(dev)
    rc, out, err = resize(dev, size)
    assert rc == 1, f"resize {size} was not refused: {out}{err}"
    assert err.startswith("hybdctl: resize:") and words in err, err
    assert disk_bytes(dev) == before and info(dev)["size"] == before


@pytest.fixture
def ctl():
    with uapi.Control() as c:
        yield c


def test_grow_and_shrink_keep_data_and_zero_what_comes_back(ramdisk):
    srv = ramdisk(size="64M", max_size="128M", queues=2)
    low = pattern(1, 256 << 10)
    direct_write(srv.dev, 60 * MiB, low)

    resized(srv.dev, 96 * MiB)
    high = pattern(2, 256 << 10)
    direct_write(srv.dev, 90 * MiB, high)
    assert direct_read(srv.dev, 90 * MiB, len(high)) == high

    resized(srv.dev, 64 * MiB)
    # the end of the device: a read there returns nothing
    with open(srv.dev, "rb", buffering=0) as f:
        assert os.pread(f.fileno(), 4096, 90 * MiB) == b""

    resized(srv.dev, 96 * MiB)
    assert direct_read(srv.dev, 90 * MiB, len(high)) == bytes(len(high)), \
        "what the shrink cut off came back"
    assert direct_read(srv.dev, 60 * MiB, len(low)) == low

    # a shrink and a grow back to back: the driver hears of both, in
    # order (one merged into the other would leave the old data there)
    direct_write(srv.dev, 90 * MiB, high)
    res = run(["sh", "-c", f"{HYBDCTL} resize {srv.dev} 64M && "
                           f"{HYBDCTL} resize {srv.dev} 96M"])
    assert res.returncode == 0, res.stderr
    assert direct_read(srv.dev, 90 * MiB, len(high)) == bytes(len(high)), \
        "what a back-to-back shrink cut off came back"
    s = info(srv.dev)["stats"]
    assert s["slow_errors"] == 0 and s["failed_dead"] == 0
    srv.stop()


def test_resize_under_fio_verify(ramdisk):
    """fio --verify on the first 32 MiB while the device grows and shrinks
    between 64 and 128 MiB: no error, every block reads back."""
    srv = ramdisk(size="64M", max_size="128M", queues=2, depth=32)
    done = threading.Event()
    errors = []

    def churn():
        n = 0
        while not done.is_set() and n < 200:
            size = (128 if n % 2 == 0 else 64) * MiB
            rc, _, err = resize(srv.dev, size)
            if rc != 0:
                errors.append(err)
                return
            n += 1
        errors.append(n)

    t = threading.Thread(target=churn)
    t.start()
    try:
        fio_verify(srv.dev, "4k", "16M", 2, extra=["--loops=2"])
    finally:
        done.set()
        t.join(timeout=T_IO)
    assert isinstance(errors[-1], int) and errors[-1] >= 4, \
        f"resizes: {errors}"
    assert info(srv.dev)["stats"]["slow_errors"] == 0
    srv.stop()


def test_ext4_grows_online_with_resize2fs(ramdisk, tmp_path):
    mkfs = need_tool("mkfs.ext4")
    fsck = need_tool("fsck.ext4")
    resize2fs = need_tool("resize2fs")
    srv = ramdisk(size="64M", max_size="192M")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run([mkfs, "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0",
         srv.dev], timeout=T_IO, check=True)
    run(["mount", "-t", "ext4", srv.dev, mnt], timeout=T_IO, check=True)
    try:
        first = pattern(3, 8 * MiB)
        (mnt / "first").write_bytes(first)
        before = os.statvfs(mnt)

        resized(srv.dev, 192 * MiB)
        run([resize2fs, srv.dev], timeout=T_IO, check=True)
        after = os.statvfs(mnt)
        assert after.f_blocks * after.f_frsize > 2 * before.f_blocks * before.f_frsize
        # more than the old file system could hold
        big = pattern(4, 96 * MiB)
        (mnt / "big").write_bytes(big)
        os.sync()
    finally:
        run(["umount", mnt], timeout=T_IO)
    res = run([fsck, "-fn", srv.dev], timeout=T_IO)
    assert res.returncode == 0, f"fsck exit {res.returncode}\n{res.stdout}"
    run(["blockdev", "--flushbufs", srv.dev], timeout=T_IO, check=True)
    run(["mount", "-t", "ext4", "-o", "ro", srv.dev, mnt], timeout=T_IO,
        check=True)
    try:
        assert (mnt / "first").read_bytes() == first
        assert (mnt / "big").read_bytes() == big
    finally:
        run(["umount", mnt], timeout=T_IO, check=True)
    srv.stop()


def test_refusals_change_nothing(ramdisk, added_devices, tmp_path):
    srv = ramdisk(size="64M", max_size="128M")
    refused(srv.dev, 256 * MiB, "No space left on device")     # the hook's
    refused(srv.dev, 64 * MiB + 512, "multiple of the logical block size")
    rc, _, err = resize(srv.dev, "12Q")
    assert rc == 2 and "SIZE" in err, err
    rc, _, err = resize(srv.dev, 0)
    assert rc == 1 and "non-zero multiple" in err, err

    # a shrink with a fast path attached; a grow is fine
    assert CACHE_BPF.is_file(), f"{CACHE_BPF} not built; run make"
    rc, _, err = hybdctl("attach", str(CACHE_BPF), srv.dev)
    assert rc == 0, err
    refused(srv.dev, 32 * MiB, "detach it to shrink")
    resized(srv.dev, 96 * MiB)
    data = pattern(5, 64 << 10)
    direct_write(srv.dev, 95 * MiB, data)
    assert direct_read(srv.dev, 95 * MiB, len(data)) == data
    assert direct_read(srv.dev, 95 * MiB, len(data)) == data
    rc, _, err = hybdctl("detach", srv.dev)
    assert rc == 0, err
    resized(srv.dev, 32 * MiB)
    srv.stop()

    # no server that answers: one made by `hybdctl add`, one waiting for a
    # new server after its own died
    rc, out, _ = hybdctl("add", "--size", "16M")
    assert rc == 0
    added_devices.append(int(out))
    rc, _, err = resize(out.strip(), 32 * MiB)
    assert rc == 1 and "does not take resizes" in err, err
    srv = ramdisk(size="64M", max_size="128M", recovery=60)
    added_devices.append(srv.id)
    srv.kill()
    wait_for(lambda: info(srv.dev)["state"] == "waiting", 10, "waiting")
    rc, _, err = resize(srv.dev, 96 * MiB)
    assert rc == 1 and "not live" in err, err
    rc, _, err = resize(str(free_id()), 32 * MiB)
    assert rc == 1 and "no such device" in err, err


def test_a_driver_without_a_resize_hook_is_not_asked(servers, tmp_path):
    need_built(LOOP, "examples/loop/hybd-loop")
    backing = tmp_path / "file"
    with open(backing, "wb") as f:
        f.truncate(32 * MiB)
    srv = servers.start([LOOP, backing])
    refused(srv.dev, 64 * MiB, "does not take resizes")
    srv.stop()


def test_raw_resize_rejects_bad_requests(ctl, ramdisk):
    srv = ramdisk(size="64M", max_size="128M")
    size = 64 * MiB
    assert uapi.resize(ctl, srv.id, 96 * MiB, flags=1) == errno.EOPNOTSUPP
    assert uapi.resize(ctl, srv.id, 96 * MiB, reserved0=1) == errno.EINVAL
    assert uapi.resize(ctl, srv.id, 96 * MiB, reserved=(0, 7)) == errno.EINVAL
    assert uapi.resize(ctl, srv.id, 96 * MiB, length=16) == errno.EINVAL
    assert uapi.resize(ctl, srv.id, (1 << 50) + 4096) == errno.EINVAL
    assert uapi.resize(ctl, srv.id + 1000, 96 * MiB) == errno.ENODEV
    assert uapi.resize(ctl, srv.id, size) == 0          # no change
    assert disk_bytes(srv.dev) == size
    srv.stop()


def test_server_that_never_answers_times_out(badserver):
    srv = badserver("resize-silent", "--io-timeout", "2")
    refused(srv.dev, 32 * MiB, "did not answer in time")
    # the device still serves, and a later question is a new one
    data = pattern(6, 64 << 10)
    direct_write(srv.dev, 0, data)
    assert direct_read(srv.dev, 0, len(data)) == data
    refused(srv.dev, 8 * MiB, "did not answer in time")
    srv.stop()


def test_garbage_answers_are_refused(badserver):
    """badserver exits 1 unless result 4242 is EINVAL and an answer to
    another request ESTALE; its good answer then grows the device."""
    srv = badserver("resize-garbage")
    resized(srv.dev, 32 * MiB)
    # beyond its memory the server fails requests: cleanly
    with pytest.raises(OSError) as e:
        direct_read(srv.dev, 20 * MiB, 4096)
    assert e.value.errno == errno.EIO
    srv.stop()
    assert srv.proc.returncode == 0, "".join(srv.err)


def test_server_resizes_its_own_device(badserver):
    srv = badserver("self-resize")
    wait_for(lambda: sum(line.startswith("size ") for line in srv.out) == 2,
             30, "two self-resizes")
    lines = [line.split() for line in srv.out if line.startswith("size ")]
    # each change is in the ring header's dev_size when the ioctl returns
    assert [(int(f[1]), int(f[3])) for f in lines] == \
        [(8 * MiB, 8 * MiB), (16 * MiB, 16 * MiB)]
    assert disk_bytes(srv.dev) == 16 * MiB
    data = pattern(7, 64 << 10)
    direct_write(srv.dev, 15 * MiB, data)
    assert direct_read(srv.dev, 15 * MiB, len(data)) == data
    srv.stop()


def dev_sizes(srv):
    """The committed sizes the server saw in its ring header, in order."""
    return [int(line.split()[1]) for line in srv.out
            if line.startswith("dev_size ")]


def shrink_accepted(srv, size):
    """hybdctl resize of srv (badserver resize-hold) to size, started and
    accepted by the server, which now holds its requests: the Popen."""
    ctl = subprocess.Popen([HYBDCTL, "resize", srv.dev, str(size)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    wait_for(lambda: any(line.startswith("accepted ") for line in srv.out),
             T_IO, "the server's answer")
    return ctl


def test_shrink_interrupted_after_the_answer_changes_nothing(badserver):
    """The server accepts a shrink, then holds a request beyond the new end
    for 3 s, so that the kernel's drain waits; the resize is interrupted
    there.  The size stays, the server is never told of a new one (so it
    lets go of nothing), the queue runs again, the wait was a signal's
    to end; a second shrink, which drains, is published."""
    srv = badserver("resize-hold", "--io-timeout", "20")
    data = pattern(8, 64 << 10)
    direct_write(srv.dev, 12 * MiB, data)
    stop = threading.Event()
    errors = []

    def reader():
        while not stop.is_set():
            try:
                if direct_read(srv.dev, 12 * MiB, len(data)) != data:
                    errors.append("wrong data")
            except OSError as e:
                errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        ctl = shrink_accepted(srv, 8 * MiB)
        time.sleep(0.5)          # the drain waits for the held read
        ctl.send_signal(signal.SIGINT)
        start = time.monotonic()
        out, err = ctl.communicate(timeout=T_IO)
        # well before the 3 s hold ends: the wait was interruptible
        assert time.monotonic() - start < 2.5
        assert ctl.returncode != 0, out + err
    finally:
        stop.set()
        t.join(T_IO)
    assert not errors, errors
    assert disk_bytes(srv.dev) == 16 * MiB and info(srv.dev)["size"] == 16 * MiB
    assert direct_read(srv.dev, 12 * MiB, len(data)) == data
    assert dev_sizes(srv) == []
    resized(srv.dev, 8 * MiB)
    wait_for(lambda: dev_sizes(srv) == [8 * MiB], T_IO, "the published size")
    srv.stop()


def test_shrink_is_not_committed_for_a_server_that_did_not_consent(
        badserver, ramdisk, tmp_path):
    """The server accepts a shrink, holds a request so that the drain
    waits, and is killed there; a new server (recovery) takes the device
    over and ends the held request, so the drain ends with the device
    live again.  The new server was never asked: the shrink fails with
    EAGAIN and the size stays."""
    srv = badserver("resize-hold", "--io-timeout", "20", "--recovery", "60")
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                direct_read(srv.dev, 12 * MiB, 4096)
            except OSError:
                pass

    t = threading.Thread(target=reader)
    t.start()
    try:
        ctl = shrink_accepted(srv, 8 * MiB)
        srv.kill()
        wait_for(lambda: info(srv.dev)["state"] == "waiting", T_CMD,
                 "the device waiting for a server")
        # the resize is still draining: the held read is in flight
        assert ctl.poll() is None, ctl.communicate()
        disk = tmp_path / "disk"
        with open(disk, "wb") as f:
            f.truncate(16 * MiB)
        new = ramdisk(size=None, id=srv.id, attach=True, backing=disk)
        out, err = ctl.communicate(timeout=T_IO)
        assert ctl.returncode == 1, out + err
        assert "was replaced" in err, err
    finally:
        stop.set()
        t.join(T_IO)
    assert disk_bytes(srv.dev) == 16 * MiB and info(srv.dev)["size"] == 16 * MiB
    new.stop()
