# SPDX-License-Identifier: GPL-2.0
"""examples/zram-rs, the compressed RAM disk written in Rust with the hybd
crate, and the crate's own overview example (rust/hybd/examples/ramdisk.rs):
data verified at QD1 and QD32, discard frees memory, the memory limit
refuses writes with ENOSPC and says so, the fast path serves zero reads in
the kernel."""
import errno
import json
import os
import time
from pathlib import Path

import pytest

from hybdbpf import delta, stats
from hybdlib import (LONG, REPO, RUST_RAMDISK, ZRAM_RS, T_IO, assert_data,
                     direct_read, direct_write, fio_verify, need_built,
                     pattern, run, variants, wait_for)

MiB = 1 << 20
ZRAM_BPF = REPO / "examples" / "zram-rs" / "zram.bpf.o"


@pytest.fixture
def zram(servers, tmp_path):
    """zram(*args) starts zram-rs --stats FILE ARGS; returns the Server,
    with .zstats() reading the stats file (fresh: it waits for a write
    after the call)."""
    need_built(ZRAM_RS, "make rust")

    def start(*args):
        path = tmp_path / f"zram-{len(list(tmp_path.iterdir()))}.json"
        srv = servers.start([str(ZRAM_RS), "--stats", str(path), *args])

        def zstats():
            t = time.time()
            wait_for(lambda: path.exists() and path.stat().st_mtime > t,
                     10, "zram-rs's stats file rewritten")
            return json.loads(path.read_text())
        srv.zstats = zstats
        return srv
    return start


def test_rust_overview_example_serves_and_deletes(servers):
    """The rustdoc overview's RAM disk: what is written reads back, a
    discard reads zeros, SIGTERM deletes the device."""
    need_built(RUST_RAMDISK, "make rust")
    srv = servers.start([str(RUST_RAMDISK), "16"])
    data = pattern("rust-ramdisk", MiB)
    direct_write(srv.dev, 3 * MiB, data)
    assert_data(srv.dev, 3 * MiB, data, "the Rust ramdisk")
    run(["blkdiscard", "-o", str(3 * MiB), "-l", str(MiB), srv.dev],
        check=True)
    assert direct_read(srv.dev, 3 * MiB, MiB) == bytes(MiB)
    srv.stop()
    assert not Path(srv.dev).exists()


# qd x the fast path x the handlers' threads (inline, or a pool of 4 per
# queue) x queues x the compressor: make test takes two cases that cover
# every value, make test-long all of them
FIO_CASES = [pytest.param(qd, fast, threads, queues, algo,
                          id=f"qd{qd}-{fast}-t{threads}-q{queues}-{algo}")
             for qd in (1, 32) for fast in ("slow", "fast")
             for threads in (0, 4) for queues in (1, 2)
             for algo in ("lz4", "zstd")]


@pytest.mark.parametrize("qd,fast,threads,queues,algo",
                         variants(FIO_CASES, ["qd1-slow-t0-q1-zstd",
                                              "qd32-fast-t4-q2-lz4"]))
def test_zram_fio_verify(zram, qd, fast, threads, queues, algo):
    args = ["--size", "64M", "--queues", str(queues),
            "--threads", str(threads), "--algo", algo]
    if fast == "fast":
        args += ["--fastpath", str(ZRAM_BPF)]
    srv = zram(*args)
    before = stats(srv.dev)
    # fio's random reads also land on blocks not yet written: zeros, which
    # the fast path completes in the kernel; verify then reads back every
    # block written (half compressible)
    fio_verify(srv.dev, "4k", "16M" if qd > 1 else "4M", 2, iodepth=qd,
               extra=["--buffer_compress_percentage=50",
                      "--refill_buffers"])
    d = delta(stats(srv.dev), before)
    assert (d["fast_done"] > 0) == (fast == "fast"), d
    st = srv.zstats()
    assert st["comp_algorithm"] == algo
    assert st["orig_data_size"] > 0
    assert 0 < st["compr_data_size"] < st["orig_data_size"], st
    srv.stop()


def test_zram_zstd_packs_tighter_than_lz4(zram):
    """The same varied text through each compressor: both read back, zstd
    takes less memory, as zram's zstd does; a compressor zram-rs does not
    have is refused with words."""
    text = "".join(f"{i:08} hybd zram-rs block {i * 7 % 13} of {i % 5}\n"
                   for i in range(2 * MiB // 30)).encode()[:2 * MiB]
    size = {}
    for algo in ("lz4", "zstd"):
        srv = zram("--size", "16M", "--algo", algo)
        direct_write(srv.dev, 0, text)
        assert_data(srv.dev, 0, text, algo)
        st = srv.zstats()
        assert st["comp_algorithm"] == algo and \
            st["orig_data_size"] == 2 * MiB, st
        size[algo] = st["compr_data_size"]
        srv.stop()
    assert 0 < size["zstd"] < size["lz4"] < 2 * MiB, size
    res = run([str(ZRAM_RS), "--size", "16M", "--algo", "deflate"],
              timeout=T_IO)
    assert res.returncode == 2 and "lz4 or zstd" in res.stderr, res.stderr


def test_zram_compresses_and_discard_frees_memory(zram):
    srv = zram("--size", "64M")
    text = (b"hybd zram-rs compresses text like this line. " * 200000)[:8 * MiB]
    direct_write(srv.dev, 0, text)
    direct_write(srv.dev, 8 * MiB, pattern("zram-rnd", 4 * MiB))
    direct_write(srv.dev, 12 * MiB, bytes(4 * MiB))
    st = srv.zstats()
    assert st["orig_data_size"] == 16 * MiB, st
    assert st["same_pages"] == 1024, "the zero pages are same-filled"
    assert st["huge_pages"] == 1024, "random data is stored whole"
    assert 4 * MiB < st["compr_data_size"] < 5 * MiB, st
    assert st["ratio"] > 3
    assert_data(srv.dev, 0, text, "compressed text")
    run(["blkdiscard", "-o", "0", "-l", str(16 * MiB), srv.dev], check=True)
    st = srv.zstats()
    assert (st["orig_data_size"], st["compr_data_size"]) == (0, 0), st
    assert direct_read(srv.dev, 0, MiB) == bytes(MiB)
    srv.stop()


def test_zram_memory_limit_refuses_writes_with_enospc(zram):
    srv = zram("--size", "64M", "--mem-limit", "4M")
    kept = pattern("zram-kept", 3 * MiB)
    direct_write(srv.dev, 0, kept)
    with pytest.raises(OSError) as e:
        direct_write(srv.dev, 8 * MiB, pattern("zram-over", 4 * MiB))
    assert e.value.errno == errno.ENOSPC, e.value
    st = srv.zstats()
    assert st["limit_refusals"] >= 1
    assert st["compr_data_size"] <= 4 * MiB, st
    assert_data(srv.dev, 0, kept, "written before the limit")
    # zeros need no memory: still accepted; a discard makes room
    direct_write(srv.dev, 16 * MiB, bytes(MiB))
    run(["blkdiscard", "-o", "0", "-l", str(3 * MiB), srv.dev], check=True)
    direct_write(srv.dev, 8 * MiB, pattern("zram-over", 2 * MiB))
    srv.stop()
    assert "memory limit" in "".join(srv.err), srv.output()


def test_zram_fast_path_serves_zero_reads_in_the_kernel(zram):
    srv = zram("--size", "64M", "--fastpath", str(ZRAM_BPF))
    data = pattern("zram-fast", MiB)
    direct_write(srv.dev, 0, data)
    direct_write(srv.dev, 4 * MiB, bytes(MiB))      # zeros: served too
    before = stats(srv.dev)
    for off in (8 * MiB, 16 * MiB, 4 * MiB):
        assert direct_read(srv.dev, off, MiB) == bytes(MiB)
    assert_data(srv.dev, 0, data, "data through the slow path")
    d = delta(stats(srv.dev), before)
    assert d["fast_done"] >= 3, d
    assert d["slow_issued"] >= 1, "the data read went to the slow path"
    # data written over zeros is never served as zeros afterwards
    direct_write(srv.dev, 8 * MiB, data)
    assert_data(srv.dev, 8 * MiB, data, "written over a zero range")
    srv.stop()


def test_zram_carries_ext4(zram, tmp_path):
    """mkfs.ext4 on it, a tree of files written, unmounted, mounted again
    and read back."""
    from test_fs import digest_tree, make_tree
    srv = zram("--size", "128M")
    run(["mkfs.ext4", "-q", "-F", srv.dev], check=True, timeout=T_IO)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run(["mount", srv.dev, str(mnt)], check=True)
    try:
        make_tree(mnt, seed=45, files=30)
        want = digest_tree(mnt)
        run(["umount", str(mnt)], check=True)
        run(["mount", srv.dev, str(mnt)], check=True)
        assert digest_tree(mnt) == want
    finally:
        run(["umount", str(mnt)])
    res = run(["fsck.ext4", "-n", "-f", srv.dev], timeout=T_IO)
    assert res.returncode == 0, res.stdout + res.stderr
    assert srv.zstats()["ratio"] > 1
    srv.stop()


def vmstat(name):
    for line in Path("/proc/vmstat").read_text().splitlines():
        k, v = line.split()
        if k == name:
            return int(v)
    raise KeyError(name)


SWAPPER = r"""
import os, random, sys
mib = int(sys.argv[1])
rng = random.Random(45)
# pages of mixed content: compressible text, random bytes, zeros
chunks = []
for i in range(mib * 256):
    kind = i % 3
    if kind == 0:
        chunks.append(bytearray((b"swap page %d " % i) * 300)[:4096])
    elif kind == 1:
        chunks.append(bytearray(rng.randbytes(4096)))
    else:
        chunks.append(bytearray(4096))
rng = random.Random(45)
for i, c in enumerate(chunks):
    kind = i % 3
    want = ((b"swap page %d " % i) * 300)[:4096] if kind == 0 else \
        rng.randbytes(4096) if kind == 1 else bytes(4096)
    if bytes(c) != want:
        print(f"page {i} differs", flush=True)
        sys.exit(1)
print("verified", flush=True)
"""


def test_zram_as_swap_under_memory_pressure(zram, tmp_path):
    """Swap on zram-rs: a process whose cgroup allows it 32 MiB of memory
    fills 96 MiB of pages (text, random, zeros), so most of them go to
    swap, and reads every one back."""
    srv = zram("--size", "512M")
    cg = Path("/sys/fs/cgroup")
    if not (cg / "cgroup.controllers").exists():
        run(["mount", "-t", "cgroup2", "none", str(cg)], check=True)
    assert "memory" in (cg / "cgroup.controllers").read_text()
    (cg / "cgroup.subtree_control").write_text("+memory")
    group = cg / f"hybd-swap-{os.getpid()}"
    group.mkdir()
    run(["mkswap", srv.dev], check=True)
    run(["swapon", srv.dev], check=True)
    try:
        (group / "memory.max").write_text(str(32 * MiB))
        out0 = vmstat("pswpout")
        script = tmp_path / "swapper.py"
        script.write_text(SWAPPER)
        # the child joins the group before it allocates
        res = run(["sh", "-c", f"echo $$ > {group}/cgroup.procs && "
                   f"exec python3 {script} 96"], timeout=T_IO * 4)
        assert res.returncode == 0 and "verified" in res.stdout, \
            res.stdout + res.stderr
        out = vmstat("pswpout") - out0
        assert out > 32 * MiB // 4096, f"only {out} pages swapped out"
        events = (group / "memory.events").read_text()
        assert "oom_kill 0" in events, events
        # zero pages never reach a swap device (the kernel's swap keeps
        # them in its map): text and random pages do
        st = srv.zstats()
        assert st["huge_pages"] > 0 and st["ratio"] > 1, st
    finally:
        run(["swapoff", srv.dev], timeout=T_IO * 2)
        group.rmdir()
    srv.stop()


# kill and take-over rounds (make test-long: the full count)
KILLS = 10 if LONG else 1


def test_zram_sigkill_in_recovery_mode_leaves_an_empty_disk(zram, servers):
    """A server killed in recovery mode: I/O waits for a new one, which
    must say it starts empty (--discard-contents), and then serves an
    empty disk; without the flag the take-over is refused, with words.
    Each round kills the server that took over in the round before."""
    srv = zram("--size", "64M", "--recovery-timeout", "30")
    for i in range(KILLS):
        data = pattern(f"zram-kill-{i}", MiB)
        direct_write(srv.dev, MiB * (i % 8), data)
        assert_data(srv.dev, MiB * (i % 8), data, f"round {i}, before")
        srv.kill()
        if i == 0:
            res = run([str(ZRAM_RS), "--take-over", str(srv.id)],
                      timeout=T_IO)
            assert res.returncode == 1 and \
                "--discard-contents" in res.stderr, res.stderr
        new = servers.start([str(ZRAM_RS), "--take-over", str(srv.id),
                             "--discard-contents"])
        assert new.id == srv.id
        assert direct_read(new.dev, 0, 8 * MiB) == bytes(8 * MiB), \
            f"round {i}: a RAM disk's contents die with its server"
        data = pattern(f"zram-after-{i}", MiB)
        direct_write(new.dev, 9 * MiB, data)
        assert_data(new.dev, 9 * MiB, data, f"round {i}, the new server")
        srv = new
    srv.stop()
