//! The tuple space (docs/tuples.md): tuples and templates built field by field, written,
//! read and taken with a timeout, their fields read back, and watches.
//!
//! `shoal_tuple_new` / `shoal_tuple_add_*` build a tuple (integers, strings, bytes);
//! `shoal_template_new` / `shoal_template_add_*` a template (the same values, plus typed
//! wildcards and the any-wildcard). `shoal_tuple_write` stores a tuple; `shoal_tuple_read`,
//! `shoal_tuple_read_newest` and `shoal_tuple_take` return a new `shoal_tuple` whose fields
//! are read with `shoal_tuple_count`, `shoal_tuple_type` and `shoal_tuple_get_*`;
//! `shoal_tuple_watch` follows events from a cursor.

use crate::client::{client, shoal_client, text};
use crate::error::{fail, guard};
use ::shoal_client::{Field, Template, Tuple, TupleEventKind, TupleWatch, Value, ValueKind, WatchFrom};
use std::ffi::{c_char, c_int, c_void};
use std::time::Duration;

/// `shoal_tuple_type` of an integer field (`int64_t`), and the kind given to
/// `shoal_template_add_any_of` for "any integer".
pub const SHOAL_TUPLE_INT: c_int = 1;
/// A string field (UTF-8).
pub const SHOAL_TUPLE_STR: c_int = 2;
/// A field of bytes.
pub const SHOAL_TUPLE_BYTES: c_int = 3;
/// A timeout of `shoal_tuple_read`, `shoal_tuple_take`, `shoal_tuple_watch_next` and
/// `shoal_checkpoint_is_committed`: wait until there is one (0: look once; N > 0: wait up
/// to N milliseconds).
pub const SHOAL_WAIT_FOREVER: i64 = -1;
/// `kinds` of `shoal_tuple_watch`, and `shoal_tuple_event::kind`: a tuple was written.
pub const SHOAL_WATCH_WRITTEN: c_int = 1;
/// A tuple was taken.
pub const SHOAL_WATCH_TAKEN: c_int = 2;
/// `after` of `shoal_tuple_watch`: the events from now on (a cursor >= 0: the events after
/// it; 0: every event the server still keeps).
pub const SHOAL_WATCH_NOW: i64 = -1;
// Literals above, because cbindgen writes only literals into shoal.h; kept equal here.
const _: () = assert!(SHOAL_WATCH_WRITTEN as u8 == ::shoal_client::WATCH_WRITTEN);
const _: () = assert!(SHOAL_WATCH_TAKEN as u8 == ::shoal_client::WATCH_TAKEN);

/// A tuple: built with `shoal_tuple_new` and `shoal_tuple_add_*`, or returned by a read, a
/// take or a watch. Freed with `shoal_tuple_free` (except an event's, which its watcher
/// owns).
#[allow(non_camel_case_types)]
pub struct shoal_tuple {
    values: Vec<Value>,
    /// Each string value followed by a NUL, for `shoal_tuple_get_str` (empty for others).
    texts: Vec<Vec<u8>>,
}

impl shoal_tuple {
    fn of(t: Tuple) -> shoal_tuple {
        let mut out = shoal_tuple { values: Vec::with_capacity(t.0.len()), texts: Vec::with_capacity(t.0.len()) };
        for v in t.0 {
            out.push(v);
        }
        out
    }

    fn push(&mut self, v: Value) {
        self.texts.push(match &v {
            Value::Str(s) => {
                let mut b = Vec::with_capacity(s.len() + 1);
                b.extend_from_slice(s.as_bytes());
                b.push(0);
                b
            }
            _ => Vec::new(),
        });
        self.values.push(v);
    }

    fn tuple(&self) -> Tuple {
        Tuple(self.values.clone())
    }

    /// Field `i`, or `None` (EINVAL) past the end.
    fn field(&self, i: usize) -> Option<&Value> {
        let v = self.values.get(i);
        if v.is_none() {
            fail(libc::EINVAL, format_args!("field {i} of a tuple of {} fields", self.values.len()));
        }
        v
    }
}

/// A template: built with `shoal_template_new` and `shoal_template_add_*`, freed with
/// `shoal_template_free`. Its first field must be a value (it names the server).
#[allow(non_camel_case_types)]
pub struct shoal_template {
    fields: Vec<Field>,
}

/// A running watch (`shoal_tuple_watch`), freed with `shoal_tuple_watch_free`.
#[allow(non_camel_case_types)]
pub struct shoal_tuple_watcher {
    watch: TupleWatch,
    rt: tokio::runtime::Handle,
    /// The tuple of the last event handed out.
    current: Option<Box<shoal_tuple>>,
}

/// One event of a watch.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct shoal_tuple_event {
    /// Its number on the server (the watch's cursor once it is handed out).
    pub seq: u64,
    /// `SHOAL_WATCH_WRITTEN` or `SHOAL_WATCH_TAKEN`.
    pub kind: c_int,
    /// Who wrote or took the tuple.
    pub uid: u32,
    /// When, by the server's clock: seconds and nanoseconds since the epoch.
    pub at_sec: i64,
    pub at_nsec: u32,
    /// The tuple, owned by the watcher: valid until the next `shoal_tuple_watch_next` or
    /// `shoal_tuple_watch_free` on it (not to be freed).
    pub tuple: *const shoal_tuple,
}

fn tuple_mut<'a>(t: *mut shoal_tuple) -> Option<&'a mut shoal_tuple> {
    if t.is_null() {
        fail(libc::EFAULT, "the shoal_tuple is NULL");
        return None;
    }
    // SAFETY: a non-NULL tuple comes from `shoal_tuple_new` or a read and is not freed.
    Some(unsafe { &mut *t })
}

fn tuple_ref<'a>(t: *const shoal_tuple) -> Option<&'a shoal_tuple> {
    if t.is_null() {
        fail(libc::EFAULT, "the shoal_tuple is NULL");
        return None;
    }
    // SAFETY: as for `tuple_mut`.
    Some(unsafe { &*t })
}

fn template_mut<'a>(t: *mut shoal_template) -> Option<&'a mut shoal_template> {
    if t.is_null() {
        fail(libc::EFAULT, "the shoal_template is NULL");
        return None;
    }
    // SAFETY: a non-NULL template comes from `shoal_template_new` and is not freed.
    Some(unsafe { &mut *t })
}

fn template_ref<'a>(t: *const shoal_template) -> Option<&'a shoal_template> {
    if t.is_null() {
        fail(libc::EFAULT, "the shoal_template is NULL");
        return None;
    }
    // SAFETY: as for `template_mut`.
    Some(unsafe { &*t })
}

/// `len` bytes at `p` as a value (`p` may be NULL when `len` is 0).
fn bytes_value(p: *const c_void, len: usize) -> Option<Value> {
    crate::file::bytes_of(p, len).map(|b| Value::Bytes(b.to_vec()))
}

/// A timeout in milliseconds as a wait: `SHOAL_WAIT_FOREVER` (-1) none, 0 look once;
/// `None` (EINVAL) below -1.
pub(crate) fn wait_of(timeout_ms: i64) -> Option<Option<Duration>> {
    match timeout_ms {
        SHOAL_WAIT_FOREVER => Some(None),
        ms if ms >= 0 => Some(Some(Duration::from_millis(ms as u64))),
        ms => {
            fail(libc::EINVAL, format_args!("timeout {ms} ms: give -1 (forever), 0 (look once) or a wait in ms"));
            None
        }
    }
}

// ---- building tuples ----

/// A new tuple with no field (add them with `shoal_tuple_add_*`; one at least before it
/// is written). Free it with `shoal_tuple_free`.
#[no_mangle]
pub extern "C" fn shoal_tuple_new() -> *mut shoal_tuple {
    guard(std::ptr::null_mut(), || Box::into_raw(Box::new(shoal_tuple { values: Vec::new(), texts: Vec::new() })))
}

/// Add an integer field to `t`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_tuple_add_int(t: *mut shoal_tuple, v: i64) -> c_int {
    guard(-1, || {
        let Some(t) = tuple_mut(t) else { return -1 };
        t.push(Value::Int(v));
        0
    })
}

/// Add a string field (NUL-terminated UTF-8, copied) to `t`. 0 or -1 (EINVAL: not UTF-8).
#[no_mangle]
pub extern "C" fn shoal_tuple_add_str(t: *mut shoal_tuple, s: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(t), Some(s)) = (tuple_mut(t), text(s, "the string")) else { return -1 };
        t.push(Value::Str(s.to_string()));
        0
    })
}

/// Add a field of `len` bytes at `p` (copied; `p` may be NULL when `len` is 0) to `t`.
/// 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_tuple_add_bytes(t: *mut shoal_tuple, p: *const c_void, len: usize) -> c_int {
    guard(-1, || {
        let (Some(t), Some(v)) = (tuple_mut(t), bytes_value(p, len)) else { return -1 };
        t.push(v);
        0
    })
}

/// Free `t` (NULL: nothing). Not for an event's tuple, which its watcher owns. Returns 0.
#[no_mangle]
pub extern "C" fn shoal_tuple_free(t: *mut shoal_tuple) -> c_int {
    guard(-1, || {
        if !t.is_null() {
            // SAFETY: `t` came from `shoal_tuple_new` or a read and is freed once, here.
            drop(unsafe { Box::from_raw(t) });
        }
        0
    })
}

// ---- reading fields back ----

/// How many fields `t` has (0 for NULL).
#[no_mangle]
pub extern "C" fn shoal_tuple_count(t: *const shoal_tuple) -> usize {
    // SAFETY: a non-NULL `t` is a live tuple (see `tuple_ref`).
    guard(0, || unsafe { t.as_ref() }.map_or(0, |t| t.values.len()))
}

/// The type of field `i` of `t`: `SHOAL_TUPLE_INT`, `SHOAL_TUPLE_STR` or
/// `SHOAL_TUPLE_BYTES`; -1 (EINVAL) past the last field.
#[no_mangle]
pub extern "C" fn shoal_tuple_type(t: *const shoal_tuple, i: usize) -> c_int {
    guard(-1, || {
        let Some(v) = tuple_ref(t).and_then(|t| t.field(i)) else { return -1 };
        match v {
            Value::Int(_) => SHOAL_TUPLE_INT,
            Value::Str(_) => SHOAL_TUPLE_STR,
            Value::Bytes(_) => SHOAL_TUPLE_BYTES,
        }
    })
}

/// The integer of field `i` of `t` into `out`. 0, or -1 (EINVAL: no such field, or not an
/// integer).
#[no_mangle]
pub extern "C" fn shoal_tuple_get_int(t: *const shoal_tuple, i: usize, out: *mut i64) -> c_int {
    guard(-1, || {
        let Some(v) = tuple_ref(t).and_then(|t| t.field(i)) else { return -1 };
        let Value::Int(n) = v else {
            fail(libc::EINVAL, format_args!("field {i} is a {}, not an integer", kind_name(v)));
            return -1;
        };
        if out.is_null() {
            fail(libc::EFAULT, "the int64_t to fill is NULL");
            return -1;
        }
        // SAFETY: `out` is non-NULL and points at the caller's int64_t.
        unsafe { *out = *n };
        0
    })
}

/// The string of field `i` of `t`, NUL-terminated, living as long as `t`; its length in
/// bytes (without the NUL) into `len` unless NULL (a string may hold a NUL of its own when
/// another client wrote it). NULL (EINVAL: no such field, or not a string) on failure.
#[no_mangle]
pub extern "C" fn shoal_tuple_get_str(t: *const shoal_tuple, i: usize, len: *mut usize) -> *const c_char {
    guard(std::ptr::null(), || {
        let Some(t) = tuple_ref(t) else { return std::ptr::null() };
        let Some(v) = t.field(i) else { return std::ptr::null() };
        if !matches!(v, Value::Str(_)) {
            fail(libc::EINVAL, format_args!("field {i} is a {}, not a string", kind_name(v)));
            return std::ptr::null();
        }
        let s = &t.texts[i];
        if !len.is_null() {
            // SAFETY: `len` is non-NULL and points at the caller's size_t.
            unsafe { *len = s.len() - 1 };
        }
        s.as_ptr() as *const c_char
    })
}

/// The bytes of field `i` of `t`, living as long as `t`, and their number into `len`
/// (required). NULL (EINVAL: no such field, or not bytes) on failure; never NULL on
/// success, even for 0 bytes.
#[no_mangle]
pub extern "C" fn shoal_tuple_get_bytes(t: *const shoal_tuple, i: usize, len: *mut usize) -> *const c_void {
    guard(std::ptr::null(), || {
        let Some(v) = tuple_ref(t).and_then(|t| t.field(i)) else { return std::ptr::null() };
        let Value::Bytes(b) = v else {
            fail(libc::EINVAL, format_args!("field {i} is a {}, not bytes", kind_name(v)));
            return std::ptr::null();
        };
        if len.is_null() {
            fail(libc::EFAULT, "the size_t to fill is NULL");
            return std::ptr::null();
        }
        // SAFETY: `len` is non-NULL and points at the caller's size_t.
        unsafe { *len = b.len() };
        if b.is_empty() {
            return c"".as_ptr() as *const c_void;
        }
        b.as_ptr() as *const c_void
    })
}

fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Int(_) => "integer",
        Value::Str(_) => "string",
        Value::Bytes(_) => "byte string",
    }
}

// ---- building templates ----

/// A new template with no field (add them with `shoal_template_add_*`; the first must be a
/// value). Free it with `shoal_template_free`.
#[no_mangle]
pub extern "C" fn shoal_template_new() -> *mut shoal_template {
    guard(std::ptr::null_mut(), || Box::into_raw(Box::new(shoal_template { fields: Vec::new() })))
}

/// Add a field matching exactly the integer `v`. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_template_add_int(t: *mut shoal_template, v: i64) -> c_int {
    guard(-1, || {
        let Some(t) = template_mut(t) else { return -1 };
        t.fields.push(Field::Is(Value::Int(v)));
        0
    })
}

/// Add a field matching exactly the string `s` (NUL-terminated UTF-8, copied). 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_template_add_str(t: *mut shoal_template, s: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(t), Some(s)) = (template_mut(t), text(s, "the string")) else { return -1 };
        t.fields.push(Field::Is(Value::Str(s.to_string())));
        0
    })
}

/// Add a field matching exactly the `len` bytes at `p` (copied). 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_template_add_bytes(t: *mut shoal_template, p: *const c_void, len: usize) -> c_int {
    guard(-1, || {
        let (Some(t), Some(v)) = (template_mut(t), bytes_value(p, len)) else { return -1 };
        t.fields.push(Field::Is(v));
        0
    })
}

/// Add a typed wildcard: any value of type `kind` (`SHOAL_TUPLE_INT`, `SHOAL_TUPLE_STR`,
/// `SHOAL_TUPLE_BYTES`). 0 or -1 (EINVAL: another kind).
#[no_mangle]
pub extern "C" fn shoal_template_add_any_of(t: *mut shoal_template, kind: c_int) -> c_int {
    guard(-1, || {
        let Some(t) = template_mut(t) else { return -1 };
        let kind = match kind {
            SHOAL_TUPLE_INT => ValueKind::Int,
            SHOAL_TUPLE_STR => ValueKind::Str,
            SHOAL_TUPLE_BYTES => ValueKind::Bytes,
            k => {
                fail(libc::EINVAL, format_args!("kind {k}: SHOAL_TUPLE_INT, SHOAL_TUPLE_STR or SHOAL_TUPLE_BYTES"));
                return -1;
            }
        };
        t.fields.push(Field::AnyOf(kind));
        0
    })
}

/// Add a wildcard matching any value. 0 or -1.
#[no_mangle]
pub extern "C" fn shoal_template_add_any(t: *mut shoal_template) -> c_int {
    guard(-1, || {
        let Some(t) = template_mut(t) else { return -1 };
        t.fields.push(Field::Any);
        0
    })
}

/// Free `t` (NULL: nothing). Returns 0.
#[no_mangle]
pub extern "C" fn shoal_template_free(t: *mut shoal_template) -> c_int {
    guard(-1, || {
        if !t.is_null() {
            // SAFETY: `t` came from `shoal_template_new` and is freed once, here.
            drop(unsafe { Box::from_raw(t) });
        }
        0
    })
}

// ---- the calls ----

/// Store the tuple `t` (kept on the server its first field names). Returns the number of
/// the event that recorded it on that server (> 0), or -1 (EINVAL: no field, more than 64,
/// more than 960 KiB of values; ENOTSUP: a server older than the tuple space).
#[no_mangle]
pub extern "C" fn shoal_tuple_write(c: *const shoal_client, t: *const shoal_tuple) -> i64 {
    guard(-1, || {
        let (Some(c), Some(t)) = (client(c), tuple_ref(t)) else { return -1 };
        match c.block(c.client.tuple_write(&t.tuple())) {
            Some(seq) => seq as i64,
            None => -1,
        }
    })
}

/// How a read picks its tuple.
#[derive(Clone, Copy)]
enum Get {
    Oldest,
    Newest,
    Take,
}

fn get(
    c: *const shoal_client,
    t: *const shoal_template,
    timeout_ms: i64,
    out: *mut *mut shoal_tuple,
    how: Get,
) -> c_int {
    guard(-1, || {
        let (Some(c), Some(t)) = (client(c), template_ref(t)) else { return -1 };
        let Some(wait) = wait_of(timeout_ms) else { return -1 };
        if out.is_null() {
            fail(libc::EFAULT, "the shoal_tuple * to fill is NULL");
            return -1;
        }
        let template = Template(t.fields.clone());
        let got = match how {
            Get::Oldest => c.block(c.client.tuple_read(&template, wait)),
            Get::Newest => c.block(c.client.tuple_read_newest(&template, wait)),
            Get::Take => c.block(c.client.tuple_take(&template, wait)),
        };
        let Some(got) = got else { return -1 };
        let (ptr, found) = match got {
            Some(tuple) => (Box::into_raw(Box::new(shoal_tuple::of(tuple))), 1),
            None => (std::ptr::null_mut(), 0),
        };
        // SAFETY: `out` is non-NULL and points at the caller's shoal_tuple *.
        unsafe { *out = ptr };
        found
    })
}

/// The oldest tuple matching `t`, left in place, into `*out` (a new tuple: free it with
/// `shoal_tuple_free`). Waits up to `timeout_ms` for one (`SHOAL_WAIT_FOREVER`: until one
/// comes; 0: look once). Returns 1 (found), 0 (none came in time; `*out` is NULL) or -1
/// (EINVAL: a template whose first field is a wildcard, a bad timeout).
#[no_mangle]
pub extern "C" fn shoal_tuple_read(
    c: *const shoal_client,
    t: *const shoal_template,
    timeout_ms: i64,
    out: *mut *mut shoal_tuple,
) -> c_int {
    get(c, t, timeout_ms, out, Get::Oldest)
}

/// As `shoal_tuple_read`, the newest matching tuple instead of the oldest.
#[no_mangle]
pub extern "C" fn shoal_tuple_read_newest(
    c: *const shoal_client,
    t: *const shoal_template,
    timeout_ms: i64,
    out: *mut *mut shoal_tuple,
) -> c_int {
    get(c, t, timeout_ms, out, Get::Newest)
}

/// As `shoal_tuple_read`, and the tuple is removed: of several callers taking at once,
/// each tuple goes to one.
#[no_mangle]
pub extern "C" fn shoal_tuple_take(
    c: *const shoal_client,
    t: *const shoal_template,
    timeout_ms: i64,
    out: *mut *mut shoal_tuple,
) -> c_int {
    get(c, t, timeout_ms, out, Get::Take)
}

// ---- watches ----

/// Follow the events of the tuples matching `t`: `kinds` is `SHOAL_WATCH_WRITTEN`,
/// `SHOAL_WATCH_TAKEN` or both (or-ed); `after` is `SHOAL_WATCH_NOW` (the events from now
/// on) or a cursor kept from `shoal_tuple_watch_cursor` (the events after it: none missed,
/// none repeated; 0: every event the server keeps). NULL on failure (EINVAL: no kind, a
/// bad `after` or template). Free it with `shoal_tuple_watch_free` before disconnecting.
#[no_mangle]
pub extern "C" fn shoal_tuple_watch(
    c: *const shoal_client,
    t: *const shoal_template,
    kinds: c_int,
    after: i64,
) -> *mut shoal_tuple_watcher {
    guard(std::ptr::null_mut(), || {
        let (Some(c), Some(t)) = (client(c), template_ref(t)) else { return std::ptr::null_mut() };
        if kinds & !(SHOAL_WATCH_WRITTEN | SHOAL_WATCH_TAKEN) != 0 {
            fail(libc::EINVAL, format_args!("kinds {kinds}: SHOAL_WATCH_WRITTEN, SHOAL_WATCH_TAKEN or both"));
            return std::ptr::null_mut();
        }
        let from = match after {
            SHOAL_WATCH_NOW => WatchFrom::Now,
            n if n >= 0 => WatchFrom::After(n as u64),
            n => {
                fail(libc::EINVAL, format_args!("after {n}: SHOAL_WATCH_NOW or a cursor (>= 0)"));
                return std::ptr::null_mut();
            }
        };
        let template = Template(t.fields.clone());
        let Some(watch) = c.block(c.client.tuple_watch(&template, kinds as u8, from)) else {
            return std::ptr::null_mut();
        };
        Box::into_raw(Box::new(shoal_tuple_watcher { watch, rt: c.rt.handle().clone(), current: None }))
    })
}

/// The next event of `w` into `ev`, waiting up to `timeout_ms` (`SHOAL_WAIT_FOREVER`: until
/// one comes; 0: look once). Returns 1 (an event; its tuple lives until the next call on
/// `w`), 0 (none came in time) or -1. One thread at a time per watcher.
#[no_mangle]
pub extern "C" fn shoal_tuple_watch_next(
    w: *mut shoal_tuple_watcher,
    timeout_ms: i64,
    ev: *mut shoal_tuple_event,
) -> c_int {
    guard(-1, || {
        if w.is_null() {
            fail(libc::EFAULT, "the shoal_tuple_watcher is NULL");
            return -1;
        }
        if ev.is_null() {
            fail(libc::EFAULT, "the shoal_tuple_event to fill is NULL");
            return -1;
        }
        let Some(wait) = wait_of(timeout_ms) else { return -1 };
        // SAFETY: `w` came from `shoal_tuple_watch` and is not freed yet.
        let w = unsafe { &mut *w };
        let Some(got) = crate::error::block(&w.rt, w.watch.next(wait)) else { return -1 };
        let Some(e) = got else { return 0 };
        let tuple = Box::new(shoal_tuple::of(e.tuple));
        let event = shoal_tuple_event {
            seq: e.seq,
            kind: match e.kind {
                TupleEventKind::Written => SHOAL_WATCH_WRITTEN,
                TupleEventKind::Taken => SHOAL_WATCH_TAKEN,
            },
            uid: e.uid,
            at_sec: e.at.secs,
            at_nsec: e.at.nsecs,
            tuple: &*tuple as *const shoal_tuple,
        };
        w.current = Some(tuple);
        // SAFETY: `ev` is non-NULL and points at the caller's shoal_tuple_event.
        unsafe { *ev = event };
        1
    })
}

/// Where `w` stands: every event up to this one was handed out or did not match. Keep it
/// to go on later (`after` of `shoal_tuple_watch`). -1 (EFAULT) for NULL.
#[no_mangle]
pub extern "C" fn shoal_tuple_watch_cursor(w: *const shoal_tuple_watcher) -> i64 {
    guard(-1, || {
        // SAFETY: a non-NULL `w` came from `shoal_tuple_watch` and is not freed yet.
        match unsafe { w.as_ref() } {
            Some(w) => w.watch.cursor() as i64,
            None => {
                fail(libc::EFAULT, "the shoal_tuple_watcher is NULL");
                -1
            }
        }
    })
}

/// Events the server dropped from its log before `w` read them (it keeps the newest
/// 65,536). -1 (EFAULT) for NULL.
#[no_mangle]
pub extern "C" fn shoal_tuple_watch_lost(w: *const shoal_tuple_watcher) -> i64 {
    guard(-1, || {
        // SAFETY: as for `shoal_tuple_watch_cursor`.
        match unsafe { w.as_ref() } {
            Some(w) => w.watch.lost() as i64,
            None => {
                fail(libc::EFAULT, "the shoal_tuple_watcher is NULL");
                -1
            }
        }
    })
}

/// Free `w` and the tuple of its last event (NULL: nothing). Returns 0.
#[no_mangle]
pub extern "C" fn shoal_tuple_watch_free(w: *mut shoal_tuple_watcher) -> c_int {
    guard(-1, || {
        if !w.is_null() {
            // SAFETY: `w` came from `shoal_tuple_watch` and is freed once, here.
            drop(unsafe { Box::from_raw(w) });
        }
        0
    })
}
