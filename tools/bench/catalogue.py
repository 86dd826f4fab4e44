# SPDX-License-Identifier: GPL-2.0
"""The catalogue: every line measured, the modes each is measured in, the
comparisons the report prints and the targets it checks (data only)."""


BS = 4096
QD32 = 32
SEQ_BS = 128 << 10
SEQ_QD = 8


# key -> (label, hybd server setup or None).  The order is the table's.
#   prog: bpf/<prog>.bpf.o attached; data: region written before measuring
#   (True: every block, all different; "mix": a disk image's mix, a third
#   never written; "zmix": the zram lines' mix, a tar of /usr, random
#   blocks and written zeros: devio.fill_*); poll_ns: the server's
#   --poll-ns; fast: reads are expected on the fast path (setup reads the
#   region twice before the rounds to check it); warm: that read pass
#   fills a cache or map the reads are then served from, so the line is
#   measured warm (its label says so, and so does a comparison with a
#   line that has no cache); queues: the server's --queues (default: the
#   library's, one per CPU); server: the example that serves it (default
#   the ramdisk); fastpath: zram-rs's --fastpath zram.bpf.o (the server
#   attaches it)
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
    "cache": ("hybd + cache, warm (hits)",
              dict(prog="cache", data=True, poll_ns=0, fast=True,
                   warm=True)),
    "zero": ("hybd + zero, warm (hits)",
             dict(prog="zero", data=False, poll_ns=0, fast=True,
                  warm=True)),
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
                    server="nbd", queues=2, warm=True)),
    "nbdexz": ("hybd-nbd + fast path, zipf over 128 MiB",
               dict(prog=None, data=False, poll_ns=0, fast=False,
                    server="nbd", queues=2, region=128 << 20,
                    dist="zipf:1.1",
                    counters=("cache_hits", "zero_hits", "misses"),
                    total="reads")),
    "kloop": ("kernel loop (file)", None),
    # the same over a file of its own written with the disk image's mix
    # (dedup's mix lines' data): a third holes, read as zeros
    "kloopm": ("kernel loop (file), mix", None),
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
    # the two over encfull's file (every block written, all different):
    # the like-for-like peers of encfull
    "dmcryptf": ("dm-crypt (plain, loop), all written", None),
    "dmcryptnwf": ("dm-crypt, no workqueues, all written", None),
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
    "enccache": ("encrypt + cache, warm",
                 dict(prog=None, data="mix", poll_ns=0, fast=True,
                      server="encrypt", flags=["--cache"], warm=True)),
    # encslow over fully written data (every block, all different): every
    # read decrypted, as dm-crypt's are (encslow skips a third, its holes)
    "encfull": ("encrypt, no fast path, all written",
                dict(prog=None, data=True, poll_ns=0, fast=False,
                     server="encrypt", flags=["--no-fast-path"])),
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
    "ddfast": ("dedup + fast path, warm",
               dict(prog=None, data="mix", poll_ns=0, fast=True,
                    server="dedup", warm=True)),
    "ddmslow": ("dedup mapped, slow",
                dict(prog=None, data=True, poll_ns=0, fast=False,
                     server="dedup")),
    "ddremap": ("dedup mapped, remap",
                dict(prog=None, data=True, poll_ns=0, fast=True,
                     server="dedup", bpf="dedup-nocache.bpf.o")),
    # reads over 4 times what dedup's cache holds (32 MiB): what is not
    # cached is remapped to the store; its program's counters give the
    # hit rates
    "ddbig": ("dedup + fast path, warm, 128 MiB working set",
              dict(prog=None, data=True, poll_ns=0, fast=True,
                   server="dedup", region=128 << 20, warm=True,
                   counters=("cache_hits", "remap_hits", "zero_hits",
                             "read_misses"), total="reads")),
    # a compressed RAM disk: the kernel's zram and examples/zram-rs, lz4
    # on both, as large as the ramdisks, over the same "zmix" data.  The
    # fast path completes the reads of zero blocks in the kernel, and
    # nothing else: no cache, nothing warmed (fast=False: a third of the
    # reads, not all, are expected there)
    "kzram": ("kernel zram, lz4", None),
    "zramrs": ("zram-rs, lz4, no fast path",
               dict(prog=None, data="zmix", poll_ns=0, fast=False,
                    server="zram")),
    "zramrsf": ("zram-rs, lz4 + fast path for zero blocks",
                dict(prog=None, data="zmix", poll_ns=0, fast=False,
                     server="zram", fastpath=True)),
    # the same two stores with zstd at its default level (3) on both
    "kzramz": ("kernel zram, zstd", None),
    "zramrsz": ("zram-rs, zstd, no fast path",
                dict(prog=None, data="zmix", poll_ns=0, fast=False,
                     server="zram", flags=["--algo", "zstd"])),
}
# What the peers' measured regions hold, as the hybd lines' "data" says it
# (True: every block written, all different; "mix": the disk image's mix;
# "zmix": the zram lines' mix; False: nothing to read, or never written)
PEER_DATA = {"nullblk": True, "unull1": False, "unull": False,
             "unull1z": False, "nbd": True, "nbdk": True, "kloop": True,
             "kloopm": "mix", "uloop": True, "uloopz": True,
             "dmlinear": True, "kloopx": True, "dmcrypt": "mix",
             "dmcryptnw": "mix", "dmcryptf": True, "dmcryptnwf": True,
             "kzram": "zmix", "kzramz": "zmix"}


def line_data(key):
    """What a line's measured region holds (True, "mix", "zmix", False),
    or None for a line this catalogue does not know."""
    if key not in LINES:
        return None
    spec = LINES[key][1]
    return spec["data"] if spec else PEER_DATA.get(key)


def is_warm(key):
    """Whether a line's cache is warmed before its rounds (its "warm")."""
    spec = LINES.get(key, (None, None))[1]
    return bool(spec and spec.get("warm"))


def label_of(key, label):
    """A line's label as the report prints it: the one bench.json recorded
    (unull's says its queues), with "warm" added where the catalogue says
    the line is measured warm and a run from before this rule did not."""
    if is_warm(key) and "warm" not in label:
        return LINES[key][0] if "warm" in LINES[key][0] else label + ", warm"
    return label


def pair_notes(key, ref):
    """What a comparison's row must say of its pair: a warm cache against
    a line without one, lines reading different data."""
    notes = []
    if is_warm(key) and not is_warm(ref):
        notes.append("warm cache vs none")
    names = {True: "all written", "mix": "mix", "zmix": "zram mix"}
    data = line_data(key), line_data(ref)
    if data[0] != data[1] and all(d in names for d in data):
        notes.append(" vs ".join(names[d] for d in data))
    return notes
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
# qd1w: 4 KiB random writes at QD1 (WRITE_LINES); qd32w: the same at QD32
# (QD32W_LINES), with io_uring: both to the region after the one read
MODES = ("qd1", "qd32", "par", "seq", "qd1w", "qd32w", *LARGE_MODES)
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
             "enccache", "ddslow", "ddslow1", "ddmslow", "ddremap",
             "kloopm", "dmcryptf", "dmcryptnwf", "encfull",
             "kzram", "zramrs", "zramrsf", "kzramz", "zramrsz")
# the lines measured in "par" (2 submitters: 2 fio jobs at QD16) too
PAR_LINES = ("nullblk", "unull1", "unull", "unull1z", "hnull1", "hnull",
             "hnullq", "noprog1", "noprog", "kloop", "uloop", "uloopz",
             "hloop1", "hloop", "bloop",
             "bloop1", "bloopp", "bloop1p", "bloopb", "bloopbf", "dmlinear",
             "kloopx",
             "bloopx", "dmcrypt",
             "dmcryptnw", "encslow", "encslow1", "ddslow",
             "ddslow1", "ddremap", "kloopm", "dmcryptf", "dmcryptnwf",
             "encfull")
# the lines measured in "qd1w" (4 KiB random writes, QD1) too
WRITE_LINES = ("kloop", "uloop", "uloopz", "hloop1", "hloop", "bloop",
               "bloop1",
               "bloopb", "bloopbf",
               "dmlinear", "kloopx", "bloopx", "dmcrypt",
               "dmcryptnw", "encslow", "encslow1", "ddslow", "ddslow1",
               "kzram", "zramrs", "zramrsf", "kzramz", "zramrsz")
# the lines measured in "qd32w" (4 KiB random writes, QD32) too: a
# compressed disk compresses every write, the kernel's zram in each
# submitter's context, zram-rs in its queues' workers: depth shows which
# keeps up
QD32W_LINES = ("kzram", "zramrs", "zramrsf", "kzramz", "zramrsz")

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
    # each pair on the same data: first every block written (encfull,
    # ddmslow, ddremap against peers over the same kind of data), then the
    # disk image's mix (encslow and dmcrypt over one file; dedup's mix
    # lines against kloopm)
    ("crypt", "encrypt against dm-crypt (same cipher and key)",
     [("encfull", "dmcryptf"), ("encfull", "dmcryptnwf"),
      ("encslow", "dmcrypt"), ("encslow", "dmcryptnw"),
      ("encslow1", "dmcrypt"), ("dmcryptnw", "dmcrypt"),
      ("encfast", "dmcrypt"), ("enccache", "dmcrypt")]),
    ("dedup", "dedup against the kernel loop",
     [("ddslow", "kloop"), ("ddslow1", "kloop"), ("ddslowt0", "kloop"),
      ("ddslow1t0", "kloop"), ("ddfast", "kloop"),
      ("ddmslow", "kloop"), ("ddslow", "kloopm"), ("ddslow1", "kloopm"),
      ("ddfast", "kloopm"), ("kloopm", "kloop"),
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
    # every pair over the same "zmix" data; the report adds what each
    # line's store made of it (ratio, memory per stored GiB:
    # report.compression_rows).  The kernel's line is kzram, as kloop is
    # the kernel loop's: --only takes a line's key before a comparison's
    # name, and "zram" is to select the comparison
    ("zram", "zram-rs against the kernel's zram (lz4, same data)",
     [("zramrs", "kzram"), ("zramrsf", "kzram"), ("zramrsf", "zramrs")]),
    ("zramz", "zram-rs against the kernel's zram (zstd, same data)",
     [("zramrsz", "kzramz"), ("zramrsz", "zramrs"), ("kzramz", "kzram")]),
)
GROUPS = {name: list(dict.fromkeys(k for pair in pairs for k in pair))
          for name, _, pairs in COMPARISONS}

# (what, line, reference, metric, limit): line/reference of the metric,
# each round against the same round of the reference, must be <= limit
# (a metric where higher is better: >= limit).  A target is met when the
# median of the per-round ratios meets it and so do all the rounds but at
# most one (with 5 or more rounds; every round with fewer): 4 of 5;
# missed when the median and as many rounds miss it; even otherwise (the
# rounds straddle the limit).  report.evaluate_targets judges.
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
    # encrypt's reads are judged over fully written data on both sides
    # (encfull, dmcryptf: every read decrypted); its writes go to the
    # region after the one read, the same for encslow and dm-crypt
    ("encrypt QD1 mean <= 1.1x dm-crypt's",
     "encfull", "dmcryptf", "mean_us", 1.1),
    ("encrypt QD32 IOPS >= dm-crypt's",
     "encfull", "dmcryptf", "qd32_iops", 1.0),
    ("encrypt 128K sequential >= dm-crypt's",
     "encfull", "dmcryptf", "seq_mib_s", 1.0),
    ("encrypt QD1 write mean <= 1.1x dm-crypt's",
     "encslow", "dmcrypt", "w_mean_us", 1.1),
    ("encrypt QD1 mean <= 1.1x dm-crypt's without workqueues",
     "encfull", "dmcryptnwf", "mean_us", 1.1),
    ("encrypt QD32 IOPS >= dm-crypt's without workqueues",
     "encfull", "dmcryptnwf", "qd32_iops", 1.0),
    ("encrypt 128K sequential >= dm-crypt's without workqueues",
     "encfull", "dmcryptnwf", "seq_mib_s", 1.0),
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
           "qd32w_iops": ("qd32w", "iops", True),
           "qd32_iops": ("qd32", "iops", True),
           "par_iops": ("par", "iops", True),
           "seq_mib_s": ("seq", "mib_s", True),
           **{f"{m}_mib_s": (m, "mib_s", True) for m in LARGE_MODES}}


def writes(mode):
    """Whether fio writes in this mode (else it reads)."""
    return (mode in ("qd1w", "qd32w")
            or SEQ_MODES.get(mode, ("",))[0] == "write")
