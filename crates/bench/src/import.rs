//! `shoal bench import`: reverse read (`shoal import`, docs/import.md) against `curl` of the
//! same file into a local directory and into tmpfs, side by side in one run.
//!
//! The remote is an HTTP server this process starts on 127.0.0.1 (tower-http's `ServeDir`:
//! byte ranges, `Last-Modified`) over a file of `--size` bytes written first to a local
//! directory, so its bytes come from the page cache; every measurement reads the same file
//! from the same server. Each one ends durable: `shoal import` closes the file (fsync on
//! every server), and the curl copies are followed by an fsync of the file, timed.

use crate::cli::{parse_size, UsageError};
use crate::report::median;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use shoal_client::{Client, ClientOptions, ImportOptions, LayoutSpec};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug, Clone)]
#[command(after_help = EXAMPLES)]
pub struct ImportArgs {
    /// Size of the remote file.
    #[arg(short = 's', long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Servers the imported file is striped over (-1 = all).
    #[arg(short = 'c', long = "stripe-count", default_value_t = -1, allow_negative_numbers = true)]
    pub stripe_count: i64,
    /// Stripe size of the imported file.
    #[arg(short = 'S', long = "stripe-size", default_value = "1M", value_parser = parse_size)]
    pub stripe_size: u64,
    /// Range requests each server runs at once.
    #[arg(short = 'p', long, default_value_t = 4)]
    pub parallel: u32,
    /// Local directory for the remote's file and curl's copy (default: $TMPDIR or /tmp).
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
    /// tmpfs directory for curl's other copy.
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub tmpfs: PathBuf,
    /// Repetitions (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
}

const EXAMPLES: &str = "Examples:
  shoal bench import                       # 1 GiB, striped over all servers, 3 runs
  shoal bench import -s 256M --reps 5 --json
Rows: shoal import (the servers fetch byte ranges in parallel into their objects, then the
file is closed: durable), curl -o into a local directory and into tmpfs (each followed by an
fsync of the copy). The ratio is each row's rate over curl into the local directory.";

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub what: String,
    pub bytes: u64,
    pub seconds: f64,
    pub mib_s: f64,
    /// This row's rate over curl into the local directory.
    pub ratio: f64,
}

pub async fn run(config: Option<PathBuf>, a: ImportArgs) -> Result<()> {
    let config = config.ok_or_else(|| UsageError("no cluster: pass --config or set SHOAL_CONFIG".into()))?;
    if a.reps == 0 || a.parallel == 0 {
        bail!(UsageError("--reps and --parallel must be at least 1".into()));
    }
    let count = match a.stripe_count {
        -1 => u32::MAX,
        c if c >= 1 => c as u32,
        c => bail!(UsageError(format!("stripe count {c} must be -1 (all servers) or at least 1"))),
    };
    let local = a.local.clone().unwrap_or_else(std::env::temp_dir);
    let work = local.join(format!("shoal-bench-import-{}", std::process::id()));
    let shm = a.tmpfs.join(format!("shoal-bench-import-{}", std::process::id()));
    let r = measure(&config, &a, count, &work, &shm).await;
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&shm);
    let rows = r?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("{:<34} {:>10} {:>9} {:>10} {:>7}", "", "bytes", "seconds", "MiB/s", "ratio");
        for r in &rows {
            println!("{:<34} {:>10} {:>9.2} {:>10.0} {:>7.2}", r.what, r.bytes, r.seconds, r.mib_s, r.ratio);
        }
    }
    Ok(())
}

async fn measure(config: &Path, a: &ImportArgs, count: u32, work: &Path, shm: &Path) -> Result<Vec<Row>> {
    let served = work.join("served");
    std::fs::create_dir_all(&served).with_context(|| format!("cannot create {}", served.display()))?;
    std::fs::create_dir_all(shm).with_context(|| format!("cannot create {}", shm.display()))?;
    write_source(&served.join("file"), a.size)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("cannot bind a loopback port")?;
    let url = format!("http://{}/file", listener.local_addr()?);
    let app = axum::Router::new().fallback_service(tower_http::services::ServeDir::new(&served));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let client = Client::from_config(config, ClientOptions::default())?;
    client.mkdir_all("/shoal-bench", 0o755).await?;
    let layout = LayoutSpec { stripe_size: Some(a.stripe_size), stripe_count: Some(count), ..Default::default() };
    let opts = ImportOptions { layout: Some(layout), parallel: a.parallel };
    let dest = format!("/shoal-bench/import-{}", std::process::id());
    let mut times: [Vec<f64>; 3] = Default::default();
    for _ in 0..a.reps {
        let t = Instant::now();
        let rep = client.import_url(&url, &dest, &opts, &|_, _| {}).await?;
        times[0].push(t.elapsed().as_secs_f64());
        if rep.bytes != a.size {
            bail!("imported {} bytes of {}", rep.bytes, a.size);
        }
        client.unlink(&dest).await?;
        times[1].push(curl(&url, &work.join("copy")).await?);
        times[2].push(curl(&url, &shm.join("copy")).await?);
    }
    server.abort();
    let names = [
        format!("shoal import ({} ranges/server)", a.parallel),
        "curl -o local directory".to_string(),
        "curl -o tmpfs".to_string(),
    ];
    let secs: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
    let rate = |s: f64| a.size as f64 / (1 << 20) as f64 / s.max(1e-9);
    Ok(names
        .into_iter()
        .zip(&secs)
        .map(|(what, &s)| Row { what, bytes: a.size, seconds: s, mib_s: rate(s), ratio: secs[1] / s.max(1e-9) })
        .collect())
}

/// The remote's file: a pattern (not zeros, which some paths would compress or skip).
fn write_source(path: &Path, size: u64) -> Result<()> {
    let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(path)?);
    let block: Vec<u8> = (0..1u64 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// `curl -o OUT URL`, then fsync of the copy; seconds for both. The copy is removed.
async fn curl(url: &str, out: &Path) -> Result<f64> {
    let t = Instant::now();
    let status = tokio::process::Command::new("curl")
        .args(["-sS", "--fail", "-o"])
        .arg(out)
        .arg(url)
        .status()
        .await
        .context("cannot run curl (is it installed?)")?;
    if !status.success() {
        bail!("curl {url} failed: {status}");
    }
    let o = out.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::File::open(&o)?.sync_all()).await??;
    let s = t.elapsed().as_secs_f64();
    std::fs::remove_file(out)?;
    Ok(s)
}
