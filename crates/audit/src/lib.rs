//! Shoal's loader audit library: `LD_AUDIT=libshoal_audit.so program` answers the dynamic
//! loader's library search on FUSE mounts (Shoal's) from one listing per directory, so a
//! search over many path entries does not send the kernel, the mount or the servers one
//! look-up per entry and library (docs/loading.md, "The loader hook").
//!
//! The GNU loader (rtld-audit(7)) calls [`la_objsearch`] with every path it is about to try
//! for a library: the name as asked for (`LA_SER_ORIG`), then `dir/name` for each
//! directory of DT_RPATH, `LD_LIBRARY_PATH`, DT_RUNPATH, and so on, in its own order. For a
//! candidate whose directory is on a FUSE file system, this library looks the name up in
//! its cached listing of that directory (`listings.rs`): absent, it hands the loader
//! [`ABSENT`] instead, a path on the local root that does not exist, whose open fails at
//! once with ENOENT without reaching the mount; present (or undecidable), it returns the
//! path unchanged and the loader opens it. (Not NULL, which rtld-audit(7) allows for
//! "skip": the loader then judges the candidate by its own `errno`, which this library,
//! linked to a C library of its own namespace, cannot set, and a stale value other than
//! ENOENT ends the whole search.) The loader's order and rules are
//! kept exactly: the library only removes candidates that cannot exist, so the first one
//! left is the one path where the library is.
//!
//! Settings (environment): `SHOAL_AUDIT_RECHECK_MS` (default 1000): how long a listing is
//! trusted before the directory's stamp is checked again (a library added to a directory
//! is found by a running process after at most this long); `SHOAL_AUDIT_DEBUG=1`: one line
//! on stderr per decision; `SHOAL_AUDIT_ALL=1`: use listings on every file system, not only
//! FUSE ones.
//!
//! Safety of the entry points: the loader calls them with valid NUL-terminated strings,
//! holding its own lock; nothing here panics across the C boundary (`catch_unwind`).

mod listings;

use std::ffi::{c_char, c_uint, CStr};
use std::sync::{Mutex, OnceLock};

/// rtld-audit interface version this library implements (1: `la_objsearch` as here).
const LAV_VERSION: c_uint = 1;
/// `la_objsearch` flag: the name as the loader was asked for it (not a search candidate).
const LA_SER_ORIG: c_uint = 0x01;

/// What a candidate that cannot exist becomes: a name on the local root that is not there
/// (its look-up is answered by the kernel's negative dentry after the first).
static ABSENT: &CStr = c"/.shoal-audit-absent";

/// Called first by the loader: the interface version both sides speak.
#[no_mangle]
pub extern "C" fn la_version(version: c_uint) -> c_uint {
    version.min(LAV_VERSION)
}

/// Called for each path the loader is about to try. Returns `name` to try it, [`ABSENT`]
/// to have the loader fail on it at once and go on with the next.
///
/// # Safety
/// `name` is a NUL-terminated string (the loader's).
#[no_mangle]
pub unsafe extern "C" fn la_objsearch(name: *const c_char, _cookie: *mut usize, flag: c_uint) -> *mut c_char {
    if name.is_null() || flag & LA_SER_ORIG != 0 {
        return name as *mut c_char;
    }
    // SAFETY: the loader passes a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(name) }.to_bytes();
    let keep = std::panic::catch_unwind(|| decide(path)).unwrap_or(true);
    if keep {
        name as *mut c_char
    } else {
        ABSENT.as_ptr() as *mut c_char
    }
}

/// Whether the loader should try `path`: false only when the cached listing of its
/// directory says the name is not there.
fn decide(path: &[u8]) -> bool {
    let Some(slash) = path.iter().rposition(|&b| b == b'/') else { return true };
    let (dir, name) = (&path[..slash.max(1)], &path[slash + 1..]);
    let s = settings();
    let answer = cache().lock().map(|mut c| c.contains(dir, name, s)).unwrap_or(None);
    if s.debug {
        let what = match answer {
            Some(true) => "try",
            Some(false) => "skip",
            None => "try (no listing)",
        };
        eprintln!("shoal-audit: {what} {}", String::from_utf8_lossy(path));
    }
    answer != Some(false)
}

/// The environment's settings, read once.
pub(crate) struct Settings {
    pub recheck: std::time::Duration,
    pub debug: bool,
    pub all: bool,
}

fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| {
        let on = |k: &str| std::env::var(k).is_ok_and(|v| v == "1" || v == "yes" || v == "true");
        let ms = std::env::var("SHOAL_AUDIT_RECHECK_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
        Settings {
            recheck: std::time::Duration::from_millis(ms),
            debug: on("SHOAL_AUDIT_DEBUG"),
            all: on("SHOAL_AUDIT_ALL"),
        }
    })
}

fn cache() -> &'static Mutex<listings::Listings> {
    static C: OnceLock<Mutex<listings::Listings>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(listings::Listings::default()))
}
