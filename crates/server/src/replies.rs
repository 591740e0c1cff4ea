//! The reply cache: a request retried after a lost connection is applied once.
//!
//! A client names every request by (its session, the request id), the same on every
//! connection (`shoal_rpc` draws request ids from one counter per process and reuses a
//! request's id when it resends it on a new connection). For operations that change
//! something ([`changes_state`]), the first reply is kept under that name; a duplicate
//! gets it instead of being applied again, and a duplicate arriving while the first is
//! still being applied waits for it (moka coalesces the two). Connections of servers
//! (session 0) and tools that send no session are not cached: their steps have op ids of
//! their own (`Peer*`), and a session-less sender cannot retry across connections anyway.
//!
//! Bounds: at most [`CAPACITY_BYTES`] of replies by an estimate of their size (LRU, so the
//! newest survive, which is what a retry needs), each kept at most [`LIFETIME`]; far more
//! than a client's retry window (one call's timeout, 30 s by default). The cache is in
//! memory: a request retried across a server restart may be applied again (an exclusive
//! create then answers EEXIST).

use crate::dispatch::Payload;
use moka::future::Cache;
use moka::policy::EvictionPolicy;
use shoal_proto::msg::{BatchOp, Op, Reply};
use std::future::Future;
use std::time::Duration;

/// Estimated bytes of cached replies kept at most.
pub const CAPACITY_BYTES: u64 = 64 << 20;
/// How long a reply is kept at most.
pub const LIFETIME: Duration = Duration::from_secs(600);

/// (client session, request id).
type Key = (u64, u64);

pub struct Replies {
    cache: Cache<Key, Reply>,
}

/// Estimated memory of a cached reply: small for all but batches, whose results carry
/// attributes.
fn weight(_: &Key, reply: &Reply) -> u32 {
    match reply {
        Reply::Batch(results) => 64 + 256 * results.len() as u32,
        _ => 256,
    }
}

impl Replies {
    pub fn new() -> Replies {
        Replies {
            cache: Cache::builder()
                .max_capacity(CAPACITY_BYTES)
                .weigher(weight)
                .time_to_live(LIFETIME)
                .eviction_policy(EvictionPolicy::lru())
                .build(),
        }
    }

    /// Apply `op`'s handler `apply` once per (session, request id): the first call runs it,
    /// later ones (and concurrent ones, which wait) get its reply. Not cached: a stale-map
    /// answer (nothing was applied; the client resends under a new id anyway).
    pub async fn once<F>(&self, session: u64, request_id: u64, apply: F) -> (Reply, Payload)
    where
        F: Future<Output = (Reply, Payload)>,
    {
        let mut payload = None;
        let first = async {
            let (reply, p) = apply.await;
            payload = Some(p);
            match reply {
                Reply::StaleMap { .. } => Err(reply),
                reply => Ok(reply),
            }
        };
        let reply = match self.cache.try_get_with((session, request_id), first).await {
            Ok(reply) => reply,
            Err(uncached) => (*uncached).clone(),
        };
        (reply, payload.unwrap_or_else(Payload::none))
    }

    /// Drop the cached reply of (session, request id): its effect was lost (a failed metadata
    /// log write), so a retry must apply the request again.
    pub async fn forget(&self, session: u64, request_id: u64) {
        if session != 0 {
            self.cache.invalidate(&(session, request_id)).await;
        }
    }

    /// Replies cached now (for tests and logs; moka counts lazily).
    #[cfg(test)]
    pub async fn len(&self) -> u64 {
        self.cache.run_pending_tasks().await;
        self.cache.entry_count()
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
        | Op::ExtendSize { .. }
        | Op::SetXattr { .. }
        | Op::RemoveXattr { .. }
        | Op::Write { .. }
        | Op::Append { .. }
        | Op::ReleaseOrphan { .. } => true,
        Op::Batch { ops } => ops.iter().any(|op| !matches!(op, BatchOp::Lookup { .. } | BatchOp::GetAttr { .. })),
        // Reads, and peer steps (sent by servers, idempotent by their op ids).
        Op::Hello { .. }
        | Op::Authenticate { .. }
        | Op::Lookup { .. }
        | Op::ReadDir { .. }
        | Op::GetAttr { .. }
        | Op::ReadLink { .. }
        | Op::Access { .. }
        | Op::GetXattr { .. }
        | Op::ListXattr { .. }
        | Op::Read { .. }
        | Op::Fsync { .. }
        | Op::Open { .. }
        | Op::StatFs
        | Op::Status
        | Op::PeerMkdirObject { .. }
        | Op::PeerRmdirObject { .. }
        | Op::PeerLinkDelta { .. }
        | Op::PeerRenameIn { .. }
        | Op::PeerSetParent { .. }
        | Op::PeerDeleteObjects { .. }
        | Op::PeerTruncateObject { .. }
        // Acknowledging a lease twice forgets it twice: the same.
        | Op::LeaseAck { .. }
        // Starting a scrub that runs already reports the running one: no harm in a repeat.
        | Op::ScrubStart
        | Op::ScrubStatus => false,
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
        assert_eq!(replies.len().await, 3);
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
