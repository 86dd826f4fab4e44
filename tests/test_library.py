# SPDX-License-Identifier: GPL-2.0
"""libhybd as real drivers use it: operations that follow the handlers,
hybd_run(), the thread pool, worker placement, an io_uring backend served
by one thread per queue (examples/loop), the ABI of an older hybd.h, and
what a device's memory costs."""

import errno
import mmap
import os
import re
from pathlib import Path

import pytest

import hybd_uapi as uapi
from hybdlib import (REPO, assert_data, direct_read, direct_write, fio,
                     hybdctl, hybdctl_json, need_built, pattern, run,
                     sysfs_queue)

SLOWDRV = REPO / "tests" / "helpers" / "slowdrv"
LOOP = REPO / "examples" / "loop" / "hybd-loop"
OLD = REPO / "tests" / "abi" / "old-ramdisk"
MiB = 1 << 20


@pytest.fixture
def slowdrv(servers):
    def start(*args):
        need_built(SLOWDRV, "tests/helpers/slowdrv")
        return servers.start([SLOWDRV, *args])
    return start


@pytest.fixture
def backing(tmp_path):
    """A sparse backing file (tmpfs in the guest: O_DIRECT and hole
    punching work there since Linux 6.6)."""
    def make(size):
        path = tmp_path / f"backing-{size}.img"
        with open(path, "wb") as f:
            f.truncate(size)
        return path
    return make


def final_line(srv, prefix):
    for line in srv.out + srv.err:
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no '{prefix}' line\n{srv.output()}")


def slow_counters(srv):
    m = re.search(r"requests=(\d+) max_concurrent=(\d+) exit=(-?\d+)",
                  final_line(srv, "slowdrv:"))
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def loop_queue_stats(srv):
    stats = {}
    for line in srv.err:
        m = re.match(r"hybd-loop: queue (\d+): requests=(\d+) max_inflight=(\d+)",
                     line)
        if m:
            stats[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
    return stats


# ------------------------------------------- operations follow the handlers

def test_a_driver_reads_its_devices_configuration_back(slowdrv):
    """hybd_dev_config(): the driver's configuration with the defaults the
    kernel resolved (queue count, depth, ops, flags), as hybdctl info
    shows the device."""
    srv = slowdrv("--size", str(16 * MiB), "--queues", "2")
    line = final_line(srv, "config ")
    cfg = dict(kv.split("=") for kv in line.split()[1:])
    inf = hybdctl_json("info", srv.dev)
    assert int(cfg["id"]) == srv.id, line
    assert int(cfg["size"]) == inf["size"] == 16 * MiB, line
    assert int(cfg["queues"]) == inf["nr_hw_queues"] == 2, line
    for key, name in (("depth", "queue_depth"), ("max_io", "max_io_bytes"),
                      ("lbs", "logical_block_size"),
                      ("pbs", "physical_block_size"),
                      ("io_timeout", "io_timeout")):
        assert int(cfg[key]) == inf[name], (key, line, inf)
    # ops 0 and the write cache flag were resolved against the handlers
    assert int(cfg["ops"], 16) == uapi.OPF_READ | uapi.OPF_WRITE, line
    assert int(cfg["flags"], 16) == 0, line


def test_read_write_only_driver_gets_a_device_without_write_cache(slowdrv):
    srv = slowdrv("--size", str(16 * MiB))
    inf = hybdctl_json("info", srv.dev)
    assert sorted(inf["ops"]) == ["read", "write"], inf
    assert inf["write_cache"] is False
    # no discard, no write-zeroes: hybdctl info shows no limits of them
    rc, out, err = hybdctl("info", srv.dev)
    assert rc == 0 and "max_discard_bytes" not in out, out + err
    assert "max_write_zeroes_bytes" not in out, out
    # no .flush: the kernel must treat every completed write as durable
    assert sysfs_queue(srv.dev, "write_cache") == "write through"
    data = pattern("rw-only", 256 << 10)
    direct_write(srv.dev, 4 * MiB, data)
    assert_data(srv.dev, 4 * MiB, data)
    # discard was not offered: the block layer refuses it up front
    assert sysfs_queue(srv.dev, "discard_max_bytes") == "0"
    # SIGTERM: hybd_run() deletes the device and returns 0
    srv.stop()
    requests, _, rc = slow_counters(srv)
    assert rc == 0 and requests >= 2
    assert not os.path.exists(srv.dev)


def test_hybd_run_returns_when_the_device_is_deleted_from_outside(slowdrv):
    srv = slowdrv()
    rc, _, err = hybdctl("del", srv.dev)
    assert rc == 0, err
    assert srv.wait() == 0, srv.output()
    assert slow_counters(srv)[2] == 0


# --------------------------------------------------------------- thread pool

@pytest.mark.parametrize("threads,want", [(8, 8), (0, 1)])
def test_blocking_handlers_in_flight_per_queue(slowdrv, threads, want):
    """One queue, handlers that sleep 40 ms, fio at QD16: a pool of 8
    threads runs 8 of them at once; without a pool the worker runs one."""
    srv = slowdrv("--queues", "1", "--threads", str(threads),
                  "--delay-ms", "40")
    rc, data, res = fio(["--name=pool", f"--filename={srv.dev}",
                         "--rw=randread", "--bs=4k", "--direct=1",
                         "--ioengine=libaio", "--iodepth=16", "--runtime=4",
                         "--time_based", "--size=8M"])
    assert rc == 0, res.stderr
    srv.stop()
    requests, max_concurrent, _ = slow_counters(srv)
    assert max_concurrent == want, (requests, max_concurrent)
    # 4 s of 40 ms requests: a pool of 8 serves several times more
    assert requests >= (40 if threads else 10)


# ------------------------------------------------------------ worker placing

def thread_cpus(srv, pattern):
    """{queue: [sorted CPUs of each thread whose name is @pattern, a regex
    whose group 1 is the queue]}."""
    seen = {}
    for tid in os.listdir(f"/proc/{srv.pid}/task"):
        comm = Path(f"/proc/{srv.pid}/task/{tid}/comm").read_text().strip()
        m = re.fullmatch(pattern, comm)
        if not m:
            continue
        status = Path(f"/proc/{srv.pid}/task/{tid}/status").read_text()
        allowed = re.search(r"^Cpus_allowed_list:\s*(\S+)$", status, re.M)
        seen.setdefault(int(m.group(1)), []).append(
            expand_cpu_list(allowed.group(1)))
    return seen


def worker_cpus(srv, name):
    """{queue: sorted CPUs its worker thread (hybdN-qM) may run on}."""
    return {q: cpus[0]
            for q, cpus in thread_cpus(srv, rf"{name}-q(\d+)").items()}


def pool_cpus(srv, name):
    """{queue: [sorted CPUs of each of its pool threads (hybdN-qMp)]}."""
    return thread_cpus(srv, rf"{name}-q(\d+)p")


@pytest.mark.parametrize("placement", ["beside", "queue-affinity",
                                       "no-affinity"])
def test_workers_run_beside_the_cpus_that_submit_to_their_queue(
        slowdrv, placement):
    """blk-mq sends a queue what its CPUs submit; by default the queue's
    worker runs on every other CPU (never sharing one with its submitter),
    with --queue-affinity on exactly its queue's CPUs, with --no-affinity
    anywhere."""
    ncpu = os.cpu_count()
    flags = [] if placement == "beside" else [f"--{placement}"]
    srv = slowdrv("--queues", str(ncpu), *flags)
    name = os.path.basename(srv.dev)
    nq = len(os.listdir(f"/sys/block/{name}/mq"))
    assert nq == ncpu
    reported = {}
    for line in srv.out:
        m = re.match(r"queue (\d+) cpus ([\d,]*)$", line.strip())
        if m:
            reported[int(m.group(1))] = [int(c) for c in
                                         m.group(2).split(",") if c]
    everything = sorted(os.sched_getaffinity(srv.pid))
    want = {}
    for q in range(nq):
        sysfs = Path(f"/sys/block/{name}/mq/{q}/cpu_list").read_text().strip()
        assert reported.get(q) == expand_cpu_list(sysfs), (q, reported, sysfs)
        if placement == "queue-affinity":
            want[q] = reported[q]
        elif placement == "no-affinity":
            want[q] = everything
        else:
            want[q] = ([c for c in everything if c not in reported[q]]
                       or everything)
    assert worker_cpus(srv, name) == want, (reported, everything)
    srv.stop()


def test_one_queue_worker_may_run_on_any_cpu(slowdrv):
    """Nothing lies beside a single queue's CPUs: its worker is free."""
    srv = slowdrv("--queues", "1")
    name = os.path.basename(srv.dev)
    assert worker_cpus(srv, name) == {0: sorted(os.sched_getaffinity(srv.pid))}
    srv.stop()


@pytest.mark.parametrize("queues", [1, 2])
def test_a_worker_with_a_pool_runs_with_it_on_one_cpu(slowdrv, queues):
    """A pool thread free to run on another CPU wakes an idle one for each
    request; so a worker with a pool runs on one CPU (its home) with its
    threads: beside its queue's CPUs, each queue's its own; a single
    queue's counting down from the last CPU by device id.  With
    --pool-spread (HYBD_CFG_POOL_SPREAD) the pool runs where the worker
    alone would, with --no-affinity anywhere."""
    everything = sorted(os.sched_getaffinity(0))
    if queues > len(everything):
        pytest.skip("fewer CPUs than queues")
    srv = slowdrv("--queues", str(queues), "--threads", "3")
    name = os.path.basename(srv.dev)
    workers, pools = worker_cpus(srv, name), pool_cpus(srv, name)
    homes, owns = set(), {}
    for q in range(queues):
        owns[q] = expand_cpu_list(Path(f"/sys/block/{name}/mq/{q}/cpu_list")
                                  .read_text().strip())
        assert len(workers[q]) == 1, workers
        home = workers[q][0]
        assert pools[q] == [[home]] * 3, (q, workers, pools)
        if queues == 1:
            dev_id = int(name[len("hybd"):])
            assert home == everything[-1 - dev_id % len(everything)]
        else:
            assert home not in owns[q], (q, home, owns)
        homes.add(home)
    assert len(homes) == queues
    srv.stop()

    for flag in ("--pool-spread", "--no-affinity"):
        srv = slowdrv("--queues", str(queues), "--threads", "3", flag)
        name = os.path.basename(srv.dev)
        want = {q: ([c for c in everything if c not in owns[q]] or everything)
                   if flag == "--pool-spread" else everything
                for q in range(queues)}
        assert worker_cpus(srv, name) == want, flag
        assert pool_cpus(srv, name) == {q: [want[q]] * 3
                                        for q in range(queues)}, flag
        srv.stop()


def test_queue_cpus_after_the_device_is_deleted(slowdrv):
    """The server's node outlives its device: asking it for a queue's CPUs
    then must answer from what the device knew (blk-mq's map is gone)."""
    need_built(SLOWDRV, "tests/helpers/slowdrv")
    res = run([SLOWDRV, "--after-delete"], timeout=60)
    assert res.returncode == 0, res.stderr
    m = re.search(r"^after-delete: (-?\d+)", res.stdout, re.M)
    assert m and int(m.group(1)) >= 1, res.stdout + res.stderr


def expand_cpu_list(text):
    cpus = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus += range(int(lo), int(hi) + 1)
        elif part:
            cpus.append(int(part))
    return cpus


# ----------------------------------------------------- io_uring: examples/loop

def write_stop_and_find(srv, path, offset, tag):
    """Write 1 MiB through the device at @offset, stop its server: the
    bytes are in the file @path at the same offset."""
    probe = pattern(tag, 1 * MiB)
    direct_write(srv.dev, offset, probe)
    srv.stop()
    with open(path, "rb") as f:
        f.seek(offset)
        assert f.read(MiB) == probe


def test_loop_over_io_uring_passes_fio_verify_at_qd32_from_one_worker(
        servers, backing):
    need_built(LOOP, "examples/loop/hybd-loop")
    img = backing(128 * MiB)
    # through io_uring even where the file cannot do non-blocking I/O
    srv = servers.start([LOOP, "--queues", "1", "--always-uring", str(img)])
    rc, data, res = fio(["--name=verify", f"--filename={srv.dev}",
                         "--rw=randwrite", "--bs=4k", "--direct=1",
                         "--ioengine=libaio", "--iodepth=32", "--size=64M",
                         "--verify=crc32c", "--verify_fatal=1",
                         "--do_verify=1", "--randrepeat=0"])
    assert rc == 0, res.stdout[-2000:] + res.stderr
    job = data["jobs"][0]
    assert job["error"] == 0
    assert job["write"]["io_bytes"] == 64 * MiB
    # what the device holds is in the file, byte for byte
    write_stop_and_find(srv, img, 96 * MiB, "loop-probe")
    stats = loop_queue_stats(srv)
    assert list(stats) == [0]
    requests, max_inflight = stats[0]
    assert requests >= 2 * 16384, stats        # the writes and the verify
    assert max_inflight >= 16, stats


def test_loop_serves_a_file_without_nowait_in_its_worker(servers):
    """A file that cannot do non-blocking I/O (tmpfs) would cost an io-wq
    thread hop per request: hybd-loop reads and writes it in the worker,
    and says so; a file that can goes through io_uring."""
    need_built(LOOP, "examples/loop/hybd-loop")
    path = Path("/dev/shm/hybd-loop-nowait.img")
    with open(path, "wb") as f:
        f.truncate(16 * MiB)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, 4096)
        try:
            os.preadv(fd, [buf], 0, os.RWF_NOWAIT)
            nowait = True
        except OSError as e:
            assert e.errno in (errno.EOPNOTSUPP, errno.EAGAIN), e
            nowait = e.errno != errno.EOPNOTSUPP
        finally:
            os.close(fd)
        srv = servers.start([LOOP, "--queues", "1", str(path)])
        said = any("cannot do non-blocking I/O" in ln for ln in srv.out)
        assert said == (not nowait), srv.out
        rc, data, res = fio(["--name=verify", f"--filename={srv.dev}",
                             "--rw=randwrite", "--bs=4k", "--direct=1",
                             "--ioengine=libaio", "--iodepth=16",
                             "--size=8M", "--verify=crc32c",
                             "--verify_fatal=1", "--do_verify=1",
                             "--randrepeat=0"])
        assert rc == 0 and data["jobs"][0]["error"] == 0, res.stdout[-2000:]
        write_stop_and_find(srv, path, 12 * MiB, "nowait-probe")
        requests, max_inflight = loop_queue_stats(srv)[0]
        assert requests >= 4096, requests
        # in place, nothing is ever in the ring; through it, up to 16
        assert (max_inflight == 0) == (not nowait), max_inflight
    finally:
        path.unlink()


def test_loop_flush_discard_and_write_zeroes_reach_the_file(servers, backing):
    need_built(LOOP, "examples/loop/hybd-loop")
    img = backing(32 * MiB)
    srv = servers.start([LOOP, "--queues", "2", str(img)])
    data = pattern("loop-discard", 8 * MiB)
    direct_write(srv.dev, 8 * MiB, data)
    with open(srv.dev, "rb+") as f:
        os.fsync(f.fileno())                   # a flush: fdatasync
    blocks_before = os.stat(img).st_blocks
    run(["blkdiscard", "-o", str(8 * MiB), "-l", str(4 * MiB), srv.dev],
        check=True)
    run(["blkdiscard", "-z", "-o", str(12 * MiB), "-l", str(2 * MiB),
         srv.dev], check=True)
    assert direct_read(srv.dev, 8 * MiB, 6 * MiB) == bytes(6 * MiB)
    assert_data(srv.dev, 14 * MiB, data[6 * MiB:])
    srv.stop()
    # the discarded range is a hole in the file now
    assert os.stat(img).st_blocks < blocks_before - (4 * MiB) // 512 + 8
    with open(img, "rb") as f:
        f.seek(8 * MiB)
        assert f.read(6 * MiB) == bytes(6 * MiB)


# ----------------------------------------------------------------------- ABI

def test_a_binary_built_against_the_1_2_header_still_runs(servers):
    need_built(OLD, "tests/abi/old-ramdisk")
    res = run(["objdump", "-T", str(OLD)], check=True)
    assert re.search(r"\(LIBHYBD_1\.0\)\s+hybd_dev_create$", res.stdout, re.M), \
        res.stdout
    srv = servers.start([OLD])
    data = pattern("abi", 1 * MiB)
    direct_write(srv.dev, 0, data)
    assert_data(srv.dev, 0, data)
    srv.stop()
    assert "old-ramdisk: done 0" in "".join(srv.out)


# -------------------------------------------------------------------- memory

def test_info_reports_the_memory_a_default_device_pins(added_devices):
    rc, out, err = hybdctl("add", "--size", "64M", "--queues", "64")
    assert rc == 0, err
    dev_id = int(out.strip())
    added_devices.append(dev_id)
    p = inf = hybdctl_json("info", str(dev_id))
    # blk-mq gives at most one queue per CPU; the buffers are depth x
    # max_io per queue, plus the rings and descriptors
    assert p["nr_hw_queues"] == min(64, os.cpu_count())
    data = p["nr_hw_queues"] * p["queue_depth"] * p["max_io_bytes"]
    assert data <= 64 * MiB
    assert data <= inf["mem_bytes"] <= data + p["nr_hw_queues"] * 64 * 1024
