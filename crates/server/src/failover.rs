//! Failover (docs/failover.md): when the map marks a slot's primary `down`, the first of its
//! mirrors that is up and not behind serves the slot from its copy, in its own process, on a
//! new port of its own host, and moves the slot there through the map group.
//!
//! The rules that keep one primary per slot (no split brain):
//! * A mirror is promoted only by a map change the group commits (compare-and-set): the
//!   slot's entry gets `served_by` (the host), its new `addr`, and `state = up`.
//! * A primary goes on without a mirror (replies stop waiting for it) only after the group
//!   committed that mirror into the slot's `behind` list (`consent_to_go_on_without`); a
//!   mirror in `behind` is never promoted. So a primary cut off from the group stalls
//!   instead of acknowledging what a promoted mirror would never see.
//! * A server whose slot has `served_by` set (it failed over while the server was away) stops
//!   serving as soon as it sees that map (`on_map`), and stands by to take the slot back
//!   (`rejoin.rs`).

use crate::state::State;
use anyhow::{anyhow, Context};
use parking_lot::Mutex;
use shoal_placement::map::ServerState;
use shoal_placement::ClusterMap;
use shoal_proto::ServerId;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A server's part in failover.
#[derive(Default)]
pub struct Failover {
    /// For a slot served from a mirror copy: the server whose process serves it.
    pub host: Option<ServerId>,
    /// How this server was started (slots promoted here are started the same way).
    pub options: OnceLock<crate::ServerOptions>,
    /// The slots this process serves from its mirror copies, and their serving tasks.
    served: Mutex<Vec<(ServerId, tokio::task::JoinHandle<()>)>>,
    /// Slots whose promotion is under way here.
    pub(crate) promoting: Mutex<HashSet<ServerId>>,
    /// No promotion starts here while set: a server started after a crash has not decided
    /// yet whether it serves or hands its own slot off (`rejoin::mirror_to_hand_off`);
    /// handing off, it stops serving, and a copy it had begun to promote would be cut off
    /// half-way (its map change committed, nothing serving it).
    pub(crate) held: std::sync::atomic::AtomicBool,
}

impl Failover {
    /// The failover part of a slot served from `host`'s mirror copy.
    pub fn promoted_on(host: ServerId) -> Failover {
        Failover { host: Some(host), ..Default::default() }
    }

    /// The slots this process serves from mirror copies.
    pub fn served(&self) -> Vec<ServerId> {
        self.served.lock().iter().map(|(s, _)| *s).collect()
    }

    /// The serving tasks of promoted slots (to wait for them at shutdown).
    pub fn take_served(&self) -> Vec<tokio::task::JoinHandle<()>> {
        self.served.lock().drain(..).map(|(_, h)| h).collect()
    }
}

/// Tries of a map change that keeps losing the compare-and-set race.
const PROPOSE_TRIES: usize = 20;
/// The first pause before a promotion that failed is tried again; it doubles up to
/// [`PROMOTE_RETRY_MAX`] while the map still wants the slot served here.
const PROMOTE_RETRY_FIRST: Duration = Duration::from_millis(200);
const PROMOTE_RETRY_MAX: Duration = Duration::from_secs(5);
/// How long a mirror being promoted may still be busy applying a batch.
const MIRROR_QUIET_WAIT: Duration = Duration::from_secs(5);

/// Where map files name relative paths from.
pub(crate) fn map_base(st: &State) -> PathBuf {
    st.failover
        .options
        .get()
        .and_then(|o| o.config.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Called with each newer map a server follows: stop serving if this server's slot failed
/// over while it was away, and promote the mirrors the map now wants served here.
pub fn on_map(st: &Arc<State>) {
    if st.failover.host.is_some() {
        crate::rejoin::on_map_promoted(st);
        return;
    }
    let map = st.map.get();
    if st.rejoin.standby {
        crate::rejoin::on_map_standby(st);
        // Standing by, the process still serves the copies the map gives it: nothing else
        // can (a slot with `served_by` is promoted nowhere else), and opening the process
        // again stopped them.
    } else if let Some(h) = map.server(st.id).and_then(|e| e.served_by) {
        crate::rejoin::reopen_as(
            st,
            crate::rejoin::Mode::Standby { hand_off: None },
            format!(
                "server {h} has served this slot from its copy since a failover (map version {}): this server's \
                 stores are out of date; standing by to be resynchronised and take the slot back",
                map.version()
            ),
        );
        return;
    }
    if st.failover.held.load(Ordering::SeqCst) || st.stop.borrow().is_some() {
        return;
    }
    let served = st.failover.served();
    let wanted = map.servers.iter().map(|e| e.server_id()).filter(|&slot| wanted_here(st, map, &served, slot));
    for slot in wanted.collect::<Vec<_>>() {
        if st.failover.promoting.lock().insert(slot) {
            tokio::spawn(promote(st.clone(), slot));
        }
    }
}

/// Whether `map` wants `slot` served from this server's copy and it is not served yet
/// (`served`: the slots served here now).
fn wanted_here(st: &State, map: &ClusterMap, served: &[ServerId], slot: ServerId) -> bool {
    // A new promotion only while serving (the map never picks a server standing by for its
    // slot; one handing its slot off after a crash is about to be marked down).
    (!st.rejoin.standby && map.promotion_of(slot) == Some(st.id))
        // Served here before this process restarted or opened again (a copy it took over,
        // or a slot living here): serve it again.
        || (slot != st.id
            && map.serving_process(slot) == st.id
            && map.server(slot).is_some_and(|e| e.state != ServerState::Out)
            && !left_to_mirror(map, st.id, slot)
            && !served.contains(&slot))
}

/// A slot living on `here` that the map has `down` while a mirror of it can be promoted: that
/// mirror serves it, not this server's stores. This server marked it so itself, started
/// after a crash (`rejoin::hand_off_hosted`), or the failure detector did while it was away;
/// either way the mirror holds every acknowledged change and its reply. Should no mirror be
/// promotable any more (the map marks them down or behind), the slot is served here again.
fn left_to_mirror(map: &ClusterMap, here: ServerId, slot: ServerId) -> bool {
    map.server(slot).is_some_and(|e| e.host == Some(here.0) && e.state == ServerState::Down)
        && map.promotion_of(slot).is_some_and(|m| m != here)
}

async fn promote(host: Arc<State>, slot: ServerId) {
    if host.map.get().serving_process(slot) == host.id {
        tracing::info!("server {slot} is served by this server: serving it from its stores here");
    } else {
        tracing::warn!("server {slot} is down: serving it from the mirror this server keeps");
    }
    let started = std::time::Instant::now();
    let mut pause = PROMOTE_RETRY_FIRST;
    loop {
        match promote_inner(&host, slot).await {
            Ok(true) => tracing::warn!("server {slot} is served here now (promoted in {:?})", started.elapsed()),
            Ok(false) => tracing::info!("server {slot} needs no promotion here any more"),
            Err(e) => {
                // Nothing else would try again before the next map: the slot would stay
                // unserved (seen: the copy's stores still held by the copy served here
                // before, closing; docs/testing.md).
                tracing::error!("promoting the mirror of server {slot}: {e:#}; trying again in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(PROMOTE_RETRY_MAX);
                let stopping = host.stop.borrow().is_some() || host.failover.held.load(Ordering::SeqCst);
                if !stopping && wanted_here(&host, host.map.get(), &host.failover.served(), slot) {
                    continue;
                }
            }
        }
        break;
    }
    host.failover.promoting.lock().remove(&slot);
}

/// The map `doc` with `slot` served by `host` at `addr`; `None` if the map no longer wants
/// that (the slot is up again, or another mirror took it, or this one is behind).
fn promoted_map(
    toml: &str,
    version: u64,
    base: &Path,
    slot: ServerId,
    host: ServerId,
    addr: &str,
) -> Option<ClusterMap> {
    let mut map = ClusterMap::from_toml(toml, base).ok()?;
    let resumed = map.serving_process(slot) == host;
    if map.promotion_of(slot) != Some(host) && !resumed {
        return None;
    }
    if resumed {
        // Served here before this process restarted (or first served here, for a slot
        // living here): only the address is new.
        let e = map.servers.iter_mut().find(|e| e.id == slot.0)?;
        e.addr = addr.to_string();
        e.state = ServerState::Up;
        map.cluster.version = version + 1;
        return Some(map);
    }
    let e = map.servers.iter_mut().find(|e| e.id == slot.0)?;
    let was_at = std::mem::replace(&mut e.addr, addr.to_string());
    e.state = ServerState::Up;
    if e.host.is_some() {
        // A slot without a process of its own has no server to come back for it: it lives
        // here from now on.
        e.host = Some(host.0);
        e.moving_to = None;
    } else {
        // Where its process comes back (`member_at`): the group reaches it there meanwhile.
        // Served from a copy before (that copy is down in turn): it comes back where it did.
        if e.served_by.is_none() {
            e.member_at = Some(was_at).filter(|a| !a.is_empty());
        }
        e.served_by = Some(host.0);
    }
    e.http = None;
    e.behind.clear();
    // Every other mirror holds positions of the old primary's incarnation: behind the new
    // one until resynchronised.
    map.set_all_behind(slot);
    map.cluster.version = version + 1;
    Some(map)
}

/// Whether `slot` lives on `host` (`host` in its entry) in the map `toml`.
fn map_entry_hosted_here(toml: &str, base: &Path, slot: ServerId, host: ServerId) -> bool {
    ClusterMap::from_toml(toml, base).ok().and_then(|m| m.server(slot).map(|e| e.host == Some(host.0))).unwrap_or(false)
}

/// Whether `slot` lives on `host` and was never served (it has no address yet).
fn map_entry_unserved(toml: &str, base: &Path, slot: ServerId, host: ServerId) -> bool {
    ClusterMap::from_toml(toml, base)
        .ok()
        .and_then(|m| m.server(slot).map(|e| e.host == Some(host.0) && e.addr.is_empty()))
        .unwrap_or(false)
}

/// Promote the mirror of `slot`; false if the map no longer wants it.
async fn promote_inner(host: &Arc<State>, slot: ServerId) -> anyhow::Result<bool> {
    let group = host.membership.get().ok_or_else(|| anyhow!("the map group is not started"))?.clone();
    let opts = host.failover.options.get().ok_or_else(|| anyhow!("start options unknown"))?.clone();
    let base = map_base(host);
    // Standing by, the map gives this server's slot the address of the copy serving it.
    let own = match host.rejoin.standby {
        true => host.rejoin.home.clone(),
        false => host.map.get().server(host.id).map(|e| e.addr.clone()).context("this server is not in the map")?,
    };
    let ip = own.rsplit_once(':').map_or(own.as_str(), |(h, _)| h).to_string();
    let listener = tokio::net::TcpListener::bind(format!("{ip}:0"))
        .await
        .with_context(|| format!("cannot listen on {ip} for server {slot}"))?;
    let addr = format!("{ip}:{}", listener.local_addr()?.port());

    let doc = group.current();
    let Some(mut next) = promoted_map(&doc.toml, doc.version, &base, slot, host.id, &addr) else { return Ok(false) };
    let mirror = match host.replica.take_mirror(slot) {
        Some(m) => m,
        // Not opened as a mirror at start (the map then had the slot served here already;
        // the copy served before this process opened again may still be closing).
        None if crate::replica::mirror::dir_of(&host.data_dir, slot).join("meta").is_dir() => {
            Arc::new(open_mirror_once_closed(host, slot).await?)
        }
        // A slot living here that was never served (no address yet): its stores are made
        // now. One that was served has lost its stores (a wiped disk): serving it empty
        // would show an empty slot.
        None if map_entry_unserved(&doc.toml, &base, slot, host.id) => {
            tracing::info!("server {slot} lives on this server: making its stores");
            Arc::new(open_mirror_once_closed(host, slot).await?)
        }
        None if map_entry_hosted_here(&doc.toml, &base, slot, host.id) => {
            return Err(anyhow!(
                "server {slot} lives on this server, but its stores under {} are gone: not serving it empty",
                crate::replica::mirror::dir_of(&host.data_dir, slot).display()
            ));
        }
        None => return Ok(false),
    };
    // A batch being applied holds the mirror: let it finish (no new ones are taken).
    let deadline = tokio::time::Instant::now() + MIRROR_QUIET_WAIT;
    let mut mirror = mirror;
    let mirror = loop {
        match Arc::try_unwrap(mirror) {
            Ok(m) => break m,
            Err(m) if tokio::time::Instant::now() < deadline => {
                mirror = m;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(m) => {
                host.replica.give_back(slot, m);
                return Err(anyhow!("the mirror stayed busy for {MIRROR_QUIET_WAIT:?}"));
            }
        }
    };
    let (inc, pos) = mirror.position().await;
    let (dir, meta, data, replies) = mirror.into_parts();
    let server =
        crate::Server::open_promoted(host, ServerId(slot.0), &opts, next.clone(), dir.clone(), meta, data, replies)
            .await
            .with_context(|| format!("opening the copy under {}", dir.display()))?;
    let promoted = server.state();
    // Move the slot here through the group (compare-and-set; retried while others change
    // the map, as long as the map still wants this promotion).
    let mut expect = doc.version;
    let mut done = None;
    for _ in 0..PROPOSE_TRIES {
        // This process stops serving (to stand by, or to shut down): its copy would have
        // no one to serve it.
        if host.stop.borrow().is_some() {
            break;
        }
        match group.propose(expect, next.to_toml()).await {
            Ok(v) => {
                done = Some(v);
                break;
            }
            Err(shoal_membership::ProposeError::Conflict { .. }) => {
                let doc = group.current();
                match promoted_map(&doc.toml, doc.version, &base, slot, host.id, &addr) {
                    Some(m) if m.mirrors_of(slot) == next.mirrors_of(slot) => {
                        expect = doc.version;
                        next = m;
                    }
                    _ => break,
                }
            }
            Err(e) => {
                // The change may have committed with its answer lost (the connection to
                // the leader is dropped when a map moving a slot's address is applied here).
                let doc = group.current();
                let current = ClusterMap::from_toml(&doc.toml, &base).ok();
                if let Some(m) = current
                    .filter(|m| m.serving_process(slot) == host.id && m.server(slot).is_some_and(|e| e.addr == addr))
                {
                    done = Some(doc.version);
                    next = m;
                    break;
                }
                tracing::warn!("moving server {slot} here: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let Some(version) = done else {
        // Not moved: close the copy and keep it as a mirror again.
        drop(promoted);
        server.close().await;
        let m = tokio::task::spawn_blocking({
            let dd = host.data_dir.clone();
            move || crate::replica::mirror::Mirror::open(&dd, slot)
        })
        .await?
        .map_err(|e| anyhow!("reopening the mirror of server {slot}: {e}"))?;
        host.replica.give_back(slot, Arc::new(m));
        return Ok(false);
    };
    promoted.map.set(next.clone());
    promoted.pool.set_map(next);
    tracing::info!(
        "server {slot} moves to {addr} in map version {version}; its copy was at position {pos} of incarnation {inc:x}"
    );
    crate::membership::follow_group(&promoted, &group, base);
    // The slot's own server may stand by already (this host restarted meanwhile).
    crate::rejoin::on_map_promoted(&promoted);
    let handed_back = promoted.rejoin.handed_back.clone();
    let handing_to = promoted.rejoin.handing_to.clone();
    drop(promoted);
    let stop = host.stop.subscribe();
    let host2 = host.clone();
    let handle = tokio::spawn(async move {
        let mut stop = stop;
        let shutdown = async move {
            let _ = stop.wait_for(|r| r.is_some()).await;
        };
        let served = server.serve(listener, shutdown).await;
        let handback = handed_back.load(Ordering::SeqCst);
        match served {
            Err(_) if handback || host2.stop.borrow().is_none() => {
                // Stopped to hand the slot back (or the handback did not drain): finish it.
                // Marked as under way meanwhile, so that a map seen before the slot moved
                // home (its copy no longer answering, the detector marks it down) does not
                // start serving it again here.
                host2.failover.promoting.lock().insert(slot);
                host2.failover.served.lock().retain(|(s, _)| *s != slot);
                let to = *handing_to.lock();
                match to {
                    Some(to) => crate::moves::after_move(host2, slot, to, handback).await,
                    None => crate::rejoin::after_handback(host2, slot, handback).await,
                }
            }
            Err(e) => tracing::error!("server {slot} (served from this server's copy) stopped: {e:#}"),
            Ok(()) => {}
        }
    });
    host.failover.served.lock().push((slot, handle));
    Ok(true)
}

/// Keep the copy of `slot` (no longer served here: it was handed back) as a mirror again,
/// once its stores are closed.
pub(crate) async fn keep_as_mirror_again(host: &Arc<State>, slot: ServerId) -> anyhow::Result<()> {
    let m = open_mirror_once_closed(host, slot).await?;
    host.replica.give_back(slot, Arc::new(m));
    Ok(())
}

/// Open the copy of `slot` kept on `host`, waiting (up to [`MIRROR_QUIET_WAIT`]) for the
/// server that served it to close its stores: they close when its last request is done.
pub(crate) async fn open_mirror_once_closed(
    host: &State,
    slot: ServerId,
) -> anyhow::Result<crate::replica::mirror::Mirror> {
    let deadline = tokio::time::Instant::now() + MIRROR_QUIET_WAIT;
    loop {
        let dd = host.data_dir.clone();
        match tokio::task::spawn_blocking(move || crate::replica::mirror::Mirror::open(&dd, slot)).await? {
            Ok(m) => return Ok(m),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!("opening the copy of server {slot}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(anyhow!("opening the copy of server {slot}: {e}")),
        }
    }
}

/// Before a primary goes on without `mirror` (replies stop waiting for it): have the group
/// record the mirror as behind, so that it is never promoted over what is acknowledged
/// without it. Retried while the group is out of reach (replies keep waiting meanwhile:
/// a primary cut off from the group does not go on alone). False if this server must stop
/// serving instead (its slot failed over).
pub async fn consent_to_go_on_without(st: &Arc<State>, mirror: ServerId) -> bool {
    let Some(group) = st.membership.get().cloned() else { return true };
    let base = map_base(st);
    let mut pause = Duration::from_millis(50);
    loop {
        if st.stop.borrow().is_some() {
            return false;
        }
        let doc = group.current();
        let Ok(mut map) = ClusterMap::from_toml(&doc.toml, &base) else { return false };
        let Some(e) = map.servers.iter_mut().find(|e| e.id == st.id.0) else { return false };
        if e.served_by.is_some() && e.served_by != st.failover.host.map(|h| h.0) {
            on_map(st);
            return false;
        }
        if e.behind.contains(&mirror.0) {
            return true;
        }
        e.behind.push(mirror.0);
        map.cluster.version = doc.version + 1;
        match group.propose(doc.version, map.to_toml()).await {
            Ok(v) => {
                tracing::warn!("mirror {mirror} of server {} is behind (map version {v})", st.id);
                return true;
            }
            Err(shoal_membership::ProposeError::Conflict { .. }) => continue,
            Err(e) => {
                tracing::warn!("cannot record mirror {mirror} of server {} as behind yet: {e}", st.id);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// `mirror` is in sync again (replies wait for it): take it out of the slot's `behind`
/// list, so that it may be promoted again. Retried while the group is out of reach.
pub async fn caught_up(st: Arc<State>, mirror: ServerId) {
    let Some(group) = st.membership.get().cloned() else { return };
    let base = map_base(&st);
    for _ in 0..PROPOSE_TRIES {
        if st.stop.borrow().is_some() {
            return;
        }
        let doc = group.current();
        let Ok(mut map) = ClusterMap::from_toml(&doc.toml, &base) else { return };
        let Some(e) = map.servers.iter_mut().find(|e| e.id == st.id.0) else { return };
        if !e.behind.contains(&mirror.0) {
            return;
        }
        e.behind.retain(|b| *b != mirror.0);
        map.cluster.version = doc.version + 1;
        match group.propose(doc.version, map.to_toml()).await {
            Ok(v) => {
                tracing::info!("mirror {mirror} of server {} is in sync again (map version {v})", st.id);
                return;
            }
            Err(shoal_membership::ProposeError::Conflict { .. }) => continue,
            Err(e) => {
                tracing::debug!("cannot record mirror {mirror} of server {} as in sync yet: {e}", st.id);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
