//! This server's member of the replicated cluster map (`shoal-membership`,
//! docs/membership.md): starting it with the map file, carrying its messages as
//! `Op::PeerRaft` on the peer pool, answering them and `GetMap`, and following each map the
//! group applies (the state's [`crate::map_cell::MapCell`] and the peer pool).

use crate::error::{fail, R};
use crate::state::State;
use bytes::Bytes;
use futures::future::BoxFuture;
use shoal_membership::{MapDoc, MapGroup, RaftTransport, Undelivered};
use shoal_placement::ClusterMap;
use shoal_proto::hello::FEATURE_MEMBERSHIP;
use shoal_proto::msg::{Cred, Op, Reply};
use shoal_proto::{Errno, ServerId};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// The group's messages over the server's peer pool.
struct PeerTransport {
    state: Arc<OnceLock<Weak<State>>>,
}

impl RaftTransport for PeerTransport {
    fn call(
        &self,
        target: u32,
        kind: u8,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Vec<u8>, Undelivered>> {
        let st = self.state.get().and_then(Weak::upgrade);
        Box::pin(async move {
            let st = st.ok_or_else(|| Undelivered::other("this server is stopping"))?;
            let server = ServerId(target);
            // The member of a server standing by is at its home (`rejoin.rs`); the failure
            // detector's ping goes where the slot is served (a slot served from a copy is
            // alive).
            let pool = if kind == shoal_membership::network::KIND_PING {
                &st.pool
            } else {
                crate::rejoin::pool_to(&st, server)
            };
            // Where the message goes, said in every failure: a route gone stale shows.
            let at = pool.map().server(server).map_or_else(|| "no address".to_string(), |e| e.addr.clone());
            let failed =
                |e: shoal_rpc::CallError| Undelivered { reason: format!("{e} (at {at})"), refused: e.is_refused() };
            let exchange = async {
                // An older server would close the connection on a message it cannot decode.
                let features = pool.features(server).await.map_err(failed)?;
                if features & FEATURE_MEMBERSHIP == 0 {
                    return Err(Undelivered::other(format!(
                        "server {target} does not know the replicated map (an older version)"
                    )));
                }
                let op = Op::PeerRaft { kind, payload };
                match pool.request(server, &Cred::root(), op, Bytes::new()).await {
                    Ok((Reply::Raft { payload }, _)) => Ok(payload),
                    Ok((other, _)) => Err(Undelivered::other(format!(
                        "server {target} answered a Raft message with {}",
                        reply_name(&other)
                    ))),
                    Err(e) => Err(failed(e)),
                }
            };
            match tokio::time::timeout(timeout, exchange).await {
                Ok(r) => r,
                Err(_) => Err(Undelivered::other(format!("server {target} at {at}: no answer within {timeout:?}"))),
            }
        })
    }
}

fn reply_name(r: &Reply) -> String {
    let s = format!("{r:?}");
    s.split([' ', '(', '{']).next().unwrap_or_default().to_string()
}

/// Start this server's member of the group, with the map file as the initial document, and
/// keep `st` following the maps it applies. `state_cell` is how the transport reaches the
/// state (set once the state exists).
pub async fn start(
    st: &Arc<State>,
    state_cell: Arc<OnceLock<Weak<State>>>,
    config: &Path,
    data_dir: &Path,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| anyhow::anyhow!("cannot read cluster config {}: {e}", config.display()))?;
    let initial = MapDoc::new(text).map_err(|e| anyhow::anyhow!("cluster config {}: {e}", config.display()))?;
    let voters = st.map.voters();
    let learners: Vec<u32> = st.map.processes().map(|s| s.id).filter(|id| !voters.contains(id)).collect();
    let transport = Arc::new(PeerTransport { state: state_cell });
    let group = MapGroup::start(st.id.0, &voters, &learners, &data_dir.join("raft"), initial, transport).await?;
    let base: PathBuf = config.parent().unwrap_or(Path::new(".")).to_path_buf();
    // The group's map may be newer than the file (changed while this server was away).
    follow(st, &group.current(), &base);
    let mut docs = group.watch();
    let weak = Arc::downgrade(st);
    if st.membership.set(group).is_err() {
        anyhow::bail!("the map group was started twice");
    }
    tokio::spawn(rejoin_loop(weak.clone(), base.clone()));
    tokio::spawn(async move {
        while docs.changed().await.is_ok() {
            let doc = docs.borrow_and_update().clone();
            let Some(st) = weak.upgrade() else { return };
            follow(&st, &doc, &base);
        }
    });
    Ok(())
}

/// Keep `st` (a slot served here from a mirror copy, `failover.rs`) following the maps
/// `group` (its host's member) applies.
pub fn follow_group(st: &Arc<State>, group: &MapGroup, base: PathBuf) {
    let mut docs = group.watch();
    follow(st, &group.current(), &base);
    let weak = Arc::downgrade(st);
    tokio::spawn(async move {
        while docs.changed().await.is_ok() {
            let doc = docs.borrow_and_update().clone();
            let Some(st) = weak.upgrade() else { return };
            follow(&st, &doc, &base);
        }
    });
}

/// Route by `doc` from now on, if it is newer than the map in use.
fn follow(st: &Arc<State>, doc: &MapDoc, base: &Path) {
    if doc.version <= st.map.version() {
        return;
    }
    match ClusterMap::from_toml(&doc.toml, base) {
        Ok(map) => follow_map(st, map),
        // The group checked it when it was proposed; a map this build cannot read (from a
        // newer version) is reported and the old one kept.
        Err(e) => tracing::error!("cluster map version {} is not usable here: {e}", doc.version),
    }
}

/// Route by `map` (newer than the one in use), and act on what it says about failovers.
pub(crate) fn follow_map(st: &Arc<State>, map: ClusterMap) {
    if map.version() <= st.map.version() {
        return;
    }
    tracing::info!("cluster map version {} (was {})", map.version(), st.map.version());
    st.pool.set_map(map.clone());
    crate::rejoin::follow_map(st, &map);
    st.map.set(map);
    crate::replica::follow_map(st);
    crate::failover::on_map(st);
}

/// Answer a `PeerRaft` message.
pub async fn handle(st: &Arc<State>, kind: u8, payload: &[u8]) -> R<Reply> {
    // A slot served from a copy is alive: the failure detector's ping says so (without it,
    // the slot would be marked down again after its silence bound, although it serves).
    if st.failover.host.is_some() && kind == shoal_membership::network::KIND_PING {
        return Ok(Reply::Raft { payload: Vec::new() });
    }
    if let Some(host) = st.failover.host {
        return fail(
            Errno::EINVAL,
            format!(
                "server {} is served from server {host}'s copy since a failover: it has no member of the map group",
                st.id
            ),
        );
    }
    let Some(group) = st.membership.get() else {
        return fail(Errno::EAGAIN, "the map group is not started yet");
    };
    match group.handle(kind, payload).await {
        Ok(payload) => Ok(Reply::Raft { payload }),
        Err(m) => fail(Errno::EINVAL, m),
    }
}

/// Answer `GetMap`: the newest map this server has applied.
pub fn get_map(st: &State) -> Reply {
    match st.membership.get() {
        // The group's member may be behind the map this server routes by (learnt from the
        // other servers: `catch_up`): answer the newer.
        Some(g) if g.current().version >= st.map.version() => {
            let doc = g.current();
            let status = g.status();
            Reply::Map { version: doc.version, toml: doc.toml.clone(), leader: status.leader, voters: status.voters }
        }
        Some(g) => {
            let status = g.status();
            Reply::Map {
                version: st.map.version(),
                toml: st.map.to_toml(),
                leader: status.leader,
                voters: status.voters,
            }
        }
        None => Reply::Map { version: st.map.version(), toml: st.map.to_toml(), leader: None, voters: st.map.voters() },
    }
}

/// Answer `ProposeMap` (root only): change the map through the group.
pub async fn propose(st: &Arc<State>, cred: &Cred, expect_version: u64, toml: String) -> R<Reply> {
    if cred.uid != 0 {
        return fail(Errno::EPERM, "only root may change the cluster map");
    }
    let Some(group) = st.membership.get() else {
        return fail(Errno::EAGAIN, "the map group is not started yet");
    };
    match group.propose(expect_version, toml).await {
        Ok(_) => Ok(get_map(st)),
        Err(shoal_membership::ProposeError::Conflict { current }) => {
            fail(Errno::EAGAIN, format!("the map is at version {current} now, not {expect_version}: try again"))
        }
        Err(e @ shoal_membership::ProposeError::Invalid(_)) => fail(Errno::EINVAL, e.to_string()),
        Err(e) => fail(Errno::EIO, e.to_string()),
    }
}

/// At start, before serving: the newest map any other server holds (a server that was away
/// may have had its slot failed over, and must know before it answers anyone).
pub async fn catch_up_at_start(st: &Arc<State>, config: &Path) {
    let base = config.parent().unwrap_or(Path::new(".")).to_path_buf();
    let n = st.map.get().servers.len();
    for turn in 0..n {
        catch_up(st, &base, turn).await;
    }
}

/// Ask one other server (a different one each `turn`) for its map, and follow it if it is
/// newer. The group's messages may not reach this server: after a failover, its id's
/// address is the promoted copy's, so a server coming back learns the map this way (at
/// start, and while its member knows no leader).
async fn catch_up(st: &Arc<State>, base: &Path, turn: usize) {
    let map = st.map.get();
    let others: Vec<ServerId> = map.servers.iter().map(|s| s.server_id()).filter(|&s| s != st.id).collect();
    let Some(&peer) = others.get(turn % others.len().max(1)) else { return };
    ask_map(st, base, peer).await;
}

/// Ask the other servers, one after the other, for their map until one answers; follow it
/// if it is newer (a server standing by learns every map this way: `rejoin.rs`).
pub(crate) async fn catch_up_any(st: &Arc<State>, base: &Path) {
    let map = st.map.get();
    for peer in map.servers.iter().map(|s| s.server_id()).filter(|&s| s != st.id) {
        if ask_map(st, base, peer).await {
            return;
        }
    }
}

/// Ask `peer` for its map and follow it if it is newer; false if it did not answer.
async fn ask_map(st: &Arc<State>, base: &Path, peer: ServerId) -> bool {
    let op = Op::GetMap { known: st.map.version() };
    let root = Cred::root();
    let asked = tokio::time::timeout(REJOIN_EVERY, st.pool.request(peer, &root, op, Bytes::new()));
    let Ok(Ok((Reply::Map { version, toml, .. }, _))) = asked.await else { return false };
    if version > st.map.version() {
        match ClusterMap::from_toml(&toml, base) {
            Ok(m) => follow_map(st, m),
            Err(e) => tracing::warn!("server {peer} sent a map this server cannot use: {e}"),
        }
    }
    true
}

/// How often a server standing by asks for the newest map (it takes its slot back as soon
/// as the map says so: clients wait meanwhile).
const STANDBY_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// How often a server checks whether the map has it down.
const REJOIN_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// For the server's life: whenever the group's map has this server `down` (the leader's
/// failure detector marked it while it was dead, frozen or cut off) and the server is
/// serving, propose it `up` again. The detector never marks a server up itself: only the
/// server knows it is back.
async fn rejoin_loop(st: Weak<State>, base: PathBuf) {
    let mut turn = 0usize;
    loop {
        let standby = st.upgrade().is_some_and(|s| s.rejoin.standby);
        tokio::time::sleep(if standby { STANDBY_EVERY } else { REJOIN_EVERY }).await;
        let Some(st) = st.upgrade() else { return };
        // Stopped (to stand by, or handing the slot off): not this state's to mark up.
        if st.stop.borrow().is_some() {
            continue;
        }
        if standby {
            crate::rejoin::standby_tick(&st, &base).await;
            continue;
        }
        let Some(group) = st.membership.get() else { continue };
        turn += 1;
        // A member that knows no leader may be one the group no longer reaches (after a
        // failover its id's address is the promoted copy's): ask the other servers. Not
        // otherwise: the group's own messages bring every change, at no extra request.
        if group.status().leader.is_none() {
            catch_up(&st, &base, turn).await;
        }
        let doc = group.current();
        let Ok(mut map) = ClusterMap::from_toml(&doc.toml, &base) else { continue };
        let Some(me) = map.servers.iter_mut().find(|s| s.id == st.id.0) else { continue };
        // A slot that failed over is not this server's to mark up (`failover::on_map`).
        if me.state != shoal_placement::map::ServerState::Down || me.served_by.is_some() {
            continue;
        }
        me.state = shoal_placement::map::ServerState::Up;
        // Serving again: no longer gone for long (`ClusterMap::set_absent`).
        map.set_absent(st.id, false);
        map.cluster.version = doc.version + 1;
        match group.propose(doc.version, map.to_toml()).await {
            Ok(v) => tracing::info!("marked up again in the cluster map (version {v})"),
            Err(e) => tracing::debug!("cannot mark this server up yet: {e}"),
        }
    }
}
