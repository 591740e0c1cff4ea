//! Asynchronous calls: each returns a `shoal_future` at once, completed on the client's
//! runtime (PXFS's futures: `wait`, `test`, `wait_any`, `wait_all`, `cancel`, and a
//! completion callback with user data).
//!
//! A future's result is an `int64_t`: what the blocking twin returns on success (bytes
//! read or written, a length, a count, 0), or `-errno`. The callback, if given, is called once with the result
//! and the user data, on a runtime thread, when the call completes (not when it is
//! cancelled). After `shoal_future_cancel` returns, the call's buffer is no longer touched.

use crate::error::{fail, guard};
use crate::file::{bytes_of, file, shoal_file};
use parking_lot::{Condvar, Mutex};
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

/// Called when an asynchronous call completes: its result and the caller's `user` pointer.
#[allow(non_camel_case_types)]
pub type shoal_callback = Option<extern "C" fn(result: i64, user: *mut c_void)>;

/// A call on its way, or its result.
#[allow(non_camel_case_types)]
pub struct shoal_future {
    state: Arc<State>,
    task: Option<tokio::task::AbortHandle>,
}

struct State {
    /// The result once completed or cancelled.
    result: Mutex<Option<i64>>,
    done: Condvar,
}

/// Every completion, for `shoal_future_wait_any` (a count, and waiters on it).
static COMPLETIONS: Mutex<u64> = Mutex::new(0);
static COMPLETED: Condvar = Condvar::new();

/// The user's pointer, carried to the runtime thread that calls back.
struct User(*mut c_void);
// SAFETY: the pointer is only handed back to the caller's callback; what it points at is
// the caller's to synchronise (documented in the header).
unsafe impl Send for User {}

/// Waiters on `state`, and on any completion, learn that its result is set.
fn notify(state: &State) {
    state.done.notify_all();
    *COMPLETIONS.lock() += 1;
    COMPLETED.notify_all();
}

/// Start `work` on the runtime `rt` as a future; `finish` turns its outcome into the result
/// under the future's lock (so a cancel cannot come between: see `shoal_pread_async`).
pub(crate) fn start<T: Send + 'static>(
    rt: &tokio::runtime::Handle,
    cb: shoal_callback,
    user: *mut c_void,
    work: impl std::future::Future<Output = ::shoal_client::Result<T>> + Send + 'static,
    finish: impl FnOnce(T) -> i64 + Send + 'static,
) -> *mut shoal_future {
    let state = Arc::new(State { result: Mutex::new(None), done: Condvar::new() });
    let st = state.clone();
    let user = User(user);
    let task = rt.spawn(async move {
        let user = user;
        let outcome = work.await;
        let result = {
            // Under the lock: a cancel either came first (then nothing more is touched) or
            // waits until the result, and what `finish` writes, are in place.
            let mut r = st.result.lock();
            if r.is_some() {
                return;
            }
            let result = match outcome {
                Ok(v) => finish(v),
                Err(e) => -(e.errno.0 as i64),
            };
            *r = Some(result);
            result
        };
        notify(&st);
        if let Some(cb) = cb {
            cb(result, user.0);
        }
    });
    Box::into_raw(Box::new(shoal_future { state, task: Some(task.abort_handle()) }))
}

/// Write `len` bytes from `buf` at `offset`, asynchronously. The bytes are copied before
/// this returns: `buf` may be reused at once. Result: `len` or -errno. NULL on a bad
/// argument (errno set).
#[no_mangle]
pub extern "C" fn shoal_pwrite_async(
    f: *const shoal_file,
    buf: *const c_void,
    len: usize,
    offset: u64,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(std::ptr::null_mut(), || {
        let Some(f) = file(f) else { return std::ptr::null_mut() };
        let Some(data) = bytes_of(buf, len) else { return std::ptr::null_mut() };
        let data = bytes_copy(data);
        let handle = f.file.clone();
        start(&f.rt, cb, user, async move { handle.write_bytes_at(offset, data).await }, |n| n as i64)
    })
}

fn bytes_copy(data: &[u8]) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(data)
}

/// The caller's buffer a read fills, carried to the runtime thread.
struct Into(*mut u8, usize);
// SAFETY: the caller keeps the buffer alive and untouched until the future completes or is
// cancelled (documented); it is written only while the future's result is unset.
unsafe impl Send for Into {}

/// Read up to `len` bytes at `offset` into `buf`, asynchronously. `buf` must stay valid
/// until the future completed or was cancelled. Result: bytes read or -errno. NULL on a
/// bad argument (errno set).
#[no_mangle]
pub extern "C" fn shoal_pread_async(
    f: *const shoal_file,
    buf: *mut c_void,
    len: usize,
    offset: u64,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(std::ptr::null_mut(), || {
        let Some(f) = file(f) else { return std::ptr::null_mut() };
        if buf.is_null() && len > 0 {
            fail(libc::EFAULT, "pread: the buffer is NULL");
            return std::ptr::null_mut();
        }
        let into = Into(buf as *mut u8, len);
        let handle = f.file.clone();
        start(&f.rt, cb, user, async move { handle.read_at(offset, len).await }, move |data| {
            let into = into;
            let n = data.len().min(into.1);
            // SAFETY: the caller's buffer of `len` bytes, alive until the future completes
            // or is cancelled; this runs under the future's lock with no result set, so no
            // cancel has returned (see `start`).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), into.0, n) };
            n as i64
        })
    })
}

/// Make the file's data and size durable, asynchronously. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_fsync_async(f: *const shoal_file, cb: shoal_callback, user: *mut c_void) -> *mut shoal_future {
    guard(std::ptr::null_mut(), || {
        let Some(f) = file(f) else { return std::ptr::null_mut() };
        let handle = f.file.clone();
        start(&f.rt, cb, user, async move { handle.fsync().await }, |_| 0)
    })
}

fn future<'a>(fut: *const shoal_future) -> Option<&'a shoal_future> {
    if fut.is_null() {
        fail(libc::EFAULT, "the shoal_future is NULL");
        return None;
    }
    // SAFETY: a non-NULL future comes from an asynchronous call and is not freed yet.
    Some(unsafe { &*fut })
}

/// Wait until `fut` completed (or was cancelled); its result into `result` (if not NULL).
/// 0, or -1 for a NULL future. Must not be called from a callback (EDEADLK).
#[no_mangle]
pub extern "C" fn shoal_future_wait(fut: *const shoal_future, result: *mut i64) -> c_int {
    guard(-1, || {
        let Some(fut) = future(fut) else { return -1 };
        if tokio::runtime::Handle::try_current().is_ok() {
            fail(libc::EDEADLK, "shoal_future_wait from a completion callback (a runtime thread)");
            return -1;
        }
        let mut r = fut.state.result.lock();
        while r.is_none() {
            fut.state.done.wait(&mut r);
        }
        put(result, r.unwrap_or(0));
        0
    })
}

fn put(out: *mut i64, v: i64) {
    if !out.is_null() {
        // SAFETY: the caller's int64_t.
        unsafe { *out = v };
    }
}

/// Whether `fut` has completed: 1 (its result into `result`, if not NULL), 0 if not yet,
/// -1 for a NULL future.
#[no_mangle]
pub extern "C" fn shoal_future_test(fut: *const shoal_future, result: *mut i64) -> c_int {
    guard(-1, || {
        let Some(fut) = future(fut) else { return -1 };
        match *fut.state.result.lock() {
            Some(v) => {
                put(result, v);
                1
            }
            None => 0,
        }
    })
}

/// The futures of an array of `n`; `None` (EFAULT) if the array or one of them is NULL.
fn futures<'a>(futs: *const *const shoal_future, n: usize) -> Option<Vec<&'a shoal_future>> {
    if n == 0 {
        return Some(Vec::new());
    }
    if futs.is_null() {
        fail(libc::EFAULT, "the array of futures is NULL");
        return None;
    }
    // SAFETY: the caller's array of `n` future pointers.
    let all = unsafe { std::slice::from_raw_parts(futs, n) };
    all.iter().map(|f| future(*f)).collect()
}

/// Wait until one of the `n` futures of `futs` completed; its index into `index`. 0, or -1
/// (EINVAL for n = 0, EFAULT for a NULL one).
#[no_mangle]
pub extern "C" fn shoal_future_wait_any(futs: *const *const shoal_future, n: usize, index: *mut usize) -> c_int {
    guard(-1, || {
        let Some(all) = futures(futs, n) else { return -1 };
        if all.is_empty() {
            fail(libc::EINVAL, "shoal_future_wait_any of no futures");
            return -1;
        }
        loop {
            // Read the completion count before looking, so a completion in between wakes us.
            let mut seen = COMPLETIONS.lock();
            if let Some(i) = all.iter().position(|f| f.state.result.lock().is_some()) {
                if !index.is_null() {
                    // SAFETY: the caller's size_t.
                    unsafe { *index = i };
                }
                return 0;
            }
            COMPLETED.wait_for(&mut seen, Duration::from_millis(100));
        }
    })
}

/// Wait until all `n` futures of `futs` completed. 0, or -1 (EFAULT for a NULL one).
#[no_mangle]
pub extern "C" fn shoal_future_wait_all(futs: *const *const shoal_future, n: usize) -> c_int {
    guard(-1, || {
        let Some(all) = futures(futs, n) else { return -1 };
        for f in all {
            if shoal_future_wait(f, std::ptr::null_mut()) != 0 {
                return -1;
            }
        }
        0
    })
}

/// Cancel `fut`: if it has not completed, its result becomes -ECANCELED, its callback is
/// not called and its buffer no longer touched (a write may or may not have reached the
/// servers). Returns 1 if it was cancelled, 0 if it had completed already, -1 for NULL.
#[no_mangle]
pub extern "C" fn shoal_future_cancel(fut: *const shoal_future) -> c_int {
    guard(-1, || {
        let Some(fut) = future(fut) else { return -1 };
        let cancelled = {
            let mut r = fut.state.result.lock();
            let first = r.is_none();
            if first {
                *r = Some(-(libc::ECANCELED as i64));
            }
            first
        };
        if cancelled {
            notify(&fut.state);
        }
        if let Some(t) = &fut.task {
            t.abort();
        }
        c_int::from(cancelled)
    })
}

/// Free `fut` (NULL: nothing), cancelling it first if it has not completed.
#[no_mangle]
pub extern "C" fn shoal_future_free(fut: *mut shoal_future) {
    guard((), || {
        if fut.is_null() {
            return;
        }
        shoal_future_cancel(fut);
        // SAFETY: `fut` came from an asynchronous call and is freed once, here.
        drop(unsafe { Box::from_raw(fut) });
    })
}
