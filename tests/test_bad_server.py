# SPDX-License-Identifier: GPL-2.0
"""The kernel never trusts the completion ring: a server that completes
unknown tags, completes twice, echoes a wrong seq, returns a bogus result
or scribbles over the ring index gets each bad completion rejected and
counted, the good ones still served, and nobody else is disturbed."""

import os

import pytest

from hybdlib import (REJ_FIELDS, T_IO, assert_data, del_device, device_ids,
                     direct_write, info, pattern, run, wait_for)

MiB = 1 << 20
READS = 16

# mode: (the counter its misbehaviour bumps, how many at least per READS
# sequential reads, do reads succeed)
MODES = {
    "unknown-tag": ("rej_bad_tag", READS, True),
    "double-complete": ("rej_not_outstanding", READS, True),
    "stale-seq": ("rej_stale_seq", READS, True),
    "bad-result": ("rej_bad_result", 1, False),
    "garbage-ring": ("rej_ring_index", 1, True),
}


def dd_read(dev, count=READS):
    return run(["dd", f"if={dev}", "of=/dev/null", "bs=4k", f"count={count}",
                "iflag=direct"], timeout=T_IO)


@pytest.mark.parametrize("mode", list(MODES))
def test_bad_completions_are_rejected_counted_and_contained(badserver, ramdisk, mode):
    counter, at_least, reads_ok = MODES[mode]
    neighbour = ramdisk(size="16M")
    keep = pattern(mode, MiB)
    direct_write(neighbour.dev, 0, keep)

    bad = badserver(mode)
    before = info(bad.dev)["stats"]
    res = dd_read(bad.dev)
    after = info(bad.dev)["stats"]

    if reads_ok:
        assert res.returncode == 0, res.stderr
        assert f"{READS}+0 records in" in res.stderr, res.stderr
    else:
        assert res.returncode != 0, "reads of failed requests succeeded"
        assert "Input/output error" in res.stderr, res.stderr
    grew = after[counter] - before[counter]
    assert grew >= at_least, f"{counter} grew by {grew}: {before} -> {after}"
    if mode != "garbage-ring":
        # the misbehaviour is reported as what it is, nothing else
        others = {k: after[k] for k in REJ_FIELDS if k != counter and after[k]}
        assert not others, others

    assert info(bad.dev)["state"] == "live"
    assert_data(neighbour.dev, 0, keep, "neighbouring ramdisk")
    bad.stop()
    wait_for(lambda: not os.path.exists(bad.dev), 10, f"{bad.dev} to go")
    assert bad.id not in device_ids()
    assert_data(neighbour.dev, 0, keep, "neighbouring ramdisk, after")


def test_well_behaved_helper_counts_no_rejection(badserver):
    good = badserver("good")
    res = dd_read(good.dev)
    assert res.returncode == 0, res.stderr
    s = info(good.dev)["stats"]
    assert all(s[k] == 0 for k in REJ_FIELDS), s
    assert s["slow_done"] >= READS and s["slow_errors"] == 0, s


def test_a_second_waiter_leaving_does_not_stop_the_wakeups(badserver):
    """Two threads sleep in HYBD_SRV_IO on one queue and one leaves (a
    signal): the other is still woken for what queue_rq publishes.  (When
    the one leaving turned wakeups off, the partition scan's reads waited
    for the I/O timeout.)"""
    srv = badserver("two-waiters", "--io-timeout", "60")
    res = dd_read(srv.dev)
    assert res.returncode == 0, res.stderr
    s = info(srv.dev)["stats"]
    assert s["timed_out"] == 0 and s["slow_errors"] == 0, s
    assert s["slow_done"] >= READS, s


@pytest.mark.parametrize("mode", ["double-complete", "garbage-ring"])
def test_misbehaving_servers_device_can_be_deleted_under_it(badserver, mode):
    bad = badserver(mode)
    assert dd_read(bad.dev, 4).returncode == 0
    rc, _, err = del_device(bad.id)
    assert rc == 0, err
    wait_for(lambda: not os.path.exists(bad.dev), 10, f"{bad.dev} to go")
    assert bad.id not in device_ids()
