//! During a cross-server rename no other client sees both names or neither.
//!
//! What is checked, precisely: one client renames `src/a<i>` (directory on server A) to
//! `dst/b<i>` (directory on server B), for many `i`, one after the other; a second client
//! (no cache) meanwhile observes the rename in flight over and over — lookup of `b<i>`,
//! lookup of `a<i>`, listing of `dst`, listing of `src` — recording each answer in the
//! order it got them. A rename moves the file from "a present, b absent" to "a absent,
//! b present" once, so in that order of answers:
//! * after any answer "b present" no answer "a present" may follow (that would be both), and
//! * after any answer "a absent" no answer "b absent" may follow (that would be neither).

use shoal_client::{Client, Errno, Ino, RenameFlags, ServerId, ROOT_INO};
use shoal_testkit::Cluster;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

const RENAMES: usize = 300;

async fn dir_on(c: &Cluster, fs: &Client, server: ServerId, prefix: &str) -> Ino {
    for i in 0..64 {
        let a = fs.mkdir_at(ROOT_INO, &format!("{prefix}-{i}"), 0o755).await.unwrap();
        if c.map.home_of(a.ino) == server {
            return a.ino;
        }
    }
    panic!("no directory landed on server {server}");
}

async fn present(fs: &Client, dir: Ino, name: &str) -> bool {
    match fs.lookup(dir, name).await {
        Ok(_) => true,
        Err(e) if e.errno == Errno::ENOENT => false,
        Err(e) => panic!("lookup {name:?} in {dir} during renames: {e}"),
    }
}

async fn listed(fs: &Client, dir: Ino, name: &str) -> bool {
    fs.readdir_at(dir)
        .await
        .unwrap_or_else(|e| panic!("listing {dir} during renames: {e}"))
        .iter()
        .any(|e| e.name == name)
}

#[derive(Clone, Copy, Debug)]
enum Seen {
    /// Did the source name `a<i>` resolve (lookup or listing)?
    Source(bool),
    /// Did the destination name `b<i>` resolve?
    Target(bool),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrent_reader_never_sees_both_names_or_neither_during_cross_server_renames() {
    let c = Cluster::start(2);
    let fs = c.uncached_client();
    let reader = c.uncached_client();
    let src = dir_on(&c, &fs, ServerId(0), "src").await;
    let dst = dir_on(&c, &fs, ServerId(1), "dst").await;
    for i in 0..RENAMES {
        fs.create_at(src, &format!("a{i}"), 0o644, true, None).await.unwrap();
    }

    let current = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    // Answers the reader has recorded so far. The renamer never runs more than a few
    // renames ahead of the reader, so that however the two are scheduled, every rename is
    // watched (the reader keeps asking while the renamer waits and while it renames).
    let answers = Arc::new(AtomicUsize::new(0));
    let (cur, fin, f2, heard) = (current.clone(), done.clone(), fs.clone(), answers.clone());
    let renamer = tokio::spawn(async move {
        for i in 0..RENAMES {
            cur.store(i, Ordering::SeqCst);
            f2.rename_at(src, &format!("a{i}"), dst, &format!("b{i}"), RenameFlags::default()).await.unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while heard.load(Ordering::SeqCst) < 2 * (i + 1) && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        fin.store(true, Ordering::SeqCst);
    });

    // (rename index, what was seen), in the order the reader got the answers.
    let mut seen: Vec<(usize, Seen)> = Vec::new();
    let mut round = 0u64;
    while !done.load(Ordering::SeqCst) {
        let i = current.load(Ordering::SeqCst);
        let (a, b) = (format!("a{i}"), format!("b{i}"));
        seen.push((i, Seen::Target(present(&reader, dst, &b).await)));
        seen.push((i, Seen::Source(present(&reader, src, &a).await)));
        if round.is_multiple_of(4) {
            seen.push((i, Seen::Target(listed(&reader, dst, &b).await)));
            seen.push((i, Seen::Source(listed(&reader, src, &a).await)));
        }
        round += 1;
        answers.store(seen.len(), Ordering::SeqCst);
    }
    renamer.await.unwrap();

    let mut violations = Vec::new();
    for i in 0..RENAMES {
        let mut target_seen = false;
        let mut source_gone = false;
        for (_, s) in seen.iter().filter(|(j, _)| *j == i) {
            match *s {
                Seen::Target(true) => target_seen = true,
                Seen::Source(false) => source_gone = true,
                Seen::Source(true) if target_seen => violations.push(format!("rename {i}: both names")),
                Seen::Target(false) if source_gone => violations.push(format!("rename {i}: neither name")),
                _ => {}
            }
        }
    }
    assert!(seen.len() >= RENAMES, "the reader observed too little ({} answers) to tell", seen.len());
    assert!(violations.is_empty(), "{} violations in {} answers: {:?}", violations.len(), seen.len(), violations);
}
