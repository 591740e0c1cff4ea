//! What a tree holds, from the per-directory usage the servers keep (docs/du.md):
//! `shoal_du` (the totals), and `shoal_du_open`, `shoal_du_next`, `shoal_du_count`,
//! `shoal_du_unreadable`, `shoal_du_free` (every directory down to a depth).

use crate::client::{client, shoal_client, text};
use crate::error::{fail, guard};
use crate::out::{Out, Slots};
use ::shoal_client::{DirUsage, DuReport};
use std::ffi::{c_char, c_int, CString};

/// What a tree holds, as `shoal du PATH` prints it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types)]
pub struct shoal_du_totals {
    /// Files and symbolic links in the tree, a file of several names counted once.
    pub files: u64,
    /// Directories in the tree, the path itself not included.
    pub dirs: u64,
    /// Apparent size of those files and links, in bytes (du --apparent-size).
    pub bytes: u64,
    /// Inodes: files + dirs + 1 (the path itself; du --inodes); 1 for a file or link.
    pub inodes: u64,
    /// Directories the caller may not read: each adds only itself, not its contents.
    pub unreadable: u64,
}

/// One directory of a `shoal_du_dirs`, living until the next call on its handle.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct shoal_du_row {
    /// The path asked about, joined with the directory's path below it (NUL-terminated).
    pub path: *const c_char,
    pub ino: u64,
    /// Depth below the path asked about (0: that path).
    pub depth: usize,
    /// What the directory's tree holds, itself not included, as in `shoal_du_totals`.
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// files + dirs + 1.
    pub inodes: u64,
}

/// The directories of a tree down to a depth, read with `shoal_du_next`, freed with
/// `shoal_du_free`.
#[allow(non_camel_case_types)]
pub struct shoal_du_dirs {
    report: DuReport,
    next: usize,
    path: CString,
    current: shoal_du_row,
}

/// The report of `path` down to `depth`, or `None` (errno set).
fn report(c: *const shoal_client, path: *const c_char, depth: usize) -> Option<DuReport> {
    let (c, path) = (client(c)?, text(path, "the path")?);
    c.block(c.client.du(path, depth))
}

/// What the tree at `path` holds, into `out`: added up from the usage every server keeps
/// per directory, no file visited. A path that is not a directory (a symbolic link not
/// followed) reports itself. 0, or -1 (errno: ENOENT, EACCES when `path` itself may not
/// be read, EFAULT for NULL, EINVAL for a path that is not UTF-8).
#[no_mangle]
pub extern "C" fn shoal_du(c: *const shoal_client, path: *const c_char, out: *mut shoal_du_totals) -> c_int {
    guard(-1, || {
        let Some(out) = Out::new(out, "the shoal_du_totals") else { return -1 };
        let Some(r) = report(c, path, 0) else { return -1 };
        let Some(top) = r.dirs.last() else {
            fail(libc::EIO, "du: the servers' answer holds no row for the path");
            return -1;
        };
        out.put(shoal_du_totals {
            files: top.files,
            dirs: top.dirs,
            bytes: top.bytes,
            inodes: top.inodes(),
            unreadable: r.unreadable.len() as u64,
        });
        0
    })
}

/// Every directory at most `depth` levels below `path` (0: `path` only; `(size_t)-1`:
/// all), each before its parent and siblings by name, `path` last, as `du --max-depth`.
/// NULL on failure (errno as for `shoal_du`).
#[no_mangle]
pub extern "C" fn shoal_du_open(c: *const shoal_client, path: *const c_char, depth: usize) -> *mut shoal_du_dirs {
    guard(std::ptr::null_mut(), || {
        let Some(report) = report(c, path, depth) else { return std::ptr::null_mut() };
        let current = shoal_du_row { path: std::ptr::null(), ino: 0, depth: 0, files: 0, dirs: 0, bytes: 0, inodes: 0 };
        Box::into_raw(Box::new(shoal_du_dirs { report, next: 0, path: CString::default(), current }))
    })
}

/// The next directory of `d`, or NULL at the end (errno untouched) or for a NULL `d`
/// (EFAULT).
#[no_mangle]
pub extern "C" fn shoal_du_next(d: *mut shoal_du_dirs) -> *const shoal_du_row {
    guard(std::ptr::null(), || {
        if d.is_null() {
            fail(libc::EFAULT, "the shoal_du_dirs is NULL");
            return std::ptr::null();
        }
        // SAFETY: `d` came from `shoal_du_open` and is not freed yet.
        let d = unsafe { &mut *d };
        let Some(u): Option<&DirUsage> = d.report.dirs.get(d.next) else { return std::ptr::null() };
        d.next += 1;
        // Paths hold no NUL (names cannot), so this never fails; an empty one if it did.
        d.path = CString::new(u.path.as_str()).unwrap_or_default();
        d.current = shoal_du_row {
            path: d.path.as_ptr(),
            ino: u.ino.0,
            depth: u.depth,
            files: u.files,
            dirs: u.dirs,
            bytes: u.bytes,
            inodes: u.inodes(),
        };
        &d.current
    })
}

/// How many directories `d` holds in all (0 for NULL).
#[no_mangle]
pub extern "C" fn shoal_du_count(d: *const shoal_du_dirs) -> usize {
    // SAFETY: a non-NULL `d` came from `shoal_du_open` and is not freed yet.
    guard(0, || unsafe { d.as_ref() }.map_or(0, |d| d.report.dirs.len()))
}

/// The inode numbers of the directories of `d`'s tree that the caller may not read (their
/// contents not counted), sorted, into `inos` of `cap` items. Returns how many there are
/// (a `cap` of 0 asks only that; `inos` may then be NULL), or -1: ERANGE when they do not
/// fit (nothing copied), EFAULT for a NULL `d`, or a NULL `inos` with a capacity.
#[no_mangle]
pub extern "C" fn shoal_du_unreadable(d: *const shoal_du_dirs, inos: *mut u64, cap: usize) -> isize {
    guard(-1, || {
        // SAFETY: a non-NULL `d` came from `shoal_du_open` and is not freed yet.
        let Some(d) = (unsafe { d.as_ref() }) else {
            fail(libc::EFAULT, "the shoal_du_dirs is NULL");
            return -1;
        };
        let Some(slots) = Slots::new(inos, cap, "the inode array", "inodes") else { return -1 };
        let list: Vec<u64> = d.report.unreadable.iter().map(|i| i.0).collect();
        slots.give_or_fail(&list)
    })
}

/// Free `d` (NULL: nothing). Returns 0.
#[no_mangle]
pub extern "C" fn shoal_du_free(d: *mut shoal_du_dirs) -> c_int {
    guard(-1, || {
        if !d.is_null() {
            // SAFETY: `d` came from `shoal_du_open` and is freed once, here.
            drop(unsafe { Box::from_raw(d) });
        }
        0
    })
}
