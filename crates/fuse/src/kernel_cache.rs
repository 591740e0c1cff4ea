//! How long the kernel may keep what the mount tells it, and taking it back when a lease
//! is revoked (docs/mount.md, "Kernel caching under leases").
//!
//! The kernel caches names (dentries, also negative ones) and attributes for the time
//! each reply gives it, and asks the mount nothing until then. The mount's client holds
//! leases (`shoal_client`'s directory and attribute leases): while one holds, no other
//! client's change of what it covers takes effect before the holder let go of it. So:
//!
//! * a name that a directory lease answers (found, or "no such name" after a complete
//!   listing) is given to the kernel for the rest of that lease, and remembered here;
//! * attributes under an attribute lease are given for the rest of that lease;
//! * anything else gets the mount's fixed timeouts (`entry_timeout`, `attr_timeout`,
//!   `negative_timeout`): the documented bound on how late another client's change is seen
//!   when servers grant no lease (a busy directory, a full lease table).
//!
//! The fixed timeout is also the floor: a lease with less left than it still gives the
//! fixed timeout, which the bound allows anyway.
//!
//! **Revocation.** The client calls [`KernelCache::revoked`] before it acknowledges a
//! revocation (`Client::on_revoke`); the names remembered under the revoked directories
//! and the revoked inodes' attributes and cached pages are dropped from the kernel
//! (FUSE_NOTIFY_INVAL_ENTRY, FUSE_NOTIFY_INVAL_INODE) by a thread of their own, and the
//! acknowledgement waits for it, so the change that revoked the lease is seen through this
//! mount as soon as it is seen anywhere. The kernel takes a directory's lock to drop one of
//! its names, and holds it (shared or exclusive) while it waits for this mount's answer to
//! a lookup, listing or change in that directory; such a request may itself wait at the
//! server for this very acknowledgement (a change waits for the revocations it started, a
//! read for those in progress). So the acknowledgement waits for the kernel only while no
//! request of this mount in a revoked directory is in flight ([`KernelCache::busy`]), and at
//! most [`INVAL_WAIT`]: then it goes at once, and the names go as soon as the kernel lets
//! go of the lock, when that request is answered. (A directory split revokes the leases on
//! the directory while this mount's creates in it go on: without this, each split stalled
//! the creating process for the whole wait.)
//!
//! Bounds: at most [`MAX_NAMES`] names remembered; past it, new names get the fixed
//! timeouts until revocations and expiry make room.

use parking_lot::Mutex;
use shoal_client::{Client, Ino, Revoked};
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Names given to the kernel under leases, remembered for invalidation.
pub(crate) const MAX_NAMES: usize = 1 << 20;
/// Longest wait for the kernel to drop what a revoked lease covered before acknowledging.
pub(crate) const INVAL_WAIT: Duration = Duration::from_millis(200);

#[derive(Default)]
struct Dir {
    names: HashSet<String>,
    /// The latest time any of them may stay in the kernel.
    until: Option<Instant>,
}

#[derive(Default)]
struct Names {
    dirs: HashMap<u64, Dir>,
    len: usize,
}

struct Job {
    entries: Vec<(u64, Vec<String>)>,
    inodes: Vec<u64>,
    done: tokio::sync::oneshot::Sender<()>,
}

pub(crate) struct KernelCache {
    entry_timeout: Duration,
    attr_timeout: Duration,
    negative_timeout: Duration,
    names: Mutex<Names>,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// Directory → requests of the kernel in it that this mount has not answered yet (the
    /// kernel holds the directory's lock for each).
    busy: Mutex<HashMap<u64, u32>>,
    /// Woken when a directory becomes busy.
    busy_now: tokio::sync::Notify,
}

/// A request of the kernel in directories whose lock it holds, from [`KernelCache::busy`];
/// done when dropped.
pub(crate) struct Busy {
    kc: Arc<KernelCache>,
    dirs: [u64; 2],
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut busy = self.kc.busy.lock();
        for d in self.dirs.iter().filter(|d| **d != 0) {
            if let Some(n) = busy.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    busy.remove(d);
                }
            }
        }
    }
}

impl KernelCache {
    pub(crate) fn new(entry_timeout: Duration, attr_timeout: Duration, negative_timeout: Duration) -> KernelCache {
        KernelCache {
            entry_timeout,
            attr_timeout,
            negative_timeout,
            names: Mutex::new(Names::default()),
            jobs: Mutex::new(None),
            busy: Mutex::new(HashMap::new()),
            busy_now: tokio::sync::Notify::new(),
        }
    }

    /// The kernel asks about (or changes) `dir`, and `other` unless 0 (a rename's second
    /// directory), holding their locks until the returned guard is dropped.
    pub(crate) fn busy(self: &Arc<Self>, dir: u64, other: u64) -> Busy {
        {
            let mut busy = self.busy.lock();
            for d in [dir, other].into_iter().filter(|d| *d != 0) {
                *busy.entry(d).or_default() += 1;
            }
        }
        self.busy_now.notify_waiters();
        Busy { kc: self.clone(), dirs: [dir, other] }
    }

    fn any_busy(&self, dirs: &[u64]) -> bool {
        let busy = self.busy.lock();
        dirs.iter().any(|d| busy.contains_key(d))
    }

    /// Until the kernel dropped what `job` covers (`done`), at most [`INVAL_WAIT`], and not
    /// while a request in one of `dirs` is in flight (see the module notes).
    async fn wait_for_kernel(&self, mut done: tokio::sync::oneshot::Receiver<()>, dirs: Vec<u64>) {
        let deadline = tokio::time::Instant::now() + INVAL_WAIT;
        loop {
            let busy_now = self.busy_now.notified();
            tokio::pin!(busy_now);
            busy_now.as_mut().enable();
            if self.any_busy(&dirs) {
                return;
            }
            tokio::select! {
                _ = &mut done => return,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = busy_now => {}
            }
        }
    }

    /// Start the thread that drops things from the kernel, and have `client` report its
    /// revocations here. `notifier` is set once the FUSE session exists.
    pub(crate) fn start(self: &Arc<Self>, client: &Client, notifier: Arc<OnceLock<fuser::Notifier>>) {
        let (tx, rx) = mpsc::channel::<Job>();
        *self.jobs.lock() = Some(tx);
        let spawned = std::thread::Builder::new().name("shoal-fuse-inval".into()).spawn(move || {
            for job in rx {
                if let Some(n) = notifier.get() {
                    for (dir, names) in &job.entries {
                        for name in names {
                            // ENOENT when the kernel no longer has it: nothing to drop.
                            let _ = n.inval_entry(fuser::INodeNo(*dir), std::ffi::OsStr::new(name));
                        }
                    }
                    for ino in &job.inodes {
                        // Offset 0, length 0: attributes and every cached page.
                        let _ = n.inval_inode(fuser::INodeNo(*ino), 0, 0);
                    }
                }
                let _ = job.done.send(());
            }
        });
        if let Err(err) = spawned {
            tracing::warn!("cannot start the kernel invalidation thread ({err}); names get the fixed timeouts");
            *self.jobs.lock() = None;
            return;
        }
        let me = Arc::downgrade(self);
        client.on_revoke(Arc::new(move |revoked: Revoked| {
            let kc = me.upgrade();
            let wait = kc.as_ref().and_then(|kc| kc.revoked(revoked));
            Box::pin(async move {
                if let (Some(kc), Some((rx, dirs))) = (kc, wait) {
                    kc.wait_for_kernel(rx, dirs).await;
                }
            })
        }));
    }

    /// Leases went: hand what the kernel may hold under them to the invalidation thread.
    /// Returns what to wait for and the directories whose names go (`None`: nothing to drop).
    fn revoked(&self, revoked: Revoked) -> Option<(tokio::sync::oneshot::Receiver<()>, Vec<u64>)> {
        let mut entries = Vec::new();
        {
            let mut n = self.names.lock();
            for d in revoked.dirs {
                if let Some(dir) = n.dirs.remove(&d.0) {
                    n.len -= dir.names.len();
                    entries.push((d.0, dir.names.into_iter().collect()));
                }
            }
        }
        let inodes: Vec<u64> = revoked.inodes.iter().map(|i| i.0).collect();
        if entries.is_empty() && inodes.is_empty() {
            return None;
        }
        let dirs = entries.iter().map(|(d, _)| *d).collect();
        let (done, rx) = tokio::sync::oneshot::channel();
        let jobs = self.jobs.lock();
        jobs.as_ref()?.send(Job { entries, inodes, done }).ok()?;
        Some((rx, dirs))
    }

    /// Remember that the kernel may keep `dir/name` until `until`; false when there is no
    /// room (the caller then gives the fixed timeout).
    fn remember(&self, dir: u64, name: &str, until: Instant) -> bool {
        if self.jobs.lock().is_none() {
            return false;
        }
        let mut n = self.names.lock();
        if n.len >= MAX_NAMES {
            let now = Instant::now();
            let before = n.dirs.len();
            n.dirs.retain(|_, d| d.until.is_some_and(|u| u > now));
            if n.dirs.len() != before {
                n.len = n.dirs.values().map(|d| d.names.len()).sum();
            }
            if n.len >= MAX_NAMES {
                return false;
            }
        }
        let d = n.dirs.entry(dir).or_default();
        d.until = Some(d.until.map_or(until, |u| u.max(until)));
        let added = d.names.insert(name.to_string());
        if added {
            n.len += 1;
        }
        true
    }

    /// How long the kernel may keep the entry `dir/name` (found, or with `negative`, not
    /// found): the rest of the directory lease answering it, else the fixed timeout.
    pub(crate) fn entry_ttl(&self, client: &Client, dir: u64, name: &str, negative: bool) -> Duration {
        let fixed = if negative { self.negative_timeout } else { self.entry_timeout };
        let now = Instant::now();
        match client.entry_lease_end(Ino(dir), name) {
            Some(end) if end > now && self.remember(dir, name, end.max(now + fixed)) => (end - now).max(fixed),
            _ => fixed,
        }
    }

    /// How long the kernel may keep the attributes of `ino`: the rest of their lease, else
    /// the fixed timeout.
    pub(crate) fn attr_ttl(&self, client: &Client, ino: u64) -> Duration {
        let now = Instant::now();
        match client.attr_lease_end(Ino(ino)) {
            Some(end) if self.jobs.lock().is_some() => end.saturating_duration_since(now).max(self.attr_timeout),
            _ => self.attr_timeout,
        }
    }
}
