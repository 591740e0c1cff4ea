//! The replica count as a file's and a directory's setting (docs/replicas.md), on real
//! servers: inherited from a directory's default by files and by `mkdir`, asked for per
//! file, capped to the cluster's count, refused outside 1 to 3 in one line, and the same
//! through the C library. (Python's round trip is in `crates/python/tests/test_layout.py`.)

use shoal_client::{Client, Errno, LayoutSpec};
use shoal_testkit::Cluster;

/// Three servers keeping two copies of their metadata: files get 2 unless they ask for 1,
/// and 3 is capped to 2.
fn cluster() -> Cluster {
    Cluster::start_with(3, |m| m.cluster.replicas = 2)
}

fn replicas(n: u8) -> LayoutSpec {
    LayoutSpec { replicas: Some(n), ..LayoutSpec::default() }
}

async fn file_replicas(fs: &Client, path: &str) -> u8 {
    let a = fs.stat(path).await.unwrap_or_else(|e| panic!("stat {path}: {e}"));
    a.layout.unwrap_or_else(|| panic!("{path} has no layout")).replicas
}

/// `shoal ARGS`, which must succeed; its stdout and stderr.
fn ok(c: &Cluster, args: &[&str]) -> (String, String) {
    let (code, out, err) = c.shoal(args);
    assert_eq!(code, 0, "shoal {args:?}: {err}");
    (out, err)
}

/// `shoal ARGS`, which must fail with one line on stderr; that line.
fn refused(c: &Cluster, args: &[&str]) -> String {
    let (code, _, err) = c.shoal(args);
    assert_ne!(code, 0, "shoal {args:?} must fail");
    assert_eq!(err.trim_end().lines().count(), 1, "shoal {args:?}: one line: {err}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_default_is_inherited_by_files_and_by_mkdir() {
    let c = cluster();
    let fs = c.client();
    // Nothing set anywhere: the cluster's count.
    fs.create("/plain", 0o644, None).await.unwrap().close().await.unwrap();
    assert_eq!(file_replicas(&fs, "/plain").await, 2);

    fs.mkdir("/one", 0o755).await.unwrap();
    ok(&c, &["setstripe", "-r", "1", "shoal://one"]);
    let (out, _) = ok(&c, &["getstripe", "shoal://one"]);
    assert!(out.contains("replicas 1"), "{out}");
    // (A client that set nothing itself: `fs` may hold the attributes from its mkdir.)
    let fresh = c.uncached_client();
    assert_eq!(fresh.stat("/one").await.unwrap().dir_default.unwrap().replicas, Some(1));

    // Files created in it by any path take the default: the native API, `shoal cp`,
    // `shoal setstripe` on a new file that asks only for a stripe size.
    let f = fs.create("/one/native", 0o644, None).await.unwrap();
    assert_eq!(f.layout().replicas, 1);
    f.close().await.unwrap();
    let local = c.path().join("local");
    std::fs::write(&local, b"some bytes").unwrap();
    ok(&c, &["cp", local.to_str().unwrap(), "shoal://one/copied"]);
    assert_eq!(file_replicas(&fs, "/one/copied").await, 1);
    ok(&c, &["setstripe", "-S", "64K", "shoal://one/striped"]);
    assert_eq!(file_replicas(&fs, "/one/striped").await, 1);

    // mkdir copies the default, so files further down inherit it too.
    fs.mkdir("/one/sub", 0o755).await.unwrap();
    assert_eq!(fs.stat("/one/sub").await.unwrap().dir_default.unwrap().replicas, Some(1));
    fs.create("/one/sub/deep", 0o644, None).await.unwrap().close().await.unwrap();
    assert_eq!(file_replicas(&fs, "/one/sub/deep").await, 1);

    // What a file was given stays: changing the default changes only new files.
    ok(&c, &["setstripe", "-r", "2", "shoal://one"]);
    fs.create("/one/later", 0o644, None).await.unwrap().close().await.unwrap();
    assert_eq!(file_replicas(&fs, "/one/later").await, 2);
    assert_eq!(file_replicas(&fs, "/one/native").await, 1);
    // A fresh client (no cached attributes) reads the stored counts back.
    assert_eq!(file_replicas(&fresh, "/one/copied").await, 1);
    assert_eq!(file_replicas(&fresh, "/plain").await, 2);

    // `shoal stat` and `shoal getstripe` show a file's count.
    let (out, _) = ok(&c, &["stat", "shoal://one/native"]);
    assert!(out.contains("replicas=1"), "{out}");
    let (out, _) = ok(&c, &["getstripe", "shoal://plain"]);
    assert!(out.contains("replicas:     2"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_asks_for_its_own_count_and_more_than_the_cluster_keeps_is_capped() {
    let c = cluster();
    let fs = c.client();
    fs.mkdir("/d", 0o755).await.unwrap();
    fs.set_layout("/d", replicas(2)).await.unwrap();
    // The request before the directory's default.
    let f = fs.create("/d/single", 0o644, Some(replicas(1))).await.unwrap();
    assert_eq!(f.layout().replicas, 1);
    f.close().await.unwrap();
    let local = c.path().join("local");
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&local, &bytes).unwrap();
    ok(&c, &["cp", "--replicas", "1", local.to_str().unwrap(), "shoal://d/cp1"]);
    assert_eq!(file_replicas(&fs, "/d/cp1").await, 1);

    // Three asked, two kept (the cluster's metadata count), and the CLI says so.
    let (_, err) = ok(&c, &["setstripe", "-r", "3", "-c", "3", "-S", "64K", "shoal://d/three"]);
    assert!(err.contains("3 replicas asked, but the cluster keeps 2 copies"), "{err}");
    assert_eq!(file_replicas(&fs, "/d/three").await, 2);
    let f = fs.create("/d/three-native", 0o644, Some(replicas(3))).await.unwrap();
    assert_eq!(f.layout().replicas, 2);
    f.close().await.unwrap();
    // A directory's default keeps what was asked (it takes effect if the cluster's count
    // is raised) and its files get the cap.
    fs.mkdir("/d3", 0o755).await.unwrap();
    ok(&c, &["setstripe", "-r", "3", "shoal://d3"]);
    let (out, _) = ok(&c, &["getstripe", "shoal://d3"]);
    assert!(out.contains("replicas 3 (capped to the cluster's 2)"), "{out}");
    fs.create("/d3/f", 0o644, None).await.unwrap().close().await.unwrap();
    assert_eq!(file_replicas(&fs, "/d3/f").await, 2);

    // Data of a file with two copies striped over three servers: written (Write with
    // copies), cut (PeerTruncateObject with copies) and read back.
    ok(&c, &["cp", "--replicas", "2", local.to_str().unwrap(), "shoal://d/three"]);
    let f = fs.open("/d/three", shoal_client::OpenFlags::read_write()).await.unwrap();
    assert_eq!(f.layout().replicas, 2);
    assert_eq!(f.layout().servers.len(), 3);
    assert_eq!(&f.read_at(0, bytes.len()).await.unwrap()[..], &bytes[..]);
    f.set_len(100_000).await.unwrap();
    f.close().await.unwrap();
    let f = c.uncached_client().open("/d/three", shoal_client::OpenFlags::read_only()).await.unwrap();
    assert_eq!(f.attr().size, 100_000);
    assert_eq!(&f.read_at(0, 200_000).await.unwrap()[..], &bytes[..100_000]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_replica_counts_are_refused_with_a_clear_message() {
    let c = cluster();
    let fs = c.client();
    fs.mkdir("/d", 0o755).await.unwrap();
    // The CLI: one line naming the count and what is allowed, before anything is done.
    for bad in ["0", "4", "-1", "300"] {
        let err = refused(&c, &["setstripe", "-r", bad, "shoal://d"]);
        assert!(err.contains(&format!("replica count {bad} must be 1 to 3")), "{err}");
        let err = refused(&c, &["setstripe", "-r", bad, "shoal://d/new"]);
        assert!(err.contains(&format!("replica count {bad} must be 1 to 3")), "{err}");
    }
    let local = c.path().join("local");
    std::fs::write(&local, b"x").unwrap();
    let err = refused(&c, &["cp", "--replicas", "9", local.to_str().unwrap(), "shoal://d/copy"]);
    assert!(err.contains("replica count 9 must be 1 to 3"), "{err}");
    let fresh = c.uncached_client();
    assert_eq!(fresh.stat("/d/copy").await.unwrap_err().errno, Errno::ENOENT, "nothing was copied");
    assert_eq!(fresh.stat("/d/new").await.unwrap_err().errno, Errno::ENOENT, "nothing was created");
    assert_eq!(fresh.stat("/d").await.unwrap().dir_default, None, "the default is unchanged");

    // The servers refuse the same with EINVAL and the reason, whoever sends it.
    for bad in [0u8, 4, 255] {
        let e = fs.create("/d/f", 0o644, Some(replicas(bad))).await.unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL, "{e}");
        assert!(e.to_string().contains(&format!("replica count {bad} must be 1 to 3")), "{e}");
        let e = fs.set_layout("/d", replicas(bad)).await.unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL, "{e}");
        assert!(e.to_string().contains(&format!("replica count {bad} must be 1 to 3")), "{e}");
    }
    assert_eq!(fs.stat("/d/f").await.unwrap_err().errno, Errno::ENOENT);

    // A cluster map asking for more copies than there are servers, or out of range, is
    // refused in one line naming the field.
    for (value, says) in [
        (4, "cluster.replicas 4 must be 1 to 3"),
        (3, "cluster.replicas 3 is more than the 2 servers that can hold data"),
    ] {
        let mut map = shoal_client::ClusterMap::load(&c.config).unwrap();
        map.servers.truncate(2);
        map.cluster.replicas = value;
        let bad = c.path().join(format!("bad-{value}.toml"));
        std::fs::write(&bad, map.to_toml()).unwrap();
        let (code, _, err) = shoal_testkit::shoal_cmd(Some(&bad), &["getstripe", "/"]);
        assert_ne!(code, 0);
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(says), "{err}");
    }
}

/// The C library's `shoal_layout.replicas`: set on a directory and read back, inherited,
/// asked for per file, capped, and refused outside 0 to 3 (`tests/c/replicas.c`). Built as
/// `c_api.rs` builds its programs.
#[test]
fn c_programs_set_and_read_replica_counts() {
    let lib = shoal_testkit::build_c_library("shoal-capi", &["libshoal.so", "shoal.pc", "include/shoal.h"]);
    let tmp = tempfile::tempdir().unwrap();
    let c = cluster();
    let src = shoal_testkit::manifest_dir().join("tests/c/replicas.c");
    let exe = tmp.path().join("replicas");
    let pc = std::process::Command::new("pkg-config")
        .args(["--cflags", "--libs", "shoal"])
        .env("PKG_CONFIG_PATH", &lib)
        .output()
        .expect("run pkg-config");
    assert!(pc.status.success(), "pkg-config shoal: {}", String::from_utf8_lossy(&pc.stderr));
    let out = std::process::Command::new("gcc")
        .args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(String::from_utf8(pc.stdout).unwrap().split_whitespace())
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .output()
        .expect("run gcc");
    assert!(out.status.success(), "gcc replicas.c:\n{}", String::from_utf8_lossy(&out.stderr));
    let out = std::process::Command::new(&exe).arg(&c.config).output().expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "replicas.c failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
