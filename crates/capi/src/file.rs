//! Open files and their blocking calls.

use crate::client::{client, put_attr, shoal_attr, shoal_client, text};
use crate::error::{fail, guard, status};
use ::shoal_client::{File, OpenFlags};
use std::ffi::{c_char, c_int, c_void};
use std::future::Future;
use std::sync::Arc;

/// An open file.
#[allow(non_camel_case_types)]
pub struct shoal_file {
    pub(crate) file: Arc<File>,
    pub(crate) rt: tokio::runtime::Handle,
}

impl shoal_file {
    /// The open file `f`, driven by the runtime `rt`, for the caller (freed by `shoal_close`).
    pub(crate) fn new(f: File, rt: tokio::runtime::Handle) -> *mut shoal_file {
        Box::into_raw(Box::new(shoal_file { file: Arc::new(f), rt }))
    }

    /// Run `fut` to its end on the calling thread (see `error::block`).
    pub(crate) fn block<T>(&self, fut: impl Future<Output = ::shoal_client::Result<T>>) -> Option<T> {
        crate::error::block(&self.rt, fut)
    }
}

/// The file behind `f`; `None` (EFAULT) for NULL.
pub(crate) fn file<'a>(f: *const shoal_file) -> Option<&'a shoal_file> {
    if f.is_null() {
        fail(libc::EFAULT, "the shoal_file is NULL");
        return None;
    }
    // SAFETY: a non-NULL handle comes from `shoal_open` and is not yet closed.
    Some(unsafe { &*f })
}

/// Open (with O_CREAT: create) the file `path`. `flags` are open(2)'s: O_RDONLY, O_WRONLY
/// or O_RDWR, with O_CREAT, O_EXCL, O_TRUNC, O_APPEND; `mode` the permission bits of a
/// created file. Returns NULL on failure (errno set).
#[no_mangle]
pub extern "C" fn shoal_open(c: *const shoal_client, path: *const c_char, flags: c_int, mode: u32) -> *mut shoal_file {
    guard(std::ptr::null_mut(), || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return std::ptr::null_mut() };
        let Some(how) = open_flags(path, flags, mode) else { return std::ptr::null_mut() };
        match c.block(c.client.open(path, how)) {
            Some(f) => shoal_file::new(f, c.rt.handle().clone()),
            None => std::ptr::null_mut(),
        }
    })
}

/// open(2)'s `flags` and `mode` for `path`; `None` (EINVAL set) for a bad access mode.
pub(crate) fn open_flags(path: &str, flags: c_int, mode: u32) -> Option<OpenFlags> {
    let access = flags & libc::O_ACCMODE;
    if access != libc::O_RDONLY && access != libc::O_WRONLY && access != libc::O_RDWR {
        fail(libc::EINVAL, format_args!("open {path}: bad access mode in flags {flags:#o}"));
        return None;
    }
    Some(OpenFlags {
        read: access != libc::O_WRONLY,
        write: access != libc::O_RDONLY,
        append: flags & libc::O_APPEND != 0,
        create: flags & libc::O_CREAT != 0,
        exclusive: flags & libc::O_EXCL != 0,
        truncate: flags & libc::O_TRUNC != 0,
        perm: mode & 0o7777,
        layout: None,
    })
}

/// Close `f` and free it: waits for its writes and publishes its size (the data is on the
/// servers when it returns 0). Fails with EBUSY, leaving `f` open, while futures of `f`
/// have not finished. -1 also reports a failed write that had returned.
#[no_mangle]
pub extern "C" fn shoal_close(f: *mut shoal_file) -> c_int {
    guard(-1, || {
        if f.is_null() {
            fail(libc::EFAULT, "the shoal_file is NULL");
            return -1;
        }
        // SAFETY: `f` came from `shoal_open` and is not closed yet.
        if Arc::strong_count(unsafe { &(*f).file }) > 1 {
            fail(libc::EBUSY, "close: futures of this file are still running (wait for them first)");
            return -1;
        }
        // SAFETY: as above; from here `f` is gone whatever the outcome.
        let sf = unsafe { Box::from_raw(f) };
        let Ok(file) = Arc::try_unwrap(sf.file) else {
            fail(libc::EBUSY, "close: futures of this file are still running");
            return -1;
        };
        status(crate::error::block(&sf.rt, file.close()))
    })
}

/// The bytes count of a call, or -1.
fn count(r: Option<usize>) -> isize {
    r.map_or(-1, |n| n as isize)
}

/// Read up to `len` bytes at `offset` into `buf`. Returns the bytes read (fewer at the end
/// of the file, 0 past it) or -1.
#[no_mangle]
pub extern "C" fn shoal_pread(f: *const shoal_file, buf: *mut c_void, len: usize, offset: u64) -> isize {
    guard(-1, || {
        let Some(f) = file(f) else { return -1 };
        if buf.is_null() && len > 0 {
            fail(libc::EFAULT, "pread: the buffer is NULL");
            return -1;
        }
        let Some(data) = f.block(f.file.read_at(offset, len)) else { return -1 };
        let n = data.len().min(len);
        // SAFETY: `buf` holds `len` bytes of the caller's, and n <= len.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf as *mut u8, n) };
        n as isize
    })
}

/// Write `len` bytes from `buf` at `offset`. Returns `len` or -1. The data may still be on
/// its way to the servers (write-behind): `shoal_fsync` or `shoal_close` report a failure.
#[no_mangle]
pub extern "C" fn shoal_pwrite(f: *const shoal_file, buf: *const c_void, len: usize, offset: u64) -> isize {
    guard(-1, || {
        let Some(f) = file(f) else { return -1 };
        let Some(data) = bytes_of(buf, len) else { return -1 };
        count(f.block(f.file.write_at(offset, data)))
    })
}

/// The caller's `len` bytes at `buf`; `None` (EFAULT) for NULL with a length.
pub(crate) fn bytes_of<'a>(buf: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if buf.is_null() {
        fail(libc::EFAULT, "the buffer is NULL");
        return None;
    }
    // SAFETY: the caller's buffer of `len` bytes, alive for the call.
    Some(unsafe { std::slice::from_raw_parts(buf as *const u8, len) })
}

/// Make the file's data and size durable on the servers. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_fsync(f: *const shoal_file) -> c_int {
    guard(-1, || {
        let Some(f) = file(f) else { return -1 };
        status(f.block(f.file.fsync()))
    })
}

/// Attributes of the open file into `out` (its size includes this handle's writes). 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_fstat(f: *const shoal_file, out: *mut shoal_attr) -> c_int {
    guard(-1, || {
        let Some(f) = file(f) else { return -1 };
        put_attr(f.block(f.file.stat()), out)
    })
}
