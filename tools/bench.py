#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0
"""bench.py - hybd against the drivers a user would pick instead, side by
side in one guest boot (make bench).

Runs fio over the same small region of several block devices, the lines
interleaved round-robin, and reports medians, per-round ranges and ratios:

  nullblk      null_blk, memory-backed: the in-kernel limit (nullb0; a
               second device, nullb1, is bloopb's and dmlinear's target)
  unull1       ublk's null target (rublk), 1 queue: the slow path's peer
  unull        the same with as many queues as hybd's default (one per CPU)
  unull1z      unull1 with zero copy (rublk --zero-copy: UBLK_F_AUTO_BUF_REG,
               Linux 6.16): no copy of the data between the request and
               the server, ublk at its best; not measured, and said why,
               where the kernel or rublk lacks it
  hnull1       hybd null server (examples/ramdisk --null), 1 queue: the
               slow path doing what ublk's null target does (nothing)
  hnull        the same with the library's default queues
  hnullq       the same with its workers on their queues' own CPUs
               (--queue-affinity: the library's placement before 1.8)
  noprog1      hybd ramdisk (copies its data), 1 queue, no program
  noprog       hybd ramdisk, default queues, no program: the slow path
  passthrough  hybd ramdisk + passthrough.bpf.o: what the hook costs
  poll         hybd ramdisk, no program, --poll-ns 50000 (bounded polling)
  cache        hybd ramdisk + cache.bpf.o, warm: 100% fast-path hits
  zero         hybd ramdisk + zero.bpf.o, warm, never-written blocks
  nbd          nbd + nbdkit (memory plugin, Unix socket)
  nbdk         the kernel nbd client (nbd-client, 2 connections) over TCP
               to nbdkit's pattern plugin (read-only, no holes: every
               block different) on loopback in a network namespace with
               netem adding 0.5 ms each way (the "nbdex" export; read-only
               so that no client's writes make another's cache stale)
  nbdexc       examples/nbd (hybd-nbd, 2 queues = 2 connections) on the
               same export, no fast path: cold reads, each over the network
  nbdexst      the same asking for structured replies (--structured-
               replies): a read's reply is then three pieces, not two
  nbdexw       the same with its fast path (nbd.bpf.o), warm: every read
               from its cache in the kernel
  nbdexz       the same over a 128 MiB region (4 times its cache), reads
               zipfian (fio zipf:1.1): the program's counters give the hit
               rate of a working set larger than the cache
  kloop        the kernel loop device over a file (direct I/O)
  uloop        ublk's loop target (rublk, 1 queue, direct I/O) over
               kloop's file
  uloopz       the same with zero copy (rublk --zero-copy): the file's
               reads and writes go straight to the request's pages
               (io_uring fixed buffers); as unull1z, where it can be had
  hloop1       examples/loop (hybd-loop) over the same kind of file: one
               io_uring per queue, O_DIRECT; 1 queue, as uloop
  hloop        the same with the library's default queues
  bloop        the BPF loop device: hybd-loop --remap + bpf/loop.bpf.o
               over kloop's file: every request remapped to it in the
               kernel (direct I/O on the request's pages)
  bloop1       the same with 1 queue, as the kernel loop has
  bloopp       bloop with --poll-ns 50000 (HYBD_DEV_F_REMAP_POLL): the
               kernel's remap workers poll up to 50 us for more before
               they sleep (spends CPU; hybd-loop's own workers, which
               serve nothing here, wait in poll() and do not poll)
  bloop1p      the same with 1 queue
  bloopb       the BPF loop over a block device: hybd-loop --remap
               /dev/nullb1 (null_blk, memory-backed, as nullblk's) +
               bpf/loop.bpf.o
  bloopbf      the same with a bio-based front (hybd-loop --front): map()
               clones each bio onto /dev/nullb1, without a request
  dmlinear     dm-linear over the same /dev/nullb1: the kernel's remap
  kloopx       the kernel loop (direct I/O) over a file on ext4 on
               /dev/nullb2 (null_blk, memory-backed): a file system that
               can say it would wait (IOCB_NOWAIT), unlike tmpfs
  bloopx       the BPF loop over that same file (its remaps start in
               the workers, as on tmpfs)
  dmcrypt      dm-crypt, plain mode with the same cipher and key, on a loop
               device over the encslow line's backing file (or a file of
               its own, written the same way, without that line)
  dmcryptnw    the same with --perf-no_read_workqueue and
               --perf-no_write_workqueue (no kcryptd workqueues), on a
               loop device of its own over the same file
  encslow      examples/encrypt (AES-256-XTS, 512-byte sectors) over a
               sparse file, --no-fast-path, over a disk image's mix: a
               third never written (holes), a third duplicates of 16
               blocks, a third unique
  encslow1     the same with 1 queue
  encfast      the same with its fast path (encrypt.bpf.o): holes in the
               kernel, the rest decrypted by the slow path
  enccache     the same with --cache (encrypt-cache.bpf.o), warm
  ddslow       examples/dedup over a store file, --no-fast-path, same mix
  ddslow1      the same with 1 queue
  ddslowt0     ddslow with --threads 0: no handler pool, the queue's
               worker runs every handler (what the pool's handoff costs)
  ddslow1t0    the same with 1 queue
  ddfast       the same with its fast path (dedup.bpf.o), warm: holes
               from its exact map, the rest from its cache
  ddmslow      examples/dedup, --no-fast-path, over mapped blocks only
               (every block written, all different)
  ddremap      the same with dedup-nocache.bpf.o: every read remapped to
               its chunk in the store, in the kernel (no cache to answer)

--only and --skip take line keys and the names of the comparisons the
report prints (slowpath, fastpath, nbd, nbdex, loop, loopbdev, crypt, dedup,
ublkzc): `make bench BENCH_ARGS='--only loop'` measures the loop drivers
alone, `--only ublkzc,nbdexc` every line with large I/O and the zero-copy
lines.

Every line is measured at QD1 (psync, 4 KiB random reads: mean, p50, p99,
p99.9 completion latency) and QD32 (io_uring: IOPS); PAR_LINES also by two
submitters (2 fio jobs at QD16: IOPS), SEQ_LINES also reading 128 KiB
sequentially (QD8: MiB/s), WRITE_LINES also writing 4 KiB at random at
QD1.  LARGE_LINES (the slow path's null, ramdisk, hybd-loop and hybd-nbd
lines, the BPF loop and ublk's null and loop, with and without zero copy)
are also read and written sequentially with large requests, where copies
dominate: 128 KiB and 1 MiB, each at QD8 and QD32 (MiB/s; hybd-nbd's
export is read-only: reads only).  --samples rounds (default 5),
round-robin, each round starting one line further on, after an uncounted
--warmup run each.  Every device exists for the whole run, without an I/O
scheduler.

Results: a table on stdout, every round in RESULTS/bench.json with the
guest's command line and load before and after.  On the host, tools/vm-run
then runs `bench.py --report` on it: the host's load and other guests go
into bench.json, the tables into bench.md, the chart into bench.png.

--trace measures nothing: it traces each selected line (tools/reqtrace.py:
the stages of one request, context switches, wakeups and cross-CPU wakeups
per I/O, and which task ran on which CPU) at QD1 and QD32 4 KiB and QD1
128 KiB, into RESULTS/trace.json: where the time goes, which the medians
above do not say (docs/slow-path.md).

--profile measures nothing either: perf samples every CPU while fio reads
each selected line at QD32 (4 KiB; with --profile-seq, 128 KiB reads at
QD8, random over the region, which a RAM-backed device serves as it does
sequential ones), and the report gives each task's and function's CPU
time per completed request (tools/reqtrace.py profile).  It needs perf
(Debian's linux-perf), which the project's deps do not install.

Run as root: tools/vm-run bench [ARGS], or directly on a >= 6.12 host.
Exit status: 0 when every selected line was measured (whether the targets
are met or not: this reports numbers, it does not judge the build), 1 when a
line failed, 2 on a usage error.  A line that this kernel or this rublk
cannot have (zero copy before Linux 6.16) is not measured, says why, and
does not count as failed.
"""

import argparse
import hashlib
import json
import mmap
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HYBDCTL = REPO / "tools" / "hybdctl" / "hybdctl"
RAMDISK = REPO / "examples" / "ramdisk" / "ramdisk"
LOOP = REPO / "examples" / "loop" / "hybd-loop"
DEDUP = REPO / "examples" / "dedup" / "dedup"
ENCRYPT = REPO / "examples" / "encrypt" / "encrypt"
NBDEX = REPO / "examples" / "nbd" / "hybd-nbd"
NBDEX_BPF = REPO / "examples" / "nbd" / "nbd.bpf.o"
BPF_DIR = REPO / "bpf"
CONTROL = "/dev/hybd-control"
KMOD = Path(os.environ.get("HYBD_KMOD", REPO / "kmod" / "hybd.ko"))
# ublk's server, built by `make bench-deps` (tools/bench-deps.sh) into the
# cache outside the tree
CACHE = Path(os.environ.get("HYBD_CACHE") or "/var/cache/hybd")
RUBLK = Path(os.environ.get("HYBD_RUBLK") or CACHE / "rublk" / "bin" / "rublk")

BS = 4096
QD32 = 32
NULLB_DEV = "/dev/nullb0"
NULLB_TARGET = "/dev/nullb1"
NULLB_EXT4 = "/dev/nullb2"
DM_LINEAR = "hybdbenchlin"
NBD_DEV = "/dev/nbd0"
# the nbdex lines: one nbdkit export over TCP in a network namespace with
# netem on its loopback; the kernel client on its own nbd device
NBDEX_NS = "hybdbenchnbd"
NBDEX_PORT = 10809
NBDEX_SIZE = 256 << 20
NBDEX_DELAY = "0.5ms"
NBDK_DEV = "/dev/nbd1"
DM_NAME = "hybdbench"
SEQ_BS = 128 << 10
SEQ_QD = 8

# key -> (label, hybd server setup or None).  The order is the table's.
#   prog: bpf/<prog>.bpf.o attached; data: region written before measuring;
#   poll_ns: the server's --poll-ns; fast: reads are expected on the fast
#   path; queues: the server's --queues (default: the library's, one per
#   CPU); server: the example that serves it (default the ramdisk)
LINES = {
    "nullblk": ("null_blk (memory)", None),
    "unull1": ("ublk null, 1 queue", None),
    "unull": ("ublk null, N queues", None),
    "unull1z": ("ublk null, 1 queue, zero copy", None),
    "hnull1": ("hybd null, 1 queue",
               dict(prog=None, data=False, poll_ns=0, fast=False,
                    server="null", queues=1)),
    "hnull": ("hybd null",
              dict(prog=None, data=False, poll_ns=0, fast=False,
                   server="null")),
    "hnullq": ("hybd null, workers on queue CPUs",
               dict(prog=None, data=False, poll_ns=0, fast=False,
                    server="null", flags=["--queue-affinity"])),
    "noprog1": ("hybd ramdisk, 1 queue",
                dict(prog=None, data=True, poll_ns=0, fast=False, queues=1)),
    "noprog": ("hybd ramdisk",
               dict(prog=None, data=True, poll_ns=0, fast=False)),
    "passthrough": ("hybd + passthrough",
                    dict(prog="passthrough", data=True, poll_ns=0, fast=False)),
    "poll": ("hybd, poll 50 us",
             dict(prog=None, data=True, poll_ns=50000, fast=False)),
    "cache": ("hybd + cache (hits)",
              dict(prog="cache", data=True, poll_ns=0, fast=True)),
    "zero": ("hybd + zero (hits)",
             dict(prog="zero", data=False, poll_ns=0, fast=True)),
    "nbd": ("nbd + nbdkit", None),
    "nbdk": ("kernel nbd client, TCP + 0.5 ms", None),
    "nbdexc": ("hybd-nbd, cold, TCP + 0.5 ms",
               dict(prog=None, data=False, poll_ns=0, fast=False,
                    server="nbd", queues=2)),
    "nbdexst": ("hybd-nbd, cold, structured replies",
                dict(prog=None, data=False, poll_ns=0, fast=False,
                     server="nbd", queues=2,
                     flags=["--structured-replies"])),
    "nbdexw": ("hybd-nbd + fast path, warm",
               dict(prog=None, data=False, poll_ns=0, fast=True,
                    server="nbd", queues=2)),
    "nbdexz": ("hybd-nbd + fast path, zipf over 128 MiB",
               dict(prog=None, data=False, poll_ns=0, fast=False,
                    server="nbd", queues=2, region=128 << 20,
                    dist="zipf:1.1",
                    counters=("cache_hits", "zero_hits", "misses"),
                    total="reads")),
    "kloop": ("kernel loop (file)", None),
    "uloop": ("ublk loop (file)", None),
    "uloopz": ("ublk loop (file), zero copy", None),
    "hloop1": ("hybd-loop, 1 queue (file)",
               dict(prog=None, data=True, poll_ns=0, fast=False,
                    server="loop", queues=1)),
    "hloop": ("hybd-loop (file)",
              dict(prog=None, data=True, poll_ns=0, fast=False,
                   server="loop")),
    "bloop": ("BPF loop (remap)",
              dict(prog="loop", data=True, poll_ns=0, fast=True,
                   server="bloop")),
    "bloop1": ("BPF loop (remap), 1 queue",
               dict(prog="loop", data=True, poll_ns=0, fast=True,
                    server="bloop", queues=1)),
    "bloopp": ("BPF loop (remap), poll 50 us",
               dict(prog="loop", data=True, poll_ns=50000, fast=True,
                    server="bloop")),
    "bloop1p": ("BPF loop (remap), 1 queue, poll 50 us",
                dict(prog="loop", data=True, poll_ns=50000, fast=True,
                     server="bloop", queues=1)),
    "bloopb": ("BPF loop on null_blk (remap)",
               dict(prog="loop", data=False, poll_ns=0, fast=True,
                    server="bloop", bdev=True)),
    "bloopbf": ("BPF loop on null_blk (remap), bio front",
                dict(prog="loop", data=False, poll_ns=0, fast=True,
                     server="bloop", bdev=True, flags=["--front"])),
    "dmlinear": ("dm-linear on null_blk", None),
    "kloopx": ("kernel loop (file on ext4)", None),
    "bloopx": ("BPF loop (remap, file on ext4)",
               dict(prog="loop", data=True, poll_ns=0, fast=True,
                    server="bloop", ext4=True)),
    "dmcrypt": ("dm-crypt (plain, loop)", None),
    "dmcryptnw": ("dm-crypt, no workqueues", None),
    "encslow": ("encrypt, no fast path",
                dict(prog=None, data="mix", poll_ns=0, fast=False,
                     server="encrypt", flags=["--no-fast-path"])),
    "encslow1": ("encrypt, no fast path, 1 queue",
                 dict(prog=None, data="mix", poll_ns=0, fast=False,
                      server="encrypt", flags=["--no-fast-path"],
                      queues=1)),
    "encfast": ("encrypt + fast path",
                dict(prog=None, data="mix", poll_ns=0, fast=False,
                     server="encrypt", flags=[])),
    "enccache": ("encrypt + cache",
                 dict(prog=None, data="mix", poll_ns=0, fast=True,
                      server="encrypt", flags=["--cache"])),
    "ddslow": ("dedup, no fast path",
               dict(prog=None, data="mix", poll_ns=0, fast=False,
                    server="dedup")),
    "ddslow1": ("dedup, no fast path, 1 queue",
                dict(prog=None, data="mix", poll_ns=0, fast=False,
                     server="dedup", queues=1)),
    "ddslowt0": ("dedup, no fast path, no pool",
                 dict(prog=None, data="mix", poll_ns=0, fast=False,
                      server="dedup", flags=["--threads", "0"])),
    "ddslow1t0": ("dedup, no fast path, 1 queue, no pool",
                  dict(prog=None, data="mix", poll_ns=0, fast=False,
                       server="dedup", queues=1, flags=["--threads", "0"])),
    "ddfast": ("dedup + fast path",
               dict(prog=None, data="mix", poll_ns=0, fast=True,
                    server="dedup")),
    "ddmslow": ("dedup mapped, slow",
                dict(prog=None, data=True, poll_ns=0, fast=False,
                     server="dedup")),
    "ddremap": ("dedup mapped, remap",
                dict(prog=None, data=True, poll_ns=0, fast=True,
                     server="dedup", bpf="dedup-nocache.bpf.o")),
    # reads over 4 times what dedup's cache holds (32 MiB): what is not
    # cached is remapped to the store; its program's counters give the
    # hit rates
    "ddbig": ("dedup + fast path, 128 MiB working set",
              dict(prog=None, data=True, poll_ns=0, fast=True,
                   server="dedup", region=128 << 20,
                   counters=("cache_hits", "remap_hits", "zero_hits",
                             "read_misses"), total="reads")),
}
# The large-I/O modes: sequential, O_DIRECT, fio's --rw, block size and
# depth; "seq" (128 KiB reads at QD8, SEQ_LINES) is older than the rest,
# which only LARGE_LINES are measured in.  Writes go to the region after
# the one read, as qd1w's do.
SEQ_MODES = {"seq": ("read", SEQ_BS, SEQ_QD),
             "seq32": ("read", SEQ_BS, QD32),
             "seqw": ("write", SEQ_BS, SEQ_QD),
             "seqw32": ("write", SEQ_BS, QD32),
             "seq1m": ("read", 1 << 20, SEQ_QD),
             "seq1m32": ("read", 1 << 20, QD32),
             "seqw1m": ("write", 1 << 20, SEQ_QD),
             "seqw1m32": ("write", 1 << 20, QD32)}
LARGE_MODES = tuple(m for m in SEQ_MODES if m != "seq")
MODES = ("qd1", "qd32", "par", "seq", "qd1w", *LARGE_MODES)
# the lines measured in LARGE_MODES too: each kind of slow path at the
# library's defaults (null, ramdisk, hybd-loop, hybd-nbd), the BPF loop,
# and ublk's null and loop at rublk's default (1 queue), with and without
# zero copy.  hybd's servers take requests of up to 128 KiB (--max-io, the
# library's default), rublk's of up to 512 KiB (its -b default): a 1 MiB
# read is 8 requests to the one, 2 to the other.  Each line costs 7 more
# fio runs a round; hybd-nbd, whose export is read-only, 3 and "seq".
LARGE_LINES = ("unull1", "unull1z", "hnull", "noprog", "nbdexc", "uloop",
               "uloopz", "hloop", "bloop")
# the lines of LARGE_LINES that are written too
LARGE_WRITE_LINES = tuple(k for k in LARGE_LINES if k != "nbdexc")
# the lines measured in "seq" (128 KiB sequential reads) too
SEQ_LINES = ("nullblk", "unull1", "unull", "unull1z", "hnull1", "hnull",
             "hnullq", "noprog1", "noprog", "nbdexc", "kloop", "uloop",
             "uloopz", "hloop1", "hloop", "bloop",
             "bloop1", "bloopp", "bloop1p", "bloopb", "bloopbf", "dmlinear",
             "kloopx",
             "bloopx", "dmcrypt",
             "dmcryptnw", "encslow", "encslow1", "encfast",
             "enccache", "ddslow", "ddslow1", "ddmslow", "ddremap")
# the lines measured in "par" (2 submitters: 2 fio jobs at QD16) too
PAR_LINES = ("nullblk", "unull1", "unull", "unull1z", "hnull1", "hnull",
             "hnullq", "noprog1", "noprog", "kloop", "uloop", "uloopz",
             "hloop1", "hloop", "bloop",
             "bloop1", "bloopp", "bloop1p", "bloopb", "bloopbf", "dmlinear",
             "kloopx",
             "bloopx", "dmcrypt",
             "dmcryptnw", "encslow", "encslow1", "ddslow",
             "ddslow1", "ddremap")
# the lines measured in "qd1w" (4 KiB random writes, QD1) too
WRITE_LINES = ("kloop", "uloop", "uloopz", "hloop1", "hloop", "bloop",
               "bloop1",
               "bloopb", "bloopbf",
               "dmlinear", "kloopx", "bloopx", "dmcrypt",
               "dmcryptnw", "encslow", "encslow1", "ddslow", "ddslow1")

# The comparisons the report prints (and --only takes by name): what a
# user would pick instead of each hybd line.  (name, [(line, reference)])
COMPARISONS = (
    ("slowpath", "the slow path against ublk's (the same work: none)",
     [("hnull1", "unull1"), ("hnull", "unull"), ("hnull", "unull1"),
      ("hnullq", "hnull"),
      ("noprog1", "hnull1"), ("noprog", "hnull"), ("poll", "noprog"),
      ("passthrough", "noprog")]),
    ("fastpath", "fast-path hits against null_blk",
     [("cache", "nullblk"), ("zero", "nullblk"), ("cache", "noprog")]),
    ("nbd", "the slow path against nbd + nbdkit",
     [("noprog", "nbd")]),
    ("nbdex", "examples/nbd against the kernel nbd client (same export, "
     "TCP + 0.5 ms each way)",
     [("nbdexc", "nbdk"), ("nbdexst", "nbdk"), ("nbdexst", "nbdexc"),
      ("nbdexw", "nbdk"), ("nbdexw", "nullblk"),
      ("nbdexz", "nbdexc")]),
    ("loop", "the loop drivers over one kind of file",
     [("uloop", "kloop"), ("hloop1", "uloop"), ("hloop", "uloop"),
      ("hloop", "kloop"), ("bloop", "kloop"), ("bloop1", "kloop"),
      ("bloopp", "kloop"), ("bloop1p", "kloop"), ("bloopp", "bloop")]),
    ("loopbdev", "the BPF loop against dm-linear on one block device",
     [("bloopb", "dmlinear"), ("bloopbf", "dmlinear"), ("bloopbf", "bloopb"),
      ("dmlinear", "nullblk")]),
    ("loopext4", "the BPF loop against the kernel loop on a file on ext4 "
     "(a file system that honours IOCB_NOWAIT)",
     [("bloopx", "kloopx"), ("kloopx", "kloop")]),
    ("crypt", "encrypt against dm-crypt (same cipher and key)",
     [("encslow", "dmcrypt"), ("encslow", "dmcryptnw"),
      ("encslow1", "dmcrypt"), ("dmcryptnw", "dmcrypt"),
      ("encfast", "dmcrypt"), ("enccache", "dmcrypt")]),
    ("dedup", "dedup against the kernel loop",
     [("ddslow", "kloop"), ("ddslow1", "kloop"), ("ddslowt0", "kloop"),
      ("ddslow1t0", "kloop"), ("ddfast", "kloop"),
      ("ddmslow", "kloop"),
      ("ddremap", "kloop"), ("ddremap", "ddmslow"), ("ddbig", "kloop"),
      ("ddbig", "ddremap")]),
    # ublk at its best: what zero copy gives ublk itself, then hybd's slow
    # path (null, ramdisk, hybd-loop) and the BPF loop against it.  The
    # ramdisk copies its data where ublk's null target has none to copy.
    # hybd-nbd has no ublk peer (its export is over TCP): it is in
    # LARGE_LINES, not here.
    ("ublkzc", "the slow path and the BPF loop against ublk with zero copy "
     "(UBLK_F_AUTO_BUF_REG)",
     [("unull1z", "unull1"), ("uloopz", "uloop"),
      ("hnull1", "unull1z"), ("hnull", "unull1z"), ("noprog", "unull1z"),
      ("hloop1", "uloopz"), ("hloop", "uloopz"), ("bloop", "uloopz")]),
)
GROUPS = {name: list(dict.fromkeys(k for pair in pairs for k in pair))
          for name, _, pairs in COMPARISONS}

# (what, line, reference, metric, limit): line/reference of the metric's
# median must be <= limit (metric qd1_iops: >= limit)
TARGETS = (
    ("fast-path hit QD1 mean within 1.25x of null_blk",
     "cache", "nullblk", "mean_us", 1.25),
    ("zero-block hit QD1 mean within 1.25x of null_blk",
     "zero", "nullblk", "mean_us", 1.25),
    ("fast path >= 2x the QD1 IOPS of no program",
     "cache", "noprog", "qd1_iops", 2.0),
    ("passthrough <= 5% more QD1 latency than no program",
     "passthrough", "noprog", "mean_us", 1.05),
    ("slow path QD1 mean <= half of nbd + nbdkit",
     "noprog", "nbd", "mean_us", 0.5),
    ("hybd-nbd cold QD1 mean <= 1.1x the kernel nbd client's",
     "nbdexc", "nbdk", "mean_us", 1.1),
    ("hybd-nbd cold QD32 IOPS >= the kernel nbd client's",
     "nbdexc", "nbdk", "qd32_iops", 1.0),
    ("hybd-nbd warm QD1 mean within 1.25x of null_blk",
     "nbdexw", "nullblk", "mean_us", 1.25),
    ("hybd null QD1 mean <= ublk null's, 1 queue each",
     "hnull1", "unull1", "mean_us", 1.0),
    ("hybd null QD32 IOPS >= ublk null's, 1 queue each",
     "hnull1", "unull1", "qd32_iops", 1.0),
    ("hybd null 2 x QD16 IOPS >= ublk null's, 1 queue each",
     "hnull1", "unull1", "par_iops", 1.0),
    ("hybd null 128K sequential >= ublk null's, 1 queue each",
     "hnull1", "unull1", "seq_mib_s", 1.0),
    ("hybd null QD1 mean <= ublk null's, N queues each",
     "hnull", "unull", "mean_us", 1.0),
    ("hybd null QD32 IOPS >= ublk null's, N queues each",
     "hnull", "unull", "qd32_iops", 1.0),
    ("hybd null 2 x QD16 IOPS >= ublk null's, N queues each",
     "hnull", "unull", "par_iops", 1.0),
    ("hybd null 128K sequential >= ublk null's, N queues each",
     "hnull", "unull", "seq_mib_s", 1.0),
    ("hybd null default QD1 mean <= ublk null default's",
     "hnull", "unull1", "mean_us", 1.0),
    ("hybd null default QD32 IOPS >= ublk null default's",
     "hnull", "unull1", "qd32_iops", 1.0),
    ("hybd null default 2 x QD16 IOPS >= ublk null default's",
     "hnull", "unull1", "par_iops", 1.0),
    ("hybd null default 128K sequential >= ublk null default's",
     "hnull", "unull1", "seq_mib_s", 1.0),
    ("ramdisk (copies) QD1 mean within 1.3x of the null server's",
     "noprog", "hnull", "mean_us", 1.3),
    ("BPF loop QD1 read mean <= kernel loop's",
     "bloop", "kloop", "mean_us", 1.0),
    ("BPF loop QD1 write mean <= kernel loop's",
     "bloop", "kloop", "w_mean_us", 1.0),
    ("BPF loop QD32 IOPS >= kernel loop's",
     "bloop", "kloop", "qd32_iops", 1.0),
    ("BPF loop 128K sequential >= kernel loop's",
     "bloop", "kloop", "seq_mib_s", 1.0),
    ("hybd-loop QD1 mean <= ublk loop's, 1 queue each",
     "hloop1", "uloop", "mean_us", 1.0),
    ("hybd-loop QD32 IOPS >= ublk loop's, 1 queue each",
     "hloop1", "uloop", "qd32_iops", 1.0),
    ("hybd-loop default QD1 mean <= ublk loop default's",
     "hloop", "uloop", "mean_us", 1.0),
    ("hybd-loop default QD32 IOPS >= ublk loop default's",
     "hloop", "uloop", "qd32_iops", 1.0),
    ("BPF loop 2 x QD16 IOPS >= kernel loop's",
     "bloop", "kloop", "par_iops", 1.0),
    ("BPF loop on a block device QD1 read mean <= dm-linear's",
     "bloopb", "dmlinear", "mean_us", 1.0),
    ("BPF loop on a block device QD32 IOPS >= dm-linear's",
     "bloopb", "dmlinear", "qd32_iops", 1.0),
    ("BPF loop with a bio front QD1 read mean <= dm-linear's",
     "bloopbf", "dmlinear", "mean_us", 1.0),
    ("BPF loop with a bio front QD32 IOPS >= dm-linear's",
     "bloopbf", "dmlinear", "qd32_iops", 1.0),
    ("encrypt QD1 mean <= 1.1x dm-crypt's",
     "encslow", "dmcrypt", "mean_us", 1.1),
    ("encrypt QD32 IOPS >= dm-crypt's",
     "encslow", "dmcrypt", "qd32_iops", 1.0),
    ("encrypt 128K sequential >= dm-crypt's",
     "encslow", "dmcrypt", "seq_mib_s", 1.0),
    ("encrypt QD1 write mean <= 1.1x dm-crypt's",
     "encslow", "dmcrypt", "w_mean_us", 1.1),
    ("encrypt QD1 mean <= 1.1x dm-crypt's without workqueues",
     "encslow", "dmcryptnw", "mean_us", 1.1),
    ("encrypt QD32 IOPS >= dm-crypt's without workqueues",
     "encslow", "dmcryptnw", "qd32_iops", 1.0),
    ("encrypt 128K sequential >= dm-crypt's without workqueues",
     "encslow", "dmcryptnw", "seq_mib_s", 1.0),
    ("encrypt QD1 write mean <= 1.1x dm-crypt's without workqueues",
     "encslow", "dmcryptnw", "w_mean_us", 1.1),
    ("dedup remapped reads QD1 mean <= 1.15x the kernel loop's",
     "ddremap", "kloop", "mean_us", 1.15),
    ("dedup remapped reads QD32 IOPS >= 0.9x the kernel loop's",
     "ddremap", "kloop", "qd32_iops", 0.9),
    ("dedup slow-path reads QD1 mean <= 2x the kernel loop's",
     "ddmslow", "kloop", "mean_us", 2.0),
    ("dedup slow-path reads QD32 IOPS >= 0.7x the kernel loop's",
     "ddmslow", "kloop", "qd32_iops", 0.7),
    ("dedup QD1 write mean <= 3x the kernel loop's",
     "ddslow", "kloop", "w_mean_us", 3.0),
    ("dedup remapped reads >= 3x slow path QD1 IOPS",
     "ddremap", "ddmslow", "qd1_iops", 3.0),
)
# metric -> (mode, fio key, higher is better)
METRICS = {"mean_us": ("qd1", "mean_us", False),
           "qd1_iops": ("qd1", "mean_us", True),
           "w_mean_us": ("qd1w", "mean_us", False),
           "qd32_iops": ("qd32", "iops", True),
           "par_iops": ("par", "iops", True),
           "seq_mib_s": ("seq", "mib_s", True),
           **{f"{m}_mib_s": (m, "mib_s", True) for m in LARGE_MODES}}


class BenchError(Exception):
    """A step failed; the message says which and why."""


class Unsupported(BenchError):
    """A line this guest cannot have (its kernel or rublk lacks a feature
    the line is about): not measured, with the reason, and not a failure
    of the run."""


class Stop(BaseException):
    """SIGTERM (e.g. the guest runner's timeout): clean up and exit."""


def say(msg):
    print(f"bench: {msg}", flush=True)


def writes(mode):
    """Whether fio writes in this mode (else it reads)."""
    return mode == "qd1w" or SEQ_MODES.get(mode, ("",))[0] == "write"


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


def run(cmd, timeout=60, check=True):
    """Run cmd (a list); returns the CompletedProcess (text output)."""
    cmd = [str(c) for c in cmd]
    try:
        res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(cmd)}: no answer after {timeout}s") from None
    except OSError as e:
        raise BenchError(f"{cmd[0]}: {e.strerror}") from None
    if check and res.returncode != 0:
        raise BenchError(f"{' '.join(cmd)}: exit {res.returncode}: "
                         f"{last_lines(res)}")
    return res


def last_lines(res, n=3):
    """The end of a command's output, on one line, for an error message."""
    text = res.stderr.strip() or res.stdout.strip()
    return " | ".join(ln.strip() for ln in text.splitlines()[-n:]
                      if ln.strip()) or "(no output)"


def wait_until(pred, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# ------------------------------------------------------------ direct I/O ---

def _direct_fd(dev, flags):
    try:
        return os.open(dev, flags | os.O_DIRECT)
    except OSError as e:
        raise BenchError(f"open {dev}: {e.strerror}") from None


def write_blocks(dev, size, block_at, chunk=1 << 20):
    """Write [0, size) with O_DIRECT, chunk bytes at a time: block_at(blk)
    gives each 4 KiB block's content, or None to leave it unwritten.
    Flushes at the end."""
    buf = mmap.mmap(-1, chunk)
    fd = _direct_fd(dev, os.O_WRONLY)
    try:
        for off in range(0, size, chunk):
            n = min(chunk, size - off)
            first = off // BS
            runs = []               # [start block, end block) to write
            for i in range(n // BS):
                data = block_at(first + i)
                if data is None:
                    continue
                buf[i * BS:(i + 1) * BS] = data
                if runs and runs[-1][1] == i:
                    runs[-1][1] = i + 1
                else:
                    runs.append([i, i + 1])
            for a, b in runs:
                want = (b - a) * BS
                if os.pwritev(fd, [memoryview(buf)[a * BS:b * BS]],
                              off + a * BS) != want:
                    raise BenchError(f"short write on {dev} at {off + a * BS}")
        os.fsync(fd)
    except OSError as e:
        raise BenchError(f"write {dev}: {e.strerror}") from None
    finally:
        os.close(fd)
        buf.close()


def tagged(seed, tag):
    """seed with its first 8 bytes replaced by tag + 1: never all zeros."""
    return (tag + 1).to_bytes(8, "little") + seed[8:]


def fill_region(dev, size):
    """Write non-zero data over [0, size), every block different, so that
    reads copy real data (and no 4 KiB block of it is all zeros)."""
    seed = os.urandom(BS)
    write_blocks(dev, size, lambda blk: tagged(seed, blk))


def fill_mix(dev, size):
    """A disk image's mix over [0, size): block i is never written (reads
    as zeros) when i % 3 == 0, one of 16 shared contents when i % 3 == 1,
    unique when i % 3 == 2."""
    seed = os.urandom(BS)

    def block_at(blk):
        if blk % 3 == 0:
            return None
        return tagged(seed, blk % 16 if blk % 3 == 1 else 1000 + blk)
    write_blocks(dev, size, block_at)


def read_pass(dev, size):
    """Read [0, size) sequentially in 4 KiB O_DIRECT reads (cache warm-up)."""
    buf = mmap.mmap(-1, BS)
    fd = _direct_fd(dev, os.O_RDONLY)
    try:
        for off in range(0, size, BS):
            if os.preadv(fd, [buf], off) != BS:
                raise BenchError(f"short read on {dev} at {off}")
    except OSError as e:
        raise BenchError(f"read {dev}: {e.strerror}") from None
    finally:
        os.close(fd)
        buf.close()


# ---------------------------------------------------------------- hybdctl ---

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


# ---------------------------------------------------------------- servers ---

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


# ----------------------------------------------------------- line setup ---

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


def setup_nullblk(line, ctx):
    ensure_nullblk(ctx)
    line.dev = NULLB_DEV
    line.info = {"modprobe": "null_blk " + " ".join(NULLB_PARAMS)}


def setup_dmlinear(line, ctx):
    ensure_nullblk(ctx)
    sectors = int(run(["blockdev", "--getsz", NULLB_TARGET]).stdout)
    table = f"0 {sectors} linear {NULLB_TARGET} 0"
    run(["dmsetup", "create", DM_LINEAR, "--table", table])
    ctx.cleanup.push(f"dmsetup remove {DM_LINEAR}", run,
                     ["dmsetup", "remove", DM_LINEAR])
    line.dev = os.path.realpath(f"/dev/mapper/{DM_LINEAR}")
    line.info = {"table": table}


def start_nbdkit(ctx, cmd, log, what):
    """Start nbdkit (cmd) with its output in log; stopped at cleanup
    (terminate, then kill), under the name what."""
    with open(log, "w") as f:
        server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f,
                                  stderr=subprocess.STDOUT)

    def stop_nbdkit():
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)

    ctx.cleanup.push(what, stop_nbdkit)
    return server


def nbd_connected():
    try:
        return int(Path("/sys/block/nbd0/size").read_text()) > 0
    except (OSError, ValueError):
        return False


def setup_nbd(line, ctx):
    for tool in ("nbdkit", "nbd-client"):
        if not shutil.which(tool):
            raise BenchError(f"{tool} is not installed (make guest-deps)")
    sock = os.path.join(ctx.tmp, "nbdkit.sock")
    # a Unix socket only: never a network address
    cmd = ["nbdkit", "--unix", sock, "--foreground", "--exit-with-parent",
           "memory", "256M"]
    log = os.path.join(ctx.tmp, "nbdkit.log")
    server = start_nbdkit(ctx, cmd, log, "stop nbdkit")
    try:
        wait_until(lambda: os.path.exists(sock) or server.poll() is not None,
                   30, "nbdkit's socket")
    except BenchError:
        raise BenchError("nbdkit did not create its socket in 30s") from None
    if server.poll() is not None:
        raise BenchError(f"nbdkit exited with {server.returncode}: "
                         f"{read_text(log)}")
    if not module_loaded("nbd"):
        run(["modprobe", "nbd"])
        ctx.cleanup.push("rmmod nbd", run, ["modprobe", "-r", "nbd"])
    wait_until(lambda: os.path.exists(NBD_DEV), 10, NBD_DEV)
    client = ["nbd-client", "-unix", sock, NBD_DEV, "-b", str(BS)]
    # seen once in a fresh guest: "Failed to setup device" on the first try
    for attempt in range(3):
        try:
            run(client)
            break
        except BenchError as e:
            if attempt == 2:
                raise
            klog = run(["dmesg"], check=False).stdout.splitlines()
            said = [ln for ln in klog if "nbd" in ln][-3:]
            say(f"nbd: {e}; kernel: {' | '.join(said) or '(nothing)'}; "
                "trying again")
            run(["nbd-client", "-d", NBD_DEV], check=False)
            time.sleep(1)
    ctx.cleanup.push("nbd-client -d", run, ["nbd-client", "-d", NBD_DEV])
    wait_until(nbd_connected, 30, f"{NBD_DEV} to connect")
    fill_region(NBD_DEV, ctx.args.region)
    line.dev = NBD_DEV
    line.info = {"server": " ".join(cmd), "client": " ".join(client)}


def ensure_nbdex(ctx):
    """The nbdex export: nbdkit's pattern plugin on 127.0.0.1:NBDEX_PORT in
    network namespace NBDEX_NS, whose loopback delays every packet by
    NBDEX_DELAY (so each way).  Returns its URI; set up once."""
    if ctx.nbdex_uri:
        return ctx.nbdex_uri
    for tool in ("nbdkit", "ip", "tc", "ss"):
        if not shutil.which(tool):
            raise BenchError(f"{tool} is not installed (make guest-deps)")
    run(["modprobe", "sch_netem"])
    run(["ip", "netns", "add", NBDEX_NS])
    ctx.cleanup.push(f"ip netns del {NBDEX_NS}", run,
                     ["ip", "netns", "del", NBDEX_NS])
    run(["ip", "-n", NBDEX_NS, "link", "set", "lo", "up"])
    run(["tc", "-n", NBDEX_NS, "qdisc", "add", "dev", "lo", "root", "netem",
         "delay", NBDEX_DELAY])
    cmd = ["ip", "netns", "exec", NBDEX_NS, "nbdkit", "--foreground",
           "--exit-with-parent", "-i", "127.0.0.1", "-p", str(NBDEX_PORT),
           "pattern", str(NBDEX_SIZE)]
    log = os.path.join(ctx.tmp, "nbdex-nbdkit.log")
    server = start_nbdkit(ctx, cmd, log, "stop the nbdex nbdkit")

    def listening():
        if server.poll() is not None:
            raise BenchError(f"nbdkit exited with {server.returncode}: "
                             f"{read_text(log)}")
        res = run(["ip", "netns", "exec", NBDEX_NS, "ss", "-Hltn",
                   f"sport = :{NBDEX_PORT}"], check=False)
        return str(NBDEX_PORT) in res.stdout

    wait_until(listening, 30, "the nbdex nbdkit to listen", interval=0.2)
    ctx.nbdex_uri = f"nbd://127.0.0.1:{NBDEX_PORT}/"
    return ctx.nbdex_uri


def nbdk_connected():
    try:
        return int(Path(f"/sys/block/{os.path.basename(NBDK_DEV)}/size")
                   .read_text()) > 0
    except (OSError, ValueError):
        return False


def setup_nbdk(line, ctx):
    """The kernel nbd client on the nbdex export: 2 connections, as
    hybd-nbd's 2 queues."""
    ensure_nbdex(ctx)
    if not shutil.which("nbd-client"):
        raise BenchError("nbd-client is not installed (make guest-deps)")
    if not module_loaded("nbd"):
        run(["modprobe", "nbd"])
        ctx.cleanup.push("rmmod nbd", run, ["modprobe", "-r", "nbd"])
    wait_until(lambda: os.path.exists(NBDK_DEV), 10, NBDK_DEV)
    client = ["ip", "netns", "exec", NBDEX_NS, "nbd-client", "127.0.0.1",
              str(NBDEX_PORT), NBDK_DEV, "-b", str(BS), "-C", "2",
              "-N", "default"]
    run(client)
    ctx.cleanup.push("nbd-client -d", run, ["nbd-client", "-d", NBDK_DEV])
    wait_until(nbdk_connected, 30, f"{NBDK_DEV} to connect")
    line.dev = NBDK_DEV
    line.info = {"client": " ".join(client), "delay": NBDEX_DELAY}


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


def setup_kloop(line, ctx):
    ensure_loop(ctx)
    if line.key == "kloopx":
        path = ext4_file(ctx)
    else:
        path = backing_file(ctx, "kloop.img")
        ctx.kloop_backing = path
    dev = run(["losetup", "--find", "--show", "--direct-io=on",
               path]).stdout.strip()
    ctx.cleanup.push(f"losetup -d {dev}", run, ["losetup", "-d", dev])
    dio = Path(f"/sys/block/{os.path.basename(dev)}/loop/dio")
    fill_region(dev, ctx.args.region)
    line.dev = dev
    line.info = {"backing": path, "dio": read_text(str(dio)).strip()}


def queue_args(spec):
    return ["--queues", str(spec["queues"])] if spec.get("queues") else []


def setup_hybd(line, ctx):
    spec = line.hybd
    line.region = spec.get("region")
    region = line.region or ctx.args.region
    # 4 KiB requests only: small per-tag buffers keep ring memory low with
    # one ramdisk per line
    args = ["--max-io", "128K", *queue_args(spec)]
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
        if line.key == "encslow":
            ctx.enc_backing = backing
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


def bench_key(ctx):
    """The key of the encrypt lines and dm-crypt: 64 random bytes."""
    path = os.path.join(ctx.tmp, "bench.key")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(64))
    return path


def setup_dmcrypt(line, ctx, name=DM_NAME, perf=()):
    if not shutil.which("cryptsetup"):
        raise BenchError("cryptsetup is not installed (make guest-deps)")
    backing = ctx.enc_backing
    fill = backing is None
    if fill:
        backing = backing_file(ctx, f"{line.key}.img")
    ensure_loop(ctx)
    # a loop device of its own, over the same file: a mapping holds its
    # device exclusively
    loop = run(["losetup", "--find", "--show", backing]).stdout.strip()
    ctx.cleanup.push(f"losetup -d {loop}", run, ["losetup", "-d", loop])
    cmd = ["cryptsetup", "open", "--type", "plain", "--cipher",
           "aes-xts-plain64", "--key-size", "512", "--key-file",
           bench_key(ctx), *perf, loop, name]
    run(cmd)
    ctx.cleanup.push(f"cryptsetup close {name}", run,
                     ["cryptsetup", "close", name])
    dev = os.path.realpath(f"/dev/mapper/{name}")
    if fill:
        fill_mix(dev, ctx.args.region)
    line.dev = dev
    line.info = {"setup": " ".join(cmd), "backing": backing, "loop": loop,
                 "shared_with_encslow": not fill}


def setup_dmcryptnw(line, ctx):
    # dm-crypt's own option for fast devices: en- and decrypt in the
    # submitter's and the completion's context, no kcryptd workqueues
    setup_dmcrypt(line, ctx, DM_NAME + "nw",
                  ["--perf-no_read_workqueue", "--perf-no_write_workqueue"])


# ublk's flags (include/uapi/linux/ublk_cmd.h), bit by bit, up to what
# 7.3 knows
UBLK_FLAGS = ("SUPPORT_ZERO_COPY", "URING_CMD_COMP_IN_TASK", "NEED_GET_DATA",
              "USER_RECOVERY", "USER_RECOVERY_REISSUE", "UNPRIVILEGED_DEV",
              "CMD_IOCTL_ENCODE", "USER_COPY", "ZONED",
              "USER_RECOVERY_FAIL_IO", "UPDATE_SIZE", "AUTO_BUF_REG",
              "QUIESCE", "PER_IO_DAEMON", "BUF_REG_OFF_DAEMON", "BATCH_IO",
              "INTEGRITY", "SAFE_STOP_DEV", "NO_AUTO_PART_SCAN", "SHMEM_ZC",
              "IO_DESC_SIZE")
# rublk's --zero-copy (its null and loop targets) asks for
# UBLK_F_SUPPORT_ZERO_COPY and UBLK_F_AUTO_BUF_REG (Linux 6.16: the driver
# registers each request's pages as a fixed buffer of the server's
# io_uring; the loop target reads and writes its file to and from them,
# the null target touches nothing).  A driver that lacks a flag drops it
# when it adds the device, without an error, and rublk then serves the
# device as it does without zero copy: hence the checks before and after
# the add.
#
# No batch-I/O line: rublk 0.2.15 has no option for UBLK_F_BATCH_IO (Linux
# 7.0), its targets serve one tag at a time (libublk's UblkQueue), and its
# `features` names no flag past BUF_REG_OFF_DAEMON.  libublk 0.4.7, which
# its Cargo.lock pins, has a transport for it (UblkBatchQueue) that no
# rublk target uses.  Whether the guest's driver has it is recorded all
# the same (bench.json: the ublk lines' setup, rublk, driver_feature_names).
UBLK_F_AUTO_BUF_REG = 1 << UBLK_FLAGS.index("AUTO_BUF_REG")


def ublk_flag_names(value):
    names = [UBLK_FLAGS[i] if i < len(UBLK_FLAGS) else f"bit{i}"
             for i in range(64) if value >> i & 1]
    return names


def ensure_ublk(ctx):
    """ublk_drv loaded and rublk installed (make bench-deps); what rublk
    and the driver say of themselves, once."""
    if not os.access(RUBLK, os.X_OK):
        raise BenchError(f"{RUBLK} is not installed: make bench-deps "
                         "(cargo install rublk into the bench cache)")
    if not os.path.exists("/dev/ublk-control"):
        run(["modprobe", "ublk_drv"])
        ctx.cleanup.push("rmmod ublk_drv", run, ["modprobe", "-r", "ublk_drv"])
        wait_until(lambda: os.path.exists("/dev/ublk-control"), 10,
                   "/dev/ublk-control")
    if ctx.rublk is None:
        features = run([RUBLK, "features"], check=False).stdout.strip()
        # "UBLK FEATURES 0x...": none before 6.5 (no UBLK_U_CMD_GET_FEATURES)
        m = re.search(r"UBLK FEATURES\s+(0x[0-9a-fA-F]+)", features)
        bits = int(m.group(1), 16) if m else None
        ctx.rublk = {
            "binary": str(RUBLK),
            "version": run([RUBLK, "--version"]).stdout.strip(),
            "driver_features": features,
            "driver_feature_bits": bits,
            "driver_feature_names": (ublk_flag_names(bits)
                                     if bits is not None else None)}
    return ctx.rublk


def check_zero_copy(ctx, target):
    """Unsupported unless rublk has --zero-copy for target and the driver
    UBLK_F_AUTO_BUF_REG, which it asks for."""
    info = ensure_ublk(ctx)
    usage = run([RUBLK, "add", target, "--help"], check=False)
    if "--zero-copy" not in usage.stdout:
        raise Unsupported(f"{info['version'] or RUBLK} has no --zero-copy "
                          f"for its {target} target (rublk 0.2.15 has it "
                          "for null and loop: make bench-deps)")
    bits = info["driver_feature_bits"]
    if bits is None or not bits & UBLK_F_AUTO_BUF_REG:
        raise Unsupported(
            f"ublk_drv of Linux {platform.release()} lacks "
            "UBLK_F_AUTO_BUF_REG (Linux 6.16), which rublk --zero-copy "
            "needs: the driver would drop the flag, and rublk serve the "
            "device without zero copy (" + ("driver features " + ", ".join(
                info["driver_feature_names"]) if bits is not None
                else "no UBLK_U_CMD_GET_FEATURES, Linux < 6.5") + ")")


def setup_rublk(line, ctx, target, queues, extra=(), zero_copy=False):
    """One rublk device (it daemonizes once the device is live); with
    zero_copy, rublk's --zero-copy, or Unsupported if it cannot be had."""
    info = ensure_ublk(ctx)
    if zero_copy:
        check_zero_copy(ctx, target)
        extra = [*extra, "--zero-copy"]
    dev_id = ctx.next_ublk
    ctx.next_ublk += 1
    cmd = [RUBLK, "add", target, "-n", str(dev_id), "-q", str(queues),
           *extra]
    # the delete is registered first: an add that fails half-way may have
    # made the device (and its daemon) all the same
    ctx.cleanup.push(f"rublk del -n {dev_id}", run,
                     [RUBLK, "del", "-n", str(dev_id)], 60, False)
    run(cmd, timeout=120)
    dev = f"/dev/ublkb{dev_id}"
    wait_until(lambda: os.path.exists(dev), 30, dev)
    listing = run([RUBLK, "list", "-n", str(dev_id)], check=False).stdout
    m = re.search(r"flags\s*:?\s*(0x[0-9a-fA-F]+)", listing)
    flags = int(m.group(1), 16) if m else None
    line.dev = dev
    line.info = {"server": " ".join(map(str, cmd)), "rublk": info,
                 "queues": queues, "list": listing.strip(),
                 "flags": flags,
                 "flag_names": ublk_flag_names(flags) if flags else None,
                 "zero_copy": zero_copy}
    if zero_copy and not (flags or 0) & UBLK_F_AUTO_BUF_REG:
        # the driver said it has the flag: this device should have it
        raise BenchError(f"{dev} came up without UBLK_F_AUTO_BUF_REG "
                         f"(rublk list: flags {flags and hex(flags)}): it "
                         "would not be zero copy")


def setup_unull1(line, ctx):
    setup_rublk(line, ctx, "null", 1, zero_copy=line.key == "unull1z")


def setup_unull(line, ctx):
    # as many queues as hybd's default (the library's: one per CPU)
    n = os.cpu_count() or 1
    line.label = f"ublk null, {n} queues"
    setup_rublk(line, ctx, "null", n)


def setup_uloop(line, ctx):
    # the kernel loop's own file when that line runs: the same file
    path = ctx.kloop_backing or backing_file(ctx, f"{line.key}.img")
    setup_rublk(line, ctx, "loop", 1, ["-f", path],
                zero_copy=line.key == "uloopz")
    if not ctx.kloop_backing:
        fill_region(line.dev, ctx.args.region)
    line.info["backing"] = path


SETUP_FIRST = ("kloop", "encslow")
SETUP = {"nullblk": setup_nullblk, "nbd": setup_nbd, "kloop": setup_kloop,
         "kloopx": setup_kloop,
         "dmcrypt": setup_dmcrypt, "dmcryptnw": setup_dmcryptnw,
         "dmlinear": setup_dmlinear,
         "unull1": setup_unull1, "unull1z": setup_unull1,
         "unull": setup_unull, "uloop": setup_uloop, "uloopz": setup_uloop,
         "nbdk": setup_nbdk}


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


# -------------------------------------------------------------------- fio ---

def fio_cmd(dev, mode, args, runtime=None, region=None, dist=None):
    seq = mode in SEQ_MODES
    region = region or args.region
    if seq:
        rw, bs, depth = SEQ_MODES[mode]
    else:
        rw, bs = ("randwrite" if mode == "qd1w" else "randread"), BS
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
    else:
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


# ----------------------------------------------------------- the summary ---
#
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


def evaluate_targets(doc, summary):
    out = []
    for what, key, ref, metric, limit in TARGETS:
        t = {"target": what, "line": key, "reference": ref, "metric": metric,
             "limit": limit, "verdict": "not run"}
        c = compare(doc, summary, key, ref, metric)
        if c:
            t["ratio"], t["round_range"] = c
            met = (c[0] >= limit if METRICS[metric][2] else c[0] <= limit)
            t["verdict"] = "met" if met else "not met"
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
    for key, e in lines.items():
        s = summary.get(key)
        if s is None:
            missing.append(f"{e['label']} ({key}): not measured: "
                           f"{e.get('error')}")
            continue
        cells = [fmt_stat(s[m], d) if m in ("mean_us", "qd32_iops",
                                             "par_iops", "seq_mib_s",
                                             "w_mean_us")
                 else (f"{s[m][0]:.{d}f}" if s[m] else "-")
                 for m, _, d in COLUMNS]
        rows.append([e["label"], key, *cells,
                     fmt_pct(s.get("fast_share")) if e.get("hybd") else ""])
    tables = [("lines", ["line", "--only", *(t for _, t, _ in COLUMNS),
                         "fast path"], rows,
               "medians of the rounds, (lowest–highest round) after each"
               + "".join(f"; {m}" for m in missing))]
    large = [[e["label"], key,
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
    hits = [[lines[key]["label"], key, mode,
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
        return [[f"{lines[key]['label']} / {lines[ref]['label']}",
                 *(fmt_ratio(compare(doc, summary, key, ref, m))
                   for m, _ in columns)]
                for key, ref in pairs
                if measured(summary.get(key)) and measured(summary.get(ref))]

    for name, what, pairs in COMPARISONS:
        crow = ratio_rows(pairs, RATIO_COLUMNS, lambda s: s is not None)
        if crow:
            tables.append((f"{name}: {what}",
                           ["line / reference",
                            *(t for _, t in RATIO_COLUMNS)], crow,
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
    return tables


def has_large(s):
    """Whether a line's summary has a large-I/O mode's median (not only
    "seq")."""
    return bool(s) and any(med(s, f"{m}_mib_s") for m in LARGE_MODES)


def print_report(doc, out=sys.stdout):
    summary = doc["summary"]
    cfg = doc["config"]
    print(file=out)
    print(f"4 KiB random reads over the first {cfg['region'] >> 20} MiB, "
          f"O_DIRECT; QD1: psync, QD32 and 2 jobs x QD16: "
          f"{cfg['qd32_engine']}; 128 KiB "
          f"sequential reads at QD{SEQ_QD}; {cfg['samples']} interleaved "
          f"rounds of {cfg['runtime_s']}s", file=out)
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
    print("\ntargets:", file=out)
    for t in doc["targets"]:
        if t["verdict"] == "not run":
            print(f"  {t['target']:<54} not run", file=out)
            continue
        cmp = ">=" if METRICS[t["metric"]][2] else "<="
        rr = t.get("round_range")
        spread = f", rounds {rr[0]:.2f}-{rr[1]:.2f}x" if rr else ""
        print(f"  {t['target']:<54} {t['ratio']:.2f}x {cmp} {t['limit']}x"
              f"{spread}: {t['verdict'].upper()}", file=out)
    print("  (QD1 IOPS = 1e6 / mean us.  Under TCG, differences below ~25% "
          "are noise: read\n   the per-round range before trusting a "
          "verdict near its limit.)", file=out)
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
           f"{host.get('after', {}).get('loadavg', '?')}.", ""]
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
    ax.set_xticklabels([doc["lines"][k]["label"] for k in keys], rotation=30,
                       ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def report(path, host_meta=None):
    """--report: on the host, after the guest's run: merge what the host
    saw (its load, other guests) into bench.json, print the report again,
    write bench.md and draw bench.png next to it."""
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
    title = (f"hybd bench: 4 KiB random read QD1, {doc['meta']['kernel']}, "
             f"{doc['meta'].get('accel') or 'accel ?'}, medians of "
             f"{doc['config']['samples']} rounds, {doc['meta'].get('git')}")
    png = path.with_suffix(".png")
    if plot(png, doc, title):
        say(f"chart: {png}")
    return 0


# ------------------------------------------------------------------- main ---

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


def read_text(path):
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


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


class Context:
    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.cleanup = Cleanup()
        self.enc_backing = None     # the encslow line's, for dmcrypt
        self.kloop_backing = None   # the kloop line's, for bloop, uloop
        self.ext4_file = None       # kloopx's and bloopx's (ext4_file)
        self.rublk = None           # rublk's version and features
        self.nullblk = False        # null_blk loaded (ensure_nullblk)
        self.next_ublk = 0          # the next ublk device's id
        self.nbdex_uri = None       # the nbdex export (ensure_nbdex)


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


def main():
    args = parse_args()
    if args.report:
        return report(args.report, args.host_meta)
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


if __name__ == "__main__":
    sys.exit(main())
