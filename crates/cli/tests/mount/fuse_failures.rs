//! A FUSE mount facing a server that stops answering: every call gets its answer within
//! its own timeout, whatever other calls are waiting for the same server.

use shoal_proto::ROOT_INO;
use shoal_testkit::mount::{skip_without_fuse, Mount};
use shoal_testkit::Cluster;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Thaws a frozen server when dropped, also when the test fails half-way.
struct Frozen<'a>(&'a Cluster, u32);

impl<'a> Frozen<'a> {
    fn new(c: &'a Cluster, id: u32) -> Frozen<'a> {
        c.signal(id, libc::SIGSTOP);
        Frozen(c, id)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.signal(self.1, libc::SIGCONT);
    }
}

fn stat_process(p: &Path) -> Child {
    Command::new("stat").arg(p).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("run stat")
}

/// Wait for every child (at most `limit` in all; the rest are killed): how long each took
/// from `start` and whether it succeeded (None: still running at the limit).
fn wait_all(children: Vec<Child>, start: Instant, limit: Duration) -> Vec<(Duration, Option<bool>)> {
    let mut out: Vec<Option<(Duration, Option<bool>)>> = vec![None; children.len()];
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    while out.iter().any(|o| o.is_none()) {
        for (i, slot) in children.iter_mut().enumerate() {
            let Some(c) = slot else { continue };
            if let Ok(Some(st)) = c.try_wait() {
                out[i] = Some((start.elapsed(), Some(st.success())));
                *slot = None;
            }
        }
        if start.elapsed() > limit {
            for (i, slot) in children.iter_mut().enumerate() {
                if let Some(mut c) = slot.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                    out[i] = Some((start.elapsed(), None));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    out.into_iter().map(|o| o.unwrap()).collect()
}

#[test]
fn concurrent_stats_on_a_frozen_server_each_fail_within_their_own_timeout() {
    if skip_without_fuse() {
        return;
    }
    const TIMEOUT: u64 = 3;
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[&format!("timeout={TIMEOUT}")]);
    let client = c.uncached_client();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // The server to freeze holds a directory but not the root (so the way to other
    // directories stays open); another directory lives elsewhere.
    let root_home = client.home_of(ROOT_INO);
    let (mut frozen_dir, mut other_dir) = (None, None);
    for i in 0..64 {
        let dir = format!("d{i}");
        std::fs::create_dir(m.p(&dir)).unwrap();
        let home = client.home_of(rt.block_on(client.stat(&format!("/{dir}"))).unwrap().ino);
        if home != root_home && frozen_dir.is_none() {
            frozen_dir = Some((dir, home));
        } else if frozen_dir.as_ref().is_some_and(|(_, f)| *f != home) && other_dir.is_none() {
            other_dir = Some(dir);
        }
        if frozen_dir.is_some() && other_dir.is_some() {
            break;
        }
    }
    let (frozen_dir, server) = frozen_dir.expect("a directory away from the root's server");
    let other_dir = other_dir.expect("a directory on a third server");
    for k in 0..6 {
        std::fs::write(m.p(&format!("{frozen_dir}/f{k}")), b"x").unwrap();
    }
    std::fs::write(m.p(&format!("{other_dir}/g")), b"y").unwrap();
    // Let the kernel's entry and attribute caches (1 s) expire: the stats must ask.
    std::thread::sleep(Duration::from_millis(1500));

    let frozen = Frozen::new(&c, server.0);
    let start = Instant::now();
    let stats: Vec<Child> = (0..6).map(|k| stat_process(&m.p(&format!("{frozen_dir}/f{k}")))).collect();
    // Meanwhile a file on another server answers at once.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let other = std::fs::metadata(m.p(&format!("{other_dir}/g")));
    let other_took = t.elapsed();
    let results = wait_all(stats, start, Duration::from_secs(8 * TIMEOUT));
    drop(frozen);

    assert!(other.is_ok(), "stat on a live server failed: {other:?}");
    assert!(other_took < Duration::from_secs(TIMEOUT), "stat on a live server took {other_took:?}");
    // Each call waits for its own timeout (plus scheduling on a loaded machine), never for
    // the calls queued before it (k × timeout).
    let bound = Duration::from_secs(2 * TIMEOUT + 2);
    for (k, (took, ok)) in results.iter().enumerate() {
        assert_eq!(*ok, Some(false), "stat {k} of a name on the frozen server: {ok:?} after {took:?} ({results:?})");
        assert!(*took <= bound, "stat {k} answered after {took:?}, more than {bound:?}: {results:?}");
    }
    // Thawed, the server answers again.
    let back = Instant::now();
    while std::fs::metadata(m.p(&format!("{frozen_dir}/f0"))).is_err() {
        assert!(back.elapsed() < Duration::from_secs(20), "server not answering after SIGCONT");
        std::thread::sleep(Duration::from_millis(200));
    }
}
