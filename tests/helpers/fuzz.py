#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Fuzz hybd's control node and server node from several threads.

    fuzz.py SEED CALLS

Adds a device (random valid parameters, a short I/O timeout), opens its
server node and maps its queues, then runs CALLS random or malformed
operations from 4 threads: ioctls on both nodes with random numbers,
lengths, reserved bits, queue ids and pointers; calls in the wrong state
(START twice, a second open, HANDOVER of an unstarted device); mmap at bad
offsets and sizes; and a server thread that completes the kernel's
requests, some correctly and some with bad tags, stale seqs, bad results,
duplicates and ring indices moved backwards or far ahead.  Every call must
return 0 or an errno from the documented set, within a bound.

Prints "dev N" once the device exists and "started N" once it is started,
then waits for a line on stdin (the test starts its I/O) before the
threads go; prints "fuzzed ..." (the counts) when the calls are done, then
serves correctly until stdin closes or a line arrives, and exits without
deleting anything: the test deletes the device while this process
exits.
"""

import collections
import ctypes
import errno
import mmap
import os
import random
import select
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import hybd_uapi as u  # noqa: E402

_IOC_NONE = 0
SRV_INFO_SIZE = 184
SRV_IO_FMT = "<IHHII"           # struct hybd_srv_io, 16
SRV_GET_INFO = u._ioc(u._IOC_READ | u._IOC_WRITE, 0x40, SRV_INFO_SIZE)
SRV_START = u._ioc(_IOC_NONE, 0x41, 0)
SRV_IO = u._ioc(u._IOC_READ | u._IOC_WRITE, 0x42, 16)
SRV_KICK = u._ioc(_IOC_NONE, 0x43, 0)
SRV_SET_EVENTFD = u._ioc(u._IOC_WRITE, 0x44, 16)
SRV_QUEUE_CPUS = u._ioc(u._IOC_READ | u._IOC_WRITE, 0x45, 32)
SRV_CMDS = [SRV_GET_INFO, SRV_START, SRV_IO, SRV_KICK, SRV_SET_EVENTFD,
            SRV_QUEUE_CPUS]
CTL_CMDS = list(u.IOCTLS.values())
# what a call may answer; anything else is a finding
ALLOWED = {0, errno.EINVAL, errno.EFAULT, errno.ENOTTY, errno.EOPNOTSUPP,
           errno.E2BIG, errno.ENODEV, errno.EBUSY, errno.EALREADY,
           errno.ERANGE, errno.ENOSPC, errno.EBADF, errno.EEXIST,
           errno.ENOMEM, errno.EINTR, errno.ENOENT, errno.EACCES,
           # resizes (not live, no answer, a stale answer), and what an
           # unprivileged user meets (another's device, the limits)
           errno.EAGAIN, errno.ETIMEDOUT, errno.ESTALE, errno.EPERM,
           errno.EDQUOT}
# HYBD_FUZZ_UNPRIV=1: the fuzzing user has no capability, and its device
# is an unprivileged one
UNPRIV = os.environ.get("HYBD_FUZZ_UNPRIV") == "1"
SLOW_CALL = 30.0        # seconds; START may scan partitions

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.ioctl.restype = ctypes.c_int


class Fuzz:
    def __init__(self, seed, calls):
        self.seed, self.calls = seed, calls
        self.lock = threading.Lock()
        self.errnos = collections.Counter()
        self.bad = []
        self.done = 0
        self.ring = collections.Counter()
        self.stop_garbage = threading.Event()
        self.stop_all = threading.Event()
        self.scratch = bytearray(65536)
        self.phase = 1

    # ------------------------------------------------------------ helpers
    def note(self, what, e, took):
        with self.lock:
            self.done += 1
            self.errnos[errno.errorcode.get(e, str(e)) if e else "ok"] += 1
            if e not in ALLOWED:
                self.bad.append(f"{what}: {u.errname(e)}")
            if took > SLOW_CALL:
                self.bad.append(f"{what}: took {took:.1f}s")

    def raw_ioctl(self, fd, cmd, arg):
        t0 = time.monotonic()
        ret = _libc.ioctl(fd, cmd, arg)
        e = ctypes.get_errno() if ret < 0 else 0
        return e, time.monotonic() - t0

    def random_buf(self, rng, size):
        """Bytes for a len-prefixed struct: mostly a plausible len, random
        or zero fields, sometimes garbage all through."""
        n = rng.choice([0, 4, 8, 16, 32, size, size, size + 8, 300])
        if not n:
            return bytearray()
        # the kernel writes back up to the len it is given, whatever our
        # size: the buffer has room for any struct, its first n bytes vary
        b = bytearray(4096)
        if n >= 4:
            ln = rng.choice([size, size, 0, 4, size - 4, size + 8,
                             rng.getrandbits(32)])
            struct.pack_into("<I", b, 0, ln & 0xFFFFFFFF)
        for i in range(4, n):
            if rng.random() < 0.3:
                b[i] = rng.getrandbits(8)
        if n >= 24 and rng.random() < 0.5:
            # a user pointer field (list ids, stats queues, cpu mask) that
            # points at our own scratch room, not at random memory
            scratch = (ctypes.c_char * 65536).from_buffer(self.scratch)
            struct.pack_into("<Q", b, 16, ctypes.addressof(scratch))
        if n >= 8 and rng.random() < 0.7:
            # a device or queue id worth hitting: ours, a neighbour, any
            struct.pack_into("<I", b, 4, rng.choice(
                [self.dev_id, self.dev_id, 0, self.dev_id + 1, 63, 64,
                 0xFFFFFFFF]))
        return b

    def call(self, rng, fd, cmds, sizes, what):
        cmd = SRV_START
        while cmd == SRV_START and self.phase == 1:
            # (the first START is the main thread's)
            cmd = rng.choice(cmds) if rng.random() < 0.9 else \
                u._ioc(rng.randrange(4), rng.randrange(256),
                       rng.randrange(512))
        size = sizes.get(cmd, 64)
        r = rng.random()
        if r < 0.05:
            arg = ctypes.c_void_p(rng.choice([0, 1, 0x1000, 2**47 - 8]))
            e, took = self.raw_ioctl(fd, cmd, arg)
        elif r < 0.15 and cmd in (SRV_KICK,):
            e, took = self.raw_ioctl(fd, cmd, ctypes.c_void_p(
                rng.choice([0, 1, 2, 63, 64, 2**32])))
        else:
            buf = self.random_buf(rng, size)
            if cmd == u.CTL_DEL and len(buf) >= 8 and \
                    struct.unpack_from("<I", buf, 4)[0] == self.dev_id:
                # the test deletes our device, at the end, racing our exit
                struct.pack_into("<I", buf, 4, self.dev_id + 1)
            if cmd == SRV_IO and self.phase == 1 and len(buf) >= 8:
                # nothing is published before START: a WAIT would sleep
                # until a kick
                buf[6] &= ~1
            cbuf = (ctypes.c_char * len(buf)).from_buffer(buf) if buf \
                else None
            e, took = self.raw_ioctl(fd, cmd, cbuf)
            if cmd == u.CTL_ADD and not e and len(buf) >= 8:
                # a random but valid add: delete it again
                with u.Control() as ctl:
                    u.delete(ctl, struct.unpack_from("<I", buf, 4)[0])
        self.note(f"{what} ioctl {cmd:#x}", e, took)

    # -------------------------------------------------------------- setup
    def add_device(self, rng):
        b = u.basic(size=rng.choice([16, 32]) << 20, queues=2,
                    depth=rng.choice([8, 16, 32]), io_timeout=2,
                    ops=u.OPF_READ | u.OPF_WRITE,
                    recovery=rng.choice([0, 0, 3]),
                    flags=u.DEV_F_UNPRIVILEGED if UNPRIV else 0)
        with u.Control() as ctl:
            e, dev_id, perr = u.add(ctl, b=b)
        if e:
            sys.exit(f"add: {u.errname(e)} (param {perr})")
        self.dev_id = dev_id
        path = f"/dev/hybd{dev_id}-srv"
        for _ in range(500):
            if os.path.exists(path):
                break
            time.sleep(0.01)
        self.srv = os.open(path, os.O_RDWR)
        buf = bytearray(SRV_INFO_SIZE)
        struct.pack_into("<II", buf, 0, SRV_INFO_SIZE, dev_id)
        e = u.ioctl(self.srv, SRV_GET_INFO, buf)
        assert not e, u.errname(e)
        (_, _, self.nr_queues, self.depth, self.max_io, self.entries,
         self.stride, self.map_size) = struct.unpack_from("<6IQQ", buf)
        self.areas = [mmap.mmap(self.srv, self.map_size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE,
                                offset=q * self.stride)
                      for q in range(self.nr_queues)]
        self.cq_tail = [0] * self.nr_queues
        self.sq_head = [0] * self.nr_queues
        self.seen = [set() for _ in range(self.nr_queues)]
        print(f"dev {dev_id}", flush=True)

    def hdr(self, q):
        return struct.unpack_from("<16I", self.areas[q], 0)

    # ------------------------------------------------------------- server
    def post(self, q, tag, result, seq):
        a = self.areas[q]
        _, _, _, _, _, entries, _, _, _, cq_off = self.hdr(q)[:10]
        slot = cq_off + (self.cq_tail[q] % entries) * 16
        struct.pack_into("<IiQ", a, slot, tag & 0xFFFFFFFF, result, seq)
        self.cq_tail[q] = (self.cq_tail[q] + 1) & 0xFFFFFFFF
        struct.pack_into("<I", a, 8, self.cq_tail[q])

    def serve_queue(self, rng, q, garbage):
        a = self.areas[q]
        h = self.hdr(q)
        sq_tail, entries, sq_off, desc_off = h[0], h[5], h[8], h[10]
        while self.sq_head[q] != sq_tail:
            if (sq_tail - self.sq_head[q]) & 0xFFFFFFFF > entries:
                self.sq_head[q] = sq_tail      # the kernel rewound it
                break
            slot = sq_off + (self.sq_head[q] % entries) * 4
            tag = struct.unpack_from("<I", a, slot)[0]
            self.sq_head[q] = (self.sq_head[q] + 1) & 0xFFFFFFFF
            if tag >= self.depth:
                continue
            seq = struct.unpack_from("<Q", a, desc_off + tag * 32 + 16)[0]
            r = rng.random() if garbage else 1.0
            if r < 0.05:
                self.post(q, rng.getrandbits(32), 0, seq)
                self.ring["bad_tag"] += 1
            elif r < 0.10:
                self.post(q, tag, 0, seq ^ rng.getrandbits(16) | 1)
                self.ring["stale_seq"] += 1
            elif r < 0.15:
                self.post(q, tag, rng.choice([1, 4096, -5000, 2**31 - 1]),
                          seq)
                self.ring["bad_result"] += 1
            elif r < 0.20:
                self.post(q, tag, 0, seq)
                self.post(q, tag, 0, seq)
                self.ring["duplicate"] += 1
            elif r < 0.23:
                continue                # never completed: the timeout
            else:
                self.post(q, tag, 0, seq)
                self.ring["good"] += 1
        struct.pack_into("<I", a, 4, self.sq_head[q])
        if garbage and rng.random() < 0.05:
            # move our indices where they cannot be
            jump = rng.choice([-3, -entries, entries * 4, 2**31])
            self.cq_tail[q] = (self.cq_tail[q] + jump) & 0xFFFFFFFF
            struct.pack_into("<I", a, 8, self.cq_tail[q])
            struct.pack_into("<I", a, 4, rng.getrandbits(32))
            self.ring["index_jump"] += 1

    def commit(self, q):
        """Hand the kernel what we posted.  After an index jump the kernel
        rejects the batch and takes our tail as its head: we go on from
        there."""
        buf = bytearray(struct.pack(SRV_IO_FMT, 16, q, 0, 0, 0))
        return u.ioctl(self.srv, SRV_IO, buf)

    def server(self, rng):
        while not self.stop_all.is_set():
            garbage = not self.stop_garbage.is_set()
            for q in range(self.nr_queues):
                try:
                    self.serve_queue(rng, q, garbage)
                except (ValueError, struct.error):
                    return
                e = self.commit(q)
                if e == errno.ENODEV:
                    return
            time.sleep(0.0005)

    # -------------------------------------------------------------- fuzzers
    def fuzz_thread(self, rng, n):
        try:
            self._fuzz_thread(rng, n)
        except BaseException as e:      # pylint: disable=broad-except
            with self.lock:
                self.bad.append(f"fuzz thread: {e!r}")

    def _fuzz_thread(self, rng, n):
        sizes_ctl = {u.CTL_ADD: u.ADD_SIZE, u.CTL_INFO: u.INFO_SIZE,
                     u.CTL_STATS: u.STATS_SIZE}
        sizes_srv = {SRV_GET_INFO: SRV_INFO_SIZE, SRV_IO: 16,
                     SRV_SET_EVENTFD: 16, SRV_QUEUE_CPUS: 32}
        ctl = os.open("/dev/hybd-control", os.O_RDWR)
        try:
            for i in range(n):
                if i and not i % 1000:
                    print(f"progress {threading.get_ident() % 1000}: {i}",
                          file=sys.stderr, flush=True)
                r = rng.random()
                if r < 0.40:
                    self.call(rng, self.srv, SRV_CMDS, sizes_srv, "srv")
                elif r < 0.75:
                    self.call(rng, ctl, CTL_CMDS, sizes_ctl, "ctl")
                elif r < 0.85:
                    self.fuzz_mmap(rng)
                elif r < 0.90:
                    self.fuzz_open(rng)
                else:
                    self.fuzz_srv_io(rng)
        finally:
            os.close(ctl)

    def fuzz_mmap(self, rng):
        page = mmap.PAGESIZE
        off = rng.choice([0, page, self.stride, self.stride * 2,
                          self.stride * 64, self.stride + page, 2**40])
        length = rng.choice([page, self.map_size, self.map_size + page,
                             2 * self.map_size])
        flags = rng.choice([mmap.MAP_SHARED, mmap.MAP_SHARED,
                            mmap.MAP_PRIVATE])
        t0 = time.monotonic()
        try:
            m = mmap.mmap(self.srv, length, flags,
                          mmap.PROT_READ | mmap.PROT_WRITE, offset=off)
            e = 0
            m.close()
        except OSError as ex:
            e = ex.errno
        except (OverflowError, ValueError):
            e = errno.EINVAL
        self.note(f"mmap off {off:#x} len {length:#x}", e,
                  time.monotonic() - t0)

    def fuzz_open(self, rng):
        t0 = time.monotonic()
        try:
            fd = os.open(f"/dev/hybd{self.dev_id}-srv", os.O_RDWR)
            os.close(fd)
            e = 0
        except OSError as ex:
            e = ex.errno
        # the node is ours: a second server is refused
        self.note("second open", e, time.monotonic() - t0)
        if e != errno.EBUSY:
            with self.lock:
                self.bad.append(f"second open of the server node: "
                                f"{u.errname(e)}, not EBUSY")

    def fuzz_srv_io(self, rng):
        q = rng.choice([0, 1, self.nr_queues, 64, 0xFFFF])
        flags = rng.choice([0, 0, 2, 3, 4, 0x8000])
        res = rng.choice([0, 0, 0, 1])
        buf = bytearray(struct.pack(SRV_IO_FMT, rng.choice([16, 16, 8, 32]),
                                    q, flags, 0, res))
        t0 = time.monotonic()
        e = u.ioctl(self.srv, SRV_IO, buf)
        self.note("SRV_IO", e, time.monotonic() - t0)

    # ---------------------------------------------------------------- main
    def run(self):
        rng = random.Random(self.seed)
        self.add_device(rng)
        srv = threading.Thread(target=self.server,
                               args=(random.Random(rng.getrandbits(64)),),
                               daemon=True)
        # phase 1: the device is added, not started (calls in the wrong
        # state); the server thread answers correctly, so that START's
        # partition scan is served
        self.stop_garbage.set()
        srv.start()
        self.fuzz_thread(random.Random(rng.getrandbits(64)),
                         self.calls // 10)
        e, took = self.raw_ioctl(self.srv, SRV_START, None)
        self.note("START", e, took)
        if e:
            self.bad.append(f"START: {u.errname(e)}")
        print(f"started {self.dev_id}", flush=True)
        sys.stdin.readline()    # "go": the test's I/O runs
        # phase 2: 4 threads, and a server that answers badly too
        self.phase = 2
        self.stop_garbage.clear()
        threads = [threading.Thread(
            target=self.fuzz_thread,
            args=(random.Random(rng.getrandbits(64)),
                  (self.calls - self.calls // 10 + 3) // 4))
            for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.stop_garbage.set()
        print(f"fuzzed {self.done} calls, bad {len(self.bad)}: "
              f"{dict(self.errnos)} ring {dict(self.ring)}", flush=True)
        for b in self.bad[:50]:
            print(f"BAD {b}", flush=True)
        # serve correctly until told to go (a line or EOF on stdin)
        select.select([sys.stdin], [], [])
        self.stop_all.set()
        srv.join(10)
        return 1 if self.bad else 0


def main():
    seed, calls = int(sys.argv[1]), int(sys.argv[2])
    sys.exit(Fuzz(seed, calls).run())


if __name__ == "__main__":
    main()
