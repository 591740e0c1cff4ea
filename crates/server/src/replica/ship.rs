//! The shipper: one task per mirror of this server's slot, sending the replication log to
//! it in order (`Op::PeerReplicate`) and recording what it applied.
//!
//! One batch is in flight per mirror; while it travels, new changes gather, so the batch
//! size follows the load (a group commit over the network). A mirror that does not answer
//! keeps getting the same batch; once it has made no progress for
//! [`OUT_OF_SYNC_AFTER`](super::log::OUT_OF_SYNC_AFTER) while changes wait, or says it is
//! not in sync (it missed changes), it is dropped from the set replies wait for.

use super::log::{MirrorState, ReplLog, OUT_OF_SYNC_AFTER};
use crate::state::State;
use bytes::{Bytes, BytesMut};
use shoal_proto::msg::{Cred, Op, Reply};
use shoal_proto::ServerId;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause between attempts to reach a mirror that did not answer.
const RETRY: Duration = Duration::from_millis(100);

/// Ship `log` to `mirror` until the mirror falls out of sync (or the server stops).
pub async fn ship_loop(st: Arc<State>, log: Arc<ReplLog>, mirror: ServerId) {
    let mut applied = 0u64;
    let mut stalled_since: Option<Instant> = None;
    loop {
        if log.mirrors().get(&mirror).is_none_or(|p| p.state != MirrorState::InSync) {
            return;
        }
        if stalled_since.is_none() && log.last() <= applied {
            log.appended_after(applied).await;
        }
        let (first, changes, data) = log.take(applied);
        if changes.is_empty() {
            // Trimmed past what this mirror applied: it can no longer follow.
            go_on_without(&st, &log, mirror).await;
            return;
        }
        let payload = concat(&data);
        let op = Op::PeerReplicate { slot: st.id, incarnation: log.incarnation, first, changes };
        // Bounded by the out-of-sync delay, not the peer timeout: a frozen mirror must not
        // stall the slot longer than a dead one.
        let answer = tokio::time::timeout(OUT_OF_SYNC_AFTER, st.pool.request(mirror, &Cred::root(), op, payload)).await;
        match answer.unwrap_or_else(|_| {
            Err(shoal_rpc::CallError::Transport { errno: shoal_proto::Errno::ETIMEDOUT, reason: "no answer".into() })
        }) {
            Ok((Reply::Replicated { applied: a, in_sync: true, incarnation }, _)) if incarnation == log.incarnation => {
                applied = applied.max(a);
                log.ack(mirror, applied);
                stalled_since = None;
                continue;
            }
            Ok((Reply::Replicated { incarnation, applied: a, .. }, _)) => {
                tracing::warn!(
                    "mirror {mirror} of server {} is not in sync (it holds position {a} of incarnation {incarnation:x}, \
                     this primary is {:x}): going on without it until it is resynchronised",
                    st.id,
                    log.incarnation
                );
                go_on_without(&st, &log, mirror).await;
                return;
            }
            Ok((other, _)) => tracing::warn!("mirror {mirror} answered PeerReplicate with {other:?}"),
            Err(e) => tracing::debug!("mirror {mirror}: {e}"),
        }
        if !log.has_waiters() {
            // Nobody waits (a mirror still starting, say): keep trying without giving up.
            stalled_since = None;
            tokio::time::sleep(RETRY).await;
            continue;
        }
        let since = *stalled_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= OUT_OF_SYNC_AFTER {
            tracing::warn!(
                "mirror {mirror} of server {} applied nothing for {:?}: going on without it until it is resynchronised",
                st.id,
                since.elapsed()
            );
            go_on_without(&st, &log, mirror).await;
            return;
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Stop waiting for `mirror`, once the map group has recorded it as behind (so that it is
/// never promoted over changes it lacks: `failover.rs`). Until then replies keep waiting.
async fn go_on_without(st: &Arc<State>, log: &ReplLog, mirror: ServerId) {
    if crate::failover::consent_to_go_on_without(st, mirror).await {
        log.mark_out_of_sync(mirror);
    }
}

/// The changes' bytes one after the other (one copy; a single piece goes as it is).
fn concat(parts: &[Bytes]) -> Bytes {
    let non_empty: Vec<&Bytes> = parts.iter().filter(|p| !p.is_empty()).collect();
    match non_empty.as_slice() {
        [] => Bytes::new(),
        [one] => (*one).clone(),
        many => {
            let mut b = BytesMut::with_capacity(many.iter().map(|p| p.len()).sum());
            for p in many {
                b.extend_from_slice(p);
            }
            b.freeze()
        }
    }
}
