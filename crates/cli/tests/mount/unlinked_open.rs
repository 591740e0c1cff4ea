//! Files removed while open (unlink, or rename over them) on real servers, through a real
//! FUSE mount and through the native client: they stay readable and writable through the
//! open handle with link count 0, their directory is empty at once, the last close deletes
//! them, and a client that dies leaves nothing behind after the servers' grace period.

use shoal_client::{BlockingClient, Client, Errno, Ino, OpenFlags};
use shoal_testkit::mount::{skip_without_fuse, Mount};
use shoal_testkit::{pattern, Cluster};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The object files of `ino` on every server's disk.
fn object_files(c: &Cluster, ino: Ino) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for id in 0..c.map.servers.len() {
        let bucket = c.path().join(format!("s{id}/objects/{:02x}", ino.0 & 0xff));
        let prefix = format!("{:016x}.", ino.0);
        if let Ok(rd) = fs::read_dir(&bucket) {
            out.extend(rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).map(|e| e.path()));
        }
    }
    out
}

/// Wait (at most `limit`) until `ino` is gone from its server and its object files from disk.
fn wait_deleted(c: &Cluster, fs: &BlockingClient, ino: Ino, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        fs.clear_cache();
        let gone = matches!(fs.getattr(ino), Err(e) if e.errno == Errno::ENOENT);
        if gone && object_files(c, ino).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn rmdir_right_after_closing_an_unlinked_open_file_succeeds() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    for i in 0..30 {
        let dir = m.p(&format!("d{i}"));
        fs::create_dir(&dir).unwrap();
        let path = dir.join("f");
        let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.write_all(b"before ").unwrap();
        fs::remove_file(&path).unwrap();
        // Still a file: written and read through the descriptor, with no name left.
        f.write_all(b"after").unwrap();
        let mut buf = [0u8; 12];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"before after");
        assert_eq!(f.metadata().unwrap().nlink(), 0, "trial {i}: fstat of an unlinked file");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "trial {i}: the directory lists nothing");
        drop(f);
        fs::remove_dir(&dir).unwrap_or_else(|e| panic!("trial {i}: rmdir right after close: {e}"));
    }
}

#[test]
fn names_like_the_old_hidden_ones_are_ordinary_names() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/.shoal-unlinked-1-1"), b"mine").unwrap();
    let names: Vec<String> =
        fs::read_dir(m.p("d")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, [".shoal-unlinked-1-1"], "listed like any name");
    assert_eq!(fs::read(m.p("d/.shoal-unlinked-1-1")).unwrap(), b"mine");
    fs::remove_file(m.p("d/.shoal-unlinked-1-1")).unwrap();
    fs::remove_dir(m.p("d")).unwrap();
}

#[test]
fn rename_over_an_open_file_keeps_its_data_readable_through_the_descriptor() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    // Several directories: they spread over the servers, so some renames cross servers.
    for d in 0..4 {
        fs::create_dir(m.p(&format!("d{d}"))).unwrap();
    }
    for (from, to) in [(0, 0), (0, 1), (1, 2), (2, 3), (3, 0)] {
        let target = m.p(&format!("d{to}/target"));
        let source = m.p(&format!("d{from}/source"));
        let old = pattern(to, 0, 100_000);
        fs::write(&target, &old).unwrap();
        fs::write(&source, b"new contents").unwrap();
        let f = OpenOptions::new().read(true).write(true).open(&target).unwrap();
        fs::rename(&source, &target).unwrap();
        let mut buf = vec![0u8; old.len()];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert!(buf == old, "d{from} → d{to}: the replaced file's data through its descriptor");
        f.write_all_at(b"still writable", 0).unwrap();
        assert_eq!(f.metadata().unwrap().nlink(), 0, "d{from} → d{to}: the replaced file has no name");
        drop(f);
        assert_eq!(fs::read(&target).unwrap(), b"new contents");
        fs::remove_file(&target).unwrap();
    }
    for d in 0..4 {
        fs::remove_dir(m.p(&format!("d{d}"))).unwrap();
    }
}

#[test]
fn files_unlinked_while_open_go_after_their_client_dies() {
    if skip_without_fuse() {
        return;
    }
    let grace = Duration::from_secs(2);
    let c = Cluster::start_with_server_args(2, &["--orphan-grace", "2"]);
    let fs_client = BlockingClient::from_config(&c.config, c.options()).unwrap();
    let mut m = Mount::new(&c, &[]);
    fs::create_dir(m.p("d")).unwrap();
    let path = m.p("d/f");
    let data = pattern(7, 0, 3 << 20);
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.write_all_at(&data, 0).unwrap();
    f.sync_all().unwrap();
    let ino = fs_client.stat("/d/f").unwrap().ino;
    fs::remove_file(&path).unwrap();
    fs::remove_dir(m.p("d")).unwrap();
    assert!(!object_files(&c, ino).is_empty(), "the data is on disk");

    // While the mount lives (and stays connected), its file outlives the grace period.
    std::thread::sleep(grace * 2);
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 1 << 20).unwrap();
    assert_eq!(buf, data[1 << 20..(1 << 20) + 4096]);
    assert_eq!(fs_client.getattr(ino).unwrap().nlink, 0);

    // kill -9 of the mount: nobody will close the file.
    unsafe { libc::kill(m.pid() as i32, libc::SIGKILL) };
    m.wait_exit(Duration::from_secs(10)).expect("the mount process exits");
    drop(f);
    assert!(
        wait_deleted(&c, &fs_client, ino, Duration::from_secs(30)),
        "inode {ino} and its objects still there 30 s after its client died: {:?}\n{}",
        object_files(&c, ino),
        c.log(0) + &c.log(1)
    );
}

/// Two directories on different servers.
async fn dirs_on_two_servers(fs: &Client) -> (String, String) {
    let a = fs.mkdir("/a", 0o755).await.unwrap();
    for i in 0..16 {
        let name = format!("/b{i}");
        let b = fs.mkdir(&name, 0o755).await.unwrap();
        if fs.home_of(b.ino) != fs.home_of(a.ino) {
            return ("/a".into(), name);
        }
    }
    panic!("16 directories all on the server of the first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_client_reads_a_file_it_unlinked_until_it_closes_it() {
    let c = Cluster::start(3);
    let fs = c.client();
    let (a, b) = dirs_on_two_servers(&fs).await;
    let data = pattern(3, 0, 200_000);

    // The inode's home is the directory's: unlink on one server.
    let f = fs.create(&format!("{a}/f"), 0o644, None).await.unwrap();
    f.write_at(0, &data).await.unwrap();
    f.flush().await.unwrap();
    let ino = f.ino();
    fs.unlink(&format!("{a}/f")).await.unwrap();
    assert_eq!(&f.read_at(0, data.len()).await.unwrap()[..], &data[..]);
    assert_eq!(f.stat().await.unwrap().nlink, 0);

    // The inode homed on another server than its last name's directory: the link count
    // drops there (PeerLinkDelta).
    let g = fs.create(&format!("{a}/g"), 0o644, None).await.unwrap();
    g.write_at(0, b"far away").await.unwrap();
    g.flush().await.unwrap();
    fs.link(&format!("{a}/g"), &format!("{b}/g")).await.unwrap();
    fs.unlink(&format!("{a}/g")).await.unwrap();
    fs.unlink(&format!("{b}/g")).await.unwrap();
    assert_eq!(&g.read_at(0, 8).await.unwrap()[..], b"far away");
    assert_eq!(g.stat().await.unwrap().nlink, 0);

    // Rename over an open file, across servers.
    let t = fs.create(&format!("{b}/t"), 0o644, None).await.unwrap();
    t.write_at(0, b"old target").await.unwrap();
    t.flush().await.unwrap();
    fs.create(&format!("{a}/s"), 0o644, None).await.unwrap().close().await.unwrap();
    fs.rename(&format!("{a}/s"), &format!("{b}/t")).await.unwrap();
    assert_eq!(&t.read_at(0, 10).await.unwrap()[..], b"old target");
    assert_eq!(t.stat().await.unwrap().nlink, 0);
    fs.unlink(&format!("{b}/t")).await.unwrap();

    // The names are gone: the directories go at once.
    fs.rmdir(&a).await.unwrap();
    fs.rmdir(&b).await.unwrap();

    // The last close deletes each file.
    let inos = [ino, g.ino(), t.ino()];
    f.close().await.unwrap();
    g.close().await.unwrap();
    t.close().await.unwrap();
    let check = BlockingClient::from_config(&c.config, c.options()).unwrap();
    tokio::task::spawn_blocking(move || {
        for ino in inos {
            assert!(wait_deleted(&c, &check, ino, Duration::from_secs(20)), "{ino} still there after its close");
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_client_that_unlinks_keeps_the_file() {
    // As with NFS: a file another client has open goes with its last name.
    let c = Cluster::start(2);
    let fs = c.client();
    fs.create("/h", 0o644, None).await.unwrap().close().await.unwrap();
    let other = c.client();
    let h = other.open("/h", OpenFlags::read_only()).await.unwrap();
    fs.unlink("/h").await.unwrap();
    assert_eq!(h.stat().await.unwrap_err().errno, Errno::ENOENT);
}
