//! The edge between C callers and the library: the re-entrancy guard, errno, and
//! [`serve`], which runs a call natively and turns its outcome into what C expects.
//!
//! **Re-entrancy.** The library's own code (the client, tokio, std) calls `open64`,
//! `read`, `statx`, `close`... and, this library being first in the symbol search order,
//! those calls land in its own interceptors. A thread-local flag says "this thread is
//! inside the library": an interceptor that finds it set goes straight to the C library.
//! The runtime's threads set it for good when they start (they only ever make the client's
//! calls). The flag is a `const` thread-local without destructor, so reading it never
//! allocates and works at any point of a thread's life.
//!
//! **No panic crosses the FFI edge.** [`serve`] catches unwinding and answers EIO.

use crate::real::Fail;
use crate::stats::{self, Op};
use std::cell::Cell;
use std::panic::AssertUnwindSafe;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is running the library's own code (so its calls go to the C
/// library unexamined).
pub fn inside() -> bool {
    INSIDE.with(|c| c.get())
}

/// Mark this thread as the library's own for good (the runtime's threads).
pub fn mark_internal_thread() {
    INSIDE.with(|c| c.set(true));
}

/// Sets the flag for its lifetime, restoring the previous value on drop.
pub struct Guard(bool);

impl Guard {
    pub fn enter() -> Guard {
        Guard(INSIDE.with(|c| c.replace(true)))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let was = self.0;
        INSIDE.with(|c| c.set(was));
    }
}

pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// How a native attempt ended, when not with a value.
#[derive(Debug)]
pub enum Out {
    /// Fail the call with this errno.
    Errno(i32),
    /// Hand the call, unchanged, to the C library (the kernel and the FUSE mount). Only
    /// returned before the attempt changed anything.
    Kernel,
}

pub type Res<T> = Result<T, Out>;

impl From<shoal_client::Error> for Out {
    /// The errno a program sees for a client error, as the FUSE mount maps them: a server
    /// that cannot be reached or answered nonsense is EIO; ENOSYS (which would make the
    /// caller think the call does not exist) is EOPNOTSUPP. EREMOTE is the walk saying the
    /// path leads out of Shoal (`ClientOptions::host_paths`): the kernel takes it.
    fn from(e: shoal_client::Error) -> Out {
        let code = e.errno.0;
        if code == libc::EREMOTE {
            return Out::Kernel;
        }
        let transport = matches!(
            code,
            libc::ETIMEDOUT
                | libc::ENOTCONN
                | libc::ECONNREFUSED
                | libc::ECONNRESET
                | libc::ECONNABORTED
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::EPIPE
                | libc::ESHUTDOWN
                | libc::EPROTO
        );
        if transport || code <= 0 {
            crate::debug::say(&format!("{e}"));
            Out::Errno(libc::EIO)
        } else if code == libc::ENOSYS {
            Out::Errno(libc::EOPNOTSUPP)
        } else {
            Out::Errno(code)
        }
    }
}

impl From<shoal_client::Errno> for Out {
    fn from(e: shoal_client::Errno) -> Out {
        Out::from(shoal_client::Error::new(e, ""))
    }
}

/// Fail with `e`.
pub fn fail<T>(e: i32) -> Res<T> {
    Err(Out::Errno(e))
}

/// Run `native` inside the library (guard set, unwinding caught) and answer as C does:
/// its value with errno left as the caller had it, or `T::FAIL` with errno set; or, if it
/// says so, run `kernel` (the C library's own function with the caller's arguments).
pub fn serve<T: Fail>(op: Op, native: impl FnOnce() -> Res<T>, kernel: impl FnOnce() -> T) -> T {
    let saved = errno();
    let outcome = {
        let _g = Guard::enter();
        std::panic::catch_unwind(AssertUnwindSafe(native))
    };
    match outcome {
        Ok(Ok(v)) => {
            stats::count(op, stats::Path::Native);
            set_errno(saved);
            v
        }
        Ok(Err(Out::Errno(e))) => {
            stats::count(op, stats::Path::Native);
            set_errno(e);
            T::FAIL
        }
        Ok(Err(Out::Kernel)) => {
            stats::count(op, stats::Path::Kernel);
            set_errno(saved);
            kernel()
        }
        Err(_) => {
            set_errno(libc::EIO);
            T::FAIL
        }
    }
}

/// As [`serve`] for the few calls that answer an error number instead of setting errno
/// (`posix_fallocate`, `posix_fadvise`): 0 or the errno.
pub fn serve_code(op: Op, native: impl FnOnce() -> Res<()>, kernel: impl FnOnce() -> i32) -> i32 {
    let outcome = {
        let _g = Guard::enter();
        std::panic::catch_unwind(AssertUnwindSafe(native))
    };
    match outcome {
        Ok(Ok(())) => {
            stats::count(op, stats::Path::Native);
            0
        }
        Ok(Err(Out::Errno(e))) => {
            stats::count(op, stats::Path::Native);
            e
        }
        Ok(Err(Out::Kernel)) => {
            stats::count(op, stats::Path::Kernel);
            kernel()
        }
        Err(_) => libc::EIO,
    }
}
