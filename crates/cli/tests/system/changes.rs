//! The change log (docs/changes.md) on real servers: every kind of event with its paths,
//! watches limited to a tree, a pattern or a directory's own entries, what a user may see,
//! a consumer that restarts (and a server killed with -9 between) missing and repeating
//! nothing, the CLI with --exec and --consumer, and the benchmark.

use shoal_client::{Change, ChangeKind, ChangeStart, ChangeWatch, ChangeWatchOptions, Client, Cred, Errno, ALL_KINDS};
use shoal_testkit::Cluster;
use std::process::{Command, Stdio};
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

const WAIT: Option<Duration> = Some(Duration::from_secs(15));

async fn write_file(fs: &Client, path: &str, data: &[u8]) {
    let f = fs.create(path, 0o644, None).await.unwrap();
    f.write_at(0, data).await.unwrap();
    f.close().await.unwrap();
}

/// The next `n` events, as "kind path[ -> to]" lines, in per-server order merged by time.
async fn lines(w: &mut ChangeWatch, n: usize) -> Vec<String> {
    let mut got: Vec<Change> = Vec::new();
    for _ in 0..n {
        got.push(w.next(WAIT).await.unwrap().expect("an event in time"));
    }
    got.sort_by_key(|c| (c.at, c.server, c.seq));
    got.iter().map(Change::line).collect()
}

async fn nothing_more(w: &mut ChangeWatch) {
    if let Some(c) = w.next(Some(Duration::from_millis(700))).await.unwrap() {
        panic!("unexpected event {}", c.line());
    }
}

fn opts(kinds: u32) -> ChangeWatchOptions {
    ChangeWatchOptions { kinds, ..Default::default() }
}

#[test]
fn every_kind_of_event_comes_with_its_paths_and_only_from_the_watched_tree() {
    let c = Cluster::start(3);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        fs.mkdir("/w", 0o755).await.unwrap();
        fs.mkdir("/w/old", 0o755).await.unwrap();
        fs.mkdir("/elsewhere", 0o755).await.unwrap();
        write_file(&fs, "/w/old/before", b"x").await;
        let mut w = fs.watch_changes("/w", opts(ALL_KINDS)).await.unwrap();
        let mut flat =
            fs.watch_changes("/w", ChangeWatchOptions { recursive: false, ..opts(ALL_KINDS) }).await.unwrap();
        let h5 = ChangeWatchOptions { pattern: Some("*.h5".into()), ..opts(ChangeKind::Close.bit()) };
        let mut closes = fs.watch_changes("/w", h5).await.unwrap();

        // A pause between operations: events of different servers are not ordered between
        // them, and a file's path follows its renames in the order the watch sees them.
        let pause = || tokio::time::sleep(Duration::from_millis(100));
        write_file(&fs, "/elsewhere/x.h5", b"not watched").await;
        fs.mkdir("/w/d", 0o755).await.unwrap();
        pause().await;
        write_file(&fs, "/w/d/a.h5", b"data").await;
        pause().await;
        fs.rename("/w/d/a.h5", "/w/b.h5").await.unwrap();
        pause().await;
        fs.chmod("/w/b.h5", 0o600).await.unwrap();
        fs.setxattr(fs.stat("/w/b.h5").await.unwrap().ino, "user.tag", b"hot", false, false).await.unwrap();
        pause().await;
        fs.link("/w/b.h5", "/w/d/hard").await.unwrap();
        fs.symlink("b.h5", "/w/d/sym").await.unwrap();
        fs.truncate("/w/old/before", 0).await.unwrap(); // a file from before the watch
        pause().await;
        fs.rename("/w/d", "/w/e").await.unwrap();
        pause().await;
        fs.unlink("/w/e/hard").await.unwrap();
        fs.unlink("/w/e/sym").await.unwrap();
        pause().await;
        fs.rmdir("/w/e").await.unwrap();
        fs.rename("/w/b.h5", "/elsewhere/gone.h5").await.unwrap();

        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        let want = |v: &[&str]| sorted(v.iter().map(|s| s.to_string()).collect());
        let got = sorted(lines(&mut w, 14).await);
        assert_eq!(
            got,
            want(&[
                "mkdir /w/d",
                "create /w/d/a.h5",
                "close /w/d/a.h5",
                "rename /w/d/a.h5 -> /w/b.h5",
                "setattr /w/b.h5",
                "xattr /w/b.h5 user.tag",
                "link /w/d/hard",
                "symlink /w/d/sym",
                "setattr /w/old/before",
                "rename /w/d -> /w/e",
                "unlink /w/e/hard",
                "unlink /w/e/sym",
                "rmdir /w/e",
                "rename /w/b.h5 -> (outside)",
            ])
        );
        nothing_more(&mut w).await;

        // Only /w's own entries: a.h5 comes in from /w/d, which is not watched.
        let got = sorted(lines(&mut flat, 7).await);
        assert_eq!(
            got,
            want(&[
                "mkdir /w/d",
                "rename (outside) -> /w/b.h5",
                "setattr /w/b.h5",
                "xattr /w/b.h5 user.tag",
                "rename /w/d -> /w/e",
                "rmdir /w/e",
                "rename /w/b.h5 -> (outside)",
            ])
        );
        nothing_more(&mut flat).await;

        // Only closes of *.h5 files under /w.
        assert_eq!(lines(&mut closes, 1).await, ["close /w/d/a.h5"]);
        nothing_more(&mut closes).await;

        // Bad watches.
        assert_eq!(fs.watch_changes("/nope", opts(ALL_KINDS)).await.err().unwrap().errno, Errno::ENOENT);
        write_file(&fs, "/w/file", b"").await;
        assert_eq!(fs.watch_changes("/w/file", opts(ALL_KINDS)).await.err().unwrap().errno, Errno::ENOTDIR);
        assert_eq!(fs.watch_changes("/w", opts(0)).await.err().unwrap().errno, Errno::EINVAL);
        let bad = ChangeWatchOptions { start: ChangeStart::Consumer("a/b".into()), ..opts(ALL_KINDS) };
        assert_eq!(fs.watch_changes("/w", bad).await.err().unwrap().errno, Errno::EINVAL);
    });
}

#[test]
fn a_user_sees_only_events_of_directories_they_may_read() {
    let c = Cluster::start(2);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        for (d, perm) in [("/s", 0o755), ("/s/open", 0o755), ("/s/closed", 0o700)] {
            fs.mkdir(d, perm).await.unwrap();
            fs.chmod(d, perm).await.unwrap();
        }
        let alice = c.uncached_client().with_cred(Cred { uid: 1000, gid: 1000, groups: vec![] });
        let mut w = alice.watch_changes("/s", opts(ChangeKind::Create.bit())).await.unwrap();
        let mut root = fs.watch_changes("/s", opts(ChangeKind::Create.bit())).await.unwrap();
        fs.create("/s/closed/secret", 0o600, None).await.unwrap().close().await.unwrap();
        fs.create("/s/open/public", 0o644, None).await.unwrap().close().await.unwrap();
        assert_eq!(lines(&mut w, 1).await, ["create /s/open/public"]);
        nothing_more(&mut w).await;
        let mut all = lines(&mut root, 2).await;
        all.sort();
        assert_eq!(all, ["create /s/closed/secret", "create /s/open/public"]);
    });
}

#[test]
fn a_consumer_that_restarts_misses_and_repeats_nothing_across_kill9_of_a_server() {
    let mut c = Cluster::start(2);
    let rt = rt();
    let fs = c.client();
    let consumer = || ChangeWatchOptions {
        start: ChangeStart::Consumer("ingest".into()),
        ..opts(ChangeKind::Create.bit() | ChangeKind::Close.bit())
    };
    let first_half = rt.block_on(async {
        fs.mkdir("/in", 0o755).await.unwrap();
        let mut w = fs.watch_changes("/in", consumer()).await.unwrap();
        for i in 0..20 {
            write_file(&fs, &format!("/in/f{i}"), b"x").await;
        }
        let got = lines(&mut w, 25).await; // 20 creates + 20 closes: take 25, ack them
        w.ack().await.unwrap();
        drop(w);
        // Written while no consumer runs.
        for i in 20..30 {
            write_file(&fs, &format!("/in/f{i}"), b"x").await;
        }
        got
    });
    // Events and cursors are durable: a server killed with -9 loses none.
    c.kill9(0);
    c.restart(0);
    let fs = c.client();
    let second_half = rt.block_on(async {
        let mut w = fs.watch_changes("/in", consumer()).await.unwrap();
        write_file(&fs, "/in/after", b"x").await;
        let got = lines(&mut w, 60 - 25 + 2).await;
        nothing_more(&mut w).await;
        w.ack().await.unwrap();
        got
    });
    let mut all: Vec<String> = first_half.into_iter().chain(second_half).collect();
    all.sort();
    let mut want: Vec<String> = (0..30).flat_map(|i| [format!("close /in/f{i}"), format!("create /in/f{i}")]).collect();
    want.extend(["close /in/after".to_string(), "create /in/after".to_string()]);
    want.sort();
    assert_eq!(all, want, "every event once");
    // A watch from the oldest event sees them all again, and numbers go on across the kill.
    rt.block_on(async {
        let o = ChangeWatchOptions { start: ChangeStart::Oldest, ..opts(ChangeKind::Create.bit()) };
        let mut w = fs.watch_changes("/in", o).await.unwrap();
        let mut seqs: Vec<(u32, u64)> = Vec::new();
        for _ in 0..31 {
            let e = w.next(WAIT).await.unwrap().unwrap();
            seqs.push((e.server.0, e.seq));
        }
        let mut sorted = seqs.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 31, "no number given twice");
        fs.forget_consumer("ingest").await.unwrap();
    });
}

#[test]
fn the_cli_prints_events_runs_commands_and_keeps_a_consumers_place() {
    let c = Cluster::start(2);
    let rt = rt();
    let fs = c.client();
    rt.block_on(fs.mkdir("/cli", 0o755)).unwrap();
    let marks = tempfile::tempdir().unwrap();
    let spawn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_shoal"))
            .arg("--config")
            .arg(&c.config)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let exec = format!(
        "echo \"$SHOAL_EVENT $SHOAL_PATH\" >> {}/log; touch {}/$(basename {{}})",
        marks.path().display(),
        marks.path().display()
    );
    let watcher = spawn(&["watch", "/cli", "--events", "close", "--match", "*.h5", "--exec", &exec, "--count", "2"]);
    let json =
        spawn(&["watch", "/cli", "--events", "create,unlink", "--json", "--count", "3", "--consumer", "cli-test"]);
    std::thread::sleep(Duration::from_millis(1500));
    rt.block_on(async {
        write_file(&fs, "/cli/a.h5", b"1").await;
        write_file(&fs, "/cli/skip.txt", b"2").await;
        write_file(&fs, "/cli/b.h5", b"3").await;
        fs.unlink("/cli/skip.txt").await.unwrap();
    });
    let out = watcher.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let log = std::fs::read_to_string(marks.path().join("log")).unwrap();
    let mut log: Vec<&str> = log.lines().collect();
    log.sort();
    assert_eq!(log, ["close /cli/a.h5", "close /cli/b.h5"]);
    assert!(marks.path().join("a.h5").exists() && marks.path().join("b.h5").exists(), "{{}} is the path");
    let out = json.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e["event"] == "create" && e["type"] == "f"), "{events:?}");
    // The consumer goes on after the three it printed: the unlink.
    let (code, out, err) =
        c.shoal(&["watch", "/cli", "--events", "create,unlink", "--count", "1", "--consumer", "cli-test"]);
    assert_eq!((code, out.trim()), (0, "unlink /cli/skip.txt"), "{err}");
    let (code, _, err) = c.shoal(&["watch", "/cli", "--consumer", "cli-test", "--forget"]);
    assert_eq!(code, 0, "{err}");
    // Usage errors: exit 2 naming the cause; a missing directory: 1.
    let (code, _, err) = c.shoal(&["watch", "/cli", "--events", "bogus"]);
    assert_eq!(code, 2);
    assert!(err.contains("bogus"), "{err}");
    let (code, _, err) = c.shoal(&["watch", "/nope", "--idle", "0.1"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nope"), "{err}");
}

/// Issue 51: `--exec` once spliced the path into the shell script inside single quotes, so
/// a `{}` in double quotes, or a quote in a name, let a file's name run commands as the
/// watcher. The path is now the script's argument: every hostile name below comes out in
/// the log exactly, and nothing it names runs.
#[test]
fn exec_never_runs_what_a_file_name_holds() {
    let c = Cluster::start(2);
    let rt = rt();
    let fs = c.client();
    rt.block_on(fs.mkdir("/w", 0o777)).unwrap();
    let marks = tempfile::tempdir().unwrap();
    let log = marks.path().join("log");
    let names = [
        "$(touch PWNED1)",
        "`touch PWNED2`",
        "a'b\"c; touch PWNED3; '",
        "\"; touch PWNED4; \"",
        "x\n$(touch PWNED5)",
        "*",
    ];
    // The issue's own command, the path in double quotes; and one unquoted, one in single
    // quotes (each line tagged so that the three logs can be told apart).
    let exec = format!(
        "echo \"got {{}}\" >> {log}; printf 'plain<%s>\\n' {{}} >> {log}; echo 'single<{{}}>' >> {log}",
        log = log.display()
    );
    let count = names.len().to_string();
    let watcher = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .arg("--config")
        .arg(&c.config)
        .args(["watch", "/w", "--events", "close", "--exec", &exec, "--count", &count])
        .current_dir(marks.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    rt.block_on(async {
        for n in names {
            write_file(&fs, &format!("/w/{n}"), b"x").await;
        }
    });
    let out = watcher.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = std::fs::read_to_string(&log).unwrap();
    for n in names {
        for want in [format!("got /w/{n}\n"), format!("plain</w/{n}>\n"), format!("single</w/{n}>\n")] {
            assert!(got.contains(&want), "{want:?} is not in the log:\n{got}");
        }
    }
    let made: Vec<_> = std::fs::read_dir(marks.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(made, [std::ffi::OsString::from("log")], "a name ran a command");
}

#[test]
fn the_watch_benchmark_measures_latency_with_restarts_and_finds_nothing_missed() {
    let c = Cluster::start(2);
    let (code, out, err) =
        c.shoal(&["bench", "watch", "--writers", "2", "--files", "60", "--restart-every", "25", "--json", "-q"]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((r["events"].as_u64(), r["missed"].as_u64(), r["repeated"].as_u64()), (Some(120), Some(0), Some(0)));
    assert!(r["restarts"].as_u64().unwrap() >= 4);
    assert!(r["median_ms"].as_f64().unwrap() >= 0.0);
}
