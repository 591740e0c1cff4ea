//! The change log (docs/changes.md): `shoal_change_watch_open` follows the events under a
//! directory, as paths; `shoal_change_watch_next` hands them out one at a time into a
//! `shoal_change_event`; with a consumer name, `shoal_change_watch_ack` keeps the watch's
//! place on the servers, so that a watch opened again with that name goes on after the
//! last event acknowledged. `shoal_forget_consumer` removes a consumer.

use crate::client::{client, shoal_client, text};
use crate::dir::{SHOAL_DT_DIR, SHOAL_DT_LNK, SHOAL_DT_REG};
use crate::error::{fail, guard, status};
use crate::tuples::wait_of;
use ::shoal_client::{parse_kinds, ChangeKind, ChangeStart, ChangeWatch, ChangeWatchOptions, FileKind, ALL_KINDS};
use std::ffi::{c_char, c_int, CStr, CString};

/// `shoal_change_event::kind`: a file was created (each kind is one bit, the same as in the
/// servers' logs, so that kinds can be or-ed into a mask to test against).
pub const SHOAL_CHANGE_CREATE: c_int = 1;
/// A directory was made.
pub const SHOAL_CHANGE_MKDIR: c_int = 2;
/// A symbolic link was made.
pub const SHOAL_CHANGE_SYMLINK: c_int = 4;
/// A hard link was made.
pub const SHOAL_CHANGE_LINK: c_int = 8;
/// A name of a file or symbolic link was removed.
pub const SHOAL_CHANGE_UNLINK: c_int = 16;
/// A directory was removed.
pub const SHOAL_CHANGE_RMDIR: c_int = 32;
/// A name was renamed (`path` the old one, `to_path` the new one).
pub const SHOAL_CHANGE_RENAME: c_int = 64;
/// Mode, owner, size or times changed (chmod, chown, truncate, utimes).
pub const SHOAL_CHANGE_SETATTR: c_int = 128;
/// An extended attribute was set or removed (`xattr` names it).
pub const SHOAL_CHANGE_XATTR: c_int = 256;
/// A file written through a handle was closed: its data and size are durable.
pub const SHOAL_CHANGE_CLOSE: c_int = 512;

/// A running watch of the change log (`shoal_change_watch_open`), freed with
/// `shoal_change_watch_free`.
#[allow(non_camel_case_types)]
pub struct shoal_change_watch {
    watch: ChangeWatch,
    rt: tokio::runtime::Handle,
    /// The strings of the last event handed out: path, to_path, xattr.
    current: [Option<CString>; 3],
}

/// One event of a change watch. Its strings are owned by the watch: valid until the next
/// `shoal_change_watch_next` or `shoal_change_watch_free` on it (not to be freed).
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct shoal_change_event {
    /// The server that logged it (an id of the cluster map).
    pub server: u32,
    /// Its number in that server's log (events of one server come in this order).
    pub seq: u64,
    /// What happened: `SHOAL_CHANGE_CREATE`, ... `SHOAL_CHANGE_CLOSE`.
    pub kind: c_int,
    /// The kind's name, as `shoal watch --events` spells it ("create", "close", ...): a
    /// static string.
    pub kind_name: *const c_char,
    /// The path of what changed (a rename: its old path); NULL only for a rename into the
    /// watched directory from outside it.
    pub path: *const c_char,
    /// A rename: the new path (NULL when it left the watched directory); NULL for the
    /// other kinds.
    pub to_path: *const c_char,
    /// The inode changed, made or unnamed.
    pub ino: u64,
    /// Its type: `SHOAL_DT_REG`, `SHOAL_DT_DIR` or `SHOAL_DT_LNK`.
    pub file_type: u8,
    /// A `SHOAL_CHANGE_XATTR` event: the attribute's name (NULL for the other kinds).
    pub xattr: *const c_char,
    /// Who made the change (`(uint32_t)-1`: a step that recovery finished).
    pub uid: u32,
    /// When, by the server's clock: seconds and nanoseconds since the epoch.
    pub at_sec: i64,
    pub at_nsec: u32,
}

/// The C value of `kind` (its bit) and its name as a static C string.
fn kind_of(kind: ChangeKind) -> (c_int, &'static CStr) {
    match kind {
        ChangeKind::Create => (SHOAL_CHANGE_CREATE, c"create"),
        ChangeKind::Mkdir => (SHOAL_CHANGE_MKDIR, c"mkdir"),
        ChangeKind::Symlink => (SHOAL_CHANGE_SYMLINK, c"symlink"),
        ChangeKind::Link => (SHOAL_CHANGE_LINK, c"link"),
        ChangeKind::Unlink => (SHOAL_CHANGE_UNLINK, c"unlink"),
        ChangeKind::Rmdir => (SHOAL_CHANGE_RMDIR, c"rmdir"),
        ChangeKind::Rename => (SHOAL_CHANGE_RENAME, c"rename"),
        ChangeKind::Setattr => (SHOAL_CHANGE_SETATTR, c"setattr"),
        ChangeKind::Xattr => (SHOAL_CHANGE_XATTR, c"xattr"),
        ChangeKind::Close => (SHOAL_CHANGE_CLOSE, c"close"),
    }
}

/// An optional C string argument: `Some(None)` for NULL, `None` (EINVAL set) if not UTF-8.
fn optional_text<'a>(p: *const c_char, what: &str) -> Option<Option<&'a str>> {
    if p.is_null() {
        return Some(None);
    }
    text(p, what).map(Some)
}

/// `s` as a C string (a NUL inside, which no name holds, is left out).
fn c_string(s: String) -> CString {
    CString::new(s).unwrap_or_else(|e| {
        let mut b = e.into_vec();
        b.retain(|&c| c != 0);
        CString::new(b).unwrap_or_default()
    })
}

fn watch_mut<'a>(w: *mut shoal_change_watch) -> Option<&'a mut shoal_change_watch> {
    if w.is_null() {
        fail(libc::EFAULT, "the shoal_change_watch is NULL");
        return None;
    }
    // SAFETY: a non-NULL watch comes from `shoal_change_watch_open` and is not freed yet.
    Some(unsafe { &mut *w })
}

/// Follow the change log under directory `path` (docs/changes.md).
///
/// * `events`: the kinds wanted, comma-separated, as `shoal watch --events`: "create",
///   "mkdir", "symlink", "link", "unlink", "rmdir", "rename", "setattr", "xattr", "close",
///   or "all" (NULL: all).
/// * `pattern`: a shell pattern the event's name must match (with a '/': its path below
///   `path`); a rename matches by its old or new name. NULL: every event.
/// * `recursive`: non-zero for the whole tree under `path`, 0 for its own entries only.
/// * `consumer`: a name (1 to 255 letters, digits, '-', '_', '.') under which the servers
///   keep the watch's place: the watch starts after the last event acknowledged with that
///   name (`shoal_change_watch_ack`), missing and repeating none; a new name starts now.
///   NULL: no consumer.
/// * `oldest`: non-zero to start with the oldest event the servers keep (no consumer
///   then); 0 to start now.
///
/// NULL on failure (EINVAL: an unknown event, a bad pattern or consumer name, a consumer
/// with `oldest`, a string that is not UTF-8; EFAULT: a NULL client or path; ENOENT,
/// ENOTDIR: `path`; ENOTSUP: a server older than the change log). Free it with
/// `shoal_change_watch_free` before disconnecting.
#[no_mangle]
pub extern "C" fn shoal_change_watch_open(
    c: *const shoal_client,
    path: *const c_char,
    events: *const c_char,
    pattern: *const c_char,
    recursive: c_int,
    consumer: *const c_char,
    oldest: c_int,
) -> *mut shoal_change_watch {
    guard(std::ptr::null_mut(), || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return std::ptr::null_mut() };
        let (Some(events), Some(pattern), Some(consumer)) = (
            optional_text(events, "the events"),
            optional_text(pattern, "the pattern"),
            optional_text(consumer, "the consumer name"),
        ) else {
            return std::ptr::null_mut();
        };
        let kinds = match events.map(parse_kinds) {
            None => ALL_KINDS,
            Some(Ok(k)) => k,
            Some(Err(e)) => {
                fail(libc::EINVAL, format_args!("events {:?}: {e}", events.unwrap_or_default()));
                return std::ptr::null_mut();
            }
        };
        let start = match (consumer, oldest != 0) {
            (Some(_), true) => {
                fail(libc::EINVAL, "a consumer starts where it stopped: not with oldest");
                return std::ptr::null_mut();
            }
            (Some(name), false) => ChangeStart::Consumer(name.to_string()),
            (None, true) => ChangeStart::Oldest,
            (None, false) => ChangeStart::Now,
        };
        let opts = ChangeWatchOptions { kinds, recursive: recursive != 0, pattern: pattern.map(str::to_string), start };
        let Some(watch) = c.block(c.client.watch_changes(path, opts)) else { return std::ptr::null_mut() };
        Box::into_raw(Box::new(shoal_change_watch { watch, rt: c.rt.handle().clone(), current: Default::default() }))
    })
}

/// The next event of `w` into `ev`, waiting up to `timeout_ms` (`SHOAL_WAIT_FOREVER`: until
/// one comes; 0: look once). Returns 1 (an event; its strings live until the next call on
/// `w`), 0 (none came in time: `ev` is left alone) or -1 (EINVAL: a timeout below -1;
/// EFAULT: NULL). A server that cannot be reached is asked again in the background and does
/// not fail the watch. One thread at a time per watch.
#[no_mangle]
pub extern "C" fn shoal_change_watch_next(
    w: *mut shoal_change_watch,
    timeout_ms: i64,
    ev: *mut shoal_change_event,
) -> c_int {
    guard(-1, || {
        let Some(w) = watch_mut(w) else { return -1 };
        if ev.is_null() {
            fail(libc::EFAULT, "the shoal_change_event to fill is NULL");
            return -1;
        }
        let Some(wait) = wait_of(timeout_ms) else { return -1 };
        let Some(got) = crate::error::block(&w.rt, w.watch.next(wait)) else { return -1 };
        let Some(e) = got else { return 0 };
        let (kind, kind_name) = kind_of(e.kind);
        w.current = [e.path.map(c_string), e.to_path.map(c_string), e.xattr.map(c_string)];
        let [path, to_path, xattr] = w.current.each_ref().map(|s| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()));
        let event = shoal_change_event {
            server: e.server.0,
            seq: e.seq,
            kind,
            kind_name: kind_name.as_ptr(),
            path,
            to_path,
            ino: e.ino.0,
            file_type: match e.file_kind {
                FileKind::File => SHOAL_DT_REG,
                FileKind::Dir => SHOAL_DT_DIR,
                FileKind::Symlink => SHOAL_DT_LNK,
            },
            xattr,
            uid: e.uid,
            at_sec: e.at.secs,
            at_nsec: e.at.nsecs,
        };
        // SAFETY: `ev` is non-NULL and points at the caller's shoal_change_event.
        unsafe { *ev = event };
        1
    })
}

/// Keep, on every server, that every event `w` handed out so far is handled: a watch
/// opened again with the same consumer name goes on after them (events handed out after
/// the last acknowledgement come again: at least once). 0, or -1 (EINVAL: a watch opened
/// without a consumer name; EFAULT: NULL).
#[no_mangle]
pub extern "C" fn shoal_change_watch_ack(w: *mut shoal_change_watch) -> c_int {
    guard(-1, || {
        let Some(w) = watch_mut(w) else { return -1 };
        status(crate::error::block(&w.rt, w.watch.ack()))
    })
}

/// Events the servers dropped before `w` read them (a consumer lagging past what the logs
/// keep). -1 (EFAULT) for NULL.
#[no_mangle]
pub extern "C" fn shoal_change_watch_lost(w: *const shoal_change_watch) -> i64 {
    guard(-1, || {
        // SAFETY: a non-NULL `w` came from `shoal_change_watch_open` and is not freed yet.
        match unsafe { w.as_ref() } {
            Some(w) => w.watch.lost() as i64,
            None => {
                fail(libc::EFAULT, "the shoal_change_watch is NULL");
                -1
            }
        }
    })
}

/// Stop `w` and free it with the strings of its last event (NULL: nothing). A consumer's
/// place stays where the last `shoal_change_watch_ack` put it. Returns 0.
#[no_mangle]
pub extern "C" fn shoal_change_watch_free(w: *mut shoal_change_watch) -> c_int {
    guard(-1, || {
        if !w.is_null() {
            // SAFETY: `w` came from `shoal_change_watch_open` and is freed once, here.
            drop(unsafe { Box::from_raw(w) });
        }
        0
    })
}

/// Remove the change-log consumer `name` from every server: its place goes, and the logs
/// no longer keep events for it. 0, or -1 (EINVAL: a bad name or not UTF-8; EFAULT: NULL).
#[no_mangle]
pub extern "C" fn shoal_forget_consumer(c: *const shoal_client, name: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(c), Some(name)) = (client(c), text(name, "the consumer name")) else { return -1 };
        status(c.block(c.client.forget_consumer(name)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_the_bits_of_the_log_and_named_as_the_cli() {
        for k in shoal_proto::change::KINDS {
            let (code, name) = kind_of(k);
            assert_eq!(code as u32, k.bit());
            assert_eq!(name.to_str().unwrap(), k.name());
        }
        assert_eq!(ChangeKind::Close.bit(), SHOAL_CHANGE_CLOSE as u32);
    }
}
