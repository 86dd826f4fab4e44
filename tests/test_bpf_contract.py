# SPDX-License-Identifier: GPL-2.0
"""What the kernel holds a fast-path program to, beyond the return value:
a read completed in the kernel must have been filled, all of it; a read's
payload can be read back only once it is the device's data; only hybd's
own struct_ops programs may call hybd's kfuncs, and only CAP_SYS_ADMIN may
attach or replace one.  (That the sample programs publish their slots
with ordered, fetching atomics is checked on the host: tests/unit/
bpf-atomics.sh, in make unit.)"""

import errno
import re

import pytest

from hybdbpf import (BLOCK, BPFCTL, bpfctl, delta, detach_ok,
                     dev_info, fastpath, need_bpf, prog, read_blocks,
                     read_errno, settle, stats, suite_prog, write_errno)
from hybdlib import (REPO, T_ATTACH, direct_write, need_built, pattern,
                     record, run)

assert fastpath and bpfctl      # fixtures, used by name


@pytest.fixture(autouse=True)
def _bpf():
    need_bpf()


def small_ramdisk(ramdisk):
    srv = ramdisk(size="16M", queues=2, depth=16, max_io="128K")
    settle()
    return srv


# ------------------------------------------------- a DONE read is filled

# (program, what it fills before DONE)
UNFILLED = [("unfilled", "nothing"),
            ("unfilled-half", "the first half"),
            ("unfilled-gap", "the second half only")]


def test_read_done_without_filling_it_fails_with_eio_and_is_counted(
        ramdisk, fastpath):
    srv = small_ramdisk(ramdisk)
    old = pattern("unfilled-old", 4 * BLOCK)
    direct_write(srv.dev, 0, old)

    for i, (name, fills) in enumerate(UNFILLED):
        fastpath.attach(suite_prog(name), srv.dev, replace=i > 0)
        before = stats(srv.dev)
        for blk in range(4):
            e = read_errno(srv.dev, blk * BLOCK)
            assert e == errno.EIO, (
                f"{name} filled {fills} and returned DONE: the read of "
                f"block {blk} gave {errno.errorcode.get(e, 'success')}, "
                f"not EIO")
        d = delta(stats(srv.dev), before)
        assert d["bpf_unfilled"] == 4 and d["fast_errors"] == 4, (name, d)
        assert d["fast_done"] == 4 and d["bpf_bad_ret"] == 0, (name, d)

        # writes pass to the server and work
        blk = 4 + i
        assert write_errno(srv.dev, blk * BLOCK,
                           pattern(name, BLOCK)) == 0, name

    # filled in two halves, in order: all of it, and DONE is honoured
    fastpath.attach(suite_prog("unfilled-halves"), srv.dev, replace=True)
    before = stats(srv.dev)
    filled = read_blocks(srv.dev, 0, 4) == b"\xa5" * (4 * BLOCK)
    assert filled, "a read filled in two halves did not return the fill"
    d = delta(stats(srv.dev), before)
    assert d["fast_done"] == 4 and d["fast_errors"] == 0, d
    assert d["bpf_unfilled"] == 0 and d["slow_done"] == 0, d

    detach_ok(srv.dev)
    same = read_blocks(srv.dev, 0, 4) == old
    assert same, "after the detach, the data written before is not read back"


# ------------------------------------- a read's payload, before and after

# probe.bpf.c's slots: (copy_out, is_zero) in submit(), in complete() with
# result 0, in complete() after the server failed the read
SUBMIT, COMPLETE_OK, COMPLETE_FAILED = 0, 2, 4


def probe_slots(ctl, obj, first):
    """(calls, last return) of copy_out() and is_zero() at slot first."""
    out = []
    for slot in (first, first + 1):
        calls, ret = ctl.ok("lookup", obj, "probe_ret", slot)
        out.append((calls, ret - (1 << 64) if ret >= 1 << 63 else ret))
    return out


def test_read_payload_is_readable_only_in_complete_with_result_0(
        ramdisk, badserver, bpfctl):
    srv = small_ramdisk(ramdisk)
    data = pattern("probe", 2 * BLOCK)
    direct_write(srv.dev, 0, data)
    ctl = bpfctl()
    ctl.open("p", suite_prog("probe"), srv.dev)
    ctl.ok("attach", "l", "p", "probe_ops")
    same = read_blocks(srv.dev, 0, 2) == data
    assert same, "probe is attached: the data read back differs"

    (co, co_ret), (iz, iz_ret) = probe_slots(ctl, "p", SUBMIT)
    assert co >= 2 and iz >= 2, "submit() saw no read"
    assert co_ret == -errno.EINVAL, (
        f"copy_out() of a read in submit() (not the device's data yet) "
        f"returned {co_ret}, not -EINVAL")
    assert iz_ret == -errno.EINVAL, (
        f"is_zero() of a read in submit() returned {iz_ret}, not -EINVAL")
    (co, co_ret), (iz, iz_ret) = probe_slots(ctl, "p", COMPLETE_OK)
    assert co >= 2 and co_ret == 0, "copy_out() in complete() must work"
    assert iz >= 2 and iz_ret == 0, "the data read is not all zero"

    # a server that fails every read (result 4242: rejected, EIO)
    bad = badserver("bad-result")
    ctl.open("q", suite_prog("probe"), bad.dev)
    ctl.ok("attach", "m", "q", "probe_ops")
    assert read_errno(bad.dev, 0) == errno.EIO
    (co, co_ret), (iz, iz_ret) = probe_slots(ctl, "q", COMPLETE_FAILED)
    assert co >= 1 and iz >= 1, "complete() saw no failed read"
    assert co_ret == -errno.EINVAL, (
        f"copy_out() of a read the server failed returned {co_ret}, "
        f"not -EINVAL")
    assert iz_ret == -errno.EINVAL, (
        f"is_zero() of a read the server failed returned {iz_ret}, "
        f"not -EINVAL")
    assert probe_slots(ctl, "q", COMPLETE_OK)[0][0] == 0


# ------------------------------------------------- who may use the kfuncs

# a quarter of the verifier's limit (BPF_COMPLEXITY_LIMIT_INSNS)
VERIFIER_BUDGET = 250_000


def bpfctl_load(path):
    need_built(BPFCTL, "tests/helpers/bpfctl")
    return run([BPFCTL, "load", path], timeout=2 * T_ATTACH)


# every object loaded in turn, each bounded by T_ATTACH: more than the
# default 600 s under KASAN and TCG (some 2M instructions verified)
@pytest.mark.time_limit(10 * T_ATTACH)
def test_every_shipped_program_passes_this_kernels_verifier():
    """The sample programs and the example drivers' load here: a newer
    verifier may refuse what an older one took (7.3's gave up on dedup's
    complete() loop, which 6.12's pruned), and a user finds out at attach
    time.  Loading verifies every program of an object; nothing attaches."""
    objs = sorted(REPO.glob("bpf/*.bpf.o")) + sorted(
        REPO.glob("examples/*/*.bpf.o"))
    names = {o.name for o in objs}
    for want in ("cache.bpf.o", "loop.bpf.o", "dedup.bpf.o",
                 "encrypt.bpf.o"):
        assert want in names, f"{want} not built: {sorted(names)}"
    refused, walked = [], {}
    for obj in objs:
        res = bpfctl_load(obj)
        if res.returncode != 0:
            refused.append(f"{obj.relative_to(REPO)}:\n{res.stderr[-1500:]}")
            continue
        for line in res.stdout.splitlines():
            name, insns = line.split()
            walked[f"{obj.name}:{name}"] = int(insns)
    assert not refused, "refused by this kernel's verifier:\n" + \
        "\n".join(refused)
    record("verified_insns", " ".join(f"{k}={v}" for k, v in
                                      sorted(walked.items())))
    # Headroom: a program that makes the verifier walk a quarter of its
    # 1M instructions is one kernel away from refusal (dedup's complete()
    # went from passing on 6.12 to past 1M on 7.3), and slow to attach
    # under a debug kernel.
    assert any(k.startswith("cache.bpf.o:") for k in walked), walked
    heavy = {k: v for k, v in walked.items() if v > VERIFIER_BUDGET}
    assert not heavy, f"over {VERIFIER_BUDGET} instructions walked: {heavy}"


def test_struct_ops_of_another_kind_cannot_call_hybd_kfuncs():
    # the control: a tcp_congestion_ops without the call loads
    res = bpfctl_load(suite_prog("tcpca-nokfunc"))
    assert res.returncode == 0, (
        f"the control object (no kfunc call) did not load:\n{res.stderr}")
    res = bpfctl_load(suite_prog("tcpca-kfunc"))
    assert res.returncode == 1, (
        f"a tcp_congestion_ops calling hybd_bpf_io_zero loaded: "
        f"exit {res.returncode}\n{res.stderr}")
    assert re.search(r"calling kernel function hybd_bpf_io_zero is not "
                     r"allowed", res.stderr), (
        f"refused, but not for calling the kfunc:\n{res.stderr[-3000:]}")


def test_attach_and_replace_need_cap_sys_admin(ramdisk, bpfctl):
    srv = small_ramdisk(ramdisk)
    ctl = bpfctl()
    # loading looks the module's BTF up by id, which needs CAP_SYS_ADMIN:
    # load with it, then drop it to attach
    ctl.open("a", prog("passthrough"), srv.dev)
    ctl.open("b", prog("zero"), srv.dev)

    ctl.ok("caps", "drop")
    e, _ = ctl.cmd("attach", "l", "a", "passthrough_ops")
    ctl.ok("caps", "raise")
    assert e == errno.EPERM, (
        f"attach with CAP_BPF and CAP_PERFMON but without CAP_SYS_ADMIN: "
        f"{errno.errorcode.get(e, 'success')}, not EPERM")
    assert dev_info(srv.dev)["bpf"] is None

    # refused, not used up: the same map attaches with the capability
    link, = ctl.ok("attach", "l", "a", "passthrough_ops")
    assert dev_info(srv.dev)["bpf"] == ("passthrough", link)

    ctl.ok("caps", "drop")
    e, _ = ctl.cmd("update", "l", "b", "zero_ops")
    ctl.ok("caps", "raise")
    assert e == errno.EPERM, (
        f"replace without CAP_SYS_ADMIN: "
        f"{errno.errorcode.get(e, 'success')}, not EPERM")
    assert dev_info(srv.dev)["bpf"] == ("passthrough", link)
    ctl.ok("update", "l", "b", "zero_ops")
    assert dev_info(srv.dev)["bpf"] == ("zero", link)
