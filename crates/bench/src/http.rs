//! `shoal bench http`: how fast the servers' HTTP service hands out a file (docs/http.md,
//! "Performance"). It writes one file striped over every server, then times three reads of
//! it to /dev/null:
//! * **native**: the native client reading it in 16 MiB calls, as `shoal cp` does;
//! * **curl**: one `curl` GET stream from one server's HTTP port (that server's gateway
//!   pulls the stripes from all servers);
//! * **curl -r xN**: N `curl` processes each GETting one N-th of the file as a byte range.
//!
//! and reports MiB/s and the ratios curl/native and (curl -r xN)/curl.

use crate::cli::parse_size;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use shoal_client::{Client, ClientOptions, LayoutSpec, OpenFlags};
use std::path::PathBuf;
use std::time::Instant;

/// Bytes per native read and per write call (what `shoal cp` uses).
const CHUNK: usize = 16 << 20;

#[derive(Args, Debug, Clone)]
#[command(
    after_help = "Examples:\n  shoal bench http                 # 1 GiB, server 0's HTTP port, 4 parallel ranges\n  shoal bench http -s 256M -P 8 --server 2 --json"
)]
pub struct HttpArgs {
    /// File size.
    #[arg(short = 's', long = "size", value_parser = parse_size, default_value = "1G")]
    pub size: u64,
    /// Server whose HTTP port the GETs go to.
    #[arg(long, default_value_t = 0)]
    pub server: u32,
    /// Parallel range GETs of the last measurement.
    #[arg(short = 'P', long, default_value_t = 4)]
    pub parallel: u32,
    /// Shoal path of the test file (removed at the end).
    #[arg(long, default_value = "/shoal-bench/http.bin", value_name = "PATH")]
    pub path: String,
    /// Bearer token for the GETs (needed when the cluster's [http] anonymous = "none").
    #[arg(long)]
    pub token: Option<String>,
    /// Print the results as JSON on standard output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    size: u64,
    server: u32,
    url: String,
    parallel: u32,
    native_mib_s: f64,
    curl_mib_s: f64,
    parallel_mib_s: f64,
    /// curl / native: the target is >= 0.8.
    curl_vs_native: f64,
    /// parallel ranges / one stream.
    parallel_vs_curl: f64,
}

pub async fn run(config: Option<PathBuf>, a: HttpArgs) -> Result<()> {
    let usage = |m: String| anyhow::Error::new(crate::cli::UsageError(m));
    let Some(config) = config else {
        return Err(usage("shoal bench http needs a cluster: pass --config FILE or set SHOAL_CONFIG".into()));
    };
    if a.size == 0 || a.parallel == 0 {
        return Err(usage("--size and --parallel must be at least 1".into()));
    }
    let client = Client::from_config(&config, ClientOptions::default())
        .with_context(|| format!("connect to the cluster of {}", config.display()))?;
    let Some(entry) = client.map().servers.iter().find(|s| s.id == a.server) else {
        return Err(usage(format!("no server {} in {}", a.server, config.display())));
    };
    let Some(http) = entry.http.clone() else {
        bail!("server {} has no http address in {}", a.server, config.display());
    };
    let url = format!("http://{http}/fs{}", a.path);
    let mib = a.size as f64 / (1 << 20) as f64;

    // The file, striped over every server.
    if let Some((dir, _)) = a.path.rsplit_once('/').filter(|(d, _)| !d.is_empty()) {
        client.mkdir_all(dir, 0o755).await?;
    }
    let spec = LayoutSpec { stripe_count: Some(u32::MAX), ..Default::default() };
    let f = client.create(&a.path, 0o644, Some(spec)).await?;
    let block: Vec<u8> = (0..CHUNK).map(|_| rand::random::<u8>()).collect();
    let mut off = 0;
    while off < a.size {
        let n = (a.size - off).min(CHUNK as u64) as usize;
        f.write_at(off, &block[..n]).await?;
        off += n as u64;
    }
    f.close().await?;
    let result = measure(&client, &a, &url, mib).await;
    let _ = client.unlink(&a.path).await;
    let (native, one, par) = result?;
    let r = Report {
        size: a.size,
        server: a.server,
        url,
        parallel: a.parallel,
        native_mib_s: native,
        curl_mib_s: one,
        parallel_mib_s: par,
        curl_vs_native: one / native,
        parallel_vs_curl: par / one,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("file {:.0} MiB striped over {} servers, GETs from {}", mib, client.map().servers.len(), r.url);
        println!("{:<16} {:>10} {:>8}", "read", "MiB/s", "ratio");
        println!("{:<16} {:>10.1} {:>8}", "native (cp)", native, "1.00");
        println!("{:<16} {:>10.1} {:>8.2}", "curl", one, r.curl_vs_native);
        println!("{:<16} {:>10.1} {:>8.2}", format!("curl -r x{}", a.parallel), par, par / native);
    }
    Ok(())
}

/// MiB/s of the native read, one curl stream and the parallel range GETs.
async fn measure(client: &Client, a: &HttpArgs, url: &str, mib: f64) -> Result<(f64, f64, f64)> {
    let t = Instant::now();
    let f = client.open(&a.path, OpenFlags::read_only()).await?;
    let mut off = 0;
    while off < a.size {
        let got = f.read_at(off, CHUNK).await?;
        if got.is_empty() {
            bail!("{} ended at {off} of {} bytes", a.path, a.size);
        }
        off += got.len() as u64;
    }
    f.close().await?;
    let native = mib / t.elapsed().as_secs_f64();

    let t = Instant::now();
    curl(url, None, a.token.as_deref()).await?;
    let one = mib / t.elapsed().as_secs_f64();

    let t = Instant::now();
    let n = a.parallel as u64;
    let per = a.size.div_ceil(n);
    let gets = (0..n).map(|i| (i * per, ((i + 1) * per).min(a.size))).filter(|(s, e)| s < e).map(|(s, e)| {
        let range = format!("{s}-{}", e - 1);
        async move { curl(url, Some(&range), a.token.as_deref()).await }
    });
    futures::future::try_join_all(gets).await?;
    let par = mib / t.elapsed().as_secs_f64();
    Ok((native, one, par))
}

/// GET `url` (a byte range of it) to /dev/null with curl; fails on any HTTP error.
async fn curl(url: &str, range: Option<&str>, token: Option<&str>) -> Result<()> {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sSf", "-o", "/dev/null", url]);
    if let Some(r) = range {
        cmd.args(["-r", r]);
    }
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd.output().await.context("run curl (is it installed?)")?;
    if !out.status.success() {
        bail!(
            "curl {url}{}: {}",
            range.map(|r| format!(" -r {r}")).unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
