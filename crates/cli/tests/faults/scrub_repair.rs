//! `shoal scrub` repairs from a good copy (docs/scrub.md, "Repair"), on real clusters with
//! `replicas = 2`: a block damaged on disk, an object file deleted or cut short, on the
//! primary or in the mirror's copy, is rewritten from the other copy; the file then reads
//! back right and the next scrub is clean. With one copy the damage is reported as
//! unrepairable, with a non-zero exit status.

use shoal_client::{Client, ClientOptions, Errno, LayoutSpec, OpenFlags};
use shoal_testkit::{pattern, Cluster};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

const BLOCK: u64 = 64 << 10;

/// A client that caches nothing and reads exactly the ranges asked.
fn direct_client(c: &Cluster) -> Client {
    let opts = ClientOptions {
        cache_ttl: Duration::ZERO,
        readahead: 0,
        write_behind: 0,
        timeout: Duration::from_secs(20),
        ..c.options()
    };
    Client::from_config(&c.config, opts).unwrap()
}

/// A file of one object (one stripe) holding `body`.
async fn write_file(fs: &Client, path: &str, body: &[u8]) {
    let layout = LayoutSpec { stripe_count: Some(1), ..Default::default() };
    let f = fs.create(path, 0o644, Some(layout)).await.unwrap();
    f.write_at(0, body).await.unwrap();
    f.close().await.unwrap();
}

async fn read_all(fs: &Client, path: &str, len: usize) -> Result<Vec<u8>, shoal_client::Error> {
    let f = fs.open(path, OpenFlags::read_only()).await.unwrap();
    let got = f.read_at(0, len).await;
    f.close().await.unwrap();
    got.map(|b| b.to_vec())
}

/// Object 0 of the file at `path`: its primary server, the primary's object file, the
/// server mirroring it and the mirror's copy of that file
/// (`<data_dir>/mirror-<slot>/objects/<bucket>/<ino>.0`).
async fn copies(c: &Cluster, fs: &Client, path: &str) -> (u32, PathBuf, u32, PathBuf) {
    let attr = fs.stat(path).await.unwrap();
    let slot = attr.layout.as_ref().unwrap().servers[0].0;
    let ino = attr.ino.0;
    let rel = PathBuf::from(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}.0"));
    let dir = |id: u32| c.map.servers[id as usize].data_dir.clone().unwrap();
    let mirror = (slot + 1) % c.map.servers.len() as u32;
    (slot, dir(slot).join("objects").join(&rel), mirror, dir(mirror).join(format!("mirror-{slot}/objects")).join(&rel))
}

fn flip(file: &PathBuf, offset: u64) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(file).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, offset).unwrap();
    f.write_all_at(&[b[0] ^ 0x20], offset).unwrap();
}

/// `shoal scrub --json`: its exit status and each server's row, by id.
fn scrub(c: &Cluster) -> (i32, Vec<serde_json::Value>) {
    let (code, out, err) = c.shoal(&["scrub", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    (code, v["servers"].as_array().unwrap().clone())
}

/// The (corrupt, repaired, unrepairable) counts of server `id`'s row.
fn counts(rows: &[serde_json::Value], id: u32) -> (u64, u64, u64) {
    let r = rows.iter().find(|r| r["id"] == id).unwrap();
    (r["corrupt"].as_u64().unwrap(), r["repaired"].as_u64().unwrap(), r["unrepairable"].as_u64().unwrap())
}

fn total_corrupt(rows: &[serde_json::Value]) -> u64 {
    rows.iter().map(|r| r["corrupt"].as_u64().unwrap()).sum()
}

fn replicated() -> Cluster {
    Cluster::start_with(3, |m| m.cluster.replicas = 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_on_the_primary_is_repaired_from_the_mirror_and_reads_back_right() {
    let c = replicated();
    let fs = direct_client(&c);
    let len = 5 * BLOCK as usize + 1000;
    let body = pattern(11, 0, len);
    write_file(&fs, "/flipped", &body).await;
    write_file(&fs, "/deleted", &body).await;
    write_file(&fs, "/cut", &body).await;
    let (code, rows) = scrub(&c);
    assert_eq!((code, total_corrupt(&rows)), (0, 0), "a clean cluster: {rows:?}");
    // The files' primary verified its objects, and its mirror's server its copies.
    let (slot, _, mirror, _) = copies(&c, &fs, "/flipped").await;
    for id in [slot, mirror] {
        let r = rows.iter().find(|r| r["id"] == id).unwrap();
        assert!(r["blocks"].as_u64().unwrap() >= 6, "{r}");
    }

    // A flipped byte in block 1 of the primary's file: reads fail until the scrub repairs it.
    let (slot, file, _, _) = copies(&c, &fs, "/flipped").await;
    flip(&file, BLOCK + 77);
    assert_eq!(read_all(&fs, "/flipped", len).await.unwrap_err().errno, Errno::EIO);
    let (code, rows) = scrub(&c);
    assert_eq!(code, 0, "all damage repaired: {rows:?}");
    assert_eq!(counts(&rows, slot), (1, 1, 0), "{rows:?}");
    let row = rows.iter().find(|r| r["id"] == slot).unwrap();
    let e = &row["errors"][0];
    assert_eq!(
        (e["name"].as_str().unwrap(), e["offset"].as_u64(), e["repaired"].as_bool()),
        (file.to_str().unwrap(), Some(BLOCK), Some(true))
    );
    assert!(e["message"].as_str().unwrap().contains("repaired from server"), "{e}");
    assert!(read_all(&fs, "/flipped", len).await.unwrap() == body);

    // The object file deleted (its checksum file left): reads as nothing until repaired.
    let (slot, file, _, mirror_copy) = copies(&c, &fs, "/deleted").await;
    std::fs::remove_file(&file).unwrap();
    let (code, rows) = scrub(&c);
    assert_eq!(code, 0, "{rows:?}");
    assert_eq!(counts(&rows, slot), (1, 1, 0), "{rows:?}");
    assert_eq!(std::fs::read(&file).unwrap(), std::fs::read(&mirror_copy).unwrap(), "restored byte for byte");
    assert!(read_all(&fs, "/deleted", len).await.unwrap() == body);

    // The object file cut short in the middle of block 2: blocks 2 to 5 are damaged.
    let (slot, file, _, _) = copies(&c, &fs, "/cut").await;
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(2 * BLOCK + 500).unwrap();
    let (code, rows) = scrub(&c);
    assert_eq!(code, 0, "{rows:?}");
    let (corrupt, repaired, unrepairable) = counts(&rows, slot);
    assert!(corrupt >= 1 && repaired == corrupt && unrepairable == 0, "{rows:?}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), len as u64);
    assert!(read_all(&fs, "/cut", len).await.unwrap() == body);

    // Nothing is left to find, on the primaries or in the mirrors' copies they shipped to.
    let (code, rows) = scrub(&c);
    assert_eq!((code, total_corrupt(&rows)), (0, 0), "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_in_a_mirror_copy_is_repaired_from_the_primary() {
    let c = replicated();
    let fs = direct_client(&c);
    let len = 3 * BLOCK as usize + 10;
    let body = pattern(12, 0, len);
    write_file(&fs, "/flipped", &body).await;
    write_file(&fs, "/deleted", &body).await;

    let (_, primary, mirror, copy) = copies(&c, &fs, "/flipped").await;
    flip(&copy, 2 * BLOCK + 5);
    let (code, rows) = scrub(&c);
    assert_eq!(code, 0, "{rows:?}");
    assert_eq!(counts(&rows, mirror), (1, 1, 0), "the mirror's server repairs its copy: {rows:?}");
    let row = rows.iter().find(|r| r["id"] == mirror).unwrap();
    assert_eq!(row["errors"][0]["name"].as_str().unwrap(), copy.to_str().unwrap());
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&primary).unwrap());

    let (_, primary, mirror, copy) = copies(&c, &fs, "/deleted").await;
    std::fs::remove_file(&copy).unwrap();
    let (code, rows) = scrub(&c);
    assert_eq!(code, 0, "{rows:?}");
    assert_eq!(counts(&rows, mirror), (1, 1, 0), "{rows:?}");
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&primary).unwrap());

    let (code, rows) = scrub(&c);
    assert_eq!((code, total_corrupt(&rows)), (0, 0), "{rows:?}");
    assert!(read_all(&fs, "/flipped", len).await.unwrap() == body);
    assert!(read_all(&fs, "/deleted", len).await.unwrap() == body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_copy_damage_is_unrepairable_and_the_exit_status_says_so() {
    let c = Cluster::start(2);
    let fs = direct_client(&c);
    let len = 2 * BLOCK as usize;
    write_file(&fs, "/f", &pattern(13, 0, len)).await;
    let attr = fs.stat("/f").await.unwrap();
    let slot = attr.layout.as_ref().unwrap().servers[0].0;
    let ino = attr.ino.0;
    let file = c.map.servers[slot as usize]
        .data_dir
        .clone()
        .unwrap()
        .join("objects")
        .join(format!("{:02x}", ino & 0xff))
        .join(format!("{ino:016x}.0"));
    flip(&file, 10);
    let (code, rows) = scrub(&c);
    assert_eq!(code, 3, "{rows:?}");
    assert_eq!(counts(&rows, slot), (1, 0, 1), "{rows:?}");
    let e = &rows.iter().find(|r| r["id"] == slot).unwrap()["errors"][0];
    assert_eq!(e["repaired"].as_bool(), Some(false));
    assert!(e["message"].as_str().unwrap().contains("replicas = 1"), "{e}");
    // The table says it in one line per finding, and the summary on stderr.
    let (code, out, err) = c.shoal(&["scrub"]);
    assert_eq!(code, 3);
    assert!(out.contains("DAMAGED") && out.contains("not repaired"), "{out}");
    assert!(err.contains("could not repair"), "{err}");
    assert_eq!(read_all(&fs, "/f", len).await.unwrap_err().errno, Errno::EIO);
}

/// Refetch the map until `ok` holds of it, for at most `within`.
async fn wait_map_until(fs: &Client, within: Duration, what: &str, ok: impl Fn(&shoal_placement::ClusterMap) -> bool) {
    let until = std::time::Instant::now() + within;
    loop {
        if fs.refresh_map().await.is_ok() && ok(fs.map()) {
            return;
        }
        assert!(std::time::Instant::now() < until, "{what}: not within {within:?}: {:?}", fs.map().servers);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 51: after one `kill -9` with replicas 2, `shoal scrub` called the server now
/// serving the dead one's slot DAMAGED ("record mreplica: key of no known kind", exit 3):
/// the store it serves from is a mirror's, which holds its replication position. Every kind
/// of record is known now; the scrub is clean while the copy serves and after the return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_served_from_its_mirror_after_kill9_scrubs_clean() {
    let mut c = replicated();
    let fs = direct_client(&c);
    for i in 0..12 {
        write_file(&fs, &format!("/f{i}"), &pattern(i, 0, 20_000 + i as usize)).await;
    }
    c.kill9(1);
    wait_map_until(&fs, Duration::from_secs(30), "slot 1 served by its mirror", |m| m.servers[1].served_by.is_some())
        .await;
    let (code, rows) = scrub(&c);
    assert_eq!((code, total_corrupt(&rows)), (0, 0), "while the mirror serves: {rows:?}");
    c.restart(1);
    wait_map_until(&fs, Duration::from_secs(60), "server 1 back, every copy in sync", |m| {
        m.servers.iter().all(|e| e.served_by.is_none() && e.behind.is_empty())
    })
    .await;
    let (code, rows) = scrub(&c);
    assert_eq!((code, total_corrupt(&rows)), (0, 0), "after the return: {rows:?}");
    for i in 0..12 {
        assert_eq!(
            read_all(&fs, &format!("/f{i}"), 20_000 + i as usize).await.unwrap(),
            pattern(i, 0, 20_000 + i as usize)
        );
    }
}
