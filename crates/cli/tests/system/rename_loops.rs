//! Concurrent renames that would form a loop through different servers are refused.
//!
//! Each round moves `P/A<i>` (P on server 0) to `Q/B<i>/b/ax` and, at the same moment from
//! another client, `Q/B<i>` (Q on server 1) to `P/A<i>/a/bx`. Whichever comes second would
//! move a directory under its own descendant and must fail with EINVAL, as rename(2) does;
//! both succeeding would leave `A<i>` and `B<i>` inside each other, cut off from the root.
//! Afterwards every directory made must still be reachable from the root exactly once,
//! with parent pointers matching the walk.

use shoal_client::{Client, Errno, FileKind, Ino, RenameFlags, ServerId, ROOT_INO};
use shoal_testkit::Cluster;
use std::collections::BTreeMap;

const ROUNDS: usize = 40;

async fn dir_on(c: &Cluster, fs: &Client, server: ServerId, prefix: &str) -> Ino {
    for i in 0..64 {
        let a = fs.mkdir_at(ROOT_INO, &format!("{prefix}-{i}"), 0o755).await.unwrap();
        if c.map.home_of(a.ino) == server {
            return a.ino;
        }
    }
    panic!("no directory landed on server {server}");
}

/// Every directory reachable from the root: inode → (parent by the walk, times reached).
async fn walk(fs: &Client) -> BTreeMap<Ino, (Ino, u32)> {
    let mut seen: BTreeMap<Ino, (Ino, u32)> = BTreeMap::new();
    let mut todo = vec![ROOT_INO];
    while let Some(dir) = todo.pop() {
        assert!(seen.len() < 100_000, "the tree does not end");
        for e in fs.readdir_at(dir).await.unwrap() {
            if e.kind != FileKind::Dir {
                continue;
            }
            let entry = seen.entry(e.ino).or_insert((dir, 0));
            entry.1 += 1;
            if entry.1 == 1 {
                todo.push(e.ino);
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_renames_that_would_form_a_loop_through_two_servers_are_refused() {
    let c = Cluster::start(3);
    let fs = c.uncached_client();
    let (one, two) = (c.uncached_client(), c.uncached_client());
    let p = dir_on(&c, &fs, ServerId(0), "p").await;
    let q = dir_on(&c, &fs, ServerId(1), "q").await;
    let mut made = Vec::new();
    let mut refused = 0;
    for i in 0..ROUNDS {
        let a = fs.mkdir_at(p, &format!("A{i}"), 0o755).await.unwrap();
        let aa = fs.mkdir_at(a.ino, "a", 0o755).await.unwrap();
        let b = fs.mkdir_at(q, &format!("B{i}"), 0o755).await.unwrap();
        let bb = fs.mkdir_at(b.ino, "b", 0o755).await.unwrap();
        made.extend([a.ino, aa.ino, b.ino, bb.ino]);
        let (an, bn) = (format!("A{i}"), format!("B{i}"));
        let (r1, r2) = tokio::join!(
            one.rename_at(p, &an, bb.ino, "ax", RenameFlags::default()),
            two.rename_at(q, &bn, aa.ino, "bx", RenameFlags::default()),
        );
        for r in [&r1, &r2] {
            if let Err(e) = r {
                assert_eq!(e.errno, Errno::EINVAL, "round {i}: {e}");
                refused += 1;
            }
        }
        assert!(r1.is_err() || r2.is_err(), "round {i}: both renames succeeded: a loop");
    }
    assert!(refused >= ROUNDS, "every round refuses one of its renames");
    let tree = walk(&fs).await;
    for ino in made {
        let (parent, times) =
            tree.get(&ino).copied().unwrap_or_else(|| panic!("directory {ino} cut off from the root"));
        assert_eq!(times, 1, "directory {ino} reached {times} times");
        let attr = fs.getattr_fresh(ino).await.unwrap();
        assert_eq!(attr.parent, Some(parent), "parent pointer of {ino}");
    }
}
