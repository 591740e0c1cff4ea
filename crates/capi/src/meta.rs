//! The rest of the calls on paths: links, attributes, extended attributes, statfs.

use crate::client::{client, put_attr, shoal_attr, shoal_client, text};
use crate::error::{fail, guard, status};
use crate::file::bytes_of;
use crate::out::{Out, Slots};
use ::shoal_client::{Client, Result, StatFs, TimeSet, Timestamp};
use std::ffi::{c_char, c_int, c_void};

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

/// The caller's buffer of `len` bytes for a result of unknown length (`Slots`).
pub(crate) fn byte_slots(buf: *mut c_void, len: usize) -> Option<Slots<u8>> {
    Slots::new(buf as *mut u8, len, "the buffer", "bytes")
}

/// The target of the symbolic link `path` into `buf` (not NUL-terminated, as readlink(2)).
/// Returns its length, or -1 (ERANGE: `buf` of `len` bytes is too small; `len` 0 asks
/// for the length only).
#[no_mangle]
pub extern "C" fn shoal_readlink(c: *const shoal_client, path: *const c_char, buf: *mut c_char, len: usize) -> isize {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        let Some(buf) = byte_slots(buf as *mut c_void, len) else { return -1 };
        let Some(target) = c.block(c.client.readlink(path)) else { return -1 };
        buf.give_or_fail(target.as_bytes())
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
        status(c.block(c.client.chown(path, owner(uid), owner(gid))))
    })
}

/// A uid or gid of chown(2): -1 (as `uid_t`) leaves it unchanged.
pub(crate) fn owner(id: u32) -> Option<u32> {
    (id != u32::MAX).then_some(id)
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

/// The access and modification times to set (`None`: leave it alone).
pub(crate) type Times = (Option<TimeSet>, Option<TimeSet>);

/// The times to set from the caller's `times` (two, or NULL for both now); `None` (EINVAL)
/// for a bad `nsec`.
pub(crate) fn times_of(path: &str, times: *const shoal_time) -> Option<Times> {
    if times.is_null() {
        return Some((Some(TimeSet::Now), Some(TimeSet::Now)));
    }
    // SAFETY: the caller's array of two shoal_time, alive for the call.
    let t = unsafe { std::slice::from_raw_parts(times, 2) };
    match (time_set(t[0]), time_set(t[1])) {
        (Some(a), Some(m)) => Some((a, m)),
        _ => {
            fail(libc::EINVAL, format_args!("utimens {path}: nanoseconds out of range"));
            None
        }
    }
}

/// Set the access and modification times of `path` (`times[0]`, `times[1]`; NULL: both
/// now). 0 or -1 (EINVAL for a bad `nsec`).
#[no_mangle]
pub extern "C" fn shoal_utimens(c: *const shoal_client, path: *const c_char, times: *const shoal_time) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        let Some((atime, mtime)) = times_of(path, times) else { return -1 };
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

impl From<StatFs> for shoal_statfs {
    fn from(s: StatFs) -> shoal_statfs {
        shoal_statfs {
            capacity_bytes: s.capacity_bytes,
            free_bytes: s.free_bytes,
            inodes: s.inodes,
            servers_up: s.servers_up as u32,
            servers_total: s.servers_total as u32,
        }
    }
}

/// Capacity and use of the cluster into `out`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_statfs_get(c: *const shoal_client, out: *mut shoal_statfs) -> c_int {
    guard(-1, || {
        let Some(c) = client(c) else { return -1 };
        let Some(out) = Out::new(out, "the shoal_statfs to fill") else { return -1 };
        let Some(s) = c.block(c.client.statfs()) else { return -1 };
        out.put(shoal_statfs::from(s));
        0
    })
}

// The extended attribute calls on paths, each written once for its blocking form and its
// asynchronous twin (`meta_async.rs`). The client's calls take an inode: a path's is looked
// up first, following a final symbolic link (as getxattr(2) does).

/// `setxattr(2)`'s `flags` as (create only, replace only).
pub(crate) fn xattr_flags(flags: c_int) -> (bool, bool) {
    (flags & libc::XATTR_CREATE != 0, flags & libc::XATTR_REPLACE != 0)
}

pub(crate) async fn setxattr_path(cl: &Client, path: &str, name: &str, value: &[u8], flags: c_int) -> Result<()> {
    let (create, replace) = xattr_flags(flags);
    let ino = cl.stat(path).await?.ino;
    cl.setxattr(ino, name, value, create, replace).await
}

pub(crate) async fn getxattr_path(cl: &Client, path: &str, name: &str) -> Result<Vec<u8>> {
    let ino = cl.stat(path).await?.ino;
    cl.getxattr(ino, name).await
}

/// The names, each NUL-terminated, one after the other (as listxattr(2) gives them).
pub(crate) async fn listxattr_path(cl: &Client, path: &str) -> Result<Vec<u8>> {
    let ino = cl.stat(path).await?.ino;
    let mut all = Vec::new();
    for n in cl.listxattr(ino).await? {
        all.extend_from_slice(n.as_bytes());
        all.push(0);
    }
    Ok(all)
}

pub(crate) async fn removexattr_path(cl: &Client, path: &str, name: &str) -> Result<()> {
    let ino = cl.stat(path).await?.ino;
    cl.removexattr(ino, name).await
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
        status(c.block(setxattr_path(&c.client, path, name, value, flags)))
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
        let Some(buf) = byte_slots(buf, len) else { return -1 };
        let Some(value) = c.block(getxattr_path(&c.client, path, name)) else { return -1 };
        buf.give_or_fail(&value)
    })
}

/// The names of the extended attributes of `path`, each NUL-terminated, one after the
/// other, into `buf` of `len` bytes (as listxattr(2)). Returns the bytes, or -1.
#[no_mangle]
pub extern "C" fn shoal_listxattr(c: *const shoal_client, path: *const c_char, buf: *mut c_char, len: usize) -> isize {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        let Some(buf) = byte_slots(buf as *mut c_void, len) else { return -1 };
        let Some(names) = c.block(listxattr_path(&c.client, path)) else { return -1 };
        buf.give_or_fail(&names)
    })
}

/// Remove the extended attribute `name` of `path`. 0 or -1 (ENODATA: none).
#[no_mangle]
pub extern "C" fn shoal_removexattr(c: *const shoal_client, path: *const c_char, name: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path), Some(name)) = (client(c), text(path, "the path"), text(name, "the name")) else {
            return -1;
        };
        status(c.block(removexattr_path(&c.client, path, name)))
    })
}
