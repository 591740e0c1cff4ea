//! `shoal mount` and `shoal umount`: the POSIX mount through FUSE (crate `shoal-fuse`).
//!
//! Without `--foreground` the command starts itself again as a daemon (new session,
//! standard streams on the log file or /dev/null) and returns once the mount answers, or
//! with the daemon's error. The daemon reports through a pipe whose descriptor it finds in
//! `SHOAL_MOUNT_READY_FD`.

use super::{usage, Ctx};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use shoal_fuse::MountOptions;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const READY_FD_ENV: &str = "SHOAL_MOUNT_READY_FD";

#[derive(Args)]
#[command(after_help = "Options (-o, comma-separated; also accepted by mount -t fuse.shoal):\n  \
attr_timeout=S entry_timeout=S negative_timeout=S   kernel cache lifetimes (1, 1, 0)\n  \
client_cache=S      client library cache on top of the kernel's (0)\n  \
timeout=S           a request to a down server fails with EIO after S seconds (--timeout, 30)\n  \
writeback_cache     gather writes in the page cache (off)\n  \
keep_cache          keep file pages across opens (off: each open sees other clients' data)\n  \
direct_io           bypass the page cache\n  \
allow_other|noallow_other   let every user in (on when root mounts; --private turns it off)\n  \
allow_root default_permissions ro auto_unmount fsname=NAME\n  \
threads=N fuse_threads=N max_write=BYTES max_readahead=BYTES max_background=N\n  \
sync_close|nosync_close   fsync a written file at its last close (on)\n  \
dev nodev suid nosuid exec noexec atime noatime sync async dirsync\n\n\
docs/mount.md describes each option and the consistency it gives.\n\n\
Examples:\n  shoal --config /etc/shoal/cluster.toml mount /mnt/shoal\n  \
shoal mount --foreground --attr-timeout 5 /mnt/shoal\n  shoal umount /mnt/shoal")]
pub struct MountArgs {
    /// Directory to mount on.
    pub mountpoint: PathBuf,
    /// Mount options, comma-separated, as for mount -o (repeatable).
    #[arg(short = 'o', value_name = "OPT[,OPT...]")]
    pub options: Vec<String>,
    /// Stay in the foreground and log to stderr; SIGINT/SIGTERM unmount.
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Seconds the kernel may trust attributes (same as -o attr_timeout=).
    #[arg(long, value_name = "SECS")]
    pub attr_timeout: Option<f64>,
    /// Seconds the kernel may trust names (same as -o entry_timeout=).
    #[arg(long, value_name = "SECS")]
    pub entry_timeout: Option<f64>,
    /// Seconds the kernel may remember a missing name (same as -o negative_timeout=).
    #[arg(long, value_name = "SECS")]
    pub negative_timeout: Option<f64>,
    /// Enable the kernel's write-back cache (same as -o writeback_cache).
    #[arg(long)]
    pub writeback_cache: bool,
    /// Let other users use the mount (same as -o allow_other; the default when root mounts).
    #[arg(long, conflicts_with = "private")]
    pub allow_other: bool,
    /// Only the user who mounts may use the mount (same as -o noallow_other).
    #[arg(long)]
    pub private: bool,
    /// Let the kernel check permissions too (same as -o default_permissions).
    #[arg(long)]
    pub default_permissions: bool,
    /// Mount read-only (same as -o ro).
    #[arg(long)]
    pub read_only: bool,
    /// Threads running requests (same as -o threads=).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Serve the mount's Prometheus metrics on ADDR (host:port): GET /metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// As a daemon, append the log to FILE (default: discarded). SHOAL_LOG sets the level.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
}

#[derive(Args)]
pub struct UmountArgs {
    /// Mount point to unmount.
    pub mountpoint: PathBuf,
    /// Detach now even if files are in use; they stay usable until closed.
    #[arg(short = 'l', long)]
    pub lazy: bool,
}

fn options(ctx: &Ctx, a: &MountArgs) -> Result<MountOptions> {
    let mut o = MountOptions { timeout: ctx.timeout, ..MountOptions::default() };
    for list in &a.options {
        o.apply_list(list).map_err(|e| usage(format!("{e:#}")))?;
    }
    let secs = |name: &str, v: f64| -> Result<Duration> {
        if !(0.0..=1e9).contains(&v) {
            return Err(usage(format!("--{name} {v}: out of range")));
        }
        Ok(Duration::from_secs_f64(v))
    };
    if let Some(v) = a.attr_timeout {
        o.attr_timeout = secs("attr-timeout", v)?;
    }
    if let Some(v) = a.entry_timeout {
        o.entry_timeout = secs("entry-timeout", v)?;
    }
    if let Some(v) = a.negative_timeout {
        o.negative_timeout = secs("negative-timeout", v)?;
    }
    if let Some(n) = a.threads {
        if n == 0 {
            return Err(usage("--threads 0: at least one thread is needed"));
        }
        o.threads = n;
    }
    o.writeback_cache |= a.writeback_cache;
    o.allow_other |= a.allow_other;
    if a.private {
        o.allow_other = false;
    }
    o.default_permissions |= a.default_permissions;
    o.read_only |= a.read_only;
    if let Some(addr) = &a.metrics {
        if addr.parse::<std::net::SocketAddr>().is_err()
            && addr.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err())
        {
            return Err(usage(format!("--metrics {addr}: give host:port, e.g. 127.0.0.1:9101")));
        }
        o.metrics_listen = Some(addr.clone());
    }
    Ok(o)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

pub async fn mount(ctx: &Ctx, a: MountArgs) -> Result<()> {
    let opts = options(ctx, &a)?;
    let config = ctx.config_path()?;
    let config = config.canonicalize().with_context(|| format!("cluster configuration {}", config.display()))?;
    if !a.mountpoint.is_dir() {
        bail!("mount point {}: not a directory (or does not exist)", a.mountpoint.display());
    }
    let mountpoint = a.mountpoint.canonicalize().with_context(|| format!("mount point {}", a.mountpoint.display()))?;
    let ready_fd = std::env::var(READY_FD_ENV).ok().and_then(|v| v.parse::<i32>().ok());
    if a.foreground || ready_fd.is_some() {
        return foreground(config, mountpoint, opts, ready_fd).await;
    }
    daemonize(&config, &mountpoint, &opts, a.log.as_deref()).await
}

/// Serve the mount in this process (on its own thread and runtime) until it is unmounted.
async fn foreground(config: PathBuf, mountpoint: PathBuf, opts: MountOptions, ready_fd: Option<i32>) -> Result<()> {
    init_logging();
    // SAFETY: the descriptor was handed to us by the parent for this purpose only.
    let mut ready = ready_fd.map(|fd| unsafe { std::fs::File::from_raw_fd(fd) });
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("shoal-mount".into())
        .spawn(move || {
            let r = shoal_fuse::serve(&config, &mountpoint, opts, |mp| {
                if let Some(mut f) = ready.take() {
                    use std::io::Write;
                    let _ = writeln!(f, "ok {}", mp.display());
                }
                if ready_fd.is_some() {
                    // A daemon stops using the directory it was started in.
                    let _ = std::env::set_current_dir("/");
                }
            });
            if let (Err(e), Some(mut f)) = (&r, ready.take()) {
                use std::io::Write;
                let _ = writeln!(f, "error {}", format!("{e:#}").replace('\n', " "));
            }
            let _ = tx.send(r);
        })
        .context("cannot start the mount thread")?;
    rx.await.map_err(|_| anyhow!("the mount thread ended without a result"))?
}

/// Start `shoal mount --foreground` as a daemon and wait until it reports.
async fn daemonize(config: &Path, mountpoint: &Path, opts: &MountOptions, log: Option<&Path>) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the shoal executable")?;
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 just made them and nothing else owns them.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let (stdout, stderr) = match log {
        Some(p) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("log file {}", p.display()))?;
            (Stdio::from(f.try_clone()?), Stdio::from(f))
        }
        None => (Stdio::null(), Stdio::null()),
    };
    let wfd = fds[1];
    let mut cmd = Command::new(exe);
    cmd.arg("--config")
        .arg(config)
        .arg("mount")
        .arg(mountpoint)
        .arg("--foreground")
        .arg("-o")
        .arg(opts.to_option_string())
        .args(opts.metrics_listen.iter().flat_map(|m| ["--metrics", m.as_str()]))
        .env(READY_FD_ENV, wfd.to_string())
        .env_remove("SHOAL_CONFIG")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fcntl(wfd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the mount daemon")?;
    drop(write_end);
    let pid = child.id();
    let wait = opts.timeout + Duration::from_secs(30);
    let msg = tokio::task::spawn_blocking(move || read_report(read_end, wait)).await??;
    match msg.split_once(' ').unwrap_or((msg.as_str(), "")) {
        ("ok", _) => {
            // The daemon runs on (in its own session); init reaps it when it exits.
            drop(child);
            Ok(())
        }
        ("error", m) => {
            let _ = child.wait();
            bail!("{m}")
        }
        _ => {
            let status = child.try_wait().ok().flatten();
            if status.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            bail!(
                "the mount daemon (pid {pid}) {} without reporting{}",
                match status {
                    Some(s) => format!("exited ({s})"),
                    None => "did not answer in time and was stopped".into(),
                },
                if log.is_some() { "; see its log" } else { "; run with --foreground or --log FILE to see why" }
            )
        }
    }
}

/// Read the daemon's one-line report (until it closes the pipe or `limit` passes).
fn read_report(fd: OwnedFd, limit: Duration) -> Result<String> {
    let mut f = std::fs::File::from(fd);
    let deadline = Instant::now() + limit;
    let mut buf = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut pfd = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&f), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err.into());
        }
        if n == 0 {
            break;
        }
        let mut chunk = [0u8; 4096];
        let got = f.read(&mut chunk)?;
        if got == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..got]);
        if buf.contains(&b'\n') {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&buf).lines().next().unwrap_or("").to_string())
}

pub async fn umount(_ctx: &Ctx, a: UmountArgs) -> Result<()> {
    let mp = a.mountpoint.canonicalize().with_context(|| format!("mount point {}", a.mountpoint.display()))?;
    if !shoal_fuse::is_mounted(&mp) {
        bail!("{}: not a FUSE mount", mp.display());
    }
    let lazy = a.lazy;
    let mp2 = mp.clone();
    tokio::task::spawn_blocking(move || shoal_fuse::unmount(&mp2, lazy)).await??;
    // The daemon notices and exits; wait until the kernel has let go of the mount point.
    let deadline = Instant::now() + Duration::from_secs(10);
    while shoal_fuse::is_mounted(&mp) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if shoal_fuse::is_mounted(&mp) {
        bail!("{} is still mounted", mp.display());
    }
    Ok(())
}
