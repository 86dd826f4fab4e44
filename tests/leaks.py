# SPDX-License-Identifier: GPL-2.0
"""What a test can leave behind, and how to take it away again.

conftest.py snapshots these before every test and compares after it (the
`leaks` fixture):

- hybd devices (HYBD_CTL_LIST on /dev/hybd-control);
- server processes: a ramdisk or badserver, or any process that holds a
  /dev/hybd* node open (a server's /dev/hybdN-srv, a block device, the
  control node) -- the pytest process itself included;
- BPF: pins under /sys/fs/bpf/hybd/, and struct_ops maps and links (read
  with the bpf() syscall: nothing else in the guest uses struct_ops, and
  `bpftool struct_ops list` crashed there);
- mounts of a /dev/hybd* device;
- the module's reference count, while it is the same module instance.

Everything is read straight from /proc, /sys and the kernel, so a snapshot
costs no process start (a second under TCG).
"""

import ctypes
import errno
import os
import signal
import struct
import time
from pathlib import Path

import hybd_uapi as uapi
from hybdlib import BADSERVER, CONTROL, DEDUP, ENCRYPT, LOOP, RAMDISK

PIN_ROOT = Path("/sys/fs/bpf/hybd")
MODULE = Path("/sys/module/hybd")
SERVERS = {os.path.realpath(p)
           for p in (RAMDISK, BADSERVER, DEDUP, ENCRYPT, LOOP)}

# include/uapi/linux/bpf.h
NR_BPF = 321                        # x86-64
BPF_MAP_GET_NEXT_ID, BPF_MAP_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD = 12, 14, 15
BPF_LINK_GET_FD_BY_ID, BPF_LINK_GET_NEXT_ID = 30, 31
BPF_MAP_TYPE_STRUCT_OPS, BPF_LINK_TYPE_STRUCT_OPS = 26, 9
MAP_INFO_SIZE = 88                  # struct bpf_map_info
MAP_NAME_OFF = 24
LINK_INFO_SIZE = 64                 # struct bpf_link_info, the part we read
LINK_MAP_ID_OFF = 16                # .struct_ops.map_id

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd, attr):
    """bpf(cmd, attr) on a bytearray; (return value, errno)."""
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    ret = _libc.syscall(ctypes.c_long(NR_BPF), ctypes.c_long(cmd), buf,
                        ctypes.c_long(len(attr)))
    return ret, (ctypes.get_errno() if ret < 0 else 0)


def _ids(next_cmd):
    out, start = [], 0
    while True:
        attr = bytearray(struct.pack("<III", start, 0, 0))
        ret, _ = _bpf(next_cmd, attr)
        if ret < 0:
            return out
        start = struct.unpack_from("<I", attr, 4)[0]
        out.append(start)


def _info(fd_cmd, obj_id, size):
    """The object's bpf_*_info (size bytes), or None if it is gone."""
    fd, _ = _bpf(fd_cmd, bytearray(struct.pack("<III", obj_id, 0, 0)))
    if fd < 0:
        return None
    try:
        info = ctypes.create_string_buffer(size)
        attr = bytearray(struct.pack("<IIQ", fd, size, ctypes.addressof(info)))
        ret, _ = _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
        return info.raw if ret == 0 else None
    finally:
        os.close(fd)


def struct_ops_maps():
    """{map id: name} of the struct_ops maps that exist."""
    out = {}
    for map_id in _ids(BPF_MAP_GET_NEXT_ID):
        info = _info(BPF_MAP_GET_FD_BY_ID, map_id, MAP_INFO_SIZE)
        if info and struct.unpack_from("<I", info)[0] == BPF_MAP_TYPE_STRUCT_OPS:
            name = info[MAP_NAME_OFF:MAP_NAME_OFF + 16].split(b"\0", 1)[0]
            out[map_id] = name.decode(errors="replace")
    return out


def struct_ops_links():
    """{link id: struct_ops map id} of the struct_ops links that exist."""
    out = {}
    for link_id in _ids(BPF_LINK_GET_NEXT_ID):
        info = _info(BPF_LINK_GET_FD_BY_ID, link_id, LINK_INFO_SIZE)
        if info and struct.unpack_from("<I", info)[0] == BPF_LINK_TYPE_STRUCT_OPS:
            out[link_id] = struct.unpack_from("<I", info, LINK_MAP_ID_OFF)[0]
    return out


# ----------------------------------------------------------------- snapshot

def _starttime(pid):
    """A process's start time (field 22 of /proc/PID/stat): with the pid, an
    identity that survives pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def processes():
    """{(pid, start time): description} of server processes and of every
    process holding a /dev/hybd* node open."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        pid = int(p.name)
        what = []
        try:
            exe = os.readlink(p / "exe")
        except OSError:
            exe = ""        # a kernel thread, a zombie, or gone
        if exe in SERVERS:
            what.append(os.path.basename(exe))
        try:
            fds = list((p / "fd").iterdir())
        except OSError:
            fds = []
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("/dev/hybd"):
                what.append(f"fd {fd.name} -> {target}")
        if what:
            key = (pid, _starttime(pid))
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ")
                cmd = cmd.decode(errors="replace").strip()
            except OSError:
                cmd = "?"
            out[key] = f"pid {pid} ({cmd}): {', '.join(what)}"
    return out


def devices():
    """The ids of the hybd devices, [] without the module."""
    if not os.path.exists(CONTROL):
        return []
    try:
        with uapi.Control() as ctl:
            e, ids, _ = uapi.list_ids(ctl)
    except OSError:
        return []
    return sorted(ids) if e == 0 else []


def pins():
    try:
        return sorted(str(p.relative_to(PIN_ROOT)) for p in PIN_ROOT.rglob("*"))
    except OSError:
        return []


def mounts():
    """{mount point: source} of the mounts of /dev/hybd* devices."""
    out = {}
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2 and fields[0].startswith("/dev/hybd"):
                out[fields[1].replace("\\040", " ")] = fields[0]
    return out


def module_refs():
    """(module instance, reference count), None without the module.  The
    instance is the inode of /sys/module/hybd, new at every insmod."""
    try:
        ino = MODULE.stat().st_ino
        return ino, int((MODULE / "refcnt").read_text())
    except (OSError, ValueError):
        return None


def snapshot():
    return {
        "devices": devices(),
        "processes": processes(),
        "pins": pins(),
        "struct_ops maps": struct_ops_maps(),
        "struct_ops links": struct_ops_links(),
        "mounts": mounts(),
        "module": module_refs(),
    }


def _new(before, after):
    """What `after` has that `before` had not (lists and dicts)."""
    if isinstance(after, dict):
        return {k: v for k, v in after.items() if k not in before}
    return [x for x in after if x not in before]


def compare(before, after):
    """{what: left behind} between two snapshots; {} if nothing."""
    left = {}
    for key in before:
        if key == "module":
            continue
        new = _new(before[key], after[key])
        if new:
            left[key] = new
    b, a = before["module"], after["module"]
    if b and a and b[0] == a[0] and a[1] > b[1]:
        left["module"] = f"reference count {b[1]} -> {a[1]}"
    return left


def settled(before, timeout=5.0):
    """Compare with `before` until nothing is left or timeout passes: a
    struct_ops map goes after an RCU grace period, a process after its
    parent reaped it.  Returns the last comparison."""
    deadline = time.monotonic() + timeout
    while True:
        left = compare(before, snapshot())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


# ------------------------------------------------------------------ cleanup

MNT_DETACH = 2


def _gone(pid, start):
    return _starttime(pid) != start


def cleanup(before, left):
    """Take away what `left` (from compare) lists: kill the processes,
    close our own descriptors, unmount, unpin, delete the devices.
    Returns what could not be taken away (a description per item)."""
    stuck = []
    me = os.getpid()
    for (pid, start), what in left.get("processes", {}).items():
        if pid == me:
            for fd in Path("/proc/self/fd").iterdir():
                try:
                    if os.readlink(fd).startswith("/dev/hybd"):
                        os.close(int(fd.name))
                except OSError:
                    pass
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)      # our child: reap it
        except ChildProcessError:
            pass
    deadline = time.monotonic() + 10
    for (pid, start), what in left.get("processes", {}).items():
        while pid != me and not _gone(pid, start):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if time.monotonic() > deadline:
                stuck.append(f"would not die: {what}")
                break
            time.sleep(0.1)

    for target in left.get("mounts", {}):
        if _libc.umount2(target.encode(), MNT_DETACH) != 0:
            stuck.append(f"umount {target}: {os.strerror(ctypes.get_errno())}")

    for pin in sorted(left.get("pins", []), reverse=True):
        path = PIN_ROOT / pin
        try:
            path.rmdir() if path.is_dir() else path.unlink()
        except OSError as e:
            stuck.append(f"unpin {path}: {e}")

    if left.get("devices") and os.path.exists(CONTROL):
        with uapi.Control() as ctl:
            for dev_id in left["devices"]:
                e = uapi.delete(ctl, dev_id)
                if e and e != errno.ENODEV:
                    stuck.append(f"delete hybd{dev_id}: {uapi.errname(e)}")

    still = settled(before)
    for key, what in still.items():
        stuck.append(f"{key} still there after the cleanup: {what}")
    return stuck


def describe(left):
    out = []
    for key, what in left.items():
        if isinstance(what, dict):
            items = [f"{k}: {v}" if key != "processes" else v
                     for k, v in what.items()]
        elif isinstance(what, list):
            items = [str(x) for x in what]
        else:
            items = [str(what)]
        out.append(f"{key}: " + "; ".join(items))
    return "\n  ".join(out)
