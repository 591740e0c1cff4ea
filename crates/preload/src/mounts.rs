//! Which paths are Shoal's: the `fuse.shoal` mounts of the process's mount namespace, and
//! the translation of a path the program gave into a path inside Shoal.
//!
//! **Finding mounts.** When the library is loaded it reads `/proc/self/mountinfo`. A
//! `shoal mount` shows there with type `fuse.shoal` and source `shoal:CONFIG`, CONFIG being
//! the absolute path of the cluster configuration it was mounted with (crates/fuse); the
//! library makes its own client from that file. `SHOAL_PRELOAD_CONFIG` names the file
//! for mounts whose source does not (`fsname=`), and `SHOAL_PRELOAD_MOUNTS` restricts the
//! mounts served. Not served (their calls go to the kernel): read-only mounts, mounts of a
//! subtree (a bind mount whose root is not Shoal's root), mounts hidden by a later mount
//! on the same point, and paths under another file system mounted inside a Shoal mount.
//! Mounts made after the program started are not seen: their calls go to the kernel.
//!
//! **Translating paths.** An absolute path is split into components, `.` and empty ones
//! dropped; if the leading components are a mount point's, the rest, `..` included, is the
//! Shoal path (the client resolves `..` and symbolic links as the kernel would, and stops
//! with EREMOTE where the kernel would leave Shoal: `ClientOptions::host_paths`). A
//! relative path is taken from the working directory (cached here, refreshed by the
//! intercepted `chdir`/`fchdir`) or from a directory descriptor the library serves; a
//! relative path from any other descriptor goes to the kernel. A path whose text does
//! not start with a mount point (`/mnt/../mnt/shoal/x`, a symlink outside the mount that
//! points into it) goes to the kernel too: correct, only slower.

use crate::real;
use arc_swap::ArcSwapOption;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// A Shoal mount the library serves.
#[derive(Debug)]
pub struct Mount {
    /// Position in [`all`].
    pub index: usize,
    /// Mount point: absolute, no trailing `/`.
    pub dir: String,
    comps: Vec<String>,
    /// `st_dev` of the files below, as the kernel reports them.
    pub dev: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    /// The mount's id (`statx`'s `stx_mnt_id`).
    pub mnt_id: u64,
    /// The cluster configuration.
    pub config: PathBuf,
    /// Mount points of other file systems below `dir` (components relative to it).
    covered: Vec<Vec<String>>,
}

/// A path resolved to a Shoal mount.
#[derive(Debug, Clone)]
pub struct Target {
    pub mount: &'static Mount,
    /// The path inside Shoal: `/` then the components after the mount point (`..`
    /// included), with a trailing `/` if the path had one.
    pub shoal: String,
    /// The same path on the host (mount point + `shoal`), for opening it through the
    /// kernel later (descriptors turned into kernel descriptors).
    pub host: String,
}

static MOUNTS: OnceLock<Vec<Mount>> = OnceLock::new();

/// Set when the process changed its root (`chroot`): paths no longer mean what
/// mountinfo says, so every path goes to the kernel from then on.
static PATHS_OFF: AtomicBool = AtomicBool::new(false);

/// The working directory as the kernel reports it (None: unknown, e.g. removed).
static CWD: ArcSwapOption<String> = ArcSwapOption::const_empty();

/// Read the mount table (at load time, before the program runs).
pub fn load() {
    MOUNTS.get_or_init(read_mounts);
    refresh_cwd();
}

/// The mounts served (empty before [`load`] or when there are none).
pub fn all() -> &'static [Mount] {
    MOUNTS.get().map(|v| &v[..]).unwrap_or(&[])
}

/// Stop translating paths (after `chroot`).
pub fn paths_off() {
    PATHS_OFF.store(true, Ordering::Relaxed);
}

/// Whether any path may be Shoal's (cheap test before any work on a path).
pub fn any() -> bool {
    !all().is_empty() && !PATHS_OFF.load(Ordering::Relaxed)
}

/// Ask the kernel for the working directory again (after a `chdir` of any kind).
pub fn refresh_cwd() {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the buffer is writable for its length.
    let p = unsafe { real::getcwd(buf.as_mut_ptr().cast(), buf.len()) };
    let cwd = if p.is_null() {
        None
    } else {
        let n = buf.iter().position(|b| *b == 0).unwrap_or(0);
        String::from_utf8(buf[..n].to_vec()).ok().filter(|s| s.starts_with('/')).map(Arc::new)
    };
    CWD.store(cwd);
}

/// Where a relative path starts.
pub enum Base<'a> {
    /// The working directory.
    Cwd,
    /// A directory the library serves, by its host path.
    Dir(&'a str),
}

/// The mount and Shoal path of `path` (bytes as the program gave them, without NUL), or
/// None if the kernel should take it.
pub fn resolve(base: Base<'_>, path: &[u8]) -> Option<Target> {
    if path.is_empty() || !any() {
        return None;
    }
    let path = std::str::from_utf8(path).ok()?;
    let full: std::borrow::Cow<str> = if path.starts_with('/') {
        path.into()
    } else {
        match base {
            Base::Cwd => {
                let cwd = CWD.load();
                let cwd = cwd.as_deref()?;
                format!("{cwd}/{path}").into()
            }
            Base::Dir(d) => format!("{d}/{path}").into(),
        }
    };
    classify(&full)
}

/// `full` is absolute: find its mount.
fn classify(full: &str) -> Option<Target> {
    // Most paths a program names are elsewhere: tell by the first component, without
    // allocating.
    let first = full.split('/').find(|c| !c.is_empty() && *c != ".")?;
    if !all().iter().any(|m| m.comps.first().is_some_and(|c| c == first)) {
        return None;
    }
    let comps: Vec<&str> = full.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    let mount =
        all().iter().find(|m| comps.len() >= m.comps.len() && m.comps.iter().zip(&comps).all(|(a, b)| a == b))?;
    let rest = &comps[mount.comps.len()..];
    if mount.covered.iter().any(|c| rest.len() >= c.len() && c.iter().zip(rest).all(|(a, b)| a == b)) {
        return None;
    }
    let mut shoal = String::with_capacity(full.len());
    for c in rest {
        shoal.push('/');
        shoal.push_str(c);
    }
    let host = format!("{}{shoal}", mount.dir);
    if shoal.is_empty() {
        shoal.push('/');
    } else if full.ends_with('/') || full.ends_with("/.") {
        // `dir/` and `dir/.` must name a directory.
        shoal.push('/');
    }
    Some(Target { mount, shoal, host })
}

/// An absolute host path below a mount point, as a Target (for descriptors' own paths).
pub fn target_of_host(host: &str) -> Option<Target> {
    if !host.starts_with('/') {
        return None;
    }
    classify(host)
}

// ---- reading /proc/self/mountinfo

/// One line of mountinfo, the fields we use.
struct Line {
    id: u64,
    major: u32,
    minor: u32,
    root: String,
    point: String,
    opts: String,
    fstype: String,
    source: String,
}

/// Undo mountinfo's octal escapes (`\040` is a space).
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

fn parse_line(l: &str) -> Option<Line> {
    let f: Vec<&str> = l.split(' ').collect();
    let sep = f.iter().position(|x| *x == "-")?;
    let (major, minor) = f.get(2)?.split_once(':')?;
    Some(Line {
        id: f.first()?.parse().ok()?,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        root: unescape(f.get(3)?),
        point: unescape(f.get(4)?),
        opts: f.get(5)?.to_string(),
        fstype: f.get(sep + 1)?.to_string(),
        source: unescape(f.get(sep + 2)?),
    })
}

fn comps_of(p: &str) -> Vec<String> {
    p.split('/').filter(|c| !c.is_empty() && *c != ".").map(str::to_string).collect()
}

fn read_mounts() -> Vec<Mount> {
    let settings = crate::settings::get();
    if !settings.enabled {
        return Vec::new();
    }
    let text = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(t) => t,
        Err(e) => {
            crate::debug::say(&format!("cannot read /proc/self/mountinfo ({e}): nothing served"));
            return Vec::new();
        }
    };
    // Later lines hide earlier ones on the same mount point.
    let mut lines: Vec<Line> = Vec::new();
    for l in text.lines().filter_map(parse_line) {
        lines.retain(|o| o.point != l.point);
        lines.push(l);
    }
    let mut mounts = Vec::new();
    for l in &lines {
        if l.fstype != "fuse.shoal" {
            continue;
        }
        let point = l.point.trim_end_matches('/').to_string();
        if point.is_empty() {
            continue; // Shoal mounted on / : nothing can be told apart; leave it to the kernel.
        }
        if let Some(only) = &settings.mounts {
            if !only.contains(&point) {
                continue;
            }
        }
        if l.root != "/" || l.opts.split(',').any(|o| o == "ro") {
            crate::debug::say(&format!("{point}: a subtree or read-only mount; left to the kernel"));
            continue;
        }
        let config = match l.source.strip_prefix("shoal:").map(PathBuf::from) {
            Some(p) if p.is_absolute() => p,
            _ => match &settings.config {
                Some(c) => c.clone(),
                None => {
                    crate::debug::say(&format!(
                        "{point}: source {} names no cluster configuration; set SHOAL_PRELOAD_CONFIG",
                        l.source
                    ));
                    continue;
                }
            },
        };
        let comps = comps_of(&point);
        let covered = lines
            .iter()
            .map(|o| comps_of(&o.point))
            .filter(|c| c.len() > comps.len() && c[..comps.len()] == comps[..])
            .map(|c| c[comps.len()..].to_vec())
            .collect();
        mounts.push(Mount {
            index: mounts.len(),
            dir: point,
            comps,
            dev: libc::makedev(l.major, l.minor),
            dev_major: l.major,
            dev_minor: l.minor,
            mnt_id: l.id,
            config,
            covered,
        });
    }
    for m in &mounts {
        crate::debug::say(&format!("serving {} (cluster {})", m.dir, m.config.display()));
    }
    mounts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_and_escapes() {
        let l = parse_line(
            "87 30 0:52 / /tmp/a\\040b/m rw,nosuid,nodev,relatime shared:45 - fuse.shoal shoal:/tmp/c.toml rw,user_id=0",
        )
        .unwrap();
        assert_eq!((l.id, l.major, l.minor), (87, 0, 52));
        assert_eq!(l.point, "/tmp/a b/m");
        assert_eq!(l.fstype, "fuse.shoal");
        assert_eq!(l.source, "shoal:/tmp/c.toml");
        assert_eq!(unescape("a\\134b"), "a\\b");
    }
}
