//! Moving a slot to another server (docs/membership.md, "Moving slots"): how a server that
//! joins takes its share, and how slots are spread again.
//!
//! A slot is moved whole, by the machinery that already moves a slot between processes
//! after a failover (`rejoin.rs`), in four steps:
//!
//! 1. **Asked.** A map change sets the slot's `moving_to` (`shoal server move`, or the
//!    rebalancing of `shoal server add`). The destination is one more mirror of the slot
//!    (`ClusterMap::mirrors_of`): it opens an empty copy (`replica::keep_mirrors`), and the
//!    slot's server ships to it (`replica::follow_map`).
//! 2. **Resync.** The copy is resynchronised by digest (throttled, `replica/resync.rs`; after
//!    a crash of either side the next resync compares again and sends only what differs),
//!    then follows the log.
//! 3. **Switch.** Once the destination is in sync ([`hand_over`], called by the shipper), the
//!    slot's server holds new requests until none runs and the destination has applied
//!    every change (`quiesce.rs`; tried again later if requests keep running), stops
//!    serving (`rejoin::drain_for_handback` checks again), and closes its stores. Its
//!    process then moves the slot by compare-and-set ([`after_move`]): `host` = the
//!    destination, no `moving_to`, the slot's other mirrors `behind` (the destination's new
//!    incarnation resynchronises them).
//! 4. **Serving there.** The destination sees a slot living on it that it does not serve and
//!    serves it from its copy (`failover::on_map`, as after a restart), with the copy's
//!    replies (a retry of a request the old server applied is answered, not applied twice).
//!
//! Clients see the switch as a short failover: calls to the old address are refused, and
//! sent again (same request id) once the map names the new one. If the switch cannot be
//! committed (the group is out of reach), the old server serves the slot again and the move
//! starts over from step 2 (`moving_to` is still set).
//!
//! **A server's own slot** moves only when the server is drained (`shoal server drain`),
//! and last, once no other slot lives on it or is served by it. The steps are the same,
//! with the process itself in the host's part ([`switch_own`], called as its serving
//! ends): the switch retires the process (`ClusterMap::retire`: its entry becomes a slot
//! living on the destination, and it leaves the voters), and the process stops. Its stores
//! are left on its disk, unused; started again, it refuses to serve them.

use crate::state::State;
use shoal_proto::ServerId;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The shipper of `st`'s slot found `mirror` in sync: if the map moves the slot there, stop
/// serving it here to switch (step 3).
pub fn hand_over(st: &Arc<State>, mirror: ServerId) {
    let map = st.map.get();
    let Some(e) = map.server(st.id) else { return };
    // A server's own slot moves only when the server is drained (see the module docs).
    if e.moving_to != Some(mirror.0) || (st.failover.host.is_none() && !e.draining) {
        return;
    }
    if st.failover.host.is_none() && serves_others(map, st.id) {
        tracing::info!("server {}: its own slot moves once no other slot is served here", st.id);
        return;
    }
    // A try that found requests running waits a little before the next (`quiesce.rs`).
    if !st.quiesce.may_try() || st.rejoin.handing_back.swap(true, Ordering::SeqCst) {
        return;
    }
    *st.rejoin.handing_to.lock() = Some(mirror);
    let st = st.clone();
    tokio::spawn(async move {
        let why = format!("server {}: moving the slot to server {mirror}, which is in sync", st.id);
        if crate::quiesce::stop_when_quiet(&st, mirror, why).await.is_err() {
            *st.rejoin.handing_to.lock() = None;
            st.rejoin.handing_back.store(false, Ordering::SeqCst);
        }
    });
}

/// Tries of the switch's map change (it keeps losing compare-and-set races, or the group is
/// out of reach).
const SWITCH_TRIES: usize = 50;

/// On the old host, once the slot's server stopped (`drained`: the destination applied
/// everything): move the slot to `to` through the group, and keep or delete this server's
/// copy as the new map says. If the switch does not happen, serve the slot here again.
pub async fn after_move(host: Arc<State>, slot: ServerId, to: ServerId, drained: bool) {
    let moved = drained && switch(&host, slot, to).await;
    if moved {
        let keeps = host.map.get().mirrors_of(slot).contains(&host.id);
        let kept = match keeps {
            // Still a mirror (behind: resynchronised by the new incarnation).
            true => crate::failover::keep_as_mirror_again(&host, slot).await,
            false => remove_copy(&host, slot).await,
        };
        if let Err(e) = kept {
            tracing::error!("server {slot} moved to server {to}; this server's copy: {e:#}");
        }
    }
    host.failover.promoting.lock().remove(&slot);
    if !moved {
        tracing::warn!("server {slot}: not moved to server {to}: serving it here again");
        crate::failover::on_map(&host);
    }
}

/// The map change of the switch (step 3): true once committed.
async fn switch(host: &Arc<State>, slot: ServerId, to: ServerId) -> bool {
    let moved = crate::rejoin::switch_slot(host, slot, SWITCH_TRIES, "moving it", |map| {
        let Some(e) = map.servers.iter_mut().find(|e| e.id == slot.0) else { return false };
        // Someone else changed the slot meanwhile (a failover, the move called off).
        if e.host != Some(host.id.0) || e.moving_to != Some(to.0) || e.served_by.is_some() {
            return false;
        }
        e.host = Some(to.0);
        e.moving_to = None;
        true
    })
    .await;
    let Some((v, map)) = moved else { return false };
    tracing::warn!("server {slot} moves to server {to} (map version {v})");
    crate::membership::follow_map(host, map);
    true
}

/// Delete this server's copy of `slot` (it moved away, and this server is not one of its
/// mirrors), once its stores are closed.
async fn remove_copy(host: &State, slot: ServerId) -> anyhow::Result<()> {
    let copy = crate::failover::open_mirror_once_closed(host, slot).await?;
    drop(copy);
    let dir = crate::replica::mirror::dir_of(&host.data_dir, slot);
    std::fs::remove_dir_all(&dir).map_err(|e| anyhow::anyhow!("removing {}: {e}", dir.display()))?;
    tracing::info!("server {slot} moved away: removed this server's copy {}", dir.display());
    Ok(())
}

/// Whether a slot other than `process`'s own lives on it or is served by it.
fn serves_others(map: &shoal_placement::ClusterMap, process: ServerId) -> bool {
    map.servers.iter().any(|e| e.id != process.0 && map.serving_process(e.server_id()) == process)
}

/// A drained server's own slot, once its serving stopped (`drained`: the destination
/// applied everything): retire this process through the group, its slot living on `to`
/// from now on. True once committed: the process then stops. If not, the caller serves
/// the slot again and the move starts over.
pub async fn switch_own(st: &Arc<State>, to: ServerId, drained: bool) -> bool {
    if !drained {
        return false;
    }
    let me = st.id;
    let moved = crate::rejoin::switch_slot(st, me, SWITCH_TRIES, "moving it", |map| {
        let still = map
            .server(me)
            .is_some_and(|e| e.host.is_none() && e.draining && e.moving_to == Some(to.0) && e.served_by.is_none());
        // A slot failed over to this server meanwhile would be left with no process.
        if !still || serves_others(map, me) {
            return false;
        }
        map.retire(me, to);
        true
    })
    .await;
    let Some((v, _)) = moved else { return false };
    tracing::warn!(
        "server {me} is drained: its slot lives on server {to} from now on (map version {v}); this process stops \
         (its stores under {} are no longer used)",
        st.data_dir.display()
    );
    true
}
