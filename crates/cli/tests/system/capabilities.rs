//! Per-open capabilities on real servers: a data server serves or changes an object only
//! for a request carrying a capability its inode's home made (none, forged, expired, of
//! another inode, or read-only for a write: EACCES naming which, nothing served, nothing
//! changed); clients renew theirs transparently (a handle outlives many lifetimes); a key
//! rotation while a file is open causes no error, and a retirement refuses the old
//! capabilities while renewed ones work.

use bytes::Bytes;
use shoal_client::{Client, OpenFlags};
use shoal_placement::ClusterMap;
use shoal_proto::cap::{Capability, RIGHT_READ, RIGHT_WRITE};
use shoal_proto::msg::{Cred, Layout, LayoutSpec, Op, Reply};
use shoal_proto::{Errno, Ino, ServerId};
use shoal_rpc::{CallError, Pool, PoolOptions};
use shoal_testkit::Cluster;
use std::time::{Duration, Instant};

/// Requests sent by hand, as root, with whatever capability the test chooses.
struct Raw {
    pool: Pool,
}

impl Raw {
    fn new(c: &Cluster) -> Raw {
        let map = ClusterMap::load(&c.path().join("cluster.toml")).unwrap();
        let opts = PoolOptions { timeout: Duration::from_secs(20), ..PoolOptions::default() };
        Raw { pool: Pool::new(map, opts) }
    }

    async fn call(&self, server: ServerId, op: Op, data: Bytes) -> Result<(Reply, Bytes), CallError> {
        self.pool.request(server, &Cred::root(), op, data).await
    }

    /// A capability of `ino` with `rights`, from its home server (`Op::Open`).
    async fn open(&self, ino: Ino, rights: u8) -> Capability {
        let home = self.pool.map().home_of(ino);
        match self.call(home, Op::Open { ino, rights, renew: None }, Bytes::new()).await {
            Ok((Reply::Opened { cap: Some(cap), .. }, _)) => cap,
            other => panic!("open {ino}: {other:?}"),
        }
    }

    async fn read(&self, server: ServerId, ino: Ino, cap: Option<Capability>) -> Result<Bytes, CallError> {
        let op = Op::Read { ino, index: 0, offset: 0, len: 4096, cap };
        self.call(server, op, Bytes::new()).await.map(|(_, d)| d)
    }

    async fn write(
        &self,
        server: ServerId,
        ino: Ino,
        cap: Option<Capability>,
        data: &'static [u8],
    ) -> Result<(), CallError> {
        let op = Op::Write { ino, index: 0, offset: 0, file_end: data.len() as u64, inode_local: true, cap, copies: 1 };
        self.call(server, op, Bytes::from_static(data)).await.map(|_| ())
    }
}

/// The refusal's message, after checking it is EACCES.
fn refusal<T: std::fmt::Debug>(r: Result<T, CallError>) -> String {
    match r {
        Err(CallError::Server { errno, message }) if errno == Errno::EACCES => message,
        other => panic!("expected EACCES, got {other:?}"),
    }
}

/// A one-object file `name` holding `data`, made through the client; its inode and layout.
async fn file_with(client: &Client, name: &str, data: &[u8]) -> (Ino, Layout) {
    let spec = LayoutSpec { stripe_count: Some(1), ..Default::default() };
    let f = client.create(name, 0o644, Some(spec)).await.unwrap();
    write_all_at(&f, 0, data).await;
    let attr = f.attr();
    f.close().await.unwrap();
    (attr.ino, attr.layout.unwrap())
}

async fn write_all_at(f: &shoal_client::File, offset: u64, data: &[u8]) {
    assert_eq!(f.write_at(offset, data).await.unwrap(), data.len());
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn data_requests_without_a_genuine_capability_are_refused_with_eacces_and_change_nothing() {
    let c = Cluster::start(2);
    runtime().block_on(async {
        let client = c.client();
        let (ino, layout) = file_with(&client, "/secret", b"top secret").await;
        let (other, _) = file_with(&client, "/other", b"other").await;
        let server = layout.servers[0];
        let raw = Raw::new(&c);

        // None at all: refused, and no bytes come back.
        let m = refusal(raw.read(server, ino, None).await);
        assert!(m.contains("none given"), "{m}");
        let m = refusal(raw.write(server, ino, None, b"XXXXXXXXXX").await);
        assert!(m.contains("none given"), "{m}");
        let op = Op::Append { ino, cap: None };
        assert!(refusal(raw.call(client.home_of(ino), op, Bytes::from_static(b"more")).await).contains("none given"));
        let op = Op::Fsync { ino, data_only: true, cap: None, closing: false };
        assert!(refusal(raw.call(server, op, Bytes::new()).await).contains("none given"));

        // A genuine one reads.
        let good = raw.open(ino, RIGHT_READ).await;
        assert_eq!(&raw.read(server, ino, Some(good.clone())).await.unwrap()[..], b"top secret");

        // One flipped bit of the tag, or rights raised by hand: forged.
        let mut forged = good.clone();
        forged.tag[7] ^= 1;
        assert!(refusal(raw.read(server, ino, Some(forged)).await).contains("forged"));
        let mut raised = good.clone();
        raised.rights = RIGHT_READ | RIGHT_WRITE;
        assert!(refusal(raw.write(server, ino, Some(raised), b"XXXXXXXXXX").await).contains("forged"));
        let mut later = good.clone();
        later.expires += 3600;
        assert!(refusal(raw.read(server, ino, Some(later)).await).contains("forged"));

        // A genuine capability of another file does not open this one.
        let theirs = raw.open(other, RIGHT_READ | RIGHT_WRITE).await;
        let m = refusal(raw.read(server, ino, Some(theirs)).await);
        assert!(m.contains(&format!("of inode {other}, not of inode {ino}")), "{m}");

        // Read-only used to write: refused, the data stays.
        let m = refusal(raw.write(server, ino, Some(good.clone()), b"XXXXXXXXXX").await);
        assert!(m.contains("write access") && m.contains("read-only capability"), "{m}");
        assert_eq!(&raw.read(server, ino, Some(good)).await.unwrap()[..], b"top secret");
        let f = client.open("/secret", OpenFlags::read_only()).await.unwrap();
        assert_eq!(&f.read_at(0, 100).await.unwrap()[..], b"top secret");
        f.close().await.unwrap();
    });
}

#[test]
fn open_refuses_a_capability_the_permissions_do_not_allow() {
    let c = Cluster::start(1);
    runtime().block_on(async {
        let client = c.client();
        let (ino, _) = file_with(&client, "/mine", b"x").await;
        client.setattr(ino, shoal_proto::msg::SetAttrs { perm: Some(0o600), ..Default::default() }).await.unwrap();
        let stranger = Cred { uid: 4242, gid: 4242, groups: Vec::new() };
        let raw = Raw::new(&c);
        let op = Op::Open { ino, rights: RIGHT_READ, renew: None };
        let r = raw.pool.request(raw.pool.map().home_of(ino), &stranger, op, Bytes::new()).await;
        assert!(matches!(r, Err(CallError::Server { errno: Errno::EACCES, .. })), "{r:?}");
    });
}

#[test]
fn an_expired_capability_is_refused_as_expired() {
    let c = Cluster::start_with(1, |m| m.security.capability_lifetime_secs = 1);
    runtime().block_on(async {
        let client = c.client();
        let (ino, layout) = file_with(&client, "/f", b"data").await;
        let raw = Raw::new(&c);
        let cap = raw.open(ino, RIGHT_READ).await;
        assert_eq!(cap.lifetime_secs(), 1);
        assert_eq!(&raw.read(layout.servers[0], ino, Some(cap.clone())).await.unwrap()[..], b"data");
        // Past its last second (whole seconds: at most 2 s from now).
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let m = refusal(raw.read(layout.servers[0], ino, Some(cap)).await);
        assert!(m.contains("expired") && shoal_proto::cap::is_renewable(&m), "{m}");
    });
}

/// How many `Open` requests server `s` has served.
async fn opens(client: &Client, s: ServerId) -> u64 {
    let st = client.server_status(s).await.unwrap();
    st.counters.ops.iter().find(|(n, _)| n == "open").map_or(0, |(_, n)| *n)
}

#[test]
fn a_handle_kept_open_over_many_capability_lifetimes_keeps_working() {
    let c = Cluster::start_with(2, |m| m.security.capability_lifetime_secs = 1);
    runtime().block_on(async {
        let client = c.client();
        let spec = LayoutSpec { stripe_size: Some(4096), stripe_count: Some(2), ..Default::default() };
        let f = client.create("/long", 0o644, Some(spec)).await.unwrap();
        let home = client.home_of(f.ino());
        let before = opens(&client, home).await;
        let start = Instant::now();
        let mut round = 0u64;
        // About five lifetimes of writes, reads, appends and fsyncs through one handle.
        while start.elapsed() < Duration::from_secs(5) {
            let data = shoal_testkit::pattern(round, round * 8192, 8192);
            write_all_at(&f, round * 8192, &data).await;
            assert_eq!(f.read_at(round * 8192, 8192).await.unwrap(), data, "round {round}");
            f.fsync().await.unwrap();
            round += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        f.close().await.unwrap();
        let renewals = opens(&client, home).await - before;
        assert!(renewals >= 3, "{renewals} renewals in {round} rounds over 5 s of 1 s capabilities");
    });
}

#[test]
fn a_key_rotation_while_a_file_is_in_use_causes_no_error_and_a_retirement_refuses_old_capabilities() {
    let mut c = Cluster::start(2);
    runtime().block_on(async {
        let client = c.client();
        let spec = LayoutSpec { stripe_size: Some(4096), stripe_count: Some(2), ..Default::default() };
        let f = client.create("/busy", 0o644, Some(spec)).await.unwrap();
        let ino = f.ino();
        let use_it = |round: u64| {
            let f = f.clone();
            async move {
                let data = shoal_testkit::pattern(round, round * 8192, 8192);
                write_all_at(&f, round * 8192, &data).await;
                assert_eq!(f.read_at(round * 8192, 8192).await.unwrap(), data, "round {round}");
                f.append(b"tail").await.unwrap();
            }
        };
        use_it(0).await;
        let raw = Raw::new(&c);
        let old = raw.open(ino, RIGHT_READ).await;
        let holder = f.attr().layout.unwrap().servers[0];

        // Rotate: a new epoch signs, the old one still verifies.
        let (code, out, err) = c.shoal(&["keygen", "--rotate"]);
        assert_eq!(code, 0, "{out}{err}");
        for s in 0..2 {
            c.signal(s, libc::SIGHUP);
        }
        let new_epoch = old.epoch + 1;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if raw.open(ino, RIGHT_READ).await.epoch == new_epoch {
                break;
            }
            assert!(Instant::now() < deadline, "the home server never signed with epoch {new_epoch}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for round in 1..4 {
            use_it(round).await;
        }
        raw.read(holder, ino, Some(old.clone())).await.expect("the old epoch still verifies");

        // Retire the old epoch: what it made is refused (as renewable), the handle renews.
        let (code, out, err) = c.shoal(&["keygen", "--retire"]);
        assert_eq!(code, 0, "{out}{err}");
        for s in 0..2 {
            c.signal(s, libc::SIGHUP);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let m = loop {
            // Every server must have reloaded before the handle is used again.
            let refused =
                futures::future::join_all((0..2).map(|s| raw.read(ServerId(s), ino, Some(old.clone())))).await;
            if refused.iter().all(|r| r.is_err()) {
                break refusal(refused.into_iter().next().unwrap());
            }
            assert!(Instant::now() < deadline, "the servers never retired epoch {}", old.epoch);
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(m.contains(&format!("key epoch {}", old.epoch)) && shoal_proto::cap::is_renewable(&m), "{m}");
        for round in 4..8 {
            use_it(round).await;
        }
        let fresh = raw.open(ino, RIGHT_READ).await;
        assert_eq!(fresh.epoch, new_epoch);
        raw.read(holder, ino, Some(fresh)).await.expect("a capability of the current epoch reads");
        f.close().await.unwrap();
    });
    c.stop(0);
    c.stop(1);
}
