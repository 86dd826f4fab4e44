// SPDX-License-Identifier: MIT
//! Errors: an errno and, from libhybd, the words that say why.

use std::ffi::CStr;
use std::fmt;

/// A positive errno value, as handlers return it and as libhybd reports
/// failures.  The constants are the ones a block driver meets.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// An I/O error: what a reader or writer sees for most failures.
    pub const EIO: Errno = Errno(libc::EIO);
    /// Out of space: reaches a writer as ENOSPC.
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// The operation is not offered.
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    /// A medium error.
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    /// Invalid argument.
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// Busy.
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    /// Out of memory (the request fails; it is not retried).
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);

    /// The errno of the calling thread's last failed system call.
    pub fn last() -> Errno {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Errno({}: {})",
            self.0,
            std::io::Error::from_raw_os_error(self.0)
        )
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&std::io::Error::from_raw_os_error(self.0), f)
    }
}

impl std::error::Error for Errno {}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// A failed libhybd call: its errno and libhybd's explanation
/// (`hybd_errmsg()`), e.g. "logical block size 1000: must be a power of
/// two between 512 and 4096".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What failed.
    pub errno: Errno,
    /// libhybd's words for it (may be empty); after a refused BPF load,
    /// several lines with the verifier's.
    pub message: String,
}

impl Error {
    /// An error with words of the crate's own.
    pub fn new(errno: Errno, message: impl Into<String>) -> Error {
        Error {
            errno,
            message: message.into(),
        }
    }

    /// The error of a libhybd call that returned `ret` (negative), in the
    /// calling thread, with `hybd_errmsg()`'s words.
    pub(crate) fn from_lib(ret: i32) -> Error {
        // SAFETY: hybd_errmsg() returns a thread-local NUL-terminated
        // string, valid until the next failing call of this thread; it is
        // copied at once.
        let msg = unsafe { CStr::from_ptr(hybd_sys::hybd_errmsg()) };
        Error {
            errno: Errno(-ret),
            message: msg.to_string_lossy().into_owned(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.errno)
        } else {
            write!(f, "{}: {}", self.message, self.errno)
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.errno)
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno.0).kind(), e)
    }
}

/// The result of a libhybd call.
pub type Result<T> = std::result::Result<T, Error>;

/// `ret` of a libhybd call: negative is an error, the rest is returned.
pub(crate) fn check(ret: i32) -> Result<i32> {
    if ret < 0 {
        Err(Error::from_lib(ret))
    } else {
        Ok(ret)
    }
}
