//! POSIX error numbers as they travel on the wire. Servers answer with these so that the
//! client library, the FUSE mount and the CLI can hand them on unchanged.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A POSIX errno value (Linux numbering), with a few helpers for the ones Shoal uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EFBIG: Errno = Errno(libc::EFBIG);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const EMLINK: Errno = Errno(libc::EMLINK);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const ELOOP: Errno = Errno(libc::ELOOP);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const ENOTSUP: Errno = Errno(libc::ENOTSUP);
    pub const EPROTO: Errno = Errno(libc::EPROTO);
    pub const ENOTCONN: Errno = Errno(libc::ENOTCONN);
    pub const ETIMEDOUT: Errno = Errno(libc::ETIMEDOUT);
    pub const ESTALE: Errno = Errno(libc::ESTALE);
    /// Not sent by servers: a client's walk with `host_paths` that leads out of Shoal.
    pub const EREMOTE: Errno = Errno(libc::EREMOTE);

    /// The errno a local I/O error maps to (ENOSPC for a full disk, EIO when unknown).
    pub fn from_io(err: &std::io::Error) -> Errno {
        Errno(err.raw_os_error().unwrap_or(libc::EIO))
    }

    pub fn code(self) -> i32 {
        self.0
    }

    /// The C library's text for this error ("No such file or directory").
    pub fn description(self) -> String {
        std::io::Error::from_raw_os_error(self.0).to_string().split(" (os error").next().unwrap_or("").to_string()
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description())
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.0)
    }
}
