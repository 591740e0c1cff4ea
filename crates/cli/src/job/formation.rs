//! A per-job formation's shared directory: the one place every rank of a job sees (a path on
//! the global file system), used instead of MPI for the little coordination `shoal job`
//! needs.
//!
//! ```text
//! SHARED/rank-<r>.json        where rank r's server is: host, ports, node-local data (written atomically)
//! SHARED/cluster.toml         the formation's map, written by rank 0 once every rank arrived
//! SHARED/cluster.key host.key fresh keys made by rank 0 (mode 0600)
//! SHARED/s<r>.pid s<r>.log    server r's pid and log (local_cluster::start_server)
//! SHARED/run-<key>/           one launcher run (a `job up` or `job down`):
//!     failed                  the first failure: "rank R: cause"; every waiting rank stops on it
//!     <phase>/<r>             rank r reached the barrier <phase>
//!     progress/<r>            bytes rank r has staged so far
//! ```
//!
//! Invariants: a file another rank reads is written to a temporary name and renamed, so it is
//! never seen half-written; every wait has a time limit and looks for `failed`, so one rank's
//! failure (or death: its barrier never fills) ends the wait on every other rank with an
//! error that names the rank, never a hang.

use super::launcher::Launch;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What rank r publishes about its server.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RankRecord {
    pub rank: u32,
    pub size: u32,
    /// Host name of the node (for messages and `job status`).
    pub host: String,
    /// The node's kernel boot id: a pid means something only where this matches.
    pub boot_id: String,
    /// `host:port` of the server's protocol port and of its HTTP port.
    pub addr: String,
    pub http: String,
    /// The server's data directory on node-local storage.
    pub local_dir: PathBuf,
    /// The folder made for the job under the node-local base (removed when empty).
    pub job_dir: PathBuf,
}

/// This node's boot id (`/proc/sys/kernel/random/boot_id`).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Write `data` to `path` so that readers see all of it or nothing (write, then rename).
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!(".{name}.tmp{}", std::process::id()));
    std::fs::write(&tmp, data).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

/// The shared directory as one launcher run sees it.
pub struct Shared {
    pub dir: PathBuf,
    pub rank: u32,
    pub size: u32,
    /// This run's own folder (`run-<key>`): barriers and the failure marker of an earlier
    /// `job up` or `job down` never count for this one.
    run: PathBuf,
    /// How long a barrier waits for the slowest rank.
    pub wait: Duration,
}

/// A name for this launcher run that every rank computes alike and a later run does not:
/// the launcher's job id (Open MPI's differs per `mpirun`; Slurm's job id plus the step id
/// differs per `srun`), plus the command.
fn run_key(launch: &Launch, what: &str) -> String {
    let step = std::env::var("SLURM_STEP_ID").unwrap_or_default();
    let job = launch.job.clone().unwrap_or_else(|| "nojob".into());
    let key = format!("{what}-{job}-{step}-{}", launch.size);
    key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

impl Shared {
    pub fn new(dir: &Path, launch: &Launch, what: &str, wait: Duration) -> Result<Shared> {
        let run = dir.join(format!("run-{}", run_key(launch, what)));
        std::fs::create_dir_all(&run).with_context(|| format!("cannot create {}", run.display()))?;
        Ok(Shared { dir: dir.to_path_buf(), rank: launch.rank, size: launch.size, run, wait })
    }

    pub fn config(&self) -> PathBuf {
        self.dir.join("cluster.toml")
    }

    pub fn record_path(dir: &Path, rank: u32) -> PathBuf {
        dir.join(format!("rank-{rank}.json"))
    }

    pub fn progress_dir(&self) -> PathBuf {
        self.run.join("progress")
    }

    /// Record the first failure of this run (a later one keeps the first: it is usually
    /// the cause, the others its echo).
    pub fn fail(&self, msg: &str) {
        let line = format!("rank {}: {}\n", self.rank, msg.replace('\n', " "));
        let tmp = self.run.join(format!(".failed.{}", self.rank));
        // A hard link fails if `failed` exists: the first writer wins, atomically.
        if std::fs::write(&tmp, line).is_ok() {
            let _ = std::fs::hard_link(&tmp, self.run.join("failed"));
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// The failure another rank recorded, if any.
    pub fn failure(&self) -> Option<String> {
        std::fs::read_to_string(self.run.join("failed")).ok().map(|s| s.trim().to_string())
    }

    /// Say this rank reached `phase`, then wait until every rank has (or one failed, or
    /// the time is up: an error naming the ranks still missing).
    pub fn barrier(&self, phase: &str) -> Result<()> {
        self.arrive(phase)?;
        self.wait_for(phase, 0..self.size)
    }

    /// Mark `phase` reached by this rank without waiting.
    pub fn arrive(&self, phase: &str) -> Result<()> {
        let d = self.run.join(phase);
        std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        write_atomic(&d.join(self.rank.to_string()), b"")
    }

    /// Wait until the ranks `ranks` reached `phase`.
    pub fn wait_for(&self, phase: &str, ranks: std::ops::Range<u32>) -> Result<()> {
        self.wait_inner(phase, ranks, true, self.wait)
    }

    /// After a failure: say this rank has cleaned up and wait (at most `limit`) until every
    /// rank has, so that no rank exits while another still stops its server (launchers
    /// kill the remaining ranks once one exits non-zero).
    pub fn cleaned_up(&self, limit: Duration) {
        if self.arrive("cleaned").is_ok() {
            let _ = self.wait_inner("cleaned", 0..self.size, false, limit);
        }
    }

    fn wait_inner(
        &self,
        phase: &str,
        ranks: std::ops::Range<u32>,
        stop_on_failure: bool,
        limit: Duration,
    ) -> Result<()> {
        let d = self.run.join(phase);
        let start = Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            if let Some(f) = self.failure().filter(|_| stop_on_failure) {
                return Err(anyhow!(Failed(f)));
            }
            let missing: Vec<u32> = ranks.clone().filter(|r| !d.join(r.to_string()).exists()).collect();
            if missing.is_empty() {
                return Ok(());
            }
            if start.elapsed() > limit {
                let shown: Vec<String> = missing.iter().take(8).map(|r| r.to_string()).collect();
                let more = if missing.len() > 8 { format!(" and {} more", missing.len() - 8) } else { String::new() };
                bail!(
                    "ranks {}{more} did not reach \"{phase}\" within {} s (dead, or not started by the launcher?)",
                    shown.join(", "),
                    limit.as_secs()
                );
            }
            std::thread::sleep(pause);
            // Poll a global file system gently once the wait gets long.
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

/// Another rank's failure, as recorded in `failed` ("rank R: cause"). Ranks that stop on it
/// do not record a failure of their own.
#[derive(Debug)]
pub struct Failed(pub String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "formation failed: {}", self.0)
    }
}
impl std::error::Error for Failed {}

/// Every rank's record, in rank order; an error names the first that is missing or unreadable.
pub fn read_records(dir: &Path, size: u32) -> Result<Vec<RankRecord>> {
    (0..size)
        .map(|r| {
            let p = Shared::record_path(dir, r);
            let text = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{} is not a rank record", p.display()))
        })
        .collect()
}

/// The records present in `dir`, whatever the size (for `job status` and clean-up).
pub fn scan_records(dir: &Path) -> Result<Vec<RankRecord>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if name.starts_with("rank-") && name.ends_with(".json") {
            let p = dir.join(&name);
            let text = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
            out.push(
                serde_json::from_str::<RankRecord>(&text)
                    .with_context(|| format!("{} is not a rank record", p.display()))?,
            );
        }
    }
    out.sort_by_key(|r| r.rank);
    Ok(out)
}

/// Remove what a formation put in the shared directory (records, map, keys, pid files,
/// logs, run folders), then the directory itself if nothing else is in it.
pub fn remove_formation_files(dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with("rank-")
            || name.starts_with("run-")
            || matches!(name.as_str(), "cluster.toml" | "cluster.key" | "host.key")
            || (name.starts_with('s') && (name.ends_with(".pid") || name.ends_with(".log")));
        if !ours {
            continue;
        }
        let p = e.path();
        let r = if e.file_type()?.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        r.with_context(|| format!("cannot remove {}", p.display()))?;
    }
    let _ = std::fs::remove_dir(dir);
    Ok(())
}
