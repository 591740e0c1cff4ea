//! FUSE mounts seen from outside: whether a path is one, unmounting it, and reaping the
//! `shoal mount` process (for `bench load`'s mounts, and the tests' own).

use std::path::Path;
use std::process::{Child, Command};
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
