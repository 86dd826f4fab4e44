#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0
"""reqtrace.py - where a block request's time goes, from the kernel's own
trace points (ftrace through tracefs: no tool to install).

  reqtrace.py DEV [--qd N] [--bs BYTES] [--seconds S] [--json FILE]
  reqtrace.py DEV --graph FUNC,... [--depth N] [--qd N] ...

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
* at any depth, per completed request: the CPU time each kind of task
  spent, user and system, and the system's interrupt and softirq time
  (from /proc, over a window with nothing traced); every task's system
  calls by name (a second capture of its own, so that the first filters
  its syscalls to those the stages need), context switches, wakeups and
  wakeups of a task onto another CPU than the waker's; and per CPU the
  share of time each kind of task ran (fio, the server's threads by name,
  kworkers, idle), which shows a submitter and a worker sharing one CPU.

Used by `bench.py --trace` for each line; works on any block device.
HYBD_TRACE_RAW=DIR keeps each capture's raw ftrace text in DIR.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

TRACEFS = "/sys/kernel/tracing"
# x86-64 numbers: ioctl, pread64, pwrite64, io_uring_enter
SYSCALLS = {16: "ioctl", 17: "pread64", 18: "pwrite64", 426: "io_uring_enter"}
EVENTS = ("raw_syscalls/sys_enter", "raw_syscalls/sys_exit",
          "sched/sched_switch", "sched/sched_waking", "sched/sched_wakeup",
          "block/block_rq_issue", "block/block_rq_complete")
# names for the per-I/O syscall counts (x86-64); others print as their number
SYSCALL_NAMES = {0: "read", 1: "write", 7: "poll", 16: "ioctl",
                 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev",
                 23: "select", 44: "sendto", 45: "recvfrom", 46: "sendmsg",
                 47: "recvmsg", 202: "futex", 228: "clock_gettime",
                 232: "epoll_wait", 233: "epoll_ctl", 270: "pselect6",
                 271: "ppoll", 281: "epoll_pwait", 426: "io_uring_enter"}
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


def setup(dev, all_syscalls=False):
    mount_tracefs()
    tfs("tracing_on", "0")
    tfs("current_tracer", "nop")
    tfs("buffer_size_kb", "16384")
    tfs("trace", "")
    major, minor = dev_numbers(dev)
    devt = (major << 20) | minor
    for ev in ("block_rq_issue", "block_rq_complete"):
        tfs(f"events/block/{ev}/filter", f"dev == {devt}")
    if all_syscalls:
        # every syscall, and the requests: no sched events
        for ev in ("raw_syscalls/sys_enter", "raw_syscalls/sys_exit",
                   "block/block_rq_issue", "block/block_rq_complete"):
            tfs(f"events/{ev}/enable", "1")
        return
    nr = " || ".join(f"id == {n}" for n in SYSCALLS)
    tfs("events/raw_syscalls/sys_enter/filter", nr)
    tfs("events/raw_syscalls/sys_exit/filter", nr)
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


def capture(dev, qd, seconds, bs, all_syscalls=False):
    """Run fio, trace @seconds of its middle; the trace's lines."""
    setup(dev, all_syscalls)
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
            lines = f.read().splitlines()
        # HYBD_TRACE_RAW=DIR: keep each capture's raw text there too
        raw = os.environ.get("HYBD_TRACE_RAW")
        if raw:
            name = (f"{os.path.basename(dev)}-qd{qd}-{bs}"
                    f"{'-syscalls' if all_syscalls else ''}.txt")
            with open(os.path.join(raw, name), "w") as f:
                f.write("\n".join(lines) + "\n")
        return lines
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


def task_times():
    """{(pid, tid): (comm, user ticks, system ticks)} of every thread."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            comm = st[st.index("(") + 1:st.rindex(")")]
            f = st[st.rindex(")") + 2:].split()
            out[(pid, tid)] = (comm, int(f[11]), int(f[12]))
    return out


def irq_ticks():
    """The system's (irq, softirq) ticks, all CPUs."""
    with open("/proc/stat") as f:
        f = f.readline().split()
    return int(f[6]), int(f[7])


def reads_done(dev):
    name = os.path.basename(os.path.realpath(dev))
    with open(f"/sys/class/block/{name}/stat") as f:
        return int(f.read().split()[0])


def cpu_per_io(dev, qd, seconds, bs):
    """Per read completed: each kind of task's user and system CPU time
    (us), and the interrupt and softirq time, over @seconds of fio with
    nothing traced."""
    hz = os.sysconf("SC_CLK_TCK")
    fio = subprocess.Popen(fio_cmd(dev, qd, seconds, bs),
                           stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        t0, i0, r0 = task_times(), irq_ticks(), reads_done(dev)
        time.sleep(seconds)
        t1, i1, r1 = task_times(), irq_ticks(), reads_done(dev)
    finally:
        fio.wait(timeout=120)
    ios = r1 - r0
    if ios <= 0:
        return {}
    us = 1e6 / hz / ios
    out = {}
    for key, (comm, u, s) in t1.items():
        u0, s0 = t0.get(key, (comm, 0, 0))[1:]
        if u == u0 and s == s0:
            continue
        d = out.setdefault(kind(comm), {"user": 0.0, "sys": 0.0})
        d["user"] += (u - u0) * us
        d["sys"] += (s - s0) * us
    res = {k: {n: round(v, 1) for n, v in d.items()}
           for k, d in sorted(out.items(),
                              key=lambda x: -(x[1]["user"] + x[1]["sys"]))
           if d["user"] + d["sys"] >= 1}
    res["(irq, softirq)"] = {"irq": round((i1[0] - i0[0]) * us, 1),
                             "softirq": round((i1[1] - i0[1]) * us, 1)}
    return {"ios": ios, "us": res}


def syscalls(events):
    """Per completed request, each kind of task's syscalls by name."""
    ios = sum(1 for e in events if e["ev"] == "block_rq_complete")
    if not ios:
        return {}
    n = {}
    for e in events:
        if e["ev"] != "sys_enter":
            continue
        d = n.setdefault(kind(e["comm"]), {})
        name = SYSCALL_NAMES.get(e["nr"], str(e["nr"]))
        d[name] = d.get(name, 0) + 1
    out = {}
    for who, d in n.items():
        per = {k: round(v / ios, 2) for k, v in
               sorted(d.items(), key=lambda x: -x[1]) if v / ios >= 0.05}
        if per:
            out[who] = per
    return out


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


GRAPH_RE = re.compile(r"^\s*(\d+)\)\s+(?:[-+!#*@$]\s*)?(?:(\d+\.\d+) us)?\s*\|"
                      r"\s*(.*)$")


def graph(dev, funcs, qd=32, seconds=1, bs=4096, depth=3):
    """The kernel's time in @funcs and what they call, @depth deep
    (function_graph): per completed request, each function's calls and
    microseconds, outermost first.  The tracer's own cost is in them."""
    mount_tracefs()
    tfs("tracing_on", "0")
    tfs("trace", "")
    tfs("buffer_size_kb", "32768")
    tfs("set_graph_function", " ".join(funcs))
    tfs("max_graph_depth", str(depth))
    tfs("current_tracer", "function_graph")
    tfs("options/funcgraph-tail", "1")
    major, minor = dev_numbers(dev)
    tfs("events/block/block_rq_complete/filter",
        f"dev == {(major << 20) | minor}")
    tfs("events/block/block_rq_complete/enable", "1")
    try:
        fio = subprocess.Popen(fio_cmd(dev, qd, seconds, bs),
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        time.sleep(1)
        tfs("tracing_on", "1")
        time.sleep(seconds)
        tfs("tracing_on", "0")
        fio.wait(timeout=120)
        with open(os.path.join(TRACEFS, "trace")) as f:
            lines = f.read().splitlines()
    finally:
        tfs("tracing_on", "0")
        tfs("current_tracer", "nop")
        tfs("set_graph_function", "")
        tfs("max_graph_depth", "0")
        tfs("options/funcgraph-tail", "0")
        tfs("events/block/block_rq_complete/enable", "0")
        tfs("events/block/block_rq_complete/filter", "0")
        tfs("buffer_size_kb", "1408")
    ios = sum(1 for ln in lines if "block_rq_complete" in ln)
    calls, spent, order = {}, {}, []
    for ln in lines:
        m = GRAPH_RE.match(ln)
        if not m or m.group(2) is None:
            continue
        text = m.group(3).strip()
        # "name();" (a leaf) or "} /* name */" (the end of a caller)
        name = re.match(r"(?:\}\s*/\*\s*)?([\w.]+)", text)
        if not name:
            continue
        fn = name.group(1)
        depth_of = (len(m.group(3)) - len(m.group(3).lstrip())) // 2
        key = ("  " * depth_of) + fn
        if key not in calls:
            order.append(key)
        calls[key] = calls.get(key, 0) + 1
        spent[key] = spent.get(key, 0.0) + float(m.group(2))
    if not ios:
        return {"ios": 0}
    return {"ios": ios, "per_io": {k: {"calls": round(calls[k] / ios, 2),
                                       "us": round(spent[k] / ios, 2)}
                                   for k in order}}


PERF_ROW_RE = re.compile(r"^\s*(\d+\.\d+)%\s+(\S+)\s+\S+\s+\[[.kgu]\]\s+"
                         r"(\S.*?)\s*$")


def profile(dev, qd=32, seconds=2, bs=4096, top=40):
    """Where the CPUs' time goes while fio reads @dev (perf, cpu-clock,
    every CPU): per completed request, the microseconds of each function
    (its own, not its callees') and task, the heaviest @top.  The time
    of CPUs left idle is the idle task's."""
    if not shutil.which("perf"):
        raise RuntimeError("perf is not installed (linux-perf)")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        # perf takes seconds to start under TCG: fio runs until it is
        # done (its IOPS are the whole run's: a steady state)
        fio = subprocess.Popen(fio_cmd(dev, qd, 120, bs),
                               stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
        try:
            time.sleep(1)
            subprocess.run(["perf", "record", "-q", "-a", "-e", "cpu-clock",
                            "-F", "2000", "-o", data, "--", "sleep",
                            str(seconds)], check=True,
                           stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        finally:
            fio.send_signal(signal.SIGINT)
        out, _ = fio.communicate(timeout=120)
        # stopped by SIGINT, fio still reports (and exits 128)
        if "{" not in out:
            raise RuntimeError(f"fio exited {fio.returncode}, no report")
        job = json.loads(out[out.index("{"):])["jobs"][0]
        iops = job["read"]["iops"]
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio",
                              "--no-children", "--sort", "comm,dso,sym",
                              "--percent-limit", "0.01"],
                             capture_output=True, text=True, check=True)
    cpus = os.cpu_count()
    # every CPU's time, per request
    total_us = cpus * 1e6 / iops if iops else 0
    rows, tasks = [], {}
    for ln in rep.stdout.splitlines():
        m = PERF_ROW_RE.match(ln)
        if not m:
            continue
        pct, comm, sym = float(m.group(1)), m.group(2), m.group(3)
        us = pct / 100 * total_us
        rows.append({"comm": comm, "sym": sym, "us": round(us, 2)})
        # kworker/1:2-hybd_remap and kworker/1:1-hybd_remap: one kind
        kind = re.sub(r"\d+", "N", comm)
        tasks[kind] = tasks.get(kind, 0.0) + us
    return {"qd": qd, "bs": bs, "iops": round(iops), "cpus": cpus,
            "us_per_io": round(total_us, 1),
            "tasks": {k: round(v, 1) for k, v in
                      sorted(tasks.items(), key=lambda kv: -kv[1])},
            "top": rows[:top]}


def trace(dev, qd=1, seconds=1, bs=4096):
    events = parse(capture(dev, qd, seconds, bs))
    res = {"qd": qd, "bs": bs, "seconds": seconds, **counts(events),
           "cpu_share": occupancy(events)}
    if qd == 1:
        res["stages"] = stages(events)
    res["syscalls_per_io"] = syscalls(parse(capture(dev, qd, seconds, bs,
                                                    all_syscalls=True)))
    res["cpu_per_io"] = cpu_per_io(dev, qd, max(seconds, 3), bs)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dev")
    ap.add_argument("--qd", type=int, default=1)
    ap.add_argument("--bs", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=1)
    ap.add_argument("--json", help="write the result here too")
    ap.add_argument("--graph", metavar="FUNC,...",
                    help="instead: the kernel's time in these functions "
                         "and their callees (function_graph)")
    ap.add_argument("--depth", type=int, default=3)
    args = ap.parse_args()
    if args.graph:
        res = graph(args.dev, args.graph.split(","), args.qd, args.seconds,
                    args.bs, args.depth)
    else:
        res = trace(args.dev, args.qd, args.seconds, args.bs)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
