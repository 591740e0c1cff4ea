//! `shoal bench io|md` under `mpirun`: every MPI rank is one benchmark process. No MPI
//! library is linked; the ranks find each other through a file and TCP:
//!
//! 1. Rank and size come from the launcher's environment ([`MpiEnv::detect`]).
//! 2. Rank 0 listens on a TCP port and writes its address, the job's id and a fresh run id
//!    to the rendezvous file ([`Rendezvous`]), atomically (write, then rename).
//! 3. The other ranks poll for that file, connect, and say `hello {rank, size, run, job,
//!    host, pid, boot id}`; rank 0 answers `welcome` or `refuse REASON`. A file from an
//!    earlier run names a listener that is gone (the connection is refused) or another run
//!    id (refused): the rank keeps polling until the file is fresh or its time is up.
//! 4. Rank 0 removes the file once every rank has arrived, runs its own rank's work on a
//!    thread of its own process, measures the clock offsets, and drives the phases over the
//!    connections with the same lock-step code as spawned workers ([`Ranks`]).
//!
//! A rank that does not arrive within the rendezvous timeout, or whose connection drops,
//! fails the run with an error naming it; a rank whose connection to rank 0 drops stops
//! with an error too ([`crate::link::lost_rank0`]).

use crate::link::{tcp_inbox, tune_tcp, MpiInfo, Outbox, Ranks};
use crate::spec::{TargetKind, TargetSpec};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// This process's place in an MPI job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpiEnv {
    pub rank: u64,
    pub size: u64,
    /// The launcher's id of the job (PMIx namespace or Open MPI job id), when it gives one:
    /// names the rendezvous file and is checked in the handshake.
    pub job: Option<String>,
    /// How many ranks of the job run on this host, when the launcher says: equal to `size`
    /// means every rank is here, and rank 0 listens on loopback.
    pub local_size: Option<u64>,
}

/// (rank variable, size variable) pairs, in the order they are tried: Open MPI, then
/// MPICH/Intel MPI (PMI), then PMIx launchers that also export a size.
const RANK_VARS: [(&str, &str); 3] =
    [("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"), ("PMIX_RANK", "PMIX_SIZE")];
const JOB_VARS: [&str; 2] = ["PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"];
/// The number of the job's ranks on this host: Open MPI, MPICH/Hydra, PMIx.
const LOCAL_SIZE_VARS: [&str; 3] = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE"];
/// Where rank 0 listens when `--rendezvous-addr` is not given (same syntax).
pub const ADDR_VAR: &str = "SHOAL_BENCH_ADDR";

impl MpiEnv {
    /// The MPI job this process belongs to, from its environment; `None` when not started
    /// by an MPI launcher.
    pub fn detect() -> Result<Option<MpiEnv>> {
        MpiEnv::from_vars(|k| std::env::var(k).ok())
    }

    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<MpiEnv>> {
        for (rv, sv) in RANK_VARS {
            let (Some(r), Some(s)) = (get(rv), get(sv)) else { continue };
            let rank: u64 = r.trim().parse().map_err(|_| anyhow!("{rv}={r:?} is not a rank"))?;
            let size: u64 = s.trim().parse().map_err(|_| anyhow!("{sv}={s:?} is not a number of ranks"))?;
            if size == 0 || rank >= size {
                bail!("{rv}={rank} and {sv}={size} do not describe a rank of a job");
            }
            let job = JOB_VARS.iter().find_map(|v| get(v)).map(|j| j.trim().to_string()).filter(|j| !j.is_empty());
            // A value that is not a number is as good as none: the host question stays open.
            let local_size = LOCAL_SIZE_VARS.iter().find_map(|v| get(v)).and_then(|n| n.trim().parse().ok());
            return Ok(Some(MpiEnv { rank, size, job, local_size }));
        }
        Ok(None)
    }

    /// The launcher says that every rank of the job runs on this host.
    pub fn one_host(&self) -> bool {
        self.local_size == Some(self.size)
    }
}

/// What the rendezvous file says (one JSON line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rendezvous {
    pub magic: String,
    /// Fresh for every run of rank 0: a rank must say it back.
    pub run: String,
    pub job: Option<String>,
    pub size: u64,
    /// Where rank 0 listens.
    pub addr: String,
    pub host: String,
    pub pid: u32,
}

const MAGIC: &str = "shoal-bench-rendezvous/1";

/// A rank's first line on its connection.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Hello {
    rank: u64,
    size: u64,
    run: String,
    job: Option<String>,
    host: String,
    pid: u32,
    /// /proc/sys/kernel/random/boot_id: equal boot ids = one kernel = one CLOCK_MONOTONIC.
    boot_id: Option<String>,
}

/// The default rendezvous file: `.shoal-bench-rendezvous[.JOB]` in the directory of the
/// first native target's cluster configuration (every rank reads that file, so its
/// directory is the one place all ranks are known to see), else in the first target's
/// directory (POSIX targets: the ranks work in it).
pub fn default_rendezvous_file(targets: &[TargetSpec], job: Option<&str>) -> Result<PathBuf> {
    let dir = targets
        .iter()
        .find_map(|t| match &t.kind {
            TargetKind::Native { config, .. } => Some(config.parent().map(Path::to_path_buf).unwrap_or_default()),
            _ => None,
        })
        .or_else(|| {
            targets.first().and_then(|t| match &t.kind {
                TargetKind::Posix { dir, .. } => Some(dir.clone()),
                _ => None,
            })
        })
        .ok_or_else(|| anyhow!("no target to put the rendezvous file next to: pass --rendezvous FILE"))?;
    let dir = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir };
    let name = match job {
        Some(j) => format!(
            ".shoal-bench-rendezvous.{}",
            j.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect::<String>()
        ),
        None => ".shoal-bench-rendezvous".to_string(),
    };
    Ok(absolute(&dir.join(name)))
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
    }
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "?".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The address rank 0 publishes for itself when nothing names one (and when it was told to
/// listen on every interface): loopback when the launcher says every rank is on this host
/// (nothing leaves the machine); otherwise the first address other than loopback that this
/// host's name resolves to, the name the other hosts know it by. Without such an address,
/// ranks on other hosts could not connect: an error asking for `--rendezvous-addr`, unless
/// the launcher did not say where the ranks are (ranks started by hand), where loopback is
/// the one address that serves the ranks of this host.
pub fn own_ip(env: &MpiEnv) -> Result<IpAddr> {
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    if env.one_host() {
        return Ok(loopback);
    }
    let host = hostname();
    let found = (host.as_str(), 0u16).to_socket_addrs().ok().and_then(|mut a| a.find(|a| !a.ip().is_loopback()));
    match (found, env.local_size) {
        (Some(a), _) => Ok(a.ip()),
        (None, None) => Ok(loopback),
        (None, Some(here)) => bail!(
            "the ranks run on several hosts ({here} of {} on {host}) and the host name {host:?} resolves to no \
             address but loopback: say where rank 0 listens with --rendezvous-addr ADDR or {ADDR_VAR}=ADDR",
            env.size
        ),
    }
}

/// `--rendezvous-addr`: IP, IP:PORT, HOST or HOST:PORT ([v6]:PORT for IPv6). No port: any
/// free one.
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = s.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 0));
    }
    let resolved = if s.contains(':') { s.to_socket_addrs() } else { (s, 0u16).to_socket_addrs() };
    resolved
        .with_context(|| format!("cannot resolve the rendezvous address {s:?}"))?
        .next()
        .ok_or_else(|| anyhow!("the rendezvous address {s:?} resolves to nothing"))
}

fn random_run_id() -> String {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    format!("{:016x}{:08x}", rng.gen::<u64>(), std::process::id())
}

/// Write the rendezvous file atomically (a temporary file in the same directory, renamed).
pub fn write_rendezvous(path: &Path, rv: &Rendezvous) -> Result<()> {
    let tmp = path.with_file_name(format!(
        "{}.tmp.{}",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        std::process::id()
    ));
    let line = serde_json::to_string(rv)? + "\n";
    std::fs::write(&tmp, line).with_context(|| {
        format!("cannot write the rendezvous file {} (choose another with --rendezvous)", tmp.display())
    })?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write the rendezvous file {}", path.display()))?;
    Ok(())
}

/// The rendezvous file, if there is a complete one.
pub fn read_rendezvous(path: &Path) -> Result<Option<Rendezvous>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(anyhow!("cannot read {}: {e}", path.display())),
    };
    let rv: Rendezvous =
        serde_json::from_str(text.trim()).with_context(|| format!("{} is not a rendezvous file", path.display()))?;
    if rv.magic != MAGIC {
        bail!("{} is not a rendezvous file of this version ({:?})", path.display(), rv.magic);
    }
    Ok(Some(rv))
}

/// Removes the rendezvous file when rank 0 is done with it (or fails).
struct RemoveOnDrop(PathBuf, String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        // Only our own file: a later run may already have written its own there.
        if matches!(read_rendezvous(&self.0), Ok(Some(rv)) if rv.run == self.1) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// "rank 2" / "ranks 2, 5, 7".
pub fn fmt_ranks(r: &[u64]) -> String {
    let list = r.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ");
    if r.len() == 1 {
        format!("rank {list}")
    } else {
        format!("ranks {list}")
    }
}

/// Bytes up to a newline, one at a time, so that nothing after the line is consumed
/// (rank 0 may send its first `ping` right behind `welcome`).
async fn read_line_async(s: &mut tokio::net::TcpStream, max: usize) -> Result<String> {
    let mut buf = Vec::new();
    loop {
        let b = s.read_u8().await.context("connection closed during the handshake")?;
        if b == b'\n' {
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        buf.push(b);
        if buf.len() > max {
            bail!("handshake line too long");
        }
    }
}

fn read_line_sync(s: &mut TcpStream, max: usize) -> std::io::Result<String> {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    loop {
        if s.read(&mut b)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed during the handshake",
            ));
        }
        if b[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        buf.push(b[0]);
        if buf.len() > max {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "handshake line too long"));
        }
    }
}

/// How rank 0 places the other ranks' clocks: `Auto` trusts a shared kernel clock (same
/// boot id) and measures only the others; `Measure` measures every remote rank (set
/// `SHOAL_BENCH_CLOCK=measure`, for checking the measurement on one machine).
fn measure_all() -> bool {
    std::env::var("SHOAL_BENCH_CLOCK").map(|v| v == "measure").unwrap_or(false)
}

/// Rank 0: listen, publish the rendezvous file, wait for every other rank, start rank 0's
/// own worker, measure the clocks. `timeout` bounds the wait for the ranks.
/// `addr` is `--rendezvous-addr`; without it, `SHOAL_BENCH_ADDR`, then [`own_ip`].
pub async fn gather(env: &MpiEnv, file: &Path, addr: Option<&str>, timeout: Duration) -> Result<Ranks> {
    let named = addr.map(str::to_string).or_else(|| std::env::var(ADDR_VAR).ok().filter(|a| !a.trim().is_empty()));
    let want = match &named {
        Some(a) => parse_listen_addr(a)?,
        None => SocketAddr::new(own_ip(env)?, 0),
    };
    let listener = tokio::net::TcpListener::bind(want)
        .await
        .with_context(|| format!("cannot listen on {want} for the other ranks (choose with --rendezvous-addr)"))?;
    let mut listen = listener.local_addr()?;
    if listen.ip().is_unspecified() {
        listen.set_ip(own_ip(env)?);
    }
    let run = random_run_id();
    let host = hostname();
    let rv = Rendezvous {
        magic: MAGIC.into(),
        run: run.clone(),
        job: env.job.clone(),
        size: env.size,
        addr: listen.to_string(),
        host: host.clone(),
        pid: std::process::id(),
    };
    let _ = std::fs::remove_file(file);
    write_rendezvous(file, &rv)?;
    let guard = RemoveOnDrop(file.to_path_buf(), run.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    let n = env.size as usize;
    let mut arrived: Vec<Option<(tokio::net::TcpStream, Hello)>> = (0..n).map(|_| None).collect();
    let missing = |a: &Vec<Option<_>>| (1..n).filter(|&r| a[r].is_none()).map(|r| r as u64).collect::<Vec<u64>>();
    while !missing(&arrived).is_empty() {
        let accepted = match tokio::time::timeout_at(deadline, listener.accept()).await {
            Ok(a) => a,
            Err(_) => bail!(
                "{} did not arrive within {} s (rank 0 on {host} listened on {listen} and wrote {}; the ranks read it, connect and say hello)",
                fmt_ranks(&missing(&arrived)),
                timeout.as_secs(),
                file.display()
            ),
        };
        let (mut stream, peer) = accepted.context("cannot accept a rank's connection")?;
        // A handshake gets a few seconds; a connection that says nothing is dropped.
        let hello = match tokio::time::timeout(Duration::from_secs(5), read_line_async(&mut stream, 4096)).await {
            Ok(Ok(l)) => l,
            _ => continue,
        };
        let Some(hello) = hello.strip_prefix("hello ").and_then(|h| serde_json::from_str::<Hello>(h).ok()) else {
            let _ = stream.write_all(b"refuse not a shoal bench rank\n").await;
            continue;
        };
        let refuse = if hello.run != run {
            Some(format!("stale rendezvous: run {} is over, this is run {run}", hello.run))
        } else if hello.size != env.size {
            Some(format!("rank {} belongs to a job of {} ranks, this one has {}", hello.rank, hello.size, env.size))
        } else if hello.rank == 0 || hello.rank >= env.size {
            Some(format!("rank {} is not a worker rank of a job of {} ranks", hello.rank, env.size))
        } else if matches!((&hello.job, &env.job), (Some(a), Some(b)) if a != b) {
            Some(format!("rank {} belongs to job {:?}, this is job {:?}", hello.rank, hello.job, env.job))
        } else {
            None
        };
        if let Some(why) = refuse {
            let _ = stream.write_all(format!("refuse {why}\n").as_bytes()).await;
            continue;
        }
        let r = hello.rank as usize;
        if let Some((_, first)) = &arrived[r] {
            let msg = format!(
                "rank {r} arrived twice: {}:{} and {}:{} ({peer})",
                first.host, first.pid, hello.host, hello.pid
            );
            let _ = stream.write_all(format!("refuse {msg}\n").as_bytes()).await;
            bail!("{msg}");
        }
        stream.write_all(b"welcome\n").await.with_context(|| format!("rank {r} left during the handshake"))?;
        tune_tcp(&stream);
        arrived[r] = Some((stream, hello));
    }
    drop(guard);

    let mut ranks = Ranks::for_mpi(n);
    let my_boot = boot_id();
    let mut info = MpiInfo {
        ranks: env.size,
        hosts: vec![format!("{host}:{}", std::process::id())],
        listen: listen.to_string(),
        rendezvous_file: file.display().to_string(),
        clock_offset_ns: vec![0; n],
        clock: vec!["rank 0".into(); n],
        rtt_us: vec![0.0; n],
    };
    let mut remote_same_boot = vec![false; n];
    for (r, a) in arrived.into_iter().enumerate().skip(1) {
        let (stream, hello) = a.expect("every rank arrived");
        let name = format!("rank {r} ({}:{})", hello.host, hello.pid);
        info.hosts.push(format!("{}:{}", hello.host, hello.pid));
        remote_same_boot[r] = my_boot.is_some() && hello.boot_id == my_boot;
        ranks.add_tcp(r, stream, name);
    }
    ranks.add_local(0, format!("rank 0 ({host}:{})", std::process::id()))?;
    // Clocks: ranks on this kernel share CLOCK_MONOTONIC (offset 0, exact); the others are
    // placed by ping-pong. The ping-pong runs for every remote rank anyway (it also gives
    // the round trip, which sets how far ahead a phase's start is announced).
    let force = measure_all();
    for (r, &same_boot) in remote_same_boot.iter().enumerate().skip(1) {
        let (offset, rtt) = ranks.ping_pong(r, 16).await.context("measuring the clock offsets")?;
        info.rtt_us[r] = rtt as f64 / 1000.0;
        if same_boot && !force {
            info.clock[r] = "same boot".into();
        } else {
            ranks.set_offset(r, offset);
            info.clock_offset_ns[r] = offset;
            info.clock[r] = "ping-pong".into();
        }
    }
    ranks.mpi = Some(info);
    Ok(ranks)
}

/// A rank other than 0: find rank 0 through the rendezvous file (waiting up to `timeout`
/// for it), connect, and serve jobs until rank 0 says `exit`. Prints nothing on success.
/// Blocking: call it from a thread that may block.
pub fn serve_rank(env: &MpiEnv, file: &Path, timeout: Duration) -> Result<()> {
    let stream = join(env, file, timeout)?;
    tune_tcp(&stream);
    let inbox = tcp_inbox(stream.try_clone().context("cannot use the connection to rank 0")?, env.rank);
    let out = Outbox::Tcp { stream: Arc::new(Mutex::new(stream)), rank: env.rank };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start a runtime")?;
    rt.block_on(crate::worker::session(inbox, out, Arc::new(AtomicBool::new(false))))
        .with_context(|| format!("rank {}", env.rank))
}

enum Attempt {
    Welcome(TcpStream),
    /// Rank 0 refused for a reason that waiting will not cure.
    Fatal(String),
    /// Not yet: why (kept for the error if time runs out).
    Retry(String),
}

/// Poll for the rendezvous file and say hello to the rank 0 it names.
fn join(env: &MpiEnv, file: &Path, timeout: Duration) -> Result<TcpStream> {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut why = format!("{} does not exist", file.display());
    loop {
        let attempt = match read_rendezvous(file) {
            Ok(None) => Attempt::Retry(format!("{} does not exist", file.display())),
            Err(e) => Attempt::Retry(format!("{e:#}")),
            Ok(Some(rv)) if rv.size != env.size => Attempt::Retry(format!(
                "{} is for a job of {} ranks, this one has {}",
                file.display(),
                rv.size,
                env.size
            )),
            Ok(Some(rv)) if matches!((&rv.job, &env.job), (Some(a), Some(b)) if a != b) => {
                Attempt::Retry(format!("{} belongs to job {:?}, this is job {:?}", file.display(), rv.job, env.job))
            }
            Ok(Some(rv)) => hello(env, &rv, deadline),
        };
        match attempt {
            Attempt::Welcome(s) => return Ok(s),
            Attempt::Fatal(msg) => bail!("rank {}: rank 0 refused it: {msg}", env.rank),
            Attempt::Retry(w) => why = w,
        }
        if Instant::now() >= deadline {
            bail!(
                "rank {}: could not join rank 0 within {} s through the rendezvous file {}: {why}",
                env.rank,
                timeout.as_secs(),
                file.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn hello(env: &MpiEnv, rv: &Rendezvous, deadline: Instant) -> Attempt {
    let addr: SocketAddr = match rv.addr.parse() {
        Ok(a) => a,
        Err(_) => return Attempt::Retry(format!("bad address {:?} in the rendezvous file", rv.addr)),
    };
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    let mut s = match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
        Ok(s) => s,
        Err(e) => return Attempt::Retry(format!("cannot connect to rank 0 at {addr} ({}:{}): {e}", rv.host, rv.pid)),
    };
    let h = Hello {
        rank: env.rank,
        size: env.size,
        run: rv.run.clone(),
        job: env.job.clone(),
        host: hostname(),
        pid: std::process::id(),
        boot_id: boot_id(),
    };
    let line = format!("hello {}\n", serde_json::to_string(&h).expect("plain struct"));
    let _ = s.set_read_timeout(Some(left.min(Duration::from_secs(10))));
    let reply = s.write_all(line.as_bytes()).and_then(|_| read_line_sync(&mut s, 4096));
    match reply {
        Ok(l) if l == "welcome" => {
            let _ = s.set_read_timeout(None);
            Attempt::Welcome(s)
        }
        Ok(l) => match l.strip_prefix("refuse ") {
            // A stale file: rank 0 of this run has not written its own yet.
            Some(why) if why.starts_with("stale rendezvous") => Attempt::Retry(why.to_string()),
            Some(why) => Attempt::Fatal(why.to_string()),
            None => Attempt::Retry(format!("{addr} answered {l:?}, not as rank 0 of shoal bench")),
        },
        Err(e) => Attempt::Retry(format!("no answer from rank 0 at {addr}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(vars: &[(&str, &str)]) -> Result<Option<MpiEnv>> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        MpiEnv::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn detects_ranks_from_the_launchers_variables() {
        assert_eq!(env_of(&[]).unwrap(), None);
        // Open MPI (PMIX_RANK without a size is ignored; the namespace names the job).
        let e = env_of(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("PMIX_RANK", "2"),
            ("PMIX_NAMESPACE", "1414856705"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(e, MpiEnv { rank: 2, size: 3, job: Some("1414856705".into()), local_size: Some(3) });
        assert!(e.one_host());
        // MPICH / Hydra: 2 of the 4 ranks on this host.
        let e = env_of(&[("PMI_RANK", "0"), ("PMI_SIZE", "4"), ("MPI_LOCALNRANKS", "2")]).unwrap().unwrap();
        assert_eq!((e.rank, e.size, e.job.clone(), e.local_size), (0, 4, None, Some(2)));
        assert!(!e.one_host());
        // No word on the hosts: not known to be one.
        let e = env_of(&[("PMIX_RANK", "1"), ("PMIX_SIZE", "2")]).unwrap().unwrap();
        assert_eq!(e.local_size, None);
        assert!(!e.one_host());
        assert!(env_of(&[("PMI_RANK", "4"), ("PMI_SIZE", "4")]).is_err());
        assert!(env_of(&[("PMI_RANK", "x"), ("PMI_SIZE", "4")]).is_err());
        assert_eq!(env_of(&[("PMI_RANK", "1")]).unwrap(), None);
    }

    #[test]
    fn rendezvous_file_round_trip_and_default_place() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("rv");
        assert_eq!(read_rendezvous(&f).unwrap(), None);
        let rv = Rendezvous {
            magic: MAGIC.into(),
            run: random_run_id(),
            job: Some("7".into()),
            size: 3,
            addr: "127.0.0.1:5".into(),
            host: "h".into(),
            pid: 1,
        };
        write_rendezvous(&f, &rv).unwrap();
        assert_eq!(read_rendezvous(&f).unwrap(), Some(rv.clone()));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
        std::fs::write(&f, "{\"magic\":\"x\"").unwrap();
        assert!(read_rendezvous(&f).is_err());
        // Next to the cluster configuration of a native target, else in a POSIX target's directory.
        let cfg = PathBuf::from("/etc/shoal/cluster.toml");
        let native = TargetSpec::parse("native", Some(&cfg), "/b").unwrap();
        let local = TargetSpec::parse("posix:/data/x", None, "/b").unwrap();
        assert_eq!(
            default_rendezvous_file(&[local.clone(), native], Some("12/3")).unwrap(),
            PathBuf::from("/etc/shoal/.shoal-bench-rendezvous.12_3")
        );
        assert_eq!(default_rendezvous_file(&[local], None).unwrap(), PathBuf::from("/data/x/.shoal-bench-rendezvous"));
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen_addr("10.1.2.3").unwrap(), "10.1.2.3:0".parse().unwrap());
        assert_eq!(parse_listen_addr("10.1.2.3:4000").unwrap(), "10.1.2.3:4000".parse().unwrap());
        assert_eq!(parse_listen_addr("[::1]:7").unwrap(), "[::1]:7".parse().unwrap());
        assert_eq!(parse_listen_addr("::1").unwrap(), "[::1]:0".parse().unwrap());
        assert!(parse_listen_addr("localhost").unwrap().ip().is_loopback());
        // Every rank on this host: loopback, whatever this host's other addresses are.
        let here = MpiEnv { rank: 0, size: 4, job: None, local_size: Some(4) };
        assert_eq!(own_ip(&here).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(fmt_ranks(&[2]), "rank 2");
        assert_eq!(fmt_ranks(&[2, 5]), "ranks 2, 5");
    }

    /// Rank 0 and two ranks in threads of this test, over loopback: every rank arrives, the
    /// clocks are measured (one kernel: each offset within half its round trip), the ranks
    /// answer, and `exit` ends them. Then a job of 3 ranks where rank 2 never comes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rendezvous_over_tcp() {
        std::env::set_var("SHOAL_BENCH_CLOCK", "measure");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rv");
        let job = Some(format!("t{}", std::process::id()));
        let mut joins = Vec::new();
        for rank in 1..3 {
            let env = MpiEnv { rank, size: 3, job: job.clone(), local_size: Some(3) };
            let f = file.clone();
            joins.push(std::thread::spawn(move || serve_rank(&env, &f, Duration::from_secs(20))));
        }
        let env0 = MpiEnv { rank: 0, size: 3, job: job.clone(), local_size: Some(3) };
        let mut ranks = gather(&env0, &file, Some("127.0.0.1"), Duration::from_secs(20)).await.unwrap();
        assert!(!file.exists(), "the rendezvous file is removed once everyone is there");
        let info = ranks.mpi.clone().unwrap();
        assert_eq!(info.hosts.len(), 3);
        for r in 1..3 {
            assert_eq!(info.clock[r], "ping-pong");
            let rtt_ns = (info.rtt_us[r] * 1000.0) as i64;
            assert!(info.clock_offset_ns[r].abs() <= rtt_ns / 2 + 1, "{info:?}");
        }
        let (off, rtt) = ranks.ping_pong(1, 3).await.unwrap();
        assert!(off.unsigned_abs() <= rtt / 2 + 1, "{off} {rtt}");
        ranks.shutdown().await;
        for j in joins {
            j.join().unwrap().unwrap();
        }
        std::env::remove_var("SHOAL_BENCH_CLOCK");

        // Rank 2 never arrives: rank 0 names it (and rank 1 too, on a machine so busy that
        // rank 1 was not there in time either).
        let env1 = MpiEnv { rank: 1, size: 3, job: job.clone(), local_size: Some(3) };
        let f = file.clone();
        let t = std::thread::spawn(move || join(&env1, &f, Duration::from_secs(5)).map(|_| ()));
        let err = format!("{:#}", gather(&env0, &file, Some("127.0.0.1"), Duration::from_secs(2)).await.err().unwrap());
        assert!(err.contains("rank 2 did not arrive") || err.contains("ranks 1, 2 did not arrive"), "{err}");
        let _ = t.join().unwrap();
        // A rank whose rank 0 never comes gives up, naming the file.
        let env2 = MpiEnv { rank: 2, size: 3, job, local_size: Some(3) };
        let err = join(&env2, &file, Duration::from_millis(300)).err().unwrap();
        assert!(format!("{err:#}").contains("could not join rank 0"), "{err:#}");
    }
}
