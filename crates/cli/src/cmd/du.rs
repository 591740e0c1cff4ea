//! `shoal du`: what trees hold, from the per-directory usage the servers keep (docs/du.md).

use super::{only_shoal, Ctx, Exit};
use crate::fmt::human_bytes;
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::time::Instant;

#[derive(Args)]
pub struct DuArgs {
    /// Trees to add up (shoal://path or /path).
    #[arg(required = true)]
    paths: Vec<String>,
    /// Also print every directory down to N levels below each PATH (0: PATH only), as
    /// du --max-depth.
    #[arg(short = 'd', long = "max-depth", default_value_t = 0)]
    max_depth: usize,
    /// Sizes in bytes, not as 1.5K, 20M, 3.1G.
    #[arg(short, long)]
    bytes: bool,
    /// A grand total after the trees.
    #[arg(short = 'c', long)]
    total: bool,
    /// One JSON object per directory and line (path, ino, depth, bytes, files, dirs, inodes).
    #[arg(long)]
    json: bool,
    /// What it cost (servers, requests, time) on standard error.
    #[arg(long)]
    stats: bool,
}

pub async fn du(ctx: &Ctx, a: DuArgs) -> Result<()> {
    let client = ctx.client()?;
    let bar = match std::io::IsTerminal::is_terminal(&std::io::stderr()) && !a.stats {
        true => spinner(),
        false => ProgressBar::hidden(),
    };
    let mut unreadable = 0;
    let mut grand = (0u64, 0u64, 0u64);
    for p in &a.paths {
        let path = only_shoal(p);
        let t = Instant::now();
        let report = client.du(&path, a.max_depth).await;
        bar.suspend(|| -> Result<()> {
            let report = report.with_context(|| format!("cannot add up {path}"))?;
            for d in &report.dirs {
                if a.json {
                    let line = serde_json::json!({
                        "path": d.path, "ino": d.ino.0, "depth": d.depth, "bytes": d.bytes,
                        "files": d.files, "dirs": d.dirs, "inodes": d.inodes(),
                    });
                    println!("{line}");
                } else {
                    let size = if a.bytes { d.bytes.to_string() } else { human_bytes(d.bytes) };
                    println!("{size:>8} {:>10} {}", d.inodes(), d.path);
                }
            }
            if let Some(top) = report.dirs.last() {
                grand = (grand.0 + top.bytes, grand.1 + top.inodes(), grand.2 + 1);
            }
            if !report.unreadable.is_empty() {
                unreadable += report.unreadable.len();
                let inos: Vec<String> = report.unreadable.iter().take(8).map(|i| i.0.to_string()).collect();
                eprintln!(
                    "shoal: {path}: {} directories could not be read (permission denied), their contents not counted (inodes {}{})",
                    report.unreadable.len(),
                    inos.join(", "),
                    if report.unreadable.len() > 8 { ", …" } else { "" }
                );
            }
            if a.stats {
                eprintln!(
                    "{path}: {} servers, {} requests, {:.3} s",
                    report.servers,
                    report.requests,
                    t.elapsed().as_secs_f64()
                );
            }
            Ok(())
        })?;
    }
    bar.finish_and_clear();
    if a.total && grand.2 > 0 {
        if a.json {
            println!("{}", serde_json::json!({ "path": "total", "bytes": grand.0, "inodes": grand.1 }));
        } else {
            let size = if a.bytes { grand.0.to_string() } else { human_bytes(grand.0) };
            println!("{size:>8} {:>10} total", grand.1);
        }
    }
    if unreadable > 0 {
        return Err(Exit::new(1, format!("{unreadable} directories could not be read")).into());
    }
    Ok(())
}

fn spinner() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} adding up every server's usage ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}
