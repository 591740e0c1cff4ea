//! Attributes: `stat`, `lstat`, `fstat`, `fstatat` (and their `64` names), `statx`, the
//! `__xstat` family older binaries call, `access`, `faccessat`, `euidaccess`/`eaccess`,
//! `fstatfs`/`fstatvfs`.
//!
//! A path's attributes come from the client's walk: names and attributes cached for 1 s
//! (as the mount's kernel caches them), leases, else one lookup request. A file this
//! process has open and has written to is answered by its handle (after its writes, so
//! the size and times include them), as every descriptor of the mount shares one view. A
//! descriptor's attributes are its handle's, fetched again when older than 1 s or after a
//! write. A symbolic link that stands for one of the mount's special files is the
//! kernel's to describe.

use super::open::special_check;
use super::{target, KernelAt};
use crate::attrs::{fill_stat, fill_statx};
use crate::cluster;
use crate::fd_table;
use crate::guard::{serve, Res};
use crate::mounts::{Mount, Target};
use crate::node;
use crate::open_file::{Kind, OpenFile};
use crate::real;
use crate::stats::Op;
use libc::{c_char, c_int, c_uint};
use shoal_client::{may_access, Attr};
use std::sync::Arc;

/// The attributes of a path (following a final symlink if `follow`).
fn path_attr(t: &Target, follow: bool, fresh: bool) -> Res<Attr> {
    let c = cluster::of(t.mount)?;
    let mut a = if follow { c.block_on(c.client.stat(&t.shoal))? } else { c.block_on(c.client.lstat(&t.shoal))? };
    special_check(&c, &a)?;
    if let Some(n) = node::find(t.mount.index, a.ino) {
        a = n.attr(crate::settings::get().cache_ttl)?;
    } else if fresh {
        a = c.block_on(c.client.getattr_fresh(a.ino))?;
    }
    Ok(a)
}

/// The attributes of a served descriptor.
fn fd_attr(fd: c_int, of: &Arc<OpenFile>, fresh: bool) -> Res<Attr> {
    match of.kind {
        Kind::File => {
            let (_st, node) = of.node(fd)?;
            if fresh {
                return node.refresh();
            }
            node.attr(crate::settings::get().cache_ttl)
        }
        Kind::Dir | Kind::DirPath => {
            let c = cluster::of(of.mount)?;
            Ok(if fresh { c.block_on(c.client.getattr_fresh(of.ino))? } else { c.block_on(c.client.getattr(of.ino))? })
        }
    }
}

/// Where a `*stat*at` call with `flags` goes: a served descriptor (empty path), a path,
/// or the kernel.
enum What {
    Fd(c_int, Arc<OpenFile>),
    Path(Target),
    Kernel,
}

unsafe fn what(dirfd: c_int, path: *const c_char, flags: c_int) -> What {
    // SAFETY: the caller's path.
    let empty = unsafe { super::bytes(path) }.is_some_and(|p| p.is_empty());
    if empty && flags & libc::AT_EMPTY_PATH != 0 {
        return match fd_table::get(dirfd) {
            Some(of) => What::Fd(dirfd, of),
            // SAFETY: "." names the working directory.
            None if dirfd == libc::AT_FDCWD => match unsafe { target(libc::AT_FDCWD, c".".as_ptr()) } {
                Some(t) => What::Path(t),
                None => What::Kernel,
            },
            None => What::Kernel,
        };
    }
    // SAFETY: the caller's arguments.
    match unsafe { target(dirfd, path) } {
        Some(t) => What::Path(t),
        None => What::Kernel,
    }
}

unsafe fn stat_at(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::fstatat64(k_dirfd.dirfd(), k_dirfd.path(), buf, flags) }
    };
    if flags & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH | libc::AT_NO_AUTOMOUNT) != 0 {
        return kernel();
    }
    // SAFETY: the caller's arguments.
    let (mount, attr): (&Mount, Box<dyn FnOnce() -> Res<Attr>>) = match unsafe { what(dirfd, path, flags) } {
        What::Kernel => return kernel(),
        What::Fd(fd, of) => (of.mount, Box::new(move || fd_attr(fd, &of, false))),
        What::Path(t) => {
            let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
            (t.mount, Box::new(move || path_attr(&t, follow, false)))
        }
    };
    serve(
        Op::Stat,
        || {
            let a = attr()?;
            // SAFETY: the caller's buffer.
            fill_stat(mount, &a, unsafe { &mut *buf });
            Ok(0)
        },
        kernel,
    )
}

unsafe fn fstat_fd(fd: c_int, buf: *mut libc::stat64) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::fstat64(fd, buf) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(
        Op::Stat,
        || {
            let a = fd_attr(fd, &of, false)?;
            // SAFETY: the caller's buffer.
            fill_stat(of.mount, &a, unsafe { &mut *buf });
            Ok(0)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_at(libc::AT_FDCWD, path, buf, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_at(libc::AT_FDCWD, path, buf, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_at(libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_at(libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat64) -> c_int {
    unsafe { fstat_fd(fd, buf) }
}

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int {
    unsafe { fstat_fd(fd, buf) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int {
    unsafe { stat_at(dirfd, path, buf, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int {
    unsafe { stat_at(dirfd, path, buf, flags) }
}

// The entry points of binaries built against glibc before 2.33 (`ver` is the layout,
// always _STAT_VER_LINUX on x86-64 and AArch64, where `struct stat` is `struct stat64`).

#[no_mangle]
pub unsafe extern "C" fn __xstat(_ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_at(libc::AT_FDCWD, path, buf, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __xstat64(_ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_at(libc::AT_FDCWD, path, buf, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __lxstat(_ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_at(libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn __lxstat64(_ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_at(libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int {
    unsafe { fstat_fd(fd, buf) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int {
    unsafe { fstat_fd(fd, buf) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_at(dirfd, path, buf, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_at(dirfd, path, buf, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::statx(k_dirfd.dirfd(), k_dirfd.path(), flags, mask, buf) }
    };
    const KNOWN: c_int =
        libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH | libc::AT_NO_AUTOMOUNT | libc::AT_STATX_SYNC_TYPE;
    if flags & !KNOWN != 0 || flags & libc::AT_STATX_SYNC_TYPE == libc::AT_STATX_SYNC_TYPE {
        return kernel();
    }
    let fresh = flags & libc::AT_STATX_FORCE_SYNC != 0;
    // SAFETY: the caller's arguments.
    let (mount, attr): (&Mount, Box<dyn FnOnce() -> Res<Attr>>) = match unsafe { what(dirfd, path, flags) } {
        What::Kernel => return kernel(),
        What::Fd(fd, of) => (of.mount, Box::new(move || fd_attr(fd, &of, fresh))),
        What::Path(t) => {
            let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
            (t.mount, Box::new(move || path_attr(&t, follow, fresh)))
        }
    };
    serve(
        Op::Stat,
        || {
            let a = attr()?;
            // SAFETY: the caller's buffer.
            fill_statx(mount, &a, unsafe { &mut *buf });
            Ok(0)
        },
        kernel,
    )
}

// ---------------------------------------------------------------- access

unsafe fn access_at(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::faccessat(k_dirfd.dirfd(), k_dirfd.path(), mode, flags) }
    };
    if mode & !7 != 0 || flags & !(libc::AT_EACCESS | libc::AT_SYMLINK_NOFOLLOW) != 0 {
        return kernel();
    }
    // access(2) checks the real ids; the client acts as the effective ones.
    // SAFETY: getters without preconditions.
    let same_ids = unsafe { libc::getuid() == libc::geteuid() && libc::getgid() == libc::getegid() };
    if flags & libc::AT_EACCESS == 0 && !same_ids {
        return kernel();
    }
    // SAFETY: the caller's arguments.
    let Some(t) = (unsafe { target(dirfd, path) }) else { return kernel() };
    serve(
        Op::Access,
        || {
            let c = cluster::of(t.mount)?;
            let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
            let a = c.block_on(c.client.resolve(&t.shoal, follow))?;
            special_check(&c, &a)?;
            let mask = mode as u32;
            if mask != 0 && !may_access(&a, &c.cred, mask) {
                c.block_on(c.client.access(a.ino, mask))?;
            }
            Ok(0)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    unsafe { access_at(libc::AT_FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    unsafe { access_at(dirfd, path, mode, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn euidaccess(path: *const c_char, mode: c_int) -> c_int {
    unsafe { access_at(libc::AT_FDCWD, path, mode, libc::AT_EACCESS) }
}

#[no_mangle]
pub unsafe extern "C" fn eaccess(path: *const c_char, mode: c_int) -> c_int {
    unsafe { access_at(libc::AT_FDCWD, path, mode, libc::AT_EACCESS) }
}

// ---------------------------------------------------------------- statfs on a descriptor

/// The mount point of a served descriptor (statfs of it is the file system's).
fn mount_dir(fd: c_int) -> Option<std::ffi::CString> {
    let of = fd_table::get(fd)?;
    std::ffi::CString::new(of.mount.dir.as_bytes()).ok()
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs(fd: c_int, buf: *mut libc::statfs64) -> c_int {
    match mount_dir(fd) {
        // SAFETY: the mount point, and the caller's buffer.
        Some(dir) => unsafe { real::statfs64(dir.as_ptr(), buf) },
        // SAFETY: the caller's arguments.
        None => unsafe { real::fstatfs64(fd, buf) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs64(fd: c_int, buf: *mut libc::statfs64) -> c_int {
    unsafe { fstatfs(fd, buf) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs(fd: c_int, buf: *mut libc::statvfs64) -> c_int {
    match mount_dir(fd) {
        // SAFETY: the mount point, and the caller's buffer.
        Some(dir) => unsafe { real::statvfs64(dir.as_ptr(), buf) },
        // SAFETY: the caller's arguments.
        None => unsafe { real::fstatvfs64(fd, buf) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs64(fd: c_int, buf: *mut libc::statvfs64) -> c_int {
    unsafe { fstatvfs(fd, buf) }
}
