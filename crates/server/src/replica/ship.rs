//! The shipper: one task per mirror of this server's slot, sending the replication log to
//! it in order (`Op::PeerReplicate`) and recording what it applied.
//!
//! One batch is in flight per mirror; while it travels, new changes gather, so the batch
//! size follows the load (a group commit over the network). A mirror that does not answer
//! keeps getting the same batch; once it has made no progress for
//! [`OUT_OF_SYNC_AFTER`](super::log::OUT_OF_SYNC_AFTER) while changes wait (sooner, after
//! `[membership] refused_down_after_ms`, when its host refuses the connection: it is dead,
//! not slow, and replies should not wait out the silence bound for it), or says it is
//! not in sync (it missed changes), it is dropped from the set replies wait for, and the
//! shipper resynchronises it (`resync.rs`, retried every [`RESYNC_RETRY`] while it fails)
//! and then ships it the log from where the resync started, until it is in sync again.

use super::log::{MirrorState, ReplLog, OUT_OF_SYNC_AFTER};
use crate::state::State;
use bytes::{Bytes, BytesMut};
use shoal_proto::msg::{Cred, Op, Reply};
use shoal_proto::ServerId;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause between attempts to reach a mirror that did not answer.
const RETRY: Duration = Duration::from_millis(100);

/// Pause before a resync, and between attempts while they fail (the mirror is down, say).
pub const RESYNC_RETRY: Duration = Duration::from_secs(1);

/// Ship `log` to `mirror` for as long as the server runs: follow it while it is in sync,
/// resync it when it falls out of sync, follow it again.
pub async fn ship_loop(st: Arc<State>, log: Arc<ReplLog>, mirror: ServerId) {
    let mut applied = match probe(&st, &log, mirror).await {
        Probe::Follows(applied) => applied,
        // Taken to hold what the log starts after (all of a clean stop's changes); if it
        // does not, its answer to the first batch says so and it is resynchronised.
        Probe::NoAnswer => log.base() - 1,
        Probe::Behind => resync(&st, &log, mirror).await,
    };
    loop {
        follow(&st, &log, mirror, applied).await;
        if st.stop.borrow().is_some() {
            // This server is stepping down (its slot failed over): nothing more to ship.
            return;
        }
        applied = resync(&st, &log, mirror).await;
    }
}

/// Ship `log` to the slot's own server standing by at its home (`rejoin.rs`), for a copy
/// serving the slot: resync it (its stores are as it left them), follow it, and hand the
/// slot back once it is in sync (`follow`); again after each time it falls out of sync.
pub async fn home_loop(st: Arc<State>, log: Arc<ReplLog>) {
    let home = st.id;
    while st.stop.borrow().is_none() {
        let applied = resync(&st, &log, home).await;
        follow(&st, &log, home, applied).await;
    }
}

/// What a mirror said at start about this incarnation.
enum Probe {
    /// It follows it, and has applied up to this position.
    Follows(u64),
    /// It holds another incarnation, or missed changes: it is out of sync.
    Behind,
    /// No answer (a mirror still starting): treated as in sync, waited for by the first
    /// replies, as before.
    NoAnswer,
}

/// Ask `mirror` at start whether it follows this incarnation (an empty batch at position 1:
/// a mirror that holds another incarnation says no), so that a restarted primary resyncs
/// its mirrors at once rather than at its first change, and one that continues its
/// incarnation after a clean stop learns how far each mirror got.
async fn probe(st: &Arc<State>, log: &ReplLog, mirror: ServerId) -> Probe {
    let op = Op::PeerReplicate { slot: st.id, incarnation: log.incarnation, first: 1, changes: Vec::new() };
    match tokio::time::timeout(
        OUT_OF_SYNC_AFTER,
        crate::rejoin::pool_to(st, mirror).request(mirror, &Cred::root(), op, Bytes::new()),
    )
    .await
    {
        Ok(Ok((Reply::Replicated { in_sync: false, incarnation, applied }, _))) => {
            tracing::info!(
                "mirror {mirror} of server {} holds position {applied} of incarnation {incarnation:x}, this primary \
                 is {:x}: resynchronising it",
                st.id,
                log.incarnation
            );
            // Replies stop waiting for it only once the group records it as behind.
            go_on_without(st, log, mirror).await;
            Probe::Behind
        }
        Ok(Ok((Reply::Replicated { in_sync: true, applied, .. }, _))) => Probe::Follows(applied),
        _ => Probe::NoAnswer,
    }
}

/// Resync `mirror` until it works; returns the position its stores hold (it is
/// `Resyncing`, to be shipped the log after it).
async fn resync(st: &Arc<State>, log: &ReplLog, mirror: ServerId) -> u64 {
    let mut last_failure: Option<(crate::error::Fail, bool)> = None;
    loop {
        tokio::time::sleep(RESYNC_RETRY).await;
        match super::resync::run(st, log, mirror).await {
            Ok(before) => return before,
            Err(e) => {
                log.mark_out_of_sync(mirror);
                // A mirror that is down fails every second: each failure is said once,
                // then quietly while it stays the same (any transport failure counts as
                // the same: the message names the connection attempt).
                let transport = crate::error::is_transport(e.errno);
                let same = last_failure.as_ref().is_some_and(|(f, t)| (*t && transport) || *f == e);
                if same {
                    tracing::debug!("resync of mirror {mirror}: {e}");
                } else {
                    tracing::warn!("resync of mirror {mirror} of server {} failed: {e}; retrying", st.id);
                }
                last_failure = Some((e, transport));
            }
        }
    }
}

/// Ship `log` to `mirror` from `applied` on, while it is in sync or catching up after a
/// resync; returns once it is out of sync.
async fn follow(st: &Arc<State>, log: &ReplLog, mirror: ServerId, mut applied: u64) {
    let mut stalled_since: Option<Instant> = None;
    // Since when every attempt found nothing listening at the mirror's address; counted only
    // once the mirror has answered here (one that has not may still be starting).
    let mut refused_since: Option<Instant> = None;
    let mut answered = false;
    // A mirror resynchronised while nothing changed is in sync at once.
    log.ack(mirror, applied);
    let mut promotable = false;
    loop {
        if !promotable && log.mirrors().get(&mirror).is_some_and(|p| p.state == MirrorState::InSync) {
            promotable = true;
            if mirror == st.id {
                // The slot's own server holds everything: hand the slot back to it.
                crate::rejoin::hand_back(st.clone());
            } else {
                // In sync again (replies wait for it): it may be promoted again.
                tokio::spawn(crate::failover::caught_up(st.clone(), mirror));
            }
        }
        let Some(state) = log.mirrors().get(&mirror).map(|p| p.state) else { return };
        if state == MirrorState::OutOfSync {
            return;
        }
        if state == MirrorState::InSync && st.map.get().server(st.id).and_then(|e| e.moving_to) == Some(mirror.0) {
            // The slot moves there (`moves.rs`).
            crate::moves::hand_over(st, mirror);
        }
        if stalled_since.is_none() && log.shippable() <= applied {
            log.shippable_after(applied).await;
        }
        let (first, changes, data) = log.take(applied);
        if changes.is_empty() {
            // Trimmed past what this mirror applied: it can no longer follow.
            go_on_without(st, log, mirror).await;
            return;
        }
        // A mirror past a file's count of copies gets marks of its objects, not their bytes.
        let (changes, data) = match super::thin::rank_of(st, mirror) {
            Some(rank) => super::thin::thin(changes, data, rank),
            None => (changes, data),
        };
        let payload = concat(&data);
        let op = Op::PeerReplicate { slot: st.id, incarnation: log.incarnation, first, changes };
        // Bounded by the out-of-sync delay, not the peer timeout: a frozen mirror must not
        // stall the slot longer than a dead one.
        let answer = tokio::time::timeout(
            OUT_OF_SYNC_AFTER,
            crate::rejoin::pool_to(st, mirror).request(mirror, &Cred::root(), op, payload),
        )
        .await;
        match answer.unwrap_or_else(|_| {
            Err(shoal_rpc::CallError::Transport {
                errno: shoal_proto::Errno::ETIMEDOUT,
                reason: "no answer".into(),
                refused: false,
            })
        }) {
            Ok((Reply::Replicated { applied: a, in_sync: true, incarnation }, _)) if incarnation == log.incarnation => {
                applied = applied.max(a);
                log.ack(mirror, applied);
                stalled_since = None;
                refused_since = None;
                answered = true;
                continue;
            }
            Ok((Reply::Replicated { incarnation, applied: a, .. }, _)) => {
                tracing::warn!(
                    "mirror {mirror} of server {} is not in sync (it holds position {a} of incarnation {incarnation:x}, \
                     this primary is {:x}): going on without it until it is resynchronised",
                    st.id,
                    log.incarnation
                );
                go_on_without(st, log, mirror).await;
                return;
            }
            Ok((other, _)) => tracing::warn!("mirror {mirror} answered PeerReplicate with {other:?}"),
            Err(e) => {
                tracing::debug!("mirror {mirror}: {e}");
                if e.is_refused() && answered {
                    refused_since.get_or_insert_with(Instant::now);
                } else {
                    refused_since = None;
                }
            }
        }
        if !log.has_waiters() && state == MirrorState::InSync {
            // Nobody waits (a mirror still starting, say): keep trying without giving up.
            // (A mirror catching up after a resync is given up on all the same: the log
            // holds changes for it meanwhile.)
            stalled_since = None;
            tokio::time::sleep(RETRY).await;
            continue;
        }
        let since = *stalled_since.get_or_insert_with(Instant::now);
        let refused_for = Duration::from_millis(st.map.get().membership.refused_down_after_ms);
        let dead = !refused_for.is_zero() && refused_since.is_some_and(|t| t.elapsed() >= refused_for);
        if since.elapsed() >= OUT_OF_SYNC_AFTER || dead {
            let why = if dead { " (its host refuses connections: it is not running)" } else { "" };
            tracing::warn!(
                "mirror {mirror} of server {} applied nothing for {:?}{why}: going on without it until it is \
                 resynchronised",
                st.id,
                since.elapsed()
            );
            go_on_without(st, log, mirror).await;
            return;
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Stop waiting for `mirror`, once the map group has recorded it as behind (so that it is
/// never promoted over changes it lacks: `failover.rs`). Until then replies keep waiting.
async fn go_on_without(st: &Arc<State>, log: &ReplLog, mirror: ServerId) {
    // The slot's own server standing by is never promoted (it takes the slot back only
    // once in sync, `rejoin.rs`): no consent needed.
    if mirror == st.id || crate::failover::consent_to_go_on_without(st, mirror).await {
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
