//! Striped per-inode locks and pinned directory entries.
//!
//! **Stripes.** A check-then-write on a directory (does the name exist? then write the entry
//! and the parent's link count) must not interleave with another one on the same directory,
//! and an update of an inode record (read, modify, write back) must not lose a concurrent
//! update. Each inode number hashes to one of [`STRIPES`] async mutexes; a handler locks the
//! stripes of every inode it will read-modify-write (the directory, and a local child inode
//! whose link count or parent it changes). Several stripes are always taken in index order,
//! so two handlers can never wait for each other in a cycle. Stripe locks are never held
//! across a call to another server (a peer might be waiting for one of ours), except for
//! steps that take no lock at the peer: an append stores its pieces on other servers with
//! `Write`s (no lock there) while holding the inode's stripe (`ops::data::append`), and a
//! size cut sends `PeerTruncateObject`.
//!
//! **Pins.** Operations that span servers cannot hold a stripe lock during their remote
//! step, so they *pin* the directory entries they are about to change instead: other
//! mutations of a pinned `(dir, name)` wait until it is unpinned (up to
//! [`PIN_WAIT`], then EBUSY). A pin has an owner (the operation's op id) so that the owner
//! itself can lock through its own pins.
//!
//! **Reads wait for some pins too** (lookup, readdir: [`Locks::read_unpinned`]): those of
//! [`Pin::Reads`], which an operation takes when a name it changes locally becomes true or
//! false at a different moment than its effect elsewhere. A rename's source is one such name: a cross-server rename pins its source name from before the destination entry
//! appears (on the other server) until the source entry is gone, so a read of the source
//! name that waits for the unpin can never answer "present" after another client saw the
//! destination, nor "absent" before the destination exists. Every client therefore sees
//! exactly one of the two names at any time (docs/architecture.md, "Operations that span
//! servers"). An rmdir's name is another (its directory is gone on the other server before
//! the name goes). A mkdir's or a link's name, by contrast, appears only in the finishing
//! local batch, after the remote step: until then "absent" is the truth, so readers do not
//! wait for it ([`Pin::Writes`]), and a mkdir left unfinished by an unreachable server does
//! not hold up lookups and listings of its parent. With no pin anywhere this costs a reader
//! one atomic load.

use crate::error::{Fail, R};
use parking_lot::Mutex;
use shoal_placement::rendezvous::mix64;
use shoal_proto::{Errno, Ino};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{MutexGuard, Notify};

/// Number of lock stripes.
pub const STRIPES: usize = 1024;
/// How long a mutation waits for a pinned entry before failing with EBUSY.
pub const PIN_WAIT: Duration = Duration::from_secs(10);

/// What a pin holds up: other mutations of the name always, reads only for [`Pin::Reads`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pin {
    /// Mutations wait; lookups and listings answer from the store (the name's local state
    /// is the operation's truth until it finishes: a mkdir's or a link's new name).
    Writes,
    /// Mutations and reads wait (a rename's names, an rmdir's name).
    Reads,
}

struct Pinned {
    owner: u64,
    kind: Pin,
}

pub struct Locks {
    stripes: Box<[tokio::sync::Mutex<()>]>,
    pins: Mutex<HashMap<(Ino, String), Pinned>>,
    /// Number of pins held (readers skip the map while it is 0).
    pinned: AtomicUsize,
    unpinned: Notify,
}

/// Held stripe locks; dropping releases them.
pub struct Guard<'a> {
    _held: Vec<MutexGuard<'a, ()>>,
}

impl Default for Locks {
    fn default() -> Self {
        Locks::new()
    }
}

impl Locks {
    pub fn new() -> Locks {
        Locks {
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            pins: Mutex::new(HashMap::new()),
            pinned: AtomicUsize::new(0),
            unpinned: Notify::new(),
        }
    }

    pub fn stripe_of(ino: Ino) -> usize {
        (mix64(ino.0) % STRIPES as u64) as usize
    }

    /// Lock the stripes of all `inos` (duplicates and shared stripes are locked once), in
    /// stripe order.
    pub async fn lock(&self, inos: &[Ino]) -> Guard<'_> {
        let mut idx: Vec<usize> = inos.iter().map(|&i| Locks::stripe_of(i)).collect();
        idx.sort_unstable();
        idx.dedup();
        let mut held = Vec::with_capacity(idx.len());
        for i in idx {
            held.push(self.stripes[i].lock().await);
        }
        Guard { _held: held }
    }

    /// Is `ino`'s stripe among those of `held`?
    pub fn covers(held: &[Ino], ino: Ino) -> bool {
        let s = Locks::stripe_of(ino);
        held.iter().any(|&h| Locks::stripe_of(h) == s)
    }

    /// Take `ino`'s stripe if it is free, without waiting. Safe while holding other stripes
    /// out of order, because it never waits; callers fall back to [`Locks::lock`] with the
    /// full set when it fails. Usable from blocking code.
    pub fn try_lock(&self, ino: Ino) -> Option<MutexGuard<'_, ()>> {
        self.stripes[Locks::stripe_of(ino)].try_lock().ok()
    }

    /// Lock the stripes of `inos` once none of `names` is pinned by another operation than
    /// `owner` (0 = no owner). Waits at most [`PIN_WAIT`] in all, then EBUSY.
    pub async fn lock_names(&self, inos: &[Ino], names: &[(Ino, &str)], owner: u64) -> R<Guard<'_>> {
        self.lock_names_within(inos, names, owner, PIN_WAIT).await
    }

    /// [`Locks::lock_names`] waiting at most `wait` for pins. Steps that other servers wait
    /// for use a short wait: two servers each holding a pin while asking the other for the
    /// other's pinned name must not wait for each other (EBUSY makes one of them back off).
    pub async fn lock_names_within(
        &self,
        inos: &[Ino],
        names: &[(Ino, &str)],
        owner: u64,
        wait: Duration,
    ) -> R<Guard<'_>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Register interest before looking, so an unpin between the check and the wait
            // is not missed.
            let notified = self.unpinned.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let guard = self.lock(inos).await;
            let blocked = {
                let pins = self.pins.lock();
                names
                    .iter()
                    .find(|(d, n)| pins.get(&(*d, n.to_string())).is_some_and(|p| p.owner != owner || owner == 0))
                    .cloned()
            };
            let Some((dir, name)) = blocked else { return Ok(guard) };
            drop(guard);
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(Fail::new(
                    Errno::EBUSY,
                    format!("entry {name:?} in directory {dir} is being renamed or changed on another server"),
                ));
            }
        }
    }

    /// Pin `(dir, name)` for `owner`. Call with the directory's stripe locked, after checking
    /// through [`Locks::lock_names`] that it is free.
    pub fn pin(&self, dir: Ino, name: &str, owner: u64, kind: Pin) {
        let mut pins = self.pins.lock();
        pins.insert((dir, name.to_string()), Pinned { owner, kind });
        self.pinned.store(pins.len(), Ordering::SeqCst);
    }

    /// Remove `owner`'s pin of `(dir, name)` (no-op if someone else holds it or none exists).
    pub fn unpin(&self, dir: Ino, name: &str, owner: u64) {
        let removed = {
            let mut pins = self.pins.lock();
            let key = (dir, name.to_string());
            if pins.get(&key).is_some_and(|p| p.owner == owner) {
                pins.remove(&key);
                self.pinned.store(pins.len(), Ordering::SeqCst);
                true
            } else {
                false
            }
        };
        if removed {
            self.unpinned.notify_waiters();
        }
    }

    /// The names of directory `dir` pinned against reads now among those `wanted` accepts
    /// (none, without touching the map, while nothing is pinned anywhere).
    fn pinned_in(&self, dir: Ino, wanted: impl Fn(&str) -> bool) -> Vec<String> {
        if self.pinned.load(Ordering::SeqCst) == 0 {
            return Vec::new();
        }
        self.pins
            .lock()
            .iter()
            .filter(|((d, n), p)| *d == dir && p.kind == Pin::Reads && wanted(n))
            .map(|((_, n), _)| n.clone())
            .collect()
    }

    /// Run `read` (a lookup or listing of directory `dir`, answering the names it shows) so
    /// that none of the names it shows was pinned ([`Pin::Reads`]) at any moment during it: the names of
    /// `dir` pinned before and after the read are compared with the answer, and if one is
    /// shown the read waits for its unpin and runs again. A pin that came and went entirely
    /// within one read would go unnoticed, but a pin lasts at least a round trip to another
    /// server and a read is one local store access. Waits at most [`PIN_WAIT`], then EBUSY.
    /// `shown` tells the names an answer shows (asked only while something is pinned).
    pub async fn read_unpinned<T, F, Fut>(&self, dir: Ino, mut read: F, shown: impl Fn(&T) -> Vec<String>) -> R<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = R<T>>,
    {
        let deadline = tokio::time::Instant::now() + PIN_WAIT;
        loop {
            let before = self.pinned_in(dir, |_| true);
            let answer = read().await?;
            if before.is_empty() && self.pinned.load(Ordering::SeqCst) == 0 {
                return Ok(answer);
            }
            let shown = shown(&answer);
            let after = self.pinned_in(dir, |n| shown.iter().any(|s| s == n));
            let Some(busy) = shown.iter().find(|n| before.contains(n) || after.contains(n)) else {
                return Ok(answer);
            };
            // Wait for the unpin (registering before looking again, so it is not missed).
            let notified = self.unpinned.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.pinned_in(dir, |n| n == busy).is_empty() {
                continue;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(Fail::new(
                    Errno::EBUSY,
                    format!("entry {busy:?} in directory {dir} is being changed by an operation spanning servers"),
                ));
            }
        }
    }

    /// Every name of directory `dir` pinned now, whatever the kind of pin (a split does not
    /// start while one of the names it would move is in the middle of an operation).
    pub fn pinned_names(&self, dir: Ino) -> Vec<String> {
        if self.pinned.load(Ordering::SeqCst) == 0 {
            return Vec::new();
        }
        self.pins.lock().keys().filter(|(d, _)| *d == dir).map(|(_, n)| n.clone()).collect()
    }

    #[cfg(test)]
    pub fn is_pinned(&self, dir: Ino, name: &str) -> bool {
        self.pins.lock().contains_key(&(dir, name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn pinned_names_wait_for_unpin_and_owner_passes() {
        let locks = Arc::new(Locks::new());
        locks.pin(Ino(5), "a", 42, Pin::Writes);
        // The owner locks through its own pin.
        drop(locks.lock_names(&[Ino(5)], &[(Ino(5), "a")], 42).await.unwrap());
        // Another operation waits until the pin goes.
        let l2 = locks.clone();
        let waiter = tokio::spawn(async move { l2.lock_names(&[Ino(5)], &[(Ino(5), "a")], 7).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        locks.unpin(Ino(5), "a", 42);
        assert!(waiter.await.unwrap());
        assert!(!locks.is_pinned(Ino(5), "a"));
    }

    /// Reads wait only for `Pin::Reads` pins of the names they show.
    #[tokio::test]
    async fn reads_wait_only_for_read_pins() {
        let locks = Arc::new(Locks::new());
        let read = |l: Arc<Locks>, name: &'static str| async move {
            l.read_unpinned(Ino(5), || async { Ok::<_, Fail>(name) }, |n: &&str| vec![n.to_string()]).await.is_ok()
        };
        locks.pin(Ino(5), "made", 1, Pin::Writes);
        locks.pin(Ino(5), "moved", 2, Pin::Reads);
        assert!(read(locks.clone(), "made").await);
        assert!(read(locks.clone(), "other").await);
        let waiter = tokio::spawn(read(locks.clone(), "moved"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        locks.unpin(Ino(5), "moved", 2);
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn try_lock_fails_on_a_held_stripe() {
        let locks = Locks::new();
        let g = locks.lock(&[Ino(9)]).await;
        assert!(Locks::covers(&[Ino(1), Ino(9)], Ino(9)));
        assert!(locks.try_lock(Ino(9)).is_none());
        drop(g);
        assert!(locks.try_lock(Ino(9)).is_some());
    }

    #[tokio::test]
    async fn many_stripes_lock_in_order_without_deadlock() {
        let locks = Arc::new(Locks::new());
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let l = locks.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..200u64 {
                    let set = [Ino(i + t), Ino(1000 - i), Ino(i * 7 + t)];
                    let _g = l.lock(&set).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
}
