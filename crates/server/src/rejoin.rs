//! Rejoining (docs/failover.md, "Rejoining"): a server whose slot failed over while it was
//! away stands by, is resynchronised as a mirror of its own slot by the copy that serves
//! the slot, and takes the slot back.
//!
//! 1. **Standby.** A server that sees its slot `served_by` another server (at start, or
//!    while running: a primary cut off by a partition) stops serving and opens again in
//!    standby ([`Mode::Standby`]): its own stores become the mirror of its slot
//!    (`Replication::open_standby`), it answers only replication and map messages, and
//!    nothing else runs on its stale stores (no recovery of intents, no gc, no reclaim).
//! 2. **Home.** It records the address it was started at as the slot's `home` in the map,
//!    through the other servers (the group's messages to its id go to the serving copy).
//! 3. **Resync.** The serving copy adds the home as a mirror of the slot, reached at `home`
//!    ([`pool_to`]), resynchronises it by digest (only what changed since it was away
//!    travels: docs/resync.md) and ships it the log.
//! 4. **Handback.** Once that mirror is in sync, the copy holds new requests until none
//!    runs and the home has applied every change (`quiesce.rs`: if requests keep running
//!    for 2 s, the held ones run and it tries again later), stops serving, checks again
//!    ([`drain_for_handback`]), closes its stores (its host keeps them as a mirror again) and moves the slot back by
//!    compare-and-set ([`after_handback`]): `addr` = home, no `served_by`, the host and the
//!    slot's other mirrors `behind` (they are resynced by the server's next incarnation).
//! 5. **Serving again.** The standing-by server sees that map and opens again as the slot's
//!    primary, with the copy's cached replies (a retry of a request the copy applied is
//!    answered, not applied twice).
//!
//! Clients see the handback as a short failover: calls to the copy are refused, and sent
//! again (same request id) to the server once the map names it.
//!
//! **After a crash** ([`mirror_to_hand_off`]) a server does not serve its own stores when
//! a mirror can take the slot: its stores may hold a change it never acknowledged (applied
//! here, not yet on the mirror), and the replies it cached died with the process, so a
//! client's retry of that request would be applied a second time. The mirror holds every
//! acknowledged change and the replies that go with them. So the server proposes its own
//! slot `down`, stands by while the mirror is promoted, and takes the slot back as above
//! (the resync undoes the change nobody was told of). If no copy takes the slot within
//! [`HAND_OFF_WITHIN`], it serves its own stores after all, as before.

use crate::replica::log::MirrorState;
use crate::replies::Replies;
use crate::state::State;
use shoal_placement::map::ServerState;
use shoal_placement::ClusterMap;
use shoal_proto::msg::{Cred, Op, Reply};
use shoal_proto::ServerId;
use shoal_rpc::Pool;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How a server process opens its stores.
#[derive(Clone)]
pub enum Mode {
    /// Serving its slot; `replies`: the cached replies to start with (those of the copy that
    /// served the slot while this server stood by).
    Primary { replies: Option<Arc<Replies>> },
    /// Standing by while its slot is served from a copy elsewhere. `hand_off`: this server
    /// hands its slot off after a crash ([`mirror_to_hand_off`]); it serves its own
    /// stores again if no copy has taken the slot by then.
    Standby { hand_off: Option<Instant> },
}

/// A server's part in rejoining.
#[derive(Default)]
pub struct Rejoin {
    /// This process stands by (its stores are the mirror of its slot).
    pub standby: bool,
    /// The address this server was started at (its map file's entry): its home.
    pub home: String,
    /// How the pool to homes proves the cluster key (the state, once it exists).
    cell: Arc<OnceLock<Weak<State>>>,
    /// Connections to servers standing by at their homes, made at first need.
    home_pool: OnceLock<Pool>,
    /// The mode to open again in, once serving stops (`State::stop_serving`), with the
    /// newest map seen (the map only moves forward: the member of the map group, started
    /// again, may still hold an older one); shared with the loop that opens the server
    /// again (`serve_on`).
    pub next: Arc<parking_lot::Mutex<Option<(Mode, ClusterMap)>>>,
    /// A copy serving a slot: the task shipping to the slot's own server (`home_loop`).
    home_shipper: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Standby: taking the slot back is under way.
    taking_back: AtomicBool,
    /// Standby after a crash: when to serve the own stores again if no copy took the slot.
    hand_off: Option<Instant>,
    /// Standby: a map with the slot served from a copy was seen (only then does a map
    /// without `served_by` give the slot back; before, it is the map of the hand-off).
    seen_served: AtomicBool,
    /// A copy serving a slot: it stopped to hand the slot back.
    pub handing_back: AtomicBool,
    /// A copy serving a slot: its home applied everything when it stopped (shared with the
    /// host, which finishes the handback once the copy's stores are closed).
    pub handed_back: Arc<AtomicBool>,
    /// A copy serving a slot that stopped to move the slot to this server (`moves.rs`),
    /// not to hand it back (shared with the host, which finishes the move).
    pub handing_to: Arc<parking_lot::Mutex<Option<ServerId>>>,
}

impl Rejoin {
    /// Standing by after a crash, and no map with the slot served from a copy seen yet.
    pub fn handing_off(&self) -> bool {
        self.hand_off.is_some() && !self.seen_served.load(Ordering::SeqCst)
    }

    pub fn new(mode: &Mode, home: String, cell: Arc<OnceLock<Weak<State>>>) -> Rejoin {
        let (standby, hand_off) = match mode {
            Mode::Standby { hand_off } => (true, *hand_off),
            Mode::Primary { .. } => (false, None),
        };
        Rejoin { standby, home, cell, hand_off, seen_served: AtomicBool::new(hand_off.is_none()), ..Default::default() }
    }
}

/// Stop serving and open again in `mode`, for `why` (said in the log).
pub fn reopen_as(st: &State, mode: Mode, why: String) {
    if st.stop.borrow().is_some() {
        return;
    }
    *st.rejoin.next.lock() = Some((mode, (*st.map.get()).clone()));
    st.stop_serving(why);
}

/// The connections that reach `server`'s own process: at its home while it stands by (its
/// slot served from a copy), else where the map says. Replication (shipping, resync) goes
/// this way, so a server standing by keeps the mirrors it holds of other slots, and the
/// copy serving its slot reaches it.
pub fn pool_to(st: &State, server: ServerId) -> &Pool {
    let map = st.map.get();
    if map.server(server).is_none_or(|e| e.home.is_none() && e.member_at.is_none()) {
        return &st.pool;
    }
    st.rejoin.home_pool.get_or_init(|| crate::peer_pool(map.homes_routed(), st.id, &st.rejoin.cell))
}

/// Close the pool to homes (the server stops: `Pool::close`).
pub fn close_home_pool(st: &State) {
    if let Some(p) = st.rejoin.home_pool.get() {
        p.close();
    }
}

/// Follow a newer map in the pool to homes (a home that moved is reached at its new address).
pub fn follow_map(st: &State, map: &ClusterMap) {
    if let Some(p) = st.rejoin.home_pool.get() {
        p.set_map(map.homes_routed());
    }
}

/// Whether a server standing by answers `op`: replication and resync (of its own slot and
/// of the mirrors it keeps), the map group's messages and map changes, the load exchange
/// and status. Everything else is refused: its stores are out of date.
pub fn answers_in_standby(op: &Op) -> bool {
    matches!(
        op,
        Op::PeerReplicate { .. }
            | Op::PeerResyncQuery { .. }
            | Op::PeerResyncApply { .. }
            | Op::PeerResyncDone { .. }
            | Op::PeerScrubRead { .. }
            | Op::PeerRaft { .. }
            | Op::GetMap { .. }
            | Op::ProposeMap { .. }
            | Op::PeerLoad { .. }
            | Op::Status
            | Op::ScrubStatus
    )
}

/// A newer map, seen by a server standing by: once its slot is no longer served from a
/// copy (the copy handed it back), open again as its primary.
pub fn on_map_standby(st: &Arc<State>) {
    let map = st.map.get();
    let Some(e) = map.server(st.id) else { return };
    if e.served_by.is_some() {
        st.rejoin.seen_served.store(true, Ordering::SeqCst);
        return;
    }
    if st.rejoin.seen_served.load(Ordering::SeqCst) && !st.rejoin.taking_back.swap(true, Ordering::SeqCst) {
        tokio::spawn(take_back(st.clone()));
    }
}

/// Open again as the slot's primary, if this server's copy of its slot follows the copy that
/// served it (it was resynchronised and in sync when the slot was handed back). A map that
/// clears `served_by` over a copy that never caught up (edited by hand) is refused: serving
/// it would show an old state of the slot.
async fn take_back(st: Arc<State>) {
    let Some(own) = st.replica.mirror(st.id) else { return };
    let (incarnation, applied) = own.position().await;
    if incarnation == 0 {
        tracing::error!(
            "server {}: the map gives this server its slot back, but its stores were never brought up to date \
             (position {applied:x}): still standing by",
            st.id
        );
        st.rejoin.taking_back.store(false, Ordering::SeqCst);
        return;
    }
    reopen_as(
        &st,
        Mode::Primary { replies: Some(own.replies.clone()) },
        format!(
            "server {}: the slot is handed back (its stores hold position {applied} of incarnation {incarnation:x}): \
             serving it again",
            st.id
        ),
    );
}

/// Every period while standing by: learn the newest map from the other servers (this
/// server's member of the group is not reached while its id's address is the copy's), and
/// record this server's home in it while the slot is served from a copy.
pub async fn standby_tick(st: &Arc<State>, base: &Path) {
    crate::membership::catch_up_any(st, base).await;
    let map = st.map.get();
    let Some(e) = map.server(st.id) else { return };
    if e.served_by.is_some() {
        st.rejoin.seen_served.store(true, Ordering::SeqCst);
    } else if let Some(until) = st.rejoin.hand_off.filter(|_| st.rejoin.handing_off()) {
        hand_off_tick(st, base, until).await;
        return;
    }
    if e.served_by.is_none() || e.home.as_deref() == Some(st.rejoin.home.as_str()) {
        return;
    }
    let home = st.rejoin.home.clone();
    let id = st.id;
    let changed = propose_through_peers(st, base, |m| {
        let Some(e) = m.servers.iter_mut().find(|e| e.id == id.0) else { return false };
        if e.served_by.is_none() || e.home.as_deref() == Some(home.as_str()) {
            return false;
        }
        e.home = Some(home.clone());
        true
    })
    .await;
    if let Some(v) = changed {
        tracing::warn!("server {id}: standing by at {} to take the slot back (map version {v})", st.rejoin.home);
    }
}

/// Serving its slot: put this server's HTTP address (`http`, from its entry in the map
/// file) back into the map if a failover dropped it (the copy serving the slot has no HTTP
/// service of the slot's, so the promotion clears it, and the handback does not know it).
/// A few tries a second apart, while the server serves: the map group may still be
/// electing after the handback.
pub async fn restore_http(st: Arc<State>, http: String) {
    let id = st.id;
    for _ in 0..20 {
        if st.stop.borrow().is_some() {
            return;
        }
        let map = st.map.get();
        let Some(e) = map.server(id) else { return };
        if e.served_by.is_some() || e.http.is_some() {
            return;
        }
        if let Some(group) = st.membership.get() {
            let mut next = (*map).clone();
            if let Some(e) = next.servers.iter_mut().find(|e| e.id == id.0) {
                e.http = Some(http.clone());
            }
            next.cluster.version = map.version() + 1;
            match group.propose(map.version(), next.to_toml()).await {
                Ok(v) => {
                    tracing::info!("server {id}: HTTP address {http} back in the map (version {v})");
                    return;
                }
                Err(e) => tracing::debug!("server {id}: putting the HTTP address back in the map: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tracing::warn!("server {id}: could not put its HTTP address {http} back in the map");
}

/// How long a server that handed its slot off after a crash waits for a copy to take it.
pub const HAND_OFF_WITHIN: Duration = Duration::from_secs(15);

/// At the start after a crash (no clean stop recorded), before serving: the mirror of this
/// slot that would be promoted if the slot were down, if it holds changes of the slot (see
/// the module docs). Then the server stands by instead of serving (`Mode::Standby` with a
/// hand-off), and marks its slot down from there ([`standby_tick`]): standing by, it
/// listens, so its member of the map group and its mirror role are reached meanwhile.
pub async fn mirror_to_hand_off(st: &Arc<State>) -> Option<ServerId> {
    let map = st.map.get();
    // Failed over already: `failover::on_map` stands by.
    if map.server(st.id)?.served_by.is_some() {
        return None;
    }
    let log = st.replica.log.as_ref()?;
    mirror_to_take(st, map, st.id, log.incarnation).await
}

/// The mirror that would be promoted if `slot` were down, if it holds changes of the slot
/// (one added just now holds none: promoting it would show an empty slot). It is asked with
/// the same empty batch a shipper probes with, of `incarnation` (0 when this process has
/// not opened the slot's log: a mirror then answers its position and changes nothing).
async fn mirror_to_take(st: &Arc<State>, map: &ClusterMap, slot: ServerId, incarnation: u64) -> Option<ServerId> {
    let mut if_down = map.clone();
    if let Some(e) = if_down.servers.iter_mut().find(|e| e.id == slot.0) {
        e.state = ServerState::Down;
    }
    let mirror = if_down.promotion_of(slot)?;
    let probe = Op::PeerReplicate { slot, incarnation, first: 1, changes: Vec::new() };
    let root = Cred::root();
    let asked = tokio::time::timeout(
        Duration::from_secs(2),
        pool_to(st, mirror).request(mirror, &root, probe, Default::default()),
    );
    match asked.await {
        Ok(Ok((Reply::Replicated { applied, .. }, _))) if applied > 0 => Some(mirror),
        other => {
            tracing::info!(
                "server {}: after a crash, mirror {mirror} cannot take the slot {slot} ({other:?}): serving it here",
                st.id
            );
            None
        }
    }
}

/// At the start after a crash, before anything is served: the slots living on this server
/// (`host`) are handed to their mirrors as its own slot is ([`mirror_to_hand_off`]), and for
/// the same reason: their stores here may hold a change the crash left unacknowledged, and
/// the replies cached for them died with the process. Each whose mirror holds its changes is
/// marked `down` (one map change for all); the mirror, which holds every acknowledged change
/// and its reply, is promoted and the slot lives on the mirror's server from then on, as
/// after any failover of a slot living on a server (it has no process of its own to be given
/// back to). `failover::wanted_here` leaves such a slot to its mirror. The slots handed off;
/// those not (no mirror with changes, or no map change committed) are served here as before.
pub async fn hand_off_hosted(st: &Arc<State>, base: &Path) -> Vec<ServerId> {
    let map = st.map.get();
    let mut slots = Vec::new();
    for slot in map.slots_on(st.id).into_iter().filter(|&s| s != st.id) {
        // Served here before (it has an address), not failed over or moving already.
        let hosted = map.server(slot).is_some_and(|e| {
            e.served_by.is_none() && e.state == ServerState::Up && e.moving_to.is_none() && !e.addr.is_empty()
        });
        if hosted && mirror_to_take(st, map, slot, 0).await.is_some() {
            slots.push(slot);
        }
    }
    if slots.is_empty() {
        return slots;
    }
    let id = st.id;
    let marked = propose_through_peers(st, base, |m| {
        let mut changed = false;
        for e in m.servers.iter_mut().filter(|e| slots.contains(&e.server_id())) {
            if e.host == Some(id.0) && e.served_by.is_none() && e.state == ServerState::Up {
                e.state = ServerState::Down;
                changed = true;
            }
        }
        changed
    })
    .await;
    match marked {
        Some(v) => {
            tracing::warn!(
                "server {id}: started after a crash; slots {slots:?} living here are marked down (map version {v}): \
                 their mirrors, which hold every acknowledged change and its reply, are to serve them"
            );
            slots
        }
        None => {
            tracing::warn!("server {id}: could not mark slots {slots:?} down after a crash: serving them here");
            Vec::new()
        }
    }
}

/// Standing by after a crash: mark the slot `down` through the other servers (nothing to do
/// once the map has it down: its mirror is being promoted), or serve the own stores after
/// all once [`HAND_OFF_WITHIN`] passed with no copy serving the slot.
async fn hand_off_tick(st: &Arc<State>, base: &Path, until: Instant) {
    let id = st.id;
    if Instant::now() >= until {
        reopen_as(
            st,
            Mode::Primary { replies: None },
            format!("server {id}: no copy took the slot within {HAND_OFF_WITHIN:?} of the hand-off: serving this server's own stores"),
        );
        return;
    }
    let marked = propose_through_peers(st, base, |m| {
        let Some(e) = m.servers.iter_mut().find(|e| e.id == id.0) else { return false };
        if e.served_by.is_some() || e.state == ServerState::Down {
            return false;
        }
        e.state = ServerState::Down;
        true
    })
    .await;
    if let Some(v) = marked {
        tracing::warn!("server {id}: marked down after a crash (map version {v}): its mirror is to serve the slot");
    }
}

/// Change the map through any other server that reaches the group (compare-and-set,
/// retried on conflicts): `change` edits the newest map and says whether there is anything
/// to change. The new version, or `None` if nothing was changed.
async fn propose_through_peers(st: &Arc<State>, base: &Path, change: impl Fn(&mut ClusterMap) -> bool) -> Option<u64> {
    let root = Cred::root();
    for _ in 0..5 {
        let mut map = (*st.map.get()).clone();
        if !change(&mut map) {
            return None;
        }
        let expect = map.version();
        map.cluster.version = expect + 1;
        let toml = map.to_toml();
        // This server's own member may lead the group (it led before a restart, or won an
        // election while standing by): the others cannot forward to it until its home is in
        // the map (its id's address is the copy's), so it commits the change itself.
        if let Some(group) = st.membership.get().filter(|g| g.leader() == Some(g.node())) {
            match group.propose(expect, toml.clone()).await {
                Ok(v) => {
                    let doc = group.current();
                    if let Ok(m) = ClusterMap::from_toml(&doc.toml, base) {
                        crate::membership::follow_map(st, m);
                    }
                    return Some(v);
                }
                Err(shoal_membership::ProposeError::Conflict { .. }) => {
                    crate::membership::catch_up_any(st, base).await;
                    continue;
                }
                Err(e) => tracing::debug!("proposing the map as the group's leader: {e}"),
            }
        }
        let others: Vec<ServerId> = map.servers.iter().map(|e| e.server_id()).filter(|&s| s != st.id).collect();
        let mut conflict = false;
        for peer in others {
            let op = Op::ProposeMap { expect_version: expect, toml: toml.clone() };
            let asked =
                tokio::time::timeout(Duration::from_secs(2), st.pool.request(peer, &root, op, Default::default()));
            match asked.await {
                Ok(Ok((Reply::Map { version, toml, .. }, _))) => {
                    if let Ok(m) = ClusterMap::from_toml(&toml, base) {
                        crate::membership::follow_map(st, m);
                    }
                    return Some(version);
                }
                Ok(Err(e)) if e.errno() == shoal_proto::Errno::EAGAIN => {
                    conflict = true;
                    break;
                }
                other => tracing::debug!("proposing the map through server {peer}: {other:?}"),
            }
        }
        if !conflict {
            return None;
        }
        crate::membership::catch_up_any(st, base).await;
    }
    None
}

/// A newer map, seen by a copy serving a slot (`failover.rs`): when the slot's own server
/// stands by at its home, resynchronise it as a mirror and ship it the log (then hand the
/// slot back, [`hand_back`]). Also called once when the copy starts serving.
pub fn on_map_promoted(st: &Arc<State>) {
    let map = st.map.get();
    let Some(e) = map.server(st.id) else { return };
    if e.home.is_none() || e.served_by != st.failover.host.map(|h| h.0) {
        return;
    }
    let Some(log) = &st.replica.log else { return };
    if log.add_mirror(st.id) {
        tracing::info!("server {}: its own process stands by at {:?}: resynchronising it", st.id, e.home);
        let task = tokio::spawn(crate::replica::ship::home_loop(st.clone(), log.clone()));
        *st.rejoin.home_shipper.lock() = Some(task);
    }
}

/// Stop shipping to the slot's own server (the copy stops serving).
pub fn stop_home_shipper(st: &State) {
    if let Some(t) = st.rejoin.home_shipper.lock().take() {
        t.abort();
    }
}

/// The slot's own server holds everything (its mirror is in sync): stop serving the slot
/// here once nothing runs (`quiesce.rs`; `Server::serve` checks again, the host finishes),
/// or, while requests keep running, try again later as long as the home stays in sync.
pub fn hand_back(st: Arc<State>) {
    if st.rejoin.handing_back.swap(true, Ordering::SeqCst) {
        return;
    }
    tokio::spawn(async move {
        let home = st.map.get().server(st.id).and_then(|e| e.home.clone()).unwrap_or_default();
        let why = format!("server {}: handing the slot back to its own process at {home}", st.id);
        let Err(pause) = crate::quiesce::stop_when_quiet(&st, st.id, why).await else { return };
        st.rejoin.handing_back.store(false, Ordering::SeqCst);
        tokio::time::sleep(pause).await;
        let in_sync =
            st.replica.log.as_ref().and_then(|l| l.mirrors().get(&st.id).map(|p| p.state)) == Some(MirrorState::InSync);
        if in_sync && st.stop.borrow().is_none() {
            hand_back(st);
        }
    });
}

/// Longest wait, once a copy stopped taking requests, for the last ones to finish and the
/// home to apply everything.
const DRAIN_WITHIN: Duration = Duration::from_secs(10);
/// How long the log must stay still before the copy counts as drained (work a cancelled
/// request left on a blocking thread may still append).
const DRAIN_QUIET: Duration = Duration::from_millis(50);
/// Longest the target may go without applying anything more while it has not applied the
/// whole log: it died or stalled meanwhile (killed while the slot was being handed to it,
/// say), and waiting out [`DRAIN_WITHIN`] would leave the slot unserved for that long.
const DRAIN_STUCK: Duration = Duration::from_secs(2);

/// After a copy stopped taking requests to hand its slot back: wait until no request runs
/// and the home mirror has applied the whole log. True when it has (the handback goes on).
pub async fn drain_for_handback(st: &State) -> bool {
    let Some(log) = &st.replica.log else { return false };
    // The server the slot goes to: its own (a handback), or a move's destination.
    let target = st.rejoin.handing_to.lock().unwrap_or(st.id);
    let deadline = Instant::now() + DRAIN_WITHIN;
    let mut still_since: Option<(u64, Instant)> = None;
    let mut progress: Option<(u64, Instant)> = None;
    while Instant::now() < deadline {
        let last = log.last();
        let home = log.mirrors().get(&target).copied();
        let at = home.map_or(0, |p| p.applied);
        match progress {
            Some((a, since)) if a == at && at < last && since.elapsed() >= DRAIN_STUCK => {
                tracing::warn!(
                    "server {}: server {target} applied nothing for {DRAIN_STUCK:?} while the slot was handed to it",
                    st.id
                );
                return false;
            }
            Some((a, _)) if a == at && at < last => {}
            _ => progress = Some((at, Instant::now())),
        }
        let idle = st.load.report().queue_depth == 0;
        if home.is_some_and(|p| p.state != MirrorState::InSync) {
            tracing::warn!("server {}: server {target} fell out of sync while the slot was handed to it", st.id);
            return false;
        }
        let applied = home.is_some_and(|p| p.applied >= last);
        match still_since {
            Some((l, since)) if l == last && idle && applied && since.elapsed() >= DRAIN_QUIET => return true,
            Some((l, _)) if l == last => {}
            _ => still_since = Some((last, Instant::now())),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::warn!("server {}: the handback did not drain within {DRAIN_WITHIN:?}", st.id);
    false
}

/// On the host, once the copy serving `slot` stopped: keep the copy as a mirror again, and
/// (if its home applied everything: `handed_back`) move the slot back to its home through
/// the group. If the handback cannot be finished, the slot is served from the copy again
/// (`failover::on_map` promotes it anew).
pub async fn after_handback(host: Arc<State>, slot: ServerId, handed_back: bool) {
    if let Err(e) = crate::failover::keep_as_mirror_again(&host, slot).await {
        tracing::error!("server {slot}: the copy handed back cannot be kept as a mirror: {e:#}");
    }
    let moved = handed_back && move_home(&host, slot).await;
    host.failover.promoting.lock().remove(&slot);
    if !moved {
        tracing::warn!("server {slot}: not handed back: serving it from this server's copy again");
        crate::failover::on_map(&host);
    }
}

/// Tries of the handback's map change (it keeps losing compare-and-set races, or the group
/// is out of reach).
const HANDBACK_TRIES: usize = 50;

/// Move `slot` back to its home (the copy on `host` stopped, its home holds everything).
async fn move_home(host: &Arc<State>, slot: ServerId) -> bool {
    let moved = switch_slot(host, slot, HANDBACK_TRIES, "handing it back", |map| {
        let Some(e) = map.servers.iter_mut().find(|e| e.id == slot.0) else { return false };
        let (Some(home), true) = (e.home.clone(), e.served_by == Some(host.id.0)) else { return false };
        e.addr = home;
        e.home = None;
        e.member_at = None;
        e.served_by = None;
        // Serving again: no longer gone (the mirrors made in its place are dropped, and
        // it is behind where it mirrors again until resynchronised).
        map.set_absent(slot, false);
        true
    })
    .await;
    if let Some((v, _)) = moved {
        tracing::warn!("server {slot} is handed back to its own process (map version {v})");
    }
    moved.is_some()
}

/// Move `slot` to another process by compare-and-set through `host`'s member of the group
/// (a handback, or a move's switch: `moves.rs`): `change` edits the newest map (the slot's
/// entry, and for a drained server the voters), or says no (false: someone else changed the
/// slot meanwhile). The slot is
/// then `up`, and every mirror `behind` (it holds positions of the old server's
/// incarnation; the new one resynchronises them). Retried `tries` times while the change
/// loses races or the group is out of reach. The new version and map, once committed.
pub(crate) async fn switch_slot(
    host: &Arc<State>,
    slot: ServerId,
    tries: usize,
    what: &str,
    change: impl Fn(&mut ClusterMap) -> bool,
) -> Option<(u64, ClusterMap)> {
    let group = host.membership.get().cloned()?;
    let base = crate::failover::map_base(host);
    for _ in 0..tries {
        let doc = group.current();
        let mut map = ClusterMap::from_toml(&doc.toml, &base).ok()?;
        if !change(&mut map) {
            return None;
        }
        let e = map.servers.iter_mut().find(|e| e.id == slot.0)?;
        e.state = ServerState::Up;
        map.set_all_behind(slot);
        map.cluster.version = doc.version + 1;
        match group.propose(doc.version, map.to_toml()).await {
            Ok(v) => return Some((v, map)),
            Err(shoal_membership::ProposeError::Conflict { .. }) => continue,
            Err(e) => {
                tracing::warn!("server {slot}: {what}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    None
}
