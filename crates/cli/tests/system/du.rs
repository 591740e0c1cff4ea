//! `shoal du` (docs/du.md): trees added up from the per-directory usage every server keeps,
//! on real 4-server clusters, checked against a walk of the same tree after every kind of
//! change (creates, writes, truncates, renames of files and directories across servers, hard
//! links, unlinks, a file unlinked while open, a split directory), across `kill -9` of a
//! server and a failover, for a user who may not read part of the tree, and through the CLI.

use shoal_client::{Client, Cred, DuReport, FileKind, OpenFlags};
use shoal_testkit::Cluster;
use std::collections::HashSet;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// What a walk of `path` finds below it: (files, directories, bytes), a file of several
/// names counted once, as `du` counts.
async fn walk(fs: &Client, path: &str) -> (u64, u64, u64) {
    walk_or_none(fs, path).await.unwrap_or_else(|| panic!("walk of {path} failed"))
}

async fn du(fs: &Client, path: &str) -> (u64, u64, u64) {
    let r = fs.du(path, 0).await.unwrap_or_else(|e| panic!("du {path}: {e}"));
    assert!(r.servers >= 3, "every server asked");
    let top = r.dirs.last().unwrap();
    assert_eq!(top.path, path);
    (top.files, top.dirs, top.bytes)
}

async fn same_as_a_walk(fs: &Client, paths: &[&str], when: &str) {
    for p in paths {
        assert_eq!(du(fs, p).await, walk(fs, p).await, "du {p} {when}");
    }
}

async fn file(fs: &Client, path: &str, size: usize) {
    let f = fs.create(path, 0o644, None).await.unwrap();
    if size > 0 {
        f.write_at(0, &vec![3u8; size]).await.unwrap();
    }
    f.close().await.unwrap();
}

#[test]
fn du_matches_a_walk_after_every_kind_of_change_and_a_kill_9() {
    let mut c = Cluster::start(4);
    let rt = rt();
    let fs = c.uncached_client();
    rt.block_on(async {
        // Directories placed over the servers, files in each, one directory split.
        for d in ["/p", "/p/a", "/p/a/b", "/p/a/b/c", "/p/wide", "/q", "/q/r"] {
            fs.mkdir(d, 0o755).await.unwrap();
        }
        for (i, d) in ["/p", "/p/a", "/p/a/b", "/p/a/b/c", "/q", "/q/r"].iter().enumerate() {
            for j in 0..3 {
                file(&fs, &format!("{d}/f{j}"), 1000 * i + j).await;
            }
        }
        for j in 0..80 {
            file(&fs, &format!("/p/wide/w{j:02}"), j).await;
        }
        let wide = fs.stat("/p/wide").await.unwrap().ino;
        assert!(fs.fetch_bitmap(wide).await.unwrap().len() > 1, "/p/wide split");
        fs.symlink("f0", "/p/a/link").await.unwrap();
        fs.link("/p/a/f1", "/p/a/b/f1-again").await.unwrap();
        same_as_a_walk(&fs, &["/", "/p", "/p/a", "/p/wide", "/q"], "after the build").await;
        let top = du(&fs, "/p").await;
        assert_eq!((top.0, top.1), (3 * 4 + 80 + 1, 4), "files (the link counted once) and directories of /p");

        // Writes grow files, truncates shrink them.
        let f = fs.open("/p/a/f0", OpenFlags::read_write()).await.unwrap();
        f.write_at(5000, b"grown").await.unwrap();
        f.close().await.unwrap();
        fs.truncate("/p/a/b/c/f2", 1).await.unwrap();
        same_as_a_walk(&fs, &["/p", "/p/a/b/c"], "after a write and a truncate").await;
        // A file of two names counts in the directory it was made in: /p/a, not /p/a/b.
        let (files, _, bytes) = walk(&fs, "/p/a/b").await;
        assert_eq!(du(&fs, "/p/a/b").await, (files - 1, 1, bytes - 1001));

        // Files renamed between directories (on other servers, most of them), a directory
        // moved with its tree, unlinks, a hard link's other name removed.
        for j in 0..3 {
            fs.rename(&format!("/p/a/b/f{j}"), &format!("/q/r/moved{j}")).await.unwrap();
        }
        fs.rename("/p/a/b/c", "/q/c").await.unwrap();
        fs.rename("/p/wide/w05", "/q/w05").await.unwrap();
        fs.unlink("/p/wide/w06").await.unwrap();
        fs.unlink("/p/a/f1").await.unwrap();
        same_as_a_walk(&fs, &["/", "/p", "/q", "/q/r", "/q/c"], "after renames and unlinks").await;
        // An empty directory removed; a file unlinked while open counts nowhere.
        fs.mkdir("/q/empty", 0o755).await.unwrap();
        fs.rmdir("/q/empty").await.unwrap();
        let open = fs.open("/q/r/moved0", OpenFlags::read_only()).await.unwrap();
        fs.unlink("/q/r/moved0").await.unwrap();
        same_as_a_walk(&fs, &["/", "/q"], "after an rmdir and an unlink of an open file").await;
        open.close().await.unwrap();

        // kill -9 of a server: what it acknowledged is counted after its restart.
        file(&fs, "/q/r/late", 777).await;
        c.kill9(1);
        c.restart(1);
        let fresh = c.uncached_client();
        same_as_a_walk(&fresh, &["/", "/p", "/q"], "after kill -9 of server 1").await;

        // Depth: every directory down to it, each before its parent, siblings by name.
        let r: DuReport = fresh.du("/q", 1).await.unwrap();
        let listed: Vec<(&str, usize)> = r.dirs.iter().map(|d| (d.path.as_str(), d.depth)).collect();
        assert_eq!(listed, [("/q/c", 1), ("/q/r", 1), ("/q", 0)]);
        for d in &r.dirs {
            assert_eq!((d.files, d.dirs, d.bytes), walk(&fresh, &d.path).await, "{}", d.path);
        }
        // A file reports itself; no such path is ENOENT.
        let one = fresh.du("/q/r/late", 3).await.unwrap();
        assert_eq!((one.dirs.len(), one.dirs[0].files, one.dirs[0].bytes, one.dirs[0].inodes()), (1, 1, 777, 1));
        let e = fresh.du("/q/missing", 0).await.unwrap_err();
        assert_eq!(e.errno, shoal_client::Errno::ENOENT, "{e}");
    });
}

/// A user counts what du run as them would: a directory they may not read adds only itself.
#[test]
fn a_user_counts_only_what_they_may_read() {
    let c = Cluster::start(4);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        for (d, perm) in [("/s", 0o755), ("/s/open", 0o755), ("/s/closed", 0o700), ("/s/closed/sub", 0o755)] {
            fs.mkdir(d, perm).await.unwrap();
            fs.chmod(d, perm).await.unwrap();
        }
        file(&fs, "/s/open/f1", 10).await;
        file(&fs, "/s/closed/f2", 20).await;
        file(&fs, "/s/closed/sub/f3", 40).await;
        let alice = c.uncached_client().with_cred(Cred { uid: 1000, gid: 1000, groups: vec![] });
        let r = alice.du("/s", 0).await.unwrap();
        let top = r.dirs.last().unwrap();
        // /s/open, /s/closed (itself) and f1.
        assert_eq!((top.files, top.dirs, top.bytes), (1, 2, 10));
        let closed = fs.stat("/s/closed").await.unwrap().ino;
        assert_eq!(r.unreadable, [closed]);
        let e = alice.du("/s/closed", 0).await.unwrap_err();
        assert_eq!(e.errno, shoal_client::Errno::EACCES, "{e}");
        // Root counts everything; once allowed, alice does too.
        assert_eq!(du(&fs, "/s").await, (3, 3, 70));
        fs.chown("/s/closed", Some(1000), Some(1000)).await.unwrap();
        assert_eq!(du(&alice, "/s").await, (3, 3, 70));
    });
}

#[test]
fn the_cli_prints_tables_and_json_and_exits_as_documented() {
    let c = Cluster::start(4);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        for d in ["/t", "/t/x", "/t/y"] {
            fs.mkdir(d, 0o755).await.unwrap();
        }
        file(&fs, "/t/x/a", 2048).await;
        file(&fs, "/t/y/b", 1).await;
    });
    let (code, out, err) = c.shoal(&["du", "/t"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["2.0K", "5", "/t"], "{out}");
    let (code, out, err) = c.shoal(&["du", "-d", "1", "--bytes", "/t", "-c"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        lines,
        [vec!["2048", "2", "/t/x"], vec!["1", "2", "/t/y"], vec!["2049", "5", "/t"], vec!["2049", "5", "total"]]
    );
    let (code, out, _) = c.shoal(&["du", "--json", "shoal:///t/x"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (v["path"].as_str(), v["bytes"].as_u64(), v["files"].as_u64(), v["inodes"].as_u64()),
        (Some("/t/x"), Some(2048), Some(1), Some(2))
    );
    let (code, _, err) = c.shoal(&["du", "/nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nope") && err.contains("No such file"), "{err}");
    let (code, _, err) = c.shoal(&["du"]);
    assert_eq!(code, 2, "{err}");
}

/// With two copies, a server's usage is mirrored with the rest of its store (merges
/// included): after `kill -9` of a server and the failover of its slot, `du` still adds up
/// to a walk of the tree, and keeps doing so through changes made on the promoted copy.
#[test]
fn usage_is_mirrored_and_counts_after_a_failover() {
    let mut c = Cluster::start_with(3, |m| m.cluster.replicas = 2);
    let rt = rt();
    let victim = rt.block_on(async {
        let fs = c.uncached_client();
        for d in ["/m", "/m/a", "/m/b", "/m/a/c"] {
            fs.mkdir(d, 0o755).await.unwrap();
        }
        for (i, d) in ["/m", "/m/a", "/m/b", "/m/a/c"].iter().enumerate() {
            for j in 0..4 {
                file(&fs, &format!("{d}/f{j}"), 100 * i + j).await;
            }
        }
        fs.rename("/m/a/f0", "/m/b/f0-moved").await.unwrap();
        same_as_a_walk(&fs, &["/m"], "before the failover").await;
        // A server that neither leads the map group nor holds the root.
        let root_home = c.map.home_of(shoal_proto::ROOT_INO).0;
        loop {
            let (_, _, leader, voters) = fs.get_map(shoal_proto::ServerId(0)).await.unwrap();
            if let Some(l) = leader {
                break voters.into_iter().find(|v| *v != l && *v != root_home).unwrap();
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
    c.kill9(victim);
    rt.block_on(async {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let fs = c.uncached_client();
            let (d, w) = (fs.du("/m", 0).await, walk_or_none(&fs, "/m").await);
            if let (Ok(d), Some(w)) = (d, w) {
                let top = d.dirs.last().unwrap();
                assert_eq!((top.files, top.dirs, top.bytes), w, "du /m after the failover of server {victim}");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "server {victim}'s slot never served again");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let fs = c.uncached_client();
        file(&fs, "/m/b/after", 12345).await;
        fs.unlink("/m/a/c/f1").await.unwrap();
        let top = fs.du("/m", 0).await.unwrap().dirs.pop().unwrap();
        assert_eq!((top.files, top.dirs, top.bytes), walk(&fs, "/m").await, "du /m after changes on the promoted copy");
    });
}

/// A walk that gives up (`None`) on the first error: servers still failing over.
async fn walk_or_none(fs: &Client, path: &str) -> Option<(u64, u64, u64)> {
    let (mut files, mut dirs, mut bytes) = (0, 0, 0);
    let mut seen = HashSet::new();
    let mut todo = vec![path.to_string()];
    while let Some(dir) = todo.pop() {
        for e in fs.readdir(&dir).await.ok()? {
            let p = format!("{}/{}", dir.trim_end_matches('/'), e.name);
            let a = fs.lstat(&p).await.ok()?;
            if a.kind == FileKind::Dir {
                dirs += 1;
                todo.push(p);
            } else if seen.insert(a.ino) {
                files += 1;
                bytes += a.size;
            }
        }
    }
    Some((files, dirs, bytes))
}
