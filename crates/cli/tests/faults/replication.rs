//! Redundancy (`[cluster] replicas`, docs/architecture.md "Redundancy"), on real clusters:
//! every change a primary acknowledges is held by its mirror, so a slot served from the
//! mirror after the primary's `kill -9` has every acknowledged name, attribute and byte;
//! and a primary whose mirror dies goes on alone after a bounded pause.

use shoal_client::{Client, OpenFlags};
use shoal_proto::msg::LayoutSpec;
use shoal_testkit::{pattern, Cluster};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What a path should hold: its mode bits and its bytes (`None` for a directory).
type Expected = BTreeMap<String, (u32, Option<Vec<u8>>)>;

async fn write_file(client: &Client, path: &str, data: &[u8], layout: Option<LayoutSpec>) {
    let f = client.create(path, 0o644, layout).await.unwrap();
    f.write_at(0, data).await.unwrap();
    f.close().await.unwrap();
}

/// Directories, files of several sizes (some striped over every server), renames,
/// removals and mode changes; returns what the namespace must hold afterwards.
async fn workload(client: &Client) -> Expected {
    let mut want = Expected::new();
    let all = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(u32::MAX), ..Default::default() };
    for d in 0..6 {
        let dir = format!("/d{d}");
        client.mkdir(&dir, 0o755).await.unwrap();
        want.insert(dir.clone(), (0o755, None));
        for f in 0..8u64 {
            let path = format!("{dir}/f{f}");
            let len = [0usize, 100, 4096, 70_000, 1 << 20, 3 << 20][(f as usize + d) % 6];
            let data = pattern(d as u64 * 100 + f, 0, len);
            write_file(client, &path, &data, (f % 2 == 0).then(|| all.clone())).await;
            want.insert(path, (0o644, Some(data)));
        }
    }
    for d in 0..6 {
        // Within a directory, across directories, over an existing name; then removals.
        let (a, b) = (format!("/d{d}/f1"), format!("/d{d}/moved"));
        client.rename(&a, &b).await.unwrap();
        let v = want.remove(&a).unwrap();
        want.insert(b, v);
        let (a, b) = (format!("/d{d}/f2"), format!("/d{}/f3", (d + 1) % 6));
        client.rename(&a, &b).await.unwrap();
        let v = want.remove(&a).unwrap();
        want.insert(b, v);
        let gone = format!("/d{d}/f4");
        client.unlink(&gone).await.unwrap();
        want.remove(&gone);
        let p = format!("/d{d}/f5");
        client.chmod(&p, 0o600).await.unwrap();
        want.get_mut(&p).unwrap().0 = 0o600;
        // Overwrite the middle of a file in place.
        let p = format!("/d{d}/f6");
        let f = client.open(&p, OpenFlags::read_write()).await.unwrap();
        let patch = pattern(999 + d as u64, 0, 5000);
        f.write_at(10, &patch).await.unwrap();
        f.close().await.unwrap();
        let bytes = want.get_mut(&p).unwrap().1.as_mut().unwrap();
        let end = (10 + patch.len()).max(bytes.len());
        bytes.resize(end, 0);
        bytes[10..10 + patch.len()].copy_from_slice(&patch);
    }
    client.mkdir("/gone", 0o755).await.unwrap();
    client.rmdir("/gone").await.unwrap();
    want
}

/// Every path of `want` is there with its mode and bytes, and directories list exactly
/// what `want` puts in them.
async fn check(client: &Client, want: &Expected) {
    for (path, (mode, data)) in want {
        let attr = client.stat(path).await.unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(attr.perm & 0o7777, *mode, "{path}: mode");
        if let Some(data) = data {
            assert_eq!(attr.size, data.len() as u64, "{path}: size");
            let f = client.open(path, OpenFlags::read_only()).await.unwrap();
            let got = f.read_at(0, data.len()).await.unwrap();
            assert!(got[..] == data[..], "{path}: content differs");
            f.close().await.unwrap();
        } else {
            let mut names: Vec<String> = client.readdir(path).await.unwrap().into_iter().map(|e| e.name).collect();
            names.sort();
            let prefix = format!("{path}/");
            let mut expected: Vec<String> = want
                .keys()
                .filter_map(|p| p.strip_prefix(&prefix).filter(|rest| !rest.contains('/')).map(str::to_string))
                .collect();
            expected.sort();
            assert_eq!(names, expected, "{path}: listing");
        }
    }
    assert!(client.stat("/gone").await.is_err());
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn a_killed_primary_is_served_from_its_mirror_with_nothing_acknowledged_lost() {
    let mut c = Cluster::start_with(3, |m| m.cluster.replicas = 2);
    let rt = runtime();
    let want = rt.block_on(async {
        let client = c.client();
        let want = workload(&client).await;
        check(&client, &want).await;
        want
    });
    // The mirrors followed the whole workload (none was given up on).
    for id in 0..3 {
        assert!(!c.log(id).contains("going on without it"), "server {id} lost a mirror:\n{}", c.log(id));
    }
    // Server 0 dies without a word, and so does server 1 that mirrors it; server 0's slot
    // is then served from (a copy of: server 1 keeps its own) server 1's mirror of it.
    c.kill9(0);
    c.kill9(1);
    let mirror = c.path().join("s1").join("mirror-0");
    assert!(mirror.join("meta").is_dir(), "server 1 keeps its mirror of server 0 in {}", mirror.display());
    let taken = c.path().join("s0-from-mirror");
    let cp = std::process::Command::new("cp").arg("-a").arg(&mirror).arg(&taken).status().unwrap();
    assert!(cp.success());
    c.restart_with_args(0, &["--data-dir", taken.to_str().unwrap()]);
    c.restart(1);
    rt.block_on(async {
        let client = c.client();
        check(&client, &want).await;
    });
}

#[test]
fn a_primary_whose_mirror_died_goes_on_alone_after_a_bounded_pause() {
    // Three servers: going on without a mirror takes the map group's consent (the mirror
    // is recorded as behind), which needs a majority of the group alive.
    let mut c = Cluster::start_with(3, |m| m.cluster.replicas = 2);
    // The survivor is the root's home, and the victim its mirror.
    let survivor = c.map.home_of(shoal_proto::ROOT_INO);
    let victim = c.map.mirrors_of(survivor)[0].0;
    let survivor = survivor.0;
    let rt = runtime();
    rt.block_on(async {
        let client = c.client();
        write_file(&client, "/before", b"before", None).await;
    });
    c.kill9(victim);
    let started = Instant::now();
    rt.block_on(async {
        let client = c.client();
        for i in 0..3 {
            let path = format!("/after{i}");
            write_file(&client, &path, b"after", None).await;
            let f = client.open(&path, OpenFlags::read_only()).await.unwrap();
            assert_eq!(&f.read_at(0, 5).await.unwrap()[..], b"after");
        }
    });
    let took = started.elapsed();
    // The mirror's own slot fails over meanwhile (files whose inode it held wait for that).
    assert!(took < Duration::from_secs(15), "server {survivor} went on alone only after {took:?}");
    assert!(
        c.log(survivor).contains("going on without it"),
        "server {survivor} says it lost its mirror:\n{}",
        c.log(survivor)
    );
}
