# SPDX-License-Identifier: GPL-2.0
"""Direct I/O: writing a device's measured region (distinct blocks, a
disk image's mix, or the zram lines' mix) and reading it back to warm a
cache."""

import functools
import hashlib
import io
import mmap
import os
import random
import tarfile

from .catalogue import BS, SEQ_BS
from .common import BenchError, say


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


# The zram lines' mix ("zmix"): what a compressed disk meets, each kind in
# runs of ZMIX_RUN blocks (files and free space lie in extents), in turn:
# a tar stream of ZMIX_TAR_ROOTS (text, headers, binaries: lz4 gets
# some of it), random data (compressed files, media: lz4 gets nothing,
# both stores keep it whole) and zeros, written (not holes), which both
# keep as same-filled pages.  A run is as long as a "seq" read, so each of
# those reads, as each 4 KiB one, finds one kind.
ZMIX_RUN = SEQ_BS // BS
ZMIX_TAR_ROOTS = ("/usr/include", "/usr/share")
ZMIX_SEED = 0x7a6d6978          # the random runs' generator's: "zmix"


def tar_stream(need, roots=ZMIX_TAR_ROOTS):
    """The first @need bytes of a tar of @roots, built in memory as `tar
    cf` would, directories and names in sorted order (the same bytes from
    the same tree); files that cannot be read are left out."""
    buf = io.BytesIO()
    tar = tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT)
    for root in roots:
        for top, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(top, name)
                try:
                    info = tar.gettarinfo(path)
                    if info is None:        # a socket, say
                        continue
                    if info.isreg():
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)
                except OSError:
                    continue
                if buf.tell() >= need:
                    return buf.getbuffer()[:need].tobytes()
    raise BenchError(f"a tar of {' and '.join(roots)} has {buf.tell()} "
                     f"bytes, not the {need} the zram mix needs")


@functools.lru_cache(maxsize=2)
def zmix_parts(size):
    """(tar bytes, random bytes, what they are) for a zmix of @size bytes:
    made once a run, so that every zram line is written the same."""
    blocks = size // BS
    runs = -(-blocks // ZMIX_RUN)
    # each kind's blocks, at most: a run of it in every third run
    need = (runs // 3 + 1) * ZMIX_RUN * BS
    tar = tar_stream(need)
    rnd = random.Random(ZMIX_SEED).randbytes(need)
    kinds = [(blk // ZMIX_RUN) % 3 for blk in range(blocks)]
    info = {"tar_of": list(ZMIX_TAR_ROOTS), "tar_bytes": len(tar),
            "tar_sha256": hashlib.sha256(tar).hexdigest(),
            "random_seed": ZMIX_SEED, "run_blocks": ZMIX_RUN,
            "blocks": {"tar": kinds.count(0), "random": kinds.count(1),
                       "zeros": kinds.count(2)}}
    say(f"zram mix: {size >> 20} MiB, {info['blocks']}, the tar "
        f"{info['tar_sha256'][:12]}")
    return tar, rnd, info


def fill_zmix(dev, size):
    """The zram lines' mix over [0, size), every block written: runs of
    ZMIX_RUN blocks of a tar of /usr, of random data and of zeros, in
    turn, each kind's runs taking its source's blocks in order.  Returns
    what it wrote (for bench.json), the same for every device of a run."""
    tar, rnd, info = zmix_parts(size)
    zero = bytes(BS)

    def block_at(blk):
        run, i = divmod(blk, ZMIX_RUN)
        kind = run % 3
        if kind == 2:
            return zero
        at = (run // 3 * ZMIX_RUN + i) * BS
        return (tar if kind == 0 else rnd)[at:at + BS]
    write_blocks(dev, size, block_at)
    return info


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
