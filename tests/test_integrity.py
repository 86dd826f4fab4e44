# SPDX-License-Identifier: GPL-2.0
"""Data integrity through the slow path: every byte written comes back,
over every hardware queue and request size; discard, write-zeroes, flush
and FUA reach the server and do what they say."""

import os
from pathlib import Path

import pytest

import hybd_uapi as uapi
from hybdlib import (RamdiskMemory, assert_data, direct_write, fio, fio_verify,
                     first_difference, info, io_uring_usable, need_tool,
                     pattern, run, sysfs_queue, variants)

MiB = 1 << 20
CPUS = os.cpu_count() or 1
# blk-mq maps CPUs to hardware queues; with as many queues as CPUs and fio's
# jobs split over the CPUs, every queue carries I/O.
QUEUES = max(2, CPUS)
JOBS = 2 * QUEUES


def stats(dev):
    return info(dev)["stats"]


def per_queue_done(dev_id):
    with uapi.Control() as ctl:
        e, queues = uapi.queue_stats(ctl, dev_id)
    assert e == 0, f"HYBD_CTL_STATS: {uapi.errname(e)}"
    return [q["slow_done"] for q in queues]


# (block size, bytes per job): a few hundred requests per job either way
SIZES = [(512, "512K"), (4096, "2M"), (64 << 10, "8M"), (1 << 20, "16M")]


@pytest.mark.parametrize("bs,per_job,iodepth", variants(
    [pytest.param(bs, per_job, qd, id=f"{name}-qd{qd}")
     for (bs, per_job), name in zip(SIZES, ("512", "4k", "64k", "1m"))
     for qd in (1, 32)],
    # each size once, both depths (test-long: every size at both)
    ["512-qd32", "4k-qd1", "64k-qd32", "1m-qd1"]))
def test_fio_verify_random_rw_over_all_queues(ramdisk, bs, per_job, iodepth):
    need_tool("fio")
    engine = "libaio"
    if iodepth > 1 and io_uring_usable():
        engine = "io_uring"
    srv = ramdisk(size=f"{JOBS * 16}M", queues=QUEUES, depth=32,
                  max_io="1M", lbs=512 if bs == 512 else 4096)
    before = stats(srv.dev)

    jobs = fio_verify(srv.dev, bs, per_job, JOBS, iodepth, engine)

    after = stats(srv.dev)
    ios = sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in jobs)
    assert after["slow_done"] - before["slow_done"] >= ios // 2, (before, after)
    assert after["writes"] > before["writes"] and after["reads"] > before["reads"]
    assert after["slow_errors"] == before["slow_errors"]
    done = per_queue_done(srv.id)
    assert len(done) == QUEUES
    assert all(d > 0 for d in done), f"a hardware queue carried no I/O: {done}"

    counters = srv.stop()
    assert counters is not None, srv.output()
    assert counters["reads"] > 0 and counters["writes"] > 0, counters


# (flag, queue limit, counter, start MiB, length MiB): blkdiscard sends a
# discard, blkdiscard -z a write-zeroes op (not zero-filled writes)
ZEROING_OPS = {
    "discard": ([], "discard_max_bytes", "discards", 2, 4),
    "write-zeroes": (["-z"], "write_zeroes_max_bytes", "write_zeroes", 1, 3),
}


@pytest.mark.parametrize("op", ZEROING_OPS)
def test_zeroing_op_reads_back_zeros_and_spares_the_rest(ramdisk, op):
    flag, limit, counter, start, length = ZEROING_OPS[op]
    blkdiscard = need_tool("blkdiscard")
    srv = ramdisk(size="16M")
    assert int(sysfs_queue(srv.dev, limit)) > 0
    data = pattern(op, 8 * MiB)
    direct_write(srv.dev, 0, data)
    before = stats(srv.dev)

    run([blkdiscard, *flag, "-o", str(start * MiB), "-l", str(length * MiB),
         srv.dev], check=True)

    end = (start + length) * MiB
    assert_data(srv.dev, start * MiB, bytes(length * MiB), f"{op} range")
    assert_data(srv.dev, 0, data[:start * MiB], f"before the {op} range")
    assert_data(srv.dev, end, data[end:], f"after the {op} range")
    # the op itself reached the server
    assert stats(srv.dev)[counter] > before[counter]
    counters = srv.stop()
    assert counters[counter] > 0, counters


def fsync_writes(dev, size=1 * MiB):
    """Buffered writes with fio, each followed by fsync."""
    rc, data, res = fio([
        "--name=fsync", f"--filename={dev}", "--rw=write", "--bs=4k",
        f"--size={size}", "--ioengine=psync", "--fsync=1",
    ])
    assert rc == 0, f"fio exit {rc}\n{res.stderr}\n{res.stdout[-2000:]}"


def test_fsync_reaches_the_server_as_flush(ramdisk):
    need_tool("fio")
    srv = ramdisk(size="16M")
    before = stats(srv.dev)
    fsync_writes(srv.dev)
    assert stats(srv.dev)["flushes"] > before["flushes"]

    # What a buffered write + fsync left is in the server's memory.  Read
    # there, not through the device: an O_DIRECT read writes the range's
    # dirty pages back first, and the last close of the device syncs it,
    # so either would pass without the fsync.
    mem = RamdiskMemory(srv, 16 * MiB)
    data = pattern("fsync", 64 << 10)
    fd = os.open(srv.dev, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 4 * MiB)
        # still in the page cache only (writeback of dirty pages starts
        # after 30 s): this is what the check below would see without fsync
        early = mem.read(4 * MiB, len(data)) == data
        assert not early, "a buffered write reached the server before fsync"
        flushes = stats(srv.dev)["flushes"]
        os.fsync(fd)
        # (not `got == data` in the assert: pytest's diff of 64 KiB takes
        # minutes under TCG)
        diff = first_difference(mem.read(4 * MiB, len(data)), data)
        assert not diff, f"fsync returned before the data reached the server: {diff}"
        assert stats(srv.dev)["flushes"] > flushes
    finally:
        os.close(fd)

    counters = srv.stop()
    assert counters["flushes"] > 0, counters


def test_dsync_direct_write_reaches_the_server_as_fua(ramdisk):
    srv = ramdisk(size="16M")
    assert sysfs_queue(srv.dev, "fua") == "1"
    before = stats(srv.dev)
    data = pattern("fua", 256 << 10)
    # O_DIRECT|O_DSYNC on a block device with a write cache sets REQ_FUA
    direct_write(srv.dev, MiB, data, os.O_DSYNC)
    assert stats(srv.dev)["fua"] > before["fua"]
    assert_data(srv.dev, MiB, data, "FUA write")
    counters = srv.stop()
    assert counters["fua"] > 0, counters


def test_write_through_device_gets_no_flush_nor_fua(ramdisk):
    need_tool("fio")
    srv = ramdisk(size="16M", no_write_cache=True)
    fsync_writes(srv.dev, size=256 << 10)
    data = pattern("wt", 64 << 10)
    direct_write(srv.dev, MiB, data, os.O_DSYNC)
    assert_data(srv.dev, MiB, data, "write-through write")
    s = stats(srv.dev)
    assert s["flushes"] == 0 and s["fua"] == 0, s
    assert s["writes"] > 0
    counters = srv.stop()
    assert counters["flushes"] == 0 and counters["fua"] == 0, counters

