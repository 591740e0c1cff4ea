//! Split directories seen from clients, on real 4-server clusters: many clients filling one
//! directory while it splits over the servers, listings during the splits, and a client
//! with a stale partition bitmap. Request counts come from the servers' own counters.

use futures::StreamExt;
use shoal_client::{Client, Ino};
use shoal_placement::{name_hash, Bitmap};
use shoal_testkit::{op_count, Cluster};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Create `names` in `dir` with `client`, `parallel` batches of `batch` names at a time;
/// `done` counts the names created so far (in order: a batch is counted once every batch
/// before it is done too, so `done` is a prefix).
async fn create_all(client: &Client, dir: Ino, names: &[String], batch: usize, parallel: usize, done: &AtomicUsize) {
    let chunks: Vec<Vec<String>> = names.chunks(batch).map(<[String]>::to_vec).collect();
    let mut finished = vec![false; chunks.len()];
    let mut prefix = 0;
    let mut results = futures::stream::iter(chunks.into_iter().enumerate())
        .map(|(i, chunk)| {
            let client = client.clone();
            async move { (i, client.create_many_at(dir, &chunk, 0o644, true).await) }
        })
        .boxed()
        .buffered(parallel);
    while let Some((i, r)) = results.next().await {
        for (k, one) in r.expect("batch request").into_iter().enumerate() {
            one.unwrap_or_else(|e| panic!("create #{k} of batch {i}: {e}"));
        }
        finished[i] = true;
        while prefix < finished.len() && finished[prefix] {
            prefix += 1;
            done.store((prefix * batch).min(names.len()), Ordering::SeqCst);
        }
    }
}

/// Every name of a listing exactly once: the names and how often each was listed.
fn counts(listed: &[shoal_client::DirEntry]) -> HashMap<&str, u32> {
    let mut seen = HashMap::new();
    for e in listed {
        *seen.entry(e.name.as_str()).or_insert(0) += 1;
    }
    seen
}

/// The bitmap of `dir` as `client` has learnt it.
fn known(client: &Client, dir: Ino) -> Bitmap {
    Bitmap::try_from(client.dir_bitmap(dir)).expect("a valid bitmap")
}

/// The partitions of `dir` as `client` knows them, and their servers.
fn partitions(c: &Cluster, client: &Client, dir: Ino) -> (Bitmap, Vec<shoal_client::ServerId>) {
    let b = known(client, dir);
    let servers = b.partitions().map(|p| c.map.partition_home(dir, p)).collect();
    (b, servers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_fill_one_directory_that_splits_over_four_servers_and_every_name_is_listed_once() {
    let c = Cluster::start(4);
    let admin = c.uncached_client();
    let d = admin.mkdir("/shared", 0o755).await.unwrap().ino;
    const PER_CLIENT: usize = 25_000;
    let t = Instant::now();
    let creators: Vec<_> = (0..4)
        .map(|k| {
            let client = c.uncached_client();
            tokio::spawn(async move {
                let names: Vec<String> = (0..PER_CLIENT).map(|i| format!("c{k}-{i:05}")).collect();
                create_all(&client, d, &names, 512, 4, &AtomicUsize::new(0)).await;
            })
        })
        .collect();
    for h in creators {
        h.await.unwrap();
    }
    eprintln!("100,000 creates by 4 clients: {:?}", t.elapsed());

    let lister = c.uncached_client();
    let listed = lister.readdir_at(d).await.unwrap();
    let seen = counts(&listed);
    assert_eq!(listed.len(), 4 * PER_CLIENT, "{} entries listed", listed.len());
    assert!(seen.values().all(|&n| n == 1), "a name listed twice");
    for k in 0..4 {
        for i in 0..PER_CLIENT {
            assert!(seen.contains_key(format!("c{k}-{i:05}").as_str()), "c{k}-{i:05} not listed");
        }
    }
    // The listing walked every partition: the lister learnt the bitmap on the way.
    let (bitmap, servers) = partitions(&c, &lister, d);
    assert_eq!(bitmap.len(), 4, "4 partitions on 4 servers: {bitmap:?}");
    assert_eq!(servers.iter().collect::<HashSet<_>>().len(), 4, "partitions on {servers:?}");
    // As the servers hold them now (a fresh client walks the partitions).
    assert_eq!(c.uncached_client().fetch_bitmap(d).await.unwrap(), bitmap);
    // And each server holds about a quarter of the names.
    for (s, st) in admin.status_all().await {
        let entries = st.unwrap().entries;
        assert!(entries >= 15_000, "server {s} holds {entries} entries");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_during_splits_never_shows_a_name_twice_nor_misses_one_made_before_it() {
    let c = Cluster::start(4);
    let admin = c.uncached_client();
    let d = admin.mkdir("/busy", 0o755).await.unwrap().ino;
    const PER_CLIENT: usize = 6_000;
    let done: Arc<Vec<AtomicUsize>> = Arc::new((0..2).map(|_| AtomicUsize::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let name = |k: usize, i: usize| format!("w{k}-{i:05}");
    let creators: Vec<_> = (0..2)
        .map(|k| {
            let (client, done) = (c.uncached_client(), done.clone());
            tokio::spawn(async move {
                let names: Vec<String> = (0..PER_CLIENT).map(|i| name(k, i)).collect();
                // Small batches, so that listings interleave with the splits.
                create_all(&client, d, &names, 64, 2, &done[k]).await;
            })
        })
        .collect();
    let lister = {
        let (client, done, stop) = (c.uncached_client(), done.clone(), stop.clone());
        tokio::spawn(async move {
            let mut listings = 0;
            while !stop.load(Ordering::SeqCst) && listings < 1000 {
                let made: Vec<usize> = done.iter().map(|n| n.load(Ordering::SeqCst)).collect();
                // Small pages: many positions to continue from while partitions move.
                let mut listed = Vec::new();
                let mut after = None;
                loop {
                    let (page, more) = client.readdir_page(d, after.clone(), 100).await.unwrap();
                    assert!(!(page.is_empty() && more), "an empty page said more follow");
                    after = page.last().map(|e| e.name.clone()).or(after);
                    listed.extend(page);
                    if !more {
                        break;
                    }
                }
                let seen = counts(&listed);
                if let Some((n, _)) = seen.iter().find(|(_, &k)| k > 1) {
                    panic!("listing {listings}: {n} listed twice");
                }
                for (k, &m) in made.iter().enumerate() {
                    for i in 0..m {
                        assert!(seen.contains_key(name(k, i).as_str()), "listing {listings}: {} missing", name(k, i));
                    }
                }
                listings += 1;
            }
            listings
        })
    };
    for h in creators {
        h.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let listings = lister.await.unwrap();
    assert!(listings >= 2, "only {listings} listings ran during the creates");
    let all = admin.readdir_at(d).await.unwrap();
    assert_eq!(all.len(), 2 * PER_CLIENT);
    assert!(counts(&all).values().all(|&n| n == 1));
}

/// Lookups of `dir/name` the servers answered so far, over all servers.
async fn lookups(admin: &Client) -> u64 {
    op_count(admin, "lookup").await.iter().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_a_stale_bitmap_finds_any_entry_in_at_most_two_requests() {
    let c = Cluster::start(4);
    let admin = c.uncached_client();
    let d = admin.mkdir("/grows", 0o755).await.unwrap().ino;
    let writer = c.uncached_client();
    let names: Vec<String> = (0..2000).map(|i| format!("g{i:04}")).collect();
    // Enough for the first split (partition 0 reaches 32 entries), not for the next ones.
    create_all(&writer, d, &names[..40], 40, 1, &AtomicUsize::new(0)).await;
    // The stale client learns the bitmap of 2 partitions (a name of partition 1 is answered
    // with it by the home), waiting for the split to run.
    let stale = c.uncached_client();
    let odd = names[..40].iter().find(|n| name_hash(n) & 1 == 1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while known(&stale, d).len() < 2 {
        assert!(Instant::now() < deadline, "the directory never split");
        stale.lookup(d, odd).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(Vec::<u64>::from(known(&stale, d)), vec![0b11], "the stale client knows partitions 0 and 1");
    // The directory grows to 4 partitions (on 4 servers).
    create_all(&writer, d, &names[40..], 200, 2, &AtomicUsize::new(0)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let fresh = c.uncached_client();
    while known(&fresh, d).len() < 4 {
        assert!(Instant::now() < deadline, "the directory never reached 4 partitions");
        fresh.lookup_many(d, &names[..64]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(Vec::<u64>::from(known(&stale, d)), vec![0b11], "still stale");
    // A name of partition 2 (the stale client sends it to partition 0's server) and one of
    // partition 3 (sent to partition 1's server, which is not the directory's home).
    for low in [0b10u64, 0b11] {
        let name = names.iter().find(|n| name_hash(n) & 0b11 == low).unwrap();
        let before = lookups(&admin).await;
        let a = stale.lookup(d, name).await.unwrap();
        let cost = lookups(&admin).await - before;
        assert_eq!(a.kind, shoal_client::FileKind::File);
        assert!(cost <= 2, "a lookup with a stale bitmap cost {cost} requests");
        if low == 0b10 {
            assert_eq!(cost, 2, "the first lookup was misrouted once (the bitmap was stale)");
        }
    }
    assert_eq!(known(&stale, d).len(), 4, "the client learnt the new bitmap");
    // Now every lookup is one request.
    let before = lookups(&admin).await;
    for n in names.iter().take(100) {
        stale.lookup(d, n).await.unwrap();
    }
    assert_eq!(lookups(&admin).await - before, 100);
}

/// Namespace reads (lookups and listings) the servers answered so far.
async fn reads(admin: &Client) -> u64 {
    lookups(admin).await + op_count(admin, "readdir").await.iter().sum::<u64>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_one_partition_answers_its_names_only_and_is_revoked_by_another_client_s_create() {
    let c = Cluster::start(4);
    let admin = c.uncached_client();
    let d = admin.mkdir("/leased", 0o755).await.unwrap().ino;
    let names: Vec<String> = (0..400).map(|i| format!("l{i:03}")).collect();
    create_all(&admin, d, &names, 100, 1, &AtomicUsize::new(0)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while known(&admin, d).len() < 4 {
        assert!(Instant::now() < deadline, "the directory never reached 4 partitions");
        admin.lookup_many(d, &names).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let opts =
        shoal_client::ClientOptions { cache_ttl: Duration::ZERO, dir_lease: Duration::from_secs(10), ..c.options() };
    let holder = Client::from_config(&c.config, opts).unwrap();
    // Two missing names in different partitions.
    let missing = |low: u64| (0..).map(|i| format!("new{i}")).find(|n| name_hash(n) & 0b11 == low).unwrap();
    let (x, y) = (missing(0b01), missing(0b10));
    assert_eq!(holder.lookup(d, &x).await.unwrap_err().errno, shoal_client::Errno::ENOENT);
    let before = reads(&admin).await;
    for _ in 0..20 {
        assert_eq!(holder.lookup(d, &x).await.unwrap_err().errno, shoal_client::Errno::ENOENT);
    }
    assert_eq!(reads(&admin).await, before, "answered from the lease on x's partition");
    // y is in another partition: that lease says nothing of it.
    assert_eq!(holder.lookup(d, &y).await.unwrap_err().errno, shoal_client::Errno::ENOENT);
    assert!(reads(&admin).await > before, "y was asked of its server");
    // Another client creates x: the lease is revoked, the holder sees x at once.
    let made = c.uncached_client().create_at(d, &x, 0o644, true, None).await.unwrap();
    assert_eq!(holder.lookup(d, &x).await.unwrap().ino, made.ino);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shoal_ls_prints_every_name_of_a_split_directory_sorted() {
    let c = Cluster::start(4);
    let admin = c.uncached_client();
    let d = admin.mkdir("/many", 0o755).await.unwrap().ino;
    let mut names: Vec<String> = (0..500).map(|i| format!("m{i:03}")).collect();
    create_all(&admin, d, &names, 100, 1, &AtomicUsize::new(0)).await;
    assert!(admin.fetch_bitmap(d).await.unwrap().len() > 1, "the directory split");
    let (code, out, err) = c.shoal(&["ls", "/many"]);
    assert_eq!(code, 0, "{err}");
    names.sort();
    assert_eq!(out.lines().collect::<Vec<_>>(), names, "every name once, in name order");
}
