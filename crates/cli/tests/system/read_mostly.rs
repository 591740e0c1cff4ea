//! Read-mostly files and directories (docs/loading.md): the mark, its inheritance and who
//! may set it; a library search over a read-mostly tree answered from one listing per
//! directory, counted by the servers; and a change to a read-mostly file seen by the
//! next open on another mount.

use shoal_client::{Client, Cred, Errno};
use shoal_testkit::mount::{skip_without_fuse, Mount};
use shoal_testkit::Cluster;
use std::collections::BTreeMap;
use std::time::Duration;

/// Long leases, so that none runs out while a test counts requests (the server's longest
/// lease is 5 s by default).
const LEASE_ARGS: &[&str] = &["--lease-max-ms", "120000"];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn namespace_requests(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    ["lookup", "readdir", "batch"].iter().map(|op| after.get(*op).unwrap_or(&0) - before.get(*op).unwrap_or(&0)).sum()
}

#[test]
fn the_mark_is_kept_inherited_and_set_by_the_owner_only() {
    let mut c = Cluster::start(2);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        fs.mkdir("/lib", 0o755).await.unwrap();
        fs.mkdir("/other", 0o755).await.unwrap();
        assert!(!fs.stat("/lib").await.unwrap().read_mostly);
        assert!(fs.set_read_mostly("/lib", true).await.unwrap().read_mostly);
        fs.mkdir("/lib/sub", 0o755).await.unwrap();
        fs.create("/lib/sub/libx.so", 0o644, None).await.unwrap().close().await.unwrap();
        fs.symlink("libx.so", "/lib/sub/libx.so.1").await.unwrap();
        fs.create("/other/f", 0o644, None).await.unwrap().close().await.unwrap();
    });
    let fresh = c.uncached_client();
    rt.block_on(async {
        for p in ["/lib", "/lib/sub", "/lib/sub/libx.so"] {
            assert!(fresh.stat(p).await.unwrap().read_mostly, "{p} inherits the mark");
        }
        assert!(fresh.lstat("/lib/sub/libx.so.1").await.unwrap().read_mostly);
        assert!(!fresh.stat("/other/f").await.unwrap().read_mostly);
        // Someone else's directory: EPERM, and the mark stays.
        let alice = c.uncached_client().with_cred(Cred { uid: 1000, gid: 1000, groups: vec![] });
        let e = alice.set_read_mostly("/lib", false).await.unwrap_err();
        assert_eq!(e.errno, Errno::EPERM, "{e}");
        assert!(fresh.stat("/lib").await.unwrap().read_mostly);
    });
    // Kept across a kill -9 of every server.
    for id in 0..2 {
        c.kill9(id);
        c.restart(id);
    }
    let after = c.uncached_client();
    rt.block_on(async {
        assert!(after.stat("/lib/sub/libx.so").await.unwrap().read_mostly);
    });

    // The CLI: clear the tree with -r, show it, set one path back.
    let (code, out, err) = c.shoal(&["readmostly", "-r", "--off", "--json", "/lib"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 4, "{out}");
    assert!(out.lines().all(|l| l.contains("\"read_mostly\":false")), "{out}");
    let (code, out, _) = c.shoal(&["readmostly", "--show", "/lib/sub/libx.so"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "/lib/sub/libx.so: not read-mostly");
    let (code, out, _) = c.shoal(&["readmostly", "/lib"]);
    assert_eq!((code, out.trim()), (0, "/lib: read-mostly"));
    let (code, out, _) = c.shoal(&["getstripe", "/lib"]);
    assert_eq!(code, 0);
    assert!(out.contains("read_mostly:  yes"), "{out}");
    let (code, _, err) = c.shoal(&["readmostly", "/nowhere"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("shoal: cannot access /nowhere") && err.lines().count() == 1, "{err}");
}

/// The loader's way of finding `names`: try `dir/name` for each directory in order until
/// one exists. Returns where each was found.
async fn search(fs: &Client, dirs: &[String], names: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for n in names {
        for d in dirs {
            let p = format!("{d}/{n}");
            match fs.stat(&p).await {
                Ok(_) => {
                    found.push(p);
                    break;
                }
                Err(e) => assert_eq!(e.errno, Errno::ENOENT, "{p}: {e}"),
            }
        }
    }
    found
}

#[test]
fn a_search_over_a_read_mostly_path_costs_one_listing_per_directory() {
    const DIRS: usize = 20;
    const LIBS: usize = 30;
    let c = Cluster::start_with_server_args(2, LEASE_ARGS);
    let rt = rt();
    let setup = c.client();
    let tree = |root: &str| -> (Vec<String>, Vec<String>) {
        let dirs = (0..DIRS).map(|i| format!("/{root}/d{i:02}")).collect::<Vec<_>>();
        let names = (0..LIBS).map(|i| format!("lib{i}.so")).collect::<Vec<_>>();
        (dirs, names)
    };
    for root in ["plain", "marked"] {
        let (dirs, names) = tree(root);
        rt.block_on(async {
            setup.mkdir(&format!("/{root}"), 0o755).await.unwrap();
            if root == "marked" {
                setup.set_read_mostly("/marked", true).await.unwrap();
            }
            for d in &dirs {
                setup.mkdir(d, 0o755).await.unwrap();
            }
            // The libraries are spread over the last half of the path.
            for (i, n) in names.iter().enumerate() {
                let d = &dirs[DIRS / 2 + i % (DIRS / 2)];
                setup.create(&format!("{d}/{n}"), 0o644, None).await.unwrap().close().await.unwrap();
            }
        });
    }
    let long = shoal_client::ClientOptions { dir_lease: Duration::from_secs(60), ..c.options() };
    let mut cost = BTreeMap::new();
    for root in ["plain", "marked"] {
        let (dirs, names) = tree(root);
        let fs = Client::from_config(&c.config, long.clone()).unwrap();
        let before = c.ops();
        let found = rt.block_on(search(&fs, &dirs, &names));
        assert_eq!(found.len(), LIBS);
        let first = namespace_requests(&before, &c.ops());
        let before = c.ops();
        rt.block_on(search(&fs, &dirs, &names));
        let again = namespace_requests(&before, &c.ops());
        cost.insert(root, (first, again));
    }
    let (plain, marked) = (cost["plain"], cost["marked"]);
    // Marked: one listing of each directory (and of the roots on the way), nothing more.
    assert!(marked.0 <= DIRS as u64 + 4, "{cost:?}");
    // Plain: a look-up of a name, then the listing, in each directory.
    assert!(plain.0 >= marked.0 + DIRS as u64 / 2, "{cost:?}");
    // Once the listings are cached, the search costs no request.
    assert_eq!(marked.1, 0, "{cost:?}");
}

#[test]
fn a_change_to_a_read_mostly_file_is_seen_by_the_next_open_on_another_mount() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start_with_server_args(2, LEASE_ARGS);
    let (a, b) = (Mount::new(&c, &["dir_lease=60"]), Mount::new(&c, &["dir_lease=60"]));
    std::fs::create_dir(a.p("lib")).unwrap();
    let (code, _, err) = c.shoal(&["readmostly", "/lib"]);
    assert_eq!(code, 0, "{err}");
    std::fs::write(a.p("lib/libm.so"), b"version 1").unwrap();
    assert_eq!(std::fs::read(b.p("lib/libm.so")).unwrap(), b"version 1");
    // B now holds the listing: a missing name is answered from it; and its kernel keeps
    // the listing of the read-mostly directory from one opendir to the next.
    assert!(!b.p("lib/libn.so").exists());
    let names = |m: &Mount| {
        let mut v: Vec<String> =
            std::fs::read_dir(m.p("lib")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&b), ["libm.so"]);
    assert_eq!(names(&b), ["libm.so"]);
    // Rewritten in place (same size) and a new file made, through A.
    std::fs::write(a.p("lib/libm.so"), b"version 2").unwrap();
    std::fs::write(a.p("lib/libn.so"), b"new").unwrap();
    assert_eq!(std::fs::read(b.p("lib/libm.so")).unwrap(), b"version 2", "close-to-open");
    assert_eq!(std::fs::read(b.p("lib/libn.so")).unwrap(), b"new", "the listing's lease was revoked");
    // The next listing on B shows the new name (the directory changed: its cache is dropped
    // at opendir), and one removed through A is gone from the one after.
    assert_eq!(names(&b), ["libm.so", "libn.so"]);
    std::fs::remove_file(a.p("lib/libm.so")).unwrap();
    assert_eq!(names(&b), ["libn.so"]);
}
