//! The caller's memory that calls write their results into: one pointed-at value (`Out`)
//! and arrays with a capacity (`Slots`), checked once when the call is made, written by the
//! blocking form before it returns or by the asynchronous form when its future completes.

use crate::error::fail;

/// A pointer of the caller's that a call writes one value through.
pub(crate) struct Out<T>(*mut T);
// SAFETY: the caller keeps it valid until the call returns or its future completes or is
// cancelled (documented); a future writes it only while its result is unset
// (`future::start`), so never after a cancel has returned.
unsafe impl<T> Send for Out<T> {}

impl<T> Out<T> {
    /// `p`, or `None` (EFAULT) if NULL.
    pub(crate) fn new(p: *mut T, what: &str) -> Option<Out<T>> {
        if p.is_null() {
            fail(libc::EFAULT, format_args!("{what} is NULL"));
            return None;
        }
        Some(Out(p))
    }

    pub(crate) fn put(self, v: T) {
        // SAFETY: non-NULL (checked in `new`) and valid until completion (see above).
        unsafe { *self.0 = v };
    }
}

/// The caller's array of `cap` items that a call copies a result of unknown length into, as
/// readlink(2) and getxattr(2) do: a `cap` of 0 only asks for the length (the pointer may
/// then be NULL); a result longer than `cap` is ERANGE, and nothing is copied.
pub(crate) struct Slots<T> {
    at: *mut T,
    cap: usize,
    /// What the items are, for the message of ERANGE ("bytes").
    unit: &'static str,
}
// SAFETY: as for `Out`.
unsafe impl<T> Send for Slots<T> {}

impl<T: Copy> Slots<T> {
    /// `cap` items (`unit`) at `at`, or `None` (EFAULT) if `at` is NULL with a capacity.
    pub(crate) fn new(at: *mut T, cap: usize, what: &str, unit: &'static str) -> Option<Slots<T>> {
        if at.is_null() && cap > 0 {
            fail(libc::EFAULT, format_args!("{what} is NULL"));
            return None;
        }
        Some(Slots { at, cap, unit })
    }

    /// Copy `src` (unless only its length is asked for): its length, or the message of
    /// ERANGE (nothing copied).
    pub(crate) fn give(&self, src: &[T]) -> Result<usize, String> {
        if self.cap == 0 {
            return Ok(src.len());
        }
        if src.len() > self.cap {
            return Err(format!("{} {unit} do not fit in a buffer of {}", src.len(), self.cap, unit = self.unit));
        }
        // SAFETY: the caller's array of `cap` >= src.len() items, valid until the call
        // returns or its future completes (see above).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.at, src.len()) };
        Ok(src.len())
    }

    /// `give` for a blocking call: the length, or -1 with ERANGE set.
    pub(crate) fn give_or_fail(&self, src: &[T]) -> isize {
        match self.give(src) {
            Ok(n) => n as isize,
            Err(m) => {
                fail(libc::ERANGE, m);
                -1
            }
        }
    }

    /// `give` for a future: its result, the length or -ERANGE.
    pub(crate) fn give_result(&self, src: &[T]) -> i64 {
        match self.give(src) {
            Ok(n) => n as i64,
            Err(_) => -(libc::ERANGE as i64),
        }
    }
}
