# SPDX-License-Identifier: GPL-2.0
"""What every part of the harness uses: the repository's path, the
errors, messages, running a command and waiting for something."""

import subprocess
import time
from pathlib import Path


# the repository (this file is tools/bench/common.py)
REPO = Path(__file__).resolve().parent.parent.parent


class BenchError(Exception):
    """A step failed; the message says which and why."""


class Unsupported(BenchError):
    """A line this guest cannot have (its kernel or rublk lacks a feature
    the line is about): not measured, with the reason, and not a failure
    of the run."""


class Stop(BaseException):
    """SIGTERM (e.g. the guest runner's timeout): clean up and exit."""


def say(msg):
    print(f"bench: {msg}", flush=True)


def run(cmd, timeout=60, check=True):
    """Run cmd (a list); returns the CompletedProcess (text output)."""
    cmd = [str(c) for c in cmd]
    try:
        res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(cmd)}: no answer after {timeout}s") from None
    except OSError as e:
        raise BenchError(f"{cmd[0]}: {e.strerror}") from None
    if check and res.returncode != 0:
        raise BenchError(f"{' '.join(cmd)}: exit {res.returncode}: "
                         f"{last_lines(res)}")
    return res


def last_lines(res, n=3):
    """The end of a command's output, on one line, for an error message."""
    text = res.stderr.strip() or res.stdout.strip()
    return " | ".join(ln.strip() for ln in text.splitlines()[-n:]
                      if ln.strip()) or "(no output)"


def wait_until(pred, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def read_text(path):
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None
