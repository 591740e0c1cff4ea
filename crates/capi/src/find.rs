//! Metadata queries (docs/find.md): `shoal_find_query_init`, `shoal_find`,
//! `shoal_found_next`, `shoal_found_count`, `shoal_found_free`.
//!
//! The tests are given in find(1)'s notation, as strings ("+1M", "-7", "644"), parsed by
//! the same code as `shoal find` and Python's `Client.find`.

use crate::client::{client, shoal_attr, shoal_client, text};
use crate::error::{fail, guard};
use ::shoal_client::{parse_kind, AgeTest, PermTest, SizeTest, TimeField};
use ::shoal_client::{FindOptions, FindQuery, Found};
use std::ffi::{c_char, c_int, CString};

/// A query: every field set must hold. Start from `shoal_find_query_init` (everything
/// unset), then set what you need. Strings are in find(1)'s notation; NULL leaves a test
/// out, and so does -1 for the numbers.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct shoal_find_query {
    /// Shell pattern the name must match (find -name).
    pub name: *const c_char,
    /// Match `name` ignoring case (find -iname): 1, else 0.
    pub ignore_case: c_int,
    /// "f", "d" or "l".
    pub type_: *const c_char,
    /// "[+-]N[ckMG]" (find -size).
    pub size: *const c_char,
    /// "[+-]N" days (find -mtime, -atime, -ctime).
    pub mtime: *const c_char,
    pub atime: *const c_char,
    pub ctime: *const c_char,
    /// "[+-]N" minutes (find -mmin, -amin, -cmin).
    pub mmin: *const c_char,
    pub amin: *const c_char,
    pub cmin: *const c_char,
    /// Owner and group numbers (-1: any).
    pub uid: i64,
    pub gid: i64,
    /// "MODE", "-MODE" or "/MODE", octal (find -perm).
    pub perm: *const c_char,
    /// Regular files striped over exactly this many servers, of exactly this stripe size
    /// (-1: any).
    pub stripe_count: i64,
    pub stripe_size: i64,
    /// An extended attribute the inode must have, and its value (NULL: any value).
    pub xattr: *const c_char,
    pub xattr_value: *const c_char,
    /// 1: only inodes marked read-mostly; 0: only unmarked ones; -1: either.
    pub read_mostly: c_int,
    /// Depth limits below the path searched (which is depth 0); -1 for no maximum.
    pub mindepth: c_int,
    pub maxdepth: c_int,
}

/// One match: its path and attributes, living until the next call on its `shoal_found`.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct shoal_match {
    pub path: *const c_char,
    pub attr: shoal_attr,
}

/// The answer of a query, read with `shoal_found_next`, freed with `shoal_found_free`.
#[allow(non_camel_case_types)]
pub struct shoal_found {
    found: Vec<Found>,
    next: usize,
    path: CString,
    current: shoal_match,
}

/// Set every field of `q` to "unset" (a query that matches everything). 0, or -1 for NULL.
#[no_mangle]
pub extern "C" fn shoal_find_query_init(q: *mut shoal_find_query) -> c_int {
    guard(-1, || {
        if q.is_null() {
            fail(libc::EFAULT, "the shoal_find_query is NULL");
            return -1;
        }
        let none = std::ptr::null();
        let blank = shoal_find_query {
            name: none,
            ignore_case: 0,
            type_: none,
            size: none,
            mtime: none,
            atime: none,
            ctime: none,
            mmin: none,
            amin: none,
            cmin: none,
            uid: -1,
            gid: -1,
            perm: none,
            stripe_count: -1,
            stripe_size: -1,
            xattr: none,
            xattr_value: none,
            read_mostly: -1,
            mindepth: 0,
            maxdepth: -1,
        };
        // SAFETY: `q` is non-NULL and points at the caller's shoal_find_query.
        unsafe { q.write(blank) };
        0
    })
}

/// Everything at or under `path` that passes every test of `q` (NULL: no test) and that the
/// caller may see, sorted by path: every server scans the entries it holds at once. NULL
/// on failure (errno set: EINVAL for a test that does not parse, naming it in
/// `shoal_last_error`).
#[no_mangle]
pub extern "C" fn shoal_find(
    c: *const shoal_client,
    path: *const c_char,
    q: *const shoal_find_query,
) -> *mut shoal_found {
    guard(std::ptr::null_mut(), || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return std::ptr::null_mut() };
        // SAFETY: a non-NULL `q` points at the caller's shoal_find_query for the call.
        let (query, opts) = match unsafe { q.as_ref() }.map(query_of).unwrap_or(Ok(Default::default())) {
            Ok(q) => q,
            Err(e) => {
                fail(libc::EINVAL, e);
                return std::ptr::null_mut();
            }
        };
        let Some((found, _)) = c.block(c.client.find(path, &query, opts)) else { return std::ptr::null_mut() };
        let current = shoal_match { path: std::ptr::null(), attr: shoal_attr::default() };
        Box::into_raw(Box::new(shoal_found { found, next: 0, path: CString::default(), current }))
    })
}

/// The next match of `f`, or NULL at the end (errno untouched) or for a NULL `f` (EFAULT).
#[no_mangle]
pub extern "C" fn shoal_found_next(f: *mut shoal_found) -> *const shoal_match {
    guard(std::ptr::null(), || {
        if f.is_null() {
            fail(libc::EFAULT, "the shoal_found is NULL");
            return std::ptr::null();
        }
        // SAFETY: `f` came from `shoal_find` and is not freed yet.
        let f = unsafe { &mut *f };
        let Some(m) = f.found.get(f.next) else { return std::ptr::null() };
        f.next += 1;
        // Paths hold no NUL (names cannot), so this never fails; an empty one if it did.
        f.path = CString::new(m.path.as_str()).unwrap_or_default();
        f.current = shoal_match { path: f.path.as_ptr(), attr: shoal_attr::from(&m.attr) };
        &f.current
    })
}

/// How many matches `f` holds in all (0 for NULL).
#[no_mangle]
pub extern "C" fn shoal_found_count(f: *const shoal_found) -> usize {
    // SAFETY: a non-NULL `f` came from `shoal_find` and is not freed yet.
    guard(0, || unsafe { f.as_ref() }.map_or(0, |f| f.found.len()))
}

/// Free `f` (NULL: nothing). Returns 0.
#[no_mangle]
pub extern "C" fn shoal_found_free(f: *mut shoal_found) -> c_int {
    guard(-1, || {
        if !f.is_null() {
            // SAFETY: `f` came from `shoal_find` and is freed once, here.
            drop(unsafe { Box::from_raw(f) });
        }
        0
    })
}

/// The query `q` describes, or why a test does not parse.
fn query_of(q: &shoal_find_query) -> Result<(FindQuery, FindOptions), String> {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let field = |p: *const c_char, what: &str| -> Result<Option<String>, String> {
        if p.is_null() {
            return Ok(None);
        }
        // SAFETY: a non-NULL field is a NUL-terminated string of the caller's.
        let s = unsafe { std::ffi::CStr::from_ptr(p) };
        s.to_str().map(|s| Some(s.to_string())).map_err(|_| format!("{what} is not UTF-8"))
    };
    let number = |v: i64| (v >= 0).then_some(v);
    let mut out = FindQuery {
        name: field(q.name, "name")?,
        ignore_case: q.ignore_case != 0,
        uid: number(q.uid).map(|v| v as u32),
        gid: number(q.gid).map(|v| v as u32),
        stripe_count: number(q.stripe_count).map(|v| v as u32),
        stripe_size: number(q.stripe_size).map(|v| v as u64),
        xattr: field(q.xattr, "xattr")?,
        xattr_value: field(q.xattr_value, "xattr_value")?.map(String::into_bytes),
        read_mostly: (q.read_mostly >= 0).then_some(q.read_mostly != 0),
        ..Default::default()
    };
    let bad = |what: &str, e: String| format!("find: {what}: {e}");
    if let Some(t) = field(q.type_, "type")? {
        out.kind = Some(parse_kind(&t).map_err(|e| bad("type", e))?);
    }
    if let Some(s) = field(q.size, "size")? {
        out.size = Some(SizeTest::parse(&s).map_err(|e| bad("size", e))?);
    }
    let ages = [
        (q.mtime, TimeField::Modify, 86_400, "mtime"),
        (q.atime, TimeField::Access, 86_400, "atime"),
        (q.ctime, TimeField::Change, 86_400, "ctime"),
        (q.mmin, TimeField::Modify, 60, "mmin"),
        (q.amin, TimeField::Access, 60, "amin"),
        (q.cmin, TimeField::Change, 60, "cmin"),
    ];
    for (p, f, period, what) in ages {
        if let Some(s) = field(p, what)? {
            out.ages.push(AgeTest::parse(&s, f, period, now).map_err(|e| bad(what, e))?);
        }
    }
    if let Some(p) = field(q.perm, "perm")? {
        out.perm = Some(PermTest::parse(&p).map_err(|e| bad("perm", e))?);
    }
    if out.xattr_value.is_some() && out.xattr.is_none() {
        return Err("find: xattr_value needs xattr (the attribute's name)".into());
    }
    out.pattern().map_err(|e| format!("find: {e}"))?;
    let opts = FindOptions {
        min_depth: q.mindepth.max(0) as usize,
        max_depth: (q.maxdepth >= 0).then_some(q.maxdepth as usize),
        page: 0,
    };
    Ok((out, opts))
}
