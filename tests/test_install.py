# SPDX-License-Identifier: GPL-2.0
"""hybd as a product: `make install` into a staging DESTDIR, a driver built
outside the tree with nothing but `pkg-config --cflags --libs hybd` that
serves data through the staged libhybd.so, the staged hybdctl, `make
uninstall`, the DKMS sources, and the libbpf check of `make deps`.

The repository is read-only in the guest: `make install` must find
everything built (by `make` on the host) and only copy; the staging trees
and the driver's build live in pytest's temporary directories."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from hybdlib import (REPO, T_IO, assert_data, device_ids, direct_write,
                     pattern, run)

MiB = 1 << 20
VERSION = (REPO / "VERSION").read_text().strip()
MAJOR, MINOR = VERSION.split(".")[:2]

# what `make install PREFIX=/usr` must write (LIBDIR, SBINDIR... default)
INSTALLED = {
    f"usr/lib/libhybd.so.{VERSION}",
    f"usr/lib/libhybd.so.{MAJOR}",
    "usr/lib/libhybd.so",
    "usr/lib/libhybd.a",
    "usr/lib/pkgconfig/hybd.pc",
    "usr/lib/pkgconfig/libhybd.pc",
    "usr/include/hybd/hybd.h",
    "usr/include/hybd/uapi/hybd.h",
    "usr/include/hybd/hybd.bpf.h",
    "usr/include/hybd/hybd_versions.bpf.h",
    "usr/include/hybd/hybd_cache.bpf.h",
    "usr/sbin/hybdctl",
    "usr/bin/zram-rs",
    "usr/share/hybd/bpf/zram.bpf.o",
    "usr/share/bash-completion/completions/hybdctl",
    "usr/share/man/man8/hybdctl.8",
    "usr/share/man/man3/libhybd.3",
    "usr/share/man/man7/hybd-bpf.7",
    "usr/share/doc/hybd/LICENSES/GPL-2.0",
    "usr/share/doc/hybd/LICENSES/MIT",
    "usr/share/doc/hybd/LICENSES/Linux-syscall-note",
} | {f"usr/share/hybd/bpf/{p}.bpf.{ext}"
     for p in ("passthrough", "zero", "cache") for ext in ("c", "o")}


def make(*args, timeout=T_IO):
    """make -C REPO ARGS; fails the test on a non-zero exit."""
    return run(["make", "-C", REPO, *args], timeout=timeout, check=True)


def files_in(root):
    """The files and symlinks under root, relative to it."""
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")
            if p.is_file() or p.is_symlink()}


def install(dest):
    make("install", f"DESTDIR={dest}", "PREFIX=/usr")
    return files_in(dest)


def staged_env(stage):
    """An environment in which pkg-config sees the staged hybd.pc (its
    paths under the stage) and programs load the staged libhybd.so."""
    env = dict(os.environ)
    env["PKG_CONFIG_SYSROOT_DIR"] = str(stage)
    env["PKG_CONFIG_PATH"] = str(stage / "usr/lib/pkgconfig")
    env["LD_LIBRARY_PATH"] = str(stage / "usr/lib")
    return env


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """One staged install for the tests that use it, checked: every file
    the product consists of, the library's links, the pkg-config files."""
    dest = tmp_path_factory.mktemp("stage")
    got = install(dest)
    assert INSTALLED <= got, f"not installed: {sorted(INSTALLED - got)}"
    lib = dest / "usr/lib"
    assert os.readlink(lib / f"libhybd.so.{MAJOR}") == f"libhybd.so.{VERSION}"
    assert os.readlink(lib / "libhybd.so") == f"libhybd.so.{MAJOR}"
    pc = (lib / "pkgconfig/hybd.pc").read_text()
    assert re.search(rf"^Version: {re.escape(VERSION)}$", pc, re.M), pc
    assert re.search(r"^prefix=/usr$", pc, re.M), pc
    return dest


def test_pkg_config_names_the_staged_library_and_headers(stage):
    env = staged_env(stage)
    for name in ("hybd", "libhybd"):
        res = run(["pkg-config", "--modversion", name], env=env, check=True)
        assert res.stdout.strip() == VERSION, f"{name}: {res.stdout}"
    res = run(["pkg-config", "--cflags", "--libs", "hybd"], env=env, check=True)
    flags = res.stdout.split()
    assert f"-I{stage}/usr/include/hybd" in flags, flags
    assert f"-L{stage}/usr/lib" in flags and "-lhybd" in flags, flags
    res = run(["pkg-config", "--variable=bpfdir", "hybd"], env=env, check=True)
    assert res.stdout.strip().endswith("/usr/share/hybd/bpf"), res.stdout


def test_out_of_tree_driver_built_with_pkg_config_serves_data(stage, tmp_path,
                                                              servers):
    # the driver's sources, alone in a directory outside the tree
    src = tmp_path / "oot"
    src.mkdir()
    for f in ("oot.c", "oot.bpf.c", "Makefile"):
        shutil.copy(REPO / "tests" / "oot" / f, src / f)
    env = staged_env(stage)
    run(["make", "-C", src], env=env, timeout=T_IO, check=True)
    driver = src / "oot"

    # linked against libhybd.so.MAJOR, which the staged tree provides
    res = run(["ldd", driver], env=env, check=True)
    m = re.search(r"^\s*libhybd\.so\.(\d+) => (\S+)", res.stdout, re.M)
    assert m, f"not linked against libhybd.so:\n{res.stdout}"
    assert m.group(1) == MAJOR
    assert os.path.realpath(m.group(2)) == str(stage / f"usr/lib/libhybd.so.{VERSION}")

    srv = servers.start(["env", f"LD_LIBRARY_PATH={stage}/usr/lib", driver, "16"])
    # the process runs the staged library, not one from the system
    maps = Path(f"/proc/{srv.pid}/maps").read_text()
    assert str(stage / f"usr/lib/libhybd.so.{VERSION}") in maps

    chunks = [(0, pattern(1, 64 << 10)), (5 * MiB + 4096, pattern(2, 12 << 10)),
              (16 * MiB - 8192, pattern(3, 8192))]
    for off, data in chunks:
        direct_write(srv.dev, off, data)
    for off, data in chunks:
        assert_data(srv.dev, off, data, "data written through the oot driver")
    # never written: zeros, as the driver's memory starts
    assert_data(srv.dev, 8 * MiB, bytes(4096), "an unwritten block")
    # its fast path, built with hybd.pc's bpf_cc and bpf_cflags, serves
    # the reads of the last 4 MiB (never written) in the kernel
    res = run([stage / "usr/sbin/hybdctl", "attach", src / "oot.bpf.o",
               srv.dev], env=env, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_data(srv.dev, 14 * MiB, bytes(64 << 10), "a fast-path read")
    res = run([stage / "usr/sbin/hybdctl", "stats", srv.dev, "--maps",
               "--json"], env=env, check=True)
    assert json.loads(res.stdout)["maps"]["oot.bss"]["zero_reads"] >= 1
    run([stage / "usr/sbin/hybdctl", "detach", srv.dev], env=env,
        check=True)

    # the staged hybdctl sees the device the way the driver set it up
    res = run([stage / "usr/sbin/hybdctl", "info", srv.dev, "--json"],
              env=env, check=True)
    info = json.loads(res.stdout)
    assert info["size"] == 16 * MiB
    assert info["ops"] == ["read", "write"]
    assert info["write_cache"] is False
    assert info["stats"]["writes"] >= len(chunks)

    dev_id = srv.id
    srv.stop()
    m = re.search(r"^oot: reads=(\d+) writes=(\d+)$", "".join(srv.out), re.M)
    assert m, srv.output()
    reads, writes = int(m.group(1)), int(m.group(2))
    # O_DIRECT: every read and write above reached the driver's handlers
    assert writes >= len(chunks) and reads >= len(chunks) + 1, (reads, writes)
    assert dev_id not in device_ids()


def test_installed_hybdctl_reports_library_and_module_versions(stage):
    env = staged_env(stage)
    hybdctl = stage / "usr/sbin/hybdctl"
    # dynamically linked: it runs against the staged libhybd.so
    res = run(["ldd", hybdctl], env=env, check=True)
    assert re.search(rf"libhybd\.so\.{MAJOR} => {re.escape(str(stage))}/usr/lib/",
                     res.stdout), res.stdout

    module = Path("/sys/module/hybd/version").read_text().strip()
    assert module == VERSION, f"the module says {module}, VERSION {VERSION}"

    res = run([hybdctl, "features"], env=env, check=True)
    fields = dict(line.split(None, 1) for line in res.stdout.splitlines())
    assert fields["library_version"].strip() == f"{MAJOR}.{MINOR}", res.stdout
    assert fields["module_version"].strip() == VERSION, res.stdout

    res = run([hybdctl, "features", "--json"], env=env, check=True)
    f = json.loads(res.stdout)
    assert (f["library_version"], f["module_version"]) == (f"{MAJOR}.{MINOR}", VERSION)
    assert "bpf" in f["names"]


def test_uninstall_removes_every_installed_file(tmp_path):
    dest = tmp_path / "stage"
    got = install(dest)
    assert INSTALLED <= got
    make("uninstall", f"DESTDIR={dest}", "PREFIX=/usr")
    left = files_in(dest)
    assert not left, f"left after make uninstall: {sorted(left)}"
    # and hybd's own directories with them
    for d in ("usr/include/hybd", "usr/share/hybd", "usr/share/doc/hybd",
              "usr/bin"):
        assert not (dest / d).exists(), d


def test_dkms_sources_are_complete_and_versioned(tmp_path):
    make("dkms-src", f"DESTDIR={tmp_path}")
    src = tmp_path / f"usr/src/hybd-{VERSION}"
    conf = (src / "dkms.conf").read_text()
    assert re.search(rf'^PACKAGE_VERSION="{re.escape(VERSION)}"$', conf, re.M), conf
    assert re.search(r'^BUILT_MODULE_NAME\[0\]="hybd"$', conf, re.M), conf
    assert (src / "VERSION").read_text().strip() == VERSION
    assert (src / "include/uapi/hybd.h").is_file()
    # every object kbuild links, from its source; nothing generated
    kbuild = (src / "kmod/Kbuild").read_text()
    objs = re.search(r"^hybd-y\s*:=\s*(.*)$", kbuild, re.M).group(1).split()
    assert objs, kbuild
    for o in objs:
        assert (src / "kmod" / o.replace(".o", ".c")).is_file(), o
    assert not list((src / "kmod").glob("*.mod.c"))
    assert not list((src / "kmod").glob("*.o"))
    # the feature tests go along, never what they wrote for this kernel
    assert os.access(src / "kmod/conftest.sh", os.X_OK)
    assert (src / "kmod/compat.h").is_file()
    assert not (src / "kmod/compat-gen.h").exists()


@pytest.mark.parametrize("version, ok", [
    ("1:1.1.0-1", False),               # bookworm's own
    ("1:1.3.9-1", False),
    ("1:1.4.6-1~bpo12+1", True),        # bookworm-backports
    ("1.5.0", True),
])
def test_deps_refuses_libbpf_older_than_1_4(version, ok):
    res = run([REPO / "tools/deps.sh", "--libbpf-ok", version])
    assert res.returncode == (0 if ok else 1), res.stdout + res.stderr
    if not ok:
        assert "too old" in res.stderr and ">= 1.4" in res.stderr, res.stderr
        assert "bookworm-backports" in res.stderr, res.stderr
