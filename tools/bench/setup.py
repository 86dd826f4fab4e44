# SPDX-License-Identifier: GPL-2.0
"""Setting lines up: a line, the run's context and cleanup, and what
several lines share (null_blk, the backing files, the loop driver, the
key, no I/O scheduler).  The peers' setup is in peers.py, hybd's in
hybd.py."""

import os
import re
import subprocess
from pathlib import Path

from .catalogue import (BS, LARGE_LINES, LARGE_MODES, LARGE_WRITE_LINES,
                        LINES, MODES, PAR_LINES, QD32W_LINES, SEQ_LINES,
                        WRITE_LINES, writes)
from .common import BenchError, read_text, run, say, wait_until
from .devio import fill_region


NULLB_DEV = "/dev/nullb0"
NULLB_TARGET = "/dev/nullb1"
NULLB_EXT4 = "/dev/nullb2"


class Cleanup:
    """Undo steps, run last-in first-out; each failure is reported, none
    stops the others."""

    def __init__(self):
        self.steps = []
        self.failed = False

    def push(self, what, fn, *args):
        self.steps.append((what, fn, args))

    def run(self):
        while self.steps:
            what, fn, args = self.steps.pop()
            try:
                fn(*args)
            except (BenchError, OSError, subprocess.SubprocessError) as e:
                self.failed = True
                say(f"cleanup: {what}: {e}")


class Line:
    def __init__(self, key):
        self.key = key
        self.label, self.hybd = LINES[key]
        self.dev = None
        self.info = {}          # how it was set up, for bench.json
        self.modes = tuple(
            m for m in MODES if m in ("qd1", "qd32") or
            (m == "par" and key in PAR_LINES) or
            (m == "seq" and key in SEQ_LINES) or
            (m == "qd1w" and key in WRITE_LINES) or
            (m == "qd32w" and key in QD32W_LINES) or
            (m in LARGE_MODES and key in (LARGE_WRITE_LINES if writes(m)
                                          else LARGE_LINES)))
        self.runs = {m: [] for m in self.modes}
        self.region = None      # bytes read, if not --region
        self.error = None       # why it could not be set up
        self.unsupported = False  # error: this kernel or rublk lacks it
        self.stats = None       # hybd counters after the last fio run


def module_loaded(name):
    return Path(f"/sys/module/{name}").exists()


NULLB_PARAMS = ["nr_devices=3", "memory_backed=1", "gb=1", f"bs={BS}",
                "queue_mode=2", "irqmode=0", "submit_queues=2"]


def ensure_nullblk(ctx):
    """null_blk loaded by us, once: /dev/nullb0 for the nullblk line,
    /dev/nullb1 the block-device target of bloopb and dmlinear, each with
    the region written."""
    if ctx.nullblk:
        return
    if module_loaded("null_blk"):
        raise BenchError("null_blk is already loaded (with unknown "
                         "parameters): rmmod null_blk first")
    run(["modprobe", "null_blk", *NULLB_PARAMS])
    ctx.cleanup.push("rmmod null_blk", run, ["modprobe", "-r", "null_blk"])
    for dev in (NULLB_DEV, NULLB_TARGET):
        wait_until(lambda: os.path.exists(dev), 10, dev)
        fill_region(dev, ctx.args.region)
    ctx.nullblk = True


def ext4_file(ctx):
    """kloopx's and bloopx's file: on ext4 on /dev/nullb2, made once,
    written in full (allocated: a write does not wait to allocate)."""
    if ctx.ext4_file:
        return ctx.ext4_file
    ensure_nullblk(ctx)
    wait_until(lambda: os.path.exists(NULLB_EXT4), 10, NULLB_EXT4)
    mnt = os.path.join(ctx.tmp, "ext4")
    os.makedirs(mnt, exist_ok=True)
    run(["mkfs.ext4", "-F", "-q", NULLB_EXT4])
    run(["mount", "-t", "ext4", NULLB_EXT4, mnt])
    ctx.cleanup.push(f"umount {mnt}", run, ["umount", mnt])
    path = os.path.join(mnt, "loopx.img")
    with open(path, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(ctx.args.ramdisk_size >> 20):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    ctx.ext4_file = path
    return path


def backing_file(ctx, name):
    """A file of --ramdisk-size bytes for the file-backed lines (in the
    guest, /tmp is tmpfs: no disk under either loop, only the path)."""
    path = os.path.join(ctx.tmp, name)
    with open(path, "wb") as f:
        f.truncate(ctx.args.ramdisk_size)
    return path


def ensure_loop(ctx):
    """The loop driver, loaded (and unloaded at the end) if it is not."""
    if not module_loaded("loop"):
        run(["modprobe", "loop"])
        ctx.cleanup.push("rmmod loop", run, ["modprobe", "-r", "loop"])
        wait_until(lambda: os.path.exists("/dev/loop-control"), 10,
                   "/dev/loop-control")


def bench_key(ctx):
    """The key of the encrypt lines and dm-crypt: 64 random bytes."""
    path = os.path.join(ctx.tmp, "bench.key")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(64))
    return path


def no_scheduler(dev):
    """Every line without an I/O scheduler: single-queue devices (nbd) get
    mq-deadline by default, multi-queue ones none.  Returns the setting."""
    path = Path(f"/sys/block/{os.path.basename(dev)}/queue/scheduler")
    if read_text(str(path)) in (None, "none"):
        return "none"           # bio-based (dm): no scheduler at all
    try:
        path.write_text("none")
        now = path.read_text()
    except OSError as e:
        raise BenchError(f"{path}: {e.strerror}") from None
    m = re.search(r"\[(\S+)\]", now)
    return m.group(1) if m else now.strip()


class Context:
    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.cleanup = Cleanup()
        self.enc_backing = None     # the encslow line's, for dmcrypt
        self.enc_full_backing = None  # encfull's, for dmcryptf
        self.kloop_backing = None   # the kloop line's, for bloop, uloop
        self.ext4_file = None       # kloopx's and bloopx's (ext4_file)
        self.rublk = None           # rublk's version and features
        self.nullblk = False        # null_blk loaded (ensure_nullblk)
        self.next_ublk = 0          # the next ublk device's id
        self.nbdex_uri = None       # the nbdex export (ensure_nbdex)
