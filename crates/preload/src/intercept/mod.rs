//! The exported C functions, one file per family, and what they share: telling a Shoal
//! call from any other, and handing a call to the kernel.
//!
//! Every interceptor has the same shape: a cheap test (is the descriptor in the table, is
//! the path below a mount) that sends anything else to the C library at once, then
//! `guard::serve` with the native attempt and the C library's call as fallback. The C
//! functions with variable arguments (`open`, `openat`, `fcntl`, `ioctl`, `syscall`) are
//! defined with their largest argument list: on x86-64 and AArch64 the variable
//! arguments of these calls (integers and pointers) travel in the same registers as
//! fixed ones, so the callee reads what the caller passed, and reads an unused register
//! (ignored) when the caller passed fewer (`open` without O_CREAT has no mode).

pub mod dir;
pub mod io;
pub mod kernel;
pub mod names;
pub mod open;
pub mod process;
pub mod stat;
pub mod stdio;
pub mod syscall;

use crate::fd_table;
use crate::guard::{self, Guard};
use crate::mounts::{self, Base, Target};
use crate::open_file::{self, Kind};
use crate::real::Fail;
use libc::{c_char, c_int};
use std::ffi::{CStr, CString};

/// The bytes of the C string `p` (None for NULL).
pub unsafe fn bytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: the caller passes a C string or NULL, as the C functions require.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// `/proc/self/fd/N[/rest]` (or `/dev/fd/N`, `/proc/thread-self/fd/N`) naming a served
/// descriptor: its host path (the kernel would see a placeholder there).
fn fd_alias(path: &[u8]) -> Option<String> {
    let rest =
        [&b"/proc/self/fd/"[..], b"/dev/fd/", b"/proc/thread-self/fd/"].iter().find_map(|p| path.strip_prefix(*p))?;
    let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    let fd: i32 = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    let of = fd_table::get(fd)?;
    let tail = std::str::from_utf8(&rest[digits..]).ok()?;
    if !tail.is_empty() && !tail.starts_with('/') {
        return None;
    }
    Some(format!("{}{tail}", of.host()))
}

/// Where a path call goes: its Shoal target, or None for the kernel (the library's own
/// calls, no mounts, a relative path from a descriptor the library does not serve...).
pub unsafe fn target(dirfd: c_int, path: *const c_char) -> Option<Target> {
    if !mounts::any() || guard::inside() {
        return None;
    }
    // SAFETY: as `bytes`.
    let p = unsafe { bytes(path) }?;
    if p.first() == Some(&b'/') {
        if let Some(host) = fd_alias(p) {
            return mounts::target_of_host(&host);
        }
        return mounts::resolve(Base::Cwd, p);
    }
    if dirfd == libc::AT_FDCWD {
        return mounts::resolve(Base::Cwd, p);
    }
    let of = fd_table::get(dirfd)?;
    if of.kind == Kind::File {
        return None; // the kernel says ENOTDIR
    }
    let host = of.host();
    mounts::resolve(Base::Dir(&host), p)
}

/// The descriptor and path to give the C library for a path call relative to `dirfd`.
/// A served directory descriptor is a placeholder to the kernel: a relative path from it
/// becomes the absolute host path (AT_FDCWD), so the directory stays served. (An empty
/// path, `AT_EMPTY_PATH`, names the descriptor itself: that one is handed to the kernel.)
pub struct KernelAt {
    dirfd: c_int,
    path: *const c_char,
    owned: Option<CString>,
}

impl KernelAt {
    pub unsafe fn new(dirfd: c_int, path: *const c_char) -> KernelAt {
        let same = KernelAt { dirfd, path, owned: None };
        if dirfd == libc::AT_FDCWD {
            return same;
        }
        let Some(of) = fd_table::get(dirfd) else { return same };
        // SAFETY: the caller's path.
        let Some(p) = (unsafe { bytes(path) }) else { return same };
        if p.first() == Some(&b'/') || of.kind == Kind::File {
            return same;
        }
        if p.is_empty() {
            kernel_dirfd(dirfd);
            return same;
        }
        let mut full = of.host().as_bytes().to_vec();
        full.push(b'/');
        full.extend_from_slice(p);
        match CString::new(full) {
            Ok(c) => KernelAt { dirfd: libc::AT_FDCWD, path: std::ptr::null(), owned: Some(c) },
            Err(_) => same,
        }
    }

    pub fn dirfd(&self) -> c_int {
        self.dirfd
    }

    pub fn path(&self) -> *const c_char {
        self.owned.as_ref().map_or(self.path, |c| c.as_ptr())
    }
}

/// Hand a served directory descriptor to the kernel (for a call that needs the
/// descriptor itself).
pub fn kernel_dirfd(dirfd: c_int) {
    if dirfd == libc::AT_FDCWD {
        return;
    }
    if let Some(of) = fd_table::get(dirfd) {
        let _g = Guard::enter();
        let _ = open_file::convert(&of);
    }
}

/// Run a call only the kernel can make on `fd`: a served descriptor is handed to the
/// kernel first (if that fails, the call fails with its errno).
pub fn kernel_only<T: Fail>(fd: c_int, call: impl FnOnce() -> T) -> T {
    if let Some(of) = fd_table::get(fd) {
        let r = {
            let _g = Guard::enter();
            open_file::convert(&of)
        };
        crate::stats::count(crate::stats::Op::Kernel, crate::stats::Path::Kernel);
        if let Err(e) = r {
            guard::set_errno(e);
            return T::FAIL;
        }
    }
    call()
}

/// Whether the last component of the path as given is `.` or `..` (namespace calls hand
/// these to the kernel, whose answers for them differ from call to call).
pub fn dot_last(p: &[u8]) -> bool {
    let t = p.strip_suffix(b"/").unwrap_or(p);
    let last = t.rsplit(|c| *c == b'/').next().unwrap_or(t);
    last == b"." || last == b".."
}
