# SPDX-License-Identifier: GPL-2.0
"""examples/nbd (hybd-nbd), a remote NBD export as a local disk, against
nbdkit over TCP on loopback inside a network namespace the test makes,
with netem adding 0.5 ms each way: fio --verify at QD1 and QD32 over two
queues (two connections: nbdkit offers multi-conn), ext4 with fsck, nbdkit
killed and restarted under fio (no error, data verified), the driver
SIGKILLed and replaced in recovery mode, and bad servers (none listening,
garbage, a reply stream corrupted mid-way, a server that stays away):
a clear error or a clean EIO, never a hang.
"""

import json
import os
import re
import subprocess
import threading
import time
from contextlib import contextmanager

import pytest

from hybdlib import (LONG, REPO, T_IO, device_ids, direct_read, direct_write,
                     fio_verify, hybdctl, info, io_errno, need_built,
                     need_tool, pattern, reap, run, wait_for)
from test_dedup import (STALE_CHECK, STALE_KEYS, STALE_RE, STALE_SECONDS,
                        per_queue_done, tool)

NBD = REPO / "examples" / "nbd" / "hybd-nbd"
MiB = 1 << 20
PORT = 10809
SIZE = 64 * MiB


@contextmanager
def netns():
    """A network namespace with lo up and netem delaying 0.5 ms each way
    (every packet leaves through lo once)."""
    ip, tc = need_tool("ip"), need_tool("tc")
    run(["modprobe", "sch_netem"], timeout=60)
    name = f"hybdnbd{os.getpid()}"
    res = run([ip, "netns", "add", name], timeout=60)
    assert res.returncode == 0, f"ip netns add: {res.stderr}"
    try:
        run([ip, "-n", name, "link", "set", "lo", "up"], timeout=60,
            check=True)
        res = run([tc, "-n", name, "qdisc", "add", "dev", "lo", "root",
                   "netem", "delay", "0.5ms"], timeout=60)
        assert res.returncode == 0, f"tc netem: {res.stderr}"
        yield name
    finally:
        run([ip, "netns", "del", name], timeout=60)


class Nbdkit:
    """nbdkit in the namespace on 127.0.0.1:PORT (memory or file plugin);
    restartable on the same port."""

    def __init__(self, ns, *plugin):
        self.ns, self.plugin = ns, plugin
        self.proc = None
        self.start()

    def start(self):
        exe = need_tool("nbdkit")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, exe, "--foreground",
             "--exit-with-parent", "-i", "127.0.0.1", "-p", str(PORT),
             *self.plugin],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        # drained as it comes: a full pipe would stall nbdkit, and a test
        # that fails because nbdkit went away shows what it said
        self.err = []
        threading.Thread(target=self.err.extend, args=(self.proc.stderr,),
                         daemon=True).start()
        wait_for(self.listening, 30, "nbdkit to listen")

    def state(self):
        rc = self.proc.poll()
        said = "".join(self.err[-20:])
        return (f"nbdkit {' '.join(self.plugin)}: "
                f"{'running' if rc is None else f'exited with {rc}'}; "
                f"stderr: {said or '(nothing)'}")

    def listening(self):
        assert self.proc.poll() is None, self.state()
        res = run(["ip", "netns", "exec", self.ns, "ss", "-Hltn",
                   f"sport = :{PORT}"], timeout=30)
        return str(PORT) in res.stdout

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        reap(self.proc)

    def stop(self):
        self.kill()


class NbdEnv:
    def __init__(self, servers, ns):
        self.servers, self.ns = servers, ns
        self.kits = []

    def nbdkit(self, *plugin):
        kit = Nbdkit(self.ns, *plugin)
        self.kits.append(kit)
        return kit

    def uri(self, port=PORT):
        return f"nbd://127.0.0.1:{port}/"

    def cmd(self, *args, uri=None):
        return ["ip", "netns", "exec", self.ns, NBD, *args,
                uri or self.uri()]

    def serve(self, *args, uri=None):
        try:
            return self.servers.start(self.cmd(*args, uri=uri))
        except pytest.fail.Exception as e:
            kits = "\n".join(kit.state() for kit in self.kits)
            pytest.fail(f"{e}\n{kits}", pytrace=False)

    def cleanup(self):
        for kit in self.kits:
            kit.kill()


@pytest.fixture
def nbd(servers):
    need_built(NBD, "make examples")
    with netns() as ns:
        env = NbdEnv(servers, ns)
        try:
            yield env
        finally:
            servers.cleanup()
            env.cleanup()


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def stop_counters(srv):
    """SIGTERM the driver; its reconnects/reissued/failed counters."""
    srv.stop()
    err = "".join(srv.err)
    m = re.search(r"reconnects=(\d+) reissued=(\d+) failed_while_down=(\d+)",
                  err)
    assert m, srv.output()
    return dict(zip(("reconnects", "reissued", "failed"),
                    map(int, m.groups()))), err




def test_nbd_fio_verify_qd1_qd32_two_queues_over_tcp_with_delay(nbd):
    nbd.nbdkit("memory", str(SIZE))
    srv = nbd.serve("--queues", "2")
    assert "multi-conn yes" in "".join(srv.out), srv.output()
    assert info(srv.id)["nr_hw_queues"] == 2
    # 2 jobs spread over the CPUs, so both queues (both connections) serve
    fio_verify(srv.dev, "4k", 2 * MiB if LONG else 256 << 10, 2, iodepth=1)
    fio_verify(srv.dev, "4k", (4 if LONG else 1) * MiB, 2, iodepth=32)
    if LONG:
        fio_verify(srv.dev, "64k", 8 * MiB, 2, iodepth=32)
    done = per_queue_done(srv.id)
    assert len(done) == 2 and all(d > 0 for d in done), done
    counters, _ = stop_counters(srv)
    assert counters == {"reconnects": 0, "reissued": 0, "failed": 0}


def test_nbd_ops_reach_the_server_and_ext4_passes_fsck(nbd, tmp_path):
    """flush, FUA, discard and write-zeroes are offered (nbdkit's file
    plugin has them all) and land in the server's file; then ext4 on the
    device, files read back after a remount, fsck clean."""
    img = sparse(tmp_path / "disk.img", SIZE)
    nbd.nbdkit("file", str(img))
    # a small fixed send buffer: 128 KiB requests do not fit in it, so
    # libnbd has to wait for POLLOUT (hybd_queue_watch_fd_events())
    srv = nbd.serve("--queues", "2", "--sndbuf", "8192")
    name = os.path.basename(srv.dev)
    assert open(f"/sys/block/{name}/queue/write_cache").read().strip() == \
        "write back"
    assert int(open(f"/sys/block/{name}/queue/fua").read()) == 1
    assert int(open(f"/sys/block/{name}/queue/discard_max_bytes").read()) > 0
    data = pattern("ops", 1 * MiB)
    direct_write(srv.dev, 0, data, os.O_DSYNC)
    with open(img, "rb") as f:
        assert f.read(len(data)) == data, "a FUA write did not reach the file"
    run(["blkdiscard", "-o", "0", "-l", str(256 << 10), srv.dev],
        timeout=60, check=True)
    run(["blkdiscard", "-z", "-o", str(256 << 10), "-l", str(256 << 10),
         srv.dev], timeout=60, check=True)
    got = direct_read(srv.dev, 0, 1 * MiB)
    assert got[:512 << 10] == bytes(512 << 10)
    assert got[512 << 10:] == data[512 << 10:]
    with open(img, "rb") as f:
        assert f.read(512 << 10) == bytes(512 << 10), \
            "discard/write-zeroes did not reach the file"

    mkfs, fsck = tool("mkfs.ext4"), tool("fsck.ext4")
    run([mkfs, "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0",
         srv.dev], timeout=T_IO, check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    files = {f"f{i}": pattern(f"ext4-{i}", (i + 1) * 97 * 1024)
             for i in range(12 if LONG else 6)}
    try:
        run(["mount", srv.dev, mnt], timeout=T_IO, check=True)
        for n, d in files.items():
            (mnt / n).write_bytes(d)
        run(["umount", mnt], timeout=T_IO, check=True)
        res = run([fsck, "-fn", srv.dev], timeout=T_IO)
        assert res.returncode == 0, f"fsck: {res.stdout}{res.stderr}"
        run(["blockdev", "--flushbufs", srv.dev], timeout=T_IO, check=True)
        run(["mount", "-o", "ro", srv.dev, mnt], timeout=T_IO, check=True)
        for n, d in files.items():
            assert (mnt / n).read_bytes() == d, n
        run(["umount", mnt], timeout=T_IO, check=True)
    finally:
        if os.path.ismount(mnt):
            run(["umount", "-l", mnt], timeout=T_IO)
    _, err = stop_counters(srv)
    pollout = sum(map(int, re.findall(r"pollout=(\d+)", err)))
    assert pollout > 0, f"never waited for POLLOUT:\n{err}"


def fio_in_thread(dev, per_job, iodepth=16):
    box = {}

    def go():
        try:
            box["jobs"] = fio_verify(dev, "4k", per_job, 2, iodepth=iodepth)
        except BaseException as e:  # reported by the test
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, box


def wait_io(srv, n=300):
    """Until the device has served n more requests: fio is under way."""
    base = info(srv.id)["stats"]["slow_done"]
    wait_for(lambda: info(srv.id)["stats"]["slow_done"] >= base + n, 60,
             f"{n} requests on {srv.dev}")


def join_fio(t, box):
    t.join(T_IO)
    assert not t.is_alive(), "fio hung"
    if "error" in box:
        raise box["error"]
    return box["jobs"]


def test_nbd_server_killed_and_restarted_under_fio(nbd, tmp_path):
    """nbdkit (file plugin: the data survives it) SIGKILLed twice under
    fio --verify and started again a second later: fio sees no error and
    verifies every block; the driver reconnected and reissued."""
    img = sparse(tmp_path / "disk.img", SIZE)
    kit = nbd.nbdkit("file", str(img))
    srv = nbd.serve("--queues", "2", "--reconnect-limit", "30")
    # beyond fio's region: a read issued while the server is away
    mark = pattern("held", 64 << 10)
    direct_write(srv.dev, 48 * MiB, mark)
    t, box = fio_in_thread(srv.dev, (8 if LONG else 3) * MiB)
    kills = 3 if LONG else 1
    for _ in range(kills):
        wait_io(srv, 150)
        assert t.is_alive(), "fio ended before the server was killed"
        kit.kill()
        held = {}
        reader = threading.Thread(
            target=lambda: held.update(
                data=direct_read(srv.dev, 48 * MiB, len(mark))),
            daemon=True)
        reader.start()
        time.sleep(1)
        assert reader.is_alive(), "a read returned while the server was away"
        kit.start()
        reader.join(60)
        assert held.get("data") == mark, "the held read returned wrong data"
    join_fio(t, box)
    counters, err = stop_counters(srv)
    assert counters["reconnects"] >= kills, err
    assert counters["reissued"] > 0, err
    assert counters["failed"] == 0, err


def test_nbd_server_gone_fails_requests_after_the_limit(nbd):
    """No server for longer than --reconnect-limit: requests fail with EIO
    (after about the limit, not the I/O timeout); when the server is back,
    the device serves again."""
    kit = nbd.nbdkit("memory", str(SIZE))
    srv = nbd.serve("--queues", "1", "--reconnect-limit", "2")
    direct_write(srv.dev, 0, pattern("gone", 8192))
    kit.kill()
    start = time.monotonic()
    assert io_errno(direct_read, srv.dev, 0, 4096) == 5
    took = time.monotonic() - start
    assert 1.5 <= took <= 15, f"EIO after {took:.1f}s"
    # and at once while it is still away
    start = time.monotonic()
    assert io_errno(direct_read, srv.dev, 4096, 4096) == 5
    assert time.monotonic() - start < 5
    kit.start()     # a new, empty memory export
    wait_for(lambda: "reconnected" in "".join(srv.err[-3:]), 30,
             "the driver to reconnect")
    assert direct_read(srv.dev, 0, 4096) == bytes(4096)
    counters, err = stop_counters(srv)
    assert counters["failed"] >= 2, err


BAD_SERVER = r"""
import socket, sys, threading
mode = sys.argv[1]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[2])))
s.listen(8)
print("listening", flush=True)

def pump(a, b, corrupt):
    n = 0
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            n += len(d)
            # past the handshake, corrupt the reply stream once, or cut
            # the connection in the middle of a reply
            if corrupt[0] and n > 4096:
                corrupt[0] = False
                if mode == "cut":
                    b.sendall(d[:len(d) // 2])
                    break
                d = b"\xde\xad\xbe\xef" * 64
            b.sendall(d)
    except OSError:
        pass
    for x in (a, b):
        try:
            x.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

count = 0
while True:
    c, _ = s.accept()
    if mode == "garbage":
        c.sendall(b"this is not an NBD server\r\n" * 8)
        c.close()
        continue
    # proxy to the real server; only connection number argv[4] (from 0)
    # is corrupted
    u = socket.create_connection(("127.0.0.1", int(sys.argv[3])))
    corrupt = [count == int(sys.argv[4])]
    count += 1
    threading.Thread(target=pump, args=(c, u, [False]), daemon=True).start()
    threading.Thread(target=pump, args=(u, c, corrupt), daemon=True).start()
"""


@contextmanager
def bad_server(ns, mode, port, upstream=0, corrupt=1):
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, "python3", "-c", BAD_SERVER, mode,
         str(port), str(upstream), str(corrupt)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "listening", \
            proc.stderr.read()
        yield proc
    finally:
        proc.kill()
        reap(proc)


def start_fails(nbd, uri):
    before = set(device_ids())
    res = run(nbd.cmd(uri=uri), timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert set(device_ids()) == before, "a failed start left a device"
    return res.stderr


def test_nbd_bad_servers_refused_garbage_corrupt_or_cut_reply(nbd):
    """No server: a clear error at start, no device left.  Garbage instead
    of a handshake: the same.  A proxy that corrupts the first queue
    connection's reply stream past the handshake: libnbd drops it, the
    driver reconnects (through the proxy, clean now) and the requests it
    reissues return the right data, no error; the same when it cuts the
    connection in the middle of a reply."""
    err = start_fails(nbd, nbd.uri(PORT + 5))
    assert "cannot connect to nbd://127.0.0.1" in err, err
    assert "Connection refused" in err, err

    with bad_server(nbd.ns, "garbage", PORT + 1):
        err = start_fails(nbd, nbd.uri(PORT + 1))
    assert "cannot connect to" in err, err

    nbd.nbdkit("memory", str(SIZE))
    data = pattern("mid", 1 * MiB)
    with bad_server(nbd.ns, "proxy", PORT + 2, PORT):
        # connection 0 is the driver's probe, 1 queue 0's first
        srv = nbd.serve("--queues", "1", "--reconnect-limit", "20",
                        uri=nbd.uri(PORT + 2))
        direct_write(srv.dev, 0, data)
        assert direct_read(srv.dev, 0, len(data)) == data
        counters, err = stop_counters(srv)
    assert "connection lost" in err, err
    assert counters["reconnects"] >= 1 and counters["failed"] == 0, err

    # the same with the connection cut in the middle of a reply
    with bad_server(nbd.ns, "cut", PORT + 3, PORT):
        srv = nbd.serve("--queues", "1", "--reconnect-limit", "20",
                        uri=nbd.uri(PORT + 3))
        assert direct_read(srv.dev, 0, len(data)) == data
        counters, err = stop_counters(srv)
    assert "connection lost" in err, err
    assert counters["reconnects"] >= 1 and counters["reissued"] >= 1, err
    assert counters["failed"] == 0, err


def test_nbd_driver_sigkilled_and_replaced_in_recovery_mode(nbd, tmp_path):
    """--recovery: the driver SIGKILLed under fio --verify, a new one
    (--attach --id N) takes the device over; fio sees no error."""
    img = sparse(tmp_path / "disk.img", SIZE)
    nbd.nbdkit("file", str(img))
    srv = nbd.serve("--queues", "2", "--recovery", "30")
    t, box = fio_in_thread(srv.dev, 4 * MiB)
    wait_io(srv)
    assert t.is_alive(), "fio ended before the driver was killed"
    srv.kill()
    wait_for(lambda: info(srv.id)["state"] != "live", 10, "device waiting")
    new = nbd.serve("--attach", "--id", str(srv.id))
    assert new.id == srv.id
    join_fio(t, box)
    stop_counters(new)


# ---------------------------------------------------------------- fast path

NBD_BPF = REPO / "examples" / "nbd" / "nbd.bpf.o"
BLOCK = 4096


def nbd_bss(dev):
    st = json.loads(hybdctl("stats", str(dev), "--maps", "--json")[1])
    names = [m for m in st["maps"] if m.endswith(".bss")]
    assert len(names) == 1, st["maps"]
    return st["maps"][names[0]]


def test_nbd_fast_path_serves_holes_and_repeated_reads_in_the_kernel(
        nbd, tmp_path):
    """Block status seeds the zero map: holes read as zeros in the kernel;
    a hole written with data reads the data at once; a data read fills the
    cache and the second read of it is served in the kernel."""
    assert NBD_BPF.is_file(), f"{NBD_BPF} not built: make examples"
    img = sparse(tmp_path / "disk.img", SIZE)
    data = pattern("nbd-fast", 256 * BLOCK)
    with open(img, "r+b") as f:     # data in the first 1 MiB, holes after
        f.write(data)
    nbd.nbdkit("file", str(img))
    srv = nbd.serve("--queues", "2", "--bpf", NBD_BPF)
    out = "".join(srv.out)
    m = re.search(r"(\d+) blocks known zero", out)
    assert m, srv.output()
    assert int(m.group(1)) == SIZE // BLOCK - 256, out

    before, bss0 = info(srv.id)["stats"], nbd_bss(srv.dev)
    for off in range(256 * BLOCK, 512 * BLOCK, 32 * BLOCK):
        assert direct_read(srv.dev, off, 32 * BLOCK) == bytes(32 * BLOCK)
    after, bss1 = info(srv.id)["stats"], nbd_bss(srv.dev)
    assert after["fast_done"] - before["fast_done"] == 8
    assert after["slow_issued"] - before["slow_issued"] == 0
    assert bss1["zero_hits"] - bss0["zero_hits"] == 8, bss1

    for rnd in range(2):
        before = info(srv.id)["stats"]
        got = b"".join(direct_read(srv.dev, off, 32 * BLOCK)
                       for off in range(0, 256 * BLOCK, 32 * BLOCK))
        assert got == data, f"pass {rnd}"
        after = info(srv.id)["stats"]
        fast = after["fast_done"] - before["fast_done"]
        assert fast == (0 if rnd == 0 else 8), f"pass {rnd}: {fast} fast"
    assert nbd_bss(srv.dev)["cache_hits"] >= 8

    # a hole written with data is no hole before the write completes, and
    # a cached block written anew is not served from the cache
    block = pattern("nbd-hole", BLOCK)
    direct_write(srv.dev, 400 * BLOCK, block)
    assert direct_read(srv.dev, 400 * BLOCK, BLOCK) == block
    assert direct_read(srv.dev, 400 * BLOCK, 2 * BLOCK) == block + bytes(BLOCK)
    direct_write(srv.dev, 0, block)
    assert direct_read(srv.dev, 0, BLOCK) == block

    # overlapping reads and writes over 64 blocks, 32 of them holes the
    # zero map knows until written: never a stale read
    need_built(STALE_CHECK, "tests/helpers/stale_check")
    before = info(srv.id)["stats"]
    res = run([STALE_CHECK, srv.dev, "--offset", str(224 * BLOCK),
               "--blocks", "64", "--writers", "2", "--readers", "2",
               "--seconds", str(STALE_SECONDS if LONG else 5)],
              timeout=STALE_SECONDS + 120)
    out = res.stdout + res.stderr
    m = STALE_RE.search(res.stdout)
    assert m, f"stale_check: exit {res.returncode}, no result line:\n{out}"
    c = dict(zip(STALE_KEYS, map(int, m.groups()[:6])))
    fast = info(srv.id)["stats"]["fast_done"] - before["fast_done"]
    print(f"stale_check: {c}, fast {fast}, bss {nbd_bss(srv.dev)}")
    assert c["errors"] == 0 and c["corrupt"] == 0, out
    assert c["stale"] == 0, f"the device returned stale data:\n{out}"
    assert res.returncode == 0, out
    assert c["reads"] >= 200 and c["writes"] >= 50, c
    assert fast > 0, "the fast path served nothing: it proves nothing"
    stop_counters(srv)


def test_nbd_tls_when_the_uri_asks_for_it(nbd, tmp_path):
    """nbdkit requiring TLS (PSK): a plain nbd:// URI is refused with a
    clear error; nbds:// with the key serves, data round trip."""
    psk = tmp_path / "keys.psk"
    psk.write_text(f"alice:{pattern('psk', 32).hex()}\n")
    os.chmod(psk, 0o600)
    nbd.nbdkit("--tls=require", f"--tls-psk={psk}", "memory", str(SIZE))
    err = start_fails(nbd, nbd.uri())
    assert "requires TLS" in err, err
    srv = nbd.serve("--queues", "2", uri=f"nbds://alice@127.0.0.1:{PORT}/"
                    f"?tls-psk-file={psk}")
    data = pattern("tls", 1 * MiB)
    direct_write(srv.dev, 0, data)
    assert direct_read(srv.dev, 0, len(data)) == data
    stop_counters(srv)
