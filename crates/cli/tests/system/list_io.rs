//! List I/O on real servers: many pieces in one call, one request per server, data sieving,
//! holes, the end of the file, and overlapping pieces.

use bytes::Bytes;
use shoal_client::{LayoutSpec, OpenFlags};
use shoal_testkit::{pattern, Cluster};

fn requests(c: &shoal_client::Client) -> u64 {
    c.traffic().values().map(|t| t.0).sum()
}

/// A client without cache or readahead: the read that fetches a handle's capability leaves
/// no prefetch on its way while a list's requests are counted.
fn reader_without_readahead(cluster: &Cluster) -> shoal_client::Client {
    let opts = shoal_client::ClientOptions {
        readahead: 0,
        cache_ttl: std::time::Duration::ZERO,
        dir_lease: std::time::Duration::ZERO,
        ..cluster.options()
    };
    shoal_client::Client::from_config(&cluster.config, opts).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_4k_pieces_move_in_one_request_per_server() {
    let cluster = Cluster::start(4);
    let fs = cluster.client();
    // Stripes of 1 MiB over all 4 servers; pieces every 8 KiB over 80 MB: 10,000 of 4 KiB.
    let spec = LayoutSpec { stripe_size: Some(1 << 20), stripe_count: Some(4), ..Default::default() };
    let f = fs.create("/strided", 0o644, Some(spec)).await.unwrap();
    let n = 10_000u64;
    let pieces: Vec<(u64, Bytes)> = (0..n).map(|i| (i * 8192, Bytes::from(pattern(7, i * 8192, 4096)))).collect();
    // The capability first (an Open request), so that only the list's requests are counted.
    f.read_at(0, 1).await.unwrap();
    let before = requests(&fs);
    f.write_list(&pieces).await.unwrap();
    let writes = requests(&fs) - before;
    assert!(writes <= 4, "10,000 pieces written in {writes} requests (one per server expected)");
    f.fsync().await.unwrap();
    assert_eq!(f.attr().size, (n - 1) * 8192 + 4096);

    // Read back through another client: every piece, and the holes between them are zeros.
    let reader = reader_without_readahead(&cluster);
    let g = reader.open("/strided", OpenFlags::read_only()).await.unwrap();
    g.read_at(0, 1).await.unwrap();
    let want: Vec<(u64, usize)> = (0..n).map(|i| (i * 8192, 4096)).collect();
    let before = requests(&reader);
    let got = g.read_list(&want).await.unwrap();
    let reads = requests(&reader) - before;
    assert!(reads <= 4, "10,000 pieces read in {reads} requests (one per server expected)");
    for (i, b) in got.iter().enumerate() {
        let off = i as u64 * 8192;
        assert!(b[..] == pattern(7, off, 4096)[..], "piece {i} differs");
    }
    let holes = g.read_list(&[(4096, 4096), (12288, 100)]).await.unwrap();
    assert!(holes.iter().all(|h| h.iter().all(|&b| b == 0)) && holes[0].len() == 4096 && holes[1].len() == 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pieces_past_the_end_are_short_and_later_pieces_win() {
    let cluster = Cluster::start(3);
    let fs = cluster.client();
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(3), ..Default::default() };
    let f = fs.create("/mixed", 0o644, Some(spec)).await.unwrap();
    // Pieces crossing stripe boundaries, out of order, two of them overlapping.
    let pieces = vec![
        (200_000, Bytes::from(vec![b'c'; 70_000])),
        (60_000, Bytes::from(vec![b'a'; 10_000])),
        (65_000, Bytes::from(vec![b'b'; 1_000])),
    ];
    f.write_list(&pieces).await.unwrap();
    // A plain write before and after in the same handle keeps its order with the list.
    f.write_at(0, b"head").await.unwrap();
    f.close().await.unwrap();

    let g = fs.open("/mixed", OpenFlags::read_only()).await.unwrap();
    assert_eq!(g.attr().size, 270_000);
    let got = g.read_list(&[(64_999, 3), (0, 5), (269_990, 100), (300_000, 10), (59_999, 2), (0, 0)]).await.unwrap();
    assert_eq!(&got[0][..], b"abb");
    assert_eq!(&got[1][..], b"head\0");
    assert_eq!(&got[2][..], &[b'c'; 10][..]);
    assert!(got[3].is_empty() && got[5].is_empty());
    assert_eq!(&got[4][..], b"\0a");
    // The same bytes as plain reads.
    let plain = g.read_at(59_000, 150_000).await.unwrap();
    let listed = g.read_list(&[(59_000, 150_000)]).await.unwrap();
    assert_eq!(plain, listed[0]);
    // A handle open for reading only may not write a list, and vice versa.
    let err = g.write_list(&[(0, Bytes::from_static(b"x"))]).await.unwrap_err();
    assert_eq!(err.errno, shoal_client::Errno::EBADF);
}

/// A server of a version without list I/O (it does not offer `FEATURE_LIST_IO`) gets the
/// same pieces as one plain read or write each; the others still get one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_list_io_gets_plain_reads_and_writes() {
    let mut cluster = Cluster::start(3);
    cluster.stop(2);
    cluster.restart_with_env(2, &[("SHOAL_FEATURES_OFF", "list_io")]);
    let fs = cluster.client();
    // Stripes of 64 KiB over the 3 servers; 30 pieces of 1 KiB, one every 64 KiB: 10 in
    // each object.
    let spec = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(3), ..Default::default() };
    let f = fs.create("/old", 0o644, Some(spec)).await.unwrap();
    let pieces: Vec<(u64, Bytes)> = (0..30u64).map(|i| (i << 16, Bytes::from(pattern(3, i << 16, 1024)))).collect();
    f.read_at(0, 1).await.unwrap();
    let before = requests(&fs);
    f.write_list(&pieces).await.unwrap();
    // Two servers take one request; the old one, ten.
    assert_eq!(requests(&fs) - before, 2 + 10);
    f.close().await.unwrap();

    let reader = reader_without_readahead(&cluster);
    let g = reader.open("/old", OpenFlags::read_only()).await.unwrap();
    g.read_at(0, 1).await.unwrap();
    let want: Vec<(u64, usize)> = (0..30u64).map(|i| (i << 16, 1024)).collect();
    let before = requests(&reader);
    let got = g.read_list(&want).await.unwrap();
    assert_eq!(requests(&reader) - before, 2 + 10);
    for (i, b) in got.iter().enumerate() {
        let off = (i as u64) << 16;
        assert!(b[..] == pattern(3, off, 1024)[..], "piece {i} differs");
    }
    assert!(cluster.log(2).lines().all(|l| !l.contains("malformed")), "the old server saw a list request");
}
