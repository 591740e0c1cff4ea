//! TLS on real servers (`[security] tls = true`): the workload runs over TLS (server to
//! server too), no plaintext crosses the socket, and a plain client of a TLS server, a TLS
//! client of a plain server and a client trusting the wrong CA each get one clear line.

use shoal_client::{Client, LayoutSpec, OpenFlags};
use shoal_placement::ClusterMap;
use shoal_testkit::{pattern, shoal_cmd, Cluster};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn tls_cluster(n: u32) -> Cluster {
    Cluster::start_with(n, |m| m.security.tls = true)
}

/// A copy of the cluster's map, changed by `tweak`, written next to it; its path.
fn map_copy(c: &Cluster, name: &str, tweak: impl FnOnce(&mut ClusterMap)) -> PathBuf {
    let mut map = ClusterMap::load(&c.config).unwrap();
    tweak(&mut map);
    let path = c.path().join(name);
    std::fs::write(&path, map.to_toml()).unwrap();
    path
}

/// Run `shoal` with `config`, which must fail within `limit` (no hang): its stderr.
fn fails_quickly(config: &Path, args: &[&str], limit: Duration) -> String {
    let t = Instant::now();
    let (code, _, err) = shoal_cmd(Some(config), args);
    assert!(t.elapsed() < limit, "shoal {args:?} took {:?}: {err}", t.elapsed());
    assert_ne!(code, 0, "shoal {args:?} should fail");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_runs_the_basic_workload_with_a_file_striped_across_servers() {
    let cluster = tls_cluster(3);
    let fs = cluster.client();
    fs.mkdir("/d", 0o755).await.unwrap();
    // Striped over the three servers: its objects' servers are reached by the client, and
    // deleting it makes its home send PeerDeleteObjects to the other two (server to server).
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(3), ..Default::default() };
    let f = fs.create("/d/striped", 0o644, Some(spec)).await.unwrap();
    let mut servers = f.layout().servers.clone();
    servers.sort();
    servers.dedup();
    assert_eq!(servers.len(), 3);
    let len = 3 << 20;
    f.write_at(0, &pattern(7, 0, len)).await.unwrap();
    let ino = f.ino();
    f.close().await.unwrap();

    let reader = cluster.uncached_client();
    assert_eq!(reader.stat("/d/striped").await.unwrap().size, len as u64);
    let f = reader.open("/d/striped", OpenFlags::read_only()).await.unwrap();
    let got = f.read_at(0, len).await.unwrap();
    assert!(got[..] == pattern(7, 0, len)[..], "the striped file reads back as written");

    // Directories on other servers (mkdir's directory object is a peer request).
    for i in 0..6 {
        fs.mkdir(&format!("/d/sub{i}"), 0o755).await.unwrap();
    }
    fs.rename("/d/striped", "/d/sub3/moved").await.unwrap();
    assert!(reader.stat("/d/striped").await.is_err());
    assert_eq!(reader.stat("/d/sub3/moved").await.unwrap().size, len as u64);
    let names: Vec<String> = reader.readdir("/d").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names.len(), 6, "{names:?}");

    fs.unlink("/d/sub3/moved").await.unwrap();
    // Every object file goes, on every server: the home's PeerDeleteObjects reached its peers.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<u32> = (0..3u32)
            .filter(|id| {
                let dir = cluster.path().join(format!("s{id}/objects"));
                walk(&dir)
                    .iter()
                    .any(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("{:016x}.", ino.0)))
            })
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "objects of {ino} still on servers {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The CLI speaks TLS too.
    let (code, out, err) = cluster.shoal(&["ls", "/d"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("sub5"), "{out}");
    for id in 0..3 {
        let log = cluster.log(id);
        assert!(log.contains("every connection is TLS 1.3"), "server {id}:\n{log}");
        assert!(!log.contains("without TLS refused") && !log.contains("TLS handshake failed"), "server {id}:\n{log}");
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A TCP relay on 127.0.0.1 that keeps every byte it passes, per direction.
struct Tap {
    addr: String,
    to_server: Arc<Mutex<Vec<u8>>>,
    to_client: Arc<Mutex<Vec<u8>>>,
}

fn tap(server: String) -> Tap {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (to_server, to_client) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let (ts, tc) = (to_server.clone(), to_client.clone());
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let s = TcpStream::connect(&server).unwrap();
            relay(c.try_clone().unwrap(), s.try_clone().unwrap(), ts.clone());
            relay(s, c, tc.clone());
        }
    });
    Tap { addr, to_server, to_client }
}

fn relay(mut from: TcpStream, mut to: TcpStream, seen: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    seen.lock().unwrap().extend_from_slice(&buf[..n]);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Through a relay: write a file with a recognisable name and content and read it back;
/// the bytes the relay saw in each direction.
async fn tapped_round_trip(cluster: &Cluster, secret: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let t = tap(cluster.addr(0));
    let config = map_copy(cluster, "tapped.toml", |m| m.servers[0].addr = t.addr.clone());
    let fs = Client::from_config(&config, cluster.options()).unwrap();
    let f = fs.create("/file-named-plainly", 0o644, None).await.unwrap();
    f.write_at(0, &secret.repeat(1000)).await.unwrap();
    f.close().await.unwrap();
    let f = fs.open("/file-named-plainly", OpenFlags::read_only()).await.unwrap();
    assert!(f.read_at(0, secret.len() * 1000).await.unwrap()[..] == secret.repeat(1000)[..]);
    drop(f);
    drop(fs);
    let to_server = t.to_server.lock().unwrap().clone();
    let to_client = t.to_client.lock().unwrap().clone();
    (to_server, to_client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_plaintext_crosses_the_socket_of_a_tls_cluster() {
    let secret = b"SHOAL-PLAINTEXT-MARKER-0123456789";
    // The same relay on a plain cluster sees names and data: the check can fail.
    let plain = Cluster::start(1);
    let (up, down) = tapped_round_trip(&plain, secret).await;
    assert!(contains(&up, secret) && contains(&down, secret) && contains(&up, b"file-named-plainly"));

    let cluster = tls_cluster(1);
    let (up, down) = tapped_round_trip(&cluster, secret).await;
    assert!(up.len() > 33_000 && down.len() > 33_000, "the data went through the relay");
    // TLS records both ways: a handshake record first, then application data (type 23).
    assert_eq!(up[0], 0x16, "the client starts with a TLS handshake record");
    assert_eq!(down[0], 0x16, "the server answers with a TLS handshake record");
    for (dir, bytes) in [("to the server", &up), ("to the client", &down)] {
        assert!(!contains(bytes, secret), "file data in the clear {dir}");
        assert!(!contains(bytes, b"file-named-plainly"), "a file name in the clear {dir}");
        assert!(!contains(bytes, b"shoal-client"), "the Hello in the clear {dir}");
    }
}

#[test]
fn a_plain_client_of_a_tls_server_is_told_the_server_requires_tls() {
    let cluster = tls_cluster(1);
    let plain = map_copy(&cluster, "plain.toml", |m| m.security.tls = false);
    let err = fails_quickly(&plain, &["ls", "/"], Duration::from_secs(15));
    assert!(err.contains("requires TLS"), "{err}");
    assert!(err.contains("tls = true under [security]"), "{err}");

    // A raw connection that sends a plain frame's first bytes and nothing more is closed
    // within the handshake timeout, and what the server sends (if anything) is no TLS.
    let mut s = TcpStream::connect(cluster.addr(0)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&shoal_proto::frame::MAGIC.to_le_bytes()).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(got.is_empty(), "nothing for half a frame: {got:?}");
}

#[test]
fn a_tls_client_of_a_plain_server_is_told_the_server_closed_the_handshake() {
    let cluster = Cluster::start(1);
    let tls_dir = cluster.path().join("tls");
    std::fs::create_dir(&tls_dir).unwrap();
    let config = map_copy(&cluster, "tls.toml", |m| {
        m.security.tls = true;
        m.security.tls_ca = tls_dir.join("ca.pem");
        m.security.tls_ca_key = tls_dir.join("ca.key");
        m.security.tls_cert = tls_dir.join("cert.pem");
        m.security.tls_key = tls_dir.join("key.pem");
    });
    shoal_rpc::tls_certs::make_certs(&ClusterMap::load(&config).unwrap(), true).unwrap();
    let err = fails_quickly(&config, &["ls", "/"], Duration::from_secs(15));
    assert!(err.contains("closed the connection during the TLS handshake"), "{err}");
    assert!(err.contains("does it run without TLS?"), "{err}");
    assert!(cluster.log(0).contains("starts a TLS handshake, but this server runs without TLS"), "{}", cluster.log(0));
}

#[test]
fn a_client_trusting_another_ca_gets_a_certificate_error() {
    let cluster = tls_cluster(1);
    let other = cluster.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let config = map_copy(&cluster, "other-ca.toml", |m| {
        m.security.tls_ca = other.join("ca.pem");
        m.security.tls_ca_key = other.join("ca.key");
        m.security.tls_cert = other.join("cert.pem");
        m.security.tls_key = other.join("key.pem");
    });
    shoal_rpc::tls_certs::make_certs(&ClusterMap::load(&config).unwrap(), true).unwrap();
    let err = fails_quickly(&config, &["ls", "/"], Duration::from_secs(15));
    assert!(err.contains("the server's certificate is not accepted"), "{err}");
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert!(err.contains(&other.join("ca.pem").display().to_string()), "names the CA file: {err}");
}

#[test]
fn a_tls_server_without_its_certificate_refuses_to_start_in_one_line() {
    let cluster = tls_cluster(1);
    let config = map_copy(&cluster, "nocert.toml", |m| {
        m.security.tls_cert = PathBuf::from("/nonexistent/cert.pem");
        m.servers[0].addr = "127.0.0.1:1".into();
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shoald"))
        .arg("--config")
        .arg(&config)
        .arg("--id")
        .arg("0")
        .arg("--data-dir")
        .arg(cluster.path().join("nocert-data"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read the TLS server certificate (tls_cert) /nonexistent/cert.pem"), "{err}");
    assert!(err.contains("shoal keygen"), "{err}");
}

#[test]
fn keygen_makes_the_tls_files_with_private_keys_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mut map = ClusterMap::local(2, 7400, dir.path());
    map.servers[1].addr = "node1.example:7401".into();
    map.security.tls = true;
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, map.to_toml()).unwrap();
    let (code, out, err) = shoal_cmd(Some(&config), &["keygen", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["tls"]["new_ca"], true);
    assert_eq!(v["tls"]["names"], serde_json::json!(["127.0.0.1", "node1.example"]));
    let mode = |f: &str| std::fs::metadata(dir.path().join(f)).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode("tls-ca.key"), mode("tls-key.pem")), (0o600, 0o600));
    assert_eq!((mode("tls-ca.pem"), mode("tls-cert.pem")), (0o644, 0o644));
    // Again: the CA stays (hosts keep trusting the servers), the server certificate is new.
    let ca = std::fs::read(dir.path().join("tls-ca.pem")).unwrap();
    let cert = std::fs::read(dir.path().join("tls-cert.pem")).unwrap();
    let (code, out, err) = shoal_cmd(Some(&config), &["keygen", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"new_ca\":false"), "{out}");
    assert_eq!(std::fs::read(dir.path().join("tls-ca.pem")).unwrap(), ca);
    assert_ne!(std::fs::read(dir.path().join("tls-cert.pem")).unwrap(), cert);
}
