//! A full disk: the servers stay up, writers get ENOSPC, reads and deletions go on, writes
//! resume when space returns, and a server restarts on a disk with no free space at all.
//! The servers' data directories are on a 64 MiB tmpfs mounted by the test (it runs as root;
//! elsewhere it prints why and passes, as the FUSE tests do without /dev/fuse).

use shoal_client::{Client, Errno, LayoutSpec, OpenFlags};
use shoal_testkit::{pattern, Cluster};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tmpfs of a given size on a fresh directory, unmounted when dropped (also when the test
/// fails: declare it before the cluster, so the servers are killed first).
struct Tmpfs {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Tmpfs {
    fn mount(mib: u32) -> Option<Tmpfs> {
        let dir = tempfile::Builder::new().prefix("shoal-full-").tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("run mount");
        if !out.status.success() {
            eprintln!("SKIPPED: cannot mount a tmpfs (needs root): {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        Some(Tmpfs { _dir: dir, path })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.path).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

const MIB: usize = 1 << 20;

fn one_server() -> Option<LayoutSpec> {
    Some(LayoutSpec { stripe_count: Some(1), ..Default::default() })
}

/// Create `path` and write `len` bytes of pattern `seed` through it (write-behind: a refusal
/// shows at close at the latest).
async fn write_file(fs: &Client, path: &str, seed: u64, len: usize) -> shoal_client::Result<()> {
    let f = fs.create(path, 0o644, one_server()).await?;
    let w = f.write_at(0, &pattern(seed, 0, len)).await;
    let c = f.close().await;
    w.and(c)
}

async fn read_back(fs: &Client, path: &str, seed: u64, len: usize) {
    // Four servers share one small disk here, so their headroom checks can race and a store
    // write can still fail; the requests whose commits were lost get ENOSPC, and reads wait
    // for the store to reopen (store/commits.rs): they never fail.
    let attempt = async {
        let a = fs.stat(path).await?;
        let f = fs.open(path, OpenFlags::read_only()).await?;
        Ok::<_, shoal_client::Error>((a.size, f.read_at(0, len).await?))
    };
    let got = attempt.await.unwrap_or_else(|e| panic!("read {path}: {e}"));
    assert_eq!(got.0, len as u64, "{path}");
    assert!(got.1[..] == pattern(seed, 0, len)[..], "{path} reads back different bytes");
}

/// Write 1 MiB files `/fill<n>` until the servers refuse, then 4 KiB pieces to `top` until
/// they refuse those too. Returns the names of the files written; asserts every refusal is
/// ENOSPC.
async fn fill(fs: &Client, prefix: &str, top: &shoal_client::File) -> Vec<String> {
    let mut names = Vec::new();
    for n in 0..100 {
        let path = format!("/{prefix}{n}");
        match write_file(fs, &path, n, MIB).await {
            Ok(()) => names.push(path),
            Err(e) => {
                assert_eq!(e.errno, Errno::ENOSPC, "filling: {e}");
                let _ = fs.unlink(&path).await;
                break;
            }
        }
        assert!(n < 99, "64 MiB never filled up");
    }
    if let Err(e) = top_up(top).await {
        assert_eq!(e.errno, Errno::ENOSPC, "topping up: {e}");
        return names;
    }
    panic!("4096 writes of 4 KiB never filled the disk");
}

/// Write 4 KiB pieces at the end of `top` until one is refused (its error). Each is flushed
/// on its own: the client gathers small writes into requests of up to 1 MiB, and a refused
/// 1 MiB request would leave room for smaller ones.
async fn top_up(top: &shoal_client::File) -> shoal_client::Result<()> {
    let end = top.stat().await?.size;
    for k in 0..4096u64 {
        top.write_at(end + k * 4096, &[7u8; 4096]).await?;
        top.flush().await?;
    }
    Ok(())
}

/// Assert that `f`, which consumes space, is refused with ENOSPC on the full disk. The free
/// space of a full disk moves a little on its own (RocksDB drops a log file after a flush,
/// another server gives back its reserve): a success counts only if it keeps happening
/// after `top` was topped up again to the refusal of a 4 KiB write.
async fn refused_while_full<F, Fut>(fs: &Client, top: &shoal_client::File, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = shoal_client::Result<()>>,
{
    for _ in 0..5 {
        match f().await {
            Err(e) => {
                assert_eq!(e.errno, Errno::ENOSPC, "{what} on a full disk: {e}");
                return;
            }
            Ok(()) => {
                let _ = fs.unlink("/new").await;
                let _ = fs.rmdir("/newdir").await;
                let _ = top_up(top).await;
            }
        }
    }
    panic!("{what} kept succeeding on a full disk");
}

/// Retry `f` until it succeeds, for at most `limit`.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = shoal_client::Result<()>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(()) => return,
            Err(e) if start.elapsed() < limit => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what} still fails after {limit:?}: {e}"),
        }
    }
}

/// Fill the file system holding `dir` completely with a file of its own, as another program
/// on the same disk would.
fn hog(dir: &Path) -> PathBuf {
    let path = dir.join("hog");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![1u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_enospc_and_the_servers_stay_up_and_recover() {
    let Some(disk) = Tmpfs::mount(64) else { return };
    let root = disk.path.clone();
    let mut cluster = Cluster::start_with(4, |m| {
        for s in &mut m.servers {
            s.data_dir = Some(root.join(format!("s{}", s.id)));
        }
    });
    let fs = cluster.uncached_client();

    // Files written while there is room, on every server.
    let keep: Vec<(String, u64, usize)> = (0..8).map(|i| (format!("/keep{i}"), 100 + i, 50_000)).collect();
    for (path, seed, len) in &keep {
        write_file(&fs, path, *seed, *len).await.unwrap();
    }
    let top = fs.create("/top", 0o644, one_server()).await.unwrap();

    let filled = fill(&fs, "fill", &top).await;
    assert!(filled.len() >= 8, "only {} MiB written before the disk was full", filled.len());
    for id in 0..4 {
        assert!(cluster.alive(id), "server {id} died on the full disk:\n{}", cluster.log(id));
    }
    // Full: new names are refused as such, not as I/O errors.
    refused_while_full(&fs, &top, "a create", || async { fs.create("/new", 0o644, None).await.map(|_| ()) }).await;
    refused_while_full(&fs, &top, "a mkdir", || async { fs.mkdir("/newdir", 0o755).await.map(|_| ()) }).await;
    // Reads, stats and listings go on.
    for (path, seed, len) in &keep {
        read_back(&fs, path, *seed, *len).await;
    }
    assert!(fs.readdir("/").await.unwrap().len() >= keep.len() + filled.len());

    // Deleting frees space, and writes resume.
    for path in &filled[..8] {
        fs.unlink(path).await.unwrap();
    }
    eventually(Duration::from_secs(15), "a write after deleting 8 MiB", || async {
        let _ = fs.unlink("/after").await;
        write_file(&fs, "/after", 7, MIB).await
    })
    .await;
    read_back(&fs, "/after", 7, MIB).await;

    // Full again, then a server is killed and the disk filled to the last byte by someone
    // else: the servers stay up, the killed one starts (its reserve makes room to open the
    // store) and serves its files.
    fill(&fs, "again", &top).await;
    cluster.kill9(0);
    let hog = hog(&disk.path);
    cluster.restart(0);
    let fs = cluster.uncached_client();
    for (path, seed, len) in &keep {
        read_back(&fs, path, *seed, *len).await;
    }
    // Deletions commit on the disk with no room left (the reserves were given back).
    for path in &filled[8..] {
        fs.unlink(path).await.unwrap();
    }
    for id in 0..4 {
        assert!(cluster.alive(id), "server {id} died on the full disk:\n{}", cluster.log(id));
    }
    // Space back: everything takes writes again.
    std::fs::remove_file(&hog).unwrap();
    eventually(Duration::from_secs(15), "a write once the disk has room", || async {
        let _ = fs.unlink("/last").await;
        write_file(&fs, "/last", 8, MIB).await
    })
    .await;
    read_back(&fs, "/last", 8, MIB).await;
    for id in 0..4 {
        assert!(cluster.alive(id), "server {id} died:\n{}", cluster.log(id));
    }
    drop(cluster);
}

#[test]
fn write_and_close_on_a_mount_get_enospc_when_the_disk_is_full() {
    if shoal_testkit::mount::skip_without_fuse() {
        return;
    }
    let Some(disk) = Tmpfs::mount(64) else { return };
    let root = disk.path.clone();
    let mut cluster = Cluster::start_with(4, |m| {
        for s in &mut m.servers {
            s.data_dir = Some(root.join(format!("s{}", s.id)));
        }
    });
    let mount = shoal_testkit::mount::Mount::new(&cluster, &[]);
    let chunk = vec![3u8; MIB];
    let mut refused = None;
    'files: for n in 0..100 {
        let mut f = match std::fs::File::create(mount.p(&format!("f{n}"))) {
            Ok(f) => f,
            Err(e) => {
                refused = Some(("create", e));
                break;
            }
        };
        for _ in 0..4 {
            if let Err(e) = f.write_all(&chunk) {
                refused = Some(("write", e));
                break 'files;
            }
        }
        use std::os::fd::IntoRawFd;
        // SAFETY: closing the descriptor this test owns, to see close(2)'s result.
        if unsafe { libc::close(f.into_raw_fd()) } != 0 {
            refused = Some(("close", std::io::Error::last_os_error()));
            break;
        }
    }
    let (call, err) = refused.expect("64 MiB never filled up");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{call}: {err}");
    // Which call meets the refusal first depends on how much room the last file left and
    // on the servers' reserve files coming and going on the shared disk: whichever it is
    // must say ENOSPC (never EIO), and no server may die.
    for id in 0..4 {
        assert!(cluster.alive(id), "server {id} died on the full disk:\n{}", cluster.log(id));
    }
    drop(mount);
}

/// Wait (at most 20 s) until `path` exists or not, as `want` says.
fn wait_for_file(path: &Path, want: bool) -> bool {
    let start = Instant::now();
    while path.exists() != want {
        if start.elapsed() > Duration::from_secs(20) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Readers that stat and read `files` in a loop on `fs` until `stop`; returns the errors
/// they met and the number of rounds done.
fn spawn_readers(
    fs: Client,
    files: Vec<(String, u64, usize)>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<String>, u64)> {
    tokio::spawn(async move {
        let (mut errors, mut rounds) = (Vec::new(), 0);
        while !stop.load(Ordering::Acquire) {
            for (path, seed, len) in &files {
                let r = async {
                    let a = fs.stat(path).await?;
                    let f = fs.open(path, OpenFlags::read_only()).await?;
                    Ok::<_, shoal_client::Error>((a.size, f.read_at(0, *len).await?))
                }
                .await;
                match r {
                    Ok((size, data)) if size == *len as u64 && data[..] == pattern(*seed, 0, *len)[..] => {}
                    Ok((size, _)) => errors.push(format!("{path}: size {size} or contents differ")),
                    Err(e) => errors.push(format!("{path}: {e}")),
                }
            }
            rounds += 1;
        }
        (errors, rounds)
    })
}

/// The fallback behind the headroom: when a metadata log write fails all the same (other
/// servers or programs took the last bytes of a shared disk), exactly the requests whose
/// commits were lost get ENOSPC; reads on the same and other connections wait for the
/// store to reopen and never fail, and writes resume. Forced here by filling the disk to the
/// last byte behind the server's back and then committing changes a full disk still takes
/// (chmod) until the log write fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_metadata_log_write_answers_only_its_own_requests_with_enospc_and_readers_never_fail() {
    let Some(disk) = Tmpfs::mount(32) else { return };
    let root = disk.path.clone();
    let mut cluster = Cluster::start_with(1, |m| {
        for s in &mut m.servers {
            s.data_dir = Some(root.join(format!("s{}", s.id)));
        }
    });
    let reserve = root.join("s0").join("reserve");
    let fs = cluster.uncached_client();
    let other = cluster.uncached_client();
    let keep: Vec<(String, u64, usize)> = (0..4).map(|i| (format!("/keep{i}"), 200 + i, 50_000)).collect();
    for (path, seed, len) in &keep {
        write_file(&fs, path, *seed, *len).await.unwrap();
    }
    let doomed: Vec<String> = (0..8).map(|i| format!("/doomed{i}")).collect();
    for (i, path) in doomed.iter().enumerate() {
        write_file(&fs, path, i as u64, 4096).await.unwrap();
    }
    fs.create("/target", 0o644, None).await.unwrap().close().await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    // `fs` carries the chmods too: its readers share their connections.
    let readers =
        [spawn_readers(fs.clone(), keep.clone(), stop.clone()), spawn_readers(other, keep.clone(), stop.clone())];

    // The server makes its reserve file at start-up and gives it back when free space falls
    // below half its headroom (checked every second), or at once when a log write fails.
    // The failure must come first, so that the reserve gives the reopen its room: if the
    // periodic check wins, free the disk and try again.
    let mut refused = 0;
    let mut failed = false;
    for _attempt in 0..5 {
        assert!(wait_for_file(&reserve, true), "no reserve file:\n{}", cluster.log(0));
        let hog = hog(&disk.path);
        for round in 0..2000u32 {
            let results =
                futures::future::join_all((0..32u32).map(|k| fs.chmod("/target", 0o600 | ((round + k) % 64)))).await;
            for r in results {
                match r {
                    Ok(_) => {}
                    Err(e) => {
                        assert_eq!(e.errno, Errno::ENOSPC, "chmod on a full disk: {e}\n{}", cluster.log(0));
                        refused += 1;
                    }
                }
            }
            failed = cluster.log(0).contains("metadata store stops taking writes");
            if failed || !reserve.exists() {
                break;
            }
        }
        if failed {
            // Changes go on once the store has reopened (the reserve made the room).
            eventually(Duration::from_secs(15), "a chmod after the store reopened", || async {
                fs.chmod("/target", 0o644).await.map(|_| ())
            })
            .await;
            // Deletions on the full disk commit.
            for path in &doomed {
                fs.unlink(path).await.unwrap();
            }
        }
        std::fs::remove_file(&hog).unwrap();
        if failed {
            break;
        }
    }
    eprintln!("{refused} chmods refused with ENOSPC around the failed log write");
    assert!(failed, "the metadata log never failed to write:\n{}", cluster.log(0));
    assert!(refused > 0, "a log write failed but no chmod was refused:\n{}", cluster.log(0));
    assert!(cluster.log(0).contains("reopened"), "the store did not reopen:\n{}", cluster.log(0));

    // Space back: writes resume.
    eventually(Duration::from_secs(15), "a write once the disk has room", || async {
        let _ = fs.unlink("/after").await;
        write_file(&fs, "/after", 9, MIB).await
    })
    .await;
    read_back(&fs, "/after", 9, MIB).await;
    stop.store(true, Ordering::Release);
    for r in readers {
        let (errors, rounds) = r.await.unwrap();
        assert!(errors.is_empty(), "readers met errors:\n{}\n{}", errors.join("\n"), cluster.log(0));
        eprintln!("reader: {rounds} rounds without an error");
        assert!(rounds > 0);
    }
    assert!(cluster.alive(0), "server died:\n{}", cluster.log(0));
    drop(cluster);
}
