//! The `shoal` command line on good and bad input: output, files and exit codes.

use shoal_testkit::{shoal_cmd, Cluster};

fn ok(c: &Cluster, args: &[&str]) -> String {
    let (code, out, err) = c.shoal(args);
    assert_eq!(code, 0, "shoal {args:?} failed: {err}");
    out
}

/// Fails with exit code 1 and a one-line message that mentions `needle`.
fn fails(c: &Cluster, args: &[&str], needle: &str) {
    let (code, _, err) = c.shoal(args);
    assert_eq!(code, 1, "shoal {args:?} should fail with 1, stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "shoal {args:?}: {err:?} should mention {needle:?}");
}

#[test]
fn file_commands_work_and_report_errors_with_the_path() {
    let c = Cluster::start(3);
    let local = c.path().join("local");
    std::fs::create_dir_all(local.join("tree/sub")).unwrap();
    std::fs::write(local.join("tree/a.txt"), b"alpha\n").unwrap();
    std::fs::write(local.join("tree/sub/b.bin"), vec![7u8; 100_000]).unwrap();
    std::os::unix::fs::symlink("a.txt", local.join("tree/link")).unwrap();
    let l = |p: &str| local.join(p).to_string_lossy().into_owned();

    // mkdir / ls / stat
    ok(&c, &["mkdir", "-p", "shoal://x/y/z"]);
    ok(&c, &["mkdir", "/m"]);
    assert_eq!(ok(&c, &["ls", "shoal://x"]).trim(), "y");
    let long = ok(&c, &["ls", "-l", "/x"]);
    assert!(long.starts_with("drwxr-xr-x"), "{long}");
    let rec = ok(&c, &["ls", "-R", "/x"]);
    assert!(rec.contains("/x/y:") && rec.contains("z"), "{rec}");
    assert!(ok(&c, &["stat", "/x/y"]).contains("Type: directory"));
    fails(&c, &["mkdir", "/x/y"], "/x/y");
    fails(&c, &["mkdir", "/nope/deeper"], "/nope/deeper");
    fails(&c, &["ls", "/missing"], "/missing");
    fails(&c, &["stat", "/missing"], "No such file or directory");
    // The path is said once.
    let (_, _, err) = c.shoal(&["stat", "/missing"]);
    assert!(err.starts_with("shoal: cannot stat /missing: No such file or directory (server s"), "{err}");
    assert_eq!(err.matches("/missing").count(), 1, "{err}");

    // cp local -> shoal (recursive), shoal -> shoal, shoal -> local
    ok(&c, &["cp", "-r", &l("tree"), "shoal://t"]);
    assert_eq!(ok(&c, &["cat", "shoal://t/a.txt"]), "alpha\n");
    assert!(ok(&c, &["ls", "-l", "/t"]).contains("link -> a.txt"));
    ok(&c, &["cp", "shoal://t/sub/b.bin", "shoal://m/copy.bin"]);
    ok(&c, &["cp", "-r", "shoal://t", &l("back")]);
    assert_eq!(std::fs::read(local.join("back/sub/b.bin")).unwrap(), vec![7u8; 100_000]);
    assert_eq!(std::fs::read_link(local.join("back/link")).unwrap().to_str().unwrap(), "a.txt");
    ok(&c, &["cp", "shoal://m/copy.bin", &l("one.bin")]);
    assert_eq!(std::fs::read(local.join("one.bin")).unwrap().len(), 100_000);
    fails(&c, &["cp", "shoal://t", &l("x")], "is a directory");
    fails(&c, &["cp", &l("does-not-exist"), "shoal://q"], "does-not-exist");
    let (code, _, err) = c.shoal(&["cp", &l("tree/a.txt"), &l("z.txt")]);
    assert_eq!(code, 2, "two local paths is a usage error: {err}");

    // mv, ln, chmod, cat
    ok(&c, &["mv", "/t/a.txt", "/m"]);
    assert_eq!(ok(&c, &["cat", "/m/a.txt"]), "alpha\n");
    fails(&c, &["mv", "/t/a.txt", "/m/b"], "/t/a.txt");
    ok(&c, &["ln", "-s", "a.txt", "/m/sym"]);
    assert_eq!(ok(&c, &["cat", "/m/sym"]), "alpha\n");
    ok(&c, &["ln", "/m/a.txt", "/m/hard"]);
    assert!(ok(&c, &["stat", "/m/hard"]).contains("Links: 2"));
    ok(&c, &["chmod", "600", "/m/a.txt"]);
    assert!(ok(&c, &["stat", "/m/a.txt"]).contains("(0600/-rw-------)"));
    fails(&c, &["cat", "/m"], "/m");
    let (code, _, _) = c.shoal(&["chmod", "99x", "/m/a.txt"]);
    assert_eq!(code, 2);

    // setstripe / getstripe
    ok(&c, &["mkdir", "/wide"]);
    ok(&c, &["setstripe", "-c", "-1", "-S", "64K", "/wide"]);
    assert!(ok(&c, &["getstripe", "/wide"]).contains("stripe_size 65536"));
    ok(&c, &["cp", "shoal://m/copy.bin", "shoal://wide/f"]);
    let g = ok(&c, &["getstripe", "/wide/f"]);
    assert!(g.contains("stripe_count: 3") && g.contains("stripe_size:  65536"), "{g}");
    ok(&c, &["setstripe", "-c", "2", "-i", "1", "/one"]);
    let g = ok(&c, &["getstripe", "/one"]);
    assert!(g.contains("stripe_count: 2") && g.contains("first_server: s1"), "{g}");
    fails(&c, &["setstripe", "-c", "2", "/one"], "fixed when it is created");
    fails(&c, &["setstripe", "-S", "1000", "/new"], "/new");
    fails(&c, &["setstripe", "-i", "9", "/new"], "server 9");

    // rm
    fails(&c, &["rm", "/x"], "use -r");
    ok(&c, &["rm", "-r", "/x"]);
    fails(&c, &["rm", "/x"], "/x");
    ok(&c, &["rm", "-f", "/x"]);
    ok(&c, &["rm", "/m/hard", "/m/sym"]);

    // df / status
    let df = ok(&c, &["df", "-H"]);
    assert!(df.contains("3/3"), "{df}");
    let st = ok(&c, &["status"]);
    assert_eq!(st.lines().filter(|l| l.contains(" up ")).count(), 3, "{st}");
    let js: serde_json::Value = serde_json::from_str(&ok(&c, &["status", "--json"])).unwrap();
    assert_eq!(js["servers"].as_array().unwrap().len(), 3);
}

#[test]
fn missing_or_bad_configuration_is_a_clear_error() {
    let (code, _, err) = shoal_cmd(None, &["ls"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("SHOAL_CONFIG"));
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = shoal_cmd(Some(&dir.path().join("none.toml")), &["ls"]);
    assert_eq!(code, 1);
    assert!(err.contains("none.toml"), "{err}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[cluster]\nversion = 1\n").unwrap();
    let (code, _, err) = shoal_cmd(Some(&bad), &["ls"]);
    assert_eq!(code, 1);
    assert!(err.contains("bad.toml"), "{err}");
    let (code, _, _) = shoal_cmd(None, &["no-such-command"]);
    assert_eq!(code, 2);
    let (code, out, _) = shoal_cmd(None, &["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("setstripe"));
}

#[test]
fn status_reports_a_down_server_and_commands_fail_instead_of_hanging() {
    let mut c = Cluster::start(2);
    ok(&c, &["mkdir", "/d"]);
    c.kill9(1);
    let (code, out, err) = c.shoal(&["--timeout", "3", "status"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.contains("DOWN"), "{out}");
    assert!(err.contains("1 of 2 servers"), "{err}");
    c.restart(1);
    ok(&c, &["status"]);
}

#[test]
fn cluster_up_and_down_manage_real_processes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("c");
    let ds = d.to_string_lossy().into_owned();
    let (code, out, err) = shoal_cmd(None, &["cluster", "up", "--servers", "2", "--dir", &ds]);
    assert_eq!(code, 0, "{err}");
    let config = d.join("cluster.toml");
    assert!(out.contains(&format!("export SHOAL_CONFIG={}", config.display())), "{out}");
    let (code, _, err) = shoal_cmd(Some(&config), &["mkdir", "/kept"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = shoal_cmd(Some(&config), &["cluster", "down"]);
    assert_eq!(code, 0);
    assert!(out.contains("stopped 2 servers"));
    // Up again on the same folder: same cluster, same contents.
    let (code, _, err) = shoal_cmd(None, &["cluster", "up", "--dir", &ds]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = shoal_cmd(Some(&config), &["ls"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "kept");
    // Issue 51: a user who may read the folder but not signal the servers once got
    // "stopped 2 servers" and exit 0 while nothing stopped.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::PermissionsExt;
        for p in [dir.path(), d.as_path()] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // The map and the pid files, as a reader of the folder needs them (the keys stay 0600).
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name == "cluster.toml" || name.ends_with(".pid") {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
            }
        }
        let out = shoal_testkit::shoal_as_user(dir.path(), 65534, 65534, vec![])
            .args(["cluster", "down", "--dir", &ds, "--grace", "1"])
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
        assert!(stdout.contains("stopped 0 servers"), "{stdout}");
        for id in 0..2 {
            assert!(stderr.contains(&format!("server {id} (pid ")), "{stderr}");
        }
        assert!(stderr.contains("not stopped: cannot signal it") && stderr.contains("still running"), "{stderr}");
        let (code, out, err) = shoal_cmd(Some(&config), &["ls"]);
        assert_eq!((code, out.trim()), (0, "kept"), "the servers must still serve: {err}");
    }
    let (code, out, _) = shoal_cmd(None, &["cluster", "down", "--dir", &ds]);
    assert_eq!(code, 0);
    assert!(out.contains("stopped 2 servers"), "{out}");
    let (code, _, _) =
        shoal_cmd(None, &["cluster", "up", "--servers", "0", "--dir", &dir.path().join("zero").to_string_lossy()]);
    assert_eq!(code, 1);
}

#[test]
fn demo_runs_to_completion() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = shoal_cmd(
        None,
        &["demo", "--size-mib", "16", "--files", "200", "--dir", &dir.path().join("demo").to_string_lossy()],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("all checks passed"), "{out}");
}

/// A chain of `depth` directories `/name/d/d/…/d` with a small file at the bottom, made
/// through the native client one level at a time (by inode, so no path grows long).
fn deep_tree(c: &Cluster, name: &str, depth: usize) {
    let fs = shoal_client::BlockingClient::from_config(&c.config, c.options()).unwrap();
    let mut dir = fs.mkdir(&format!("/{name}"), 0o755).unwrap().ino;
    for _ in 1..depth {
        dir = fs.mkdir_at(dir, "d", 0o755).unwrap().ino;
    }
    fs.create_at(dir, "leaf", 0o644, true, None).unwrap();
}

#[test]
fn rm_and_ls_walk_a_tree_three_thousand_levels_deep() {
    // Deeper than PATH_MAX allows a path to reach: the walks go by inode, not by path.
    let c = Cluster::start(2);
    deep_tree(&c, "deep", 3000);
    let listing = ok(&c, &["ls", "-R", "/deep"]);
    // A header per directory, and the file at the bottom.
    assert_eq!(listing.lines().filter(|l| l.ends_with(':')).count(), 3000);
    assert_eq!(listing.lines().filter(|l| *l == "leaf").count(), 1);
    let long = ok(&c, &["ls", "-R", "-l", "-a", "/deep"]);
    assert_eq!(long.lines().filter(|l| l.starts_with("drwx") && l.ends_with(" d")).count(), 2999);
    assert_eq!(long.lines().filter(|l| l.starts_with("-rw-") && l.ends_with(" leaf")).count(), 1);
    ok(&c, &["rm", "-r", "/deep"]);
    assert_eq!(ok(&c, &["ls", "/"]), "", "nothing left of the tree");
}

#[test]
fn cp_copies_a_tree_a_thousand_levels_deep_both_ways() {
    let c = Cluster::start(2);
    deep_tree(&c, "deep", 1000);
    let local = c.path().join("local-copy");
    ok(&c, &["cp", "-r", "shoal://deep", &local.to_string_lossy()]);
    let bottom = (1..1000).fold(local.clone(), |p, _| p.join("d")).join("leaf");
    assert!(bottom.exists(), "cp -r copied every level");
    ok(&c, &["cp", "-r", &local.to_string_lossy(), "shoal://back"]);
    let listing = ok(&c, &["ls", "-R", "/back"]);
    assert_eq!(listing.lines().filter(|l| l.ends_with(':')).count(), 1000);
    assert_eq!(listing.lines().filter(|l| *l == "leaf").count(), 1);
    let _ = std::fs::remove_dir_all(&local);
}

#[test]
fn rm_refuses_the_root_unless_told_and_then_empties_it() {
    let c = Cluster::start(2);
    ok(&c, &["mkdir", "-p", "/a/b"]);
    ok(&c, &["mkdir", "/c"]);
    for root in ["/", "shoal://", "shoal:///", "//", "/.", "/./", "shoal://.", "/a/..", "/a/b/../.."] {
        let (code, _, err) = c.shoal(&["rm", "-r", root]);
        assert_eq!(code, 1, "rm -r {root} must fail: {err}");
        assert_eq!(
            err.trim_end(),
            "shoal: rm: refusing to remove the root of the file system (use --no-preserve-root to override)",
            "rm -r {root}"
        );
        let (code, _, _) = c.shoal(&["rm", "-rf", root]);
        assert_eq!(code, 1, "-f does not override the refusal ({root})");
    }
    assert_eq!(ok(&c, &["ls", "/"]), "a\nc\n", "nothing was removed");
    ok(&c, &["rm", "-r", "--no-preserve-root", "shoal://"]);
    assert_eq!(ok(&c, &["ls", "/"]), "", "the root is emptied");
    ok(&c, &["mkdir", "/again"]);
    assert_eq!(ok(&c, &["ls", "/"]), "again\n", "and stays usable");
}

/// `shoald` started on `config` exits by itself with status 1 and one line naming `needle`.
fn shoald_refuses(config: &std::path::Path, needle: &str) {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shoald"))
        .args(["--config", &config.to_string_lossy(), "--id", "0"])
        .current_dir(cwd.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "shoald must refuse the map ({needle}); stderr: {err}");
    let last = err.trim_end().lines().last().unwrap_or("");
    assert!(last.starts_with("shoald: ") && last.contains(needle), "{err:?} should name {needle:?}");
}

#[test]
fn bad_cluster_maps_are_refused_by_clients_and_servers_with_one_line_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let good = shoal_placement::ClusterMap::local(1, port, dir.path());
    type Tweak = Box<dyn Fn(&mut shoal_placement::ClusterMap)>;
    let cases: Vec<(&str, Tweak, &str)> = vec![
        (
            "dup-addr",
            Box::new(|m| {
                m.servers.push(m.servers[0].clone());
                m.servers[1].id = 1;
                m.servers[1].data_dir = Some("/nonexistent/s1".into());
            }),
            "server 1: addr 127.0.0.1:",
        ),
        (
            "empty-data-dir",
            Box::new(|m| {
                m.servers.push(m.servers[0].clone());
                m.servers[1].id = 1;
                m.servers[1].addr = "127.0.0.1:9".into();
                m.servers[1].data_dir = Some("".into());
            }),
            "server 1: data_dir is empty",
        ),
        ("version-0", Box::new(|m| m.cluster.version = 0), "cluster.version must be ≥ 1"),
        ("stripe-count", Box::new(|m| m.cluster.stripe_count = 3), "cluster.stripe_count 3 is more than the 1 servers"),
    ];
    for (name, tweak, needle) in cases {
        let mut map = good.clone();
        tweak(&mut map);
        let bad = dir.path().join(format!("{name}.toml"));
        std::fs::write(&bad, map.to_toml()).unwrap();
        let (code, _, err) = shoal_cmd(Some(&bad), &["--timeout", "2", "ls"]);
        assert_eq!(code, 1, "{name}: a client must refuse the map: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: one line: {err}");
        assert!(
            err.contains(needle) && err.contains(&format!("{name}.toml")),
            "{name}: {err:?} should name {needle:?}"
        );
        shoald_refuses(&bad, needle);
    }
}

#[test]
fn setstripe_over_more_servers_than_the_cluster_has_is_refused_by_the_cli_and_the_servers() {
    let c = Cluster::start(4);
    fails(&c, &["setstripe", "-c", "999", "/new"], "stripe count 999 is more than the 4 servers");
    fails(&c, &["stat", "/new"], "No such file or directory");
    ok(&c, &["mkdir", "/dir"]);
    fails(&c, &["setstripe", "-c", "5", "/dir"], "stripe count 5 is more than the 4 servers");
    ok(&c, &["setstripe", "-c", "4", "/dir"]);
    ok(&c, &["setstripe", "-c", "-1", "/all"]);
    assert!(ok(&c, &["getstripe", "/all"]).contains("stripe_count: 4"));
    // The servers refuse the same requests from any client, not only from the CLI.
    let fs = shoal_client::BlockingClient::from_config(&c.config, c.options()).unwrap();
    let wide = shoal_client::LayoutSpec { stripe_count: Some(999), ..Default::default() };
    let err = fs.create("/native", 0o644, Some(wide.clone())).unwrap_err();
    assert_eq!(err.errno, shoal_client::Errno::EINVAL, "{err}");
    assert_eq!(fs.lstat("/native").unwrap_err().errno, shoal_client::Errno::ENOENT);
    assert_eq!(fs.set_layout("/dir", wide).unwrap_err().errno, shoal_client::Errno::EINVAL);
}

#[test]
fn rm_r_that_fails_midway_says_where_and_a_rerun_finishes_the_job() {
    let mut c = Cluster::start(2);
    // Directories are spread round-robin, so the tree has directories on both servers.
    for i in 0..8 {
        ok(&c, &["mkdir", "-p", &format!("/t/d{i}/e")]);
        ok(&c, &["setstripe", &format!("/t/d{i}/e/f")]);
    }
    c.kill9(1);
    let (code, _, err) = c.shoal(&["--timeout", "2", "rm", "-r", "/t"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("shoal: cannot remove /t: "), "names the path: {err}");
    assert!(err.contains("unreachable"), "and the cause: {err}");
    c.restart(1);
    ok(&c, &["rm", "-r", "/t"]);
    assert_eq!(ok(&c, &["ls", "/"]), "");
}
