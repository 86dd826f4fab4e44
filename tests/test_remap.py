# SPDX-License-Identifier: GPL-2.0
"""The remap fast path (HYBD_F_REMAP): a program's submit() names a
backing target and an offset (hybd_bpf_io_remap()), returns
HYBD_BPF_REMAPPED, and the kernel serves the request there with direct I/O
on the request's own pages: no trip to user space.

bpf/loop.bpf.o remaps everything to the same offset of target 0, which
`hybd-loop --remap FILE` registers: a whole loop device in BPF, whose
server serves only what the kernel refuses, or everything while no
program is attached.  The file lives on ext4 on a loop device (direct I/O
works there as on a disk); a block-device target is a kernel loop device.
"""

import contextlib
import ctypes
import errno
import mmap
import os
import signal
import struct
import subprocess

import pytest

from hybdbpf import (delta, detach_ok, disk_completed_ios, fastpath,  # noqa: F401
                     need_bpf, prog, settle, stats, suite_prog)
from hybdlib import (LOOP, REPO, T_CMD, T_IO, direct_read, direct_write,
                     fio, first_difference, fio_verify, hybdctl, hybdctl_json,
                     io_errno, io_uring_usable, loop_device, need_built, need_tool, pattern,
                     record, run, sysfs_queue, wait_for)
from test_backing import (Stacker, dio_fs,  # noqa: F401 (fixture)
                          unlink_and_wait_freed)
from test_recovery import Background, let_run, seeded, wait_waiting

MiB = 1 << 20
BLOCK = 4096
CHURNDRV = REPO / "tests" / "helpers" / "churndrv"


@pytest.fixture(autouse=True)
def _built():
    need_bpf()
    need_built(LOOP, "examples/loop/hybd-loop")


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def start_loop(servers, target, *args):
    """hybd-loop --remap over target, 2 queues; returns the server."""
    srv = servers.start([LOOP, "--queues", "2", "--remap", *args, target])
    assert "backing target 0: " in srv.output(), srv.output()
    settle()        # udev's probe reads the new disk before any program
    return srv


def prog_globals(dev):
    """The attached program's .bss globals, signed."""
    maps = hybdctl_json("stats", str(dev), "--maps")["maps"]
    bss = [m for m in maps if m.endswith(".bss")]
    assert len(bss) == 1, maps
    return {k: v - (1 << 64) if v >= 1 << 63 else v
            for k, v in maps[bss[0]].items()}


def file_read(path, offset, length):
    """Read the backing target the way any program does (page cache)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def file_write(path, offset, data):
    fd = os.open(path, os.O_WRONLY)
    try:
        assert os.pwrite(fd, data, offset) == len(data)
        os.fsync(fd)
    finally:
        os.close(fd)


def assert_all_remapped(after, before):
    """Everything the block layer sent since before was served by the
    remap, once."""
    s = delta(after, before)
    total = (s["reads"] + s["writes"] + s["flushes"] + s["discards"] +
             s["write_zeroes"])
    assert s["slow_issued"] == 0, f"the server saw requests: {s}"
    assert s["remapped"] == s["fast_done"] == total > 0, s
    assert (s["fast_errors"], s["remap_refused"], s["bpf_bad_ret"]) == \
        (0, 0, 0), s


def check_offsets(dev, path, size, seed):
    """What the device writes lands in the target at the same offset, and
    what the target holds is what the device reads."""
    for i, off in enumerate((0, 5 * MiB + 8 * BLOCK, size - 64 * 1024)):
        data = pattern(f"{seed}-{i}", 64 * 1024)
        # the target's page cache holds the old data of the range: a
        # remapped write must not leave it there
        file_read(path, off, len(data))
        direct_write(dev, off, data)
        got = file_read(path, off, len(data))
        assert got == data, f"target at {off}: {first_difference(got, data)}"
        back = pattern(f"{seed}-back-{i}", 64 * 1024)
        file_write(path, off, back)
        got = direct_read(dev, off, len(back))
        assert got == back, f"device at {off}: {first_difference(got, back)}"


CASES = [("512", 1, "1M"), ("4k", 32, "8M"), ("128k", 32, "16M"),
         ("1m", 1, "16M")]


@pytest.mark.time_limit(900)
@pytest.mark.parametrize("kind", ["file", "bdev"])
def test_bpf_loop_fio_verify(dio_fs, servers, fastpath, tmp_path, kind):
    """fio --verify at 512 B to 1 MiB, QD1 and QD32, 2 jobs on 2 queues,
    on the BPF loop device over a file and over a block device: no error,
    every request served by the remap, and the data where it belongs.
    Over the file, the writes that allocate are the ones ext4 cannot start
    without waiting (IOCB_NOWAIT): they count in remap_waited."""
    mnt, _ = dio_fs
    size = 64 * MiB
    if kind == "file":
        target = sparse(mnt / "loop.img", size)
        ctx = None
    else:
        ctx = loop_device(sparse(tmp_path / "disk.img", size))
        target = ctx.__enter__()
    try:
        srv = start_loop(servers, target, "--block-size", "512")
        # remapped writes are direct I/O from the request's own pages: a
        # file system on the device keeps them stable until written
        assert sysfs_queue(srv.dev, "stable_writes") == "1"
        fastpath.attach(prog("loop-count"), srv.dev)
        base = stats(srv.dev)
        for bs, qd, per_job in CASES:
            fio_verify(srv.dev, bs, per_job, 2, iodepth=qd)
        mid = stats(srv.dev)
        check_offsets(srv.dev, target, size, kind)
        s = stats(srv.dev)
        assert_all_remapped(s, base)
        assert prog_globals(srv.dev)["remap_errors"] == 0
        if kind == "file":
            # ext4 cannot write into the sparse file's holes without
            # allocating: those writes were started again where they may
            # wait, and read back right
            assert delta(s, base)["remap_waited"] > 0, s
            assert delta(s, base)["remap_direct"] == 0, s
        else:
            # fio's QD1 O_DIRECT calls are issued inside their
            # submit_bio(): queue_rq cloned them onto the target; not
            # check_offsets', whose ranges the target's page cache holds
            d = delta(mid, base)
            assert 0 < d["remap_direct"] < d["reads"] + d["writes"], d
            d = delta(s, mid)
            assert d["remap_direct"] == 0 < d["remapped"], d
        record(f"test_bpf_loop_fio_verify[{kind}]",
               f"remapped={s['remapped']} reads={s['reads']} "
               f"writes={s['writes']} waited={s['remap_waited']} "
               f"direct={s['remap_direct']}")
        detach_ok(srv.dev)
        srv.stop()
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)


def test_block_device_target_errors_reach_the_submitter(servers, fastpath,
                                                        tmp_path):
    """A block device target that fails I/O (the middle third of a dm
    device is dm's error target): remapped reads and writes there fail
    with EIO, those queue_rq cloned onto the target inside the submitter's
    submit_bio() (O_DIRECT) and those through the page cache alike; the
    rest keeps its data."""
    third = 4 * MiB
    dm = f"hybd-err-{os.getpid()}"
    with loop_device(sparse(tmp_path / "disk.img", 2 * third)) as loop:
        s = third // 512
        run([need_tool("dmsetup"), "create", dm], check=True,
            input=f"0 {s} linear {loop} 0\n{s} {s} error\n"
                  f"{2 * s} {s} linear {loop} {s}\n")
        srv = None
        try:
            srv = start_loop(servers, f"/dev/mapper/{dm}")
            fastpath.attach(prog("loop-count"), srv.dev)
            base = stats(srv.dev)
            good = pattern("dm-good", 64 * 1024)
            for off in (third - len(good), 2 * third):
                direct_write(srv.dev, off, good)
                assert direct_read(srv.dev, off, len(good)) == good, off
            for off in (third, 2 * third - BLOCK):
                assert io_errno(direct_read, srv.dev, off, BLOCK) == \
                    errno.EIO, off
                assert io_errno(direct_write, srv.dev, off,
                                pattern(f"w{off}", BLOCK)) == errno.EIO, off
            mid = stats(srv.dev)
            d = delta(mid, base)
            assert d["remap_direct"] == d["remapped"] >= 8, d
            assert d["fast_errors"] == 4 and d["slow_issued"] == 0, d
            assert prog_globals(srv.dev)["remap_errors"] == 4
            with open(srv.dev, "rb", buffering=0) as f:
                f.seek(third + BLOCK)
                with pytest.raises(OSError) as e:
                    f.read(BLOCK)
                assert e.value.errno == errno.EIO
            d = delta(stats(srv.dev), mid)
            assert d["fast_errors"] > 0 and d["slow_issued"] == 0, d
            for off in (third - len(good), 2 * third):
                assert direct_read(srv.dev, off, len(good)) == good, off
            detach_ok(srv.dev)
        finally:
            if srv is not None:
                srv.stop()
            run(["dmsetup", "remove", "--retry", dm], check=True)


def test_block_device_target_split_at_depth_1(servers, fastpath, tmp_path):
    """One tag and requests of 64 KiB: a 1 MiB O_DIRECT read or write is
    split, and the remainder waits for the tag the first part holds.  The
    first part must not wait behind the remainder (its clones would, on
    current->bio_list): it goes to a worker, and all completes with the
    right data."""
    with loop_device(sparse(tmp_path / "disk.img", 16 * MiB)) as loop:
        srv = start_loop(servers, loop, "--depth", "1", "--max-io", "64K")
        fastpath.attach(prog("loop"), srv.dev)
        base = stats(srv.dev)
        data = pattern("split-1m", MiB)
        direct_write(srv.dev, 3 * MiB, data)
        got = direct_read(srv.dev, 3 * MiB, MiB)
        assert got == data, first_difference(got, data)
        d = delta(stats(srv.dev), base)
        assert_all_remapped(stats(srv.dev), base)
        # 16 requests each way; those with a remainder behind them did not
        # clone, the last of each split may have
        assert d["remapped"] >= 32 and d["remap_direct"] < d["remapped"], d
        detach_ok(srv.dev)
        srv.stop()


def test_block_device_target_batched_submissions(servers, fastpath,
                                                tmp_path):
    """io_uring or aio reaping and submitting 16 at a time: queue_rq runs
    in the flush of the submitter's plug, where clones would join the plug
    being flushed, so the workers start those remaps; then with 4 tags on
    the target for 64 requests in flight, where most cannot start at
    once.  Everything remapped, fio --verify reads every block back."""
    batch = ("--iodepth_batch_submit=16", "--iodepth_batch_complete_min=16")
    with loop_device(sparse(tmp_path / "disk.img", 32 * MiB)) as loop:
        srv = start_loop(servers, loop)
        fastpath.attach(prog("loop-count"), srv.dev)
        base = stats(srv.dev)
        fio_verify(srv.dev, "4k", "8M", 2, iodepth=32, extra=batch)
        mid = stats(srv.dev)
        assert_all_remapped(mid, base)
        d = delta(mid, base)
        # a batch's flush goes to the workers (a lone submission, verify's
        # first read of each block, is issued inside its submit_bio())
        assert d["remap_direct"] < d["remapped"] // 2, d
        name = os.path.basename(loop)
        with open(f"/sys/block/{name}/queue/nr_requests", "w") as f:
            f.write("4")
        fio_verify(srv.dev, "4k", "8M", 2, iodepth=32, extra=batch)
        s = stats(srv.dev)
        assert_all_remapped(s, mid)
        assert delta(s, mid)["remap_waited"] > 0, delta(s, mid)
        assert prog_globals(srv.dev)["remap_errors"] == 0
        record("test_block_device_target_batched_submissions",
               f"remapped={s['remapped']} direct={s['remap_direct']} "
               f"waited={s['remap_waited']}")
        detach_ok(srv.dev)
        srv.stop()


@pytest.mark.time_limit(900)
def test_attach_replace_detach_under_fio_verify(dio_fs, servers, fastpath):
    """The loop program comes and goes under fio --verify: no error, every
    request completed once, and with no program the server serves all."""
    mnt, _ = dio_fs
    rng = seeded("remap-cycle")
    target = sparse(mnt / "loop.img", 64 * MiB)
    srv = start_loop(servers, target)
    jobs, qd = 2, 32
    fio = Background(lambda: fio_verify(srv.dev, "4k", "16M", jobs, qd))
    try:
        let_run(fio, rng, 1.0)
        for step in range(6):
            if step % 3 == 0:
                fastpath.attach(prog("loop"), srv.dev)
            elif step % 3 == 1:
                fastpath.attach(prog("loop"), srv.dev, replace=True)
            else:
                detach_ok(srv.dev)
                at_detach = stats(srv.dev)
                # Nothing is remapped while no program is attached.  The
                # remaps started before the detach (at most fio's jobs x
                # its depth) may still be ending, and under a debug
                # kernel some take longer than the server's next few
                # dozen requests: wait for a window in which the server
                # served 32 more and no remap ended.  A detach that left
                # the program running never gets one (fio keeps going).
                # fio may be between runs: progress, not sleep.
                def quiet():
                    before = stats(srv.dev)
                    after = served_more(srv.dev, before)
                    return after["remapped"] == before["remapped"]
                wait_for(quiet, T_IO, "a window with no remap ending")
                late = stats(srv.dev)["remapped"] - at_detach["remapped"]
                assert late <= jobs * qd, (late, at_detach)
            let_run(fio, rng, 1.0)
    finally:
        fio.stop()
    s = stats(srv.dev)
    assert s["slow_issued"] == s["slow_done"] > 0, s
    assert s["remapped"] > 0, s
    assert s["fast_done"] + s["slow_done"] == disk_completed_ios(srv.dev), s
    assert s["fast_done"] + s["slow_done"] == (
        s["reads"] + s["writes"] + s["flushes"] + s["discards"] +
        s["write_zeroes"]), s
    for k in ("slow_errors", "fast_errors", "failed_dead", "remap_refused",
              "bpf_bad_ret", "timed_out"):
        assert s[k] == 0, (k, s)
    record("test_attach_replace_detach_under_fio_verify",
           f"remapped={s['remapped']} slow_done={s['slow_done']} "
           f"fio_runs={fio.runs}")
    srv.stop()


def served_more(dev, since, n=32):
    """Wait until the server has completed n more requests than in the
    stats since; return the stats then."""
    now = {}

    def more():
        now.update(stats(dev))
        return now["slow_done"] >= since["slow_done"] + n
    wait_for(more, T_IO, f"{dev}: the server serving {n} more requests")
    return now


def test_server_death_with_remaps_in_flight(dio_fs, servers, fastpath):
    """SIGKILL of the server while fio keeps QD32 of remaps in flight: the
    device dies, every request ends (remaps with their own status), and
    once the last remapped write has ended the kernel syncs the backing
    file and lets go of it, while the dead device is still there: its
    space comes back when it is unlinked."""
    mnt, _ = dio_fs
    fio_exe = need_tool("fio")
    target = mnt / "loop.img"
    with open(target, "wb") as f:
        for _ in range(32):
            f.write(os.urandom(MiB))
        os.fsync(f.fileno())
    srv = start_loop(servers, target)
    fastpath.attach(prog("loop"), srv.dev)
    base = stats(srv.dev)
    fio = subprocess.Popen(
        [fio_exe, "--name=load", f"--filename={srv.dev}", "--direct=1",
         "--ioengine=libaio", "--iodepth=32", "--rw=randrw", "--bs=16k",
         "--numjobs=2", "--time_based", "--runtime=60", "--size=32M"],
        cwd="/tmp", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    try:
        wait_for(lambda: stats(srv.dev)["remapped"] > 2000, T_IO,
                 "remaps under way")
        srv.kill()
        # the kernel fails the rest: fio ends with errors, and soon
        _, err = fio.communicate(timeout=T_IO)
        assert fio.returncode != 0, err
    finally:
        if fio.poll() is None:
            fio.kill()
            fio.wait()
    name = os.path.basename(srv.dev)
    wait_for(lambda: open(f"/sys/block/{name}/inflight").read().split() ==
             ["0", "0"], T_CMD, "nothing in flight")
    s = stats(srv.dev)
    assert s["remapped"] > 2000 and s["failed_dead"] > 0, s
    assert s["slow_issued"] == base["slow_issued"], s
    unlink_and_wait_freed(mnt, target)
    detach_ok(srv.dev)
    rc, out, err = hybdctl("del", srv.dev)
    assert rc == 0, out + err
    wait_for(lambda: not os.path.exists(srv.dev), T_CMD, "device gone")


@pytest.mark.time_limit(900)
def test_server_death_in_recovery_mode_holds_then_remaps_again(
        dio_fs, servers, fastpath):
    """With a recovery timeout, the targets go with the dead server: the
    kernel refuses the remaps, the requests wait for the next server, which
    registers the file again, and fio --verify sees no error."""
    mnt, _ = dio_fs
    rng = seeded("remap-recovery")
    target = sparse(mnt / "loop.img", 64 * MiB)
    srv = start_loop(servers, target, "--recovery", "60")
    fastpath.attach(prog("loop"), srv.dev)
    fio = Background(lambda: fio_verify(srv.dev, "4k", "16M", 2))
    held = []
    try:
        for _ in range(3):
            # Kill while remaps flow, not while fio waits only on requests
            # the last server still holds (then it would send nothing
            # while no server is attached).
            done = stats(srv.dev)["remapped"]
            wait_for(lambda: stats(srv.dev)["remapped"] >= done + 64, T_IO,
                     "remaps flowing")
            let_run(fio, rng, 1.0)
            old = srv
            old.kill()
            wait_waiting(old)
            # The targets went with the server: a read now is refused and
            # held.  (fio may send nothing meanwhile: it may be waiting
            # for requests the server held, so read past its regions.)
            refused = stats(old.dev)["remap_refused"]
            reader = Background(lambda: held.append(
                direct_read(old.dev, 60 * MiB, 4096)), once=True)
            wait_for(lambda: stats(old.dev)["remap_refused"] > refused,
                     T_IO, "a remap refused while no server is attached")
            srv = servers.start([LOOP, "--attach", "--id", old.id, "--remap",
                                 target])
            assert srv.dev == old.dev
            reader.stop()
            assert held.pop() == bytes(4096)
    finally:
        fio.stop()
    detach_ok(srv.dev)
    s = stats(srv.dev)
    assert s["remapped"] > 0 and s["remap_refused"] > 0, s
    assert s["slow_issued"] == s["slow_done"], s
    assert s["fast_done"] + s["slow_done"] == (
        s["reads"] + s["writes"] + s["flushes"] + s["discards"] +
        s["write_zeroes"]), s
    for k in ("slow_errors", "fast_errors", "failed_dead", "timed_out"):
        assert s[k] == 0, (k, s)
    srv.stop()


def test_bad_remaps_are_refused_counted_and_served(dio_fs, servers,
                                                   fastpath):
    """Every misuse of hybd_bpf_io_remap() gets its errno and counts in
    remap_refused; the request is then served by the server, with the
    right data."""
    mnt, _ = dio_fs
    target = sparse(mnt / "loop.img", 16 * MiB)
    srv = start_loop(servers, target.as_posix(), "--remap=ro")
    srv_out = srv.output()
    assert "(read-only)" in srv_out, srv_out
    blocks = 16
    data = [pattern(f"bad-{i}", BLOCK) for i in range(blocks)]
    fastpath.attach(suite_prog("remapbad"), srv.dev)
    before = stats(srv.dev)
    for i in range(blocks):
        direct_write(srv.dev, i * BLOCK, data[i])
    mid = stats(srv.dev)
    g = prog_globals(srv.dev)
    assert g["got_write"] == -errno.EROFS, g
    # a write is refused in submit() and in complete()
    assert mid["remap_refused"] - before["remap_refused"] == 2 * blocks
    assert mid["slow_done"] - before["slow_done"] == blocks

    for i in range(blocks):
        case = i % 8
        if case == 6:
            assert io_errno(direct_read, srv.dev, i * BLOCK, BLOCK) == \
                errno.EIO, i
        elif case == 7:
            assert io_errno(direct_read, srv.dev, i * BLOCK, BLOCK) == \
                errno.ENODATA, i
        else:
            got = direct_read(srv.dev, i * BLOCK, BLOCK)
            assert got == data[i], (i, first_difference(got, data[i]))
    after = stats(srv.dev)
    g = prog_globals(srv.dev)
    want = {"got0": -errno.ENOENT, "got1": -errno.ERANGE,
            "got2": -errno.EINVAL, "got3": -errno.EINVAL,
            "got4_first": 0, "got4": -errno.EALREADY, "got5": 0, "got7": 0,
            "got_complete": -errno.EPERM}
    assert {k: g[k] for k in want} == want, g
    d = {k: after[k] - mid[k] for k in after}
    # per 8 blocks: 5 refused in submit(), and complete() is refused for
    # the 5 that went to the server and the one remapped
    assert d["remap_refused"] == 2 * (5 + 6), d
    assert (d["remapped"], g["remapped_reads"], g["completes_remap"]) == \
        (2, 2, 2), (d, g)
    assert d["bpf_bad_ret"] == 2, d
    assert d["slow_done"] == d["slow_issued"] == 10, d
    assert d["fast_errors"] == 4, d
    detach_ok(srv.dev)
    srv.stop()


def test_short_read_past_eof_discard_write_zeroes_and_flush(dio_fs, servers,
                                                           fastpath):
    """A target file truncated under the device reads as zeros past its
    end; discard punches a hole, write-zeroes zeroes, flush syncs, all in
    the kernel."""
    mnt, _ = dio_fs
    blkdiscard = need_tool("blkdiscard")
    target = sparse(mnt / "loop.img", 16 * MiB)
    srv = start_loop(servers, target)
    fastpath.attach(prog("loop"), srv.dev)
    base = stats(srv.dev)

    tail = pattern("tail", 2 * MiB)
    direct_write(srv.dev, 14 * MiB, tail)
    os.truncate(target, 15 * MiB)
    got = direct_read(srv.dev, 14 * MiB, 2 * MiB)
    want = tail[:MiB] + bytes(MiB)
    assert got == want, first_difference(got, want)
    os.truncate(target, 16 * MiB)

    head = pattern("head", 2 * MiB)
    direct_write(srv.dev, 0, head)
    fd = os.open(srv.dev, os.O_RDWR)
    try:
        before = stats(srv.dev)
        os.fsync(fd)
    finally:
        os.close(fd)
    s = stats(srv.dev)
    assert s["flushes"] > before["flushes"], s
    blocks = os.stat(target).st_blocks
    res = run([blkdiscard, "-o", "0", "-l", str(MiB), srv.dev], timeout=T_CMD)
    assert res.returncode == 0, res.stderr
    assert os.stat(target).st_blocks <= blocks - MiB // 512, \
        "discard punched no hole"
    res = run([blkdiscard, "-z", "-o", str(MiB), "-l", str(MiB), srv.dev],
              timeout=T_CMD)
    assert res.returncode == 0, res.stderr
    assert file_read(target, 0, 2 * MiB) == bytes(2 * MiB)
    assert direct_read(srv.dev, 0, 2 * MiB) == bytes(2 * MiB)
    s = stats(srv.dev)
    assert s["discards"] > 0 and s["write_zeroes"] > 0, s
    assert_all_remapped(s, base)
    detach_ok(srv.dev)
    srv.stop()


def test_barrier_and_feature(dio_fs, servers):
    """HYBD_F_REMAP is offered; HYBD_SRV_REMAP_BARRIER returns at once with
    nothing in flight, and refuses an argument."""
    import hybd_uapi as u
    from test_backing import Served
    with u.Control() as ctl:
        e, _, feats = u.features(ctl)
        assert e == 0 and feats & u.F_REMAP, (e, feats)
    s = Served()
    try:
        assert u._libc.ioctl(s.fd, u.SRV_REMAP_BARRIER, 0) == 0
        r = u._libc.ioctl(s.fd, u.SRV_REMAP_BARRIER, 1)
        assert r < 0 and u.ctypes.get_errno() == errno.EINVAL
    finally:
        s.remove()


@pytest.mark.time_limit(900)
def test_remap_workers_count_runs_and_poll_with_poll_ns(dio_fs, servers,
                                                        fastpath):
    """A file's remapped reads and writes start in runs of a queue's
    workers, counted (remap_runs), several requests a run under load.
    With HYBD_DEV_F_REMAP_POLL (hybd-loop --remap --poll-ns) a worker out
    of requests polls for more before it lets go: fio --verify at QD32
    over two queues reads back all it wrote, and with one submitter at
    QD32 (its worker on the other CPU) polling finds requests
    (remap_polled).  Without the flag a worker never polls."""
    import hybd_uapi as u
    with u.Control() as ctl:
        e, _, feats = u.features(ctl)
        assert e == 0 and feats & u.F_REMAP_POLL, (e, feats)
    mnt, _ = dio_fs
    for poll_ns in (0, 1000000):
        target = sparse(mnt / f"poll-{poll_ns}.img", 32 * MiB)
        srv = start_loop(servers, target, "--poll-ns", str(poll_ns))
        info = hybdctl_json("info", str(srv.dev))
        assert info["remap_poll"] is bool(poll_ns), info
        assert info["poll_ns"] == poll_ns, info
        fastpath.attach(prog("loop"), srv.dev)
        base = stats(srv.dev)
        fio_verify(srv.dev, "4k", "8M", 2, iodepth=32)
        mid = stats(srv.dev)
        assert_all_remapped(mid, base)
        d = delta(mid, base)
        assert 0 < d["remap_runs"] < d["remapped"], d
        one_submitter_qd32(srv.dev)
        s = stats(srv.dev)
        assert_all_remapped(s, mid)
        p = delta(s, mid)
        if poll_ns and (os.cpu_count() or 1) >= 2:
            assert p["remap_polled"] > 0, p
        if not poll_ns:
            assert delta(s, base)["remap_polled"] == 0, (s, base)
        record(f"remap poll_ns={poll_ns}",
               f"verify: remapped={d['remapped']} runs={d['remap_runs']} "
               f"polled={d['remap_polled']}; one submitter: "
               f"remapped={p['remapped']} runs={p['remap_runs']} "
               f"polled={p['remap_polled']}")
        detach_ok(srv.dev)
        srv.stop()


def one_submitter_qd32(dev, seconds=2):
    """fio: one job of 4 KiB random reads at QD32 for a few seconds."""
    engine = "io_uring" if io_uring_usable() else "libaio"
    rc, data, res = fio(["--name=qd32", f"--filename={dev}", "--direct=1",
                         f"--ioengine={engine}", "--iodepth=32",
                         "--rw=randread", "--bs=4k", "--size=8M",
                         "--time_based", f"--runtime={seconds}"])
    assert rc == 0 and data is not None, res.stderr
    assert data["jobs"][0]["error"] == 0, data["jobs"][0]


def pfn_of(addr):
    """The page frame behind virtual address addr of this process (root
    reads it in /proc/self/pagemap)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // mmap.PAGESIZE * 8)
        entry = struct.unpack("<Q", f.read(8))[0]
    assert entry >> 63, f"page at {addr:#x} not present"
    return entry & ((1 << 55) - 1)


def pages_apart(m, pages):
    """Fault in the first pages pages of mmap m, each in a page frame that
    does not follow its neighbour's: a buffer across them is then as many
    segments as pages, never merged into one."""
    ref = ctypes.c_char.from_buffer(m)
    base = ctypes.addressof(ref)
    del ref     # m can be closed again
    size = mmap.PAGESIZE
    spacers = []
    try:
        for i in range(pages):
            m[i * size] = 1
            for _ in range(100):
                if i == 0 or pfn_of(base + i * size) != \
                        pfn_of(base + (i - 1) * size) + 1:
                    break
                # another frame for this page: the one it lets go of
                # would come straight back, so a spacer page takes it
                m.madvise(mmap.MADV_DONTNEED, i * size, size)
                spacer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE |
                                   mmap.MAP_ANONYMOUS)
                spacer[0] = 1
                spacers.append(spacer)
                m[i * size] = 1
            else:
                pytest.fail(f"page {i} stays next to page {i - 1}")
    finally:
        for spacer in spacers:
            spacer.close()


def dio_at_buffer_offset(dev, offset, length, buf_off, data=None):
    """One O_DIRECT read (or write of data) of length bytes at offset,
    through a buffer that starts buf_off bytes into a fresh page, across
    page frames that are apart: its segments are then not whole 4 KiB
    blocks."""
    pages = (buf_off + length + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    m = mmap.mmap(-1, pages * mmap.PAGESIZE,
                  flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pages_apart(m, pages)
    fd = os.open(dev, (os.O_RDWR if data else os.O_RDONLY) | os.O_DIRECT)
    try:
        with memoryview(m) as whole, \
                whole[buf_off:buf_off + length] as view:
            if data is None:
                assert os.preadv(fd, [view], offset) == length
                return bytes(view)
            view[:] = data
            assert os.pwritev(fd, [view], offset) == length
            return None
    finally:
        os.close(fd)
        m.close()


def test_memory_the_target_cannot_take_is_refused_and_served(
        servers, fastpath, tmp_path):
    """A target with 4 KiB sectors needs 4 KiB segments; a request whose
    buffer starts 512 bytes into a page has smaller ones.  The remap is
    refused (EINVAL, counted) and the server serves it, instead of the
    target failing it with EIO."""
    size = 16 * MiB
    with loop_device(sparse(tmp_path / "disk.img", size), "-b",
                     "4096") as target:
        srv = start_loop(servers, target, "--block-size", "4096")
        fastpath.attach(prog("loop"), srv.dev)
        base = stats(srv.dev)
        blocks = 16
        for i in range(blocks):
            data = pattern(f"odd-{i}", BLOCK)
            dio_at_buffer_offset(srv.dev, i * BLOCK, BLOCK, 512, data)
            got = dio_at_buffer_offset(srv.dev, i * BLOCK, BLOCK, 512)
            assert got == data, (i, first_difference(got, data))
            got = file_read(target, i * BLOCK, BLOCK)
            assert got == data, (i, first_difference(got, data))
        # aligned buffers are still remapped
        direct_write(srv.dev, 0, pattern("aligned", 64 * 1024))
        assert direct_read(srv.dev, 0, 64 * 1024) == \
            pattern("aligned", 64 * 1024)
        s = delta(stats(srv.dev), base)
        assert s["fast_errors"] == s["slow_errors"] == 0, s
        # every odd request (a write and a read per block) was refused
        # once, and served by the server
        assert s["remap_refused"] == 2 * blocks, s
        assert s["slow_done"] >= 2 * blocks and s["remapped"] >= 2, s
        record("test_memory_the_target_cannot_take_is_refused_and_served",
               f"refused={s['remap_refused']} slow={s['slow_done']} "
               f"remapped={s['remapped']}")
        detach_ok(srv.dev)
        srv.stop()


@pytest.mark.time_limit(900)
@pytest.mark.parametrize("cache", ["writeback", "writethrough"])
def test_target_deleted_and_added_again_under_fio_verify(dio_fs, servers,
                                                         cache):
    """tests/helpers/churndrv takes its target off (HYBD_SRV_DEL_BACKING)
    every 30 ms and registers it again 5 ms later, while fio --verify
    writes, fsyncs and reads back at QD32 on 2 queues.  Remaps in flight
    on the deleted target end there (it is retired, not dropped), those
    the kernel refuses while it is off are served by the server, flushes
    go either way: no error, every block read back as written, the file
    holds what the device holds, and once the device is gone nothing is
    left of the retired targets: the file's space comes back."""
    need_built(CHURNDRV, "tests/helpers/churndrv")
    mnt, _ = dio_fs
    size = 32 * MiB
    target = sparse(mnt / "churn.img", size)
    cmd = [CHURNDRV, "--bpf", prog("loop"), "--churn-ms", "30",
           "--gap-ms", "5"]
    if cache == "writethrough":
        cmd.append("--no-write-cache")
    srv = servers.start([*cmd, target])
    base = stats(srv.dev)
    for _ in range(3):
        fio_verify(srv.dev, "16k", "16M", 2, extra=["--fsync=8"])
    srv.proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: any(line.startswith("churn stopped:")
                         for line in srv.out), T_CMD, "the churn to stop")
    s = delta(stats(srv.dev), base)
    # both ways, and every refusal was the missing target's
    assert s["remapped"] > 0 and s["slow_issued"] > 0, s
    assert s["remap_refused"] >= s["slow_issued"] > 0, s
    assert (s["fast_errors"], s["slow_errors"], s["bpf_bad_ret"]) == \
        (0, 0, 0), s
    if cache == "writeback":
        assert s["flushes"] > 0, s
    got = direct_read(srv.dev, 0, size)
    assert got == file_read(target, 0, size), \
        first_difference(got, file_read(target, 0, size))
    srv.stop()
    line = [x for x in srv.out if x.startswith("churndrv:")]
    assert line and "errors=0 exit=0" in line[0], srv.output()
    churns = int(line[0].split("churns=")[1].split()[0])
    assert churns >= 5, srv.output()
    record(f"test_target_deleted_and_added_again_under_fio_verify[{cache}]",
           f"churns={churns} remapped={s['remapped']} "
           f"served={s['slow_issued']} refused={s['remap_refused']}")
    wait_for(lambda: not os.path.exists(srv.dev), T_CMD, "device gone")

    # what fio's random writes allocated of the sparse file
    allocated = os.stat(target).st_blocks * 512
    assert allocated >= 8 * MiB, allocated
    unlink_and_wait_freed(mnt, target, allocated - MiB)


def disk_flushes(dev):
    """Flush requests dev's disk completed (/sys/block/NAME/stat)."""
    name = os.path.basename(os.path.realpath(dev))
    with open(f"/sys/block/{name}/stat") as f:
        return int(f.read().split()[15])


@pytest.mark.parametrize("front", [False, True], ids=["requests", "front"])
def test_write_through_set_in_sysfs_makes_remapped_writes_durable(
        dio_fs, servers, fastpath, front):
    """A device with a write cache whose disk is set to "write through"
    in sysfs gets no flush any more (the block layer drops them): a write
    remapped onto a file (requests) or a block device (the front) must
    then be durable when it completes.  Seen on the disk under the
    target's file system: a flush for each write, where write back had
    none; for the front, set on the disk behind it."""
    mnt, fs_disk = dio_fs
    img = mnt / "target.img"
    with open(img, "wb") as f:      # allocated: writes change no metadata
        f.write(bytes(16 * MiB))
        os.fsync(f.fileno())
    with contextlib.ExitStack() as stack:
        if front:
            target = stack.enter_context(loop_device(img))
            srv = start_loop(servers, target, "--front")
        else:
            srv = start_loop(servers, img)
        fastpath.attach(prog("loop"), srv.dev)
        name = os.path.basename(srv.dev) + ("q" if front else "")
        knob = f"/sys/block/{name}/queue/write_cache"
        data = pattern("write-through", BLOCK)

        def flushes_of(n):
            before = disk_flushes(fs_disk)
            for i in range(n):
                direct_write(srv.dev, i * BLOCK, data)
            return disk_flushes(fs_disk) - before

        base = stats(srv.dev)
        back = flushes_of(8)
        with open(knob, "w") as f:
            f.write("write through")
        try:
            through = flushes_of(8)
        finally:
            with open(knob, "w") as f:
                f.write("write back")
        d = delta(stats(srv.dev), base)
        assert d["remapped"] == 16 and d["slow_issued"] == 0, d
        # write back: the journal's own commit at most, not one a write
        assert back < 8, back
        assert through >= 8, (back, through)
        assert direct_read(srv.dev, 0, BLOCK) == data
        detach_ok(srv.dev)
        srv.stop()


def test_discard_on_a_block_device_target_is_checked_as_blkdiscard(
        servers, fastpath, tmp_path):
    """A discard remapped onto a block device goes as the device's own
    BLKDISCARD would: what its page cache held of the range goes too (a
    buffered read of the target sees the discard), and a read-only
    target refuses it and keeps its data."""
    img = tmp_path / "target.img"
    data = pattern("discard-target", 8 * MiB)
    with open(img, "wb") as f:
        f.write(data)
    blkdiscard = need_tool("blkdiscard")
    with loop_device(img) as target:
        # a server that takes discards (hybd-loop over a block device
        # offers none), every request remapped to the same offset
        srv = Stacker(servers, tmp_path / "request", "--size", "8M")
        assert srv.add(target) == "index 0"
        fastpath.attach(prog("loop"), srv.dev)
        with open(target, "rb") as f:      # the target's page cache
            assert os.pread(f.fileno(), MiB, MiB) == data[MiB:2 * MiB]
            base = stats(srv.dev)
            res = run([blkdiscard, "-o", str(MiB), "-l", str(MiB), srv.dev])
            assert res.returncode == 0, res.stderr
            d = delta(stats(srv.dev), base)
            # (udev's probe after blkdiscard's close reads, remapped too)
            assert d["discards"] > 0 and d["slow_issued"] == 0, d
            assert os.pread(f.fileno(), MiB, MiB) == bytes(MiB), \
                "the target's page cache kept what was discarded"
        run(["blockdev", "--setro", target], check=True)
        try:
            res = run([blkdiscard, "-o", str(4 * MiB), "-l", str(MiB),
                       srv.dev])
            assert res.returncode != 0, "a read-only target took a discard"
        finally:
            run(["blockdev", "--setrw", target], check=True)
        assert direct_read(target, 4 * MiB, MiB) == data[4 * MiB:5 * MiB]
        detach_ok(srv.dev)
        srv.srv.stop()


@pytest.mark.parametrize("program,flush_errno", [
    ("loop", 0), ("flushpass", 0), ("flushdone", 0),
    ("flusheio", errno.EIO)])
def test_a_flush_syncs_remapped_writes_whatever_its_verdict(
        dio_fs, servers, fastpath, tmp_path, program, flush_errno):
    """A write remapped onto a file, then a flush of the device: the file
    is synced before the flush completes, whether the program remaps the
    flush (loop), passes it to a server that keeps nothing of the target
    (stackdrv: memory), completes it, or fails it.  Seen on the disk under
    the target's file system, whose own commits are held off meanwhile."""
    mnt, fs_disk = dio_fs
    run(["mount", "-o", "remount,commit=600", mnt], check=True)
    img = mnt / "target.img"
    with open(img, "wb") as f:      # allocated: writes change no metadata
        f.write(bytes(4 * MiB))
        os.fsync(f.fileno())
    dev = Stacker(servers, tmp_path / "request", "--size", "4M")
    assert dev.add(img) == "index 0"
    path = prog(program) if program == "loop" else suite_prog(program)
    fastpath.attach(path, dev.dev)
    base = stats(dev.dev)
    data = pattern(f"flush-{program}", BLOCK)
    direct_write(dev.dev, 0, data)
    before = disk_flushes(fs_disk)
    fd = os.open(dev.dev, os.O_RDWR)
    try:
        err = 0
        try:
            os.fsync(fd)
        except OSError as e:
            err = e.errno
    finally:
        os.close(fd)
    synced = disk_flushes(fs_disk) - before
    assert err == flush_errno, (err, flush_errno)
    assert synced >= 1, "the flush completed without syncing the target"
    d = delta(stats(dev.dev), base)
    assert d["remapped"] >= 1 and d["flushes"] >= 1, d
    with open(img, "rb") as f:
        assert f.read(BLOCK) == data
    detach_ok(dev.dev)
    dev.srv.stop()
