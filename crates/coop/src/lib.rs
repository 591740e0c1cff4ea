//! Cooperative reads of read-mostly trees across mounts (docs/loading.md, "Cooperative
//! reads"; Spindle's load servers, in the mounts themselves).
//!
//! The mounts of a job form a **coop group** (`group.rs`): every member knows the others'
//! addresses in the same order. For each object a mount would ask the servers for — an
//! inode's attributes, a directory's listing, a name on the path down to a read-mostly
//! tree, a 1 MiB piece of a file — one member is its
//! designated reader and asks the servers; every other member asks its parent in the
//! object's tree of members, which asks its own parent in turn. So the servers answer each
//! object about once per job, however many nodes start it.
//!
//! **What is kept, and for how long.** Attributes, listings and names are never kept: each
//! question goes up the tree, and the designated reader answers it as it is now (from its
//! leases, or from the servers), so an open that follows a change sees the change
//! (close-to-open) exactly as it would asking the servers itself; concurrent questions for
//! the same object share one answer (`flight.rs`), never an answer older than the
//! question. Pieces are kept by every member that passes them on, in a cache bounded in
//! bytes, under the file's version (size, mtime, ctime): a piece of one version is never
//! served for another, and the designated reader reads a piece only while the file is at
//! the version asked for.
//!
//! **Failures.** A member that cannot be reached or does not answer within the asker's
//! wait (2 s by default) is left alone for a while (`peer.rs`), and the question goes up
//! the object's tree over the members left (`Group::parent_among`), or to the servers when
//! that fails too: a member killed or hung in the middle of a job start delays the others
//! by at most one wait, and its objects are read once by another member.
//!
//! The mount supplies the servers' side ([`Source`]) and decides what goes through the
//! group (read-mostly inodes only).

pub mod flight;
pub mod group;
pub mod peer;
mod serve;
pub mod wire;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use group::Group;
use peer::{Me, Peer};
use shoal_auth::KeyRing;
use shoal_proto::msg::Attr;
use shoal_proto::{Errno, Ino};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use wire::{Answer, Ask, Key, Named, Version};

pub use wire::PIECE;

/// Why a question could not be answered: the errno the asker reports, and a reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub errno: Errno,
    pub why: String,
}

impl Failure {
    pub fn new(errno: Errno, why: impl Into<String>) -> Failure {
        Failure { errno, why: why.into() }
    }

    /// A failure that asking the servers would only repeat: the object is gone, or the file
    /// is no longer at the version asked for. Any other failure upstream sends the
    /// question to the servers.
    fn is_definite(&self) -> bool {
        self.errno == Errno::ENOENT || self.errno == Errno::ESTALE
    }
}

/// The servers' side, as the mount asks them (its client, its leases).
pub trait Source: Send + Sync + 'static {
    /// The attributes of `ino` now.
    fn attr(&self, ino: Ino) -> BoxFuture<'_, Result<Attr, Failure>>;
    /// The entries of directory `dir` now, with their attributes.
    fn listing(&self, dir: Ino) -> BoxFuture<'_, Result<Vec<Named>, Failure>>;
    /// The attributes of `dir/name` now (ENOENT if there is no such name).
    fn entry(&self, dir: Ino, name: &str) -> BoxFuture<'_, Result<Attr, Failure>>;
    /// Bytes `index * PIECE ..` of `ino` (fewer at its end), if the file is at `version`;
    /// ESTALE if it is not.
    fn piece(&self, ino: Ino, version: Version, index: u64) -> BoxFuture<'_, Result<Bytes, Failure>>;
}

/// An answer, as kept and shared.
#[derive(Clone, Debug)]
pub enum Value {
    Attr(Attr),
    Listing(Arc<Vec<Named>>),
    Piece(Bytes),
}

type Got = Result<Value, Failure>;

/// What a member did, since it started.
#[derive(Default, Debug)]
pub struct Stats {
    /// Questions this member sent to its parents.
    pub asked_members: AtomicU64,
    /// Questions other members sent to this one.
    pub answered: AtomicU64,
    /// Questions this member asked the servers (as designated reader, or falling back).
    pub asked_servers: AtomicU64,
    /// Questions that went to the servers because a member failed or did not answer.
    pub fell_back: AtomicU64,
    /// Pieces answered from this member's cache.
    pub piece_hits: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatsNow {
    pub asked_members: u64,
    pub answered: u64,
    pub asked_servers: u64,
    pub fell_back: u64,
    pub piece_hits: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct CoopOptions {
    /// How long a question waits for the group before it goes to the servers.
    pub wait: Duration,
    /// Bytes of pieces kept for the other members.
    pub cache_bytes: u64,
}

impl Default for CoopOptions {
    fn default() -> Self {
        CoopOptions { wait: Duration::from_secs(2), cache_bytes: 256 << 20 }
    }
}

pub(crate) struct Inner {
    group: Group,
    me: Me,
    peers: Vec<Peer>,
    source: Arc<dyn Source>,
    wait: Duration,
    pieces: moka::future::Cache<Key, Bytes>,
    /// Until when some peer is shunned (`peer.rs`).
    any_shunned_until: Arc<parking_lot::Mutex<Option<std::time::Instant>>>,
    flights: flight::Flights<Key, Got>,
    stats: Stats,
}

/// This mount's member of its coop group: asks the group, and answers it.
pub struct Coop {
    inner: Arc<Inner>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Coop {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Coop {
    /// Join `group`: listen on this member's address and answer the others from then on.
    /// `keys`: the host key ring the members prove to each other (`None` without keys).
    pub async fn start(
        group: Group,
        keys: Option<KeyRing>,
        source: Arc<dyn Source>,
        opts: CoopOptions,
    ) -> std::io::Result<Coop> {
        let addr = group.addr(group.me());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr} for the coop group: {e}")))?;
        let me = Me { group: group.id(), rank: group.me() as u32, keys };
        let any_shunned_until = Arc::new(parking_lot::Mutex::new(None));
        let peers = (0..group.len()).map(|r| Peer::new(group.addr(r), any_shunned_until.clone())).collect();
        let pieces = moka::future::Cache::builder()
            .weigher(|_: &Key, b: &Bytes| b.len().try_into().unwrap_or(u32::MAX))
            .max_capacity(opts.cache_bytes)
            .build();
        let inner = Arc::new(Inner {
            group,
            me,
            peers,
            source,
            wait: opts.wait,
            pieces,
            any_shunned_until,
            flights: flight::Flights::default(),
            stats: Stats::default(),
        });
        let server = tokio::spawn(serve::accept_loop(listener, Arc::downgrade(&inner)));
        Ok(Coop { inner, server })
    }

    pub fn group(&self) -> &Group {
        &self.inner.group
    }

    /// The attributes of `ino` now (`dir`: the directory it was found in, if known; see
    /// [`Key`]).
    pub async fn attr(&self, ino: Ino, dir: Option<Ino>) -> Result<Attr, Failure> {
        match self.inner.get(Key::Attr { ino, dir }, self.inner.wait).await? {
            Value::Attr(a) => Ok(a),
            other => Err(mismatch(&other)),
        }
    }

    /// The entries of directory `dir` now, with their attributes.
    pub async fn listing(&self, dir: Ino) -> Result<Arc<Vec<Named>>, Failure> {
        match self.inner.get(Key::Listing { dir }, self.inner.wait).await? {
            Value::Listing(l) => Ok(l),
            other => Err(mismatch(&other)),
        }
    }

    /// The attributes of `dir/name` now (ENOENT if there is no such name), asked of the
    /// reader of `dir`.
    pub async fn entry(&self, dir: Ino, name: &str) -> Result<Attr, Failure> {
        match self.inner.get(Key::Entry { dir, name: name.to_string() }, self.inner.wait).await? {
            Value::Attr(a) => Ok(a),
            other => Err(mismatch(&other)),
        }
    }

    /// Bytes `index * PIECE ..` of `ino` at `version` (fewer at its end; ESTALE if the
    /// file is no longer at that version; `dir` as for [`Coop::attr`]).
    pub async fn piece(&self, ino: Ino, version: Version, index: u64, dir: Option<Ino>) -> Result<Bytes, Failure> {
        match self.inner.get(Key::Piece { ino, version, index, dir }, self.inner.wait).await? {
            Value::Piece(b) => Ok(b),
            other => Err(mismatch(&other)),
        }
    }

    pub fn stats(&self) -> StatsNow {
        let s = &self.inner.stats;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsNow {
            asked_members: n(&s.asked_members),
            answered: n(&s.answered),
            asked_servers: n(&s.asked_servers),
            fell_back: n(&s.fell_back),
            piece_hits: n(&s.piece_hits),
        }
    }
}

fn mismatch(v: &Value) -> Failure {
    Failure::new(Errno::EIO, format!("coop: an answer of the wrong kind ({v:?})"))
}

impl Inner {
    /// The answer to `key`, waiting at most `wait` for the group: from this member's
    /// pieces, from its parent in the key's tree, or from the servers (as the key's
    /// designated reader, or when the parent fails).
    pub(crate) async fn get(self: &Arc<Self>, key: Key, wait: Duration) -> Got {
        if matches!(key, Key::Piece { .. }) {
            if let Some(b) = self.pieces.get(&key).await {
                self.stats.piece_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Value::Piece(b));
            }
        }
        let me = self.clone();
        let k = key.clone();
        self.flights.join(key, move || async move { me.fetch(k, wait).await }.boxed()).await
    }

    async fn fetch(self: Arc<Self>, key: Key, wait: Duration) -> Got {
        let h = key.hash();
        let deadline = std::time::Instant::now() + wait;
        // Up the object's tree; a parent that fails is shunned and the question goes up the
        // tree over the members left, once: a member killed in the middle of a job start
        // costs the others one wait at most, and its objects are read by another member.
        let mut upstream = None;
        for _ in 0..2 {
            let Some(p) = self.parent(h) else { break };
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            upstream = self.ask_member(p, &key, left).await;
            if upstream.is_some() || !self.peers[p].shunned() {
                break;
            }
        }
        let got = match upstream {
            Some(got) => got,
            None => {
                self.stats.asked_servers.fetch_add(1, Ordering::Relaxed);
                self.ask_servers(&key).await
            }
        };
        if let (Key::Piece { .. }, Ok(Value::Piece(b))) = (&key, &got) {
            self.pieces.insert(key, b.clone()).await;
        }
        got
    }

    /// This member's parent in the tree of the object hashed to `h`: over all members, or
    /// over those not shunned while some are.
    fn parent(&self, h: u64) -> Option<usize> {
        if !Peer::any_shunned(&self.any_shunned_until) {
            return self.group.parent(h);
        }
        self.group.parent_among(h, |r| !self.peers[r].shunned())
    }

    /// Ask member `p`; `None` when the question must go to the servers instead.
    async fn ask_member(&self, p: usize, key: &Key, wait: Duration) -> Option<Got> {
        self.stats.asked_members.fetch_add(1, Ordering::Relaxed);
        // The parent gets less of the wait, so that this member can still turn to the
        // servers if the parent's own parent fails it.
        let ask = Ask { key: key.clone(), wait_ms: (wait.as_millis() * 3 / 4).min(u32::MAX as u128) as u32 };
        let answer = self.peers[p].ask(&self.me, &ask, wait).await;
        let got = match answer {
            Ok((Answer::Attr(a), _)) => Ok(Value::Attr(a)),
            Ok((Answer::Listing(l), _)) => Ok(Value::Listing(Arc::new(l))),
            Ok((Answer::Piece, data)) => Ok(Value::Piece(data)),
            Ok((Answer::Failed { errno, why }, _)) => Err(Failure::new(Errno(errno), why)),
            Err(_) => {
                self.stats.fell_back.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        match &got {
            Err(f) if !f.is_definite() => {
                self.stats.fell_back.fetch_add(1, Ordering::Relaxed);
                None
            }
            _ => Some(got),
        }
    }

    async fn ask_servers(&self, key: &Key) -> Got {
        match key {
            Key::Attr { ino, .. } => self.source.attr(*ino).await.map(Value::Attr),
            Key::Listing { dir } => self.source.listing(*dir).await.map(|l| Value::Listing(Arc::new(l))),
            Key::Entry { dir, name } => self.source.entry(*dir, name).await.map(Value::Attr),
            Key::Piece { ino, version, index, .. } => self.source.piece(*ino, *version, *index).await.map(Value::Piece),
        }
    }
}
