// SPDX-License-Identifier: MIT
//! A RAM disk in safe Rust: the overview example of the `hybd` crate's
//! documentation, which the guest tests also run (tests/test_rust.py).
//!
//! Usage: ramdisk [SIZE_MIB]    (default 64; Ctrl-C or `hybdctl del` ends it)

use std::sync::Mutex;

use hybd::{Builder, DeviceRef, Handler, Ops, Request};

struct Ram(Mutex<Vec<u8>>);

impl Handler for Ram {
    fn ops(&self) -> Ops {
        Ops::READ | Ops::WRITE | Ops::DISCARD
    }

    fn read(&self, mut req: Request) {
        let at = req.offset() as usize;
        let n = req.len();
        req.buf_mut()
            .copy_from_slice(&self.0.lock().unwrap()[at..at + n]);
        req.complete(Ok(()));
    }

    fn write(&self, req: Request) {
        let at = req.offset() as usize;
        self.0.lock().unwrap()[at..at + req.len()].copy_from_slice(&req.buf());
        req.complete(Ok(()));
    }

    fn discard(&self, req: Request) {
        let at = req.offset() as usize;
        self.0.lock().unwrap()[at..at + req.len()].fill(0);
        req.complete(Ok(()));
    }

    fn ready(&self, dev: &DeviceRef) {
        println!("ready {}", dev.path());
    }
}

fn main() {
    let mib: u64 = std::env::args()
        .nth(1)
        .map_or(64, |s| s.parse().expect("SIZE_MIB"));
    let size = mib << 20;
    if let Err(e) = Builder::new(size).run(Ram(Mutex::new(vec![0; size as usize]))) {
        eprintln!("ramdisk: {e}");
        std::process::exit(1);
    }
}
