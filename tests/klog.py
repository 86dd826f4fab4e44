# SPDX-License-Identifier: GPL-2.0
"""The kernel log: which lines mean the kernel is unwell, and a reader.

Used by conftest.py (a check around every test) and by the guest runner
(tools/guest/run.sh: a scan of the whole boot's log after the suite):

    python3 tests/klog.py LOG [ALLOWED]

prints the bad lines of LOG (dmesg output) and exits 1 if there are any.
ALLOWED holds lines that tests declared they cause (kmsg_allow); as many
occurrences of each message as it lists are not counted.
"""

import os
import re
import sys

# (name, regex): a line matching any of these fails the test it appeared in,
# and the run (the guest runner's final scan uses the same list).  The
# generic ones (BUG, WARNING) already match most reports; the debug
# kernel's (tools/debug-kernel: KASAN, lockdep, KFENCE, UBSAN, kmemleak) are
# named too, so that a report's first line says what it is even when the
# kernel words it without BUG/WARNING.
PATTERNS = [
    ("BUG", r"\bBUG\b"),
    ("WARNING", r"\bWARNING\b"),
    ("Oops", r"\bOops\b"),
    ("KASAN", r"BUG: KASAN|\bKASAN: "),
    ("KFENCE", r"\bKFENCE\b"),
    ("UBSAN", r"\bUBSAN\b"),
    ("lockdep", r"possible circular locking dependency|"
                r"inconsistent lock state|possible recursive locking|"
                r"possible irq lock inversion|"
                r"lock held when returning to user space|"
                r"bad unlock balance|held lock freed|"
                r"lock\(s\) held by .* at exit|"
                r"INFO: lockdep is turned off|"
                r"DEBUG_LOCKS_WARN_ON"),
    ("RCU", r"suspicious RCU usage|RCU used illegally"),
    ("atomic sleep", r"sleeping function called from invalid context|"
                     r"scheduling while atomic"),
    ("kmemleak", r"unreferenced object 0x|"
                 r"kmemleak: \d+ new suspected memory leaks"),
    ("hung task", r"hung task|blocked for more than \d+ seconds"),
    ("soft lockup", r"soft lockup"),
    ("hard lockup", r"hard LOCKUP"),
    ("RCU stall", r"self-detected stall|detected stalls? on CPU|RCU stall"),
    ("general protection fault", r"general protection fault"),
    ("NULL dereference", r"kernel NULL pointer"),
    ("paging request", r"unable to handle page fault|unable to handle kernel paging"),
    ("list corruption", r"list_(add|del) corruption"),
    ("refcount", r"refcount_t: "),
    ("panic", r"Kernel panic"),
    ("Call Trace", r"Call Trace"),
]

BAD_RE = re.compile("|".join(f"(?:{rx})" for _, rx in PATTERNS))


_TS_RE = re.compile(r"^\[\s*\d+\.\d+\] ")


def message(line):
    """A log line without its [seconds.micros] timestamp."""
    return _TS_RE.sub("", line, count=1)


def bad_lines(lines, allow=()):
    """The lines that match a pattern and none of the `allow` regexes."""
    allow_re = [re.compile(a) for a in allow]
    return [l for l in lines
            if BAD_RE.search(l) and not any(a.search(l) for a in allow_re)]


class Kmsg:
    """Reads the kernel log records written after it was opened.

    /dev/kmsg gives one record per read(); each opener has its own position,
    so tests and the guest runner do not disturb each other.
    """

    def __init__(self):
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)
        self.lost = 0

    def read_new(self):
        """The messages logged since the last call, as text lines."""
        lines = []
        while True:
            try:
                rec = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:
                # records were overwritten before we read them
                self.lost += 1
                continue
            if not rec:
                break
            text = rec.decode("utf-8", "replace")
            head, _, msg = text.partition(";")
            # continuation lines (" KEY=value") carry device metadata only
            msg = msg.split("\n", 1)[0]
            fields = head.split(",")
            ts = ""
            if len(fields) >= 3 and fields[2].isdigit():
                usec = int(fields[2])
                ts = f"[{usec // 1000000:5d}.{usec % 1000000:06d}] "
            lines.append(ts + msg)
        return lines

    def close(self):
        os.close(self.fd)


def _read_lines(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def main(argv):
    if len(argv) not in (2, 3):
        print(f"usage: {argv[0]} LOG [ALLOWED]", file=sys.stderr)
        return 2
    bad = bad_lines(_read_lines(argv[1]))
    if len(argv) == 3 and os.path.exists(argv[2]):
        budget = {}
        for line in _read_lines(argv[2]):
            budget[message(line)] = budget.get(message(line), 0) + 1
        left = []
        for line in bad:
            if budget.get(message(line), 0) > 0:
                budget[message(line)] -= 1
            else:
                left.append(line)
        bad = left
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
