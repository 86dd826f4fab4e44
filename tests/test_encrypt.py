# SPDX-License-Identifier: GPL-2.0
"""examples/encrypt, the AES-XTS device byte-compatible with dm-crypt, end
to end: round trips with dm-crypt in this guest (both directions, both key
sizes, both sector sizes, both IV units), no plaintext on the backing
store, fio --verify with and without the fast path, no stale read with the
plaintext cache, holes served in the kernel (after a restart too),
discards, ext4 across a restart, bad keys and parameters, and the key
kept out of sight.

The backing files are sparse files in the test's tmp_path (the guest's
/tmp, a tmpfs), opened by dm-crypt through a loop device that cryptsetup
sets up itself.
"""

import hashlib
import os
import re
import random
import resource
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from hybdlib import (ENCRYPT, REPO, T_IO, delete_dead, device_ids,
                     direct_read, direct_write, fio_verify, first_difference,
                     info, loop_device, need_built, pattern, run, variants,
                     wait_for)
from test_dedup import (QUEUES, JOBS, STALE_CHECK, STALE_KEYS, STALE_RE,
                        STALE_SECONDS, digest_tree, flush, make_tree, tool)

MiB = 1 << 20
BLOCK = 4096
ENCRYPT_BPF = REPO / "examples" / "encrypt" / "encrypt.bpf.o"
ENCRYPT_CACHE_BPF = REPO / "examples" / "encrypt" / "encrypt-cache.bpf.o"


def sparse(path, size):
    """A sparse file of size bytes: all hole."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def make_key(path, bits, seed):
    key = pattern(f"key-{seed}", bits // 8)
    path.write_bytes(key)
    os.chmod(path, 0o600)
    return key


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def allocated(path):
    return os.stat(path).st_blocks * 512


class EncryptServer:
    def __init__(self, srv, backing):
        self.srv = srv
        self.dev, self.id, self.proc = srv.dev, srv.id, srv.proc
        self.backing = backing

    @property
    def pid(self):
        return self.srv.pid

    def output(self):
        return self.srv.output()

    def stop(self):
        """SIGTERM: the device goes, the backing store is synced."""
        self.srv.stop()
        assert self.proc.returncode == 0, (
            f"encrypt exited with {self.proc.returncode}\n{self.output()}")
        wait_for(lambda: not os.path.exists(self.dev), 10,
                 f"{self.dev} to go away after its server stopped")


class Encrypt:
    def __init__(self, servers, tmp):
        self.servers = servers
        self.tmp = tmp

    def serve(self, backing, key, *extra, fast="on"):
        flags = {"on": ["--bpf", str(ENCRYPT_BPF)],
                 "cache": ["--cache", "--bpf", str(ENCRYPT_CACHE_BPF)],
                 "off": ["--no-fast-path"]}[fast]
        srv = self.servers.start([ENCRYPT, "--key-file", key, *flags, *extra,
                                  backing])
        said = [l.strip() for l in srv.out if l.startswith("fast path")]
        want = "fast path off" if fast == "off" else "fast path /"
        assert len(said) == 1 and said[0].startswith(want), (
            f"encrypt ({fast}) said {said}\n{srv.output()}")
        return EncryptServer(srv, backing)


@pytest.fixture
def enc(servers, tmp_path):
    need_built(ENCRYPT, "examples/encrypt/encrypt")
    for obj in (ENCRYPT_BPF, ENCRYPT_CACHE_BPF):
        if not obj.is_file():
            pytest.fail(f"{obj} not built; run make -C examples/encrypt",
                        pytrace=False)
    yield Encrypt(servers, tmp_path)
    for f in tmp_path.iterdir():
        if f.is_dir() and not os.path.ismount(f):
            shutil.rmtree(f, ignore_errors=True)
        elif f.is_file():
            f.unlink()


@contextmanager
def dm_crypt(backing, key, bits, sector, iv_large, name="hybdtest"):
    """backing opened by dm-crypt in plain mode: /dev/mapper/<name>."""
    exe = tool("cryptsetup")
    args = [exe, "open", "--type", "plain", "--cipher", "aes-xts-plain64",
            "--key-size", str(bits), "--key-file", str(key)]
    if sector != 512:
        args += ["--sector-size", str(sector)]
    if iv_large:
        args.append("--iv-large-sectors")
    with loop_device(backing) as loop:
        res = run(args + [loop, name], timeout=60)
        assert res.returncode == 0, f"cryptsetup open: {res.stderr}"
        try:
            yield f"/dev/mapper/{name}"
        finally:
            res = run([exe, "close", name], timeout=60)
            assert res.returncode == 0, f"cryptsetup close: {res.stderr}"


class Model:
    """What the device holds where it was written (per 512-byte sector)."""

    def __init__(self, size):
        self.data = bytearray(size)
        self.known = bytearray(size // 512)

    def write(self, off, data):
        self.data[off:off + len(data)] = data
        for s in range(off // 512, (off + len(data)) // 512):
            self.known[s] = 1

    def zeros(self, off, length):
        self.write(off, bytes(length))

    def check(self, got, what):
        """Every known sector of got (the whole device) as written."""
        bad = [s for s in range(len(self.known)) if self.known[s] and
               got[s * 512:(s + 1) * 512] != self.data[s * 512:(s + 1) * 512]]
        assert not bad, (f"{what}: {len(bad)} sectors differ, the first at "
                         f"byte {bad[0] * 512}")


def read_all(dev, size):
    return b"".join(direct_read(dev, off, MiB) for off in range(0, size, MiB))


# ------------------------------------------------------------- dm-crypt

COMBOS = [(256, 512, False), (512, 512, False), (256, 4096, False),
          (512, 4096, False), (256, 4096, True), (512, 4096, True)]


@pytest.mark.parametrize("bits,sector,iv_large", variants(
    [pytest.param(b, s, l, id=f"{b}-{s}{'-ivlarge' if l else ''}")
     for b, s, l in COMBOS],
    # each key size, sector size and IV mode once (test-long: all six)
    ["256-512", "512-4096", "256-4096-ivlarge"]))
def test_encrypt_round_trips_with_dm_crypt(enc, tmp_path, bits, sector,
                                           iv_large):
    """What hybd writes, dm-crypt reads, and the other way round: the
    same backing file, the same key, byte for byte.  The first server
    cuts its requests of 64 KiB and more into pieces for its crypto
    helpers (one per CPU beyond the first), also where a piece ends
    inside a 4 KiB block (a read at an odd sector); the second has none."""
    size = 16 * MiB
    backing = sparse(tmp_path / "backing", size)
    key = tmp_path / "key"
    make_key(key, bits, f"{bits}-{sector}")
    extra = ["--key-size", str(bits), "--sector-size", str(sector)]
    if iv_large:
        # and the backing file opened O_DIRECT (tmpfs takes it since 6.6)
        extra += ["--iv-large-sectors", "--direct"]
    model = Model(size)

    srv = enc.serve(backing, key, *extra)
    assert int((Path("/sys/block") / Path(srv.dev).name / "queue" /
                "logical_block_size").read_text()) == sector
    writes = [(0, pattern("a", 64 << 10)),
              (MiB + sector, pattern("b", 3 * sector)),   # inside a hole
              (8 * MiB, pattern("c", MiB)),
              (15 * MiB + 4096, pattern("d", 8192))]
    for off, data in writes:
        direct_write(srv.dev, off, data)
        model.write(off, data)
    if sector == 512:
        # the rest of the hole's block reads as zeros, both ways
        model.zeros(MiB, 512)
        model.zeros(MiB + 4 * 512, 4096 - 4 * 512)
    model.check(read_all(srv.dev, size), "hybd, before dm-crypt")
    if sector == 512:
        # 192 KiB from an odd sector: over the 1 MiB of data and past it
        # into holes, pieces ending inside blocks
        start = 9 * MiB - 96 * 1024 - 3 * 512
        got = direct_read(srv.dev, start, 192 << 10)
        want = model.data[start:start + (192 << 10)]
        assert got == want, "an odd-sector read of data and holes"
    srv.stop()
    helped = helped_pieces(srv)
    if (os.cpu_count() or 1) > 1:
        assert helped > 0, srv.output()

    with dm_crypt(backing, key, bits, sector, iv_large) as mapper:
        model.check(read_all(mapper, size), "dm-crypt reading hybd's writes")
        back = [(2 * MiB, pattern("e", 256 << 10)),
                (4096, pattern("f", 8192)),               # over hybd's data
                (12 * MiB + sector, pattern("g", 2 * sector))]
        for off, data in back:
            direct_write(mapper, off, data)
            model.write(off, data)

    srv = enc.serve(backing, key, *extra, "--crypt-threads", "0")
    model.check(read_all(srv.dev, size), "hybd reading dm-crypt's writes")
    srv.stop()
    assert helped_pieces(srv) == 0, srv.output()


def helped_pieces(srv):
    """The pieces of requests the crypto helpers en- or decrypted."""
    m = re.search(r" helped=(\d+)", srv.output())
    assert m, srv.output()
    return int(m.group(1))


def test_encrypt_backing_store_never_holds_the_plaintext(enc, tmp_path):
    backing = sparse(tmp_path / "backing", 16 * MiB)
    key = tmp_path / "key"
    make_key(key, 512, "plain")
    marker = b"HYBD-PLAINTEXT-MARKER-0123456789"
    data = (marker * (MiB // len(marker) + 1))[:MiB]
    srv = enc.serve(backing, key)
    direct_write(srv.dev, 4 * MiB, data)
    flush(srv.dev)
    assert direct_read(srv.dev, 4 * MiB, MiB) == data
    raw = backing.read_bytes()
    assert marker not in raw and marker[:16] not in raw, (
        "the plaintext is on the backing store")
    # the ciphertext is there, and it is not a block of zeros either
    assert raw[4 * MiB:5 * MiB] != bytes(MiB)
    srv.stop()


# --------------------------------------------------------------- integrity

@pytest.mark.parametrize("sector,fast", variants(
    [pytest.param(s, f, id=f"{s}-{f}") for s in (512, 4096)
     for f in ("off", "on", "cache")],
    # each fast-path mode and each sector size once (test-long: crossed)
    ["512-off", "4096-on", "512-cache"]))
def test_encrypt_fio_verify_random_rw_over_two_queues(enc, tmp_path, fast,
                                                      sector):
    tool("fio")
    backing = sparse(tmp_path / "backing", 64 * MiB)
    key = tmp_path / "key"
    make_key(key, 512, "fio")
    srv = enc.serve(backing, key, "--sector-size", str(sector), "--queues",
                    str(QUEUES), "--depth", "32", fast=fast)
    for bs, per_job in ((4096, "4M"), (64 << 10, "8M")):
        fio_verify(srv.dev, bs, per_job, JOBS)
    s = info(srv.dev)["stats"]
    assert s["slow_errors"] == 0 and s["fast_errors"] == 0, s
    srv.stop()


@pytest.mark.parametrize("read_blocks", [1, 8])
def test_encrypt_cache_serves_no_stale_read_under_overlapping_writes(
        enc, tmp_path, read_blocks):
    """The stale-read stress on the plaintext cache, with 4 KiB reads and
    with 32 KiB ones (one stamp for 8 blocks: hybd_ver_stamp_blocks())."""
    need_built(STALE_CHECK, "tests/helpers/stale_check")
    backing = sparse(tmp_path / "backing", 16 * MiB)
    key = tmp_path / "key"
    make_key(key, 512, "stale")
    srv = enc.serve(backing, key, "--queues", str(QUEUES), "--depth", "32",
                    fast="cache")
    before = info(srv.dev)["stats"]
    res = run([STALE_CHECK, srv.dev, "--blocks", "32", "--writers", "2",
               "--readers", "2", "--seconds", str(STALE_SECONDS),
               "--read-blocks", str(read_blocks)],
              timeout=STALE_SECONDS + 120)
    out = res.stdout + res.stderr
    m = STALE_RE.search(res.stdout)
    assert m, f"stale_check: exit {res.returncode}, no result line:\n{out}"
    c = dict(zip(STALE_KEYS, map(int, m.groups()[:6])))
    fast = info(srv.dev)["stats"]["fast_done"] - before["fast_done"]
    print(f"stale_check (cache, {read_blocks} blocks a read): {c}, "
          f"fast reads {fast}")
    assert c["errors"] == 0, out
    assert c["stale"] == 0, f"the device returned stale data:\n{out}"
    assert c["corrupt"] == 0, out
    assert res.returncode == 0, out
    assert c["reads"] >= 500 and c["writes"] >= 100, c
    assert fast > 0, f"the cache served none of {c['reads']} reads"
    srv.stop()


# ------------------------------------------------------------------ holes

def fast_slow(dev, before):
    after = info(dev)["stats"]
    return (after["fast_done"] - before["fast_done"],
            after["slow_issued"] - before["slow_issued"])


@pytest.mark.parametrize("fast", ["off", "on"])
def test_encrypt_holes_read_as_zeros_in_the_kernel_after_a_restart(
        enc, tmp_path, fast):
    """Never-written blocks read as zeros, from the fast path when it is
    on (from its first request after a restart: the holes come from the
    file), from the slow path when it is off; a write into a hole stops it
    being one before it completes; a partial write pads its block."""
    on = fast == "on"
    backing = sparse(tmp_path / "backing", 64 * MiB)
    key = tmp_path / "key"
    make_key(key, 256, "holes")
    args = ["--key-size", "256"]
    data = pattern("holes", 256 * BLOCK)
    srv = enc.serve(backing, key, *args, fast=fast)
    direct_write(srv.dev, 0, data)
    flush(srv.dev)
    srv.stop()
    # the file has the data and nothing else
    assert allocated(backing) == 256 * BLOCK, allocated(backing)

    srv = enc.serve(backing, key, *args, fast=fast)
    before = info(srv.dev)["stats"]
    for off in range(256 * BLOCK, 512 * BLOCK, 16 * BLOCK):
        assert direct_read(srv.dev, off, 16 * BLOCK) == bytes(16 * BLOCK), (
            f"blocks at {off // BLOCK} are not zeros after the restart")
    assert fast_slow(srv.dev, before) == ((16, 0) if on else (0, 16))
    before = info(srv.dev)["stats"]
    got = b"".join(direct_read(srv.dev, off, 16 * BLOCK)
                   for off in range(0, 256 * BLOCK, 16 * BLOCK))
    assert got == data, first_difference(got, data)
    assert fast_slow(srv.dev, before) == (0, 16)

    # a hole written with data stops being one before the write completes
    block = pattern("hole-write", BLOCK)
    direct_write(srv.dev, 400 * BLOCK, block)
    assert direct_read(srv.dev, 400 * BLOCK, 2 * BLOCK) == block + bytes(BLOCK)
    # 512 bytes into a hole: the rest of its block reads zeros, and is
    # written as encrypted zeros (the file gains the whole block)
    alloc = allocated(backing)
    piece = pattern("hole-piece", 512)
    direct_write(srv.dev, 500 * BLOCK + 1024, piece)
    want = bytes(1024) + piece + bytes(BLOCK - 1536)
    assert direct_read(srv.dev, 500 * BLOCK, BLOCK) == want
    assert allocated(backing) == alloc + BLOCK
    srv.stop()
    srv = enc.serve(backing, key, *args, fast=fast)
    assert direct_read(srv.dev, 500 * BLOCK, BLOCK) == want
    assert direct_read(srv.dev, 400 * BLOCK, 2 * BLOCK) == block + bytes(BLOCK)
    srv.stop()
    with dm_crypt(backing, key, 256, 512, False) as mapper:
        assert direct_read(mapper, 500 * BLOCK, BLOCK) == want


def test_encrypt_concurrent_sector_writes_into_holes_all_land(enc, tmp_path):
    """8 threads write distinct 512-byte sectors of the same fresh holes at
    once, in random order: each write pads its block with encrypted zeros
    if it finds it a hole, so without the stripe locks one would undo
    another.  Every sector reads back as written, here, after a restart,
    and through dm-crypt."""
    size = 8 * MiB
    backing = sparse(tmp_path / "backing", size)
    key = tmp_path / "key"
    make_key(key, 512, "sectors")
    nblocks = 64
    sectors = list(range(nblocks * 8))
    random.Random(7).shuffle(sectors)
    data = {s: pattern(f"sector-{s}", 512) for s in sectors}
    srv = enc.serve(backing, key, "--queues", str(QUEUES), "--depth", "32")

    def writer(mine):
        for s in mine:
            direct_write(srv.dev, 1 * MiB + s * 512, data[s])
    threads = [threading.Thread(target=writer, args=(sectors[i::8],))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = b"".join(data[s] for s in range(nblocks * 8))

    def check(dev, what):
        got = direct_read(dev, 1 * MiB, nblocks * BLOCK)
        assert got == want, f"{what}: {first_difference(got, want)}"
    check(srv.dev, "hybd")
    srv.stop()
    padded = re.search(r"padded_blocks=(\d+)", srv.output())
    # each block was padded once, by whichever write found it a hole
    assert padded and int(padded.group(1)) == nblocks, srv.output()
    srv = enc.serve(backing, key)
    check(srv.dev, "hybd after a restart")
    srv.stop()
    with dm_crypt(backing, key, 512, 512, False) as mapper:
        check(mapper, "dm-crypt")


def test_encrypt_second_server_on_one_store_is_refused(enc, tmp_path):
    backing = sparse(tmp_path / "backing", 8 * MiB)
    key = tmp_path / "key"
    make_key(key, 512, "twice")
    srv = enc.serve(backing, key)
    devs = device_ids()
    res = run([ENCRYPT, "--key-file", key, "--no-fast-path", backing])
    assert res.returncode == 1, f"exit {res.returncode}: {res.stderr}"
    assert "served by another process" in res.stderr, res.stderr
    assert device_ids() == devs
    srv.stop()


def test_encrypt_discard_punches_holes_only_when_allowed(enc, tmp_path):
    backing = sparse(tmp_path / "backing", 32 * MiB)
    key = tmp_path / "key"
    make_key(key, 512, "discard")
    data = pattern("discard", 4 * MiB)

    # without --allow-discards the device has no discard, as dm-crypt
    srv = enc.serve(backing, key)
    direct_write(srv.dev, 0, data)
    flush(srv.dev)
    assert (Path("/sys/block") / Path(srv.dev).name / "queue" /
            "discard_max_bytes").read_text().strip() == "0"
    res = run(["blkdiscard", "-o", "0", "-l", str(MiB), srv.dev])
    assert res.returncode != 0, "blkdiscard succeeded without --allow-discards"
    assert direct_read(srv.dev, 0, 4 * MiB) == data
    srv.stop()
    alloc = allocated(backing)

    srv = enc.serve(backing, key, "--allow-discards")
    res = run(["blkdiscard", "-o", str(MiB), "-l", str(MiB), srv.dev])
    assert res.returncode == 0, res.stderr
    assert allocated(backing) == alloc - MiB, "the discard punched no hole"
    before = info(srv.dev)["stats"]
    assert direct_read(srv.dev, MiB, MiB) == bytes(MiB)
    assert fast_slow(srv.dev, before)[0] > 0, "holes not served in the kernel"
    assert direct_read(srv.dev, 0, MiB) == data[:MiB]
    assert direct_read(srv.dev, 2 * MiB, 2 * MiB) == data[2 * MiB:]
    srv.stop()
    srv = enc.serve(backing, key)
    assert direct_read(srv.dev, MiB, MiB) == bytes(MiB)
    srv.stop()


# ------------------------------------------------------------------- ext4

def test_encrypt_ext4_tree_survives_a_server_restart(enc, tmp_path):
    mkfs = tool("mkfs.ext4")
    fsck = tool("fsck.ext4")
    backing = sparse(tmp_path / "backing", 160 * MiB)
    key = tmp_path / "key"
    make_key(key, 512, "ext4")
    src = tmp_path / "src"
    make_tree(src, "encrypt-ext4")
    want = digest_tree(src)
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    srv = enc.serve(backing, key, "--sector-size", "4096", "--cache",
                    fast="cache")
    res = run([mkfs, "-q", "-F", srv.dev], timeout=T_IO)
    assert res.returncode == 0, res.stderr
    run(["mount", srv.dev, mnt], check=True)
    try:
        shutil.copytree(src, mnt / "tree")
    finally:
        res = run(["umount", mnt])
    assert res.returncode == 0, res.stderr
    srv.stop()

    srv = enc.serve(backing, key, "--sector-size", "4096", "--cache",
                    fast="cache")
    res = run([fsck, "-f", "-n", srv.dev], timeout=T_IO)
    assert res.returncode == 0, f"fsck: {res.stdout}{res.stderr}"
    run(["mount", "-o", "ro", srv.dev, mnt], check=True)
    try:
        got = digest_tree(mnt / "tree")
    finally:
        run(["umount", mnt], check=True)
    assert got == want, "the tree differs after the restart"
    srv.stop()


# -------------------------------------------------------------- bad input

B = "{tmp}/backing"
BAD = [
    ("no-key-file", [B], None, r"--key-file FILE .* is required"),
    ("missing-key-file", ["--key-file", "{tmp}/nokey", B], None,
     r"key file .*/nokey: No such file"),
    ("short-key", ["--key-file", "{tmp}/short", B], None,
     r"key file .*/short: 63 bytes, --key-size 512 needs exactly 64"),
    ("long-key", ["--key-file", "{tmp}/long", B], None,
     r"key file .*/long: more than 64 bytes"),
    ("short-stdin-key", ["--key-file", "-", "--key-size", "256", B], 31,
     r"key file -: 31 bytes, --key-size 256 needs exactly 32"),
    ("equal-halves", ["--key-file", "{tmp}/equal", B], None,
     r"refuses the key .*two halves are equal"),
    ("key-size", ["--key-file", "{tmp}/key", "--key-size", "384", B], None,
     r"--key-size 384: .*256 .* or 512"),
    ("sector-size", ["--key-file", "{tmp}/key", "--sector-size", "1024", B],
     None, r"--sector-size 1024: 512 or 4096"),
    ("max-io", ["--key-file", "{tmp}/key", "--max-io", "4M", B], None,
     r"--max-io 4194304: a multiple of 4096, at most 1048576"),
    ("max-io-odd", ["--key-file", "{tmp}/key", "--max-io", "6000", B], None,
     r"--max-io 6000: a multiple of 4096"),
    ("key-on-the-command-line", ["--key", "00" * 64, B], None,
     r"option '--key' is ambiguous|unrecognized option"),
    ("no-backing", ["--key-file", "{tmp}/key", "{tmp}/nothing"], None,
     r"nothing: No such file"),
    ("tiny-backing", ["--key-file", "{tmp}/key", "{tmp}/tiny"], None,
     r"tiny: smaller than 4 KiB"),
    ("backing-is-a-dir", ["--key-file", "{tmp}/key", "{tmp}/dir"], None,
     r"dir: Is a directory"),
]


@pytest.mark.parametrize("name,args,stdin_len,msg", BAD,
                         ids=[b[0] for b in BAD])
def test_encrypt_bad_keys_and_parameters_write_nothing(enc, tmp_path, name,
                                                       args, stdin_len, msg):
    backing = tmp_path / "backing"
    backing.write_bytes(pattern("bad-backing", 4 * MiB))
    (tmp_path / "key").write_bytes(pattern("k", 64))
    (tmp_path / "short").write_bytes(pattern("k", 63))
    (tmp_path / "long").write_bytes(pattern("k", 65))
    (tmp_path / "equal").write_bytes(pattern("k", 32) * 2)
    (tmp_path / "tiny").write_bytes(b"x" * 100)
    (tmp_path / "dir").mkdir()
    argv = [a.format(tmp=tmp_path) for a in args]
    before = (sha(backing), allocated(backing), os.stat(backing).st_mtime_ns)
    devs = device_ids()
    res = subprocess.run([str(ENCRYPT), "--no-fast-path", *argv],
                         input=pattern("stdin-key", stdin_len) if stdin_len else b"",
                         capture_output=True, timeout=60)
    err = res.stderr.decode(errors="replace")
    assert res.returncode in (1, 2), f"exit {res.returncode}: {err}"
    assert re.search(msg, err), f"message {err!r} does not match {msg!r}"
    assert b"ready" not in res.stdout
    assert device_ids() == devs, "a refused start left a device behind"
    assert (sha(backing), allocated(backing),
            os.stat(backing).st_mtime_ns) == before, "the backing store changed"


@pytest.fixture
def core_dumps(tmp_path):
    """Core files go to tmp_path/cores (core.<comm>.<pid>) for this test."""
    cores = tmp_path / "cores"
    cores.mkdir()
    pattern_file = Path("/proc/sys/kernel/core_pattern")
    old_pattern = pattern_file.read_text()
    old_limit = resource.getrlimit(resource.RLIMIT_CORE)
    pattern_file.write_text(f"{cores}/core.%e.%p")
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,
                                              resource.RLIM_INFINITY))
    try:
        yield cores
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, old_limit)
        pattern_file.write_text(old_pattern)


def test_encrypt_server_never_dumps_core(enc, tmp_path, core_dumps):
    """A crashing server leaves no core file (and so no key in one): it
    made itself undumpable.  A dumpable process in the same setting does
    leave one, so the check can fail."""
    res = subprocess.run(["sh", "-c", "kill -ABRT $$"], timeout=30)
    assert res.returncode == -signal.SIGABRT
    wait_for(lambda: any(core_dumps.iterdir()), 10, "the control core file")
    for f in core_dumps.iterdir():
        f.unlink()

    backing = sparse(tmp_path / "backing", 8 * MiB)
    key = tmp_path / "key"
    make_key(key, 512, "core")
    srv = enc.serve(backing, key)
    direct_write(srv.dev, 0, pattern("core-data", BLOCK))
    os.kill(srv.pid, signal.SIGABRT)
    assert srv.proc.wait(timeout=30) == -signal.SIGABRT
    # the device is dead; its pinned fast path outlives the process
    delete_dead(srv, detach=True)
    time.sleep(1)
    assert not list(core_dumps.iterdir()), list(core_dumps.iterdir())


def test_encrypt_key_stays_out_of_sight_and_in_locked_memory(enc, tmp_path):
    """The key is not on the command line, in the output or in the
    environment; the server's memory is locked (VmLck) and it is not
    dumpable; a key given on standard input works the same."""
    backing = sparse(tmp_path / "backing", 16 * MiB)
    key = tmp_path / "key"
    k = make_key(key, 512, "secret")
    srv = enc.serve(backing, key)
    data = pattern("secret-data", MiB)
    direct_write(srv.dev, 0, data)
    proc = Path(f"/proc/{srv.pid}")
    cmdline = (proc / "cmdline").read_bytes()
    environ = (proc / "environ").read_bytes()
    status = (proc / "status").read_text()
    for blob, what in ((cmdline, "cmdline"), (environ, "environ")):
        assert k not in blob and k.hex().encode() not in blob, f"the key is in {what}"
    m = re.search(r"^VmLck:\s+(\d+) kB", status, re.M)
    assert m and int(m.group(1)) > 0, f"no locked memory:\n{status}"
    # mlockall: the heap and stacks are locked too, not only the key's page
    smaps = (proc / "smaps").read_text()
    for name in ("[stack]", "[heap]"):
        m = re.search(re.escape(name) + r"\n(?:.*\n)*?VmFlags:(.*)", smaps)
        if name == "[heap]" and not m:
            continue
        assert m and " lo" in m.group(1), f"{name} is not locked: {m and m.group(1)}"
    srv.stop()
    out = srv.output()
    assert k.hex() not in out and k.hex().upper() not in out

    # the same key on standard input opens the same data
    srv = EncryptServer(enc.servers.start(
        ["sh", "-c", f'exec "{ENCRYPT}" --key-file - --no-fast-path "{backing}" < "{key}"']),
        backing)
    assert direct_read(srv.dev, 0, MiB) == data
    srv.stop()
