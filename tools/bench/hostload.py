#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0
"""hostload.py - the host's own CPU load over a bench run.

tools/vm-run bench starts it beside the guest:

  hostload.py --out RUNDIR/host-load.json --guest-root PID
              [--guest-match RUNDIR] [--interval S]

It samples /proc/stat (every CPU) and every process's CPU time
(/proc/PID/stat) each --interval seconds until SIGTERM (or until the
--guest-root process is gone, or --max-seconds), then writes one JSON
object to --out, which tools/vm-run puts into host.json ("during":
{"load": ...}) and the report into bench.json's meta.host:

  cpu_busy_pct    each CPU's busy share over the run (%)
  busy_pct        all CPUs' (% of all CPUs)
  guest_pct       the share of the run's own guest: --guest-root (vm-run)
                  and every process under it (vng, QEMU, virtiofsd, ...),
                  or whose command line holds --guest-match (the run's
                  directory: one that left the tree, a daemon)
  other_qemu_pct  other QEMU processes' (another guest)
  others_pct      the rest: busy_pct less those two, which includes what
                  no sample saw (a process shorter than the interval)
  top             the processes of "others" with the most CPU time, by
                  name (comm): their CPU time, its share of all CPUs, and
                  the time of the children they reaped (a build's
                  compilers, under make or the compiler driver; part of
                  it may be a child's own time already counted)
  timeline        [seconds from the start, busy_pct, others_pct] a minute
                  at a time

The standard library only: vm-run runs it as a script, on the host.
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
WINDOW_S = 60
TOP = 5


def read_cpus():
    """{"cpu": (busy, total), "cpu0": ...} in clock ticks since boot."""
    out = {}
    for ln in Path("/proc/stat").read_text().splitlines():
        if not ln.startswith("cpu"):
            continue
        name, *f = ln.split()
        v = [int(x) for x in f[:8]]
        v += [0] * (8 - len(v))
        # user nice system idle iowait irq softirq steal (guest time is
        # in user already)
        busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
        out[name] = (busy, busy + v[3] + v[4])
    return out


def read_procs():
    """{(pid, starttime): (comm, ppid, own ticks, reaped children's)}."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue            # gone meanwhile
        lp, rp = text.find("("), text.rfind(")")
        rest = text[rp + 2:].split()
        try:
            # fields 4, 14-17 and 22 of proc(5): ppid, utime, stime,
            # cutime, cstime, starttime
            ppid = int(rest[1])
            own = int(rest[11]) + int(rest[12])
            children = int(rest[13]) + int(rest[14])
            start = int(rest[19])
        except (IndexError, ValueError):
            continue
        out[(int(name), start)] = (text[lp + 1:rp], ppid, own, children)
    return out


def uptime_ticks():
    return float(Path("/proc/uptime").read_text().split()[0]) * HZ


class Sampler:
    def __init__(self, guest_root, guest_match=None):
        self.guest_root = guest_root
        self.guest_match = guest_match.encode() if guest_match else None
        self.t0 = time.monotonic()
        self.cpu0 = self.cpu_last = read_cpus()
        self.since = uptime_ticks()
        procs = read_procs()
        # per process: [comm, class, base own, base children, own, children]
        self.procs = {}
        self.classes = {}
        self.classify(procs)
        for key, (comm, _, own, ch) in procs.items():
            self.procs[key] = [comm, self.classes[key], own, ch, own, ch]
        self.samples = 1
        self.windows = []       # [t, busy, total, guest, qemu] per sample
        self.window = None

    def classify(self, procs):
        """self.classes: each process's "guest" (guest_root or under it:
        this sampler too), "qemu" (another QEMU) or "other"; once classed,
        a process keeps its class (its parent may exit)."""
        by_pid = {key[0]: (key, v[1]) for key, v in procs.items()}
        for key, (comm, _, _, _) in procs.items():
            if key in self.classes:
                continue
            cls, pid, hops = "other", key[0], 0
            while pid > 1 and hops < 64:
                entry = by_pid.get(pid)
                if pid == self.guest_root or (
                        hops and entry and
                        self.classes.get(entry[0]) == "guest"):
                    cls = "guest"
                    break
                if entry is None:
                    break
                pid, hops = entry[1], hops + 1
            if cls == "other" and self.guest_match:
                try:
                    cmdline = Path(f"/proc/{key[0]}/cmdline").read_bytes()
                except OSError:
                    cmdline = b""
                if self.guest_match in cmdline:
                    cls = "guest"
            if cls == "other" and comm.startswith("qemu-system"):
                cls = "qemu"
            self.classes[key] = cls

    def sample(self):
        cpus = read_cpus()
        procs = read_procs()
        self.classify(procs)
        delta = {"guest": 0, "qemu": 0}
        for key, (comm, _, own, ch) in procs.items():
            p = self.procs.get(key)
            if p is None:
                # started since the last sample: all its time is the run's
                # (a pid that was there before has another starttime)
                base = (0, 0) if key[1] >= self.since else (own, ch)
                p = self.procs[key] = [comm, self.classes[key], *base,
                                       *base]
            if p[1] in delta:
                delta[p[1]] += max(0, own - p[4])
            p[4], p[5] = own, ch
        busy = cpus["cpu"][0] - self.cpu_last["cpu"][0]
        total = cpus["cpu"][1] - self.cpu_last["cpu"][1]
        self.windows.append((time.monotonic() - self.t0, busy, total,
                             delta["guest"], delta["qemu"]))
        self.cpu_last = cpus
        self.samples += 1

    def result(self, interval):
        def pct(ticks, total):
            return round(100 * ticks / total, 1) if total > 0 else None

        c0, c1 = self.cpu0, self.cpu_last
        per_cpu = sorted((k for k in c1 if k != "cpu" and k in c0),
                         key=lambda k: int(k[3:]))
        total = c1["cpu"][1] - c0["cpu"][1]
        busy = c1["cpu"][0] - c0["cpu"][0]
        by_class = {"guest": 0, "qemu": 0, "other": 0}
        names = {}
        for comm, cls, b_own, b_ch, own, ch in self.procs.values():
            if cls not in by_class:
                continue
            by_class[cls] += own - b_own
            # (a tenth of a second or more: the rest says nothing)
            if cls == "other" and own - b_own + ch - b_ch >= HZ / 10:
                n = names.setdefault(comm, [0, 0, 0])
                n[0] += 1
                n[1] += own - b_own
                n[2] += ch - b_ch
        top = sorted(names.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
        timeline, acc = [], None
        for t, b, tot, g, q in self.windows:
            if acc is None:
                acc = [t, 0, 0, 0, 0]
            acc[1:] = [acc[1] + b, acc[2] + tot, acc[3] + g, acc[4] + q]
            if t - acc[0] >= WINDOW_S:
                timeline.append(acc)
                acc = None
        if acc:
            timeline.append(acc)
        return {
            "interval_s": interval,
            "duration_s": round(time.monotonic() - self.t0, 1),
            "samples": self.samples, "cpus": len(per_cpu),
            "cpu_busy_pct": [pct(c1[k][0] - c0[k][0], c1[k][1] - c0[k][1])
                             for k in per_cpu],
            "busy_pct": pct(busy, total),
            "guest_pct": pct(by_class["guest"], total),
            "other_qemu_pct": pct(by_class["qemu"], total),
            "others_pct": pct(max(0, busy - by_class["guest"]
                                  - by_class["qemu"]), total),
            "top": [{"name": comm, "pids": n, "cpu_s": round(own / HZ, 1),
                     "cpu_pct": pct(own, total),
                     "children_cpu_s": round(ch / HZ, 1)}
                    for comm, (n, own, ch) in top[:TOP]],
            "timeline": [[round(t), pct(b, tot),
                          pct(max(0, b - g - q), tot)]
                         for t, b, tot, g, q in timeline]}


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main():
    ap = argparse.ArgumentParser(description="the host's CPU load over a "
                                 "bench run (see the module docstring)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--guest-root", type=int, default=os.getppid(),
                    help="the process whose descendants are the run's own "
                         "guest (default: our parent)")
    ap.add_argument("--guest-match", metavar="TEXT",
                    help="a process whose command line holds TEXT is the "
                         "run's own guest too")
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--max-seconds", type=float, default=4 * 3600)
    args = ap.parse_args()

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.append(1))
    s = Sampler(args.guest_root, args.guest_match)
    deadline = time.monotonic() + args.max_seconds
    while not stop and time.monotonic() < deadline and \
            alive(args.guest_root):
        # (a signal's handler runs at once, the sleep goes on: up to one
        # interval more)
        time.sleep(args.interval)
        s.sample()
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(s.result(args.interval)) + "\n")
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
