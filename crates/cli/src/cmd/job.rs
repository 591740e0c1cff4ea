//! `shoal job up|down|status`: a Shoal formation for one parallel job, on the job's own
//! nodes (IKAROS): one `shoald` per node on node-local storage, found through a directory
//! on the global file system (docs/job.md). Run by every rank of `srun` or `mpirun`.

use super::{usage, Ctx};
use crate::job::formation::{self, boot_id, read_records, scan_records, write_atomic, Failed, RankRecord, Shared};
use crate::job::launcher::Launch;
use crate::job::stage::{self, Way};
use crate::local_cluster;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use shoal_client::{Client, ClientOptions};
use shoal_placement::ClusterMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum JobCmd {
    /// Every rank: start this node's server of the job's formation, wait for all, stage data in.
    Up(UpArgs),
    /// Every rank: stage results out, stop this node's server, remove its data. Without a
    /// launcher: stop every server of the formation on this node and clean up (after a crash).
    Down(DownArgs),
    /// One line per server of the formation: where it runs, whether it answers.
    Status(StatusArgs),
}

#[derive(Args)]
pub struct UpArgs {
    /// Shared directory on the global file system (every rank sees it): the formation's
    /// map, keys, pid files and logs go there.
    #[arg(long)]
    dir: PathBuf,
    /// Node-local base folder for the server's data (default: $TMPDIR, else /tmp); the
    /// data goes to LOCAL/shoal-job-<jobid>/s<rank>.
    #[arg(long)]
    local: Option<PathBuf>,
    /// Host name or address the server listens on and is reached at (default: this node's
    /// host name).
    #[arg(long)]
    bind: Option<String>,
    /// Protocol port of the server (HTTP: the next port); ranks sharing a node add 2 per
    /// local rank. Default: free ports chosen by the kernel.
    #[arg(long)]
    port: Option<u16>,
    /// Copy SRC (a file or a tree on the global file system) into the formation, at DEST
    /// (default: the root for a directory, /NAME for a file), every rank a share.
    #[arg(long, value_name = "SRC[:DEST]")]
    stage_in: Option<String>,
    /// Files larger than this are cut into pieces of this size that several ranks copy.
    #[arg(long, default_value = "64M", value_parser = crate::fmt::parse_size)]
    split_size: u64,
    /// Default stripe size of new files (e.g. 1M, 64K).
    #[arg(long, value_parser = crate::fmt::parse_size)]
    stripe_size: Option<u64>,
    /// Default stripe count of new files (0 = all servers; default: all servers).
    #[arg(long, default_value_t = 0)]
    stripe_count: u32,
    /// Default placement of data objects: "same" or "spread".
    #[arg(long, value_parser = shoal_placement::map::parse_policy)]
    policy: Option<shoal_client::PlacementPolicy>,
    /// Seconds to wait for the slowest rank at each step before giving up.
    #[arg(long, default_value_t = 300)]
    wait: u64,
}

#[derive(Args)]
pub struct DownArgs {
    /// The shared directory given to `job up`.
    #[arg(long)]
    dir: PathBuf,
    /// Copy the formation's whole tree to DST (global file system) before stopping,
    /// every rank a share; sizes are checked.
    #[arg(long, value_name = "DST")]
    stage_out: Option<PathBuf>,
    /// Files larger than this are cut into pieces of this size that several ranks copy.
    #[arg(long, default_value = "64M", value_parser = crate::fmt::parse_size)]
    split_size: u64,
    /// Seconds to wait for the slowest rank at each step before giving up.
    #[arg(long, default_value_t = 300)]
    wait: u64,
    /// Seconds a server gets to exit after SIGTERM before SIGKILL.
    #[arg(long, default_value_t = 30)]
    grace: u64,
}

#[derive(Args)]
pub struct StatusArgs {
    /// The shared directory given to `job up`.
    #[arg(long)]
    dir: PathBuf,
}

pub async fn run(ctx: &Ctx, cmd: JobCmd) -> Result<()> {
    match cmd {
        JobCmd::Up(a) => up(ctx, a).await,
        JobCmd::Down(a) => down(ctx, a).await,
        JobCmd::Status(a) => status(a),
    }
}

fn launch_or_usage(what: &str) -> Result<Launch> {
    Launch::detect()?.ok_or_else(|| {
        usage(format!(
            "shoal job {what} runs under a launcher (srun, mpirun): no rank found in the environment \
             (for a cluster on this machine alone, use `shoal cluster up`)"
        ))
    })
}

/// Parse `SRC[:DEST]`: DEST is what follows the last ':' when it is a Shoal path.
fn parse_stage_in(s: &str) -> (PathBuf, Option<String>) {
    if let Some(i) = s.find(":shoal://") {
        return (PathBuf::from(&s[..i]), Some(super::only_shoal(&s[i + 1..])));
    }
    match s.rsplit_once(':') {
        Some((src, dst)) if dst.starts_with('/') && !src.is_empty() => (PathBuf::from(src), Some(dst.to_string())),
        _ => (PathBuf::from(s), None),
    }
}

/// A client of the formation (root, through the host key in the shared directory).
fn formation_client(ctx: &Ctx, config: &Path) -> Result<Client> {
    let opts = ClientOptions { timeout: ctx.timeout, ..ClientOptions::default() };
    Client::from_config(config, opts).map_err(anyhow::Error::from).context("cannot use the formation's configuration")
}

/// Run `f`; on an error, record it for the other ranks (unless it is another rank's failure
/// already) and hand it back.
async fn recorded<T>(shared: &Shared, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let r = f.await;
    if let Err(e) = &r {
        if e.downcast_ref::<Failed>().is_none() {
            shared.fail(&format!("{e:#}"));
        }
    }
    r
}

/// Two free ports on `host` (protocol, HTTP), chosen by the kernel, still bound: the caller
/// holds them until every rank has chosen its own. Released earlier, the kernel could hand
/// the same port to another rank on the same node (CI saw rank 0's HTTP port chosen again as
/// rank 1's protocol port).
fn free_ports(host: &str) -> Result<[std::net::TcpListener; 2]> {
    let bind = || std::net::TcpListener::bind((host, 0)).with_context(|| format!("cannot bind a port on {host}"));
    Ok([bind()?, bind()?])
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

async fn up(ctx: &Ctx, a: UpArgs) -> Result<()> {
    let launch = launch_or_usage("up")?;
    std::fs::create_dir_all(&a.dir).with_context(|| format!("cannot create {}", a.dir.display()))?;
    let dir = a.dir.canonicalize().with_context(|| format!("cannot resolve {}", a.dir.display()))?;
    let shared = Shared::new(&dir, &launch, "up", Duration::from_secs(a.wait.max(1)))?;
    let mut local: Option<RankRecord> = None;
    let r = recorded(&shared, up_steps(ctx, &a, &launch, &shared, &mut local)).await;
    if let Err(e) = r {
        // Leave nothing running or stored on this node; the shared directory keeps the
        // logs and the failure for `job status` and `job down`.
        if let Some(rec) = &local {
            stop_own(&dir, rec, Duration::from_secs(10));
        }
        blocking(|| {
            shared.cleaned_up(Duration::from_secs(a.wait.clamp(1, 60)));
            Ok(())
        })
        .await?;
        return Err(named(e, launch.rank));
    }
    Ok(())
}

/// This rank's own failure names the rank; another rank's names that one already.
fn named(e: anyhow::Error, rank: u32) -> anyhow::Error {
    if e.downcast_ref::<Failed>().is_some() {
        e
    } else {
        e.context(format!("rank {rank}"))
    }
}

async fn up_steps(
    ctx: &Ctx,
    a: &UpArgs,
    launch: &Launch,
    shared: &Shared,
    mine: &mut Option<RankRecord>,
) -> Result<()> {
    let dir = &shared.dir;
    let rank = launch.rank;
    if shared.config().exists() {
        bail!("{} holds a formation already (run `shoal job down --dir {}` first)", dir.display(), dir.display());
    }
    // Node-local data folder.
    let base = match &a.local {
        Some(l) => l.clone(),
        None => std::env::var_os("TMPDIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp")),
    };
    let job_dir = base.join(format!("shoal-job-{}", launch.job.as_deref().unwrap_or("local")));
    let local_dir = job_dir.join(format!("s{rank}"));
    if local_dir.exists() && std::fs::read_dir(&local_dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("node-local folder {} is not empty (left by an earlier formation?)", local_dir.display());
    }
    std::fs::create_dir_all(&local_dir).with_context(|| format!("cannot create {}", local_dir.display()))?;
    // From here a failure removes the folder (stop_own).
    let host = a.bind.clone().unwrap_or_else(shoal_bench::mpi::hostname);
    let mut held = None;
    let (port, http) = match a.port {
        Some(p) => {
            let p = p as u32 + 2 * launch.local_rank;
            if p + 1 > u16::MAX as u32 {
                bail!("--port {} plus 2 per local rank is past 65535", a.port.unwrap_or(0));
            }
            (p as u16, p as u16 + 1)
        }
        None => {
            let [proto, web] = free_ports(&host)?;
            let ports = (proto.local_addr()?.port(), web.local_addr()?.port());
            held = Some([proto, web]);
            ports
        }
    };
    let rec = RankRecord {
        rank,
        size: launch.size,
        host: shoal_bench::mpi::hostname(),
        boot_id: boot_id(),
        addr: host_port(&host, port),
        http: host_port(&host, http),
        local_dir: local_dir.clone(),
        job_dir,
    };
    *mine = Some(rec.clone());
    write_atomic(&Shared::record_path(dir, rank), &serde_json::to_vec_pretty(&rec)?)?;
    blocking(|| shared.barrier("arrived")).await?;
    // Every rank has chosen its ports: this node's server binds them from here on.
    drop(held);

    // Rank 0 writes the map and the keys; the others wait for them.
    if rank == 0 {
        let records = read_records(dir, launch.size)?;
        let mut map = ClusterMap::local(launch.size, 0, dir);
        map.cluster.name = format!("job-{}", launch.job.as_deref().unwrap_or("local"));
        for (s, r) in map.servers.iter_mut().zip(&records) {
            if r.size != launch.size {
                bail!("rank {} says the job has {} ranks, rank 0 says {}", r.rank, r.size, launch.size);
            }
            s.addr = r.addr.clone();
            s.http = Some(r.http.clone());
            s.data_dir = Some(r.local_dir.clone());
        }
        if let Some(ss) = a.stripe_size {
            map.cluster.stripe_size = ss;
        }
        map.cluster.stripe_count = a.stripe_count;
        if let Some(p) = a.policy {
            map.cluster.policy = p;
        }
        map.validate().map_err(|m| anyhow!("invalid formation settings: {m}"))?;
        write_atomic(&shared.config(), map.to_toml().as_bytes())?;
        let loaded = ClusterMap::load(&shared.config())?;
        super::keygen::write_keys(&loaded, false, false, false)?;
    }
    blocking(|| shared.barrier("configured")).await?;
    let config = shared.config();
    let map = ClusterMap::load(&config)?;

    // This node's server: detached (its own session), so it outlives the launcher's step.
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = cpus / launch.local_size.unwrap_or(1).max(1) as usize;
    local_cluster::start_server_threads(dir, &config, rank, threads, None)?;
    wait_answers(dir, rank, &rec.addr, Duration::from_secs(60))?;
    blocking(|| shared.barrier("started")).await?;
    // Every server answers (from this node: the network between the nodes works too).
    for s in &map.servers {
        let start = Instant::now();
        while !answers(&s.addr) {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("server {} at {} does not answer from {}", s.id, s.addr, rec.host);
            }
            if let Some(f) = shared.failure() {
                return Err(anyhow!(Failed(f)));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    if let Some(spec) = &a.stage_in {
        let (src, dest) = parse_stage_in(spec);
        let src = src.canonicalize().with_context(|| format!("stage-in source {} is not there", src.display()))?;
        let dst = match dest {
            Some(d) => d,
            None if src.is_dir() => "/".into(),
            None => format!("/{}", src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        };
        let client = formation_client(ctx, &config)?;
        let way = Way::In { src: src.clone(), dst: dst.clone() };
        let s = stage::stage(&client, shared, &way, a.split_size, "stage-in").await?;
        if rank == 0 {
            say(&format!(
                "staged in {} files and {} directories, {} from {} to shoal:/{} in {:.1} s ({}/s, {} ranks)",
                s.files,
                s.dirs,
                crate::fmt::human_bytes(s.bytes),
                src.display(),
                dst,
                s.secs,
                crate::fmt::human_bytes((s.bytes as f64 / s.secs.max(1e-3)) as u64),
                launch.size
            ));
        }
    }
    blocking(|| shared.barrier("ready")).await?;
    if rank == 0 {
        println!("formation of {} servers ready ({} launcher)", launch.size, launch.kind.name());
        println!("export SHOAL_CONFIG={}", config.display());
    }
    Ok(())
}

/// One line on stderr in one write: launchers that tag the lines of each rank tag every
/// write, so a line written in pieces would come out cut up.
fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Run a blocking wait (the barriers poll the file system) off the async workers.
async fn blocking<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    tokio::task::block_in_place(f)
}

fn answers(addr: &str) -> bool {
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
}

/// Wait until this rank's server answers; an early exit is an error with its log's last line.
fn wait_answers(dir: &Path, id: u32, addr: &str, limit: Duration) -> Result<()> {
    let start = Instant::now();
    while !answers(addr) {
        if local_cluster::pid_alive(dir, id).is_none() {
            let log = std::fs::read_to_string(dir.join(format!("s{id}.log"))).unwrap_or_default();
            let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no log output");
            bail!("server {id} exited during start-up: {last}");
        }
        if start.elapsed() > limit {
            bail!("server {id} did not accept connections on {addr} within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Stop this node's server of `rec` (SIGTERM, SIGKILL after `grace`) and remove its
/// node-local data. Returns whether a server was running.
fn stop_own(dir: &Path, rec: &RankRecord, grace: Duration) -> bool {
    let id = rec.rank;
    let running = local_cluster::pid_alive(dir, id);
    if let Some(pid) = running {
        // SAFETY: kill(2) on the pid our own pid file names, checked alive just now.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        while local_cluster::pid_alive(dir, id).is_some() {
            if start.elapsed() > grace {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                std::thread::sleep(Duration::from_millis(50));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = std::fs::remove_file(dir.join(format!("s{id}.pid")));
    let _ = std::fs::remove_dir_all(&rec.local_dir);
    // The job's folder goes once the last rank of this node left it.
    let _ = std::fs::remove_dir(&rec.job_dir);
    running.is_some()
}

async fn down(ctx: &Ctx, a: DownArgs) -> Result<()> {
    let dir = a.dir.canonicalize().with_context(|| format!("no formation at {}", a.dir.display()))?;
    let grace = Duration::from_secs(a.grace);
    let Some(launch) = Launch::detect()? else {
        if a.stage_out.is_some() {
            return Err(usage("--stage-out needs every rank: run `shoal job down` under the launcher"));
        }
        return cleanup(&dir, grace);
    };
    let config = dir.join("cluster.toml");
    let map = ClusterMap::load(&config).with_context(|| format!("no formation at {}", dir.display()))?;
    if map.servers.len() != launch.size as usize {
        bail!(
            "the formation in {} has {} servers but this job has {} ranks (one per server)",
            dir.display(),
            map.servers.len(),
            launch.size
        );
    }
    let shared = Shared::new(&dir, &launch, "down", Duration::from_secs(a.wait.max(1)))?;
    let rec = read_records(&dir, launch.size)?.swap_remove(launch.rank as usize);
    if rec.boot_id != boot_id() {
        let e = anyhow!(
            "rank {}'s server runs on {}, not here ({}): start `job down` with the ranks placed as for `job up`",
            rec.rank,
            rec.host,
            shoal_bench::mpi::hostname()
        );
        shared.fail(&format!("{e}"));
        return Err(e);
    }
    if let Some(dst) = &a.stage_out {
        let r = recorded(&shared, async {
            std::fs::create_dir_all(dst).with_context(|| format!("cannot create {}", dst.display()))?;
            let dst = dst.canonicalize()?;
            let client = formation_client(ctx, &config)?;
            let way = Way::Out { src: "/".into(), dst: dst.clone() };
            let s = stage::stage(&client, &shared, &way, a.split_size, "stage-out").await?;
            if launch.rank == 0 {
                say(&format!(
                    "staged out {} files and {} directories, {} to {} in {:.1} s ({}/s, {} ranks)",
                    s.files,
                    s.dirs,
                    crate::fmt::human_bytes(s.bytes),
                    dst.display(),
                    s.secs,
                    crate::fmt::human_bytes((s.bytes as f64 / s.secs.max(1e-3)) as u64),
                    launch.size
                ));
            }
            Ok(())
        })
        .await;
        // The servers keep running when the results are not safe yet.
        r.map_err(|e| named(e, launch.rank)).context(
            "stage-out failed; the formation still runs (fix and run down again, or down without --stage-out to discard)",
        )?;
    }
    recorded(&shared, blocking(|| shared.barrier("staged-out"))).await.map_err(|e| named(e, launch.rank))?;
    stop_own(&dir, &rec, grace);
    recorded(&shared, blocking(|| shared.barrier("stopped"))).await.map_err(|e| named(e, launch.rank))?;
    // Rank 0 removes the shared files once every rank has passed the last barrier (their
    // "left" marks): a rank still polling "stopped" must not find its folder gone.
    shared.arrive("left")?;
    if launch.rank == 0 {
        blocking(|| shared.wait_for("left", 0..launch.size)).await?;
        formation::remove_formation_files(&dir)?;
        println!("formation of {} servers stopped and removed", launch.size);
    }
    Ok(())
}

/// `job down` without a launcher: stop every server of the formation that runs on this
/// node, remove their node-local data, and the shared files when no server is elsewhere.
fn cleanup(dir: &Path, grace: Duration) -> Result<()> {
    let records = scan_records(dir)?;
    let here = boot_id();
    let (mine, elsewhere): (Vec<&RankRecord>, Vec<&RankRecord>) = records.iter().partition(|r| r.boot_id == here);
    let stopped = mine.iter().filter(|r| stop_own(dir, r, grace)).count();
    if !elsewhere.is_empty() {
        let hosts: Vec<String> = elsewhere.iter().map(|r| format!("s{} on {}", r.rank, r.host)).collect();
        bail!(
            "stopped {stopped} servers here; {} run on other nodes: run `shoal job down --dir {}` there too",
            hosts.join(", "),
            dir.display()
        );
    }
    formation::remove_formation_files(dir)?;
    println!("stopped {stopped} servers; formation in {} removed", dir.display());
    Ok(())
}

fn status(a: StatusArgs) -> Result<()> {
    let dir = a.dir.canonicalize().with_context(|| format!("no formation at {}", a.dir.display()))?;
    let records = scan_records(&dir)?;
    if records.is_empty() {
        bail!("no formation at {} (no rank records)", dir.display());
    }
    let here = boot_id();
    for r in &records {
        let pid = if r.boot_id == here {
            match local_cluster::pid_alive(&dir, r.rank) {
                Some(p) => format!("pid {p}"),
                None => "not running".into(),
            }
        } else {
            "pid on another node".into()
        };
        let up = if answers(&r.addr) { "answers" } else { "does not answer" };
        println!("s{} {} {} http {} {up}, {pid}, data {}", r.rank, r.host, r.addr, r.http, r.local_dir.display());
    }
    for e in std::fs::read_dir(&dir)?.flatten() {
        let failed = e.path().join("failed");
        if let Ok(f) = std::fs::read_to_string(&failed) {
            println!("{}: {}", e.file_name().to_string_lossy(), f.trim());
        }
    }
    Ok(())
}
