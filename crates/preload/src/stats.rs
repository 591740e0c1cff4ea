//! Counts of the calls the library looked at, by family and by who answered: the native
//! client ("native", including errors it answered) or the C library ("kernel": the
//! call was handed on, e.g. a path that leaves Shoal, an unsupported flag, or a descriptor
//! turned into a kernel descriptor). Calls on descriptors and paths that are not Shoal's
//! are not counted.
//!
//! Off unless `SHOAL_PRELOAD_STATS=FILE` is set: then each process appends one line to
//! FILE when it exits (or execs), e.g.
//! `shoal-preload pid 123 native open=10 read=400 close=10 kernel mmap=1 converted=1`.
//! Tests use it to check that calls really were served in-process.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Families of calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Open,
    Close,
    Read,
    Write,
    Seek,
    Stat,
    Access,
    Sync,
    Truncate,
    Allocate,
    Copy,
    Fcntl,
    Dup,
    Mkdir,
    Unlink,
    Rename,
    Link,
    Readlink,
    Setattr,
    Dir,
    Chdir,
    /// Private mappings made as copies.
    Map,
    /// Calls that only the kernel can do on a Shoal descriptor (mmap, locks, xattrs,
    /// ioctl, fdopen...): each one turns the descriptor into a kernel one first.
    Kernel,
    /// Descriptors turned into kernel descriptors (fork, exec, kernel-only calls).
    Converted,
}

const OPS: [(Op, &str); 24] = [
    (Op::Open, "open"),
    (Op::Close, "close"),
    (Op::Read, "read"),
    (Op::Write, "write"),
    (Op::Seek, "seek"),
    (Op::Stat, "stat"),
    (Op::Access, "access"),
    (Op::Sync, "sync"),
    (Op::Truncate, "truncate"),
    (Op::Allocate, "allocate"),
    (Op::Copy, "copy"),
    (Op::Fcntl, "fcntl"),
    (Op::Dup, "dup"),
    (Op::Mkdir, "mkdir"),
    (Op::Unlink, "unlink"),
    (Op::Rename, "rename"),
    (Op::Link, "link"),
    (Op::Readlink, "readlink"),
    (Op::Setattr, "setattr"),
    (Op::Dir, "dir"),
    (Op::Chdir, "chdir"),
    (Op::Map, "mmap"),
    (Op::Kernel, "kernel-only"),
    (Op::Converted, "converted"),
];

/// Who answered a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Native,
    Kernel,
}

static ENABLED: AtomicBool = AtomicBool::new(false);
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static COUNTS: [[AtomicU64; OPS.len()]; 2] = [[ZERO; OPS.len()], [ZERO; OPS.len()]];

pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

pub fn count(op: Op, path: Path) {
    if ENABLED.load(Ordering::Relaxed) {
        COUNTS[path as usize][op as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// The line described above, or None when counting is off or nothing was counted.
pub fn line() -> Option<String> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let total: u64 = COUNTS.iter().flatten().map(|c| c.load(Ordering::Relaxed)).sum();
    if total == 0 {
        return None;
    }
    // SAFETY: getpid has no preconditions.
    let mut s = format!("shoal-preload pid {}", unsafe { libc::getpid() });
    for (path, name) in [(Path::Native, "native"), (Path::Kernel, "kernel")] {
        s.push(' ');
        s.push_str(name);
        for (op, op_name) in OPS {
            let n = COUNTS[path as usize][op as usize].load(Ordering::Relaxed);
            if n > 0 {
                s.push_str(&format!(" {op_name}={n}"));
            }
        }
    }
    Some(s)
}

/// Zero the counts (a child after fork starts its own).
pub fn reset() {
    for row in &COUNTS {
        for c in row {
            c.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_follows_the_enum() {
        for (i, (op, _)) in OPS.iter().enumerate() {
            assert_eq!(*op as usize, i);
        }
    }
}
