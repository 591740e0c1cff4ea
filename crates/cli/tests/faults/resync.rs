//! Resync of mirrors that fell out of sync (docs/resync.md), on real clusters: a mirror
//! back from `kill -9` and every mirror of a restarted primary catch up by shipping what
//! differs, not the whole slot, are in sync again (status), and then hold every
//! acknowledged name and byte (the slot served from the mirror's copy, as in
//! `replication.rs`); a primary stopped cleanly needs no resync at all; a resync ships at
//! its busy rate while clients use the primary and at its full rate when they are quiet.

use shoal_client::{Client, ClientOptions, OpenFlags};
use shoal_proto::msg::{LayoutSpec, MirrorStatus, MirrorSync, PlacementPolicy};
use shoal_proto::{ServerId, ROOT_INO};
use shoal_testkit::{pattern, Cluster};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What the root must hold: file name → bytes.
type Expected = BTreeMap<String, Vec<u8>>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// One object on the inode's home server: a file made in the root lives on the root's
/// home alone (its entry, inode and data), so it can be written while another server is
/// down.
fn on_home() -> Option<LayoutSpec> {
    Some(LayoutSpec { stripe_count: Some(1), policy: Some(PlacementPolicy::Same), ..Default::default() })
}

async fn write_file(client: &Client, name: &str, data: &[u8], want: &mut Expected) {
    let f = client.create(&format!("/{name}"), 0o644, on_home()).await.unwrap();
    f.write_at(0, data).await.unwrap();
    f.close().await.unwrap();
    want.insert(name.to_string(), data.to_vec());
}

async fn patch(client: &Client, name: &str, offset: usize, data: &[u8], want: &mut Expected) {
    let f = client.open(&format!("/{name}"), OpenFlags::read_write()).await.unwrap();
    f.write_at(offset as u64, data).await.unwrap();
    f.close().await.unwrap();
    let bytes = want.get_mut(name).unwrap();
    bytes.resize(bytes.len().max(offset + data.len()), 0);
    bytes[offset..offset + data.len()].copy_from_slice(data);
}

/// The root lists exactly `want`'s names, and each file holds its bytes.
async fn check(client: &Client, want: &Expected) {
    let mut names: Vec<String> = client.readdir("/").await.unwrap().into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(names, want.keys().cloned().collect::<Vec<_>>(), "root listing");
    for (name, data) in want {
        let path = format!("/{name}");
        let attr = client.stat(&path).await.unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(attr.size, data.len() as u64, "{path}: size");
        let f = client.open(&path, OpenFlags::read_only()).await.unwrap();
        let got = f.read_at(0, data.len()).await.unwrap();
        assert!(got[..] == data[..], "{path}: content differs");
        f.close().await.unwrap();
    }
}

/// Wait until `primary` says every mirror in `mirrors` is in sync after at least one resync.
fn wait_in_sync(
    c: &Cluster,
    rt: &tokio::runtime::Runtime,
    primary: ServerId,
    mirrors: &[ServerId],
) -> Vec<MirrorStatus> {
    wait_mirrors(c, rt, primary, mirrors, 1)
}

/// Wait until `primary` says every mirror in `mirrors` is in sync after at least
/// `resyncs` resyncs; their statuses.
fn wait_mirrors(
    c: &Cluster,
    rt: &tokio::runtime::Runtime,
    primary: ServerId,
    mirrors: &[ServerId],
    resyncs: u64,
) -> Vec<MirrorStatus> {
    let client = rt.block_on(async { c.client() });
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = rt.block_on(client.server_status(primary)).unwrap();
        let ready: Vec<MirrorStatus> = status
            .mirrors
            .iter()
            .filter(|m| mirrors.contains(&m.server) && m.state == MirrorSync::InSync && m.resyncs >= resyncs)
            .cloned()
            .collect();
        if ready.len() == mirrors.len() {
            return ready;
        }
        assert!(
            Instant::now() < deadline,
            "mirrors {mirrors:?} of server {primary} not in sync after a resync: {:?}\n{}",
            status.mirrors,
            c.log(primary.0)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Serve `primary`'s slot from a copy of `mirror`'s mirror of it (as in `replication.rs`),
/// and check the root holds `want`. Every mirror of the slot is killed too, before the
/// primary restarts on the copy: a server started after a crash hands its slot to a mirror
/// that answers (docs/failover.md), and this must check `mirror`'s copy, not another's.
fn serve_from_mirror_and_check(
    c: &mut Cluster,
    rt: &tokio::runtime::Runtime,
    primary: ServerId,
    mirror: ServerId,
    want: &Expected,
) {
    let mirrors = c.map.mirrors_of(primary);
    assert!(mirrors.contains(&mirror));
    c.kill9(primary.0);
    for m in &mirrors {
        c.kill9(m.0);
    }
    let copy = c.path().join(format!("s{}", mirror.0)).join(format!("mirror-{}", primary.0));
    let taken = c.path().join(format!("s{}-from-mirror", primary.0));
    let cp = std::process::Command::new("cp").arg("-a").arg(&copy).arg(&taken).status().unwrap();
    assert!(cp.success());
    c.restart_with_args(primary.0, &["--data-dir", taken.to_str().unwrap()]);
    assert!(c.log(primary.0).contains("cannot take the slot"), "{}", c.log(primary.0));
    for m in &mirrors {
        c.restart(m.0);
    }
    rt.block_on(async { check(&c.client(), want).await });
}

#[test]
fn a_mirror_back_from_kill9_resyncs_only_what_it_missed() {
    // The mirror's server is away longer than the failure detector's delay: with the
    // default, its own slot would fail over (tests/faults/failover.rs) and it would not come back
    // as itself. Here it is away briefly as far as the map knows, so it comes back and is
    // resynchronised.
    let mut c = Cluster::start_with(3, |m| {
        m.cluster.replicas = 2;
        m.membership.down_after_ms = 120_000;
        m.membership.refused_down_after_ms = 0;
    });
    let primary = c.map.home_of(ROOT_INO);
    let mirror = c.map.mirrors_of(primary)[0];
    let rt = runtime();
    let mut want = Expected::new();
    rt.block_on(async {
        let client = c.client();
        for i in 0..16 {
            write_file(&client, &format!("big{i}"), &pattern(i, 0, 1 << 20), &mut want).await;
        }
    });
    c.kill9(mirror.0);
    // The primary waits for its dead mirror once (3 s), then goes on alone: writes for
    // longer than that, then changes of every kind while the mirror is away.
    let started = Instant::now();
    rt.block_on(async {
        let client = c.client();
        // Few new names: a directory with many more entries splits, and its partitions
        // would move to other servers (the dead one among them).
        for n in 0..6 {
            write_file(&client, &format!("new{n}"), &pattern(100 + n, 0, 5000), &mut want).await;
        }
        let mut n = 0;
        while started.elapsed() < Duration::from_secs(5) {
            patch(&client, &format!("big{}", 4 + n % 8), 4096 * (n % 16), &pattern(300 + n as u64, 0, 4096), &mut want)
                .await;
            n += 1;
        }
        for i in 0..3 {
            patch(&client, &format!("big{i}"), 100_000, &pattern(200 + i, 0, 4096), &mut want).await;
        }
        client.unlink("/big15").await.unwrap();
        want.remove("big15");
        client.unlink("/new0").await.unwrap();
        want.remove("new0");
        client.rename("/new1", "/renamed").await.unwrap();
        let v = want.remove("new1").unwrap();
        want.insert("renamed".into(), v);
        client.truncate("/big14", 300_000).await.unwrap();
        want.get_mut("big14").unwrap().truncate(300_000);
    });
    assert!(
        c.log(primary.0).contains("going on without it"),
        "server {primary} gave up on its mirror:\n{}",
        c.log(primary.0)
    );
    c.restart(mirror.0);
    let m = wait_in_sync(&c, &rt, primary, &[mirror]).remove(0);
    // What it missed is a few blocks and small files, not the 16 MiB the slot holds (the
    // patches of the loop above fall in the first megabyte of eight files, at most 16
    // blocks each).
    assert!(m.resync_shipped_bytes > 0, "the resync shipped nothing: {m:?}");
    assert!(
        m.resync_shipped_bytes * 16 < m.resync_total_bytes && m.resync_total_bytes >= 14 << 20,
        "the resync shipped {} of the {} bytes the slot holds",
        m.resync_shipped_bytes,
        m.resync_total_bytes
    );
    assert!(c.log(primary.0).contains(&format!("mirror {mirror} is in sync again")), "{}", c.log(primary.0));
    let (code, out, err) = c.shoal(&["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("mirror of {primary} on {mirror}: in sync")), "shoal status:\n{out}");
    // Followed in sync again: a change made now is on the mirror too.
    rt.block_on(async {
        let client = c.client();
        write_file(&client, "after", b"after the resync", &mut want).await;
        patch(&client, "big3", 5, b"xyz", &mut want).await;
    });
    serve_from_mirror_and_check(&mut c, &rt, primary, mirror, &want);
}

#[test]
fn a_restarted_primary_resyncs_every_mirror() {
    // Restarted at once, before the detector takes it for dead: the server hands its slot to
    // a mirror (it started after a crash), is resynchronised and takes the slot back; its
    // new incarnation then resyncs every mirror.
    let mut c = Cluster::start_with(3, |m| {
        m.cluster.replicas = 3;
        m.membership.refused_down_after_ms = 0;
    });
    let primary = c.map.home_of(ROOT_INO);
    let mirrors = c.map.mirrors_of(primary);
    assert_eq!(mirrors.len(), 2);
    let rt = runtime();
    let mut want = Expected::new();
    rt.block_on(async {
        let client = c.client();
        for i in 0..8 {
            write_file(&client, &format!("f{i}"), &pattern(i, 0, 512 << 10), &mut want).await;
        }
    });
    // A new incarnation: every mirror refuses its positions until resynchronised.
    c.kill9(primary.0);
    c.restart(primary.0);
    rt.block_on(async {
        let client = c.client();
        write_file(&client, "later", &pattern(50, 0, 70_000), &mut want).await;
        patch(&client, "f2", 1000, b"changed after the restart", &mut want).await;
    });
    let done = wait_in_sync(&c, &rt, primary, &mirrors);
    for m in &done {
        assert!(
            m.resync_shipped_bytes * 8 < m.resync_total_bytes,
            "mirror {} shipped {} of {} bytes",
            m.server,
            m.resync_shipped_bytes,
            m.resync_total_bytes
        );
    }
    rt.block_on(async {
        let client = c.client();
        write_file(&client, "last", b"in sync again", &mut want).await;
    });
    serve_from_mirror_and_check(&mut c, &rt, primary, mirrors[1], &want);
}

#[test]
fn a_primary_stopped_cleanly_goes_on_with_its_incarnation_and_resyncs_nothing() {
    let mut c = Cluster::start_with(3, |m| {
        m.cluster.replicas = 3;
        m.membership.refused_down_after_ms = 0;
    });
    let primary = c.map.home_of(ROOT_INO);
    let mirrors = c.map.mirrors_of(primary);
    let rt = runtime();
    let mut want = Expected::new();
    rt.block_on(async {
        let client = c.client();
        for i in 0..8 {
            write_file(&client, &format!("f{i}"), &pattern(i, 0, 300 << 10), &mut want).await;
        }
    });
    // SIGTERM: the mirrors take the last changes, the stop is recorded.
    c.stop(primary.0);
    assert!(c.log(primary.0).contains("stopped cleanly at position"), "{}", c.log(primary.0));
    c.restart(primary.0);
    assert!(c.log(primary.0).contains("going on from there"), "{}", c.log(primary.0));
    rt.block_on(async {
        let client = c.client();
        write_file(&client, "later", &pattern(50, 0, 70_000), &mut want).await;
        patch(&client, "f2", 1000, b"changed after the restart", &mut want).await;
    });
    // Followed on where they were: in sync, and never resynchronised.
    for m in wait_mirrors(&c, &rt, primary, &mirrors, 0) {
        assert_eq!((m.resyncs, m.resync_shipped_bytes), (0, 0), "mirror {} was resynchronised: {m:?}", m.server);
    }
    // A crash after that start is not continued: the record went with the start.
    c.kill9(primary.0);
    c.restart(primary.0);
    rt.block_on(async {
        let client = c.client();
        write_file(&client, "last", b"after a crash", &mut want).await;
    });
    wait_in_sync(&c, &rt, primary, &mirrors);
    // And the copies hold everything, before and after each restart.
    serve_from_mirror_and_check(&mut c, &rt, primary, mirrors[1], &want);
}

/// How long the primary's last finished resync of `mirror` took, from its log ("mirror M of
/// server P: stores resynchronised in 1.2s (… bytes shipped)"), and the bytes it shipped.
fn last_resync(c: &Cluster, primary: ServerId, mirror: ServerId) -> (Duration, u64) {
    let log = c.log(primary.0);
    let prefix = format!("mirror {mirror} of server {primary}: stores resynchronised in ");
    let line = log.lines().filter_map(|l| l.split_once(&prefix).map(|(_, rest)| rest)).next_back();
    let line = line.unwrap_or_else(|| panic!("no finished resync of mirror {mirror} in the log:\n{log}"));
    // "1.234567s (123 of 456 bytes shipped); …" (Debug of a Duration: s, ms or µs).
    let (took, rest) = line.split_once(' ').unwrap();
    let took = if let Some(ms) = took.strip_suffix("ms") {
        Duration::from_secs_f64(ms.parse::<f64>().unwrap() / 1e3)
    } else if let Some(us) = took.strip_suffix("µs") {
        Duration::from_secs_f64(us.parse::<f64>().unwrap() / 1e6)
    } else {
        Duration::from_secs_f64(took.strip_suffix('s').unwrap().parse().unwrap())
    };
    let shipped = rest.trim_start_matches('(').split(' ').next().unwrap().parse().unwrap();
    (took, shipped)
}

#[test]
fn a_resync_yields_to_clients_and_runs_at_full_speed_when_they_are_quiet() {
    // 64 MiB/s when the primary's clients are quiet, 1 MiB/s while they read or write.
    let mut c = Cluster::start_full(
        3,
        |m| {
            m.cluster.replicas = 2;
            m.membership.down_after_ms = 120_000;
            m.membership.refused_down_after_ms = 0;
        },
        &["--resync-mb-s", "64", "--resync-busy-mb-s", "1"],
    );
    let primary = c.map.home_of(ROOT_INO);
    let mirror = c.map.mirrors_of(primary)[0];
    let rt = runtime();
    let mut want = Expected::new();
    const MISSED: usize = 6 << 20;
    // The mirror misses 6 MiB (after the primary's 3 s of waiting for it), twice.
    let miss = |c: &mut Cluster, round: u64, want: &mut Expected| {
        c.kill9(mirror.0);
        rt.block_on(async {
            let client = c.client();
            for i in 0..6 {
                write_file(&client, &format!("r{round}-{i}"), &pattern(round * 10 + i, 0, MISSED / 6), want).await;
            }
        });
    };

    // Quiet: nothing but the resync runs (the writes ended more than a second before).
    miss(&mut c, 1, &mut want);
    std::thread::sleep(Duration::from_millis(1500));
    c.restart(mirror.0);
    wait_mirrors(&c, &rt, primary, &[mirror], 1);
    let (quiet, shipped) = last_resync(&c, primary, mirror);
    assert!(shipped >= MISSED as u64, "the quiet resync shipped {shipped} bytes");
    // 6 MiB at 64 MiB/s is a tenth of a second; at the busy rate it would be six.
    assert!(quiet < Duration::from_secs(3), "the quiet resync took {quiet:?} for {shipped} bytes");

    // Busy: a client reads a file of the primary's slot the whole time.
    miss(&mut c, 2, &mut want);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (stop, config) = (stop.clone(), c.path().join("cluster.toml"));
        // No readahead: every read goes to the server.
        let options = ClientOptions { readahead: 0, ..c.options() };
        std::thread::spawn(move || {
            runtime().block_on(async {
                let client = Client::from_config(&config, options).unwrap();
                let f = client.open("/r1-0", OpenFlags::read_only()).await.unwrap();
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    f.read_at((reads % 256) * 4096, 4096).await.unwrap();
                    reads += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                reads
            })
        })
    };
    c.restart(mirror.0);
    wait_mirrors(&c, &rt, primary, &[mirror], 2);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    let (busy, shipped) = last_resync(&c, primary, mirror);
    assert!(shipped >= MISSED as u64, "the busy resync shipped {shipped} bytes");
    assert!(
        busy > Duration::from_secs(4),
        "the resync under client reads took {busy:?} for {shipped} bytes: not at the busy rate of 1 MiB/s"
    );
    rt.block_on(async { check(&c.client(), &want).await });
}
