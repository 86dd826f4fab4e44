# SPDX-License-Identifier: GPL-2.0
"""hybdctl as an operator meets it: every command's --help, usage errors
(exit 2) apart from failed operations (exit 1), list --json against the
text table, del refusing a device that is mounted or open (and what still
deletes it), and the fast path's own counters (stats --maps)."""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hybdbpf import (BLOCK, bpfctl, fastpath, need_bpf, prog, read_blocks,
                     settle)
from hybdlib import (HYBDCTL, REPO, T_IO, T_STOP, device_ids, direct_write,
                     free_id, hybdctl, hybdctl_json, info, need_tool, pattern,
                     run, wait_for)
from test_partitions import ONE, expect_partitions, gpt, reread, write_table

assert bpfctl and fastpath      # fixtures, used by name

MiB = 1 << 20

# every command and the options its --help must mention
OPTIONS = {
    "list": ["--json"],
    "info": ["--json"],
    "features": ["--json"],
    "add": ["--size", "--lbs", "--pbs", "--queues", "--depth", "--max-io",
            "--ops", "--no-write-cache", "--poll-ns", "--io-timeout", "--id",
            "--max-discard", "--discard-granularity", "--max-write-zeroes"],
    "del": ["--in-use", "--force"],
    "resize": [],
    "attach": ["--replace"],
    "detach": [],
    "stats": ["--json", "--per-queue", "--maps", "--watch"],
}

# the keys of list --json, one per column of the text
LIST_KEYS = {"id", "path", "state", "size", "nr_hw_queues", "queue_depth",
             "server_pid", "recovery_left_ms"}


# ----------------------------------------------------------- help, errors

@pytest.mark.parametrize("cmd", sorted(OPTIONS))
def test_hybdctl_command_help(cmd):
    outs = []
    for args in ([cmd, "--help"], [cmd, "-h"], ["help", cmd]):
        rc, out, err = hybdctl(*args)
        assert rc == 0, f"hybdctl {' '.join(args)}: exit {rc}\n{err}"
        assert err == "", err
        outs.append(out)
    assert outs[0] == outs[1] == outs[2]
    out = outs[0]
    lines = out.splitlines()
    assert lines[0].startswith(f"Usage: hybdctl {cmd}"), out
    # a one-line description, then the options
    assert lines[1] == "" and lines[2].endswith(".") and lines[3] == "", out
    assert "Options:" in lines
    for opt in OPTIONS[cmd] + ["--help"]:
        assert re.search(rf"^\s+(-h, )?{re.escape(opt)}\b", out, re.M), (
            f"{cmd} --help does not describe {opt}:\n{out}")
    # and no other command's help
    assert f"Usage: hybdctl {'list' if cmd != 'list' else 'info'}" not in out


def test_hybdctl_help_lists_commands_and_exit_status():
    rc, out, err = hybdctl("--help")
    assert rc == 0, err
    for cmd in OPTIONS:
        assert re.search(rf"^  {cmd}\b", out, re.M), f"{cmd} missing:\n{out}"
    assert re.search(r"Exit status: 0 success; 1 .*; 2 usage error",
                     " ".join(out.split())), out
    assert hybdctl("help")[1] == out and hybdctl("-h")[1] == out


@pytest.mark.parametrize("cmd", sorted(OPTIONS))
def test_hybdctl_unknown_option_is_a_usage_error(cmd):
    dev = str(free_id())
    before = device_ids()
    # with an argument of the right shape, so only the option is wrong
    args = {"attach": [prog("cache"), dev], "info": [dev], "del": [dev],
            "detach": [dev], "stats": [dev]}.get(cmd, [])
    for bad, want in (("--bogus", "unknown option '--bogus'"),
                      ("-Z", "unknown option '-Z'")):
        rc, out, err = hybdctl(cmd, *args, bad)
        assert rc == 2, f"hybdctl {cmd} {bad}: exit {rc}\n{out}{err}"
        assert f"hybdctl: {cmd}: {want}" in err, err
        assert f"Try 'hybdctl {cmd} --help'" in err, err
        assert out == ""
    assert device_ids() == before, "a usage error changed the devices"


def test_hybdctl_option_values_and_exit_codes():
    dev = str(free_id())
    cases = [
        # (args, exit status, what stderr must say)
        (["stats", dev, "--watch"], 2,
         "hybdctl: stats: option '--watch' needs a value"),
        (["stats", dev, "--watch", "x"], 2, "--watch: 'x' is not a number"),
        (["list", "--json=yes"], 2, "hybdctl: list: option '--json' takes no value"),
        (["add", "--size"], 2, "hybdctl: add: option '--size' needs a value"),
        (["del"], 2, "hybdctl: del: missing DEV"),
        (["del", dev, dev], 2, "unexpected argument"),
        (["frobnicate"], 2, "hybdctl: unknown command 'frobnicate'"),
        (["help", "frobnicate"], 2, "unknown command 'frobnicate'"),
        # the command line is right; the operation fails
        (["info", dev], 1, "(No such device)"),
        (["del", dev], 1, "(No such device)"),
        (["stats", dev], 1, "(No such device)"),
    ]
    for args, want_rc, want_err in cases:
        rc, out, err = hybdctl(*args)
        assert rc == want_rc, f"hybdctl {' '.join(args)}: exit {rc}\n{err}"
        assert want_err in err, f"hybdctl {' '.join(args)}: {err!r}"


# ------------------------------------------------------------ list --json

def human(size):
    """hybdctl's size column for the sizes used here."""
    for unit, div in (("GiB", 1 << 30), ("MiB", MiB)):
        if size % div == 0:
            return f"{size // div} {unit}"
    raise AssertionError(size)


def test_hybdctl_list_json_matches_the_text(ramdisk, added_devices):
    a = ramdisk(size="16M", queues=1, depth=8)
    b = ramdisk(size="32M", queues=2, depth=16)
    c = free_id()
    rc, out, err = hybdctl("add", "--id", str(c), "--size", "48M",
                           "--queues", "1", "--depth", "4")
    assert rc == 0, err
    added_devices.append(c)

    rc, text, err = hybdctl("list")
    assert rc == 0, err
    listed = hybdctl_json("list")
    assert isinstance(listed, list)
    assert all(set(d) == LIST_KEYS for d in listed), listed

    header, *rows = text.splitlines()
    assert header.split() == ["ID", "DEVICE", "STATE", "SIZE", "QUEUES",
                              "DEPTH", "SERVER"], header
    by_id = {d["id"]: d for d in listed}
    assert len(rows) == len(listed) == len(by_id), (text, listed)
    for row in rows:
        f = row.split()     # the size is two words: "16 MiB"
        d = by_id[int(f[0])]
        assert [f[1], f[2], f"{f[3]} {f[4]}", int(f[5]), int(f[6]), f[7]] == \
            [d["path"], d["state"], human(d["size"]), d["nr_hw_queues"],
             d["queue_depth"], str(d["server_pid"]) if d["server_pid"]
             else "-"], (row, d)

    cpus = os.cpu_count()
    want = {
        a.id: (a.dev, "live", 16 * MiB, 1, 8, a.pid),
        b.id: (b.dev, "live", 32 * MiB, min(2, cpus), 16, b.pid),
        c: (f"/dev/hybd{c}", "added", 48 * MiB, 1, 4, 0),
    }
    for dev_id, values in want.items():
        d = by_id[dev_id]
        assert (d["path"], d["state"], d["size"], d["nr_hw_queues"],
                d["queue_depth"], d["server_pid"]) == values, d

    # info and stats --json agree with list and with each other
    for srv in (a, b):
        i = info(srv.dev)
        st = hybdctl_json("stats", srv.dev)
        d = by_id[srv.id]
        for k in LIST_KEYS:
            assert i[k] == d[k], (k, i[k], d[k])
        assert st["id"] == srv.id and st["path"] == srv.dev
        assert st["nr_queues"] == i["nr_hw_queues"]
        assert st["bpf"] == i["bpf"] and st["bpf_attaches"] == i["bpf_attaches"]
        for k in i["stats"]:
            assert k in st, f"stats --json lacks {k}"
    a.stop()
    b.stop()


# ------------------------------------------------------------------- del

@pytest.fixture
def mnt(tmp_path):
    path = tmp_path / "mnt"
    path.mkdir()
    yield path
    if os.path.ismount(path):
        run(["umount", "-l", path], timeout=T_IO)


def assert_refused(dev, dev_id, *want):
    """hybdctl del DEV: refused (exit 1), naming each of @want; the device
    stays."""
    rc, out, err = hybdctl("del", dev)
    assert rc == 1, f"del of a device in use: exit {rc}\n{out}{err}"
    assert err.startswith(f"hybdctl: del: "), err
    for w in want:
        assert w in err, f"{w!r} not in {err!r}"
    assert "use --in-use or --force to delete anyway" in err, err
    assert len(err.splitlines()) == 1, err
    assert info(dev_id)["state"] == "live"


def server_holds_its_node(srv):
    fds = [os.readlink(f"/proc/{srv.pid}/fd/{f}")
           for f in os.listdir(f"/proc/{srv.pid}/fd")]
    return f"{srv.dev}-srv" in fds


def test_hybdctl_del_refuses_a_mounted_device(ramdisk, mnt):
    mkfs = need_tool("mkfs.ext4")
    srv = ramdisk(size="32M")
    run([mkfs, "-F", "-q", srv.dev], timeout=T_IO, check=True)
    run(["mount", "-t", "ext4", srv.dev, mnt], timeout=T_IO, check=True)
    (mnt / "file").write_bytes(pattern("mounted", MiB))

    assert_refused(srv.dev, srv.id, f"{srv.dev} is mounted on {mnt}")
    assert os.path.ismount(mnt)
    assert (mnt / "file").read_bytes() == pattern("mounted", MiB)

    run(["umount", mnt], timeout=T_IO, check=True)
    # the server's own node is open, and does not count
    assert server_holds_its_node(srv)
    rc, out, err = hybdctl("del", srv.dev)
    assert rc == 0, err
    assert srv.id not in device_ids()
    assert srv.wait(T_STOP) == 1, srv.output()


def test_hybdctl_del_refuses_a_device_whose_partition_is_mounted(ramdisk,
                                                                 mnt):
    mkfs = need_tool("mkfs.ext4")
    size, lbs = 32 * MiB, 4096
    srv = ramdisk(size="32M")
    settle()
    write_table(srv.dev, gpt(ONE, lbs, size), lbs)
    assert reread(srv.dev) == 0
    expect_partitions(srv.dev, ONE)
    p1 = f"{srv.dev}p1"
    run([mkfs, "-F", "-q", p1], timeout=T_IO, check=True)
    run(["mount", "-t", "ext4", p1, mnt], timeout=T_IO, check=True)

    assert_refused(srv.dev, srv.id, f"{p1} is mounted on {mnt}")
    assert os.path.ismount(mnt)

    run(["umount", mnt], timeout=T_IO, check=True)
    settle()
    rc, out, err = hybdctl("del", srv.id)
    assert rc == 0, err
    assert srv.id not in device_ids()
    assert srv.wait(T_STOP) == 1, srv.output()


def hold_open(dev, spawned):
    """A process holding DEV open (as its stdin), and nothing else."""
    fd = os.open(dev, os.O_RDONLY)
    try:
        holder = subprocess.Popen(["sleep", "600"], stdin=fd)
    finally:
        os.close(fd)
    spawned.append(holder)
    return holder


def test_hybdctl_del_refuses_an_open_device_naming_the_process(ramdisk,
                                                               spawned):
    srv = ramdisk(size="16M")
    settle()
    holder = hold_open(srv.dev, spawned)

    assert_refused(srv.dev, srv.id,
                   f"{srv.dev} is open in pid {holder.pid} (sleep)")
    assert holder.poll() is None

    # --in-use is not needed here: --force deletes it too, failing its I/O
    rc, out, err = hybdctl("del", "--force", srv.dev)
    assert rc == 0, err
    assert srv.id not in device_ids()
    assert srv.wait(T_STOP) == 1, srv.output()
    holder.kill()
    holder.wait(T_STOP)


def test_hybdctl_del_in_use_deletes_an_open_device_and_drains_it(ramdisk,
                                                                spawned):
    srv = ramdisk(size="16M")
    settle()
    holder = hold_open(srv.dev, spawned)
    rc, out, err = hybdctl("del", "--in-use", str(srv.id))
    assert rc == 0, err
    assert srv.id not in device_ids()
    assert srv.wait(T_STOP) == 1, srv.output()
    holder.kill()
    holder.wait(T_STOP)


# -------------------------------------------------------- bash completion

COMPLETION = REPO / "tools" / "hybdctl" / "hybdctl.bash-completion"


def complete(*words):
    """What tools/hybdctl/hybdctl.bash-completion offers for the command line
    `hybdctl WORDS` (the last word is being completed), run in bash."""
    line = " ".join(shlex.quote(str(w)) for w in (HYBDCTL,) + words)
    script = (f"source {shlex.quote(str(COMPLETION))}\n"
              f"COMP_WORDS=({line})\n"
              "COMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n"
              "_hybdctl\n"
              "printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    res = run(["bash", "-c", script], check=True)
    assert res.stderr == "", res.stderr
    return sorted(res.stdout.split())


def test_hybdctl_bash_completion(ramdisk):
    srv = ramdisk(size="16M")
    assert complete("") == sorted(list(OPTIONS) + ["help", "version",
                                                   "--help", "--version"])
    assert complete("st") == ["stats"]
    for cmd, opts in OPTIONS.items():
        assert complete(cmd, "--") == sorted(o for o in opts + ["--help"]
                                             if o.startswith("--")), cmd
    # devices from hybdctl list, where a command takes DEV
    for words in (("info", ""), ("del", "--force", ""), ("stats", ""),
                  ("detach", ""), ("attach", "x.bpf.o", "")):
        assert srv.dev in complete(*words), words
    assert complete("stats", srv.dev, "--watch", "") == []
    # BPF objects for attach
    bpf = str(Path(prog("cache")).parent) + "/c"
    assert f"{bpf}ache.bpf.o" in complete("attach", bpf)
    assert complete("add", "--ops", "read,wr") == ["read,write",
                                                   "read,write-zeroes"]
    srv.stop()


# --------------------------------------------------------- stats --maps

def counters(dev):
    """stats --maps --json: (the device's stats, the program's counters
    as {map: {variable: value}} or None)."""
    st = hybdctl_json("stats", str(dev), "--maps")
    return st, st["maps"]


def bss(maps):
    """The variables of the program's one .bss map."""
    names = [m for m in maps if m.endswith(".bss")]
    assert len(names) == 1, maps
    return maps[names[0]]


# each sample program's counters
PROGRAM_COUNTERS = {
    "cache": {"hits", "misses", "fills", "races"},
    "zero": {"reads_served", "reads_passed", "blocks_learned"},
}


@pytest.mark.parametrize("name", sorted(PROGRAM_COUNTERS))
def test_hybdctl_stats_maps_counts_what_the_program_serves(ramdisk, fastpath,
                                                           name):
    need_bpf()
    srv = ramdisk(size="16M", queues=1)
    settle()
    blocks = 16
    if name == "cache":
        direct_write(srv.dev, 0, pattern("maps", blocks * BLOCK))
    # (zero: the blocks were never written, so they read as zeros)

    link = fastpath.attach(prog(name), srv.dev)
    st0, maps0 = counters(srv.dev)
    c0 = bss(maps0)
    assert set(c0) == PROGRAM_COUNTERS[name], maps0

    first = read_blocks(srv.dev, 0, blocks)     # the slow path teaches it
    again = read_blocks(srv.dev, 0, blocks)     # the fast path serves
    assert first == again
    st1, maps1 = counters(srv.dev)
    c1 = bss(maps1)
    d = {k: c1[k] - c0[k] for k in c0}
    fast = st1["fast_done"] - st0["fast_done"]
    assert fast == blocks, (st0, st1)
    if name == "cache":
        assert d == {"hits": blocks, "misses": blocks, "fills": blocks,
                     "races": 0}, d
    else:
        assert d == {"reads_served": blocks, "reads_passed": blocks,
                     "blocks_learned": blocks}, d

    # the text shows the same values, under the program's name
    rc, out, err = hybdctl("stats", srv.dev, "--maps")
    assert rc == 0, err
    assert f"fast-path counters of {name} (link {link}):" in out, out
    for k, v in c1.items():
        assert re.search(rf"^\s+{k}\s+{v}$", out, re.M), (k, v, out)


def test_hybdctl_stats_maps_without_counters_or_program(ramdisk, fastpath):
    need_bpf()
    srv = ramdisk(size="16M", queues=1)
    rc, out, err = hybdctl("stats", srv.dev, "--maps")
    assert rc == 0, err
    assert "fast-path counters: no fast path attached" in out, out
    assert counters(srv.dev)[1] is None

    fastpath.attach(prog("passthrough"), srv.dev)
    rc, out, err = hybdctl("stats", srv.dev, "--maps")
    assert rc == 0, err
    assert re.search(r"fast-path counters of passthrough \(link \d+\): "
                     r"no counters$", out, re.M), out
    assert counters(srv.dev)[1] == {}


def test_hybdctl_stats_maps_of_a_program_a_process_attached(ramdisk, bpfctl):
    """No pins: the counters are found from the device's link."""
    need_bpf()
    srv = ramdisk(size="16M", queues=1)
    settle()
    direct_write(srv.dev, 0, pattern("unpinned", 4 * BLOCK))
    ctl = bpfctl()
    ctl.open("c", prog("cache"), srv.dev)
    ctl.ok("attach", "l", "c", "cache_ops")
    assert not Path(f"/sys/fs/bpf/hybd/{srv.id}").exists()
    read_blocks(srv.dev, 0, 4)
    before = bss(counters(srv.dev)[1])
    read_blocks(srv.dev, 0, 4)
    after = bss(counters(srv.dev)[1])
    assert after["hits"] - before["hits"] == 4, (before, after)
    ctl.ok("close", "l")
    wait_for(lambda: info(srv.dev)["bpf"] is None, 10, "the link to go")
    assert counters(srv.dev)[1] is None
