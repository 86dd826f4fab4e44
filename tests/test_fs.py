# SPDX-License-Identifier: GPL-2.0
"""A real file system on a hybd device: ext4 made, filled, checked and read
back across a remount, with the journal's flushes reaching the server."""

import hashlib
import os
import random
import shutil
from pathlib import Path

import pytest

from hybdlib import T_IO, info, need_tool, run


def make_tree(root, seed=1, files=100):
    """Nested directories of files with random sizes and contents, plus a
    copy of /usr/include/linux if there is one."""
    rng = random.Random(seed)
    for i in range(files):
        d = root / f"d{i % 7}" / f"e{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        size = rng.choice([0, 1, 511, 4096, 4097, 65536, 200000,
                           rng.randrange(512 << 10)])
        (d / f"f{i}.bin").write_bytes(rng.randbytes(size))
    os.symlink("d0/e0/f0.bin", root / "link")
    if Path("/usr/include/linux").is_dir():
        shutil.copytree("/usr/include/linux", root / "linux", symlinks=True)


def digest_tree(root):
    """{relative path: sha256 (files) or link target or 'dir'}."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if rel == "lost+found" or rel.startswith("lost+found/"):
                continue
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def mountpoint(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    if os.path.ismount(mnt):
        run(["umount", "-l", mnt], timeout=T_IO)


def test_ext4_tree_survives_unmount_fsck_and_remount(ramdisk, tmp_path, mountpoint):
    mkfs = need_tool("mkfs.ext4")
    fsck = need_tool("fsck.ext4")
    srv = ramdisk(size="128M")

    src = tmp_path / "src"
    make_tree(src)
    want = digest_tree(src)
    assert len(want) > 100

    # no lazy init: the inode tables and journal are written now, through
    # the server, instead of by a kernel thread after mount
    run([mkfs, "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0",
         srv.dev], timeout=T_IO, check=True)
    run(["mount", "-t", "ext4", srv.dev, mountpoint], timeout=T_IO, check=True)
    run(["cp", "-a", f"{src}/.", mountpoint], timeout=T_IO, check=True)
    assert digest_tree(mountpoint) == want
    run(["umount", mountpoint], timeout=T_IO, check=True)

    res = run([fsck, "-fn", srv.dev], timeout=T_IO)
    assert res.returncode == 0, f"fsck exit {res.returncode}\n{res.stdout}{res.stderr}"

    # read back from the device, not from the page cache of the first mount
    run(["blockdev", "--flushbufs", srv.dev], timeout=T_IO, check=True)
    run(["mount", "-t", "ext4", "-o", "ro", srv.dev, mountpoint], timeout=T_IO,
        check=True)
    got = digest_tree(mountpoint)
    missing = sorted(set(want) - set(got))[:5]
    changed = sorted(k for k in want if k in got and got[k] != want[k])[:5]
    assert got == want, f"missing {missing}, changed {changed}"
    run(["umount", mountpoint], timeout=T_IO, check=True)

    s = info(srv.dev)["stats"]
    assert s["flushes"] + s["fua"] > 0, "the journal's cache flushes never arrived"
    assert s["slow_errors"] == 0
    counters = srv.stop()
    assert counters["writes"] > 0 and counters["reads"] > 0, counters
