//! Errors across the boundary: errno plus a per-thread message, and panics caught (as in
//! crates/capi, with the library's own message store: a program may link libshoal and
//! libshoal_container together, so no symbol of one may be defined by the other).

use std::cell::RefCell;
use std::ffi::{c_char, CString};

thread_local! {
    /// The message of the calling thread's last failed call.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Record a failure for the calling thread: `errno` and the message.
pub(crate) fn fail(errno: i32, message: impl std::fmt::Display) {
    let text = CString::new(message.to_string().replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = text);
    // SAFETY: errno is a thread-local the C library owns; writing it is what C callers expect.
    unsafe { *libc::__errno_location() = errno };
}

/// Record an error of the container library (its errno: EBADMSG for a corrupt container,
/// the file system's for I/O, EINVAL for a usage error, EIO for communication).
pub(crate) fn fail_with(e: &container::Error) {
    fail(e.errno(), e);
}

/// Run an entry point: a panic becomes EIO (with its message) and `on_panic` is returned.
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(libc::EIO, format_args!("internal error in libshoal_container: {what}"));
            on_panic
        }
    }
}

/// The message of the calling thread's last failed call of libshoal_container ("" if
/// none). Valid until the thread's next failed call.
#[no_mangle]
pub extern "C" fn shoal_container_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}
