//! Map groups of real members in one process, their messages passed in memory: elections,
//! proposals from any member, compare-and-set, and storage that survives a restart.

use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_membership::{MapDoc, MapGroup, ProposeError, RaftTransport, Undelivered};
use shoal_placement::map::ServerState;
use shoal_placement::ClusterMap;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Delivers each message to the target's group, unless the target is stopped or cut off.
#[derive(Default)]
struct Wires {
    groups: Mutex<HashMap<u32, MapGroup>>,
    cut: Mutex<HashSet<u32>>,
}

struct Wire {
    from: u32,
    wires: Arc<Wires>,
}

impl RaftTransport for Wire {
    fn call(
        &self,
        target: u32,
        kind: u8,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Vec<u8>, Undelivered>> {
        let cut = {
            let c = self.wires.cut.lock();
            c.contains(&target) || c.contains(&self.from)
        };
        let group = self.wires.groups.lock().get(&target).cloned();
        Box::pin(async move {
            match group {
                Some(g) if !cut => tokio::time::timeout(timeout, g.handle(kind, &payload))
                    .await
                    .map_err(|_| Undelivered::other("timed out"))?
                    .map_err(Undelivered::other),
                // A stopped member: as a dead process, whose host refuses connections.
                None if !cut => Err(Undelivered { reason: format!("server {target} refused"), refused: true }),
                _ => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Err(Undelivered::other(format!("server {target} unreachable")))
                }
            }
        })
    }
}

fn doc(n: u32, version: u64, tweak: impl Fn(&mut ClusterMap)) -> MapDoc {
    let mut m = ClusterMap::local(n, 7000, Path::new("/tmp"));
    m.cluster.version = version;
    tweak(&mut m);
    MapDoc::new(m.to_toml()).unwrap()
}

async fn start(wires: &Arc<Wires>, dir: &Path, id: u32, n: u32) -> MapGroup {
    let voters: Vec<u32> = (0..n.min(3)).collect();
    let learners: Vec<u32> = (n.min(3)..n).collect();
    let t = Arc::new(Wire { from: id, wires: wires.clone() });
    // A member just shut down lets go of its store when openraft's tasks have ended.
    let end = Instant::now() + Duration::from_secs(5);
    let g = loop {
        match MapGroup::start(id, &voters, &learners, &dir.join(format!("r{id}")), doc(n, 1, |_| {}), t.clone()).await {
            Ok(g) => break g,
            Err(e) if Instant::now() < end && e.to_string().contains("lock") => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    wires.groups.lock().insert(id, g.clone());
    g
}

async fn until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposals_from_any_member_reach_every_member_and_survive_the_leader() {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let dir = tempfile::tempdir().unwrap();
    let wires = Arc::new(Wires::default());
    let mut groups = Vec::new();
    for id in 0..4 {
        groups.push(start(&wires, dir.path(), id, 4).await);
    }
    let leader = until("a leader", 10, || groups[0].leader()).await;
    // From a learner (server 3): forwarded to the leader.
    let v = groups[3].propose(1, doc(4, 2, |m| m.servers[1].weight = 2.0).toml).await.unwrap();
    assert_eq!(v, 2);
    assert_eq!(groups[3].current().version, 2);
    for g in &groups {
        until("version 2 everywhere", 5, || (g.current().version == 2).then_some(())).await;
    }
    // Compare-and-set: a change made against version 1 is refused.
    assert_eq!(groups[1].propose(1, doc(4, 2, |_| {}).toml).await.unwrap_err(), ProposeError::Conflict { current: 2 });
    assert!(matches!(groups[1].propose(2, doc(4, 4, |_| {}).toml).await.unwrap_err(), ProposeError::Invalid(_)));
    // The leader cut off: the others elect another and go on.
    wires.cut.lock().insert(leader);
    let others: Vec<&MapGroup> = groups.iter().filter(|g| g.node() != leader && g.node() < 3).collect();
    until("a new leader", 10, || others[0].leader().filter(|&l| l != leader)).await;
    let v = others[0].propose(2, doc(4, 3, |_| {}).toml).await.unwrap();
    assert_eq!(v, 3);
    // The cut-off member cannot change the map (no quorum) and says so.
    let stale = groups[leader as usize].propose(3, doc(4, 4, |_| {}).toml).await;
    assert!(stale.is_err(), "{stale:?}");
    wires.cut.lock().clear();
    // Meanwhile the new leader's failure detector marked the silent old leader down.
    let marked = until("the old leader marked down", 10, || {
        let d = others[0].current();
        let down = d.map().unwrap().servers[leader as usize].state == ServerState::Down;
        down.then_some(d.version)
    })
    .await;
    assert!(marked >= 4);
    until("the old leader catches up", 10, || (groups[leader as usize].current().version >= marked).then_some(()))
        .await;
    let status = groups[0].status();
    assert_eq!(status.voters, vec![0, 1, 2]);
    assert_eq!(status.learners, vec![3]);
    for g in &groups {
        g.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_member_group_keeps_its_map_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let wires = Arc::new(Wires::default());
    let g = start(&wires, dir.path(), 0, 1).await;
    until("a leader", 10, || g.leader()).await;
    g.propose(1, doc(1, 2, |m| m.servers[0].weight = 3.0).toml).await.unwrap();
    g.shutdown().await;
    wires.groups.lock().clear();
    drop(g);
    // Started again with the old map file: the group's map wins.
    let g = start(&wires, dir.path(), 0, 1).await;
    assert_eq!(g.current().version, 2);
    assert_eq!(g.current().map().unwrap().servers[0].weight, 3.0);
    until("a leader again", 10, || g.leader()).await;
    assert_eq!(g.propose(2, doc(1, 3, |_| {}).toml).await.unwrap(), 3);
    g.shutdown().await;
}

/// A member that missed more changes than the log keeps (it was stopped) catches up from
/// the snapshot when it starts again: openraft purges entries a snapshot holds, and a batch
/// of thousands of whole maps would not fit in an append's 150 ms anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_far_behind_catches_up_from_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let wires = Arc::new(Wires::default());
    let mut groups = Vec::new();
    for id in 0..3 {
        groups.push(start(&wires, dir.path(), id, 3).await);
    }
    until("a leader", 10, || groups[0].leader()).await;
    // Stop a member that does not lead.
    let leader = groups[0].leader().unwrap();
    let away = (0..3).find(|&i| i != leader).unwrap();
    wires.groups.lock().remove(&away);
    groups[away as usize].shutdown().await;
    let from = (0..3).find(|&i| i != leader && i != away).unwrap();
    // More changes than two snapshots' worth (`SNAPSHOT_EVERY` is 1000 entries). The
    // leader's failure detector marks the stopped member down meanwhile, a change of its
    // own: a proposal that loses to it is made again on the newer map, as servers do.
    let mut version = groups[from as usize].current().version;
    let mut made = 0u64;
    while made < 2100 {
        let next = doc(3, version + 1, |m| m.servers[0].weight = 1.0 + (made % 7) as f64);
        match groups[from as usize].propose(version, next.toml).await {
            Ok(v) => {
                version = v;
                made += 1;
            }
            Err(ProposeError::Conflict { current }) => version = current,
            Err(e) => panic!("change {made} against version {version}: {e:?}"),
        }
    }
    let back = start(&wires, dir.path(), away, 3).await;
    until("the stopped member caught up", 30, || (back.current().version >= version).then_some(())).await;
    assert_eq!(back.current().map().unwrap().servers[0].weight, 1.0 + (2099 % 7) as f64);
    // Changes made against an old version lose without adding to the log: a proposer whose
    // member is behind, trying again at once, must not fill the log every member gets. (The
    // detector may add an entry or two meanwhile, marking the member up again.)
    let lead = groups.iter().find(|g| g.node() == leader).unwrap();
    let before = lead.status().last_log_index;
    for _ in 0..50 {
        let stale = back.propose(version - 5, doc(3, version - 4, |_| {}).toml).await.unwrap_err();
        assert!(matches!(stale, ProposeError::Conflict { current } if current >= version), "{stale:?}");
    }
    let added = lead.status().last_log_index.unwrap_or(0) - before.unwrap_or(0);
    assert!(added < 10, "50 stale proposals added {added} entries to the leader's log");
    for g in groups.iter().filter(|g| g.node() != away) {
        g.shutdown().await;
    }
    back.shutdown().await;
}
