# SPDX-License-Identifier: GPL-2.0
"""Module unload and reload (runs last: the file name sorts last).  rmmod
is refused while anything uses the module and changes nothing then; with
only server-less (added or dead) devices left, rmmod tears them down and
insmod works again.  The module is left loaded for the runner's own final
rmmod check."""

import os
import re
from pathlib import Path

import pytest

from hybdlib import (CONTROL, KMOD, T_CMD, add_device, assert_data,
                     direct_write, info, list_devices, pattern, run, wait_for)

MiB = 1 << 20


def loaded():
    return Path("/sys/module/hybd").exists()


def insmod():
    run(["insmod", KMOD], timeout=T_CMD, check=True)
    wait_for(lambda: os.path.exists(CONTROL), 10, f"{CONTROL} after insmod")


@pytest.fixture
def keep_loaded():
    """Whatever happens, the module is loaded again afterwards."""
    yield
    if not loaded():
        insmod()


def assert_rmmod_refused():
    res = run(["rmmod", "hybd"], timeout=T_CMD)
    assert res.returncode != 0, "rmmod succeeded while the module was in use"
    assert re.search(r"in use|busy", res.stderr, re.I), res.stderr
    assert loaded() and os.path.exists(CONTROL)


def test_rmmod_is_refused_while_a_server_runs(ramdisk, keep_loaded):
    srv = ramdisk(size="16M")
    data = pattern("rmmod", MiB)
    direct_write(srv.dev, 0, data)

    assert_rmmod_refused()

    assert info(srv.dev)["state"] == "live"
    assert_data(srv.dev, 0, data, "after the refused rmmod")
    more = pattern("rmmod2", MiB)
    direct_write(srv.dev, 2 * MiB, more)
    assert_data(srv.dev, 2 * MiB, more, "written after the refused rmmod")
    srv.stop()


def test_rmmod_is_refused_while_the_control_node_is_open(keep_loaded):
    fd = os.open(CONTROL, os.O_RDWR)
    try:
        assert_rmmod_refused()
    finally:
        os.close(fd)


def test_rmmod_tears_down_serverless_devices_and_insmod_works_again(
        ramdisk, added_devices, keep_loaded):
    dead = ramdisk(size="16M")
    dead.kill()
    wait_for(lambda: info(dead.id)["state"] == "dead", 10, "state dead")
    added = [add_device("--size", "16M"),
             add_device("--size", "32M", "--queues", "2")]
    added_devices.extend(added)
    assert {info(i)["state"] for i in added} == {"added"}

    res = run(["rmmod", "hybd"], timeout=120)
    assert res.returncode == 0, f"rmmod: {res.stderr}"
    wait_for(lambda: not loaded(), 10, "/sys/module/hybd to go")
    assert not os.path.exists(CONTROL)
    assert not os.path.exists(dead.dev)
    assert not list(Path("/sys/block").glob("hybd*"))

    insmod()
    assert list_devices() == []
    srv = ramdisk(size="16M")
    data = pattern("reloaded", MiB)
    direct_write(srv.dev, 0, data)
    assert_data(srv.dev, 0, data, "after reload")
    counters = srv.stop()
    assert counters["writes"] > 0, counters
