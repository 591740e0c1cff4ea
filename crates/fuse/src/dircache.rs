//! Attributes of directories, kept by the mount for `attr_timeout`.
//!
//! **Why.** With `default_permissions` the kernel checks write and search permission on a
//! directory from the attributes it holds before every create, unlink, mkdir… in it. But
//! after each such change it marks the directory's attributes stale (its times changed),
//! so the *next* change first asks for them again (GETATTR): without this cache, every
//! create or unlink through the mount cost a GetAttr request besides its own.
//!
//! **What.** The attributes a server last gave for each directory (on getattr, lookup,
//! mkdir, opendir, setattr), trusted for `attr_timeout` from when they were asked for —
//! the lifetime the kernel itself gives them, so what another client changes shows as late
//! as it would have anyway. Changes made through this mount are applied here as the
//! servers apply them: a new or removed name sets mtime and ctime to the mount's clock
//! (the servers stamp the change with theirs, within the request's round trip of it), a
//! subdirectory made or removed also moves the link count. Renames forget everything (a
//! moved directory's attributes change on a server this mount does not ask); setattr and
//! extended attribute changes forget the directory they touch.
//!
//! A reply to a request that started before a change made through this mount does not
//! replace what that change left here (it may predate the change). With `attr_timeout=0`
//! nothing is kept.

use parking_lot::Mutex;
use shoal_client::{Attr, FileKind, Timestamp};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Bound on the number of directories remembered (everything is dropped when passed).
const LIMIT: usize = 1 << 16;

struct Entry {
    /// When the attributes were asked of a server (the start of their lifetime).
    fetched: Instant,
    /// When this mount last changed the directory (or `fetched`).
    changed: Instant,
    /// None: changed or forgotten while unknown here; only `changed` matters then.
    attr: Option<Attr>,
}

#[derive(Default)]
struct Inner {
    dirs: HashMap<u64, Entry>,
    /// (parent, name) → inode of directories learnt by name, to forget one when it is removed.
    names: HashMap<(u64, String), u64>,
    /// When everything was last forgotten: older replies are not taken in.
    cleared: Option<Instant>,
}

pub(crate) struct DirCache {
    ttl: Duration,
    inner: Mutex<Inner>,
}

/// The current time as the servers write it into attributes.
fn now_stamp() -> Timestamp {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp { secs: d.as_secs() as i64, nsecs: d.subsec_nanos() },
        Err(_) => Timestamp::default(),
    }
}

fn later(a: Timestamp, b: Timestamp) -> Timestamp {
    if (a.secs, a.nsecs) >= (b.secs, b.nsecs) {
        a
    } else {
        b
    }
}

impl DirCache {
    pub(crate) fn new(ttl: Duration) -> DirCache {
        DirCache { ttl, inner: Mutex::new(Inner::default()) }
    }

    /// Attributes of directory `ino` and how much longer they may be trusted.
    pub(crate) fn get(&self, ino: u64) -> Option<(Attr, Duration)> {
        let inner = self.inner.lock();
        let e = inner.dirs.get(&ino)?;
        let left = self.ttl.checked_sub(e.fetched.elapsed())?;
        (!left.is_zero()).then(|| e.attr.clone().map(|a| (a, left))).flatten()
    }

    /// A server gave `attr` in answer to a request sent at `asked`; `name` is (parent,
    /// name) when it came from a lookup or mkdir. Not a directory, or no caching: ignored.
    pub(crate) fn fetched(&self, attr: &Attr, asked: Instant, name: Option<(u64, &str)>) {
        if attr.kind != FileKind::Dir || self.ttl.is_zero() {
            return;
        }
        let mut inner = self.inner.lock();
        if inner.cleared.is_some_and(|c| c > asked) {
            return;
        }
        if inner.dirs.get(&attr.ino.0).is_some_and(|e| e.changed > asked) {
            return;
        }
        Self::make_room(&mut inner);
        inner.dirs.insert(attr.ino.0, Entry { fetched: asked, changed: asked, attr: Some(attr.clone()) });
        if let Some((parent, name)) = name {
            inner.names.insert((parent, name.to_string()), attr.ino.0);
        }
    }

    fn make_room(inner: &mut Inner) {
        if inner.dirs.len() >= LIMIT || inner.names.len() >= LIMIT {
            inner.dirs.clear();
            inner.names.clear();
            inner.cleared = Some(Instant::now());
        }
    }

    /// Remember that this mount changed `dir` just now without knowing its attributes:
    /// replies to requests sent before are not taken in.
    fn tombstone(inner: &mut Inner, dir: u64) {
        Self::make_room(inner);
        let now = Instant::now();
        inner.dirs.insert(dir, Entry { fetched: now, changed: now, attr: None });
    }

    /// This mount changed the entries of directory `dir` (a name added or removed) and,
    /// by `nlink`, its link count (a subdirectory made: +1, removed: -1).
    pub(crate) fn changed(&self, dir: u64, nlink: i32) {
        if self.ttl.is_zero() {
            return;
        }
        let mut inner = self.inner.lock();
        let Some(e) = inner.dirs.get_mut(&dir) else { return Self::tombstone(&mut inner, dir) };
        e.changed = Instant::now();
        let Some(a) = e.attr.as_mut() else { return };
        let now = now_stamp();
        a.mtime = later(a.mtime, now);
        a.ctime = later(a.ctime, now);
        a.nlink = match nlink {
            // A directory split over servers reports 1 ("unknown", as POSIX allows), and
            // its servers keep it so whatever is made or removed in it.
            _ if a.nlink == 1 => 1,
            // The servers keep a directory's count at 2 or more.
            n if n < 0 => a.nlink.saturating_sub(n.unsigned_abs()).max(2),
            n => a.nlink.saturating_add(n as u32),
        };
    }

    /// The subdirectory `parent/name` was removed through this mount.
    pub(crate) fn removed(&self, parent: u64, name: &str) {
        let mut inner = self.inner.lock();
        if let Some(ino) = inner.names.remove(&(parent, name.to_string())) {
            Self::tombstone(&mut inner, ino);
        }
    }

    /// Forget directory `ino` (its attributes changed in a way not followed here).
    pub(crate) fn forget(&self, ino: u64) {
        if self.ttl.is_zero() {
            return;
        }
        // A tombstone: a reply already on its way must not bring the old attributes back.
        Self::tombstone(&mut self.inner.lock(), ino);
    }

    /// Forget everything (after a rename).
    pub(crate) fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.dirs.clear();
        inner.names.clear();
        inner.cleared = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_client::Ino;

    fn dir(ino: u64, nlink: u32) -> Attr {
        Attr {
            ino: Ino(ino),
            kind: FileKind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink,
            atime: Timestamp::default(),
            mtime: Timestamp { secs: 5, nsecs: 0 },
            ctime: Timestamp { secs: 5, nsecs: 0 },
            blocks_bytes: 0,
            layout: None,
            dir_default: None,
            parent: None,
            read_mostly: false,
        }
    }

    #[test]
    fn changes_made_here_are_applied() {
        let c = DirCache::new(Duration::from_secs(60));
        c.fetched(&dir(7, 2), Instant::now(), Some((1, "d")));
        let (a, left) = c.get(7).unwrap();
        assert_eq!(a.nlink, 2);
        assert!(left <= Duration::from_secs(60) && left > Duration::from_secs(59));
        c.changed(7, 1);
        let (a, _) = c.get(7).unwrap();
        assert_eq!(a.nlink, 3);
        assert!(a.mtime.secs > 5 && a.ctime.secs > 5, "times follow the change");
        c.changed(7, -1);
        c.changed(7, -1);
        assert_eq!(c.get(7).unwrap().0.nlink, 2, "never below 2");
        c.removed(1, "d");
        assert!(c.get(7).is_none());
    }

    #[test]
    fn a_split_directory_keeps_its_unknown_link_count() {
        let c = DirCache::new(Duration::from_secs(60));
        c.fetched(&dir(9, 1), Instant::now(), None);
        c.changed(9, 1);
        assert_eq!(c.get(9).unwrap().0.nlink, 1, "a subdirectory made in a split directory");
        c.changed(9, -1);
        assert_eq!(c.get(9).unwrap().0.nlink, 1, "and removed");
    }

    #[test]
    fn older_replies_do_not_undo_changes() {
        let c = DirCache::new(Duration::from_secs(60));
        let t0 = Instant::now();
        c.fetched(&dir(7, 2), t0, None);
        c.changed(7, 0);
        let touched = c.get(7).unwrap().0;
        // A getattr sent before the change answers with the old times: ignored.
        c.fetched(&dir(7, 2), t0, None);
        assert_eq!(c.get(7).unwrap().0.mtime, touched.mtime);
        // After forgetting, a reply sent before cannot bring the entry back.
        c.forget(7);
        c.fetched(&dir(7, 2), t0, None);
        assert!(c.get(7).is_none());
        c.fetched(&dir(7, 4), Instant::now(), None);
        assert_eq!(c.get(7).unwrap().0.nlink, 4);
        c.clear();
        assert!(c.get(7).is_none());
    }

    #[test]
    fn files_and_zero_lifetime_are_not_kept() {
        let c = DirCache::new(Duration::from_secs(60));
        let mut f = dir(8, 1);
        f.kind = FileKind::File;
        c.fetched(&f, Instant::now(), None);
        assert!(c.get(8).is_none());
        let off = DirCache::new(Duration::ZERO);
        off.fetched(&dir(7, 2), Instant::now(), None);
        assert!(off.get(7).is_none());
    }
}
