# SPDX-License-Identifier: GPL-2.0
"""The kernel log: which lines mean the kernel is unwell, and a reader.

Used by conftest.py (a check around every test) and by the guest runner
(tools/guest/run.sh: a scan of the whole boot's log after the suite):

    python3 tests/klog.py LOG [ALLOWED]

prints the bad lines of LOG (dmesg output) and exits 1 if there are any.
ALLOWED holds lines that tests declared they cause (kmsg_allow); as many
occurrences of each message as it lists are not counted.

    python3 tests/klog.py follow LOG LOST END_MARKER

streams the whole kernel log, from the boot's first record, into LOG until
a record reads END_MARKER, then writes the count of lost records to LOST
(see follow()).
"""

import os
import re
import select
import signal
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


_ESC_RE = re.compile(r"\\x([0-9a-f]{2})")


def parse_record(rec):
    """One /dev/kmsg record ("prio,seq,usec,flags;message\n KEY=value...")
    -> (seq, [lines as dmesg prints them]).  The kernel escapes unprintable
    bytes as \\xNN; a message with newlines gives several lines."""
    text = rec.decode("utf-8", "replace")
    head, _, msg = text.partition(";")
    # continuation lines (" KEY=value") carry device metadata only
    msg = msg.split("\n", 1)[0]
    msg = _ESC_RE.sub(lambda m: chr(int(m.group(1), 16)), msg)
    fields = head.split(",")
    seq = int(fields[1]) if len(fields) >= 2 and fields[1].isdigit() else None
    ts = ""
    if len(fields) >= 3 and fields[2].isdigit():
        usec = int(fields[2])
        ts = f"[{usec // 1000000:5d}.{usec % 1000000:06d}] "
    return seq, [ts + part for part in msg.split("\n")]


class Kmsg:
    """Reads the kernel log records written after it was opened.

    /dev/kmsg gives one record per read(); each opener has its own position,
    so tests and the guest runner do not disturb each other.  Records that
    the kernel overwrote before we read them (the log buffer is a ring) are
    counted in .lost: read() fails with EPIPE once, and the sequence numbers
    of the records around the hole tell how many went.
    """

    def __init__(self):
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)
        self.lost = 0
        self._next_seq = None
        self._pipe = False

    def _count(self, seq):
        """Account for a record with sequence number seq."""
        gap = 0
        if seq is not None and self._next_seq is not None:
            gap = max(seq - self._next_seq, 0)
        if self._pipe:
            gap = max(gap, 1)
            self._pipe = False
        self.lost += gap
        if seq is not None:
            self._next_seq = seq + 1

    def read_record(self, block=False):
        """The next record's lines, [] if none is there (non-blocking)."""
        while True:
            try:
                rec = os.read(self.fd, 16384)
            except BlockingIOError:
                if not block:
                    return None
                select.select([self.fd], [], [])
                continue
            except BrokenPipeError:
                self._pipe = True
                continue
            if not rec:
                return None
            seq, lines = parse_record(rec)
            self._count(seq)
            return lines

    def read_new(self):
        """The messages logged since the last call, as text lines."""
        lines = []
        while True:
            rec = self.read_record()
            if rec is None:
                break
            lines += rec
        return lines

    def close(self):
        os.close(self.fd)


def follow(log_path, lost_path, end_marker):
    """Copy the kernel log, from the first record of the boot, to log_path
    until a record reading end_marker (which the guest runner writes to
    /dev/kmsg when it is done), then write to lost_path how many records
    were lost: overwritten before we read them, including any of the boot's
    first records that were gone before we started (the first record is
    number 0).  SIGTERM ends it the same way, without the marker."""
    k = Kmsg()
    # opened at the end; the first record still in the buffer instead
    os.lseek(k.fd, 0, os.SEEK_SET)
    os.set_blocking(k.fd, True)
    k._next_seq = 0
    stopped = []

    def stop(signum, frame):
        stopped.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    found = False
    try:
        with open(log_path, "w", encoding="utf-8") as out:
            while True:
                lines = k.read_record(block=True)
                if lines is None:
                    break
                out.write("".join(l + "\n" for l in lines))
                out.flush()
                if any(message(l) == end_marker for l in lines):
                    found = True
                    break
    except KeyboardInterrupt:
        if not stopped:
            raise
    finally:
        how = "end marker" if found else ("SIGTERM" if stopped else "end of file")
        with open(lost_path, "w", encoding="utf-8") as f:
            f.write(f"lost={k.lost} next_seq={k._next_seq} stopped_by={how}\n")
    return 0


def read_lost(path):
    """The count of lost records in a file follow() wrote; None if the file
    is missing or unreadable (the follower never finished)."""
    try:
        with open(path, encoding="utf-8") as f:
            m = re.search(r"\blost=(\d+)", f.read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _read_lines(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def main(argv):
    if len(argv) == 5 and argv[1] == "follow":
        return follow(argv[2], argv[3], argv[4])
    if len(argv) not in (2, 3):
        print(f"usage: {argv[0]} LOG [ALLOWED]\n"
              f"       {argv[0]} follow LOG LOST END_MARKER", file=sys.stderr)
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
