//! The client handle and the calls on paths (blocking).

use crate::error::{fail, fail_with, guard, status};
use ::shoal_client::{Attr, Client, ClientOptions, FileKind};
use std::ffi::{c_char, c_int, CStr};
use std::future::Future;
use std::path::PathBuf;

/// A connection to one Shoal cluster: the native client and the runtime that drives it.
#[allow(non_camel_case_types)]
pub struct shoal_client {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) client: Client,
}

impl shoal_client {
    /// Run `fut` to its end on the calling thread (see `error::block`).
    pub(crate) fn block<T>(&self, fut: impl Future<Output = ::shoal_client::Result<T>>) -> Option<T> {
        crate::error::block(self.rt.handle(), fut)
    }
}

/// The attributes of a file, directory or symbolic link.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct shoal_attr {
    /// Inode number.
    pub ino: u64,
    /// File type and permission bits, as `st_mode` (S_IFREG, S_IFDIR or S_IFLNK).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Bytes allocated on the servers' disks.
    pub blocks_bytes: u64,
    /// Times: seconds and nanoseconds since the epoch.
    pub atime_sec: i64,
    pub atime_nsec: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub ctime_sec: i64,
    pub ctime_nsec: u32,
}

impl From<&Attr> for shoal_attr {
    fn from(a: &Attr) -> shoal_attr {
        let kind = match a.kind {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
        };
        shoal_attr {
            ino: a.ino.0,
            mode: kind | a.perm,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            blocks_bytes: a.blocks_bytes,
            atime_sec: a.atime.secs,
            atime_nsec: a.atime.nsecs,
            mtime_sec: a.mtime.secs,
            mtime_nsec: a.mtime.nsecs,
            ctime_sec: a.ctime.secs,
            ctime_nsec: a.ctime.nsecs,
        }
    }
}

/// A C string argument as UTF-8; `None` (EINVAL or EFAULT set) if it is not one.
pub(crate) fn text<'a>(p: *const c_char, what: &str) -> Option<&'a str> {
    if p.is_null() {
        fail(libc::EFAULT, format_args!("{what} is NULL"));
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string that lives for the call.
    match unsafe { CStr::from_ptr(p) }.to_str() {
        Ok(s) => Some(s),
        Err(_) => {
            fail(libc::EINVAL, format_args!("{what} is not UTF-8"));
            None
        }
    }
}

/// The client behind `c`; `None` (EFAULT) for NULL.
pub(crate) fn client<'a>(c: *const shoal_client) -> Option<&'a shoal_client> {
    if c.is_null() {
        fail(libc::EFAULT, "the shoal_client is NULL");
        return None;
    }
    // SAFETY: a non-NULL handle comes from `shoal_connect` and is not yet disconnected.
    Some(unsafe { &*c })
}

/// Connect to the cluster described by the configuration file `config` (NULL: the file
/// named by `$SHOAL_CONFIG`). Returns NULL on failure (errno set; `shoal_last_error`
/// names the cause). Servers are contacted when first needed.
#[no_mangle]
pub extern "C" fn shoal_connect(config: *const c_char) -> *mut shoal_client {
    guard(std::ptr::null_mut(), || {
        let path = if config.is_null() {
            match std::env::var_os("SHOAL_CONFIG") {
                Some(p) => PathBuf::from(p),
                None => {
                    fail(libc::EINVAL, "no configuration file given and $SHOAL_CONFIG is not set");
                    return std::ptr::null_mut();
                }
            }
        } else {
            match text(config, "the configuration path") {
                Some(p) => PathBuf::from(p),
                None => return std::ptr::null_mut(),
            }
        };
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shoal-runtime")
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                fail(libc::EAGAIN, format_args!("cannot start the client's runtime: {e}"));
                return std::ptr::null_mut();
            }
        };
        let client = {
            let _inside = rt.enter();
            Client::from_config(&path, ClientOptions::default())
        };
        match client {
            Ok(client) => Box::into_raw(Box::new(shoal_client { rt, client })),
            Err(e) => {
                fail_with(&e);
                std::ptr::null_mut()
            }
        }
    })
}

/// Close the connection and free `c` (NULL: nothing). Files opened through it must be
/// closed first; futures still running are cancelled.
#[no_mangle]
pub extern "C" fn shoal_disconnect(c: *mut shoal_client) {
    guard((), || {
        if !c.is_null() {
            // SAFETY: `c` came from `shoal_connect` and is freed once, here.
            let c = unsafe { Box::from_raw(c) };
            c.rt.shutdown_background();
        }
    })
}

/// Put `a` into the caller's `out`: 0, or -1 (EFAULT) for NULL.
pub(crate) fn put_attr(a: Option<Attr>, out: *mut shoal_attr) -> c_int {
    let Some(a) = a else { return -1 };
    if out.is_null() {
        fail(libc::EFAULT, "the shoal_attr to fill is NULL");
        return -1;
    }
    // SAFETY: `out` is non-NULL and points at a shoal_attr of the caller's.
    unsafe { *out = shoal_attr::from(&a) };
    0
}

/// Attributes of `path` (following a final symbolic link) into `out`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_stat(c: *const shoal_client, path: *const c_char, out: *mut shoal_attr) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        put_attr(c.block(c.client.stat(path)), out)
    })
}

/// Make the directory `path` with permission bits `mode`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_mkdir(c: *const shoal_client, path: *const c_char, mode: u32) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        status(c.block(c.client.mkdir(path, mode & 0o7777)))
    })
}

/// Remove the empty directory `path`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_rmdir(c: *const shoal_client, path: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        status(c.block(c.client.rmdir(path)))
    })
}

/// Remove the name `path` (a file or symbolic link). 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_unlink(c: *const shoal_client, path: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        status(c.block(c.client.unlink(path)))
    })
}

/// Rename `from` to `to` (replacing a file or empty directory there). 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_rename(c: *const shoal_client, from: *const c_char, to: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(c), Some(from), Some(to)) = (client(c), text(from, "the source path"), text(to, "the target path"))
        else {
            return -1;
        };
        status(c.block(c.client.rename(from, to)))
    })
}
