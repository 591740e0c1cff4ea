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

/// Whether `path` is on a FUSE file system: its device is one of the FUSE mounts'
/// (`statfs` would tell too, but a FUSE mount answers it by asking its servers).
fn on_fuse(path: &Path) -> bool {
    static DEVICES: std::sync::OnceLock<HashSet<u64>> = std::sync::OnceLock::new();
    let devices = DEVICES
        .get_or_init(|| std::fs::read_to_string("/proc/self/mountinfo").map(|t| fuse_devices(&t)).unwrap_or_default());
    std::fs::metadata(path).is_ok_and(|m| devices.contains(&m.dev()))
}

/// The device numbers of the FUSE mounts in a mountinfo text (proc(5): field 3 is
/// `major:minor`, the file system type follows the ` - ` separator).
fn fuse_devices(mountinfo: &str) -> HashSet<u64> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            let fstype = f.get(sep + 1)?;
            let (major, minor) = f.get(2)?.split_once(':')?;
            if *fstype != "fuse" && !fstype.starts_with("fuse.") {
                return None;
            }
            Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
        })
        .collect()
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

    #[test]
    fn fuse_mounts_are_found_by_their_device() {
        let text = "87 30 0:52 / /tmp/a\\040b/m rw,relatime shared:45 - fuse.shoal shoal:/tmp/c.toml rw\n\
                    22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    90 30 0:60 / /x rw - fuse sshfs rw\n";
        let d = fuse_devices(text);
        assert_eq!(d.len(), 2);
        assert!(d.contains(&libc::makedev(0, 52)) && d.contains(&libc::makedev(0, 60)));
    }
}
