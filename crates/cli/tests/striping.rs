//! Data path on real servers: striping, holes, large offsets, concurrent writers.

mod common;
use common::{pattern, Cluster};
use shoal_client::{LayoutSpec, OpenFlags};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_gib_file_striped_over_four_servers_round_trips_byte_identical() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(1 << 20), stripe_count: Some(4), ..Default::default() };
    let f = fs.create("/big", 0o644, Some(spec)).await.unwrap();
    assert_eq!(f.layout().servers.len(), 4);
    assert_eq!(f.layout().stripe_size, 1 << 20);
    let mut distinct = f.layout().servers.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "four different servers");

    let size: u64 = 1 << 30;
    let chunk = 32usize << 20;
    let mut off = 0;
    while off < size {
        f.write_at(off, &pattern(1, off, chunk)).await.unwrap();
        off += chunk as u64;
    }
    f.close().await.unwrap();

    // Every server received a quarter of the bytes (± protocol overhead).
    let status = fs.status_all().await;
    for (id, st) in &status {
        let got = st.as_ref().unwrap().counters.bytes_received;
        assert!(got >= size / 4 && got < size / 4 + (16 << 20), "server {id} received {got} bytes");
    }

    // Read back through a fresh client, in odd-sized pieces crossing stripe boundaries.
    let reader = cluster.uncached_client();
    let f = reader.open("/big", OpenFlags::read_only()).await.unwrap();
    assert_eq!(f.attr().size, size);
    let piece = (24 << 20) + 12345;
    let mut off = 0u64;
    while off < size {
        let len = piece.min((size - off) as usize);
        let got = f.read_at(off, len).await.unwrap();
        assert_eq!(got.len(), len);
        assert!(got[..] == pattern(1, off, len)[..], "mismatch in {off}..{}", off + len as u64);
        off += len as u64;
    }
    // Past the end: nothing.
    assert!(f.read_at(size, 100).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_files_beyond_4_gib_read_holes_as_zeros() {
    let cluster = Cluster::start(3);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(3), ..Default::default() };
    let f = fs.create("/sparse", 0o600, Some(spec)).await.unwrap();
    let far = (5u64 << 30) + 777;
    f.write_at(far, b"tail").await.unwrap();
    f.write_at(100, b"head").await.unwrap();
    f.close().await.unwrap();

    let attr = fs.stat("/sparse").await.unwrap();
    assert_eq!(attr.size, far + 4);
    let f = fs.open("/sparse", OpenFlags::read_only()).await.unwrap();
    assert_eq!(&f.read_at(far - 3, 7).await.unwrap()[..], b"\0\0\0tail");
    assert_eq!(&f.read_at(96, 12).await.unwrap()[..], b"\0\0\0\0head\0\0\0\0");
    let hole = f.read_at(3 << 30, 1 << 20).await.unwrap();
    assert_eq!(hole.len(), 1 << 20);
    assert!(hole.iter().all(|&b| b == 0));

    // Truncate down and up again: the cut-off bytes do not come back.
    fs.truncate("/sparse", 102).await.unwrap();
    fs.truncate("/sparse", 4096).await.unwrap();
    let f = fs.open("/sparse", OpenFlags::read_only()).await.unwrap();
    assert_eq!(&f.read_at(96, 12).await.unwrap()[..], b"\0\0\0\0he\0\0\0\0\0\0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_to_disjoint_ranges_of_one_file() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(4), ..Default::default() };
    fs.create("/shared", 0o666, Some(spec)).await.unwrap().close().await.unwrap();

    // Eight writers, each its own client and handle, interleaved 47,008-byte blocks (IOR hard).
    let block = 47_008u64;
    let writers = 8u64;
    let rounds = 40u64;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let c = cluster.client();
        tasks.push(tokio::spawn(async move {
            let f = c.open("/shared", OpenFlags::write_only()).await.unwrap();
            for r in 0..rounds {
                let off = (r * writers + w) * block;
                f.write_at(off, &pattern(9, off, block as usize)).await.unwrap();
            }
            f.close().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = block * writers * rounds;
    let f = cluster.uncached_client().open("/shared", OpenFlags::read_only()).await.unwrap();
    assert_eq!(f.attr().size, total);
    let got = f.read_at(0, total as usize).await.unwrap();
    assert!(got[..] == pattern(9, 0, total as usize)[..]);
}
