//! Calls on a Shoal descriptor that only the kernel can make: `mmap` (pages of the
//! file), `flock`, `lockf` and `fcntl` locks (the mount's lock table, shared with every
//! other process of the node), `ioctl`, `splice` and `tee` (pipes). Each hands the
//! descriptor to the kernel first (`open_file::convert`); from then on the mount serves
//! it. Extended attributes on a descriptor (the mount answers some itself, such as
//! `shoal.layout`) are asked of the kernel by the file's path when it still leads to the
//! file, so the descriptor stays served (`cp -a` sets ACLs on every file it copies).
//!
//! A private mapping (`MAP_PRIVATE`) of up to 64 MiB is made without the kernel: anonymous
//! memory filled with the file's bytes. POSIX leaves unspecified whether a private
//! mapping sees later changes of the file, so a copy made at `mmap` is one (pages past the
//! end of the file read as zeros instead of raising SIGBUS). Shared mappings, and larger
//! private ones, are the kernel's. `FICLONE`-style ioctls are answered as the mount answers them
//! (unsupported) without converting, so that `cp` falls back to copying through the
//! library; `isatty` answers "no" without the kernel seeing the placeholder.

use super::kernel_only;
use crate::fd_table;
use crate::guard::{fail, serve, Res};
use crate::open_file::{Kind, OpenFile};
use crate::real;
use crate::stats::Op;
use std::sync::Arc;

/// Largest private mapping made as a copy.
const PRIVATE_COPY_MAX: usize = 64 << 20;

/// A private mapping of a served file: anonymous memory with the file's bytes.
fn map_copy(
    fd: c_int,
    of: &Arc<OpenFile>,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    off: off64_t,
) -> Res<*mut c_void> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096);
    if len == 0 || off < 0 || off % page != 0 {
        return fail(libc::EINVAL);
    }
    if !of.readable() {
        return fail(libc::EACCES);
    }
    let anon = (flags & !libc::MAP_SHARED) | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: an anonymous mapping where the caller asked for one.
    let p = unsafe { real::mmap64(addr, len, libc::PROT_READ | libc::PROT_WRITE, anon, -1, 0) };
    if p == libc::MAP_FAILED {
        return fail(crate::guard::errno());
    }
    // SAFETY: `p` is `len` writable bytes just mapped.
    let buf = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
    let filled = super::io::read_into(fd, of, off as u64, buf);
    // SAFETY: our mapping.
    let protected =
        filled.is_ok() && (prot == libc::PROT_READ | libc::PROT_WRITE || unsafe { real::mprotect(p, len, prot) } == 0);
    if !protected {
        let e = crate::guard::errno();
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, len) };
        filled?;
        return fail(e);
    }
    Ok(p)
}
use libc::{c_char, c_int, c_uint, c_ulong, c_void, off64_t, size_t, ssize_t};

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    // SAFETY: the caller's arguments.
    let call = || unsafe { real::mmap64(addr, len, prot, flags, fd, off) };
    if flags & libc::MAP_ANONYMOUS != 0 {
        return call();
    }
    let Some(of) = fd_table::get(fd) else { return call() };
    let private = flags & (libc::MAP_SHARED | libc::MAP_PRIVATE) == libc::MAP_PRIVATE;
    if private && of.kind == Kind::File && len <= PRIVATE_COPY_MAX {
        return serve(Op::Map, || map_copy(fd, &of, addr, len, prot, flags, off), call);
    }
    let r = kernel_only(fd, || 0 as c_int);
    if r < 0 {
        return libc::MAP_FAILED;
    }
    call()
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    kernel_only(fd, || unsafe { real::flock(fd, op) })
}

#[no_mangle]
pub unsafe extern "C" fn lockf(fd: c_int, cmd: c_int, len: libc::off_t) -> c_int {
    // SAFETY: the caller's arguments.
    kernel_only(fd, || unsafe { real::lockf64(fd, cmd, len) })
}

#[no_mangle]
pub unsafe extern "C" fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    // SAFETY: the caller's arguments.
    kernel_only(fd, || unsafe { real::lockf64(fd, cmd, len) })
}

/// The host path of served descriptor `fd` if the kernel finds the same file there, for
/// extended attribute calls made by path (the mount answers them; the descriptor stays
/// served). None: not served, or the path leads elsewhere now (then the descriptor is
/// handed to the kernel instead).
fn xattr_path(fd: c_int) -> Option<std::ffi::CString> {
    let of = fd_table::get(fd)?;
    let host = std::ffi::CString::new(of.host().as_bytes()).ok()?;
    // SAFETY: a stat of a NUL-terminated path into our own buffer.
    let same = unsafe {
        let mut st: libc::stat64 = std::mem::zeroed();
        real::fstatat64(libc::AT_FDCWD, host.as_ptr(), &mut st, 0) == 0
            && st.st_ino == of.ino.0
            && st.st_dev == of.mount.dev
    };
    same.then_some(host)
}

#[no_mangle]
pub unsafe extern "C" fn fgetxattr(fd: c_int, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t {
    match xattr_path(fd) {
        // SAFETY: the caller's arguments, by the file's path.
        Some(p) => unsafe { real::getxattr(p.as_ptr(), name, v, n) },
        // SAFETY: the caller's arguments.
        None => kernel_only(fd, || unsafe { real::fgetxattr(fd, name, v, n) }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fsetxattr(fd: c_int, name: *const c_char, v: *const c_void, n: size_t, flags: c_int) -> c_int {
    match xattr_path(fd) {
        // SAFETY: the caller's arguments, by the file's path.
        Some(p) => unsafe { real::setxattr(p.as_ptr(), name, v, n, flags) },
        // SAFETY: the caller's arguments.
        None => kernel_only(fd, || unsafe { real::fsetxattr(fd, name, v, n, flags) }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn flistxattr(fd: c_int, list: *mut c_char, n: size_t) -> ssize_t {
    match xattr_path(fd) {
        // SAFETY: the caller's arguments, by the file's path.
        Some(p) => unsafe { real::listxattr(p.as_ptr(), list, n) },
        // SAFETY: the caller's arguments.
        None => kernel_only(fd, || unsafe { real::flistxattr(fd, list, n) }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    match xattr_path(fd) {
        // SAFETY: the caller's arguments, by the file's path.
        Some(p) => unsafe { real::removexattr(p.as_ptr(), name) },
        // SAFETY: the caller's arguments.
        None => kernel_only(fd, || unsafe { real::fremovexattr(fd, name) }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn splice(
    fin: c_int,
    oin: *mut off64_t,
    fout: c_int,
    oout: *mut off64_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    // SAFETY: the caller's arguments.
    let call = || unsafe { real::splice(fin, oin, fout, oout, n, flags) };
    kernel_only(fin, || kernel_only(fout, call))
}

#[no_mangle]
pub unsafe extern "C" fn tee(fin: c_int, fout: c_int, n: size_t, flags: c_uint) -> ssize_t {
    // SAFETY: the caller's arguments.
    let call = || unsafe { real::tee(fin, fout, n, flags) };
    kernel_only(fin, || kernel_only(fout, call))
}

/// `FICLONE`, `FICLONERANGE`, `FIDEDUPERANGE`: reflinks, which the mount does not offer.
const CLONE_IOCTLS: [c_ulong; 3] = [0x4004_9409, 0x4020_940d, 0xc018_9436];

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: usize) -> c_int {
    // SAFETY: the caller's arguments.
    let call = || unsafe { real::ioctl(fd, request, arg) };
    if fd_table::get(fd).is_none() {
        // A clone whose source is Shoal's (FICLONE's argument is the source descriptor).
        if request == CLONE_IOCTLS[0] && fd_table::get(arg as c_int).is_some() {
            crate::guard::set_errno(libc::EXDEV);
            return -1;
        }
        return call();
    }
    if CLONE_IOCTLS.contains(&request) {
        crate::guard::set_errno(libc::EOPNOTSUPP);
        return -1;
    }
    if request == libc::TCGETS {
        crate::guard::set_errno(libc::ENOTTY);
        return -1;
    }
    kernel_only(fd, call)
}

#[no_mangle]
pub unsafe extern "C" fn isatty(fd: c_int) -> c_int {
    if fd_table::get(fd).is_some() {
        crate::guard::set_errno(libc::ENOTTY);
        return 0;
    }
    // SAFETY: the caller's argument.
    unsafe { real::isatty(fd) }
}
