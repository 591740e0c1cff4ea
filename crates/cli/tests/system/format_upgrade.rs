//! Stores written by an older shoald are upgraded in place by a newer one, and read back
//! exactly as they were written.
//!
//! `tests/fixtures/format-N.tar.gz` (N = 1 to 4) holds the data directories of a
//! two-server cluster written in metadata format N (see `tests/fixtures/README.md` for the
//! commits that made them). It was made by `make_format_1_fixture` below, an ignored test that builds a
//! representative namespace on real servers, stops them cleanly and packs their
//! directories together with `manifest.json`: what every path looked like (attributes,
//! entries, link targets, extended attributes, a hash of the data) as the old code served
//! it, plus the records that only exist between two steps (an orphan, a pending object
//! deletion, an unfinished mkdir's intent).

use serde_json::{json, Value};
use shoal_client::{Attr, Client, FileKind, Ino, LayoutSpec, OpenFlags, TimeSet, Timestamp};
use shoal_testkit::{pattern, Cluster};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SERVERS: u32 = 2;

fn fixtures() -> PathBuf {
    shoal_testkit::manifest_dir().join("tests/fixtures")
}

/// FNV-1a over a file's bytes: enough to tell that every byte came back.
fn fnv(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn ts(t: Timestamp) -> Value {
    json!([t.secs, t.nsecs])
}

/// The stored attributes of an inode, as JSON. Not `blocks_bytes`: that is what the object
/// files allocate, which later object formats (checksums) may change.
fn describe_attr(a: &Attr) -> Value {
    json!({
        "ino": a.ino.0,
        "kind": format!("{:?}", a.kind),
        "perm": a.perm,
        "uid": a.uid,
        "gid": a.gid,
        "size": a.size,
        "nlink": a.nlink,
        "atime": ts(a.atime),
        "mtime": ts(a.mtime),
        "ctime": ts(a.ctime),
        "layout": a.layout.as_ref().map(|l| json!({
            "stripe_size": l.stripe_size,
            "servers": l.servers.iter().map(|s| s.0).collect::<Vec<_>>(),
        })),
        "dir_default": a.dir_default.as_ref().map(|d| json!({
            "stripe_size": d.stripe_size,
            "stripe_count": d.stripe_count,
            "first_server": d.first_server.map(|s| s.0),
            "policy": d.policy.map(|p| format!("{p:?}")),
        })),
        "parent": a.parent.map(|p| p.0),
    })
}

async fn read_all(fs: &Client, ino: Ino) -> Vec<u8> {
    let f = fs.open_ino(ino, OpenFlags::read_only()).await.unwrap();
    let size = f.attr().size as usize;
    let data = f.read_at(0, size).await.unwrap().to_vec();
    f.close().await.unwrap();
    assert_eq!(data.len(), size, "short read of {ino}");
    data
}

/// Everything a client can see of the namespace under `/`, path by path: every listed name
/// is looked up (`lstat`), and a directory listing a name twice fails the walk.
async fn walk(fs: &Client) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut todo = vec!["/".to_string()];
    while let Some(path) = todo.pop() {
        let attr = fs.lstat(&path).await.unwrap_or_else(|e| panic!("lstat {path}: {e}"));
        let mut xattrs = BTreeMap::new();
        for name in fs.listxattr(attr.ino).await.unwrap() {
            xattrs.insert(name.clone(), fs.getxattr(attr.ino, &name).await.unwrap());
        }
        let mut d = json!({ "attr": describe_attr(&attr), "xattrs": xattrs });
        match attr.kind {
            FileKind::Dir => {
                let mut names: Vec<_> = fs.readdir(&path).await.unwrap().into_iter().map(|e| e.name).collect();
                names.sort();
                let listed = names.len();
                names.dedup();
                assert_eq!(names.len(), listed, "{path} lists a name twice");
                for n in &names {
                    todo.push(if path == "/" { format!("/{n}") } else { format!("{path}/{n}") });
                }
                d["entries"] = json!(names);
            }
            FileKind::Symlink => d["target"] = json!(fs.readlink(&path).await.unwrap()),
            FileKind::File => d["data"] = json!(fnv(&read_all(fs, attr.ino).await)),
        }
        out.insert(path, d);
    }
    out
}

async fn write_file(fs: &Client, path: &str, perm: u32, spec: Option<LayoutSpec>, seed: u64, len: usize) -> Attr {
    let f = fs.create(path, perm, spec).await.unwrap();
    if len > 0 {
        f.write_at(0, &pattern(seed, 0, len)).await.unwrap();
    }
    f.close().await.unwrap();
    fs.stat(path).await.unwrap()
}

fn striped(stripe_size: u64) -> Option<LayoutSpec> {
    Some(LayoutSpec { stripe_size: Some(stripe_size), stripe_count: Some(SERVERS), ..Default::default() })
}

/// Makes `tests/fixtures/format-N.tar.gz`, N = the metadata format of the code of the commit
/// it runs on. Run only on the last commit before a format change, to keep a store of the
/// outgoing format (see tests/fixtures/README.md):
/// `cargo test --release -p shoal --test format_upgrade make_fixture -- --ignored`
/// (`SHOAL_FIXTURE_OUT` overrides where the archive goes; an existing fixture is never
/// overwritten otherwise). `format-1.tar.gz` was made by this test when it was called
/// `make_format_1_fixture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn make_fixture() {
    let mut c = Cluster::start(SERVERS);
    let fs = c.uncached_client();

    // Directories, regular files (one striped over both servers), permissions, owners, times.
    fs.mkdir("/docs", 0o755).await.unwrap();
    write_file(&fs, "/docs/readme.txt", 0o644, None, 1, 5000).await;
    write_file(&fs, "/docs/striped.bin", 0o644, striped(16 << 10), 2, 40_000).await;
    write_file(&fs, "/docs/empty", 0o600, None, 0, 0).await;
    fs.chown("/docs/empty", Some(1234), Some(5678)).await.unwrap();
    let at = |secs, nsecs| Some(TimeSet::At(Timestamp { secs, nsecs }));
    fs.utimens("/docs/empty", at(1_500_000_000, 5), at(1_600_000_000, 123_456_789)).await.unwrap();
    // Symbolic links, relative and absolute.
    fs.symlink("readme.txt", "/docs/link").await.unwrap();
    fs.symlink("/docs/striped.bin", "/docs/abs-link").await.unwrap();
    // Hard links: three names of one inode, in directories on (likely) different servers.
    fs.mkdir("/other", 0o750).await.unwrap();
    fs.link("/docs/readme.txt", "/other/readme-hard").await.unwrap();
    fs.link("/docs/readme.txt", "/docs/readme-again").await.unwrap();
    // Extended attributes on a file and a directory (binary values too).
    let readme = fs.stat("/docs/readme.txt").await.unwrap().ino;
    fs.setxattr(readme, "user.color", b"blue", false, false).await.unwrap();
    fs.setxattr(readme, "user.bin", &[0, 1, 2, 255], false, false).await.unwrap();
    let other = fs.stat("/other").await.unwrap().ino;
    fs.setxattr(other, "user.dir", b"d", false, false).await.unwrap();
    // A directory layout default, inherited by a file and copied by a subdirectory.
    fs.mkdir("/striped", 0o755).await.unwrap();
    let sd = fs.stat("/striped").await.unwrap().ino;
    fs.set_dir_layout(sd, striped(32 << 10).unwrap()).await.unwrap();
    write_file(&fs, "/striped/inherits.bin", 0o644, None, 3, 50_000).await;
    fs.mkdir("/striped/sub", 0o755).await.unwrap();
    write_file(&fs, "/striped/sub/deep.bin", 0o640, None, 4, 20_000).await;
    // A deeper tree, a sticky directory, and a rename (across servers when the homes differ).
    fs.mkdir_all("/tree/a/b/c", 0o755).await.unwrap();
    write_file(&fs, "/tree/a/b/c/leaf", 0o644, None, 5, 10).await;
    fs.mkdir("/tree/sticky", 0o1777).await.unwrap();
    write_file(&fs, "/tree/moved-from", 0o644, None, 8, 1234).await;
    fs.rename("/tree/moved-from", "/other/moved-here").await.unwrap();
    for i in 0..6 {
        fs.mkdir(&format!("/tree/d{i}"), 0o755).await.unwrap();
        write_file(&fs, &format!("/tree/d{i}/f"), 0o644, None, 10 + i, 100 * i as usize).await;
    }

    // A directory homed on server 0, for the records made while server 1 is away.
    let mut p = None;
    for i in 0..16 {
        let path = format!("/p{i}");
        let a = fs.mkdir(&path, 0o755).await.unwrap();
        if fs.home_of(a.ino).0 == 0 {
            p = Some(path);
            break;
        }
    }
    let p = p.expect("a directory homed on server 0");
    let gc = write_file(&fs, &format!("{p}/gc.bin"), 0o644, striped(16 << 10), 7, 40_000).await;
    assert_eq!(fs.home_of(gc.ino).0, 0);

    // An orphan: a file removed while this client has it open, written after the unlink.
    let orphan = fs.create("/docs/orphan", 0o644, None).await.unwrap();
    orphan.write_at(0, &pattern(6, 0, 4096)).await.unwrap();
    orphan.flush().await.unwrap();
    fs.unlink("/docs/orphan").await.unwrap();
    orphan.write_at(4096, &pattern(6, 4096, 100)).await.unwrap();
    orphan.flush().await.unwrap();
    let orphan_attr = orphan.stat().await.unwrap();
    assert_eq!((orphan_attr.nlink, orphan_attr.size), (0, 4196));

    let mut paths = walk(&fs).await;
    paths.remove(&format!("{p}/gc.bin"));

    // Server 1 stops answering: removing the striped file leaves a pending deletion of its
    // object there (`g` record on server 0), and a mkdir whose directory object goes to
    // server 1 fails with its intent kept (`t` record on server 0).
    c.signal(1, libc::SIGSTOP);
    fs.unlink(&format!("{p}/gc.bin")).await.unwrap();
    let mut pending = None;
    for i in 0..4 {
        let name = format!("pending{i}");
        match fs.mkdir(&format!("{p}/{name}"), 0o755).await {
            Ok(_) => fs.rmdir(&format!("{p}/{name}")).await.unwrap(),
            Err(_) => {
                pending = Some(name);
                break;
            }
        }
    }
    let pending = pending.expect("a mkdir whose directory object is on the stopped server");
    // The directory's attributes and entries changed meanwhile (it lives on server 0).
    let pa = fs.lstat(&p).await.unwrap();
    paths.get_mut(&p).unwrap()["attr"] = describe_attr(&pa);
    paths.get_mut(&p).unwrap()["entries"] = json!(Vec::<String>::new());

    c.stop(0);
    c.signal(1, libc::SIGCONT);
    c.stop(1);
    drop(orphan);

    let manifest = json!({
        "servers": SERVERS,
        "format": shoal_server::FORMAT_VERSION,
        "paths": paths,
        "orphan": { "ino": orphan_attr.ino.0, "attr": describe_attr(&orphan_attr), "data": fnv(&pattern(6, 0, 4196)) },
        "gc": { "ino": gc.ino.0, "servers": gc.layout.as_ref().unwrap().servers.iter().map(|s| s.0).collect::<Vec<_>>() },
        "pending_mkdir": { "parent": p, "name": pending },
    });
    std::fs::write(c.path().join("manifest.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();

    let out = std::env::var_os("SHOAL_FIXTURE_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixtures().join(format!("format-{}.tar.gz", shoal_server::FORMAT_VERSION)));
    // A committed fixture stands for stores in the field: never overwritten by newer code.
    assert!(
        !out.exists() || std::env::var_os("SHOAL_FIXTURE_OUT").is_some(),
        "{} exists; set SHOAL_FIXTURE_OUT to write elsewhere",
        out.display()
    );
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    // The reserve file (`store::space`) is only a placeholder for free space.
    let status = Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0"])
        .args(["--exclude=s0/reserve", "--exclude=s1/reserve", "-czf"])
        .arg(&out)
        .arg("-C")
        .arg(c.path())
        .args(["manifest.json", "s0", "s1"])
        .status()
        .unwrap();
    assert!(status.success(), "tar failed");
    eprintln!("wrote {}", out.display());
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Object files of `ino` on server `id`'s disk.
fn object_files(c: &Cluster, id: u32, ino: u64) -> Vec<PathBuf> {
    let bucket = c.path().join(format!("s{id}/objects/{:02x}", ino & 0xff));
    let prefix = format!("{ino:016x}.");
    match std::fs::read_dir(&bucket) {
        Ok(rd) => {
            rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).map(|e| e.path()).collect()
        }
        Err(_) => Vec::new(),
    }
}

/// Format 5 gave files a parent pointer (the directory of one of their names): check it,
/// set the pointers of `got`'s files back to none as the older formats stored them, and
/// return what `shoal du /` must add up to: the files with a parent, every directory.
fn parents_given_by_the_upgrade(got: &mut BTreeMap<String, Value>) -> (u64, u64, u64) {
    let dir_ino = |path: &str, got: &BTreeMap<String, Value>| {
        let up = match path.rsplit_once('/') {
            Some(("", _)) => "/",
            Some((up, _)) => up,
            None => "/",
        };
        got[up]["attr"]["ino"].as_u64()
    };
    let mut names: BTreeMap<u64, Vec<Option<u64>>> = BTreeMap::new();
    let mut sizes: BTreeMap<u64, (u64, Option<u64>)> = BTreeMap::new();
    let mut dirs = 0;
    for (path, v) in got.iter() {
        let a = &v["attr"];
        if a["kind"] == "Dir" {
            dirs += u64::from(path != "/");
            continue;
        }
        let ino = a["ino"].as_u64().unwrap();
        names.entry(ino).or_default().push(dir_ino(path, got));
        sizes.insert(ino, (a["size"].as_u64().unwrap(), a["parent"].as_u64()));
    }
    let (mut files, mut bytes) = (0, 0);
    for (ino, (size, parent)) in &sizes {
        if let Some(p) = parent {
            assert!(names[ino].contains(&Some(*p)), "inode {ino}'s parent {p} is the directory of none of its names");
            files += 1;
            bytes += size;
        }
    }
    for v in got.values_mut() {
        if v["attr"]["kind"] != "Dir" {
            v["attr"]["parent"] = Value::Null;
        }
    }
    (files, dirs, bytes)
}

/// The namespace, the orphan and the records left between two steps read back as the
/// manifest says the old code served them.
async fn check_against_manifest(c: &Cluster, manifest: &Value) {
    let fs = c.uncached_client();
    let mut got = walk(&fs).await;
    let want = manifest["paths"].as_object().unwrap();
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "paths of the namespace");
    let counted = parents_given_by_the_upgrade(&mut got);
    for (path, w) in want {
        let mut w = w.clone();
        if w["attr"]["kind"] != "Dir" && manifest["format"].as_u64() < Some(5) {
            w["attr"]["parent"] = Value::Null;
        }
        assert_eq!(got[path], w, "{path} reads back as written");
    }
    // The orphan (no name, link count 0) is still there, with its data, for its grace period.
    let o = &manifest["orphan"];
    let ino = Ino(o["ino"].as_u64().unwrap());
    assert_eq!(describe_attr(&fs.getattr_fresh(ino).await.unwrap()), o["attr"], "orphan {ino}");
    assert_eq!(json!(fnv(&read_all(&fs, ino).await)), o["data"], "orphan {ino}'s data");
    // The unfinished mkdir was rolled back (its intent decoded and replayed) and never
    // shows; the pending deletion of the removed file's objects ran.
    let p = &manifest["pending_mkdir"];
    let path = format!("{}/{}", p["parent"].as_str().unwrap(), p["name"].as_str().unwrap());
    match fs.lstat(&path).await {
        Err(e) => assert_eq!(e.errno, shoal_client::Errno::ENOENT, "{path}: {e}"),
        Ok(a) => panic!("{path} exists: {a:?}"),
    }
    let gc_ino = manifest["gc"]["ino"].as_u64().unwrap();
    let objects_gone =
        wait_until(Duration::from_secs(60), || (0..SERVERS).all(|id| object_files(c, id, gc_ino).is_empty()));
    assert!(objects_gone, "objects of the removed file {gc_ino:#x} still on disk");
    let mut intents_done = false;
    for _ in 0..600 {
        let mut pending = 0;
        for (_, st) in fs.status_all().await {
            pending += st.unwrap().pending_intents;
        }
        if pending == 0 {
            intents_done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(intents_done, "intents still pending after 60 s");
    // Once the unfinished mkdir's directory object is gone too.
    let top = fs.du("/", 0).await.unwrap().dirs.pop().unwrap();
    assert_eq!((top.files, top.dirs, top.bytes), counted, "du / after the upgrade");
}

fn unpack(archive: &Path, into: &Path) {
    let status = Command::new("tar").arg("-xzf").arg(archive).arg("-C").arg(into).status().expect("run tar");
    assert!(status.success(), "tar -xzf {} failed", archive.display());
}

/// The fixture of `format` starts under this code, is upgraded in place, reads back as the
/// old code served it, and reads the same after a restart without a second upgrade.
async fn a_store_is_upgraded_in_place_and_reads_back_as_written(format: u32) {
    let archive = fixtures().join(format!("format-{format}.tar.gz"));
    let mut c = Cluster::start_prepared(SERVERS, |dir| unpack(&archive, dir));
    let manifest: Value = serde_json::from_slice(&std::fs::read(c.path().join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], format);
    let current = shoal_server::FORMAT_VERSION;
    for id in 0..SERVERS {
        let log = c.log(id);
        assert!(
            log.contains(&format!("from format {format} to {current}"))
                && log.contains(&format!("metadata store upgraded to format {current}")),
            "server {id} did not log its upgrade:\n{log}"
        );
    }
    check_against_manifest(&c, &manifest).await;

    // The store now says the current format, and reads the same after a restart.
    for id in 0..SERVERS {
        c.stop(id);
        let meta = c.path().join(format!("s{id}/meta"));
        assert_eq!(shoal_server::stored_format(&meta).unwrap(), Some(current));
    }
    let first_logs: Vec<usize> = (0..SERVERS).map(|id| c.log(id).len()).collect();
    for id in 0..SERVERS {
        c.restart(id);
    }
    check_against_manifest(&c, &manifest).await;
    for id in 0..SERVERS {
        let log = c.log(id);
        let second = &log[first_logs[id as usize]..];
        assert!(!second.contains("upgrading"), "server {id} upgraded twice:\n{second}");
        assert!(!log.contains("does not decode"), "server {id}:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_store_is_upgraded_in_place_and_reads_back_as_written() {
    a_store_is_upgraded_in_place_and_reads_back_as_written(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_2_store_is_upgraded_in_place_and_reads_back_as_written() {
    a_store_is_upgraded_in_place_and_reads_back_as_written(2).await;
}

/// Format 3 differs from the current one in its entry keys only (name order, not listing
/// order): every entry must be found again by lookup and listed once after the upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_3_store_is_upgraded_in_place_and_reads_back_as_written() {
    a_store_is_upgraded_in_place_and_reads_back_as_written(3).await;
}

/// Format 4 differs from the current one in its files' parent pointers and usage records
/// only: files get the directory of a name of theirs, and `du` adds up to what they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_4_store_is_upgraded_in_place_and_reads_back_as_written() {
    a_store_is_upgraded_in_place_and_reads_back_as_written(4).await;
}

/// A store written by a newer shoald (a higher format version under `m` "format", see
/// docs/formats.md) is refused at start, with one line naming both versions, and left as is.
#[test]
fn a_store_of_a_newer_format_is_refused_with_one_line_naming_both_versions() {
    let mut c = Cluster::start(1);
    c.stop(0);
    let meta = c.path().join("s0/meta");
    let newer = shoal_server::FORMAT_VERSION + 1;
    {
        let db = rocksdb::DB::open_default(&meta).unwrap();
        db.put(b"mformat", newer.to_be_bytes()).unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoald"))
        .arg("--config")
        .arg(&c.config)
        .args(["--id", "0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = wait_until(Duration::from_secs(30), || matches!(child.try_wait(), Ok(Some(_))));
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
        panic!("shoald served a store of format {newer}");
    }
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("shoald: data directory"), "{err}");
    assert!(last.contains(&format!("format {newer}")) && last.contains(&format!("format {}", newer - 1)), "{err}");
    assert_eq!(shoal_server::stored_format(&meta).unwrap(), Some(newer), "the store is left as it was");
}
