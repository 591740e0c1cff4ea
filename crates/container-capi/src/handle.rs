//! The handle every open container is behind (`shoal_container`, as SIONlib's `sid`), and
//! the calls on the logical file it has at hand: fwrite, fread, feof, seek, and so on.
//! These work the same on a task's parallel handle, on a serial reader (the rank selected)
//! and on a serial writer (the rank selected).

use crate::error::{fail, guard};
use crate::runtime::block;
use container::{Container, Logical, ParFile, SerialWriter};
use std::ffi::{c_char, c_int, c_void, CStr};

/// An open container: one task's share of a parallel open (`shoal_container_paropen`),
/// a whole container opened serially (`shoal_container_open`), one task's logical file
/// (`shoal_container_open_rank`) or a container being written serially
/// (`shoal_container_open_write`). A handle is used by one thread at a time.
#[allow(non_camel_case_types)]
pub struct shoal_container {
    pub(crate) kind: Kind,
    /// The key list being walked (`shoal_container_key_list_reset`/`_next`): every key
    /// with its records' lengths, and the next to hand out.
    pub(crate) keys: Option<(Vec<KeyRecords>, usize)>,
}

/// A key and the lengths of its records.
pub(crate) type KeyRecords = (u64, Vec<u64>);

pub(crate) enum Kind {
    Par(ParFile),
    /// `open_rank`: one logical file, for reading.
    Rank(Logical),
    Serial(Box<Serial>),
    Write(Box<Writer>),
}

/// A whole container open for reading, with the logical file of the selected rank.
pub(crate) struct Serial {
    pub(crate) c: Container,
    pub(crate) rank: u64,
    pub(crate) reader: Logical,
    /// What `get_locations` hands out, made at its first call and kept until the close
    /// (the caller reads the arrays in place).
    pub(crate) locs: Option<crate::serial::Locations>,
}

/// A container being written from one program, with the selected rank.
pub(crate) struct Writer {
    pub(crate) w: SerialWriter,
    pub(crate) rank: u64,
    pub(crate) ntasks: u64,
    pub(crate) nfiles: u32,
    pub(crate) fs_block: u64,
}

impl shoal_container {
    pub(crate) fn new(kind: Kind) -> *mut shoal_container {
        Box::into_raw(Box::new(shoal_container { kind, keys: None }))
    }

    /// The logical file calls act on; `None` (errno set) if it cannot be had.
    pub(crate) fn logical(&mut self) -> Option<&mut Logical> {
        match &mut self.kind {
            Kind::Par(f) => Some(f.logical()),
            Kind::Rank(l) => Some(l),
            Kind::Serial(s) => Some(&mut s.reader),
            Kind::Write(w) => match w.w.task(w.rank) {
                Ok(l) => Some(l),
                Err(e) => {
                    crate::error::fail_with(&e);
                    None
                }
            },
        }
    }
}

/// The handle behind `h`; `None` (EFAULT) for NULL.
pub(crate) fn handle<'a>(h: *mut shoal_container) -> Option<&'a mut shoal_container> {
    if h.is_null() {
        fail(libc::EFAULT, "the shoal_container is NULL");
        return None;
    }
    // SAFETY: a non-NULL handle comes from an open call and is not closed yet; one thread
    // at a time uses it (documented).
    Some(unsafe { &mut *h })
}

/// A C string argument as UTF-8; `None` (EFAULT or EINVAL set) if it is NULL or not UTF-8.
pub(crate) fn text<'a>(p: *const c_char, what: &str) -> Option<&'a str> {
    if p.is_null() {
        fail(libc::EFAULT, format_args!("{what} is NULL"));
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string that lives for the call.
    match unsafe { CStr::from_ptr(p) }.to_str() {
        Ok(s) => Some(s),
        Err(_) => {
            fail(libc::EINVAL, format_args!("{what} is not UTF-8"));
            None
        }
    }
}

/// An optional C string (NULL: `Some(None)`); `None` (EINVAL set) if it is not UTF-8.
pub(crate) fn opt_text<'a>(p: *const c_char, what: &str) -> Option<Option<&'a str>> {
    if p.is_null() {
        return Some(None);
    }
    text(p, what).map(Some)
}

/// `size * nmemb` bytes at `ptr`: `None` (EINVAL, EFAULT) when they overflow or `ptr` is
/// NULL with bytes to move; `Some(0)` moves nothing.
pub(crate) fn total(ptr: *const c_void, size: usize, nmemb: usize, what: &str) -> Option<usize> {
    let Some(n) = size.checked_mul(nmemb) else {
        fail(libc::EINVAL, format_args!("{what}: {nmemb} items of {size} bytes overflow"));
        return None;
    };
    if n > 0 && ptr.is_null() {
        fail(libc::EFAULT, format_args!("{what}: the buffer is NULL"));
        return None;
    }
    Some(n)
}

/// The fwrite-shaped calls: the `size * nmemb` bytes at `ptr` handed to `write` with the
/// handle's logical file. Returns `nmemb`, or 0 (errno set) on failure, and 0 when there
/// is nothing to write.
pub(crate) fn write_items(
    ptr: *const c_void,
    size: usize,
    nmemb: usize,
    h: *mut shoal_container,
    what: &str,
    write: impl FnOnce(&mut Logical, &[u8]) -> Option<()>,
) -> usize {
    guard(0, || {
        let Some(h) = handle(h) else { return 0 };
        let Some(n) = total(ptr, size, nmemb, what) else { return 0 };
        if n == 0 {
            return 0;
        }
        // SAFETY: the caller's `n` bytes at `ptr` (non-NULL, checked), alive for the call.
        let data = unsafe { std::slice::from_raw_parts(ptr as *const u8, n) };
        let Some(l) = h.logical() else { return 0 };
        write(l, data).map_or(0, |_| nmemb)
    })
}

/// The fread-shaped calls: `read` fills the `size * nmemb` bytes at `ptr` from the handle's
/// logical file and says how many it read. Returns the whole items read, or 0 (errno set).
pub(crate) fn read_items(
    ptr: *mut c_void,
    size: usize,
    nmemb: usize,
    h: *mut shoal_container,
    what: &str,
    read: impl FnOnce(&mut Logical, &mut [u8]) -> Option<usize>,
) -> usize {
    guard(0, || {
        let Some(h) = handle(h) else { return 0 };
        let Some(n) = total(ptr, size, nmemb, what) else { return 0 };
        if n == 0 {
            return 0;
        }
        // SAFETY: the caller's buffer of `n` bytes (non-NULL, checked). It may be
        // uninitialised: zero it first, so that the slice made of it holds valid bytes.
        let buf = unsafe {
            std::ptr::write_bytes(ptr as *mut u8, 0, n);
            std::slice::from_raw_parts_mut(ptr as *mut u8, n)
        };
        let Some(l) = h.logical() else { return 0 };
        read(l, buf).map_or(0, |got| got / size)
    })
}

/// Write `nmemb` items of `size` bytes from `ptr` at the position of the handle's logical
/// file, going on into its next chunks as each fills (no communication). Returns `nmemb`,
/// or 0 on failure (errno set), as fwrite(3); 0 also when `size` or `nmemb` is 0. To keep
/// a piece whole in one chunk, call `shoal_container_ensure_free_space` first.
#[no_mangle]
pub extern "C" fn shoal_container_fwrite(
    ptr: *const c_void,
    size: usize,
    nmemb: usize,
    h: *mut shoal_container,
) -> usize {
    write_items(ptr, size, nmemb, h, "fwrite", |l, data| block(l.write(data)))
}

/// Read up to `nmemb` items of `size` bytes into `ptr` from the position of the handle's
/// logical file, across its chunks. Returns the whole items read, as fread(3): fewer than
/// `nmemb` at the end of the logical file (`shoal_container_feof` then says 1; the bytes
/// of a last partial item are in `ptr` all the same), or 0 with errno set on failure.
#[no_mangle]
pub extern "C" fn shoal_container_fread(ptr: *mut c_void, size: usize, nmemb: usize, h: *mut shoal_container) -> usize {
    read_items(ptr, size, nmemb, h, "fread", |l, buf| block(l.read(buf)))
}

/// Make sure the next `nbytes` bytes written fit in the current chunk, moving to the
/// task's chunk of the next block if they do not. 0, or -1 (EINVAL: more than a chunk, or
/// not open for writing).
#[no_mangle]
pub extern "C" fn shoal_container_ensure_free_space(h: *mut shoal_container, nbytes: u64) -> c_int {
    guard(-1, || {
        let Some(l) = handle(h).and_then(|h| h.logical()) else { return -1 };
        match l.ensure_free_space(nbytes) {
            Ok(()) => 0,
            Err(e) => {
                crate::error::fail_with(&e);
                -1
            }
        }
    })
}

/// 1 at the end of the logical file (nothing left in the current chunk or after it),
/// 0 before it, -1 for a NULL handle.
#[no_mangle]
pub extern "C" fn shoal_container_feof(h: *mut shoal_container) -> c_int {
    guard(-1, || match handle(h).and_then(|h| h.logical()) {
        Some(l) => l.feof() as c_int,
        None => -1,
    })
}

/// Bytes left to read in the current chunk (writing: room left in it), or -1.
#[no_mangle]
pub extern "C" fn shoal_container_bytes_avail_in_chunk(h: *mut shoal_container) -> i64 {
    guard(-1, || match handle(h).and_then(|h| h.logical()) {
        Some(l) => l.bytes_avail_in_chunk() as i64,
        None => -1,
    })
}

/// Go to offset `pos` of chunk `block` (from 0) of the logical file: reading, within what
/// was written there; writing, within the chunk. 0, or -1 (EINVAL).
#[no_mangle]
pub extern "C" fn shoal_container_seek(h: *mut shoal_container, block: u64, pos: u64) -> c_int {
    guard(-1, || {
        let Some(l) = handle(h).and_then(|h| h.logical()) else { return -1 };
        match l.seek(block, pos) {
            Ok(()) => 0,
            Err(e) => {
                crate::error::fail_with(&e);
                -1
            }
        }
    })
}

/// Go to byte `offset` of the logical file (reading), wherever its chunks put it. 0, or
/// -1 (EINVAL past the end).
#[no_mangle]
pub extern "C" fn shoal_container_seek_logical(h: *mut shoal_container, offset: u64) -> c_int {
    guard(-1, || {
        let Some(l) = handle(h).and_then(|h| h.logical()) else { return -1 };
        match l.seek_logical(offset) {
            Ok(()) => 0,
            Err(e) => {
                crate::error::fail_with(&e);
                -1
            }
        }
    })
}

/// The position: chunk (block number) into `*block`, offset in it into `*pos` (either
/// may be NULL). Returns the position as an offset in the logical file, or -1.
#[no_mangle]
pub extern "C" fn shoal_container_tell(h: *mut shoal_container, block: *mut u64, pos: *mut u64) -> i64 {
    guard(-1, || {
        let Some(l) = handle(h).and_then(|h| h.logical()) else { return -1 };
        let (b, p) = l.position();
        // SAFETY: each pointer, when not NULL, is a u64 of the caller's.
        unsafe {
            if !block.is_null() {
                *block = b;
            }
            if !pos.is_null() {
                *pos = p;
            }
        }
        l.logical_offset() as i64
    })
}

/// What a handle knows of its container and of the logical file it has at hand. Fields a
/// handle does not know are 0: a handle of `shoal_container_open_rank` reads only the
/// metadata it needs and knows neither `ntasks` nor `nfiles`, `file_number` nor
/// `fs_block`; a serial writer knows no `file_number`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct shoal_container_info {
    /// The rank of the logical file at hand (the task's own, or the selected one).
    pub rank: u64,
    /// Tasks (logical files) of the container.
    pub ntasks: u64,
    /// The physical file holding this logical file, and how many the container has.
    pub file_number: u32,
    pub nfiles: u32,
    /// Bytes of each of its chunks (the chunk size asked for, rounded up to `fs_block`).
    pub chunk_size: u64,
    /// The block size chunks are aligned to.
    pub fs_block: u64,
    /// Chunks it has reached (blocks), and the bytes in them.
    pub nchunks: u64,
    pub bytes: u64,
    /// 1 if open for writing.
    pub writing: c_int,
}

/// Fill `*out` with what `h` knows of its container. 0, or -1 (EFAULT).
#[no_mangle]
pub extern "C" fn shoal_container_get_info(h: *mut shoal_container, out: *mut shoal_container_info) -> c_int {
    guard(-1, || {
        let Some(h) = handle(h) else { return -1 };
        if out.is_null() {
            fail(libc::EFAULT, "the shoal_container_info to fill is NULL");
            return -1;
        }
        let mut i = shoal_container_info::default();
        match &h.kind {
            Kind::Par(f) => {
                let t = f.info();
                (i.ntasks, i.file_number, i.nfiles, i.fs_block) = (t.ntasks, t.file_number, t.nfiles, t.fs_block);
            }
            Kind::Rank(_) => {}
            Kind::Serial(s) => {
                i.ntasks = s.c.ntasks();
                i.nfiles = s.c.nfiles();
                i.file_number = s.c.location(s.rank).map_or(0, |l| l.file_number);
                i.fs_block = s.c.files().first().map_or(0, |m| m.header.fs_block);
            }
            Kind::Write(w) => (i.ntasks, i.nfiles, i.fs_block) = (w.ntasks, w.nfiles, w.fs_block),
        }
        let Some(l) = h.logical() else { return -1 };
        let c = l.chunks();
        i.rank = c.slot.rank;
        i.chunk_size = c.slot.chunk_len;
        i.nchunks = c.used.len() as u64;
        i.bytes = c.len();
        i.writing = l.is_writing() as c_int;
        // SAFETY: non-NULL (checked), a shoal_container_info of the caller's.
        unsafe { *out = i };
        0
    })
}
