//! stdio on Shoal files: `fopen`, `fopen64` and `fdopen`.
//!
//! The C library's streams do their I/O inside the C library, with calls no interposer
//! sees, so a stream cannot sit on a served descriptor as it is. Two ways out: hand the
//! descriptor to the kernel (the mount then serves the stream), or give the stream
//! functions of ours to call. The library does the second: a Shoal path opened with
//! `fopen` is opened as `open` would (served), and the stream is made with the C library's
//! `fopencookie` on read/write/seek/close functions that call the library's own `read`,
//! `write`, `lseek` and `close` on the descriptor; the stream's descriptor field is set to
//! that descriptor, so `fileno` answers it and `fstat(fileno(f))`, `fsync(fileno(f))`
//! work as on any stream. This keeps a program that mixes stdio with plain calls on one
//! view of the files (`git` writes its config with `write` and reads it with `fopen`).
//!
//! The descriptor field is `_fileno` of glibc's `struct _IO_FILE`, whose layout is part of
//! glibc's ABI (`<bits/types/struct_FILE.h>`, unchanged since glibc 2.1). A check when the
//! library loads makes sure `fileno` reads what is written there; if not, streams on Shoal
//! files are the kernel's (`fopen` goes to the kernel, `fdopen` hands the descriptor over).

use super::open::open_at;
use crate::fd_table;
use crate::real;
use libc::{c_char, c_int, c_void, off64_t, size_t, ssize_t, FILE};
use std::sync::atomic::{AtomicBool, Ordering};

#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut off64_t, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, funcs: CookieIo) -> *mut FILE;
    fn fileno(f: *mut FILE) -> c_int;
    fn fclose(f: *mut FILE) -> c_int;
}

/// The head of glibc's `struct _IO_FILE`, up to `_fileno`.
#[repr(C)]
struct IoFileHead {
    flags: c_int,
    pointers: [*mut c_char; 11],
    markers: *mut c_void,
    chain: *mut c_void,
    fileno: c_int,
}

static COOKIES_WORK: AtomicBool = AtomicBool::new(false);

unsafe fn set_fileno(f: *mut FILE, fd: c_int) {
    // SAFETY: `f` is a live glibc stream, whose head has this layout.
    unsafe { (*f.cast::<IoFileHead>()).fileno = fd };
}

/// Check, once at load, that a cookie stream's descriptor can be set as described.
pub fn check() {
    let io = CookieIo { read: None, write: None, seek: None, close: None };
    // SAFETY: a stream with no functions, closed below; mode is a C string.
    unsafe {
        let f = fopencookie(std::ptr::null_mut(), c"r".as_ptr(), io);
        if f.is_null() {
            return;
        }
        let before = fileno(f);
        crate::guard::set_errno(0);
        set_fileno(f, 1_000_000);
        let after = fileno(f);
        set_fileno(f, -1);
        fclose(f);
        COOKIES_WORK.store(before == -1 && after == 1_000_000, Ordering::Relaxed);
    }
}

fn fd_of(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: the stream's buffer; the library's read (served, or the kernel's if the
    // descriptor was handed over).
    unsafe { super::io::read(fd_of(cookie), buf.cast(), n) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: as cookie_read.
    let k = unsafe { super::io::write(fd_of(cookie), buf.cast(), n) };
    // A cookie's write says an error with 0 (fopencookie(3)); errno stays set.
    k.max(0)
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, off: *mut off64_t, whence: c_int) -> c_int {
    // SAFETY: the C library's offset.
    unsafe {
        let r = super::io::lseek64(fd_of(cookie), *off, whence);
        if r < 0 {
            return -1;
        }
        *off = r;
    }
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: the stream owns its descriptor.
    unsafe { super::open::close(fd_of(cookie)) }
}

/// A stream on served descriptor `fd` with `mode` (as given to fopen/fdopen).
unsafe fn stream_on(fd: c_int, mode: *const c_char) -> *mut FILE {
    let io = CookieIo {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: the caller's mode string; the cookie is the descriptor number.
    unsafe {
        let f = fopencookie(fd as usize as *mut c_void, mode, io);
        if !f.is_null() {
            set_fileno(f, fd);
        }
        f
    }
}

/// open(2) flags of an fopen mode, or None for what the library leaves to the C library
/// (`,ccs=` character sets, unknown letters).
fn flags_of(mode: &[u8]) -> Option<c_int> {
    let (first, rest) = mode.split_first()?;
    let mut flags = match first {
        b'r' => libc::O_RDONLY,
        b'w' => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        b'a' => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for c in rest {
        match c {
            b'+' => flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR,
            b'x' => flags |= libc::O_EXCL,
            b'e' => flags |= libc::O_CLOEXEC,
            b'b' | b'm' | b'c' => {}
            _ => return None,
        }
    }
    Some(flags)
}

unsafe fn fopen_any(path: *const c_char, mode: *const c_char, kernel: impl FnOnce() -> *mut FILE) -> *mut FILE {
    if !COOKIES_WORK.load(Ordering::Relaxed) {
        return kernel();
    }
    // SAFETY: the caller's strings.
    let flags = unsafe { super::bytes(mode) }.and_then(flags_of);
    let (Some(flags), Some(_)) = (flags, unsafe { super::target(libc::AT_FDCWD, path) }) else { return kernel() };
    // SAFETY: the caller's path; mode 0666 as fopen's.
    let fd = unsafe { open_at(libc::AT_FDCWD, path, flags, 0o666) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: a descriptor just opened, owned by the stream from now on.
    unsafe {
        let f = if fd_table::get(fd).is_some() { stream_on(fd, mode) } else { real::fdopen(fd, mode) };
        if f.is_null() {
            let e = crate::guard::errno();
            super::open::close(fd);
            crate::guard::set_errno(e);
        }
        f
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    unsafe { fopen_any(path, mode, || real::fopen(path, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    unsafe { fopen_any(path, mode, || real::fopen(path, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if fd_table::get(fd).is_none() {
        // SAFETY: the caller's arguments.
        return unsafe { real::fdopen(fd, mode) };
    }
    if !COOKIES_WORK.load(Ordering::Relaxed) {
        // SAFETY: the caller's arguments, on a descriptor handed to the kernel.
        return super::kernel_only(fd, || unsafe { real::fdopen(fd, mode) });
    }
    // SAFETY: the caller's mode; the stream takes over the descriptor, as fdopen's does.
    unsafe { stream_on(fd, mode) }
}
