//! `shoal bench ckpt`: checkpointing a job whose tasks run at uneven speeds, with a global
//! barrier against micro-checkpointing (issue 18; docs/checkpoint.md).
//!
//! `--tasks` tasks each run `--steps` steps: compute, then save their part of that step's
//! checkpoint (`--size` bytes) through [`MicroCheckpoint`]. Task i computes for
//! `--compute-ms` × (1 + (skew − 1) × i / (tasks − 1)) per step, so the slowest is `--skew`
//! times slower than the fastest. Computing is a sleep: the tasks stand for processes on
//! nodes of their own, and on a 2-core machine sixteen busy loops would measure the
//! scheduler instead.
//!
//! * **barrier**: after saving, every task waits until the step's checkpoint is committed
//!   (all parts saved) before computing the next step: a global barrier at each checkpoint.
//! * **micro**: after saving, the task goes on at once; the servers commit each checkpoint
//!   when its last part arrives.
//!
//! A task's lost time is its wall time less its compute time: saving, and in barrier mode
//! waiting. The report gives the lost time of each mode summed over tasks, and the ratio
//! (issue 18's target: micro ≤ 0.1 × barrier with a skew of 2). Both modes must end with
//! every checkpoint committed, or the benchmark fails.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use shoal_client::{Client, ClientOptions, MicroCheckpoint};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:
  shoal bench ckpt                        # 16 tasks, 10 steps of 200 ms, skew 2
  shoal bench ckpt --tasks 64 --size 4M --json
The target of issue 18: with a skew of 2, micro-checkpointing loses <= 10 % of the time a barrier \
checkpoint loses.")]
pub struct CkptArgs {
    /// Tasks of the job (each saves one part of every checkpoint).
    #[arg(long, default_value_t = 16)]
    pub tasks: u32,
    /// Steps, each followed by a checkpoint.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Compute time of a step of the fastest task, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub compute_ms: u64,
    /// How many times slower the slowest task is than the fastest (1 or more).
    #[arg(long, default_value_t = 2.0)]
    pub skew: f64,
    /// Bytes of each part (K, M suffixes).
    #[arg(long, default_value = "256K", value_parser = crate::cli::parse_size)]
    pub size: u64,
    /// Shoal directory the checkpoints are saved in (removed at the end).
    #[arg(long, default_value = "/shoal-bench/ckpt", value_name = "PATH")]
    pub base: String,
    /// Print the results as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    /// No progress messages.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// One mode, measured.
#[derive(Serialize, Debug, Clone)]
pub struct Mode {
    pub name: String,
    /// Wall time of the whole job, seconds.
    pub wall_s: f64,
    /// Lost time summed over tasks (wall less compute), seconds.
    pub lost_s: f64,
    /// Of which saving parts, seconds.
    pub saving_s: f64,
    /// The newest committed checkpoint at the end.
    pub latest: Option<u64>,
}

#[derive(Serialize, Debug, Clone)]
pub struct CkptReport {
    pub tasks: u32,
    pub steps: u64,
    pub compute_ms: u64,
    pub skew: f64,
    pub size: u64,
    pub barrier: Mode,
    pub micro: Mode,
    /// micro lost / barrier lost.
    pub lost_ratio: f64,
}

pub async fn run(config: Option<PathBuf>, a: CkptArgs) -> Result<()> {
    let Some(config) = config else {
        return Err(usage("shoal bench ckpt needs a cluster: pass --config FILE or set SHOAL_CONFIG"));
    };
    if a.tasks == 0 || a.steps == 0 || a.skew.is_nan() || a.skew < 1.0 {
        return Err(usage("--tasks and --steps must be at least 1, --skew at least 1"));
    }
    let client = Client::from_config(&config, ClientOptions::default())
        .with_context(|| format!("connect to the cluster of {}", config.display()))?;
    let base = a.base.trim_end_matches('/').to_string();
    let _ = client.remove_all(&base).await;
    let mut modes = Vec::new();
    for barrier in [true, false] {
        let name = if barrier { "barrier" } else { "micro" };
        if !a.quiet {
            eprintln!("bench ckpt: {name}: {} tasks, {} steps", a.tasks, a.steps);
        }
        let result = one_mode(&config, &a, &format!("{base}/{name}"), barrier).await;
        modes.push(result.with_context(|| format!("the {name} run"))?);
    }
    let _ = client.remove_all(&base).await;
    for m in &modes {
        if m.latest != Some(a.steps - 1) {
            bail!("{}: the newest committed checkpoint is {:?}, not {}", m.name, m.latest, a.steps - 1);
        }
    }
    let micro = modes.pop().expect("two modes");
    let barrier = modes.pop().expect("two modes");
    let report = CkptReport {
        tasks: a.tasks,
        steps: a.steps,
        compute_ms: a.compute_ms,
        skew: a.skew,
        size: a.size,
        lost_ratio: micro.lost_s / barrier.lost_s,
        barrier,
        micro,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

/// Run the job once: every task on its own client (its own connections), all at once.
async fn one_mode(config: &std::path::Path, a: &CkptArgs, dir: &str, barrier: bool) -> Result<Mode> {
    let job = format!("{dir}-{}", std::process::id());
    // Every task connects first, then all start at once (as the processes of a job do
    // once launched): connecting is not part of what is compared.
    let gate = Arc::new(tokio::sync::Barrier::new(a.tasks as usize + 1));
    let tasks: Vec<_> = (0..a.tasks)
        .map(|part| {
            let (config, a, dir, job, gate) =
                (config.to_path_buf(), a.clone(), dir.to_string(), job.clone(), gate.clone());
            tokio::spawn(async move { task(&config, &a, &dir, &job, part, barrier, &gate).await })
        })
        .collect();
    gate.wait().await;
    let start = Instant::now();
    let (mut lost, mut saving) = (0.0, 0.0);
    for t in tasks {
        let (l, s) = t.await.context("a task panicked")??;
        lost += l;
        saving += s;
    }
    let wall_s = start.elapsed().as_secs_f64();
    let client = Client::from_config(config, ClientOptions::default())?;
    let ckpt = MicroCheckpoint::open(&client, &job, dir, a.tasks).await?;
    let latest = ckpt.latest().await?;
    Ok(Mode { name: if barrier { "barrier" } else { "micro" }.into(), wall_s, lost_s: lost, saving_s: saving, latest })
}

/// One task: its lost time and its time saving, in seconds.
async fn task(
    config: &std::path::Path,
    a: &CkptArgs,
    dir: &str,
    job: &str,
    part: u32,
    barrier: bool,
    gate: &tokio::sync::Barrier,
) -> Result<(f64, f64)> {
    let client = Client::from_config(config, ClientOptions::default());
    // Connected to every server before the start (`status_all` asks each one). A task that
    // fails here still passes the gate, so the others are not held.
    let opened = match &client {
        Ok(c) => {
            let opened = MicroCheckpoint::open(c, job, dir, a.tasks).await;
            c.status_all().await;
            opened.map_err(anyhow::Error::from)
        }
        Err(e) => Err(anyhow::anyhow!("{e}")),
    };
    gate.wait().await;
    let ckpt = opened?;
    let slow = if a.tasks > 1 { part as f64 / (a.tasks - 1) as f64 } else { 0.0 };
    let compute = Duration::from_secs_f64(a.compute_ms as f64 / 1000.0 * (1.0 + (a.skew - 1.0) * slow));
    let data = vec![part as u8; a.size as usize];
    let start = Instant::now();
    let mut saving = Duration::ZERO;
    for n in 0..a.steps {
        tokio::time::sleep(compute).await;
        let t = Instant::now();
        ckpt.save(n, part, &data).await?;
        saving += t.elapsed();
        if barrier && !ckpt.is_committed(n, None).await? {
            bail!("checkpoint {n} was not committed");
        }
    }
    let lost = start.elapsed().saturating_sub(compute * a.steps as u32);
    Ok((lost.as_secs_f64(), saving.as_secs_f64()))
}

fn print_table(r: &CkptReport) {
    println!(
        "checkpoint: {} tasks, {} steps of {} ms (the slowest task {}x slower), parts of {} bytes",
        r.tasks, r.steps, r.compute_ms, r.skew, r.size
    );
    println!("{:<10} {:>9} {:>14} {:>14} {:>8}", "mode", "wall s", "lost task-s", "saving task-s", "latest");
    for m in [&r.barrier, &r.micro] {
        let latest = m.latest.map_or("-".to_string(), |n| n.to_string());
        println!("{:<10} {:>9.3} {:>14.3} {:>14.3} {:>8}", m.name, m.wall_s, m.lost_s, m.saving_s, latest);
    }
    let met = if r.lost_ratio <= 0.10 { "met" } else { "NOT met" };
    println!("time lost, micro / barrier: {:.3} (target <= 0.10 with a skew of 2: {met})", r.lost_ratio);
}

fn usage(m: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(crate::cli::UsageError(m.into()))
}
