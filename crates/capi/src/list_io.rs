//! List I/O (PVFS): many file extents to and from many memory segments in one call, with
//! one request per server (`shoal_client::File::read_list` / `write_list`).
//!
//! The memory segments, taken in order, and the file extents, taken in order, are two views
//! of one stream of bytes: their total lengths must be equal. Byte k of the stream goes
//! between the k-th byte of the memory segments and the k-th byte of the file extents.

use crate::error::{fail, guard};
use crate::file::{bytes_of, file, shoal_file};
use crate::future::{shoal_callback, shoal_future, start};
use bytes::{Bytes, BytesMut};
use std::ffi::c_void;

/// A piece of the caller's memory: `len` bytes at `base`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct shoal_segment {
    pub base: *mut c_void,
    pub len: usize,
}

/// A piece of the file: `len` bytes at `offset`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct shoal_extent {
    pub offset: u64,
    pub len: u64,
}

/// The caller's lists, checked: the same total on both sides, no NULL with a length.
struct Lists {
    mem: Vec<(usize, usize)>,
    file: Vec<(u64, usize)>,
}

// SAFETY: the memory segments stay valid (and, for a read, untouched) until the call
// returns or its future completes or is cancelled (documented); a read writes them only
// while the future's result is unset (see `future::start`).
unsafe impl Send for Lists {}

fn lists(mem: *const shoal_segment, mem_count: usize, ext: *const shoal_extent, ext_count: usize) -> Option<Lists> {
    if (mem.is_null() && mem_count > 0) || (ext.is_null() && ext_count > 0) {
        fail(libc::EFAULT, "list I/O: a list is NULL");
        return None;
    }
    // SAFETY: the caller's arrays of `mem_count` and `ext_count` items, alive for the call.
    let (mem, ext) = unsafe {
        (
            if mem_count == 0 { &[][..] } else { std::slice::from_raw_parts(mem, mem_count) },
            if ext_count == 0 { &[][..] } else { std::slice::from_raw_parts(ext, ext_count) },
        )
    };
    if mem.iter().any(|s| s.base.is_null() && s.len > 0) {
        fail(libc::EFAULT, "list I/O: a memory segment is NULL");
        return None;
    }
    let mem_total: u128 = mem.iter().map(|s| s.len as u128).sum();
    let file_total: u128 = ext.iter().map(|e| e.len as u128).sum();
    if mem_total != file_total {
        fail(libc::EINVAL, format_args!("list I/O: {mem_total} bytes of memory for {file_total} bytes of file"));
        return None;
    }
    if ext.iter().any(|e| e.offset.checked_add(e.len).is_none()) {
        fail(libc::EINVAL, "list I/O: an extent ends past the largest offset");
        return None;
    }
    Some(Lists {
        mem: mem.iter().map(|s| (s.base as usize, s.len)).collect(),
        file: ext.iter().map(|e| (e.offset, e.len as usize)).collect(),
    })
}

impl Lists {
    /// Copy each extent's bytes (`got[i]`, at most its length) to its place in the stream,
    /// i.e. into the memory segments. Returns the bytes copied.
    fn scatter(&self, got: &[Bytes]) -> i64 {
        let mut seg = 0; // current memory segment
        let mut seg_at = 0; // bytes of it used
        let mut total = 0;
        for ((_, len), data) in self.file.iter().zip(got) {
            // The extent's place in the stream: its `len` bytes, of which `data` is a prefix.
            let mut left = *len;
            let mut from = 0;
            while left > 0 {
                // Empty segments hold no byte of the stream. The totals are equal, so a
                // segment with room is there while bytes are left.
                while self.mem[seg].1 == 0 {
                    seg += 1;
                }
                let (base, seg_len) = self.mem[seg];
                let take = (seg_len - seg_at).min(left);
                let have = data.len().saturating_sub(from).min(take);
                if have > 0 {
                    // SAFETY: `base` is the caller's segment of `seg_len` bytes, and
                    // seg_at + have <= seg_len.
                    unsafe {
                        std::ptr::copy_nonoverlapping(data[from..].as_ptr(), (base as *mut u8).add(seg_at), have)
                    };
                    total += have as i64;
                }
                from += take;
                left -= take;
                seg_at += take;
                if seg_at == seg_len {
                    seg += 1;
                    seg_at = 0;
                }
            }
        }
        total
    }

    /// The stream gathered from the memory segments, cut into the extents' pieces.
    fn gather(&self) -> Vec<(u64, Bytes)> {
        let mut all = BytesMut::with_capacity(self.mem.iter().map(|m| m.1).sum());
        for &(base, len) in &self.mem {
            if let Some(b) = bytes_of(base as *const c_void, len) {
                all.extend_from_slice(b);
            }
        }
        let all = all.freeze();
        let mut at = 0;
        self.file
            .iter()
            .map(|&(off, len)| {
                let piece = (off, all.slice(at..at + len));
                at += len;
                piece
            })
            .collect()
    }
}

/// Read the file extents `ext[0..ext_count]` into the memory segments `mem[0..mem_count]`
/// (equal totals), with one request per server and data sieving over small holes. Returns
/// the bytes read (fewer than the total when extents reach past the end of the file: their
/// bytes from the end on are left as they were), or -1 (errno set).
#[no_mangle]
pub extern "C" fn shoal_read_list(
    f: *const shoal_file,
    mem: *const shoal_segment,
    mem_count: usize,
    ext: *const shoal_extent,
    ext_count: usize,
) -> i64 {
    guard(-1, || {
        let Some(f) = file(f) else { return -1 };
        let Some(l) = lists(mem, mem_count, ext, ext_count) else { return -1 };
        let Some(got) = f.block(f.file.read_list(&l.file)) else { return -1 };
        l.scatter(&got)
    })
}

/// Write the memory segments `mem[0..mem_count]` to the file extents `ext[0..ext_count]`
/// (equal totals), with one request per server. Returns the bytes written or -1 (errno
/// set). Extents are written in order: where two overlap, the later one's bytes stay.
#[no_mangle]
pub extern "C" fn shoal_write_list(
    f: *const shoal_file,
    mem: *const shoal_segment,
    mem_count: usize,
    ext: *const shoal_extent,
    ext_count: usize,
) -> i64 {
    guard(-1, || {
        let Some(f) = file(f) else { return -1 };
        let Some(l) = lists(mem, mem_count, ext, ext_count) else { return -1 };
        let pieces = l.gather();
        let total: usize = pieces.iter().map(|p| p.1.len()).sum();
        match f.block(f.file.write_list(&pieces)) {
            Some(()) => total as i64,
            None => -1,
        }
    })
}

/// `shoal_read_list`, asynchronously. The arrays may be freed when the call returns; the
/// memory segments must stay valid until the future completed or was cancelled. Result:
/// bytes read or -errno. NULL on a bad argument (errno set).
#[no_mangle]
pub extern "C" fn shoal_read_list_async(
    f: *const shoal_file,
    mem: *const shoal_segment,
    mem_count: usize,
    ext: *const shoal_extent,
    ext_count: usize,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(std::ptr::null_mut(), || {
        let Some(f) = file(f) else { return std::ptr::null_mut() };
        let Some(l) = lists(mem, mem_count, ext, ext_count) else { return std::ptr::null_mut() };
        let handle = f.file.clone();
        let extents = l.file.clone();
        start(&f.rt, cb, user, async move { handle.read_list(&extents).await }, move |got| {
            let l = l;
            l.scatter(&got)
        })
    })
}

/// `shoal_write_list`, asynchronously: the bytes are copied before it returns, so the
/// segments may be reused at once. Result: bytes written or -errno. NULL on a bad argument.
#[no_mangle]
pub extern "C" fn shoal_write_list_async(
    f: *const shoal_file,
    mem: *const shoal_segment,
    mem_count: usize,
    ext: *const shoal_extent,
    ext_count: usize,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(std::ptr::null_mut(), || {
        let Some(f) = file(f) else { return std::ptr::null_mut() };
        let Some(l) = lists(mem, mem_count, ext, ext_count) else { return std::ptr::null_mut() };
        let pieces = l.gather();
        let total: usize = pieces.iter().map(|p| p.1.len()).sum();
        let handle = f.file.clone();
        start(&f.rt, cb, user, async move { handle.write_list(&pieces).await }, move |()| total as i64)
    })
}
