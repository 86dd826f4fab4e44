# SPDX-License-Identifier: GPL-2.0
"""The bio-based front (HYBD_DEV_F_BIO_FRONT): /dev/hybdN takes bios and
runs the program's map() on each read and write; what it remaps onto a
block-device target is cloned there, without a request; everything else
goes on to the blk-mq disk behind it (hybdNq), where submit() and the
server see it as on any device."""
import contextlib
import errno
import mmap
import os
import re
import subprocess
import threading
import time
from pathlib import Path

from hybdbpf import (delta, detach_ok, disk_completed_ios, fastpath,  # noqa: F401
                     prog, settle, stats, suite_prog, unpin)
from hybdlib import (T_CMD, T_IO, direct_read, direct_write,
                     first_difference, fio_verify, hybdctl, info, loop_device,
                     need_tool, pattern, record, run, wait_for)
from test_backing import Stacker, dio_fs  # noqa: F401 (fixture)
from test_remap import (BLOCK, CASES, MiB, _built, check_offsets,  # noqa: F401
                        prog_globals, sparse, start_loop)


def front_of(dev):
    """The names of dev's front and of the disk behind it, both checked:
    the front is what /dev holds, the disk behind it is hidden."""
    name = os.path.basename(dev)
    assert Path(f"/sys/block/{name}").is_dir()
    assert Path(f"/sys/block/{name}q").is_dir(), "no disk behind the front"
    assert not Path(f"/dev/{name}q").exists(), "the disk behind is not hidden"
    return name, name + "q"


def test_front_clones_bios_and_keeps_data_where_it_belongs(servers, fastpath,
                                                            tmp_path):
    """fio --verify with io_uring submitting 16 at a time (which queue_rq
    would send to the workers), then at 512 B to 1 MiB, QD1 and QD32:
    nearly every read and write is cloned in the front, without a
    request.  A REQ_NOWAIT bio (io_uring's) the target would have to
    split ends with EAGAIN, counted in remap_waited and seen by
    complete(), and io_uring submits it again through the front.  The
    data lands on the target at the same offsets, and where the target's
    page cache holds a range, the bio goes through the request path and
    its direct I/O, which keeps that cache coherent."""
    size = 64 * MiB
    with loop_device(sparse(tmp_path / "disk.img", size)) as target:
        srv = start_loop(servers, target, "--front", "--block-size", "512")
        front, behind = front_of(srv.dev)
        assert info(srv.dev)["bio_front"] is True
        fastpath.attach(prog("loop-count"), srv.dev)
        # what udev's probe read of the target through its page cache
        res = run([need_tool("blockdev"), "--flushbufs", target])
        assert res.returncode == 0, res.stderr
        base = stats(srv.dev)
        ios = disk_completed_ios(srv.dev)
        fio_verify(srv.dev, "4k", "8M", 2, iodepth=32,
                   extra=("--iodepth_batch_submit=16",
                          "--iodepth_batch_complete_min=16"))
        d = delta(stats(srv.dev), base)
        assert d["slow_issued"] == 0, d
        assert d["remap_front"] == d["remapped"] == d["fast_done"] == \
            d["reads"] + d["writes"] > 0, d
        batched = d
        for bs, qd, per_job in CASES:
            fio_verify(srv.dev, bs, per_job, 2, iodepth=qd)
        mid = stats(srv.dev)
        d = delta(mid, base)
        assert d["slow_issued"] == 0, d
        assert d["remap_front"] == d["remapped"] == d["fast_done"] == \
            d["reads"] + d["writes"] > 0, d
        assert (d["fast_errors"], d["bpf_bad_ret"]) == (0, 0), d
        g = prog_globals(srv.dev)
        assert g["mapped"] == d["remap_front"] and g["remap_errors"] == 0, g
        assert g["again"] == d["remap_waited"], (g, d)
        # the front's iostats count what it cloned, and what it passed
        assert disk_completed_ios(srv.dev) - ios >= d["remapped"]

        check_offsets(srv.dev, target, size, "front")
        d = delta(stats(srv.dev), mid)
        assert d["slow_issued"] == 0 and d["fast_errors"] == 0, d
        # the ranges the target's page cache held went to submit()
        assert d["remapped"] > d["remap_front"], d

        # a target that takes 4 KiB at most: every 64 KiB bio io_uring
        # sends would be split there, so it comes back with EAGAIN and
        # goes through the front again, where it may wait
        name = os.path.basename(target)
        with open(f"/sys/block/{name}/queue/max_sectors_kb", "w") as f:
            f.write("4")
        # what check_offsets wrote through the target's page cache, and
        # what udev's probe read once it closed the target
        settle()
        res = run([need_tool("blockdev"), "--flushbufs", target])
        assert res.returncode == 0, res.stderr
        before, g0 = stats(srv.dev), prog_globals(srv.dev)
        fio_verify(srv.dev, "64k", "4M", 1, iodepth=8,
                   engine="io_uring")
        d = delta(stats(srv.dev), before)
        g = prog_globals(srv.dev)
        assert d["remap_waited"] > 0, d
        assert g["again"] - g0["again"] == d["remap_waited"], (g, d)
        assert d["remap_front"] == d["remapped"] == \
            d["reads"] + d["writes"] > 0, \
            " ".join(f"{k}={v}" for k, v in d.items() if v)
        assert (d["fast_errors"], d["slow_issued"]) == (0, 0), d
        assert g["remap_errors"] == g0["remap_errors"], g
        record("test_front_clones_bios_and_keeps_data_where_it_belongs",
               f"batched: front={batched['remap_front']} "
               f"remapped={batched['remapped']}; all: "
               f"front={mid['remap_front']} remapped={mid['remapped']} "
               f"again={mid['remap_waited']}; 4 KiB target: "
               f"again={d['remap_waited']} front={d['remap_front']}")
        detach_ok(srv.dev)
        srv.stop()


def test_front_passes_what_it_cannot_clone(dio_fs, servers, fastpath):
    """On a file target map() remaps, but the front cannot clone onto a
    file: the bio goes on and submit() remaps it (the workers' direct
    I/O).  Without a program the server serves everything; a flush goes
    through the disk behind, whose flush sequence the server sees."""
    mnt, _ = dio_fs
    target = sparse(mnt / "loop.img", 16 * MiB)
    srv = start_loop(servers, target.as_posix(), "--front")
    front_of(srv.dev)
    fastpath.attach(prog("loop"), srv.dev)
    base = stats(srv.dev)
    fio_verify(srv.dev, "4k", "4M", 2, iodepth=8)
    d = delta(stats(srv.dev), base)
    assert d["remap_front"] == 0 and d["slow_issued"] == 0, d
    assert d["remapped"] == d["reads"] + d["writes"] > 0, d
    detach_ok(srv.dev)

    base = stats(srv.dev)
    ios = disk_completed_ios(srv.dev)
    data = pattern("front-slow", 256 * 1024)
    with open(srv.dev, "r+b", buffering=0) as f:
        assert os.pwrite(f.fileno(), data, 3 * MiB) == len(data)
        os.fsync(f.fileno())
    assert direct_read(srv.dev, 3 * MiB, len(data)) == data
    d = delta(stats(srv.dev), base)
    assert d["remap_front"] == d["remapped"] == 0, d
    assert d["slow_done"] == d["slow_issued"] > 0 and d["flushes"] > 0, d
    # the front's iostats count what the disk behind served for it
    assert disk_completed_ios(srv.dev) - ios == d["slow_done"], d
    srv.stop()


def test_front_map_contract(servers, fastpath, tmp_path):
    """Every misuse of map() (tests/bpf/frontbad.bpf.c): a return outside
    the contract passes the bio and counts in bpf_bad_ret; the payload
    kfuncs refuse a bio (EINVAL); a remap map() does not return REMAPPED
    for leaves no trace; a refused remap gets its errno; complete() runs
    for what the front cloned, where a remap is refused (EPERM).  What is
    passed reaches submit() and the server, with the right data."""
    with loop_device(sparse(tmp_path / "disk.img", 16 * MiB)) as target:
        srv = start_loop(servers, target, "--front", "--remap=ro")
        blocks = 16
        data = [pattern(f"front-bad-{i}", BLOCK) for i in range(blocks)]
        for i in range(blocks):
            direct_write(srv.dev, i * BLOCK, data[i])
        fastpath.attach(suite_prog("frontbad"), srv.dev)
        base = stats(srv.dev)
        direct_write(srv.dev, 0, data[0])
        assert prog_globals(srv.dev)["got_write"] == -errno.EROFS
        for i in range(blocks):
            got = direct_read(srv.dev, i * BLOCK, BLOCK)
            assert got == data[i], (i, first_difference(got, data[i]))
        d = delta(stats(srv.dev), base)
        g = prog_globals(srv.dev)
        want = {"got_zero": -errno.EINVAL, "got_copy_in": -errno.EINVAL,
                "got_copy_out": -errno.EINVAL, "got_is_zero": -errno.EINVAL,
                "got4_first": 0, "got4": -errno.EALREADY,
                "got5": -errno.ENOENT, "got6": -errno.ERANGE,
                "got_complete": -errno.EPERM, "front_tag_seen": 1}
        assert {k: g[k] for k in want} == want, g
        # cases 2 and 4 were cloned in the front, twice each; the rest
        # reached submit()
        submitted = [g[f"sub{c}"] for c in range(8)]
        assert submitted == [2, 2, 0, 2, 0, 2, 2, 2], submitted
        assert d["remap_front"] == d["remapped"] == g["front_completes"] \
            == 4, (d, g)
        assert d["bpf_bad_ret"] == 4, d
        # write EROFS; case 4's second remap, 5 and 6 twice; complete() 4
        assert d["remap_refused"] == 1 + 3 * 2 + 4, d
        assert d["slow_done"] == d["slow_issued"] == 1 + 12, d
        assert d["fast_errors"] == 0, d
        detach_ok(srv.dev)
        srv.stop()


def test_front_delete_under_io(servers, fastpath, tmp_path):
    """A delete while fio reads and writes through the front, with every
    bio cloned: the delete returns, fio ends (its I/O after the front went
    fails), the server exits, and a new device takes the id again."""
    with loop_device(sparse(tmp_path / "disk.img", 32 * MiB)) as target:
        srv = start_loop(servers, target, "--front")
        fastpath.attach(prog("loop"), srv.dev)
        proc = subprocess.Popen(
            [need_tool("fio"), "--name=del", f"--filename={srv.dev}",
             "--direct=1", "--ioengine=io_uring", "--iodepth=32",
             "--rw=randrw", "--bs=4k", "--size=16M", "--numjobs=2",
             "--time_based", "--runtime=60", "--group_reporting"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp")
        try:
            wait_for(lambda: stats(srv.dev)["remap_front"] > 1000, 30,
                     "fio's bios cloned in the front")
            rc, _, err = hybdctl("del", "--in-use", srv.dev)
            assert rc == 0, err
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        srv.wait()
        assert not Path(srv.dev).exists()
        # the program's link stays, attached to nothing, until let go of
        assert unpin(srv.id)
        srv2 = start_loop(servers, target, "--front")
        assert direct_read(srv2.dev, 0, BLOCK) is not None
        srv2.stop()


@contextlib.contextmanager
def disk_releases():
    """A kprobe on the kernel's disk_release(), which frees a gendisk once
    its last reference goes: yields a function that lists the names of
    the disks released since (the name is the first field of the struct
    device passed, the kobject's)."""
    tracing = Path("/sys/kernel/tracing")
    if not (tracing / "kprobe_events").exists():
        run(["mount", "-t", "tracefs", "nodev", str(tracing)], check=True)
    event = "hybd_test/disk_release"
    def probe(line):
        # O_APPEND without the seek to the end that open(..., "a") makes,
        # which tracefs refuses (EINVAL)
        fd = os.open(tracing / "kprobe_events", os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    probe(f"p:{event} disk_release name=+0(+0(%di)):string")
    enable = tracing / "events" / event / "enable"
    (tracing / "trace").write_text("")
    enable.write_text("1")
    try:
        yield lambda: re.findall(r'disk_release: .*name="([^"]*)"',
                                 (tracing / "trace").read_text())
    finally:
        enable.write_text("0")
        probe(f"-:{event}")


def test_a_deleted_front_held_open_keeps_the_disk_behind_it(ramdisk):
    """A bio the front passes waits on its submitter's bio_list for the
    disk behind the front after the front's queue was let go of; whoever
    owns the bio holds the front.  So a front held open keeps the disk
    behind it after a delete, and lets go of it with its last reference.
    The window itself (between ->submit_bio's return and the list's turn)
    cannot be hit from user space; the lifetime can be seen: the kernel
    frees the disk behind (disk_release) only once the front held open is
    closed, and I/O on the held node reads nothing."""
    srv = ramdisk(size="16M", front=True)
    front, behind = front_of(srv.dev)
    data = pattern("held-front", 64 << 10)
    buf = mmap.mmap(-1, len(data))      # page-aligned, for O_DIRECT
    fd = os.open(srv.dev, os.O_RDWR | os.O_DIRECT)
    try:
        with disk_releases() as released:
            direct_write(srv.dev, 0, data)
            assert os.preadv(fd, [buf], 0) == len(data)
            assert buf[:] == data, "read through the held node"
            rc, _, err = hybdctl("del", "--in-use", srv.dev)
            assert rc == 0, err
            srv.wait()
            assert not Path(f"/sys/block/{behind}").exists()
            # the disk is gone: its size is 0 (nothing to read), or the
            # read fails
            try:
                assert os.preadv(fd, [buf], 0) == 0, "read a deleted disk"
            except OSError as e:
                assert e.errno in (errno.EIO, errno.ENXIO, errno.ENODEV), e
            time.sleep(1)
            assert behind not in released(), \
                "the disk behind the front was freed while the front was held"
            os.close(fd)
            fd = None
            wait_for(lambda: {front, behind} <= set(released()), T_CMD,
                     f"{front} and {behind} freed once the front was let go of")
    finally:
        if fd is not None:
            os.close(fd)
        buf.close()


def disk_size(name):
    return int(Path(f"/sys/block/{name}/size").read_text()) * 512


def test_front_resize(ramdisk):
    """Grow and shrink a device with a front: both disks change size, a
    read past the new end gets nothing, what a shrink cut off comes back
    as zeros."""
    srv = ramdisk(size="64M", max_size="128M", queues=2, front=True)
    names = front_of(srv.dev)
    high = pattern("front-high", 256 << 10)
    zeros = bytes(len(high))

    def resized(size):
        rc, _, err = hybdctl("resize", srv.dev, str(size))
        assert rc == 0, err
        assert [disk_size(n) for n in names] == [size, size], names

    resized(96 * MiB)
    direct_write(srv.dev, 90 * MiB, high)
    assert direct_read(srv.dev, 90 * MiB, len(high)) == high
    resized(64 * MiB)
    with open(srv.dev, "rb", buffering=0) as f:
        assert os.pread(f.fileno(), 4096, 90 * MiB) == b""
    resized(96 * MiB)
    assert direct_read(srv.dev, 90 * MiB, len(high)) == zeros, \
        "what the shrink cut off came back"
    srv.stop()


@contextlib.contextmanager
def held_target(tmp_path, size=64 * MiB):
    """A dm-linear device over a loop device that can hold its I/O:
    yields (path, hold), where hold(True) suspends it (bios wait in dm)
    and hold(False) lets them go.  Let go of and removed afterwards."""
    dmsetup = need_tool("dmsetup")
    name = f"hybd-held-{os.getpid()}"
    with loop_device(sparse(tmp_path / "held.img", size)) as lo:
        run([dmsetup, "create", name, "--table",
             f"0 {size // 512} linear {lo} 0"], check=True)

        def hold(on):
            run([dmsetup, "suspend" if on else "resume", name], check=True)
        try:
            yield f"/dev/mapper/{name}", hold
        finally:
            hold(False)
            run([dmsetup, "remove", "--retry", name], check=True)


def test_front_shrink_with_a_held_remap_fails_in_time(servers, fastpath,
                                                      tmp_path):
    """A read the front remapped onto a target that holds it: a shrink
    (after the detach a shrink needs) waits for the front's remaps to
    end, at most the device's I/O timeout: it fails with EBUSY in time,
    changes nothing, and the read ends once the target lets it go."""
    with held_target(tmp_path) as (target, hold):
        dev = Stacker(servers, tmp_path / "request", "--front",
                      "--io-timeout", "2")
        assert dev.add(target) == "index 0"
        fastpath.attach(prog("loop"), dev.dev)
        hold(True)
        got = {}
        reader = threading.Thread(
            target=lambda: got.update(data=direct_read(dev.dev, 8 * MiB,
                                                       4096)))
        reader.start()
        try:
            # the front counts a remapped bio in flight in its iostats
            inflight = f"/sys/block/{os.path.basename(dev.dev)}/inflight"
            wait_for(lambda: int(Path(inflight).read_text().split()[0]) or
                     not reader.is_alive(), T_CMD, "the read in flight")
            assert reader.is_alive(), "the held read ended: not held"
            detach_ok(dev.dev)
            start = time.monotonic()
            rc, _, err = hybdctl("resize", dev.dev, str(32 * MiB))
            took = time.monotonic() - start
            assert rc == 1 and "did not end in time" in err, (rc, err)
            assert took < T_CMD, took
            assert info(dev.dev)["size"] == 64 * MiB
        finally:
            hold(False)
            reader.join(T_IO)
        assert got.get("data") == bytes(4096), "the held read failed"
        # nothing is held now: the shrink drains and is done
        rc, _, err = hybdctl("resize", dev.dev, str(32 * MiB))
        assert rc == 0, err
        assert info(dev.dev)["size"] == 32 * MiB
        dev.srv.stop()
