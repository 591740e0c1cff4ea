//! Floods from one unprivileged user (issue 51): what one user opens and never uses must
//! not take service away from the others. Each flood here is bounded in count and time,
//! on 127.0.0.1 and the cluster's own Unix socket.

use shoal_testkit::Cluster;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Keep `n` connections open to the Unix socket `path` for `secs` seconds, as user `uid`,
/// opening a new one for each the other side closes (a client that never sends anything
/// and comes straight back). Prints how many it opened in all.
const UNIX_FLOOD: &str = r#"
import socket, sys, time
path, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
held, opened, end = [], 0, time.time() + secs
while time.time() < end:
    alive = []
    for s in held:
        try:
            if s.recv(1, socket.MSG_DONTWAIT) == b"":
                s.close()
                continue
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        alive.append(s)
    held = alive
    while len(held) < n and time.time() < end:
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            s.close()
            break
        held.append(s)
        opened += 1
    time.sleep(0.02)
print(opened, flush=True)
"#;

fn flood_as(uid: u32, script: &str, args: &[&str]) -> Child {
    Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .uid(uid)
        .gid(uid)
        .current_dir("/")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the flood")
}

/// 1,000 connections that never send a request, held by uid 5000 against an identity
/// helper with 256 descriptors: uid 5001's commands are still answered, each in seconds.
/// Before the per-uid limit, the flood took every descriptor and the others' clients
/// failed ("no identity helper answers … Resource temporarily unavailable").
#[test]
fn idle_connections_of_one_user_do_not_lock_others_out_of_the_identity_helper() {
    let c = Cluster::start(1);
    std::fs::set_permissions(c.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&c.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let helper = c.start_identityd_limited(Some(256));
    let socket = helper.socket.to_string_lossy().into_owned();
    let (code, _, err) = c.shoal(&["mkdir", "/open"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = c.shoal(&["chmod", "777", "/open"]);
    assert_eq!(code, 0, "{err}");
    let flood = flood_as(5000, UNIX_FLOOD, &[&socket, "1000", "15"]);
    std::thread::sleep(Duration::from_secs(3));
    for i in 0..5 {
        let t = Instant::now();
        let out = shoal_testkit::shoal_as_user(c.path(), 5001, 5001, vec![])
            .arg("--config")
            .arg(&c.config)
            .args(["--timeout", "10", "mkdir", &format!("/open/d{i}")])
            .output()
            .unwrap();
        assert!(
            out.status.success() && t.elapsed() < Duration::from_secs(10),
            "uid 5001 during the flood (attempt {i}, {:?}): {}\nhelper: {}",
            t.elapsed(),
            String::from_utf8_lossy(&out.stderr),
            c.identityd_log()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let out = flood.wait_with_output().unwrap();
    let opened: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    assert!(opened >= 1000, "the flood opened only {opened}: {}", String::from_utf8_lossy(&out.stderr));
    // The flood was noticed, in a line, not one per connection.
    let log = c.identityd_log();
    let lines = log.lines().filter(|l| l.contains("connections open: further ones closed")).count();
    assert!((1..=2).contains(&lines), "{lines} lines about the flood:\n{log}");
}

/// Descriptors process `pid` has open.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Issue 51: the HTTP service had no header timeout and no connection cap, so 19,900
/// slowloris connections held for 180 s took a server to 19,944 of its 20,000 descriptors,
/// which the native protocol needs too. Now: at most `HTTP_CONNECTIONS` (1024) at once, the
/// rest closed at once, and a connection that does not finish its headers within 10 s is
/// closed. 1,200 of them, each sending half a request: the native protocol works during the
/// flood, HTTP again after it, and the server's descriptors go back to what they were.
#[test]
fn slowloris_http_connections_are_capped_and_timed_out() {
    use std::io::Write;
    let c = Cluster::start(1);
    let http = c.http_url(0).trim_start_matches("http://").to_string();
    let pid = c.pid(0);
    let before = open_descriptors(pid);
    let mut held = Vec::new();
    for _ in 0..1200 {
        let mut s = std::net::TcpStream::connect(&http).expect("connect to the HTTP port");
        // Half a request: the request line and one header, never the blank line.
        let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: slow\r\n");
        held.push(s);
    }
    let during = open_descriptors(pid);
    assert!(
        during <= before + 1024 + 64,
        "{during} descriptors open during the flood (from {before}): more than the HTTP cap"
    );
    // The native protocol is not starved meanwhile.
    let (code, _, err) = c.shoal(&["mkdir", "/during"]);
    assert_eq!(code, 0, "{err}");
    // Every slow connection is closed by the server within the header timeout and a margin.
    let open = shoal_testkit::wait_closed_by_peer(held, Duration::from_secs(30));
    assert!(open.is_empty(), "{} of 1200 slow HTTP connections still open after 30 s", open.len());
    let out =
        Command::new("curl").args(["-sS", "--max-time", "10", &format!("http://{http}/health")]).output().unwrap();
    assert!(out.status.success(), "GET /health after the flood: {}", String::from_utf8_lossy(&out.stderr));
    let start = Instant::now();
    while open_descriptors(pid) > before + 16 {
        assert!(start.elapsed() < Duration::from_secs(10), "descriptors stay at {}", open_descriptors(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(c.log(0).contains("HTTP connections are open"), "the refusals are logged");
}
