//! Shoal's POSIX mount: a FUSE file system that turns every kernel request into a call of
//! the native client ([`shoal_client`]), made as the uid/gid (and supplementary groups) of
//! the process that asked, so that the servers enforce permissions for each user.
//!
//! * [`mount`] mounts and serves until the file system is unmounted (or SIGINT/SIGTERM,
//!   which unmount it cleanly);
//! * [`spawn`] mounts in the background and returns a [`Mounted`] that unmounts on drop;
//! * [`unmount`] unmounts a mount point.
//!
//! Settings are in [`MountOptions`]; `docs/mount.md` describes each one and the
//! consistency each cache setting gives.
//!
//! ```no_run
//! let opts = shoal_fuse::MountOptions { allow_other: true, ..Default::default() };
//! shoal_fuse::mount("cluster.toml".as_ref(), "/mnt/shoal".as_ref(), opts)?;
//! # Ok::<(), anyhow::Error>(())
//! ```

mod convert;
mod coop_source;
mod dircache;
mod fs;
mod kernel_cache;
mod metrics;
mod one_at_a_time;
mod options;

pub use options::MountOptions;

use anyhow::{anyhow, bail, Context, Result};
use fs::{Shared, ShoalFs};
use parking_lot::Mutex;
use shoal_client::{Client, ClientOptions, Cred, ROOT_INO};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Log a warning, at most once a second (a down server fails every request).
pub(crate) fn warn_limited(msg: &str) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    static SUPPRESSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut last = LAST.lock();
    let now = Instant::now();
    if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
        SUPPRESSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return;
    }
    *last = Some(now);
    let n = SUPPRESSED.swap(0, std::sync::atomic::Ordering::Relaxed);
    if n > 0 {
        tracing::warn!("{msg} (and {n} more errors like it)");
    } else {
        tracing::warn!("{msg}");
    }
}

/// A prepared mount: the runtime, the client and the fuser configuration.
struct Prepared {
    rt: tokio::runtime::Runtime,
    shared: Arc<Shared>,
    config: fuser::Config,
    mountpoint: PathBuf,
}

fn prepare(client_config: &Path, mountpoint: &Path, opts: MountOptions) -> Result<Prepared> {
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse does not exist: load the fuse module (modprobe fuse) or give the container the device");
    }
    let mountpoint = mountpoint.canonicalize().with_context(|| format!("mount point {}", mountpoint.display()))?;
    if !mountpoint.is_dir() {
        bail!("mount point {} is not a directory", mountpoint.display());
    }
    if is_mounted(&mountpoint) {
        bail!("{} is already a Shoal mount", mountpoint.display());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.threads)
        .thread_name("shoal-fuse")
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let copts = ClientOptions {
        timeout: opts.timeout,
        cache_ttl: opts.client_cache,
        dir_lease: opts.dir_lease,
        // The kernel keeps attributes for as long as their leases (`kernel_cache.rs`).
        attr_leases: true,
        cred: Cred::root(),
        umask: 0,
        ..ClientOptions::default()
    };
    let client = Client::from_config(client_config, copts).map_err(|e| anyhow!("{e}"))?;
    // Fail now, with a clear message, rather than mount a file system nobody answers for.
    rt.block_on(client.getattr_fresh(ROOT_INO))
        .map_err(|e| anyhow!("cannot reach the cluster of {}: {e}", client_config.display()))?;

    let mut mount_options = vec![
        // The source names the configuration by its absolute path: the preload library
        // (crates/preload) finds the cluster of a mount from it in /proc/self/mountinfo.
        fuser::MountOption::FSName(opts.fsname.clone().unwrap_or_else(|| {
            let config = client_config.canonicalize().unwrap_or_else(|_| client_config.to_path_buf());
            format!("shoal:{}", config.display())
        })),
        // Makes the type "fuse.shoal" in /proc/mounts also when mounting without fusermount3.
        fuser::MountOption::CUSTOM("subtype=shoal".into()),
    ];
    if opts.default_permissions {
        mount_options.push(fuser::MountOption::DefaultPermissions);
    }
    if opts.read_only {
        mount_options.push(fuser::MountOption::RO);
    }
    if opts.auto_unmount {
        mount_options.push(fuser::MountOption::AutoUnmount);
    }
    for f in &opts.flags {
        mount_options.push(match f.as_str() {
            "dev" => fuser::MountOption::Dev,
            "nodev" => fuser::MountOption::NoDev,
            "suid" => fuser::MountOption::Suid,
            "nosuid" => fuser::MountOption::NoSuid,
            "exec" => fuser::MountOption::Exec,
            "noexec" => fuser::MountOption::NoExec,
            "atime" => fuser::MountOption::Atime,
            "noatime" => fuser::MountOption::NoAtime,
            "sync" => fuser::MountOption::Sync,
            "async" => fuser::MountOption::Async,
            "dirsync" => fuser::MountOption::DirSync,
            other => bail!("unknown mount flag {other}"),
        });
    }
    let mut config = fuser::Config::default();
    config.mount_options = mount_options;
    config.acl = if opts.allow_other {
        fuser::SessionACL::All
    } else if opts.allow_root || opts.auto_unmount {
        fuser::SessionACL::RootAndOwner
    } else {
        fuser::SessionACL::Owner
    };
    config.n_threads = Some(opts.fuse_threads.max(1));
    config.clone_fd = opts.fuse_threads > 1;
    let metrics_listen = opts.metrics_listen.clone();
    let coop = (opts.coop_members.clone(), opts.coop_addr, opts.coop_wait);
    let shared = Shared::new(client, opts);
    match coop {
        (Some(members), Some(me), wait) => {
            // Joined before mounting: a bad members file or a taken port fails the mount.
            let c = rt.block_on(join_coop(&shared.root, &members, me, wait))?;
            let _ = shared.coop.set(c);
        }
        (Some(_), None, _) => bail!("option coop=FILE needs coop_addr=IP:PORT (this mount's address in the file)"),
        (None, Some(_), _) => bail!("option coop_addr needs coop=FILE (the group's members, one address per line)"),
        (None, None, _) => {}
    }
    if let Some(addr) = metrics_listen {
        // Bound before mounting: a taken port fails the mount with the cause, not later.
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(&addr))
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        rt.spawn(metrics::serve(shared.metrics.clone(), listener));
    }
    Ok(Prepared { rt, shared, config, mountpoint })
}

/// Join the coop group listed in `members` as the member at `me` (docs/loading.md,
/// "Cooperative reads"), answering the others from this mount's client.
async fn join_coop(
    root: &shoal_client::Client,
    members: &Path,
    me: std::net::SocketAddr,
    wait: Duration,
) -> Result<shoal_coop::Coop> {
    let text = std::fs::read_to_string(members)
        .with_context(|| format!("cannot read the coop members file {}", members.display()))?;
    let mut addrs = Vec::new();
    for (n, line) in text.lines().enumerate().map(|(n, l)| (n + 1, l.trim())) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let a = line
            .parse()
            .map_err(|_| anyhow::anyhow!("{}:{n}: {line:?} is not an address IP:PORT", members.display()))?;
        addrs.push(a);
    }
    let group = shoal_coop::group::Group::new(addrs, me).map_err(|e| anyhow::anyhow!("{}: {e}", members.display()))?;
    let map = root.map();
    // Members prove the host key to each other, as clients do to servers.
    let keys = match map.security.auth {
        shoal_placement::map::AuthMode::None => None,
        _ => Some(shoal_auth::KeyRing::load(&map.security.host_key, shoal_auth::KeyKind::Host).with_context(|| {
            format!("a coop group needs the host key {} (mount as root)", map.security.host_key.display())
        })?),
    };
    let source = std::sync::Arc::new(coop_source::MountSource::new(root.clone()));
    let opts = shoal_coop::CoopOptions { wait, ..Default::default() };
    Ok(shoal_coop::Coop::start(group, keys, source, opts).await?)
}

impl Prepared {
    fn session(&self) -> Result<fuser::Session<ShoalFs>> {
        let fs = ShoalFs::new(self.rt.handle().clone(), self.shared.clone());
        fuser::Session::new(fs, &self.mountpoint, &self.config)
            .with_context(|| format!("cannot mount on {}", self.mountpoint.display()))
    }

    /// After the kernel let go: let running requests finish, close what is still open.
    fn finish(self) {
        let limit = self.shared.opts.timeout + Duration::from_secs(5);
        let shared = self.shared.clone();
        self.rt.block_on(async move {
            shared.drain(limit).await;
            shared.close_all().await;
        });
        self.rt.shutdown_timeout(Duration::from_secs(1));
    }
}

/// The device number (major, minor) of the mount at `mountpoint`, from
/// /proc/self/mountinfo (a stat of the mount point would wait for the file system itself).
/// The minor number is the FUSE connection number under /sys/fs/fuse/connections.
fn device_of(mountpoint: &Path) -> Option<(u32, u32)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        if fields.get(4).map(|m| unescape(m)).as_deref() != mountpoint.to_str() {
            return None;
        }
        let (major, minor) = fields.get(2)?.split_once(':')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    })
}

/// The kernel starts a FUSE mount with a 128 KiB read-ahead window whatever the file
/// system asks; raise it to `bytes` (needs root; sequential reads of striped files then
/// keep several servers busy).
fn set_read_ahead(dev: Option<(u32, u32)>, bytes: u32) {
    let Some((major, minor)) = dev else { return };
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&path, format!("{}", (bytes / 1024).max(4))) {
        Ok(()) => tracing::debug!("read-ahead set to {} KiB", bytes / 1024),
        Err(e) => tracing::info!("cannot set the read-ahead window through {path}: {e}"),
    }
}

/// One FUSE connection, as /sys/fs/fuse/connections knows it: its number (the mount's
/// minor device number) and the inode of its directory there. Numbers are reused once a
/// mount is gone; the directory's inode is new for every connection, so it tells whether
/// the number still names this mount's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    pub number: u32,
    pub dir_ino: Option<u64>,
}

const FUSECTL: &str = "/sys/fs/fuse/connections";

impl Connection {
    /// The connection of the mount whose device is `dev` (just mounted).
    fn of(dev: Option<(u32, u32)>) -> Option<Connection> {
        use std::os::unix::fs::MetadataExt;
        let number = dev?.1;
        let dir = format!("{FUSECTL}/{number}");
        if !Path::new(&dir).exists() {
            mount_fusectl();
        }
        let dir_ino = std::fs::metadata(&dir).ok().map(|m| m.ino());
        Some(Connection { number, dir_ino })
    }

    /// Abort it: every waiting request fails with ENOTCONN at once. Skipped when its number
    /// now names another connection (this mount is gone, and another took the number: a
    /// test running beside another saw its reads fail with ECONNABORTED from such an abort).
    pub fn abort(self) {
        use std::os::unix::fs::MetadataExt;
        let dir = format!("{FUSECTL}/{}", self.number);
        let now = std::fs::metadata(&dir).ok().map(|m| m.ino());
        if now.is_none() || now != self.dir_ino {
            tracing::info!("FUSE connection {} is gone (or another's now): not aborted", self.number);
            return;
        }
        let path = format!("{dir}/abort");
        if let Err(e) = std::fs::write(&path, b"1") {
            tracing::warn!("cannot abort the FUSE connection through {path}: {e}");
        }
    }
}

/// Mount the fusectl file system on /sys/fs/fuse/connections (needs root).
fn mount_fusectl() {
    let (src, target, fstype) = (c"fusectl", c"/sys/fs/fuse/connections", c"fusectl");
    // SAFETY: valid NUL-terminated strings; no data argument.
    let r = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        tracing::debug!("cannot mount fusectl on {FUSECTL}: {}", std::io::Error::last_os_error());
    }
}

/// Mount Shoal (the cluster described by `client_config`) on `mountpoint` and serve it
/// until it is unmounted. SIGINT, SIGTERM and SIGHUP unmount it (lazily: processes still
/// using files keep them until they close them); a second signal aborts the connection
/// and returns at once.
pub fn mount(client_config: &Path, mountpoint: &Path, opts: MountOptions) -> Result<()> {
    serve(client_config, mountpoint, opts, |_| {})
}

/// As [`mount`], calling `ready` with the mount point once the file system is mounted and
/// answering (a daemon tells its parent then).
pub fn serve(client_config: &Path, mountpoint: &Path, opts: MountOptions, ready: impl FnOnce(&Path)) -> Result<()> {
    let prepared = prepare(client_config, mountpoint, opts)?;
    let session = prepared.session()?;
    let _ = prepared.shared.notifier.set(session.notifier());
    let mp = prepared.mountpoint.clone();
    let dev = device_of(&mp);
    set_read_ahead(dev, prepared.shared.opts.max_readahead);
    let conn = Connection::of(dev);
    tracing::info!("mounted {} on {}", client_config.display(), mp.display());

    // Signals: first one unmounts, the next aborts the connection.
    let signal_mp = mp.clone();
    prepared.rt.spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term), Ok(mut hup)) =
            (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup()))
        else {
            tracing::warn!("cannot handle signals: SIGINT/SIGTERM will not unmount cleanly");
            return;
        };
        let mut count = 0;
        loop {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
            count += 1;
            if count == 1 {
                tracing::info!("signal received: unmounting {}", signal_mp.display());
                let mp = signal_mp.clone();
                let r = tokio::task::spawn_blocking(move || unmount(&mp, true)).await;
                if let Ok(Err(e)) = r {
                    tracing::warn!("unmounting {}: {e:#}", signal_mp.display());
                }
            } else {
                tracing::warn!("second signal: aborting the connection");
                match conn {
                    Some(c) => c.abort(),
                    None => std::process::exit(1),
                }
            }
        }
    });

    // Serve on the session's own threads, so that whoever `ready` tells can use the mount
    // at once (a stat of the mount point waits for an answer).
    let background = session.spawn().context("cannot start the session threads")?;
    ready(&mp);
    let result = session_end(background.join(), &mp);
    prepared.finish();
    result.with_context(|| format!("serving {}", mp.display()))?;
    tracing::info!("unmounted {}", mp.display());
    Ok(())
}

/// How a session's end reads. The kernel tears the connection down when the file system
/// is unmounted, and a thread reading a request at that moment gets ECONNABORTED instead of
/// ENODEV (fuse_dev_do_read: "must not put request on fpq->io queue after having been shut
/// down"); fuser passes it on as an error. Once the mount is gone that is a normal end. A
/// connection aborted while still mounted (through /sys/fs/fuse/connections) stays an error.
fn session_end(result: std::io::Result<()>, mountpoint: &Path) -> std::io::Result<()> {
    match result {
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) && !fuse_mount_at(mountpoint) => {
            tracing::debug!("the connection ended with ECONNABORTED during the unmount");
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Err(std::io::Error::new(
            e.kind(),
            "the FUSE connection was aborted (the mount point stays until it is unmounted)",
        )),
        other => other,
    }
}

/// A mount served by a background thread ([`spawn`]). Dropping it unmounts.
pub struct Mounted {
    mountpoint: PathBuf,
    background: Option<fuser::BackgroundSession>,
    prepared: Option<Prepared>,
    conn: Option<Connection>,
}

/// Mount in the background: returns once the file system answers.
pub fn spawn(client_config: &Path, mountpoint: &Path, opts: MountOptions) -> Result<Mounted> {
    let prepared = prepare(client_config, mountpoint, opts)?;
    let session = prepared.session()?;
    let _ = prepared.shared.notifier.set(session.notifier());
    let dev = device_of(&prepared.mountpoint);
    set_read_ahead(dev, prepared.shared.opts.max_readahead);
    let background = session.spawn().context("cannot start the session thread")?;
    Ok(Mounted {
        mountpoint: prepared.mountpoint.clone(),
        background: Some(background),
        prepared: Some(prepared),
        conn: Connection::of(dev),
    })
}

impl Mounted {
    /// Its FUSE connection (when /proc and /sys tell it).
    pub fn connection(&self) -> Option<Connection> {
        self.conn
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmount and wait until the session has ended. If files are still open, the mount is
    /// detached at once and they keep working for up to 5 s; then the connection is
    /// aborted (they fail with ENOTCONN).
    pub fn unmount(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        let Some(bg) = self.background.take() else { return Ok(()) };
        let r = unmount(&self.mountpoint, false).or_else(|_| unmount(&self.mountpoint, true));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !bg.guard.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !bg.guard.is_finished() {
            match self.conn {
                Some(c) => c.abort(),
                None => tracing::warn!("cannot abort the FUSE connection of {}", self.mountpoint.display()),
            }
        }
        let joined = session_end(bg.join(), &self.mountpoint);
        if let Some(p) = self.prepared.take() {
            p.finish();
        }
        r?;
        joined.context("the session ended with an error")
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("unmounting {}: {e:#}", self.mountpoint.display());
        }
    }
}

/// Whether `path` is the mount point of a FUSE file system (of any kind) in this mount
/// namespace.
pub fn is_mounted(path: &Path) -> bool {
    path.canonicalize().is_ok_and(|p| fuse_mount_at(&p))
}

/// Whether /proc/self/mountinfo lists a FUSE mount at `path` (already canonical: resolving
/// it would stat the mount point, which fails on an aborted connection).
fn fuse_mount_at(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    info.lines().any(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else { return false };
        let fstype = fields.get(sep + 1).copied().unwrap_or("");
        fields.get(4).is_some_and(|mp| unescape(mp).as_bytes() == path.as_os_str().as_bytes())
            && (fstype == "fuse" || fstype.starts_with("fuse."))
    })
}

/// Undo the octal escapes of /proc/self/mountinfo (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmount the FUSE file system at `mountpoint`: with fusermount3 (`-u`, `-z` when
/// `lazy`), or umount2(2) when that is missing. A lazy unmount detaches the mount at once;
/// processes still using files on it keep them until they close them.
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<()> {
    let mut errors = Vec::new();
    for tool in ["fusermount3", "fusermount"] {
        let mut cmd = std::process::Command::new(tool);
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        cmd.arg("--").arg(mountpoint);
        match cmd.output() {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => errors.push(format!("{tool}: {}", String::from_utf8_lossy(&out.stderr).trim())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => errors.push(format!("{tool}: {e}")),
        }
    }
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()).context("mount point name")?;
    // SAFETY: a valid NUL-terminated path; umount2 has no other preconditions.
    let r = unsafe { libc::umount2(c.as_ptr(), if lazy { libc::MNT_DETACH } else { 0 }) };
    if r == 0 {
        return Ok(());
    }
    errors.push(format!("umount2: {}", std::io::Error::last_os_error()));
    bail!("cannot unmount {}: {}", mountpoint.display(), errors.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/x\134y"), "/x\\y");
    }

    #[test]
    fn an_aborted_connection_is_a_normal_end_once_unmounted_only() {
        let aborted = || Err(std::io::Error::from_raw_os_error(libc::ECONNABORTED));
        assert!(session_end(aborted(), Path::new("/nonexistent/mount")).is_ok());
        let other = session_end(Err(std::io::Error::from_raw_os_error(libc::EIO)), Path::new("/nonexistent"));
        assert_eq!(other.unwrap_err().raw_os_error(), Some(libc::EIO));
        assert!(session_end(Ok(()), Path::new("/")).is_ok());
    }

    #[test]
    fn root_is_not_a_fuse_mount() {
        assert!(!is_mounted(Path::new("/")));
        assert!(!is_mounted(Path::new("/nonexistent/path")));
    }
}
