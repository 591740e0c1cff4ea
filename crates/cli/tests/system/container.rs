//! Task-local I/O containers on a real cluster: tasks of this process (the in-process
//! adapter) write and read containers on Shoal through the native client, in the plain,
//! multi-file, key-value and coalescing modes; a multi-file container's physical files sit
//! on different servers, and a container of 2,000 tasks costs a handful of creates.

use shoal_container::{Comm, Container, LocalComm, ParFile, Target, WriteOptions};
use shoal_testkit::Cluster;
use std::collections::HashSet;
use std::future::Future;

async fn on_tasks<T, F, Fut>(n: usize, task: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(LocalComm) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let handles: Vec<_> = LocalComm::group(n).into_iter().map(|c| tokio::spawn(task(c))).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

fn data(r: usize) -> Vec<u8> {
    (0..3000 + 700 * (r % 11)).map(|i| (i + 13 * r) as u8).collect()
}

/// `n` tasks write `data(rank)` in pieces of 1,000 bytes (with chunks of 2,000, longer
/// logical files take several blocks), close, and read it back collectively.
async fn round_trip(target: Target, name: &str, n: usize, opts: WriteOptions) {
    let (t, nm, o) = (target.clone(), name.to_string(), opts.clone());
    on_tasks(n, move |comm| {
        let (target, name, opts) = (t.clone(), nm.clone(), o.clone());
        async move {
            let r = comm.rank();
            let mut f = ParFile::create(Box::new(comm), &target, &name, &opts).await.unwrap();
            if opts.collector_size > 1 {
                // Collective: every task calls it as often as the others (here once).
                f.fwrite_coll(&data(r)).await.unwrap();
            }
            for piece in data(r).chunks(1000).filter(|_| opts.collector_size <= 1) {
                if opts.key_value {
                    f.logical().write_key(r as u64 % 3, piece).await.unwrap();
                } else {
                    f.logical().ensure_free_space(piece.len() as u64).unwrap();
                    f.logical().write(piece).await.unwrap();
                }
            }
            f.close().await.unwrap();
        }
    })
    .await;
    let (t, nm) = (target.clone(), name.to_string());
    on_tasks(n, move |comm| {
        let (target, name) = (t.clone(), nm.clone());
        async move {
            let r = comm.rank();
            let mut f = ParFile::open(Box::new(comm), &target, &name).await.unwrap();
            let got = if f.info().flags & shoal_container::format::FLAG_KEY_VALUE != 0 {
                f.logical().read_key_all(r as u64 % 3).await.unwrap()
            } else {
                f.logical().read_to_end().await.unwrap()
            };
            assert_eq!(got, data(r), "rank {r}");
            f.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_round_trip_on_shoal_in_every_mode() {
    let cluster = Cluster::start(3);
    let target = Target::Shoal(cluster.client());
    let chunked = WriteOptions { chunk_size: 2000, ..Default::default() };
    round_trip(target.clone(), "/plain", 12, chunked.clone()).await;
    round_trip(target.clone(), "/multi", 12, WriteOptions { nfiles: 3, ..chunked.clone() }).await;
    round_trip(target.clone(), "/kv", 12, WriteOptions { key_value: true, ..chunked.clone() }).await;
    round_trip(target.clone(), "/coll", 12, WriteOptions { collector_size: 4, ..chunked.clone() }).await;

    // Blocks are aligned to the stripe size of the container (the cluster's default: every
    // chunk fits in a stripe), and span whole rounds of the servers: each task's chunks,
    // over all its blocks, are on one server.
    let c = Container::open(&target, "/plain").await.unwrap();
    let layout = cluster.client().stat("/plain").await.unwrap().layout.unwrap();
    let (stripe, n) = (layout.stripe_size, layout.servers.len() as u64);
    assert_eq!((c.files()[0].header.fs_block, n), (stripe, 3));
    assert_eq!(c.files()[0].header.block_len % (stripe * n), 0);
    assert!(c.location(5).unwrap().chunk_starts.iter().all(|s| s % stripe == 0));
    // 3 tasks writing 2.5 stripes each into chunks of one stripe: 3 blocks each, every
    // task's chunks on one server, the tasks on different servers.
    let (t, st) = (target.clone(), stripe);
    on_tasks(3, move |comm| {
        let target = t.clone();
        async move {
            let r = comm.rank();
            let opts = WriteOptions { chunk_size: st, ..Default::default() };
            let mut f = ParFile::create(Box::new(comm), &target, "/blocks", &opts).await.unwrap();
            f.logical().write(&vec![r as u8; (st * 5 / 2) as usize]).await.unwrap();
            f.close().await.unwrap();
        }
    })
    .await;
    let c = Container::open(&target, "/blocks").await.unwrap();
    let mut servers = HashSet::new();
    for r in 0..3 {
        let starts = c.location(r).unwrap().chunk_starts;
        assert_eq!(starts.len(), 3, "rank {r}: {starts:?}");
        let on: HashSet<u64> = starts.iter().map(|s| (s / stripe) % n).collect();
        assert_eq!(on.len(), 1, "rank {r}: chunks {starts:?} on several servers");
        servers.extend(on);
        assert_eq!(c.read_all(r).await.unwrap(), vec![r as u8; (stripe * 5 / 2) as usize]);
    }
    assert_eq!(servers.len(), 3);
    // Chunks larger than the stripe: the container's stripes are as large as the chunk.
    let big = WriteOptions { chunk_size: stripe + 1, ..Default::default() };
    round_trip(target.clone(), "/big", 3, big).await;
    let layout = cluster.client().stat("/big").await.unwrap().layout.unwrap();
    assert_eq!(layout.stripe_size, (stripe + 1).next_multiple_of(4096));

    // Multi-file: each physical file on one server, all on different servers.
    let fs = cluster.client();
    let mut servers = HashSet::new();
    for name in ["/multi", "/multi.000001", "/multi.000002"] {
        let layout = fs.stat(name).await.unwrap().layout.unwrap();
        assert_eq!(layout.servers.len(), 1, "{name}");
        servers.insert(layout.servers[0]);
    }
    assert_eq!(servers.len(), 3);
    let c = Container::open(&target, "/multi").await.unwrap();
    assert_eq!((c.ntasks(), c.nfiles()), (12, 3));
    for r in 0..12 {
        assert_eq!(c.read_all(r).await.unwrap(), data(r as usize));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_tasks_make_one_file_and_a_few_requests_each() {
    let cluster = Cluster::start(2);
    let client = cluster.client();
    let target = Target::Shoal(client.clone());
    let before: u64 = client.traffic().values().map(|t| t.0).sum();
    round_trip(target.clone(), "/many", 2000, WriteOptions { chunk_size: 4096, ..Default::default() }).await;
    let requests: u64 = client.traffic().values().map(|t| t.0).sum::<u64>() - before;
    // One create, one open per mode per process, and the data: far from one file per task.
    let names = client.readdir("/").await.unwrap();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(requests < 2000 * 4, "{requests} requests for 2,000 tasks");
}
