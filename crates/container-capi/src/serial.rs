//! The serial API (SIONlib's `sion_open`, `sion_open_rank`, `sion_get_locations`,
//! `sion_close`): a plain program reads a whole container, or one task's logical file, or
//! writes a container for many tasks.

use crate::error::{fail, fail_with, guard};
use crate::handle::{handle, opt_text, shoal_container, text, Kind, Serial, Writer};
use crate::par::files;
use crate::runtime::{block, target};
use container::{Container, SerialWriter, WriteOptions};
use std::ffi::{c_char, c_int};

/// Open the closed container `name` whole, for reading (every physical file's metadata is
/// read). Rank 0's logical file is at hand; `shoal_container_select_rank` picks another.
/// `name` and `config` as for `shoal_container_paropen`. NULL on failure (errno set:
/// EBADMSG for a truncated or corrupted container, the message names the file and block).
#[no_mangle]
pub extern "C" fn shoal_container_open(name: *const c_char, config: *const c_char) -> *mut shoal_container {
    guard(std::ptr::null_mut(), || {
        let (Some(name), Some(config)) = (text(name, "the container name"), opt_text(config, "the configuration path"))
        else {
            return std::ptr::null_mut();
        };
        let Some((target, path)) = target(name, config) else { return std::ptr::null_mut() };
        let opened = block(async {
            let c = Container::open(&target, &path).await?;
            let reader = c.reader(0).await?;
            Ok(Serial { c, rank: 0, reader, locs: None })
        });
        opened.map_or(std::ptr::null_mut(), |s| shoal_container::new(Kind::Serial(Box::new(s))))
    })
}

/// Open the logical file of task `rank` of the closed container `name`, for reading,
/// reading only the metadata it needs. NULL on failure (EINVAL: no such rank).
#[no_mangle]
pub extern "C" fn shoal_container_open_rank(
    name: *const c_char,
    rank: u64,
    config: *const c_char,
) -> *mut shoal_container {
    guard(std::ptr::null_mut(), || {
        let (Some(name), Some(config)) = (text(name, "the container name"), opt_text(config, "the configuration path"))
        else {
            return std::ptr::null_mut();
        };
        let Some((target, path)) = target(name, config) else { return std::ptr::null_mut() };
        block(container::open_rank(&target, &path, rank))
            .map_or(std::ptr::null_mut(), |l| shoal_container::new(Kind::Rank(l)))
    })
}

/// Create (or replace) the container `name` for `ntasks` tasks from one program, task `i`
/// with chunks of `chunksizes[i]` bytes; `nfiles`, `fs_block`, `config` as for
/// `shoal_container_paropen`. Rank 0 is at hand; `shoal_container_select_rank` picks
/// another (each task keeps its position). Close with `shoal_container_close`. NULL on
/// failure.
#[no_mangle]
pub extern "C" fn shoal_container_open_write(
    name: *const c_char,
    ntasks: u64,
    chunksizes: *const u64,
    nfiles: c_int,
    fs_block: u64,
    config: *const c_char,
) -> *mut shoal_container {
    guard(std::ptr::null_mut(), || {
        let (Some(name), Some(config)) = (text(name, "the container name"), opt_text(config, "the configuration path"))
        else {
            return std::ptr::null_mut();
        };
        let Some(nfiles) = files(nfiles) else { return std::ptr::null_mut() };
        if ntasks == 0 || usize::try_from(ntasks).is_err() {
            fail(libc::EINVAL, format_args!("open_write: {ntasks} tasks"));
            return std::ptr::null_mut();
        }
        if chunksizes.is_null() {
            fail(libc::EFAULT, "open_write: the chunk sizes are NULL");
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's array of `ntasks` sizes (non-NULL, checked).
        let sizes = unsafe { std::slice::from_raw_parts(chunksizes, ntasks as usize) };
        if let Some(r) = sizes.iter().position(|&s| s == 0) {
            fail(libc::EINVAL, format_args!("open_write: task {r} has a chunk size of 0 bytes"));
            return std::ptr::null_mut();
        }
        let Some((target, path)) = target(name, config) else { return std::ptr::null_mut() };
        let opts = WriteOptions { nfiles, fs_block, ..WriteOptions::default() };
        block(SerialWriter::create(&target, &path, sizes, &opts)).map_or(std::ptr::null_mut(), |w| {
            shoal_container::new(Kind::Write(Box::new(Writer { w, rank: 0, ntasks, nfiles, fs_block })))
        })
    })
}

/// Put the logical file of task `rank` at hand: for a container opened with
/// `shoal_container_open`, from its start; for one of `shoal_container_open_write`, where
/// that task left off. 0, or -1 (EINVAL: no such rank, or another kind of handle).
#[no_mangle]
pub extern "C" fn shoal_container_select_rank(h: *mut shoal_container, rank: u64) -> c_int {
    guard(-1, || {
        let Some(h) = handle(h) else { return -1 };
        match &mut h.kind {
            Kind::Serial(s) => match block(s.c.reader(rank)) {
                Some(reader) => {
                    (s.rank, s.reader) = (rank, reader);
                    0
                }
                None => -1,
            },
            Kind::Write(w) if rank < w.ntasks => {
                w.rank = rank;
                0
            }
            Kind::Write(w) => {
                fail(libc::EINVAL, format_args!("select_rank: no rank {rank} (the container has {} tasks)", w.ntasks));
                -1
            }
            _ => {
                fail(libc::EINVAL, "select_rank on a handle of paropen or open_rank (it has one logical file)");
                -1
            }
        }
    })
}

/// Every task's chunks, as `get_locations` hands them out.
pub(crate) struct Locations {
    maxchunks: u64,
    chunksizes: Vec<u64>,
    blockcount: Vec<u64>,
    blocksizes: Vec<u64>,
}

impl Locations {
    fn of(c: &Container) -> container::Result<Locations> {
        let locs = (0..c.ntasks()).map(|r| c.location(r)).collect::<container::Result<Vec<_>>>()?;
        let maxchunks = locs.iter().map(|l| l.used.len() as u64).max().unwrap_or(0);
        let mut blocksizes = vec![0; locs.len() * maxchunks as usize];
        for (r, l) in locs.iter().enumerate() {
            blocksizes[r * maxchunks as usize..][..l.used.len()].copy_from_slice(&l.used);
        }
        Ok(Locations {
            maxchunks,
            chunksizes: locs.iter().map(|l| l.chunk_len).collect(),
            blockcount: locs.iter().map(|l| l.used.len() as u64).collect(),
            blocksizes,
        })
    }
}

/// Where every task's data lies, as `sion_get_locations`, for a handle of
/// `shoal_container_open`: `*ntasks`; `*maxchunks`, the most chunks any task has;
/// `*chunksizes`, each task's chunk size (`ntasks` entries); `*blockcount`, the chunks each
/// task wrote (`ntasks`); `*blocksizes`, the bytes in each, task `r`'s chunk `b` at
/// `[r * maxchunks + b]` (0 past its `blockcount`). The arrays belong to the handle and
/// stay valid until `shoal_container_close`. Any out pointer may be NULL. 0, or -1.
#[no_mangle]
pub extern "C" fn shoal_container_get_locations(
    h: *mut shoal_container,
    ntasks: *mut u64,
    maxchunks: *mut u64,
    chunksizes: *mut *const u64,
    blockcount: *mut *const u64,
    blocksizes: *mut *const u64,
) -> c_int {
    guard(-1, || {
        let Some(h) = handle(h) else { return -1 };
        let Kind::Serial(s) = &mut h.kind else {
            fail(libc::EINVAL, "get_locations needs a handle of shoal_container_open");
            return -1;
        };
        if s.locs.is_none() {
            match Locations::of(&s.c) {
                Ok(l) => s.locs = Some(l),
                Err(e) => {
                    fail_with(&e);
                    return -1;
                }
            }
        }
        let l = s.locs.as_ref().expect("made above");
        // SAFETY: each out pointer, when not NULL, points at a value of the caller's; the
        // arrays handed out live in the handle until it is closed.
        unsafe {
            put(ntasks, s.c.ntasks());
            put(maxchunks, l.maxchunks);
            put(chunksizes, l.chunksizes.as_ptr());
            put(blockcount, l.blockcount.as_ptr());
            put(blocksizes, l.blocksizes.as_ptr());
        }
        0
    })
}

/// `*p = v` unless `p` is NULL.
///
/// # Safety
/// `p` is NULL or valid for a write of a `T`.
unsafe fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        *p = v;
    }
}

/// Where one task's logical file lies.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct shoal_container_location {
    pub rank: u64,
    /// Its physical file: 0 is the container's name, `f` is `name.<f, 6 digits>`.
    pub file_number: u32,
    /// Bytes of each of its chunks.
    pub chunk_size: u64,
    /// Chunks it wrote, and the bytes in them (its logical file's length).
    pub nchunks: u64,
    pub bytes: u64,
}

/// Where task `rank`'s logical file lies, for a handle of `shoal_container_open`: into
/// `*out`, and for each of its chunks where it starts in its physical file
/// (`chunk_starts`) and the bytes written in it (`used`), arrays of `cap` entries (either
/// may be NULL). Returns the number of chunks; a `cap` of 0 only asks for it, a `cap` too
/// small is ERANGE with the arrays untouched. -1 on failure (EINVAL: no such rank).
#[no_mangle]
pub extern "C" fn shoal_container_get_location(
    h: *mut shoal_container,
    rank: u64,
    out: *mut shoal_container_location,
    chunk_starts: *mut u64,
    used: *mut u64,
    cap: usize,
) -> i64 {
    guard(-1, || {
        let Some(h) = handle(h) else { return -1 };
        let Kind::Serial(s) = &h.kind else {
            fail(libc::EINVAL, "get_location needs a handle of shoal_container_open");
            return -1;
        };
        let l = match s.c.location(rank) {
            Ok(l) => l,
            Err(e) => {
                fail_with(&e);
                return -1;
            }
        };
        let n = l.used.len();
        if cap > 0 && cap < n {
            fail(libc::ERANGE, format_args!("rank {rank} has {n} chunks, more than the {cap} asked for"));
            return -1;
        }
        // SAFETY: `out` NULL or the caller's struct; the arrays NULL or of `cap` >= n
        // entries of the caller's.
        unsafe {
            let loc = shoal_container_location {
                rank,
                file_number: l.file_number,
                chunk_size: l.chunk_len,
                nchunks: n as u64,
                bytes: l.used.iter().sum(),
            };
            put(out, loc);
            if cap > 0 {
                if !chunk_starts.is_null() {
                    std::ptr::copy_nonoverlapping(l.chunk_starts.as_ptr(), chunk_starts, n);
                }
                if !used.is_null() {
                    std::ptr::copy_nonoverlapping(l.used.as_ptr(), used, n);
                }
            }
        }
        n as i64
    })
}

/// Close a serial handle (`shoal_container_open`, `_open_rank`, `_open_write`) and free
/// it, whatever the result. For a writer, every task's logical file is closed and the
/// container is complete and durable when this returns 0. 0, or -1 with errno set; EINVAL
/// (handle kept) for a handle of `shoal_container_paropen`, which
/// `shoal_container_parclose` closes, collectively.
#[no_mangle]
pub extern "C" fn shoal_container_close(h: *mut shoal_container) -> c_int {
    guard(-1, || {
        if h.is_null() {
            fail(libc::EFAULT, "close: the shoal_container is NULL");
            return -1;
        }
        // SAFETY: non-NULL, from an open call, not closed yet.
        if matches!(unsafe { &(*h).kind }, Kind::Par(_)) {
            fail(libc::EINVAL, "close of a parallel handle (close it with shoal_container_parclose, collectively)");
            return -1;
        }
        // SAFETY: as above; from here `h` is gone whatever the outcome.
        match unsafe { Box::from_raw(h) }.kind {
            Kind::Write(w) => block(w.w.close()).map_or(-1, |_| 0),
            _ => 0,
        }
    })
}
