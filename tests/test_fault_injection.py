# SPDX-License-Identifier: GPL-2.0
"""The kernel's allocations in a device's bring-up, each failed once.

Every allocation the module makes (or makes the block layer make) while a
device is added or given a backing target can fail.  These tests fail
them one at a time, through the kernel's fault injection
(/proc/thread-self/fail-nth, armed around one ioctl by the
tests/helpers/failnth.so preload), and check that each failure unwinds:
the program gets a clear error and exits, no device is left behind, a
device whose call survived the failure works, and the kernel log stays
clean (the run's kernel-log check; kmemleak finds no leak in
test_zz_module).  The walk ends when the call makes fewer allocations than
the one to fail.

Not covered: HYBD_SRV_START's allocations (add_disk) and a delete's run
in the module's workers (hybd_wq), where a per-task injection armed in the
caller never reaches; their error paths are the block layer's.

An injected failure is not silent: the allocator may log "page allocation
failure" or "vmalloc error" with a stack ("Call Trace:"), which these tests
expect; a WARNING, BUG or KASAN report still fails them.

Fault injection is in the debug kernel only (CONFIG_FAULT_INJECTION,
FAILSLAB, FAIL_PAGE_ALLOC: tools/debug-kernel.config): `make test-debug`
runs these tests; on Debian's kernel they are skipped.
"""
import os
import subprocess
from pathlib import Path

import pytest

import hybd_uapi as uapi
from hybdlib import (HYBDCTL, LOOP, REPO, device_ids, direct_read,
                     direct_write, need_built, pattern, reap, run, wait_for)

FAILNTH = REPO / "tests" / "helpers" / "failnth.so"
DEBUGFS = Path("/sys/kernel/debug")
# the allocators' knobs: by default both skip allocations that may sleep
# (nearly all of the module's) and the page allocator skips order 0; and
# each injected failure would log its stack
KNOBS = {"failslab/ignore-gfp-wait": "N",
         "failslab/verbose": "0",
         "fail_page_alloc/ignore-gfp-wait": "N",
         "fail_page_alloc/ignore-gfp-highmem": "N",
         "fail_page_alloc/min-order": "0",
         "fail_page_alloc/verbose": "0"}
# what a failed allocation may log (warn_alloc) besides the failure itself
ALLOC_FAILURE_LOG = r"Call Trace:"
# a walk is a few hundred adds under KASAN and TCG: minutes, more when
# the host is busy (600 s ran out once with two other guests beside it)
pytestmark = [pytest.mark.kmsg_allow(ALLOC_FAILURE_LOG),
              pytest.mark.time_limit(1800)]
# no call of the bring-up makes nearly this many allocations
MAX_NTH = 3000
BOOT_WAIT = 60


@pytest.fixture(scope="module")
def injection():
    """The allocators set to honour fail-nth for every allocation; put
    back afterwards."""
    if not Path("/proc/self/fail-nth").exists():
        pytest.skip("no fault injection in this kernel (CONFIG_FAULT_INJECTION"
                    "): `make test-debug` runs these tests")
    if not (DEBUGFS / "failslab").is_dir():
        subprocess.run(["mount", "-t", "debugfs", "none", str(DEBUGFS)],
                       check=False)
    saved = {}
    for knob, value in KNOBS.items():
        path = DEBUGFS / knob
        assert path.exists(), f"{path}: the debug kernel lacks FAILSLAB or " \
                              "FAIL_PAGE_ALLOC"
        saved[path] = path.read_text().strip()
        path.write_text(value)
    need_built(FAILNTH, "tests/helpers/failnth.so")
    yield
    for path, value in saved.items():
        path.write_text(value)


def armed_env(tmp_path, request, nth):
    report = tmp_path / "report"
    report.unlink(missing_ok=True)
    env = dict(os.environ, LD_PRELOAD=str(FAILNTH),
               HYBD_FAIL_IOCTL=str(request), HYBD_FAIL_NTH=str(nth),
               HYBD_FAIL_REPORT=str(report))
    return env, report


def outcome(report):
    """What the preload saw: "injected" or "not-reached"."""
    assert report.exists(), "the armed ioctl was never made"
    return report.read_text()


def check_works(dev):
    """A device that came up despite a failure serves I/O."""
    data = pattern(7, 64 << 10)
    direct_write(dev, 1 << 20, data)
    assert direct_read(dev, 1 << 20, len(data)) == data


def start_server(cmd, env):
    """Run a server until it is ready or exits: (proc, dev or None, err).
    What it prints before "ready" (hybd-loop's "backing target 0") is
    passed over."""
    proc = subprocess.Popen([str(c) for c in cmd], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:          # "ready /dev/hybdN", or EOF on exit
        if line.startswith("ready "):
            return proc, line.split()[1], ""
    try:
        _, err = proc.communicate(timeout=BOOT_WAIT)
    except subprocess.TimeoutExpired:
        reap(proc)
        pytest.fail(f"{cmd}: neither ready nor gone after {BOOT_WAIT}s")
    return proc, None, err


def stop_server(proc, dev):
    proc.terminate()
    try:
        proc.wait(timeout=BOOT_WAIT)
    except subprocess.TimeoutExpired:
        reap(proc)
        pytest.fail(f"the server of {dev} did not stop")
    assert proc.returncode == 0, f"the server of {dev} exited {proc.returncode}"
    wait_for(lambda: not os.path.exists(dev), 10, f"{dev} to go")


def walk(tmp_path, request, attempt):
    """attempt(env) for nth = 1, 2, ... until the call reaches no nth
    point; returns (points failed, of which the call still succeeded)."""
    before = sorted(device_ids())
    survived = 0
    for nth in range(1, MAX_NTH + 1):
        env, report = armed_env(tmp_path, request, nth)
        ok = attempt(env)
        assert sorted(device_ids()) == before, \
            f"nth={nth}: the devices changed: {before} -> {device_ids()}"
        if outcome(report) == "not-reached":
            assert ok, f"nth={nth}: failed with no failure injected"
            return nth - 1, survived
        survived += ok
    pytest.fail(f"more than {MAX_NTH} allocations in one call")


def test_add_unwinds_every_failed_allocation(injection, tmp_path):
    def attempt(env):
        # small rings: each of their pages is an allocation to fail
        res = run([HYBDCTL, "add", "--size", "16M", "--queues", "2",
                   "--depth", "2", "--max-io", "4k"], env=env)
        if res.returncode == 0:
            dev_id = int(res.stdout)
            assert run([HYBDCTL, "del", str(dev_id)]).returncode == 0
            return True
        assert res.returncode == 1 and res.stderr.startswith("hybdctl: add:"), \
            f"exit {res.returncode}: {res.stderr}"
        return False

    points, survived = walk(tmp_path, uapi.CTL_ADD, attempt)
    print(f"HYBD_CTL_ADD: {points} allocations failed one by one, "
          f"{survived} survived")
    assert points > 0


def server_attempt(cmd):
    def attempt(env):
        proc, dev, err = start_server(cmd, env)
        if dev:
            check_works(dev)
            stop_server(proc, dev)
            return True
        assert proc.returncode not in (0, None) and err.strip(), \
            f"exit {proc.returncode} without a reason: {err!r}"
        return False
    return attempt


def test_add_backing_unwinds_every_failed_allocation(injection, tmp_path):
    target = tmp_path / "target"
    with open(target, "wb") as f:
        f.truncate(16 << 20)
    cmd = [LOOP, "--remap", "--depth", "2", "--max-io", "4k", target]
    points, survived = walk(tmp_path, uapi.SRV_ADD_BACKING,
                            server_attempt(cmd))
    print(f"HYBD_SRV_ADD_BACKING: {points} allocations failed one by one, "
          f"{survived} survived")
    assert points > 0
