//! The namespace and attribute changes: `mkdir`, `unlink`, `rmdir`, `rename`, `link`,
//! `symlink`, `readlink`, `chmod`, `chown`, `truncate`, `utimensat` and their `*at`, `f*`
//! and `l*` forms. Each is the client's call of the same name (one request to the server
//! of the name or inode, see docs/architecture.md "Request paths"), as the process's user,
//! the process's umask applied to new modes. Calls whose two paths are on different
//! mounts, paths ending in `.` or `..`, and flags without a native form go to the kernel.

use super::open::special_check;
use super::{bytes, dot_last, target, KernelAt};
use crate::attrs::{time_set, timespec_of};
use crate::cluster;
use crate::fd_table;
use crate::guard::{fail, serve, Out, Res};
use crate::mounts::Target;
use crate::node;
use crate::open_file::{self, Kind};
use crate::real;
use crate::stats::Op;
use libc::{c_char, c_int, c_uint, mode_t, size_t, ssize_t};
use shoal_client::{Ino, SetAttrs, TimeSet};

/// Whether the path as given ends in `.` or `..` (the kernel answers those).
unsafe fn dotted(path: *const c_char) -> bool {
    // SAFETY: the caller's path.
    unsafe { bytes(path) }.is_some_and(dot_last)
}

// ---------------------------------------------------------------- mkdir

unsafe fn mkdir_at(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::mkdirat(k_dirfd.dirfd(), k_dirfd.path(), mode) }
    };
    // SAFETY: the caller's arguments.
    let Some(t) = (unsafe { target(dirfd, path) }).filter(|_| !unsafe { dotted(path) }) else { return kernel() };
    serve(
        Op::Mkdir,
        || {
            let c = cluster::of(t.mount)?;
            // As the kernel: the sticky bit is kept, set-id bits are not taken from the mode.
            let perm = mode & 0o1777 & !super::process::current_umask();
            c.block_on(c.client.mkdir(&t.shoal, perm))?;
            Ok(0)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { mkdir_at(libc::AT_FDCWD, path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    unsafe { mkdir_at(dirfd, path, mode) }
}

// ---------------------------------------------------------------- unlink, rmdir

unsafe fn unlink_at(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::unlinkat(k_dirfd.dirfd(), k_dirfd.path(), flags) }
    };
    if flags & !libc::AT_REMOVEDIR != 0 {
        return kernel();
    }
    // SAFETY: the caller's arguments.
    let Some(t) = (unsafe { target(dirfd, path) }).filter(|_| !unsafe { dotted(path) }) else { return kernel() };
    serve(
        Op::Unlink,
        || {
            let c = cluster::of(t.mount)?;
            if flags & libc::AT_REMOVEDIR != 0 {
                c.block_on(c.client.rmdir(&t.shoal))?;
            } else {
                c.block_on(c.client.unlink(&t.shoal))?;
            }
            Ok(0)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    unsafe { unlink_at(libc::AT_FDCWD, path, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    unsafe { unlink_at(dirfd, path, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    unsafe { unlink_at(libc::AT_FDCWD, path, libc::AT_REMOVEDIR) }
}

// ---------------------------------------------------------------- rename, link, symlink

/// Both paths of a two-path call, on one mount, or None for the kernel.
unsafe fn pair(od: c_int, old: *const c_char, nd: c_int, new: *const c_char) -> Option<(Target, Target)> {
    // SAFETY: the caller's arguments.
    unsafe {
        if dotted(old) || dotted(new) {
            return None;
        }
        let a = target(od, old)?;
        let b = target(nd, new)?;
        std::ptr::eq(a.mount, b.mount).then_some((a, b))
    }
}

unsafe fn rename_at(od: c_int, old: *const c_char, nd: c_int, new: *const c_char, flags: c_uint) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_od = unsafe { KernelAt::new(od, old) };
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_nd = unsafe { KernelAt::new(nd, new) };
        // SAFETY: the caller's arguments.
        unsafe { real::renameat2(k_od.dirfd(), k_od.path(), k_nd.dirfd(), k_nd.path(), flags) }
    };
    if flags != 0 {
        return kernel(); // RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT
    }
    // SAFETY: the caller's arguments.
    let Some((a, b)) = (unsafe { pair(od, old, nd, new) }) else { return kernel() };
    serve(
        Op::Rename,
        || {
            let c = cluster::of(a.mount)?;
            c.block_on(c.client.rename(&a.shoal, &b.shoal))?;
            open_file::renamed(&a.host, &b.host);
            Ok(0)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    unsafe { rename_at(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat(od: c_int, old: *const c_char, nd: c_int, new: *const c_char) -> c_int {
    unsafe { rename_at(od, old, nd, new, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    od: c_int,
    old: *const c_char,
    nd: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    unsafe { rename_at(od, old, nd, new, flags) }
}

unsafe fn link_at(od: c_int, old: *const c_char, nd: c_int, new: *const c_char, flags: c_int) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_od = unsafe { KernelAt::new(od, old) };
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_nd = unsafe { KernelAt::new(nd, new) };
        // SAFETY: the caller's arguments.
        unsafe { real::linkat(k_od.dirfd(), k_od.path(), k_nd.dirfd(), k_nd.path(), flags) }
    };
    if flags != 0 {
        return kernel(); // AT_SYMLINK_FOLLOW, AT_EMPTY_PATH
    }
    // SAFETY: the caller's arguments.
    let Some((a, b)) = (unsafe { pair(od, old, nd, new) }) else { return kernel() };
    serve(
        Op::Link,
        || {
            let c = cluster::of(a.mount)?;
            c.block_on(c.client.link(&a.shoal, &b.shoal))?;
            Ok(0)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn link(old: *const c_char, new: *const c_char) -> c_int {
    unsafe { link_at(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn linkat(od: c_int, old: *const c_char, nd: c_int, new: *const c_char, flags: c_int) -> c_int {
    unsafe { link_at(od, old, nd, new, flags) }
}

unsafe fn symlink_at(target_text: *const c_char, nd: c_int, new: *const c_char) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_nd = unsafe { KernelAt::new(nd, new) };
        // SAFETY: the caller's arguments.
        unsafe { real::symlinkat(target_text, k_nd.dirfd(), k_nd.path()) }
    };
    // SAFETY: the caller's arguments.
    let text = unsafe { bytes(target_text) }.and_then(|b| std::str::from_utf8(b).ok());
    let (Some(text), Some(t)) = (text, unsafe { target(nd, new) }.filter(|_| !unsafe { dotted(new) })) else {
        return kernel();
    };
    if text.is_empty() {
        return kernel(); // ENOENT, as the kernel says
    }
    serve(
        Op::Link,
        || {
            let c = cluster::of(t.mount)?;
            c.block_on(c.client.symlink(text, &t.shoal))?;
            Ok(0)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn symlink(target_text: *const c_char, new: *const c_char) -> c_int {
    unsafe { symlink_at(target_text, libc::AT_FDCWD, new) }
}

#[no_mangle]
pub unsafe extern "C" fn symlinkat(target_text: *const c_char, nd: c_int, new: *const c_char) -> c_int {
    unsafe { symlink_at(target_text, nd, new) }
}

// ---------------------------------------------------------------- readlink

/// `/proc/self/fd/N` of a served descriptor: the kernel would show the placeholder.
fn fd_link(path: &[u8]) -> Option<String> {
    let rest =
        [&b"/proc/self/fd/"[..], b"/dev/fd/", b"/proc/thread-self/fd/"].iter().find_map(|p| path.strip_prefix(*p))?;
    let fd: i32 = std::str::from_utf8(rest).ok()?.parse().ok()?;
    Some(fd_table::get(fd)?.host().to_string())
}

unsafe fn readlink_at(dirfd: c_int, path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::readlinkat(k_dirfd.dirfd(), k_dirfd.path(), buf, n) }
    };
    let give = |text: &[u8]| -> Res<ssize_t> {
        if n == 0 {
            return fail(libc::EINVAL);
        }
        let k = text.len().min(n);
        // SAFETY: the caller's buffer of `n` bytes; readlink does not add a NUL.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), k) };
        Ok(k as ssize_t)
    };
    // SAFETY: the caller's path.
    if let Some(host) = unsafe { bytes(path) }.and_then(fd_link) {
        return serve(Op::Readlink, || give(host.as_bytes()), kernel);
    }
    // SAFETY: the caller's arguments.
    let Some(t) = (unsafe { target(dirfd, path) }) else { return kernel() };
    serve(
        Op::Readlink,
        || {
            let c = cluster::of(t.mount)?;
            let text = c.block_on(c.client.readlink(&t.shoal))?;
            if text.starts_with("shoal:special:") {
                return Err(Out::Kernel); // a special file: EINVAL from the kernel
            }
            give(text.as_bytes())
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t {
    unsafe { readlink_at(libc::AT_FDCWD, path, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t {
    unsafe { readlink_at(dirfd, path, buf, n) }
}

// ---------------------------------------------------------------- attributes

/// Set `set` on the inode `path` names (following a final symlink if `follow`). A file
/// this process has open with writes in flight is drained first, and a size change goes
/// through its handle, so that its writes land before the change and it knows the size.
fn setattr_path(t: &Target, follow: bool, set: SetAttrs) -> Res<c_int> {
    let c = cluster::of(t.mount)?;
    let a = c.block_on(c.client.resolve(&t.shoal, follow))?;
    special_check(&c, &a)?;
    setattr_ino(t.mount.index, &c, a.ino, set)
}

fn setattr_ino(mount: usize, c: &cluster::Cluster, ino: Ino, set: SetAttrs) -> Res<c_int> {
    if let Some(n) = node::find(mount, ino) {
        match set.size {
            Some(size) if n.writable && set == (SetAttrs { size: Some(size), ..Default::default() }) => {
                n.cluster.block_on(n.file().set_len(size))?;
                n.wrote();
                return Ok(0);
            }
            _ => {
                n.cluster.block_on(n.file().drain())?;
                n.wrote(); // its attributes are stale now
            }
        }
    }
    c.block_on(c.client.setattr(ino, set))?;
    Ok(0)
}

/// Set `set` on a served descriptor's inode.
fn setattr_fd(fd: c_int, set: SetAttrs) -> Res<c_int> {
    let Some(of) = fd_table::get(fd) else { return Err(Out::Kernel) };
    if of.kind == Kind::DirPath {
        return fail(libc::EBADF);
    }
    let c = cluster::of(of.mount)?;
    setattr_ino(of.mount.index, &c, of.ino, set)
}

fn id(v: u32) -> Option<u32> {
    (v != u32::MAX).then_some(v)
}

unsafe fn chmod_at(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::fchmodat(k_dirfd.dirfd(), k_dirfd.path(), mode, flags) }
    };
    if flags != 0 {
        return kernel(); // AT_SYMLINK_NOFOLLOW: links have no mode of their own on Linux
    }
    // SAFETY: the caller's arguments.
    let Some(t) = (unsafe { target(dirfd, path) }) else { return kernel() };
    let set = SetAttrs { perm: Some(mode & 0o7777), ..Default::default() };
    serve(Op::Setattr, || setattr_path(&t, true, set), kernel)
}

#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { chmod_at(libc::AT_FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int {
    unsafe { chmod_at(dirfd, path, mode, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::fchmod(fd, mode) };
    if fd_table::get(fd).is_none() {
        return kernel();
    }
    serve(Op::Setattr, || setattr_fd(fd, SetAttrs { perm: Some(mode & 0o7777), ..Default::default() }), kernel)
}

unsafe fn chown_at(dirfd: c_int, path: *const c_char, uid: u32, gid: u32, flags: c_int) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::fchownat(k_dirfd.dirfd(), k_dirfd.path(), uid, gid, flags) }
    };
    let set = SetAttrs { uid: id(uid), gid: id(gid), ..Default::default() };
    // SAFETY: the caller's path.
    let empty = unsafe { bytes(path) }.is_some_and(|p| p.is_empty());
    if empty && flags & libc::AT_EMPTY_PATH != 0 && fd_table::get(dirfd).is_some() {
        return serve(Op::Setattr, || setattr_fd(dirfd, set), kernel);
    }
    if flags & !libc::AT_SYMLINK_NOFOLLOW != 0 {
        return kernel();
    }
    // SAFETY: the caller's arguments.
    let Some(t) = (unsafe { target(dirfd, path) }) else { return kernel() };
    serve(Op::Setattr, || setattr_path(&t, flags & libc::AT_SYMLINK_NOFOLLOW == 0, set), kernel)
}

#[no_mangle]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    unsafe { chown_at(libc::AT_FDCWD, path, uid, gid, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    unsafe { chown_at(libc::AT_FDCWD, path, uid, gid, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    unsafe { chown_at(dirfd, path, uid, gid, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::fchown(fd, uid, gid) };
    if fd_table::get(fd).is_none() {
        return kernel();
    }
    serve(Op::Setattr, || setattr_fd(fd, SetAttrs { uid: id(uid), gid: id(gid), ..Default::default() }), kernel)
}

unsafe fn truncate_path(path: *const c_char, len: i64) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::truncate64(path, len) };
    // SAFETY: the caller's path.
    let Some(t) = (unsafe { target(libc::AT_FDCWD, path) }) else { return kernel() };
    serve(
        Op::Truncate,
        || {
            if len < 0 {
                return fail(libc::EINVAL);
            }
            setattr_path(&t, true, SetAttrs { size: Some(len as u64), ..Default::default() })
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: libc::off_t) -> c_int {
    unsafe { truncate_path(path, len) }
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: libc::off64_t) -> c_int {
    unsafe { truncate_path(path, len) }
}

// ---------------------------------------------------------------- times

/// The change `utimensat`'s `times` asks for (NULL: both now).
unsafe fn times_of(times: *const libc::timespec) -> Result<SetAttrs, i32> {
    if times.is_null() {
        return Ok(SetAttrs { atime: Some(TimeSet::Now), mtime: Some(TimeSet::Now), ..Default::default() });
    }
    // SAFETY: the caller's array of two timespecs.
    let (a, m) = unsafe { (&*times, &*times.add(1)) };
    Ok(SetAttrs { atime: time_set(a)?, mtime: time_set(m)?, ..Default::default() })
}

unsafe fn utimens_at(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int {
    let kernel = || {
        // SAFETY: the caller's path (a served directory's path for its descriptor).
        let k_dirfd = unsafe { KernelAt::new(dirfd, path) };
        // SAFETY: the caller's arguments.
        unsafe { real::utimensat(k_dirfd.dirfd(), k_dirfd.path(), times, flags) }
    };
    // SAFETY: the caller's array.
    let set = match unsafe { times_of(times) } {
        Ok(s) => s,
        Err(_) => return kernel(), // EINVAL from the kernel
    };
    if path.is_null() {
        // futimens(dirfd, times) as utimensat(fd, NULL, times, 0).
        if flags != 0 || fd_table::get(dirfd).is_none() {
            return kernel();
        }
        return serve(Op::Setattr, || setattr_fd(dirfd, set), kernel);
    }
    if flags & !libc::AT_SYMLINK_NOFOLLOW != 0 {
        return kernel();
    }
    // SAFETY: the caller's arguments.
    let Some(t) = (unsafe { target(dirfd, path) }) else { return kernel() };
    serve(
        Op::Setattr,
        || {
            if set.atime.is_none() && set.mtime.is_none() {
                // Nothing to change, but the path must exist.
                let c = cluster::of(t.mount)?;
                c.block_on(c.client.resolve(&t.shoal, flags & libc::AT_SYMLINK_NOFOLLOW == 0))?;
                return Ok(0);
            }
            setattr_path(&t, flags & libc::AT_SYMLINK_NOFOLLOW == 0, set)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    unsafe { utimens_at(dirfd, path, times, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::futimens(fd, times) };
    if fd_table::get(fd).is_none() {
        return kernel();
    }
    // SAFETY: the caller's array.
    match unsafe { times_of(times) } {
        Ok(set) => serve(Op::Setattr, || setattr_fd(fd, set), kernel),
        Err(_) => kernel(),
    }
}

/// `utimes`-style `timeval[2]` (NULL: now) as `timespec[2]`.
unsafe fn timevals(tv: *const libc::timeval) -> Result<Option<[libc::timespec; 2]>, i32> {
    if tv.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's array of two timevals.
    let (a, m) = unsafe { (&*tv, &*tv.add(1)) };
    Ok(Some([timespec_of(a)?, timespec_of(m)?]))
}

unsafe fn utimes_any(
    dirfd: c_int,
    path: *const c_char,
    tv: *const libc::timeval,
    flags: c_int,
    kernel: impl FnOnce() -> c_int,
) -> c_int {
    // SAFETY: the caller's array.
    match unsafe { timevals(tv) } {
        Ok(None) => unsafe { utimens_at(dirfd, path, std::ptr::null(), flags) },
        Ok(Some(ts)) => unsafe { utimens_at(dirfd, path, ts.as_ptr(), flags) },
        Err(_) => kernel(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    unsafe { utimes_any(libc::AT_FDCWD, path, tv, 0, || real::utimes(path, tv)) }
}

#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    unsafe { utimes_any(libc::AT_FDCWD, path, tv, libc::AT_SYMLINK_NOFOLLOW, || real::lutimes(path, tv)) }
}

#[no_mangle]
pub unsafe extern "C" fn futimesat(dirfd: c_int, path: *const c_char, tv: *const libc::timeval) -> c_int {
    unsafe { utimes_any(dirfd, path, tv, 0, || real::futimesat(dirfd, path, tv)) }
}

#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    if fd_table::get(fd).is_none() {
        return unsafe { real::futimes(fd, tv) };
    }
    match unsafe { timevals(tv) } {
        Ok(None) => unsafe { futimens(fd, std::ptr::null()) },
        Ok(Some(ts)) => unsafe { futimens(fd, ts.as_ptr()) },
        Err(_) => unsafe { real::futimes(fd, tv) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
    if times.is_null() {
        return unsafe { utimens_at(libc::AT_FDCWD, path, std::ptr::null(), 0) };
    }
    // SAFETY: the caller's struct.
    let t = unsafe { &*times };
    let ts = [libc::timespec { tv_sec: t.actime, tv_nsec: 0 }, libc::timespec { tv_sec: t.modtime, tv_nsec: 0 }];
    unsafe { utimens_at(libc::AT_FDCWD, path, ts.as_ptr(), 0) }
}
