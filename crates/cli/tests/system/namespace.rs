//! Namespace operations on real servers: shared directories, cross-server rename, links,
//! permissions, error numbers, and how many requests a small-file operation costs.

use futures::StreamExt;
use shoal_client::{Cred, Errno, FileKind, OpenFlags, RenameFlags};
use shoal_testkit::{work_requests, Cluster};
use std::collections::HashSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_files_from_four_clients_listed_exactly_once() {
    let cluster = Cluster::start(4);
    cluster.client().mkdir("/shared", 0o777).await.unwrap();
    let mut tasks = Vec::new();
    for c in 0..4u32 {
        let fs = cluster.client();
        tasks.push(tokio::spawn(async move {
            futures::stream::iter(0..2500u32)
                .map(|i| {
                    let fs = fs.clone();
                    async move {
                        fs.create_at(fs.resolve("/shared", true).await?.ino, &format!("c{c}-{i:05}"), 0o644, true, None)
                            .await
                    }
                })
                .buffer_unordered(16)
                .for_each(|r| async move {
                    r.unwrap();
                })
                .await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let entries = cluster.uncached_client().readdir("/shared").await.unwrap();
    assert_eq!(entries.len(), 10_000);
    let names: HashSet<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names.len(), 10_000, "no name listed twice");
    for c in 0..4 {
        for i in 0..2500 {
            assert!(names.contains(format!("c{c}-{i:05}").as_str()));
        }
    }
    assert!(entries.iter().all(|e| e.kind == FileKind::File));
}

/// Two directories whose objects live on different servers.
async fn dirs_on_different_servers(fs: &shoal_client::Client) -> (String, String) {
    let map = fs.map().clone();
    let a = fs.mkdir("/a", 0o755).await.unwrap();
    for i in 0..100 {
        let name = format!("/b{i}");
        let b = fs.mkdir(&name, 0o755).await.unwrap();
        if map.home_of(b.ino) != map.home_of(a.ino) {
            return ("/a".into(), name);
        }
    }
    panic!("no two directories on different servers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_across_directories_owned_by_different_servers() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    let (a, b) = dirs_on_different_servers(&fs).await;

    // A file with data.
    let f = fs.create(&format!("{a}/f"), 0o644, None).await.unwrap();
    f.write_at(0, b"payload").await.unwrap();
    f.close().await.unwrap();
    fs.rename(&format!("{a}/f"), &format!("{b}/g")).await.unwrap();

    let other = cluster.uncached_client();
    assert_eq!(other.stat(&format!("{a}/f")).await.unwrap_err().errno, Errno::ENOENT);
    let g = other.open(&format!("{b}/g"), OpenFlags::read_only()).await.unwrap();
    assert_eq!(&g.read_at(0, 100).await.unwrap()[..], b"payload");

    // Replacing an existing target drops the old file.
    let h = fs.create(&format!("{a}/h"), 0o644, None).await.unwrap();
    h.write_at(0, b"new").await.unwrap();
    h.close().await.unwrap();
    fs.rename(&format!("{a}/h"), &format!("{b}/g")).await.unwrap();
    let g = other.open(&format!("{b}/g"), OpenFlags::read_only()).await.unwrap();
    assert_eq!(&g.read_at(0, 100).await.unwrap()[..], b"new");

    // A directory with contents moves, and its parent link counts follow.
    fs.mkdir(&format!("{a}/sub"), 0o755).await.unwrap();
    fs.create(&format!("{a}/sub/inner"), 0o644, None).await.unwrap().close().await.unwrap();
    let a_before = other.stat(&a).await.unwrap().nlink;
    fs.rename(&format!("{a}/sub"), &format!("{b}/sub2")).await.unwrap();
    assert!(other.stat(&format!("{b}/sub2/inner")).await.is_ok());
    assert_eq!(other.stat(&a).await.unwrap().nlink, a_before - 1);
    assert_eq!(other.stat(&format!("{b}/sub2")).await.unwrap().parent, Some(other.stat(&b).await.unwrap().ino));

    // Into its own subtree: EINVAL. Onto a non-empty directory: ENOTEMPTY.
    assert_eq!(fs.rename(&b, &format!("{b}/sub2/loop")).await.unwrap_err().errno, Errno::EINVAL);
    fs.mkdir(&format!("{a}/full"), 0o755).await.unwrap();
    fs.create(&format!("{a}/full/x"), 0o644, None).await.unwrap().close().await.unwrap();
    assert_eq!(fs.rename(&format!("{b}/sub2"), &format!("{a}/full")).await.unwrap_err().errno, Errno::ENOTEMPTY);
    // NOREPLACE refuses an existing target.
    let flags = RenameFlags { noreplace: true, exchange: false };
    let (ad, bd) = (fs.stat(&a).await.unwrap().ino, fs.stat(&b).await.unwrap().ino);
    assert_eq!(fs.rename_at(bd, "g", ad, "full", flags).await.unwrap_err().errno, Errno::EEXIST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_symlinks_and_directories_behave_like_posix() {
    let cluster = Cluster::start(3);
    let fs = cluster.client();
    fs.mkdir_all("/d/e", 0o755).await.unwrap();
    let f = fs.create("/d/file", 0o640, None).await.unwrap();
    f.write_at(0, b"abc").await.unwrap();
    f.close().await.unwrap();

    fs.link("/d/file", "/d/e/hard").await.unwrap();
    assert_eq!(fs.stat("/d/file").await.unwrap().nlink, 2);
    fs.unlink("/d/file").await.unwrap();
    let hard = fs.stat("/d/e/hard").await.unwrap();
    assert_eq!((hard.nlink, hard.size), (1, 3));

    fs.symlink("../e/hard", "/d/e/sym").await.unwrap();
    assert_eq!(fs.readlink("/d/e/sym").await.unwrap(), "../e/hard");
    assert_eq!(fs.lstat("/d/e/sym").await.unwrap().kind, FileKind::Symlink);
    assert_eq!(fs.stat("/d/e/sym").await.unwrap().ino, hard.ino);

    assert_eq!(fs.rmdir("/d").await.unwrap_err().errno, Errno::ENOTEMPTY);
    assert_eq!(fs.mkdir("/d/e", 0o755).await.unwrap_err().errno, Errno::EEXIST);
    assert_eq!(fs.mkdir("/d/e/hard/x", 0o755).await.unwrap_err().errno, Errno::ENOTDIR);
    assert_eq!(fs.unlink("/d/e").await.unwrap_err().errno, Errno::EISDIR);
    assert_eq!(fs.rmdir("/d/e/hard").await.unwrap_err().errno, Errno::ENOTDIR);
    assert_eq!(fs.stat("/nope/x").await.unwrap_err().errno, Errno::ENOENT);
    let long = format!("/d/{}", "n".repeat(256));
    assert_eq!(fs.create(&long, 0o644, None).await.err().unwrap().errno, Errno::ENAMETOOLONG);
    assert_eq!(
        fs.open("/d/e/hard", OpenFlags { create: true, exclusive: true, write: true, ..Default::default() })
            .await
            .err()
            .unwrap()
            .errno,
        Errno::EEXIST
    );
    assert_eq!(fs.open("/d/e", OpenFlags::write_only()).await.err().unwrap().errno, Errno::EISDIR);

    // Readdir sees exactly what is there; removal empties the tree.
    let mut names: Vec<String> = fs.readdir("/d/e").await.unwrap().into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(names, ["hard", "sym"]);
    assert_eq!(fs.remove_all("/d").await.unwrap(), 4);
    assert_eq!(fs.stat("/d").await.unwrap_err().errno, Errno::ENOENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_denied_for_a_user_without_access() {
    let cluster = Cluster::start(2);
    let root = cluster.client();
    root.mkdir("/private", 0o700).await.unwrap();
    let f = root.create("/private/secret", 0o600, None).await.unwrap();
    f.write_at(0, b"s").await.unwrap();
    f.close().await.unwrap();
    root.mkdir("/public", 0o755).await.unwrap();
    root.create("/public/readonly", 0o644, None).await.unwrap().close().await.unwrap();

    let alice = cluster.uncached_client().with_cred(Cred { uid: 1000, gid: 1000, groups: vec![] });
    assert_eq!(alice.stat("/private/secret").await.unwrap_err().errno, Errno::EACCES);
    assert_eq!(alice.readdir("/private").await.unwrap_err().errno, Errno::EACCES);
    assert_eq!(alice.create("/public/mine", 0o644, None).await.err().unwrap().errno, Errno::EACCES);
    assert_eq!(alice.open("/public/readonly", OpenFlags::write_only()).await.err().unwrap().errno, Errno::EACCES);
    assert!(alice.open("/public/readonly", OpenFlags::read_only()).await.is_ok());
    assert_eq!(alice.chmod("/public/readonly", 0o777).await.unwrap_err().errno, Errno::EPERM);
    assert_eq!(alice.unlink("/public/readonly").await.unwrap_err().errno, Errno::EACCES);

    // Given a directory of her own, she can work in it, and root can read it.
    root.mkdir("/home", 0o755).await.unwrap();
    root.mkdir("/home/alice", 0o755).await.unwrap();
    root.chown("/home/alice", Some(1000), Some(1000)).await.unwrap();
    let f = alice.create("/home/alice/notes", 0o600, None).await.unwrap();
    f.write_at(0, b"hi").await.unwrap();
    f.close().await.unwrap();
    let a = root.stat("/home/alice/notes").await.unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (1000, 1000, 0o600));
    let bob = cluster.uncached_client().with_cred(Cred { uid: 1001, gid: 1001, groups: vec![] });
    assert_eq!(bob.open("/home/alice/notes", OpenFlags::read_only()).await.err().unwrap().errno, Errno::EACCES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_file_create_stat_unlink_are_one_request_to_one_server() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    fs.mkdir("/md", 0o755).await.unwrap();
    let dir = fs.stat("/md").await.unwrap().ino;
    let home = fs.map().home_of(dir).0 as usize;
    // Uncached client with the parent's inode number in hand, as mdtest's inner loop.
    let fs = cluster.uncached_client();
    for (op, expect_home) in [("create", true), ("stat", true), ("unlink", true)] {
        let before = work_requests(&fs).await;
        match op {
            "create" => {
                fs.create_at(dir, "f", 0o644, true, None).await.unwrap();
            }
            "stat" => {
                fs.lookup(dir, "f").await.unwrap();
            }
            _ => fs.unlink_at(dir, "f").await.unwrap(),
        }
        let after = work_requests(&fs).await;
        let diff: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(diff.iter().sum::<u64>(), 1, "{op}: requests per server {diff:?}");
        if expect_home {
            assert_eq!(diff[home], 1, "{op} went to the directory's server");
        }
    }
}

/// `create_many_at`, `lookup_many`, `unlink_many_at`: 2,500 names go in batch requests of at
/// most BATCH_MAX operations, one batch per server holding a partition of the directory (it
/// splits over all 4 servers as it grows); every name gets its own result in order, and the
/// result is what one call per name would have made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_creates_stats_and_unlinks_in_batch_requests() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    fs.mkdir("/many", 0o755).await.unwrap();
    let dir = fs.stat("/many").await.unwrap().ino;
    fs.create_at(dir, "f01000", 0o600, true, None).await.unwrap();
    let names: Vec<String> = (0..2500).map(|i| format!("f{i:05}")).collect();
    let fs = cluster.uncached_client();

    let count = |op: &'static str| {
        let fs = fs.clone();
        async move { shoal_testkit::op_count(&fs, op).await.iter().sum::<u64>() }
    };
    let (batches, creates, misrouted) = (count("batch").await, count("create").await, count("misrouted").await);
    let created = fs.create_many_at(dir, &names, 0o644, true).await.unwrap();
    // Each create ran once where its name's partition was, plus once more wherever a stale
    // view of the splitting directory first sent it (answered with the bitmap, not run).
    let resent = count("misrouted").await - misrouted;
    assert_eq!(count("create").await - creates, 2500 + resent, "creates run");
    assert!(resent < 2500, "most creates went to the right server at once ({resent} resent)");
    let sent = count("batch").await - batches;
    assert!((3..=3 * 4 + 8).contains(&sent), "{sent} batch requests for 2,500 creates");
    // The directory split over all four servers.
    let listed = fs.readdir_at(dir).await.unwrap();
    let partitions: u32 = fs.dir_bitmap(dir).iter().map(|w| w.count_ones()).sum();
    assert_eq!(partitions, 4, "2,500 entries on 4 servers: 4 partitions");
    assert_eq!(listed.len(), 2500);
    assert_eq!(created.len(), 2500);
    for (i, r) in created.iter().enumerate() {
        if i == 1000 {
            assert_eq!(r.as_ref().unwrap_err().errno, shoal_client::Errno::EEXIST, "the name that existed");
        } else {
            let a = r.as_ref().unwrap();
            assert_eq!((a.size, a.perm), (0, 0o644), "{}", names[i]);
        }
    }
    let found = fs.lookup_many(dir, &names).await.unwrap();
    for (i, r) in found.iter().enumerate() {
        let a = r.as_ref().unwrap();
        let want = if i == 1000 { 0o600 } else { 0o644 };
        assert_eq!(a.perm, want, "{}", names[i]);
        if i != 1000 {
            assert_eq!(a.ino, created[i].as_ref().unwrap().ino);
        }
    }
    let mut with_missing = names[..10].to_vec();
    with_missing.push("nope".into());
    let r = fs.lookup_many(dir, &with_missing).await.unwrap();
    assert!(r[..10].iter().all(|r| r.is_ok()));
    assert_eq!(r[10].as_ref().unwrap_err().errno, shoal_client::Errno::ENOENT);

    let removed = fs.unlink_many_at(dir, &names).await.unwrap();
    assert!(removed.iter().all(|r| r.is_ok()), "{:?}", removed.iter().find(|r| r.is_err()));
    assert!(fs.readdir_at(dir).await.unwrap().is_empty());
    let again = fs.unlink_many_at(dir, &names[..5]).await.unwrap();
    assert!(again.iter().all(|r| r.as_ref().unwrap_err().errno == shoal_client::Errno::ENOENT));
    // An empty batch is no request at all.
    assert!(fs.create_many_at(dir, &[], 0o644, true).await.unwrap().is_empty());
}

/// Deleting files deletes their data objects on every server, in batches: one
/// `PeerDeleteObjects` per server for many files, not one per file and server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlinked_files_lose_their_objects_everywhere_in_batches() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    fs.mkdir("/gc", 0o755).await.unwrap();
    let files = 200usize;
    // 4 KiB stripes over all servers and 16 KiB per file: one object on each server.
    let layout =
        shoal_client::LayoutSpec { stripe_size: Some(4096), stripe_count: Some(u32::MAX), ..Default::default() };
    futures::stream::iter(0..files)
        .map(|i| {
            let (fs, layout) = (fs.clone(), layout.clone());
            async move {
                let f = fs.create(&format!("/gc/f{i}"), 0o644, Some(layout)).await.unwrap();
                f.write_at(0, &[7u8; 16384]).await.unwrap();
                f.close().await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let objects = |fs: shoal_client::Client| async move {
        let mut n = Vec::new();
        for (_, st) in fs.status_all().await {
            n.push(st.unwrap().data_objects);
        }
        n
    };
    let before = shoal_testkit::op_count(&fs, "peer_delete_objects").await.iter().sum::<u64>();
    futures::stream::iter(0..files)
        .map(|i| {
            let fs = fs.clone();
            async move { fs.unlink(&format!("/gc/f{i}")).await.unwrap() }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    // The objects go in the background; the servers count them at most every few seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left = objects(fs.clone()).await;
        if left.iter().all(|&n| n == 0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "objects left on the servers: {left:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let sent = shoal_testkit::op_count(&fs, "peer_delete_objects").await.iter().sum::<u64>() - before;
    // One per file and remote server would be 3 x 200 = 600.
    assert!(sent > 0 && sent < (3 * files as u64) / 2, "{sent} PeerDeleteObjects requests for {files} files");
}

/// Consecutive subdirectories (the per-rank directories of a job) go to different servers,
/// so that work in them spreads over the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consecutive_directories_are_spread_over_the_servers() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    fs.mkdir("/job", 0o755).await.unwrap();
    let mut homes = HashSet::new();
    for rank in 0..4 {
        let path = format!("/job/rank{rank}");
        fs.mkdir(&path, 0o755).await.unwrap();
        homes.insert(fs.map().home_of(fs.stat(&path).await.unwrap().ino));
    }
    assert_eq!(homes.len(), 4, "4 directories made one after the other landed on {homes:?}");
}

/// Tasks of one client making the same new directories at once (`mkdir -p` from many
/// threads, as Dask and zarr writers do) all find them afterwards: the client's cache and
/// leases never keep "no such name" for a directory that exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_client_making_the_same_directories_from_many_tasks_finds_them_all() {
    let cluster = Cluster::start(3);
    let fs = cluster.client();
    for round in 0..20 {
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let fs = fs.clone();
                tokio::spawn(async move {
                    let dir = format!("/r{round}/c/{i}");
                    fs.mkdir_all(&dir, 0o755).await.map_err(|e| format!("{dir}: {e}"))?;
                    for j in 0..4 {
                        let path = format!("{dir}/{j}");
                        let f = fs.create(&path, 0o644, None).await.map_err(|e| format!("{path}: {e}"))?;
                        f.close().await.map_err(|e| format!("{path}: {e}"))?;
                    }
                    fs.stat(&format!("/r{round}/c")).await.map_err(|e| format!("stat: {e}"))?;
                    Ok::<(), String>(())
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        assert_eq!(fs.readdir(&format!("/r{round}/c")).await.unwrap().len(), 8);
    }
}
