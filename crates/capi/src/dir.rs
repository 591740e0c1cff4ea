//! Directory listings: `shoal_opendir`, `shoal_readdir`, `shoal_closedir`.

use crate::client::{client, shoal_client, text};
use crate::error::{fail, guard};
use ::shoal_client::{DirEntry, FileKind};
use std::ffi::{c_char, c_int};

const _: () = assert!(SHOAL_NAME_MAX + 1 == 256 && SHOAL_DT_REG == libc::DT_REG && SHOAL_DT_DIR == libc::DT_DIR);

/// Longest name Shoal stores (bytes, without the NUL).
pub const SHOAL_NAME_MAX: usize = 255;
/// `shoal_dirent::kind` of a regular file, a directory, a symbolic link (Linux's `DT_REG`,
/// `DT_DIR`, `DT_LNK`).
pub const SHOAL_DT_REG: u8 = 8;
pub const SHOAL_DT_DIR: u8 = 4;
pub const SHOAL_DT_LNK: u8 = 10;

/// One directory entry.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct shoal_dirent {
    pub ino: u64,
    /// `SHOAL_DT_REG`, `SHOAL_DT_DIR` or `SHOAL_DT_LNK`.
    pub kind: u8,
    /// NUL-terminated (`SHOAL_NAME_MAX` bytes at most before the NUL).
    pub name: [c_char; 256],
}

/// A listing being read (the whole directory, fetched at `shoal_opendir`).
#[allow(non_camel_case_types)]
pub struct shoal_dir {
    entries: Vec<DirEntry>,
    next: usize,
    current: shoal_dirent,
}

/// List the directory `path`. NULL on failure (errno set). Entries come in listing order
/// (by name hash), not sorted; `.` and `..` are not listed.
#[no_mangle]
pub extern "C" fn shoal_opendir(c: *const shoal_client, path: *const c_char) -> *mut shoal_dir {
    guard(std::ptr::null_mut(), || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return std::ptr::null_mut() };
        let Some(entries) = c.block(c.client.readdir(path)) else { return std::ptr::null_mut() };
        shoal_dir::new(entries)
    })
}

impl shoal_dir {
    /// A listing of `entries` for the caller (freed by `shoal_closedir`).
    pub(crate) fn new(entries: Vec<DirEntry>) -> *mut shoal_dir {
        let current = shoal_dirent { ino: 0, kind: 0, name: [0; SHOAL_NAME_MAX + 1] };
        Box::into_raw(Box::new(shoal_dir { entries, next: 0, current }))
    }
}

/// The next entry of `d`, or NULL at the end (errno untouched) or for a NULL `d` (EFAULT).
/// The entry lives until the next call on `d`.
#[no_mangle]
pub extern "C" fn shoal_readdir(d: *mut shoal_dir) -> *const shoal_dirent {
    guard(std::ptr::null(), || {
        if d.is_null() {
            fail(libc::EFAULT, "the shoal_dir is NULL");
            return std::ptr::null();
        }
        // SAFETY: `d` came from `shoal_opendir` and is not closed yet.
        let d = unsafe { &mut *d };
        let Some(e) = d.entries.get(d.next) else { return std::ptr::null() };
        d.next += 1;
        d.current.ino = e.ino.0;
        d.current.kind = match e.kind {
            FileKind::File => SHOAL_DT_REG,
            FileKind::Dir => SHOAL_DT_DIR,
            FileKind::Symlink => SHOAL_DT_LNK,
        };
        let bytes = e.name.as_bytes();
        let n = bytes.len().min(SHOAL_NAME_MAX);
        for (dst, src) in d.current.name.iter_mut().zip(&bytes[..n]) {
            *dst = *src as c_char;
        }
        d.current.name[n] = 0;
        &d.current
    })
}

/// Free `d` (NULL: nothing). Returns 0.
#[no_mangle]
pub extern "C" fn shoal_closedir(d: *mut shoal_dir) -> c_int {
    guard(-1, || {
        if !d.is_null() {
            // SAFETY: `d` came from `shoal_opendir` and is freed once, here.
            drop(unsafe { Box::from_raw(d) });
        }
        0
    })
}
