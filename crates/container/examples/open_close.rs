//! Time a collective open and close of a container for N tasks (async tasks of this
//! process) against creating N files, on Shoal (`--config FILE`) or in a local directory.
//! A measurement aid until `shoal bench container` exists:
//! `cargo run --release -p shoal-container --example open_close -- 100000 /tmp/dir`
//! `cargo run --release -p shoal-container --example open_close -- 100000 shoal:/dir CONFIG`

use futures::StreamExt;
use shoal_container::{Comm, LocalComm, ParFile, Target, WriteOptions};
use std::time::Instant;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let dir = args.get(2).cloned().unwrap_or_else(|| "/tmp".into());
    let (target, dir) = match dir.strip_prefix("shoal:") {
        Some(d) => {
            let config = args.get(3).expect("a cluster config for shoal:");
            let c = shoal_client::Client::from_config(config.as_ref(), Default::default()).expect("client");
            (Target::Shoal(c), d.to_string())
        }
        None => (Target::Posix, dir),
    };
    let name = format!("{dir}/container-{n}");
    let t0 = Instant::now();
    let opened = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = LocalComm::group(n)
        .into_iter()
        .map(|comm| {
            let (target, name, opened) = (target.clone(), name.clone(), opened.clone());
            tokio::spawn(async move {
                let r = comm.rank() as u8;
                let opts = WriteOptions { chunk_size: 4096, ..Default::default() };
                let mut f = ParFile::create(Box::new(comm), &target, &name, &opts).await.unwrap();
                if opened.wait().await.is_leader() {
                    eprintln!("open: {:.3} s", t0.elapsed().as_secs_f64());
                }
                // SHOAL_CONTAINER_WRITE=1: each task also writes 64 bytes.
                if std::env::var_os("SHOAL_CONTAINER_WRITE").is_some() {
                    f.logical().write(&[r; 64]).await.unwrap();
                }
                f.close().await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let container = t0.elapsed().as_secs_f64();
    println!("container for {n} tasks (open, close): {container:.3} s");
    let t1 = Instant::now();
    let creates = futures::stream::iter(0..n)
        .map(|i| {
            let (target, path) = (target.clone(), format!("{dir}/file-{n}-{i}"));
            async move {
                match &target {
                    Target::Posix => {
                        std::fs::write(&path, [0u8; 64]).unwrap();
                    }
                    Target::Shoal(c) => {
                        let f = c.create(&path, 0o644, None).await.unwrap();
                        f.write_at(0, &[0u8; 64]).await.unwrap();
                        f.close().await.unwrap();
                    }
                }
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
    let files = t1.elapsed().as_secs_f64();
    println!("{} files of 64 B: {files:.3} s; ratio {:.0}x", creates.len(), files / container);
}
