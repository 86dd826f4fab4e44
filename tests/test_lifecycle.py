# SPDX-License-Identifier: GPL-2.0
"""A device's life through the control node: add, list, info, start (a
server), stop, delete; several devices at once; deleting while in use."""

import errno
import mmap
import os
import re
import time
from pathlib import Path

from hybdlib import (RAMDISK, STATS_FIELDS, add_device, assert_data, del_device,
                     dev_path, device_ids, direct_read, direct_write, free_id,
                     hybdctl, info, list_devices, pattern, run, sysfs_queue,
                     wait_for)
from hybdbpf import settle

MiB = 1 << 20

INFO_KEYS = {"id", "state", "server_pid", "size", "logical_block_size",
             "physical_block_size", "nr_hw_queues", "queue_depth",
             "max_io_bytes", "ops", "write_cache", "poll_ns", "bpf", "stats"}


def test_added_device_is_listed_and_described_until_deleted(added_devices):
    before = device_ids()
    dev_id = add_device("--size", "16M")
    added_devices.append(dev_id)
    assert dev_id not in before

    entry = [d for d in list_devices() if d["id"] == dev_id]
    assert len(entry) == 1
    assert {k: entry[0].get(k) for k in ("id", "state", "size")} == \
        {"id": dev_id, "state": "added", "size": 16 * MiB}

    i = info(dev_id)
    assert INFO_KEYS <= set(i), f"missing keys: {INFO_KEYS - set(i)}"
    assert i["id"] == dev_id
    assert i["state"] == "added"
    assert i["server_pid"] == 0
    assert i["size"] == 16 * MiB
    assert "read" in i["ops"]
    assert i["bpf"] is None
    assert set(STATS_FIELDS) <= set(i["stats"])
    assert all(i["stats"][k] == 0 for k in STATS_FIELDS), i["stats"]
    # no block device until a server starts it
    assert not os.path.exists(dev_path(dev_id))

    rc, _, err = del_device(dev_id)
    assert rc == 0, err
    assert dev_id not in device_ids()
    rc, _, err = hybdctl("info", str(dev_id))
    assert rc == 1 and "No such device" in err, err


def test_add_keeps_every_parameter(added_devices):
    dev_id = free_id()
    got = add_device("--id", str(dev_id), "--size", "32M", "--lbs", "512",
                     "--pbs", "4096", "--queues", "3", "--depth", "8",
                     "--max-io", "64K", "--ops", "read,write,discard",
                     "--no-write-cache", "--poll-ns", "5000")
    added_devices.append(got)
    assert got == dev_id
    i = info(dev_id)
    assert (i["size"], i["logical_block_size"], i["physical_block_size"],
            i["nr_hw_queues"], i["queue_depth"], i["max_io_bytes"],
            i["poll_ns"]) == (32 * MiB, 512, 4096, min(3, os.cpu_count()), 8,
                              65536, 5000)
    assert sorted(i["ops"]) == ["discard", "read", "write"]
    assert i["write_cache"] is False


def test_info_and_del_accept_path_name_and_number(added_devices):
    dev_id = add_device("--size", "16M")
    added_devices.append(dev_id)
    for spelling in (f"/dev/hybd{dev_id}", f"hybd{dev_id}", str(dev_id)):
        assert info(spelling)["id"] == dev_id, spelling
    rc, _, err = del_device(f"/dev/hybd{dev_id}")
    assert rc == 0, err
    assert dev_id not in device_ids()


def test_del_of_unknown_device_fails_with_enodev():
    dev_id = free_id()
    before = list_devices()
    rc, out, err = del_device(dev_id)
    assert rc == 1, f"exit {rc}: {out}{err}"
    assert re.search(r"^hybdctl: del: .*\(No such device\)$", err, re.M), err
    assert list_devices() == before


def test_bad_device_spelling_is_a_usage_error():
    rc, _, err = hybdctl("info", "/dev/sda")
    assert rc == 2, err
    rc, _, err = hybdctl("del")
    assert rc == 2, err


def test_served_device_is_live_with_the_geometry_asked_for(ramdisk):
    srv = ramdisk(size="48M", queues=2, depth=16, max_io="256K", lbs=512,
                  pbs=4096)
    i = info(srv.dev)
    assert i["state"] == "live"
    assert i["server_pid"] == srv.pid
    assert (i["size"], i["nr_hw_queues"], i["queue_depth"],
            i["max_io_bytes"], i["logical_block_size"],
            i["physical_block_size"]) == (48 * MiB, 2, 16, 256 << 10, 512, 4096)
    assert i["write_cache"] is True

    name = os.path.basename(srv.dev)
    assert int(Path(f"/sys/block/{name}/size").read_text()) * 512 == 48 * MiB
    assert sysfs_queue(srv.dev, "logical_block_size") == "512"
    assert sysfs_queue(srv.dev, "physical_block_size") == "4096"
    assert int(sysfs_queue(srv.dev, "max_hw_sectors_kb")) == 256
    assert sysfs_queue(srv.dev, "write_cache") == "write back"
    assert len(list(Path(f"/sys/block/{name}/mq").iterdir())) == 2
    assert int(Path(f"/sys/block/{name}/mq/0/nr_tags").read_text()) == 16


def test_one_queue_device_has_no_scheduler_unless_asked(ramdisk):
    """As for loop: no mq-deadline (blk-mq's default for one queue), whose
    lock and insert every request would pay; one can still be set."""
    srv = ramdisk(size="16M", queues=1)
    settle()
    sched = sysfs_queue(srv.dev, "scheduler")
    assert sched.startswith("[none]"), sched
    if "mq-deadline" in sched:
        name = os.path.basename(srv.dev)
        Path(f"/sys/block/{name}/queue/scheduler").write_text("mq-deadline")
        assert "[mq-deadline]" in sysfs_queue(srv.dev, "scheduler")
        pa = pattern("s", 1 * MiB)
        direct_write(srv.dev, 0, pa)
        assert_data(srv.dev, 0, pa, "under mq-deadline")


def test_no_write_cache_device_is_write_through(ramdisk):
    srv = ramdisk(size="16M", no_write_cache=True)
    assert info(srv.dev)["write_cache"] is False
    assert sysfs_queue(srv.dev, "write_cache") == "write through"
    assert "flush" not in info(srv.dev)["ops"]


def test_two_ramdisks_keep_their_data_apart(ramdisk):
    a = ramdisk(size="32M")
    b = ramdisk(size="32M")
    assert a.id != b.id
    pa, pb = pattern("a", 2 * MiB), pattern("b", 2 * MiB)
    for off in (0, 8 * MiB, 30 * MiB):
        direct_write(a.dev, off, pa)
        direct_write(b.dev, off, pb)
    for off in (0, 8 * MiB, 30 * MiB):
        assert_data(a.dev, off, pa, "ramdisk a")
        assert_data(b.dev, off, pb, "ramdisk b")

    counters = a.stop()
    assert counters is not None, f"no counters line\n{a.output()}"
    assert counters["writes"] > 0 and counters["reads"] > 0, counters
    wait_for(lambda: not os.path.exists(a.dev), 10, f"{a.dev} to disappear")
    assert a.id not in device_ids()

    # b neither noticed nor lost anything
    for off in (0, 8 * MiB, 30 * MiB):
        assert_data(b.dev, off, pb, "ramdisk b after a stopped")
    pb2 = pattern("b2", MiB)
    direct_write(b.dev, 4 * MiB, pb2)
    assert_data(b.dev, 4 * MiB, pb2, "ramdisk b, new write")
    assert info(b.dev)["state"] == "live"


def test_stopped_server_deletes_its_device(ramdisk):
    srv = ramdisk(size="16M")
    counters = srv.stop()
    assert counters is not None, f"no counters line\n{srv.output()}"
    assert set(counters) == {"reads", "writes", "flushes", "fua", "discards",
                             "write_zeroes"}
    assert srv.id not in device_ids()
    assert not os.path.exists(srv.dev)


def test_del_while_device_is_open_fails_its_io_and_frees_it(ramdisk):
    srv = ramdisk(size="16M")
    data = pattern("open", MiB)
    direct_write(srv.dev, 0, data)
    fd = os.open(srv.dev, os.O_RDONLY | os.O_DIRECT)
    try:
        assert direct_read(srv.dev, 0, MiB) == data
        # --in-use: plain del refuses an open device (test_hybdctl.py)
        rc, _, err = hybdctl("del", "--in-use", str(srv.id))
        # an opener does not block deletion: its later I/O fails instead
        assert rc == 0, err
        wait_for(lambda: not os.path.exists(srv.dev), 10,
                 f"{srv.dev} to disappear")
        assert srv.id not in device_ids()

        buf = mmap.mmap(-1, 4096)
        n, failed = None, None
        t0 = time.monotonic()
        try:
            n = os.preadv(fd, [buf], 0)
        except OSError as e:
            failed = e.errno
        finally:
            buf.close()
        took = time.monotonic() - t0
        # an error, or end of device: del_gendisk() sets the capacity to 0
        assert failed in (errno.EIO, errno.ENXIO, errno.ENODEV) or n == 0, (
            f"read on a deleted device: {n if failed is None else failed}")
        assert took < 10, f"the read took {took:.1f}s"
    finally:
        os.close(fd)
    assert srv.id not in device_ids()


def test_del_of_a_served_device_ends_its_server(ramdisk):
    other = ramdisk(size="16M")
    keep = pattern("other", MiB)
    direct_write(other.dev, 0, keep)
    srv = ramdisk(size="16M")
    direct_write(srv.dev, 0, pattern("served", MiB))

    rc, _, err = del_device(srv.dev)
    assert rc == 0, err
    wait_for(lambda: not os.path.exists(srv.dev), 10, f"{srv.dev} to disappear")
    assert srv.id not in device_ids()
    # the server learns it from its queues (-ENODEV) and exits by itself
    assert srv.wait(30) == 1, srv.output()
    assert "deleted underneath" in "".join(srv.err), srv.output()

    assert_data(other.dev, 0, keep, "the other ramdisk")


def test_null_server_completes_every_request_without_data(ramdisk):
    """ramdisk --null (the bench's hybd null line, ublk null's peer):
    every request succeeds and is counted, nothing is stored."""
    srv = ramdisk(size="16M", null=True)
    direct_write(srv.dev, 0, pattern("null", MiB))
    assert len(direct_read(srv.dev, 4 * MiB, MiB)) == MiB
    res = run(["sync", srv.dev])          # fsync(2) of the device: a flush
    assert res.returncode == 0, res.stderr
    counters = srv.stop()
    assert counters is not None, srv.output()
    # a 1 MiB request may be split to the device's max I/O size
    assert counters["writes"] >= 1 and counters["reads"] >= 1, counters
    assert counters["flushes"] >= 1, counters


def test_null_server_refuses_a_backing_file(tmp_path):
    res = run([RAMDISK, "--null", "--backing", tmp_path / "f"])
    assert res.returncode == 2 and "--null keeps no data" in res.stderr, res
    assert not (tmp_path / "f").exists()
