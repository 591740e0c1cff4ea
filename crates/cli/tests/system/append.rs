//! Appends (`O_APPEND`, the native API's append mode) from many clients at once, on real
//! clusters: every append lands whole, at its own place at the end of the file, and none is
//! lost — as on a local file system — whether the writers are FUSE mounts, native clients or
//! both, and whether the file is striped or not.

use shoal_client::{Client, OpenFlags};
use shoal_proto::msg::LayoutSpec;
use shoal_testkit::mount::{skip_without_fuse, Mount};
use shoal_testkit::Cluster;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

/// Size of the small records: does not divide the 64 KiB stripes, so records straddle
/// stripe (and server) boundaries.
const REC: usize = 100;

/// Record `seq` of writer `writer`, `len` bytes: a header naming both, then a fill byte
/// that depends on both, then a newline.
fn record(writer: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut r = format!("w{writer:02} s{seq:06} ").into_bytes();
    let fill = b'a' + ((writer * 7 + seq) % 26) as u8;
    r.resize(len - 1, fill);
    r.push(b'\n');
    r
}

/// Check that `data` is made of `len`-byte records, exactly `count` of each of `writers`,
/// each intact, each writer's in the order it appended them.
fn check_records(data: &[u8], writers: &[u32], count: u32, len: usize) {
    let total = writers.len() * count as usize;
    // Per writer, the sequence numbers of its intact records, in file order.
    let mut seen: std::collections::BTreeMap<u32, Vec<u32>> = writers.iter().map(|&w| (w, Vec::new())).collect();
    let mut damaged = Vec::new();
    for (i, chunk) in data.chunks(len).enumerate() {
        let head = std::str::from_utf8(&chunk[..chunk.len().min(12)]).unwrap_or("");
        let parsed = (|| {
            let w: u32 = head.get(1..3)?.parse().ok()?;
            let s: u32 = head.get(5..11)?.parse().ok()?;
            Some((w, s))
        })();
        match parsed {
            Some((w, s)) if seen.contains_key(&w) && chunk == &record(w, s, len)[..] => {
                seen.get_mut(&w).unwrap().push(s)
            }
            _ => damaged.push(i),
        }
    }
    let report: Vec<String> = seen
        .iter()
        .map(|(w, s)| {
            let distinct: std::collections::BTreeSet<_> = s.iter().collect();
            let ordered = s.windows(2).all(|p| p[0] < p[1]);
            format!("writer {w}: {} intact, {} distinct of {count}, in order: {ordered}", s.len(), distinct.len())
        })
        .collect();
    let want: Vec<u32> = (0..count).collect();
    assert!(
        damaged.is_empty() && data.len() == total * len && seen.values().all(|s| *s == want),
        "size {} for {} records of {len} bytes; {} damaged records (first at {:?}); {}",
        data.len(),
        total,
        damaged.len(),
        damaged.first(),
        report.join("; ")
    );
}

/// Append `count` records of `len` bytes as `writer` through a descriptor opened with
/// O_APPEND (one write(2) each).
fn append_posix(path: PathBuf, writer: u32, count: u32, len: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        for s in 0..count {
            f.write_all(&record(writer, s, len)).unwrap();
        }
    })
}

/// Append `count` records of `len` bytes as `writer` with a client of its own, in the
/// native API's append mode.
async fn append_native(cluster: &Cluster, path: &str, writer: u32, count: u32, len: usize) {
    let client = cluster.client();
    let f = client.open(path, OpenFlags { append: true, ..Default::default() }).await.unwrap();
    for s in 0..count {
        assert_eq!(f.write(&record(writer, s, len)).await.unwrap(), len);
    }
    f.close().await.unwrap();
}

async fn read_all(cluster: &Cluster, path: &str) -> Vec<u8> {
    let f = cluster.uncached_client().open(path, OpenFlags::read_only()).await.unwrap();
    let size = f.attr().size;
    let data = f.read_at(0, size as usize).await.unwrap();
    assert_eq!(data.len() as u64, size);
    data.to_vec()
}

async fn create(client: &Client, path: &str, stripes: u32) {
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(stripes), ..Default::default() };
    client.create(path, 0o666, Some(spec)).await.unwrap().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_from_three_fuse_mounts_keep_every_record_once_and_whole() {
    if skip_without_fuse() {
        return;
    }
    let cluster = Cluster::start(4);
    let client = cluster.client();
    create(&client, "/plain", 1).await;
    create(&client, "/striped", 4).await;
    let mounts: Vec<Mount> = (0..3).map(|_| Mount::new(&cluster, &[])).collect();
    for name in ["plain", "striped"] {
        let writers: Vec<_> =
            mounts.iter().enumerate().map(|(w, m)| append_posix(m.p(name), w as u32, 2000, REC)).collect();
        for w in writers {
            w.join().unwrap();
        }
        let data = read_all(&cluster, &format!("/{name}")).await;
        check_records(&data, &[0, 1, 2], 2000, REC);
        // Every mount agrees on the size.
        for m in &mounts {
            assert_eq!(std::fs::metadata(m.p(name)).unwrap().len(), 3 * 2000 * REC as u64, "{name}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn native_clients_append_concurrently_to_striped_and_unstriped_files() {
    let cluster = Cluster::start(4);
    let client = cluster.client();
    for (path, stripes) in [("/plain", 1), ("/striped", 4)] {
        create(&client, path, stripes).await;
        let writers = (0..4).map(|w| append_native(&cluster, path, w, 1000, REC));
        futures::future::join_all(writers).await;
        check_records(&read_all(&cluster, path).await, &[0, 1, 2, 3], 1000, REC);
    }
    // Records larger than a stripe: each one spans three or four servers.
    create(&client, "/big", 4).await;
    let writers = (0..3).map(|w| append_native(&cluster, "/big", w, 8, 150_000));
    futures::future::join_all(writers).await;
    check_records(&read_all(&cluster, "/big").await, &[0, 1, 2], 8, 150_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fuse_mounts_and_native_clients_append_to_one_file_together() {
    if skip_without_fuse() {
        return;
    }
    let cluster = Cluster::start(4);
    let client = cluster.client();
    create(&client, "/mixed", 4).await;
    let mounts: Vec<Mount> = (0..2).map(|_| Mount::new(&cluster, &[])).collect();
    let posix: Vec<_> =
        mounts.iter().enumerate().map(|(w, m)| append_posix(m.p("mixed"), w as u32, 1000, REC)).collect();
    let native = (2..4).map(|w| append_native(&cluster, "/mixed", w, 1000, REC));
    futures::future::join_all(native).await;
    for w in posix {
        w.join().unwrap();
    }
    check_records(&read_all(&cluster, "/mixed").await, &[0, 1, 2, 3], 1000, REC);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_a_server_cannot_store_fails_and_leaves_the_size_as_it_was() {
    let mut cluster = Cluster::start(4);
    let client = cluster.client();
    create(&client, "/log", 4).await;
    let f = client.open("/log", OpenFlags { append: true, ..Default::default() }).await.unwrap();
    assert_eq!(f.append(&record(0, 0, REC)).await.unwrap(), 0);
    // The server of the second object goes away (not the inode's home, which places appends).
    let home = client.home_of(f.ino());
    let gone = f.layout().servers[1];
    assert_ne!(gone, home);
    cluster.kill9(gone.0);
    // 150,000 bytes from offset 100 touch objects 0, 1 and 2.
    let err = f.write(&record(0, 1, 150_000)).await.unwrap_err();
    assert_eq!(err.errno, shoal_proto::Errno::EIO, "{err}");
    assert!(err.to_string().contains(&format!("append at server {home}")), "{err}");
    assert_eq!(cluster.uncached_client().stat("/log").await.unwrap().size, REC as u64, "the size did not move");
    // Back: the next append goes where the failed one would have, whole.
    cluster.restart(gone.0);
    assert_eq!(f.append(&record(0, 1, 150_000)).await.unwrap(), REC as u64);
    f.close().await.unwrap();
    let data = read_all(&cluster, "/log").await;
    assert_eq!(data.len(), REC + 150_000);
    assert!(data[..REC] == record(0, 0, REC)[..] && data[REC..] == record(0, 1, 150_000)[..]);
}
