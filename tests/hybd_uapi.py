# SPDX-License-Identifier: GPL-2.0
"""include/uapi/hybd.h in Python: struct layouts and ioctl numbers, for the
tests that talk to /dev/hybd-control directly (what the CLI cannot express:
reserved fields, unknown bits, short lengths, per-queue counters).

test_bad_params.py checks these layouts against the C header with the
compiler, so a change to the header shows up as one clear failure.
"""

import ctypes
import errno
import os
import struct

ABI_VERSION = 1
MAX_DEVICES = 64
MAX_QUEUES = 64
MAX_QUEUE_DEPTH = 1024
MAX_IO_BYTES = 1 << 20
MAX_QUEUE_BUF = 256 << 20
MAX_DEV_BUF = 1 << 30
MAX_POLL_NS = 1000000
MAX_IO_TIMEOUT = 3600
MAX_RECOVERY_TIMEOUT = 86400
HANDOVER_TIMEOUT = 30
DEV_ID_ANY = 0xFFFFFFFF

F_RINGS, F_POLL, F_SEQ_CHECK, F_BPF = 1, 2, 4, 8
F_IO_TIMEOUT, F_DEL_FORCE = 16, 32
F_EVENTFD, F_QUEUE_CPUS, F_MEM_INFO, F_PASS_ZEROES = 64, 128, 256, 512
F_RECOVERY, F_BACKING, F_REMAP, F_RESIZE = 1024, 2048, 4096, 8192
F_UNPRIVILEGED, F_REMAP_POLL, F_BIO_FRONT = 16384, 32768, 65536
F_KNOWN = (F_RINGS | F_POLL | F_SEQ_CHECK | F_BPF | F_IO_TIMEOUT |
           F_DEL_FORCE | F_EVENTFD | F_QUEUE_CPUS | F_MEM_INFO |
           F_PASS_ZEROES | F_RECOVERY | F_BACKING | F_REMAP | F_RESIZE |
           F_UNPRIVILEGED | F_REMAP_POLL | F_BIO_FRONT)
MAX_BACKINGS = 16
BACKING_F_WRITE = 1
SRV_BACKING_FMT = "<IiIIQII2Q"      # struct hybd_srv_backing, 48
SRV_IO_FMT = "<IHHII"               # struct hybd_srv_io, 16
SRV_QUEUE_CPUS_FMT = "<IIIIQII"     # struct hybd_srv_queue_cpus, 32
CTL_RESIZE_FMT = "<IIQII2Q"         # struct hybd_ctl_resize, 40
SRV_RESIZE_FMT = "<IIQIi2Q"         # struct hybd_srv_resize, 40
RING_HDR_FMT = "<13IIQQ"            # struct hybd_ring_hdr, 72
DEL_F_FORCE = 1

OPF_READ, OPF_WRITE, OPF_FLUSH, OPF_FUA = 1, 2, 4, 8
OPF_DISCARD, OPF_WRITE_ZEROES = 16, 32
OPF_ALL = 0x3F
DEV_F_WRITE_CACHE = 1
DEV_F_ZERO_WRITES = 2
DEV_F_RESIZE = 4
DEV_F_UNPRIVILEGED = 8
DEV_F_REMAP_POLL = 16
DEV_F_BIO_FRONT = 32
PARAM_BASIC, PARAM_DISCARD = 1, 2

# enum hybd_param_err
(PERR_NONE, PERR_LEN, PERR_TYPES, PERR_RESERVED, PERR_DEV_ID, PERR_SIZE,
 PERR_LOGICAL_BS, PERR_PHYSICAL_BS, PERR_MAX_IO, PERR_QUEUES, PERR_DEPTH,
 PERR_QUEUE_BUF, PERR_OPS, PERR_FLAGS, PERR_POLL, PERR_DISCARD,
 PERR_IO_TIMEOUT, PERR_DEV_BUF, PERR_RECOVERY) = range(19)

# enum hybd_dev_state
STATE_ADDED, STATE_LIVE, STATE_DEAD, STATE_DELETING, STATE_WAITING = range(5)

# struct layouts (little-endian x86-64, natural alignment)
BASIC_FMT = "QIIIHHIIIIII3Q"        # struct hybd_param_basic, 72 bytes
DISCARD_FMT = "IIII2Q"              # struct hybd_param_discard, 32 bytes
PARAMS_FMT = "<II" + BASIC_FMT + DISCARD_FMT    # struct hybd_params, 112
ADD_HDR_FMT = "<IIII2Q"             # struct hybd_ctl_add up to params, 32
CTL_DEV_FMT = "<IIII"               # struct hybd_ctl_dev, 16
FEATURES_FMT = "<IIQ2Q"             # struct hybd_ctl_features, 32
LIST_FMT = "<IIQ"                   # struct hybd_ctl_list, 16
INFO_HDR_FMT = "<IIIiIIII16sQIIQII"  # struct hybd_dev_info up to params, 80
NR_STATS = 32                       # struct hybd_dev_stats: 32 __u64
LAT_BUCKETS = 32
STATS_HDR_FMT = "<IIIIQ2Q"          # struct hybd_ctl_stats up to total, 40
QUEUE_STAT_SIZE = 8 * (NR_STATS + 2 * LAT_BUCKETS)     # 768

PARAMS_SIZE = struct.calcsize(PARAMS_FMT)
ADD_SIZE = struct.calcsize(ADD_HDR_FMT) + PARAMS_SIZE
INFO_SIZE = struct.calcsize(INFO_HDR_FMT) + PARAMS_SIZE + 8 * NR_STATS
STATS_SIZE = struct.calcsize(STATS_HDR_FMT) + QUEUE_STAT_SIZE

STATS_FIELDS = (
    "slow_issued", "slow_done", "slow_errors", "fast_done", "fast_errors",
    "failed_dead", "reads", "writes", "flushes", "fua", "discards",
    "write_zeroes", "rej_bad_tag", "rej_not_outstanding", "rej_stale_seq",
    "rej_bad_result", "rej_ring_index", "bpf_bad_ret", "timed_out",
    "bpf_unfilled", "bpf_pass_zeroes", "held", "reissued", "remapped",
    "remap_refused", "remap_waited", "remap_direct", "remap_runs",
    "remap_polled", "remap_front",
)

SIZES = {
    "struct hybd_param_basic": struct.calcsize("<" + BASIC_FMT),
    "struct hybd_param_discard": struct.calcsize("<" + DISCARD_FMT),
    "struct hybd_params": PARAMS_SIZE,
    "struct hybd_ctl_add": ADD_SIZE,
    "struct hybd_ctl_dev": struct.calcsize(CTL_DEV_FMT),
    "struct hybd_dev_info": INFO_SIZE,
    "struct hybd_ctl_list": struct.calcsize(LIST_FMT),
    "struct hybd_ctl_features": struct.calcsize(FEATURES_FMT),
    "struct hybd_ctl_stats": STATS_SIZE,
    "struct hybd_dev_stats": 8 * NR_STATS,
    "struct hybd_queue_stat": QUEUE_STAT_SIZE,
    "struct hybd_srv_backing": struct.calcsize(SRV_BACKING_FMT),
    "struct hybd_srv_io": struct.calcsize(SRV_IO_FMT),
    "struct hybd_srv_queue_cpus": struct.calcsize(SRV_QUEUE_CPUS_FMT),
    "struct hybd_ctl_resize": struct.calcsize(CTL_RESIZE_FMT),
    "struct hybd_srv_resize": struct.calcsize(SRV_RESIZE_FMT),
    "struct hybd_ring_hdr": struct.calcsize(RING_HDR_FMT),
}

_IOC_WRITE, _IOC_READ = 1, 2
MAGIC = 0xB7


def _ioc(direction, nr, size):
    return (direction << 30) | (size << 16) | (MAGIC << 8) | nr


CTL_GET_FEATURES = _ioc(_IOC_READ | _IOC_WRITE, 0x00, SIZES["struct hybd_ctl_features"])
CTL_ADD = _ioc(_IOC_READ | _IOC_WRITE, 0x01, ADD_SIZE)
CTL_DEL = _ioc(_IOC_WRITE, 0x02, SIZES["struct hybd_ctl_dev"])
CTL_INFO = _ioc(_IOC_READ | _IOC_WRITE, 0x03, INFO_SIZE)
CTL_LIST = _ioc(_IOC_READ | _IOC_WRITE, 0x04, SIZES["struct hybd_ctl_list"])
CTL_STATS = _ioc(_IOC_READ | _IOC_WRITE, 0x05, STATS_SIZE)
CTL_HANDOVER = _ioc(_IOC_WRITE, 0x06, SIZES["struct hybd_ctl_dev"])
CTL_RESIZE = _ioc(_IOC_WRITE, 0x07, SIZES["struct hybd_ctl_resize"])
SRV_ADD_BACKING = _ioc(_IOC_READ | _IOC_WRITE, 0x46,
                       struct.calcsize(SRV_BACKING_FMT))
SRV_DEL_BACKING = _ioc(0, 0x47, 0)
SRV_REMAP_BARRIER = _ioc(0, 0x48, 0)
SRV_IO = _ioc(_IOC_READ | _IOC_WRITE, 0x42, struct.calcsize(SRV_IO_FMT))
SRV_QUEUE_CPUS = _ioc(_IOC_READ | _IOC_WRITE, 0x45,
                      struct.calcsize(SRV_QUEUE_CPUS_FMT))

IOCTLS = {
    "HYBD_CTL_GET_FEATURES": CTL_GET_FEATURES,
    "HYBD_CTL_ADD": CTL_ADD,
    "HYBD_CTL_DEL": CTL_DEL,
    "HYBD_CTL_INFO": CTL_INFO,
    "HYBD_CTL_LIST": CTL_LIST,
    "HYBD_CTL_STATS": CTL_STATS,
    "HYBD_CTL_HANDOVER": CTL_HANDOVER,
    "HYBD_CTL_RESIZE": CTL_RESIZE,
}
# the server node's, of those the suite calls directly
SRV_IOCTLS = {
    "HYBD_SRV_ADD_BACKING": SRV_ADD_BACKING,
    "HYBD_SRV_DEL_BACKING": SRV_DEL_BACKING,
    "HYBD_SRV_REMAP_BARRIER": SRV_REMAP_BARRIER,
    "HYBD_SRV_IO": SRV_IO,
    "HYBD_SRV_QUEUE_CPUS": SRV_QUEUE_CPUS,
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.ioctl.restype = ctypes.c_int


def ioctl(fd, request, buf):
    """ioctl(fd, request, buf) on a bytearray, in place.  Returns 0 or the
    positive errno; buf holds whatever the kernel wrote back, also on
    failure (err_param)."""
    cbuf = (ctypes.c_char * len(buf)).from_buffer(buf) if buf else None
    ret = _libc.ioctl(fd, request, cbuf)
    return ctypes.get_errno() if ret < 0 else 0


def errname(e):
    return errno.errorcode.get(e, str(e)) if e else "success"


class Control:
    """An open /dev/hybd-control."""

    def __init__(self, path="/dev/hybd-control"):
        self.fd = os.open(path, os.O_RDWR)

    def close(self):
        os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def basic(size=16 << 20, lbs=4096, pbs=0, max_io=128 << 10, queues=1,
          depth=16, ops=OPF_READ | OPF_WRITE, flags=0, poll_ns=0,
          io_timeout=0, recovery=0, reserved0=0, reserved=(0, 0, 0)):
    """Field values of a struct hybd_param_basic, as a list."""
    return [size, lbs, pbs, max_io, queues, depth, ops, flags, poll_ns,
            io_timeout, recovery, reserved0, *reserved]


def discard_block(max_discard=0, granularity=0, max_wz=0, reserved0=0,
                  reserved=(0, 0)):
    return [max_discard, granularity, max_wz, reserved0, *reserved]


def pack_add(dev_id=DEV_ID_ANY, types=PARAM_BASIC, b=None, d=None,
             length=None, params_len=PARAMS_SIZE, reserved0=0,
             reserved=(0, 0), extra=b""):
    """A struct hybd_ctl_add (plus `extra` trailing bytes) as a bytearray."""
    b = basic() if b is None else b
    d = discard_block() if d is None else d
    size = ADD_SIZE + len(extra)
    hdr = struct.pack(ADD_HDR_FMT, size if length is None else length,
                      dev_id, 0, reserved0, *reserved)
    params = struct.pack(PARAMS_FMT, params_len, types, *b, *d)
    return bytearray(hdr + params + extra)


def add_result(buf):
    """(dev_id, err_param) from a struct hybd_ctl_add the kernel wrote."""
    _, dev_id, err_param = struct.unpack_from("<III", buf)
    return dev_id, err_param


def add(ctl, **kw):
    """HYBD_CTL_ADD; returns (errno, dev_id, err_param)."""
    buf = pack_add(**kw)
    e = ioctl(ctl.fd, CTL_ADD, buf)
    dev_id, err_param = add_result(buf)
    return e, dev_id, err_param


def delete(ctl, dev_id, flags=0, reserved0=0, length=None):
    """HYBD_CTL_DEL; returns errno (0 on success)."""
    size = SIZES["struct hybd_ctl_dev"]
    buf = bytearray(struct.pack(CTL_DEV_FMT, size if length is None else length,
                                dev_id, flags, reserved0))
    return ioctl(ctl.fd, CTL_DEL, buf)


def handover(ctl, dev_id, flags=0, reserved0=0):
    """HYBD_CTL_HANDOVER; returns errno (0 on success)."""
    size = SIZES["struct hybd_ctl_dev"]
    buf = bytearray(struct.pack(CTL_DEV_FMT, size, dev_id, flags, reserved0))
    return ioctl(ctl.fd, CTL_HANDOVER, buf)


def resize(ctl, dev_id, size, flags=0, reserved0=0, reserved=(0, 0),
           length=None):
    """HYBD_CTL_RESIZE; returns errno (0 on success)."""
    n = SIZES["struct hybd_ctl_resize"]
    buf = bytearray(struct.pack(CTL_RESIZE_FMT, n if length is None else length,
                                dev_id, size, flags, reserved0, *reserved))
    return ioctl(ctl.fd, CTL_RESIZE, buf)


def info_recovery(ctl, dev_id):
    """HYBD_CTL_INFO; returns (errno, dict of the recovery fields)."""
    buf = bytearray(INFO_SIZE)
    struct.pack_into("<II", buf, 0, INFO_SIZE, dev_id)
    e = ioctl(ctl.fd, CTL_INFO, buf)
    if e:
        return e, None
    f = struct.unpack_from(INFO_HDR_FMT, buf)
    return 0, {"state": f[2], "server_pid": f[3], "recovery_left_ms": f[10],
               "recoveries": f[11], "no_server_ns": f[12]}


def features(ctl):
    """HYBD_CTL_GET_FEATURES; returns (errno, abi_version, features)."""
    buf = bytearray(struct.pack(FEATURES_FMT, SIZES["struct hybd_ctl_features"],
                                0, 0, 0, 0))
    e = ioctl(ctl.fd, CTL_GET_FEATURES, buf)
    _, abi, feats, _, _ = struct.unpack(FEATURES_FMT, buf)
    return e, abi, feats


def list_ids(ctl, room=MAX_DEVICES):
    """HYBD_CTL_LIST; returns (errno, [ids], count of devices)."""
    ids = (ctypes.c_uint32 * max(room, 1))()
    buf = bytearray(struct.pack(LIST_FMT, SIZES["struct hybd_ctl_list"], room,
                                ctypes.addressof(ids)))
    e = ioctl(ctl.fd, CTL_LIST, buf)
    _, count, _ = struct.unpack(LIST_FMT, buf)
    if e:
        return e, [], 0
    return 0, list(ids[:min(count, room)]), count


def info_state(ctl, dev_id):
    """HYBD_CTL_INFO; returns (errno, state, stats dict)."""
    buf = bytearray(INFO_SIZE)
    struct.pack_into("<II", buf, 0, INFO_SIZE, dev_id)
    e = ioctl(ctl.fd, CTL_INFO, buf)
    if e:
        return e, None, None
    state = struct.unpack_from("<I", buf, 8)[0]
    off = struct.calcsize(INFO_HDR_FMT) + PARAMS_SIZE
    vals = struct.unpack_from(f"<{NR_STATS}Q", buf, off)
    return 0, state, dict(zip(STATS_FIELDS, vals))


def queue_stats(ctl, dev_id, room=MAX_QUEUES):
    """HYBD_CTL_STATS with per-queue counters; returns (errno, [dict per
    queue]) with the counters named as in struct hybd_dev_stats."""
    qbuf = (ctypes.c_char * (QUEUE_STAT_SIZE * room))()
    buf = bytearray(STATS_SIZE)
    struct.pack_into(STATS_HDR_FMT, buf, 0, STATS_SIZE, dev_id, 0, room,
                     ctypes.addressof(qbuf), 0, 0)
    e = ioctl(ctl.fd, CTL_STATS, buf)
    if e:
        return e, None
    nr = struct.unpack_from("<I", buf, 8)[0]
    raw = bytes(qbuf)
    out = []
    for q in range(min(nr, room)):
        vals = struct.unpack_from(f"<{NR_STATS}Q", raw, q * QUEUE_STAT_SIZE)
        out.append(dict(zip(STATS_FIELDS, vals)))
    return 0, out


# C source that prints the header's sizes and ioctl numbers, for the check
# against the tables above.
C_CHECK = r"""
#include <stdio.h>
#include "uapi/hybd.h"
#define S(t) printf("%s %zu\n", #t, sizeof(t));
#define I(n) printf("%s %lu\n", #n, (unsigned long)(n));
int main(void)
{
	S(struct hybd_param_basic) S(struct hybd_param_discard)
	S(struct hybd_params) S(struct hybd_ctl_add) S(struct hybd_ctl_dev)
	S(struct hybd_dev_info) S(struct hybd_ctl_list)
	S(struct hybd_ctl_features) S(struct hybd_ctl_stats)
	S(struct hybd_dev_stats) S(struct hybd_queue_stat)
	S(struct hybd_srv_backing) S(struct hybd_srv_io)
	S(struct hybd_srv_queue_cpus) S(struct hybd_ctl_resize)
	S(struct hybd_srv_resize) S(struct hybd_ring_hdr)
	I(HYBD_CTL_GET_FEATURES) I(HYBD_CTL_ADD) I(HYBD_CTL_DEL)
	I(HYBD_CTL_INFO) I(HYBD_CTL_LIST) I(HYBD_CTL_STATS)
	I(HYBD_CTL_HANDOVER) I(HYBD_CTL_RESIZE) I(HYBD_SRV_ADD_BACKING) I(HYBD_SRV_DEL_BACKING)
	I(HYBD_SRV_REMAP_BARRIER) I(HYBD_SRV_IO) I(HYBD_SRV_QUEUE_CPUS)
	return 0;
}
"""
