//! Holding a slot's requests while it changes hands (a handback to its own process, or a
//! move to another server: `rejoin.rs`, `moves.rs`).
//!
//! Before a slot's serving copy stops, no request may be running on it: what a request
//! changes after the stop would be missing where the slot goes. A copy used to stop taking
//! requests first and then wait for the running ones, with the slot unserved meanwhile;
//! a request that itself waits for another server (a step on a slot whose server was just
//! killed waits out that slot's failover, up to 15 s) kept the slot unserved that long and
//! its clients timed out. So the order is reversed:
//!
//! 1. The copy **holds** new requests (they wait in `dispatch::handle`, before they touch
//!    anything) while it still serves, and waits for the running ones to finish and the
//!    destination to apply the whole log.
//! 2. Quiet within [`QUIET_WITHIN`]: it stops serving (the held requests are dropped with
//!    their connections; their clients resend to the slot's new address).
//! 3. Not quiet in time: it **releases** the held requests (they run here, having waited
//!    at most [`QUIET_WITHIN`]) and tries again after a pause that doubles with each failed
//!    try (1 s up to [`RETRY_MAX`]).
//!
//! Invariant: a request runs on the stores only while counted in flight (`Load::begin`)
//! and after finding the hold off, and both are sequentially consistent, so once the hold
//! is on and the count was seen at zero nothing runs until the hold is released.
//!
//! Not held: what a server answers for the whole process rather than the slot's namespace
//! (`rejoin::answers_in_standby`: replication of the mirrors it keeps, the map group, the
//! load exchange, status); holding those could stall other slots that the running requests
//! wait for.

use crate::replica::log::MirrorState;
use crate::state::State;
use shoal_proto::ServerId;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Longest that new requests are held while waiting for the running ones to finish.
pub const QUIET_WITHIN: Duration = Duration::from_secs(2);
/// How long nothing may run and the log stay still before the slot counts as quiet (work
/// a cancelled request left on a blocking thread may still append).
const QUIET_FOR: Duration = Duration::from_millis(50);
/// Longest pause between two tries.
const RETRY_MAX: Duration = Duration::from_secs(8);

/// A slot's hold on new requests.
#[derive(Default)]
pub struct Quiesce {
    holding: AtomicBool,
    released: Notify,
    /// Tries that found the slot busy in a row (the pause before the next one doubles).
    failed: AtomicU32,
    /// No new try before this (after a failed one).
    not_before: parking_lot::Mutex<Option<Instant>>,
}

impl Quiesce {
    /// Whether new requests are being held.
    pub fn holding(&self) -> bool {
        self.holding.load(Ordering::SeqCst)
    }

    /// Wait while requests are held. True when released (run the request); false when the
    /// slot stopped serving meanwhile (drop it: its client resends where the slot went).
    pub async fn wait(&self, stop: &tokio::sync::watch::Sender<Option<String>>) -> bool {
        let mut stopped = stop.subscribe();
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !self.holding() {
                return true;
            }
            if stopped.borrow().is_some() {
                return false;
            }
            tokio::select! {
                _ = released => {}
                _ = stopped.wait_for(|r| r.is_some()) => return false,
            }
        }
    }

    /// Whether a try may start now (none failed recently).
    pub fn may_try(&self) -> bool {
        self.not_before.lock().is_none_or(|t| Instant::now() >= t)
    }

    fn hold(&self) {
        self.holding.store(true, Ordering::SeqCst);
    }

    /// Let the held requests run, and note a failed try: the next waits longer. The pause.
    fn release_after_failure(&self) -> Duration {
        self.holding.store(false, Ordering::SeqCst);
        self.released.notify_waiters();
        let n = self.failed.fetch_add(1, Ordering::SeqCst).min(3);
        let pause = (Duration::from_secs(1) * (1 << n)).min(RETRY_MAX);
        *self.not_before.lock() = Some(Instant::now() + pause);
        pause
    }
}

/// Hold `st`'s requests until none runs and `target` (a mirror of the slot: its own process,
/// or a move's destination) has applied the whole log, for at most [`QUIET_WITHIN`]; then
/// stop serving for `reason`. If it is not quiet in time, or `target` falls out of sync,
/// release the held requests and answer the pause before the next try.
pub async fn stop_when_quiet(st: &Arc<State>, target: ServerId, reason: String) -> Result<(), Duration> {
    let q = &st.quiesce;
    let Some(log) = &st.replica.log else { return Err(q.release_after_failure()) };
    q.hold();
    let deadline = Instant::now() + QUIET_WITHIN;
    let mut still_since: Option<(u64, Instant)> = None;
    loop {
        if st.stop.borrow().is_some() {
            return Err(q.release_after_failure());
        }
        let last = log.last();
        let mirror = log.mirrors().get(&target).copied();
        if mirror.is_none_or(|p| p.state != MirrorState::InSync) {
            tracing::warn!("server {}: server {target} fell out of sync while the slot was handed to it", st.id);
            return Err(q.release_after_failure());
        }
        let quiet = st.load.in_flight() == 0 && mirror.is_some_and(|p| p.applied >= last);
        match still_since {
            Some((l, since)) if quiet && l == last && since.elapsed() >= QUIET_FOR => break,
            Some((l, _)) if quiet && l == last => {}
            _ if quiet => still_since = Some((last, Instant::now())),
            _ => still_since = None,
        }
        if Instant::now() >= deadline {
            let pause = q.release_after_failure();
            tracing::warn!(
                "server {}: requests still running after {QUIET_WITHIN:?} of holding new ones: \
                 serving on, and handing the slot to server {target} again in {pause:?}",
                st.id
            );
            return Err(pause);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    q.failed.store(0, Ordering::SeqCst);
    // The hold stays on: the requests held are dropped when serving stops.
    st.stop_serving(reason);
    Ok(())
}
