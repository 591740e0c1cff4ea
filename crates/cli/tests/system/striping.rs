//! Data path on real servers: striping, holes, large offsets, concurrent writers.

use shoal_client::{LayoutSpec, OpenFlags};
use shoal_testkit::{pattern, Cluster};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_gib_file_striped_over_four_servers_round_trips_byte_identical() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(1 << 20), stripe_count: Some(4), ..Default::default() };
    let f = fs.create("/big", 0o644, Some(spec)).await.unwrap();
    assert_eq!(f.layout().servers.len(), 4);
    assert_eq!(f.layout().stripe_size, 1 << 20);
    let mut distinct = f.layout().servers.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "four different servers");

    let size: u64 = 1 << 30;
    let chunk = 32usize << 20;
    let mut off = 0;
    while off < size {
        f.write_at(off, &pattern(1, off, chunk)).await.unwrap();
        off += chunk as u64;
    }
    f.close().await.unwrap();

    // Every server received a quarter of the bytes (± protocol overhead).
    let status = fs.status_all().await;
    for (id, st) in &status {
        let got = st.as_ref().unwrap().counters.bytes_received;
        assert!(got >= size / 4 && got < size / 4 + (16 << 20), "server {id} received {got} bytes");
    }

    // Read back through a fresh client, in odd-sized pieces crossing stripe boundaries.
    let reader = cluster.uncached_client();
    let f = reader.open("/big", OpenFlags::read_only()).await.unwrap();
    assert_eq!(f.attr().size, size);
    let piece = (24 << 20) + 12345;
    let mut off = 0u64;
    while off < size {
        let len = piece.min((size - off) as usize);
        let got = f.read_at(off, len).await.unwrap();
        assert_eq!(got.len(), len);
        assert!(got[..] == pattern(1, off, len)[..], "mismatch in {off}..{}", off + len as u64);
        off += len as u64;
    }
    // Past the end: nothing.
    assert!(f.read_at(size, 100).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_files_beyond_4_gib_read_holes_as_zeros() {
    let cluster = Cluster::start(3);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(3), ..Default::default() };
    let f = fs.create("/sparse", 0o600, Some(spec)).await.unwrap();
    let far = (5u64 << 30) + 777;
    f.write_at(far, b"tail").await.unwrap();
    f.write_at(100, b"head").await.unwrap();
    f.close().await.unwrap();

    let attr = fs.stat("/sparse").await.unwrap();
    assert_eq!(attr.size, far + 4);
    let f = fs.open("/sparse", OpenFlags::read_only()).await.unwrap();
    assert_eq!(&f.read_at(far - 3, 7).await.unwrap()[..], b"\0\0\0tail");
    assert_eq!(&f.read_at(96, 12).await.unwrap()[..], b"\0\0\0\0head\0\0\0\0");
    let hole = f.read_at(3 << 30, 1 << 20).await.unwrap();
    assert_eq!(hole.len(), 1 << 20);
    assert!(hole.iter().all(|&b| b == 0));

    // Truncate down and up again: the cut-off bytes do not come back.
    fs.truncate("/sparse", 102).await.unwrap();
    fs.truncate("/sparse", 4096).await.unwrap();
    let f = fs.open("/sparse", OpenFlags::read_only()).await.unwrap();
    assert_eq!(&f.read_at(96, 12).await.unwrap()[..], b"\0\0\0\0he\0\0\0\0\0\0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_to_disjoint_ranges_of_one_file() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(4), ..Default::default() };
    fs.create("/shared", 0o666, Some(spec)).await.unwrap().close().await.unwrap();

    // Eight writers, each its own client and handle, interleaved 47,008-byte blocks (IOR hard).
    let block = 47_008u64;
    let writers = 8u64;
    let rounds = 40u64;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let c = cluster.client();
        tasks.push(tokio::spawn(async move {
            let f = c.open("/shared", OpenFlags::write_only()).await.unwrap();
            for r in 0..rounds {
                let off = (r * writers + w) * block;
                f.write_at(off, &pattern(9, off, block as usize)).await.unwrap();
            }
            f.close().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = block * writers * rounds;
    let f = cluster.uncached_client().open("/shared", OpenFlags::read_only()).await.unwrap();
    assert_eq!(f.attr().size, total);
    let got = f.read_at(0, total as usize).await.unwrap();
    assert!(got[..] == pattern(9, 0, total as usize)[..]);
}

// ---------------------------------------------------------------- write-behind, readahead

/// Read requests served so far, per server.
async fn reads_served(client: &shoal_client::Client) -> u64 {
    shoal_testkit::op_count(client, "read").await.iter().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_behind_failures_are_reported_by_the_next_call() {
    let cluster = Cluster::start(2);
    let fs = cluster.client();
    let other = cluster.uncached_client();
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(2), ..Default::default() };
    // Writes to object 0 go to the inode's server, which refuses them once the file is gone
    // (ENOENT): a failure that shows only after the write has returned.
    for (n, reporter) in ["flush", "close", "overlapping write", "fsync"].iter().enumerate() {
        let path = format!("/wb{n}");
        let f = fs.create(&path, 0o644, Some(spec.clone())).await.unwrap();
        assert!(f.writes_behind());
        assert_eq!(f.layout().servers[0], fs.home_of(f.ino()));
        f.write_at(0, &pattern(3, 0, 4096)).await.unwrap();
        f.flush().await.unwrap();
        other.unlink(&path).await.unwrap();
        // Returns once sent: the refusal comes later.
        assert_eq!(f.write_at(4096, &pattern(3, 4096, 4096)).await.unwrap(), 4096);
        let err = match *reporter {
            "flush" => f.flush().await.unwrap_err(),
            "close" => f.clone().close().await.unwrap_err(),
            // Overlaps the failed write, so it waits for it and reports it (not sent itself).
            "overlapping write" => f.write_at(4096, b"again").await.unwrap_err(),
            _ => f.fsync().await.unwrap_err(),
        };
        assert_eq!(err.errno, shoal_client::Errno::ENOENT, "{reporter}: {err}");
        assert!(err.to_string().contains("earlier write at 4096"), "{reporter}: {err}");
        // Reported once.
        f.flush().await.unwrap();
    }

    // A server that died: the write returns, close fails.
    let mut cluster = cluster;
    let f = fs.create("/dead", 0o644, Some(spec.clone())).await.unwrap();
    let remote = f.layout().servers.iter().position(|&s| s != fs.home_of(f.ino())).unwrap() as u64;
    f.write_at(0, &pattern(4, 0, 1000)).await.unwrap();
    f.flush().await.unwrap();
    cluster.kill9(f.layout().servers[remote as usize].0);
    let off = remote * (64 << 10);
    f.write_at(off, &pattern(4, off, 1000)).await.unwrap();
    // `stat` waits for the write but leaves its failure to the calls that report them.
    assert_eq!(f.stat().await.unwrap().size, 1000, "the failed write does not count");
    let err = f.close().await.unwrap_err();
    assert!(err.to_string().contains("earlier write"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_behind_keeps_order_and_a_handle_reads_its_own_writes() {
    let cluster = Cluster::start(3);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(3), ..Default::default() };
    let f = fs.create("/order", 0o644, Some(spec)).await.unwrap();
    // Overlapping writes in flight at once: the later one wins, as if each had waited.
    let mut expect = vec![0u8; 1 << 20];
    for round in 0..20u64 {
        let off = round * 37_000;
        let data = pattern(100 + round, off, 300_000);
        f.write_at(off, &data).await.unwrap();
        expect[off as usize..off as usize + data.len()].copy_from_slice(&data);
    }
    let end = 19 * 37_000 + 300_000;
    assert_eq!(f.attr().size, end, "the handle's size counts writes in flight");
    // Read back through the same handle before any flush.
    let got = f.read_at(0, end as usize).await.unwrap();
    assert!(got[..] == expect[..end as usize]);
    f.close().await.unwrap();
    let g = cluster.uncached_client().open("/order", OpenFlags::read_only()).await.unwrap();
    assert_eq!(g.attr().size, end);
    assert!(g.read_at(0, end as usize).await.unwrap()[..] == expect[..end as usize]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readahead_follows_writes_and_close_to_open() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(1 << 20), stripe_count: Some(4), ..Default::default() };
    let size = 8u64 << 20;
    let f = fs.create("/ra", 0o644, Some(spec)).await.unwrap();
    f.write_at(0, &pattern(1, 0, size as usize)).await.unwrap();
    f.close().await.unwrap();

    // A forward reader: after its first reads, the window holds the next megabytes.
    let reader = cluster.client();
    let r = reader.open("/ra", OpenFlags::read_write()).await.unwrap();
    for i in 0..4u64 {
        let off = i * (256 << 10);
        assert!(r.read_at(off, 256 << 10).await.unwrap()[..] == pattern(1, off, 256 << 10)[..]);
    }
    // Its own write ahead of it is read back, not the prefetched bytes.
    let mine = 3u64 << 20;
    r.write_at(mine, &pattern(2, mine, 10_000)).await.unwrap();
    let got = r.read_at(1 << 20, 3 << 20).await.unwrap();
    let mut expect = pattern(1, 1 << 20, 3 << 20);
    expect[(2 << 20)..(2 << 20) + 10_000].copy_from_slice(&pattern(2, mine, 10_000));
    assert!(got[..] == expect[..]);

    // Another client rewrites a part the reader has prefetched, and closes.
    let theirs = 5u64 << 20;
    let w = cluster.client().open("/ra", OpenFlags::write_only()).await.unwrap();
    w.write_at(theirs, &pattern(3, theirs, 20_000)).await.unwrap();
    w.close().await.unwrap();
    // Close-to-open: a new open sees it.
    let fresh = reader.open("/ra", OpenFlags::read_only()).await.unwrap();
    let mut off = 4u64 << 20;
    while off < size {
        let got = fresh.read_at(off, 300_000).await.unwrap();
        let mut expect = pattern(1, off, got.len());
        let (a, b) = (theirs.max(off), (theirs + 20_000).min(off + got.len() as u64));
        if a < b {
            expect[(a - off) as usize..(b - off) as usize].copy_from_slice(&pattern(3, a, (b - a) as usize));
        }
        assert!(got[..] == expect[..], "at {off}");
        off += got.len() as u64;
    }
    // So does the old handle once `stat` finds the file changed.
    r.stat().await.unwrap();
    assert!(r.read_at(theirs, 20_000).await.unwrap()[..] == pattern(3, theirs, 20_000)[..]);
    r.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readahead_stops_at_the_end_of_file_and_fetches_each_piece_once() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    let stripe = 64u64 << 10;
    let spec = LayoutSpec { stripe_size: Some(stripe), stripe_count: Some(4), ..Default::default() };
    let size = (3u64 << 20) + 12_345;
    let f = fs.create("/eof", 0o644, Some(spec)).await.unwrap();
    f.write_at(0, &pattern(7, 0, size as usize)).await.unwrap();
    f.close().await.unwrap();

    let before = reads_served(&fs).await;
    let sent_before: u64 = fs.status_all().await.iter().map(|(_, s)| s.as_ref().unwrap().counters.bytes_sent).sum();
    let r = cluster.client().open("/eof", OpenFlags::read_only()).await.unwrap();
    let mut off = 0u64;
    let mut last = 0;
    loop {
        let got = r.read_at(off, 100_000).await.unwrap();
        if got.is_empty() {
            break;
        }
        assert!(got[..] == pattern(7, off, got.len())[..], "at {off}");
        last = got.len();
        off += got.len() as u64;
    }
    assert_eq!(off, size);
    assert_eq!(last as u64, size % 100_000, "a short read at the end");
    assert!(r.read_at(size, 10).await.unwrap().is_empty());
    assert!(r.read_at(size + 5000, 10).await.unwrap().is_empty());
    // Every piece of the file was asked for once, nothing beyond its end.
    assert_eq!(reads_served(&fs).await - before, size.div_ceil(stripe));
    let sent: u64 = fs.status_all().await.iter().map(|(_, s)| s.as_ref().unwrap().counters.bytes_sent).sum();
    assert!(sent - sent_before < size + (64 << 10), "sent {} for {size}", sent - sent_before);

    // A handle knows the size it opened with: another client's append is not read (or
    // prefetched) until `stat`.
    let w = cluster.client().open("/eof", OpenFlags::write_only()).await.unwrap();
    w.write_at(size, &pattern(7, size, 50_000)).await.unwrap();
    w.close().await.unwrap();
    assert!(r.read_at(size - 10, 100).await.unwrap()[..] == pattern(7, size - 10, 10)[..]);
    assert_eq!(r.stat().await.unwrap().size, size + 50_000);
    assert!(r.read_at(size - 10, 100).await.unwrap()[..] == pattern(7, size - 10, 100)[..]);
}

/// Readahead that nobody reads still finishes. A fresh client's first reads start pieces
/// on servers it has no connection to yet; such a piece, left half-way through opening its
/// connection, once held that connection slot until the handle read it: every later call
/// that came to the slot waited for the client's whole timeout (found by a list read
/// after forward reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readahead_left_unread_does_not_hold_up_other_calls() {
    let cluster = Cluster::start(4);
    let stripe = 64u64 << 10;
    let spec = LayoutSpec { stripe_size: Some(stripe), stripe_count: Some(4), ..Default::default() };
    let size = 4 << 20;
    let f = cluster.client().create("/ahead", 0o644, Some(spec)).await.unwrap();
    f.write_at(0, &pattern(5, 0, size)).await.unwrap();
    f.close().await.unwrap();

    for round in 0..4 {
        let fs = cluster.client();
        let r = fs.open("/ahead", OpenFlags::read_only()).await.unwrap();
        // Two forward reads on object 0: the second starts readahead on the others.
        r.read_at(0, 4096).await.unwrap();
        r.read_at(4096, 4096).await.unwrap();
        // The handle never reads what was fetched ahead; calls to every server go on.
        let g = fs.open("/ahead", OpenFlags::read_only()).await.unwrap();
        for i in 0..16u64 {
            let off = (i % 4) * stripe + 100_000 * round;
            let started = Instant::now();
            let got = g.read_at(off, 1000).await.unwrap();
            assert!(got[..] == pattern(5, off, 1000)[..]);
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "round {round}, read {i} waited {:?}",
                started.elapsed()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_set_after_drain_are_not_stamped_over() {
    use shoal_client::{TimeSet, Timestamp};
    let cluster = Cluster::start(2);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(2), ..Default::default() };
    let f = fs.create("/times", 0o644, Some(spec)).await.unwrap();
    // Pieces on both servers: one raises the size itself, the other is published later
    // (ExtendSize, which stamps the mtime).
    f.write_at(0, &pattern(5, 0, 200_000)).await.unwrap();
    f.drain().await.unwrap();
    let at = Timestamp { secs: 1_500_017_000, nsecs: 123_456_789 };
    fs.utimens("/times", None, Some(TimeSet::At(at))).await.unwrap();
    f.close().await.unwrap();
    let a = cluster.uncached_client().stat("/times").await.unwrap();
    assert_eq!((a.mtime, a.size), (at, 200_000));
}

// ---------------------------------------------------------------- truncate and locks

/// Sends a signal to a server process (SIGSTOP makes it unreachable without closing its
/// connections: calls to it wait for their timeout).
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child process of this test.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncate_waiting_on_an_unreachable_server_does_not_block_other_changes_of_the_file() {
    let cluster = Cluster::start(2);
    let fs = cluster.uncached_client();
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(2), ..Default::default() };
    let f = fs.create("/t", 0o644, Some(spec)).await.unwrap();
    f.write_at(0, &pattern(5, 0, 256 << 10)).await.unwrap();
    f.close().await.unwrap();
    let attr = fs.stat("/t").await.unwrap();
    let home = fs.home_of(attr.ino);
    let other = attr.layout.as_ref().unwrap().servers.iter().copied().find(|&s| s != home).unwrap();

    // The truncate's cut of the object on `other` waits (the peer timeout is 10 s).
    let pid = cluster.pid(other.0);
    signal(pid, libc::SIGSTOP);
    let fs2 = fs.clone();
    let truncate = tokio::spawn(async move { fs2.truncate("/t", 1000).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Meanwhile the inode's home changes the same file at once: no lock is held across the
    // peer call.
    let start = Instant::now();
    let chmod = fs.chmod("/t", 0o600).await;
    let took = start.elapsed();
    signal(pid, libc::SIGCONT);
    chmod.unwrap();
    assert!(took < Duration::from_secs(4), "chmod waited {took:?} for a truncate's peer call");
    // Whatever the truncate answered, its commit kept the chmod, and a truncate now works.
    let _ = truncate.await.unwrap();
    assert_eq!(fs.stat("/t").await.unwrap().perm & 0o7777, 0o600);
    fs.truncate("/t", 1000).await.unwrap();
    let a = fs.stat("/t").await.unwrap();
    assert_eq!((a.size, a.perm & 0o7777), (1000, 0o600));
    let f = fs.open("/t", OpenFlags::read_only()).await.unwrap();
    assert!(f.read_at(0, 1 << 20).await.unwrap()[..] == pattern(5, 0, 1000)[..]);
}

/// A `stat` of a handle racing with a truncate through the same handle must not bring back
/// the size from before the truncate (the fsx failure on the mount: a kernel read-ahead
/// refreshed the handle while the next truncate ran, and its stale answer landed last).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stat_racing_a_truncate_never_restores_the_old_size() {
    let cluster = Cluster::start(2);
    let fs = cluster.client();
    let f = fs.create("/cut", 0o644, None).await.unwrap();
    let mut size = 4u64 << 20;
    f.set_len(size).await.unwrap();
    for round in 0..400u64 {
        let racer = f.clone();
        let stat = tokio::spawn(async move { racer.stat().await.map(|a| a.size) });
        // Alternate down and up so every round changes the size.
        size = if round % 2 == 0 { size / 2 + round } else { size * 2 - round };
        f.set_len(size).await.unwrap();
        stat.await.unwrap().unwrap();
        assert_eq!(f.attr().size, size, "round {round}: the handle's size after the truncate and a racing stat");
        assert_eq!(f.stat().await.unwrap().size, size, "round {round}: stat after both");
    }
}
