# SPDX-License-Identifier: GPL-2.0
"""The report: the summary of the rounds, the tables (stdout and
Markdown), the targets' verdicts and the chart, from bench.json alone
(--report on the host)."""

import json
import statistics
import sys
from pathlib import Path

from .catalogue import (COMPARISONS, GROUPS, LARGE_MODES, METRICS,
                        SEQ_MODES, SEQ_QD, TARGETS, label_of, pair_notes)
from .common import say


# Everything below reads the bench.json document only (doc["lines"][key]:
# label, hybd, error, runs{mode: [round results]}), so that the host can
# print the same report again and draw the chart from it (--report).


def fmt_pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def ok_runs(entry, mode):
    return [r for r in entry["runs"].get(mode, []) if "error" not in r]


def metric_value(metric, run):
    """One round's value of a metric (QD1 IOPS: 1e6 / its mean latency)."""
    key = METRICS[metric][1]
    v = run.get(key)
    if v is None:
        return None
    return 1e6 / v if metric == "qd1_iops" and v else v


def stat_of(entry, mode, key, metric=None):
    """(median, min, max) over the rounds of one mode, or None."""
    vals = [metric_value(metric, r) if metric else r.get(key)
            for r in ok_runs(entry, mode)]
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return statistics.median(vals), min(vals), max(vals)


def summarize(entry):
    """A line's medians and ranges, by metric (and QD1's percentiles)."""
    s = {}
    for metric, (mode, key, _) in METRICS.items():
        s[metric] = stat_of(entry, mode, key, metric)
    for key in ("p50_us", "p99_us", "p999_us"):
        s[key] = stat_of(entry, "qd1", key)
    s["rounds"] = {m: len(ok_runs(entry, m)) for m in entry["runs"]}
    if entry.get("hybd"):
        shares = [r["fast_share"] for m in ("qd1", "qd32")
                  for r in ok_runs(entry, m)
                  if r.get("fast_share") is not None]
        s["fast_share"] = statistics.median(shares) if shares else None
    for mode in ("qd1", "qd32"):
        runs = [r["shares"] for r in ok_runs(entry, mode) if r.get("shares")]
        if runs:
            s.setdefault("shares", {})[mode] = {
                c: statistics.median(r[c] for r in runs)
                for c in runs[0] if all(r.get(c) is not None for r in runs)}
    return s


def med(s, metric):
    st = s.get(metric) if s else None
    return st[0] if st else None


def ratio(a, b):
    return a / b if a is not None and b else None


def paired_ratios(doc, key, ref, metric):
    """The per-round ratios line/ref of one metric: each round of a line
    against the same round of its reference, measured minutes apart, so
    that what made a whole round slow cancels."""
    mode = METRICS[metric][0]
    lines = doc["lines"]
    if key not in lines or ref not in lines:
        return []
    theirs = {r["round"]: r for r in ok_runs(lines[ref], mode)}
    vals = []
    for r in ok_runs(lines[key], mode):
        other = theirs.get(r["round"])
        a = metric_value(metric, r)
        b = metric_value(metric, other) if other else None
        if a and b:
            vals.append(a / b)
    return vals


def compare(doc, summary, key, ref, metric):
    """(median of the per-round ratios, (lowest, highest)), or None."""
    vals = paired_ratios(doc, key, ref, metric)
    if not vals:
        return None
    return statistics.median(vals), (min(vals), max(vals))


def rounds_needed(n):
    """How many of n rounds must agree with the median for a verdict: all
    but one from 5 rounds on (4 of 5), all of fewer."""
    return n - 1 if n >= 5 else n


def verdict(ratios, limit, higher_better):
    """(verdict, rounds meeting the limit) of the per-round ratios: "met"
    when their median and rounds_needed() of them meet it, "missed" when
    the median and as many miss it, else "even" (the rounds straddle the
    limit: neither a win nor a loss)."""
    ok = [(r >= limit if higher_better else r <= limit) for r in ratios]
    n, k = len(ok), sum(ok)
    need = rounds_needed(n)
    med_ok = (statistics.median(ratios) >= limit if higher_better
              else statistics.median(ratios) <= limit)
    if med_ok and k >= need:
        return "met", k
    if not med_ok and n - k >= need:
        return "missed", k
    return "even", k


def evaluate_targets(doc, summary):
    out = []
    for what, key, ref, metric, limit in TARGETS:
        t = {"target": what, "line": key, "reference": ref, "metric": metric,
             "limit": limit, "verdict": "not run"}
        vals = paired_ratios(doc, key, ref, metric)
        if vals:
            t["ratio"] = statistics.median(vals)
            t["round_range"] = (min(vals), max(vals))
            t["verdict"], t["rounds_met"] = verdict(vals, limit,
                                                    METRICS[metric][2])
            t["rounds"] = len(vals)
        out.append(t)
    return out


def fmt_stat(st, digits=1):
    """'median (min-max)'."""
    if not st:
        return "-"
    return (f"{st[0]:.{digits}f} ({st[1]:.{digits}f}–{st[2]:.{digits}f})")


def fmt_ratio(c):
    if not c:
        return "-"
    r, rr = c
    return f"{r:.2f}x ({rr[0]:.2f}–{rr[1]:.2f})" if rr else f"{r:.2f}x"


# metric -> (column title, digits)
COLUMNS = (("mean_us", "QD1 read mean µs", 1), ("p50_us", "p50", 1),
           ("p99_us", "p99", 1), ("qd32_iops", "QD32 IOPS", 0),
           ("par_iops", "2×QD16 IOPS", 0),
           ("seq_mib_s", "128K seq MiB/s", 0),
           ("w_mean_us", "QD1 write µs", 1))
RATIO_COLUMNS = (("mean_us", "QD1 read mean"), ("qd32_iops", "QD32 IOPS"),
                 ("par_iops", "2×QD16 IOPS"),
                 ("seq_mib_s", "128K seq"), ("w_mean_us", "QD1 write mean"))
# the columns of the modes only a few lines are measured in (QD32W_LINES),
# after the others: a table has one where one of its lines or pairs was
# measured so (none in a bench.json from before them, whose report stays
# as it was)
OPTIONAL_COLUMNS = (("qd32w_iops", "QD32 write IOPS", 0),)
OPTIONAL_RATIO_COLUMNS = (("qd32w_iops", "QD32 write IOPS"),)


def large_title(mode):
    """'1M write QD32': a large-I/O mode's column."""
    rw, bs, depth = SEQ_MODES[mode]
    size = f"{bs >> 20}M" if bs >= 1 << 20 else f"{bs >> 10}K"
    return f"{size} {rw} QD{depth}"


# the large-I/O tables' columns: (metric, title), "seq" first; a report
# has them only where a line was measured in LARGE_MODES (not in a
# bench.json from before them)
LARGE_COLUMNS = tuple((f"{m}_mib_s", large_title(m)) for m in SEQ_MODES)


def report_rows(doc, summary):
    """The report as tables: [(title, header, rows, note)]."""
    lines = doc["lines"]
    rows, missing = [], []
    columns = COLUMNS + tuple(c for c in OPTIONAL_COLUMNS
                              if any(med(s, c[0]) for s in summary.values()))
    for key, e in lines.items():
        s = summary.get(key)
        if s is None:
            missing.append(f"{label_of(key, e['label'])} ({key}): not measured: "
                           f"{e.get('error')}")
            continue
        cells = [fmt_stat(s.get(m), d) if m in ("mean_us", "qd32_iops",
                                                 "par_iops", "seq_mib_s",
                                                 "w_mean_us", "qd32w_iops")
                 else (f"{s[m][0]:.{d}f}" if s[m] else "-")
                 for m, _, d in columns]
        rows.append([label_of(key, e["label"]), key, *cells,
                     fmt_pct(s.get("fast_share")) if e.get("hybd") else ""])
    tables = [("lines", ["line", "--only", *(t for _, t, _ in columns),
                         "fast path"], rows,
               "medians of the rounds, (lowest–highest round) after each"
               + "".join(f"; {m}" for m in missing))]
    large = [[label_of(key, e["label"]), key,
              *(fmt_stat(summary[key].get(m), 0) for m, _ in LARGE_COLUMNS)]
             for key, e in lines.items()
             if has_large(summary.get(key))]
    if large:
        tables.append(("large I/O: sequential MiB/s",
                       ["line", "--only", *(t for _, t in LARGE_COLUMNS)],
                       large,
                       "medians of the rounds, (lowest–highest round) after "
                       f"each; O_DIRECT, {doc['config']['qd32_engine']}; "
                       "the writes over the region after the one read"))
    hits = [[label_of(key, lines[key]["label"]), key, mode,
             *(f"{c} {fmt_pct(v)}" for c, v in shares.items())]
            for key, s in summary.items()
            for mode, shares in (s.get("shares") or {}).items()]
    if hits:
        width = max(len(r) for r in hits)
        tables.append(("reads by what served them (the program's counters)",
                       ["line", "--only", "mode",
                        *[""] * (width - 3)],
                       [r + [""] * (width - len(r)) for r in hits],
                       "median over the rounds of each counter's share of "
                       "the reads the program saw"))
    def ratio_rows(pairs, columns, measured):
        """One row a pair of @pairs whose lines @measured(summary entry)
        accepts: the ratios of @columns."""
        return [[pair_title(lines, key, ref),
                 *(fmt_ratio(compare(doc, summary, key, ref, m))
                   for m, _ in columns)]
                for key, ref in pairs
                if measured(summary.get(key)) and measured(summary.get(ref))]

    for name, what, pairs in COMPARISONS:
        rcols = RATIO_COLUMNS + tuple(
            c for c in OPTIONAL_RATIO_COLUMNS
            if any(compare(doc, summary, key, ref, c[0])
                   for key, ref in pairs))
        crow = ratio_rows(pairs, rcols, lambda s: s is not None)
        if crow:
            tables.append((f"{name}: {what}",
                           ["line / reference",
                            *(t for _, t in rcols)], crow,
                           "median of the per-round ratios (lowest–highest "
                           "round); latency: lower is better, IOPS and "
                           "MiB/s: higher"))
        # the same pairs with large requests, those measured so
        lrow = ratio_rows(pairs, LARGE_COLUMNS, has_large)
        if lrow:
            tables.append((f"{name}, large I/O: {what}",
                           ["line / reference",
                            *(t for _, t in LARGE_COLUMNS)], lrow,
                           "median of the per-round ratios of MiB/s "
                           "(lowest–highest round): higher is better"))
        # what each compressed disk's store made of its region, where the
        # comparison itself was measured
        zrow = crow and compression_rows(lines, GROUPS[name])
        if zrow:
            tables.append((f"{name}, compression: the region as written, "
                           "before the rounds",
                           ["line", "--only", "stored MiB", "compressed MiB",
                            "ratio", "memory MiB", "memory MiB per stored GiB",
                            "same-filled pages", "huge pages",
                            "memory counts"], zrow,
                           "one figure per line: the store's own after the "
                           "fill, from zram's mm_stat and zram-rs's --stats; "
                           "ratio: stored / compressed bytes (same-filled "
                           "pages are stored, in no compressed bytes); "
                           "memory: what the store says it uses, per GiB "
                           "stored: lower is better"))
    return tables


def compression_rows(lines, keys):
    """A row for each line of @keys whose setup recorded its store's
    compression (peers.compression: the zram lines), in the table's
    order."""
    def num(v, fmt, suffix=""):
        return "-" if v is None else format(v, fmt) + suffix

    mib = 1 << 20
    rows = []
    for key, e in lines.items():
        c = (e.get("setup") or {}).get("compression")
        if key not in keys or not c:
            continue
        rows.append([label_of(key, e["label"]), key,
                     num(c["orig_data_size"] / mib, ".1f"),
                     num(c["compr_data_size"] / mib, ".1f"),
                     num(c.get("ratio"), ".2f", "x"),
                     num(c["mem_used"] / mib, ".1f"),
                     num(c.get("mem_mib_per_gib"), ".0f"),
                     num(c.get("same_pages"), "d"),
                     num(c.get("huge_pages"), "d"),
                     c.get("mem_used_counts") or ""])
    return rows


def pair_title(lines, key, ref):
    """A comparison's row: "line / reference", and in brackets what the
    pair does not share (a warm cache, the data read)."""
    notes = pair_notes(key, ref)
    return (f"{label_of(key, lines[key]['label'])} / "
            f"{label_of(ref, lines[ref]['label'])}"
            + (f" [{'; '.join(notes)}]" if notes else ""))


def has_large(s):
    """Whether a line's summary has a large-I/O mode's median (not only
    "seq")."""
    return bool(s) and any(med(s, f"{m}_mib_s") for m in LARGE_MODES)


# the share of all the host's CPUs that anything but the run's own guest
# (vng, QEMU, virtiofsd, vm-run) may have used during a run before the
# report warns: under TCG the guest wants every core, and a neighbour
# slows some rounds and not others
HOST_BUSY_WARN_PCT = 10


def host_load(m):
    """What tools/vm-run's sampler (tools/bench/hostload.py) saw of the
    host's CPUs during the run, or None (a run without it)."""
    return ((m.get("host") or {}).get("during") or {}).get("load")


def host_line(load):
    """One line: the host's CPUs over the run, and who else used them."""
    top = ", ".join(f"{p['name']} {p['cpu_pct']:.1f}%"
                    + (f" (+{p['children_cpu_s']:.0f}s reaped children)"
                       if p.get("children_cpu_s") else "")
                    for p in load.get("top") or [])
    busy = "/".join(f"{c:.0f}%" for c in load.get("cpu_busy_pct") or []
                    if c is not None)
    return (f"host during the run ({load.get('duration_s', 0):.0f}s): "
            f"CPUs busy {busy or '?'}; of all CPUs, this guest "
            f"{load.get('guest_pct') or 0:.1f}%, other QEMU "
            f"{load.get('other_qemu_pct') or 0:.1f}%, the rest "
            f"{load.get('others_pct') or 0:.1f}%"
            + (f" (most: {top})" if top else ""))


def host_warnings(m):
    """The WARNING lines of what the host saw: another guest, before or
    during the run, or a busy host."""
    host = m.get("host") or {}
    out = []
    guests = sorted(set((host.get("before") or {}).get("other_qemu") or [])
                    | set((host.get("during") or {}).get("other_qemu") or []))
    if guests:
        out.append("another QEMU guest ran on the host before or during the "
                   f"run ({len(guests)}: {guests[0][:80]}"
                   f"{', ...' if len(guests) > 1 else ''}): every ratio "
                   "measured the neighbour too; measure again on a quiet "
                   "host")
    load = host_load(m)
    other = (load or {}).get("others_pct") or 0
    other += (load or {}).get("other_qemu_pct") or 0
    if other >= HOST_BUSY_WARN_PCT:
        out.append(f"the host was busy during the run: {other:.0f}% of its "
                   "CPUs went to other processes than this guest's "
                   f"(the limit is {HOST_BUSY_WARN_PCT}%): rounds were "
                   "slowed unevenly; measure again on a quiet host")
    return out


def print_report(doc, out=sys.stdout):
    summary = doc["summary"]
    cfg = doc["config"]
    print(file=out)
    print(f"4 KiB random reads over the first {cfg['region'] >> 20} MiB, "
          f"O_DIRECT; QD1: psync, QD32 and 2 jobs x QD16: "
          f"{cfg['qd32_engine']}; 128 KiB "
          f"sequential reads at QD{SEQ_QD}; {cfg['samples']} interleaved "
          f"rounds of {cfg['runtime_s']}s", file=out)
    load = host_load(doc["meta"])
    if load:
        print(host_line(load), file=out)
    for title, header, rows, note in report_rows(doc, summary):
        widths = [max(len(str(r[i])) for r in [header] + rows)
                  for i in range(len(header))]
        print(f"\n{title}", file=out)
        for r in [header] + rows:
            print("  " + "  ".join(f"{str(c):<{w}}" if i == 0 else
                                   f"{str(c):>{w}}"
                                   for i, (c, w) in enumerate(zip(r, widths))
                                   ).rstrip(), file=out)
        print(f"  ({note})", file=out)
    m = doc["meta"]
    # (None, None): a bench.json from before the clock was recorded
    clock = (m.get("clocksource_before"),
             m.get("clocksource_after", m.get("clocksource_before")))
    if clock not in ((None, None), ("tsc", "tsc")):
        print(f"\nWARNING: the guest's clock was {clock[0]}"
              f" at the start and {clock[1]} at the end: "
              "rounds after a switch from the TSC are slowed by every clock "
              "read (dmesg.txt says when); measure again", file=out)
    if "erms" in (m.get("cpu_copy_flags") or []) and m.get("accel") == "tcg":
        print("\nWARNING: the vCPU has ERMS: under TCG every copy to or from "
              "user space (a slow path's) costs ~4x what the kernel's own "
              "copies do (tools/vm-run boots -cpu max,-erms unless "
              "HYBD_VM_CPU says otherwise)", file=out)
    for w in host_warnings(m):
        print(f"\nWARNING: {w}", file=out)
    print("\ntargets:", file=out)
    for t in doc["targets"]:
        if t["verdict"] == "not run":
            print(f"  {t['target']:<54} not run", file=out)
            continue
        cmp = ">=" if METRICS[t["metric"]][2] else "<="
        rr = t.get("round_range")
        spread = f", rounds {rr[0]:.2f}-{rr[1]:.2f}x" if rr else ""
        if t.get("rounds"):
            spread += f", {t['rounds_met']}/{t['rounds']} meet"
        print(f"  {t['target']:<54} {t['ratio']:.2f}x {cmp} {t['limit']}x"
              f"{spread}: {t['verdict'].upper()}", file=out)
    print("  (median of the per-round ratios; MET: it and all rounds but at "
          "most one (4 of 5)\n   meet the limit, MISSED: they miss it, "
          "EVEN: the rounds straddle it.  QD1 IOPS =\n   1e6 / mean us.  "
          "Under TCG, differences below ~25% are noise.)", file=out)
    print(file=out)


def copy_note(m):
    """What the vCPU's string copies were (tools/vm-run, ERMS)."""
    flags = m.get("cpu_copy_flags")
    if flags is None:
        return ""  # a bench.json from before they were recorded
    return (", vCPU with " + " and ".join(f.upper() for f in flags)
            if flags else ", vCPU without ERMS or FSRM")


def markdown(doc):
    """The report as Markdown, for the docs: every table, and how it was
    measured."""
    m, cfg = doc["meta"], doc["config"]
    host = m.get("host") or {}
    # the kernel's own options, without virtme-ng's plumbing
    own = " ".join(w for w in (m.get("cmdline") or "").split()
                   if not w.startswith(("virtme", "init=", "console=",
                                        "earlyprintk=", "nr_open=")))
    out = [f"Measured with `make bench` on {m.get('git') or '?'}, "
           f"{m.get('date', '?')}: {m.get('kernel')}, {m.get('cpus')} vCPUs, "
           f"{m.get('accel') or '?'}{copy_note(m)}; guest kernel options "
           f"(besides virtme-ng's) `{own}`; "
           f"{cfg['samples']} interleaved rounds of {cfg['runtime_s']} s; "
           f"host load before/after "
           f"{host.get('before', {}).get('loadavg', '?')} / "
           f"{host.get('after', {}).get('loadavg', '?')}"
           + (f"; {host_line(host_load(m))}" if host_load(m) else "")
           + ".", ""]
    for w in host_warnings(m):
        out += [f"**WARNING**: {w}.", ""]
    for title, header, rows, note in report_rows(doc, doc["summary"]):
        out += [f"**{title}** ({note})", "",
                "| " + " | ".join(header) + " |",
                "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
        out.append("")
    return "\n".join(out)


def plot(path, doc, title):
    """A bar chart of QD1 p50 and p99 per line, log scale (on the host:
    matplotlib's first run in each guest boot cost minutes)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("python3-matplotlib is not installed: no chart "
            "(the numbers are in bench.json)")
        return False
    summary = doc["summary"]
    keys = [k for k in doc["lines"] if med(summary.get(k), "p50_us")]
    if not keys:
        return False
    x = range(len(keys))
    w = 0.38
    fig, ax = plt.subplots(figsize=(0.9 * len(keys) + 2, 4.8))
    for off, metric, name in ((-w / 2, "p50_us", "p50"),
                              (w / 2, "p99_us", "p99")):
        vals = [med(summary[k], metric) or 0 for k in keys]
        bars = ax.bar([i + off for i in x], vals, w, label=name)
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in vals], fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("QD1 completion latency (us, log scale)")
    ax.set_xticks(list(x))
    ax.set_xticklabels([label_of(k, doc["lines"][k]["label"]) for k in keys],
                       rotation=30,
                       ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


BEGIN, END = "<!-- bench tables: begin -->", "<!-- bench tables: end -->"


def rescored(path):
    """A bench.json, its summary and targets by this version's rules."""
    doc = json.loads(Path(path).read_text())
    doc["summary"] = {k: summarize(e) for k, e in doc["lines"].items()
                      if ok_runs(e, "qd1")}
    doc["targets"] = evaluate_targets(doc, doc["summary"])
    return doc


def write_docs(md_path, docs):
    """Replace what lies between MD's markers with each run's tables, the
    first run's, then each later one's under its own heading: a table is
    always one boot's rounds."""
    md_path = Path(md_path)
    text = md_path.read_text()
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        raise SystemExit(f"{md_path}: no '{BEGIN}' ... '{END}' markers")
    parts = [markdown(docs[0])]
    for n, d in enumerate(docs[1:], 1):
        lines = ", ".join(f"`{k}`" for k in d["lines"])
        # distinct headings, so that each has its own anchor
        nth = f", {n}" if n > 1 else ""
        parts.append(f"### A later run of some lines (`--only`){nth}\n\n"
                     f"Lines {lines}, measured in a boot of their own: "
                     "each table below holds this run's rounds alone, and "
                     "a ratio is never taken across two runs.\n\n"
                     + markdown(d))
    body = "\n\n".join(parts)
    md_path.write_text(text[:a + len(BEGIN)] + "\n\n" + body + "\n" +
                       text[b:])
    say(f"tables written into {md_path}")


def report(path, host_meta=None, docs=(), also=()):
    """--report: on the host, after the guest's run: merge what the host
    saw (its load, other guests) into bench.json, print the report again,
    write bench.md and draw bench.png next to it; with docs, the tables
    into those files' markers (with also: later runs' after them)."""
    path = Path(path)
    doc = json.loads(path.read_text())
    # from the rounds, by this version's rules (a run of an older one may
    # lack a mode or a metric)
    doc["summary"] = {k: summarize(e) for k, e in doc["lines"].items()
                      if ok_runs(e, "qd1")}
    doc["targets"] = evaluate_targets(doc, doc["summary"])
    if host_meta:
        try:
            doc["meta"]["host"] = json.loads(Path(host_meta).read_text())
        except (OSError, ValueError) as e:
            say(f"{host_meta}: {e}")
        path.write_text(json.dumps(doc, indent=1) + "\n")
    print_report(doc)
    md = path.with_suffix(".md")
    md.write_text(markdown(doc) + "\n")
    say(f"Markdown tables: {md}")
    for target in docs:
        write_docs(target, [doc] + [rescored(p) for p in also])
    title = (f"hybd bench: 4 KiB random read QD1, {doc['meta']['kernel']}, "
             f"{doc['meta'].get('accel') or 'accel ?'}, medians of "
             f"{doc['config']['samples']} rounds, {doc['meta'].get('git')}")
    png = path.with_suffix(".png")
    if plot(png, doc, title):
        say(f"chart: {png}")
    return 0
