//! Starting and stopping a cluster of `shoald` processes on this machine (loopback), as
//! `shoal cluster up/down` and `shoal demo` do. Each server runs as its own process, in its
//! own session, with its log in `DIR/s<id>.log` and its pid in `DIR/s<id>.pid`.

use anyhow::{bail, Context, Result};
use shoal_placement::ClusterMap;
use std::net::TcpStream;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where `shoald` is: next to this executable (cargo puts both in one folder), else $PATH.
pub fn shoald_binary() -> PathBuf {
    if let Ok(p) = std::env::var("SHOALD") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        let sib = exe.with_file_name("shoald");
        if sib.exists() {
            return sib;
        }
        if let Some(parent) = exe.parent().and_then(Path::parent) {
            let up = parent.join("shoald");
            if up.exists() {
                return up;
            }
        }
    }
    PathBuf::from("shoald")
}

/// Ask the kernel for `n` free loopback ports.
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port"))
        .collect::<Result<_>>()?;
    Ok(listeners.iter().map(|l| l.local_addr().map(|a| a.port()).unwrap_or(0)).collect())
}

pub struct UpOptions {
    pub servers: u32,
    pub dir: PathBuf,
    pub base_port: Option<u16>,
    pub stripe_size: Option<u64>,
    pub stripe_count: Option<u32>,
    pub policy: Option<shoal_client::PlacementPolicy>,
    /// A new cluster uses TLS (`[security] tls`).
    pub tls: bool,
    /// Servers to slow on purpose: (id, MB/s) passed as `shoald --throttle` (a tool for
    /// benchmarks of load-aware placement).
    pub throttle: Vec<(u32, f64)>,
    /// Copies of every server's stores (`[cluster] replicas`), when not the default 1.
    pub replicas: Option<u8>,
    /// Slots in all, when more than the servers: the others live on the servers in turn, so
    /// that servers added later can take whole slots (docs/membership.md, "Moving slots").
    pub slots: Option<u32>,
}

/// Parse `ID=MBPS` (`shoal cluster up --throttle 3=25`).
pub fn parse_throttle(s: &str) -> std::result::Result<(u32, f64), String> {
    let bad = || format!("{s:?} is not ID=MB_PER_S (a server id and a positive number of MB/s, e.g. 3=25)");
    let (id, mb) = s.split_once('=').ok_or_else(bad)?;
    let id: u32 = id.trim().parse().map_err(|_| bad())?;
    let mb: f64 = mb.trim().parse().map_err(|_| bad())?;
    if !(mb.is_finite() && mb > 0.0) {
        return Err(bad());
    }
    Ok((id, mb))
}

/// Write `DIR/cluster.toml` (unless one exists: then restart that cluster) and start every
/// server in it; returns the config path once every server accepts connections.
pub fn up(opts: &UpOptions) -> Result<PathBuf> {
    std::fs::create_dir_all(&opts.dir).with_context(|| format!("cannot create {}", opts.dir.display()))?;
    let dir = opts.dir.canonicalize().with_context(|| format!("cannot resolve {}", opts.dir.display()))?;
    let config = dir.join("cluster.toml");
    let map = if config.exists() {
        ClusterMap::load(&config)?
    } else {
        if opts.servers == 0 {
            bail!("--servers must be at least 1");
        }
        let mut map = ClusterMap::local(opts.servers, 7400, &dir);
        // Each server's protocol port, then each server's HTTP port.
        let n = opts.servers as usize;
        let ports = match opts.base_port {
            Some(p) => (0..2 * n).map(|i| p + i as u16).collect(),
            None => free_ports(2 * n)?,
        };
        for (i, s) in map.servers.iter_mut().enumerate() {
            s.addr = format!("127.0.0.1:{}", ports[i]);
            s.http = Some(format!("127.0.0.1:{}", ports[n + i]));
        }
        if let Some(ss) = opts.stripe_size {
            map.cluster.stripe_size = ss;
        }
        if let Some(c) = opts.stripe_count {
            map.cluster.stripe_count = c;
        }
        if let Some(p) = opts.policy {
            map.cluster.policy = p;
        }
        if let Some(r) = opts.replicas {
            map.cluster.replicas = r;
        }
        if let Some(slots) = opts.slots {
            map.add_spare_slots(slots);
        }
        map.security.tls = opts.tls;
        map.validate().map_err(|m| anyhow::anyhow!("invalid cluster settings: {m}"))?;
        std::fs::write(&config, map.to_toml()).with_context(|| format!("cannot write {}", config.display()))?;
        ClusterMap::load(&config)?
    };
    if map.security.auth == shoal_placement::map::AuthMode::Keys && !map.security.cluster_key.exists() {
        crate::cmd::keygen::write_keys(&map, false, false, false)?;
    }
    if map.security.tls && !(map.security.tls_cert.exists() && map.security.tls_key.exists()) {
        shoal_rpc::tls_certs::make_certs(&map, false).map_err(anyhow::Error::msg)?;
    }
    // Processes only: the other slots live on them.
    for s in map.processes() {
        if pid_alive(&dir, s.id).is_some() {
            continue;
        }
        let throttle = opts.throttle.iter().find(|(id, _)| *id == s.id).map(|&(_, mb)| mb);
        start_server(&dir, &config, s.id, throttle)?;
    }
    wait_ready(&dir, &map, Duration::from_secs(30))?;
    start_identityd(&dir, &config, &map)?;
    Ok(config)
}

/// Pid file of the cluster's identity helper.
const IDENTITYD_PID: &str = "identityd.pid";

/// Start the identity helper for this cluster's host key (root only: it must read the key
/// and is what unprivileged clients on this machine prove their uid through), unless one
/// runs already. Without root, a note says why there is none.
fn start_identityd(dir: &Path, config: &Path, map: &ClusterMap) -> Result<()> {
    use std::os::unix::process::CommandExt;
    if map.security.auth == shoal_placement::map::AuthMode::None || pid_file_alive(&dir.join(IDENTITYD_PID)).is_some() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "shoal: note: not root, so no identity helper was started: processes that cannot read {} cannot use \
             this cluster (run `shoal identityd` as root for them)",
            map.security.host_key.display()
        );
        return Ok(());
    }
    // Logs name paths and users: for the cluster's owner only.
    let log = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(dir.join("identityd.log"))?;
    let exe = std::env::current_exe().context("cannot find the shoal executable")?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("--config").arg(config).arg("identityd");
    cmd.stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // Own session, as the servers: a Ctrl-C in the terminal must not stop it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("cannot start {} identityd", exe.display()))?;
    std::fs::write(dir.join(IDENTITYD_PID), child.id().to_string())?;
    std::mem::forget(child);
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(&map.security.identity_socket).is_err() {
        if pid_file_alive(&dir.join(IDENTITYD_PID)).is_none() || start.elapsed() > Duration::from_secs(10) {
            let log = std::fs::read_to_string(dir.join("identityd.log")).unwrap_or_default();
            let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no log output");
            bail!("the identity helper did not start: {last}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Stop the cluster's identity helper if it runs.
fn stop_identityd(dir: &Path, grace: Duration) {
    let file = dir.join(IDENTITYD_PID);
    let Some(pid) = pid_file_alive(&file) else { return };
    if signal(pid, libc::SIGTERM).is_err() {
        // Another user's helper: theirs to stop (the servers' report says so already).
        return;
    }
    let start = Instant::now();
    while pid_file_alive(&file).is_some() {
        if start.elapsed() > grace {
            let _ = signal(pid, libc::SIGKILL);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(file);
}

/// Request threads for each server of a cluster that shares this machine: the CPUs divided
/// among the servers, at least one. With more servers than CPUs, a single-threaded runtime
/// per server avoids waking threads that only compete for the same cores. Measured with
/// `shoal bench md` (4 servers, 2 cores, servers' own CPU per operation): with 16 creates in
/// flight per process 25–30 µs instead of 45–50 µs per create; with one in flight about the
/// same (within the noise of a shared machine).
fn threads_per_server(config: &Path) -> usize {
    let servers = ClusterMap::load(config).map(|m| m.processes().count()).unwrap_or(1).max(1);
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (cpus / servers).max(1)
}

/// Start server `id` of the cluster in `dir` as a detached process.
/// `throttle`: its data reads and writes limited to that many MB/s (`shoald --throttle`).
pub fn start_server(dir: &Path, config: &Path, id: u32, throttle: Option<f64>) -> Result<u32> {
    start_server_threads(dir, config, id, threads_per_server(config), throttle)
}

/// [`start_server`] with `threads` request threads (a formation of `shoal job` has a node
/// per server, so the share of this machine's CPUs is not the map's business).
pub fn start_server_threads(dir: &Path, config: &Path, id: u32, threads: usize, throttle: Option<f64>) -> Result<u32> {
    use std::os::unix::process::CommandExt;
    // Logs name paths and users: for the cluster's owner only.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(dir.join(format!("s{id}.log")))
        .with_context(|| format!("cannot open the log of server {id} in {}", dir.display()))?;
    // One made by an older version may be 0644.
    use std::os::unix::fs::PermissionsExt;
    let _ = log.set_permissions(std::fs::Permissions::from_mode(0o600));
    let bin = shoald_binary();
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("--config").arg(config).arg("--id").arg(id.to_string());
    cmd.arg("--threads").arg(threads.max(1).to_string());
    if let Some(mb) = throttle {
        cmd.arg("--throttle").arg(mb.to_string());
    }
    cmd.stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // Own session: a Ctrl-C in the terminal that ran `cluster up` must not stop the servers.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("cannot start {} (is it built?)", bin.display()))?;
    let pid = child.id();
    std::fs::write(dir.join(format!("s{id}.pid")), pid.to_string())?;
    // The child is reaped by init once we exit; we never wait on it here.
    std::mem::forget(child);
    Ok(pid)
}

fn wait_ready(dir: &Path, map: &ClusterMap, limit: Duration) -> Result<()> {
    let start = Instant::now();
    for s in map.processes() {
        loop {
            if TcpStream::connect(&s.addr).is_ok() {
                break;
            }
            if pid_alive(dir, s.id).is_none() {
                let log = std::fs::read_to_string(dir.join(format!("s{}.log", s.id))).unwrap_or_default();
                let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no log output");
                bail!("server {} exited during start-up: {last}", s.id);
            }
            if start.elapsed() > limit {
                bail!("server {} did not accept connections on {} within {:?}", s.id, s.addr, limit);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// The pid of server `id` if its pid file names a live process.
pub fn pid_alive(dir: &Path, id: u32) -> Option<i32> {
    pid_file_alive(&dir.join(format!("s{id}.pid")))
}

/// The pid in `file` if it names a live process.
fn pid_file_alive(file: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    // Zombies count as dead: read the state from /proc.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat.rsplit(')').next()?.split_whitespace().next()?;
    (state != "Z").then_some(pid)
}

/// What `down` did: the servers it stopped, and those it could not (a user who may not
/// signal them, say), each with the reason.
#[derive(Debug, Default)]
pub struct DownReport {
    pub stopped: Vec<u32>,
    pub not_stopped: Vec<(u32, i32, String)>,
}

/// Send `sig` to `pid`; the error names why it could not be sent (EPERM: another user's).
fn signal(pid: i32, sig: libc::c_int) -> std::io::Result<()> {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Stop every server of the cluster in `dir`: SIGTERM, then SIGKILL after `grace`. A
/// server's pid file is removed only once its process is gone; one that cannot be signalled
/// or outlives SIGKILL is reported, not counted as stopped.
pub fn down(dir: &Path, grace: Duration) -> Result<DownReport> {
    let config = dir.join("cluster.toml");
    let map = ClusterMap::load(&config)?;
    let mut report = DownReport::default();
    let mut running = Vec::new();
    for s in map.processes() {
        if let Some(pid) = pid_alive(dir, s.id) {
            match signal(pid, libc::SIGTERM) {
                Ok(()) => running.push((s.id, pid)),
                Err(e) => report.not_stopped.push((s.id, pid, format!("cannot signal it: {e}"))),
            }
        }
    }
    let start = Instant::now();
    for (id, pid) in running {
        while pid_alive(dir, id).is_some() && start.elapsed() <= grace {
            std::thread::sleep(Duration::from_millis(20));
        }
        if pid_alive(dir, id).is_some() {
            let _ = signal(pid, libc::SIGKILL);
            let killed = Instant::now();
            while pid_alive(dir, id).is_some() && killed.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if pid_alive(dir, id).is_some() {
            report.not_stopped.push((id, pid, "still running after SIGKILL".into()));
        } else {
            let _ = std::fs::remove_file(dir.join(format!("s{id}.pid")));
            report.stopped.push(id);
        }
    }
    stop_identityd(dir, grace);
    Ok(report)
}
