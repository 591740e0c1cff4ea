//! The container's other modes, in a local directory: key-value records, coalescing I/O
//! through collectors, and mapped opens with another number of tasks (4:2 and 2:4).

use shoal_container::{Comm, Container, LocalComm, MappedFile, ParFile, Target, WriteOptions};
use std::future::Future;

/// Run `task(comm)` on `n` tasks of one group at once; their results in rank order.
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

fn name_in(dir: &tempfile::TempDir, n: &str) -> String {
    dir.path().join(n).to_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_value_records_read_back_per_key_across_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let name = name_in(&dir, "kv");
    let n2 = name.clone();
    on_tasks(4, move |comm| {
        let name = n2.clone();
        async move {
            let r = comm.rank() as u64;
            let opts = WriteOptions { chunk_size: 1000, fs_block: 4096, key_value: true, ..Default::default() };
            let mut f = ParFile::create(Box::new(comm), &Target::Posix, &name, &opts).await.unwrap();
            // Keys interleaved, records of varied size: some run over into the next chunk.
            for i in 0..40u64 {
                let key = i % 3;
                let data = vec![(r * 10 + key) as u8; (i * 97 % 700) as usize];
                f.logical().write_key(key, &data).await.unwrap();
            }
            f.close().await.unwrap();
        }
    })
    .await;
    let expect = |r: u64, key: u64| -> Vec<u8> {
        (0..40u64).filter(|i| i % 3 == key).flat_map(|i| vec![(r * 10 + key) as u8; (i * 97 % 700) as usize]).collect()
    };
    let n2 = name.clone();
    on_tasks(4, move |comm| {
        let name = n2.clone();
        async move {
            let r = comm.rank() as u64;
            let mut f = ParFile::open(Box::new(comm), &Target::Posix, &name).await.unwrap();
            let l = f.logical();
            // Key 1 in small reads, then key 0 whole, then key 2 after a seek into record 1.
            let mut got = Vec::new();
            let mut buf = [0u8; 333];
            loop {
                let n = l.read_key(1, &mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, expect(r, 1));
            assert_eq!(l.read_key_all(0).await.unwrap(), expect(r, 0));
            let keys = l.keys().await.unwrap();
            assert_eq!(keys.iter().map(|k| k.0).collect::<Vec<_>>(), vec![0, 1, 2]);
            let lens2 = &keys[2].1;
            l.seek_key(2, 1, 5).await.unwrap();
            let mut rest = vec![0; 100_000];
            let n = l.read_key(2, &mut rest).await.unwrap();
            assert_eq!(n as u64, lens2.iter().skip(1).sum::<u64>() - 5);
            assert!(l.seek_key(2, 99, 0).await.is_err());
            f.close().await.unwrap();
        }
    })
    .await;
    // The serial view reads the same records.
    let c = Container::open(&Target::Posix, &name).await.unwrap();
    assert!(c.key_value());
    let mut one = c.reader(3).await.unwrap();
    assert_eq!(one.read_key_all(2).await.unwrap(), expect(3, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_containers_are_packed_and_read_back_collectively() {
    let dir = tempfile::tempdir().unwrap();
    let name = name_in(&dir, "coll");
    let n2 = name.clone();
    let data = |r: u64, round: u64| -> Vec<u8> { vec![(r + 7 * round) as u8; 1024] };
    on_tasks(16, move |comm| {
        let name = n2.clone();
        async move {
            let r = comm.rank() as u64;
            let opts = WriteOptions { chunk_size: 2048, fs_block: 65536, collector_size: 8, ..Default::default() };
            let mut f = ParFile::create(Box::new(comm), &Target::Posix, &name, &opts).await.unwrap();
            for round in 0..3 {
                f.fwrite_coll(&data(r, round)).await.unwrap();
            }
            f.close().await.unwrap();
        }
    })
    .await;
    // 16 tasks × 3 KiB in two groups: chunks of 2 KiB packed, each group's start aligned to
    // 64 KiB: blocks of 128 KiB, two blocks; nothing like 16 × 64 KiB per block.
    let size = std::fs::metadata(&name).unwrap().len();
    assert!(size < 2 * 131072 + 65536 + 4096, "container of {size} bytes");
    let n2 = name.clone();
    on_tasks(16, move |comm| {
        let name = n2.clone();
        async move {
            let r = comm.rank() as u64;
            let mut f = ParFile::open(Box::new(comm), &Target::Posix, &name).await.unwrap();
            let mut buf = vec![0; 3 * 1024];
            let mut got = 0;
            while got < buf.len() {
                let end = (got + 1000).min(buf.len());
                let n = f.fread_coll(&mut buf[got..end]).await.unwrap();
                assert!(n > 0);
                got += n;
            }
            assert_eq!(buf, [data(r, 0), data(r, 1), data(r, 2)].concat());
            f.close().await.unwrap();
        }
    })
    .await;
    let c = Container::open(&Target::Posix, &name).await.unwrap();
    assert_eq!(c.read_all(9).await.unwrap(), [data(9, 0), data(9, 1), data(9, 2)].concat());
}

/// Write `n` tasks' logical files (rank-specific bytes, several blocks long).
async fn write_plain(name: &str, n: usize) {
    let name = name.to_string();
    on_tasks(n, move |comm| {
        let name = name.clone();
        async move {
            let r = comm.rank();
            let opts = WriteOptions { chunk_size: 3000, fs_block: 4096, ..Default::default() };
            let mut f = ParFile::create(Box::new(comm), &Target::Posix, &name, &opts).await.unwrap();
            f.logical().write(&vec![r as u8 + 1; 10_000 + r]).await.unwrap();
            f.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_opens_read_any_logical_files_with_another_number_of_tasks() {
    let dir = tempfile::tempdir().unwrap();
    // 4:2: two tasks read two logical files each.
    let four = name_in(&dir, "four");
    write_plain(&four, 4).await;
    let n2 = four.clone();
    on_tasks(2, move |comm| {
        let name = n2.clone();
        async move {
            let me = comm.rank() as u64;
            let mine = [2 * me, 2 * me + 1];
            let mut m = MappedFile::open(Box::new(comm), &Target::Posix, &name, &mine).await.unwrap();
            assert_eq!(m.ntasks_written(), 4);
            for r in mine {
                let got = m.logical(r).unwrap().read_to_end().await.unwrap();
                assert_eq!(got, vec![r as u8 + 1; 10_000 + r as usize]);
            }
            assert!(m.logical(9).is_err());
            m.close().await.unwrap();
        }
    })
    .await;
    // 2:4: four tasks, each reading one of the two (twice over), one also asking for none.
    let two = name_in(&dir, "two");
    write_plain(&two, 2).await;
    let n2 = two.clone();
    on_tasks(4, move |comm| {
        let name = n2.clone();
        async move {
            let me = comm.rank() as u64;
            let mine: Vec<u64> = if me == 3 { vec![] } else { vec![me % 2] };
            let mut m = MappedFile::open(Box::new(comm), &Target::Posix, &name, &mine).await.unwrap();
            for &r in &mine {
                assert_eq!(m.logical(r).unwrap().read_to_end().await.unwrap(), vec![r as u8 + 1; 10_000 + r as usize]);
            }
            m.close().await.unwrap();
        }
    })
    .await;
    // A logical file that does not exist fails every task with the reason.
    let n2 = two.clone();
    let errs = on_tasks(2, move |comm| {
        let name = n2.clone();
        async move { MappedFile::open(Box::new(comm), &Target::Posix, &name, &[5]).await.err().unwrap().to_string() }
    })
    .await;
    assert!(errs.iter().all(|e| e.contains("asked for logical file 5")), "{errs:?}");
}
