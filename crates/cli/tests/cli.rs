//! The `shoal` command line on good and bad input: output, files and exit codes.

mod common;
use common::{shoal_cmd, Cluster};

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
    let (code, _, _) = shoal_cmd(None, &["cluster", "down", "--dir", &ds]);
    assert_eq!(code, 0);
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
