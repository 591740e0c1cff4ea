//! `shoal find` (docs/find.md): metadata queries answered by every server over the entries
//! it holds, against a known tree on real servers: every test, empty answers, paging,
//! depth limits, what a user who may not read part of the tree sees, and bad input.

use shoal_client::{Client, Cmp, Cred, FileKind, FindOptions, FindQuery, LayoutSpec, SizeTest, TimeSet, Timestamp};
use shoal_testkit::mount::skip_without_fuse;
use shoal_testkit::Cluster;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

const MIB: u64 = 1 << 20;
const DAY: i64 = 86_400;

/// The tree every query below runs against (3 servers: directories, split partitions and
/// inodes spread over them).
async fn build(fs: &Client) {
    for d in ["/t", "/t/d1", "/t/d1/d2", "/t/many", "/t/rm", "/elsewhere"] {
        fs.mkdir(d, 0o755).await.unwrap();
    }
    // Marked before it is filled: what is made in it inherits the mark.
    fs.set_read_mostly("/t/rm", true).await.unwrap();
    for (path, perm, size) in [
        ("/t/a.h5", 0o644, 0),
        ("/t/big.H5", 0o600, 2 * MIB + 1),
        ("/t/d1/c.txt", 0o640, 10),
        ("/t/d1/d2/deep.h5", 0o755, 100),
        ("/t/old.log", 0o644, 1),
        ("/t/rm/lib.so", 0o644, 1),
        ("/elsewhere/x.h5", 0o644, 1),
    ] {
        file(fs, path, perm, size).await;
    }
    let striped = LayoutSpec { stripe_count: Some(2), stripe_size: Some(MIB), ..Default::default() };
    fs.create("/t/striped.dat", 0o644, Some(striped)).await.unwrap().close().await.unwrap();
    for i in 0..40 {
        file(fs, &format!("/t/many/f{i:02}"), 0o644, 0).await;
    }
    fs.symlink("a.h5", "/t/d1/link").await.unwrap();
    fs.link("/t/a.h5", "/t/d1/hard.h5").await.unwrap();
    fs.chown("/t/d1/c.txt", Some(1000), Some(1000)).await.unwrap();
    let deep = fs.stat("/t/d1/d2/deep.h5").await.unwrap();
    fs.setxattr(deep.ino, "user.tag", b"hot", false, false).await.unwrap();
    let old = Timestamp { secs: Timestamp::now().secs - 40 * DAY, nsecs: 0 };
    fs.utimens("/t/old.log", Some(TimeSet::At(old)), Some(TimeSet::At(old))).await.unwrap();
}

async fn file(fs: &Client, path: &str, perm: u32, size: u64) {
    let f = fs.create(path, perm, None).await.unwrap();
    if size > 0 {
        f.write_at(0, &vec![7u8; size as usize]).await.unwrap();
    }
    f.close().await.unwrap();
}

async fn paths(fs: &Client, root: &str, q: FindQuery, opts: FindOptions) -> Vec<String> {
    let (found, stats) = fs.find(root, &q, opts).await.unwrap();
    assert_eq!(stats.servers, 3);
    found.into_iter().map(|f| f.path).collect()
}

fn many() -> Vec<String> {
    (0..40).map(|i| format!("/t/many/f{i:02}")).collect()
}

#[test]
fn every_test_against_a_known_tree() {
    let c = Cluster::start(3);
    let rt = rt();
    let fs = c.client();
    rt.block_on(build(&fs));
    rt.block_on(async {
        let all = |q| paths(&fs, "/t", q, FindOptions::default());
        let mut everything = vec![
            "/t",
            "/t/a.h5",
            "/t/big.H5",
            "/t/d1",
            "/t/d1/c.txt",
            "/t/d1/d2",
            "/t/d1/d2/deep.h5",
            "/t/d1/hard.h5",
            "/t/d1/link",
            "/t/many",
            "/t/old.log",
            "/t/rm",
            "/t/rm/lib.so",
            "/t/striped.dat",
        ]
        .into_iter()
        .map(String::from)
        .chain(many())
        .collect::<Vec<_>>();
        everything.sort();
        assert_eq!(all(FindQuery::default()).await, everything, "no test: the whole tree, sorted");
        let name = |p: &str| FindQuery { name: Some(p.into()), ..Default::default() };
        assert_eq!(all(name("*.h5")).await, ["/t/a.h5", "/t/d1/d2/deep.h5", "/t/d1/hard.h5"]);
        let iname = FindQuery { name: Some("*.h5".into()), ignore_case: true, ..Default::default() };
        assert_eq!(all(iname).await, ["/t/a.h5", "/t/big.H5", "/t/d1/d2/deep.h5", "/t/d1/hard.h5"]);
        let kind = |k| FindQuery { kind: Some(k), ..Default::default() };
        assert_eq!(all(kind(FileKind::Dir)).await, ["/t", "/t/d1", "/t/d1/d2", "/t/many", "/t/rm"]);
        assert_eq!(all(kind(FileKind::Symlink)).await, ["/t/d1/link"]);
        let size = |cmp, n, unit| FindQuery {
            size: Some(SizeTest { cmp, n, unit }),
            kind: Some(FileKind::File),
            ..Default::default()
        };
        assert_eq!(all(size(Cmp::More, 2, MIB)).await, ["/t/big.H5"], "over 2 MiB, rounded up");
        assert_eq!(all(size(Cmp::Equal, 100, 1)).await, ["/t/d1/d2/deep.h5"]);
        let empty = all(size(Cmp::Less, 1, MIB)).await;
        assert_eq!(empty.len(), 40 + 3, "-1M: the empty files only: {empty:?}");
        let age = |cmp, n| FindQuery {
            ages: vec![shoal_client::AgeTest {
                field: shoal_client::TimeField::Modify,
                cmp,
                n,
                period: DAY as u64,
                now: Timestamp::now().secs,
            }],
            ..Default::default()
        };
        assert_eq!(all(age(Cmp::More, 30)).await, ["/t/old.log"]);
        assert_eq!(all(age(Cmp::Less, 1)).await.len(), everything.len() - 1);
        let owner = FindQuery { uid: Some(1000), gid: Some(1000), ..Default::default() };
        assert_eq!(all(owner).await, ["/t/d1/c.txt"]);
        let perm = |t| FindQuery { perm: Some(t), kind: Some(FileKind::File), ..Default::default() };
        assert_eq!(all(perm(shoal_client::PermTest::Exact(0o600))).await, ["/t/big.H5"]);
        assert_eq!(all(perm(shoal_client::PermTest::Any(0o111))).await, ["/t/d1/d2/deep.h5"]);
        // 0o640 and more: every file but big.H5 (0o600), as 47 paths (a.h5 twice, hard link).
        assert_eq!(all(perm(shoal_client::PermTest::All(0o640))).await.len(), 47);
        let striped = FindQuery { stripe_count: Some(2), stripe_size: Some(MIB), ..Default::default() };
        assert_eq!(all(striped).await, ["/t/striped.dat"]);
        let xattr = |v: Option<&[u8]>| FindQuery {
            xattr: Some("user.tag".into()),
            xattr_value: v.map(|v| v.to_vec()),
            ..Default::default()
        };
        assert_eq!(all(xattr(None)).await, ["/t/d1/d2/deep.h5"]);
        assert_eq!(all(xattr(Some(b"hot"))).await, ["/t/d1/d2/deep.h5"]);
        assert!(all(xattr(Some(b"cold"))).await.is_empty());
        let marked = FindQuery { read_mostly: Some(true), ..Default::default() };
        assert_eq!(all(marked).await, ["/t/rm", "/t/rm/lib.so"], "the mark is inherited");
        // Several tests at once: all must hold.
        let both = FindQuery {
            name: Some("f1*".into()),
            size: Some(SizeTest { cmp: Cmp::Equal, n: 0, unit: 1 }),
            ..Default::default()
        };
        assert_eq!(all(both).await.len(), 10);
        // Nothing matches: an empty answer.
        assert!(all(name("*.nothing")).await.is_empty());
        // Depth limits: PATH is depth 0.
        let depth = |min, max| {
            paths(&fs, "/t/d1", FindQuery::default(), FindOptions { min_depth: min, max_depth: max, page: 0 })
        };
        assert_eq!(depth(0, Some(0)).await, ["/t/d1"]);
        assert_eq!(depth(1, Some(1)).await, ["/t/d1/c.txt", "/t/d1/d2", "/t/d1/hard.h5", "/t/d1/link"]);
        assert_eq!(depth(2, None).await, ["/t/d1/d2/deep.h5"]);
        // Another part of the tree is not reported, even where names match.
        assert_eq!(paths(&fs, "/", name("x.h5"), FindOptions::default()).await, ["/elsewhere/x.h5"]);
        assert!(all(name("x.h5")).await.is_empty());
        // Paging: 3 matches per request give the same answer as one page.
        let small = FindOptions { page: 3, ..Default::default() };
        let (paged, stats) = fs.find("/t", &FindQuery::default(), small).await.unwrap();
        assert_eq!(paged.into_iter().map(|f| f.path).collect::<Vec<_>>(), everything);
        assert!(stats.requests >= 54 / 3, "a page of 3 at most per request: {stats:?}");
    });
    // The CLI: lines, --count, --json, find-style flags.
    let (code, out, err) = c.shoal(&["find", "/t", "--name", "*.h5", "--type", "f"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["/t/a.h5", "/t/d1/d2/deep.h5", "/t/d1/hard.h5"]);
    let (code, out, _) = c.shoal(&["find", "shoal://t", "--size", "-1M", "--type", "f", "--count"]);
    assert_eq!((code, out.trim()), (0, "43"));
    let (code, out, _) = c.shoal(&["find", "/t", "--mtime", "+30", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["path"].as_str(), v["type"].as_str(), v["size"].as_u64()), (Some("/t/old.log"), Some("f"), Some(1)));
    let (code, out, _) = c.shoal(&["find", "/t", "--perm", "-600", "--user", "0", "--xattr", "user.tag=hot"]);
    assert_eq!((code, out.trim()), (0, "/t/d1/d2/deep.h5"));
    let (code, out, _) = c.shoal(&["find", "/t", "--name", "*.nothing"]);
    assert_eq!((code, out.as_str()), (0, ""), "nothing found is not a failure");
    // Bad input: usage errors (2) name the flag; a missing path fails (1) naming it.
    for (args, says) in [
        (&["find", "/t", "--name", "[x"][..], "name pattern"),
        (&["find", "/t", "--size", "big"], "--size big"),
        (&["find", "/t", "--perm", "999"], "--perm 999"),
        (&["find", "/t", "--type", "q"], "f (file)"),
        (&["find", "/t", "--user", "no-such-user-here"], "no such user"),
    ] {
        let (code, _, err) = c.shoal(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (code, _, err) = c.shoal(&["find", "/missing"]);
    assert_eq!(code, 1);
    assert!(err.contains("/missing") && err.contains("No such file"), "{err}");
}

/// A user sees what find run as them would print: nothing below a directory they may not
/// read and search, and nothing reached only through one.
#[test]
fn a_user_sees_only_what_they_may_see() {
    let c = Cluster::start(3);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        for (d, perm) in
            [("/s", 0o755), ("/s/open", 0o755), ("/s/closed", 0o700), ("/s/closed/sub", 0o755), ("/s/noread", 0o711)]
        {
            fs.mkdir(d, perm).await.unwrap();
            fs.chmod(d, perm).await.unwrap();
        }
        for f in ["/s/open/f1", "/s/closed/f2", "/s/closed/sub/f3", "/s/noread/f4"] {
            fs.create(f, 0o644, None).await.unwrap().close().await.unwrap();
        }
        let alice = c.uncached_client().with_cred(Cred { uid: 1000, gid: 1000, groups: vec![] });
        let seen = paths(&alice, "/s", FindQuery::default(), FindOptions::default()).await;
        assert_eq!(seen, ["/s", "/s/closed", "/s/noread", "/s/open", "/s/open/f1"]);
        let f = FindQuery { name: Some("f*".into()), ..Default::default() };
        assert_eq!(paths(&alice, "/s", f.clone(), FindOptions::default()).await, ["/s/open/f1"]);
        // Root sees everything.
        assert_eq!(
            paths(&fs, "/s", f, FindOptions::default()).await,
            ["/s/closed/f2", "/s/closed/sub/f3", "/s/noread/f4", "/s/open/f1"]
        );
        // Once allowed, alice sees it.
        fs.chown("/s/closed", Some(1000), Some(1000)).await.unwrap();
        let seen = paths(&alice, "/s/closed", FindQuery::default(), FindOptions::default()).await;
        assert_eq!(seen, ["/s/closed", "/s/closed/f2", "/s/closed/sub", "/s/closed/sub/f3"]);
    });
}

/// `shoal bench find`: every case runs and finds the same paths, and every du case counts
/// the same inodes (it fails otherwise).
#[test]
fn bench_find_compares_shoal_find_with_find_on_the_mount() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let args = ["bench", "find", "--files", "300", "--per-dir", "100", "--runs", "1", "--json", "-q"];
    let (code, out, err) = c.shoal(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    let cases = r["cases"].as_array().unwrap();
    let names: Vec<&str> = cases.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert!(names.starts_with(&["shoal find", "find, FUSE mount", "find, local directory"]), "{names:?}");
    // Names ending in 7: 30 files (and no directory: d000, e000..e002).
    assert!(cases.iter().filter(|c| c["query"] == "find").all(|c| c["found"] == 30), "{r}");
    assert!(r["shoal_vs_fuse"].as_f64().unwrap() > 0.0);
    // du: the tree, d000, e000..e002 and 300 files, counted alike by every case.
    let du: Vec<&serde_json::Value> = cases.iter().filter(|c| c["query"] == "du").collect();
    let du_names: Vec<&str> = du.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert!(du_names.starts_with(&["shoal du", "du, FUSE mount", "du, local directory"]), "{du_names:?}");
    assert!(du.iter().all(|c| c["found"] == 305), "{r}");
    assert!(r["du_vs_fuse"].as_f64().unwrap() > 0.0);
    let (code, _, err) = c.shoal(&["bench", "find", "--files", "0"]);
    assert_eq!(code, 2, "{err}");
}
