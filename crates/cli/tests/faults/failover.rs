//! Failover (docs/failover.md) on real clusters with `[cluster] replicas = 2`: `kill -9` of
//! a server under a mixed workload; the map marks it down, its first mirror serves its slot
//! from its copy, clients retry there; no client sees an error, nothing acknowledged is lost,
//! and the longest pause of any operation is reported. The killed server, started again,
//! stands by, is resynchronised from the copy and takes its slot back, still under load
//! (docs/failover.md, "Rejoining").

use shoal_client::{Client, OpenFlags};
use shoal_proto::msg::LayoutSpec;
use shoal_testkit::{check_files, pattern, write_files, Cluster};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one worker's acknowledged operations left: path → bytes.
type Acked = BTreeMap<String, Vec<u8>>;

#[derive(Default)]
struct Outcome {
    acked: Acked,
    errors: Vec<String>,
    /// Renames and unlinks answered `ENOENT` although they happened: the known gap of
    /// docs/failover.md ("Not built yet"), a step spanning servers that the promoted copy's
    /// recovery finished while the client's retry found its source gone. Counted and
    /// printed, and each one checked to have really happened, so that it is told apart from
    /// any other error (which fails the test).
    replies_lost: Vec<String>,
    longest: Duration,
    ops: u64,
}

/// Whether `path` is gone (and, for a rename, `to` holds what `path` held): the operation
/// that answered `ENOENT` did happen.
async fn happened(client: &Client, path: &str, to: Option<(&str, &[u8])>) -> bool {
    let gone = matches!(client.stat(path).await, Err(e) if e.errno == shoal_proto::Errno::ENOENT);
    let moved = match to {
        None => true,
        Some((to, want)) => match client.open(to, OpenFlags::read_only()).await {
            Ok(f) => f.read_at(0, want.len() + 1).await.is_ok_and(|got| got[..] == want[..]),
            Err(_) => false,
        },
    };
    gone && moved
}

/// Until `stop`: create files (some striped over every server) and write them, read some
/// back, rename some, remove some; record every acknowledged outcome and every error.
async fn worker(client: Client, k: u32, stop: Arc<std::sync::atomic::AtomicBool>) -> Outcome {
    let mut out = Outcome::default();
    let dir = format!("/w{k}");
    let all = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(u32::MAX), ..Default::default() };
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        n += 1;
        let path = format!("{dir}/f{n}");
        let len = [100usize, 5000, 70_000, 300_000][(n % 4) as usize];
        let data = pattern(u64::from(k) * 1_000_000 + n, 0, len);
        let layout = n.is_multiple_of(3).then(|| all.clone());
        let t = Instant::now();
        let r: Result<(), String> = async {
            let f = client.create(&path, 0o644, layout).await.map_err(|e| format!("create {path}: {e}"))?;
            f.write_at(0, &data).await.map_err(|e| format!("write {path}: {e}"))?;
            f.close().await.map_err(|e| format!("close {path}: {e}"))?;
            Ok(())
        }
        .await;
        out.longest = out.longest.max(t.elapsed());
        out.ops += 1;
        match r {
            Ok(()) => {
                out.acked.insert(path.clone(), data);
            }
            Err(e) => {
                out.errors.push(e);
                continue;
            }
        }
        let t = Instant::now();
        let r: Result<(), String> = match n % 4 {
            // Read back the file made just before.
            0 => {
                async {
                    let prev = format!("{dir}/f{}", n - 1);
                    if let Some(want) = out.acked.get(&prev) {
                        let f = client
                            .open(&prev, OpenFlags::read_only())
                            .await
                            .map_err(|e| format!("open {prev}: {e}"))?;
                        let got = f.read_at(0, want.len()).await.map_err(|e| format!("read {prev}: {e}"))?;
                        if got[..] != want[..] {
                            return Err(format!("{prev}: read back {} bytes that differ", got.len()));
                        }
                    }
                    Ok(())
                }
                .await
            }
            1 => {
                let to = format!("{dir}/r{n}");
                match client.rename(&path, &to).await {
                    Ok(()) => {
                        let v = out.acked.remove(&path).unwrap();
                        out.acked.insert(to, v);
                        Ok(())
                    }
                    Err(e)
                        if e.errno == shoal_proto::Errno::ENOENT
                            && happened(&client, &path, Some((&to, &out.acked[&path]))).await =>
                    {
                        out.replies_lost.push(format!("rename {path}: {e}"));
                        let v = out.acked.remove(&path).unwrap();
                        out.acked.insert(to, v);
                        Ok(())
                    }
                    Err(e) => Err(format!("rename {path}: {e}")),
                }
            }
            2 => match client.unlink(&path).await {
                Ok(()) => {
                    out.acked.remove(&path);
                    Ok(())
                }
                Err(e) if e.errno == shoal_proto::Errno::ENOENT && happened(&client, &path, None).await => {
                    out.replies_lost.push(format!("unlink {path}: {e}"));
                    out.acked.remove(&path);
                    Ok(())
                }
                Err(e) => Err(format!("unlink {path}: {e}")),
            },
            _ => Ok(()),
        };
        out.longest = out.longest.max(t.elapsed());
        out.ops += 1;
        if let Err(e) = r {
            out.errors.push(e);
        }
    }
    out
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn kill9_of_a_server_under_load_fails_over_with_no_error_and_nothing_lost() {
    let mut c = Cluster::start_with(4, |m| m.cluster.replicas = 2);
    // A voter that does not lead the group (the leader's death adds an election: measured
    // in docs/benchmarks.md, with SHOAL_FAILOVER_VICTIM=leader), and does not hold the root.
    // Chosen once the group has a leader (before, any voter may become it).
    let rt = runtime();
    let root_home = c.map.home_of(shoal_proto::ROOT_INO).0;
    let kill_leader = std::env::var("SHOAL_FAILOVER_VICTIM").is_ok_and(|v| v == "leader");
    let (status, toml) = rt.block_on(async {
        let client = c.client();
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, toml, leader, voters) = client.get_map(shoal_proto::ServerId(0)).await.unwrap();
            match leader {
                Some(l) if kill_leader => break (Some(l), toml),
                Some(l) => break (voters.into_iter().find(|v| *v != l && *v != root_home), toml),
                None if Instant::now() < until => tokio::time::sleep(Duration::from_millis(100)).await,
                None => panic!("the map group elected no leader within 20 s"),
            }
        }
    });
    let victim = status.unwrap_or(3);
    assert!(!toml.contains("served_by"), "no failover yet:\n{toml}");
    let workers = 4u32;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let original = c.map.server(shoal_proto::ServerId(victim)).unwrap().addr.clone();
    let outcomes = rt.block_on(async {
        let client = c.client();
        for k in 0..workers {
            client.mkdir(&format!("/w{k}"), 0o755).await.unwrap();
        }
        let tasks: Vec<_> = (0..workers).map(|k| tokio::spawn(worker(c.client(), k, stop.clone()))).collect();
        tokio::time::sleep(Duration::from_secs(3)).await;
        c.kill9(victim);
        let killed = Instant::now();
        // Until the slot is served again, and a while after.
        let moved =
            wait_map(&client, victim, Duration::from_secs(30), |e| e.served_by).await.map(|h| (h, killed.elapsed()));
        tokio::time::sleep(Duration::from_secs(3)).await;
        // The killed server comes back, under load: it stands by, is resynchronised from the
        // copy, and takes its slot back.
        let back = moved.map(|_| {
            c.spawn_with_env(victim, &[]);
            Instant::now()
        });
        let home = match back {
            Some(_) => {
                wait_map(&client, victim, Duration::from_secs(60), |e| e.served_by.is_none().then(|| e.addr.clone()))
                    .await
            }
            None => None,
        };
        let handed_back = back.map(|t| t.elapsed());
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut outs = Vec::new();
        for t in tasks {
            outs.push(t.await.unwrap());
        }
        (outs, moved, home, handed_back)
    });
    let (outs, moved, home, handed_back) = outcomes;
    let (host, took) = moved.unwrap_or_else(|| {
        panic!(
            "server {victim}'s slot was not failed over within 30 s:\n{}",
            (0..4).map(|i| c.log(i)).collect::<String>()
        )
    });
    let errors: Vec<&String> = outs.iter().flat_map(|o| &o.errors).collect();
    let longest = outs.iter().map(|o| o.longest).max().unwrap();
    let ops: u64 = outs.iter().map(|o| o.ops).sum();
    let lost: Vec<&String> = outs.iter().flat_map(|o| &o.replies_lost).collect();
    eprintln!(
        "server {victim} killed: its slot served by server {host} after {took:?}; restarted, it took the slot back \
         after {handed_back:?}; {ops} operations, longest {longest:?}; {} done but answered ENOENT \
         (docs/failover.md): {lost:?}",
        lost.len()
    );
    if std::env::var_os("SHOAL_TEST_LOGS").is_some() {
        for i in 0..4 {
            eprintln!("---- server {i}\n{}", c.log(i));
        }
    }
    assert!(errors.is_empty(), "clients saw errors: {errors:?}\n{}\n{}", c.log(host), c.log(victim));
    assert!(longest < Duration::from_secs(15), "an operation paused {longest:?}");
    assert_eq!(
        home.as_deref(),
        Some(original.as_str()),
        "server {victim} did not take its slot back:\n{}\n{}",
        c.log(victim),
        c.log(host)
    );
    // The failover dropped the slot's HTTP address from the map (the copy does not serve
    // the slot's HTTP); serving again, the server puts it back.
    let http = c.map.server(shoal_proto::ServerId(victim)).and_then(|e| e.http.clone());
    assert!(http.is_some(), "the test's map gives every server an HTTP address");
    let restored =
        rt.block_on(async { wait_map(&c.client(), victim, Duration::from_secs(30), |e| e.http.clone()).await });
    assert_eq!(restored, http, "server {victim}'s HTTP address after the handback:\n{}", c.log(victim));
    // Every acknowledged file holds its bytes, read by a new client.
    check_acked(&c, &rt, &outs, "after the handback");
    // The slot has two copies again: the host's copy was resynchronised from the server's
    // new incarnation, so losing the server once more fails over again with everything.
    rt.block_on(async {
        let client = c.client();
        let synced = async {
            loop {
                let all = client.status_all().await;
                let st = all.into_iter().find(|(s, _)| s.0 == victim).and_then(|(_, r)| r.ok());
                if st.is_some_and(|s| {
                    !s.mirrors.is_empty() && s.mirrors.iter().all(|m| m.state == shoal_proto::msg::MirrorSync::InSync)
                }) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), synced).await.expect("the host's copy is in sync again");
    });
    c.kill9(victim);
    let again = rt.block_on(async { wait_map(&c.client(), victim, Duration::from_secs(30), |e| e.served_by).await });
    assert!(again.is_some(), "no second failover:\n{}", c.log(host));
    check_acked(&c, &rt, &outs, "after the second failover");
}

/// Every file the workers' acknowledged operations left holds its bytes, read by a new client.
fn check_acked(c: &Cluster, rt: &tokio::runtime::Runtime, outs: &[Outcome], what: &str) {
    rt.block_on(async {
        let client = c.uncached_client();
        for o in outs {
            for (path, want) in &o.acked {
                let f =
                    client.open(path, OpenFlags::read_only()).await.unwrap_or_else(|e| panic!("{what}: {path}: {e}"));
                let got = f.read_at(0, want.len() + 1).await.unwrap();
                assert!(
                    got[..] == want[..],
                    "{what}: {path}: {} bytes read, {} acknowledged, or different",
                    got.len(),
                    want.len()
                );
            }
        }
    })
}

/// Refetch the map until `f` gives a value for `slot`'s entry: that value, or `None` after
/// `within`.
async fn wait_map<T>(
    client: &Client,
    slot: u32,
    within: Duration,
    f: impl Fn(&shoal_placement::map::ServerEntry) -> Option<T>,
) -> Option<T> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if client.refresh_map().await.is_err() {
            continue;
        }
        if let Some(v) = client.map().server(shoal_proto::ServerId(slot)).and_then(&f) {
            return Some(v);
        }
    }
    None
}

#[test]
fn a_server_whose_disk_was_wiped_does_not_serve_an_empty_copy_over_its_mirror() {
    // The detector is kept out of the way: the server comes back before it is marked down,
    // which is when an empty store would be served (and its mirror resynchronised to it).
    let mut c = Cluster::start_with(3, |m| {
        m.cluster.replicas = 2;
        m.membership.down_after_ms = 120_000;
        m.membership.refused_down_after_ms = 0;
    });
    let victim = c.map.home_of(shoal_proto::ROOT_INO).0;
    let rt = runtime();
    rt.block_on(async {
        let client = c.client();
        let f = client.create("/kept", 0o644, None).await.unwrap();
        f.write_at(0, b"kept").await.unwrap();
        f.close().await.unwrap();
    });
    c.kill9(victim);
    std::fs::remove_dir_all(c.path().join(format!("s{victim}"))).unwrap();
    c.spawn_with_env(victim, &[]);
    assert!(c.wait_exit(victim, Duration::from_secs(30)), "server {victim} served an empty store:\n{}", c.log(victim));
    assert!(c.log(victim).contains("not serving an empty copy"), "it says why:\n{}", c.log(victim));
}

/// A directory under the root whose inode (and so its entries) lives on `server`: its name.
async fn dir_on(c: &Cluster, client: &Client, server: u32, prefix: &str) -> String {
    for i in 0..64 {
        let path = format!("/{prefix}{i}");
        let a = client.mkdir(&path, 0o755).await.unwrap();
        if c.map.home_of(a.ino).0 == server {
            return path;
        }
    }
    panic!("no directory landed on server {server}");
}

/// A rename across servers whose coordinator dies after the step on the other server and
/// before its own finish, its reply never sent: the slot fails over to the mirror, whose
/// recovery finishes the rename and keeps its reply under the client's request id, so the
/// client's retry is answered "done", not applied again (which would say `ENOENT`).
#[test]
fn a_rename_across_servers_whose_coordinator_dies_mid_way_is_answered_done_after_the_failover() {
    // Detection by silence only: the coordinator is restarted once below, with the
    // failpoint armed, and that restart must not be taken for a death.
    let mut c = Cluster::start_with(3, |m| {
        m.cluster.replicas = 2;
        m.membership.refused_down_after_ms = 0;
    });
    let coord = (0..3).find(|&s| s != c.map.home_of(shoal_proto::ROOT_INO).0).unwrap();
    let other = (0..3).find(|&s| s != coord).unwrap();
    let rt = runtime();
    let (src, dst) = rt.block_on(async {
        let client = c.client();
        let src = dir_on(&c, &client, coord, "s").await;
        let dst = dir_on(&c, &client, other, "d").await;
        let f = client.create(&format!("{src}/a"), 0o644, None).await.unwrap();
        f.write_at(0, b"moved once").await.unwrap();
        f.close().await.unwrap();
        (src, dst)
    });
    // Armed on the coordinator only: the promoted copy's recovery, in another process,
    // drives the same step and must not die there.
    c.stop(coord);
    c.restart_with_env(coord, &[("FAILPOINTS", "rename.target.after=return")]);
    // Stopped cleanly, the coordinator goes on with its incarnation: once its shipper has
    // heard from the mirror (its position known, not 0) the mirror is in sync; the map must
    // not list it as behind, since a mirror behind is not promoted.
    rt.block_on(async {
        let client = c.client();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            client.refresh_map().await.unwrap();
            let status = client.server_status(shoal_proto::ServerId(coord)).await.unwrap();
            let resynced = !status.mirrors.is_empty()
                && status.mirrors.iter().all(|m| m.state == shoal_proto::msg::MirrorSync::InSync && m.applied > 0);
            if resynced && client.map().server(shoal_proto::ServerId(coord)).is_some_and(|e| e.behind.is_empty()) {
                break;
            }
            assert!(Instant::now() < until, "the mirror of server {coord} was not in sync again within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (from, to) = (format!("{src}/a"), format!("{dst}/b"));
    let answer = rt.block_on(async { c.client().rename(&from, &to).await });
    assert!(c.wait_exit(coord, Duration::from_secs(30)), "server {coord} did not die at the failpoint");
    assert!(answer.is_ok(), "the rename was answered {answer:?}\n{}", (0..3).map(|i| c.log(i)).collect::<String>());
    rt.block_on(async {
        let client = c.uncached_client();
        let f = client.open(&to, OpenFlags::read_only()).await.unwrap();
        assert_eq!(&f.read_at(0, 64).await.unwrap()[..], b"moved once");
        let gone = client.stat(&from).await;
        assert!(matches!(&gone, Err(e) if e.errno == shoal_proto::Errno::ENOENT), "{from}: {gone:?}");
        let m = client.map();
        assert!(m.server(shoal_proto::ServerId(coord)).and_then(|e| e.served_by).is_some(), "the slot failed over");
    });
}

/// Bytes of the objects (not their checksums or marks) under `dir`, and how many marks of
/// objects kept elsewhere (`<object>.unkept`, docs/replicas.md).
fn object_bytes(dir: &std::path::Path) -> (u64, usize) {
    let (mut bytes, mut marks) = (0, 0);
    let Ok(rd) = std::fs::read_dir(dir) else { return (0, 0) };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            let (b, m) = object_bytes(&p);
            bytes += b;
            marks += m;
        } else if name.ends_with(".unkept") {
            marks += 1;
        } else if name.split_once('.').is_some_and(|(i, x)| i.len() == 16 && x.bytes().all(|c| c.is_ascii_digit())) {
            bytes += e.metadata().unwrap().len();
        }
    }
    (bytes, marks)
}

/// Read every stripe of `path` (1 MiB each): how many failed with `EIO`; every other one
/// must hold `want`'s bytes (a stripe kept nowhere that is up is never zeros).
async fn stripes_lost(client: &Client, path: &str, want: &[u8]) -> usize {
    let f = client.open(path, OpenFlags::read_only()).await.unwrap();
    let mut lost = 0;
    for (k, chunk) in want.chunks(1 << 20).enumerate() {
        match f.read_at((k as u64) << 20, 1 << 20).await {
            Ok(got) => assert!(got[..] == chunk[..], "{path}: stripe {k} differs ({} bytes read)", got.len()),
            Err(e) => {
                assert_eq!(e.errno, shoal_proto::Errno::EIO, "{path}: stripe {k}: {e}");
                lost += 1;
            }
        }
    }
    let _ = f.close().await;
    lost
}

/// A file asking for one copy in a cluster keeping two (docs/replicas.md, "Fewer copies than
/// the cluster's"): its bytes are on one server only, the mirrors hold marks; while that
/// server is away its stripes there read `EIO`, never zeros, and the file of two copies
/// reads whole; a file of one copy written meanwhile is kept in full by the copy; once the
/// server has taken its slot back, every file reads whole again.
#[test]
fn a_file_of_one_copy_is_kept_once_and_reads_eio_while_its_server_is_away() {
    let mut c = Cluster::start_with(3, |m| m.cluster.replicas = 2);
    let rt = runtime();
    let layout = |replicas| LayoutSpec {
        stripe_size: Some(1 << 20),
        stripe_count: Some(u32::MAX),
        replicas: Some(replicas),
        ..Default::default()
    };
    let (one, two, during) = (pattern(1, 0, 6 << 20), pattern(2, 0, 6 << 20), pattern(3, 0, 6 << 20));
    rt.block_on(async {
        let client = c.client();
        for (path, data, copies) in [("/one", &one, 1), ("/two", &two, 2)] {
            let f = client.create(path, 0o644, Some(layout(copies))).await.unwrap();
            f.write_at(0, data).await.unwrap();
            f.close().await.unwrap();
        }
    });
    // Acknowledged, so applied by every mirror: the servers' own stores hold both files, the
    // mirrors only the file of two copies and marks of the other's objects.
    let (mut own, mut mirrored, mut marks) = (0, 0, 0);
    for id in 0..3 {
        own += object_bytes(&c.path().join(format!("s{id}/objects"))).0;
        for m in 0..3 {
            let (b, k) = object_bytes(&c.path().join(format!("s{id}/mirror-{m}/objects")));
            mirrored += b;
            marks += k;
        }
    }
    assert_eq!(own, 12 << 20, "the servers' own objects");
    assert_eq!(mirrored, 6 << 20, "the mirrors' objects: the file of two copies only");
    // One object per server per file (its stripes there, one after the other).
    assert_eq!(marks, 3, "a mark for each object of the file of one copy");

    // A server that neither leads the map group nor holds the root dies.
    let victim = rt.block_on(async {
        let root_home = c.map.home_of(shoal_proto::ROOT_INO).0;
        loop {
            let (_, _, leader, voters) = c.client().get_map(shoal_proto::ServerId(0)).await.unwrap();
            if let Some(l) = leader {
                break voters.into_iter().find(|v| *v != l && *v != root_home).unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let original = c.map.server(shoal_proto::ServerId(victim)).unwrap().addr.clone();
    c.kill9(victim);
    rt.block_on(async {
        let client = c.client();
        let moved = wait_map(&client, victim, Duration::from_secs(30), |e| e.served_by).await;
        assert!(moved.is_some(), "server {victim}'s slot was not failed over:\n{}", c.log(victim));
        let client = c.uncached_client();
        assert_eq!(stripes_lost(&client, "/one", &one).await, 2, "the stripes of /one on server {victim}");
        assert_eq!(stripes_lost(&client, "/two", &two).await, 0);
        // Writing into a stripe kept nowhere that is up is refused too (the same byte again,
        // so that the file is as it was wherever the write lands).
        let mut refused = 0;
        for k in 0..6usize {
            let f = client.open("/one", OpenFlags::read_write()).await.unwrap();
            let wrote = f.write_at((k as u64) << 20, &one[k << 20..(k << 20) + 1]).await;
            let closed = f.close().await;
            if wrote.is_err() || closed.is_err() {
                refused += 1;
            }
        }
        assert_eq!(refused, 2, "writes into the stripes of /one on server {victim}");
        let f = client.create("/during", 0o644, Some(layout(1))).await.unwrap();
        f.write_at(0, &during).await.unwrap();
        f.close().await.unwrap();
    });
    c.spawn_with_env(victim, &[]);
    rt.block_on(async {
        let client = c.client();
        let home =
            wait_map(&client, victim, Duration::from_secs(60), |e| e.served_by.is_none().then(|| e.addr.clone())).await;
        assert_eq!(home.as_deref(), Some(original.as_str()), "server {victim} took its slot back:\n{}", c.log(victim));
        let client = c.uncached_client();
        for (path, data) in [("/one", &one), ("/two", &two), ("/during", &during)] {
            assert_eq!(stripes_lost(&client, path, data).await, 0, "{path} after the handback");
        }
    });
}

/// A server gone for longer than `[membership] absent_after_ms` is marked absent: every slot
/// it held a copy of gets a new mirror, resynchronised, and the map group replaces it among
/// its voters, so that a second failure loses nothing: here the very server that took its
/// slot over dies too, and a third server serves both slots.
#[test]
fn a_server_gone_for_long_has_its_copies_made_again_so_a_second_failure_loses_nothing() {
    let mut c = Cluster::start_with(4, |m| {
        m.cluster.replicas = 2;
        m.membership.absent_after_ms = 3000;
    });
    let rt = runtime();
    let all = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(u32::MAX), ..Default::default() };
    let want = rt.block_on(write_files(&c.client(), 16));
    // Server 1 dies: its mirror, server 2, serves its slot; once it has been away for the
    // grace period it is absent, and its slot gets a new mirror: server 3.
    c.kill9(1);
    rt.block_on(async {
        let client = c.client();
        let absent = wait_map(&client, 1, Duration::from_secs(30), |e| e.absent.then_some(e.served_by)).await;
        assert_eq!(absent, Some(Some(2)), "server 1 not marked absent: {:?}", client.map().servers);
        let map = client.map();
        assert_eq!(map.mirrors_of(shoal_proto::ServerId(1)), vec![shoal_proto::ServerId(3)]);
        assert_eq!(map.mirrors_of(shoal_proto::ServerId(0)), vec![shoal_proto::ServerId(2)], "in place of 1");
        assert!(!map.voters().contains(&1), "an absent server is no voter: {:?}", map.voters());
        // Every new mirror resynchronised: nothing behind any more.
        let synced = wait_map(&client, 1, Duration::from_secs(60), |_| {
            client.map().servers.iter().all(|e| e.behind.is_empty()).then_some(())
        })
        .await;
        assert!(synced.is_some(), "new mirrors not in sync: {:?}", client.map().servers);
    });
    let (code, out, err) = c.shoal(&["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("absent: its copies are made elsewhere"), "{out}");

    // The server serving slot 1 dies too: server 3 holds both slots it served.
    c.kill9(2);
    rt.block_on(async {
        let client = c.client();
        for slot in [1, 2] {
            let by = wait_map(&client, slot, Duration::from_secs(30), |e| {
                (e.served_by == Some(3) && e.state == shoal_placement::map::ServerState::Up).then_some(())
            })
            .await;
            assert!(by.is_some(), "slot {slot} not served by server 3: {:?}\n{}", client.map().servers, c.log(3));
        }
        let fresh = c.uncached_client();
        check_files(&fresh, &want).await;
        let f = fresh.create("/d/after", 0o644, Some(all.clone())).await.unwrap();
        f.write_at(0, &pattern(99, 0, 300_000)).await.unwrap();
        f.close().await.unwrap();
        assert_eq!(fresh.readdir("/d").await.unwrap().len(), want.len() + 1);
    });

    // Both come back: each takes its slot back, server 1 is no longer absent, the mirror sets
    // are as at the start and every copy is in sync again.
    c.restart(1);
    c.restart(2);
    rt.block_on(async {
        let client = c.client();
        let back = wait_map(&client, 0, Duration::from_secs(60), |_| {
            let map = client.map();
            let home = map.servers.iter().all(|e| e.served_by.is_none() && !e.absent && e.behind.is_empty());
            home.then_some(())
        })
        .await;
        assert!(back.is_some(), "not back to normal: {:?}\n{}\n{}", client.map().servers, c.log(1), c.log(3));
        let map = client.map();
        assert_eq!(map.mirrors_of(shoal_proto::ServerId(0)), vec![shoal_proto::ServerId(1)]);
        assert!(map.voters().contains(&1), "{:?}", map.voters());
        check_files(&c.uncached_client(), &want).await;
    });
}
