# SPDX-License-Identifier: GPL-2.0
"""Direct I/O: writing a device's measured region (distinct blocks, or a
disk image's mix) and reading it back to warm a cache."""

import mmap
import os

from .catalogue import BS
from .common import BenchError


def _direct_fd(dev, flags):
    try:
        return os.open(dev, flags | os.O_DIRECT)
    except OSError as e:
        raise BenchError(f"open {dev}: {e.strerror}") from None


def write_blocks(dev, size, block_at, chunk=1 << 20):
    """Write [0, size) with O_DIRECT, chunk bytes at a time: block_at(blk)
    gives each 4 KiB block's content, or None to leave it unwritten.
    Flushes at the end."""
    buf = mmap.mmap(-1, chunk)
    fd = _direct_fd(dev, os.O_WRONLY)
    try:
        for off in range(0, size, chunk):
            n = min(chunk, size - off)
            first = off // BS
            runs = []               # [start block, end block) to write
            for i in range(n // BS):
                data = block_at(first + i)
                if data is None:
                    continue
                buf[i * BS:(i + 1) * BS] = data
                if runs and runs[-1][1] == i:
                    runs[-1][1] = i + 1
                else:
                    runs.append([i, i + 1])
            for a, b in runs:
                want = (b - a) * BS
                if os.pwritev(fd, [memoryview(buf)[a * BS:b * BS]],
                              off + a * BS) != want:
                    raise BenchError(f"short write on {dev} at {off + a * BS}")
        os.fsync(fd)
    except OSError as e:
        raise BenchError(f"write {dev}: {e.strerror}") from None
    finally:
        os.close(fd)
        buf.close()


def tagged(seed, tag):
    """seed with its first 8 bytes replaced by tag + 1: never all zeros."""
    return (tag + 1).to_bytes(8, "little") + seed[8:]


def fill_region(dev, size):
    """Write non-zero data over [0, size), every block different, so that
    reads copy real data (and no 4 KiB block of it is all zeros)."""
    seed = os.urandom(BS)
    write_blocks(dev, size, lambda blk: tagged(seed, blk))


def fill_mix(dev, size):
    """A disk image's mix over [0, size): block i is never written (reads
    as zeros) when i % 3 == 0, one of 16 shared contents when i % 3 == 1,
    unique when i % 3 == 2."""
    seed = os.urandom(BS)

    def block_at(blk):
        if blk % 3 == 0:
            return None
        return tagged(seed, blk % 16 if blk % 3 == 1 else 1000 + blk)
    write_blocks(dev, size, block_at)


def read_pass(dev, size):
    """Read [0, size) sequentially in 4 KiB O_DIRECT reads (cache warm-up)."""
    buf = mmap.mmap(-1, BS)
    fd = _direct_fd(dev, os.O_RDONLY)
    try:
        for off in range(0, size, BS):
            if os.preadv(fd, [buf], off) != BS:
                raise BenchError(f"short read on {dev} at {off}")
    except OSError as e:
        raise BenchError(f"read {dev}: {e.strerror}") from None
    finally:
        os.close(fd)
        buf.close()
