//! `shoal demo`: Shoal's main job on an embedded local cluster. Starts N servers, writes a
//! file striped over all of them, creates many small files concurrently, lists, renames
//! across servers, reads everything back and verifies it, prints what each server did, and
//! stops the cluster. Exits 1 if any check fails.

use super::Ctx;
use crate::fmt::human_bytes;
use crate::local_cluster::{self, UpOptions};
use anyhow::{bail, Context, Result};
use clap::Args;
use futures::StreamExt;
use shoal_client::{Client, ClientOptions, LayoutSpec};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct DemoArgs {
    /// Servers in the embedded cluster.
    #[arg(long, default_value_t = 4)]
    servers: u32,
    /// Folder for the cluster (default: a new folder under the system temp dir, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Size of the striped file in MiB.
    #[arg(long, default_value_t = 256)]
    size_mib: u64,
    /// Number of small files to create.
    #[arg(long, default_value_t = 2000)]
    files: u32,
    /// Leave the cluster running at the end (prints how to reach it).
    #[arg(long)]
    keep: bool,
}

/// Deterministic test data: byte `i` of the file is a function of `i`.
fn pattern(offset: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut word = offset / 8;
    let skip = (offset % 8) as usize;
    while v.len() < len + skip {
        let x = shoal_placement::rendezvous::mix64(word);
        v.extend_from_slice(&x.to_le_bytes());
        word += 1;
    }
    v.drain(..skip);
    v.truncate(len);
    v
}

pub async fn demo(_ctx: &Ctx, a: DemoArgs) -> Result<()> {
    let (dir, temp) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("shoal-demo-{}", std::process::id())), true),
    };
    let opts = UpOptions {
        servers: a.servers,
        dir: dir.clone(),
        base_port: None,
        stripe_size: None,
        stripe_count: None,
        policy: None,
        tls: false,
        throttle: Vec::new(),
        replicas: None,
        slots: None,
    };
    println!("== starting {} shoald servers under {}", a.servers, dir.display());
    let config = tokio::task::spawn_blocking(move || local_cluster::up(&opts)).await??;
    let result = run_job(&config, &a).await;
    if a.keep {
        println!("== cluster left running: export SHOAL_CONFIG={}", config.display());
        if let Some(http) =
            shoal_placement::ClusterMap::load(&config).ok().and_then(|m| m.servers.first()?.http.clone())
        {
            println!("== status page: http://{http}/ (or `shoal top`); files at http://{http}/fs/");
        }
    } else {
        let d = dir.clone();
        tokio::task::spawn_blocking(move || local_cluster::down(&d, std::time::Duration::from_secs(10))).await??;
        if temp {
            let _ = std::fs::remove_dir_all(&dir);
        }
        println!("== cluster stopped");
    }
    result
}

async fn run_job(config: &std::path::Path, a: &DemoArgs) -> Result<()> {
    let client = Client::from_config(config, ClientOptions::default())?;
    let n = client.map().servers.len();
    client.mkdir_all("/demo/striped", 0o755).await?;
    client.mkdir_all("/demo/small", 0o755).await?;
    client.mkdir_all("/demo/moved", 0o755).await?;
    client
        .set_layout(
            "/demo/striped",
            LayoutSpec { stripe_size: Some(1 << 20), stripe_count: Some(u32::MAX), ..Default::default() },
        )
        .await?;

    // 1. One large file striped over every server.
    let size = a.size_mib << 20;
    let chunk = 16usize << 20;
    println!("== writing /demo/striped/big.dat: {} striped over {n} servers (1 MiB stripes)", human_bytes(size));
    let t = Instant::now();
    let f = client.create("/demo/striped/big.dat", 0o644, None).await?;
    let mut off = 0;
    while off < size {
        let len = chunk.min((size - off) as usize);
        f.write_at(off, &pattern(off, len)).await?;
        off += len as u64;
    }
    let layout = f.layout().clone();
    f.close().await?;
    let write_secs = t.elapsed().as_secs_f64();

    // 2. Many small files, created concurrently.
    println!("== creating {} small files in /demo/small (16 at a time)", a.files);
    let t = Instant::now();
    let results: Vec<shoal_client::Result<()>> = futures::stream::iter(0..a.files)
        .map(|i| {
            let c = client.clone();
            async move {
                let f = c.create(&format!("/demo/small/f{i:06}"), 0o644, None).await?;
                f.write_at(0, format!("small file {i}\n").as_bytes()).await?;
                f.close().await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let created = results.len() as u32;
    for r in results {
        r?;
    }
    let create_secs = t.elapsed().as_secs_f64();

    // 3. List, rename across directories (owned by different servers when possible), link.
    let listed = client.readdir("/demo/small").await?.len();
    if listed != a.files as usize {
        bail!("listed {listed} entries in /demo/small, expected {}", a.files);
    }
    client.rename("/demo/small/f000000", "/demo/moved/f000000").await?;
    client.symlink("../striped/big.dat", "/demo/moved/big.link").await?;
    client.link("/demo/moved/f000000", "/demo/moved/f000000.hardlink").await?;
    let moved = client.stat("/demo/moved/f000000.hardlink").await?;
    if moved.nlink != 2 {
        bail!("hard link count is {}, expected 2", moved.nlink);
    }

    // 4. Read everything back.
    println!("== reading back and verifying");
    let t = Instant::now();
    let f = client.open("/demo/moved/big.link", shoal_client::OpenFlags::read_only()).await?;
    if f.attr().size != size {
        bail!("big.dat has size {}, expected {size}", f.attr().size);
    }
    let mut off = 0;
    while off < size {
        let len = chunk.min((size - off) as usize);
        let got = f.read_at(off, len).await?;
        if got[..] != pattern(off, len)[..] {
            bail!("big.dat differs from what was written in bytes {off}..{}", off + len as u64);
        }
        off += len as u64;
    }
    let read_secs = t.elapsed().as_secs_f64();
    for i in [1u32, a.files / 2, a.files - 1] {
        if i == 0 || i >= a.files {
            continue;
        }
        let f = client.open(&format!("/demo/small/f{i:06}"), shoal_client::OpenFlags::read_only()).await?;
        let got = f.read_at(0, 64).await?;
        if got[..] != format!("small file {i}\n").as_bytes()[..] {
            bail!("small file f{i:06} has the wrong contents");
        }
    }

    // 5. What each server did.
    println!();
    println!(
        "layout of big.dat: stripe_size {} over servers {:?}",
        layout.stripe_size,
        layout.servers.iter().map(|s| s.0).collect::<Vec<_>>()
    );
    println!("{:<6} {:>9} {:>9} {:>12} {:>12}", "server", "inodes", "objects", "requests", "bytes-in");
    for (id, st) in client.status_all().await {
        let st = st.with_context(|| format!("server {id} does not answer"))?;
        println!(
            "{:<6} {:>9} {:>9} {:>12} {:>12}",
            id.to_string(),
            st.inodes,
            st.data_objects,
            st.counters.client_requests,
            human_bytes(st.counters.bytes_received)
        );
    }
    println!();
    println!("summary");
    println!(
        "  striped write  {:>8.1} MiB/s  ({} in {:.2} s, fsync at close)",
        a.size_mib as f64 / write_secs,
        human_bytes(size),
        write_secs
    );
    println!("  read + verify  {:>8.1} MiB/s", a.size_mib as f64 / read_secs);
    println!(
        "  small files    {:>8.0} files/s (create + write + close, {created} files)",
        created as f64 / create_secs
    );
    println!("  listed {listed} entries, renamed across directories, hard and symbolic links checked");
    println!("all checks passed");
    Ok(())
}
