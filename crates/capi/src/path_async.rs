//! The asynchronous twins of the calls on paths (and `fstat`): each returns a
//! `shoal_future` at once (see `future.rs` for results, callbacks and cancelling). What a
//! call gives back through a pointer (`shoal_attr`, `shoal_file *`) is written when the
//! future completes, before its callback; the pointer must stay valid until then.

use crate::client::{client, shoal_attr, shoal_client, text};
use crate::error::guard;
use crate::file::{file, open_flags, shoal_file};
use crate::future::{shoal_callback, shoal_future, start};
use crate::out::Out;
use ::shoal_client::OpenFlags;
use std::ffi::{c_char, c_int, c_void};

/// What a call returns when it cannot start (errno set).
pub(crate) const NONE: *mut shoal_future = std::ptr::null_mut();

/// Attributes of `path` (following a final symbolic link) into `*out`. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_stat_async(
    c: *const shoal_client,
    path: *const c_char,
    out: *mut shoal_attr,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    attrs_of_path(c, path, true, out, cb, user)
}

/// As `shoal_stat_async`, not following a final symbolic link.
#[no_mangle]
pub extern "C" fn shoal_lstat_async(
    c: *const shoal_client,
    path: *const c_char,
    out: *mut shoal_attr,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    attrs_of_path(c, path, false, out, cb, user)
}

/// `stat` (`follow`) or `lstat` of `path` into `*out`, as a future.
fn attrs_of_path(
    c: *const shoal_client,
    path: *const c_char,
    follow: bool,
    out: *mut shoal_attr,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return NONE };
        let Some(out) = Out::new(out, "the shoal_attr to fill") else { return NONE };
        let (cl, path) = (c.client.clone(), path.to_string());
        let work = async move {
            if follow {
                cl.stat(&path).await
            } else {
                cl.lstat(&path).await
            }
        };
        start(c.rt.handle(), cb, user, work, move |a| {
            out.put(shoal_attr::from(&a));
            0
        })
    })
}

/// Attributes of the open file `f`, fresh from its server, into `*out`. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_fstat_async(
    f: *const shoal_file,
    out: *mut shoal_attr,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(f) = file(f) else { return NONE };
        let Some(out) = Out::new(out, "the shoal_attr to fill") else { return NONE };
        let handle = f.file.clone();
        start(&f.rt, cb, user, async move { handle.stat().await }, move |a| {
            out.put(shoal_attr::from(&a));
            0
        })
    })
}

/// Open (with O_CREAT: create) `path`, as `shoal_open`; the new `shoal_file *` goes into
/// `*out` when the future completes with 0 (close it with `shoal_close`). Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_open_async(
    c: *const shoal_client,
    path: *const c_char,
    flags: c_int,
    mode: u32,
    out: *mut *mut shoal_file,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return NONE };
        let Some(how) = open_flags(path, flags, mode) else { return NONE };
        open_as_future(c, path, how, out, cb, user)
    })
}

/// Open `path` as `how` says, as a future that puts the new `shoal_file *` into `*out`
/// (`shoal_open_async`, `shoal_create_async`).
pub(crate) fn open_as_future(
    c: &shoal_client,
    path: &str,
    how: OpenFlags,
    out: *mut *mut shoal_file,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    let Some(out) = Out::new(out, "the shoal_file pointer to fill") else { return NONE };
    let (cl, path, rt) = (c.client.clone(), path.to_string(), c.rt.handle().clone());
    start(c.rt.handle(), cb, user, async move { cl.open(&path, how).await }, move |f| {
        out.put(shoal_file::new(f, rt));
        0
    })
}

/// Start `call` on the client `c` with the text of `paths` (NUL-terminated strings of the
/// caller's, copied here): the shape of every call below whose result is 0 or -errno.
pub(crate) fn on_paths<const N: usize, F, Fut, T>(
    c: *const shoal_client,
    paths: [(*const c_char, &str); N],
    cb: shoal_callback,
    user: *mut c_void,
    call: F,
) -> *mut shoal_future
where
    F: FnOnce(::shoal_client::Client, [String; N]) -> Fut,
    Fut: std::future::Future<Output = ::shoal_client::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    on_paths_then(c, paths, cb, user, call, |_| 0)
}

/// As `on_paths`, with `finish` making the result of what the call gave (see
/// `future::start`): a length, or writing through a pointer of the caller's.
pub(crate) fn on_paths_then<const N: usize, F, Fut, T>(
    c: *const shoal_client,
    paths: [(*const c_char, &str); N],
    cb: shoal_callback,
    user: *mut c_void,
    call: F,
    finish: impl FnOnce(T) -> i64 + Send + 'static,
) -> *mut shoal_future
where
    F: FnOnce(::shoal_client::Client, [String; N]) -> Fut,
    Fut: std::future::Future<Output = ::shoal_client::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    guard(NONE, || {
        let Some(c) = client(c) else { return NONE };
        let mut texts = Vec::with_capacity(N);
        for (p, what) in paths {
            let Some(t) = text(p, what) else { return NONE };
            texts.push(t.to_string());
        }
        let Ok(texts) = <[String; N]>::try_from(texts) else { return NONE };
        start(c.rt.handle(), cb, user, call(c.client.clone(), texts), finish)
    })
}

/// Make the directory `path` with permission bits `mode`. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_mkdir_async(
    c: *const shoal_client,
    path: *const c_char,
    mode: u32,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    on_paths(c, [(path, "the path")], cb, user, move |cl, [p]| async move { cl.mkdir(&p, mode & 0o7777).await })
}

/// Remove the empty directory `path`. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_rmdir_async(
    c: *const shoal_client,
    path: *const c_char,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    on_paths(c, [(path, "the path")], cb, user, |cl, [p]| async move { cl.rmdir(&p).await })
}

/// Remove the file or symbolic link `path`. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_unlink_async(
    c: *const shoal_client,
    path: *const c_char,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    on_paths(c, [(path, "the path")], cb, user, |cl, [p]| async move { cl.unlink(&p).await })
}

/// Rename `from` to `to` (replacing `to`, as rename(2)). Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_rename_async(
    c: *const shoal_client,
    from: *const c_char,
    to: *const c_char,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    let paths = [(from, "the source path"), (to, "the target path")];
    on_paths(c, paths, cb, user, |cl, [f, t]| async move { cl.rename(&f, &t).await })
}

/// Cut or extend the file `path` to `size` bytes. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_truncate_async(
    c: *const shoal_client,
    path: *const c_char,
    size: u64,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    on_paths(c, [(path, "the path")], cb, user, move |cl, [p]| async move { cl.truncate(&p, size).await })
}

/// Set the permission bits of `path`. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_chmod_async(
    c: *const shoal_client,
    path: *const c_char,
    mode: u32,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    on_paths(c, [(path, "the path")], cb, user, move |cl, [p]| async move { cl.chmod(&p, mode & 0o7777).await })
}

/// Make a symbolic link `link_path` pointing to `target`. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_symlink_async(
    c: *const shoal_client,
    target: *const c_char,
    link_path: *const c_char,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    let paths = [(target, "the target"), (link_path, "the link path")];
    on_paths(c, paths, cb, user, |cl, [t, l]| async move { cl.symlink(&t, &l).await })
}

/// Give the file `existing` a second name `new_path` (a hard link). Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_link_async(
    c: *const shoal_client,
    existing: *const c_char,
    new_path: *const c_char,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    let paths = [(existing, "the existing path"), (new_path, "the new path")];
    on_paths(c, paths, cb, user, |cl, [e, n]| async move { cl.link(&e, &n).await })
}
