# SPDX-License-Identifier: GPL-2.0
"""The control node validates everything: each bad parameter is refused
with its own errno and, for HYBD_CTL_ADD, the field that was wrong
(err_param), through the CLI and through raw ioctls; nothing is left
behind.  -EINVAL is a malformed value, -ERANGE one out of range,
-EOPNOTSUPP an unknown bit (include/uapi/hybd.h, kmod/dev.c)."""

import errno
import json
import os
import re
import shutil
import struct

import pytest

import hybd_uapi as u
from hybdlib import REPO, T_IO, free_id, hybdctl, list_devices, run

MiB = 1 << 20
EINVAL, ERANGE, EOPNOTSUPP = errno.EINVAL, errno.ERANGE, errno.EOPNOTSUPP


@pytest.fixture
def unchanged():
    """The device list must be the same after the test."""
    before = list_devices()
    yield
    assert list_devices() == before, "a refused add left a device behind"


@pytest.fixture
def ctl():
    with u.Control() as c:
        yield c


# --------------------------------------------------------------------- CLI

# (id, hybdctl add args, errno, what the message must name)
CLI_CASES = [
    ("size-0", ["--size", "0"], EINVAL, r"size"),
    ("size-2^64-1", ["--size", "18446744073709551615"], EINVAL,
     r"size .*too large"),
    ("size-not-multiple-of-lbs", ["--size", str(16 * MiB + 512)], EINVAL, r"size"),
    ("lbs-1000", ["--lbs", "1000"], EINVAL, r"logical block size"),
    ("lbs-8192", ["--lbs", "8192", "--pbs", "8192"], EINVAL, r"logical block size"),
    ("pbs-below-lbs", ["--lbs", "4096", "--pbs", "512"], EINVAL, r"physical block size"),
    ("max-io-not-4k-multiple", ["--max-io", "6000"], EINVAL, r"max I/O"),
    ("max-io-too-big", ["--max-io", "2M"], ERANGE, r"max I/O"),
    ("queues-0", ["--queues", "0"], ERANGE, r"queues"),
    ("queues-65", ["--queues", "65"], ERANGE, r"queues"),
    ("depth-0", ["--depth", "0"], ERANGE, r"depth"),
    ("depth-1025", ["--depth", "1025"], ERANGE, r"depth"),
    ("depth-100000", ["--depth", "100000"], ERANGE, r"depth"),
    ("depth-x-max-io-over-256M", ["--depth", "512", "--max-io", "1M"], ERANGE,
     r"per queue|256 MiB"),
    ("poll-ns-too-large", ["--poll-ns", "1000001"], ERANGE, r"poll"),
    ("flush-without-write-cache", ["--ops", "read,write,flush", "--no-write-cache"],
     EINVAL, r"write cache"),
    ("fua-without-write-cache", ["--ops", "read,write,fua", "--no-write-cache"],
     EINVAL, r"write cache"),
    ("ops-without-read", ["--ops", "write"], EINVAL, r"read"),
    ("id-64", ["--id", "64"], ERANGE, r"id"),
]


@pytest.mark.parametrize("args,err,names", [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_cli_add_refuses_bad_parameter(unchanged, args, err, names):
    rc, out, stderr = hybdctl("add", *args)
    assert rc == 1, f"exit {rc}, stdout {out!r}, stderr {stderr!r}"
    assert out == ""
    m = re.search(r"^hybdctl: add: (.*) \((.*)\)$", stderr, re.M)
    assert m, f"not 'hybdctl: add: <message> (<strerror>)': {stderr!r}"
    assert m.group(2) == os.strerror(err), stderr
    assert re.search(names, m.group(1), re.I), f"message does not name the field: {stderr!r}"


def test_cli_add_unknown_op_is_a_usage_error(unchanged):
    rc, out, err = hybdctl("add", "--ops", "read,bogus")
    assert rc == 2, f"exit {rc}: {err}"
    assert "bogus" in err


def test_cli_add_id_in_use_fails_with_eexist(added_devices):
    dev_id = free_id()
    rc, out, err = hybdctl("add", "--id", str(dev_id), "--size", "16M")
    assert rc == 0, err
    added_devices.append(dev_id)
    before = list_devices()
    rc, out, err = hybdctl("add", "--id", str(dev_id), "--size", "16M")
    assert rc == 1, f"exit {rc}: {out}{err}"
    assert re.search(r"^hybdctl: add: .*\(File exists\)$", err, re.M), err
    assert list_devices() == before


def test_cli_features_matches_the_ioctl(ctl):
    rc, out, err = hybdctl("features", "--json")
    assert rc == 0, err
    f = json.loads(out)
    e, abi, feats = u.features(ctl)
    assert e == 0
    assert (f["abi_version"], f["features"]) == (abi, feats)


# --------------------------------------------------------------- raw ioctls

# (id, pack_add keywords, errno, err_param)
B, D = u.basic, u.discard_block
RW = u.OPF_READ | u.OPF_WRITE
RAW_ADD_CASES = [
    # a struct too short to hold err_param gets the errno only: the kernel
    # must not write past the length the caller gave (review finding 11)
    ("len-0", dict(length=0), EINVAL, u.PERR_NONE),
    ("len-too-small", dict(length=8), EINVAL, u.PERR_NONE),
    ("len-just-err-param", dict(length=12), EINVAL, u.PERR_LEN),
    ("len-one-short", dict(length=u.ADD_SIZE - 8), EINVAL, u.PERR_LEN),
    ("trailing-nonzero-byte", dict(extra=b"\0" * 7 + b"\1"), errno.E2BIG, u.PERR_LEN),
    ("params-len-too-small", dict(params_len=8), EINVAL, u.PERR_LEN),
    ("types-unknown-bit", dict(types=u.PARAM_BASIC | 1 << 7), EOPNOTSUPP, u.PERR_TYPES),
    ("types-without-basic", dict(types=0), EINVAL, u.PERR_TYPES),
    ("add-reserved0", dict(reserved0=1), EINVAL, u.PERR_RESERVED),
    ("add-reserved1", dict(reserved=(0, 1)), EINVAL, u.PERR_RESERVED),
    ("io-timeout-too-long", dict(b=B(io_timeout=u.MAX_IO_TIMEOUT + 1)), ERANGE,
     u.PERR_IO_TIMEOUT),
    ("basic-reserved3", dict(b=B(reserved=(0, 0, 1))), EINVAL, u.PERR_RESERVED),
    ("basic-reserved0", dict(b=B(reserved0=1)), EINVAL, u.PERR_RESERVED),
    ("recovery-too-long", dict(b=B(recovery=u.MAX_RECOVERY_TIMEOUT + 1)),
     ERANGE, u.PERR_RECOVERY),
    ("discard-reserved0", dict(types=u.PARAM_BASIC | u.PARAM_DISCARD,
                               b=B(ops=RW | u.OPF_DISCARD), d=D(reserved0=1)),
     EINVAL, u.PERR_RESERVED),
    ("dev-id-64", dict(dev_id=64), ERANGE, u.PERR_DEV_ID),
    ("size-0", dict(b=B(size=0)), EINVAL, u.PERR_SIZE),
    ("size-not-multiple-of-lbs", dict(b=B(size=MiB + 512)), EINVAL, u.PERR_SIZE),
    ("lbs-0", dict(b=B(lbs=0)), EINVAL, u.PERR_LOGICAL_BS),
    ("lbs-1000", dict(b=B(lbs=1000)), EINVAL, u.PERR_LOGICAL_BS),
    ("lbs-256", dict(b=B(lbs=256)), EINVAL, u.PERR_LOGICAL_BS),
    ("lbs-8192", dict(b=B(lbs=8192, pbs=8192)), EINVAL, u.PERR_LOGICAL_BS),
    ("pbs-below-lbs", dict(b=B(lbs=4096, pbs=512)), EINVAL, u.PERR_PHYSICAL_BS),
    ("pbs-not-power-of-2", dict(b=B(pbs=12288)), EINVAL, u.PERR_PHYSICAL_BS),
    ("pbs-128k", dict(b=B(pbs=128 << 10)), EINVAL, u.PERR_PHYSICAL_BS),
    ("max-io-0", dict(b=B(max_io=0)), EINVAL, u.PERR_MAX_IO),
    ("max-io-6000", dict(b=B(max_io=6000)), EINVAL, u.PERR_MAX_IO),
    ("max-io-2M", dict(b=B(max_io=2 * MiB)), ERANGE, u.PERR_MAX_IO),
    ("queues-0", dict(b=B(queues=0)), ERANGE, u.PERR_QUEUES),
    ("queues-65", dict(b=B(queues=65)), ERANGE, u.PERR_QUEUES),
    ("depth-0", dict(b=B(depth=0)), ERANGE, u.PERR_DEPTH),
    ("depth-1025", dict(b=B(depth=1025)), ERANGE, u.PERR_DEPTH),
    ("depth-x-max-io-over-256M", dict(b=B(depth=512, max_io=MiB)), ERANGE,
     u.PERR_QUEUE_BUF),
    # 8 queues of 129 x 1 MiB: each within the queue limit, 8 MiB over the
    # device's (checked as asked, before blk-mq caps the queues)
    ("queues-x-depth-x-max-io-over-1G", dict(b=B(queues=8, depth=129, max_io=MiB)),
     ERANGE, u.PERR_DEV_BUF),
    ("ops-unknown-bit", dict(b=B(ops=RW | 1 << 6)), EOPNOTSUPP, u.PERR_OPS),
    ("ops-without-read", dict(b=B(ops=u.OPF_WRITE)), EINVAL, u.PERR_OPS),
    ("flush-without-write-cache", dict(b=B(ops=RW | u.OPF_FLUSH)), EINVAL, u.PERR_OPS),
    ("fua-without-write-cache", dict(b=B(ops=RW | u.OPF_FUA)), EINVAL, u.PERR_OPS),
    ("flags-unknown-bit", dict(b=B(flags=1 << 6)), EOPNOTSUPP, u.PERR_FLAGS),
    ("zero-writes-without-write-zeroes", dict(b=B(flags=u.DEV_F_ZERO_WRITES)),
     EINVAL, u.PERR_FLAGS),
    ("write-cache-without-flush", dict(b=B(flags=u.DEV_F_WRITE_CACHE)), EINVAL,
     u.PERR_FLAGS),
    ("poll-ns-too-large", dict(b=B(poll_ns=u.MAX_POLL_NS + 1)), ERANGE, u.PERR_POLL),
    ("discard-params-without-discard-op",
     dict(types=u.PARAM_BASIC | u.PARAM_DISCARD), EINVAL, u.PERR_DISCARD),
    ("discard-granularity-not-power-of-2",
     dict(types=u.PARAM_BASIC | u.PARAM_DISCARD, b=B(ops=RW | u.OPF_DISCARD),
          d=D(granularity=3 * 4096)), EINVAL, u.PERR_DISCARD),
]


@pytest.mark.parametrize("kw,err,perr", [c[1:] for c in RAW_ADD_CASES],
                         ids=[c[0] for c in RAW_ADD_CASES])
def test_raw_add_refuses_bad_field(ctl, unchanged, kw, err, perr):
    e, _, err_param = u.add(ctl, **kw)
    assert (u.errname(e), err_param) == (u.errname(err), perr)


def test_raw_add_accepts_longer_struct_with_zero_tail(ctl, added_devices):
    e, dev_id, err_param = u.add(ctl, extra=bytes(16))
    assert e == 0, f"{u.errname(e)}, err_param {err_param}"
    added_devices.append(dev_id)
    assert dev_id in [d["id"] for d in list_devices()]


def test_raw_add_then_id_in_use_is_eexist(ctl, added_devices):
    dev_id = free_id()
    e, got, _ = u.add(ctl, dev_id=dev_id)
    assert e == 0 and got == dev_id, u.errname(e)
    added_devices.append(dev_id)
    before = list_devices()
    e, _, err_param = u.add(ctl, dev_id=dev_id)
    assert (u.errname(e), err_param) == ("EEXIST", u.PERR_DEV_ID)
    assert list_devices() == before


@pytest.mark.parametrize("kw,err", [
    (dict(flags=1 << 1), EOPNOTSUPP),
    (dict(flags=1 << 31), EOPNOTSUPP),
    (dict(reserved0=1), EINVAL),
    (dict(length=4), EINVAL),
], ids=["flags-bit1", "flags-bit31", "reserved0", "len-too-small"])
def test_raw_del_refuses_bad_request_and_keeps_the_device(ctl, added_devices, kw, err):
    e, dev_id, _ = u.add(ctl)
    assert e == 0, u.errname(e)
    added_devices.append(dev_id)
    assert u.errname(u.delete(ctl, dev_id, **kw)) == u.errname(err)
    assert dev_id in [d["id"] for d in list_devices()]
    assert u.delete(ctl, dev_id) == 0
    assert dev_id not in [d["id"] for d in list_devices()]


def test_raw_del_and_info_of_unknown_id_are_enodev(ctl, unchanged):
    dev_id = free_id()
    assert u.errname(u.delete(ctl, dev_id)) == "ENODEV"
    assert u.errname(u.info_state(ctl, dev_id)[0]) == "ENODEV"
    assert u.errname(u.delete(ctl, 1 << 20)) == "ENODEV"


def test_raw_info_with_short_len_is_einval(ctl, added_devices):
    e, dev_id, _ = u.add(ctl)
    assert e == 0
    added_devices.append(dev_id)
    buf = bytearray(u.INFO_SIZE)
    struct.pack_into("<II", buf, 0, 4, dev_id)
    assert u.errname(u.ioctl(ctl.fd, u.CTL_INFO, buf)) == "EINVAL"


@pytest.mark.parametrize("request_nr", [
    u._ioc(3, 0x3F, 16),                     # our magic, unknown number
    u._ioc(3, 0x42, 24),                     # a server-node ioctl
    (3 << 30) | (16 << 16) | (0x12 << 8),    # someone else's magic
    0,
], ids=["unknown-nr", "srv-ioctl-on-control", "other-magic", "zero"])
def test_unknown_ioctl_is_enotty(ctl, unchanged, request_nr):
    buf = bytearray(64)
    struct.pack_into("<I", buf, 0, 16)
    assert u.errname(u.ioctl(ctl.fd, request_nr, buf)) == "ENOTTY"


def test_features_report_abi_and_only_known_bits(ctl):
    e, abi, feats = u.features(ctl)
    assert e == 0
    assert abi == u.ABI_VERSION
    assert feats & u.F_RINGS
    assert feats & ~u.F_KNOWN == 0, hex(feats)


def test_list_reports_the_count_even_without_room(ctl, added_devices):
    e, dev_id, _ = u.add(ctl)
    assert e == 0
    added_devices.append(dev_id)
    e, ids, count = u.list_ids(ctl)
    assert e == 0 and dev_id in ids and count == len(ids)
    e, none, count0 = u.list_ids(ctl, room=0)
    assert e == 0 and none == [] and count0 == count


def test_python_layouts_match_the_uapi_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to check the header with")
    src = tmp_path / "layout.c"
    src.write_text(u.C_CHECK)
    # gcc is slow in the debug kernel's guest (KASAN, lockdep): T_IO
    run([cc, "-I", REPO / "include", "-o", tmp_path / "layout", src],
        timeout=T_IO, check=True)
    out = run([tmp_path / "layout"], check=True).stdout
    for line in out.splitlines():
        name, val = line.rsplit(" ", 1)
        mine = u.SIZES.get(name, u.IOCTLS.get(name, u.SRV_IOCTLS.get(name)))
        assert mine == int(val), f"{name}: header {val}, tests/hybd_uapi.py {mine}"
