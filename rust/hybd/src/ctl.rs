// SPDX-License-Identifier: MIT
//! The control node (`/dev/hybd-control`): any device by its id, from any
//! process, as `hybdctl` does.

use hybd_sys as sys;

use crate::error::{check, Result};

/// A device's counters and latency histograms: the totals over its queues
/// (`total.c.reads`, `total.c.fast_done`, ...; see `struct
/// hybd_dev_stats` in `uapi/hybd.h`) and each queue's.
pub struct Stats {
    /// The totals.
    pub total: sys::hybd_queue_stat,
    /// Each hardware queue's.
    pub queues: Vec<sys::hybd_queue_stat>,
}

/// The counters of device `id`, now.  They only grow: subtract two
/// snapshots for rates.
pub fn stats(id: u32) -> Result<Stats> {
    let mut queues = vec![sys::hybd_queue_stat::default(); 64];
    loop {
        let mut st = sys::hybd_ctl_stats::default();
        // SAFETY: st is ours to fill; queues has the room passed.
        let n = check(unsafe {
            sys::hybd_ctl_stats(id, &mut st, queues.as_mut_ptr(), queues.len() as u32)
        })? as usize;
        if n <= queues.len() {
            queues.truncate(n);
            return Ok(Stats {
                total: st.total,
                queues,
            });
        }
        queues.resize(n, sys::hybd_queue_stat::default());
    }
}

/// State, parameters and counters of device `id` (`hybdctl info`).
pub fn info(id: u32) -> Result<sys::hybd_dev_info> {
    let mut info = sys::hybd_dev_info::default();
    // SAFETY: info is ours to fill.
    check(unsafe { sys::hybd_ctl_info(id, &mut info) })?;
    Ok(info)
}

/// The ids of the existing devices.
pub fn list() -> Result<Vec<u32>> {
    let mut ids = vec![0u32; 256];
    loop {
        // SAFETY: ids has the room passed.
        let n = check(unsafe { sys::hybd_ctl_list(ids.as_mut_ptr(), ids.len() as u32) })? as usize;
        if n <= ids.len() {
            ids.truncate(n);
            return Ok(ids);
        }
        ids.resize(n, 0);
    }
}

/// Delete device `id`; `force` fails what is outstanding at once (data
/// the server has not written is lost).
pub fn delete(id: u32, force: bool) -> Result<()> {
    let flags = if force { sys::HYBD_DEL_F_FORCE } else { 0 };
    // SAFETY: plain control call.
    check(unsafe { sys::hybd_ctl_del_flags(id, flags) }).map(drop)
}

/// Ask the server of live device `id` to drain and exit, for a new server
/// to take it over ([`crate::Builder::take_over`]).
pub fn handover(id: u32) -> Result<()> {
    // SAFETY: plain control call.
    check(unsafe { sys::hybd_ctl_handover(id) }).map(drop)
}

/// Resize live device `id` (its server's resize hook is asked).
pub fn resize(id: u32, size: u64) -> Result<()> {
    // SAFETY: plain control call.
    check(unsafe { sys::hybd_ctl_resize(id, size) }).map(drop)
}

/// The module's ABI version and `HYBD_F_*` feature bits.
pub fn features() -> Result<(u32, u64)> {
    let mut f = sys::hybd_ctl_features::default();
    // SAFETY: f is ours to fill.
    check(unsafe { sys::hybd_ctl_features(&mut f) })?;
    Ok((f.abi_version, f.features))
}
