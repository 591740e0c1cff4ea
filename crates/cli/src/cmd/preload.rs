//! `shoal preload`: warm the caches of this node's Shoal mount with the files a job is about
//! to open (docs/loading.md, "Preload").
//!
//! Run once per node at a job's start (`mpirun -npernode 1 shoal preload …`, or `srun
//! --ntasks-per-node=1`), before the application: it lists every directory of the trees
//! given and reads every file, several at once, through the mount. What stays:
//! * the kernel's pages of read-mostly files, kept from one open to the next while the
//!   file is unchanged (`FOPEN_KEEP_CACHE`), so the application's reads cost no request;
//! * the kernel's listings of read-mostly directories (`FOPEN_CACHE_DIR`), and the mount's
//!   listings and attributes under their leases.
//!
//! Files that are not read-mostly are read too (a full read also checks that every piece can
//! be reached), but their pages are dropped at their next open, as every open does.
//!
//! It goes through the mount, not the native client: the caches it fills are the node's,
//! shared by every process on it; a native client's would end with this process.

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

#[derive(Args)]
pub struct PreloadArgs {
    /// Files and directory trees on a Shoal mount (directories are walked; symbolic links
    /// are read through, never walked into).
    paths: Vec<PathBuf>,
    /// A file naming the paths to warm, one per line (`-`: standard input); blank lines and
    /// lines starting with `#` are skipped. Directories named there are walked too.
    #[arg(long, short = 'l', value_name = "FILE")]
    list: Option<PathBuf>,
    /// Files read at once.
    #[arg(long, short = 'j', default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    jobs: u16,
    /// One JSON object with the counts (and the failures) instead of the summary.
    #[arg(long)]
    json: bool,
}

/// What was warmed, and what could not be.
#[derive(Default, serde::Serialize)]
struct Summary {
    files: u64,
    dirs: u64,
    bytes: u64,
    seconds: f64,
    failed: Vec<Failure>,
    /// Paths given that are not on a Shoal mount (read anyway).
    not_shoal: Vec<String>,
}

#[derive(serde::Serialize)]
struct Failure {
    path: String,
    error: String,
}

pub async fn preload(a: PreloadArgs) -> Result<()> {
    tokio::task::spawn_blocking(move || run(a)).await?
}

fn run(a: PreloadArgs) -> Result<()> {
    let mut roots = a.paths.clone();
    if let Some(list) = &a.list {
        roots.extend(read_list(list)?);
    }
    if roots.is_empty() {
        return Err(super::UsageError("nothing to preload: give paths, or --list FILE".into()).into());
    }
    let start = Instant::now();
    let mut sum = Summary::default();
    let shoal = shoal_devices();
    let bar = if a.json { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    bar.set_style(style("{spinner} listing: {msg} ({elapsed})"));
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let mut files = Vec::new();
    for root in &roots {
        match std::fs::metadata(root) {
            Ok(m) if !shoal.contains(&m.dev()) => sum.not_shoal.push(root.display().to_string()),
            _ => {}
        }
        walk(root, &mut files, &mut sum, &bar);
    }
    // Largest first: the long reads start early and the small ones fill in.
    files.sort_by_key(|f| std::cmp::Reverse(f.1));
    let total: u64 = files.iter().map(|f| f.1).sum();
    bar.set_length(total);
    bar.set_position(0);
    bar.set_style(style("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {msg} ({elapsed}, {eta} left)"));
    bar.set_message(format!("{} files", files.len()));
    let queue = Mutex::new(files.into_iter());
    let (read, bytes) = (AtomicU64::new(0), AtomicU64::new(0));
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..a.jobs {
            s.spawn(|| {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let Some((path, _)) = queue.lock().unwrap().next() else { return };
                    match read_whole(&path, &mut buf, &bar) {
                        Ok(n) => {
                            read.fetch_add(1, Ordering::Relaxed);
                            bytes.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => failed.lock().unwrap().push(Failure { path: path.display().to_string(), error: e }),
                    }
                }
            });
        }
    });
    bar.finish_and_clear();
    sum.files = read.into_inner();
    sum.bytes = bytes.into_inner();
    sum.failed.extend(failed.into_inner().unwrap());
    sum.seconds = start.elapsed().as_secs_f64();
    report(&a, &sum);
    match sum.failed.len() {
        0 => Ok(()),
        n => Err(anyhow::anyhow!(
            "{n} of the paths could not be warmed ({})",
            if a.json { "\"failed\" above" } else { "listed above" }
        )),
    }
}

/// The paths of a list file (or of standard input for `-`).
fn read_list(list: &Path) -> Result<Vec<PathBuf>> {
    let text = if list == Path::new("-") {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| anyhow::anyhow!("cannot read the list from standard input: {e}"))?;
        s
    } else {
        std::fs::read_to_string(list).map_err(|e| anyhow::anyhow!("cannot read the list {}: {e}", list.display()))?
    };
    Ok(text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(PathBuf::from).collect())
}

/// Queue the files under `root` with their sizes (a file: itself). Each directory is listed
/// once, and each entry looked up: that is what warms the listings and attributes.
fn walk(root: &Path, files: &mut Vec<(PathBuf, u64)>, sum: &mut Summary, bar: &ProgressBar) {
    let mut todo = vec![root.to_path_buf()];
    while let Some(path) = todo.pop() {
        // Followed: a root or a link to a file is read through; a link to a directory
        // below a root is not walked into (see below), so no loop is possible.
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                sum.failed.push(Failure { path: path.display().to_string(), error: e.to_string() });
                continue;
            }
        };
        if meta.is_file() {
            files.push((path, meta.len()));
            continue;
        }
        if !meta.is_dir() {
            continue;
        }
        sum.dirs += 1;
        bar.set_message(format!("{} directories, {} files", sum.dirs, files.len()));
        let entries = match std::fs::read_dir(&path) {
            Ok(d) => d,
            Err(e) => {
                sum.failed.push(Failure { path: path.display().to_string(), error: e.to_string() });
                continue;
            }
        };
        for entry in entries {
            match entry {
                Ok(e) => {
                    let is_link_to_dir = e.file_type().is_ok_and(|t| t.is_symlink())
                        && std::fs::metadata(e.path()).is_ok_and(|m| m.is_dir());
                    if !is_link_to_dir {
                        todo.push(e.path());
                    }
                }
                Err(e) => sum.failed.push(Failure { path: path.display().to_string(), error: e.to_string() }),
            }
        }
    }
}

/// Read `path` to its end, the bytes thrown away: the bytes read.
fn read_whole(path: &Path, buf: &mut [u8], bar: &ProgressBar) -> Result<u64, String> {
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut n = 0u64;
    loop {
        match f.read(buf) {
            Ok(0) => return Ok(n),
            Ok(k) => {
                n += k as u64;
                bar.inc(k as u64);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The devices of this mount namespace's Shoal mounts (`fuse.shoal` in mountinfo).
fn shoal_devices() -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            // "id parent major:minor root point options [optional…] - fstype source super"
            let (head, tail) = l.split_once(" - ")?;
            (tail.split(' ').next()? == "fuse.shoal").then_some(())?;
            let (major, minor) = head.split(' ').nth(2)?.split_once(':')?;
            Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
        })
        .collect()
}

fn report(a: &PreloadArgs, s: &Summary) {
    if a.json {
        println!("{}", serde_json::to_string(s).unwrap_or_default());
        return;
    }
    for p in &s.not_shoal {
        eprintln!("shoal preload: note: {p} is not on a Shoal mount (read anyway; no Shoal cache is warmed)");
    }
    for f in &s.failed {
        eprintln!("shoal preload: {}: {}", f.path, f.error);
    }
    let mb = s.bytes as f64 / 1e6;
    println!(
        "warmed {} files ({:.1} MB) and {} directories in {:.2} s ({:.1} MB/s){}",
        s.files,
        mb,
        s.dirs,
        s.seconds,
        mb / s.seconds.max(1e-9),
        match s.failed.len() {
            0 => String::new(),
            n => format!("; {n} failed"),
        }
    );
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}
