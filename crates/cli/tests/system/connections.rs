//! A server under a flood of connections: silent ones are closed after the handshake
//! timeout, connections beyond the limit get a clear refusal, idle connections cost a few
//! KiB, a frame announcing a large body reserves memory only as its bytes arrive, and a
//! real client keeps working throughout. One real `shoald` per test, started with a small
//! limit and a short handshake timeout (through the environment, which a `shoald` without
//! these options ignores: the tests then fail on their assertions, not on the command line).

use shoal_client::{Client, ClientOptions, OpenFlags};
use shoal_placement::ClusterMap;
use shoal_proto::frame::{Frame, FrameKind, HEADER_LEN, MAGIC};
use shoal_proto::msg::{Cred, Op, Reply, Request};
use shoal_proto::Errno;
use shoal_testkit::{closed_by_peer, pattern, wait_closed_by_peer, RawHost};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `shoald` on 127.0.0.1, killed when dropped.
struct Server {
    dir: tempfile::TempDir,
    config: PathBuf,
    addr: SocketAddr,
    child: Child,
}

impl Server {
    fn start(max_connections: usize, handshake_timeout_secs: u64) -> Server {
        let dir = tempfile::Builder::new().prefix("shoal-conn-").tempdir().unwrap();
        let mut map = ClusterMap::local(1, 0, dir.path());
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        map.servers[0].addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("cluster.toml");
        std::fs::write(&config, map.to_toml()).unwrap();
        let loaded = ClusterMap::load(&config).unwrap();
        shoal_auth::make_keys(&loaded.security.cluster_key, &loaded.security.host_key).unwrap();
        let log = std::fs::File::create(dir.path().join("s0.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_shoald"))
            .arg("--config")
            .arg(&config)
            .arg("--id")
            .arg("0")
            .env("SHOALD_MAX_CONNECTIONS", max_connections.to_string())
            .env("SHOALD_HANDSHAKE_TIMEOUT", handshake_timeout_secs.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start shoald");
        let addr: SocketAddr = map.servers[0].addr.parse().unwrap();
        let mut s = Server { dir, config, addr, child };
        let start = Instant::now();
        // Ready when it answers a Hello (a bare connect would only show the port is bound).
        loop {
            if let Ok(mut c) = TcpStream::connect_timeout(&s.addr, Duration::from_secs(1)) {
                if let Ok(Reply::Hello { .. }) = hello_reply(&mut c) {
                    break;
                }
            }
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("shoald exited ({status}) during start-up:\n{}", s.log());
            }
            assert!(start.elapsed() < Duration::from_secs(30), "shoald not ready:\n{}", s.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("s0.log")).unwrap_or_default()
    }

    fn client(&self) -> Client {
        Client::from_config(&self.config, ClientOptions { timeout: Duration::from_secs(20), ..Default::default() })
            .unwrap()
    }

    /// A field of /proc/PID/status, in KiB (VmRSS, VmData).
    fn vm_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Open a connection without saying anything.
    fn silent(&self) -> TcpStream {
        TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)).expect("connect")
    }

    /// Open a connection and complete the handshake as root's tools do (Hello, then
    /// Authenticate with the host key); panics unless the server accepts it.
    fn established(&self) -> TcpStream {
        let host = RawHost::new(&self.config);
        let mut c = self.silent();
        let reply = match hello_reply_with(&mut c, Some(host.hello())) {
            Ok(r @ Reply::Hello { .. }) => r,
            other => panic!("handshake: {other:?}"),
        };
        let req = Request { cred: Cred::root(), map_version: 0, op: host.authenticate(&reply) };
        let mut v = Vec::new();
        Frame::request(1, &req, bytes::Bytes::new()).unwrap().encode_into(&mut v);
        c.write_all(&v).unwrap();
        match read_reply(&mut c) {
            Ok(Reply::Ok) => c,
            other => panic!("authenticate: {other:?}"),
        }
    }

    /// Open a connection that says `Hello` (claiming the host role when `claim`, so that an
    /// `Authenticate` is due) and then nothing.
    fn hello_only(&self, claim: bool) -> TcpStream {
        let mut c = self.silent();
        let auth = claim.then(|| RawHost::new(&self.config).hello());
        match hello_reply_with(&mut c, auth) {
            Ok(_) => c,
            Err(e) => panic!("hello: {e}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hello_frame(auth: Option<shoal_proto::auth::HelloAuth>) -> Vec<u8> {
    let mut op = shoal_proto::hello::hello_op("connections test", 0);
    if let Op::Hello { auth: a, .. } = &mut op {
        *a = auth;
    }
    let req = Request { cred: Cred::root(), map_version: 0, op };
    let mut v = Vec::new();
    Frame::request(0, &req, bytes::Bytes::new()).unwrap().encode_into(&mut v);
    v
}

/// Send Hello (claiming no role) and read the one reply frame (bounded by a read timeout).
fn hello_reply(c: &mut TcpStream) -> Result<Reply, String> {
    hello_reply_with(c, None)
}

/// Send Hello with `auth` and read the one reply frame.
fn hello_reply_with(c: &mut TcpStream, auth: Option<shoal_proto::auth::HelloAuth>) -> Result<Reply, String> {
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&hello_frame(auth)).map_err(|e| format!("send Hello: {e}"))?;
    read_reply(c)
}

/// Read one reply frame.
fn read_reply(c: &mut TcpStream) -> Result<Reply, String> {
    let mut h = [0u8; HEADER_LEN];
    c.read_exact(&mut h).map_err(|e| format!("read reply header: {e}"))?;
    let body_len = u32::from_le_bytes(h[16..20].try_into().unwrap()) as usize;
    let data_len = u32::from_le_bytes(h[20..24].try_into().unwrap()) as usize;
    let mut rest = vec![0u8; body_len + data_len];
    c.read_exact(&mut rest).map_err(|e| format!("read reply body: {e}"))?;
    let mut wire = h.to_vec();
    wire.extend_from_slice(&rest);
    let (f, _) = Frame::decode(&wire).map_err(|e| e.to_string())?.ok_or("short frame")?;
    assert_eq!(f.kind, FrameKind::Reply);
    f.reply_body().map_err(|e| e.to_string())
}

/// Create, write and read back a file through the native client: the server still works.
async fn client_round_trip(server: &Server, name: &str) {
    let fs = server.client();
    let data = pattern(7, 0, 3 << 20);
    let f = fs.create(name, 0o644, None).await.unwrap_or_else(|e| panic!("create {name}: {e}"));
    f.write_at(0, &data).await.unwrap();
    f.close().await.unwrap();
    let f = fs.open(name, OpenFlags::read_only()).await.unwrap();
    assert!(f.read_at(0, data.len()).await.unwrap()[..] == data[..], "{name} reads back what was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_after_the_handshake_timeout_and_never_lock_clients_out() {
    let server = Server::start(200, 2);
    let flood_start = Instant::now();
    let mut silent = Vec::new();
    // A few thousand silent connections, ten times the limit, in waves; a real client works
    // between waves (the oldest silent connections make room for it).
    for wave in 0..4 {
        for _ in 0..500 {
            match TcpStream::connect_timeout(&server.addr, Duration::from_secs(2)) {
                Ok(c) => silent.push(c),
                Err(e) => panic!("connect during the flood: {e}"),
            }
        }
        client_round_trip(&server, &format!("/during-{wave}")).await;
    }
    assert_eq!(silent.len(), 2000);

    // All of them closed by the server within the timeout (2 s) and a generous margin.
    let open = wait_closed_by_peer(silent, Duration::from_secs(30));
    assert!(
        open.is_empty(),
        "{} of 2000 silent connections still open {:?} after the flood began (handshake timeout 2 s)",
        open.len(),
        flood_start.elapsed()
    );
    client_round_trip(&server, "/after").await;
}

/// Issue 51: connections that said `Hello` and never authenticated counted as established:
/// never evicted, kept until the client left, so 9,138 of them gave new clients EAGAIN. Now
/// they are evictable like silent ones and closed at the handshake timeout: ten times the
/// limit of them (half claiming a role and never proving it, half claiming none) leave a
/// real client working throughout, and are all closed soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_say_hello_and_never_authenticate_are_evicted_and_closed() {
    let server = Server::start(100, 3);
    let flood_start = Instant::now();
    let mut idle = Vec::new();
    for wave in 0..4 {
        for i in 0..250 {
            idle.push(server.hello_only(i % 2 == 0));
        }
        let t = Instant::now();
        client_round_trip(&server, &format!("/during-{wave}")).await;
        assert!(t.elapsed() < Duration::from_secs(10), "a client waited {:?} behind the flood", t.elapsed());
    }
    let open = wait_closed_by_peer(idle, Duration::from_secs(30));
    assert!(
        open.is_empty(),
        "{} of 1000 unauthenticated connections still open {:?} after the flood began (handshake timeout 3 s)",
        open.len(),
        flood_start.elapsed()
    );
    client_round_trip(&server, "/after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_get_a_clear_refusal_and_are_closed() {
    let limit = 50;
    let server = Server::start(limit, 10);
    std::thread::sleep(Duration::from_millis(300)); // the start-up probe's connection is gone
    let held: Vec<TcpStream> = (0..limit).map(|_| server.established()).collect();

    // The next one is refused at Hello, with the reason, and closed.
    let mut extra = server.silent();
    match hello_reply(&mut extra) {
        Ok(Reply::Error { errno, message }) => {
            assert_eq!(errno, Errno::EAGAIN, "{message}");
            assert!(message.contains("connection limit 50 reached"), "message: {message}");
        }
        other => panic!("connection {} of a server limited to {limit}: {other:?}", limit + 1),
    }
    let start = Instant::now();
    while !closed_by_peer(&mut extra) {
        assert!(start.elapsed() < Duration::from_secs(10), "the refused connection stays open");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A native client hears the same errno.
    let err = server.client().stat("/").await.unwrap_err();
    assert_eq!(err.errno, Errno::EAGAIN, "{err}");
    assert!(server.log().contains("connection limit 50 reached"), "the refusal is logged:\n{}", server.log());

    // Room again once some close.
    drop(held);
    let start = Instant::now();
    loop {
        match server.client().stat("/").await {
            Ok(_) => break,
            Err(e) => assert!(start.elapsed() < Duration::from_secs(10), "still refused after closing: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client_round_trip(&server, "/after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_cost_a_few_kilobytes_each_and_memory_returns_when_they_close() {
    let n = 500u64;
    let server = Server::start(1000, 60);
    client_round_trip(&server, "/warm").await; // let the server reach its working size first
    let before = server.vm_kib("VmRSS:");
    // Two waves: the second reuses the memory the first freed (which the allocator keeps,
    // already touched), so whatever a connection allocates shows in the RSS.
    let mut conns = Vec::new();
    for wave in 0..2 {
        drop(std::mem::take(&mut conns));
        std::thread::sleep(Duration::from_millis(if wave == 0 { 0 } else { 500 }));
        conns.extend((0..n / 2).map(|_| server.established()));
        conns.extend((0..n / 2).map(|_| server.silent()));
        std::thread::sleep(Duration::from_millis(500));
    }
    // Both kinds are really held by the server (not refused, not closed).
    let held = conns.iter_mut().map(closed_by_peer).filter(|closed| !closed).count();
    assert_eq!(held as u64, n);
    let during = server.vm_kib("VmRSS:");
    let per_conn = during.saturating_sub(before) / n;
    assert!(per_conn < 64, "{per_conn} KiB resident per idle connection (RSS {before} -> {during} KiB)");

    drop(conns);
    // The server lets go of what the connections held as it sees them close.
    shoal_testkit::wait_until(
        Duration::from_secs(10),
        "the server's RSS to come back after the connections closed",
        || server.vm_kib("VmRSS:") < before + n * 64,
    );
    client_round_trip(&server, "/after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_announcing_a_large_body_reserves_memory_only_as_its_bytes_arrive() {
    let conns = 32u64;
    let server = Server::start(200, 60);
    client_round_trip(&server, "/warm").await;
    let (rss0, data0) = (server.vm_kib("VmRSS:"), server.vm_kib("VmData:"));
    // After Hello, a request header announcing a 100-byte body and 64 MiB of data, then a
    // few bytes, then nothing.
    let mut head = [0u8; HEADER_LEN];
    head[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    head[6..8].copy_from_slice(
        &Op::Write {
            ino: shoal_proto::ROOT_INO,
            index: 0,
            offset: 0,
            file_end: 0,
            inode_local: false,
            cap: None,
            copies: 1,
        }
        .code()
        .to_le_bytes(),
    );
    head[8..16].copy_from_slice(&1u64.to_le_bytes());
    head[16..20].copy_from_slice(&100u32.to_le_bytes());
    head[20..24].copy_from_slice(&(64u32 << 20).to_le_bytes());
    let mut held = Vec::new();
    for _ in 0..conns {
        let mut c = server.established();
        c.write_all(&head).unwrap();
        c.write_all(&[0u8; 1000]).unwrap();
        held.push(c);
    }
    std::thread::sleep(Duration::from_millis(500));
    let (rss1, data1) = (server.vm_kib("VmRSS:"), server.vm_kib("VmData:"));
    let bound = conns * 4096; // 4 MiB per connection, a sixteenth of what they announced
    assert!(rss1 < rss0 + bound, "RSS {rss0} -> {rss1} KiB with {conns} frames of 64 MiB announced");
    assert!(data1 < data0 + bound, "VmData {data0} -> {data1} KiB with {conns} frames of 64 MiB announced");
    // The server still serves, and the stalled frames are not taken for complete ones.
    client_round_trip(&server, "/during").await;
    for c in held.iter_mut() {
        assert!(!closed_by_peer(c), "a slow sender is not cut off");
    }
}
