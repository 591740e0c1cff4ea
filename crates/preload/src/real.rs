//! The C library's own functions, found with `dlsym(RTLD_NEXT, name)`: where every call the
//! library does not serve goes, and what the library itself calls on descriptors and paths
//! it hands to the kernel.
//!
//! Each function looks its symbol up at its first call and keeps the pointer (a relaxed
//! atomic: two threads racing store the same value). A symbol the C library lacks (an
//! old glibc without `statx`, say) makes the call fail with ENOSYS, as the kernel would for
//! a missing system call. `dlsym` itself calls no function this library intercepts (it
//! may allocate, and `malloc` is not intercepted), so the lookup cannot recurse.

use libc::{c_char, c_int, c_long, c_uint, c_void, mode_t, off64_t, size_t, ssize_t, DIR, FILE};
use std::ffi::CStr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The address of the next definition of `name` after this library, cached in `slot`.
fn sym(slot: &AtomicPtr<c_void>, name: &str) -> *mut c_void {
    let p = slot.load(Ordering::Relaxed);
    if !p.is_null() {
        return p;
    }
    let Ok(cname) = CStr::from_bytes_with_nul(name.as_bytes()) else { return std::ptr::null_mut() };
    // SAFETY: `cname` is NUL-terminated; RTLD_NEXT is a valid pseudo-handle.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, cname.as_ptr()) };
    slot.store(p, Ordering::Relaxed);
    p
}

/// What a failed call of each return type answers.
pub trait Fail: Copy {
    const FAIL: Self;
}
impl Fail for c_int {
    const FAIL: Self = -1;
}
impl Fail for ssize_t {
    const FAIL: Self = -1;
}
impl<T> Fail for *mut T {
    const FAIL: Self = std::ptr::null_mut();
}

fn missing<T: Fail>() -> T {
    crate::guard::set_errno(libc::ENOSYS);
    T::FAIL
}

/// One wrapper per line: `fn name(args) -> ret;` calls the C library's `name`.
macro_rules! real {
    ($( fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty; )*) => {$(
        #[allow(clippy::missing_safety_doc, clippy::too_many_arguments, non_snake_case)]
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
            let p = sym(&SLOT, concat!(stringify!($name), "\0"));
            if p.is_null() {
                return missing();
            }
            // SAFETY: the C library's `$name` has this signature (its declaration in the
            // libc crate); the caller upholds its contract.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(p) };
            unsafe { f($($arg),*) }
        }
    )*};
}

real! {
    fn close(fd: c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t;
    fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t;
    fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    fn preadv64(fd: c_int, iov: *const libc::iovec, n: c_int, off: off64_t) -> ssize_t;
    fn pwritev64(fd: c_int, iov: *const libc::iovec, n: c_int, off: off64_t) -> ssize_t;
    fn preadv64v2(fd: c_int, iov: *const libc::iovec, n: c_int, off: off64_t, flags: c_int) -> ssize_t;
    fn pwritev64v2(fd: c_int, iov: *const libc::iovec, n: c_int, off: off64_t, flags: c_int) -> ssize_t;
    fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t;
    fn fsync(fd: c_int) -> c_int;
    fn fdatasync(fd: c_int) -> c_int;
    fn ftruncate64(fd: c_int, len: off64_t) -> c_int;
    fn truncate64(path: *const c_char, len: off64_t) -> c_int;
    fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int;
    fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int;
    fn posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int;
    fn sendfile64(out: c_int, inp: c_int, off: *mut off64_t, n: size_t) -> ssize_t;
    fn copy_file_range(fin: c_int, oin: *mut off64_t, fout: c_int, oout: *mut off64_t, n: size_t, flags: c_uint) -> ssize_t;
    fn dup(fd: c_int) -> c_int;
    fn dup2(fd: c_int, to: c_int) -> c_int;
    fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int;
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int;
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int;
    fn __xstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int;
    fn __lxstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int;
    fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int;
    fn __fxstatat64(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int;
    fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int;
    fn fstatfs64(fd: c_int, buf: *mut libc::statfs64) -> c_int;
    fn statfs64(path: *const c_char, buf: *mut libc::statfs64) -> c_int;
    fn fstatvfs64(fd: c_int, buf: *mut libc::statvfs64) -> c_int;
    fn statvfs64(path: *const c_char, buf: *mut libc::statvfs64) -> c_int;
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    fn renameat2(od: c_int, old: *const c_char, nd: c_int, new: *const c_char, flags: c_uint) -> c_int;
    fn linkat(od: c_int, old: *const c_char, nd: c_int, new: *const c_char, flags: c_int) -> c_int;
    fn symlinkat(target: *const c_char, nd: c_int, new: *const c_char) -> c_int;
    fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t;
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int;
    fn fchmod(fd: c_int, mode: mode_t) -> c_int;
    fn fchownat(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, flags: c_int) -> c_int;
    fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fn utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int;
    fn futimens(fd: c_int, times: *const libc::timespec) -> c_int;
    fn utimes(path: *const c_char, times: *const libc::timeval) -> c_int;
    fn lutimes(path: *const c_char, times: *const libc::timeval) -> c_int;
    fn futimes(fd: c_int, times: *const libc::timeval) -> c_int;
    fn futimesat(dirfd: c_int, path: *const c_char, times: *const libc::timeval) -> c_int;
    fn opendir(path: *const c_char) -> *mut DIR;
    fn fdopendir(fd: c_int) -> *mut DIR;
    fn readdir64(d: *mut DIR) -> *mut libc::dirent64;
    fn readdir64_r(d: *mut DIR, e: *mut libc::dirent64, out: *mut *mut libc::dirent64) -> c_int;
    fn closedir(d: *mut DIR) -> c_int;
    fn dirfd(d: *mut DIR) -> c_int;
    fn rewinddir(d: *mut DIR) -> ();
    fn telldir(d: *mut DIR) -> c_long;
    fn seekdir(d: *mut DIR, pos: c_long) -> ();
    fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn chdir(path: *const c_char) -> c_int;
    fn fchdir(fd: c_int) -> c_int;
    fn getcwd(buf: *mut c_char, n: size_t) -> *mut c_char;
    fn chroot(path: *const c_char) -> c_int;
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off64_t) -> *mut c_void;
    fn flock(fd: c_int, op: c_int) -> c_int;
    fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int;
    fn fgetxattr(fd: c_int, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn fsetxattr(fd: c_int, name: *const c_char, v: *const c_void, n: size_t, flags: c_int) -> c_int;
    fn flistxattr(fd: c_int, list: *mut c_char, n: size_t) -> ssize_t;
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int;
    fn getxattr(path: *const c_char, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn setxattr(path: *const c_char, name: *const c_char, v: *const c_void, n: size_t, flags: c_int) -> c_int;
    fn listxattr(path: *const c_char, list: *mut c_char, n: size_t) -> ssize_t;
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int;
    fn splice(fin: c_int, oin: *mut off64_t, fout: c_int, oout: *mut off64_t, n: size_t, flags: c_uint) -> ssize_t;
    fn tee(fin: c_int, fout: c_int, n: size_t, flags: c_uint) -> ssize_t;
    fn sync_file_range(fd: c_int, off: off64_t, n: off64_t, flags: c_uint) -> c_int;
    fn syncfs(fd: c_int) -> c_int;
    fn readahead(fd: c_int, off: off64_t, n: size_t) -> ssize_t;
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE;
    fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE;
    fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int;
    fn isatty(fd: c_int) -> c_int;
    fn umask(mask: mode_t) -> mode_t;
    fn fork() -> libc::pid_t;
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn execveat(dirfd: c_int, path: *const c_char, argv: *const *const c_char, envp: *const *const c_char, flags: c_int) -> c_int;
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn posix_spawn(pid: *mut libc::pid_t, path: *const c_char, fa: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, fa: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    fn system(cmd: *const c_char) -> c_int;
    fn popen(cmd: *const c_char, mode: *const c_char) -> *mut FILE;
    fn _exit(status: c_int) -> ();
    fn _Exit(status: c_int) -> ();
    fn setuid(id: libc::uid_t) -> c_int;
    fn seteuid(id: libc::uid_t) -> c_int;
    fn setreuid(r: libc::uid_t, e: libc::uid_t) -> c_int;
    fn setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t) -> c_int;
    fn setgid(id: libc::gid_t) -> c_int;
    fn setegid(id: libc::gid_t) -> c_int;
    fn setregid(r: libc::gid_t, e: libc::gid_t) -> c_int;
    fn setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t) -> c_int;
    fn setgroups(n: size_t, list: *const libc::gid_t) -> c_int;
}

impl Fail for () {
    const FAIL: Self = ();
}
impl Fail for c_long {
    const FAIL: Self = -1;
}
impl Fail for mode_t {
    const FAIL: Self = 0;
}

// ---- the variadic ones: called through a variadic pointer type, so the call sets up
// the arguments exactly as a C caller would (on x86-64, %al counts vector registers).

macro_rules! variadic_sym {
    ($name:literal) => {{
        static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
        sym(&SLOT, concat!($name, "\0"))
    }};
}

/// `open(path, flags, mode)`.
pub unsafe fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let p = variadic_sym!("open64");
    if p.is_null() {
        return missing();
    }
    // SAFETY: open64 is `int open64(const char *, int, ...)`.
    let f: unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int = unsafe { std::mem::transmute(p) };
    unsafe { f(path, flags, mode) }
}

/// `openat(dirfd, path, flags, mode)`.
pub unsafe fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let p = variadic_sym!("openat64");
    if p.is_null() {
        return missing();
    }
    // SAFETY: openat64 is `int openat64(int, const char *, int, ...)`.
    let f: unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int = unsafe { std::mem::transmute(p) };
    unsafe { f(dirfd, path, flags, mode) }
}

/// `fcntl(fd, cmd, arg)`; `arg` is an integer or a pointer, passed on as given.
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    let p = variadic_sym!("fcntl64");
    if p.is_null() {
        return missing();
    }
    // SAFETY: fcntl64 is `int fcntl64(int, int, ...)`.
    let f: unsafe extern "C" fn(c_int, c_int, ...) -> c_int = unsafe { std::mem::transmute(p) };
    unsafe { f(fd, cmd, arg) }
}

/// `ioctl(fd, request, arg)`.
pub unsafe fn ioctl(fd: c_int, request: libc::c_ulong, arg: usize) -> c_int {
    let p = variadic_sym!("ioctl");
    if p.is_null() {
        return missing();
    }
    // SAFETY: ioctl is `int ioctl(int, unsigned long, ...)`.
    let f: unsafe extern "C" fn(c_int, libc::c_ulong, ...) -> c_int = unsafe { std::mem::transmute(p) };
    unsafe { f(fd, request, arg) }
}

/// `syscall(n, a1 .. a6)`.
pub unsafe fn syscall(n: c_long, a: [c_long; 6]) -> c_long {
    let p = variadic_sym!("syscall");
    if p.is_null() {
        return missing();
    }
    // SAFETY: syscall is `long syscall(long, ...)`; it reads as many arguments as the
    // system call takes, all of them integers or pointers.
    let f: unsafe extern "C" fn(c_long, ...) -> c_long = unsafe { std::mem::transmute(p) };
    unsafe { f(n, a[0], a[1], a[2], a[3], a[4], a[5]) }
}
