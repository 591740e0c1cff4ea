//! The `shoal bench` command line: `io`, `md`, `suite`, and the hidden `worker`.

use crate::driver::{run_bench, Bench, Launch, SweepKey, WorkerCmd};
use crate::mpi::{self, MpiEnv};
use crate::plot;
use crate::report::{self, Report};
use crate::spec::*;
use crate::suite;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// An error in how the command was called (the `shoal` binary exits with 2).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UsageError {}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// IOR patterns: N processes write then read one file each (-F) or one shared file,
    /// sequentially or in random order; MiB/s, IOPS, latency, server counters.
    #[command(after_help = IO_EXAMPLES)]
    Io(IoArgs),
    /// mdtest patterns: N processes create, stat, read and unlink files in a directory each
    /// ("easy") or in one shared directory ("hard", --shared-dir); ops/s per phase.
    #[command(after_help = MD_EXAMPLES)]
    Md(MdArgs),
    /// The standard set (IO500-like easy and hard cases, scaled to this machine) on the
    /// native client, a FUSE mount, a local directory and tmpfs; rewrites docs/benchmarks.md.
    Suite(suite::SuiteArgs),
    /// Task-local I/O (partest): N tasks write and read their data as N files, as one
    /// container, as a multi-file container and through collectors; create time, bandwidth,
    /// bytes on disk, on the native client and POSIX directories side by side.
    Container(crate::container::ContainerArgs),
    /// Reverse read: `shoal import` of a file from an HTTP server on 127.0.0.1 (the servers
    /// fetch byte ranges in parallel) against curl into a local directory and tmpfs.
    Import(crate::import::ImportArgs),
    /// HTTP GETs of a file striped over every server (one stream, N parallel ranges) against
    /// the native client's read; MiB/s and ratios.
    Http(crate::http::HttpArgs),
    /// Job start (Pynamic-style): P processes on K fresh mounts load N libraries and M Python
    /// modules through a D-entry search path, plain, read-mostly and in a coop group; wall
    /// time and server requests and bytes per process.
    Load(crate::load::LoadArgs),
    /// Metadata query: `shoal find` over a tree of many files against find on a FUSE mount,
    /// a local directory and tmpfs holding the same tree; times and ratios.
    Find(crate::find::FindArgs),
    /// Checkpointing tasks of uneven speed: a global barrier at each checkpoint against
    /// micro-checkpointing (each task saves its part and goes on); time lost and the ratio.
    Ckpt(crate::ckpt::CkptArgs),
    /// Change events: writers create and close files while a consumer follows the close
    /// events (restarting now and then); latency after the acknowledgement, missed, repeated.
    Watch(crate::watch::WatchArgs),
    /// Internal: one benchmark process, driven over stdin/stdout by its parent.
    /// (Under mpirun the ranks other than 0 are workers without this command: see --rendezvous.)
    #[command(hide = true)]
    Worker,
}

const IO_EXAMPLES: &str = "Examples:
  shoal bench io -F -t 1M -b 256M -e                      # native client, file per process, fsync at close
  shoal bench io -T native,local,tmpfs --compare -t 47008 -b 47008 -s 2000   # IO500 ior-hard pattern, ratios
  shoal bench io -F -T native --sweep transfer=64K,256K,1M,4M --plot bw.svg
  mpirun -np 8 shoal bench io -F -t 1M -b 256M -e -R      # one benchmark process per MPI rank
Targets: native[:CONFIG], fuse:MOUNTPOINT, preload:MOUNTPOINT (the mount through the interception
library, docs/preload.md), local[:DIR], tmpfs[:DIR], posix:DIR; a suffix @K runs K
operations in flight per process (async calls on native, threads on POSIX targets).
The column last/first 10% is the rate of a phase's last 10 % of transfers (all processes, by
completion time) over that of its first 10 %: 1.00 = the rate held to the end of the phase.";

const MD_EXAMPLES: &str = "Examples:
  shoal bench md -N 10000                                 # mdtest easy: a directory per process, empty files
  shoal bench md -N 10000 -T native,native@16,tmpfs --compare
  shoal bench md -N 10000 -T native#16,native#64@2        # 16 (64) creates, stats, unlinks per request
  shoal bench md --shared-dir --size 3901 -N 2000 --verify # mdtest hard: shared directory, 3901-byte files
  shoal bench md -N 2000 --sweep procs=1,2,4 --plot md.svg
  mpirun -np 8 shoal bench md -N 10000                    # one benchmark process per MPI rank
  shoal bench md --shared-dir -n 4 -N 250000 --phases create,list,stat,unlink -T native,tmpfs
                                                          # a million files in one directory (bench/million.sh)
The column last/first 10% is the rate of a phase's last 10 % of operations (all processes, by
completion time) over that of its first 10 %: 1.00 = the rate held to the end of the phase.
native#B (before any @K): B operations per request, as one batch (create of empty files, stat
and unlink; the other phases send one operation per request).
Under mpirun (more than one rank) every rank is one benchmark process and rank 0 reports:
see --rendezvous and docs/benchmarks.md.";

#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Where to run (repeat or separate with commas): native, native:CONFIG, fuse:MOUNTPOINT,
    /// preload:MOUNTPOINT (workers with the interception library preloaded),
    /// local[:DIR] (default: the temp dir), tmpfs[:DIR] (default /dev/shm), posix:DIR;
    /// @K at the end = K operations in flight per process; native#B = B operations per request
    /// in batches (bench md). Default: native.
    #[arg(short = 'T', long = "target", value_delimiter = ',', value_name = "TARGET")]
    pub targets: Vec<String>,
    /// Compare: add the local and tmpfs baselines if missing, run every target alternately
    /// (3 repetitions unless --reps) and print medians with the ratios to the baselines.
    #[arg(long)]
    pub compare: bool,
    /// Repetitions of the whole workload on every target (default 1, or 3 with --compare).
    #[arg(long)]
    pub reps: Option<usize>,
    /// Processes (ranks) the benchmark starts [default: 2]. Under mpirun with more than one
    /// rank, the ranks are the processes: leave it out or give the MPI size.
    #[arg(short = 'n', long = "procs")]
    pub procs: Option<u64>,
    /// Operations in flight per process (targets without @K): async calls on native, threads on POSIX.
    #[arg(long = "in-flight", default_value_t = 1, value_name = "K")]
    pub in_flight: usize,
    /// Shoal folder under which native runs make their run directory.
    #[arg(long, default_value = "/shoal-bench", value_name = "PATH")]
    pub base: String,
    /// Print the results as JSON on standard output (progress bars stay on stderr).
    #[arg(long)]
    pub json: bool,
    /// Also write the results as JSON to FILE (the tables are still printed).
    #[arg(long, value_name = "FILE")]
    pub json_file: Option<PathBuf>,
    /// Run once per value: KEY=V1,V2,… with KEY transfer, block, procs, in-flight, files or size.
    #[arg(long, value_name = "KEY=VALUES")]
    pub sweep: Option<String>,
    /// Write a chart of the sweep (or of this run's phases) to FILE: .svg or .png.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// No progress bars.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Leave the benchmark's files in place.
    #[arg(long)]
    pub keep: bool,
    /// Native client: how long the workers trust cached entries, in ms (0 = every stat is a request).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub cache_ttl_ms: u64,
    /// Native client: write-behind bound per handle in bytes (ClientOptions::write_behind; 0 = every write waits). Default: the client's.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub write_behind: Option<u64>,
    /// Native client: readahead window in bytes (ClientOptions::readahead; 0 = off). Default: the client's.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub readahead: Option<u64>,
    /// Seed of the data pattern and of the random order.
    #[arg(long, default_value_t = 0x5348_4F41_4C00)]
    pub seed: u64,
    /// Under mpirun: the file through which rank 0 tells the other ranks where to connect
    /// (every rank must see it: a shared file system when ranks run on several hosts). Rank 0
    /// writes it and removes it once all ranks have arrived. Default:
    /// .shoal-bench-rendezvous.JOBID in the directory of the cluster configuration (native
    /// targets), else in the first target's directory.
    #[arg(long, value_name = "FILE")]
    pub rendezvous: Option<PathBuf>,
    /// Under mpirun: where rank 0 listens for the other ranks: IP or HOST, optionally :PORT.
    /// Default: $SHOAL_BENCH_ADDR; else 127.0.0.1 when the launcher says every rank runs on
    /// this host, else the first address other than loopback of this host's name; a free port.
    #[arg(long, value_name = "ADDR")]
    pub rendezvous_addr: Option<String>,
    /// Under mpirun: seconds rank 0 waits for every other rank to connect, and the other
    /// ranks wait for rank 0's rendezvous file; a rank missing after that fails the run.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub rendezvous_timeout: u64,
}

#[derive(Args, Debug, Clone)]
pub struct IoArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Transfer size: bytes per I/O call (IOR -t).
    #[arg(short = 't', long, default_value = "1M", value_parser = parse_size)]
    pub transfer: u64,
    /// Block size: contiguous bytes per process per segment (IOR -b), a multiple of -t.
    #[arg(short = 'b', long, default_value = "64M", value_parser = parse_size)]
    pub block: u64,
    /// Segments (IOR -s): in a shared file, segment s holds every rank's block in rank order.
    #[arg(short = 's', long, default_value_t = 1)]
    pub segments: u64,
    /// One file per process (IOR -F); default one shared file.
    #[arg(short = 'F', long)]
    pub file_per_proc: bool,
    /// Transfers in random order (IOR -z).
    #[arg(short = 'z', long)]
    pub random: bool,
    /// Each process reads what the next rank wrote (IOR -C).
    #[arg(short = 'C', long)]
    pub reorder: bool,
    /// fsync before close in the write phase (IOR -e); the native client's close always syncs.
    #[arg(short = 'e', long)]
    pub fsync: bool,
    /// Check every byte read against what was written (IOR -R).
    #[arg(short = 'R', long)]
    pub verify: bool,
    /// Phases, in order: write, read.
    #[arg(long, value_delimiter = ',', default_value = "write,read")]
    pub phases: Vec<String>,
    /// Before each read: sync and drop the page cache (needs root; otherwise noted in the report).
    #[arg(long)]
    pub drop_caches: bool,
    /// After the reads, read everything again without dropping caches (phase read-warm).
    #[arg(long)]
    pub warm_read: bool,
    /// Native client: stripe count of the files (-1 = all servers).
    #[arg(long, allow_hyphen_values = true)]
    pub stripe_count: Option<i64>,
    /// Native client: stripe size of the files.
    #[arg(long, value_parser = parse_size)]
    pub stripe_size: Option<u64>,
    /// Native client: placement policy of the files: same, spread or load (the
    /// least-loaded servers; with `shoal cluster up --throttle ID=MBPS` and --stripe-count 1
    /// this measures load-aware placement, docs/benchmarks.md).
    #[arg(long, value_parser = shoal_placement::map::parse_policy)]
    pub policy: Option<shoal_proto::msg::PlacementPolicy>,
}

#[derive(Args, Debug, Clone)]
pub struct MdArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Files per process (mdtest -n).
    #[arg(short = 'N', long, default_value_t = 1000)]
    pub files: u64,
    /// All processes in one shared directory (mdtest "hard"); default a directory each (-u).
    #[arg(long, alias = "hard")]
    pub shared_dir: bool,
    /// Bytes written into each file at create and read in the read phase (mdtest -w/-e).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub size: u64,
    /// Phases, in order, from: mkdir, create, list, stat, read, unlink, rmdir (default: create,
    /// stat, read when --size > 0, unlink). list: each process lists its directory (in a shared
    /// directory, process 0 lists it once) and the run fails unless every name made there is
    /// listed exactly once; its rate is entries listed per second.
    #[arg(long, value_delimiter = ',')]
    pub phases: Vec<String>,
    /// Add mkdir (first) and rmdir (last): directories made and removed like files.
    #[arg(long)]
    pub dirs: bool,
    /// Stat and read the next rank's files (mdtest -N 1).
    #[arg(long)]
    pub shift: bool,
    /// Check the bytes read back.
    #[arg(long)]
    pub verify: bool,
}

/// "1M", "64k", "47008", "1G" → bytes.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size (examples: 4096, 47008, 64K, 1M, 2G)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

/// Entry point of `shoal bench`. `config`: the global --config / $SHOAL_CONFIG.
pub async fn run(config: Option<PathBuf>, timeout: Duration, cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Worker => tokio::task::spawn_blocking(crate::worker::worker_main_blocking).await?,
        BenchCmd::Io(a) => {
            let io = IoSpec {
                transfer: a.transfer,
                block: a.block,
                segments: a.segments,
                file_per_proc: a.file_per_proc,
                random: a.random,
                reorder: a.reorder,
                fsync: a.fsync,
                verify: a.verify,
                stripe_count: match a.stripe_count {
                    None | Some(0) => None,
                    Some(c) if c < 0 => Some(u32::MAX),
                    Some(c) => Some(c as u32),
                },
                stripe_size: a.stripe_size,
                policy: a.policy,
            };
            if a.common.sweep.is_none() {
                io.check().map_err(|e| usage(e.to_string()))?;
            }
            let mut phases = Vec::new();
            for p in &a.phases {
                let kind = match p.as_str() {
                    "write" | "w" => PhaseKind::Write,
                    "read" | "r" => PhaseKind::Read,
                    other => return Err(usage(format!("unknown io phase {other:?} (write, read)"))),
                };
                let label = if kind == PhaseKind::Read && a.drop_caches { "read-cold" } else { kind.name() };
                phases.push(Phase { kind, label: label.into(), drop_caches: kind == PhaseKind::Read && a.drop_caches });
            }
            if a.warm_read {
                phases.push(Phase { kind: PhaseKind::Read, label: "read-warm".into(), drop_caches: false });
            }
            let name = format!("io{}", if a.file_per_proc { " (file per process)" } else { " (shared file)" });
            run_workload(config, timeout, &a.common, name, Workload::Io(io), phases).await
        }
        BenchCmd::Md(a) => {
            let md =
                MdSpec { files: a.files, shared_dir: a.shared_dir, size: a.size, shift: a.shift, verify: a.verify };
            let names: Vec<String> = if a.phases.is_empty() {
                let mut v = vec!["create", "stat"];
                if a.size > 0 {
                    v.push("read");
                }
                v.push("unlink");
                v.into_iter().map(String::from).collect()
            } else {
                a.phases.clone()
            };
            let mut phases = Vec::new();
            if a.dirs {
                phases.push(PhaseKind::Mkdir);
            }
            for p in &names {
                phases.push(match p.as_str() {
                    "mkdir" => PhaseKind::Mkdir,
                    "create" => PhaseKind::Create,
                    "list" | "ls" | "readdir" => PhaseKind::List,
                    "stat" => PhaseKind::Stat,
                    "read" => PhaseKind::ReadFiles,
                    "unlink" | "remove" | "delete" => PhaseKind::Unlink,
                    "rmdir" => PhaseKind::Rmdir,
                    other => {
                        return Err(usage(format!(
                            "unknown md phase {other:?} (mkdir, create, list, stat, read, unlink, rmdir)"
                        )))
                    }
                });
            }
            if a.dirs {
                phases.push(PhaseKind::Rmdir);
            }
            let phases =
                phases.into_iter().map(|k| Phase { kind: k, label: k.name().into(), drop_caches: false }).collect();
            let name = format!("md{}", if a.shared_dir { " (shared directory)" } else { " (directory per process)" });
            run_workload(config, timeout, &a.common, name, Workload::Md(md), phases).await
        }
        BenchCmd::Container(a) => crate::container::run(config, a).await,
        BenchCmd::Import(a) => crate::import::run(config, a).await,
        BenchCmd::Http(a) => crate::http::run(config, a).await,
        BenchCmd::Load(a) => crate::load::run(config, a).await,
        BenchCmd::Find(a) => crate::find::run(config, a).await,
        BenchCmd::Ckpt(a) => crate::ckpt::run(config, a).await,
        BenchCmd::Watch(a) => crate::watch::run(config, a).await,
        BenchCmd::Suite(a) => {
            refuse_mpi_suite()?;
            suite::run_suite(config, timeout, a).await
        }
    }
}

/// This process's MPI job when it has more than one rank (a job of one rank runs the
/// benchmark as without mpirun: it starts its own workers).
fn mpi_job() -> Result<Option<MpiEnv>> {
    Ok(MpiEnv::detect().map_err(|e| usage(format!("{e:#}")))?.filter(|e| e.size > 1))
}

/// The suite runs many benchmarks with different process counts: not as MPI ranks.
fn refuse_mpi_suite() -> Result<()> {
    if let Some(e) = mpi_job()? {
        return Err(usage(format!(
            "shoal bench suite starts its own worker processes; under mpirun with {} ranks use shoal bench io|md, \
             or run the suite once (mpirun -np 1, or without mpirun)",
            e.size
        )));
    }
    Ok(())
}

/// Turn the common arguments into targets.
pub fn targets_of(c: &CommonArgs, config: Option<&PathBuf>) -> Result<Vec<TargetSpec>> {
    let mut names: Vec<String> = c.targets.iter().filter(|t| !t.is_empty()).cloned().collect();
    if names.is_empty() {
        names.push("native".into());
    }
    let mut targets = Vec::new();
    for n in &names {
        targets.push(TargetSpec::parse(n, config, &c.base).map_err(|e| usage(e.to_string()))?);
    }
    if c.compare {
        for (role, name) in [(PosixRole::Local, "local"), (PosixRole::Tmpfs, "tmpfs")] {
            if !targets.iter().any(|t| t.role() == Some(role)) {
                targets.push(TargetSpec::parse(name, config, &c.base)?);
            }
        }
    }
    crate::spec::disambiguate(&mut targets);
    Ok(targets)
}

async fn run_workload(
    config: Option<PathBuf>,
    timeout: Duration,
    c: &CommonArgs,
    name: String,
    workload: Workload,
    phases: Vec<Phase>,
) -> Result<()> {
    if c.procs == Some(0) {
        return Err(usage("--procs must be at least 1"));
    }
    let targets = targets_of(c, config.as_ref())?;
    let sweep = match &c.sweep {
        Some(s) => Some(parse_sweep(s)?),
        None => None,
    };
    // Under mpirun: every rank checks the command line the same way, then the ranks other
    // than 0 become workers of rank 0 and print nothing.
    let mpi = mpi_job()?;
    let procs = match (&mpi, c.procs) {
        (Some(e), Some(n)) if n != e.size => {
            return Err(usage(format!(
                "-n {n} under mpirun with {} ranks: the ranks are the processes; leave -n out or give {}",
                e.size, e.size
            )))
        }
        (Some(_), _) if matches!(sweep, Some((SweepKey::Procs, _))) => {
            return Err(usage("cannot sweep the number of processes under mpirun: it is the number of ranks"))
        }
        (Some(e), _) => e.size,
        (None, n) => n.unwrap_or(2),
    };
    let launch = match &mpi {
        None => Launch::Spawn(WorkerCmd::current_exe()?),
        Some(e) => {
            let file = match &c.rendezvous {
                Some(f) => f.clone(),
                None => {
                    mpi::default_rendezvous_file(&targets, e.job.as_deref()).map_err(|x| usage(format!("{x:#}")))?
                }
            };
            let wait = Duration::from_secs(c.rendezvous_timeout.max(1));
            if e.rank != 0 {
                let e = e.clone();
                return tokio::task::spawn_blocking(move || mpi::serve_rank(&e, &file, wait)).await?;
            }
            let ranks = mpi::gather(e, &file, c.rendezvous_addr.as_deref(), wait).await?;
            Launch::Mpi(std::sync::Arc::new(tokio::sync::Mutex::new(ranks)))
        }
    };
    let work = run_ranks(c, name, workload, phases, procs, targets, sweep, launch.clone(), config, timeout);
    let result = match &launch {
        Launch::Spawn(_) => work.await,
        Launch::Mpi(_) => stopped_by_sigterm(work).await,
    };
    if let Launch::Mpi(ranks) = launch {
        let mut ranks = ranks.lock().await;
        if result.is_ok() {
            // `exit` to every rank; they end with status 0.
            let r = std::mem::replace(&mut *ranks, crate::link::Ranks::for_mpi(0));
            r.shutdown().await;
        } else {
            ranks.abort().await;
        }
    }
    result
}

/// Rank 0 under mpirun: when one rank fails, the launcher sends SIGTERM to the others and
/// SIGKILL about a second later. Rank 0 has usually seen the failure too (the rank's
/// connection closed) and is about to report it: give it that moment instead of dying
/// silently, then stop with an error saying a signal ended the run.
async fn stopped_by_sigterm(work: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    let mut work = std::pin::pin!(work);
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
        return work.await;
    };
    tokio::select! {
        r = &mut work => r,
        _ = term.recv() => match tokio::time::timeout(Duration::from_millis(700), &mut work).await {
            Ok(r) => r,
            Err(_) => bail!("stopped by SIGTERM (mpirun stops every rank when one fails or when it is interrupted)"),
        },
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_ranks(
    c: &CommonArgs,
    name: String,
    workload: Workload,
    phases: Vec<Phase>,
    procs: u64,
    targets: Vec<TargetSpec>,
    sweep: Option<(SweepKey, Vec<u64>)>,
    launch: Launch,
    config: Option<PathBuf>,
    timeout: Duration,
) -> Result<()> {
    let bench = Bench {
        name,
        targets,
        workload,
        phases,
        procs,
        in_flight: c.in_flight.max(1),
        reps: c.reps.unwrap_or(if c.compare { 3 } else { 1 }),
        seed: c.seed,
        timeout,
        cache_ttl_ms: c.cache_ttl_ms,
        tuning: NativeTuning { write_behind: c.write_behind, readahead: c.readahead },
        cluster_config: config.clone(),
        progress: !c.quiet,
        keep: c.keep,
        launch,
    };
    let human = !c.json;
    if let Some((key, values)) = sweep {
        let mut points: Vec<(u64, Report)> = Vec::new();
        for v in values {
            let b = key.apply(&bench, v).map_err(|e| usage(e.to_string()))?;
            b.check().map_err(|e| usage(format!("with {} = {v}: {e}", key.name())))?;
            if human {
                println!(
                    "== {} = {}",
                    key.name(),
                    if key.is_size() { report::fmt_bytes(v as f64) } else { v.to_string() }
                );
            }
            let r = run_and_print(&b, human).await?;
            points.push((v, r));
        }
        if let Some(p) = &c.plot {
            let chart = plot::sweep_chart(&bench.name, key, &points);
            plot::write(&chart, p)?;
            if human {
                println!("chart written to {}", p.display());
            }
        }
        if c.json || c.json_file.is_some() {
            let json: Vec<serde_json::Value> =
                points.iter().map(|(v, r)| serde_json::json!({ "value": v, "report": r })).collect();
            let text = serde_json::to_string_pretty(
                &serde_json::json!({ "sweep": format!("{key:?}").to_lowercase(), "points": json }),
            )?;
            write_json(c, &text)?;
        }
        return Ok(());
    }
    let r = run_and_print(&bench, human).await?;
    if let Some(p) = &c.plot {
        plot::write(&plot::phases_chart(&r), p)?;
        if human {
            println!("chart written to {}", p.display());
        }
    }
    write_json(c, &serde_json::to_string_pretty(&r)?)?;
    if r.runs.iter().flat_map(|t| &t.phases).any(|p| p.verify_errors > 0) {
        bail!("data verification failed: some reads did not return what was written");
    }
    Ok(())
}

/// The JSON report: on standard output with --json, into the file of --json-file.
fn write_json(c: &CommonArgs, text: &str) -> Result<()> {
    if c.json {
        println!("{text}");
    }
    if let Some(f) = &c.json_file {
        std::fs::write(f, format!("{text}\n"))
            .map_err(|e| anyhow::anyhow!("cannot write the JSON report to {}: {e}", f.display()))?;
    }
    Ok(())
}

async fn run_and_print(b: &Bench, human: bool) -> Result<Report> {
    if human {
        println!("{}", report::describe(&b.workload, b.procs, b.in_flight));
        if let Launch::Mpi(ranks) = &b.launch {
            if let Some(m) = &ranks.lock().await.mpi {
                println!("{}", m.describe());
            }
        }
    }
    let r = run_bench(b, |run| {
        if human {
            print!("{}", report::run_table(run));
        }
    })
    .await?;
    if human && r.runs.len() > 1 {
        println!();
        println!("medians over {} run{} per target:", r.reps, if r.reps == 1 { "" } else { "s" });
        print!("{}", report::summary_table(&r.summary));
    }
    Ok(r)
}

fn parse_sweep(s: &str) -> Result<(SweepKey, Vec<u64>)> {
    let (k, vs) = s.split_once('=').ok_or_else(|| usage(format!("--sweep {s:?}: expected KEY=V1,V2,…")))?;
    let key = SweepKey::parse(k.trim()).map_err(|e| usage(e.to_string()))?;
    let mut values = Vec::new();
    for v in vs.split(',').filter(|v| !v.trim().is_empty()) {
        let n = if key.is_size() {
            parse_size(v).map_err(usage)?
        } else {
            v.trim().parse().map_err(|_| usage(format!("{v:?} is not a number")))?
        };
        if n == 0 {
            return Err(usage("sweep values must be positive"));
        }
        values.push(n);
    }
    if values.is_empty() {
        return Err(usage("--sweep needs at least one value"));
    }
    Ok((key, values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_sweeps() {
        assert_eq!(parse_size("47008"), Ok(47008));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert!(parse_size("x").is_err());
        let (k, v) = parse_sweep("transfer=4K,1M").unwrap();
        assert_eq!(k, SweepKey::Transfer);
        assert_eq!(v, vec![4096, 1 << 20]);
        let (k, v) = parse_sweep("procs=1,2,4").unwrap();
        assert_eq!((k, v), (SweepKey::Procs, vec![1, 2, 4]));
        assert!(parse_sweep("colour=1").is_err());
    }
}
