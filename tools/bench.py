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
               (warm: the setup reads the region before the rounds, which
               fills the cache; the label says so, and so does each row
               comparing the line with one without a cache)
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
  kloopm       the same over a file of its own written with the disk
               image's mix (below): the peer of dedup's mix lines
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
  dmcryptf     dmcrypt over encfull's file (every block written)
  dmcryptnwf   dmcryptnw over encfull's file
  encslow      examples/encrypt (AES-256-XTS, 512-byte sectors) over a
               sparse file, --no-fast-path, over a disk image's mix: a
               third never written (holes), a third duplicates of 16
               blocks, a third unique
  encslow1     the same with 1 queue
  encfast      the same with its fast path (encrypt.bpf.o): holes in the
               kernel, the rest decrypted by the slow path
  enccache     the same with --cache (encrypt-cache.bpf.o), warm
  encfull      encslow over fully written data (every block, all
               different): every read decrypted, as dm-crypt's are
  ddslow       examples/dedup over a store file, --no-fast-path, same mix
  ddslow1      the same with 1 queue
  ddslowt0     ddslow with --threads 0: no handler pool, the queue's
               worker runs every handler (what the pool's handoff costs)
  ddslow1t0    the same with 1 queue
  ddfast       the same with its fast path (dedup.bpf.o), warm: holes
               from its exact map, the rest from its cache
  ddmslow      examples/dedup, --no-fast-path, over mapped blocks only
               (every block written, all different: kloop's data)
  ddremap      the same with dedup-nocache.bpf.o: every read remapped to
               its chunk in the store, in the kernel (no cache to answer)
  ddbig        dedup + fast path (dedup.bpf.o), warm, over 128 MiB: 4
               times its cache
  kzram        the kernel's zram (modprobe zram num_devices=1, or a device
               of its own by hot_add where zram is loaded), lz4, disksize
               --ramdisk-size, over the zram mix (below)
  zramrs       examples/zram-rs (Rust, the hybd crate; the cargo target
               directory's release/zram-rs), lz4, as large, no fast path,
               over the same mix
  zramrsf      the same with its fast path (--fastpath zram.bpf.o): reads
               of zero blocks complete in the kernel; nothing is cached
               or warmed, everything else is its slow path's

crypt and dedup compare lines that read the same data: every block
written (encfull / dmcryptf, ddmslow / kloop), then the disk image's mix
(encslow / dmcrypt over one file, ddslow / kloopm); a row whose lines
read different data says so.

The zram lines' mix (devio.fill_zmix) is what a compressed disk meets,
every block written, the same bytes on each line: runs of 128 KiB in
turn of a tar of /usr/include (then /usr/share), built in memory in
sorted order, of seeded random data, and of zeros (written, so both
stores keep them as same-filled pages).  After the fill, each line's
store says what it made of it (zram's mm_stat, zram-rs's --stats): the
compression ratio (stored / compressed bytes) and the memory it uses per
stored GiB, which bench.json keeps (the line's setup, "compression") and
the report prints in the zram comparison's section.

--only and --skip take line keys and the names of the comparisons the
report prints (slowpath, fastpath, nbd, nbdex, loop, loopbdev, crypt, dedup,
ublkzc, zram): `make bench BENCH_ARGS='--only loop'` measures the loop
drivers alone, `--only ublkzc,nbdexc` every line with large I/O and the
zero-copy lines, `--only zram` zram-rs and the kernel's zram.  A line's
key comes before a comparison's name (`--only nbd` is the line nbd
alone).

Every line is measured at QD1 (psync, 4 KiB random reads: mean, p50, p99,
p99.9 completion latency) and QD32 (io_uring: IOPS); PAR_LINES also by two
submitters (2 fio jobs at QD16: IOPS), SEQ_LINES also reading 128 KiB
sequentially (QD8: MiB/s), WRITE_LINES also writing 4 KiB at random at
QD1, QD32W_LINES (the zram lines) at QD32 too (io_uring: IOPS), fio's
own data (random: stored whole by both zram lines) over the region
after the one read.  LARGE_LINES (the slow path's null, ramdisk,
hybd-loop and hybd-nbd lines, the BPF loop and ublk's null and loop,
with and without zero copy) are also read and written sequentially with
large requests, where copies dominate: 128 KiB and 1 MiB, each at QD8
and QD32 (MiB/s; hybd-nbd's export is read-only: reads only).
--samples rounds (default 5), round-robin, each round starting one line
further on, after an uncounted --warmup run each.  Every device exists
for the whole run, without an I/O scheduler.

Results: a table on stdout, every round in RESULTS/bench.json with the
guest's command line and load before and after.  On the host, tools/vm-run
then runs `bench.py --report` on it: the host's load and other guests go
into bench.json (with its CPUs' busy shares during the run and the
processes besides the guest that used them most: tools/bench/hostload.py),
the tables into bench.md, the chart into bench.png.

A target is met when the median of its per-round ratios meets it and so
do all rounds but at most one (4 of 5), missed when the median and as many
rounds miss it, and even when the rounds straddle it.

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

import sys

# the harness is the package beside this file, tools/bench/ (its
# __init__.py says which module holds what); this file only runs it, so
# that every caller keeps running tools/bench.py
from bench.main import main

if __name__ == "__main__":
    sys.exit(main())
