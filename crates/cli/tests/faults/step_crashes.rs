//! Crash at every step of the operations that span servers (mkdir, rmdir, link, unlink,
//! rename, and the parent update of a moved directory), through the failpoints the step
//! engine places (`shoald --failpoints`, `FAILPOINTS`; docs/architecture.md "Failpoints").
//!
//! Each scenario restarts the coordinating server with one failpoint armed as `return`
//! (the server kills itself with SIGKILL there), runs the operation, starts the server
//! again without failpoints and waits until no server holds an intent. Then the operation
//! must have happened completely or not at all: every name names a live inode, listings
//! hold each name once and agree with lookups, link counts (files' and directories') are
//! right, and no intent is left behind.

use shoal_client::{Attr, Client, Errno, FileKind, Ino, RenameFlags, ServerId, ROOT_INO};
use shoal_testkit::wait_no_intents;
use shoal_testkit::Cluster;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

const SERVERS: u32 = 3;

fn home(c: &Cluster, ino: Ino) -> ServerId {
    c.map.home_of(ino)
}

/// A new directory under the root whose inode (and so its entries) lives on `server`.
async fn dir_on(c: &Cluster, fs: &Client, server: ServerId, prefix: &str) -> Ino {
    for i in 0..64 {
        let a = fs.mkdir_at(ROOT_INO, &format!("{prefix}-{i}"), 0o755).await.unwrap();
        if home(c, a.ino) == server {
            return a.ino;
        }
    }
    panic!("no directory landed on server {server}");
}

/// A new subdirectory of `parent` whose inode lives on `server`; (name, attributes).
async fn subdir_on(c: &Cluster, fs: &Client, parent: Ino, server: ServerId, prefix: &str) -> (String, Attr) {
    for i in 0..64 {
        let name = format!("{prefix}-{i}");
        let a = fs.mkdir_at(parent, &name, 0o755).await.unwrap();
        if home(c, a.ino) == server {
            return (name, a);
        }
        fs.rmdir_at(parent, &name).await.unwrap();
    }
    panic!("no subdirectory landed on server {server}");
}

/// Run `op` with failpoint `point` armed on server `id`, which must die there; if
/// `in_recovery` is set, restart it with that failpoint armed and let it die again while
/// recovering; then restart it cleanly and wait until every intent is resolved. What `op`
/// answered does not matter (the client may have resent it to the restarted server).
async fn crash_at<F, Fut>(c: &mut Cluster, fs: &Client, id: ServerId, point: &str, in_recovery: Option<&str>, op: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let id = id.0;
    c.stop(id);
    c.restart_with_env(id, &[("FAILPOINTS", &format!("{point}=return"))]);
    let task = tokio::spawn(op());
    let died = tokio::task::block_in_place(|| c.wait_exit(id, Duration::from_secs(30)));
    assert!(died, "server {id} did not die at failpoint {point}:\n{}", c.log(id));
    if let Some(p2) = in_recovery {
        tokio::task::block_in_place(|| {
            c.spawn_with_env(id, &[("FAILPOINTS", &format!("{p2}=return"))]);
            assert!(c.wait_exit(id, Duration::from_secs(30)), "server {id} did not die at {p2} while recovering");
        });
    }
    tokio::task::block_in_place(|| c.restart(id));
    let _ = tokio::time::timeout(Duration::from_secs(60), task).await.expect("the operation ended after the restart");
    wait_no_intents(fs).await;
}

/// Lookup that tells "no such name" (None) from other failures (panic).
async fn find(fs: &Client, dir: Ino, name: &str) -> Option<Attr> {
    match fs.lookup(dir, name).await {
        Ok(a) => Some(a),
        Err(e) if e.errno == Errno::ENOENT => None,
        Err(e) => panic!("lookup {name:?} in {dir}: {e}"),
    }
}

/// Is inode `ino` alive (at its home)?
async fn alive(fs: &Client, ino: Ino) -> Option<Attr> {
    match fs.getattr_fresh(ino).await {
        Ok(a) => Some(a),
        Err(e) if e.errno == Errno::ENOENT => None,
        Err(e) => panic!("getattr {ino}: {e}"),
    }
}

/// The directory's listing (each name once), checked against lookups, every entry naming a
/// live inode of the listed kind, and the directory's link count against its subdirectories.
async fn check_dir(fs: &Client, dir: Ino) -> BTreeMap<String, Ino> {
    let entries = fs.readdir_at(dir).await.unwrap();
    let mut names = BTreeMap::new();
    let mut subdirs = 0;
    for e in &entries {
        assert!(names.insert(e.name.clone(), e.ino).is_none(), "{:?} listed twice in {dir}", e.name);
        let a = alive(fs, e.ino).await.unwrap_or_else(|| panic!("{:?} in {dir} names a dead inode {}", e.name, e.ino));
        assert_eq!(a.kind, e.kind, "{:?} in {dir}", e.name);
        assert_eq!(find(fs, dir, &e.name).await.map(|a| a.ino), Some(e.ino), "lookup of listed {:?}", e.name);
        if e.kind == FileKind::Dir {
            subdirs += 1;
            assert_eq!(a.parent, Some(dir), "parent pointer of {:?} in {dir}", e.name);
            // Listing it teaches the client every partition it has (`is_split`).
            let subdirs = subdirs_of(fs, e.ino).await;
            let want = if is_split(fs, e.ino) { 1 } else { 2 + subdirs };
            assert_eq!(a.nlink, want, "link count of directory {:?}", e.name);
        }
    }
    let d = alive(fs, dir).await.expect("directory alive");
    // A directory split over servers reports the "unknown" link count 1.
    let split = is_split(fs, dir);
    assert_eq!(d.nlink, if split { 1 } else { 2 + subdirs }, "link count of directory {dir} (split: {split})");
    names
}

/// Whether `dir` has more than one partition, as far as the client learnt (a complete
/// listing teaches it all of them).
fn is_split(fs: &Client, dir: Ino) -> bool {
    fs.dir_bitmap(dir).iter().map(|w| w.count_ones()).sum::<u32>() > 1
}

async fn subdirs_of(fs: &Client, dir: Ino) -> u32 {
    fs.readdir_at(dir).await.unwrap().iter().filter(|e| e.kind == FileKind::Dir).count() as u32
}

/// A client that asks the servers every time (no cached entries or attributes).
fn client(c: &Cluster) -> Client {
    c.uncached_client()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_step_of_mkdir_leaves_it_done_or_undone() {
    let mut c = Cluster::start(SERVERS);
    let fs = client(&c);
    let coord = ServerId(0);
    let parent = dir_on(&c, &fs, coord, "p").await;
    let scenarios: &[(&str, Option<&str>)] = &[
        ("mkdir.object.before", None),
        ("mkdir.object.after", None),
        ("mkdir.finish.after", None),
        ("mkdir.object.after", Some("mkdir.rollback.before")),
        ("mkdir.object.after", Some("mkdir.rollback.after")),
    ];
    let mut tried = Vec::new();
    for (k, (point, again)) in scenarios.iter().enumerate() {
        // Mkdirs spread round-robin: within a few, one lands on another server and stops
        // at the failpoint.
        let names: Vec<String> = (0..8).map(|i| format!("m{k}-{i}")).collect();
        tried.extend(names.clone());
        let f2 = fs.clone();
        crash_at(&mut c, &fs, coord, point, *again, move || async move {
            for n in names {
                if f2.mkdir_at(parent, &n, 0o755).await.is_err() {
                    break;
                }
            }
        })
        .await;
        let listed = check_dir(&fs, parent).await;
        for n in &tried {
            assert_eq!(find(&fs, parent, n).await.is_some(), listed.contains_key(n), "{n} after {point}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_step_of_rmdir_leaves_it_done_or_undone() {
    let mut c = Cluster::start(SERVERS);
    let fs = client(&c);
    let coord = ServerId(0);
    let parent = dir_on(&c, &fs, coord, "p").await;
    for (k, point) in ["rmdir.object.before", "rmdir.object.after", "rmdir.finish.after"].iter().enumerate() {
        let (name, child) = subdir_on(&c, &fs, parent, ServerId(1), &format!("r{k}")).await;
        let (f2, n2) = (fs.clone(), name.clone());
        crash_at(&mut c, &fs, coord, point, None, move || async move {
            let _ = f2.rmdir_at(parent, &n2).await;
        })
        .await;
        check_dir(&fs, parent).await;
        // Entry and directory object go together.
        let entry = find(&fs, parent, &name).await.map(|a| a.ino);
        let object = alive(&fs, child.ino).await.map(|a| a.ino);
        match (entry, object) {
            (Some(e), Some(o)) if e == child.ino && o == child.ino => fs.rmdir_at(parent, &name).await.unwrap(),
            (None, None) => {}
            other => panic!("after a crash at {point}: entry and directory object disagree: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_step_of_link_leaves_it_done_or_undone() {
    let mut c = Cluster::start(SERVERS);
    let fs = client(&c);
    let coord = ServerId(0);
    let parent = dir_on(&c, &fs, coord, "p").await;
    let other = dir_on(&c, &fs, ServerId(1), "o").await;
    for (k, point) in ["link.nlink.before", "link.nlink.after", "link.finish.after"].iter().enumerate() {
        let file = fs.create_at(other, &format!("f{k}"), 0o644, true, None).await.unwrap();
        assert_eq!(home(&c, file.ino), ServerId(1));
        let (f2, name) = (fs.clone(), format!("l{k}"));
        let n2 = name.clone();
        crash_at(&mut c, &fs, coord, point, None, move || async move {
            let _ = f2.link_at(file.ino, parent, &n2).await;
        })
        .await;
        let linked = find(&fs, parent, &name).await;
        let nlink = alive(&fs, file.ino).await.expect("file alive").nlink;
        match linked {
            Some(a) => {
                assert_eq!(a.ino, file.ino);
                assert_eq!(nlink, 2, "link done after a crash at {point}: two names");
            }
            None => assert_eq!(nlink, 1, "link undone after a crash at {point}: one name"),
        }
        check_dir(&fs, parent).await;
        check_dir(&fs, other).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_step_of_unlink_of_a_remote_inode_completes_it() {
    let mut c = Cluster::start(SERVERS);
    let fs = client(&c);
    let coord = ServerId(0);
    let parent = dir_on(&c, &fs, coord, "p").await;
    let other = dir_on(&c, &fs, ServerId(1), "o").await;
    for (k, point) in ["unlink.nlink.before", "unlink.nlink.after", "unlink.finish.after"].iter().enumerate() {
        // A second name (on the coordinator) of a file homed elsewhere: one link goes.
        let file = fs.create_at(other, &format!("f{k}"), 0o644, true, None).await.unwrap();
        fs.link_at(file.ino, parent, &format!("u{k}")).await.unwrap();
        // The last name (moved to the coordinator) of another: the file goes.
        let last = fs.create_at(other, &format!("g{k}"), 0o644, true, None).await.unwrap();
        fs.rename_at(other, &format!("g{k}"), parent, &format!("v{k}"), RenameFlags::default()).await.unwrap();
        let f2 = fs.clone();
        crash_at(&mut c, &fs, coord, point, None, move || async move {
            let _ = f2.unlink_at(parent, &format!("u{k}")).await;
        })
        .await;
        let f2 = fs.clone();
        crash_at(&mut c, &fs, coord, point, None, move || async move {
            let _ = f2.unlink_at(parent, &format!("v{k}")).await;
        })
        .await;
        // The name is removed in the batch that writes the intent: the unlink completes.
        assert!(find(&fs, parent, &format!("u{k}")).await.is_none());
        assert!(find(&fs, parent, &format!("v{k}")).await.is_none());
        assert_eq!(alive(&fs, file.ino).await.expect("file with a name left").nlink, 1, "after a crash at {point}");
        assert!(alive(&fs, last.ino).await.is_none(), "file with no name left still there after a crash at {point}");
        check_dir(&fs, parent).await;
        check_dir(&fs, other).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_step_of_a_cross_server_rename_leaves_exactly_one_name() {
    let mut c = Cluster::start(SERVERS);
    let fs = client(&c);
    let coord = ServerId(0);
    let src = dir_on(&c, &fs, coord, "s").await;
    let dst = dir_on(&c, &fs, ServerId(1), "d").await;
    let points = ["rename.target.before", "rename.target.after", "rename.finish.after"];
    for (k, point) in points.iter().enumerate() {
        for replace in [false, true] {
            let (a, b) = (format!("a{k}{replace}"), format!("b{k}{replace}"));
            let file = fs.create_at(src, &a, 0o644, true, None).await.unwrap();
            let target = if replace { Some(fs.create_at(dst, &b, 0o644, true, None).await.unwrap()) } else { None };
            let (f2, a2, b2) = (fs.clone(), a.clone(), b.clone());
            crash_at(&mut c, &fs, coord, point, None, move || async move {
                let _ = f2.rename_at(src, &a2, dst, &b2, RenameFlags::default()).await;
            })
            .await;
            let (at_a, at_b) = (find(&fs, src, &a).await, find(&fs, dst, &b).await);
            match (&at_a, &at_b) {
                // Done: the target (if any) is gone.
                (None, Some(x)) if x.ino == file.ino => {
                    if let Some(t) = &target {
                        assert!(alive(&fs, t.ino).await.is_none(), "replaced target left after a crash at {point}");
                    }
                }
                // Not done: the target (if any) is untouched.
                (Some(x), other) if x.ino == file.ino => {
                    assert_eq!(other.as_ref().map(|o| o.ino), target.as_ref().map(|t| t.ino), "after {point}");
                }
                other => panic!("after a crash at {point}: names are {other:?}"),
            }
            assert_eq!(alive(&fs, file.ino).await.expect("renamed file alive").nlink, 1);
            check_dir(&fs, src).await;
            check_dir(&fs, dst).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_step_of_a_directory_move_keeps_parent_pointers_and_link_counts() {
    let mut c = Cluster::start(SERVERS);
    let fs = client(&c);
    let coord = ServerId(0);
    let src = dir_on(&c, &fs, coord, "s").await;
    let dst = dir_on(&c, &fs, ServerId(1), "d").await;
    let points = [
        "rename.target.before",
        "rename.target.after",
        "rename.finish.after",
        "set_parent.parent.before",
        "set_parent.parent.after",
        "set_parent.finish.after",
    ];
    for (k, point) in points.iter().enumerate() {
        // The moved directory lives on a third server: its parent pointer is a step of its own.
        let (a, moving) = subdir_on(&c, &fs, src, ServerId(2), &format!("a{k}")).await;
        fs.mkdir_at(moving.ino, "inside", 0o755).await.unwrap();
        let b = format!("b{k}");
        let (f2, a2, b2) = (fs.clone(), a.clone(), b.clone());
        crash_at(&mut c, &fs, coord, point, None, move || async move {
            let _ = f2.rename_at(src, &a2, dst, &b2, RenameFlags::default()).await;
        })
        .await;
        let (at_a, at_b) = (find(&fs, src, &a).await, find(&fs, dst, &b).await);
        assert!(at_a.is_some() != at_b.is_some(), "after a crash at {point}: source {at_a:?}, destination {at_b:?}");
        // check_dir checks each subdirectory's parent pointer and every link count.
        check_dir(&fs, src).await;
        check_dir(&fs, dst).await;
        check_dir(&fs, moving.ino).await;
    }
}

/// Names of a directory that splits once its partition 0 reaches the split threshold (32).
fn split_names(k: usize) -> Vec<String> {
    (0..40).map(|i| format!("s{k}-{i:03}")).collect()
}

/// A split directory's state after crashes: every listed name once, each found by lookup
/// with the listed inode, every one of `sure` listed, and the others of `tried` listed
/// exactly when a lookup finds them.
async fn check_split(fs: &Client, dir: Ino, sure: &[String], tried: &[String], when: &str) {
    let entries = fs.readdir_at(dir).await.unwrap();
    let mut listed = BTreeMap::new();
    for e in &entries {
        assert!(listed.insert(e.name.clone(), e.ino).is_none(), "{:?} listed twice after {when}", e.name);
        assert_eq!(find(fs, dir, &e.name).await.map(|a| a.ino), Some(e.ino), "lookup of listed {:?}", e.name);
        assert!(alive(fs, e.ino).await.is_some(), "{:?} names a dead inode after {when}", e.name);
    }
    for n in sure {
        assert!(listed.contains_key(n), "{n} lost after {when}");
    }
    for n in tried {
        assert_eq!(find(fs, dir, n).await.is_some(), listed.contains_key(n), "{n} after {when}");
    }
    assert!(is_split(fs, dir), "the directory split after {when}");
}

/// `kill -9` of the splitting partition's server at every step of a split, of the server
/// taking the new partition right after it stored it, and the latter down during the split:
/// recovery finishes the split and no entry is lost or listed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_step_of_a_split_loses_and_duplicates_nothing() {
    let mut c = Cluster::start(SERVERS);
    let fs = client(&c);
    let home = ServerId(0);
    let points = [
        "split.in.before",
        "split.in.after",
        "split.register.before",
        "split.register.after",
        "split.finish.after",
        "split_in.commit.after",
    ];
    for (k, point) in points.iter().enumerate() {
        let dir = dir_on(&c, &fs, home, &format!("d{k}")).await;
        let names = split_names(k);
        // Below the threshold nothing splits; the 32nd name makes partition 0 split.
        for n in &names[..31] {
            fs.create_at(dir, n, 0o644, true, None).await.unwrap();
        }
        // The new partition 1 is on the next server of the ring after the directory's home.
        let victim = if point.starts_with("split_in") { c.map.partition_home(dir, 1) } else { home };
        let (f2, rest) = (fs.clone(), names[31..].to_vec());
        crash_at(&mut c, &fs, victim, point, None, move || async move {
            for n in rest {
                let _ = f2.create_at(dir, &n, 0o644, true, None).await;
            }
        })
        .await;
        check_split(&fs, dir, &names[..31], &names, point).await;
    }
    // The new partition's server is down when the split starts: the split waits for it.
    let k = points.len();
    let dir = dir_on(&c, &fs, home, &format!("d{k}")).await;
    let names = split_names(k);
    for n in &names[..31] {
        fs.create_at(dir, n, 0o644, true, None).await.unwrap();
    }
    let target = c.map.partition_home(dir, 1);
    c.stop(target.0);
    fs.create_at(dir, &names[31], 0o644, true, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| c.restart(target.0));
    wait_no_intents(&fs).await;
    for n in &names[32..] {
        fs.create_at(dir, n, 0o644, true, None).await.unwrap();
    }
    check_split(&fs, dir, &names, &names, "a split waiting for its target").await;
}

#[test]
fn shoald_refuses_a_malformed_failpoint_spec_in_one_line() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shoald"))
        .args(["--config", "/nonexistent/cluster.toml", "--id", "0"])
        .env("FAILPOINTS", "rename.target.after")
        .output()
        .expect("run shoald");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("failpoint \"rename.target.after\" is not name=action"), "{err}");
}
