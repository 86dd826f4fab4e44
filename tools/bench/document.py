# SPDX-License-Identifier: GPL-2.0
"""bench.json: what the guest records of a run (the kernel, the vCPU, the
clock, the build) and the document of every round and its summary."""

import hashlib
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

from .catalogue import BS, MODES, QD32, SEQ_BS, SEQ_QD
from .common import REPO, BenchError, read_text, run
from .hybd import KMOD
from .report import evaluate_targets, ok_runs, summarize
from .runner import fio_cmd


def guest_accel(results):
    """TCG or KVM, from the guest.conf tools/vm-run leaves next to us."""
    try:
        text = (Path(results) / "guest.conf").read_text()
    except OSError:
        return None
    m = re.search(r"^ACCEL='?(\w+)'?$", text, re.M)
    return m.group(1) if m else None


# the clock fio and the stats read: a switch away from the TSC (the
# watchdog's, under load) makes every clock read slow from then on
CLOCKSOURCE = "/sys/devices/system/clocksource/clocksource0/current_clocksource"


def meta(args):
    fio = run(["fio", "--version"], check=False).stdout.strip()
    cpu, flags = None, None
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name") and cpu is None:
                cpu = ln.split(":", 1)[1].strip()
            if ln.startswith("flags") and flags is None:
                flags = ln.split(":", 1)[1].split()
    except OSError:
        pass
    mem = None
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) >> 10
    except (OSError, ValueError, IndexError):
        pass
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "kernel": platform.release(), "cpus": os.cpu_count(),
            "cpu_model": cpu, "mem_mib": mem,
            # the string copies the vCPU has (tools/vm-run: not ERMS)
            "cpu_copy_flags": [f for f in ("erms", "fsrm")
                               if flags and f in flags],
            "accel": guest_accel(args.results), "fio": fio,
            "git": git_version(), "hybd_ko_sha256": file_sha256(KMOD),
            "argv": sys.argv[1:], "cmdline": read_text("/proc/cmdline"),
            "loadavg_before": read_text("/proc/loadavg"),
            "clocksource_before": read_text(CLOCKSOURCE)}


def git_version():
    """The repository's commit, with -dirty if the tree has changes."""
    try:
        head = run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"])
        dirty = run(["git", "-C", REPO, "status", "--porcelain",
                     "--untracked-files=no"]).stdout.strip()
    except BenchError:
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def file_sha256(path):
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def document(lines, args, info, t0):
    """bench.json: how it ran, every round of every line, the summary."""
    info = dict(info, loadavg_after=read_text("/proc/loadavg"),
                clocksource_after=read_text(CLOCKSOURCE))
    doc = {"version": 2, "meta": info,
           "config": {"bs": BS, "region": args.region,
                      "samples": args.samples, "runtime_s": args.runtime,
                      "qd32_engine": args.qd32_engine, "qd32": QD32,
                      "seq_bs": SEQ_BS, "seq_qd": SEQ_QD,
                      "ramdisk_size": args.ramdisk_size,
                      "fio": {m: fio_cmd("DEV", m, args) for m in MODES}},
           "lines": {k: {"label": ln.label, "hybd": bool(ln.hybd),
                         "device": ln.dev, "setup": ln.info,
                         "error": ln.error,
                         "unsupported": ln.unsupported, "runs": ln.runs}
                     for k, ln in lines.items()},
           "elapsed_s": round(time.monotonic() - t0, 1)}
    doc["summary"] = {k: summarize(e) for k, e in doc["lines"].items()
                      if ok_runs(e, "qd1")}
    doc["targets"] = evaluate_targets(doc, doc["summary"])
    return doc


def save_document(doc, args):
    out = Path(args.results) / "bench.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    return out
