# SPDX-License-Identifier: GPL-2.0
"""The round runner and sampler: fio's command for a line and mode, its
parsed result with hybd's counters around it, and the interleaved rounds
over every line."""

import json
import time

from .catalogue import BS, MODES, QD32, SEQ_MODES, writes
from .common import BenchError, last_lines, run, say
from .hybd import fast_share, hybd_stats, read_shares
from .report import fmt_pct


def fio_cmd(dev, mode, args, runtime=None, region=None, dist=None):
    seq = mode in SEQ_MODES
    region = region or args.region
    if seq:
        rw, bs, depth = SEQ_MODES[mode]
    else:
        rw, bs = ("randwrite" if writes(mode) else "randread"), BS
    # the writes go to the region after the one read, so that the data the
    # reads find (a disk image's mix, holes included) is the same each round
    offset = region if writes(mode) else 0
    cmd = ["fio", "--output-format=json", "--name=" + mode,
           "--filename=" + dev, "--rw=" + rw,
           f"--bs={bs}", "--direct=1",
           "--size=" + str(region), f"--offset={offset}", "--time_based",
           f"--runtime={runtime or args.runtime}", "--norandommap",
           "--randrepeat=0",
           "--invalidate=0", "--percentile_list=50:99:99.9",
           # a thread, no disk stats: under TCG a forked job and the
           # disk_util thread cost seconds of start-up per run
           "--thread", "--disk_util=0"]
    if dist and not seq:
        cmd.append("--random_distribution=" + dist)
    if mode in ("qd1", "qd1w"):
        cmd += ["--ioengine=psync", "--iodepth=1"]
    elif seq:
        cmd += ["--ioengine=" + args.qd32_engine, f"--iodepth={depth}"]
    elif mode == "par":
        # two submitters, one per vCPU in a 2-vCPU guest, QD16 each: the
        # load a default of one queue per CPU is for
        cmd += ["--ioengine=" + args.qd32_engine, f"--iodepth={QD32 // 2}",
                "--numjobs=2", "--group_reporting"]
    else:                       # qd32, qd32w
        cmd += ["--ioengine=" + args.qd32_engine, f"--iodepth={QD32}"]
    return cmd


def parse_fio(text, what="read"):
    """fio's JSON output -> the numbers we keep (latencies in us) of its
    reads, or of its writes."""
    start = text.find("{")          # fio may print warnings first
    try:
        job = json.loads(text[start:])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        raise BenchError(f"fio printed no JSON result: {text[:300]!r}") from None
    if job.get("error"):
        raise BenchError(f"fio job error {job['error']}")
    rd = job[what]
    if not rd.get("total_ios"):
        raise BenchError(f"fio completed no {what}s")
    clat, pct = rd["clat_ns"], rd["clat_ns"].get("percentile", {})

    def p(q):
        v = pct.get(f"{q:.6f}")
        return v / 1e3 if v is not None else None

    return {"mean_us": clat["mean"] / 1e3, "p50_us": p(50), "p99_us": p(99),
            "p999_us": p(99.9), "max_us": clat["max"] / 1e3,
            "iops": rd["iops"], "ios": rd["total_ios"],
            "mib_s": rd["bw_bytes"] / (1 << 20),
            "runtime_ms": rd["runtime"]}


def fio_run(line, mode, args, runtime=None):
    cmd = fio_cmd(line.dev, mode, args, runtime, line.region,
                  line.hybd.get("dist") if line.hybd else None)
    counters = bool(line.hybd and line.hybd.get("counters"))
    # the counters after a device's last run are those before its next one:
    # nothing else reads it in between
    before = line.stats or (hybd_stats(line.dev, counters) if line.hybd
                            else None)
    line.stats = None
    t0 = time.monotonic()
    res = run(cmd, timeout=args.runtime * 10 + 120, check=False)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        raise BenchError(f"fio exit {res.returncode}: {last_lines(res)}")
    out = parse_fio(res.stdout, "write" if writes(mode) else "read")
    out["wall_s"] = round(wall, 2)
    if line.hybd:
        line.stats = hybd_stats(line.dev, counters)
        out["fast"], out["slow"], out["fast_share"] = fast_share(
            before, line.stats)
        if counters:
            out["shares"] = read_shares(line.hybd, before, line.stats)
    return out


def measure(lines, args, save=None):
    """Every line, every mode, args.samples rounds, round-robin; each
    round starts one line further on, and every other round runs the lines
    in reverse, so that no line always runs right after (or before) the
    same neighbour, nor always before the line it is compared with.
    save() is called after each round."""
    live = [ln for ln in lines.values() if ln.dev]
    if args.warmup and live:
        # the first fio run of a boot is slow and noisy (cold caches)
        say(f"warm-up: {args.warmup}s of QD1 on each line, not counted")
        for line in live:
            try:
                fio_run(line, "qd1", args, runtime=args.warmup)
            except BenchError as e:
                say(f"warm-up {line.key}: {e}")
    n = 0
    total = args.samples * sum(len(ln.modes) for ln in live)
    for rnd in range(args.samples):
        first = rnd % len(live)
        order = live[first:] + live[:first]
        if rnd % 2:
            order.reverse()
        for mode in MODES:
            for line in order:
                if mode not in line.modes:
                    continue
                n += 1
                try:
                    r = fio_run(line, mode, args)
                except BenchError as e:
                    say(f"[{n:3}/{total}] round {rnd + 1} {mode:4} "
                        f"{line.key:<11} FAILED: {e}")
                    line.runs[mode].append({"round": rnd, "error": str(e)})
                    line.error = line.error or str(e)
                    continue
                r["round"] = rnd
                line.runs[mode].append(r)
                fast = (f"  fast {fmt_pct(r['fast_share'])}"
                        if line.hybd else "")
                if mode in ("qd1", "qd1w"):
                    what = (f"mean {r['mean_us']:8.1f} us  p99 "
                            f"{r['p99_us']:8.1f} us")
                elif mode in SEQ_MODES:
                    what = f"{r['mib_s']:8.1f} MiB/s"
                else:
                    what = f"{r['iops']:10.0f} IOPS"
                say(f"[{n:3}/{total}] round {rnd + 1} {mode:4} "
                    f"{line.key:<11} {what}{fast}  ({r['wall_s']:.1f}s)")
        if save:
            save()
