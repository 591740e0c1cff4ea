//! The `DIR *` streams the library hands out for Shoal directories (`opendir`,
//! `fdopendir`), told apart from the C library's by their address: they are slots of one
//! array allocated at the first `opendir`, so "is this stream ours" is a range check, with
//! no lock and no table (every `readdir` asks it). A stream is a descriptor number (a
//! served directory descriptor, which owns the listing and its position) and the buffer
//! `readdir` returns entries in, valid until the next `readdir` on the stream, as POSIX says.
//!
//! If the descriptor was handed to the kernel meanwhile (see `open_file::convert`), the
//! stream goes on with the C library's own stream on a duplicate of it, skipping the
//! entries already returned (the mount lists in the same order).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Most streams open at once; beyond, `opendir` goes to the kernel.
const STREAMS: usize = 4096;

pub struct Stream {
    /// The directory descriptor; -1 when the slot is free.
    pub fd: AtomicI32,
    /// The position of the next entry (kept here too, for the kernel's stream).
    pub next: AtomicU64,
    /// The C library's stream, once the descriptor is the kernel's.
    pub kernel: AtomicPtr<libc::DIR>,
    /// Where `readdir` puts the entry it returns.
    pub ent: UnsafeCell<libc::dirent64>,
}

// SAFETY: `ent` is written only by the thread calling `readdir` on the stream (as with
// the C library's streams, one stream must not be read by two threads at once).
unsafe impl Sync for Stream {}

static ARENA: OnceLock<Box<[Stream]>> = OnceLock::new();

fn arena() -> &'static [Stream] {
    ARENA.get_or_init(|| {
        (0..STREAMS)
            .map(|_| Stream {
                fd: AtomicI32::new(-1),
                next: AtomicU64::new(0),
                kernel: AtomicPtr::new(std::ptr::null_mut()),
                // SAFETY: dirent64 is plain data.
                ent: UnsafeCell::new(unsafe { std::mem::zeroed() }),
            })
            .collect()
    })
}

/// A stream on `fd`, or None if all are in use.
pub fn open(fd: i32) -> Option<*mut libc::DIR> {
    let a = arena();
    let s = a.iter().find(|s| s.fd.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed).is_ok())?;
    s.next.store(0, Ordering::Relaxed);
    s.kernel.store(std::ptr::null_mut(), Ordering::Relaxed);
    Some(s as *const Stream as *mut libc::DIR)
}

/// The stream `d` points to, if it is one of ours.
#[inline]
pub fn ours(d: *mut libc::DIR) -> Option<&'static Stream> {
    let a = ARENA.get()?;
    let base = a.as_ptr() as usize;
    let p = d as usize;
    let size = std::mem::size_of::<Stream>();
    if p < base || p >= base + a.len() * size || !(p - base).is_multiple_of(size) {
        return None;
    }
    let s = &a[(p - base) / size];
    (s.fd.load(Ordering::Acquire) >= 0).then_some(s)
}

/// Give the slot back.
pub fn close(s: &Stream) {
    s.fd.store(-1, Ordering::Release);
}
