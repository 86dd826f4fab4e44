# SPDX-License-Identifier: GPL-2.0
"""The command line (its options, --only's and --skip's line keys) and
main(): set every line up, measure (or trace, or report), clean up."""

import argparse
import os
import platform
import re
import shutil
import signal
import tempfile
import time

from .catalogue import BS, GROUPS, LARGE_LINES, LINES, SEQ_MODES
from .common import REPO, BenchError, Stop, Unsupported, read_text, say
from .document import document, meta, save_document
from .hybd import ensure_hybd, hybd_stats, setup_hybd
from .peers import SETUP, SETUP_FIRST
from .report import print_report, report
from .runner import measure
from .setup import Context, Line, no_scheduler
from .tracing import trace_lines


def parse_size(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size '{text}' (e.g. 16M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def parse_lines(text):
    """Line keys and comparison names (GROUPS), comma-separated, in the
    table's order."""
    keys, bad = set(), []
    for k in (k for k in text.split(",") if k):
        if k in LINES:
            keys.add(k)
        elif k in GROUPS:
            keys.update(GROUPS[k])
        else:
            bad.append(k)
    if bad or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown line(s) {','.join(bad) or '(none)'}; choose from "
            f"{','.join(LINES)}, or the comparisons {','.join(GROUPS)}")
    return [k for k in LINES if k in keys]


def parse_args():
    ap = argparse.ArgumentParser(
        description="hybd latency comparison (see the module docstring)",
        epilog="lines: " + ", ".join(LINES) + "; comparisons (for "
               "--only, --skip): " + ", ".join(GROUPS))
    ap.add_argument("--samples", type=int, default=5,
                    help="interleaved rounds: fio runs per line and mode "
                         "(default 5)")
    ap.add_argument("--runtime", type=int, default=3,
                    help="seconds per fio run (default 3)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="seconds of QD1 per line before the first round, "
                         "not counted (default 1; 0: none)")
    ap.add_argument("--only", type=parse_lines, default=list(LINES),
                    help="comma-separated lines to run (default: all)")
    ap.add_argument("--skip", type=parse_lines, default=[],
                    help="comma-separated lines to leave out")
    ap.add_argument("--region", type=parse_size, default=16 << 20,
                    help="bytes at the start of each device that fio reads "
                         "(default 16M; the cache holds 32M)")
    ap.add_argument("--ramdisk-size", type=parse_size, default=32 << 20,
                    help="size of each hybd ramdisk (default 32M)")
    ap.add_argument("--results", default=os.environ.get(
                    "HYBD_RESULTS", str(REPO / "results")),
                    help="directory for bench.json "
                         "(default $HYBD_RESULTS, else results/)")
    ap.add_argument("--trace-raw", action="store_true",
                    help="with --trace: keep each capture's raw ftrace "
                         "text in RESULTS/traces/")
    ap.add_argument("--graph", metavar="FUNC,...",
                    help="with --trace: instead, the kernel's time in these "
                         "functions and their callees at QD32 "
                         "(tools/reqtrace.py --graph)")
    ap.add_argument("--profile", action="store_true",
                    help="measure nothing: profile each line's QD32 4 KiB "
                         "reads with perf (tools/reqtrace.py profile: each "
                         "function's and task's CPU time per request)")
    ap.add_argument("--profile-seq", action="store_true",
                    help="with --profile: 128 KiB reads at QD8 instead")
    ap.add_argument("--trace", action="store_true",
                    help="measure nothing: trace each line at QD1 and QD32 "
                         "(4 KiB) and QD1 128 KiB "
                         "(tools/reqtrace.py: the stages of a request, "
                         "context switches and wakeups per I/O, CPU shares) "
                         "into RESULTS/trace.json")
    ap.add_argument("--report", metavar="BENCH_JSON",
                    help="measure nothing: print the report of an earlier "
                         "run again, write its bench.md and draw its "
                         "bench.png (what tools/vm-run does on the host)")
    ap.add_argument("--docs", metavar="MD", action="append", default=[],
                    help="with --report: write the report's tables between "
                         "MD's '<!-- bench tables: begin -->' and '<!-- "
                         "bench tables: end -->' (docs/benchmarks.md); "
                         "given with --also, each run's tables in turn")
    ap.add_argument("--also", metavar="BENCH_JSON", action="append",
                    default=[],
                    help="with --report --docs: a later run of some lines "
                         "(--only), whose tables follow the main run's: "
                         "each table is one run's, never a mix of two "
                         "boots")
    ap.add_argument("--host-meta", metavar="JSON",
                    help="with --report: what the host recorded (its load, "
                         "other guests), merged into bench.json's meta")
    args = ap.parse_args()
    if args.report:
        return args
    if args.samples < 1 or args.runtime < 1 or args.warmup < 0:
        ap.error("--samples and --runtime must be >= 1, --warmup >= 0")
    if args.region % BS or args.region <= 0:
        ap.error("--region must be a positive multiple of 4K")
    if args.ramdisk_size < 2 * args.region:
        ap.error("--ramdisk-size must hold twice --region (the reads' region, "
                 "then the writes')")
    # a profile replaces the trace: it too measures nothing
    args.trace = args.trace or args.profile
    args.lines = [k for k in args.only if k not in args.skip]
    if not args.lines:
        ap.error("no line left to run")
    largest = max(bs for _, bs, _ in SEQ_MODES.values())
    if args.region < largest and set(args.lines) & set(LARGE_LINES):
        ap.error(f"--region must hold a {largest >> 10}K request (the "
                 f"large-I/O modes of {','.join(LARGE_LINES)})")
    # io_uring may be disabled by sysctl; libaio is the nearest stand-in
    args.qd32_engine = "io_uring"
    if read_text("/proc/sys/kernel/io_uring_disabled") not in (None, "0"):
        args.qd32_engine = "libaio"
    return args


def main():
    args = parse_args()
    if args.report:
        return report(args.report, args.host_meta, docs=args.docs,
                      also=args.also)
    if os.geteuid() != 0:
        say("must run as root (tools/vm-run bench runs it in a guest)")
        return 2
    if not shutil.which("fio"):
        say("fio is not installed (make guest-deps)")
        return 1
    os.makedirs(args.results, exist_ok=True)

    def on_term(signum, frame):
        raise Stop()
    signal.signal(signal.SIGTERM, on_term)

    lines = {k: Line(k) for k in args.lines}
    tmp = tempfile.mkdtemp(prefix="hybd-bench.")
    ctx = Context(args, tmp)
    status = 0
    t0 = time.monotonic()
    info = None
    say(f"{platform.release()}, {os.cpu_count()} CPUs; lines: "
        f"{','.join(lines)}; {args.samples} samples x {args.runtime}s, "
        f"region {args.region >> 20} MiB")
    try:
        hybd_missing = None
        if any(ln.hybd for ln in lines.values()):
            try:
                ensure_hybd(ctx)
            except BenchError as e:
                hybd_missing = str(e)
                say(f"no hybd line can run: {e}")
        # the lines that others reuse the file of come first (bloop and
        # uloop take kloop's, dmcrypt encslow's); the table keeps its order
        for line in sorted(lines.values(),
                           key=lambda ln: ln.key not in SETUP_FIRST):
            say(f"setting up {line.key}: {line.label}")
            try:
                if line.hybd and hybd_missing:
                    raise BenchError(hybd_missing)
                (SETUP.get(line.key) or setup_hybd)(line, ctx)
                line.info["scheduler"] = no_scheduler(line.dev)
                say(f"{line.key}: {line.dev}")
            except BenchError as e:
                line.dev, line.error = None, str(e)
                line.unsupported = isinstance(e, Unsupported)
                say(f"{line.key}: NOT MEASURED: {e}")
        info = meta(args)
        if args.trace:
            return trace_lines(lines, args, info)
        # every round is kept as it ends: a run stopped by the guest's
        # timeout (or by hand) keeps what it measured
        measure(lines, args, lambda: save_document(
            document(lines, args, info, t0), args))
        for line in lines.values():
            if line.hybd and line.dev:
                try:
                    line.info["final_stats"] = hybd_stats(line.dev)
                except BenchError as e:
                    say(f"{line.key}: {e}")
    except BenchError as e:
        say(f"FAILED: {e}")
        status = 1
    except (Stop, KeyboardInterrupt):
        say("interrupted: cleaning up")
        status = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if info and not args.trace:
            save_document(document(lines, args, info, t0), args)
        ctx.cleanup.run()
        shutil.rmtree(tmp, ignore_errors=True)

    doc = document(lines, args, info or meta(args), t0)
    print_report(doc)
    say(f"every sample: {save_document(doc, args)}")

    # a line this guest cannot have is not a failure
    if any(ln.error and not ln.unsupported for ln in lines.values()) or \
            ctx.cleanup.failed:
        status = status or 1
    say(f"done in {doc['elapsed_s']:.0f}s, status {status}")
    return status
