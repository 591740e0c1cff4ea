//! The parent side (rank 0 under mpirun): prepares the run directory on a target, starts
//! one worker per rank (a process running this executable again, `shoal bench worker`; or,
//! under mpirun, uses the ranks already connected, see [`mpi`](crate::mpi)), runs the phases
//! in lock step (every worker starts a phase at the same instant; a phase lasts until the
//! slowest worker is done, as in IOR), reads the servers' counters around each phase, and
//! cleans up. The transport to the workers is behind [`Ranks`].

use crate::clock::mono_ns;
use crate::counters;
use crate::link::{self, Ranks};
use crate::report::{self, PhaseReport, Report, TargetRun};
use crate::spec::*;
use crate::worker::{GoMessage, PhaseResult};
use anyhow::{anyhow, bail, Context, Result};
use shoal_client::{Client, ClientOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How to start a worker process: `program args…`, which must run
/// [`worker_main`](crate::worker::worker_main).
#[derive(Clone, Debug)]
pub struct WorkerCmd {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl WorkerCmd {
    /// This executable with `bench worker` (the `shoal` binary).
    pub fn current_exe() -> Result<WorkerCmd> {
        let program = std::env::current_exe().context("cannot find this executable to start the workers")?;
        Ok(WorkerCmd { program, args: vec!["bench".into(), "worker".into()] })
    }
}

/// Where the workers come from.
#[derive(Clone)]
pub enum Launch {
    /// A process per rank per run, started by the driver.
    Spawn(WorkerCmd),
    /// The ranks of an mpirun job, connected once for the whole invocation (rank 0's own
    /// worker is a thread of this process).
    Mpi(Arc<tokio::sync::Mutex<Ranks>>),
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Launch::Spawn(c) => f.debug_tuple("Spawn").field(c).finish(),
            Launch::Mpi(_) => f.write_str("Mpi"),
        }
    }
}

/// One benchmark invocation: a workload, its phases, the targets it runs on.
#[derive(Clone, Debug)]
pub struct Bench {
    pub name: String,
    pub targets: Vec<TargetSpec>,
    pub workload: Workload,
    pub phases: Vec<Phase>,
    pub procs: u64,
    /// Default operations in flight per process (a target's `@K` overrides it).
    pub in_flight: usize,
    /// Repetitions; targets alternate within each (run 1 on every target, then run 2…).
    pub reps: usize,
    pub seed: u64,
    pub timeout: Duration,
    /// Native client's cache lifetime in the workers' inode-level calls (0: every stat is a request).
    pub cache_ttl_ms: u64,
    /// Native client's write-behind and readahead, if not the defaults.
    pub tuning: NativeTuning,
    /// Cluster whose counters describe FUSE targets (native targets use their own config).
    pub cluster_config: Option<PathBuf>,
    pub progress: bool,
    /// Leave the files in place at the end.
    pub keep: bool,
    pub launch: Launch,
}

static RUN_SEQ: AtomicU64 = AtomicU64::new(0);

/// A phase fails when no worker reports anything for this long (a hung mount, a dead server
/// without a timeout): the workers are killed instead of waiting forever.
const STALL_LIMIT: Duration = Duration::from_secs(300);

impl Bench {
    /// Operations a phase of this workload has, all processes together.
    pub fn phase_ops(&self, kind: PhaseKind) -> u64 {
        match &self.workload {
            Workload::Io(io) if kind.is_io() => io.transfers_per_proc() * self.procs,
            Workload::Md(md) if !kind.is_io() => md.files * self.procs,
            _ => 0,
        }
    }

    pub fn check(&self) -> Result<()> {
        if self.procs == 0 {
            bail!("at least one process is needed");
        }
        if self.targets.is_empty() {
            bail!("no target given");
        }
        for p in &self.phases {
            match (&self.workload, p.kind.is_io()) {
                (Workload::Io(_), false) | (Workload::Md(_), true) => {
                    bail!("phase {} does not belong to this workload", p.label)
                }
                _ => {}
            }
        }
        if let Workload::Io(io) = &self.workload {
            io.check()?;
        }
        Ok(())
    }
}

/// Run every repetition on every target (alternating), calling `on_run` after each run.
pub async fn run_bench(b: &Bench, mut on_run: impl FnMut(&TargetRun)) -> Result<Report> {
    b.check()?;
    let mut runs = Vec::new();
    for rep in 0..b.reps.max(1) {
        for target in &b.targets {
            let run = run_once(b, target, rep).await.with_context(|| format!("{} on {}", b.name, target.label()))?;
            on_run(&run);
            runs.push(run);
        }
    }
    let summary = report::summarize(&runs);
    let mpi = match &b.launch {
        Launch::Mpi(ranks) => ranks.lock().await.mpi.clone(),
        Launch::Spawn(_) => None,
    };
    Ok(Report {
        name: b.name.clone(),
        workload: b.workload.clone(),
        procs: b.procs,
        in_flight: b.in_flight,
        reps: b.reps.max(1),
        runs,
        summary,
        mpi,
    })
}

/// Sync and drop the page cache (as root). Returns whether it worked.
pub fn drop_caches() -> bool {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// A client for setting up and for reading counters (its cache on: setup walks paths).
pub fn control_client(config: &Path, timeout: Duration) -> Result<Client> {
    Client::from_config(config, ClientOptions { timeout, ..ClientOptions::default() })
        .with_context(|| format!("cannot use the cluster configuration {}", config.display()))
}

enum Place<'a> {
    Shoal { client: &'a Client, run_dir: String },
    Local { run_dir: PathBuf },
}

impl Place<'_> {
    fn run_dir_string(&self) -> String {
        match self {
            Place::Shoal { run_dir, .. } => run_dir.clone(),
            Place::Local { run_dir } => run_dir.display().to_string(),
        }
    }

    async fn mkdir(&self, rel: &str) -> Result<()> {
        match self {
            Place::Shoal { client, run_dir } => {
                let p = format!("{run_dir}/{rel}");
                client.mkdir_all(&p, 0o755).await.with_context(|| format!("mkdir {p}"))?;
            }
            Place::Local { run_dir } => {
                let p = run_dir.join(rel);
                std::fs::create_dir_all(&p).with_context(|| format!("mkdir {}", p.display()))?;
            }
        }
        Ok(())
    }

    async fn remove(&self) -> Result<()> {
        match self {
            Place::Shoal { client, run_dir } => {
                client.remove_all(run_dir).await.with_context(|| format!("remove {run_dir}"))?;
            }
            Place::Local { run_dir } => {
                let d = run_dir.clone();
                tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&d))
                    .await?
                    .with_context(|| format!("remove {}", run_dir.display()))?;
            }
        }
        Ok(())
    }
}

fn progress_bar(enabled: bool, len: u64, prefix: String) -> indicatif::ProgressBar {
    if !enabled {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template("{prefix:<22} [{bar:30}] {pos}/{len} {per_sec} {elapsed}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
    pb.set_style(style);
    pb.set_prefix(prefix);
    pb
}

/// One run of the workload on one target.
pub async fn run_once(b: &Bench, target: &TargetSpec, rep: usize) -> Result<TargetRun> {
    let in_flight = target.in_flight.unwrap_or(b.in_flight).max(1);
    let seq = RUN_SEQ.fetch_add(1, Ordering::Relaxed);
    let dir_name = format!("shoal-bench.{}.{}", std::process::id(), seq);
    // The cluster, for setting up (native) and for counters (native and FUSE).
    let control = match &target.kind {
        TargetKind::Native { config, .. } => Some(control_client(config, b.timeout)?),
        TargetKind::Posix { role: PosixRole::Fuse | PosixRole::Preload, .. } => match &b.cluster_config {
            Some(c) => Some(control_client(c, b.timeout)?),
            None => None,
        },
        _ => None,
    };
    let place = match &target.kind {
        TargetKind::Native { base, .. } => {
            let client = control.as_ref().expect("native has a client");
            let base = base.trim_end_matches('/');
            client
                .mkdir_all(if base.is_empty() { "/" } else { base }, 0o755)
                .await
                .with_context(|| format!("mkdir {base}"))?;
            let run_dir = format!("{base}/{dir_name}");
            client.mkdir(&run_dir, 0o755).await.with_context(|| format!("mkdir {run_dir}"))?;
            Place::Shoal { client, run_dir }
        }
        TargetKind::Posix { dir, .. } => {
            let run_dir = dir.join(&dir_name);
            std::fs::create_dir_all(&run_dir).with_context(|| format!("mkdir {}", run_dir.display()))?;
            Place::Local { run_dir }
        }
    };
    let result = run_in(b, target, rep, in_flight, &place, control.as_ref()).await;
    if let (Err(e), Launch::Mpi(_)) = (&result, &b.launch) {
        // Under mpirun the launcher stops rank 0 soon after a rank fails: say what failed
        // now rather than after a long clean-up, which could be cut short anyway.
        return Err(anyhow!("{e:#} (the run directory {} is left in place)", place.run_dir_string()));
    }
    if !b.keep {
        let cleaned = place.remove().await;
        if result.is_ok() {
            cleaned?;
        }
    }
    result
}

async fn run_in(
    b: &Bench,
    target: &TargetSpec,
    rep: usize,
    in_flight: usize,
    place: &Place<'_>,
    control: Option<&Client>,
) -> Result<TargetRun> {
    if let Workload::Md(md) = &b.workload {
        let dirs: Vec<String> =
            if md.shared_dir { vec![md_dir_name(md, 0)] } else { (0..b.procs).map(|r| md_dir_name(md, r)).collect() };
        for d in dirs {
            place.mkdir(&d).await?;
        }
    }
    let jobs: Vec<Job> = (0..b.procs)
        .map(|rank| Job {
            rank,
            nprocs: b.procs,
            target: target.clone(),
            in_flight,
            run_dir: place.run_dir_string(),
            workload: b.workload.clone(),
            seed: b.seed,
            timeout_secs: b.timeout.as_secs().max(1),
            cache_ttl_ms: b.cache_ttl_ms,
            tuning: b.tuning,
        })
        .collect();
    let phases = match &b.launch {
        Launch::Spawn(cmd) => {
            let mut ranks = Ranks::spawn(cmd, &jobs).await?;
            let r = lock_step(b, target, &mut ranks, control).await;
            if r.is_ok() {
                ranks.end_jobs().await?;
                ranks.shutdown().await;
            }
            // On an error, dropping `ranks` kills the workers.
            r?
        }
        Launch::Mpi(_) if target.preloaded() => {
            // The ranks were started by mpirun, without the library: it cannot be loaded now.
            bail!("target preload needs workers started by shoal bench (not mpirun); under mpirun export LD_PRELOAD=libshoal_preload.so to every rank and use a fuse:DIR target")
        }
        Launch::Mpi(pool) => {
            let mut ranks = pool.lock().await;
            if ranks.len() as u64 != b.procs {
                bail!("{} processes asked for, but the MPI job has {} ranks", b.procs, ranks.len());
            }
            let r = async {
                ranks.start_jobs(&jobs).await?;
                let phases = lock_step(b, target, &mut ranks, control).await?;
                ranks.end_jobs().await?;
                Ok::<_, anyhow::Error>(phases)
            }
            .await;
            if r.is_err() {
                // Stop every rank before the run directory is cleaned up.
                ranks.abort().await;
            }
            r?
        }
    };
    Ok(TargetRun { target: target.label(), location: target.location(), rep, phases })
}

/// The phases of one run, in lock step, on workers that have their jobs.
async fn lock_step(
    b: &Bench,
    target: &TargetSpec,
    ranks: &mut Ranks,
    control: Option<&Client>,
) -> Result<Vec<PhaseReport>> {
    let n = b.procs as usize;
    let mut ready = 0;
    while ready < n {
        let (rank, line) = ranks.next().await?;
        if line == "ready" {
            ready += 1;
        } else {
            bail!("{} said {line:?} before it was ready", ranks.name(rank));
        }
    }
    // How far ahead a start is announced: time for every rank to get its `go`, and more
    // with distant ranks (their round trip, under mpirun).
    let rtt_ns =
        ranks.mpi.as_ref().map(|m| m.rtt_us.iter().cloned().fold(0.0, f64::max) * 1000.0).unwrap_or(0.0) as u64;
    let mut phases = Vec::new();
    for phase in &b.phases {
        let caches_dropped = phase.drop_caches.then(drop_caches);
        let before = match control {
            Some(c) => Some(counters::snapshot(c).await?),
            None => None,
        };
        let total = b.phase_ops(phase.kind);
        let pb = progress_bar(b.progress, total, format!("{} {}", target.label(), phase.label));
        // On the driver's clock; each rank gets it on its own (the same on one machine).
        let start_at = mono_ns() + 30_000_000 + 5_000_000 * b.procs + 2 * rtt_ns;
        let busy0 = crate::clock::machine_busy_ns();
        for rank in 0..n {
            let go = GoMessage { phase: phase.clone(), start_at_ns: link::shift(start_at, ranks.offset(rank)) };
            ranks.send(rank, &format!("go {}", serde_json::to_string(&go)?)).await?;
        }
        let mut results: Vec<Option<PhaseResult>> = vec![None; n];
        let mut counts = vec![0u64; n];
        while results.iter().any(|r| r.is_none()) {
            let next = tokio::time::timeout(STALL_LIMIT, ranks.next())
                .await
                .unwrap_or_else(|_| Err(anyhow!("no worker made progress for {} s", STALL_LIMIT.as_secs())));
            let (rank, line) = match next {
                Ok(x) => x,
                Err(e) => {
                    pb.abandon();
                    return Err(e.context(format!("phase {}", phase.label)));
                }
            };
            if let Some(c) = line.strip_prefix("progress ") {
                counts[rank] = c.trim().parse().unwrap_or(counts[rank]);
                pb.set_position(counts.iter().sum());
            } else if let Some(json) = line.strip_prefix("done ") {
                let mut r: PhaseResult =
                    serde_json::from_str(json).with_context(|| format!("{} sent a bad result", ranks.name(rank)))?;
                // Back onto the driver's clock.
                r.start_ns = link::shift(r.start_ns, -ranks.offset(rank));
                r.end_ns = link::shift(r.end_ns, -ranks.offset(rank));
                r.timeline = std::mem::take(&mut r.timeline).shifted(-ranks.offset(rank));
                counts[rank] = r.ops;
                pb.set_position(counts.iter().sum());
                results[rank] = Some(r);
            } else {
                bail!("{} said {line:?}", ranks.name(rank));
            }
        }
        let busy1 = crate::clock::machine_busy_ns();
        pb.finish_and_clear();
        let results: Vec<PhaseResult> = results.into_iter().map(|r| r.expect("all done")).collect();
        let mut rep_phase = PhaseReport::from_results(&phase.label, phase.kind, &results);
        rep_phase.caches_dropped = caches_dropped;
        // The machine's busy time between the go and the last answer (the 30 ms wait for
        // the common start is idle and adds next to nothing).
        rep_phase.machine_cpu_s = match (busy0, busy1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / 1e9),
            _ => None,
        };
        if let (Some(c), Some(before)) = (control, before) {
            let after = counters::snapshot(c).await?;
            rep_phase.servers = Some(counters::summarize(counters::diff(&before, &after), rep_phase.ops));
        }
        phases.push(rep_phase);
    }
    Ok(phases)
}

/// The parameter a sweep varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepKey {
    Transfer,
    Block,
    Procs,
    InFlight,
    Files,
    Size,
}

impl SweepKey {
    pub fn parse(s: &str) -> Result<SweepKey> {
        Ok(match s {
            "transfer" | "t" => SweepKey::Transfer,
            "block" | "b" => SweepKey::Block,
            "procs" | "n" | "np" | "clients" => SweepKey::Procs,
            "in-flight" | "inflight" => SweepKey::InFlight,
            "files" => SweepKey::Files,
            "size" => SweepKey::Size,
            other => bail!("cannot sweep {other:?}: choose transfer, block, procs, in-flight, files or size"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SweepKey::Transfer => "transfer size",
            SweepKey::Block => "block size",
            SweepKey::Procs => "processes",
            SweepKey::InFlight => "operations in flight per process",
            SweepKey::Files => "files per process",
            SweepKey::Size => "file size",
        }
    }

    /// Whether values are byte counts (plotted on a log axis, printed as sizes).
    pub fn is_size(self) -> bool {
        matches!(self, SweepKey::Transfer | SweepKey::Block | SweepKey::Size)
    }

    /// `b` with this parameter set to `v`.
    pub fn apply(self, b: &Bench, v: u64) -> Result<Bench> {
        let mut b = b.clone();
        match (self, &mut b.workload) {
            (SweepKey::Transfer, Workload::Io(io)) => {
                io.transfer = v;
                if io.block % v != 0 {
                    io.block = io.block.div_ceil(v) * v;
                }
            }
            (SweepKey::Block, Workload::Io(io)) => io.block = v,
            (SweepKey::Files, Workload::Md(md)) => md.files = v,
            (SweepKey::Size, Workload::Md(md)) => md.size = v,
            (SweepKey::Procs, _) => b.procs = v,
            (SweepKey::InFlight, _) => {
                b.in_flight = v as usize;
                for t in &mut b.targets {
                    t.in_flight = None;
                }
            }
            (k, _) => return Err(anyhow!("{} cannot be swept in this workload", k.name())),
        }
        Ok(b)
    }
}
