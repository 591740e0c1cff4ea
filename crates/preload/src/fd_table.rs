//! Descriptor number → the [`OpenFile`] the library serves under it.
//!
//! Every Shoal file the library serves owns a real kernel descriptor number (a
//! placeholder, see `open_file.rs`), so the process's numbering stays what the kernel
//! says: the next `open`, `socket` or `pipe` gets the number it would get without the
//! library, `dup2` onto the number closes it in the kernel too, and a number is never
//! reused while the library still maps it (the placeholder holds it until the library
//! closes it, after removing the entry).
//!
//! **Reads are lock-free.** The table is pages of 1,024 slots made on first use (never
//! freed), each slot an `ArcSwapOption`: a lookup is two atomic loads and a reference
//! count increment, no lock, so threads reading and writing different (or the same)
//! descriptors do not serialise here, and a child after fork never finds a lock held by
//! a thread that did not follow it. A count of entries lets calls on other descriptors
//! return after one load when the library serves nothing.

use crate::open_file::OpenFile;
use arc_swap::ArcSwapOption;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Arc;

const PAGE: usize = 1024;
const PAGES: usize = 1024;
/// Descriptors at or above this are never served (the file goes to the kernel).
pub const MAX_FD: i32 = (PAGE * PAGES) as i32;

type Page = [ArcSwapOption<OpenFile>; PAGE];

static TABLE: [AtomicPtr<Page>; PAGES] = [const { AtomicPtr::new(std::ptr::null_mut()) }; PAGES];
/// Entries in the table.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Highest descriptor ever served, to bound scans.
static HIGH: AtomicI32 = AtomicI32::new(-1);

fn page(fd: i32, make: bool) -> Option<&'static Page> {
    if !(0..MAX_FD).contains(&fd) {
        return None;
    }
    let slot = &TABLE[fd as usize / PAGE];
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: pages are leaked boxes, never freed.
        return Some(unsafe { &*p });
    }
    if !make {
        return None;
    }
    let fresh: Box<Page> = Box::new(std::array::from_fn(|_| ArcSwapOption::empty()));
    let fresh = Box::into_raw(fresh);
    match slot.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just published, never freed.
        Ok(_) => Some(unsafe { &*fresh }),
        Err(other) => {
            // SAFETY: `fresh` lost the race and was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above.
            Some(unsafe { &*other })
        }
    }
}

/// The file served under `fd`.
#[inline]
pub fn get(fd: i32) -> Option<Arc<OpenFile>> {
    if LIVE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    page(fd, false)?[fd as usize % PAGE].load_full()
}

/// Serve `of` under `fd`; the file it replaces, if any (drop it outside any lock).
pub fn insert(fd: i32, of: Arc<OpenFile>) -> Option<Arc<OpenFile>> {
    let p = page(fd, true)?;
    HIGH.fetch_max(fd, Ordering::Relaxed);
    let old = p[fd as usize % PAGE].swap(Some(of));
    if old.is_none() {
        LIVE.fetch_add(1, Ordering::AcqRel);
    }
    old
}

/// Stop serving `fd`; what it served.
pub fn remove(fd: i32) -> Option<Arc<OpenFile>> {
    let p = page(fd, false)?;
    let old = p[fd as usize % PAGE].swap(None);
    if old.is_some() {
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
    old
}

/// Stop serving `fd` if it still serves `of` (another thread may have replaced it).
pub fn remove_if(fd: i32, of: &Arc<OpenFile>) -> bool {
    let Some(p) = page(fd, false) else { return false };
    let prev = p[fd as usize % PAGE].compare_and_swap(&Some(of.clone()), None);
    let removed = prev.as_ref().is_some_and(|p| Arc::ptr_eq(p, of));
    if removed {
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
    removed
}

/// Every descriptor served, with its file (a snapshot; entries may change meanwhile).
pub fn all() -> Vec<(i32, Arc<OpenFile>)> {
    let mut out = Vec::new();
    if LIVE.load(Ordering::Acquire) == 0 {
        return out;
    }
    for fd in 0..=HIGH.load(Ordering::Relaxed) {
        if let Some(p) = page(fd, false) {
            if let Some(of) = p[fd as usize % PAGE].load_full() {
                out.push((fd, of));
            }
        }
    }
    out
}

/// Replace the entry of `fd` unconditionally (the child after fork rebuilding its table);
/// the old entry is forgotten, not dropped.
pub fn replace_forgetting(fd: i32, of: Option<Arc<OpenFile>>) {
    let Some(p) = page(fd, false) else { return };
    let now_some = of.is_some();
    let old = p[fd as usize % PAGE].swap(of);
    match (old.is_some(), now_some) {
        (true, false) => {
            LIVE.fetch_sub(1, Ordering::AcqRel);
        }
        (false, true) => {
            LIVE.fetch_add(1, Ordering::AcqRel);
        }
        _ => {}
    }
    std::mem::forget(old);
}
