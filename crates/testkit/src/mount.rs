//! Mounting Shoal in tests: `shoal mount --foreground` as a child process on a mount point
//! in its own world-readable temporary directory, unmounted (and the child reaped) on drop.
//! Tests call [`skip_without_fuse`] first: without /dev/fuse they print why and pass.

use crate::{shoal_bin, Cluster};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Uid/gid of an unprivileged user present on every Debian system (nobody/nogroup).
pub const NOBODY: u32 = 65534;

/// True (after printing the reason) when FUSE is not available here, so the test skips.
pub fn skip_without_fuse() -> bool {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED: /dev/fuse is absent (no FUSE in this environment)");
        return true;
    }
    false
}

pub struct Mount {
    /// World-readable directory holding the mount point (so other users can reach it).
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

/// Whether `path` is a mount point of a FUSE file system.
pub fn is_fuse_mount(path: &Path) -> bool {
    shoal_bench::mounts::is_fuse_mount(path)
}

impl Mount {
    /// Mount `cluster` with `allow_other` plus `extra` options (`-o` syntax).
    pub fn new(cluster: &Cluster, extra: &[&str]) -> Mount {
        Mount::with_log(cluster, extra, "info")
    }

    /// As `new`, with `SHOAL_LOG` set to `filter` (`"info,fuser::request=debug"` logs every
    /// FUSE request the kernel sends, one line each, for tests that count them).
    pub fn with_log(cluster: &Cluster, extra: &[&str], filter: &str) -> Mount {
        let mut opts = vec!["allow_other"];
        opts.extend_from_slice(extra);
        Mount::spawn(cluster, &["-o", &opts.join(",")], filter)
    }

    /// Mount `cluster` with exactly these arguments of `shoal mount` (no options added).
    pub fn with_args(cluster: &Cluster, args: &[&str]) -> Mount {
        Mount::spawn(cluster, args, "info")
    }

    fn spawn(cluster: &Cluster, args: &[&str], filter: &str) -> Mount {
        let dir = tempfile::Builder::new().prefix("shoal-mnt-").tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("m");
        std::fs::create_dir(&path).unwrap();
        let log = dir.path().join("mount.log");
        let logf = std::fs::File::create(&log).unwrap();
        let child = Command::new(shoal_bin())
            .env_remove("SHOAL_CONFIG")
            .env("SHOAL_LOG", filter)
            .arg("--config")
            .arg(&cluster.config)
            .args(["mount", "--foreground"])
            .args(args)
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("start shoal mount");
        let mut m = Mount { dir, path, log, child: Some(child) };
        m.wait_mounted();
        m
    }

    fn wait_mounted(&mut self) {
        let start = Instant::now();
        while !is_fuse_mount(&self.path) {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("shoal mount exited ({st}) before mounting:\n{}", self.log_text());
                }
            }
            assert!(start.elapsed() < Duration::from_secs(30), "not mounted after 30 s:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A path inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// Process id of the mount process.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Wait for the mount process to exit on its own (after a signal or umount).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return Some(st);
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        shoal_bench::mounts::unmount(&self.path);
        if let Some(mut c) = self.child.take() {
            shoal_bench::mounts::reap(&mut c, Duration::from_secs(10));
        }
    }
}

/// Run `sh -c script` as uid/gid `id` (no supplementary groups), in `cwd`.
pub fn sh_as(id: u32, cwd: &Path, script: &str) -> Output {
    Command::new("sh").arg("-c").arg(script).current_dir(cwd).uid(id).gid(id).output().expect("run sh")
}

/// Run `sh -c script` (as the test's user) in `cwd`, asserting success; returns stdout.
pub fn sh(cwd: &Path, script: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(script).current_dir(cwd).output().expect("run sh");
    assert!(
        out.status.success(),
        "`{script}` failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last OS error as an errno.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The errno of a failed std::io call.
pub fn code(r: std::io::Result<impl std::fmt::Debug>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

pub fn cstr(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The interception library (`crates/preload`) as cargo built it for the tests (`shoal`
/// depends on it).
pub fn preload_library() -> PathBuf {
    built_library("libshoal_preload.so")
}

/// The loader audit library (`crates/audit`) as cargo built it for the tests.
pub fn audit_library() -> PathBuf {
    built_library("libshoal_audit.so")
}

/// A shared object of the workspace as cargo built it for the tests: in `deps/` next to
/// the binaries, or beside them after a workspace build; the newer of the two.
fn built_library(file: &str) -> PathBuf {
    let bin = shoal_bin();
    let dir = bin.parent().unwrap();
    [dir.join("deps").join(file), dir.join(file)]
        .into_iter()
        .filter_map(|p| std::fs::metadata(&p).and_then(|m| m.modified()).ok().map(|t| (t, p)))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("{file} was not built next to the shoal binary"))
}
