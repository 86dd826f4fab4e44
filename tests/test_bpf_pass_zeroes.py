# SPDX-License-Identifier: GPL-2.0
"""HYBD_BPF_PASS_ZEROES: a write the fast path found all zero reaches the
server as a write-zeroes of the same range and flags, without its payload,
while the program (complete()) and the per-kind counters still see the
write; on a device without write-zeroes, or past its
max_write_zeroes_bytes, the write goes as it is; for a read the value is
outside the contract.  tests/bpf/passzeroes.bpf.c is the program."""

import errno
import os

import pytest

import hybd_uapi as uapi
from hybdbpf import (BLOCK, delta, detach_ok, fastpath, need_bpf,
                     read_blocks, read_errno, settle, stats, suite_prog)
from hybdlib import (REPO, direct_write, hybdctl, hybdctl_json, need_built,
                     pattern, sysfs_queue)

assert fastpath     # a fixture, used by name

SLOWDRV = REPO / "tests" / "helpers" / "slowdrv"


@pytest.fixture(autouse=True)
def _bpf():
    need_bpf()


def prog_counters(dev):
    """passzeroes' globals: zeroes_passed, zeroes_done, zeroes_odd."""
    maps = hybdctl_json("stats", str(dev), "--maps")["maps"]
    bss = [m for m in maps if m.endswith(".bss")]
    assert len(bss) == 1, maps
    return maps[bss[0]]


def with_blocks(data, first, new):
    """data with the blocks from first on replaced by new."""
    at = first * BLOCK
    return data[:at] + new + data[at + len(new):]


def test_zero_writes_reach_the_server_as_write_zeroes_others_as_writes(
        ramdisk, fastpath):
    srv = ramdisk(size="16M", queues=1, max_io="128K", zero_writes=True)
    settle()
    assert sysfs_queue(srv.dev, "fua") == "1"
    old = pattern("pass-zeroes-old", 8 * BLOCK)
    direct_write(srv.dev, 0, old)
    fastpath.attach(suite_prog("passzeroes"), srv.dev)

    before = stats(srv.dev)
    zero, zero2 = bytes(BLOCK), bytes(2 * BLOCK)
    new = bytes(BLOCK // 2) + pattern("pass-zeroes-new", BLOCK // 2)
    direct_write(srv.dev, 1 * BLOCK, zero)
    # O_DIRECT|O_DSYNC: REQ_FUA, which the write-zeroes must carry on
    direct_write(srv.dev, 3 * BLOCK, zero2, os.O_DSYNC)
    direct_write(srv.dev, 6 * BLOCK, new)      # half zero: a write
    d = delta(stats(srv.dev), before)
    assert d["bpf_pass_zeroes"] == 2, d
    # and so does its queue's, in the per-queue table too
    total = stats(srv.dev)["bpf_pass_zeroes"]
    assert [q["bpf_pass_zeroes"] for q in hybdctl_json(
        "stats", srv.dev, "--per-queue")["queues"]] == [total]
    rc, out, err = hybdctl("stats", srv.dev, "--per-queue")
    assert rc == 0, err
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.split()[:1] == ["queue"])
    header, row = lines[at].split(), lines[at + 1].split()
    assert row[0] == "0", out
    assert row[header.index("pass_zeroes")] == str(total), out
    # the per-kind counters count the requests, three writes (one FUA)
    assert d["writes"] == 3 and d["fua"] == 1, d
    assert d["write_zeroes"] == 0 and d["fast_done"] == 0, d
    assert d["slow_errors"] == 0 and d["bpf_bad_ret"] == 0, d
    # complete() saw both as the writes they are, successful
    c = prog_counters(srv.dev)
    assert c == {"zeroes_passed": 2, "zeroes_done": 2, "zeroes_odd": 0}, c

    expect = with_blocks(with_blocks(with_blocks(old, 1, zero), 3, zero2),
                         6, new)
    assert read_blocks(srv.dev, 0, 8) == expect, (
        "the zero writes sent as write-zeroes did not read back as written")
    detach_ok(srv.dev)
    assert read_blocks(srv.dev, 0, 8) == expect

    # the server's view: the two zero writes came as write-zeroes, every
    # other write as a write
    total = stats(srv.dev)
    served = srv.stop()
    assert served["write_zeroes"] == 2, served
    assert served["writes"] == total["writes"] - 2, (served, total)


def goes_as_write(srv, fastpath, nblocks):
    """Attach passzeroes to srv, write nblocks zero blocks over non-zero
    data in one request; check that it went as a plain write."""
    old = pattern("pass-zeroes-plain", 4 * BLOCK)
    direct_write(srv.dev, 0, old)
    fastpath.attach(suite_prog("passzeroes"), srv.dev)
    before = stats(srv.dev)
    zeros = bytes(nblocks * BLOCK)
    direct_write(srv.dev, BLOCK, zeros)
    d = delta(stats(srv.dev), before)
    assert d["bpf_pass_zeroes"] == 0 and d["bpf_bad_ret"] == 0, d
    assert d["writes"] == 1 and d["slow_done"] == 1, d
    assert d["slow_errors"] == 0 and d["fast_done"] == 0, d
    c = prog_counters(srv.dev)
    assert c == {"zeroes_passed": 1, "zeroes_done": 1, "zeroes_odd": 0}, c
    assert read_blocks(srv.dev, 0, 4) == with_blocks(old, 1, zeros)


def test_pass_zeroes_without_write_zeroes_is_a_plain_pass(servers, fastpath):
    need_built(SLOWDRV, "tests/helpers/slowdrv")
    # slowdrv has .read and .write only: a write-zeroes would fail
    srv = servers.start([SLOWDRV, "--size", str(16 << 20)])
    settle()
    assert sorted(hybdctl_json("info", srv.dev)["ops"]) == ["read", "write"]
    goes_as_write(srv, fastpath, 1)


def test_pass_zeroes_without_the_servers_opt_in_is_a_plain_pass(
        ramdisk, fastpath):
    # write-zeroes offered, HYBD_DEV_F_ZERO_WRITES not asked for: a
    # server never gets a write-zeroes for a write it did not agree to
    srv = ramdisk(size="16M", queues=1)
    settle()
    goes_as_write(srv, fastpath, 1)
    detach_ok(srv.dev)
    served = srv.stop()
    assert served["write_zeroes"] == 0, served


def test_pass_zeroes_past_max_write_zeroes_bytes_is_a_plain_pass(
        ramdisk, fastpath):
    srv = ramdisk(size="16M", queues=1, max_write_zeroes=BLOCK,
                  zero_writes=True)
    settle()
    assert sysfs_queue(srv.dev, "write_zeroes_max_bytes") == str(BLOCK)
    goes_as_write(srv, fastpath, 2)
    # one block is within the limit: a write-zeroes
    before = stats(srv.dev)
    direct_write(srv.dev, 0, bytes(BLOCK))
    assert delta(stats(srv.dev), before)["bpf_pass_zeroes"] == 1
    detach_ok(srv.dev)
    served = srv.stop()
    assert served["write_zeroes"] == 1, served


def test_pass_zeroes_for_a_read_fails_it_with_eio_and_is_counted(
        ramdisk, fastpath):
    srv = ramdisk(size="16M", queues=1, zero_writes=True)
    settle()
    old = pattern("pass-zeroes-read", 2 * BLOCK)
    direct_write(srv.dev, 0, old)
    fastpath.attach(suite_prog("passzeroes-read"), srv.dev)

    before = stats(srv.dev)
    for blk in range(2):
        e = read_errno(srv.dev, blk * BLOCK)
        assert e == errno.EIO, (
            f"PASS_ZEROES for a read of block {blk}: "
            f"{errno.errorcode.get(e, 'success')}, not EIO")
    d = delta(stats(srv.dev), before)
    assert d["bpf_bad_ret"] == 2 and d["fast_errors"] == 2, d
    assert d["fast_done"] == 2 and d["slow_issued"] == 0, d
    assert d["bpf_pass_zeroes"] == 0, d

    # a zero write still goes as a write-zeroes
    before = stats(srv.dev)
    direct_write(srv.dev, BLOCK, bytes(BLOCK))
    d = delta(stats(srv.dev), before)
    assert d["bpf_pass_zeroes"] == 1 and d["bpf_bad_ret"] == 0, d
    detach_ok(srv.dev)
    assert read_blocks(srv.dev, 0, 2) == old[:BLOCK] + bytes(BLOCK)


def test_features_offer_pass_zeroes():
    with uapi.Control() as ctl:
        e, _, feats = uapi.features(ctl)
    assert e == 0, uapi.errname(e)
    assert feats & uapi.F_PASS_ZEROES, (
        f"a module with the fast path does not offer HYBD_F_PASS_ZEROES: "
        f"{feats:#x}")
    names = hybdctl_json("features")["names"]
    assert "pass_zeroes" in names and "bpf" in names, names
