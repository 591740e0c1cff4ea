//! Calls on a Shoal descriptor that only the kernel can make: `mmap` (pages of the
//! file), `flock`, `lockf` and `fcntl` locks (the mount's lock table, shared with every
//! other process of the node), extended attributes on a descriptor (the mount answers
//! some itself, such as `shoal.layout`), `ioctl`, `splice` and `tee` (pipes), and `fdopen`
//! (stdio does its I/O inside the C library, through calls that cannot be intercepted).
//! Each hands the descriptor to the kernel first (`open_file::convert`); from then on the
//! mount serves it. `FICLONE`-style ioctls are answered as the mount answers them
//! (unsupported) without converting, so that `cp` falls back to copying through the
//! library; `isatty` answers "no" without the kernel seeing the placeholder.

use super::kernel_only;
use crate::fd_table;
use crate::real;
use libc::{c_char, c_int, c_uint, c_ulong, c_void, off64_t, size_t, ssize_t, FILE};

#[no_mangle]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off64_t) -> *mut c_void {
    // SAFETY: the caller's arguments.
    let call = || unsafe { real::mmap64(addr, len, prot, flags, fd, off) };
    if flags & libc::MAP_ANONYMOUS != 0 || fd_table::get(fd).is_none() {
        return call();
    }
    let r = kernel_only(fd, || 0 as c_int);
    if r < 0 {
        return libc::MAP_FAILED;
    }
    call()
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off64_t) -> *mut c_void {
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

#[no_mangle]
pub unsafe extern "C" fn fgetxattr(fd: c_int, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    kernel_only(fd, || unsafe { real::fgetxattr(fd, name, v, n) })
}

#[no_mangle]
pub unsafe extern "C" fn fsetxattr(fd: c_int, name: *const c_char, v: *const c_void, n: size_t, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    kernel_only(fd, || unsafe { real::fsetxattr(fd, name, v, n, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn flistxattr(fd: c_int, list: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    kernel_only(fd, || unsafe { real::flistxattr(fd, list, n) })
}

#[no_mangle]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    // SAFETY: the caller's arguments.
    kernel_only(fd, || unsafe { real::fremovexattr(fd, name) })
}

#[no_mangle]
pub unsafe extern "C" fn splice(fin: c_int, oin: *mut off64_t, fout: c_int, oout: *mut off64_t, n: size_t, flags: c_uint) -> ssize_t {
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

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's arguments.
    kernel_only(fd, || unsafe { real::fdopen(fd, mode) })
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
