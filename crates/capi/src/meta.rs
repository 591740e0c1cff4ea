//! The rest of the calls on paths: links, attributes, extended attributes, statfs.

use crate::client::{client, put_attr, shoal_attr, shoal_client, text};
use crate::error::{fail, guard, status};
use crate::file::bytes_of;
use ::shoal_client::{TimeSet, Timestamp};
use std::ffi::{c_char, c_int, c_void};

/// Copy `src` into the caller's `buf` of `len` bytes: the full length of `src` (what a
/// buffer must hold), or -1 with ERANGE when `buf` is too small (nothing is copied). A
/// `len` of 0 only asks for the length.
fn give(src: &[u8], buf: *mut c_void, len: usize) -> isize {
    if len == 0 {
        return src.len() as isize;
    }
    if src.len() > len {
        fail(libc::ERANGE, format_args!("{} bytes do not fit in a buffer of {len}", src.len()));
        return -1;
    }
    if buf.is_null() {
        fail(libc::EFAULT, "the buffer is NULL");
        return -1;
    }
    // SAFETY: the caller's buffer of `len` >= src.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buf as *mut u8, src.len()) };
    src.len() as isize
}

/// Attributes of `path` itself (a final symbolic link is not followed). 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_lstat(c: *const shoal_client, path: *const c_char, out: *mut shoal_attr) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        put_attr(c.block(c.client.lstat(path)), out)
    })
}

/// Make the symbolic link `link_path` pointing at `target`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_symlink(c: *const shoal_client, target: *const c_char, link_path: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(c), Some(target), Some(link)) = (client(c), text(target, "the target"), text(link_path, "the path"))
        else {
            return -1;
        };
        status(c.block(c.client.symlink(target, link)))
    })
}

/// The target of the symbolic link `path` into `buf` (not NUL-terminated, as readlink(2)).
/// Returns its length, or -1 (ERANGE: `buf` of `len` bytes is too small; `len` 0 asks
/// for the length only).
#[no_mangle]
pub extern "C" fn shoal_readlink(c: *const shoal_client, path: *const c_char, buf: *mut c_char, len: usize) -> isize {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        let Some(target) = c.block(c.client.readlink(path)) else { return -1 };
        give(target.as_bytes(), buf as *mut c_void, len)
    })
}

/// Make `new_path` another name of the file `existing`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_link(c: *const shoal_client, existing: *const c_char, new_path: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(c), Some(from), Some(to)) = (client(c), text(existing, "the path"), text(new_path, "the new path"))
        else {
            return -1;
        };
        status(c.block(c.client.link(from, to)))
    })
}

/// Set the permission bits of `path`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_chmod(c: *const shoal_client, path: *const c_char, mode: u32) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        status(c.block(c.client.chmod(path, mode)))
    })
}

/// Set the owner and/or group of `path` (-1 as `uid_t`/`gid_t`: unchanged). 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_chown(c: *const shoal_client, path: *const c_char, uid: u32, gid: u32) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        let keep = |v: u32| (v != u32::MAX).then_some(v);
        status(c.block(c.client.chown(path, keep(uid), keep(gid))))
    })
}

/// A time for `shoal_utimens`: seconds and nanoseconds since the epoch, or with `nsec`
/// `SHOAL_UTIME_NOW` the current time, or `SHOAL_UTIME_OMIT` to leave it as it is.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct shoal_time {
    pub sec: i64,
    pub nsec: i64,
}

/// `shoal_time::nsec`: the current time (as `UTIME_NOW`).
pub const SHOAL_UTIME_NOW: i64 = (1 << 30) - 1;
/// `shoal_time::nsec`: leave this time alone (as `UTIME_OMIT`).
pub const SHOAL_UTIME_OMIT: i64 = (1 << 30) - 2;

fn time_set(t: shoal_time) -> Option<Option<TimeSet>> {
    match t.nsec {
        SHOAL_UTIME_OMIT => Some(None),
        SHOAL_UTIME_NOW => Some(Some(TimeSet::Now)),
        n if (0..1_000_000_000).contains(&n) => Some(Some(TimeSet::At(Timestamp { secs: t.sec, nsecs: n as u32 }))),
        _ => None,
    }
}

/// Set the access and modification times of `path` (`times[0]`, `times[1]`; NULL: both
/// now). 0 or -1 (EINVAL for a bad `nsec`).
#[no_mangle]
pub extern "C" fn shoal_utimens(c: *const shoal_client, path: *const c_char, times: *const shoal_time) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        let (atime, mtime) = if times.is_null() {
            (Some(TimeSet::Now), Some(TimeSet::Now))
        } else {
            // SAFETY: the caller's array of two shoal_time.
            let t = unsafe { std::slice::from_raw_parts(times, 2) };
            match (time_set(t[0]), time_set(t[1])) {
                (Some(a), Some(m)) => (a, m),
                _ => {
                    fail(libc::EINVAL, format_args!("utimens {path}: nanoseconds out of range"));
                    return -1;
                }
            }
        };
        status(c.block(c.client.utimens(path, atime, mtime)))
    })
}

/// Cut or extend the file `path` to `size` bytes. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_truncate(c: *const shoal_client, path: *const c_char, size: u64) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        status(c.block(c.client.truncate(path, size)))
    })
}

/// Capacity and use of the cluster.
#[repr(C)]
#[derive(Default)]
#[allow(non_camel_case_types)]
pub struct shoal_statfs {
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub inodes: u64,
    /// Servers that answered, and servers taking part in placement.
    pub servers_up: u32,
    pub servers_total: u32,
}

/// Capacity and use of the cluster into `out`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_statfs_get(c: *const shoal_client, out: *mut shoal_statfs) -> c_int {
    guard(-1, || {
        let Some(c) = client(c) else { return -1 };
        if out.is_null() {
            fail(libc::EFAULT, "the shoal_statfs to fill is NULL");
            return -1;
        }
        let Some(s) = c.block(c.client.statfs()) else { return -1 };
        let v = shoal_statfs {
            capacity_bytes: s.capacity_bytes,
            free_bytes: s.free_bytes,
            inodes: s.inodes,
            servers_up: s.servers_up as u32,
            servers_total: s.servers_total as u32,
        };
        // SAFETY: `out` is non-NULL and points at a shoal_statfs of the caller's.
        unsafe { *out = v };
        0
    })
}

/// The inode of `path` (following a final symbolic link).
fn ino_of(c: &shoal_client, path: &str) -> Option<::shoal_client::Ino> {
    c.block(c.client.stat(path)).map(|a| a.ino)
}

/// Set the extended attribute `name` of `path` to `len` bytes at `value`. `flags`: 0,
/// `XATTR_CREATE` (EEXIST if it exists) or `XATTR_REPLACE` (ENODATA if it does not). 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_setxattr(
    c: *const shoal_client,
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    len: usize,
    flags: c_int,
) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path), Some(name)) = (client(c), text(path, "the path"), text(name, "the name")) else {
            return -1;
        };
        let Some(value) = bytes_of(value, len) else { return -1 };
        let Some(ino) = ino_of(c, path) else { return -1 };
        let (create, replace) = (flags & libc::XATTR_CREATE != 0, flags & libc::XATTR_REPLACE != 0);
        status(c.block(c.client.setxattr(ino, name, value, create, replace)))
    })
}

/// The value of the extended attribute `name` of `path` into `buf` of `len` bytes. Returns
/// its length, or -1 (ENODATA: none; ERANGE: too small; `len` 0 asks for the length).
#[no_mangle]
pub extern "C" fn shoal_getxattr(
    c: *const shoal_client,
    path: *const c_char,
    name: *const c_char,
    buf: *mut c_void,
    len: usize,
) -> isize {
    guard(-1, || {
        let (Some(c), Some(path), Some(name)) = (client(c), text(path, "the path"), text(name, "the name")) else {
            return -1;
        };
        let Some(ino) = ino_of(c, path) else { return -1 };
        let Some(value) = c.block(c.client.getxattr(ino, name)) else { return -1 };
        give(&value, buf, len)
    })
}

/// The names of the extended attributes of `path`, each NUL-terminated, one after the
/// other, into `buf` of `len` bytes (as listxattr(2)). Returns the bytes, or -1.
#[no_mangle]
pub extern "C" fn shoal_listxattr(c: *const shoal_client, path: *const c_char, buf: *mut c_char, len: usize) -> isize {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        let Some(ino) = ino_of(c, path) else { return -1 };
        let Some(names) = c.block(c.client.listxattr(ino)) else { return -1 };
        let mut all = Vec::new();
        for n in names {
            all.extend_from_slice(n.as_bytes());
            all.push(0);
        }
        give(&all, buf as *mut c_void, len)
    })
}

/// Remove the extended attribute `name` of `path`. 0 or -1 (ENODATA: none).
#[no_mangle]
pub extern "C" fn shoal_removexattr(c: *const shoal_client, path: *const c_char, name: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path), Some(name)) = (client(c), text(path, "the path"), text(name, "the name")) else {
            return -1;
        };
        let Some(ino) = ino_of(c, path) else { return -1 };
        status(c.block(c.client.removexattr(ino, name)))
    })
}
