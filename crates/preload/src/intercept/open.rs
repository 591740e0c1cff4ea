//! Opening, closing and duplicating descriptors: `open` and its variants, `creat`,
//! `close`, `close_range`, `closefrom`, `dup`, `dup2`, `dup3`, `fcntl`.
//!
//! **open** serves regular files and directories with the flags it knows (access mode,
//! `O_CREAT`, `O_EXCL`, `O_TRUNC`, `O_APPEND`, `O_NONBLOCK`, `O_SYNC`/`O_DSYNC`,
//! `O_DIRECT`, `O_NOATIME`, `O_NOCTTY`, `O_LARGEFILE`, `O_DIRECTORY`, `O_NOFOLLOW`,
//! `O_CLOEXEC`, and `O_PATH` on a directory); anything else (`O_TMPFILE`, `O_ASYNC`,
//! `O_PATH` on a file, a creation mode of 0, which the client reads as "default") goes to
//! the kernel. The placeholder descriptor is taken first, so a process out of descriptors
//! gets EMFILE before anything is created, as from the kernel. The file itself is the
//! client's open: a walk through cached names and leases, and one request (a create, or
//! the lookup that fetches fresh attributes for close-to-open), checked by the servers.

use super::{dot_last, target, KernelAt};
use crate::cluster;
use crate::fd_table;
use crate::guard::{fail, serve, Out, Res};
use crate::listing::Listing;
use crate::mounts::Target;
use crate::node;
use crate::open_file::{self, Kind, OpenFile, State};
use crate::real;
use crate::stats::Op;
use libc::{c_char, c_int, c_uint};
use shoal_client::{may_access, Attr, FileKind, OpenFlags};
use std::sync::Arc;

/// Flags `open` serves (everything else goes to the kernel).
const KNOWN: c_int = libc::O_ACCMODE
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_NOCTTY
    | libc::O_TRUNC
    | libc::O_APPEND
    | libc::O_NONBLOCK
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_DIRECT
    | libc::O_LARGEFILE
    | libc::O_DIRECTORY
    | libc::O_NOFOLLOW
    | libc::O_NOATIME
    | libc::O_CLOEXEC
    | libc::O_PATH;

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    unsafe { open_at(dirfd, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    unsafe { open_at(dirfd, path, flags, mode) }
}

// The _FORTIFY_SOURCE variants (no mode: O_CREAT is not allowed with them).
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    unsafe { open_at(libc::AT_FDCWD, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    unsafe { open_at(libc::AT_FDCWD, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    unsafe { open_at(dirfd, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    unsafe { open_at(dirfd, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: libc::mode_t) -> c_int {
    unsafe { open_at(libc::AT_FDCWD, path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: libc::mode_t) -> c_int {
    unsafe { open_at(libc::AT_FDCWD, path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

pub unsafe fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::openat(k_dirfd.dirfd(), k_dirfd.path(), flags, mode) }
    };
    // SAFETY: the caller's path.
    let Some(t) = (unsafe { target(dirfd, path) }) else { return kernel() };
    serve(Op::Open, || open_native(&t, flags, mode), kernel)
}

/// A placeholder descriptor (see `open_file.rs`), `O_CLOEXEC` if asked.
pub fn placeholder(cloexec: bool) -> Res<c_int> {
    let flags = libc::O_PATH | if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe { real::open(c"/dev/null".as_ptr(), flags, 0) };
    if fd < 0 {
        return fail(crate::guard::errno());
    }
    if fd >= fd_table::MAX_FD {
        // SAFETY: our own descriptor.
        unsafe { real::close(fd) };
        return Err(Out::Kernel);
    }
    Ok(fd)
}

/// Serve `of` under the placeholder `fd`.
pub fn install(fd: c_int, of: OpenFile) -> c_int {
    // A stale entry (a number the program closed behind our back) is replaced.
    drop(fd_table::insert(fd, Arc::new(of)));
    fd
}

fn open_native(t: &Target, flags: c_int, mode: c_uint) -> Res<c_int> {
    if flags & !KNOWN != 0 || flags & libc::O_ACCMODE == libc::O_ACCMODE {
        return Err(Out::Kernel);
    }
    let creating = flags & libc::O_CREAT != 0;
    let perm = mode & 0o7777 & !super::process::current_umask();
    if creating && (perm == 0 || dot_last(t.shoal.as_bytes())) {
        return Err(Out::Kernel);
    }
    let c = cluster::of(t.mount)?;
    let fd = placeholder(flags & libc::O_CLOEXEC != 0)?;
    let r = open_file_at(&c, t, flags, perm).map(|of| install(fd, of));
    if r.is_err() {
        // SAFETY: the placeholder just taken, owned by nobody else.
        unsafe { real::close(fd) };
    }
    r
}

fn open_file_at(c: &Arc<cluster::Cluster>, t: &Target, flags: c_int, perm: u32) -> Res<OpenFile> {
    let nofollow = flags & libc::O_NOFOLLOW != 0;
    let acc = flags & libc::O_ACCMODE;
    if flags & libc::O_PATH != 0 {
        let a = c.block_on(c.client.resolve(&t.shoal, !nofollow))?;
        if a.kind != FileKind::Dir {
            return Err(Out::Kernel); // O_PATH of a file or link: the kernel's handle
        }
        return Ok(dir_file(t, &a, Kind::DirPath, flags));
    }
    if flags & libc::O_DIRECTORY != 0 {
        if flags & libc::O_CREAT != 0 {
            return Err(Out::Kernel);
        }
        let a = c.block_on(c.client.resolve(&t.shoal, !nofollow))?;
        return open_dir(c, t, &a, flags);
    }
    if nofollow {
        match c.block_on(c.client.lstat(&t.shoal)) {
            Ok(a) if a.kind == FileKind::Symlink => {
                special_check(c, &a)?;
                return fail(libc::ELOOP);
            }
            Ok(_) => {}
            Err(e) if e.errno.0 == libc::ENOENT && flags & libc::O_CREAT != 0 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let reads = acc != libc::O_WRONLY;
    let writes = acc != libc::O_RDONLY;
    let oflags = OpenFlags {
        read: reads,
        write: writes,
        append: false, // O_APPEND is the descriptor's: writes call `append` (io.rs)
        create: flags & libc::O_CREAT != 0,
        exclusive: flags & libc::O_EXCL != 0 && flags & libc::O_CREAT != 0,
        truncate: flags & libc::O_TRUNC != 0,
        perm,
        layout: None,
    };
    let file = c.block_on(c.client.open(&t.shoal, oflags))?;
    let attr = file.attr();
    if attr.kind == FileKind::Dir {
        drop(file);
        return open_dir(c, t, &attr, flags);
    }
    let node = node::share(c, t.mount.index, file, reads, writes)?;
    Ok(OpenFile::new(t.mount, attr.ino, Kind::File, t.host.clone(), flags, State::File(node)))
}

/// A symbolic link that stands for one of the mount's special files is the kernel's.
pub fn special_check(c: &cluster::Cluster, a: &Attr) -> Res<()> {
    if a.kind == FileKind::Symlink {
        let target = c.block_on(c.client.readlink_at(a.ino))?;
        if target.starts_with("shoal:special:") {
            return Err(Out::Kernel);
        }
    }
    Ok(())
}

fn open_dir(c: &cluster::Cluster, t: &Target, a: &Attr, flags: c_int) -> Res<OpenFile> {
    match a.kind {
        FileKind::Dir => {}
        // A link not followed: ELOOP or ENOTDIR depending on the flags; the kernel knows.
        FileKind::Symlink => return Err(Out::Kernel),
        _ => return fail(libc::ENOTDIR),
    }
    if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
        return fail(libc::EISDIR);
    }
    if !may_access(a, &c.cred, libc::R_OK as u32) {
        c.block_on(c.client.access(a.ino, libc::R_OK as u32))?;
    }
    Ok(dir_file(t, a, Kind::Dir, flags))
}

fn dir_file(t: &Target, a: &Attr, kind: Kind, flags: c_int) -> OpenFile {
    let parent = a.parent.map(|p| p.0).unwrap_or(a.ino.0);
    let flags = if kind == Kind::DirPath { libc::O_RDONLY } else { flags };
    OpenFile::new(t.mount, a.ino, kind, t.host.clone(), flags, State::Dir(Listing::new(a.ino, parent)))
}

// ---------------------------------------------------------------- close

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fd_table::get(fd).is_none() {
        // SAFETY: the caller's argument.
        return unsafe { real::close(fd) };
    }
    // SAFETY: as above.
    serve(Op::Close, || close_native(fd), || unsafe { real::close(fd) })
}

fn close_native(fd: c_int) -> Res<c_int> {
    let Some(of) = fd_table::remove(fd) else { return Err(Out::Kernel) };
    // The number is free for reuse only now, after the entry is gone.
    // SAFETY: the placeholder (or the kernel descriptor moved onto it) of this number.
    unsafe { real::close(fd) };
    release(of)
}

/// A descriptor that used `of` is gone: flush (as the kernel's FLUSH at every close),
/// and let the file go if it was the last.
pub fn release(of: Arc<OpenFile>) -> Res<c_int> {
    let node = match &*of.state.read() {
        State::File(n) => Some(n.clone()),
        _ => None,
    };
    drop(of); // the last reference drops the node's reference here
    if let Some(n) = node {
        n.flush()?;
        // Dropping `n` may be the node's last use: its close continues in the background.
    }
    Ok(0)
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        for (fd, _) in fd_table::all() {
            if (first..=last).contains(&(fd as c_uint)) {
                // SAFETY: a descriptor in the caller's range, closed as it asked.
                unsafe { close(fd) };
            }
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::close_range(first, last, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    // SAFETY: as close_range from `low` up.
    unsafe { close_range(low.max(0) as c_uint, c_uint::MAX, 0) };
}

// ---------------------------------------------------------------- dup

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let Some(of) = fd_table::get(fd) else {
        // SAFETY: the caller's argument.
        return unsafe { real::dup(fd) };
    };
    // SAFETY: dup of the placeholder gives a number that is the kernel's.
    serve(Op::Dup, || dup_to(of, unsafe { real::dup(fd) }), || unsafe { real::dup(fd) })
}

/// Serve `of` under `newfd`, a fresh duplicate of its placeholder (or -1 and errno).
fn dup_to(of: Arc<OpenFile>, newfd: c_int) -> Res<c_int> {
    if newfd < 0 {
        return fail(crate::guard::errno());
    }
    if let Some(old) = fd_table::insert(newfd, of) {
        let _ = release(old);
    }
    Ok(newfd)
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { dup_onto(fd, to, None) }
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { dup_onto(fd, to, Some(flags)) }
}

unsafe fn dup_onto(fd: c_int, to: c_int, flags: Option<c_int>) -> c_int {
    let real_call = || match flags {
        // SAFETY: the caller's arguments.
        None => unsafe { real::dup2(fd, to) },
        Some(f) => unsafe { real::dup3(fd, to, f) },
    };
    let src = fd_table::get(fd);
    if src.is_none() && fd_table::get(to).is_none() {
        return real_call();
    }
    serve(
        Op::Dup,
        || {
            let r = real_call();
            if r < 0 {
                return fail(crate::guard::errno());
            }
            if fd == to {
                return Ok(r); // dup2 of a number onto itself: nothing changes
            }
            let previous = match src {
                Some(of) => fd_table::insert(to, of),
                None => fd_table::remove(to),
            };
            if let Some(p) = previous {
                let _ = release(p); // dup2 ignores errors of the close it implies
            }
            Ok(r)
        },
        real_call,
    )
}

// ---------------------------------------------------------------- fcntl

/// The kernel's O_LARGEFILE, which F_GETFL shows on every 64-bit descriptor.
#[cfg(target_arch = "x86_64")]
const KERNEL_O_LARGEFILE: c_int = 0o100000;
#[cfg(not(target_arch = "x86_64"))]
const KERNEL_O_LARGEFILE: c_int = 0o400000;

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fcntl_any(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { fcntl_any(fd, cmd, arg) }
}

unsafe fn fcntl_any(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let real_call = || unsafe { real::fcntl(fd, cmd, arg) };
    let Some(of) = fd_table::get(fd) else { return real_call() };
    match cmd {
        // Per-descriptor flags live on the placeholder.
        libc::F_GETFD | libc::F_SETFD => real_call(),
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => serve(Op::Dup, || dup_to(of, real_call()), real_call),
        libc::F_GETFL => serve(
            Op::Fcntl,
            || {
                let extra = match of.kind {
                    Kind::File => 0,
                    Kind::Dir => libc::O_DIRECTORY,
                    Kind::DirPath => libc::O_PATH | libc::O_DIRECTORY,
                };
                Ok(of.flags() | extra | KERNEL_O_LARGEFILE)
            },
            real_call,
        ),
        libc::F_SETFL if arg as c_int & libc::O_ASYNC == 0 => serve(
            Op::Fcntl,
            || {
                if of.kind == Kind::DirPath {
                    return fail(libc::EBADF);
                }
                of.set_status_flags(arg as c_int);
                Ok(0)
            },
            real_call,
        ),
        // Locks, leases, notifications, pipe sizes, seals, O_ASYNC...: the kernel's.
        _ => super::kernel_only(fd, real_call),
    }
}

/// Hand every served descriptor to the kernel if `fd` is one (used before calls whose
/// C library implementation does I/O on descriptors internally).
pub fn convert_fd(fd: c_int) -> Result<(), i32> {
    match fd_table::get(fd) {
        Some(of) => {
            let _g = crate::guard::Guard::enter();
            open_file::convert(&of)
        }
        None => Ok(()),
    }
}
