//! `shoal bench find`: a metadata query over a big tree (issue 18; docs/find.md), by the
//! servers (`shoal find`) against `find` on a fresh FUSE mount of the same tree, on a local
//! directory holding the same tree, and on tmpfs.
//!
//! The tree is `--files` empty files in directories of `--per-dir`, two levels deep
//! (`dNNN/eNNN/fNNNNNNN`), made on Shoal with batched creates and locally with plain
//! creates. The query asks for the names ending in 7 (a tenth of the files), so every case
//! looks at every entry and prints a tenth. Each case runs `--runs` times; the table shows
//! the best and the median. Every case must find the same number of paths, or the
//! benchmark fails.

use crate::mounts::Mounts;
use anyhow::{bail, Context, Result};
use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use shoal_client::{Client, ClientOptions, FindOptions, FindQuery};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:
  shoal bench find                        # 100,000 files
  shoal bench find --files 1000000 --json
The target of issue 18: shoal find <= 0.25x the time of find on the FUSE mount. Needs fusermount3.")]
pub struct FindArgs {
    /// Files in the tree.
    #[arg(long, default_value_t = 100_000)]
    pub files: usize,
    /// Files per directory.
    #[arg(long, default_value_t = 1000)]
    pub per_dir: usize,
    /// Times each case runs (the median and the best are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Shoal directory the tree is made in (removed at the end unless --keep).
    #[arg(long, default_value = "/shoal-bench/find", value_name = "PATH")]
    pub base: String,
    /// Use the tree already at --base (made by an earlier --keep run with the same --files
    /// and --per-dir) instead of making it again.
    #[arg(long)]
    pub reuse: bool,
    /// Print the results as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    /// Leave the tree in place.
    #[arg(long)]
    pub keep: bool,
    /// No progress messages.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// One case, measured.
#[derive(Serialize, Debug, Clone)]
pub struct Case {
    pub name: String,
    /// "find" (found = paths printed) or "du" (found = inodes counted).
    pub query: &'static str,
    pub found: usize,
    pub best_s: f64,
    pub median_s: f64,
}

#[derive(Serialize, Debug)]
pub struct FindReport {
    pub files: usize,
    pub per_dir: usize,
    pub servers: usize,
    pub cases: Vec<Case>,
    /// shoal find / find on the FUSE mount, medians (target <= 0.25).
    pub shoal_vs_fuse: f64,
    /// shoal find / find on the local directory, medians.
    pub shoal_vs_local: f64,
    /// shoal du / du on the FUSE mount, medians.
    pub du_vs_fuse: f64,
    /// shoal du / du on the local directory, medians.
    pub du_vs_local: f64,
}

const PATTERN: &str = "*7";

fn usage(m: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(crate::cli::UsageError(m.into()))
}

pub async fn run(config: Option<PathBuf>, a: FindArgs) -> Result<()> {
    let Some(config) = config else {
        return Err(usage("shoal bench find needs a cluster: pass --config FILE or set SHOAL_CONFIG"));
    };
    if a.files == 0 || a.per_dir == 0 || a.runs == 0 {
        return Err(usage("--files, --per-dir and --runs must be at least 1"));
    }
    let client = Client::from_config(&config, ClientOptions::default())
        .with_context(|| format!("connect to the cluster of {}", config.display()))?;
    let say = |m: &str| {
        if !a.quiet {
            eprintln!("bench find: {m}");
        }
    };
    let base = a.base.trim_end_matches('/').to_string();
    let tree = format!("{base}/tree");
    let work = tempfile::Builder::new().prefix("shoal-bench-find-").tempdir().context("make a temporary directory")?;
    if !a.reuse {
        let _ = client.remove_all(&base).await;
        client.mkdir_all(&tree, 0o755).await?;
        say(&format!("making {} files on Shoal", a.files));
        make_on_shoal(&client, &tree, &a).await?;
    }
    say("making the same tree locally and on tmpfs");
    let local = work.path().join("tree");
    make_local(&local, &a)?;
    let shm = tempfile::Builder::new().prefix("shoal-bench-find-").tempdir_in("/dev/shm").ok();
    if let Some(s) = &shm {
        make_local(&s.path().join("tree"), &a)?;
    }
    let result = measure(&config, &a, &tree, work.path(), &local, shm.as_ref().map(|s| s.path()), &say).await;
    if !a.keep {
        say("removing the tree");
        let _ = client.remove_all(&base).await;
    }
    let cases = result?;
    for query in ["find", "du"] {
        let group: Vec<&Case> = cases.iter().filter(|c| c.query == query).collect();
        if let Some(c) = group.iter().find(|c| c.found != group[0].found) {
            bail!("{} found {}, {} found {}: the trees differ", group[0].name, group[0].found, c.name, c.found);
        }
    }
    let median = |n: &str| cases.iter().find(|c| c.name == n).map(|c| c.median_s).unwrap_or(f64::NAN);
    let report = FindReport {
        files: a.files,
        per_dir: a.per_dir,
        servers: client.status_all().await.len(),
        shoal_vs_fuse: median(SHOAL) / median(FUSE),
        shoal_vs_local: median(SHOAL) / median(LOCAL),
        du_vs_fuse: median(SHOAL_DU) / median(DU_FUSE),
        du_vs_local: median(SHOAL_DU) / median(DU_LOCAL),
        cases,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

const SHOAL: &str = "shoal find";
const FUSE: &str = "find, FUSE mount";
const LOCAL: &str = "find, local directory";
const TMPFS: &str = "find, tmpfs";
const SHOAL_DU: &str = "shoal du";
const DU_FUSE: &str = "du, FUSE mount";
const DU_LOCAL: &str = "du, local directory";
const DU_TMPFS: &str = "du, tmpfs";

#[allow(clippy::too_many_arguments)]
async fn measure(
    config: &Path,
    a: &FindArgs,
    tree: &str,
    work: &Path,
    local: &Path,
    shm: Option<&Path>,
    say: &dyn Fn(&str),
) -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    say("shoal find");
    let query = FindQuery { name: Some(PATTERN.into()), ..Default::default() };
    let mut times = Vec::new();
    let mut found = 0;
    for _ in 0..a.runs {
        // A fresh client each run: nothing cached from the one before.
        let fresh = Client::from_config(config, ClientOptions::default())?;
        let t = Instant::now();
        let (hits, _) = fresh.find(tree, &query, FindOptions::default()).await?;
        times.push(t.elapsed().as_secs_f64());
        found = hits.len();
    }
    cases.push(case(SHOAL, found, times));
    say("find on a FUSE mount (a fresh mount each run)");
    let mut times = Vec::new();
    for _ in 0..a.runs {
        let m = Mounts::start(config, work, 1, false)?;
        let root = m.points[0].join(tree.trim_start_matches('/'));
        let (t, n) = find_in(&root)?;
        times.push(t);
        found = n;
    }
    cases.push(case(FUSE, found, times));
    for (name, dir) in [(LOCAL, Some(local.to_path_buf())), (TMPFS, shm.map(|s| s.join("tree")))] {
        let Some(dir) = dir else { continue };
        say(name);
        let mut times = Vec::new();
        for _ in 0..a.runs {
            let (t, n) = find_in(&dir)?;
            times.push(t);
            found = n;
        }
        cases.push(case(name, found, times));
    }
    say("shoal du");
    let mut times = Vec::new();
    for _ in 0..a.runs {
        let fresh = Client::from_config(config, ClientOptions::default())?;
        let t = Instant::now();
        let r = fresh.du(tree, 0).await?;
        times.push(t.elapsed().as_secs_f64());
        found = r.dirs.last().map_or(0, |d| d.inodes() as usize);
    }
    cases.push(case(SHOAL_DU, found, times));
    say("du on a FUSE mount (a fresh mount each run)");
    let mut times = Vec::new();
    for _ in 0..a.runs {
        let m = Mounts::start(config, work, 1, false)?;
        let (t, n) = du_in(&m.points[0].join(tree.trim_start_matches('/')))?;
        times.push(t);
        found = n;
    }
    cases.push(case(DU_FUSE, found, times));
    for (name, dir) in [(DU_LOCAL, Some(local.to_path_buf())), (DU_TMPFS, shm.map(|s| s.join("tree")))] {
        let Some(dir) = dir else { continue };
        say(name);
        let mut times = Vec::new();
        for _ in 0..a.runs {
            let (t, n) = du_in(&dir)?;
            times.push(t);
            found = n;
        }
        cases.push(case(name, found, times));
    }
    Ok(cases)
}

/// `du -s --inodes DIR`: seconds and the inodes it counted.
fn du_in(dir: &Path) -> Result<(f64, usize)> {
    let t = Instant::now();
    let out = Command::new("du").args(["-s", "--inodes"]).arg(dir).output().context("run du")?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("du {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let n = text.split_whitespace().next().and_then(|n| n.parse().ok());
    Ok((secs, n.with_context(|| format!("du printed {text:?}"))?))
}

fn case(name: &str, found: usize, mut times: Vec<f64>) -> Case {
    times.sort_by(f64::total_cmp);
    let query = if name.contains("du") { "du" } else { "find" };
    Case { name: name.to_string(), query, found, best_s: times[0], median_s: times[times.len() / 2] }
}

/// `find DIR -name PATTERN`: seconds and lines printed.
fn find_in(dir: &Path) -> Result<(f64, usize)> {
    let t = Instant::now();
    let out = Command::new("find").arg(dir).args(["-name", PATTERN]).output().context("run find")?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("find {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok((secs, out.stdout.iter().filter(|&&b| b == b'\n').count()))
}

/// Where file `i` goes: `dNNN/eNNN/fNNNNNNN`, `per_dir` files to a directory and `per_dir`
/// directories to a first-level one.
fn place(i: usize, per_dir: usize) -> (String, String) {
    let leaf = i / per_dir;
    (format!("d{:03}/e{:03}", leaf / per_dir, leaf % per_dir), format!("f{i:07}"))
}

async fn make_on_shoal(client: &Client, tree: &str, a: &FindArgs) -> Result<()> {
    let bar = progress(a.files as u64, a.quiet);
    let dirs = a.files.div_ceil(a.per_dir);
    let made = futures::stream::iter(0..dirs)
        .map(|d| {
            let bar = &bar;
            async move {
                let first = d * a.per_dir;
                let last = (first + a.per_dir).min(a.files);
                let (sub, _) = place(first, a.per_dir);
                let dir = client.mkdir_all(&format!("{tree}/{sub}"), 0o755).await?;
                let names: Vec<String> = (first..last).map(|i| place(i, a.per_dir).1).collect();
                for chunk in names.chunks(256) {
                    for r in client.create_many_at(dir.ino, chunk, 0o644, true).await? {
                        r?;
                    }
                    bar.inc(chunk.len() as u64);
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    bar.finish_and_clear();
    made.into_iter().collect()
}

fn make_local(root: &Path, a: &FindArgs) -> Result<()> {
    for i in 0..a.files {
        let (sub, name) = place(i, a.per_dir);
        let dir = root.join(sub);
        if i % a.per_dir == 0 {
            std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        }
        std::fs::File::create(dir.join(name))?;
    }
    Ok(())
}

fn progress(n: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} files ({per_sec}, {eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn print_table(r: &FindReport) {
    println!(
        "metadata query: {} files in directories of {} on {} servers; find -name '{PATTERN}'",
        r.files, r.per_dir, r.servers
    );
    println!("{:<24} {:>8} {:>9} {:>9}", "case", "found", "best s", "median s");
    // "found": paths for the find cases, inodes for the du cases.
    for c in &r.cases {
        println!("{:<24} {:>8} {:>9.3} {:>9.3}", c.name, c.found, c.best_s, c.median_s);
    }
    let met = if r.shoal_vs_fuse <= 0.25 { "met" } else { "NOT met" };
    println!("shoal find / find on the FUSE mount: {:.3} (target <= 0.25: {met})", r.shoal_vs_fuse);
    println!("shoal find / find on the local directory: {:.3}", r.shoal_vs_local);
    println!("shoal du / du on the FUSE mount: {:.3}; on the local directory: {:.3}", r.du_vs_fuse, r.du_vs_local);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_placed_per_dir_to_a_directory() {
        assert_eq!(place(0, 1000), ("d000/e000".to_string(), "f0000000".to_string()));
        assert_eq!(place(1999, 1000).0, "d000/e001");
        assert_eq!(place(1_000_000, 1000).0, "d001/e000");
    }
}
