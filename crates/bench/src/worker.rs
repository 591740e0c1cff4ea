//! The worker: one benchmark rank. A worker serves jobs: a job line (`job {Job}`) makes it
//! prepare (connect, resolve its directories) and say `ready`; then it runs each phase when
//! the driver says `go {phase}`: it waits for the start time the driver chose (all ranks
//! start together), runs, and answers `done {result}`. While a phase runs it sends
//! `progress N` a few times a second for the driver's progress bar. `quit` ends the job.
//!
//! Lines from the driver: `job {Job}`, `go {"phase":…,"start_at_ns":…}`, `quit`, `ping`
//! (between jobs; answered with `pong T`, T = this process's CLOCK_MONOTONIC in ns, for the
//! clock-offset measurement of mpirun ranks) and `exit` (mpirun ranks: the benchmark is
//! over). Lines to the driver: `ready`, `progress N`, `done {PhaseResult}`, `error MESSAGE`,
//! `pong T`.
//!
//! The same [`session`] serves every transport ([`link`](crate::link)): a worker process
//! the driver started (`shoal bench worker`, stdin/stdout, one job, then end of input), an
//! mpirun rank (TCP to rank 0, any number of jobs, then `exit`) and rank 0's own worker
//! (a thread of the driver's process).

use crate::clock::{mono_ns, wait_until};
use crate::hist::Histogram;
use crate::link::{Inbox, Outbox};
use crate::listing::{Checklist, Contents};
use crate::pattern;
use crate::spec::*;
use crate::timeline::{Recorder, Timeline};
use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use shoal_client::{Client, ClientOptions, OpenFlags};
use shoal_proto::msg::LayoutSpec;
use shoal_proto::Ino;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one worker measured in one phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PhaseResult {
    pub rank: u64,
    /// Transfers (I/O phases) or items (metadata phases) done.
    pub ops: u64,
    /// Bytes written or read.
    pub bytes: u64,
    /// CLOCK_MONOTONIC when the worker started and finished the phase.
    pub start_ns: u64,
    pub end_ns: u64,
    /// I/O phases: time spent opening, and closing (fsync included).
    pub open_ns: u64,
    pub close_ns: u64,
    /// Latency of each transfer or item.
    pub hist: Histogram,
    /// Bytes read and found equal to the pattern written; and transfers or files that were not.
    pub verified_bytes: u64,
    pub verify_errors: u64,
    /// CPU time (user + system) the worker process used during the phase.
    #[serde(default)]
    pub cpu_ns: u64,
    /// When the operations completed (for the rates of the phase's first and last tenth).
    #[serde(default)]
    pub timeline: Timeline,
}

#[derive(Serialize, Deserialize)]
pub struct GoMessage {
    pub phase: Phase,
    pub start_at_ns: u64,
}

/// Entry point of `shoal bench worker`: serve the driver on stdin/stdout until the end of input.
pub async fn worker_main() -> Result<()> {
    session(crate::link::stdin_inbox(), Outbox::Stdout, Arc::new(AtomicBool::new(false))).await
}

/// Serve jobs from `inbox` until `exit` or the end of the inbox. `stop` set: the phase in
/// progress ends after its current operations, with an error.
pub async fn session(mut inbox: Inbox, out: Outbox, stop: Arc<AtomicBool>) -> Result<()> {
    while let Some(line) = inbox.recv().await {
        let line = line.trim();
        match line {
            "" => continue,
            "exit" => return Ok(()),
            "quit" => continue,
            "ping" => {
                out.say(&format!("pong {}", mono_ns()));
                continue;
            }
            _ => {}
        }
        // `job {json}`; a bare JSON line is a job too.
        let json = line.strip_prefix("job ").unwrap_or(line);
        let job: Job = match serde_json::from_str(json) {
            Ok(j) => j,
            Err(e) => {
                out.say(&format!("error unknown command or bad job {line:?}: {e}"));
                bail!("unknown command or bad job from the driver: {line:?}");
            }
        };
        serve_job(job, &mut inbox, &out, &stop).await?;
    }
    Ok(())
}

/// One job: set up, `ready`, phases on `go` until `quit`.
async fn serve_job(job: Job, inbox: &mut Inbox, out: &Outbox, stop: &Arc<AtomicBool>) -> Result<()> {
    let mut worker = match Worker::setup(job).await {
        Ok(w) => w,
        Err(e) => {
            out.say(&format!("error {}", one_line(&e)));
            return Err(e);
        }
    };
    worker.out = Some(out.clone());
    worker.stop = stop.clone();
    out.say("ready");
    while let Some(line) = inbox.recv().await {
        let line = line.trim();
        if line == "quit" {
            return Ok(());
        }
        let Some(rest) = line.strip_prefix("go ") else {
            out.say(&format!("error unknown command {line:?}"));
            bail!("unknown command from the driver: {line:?}");
        };
        let go: GoMessage = serde_json::from_str(rest).context("bad go line")?;
        match worker.run(&go.phase, go.start_at_ns).await {
            Ok(r) => out.say(&format!("done {}", serde_json::to_string(&r)?)),
            Err(e) => {
                out.say(&format!("error {}", one_line(&e)));
                return Err(e);
            }
        }
    }
    Ok(())
}

fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

/// Prints `progress N` every 200 ms while a phase runs.
struct Reporter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reporter {
    fn start(counter: Arc<AtomicU64>, out: Option<Outbox>) -> Reporter {
        let stop = Arc::new(AtomicBool::new(false));
        let Some(out) = out else {
            return Reporter { stop, thread: None };
        };
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut last = 0;
            while !s.load(Ordering::Relaxed) {
                std::thread::park_timeout(Duration::from_millis(200));
                let n = counter.load(Ordering::Relaxed);
                if n != last && !s.load(Ordering::Relaxed) {
                    out.say(&format!("progress {n}"));
                    last = n;
                }
            }
        });
        Reporter { stop, thread: Some(thread) }
    }

    fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

enum Backend {
    Native(Native),
    Posix { run_dir: PathBuf },
}

struct Native {
    /// Inode-level calls; its cache is off by default so that every stat is a request.
    meta: Client,
    /// Path-level opens; caches the run directory so that an open costs no path walk.
    paths: Client,
    /// mdtest: the directory of this rank's items, and the one it stats and reads
    /// (the next rank's with `shift`).
    own_dir: Option<Ino>,
    peer_dir: Option<Ino>,
}

pub struct Worker {
    job: Job,
    backend: Backend,
    progress: Arc<AtomicU64>,
    /// Where progress goes (None: not reported).
    out: Option<Outbox>,
    /// Set by the driver's process to stop a phase early (rank 0's worker after a failure).
    stop: Arc<AtomicBool>,
    /// md: what the phases so far have made (what a `list` phase expects to see).
    contents: Mutex<Contents>,
}

impl Worker {
    pub async fn setup(job: Job) -> Result<Worker> {
        let backend = match &job.target.kind {
            TargetKind::Native { config, .. } => {
                let opts = ClientOptions {
                    timeout: Duration::from_secs(job.timeout_secs.max(1)),
                    cache_ttl: Duration::from_millis(job.cache_ttl_ms),
                    ..ClientOptions::default()
                };
                let opts = ClientOptions {
                    write_behind: job.tuning.write_behind.map_or(opts.write_behind, |b| b as usize),
                    readahead: job.tuning.readahead.map_or(opts.readahead, |b| b as usize),
                    ..opts
                };
                let meta = Client::from_config(config, opts.clone())
                    .with_context(|| format!("cannot use the cluster configuration {}", config.display()))?;
                let paths =
                    Client::from_config(config, ClientOptions { cache_ttl: Duration::from_secs(3600), ..opts })?;
                let mut n = Native { meta, paths, own_dir: None, peer_dir: None };
                if let Workload::Md(md) = &job.workload {
                    let own = format!("{}/{}", job.run_dir, md_dir_name(md, job.rank));
                    let peer = format!("{}/{}", job.run_dir, md_dir_name(md, peer_rank(&job, md.shift)));
                    n.own_dir = Some(n.paths.resolve(&own, true).await.with_context(|| format!("resolve {own}"))?.ino);
                    n.peer_dir =
                        Some(n.paths.resolve(&peer, true).await.with_context(|| format!("resolve {peer}"))?.ino);
                } else {
                    // Warm the path cache: the run directory resolves without a request.
                    n.paths.resolve(&job.run_dir, true).await.with_context(|| format!("resolve {}", job.run_dir))?;
                }
                Backend::Native(n)
            }
            TargetKind::Posix { .. } => {
                let run_dir = PathBuf::from(&job.run_dir);
                if !run_dir.is_dir() {
                    bail!("{} is not a directory", run_dir.display());
                }
                Backend::Posix { run_dir }
            }
        };
        Ok(Worker {
            job,
            backend,
            progress: Arc::new(AtomicU64::new(0)),
            out: None,
            stop: Arc::new(AtomicBool::new(false)),
            contents: Mutex::new(Contents::default()),
        })
    }

    /// Run one phase, starting at `start_at_ns` (CLOCK_MONOTONIC).
    pub async fn run(&self, phase: &Phase, start_at_ns: u64) -> Result<PhaseResult> {
        self.progress.store(0, Ordering::Relaxed);
        wait_until(start_at_ns).await;
        let cpu0 = crate::clock::self_cpu_ns();
        let reporter = Reporter::start(self.progress.clone(), self.out.clone());
        let r = match (&self.job.workload, &self.backend) {
            (Workload::Io(io), Backend::Native(n)) => self.native_io(n, io, phase.kind).await,
            (Workload::Io(io), Backend::Posix { run_dir }) => blocking(|| self.posix_io(run_dir, io, phase.kind)),
            (Workload::Md(md), Backend::Native(n)) => self.native_md(n, md, phase.kind).await,
            (Workload::Md(md), Backend::Posix { run_dir }) => blocking(|| self.posix_md(run_dir, md, phase.kind)),
        };
        reporter.finish();
        let mut r = r.with_context(|| format!("rank {} phase {}", self.job.rank, phase.label))?;
        self.contents.lock().unwrap().after(phase.kind);
        r.rank = self.job.rank;
        r.cpu_ns = crate::clock::self_cpu_ns().saturating_sub(cpu0);
        r.hist.seal();
        Ok(r)
    }

    fn in_flight(&self) -> usize {
        self.job.in_flight.max(1)
    }

    /// The rank whose data this rank reads in phase `kind` (IOR -C / mdtest -N 1).
    fn io_owner(&self, io: &IoSpec, kind: PhaseKind) -> u64 {
        if kind == PhaseKind::Read && io.reorder {
            (self.job.rank + 1) % self.job.nprocs
        } else {
            self.job.rank
        }
    }

    /// Transfer indices in the order this rank issues them.
    fn io_order(&self, io: &IoSpec, owner: u64) -> Vec<u64> {
        let mut order: Vec<u64> = (0..io.transfers_per_proc()).collect();
        if io.random {
            let mut rng = rand::rngs::StdRng::seed_from_u64(self.job.seed ^ owner.wrapping_mul(0x1000_0000_01b3));
            order.shuffle(&mut rng);
        }
        order
    }

    fn io_seed(&self, io: &IoSpec, owner: u64) -> u64 {
        pattern::file_seed(self.job.seed, if io.file_per_proc { owner } else { u64::MAX })
    }

    // ---------------------------------------------------------------- I/O, native

    async fn native_io(&self, n: &Native, io: &IoSpec, kind: PhaseKind) -> Result<PhaseResult> {
        let owner = self.io_owner(io, kind);
        let path = format!("{}/{}", self.job.run_dir, io_file_name(io, owner));
        let seed = self.io_seed(io, owner);
        let order = self.io_order(io, owner);
        let nprocs = self.job.nprocs;
        let t = io.transfer as usize;
        let mut r = PhaseResult { start_ns: mono_ns(), ..Default::default() };
        let writing = kind == PhaseKind::Write;
        let flags = if writing {
            let layout =
                (io.stripe_count.is_some() || io.stripe_size.is_some() || io.policy.is_some()).then(|| LayoutSpec {
                    stripe_count: io.stripe_count,
                    stripe_size: io.stripe_size,
                    policy: io.policy,
                    ..Default::default()
                });
            OpenFlags { write: true, create: true, perm: 0o644, layout, ..Default::default() }
        } else {
            OpenFlags::read_only()
        };
        let file = n.paths.open(&path, flags).await.with_context(|| format!("open {path}"))?;
        r.open_ns = mono_ns() - r.start_ns;
        let pool: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
        let verified = AtomicU64::new(0);
        let bad = AtomicU64::new(0);
        let file_ref = &file;
        let path = &path;
        let marks = Recorder::new(order.len() as u64);
        let hist = run_async(order.len() as u64, self.in_flight(), &self.progress, &marks, &self.stop, |i| {
            let off = io.offset(owner, nprocs, order[i as usize]);
            let pool = &pool;
            let verified = &verified;
            let bad = &bad;
            async move {
                if writing {
                    let mut buf = pool.lock().unwrap().pop().unwrap_or_else(|| vec![0u8; t]);
                    pattern::fill(&mut buf, seed, off);
                    let t0 = mono_ns();
                    file_ref.write_at(off, &buf).await.with_context(|| format!("write {path} at {off}"))?;
                    let dt = mono_ns() - t0;
                    pool.lock().unwrap().push(buf);
                    Ok(dt)
                } else {
                    let t0 = mono_ns();
                    let data = file_ref.read_at(off, t).await.with_context(|| format!("read {path} at {off}"))?;
                    let dt = mono_ns() - t0;
                    if data.len() != t {
                        bad.fetch_add(1, Ordering::Relaxed);
                    } else if io.verify {
                        let mut scratch = pool.lock().unwrap().pop().unwrap_or_default();
                        if pattern::check(&data, seed, off, &mut scratch) {
                            verified.fetch_add(t as u64, Ordering::Relaxed);
                        } else {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                        pool.lock().unwrap().push(scratch);
                    }
                    Ok(dt)
                }
            }
        })
        .await?;
        let c0 = mono_ns();
        if writing && io.fsync {
            // The client's close is fsync (data and size durable on every server involved).
            file.close().await.with_context(|| format!("close {path}"))?;
        } else {
            // close(2) without fsync: publish the size, do not sync.
            file.flush().await.with_context(|| format!("close {path}"))?;
            drop(file);
        }
        r.end_ns = mono_ns();
        r.close_ns = r.end_ns - c0;
        r.ops = hist.count;
        r.bytes = hist.count * io.transfer;
        r.hist = hist;
        r.timeline = marks.finish();
        r.verified_bytes = verified.into_inner();
        r.verify_errors = bad.into_inner();
        Ok(r)
    }

    // ---------------------------------------------------------------- I/O, POSIX

    fn posix_io(&self, run_dir: &std::path::Path, io: &IoSpec, kind: PhaseKind) -> Result<PhaseResult> {
        let owner = self.io_owner(io, kind);
        let path = run_dir.join(io_file_name(io, owner));
        let seed = self.io_seed(io, owner);
        let order = self.io_order(io, owner);
        let nprocs = self.job.nprocs;
        let t = io.transfer as usize;
        let writing = kind == PhaseKind::Write;
        let mut r = PhaseResult { start_ns: mono_ns(), ..Default::default() };
        let file = if writing {
            std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(&path)
        } else {
            std::fs::File::open(&path)
        }
        .with_context(|| format!("open {}", path.display()))?;
        r.open_ns = mono_ns() - r.start_ns;
        let pool: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
        let verified = AtomicU64::new(0);
        let bad = AtomicU64::new(0);
        let marks = Recorder::new(order.len() as u64);
        let hist = run_sync(order.len() as u64, self.in_flight(), &self.progress, &marks, &self.stop, |i| {
            let off = io.offset(owner, nprocs, order[i as usize]);
            let mut buf = pool.lock().unwrap().pop().unwrap_or_else(|| vec![0u8; t]);
            let dt;
            if writing {
                pattern::fill(&mut buf, seed, off);
                let t0 = mono_ns();
                file.write_all_at(&buf, off).with_context(|| format!("write {} at {off}", path.display()))?;
                dt = mono_ns() - t0;
            } else {
                let t0 = mono_ns();
                let got =
                    read_full_at(&file, &mut buf, off).with_context(|| format!("read {} at {off}", path.display()))?;
                dt = mono_ns() - t0;
                if got != t {
                    bad.fetch_add(1, Ordering::Relaxed);
                } else if io.verify {
                    let mut scratch = pool.lock().unwrap().pop().unwrap_or_default();
                    if pattern::check(&buf, seed, off, &mut scratch) {
                        verified.fetch_add(t as u64, Ordering::Relaxed);
                    } else {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    pool.lock().unwrap().push(scratch);
                }
            }
            pool.lock().unwrap().push(buf);
            Ok(dt)
        })?;
        let c0 = mono_ns();
        if writing && io.fsync {
            file.sync_all().with_context(|| format!("fsync {}", path.display()))?;
        }
        drop(file);
        r.end_ns = mono_ns();
        r.close_ns = r.end_ns - c0;
        r.ops = hist.count;
        r.bytes = hist.count * io.transfer;
        r.hist = hist;
        r.timeline = marks.finish();
        r.verified_bytes = verified.into_inner();
        r.verify_errors = bad.into_inner();
        Ok(r)
    }

    // ---------------------------------------------------------------- metadata, native

    async fn native_md(&self, n: &Native, md: &MdSpec, kind: PhaseKind) -> Result<PhaseResult> {
        let rank = self.job.rank;
        let peer = peer_rank(&self.job, md.shift);
        let own_dir = n.own_dir.expect("resolved at setup");
        let peer_dir = n.peer_dir.expect("resolved at setup");
        let own_path = format!("{}/{}", self.job.run_dir, md_dir_name(md, rank));
        let peer_path = format!("{}/{}", self.job.run_dir, md_dir_name(md, peer));
        let size = md.size as usize;
        let verified = AtomicU64::new(0);
        let bad = AtomicU64::new(0);
        let mut r = PhaseResult { start_ns: mono_ns(), ..Default::default() };
        let (verified_ref, bad_ref) = (&verified, &bad);
        let (own_path, peer_path) = (&own_path, &peer_path);
        if kind == PhaseKind::List {
            return self.native_list(n, md).await;
        }
        if let Some(b) = self.job.target.batch {
            let batchable =
                matches!(kind, PhaseKind::Stat | PhaseKind::Unlink) || (kind == PhaseKind::Create && size == 0);
            if batchable {
                return self.native_md_batched(n, md, kind, b as u64).await;
            }
        }
        let marks = Recorder::new(md.files);
        let hist = run_async(md.files, self.in_flight(), &self.progress, &marks, &self.stop, |i| async move {
            let t0 = mono_ns();
            match kind {
                PhaseKind::Create => {
                    let name = md_item_name(rank, i);
                    if size == 0 {
                        n.meta.create_at(own_dir, &name, 0o644, false, None).await?;
                    } else {
                        let flags = OpenFlags { write: true, create: true, perm: 0o644, ..Default::default() };
                        let f = n.paths.open(&format!("{own_path}/{name}"), flags).await?;
                        f.write_at(0, &pattern::make(size, pattern::file_seed(self.job.seed, i), 0)).await?;
                        // close(2) semantics (no fsync, as mdtest): publish the size only.
                        f.flush().await?;
                        drop(f);
                    }
                }
                PhaseKind::Stat => {
                    n.meta.lookup(peer_dir, &md_item_name(peer, i)).await?;
                }
                PhaseKind::ReadFiles => {
                    let f =
                        n.paths.open(&format!("{peer_path}/{}", md_item_name(peer, i)), OpenFlags::read_only()).await?;
                    let data = if size > 0 { f.read_at(0, size).await? } else { Default::default() };
                    f.close().await?;
                    check_small(&data, size, self.job.seed, i, md.verify, verified_ref, bad_ref);
                }
                PhaseKind::Unlink => n.meta.unlink_at(own_dir, &md_item_name(rank, i)).await?,
                PhaseKind::Mkdir => {
                    n.meta.mkdir_at(own_dir, &md_subdir_name(rank, i), 0o755).await?;
                }
                PhaseKind::Rmdir => n.meta.rmdir_at(own_dir, &md_subdir_name(rank, i)).await?,
                PhaseKind::List => bail!("list is not an operation per item"),
                PhaseKind::Write | PhaseKind::Read => bail!("not a metadata phase"),
            }
            Ok(mono_ns() - t0)
        })
        .await?;
        r.end_ns = mono_ns();
        r.ops = hist.count;
        r.bytes = if matches!(kind, PhaseKind::Create | PhaseKind::ReadFiles) { hist.count * md.size } else { 0 };
        r.hist = hist;
        r.timeline = marks.finish();
        r.verified_bytes = verified.into_inner();
        r.verify_errors = bad.into_inner();
        Ok(r)
    }

    /// The create (empty files), stat and unlink phases with `b` operations per request
    /// (`native#B`): items `c*b ..` go in batch `c`, with `in_flight` batches in flight.
    /// Every operation of a batch has the batch's latency. A failed item fails the phase,
    /// as a failed single call does.
    async fn native_md_batched(&self, n: &Native, md: &MdSpec, kind: PhaseKind, b: u64) -> Result<PhaseResult> {
        let rank = self.job.rank;
        let peer = peer_rank(&self.job, md.shift);
        let own_dir = n.own_dir.expect("resolved at setup");
        let peer_dir = n.peer_dir.expect("resolved at setup");
        let mut r = PhaseResult { start_ns: mono_ns(), ..Default::default() };
        let batches = md.files.div_ceil(b);
        let marks = Recorder::new(md.files);
        let hist = run_async_units(batches, self.in_flight(), &self.progress, &marks, &self.stop, |c| async move {
            let items = c * b..((c + 1) * b).min(md.files);
            let count = items.end - items.start;
            let t0 = mono_ns();
            match kind {
                PhaseKind::Create => {
                    let names: Vec<String> = items.map(|i| md_item_name(rank, i)).collect();
                    for res in n.meta.create_many_at(own_dir, &names, 0o644, false).await? {
                        res?;
                    }
                }
                PhaseKind::Stat => {
                    let names: Vec<String> = items.map(|i| md_item_name(peer, i)).collect();
                    for res in n.meta.lookup_many(peer_dir, &names).await? {
                        res?;
                    }
                }
                PhaseKind::Unlink => {
                    let names: Vec<String> = items.map(|i| md_item_name(rank, i)).collect();
                    for res in n.meta.unlink_many_at(own_dir, &names).await? {
                        res?;
                    }
                }
                _ => bail!("phase {kind:?} has no batched form"),
            }
            Ok((mono_ns() - t0, count))
        })
        .await?;
        r.end_ns = mono_ns();
        r.ops = hist.count;
        r.hist = hist;
        r.timeline = marks.finish();
        Ok(r)
    }

    /// The `list` phase on the native client: one `ReadDir` request per page (the client's
    /// largest), every name checked ([`listing`](crate::listing)). Operations are entries
    /// listed; the latency is that of one page.
    async fn native_list(&self, n: &Native, md: &MdSpec) -> Result<PhaseResult> {
        let mut r = PhaseResult { start_ns: mono_ns(), ..Default::default() };
        let shown = format!("{}/{}", self.job.run_dir, md_dir_name(md, self.job.rank));
        let Some(mut check) = self.checklist(md, &shown) else {
            r.end_ns = mono_ns();
            return Ok(r);
        };
        let dir = n.own_dir.expect("resolved at setup");
        let marks = Recorder::new(check.expected());
        let mut hist = Histogram::new();
        let mut after: Option<String> = None;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Err(stopped());
            }
            let t0 = mono_ns();
            let (page, more) =
                n.meta.readdir_page(dir, after.take(), u32::MAX).await.with_context(|| format!("list {shown}"))?;
            hist.record(mono_ns() - t0);
            for e in &page {
                check.see(&e.name)?;
            }
            let count = page.len() as u64;
            r.ops += count;
            self.progress.fetch_add(count, Ordering::Relaxed);
            marks.record(count);
            match page.last() {
                Some(e) if more => after = Some(e.name.clone()),
                _ => break,
            }
        }
        check.finish()?;
        r.end_ns = mono_ns();
        r.hist = hist;
        r.timeline = marks.finish();
        Ok(r)
    }

    /// What this rank's listing of `dir` must show: every rank's items when it is rank 0 in
    /// a shared directory (the other ranks list nothing), else its own.
    fn checklist(&self, md: &MdSpec, dir: &str) -> Option<Checklist> {
        let rank = self.job.rank;
        let ranks = match (md.shared_dir, rank) {
            (true, 0) => 0..self.job.nprocs,
            (true, _) => return None,
            (false, _) => rank..rank + 1,
        };
        Some(Checklist::new(dir, ranks, md.files, *self.contents.lock().unwrap()))
    }

    // ---------------------------------------------------------------- metadata, POSIX

    /// The `list` phase through the kernel: `readdir(3)` until the end, every name checked.
    /// Operations are entries listed; the latency is that of one `readdir(3)` call (most
    /// return an entry from the buffer of the last `getdents64`).
    fn posix_list(&self, run_dir: &std::path::Path, md: &MdSpec) -> Result<PhaseResult> {
        let mut r = PhaseResult { start_ns: mono_ns(), ..Default::default() };
        let dir = run_dir.join(md_dir_name(md, self.job.rank));
        let shown = dir.display().to_string();
        let Some(mut check) = self.checklist(md, &shown) else {
            r.end_ns = mono_ns();
            return Ok(r);
        };
        let marks = Recorder::new(check.expected());
        let mut hist = Histogram::new();
        let mut entries = std::fs::read_dir(&dir).with_context(|| format!("list {shown}"))?;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Err(stopped());
            }
            let t0 = mono_ns();
            let Some(e) = entries.next() else { break };
            hist.record(mono_ns() - t0);
            let name = e.with_context(|| format!("list {shown}"))?.file_name();
            let name = name
                .to_str()
                .ok_or_else(|| anyhow!("the listing of {shown} shows a name that is not UTF-8: {name:?}"))?;
            check.see(name)?;
            r.ops += 1;
            self.progress.fetch_add(1, Ordering::Relaxed);
            marks.record(1);
        }
        check.finish()?;
        r.end_ns = mono_ns();
        r.hist = hist;
        r.timeline = marks.finish();
        Ok(r)
    }

    fn posix_md(&self, run_dir: &std::path::Path, md: &MdSpec, kind: PhaseKind) -> Result<PhaseResult> {
        if kind == PhaseKind::List {
            return self.posix_list(run_dir, md);
        }
        let rank = self.job.rank;
        let peer = peer_rank(&self.job, md.shift);
        let own = run_dir.join(md_dir_name(md, rank));
        let other = run_dir.join(md_dir_name(md, peer));
        let own = own.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
        let other = other.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
        let size = md.size as usize;
        let verified = AtomicU64::new(0);
        let bad = AtomicU64::new(0);
        let mut r = PhaseResult { start_ns: mono_ns(), ..Default::default() };
        let marks = Recorder::new(md.files);
        let hist = run_sync(md.files, self.in_flight(), &self.progress, &marks, &self.stop, |i| {
            let t0 = mono_ns();
            match kind {
                PhaseKind::Create => {
                    let p = format!("{own}/{}", md_item_name(rank, i));
                    let data = if size > 0 {
                        pattern::make(size, pattern::file_seed(self.job.seed, i), 0)
                    } else {
                        Vec::new()
                    };
                    let t0 = mono_ns();
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(&p)
                        .with_context(|| format!("create {p}"))?;
                    if size > 0 {
                        f.write_all(&data).with_context(|| format!("write {p}"))?;
                    }
                    drop(f);
                    return Ok(mono_ns() - t0);
                }
                PhaseKind::Stat => {
                    let p = format!("{other}/{}", md_item_name(peer, i));
                    std::fs::symlink_metadata(&p).with_context(|| format!("stat {p}"))?;
                }
                PhaseKind::ReadFiles => {
                    let p = format!("{other}/{}", md_item_name(peer, i));
                    let mut f = std::fs::File::open(&p).with_context(|| format!("open {p}"))?;
                    let mut buf = vec![0u8; size];
                    let mut got = 0;
                    while got < size {
                        let k = f.read(&mut buf[got..]).with_context(|| format!("read {p}"))?;
                        if k == 0 {
                            break;
                        }
                        got += k;
                    }
                    drop(f);
                    let dt = mono_ns() - t0;
                    buf.truncate(got);
                    check_small(&buf, size, self.job.seed, i, md.verify, &verified, &bad);
                    return Ok(dt);
                }
                PhaseKind::Unlink => {
                    let p = format!("{own}/{}", md_item_name(rank, i));
                    std::fs::remove_file(&p).with_context(|| format!("unlink {p}"))?;
                }
                PhaseKind::Mkdir => {
                    let p = format!("{own}/{}", md_subdir_name(rank, i));
                    std::fs::create_dir(&p).with_context(|| format!("mkdir {p}"))?;
                }
                PhaseKind::Rmdir => {
                    let p = format!("{own}/{}", md_subdir_name(rank, i));
                    std::fs::remove_dir(&p).with_context(|| format!("rmdir {p}"))?;
                }
                PhaseKind::List => bail!("list is not an operation per item"),
                PhaseKind::Write | PhaseKind::Read => bail!("not a metadata phase"),
            }
            Ok(mono_ns() - t0)
        })?;
        r.end_ns = mono_ns();
        r.ops = hist.count;
        r.bytes = if matches!(kind, PhaseKind::Create | PhaseKind::ReadFiles) { hist.count * md.size } else { 0 };
        r.hist = hist;
        r.timeline = marks.finish();
        r.verified_bytes = verified.into_inner();
        r.verify_errors = bad.into_inner();
        Ok(r)
    }
}

/// Run blocking system calls from async code: directly on a current-thread runtime (the
/// worker's own, where nothing else needs the thread), else with `block_in_place`.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The worker process's entry point from a thread with no runtime: its own current-thread
/// runtime, so the native client's connections, the benchmark loop and the replies share
/// one thread (no cross-thread wake-ups in the measured path).
pub fn worker_main_blocking() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start a runtime")?;
    rt.block_on(worker_main())
}

/// The rank whose items this rank stats and reads.
fn peer_rank(job: &Job, shift: bool) -> u64 {
    if shift {
        (job.rank + 1) % job.nprocs.max(1)
    } else {
        job.rank
    }
}

/// mdtest read check: file `i` of its writer holds `size` bytes of the pattern.
fn check_small(data: &[u8], size: usize, seed: u64, i: u64, verify: bool, verified: &AtomicU64, bad: &AtomicU64) {
    if data.len() != size {
        bad.fetch_add(1, Ordering::Relaxed);
    } else if verify && size > 0 {
        if data == &pattern::make(size, pattern::file_seed(seed, i), 0)[..] {
            verified.fetch_add(size as u64, Ordering::Relaxed);
        } else {
            bad.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn read_full_at(f: &std::fs::File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn stopped() -> anyhow::Error {
    anyhow!("stopped: the benchmark failed elsewhere")
}

/// Run `op(0..n)` with `k` calls in flight (threads when k > 1); each call returns its
/// latency, and its completion is counted in `progress` and `marks`. Stops at the first error, or when `stop` is set.
fn run_sync<F>(n: u64, k: usize, progress: &AtomicU64, marks: &Recorder, stop: &AtomicBool, op: F) -> Result<Histogram>
where
    F: Fn(u64) -> Result<u64> + Sync,
{
    if k <= 1 {
        let mut h = Histogram::new();
        for i in 0..n {
            if stop.load(Ordering::Relaxed) {
                return Err(stopped());
            }
            h.record(op(i)?);
            progress.fetch_add(1, Ordering::Relaxed);
            marks.record(1);
        }
        return Ok(h);
    }
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let results: Vec<Result<Histogram>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..k.min(n.max(1) as usize))
            .map(|_| {
                s.spawn(|| {
                    let mut h = Histogram::new();
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            failed.store(true, Ordering::Relaxed);
                            return Err(stopped());
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n || failed.load(Ordering::Relaxed) {
                            return Ok(h);
                        }
                        match op(i) {
                            Ok(dt) => h.record(dt),
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                        progress.fetch_add(1, Ordering::Relaxed);
                        marks.record(1);
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a benchmark thread panicked")))).collect()
    });
    let mut all = Histogram::new();
    for r in results {
        all.merge(&r?);
    }
    Ok(all)
}

/// Run `op(0..n)` with `k` futures in flight; each returns its latency. Stops at the
/// first error, or when `stop` is set.
async fn run_async<F, Fut>(
    n: u64,
    k: usize,
    progress: &AtomicU64,
    marks: &Recorder,
    stop: &AtomicBool,
    op: F,
) -> Result<Histogram>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<u64>>,
{
    run_async_units(n, k, progress, marks, stop, |i| {
        let one = op(i);
        async move { Ok((one.await?, 1)) }
    })
    .await
}

/// [`run_async`] for units of several operations (a batch): each `op(i)` returns its
/// latency and how many operations it did, each counted with that latency.
async fn run_async_units<F, Fut>(
    n: u64,
    k: usize,
    progress: &AtomicU64,
    marks: &Recorder,
    stop: &AtomicBool,
    op: F,
) -> Result<Histogram>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(u64, u64)>>,
{
    let mut h = Histogram::new();
    let done = |h: &mut Histogram, (ns, count): (u64, u64)| {
        for _ in 0..count {
            h.record(ns);
        }
        progress.fetch_add(count, Ordering::Relaxed);
        marks.record(count);
    };
    if k <= 1 {
        for i in 0..n {
            if stop.load(Ordering::Relaxed) {
                return Err(stopped());
            }
            done(&mut h, op(i).await?);
        }
        return Ok(h);
    }
    let mut s = futures::stream::iter(0..n).map(&op).buffer_unordered(k);
    while let Some(r) = s.next().await {
        if stop.load(Ordering::Relaxed) {
            return Err(stopped());
        }
        done(&mut h, r?);
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(dir: &std::path::Path, workload: Workload, rank: u64, nprocs: u64, in_flight: usize) -> Job {
        Job {
            rank,
            nprocs,
            target: TargetSpec {
                kind: TargetKind::Posix { dir: dir.into(), role: PosixRole::Other },
                in_flight: None,
                batch: None,
                tag: None,
            },
            in_flight,
            run_dir: dir.to_str().unwrap().to_string(),
            workload,
            seed: 42,
            timeout_secs: 10,
            cache_ttl_ms: 0,
            tuning: Default::default(),
        }
    }

    fn phase(kind: PhaseKind) -> Phase {
        Phase { kind, label: kind.name().into(), drop_caches: false }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn posix_ior_shared_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let io = IoSpec {
            transfer: 1000,
            block: 3000,
            segments: 4,
            file_per_proc: false,
            random: true,
            reorder: true,
            fsync: true,
            verify: true,
            stripe_count: None,
            stripe_size: None,
            policy: None,
        };
        for k in [1usize, 3] {
            let mut ws = Vec::new();
            for rank in 0..2 {
                ws.push(Worker::setup(job(dir.path(), Workload::Io(io.clone()), rank, 2, k)).await.unwrap());
            }
            for w in &ws {
                let r = w.run(&phase(PhaseKind::Write), 0).await.unwrap();
                assert_eq!((r.ops, r.bytes), (12, 12_000));
            }
            assert_eq!(std::fs::metadata(dir.path().join("ior.shared")).unwrap().len(), 24_000);
            for w in &ws {
                let r = w.run(&phase(PhaseKind::Read), 0).await.unwrap();
                assert_eq!((r.ops, r.verified_bytes, r.verify_errors), (12, 12_000, 0));
            }
            // A corrupted byte is found.
            let f = std::fs::OpenOptions::new().write(true).open(dir.path().join("ior.shared")).unwrap();
            f.write_all_at(b"x", 4321).unwrap();
            let r0 = ws[0].run(&phase(PhaseKind::Read), 0).await.unwrap();
            let r1 = ws[1].run(&phase(PhaseKind::Read), 0).await.unwrap();
            assert_eq!(r0.verify_errors + r1.verify_errors, 1);
            std::fs::remove_file(dir.path().join("ior.shared")).unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn posix_mdtest_phases() {
        let dir = tempfile::tempdir().unwrap();
        for shared in [false, true] {
            let md = MdSpec {
                files: 50,
                shared_dir: shared,
                size: if shared { 3901 } else { 0 },
                shift: true,
                verify: true,
            };
            for rank in 0..2 {
                std::fs::create_dir_all(dir.path().join(md_dir_name(&md, rank))).unwrap();
            }
            let ws: Vec<Worker> = futures::future::join_all((0..2).map(|rank| {
                Worker::setup(job(dir.path(), Workload::Md(md.clone()), rank, 2, if shared { 4 } else { 1 }))
            }))
            .await
            .into_iter()
            .map(|w| w.unwrap())
            .collect();
            let d = dir.path().join(md_dir_name(&md, 0));
            for kind in [PhaseKind::Create, PhaseKind::Stat, PhaseKind::ReadFiles, PhaseKind::Mkdir] {
                for w in &ws {
                    let r = w.run(&phase(kind), 0).await.unwrap();
                    assert_eq!(r.ops, 50);
                    assert_eq!((r.timeline.ops, r.timeline.marks_ns.len()), (50, 50));
                    assert_eq!(r.verify_errors, 0);
                    if kind == PhaseKind::ReadFiles {
                        assert_eq!(r.verified_bytes, 50 * md.size);
                    }
                }
            }
            let count = std::fs::read_dir(&d).unwrap().count();
            assert_eq!(count, if shared { 200 } else { 100 });
            for kind in [PhaseKind::Unlink, PhaseKind::Rmdir] {
                for w in &ws {
                    w.run(&phase(kind), 0).await.unwrap();
                }
            }
            assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        }
    }

    /// The list phase: in a shared directory rank 0 lists every rank's names, each once
    /// (its operations are the entries), the others list nothing; a name the benchmark did
    /// not make, or one missing, fails the phase naming it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn posix_list_checks_every_name_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let md = MdSpec { files: 30, shared_dir: true, size: 0, shift: false, verify: false };
        let shared = dir.path().join(md_dir_name(&md, 0));
        std::fs::create_dir_all(&shared).unwrap();
        let mut ws = Vec::new();
        for rank in 0..2 {
            ws.push(Worker::setup(job(dir.path(), Workload::Md(md.clone()), rank, 2, 1)).await.unwrap());
        }
        // Before anything is made the directory must be empty, and is.
        assert_eq!(ws[0].run(&phase(PhaseKind::List), 0).await.unwrap().ops, 0);
        for w in &ws {
            w.run(&phase(PhaseKind::Create), 0).await.unwrap();
        }
        let r0 = ws[0].run(&phase(PhaseKind::List), 0).await.unwrap();
        assert_eq!((r0.ops, r0.timeline.ops), (60, 60));
        assert_eq!(r0.hist.count, 60, "the latency of each readdir(3) that returned an entry");
        assert_eq!(ws[1].run(&phase(PhaseKind::List), 0).await.unwrap().ops, 0);

        std::fs::write(shared.join("stray"), b"").unwrap();
        let e = format!("{:#}", ws[0].run(&phase(PhaseKind::List), 0).await.unwrap_err());
        assert!(e.contains("\"stray\", which the benchmark did not make there"), "{e}");
        std::fs::remove_file(shared.join("stray")).unwrap();
        std::fs::remove_file(shared.join(md_item_name(1, 7))).unwrap();
        let e = format!("{:#}", ws[0].run(&phase(PhaseKind::List), 0).await.unwrap_err());
        assert!(e.contains("misses 1 of the 60 names") && e.contains("\"f.1.7\""), "{e}");
    }
}
