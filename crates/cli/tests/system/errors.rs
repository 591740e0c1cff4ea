//! What the `shoal` command says when a server refuses or is gone, and who it says it is:
//! the server's own message reaches the user, a killed server is named with what happened,
//! and a user's supplementary groups all reach the servers.

use shoal_testkit::Cluster;
use std::os::unix::fs::PermissionsExt;

/// Runs `shoal args` expecting exit code 1 and a one-line message; returns the line.
fn fails(c: &Cluster, args: &[&str]) -> String {
    let (code, _, err) = c.shoal(args);
    assert_eq!(code, 1, "shoal {args:?} should fail with 1, stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err.trim_end().to_string()
}

#[test]
fn a_servers_refusal_reaches_the_user_with_the_servers_message() {
    let c = Cluster::start(3);
    let (code, _, err) = c.shoal(&["mkdir", "/x"]);
    assert_eq!(code, 0, "{err}");
    let err = fails(&c, &["mkdir", "/x"]);
    assert!(err.starts_with("shoal: cannot create directory /x: File exists (server s"), "{err}");
    assert!(err.ends_with(": \"x\" already exists in directory 0x1)"), "the server's message: {err}");
    assert_eq!(err.matches("/x").count(), 1, "the path is said once: {err}");

    // Moving a directory onto a non-empty one: the server that refused is named (the
    // message is the server's, which for a directory on a third server is that server's
    // errno).
    for args in [&["mkdir", "-p", "/b/a/inner"][..], &["mkdir", "/a"]] {
        let (code, _, err) = c.shoal(args);
        assert_eq!(code, 0, "{err}");
    }
    let err = fails(&c, &["mv", "/a", "/b"]);
    assert!(err.starts_with("shoal: cannot move /a to /b/a: Directory not empty (server s"), "{err}");
}

#[test]
fn a_killed_server_is_named_with_what_happened_not_a_protocol_error() {
    let mut c = Cluster::start(3);
    let client = c.uncached_client();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let root_home = client.home_of(shoal_proto::ROOT_INO);
    // A directory whose inode lives away from the root's server.
    let mut victim = None;
    for i in 0..64 {
        let dir = format!("/d{i}");
        let (code, _, err) = c.shoal(&["mkdir", &dir]);
        assert_eq!(code, 0, "{err}");
        let home = client.home_of(rt.block_on(client.stat(&dir)).unwrap().ino);
        if home != root_home {
            victim = Some((dir, home));
            break;
        }
    }
    let (dir, server) = victim.expect("a directory away from the root's server");
    c.kill9(server.0);
    let err = fails(&c, &["ls", &dir]);
    let addr = c.addr(server.0);
    assert!(err.contains(&format!("server {server} ({addr}) unreachable")), "{err}");
    assert!(err.contains("(cannot connect: Connection refused"), "what happened: {err}");
    assert!(!err.contains("Protocol error"), "{err}");
}

#[test]
fn a_user_in_100_groups_is_granted_access_through_its_80th_group() {
    let c = Cluster::start(2);
    // The unprivileged user must be able to read the cluster configuration.
    std::fs::set_permissions(c.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&c.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let client = c.client();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let groups: Vec<libc::gid_t> = (2000..2100).collect();
    let granting = groups[79];
    rt.block_on(async {
        client.mkdir("/g", 0o770).await.unwrap();
        client.chown("/g", None, Some(granting)).await.unwrap();
        client.chmod("/g", 0o770).await.unwrap();
    });

    // The user proves its uid (and groups) through the identity helper.
    let _helper = c.start_identityd();
    let (uid, gid) = (5000, 5000);
    let mut cmd = shoal_testkit::shoal_as_user(c.path(), uid, gid, groups);
    cmd.arg("--config").arg(&c.config).args(["mkdir", "/g/mine"]);
    let out = cmd.output().expect("run shoal as a user in 100 groups");
    assert!(out.status.success(), "mkdir in a directory of group #80: {}", String::from_utf8_lossy(&out.stderr));
    let a = rt.block_on(client.stat("/g/mine")).unwrap();
    assert_eq!((a.uid, a.gid), (uid, gid));
}
