# SPDX-License-Identifier: GPL-2.0
"""examples/dedup, the deduplicating block device, end to end: data
integrity over two queues, space accounting (duplicates, zeros, discards,
reuse), crash consistency under SIGKILL, ext4 on top, stale reads, bad and
full stores, and `dedup status`.

Every test runs twice: fast path "off" (--no-fast-path, the slow path
alone) and "on" (--bpf examples/dedup/dedup.bpf.o, whose cache and
hole map must change nothing a reader sees).  The stores are files in the
test's tmp_path (the guest's /tmp, a tmpfs: a store grows with the unique
data written to it, so the devices are small).
"""

import hashlib
import json
import os
import random
import re
import shutil
import struct
import subprocess
import threading
import time
import zlib
from pathlib import Path

import pytest

import hybd_uapi as uapi
from hybdbpf import settle
from hybdlib import (LONG, REPO, T_IO, assert_data, device_ids, direct_read,
                     direct_write, fio_verify, first_difference, hybdctl,
                     info, need_built, pattern, reap, run, stack_of,
                     state_of, sysfs_queue, wait_for)

MiB = 1 << 20
BLOCK = 4096
DEDUP = REPO / "examples" / "dedup" / "dedup"
DEDUP_BPF = REPO / "examples" / "dedup" / "dedup.bpf.o"
STALE_CHECK = REPO / "tests" / "helpers" / "stale_check"
PIN_ROOT = Path("/sys/fs/bpf/hybd")

# what `dedup status --json` prints, every time
STATUS_KEYS = ("source", "store", "device", "pid", "blocks", "logical_bytes",
               "unique_bytes", "dedup_ratio", "zero_blocks", "free_chunks",
               "pending_chunks", "capacity_chunks", "store_bytes", "commits",
               "dedup_hits", "zero_writes", "fast_path", "reads",
               "fast_reads", "remapped_reads", "hit_rate")

# The superblock (store.c, struct dd_super), little-endian at offset 0:
# magic, version, block_size, nr_blocks, nr_chunks, map_off, table_off,
# data_off, uuid, created, hash_alg, crc (zlib crc32 of bytes 0-83).
SUPER = struct.Struct("<8sIIQQQQQ16sQII")
SUPER_FIELDS = ("magic", "version", "block_size", "nr_blocks", "nr_chunks",
                "map_off", "table_off", "data_off", "uuid", "created",
                "hash_alg", "crc")
CRC_OFF = 84

# the guest has 2 vCPUs: one hardware queue each, two fio jobs per queue
QUEUES = 2
JOBS = 2 * QUEUES


def tool(name):
    """The path of an external tool the suite's guest has; fail (never
    skip) if it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed in the guest", pytrace=False)
    return path


def flush(dev):
    """fsync the block device: a flush request, which commits the store."""
    fd = os.open(dev, os.O_WRONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def superblock(store):
    with open(store, "rb") as f:
        raw = f.read(SUPER.size)
    return dict(zip(SUPER_FIELDS, SUPER.unpack(raw)))


def patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# ------------------------------------------------------------------ fixture

class DedupServer:
    """A running `dedup serve`: .dev, .id, .proc, .pid, .store, and the
    hybdlib Server (.srv) that collects its output."""

    def __init__(self, srv, store):
        self.srv = srv
        self.dev, self.id, self.proc = srv.dev, srv.id, srv.proc
        self.store = Path(store)

    @property
    def pid(self):
        return self.srv.pid

    def alive(self):
        return self.srv.alive()

    def output(self):
        return self.srv.output()

    def stop(self):
        """SIGTERM: a final commit, the device deleted, exit 0."""
        self.srv.stop()
        wait_for(lambda: not os.path.exists(self.dev), 10,
                 f"{self.dev} to go away after its server stopped")

    def kill(self):
        self.srv.kill()


class Dedup:
    """What the tests use: format stores, serve them with this test's fast
    path variant, run check and status."""

    def __init__(self, servers, tmp, variant):
        self.servers = servers
        self.tmp = tmp
        self.variant = variant
        if variant == "on":
            self.flags = ["--bpf", str(DEDUP_BPF)]
        else:
            self.flags = ["--no-fast-path"]

    def path(self, name):
        return self.tmp / name if isinstance(name, str) else Path(name)

    def format(self, name, size, force=False):
        store = self.path(name)
        res = run([DEDUP, "format", "--size", size, *(["--force"] if force else []),
                   store])
        assert res.returncode == 0, f"dedup format: exit {res.returncode}: {res.stderr}"
        return store

    def serve(self, store, *extra):
        srv = self.servers.start([DEDUP, "serve", *self.flags, *extra, store])
        want = "fast path attached" if self.variant == "on" else "fast path off"
        said = [l.strip() for l in srv.out if l.startswith("fast path")]
        assert said == [want], f"dedup serve ({self.variant}) said {said}\n{srv.output()}"
        return DedupServer(srv, store)

    def serve_fails(self, store, timeout=30):
        """`dedup serve STORE` must refuse: exit 1, no device made.  Returns
        its stderr."""
        before = device_ids()
        res = run([DEDUP, "serve", *self.flags, store], timeout=timeout)
        assert res.returncode == 1, (
            f"dedup serve {store}: exit {res.returncode}\n{res.stdout}{res.stderr}")
        assert "ready" not in res.stdout, res.stdout
        assert device_ids() == before, "a refused serve left a device behind"
        return res.stderr

    def check(self, store):
        return run([DEDUP, "check", store], timeout=T_IO)

    def check_clean(self, store):
        res = self.check(store)
        lines = res.stdout.strip().splitlines()
        assert res.returncode == 0 and lines and lines[-1].startswith("clean:"), (
            f"dedup check {store}: exit {res.returncode}\n{res.stdout}{res.stderr}")
        return res

    def status(self, what, json_out=True):
        res = run([DEDUP, "status", *(["--json"] if json_out else []), what])
        assert res.returncode == 0, (
            f"dedup status {what}: exit {res.returncode}: {res.stderr}")
        if not json_out:
            return res.stdout
        try:
            st = json.loads(res.stdout)
        except ValueError as e:
            pytest.fail(f"dedup status --json {what}: not JSON ({e}):\n{res.stdout}",
                        pytrace=False)
        missing = [k for k in STATUS_KEYS if k not in st]
        assert not missing, f"dedup status --json lacks {missing}: {st}"
        return st


@pytest.fixture
def fast_path(request):
    """The fast path variant: "off" (--no-fast-path) or "on" (--bpf
    examples/dedup/dedup.bpf.o); see pytest_generate_tests."""
    return request.param


def pytest_generate_tests(metafunc):
    """Every dedup test runs with the fast path off and on in make
    test-long; make test runs each once, on where the test is about what
    the fast path serves (@pytest.mark.fast_path_on), off elsewhere: every
    server start with it on loads and verifies the program, seconds under
    TCG.  A test that parametrizes fast_path itself is left alone."""
    if "fast_path" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        if "fast_path" in mark.args[0]:
            return
    quick = ("on" if metafunc.definition.get_closest_marker("fast_path_on")
             else "off")
    metafunc.parametrize("fast_path", ["off", "on"] if LONG else [quick],
                         indirect=True)


@pytest.fixture
def dedup(servers, tmp_path, fast_path):
    need_built(DEDUP, "examples/dedup/dedup")
    if fast_path == "on" and not DEDUP_BPF.is_file():
        pytest.fail(f"{DEDUP_BPF} not built; run make -C examples/dedup",
                    pytrace=False)
    # the stores live in tmp_path (the guest's tmpfs, memory): the largest
    # a test makes is ~130 MiB, and each goes when its test ends
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    assert free >= 256 * MiB, f"{tmp_path}: only {free >> 20} MiB free"
    yield Dedup(servers, tmp_path, fast_path)
    for f in tmp_path.iterdir():
        if f.is_dir() and not os.path.ismount(f):
            shutil.rmtree(f, ignore_errors=True)
        elif f.is_file():
            f.unlink()


# ---------------------------------------------------------------- integrity

def per_queue_done(dev_id):
    with uapi.Control() as ctl:
        e, queues = uapi.queue_stats(ctl, dev_id)
    assert e == 0, f"HYBD_CTL_STATS: {uapi.errname(e)}"
    return [q["slow_done"] + q["fast_done"] for q in queues]


@pytest.mark.fast_path_on
@pytest.mark.parametrize("bs,per_job", [(4096, "2M"), (64 << 10, "8M")],
                         ids=["4k", "64k"])
def test_dedup_fio_verify_random_rw_over_two_queues(dedup, bs, per_job):
    tool("fio")
    store = dedup.format("store", "128M")
    srv = dedup.serve(store, "--queues", str(QUEUES), "--depth", "32")

    fio_verify(srv.dev, bs, per_job, JOBS)

    s = info(srv.dev)["stats"]
    assert s["slow_errors"] == 0 and s["fast_errors"] == 0, s
    done = per_queue_done(srv.id)
    assert len(done) == QUEUES, done
    assert all(d > 0 for d in done), f"a hardware queue carried no I/O: {done}"
    st = dedup.status(srv.dev)
    assert st["logical_bytes"] > 0 and st["unique_bytes"] > 0, st

    srv.stop()
    dedup.check_clean(store)


# ------------------------------------------------------------ space counted

def test_dedup_space_accounting_duplicates_zeros_discard_and_reuse(dedup):
    blkdiscard = tool("blkdiscard")
    store = dedup.format("store", "256M")
    srv = dedup.serve(store)
    assert int(sysfs_queue(srv.dev, "discard_max_bytes")) > 0
    size0 = os.stat(store).st_size
    st0 = dedup.status(srv.dev)
    blocks = st0["blocks"]
    assert blocks == 256 * MiB // BLOCK, st0
    assert st0["logical_bytes"] == 0 and st0["unique_bytes"] == 0, st0

    # the same 64 MiB twice: stored once
    data = pattern("dedup-space-1", 64 * MiB)
    direct_write(srv.dev, 0, data)
    direct_write(srv.dev, 64 * MiB, data)
    flush(srv.dev)
    st1 = dedup.status(srv.dev)
    size1 = os.stat(store).st_size
    print(f"two copies: {st1}, store {size0} -> {size1}")
    assert st1["logical_bytes"] == 128 * MiB, st1
    assert st1["unique_bytes"] == 64 * MiB, st1
    assert abs(st1["dedup_ratio"] - 2.0) < 0.01, st1
    assert st1["dedup_hits"] - st0["dedup_hits"] >= 64 * MiB // BLOCK, st1
    assert 64 * MiB <= size1 - size0 <= 66 * MiB, (
        f"the store grew by {size1 - size0} bytes for 64 MiB of unique data")
    assert st1["store_bytes"] == size1, st1
    assert st1["zero_blocks"] == blocks - 128 * MiB // BLOCK, st1
    assert st1["commits"] > st0["commits"], "the flush committed nothing"
    assert_data(srv.dev, 0, data, "first copy")
    assert_data(srv.dev, 64 * MiB, data, "second copy")

    # 32 MiB of zeros: holes, nothing stored
    direct_write(srv.dev, 128 * MiB, bytes(32 * MiB))
    flush(srv.dev)
    st2 = dedup.status(srv.dev)
    assert os.stat(store).st_size == size1, "zeros made the store grow"
    assert st2["unique_bytes"] == st1["unique_bytes"], st2
    assert st2["logical_bytes"] == st1["logical_bytes"], st2
    assert st2["zero_blocks"] == blocks - 128 * MiB // BLOCK, st2
    assert_data(srv.dev, 128 * MiB, bytes(32 * MiB), "zeros")

    # discarding both copies frees their chunks (after the flush)
    run([blkdiscard, "-o", "0", "-l", str(128 * MiB), srv.dev], check=True)
    flush(srv.dev)
    st3 = dedup.status(srv.dev)
    print(f"after the discard: {st3}")
    assert st3["unique_bytes"] == 0 and st3["logical_bytes"] == 0, st3
    assert st3["zero_blocks"] == blocks, st3
    assert st3["pending_chunks"] == 0, st3
    assert st3["free_chunks"] == st3["capacity_chunks"], st3
    assert_data(srv.dev, 0, bytes(MiB), "a discarded block")
    assert_data(srv.dev, 127 * MiB, bytes(MiB), "a discarded block")

    # new data reuses the freed chunks: the file does not grow
    new = pattern("dedup-space-2", 64 * MiB)
    direct_write(srv.dev, 192 * MiB, new)
    flush(srv.dev)
    st4 = dedup.status(srv.dev)
    print(f"new data: {st4}, store {os.stat(store).st_size}")
    assert os.stat(store).st_size == size1, (
        f"the store grew from {size1} to {os.stat(store).st_size} although "
        f"64 MiB of chunks were free")
    assert st4["unique_bytes"] == 64 * MiB and st4["logical_bytes"] == 64 * MiB, st4
    assert st4["free_chunks"] == st4["capacity_chunks"] - 64 * MiB // BLOCK, st4
    assert_data(srv.dev, 192 * MiB, new, "data written into reused chunks")

    srv.stop()
    dedup.check_clean(store)


# ------------------------------------------------------------------ SIGKILL

ROUNDS = 10 if LONG else 5    # kills (each round starts two servers)
REGION = 8 * MiB            # where A is written, at REGION
def test_dedup_status_tells_a_dead_server_by_its_lock_not_its_pid(dedup):
    """A server killed with SIGKILL leaves its status file behind, and its
    pid may be some other process's by the time anyone asks: status says
    the server is gone, as the file is no longer locked."""
    store = dedup.format("store", "64M")
    srv = dedup.serve(store)
    live = f"/run/hybd-dedup/hybd{srv.id}.stats"
    wait_for(lambda: os.path.exists(live), 10, live)
    srv.kill()
    # the pid (struct live_stats: magic, size, pid) made a live process's
    with open(live, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<i", os.getpid()))
    res = run([DEDUP, "status", srv.dev])
    assert res.returncode == 1 and "is gone" in res.stderr, res
    kill_and_delete(dedup, srv)


B_START, B_END = 1 * MiB, 7 * MiB   # the part of the region B overwrites


def kill_and_delete(dedup, srv):
    """SIGKILL the server; take its fast path away ("on": it is pinned and
    outlives the process) and delete the dead device."""
    srv.kill()
    wait_for(lambda: info(srv.id)["state"] == "dead", 10, f"{srv.dev} dead")
    if dedup.variant == "on":
        # (it may say there is no fast path left to detach: what counts
        # is that no pin of the device's remains)
        rc, out, err = hybdctl("detach", srv.dev)
        pins = PIN_ROOT / str(srv.id)
        assert not pins.exists() or not any(pins.iterdir()), (
            f"hybdctl detach {srv.dev}: exit {rc}: {out}{err}; left "
            f"{sorted(str(p) for p in pins.rglob('*'))}")
    rc, out, err = hybdctl("del", srv.dev)
    assert rc == 0, f"hybdctl del {srv.dev}: exit {rc}: {out}{err}"
    wait_for(lambda: not os.path.exists(srv.dev), 10, f"{srv.dev} to disappear")


# 20 server starts, each attaching the program with the fast path on: 90 s
# under TCG, several times that in the debug kernel (KASAN, lockdep)
@pytest.mark.fast_path_on
@pytest.mark.time_limit(1500)
def test_dedup_sigkill_keeps_flushed_data_and_never_returns_garbage(
        dedup, spawned, tmp_path):
    dd = tool("dd")
    store = dedup.format("store", "32M")
    rng = random.Random(20240611)
    bfile = tmp_path / "b.bin"
    nblocks = REGION // BLOCK
    b_first, b_last = B_START // BLOCK, B_END // BLOCK
    report = []

    for r in range(ROUNDS):
        a = pattern(f"dedup-kill-A-{r}", REGION)
        b = pattern(f"dedup-kill-B-{r}", REGION)
        bfile.write_bytes(b[B_START:B_END])
        delay = rng.uniform(0.05, 1.0)

        srv = dedup.serve(store)
        direct_write(srv.dev, REGION, a)
        flush(srv.dev)
        # B: unflushed O_DIRECT writes, a block at a time (slow enough
        # that most kills land while it runs), killed under way
        writer = subprocess.Popen(
            [dd, f"if={bfile}", f"of={srv.dev}", "bs=4k", "iflag=fullblock",
             "oflag=direct,seek_bytes", f"seek={REGION + B_START}",
             "conv=notrunc"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        spawned.append(writer)
        time.sleep(delay)
        running = writer.poll() is None
        kill_and_delete(dedup, srv)
        try:
            writer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            state, stack = state_of(writer.pid), stack_of(writer.pid)
            reap(writer)
            pytest.fail(f"dd still running 30s after its server died ({state}):\n"
                        f"{stack}", pytrace=False)
        m = re.search(r"^(\d+) bytes", writer.stderr.read(), re.M)
        b_done = int(m.group(1)) // BLOCK if m else -1

        srv = dedup.serve(store)
        got = direct_read(srv.dev, REGION, REGION)
        n_a = n_b = 0
        for i in range(nblocks):
            blk = got[i * BLOCK:(i + 1) * BLOCK]
            want_a = a[i * BLOCK:(i + 1) * BLOCK]
            if blk == want_a:
                n_a += 1
                continue
            assert b_first <= i < b_last, (
                f"round {r}: block {i} of the region, which only A wrote "
                f"(flushed), is not A's: {first_difference(blk, want_a)}")
            assert blk == b[i * BLOCK:(i + 1) * BLOCK], (
                f"round {r}: block {i} is neither A's nor B's content "
                f"(killed after {delay:.2f}s)")
            n_b += 1
        # nothing outside the region was ever written: holes
        assert_data(srv.dev, 0, bytes(REGION), f"round {r}: before the region")
        srv.stop()
        dedup.check_clean(store)
        report.append(f"round {r}: kill at {delay:.2f}s, writer "
                      f"{'running' if running else 'done'} ({b_done} blocks "
                      f"acknowledged), read back A={n_a} B={n_b}")

    print("\n".join(report))


# --------------------------------------------------------------------- ext4

def make_tree(root, seed):
    """~200 files of random (incompressible) data, block-sized and odd
    sizes, 20-40 MiB in all; returns the total size."""
    rng = random.Random(seed)
    total = 0
    for i in range(200):
        kind = i % 5
        if kind == 0:
            size = BLOCK * rng.randrange(1, 16)
        elif kind == 1:
            size = rng.randrange(1, BLOCK)
        elif kind == 2:
            size = BLOCK * rng.randrange(32, 96) + rng.randrange(1, BLOCK)
        elif kind == 3:
            size = rng.randrange(128 << 10, 768 << 10)
        else:
            size = BLOCK * rng.randrange(1, 4)
        d = root / f"d{i % 8}" / f"e{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(rng.randbytes(size))
        total += size
    return total


def digest_tree(root):
    """{relative path: sha256 of the file}, lost+found left out."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "lost+found"]
        for name in filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.mark.fast_path_on
def test_dedup_ext4_two_copies_of_a_tree_are_stored_once(dedup, tmp_path):
    mkfs = tool("mkfs.ext4")
    fsck = tool("fsck.ext4")
    store = dedup.format("store", "256M")
    srv = dedup.serve(store)
    src = tmp_path / "src"
    total = make_tree(src, seed=7)
    assert 20 * MiB <= total <= 40 * MiB, total
    want = digest_tree(src)
    assert len(want) == 200

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run([mkfs, "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0",
         srv.dev], timeout=T_IO, check=True)
    try:
        run(["mount", "-t", "ext4", srv.dev, mnt], timeout=T_IO, check=True)
        for copy in ("a", "b"):
            run(["cp", "-a", f"{src}/.", mnt / copy], timeout=T_IO, check=True)
        run(["sync"], timeout=T_IO, check=True)
        run(["umount", mnt], timeout=T_IO, check=True)

        res = run([fsck, "-fn", srv.dev], timeout=T_IO)
        assert res.returncode == 0, f"fsck exit {res.returncode}\n{res.stdout}{res.stderr}"

        # read back from the device, not from the first mount's page cache
        run(["blockdev", "--flushbufs", srv.dev], timeout=T_IO, check=True)
        run(["mount", "-t", "ext4", "-o", "ro", srv.dev, mnt], timeout=T_IO,
            check=True)
        for copy in ("a", "b"):
            got = digest_tree(mnt / copy)
            missing = sorted(set(want) - set(got))[:5]
            changed = sorted(k for k in want if k in got and got[k] != want[k])[:5]
            assert got == want, f"copy {copy}: missing {missing}, changed {changed}"
        run(["umount", mnt], timeout=T_IO, check=True)
    finally:
        if os.path.ismount(mnt):
            run(["umount", "-l", mnt], timeout=T_IO)

    st = dedup.status(srv.dev)
    print(f"ext4: tree {total} bytes, dedup_ratio {st['dedup_ratio']}, "
          f"logical {st['logical_bytes']}, unique {st['unique_bytes']}, "
          f"store {st['store_bytes']}")
    assert st["logical_bytes"] >= 2 * total, st
    assert 1.6 <= st["dedup_ratio"] <= 2.1, st
    assert st["unique_bytes"] >= total, st
    srv.stop()
    dedup.check_clean(store)


# --------------------------------------------------------------- stale reads

STALE_RE = re.compile(
    r"^reads=(\d+) writes=(\d+) stale=(\d+) corrupt=(\d+) torn=(\d+) "
    r"errors=(\d+) seconds=([\d.]+)$", re.M)
STALE_KEYS = ("reads", "writes", "stale", "corrupt", "torn", "errors")
STALE_SECONDS = 10


@pytest.mark.fast_path_on
def test_dedup_serves_no_stale_read_under_overlapping_writes(dedup):
    need_built(STALE_CHECK, "tests/helpers/stale_check")
    store = dedup.format("store", "16M")
    srv = dedup.serve(store, "--queues", str(QUEUES), "--depth", "32")
    before = dedup.status(srv.dev)

    # as test_bpf_consistency.py: 2 writers, 2 readers over 32 hot blocks
    res = run([STALE_CHECK, srv.dev, "--blocks", "32", "--writers", "2",
               "--readers", "2", "--seconds", str(STALE_SECONDS)],
              timeout=STALE_SECONDS + 120)
    out = res.stdout + res.stderr
    m = STALE_RE.search(res.stdout)
    assert m, f"stale_check: exit {res.returncode}, no result line:\n{out}"
    c = dict(zip(STALE_KEYS, map(int, m.groups()[:6])))
    after = dedup.status(srv.dev)
    fast = after["fast_reads"] - before["fast_reads"]
    print(f"stale_check ({dedup.variant}): {c}, fast reads {fast} of "
          f"{after['reads'] - before['reads']}")

    assert c["errors"] == 0, out
    assert c["stale"] == 0, f"the device returned stale data:\n{out}"
    assert c["corrupt"] == 0, out
    assert res.returncode == 0, out
    assert c["reads"] >= 500 and c["writes"] >= 100, c
    if dedup.variant == "on":
        # a cache that never hits proves nothing here
        assert fast > 0, f"the fast path served none of {c['reads']} reads"
    srv.stop()
    dedup.check_clean(store)


# ---------------------------------------------------------------- bad input

@pytest.mark.fast_path_on
def test_dedup_holes_and_hot_blocks_are_served_in_the_kernel_after_a_restart(
        dedup):
    """The fast path's hole map is exact from the first request after a
    restart (serve seeds it before the device starts): never-written,
    discarded and zero-written blocks read as zeros in the kernel; data
    reads fill the cache and hit the second time; a hole written with data
    reads the data at once."""
    store = dedup.format("store", "64M")
    srv = dedup.serve(store)
    data = pattern("dedup-restart", 384 * BLOCK)
    direct_write(srv.dev, 0, data)
    run(["blkdiscard", "-o", str(256 * BLOCK), "-l", str(64 * BLOCK), srv.dev])
    direct_write(srv.dev, 320 * BLOCK, bytes(64 * BLOCK))
    flush(srv.dev)
    srv.stop()

    srv = dedup.serve(store)
    on = dedup.variant == "on"
    before = info(srv.dev)["stats"]
    for off in range(256 * BLOCK, 512 * BLOCK, 16 * BLOCK):
        assert direct_read(srv.dev, off, 16 * BLOCK) == bytes(16 * BLOCK), (
            f"blocks at {off // BLOCK} are not zeros after the restart")
    after = info(srv.dev)["stats"]
    fast = after["fast_done"] - before["fast_done"]
    slow = after["slow_issued"] - before["slow_issued"]
    # 16 reads of holes: all in the kernel with the fast path, none without
    assert (fast, slow) == ((16, 0) if on else (0, 16)), (fast, slow)

    expect = data[:256 * BLOCK]
    for rnd in range(2):
        before = info(srv.dev)["stats"]
        got = b"".join(direct_read(srv.dev, off, 16 * BLOCK)
                       for off in range(0, 256 * BLOCK, 16 * BLOCK))
        assert got == expect, (
            f"pass {rnd}: first difference at byte {first_difference(got, expect)}")
        after = info(srv.dev)["stats"]
        fast = after["fast_done"] - before["fast_done"]
        remapped = after["remapped"] - before["remapped"]
        if rnd == 0:
            # nothing cached yet: in the kernel only by a remap to the
            # store (a read whose chunks lie one after the other there)
            assert fast == remapped, f"pass 0: {fast} in the kernel, " \
                f"{remapped} remapped"
        else:
            # the first pass filled the cache; the second hits
            want = 16 if on else 0
            assert (fast, remapped) == (want, 0), \
                f"pass 1: {fast} reads in the kernel, not {want}"

    # a hole written with data stops being one before the write completes
    block = pattern("dedup-restart-hole", BLOCK)
    direct_write(srv.dev, 400 * BLOCK, block)
    assert direct_read(srv.dev, 400 * BLOCK, BLOCK) == block
    assert direct_read(srv.dev, 400 * BLOCK, 2 * BLOCK) == block + bytes(BLOCK)
    st = dedup.status(srv.dev)
    assert st["fast_path"] is on, st
    assert (st["hit_rate"] > 0) is on, st
    srv.stop()
    dedup.check_clean(store)


def dedup_bss(dev):
    st = json.loads(hybdctl("stats", str(dev), "--maps", "--json")[1])
    names = [m for m in st["maps"] if m.endswith(".bss")]
    assert len(names) == 1, st["maps"]
    return st["maps"][names[0]]


@pytest.mark.parametrize("fast_path", ["on"], indirect=True)
def test_dedup_mapped_reads_are_remapped_to_the_store(dedup):
    """Reads of stored blocks go straight to the store in the kernel (the
    server sees none), with the right data; blocks moved by overwrites,
    whose freed chunks are reused after a flush, read their new data, and
    the old offsets are never read for them."""
    store = dedup.format("store", "64M")
    srv = dedup.serve(store, "--queues", str(QUEUES))
    assert any(l.startswith("remapped reads on") for l in srv.srv.out), \
        srv.srv.output()
    blocks = 256
    data = [pattern(f"remap-{i}", BLOCK) for i in range(blocks)]
    for i in range(blocks):
        direct_write(srv.dev, i * BLOCK, data[i])
    flush(srv.dev)

    before, b0 = info(srv.dev)["stats"], dedup_bss(srv.dev)
    order = list(range(blocks))
    random.Random(11).shuffle(order)
    for i in order:
        got = direct_read(srv.dev, i * BLOCK, BLOCK)
        assert got == data[i], (i, first_difference(got, data[i]))
    after, b1 = info(srv.dev)["stats"], dedup_bss(srv.dev)
    # one block each, never cached before: every one remapped
    assert after["remapped"] - before["remapped"] == blocks, after
    assert after["slow_issued"] == before["slow_issued"], after
    assert b1["remap_hits"] - b0["remap_hits"] == blocks, b1
    assert after["fast_errors"] == 0, after

    # overwrite half, flush (the freed chunks become reusable, after the
    # remap barrier), write new data into them, flush again: every block
    # reads its own data, by remap (new blocks) and from the cache
    for rnd in range(3):
        for i in range(rnd % 2, blocks, 2):
            data[i] = pattern(f"remap-{rnd}-{i}", BLOCK)
            direct_write(srv.dev, i * BLOCK, data[i])
        flush(srv.dev)
        for i in order:
            got = direct_read(srv.dev, i * BLOCK, BLOCK)
            assert got == data[i], (rnd, i, first_difference(got, data[i]))
    st = dedup.status(srv.dev)
    assert st["free_chunks"] > 0 or st["pending_chunks"] > 0, st
    assert st["remapped_reads"] >= blocks * 2, st
    s = info(srv.dev)["stats"]
    assert s["slow_errors"] == 0 and s["fast_errors"] == 0, s
    srv.stop()
    dedup.check_clean(store)


@pytest.mark.parametrize("fast_path", ["on"], indirect=True)
def test_dedup_large_sequential_reads_of_new_data_are_remapped(dedup):
    """New data written in large requests lies in the store as on the
    device, each write request's chunks one after the other, even when the
    handler threads of both queues write at once: every 128 KiB read of it
    is remapped whole in the kernel (issue 23: none was, the chunks of
    requests written at once interleaved), and a 1 MiB read of a 1 MiB
    write is one remap too on a device that takes 1 MiB requests."""
    store = dedup.format("store", "64M")
    srv = dedup.serve(store, "--queues", str(QUEUES), "--max-io", "1M",
                      "--depth", "16")
    size, piece, writers = 2 * MiB, 128 << 10, 4
    data = os.urandom(size)
    # 4 writers, 128 KiB requests (what the block layer makes of a 1 MiB
    # write on a device of 128 KiB requests, dedup's default), 4 at once
    errors = []

    def writer(first):
        try:
            for off in range(first * piece, size, writers * piece):
                direct_write(srv.dev, off, data[off:off + piece])
        except Exception as e:      # reported below, in the test's thread
            errors.append(e)
    threads = [threading.Thread(target=writer, args=(i,))
               for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    settle()

    before, b0 = info(srv.dev)["stats"], dedup_bss(srv.dev)
    for off in range(0, size, piece):
        got = direct_read(srv.dev, off, piece)
        assert got == data[off:off + piece], (
            f"128 KiB at {off}: first difference at byte "
            f"{first_difference(got, data[off:off + piece])}")
    after, b1 = info(srv.dev)["stats"], dedup_bss(srv.dev)
    reads = size // piece
    assert after["remapped"] - before["remapped"] == reads, (
        f"{after['remapped'] - before['remapped']} of {reads} 128 KiB "
        f"reads remapped; the program: {b1}")
    assert after["slow_issued"] == before["slow_issued"], after
    assert b1["remap_hits"] - b0["remap_hits"] == reads, b1

    # one request of 1 MiB is one run, and its read one remap (the
    # program checks every block of it, beyond its 32-block cache bound)
    more = os.urandom(MiB)
    direct_write(srv.dev, size, more)
    settle()
    before = info(srv.dev)["stats"]
    assert direct_read(srv.dev, size, MiB) == more
    after = info(srv.dev)["stats"]
    assert after["remapped"] - before["remapped"] == 1, after
    assert after["slow_issued"] == before["slow_issued"], after
    assert after["fast_errors"] == 0 and after["slow_errors"] == 0, after
    srv.stop()
    dedup.check_clean(store)


def test_dedup_truncated_store_is_refused(dedup):
    store = dedup.format("store", "64M")
    data_off = superblock(store)["data_off"]
    for cut in (data_off // 2, 2000):
        os.truncate(store, cut)
        err = dedup.serve_fails(store)
        assert "truncated" in err, f"{cut} bytes: dedup serve said {err!r}"
        res = dedup.check(store)
        assert res.returncode == 1, res
        assert "truncated" in res.stderr, f"{cut} bytes: dedup check said {res.stderr!r}"


@pytest.mark.parametrize("kind", ["random", "short"])
def test_dedup_file_that_is_not_a_store_is_refused(dedup, kind):
    """Whatever its size, a file without the magic is not a store (a short
    or empty file is no truncated store either: 'run dedup format' is the
    advice its user needs)."""
    if kind == "random":
        files = [dedup.path("random")]
        files[0].write_bytes(pattern("not-a-store", MiB))
    else:
        files = [dedup.path("text"), dedup.path("empty")]
        files[0].write_text("this is not a dedup store\n" * 3)
        files[1].write_bytes(b"")
    for f in files:
        err = dedup.serve_fails(f)
        assert "not a dedup store" in err, f"{f.name}: dedup serve said {err!r}"
        res = dedup.check(f)
        assert res.returncode == 1, res
        assert "not a dedup store" in res.stderr, (
            f"{f.name}: dedup check said {res.stderr!r}")


def test_dedup_newer_format_version_is_refused(dedup):
    store = dedup.format("store", "64M")
    with open(store, "r+b") as f:
        sb = bytearray(f.read(CRC_OFF))
        struct.pack_into("<I", sb, 8, 2)
        f.seek(0)
        f.write(sb + struct.pack("<I", zlib.crc32(bytes(sb))))
    assert superblock(store)["version"] == 2
    err = dedup.serve_fails(store)
    assert "format version 2" in err, err
    res = dedup.check(store)
    assert res.returncode == 1 and "format version 2" in res.stderr, res


def test_dedup_corrupt_superblock_is_refused(dedup):
    store = dedup.format("store", "64M")
    with open(store, "r+b") as f:
        f.seek(20)                  # in nr_blocks
        byte = f.read(1)[0]
        f.seek(20)
        f.write(bytes([byte ^ 0x10]))
    err = dedup.serve_fails(store)
    assert "checksum" in err, err
    res = dedup.check(store)
    assert res.returncode == 1 and "checksum" in res.stderr, res


def test_dedup_check_names_a_corrupt_chunk(dedup):
    store = dedup.format("store", "64M")
    srv = dedup.serve(store)
    direct_write(srv.dev, 0, pattern("dedup-corrupt", MiB))
    flush(srv.dev)
    srv.stop()
    dedup.check_clean(store)

    # the file's last 4 KiB block is the chunk with the highest id
    size = os.stat(store).st_size
    chunk = (size - superblock(store)["data_off"]) // BLOCK
    assert chunk == MiB // BLOCK, f"{size} bytes: {chunk} chunks"
    with open(store, "r+b") as f:
        f.seek(size - BLOCK + 100)
        byte = f.read(1)[0]
        f.seek(size - BLOCK + 100)
        f.write(bytes([byte ^ 1]))
    res = dedup.check(store)
    lines = res.stdout.strip().splitlines()
    assert res.returncode == 1, f"dedup check: exit {res.returncode}\n{res.stdout}"
    assert lines and lines[-1].startswith("damaged:"), res.stdout
    named = [l for l in lines if re.match(rf"chunk {chunk}\b", l)]
    assert named, f"dedup check does not name chunk {chunk}:\n{res.stdout}"
    assert len(lines) == 2, f"one problem, one summary:\n{res.stdout}"


def test_dedup_map_pointing_past_the_end_is_refused(dedup):
    store = dedup.format("store", "64M")
    srv = dedup.serve(store)
    direct_write(srv.dev, 0, pattern("dedup-past-end", MiB))
    flush(srv.dev)
    srv.stop()
    # the last chunk cut off: one block maps past the end of the store
    os.truncate(store, os.stat(store).st_size - BLOCK)
    err = dedup.serve_fails(store)
    assert "past the end" in err, err
    res = dedup.check(store)
    assert res.returncode == 1, res
    assert "past the end" in res.stdout, res.stdout
    assert res.stdout.strip().splitlines()[-1].startswith("damaged:"), res.stdout


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 48 MiB tmpfs, unmounted at teardown."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    run(["mount", "-t", "tmpfs", "-o", "size=48M", "tmpfs", mnt], check=True)
    yield mnt
    res = run(["umount", mnt])
    if res.returncode != 0:
        run(["umount", "-l", mnt])


def test_dedup_full_store_fails_writes_and_loses_nothing_acknowledged(
        dedup, small_tmpfs, tmp_path):
    dd = tool("dd")
    store = dedup.format(small_tmpfs / "store", "128M")
    srv = dedup.serve(store)
    try:
        first = pattern("dedup-nospc-1", 16 * MiB)
        direct_write(srv.dev, 0, first)
        flush(srv.dev)
        big = tmp_path / "big.bin"
        big.write_bytes(pattern("dedup-nospc-2", 64 * MiB))

        res = run([dd, f"if={big}", f"of={srv.dev}", "bs=1M", "iflag=fullblock",
                   "oflag=direct,seek_bytes", f"seek={16 * MiB}",
                   "conv=notrunc"], timeout=T_IO)
        print(f"dd: exit {res.returncode}: {res.stderr}")
        assert res.returncode != 0, "64 MiB of unique data fit in a 48 MiB tmpfs?"
        assert re.search(r"No space left on device|Input/output error",
                         res.stderr), res.stderr
        m = re.search(r"^(\d+) bytes", res.stderr, re.M)
        assert m, res.stderr
        acked = int(m.group(1))
        assert acked < 64 * MiB, res.stderr
        assert srv.alive(), f"the server died of a full store\n{srv.output()}"
        assert info(srv.dev)["state"] == "live"

        # what was acknowledged reads back, before and after a flush
        assert_data(srv.dev, 0, first, "data flushed before the store filled")
        want = big.read_bytes()[:acked]
        assert_data(srv.dev, 16 * MiB, want, "writes dd saw succeed")
        flush(srv.dev)
        st = dedup.status(srv.dev)
        print(f"full store: {st}")
        assert st["unique_bytes"] >= 16 * MiB + acked, st
        assert_data(srv.dev, 0, first, "after the flush")
        srv.stop()
    finally:
        srv.srv.cleanup()
    dedup.check_clean(store)
    st = dedup.status(store)
    assert st["unique_bytes"] >= 16 * MiB + acked, st


def test_dedup_format_refuses_an_existing_store_without_force(dedup):
    store = dedup.format("store", "64M")
    srv = dedup.serve(store)
    data = pattern("dedup-format", MiB)
    direct_write(srv.dev, 0, data)
    # a served store is refused even with --force
    res = run([DEDUP, "format", "--size", "64M", "--force", store])
    assert res.returncode == 1 and "in use" in res.stderr, res
    srv.stop()
    before = hashlib.sha256(store.read_bytes()).hexdigest()

    res = run([DEDUP, "format", "--size", "64M", store])
    assert res.returncode == 1, res
    assert "--force" in res.stderr, res.stderr
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before, (
        "a refused format changed the store")
    assert dedup.status(store)["logical_bytes"] == MiB

    dedup.format(store, "64M", force=True)
    st = dedup.status(store)
    assert st["logical_bytes"] == 0 and st["unique_bytes"] == 0, st


def test_dedup_served_store_is_refused_by_a_second_server_and_check(dedup):
    store = dedup.format("store", "64M")
    srv = dedup.serve(store)
    data = pattern("dedup-in-use", MiB)
    direct_write(srv.dev, 0, data)

    err = dedup.serve_fails(store)
    assert "in use" in err, err
    res = dedup.check(store)
    assert res.returncode == 1, f"dedup check of a served store: {res}"
    assert "in use" in res.stderr, res.stderr
    # the first server carries on
    assert srv.alive()
    assert_data(srv.dev, 0, data, "the first server's data")
    srv.stop()
    dedup.check_clean(store)


# ------------------------------------------------------------------- status

def test_dedup_status_human_and_json(dedup):
    store = dedup.format("store", "64M")
    srv = dedup.serve(store)
    data = pattern("dedup-status", MiB)
    direct_write(srv.dev, 0, data)
    direct_write(srv.dev, 8 * MiB, data)
    assert_data(srv.dev, 8 * MiB, data)

    text = dedup.status(srv.dev, json_out=False)
    assert re.search(r"^dedup ratio:\s+2\.00$", text, re.M), text
    assert f"{srv.dev} (server pid {srv.pid})" in text, text
    want_fp = "attached" if dedup.variant == "on" else "off"
    assert re.search(rf"^fast path:\s+{want_fp},", text, re.M), text

    st = dedup.status(srv.dev)
    assert st["source"] == "server", st
    assert st["device"] == srv.dev and st["pid"] == srv.pid, st
    assert st["store"] == os.path.realpath(store), st
    assert st["blocks"] == 64 * MiB // BLOCK, st
    assert st["logical_bytes"] == 2 * MiB and st["unique_bytes"] == MiB, st
    assert st["dedup_ratio"] == 2.0, st
    assert st["fast_path"] is (dedup.variant == "on"), st
    assert st["reads"] >= 1, st         # the read back above
    assert 0 <= st["fast_reads"] <= st["reads"] and 0 <= st["hit_rate"] <= 1, st
    assert st["capacity_chunks"] >= st["blocks"], st
    assert st["store_bytes"] == os.stat(store).st_size, st

    srv.stop()
    # the device is gone: status says so
    res = run([DEDUP, "status", srv.dev])
    assert res.returncode == 1, res
    # the store, read by status itself
    st = dedup.status(store)
    assert st["source"] == "store", st
    assert st["device"] is None and st["pid"] is None, st
    assert st["logical_bytes"] == 2 * MiB and st["unique_bytes"] == MiB, st
    assert st["dedup_ratio"] == 2.0 and st["fast_path"] is False, st
