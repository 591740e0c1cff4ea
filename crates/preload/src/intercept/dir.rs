//! Directories: `opendir`, `fdopendir`, `readdir`, `readdir64`, `readdir_r`,
//! `readdir64_r`, `closedir`, `dirfd`, `rewinddir`, `telldir`, `seekdir`, `getdents64`,
//! `chdir`, `fchdir`.
//!
//! A stream of ours (`dir_stream.rs`) reads the listing of its served descriptor
//! (`listing.rs`): a page of names per request, `d_off`/`telldir` the entry's index.
//! `chdir` is always the kernel's (the kernel keeps the working directory); the library
//! only remembers where it went, to resolve relative paths.

use super::open::open_at;
use crate::cluster;
use crate::dir_stream::{self, Stream};
use crate::fd_table;
use crate::guard::{fail, serve, Res};
use crate::listing::Entry;
use crate::mounts;
use crate::open_file::Kind;
use crate::real;
use crate::stats::Op;
use libc::{c_char, c_int, c_long, c_void, size_t, ssize_t, DIR};
use std::sync::atomic::Ordering;

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    // SAFETY: the caller's path.
    let kernel = || unsafe { real::opendir(path) };
    // SAFETY: as above.
    if unsafe { super::target(libc::AT_FDCWD, path) }.is_none() {
        return kernel();
    }
    // The directory opened as the kernel's opendir does; then a stream of ours on it.
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: as above.
    let fd = unsafe { open_at(libc::AT_FDCWD, path, flags, 0) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    if fd_table::get(fd).is_none() {
        // The open went to the kernel: make the C library's stream on its descriptor.
        // SAFETY: a directory descriptor we just opened.
        return unsafe { real::fdopendir(fd) };
    }
    match dir_stream::open(fd) {
        Some(d) => d,
        None => {
            // All streams in use: the kernel's.
            // SAFETY: our descriptor.
            unsafe { super::open::close(fd) };
            kernel()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut DIR {
    // SAFETY: the caller's argument.
    let kernel = || unsafe { real::fdopendir(fd) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(
        Op::Dir,
        || match of.kind {
            Kind::File => fail(libc::ENOTDIR),
            Kind::DirPath => fail(libc::EBADF),
            Kind::Dir => match dir_stream::open(fd) {
                Some(d) => Ok(d),
                None => {
                    super::kernel_dirfd(fd);
                    Err(crate::guard::Out::Kernel)
                }
            },
        },
        kernel,
    )
}

/// The next entry of stream `s` into its buffer; None at the end.
fn next_entry(s: &Stream) -> Res<Option<*mut libc::dirent64>> {
    let fd = s.fd.load(Ordering::Acquire);
    let Some(of) = fd_table::get(fd) else { return kernel_next(s, fd) };
    let c = cluster::of(of.mount)?;
    let _pos = of.pos.lock();
    let index = of.offset.load(Ordering::Relaxed);
    let r = of.with_listing(fd, |l| {
        Ok(l.get(&c, index)?.map(|e| {
            // SAFETY: the stream's own buffer (one reader per stream).
            unsafe { fill(&mut *s.ent.get(), e, index + 1) };
            s.ent.get()
        }))
    });
    match r {
        Ok(Some(p)) => {
            of.offset.store(index + 1, Ordering::Relaxed);
            s.next.store(index + 1, Ordering::Relaxed);
            Ok(Some(p))
        }
        Ok(None) => Ok(None),
        // The descriptor was handed to the kernel just now.
        Err(crate::guard::Out::Kernel) => kernel_next(s, fd),
        Err(e) => Err(e),
    }
}

/// The stream's descriptor is the kernel's now: read on with the C library's stream on a
/// duplicate of it, past the entries already returned.
fn kernel_next(s: &Stream, fd: c_int) -> Res<Option<*mut libc::dirent64>> {
    let mut d = s.kernel.load(Ordering::Acquire);
    if d.is_null() {
        // SAFETY: descriptor calls on the stream's descriptor.
        unsafe {
            let dup = real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
            if dup < 0 {
                return fail(crate::guard::errno());
            }
            d = real::fdopendir(dup);
            if d.is_null() {
                let e = crate::guard::errno();
                real::close(dup);
                return fail(e);
            }
            for _ in 0..s.next.load(Ordering::Relaxed) {
                if real::readdir64(d).is_null() {
                    break;
                }
            }
        }
        s.kernel.store(d, Ordering::Release);
    }
    crate::guard::set_errno(0);
    // SAFETY: the C library's stream we made.
    let e = unsafe { real::readdir64(d) };
    if e.is_null() {
        let err = crate::guard::errno();
        return if err != 0 { fail(err) } else { Ok(None) };
    }
    s.next.fetch_add(1, Ordering::Relaxed);
    Ok(Some(e))
}

/// Put entry `e` into a dirent, `off` being the position after it.
fn fill(d: &mut libc::dirent64, e: &Entry, off: u64) {
    d.d_ino = e.ino;
    d.d_off = off as i64;
    d.d_type = e.dtype;
    let name = e.name.as_bytes();
    let n = name.len().min(d.d_name.len() - 1);
    for (dst, src) in d.d_name.iter_mut().zip(&name[..n]) {
        *dst = *src as c_char;
    }
    d.d_name[n] = 0;
    d.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
}

unsafe fn readdir_any(d: *mut DIR) -> *mut libc::dirent64 {
    let Some(s) = dir_stream::ours(d) else {
        // SAFETY: the C library's stream.
        return unsafe { real::readdir64(d) };
    };
    // End of the listing: NULL with errno untouched (serve restores it).
    serve(Op::Dir, || Ok(next_entry(s)?.unwrap_or(std::ptr::null_mut())), std::ptr::null_mut)
}

#[no_mangle]
pub unsafe extern "C" fn readdir(d: *mut DIR) -> *mut libc::dirent {
    // struct dirent and struct dirent64 are the same on 64-bit Linux.
    unsafe { readdir_any(d).cast() }
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(d: *mut DIR) -> *mut libc::dirent64 {
    unsafe { readdir_any(d) }
}

unsafe fn readdir_r_any(d: *mut DIR, entry: *mut libc::dirent64, out: *mut *mut libc::dirent64) -> c_int {
    if dir_stream::ours(d).is_none() {
        // SAFETY: the C library's stream and the caller's buffers.
        return unsafe { real::readdir64_r(d, entry, out) };
    }
    let saved = crate::guard::errno();
    crate::guard::set_errno(0);
    // SAFETY: our stream.
    let e = unsafe { readdir_any(d) };
    let err = crate::guard::errno();
    crate::guard::set_errno(saved);
    // SAFETY: the caller's buffers.
    unsafe {
        if e.is_null() {
            *out = std::ptr::null_mut();
            return err;
        }
        std::ptr::copy_nonoverlapping(e, entry, 1);
        *out = entry;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn readdir_r(d: *mut DIR, entry: *mut libc::dirent, out: *mut *mut libc::dirent) -> c_int {
    unsafe { readdir_r_any(d, entry.cast(), out.cast()) }
}

#[no_mangle]
pub unsafe extern "C" fn readdir64_r(d: *mut DIR, entry: *mut libc::dirent64, out: *mut *mut libc::dirent64) -> c_int {
    unsafe { readdir_r_any(d, entry, out) }
}

#[no_mangle]
pub unsafe extern "C" fn closedir(d: *mut DIR) -> c_int {
    let Some(s) = dir_stream::ours(d) else {
        // SAFETY: the C library's stream.
        return unsafe { real::closedir(d) };
    };
    let fd = s.fd.load(Ordering::Acquire);
    let k = s.kernel.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !k.is_null() {
        // SAFETY: the C library's stream we made on a duplicate.
        unsafe { real::closedir(k) };
    }
    dir_stream::close(s);
    // SAFETY: the stream's descriptor, which it owns.
    unsafe { super::open::close(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn dirfd(d: *mut DIR) -> c_int {
    match dir_stream::ours(d) {
        Some(s) => s.fd.load(Ordering::Acquire),
        // SAFETY: the C library's stream.
        None => unsafe { real::dirfd(d) },
    }
}

/// Move stream `s` to `pos` (0: a fresh listing).
fn seek_stream(s: &Stream, pos: u64) {
    let fd = s.fd.load(Ordering::Acquire);
    if let Some(of) = fd_table::get(fd) {
        let _p = of.pos.lock();
        of.offset.store(pos, Ordering::Relaxed);
    }
    s.next.store(pos, Ordering::Relaxed);
    let k = s.kernel.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !k.is_null() {
        // SAFETY: our C library stream; reopened (and skipped to `pos`) on the next read.
        unsafe { real::closedir(k) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(d: *mut DIR) {
    match dir_stream::ours(d) {
        Some(s) => seek_stream(s, 0),
        // SAFETY: the C library's stream.
        None => unsafe { real::rewinddir(d) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn telldir(d: *mut DIR) -> c_long {
    match dir_stream::ours(d) {
        Some(s) => s.next.load(Ordering::Relaxed) as c_long,
        // SAFETY: the C library's stream.
        None => unsafe { real::telldir(d) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(d: *mut DIR, pos: c_long) {
    match dir_stream::ours(d) {
        Some(s) => seek_stream(s, pos.max(0) as u64),
        // SAFETY: the C library's stream.
        None => unsafe { real::seekdir(d, pos) },
    }
}

/// `getdents64` on a served directory: records from the description's position.
fn getdents(fd: c_int, buf: *mut c_void, n: usize) -> Res<ssize_t> {
    let Some(of) = fd_table::get(fd) else { return Err(crate::guard::Out::Kernel) };
    match of.kind {
        Kind::Dir => {}
        Kind::DirPath => return fail(libc::EBADF),
        Kind::File => return fail(libc::ENOTDIR),
    }
    let c = cluster::of(of.mount)?;
    let _pos = of.pos.lock();
    let mut index = of.offset.load(Ordering::Relaxed);
    let mut used = 0usize;
    let header = std::mem::offset_of!(libc::dirent64, d_name);
    of.with_listing(fd, |l| {
        while let Some(e) = l.get(&c, index)? {
            let reclen = (header + e.name.len() + 1).next_multiple_of(8);
            if used + reclen > n {
                if used == 0 {
                    return fail(libc::EINVAL);
                }
                break;
            }
            // SAFETY: `reclen` bytes at `used` are inside the caller's buffer of `n`; the
            // record is written field by field, unaligned.
            unsafe {
                let p = buf.cast::<u8>().add(used);
                std::ptr::write_bytes(p, 0, reclen);
                p.add(std::mem::offset_of!(libc::dirent64, d_ino)).cast::<u64>().write_unaligned(e.ino);
                p.add(std::mem::offset_of!(libc::dirent64, d_off)).cast::<i64>().write_unaligned(index as i64 + 1);
                p.add(std::mem::offset_of!(libc::dirent64, d_reclen)).cast::<u16>().write_unaligned(reclen as u16);
                p.add(std::mem::offset_of!(libc::dirent64, d_type)).write(e.dtype);
                std::ptr::copy_nonoverlapping(e.name.as_ptr(), p.add(header), e.name.len());
            }
            used += reclen;
            index += 1;
        }
        Ok(())
    })?;
    of.offset.store(index, Ordering::Relaxed);
    Ok(used as ssize_t)
}

#[no_mangle]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::getdents64(fd, buf, n) };
    if fd_table::get(fd).is_none() {
        return kernel();
    }
    serve(Op::Dir, || getdents(fd, buf, n), kernel)
}

// ---------------------------------------------------------------- working directory

#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    // SAFETY: the caller's path.
    let r = unsafe { real::chdir(path) };
    if r == 0 {
        mounts::refresh_cwd();
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let Some(of) = fd_table::get(fd) else {
        // SAFETY: the caller's argument.
        let r = unsafe { real::fchdir(fd) };
        if r == 0 {
            mounts::refresh_cwd();
        }
        return r;
    };
    serve(
        Op::Chdir,
        || {
            if of.kind == Kind::File {
                return fail(libc::ENOTDIR);
            }
            // The kernel keeps the working directory: go there by the directory's path.
            let host = std::ffi::CString::new(of.host().as_bytes()).map_err(|_| crate::guard::Out::Kernel)?;
            // SAFETY: a NUL-terminated path.
            if unsafe { real::chdir(host.as_ptr()) } != 0 {
                return fail(crate::guard::errno());
            }
            mounts::refresh_cwd();
            Ok(0)
        },
        || {
            super::kernel_dirfd(fd);
            // SAFETY: the caller's argument, now a kernel descriptor.
            let r = unsafe { real::fchdir(fd) };
            if r == 0 {
                mounts::refresh_cwd();
            }
            r
        },
    )
}
