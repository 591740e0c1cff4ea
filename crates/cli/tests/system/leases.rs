//! Directory leases on real servers: lookups (also of missing names) answered from a lease,
//! revocation when another client changes the directory, expiry, a holder that cannot
//! answer, and clients without the feature. Request counts come from the servers' own
//! counters; timings have wide margins (the machine is shared).

use shoal_client::{Client, ClientOptions, Errno};
use shoal_proto::lease::LeaseAsk;
use shoal_proto::msg::{Cred, Op};
use shoal_testkit::{op_count, Cluster};
use std::time::{Duration, Instant};

/// A client holding leases of `term` (no entry cache, so that every answer not sent by a
/// server comes from a lease).
fn leased_client(c: &Cluster, term: Duration) -> Client {
    let opts = ClientOptions { cache_ttl: Duration::ZERO, dir_lease: term, ..c.options() };
    Client::from_config(&c.config, opts).unwrap()
}

/// Namespace reads the servers served so far (what a lease saves).
async fn reads(c: &Client) -> u64 {
    op_count(c, "lookup").await.iter().sum::<u64>() + op_count(c, "readdir").await.iter().sum::<u64>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_lookups_are_answered_from_the_lease() {
    let c = Cluster::start(2);
    let admin = c.uncached_client();
    let d = admin.mkdir("/d", 0o755).await.unwrap().ino;
    let a = leased_client(&c, Duration::from_secs(5));
    let before = reads(&admin).await;
    for _ in 0..100 {
        assert_eq!(a.lookup(d, "missing").await.unwrap_err().errno, Errno::ENOENT);
    }
    let cost = reads(&admin).await - before;
    assert!(cost <= 2, "100 lookups of a missing name cost {cost} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_revoked_when_another_client_creates_the_name() {
    let c = Cluster::start(2);
    let admin = c.uncached_client();
    let d = admin.mkdir("/d", 0o755).await.unwrap().ino;
    // The holder keeps its own entry cache too (1 s): a revocation must clear it as well.
    let opts = ClientOptions { dir_lease: Duration::from_secs(5), ..c.options() };
    let holder = Client::from_config(&c.config, opts).unwrap();
    let other = c.client();
    assert_eq!(holder.lookup(d, "x").await.unwrap_err().errno, Errno::ENOENT);
    let before = reads(&admin).await;
    assert_eq!(holder.lookup(d, "x").await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(reads(&admin).await, before, "the second lookup was answered locally");

    let t = Instant::now();
    let made = other.create_at(d, "x", 0o644, true, None).await.unwrap();
    let took = t.elapsed();
    // The holder acknowledged at once: the create did not wait for the lease to run out.
    assert!(took < Duration::from_millis(2500), "the create waited {took:?} for the revocation");
    // Seen at once, not after the lease (or the entry cache) expired.
    let seen = holder.lookup(d, "x").await.expect("the holder sees the new name at once");
    assert_eq!(seen.ino, made.ino);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_is_answered_from_the_lease_until_another_client_changes_the_directory() {
    let c = Cluster::start(2);
    let admin = c.uncached_client();
    let d = admin.mkdir("/d", 0o755).await.unwrap().ino;
    for n in ["a", "b"] {
        admin.create_at(d, n, 0o644, true, None).await.unwrap();
    }
    let holder = leased_client(&c, Duration::from_secs(5));
    // Sorted: a listing is in listing order (by name hash), which this test does not check.
    let names = |v: Vec<shoal_client::DirEntry>| {
        let mut n = v.into_iter().map(|e| e.name).collect::<Vec<_>>();
        n.sort();
        n
    };
    assert_eq!(names(holder.readdir_at(d).await.unwrap()), ["a", "b"]);
    let before = reads(&admin).await;
    assert_eq!(names(holder.readdir_at(d).await.unwrap()), ["a", "b"]);
    assert_eq!(holder.lookup(d, "c").await.unwrap_err().errno, Errno::ENOENT, "any name, from the listing");
    assert_eq!(reads(&admin).await, before, "listing and lookup answered locally");
    // The holder's own changes keep its listing exact (they revoke nothing of its own).
    holder.create_at(d, "c", 0o644, true, None).await.unwrap();
    holder.unlink_at(d, "a").await.unwrap();
    assert_eq!(names(holder.readdir_at(d).await.unwrap()), ["b", "c"]);
    assert_eq!(reads(&admin).await, before, "still answered locally");
    // Another client's unlink revokes it: the next listing is the server's.
    c.client().unlink_at(d, "b").await.unwrap();
    assert_eq!(names(holder.readdir_at(d).await.unwrap()), ["c"]);
    assert_eq!(holder.lookup(d, "b").await.unwrap_err().errno, Errno::ENOENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_lookups_of_a_missing_name_cost_about_one_request_per_client_per_lease_period() {
    const CLIENTS: usize = 4;
    let term = Duration::from_secs(1);
    let run = Duration::from_millis(2500);
    let c = Cluster::start(2);
    let admin = c.uncached_client();
    let d = admin.mkdir("/d", 0o755).await.unwrap().ino;
    let before = reads(&admin).await;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let fs = leased_client(&c, term);
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let mut n = 0u64;
            while t.elapsed() < run {
                assert_eq!(fs.lookup(d, "no-such-file").await.unwrap_err().errno, Errno::ENOENT);
                n += 1;
                if n.is_multiple_of(64) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            n
        }));
    }
    let mut lookups = 0;
    for t in tasks {
        lookups += t.await.unwrap();
    }
    let requests = reads(&admin).await - before;
    assert!(lookups >= 1000, "only {lookups} lookups were made");
    // A lease is taken once and renewed when a third of its term is left: about one and a
    // half requests per client per term, against one per lookup without leases.
    let periods = (run.as_secs_f64() / term.as_secs_f64()).ceil() as u64;
    let bound = CLIENTS as u64 * (2 * periods + 1);
    assert!(requests <= bound, "{lookups} lookups by {CLIENTS} clients cost {requests} requests (at most {bound})");
    assert!(requests >= CLIENTS as u64, "each client asked at least once: {requests}");
}

/// A client filling a directory (a lookup finding the name missing, then its create, as
/// `open(O_CREAT)` through the mount does) keeps its lease for as long as it goes on: the
/// renewals cross its own creates and still extend the lease, so the listing it holds stays
/// complete and lookups keep costing no request, also once the directory is too big to be
/// listed whole in one page (where a lapsed lease would cost a request per lookup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_filling_a_directory_keeps_its_lease_across_its_own_creates() {
    let term = Duration::from_secs(2);
    // One server: the directory never splits (a split hands out new leases).
    let c = Cluster::start(1);
    let admin = c.uncached_client();
    let d = admin.mkdir("/d", 0o755).await.unwrap().ino;
    let a = leased_client(&c, term);
    // A missing name, then another one: the (empty) listing, a lease that knows every name.
    for name in ["a", "b"] {
        assert_eq!(a.lookup(d, name).await.unwrap_err().errno, Errno::ENOENT);
    }
    let names: Vec<String> = (0..1100).map(|i| format!("pre{i}")).collect();
    for chunk in names.chunks(100) {
        a.create_many_at(d, chunk, 0o644, true).await.unwrap();
    }
    let before = reads(&admin).await;
    let t = Instant::now();
    let mut n = 0;
    while t.elapsed() < 3 * term {
        let name = format!("f{n}");
        assert_eq!(a.lookup(d, &name).await.unwrap_err().errno, Errno::ENOENT);
        a.create_at(d, &name, 0o644, true, None).await.unwrap();
        n += 1;
    }
    let requests = reads(&admin).await - before;
    assert!(n >= 100, "only {n} creates were made");
    // A renewal when a third of the term is left: one or two per term.
    assert!(requests <= 8, "{n} lookups and creates over 3 lease terms cost {requests} lookups and listings");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_stops_being_used() {
    let c = Cluster::start(2);
    let admin = c.uncached_client();
    let d = admin.mkdir("/d", 0o755).await.unwrap().ino;
    let a = leased_client(&c, Duration::from_millis(800));
    assert!(a.lookup(d, "gone").await.is_err());
    let before = reads(&admin).await;
    assert!(a.lookup(d, "gone").await.is_err());
    assert_eq!(reads(&admin).await, before, "within its term the lease answers");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(a.lookup(d, "gone").await.is_err());
    assert_eq!(reads(&admin).await, before + 1, "after its term the server is asked again");
}

/// Environment variable that turns the test below into the lease holder it stops.
const HOLDER: &str = "SHOAL_TEST_LEASE_HOLDER";

#[test]
fn a_lease_holder_process() {
    // Run only as the child of the test below: take a lease on "/d" (a lookup of a missing
    // name), say so, and wait to be stopped.
    let Ok(config) = std::env::var(HOLDER) else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let opts = ClientOptions { cache_ttl: Duration::ZERO, dir_lease: Duration::from_secs(2), ..Default::default() };
        let fs = Client::from_config(config.as_ref(), opts).unwrap();
        let d = fs.resolve("/d", true).await.unwrap().ino;
        // ENOENT, and nothing else, is the answer that comes with a lease on "/d".
        let e = fs.lookup(d, "later").await.unwrap_err();
        assert_eq!(e.errno, Errno::ENOENT, "{e}");
        println!("LEASED");
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_does_not_acknowledge_delays_a_change_at_most_its_lease_term() {
    use std::io::BufRead;
    let c = Cluster::start(2);
    let admin = c.uncached_client();
    let d = admin.mkdir("/d", 0o755).await.unwrap().ino;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        // Its full name in this binary (`leases::…`, the module this file is).
        .args(["--exact", "leases::a_lease_holder_process", "--nocapture", "--test-threads=1"])
        .env(HOLDER, &c.config)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !line.contains("LEASED") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the holder ended without a lease");
        assert!(Instant::now() < deadline);
    }
    let leased_at = Instant::now();
    // The holder can neither drop its lease nor acknowledge the revocation.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    let t = Instant::now();
    let made = c.client().create_at(d, "later", 0o644, true, None).await;
    let took = t.elapsed();
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    let _ = child.kill();
    let _ = child.wait();
    let made = made.expect("the change happens once the lease ran out");
    // It waited for the lease (2 s from before the grant, plus the server's margin) ...
    assert!(took >= Duration::from_millis(500), "the create did not wait for the silent holder: {took:?}");
    // ... and no longer.
    let bound = Duration::from_secs(2) + shoal_server::leases::MARGIN + Duration::from_secs(2);
    assert!(t.duration_since(leased_at) + took <= bound, "the change waited {took:?}");
    assert_eq!(admin.lookup(d, "later").await.unwrap().ino, made.ino);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_feature_gets_no_lease_and_works_as_before() {
    // Without authentication: the raw pool below proves no identity.
    let c = Cluster::start_with(2, |m| m.security.auth = shoal_placement::map::AuthMode::None);
    let admin = c.uncached_client();
    let d = admin.mkdir("/d", 0o755).await.unwrap().ino;
    // An older client: it does not offer FEATURE_LEASES (no notice sink), yet asks.
    let pool = shoal_rpc::Pool::new(c.map.clone(), shoal_rpc::PoolOptions::default());
    let home = c.map.home_of(d);
    let ask = Op::Lookup { dir: d, name: "n".into(), lease: Some(LeaseAsk { ms: 5000 }) };
    let r = pool.request(home, &Cred::root(), ask.clone(), bytes::Bytes::new()).await;
    assert_eq!(r.unwrap_err().errno(), Errno::ENOENT, "answered as without leases, not with a grant");
    // A change by another client sends it no notice (one would break its connection:
    // a notice it did not ask for is a protocol error to it) ...
    let other = c.client();
    other.create_at(d, "n", 0o644, true, None).await.unwrap();
    // ... and it sees the change at once.
    let (reply, _) = pool.request(home, &Cred::root(), ask, bytes::Bytes::new()).await.unwrap();
    assert!(matches!(reply, shoal_proto::msg::Reply::Entry(_)), "{reply:?}");
    // A client with leases turned off behaves as before leases: every lookup asks.
    let off = ClientOptions { cache_ttl: Duration::ZERO, dir_lease: Duration::ZERO, ..c.options() };
    let off = Client::from_config(&c.config, off).unwrap();
    let before = reads(&admin).await;
    for _ in 0..5 {
        assert!(off.lookup(d, "absent").await.is_err());
    }
    assert_eq!(reads(&admin).await - before, 5);
}
