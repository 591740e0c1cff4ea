//! The reply cache: a request retried after a lost connection is applied once.
//!
//! A client names every request by (its session, the request id), the same on every
//! connection (`shoal_rpc` draws request ids from one counter per process and reuses a
//! request's id when it resends it on a new connection). For operations that change
//! something ([`changes_state`]), the first reply is kept under that name; a duplicate
//! gets it instead of being applied again, and a duplicate arriving while the first is
//! still being applied waits for it. Connections of servers
//! (session 0) and tools that send no session are not cached: their steps have op ids of
//! their own (`Peer*`), and a session-less sender cannot retry across connections anyway.
//!
//! Bounds: at most [`CAPACITY_BYTES`] of replies by an estimate of their size, each kept at
//! most [`LIFETIME`]; the oldest go first (a retry comes within one call's timeout, 30 s by
//! default, so the newest are the ones worth keeping). The cache is in memory: a request
//! retried across a server restart may be applied again (an exclusive create then answers
//! EEXIST).
//!
//! **Why not `moka`.** This was a `moka::future::Cache` (`try_get_with`). Every create,
//! unlink and write goes through here, and on md-easy creates moka's concurrent table, its
//! access-order bookkeeping, its crossbeam-epoch reclamation and the SipHash of the key cost
//! 7 % of a server's CPU (`perf`, 200,000 creates: ~790 of 10,964 samples) for what is an
//! insert-once, read-almost-never map. Here: 16 shards of a plain map under a mutex, keys
//! hashed by one multiply, and a FIFO per shard for eviction (replies are written once and
//! read only by a retry, so insertion order is the access order that matters).

use crate::dispatch::Payload;
use parking_lot::Mutex;
use shoal_proto::msg::{BatchOp, Op, Reply};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Estimated bytes of cached replies kept at most.
pub const CAPACITY_BYTES: u64 = 64 << 20;
/// How long a reply is kept at most.
pub const LIFETIME: Duration = Duration::from_secs(600);
/// Shards (a power of two): requests of different connections rarely wait for each other.
const SHARDS: usize = 16;

/// (client session, request id).
type Key = (u64, u64);

/// Hashes a [`Key`]: the session is random and the request ids count up, so one multiply
/// of their mix spreads them well (SipHash cost more than the map itself, see above).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ *b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(29) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

enum Slot {
    /// The first request with this key is being applied; a duplicate waits on the notify
    /// (made by the first duplicate: most requests never have one).
    Applying(Option<Arc<Notify>>),
    /// Its reply (boxed: the map's slots stay small), and when it was kept.
    Done(Box<Reply>, Instant),
}

#[derive(Default)]
struct Shard {
    slots: HashMap<Key, Slot, BuildHasherDefault<KeyHasher>>,
    /// Keys of `Done` slots, oldest first, with their sizes.
    order: VecDeque<(Key, u32)>,
    bytes: u64,
}

impl Shard {
    /// Drop the oldest replies while over `capacity` bytes or older than [`LIFETIME`].
    fn evict(&mut self, capacity: u64, now: Instant) {
        while let Some(&(key, weight)) = self.order.front() {
            let expired = matches!(self.slots.get(&key), Some(Slot::Done(_, at)) if now.duration_since(*at) > LIFETIME);
            if self.bytes <= capacity && !expired {
                break;
            }
            self.order.pop_front();
            self.bytes -= weight as u64;
            if matches!(self.slots.get(&key), Some(Slot::Done(..))) {
                self.slots.remove(&key);
            }
        }
    }
}

pub struct Replies {
    shards: Vec<Mutex<Shard>>,
    /// Hits: retries answered from the cache; misses: requests applied (`GET /metrics`).
    pub stats: crate::metrics::HitMiss,
}

/// Estimated memory of a cached reply: small for all but batches, whose results carry
/// attributes.
fn weight(reply: &Reply) -> u32 {
    match reply {
        Reply::Batch(results) => 64 + 256 * results.len() as u32,
        _ => 256,
    }
}

/// What a request found in the cache.
enum Found {
    Reply(Box<Reply>),
    Wait(Arc<Notify>),
    Apply,
}

/// Held by the request applying a key: if it is dropped before it stored a reply (its
/// connection closed, or the reply is not kept), the slot goes and duplicates waiting for
/// it try themselves.
struct Applying<'a> {
    replies: &'a Replies,
    key: Key,
    done: bool,
}

impl Drop for Applying<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut shard = self.replies.shard(self.key).lock();
            // A reply kept meanwhile (`keep`) stays: it is the request's outcome.
            if !matches!(shard.slots.get(&self.key), Some(Slot::Applying(_))) {
                return;
            }
            if let Some(Slot::Applying(notify)) = shard.slots.remove(&self.key) {
                drop(shard);
                if let Some(n) = notify {
                    n.notify_waiters();
                }
            }
        }
    }
}

impl Default for Replies {
    fn default() -> Self {
        Self::new()
    }
}

impl Replies {
    pub fn new() -> Replies {
        Replies { shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(), stats: Default::default() }
    }

    fn shard(&self, key: Key) -> &Mutex<Shard> {
        let mut h = KeyHasher::default();
        h.write_u64(key.0);
        h.write_u64(key.1);
        &self.shards[(h.finish() >> 7) as usize % SHARDS]
    }

    /// Apply `op`'s handler `apply` once per (session, request id): the first call runs it,
    /// later ones (and concurrent ones, which wait) get its reply. Not cached: a stale-map
    /// answer (nothing was applied; the client resends under a new id anyway).
    pub async fn once<F>(&self, session: u64, request_id: u64, apply: F) -> (Reply, Payload)
    where
        F: Future<Output = (Reply, Payload)>,
    {
        let key = (session, request_id);
        loop {
            let found = {
                let mut shard = self.shard(key).lock();
                match shard.slots.get_mut(&key) {
                    Some(Slot::Done(reply, at)) if at.elapsed() <= LIFETIME => Found::Reply(reply.clone()),
                    Some(Slot::Applying(notify)) => Found::Wait(notify.get_or_insert_with(Default::default).clone()),
                    _ => {
                        shard.slots.insert(key, Slot::Applying(None));
                        Found::Apply
                    }
                }
            };
            match found {
                Found::Reply(reply) => {
                    self.stats.hit();
                    return (*reply, Payload::none());
                }
                Found::Wait(notify) => {
                    let woken = notify.notified();
                    tokio::pin!(woken);
                    // Registered before the slot is looked at again: a wake-up between the
                    // two is not lost.
                    woken.as_mut().enable();
                    if matches!(self.shard(key).lock().slots.get(&key), Some(Slot::Applying(_))) {
                        woken.await;
                    }
                }
                Found::Apply => {
                    self.stats.miss();
                    let mut guard = Applying { replies: self, key, done: false };
                    let (reply, payload) = apply.await;
                    // Recovery finished this very request meanwhile (it waited on the
                    // entry its intent pinned) and kept the reply it ended with: that is
                    // the request's outcome, whatever this late run found.
                    if let Some(Slot::Done(kept, _)) = self.shard(key).lock().slots.get(&key) {
                        guard.done = true;
                        return ((**kept).clone(), Payload::none());
                    }
                    if !matches!(reply, Reply::StaleMap { .. }) {
                        guard.done = true;
                        let w = weight(&reply);
                        let now = Instant::now();
                        let mut shard = self.shard(key).lock();
                        let notify = match shard.slots.insert(key, Slot::Done(Box::new(reply.clone()), now)) {
                            Some(Slot::Applying(n)) => n,
                            _ => None,
                        };
                        shard.order.push_back((key, w));
                        shard.bytes += w as u64;
                        shard.evict(CAPACITY_BYTES / SHARDS as u64, now);
                        drop(shard);
                        if let Some(n) = notify {
                            n.notify_waiters();
                        }
                    }
                    return (reply, payload);
                }
            }
        }
    }

    /// Keep `reply` as the answer to (session, request id): a mirror taking the primary's
    /// cached replies, so that a retry after a failover is answered, not applied again.
    pub fn keep(&self, session: u64, request_id: u64, reply: Reply) {
        let key = (session, request_id);
        let w = weight(&reply);
        let now = Instant::now();
        let mut shard = self.shard(key).lock();
        let waiting = match shard.slots.insert(key, Slot::Done(Box::new(reply), now)) {
            Some(Slot::Done(..)) => None,
            // A run of the same request in progress (it returns this reply when it ends, see
            // `once`), and the duplicates waiting for it, which are woken now.
            Some(Slot::Applying(n)) => {
                shard.order.push_back((key, w));
                shard.bytes += w as u64;
                n
            }
            None => {
                shard.order.push_back((key, w));
                shard.bytes += w as u64;
                None
            }
        };
        shard.evict(CAPACITY_BYTES / SHARDS as u64, now);
        drop(shard);
        if let Some(n) = waiting {
            n.notify_waiters();
        }
    }

    /// Every kept reply with its (session, request id), oldest first per shard: what a
    /// mirror being resynchronised must hold too (`replica::resync`).
    pub fn snapshot(&self) -> Vec<(u64, u64, Reply)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let shard = shard.lock();
            for (key, _) in &shard.order {
                if let Some(Slot::Done(reply, _)) = shard.slots.get(key) {
                    out.push((key.0, key.1, (**reply).clone()));
                }
            }
        }
        out
    }

    /// Drop the cached reply of (session, request id): its effect was lost (a failed metadata
    /// log write), so a retry must apply the request again.
    pub fn forget(&self, session: u64, request_id: u64) {
        if session != 0 {
            let key = (session, request_id);
            let mut shard = self.shard(key).lock();
            if matches!(shard.slots.get(&key), Some(Slot::Done(..))) {
                shard.slots.remove(&key);
            }
        }
    }

    /// Replies cached now (for tests and logs).
    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().slots.values().filter(|s| matches!(s, Slot::Done(..))).count() as u64).sum()
    }
}

/// Whether applying `op` twice could differ from applying it once: the operations whose
/// replies are cached. Exhaustive, so that a new operation must be classified.
pub fn changes_state(op: &Op) -> bool {
    match op {
        Op::Create { .. }
        | Op::Mkdir { .. }
        | Op::Symlink { .. }
        | Op::Link { .. }
        | Op::Unlink { .. }
        | Op::Rmdir { .. }
        | Op::Rename { .. }
        | Op::SetAttr { .. }
        | Op::SetDirLayout { .. }
        | Op::SetReadMostly { .. }
        | Op::ExtendSize { .. }
        | Op::SetXattr { .. }
        | Op::RemoveXattr { .. }
        | Op::Write { .. }
        | Op::WriteList { .. }
        | Op::Append { .. }
        | Op::ReleaseOrphan { .. }
        | Op::TupleWrite { .. }
        | Op::TupleRead { take: true, .. }
        | Op::ChangeAck { .. } => true,
        Op::Batch { ops } => ops.iter().any(|op| !matches!(op, BatchOp::Lookup { .. } | BatchOp::GetAttr { .. })),
        // Reads, and peer steps (sent by servers, idempotent by their op ids).
        Op::Hello { .. }
        | Op::Authenticate { .. }
        | Op::Lookup { .. }
        | Op::ReadDir { .. }
        | Op::Find { .. }
        | Op::TupleRead { take: false, .. }
        | Op::TupleWatch { .. }
        | Op::Changes { .. }
        | Op::Usage { .. }
        | Op::GetAttr { .. }
        | Op::ReadLink { .. }
        | Op::Access { .. }
        | Op::GetXattr { .. }
        | Op::ListXattr { .. }
        | Op::Read { .. }
        | Op::ReadList { .. }
        // Idempotent: a resent fetch stores the same bytes again.
        | Op::UrlProbe { .. }
        | Op::FetchInto { .. }
        | Op::Fsync { .. }
        | Op::Open { .. }
        | Op::StatFs
        | Op::Status
        | Op::PeerMkdirObject { .. }
        | Op::PeerRmdirObject { .. }
        | Op::PeerLinkDelta { .. }
        | Op::PeerRenameIn { .. }
        | Op::PeerSetParent { .. }
        | Op::PeerMoveLock { .. }
        | Op::PeerDeleteObjects { .. }
        | Op::PeerTruncateObject { .. }
        | Op::PeerSplitIn { .. }
        | Op::PeerAddPartition { .. }
        | Op::PeerPartitions { .. }
        | Op::PeerSealPartitions { .. }
        | Op::PeerPartitionAttr { .. }
        // Hearing the same load twice changes nothing.
        | Op::PeerLoad { .. }
        | Op::PeerReplicate { .. }
        // A resync's question reads; its changes are absolute (puts, deletes, bytes at an
        // offset, cuts) and its end sets a position: each the same twice.
        | Op::PeerResyncQuery { .. }
        | Op::PeerResyncApply { .. }
        | Op::PeerResyncDone { .. }
        // Raft tolerates repeated messages by design (terms and log indexes), and reading
        // the map changes nothing.
        | Op::PeerRaft { .. }
        | Op::GetMap { .. }
        // A repeated proposal finds the map moved on and is refused: no change twice.
        | Op::ProposeMap { .. }
        // Acknowledging a lease twice forgets it twice: the same.
        | Op::LeaseAck { .. }
        // Starting a scrub that runs already reports the running one: no harm in a repeat.
        | Op::ScrubStart
        | Op::ScrubStatus
        // A read of a copy, for a scrub repair.
        | Op::PeerScrubRead { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_duplicate_gets_the_first_reply_and_concurrent_ones_wait_for_it() {
        let replies = Arc::new(Replies::new());
        let runs = Arc::new(AtomicU32::new(0));
        let apply = |runs: Arc<AtomicU32>| async move {
            let n = runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            (Reply::Appended { offset: n as u64 }, Payload::none())
        };
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (replies, runs) = (replies.clone(), runs.clone());
                tokio::spawn(async move { replies.once(7, 1, apply(runs)).await.0 })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), Reply::Appended { offset: 0 });
        }
        assert_eq!(replies.once(7, 1, apply(runs.clone())).await.0, Reply::Appended { offset: 0 });
        assert_eq!(runs.load(Ordering::SeqCst), 1, "applied once");
        // Another request id, or another client, is another request.
        assert_eq!(replies.once(7, 2, apply(runs.clone())).await.0, Reply::Appended { offset: 1 });
        assert_eq!(replies.once(8, 1, apply(runs.clone())).await.0, Reply::Appended { offset: 2 });
        assert_eq!(replies.len(), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_duplicate_applies_itself_when_the_first_is_dropped_unfinished() {
        let replies = Arc::new(Replies::new());
        let first = {
            let replies = replies.clone();
            tokio::spawn(async move {
                replies
                    .once(7, 1, async {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        (Reply::Ok, Payload::none())
                    })
                    .await
                    .0
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = {
            let replies = replies.clone();
            tokio::spawn(async move {
                replies.once(7, 1, async { (Reply::Appended { offset: 9 }, Payload::none()) }).await.0
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "the duplicate waits for the first");
        first.abort();
        let r = tokio::time::timeout(Duration::from_secs(10), second).await.expect("woken").unwrap();
        assert_eq!(r, Reply::Appended { offset: 9 });
    }

    /// A retry that waits on its own intent's pin while recovery finishes that intent: the
    /// reply recovery keeps is the answer, not what the late run found (`ENOENT`), and a
    /// duplicate waiting behind the retry gets it too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reply_kept_while_the_request_runs_again_is_its_answer() {
        let replies = Arc::new(Replies::new());
        let late = |replies: Arc<Replies>| {
            tokio::spawn(async move {
                replies
                    .once(7, 1, async {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        (refused_reply(), Payload::none())
                    })
                    .await
                    .0
            })
        };
        let retry = late(replies.clone());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let duplicate = late(replies.clone());
        tokio::time::sleep(Duration::from_millis(20)).await;
        replies.keep(7, 1, Reply::Ok);
        assert_eq!(duplicate.await.unwrap(), Reply::Ok);
        assert_eq!(retry.await.unwrap(), Reply::Ok);
        assert_eq!(replies.once(7, 1, async { (refused_reply(), Payload::none()) }).await.0, Reply::Ok);
        assert_eq!(replies.len(), 1);
    }

    fn refused_reply() -> Reply {
        crate::dispatch::refuse(shoal_proto::Errno::ENOENT, "no entry")
    }

    #[test]
    fn the_oldest_replies_go_first_beyond_the_capacity() {
        let mut shard = Shard::default();
        let now = Instant::now();
        for id in 0..10u64 {
            shard.slots.insert((1, id), Slot::Done(Box::new(Reply::Ok), now));
            shard.order.push_back(((1, id), 256));
            shard.bytes += 256;
        }
        shard.evict(4 * 256, now);
        let mut kept: Vec<u64> = shard.slots.keys().map(|k| k.1).collect();
        kept.sort();
        assert_eq!(kept, vec![6, 7, 8, 9]);
        assert_eq!(shard.bytes, 4 * 256);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stale_map_answer_is_not_kept() {
        let replies = Replies::new();
        let r = replies.once(7, 1, async { (Reply::StaleMap { current: 3 }, Payload::none()) }).await.0;
        assert_eq!(r, Reply::StaleMap { current: 3 });
        let r = replies.once(7, 1, async { (Reply::Ok, Payload::none()) }).await.0;
        assert_eq!(r, Reply::Ok);
    }
}
