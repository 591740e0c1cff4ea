//! Containers in a POSIX directory (a temporary directory on the local disk), written and
//! read by tasks of one process through the in-process adapter: round trips in the plain and
//! multi-file modes, chunks that overflow into new blocks, the serial API, and what a
//! reader says of truncated and corrupted containers.

use shoal_container::{open_rank, Comm, Container, Corrupt, Error, LocalComm, ParFile, Target, Where, WriteOptions};

/// Task `r`'s data: `len(r)` bytes of a pattern of its own.
fn data(r: usize) -> Vec<u8> {
    let len = 1000 + r * 2500;
    (0..len).map(|i| (i * 31 + r * 7) as u8).collect()
}

/// `n` tasks write their data in pieces of at most 1,500 bytes (chunks of 4 KiB: the longer
/// logical files spread over several blocks), then close.
async fn write_container(name: &str, n: usize, nfiles: u32) {
    let tasks = LocalComm::group(n).into_iter().map(|comm| {
        let name = name.to_string();
        tokio::spawn(async move {
            let r = comm.rank();
            let opts = WriteOptions { chunk_size: 1500 + 100 * r as u64, nfiles, fs_block: 4096, ..Default::default() };
            let mut f = ParFile::create(Box::new(comm), &Target::Posix, &name, &opts).await.unwrap();
            for piece in data(r).chunks(1500) {
                f.logical().ensure_free_space(piece.len() as u64).unwrap();
                f.logical().write(piece).await.unwrap();
            }
            f.close().await.unwrap();
        })
    });
    for t in tasks.collect::<Vec<_>>() {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_multi_file_containers_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for nfiles in [1, 3] {
        let name = dir.path().join(format!("ckpt{nfiles}")).to_str().unwrap().to_string();
        write_container(&name, 8, nfiles).await;
        for f in 1..nfiles {
            assert!(std::path::Path::new(&format!("{name}.{f:06}")).exists(), "physical file {f}");
        }

        // Parallel read, as many tasks.
        let reads = LocalComm::group(8).into_iter().map(|comm| {
            let name = name.clone();
            tokio::spawn(async move {
                let r = comm.rank();
                let mut f = ParFile::open(Box::new(comm), &Target::Posix, &name).await.unwrap();
                assert_eq!(f.info().nfiles, nfiles);
                let mut got = Vec::new();
                while !f.logical().feof() {
                    let mut buf = vec![0; f.logical().bytes_avail_in_chunk().max(1) as usize];
                    let n = f.logical().read(&mut buf).await.unwrap();
                    got.extend_from_slice(&buf[..n]);
                }
                assert_eq!(got, data(r), "rank {r}");
                f.close().await.unwrap();
            })
        });
        for t in reads.collect::<Vec<_>>() {
            t.await.unwrap();
        }

        // Serial, global view: every logical file and where it lies.
        let c = Container::open(&Target::Posix, &name).await.unwrap();
        assert_eq!((c.ntasks(), c.nfiles()), (8, nfiles));
        for r in 0..8u64 {
            assert_eq!(c.read_all(r).await.unwrap(), data(r as usize));
            let loc = c.location(r).unwrap();
            assert_eq!(loc.chunk_len % 4096, 0);
            assert_eq!(loc.used.iter().sum::<u64>(), data(r as usize).len() as u64);
            // Pieces of 1,500 bytes, whole in a chunk: the long ones took several blocks.
            assert!(loc.used.iter().all(|&u| u <= loc.chunk_len));
        }
        assert!(c.location(7).unwrap().used.len() > 1, "rank 7 overflowed into new blocks");
        // Serial, local view.
        let mut one = open_rank(&Target::Posix, &name, 5).await.unwrap();
        assert_eq!(one.read_to_end().await.unwrap(), data(5));
        assert!(matches!(open_rank(&Target::Posix, &name, 8).await, Err(Error::Usage(_))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_with_another_number_of_tasks_fails_on_every_task_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let name = dir.path().join("c").to_str().unwrap().to_string();
    write_container(&name, 4, 1).await;
    let opens = LocalComm::group(3).into_iter().map(|comm| {
        let name = name.clone();
        tokio::spawn(async move { ParFile::open(Box::new(comm), &Target::Posix, &name).await.err().unwrap() })
    });
    for t in opens.collect::<Vec<_>>() {
        let e = t.await.unwrap().to_string();
        assert!(e.contains("holds 4 logical files and was opened by 3 tasks"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_and_corrupted_containers_give_errors_naming_the_file_and_block() {
    let dir = tempfile::tempdir().unwrap();
    let name = dir.path().join("c").to_str().unwrap().to_string();
    write_container(&name, 4, 1).await;
    let good = std::fs::read(&name).unwrap();
    let check = |bytes: &[u8], want: Corrupt| {
        let bad = dir.path().join("bad");
        std::fs::write(&bad, bytes).unwrap();
        let bad = bad.to_str().unwrap().to_string();
        let rt = tokio::runtime::Handle::current();
        let e = tokio::task::block_in_place(|| rt.block_on(Container::open(&Target::Posix, &bad))).err().unwrap();
        match e {
            Error::Corrupt { path, what } => {
                assert_eq!(path, bad);
                assert_eq!(what, want);
            }
            e => panic!("{e}"),
        }
    };
    // Cut anywhere: never read as a container.
    check(&good[..good.len() - 1], Corrupt::NotClosed);
    check(&good[..4096 + 10], Corrupt::NotClosed);
    check(&good[..20], Corrupt::Short(Where::Header));
    check(&[], Corrupt::Short(Where::Header));
    // A flipped bit in each metadata block.
    let mut h = good.clone();
    h[30] ^= 0x10;
    check(&h, Corrupt::Checksum(Where::Header));
    let tail_at = u64::from_le_bytes(good[good.len() - 24..good.len() - 16].try_into().unwrap()) as usize;
    let mut t = good.clone();
    t[tail_at + 9] ^= 1;
    check(&t, Corrupt::Checksum(Where::Tail));
    let mut tr = good.clone();
    let at = tr.len() - 20;
    tr[at] ^= 4;
    check(&tr, Corrupt::Checksum(Where::Trailer));
    let mut m = good.clone();
    m[0] = b'X';
    check(&m, Corrupt::Magic(Where::Header));
}
