# SPDX-License-Identifier: GPL-2.0
"""The fast path and the module's life (runs near the end: the file name
sorts after every other test but test_zz_module.py): an attached program
keeps the module loaded even after its device is gone; without the module,
or with a module that has no BTF, `hybdctl attach` says so instead of
dumping libbpf's errors.  The module is loaded again afterwards."""

import os
import re
import time
from pathlib import Path

import pytest

import hybd_uapi as uapi
from hybdbpf import attach, fastpath, need_bpf, pin_dir, prog, unpin
from hybdlib import (CONTROL, KMOD, T_CMD, assert_data, direct_write,
                     list_devices, need_tool, pattern, run, wait_for)

assert fastpath      # a fixture, used by name

MODULE_BTF = Path("/sys/kernel/btf/hybd")


def loaded():
    return Path("/sys/module/hybd").exists()


def insmod(path=KMOD):
    run(["insmod", path], timeout=T_CMD, check=True)
    wait_for(lambda: os.path.exists(CONTROL), 10, f"{CONTROL} after insmod")


def rmmod(timeout=30):
    """rmmod hybd, retrying while a reference that is going away
    asynchronously (a struct_ops map is freed after an RCU grace period)
    still holds the module.  Returns the last result."""
    deadline = time.monotonic() + timeout
    while True:
        res = run(["rmmod", "hybd"], timeout=T_CMD)
        if res.returncode == 0 or time.monotonic() > deadline:
            return res
        time.sleep(0.5)


@pytest.fixture
def reload_afterwards():
    """Whatever happens, the real module is loaded afterwards."""
    yield
    if loaded() and not MODULE_BTF.exists():
        rmmod()             # the BTF-less copy
    if not loaded():
        insmod()


@pytest.fixture(autouse=True)
def _bpf():
    need_bpf()


def test_attached_program_pins_the_module_until_detached(
        ramdisk, fastpath, reload_afterwards):
    srv = ramdisk(size="16M", queues=1)
    fastpath.attach(prog("cache"), srv.dev)
    srv.stop()          # deletes the device; the pinned link stays
    assert pin_dir(srv.id).exists()
    assert not list_devices()

    res = run(["rmmod", "hybd"], timeout=T_CMD)
    assert res.returncode != 0, "rmmod succeeded with a program attached"
    assert re.search(r"in use|busy", res.stderr, re.I), res.stderr
    assert loaded() and os.path.exists(CONTROL)

    assert unpin(srv.id)
    res = rmmod()
    assert res.returncode == 0, f"rmmod after the unpin: {res.stderr}"
    assert not os.path.exists(CONTROL)

    rc, out, err = attach(prog("cache"), "/dev/hybd0")
    assert rc == 1, f"attach without the module: exit {rc}\n{out}{err}"
    assert re.search(r"module not loaded", err), err
    assert not pin_dir(0).exists()


def test_module_without_btf_attach_says_so(ramdisk, reload_afterwards,
                                           tmp_path):
    objcopy = need_tool("objcopy")
    nobtf = tmp_path / "hybd-nobtf.ko"
    run([objcopy, "--remove-section=.BTF", "--remove-section=.BTF.base",
         KMOD, nobtf], check=True)
    res = rmmod()
    assert res.returncode == 0, f"rmmod: {res.stderr}"
    insmod(str(nobtf))
    assert not MODULE_BTF.exists()

    srv = ramdisk(size="16M", queues=1)
    rc, out, err = attach(prog("cache"), srv.dev)
    assert rc == 1, f"attach without module BTF: exit {rc}\n{out}{err}"
    assert re.search(r"no BTF for the hybd module|no BPF fast path", err), err
    assert not pin_dir(srv.id).exists()
    # the module works without a fast path
    data = pattern("nobtf", 1 << 20)
    direct_write(srv.dev, 0, data)
    assert_data(srv.dev, 0, data, "without a fast path")
    srv.stop()

    # and says so: the kernel registered nothing for a module without BTF
    # (it only warned "missing module BTF, cannot register struct_ops")
    with uapi.Control() as ctl:
        e, _, feats = uapi.features(ctl)
    assert e == 0, uapi.errname(e)
    assert not feats & uapi.F_BPF, (
        "a module without BTF has no fast path, yet it offers HYBD_F_BPF")
    assert not feats & uapi.F_PASS_ZEROES, (
        "a module without a fast path offers HYBD_F_PASS_ZEROES")
