// SPDX-License-Identifier: MIT
//! The fast path: a BPF object attached to a device, and its maps.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::AtomicU64;

use hybd_sys as sys;

use crate::error::{check, Error, Result};
use crate::Errno;

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(Errno::EINVAL, format!("{s:?} holds a NUL byte")))
}

fn cpath(p: &Path) -> Result<CString> {
    cstring(
        p.to_str()
            .ok_or_else(|| Error::new(Errno::EINVAL, "a path that is not UTF-8"))?,
    )
}

/// A fast path loaded and attached to a device (`hybd_bpf_attach()`).
/// Dropping it detaches an unpinned program; a pinned one stays attached
/// ([`FastPath::detach`], [`detach_pinned`]).
pub struct FastPath {
    b: *mut sys::hybd_bpf,
}

// SAFETY: the handle is only used through &mut self or by value, and
// libhybd's BPF calls hold no thread-bound state.
unsafe impl Send for FastPath {}

impl FastPath {
    /// Load `path` (a `.bpf.o` built against `hybd.bpf.h`) and attach it
    /// to device `dev_id`.  With `pin`, the link and the maps are pinned
    /// under `/sys/fs/bpf/hybd/<id>/` and outlive this process (what
    /// `hybdctl attach` does).  A refused program's verifier log is in the
    /// error's message.
    pub fn attach(dev_id: u32, path: impl AsRef<Path>, pin: bool) -> Result<FastPath> {
        let p = cpath(path.as_ref())?;
        let mut b = std::ptr::null_mut();
        let flags = if pin { sys::HYBD_BPF_F_PIN } else { 0 };
        // SAFETY: p is a C string for the call; b receives the handle.
        check(unsafe { sys::hybd_bpf_attach(dev_id, p.as_ptr(), flags, &mut b) })?;
        Ok(FastPath { b })
    }

    /// Swap in the program of `path`, atomically; maps of the same name
    /// and shape carry over.  Map fds from [`FastPath::map`] are the old
    /// program's: ask again.
    pub fn replace(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let p = cpath(path.as_ref())?;
        // SAFETY: b is our live handle.
        check(unsafe { sys::hybd_bpf_replace(self.b, p.as_ptr()) }).map(drop)
    }

    /// Detach the program, pinned or not; the kernel stops calling it
    /// before this returns.
    pub fn detach(mut self) -> Result<()> {
        let b = std::mem::replace(&mut self.b, std::ptr::null_mut());
        // SAFETY: b is our live handle, freed by the call in every case.
        check(unsafe { sys::hybd_bpf_detach(b) }).map(drop)
    }

    /// The program's map `name`, borrowed from the handle.
    pub fn map(&self, name: &str) -> Result<Map<'_>> {
        let n = cstring(name)?;
        // SAFETY: b is live; the fd stays the handle's.
        let fd = check(unsafe { sys::hybd_bpf_map_fd(self.b, n.as_ptr()) })?;
        // SAFETY: the fd lives as long as the handle, which the Map borrows.
        Ok(Map {
            fd: unsafe { BorrowedFd::borrow_raw(fd) },
        })
    }
}

impl Drop for FastPath {
    fn drop(&mut self) {
        if !self.b.is_null() {
            // SAFETY: b is our live handle.
            unsafe { sys::hybd_bpf_close(self.b) };
        }
    }
}

/// Remove the pinned fast path of device `dev_id` (`hybdctl detach`).
pub fn detach_pinned(dev_id: u32) -> Result<()> {
    // SAFETY: plain call.
    check(unsafe { sys::hybd_bpf_detach_pinned(dev_id) }).map(drop)
}

/// Open map `name` of the fast path pinned for `dev_id`, from any process.
pub fn open_pinned_map(dev_id: u32, name: &str) -> Result<OwnedMap> {
    let n = cstring(name)?;
    // SAFETY: n is a C string for the call.
    let fd = check(unsafe { sys::hybd_bpf_map_open_pinned(dev_id, n.as_ptr()) })?;
    // SAFETY: a new fd of ours.
    Ok(OwnedMap {
        fd: unsafe { OwnedFd::from_raw_fd(fd) },
    })
}

/// A BPF map (borrowed fd).
#[derive(Clone, Copy)]
pub struct Map<'a> {
    fd: BorrowedFd<'a>,
}

/// A BPF map whose fd this process owns.
pub struct OwnedMap {
    fd: OwnedFd,
}

impl OwnedMap {
    /// The map's operations.
    pub fn map(&self) -> Map<'_> {
        Map {
            fd: self.fd.as_fd(),
        }
    }
}

// union bpf_attr for BPF_MAP_*_ELEM
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;

impl Map<'_> {
    /// The map's fd, for calls this crate does not wrap.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn elem(
        &self,
        cmd: libc::c_long,
        key: &[u8],
        value: *mut u8,
        flags: u64,
    ) -> std::result::Result<(), Errno> {
        let attr = ElemAttr {
            map_fd: self.fd() as u32,
            key: key.as_ptr() as u64,
            value: value as u64,
            flags,
            ..Default::default()
        };
        // SAFETY: the kernel reads key's and writes value's buffers, whose
        // sizes the callers matched to the map's key and value sizes (the
        // kernel copies exactly those); attr is live for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                &attr as *const ElemAttr,
                std::mem::size_of::<ElemAttr>(),
            )
        };
        if r < 0 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    }

    /// The key and value sizes of a map whose lookups copy one value.
    /// Per-CPU maps copy one per possible CPU: refused (EOPNOTSUPP).
    fn sizes(&self) -> std::result::Result<(usize, usize), Errno> {
        let info = map_info(self.fd())?;
        // BPF_MAP_TYPE_PERCPU_HASH, _PERCPU_ARRAY, _LRU_PERCPU_HASH,
        // _PERCPU_CGROUP_STORAGE
        if matches!(info.type_, 5 | 6 | 10 | 21) {
            return Err(Errno::EOPNOTSUPP);
        }
        Ok((info.key_size as usize, info.value_size as usize))
    }

    /// The value at `key`, or None.  `key` must be the map's key size.
    pub fn lookup(&self, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, Errno> {
        let (ks, vs) = self.sizes()?;
        if key.len() != ks {
            return Err(Errno::EINVAL);
        }
        let mut v = vec![0u8; vs];
        match self.elem(BPF_MAP_LOOKUP_ELEM, key, v.as_mut_ptr(), 0) {
            Ok(()) => Ok(Some(v)),
            Err(e) if e.0 == libc::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Set `key` to `value` (sizes as the map's).
    pub fn update(&self, key: &[u8], value: &[u8]) -> std::result::Result<(), Errno> {
        let (ks, vs) = self.sizes()?;
        if key.len() != ks || value.len() != vs {
            return Err(Errno::EINVAL);
        }
        self.elem(BPF_MAP_UPDATE_ELEM, key, value.as_ptr() as *mut u8, 0)
    }

    /// Remove `key` (hash maps).
    pub fn delete(&self, key: &[u8]) -> std::result::Result<(), Errno> {
        let (ks, _) = self.sizes()?;
        if key.len() != ks {
            return Err(Errno::EINVAL);
        }
        self.elem(BPF_MAP_DELETE_ELEM, key, std::ptr::null_mut(), 0)
    }

    /// Set array entries `first..first + count` to `value`, in batches.
    pub fn fill(&self, first: u32, count: u32, value: &[u8]) -> Result<()> {
        let (_, vs) = self.sizes().map_err(|e| Error::new(e, "not a BPF map"))?;
        if value.len() != vs {
            return Err(Error::new(
                Errno::EINVAL,
                format!("a value of {} bytes for a map of {vs}", value.len()),
            ));
        }
        // SAFETY: value holds the map's value size.
        check(unsafe {
            sys::hybd_bpf_map_fill(self.fd(), first, count, value.as_ptr() as *const _)
        })
        .map(drop)
    }

    /// Map the values of a `BPF_F_MMAPABLE` array as 64-bit words (a
    /// `HYBD_BLOCK_BITMAP`, say), shared with the program: change them with
    /// atomics.  The mapping keeps the map alive.
    pub fn mmap_words(&self) -> Result<MappedWords> {
        // BPF_F_RDONLY_PROG: the program may not write it, and libhybd
        // maps it read-only: atomics on it would fault
        let info = map_info(self.fd()).map_err(|e| Error::new(e, "not a BPF map"))?;
        if info.map_flags & (1 << 7) != 0 {
            return Err(Error::new(Errno::EINVAL, "a map the program only reads (BPF_F_RDONLY_PROG) is mapped read-only: no words to change"));
        }
        let mut bytes = 0usize;
        // SAFETY: bytes receives the length; NULL or a fresh mapping.
        let p = unsafe { sys::hybd_bpf_map_mmap(self.fd(), &mut bytes) };
        if p.is_null() {
            return Err(Error::from_lib(-libc::EINVAL));
        }
        Ok(MappedWords {
            p: p as *mut AtomicU64,
            bytes,
        })
    }
}

/// A BPF array's values mapped into this process, as atomic words.
pub struct MappedWords {
    p: *mut AtomicU64,
    bytes: usize,
}

// SAFETY: the words are atomics in a shared mapping; nothing is
// thread-bound.
unsafe impl Send for MappedWords {}
// SAFETY: as Send: every access goes through atomics.
unsafe impl Sync for MappedWords {}

impl MappedWords {
    /// The words (the program sees the same memory).
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page-aligned, `bytes` long, alive until
        // drop; AtomicU64 has u64's layout, and every access is atomic.
        unsafe { std::slice::from_raw_parts(self.p, self.bytes / 8) }
    }
}

impl Drop for MappedWords {
    fn drop(&mut self) {
        // SAFETY: the mapping made by hybd_bpf_map_mmap(), once.
        unsafe { libc::munmap(self.p as *mut _, self.bytes) };
    }
}

#[repr(C)]
#[derive(Default)]
struct MapInfo {
    type_: u32,
    id: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

fn map_info(fd: RawFd) -> std::result::Result<MapInfo, Errno> {
    let mut info = MapInfo::default();
    let attr = InfoAttr {
        bpf_fd: fd as u32,
        info_len: std::mem::size_of::<MapInfo>() as u32,
        info: &mut info as *mut MapInfo as u64,
    };
    // SAFETY: the kernel writes at most info_len bytes into info.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &attr as *const InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(info)
    }
}
