//! Who the servers trust, on real servers (docs/security.md): a connection that proved no
//! key can do nothing, peer-only requests are refused on every connection but a server's, a
//! server with the wrong cluster key is refused by its peers (and refuses them), and an
//! unprivileged client is bound to its own uid whatever credentials it states; root with
//! the host key still acts for any user, and `auth = "none"` still trusts everyone.

use bytes::Bytes;
use shoal_client::{Client, ClientOptions};
use shoal_proto::frame::{Frame, HEADER_LEN};
use shoal_proto::msg::{Cred, Op, Reply, Request};
use shoal_proto::{Errno, ServerId};
use shoal_testkit::{pattern, Cluster, RawHost};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

async fn write_file(client: &Client, path: &str, data: &[u8]) -> shoal_client::Result<()> {
    let f = client.create(path, 0o644, None).await?;
    f.write_at(0, data).await?;
    f.close().await
}

async fn read_file(client: &Client, path: &str) -> shoal_client::Result<Vec<u8>> {
    let f = client.open(path, shoal_client::OpenFlags { read: true, ..Default::default() }).await?;
    let b = f.read_at(0, 1 << 20).await?;
    f.close().await?;
    Ok(b.to_vec())
}

/// Send `op` as request `id` on a raw connection and read its reply.
fn call(s: &mut TcpStream, id: u64, op: Op) -> Reply {
    let mut v = Vec::new();
    Frame::request(id, &Request { cred: Cred::root(), map_version: 0, op }, Bytes::new()).unwrap().encode_into(&mut v);
    s.write_all(&v).unwrap();
    let mut wire = vec![0u8; HEADER_LEN];
    s.read_exact(&mut wire).unwrap();
    let body = u32::from_le_bytes(wire[16..20].try_into().unwrap()) as usize;
    let data = u32::from_le_bytes(wire[20..24].try_into().unwrap()) as usize;
    wire.resize(HEADER_LEN + body + data, 0);
    s.read_exact(&mut wire[HEADER_LEN..]).unwrap();
    Frame::decode(&wire).unwrap().unwrap().0.reply_body().unwrap()
}

fn raw(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn hello(auth: Option<shoal_proto::auth::HelloAuth>) -> Op {
    let Op::Hello { client, session, min_version, max_version, features, .. } =
        shoal_proto::hello::hello_op("trust test", 0)
    else {
        unreachable!()
    };
    Op::Hello { client, session, min_version, max_version, features, auth }
}

fn expect_error(r: Reply, errno: Errno) -> String {
    match r {
        Reply::Error { errno: e, message } if e == errno => message,
        other => panic!("expected {errno}, got {other:?}"),
    }
}

#[test]
fn peer_only_requests_from_anyone_but_a_server_are_refused_and_change_nothing() {
    let c = Cluster::start(1);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = c.client();
    let data = pattern(7, 0, 100_000);
    let ino = rt.block_on(async {
        write_file(&client, "/kept", &data).await.unwrap();
        client.stat("/kept").await.unwrap().ino
    });
    let delete = || Op::PeerDeleteObjects { objects: vec![(ino, 0)] };

    // No credentials at all: Hello is answered, nothing else is done.
    let mut s = raw(&c.addr(0));
    assert!(matches!(call(&mut s, 1, hello(None)), Reply::Hello { .. }));
    let m = expect_error(call(&mut s, 2, delete()), Errno::EACCES);
    assert!(m.contains("did not authenticate"), "{m}");

    // Root with the host key: a client host, not a server.
    let host = RawHost::new(&c.config);
    let mut s = raw(&c.addr(0));
    let reply = call(&mut s, 1, hello(Some(host.hello())));
    assert_eq!(call(&mut s, 2, host.authenticate(&reply)), Reply::Ok);
    let m = expect_error(call(&mut s, 3, delete()), Errno::EPERM);
    assert!(m.contains("only servers may send it"), "{m}");
    // The same connection still serves what a client host may do.
    assert!(matches!(call(&mut s, 4, Op::GetAttr { ino }), Reply::Attr(_)));

    let back = rt.block_on(read_file(&client, "/kept")).unwrap();
    assert!(back == data, "the object survived");
    let log = c.log(0);
    assert!(log.contains("peer_delete_objects refused") && log.contains("127.0.0.1"), "logged with the address: {log}");
}

#[test]
fn a_server_with_the_wrong_cluster_key_is_refused_by_its_peers() {
    let mut c = Cluster::start(2);
    // Server 1 comes back with a key of its own: a config naming another key file.
    c.stop(1);
    let mut map = shoal_placement::ClusterMap::load(&c.config).unwrap();
    let wrong = c.path().join("wrong.key");
    shoal_auth::make_keys(&wrong, &c.path().join("wrong-host.key")).unwrap();
    map.security.cluster_key = wrong;
    let config1 = c.path().join("cluster-s1.toml");
    std::fs::write(&config1, map.to_toml()).unwrap();
    let log1 = std::fs::File::create(c.path().join("s1-wrong.log")).unwrap();
    let mut s1 = Command::new(env!("CARGO_BIN_EXE_shoald"))
        .args(["--config", config1.to_str().unwrap(), "--id", "1"])
        .stdin(Stdio::null())
        .stdout(log1.try_clone().unwrap())
        .stderr(log1)
        .spawn()
        .unwrap();
    let up = std::time::Instant::now();
    while TcpStream::connect(c.addr(1)).is_err() {
        assert!(up.elapsed() < Duration::from_secs(30), "server 1 did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    // New directories go to every server in turn: those homed on server 1 need a peer step
    // from server 0 (PeerMkdirObject), which fails.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = c.client();
    let errors: Vec<_> = rt.block_on(async {
        let mut errors = Vec::new();
        for i in 0..6 {
            if let Err(e) = client.mkdir(&format!("/d{i}"), 0o755).await {
                errors.push(e);
            }
        }
        errors
    });
    let log1_text = std::fs::read_to_string(c.path().join("s1-wrong.log")).unwrap();
    let _ = s1.kill();
    let _ = s1.wait();
    assert!(!errors.is_empty(), "some mkdir needed server 1");
    for e in &errors {
        let line = e.to_string();
        assert!(line.contains("server s1") && line.contains("Permission denied"), "the error names the peer: {line}");
        assert!(!line.contains('\n'), "{line}");
    }
    let log0 = c.log(0);
    assert!(log0.contains("failed to prove the cluster key"), "server 0 says why: {log0}");
    assert!(
        log1_text.contains("claiming to be a peer") && log1_text.contains("failed to prove the cluster key"),
        "server 1 says why: {log1_text}"
    );
}

/// Run `shoal ARGS` against the cluster as uid/gid 5000 (no host key readable), with the
/// client stating credentials of its own choosing through `SHOAL_TEST_CRED` if set.
fn shoal_as_user(c: &Cluster, args: &[&str]) -> (bool, String) {
    let shoal = c.path().join("shoal");
    if !shoal.exists() {
        std::fs::copy(env!("CARGO_BIN_EXE_shoal"), &shoal).unwrap();
        std::fs::set_permissions(&shoal, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cmd = Command::new(&shoal);
    cmd.env_remove("SHOAL_CONFIG").stdin(Stdio::null()).arg("--config").arg(&c.config).args(args);
    cmd.uid(5000).gid(5000);
    let out = cmd.output().expect("run shoal as uid 5000");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).trim().to_string())
}

/// A cluster an unprivileged user can reach: config and folder readable by all.
fn open_cluster() -> Cluster {
    let c = Cluster::start(1);
    std::fs::set_permissions(c.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&c.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    c
}

#[test]
fn a_user_who_claims_uid_0_is_treated_as_itself() {
    let c = open_cluster();
    let _helper = c.start_identityd();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let root = c.client();
    rt.block_on(async {
        root.mkdir("/rootonly", 0o755).await.unwrap();
        root.mkdir("/open", 0o777).await.unwrap();
        root.chmod("/open", 0o777).await.unwrap();
    });
    // The test program itself, re-run as uid 5000: a native client stating uid 0.
    let exe = std::env::current_exe().unwrap();
    let copy = c.path().join("trust-test");
    std::fs::copy(&exe, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&copy)
        // Its full name in this binary (the module this file is, then the test).
        .args(["--exact", "trust::claiming_root_as_a_user", "--nocapture", "--ignored"])
        .env("SHOAL_TRUST_CONFIG", &c.config)
        .uid(5000)
        .gid(5000)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 passed"), "the user side ran: {stdout}");
    let a = rt.block_on(root.stat("/open/mine")).unwrap();
    assert_eq!((a.uid, a.gid), (5000, 5000), "created as its real uid");
    assert!(rt.block_on(root.stat("/rootonly/x")).is_err(), "nothing was created in the root-only directory");
}

/// The user side of the test above: run only as uid 5000, by it.
#[test]
#[ignore]
fn claiming_root_as_a_user() {
    let Ok(config) = std::env::var("SHOAL_TRUST_CONFIG") else { return };
    // SAFETY: getuid has no preconditions.
    assert_eq!(unsafe { libc::getuid() }, 5000);
    let opts = ClientOptions { cred: Cred::root(), timeout: Duration::from_secs(20), ..ClientOptions::default() };
    let client = Client::from_config(config.as_ref(), opts).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let e = write_file(&client, "/rootonly/x", b"no").await.unwrap_err();
        assert_eq!(e.errno, Errno::EACCES, "{e}");
        write_file(&client, "/open/mine", b"yes").await.unwrap();
    });
}

#[test]
fn a_user_without_a_running_identity_helper_cannot_connect_and_is_told_why_in_one_line() {
    let c = open_cluster();
    let (ok, err) = shoal_as_user(&c, &["ls", "/"]);
    assert!(!ok);
    assert!(err.contains("cannot prove who you are"), "{err}");
    assert!(err.contains("host.key") && err.contains("identity.sock"), "names both: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // With the helper, the same user gets in.
    let _helper = c.start_identityd();
    let (ok, err) = shoal_as_user(&c, &["ls", "/"]);
    assert!(ok, "{err}");
}

#[test]
fn root_with_the_host_key_still_acts_as_any_user() {
    let c = Cluster::start(1);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let root = c.client();
    rt.block_on(root.mkdir("/u", 0o777)).unwrap();
    rt.block_on(root.chmod("/u", 0o777)).unwrap();
    let opts = ClientOptions { cred: Cred { uid: 1234, gid: 99, groups: vec![] }, ..c.options() };
    let as_user = Client::from_config(&c.config, opts).unwrap();
    rt.block_on(write_file(&as_user, "/u/f", b"x")).unwrap();
    let a = rt.block_on(root.stat("/u/f")).unwrap();
    assert_eq!((a.uid, a.gid), (1234, 99));
}

#[test]
fn auth_none_trusts_every_connection_as_before() {
    let c = Cluster::start_with(1, |m| m.security.auth = shoal_placement::map::AuthMode::None);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(write_file(&c.client(), "/f", b"abc")).unwrap();
    let ino = rt.block_on(c.client().stat("/f")).unwrap().ino;
    let mut s = raw(&c.addr(0));
    assert!(matches!(call(&mut s, 1, hello(None)), Reply::Hello { auth: None, .. }));
    assert!(matches!(call(&mut s, 2, Op::GetAttr { ino }), Reply::Attr(_)));
    let _ = ServerId(0);
}

/// Issue 51: the metadata store was 0644 in 0755 directories, so any user of a server host
/// read the names inside 0700 directories and private xattr values with `strings`. Data
/// directories are now 0700 (an existing 0755 one is tightened, with a warning) and what a
/// server creates is 0600/0700; another user finds nothing there.
#[test]
fn another_user_of_a_server_host_reads_nothing_of_the_stores() {
    let c = Cluster::start_prepared(2, |dir| {
        // As `shoal cluster up` and older versions left them: open to everyone. (The
        // cluster's folder stays so: it holds the map every client reads.)
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for id in 0..2 {
            let d = dir.join(format!("s{id}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = c.client();
    rt.block_on(async {
        client.mkdir("/private", 0o700).await.unwrap();
        write_file(&client, "/private/SECRET-NAME-7f3a", b"SECRET-BYTES-7f3a").await.unwrap();
        let a = client.stat("/private/SECRET-NAME-7f3a").await.unwrap();
        client.setxattr(a.ino, "user.note", b"SECRET-XATTR-7f3a", false, false).await.unwrap();
    });
    for id in 0..2u32 {
        let d = c.path().join(format!("s{id}"));
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "data directory {} is {mode:o}", d.display());
        assert!(c.log(id).contains("now 0700"), "no warning about tightening:\n{}", c.log(id));
        // Everything inside, at any depth, is for the server alone.
        let mut stack = vec![d];
        while let Some(p) = stack.pop() {
            for e in std::fs::read_dir(&p).unwrap() {
                let e = e.unwrap();
                let m = e.metadata().unwrap();
                assert_eq!(m.permissions().mode() & 0o077, 0, "{} is open to others", e.path().display());
                if m.is_dir() {
                    stack.push(e.path());
                }
            }
        }
    }
    if unsafe { libc::geteuid() } == 0 {
        // The issue's reproduction, as nobody: nothing found, every read refused.
        let out = Command::new("grep")
            .args(["-r", "-a", "-l", "SECRET"])
            .arg(c.path())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let found = String::from_utf8_lossy(&out.stdout);
        assert!(found.lines().all(|l| !l.contains("/s0/") && !l.contains("/s1/")), "nobody read: {found}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
    }
}

/// Issue 51: any user could start a cluster-wide scrub (a full read of every object). Only
/// root, or a member of `security.admin_gid`, may: others get one line and exit 1.
#[test]
fn only_root_or_the_admin_group_starts_a_scrub() {
    let c = Cluster::start_with(2, |m| m.security.admin_gid = Some(6000));
    std::fs::set_permissions(c.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&c.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let _helper = c.start_identityd();
    let scrub_as = |uid: u32, groups: Vec<u32>| {
        let out = shoal_testkit::shoal_as_user(c.path(), uid, uid, groups)
            .arg("--config")
            .arg(&c.config)
            .args(["scrub", "--json"])
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = scrub_as(5000, vec![]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("uid 5000 may not start a scrub") && err.lines().count() == 1, "{err}");
    let (code, err) = scrub_as(5001, vec![6000]);
    assert_eq!(code, Some(0), "a member of the admin group: {err}");
    let (code, _, err) = c.shoal(&["scrub", "--json"]);
    assert_eq!(code, 0, "root: {err}");
}

/// Issue 51: the native client let a user hard-link another user's 0600 file into a
/// world-writable directory (the mount refused, by the kernel's protected_hardlinks). The
/// servers apply the same rule for every client: the owner, or a user who may read and
/// write a plain file. Directories on every server, so that the link is made both where the
/// inode lives and across servers.
#[test]
fn a_user_may_not_hard_link_another_users_private_file() {
    let c = Cluster::start(3);
    std::fs::set_permissions(c.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&c.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = c.client();
    rt.block_on(async {
        write_file(&client, "/secret", b"root's").await.unwrap();
        client.chmod("/secret", 0o600).await.unwrap();
        write_file(&client, "/shared", b"everyone's").await.unwrap();
        client.chmod("/shared", 0o666).await.unwrap();
        for i in 0..6 {
            client.mkdir(&format!("/pub{i}"), 0o777).await.unwrap();
            client.chmod(&format!("/pub{i}"), 0o1777).await.unwrap();
        }
    });
    let _helper = c.start_identityd();
    let ln_as_user = |target: &str, link: &str| {
        let out = shoal_testkit::shoal_as_user(c.path(), 5000, 5000, vec![])
            .arg("--config")
            .arg(&c.config)
            .args(["ln", target, link])
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for i in 0..6 {
        let (code, err) = ln_as_user("/secret", &format!("/pub{i}/mine"));
        assert_eq!(code, Some(1), "linked root's 0600 file into /pub{i}: {err}");
        assert!(err.contains("protected_hardlinks") || err.contains("not permitted"), "{err}");
        let (code, err) = ln_as_user("/shared", &format!("/pub{i}/ours"));
        assert_eq!(code, Some(0), "a 0666 file is a safe source: {err}");
    }
    let fresh = c.uncached_client();
    assert_eq!(rt.block_on(fresh.stat("/secret")).unwrap().nlink, 1, "no link was made");
    assert_eq!(rt.block_on(fresh.stat("/shared")).unwrap().nlink, 7);
    // Root may still link anything.
    rt.block_on(client.link("/secret", "/pub0/roots")).unwrap();
}
