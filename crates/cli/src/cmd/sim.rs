//! `shoal sim`: the balance of Shoal's placement over 1 to 100,000 servers, and what a
//! server joining or leaving moves, computed without servers (the logic is `shoal-sim`;
//! this file reads the options and prints).

use super::usage;
use crate::fmt::parse_size;
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use shoal_bench::plot::{Chart, Series};
use shoal_sim::{DirSizes, Report, Shape};
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
shoal sim                                    # 4, 10, 100, 1000 and 10000 servers, the default namespace\n  \
shoal sim -n 4 --dirs 0 --shared-files 4000  # md-hard: one shared directory of 4,000 files\n  \
shoal sim -n 10000 --dirs 1M --files-per-dir 1000 --dir-sizes pareto   # 10^9 files\n  \
shoal sim -n 100 --stripe-count 4 --file-size 64M --json\n  \
shoal sim -n 1000 --plot spread.svg\n\n\
Counts accept k, M, G (powers of 1000) and 1eN. Every directory and partition is placed with \
the servers' own placement functions; how a directory's names fall into its partitions is \
drawn from the binomial that a uniform name hash gives. docs/sim.md explains the figures.")]
pub struct SimArgs {
    /// Server counts to simulate, comma-separated (1 to 100,000 each).
    #[arg(short = 'n', long, value_name = "N,..", default_value = "4,10,100,1000,10000")]
    servers: String,
    /// Directories of files under the root (at most 100M).
    #[arg(long, value_name = "COUNT", default_value = "10k")]
    dirs: String,
    /// Files per directory (the mean, with --dir-sizes exp or pareto).
    #[arg(long, value_name = "COUNT", default_value = "100")]
    files_per_dir: String,
    /// How directory sizes vary: fixed, exp (exponential) or pareto (heavy tail, α 1.5).
    #[arg(long, value_name = "DIST", default_value = "fixed")]
    dir_sizes: String,
    /// Files in one more directory that every process of a job shares (0: none).
    #[arg(long, value_name = "COUNT", default_value = "1M")]
    shared_files: String,
    /// Bytes written to each file (K, M, G: powers of 1024); 0 writes no data object.
    #[arg(long, value_name = "SIZE", default_value = "3901")]
    file_size: String,
    /// Data objects per file (0: every server).
    #[arg(long, value_name = "COUNT", default_value = "1")]
    stripe_count: String,
    /// Stripe size (a multiple of 4K).
    #[arg(long, value_name = "SIZE", default_value = "1M")]
    stripe_size: String,
    /// Seed of the random draws; the same seed gives the same figures.
    #[arg(long, default_value = "1")]
    seed: String,
    /// Print the reports as JSON (an array, one per server count) instead of tables.
    #[arg(long)]
    json: bool,
    /// Write a chart of the per-server spread (load / mean, servers ordered by load) of the
    /// last server count to FILE (.svg or .png).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

/// "10k", "1M", "2G" (powers of 1000), "1e9", "4000" → a count.
fn parse_count(what: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let bad = || usage(format!("{what} {s:?} is not a count (examples: 4000, 10k, 1M, 1e9)"));
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1_000u64),
        Some('M') => (&t[..t.len() - 1], 1_000_000),
        Some('G') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (t, 1),
    };
    let base: u64 = match num.split_once(['e', 'E']) {
        Some((m, e)) => {
            let m: u64 = m.parse().map_err(|_| bad())?;
            let e: u32 = e.parse().map_err(|_| bad())?;
            10u64.checked_pow(e).and_then(|p| p.checked_mul(m)).ok_or_else(bad)?
        }
        None => num.parse().map_err(|_| bad())?,
    };
    base.checked_mul(mult).ok_or_else(bad)
}

fn parse_args(a: &SimArgs) -> Result<(Vec<u32>, Shape)> {
    let mut servers = Vec::new();
    for part in a.servers.split(',') {
        let n = parse_count("server count", part)?;
        servers.push(u32::try_from(n).map_err(|_| usage(format!("server count {n} is too large")))?);
    }
    let size = |what: &str, s: &str| parse_size(s).map_err(|e| usage(format!("{what}: {e}")));
    let stripe_count = parse_count("stripe count", &a.stripe_count)?;
    let shape = Shape {
        dirs: parse_count("directory count", &a.dirs)?,
        files_per_dir: parse_count("files per directory", &a.files_per_dir)?,
        dir_sizes: DirSizes::parse(&a.dir_sizes).map_err(usage)?,
        shared_files: parse_count("shared files", &a.shared_files)?,
        file_size: size("file size", &a.file_size)?,
        stripe_count: u32::try_from(stripe_count)
            .map_err(|_| usage(format!("stripe count {stripe_count} is too large")))?,
        stripe_size: size("stripe size", &a.stripe_size)?,
        seed: parse_count("seed", &a.seed)?,
    };
    for &n in &servers {
        shape.check(n).map_err(usage)?;
    }
    if let Some(p) = &a.plot {
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        if ext != "svg" && ext != "png" {
            return Err(usage(format!("--plot {}: the file name must end in .svg or .png", p.display())));
        }
    }
    Ok((servers, shape))
}

pub fn sim(a: SimArgs) -> Result<()> {
    let (servers, shape) = parse_args(&a)?;
    let mut reports: Vec<Report> = Vec::new();
    for &n in &servers {
        let bar = ProgressBar::new(1);
        bar.set_style(
            ProgressStyle::with_template("{prefix:<16} [{bar:30}] {percent}% {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{n} servers"));
        let report = shoal_sim::run(&shape, n, &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })
        .map_err(usage)?;
        bar.finish_and_clear();
        if !a.json {
            print!("{}", table(&report));
        }
        reports.push(report);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&reports).context("cannot write the reports as JSON")?);
    }
    if let (Some(path), Some(last)) = (&a.plot, reports.last()) {
        shoal_bench::plot::write(&chart(last), path)?;
    }
    Ok(())
}

/// 1234567 → "1,234,567".
fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn pct(f: f64) -> String {
    if f == 0.0 {
        "0%".into()
    } else if f < 0.001 {
        format!("{:.4}%", f * 100.0)
    } else {
        format!("{:.2}%", f * 100.0)
    }
}

fn table(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let shared = if r.shape.shared_files > 0 {
        format!(
            "; shared directory: {} files in {} partitions",
            grouped(r.shape.shared_files),
            grouped(r.shared_partitions as u64)
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "{} servers: {} files in {} directories{shared} (split at {} entries, down to depth {}; {:.2} s)",
        grouped(r.servers as u64),
        grouped(r.files),
        grouped(r.directories),
        r.split_entries,
        r.target_depth,
        r.seconds
    );
    let _ = writeln!(
        s,
        "  {:<12} {:>16} {:>14} {:>16} {:>14} {:>9} {:>9}",
        "kind", "total", "max", "mean", "min", "max/mean", "max/min"
    );
    for k in &r.spread {
        let _ = writeln!(
            s,
            "  {:<12} {:>16} {:>14} {:>16.1} {:>14} {:>9.3} {:>9}",
            k.kind,
            grouped(k.total),
            grouped(k.max),
            k.mean,
            grouped(k.min),
            k.max_over_mean,
            k.max_over_min.map_or("inf".to_string(), |v| format!("{v:.3}"))
        );
    }
    for m in &r.moved {
        let who = if m.change == "join" {
            format!("server {} joins", m.server)
        } else {
            format!("server {} leaves", m.server)
        };
        let _ = writeln!(
            s,
            "  {who}: moves inodes {} (rendezvous: {} expected, {} sampled), partitions {}, entries {}, objects {}",
            pct(m.inodes),
            pct(m.inodes_expected),
            grouped(m.inode_samples),
            pct(m.partitions),
            pct(m.entries),
            pct(m.objects)
        );
    }
    s.push('\n');
    s
}

/// Per kind, the servers ordered by load (x: percentile), load / mean (y); at most 200
/// points per kind.
fn chart(r: &Report) -> Chart {
    let series = r
        .spread
        .iter()
        .zip(&r.per_server)
        .filter(|(k, _)| k.kind != "data bytes" && k.total > 0)
        .map(|(k, v)| {
            let mut v = v.clone();
            v.sort_unstable();
            let n = v.len();
            let points = (0..n.min(200))
                .map(|i| {
                    let at = if n <= 200 { i } else { i * (n - 1) / 199 };
                    (if n > 1 { at as f64 * 100.0 / (n - 1) as f64 } else { 0.0 }, v[at] as f64 / k.mean)
                })
                .collect();
            Series { name: k.kind.clone(), points }
        })
        .collect();
    Chart {
        title: format!("shoal sim: {} servers, {} files", grouped(r.servers as u64), grouped(r.files)),
        x_label: "servers, least to most loaded (percentile)".into(),
        y_label: "load / mean".into(),
        x_ticks: [0.0, 25.0, 50.0, 75.0, 100.0].iter().map(|&x| (x, format!("{x}"))).collect(),
        log_x: false,
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_suffixes_and_exponents() {
        assert_eq!(parse_count("x", "4000").unwrap(), 4000);
        assert_eq!(parse_count("x", "10k").unwrap(), 10_000);
        assert_eq!(parse_count("x", "1M").unwrap(), 1_000_000);
        assert_eq!(parse_count("x", "1e9").unwrap(), 1_000_000_000);
        assert_eq!(parse_count("x", "2e3k").unwrap(), 2_000_000);
        assert!(parse_count("x", "lots").is_err());
        assert!(parse_count("x", "1e30").is_err());
        assert_eq!(grouped(1234567), "1,234,567");
        assert_eq!(grouped(12), "12");
    }
}
