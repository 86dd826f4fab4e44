# SPDX-License-Identifier: GPL-2.0
"""The setup of hybd's lines: the module and its binaries, hybdctl's
stats, the servers (examples/*, zram-rs) serving one device each."""

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

from .common import REPO, BenchError, run, say, wait_until
from .devio import fill_mix, fill_region, fill_zmix, read_pass
from .peers import CACHE, NBDEX_NS, check_stored, compression, ensure_nbdex
from .report import fmt_pct
from .setup import (NULLB_TARGET, backing_file, bench_key, ensure_nullblk,
                    ext4_file)


HYBDCTL = REPO / "tools" / "hybdctl" / "hybdctl"
RAMDISK = REPO / "examples" / "ramdisk" / "ramdisk"
LOOP = REPO / "examples" / "loop" / "hybd-loop"
DEDUP = REPO / "examples" / "dedup" / "dedup"
ENCRYPT = REPO / "examples" / "encrypt" / "encrypt"
NBDEX = REPO / "examples" / "nbd" / "hybd-nbd"
NBDEX_BPF = REPO / "examples" / "nbd" / "nbd.bpf.o"
# zram-rs: the Rust workspace's, which tools/cargo.sh builds outside the
# tree (the bench guest sees the cache read-only), in rust/target where
# the cache has no target directory
CARGO_TARGET = Path(os.environ.get("HYBD_CARGO_TARGET") or (
    CACHE / "cargo" / "target" if (CACHE / "cargo" / "target").is_dir()
    else REPO / "rust" / "target"))
ZRAM_RS = CARGO_TARGET / "release" / "zram-rs"
ZRAM_BPF = REPO / "examples" / "zram-rs" / "zram.bpf.o"
BPF_DIR = REPO / "bpf"
CONTROL = "/dev/hybd-control"
KMOD = Path(os.environ.get("HYBD_KMOD", REPO / "kmod" / "hybd.ko"))


def hybdctl(*args, timeout=60):
    return run([HYBDCTL, *args], timeout=timeout)


def hybd_stats(dev, maps=False):
    """`hybdctl stats DEV --json`, parsed: the device's counters at the top
    level, latency histograms, the attached program (and with @maps, its
    own counters: "maps")."""
    res = hybdctl("stats", dev, "--json", *(["--maps"] if maps else []),
                  timeout=30)
    try:
        return json.loads(res.stdout)
    except ValueError:
        raise BenchError(f"hybdctl stats {dev} --json: not JSON: "
                         f"{res.stdout[:200]!r}") from None


def fast_slow(stats):
    try:
        return int(stats["fast_done"]), int(stats["slow_done"])
    except (KeyError, TypeError, ValueError):
        raise BenchError("hybdctl stats --json has no fast_done/slow_done") \
            from None


def prog_counters(stats):
    """The attached program's global counters, merged over its maps."""
    out = {}
    for values in (stats.get("maps") or {}).values():
        out.update(values)
    return out


def read_shares(spec, before, after):
    """The share of the reads each of spec["counters"] counted between two
    `hybdctl stats --maps` snapshots, of the spec["total"] counter's."""
    b, a = prog_counters(before), prog_counters(after)
    try:
        total = int(a[spec["total"]]) - int(b[spec["total"]])
        return {c: (int(a[c]) - int(b[c])) / total if total else None
                for c in spec["counters"]}
    except (KeyError, TypeError, ValueError):
        raise BenchError(f"the program's counters {spec['counters']} are "
                         "not in hybdctl stats --maps") from None


def fast_share(before, after):
    """(fast, slow, fast share) completed between two stats snapshots."""
    f0, s0 = fast_slow(before)
    f1, s1 = fast_slow(after)
    fast, slow = f1 - f0, s1 - s0
    return fast, slow, (fast / (fast + slow) if fast + slow else None)


class Ramdisk:
    """examples/ramdisk (or another server printing "ready /dev/hybdN",
    such as examples/loop) serving one /dev/hybdN until stop()."""

    def __init__(self, args, exe=RAMDISK):
        self.cmd = [str(exe), *args]
        self.out = []
        self.dev = None
        self._ready = threading.Event()
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def wait_ready(self, ready_timeout=60):
        deadline = time.monotonic() + ready_timeout
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._pump.join(timeout=1)
                break
        if self.dev is None:
            why = (f"exited with {self.proc.returncode}"
                   if self.proc.poll() is not None
                   else f"not ready after {ready_timeout}s")
            raise BenchError(f"{' '.join(self.cmd)}: {why}: {self.tail()}")

    def _read(self):
        for line in self.proc.stdout:
            self.out.append(line.rstrip("\n"))
            m = re.match(r"ready (/dev/hybd\d+)\s*$", line)
            if m and self.dev is None:
                self.dev = m.group(1)
                self._ready.set()

    def tail(self, n=5):
        return " | ".join(self.out[-n:]) or "(no output)"

    def stop(self):
        """SIGTERM: the ramdisk deletes its device and exits 0."""
        name = self.dev or "(not ready)"
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
                raise BenchError(f"ramdisk {name} ignored SIGTERM (killed)")
        self._pump.join(timeout=5)
        # one that never came up has had its failure reported already
        if self.dev and self.proc.returncode != 0:
            raise BenchError(f"ramdisk {name} exited with "
                             f"{self.proc.returncode}: {self.tail()}")


def zram_rs_compression(path, since):
    """zram-rs's --stats FILE as compression() has it, once rewritten after
    @since (time.time()): it rewrites it once a second."""
    def fresh():
        try:
            return os.stat(path).st_mtime > since
        except OSError:
            return False
    wait_until(fresh, 10, f"zram-rs to rewrite {path}")
    try:
        st = json.loads(Path(path).read_text())
        return compression(st["orig_data_size"], st["compr_data_size"],
                           st["mem_used"], st["same_pages"],
                           st["huge_pages"],
                           "its compressed and whole blocks and its "
                           "per-block table")
    except (OSError, ValueError, KeyError) as e:
        raise BenchError(f"zram-rs's stats {path}: {e}") from None


def ensure_hybd(ctx):
    """Load kmod/hybd.ko unless it is loaded, check our binaries."""
    if not os.path.exists(CONTROL):
        if not KMOD.is_file():
            raise BenchError(f"{CONTROL} missing and {KMOD} not built "
                             "(make kmod)")
        say(f"{CONTROL} missing: insmod {KMOD}")
        run(["insmod", KMOD])
        ctx.cleanup.push("rmmod hybd", run, ["rmmod", "hybd"])
        wait_until(lambda: os.path.exists(CONTROL), 10, CONTROL)
    for path, what in ((HYBDCTL, "tools/hybdctl/hybdctl"),
                       (RAMDISK, "examples/ramdisk/ramdisk")):
        if not os.access(path, os.X_OK):
            raise BenchError(f"{path} is not built ({what}): run make")


def queue_args(spec):
    return ["--queues", str(spec["queues"])] if spec.get("queues") else []


def setup_hybd(line, ctx):
    spec = line.hybd
    line.region = spec.get("region")
    region = line.region or ctx.args.region
    # 4 KiB requests only: small per-tag buffers keep ring memory low with
    # one ramdisk per line
    args = ["--max-io", "128K", *queue_args(spec)]
    zram_stats = None           # zram-rs's --stats FILE
    if spec.get("server") == "loop":
        if not os.access(LOOP, os.X_OK):
            raise BenchError(f"{LOOP} is not built (make examples)")
        server = Ramdisk([*args, backing_file(ctx, f"{line.key}.img")],
                         exe=LOOP)
    elif spec.get("server") == "bloop":
        if not os.access(LOOP, os.X_OK):
            raise BenchError(f"{LOOP} is not built (make examples)")
        if spec.get("bdev"):
            ensure_nullblk(ctx)
            path = NULLB_TARGET
        elif spec.get("ext4"):
            path = ext4_file(ctx)
        else:
            # the kernel loop's own file when that line runs: the same file
            path = ctx.kloop_backing or backing_file(ctx, "bloop.img")
        poll = ["--poll-ns", str(spec["poll_ns"])] if spec["poll_ns"] else []
        server = Ramdisk([*args, *poll, *spec.get("flags", []), "--remap",
                          path], exe=LOOP)
    elif spec.get("server") == "encrypt":
        if not os.access(ENCRYPT, os.X_OK):
            raise BenchError(f"{ENCRYPT} is not built (make examples)")
        backing = backing_file(ctx, f"{line.key}.img")
        # the files dm-crypt's lines read (peers.setup_dmcrypt)
        if line.key == "encslow":
            ctx.enc_backing = backing
        elif line.key == "encfull":
            ctx.enc_full_backing = backing
        server = Ramdisk(["--key-file", bench_key(ctx), *spec["flags"],
                          *queue_args(spec), backing], exe=ENCRYPT)
    elif spec.get("server") == "nbd":
        if not os.access(NBDEX, os.X_OK):
            raise BenchError(f"{NBDEX} is not built (make examples)")
        uri = ensure_nbdex(ctx)
        fast = ["--bpf", str(NBDEX_BPF)] if spec["fast"] or \
            spec.get("counters") else []
        server = Ramdisk(["netns", "exec", NBDEX_NS, str(NBDEX), *fast,
                          *spec.get("flags", []), *queue_args(spec), uri],
                         exe="ip")
    elif spec.get("server") == "zram":
        # as large as the ramdisks and the kernel's zram; no memory limit,
        # as zram has none by default
        if not os.access(ZRAM_RS, os.X_OK):
            raise BenchError(f"{ZRAM_RS} is not built (make rust)")
        fast = []
        if spec.get("fastpath"):
            if not ZRAM_BPF.is_file():
                raise BenchError(f"{ZRAM_BPF} is not built (make examples)")
            fast = ["--fastpath", str(ZRAM_BPF)]
        zram_stats = os.path.join(ctx.tmp, f"{line.key}.stats.json")
        server = Ramdisk(["--size", str(ctx.args.ramdisk_size), *fast,
                          "--stats", zram_stats, *queue_args(spec),
                          *spec.get("flags", [])], exe=ZRAM_RS)
    elif spec.get("server") == "dedup":
        if not os.access(DEDUP, os.X_OK):
            raise BenchError(f"{DEDUP} is not built (make examples)")
        store = os.path.join(ctx.tmp, f"{line.key}.store")
        run([DEDUP, "format", "--force", "--size",
             str(max(ctx.args.ramdisk_size, 2 * region)), store],
            timeout=300)
        obj = spec.get("bpf", "dedup.bpf.o")
        fast = (["--bpf", str(DEDUP.parent / obj)] if spec["fast"]
                else ["--no-fast-path"])
        server = Ramdisk(["serve", *fast, *queue_args(spec),
                          *spec.get("flags", []), store], exe=DEDUP)
    else:
        args += ["--size", str(ctx.args.ramdisk_size)]
        if spec.get("server") == "null":
            args.append("--null")
        if spec["poll_ns"]:
            args += ["--poll-ns", str(spec["poll_ns"])]
        server = Ramdisk(args + spec.get("flags", []))
    ctx.cleanup.push("stop the ramdisk", server.stop)
    server.wait_ready()
    line.dev = server.dev
    line.info = {"server": " ".join(server.cmd), "program": spec["prog"],
                 "region": region}
    if spec["data"] == "mix":
        fill_mix(line.dev, region)
    elif spec["data"] == "zmix":
        line.info["zmix"] = fill_zmix(line.dev, region)
        # every write was stored before it completed: the stats file's
        # next version, written after this, has them all
        figures = zram_rs_compression(zram_stats, time.time())
        check_stored(line, figures, region)
        line.info["compression"] = figures
    elif spec["data"]:
        fill_region(line.dev, region)
    if spec["prog"]:
        obj = BPF_DIR / f"{spec['prog']}.bpf.o"
        if not obj.is_file():
            raise BenchError(f"{obj} is not built (make -C bpf)")
        hybdctl("attach", obj, line.dev)
        ctx.cleanup.push(f"detach {line.dev}", hybdctl, "detach", line.dev)
    if spec["fast"]:
        # the first pass fills the program's maps, the second shows they hit
        read_pass(line.dev, region)
        before = hybd_stats(line.dev)
        read_pass(line.dev, region)
        fast, slow, share = fast_share(before, hybd_stats(line.dev))
        line.info["warm"] = {"fast": fast, "slow": slow, "fast_share": share}
        say(f"{line.key}: warm pass over {region >> 20} MiB: "
            f"{fast} fast, {slow} slow")
        if not share or share < 0.99:
            say(f"WARNING: {line.key}: only {fmt_pct(share)} of the warm "
                "reads were served by the fast path")
