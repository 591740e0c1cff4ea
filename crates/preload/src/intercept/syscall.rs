//! `syscall(2)`: programs (and libraries: Rust's std, nix) reach some file calls through
//! it (`copy_file_range`, `statx`, `getdents64`, `close_range` on older C libraries). The
//! system calls that touch descriptors or paths the library serves are sent to the
//! library's own functions; every other one, and every call on other descriptors and
//! paths, goes to the C library's `syscall` unchanged.

use super::{dir, io, names, open, stat};
use libc::{c_char, c_int, c_long, c_uint, c_void};

/// `syscall(n, a0..a5)`: see the note on variadic functions in `intercept/mod.rs`; every
/// argument of a system call is an integer or a pointer.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a0: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
) -> c_long {
    let args = [a0, a1, a2, a3, a4, a5];
    // SAFETY (for every arm): the arguments are the caller's, given to the function of
    // the same system call with the same meaning.
    unsafe {
        let fd = a0 as c_int;
        let path = a1 as *const c_char;
        match n {
            libc::SYS_read => io::read(fd, a1 as *mut c_void, a2 as usize) as c_long,
            libc::SYS_write => io::write(fd, a1 as *const c_void, a2 as usize) as c_long,
            libc::SYS_pread64 => io::pread64(fd, a1 as *mut c_void, a2 as usize, a3) as c_long,
            libc::SYS_pwrite64 => io::pwrite64(fd, a1 as *const c_void, a2 as usize, a3) as c_long,
            libc::SYS_readv => io::readv(fd, a1 as *const libc::iovec, a2 as c_int) as c_long,
            libc::SYS_writev => io::writev(fd, a1 as *const libc::iovec, a2 as c_int) as c_long,
            libc::SYS_lseek => io::lseek64(fd, a1, a2 as c_int),
            libc::SYS_fsync => io::fsync(fd) as c_long,
            libc::SYS_fdatasync => io::fdatasync(fd) as c_long,
            libc::SYS_ftruncate => io::ftruncate64(fd, a1) as c_long,
            libc::SYS_fallocate => io::fallocate64(fd, a1 as c_int, a2, a3) as c_long,
            libc::SYS_copy_file_range => {
                io::copy_file_range(fd, a1 as *mut i64, a2 as c_int, a3 as *mut i64, a4 as usize, a5 as c_uint)
                    as c_long
            }
            libc::SYS_close => open::close(fd) as c_long,
            libc::SYS_close_range => open::close_range(a0 as c_uint, a1 as c_uint, a2 as c_int) as c_long,
            libc::SYS_dup => open::dup(fd) as c_long,
            libc::SYS_dup3 => open::dup3(fd, a1 as c_int, a2 as c_int) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_dup2 => open::dup2(fd, a1 as c_int) as c_long,
            libc::SYS_fcntl => open::fcntl(fd, a1 as c_int, a2 as usize) as c_long,
            libc::SYS_openat => open::openat(fd, path, a2 as c_int, a3 as c_uint) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_open => open::open(a0 as *const c_char, a1 as c_int, a2 as c_uint) as c_long,
            libc::SYS_fstat => stat::fstat64(fd, a1 as *mut libc::stat64) as c_long,
            libc::SYS_newfstatat => stat::fstatat64(fd, path, a2 as *mut libc::stat64, a3 as c_int) as c_long,
            libc::SYS_statx => stat::statx(fd, path, a2 as c_int, a3 as c_uint, a4 as *mut libc::statx) as c_long,
            libc::SYS_getdents64 => dir::getdents64(fd, a1 as *mut c_void, a2 as usize) as c_long,
            libc::SYS_fchdir => dir::fchdir(fd) as c_long,
            libc::SYS_chdir => dir::chdir(a0 as *const c_char) as c_long,
            libc::SYS_unlinkat => names::unlinkat(fd, path, a2 as c_int) as c_long,
            libc::SYS_mkdirat => names::mkdirat(fd, path, a2 as libc::mode_t) as c_long,
            libc::SYS_renameat2 => names::renameat2(fd, path, a2 as c_int, a3 as *const c_char, a4 as c_uint) as c_long,
            libc::SYS_fchmod => names::fchmod(fd, a1 as libc::mode_t) as c_long,
            libc::SYS_fchown => names::fchown(fd, a1 as u32, a2 as u32) as c_long,
            libc::SYS_utimensat => names::utimensat(fd, path, a2 as *const libc::timespec, a3 as c_int) as c_long,
            _ => crate::real::syscall(n, args),
        }
    }
}
