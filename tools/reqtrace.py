#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0
"""reqtrace.py - where a block request's time goes, from the kernel's own
trace points (ftrace through tracefs: no tool to install).

  reqtrace.py DEV [--qd N] [--bs BYTES] [--seconds S] [--json FILE]

Runs fio on DEV (random reads of --bs, 4 KiB by default; QD1 with psync,
else io_uring at --qd) and traces one second of it: the submitter's and the server's
syscalls, sched_wakeup/sched_switch, block_rq_issue/complete.  Then:

* at QD1, the stages of each request, medians in microseconds:
    submit   fio enters pread64          -> block_rq_issue (queue_rq)
    wake     block_rq_issue              -> the server is woken
    run      woken                       -> the server is switched in
    return   switched in                 -> it is back in user space
    handle   back in user space          -> its next syscall (the handler)
    commit   that syscall                -> block_rq_complete
    rewake   block_rq_complete           -> the submitter is woken
    rerun    woken                       -> the submitter is switched in
    finish   switched in                 -> pread64 returns
  (the server is whichever task block_rq_issue's CPU wakes first; a stage
  is measured only on requests that have it: a polling worker is never
  woken, a fast-path hit wakes nobody);
* at any depth, per completed request: context switches, wakeups and
  wakeups of a task onto another CPU than the waker's; and per CPU the
  share of time each kind of task ran (fio, the server's threads by name,
  kworkers, idle), which shows a submitter and a worker sharing one CPU.

Used by `bench.py --trace` for each line; works on any block device.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

TRACEFS = "/sys/kernel/tracing"
# x86-64 numbers: ioctl, pread64, pwrite64, io_uring_enter
SYSCALLS = {16: "ioctl", 17: "pread64", 18: "pwrite64", 426: "io_uring_enter"}
EVENTS = ("raw_syscalls/sys_enter", "raw_syscalls/sys_exit",
          "sched/sched_switch", "sched/sched_waking", "sched/sched_wakeup",
          "block/block_rq_issue", "block/block_rq_complete")
STAGES = ("submit", "wake", "run", "return", "handle", "commit", "rewake",
          "rerun", "finish")

LINE_RE = re.compile(
    r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[(?P<cpu>\d+)\]"
    r"\s+\S+\s+(?P<ts>\d+\.\d+):\s+(?P<ev>\w+):\s+(?P<rest>.*)$")


def tfs(path, value=None):
    full = os.path.join(TRACEFS, path)
    if value is None:
        with open(full) as f:
            return f.read()
    with open(full, "w") as f:
        f.write(value)
    return None


def mount_tracefs():
    if not os.path.exists(os.path.join(TRACEFS, "trace")):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS],
                       check=True)


def dev_numbers(dev):
    st = os.stat(dev)
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def setup(dev):
    mount_tracefs()
    tfs("tracing_on", "0")
    tfs("current_tracer", "nop")
    tfs("buffer_size_kb", "16384")
    tfs("trace", "")
    nr = " || ".join(f"id == {n}" for n in SYSCALLS)
    tfs("events/raw_syscalls/sys_enter/filter", nr)
    tfs("events/raw_syscalls/sys_exit/filter", nr)
    major, minor = dev_numbers(dev)
    devt = (major << 20) | minor
    for ev in ("block_rq_issue", "block_rq_complete"):
        tfs(f"events/block/{ev}/filter", f"dev == {devt}")
    for ev in EVENTS:
        tfs(f"events/{ev}/enable", "1")


def teardown():
    tfs("tracing_on", "0")
    for ev in EVENTS:
        tfs(f"events/{ev}/enable", "0")
    for ev in ("raw_syscalls/sys_enter", "raw_syscalls/sys_exit",
               "block/block_rq_issue", "block/block_rq_complete"):
        tfs(f"events/{ev}/filter", "0")
    tfs("buffer_size_kb", "1408")


def fio_cmd(dev, qd, seconds, bs):
    cmd = ["fio", "--output-format=json", "--name=trace", "--filename=" + dev,
           "--rw=randread", f"--bs={bs}", "--direct=1", "--size=16M",
           "--time_based", f"--runtime={seconds + 2}", "--norandommap",
           "--randrepeat=0", "--invalidate=0", "--thread", "--disk_util=0"]
    if qd == 1:
        cmd += ["--ioengine=psync", "--iodepth=1"]
    else:
        cmd += ["--ioengine=io_uring", f"--iodepth={qd}"]
    return cmd


def capture(dev, qd, seconds, bs):
    """Run fio, trace @seconds of its middle; the trace's lines."""
    setup(dev)
    try:
        fio = subprocess.Popen(fio_cmd(dev, qd, seconds, bs),
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        out = []
        pump = threading.Thread(target=lambda: out.append(fio.stdout.read()),
                                daemon=True)
        pump.start()
        time.sleep(1)
        tfs("tracing_on", "1")
        time.sleep(seconds)
        tfs("tracing_on", "0")
        fio.wait(timeout=120)
        pump.join(timeout=5)
        if fio.returncode:
            raise RuntimeError(f"fio exited {fio.returncode}: "
                               f"{''.join(out)[-300:]}")
        with open(os.path.join(TRACEFS, "trace")) as f:
            return f.read().splitlines()
    finally:
        teardown()


def kv(rest):
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S+)", rest))


def parse(lines):
    """The events, as dicts with ts (us), cpu, pid, comm, ev and fields."""
    events = []
    waker = {}          # pid -> CPU of its last sched_waking
    for line in lines:
        m = LINE_RE.match(line)
        if not m:
            continue
        e = {"ts": float(m["ts"]) * 1e6, "cpu": int(m["cpu"]),
             "pid": int(m["pid"]), "comm": m["comm"].strip(), "ev": m["ev"]}
        rest = m["rest"]
        if e["ev"] in ("sys_enter", "sys_exit"):
            nr = re.match(r"NR (\d+)", rest)
            e["nr"] = int(nr.group(1)) if nr else -1
        elif e["ev"] == "sched_waking":
            # fired on the waker's CPU; sched_wakeup on the target's
            waker[int(kv(rest).get("pid", -1))] = e["cpu"]
            continue
        elif e["ev"] == "sched_wakeup":
            f = kv(rest)
            e["wpid"] = int(f.get("pid", -1))
            e["wcomm"] = f.get("comm", "?")
            e["target"] = int(f.get("target_cpu", -1))
            e["from"] = waker.pop(e["wpid"], e["cpu"])
        elif e["ev"] == "sched_switch":
            # prev_comm=... prev_pid=N ... ==> next_comm=... next_pid=N
            prev, _, nxt = rest.partition("==>")
            pf, nf = kv(prev), kv(nxt)
            e["prev"] = int(pf.get("prev_pid", -1))
            e["next"] = int(nf.get("next_pid", -1))
            e["ncomm"] = nf.get("next_comm", "?")
        events.append(e)
    events.sort(key=lambda e: e["ts"])
    return events


def kind(comm):
    """The class of task a CPU ran, for the occupancy table."""
    if comm.startswith("swapper"):
        return "idle"
    if comm.startswith("kworker"):
        return "kworker"
    if comm.startswith("fio"):
        return "fio"
    return comm


def occupancy(events):
    """Per CPU, the share of the traced time each kind of task ran."""
    last = {}           # cpu -> (ts, kind running)
    spent = {}
    t_first = events[0]["ts"] if events else 0
    t_last = events[-1]["ts"] if events else 0
    for e in events:
        if e["ev"] != "sched_switch":
            continue
        cpu = e["cpu"]
        start, who = last.get(cpu, (t_first, None))
        if who is not None:
            d = spent.setdefault(cpu, {})
            d[who] = d.get(who, 0.0) + e["ts"] - start
        last[cpu] = (e["ts"], kind(e["ncomm"]))
    for cpu, (start, who) in last.items():
        d = spent.setdefault(cpu, {})
        d[who] = d.get(who, 0.0) + t_last - start
    out = {}
    for cpu, d in sorted(spent.items()):
        total = sum(d.values()) or 1.0
        out[str(cpu)] = {k: round(v / total, 3)
                         for k, v in sorted(d.items(), key=lambda x: -x[1])
                         if v / total >= 0.01}
    return out


def counts(events):
    ios = sum(1 for e in events if e["ev"] == "block_rq_complete")
    switches = sum(1 for e in events if e["ev"] == "sched_switch")
    wakes = [e for e in events if e["ev"] == "sched_wakeup"]
    cross = sum(1 for e in wakes if e["target"] != e["from"])
    per = (lambda n: round(n / ios, 2)) if ios else (lambda n: None)
    return {"ios": ios, "switches_per_io": per(switches),
            "wakeups_per_io": per(len(wakes)),
            "cross_cpu_wakeups_per_io": per(cross)}


def stages(events):
    """QD1: the stage durations of each pread64 of the submitter."""
    enters = [e for e in events if e["ev"] == "sys_enter" and e["nr"] == 17]
    if not enters:
        return {}
    fio = max(set(e["pid"] for e in enters),
              key=lambda p: sum(1 for e in enters if e["pid"] == p))
    samples = {s: [] for s in STAGES}
    cross = same = polled = 0
    i, n = 0, len(events)
    while i < n:
        e = events[i]
        if not (e["ev"] == "sys_enter" and e["pid"] == fio and e["nr"] == 17):
            i += 1
            continue
        # the window of one pread64
        j = i + 1
        while j < n and not (events[j]["ev"] == "sys_exit" and
                             events[j]["pid"] == fio):
            j += 1
        if j >= n:
            break
        win = events[i:j + 1]
        t = {"enter": e["ts"], "exit": events[j]["ts"]}
        srv = None
        for w in win:
            ev = w["ev"]
            if "issue" not in t:
                if ev == "block_rq_issue":
                    t["issue"] = w["ts"]
                continue
            if srv is None and "complete" not in t and ev == "sched_wakeup" \
                    and w["wpid"] != fio:
                srv = w["wpid"]
                t["woken"] = w["ts"]
                if w["target"] == w["from"]:
                    same += 1
                else:
                    cross += 1
                continue
            if srv is not None and "running" not in t and \
                    ev == "sched_switch" and w["next"] == srv:
                t["running"] = w["ts"]
            elif srv is not None and "running" in t and "user" not in t \
                    and ev == "sys_exit" and w["pid"] == srv:
                t["user"] = w["ts"]
            elif "user" in t and "handled" not in t and \
                    ev == "sys_enter" and w["pid"] == srv:
                t["handled"] = w["ts"]
            elif ev == "block_rq_complete" and "complete" not in t:
                t["complete"] = w["ts"]
            elif "complete" in t and "rewoken" not in t and \
                    ev == "sched_wakeup" and w["wpid"] == fio:
                t["rewoken"] = w["ts"]
            elif "rewoken" in t and "rerunning" not in t and \
                    ev == "sched_switch" and w["next"] == fio:
                t["rerunning"] = w["ts"]
        if srv is None:
            polled += 1
        pairs = (("submit", "enter", "issue"), ("wake", "issue", "woken"),
                 ("run", "woken", "running"), ("return", "running", "user"),
                 ("handle", "user", "handled"),
                 ("commit", "handled", "complete"),
                 ("rewake", "complete", "rewoken"),
                 ("rerun", "rewoken", "rerunning"),
                 ("finish", "rerunning", "exit"))
        for name, a, b in pairs:
            if a in t and b in t and t[b] >= t[a]:
                samples[name].append(t[b] - t[a])
        samples.setdefault("total", []).append(t["exit"] - t["enter"])
        i = j + 1
    out = {name: {"median_us": round(statistics.median(v), 1), "n": len(v)}
           for name, v in samples.items() if v}
    out["server_wakeups"] = {"same_cpu": same, "cross_cpu": cross,
                             "none": polled}
    return out


def trace(dev, qd=1, seconds=1, bs=4096):
    events = parse(capture(dev, qd, seconds, bs))
    res = {"qd": qd, "bs": bs, "seconds": seconds, **counts(events),
           "cpu_share": occupancy(events)}
    if qd == 1:
        res["stages"] = stages(events)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dev")
    ap.add_argument("--qd", type=int, default=1)
    ap.add_argument("--bs", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=1)
    ap.add_argument("--json", help="write the result here too")
    args = ap.parse_args()
    res = trace(args.dev, args.qd, args.seconds, args.bs)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
