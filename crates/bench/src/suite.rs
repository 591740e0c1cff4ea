//! `shoal bench suite`: the IO500-like easy and hard cases, scaled to this machine, on every
//! target, alternating, three times; then the targets of issues #4 and #12 checked against the
//! medians and `docs/benchmarks.md` rewritten with the tables, the machine and the date.

use crate::driver::{control_client, run_bench, Bench, Launch, WorkerCmd};
use crate::report::{self, fmt_bytes, fmt_rate, fmt_us, median, Report, SummaryRow};
use crate::spec::*;
use anyhow::{bail, Context, Result};
use clap::Args;
use shoal_proto::msg::LayoutSpec;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct SuiteArgs {
    /// Targets (default: native, fuse and preload when a mount is available, local, tmpfs).
    /// Same syntax as `shoal bench io -T`; a bare `fuse` or `preload` is the suite's mount
    /// (`--fuse`).
    #[arg(short = 'T', long = "target", value_delimiter = ',', value_name = "TARGET")]
    pub targets: Vec<String>,
    /// FUSE: a mount point of this cluster (mounted with `shoal mount`), `auto` to mount one
    /// for the suite in a temporary folder with `shoal mount` and unmount it at the end, or
    /// `none`.
    #[arg(long, default_value = "auto", value_name = "MOUNTPOINT|auto|none")]
    pub fuse: String,
    /// Repetitions of every case on every target (targets alternate).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Client processes.
    #[arg(short = 'n', long = "procs", default_value_t = 2)]
    pub procs: u64,
    /// Sizes: `full` (this machine: 2 cores, a few GiB; ~15 minutes) or `quick` (seconds; for tests).
    #[arg(long, default_value = "full", value_name = "full|quick")]
    pub scale: String,
    /// Only these cases: io-easy, io-hard, md-easy, md-hard, pxfs-64k, pxfs-1m.
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<String>,
    /// The Markdown report to rewrite (default docs/benchmarks.md when ./docs exists).
    #[arg(long, value_name = "FILE")]
    pub doc: Option<PathBuf>,
    /// Do not write the Markdown report.
    #[arg(long)]
    pub no_doc: bool,
    /// Print every result as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    /// Also save every result as JSON in FILE.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Directory for the local target (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    pub local_dir: Option<PathBuf>,
    /// Shoal folder for native runs.
    #[arg(long, default_value = "/shoal-bench", value_name = "PATH")]
    pub base: String,
    /// No progress bars.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// Sizes of the cases.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Scale {
    pub io_easy_block: u64,
    pub io_hard_segments: u64,
    pub md_easy_files: u64,
    pub md_hard_files: u64,
    /// Bytes per process of the PXFS cases (synchronous against asynchronous calls).
    pub pxfs_block: u64,
}

impl Scale {
    pub fn named(s: &str) -> Result<Scale> {
        Ok(match s {
            "full" => Scale {
                io_easy_block: 512 << 20,
                io_hard_segments: 2000,
                md_easy_files: 10_000,
                md_hard_files: 2000,
                pxfs_block: 256 << 20,
            },
            "quick" => Scale {
                io_easy_block: 4 << 20,
                io_hard_segments: 40,
                md_easy_files: 200,
                md_hard_files: 100,
                pxfs_block: 4 << 20,
            },
            other => bail!("unknown scale {other:?} (full or quick)"),
        })
    }
}

/// A case's result and the targets it ran on.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CaseResult {
    pub case: String,
    pub description: String,
    pub report: Report,
    pub seconds: f64,
}

/// One criterion of issue #4 or #12.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    pub what: String,
    pub measured: Option<f64>,
    pub required: String,
    pub met: Option<bool>,
}

const CASES: [&str; 6] = ["io-easy", "io-hard", "md-easy", "md-hard", "pxfs-64k", "pxfs-1m"];

/// Calls in flight per process for the asynchronous side of the PXFS cases.
const PXFS_IN_FLIGHT: usize = 16;

/// A FUSE mount made for the suite.
struct Mount {
    dir: PathBuf,
    child: tokio::process::Child,
}

fn is_mountpoint(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(p), p.parent().map(std::fs::metadata)) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

/// Mount the cluster with `shoal mount CONFIG… MOUNTPOINT` in the foreground of a child
/// process; wait until the mount point changes device.
async fn mount_fuse(config: &Path, timeout: Duration) -> Result<Mount> {
    let dir = std::env::temp_dir().join(format!("shoal-bench-fuse.{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let exe = std::env::current_exe()?;
    let child = tokio::process::Command::new(&exe)
        .arg("--config")
        .arg(config)
        .arg("--timeout")
        .arg(timeout.as_secs().max(1).to_string())
        .arg("mount")
        .arg("--foreground")
        // close(2) without fsync, as on the local baselines; IOR's -e still fsyncs.
        .arg("-o")
        .arg("nosync_close")
        .arg(&dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start shoal mount")?;
    let mut m = Mount { dir, child };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(15) {
        if is_mountpoint(&m.dir) {
            // It must also answer: list it, with a time limit.
            let d = m.dir.clone();
            let probe = tokio::task::spawn_blocking(move || std::fs::read_dir(&d).map(|r| r.count()));
            match tokio::time::timeout(Duration::from_secs(10), probe).await {
                Ok(Ok(Ok(_))) => return Ok(m),
                Ok(Ok(Err(e))) => {
                    unmount(m).await;
                    bail!("the FUSE mount does not list its root: {e}");
                }
                _ => {
                    unmount(m).await;
                    bail!("the FUSE mount does not answer (listing its root took over 10 s)");
                }
            }
        }
        if let Ok(Some(status)) = m.child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = m.child.stderr.take() {
                use tokio::io::AsyncReadExt;
                let _ = e.read_to_string(&mut err).await;
            }
            let _ = std::fs::remove_dir(&m.dir);
            bail!("shoal mount exited ({status}): {}", err.trim());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unmount(m).await;
    bail!("shoal mount did not mount within 15 s")
}

async fn unmount(mut m: Mount) {
    let exe = std::env::current_exe().ok();
    if let Some(exe) = exe {
        let umount = tokio::process::Command::new(exe).arg("umount").arg(&m.dir).kill_on_drop(true).status();
        let _ = tokio::time::timeout(Duration::from_secs(10), umount).await;
    }
    if tokio::time::timeout(Duration::from_secs(5), m.child.wait()).await.is_err() {
        let _ = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(&m.dir).status();
        let _ = m.child.kill().await;
    }
    let _ = std::fs::remove_dir(&m.dir);
}

/// The targets on a Shoal mount's folder `dir`: `fuse`, and `preload` next to it (the same
/// folder through the interception library) when the library is there.
fn on_mount(targets: &mut Vec<TargetSpec>, notes: &mut Vec<String>, dir: PathBuf) {
    let target = |role| TargetSpec {
        kind: TargetKind::Posix { dir: dir.clone(), role },
        in_flight: None,
        batch: None,
        tag: None,
    };
    targets.push(target(PosixRole::Fuse));
    match crate::preload::library() {
        Ok(_) => targets.push(target(PosixRole::Preload)),
        Err(e) => notes.push(format!("preload target left out: {e:#}")),
    }
}

pub async fn run_suite(config: Option<PathBuf>, timeout: Duration, a: SuiteArgs) -> Result<()> {
    let scale = Scale::named(&a.scale)?;
    let cases: Vec<String> =
        if a.cases.is_empty() { CASES.iter().map(|s| s.to_string()).collect() } else { a.cases.clone() };
    for c in &cases {
        if !CASES.contains(&c.as_str()) {
            bail!("unknown case {c:?} (io-easy, io-hard, md-easy, md-hard)");
        }
    }
    let human = !a.json;
    // Targets.
    let mut mount = None;
    let mut notes: Vec<String> = Vec::new();
    let mut targets: Vec<TargetSpec> = Vec::new();
    if a.targets.is_empty() {
        if config.is_some() {
            targets.push(TargetSpec::parse("native", config.as_ref(), &a.base)?);
        }
        match a.fuse.as_str() {
            "none" => {}
            "auto" => match &config {
                Some(c) => match mount_fuse(c, timeout).await {
                    Ok(m) => {
                        on_mount(&mut targets, &mut notes, m.dir.join(a.base.trim_start_matches('/')));
                        mount = Some(m);
                    }
                    Err(e) => notes.push(format!("FUSE target left out: {e:#}")),
                },
                None => notes.push("FUSE target left out: no cluster configuration".into()),
            },
            dir => on_mount(&mut targets, &mut notes, Path::new(dir).join(a.base.trim_start_matches('/'))),
        }
        let local = a.local_dir.clone().unwrap_or_else(std::env::temp_dir);
        targets.push(TargetSpec {
            kind: TargetKind::Posix { dir: local, role: PosixRole::Local },
            in_flight: None,
            batch: None,
            tag: None,
        });
        targets.push(TargetSpec::parse("tmpfs", None, &a.base)?);
    } else {
        for t in &a.targets {
            // Bare `fuse` and `preload`: the suite's mount (`--fuse`), made once if needed.
            let role = match t.as_str() {
                "fuse" => PosixRole::Fuse,
                "preload" => PosixRole::Preload,
                _ => {
                    targets.push(TargetSpec::parse(t, config.as_ref(), &a.base)?);
                    continue;
                }
            };
            let root = match (a.fuse.as_str(), &mount, &config) {
                ("none", _, _) => bail!("target {t} needs a mount: --fuse auto or --fuse MOUNTPOINT"),
                ("auto", Some(m), _) => m.dir.clone(),
                ("auto", None, Some(c)) => {
                    let m = mount_fuse(c, timeout).await?;
                    let d = m.dir.clone();
                    mount = Some(m);
                    d
                }
                ("auto", None, None) => bail!("target {t} needs a cluster configuration (--config) to mount"),
                (dir, _, _) => PathBuf::from(dir),
            };
            let dir = root.join(a.base.trim_start_matches('/'));
            targets.push(TargetSpec { kind: TargetKind::Posix { dir, role }, in_flight: None, batch: None, tag: None });
        }
    }
    for n in &notes {
        eprintln!("shoal bench suite: {n}");
    }
    let load_start = loadavg();
    // Probed now: the FUSE mount made for the suite is gone at the end.
    let probed = Machine::probe(&targets);
    let result = run_cases(config.as_ref(), timeout, &a, &scale, &cases, &targets, human).await;
    if let Some(m) = mount {
        unmount(m).await;
    }
    let (results, total) = result?;
    let checks = evaluate(&results);
    if human {
        println!();
        println!("targets of issues #4 and #12:");
        for c in &checks {
            println!(
                "  {:<70} {:>6} {:>8}  {}",
                c.what,
                c.measured.map(|m| format!("{m:.2}")).unwrap_or_else(|| "-".into()),
                c.required,
                match c.met {
                    Some(true) => "met",
                    Some(false) => "MISSED",
                    None => "not measured",
                }
            );
        }
    }
    let doc = if a.no_doc {
        None
    } else {
        a.doc.clone().or_else(|| Path::new("docs").is_dir().then(|| PathBuf::from("docs/benchmarks.md")))
    };
    let machine = Machine { load_start, load_end: loadavg(), date: utc_now(), ..probed };
    if let Some(path) = &doc {
        let old = std::fs::read_to_string(path).unwrap_or_default();
        let md = markdown(&results, &checks, &machine, &targets, &scale, &a, config.as_deref(), total, &notes, &old);
        std::fs::write(path, md).with_context(|| format!("cannot write {}", path.display()))?;
        if human {
            println!("wrote {}", path.display());
        }
    }
    let everything =
        serde_json::json!({ "machine": machine, "scale": scale, "cases": results, "checks": checks, "notes": notes });
    if let Some(p) = &a.save {
        std::fs::write(p, serde_json::to_string_pretty(&everything)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&everything)?);
    }
    if results.iter().flat_map(|c| &c.report.runs).flat_map(|r| &r.phases).any(|p| p.verify_errors > 0) {
        bail!("data verification failed in the suite");
    }
    Ok(())
}

fn with_in_flight(t: &TargetSpec, k: usize) -> TargetSpec {
    TargetSpec { in_flight: Some(k), ..t.clone() }
}

#[allow(clippy::too_many_arguments)]
async fn run_cases(
    config: Option<&PathBuf>,
    timeout: Duration,
    a: &SuiteArgs,
    scale: &Scale,
    cases: &[String],
    targets: &[TargetSpec],
    human: bool,
) -> Result<(Vec<CaseResult>, f64)> {
    let t_all = Instant::now();
    let worker = WorkerCmd::current_exe()?;
    // Striped data for native and FUSE: every server, 1 MiB stripes. Native files get it at
    // create; the FUSE target's folder gets it as its default.
    let stripes = LayoutSpec { stripe_count: Some(u32::MAX), stripe_size: Some(1 << 20), ..Default::default() };
    if let Some(c) = config {
        if let Some(fuse) = targets.iter().find(|t| t.on_mount()) {
            if let TargetKind::Posix { dir, .. } = &fuse.kind {
                std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
            }
        }
        let client = control_client(c, timeout)?;
        client.mkdir_all(&a.base, 0o755).await.with_context(|| format!("mkdir {}", a.base))?;
    }
    let base_bench = |name: &str, workload: Workload, phases: Vec<Phase>, targets: Vec<TargetSpec>| Bench {
        name: name.to_string(),
        targets,
        workload,
        phases,
        procs: a.procs,
        in_flight: 1,
        reps: a.reps.max(1),
        seed: 0x5348_4F41_4C00,
        timeout,
        cache_ttl_ms: 0,
        tuning: Default::default(),
        cluster_config: config.cloned(),
        progress: !a.quiet,
        keep: false,
        launch: Launch::Spawn(worker.clone()),
    };
    let io_phases = |warm: bool| {
        let mut v = vec![
            Phase { kind: PhaseKind::Write, label: "write".into(), drop_caches: false },
            Phase { kind: PhaseKind::Read, label: "read-cold".into(), drop_caches: true },
        ];
        if warm {
            v.push(Phase { kind: PhaseKind::Read, label: "read-warm".into(), drop_caches: false });
        }
        v
    };
    let md_phases = |kinds: &[PhaseKind]| {
        kinds.iter().map(|k| Phase { kind: *k, label: k.name().into(), drop_caches: false }).collect::<Vec<_>>()
    };
    let mut results = Vec::new();
    for case in cases {
        let t0 = Instant::now();
        let bench = match case.as_str() {
            "io-easy" | "io-hard" => {
                let easy = case == "io-easy";
                let io = IoSpec {
                    transfer: if easy { 1 << 20 } else { 47008 },
                    block: if easy { scale.io_easy_block } else { 47008 },
                    segments: if easy { 1 } else { scale.io_hard_segments },
                    file_per_proc: easy,
                    random: false,
                    reorder: true,
                    fsync: true,
                    verify: false,
                    stripe_count: stripes.stripe_count,
                    stripe_size: stripes.stripe_size,
                    policy: None,
                };
                if let Some(c) = config {
                    // The FUSE target's folder: same layout by default (mount root = Shoal root).
                    if targets.iter().any(|t| t.on_mount()) {
                        let client = control_client(c, timeout)?;
                        let _ = client.set_layout(&a.base, stripes.clone()).await;
                    }
                }
                base_bench(case, Workload::Io(io), io_phases(easy), targets.to_vec())
            }
            "md-easy" => {
                let md = MdSpec { files: scale.md_easy_files, shared_dir: false, size: 0, shift: false, verify: false };
                let mut t = Vec::new();
                for x in targets {
                    if x.is_native() {
                        t.push(with_in_flight(x, 1));
                        t.push(with_in_flight(x, 16));
                        // 16 operations in flight as one batch request (`native#16`).
                        t.push(TargetSpec { batch: Some(16), ..with_in_flight(x, 1) });
                    } else {
                        t.push(x.clone());
                    }
                }
                if let Some(c) = config {
                    // Default placement for the single-request check: files inherit the
                    // cluster default (no stripe override in this folder).
                    let client = control_client(c, timeout)?;
                    let _ = client.set_layout(&a.base, LayoutSpec::default()).await;
                }
                base_bench(
                    case,
                    Workload::Md(md),
                    // `read` on empty files: open and close (mdtest -E of IO500's mdtest-easy
                    // read phase, where the files have no bytes).
                    md_phases(&[PhaseKind::Create, PhaseKind::Stat, PhaseKind::ReadFiles, PhaseKind::Unlink]),
                    t,
                )
            }
            "md-hard" => {
                let md = MdSpec { files: scale.md_hard_files, shared_dir: true, size: 3901, shift: true, verify: true };
                base_bench(
                    case,
                    Workload::Md(md),
                    md_phases(&[PhaseKind::Create, PhaseKind::Stat, PhaseKind::ReadFiles, PhaseKind::Unlink]),
                    targets.to_vec(),
                )
            }
            "pxfs-64k" | "pxfs-1m" => {
                // PXFS (ch. 3): the same writes and reads through synchronous calls (each
                // waits for its request: no write-behind, no readahead) and through the
                // asynchronous API with PXFS_IN_FLIGHT calls in flight. Native client only.
                let io = IoSpec {
                    transfer: if case == "pxfs-64k" { 64 << 10 } else { 1 << 20 },
                    block: scale.pxfs_block,
                    segments: 1,
                    file_per_proc: true,
                    random: false,
                    reorder: true,
                    fsync: true,
                    verify: false,
                    stripe_count: stripes.stripe_count,
                    stripe_size: stripes.stripe_size,
                    policy: None,
                };
                let t: Vec<TargetSpec> = targets
                    .iter()
                    .filter(|x| x.is_native())
                    .flat_map(|x| [with_in_flight(x, 1), with_in_flight(x, PXFS_IN_FLIGHT)])
                    .collect();
                if t.is_empty() {
                    continue; // no cluster: nothing to compare
                }
                let mut b = base_bench(case, Workload::Io(io), io_phases(false), t);
                b.tuning = NativeTuning { write_behind: Some(0), readahead: Some(0) };
                // One client process, as in PXFS: what the asynchronous API hides is the
                // latency of one client's requests (with more processes than cores, the
                // synchronous side already keeps the machine busy).
                b.procs = 1;
                b
            }
            _ => unreachable!("checked"),
        };
        let description = report::describe(&bench.workload, bench.procs, 1);
        if human {
            println!("== {case}: {description}");
        }
        let rep = run_bench(&bench, |run| {
            if human && !a.quiet {
                let p: Vec<String> = run
                    .phases
                    .iter()
                    .map(|p| {
                        format!(
                            "{} {} {}",
                            p.label,
                            fmt_rate(p.metric()),
                            if p.kind.is_io() { "MiB/s" } else { "op/s" }
                        )
                    })
                    .collect();
                println!("   run {} {:<10} {}", run.rep + 1, run.target, p.join(", "));
            }
        })
        .await
        .with_context(|| format!("case {case}"))?;
        if human {
            print!("{}", report::summary_table(&rep.summary));
        }
        results.push(CaseResult { case: case.clone(), description, report: rep, seconds: t0.elapsed().as_secs_f64() });
    }
    Ok((results, t_all.elapsed().as_secs_f64()))
}

fn row<'a>(results: &'a [CaseResult], case: &str, phase: &str, target: &str) -> Option<&'a SummaryRow> {
    results.iter().find(|c| c.case == case)?.report.summary.iter().find(|r| r.phase == phase && r.target == target)
}

/// The criteria of issues #4 and #12 against the medians.
pub fn evaluate(results: &[CaseResult]) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut ratio = |case: &str, phase: &str, target: &str, base: &str, min: f64| {
        let r = row(results, case, phase, target);
        let v = r.and_then(|r| if base == "local" { r.vs_local } else { r.vs_tmpfs });
        checks.push(Check {
            what: format!("{case} {phase}: {target} / {base}"),
            measured: v,
            required: format!(">= {min}"),
            met: v.map(|v| v >= min),
        });
    };
    ratio("io-easy", "write", "native", "local", 0.8);
    ratio("io-easy", "read-cold", "native", "local", 0.8);
    ratio("io-easy", "write", "fuse", "local", 0.6);
    ratio("io-easy", "read-cold", "fuse", "local", 0.6);
    ratio("io-hard", "write", "native", "local", 0.5);
    ratio("io-hard", "read-cold", "native", "local", 0.5);
    for phase in ["create", "unlink"] {
        ratio("md-easy", phase, "native@1", "tmpfs", 0.2);
        ratio("md-easy", phase, "native@16", "tmpfs", 0.5);
        ratio("md-easy", phase, "native#16@1", "tmpfs", 0.5);
        ratio("md-easy", phase, "fuse", "tmpfs", 0.05);
    }
    // Issue #12: through the interception library, within 0.9 of the native client.
    let mut vs_native = |case: &str, phase: &str, native: &str| {
        let v = row(results, case, phase, "preload")
            .zip(row(results, case, phase, native))
            .and_then(|(p, n)| (n.median > 0.0).then(|| p.median / n.median));
        checks.push(Check {
            what: format!("{case} {phase}: preload / {native}"),
            measured: v,
            required: ">= 0.9".into(),
            met: v.map(|v| v >= 0.9),
        });
    };
    for phase in ["create", "stat", "unlink"] {
        vs_native("md-easy", phase, "native@1");
    }
    for case in ["io-easy", "io-hard"] {
        for phase in ["write", "read-cold"] {
            vs_native(case, phase, "native");
        }
    }
    for phase in ["create", "stat", "unlink"] {
        let r = row(results, "md-easy", phase, "native@1");
        // What splits cost (resends after a split, its steps, a moved name's inode elsewhere)
        // is a fixed number of requests per directory, not per operation: counted apart.
        let v = r.and_then(|r| {
            Some(
                r.client_requests_per_op? + r.peer_requests_per_op.unwrap_or(0.0)
                    - r.split_requests_per_op.unwrap_or(0.0),
            )
        });
        checks.push(Check {
            what: format!(
                "md-easy {phase}: server requests per op (native, default placement; besides those of directory splits and lease revocations)"
            ),
            measured: v,
            required: "= 1".into(),
            met: v.map(|v| (v - 1.0).abs() < 1e-9),
        });
    }
    // Issue 12: the mount against the native client, in the same invocation.
    let mut versus = |case: &str, phase: &str, target: &str, base: &str, min: f64| {
        let v = match (row(results, case, phase, target), row(results, case, phase, base)) {
            (Some(t), Some(b)) if b.median > 0.0 => Some(t.median / b.median),
            _ => None,
        };
        checks.push(Check {
            what: format!("{case} {phase}: {target} / {base}"),
            measured: v,
            required: format!(">= {min}"),
            met: v.map(|v| v >= min),
        });
    };
    for phase in ["create", "unlink"] {
        versus("md-easy", phase, "fuse", "native@1", 0.8);
    }
    for phase in ["stat", "read"] {
        versus("md-easy", phase, "fuse", "native@1", 2.0);
    }
    // Issue 13: asynchronous 64 KiB calls against synchronous ones (PXFS: 3-20x).
    for phase in ["write", "read-cold"] {
        versus("pxfs-64k", phase, &format!("native@{PXFS_IN_FLIGHT}"), "native@1", 3.0);
    }
    versus("io-hard", "write", "fuse", "native", 0.8);
    versus("io-easy", "write", "fuse", "native", 0.9);
    versus("io-easy", "read-cold", "fuse", "native", 0.9);
    // Steady from run to run: the kernel's caches hold because leases do, not by luck.
    for phase in ["stat", "read"] {
        let v = row(results, "md-easy", phase, "fuse").filter(|r| r.min > 0.0).map(|r| r.max / r.min);
        checks.push(Check {
            what: format!("md-easy {phase}: fuse max / min of the runs"),
            measured: v,
            required: "<= 1.3".into(),
            met: v.map(|v| v <= 1.3),
        });
    }
    checks
}

/// What the machine is, for the report.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    /// File system type of each target directory.
    pub filesystems: Vec<(String, String)>,
    pub date: String,
    pub commit: Option<String>,
    /// /proc/loadavg when the suite started and when it ended (other work on the machine).
    pub load_start: String,
    pub load_end: String,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn fs_type(p: &Path) -> String {
    // The target folder may not exist yet: ask its nearest existing ancestor.
    let p = p.ancestors().find(|a| a.exists()).unwrap_or(p);
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else { return "?".into() };
    // SAFETY: statfs writes into the zeroed struct we pass and reads the NUL-terminated path.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return "?".into();
    }
    match s.f_type as i64 {
        0xEF53 => "ext4".into(),
        0x0102_1994 => "tmpfs".into(),
        0x6573_5546 => "fuse".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlayfs".into(),
        x => format!("0x{x:x}"),
    }
}

/// Year-month-day hour:minute UTC from the system clock (no time zone database needed).
pub fn utc_now() -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, (rem % 3600) / 60)
}

impl Machine {
    fn probe(targets: &[TargetSpec]) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        let filesystems = targets
            .iter()
            .filter_map(|t| match &t.kind {
                TargetKind::Posix { dir, .. } => Some((t.label(), format!("{} ({})", dir.display(), fs_type(dir)))),
                TargetKind::Native { .. } => None,
            })
            .collect();
        let commit = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            memory_gib: mem_kib / (1024.0 * 1024.0),
            kernel,
            filesystems,
            date: utc_now(),
            commit,
            load_start: String::new(),
            load_end: loadavg(),
        }
    }
}

/// Text after this line in the old report is kept when the suite rewrites it.
pub const KEEP_MARKER: &str =
    "<!-- Everything below this line is kept when `shoal bench suite` rewrites this file. -->";

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "–".into())
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    results: &[CaseResult],
    checks: &[Check],
    m: &Machine,
    targets: &[TargetSpec],
    scale: &Scale,
    a: &SuiteArgs,
    config: Option<&Path>,
    total_s: f64,
    notes: &[String],
    old: &str,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "Written by `shoal bench suite` on {}{}. Rerun it to refresh every table below; \
         `shoal bench io|md` run single cases (`shoal help bench`).\n",
        m.date,
        m.commit.as_ref().map(|c| format!(" at commit `{c}`")).unwrap_or_default()
    );
    let _ = writeln!(s, "## Machine\n");
    let _ = writeln!(s, "* CPU: {} ({} cores), memory {:.1} GiB, Linux {}", m.cpu, m.cores, m.memory_gib, m.kernel);
    if let Some(c) = config {
        let servers = shoal_placement_count(c);
        let _ = writeln!(
            s,
            "* Cluster: {servers} `shoald` servers on this machine (loopback TCP), config `{}`",
            c.display()
        );
    }
    for t in targets {
        let _ = writeln!(s, "* Target `{}`: {}", t.label(), t.location());
    }
    for (label, fs) in &m.filesystems {
        let _ = writeln!(s, "* File system of `{label}`: {fs}");
    }
    let _ = writeln!(
        s,
        "* {} client processes; the servers, the clients (and the FUSE daemon) share the same {} cores.",
        a.procs, m.cores
    );
    let _ = writeln!(s, "* Load average (1, 5, 15 min) at the start: {}; at the end: {}.", m.load_start, m.load_end);
    for n in notes {
        let _ = writeln!(s, "* Note: {n}");
    }
    let _ = writeln!(s, "\n## How it was run\n");
    let _ = writeln!(
        s,
        "Every case ran {} times on every target, the targets alternating (run 1 on each target, then run 2, …); \
         the tables give the median, the range, and the ratio of the medians to the local directory (`xlocal`, the \
         limit for data) and to tmpfs (`xtmpfs`, the limit for metadata) measured in the same invocation. A phase's \
         time runs from the common start of all processes to the end of the slowest (IOR semantics), opens and \
         closes included. Total time: {:.0} s.\n",
        a.reps.max(1),
        total_s
    );
    let _ = writeln!(s, "| case | pattern | scaled from |");
    let _ = writeln!(s, "|---|---|---|");
    for c in results {
        let from = match c.case.as_str() {
            "io-easy" => format!(
                "IO500 ior-easy (file per process, 1 MiB transfers, fsync); {} per process",
                fmt_bytes(scale.io_easy_block as f64)
            ),
            "io-hard" => format!(
                "IO500 ior-hard (one shared file, 47,008-byte interleaved transfers); {} segments",
                scale.io_hard_segments
            ),
            "md-easy" => format!(
                "IO500 mdtest-easy (directory per process, empty files); {} files per process",
                scale.md_easy_files
            ),
            "md-hard" => format!(
                "IO500 mdtest-hard (one shared directory, 3,901-byte files); {} files per process",
                scale.md_hard_files
            ),
            "pxfs-64k" | "pxfs-1m" => format!(
                "PXFS ch. 3: synchronous calls (`native@1`, no write-behind or readahead) against the asynchronous \
                 API with {PXFS_IN_FLIGHT} in flight (`native@{PXFS_IN_FLIGHT}`); one process, {}",
                fmt_bytes(scale.pxfs_block as f64)
            ),
            _ => String::new(),
        };
        let _ = writeln!(s, "| {} | {} | {} |", c.case, c.description, from);
    }
    let _ = writeln!(
        s,
        "\n`read-cold` runs after `sync` and `echo 3 > /proc/sys/vm/drop_caches` (as root); `read-warm` right after it \
         without dropping anything. Reads are shifted by one rank (IOR -C). Native and FUSE data are striped over \
         every server in 1 MiB stripes; md-easy uses the cluster's default placement. `native@16` keeps 16 operations \
         in flight per process through the async API, each its own request; `native#16@1` sends them 16 at a time \
         in one batch request (`create_many_at`, `lookup_many`, `unlink_many_at`); every other target has one \
         operation in flight (mdtest semantics). Counters: the \
         servers' own, read with a `status` request before and after each phase (`status` and `hello` left out).\n"
    );
    let _ = writeln!(s, "## Targets of issues #4, #12 and #13\n");
    let _ = writeln!(s, "| criterion | measured | required | |");
    let _ = writeln!(s, "|---|---:|---|---|");
    for c in checks {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            c.what,
            opt(c.measured),
            c.required,
            match c.met {
                Some(true) => "met",
                Some(false) => "**missed**",
                None => "not measured",
            }
        );
    }
    let _ = writeln!(s);
    for c in results {
        let _ = writeln!(s, "## {}\n", c.case);
        let _ = writeln!(s, "{} ({:.0} s for all runs)\n", c.description, c.seconds);
        let _ = writeln!(s, "| phase | target | median | min – max | xlocal | xtmpfs | p50 latency | p99 latency | CPU/op clients | CPU/op servers | CPU/op machine | requests/op | load max/min | max/mean | last/first 10 % |");
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &c.report.summary {
            let med = |f: &dyn Fn(&report::PhaseReport) -> Option<f64>| {
                let mut v: Vec<f64> = c
                    .report
                    .runs
                    .iter()
                    .filter(|x| x.target == r.target)
                    .flat_map(|x| x.phases.iter().filter(|p| p.label == r.phase).filter_map(f))
                    .collect();
                if v.is_empty() {
                    "–".to_string()
                } else {
                    fmt_us(median(&mut v))
                }
            };
            let lat = |f: &dyn Fn(&report::Latency) -> f64| med(&|p| Some(f(&p.latency)));
            let _ = writeln!(
                s,
                "| {} | {} | {} {} | {} – {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.phase,
                r.target,
                fmt_rate(r.median),
                r.unit,
                fmt_rate(r.min),
                fmt_rate(r.max),
                opt(r.vs_local),
                opt(r.vs_tmpfs),
                lat(&|l| l.p50_us),
                lat(&|l| l.p99_us),
                med(&|p| Some(p.cpu_us_per_op().0)),
                med(&|p| p.servers.as_ref().map(|s| s.cpu_us_per_op)),
                med(&|p| p.cpu_us_per_op().1),
                opt(r.client_requests_per_op.map(|x| x + r.peer_requests_per_op.unwrap_or(0.0))),
                opt(r.requests_max_min),
                opt(r.requests_max_mean),
                opt(r.last_over_first),
            );
        }
        // Per-server figures of the last run of each Shoal target.
        for target in c.report.summary.iter().map(|r| r.target.clone()).collect::<std::collections::BTreeSet<_>>() {
            let Some(run) = c.report.runs.iter().rev().find(|r| r.target == target) else { continue };
            if run.phases.iter().all(|p| p.servers.is_none()) {
                continue;
            }
            let _ = writeln!(s, "\nPer server, `{target}`, run {} (per operation of the phase):\n", run.rep + 1);
            let _ = writeln!(s, "| phase | server | client requests | peer requests in | peer requests out | bytes in | bytes out | requests/op | bytes/op |");
            let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
            for p in &run.phases {
                let Some(sv) = &p.servers else { continue };
                let n = sv.phase_ops.max(1) as f64;
                for d in &sv.per_server {
                    let _ = writeln!(
                        s,
                        "| {} | s{} | {} | {} | {} | {} | {} | {:.3} | {} |",
                        p.label,
                        d.server,
                        d.client_requests,
                        d.peer_requests,
                        d.peer_requests_sent,
                        fmt_bytes(d.bytes_received as f64),
                        fmt_bytes(d.bytes_sent as f64),
                        d.requests() as f64 / n,
                        fmt_bytes((d.bytes_received + d.bytes_sent) as f64 / n),
                    );
                }
                let ops: Vec<String> = sv.ops_per_op.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
                let _ = writeln!(
                    s,
                    "| {} | all | {:.2}/op | {:.2}/op | | {}/op | {}/op | {} | load max/min {} (bytes {}) |",
                    p.label,
                    sv.client_requests_per_op,
                    sv.peer_requests_per_op,
                    fmt_bytes(sv.bytes_received_per_op),
                    fmt_bytes(sv.bytes_sent_per_op),
                    ops.join(", "),
                    opt(sv.requests_max_min),
                    opt(sv.bytes_max_min),
                );
            }
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "{KEEP_MARKER}");
    match old.split_once(KEEP_MARKER) {
        Some((_, kept)) => s.push_str(kept.trim_start_matches('\n')),
        None => s.push('\n'),
    }
    s
}

fn shoal_placement_count(config: &Path) -> usize {
    std::fs::read_to_string(config).map(|t| t.matches("[[server]]").count()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_date_is_plausible() {
        let d = utc_now();
        assert!(d.starts_with("20") && d.ends_with("UTC"), "{d}");
        assert_eq!(d.len(), "2025-01-01 00:00 UTC".len());
    }
}
