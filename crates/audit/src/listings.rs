//! One listing per directory, as the process last read it, with the directory's stamp.
//!
//! Invariant: a listing answers "absent" only if it was read after the directory last
//! changed as far as its stamp (inode, mtime, ctime) tells, checked at most
//! `Settings::recheck` ago. A directory that does not exist lists as empty (its stamp says
//! so, and is checked again like any other). Bounded: at most [`MAX_DIRS`] directories
//! and [`MAX_NAMES`] names per directory (a bigger directory is not cached: its candidates
//! are all tried, as without this library).

use crate::Settings;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

/// Directories remembered (past it, the cache starts again).
const MAX_DIRS: usize = 4096;
/// Most names cached for one directory.
const MAX_NAMES: usize = 1 << 16;
/// `statfs` type of FUSE file systems (Shoal's mounts among them).
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// What identifies a directory's state: `None` when it does not exist.
type Stamp = Option<(u64, i64, i64, i64, i64)>;

struct Listing {
    stamp: Stamp,
    checked: Instant,
    /// `None`: not cached (not a FUSE file system, unreadable, or too big).
    names: Option<HashSet<Vec<u8>>>,
}

#[derive(Default)]
pub(crate) struct Listings {
    dirs: HashMap<Vec<u8>, Listing>,
}

impl Listings {
    /// Whether `dir` holds `name`: `None` when no listing can tell.
    pub(crate) fn contains(&mut self, dir: &[u8], name: &[u8], s: &Settings) -> Option<bool> {
        let now = Instant::now();
        let fresh = self.dirs.get(dir).is_some_and(|l| now.duration_since(l.checked) < s.recheck);
        if !fresh {
            let stamp = stamp(dir);
            match self.dirs.get_mut(dir) {
                Some(l) if l.stamp == stamp => l.checked = now,
                _ => {
                    if self.dirs.len() >= MAX_DIRS {
                        self.dirs.clear();
                    }
                    let names = read(dir, stamp, s.all);
                    self.dirs.insert(dir.to_vec(), Listing { stamp, checked: now, names });
                }
            }
        }
        self.dirs.get(dir)?.names.as_ref().map(|n| n.contains(name))
    }
}

fn stamp(dir: &[u8]) -> Stamp {
    let m = std::fs::metadata(Path::new(OsStr::from_bytes(dir))).ok()?;
    Some((m.ino(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
}

/// The names in `dir`, if it is on a FUSE file system (any, with `all`) and small enough;
/// an empty set for a directory that does not exist under a FUSE one.
fn read(dir: &[u8], stamp: Stamp, all: bool) -> Option<HashSet<Vec<u8>>> {
    let path = Path::new(OsStr::from_bytes(dir));
    if stamp.is_none() {
        // Missing: cached as empty only if its nearest existing ancestor is on FUSE.
        let mut up = path.parent();
        while let Some(p) = up {
            if p.exists() {
                return (all || on_fuse(p)).then(HashSet::new);
            }
            up = p.parent();
        }
        return None;
    }
    if !all && !on_fuse(path) {
        return None;
    }
    let mut names = HashSet::new();
    for e in std::fs::read_dir(path).ok()? {
        names.insert(e.ok()?.file_name().as_bytes().to_vec());
        if names.len() > MAX_NAMES {
            return None;
        }
    }
    Some(names)
}

fn on_fuse(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: a valid C string and a zeroed statfs to fill.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as i64 == FUSE_SUPER_MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_listing_answers_absent_names_and_sees_a_change_after_the_recheck() {
        let d = std::env::temp_dir().join(format!("shoal-audit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("liba.so"), b"x").unwrap();
        let s = Settings { recheck: Duration::ZERO, debug: false, all: true };
        let mut l = Listings::default();
        let dir = d.as_os_str().as_bytes();
        assert_eq!(l.contains(dir, b"liba.so", &s), Some(true));
        assert_eq!(l.contains(dir, b"libb.so", &s), Some(false));
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(d.join("libb.so"), b"x").unwrap();
        assert_eq!(l.contains(dir, b"libb.so", &s), Some(true));
        // A missing directory under an existing one lists as empty.
        let gone = d.join("glibc-hwcaps/x86-64-v3");
        assert_eq!(l.contains(gone.as_os_str().as_bytes(), b"liba.so", &s), Some(false));
        // Not on FUSE and not `all`: no listing.
        let s = Settings { all: false, ..s };
        let mut l = Listings::default();
        assert_eq!(l.contains(dir, b"libb.so", &s), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
