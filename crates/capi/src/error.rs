//! Errors across the boundary: errno plus a per-thread message, and panics caught.

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

/// Record a client error.
pub(crate) fn fail_with(err: &::shoal_client::Error) {
    fail(err.errno.0, err);
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
            fail(libc::EIO, format_args!("internal error in libshoal: {what}"));
            on_panic
        }
    }
}

/// The message of the calling thread's last failed call ("" if none). Valid until the
/// thread's next failed call.
#[no_mangle]
pub extern "C" fn shoal_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// Run `fut` to its end on the calling thread with the runtime `rt`; `None` (errno and
/// message set) if it failed, or if the caller is a runtime thread (a completion callback),
/// where waiting would stall the runtime.
pub(crate) fn block<T>(
    rt: &tokio::runtime::Handle,
    fut: impl std::future::Future<Output = ::shoal_client::Result<T>>,
) -> Option<T> {
    if tokio::runtime::Handle::try_current().is_ok() {
        fail(libc::EDEADLK, "a blocking call of libshoal from a completion callback (a runtime thread)");
        return None;
    }
    match rt.block_on(fut) {
        Ok(v) => Some(v),
        Err(e) => {
            fail_with(&e);
            None
        }
    }
}

/// A call's return value: 0 for `Some`, -1 for `None` (errno already set).
pub(crate) fn status<T>(r: Option<T>) -> std::ffi::c_int {
    if r.is_some() {
        0
    } else {
        -1
    }
}
