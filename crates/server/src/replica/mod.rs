//! Redundancy: this server's stores mirrored on other servers, and the mirrors it keeps of
//! theirs (docs/architecture.md, "Redundancy").
//!
//! With `[cluster] replicas = R`, the stores of each server (a *slot* of placement: what
//! layouts and `home_of` name) are mirrored on the next R − 1 servers of the map
//! (`ClusterMap::mirrors_of`). The server serving a slot is its *primary*: every change it
//! makes to its stores goes into its replication log (`log.rs`) as it is made, the shipper
//! (`ship.rs`) sends the log to each mirror in order, and no reply leaves before every mirror
//! in sync has applied what the reply depends on (`net.rs`, after the group commit). Each
//! mirror (`mirror.rs`) applies the changes to a copy with the same layout as a server's own
//! data directory.

pub mod digest;
pub mod log;
pub mod mirror;
pub mod resync;
pub mod ship;
pub mod thin;

use log::ReplLog;
use mirror::Mirror;
use shoal_proto::ServerId;
use std::collections::HashMap;
use std::sync::Arc;

/// A server's part in redundancy.
#[derive(Default)]
pub struct Replication {
    /// The replication log of this server's own slot, when it has mirrors.
    pub log: Option<Arc<ReplLog>>,
    /// The mirrors this server keeps, by slot (one leaves when it is promoted to serve
    /// its slot: `failover.rs`).
    mirrors: parking_lot::RwLock<HashMap<ServerId, Arc<Mirror>>>,
    /// This start follows a crash: the slot has mirrors and no clean stop was recorded, so
    /// the stores may hold changes no mirror applied and no client was told of
    /// (`rejoin::mirror_to_hand_off`).
    pub crashed: bool,
    /// The shipping task of each mirror of this slot; `None` until the server serves
    /// (`start_shippers`), and again once it stopped.
    shippers: parking_lot::Mutex<Option<HashMap<ServerId, tokio::task::JoinHandle<()>>>>,
    /// Serialises changes to the set of mirrors kept (`keep_mirrors`).
    keeping: tokio::sync::Mutex<()>,
}

impl Replication {
    /// The replication of `st`'s slot as its map says: the log when it has mirrors (hung
    /// on its stores), and the mirrors it keeps, opened (created if new).
    pub async fn open(st: &crate::state::State) -> crate::error::R<Replication> {
        let mirrors = open_mirrors(st).await?;
        let mirrors_of = st.map.mirrors_of(st.id);
        // Taken whether or not there are mirrors now: it describes this start only.
        let stopped = take_clean_stop(&st.meta)?;
        let log = (!mirrors_of.is_empty()).then(|| match stopped {
            Some((incarnation, last)) => {
                tracing::info!(
                    "stopped cleanly at position {last} of incarnation {incarnation:x}: going on from there (mirrors \
                     that hold it need no resync)"
                );
                Arc::new(ReplLog::resume(&mirrors_of, incarnation, last))
            }
            None => Arc::new(ReplLog::new(&mirrors_of)),
        });
        if let Some(l) = &log {
            st.meta.set_replication(l.clone());
            st.data.set_replication(l.clone());
            tracing::info!("mirrored on servers {mirrors_of:?} (incarnation {:x})", l.incarnation);
        }
        let crashed = log.is_some() && stopped.is_none();
        Ok(Replication { log, mirrors: parking_lot::RwLock::new(mirrors), crashed, ..Default::default() })
    }

    /// The replication of a server standing by to take its slot back (`rejoin.rs`): no log
    /// (it serves nothing), the mirrors it keeps of other slots, and its own stores as the
    /// mirror of its slot, which the copy serving the slot resynchronises.
    pub async fn open_standby(st: &crate::state::State) -> crate::error::R<Replication> {
        let mut mirrors = open_mirrors(st).await?;
        let own = Mirror::over(st.id, st.data_dir.clone(), st.meta.clone(), st.data.clone(), st.replies.clone())?;
        mirrors.insert(st.id, Arc::new(own));
        Ok(Replication { log: None, mirrors: parking_lot::RwLock::new(mirrors), ..Default::default() })
    }

    /// At a clean stop, once no request runs and nothing else will change the stores:
    /// record where the log ends (`key::CLEAN_STOP`), if every mirror in sync has applied
    /// all of it, so that the next start goes on with this incarnation and those mirrors
    /// need no resync. Otherwise nothing is recorded (the next start draws a new
    /// incarnation and resyncs them, as after a crash). Blocks.
    pub fn record_clean_stop(&self, meta: &crate::store::meta::MetaStore) -> crate::error::R<bool> {
        let Some(log) = &self.log else { return Ok(false) };
        let last = log.last();
        if !log.is_acked(last) {
            return Ok(false);
        }
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&log.incarnation.to_be_bytes());
        v[8..].copy_from_slice(&last.to_be_bytes());
        meta.put_local(crate::store::meta::key::CLEAN_STOP, Some(&v))?;
        meta.sync_wal()?;
        tracing::info!("stopped cleanly at position {last} of incarnation {:x}", log.incarnation);
        Ok(true)
    }

    /// The replication of a slot served from a mirror copy after a failover: its log, for
    /// the mirrors the map gives it now (and, later, the slot's own server standing by:
    /// `rejoin.rs`, so there is a log even with no mirror now), and no mirrors of other
    /// slots (those stayed with the dead server's process).
    pub fn open_promoted(st: &crate::state::State) -> Replication {
        let log = Arc::new(ReplLog::new(&st.map.mirrors_of(st.id)));
        st.meta.set_replication(log.clone());
        st.data.set_replication(log.clone());
        Replication { log: Some(log), ..Default::default() }
    }

    /// The mirror of `slot` this server keeps, if any.
    pub fn mirror(&self, slot: ServerId) -> Option<Arc<Mirror>> {
        self.mirrors.read().get(&slot).cloned()
    }

    /// The slots this server keeps mirrors of.
    pub fn mirror_slots(&self) -> Vec<ServerId> {
        let mut v: Vec<ServerId> = self.mirrors.read().keys().copied().collect();
        v.sort();
        v
    }

    /// Stop keeping the mirror of `slot` (to serve it): it takes no more changes.
    pub fn take_mirror(&self, slot: ServerId) -> Option<Arc<Mirror>> {
        self.mirrors.write().remove(&slot)
    }

    /// Keep the mirror of `slot` again (a promotion that did not happen).
    pub fn give_back(&self, slot: ServerId, mirror: Arc<Mirror>) {
        self.mirrors.write().insert(slot, mirror);
    }

    /// Wait until what a reply or a step to another server may depend on is held by every
    /// mirror in sync: the request's own last change, or (for a request that changed
    /// nothing) everything appended so far, since it may have read it. False when the server
    /// stops first: the reply or step must not go.
    pub async fn settle(&self, own_last: u64) -> bool {
        match &self.log {
            Some(log) => {
                let pos = if own_last > 0 { own_last } else { log.last() };
                let applied = log.is_acked(pos) || log.wait_acked(pos).await;
                // Changes piling up for a mirror being resynchronised: the writer slows down
                // so that the resync can finish (`ReplLog::resync_delay`).
                if let Some(delay) = log.resync_delay().filter(|_| applied && own_last > 0) {
                    tokio::time::sleep(delay).await;
                }
                applied
            }
            None => true,
        }
    }
}

/// The mirrors `st` keeps of other slots as its map says, opened (created if new).
async fn open_mirrors(st: &crate::state::State) -> crate::error::R<HashMap<ServerId, Arc<Mirror>>> {
    let slots = st.map.mirrored_by(st.id);
    let dir = st.data_dir.clone();
    tokio::task::spawn_blocking(move || -> crate::error::R<HashMap<ServerId, Arc<Mirror>>> {
        slots.into_iter().map(|s| Mirror::open(&dir, s).map(|m| (s, Arc::new(m)))).collect()
    })
    .await
    .map_err(|e| crate::error::Fail::new(shoal_proto::Errno::EIO, format!("opening mirrors: {e}")))?
}

/// Refuse to serve a store made just now when a mirror of this slot holds changes of it:
/// the server's data directory was lost (a disk wiped and the server started again), and
/// serving the empty store would show an empty slot and resynchronise the mirrors to it,
/// erasing what they hold. The slot fails over to the mirror instead, once the map marks
/// this server down (docs/failover.md). Mirrors that do not answer cannot tell: a new
/// cluster starts its servers one after the other.
pub async fn refuse_empty_over_mirrors(st: &crate::state::State) -> anyhow::Result<()> {
    use shoal_proto::msg::{Cred, Op, Reply};
    let Some(log) = &st.replica.log else { return Ok(()) };
    let root = Cred::root();
    for mirror in log.mirrors().into_keys() {
        // The same empty batch a shipper probes with: the mirror says what it holds.
        let op = Op::PeerReplicate { slot: st.id, incarnation: log.incarnation, first: 1, changes: Vec::new() };
        let asked = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            crate::rejoin::pool_to(st, mirror).request(mirror, &root, op, bytes::Bytes::new()),
        );
        if let Ok(Ok((Reply::Replicated { applied, incarnation, .. }, _))) = asked.await {
            if applied > 0 && incarnation != log.incarnation {
                anyhow::bail!(
                    "the data directory {} is new, but server {mirror} holds a mirror of this server's stores                      ({applied} changes): not serving an empty copy over it. The slot fails over to that mirror                      once the map marks this server down; to start afresh, remove this server from the map first",
                    st.data_dir.display()
                );
            }
        }
    }
    Ok(())
}

/// The mirror of `slot` this server keeps, or `EINVAL` naming both (a peer's request for a
/// mirror kept elsewhere: its map is not this server's).
pub fn mirror_of(st: &crate::state::State, slot: ServerId) -> crate::error::R<Arc<Mirror>> {
    st.replica.mirror(slot).ok_or_else(|| {
        crate::error::Fail::new(
            shoal_proto::Errno::EINVAL,
            format!("server {} keeps no mirror of server {slot}", st.id),
        )
    })
}

/// The mirrors of `st`'s slot and how far each has got, for `Status` (docs/resync.md).
pub fn mirror_status(st: &crate::state::State) -> Vec<shoal_proto::msg::MirrorStatus> {
    use shoal_proto::msg::{MirrorStatus, MirrorSync};
    let Some(log) = &st.replica.log else { return Vec::new() };
    log.mirrors()
        .into_iter()
        .map(|(server, p)| MirrorStatus {
            server,
            state: match p.state {
                log::MirrorState::InSync => MirrorSync::InSync,
                log::MirrorState::Resyncing => MirrorSync::Resyncing,
                log::MirrorState::OutOfSync => MirrorSync::OutOfSync,
            },
            applied: p.applied,
            resync_done_bytes: p.resync_done,
            resync_total_bytes: p.resync_total,
            resync_shipped_bytes: p.resync_shipped,
            resyncs: p.resyncs,
        })
        .collect()
}

/// The incarnation and last position a clean stop left, taken out of the store for good
/// before anything changes: durably (synced), since a start that crashes must not be
/// continued by the next (its changes after `last` may differ from what a mirror applied
/// under the same positions). Blocks (once, at start).
fn take_clean_stop(meta: &crate::store::meta::MetaStore) -> crate::error::R<Option<(u64, u64)>> {
    use crate::store::meta::key::CLEAN_STOP;
    let Some(v) = meta.get_raw(CLEAN_STOP)? else { return Ok(None) };
    meta.put_local(CLEAN_STOP, None)?;
    meta.sync_wal()?;
    Ok(match <[u8; 16]>::try_from(v.as_slice()) {
        Ok(b) => Some((
            u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            u64::from_be_bytes(b[8..].try_into().expect("8 bytes")),
        )),
        Err(_) => {
            tracing::warn!("a clean-stop record of {} bytes (16 expected): ignored", v.len());
            None
        }
    })
}

/// Start shipping this slot's log to each of its mirrors (the slot's own server standing by
/// is shipped by `ship::home_loop`, `rejoin.rs`), as the server begins to serve.
pub fn start_shippers(st: &Arc<crate::state::State>) {
    *st.replica.shippers.lock() = Some(HashMap::new());
    ship_to_map_mirrors(st);
}

/// Stop every shipper (the server stops serving).
pub fn stop_shippers(st: &crate::state::State) {
    if let Some(tasks) = st.replica.shippers.lock().take() {
        for t in tasks.into_values() {
            t.abort();
        }
    }
}

/// Ship to the mirrors the map gives this slot now, and to no other: a newer map may add one
/// (a slot being moved: its destination, `moves.rs`; a slot that moved: the processes after
/// its new host), which is resynchronised first, or drop one. Nothing before the server
/// serves (`start_shippers`).
fn ship_to_map_mirrors(st: &Arc<crate::state::State>) {
    let Some(log) = &st.replica.log else { return };
    let mut guard = st.replica.shippers.lock();
    let Some(tasks) = guard.as_mut() else { return };
    let want = st.map.get().mirrors_of(st.id);
    for m in log.mirrors().into_keys().filter(|m| *m != st.id && !want.contains(m)) {
        tracing::info!("server {}: server {m} is no longer a mirror of this slot", st.id);
        log.remove_mirror(m);
        if let Some(t) = tasks.remove(&m) {
            t.abort();
        }
    }
    for m in want {
        if log.add_mirror(m) {
            tracing::info!("server {}: server {m} is a new mirror of this slot: resynchronising it", st.id);
        }
        tasks.entry(m).or_insert_with(|| tokio::spawn(ship::ship_loop(st.clone(), log.clone(), m)));
    }
}

/// A newer map: ship to the mirrors it gives this slot, and (for a server's own process)
/// keep the mirrors it gives this server.
pub fn follow_map(st: &Arc<crate::state::State>) {
    if !st.rejoin.standby {
        ship_to_map_mirrors(st);
    }
    if st.failover.host.is_none() {
        tokio::spawn(keep_mirrors(st.clone()));
    }
}

/// Keep the mirrors the map gives this server: open (make) the new ones; close and delete
/// those it no longer gives, unless this process serves that slot (or is taking it over).
async fn keep_mirrors(st: Arc<crate::state::State>) {
    // A mirror dropped while a batch still held its stores is kept and dropped again a
    // second later (else its directory would stay until some later map).
    while keep_mirrors_once(&st).await && st.stop.borrow().is_none() {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// One round of [`keep_mirrors`]; true if a mirror to drop was still held.
async fn keep_mirrors_once(st: &Arc<crate::state::State>) -> bool {
    let _one = st.replica.keeping.lock().await;
    let mut again = false;
    let map = st.map.get();
    let wanted: Vec<ServerId> = map.mirrored_by(st.id).into_iter().filter(|&s| s != st.id).collect();
    let serving = |s: ServerId| {
        map.serving_process(s) == st.id
            || st.failover.served().contains(&s)
            || st.failover.promoting.lock().contains(&s)
    };
    for slot in wanted.iter().copied().filter(|&s| st.replica.mirror(s).is_none() && !serving(s)) {
        let dir = st.data_dir.clone();
        match tokio::task::spawn_blocking(move || Mirror::open(&dir, slot)).await {
            Ok(Ok(m)) => {
                tracing::info!("server {}: keeping a mirror of server {slot} from now on", st.id);
                st.replica.give_back(slot, Arc::new(m));
            }
            Ok(Err(e)) => tracing::warn!("server {}: cannot open a mirror of server {slot}: {e}", st.id),
            Err(e) => tracing::warn!("server {}: opening a mirror of server {slot}: {e}", st.id),
        }
    }
    for slot in st.replica.mirror_slots().into_iter().filter(|&s| s != st.id && !wanted.contains(&s) && !serving(s)) {
        let Some(m) = st.replica.take_mirror(slot) else { continue };
        // A batch being applied holds the mirror: its stores close once it is done.
        let mut m = m;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let closed = loop {
            match Arc::try_unwrap(m) {
                Ok(inner) => {
                    drop(inner);
                    break true;
                }
                Err(still) if tokio::time::Instant::now() < deadline => {
                    m = still;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(still) => {
                    st.replica.give_back(slot, still);
                    again = true;
                    break false;
                }
            }
        };
        let dir = mirror::dir_of(&st.data_dir, slot);
        if closed {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::info!("server {}: no longer a mirror of server {slot}: removed {}", st.id, dir.display())
                }
                Err(e) => tracing::warn!("server {}: removing the old mirror {}: {e}", st.id, dir.display()),
            }
        }
    }
    again
}
