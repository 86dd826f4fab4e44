# SPDX-License-Identifier: GPL-2.0
"""--trace and --profile: where each line's time goes
(tools/reqtrace.py), into RESULTS/trace.json."""

import json
import os
import subprocess
import sys
from pathlib import Path

from .catalogue import BS, QD32, SEQ_BS, SEQ_QD
from .common import say


# --trace: (name, depth, block size) of each traced run
TRACES = (("qd1", 1, BS), ("qd32", QD32, BS), ("qd1_128k", 1, SEQ_BS))


def trace_lines(lines, args, info):
    """--trace: where each line's time goes (tools/reqtrace.py)."""
    import reqtrace

    if args.trace_raw:
        raw = Path(args.results) / "traces"
        raw.mkdir(exist_ok=True)
        os.environ["HYBD_TRACE_RAW"] = str(raw)
    out = {"meta": info, "lines": {}}
    status = 0
    if args.profile:
        qd, bs, what = ((SEQ_QD, SEQ_BS, f"QD{SEQ_QD} 128K")
                        if args.profile_seq else (QD32, BS, "QD32"))
        for line in lines.values():
            if not line.dev:
                continue
            try:
                res = reqtrace.profile(line.dev, qd, bs=bs)
            except (OSError, RuntimeError, ValueError,
                    subprocess.SubprocessError) as e:
                say(f"profile {line.key}: {e}")
                status = 1
                continue
            out["lines"][line.key] = {"label": line.label, "profile": res}
            print(f"\n{line.key}: {what}, {res['iops']} IOPS, "
                  f"{res['us_per_io']} us of {res['cpus']} CPUs per I/O; "
                  "per I/O, us:")
            print("  by task: " + ", ".join(f"{k} {v}" for k, v in
                                            res["tasks"].items() if v >= 0.1))
            for r in res["top"]:
                print(f"  {r['us']:>7}  {r['comm']:<18} {r['sym']}")
        say(f"profiles: {save_trace(out, args)}")
        return status
    if args.graph:
        for line in lines.values():
            if not line.dev:
                continue
            res = reqtrace.graph(line.dev, args.graph.split(","), QD32)
            out["lines"][line.key] = {"label": line.label, "graph": res}
            print(f"\n{line.key}: QD32, per I/O ({res['ios']} I/Os): "
                  "calls, us")
            for fn, v in res.get("per_io", {}).items():
                print(f"  {fn:<50} {v['calls']:>6} {v['us']:>9}")
        say(f"traces: {save_trace(out, args)}")
        return status
    for line in lines.values():
        if not line.dev:
            continue
        res = out["lines"][line.key] = {"label": line.label}
        for name, qd, bs in TRACES:
            try:
                res[name] = reqtrace.trace(line.dev, qd, bs=bs)
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                say(f"trace {line.key} {name}: {e}")
                res[name] = {"error": str(e)}
                status = 1
        save_trace(out, args)
    print_trace(out)
    say(f"traces: {save_trace(out, args)}")
    return status


def save_trace(doc, args):
    path = Path(args.results) / "trace.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def print_trace(doc, out=sys.stdout):
    """The traces as tables: QD1 stage medians; per-I/O counts."""
    import reqtrace

    keys = list(doc["lines"])
    for name, _, bs in TRACES:
        if name.startswith("qd1"):
            print(f"\n{name}: stages of {bs >> 10} KiB reads, median us "
                  "(n requests with the stage)", file=out)
            print(f"{'stage':<9}" + "".join(f"{k:>16}" for k in keys),
                  file=out)
            for stage in (*reqtrace.STAGES, "total"):
                row = f"{stage:<9}"
                for k in keys:
                    st = doc["lines"][k].get(name, {}).get(
                        "stages", {}).get(stage)
                    row += (f"{st['median_us']:>9.1f} ({st['n']:>4})" if st
                            else f"{'-':>16}")
                print(row, file=out)
    for name, _, _ in TRACES:
        print(f"\n{name}: per I/O, and each CPU's time by task", file=out)
        for k in keys:
            r = doc["lines"][k].get(name, {})
            if "error" in r or not r:
                print(f"  {k:<10} {r.get('error', 'not traced')}", file=out)
                continue
            shares = "; ".join(
                f"cpu{c}: " + ", ".join(f"{w} {100 * v:.0f}%"
                                        for w, v in d.items())
                for c, d in r["cpu_share"].items())
            print(f"  {k:<10} {r['ios']:>6} I/Os  switches "
                  f"{r['switches_per_io']}  wakeups {r['wakeups_per_io']} "
                  f"(cross-CPU {r['cross_cpu_wakeups_per_io']})  {shares}",
                  file=out)
            cpu = r.get("cpu_per_io", {}).get("us", {})
            if cpu:
                print(f"  {'':<10} CPU us per I/O, user+sys: " + ", ".join(
                    f"{w} {'+'.join(str(v) for v in d.values())}"
                    for w, d in cpu.items()), file=out)
            for who, d in r.get("syscalls_per_io", {}).items():
                print(f"  {'':<10} syscalls of {who}: " +
                      ", ".join(f"{n} {v}" for n, v in d.items()), file=out)
