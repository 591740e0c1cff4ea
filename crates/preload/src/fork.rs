//! Processes: what happens to served descriptors at `fork`, `exec`, spawning and exit.
//!
//! * **fork** (and `vfork`, done as a fork, and every fork the C library makes that runs
//!   the `pthread_atfork` handlers): before it, every served *file* is handed to the kernel
//!   (`open_file::convert`: flushed, reopened through the mount at its offset, put under
//!   its numbers), so that parent and child share one kernel open file description and
//!   its offset, as POSIX promises — a child that writes on at the shared offset, or a
//!   parent that reads on after its child, just works. The client's runtime and
//!   connections do not survive in the child: the child forgets them (never drops them)
//!   and makes a new client at its first call. Served *directories* stay served in both
//!   (the child gets a fresh copy of each, same path, same position). A file that could
//!   not be converted (its path no longer leads to it) stays served in the parent and is
//!   reopened by inode number in the child, with the offset it had (not shared any more).
//! * **exec** (`execve` and the `execv*` family, `fexecve`, `execveat`): descriptors
//!   without `FD_CLOEXEC` survive exec, so they are handed to the kernel first; the
//!   others are flushed (the new program cannot do it), and the closes in flight are
//!   waited for. `execl*` are variadic and cannot be intercepted in Rust; they reach
//!   `execve` inside the C library unseen: a served descriptor without `FD_CLOEXEC` opened
//!   *after* the last fork then reaches the new program as a placeholder (docs/preload.md).
//! * **posix_spawn**, **system**, **popen**: every served descriptor is handed to the
//!   kernel first (the child's file actions may duplicate any of them).
//! * **exit** (`exit`, `_exit`, `_Exit`): what was written is flushed and the closes in
//!   flight (fsync, release of removed files) are waited for, as the kernel would keep
//!   the data of a process that exits. A process killed by a signal loses the writes
//!   still in flight (set `SHOAL_PRELOAD_WRITE_BEHIND=0` if that matters).

use crate::fd_table;
use crate::guard::Guard;
use crate::open_file::{self, Kind};
use crate::{cluster, node, real, stats};
use std::time::Duration;

/// How long exit and exec wait for closes in flight.
const CLOSE_WAIT: Duration = Duration::from_secs(60);

pub fn register() {
    // SAFETY: registers three `extern "C" fn()` handlers; no preconditions.
    unsafe {
        libc::pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child));
    }
}

/// Hand every served file to the kernel (before fork and spawn). Directories too if
/// `dirs` (spawn, exec: the child is another program).
pub fn convert_all(dirs: bool, only_inherited: bool) {
    let _g = Guard::enter();
    for (fd, of) in fd_table::all() {
        if of.kind != Kind::File && !dirs {
            continue;
        }
        // SAFETY: F_GETFD on a descriptor number this process holds.
        let inherited = unsafe { real::fcntl(fd, libc::F_GETFD, 0) } & libc::FD_CLOEXEC == 0;
        if only_inherited && !inherited {
            continue;
        }
        if let Err(e) = open_file::convert(&of) {
            crate::debug::say(&format!("descriptor {fd} ({}) stays served: errno {e}", of.host()));
        }
    }
}

extern "C" fn before_fork() {
    convert_all(false, false);
}

extern "C" fn after_fork_parent() {}

extern "C" fn after_fork_child() {
    let _g = Guard::enter();
    cluster::forget_after_fork();
    node::forget_after_fork();
    stats::reset();
    // Rebuild the table with fresh entries (the old ones hold the parent's client and
    // locks that threads which did not follow the fork may hold).
    for (fd, of) in fd_table::all() {
        match open_file::copy_for_child(&of) {
            Some(copy) => fd_table::replace_forgetting(fd, Some(std::sync::Arc::new(copy))),
            None => {
                if let Some(k) = open_file::kernel_fd(&of) {
                    // SAFETY: descriptor calls on numbers this process holds.
                    unsafe {
                        let cloexec = real::fcntl(fd, libc::F_GETFD, 0) & libc::FD_CLOEXEC != 0;
                        real::dup3(k, fd, if cloexec { libc::O_CLOEXEC } else { 0 });
                    }
                }
                fd_table::replace_forgetting(fd, None);
            }
        }
        std::mem::forget(of);
    }
}

/// Before the process image is replaced: inherited descriptors to the kernel, the rest
/// flushed, closes in flight finished, the counts written.
pub fn before_exec() {
    convert_all(true, true);
    let _g = Guard::enter();
    node::flush_all();
    node::wait_background(CLOSE_WAIT);
    write_stats();
}

/// Before `posix_spawn`, `system`, `popen`.
pub fn before_spawn() {
    convert_all(true, false);
}

/// At exit: flush, wait for closes, write the counts.
pub fn at_exit() {
    let _g = Guard::enter();
    node::flush_all();
    node::wait_background(CLOSE_WAIT);
    write_stats();
}

fn write_stats() {
    let (Some(line), Some(path)) = (stats::line(), crate::settings::get().stats_file.as_ref()) else { return };
    let line = format!("{line}\n");
    let Ok(cpath) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return };
    // SAFETY: open/write/close of a file of our own with valid buffers.
    unsafe {
        let fd = real::open(cpath.as_ptr(), libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC, 0o644);
        if fd >= 0 {
            real::write(fd, line.as_ptr().cast(), line.len());
            real::close(fd);
        }
    }
    // Counted once: an exec that fails, then an exit, writes only what came after.
    stats::reset();
}
