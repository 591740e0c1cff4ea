//! Open files shared within the process: one client handle ([`File`]) per file and access
//! mode, used by every descriptor of the file that needs no more rights than it has, as the
//! FUSE mount shares one handle among the descriptors of a file. So descriptors of one
//! file in one process see each other's writes at once (the handle reads its own writes
//! in flight) and agree on the size, as they would on the mount.
//!
//! A handle has the rights it was opened with (checked by the servers at open). A file
//! opened for reading and later for writing gets a second handle; the two are marked
//! `shared`, and a reader that reaches the end of what its handle knows, or asks for the
//! attributes, first flushes its siblings and refreshes (one request): the same view as
//! one handle, paid only by files opened with two access modes at once.
//!
//! A node lives as long as a descriptor uses it. Its last user's `close(2)` flushes it
//! (waits for its writes, reports their errors, publishes the size: after `close`
//! returns, every other client that opens the file sees the data); the rest of the close
//! — fsync on every server when the handle wrote, the release of a file removed while
//! open — runs in the background, as the mount's `sync_close` does, and the process waits
//! for it before it exits or execs ([`wait_background`]).

use crate::cluster::Cluster;
use crate::guard::Res;
use parking_lot::Mutex;
use shoal_client::{Attr, File, Ino};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// One client handle on a file.
pub struct Node {
    pub cluster: Arc<Cluster>,
    mount: usize,
    pub ino: Ino,
    /// The handle; taken only by `Drop`.
    file: Option<File>,
    pub readable: bool,
    pub writable: bool,
    /// Wrote since its attributes were last fetched (they may be stale: mtime, size on
    /// the servers).
    pub dirty: AtomicBool,
    /// When its attributes were last fetched, in ns since [`epoch`].
    fetched: AtomicU64,
    /// Another node of the same file exists in this process (see the module doc).
    pub shared: AtomicBool,
    /// Wrote since its last flush (a close with nothing to flush costs nothing).
    unflushed: AtomicBool,
    /// Ever wrote (its close must fsync: done in the background).
    ever_wrote: AtomicBool,
}

type Key = (usize, u64);

/// Every node alive, by mount and inode.
static NODES: Mutex<Option<HashMap<Key, Vec<Weak<Node>>>>> = Mutex::new(None);
/// Nodes alive (so that lookups by inode cost nothing while no file is open).
static OPEN: AtomicUsize = AtomicUsize::new(0);
/// Closes running in the background.
static BACKGROUND: AtomicUsize = AtomicUsize::new(0);

fn epoch() -> Instant {
    static E: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

impl Node {
    pub fn file(&self) -> &File {
        self.file.as_ref().expect("taken only by drop")
    }

    /// The node's attributes if fetched less than `ttl` ago and not written since; else
    /// fresh ones (waiting for its writes, publishing the size: one request).
    pub fn attr(&self, ttl: Duration) -> Res<Attr> {
        if self.shared.load(Ordering::Relaxed) {
            self.sync_siblings();
        }
        let age = now_ns().saturating_sub(self.fetched.load(Ordering::Relaxed));
        if !self.dirty.load(Ordering::Relaxed) && age < ttl.as_nanos() as u64 {
            return Ok(self.file().attr());
        }
        self.refresh()
    }

    /// The size as the handle knows it (its own writes included), refreshed from the
    /// servers if last fetched `ttl` or more ago (what `lseek(SEEK_END)` sees on the mount).
    pub fn size(&self, ttl: Duration) -> Res<u64> {
        if self.shared.load(Ordering::Relaxed) {
            self.sync_siblings();
        }
        let age = now_ns().saturating_sub(self.fetched.load(Ordering::Relaxed));
        if age < ttl.as_nanos() as u64 {
            return Ok(self.file().attr().size);
        }
        Ok(self.refresh()?.size)
    }

    /// Fresh attributes from the servers (after the handle's writes).
    pub fn refresh(&self) -> Res<Attr> {
        self.dirty.store(false, Ordering::Relaxed);
        let a = self.cluster.block_on(self.file().stat())?;
        self.fetched.store(now_ns(), Ordering::Relaxed);
        Ok(a)
    }

    pub fn wrote(&self) {
        self.dirty.store(true, Ordering::Relaxed);
        self.unflushed.store(true, Ordering::Relaxed);
        self.ever_wrote.store(true, Ordering::Relaxed);
    }

    /// Wait for the handle's writes and publish the size (what `close(2)` of any of its
    /// descriptors does); nothing when it has not written since the last flush.
    pub fn flush(&self) -> Res<()> {
        if self.unflushed.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.cluster.block_on(self.file().flush()) {
                self.unflushed.store(true, Ordering::Relaxed);
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Flush the other nodes of this file that wrote, and refresh this one: called by a
    /// node marked `shared` before it trusts its size.
    pub fn sync_siblings(&self) {
        let others: Vec<Arc<Node>> = {
            let map = NODES.lock();
            map.as_ref()
                .and_then(|m| m.get(&(self.mount, self.ino.0)))
                .map(|v| v.iter().filter_map(Weak::upgrade).collect())
                .unwrap_or_default()
        };
        let mut changed = false;
        for o in &others {
            if !std::ptr::eq(Arc::as_ptr(o), self) && o.dirty.load(Ordering::Relaxed) {
                let _ = o.cluster.block_on(o.file().flush());
                changed = true;
            }
        }
        drop(others); // outside the lock: a node's drop takes it
        if changed {
            let _ = self.refresh();
        }
    }
}

/// Make the node of a file just opened (`file`, with rights `readable`/`writable`), or
/// share the one this process has with at least those rights. A shared node is refreshed
/// if the attributes the open fetched differ from what it knows (close-to-open).
pub fn share(cluster: &Arc<Cluster>, mount: usize, file: File, readable: bool, writable: bool) -> Res<Arc<Node>> {
    let ino = file.ino();
    let key = (mount, ino.0);
    // Nodes are only ever dropped outside the lock (a node's drop takes it): every strong
    // reference made under it is kept in `alive` until the lock is released.
    let alive: Vec<Arc<Node>> = {
        let mut map = NODES.lock();
        let list = map.get_or_insert_with(HashMap::new).entry(key).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    };
    if let Some(n) = alive.iter().find(|n| (n.readable || !readable) && (n.writable || !writable)) {
        let fresh = file.attr();
        let known = n.file().attr();
        if known.size != fresh.size || known.mtime != fresh.mtime {
            n.refresh()?;
        }
        return Ok(n.clone());
    }
    let node = Arc::new(Node {
        cluster: cluster.clone(),
        mount,
        ino,
        file: Some(file),
        readable,
        writable,
        dirty: AtomicBool::new(false),
        fetched: AtomicU64::new(now_ns()),
        shared: AtomicBool::new(!alive.is_empty()),
        unflushed: AtomicBool::new(false),
        ever_wrote: AtomicBool::new(false),
    });
    for other in &alive {
        other.shared.store(true, Ordering::Relaxed);
    }
    NODES.lock().get_or_insert_with(HashMap::new).entry(key).or_default().push(Arc::downgrade(&node));
    OPEN.fetch_add(1, Ordering::Relaxed);
    drop(alive);
    Ok(node)
}

impl Drop for Node {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
        {
            let mut map = NODES.lock();
            if let Some(m) = map.as_mut() {
                if let Some(list) = m.get_mut(&(self.mount, self.ino.0)) {
                    list.retain(|w| w.strong_count() > 0);
                    if list.is_empty() {
                        m.remove(&(self.mount, self.ino.0));
                    }
                }
            }
        }
        let Some(file) = self.file.take() else { return };
        if !self.ever_wrote.load(Ordering::Relaxed) {
            // Nothing to sync: the close costs no request (but a file removed while open is
            // released), so it is done here rather than handed to the runtime.
            if let Err(e) = self.cluster.block_on(file.close()) {
                crate::debug::say(&format!("closing {}: {e}", e.context));
            }
            return;
        }
        BACKGROUND.fetch_add(1, Ordering::AcqRel);
        self.cluster.spawn(async move {
            if let Err(e) = file.close().await {
                crate::debug::say(&format!("closing {}: {e}", e.context));
            }
            BACKGROUND.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// The node of `ino` on mount `mount` this process has open, if any (the one with the
/// most rights: the last made). No lock taken while no file is open.
pub fn find(mount: usize, ino: Ino) -> Option<Arc<Node>> {
    if OPEN.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let map = NODES.lock();
    let found = map.as_ref()?.get(&(mount, ino.0))?.iter().rev().find_map(Weak::upgrade);
    drop(map);
    found
}

/// Flush every open node (at exit and before exec: what was written reaches the servers).
pub fn flush_all() {
    let nodes: Vec<Arc<Node>> = {
        let map = NODES.lock();
        map.as_ref().map(|m| m.values().flatten().filter_map(Weak::upgrade).collect()).unwrap_or_default()
    };
    for n in &nodes {
        if let Err(e) = n.flush() {
            crate::debug::say(&format!("flushing {}: {e:?}", n.ino));
        }
    }
}

/// Wait (at most `limit`) for the background closes to finish.
pub fn wait_background(limit: Duration) {
    let start = Instant::now();
    while BACKGROUND.load(Ordering::Acquire) > 0 && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// In a child after fork: the nodes belong to the parent's client; forget them all.
pub fn forget_after_fork() {
    if NODES.is_locked() {
        // SAFETY: the thread that held it does not exist in this process.
        unsafe { NODES.force_unlock() };
    }
    std::mem::forget(NODES.lock().take());
    OPEN.store(0, Ordering::Relaxed);
    BACKGROUND.store(0, Ordering::Release);
}
