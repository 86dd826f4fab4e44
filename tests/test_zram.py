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
from hybdlib import (REPO, RUST_RAMDISK, ZRAM_RS, T_IO, assert_data,
                     direct_read, direct_write, fio_verify, need_built,
                     pattern, run, wait_for)

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


@pytest.mark.parametrize("qd", [1, 32])
def test_zram_fio_verify(zram, qd):
    srv = zram("--size", "64M", "--queues", "2")
    fio_verify(srv.dev, "4k", "16M", 2, iodepth=qd,
               extra=["--buffer_compress_percentage=50",
                      "--refill_buffers"])
    st = srv.zstats()
    assert st["orig_data_size"] > 0
    assert 0 < st["compr_data_size"] < st["orig_data_size"], st
    srv.stop()


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
