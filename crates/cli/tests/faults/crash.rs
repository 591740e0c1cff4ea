//! Durability: whatever was acknowledged survives `kill -9` of a server during a workload.

use shoal_client::{Client, LayoutSpec, OpenFlags};
use shoal_testkit::{pattern, Cluster};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One unit of work: a directory, a small file and a 4-way striped file, each with content.
/// Returns the paths that were fully acknowledged.
async fn work_unit(fs: &Client, i: u32) -> Vec<(String, u64, usize)> {
    let mut acked = Vec::new();
    let dir = format!("/w/d{i}");
    if fs.mkdir(&dir, 0o755).await.is_err() {
        return acked;
    }
    acked.push((dir.clone(), 0, 0));
    for (name, len, spec) in [
        ("small", 3_000usize, None),
        (
            "striped",
            300_000,
            Some(LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(4), ..Default::default() }),
        ),
    ] {
        let path = format!("{dir}/{name}");
        let seed = i as u64 * 10 + len as u64;
        let ok = async {
            let f = fs.create(&path, 0o644, spec).await?;
            f.write_at(0, &pattern(seed, 0, len)).await?;
            f.close().await
        }
        .await;
        if ok.is_ok() {
            acked.push((path, seed, len));
        }
    }
    acked
}

async fn verify(fs: &Client, acked: &[(String, u64, usize)]) {
    for (path, seed, len) in acked {
        let attr = fs.stat(path).await.unwrap_or_else(|e| panic!("acknowledged {path} lost: {e}"));
        if *len == 0 {
            assert_eq!(attr.kind, shoal_client::FileKind::Dir);
            continue;
        }
        assert_eq!(attr.size, *len as u64, "{path} size");
        let f = fs.open(path, OpenFlags::read_only()).await.unwrap();
        let got = f.read_at(0, *len).await.unwrap();
        assert!(got[..] == pattern(*seed, 0, *len)[..], "{path} content differs after the crash");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_a_server_during_a_workload_loses_nothing_acknowledged() {
    let mut cluster = Cluster::start(4);
    let fs = Client::from_config(
        &cluster.config,
        shoal_client::ClientOptions { timeout: Duration::from_secs(5), ..cluster.options() },
    )
    .unwrap();
    fs.mkdir("/w", 0o755).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let (s, f2) = (stop.clone(), fs.clone());
    let worker = tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut i = 0;
        while !s.load(Ordering::SeqCst) && i < 5_000 {
            acked.extend(work_unit(&f2, i).await);
            i += 1;
        }
        (acked, i)
    });

    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill9(2);
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.restart(2);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::SeqCst);
    let (acked, units) = worker.await.unwrap();
    assert!(units > 10, "the workload made progress ({units} units)");
    assert!(acked.len() > 20);

    // Everything acknowledged is there, read by a client that caches nothing.
    verify(&cluster.uncached_client(), &acked).await;

    // And after every server is killed at once and restarted, still.
    for id in 0..4 {
        cluster.kill9(id);
    }
    for id in 0..4 {
        cluster.restart(id);
    }
    let fresh = cluster.uncached_client();
    verify(&fresh, &acked).await;
    // The restarted cluster takes new work everywhere.
    let more = work_unit(&fresh, 99_999).await;
    assert_eq!(more.len(), 3, "new work after restart: {more:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_server_gives_an_error_not_a_hang_and_service_resumes() {
    let mut cluster = Cluster::start(2);
    let fs = Client::from_config(
        &cluster.config,
        shoal_client::ClientOptions { timeout: Duration::from_secs(3), ..cluster.options() },
    )
    .unwrap();
    let spec = LayoutSpec { stripe_count: Some(2), stripe_size: Some(4096), ..Default::default() };
    let f = fs.create("/both", 0o644, Some(spec)).await.unwrap();
    f.write_at(0, &pattern(5, 0, 16384)).await.unwrap();
    f.close().await.unwrap();

    cluster.kill9(1);
    let started = std::time::Instant::now();
    let f = fs.open("/both", OpenFlags::read_only()).await;
    let r = match f {
        Ok(f) => f.read_at(0, 16384).await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(r.is_err(), "reading a stripe on a dead server fails");
    assert!(started.elapsed() < Duration::from_secs(10), "and fails quickly");

    cluster.restart(1);
    let f = fs.open("/both", OpenFlags::read_only()).await.unwrap();
    assert!(f.read_at(0, 16384).await.unwrap()[..] == pattern(5, 0, 16384)[..]);
}
