# SPDX-License-Identifier: GPL-2.0
"""Fuzz the control node and the server node (tests/helpers/fuzz.py) while
fio runs on the device: every call gets 0 or an errno, every request ends
exactly once, a delete racing the server's exit finishes, and a normal
device works afterwards.  The seed is printed; HYBD_FUZZ_SEED=N replays
it.  10,000 calls per run, 100,000 in `make test-long`."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hybdlib import (LONG, T_CMD, as_user, T_STOP, device_ids, fio_verify, hybdctl,
                     info, need_tool, reap, record, stack_of, state_of,
                     wait_for)

FUZZ = Path(__file__).parent / "helpers" / "fuzz.py"
CALLS = int(os.environ.get("HYBD_FUZZ_CALLS", 100_000 if LONG else 10_000))
# the fuzz completes some requests with errors, and lets some time out
IO_ERRORS = (r"I/O error|Buffer I/O|lost (async )?page write|"
             r"writeback error|critical target error|timeout error")


def read_line(proc, prefix, timeout):
    """The next stdout line of proc that starts with prefix."""
    box = {}

    def reader():
        for line in proc.stdout:
            if line.startswith(prefix):
                box["line"] = line.strip()
                return
            box.setdefault("other", []).append(line)
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if "line" not in box:
        stacks = []
        for task in Path(f"/proc/{proc.pid}/task").glob("*"):
            stacks.append(f"thread {task.name} ({state_of(int(task.name))}):"
                          f"\n{stack_of(int(task.name))}")
        reap(proc)
        pytest.fail(f"fuzz.py: no '{prefix}' line within {timeout}s "
                    f"(exit status {proc.returncode}); stdout "
                    f"{box.get('other')} stderr {proc.stderr.read()}"
                    f"\n" + "\n".join(stacks), pytrace=False)
    return box["line"], box.get("other", [])


@pytest.fixture
def fuzzer(request):
    """How fuzz.py runs: as root, or as a user without any capability
    whom the control node lets in (an unprivileged device)."""
    if request.param == "root":
        return [sys.executable, FUZZ], None
    request.getfixturevalue("open_control")
    return (as_user(4242, [sys.executable, FUZZ]),
            dict(os.environ, HYBD_FUZZ_UNPRIV="1"))


@pytest.mark.time_limit(2400 if LONG else 900)
@pytest.mark.kmsg_allow(IO_ERRORS)
@pytest.mark.parametrize("fuzzer", ["root", "unprivileged"], indirect=True)
def test_fuzz_nodes_under_io(ramdisk, fuzzer):
    seed = int(os.environ.get("HYBD_FUZZ_SEED", time.time_ns() % 2**32))
    print(f"fuzz seed {seed} (HYBD_FUZZ_SEED={seed} replays it)")
    fio_exe = need_tool("fio")
    cmd, env = fuzzer
    proc = subprocess.Popen([*cmd, str(seed), str(CALLS)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    load = None
    try:
        line, _ = read_line(proc, "dev ", T_CMD)
        dev_id = int(line.split()[1])
        dev = f"/dev/hybd{dev_id}"
        read_line(proc, "started ", 60 + CALLS * 0.01)
        wait_for(lambda: os.path.exists(dev), T_CMD, f"{dev} to appear")
        load = subprocess.Popen(
            [fio_exe, "--name=fuzzload", f"--filename={dev}", "--direct=1",
             "--ioengine=libaio", "--iodepth=32", "--numjobs=2",
             "--rw=randrw", "--bs=4k", "--time_based", "--runtime=3600",
             "--continue_on_error=all", "--group_reporting"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp")
        wait_for(lambda: info(dev)["stats"]["slow_done"] > 256, T_CMD,
                 "fio's I/O to flow")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line, _ = read_line(proc, "fuzzed ", 60 + CALLS * 0.06)
        print(line)
        record(f"fuzz seed {seed}", line)
        if " bad 0:" not in line:
            proc.stdin.close()      # it prints its findings and exits
            out, _ = proc.communicate(timeout=T_CMD)
            pytest.fail(f"seed {seed}: {line}\n{out}", pytrace=False)
        calls = int(line.split()[1])
        assert calls >= CALLS, line

        # the server now completes everything correctly: fio stops, and
        # every request it issued has ended
        load.terminate()
        assert load.wait(T_STOP) is not None
        inflight = Path(f"/sys/block/hybd{dev_id}/inflight")
        wait_for(lambda: inflight.read_text().split() == ["0", "0"], T_CMD,
                 f"no request of {dev} in flight")
        s = info(dev)["stats"]
        rej = sum(s[k] for k in s if k.startswith("rej_"))
        assert rej > 0, f"seed {seed}: the garbage was never seen: {s}"
        # each request the server got ended once: completed, or failed by
        # the I/O timeout (the fuzz leaves some without a valid answer)
        assert s["slow_issued"] == s["slow_done"] + s["timed_out"], (
            f"seed {seed}: {s}")

        # a delete racing the server's exit
        deleter = threading.Thread(
            target=lambda: hybdctl("del", "--force", dev, timeout=T_CMD))
        deleter.start()
        proc.kill()
        deleter.join(T_CMD)
        assert not deleter.is_alive(), "the delete did not return"
        wait_for(lambda: dev_id not in device_ids(), T_CMD, f"{dev} gone")
    finally:
        if load is not None:
            reap(load)
        reap(proc)

    # and a normal device works
    srv = ramdisk(size="32M", queues=2)
    fio_verify(srv.dev, "4k", "8M", 2)
    srv.stop()
