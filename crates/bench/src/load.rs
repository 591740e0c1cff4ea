//! `shoal bench load`: a Pynamic-style job start (docs/benchmarks.md, "Job start";
//! docs/loading.md). It builds N shared libraries of a given size and a program linked
//! against all of them, and M Python modules, spread over the second half of a D-entry
//! search path; puts the tree on Shoal (and in a local directory and tmpfs); then starts P
//! processes that each load every library (`LD_LIBRARY_PATH`) and import every module
//! (`PYTHONPATH`), and reports the wall time and the servers' requests and bytes per
//! process for each way of running them:
//!
//! * **plain**: the tree not marked read-mostly, no loader hook, K mounts (nodes): what a
//!   job start costs a file system that shares nothing;
//! * **read-mostly**: the tree marked read-mostly, `LD_AUDIT=libshoal_audit.so`, K mounts:
//!   each mount (node) lists and reads each object once;
//! * **coop**: the same on K mounts in one coop group: each object is read once per job;
//! * **a mount per process**: read-mostly and coop again with one mount for each process
//!   (a job of one rank per node), where the group saves the most;
//! * **1 process**: the read-mostly case with one process on one mount, the base the
//!   targets are counted against;
//! * **local** and **tmpfs**: the same processes on a local copy of the tree (wall time only).
//!
//! Every Shoal case mounts its own fresh mounts (`shoal mount` child processes), so no
//! case starts from another's caches; the processes start directly, or under `mpirun` with
//! `--mpirun` (one rank per process, the mount picked by rank).

use crate::cli::parse_size;
use crate::counters::{self, ServerDelta};
use crate::mounts::Mounts;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use shoal_client::{Client, ClientOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:
  shoal bench load                                  # 200 libraries, 20-entry path, 16 processes on 4 mounts
  shoal bench load --libs 495 --lib-size 1M -n 32 --mounts 8
  shoal bench load --mpirun --json                  # the processes as MPI ranks
The targets of issue 17: coop requests <= 1.1x the 1-process count, >= 10x fewer than without the
group (a mount per process), and the coop wall time <= 1.5x the 1-process time. Needs gcc, fusermount3, and python3 for --modules.")]
pub struct LoadArgs {
    /// Shared libraries the program links against.
    #[arg(long, default_value_t = 200)]
    pub libs: usize,
    /// Search-path entries (directories of LD_LIBRARY_PATH and PYTHONPATH); the libraries
    /// and modules sit in the second half, so most look-ups find nothing.
    #[arg(long, default_value_t = 20)]
    pub dirs: usize,
    /// Bytes of each library (a read-only array of that size).
    #[arg(long, value_parser = parse_size, default_value = "64K")]
    pub lib_size: u64,
    /// Python modules each process imports (0: none).
    #[arg(long, default_value_t = 50)]
    pub modules: usize,
    /// Processes of the job.
    #[arg(short = 'n', long = "procs", default_value_t = 16)]
    pub procs: usize,
    /// FUSE mounts standing for the job's nodes; the processes are spread over them (the
    /// cases "mount/process" use one mount per process instead).
    #[arg(long, default_value_t = 4)]
    pub mounts: usize,
    /// Start the processes as the ranks of one `mpirun` (each picks its mount by rank).
    #[arg(long)]
    pub mpirun: bool,
    /// Shoal directory the trees are made in (removed at the end unless --keep).
    #[arg(long, default_value = "/shoal-bench/load", value_name = "PATH")]
    pub base: String,
    /// Print the results as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    /// Leave the trees in place.
    #[arg(long)]
    pub keep: bool,
    /// No progress messages.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// One way of running the job, measured.
#[derive(Serialize, Debug, Clone)]
pub struct Case {
    pub name: String,
    pub procs: usize,
    pub mounts: usize,
    pub wall_s: f64,
    /// Requests the servers answered from clients (status and hello left out); none for
    /// local and tmpfs.
    pub requests: Option<u64>,
    /// Bytes the servers sent.
    pub bytes_sent: Option<u64>,
    pub requests_by_op: std::collections::BTreeMap<String, u64>,
}

impl Case {
    fn per_proc(&self, v: Option<u64>) -> Option<f64> {
        v.map(|v| v as f64 / self.procs as f64)
    }
}

#[derive(Serialize, Debug)]
pub struct LoadReport {
    pub libs: usize,
    pub dirs: usize,
    pub lib_size: u64,
    pub modules: usize,
    pub launcher: &'static str,
    pub cases: Vec<Case>,
    /// coop requests / 1-process requests (target <= 1.1).
    pub coop_vs_one_process: f64,
    /// The same with a mount per process (target <= 1.1).
    pub coop_spread_vs_one_process: f64,
    /// Requests without the group / with it, a mount per process (target >= 10).
    pub off_vs_coop_spread: f64,
    /// plain requests / coop requests (K mounts).
    pub plain_vs_coop: f64,
    /// read-mostly (no group) requests / coop requests (K mounts).
    pub read_mostly_vs_coop: f64,
    /// coop wall time / 1-process wall time (target <= 1.5).
    pub coop_wall_vs_one_process: f64,
    /// The same ratio for the P processes on tmpfs (else the local directory): what this
    /// machine's cores allow a job start of P processes at best.
    pub tmpfs_wall_vs_one_process: f64,
}

fn usage(m: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(crate::cli::UsageError(m.into()))
}

pub async fn run(config: Option<PathBuf>, a: LoadArgs) -> Result<()> {
    let Some(config) = config else {
        return Err(usage("shoal bench load needs a cluster: pass --config FILE or set SHOAL_CONFIG"));
    };
    if a.libs == 0 || a.dirs < 2 || a.procs == 0 || a.mounts == 0 {
        return Err(usage("--libs, --procs and --mounts must be at least 1, --dirs at least 2"));
    }
    if a.mounts > a.procs {
        return Err(usage(format!(
            "--mounts {} is more than --procs {}: a mount would run nothing",
            a.mounts, a.procs
        )));
    }
    if a.mpirun && which("mpirun").is_none() {
        return Err(usage("--mpirun: mpirun is not on PATH"));
    }
    let client = Client::from_config(&config, ClientOptions::default())
        .with_context(|| format!("connect to the cluster of {}", config.display()))?;
    let say = |m: &str| {
        if !a.quiet {
            eprintln!("bench load: {m}");
        }
    };
    let work = tempfile::Builder::new().prefix("shoal-bench-load-").tempdir().context("make a temporary directory")?;
    say(&format!("building {} libraries of {} bytes and the program", a.libs, a.lib_size));
    let tree = Tree { libs: a.libs, dirs: a.dirs, lib_size: a.lib_size, modules: a.modules };
    let local = work.path().join("tree");
    tree.build(&local, work.path())?;
    let shm = tempfile::Builder::new().prefix("shoal-bench-load-").tempdir_in("/dev/shm").ok();
    if let Some(s) = &shm {
        copy_tree(&local, &s.path().join("tree"))?;
    }
    say(&format!("writing the trees to {}", a.base));
    let base = a.base.trim_end_matches('/').to_string();
    let _ = client.remove_all(&base).await;
    client.mkdir_all(&base, 0o755).await?;
    // The plain tree as it is; the read-mostly one marked before it is filled (its entries
    // inherit the mark).
    put_tree(&client, &local, &format!("{base}/plain"), false).await?;
    put_tree(&client, &local, &format!("{base}/marked"), true).await?;
    let result = measure(&client, &config, &a, &tree, work.path(), &local, shm.as_ref().map(|s| s.path()), &say).await;
    if !a.keep {
        let _ = client.remove_all(&base).await;
    }
    let cases = result?;
    let find = |n: &str| cases.iter().find(|c| c.name == n).cloned().expect("every case ran");
    let (one, plain, marked, coop) = (find(ONE), find(PLAIN), find(MARKED), find(COOP));
    let (spread_off, spread_on) = (find(SPREAD_OFF), find(SPREAD_COOP));
    let ratio = |x: &Case, y: &Case| x.requests.unwrap_or(0) as f64 / y.requests.unwrap_or(1).max(1) as f64;
    let report = LoadReport {
        libs: a.libs,
        dirs: a.dirs,
        lib_size: a.lib_size,
        modules: tree.modules_used(),
        launcher: if a.mpirun { "mpirun" } else { "direct" },
        coop_vs_one_process: ratio(&coop, &one),
        coop_spread_vs_one_process: ratio(&spread_on, &one),
        off_vs_coop_spread: ratio(&spread_off, &spread_on),
        plain_vs_coop: ratio(&plain, &coop),
        read_mostly_vs_coop: ratio(&marked, &coop),
        coop_wall_vs_one_process: coop.wall_s / one.wall_s.max(1e-9),
        tmpfs_wall_vs_one_process: posix_scaling(&cases, a.procs),
        cases,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

const ONE: &str = "read-mostly, 1 process";
const PLAIN: &str = "plain";
const MARKED: &str = "read-mostly";
const COOP: &str = "read-mostly + coop group";
const SPREAD_OFF: &str = "read-mostly, mount/process";
const SPREAD_COOP: &str = "coop group, mount/process";

#[allow(clippy::too_many_arguments)]
async fn measure(
    client: &Client,
    config: &Path,
    a: &LoadArgs,
    tree: &Tree,
    work: &Path,
    local: &Path,
    shm: Option<&Path>,
    say: &dyn Fn(&str),
) -> Result<Vec<Case>> {
    let audit = crate::preload::built_library("libshoal_audit.so", "SHOAL_AUDIT_LIB")?;
    let script = work.join("start.sh");
    std::fs::write(&script, tree.start_script(&local.join("main")))?;
    let job = Job { script: &script, audit: &audit, mpirun: a.mpirun, procs: a.procs };
    let base = a.base.trim_end_matches('/');
    let mut cases = Vec::new();
    for (name, procs, mounts, sub, hook, coop) in [
        (ONE, 1, 1, "marked", true, false),
        (PLAIN, a.procs, a.mounts, "plain", false, false),
        (MARKED, a.procs, a.mounts, "marked", true, false),
        (COOP, a.procs, a.mounts, "marked", true, true),
        (SPREAD_OFF, a.procs, a.procs, "marked", true, false),
        (SPREAD_COOP, a.procs, a.procs, "marked", true, true),
    ] {
        say(&format!("{name}: {procs} processes on {mounts} fresh mounts"));
        let group = Mounts::start(config, work, mounts, coop)?;
        let roots: Vec<PathBuf> = group.points.iter().map(|m| m.join(base.trim_start_matches('/')).join(sub)).collect();
        let before = counters::snapshot(client).await?;
        let wall = job.with_procs(procs).run(&roots, hook)?;
        let after = counters::snapshot(client).await?;
        drop(group);
        cases.push(shoal_case(name, procs, mounts, wall, &counters::diff(&before, &after)));
    }
    let mut posix = vec![("local", local.to_path_buf())];
    if let Some(s) = shm {
        posix.push(("tmpfs", s.join("tree")));
    }
    for (name, root) in posix {
        for procs in [1, a.procs] {
            say(&format!("{name}: {procs} process{}", if procs == 1 { "" } else { "es" }));
            let wall = job.with_procs(procs).run(std::slice::from_ref(&root), true)?;
            cases.push(Case {
                name: format!("{name}, {procs} process{}", if procs == 1 { "" } else { "es" }),
                procs,
                mounts: 0,
                wall_s: wall.as_secs_f64(),
                requests: None,
                bytes_sent: None,
                requests_by_op: Default::default(),
            });
        }
    }
    Ok(cases)
}

/// Wall time of `procs` processes over that of one on tmpfs (the local directory without it).
fn posix_scaling(cases: &[Case], procs: usize) -> f64 {
    let wall = |name: String| cases.iter().find(|c| c.name == name).map(|c| c.wall_s);
    for fs in ["tmpfs", "local"] {
        if let (Some(one), Some(many)) = (wall(format!("{fs}, 1 process")), wall(format!("{fs}, {procs} processes"))) {
            return many / one.max(1e-9);
        }
    }
    0.0
}

fn shoal_case(name: &str, procs: usize, mounts: usize, wall: Duration, d: &[ServerDelta]) -> Case {
    let mut by_op = std::collections::BTreeMap::new();
    for s in d {
        for (op, n) in &s.ops {
            *by_op.entry(op.clone()).or_insert(0) += n;
        }
    }
    Case {
        name: name.to_string(),
        procs,
        mounts,
        wall_s: wall.as_secs_f64(),
        requests: Some(d.iter().map(|s| s.client_requests).sum()),
        bytes_sent: Some(d.iter().map(|s| s.bytes_sent).sum()),
        requests_by_op: by_op,
    }
}

fn print_table(r: &LoadReport) {
    println!(
        "job start: {} libraries of {} bytes and {} Python modules over a {}-entry search path ({} launch)",
        r.libs, r.lib_size, r.modules, r.dirs, r.launcher
    );
    println!(
        "{:<27} {:>5} {:>6} {:>8} {:>9} {:>9} {:>10} {:>13}",
        "case", "procs", "mounts", "wall s", "requests", "req/proc", "KiB/proc", "wall ×1 proc"
    );
    let one_wall = r.cases.iter().find(|c| c.name == ONE).map_or(1.0, |c| c.wall_s);
    for c in &r.cases {
        let opt = |v: Option<f64>, scale: f64| v.map_or("-".to_string(), |v| format!("{:.1}", v / scale));
        println!(
            "{:<27} {:>5} {:>6} {:>8.2} {:>9} {:>9} {:>10} {:>13.2}",
            c.name,
            c.procs,
            if c.mounts == 0 { "-".to_string() } else { c.mounts.to_string() },
            c.wall_s,
            c.requests.map_or("-".to_string(), |v| v.to_string()),
            opt(c.per_proc(c.requests), 1.0),
            opt(c.per_proc(c.bytes_sent), 1024.0),
            c.wall_s / one_wall.max(1e-9),
        );
    }
    let mark = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "coop requests / 1 process: {:.2} (target <= 1.1: {})",
        r.coop_vs_one_process,
        mark(r.coop_vs_one_process <= 1.1)
    );
    println!(
        "coop requests / 1 process, a mount per process: {:.2} (target <= 1.1: {})",
        r.coop_spread_vs_one_process,
        mark(r.coop_spread_vs_one_process <= 1.1)
    );
    println!(
        "requests without the group / with it, a mount per process: {:.1} (target >= 10: {})",
        r.off_vs_coop_spread,
        mark(r.off_vs_coop_spread >= 10.0)
    );
    println!(
        "on {} mounts: plain / coop {:.1}, read-mostly without the group / coop {:.2}",
        r.cases.iter().find(|c| c.name == COOP).map_or(0, |c| c.mounts),
        r.plain_vs_coop,
        r.read_mostly_vs_coop
    );
    println!(
        "coop wall time / 1 process: {:.2} (target <= 1.5: {}); the same on tmpfs: {:.2} (this machine's cores)",
        r.coop_wall_vs_one_process,
        mark(r.coop_wall_vs_one_process <= 1.5),
        r.tmpfs_wall_vs_one_process
    );
}

/// The generated job: libraries `libpyn{i}.so` in `lib/dNN`, modules `pynmod{i}.py` in
/// `py/dNN`, both in the second half of the `dirs` entries; `main` beside the tree.
struct Tree {
    libs: usize,
    dirs: usize,
    lib_size: u64,
    modules: usize,
}

impl Tree {
    fn home(&self, i: usize) -> usize {
        self.dirs / 2 + i % (self.dirs - self.dirs / 2)
    }

    /// Modules imported: none without python3.
    fn modules_used(&self) -> usize {
        if which("python3").is_some() {
            self.modules
        } else {
            0
        }
    }

    /// Build the libraries and modules into `root` and the program into `root/..`.
    fn build(&self, root: &Path, work: &Path) -> Result<()> {
        let src = work.join("src");
        std::fs::create_dir_all(&src)?;
        for sub in ["lib", "py"] {
            for d in 0..self.dirs {
                std::fs::create_dir_all(root.join(format!("{sub}/d{d:02}")))?;
            }
        }
        let mut main = String::from("#include <stdio.h>\n");
        for i in 0..self.libs {
            // A read-only array of the library's size, read by its function so it is kept.
            let c = format!(
                "static const unsigned char pad[{n}] = {{ {i} % 251 + 1 }};\n\
                 int pyn{i}(int k) {{ return pad[k % {n}] + {i}; }}\n",
                n = self.lib_size.max(1)
            );
            let file = src.join(format!("l{i}.c"));
            std::fs::write(&file, c)?;
            let out = root.join(format!("lib/d{:02}/libpyn{i}.so", self.home(i)));
            gcc(&["-shared", "-fPIC", "-O1", "-o", &out.to_string_lossy(), &file.to_string_lossy()])?;
            main += &format!("int pyn{i}(int);\n");
        }
        main += "int main(void) { long s = 0;\n";
        for i in 0..self.libs {
            main += &format!("  s += pyn{i}(0);\n");
        }
        main += "  printf(\"%ld\\n\", s); return 0; }\n";
        std::fs::write(src.join("main.c"), main)?;
        let mut args: Vec<String> = vec!["-o".into(), root.join("main").to_string_lossy().into(), "main.c".into()];
        for d in self.dirs / 2..self.dirs {
            args.push(format!("-L{}", root.join(format!("lib/d{d:02}")).display()));
        }
        args.extend((0..self.libs).map(|i| format!("-lpyn{i}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        gcc_in(&args, &src)?;
        for i in 0..self.modules {
            let m = root.join(format!("py/d{:02}/pynmod{i}.py", self.home(i)));
            std::fs::write(m, format!("VALUE = {i}\n\ndef value():\n    return VALUE\n"))?;
        }
        Ok(())
    }

    /// The script each process runs: its root (by rank, among `$SHOAL_LOAD_ROOTS`), the
    /// search paths over it, the program, then the imports.
    fn start_script(&self, main: &Path) -> String {
        let imports: Vec<String> = (0..self.modules_used()).map(|i| format!("pynmod{i}")).collect();
        let python = match imports.is_empty() {
            true => String::new(),
            false => format!(
                "PYTHONPATH=\"$pp\" PYTHONDONTWRITEBYTECODE=1 python3 -c 'import {}' || exit 1\n",
                imports.join(", ")
            ),
        };
        format!(
            "#!/bin/sh\n\
             # One process of shoal bench load: rank from MPI or SHOAL_LOAD_RANK.\n\
             r=${{OMPI_COMM_WORLD_RANK:-${{PMI_RANK:-${{SHOAL_LOAD_RANK:-0}}}}}}\n\
             set -- $SHOAL_LOAD_ROOTS\n\
             shift $((r % $#))\n\
             root=$1\n\
             lp=; pp=; i=0\n\
             while [ $i -lt {dirs} ]; do\n\
             \x20 d=$(printf %02d $i)\n\
             \x20 lp=\"$lp${{lp:+:}}$root/lib/d$d\"; pp=\"$pp${{pp:+:}}$root/py/d$d\"\n\
             \x20 i=$((i + 1))\n\
             done\n\
             LD_LIBRARY_PATH=\"$lp\" {main} >/dev/null || exit 1\n\
             {python}",
            dirs = self.dirs,
            main = main.display(),
        )
    }
}

/// The processes of one case.
struct Job<'a> {
    script: &'a Path,
    audit: &'a Path,
    mpirun: bool,
    procs: usize,
}

impl Job<'_> {
    fn with_procs(&self, procs: usize) -> Job<'_> {
        Job { procs, ..*self }
    }

    /// Start the processes over `roots` (rank r on root r mod len), with the loader hook or
    /// not; wait for all; the wall time from the first start to the last exit.
    fn run(&self, roots: &[PathBuf], hook: bool) -> Result<Duration> {
        let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        if roots.iter().any(|r| r.contains(char::is_whitespace)) {
            bail!("a tree path with white space: {roots:?}");
        }
        let env = |c: &mut Command| {
            c.env("SHOAL_LOAD_ROOTS", roots.join(" ")).stdout(Stdio::null()).stderr(Stdio::piped());
            if hook {
                c.env("LD_AUDIT", self.audit);
            } else {
                c.env_remove("LD_AUDIT");
            }
        };
        let start = Instant::now();
        let mut children = Vec::new();
        if self.mpirun {
            let mut c = Command::new("mpirun");
            c.args(["--oversubscribe", "-np", &self.procs.to_string()]);
            // SAFETY: geteuid has no preconditions. Open MPI refuses root without these.
            if unsafe { libc::geteuid() } == 0 {
                c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
            }
            if hook {
                c.args(["-x", "LD_AUDIT"]);
            }
            c.args(["-x", "SHOAL_LOAD_ROOTS", "sh"]).arg(self.script);
            env(&mut c);
            children.push(c.spawn().context("start mpirun")?);
        } else {
            for rank in 0..self.procs {
                let mut c = Command::new("sh");
                c.arg(self.script).env("SHOAL_LOAD_RANK", rank.to_string());
                env(&mut c);
                children.push(c.spawn().context("start a process of the job")?);
            }
        }
        let mut failed = None;
        for c in children {
            let out = c.wait_with_output()?;
            if !out.status.success() && failed.is_none() {
                failed = Some(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
            }
        }
        if let Some(f) = failed {
            bail!("a process of the job failed ({f})");
        }
        Ok(start.elapsed())
    }
}

/// Copy the local tree `from` to Shoal directory `to` (marked read-mostly first if `mark`).
async fn put_tree(client: &Client, from: &Path, to: &str, mark: bool) -> Result<()> {
    client.mkdir_all(to, 0o755).await?;
    if mark {
        client.set_read_mostly(to, true).await.with_context(|| format!("mark {to} read-mostly"))?;
    }
    let mut stack = vec![(from.to_path_buf(), to.to_string())];
    while let Some((dir, at)) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let there = format!("{at}/{name}");
            if e.file_type()?.is_dir() {
                client.mkdir(&there, 0o755).await?;
                stack.push((e.path(), there));
            } else if name != "main" {
                let data = std::fs::read(e.path())?;
                let f = client.create(&there, 0o755, None).await?;
                f.write_at(0, &data).await?;
                f.close().await?;
            }
        }
    }
    Ok(())
}

/// Copy directory `from` to `to` (files and directories).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        } else {
            std::fs::copy(e.path(), to.join(e.file_name()))?;
        }
    }
    Ok(())
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(prog)).find(|p| p.is_file())
}

fn gcc(args: &[&str]) -> Result<()> {
    gcc_in(args, Path::new("."))
}

fn gcc_in(args: &[&str], cwd: &Path) -> Result<()> {
    let out = Command::new("gcc").args(args).current_dir(cwd).output().context("run gcc (is it installed?)")?;
    if !out.status.success() {
        bail!("gcc {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
