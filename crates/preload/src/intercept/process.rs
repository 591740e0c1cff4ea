//! Process calls: `fork`, `vfork`, the `exec` family, `posix_spawn`, `system`, `popen`,
//! `_exit`, `umask`, the `set*id` family and `chroot` (what each does to served
//! descriptors is in `fork.rs`).
//!
//! `vfork` is done as `fork`: a function cannot return twice on one stack, and a vfork
//! child may only exec or `_exit`, which a forked child may too.
//! After a process changes its identity or its root, paths are left to the kernel
//! (descriptors already open stay served, as the kernel keeps the opener's rights).

use crate::fork;
use crate::real;
use libc::{c_char, c_int, mode_t, pid_t, FILE};
use std::sync::atomic::{AtomicU32, Ordering};

static UMASK: AtomicU32 = AtomicU32::new(0o022);

/// Read the umask (at load time, when no other thread can race the two calls).
pub fn load_umask() {
    // SAFETY: umask has no preconditions; the value is put back at once.
    let m = unsafe {
        let m = real::umask(0);
        real::umask(m);
        m
    };
    UMASK.store(m, Ordering::Relaxed);
}

/// The process's umask.
pub fn current_umask() -> u32 {
    UMASK.load(Ordering::Relaxed)
}

#[no_mangle]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    // SAFETY: the caller's argument.
    let old = unsafe { real::umask(mask) };
    UMASK.store(mask & 0o777, Ordering::Relaxed);
    old
}

#[no_mangle]
pub unsafe extern "C" fn fork() -> pid_t {
    // The pthread_atfork handlers (fork.rs) do the work, also for forks made inside the
    // C library (daemon(3)...).
    // SAFETY: fork.
    unsafe { real::fork() }
}

#[no_mangle]
pub unsafe extern "C" fn vfork() -> pid_t {
    // SAFETY: fork.
    unsafe { real::fork() }
}

#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    fork::before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execve(path, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    fork::before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execv(path, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    fork::before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execvp(file, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    fork::before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execvpe(file, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's path (a served directory's path for its descriptor).
    let k = unsafe { super::KernelAt::new(dirfd, path) };
    fork::before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execveat(k.dirfd(), k.path(), argv, envp, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    if let Err(e) = super::open::convert_fd(fd) {
        crate::guard::set_errno(e);
        return -1;
    }
    fork::before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::fexecve(fd, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    path: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    fork::before_spawn();
    // SAFETY: the caller's arguments.
    unsafe { real::posix_spawn(pid, path, fa, attr, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    file: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    fork::before_spawn();
    // SAFETY: the caller's arguments.
    unsafe { real::posix_spawnp(pid, file, fa, attr, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    fork::before_spawn();
    // SAFETY: the caller's argument.
    unsafe { real::system(cmd) }
}

#[no_mangle]
pub unsafe extern "C" fn popen(cmd: *const c_char, mode: *const c_char) -> *mut FILE {
    fork::before_spawn();
    // SAFETY: the caller's arguments.
    unsafe { real::popen(cmd, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    fork::at_exit();
    // SAFETY: the caller's argument.
    unsafe { real::_exit(status) };
    // SAFETY: exit_group does not return; in case the C library's _exit was missing.
    unsafe { libc::syscall(libc::SYS_exit_group, status) };
    unreachable!("exit_group returned")
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: as _exit.
    unsafe { _exit(status) }
}

// ---- identity and root: paths go to the kernel afterwards

fn changed(r: c_int) -> c_int {
    if r == 0 {
        crate::mounts::paths_off();
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn setuid(id: libc::uid_t) -> c_int {
    changed(unsafe { real::setuid(id) })
}

#[no_mangle]
pub unsafe extern "C" fn seteuid(id: libc::uid_t) -> c_int {
    changed(unsafe { real::seteuid(id) })
}

#[no_mangle]
pub unsafe extern "C" fn setreuid(r: libc::uid_t, e: libc::uid_t) -> c_int {
    changed(unsafe { real::setreuid(r, e) })
}

#[no_mangle]
pub unsafe extern "C" fn setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t) -> c_int {
    changed(unsafe { real::setresuid(r, e, s) })
}

#[no_mangle]
pub unsafe extern "C" fn setgid(id: libc::gid_t) -> c_int {
    changed(unsafe { real::setgid(id) })
}

#[no_mangle]
pub unsafe extern "C" fn setegid(id: libc::gid_t) -> c_int {
    changed(unsafe { real::setegid(id) })
}

#[no_mangle]
pub unsafe extern "C" fn setregid(r: libc::gid_t, e: libc::gid_t) -> c_int {
    changed(unsafe { real::setregid(r, e) })
}

#[no_mangle]
pub unsafe extern "C" fn setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t) -> c_int {
    changed(unsafe { real::setresgid(r, e, s) })
}

#[no_mangle]
pub unsafe extern "C" fn setgroups(n: libc::size_t, list: *const libc::gid_t) -> c_int {
    changed(unsafe { real::setgroups(n, list) })
}

#[no_mangle]
pub unsafe extern "C" fn chroot(path: *const c_char) -> c_int {
    changed(unsafe { real::chroot(path) })
}
