# SPDX-License-Identifier: GPL-2.0
"""Partition tables on a hybd disk: the kernel reads an MBR or a GPT table
when asked (BLKRRPART), /dev/hybdNpM map to the right byte ranges of the
disk in both directions and stop at their ends, partitions come and go as
the table changes, and deleting the device while a partition is open
returns in bounded time and fails the opener's I/O.

The tables are written here, byte by byte (util-linux's sfdisk is in the
fdisk package, which the guest does not have): that also fixes exactly
what the kernel must find.
"""

import errno
import fcntl
import mmap
import os
import struct
import time
import uuid
import zlib
from pathlib import Path

import pytest

from hybdbpf import settle
from hybdlib import (assert_data, device_ids, direct_read, hybdctl,
                     direct_write, pattern, wait_for)

MiB = 1 << 20
DEL_WITHIN = 30                     # seconds a delete may take
BLKRRPART = 0x125F                  # _IO(0x12, 95)

# (first byte, length) of each partition, in bytes
TWO = [(1 * MiB, 8 * MiB), (9 * MiB, 12 * MiB)]
ONE = TWO[:1]

LINUX_DATA = uuid.UUID("0fc63daf-8483-4772-8e79-3d69d8477de4")
GPT_ENTRIES, GPT_ENTRY_SIZE = 128, 128


def mbr(parts, lbs, disk_bytes):
    """A DOS partition table: up to 4 primary partitions of type 0x83."""
    sector = bytearray(lbs)
    for i, (start, length) in enumerate(parts):
        # status, CHS first (unused), type, CHS last (unused), LBA, count
        struct.pack_into("<B3sB3sII", sector, 446 + 16 * i, 0, b"\xff\xff\xfe",
                         0x83, b"\xff\xff\xfe", start // lbs, length // lbs)
    sector[510:512] = b"\x55\xaa"
    return {0: bytes(sector)}


def _gpt_header(lbs, my_lba, alt_lba, first, last, disk_guid, entries_lba,
                entries_crc):
    def pack(crc):
        return struct.pack("<8sIIIIQQQQ16sQIII", b"EFI PART", 0x00010000, 92,
                           crc, 0, my_lba, alt_lba, first, last, disk_guid,
                           entries_lba, GPT_ENTRIES, GPT_ENTRY_SIZE, entries_crc)
    hdr = pack(zlib.crc32(pack(0)))
    return hdr + bytes(lbs - len(hdr))


def gpt(parts, lbs, disk_bytes):
    """A GPT: protective MBR, primary header and entries at the start,
    backup entries and header at the end.  {block number: bytes}."""
    blocks = disk_bytes // lbs
    entry_blocks = GPT_ENTRIES * GPT_ENTRY_SIZE // lbs
    entries = bytearray(GPT_ENTRIES * GPT_ENTRY_SIZE)
    for i, (start, length) in enumerate(parts):
        name = f"hybd{i + 1}".encode("utf-16-le")
        struct.pack_into("<16s16sQQQ72s", entries, i * GPT_ENTRY_SIZE,
                         LINUX_DATA.bytes_le, uuid.uuid4().bytes_le,
                         start // lbs, (start + length) // lbs - 1, 0, name)
    crc = zlib.crc32(entries)
    disk_guid = uuid.uuid4().bytes_le
    first, last = 2 + entry_blocks, blocks - 2 - entry_blocks
    pmbr = bytearray(lbs)
    struct.pack_into("<B3sB3sII", pmbr, 446, 0, b"\x00\x02\x00", 0xEE,
                     b"\xff\xff\xff", 1, min(blocks - 1, 0xFFFFFFFF))
    pmbr[510:512] = b"\x55\xaa"
    out = {0: bytes(pmbr),
           1: _gpt_header(lbs, 1, blocks - 1, first, last, disk_guid, 2, crc),
           2: bytes(entries),
           blocks - 1 - entry_blocks: bytes(entries),
           blocks - 1: _gpt_header(lbs, blocks - 1, 1, first, last, disk_guid,
                                   blocks - 1 - entry_blocks, crc)}
    return out


def wipe(lbs, disk_bytes):
    """Zeros where either kind of table lives."""
    blocks = disk_bytes // lbs
    entry_blocks = GPT_ENTRIES * GPT_ENTRY_SIZE // lbs
    return {0: bytes(lbs * (2 + entry_blocks)),
            blocks - 1 - entry_blocks: bytes(lbs * (1 + entry_blocks))}


TABLES = {"mbr": mbr, "gpt": gpt}


def write_table(dev, blocks, lbs):
    for blk, data in blocks.items():
        direct_write(dev, blk * lbs, data)


def reread(dev, tries=3):
    """BLKRRPART on the whole disk, once udev is done with it (a probe that
    holds a partition open makes it EBUSY); returns the errno or 0."""
    for _ in range(tries):
        settle()
        fd = os.open(dev, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, BLKRRPART)
            return 0
        except OSError as e:
            if e.errno != errno.EBUSY:
                return e.errno
            err = e.errno
        finally:
            os.close(fd)
        time.sleep(0.5)
    return err


def partitions(dev):
    """{partition number: (first byte, length)} as sysfs shows them."""
    name = os.path.basename(dev)
    out = {}
    for p in Path(f"/sys/block/{name}").glob(f"{name}p*"):
        num = int(p.name[len(name) + 1:])
        start = int((p / "start").read_text()) * 512
        size = int((p / "size").read_text()) * 512
        out[num] = (start, size)
    return out


def expect_partitions(dev, parts):
    """Wait for sysfs and /dev to show exactly `parts`."""
    want = {i + 1: p for i, p in enumerate(parts)}
    wait_for(lambda: partitions(dev) == want, 10,
             f"{dev}'s partitions to be {want} (now {partitions(dev)})")
    for num in want:
        wait_for(lambda: os.path.exists(f"{dev}p{num}"), 10, f"{dev}p{num}")
    for num in range(len(parts) + 1, 5):
        wait_for(lambda: not os.path.exists(f"{dev}p{num}"), 10,
                 f"{dev}p{num} to go")


@pytest.mark.parametrize("lbs", [512, 4096])
@pytest.mark.parametrize("label", TABLES)
def test_partition_io_lands_at_the_partitions_offset(ramdisk, label, lbs):
    size = 32 * MiB
    srv = ramdisk(size="32M", lbs=lbs)
    settle()
    write_table(srv.dev, TABLES[label](TWO, lbs, size), lbs)
    assert reread(srv.dev) == 0
    expect_partitions(srv.dev, TWO)
    p1, p2 = f"{srv.dev}p1", f"{srv.dev}p2"

    # through the partition, then read through the whole disk
    a = pattern(f"p1-{label}", 256 << 10)
    direct_write(p1, 512 << 10, a)
    assert_data(srv.dev, TWO[0][0] + (512 << 10), a, "p1's write on the disk")
    # and the other way round
    b = pattern(f"disk-{label}", 128 << 10)
    direct_write(srv.dev, TWO[1][0] + MiB, b)
    assert_data(p2, MiB, b, "the disk's write in p2")

    # a partition ends where the table says: p1's last block is its own,
    # and a write across its end stops there, sparing p2
    p2_head = direct_read(p2, 0, lbs)
    last = pattern("last", lbs)
    direct_write(p1, TWO[0][1] - lbs, last)
    assert_data(srv.dev, TWO[0][0] + TWO[0][1] - lbs, last, "p1's last block")
    buf = mmap.mmap(-1, 2 * lbs)
    fd = os.open(p1, os.O_WRONLY | os.O_DIRECT)
    try:
        n = os.pwritev(fd, [buf], TWO[0][1] - lbs)
        assert n == lbs, f"a write across p1's end wrote {n} bytes"
        with pytest.raises(OSError) as e:
            os.pwritev(fd, [buf], TWO[0][1])
        assert e.value.errno == errno.ENOSPC, e.value
    finally:
        os.close(fd)
        buf.close()
    assert_data(p2, 0, p2_head, "p2's first block after writes at p1's end")
    fd = os.open(p1, os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, os.SEEK_END) == TWO[0][1]
    finally:
        os.close(fd)
    srv.stop()


@pytest.mark.parametrize("label", TABLES)
def test_partitions_follow_the_table(ramdisk, label):
    size, lbs = 32 * MiB, 4096
    srv = ramdisk(size="32M")
    settle()
    assert partitions(srv.dev) == {}

    write_table(srv.dev, TABLES[label](TWO, lbs, size), lbs)
    # the kernel reads the table when asked, not on a write
    assert partitions(srv.dev) == {}
    assert reread(srv.dev) == 0
    expect_partitions(srv.dev, TWO)

    # a partition that is open keeps the table: BLKRRPART is refused
    fd = os.open(f"{srv.dev}p2", os.O_RDONLY)
    try:
        write_table(srv.dev, TABLES[label](ONE, lbs, size), lbs)
        assert reread(srv.dev, tries=1) == errno.EBUSY
        assert partitions(srv.dev) == {i + 1: p for i, p in enumerate(TWO)}
    finally:
        os.close(fd)

    assert reread(srv.dev) == 0
    expect_partitions(srv.dev, ONE)

    write_table(srv.dev, wipe(lbs, size), lbs)
    assert reread(srv.dev) == 0
    expect_partitions(srv.dev, [])
    srv.stop()


@pytest.mark.time_limit(180)
def test_delete_with_a_partition_open_returns_and_fails_its_io(ramdisk):
    """hybdctl del while an fd on hybdNp1 is open: the delete returns
    within DEL_WITHIN, the device and its partitions go, and the open fd's
    reads and writes fail (or read the end of the device) instead of
    hanging."""
    size, lbs = 32 * MiB, 4096
    srv = ramdisk(size="32M")
    settle()
    write_table(srv.dev, gpt(ONE, lbs, size), lbs)
    assert reread(srv.dev) == 0
    expect_partitions(srv.dev, ONE)
    p1 = f"{srv.dev}p1"
    data = pattern("held", MiB)
    direct_write(p1, 0, data)
    assert_data(p1, 0, data, "p1 before the delete")

    fd = os.open(p1, os.O_RDWR | os.O_DIRECT)
    buf = mmap.mmap(-1, lbs)
    try:
        t0 = time.monotonic()
        # bounded: fails after T_CMD; --in-use, as p1 is open
        rc, _, err = hybdctl("del", "--in-use", str(srv.id))
        took = time.monotonic() - t0
        assert rc == 0, err
        assert took < DEL_WITHIN, f"hybdctl del took {took:.1f}s"
        wait_for(lambda: not os.path.exists(srv.dev), 10, f"{srv.dev} to go")
        wait_for(lambda: not os.path.exists(p1), 10, f"{p1} to go")
        assert srv.id not in device_ids()

        for op in ("read", "write"):
            t0 = time.monotonic()
            try:
                if op == "read":
                    n = os.preadv(fd, [buf], 0)
                else:
                    n = os.pwritev(fd, [buf], 0)
                got = n
            except OSError as e:
                got = errno.errorcode.get(e.errno, e.errno)
            took = time.monotonic() - t0
            assert took < 10, f"a {op} on the deleted p1 took {took:.1f}s"
            # an error; for a read also the end of the device
            ok = got in ("EIO", "ENXIO", "ENODEV", "ENOSPC")
            ok = ok or (op == "read" and got == 0)
            assert ok, f"{op} on p1 of a deleted device: {got}"
    finally:
        buf.close()
        os.close(fd)
    # the server learns of the delete from its queues and exits by itself
    assert srv.wait(30) == 1, srv.output()
