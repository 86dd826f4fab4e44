// SPDX-License-Identifier: MIT
//! Finds libhybd and generates the bindings from its `hybd.h`.
//!
//! Where libhybd comes from, first match wins:
//! 1. `HYBD_LIB_DIR` (with `libhybd.a` or `libhybd.so`) and
//!    `HYBD_INCLUDE_DIR` (with `hybd.h` and `uapi/hybd.h`);
//! 2. the hybd source tree this crate sits in, once `make lib` has built
//!    `libhybd/libhybd.a`: linked statically, so that binaries run from
//!    the tree without `LD_LIBRARY_PATH`;
//! 3. the installed library, through `pkg-config hybd` (`make install`).
//!
//! libhybd loads fast paths with libbpf, so a static link adds `-lbpf`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Found {
    include: Vec<PathBuf>,
}

fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new(env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into()))
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn link_static(dir: &Path) {
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=static=hybd");
    println!("cargo:rustc-link-lib=dylib=bpf");
    println!("cargo:rerun-if-changed={}", dir.join("libhybd.a").display());
}

fn from_env() -> Option<Found> {
    let lib = PathBuf::from(env::var_os("HYBD_LIB_DIR")?);
    let inc = env::var_os("HYBD_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("HYBD_LIB_DIR is set: set HYBD_INCLUDE_DIR too"));
    if lib.join("libhybd.a").exists() {
        link_static(&lib);
    } else {
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-lib=dylib=hybd");
    }
    Some(Found { include: vec![inc] })
}

fn from_tree() -> Option<Found> {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR")?);
    let top = manifest.parent()?.parent()?;
    let lib = top.join("libhybd");
    if !lib.join("hybd.h").exists() || !top.join("include/uapi/hybd.h").exists() {
        return None;
    }
    if !lib.join("libhybd.a").exists() {
        panic!(
            "hybd-sys: {} has libhybd's sources but no libhybd.a: run `make lib` in {} first",
            lib.display(),
            top.display()
        );
    }
    link_static(&lib);
    println!("cargo:rerun-if-changed={}", lib.join("hybd.h").display());
    println!(
        "cargo:rerun-if-changed={}",
        top.join("include/uapi/hybd.h").display()
    );
    Some(Found {
        include: vec![lib, top.join("include")],
    })
}

fn from_pkg_config() -> Option<Found> {
    let libs = pkg_config(&["--libs", "hybd"])?;
    let cflags = pkg_config(&["--cflags-only-I", "hybd"])?;
    for word in libs.split_whitespace() {
        if let Some(d) = word.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={d}");
        } else if let Some(l) = word.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={l}");
        }
    }
    let include = cflags
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("-I"))
        .map(PathBuf::from)
        .collect();
    Some(Found { include })
}

fn main() {
    println!("cargo:rerun-if-env-changed=HYBD_LIB_DIR");
    println!("cargo:rerun-if-env-changed=HYBD_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=wrapper.h");
    let found = from_env()
        .or_else(from_tree)
        .or_else(from_pkg_config)
        .unwrap_or_else(|| {
            panic!(
                "hybd-sys: libhybd not found: build this crate in a hybd tree after \
                 `make lib`, install hybd (`make install`, pkg-config hybd), or set \
                 HYBD_LIB_DIR and HYBD_INCLUDE_DIR"
            )
        });

    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("hybd_.*")
        .allowlist_type("hybd_.*")
        .allowlist_var("HYBD_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for dir in &found.include {
        b = b.clang_arg(format!("-I{}", dir.display()));
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    b.generate()
        .expect("hybd-sys: bindgen could not read hybd.h (is libclang installed?)")
        .write_to_file(out.join("bindings.rs"))
        .expect("hybd-sys: cannot write the bindings");
}
