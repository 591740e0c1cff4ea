//! Kernel caching under leases (docs/mount.md, "Kernel caching under leases"): what the
//! mount lets the kernel keep costs no request while it is unchanged, and another client's
//! change is seen through the mount as soon as that change is answered.

use shoal_client::{OpenFlags, SetAttrs};
use shoal_testkit::mount::{skip_without_fuse, Mount};
use shoal_testkit::Cluster;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Requests served so far, by operation, summed over the servers (`Cluster::ops`).
fn ops(c: &Cluster) -> BTreeMap<String, u64> {
    c.ops()
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// The mount trusts what it was told without a lease for a minute: only the revocation of
/// its leases can make it see another client's change sooner. Each check uses a directory
/// and files of its own (a directory or file another client changed gets no lease for a
/// lease term afterwards).
#[test]
fn another_clients_create_unlink_rename_write_and_chmod_are_seen_at_once() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &["attr_timeout=60", "entry_timeout=60", "negative_timeout=60"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let other = c.client();
    for d in ["create", "unlink", "rename", "write", "chmod"] {
        std::fs::create_dir(m.p(d)).unwrap();
    }
    std::fs::write(m.p("unlink/f"), b"x").unwrap();
    std::fs::write(m.p("rename/f"), b"x").unwrap();
    std::fs::write(m.p("write/f"), b"abc").unwrap();
    std::fs::write(m.p("chmod/f"), b"x").unwrap();

    // What the mount (and its kernel) know before the other client acts.
    assert!(!exists(&m.p("create/new")));
    assert!(exists(&m.p("unlink/f")));
    assert!(exists(&m.p("rename/f")) && !exists(&m.p("rename/g")));
    assert_eq!(std::fs::metadata(m.p("write/f")).unwrap().len(), 3);
    assert_eq!(std::fs::metadata(m.p("chmod/f")).unwrap().mode() & 0o777, 0o644);
    // Asked again: still from the caches (the checks below must beat a cache, not a miss).
    assert!(!exists(&m.p("create/new")));
    assert_eq!(std::fs::metadata(m.p("write/f")).unwrap().len(), 3);

    rt.block_on(async {
        drop(other.create("/create/new", 0o644, None).await.unwrap());
        other.unlink("/unlink/f").await.unwrap();
        other.rename("/rename/f", "/rename/g").await.unwrap();
        let f = other.open("/write/f", OpenFlags::read_write()).await.unwrap();
        f.write_at(3, b"defgh").await.unwrap();
        f.close().await.unwrap();
        let ino = other.stat("/chmod/f").await.unwrap().ino;
        other.setattr(ino, SetAttrs { perm: Some(0o600), ..Default::default() }).await.unwrap();
    });

    // Each change was answered only after the mount let go of what it covered.
    assert!(exists(&m.p("create/new")), "a name another client created is not seen");
    assert!(!exists(&m.p("unlink/f")), "a name another client removed is still seen");
    assert!(!exists(&m.p("rename/f")) && exists(&m.p("rename/g")), "another client's rename is not seen");
    assert_eq!(std::fs::metadata(m.p("write/f")).unwrap().len(), 8, "another client's write is not seen");
    assert_eq!(std::fs::read(m.p("write/f")).unwrap(), b"abcdefgh");
    assert_eq!(std::fs::metadata(m.p("chmod/f")).unwrap().mode() & 0o777, 0o600, "another client's chmod is not seen");
}

/// With the default, short fixed timeouts (1 s), files this mount made and then only looks
/// at are answered from the caches for as long as the leases hold: repeated `stat`, `open`
/// and `close` for longer than the fixed timeouts cost the servers nothing.
#[test]
fn repeated_stat_and_open_of_unchanged_files_cost_no_request() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    std::fs::create_dir(m.p("d")).unwrap();
    let files: Vec<_> = (0..20).map(|i| m.p(&format!("d/f{i}"))).collect();
    for f in &files {
        std::fs::write(f, b"").unwrap();
    }
    // The directories changed (this mount's creates): their attributes are fetched once
    // more, with a lease, when the kernel next needs them (after the fixed 1 s).
    std::thread::sleep(Duration::from_millis(1100));
    for f in &files {
        assert_eq!(std::fs::metadata(f).unwrap().len(), 0);
    }
    let before = ops(&c);
    let start = Instant::now();
    let mut rounds = 0;
    // Twice the mount's fixed 1 s timeouts, within the servers' 5 s lease term.
    while start.elapsed() < Duration::from_millis(2000) {
        for f in &files {
            assert_eq!(std::fs::metadata(f).unwrap().len(), 0);
            drop(std::fs::File::open(f).unwrap());
        }
        rounds += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = ops(&c);
    let spent: BTreeMap<_, _> = after
        .iter()
        .filter_map(|(op, n)| {
            let d = n - before.get(op).copied().unwrap_or(0);
            (d > 0).then(|| (op.clone(), d))
        })
        .collect();
    assert!(rounds >= 10, "{rounds} rounds");
    // Nothing per file; only the renewal of a directory lease (a lookup or a listing of the
    // directory, at most once per third of its 3 s term, for `/` and `d`).
    let renewals = spent.get("readdir").copied().unwrap_or(0) + spent.get("lookup").copied().unwrap_or(0);
    let others: BTreeMap<_, _> = spent.iter().filter(|(op, _)| *op != "readdir" && *op != "lookup").collect();
    assert!(others.is_empty() && renewals <= 4, "{rounds} rounds of stat, open and close of 20 files cost {spent:?}");
}

/// Attribute leases run out on their own (after the server's longest lease, here 1 s)
/// while the directory lease stays in use: the first `stat`s of the names whose leases
/// ran out fetch their attributes again with those of other such names (the client's
/// stat-ahead, `crates/client/src/stat_ahead.rs`), one batched lookup per server for up to
/// 128 names, so stat-ing 200 of them costs well under one request each (80 measured;
/// 240 before the stat-ahead: a lookup and a getattr for many).
#[test]
fn stats_after_attribute_leases_ran_out_are_fetched_ahead_in_batches() {
    if skip_without_fuse() {
        return;
    }
    const N: usize = 200;
    let c = Cluster::start_with_server_args(4, &["--lease-max-ms", "1000"]);
    let m = Mount::new(&c, &["dir_lease=1", "entry_timeout=0.2", "attr_timeout=0.2"]);
    let d = m.p("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..N {
        std::fs::write(d.join(format!("a{i}")), b"").unwrap();
    }
    // Creates keep the directory lease in use (renewed) for longer than an attribute
    // lease; few of them, so that the directory stays small enough to be listed whole
    // (a lease that lapsed is taken again with the complete listing).
    let until = Instant::now() + Duration::from_millis(1800);
    let mut i = 0;
    while Instant::now() < until {
        std::fs::write(d.join(format!("b{i}")), b"").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        i += 1;
    }
    let r0 = c.client_requests();
    let overhead = c.client_requests() - r0;
    let r0 = c.client_requests();
    let o0 = ops(&c);
    for i in 0..N {
        let md = std::fs::metadata(d.join(format!("a{i}"))).unwrap();
        assert!(md.is_file() && md.len() == 0);
    }
    let o1 = ops(&c);
    let n = c.client_requests() - r0 - overhead;
    let by_op: BTreeMap<&String, u64> =
        o1.iter().map(|(k, v)| (k, v - o0.get(k).copied().unwrap_or(0))).filter(|(_, v)| *v > 0).collect();
    eprintln!("stat of {N} files whose attribute leases ran out: {n} requests ({by_op:?})");
    assert!(n <= N as u64 / 2, "stat of {N} files whose attribute leases ran out cost {n} requests");
}
