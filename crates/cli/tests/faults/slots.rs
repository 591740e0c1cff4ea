//! Slots outnumbering servers, and servers joining a running cluster (docs/membership.md,
//! "Moving slots"), on real clusters: every slot is served by the server it lives on, a
//! server added with `shoal server add` takes its share of whole slots with
//! `shoal server rebalance` while clients keep working, and nothing is lost or changed.

use shoal_client::{Client, OpenFlags};
use shoal_placement::ClusterMap;
use shoal_testkit::{check_files, pattern, write_files, Cluster};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A client that writes a file and reads it back, in turn, until finished: any error it
/// meets is kept (the first five).
struct Worker {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    errors: Arc<std::sync::Mutex<Vec<String>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Worker {
    fn start(client: Client) -> Worker {
        let stop = Arc::new(AtomicBool::new(false));
        let (rounds, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(std::sync::Mutex::new(Vec::new())));
        let (stop2, rounds2, errors2) = (stop.clone(), rounds.clone(), errors.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let mut i = 0u64;
                while !stop2.load(Ordering::SeqCst) {
                    let path = format!("/d/live{i}");
                    let data = pattern(1000 + i, 0, 20_000);
                    let r: Result<(), String> = async {
                        let f = client.create(&path, 0o644, None).await.map_err(|e| format!("create {path}: {e}"))?;
                        f.write_at(0, &data).await.map_err(|e| format!("write {path}: {e}"))?;
                        f.close().await.map_err(|e| format!("close {path}: {e}"))?;
                        let f = client
                            .open(&path, OpenFlags::read_only())
                            .await
                            .map_err(|e| format!("open {path}: {e}"))?;
                        let got = f.read_at(0, data.len()).await.map_err(|e| format!("read {path}: {e}"))?;
                        if got[..] != data[..] {
                            return Err(format!("{path}: read back other bytes"));
                        }
                        Ok(())
                    }
                    .await;
                    if let Err(e) = r {
                        let mut errors = errors2.lock().unwrap();
                        if errors.len() < 5 {
                            errors.push(e);
                        }
                    }
                    rounds2.fetch_add(1, Ordering::SeqCst);
                    i += 1;
                }
            })
        });
        Worker { stop, rounds, errors, thread }
    }

    /// Stop once it did a few more rounds (the cluster serves it as changed), and check
    /// that it met no error and did work.
    fn finish(self) {
        let (at, start) = (self.rounds.load(Ordering::SeqCst), Instant::now());
        // At least five rounds in all: a worker held up by the failover may have done none yet.
        let want = (at + 3).max(5);
        while self.rounds.load(Ordering::SeqCst) < want && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap();
        let errors = self.errors.lock().unwrap().clone();
        assert!(errors.is_empty(), "client errors during the moves: {errors:?}");
        assert!(self.rounds.load(Ordering::SeqCst) >= 5, "the worker hardly ran");
    }
}

/// Wait until every slot of the servers' newest map has an address and is up.
async fn all_slots_served(client: &Client) -> ClusterMap {
    let start = Instant::now();
    loop {
        let _ = client.refresh_map().await;
        let map = client.map();
        if map.servers.iter().all(|e| !e.addr.is_empty() && e.state == shoal_placement::map::ServerState::Up) {
            return (*map).clone();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "slots not all served: {:?}", map.servers);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_joining_server_takes_whole_slots_while_clients_work_and_nothing_changes() {
    join_under_load(1);
}

/// With a mirror of every slot: the mirror sets change with every move (a slot's mirrors are
/// the servers after the one it lives on), and every copy is resynchronised as it must.
#[test]
fn with_replicas_a_joining_server_takes_whole_slots_and_the_mirrors_follow() {
    join_under_load(2);
}

fn join_under_load(replicas: u8) {
    let mut cluster = Cluster::start_with(2, |m| {
        m.add_spare_slots(6);
        m.cluster.replicas = replicas;
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = cluster.client();
    let map = rt.block_on(all_slots_served(&client));
    assert_eq!(map.slots_on(shoal_proto::ServerId(0)).len(), 3);
    assert_eq!(map.slots_on(shoal_proto::ServerId(1)).len(), 3);

    let want = rt.block_on(write_files(&client, 24));

    // Clients keep working through the moves: one writes and reads back a file in turn.
    let worker = Worker::start(cluster.client());

    // A third server joins and takes its share: 6 slots over 3 servers, 2 each.
    let port = shoal_testkit::free_ports(1)[0];
    let dir = cluster.path().join("s6");
    let (code, out, err) = cluster.shoal(&[
        "server",
        "add",
        "6",
        "--addr",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "server add: {out}{err}");
    cluster.start_joined(6);
    let (code, out, err) = cluster.shoal(&["server", "rebalance", "--dry-run", "--json"]);
    assert_eq!(code, 0, "rebalance --dry-run: {out}{err}");
    let planned: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(planned.as_array().unwrap().len(), 2, "{out}");
    let (code, out, err) = cluster.shoal(&["server", "rebalance", "--json", "--wait-secs", "120"]);
    assert_eq!(code, 0, "rebalance: {out}{err}\n{}\n{}\n{}", cluster.log(0), cluster.log(1), cluster.log(6));
    let moved: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(moved.as_array().unwrap().len(), 2, "{out}");
    let (code, out, _) = cluster.shoal(&["server", "rebalance", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(out.contains("balanced"), "{out}");
    // `shoal status` answers for every slot, and says where each lives.
    let (code, out, err) = cluster.shoal(&["status"]);
    assert_eq!(code, 0, "status: {out}{err}");
    let on_s6 = out.lines().filter(|l| !l.starts_with("mirror") && l.ends_with("on s6")).count();
    assert_eq!(on_s6, 2, "{out}");

    worker.finish();

    // Every byte is where it was, read by a new client through the new map.
    let fresh = cluster.client();
    rt.block_on(async {
        let map = all_slots_served(&fresh).await;
        for p in [0, 1, 6] {
            // Server 6's own entry holds nothing (`placed = false`): not a slot of the data.
            let held = map.slots_on(shoal_proto::ServerId(p)).into_iter().filter(|&s| map.server(s).unwrap().placed);
            assert_eq!(held.count(), 2, "server {p}: {:?}", map.servers);
        }
        check_files(&fresh, &want).await;
    });
    // The old hosts dropped their copies of the slots that left them, unless they are
    // still mirrors of them.
    let now = rt.block_on(async {
        let _ = fresh.refresh_map().await;
        (*fresh.map()).clone()
    });
    for m in moved.as_array().unwrap() {
        let (slot, from) = (m["slot"].as_u64().unwrap(), m["from"].as_u64().unwrap());
        let copy = cluster.path().join(format!("s{from}")).join(format!("mirror-{slot}"));
        let mirror = now.mirrors_of(shoal_proto::ServerId(slot as u32)).contains(&shoal_proto::ServerId(from as u32));
        // Removed once its stores closed (at once with one copy; a mirror keeps it).
        let start = Instant::now();
        while copy.exists() != mirror && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(copy.exists(), mirror, "{}: mirror of the slot now: {mirror}", copy.display());
    }
}

/// A server restarted at once after `kill -9`, before the failure detector takes it for dead,
/// does not serve the slots living on it from stores that may hold a change it never
/// acknowledged (a client's retry of that request would be applied twice): it marks them
/// down, their mirrors serve them from then on, and nothing written before is lost
/// (docs/failover.md, "The slots living on it too").
#[test]
fn a_host_restarted_after_a_crash_hands_the_slots_living_on_it_to_their_mirrors() {
    let mut cluster = Cluster::start_with(3, |m| {
        m.add_spare_slots(6);
        m.cluster.replicas = 2;
        // Only the restart hands anything off: the detector would wait two minutes.
        m.membership.down_after_ms = 120_000;
        m.membership.refused_down_after_ms = 0;
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = cluster.client();
    let before = rt.block_on(all_slots_served(&client));
    let hosted: Vec<_> = before.slots_on(shoal_proto::ServerId(1)).into_iter().filter(|s| s.0 != 1).collect();
    assert_eq!(hosted.len(), 1, "{:?}", before.servers);
    let want = rt.block_on(write_files(&client, 12));

    cluster.kill9(1);
    cluster.restart(1);
    let fresh = cluster.client();
    let start = Instant::now();
    let after = loop {
        let map = rt.block_on(all_slots_served(&fresh));
        let moved = hosted.iter().all(|&s| map.server(s).unwrap().host == Some(before.mirrors_of(s)[0].0));
        if moved {
            break map;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "not handed off: {:?}\n{}", map.servers, cluster.log(1));
        std::thread::sleep(Duration::from_millis(200));
    };
    for &s in &hosted {
        assert_eq!(after.server(s).unwrap().served_by, None, "{:?}", after.servers);
    }
    assert!(cluster.log(1).contains("living here are marked down"), "{}", cluster.log(1));
    rt.block_on(check_files(&fresh, &want));
    // Clients go on writing everywhere, the moved slots included.
    let more = rt.block_on(async {
        let mut more = Vec::new();
        for i in 0..12u64 {
            let path = format!("/d/after{i}");
            let data = pattern(500 + i, 0, 30_000);
            let f = fresh.create(&path, 0o644, None).await.unwrap();
            f.write_at(0, &data).await.unwrap();
            f.close().await.unwrap();
            more.push((path, data));
        }
        more
    });
    rt.block_on(check_files(&cluster.client(), &more));
}

/// `shoal server drain`: a running server's slots move off it, its own last, while clients
/// keep working; it leaves the map group's voters and stops, and will not serve again.
#[test]
fn a_drained_server_hands_every_slot_over_while_clients_work_then_leaves_and_stays_out() {
    let mut cluster = Cluster::start_with(3, |m| {
        m.add_spare_slots(6);
        m.cluster.replicas = 2;
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = cluster.client();
    rt.block_on(all_slots_served(&client));
    let want = rt.block_on(write_files(&client, 18));
    let worker = Worker::start(cluster.client());

    // Server 0 is a voter (the first three are): draining it changes the voters too.
    let (code, out, err) = cluster.shoal(&["server", "drain", "0", "--json", "--wait-secs", "120"]);
    assert_eq!(code, 0, "drain: {out}{err}\n{}\n{}\n{}", cluster.log(0), cluster.log(1), cluster.log(2));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let moves = report["moves"].as_array().unwrap();
    assert_eq!(moves.len(), 2, "its own slot and the one living on it: {out}");
    assert_eq!(moves.last().unwrap()["slot"], 0, "its own slot last: {out}");
    // Its shoald stops by itself, cleanly.
    let status = cluster.wait_exit_status(0, Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "server 0 did not stop cleanly: {status:?}\n{}", cluster.log(0));
    worker.finish();
    // Server 0 mirrored slot 2: it kept that copy until server 1, which replaces it, was in
    // sync, so slot 2 never had fewer copies in sync.
    let synced = first_logged(&cluster.log(2), "mirror s1 of server s2 is in sync again");
    let dropped = first_logged(&cluster.log(0), "server s0: no longer a mirror of server s2");
    assert!(
        synced.is_some() && dropped.is_some() && synced < dropped,
        "server 0 dropped its copy of slot 2 at {dropped:?}, its replacement was in sync at {synced:?}\n{}\n{}",
        cluster.log(0),
        cluster.log(2)
    );

    let fresh = cluster.client();
    rt.block_on(async {
        let map = all_slots_served(&fresh).await;
        assert_eq!(map.processes().map(|p| p.id).collect::<Vec<_>>(), vec![1, 2], "{:?}", map.servers);
        assert_eq!(map.slots_on(shoal_proto::ServerId(1)).len() + map.slots_on(shoal_proto::ServerId(2)).len(), 6);
        assert_eq!(map.slots_on(shoal_proto::ServerId(1)).len(), 3, "{:?}", map.servers);
        check_files(&fresh, &want).await;
    });
    // The group's voters left it out, and `shoal status` answers for every slot.
    let (code, out, err) = cluster.shoal(&["map", "show", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!shown["voters"].as_array().unwrap().contains(&serde_json::json!(0)), "{out}");
    let (code, out, err) = cluster.shoal(&["status"]);
    assert_eq!(code, 0, "status: {out}{err}");
    // Started again, it refuses: its stores are an old copy of a slot that lives elsewhere.
    cluster.spawn_with_env(0, &[]);
    let status = cluster.wait_exit_status(0, Duration::from_secs(30));
    assert!(status.is_some_and(|s| !s.success()), "a drained server started again: {status:?}");
    assert!(cluster.log(0).contains("was drained or removed"), "{}", cluster.log(0));
    // Nothing moves to it, and it cannot be drained again.
    let (code, _, err) = cluster.shoal(&["server", "drain", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("slot living on server"), "{err}");
}

/// `shoal server remove`: a server gone for good (killed, its disk lost) leaves the map; the
/// copies that took its slot over keep it and get new mirrors; an up server is refused.
#[test]
fn a_removed_server_leaves_its_slot_to_the_copy_that_took_it_over_and_stays_out() {
    let mut cluster = Cluster::start_with(3, |m| m.cluster.replicas = 2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = cluster.client();
    let want = rt.block_on(write_files(&client, 12));

    let (code, _, err) = cluster.shoal(&["server", "remove", "2"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("drain it instead"), "{err}");

    let worker = Worker::start(cluster.client());
    cluster.kill9(2);
    // The failover: server 2's slot served by its mirror, server 0.
    let start = Instant::now();
    loop {
        let _ = rt.block_on(client.refresh_map());
        if client.map().server(shoal_proto::ServerId(2)).is_some_and(|e| e.served_by.is_some()) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no failover: {:?}", client.map().servers);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, out, err) = cluster.shoal(&["server", "remove", "2", "--json"]);
    assert_eq!(code, 0, "remove: {out}{err}\n{}\n{}", cluster.log(0), cluster.log(1));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["slot_on"], 0, "{out}");
    worker.finish();

    let fresh = cluster.client();
    rt.block_on(async {
        let map = all_slots_served(&fresh).await;
        assert_eq!(map.processes().map(|p| p.id).collect::<Vec<_>>(), vec![0, 1]);
        let e = map.server(shoal_proto::ServerId(2)).unwrap();
        assert_eq!((e.host, e.served_by), (Some(0), None));
        check_files(&fresh, &want).await;
    });
    // Its slot's new mirror (server 1) is resynchronised: in sync, and no longer behind.
    let start = Instant::now();
    loop {
        let _ = rt.block_on(fresh.refresh_map());
        let map = fresh.map();
        let synced = rt.block_on(fresh.server_status(shoal_proto::ServerId(2))).is_ok_and(|s| {
            s.mirrors
                .iter()
                .any(|m| m.server == shoal_proto::ServerId(1) && m.state == shoal_proto::msg::MirrorSync::InSync)
        });
        if synced && map.server(shoal_proto::ServerId(2)).is_some_and(|e| e.behind.is_empty()) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the new mirror is not in sync: {:?}", map.servers);
        std::thread::sleep(Duration::from_millis(200));
    }
    // Its disk comes back: it refuses to serve the old copy.
    cluster.spawn_with_env(2, &[]);
    let status = cluster.wait_exit_status(2, Duration::from_secs(30));
    assert!(status.is_some_and(|s| !s.success()), "a removed server started again: {status:?}");
    assert!(cluster.log(2).contains("was drained or removed"), "{}", cluster.log(2));
}

/// When a server's log first says `needle`: the line's timestamp (RFC 3339, which sorts as
/// text).
fn first_logged(log: &str, needle: &str) -> Option<String> {
    log.lines().find(|l| l.contains(needle)).and_then(|l| l.split_whitespace().next()).map(str::to_string)
}
