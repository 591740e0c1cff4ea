//! Key-value records (SIONlib's `sion_fwrite_key`, `sion_fread_key`, `sion_seek_key`, the
//! key list iterator and `sion_key_get_stat`) and collective I/O through collector tasks
//! (`sion_coll_fwrite`/`sion_coll_fread`). A container is written in key-value mode, or
//! with collectors, when `shoal_container_paropen`'s mode says so ("w,keyval",
//! "w,collsize=N").

use crate::error::{fail, guard};
use crate::handle::{handle, read_items, shoal_container, total, write_items, Kind};
use crate::runtime::block;
use std::ffi::{c_int, c_void};

/// Write `nmemb` items of `size` bytes from `ptr` as one record under `key`. Returns
/// `nmemb`, or 0 with errno set (EINVAL: not a key-value container), as fwrite(3).
#[no_mangle]
pub extern "C" fn shoal_container_fwrite_key(
    ptr: *const c_void,
    key: u64,
    size: usize,
    nmemb: usize,
    h: *mut shoal_container,
) -> usize {
    write_items(ptr, size, nmemb, h, "fwrite_key", |l, data| block(l.write_key(key, data)))
}

/// Read up to `nmemb` items of `size` bytes of `key`'s data into `ptr`, going on from
/// where the last read of `key` stopped, across its records in the order they were
/// written. Returns the whole items read (fewer at the end of the key's data), or 0 with
/// errno set.
#[no_mangle]
pub extern "C" fn shoal_container_fread_key(
    ptr: *mut c_void,
    key: u64,
    size: usize,
    nmemb: usize,
    h: *mut shoal_container,
) -> usize {
    read_items(ptr, size, nmemb, h, "fread_key", |l, buf| block(l.read_key(key, buf)))
}

/// Place `key`'s read position at byte `pos` of its record number `entry` (from 0).
/// 0, or -1 with errno set (EINVAL: no such record, or `pos` past its end).
#[no_mangle]
pub extern "C" fn shoal_container_seek_key(h: *mut shoal_container, key: u64, entry: u64, pos: u64) -> c_int {
    guard(-1, || {
        let Some(l) = handle(h).and_then(|h| h.logical()) else { return -1 };
        block(l.seek_key(key, entry as usize, pos)).map_or(-1, |_| 0)
    })
}

/// Start listing the keys of the handle's logical file from the smallest (scans the whole
/// logical file once). 0, or -1 with errno set.
#[no_mangle]
pub extern "C" fn shoal_container_key_list_reset(h: *mut shoal_container) -> c_int {
    guard(-1, || {
        let Some(h) = handle(h) else { return -1 };
        let Some(l) = h.logical() else { return -1 };
        let Some(keys) = block(l.keys()) else { return -1 };
        h.keys = Some((keys, 0));
        0
    })
}

/// The next key of the list started by `shoal_container_key_list_reset`, in increasing
/// order, into `*key`. 1 when a key was given, 0 at the end of the list, -1 with errno set
/// (EINVAL if the list was not started).
#[no_mangle]
pub extern "C" fn shoal_container_key_list_next(h: *mut shoal_container, key: *mut u64) -> c_int {
    guard(-1, || {
        let Some(h) = handle(h) else { return -1 };
        if key.is_null() {
            fail(libc::EFAULT, "key_list_next: key is NULL");
            return -1;
        }
        let Some((keys, next)) = &mut h.keys else {
            fail(libc::EINVAL, "key_list_next before key_list_reset");
            return -1;
        };
        let Some((k, _)) = keys.get(*next) else { return 0 };
        // SAFETY: non-NULL (checked), the caller's u64.
        unsafe { *key = *k };
        *next += 1;
        1
    })
}

/// How many records `key` has and how many bytes they hold together, into `*records` and
/// `*bytes` (both 0 for a key never written). 0, or -1 with errno set.
#[no_mangle]
pub extern "C" fn shoal_container_key_stat(
    h: *mut shoal_container,
    key: u64,
    records: *mut u64,
    bytes: *mut u64,
) -> c_int {
    guard(-1, || {
        if records.is_null() || bytes.is_null() {
            fail(libc::EFAULT, "key_stat: records or bytes is NULL");
            return -1;
        }
        let Some(l) = handle(h).and_then(|h| h.logical()) else { return -1 };
        let Some(keys) = block(l.keys()) else { return -1 };
        let lens = keys.into_iter().find(|(k, _)| *k == key).map(|(_, l)| l).unwrap_or_default();
        // SAFETY: non-NULL (checked), the caller's u64s.
        unsafe {
            *records = lens.len() as u64;
            *bytes = lens.iter().sum();
        }
        0
    })
}

/// The task's parallel handle, for the collective calls; `None` (EINVAL) otherwise.
fn par<'a>(h: *mut shoal_container, what: &str) -> Option<&'a mut container::ParFile> {
    match handle(h)?.kind {
        Kind::Par(ref mut f) => Some(f),
        _ => {
            fail(libc::EINVAL, format_args!("{what}: a collective call needs a handle of shoal_container_paropen"));
            None
        }
    }
}

/// Write `nmemb` items of `size` bytes, collectively: every task of the container calls it
/// together (each with its own data, possibly none). With collectors ("w,collsize=N"), the
/// first task of each group of N writes the group's data in one piece; without, each task
/// writes its own. Returns `nmemb`, or 0 with errno set (then on every task of the group).
#[no_mangle]
pub extern "C" fn shoal_container_coll_fwrite(
    ptr: *const c_void,
    size: usize,
    nmemb: usize,
    h: *mut shoal_container,
) -> usize {
    guard(0, || {
        let Some(n) = total(ptr, size, nmemb, "coll_fwrite") else { return 0 };
        let Some(f) = par(h, "coll_fwrite") else { return 0 };
        // SAFETY: the caller's `n` bytes at `ptr` (non-NULL when n > 0, checked).
        let data = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(ptr as *const u8, n) } };
        block(f.fwrite_coll(data)).map_or(0, |_| nmemb)
    })
}

/// Read up to `nmemb` items of `size` bytes, collectively (see
/// `shoal_container_coll_fwrite`). Returns the whole items read, or 0 with errno set.
#[no_mangle]
pub extern "C" fn shoal_container_coll_fread(
    ptr: *mut c_void,
    size: usize,
    nmemb: usize,
    h: *mut shoal_container,
) -> usize {
    guard(0, || {
        let Some(n) = total(ptr, size, nmemb, "coll_fread") else { return 0 };
        let Some(f) = par(h, "coll_fread") else { return 0 };
        let buf = if n == 0 {
            &mut [][..]
        } else {
            // SAFETY: the caller's buffer of `n` bytes (non-NULL, checked), zeroed first.
            unsafe {
                std::ptr::write_bytes(ptr as *mut u8, 0, n);
                std::slice::from_raw_parts_mut(ptr as *mut u8, n)
            }
        };
        block(f.fread_coll(buf)).map_or(0, |got| got.checked_div(size).unwrap_or(0))
    })
}
