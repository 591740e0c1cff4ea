//! The asynchronous twins of the rest of the calls on paths (`meta.rs`, `dir.rs`): links,
//! owners, times, extended attributes, statfs and listings. Each returns a `shoal_future`
//! at once (see `future.rs`) and does what its blocking twin does, through the same code.
//!
//! Strings and values the caller passes are copied before the call returns. What a call
//! writes (a buffer, a `shoal_statfs`, a `shoal_dir *`) is written when the future
//! completes, before its callback: that memory must stay valid until the future completed
//! or was cancelled.

use crate::client::{shoal_client, text};
use crate::dir::shoal_dir;
use crate::error::guard;
use crate::file::bytes_of;
use crate::future::{shoal_callback, shoal_future};
use crate::meta::{
    byte_slots, getxattr_path, listxattr_path, owner, removexattr_path, setxattr_path, shoal_statfs, shoal_time,
    times_of,
};
use crate::out::Out;
use crate::path_async::{on_paths, on_paths_then, NONE};
use ::shoal_client::Client;
use std::ffi::{c_char, c_int, c_void};

/// The target of the symbolic link `path` into `buf` of `len` bytes (not NUL-terminated).
/// Result: its length, or -errno (-ERANGE: `buf` is too small, nothing copied; a `len` of
/// 0 asks for the length only, and `buf` may then be NULL).
#[no_mangle]
pub extern "C" fn shoal_readlink_async(
    c: *const shoal_client,
    path: *const c_char,
    buf: *mut c_char,
    len: usize,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(buf) = byte_slots(buf as *mut c_void, len) else { return NONE };
        let call = |cl: Client, [p]: [String; 1]| async move { cl.readlink(&p).await };
        on_paths_then(c, [(path, "the path")], cb, user, call, move |target| buf.give_result(target.as_bytes()))
    })
}

/// Set the owner and/or group of `path` (-1 as `uid_t`/`gid_t`: unchanged). Result: 0 or
/// -errno.
#[no_mangle]
pub extern "C" fn shoal_chown_async(
    c: *const shoal_client,
    path: *const c_char,
    uid: u32,
    gid: u32,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    let call = move |cl: Client, [p]: [String; 1]| async move { cl.chown(&p, owner(uid), owner(gid)).await };
    on_paths(c, [(path, "the path")], cb, user, call)
}

/// Set the access and modification times of `path` (`times[0]`, `times[1]`, read before
/// this returns; NULL: both now). Result: 0 or -errno. NULL (EINVAL) for a bad `nsec`.
#[no_mangle]
pub extern "C" fn shoal_utimens_async(
    c: *const shoal_client,
    path: *const c_char,
    times: *const shoal_time,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(p) = text(path, "the path") else { return NONE };
        let Some((atime, mtime)) = times_of(p, times) else { return NONE };
        on_paths(c, [(path, "the path")], cb, user, move |cl, [p]| async move { cl.utimens(&p, atime, mtime).await })
    })
}

/// Set the extended attribute `name` of `path` to `len` bytes at `value` (copied before
/// this returns); `flags` as `shoal_setxattr`. Result: 0 or -errno (-EEXIST, -ENODATA).
#[no_mangle]
pub extern "C" fn shoal_setxattr_async(
    c: *const shoal_client,
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    len: usize,
    flags: c_int,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(value) = bytes_of(value, len).map(<[u8]>::to_vec) else { return NONE };
        let paths = [(path, "the path"), (name, "the name")];
        on_paths(c, paths, cb, user, move |cl, [p, n]| async move { setxattr_path(&cl, &p, &n, &value, flags).await })
    })
}

/// The value of the extended attribute `name` of `path` into `buf` of `len` bytes. Result:
/// its length, or -errno (-ENODATA: none; -ERANGE: too small; `len` 0 asks for the length).
#[no_mangle]
pub extern "C" fn shoal_getxattr_async(
    c: *const shoal_client,
    path: *const c_char,
    name: *const c_char,
    buf: *mut c_void,
    len: usize,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(buf) = byte_slots(buf, len) else { return NONE };
        let paths = [(path, "the path"), (name, "the name")];
        let call = |cl: Client, [p, n]: [String; 2]| async move { getxattr_path(&cl, &p, &n).await };
        on_paths_then(c, paths, cb, user, call, move |value| buf.give_result(&value))
    })
}

/// The names of the extended attributes of `path`, each NUL-terminated, into `buf` of `len`
/// bytes. Result: the bytes, or -errno (-ERANGE: too small; `len` 0 asks for the length).
#[no_mangle]
pub extern "C" fn shoal_listxattr_async(
    c: *const shoal_client,
    path: *const c_char,
    buf: *mut c_char,
    len: usize,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(buf) = byte_slots(buf as *mut c_void, len) else { return NONE };
        let call = |cl: Client, [p]: [String; 1]| async move { listxattr_path(&cl, &p).await };
        on_paths_then(c, [(path, "the path")], cb, user, call, move |names| buf.give_result(&names))
    })
}

/// Remove the extended attribute `name` of `path`. Result: 0 or -errno (-ENODATA: none).
#[no_mangle]
pub extern "C" fn shoal_removexattr_async(
    c: *const shoal_client,
    path: *const c_char,
    name: *const c_char,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    let paths = [(path, "the path"), (name, "the name")];
    on_paths(c, paths, cb, user, |cl, [p, n]| async move { removexattr_path(&cl, &p, &n).await })
}

/// Capacity and use of the cluster into `*out`. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_statfs_get_async(
    c: *const shoal_client,
    out: *mut shoal_statfs,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(out) = Out::new(out, "the shoal_statfs to fill") else { return NONE };
        let call = |cl: Client, []: [String; 0]| async move { cl.statfs().await };
        on_paths_then(c, [], cb, user, call, move |s| {
            out.put(shoal_statfs::from(s));
            0
        })
    })
}

/// List the directory `path`, as `shoal_opendir`; the new `shoal_dir *` goes into `*out`
/// when the future completes with 0 (read it with `shoal_readdir`, free it with
/// `shoal_closedir`). Result: 0 or -errno (-ENOTDIR, -ENOENT).
#[no_mangle]
pub extern "C" fn shoal_opendir_async(
    c: *const shoal_client,
    path: *const c_char,
    out: *mut *mut shoal_dir,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(out) = Out::new(out, "the shoal_dir pointer to fill") else { return NONE };
        let call = |cl: Client, [p]: [String; 1]| async move { cl.readdir(&p).await };
        on_paths_then(c, [(path, "the path")], cb, user, call, move |entries| {
            out.put(shoal_dir::new(entries));
            0
        })
    })
}
