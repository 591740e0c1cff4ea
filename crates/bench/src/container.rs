//! `shoal bench container`: a partest-style benchmark of task-local I/O (docs/containers.md).
//! N tasks write and read task-local data as N files (one per task), as one container, as a
//! multi-file container, and as a container written through collectors (coalescing I/O), on
//! the native client and on POSIX directories (a FUSE mount, a local disk, tmpfs), side by
//! side.
//!
//! The tasks are runtime tasks of this process, joined by the container's in-process
//! communicator (`LocalComm`); at most `--in-flight` of them do file-system I/O at a time
//! (as N tasks on a few nodes would), in every layout.
//!
//! Three measurements per target, layout and size, each timed from the first call to the
//! last task's return:
//! * **create**: make the task-local files and close them with no data: N creates and
//!   closes, or one collective open and close of the container (its metadata written and
//!   made durable);
//! * **write**: open for writing, write `--size` bytes per task, make it durable (fsync per
//!   file; the container's collective close syncs its files), close;
//! * **read**: open, read every byte back (checked), close.
//!
//! and the size of the result and (on POSIX targets) the bytes it occupies on disk, against
//! the data written.

use crate::cli::parse_size;
use crate::report::median;
use crate::spec::{PosixRole, TargetKind, TargetSpec};
use anyhow::{bail, Context, Result};
use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use shoal_client::{Client, ClientOptions};
use shoal_container::{Comm, LocalComm, ParFile, Target, WriteOptions, COLLECTOR_AUTO};
use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Semaphore;

#[derive(Args, Debug, Clone)]
#[command(after_help = EXAMPLES)]
pub struct ContainerArgs {
    /// Where to run (repeat or separate with commas): native, native:CONFIG, fuse:MOUNTPOINT,
    /// local[:DIR], tmpfs[:DIR], posix:DIR. Default: native (when a cluster is configured),
    /// local and tmpfs.
    #[arg(short = 'T', long = "target", value_delimiter = ',', value_name = "TARGET")]
    pub targets: Vec<String>,
    /// Tasks (logical files).
    #[arg(short = 'N', long, default_value_t = 256)]
    pub tasks: usize,
    /// Bytes per task (repeat or separate with commas); 0: the create measurement only.
    #[arg(short = 's', long = "size", value_delimiter = ',', value_parser = parse_size, default_value = "1K,1M")]
    pub sizes: Vec<u64>,
    /// Layouts (repeat or separate with commas): files (one per task), container,
    /// multi (a multi-file container, --nfiles), coalesced (a container written through
    /// collector tasks; every task's data is in memory at once, as collectors need it).
    #[arg(short = 'L', long = "layout", value_delimiter = ',', default_value = "files,container,multi,coalesced")]
    pub layouts: Vec<String>,
    /// Physical files of the multi layout.
    #[arg(long, default_value_t = 4)]
    pub nfiles: u32,
    /// Tasks per collector in the coalesced layout (0: enough to fill one block).
    #[arg(long, default_value_t = 0)]
    pub collector_size: u32,
    /// Block size containers align chunks to (on Shoal also the stripe size); 0: the file
    /// system's (the directory's stripe size on Shoal, st_blksize elsewhere).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub fs_block: u64,
    /// Tasks doing file-system I/O at once.
    #[arg(long, default_value_t = 64, value_name = "K")]
    pub in_flight: usize,
    /// Repetitions of everything (medians are reported).
    #[arg(long, default_value_t = 1)]
    pub reps: usize,
    /// Shoal folder under which native runs make their run directory.
    #[arg(long, default_value = "/shoal-bench", value_name = "PATH")]
    pub base: String,
    /// Print the results as JSON on standard output (progress bars stay on stderr).
    #[arg(long)]
    pub json: bool,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json_file: Option<PathBuf>,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

const EXAMPLES: &str = "Examples:
  shoal bench container                                   # 256 tasks, 1 KiB and 1 MiB each, all layouts
  shoal bench container -N 100000 -s 0 -L files,container # create: 100,000 files against one container
  shoal bench container -T native,fuse:/mnt/shoal,local,tmpfs -s 1K,64K,1M,4M --reps 3
Columns: create = N files made and closed empty, or the container opened and closed
collectively; write and read = open, move every byte, close (writes durable: fsync per file,
the container's close syncs); size/data = the files' sizes over the tasks' bytes; disk/data
= bytes allocated over the tasks' bytes (POSIX targets). The ratio lines compare each
container layout with files on the same target.";

/// How the tasks' data is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    Files,
    Container,
    Multi,
    Coalesced,
}

impl Layout {
    fn parse(s: &str) -> Result<Layout> {
        Ok(match s {
            "files" | "file" | "fpp" => Layout::Files,
            "container" | "sion" => Layout::Container,
            "multi" | "multi-file" => Layout::Multi,
            "coalesced" | "coll" | "collective" => Layout::Coalesced,
            other => bail!("unknown layout {other:?} (files, container, multi, coalesced)"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Layout::Files => "files",
            Layout::Container => "container",
            Layout::Multi => "multi",
            Layout::Coalesced => "coalesced",
        }
    }
}

/// One target, layout and size: medians over the repetitions.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub target: String,
    pub layout: Layout,
    pub tasks: usize,
    pub size: u64,
    /// Seconds to create and close every task's file empty.
    pub create_s: f64,
    /// Seconds to open, write, make durable and close (absent with size 0).
    pub write_s: Option<f64>,
    pub write_mib_s: Option<f64>,
    /// Seconds to open, read back and close.
    pub read_s: Option<f64>,
    pub read_mib_s: Option<f64>,
    /// After the write: the files' sizes, and the bytes allocated on disk (POSIX targets:
    /// Shoal's stat knows the allocation of files on one server only, so it is not given).
    pub size_bytes: Option<u64>,
    pub disk_bytes: Option<u64>,
    /// The tasks' bytes.
    pub data_bytes: u64,
}

/// Where the benchmark's files go on one target.
struct Place {
    label: String,
    target: Target,
    /// The run directory (a Shoal path, or a host path).
    dir: String,
}

pub async fn run(config: Option<PathBuf>, a: ContainerArgs) -> Result<()> {
    if a.tasks == 0 {
        bail!(crate::cli::UsageError("--tasks must be at least 1".into()));
    }
    let layouts = a.layouts.iter().map(|l| Layout::parse(l)).collect::<Result<Vec<_>>>().map_err(usage)?;
    let targets = if a.targets.is_empty() {
        let mut t = vec!["local".to_string(), "tmpfs".to_string()];
        if config.is_some() {
            t.insert(0, "native".into());
        }
        t
    } else {
        a.targets.clone()
    };
    let mut places = Vec::new();
    for t in &targets {
        let spec = TargetSpec::parse(t, config.as_ref(), &a.base).map_err(usage)?;
        places.push(place(&spec, &a.base).await?);
    }
    let runs = places.len() * a.sizes.len() * layouts.len() * a.reps;
    let bar = if a.quiet || runs == 0 { ProgressBar::hidden() } else { ProgressBar::new(runs as u64) };
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]").expect("template"));
    let measured = async {
        let mut rows = Vec::new();
        for p in &places {
            for &size in &a.sizes {
                for &layout in &layouts {
                    let mut reps = Vec::new();
                    for rep in 0..a.reps {
                        bar.set_message(format!("{} {} {} B/task, run {}", p.label, layout.name(), size, rep + 1));
                        let r = one_run(p, layout, size, &a)
                            .await
                            .with_context(|| format!("{} on {} ({} bytes per task)", layout.name(), p.label, size))?;
                        reps.push(r);
                        bar.inc(1);
                    }
                    rows.push(medians(&reps));
                }
            }
        }
        anyhow::Ok(rows)
    }
    .await;
    bar.finish_and_clear();
    // The run directories go, also after a failure.
    for p in &places {
        clean(p, &p.dir).await;
    }
    let rows = measured?;
    let out = serde_json::json!({ "benchmark": "container", "rows": rows });
    if let Some(f) = &a.json_file {
        std::fs::write(f, serde_json::to_string_pretty(&out)?).with_context(|| format!("write {}", f.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", table(&rows, &a));
    }
    Ok(())
}

fn usage(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(crate::cli::UsageError(format!("{e:#}")))
}

/// The target's run directory, made; a client for native targets.
async fn place(spec: &TargetSpec, base: &str) -> Result<Place> {
    let run = format!("container-{}", std::process::id());
    match &spec.kind {
        TargetKind::Native { config, .. } => {
            let client = Client::from_config(config, ClientOptions::default())
                .with_context(|| format!("connect to the cluster of {}", config.display()))?;
            let dir = format!("{}/{run}", base.trim_end_matches('/'));
            client.mkdir_all(&dir, 0o755).await.with_context(|| format!("make {dir} on Shoal"))?;
            Ok(Place { label: spec.label(), target: Target::Shoal(client), dir })
        }
        TargetKind::Posix { dir, role } => {
            if *role == PosixRole::Preload {
                bail!("target preload: the container benchmark runs in this process; use fuse:DIR");
            }
            let dir = dir.join(format!("shoal-bench-{run}"));
            std::fs::create_dir_all(&dir).with_context(|| format!("make {}", dir.display()))?;
            Ok(Place { label: spec.label(), target: Target::Posix, dir: dir.to_string_lossy().into_owned() })
        }
    }
}

/// Measurements of one run.
struct Measured {
    create_s: f64,
    write_s: Option<f64>,
    read_s: Option<f64>,
    usage: Option<Usage>,
    data_bytes: u64,
    tasks: usize,
    size: u64,
    layout: Layout,
    target: String,
}

async fn one_run(p: &Place, layout: Layout, size: u64, a: &ContainerArgs) -> Result<Measured> {
    let dir = format!("{}/{}-{size}", p.dir, layout.name());
    make_dir(p, &dir).await?;
    let job = Job::new(p, dir.clone(), layout, size, a);
    let create_s = timed(job.create()).await?;
    clean(p, &dir).await;
    make_dir(p, &dir).await?;
    let (mut write_s, mut read_s, mut usage) = (None, None, None);
    if size > 0 {
        write_s = Some(timed(job.write()).await?);
        usage = Some(disk_usage(p, &dir).await?);
        read_s = Some(timed(job.read()).await?);
    }
    clean(p, &dir).await;
    Ok(Measured {
        create_s,
        write_s,
        read_s,
        usage,
        data_bytes: size * a.tasks as u64,
        tasks: a.tasks,
        size,
        layout,
        target: p.label.clone(),
    })
}

async fn timed(f: impl std::future::Future<Output = Result<()>>) -> Result<f64> {
    let t = Instant::now();
    f.await?;
    Ok(t.elapsed().as_secs_f64())
}

/// One layout on one target: what every task does. Shared by the tasks, each a runtime
/// task of its own (so that the tasks' work, theirs and the benchmark's, spreads over the
/// runtime's threads in every layout alike).
struct Job {
    target: Target,
    dir: String,
    layout: Layout,
    size: u64,
    tasks: usize,
    /// Permits to do file-system I/O (tasks doing I/O at once).
    io: Semaphore,
    options: WriteOptions,
}

impl Job {
    fn new(p: &Place, dir: String, layout: Layout, size: u64, a: &ContainerArgs) -> Arc<Job> {
        let collector_size = match (layout, a.collector_size) {
            (Layout::Coalesced, 0) => COLLECTOR_AUTO,
            (Layout::Coalesced, c) => c.max(2),
            _ => 0,
        };
        let options = WriteOptions {
            chunk_size: size.max(1),
            nfiles: if layout == Layout::Multi { a.nfiles.clamp(1, a.tasks as u32) } else { 1 },
            fs_block: a.fs_block,
            key_value: false,
            collector_size,
        };
        let io = Semaphore::new(a.in_flight.max(1));
        Arc::new(Job { target: p.target.clone(), dir, layout, size, tasks: a.tasks, io, options })
    }

    fn file_of(&self, rank: usize) -> String {
        format!("{}/task.{rank:06}", self.dir)
    }

    fn container(&self) -> String {
        format!("{}/tasks.sion", self.dir)
    }

    /// Every task's file made and closed, empty.
    async fn create(self: &Arc<Self>) -> Result<()> {
        match self.layout {
            Layout::Files => self.on_files(file_create_empty).await,
            _ => self.on_tasks(container_create_empty).await,
        }
    }

    /// Every task's data written, durable, and its file closed.
    async fn write(self: &Arc<Self>) -> Result<()> {
        match self.layout {
            Layout::Files => self.on_files(file_write).await,
            _ => self.on_tasks(container_write).await,
        }
    }

    /// Every task's data read back and checked.
    async fn read(self: &Arc<Self>) -> Result<()> {
        match self.layout {
            Layout::Files => self.on_files(file_read).await,
            _ => self.on_tasks(container_read).await,
        }
    }

    /// `task(job, comm, rank)` on every task at once, joined by one communicator.
    async fn on_tasks<Fut>(self: &Arc<Self>, task: fn(Arc<Job>, Box<dyn Comm>, usize) -> Fut) -> Result<()>
    where
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let handles: Vec<_> = LocalComm::group(self.tasks)
            .into_iter()
            .map(|c| {
                let rank = c.rank();
                tokio::spawn(task(self.clone(), Box::new(c), rank))
            })
            .collect();
        join(handles).await
    }

    /// `task(job, rank)` for every task's file, at most `in_flight` at once.
    async fn on_files<Fut>(self: &Arc<Self>, task: fn(Arc<Job>, usize) -> Fut) -> Result<()>
    where
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let handles: Vec<_> = (0..self.tasks)
            .map(|rank| {
                let job = self.clone();
                tokio::spawn(async move {
                    let _io = job.io.acquire().await?;
                    task(job.clone(), rank).await
                })
            })
            .collect();
        join(handles).await
    }
}

/// Every task's result; the first error.
async fn join(handles: Vec<tokio::task::JoinHandle<Result<()>>>) -> Result<()> {
    let mut first = Ok(());
    for h in handles {
        let r = h.await.context("a benchmark task panicked").and_then(|r| r);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

async fn container_create_empty(job: Arc<Job>, comm: Box<dyn Comm>, _rank: usize) -> Result<()> {
    let opts = WriteOptions { chunk_size: 1, ..job.options.clone() };
    let f = ParFile::create(comm, &job.target, &job.container(), &opts).await?;
    f.close().await?;
    Ok(())
}

async fn container_write(job: Arc<Job>, comm: Box<dyn Comm>, rank: usize) -> Result<()> {
    let mut f = ParFile::create(comm, &job.target, &job.container(), &job.options).await?;
    if job.layout == Layout::Coalesced {
        // Collective: the collectors do the I/O.
        f.fwrite_coll(&pattern(rank, job.size)).await?;
    } else {
        // The data is made once the task may do I/O, as with files: at most `in_flight`
        // tasks hold theirs at a time.
        let _io = job.io.acquire().await?;
        f.logical().write(&pattern(rank, job.size)).await?;
    }
    f.close().await?;
    Ok(())
}

async fn container_read(job: Arc<Job>, comm: Box<dyn Comm>, rank: usize) -> Result<()> {
    let mut f = ParFile::open(comm, &job.target, &job.container()).await?;
    let mut got = Vec::new();
    let n = if job.layout == Layout::Coalesced {
        got.resize(job.size as usize, 0);
        f.fread_coll(&mut got).await?
    } else {
        let _io = job.io.acquire().await?;
        got.resize(job.size as usize, 0);
        let mut n = 0;
        while n < got.len() {
            match f.logical().read(&mut got[n..]).await? {
                0 => break,
                k => n += k,
            }
        }
        n
    };
    check(&got[..n], rank, job.size)?;
    f.close().await?;
    Ok(())
}

async fn file_create_empty(job: Arc<Job>, rank: usize) -> Result<()> {
    let path = job.file_of(rank);
    match &job.target {
        Target::Shoal(c) => {
            c.create(&path, 0o644, None).await?.close().await?;
            Ok(())
        }
        Target::Posix => {
            blocking(move || {
                std::fs::File::create(&path).with_context(|| format!("create {path}"))?;
                Ok(())
            })
            .await
        }
    }
}

async fn file_write(job: Arc<Job>, rank: usize) -> Result<()> {
    let path = job.file_of(rank);
    let data = pattern(rank, job.size);
    match &job.target {
        Target::Shoal(c) => {
            let f = c.create(&path, 0o644, None).await?;
            f.write_bytes_at(0, data.into()).await?;
            // The native close makes the file durable.
            f.close().await?;
            Ok(())
        }
        Target::Posix => {
            blocking(move || {
                use std::io::Write;
                let mut f = std::fs::File::create(&path).with_context(|| format!("create {path}"))?;
                f.write_all(&data).with_context(|| format!("write {path}"))?;
                f.sync_all().with_context(|| format!("fsync {path}"))?;
                Ok(())
            })
            .await
        }
    }
}

async fn file_read(job: Arc<Job>, rank: usize) -> Result<()> {
    let path = job.file_of(rank);
    let size = job.size;
    let got = match &job.target {
        Target::Shoal(c) => {
            let f = c.open(&path, shoal_client::OpenFlags::read_only()).await?;
            let mut got = Vec::with_capacity(size as usize);
            while (got.len() as u64) < size {
                let b = f.read_at(got.len() as u64, size as usize - got.len()).await?;
                if b.is_empty() {
                    break;
                }
                got.extend_from_slice(&b);
            }
            f.close().await?;
            got
        }
        Target::Posix => blocking(move || std::fs::read(&path).with_context(|| format!("read {path}"))).await?,
    };
    check(&got, rank, size)
}

/// Blocking file-system calls on tokio's blocking threads, so that `in_flight` of them
/// proceed at once as they would from as many tasks.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.context("a benchmark thread panicked")?
}

/// Task `rank`'s bytes: 8-byte words naming the rank and the word's place, so that a
/// misplaced piece shows. Cheap to make (the benchmark's own work must not be what it
/// measures: a byte-by-byte pattern took 60 % of the CPU of a 1 MiB run).
fn pattern(rank: usize, size: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    fill_at(&mut v, rank, 0);
    v
}

fn check(got: &[u8], rank: usize, size: u64) -> Result<()> {
    if got.len() as u64 != size {
        bail!("task {rank} read {} bytes back of the {size} it wrote", got.len());
    }
    // Compared a piece at a time against the pattern, without a second full buffer.
    let mut want = vec![0u8; 64 << 10];
    for (i, piece) in got.chunks(want.len()).enumerate() {
        let want = &mut want[..piece.len()];
        fill_at(want, rank, i * (64 << 10));
        if piece != &want[..] {
            bail!("task {rank} read back other bytes than it wrote (near byte {})", i * (64 << 10));
        }
    }
    Ok(())
}

/// The piece of task `rank`'s pattern that starts at byte `at` (a multiple of 8).
fn fill_at(buf: &mut [u8], rank: usize, at: usize) {
    let tag = (rank as u64) << 40;
    let first = at / 8;
    let whole = buf.len() / 8;
    let mut words = buf.chunks_exact_mut(8);
    for (i, w) in (&mut words).enumerate() {
        w.copy_from_slice(&(tag | (first + i) as u64).to_le_bytes());
    }
    let rest = words.into_remainder();
    let last = (tag | (first + whole) as u64).to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
}

async fn make_dir(p: &Place, dir: &str) -> Result<()> {
    match &p.target {
        Target::Shoal(c) => {
            c.mkdir_all(dir, 0o755).await.with_context(|| format!("make {dir}"))?;
        }
        Target::Posix => std::fs::create_dir_all(dir).with_context(|| format!("make {dir}"))?,
    }
    Ok(())
}

/// Remove `dir` and everything in it; a failure is only reported (the numbers stand).
async fn clean(p: &Place, dir: &str) {
    let r = match &p.target {
        Target::Shoal(c) => c.remove_all(dir).await.map(|_| ()).map_err(anyhow::Error::from),
        Target::Posix => std::fs::remove_dir_all(dir).or_else(ignore_missing).map_err(anyhow::Error::from),
    };
    if let Err(e) = r {
        eprintln!("shoal bench container: could not remove {dir}: {e:#}");
    }
}

fn ignore_missing(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == std::io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

/// What the files in `dir` take.
#[derive(Clone, Copy)]
struct Usage {
    size: u64,
    /// Bytes allocated (POSIX targets only).
    disk: Option<u64>,
}

async fn disk_usage(p: &Place, dir: &str) -> Result<Usage> {
    match &p.target {
        Target::Shoal(c) => {
            let entries = c.readdir(dir).await.with_context(|| format!("list {dir}"))?;
            let mut s = futures::stream::iter(entries)
                .map(|e| async move { c.lstat(&format!("{dir}/{}", e.name)).await.map(|a| a.size) })
                .buffer_unordered(64);
            let mut size = 0;
            while let Some(b) = s.next().await {
                size += b?;
            }
            Ok(Usage { size, disk: None })
        }
        Target::Posix => {
            let (mut size, mut disk) = (0, 0);
            for e in std::fs::read_dir(dir).with_context(|| format!("list {dir}"))? {
                let m = e?.metadata()?;
                size += m.len();
                disk += m.blocks() * 512;
            }
            Ok(Usage { size, disk: Some(disk) })
        }
    }
}

fn medians(reps: &[Measured]) -> Row {
    let first = &reps[0];
    let med = |f: &dyn Fn(&Measured) -> Option<f64>| {
        let mut v: Vec<f64> = reps.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    let mib = first.data_bytes as f64 / (1 << 20) as f64;
    let write_s = med(&|m| m.write_s);
    let read_s = med(&|m| m.read_s);
    Row {
        target: first.target.clone(),
        layout: first.layout,
        tasks: first.tasks,
        size: first.size,
        create_s: med(&|m| Some(m.create_s)).unwrap_or(0.0),
        write_s,
        write_mib_s: write_s.map(|s| mib / s.max(1e-9)),
        read_s,
        read_mib_s: read_s.map(|s| mib / s.max(1e-9)),
        size_bytes: med(&|m| m.usage.map(|u| u.size as f64)).map(|b| b as u64),
        disk_bytes: med(&|m| m.usage.and_then(|u| u.disk).map(|b| b as f64)).map(|b| b as u64),
        data_bytes: first.data_bytes,
    }
}

fn table(rows: &[Row], a: &ContainerArgs) -> String {
    let mut s = String::new();
    let reps = if a.reps > 1 { format!(", medians of {} runs", a.reps) } else { String::new() };
    let _ = writeln!(s, "container benchmark: {} tasks, at most {} doing I/O at once{reps}", a.tasks, a.in_flight);
    let _ = writeln!(
        s,
        "{:<10} {:<10} {:>9} {:>10} {:>11} {:>11} {:>10} {:>10}",
        "target", "layout", "per task", "create(s)", "write MiB/s", "read MiB/s", "size/data", "disk/data"
    );
    for r in rows {
        let opt = |v: Option<f64>| v.map_or("-".to_string(), crate::report::fmt_rate);
        let per_data = |b: Option<u64>| match b {
            Some(b) if r.data_bytes > 0 => format!("{:.2}", b as f64 / r.data_bytes as f64),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "{:<10} {:<10} {:>9} {:>10.3} {:>11} {:>11} {:>10} {:>10}",
            r.target,
            r.layout.name(),
            crate::report::fmt_bytes(r.size as f64),
            r.create_s,
            opt(r.write_mib_s),
            opt(r.read_mib_s),
            per_data(r.size_bytes),
            per_data(r.disk_bytes),
        );
    }
    let ratios = ratio_lines(rows);
    if !ratios.is_empty() {
        let _ = writeln!(s, "\nagainst files on the same target (create: times faster; write, read: bandwidth ratio):");
        s.push_str(&ratios);
    }
    s
}

/// Each container layout against `files` (and coalesced against container) per target and size.
fn ratio_lines(rows: &[Row]) -> String {
    let mut s = String::new();
    let find = |t: &str, size: u64, l: Layout| rows.iter().find(|r| r.target == t && r.size == size && r.layout == l);
    let div = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    for r in rows.iter().filter(|r| r.layout != Layout::Files) {
        let Some(f) = find(&r.target, r.size, Layout::Files) else { continue };
        let _ = write!(
            s,
            "  {:<10} {:<10} {:>9}: create {:>7}x  write {:>5}  read {:>5}",
            r.target,
            r.layout.name(),
            crate::report::fmt_bytes(r.size as f64),
            format!("{:.1}", f.create_s / r.create_s.max(1e-9)),
            div(r.write_mib_s, f.write_mib_s),
            div(r.read_mib_s, f.read_mib_s),
        );
        if r.layout == Layout::Coalesced {
            if let Some(c) = find(&r.target, r.size, Layout::Container) {
                let w = |x: &Row| x.write_s.zip(x.read_s).map(|(w, r)| w + r);
                let _ = write!(s, "  (write+read {} times faster than container)", div(w(c), w(r)));
            }
        }
        s.push('\n');
    }
    s
}
