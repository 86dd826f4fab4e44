# SPDX-License-Identifier: GPL-2.0
"""examples/ramdisk --backing FILE: the disk lives in a file mapped shared,
so its data outlives the server (a SIGKILL included) and the next ramdisk
on the file serves it again; what the recovery tests build on."""

import os

from hybdlib import (RAMDISK, delete_dead, direct_read, direct_write, info,
                     need_built, pattern, run)

MiB = 1 << 20


def test_ramdisk_backing_file_keeps_data_across_a_sigkill(ramdisk, tmp_path):
    backing = tmp_path / "disk.img"
    data = pattern("backing", 4 * MiB)
    srv = ramdisk(size="16M", backing=backing)
    assert os.path.getsize(backing) == 16 * MiB
    direct_write(srv.dev, MiB, data)
    # the file holds what the device was given, where it was given
    with open(backing, "rb") as f:
        f.seek(MiB)
        assert f.read(len(data)) == data
    srv.kill()
    delete_dead(srv)

    # a new server on the file, its size taken from the file
    srv = ramdisk(size=None, backing=backing)
    assert info(srv.dev)["size"] == 16 * MiB
    assert direct_read(srv.dev, MiB, len(data)) == data
    assert direct_read(srv.dev, 0, MiB) == bytes(MiB)
    srv.stop()


def test_ramdisk_backing_flush_and_fua_reach_the_file(ramdisk, tmp_path):
    backing = tmp_path / "disk.img"
    srv = ramdisk(size="8M", backing=backing)
    block = pattern("fua", 4096)
    direct_write(srv.dev, 4096, block, os.O_DSYNC)
    fd = os.open(srv.dev, os.O_WRONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    counters = srv.stop()
    assert counters and counters["fua"] == 1 and counters["flushes"] >= 1, (
        counters)
    with open(backing, "rb") as f:
        f.seek(4096)
        assert f.read(4096) == block


def test_ramdisk_backing_empty_file_needs_a_size(tmp_path):
    need_built(RAMDISK, "examples/ramdisk/ramdisk")
    empty = tmp_path / "empty.img"
    empty.touch()
    res = run([RAMDISK, "--backing", empty], timeout=30)
    assert res.returncode == 1, res.stderr
    assert "is empty: give --size" in res.stderr, res.stderr
