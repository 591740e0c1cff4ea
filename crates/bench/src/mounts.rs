//! FUSE mounts seen from outside: whether a path is one, unmounting it, and reaping the
//! `shoal mount` process (for `bench load`'s mounts, and the tests' own); [`Mounts`]: fresh
//! mounts of a cluster for one benchmark case (`bench load`, `bench find`).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `path` is a FUSE mount point in this mount namespace.
pub fn is_fuse_mount(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = path.to_string_lossy().replace(' ', "\\040");
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-").unwrap_or(0);
        f.get(4) == Some(&want.as_str()) && f.get(sep + 1).is_some_and(|t| t.starts_with("fuse"))
    })
}

/// Unmount `path` if it is a FUSE mount (lazily when it is busy or its process is dead).
pub fn unmount(path: &Path) {
    if is_fuse_mount(path) {
        let ok = Command::new("fusermount3").arg("-u").arg(path).output().is_ok_and(|o| o.status.success());
        if !ok {
            let _ = Command::new("fusermount3").args(["-u", "-z"]).arg(path).output();
        }
    }
}

/// Wait up to `limit` for `child` (a mount process after its unmount) to exit, then kill it.
pub fn reap(child: &mut Child, limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Fresh `shoal mount` processes for one case, unmounted on drop.
pub struct Mounts {
    pub points: Vec<PathBuf>,
    children: Vec<std::process::Child>,
    _dir: tempfile::TempDir,
}

impl Mounts {
    /// `n` mounts of the cluster of `config` (in one coop group on 127.0.0.1 with `coop`).
    pub fn start(config: &Path, work: &Path, n: usize, coop: bool) -> Result<Mounts> {
        let dir = tempfile::Builder::new().prefix("mounts-").tempdir_in(work)?;
        let ports = if coop { free_ports(n)? } else { Vec::new() };
        let members = dir.path().join("members");
        if coop {
            let lines: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
            std::fs::write(&members, lines.join("\n"))?;
        }
        let exe = std::env::current_exe().context("find the shoal program")?;
        let mut m = Mounts { points: Vec::new(), children: Vec::new(), _dir: dir };
        for i in 0..n {
            let point = m._dir.path().join(format!("node{i}"));
            std::fs::create_dir(&point)?;
            let mut opts = vec!["dir_lease=60".to_string()];
            if coop {
                let port = ports.get(i).context("a port per member")?;
                opts.push(format!("coop={},coop_addr=127.0.0.1:{port}", members.display()));
            }
            let log = std::fs::File::create(m._dir.path().join(format!("node{i}.log")))?;
            let child = Command::new(&exe)
                .arg("--config")
                .arg(config)
                .args(["mount", "--foreground", "-o", &opts.join(",")])
                .arg(&point)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("start shoal mount")?;
            m.children.push(child);
            m.points.push(point);
        }
        for (i, p) in m.points.clone().iter().enumerate() {
            let start = Instant::now();
            while !is_fuse_mount(p) {
                if let Ok(Some(st)) = m.children[i].try_wait() {
                    let log = std::fs::read_to_string(m._dir.path().join(format!("node{i}.log"))).unwrap_or_default();
                    bail!("shoal mount of {} exited ({st}): {}", p.display(), log.trim());
                }
                if start.elapsed() > Duration::from_secs(30) {
                    bail!("{} not mounted after 30 s", p.display());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(m)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for p in &self.points {
            unmount(p);
        }
        for c in &mut self.children {
            reap(c, Duration::from_secs(10));
        }
    }
}

/// `n` ports of 127.0.0.1 free now (bound, then let go, together).
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let held: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    Ok(held.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<std::io::Result<_>>()?)
}
