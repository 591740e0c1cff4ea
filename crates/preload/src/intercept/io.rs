//! Data calls on served descriptors: `read`, `write`, `pread`, `pwrite`, their vector
//! forms, `lseek`, `fsync`, `fdatasync`, `ftruncate`, `fallocate`, `posix_fallocate`,
//! `posix_fadvise`, `readahead`, `sync_file_range`, `syncfs`, `sendfile`,
//! `copy_file_range`.
//!
//! A read or write is one call of the file's client handle at the description's offset
//! (held under the description's position lock, as the kernel holds `f_pos`): split into
//! object pieces sent to their servers at once, written behind, read ahead. `O_APPEND`
//! writes go to the inode's home server, which picks the offset (also for `pwrite`, as
//! Linux appends whatever offset `pwrite` names on an `O_APPEND` descriptor); `O_SYNC` and
//! `O_DSYNC` writes are followed by an fsync. Hole punching and zeroing write zeros, as
//! the mount does. What has no native form here (`RWF_NOWAIT`, `FALLOC_FL_COLLAPSE_RANGE`
//! and other `fallocate` modes, `sendfile`/`copy_file_range` between a Shoal file and a
//! file elsewhere are handled, see each) goes to the kernel.

use super::kernel_only;
use crate::fd_table;
use crate::guard::{fail, serve, serve_code, Out, Res};
use crate::node::Node;
use crate::open_file::{Kind, OpenFile};
use crate::real;
use crate::stats::Op;
use bytes::Bytes;
use libc::{c_int, c_uint, c_void, iovec, off64_t, off_t, size_t, ssize_t};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most bytes one read or write moves (Linux's MAX_RW_COUNT).
const MAX_RW: usize = 0x7fff_f000;
/// Bytes of zeros written at once when punching holes and zeroing ranges.
const ZERO_CHUNK: usize = 1 << 20;
static ZEROS: [u8; ZERO_CHUNK] = [0; ZERO_CHUNK];
/// Most bytes `sendfile` and `copy_file_range` move per call (callers loop).
const COPY_MAX: usize = 16 << 20;

fn err_of(e: shoal_client::Error) -> Out {
    Out::from(e)
}

fn check_readable(of: &OpenFile) -> Res<()> {
    match of.kind {
        Kind::Dir => fail(libc::EISDIR),
        Kind::DirPath => fail(libc::EBADF),
        Kind::File if !of.readable() => fail(libc::EBADF),
        Kind::File => Ok(()),
    }
}

fn check_writable(of: &OpenFile) -> Res<()> {
    if of.kind != Kind::File || !of.writable() {
        return fail(libc::EBADF);
    }
    Ok(())
}

/// Read up to `len` bytes at `off` through `node`.
fn read_node(node: &Node, off: u64, len: usize) -> Res<Bytes> {
    crate::cluster::data_activity();
    if node.shared.load(Ordering::Relaxed) && off + len as u64 > node.file().attr().size {
        node.sync_siblings();
    }
    node.cluster.block_on(node.file().read_at(off, len)).map_err(err_of)
}

/// Read from a served file: at `at`, or at the description's offset (advanced).
fn read_of(fd: c_int, of: &Arc<OpenFile>, at: Option<u64>, len: usize) -> Res<Bytes> {
    check_readable(of)?;
    let len = len.min(MAX_RW);
    match at {
        Some(off) => {
            let (_st, node) = of.node(fd)?;
            read_node(&node, off, len)
        }
        None => {
            let _pos = of.pos.lock();
            let (_st, node) = of.node(fd)?;
            let off = of.offset.load(Ordering::Relaxed);
            let data = read_node(&node, off, len)?;
            of.offset.store(off + data.len() as u64, Ordering::Relaxed);
            Ok(data)
        }
    }
}

/// Read `buf.len()` bytes at `off` from a served file into `buf` (fewer at its end).
pub fn read_into(fd: c_int, of: &Arc<OpenFile>, off: u64, buf: &mut [u8]) -> Res<usize> {
    let mut done = 0;
    while done < buf.len() {
        let data = read_of(fd, of, Some(off + done as u64), buf.len() - done)?;
        if data.is_empty() {
            break;
        }
        buf[done..done + data.len()].copy_from_slice(&data);
        done += data.len();
    }
    Ok(done)
}

/// How a write must end, beyond the descriptor's own flags (`pwritev2`'s RWF_*).
#[derive(Clone, Copy, Default)]
struct Extra {
    append: bool,
    dsync: bool,
    sync: bool,
}

/// Write `data` to a served file: at `at`, or at the description's offset (advanced).
fn write_of(fd: c_int, of: &Arc<OpenFile>, at: Option<u64>, data: &[u8], extra: Extra) -> Res<usize> {
    check_writable(of)?;
    let data = &data[..data.len().min(MAX_RW)];
    let flags = of.flags();
    let append = extra.append || flags & libc::O_APPEND != 0;
    let _pos = at.is_none().then(|| of.pos.lock());
    let (_st, node) = of.node(fd)?;
    if data.is_empty() {
        return Ok(0);
    }
    crate::cluster::data_activity();
    let f = node.file();
    let end = if append {
        let at = node.cluster.block_on(f.append(data)).map_err(err_of)?;
        at + data.len() as u64
    } else {
        let off = at.unwrap_or_else(|| of.offset.load(Ordering::Relaxed));
        node.cluster.block_on(f.write_at(off, data)).map_err(err_of)?;
        off + data.len() as u64
    };
    node.wrote();
    if at.is_none() {
        of.offset.store(end, Ordering::Relaxed);
    }
    if extra.sync || flags & libc::O_SYNC == libc::O_SYNC {
        node.cluster.block_on(f.fsync()).map_err(err_of)?;
    } else if extra.dsync || flags & libc::O_DSYNC != 0 {
        node.cluster.block_on(f.sync_data()).map_err(err_of)?;
    }
    Ok(data.len())
}

/// Copy `data` to the caller's buffer.
unsafe fn give(data: &[u8], buf: *mut c_void) {
    // SAFETY: the caller's buffer holds at least the length it asked for, which bounds `data`.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), data.len()) };
}

unsafe fn slice<'a>(buf: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 {
        return &[];
    }
    // SAFETY: the caller's buffer of `n` bytes.
    unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) }
}

// ---------------------------------------------------------------- read / write

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::read(fd, buf, n) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(
        Op::Read,
        || {
            let data = read_of(fd, &of, None, n)?;
            // SAFETY: `data` is at most `n` bytes.
            unsafe { give(&data, buf) };
            Ok(data.len() as ssize_t)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::write(fd, buf, n) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    // SAFETY: the caller's buffer.
    serve(Op::Write, || Ok(write_of(fd, &of, None, unsafe { slice(buf, n) }, Extra::default())? as ssize_t), kernel)
}

unsafe fn pread_any(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::pread64(fd, buf, n, off) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(
        Op::Read,
        || {
            if off < 0 {
                return fail(libc::EINVAL);
            }
            let data = read_of(fd, &of, Some(off as u64), n)?;
            // SAFETY: `data` is at most `n` bytes.
            unsafe { give(&data, buf) };
            Ok(data.len() as ssize_t)
        },
        kernel,
    )
}

unsafe fn pwrite_any(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::pwrite64(fd, buf, n, off) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(
        Op::Write,
        || {
            if off < 0 {
                return fail(libc::EINVAL);
            }
            // SAFETY: the caller's buffer.
            Ok(write_of(fd, &of, Some(off as u64), unsafe { slice(buf, n) }, Extra::default())? as ssize_t)
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    unsafe { pread_any(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    unsafe { pread_any(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    unsafe { pwrite_any(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    unsafe { pwrite_any(fd, buf, n, off) }
}

// ---------------------------------------------------------------- vectors

/// The caller's iovec array, checked as the kernel checks it.
unsafe fn iovecs<'a>(iov: *const iovec, n: c_int) -> Res<&'a [iovec]> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) {
        return fail(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's array of `n` iovecs.
    let v = unsafe { std::slice::from_raw_parts(iov, n as usize) };
    let mut total: usize = 0;
    for x in v {
        total = total.checked_add(x.iov_len).filter(|t| *t <= isize::MAX as usize).ok_or(Out::Errno(libc::EINVAL))?;
    }
    Ok(v)
}

fn total(v: &[iovec]) -> usize {
    v.iter().map(|x| x.iov_len).sum()
}

/// Spread `data` over the buffers.
unsafe fn scatter(data: &[u8], v: &[iovec]) {
    let mut at = 0;
    for x in v {
        if at >= data.len() {
            break;
        }
        let k = x.iov_len.min(data.len() - at);
        // SAFETY: each buffer holds its `iov_len` bytes.
        unsafe { give(&data[at..at + k], x.iov_base) };
        at += k;
    }
}

/// The buffers' bytes, one after the other.
unsafe fn gather(v: &[iovec]) -> Vec<u8> {
    let mut out = Vec::with_capacity(total(v));
    for x in v {
        // SAFETY: each buffer holds its `iov_len` bytes.
        out.extend_from_slice(unsafe { slice(x.iov_base, x.iov_len) });
    }
    out
}

/// `RWF_*` flags served natively (`RWF_HIPRI` is a hint); the rest go to the kernel.
fn rwf(flags: c_int) -> Res<Extra> {
    if flags & !(libc::RWF_HIPRI | libc::RWF_DSYNC | libc::RWF_SYNC | libc::RWF_APPEND) != 0 {
        return Err(Out::Kernel);
    }
    Ok(Extra {
        append: flags & libc::RWF_APPEND != 0,
        dsync: flags & libc::RWF_DSYNC != 0,
        sync: flags & libc::RWF_SYNC != 0,
    })
}

/// `preadv2` with everything: `off` None or -1 is the current offset; `kernel` is the
/// caller's own C library call.
unsafe fn readv_any(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: Option<off64_t>,
    flags: c_int,
    kernel: impl Fn() -> ssize_t + Copy,
) -> ssize_t {
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(
        Op::Read,
        || {
            rwf(flags)?;
            // SAFETY: the caller's array.
            let v = unsafe { iovecs(iov, n) }?;
            let at = match off {
                None | Some(-1) => None,
                Some(o) if o < 0 => return fail(libc::EINVAL),
                Some(o) => Some(o as u64),
            };
            let data = read_of(fd, &of, at, total(v))?;
            // SAFETY: the buffers hold `total(v)` bytes, at least `data.len()`.
            unsafe { scatter(&data, v) };
            Ok(data.len() as ssize_t)
        },
        || kernel_only(fd, kernel),
    )
}

unsafe fn writev_any(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: Option<off64_t>,
    flags: c_int,
    kernel: impl Fn() -> ssize_t + Copy,
) -> ssize_t {
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(
        Op::Write,
        || {
            let extra = rwf(flags)?;
            // SAFETY: the caller's array.
            let v = unsafe { iovecs(iov, n) }?;
            let at = match off {
                None | Some(-1) => None,
                Some(o) if o < 0 => return fail(libc::EINVAL),
                Some(o) => Some(o as u64),
            };
            // SAFETY: the caller's buffers.
            let data = unsafe { gather(v) };
            Ok(write_of(fd, &of, at, &data, extra)? as ssize_t)
        },
        || kernel_only(fd, kernel),
    )
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    // SAFETY (here and below): the caller's arguments, to its own C library call.
    unsafe { readv_any(fd, iov, n, None, 0, || real::readv(fd, iov, n)) }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    unsafe { writev_any(fd, iov, n, None, 0, || real::writev(fd, iov, n)) }
}

/// `preadv`/`pwritev` have no "current offset" form: -1 is as invalid as any negative.
fn positioned(off: off64_t) -> Option<off64_t> {
    Some(if off == -1 { -2 } else { off })
}

#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    unsafe { readv_any(fd, iov, n, positioned(off), 0, || real::preadv64(fd, iov, n, off)) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(fd: c_int, iov: *const iovec, n: c_int, off: off64_t) -> ssize_t {
    unsafe { readv_any(fd, iov, n, positioned(off), 0, || real::preadv64(fd, iov, n, off)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    unsafe { writev_any(fd, iov, n, positioned(off), 0, || real::pwritev64(fd, iov, n, off)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const iovec, n: c_int, off: off64_t) -> ssize_t {
    unsafe { writev_any(fd, iov, n, positioned(off), 0, || real::pwritev64(fd, iov, n, off)) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv2(fd: c_int, iov: *const iovec, n: c_int, off: off_t, flags: c_int) -> ssize_t {
    unsafe { readv_any(fd, iov, n, Some(off), flags, || real::preadv64v2(fd, iov, n, off, flags)) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64v2(fd: c_int, iov: *const iovec, n: c_int, off: off64_t, flags: c_int) -> ssize_t {
    unsafe { readv_any(fd, iov, n, Some(off), flags, || real::preadv64v2(fd, iov, n, off, flags)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev2(fd: c_int, iov: *const iovec, n: c_int, off: off_t, flags: c_int) -> ssize_t {
    unsafe { writev_any(fd, iov, n, Some(off), flags, || real::pwritev64v2(fd, iov, n, off, flags)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(fd: c_int, iov: *const iovec, n: c_int, off: off64_t, flags: c_int) -> ssize_t {
    unsafe { writev_any(fd, iov, n, Some(off), flags, || real::pwritev64v2(fd, iov, n, off, flags)) }
}

// ---------------------------------------------------------------- lseek

unsafe fn lseek_any(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::lseek64(fd, off, whence) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(Op::Seek, || seek(fd, &of, off, whence), kernel)
}

fn seek(fd: c_int, of: &Arc<OpenFile>, off: off64_t, whence: c_int) -> Res<off64_t> {
    let _pos = of.pos.lock();
    let cur = of.offset.load(Ordering::Relaxed) as i64;
    let new = match of.kind {
        Kind::DirPath => return fail(libc::EBADF),
        Kind::Dir => match whence {
            libc::SEEK_SET if off >= 0 => off,
            libc::SEEK_CUR if off == 0 => cur,
            _ => return fail(libc::EINVAL),
        },
        Kind::File => {
            let size = || -> Res<i64> {
                let (_st, node) = of.node(fd)?;
                let ttl = crate::settings::get().cache_ttl;
                Ok(node.size(ttl)? as i64)
            };
            match whence {
                libc::SEEK_SET => off,
                libc::SEEK_CUR => cur.checked_add(off).ok_or(Out::Errno(libc::EOVERFLOW))?,
                libc::SEEK_END => size()?.checked_add(off).ok_or(Out::Errno(libc::EOVERFLOW))?,
                libc::SEEK_DATA | libc::SEEK_HOLE => {
                    let size = size()?;
                    if off < 0 {
                        return fail(libc::EINVAL);
                    }
                    if off >= size {
                        return fail(libc::ENXIO);
                    }
                    if whence == libc::SEEK_DATA {
                        off
                    } else {
                        size
                    }
                }
                _ => return fail(libc::EINVAL),
            }
        }
    };
    if new < 0 {
        return fail(libc::EINVAL);
    }
    of.offset.store(new as u64, Ordering::Relaxed);
    Ok(new)
}

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    unsafe { lseek_any(fd, off, whence) }
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    unsafe { lseek_any(fd, off, whence) }
}

// ---------------------------------------------------------------- sync, size

fn sync(fd: c_int, of: &Arc<OpenFile>, data_only: bool) -> Res<c_int> {
    match of.kind {
        Kind::DirPath => fail(libc::EBADF),
        // Namespace changes are durable when they return (docs/architecture.md).
        Kind::Dir => Ok(0),
        Kind::File => {
            let (_st, node) = of.node(fd)?;
            let f = node.file();
            let r = if data_only { node.cluster.block_on(f.sync_data()) } else { node.cluster.block_on(f.fsync()) };
            r.map_err(err_of)?;
            Ok(0)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    // SAFETY: the caller's argument.
    let kernel = || unsafe { real::fsync(fd) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(Op::Sync, || sync(fd, &of, false), kernel)
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    // SAFETY: the caller's argument.
    let kernel = || unsafe { real::fdatasync(fd) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(Op::Sync, || sync(fd, &of, true), kernel)
}

#[no_mangle]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    // SAFETY: the caller's argument.
    let kernel = || unsafe { real::syncfs(fd) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(
        Op::Sync,
        || {
            crate::node::flush_all();
            match of.kind {
                Kind::File => sync(fd, &of, false),
                _ => Ok(0),
            }
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn sync_file_range(fd: c_int, off: off64_t, n: off64_t, flags: c_uint) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::sync_file_range(fd, off, n, flags) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(
        Op::Sync,
        || {
            if off < 0 || n < 0 || flags & !7 != 0 {
                return fail(libc::EINVAL);
            }
            if of.kind != Kind::File {
                return fail(libc::ESPIPE);
            }
            let (_st, node) = of.node(fd)?;
            node.cluster.block_on(node.file().flush()).map_err(err_of)?;
            Ok(0)
        },
        kernel,
    )
}

fn set_len(fd: c_int, of: &Arc<OpenFile>, len: i64) -> Res<c_int> {
    if len < 0 || of.kind != Kind::File || !of.writable() {
        return fail(if of.kind == Kind::DirPath { libc::EBADF } else { libc::EINVAL });
    }
    let (_st, node) = of.node(fd)?;
    node.cluster.block_on(node.file().set_len(len as u64)).map_err(err_of)?;
    node.wrote();
    Ok(0)
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::ftruncate64(fd, len) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(Op::Truncate, || set_len(fd, &of, len), kernel)
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    unsafe { ftruncate(fd, len) }
}

// ---------------------------------------------------------------- allocation

/// Write zeros over `[start, end)`.
fn zero(node: &Node, start: u64, end: u64) -> Res<()> {
    let mut at = start;
    while at < end {
        let n = ((end - at) as usize).min(ZERO_CHUNK);
        node.cluster.block_on(node.file().write_bytes_at(at, Bytes::from_static(&ZEROS[..n]))).map_err(err_of)?;
        at += n as u64;
    }
    node.wrote();
    Ok(())
}

/// `fallocate(fd, mode, off, len)` natively, or Kernel for modes it has no form of.
fn allocate(fd: c_int, of: &Arc<OpenFile>, mode: c_int, off: i64, len: i64) -> Res<()> {
    const KEEP: c_int = libc::FALLOC_FL_KEEP_SIZE;
    const PUNCH: c_int = libc::FALLOC_FL_PUNCH_HOLE;
    const ZERO: c_int = libc::FALLOC_FL_ZERO_RANGE;
    if ![0, KEEP, PUNCH | KEEP, ZERO, ZERO | KEEP].contains(&mode) {
        return Err(Out::Kernel);
    }
    if off < 0 || len <= 0 {
        return fail(libc::EINVAL);
    }
    match of.kind {
        Kind::Dir => return fail(libc::EISDIR),
        Kind::DirPath => return fail(libc::EBADF),
        Kind::File if !of.writable() => return fail(libc::EBADF),
        Kind::File => {}
    }
    let end = (off as u64).checked_add(len as u64).filter(|e| *e <= i64::MAX as u64).ok_or(Out::Errno(libc::EFBIG))?;
    let (_st, node) = of.node(fd)?;
    let size = node.file().attr().size;
    if mode & (PUNCH | ZERO) != 0 {
        zero(&node, off as u64, end.min(size))?;
    }
    if mode & KEEP == 0 && end > size {
        node.cluster.block_on(node.file().set_len(end)).map_err(err_of)?;
        node.wrote();
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::fallocate64(fd, mode, off, len) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(Op::Allocate, || allocate(fd, &of, mode, off, len).map(|()| 0), || kernel_only(fd, kernel))
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { fallocate(fd, mode, off, len) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::posix_fallocate64(fd, off, len) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve_code(
        Op::Allocate,
        || match of.kind {
            Kind::File => allocate(fd, &of, 0, off, len),
            Kind::Dir => fail(libc::ENODEV),
            Kind::DirPath => fail(libc::EBADF),
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { posix_fallocate(fd, off, len) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::posix_fadvise64(fd, off, len, advice) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    // Advice only: the client's readahead follows the reads themselves.
    serve_code(
        Op::Allocate,
        || {
            if of.kind == Kind::DirPath {
                return fail(libc::EBADF);
            }
            if len < 0 || !(0..=5).contains(&advice) {
                return fail(libc::EINVAL);
            }
            Ok(())
        },
        kernel,
    )
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int {
    unsafe { posix_fadvise(fd, off, len, advice) }
}

#[no_mangle]
pub unsafe extern "C" fn readahead(fd: c_int, off: off64_t, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::readahead(fd, off, n) };
    let Some(of) = fd_table::get(fd) else { return kernel() };
    serve(Op::Read, || if of.kind == Kind::File { Ok(0) } else { fail(libc::EINVAL) }, kernel)
}

// ---------------------------------------------------------------- copies

/// Read `len` bytes for a copy from `fd`: at `*off` (advanced by the caller once the
/// bytes are written) or at the descriptor's offset. Served or kernel descriptor.
unsafe fn copy_source(fd: c_int, off: *mut off64_t, len: usize) -> Res<(Bytes, Option<Arc<OpenFile>>)> {
    let len = len.min(COPY_MAX);
    match fd_table::get(fd) {
        Some(of) => {
            check_readable(&of)?;
            let at = if off.is_null() {
                of.offset.load(Ordering::Relaxed)
            } else {
                // SAFETY: the caller's offset.
                let o = unsafe { *off };
                if o < 0 {
                    return fail(libc::EINVAL);
                }
                o as u64
            };
            let data = read_of(fd, &of, Some(at), len)?;
            Ok((data, Some(of)))
        }
        None => {
            let mut buf = vec![0u8; len];
            // SAFETY: a buffer of `len` bytes; the caller's descriptor and offset.
            let n = unsafe {
                if off.is_null() {
                    real::read(fd, buf.as_mut_ptr().cast(), len)
                } else {
                    real::pread64(fd, buf.as_mut_ptr().cast(), len, *off)
                }
            };
            if n < 0 {
                return fail(crate::guard::errno());
            }
            buf.truncate(n as usize);
            Ok((Bytes::from(buf), None))
        }
    }
}

/// `sendfile(out, in, off, n)` with at least one served descriptor: read from `in`,
/// write to `out`. Returns the bytes written; the input offset moves by as many.
unsafe fn send(out: c_int, inp: c_int, off: *mut off64_t, n: usize) -> Res<ssize_t> {
    // SAFETY: the caller's arguments.
    let (data, src) = unsafe { copy_source(inp, off, n) }?;
    let written = match fd_table::get(out) {
        Some(of) => {
            if of.flags() & libc::O_APPEND != 0 {
                return fail(libc::EINVAL); // as the kernel: no sendfile to an O_APPEND file
            }
            write_of(out, &of, None, &data, Extra::default())?
        }
        None => {
            let mut done = 0;
            while done < data.len() {
                // SAFETY: our buffer's remaining bytes to the caller's descriptor.
                let k = unsafe { real::write(out, data[done..].as_ptr().cast(), data.len() - done) };
                if k < 0 {
                    let e = crate::guard::errno();
                    if e == libc::EINTR {
                        continue;
                    }
                    if done == 0 {
                        return fail(e);
                    }
                    break;
                }
                done += k as usize;
            }
            done
        }
    };
    // Move the input offset by what was written (a kernel input already moved by what
    // was read: sendfile from a kernel file into a Shoal file writes all or fails).
    if !off.is_null() {
        // SAFETY: the caller's offset.
        unsafe { *off += written as i64 };
    } else if let Some(of) = src {
        of.offset.fetch_add(written as u64, Ordering::Relaxed);
    }
    Ok(written as ssize_t)
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::sendfile64(out, inp, off, n) };
    if fd_table::get(out).is_none() && fd_table::get(inp).is_none() {
        return kernel();
    }
    // SAFETY: the caller's arguments.
    serve(Op::Copy, || unsafe { send(out, inp, off, n) }, kernel)
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(out: c_int, inp: c_int, off: *mut off64_t, n: size_t) -> ssize_t {
    unsafe { sendfile(out, inp, off, n) }
}

/// `copy_file_range` between two served files of one mount: read, then write.
unsafe fn copy_range(
    fin: c_int,
    oin: *mut off64_t,
    fout: c_int,
    oout: *mut off64_t,
    n: usize,
    flags: c_uint,
) -> Res<ssize_t> {
    if flags != 0 {
        return fail(libc::EINVAL);
    }
    let (Some(src), Some(dst)) = (fd_table::get(fin), fd_table::get(fout)) else {
        // A Shoal file and another file system's: callers copy by hand on EXDEV.
        return fail(libc::EXDEV);
    };
    if !std::ptr::eq(src.mount, dst.mount) {
        return fail(libc::EXDEV);
    }
    check_readable(&src)?;
    check_writable(&dst)?;
    if dst.flags() & libc::O_APPEND != 0 {
        return fail(libc::EBADF);
    }
    // SAFETY: the caller's offsets (or NULL).
    let (in_at, out_at) = unsafe {
        (
            if oin.is_null() { src.offset.load(Ordering::Relaxed) as i64 } else { *oin },
            if oout.is_null() { dst.offset.load(Ordering::Relaxed) as i64 } else { *oout },
        )
    };
    if in_at < 0 || out_at < 0 {
        return fail(libc::EINVAL);
    }
    let n = n.min(COPY_MAX);
    if src.ino == dst.ino && (in_at as u64) < out_at as u64 + n as u64 && (out_at as u64) < in_at as u64 + n as u64 {
        return fail(libc::EINVAL);
    }
    let data = read_of(fin, &src, Some(in_at as u64), n)?;
    if data.is_empty() {
        return Ok(0);
    }
    let written = write_of(fout, &dst, Some(out_at as u64), &data, Extra::default())?;
    // SAFETY: the caller's offsets.
    unsafe {
        if oin.is_null() {
            src.offset.fetch_add(written as u64, Ordering::Relaxed);
        } else {
            *oin += written as i64;
        }
        if oout.is_null() {
            dst.offset.fetch_add(written as u64, Ordering::Relaxed);
        } else {
            *oout += written as i64;
        }
    }
    Ok(written as ssize_t)
}

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fin: c_int,
    oin: *mut off64_t,
    fout: c_int,
    oout: *mut off64_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    // SAFETY: the caller's arguments.
    let kernel = || unsafe { real::copy_file_range(fin, oin, fout, oout, n, flags) };
    if fd_table::get(fin).is_none() && fd_table::get(fout).is_none() {
        return kernel();
    }
    // SAFETY: the caller's arguments.
    serve(Op::Copy, || unsafe { copy_range(fin, oin, fout, oout, n, flags) }, kernel)
}
