//! `shoal bench watch`: how soon a change reaches a subscriber, and whether a consumer
//! that restarts misses or repeats any (issue 18; docs/changes.md).
//!
//! `--writers` clients each create, write (`--size` bytes) and close `--files` files under
//! the base directory, noting when each close was acknowledged. One more client follows the
//! base directory's `close` events as consumer `bench-watch-PID`, noting when each event
//! arrives; every `--restart-every` events it acknowledges, drops its watch and starts a new
//! one with the same consumer name (a consumer restart). Latency is arrival less
//! acknowledgement, per file; an event that arrives before the writer saw its
//! acknowledgement counts as 0.
//!
//! The run fails unless every file's event arrived exactly once.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use shoal_client::{ChangeKind, ChangeStart, ChangeWatchOptions, Client, ClientOptions};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:
  shoal bench watch                       # 4 writers x 250 files, a consumer restart every 200 events
  shoal bench watch --writers 8 --files 500 --json
The target of issue 18: an event reaches a subscriber <= 100 ms (median) after the operation was \
acknowledged; after a consumer restart, zero events missed or repeated.")]
pub struct WatchArgs {
    /// Writing clients, each with its own connections.
    #[arg(long, default_value_t = 4)]
    pub writers: u32,
    /// Files each writer creates, writes and closes.
    #[arg(long, default_value_t = 250)]
    pub files: u32,
    /// Bytes written to each file (K, M suffixes).
    #[arg(long, default_value = "4K", value_parser = crate::cli::parse_size)]
    pub size: u64,
    /// The consumer acknowledges and restarts its watch after this many events (0: never).
    #[arg(long, default_value_t = 200)]
    pub restart_every: u64,
    /// Shoal directory the files are written in (removed at the end).
    #[arg(long, default_value = "/shoal-bench/watch", value_name = "PATH")]
    pub base: String,
    /// Print the results as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    /// No progress messages.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

#[derive(Serialize, Debug, Clone)]
pub struct WatchReport {
    pub writers: u32,
    pub files: u64,
    pub size: u64,
    pub events: u64,
    pub restarts: u64,
    pub missed: u64,
    pub repeated: u64,
    /// Latency from the writer's acknowledgement to the subscriber, milliseconds.
    pub median_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Files written per second while the subscriber followed.
    pub files_per_s: f64,
}

/// When each file's close was acknowledged, by path.
type Acked = Arc<std::sync::Mutex<HashMap<String, Instant>>>;

pub async fn run(config: Option<PathBuf>, a: WatchArgs) -> Result<()> {
    let Some(config) = config else {
        return Err(usage("shoal bench watch needs a cluster: pass --config FILE or set SHOAL_CONFIG"));
    };
    if a.writers == 0 || a.files == 0 {
        return Err(usage("--writers and --files must be at least 1"));
    }
    let client = Client::from_config(&config, ClientOptions::default())
        .with_context(|| format!("connect to the cluster of {}", config.display()))?;
    let base = format!("{}-{}", a.base.trim_end_matches('/'), std::process::id());
    let _ = client.remove_all(&base).await;
    client.mkdir_all(&base, 0o755).await.with_context(|| format!("cannot make {base}"))?;
    let consumer = format!("bench-watch-{}", std::process::id());
    let total = a.writers as u64 * a.files as u64;
    let opts = || ChangeWatchOptions {
        kinds: ChangeKind::Close.bit(),
        start: ChangeStart::Consumer(consumer.clone()),
        ..Default::default()
    };
    // The consumer is registered (its place kept) before anything is written.
    let watcher = Client::from_config(&config, ClientOptions::default())?;
    let mut w = watcher.watch_changes(&base, opts()).await.context("cannot watch")?;
    let acked: Acked = Arc::default();
    if !a.quiet {
        eprintln!("bench watch: {} writers x {} files under {base}", a.writers, a.files);
    }
    let start = Instant::now();
    let writers: Vec<_> = (0..a.writers)
        .map(|i| {
            let (config, base, acked, a) = (config.clone(), base.clone(), acked.clone(), a.clone());
            tokio::spawn(async move { write_files(&config, &base, i, &a, &acked).await })
        })
        .collect();
    let mut seen: HashMap<String, u32> = HashMap::new();
    let mut latencies = Vec::new();
    let (mut restarts, mut since_restart) = (0u64, 0u64);
    let idle = Duration::from_secs(20);
    while (seen.len() as u64) < total {
        let Some(c) = w.next(Some(idle)).await.context("watching")? else {
            break; // nothing for 20 s: what is missing is reported below
        };
        let arrived = Instant::now();
        *seen.entry(c.any_path().to_string()).or_default() += 1;
        // The writer notes the acknowledgement right after close returns; an event can come
        // first, and is then waited for here briefly.
        let mut ack = acked.lock().expect("not poisoned").get(c.any_path()).copied();
        for _ in 0..100 {
            if ack.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            ack = acked.lock().expect("not poisoned").get(c.any_path()).copied();
        }
        if let Some(t) = ack {
            latencies.push(arrived.saturating_duration_since(t).as_secs_f64() * 1000.0);
        }
        since_restart += 1;
        if a.restart_every > 0 && since_restart >= a.restart_every {
            w.ack().await?;
            drop(w);
            w = watcher.watch_changes(&base, opts()).await.context("cannot watch again")?;
            restarts += 1;
            since_restart = 0;
        }
    }
    let files_per_s = total as f64 / start.elapsed().as_secs_f64();
    for t in writers {
        t.await.context("a writer panicked")??;
    }
    // Anything after the last expected event would be a repeat: look briefly.
    while let Some(c) = w.next(Some(Duration::from_millis(500))).await? {
        *seen.entry(c.any_path().to_string()).or_default() += 1;
    }
    let _ = watcher.forget_consumer(&consumer).await;
    let _ = client.remove_all(&base).await;
    let written: Vec<String> = acked.lock().expect("not poisoned").keys().cloned().collect();
    let missed = written.iter().filter(|p| !seen.contains_key(*p)).count() as u64;
    let repeated = seen.values().map(|n| n.saturating_sub(1) as u64).sum();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies.get(((latencies.len() as f64 * p) as usize).min(latencies.len().max(1) - 1)).copied();
    let report = WatchReport {
        writers: a.writers,
        files: total,
        size: a.size,
        events: seen.values().map(|n| *n as u64).sum(),
        restarts,
        missed,
        repeated,
        median_ms: pct(0.5).unwrap_or(f64::NAN),
        p90_ms: pct(0.9).unwrap_or(f64::NAN),
        p99_ms: pct(0.99).unwrap_or(f64::NAN),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
        files_per_s,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    if missed > 0 || repeated > 0 {
        bail!("{missed} events missed and {repeated} repeated");
    }
    Ok(())
}

async fn write_files(config: &std::path::Path, base: &str, writer: u32, a: &WatchArgs, acked: &Acked) -> Result<()> {
    let client = Client::from_config(config, ClientOptions::default())?;
    let data = vec![writer as u8; a.size as usize];
    for i in 0..a.files {
        let path = format!("{base}/w{writer}-{i}.dat");
        let f = client.create(&path, 0o644, None).await.with_context(|| format!("cannot create {path}"))?;
        f.write_at(0, &data).await?;
        f.close().await?;
        acked.lock().expect("not poisoned").insert(path, Instant::now());
    }
    Ok(())
}

fn print_table(r: &WatchReport) {
    println!(
        "change events: {} writers x {} files of {} bytes, {:.0} files/s; {} consumer restarts",
        r.writers,
        r.files / r.writers as u64,
        r.size,
        r.files_per_s,
        r.restarts
    );
    println!(
        "{:>8} {:>8} {:>9} {:>10} {:>9} {:>9} {:>9}",
        "events", "missed", "repeated", "median ms", "p90 ms", "p99 ms", "max ms"
    );
    println!(
        "{:>8} {:>8} {:>9} {:>10.2} {:>9.2} {:>9.2} {:>9.2}",
        r.events, r.missed, r.repeated, r.median_ms, r.p90_ms, r.p99_ms, r.max_ms
    );
    let met = r.median_ms <= 100.0 && r.missed == 0 && r.repeated == 0;
    println!(
        "target: median <= 100 ms after the acknowledgement, none missed or repeated across restarts: {}",
        if met { "met" } else { "NOT met" }
    );
}

fn usage(m: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(crate::cli::UsageError(m.into()))
}
