//! The client's cache of directory entries, attributes and symlink targets.
//!
//! A storm of identical lookups (every process of a job opening the same input, every
//! path walk passing through `/scratch`) must not reach the servers once each (Spindle,
//! FPFS). So the client keeps, each for [`ClientOptions::cache_ttl`](crate::ClientOptions):
//!
//! * **entries**: `(directory ino, name) → Some((ino, kind))`, or `None` for a name the
//!   server said does not exist (negative entry);
//! * **attributes**: `ino → Attr`;
//! * **symlink targets**: `ino → target`.
//!
//! Every mutation made through the client updates or drops what it affects; changes made
//! by other clients become visible when the entries expire (close-to-open consistency for
//! file sizes comes from [`Client::open`](crate::Client::open) asking the server afresh).
//!
//! The cache is shared by clients made with [`Client::with_cred`](crate::Client::with_cred).
//! Attributes are keyed by inode only and carry no permission decision (permission checks
//! that matter, access and open, always ask the server, or decide from the attributes as
//! the server would). Entries found by one identity are served to another while fresh:
//! like the kernel's dentry cache, a cached lookup does not re-check search permission on
//! the directory until it expires.
//!
//! Each map is bounded: when one passes its limit, expired items are dropped, and if that
//! is not enough, everything is.

use parking_lot::Mutex;
use shoal_proto::msg::{Attr, FileKind};
use shoal_proto::Ino;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Default bound on each map.
pub(crate) const DEFAULT_LIMIT: usize = 100_000;

/// What an entry lookup found in the cache: `None` = not cached (ask the server),
/// `Some(None)` = cached negative entry, `Some(Some(..))` = cached entry.
pub(crate) type EntryHit = Option<Option<(Ino, FileKind)>>;

/// What a reply said of one name, and between which moments the server decided it.
#[derive(Clone, Copy)]
struct Known {
    sent: Instant,
    answered: Instant,
    /// What the name names (`None`: nothing).
    val: Option<(Ino, FileKind)>,
}

/// Names of one directory.
type Names = HashMap<String, Known>;

struct Entries {
    dirs: HashMap<Ino, Names>,
    len: usize,
}

pub(crate) struct Cache {
    ttl: Duration,
    limit: usize,
    entries: Mutex<Entries>,
    attrs: Mutex<HashMap<Ino, (Instant, Attr)>>,
    links: Mutex<HashMap<Ino, (Instant, String)>>,
}

impl Cache {
    pub(crate) fn new(ttl: Duration) -> Cache {
        Cache::with_limit(ttl, DEFAULT_LIMIT)
    }

    pub(crate) fn with_limit(ttl: Duration, limit: usize) -> Cache {
        Cache {
            ttl,
            limit: limit.max(1),
            entries: Mutex::new(Entries { dirs: HashMap::new(), len: 0 }),
            attrs: Mutex::new(HashMap::new()),
            links: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        !self.ttl.is_zero()
    }

    fn fresh(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) < self.ttl
    }

    // ---- entries ----

    pub(crate) fn entry(&self, dir: Ino, name: &str, now: Instant) -> EntryHit {
        if !self.enabled() {
            return None;
        }
        let e = self.entries.lock();
        let k = e.dirs.get(&dir)?.get(name)?;
        self.fresh(k.sent, now).then_some(k.val)
    }

    /// Remember `dir/name` (`None`: does not exist), as a reply said it: `sent` is when its
    /// request was sent (or, for a change this client made, when the change was answered),
    /// and the reply is taken as answered now. See [`Cache::put_entry_between`].
    pub(crate) fn put_entry(&self, dir: Ino, name: &str, val: Option<(Ino, FileKind)>, sent: Instant) {
        self.put_entry_between(dir, name, val, sent, Instant::now().max(sent));
    }

    /// Remember `dir/name` as a reply said it, which the server decided at some moment
    /// between `sent` and `answered`. Against what is cached already:
    /// * an entry answered before `sent` is older: replaced;
    /// * one saying the same: kept, with the later times;
    /// * one sent after `answered` is newer: kept (a lookup that crossed this client's own
    ///   change of the name, sent before and answered after, must not bring the old state
    ///   back);
    /// * one whose window overlaps this one and says otherwise cannot be ordered against it
    ///   (two requests on different connections are not served in the order they were
    ///   sent: a lookup sent later can be answered "no such name" from before a mkdir that
    ///   an earlier one waited for): the name is forgotten, and the next lookup asks.
    pub(crate) fn put_entry_between(
        &self,
        dir: Ino,
        name: &str,
        val: Option<(Ino, FileKind)>,
        sent: Instant,
        answered: Instant,
    ) {
        if !self.enabled() {
            return;
        }
        let mut e = self.entries.lock();
        if e.len >= self.limit {
            let ttl = self.ttl;
            let mut len = 0;
            e.dirs.retain(|_, names| {
                names.retain(|_, k| sent.saturating_duration_since(k.sent) < ttl);
                len += names.len();
                !names.is_empty()
            });
            e.len = len;
            if e.len >= self.limit {
                e.dirs.clear();
                e.len = 0;
            }
        }
        let names = e.dirs.entry(dir).or_default();
        let known = Known { sent, answered, val };
        match names.get_mut(name) {
            Some(old) if old.answered <= sent => *old = known,
            Some(old) if old.val == val => {
                old.sent = old.sent.max(sent);
                old.answered = old.answered.max(answered);
            }
            Some(old) if answered <= old.sent => {}
            Some(_) => {
                names.remove(name);
                if names.is_empty() {
                    e.dirs.remove(&dir);
                }
                e.len -= 1;
            }
            None => {
                names.insert(name.to_string(), known);
                e.len += 1;
            }
        }
    }

    pub(crate) fn forget_entry(&self, dir: Ino, name: &str) {
        let mut e = self.entries.lock();
        let Some(names) = e.dirs.get_mut(&dir) else { return };
        let removed = names.remove(name).is_some();
        if names.is_empty() {
            e.dirs.remove(&dir);
        }
        if removed {
            e.len -= 1;
        }
    }

    /// Drop every entry of directory `dir` (it was removed, or found stale).
    pub(crate) fn forget_dir(&self, dir: Ino) {
        let mut e = self.entries.lock();
        if let Some(names) = e.dirs.remove(&dir) {
            e.len -= names.len();
        }
    }

    // ---- attributes ----

    pub(crate) fn attr(&self, ino: Ino, now: Instant) -> Option<Attr> {
        if !self.enabled() {
            return None;
        }
        let a = self.attrs.lock();
        let (at, attr) = a.get(&ino)?;
        self.fresh(*at, now).then(|| attr.clone())
    }

    pub(crate) fn put_attr(&self, attr: &Attr, now: Instant) {
        if !self.enabled() {
            return;
        }
        let mut a = self.attrs.lock();
        self.make_room(&mut a, now);
        a.insert(attr.ino, (now, attr.clone()));
    }

    pub(crate) fn forget_attr(&self, ino: Ino) {
        if !self.enabled() {
            return;
        }
        self.attrs.lock().remove(&ino);
    }

    // ---- symlink targets ----

    pub(crate) fn link(&self, ino: Ino, now: Instant) -> Option<String> {
        if !self.enabled() {
            return None;
        }
        let l = self.links.lock();
        let (at, target) = l.get(&ino)?;
        self.fresh(*at, now).then(|| target.clone())
    }

    pub(crate) fn put_link(&self, ino: Ino, target: &str, now: Instant) {
        if !self.enabled() {
            return;
        }
        let mut l = self.links.lock();
        self.make_room(&mut l, now);
        l.insert(ino, (now, target.to_string()));
    }

    /// Drop everything about inode `ino` (its attributes, its target, its entries).
    pub(crate) fn forget_ino(&self, ino: Ino) {
        if !self.enabled() {
            return;
        }
        self.forget_attr(ino);
        self.links.lock().remove(&ino);
        self.forget_dir(ino);
    }

    /// Drop everything.
    pub(crate) fn clear(&self) {
        let mut e = self.entries.lock();
        e.dirs.clear();
        e.len = 0;
        drop(e);
        self.attrs.lock().clear();
        self.links.lock().clear();
    }

    fn make_room<V>(&self, m: &mut HashMap<Ino, (Instant, V)>, now: Instant) {
        if m.len() >= self.limit {
            let ttl = self.ttl;
            m.retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            if m.len() >= self.limit {
                m.clear();
            }
        }
    }

    #[cfg(test)]
    fn sizes(&self) -> (usize, usize, usize) {
        (self.entries.lock().len, self.attrs.lock().len(), self.links.lock().len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::msg::Timestamp;

    fn attr(ino: u64, size: u64) -> Attr {
        Attr {
            ino: Ino(ino),
            kind: FileKind::File,
            perm: 0o644,
            uid: 1,
            gid: 1,
            size,
            nlink: 1,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            blocks_bytes: 0,
            layout: None,
            dir_default: None,
            parent: None,
            read_mostly: false,
        }
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn entries_expire_after_the_ttl() {
        let c = Cache::new(S);
        let t0 = Instant::now();
        assert_eq!(c.entry(Ino(1), "a", t0), None);
        c.put_entry(Ino(1), "a", Some((Ino(5), FileKind::Dir)), t0);
        assert_eq!(c.entry(Ino(1), "a", t0 + S / 2), Some(Some((Ino(5), FileKind::Dir))));
        assert_eq!(c.entry(Ino(1), "a", t0 + S), None);
        assert_eq!(c.entry(Ino(1), "b", t0), None);
        assert_eq!(c.entry(Ino(2), "a", t0), None);
    }

    #[test]
    fn negative_entries_are_remembered_and_replaced() {
        let c = Cache::new(S);
        let t0 = Instant::now();
        c.put_entry(Ino(1), "x", None, t0);
        assert_eq!(c.entry(Ino(1), "x", t0), Some(None));
        // The create that made it was answered after the lookup.
        let made = t0 + S / 4;
        c.put_entry(Ino(1), "x", Some((Ino(9), FileKind::File)), made);
        assert_eq!(c.entry(Ino(1), "x", made), Some(Some((Ino(9), FileKind::File))));
        assert_eq!(c.sizes().0, 1);
    }

    #[test]
    fn an_answer_older_than_what_is_known_does_not_replace_it() {
        let c = Cache::new(S);
        let sent = Instant::now();
        let made = sent + Duration::from_millis(5);
        // A mkdir answered at `made`; a lookup sent at `sent` (before) answered after it.
        c.put_entry(Ino(1), "d", Some((Ino(9), FileKind::Dir)), made);
        c.put_entry(Ino(1), "d", None, sent);
        assert_eq!(c.entry(Ino(1), "d", made), Some(Some((Ino(9), FileKind::Dir))));
        // A lookup sent later is newer.
        c.put_entry(Ino(1), "d", None, made + Duration::from_millis(1));
        assert_eq!(c.entry(Ino(1), "d", made), Some(None));
        assert_eq!(c.sizes().0, 1);
    }

    #[test]
    fn answers_that_cannot_be_ordered_forget_the_name() {
        let c = Cache::new(S);
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        // A lookup sent at t0+2 answered "no such name" at t0+4 (served before a mkdir
        // committed); one sent earlier, at t0+1, waited for the mkdir and answered at t0+5.
        c.put_entry_between(Ino(1), "d", None, t0 + 2 * ms, t0 + 4 * ms);
        c.put_entry_between(Ino(1), "d", Some((Ino(9), FileKind::Dir)), t0 + ms, t0 + 5 * ms);
        assert_eq!(c.entry(Ino(1), "d", t0 + 5 * ms), None, "neither answer is known to be the newer");
        assert_eq!(c.sizes().0, 0);
        // The next answer is taken; one saying the same keeps it.
        c.put_entry_between(Ino(1), "d", Some((Ino(9), FileKind::Dir)), t0 + 6 * ms, t0 + 7 * ms);
        c.put_entry_between(Ino(1), "d", Some((Ino(9), FileKind::Dir)), t0 + 5 * ms, t0 + 8 * ms);
        assert_eq!(c.entry(Ino(1), "d", t0 + 8 * ms), Some(Some((Ino(9), FileKind::Dir))));
        // An answer sent after the cached one was answered replaces it.
        c.put_entry_between(Ino(1), "d", None, t0 + 9 * ms, t0 + 10 * ms);
        assert_eq!(c.entry(Ino(1), "d", t0 + 10 * ms), Some(None));
        assert_eq!(c.sizes().0, 1);
    }

    #[test]
    fn invalidation() {
        let c = Cache::new(S);
        let t0 = Instant::now();
        c.put_entry(Ino(1), "a", Some((Ino(5), FileKind::Dir)), t0);
        c.put_entry(Ino(5), "b", Some((Ino(6), FileKind::File)), t0);
        c.put_entry(Ino(5), "c", None, t0);
        c.put_attr(&attr(6, 10), t0);
        c.put_link(Ino(7), "../x", t0);
        c.forget_entry(Ino(1), "a");
        assert_eq!(c.entry(Ino(1), "a", t0), None);
        assert_eq!(c.sizes().0, 2);
        c.forget_dir(Ino(5));
        assert_eq!(c.entry(Ino(5), "b", t0), None);
        assert_eq!(c.entry(Ino(5), "c", t0), None);
        assert_eq!(c.sizes().0, 0);
        assert_eq!(c.attr(Ino(6), t0).map(|a| a.size), Some(10));
        c.put_attr(&attr(6, 20), t0);
        assert_eq!(c.attr(Ino(6), t0).map(|a| a.size), Some(20));
        c.forget_attr(Ino(6));
        assert_eq!(c.attr(Ino(6), t0), None);
        assert_eq!(c.link(Ino(7), t0).as_deref(), Some("../x"));
        c.forget_ino(Ino(7));
        assert_eq!(c.link(Ino(7), t0), None);
        c.put_attr(&attr(8, 1), t0);
        c.clear();
        assert_eq!(c.sizes(), (0, 0, 0));
    }

    #[test]
    fn zero_ttl_caches_nothing() {
        let c = Cache::new(Duration::ZERO);
        let t0 = Instant::now();
        c.put_entry(Ino(1), "a", None, t0);
        c.put_attr(&attr(2, 1), t0);
        c.put_link(Ino(3), "t", t0);
        assert_eq!(c.entry(Ino(1), "a", t0), None);
        assert_eq!(c.attr(Ino(2), t0), None);
        assert_eq!(c.link(Ino(3), t0), None);
        assert_eq!(c.sizes(), (0, 0, 0));
    }

    #[test]
    fn size_is_bounded() {
        let c = Cache::with_limit(S, 10);
        let t0 = Instant::now();
        for i in 0..10 {
            c.put_entry(Ino(1), &format!("old{i}"), None, t0);
            c.put_attr(&attr(100 + i, 0), t0);
        }
        assert_eq!(c.sizes().0, 10);
        // Expired ones go first when the limit is reached.
        let t1 = t0 + 2 * S;
        c.put_entry(Ino(1), "new", None, t1);
        assert_eq!(c.sizes().0, 1);
        c.put_attr(&attr(1, 0), t1);
        assert_eq!(c.sizes().1, 1);
        // If all are fresh, everything goes.
        for i in 0..9 {
            c.put_entry(Ino(2), &format!("n{i}"), None, t1);
        }
        assert_eq!(c.sizes().0, 10);
        c.put_entry(Ino(3), "last", None, t1);
        assert_eq!(c.sizes().0, 1);
        assert_eq!(c.entry(Ino(3), "last", t1), Some(None));
    }
}
