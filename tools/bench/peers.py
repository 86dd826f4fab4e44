# SPDX-License-Identifier: GPL-2.0
"""The setup of the drivers hybd is measured against: null_blk, dm-linear,
nbd (nbdkit; the kernel client on the nbdex export), the kernel loop,
dm-crypt, ublk (rublk) and zram; SETUP maps their lines to it."""

import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path

from .catalogue import BS
from .common import BenchError, Unsupported, read_text, run, say, wait_until
from .devio import fill_mix, fill_region, fill_zmix
from .setup import (NULLB_DEV, NULLB_PARAMS, NULLB_TARGET, backing_file,
                    bench_key, ensure_loop, ensure_nullblk, ext4_file,
                    module_loaded)


# ublk's server, built by `make bench-deps` (tools/bench-deps.sh) into the
# cache outside the tree
CACHE = Path(os.environ.get("HYBD_CACHE") or "/var/cache/hybd")
RUBLK = Path(os.environ.get("HYBD_RUBLK") or CACHE / "rublk" / "bin" / "rublk")


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


def setup_kloop(line, ctx):
    """kloop (the file the other loop lines share), kloopx (on ext4) and
    kloopm (a file of its own with the disk image's mix, as dedup's mix
    lines read)."""
    ensure_loop(ctx)
    if line.key == "kloopx":
        path = ext4_file(ctx)
    elif line.key == "kloopm":
        path = backing_file(ctx, "kloopm.img")
    else:
        path = backing_file(ctx, "kloop.img")
        ctx.kloop_backing = path
    dev = run(["losetup", "--find", "--show", "--direct-io=on",
               path]).stdout.strip()
    ctx.cleanup.push(f"losetup -d {dev}", run, ["losetup", "-d", dev])
    dio = Path(f"/sys/block/{os.path.basename(dev)}/loop/dio")
    mix = line.key == "kloopm"
    (fill_mix if mix else fill_region)(dev, ctx.args.region)
    line.dev = dev
    line.info = {"backing": path, "dio": read_text(str(dio)).strip(),
                 "data": "mix" if mix else "all written"}


def setup_dmcrypt(line, ctx, name=DM_NAME, perf=()):
    """dm-crypt over a loop device over the file of the encrypt line with
    the same data: encslow's (the disk image's mix: dmcrypt, dmcryptnw)
    or encfull's (every block written: dmcryptf, dmcryptnwf); over a file
    of its own, written the same way through dm-crypt, without it."""
    if not shutil.which("cryptsetup"):
        raise BenchError("cryptsetup is not installed (make guest-deps)")
    full = line.key in ("dmcryptf", "dmcryptnwf")
    name += "f" if full else ""
    backing = ctx.enc_full_backing if full else ctx.enc_backing
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
        (fill_region if full else fill_mix)(dev, ctx.args.region)
    line.dev = dev
    line.info = {"setup": " ".join(cmd), "backing": backing, "loop": loop,
                 "data": "all written" if full else "mix",
                 "shared_with": (None if fill else
                                 "encfull" if full else "encslow")}
    if not full:
        line.info["shared_with_encslow"] = not fill


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


# the kernel's zram: its control directory (hot_add, hot_remove, where
# the module is loaded already), and each zram line's compressor (zram-rs
# takes the same: --algo)
ZRAM_CONTROL = Path("/sys/class/zram-control")
ZRAM_COMP = {"kzram": "lz4", "kzramz": "zstd"}


def write_sysfs(path, value):
    try:
        Path(path).write_text(value)
    except OSError as e:
        raise BenchError(f"echo {value} > {path}: {e.strerror}") from None


def compression(orig, compr, mem_used, same, huge, counts):
    """What a compressed disk's store made of the data written to it, as
    zram's mm_stat says it (bytes; same and huge in pages), with the ratio
    (orig / compr) and the memory it takes per GiB stored (MiB): what the
    report prints of the zram lines (report.compression_rows).  @counts:
    what mem_used counts, which is not the same on both sides."""
    return {"orig_data_size": orig, "compr_data_size": compr,
            "mem_used": mem_used, "same_pages": same, "huge_pages": huge,
            "ratio": orig / compr if compr else None,
            "mem_mib_per_gib": mem_used / orig * 1024 if orig else None,
            "mem_used_counts": counts}


def check_stored(line, figures, size):
    """Say so if a store holds other than the @size bytes written to it:
    its figures would not be those of the same data as the others'."""
    if figures["orig_data_size"] != size:
        say(f"WARNING: {line.key}: {figures['orig_data_size']} bytes stored "
            f"after writing {size}: its compression is not of the data the "
            "other zram lines hold")


def zram_compression(sysfs):
    """zram's mm_stat: orig_data_size compr_data_size mem_used_total
    mem_limit mem_used_max same_pages pages_compacted huge_pages ..."""
    text = read_text(sysfs / "mm_stat") or ""
    try:
        f = [int(x) for x in text.split()]
        return compression(f[0], f[1], f[2], f[5],
                           f[7] if len(f) > 7 else None,
                           "mem_used_total: the zsmalloc pool (not the "
                           "per-block table)")
    except (ValueError, IndexError):
        raise BenchError(f"{sysfs}/mm_stat: unexpected {text!r}") from None


def setup_kzram(line, ctx):
    """The kernel's zram, lz4 or zstd (ZRAM_COMP), as large as the hybd lines' ramdisks, with
    the zram mix written: zram0 of the module loaded here (num_devices=1,
    unloaded at the end), or a device added to it (hot_add, removed at the
    end) where it is loaded already (swap on zram, say).  Its
    compression after the fill goes into bench.json."""
    if module_loaded("zram"):
        try:
            idx = int((ZRAM_CONTROL / "hot_add").read_text())
        except (OSError, ValueError) as e:
            raise BenchError(f"zram is loaded: {ZRAM_CONTROL}/hot_add: "
                             f"{getattr(e, 'strerror', None) or e}") from None
        ctx.cleanup.push(f"zram hot_remove {idx}", write_sysfs,
                         ZRAM_CONTROL / "hot_remove", str(idx))
        how = f"hot_add (zram loaded already): zram{idx}"
    else:
        run(["modprobe", "zram", "num_devices=1"])
        ctx.cleanup.push("rmmod zram", run, ["modprobe", "-r", "zram"])
        idx = 0
        how = "modprobe zram num_devices=1"
    sysfs = Path(f"/sys/block/zram{idx}")
    wait_until(lambda: (sysfs / "disksize").exists(), 10, f"{sysfs}")
    # "lzo [lz4] zstd": the one in brackets is the device's
    algs = re.findall(r"[\w-]+", read_text(sysfs / "comp_algorithm") or "")
    comp = ZRAM_COMP[line.key]
    if comp not in algs:
        raise Unsupported(f"zram of Linux {platform.release()} has no "
                          f"{comp} (it offers {', '.join(algs)})")
    # the compressor before the size: a sized device keeps its own
    write_sysfs(sysfs / "comp_algorithm", comp)
    write_sysfs(sysfs / "disksize", str(ctx.args.ramdisk_size))
    ctx.cleanup.push(f"reset zram{idx}", write_sysfs, sysfs / "reset", "1")
    dev = f"/dev/zram{idx}"
    wait_until(lambda: os.path.exists(dev), 10, dev)
    region = ctx.args.region
    mix = fill_zmix(dev, region)
    # zram stores each write before it completes it: mm_stat is up to
    # date once the fill returns
    figures = zram_compression(sysfs)
    check_stored(line, figures, region)
    line.dev = dev
    line.info = {"setup": how, "comp_algorithm":
                 read_text(sysfs / "comp_algorithm"),
                 "disksize": ctx.args.ramdisk_size, "data": "zmix",
                 "zmix": mix, "compression": figures}


SETUP_FIRST = ("kloop", "encslow", "encfull")
SETUP = {"nullblk": setup_nullblk, "nbd": setup_nbd, "kloop": setup_kloop,
         "kloopx": setup_kloop, "kloopm": setup_kloop,
         "dmcrypt": setup_dmcrypt, "dmcryptnw": setup_dmcryptnw,
         "dmcryptf": setup_dmcrypt, "dmcryptnwf": setup_dmcryptnw,
         "dmlinear": setup_dmlinear,
         "unull1": setup_unull1, "unull1z": setup_unull1,
         "unull": setup_unull, "uloop": setup_uloop, "uloopz": setup_uloop,
         "nbdk": setup_nbdk, "kzram": setup_kzram, "kzramz": setup_kzram}
