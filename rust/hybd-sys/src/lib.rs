// SPDX-License-Identifier: MIT
//! Raw bindings to libhybd, the user-space half of a hybd block driver.
//!
//! Generated at build time by bindgen from the `hybd.h` this crate links
//! against (see `build.rs` for where it looks), so they always match the
//! library.  Everything here is `unsafe` to call and follows the C
//! documentation in `hybd.h`; the [`hybd`](https://docs.rs/hybd) crate is
//! the safe API built on it.
//!
//! `hybd_dev_create()` and `hybd_run()` are C macros: call
//! [`hybd_dev_create_sized`] and [`hybd_run_sized`] with the sizes of the
//! structs passed, as the macros do.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
