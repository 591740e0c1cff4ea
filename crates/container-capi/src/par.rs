//! Collective open and close (SIONlib's `sion_paropen`/`sion_parclose`).

use crate::comm::{shoal_comm, CComm};
use crate::error::{fail, guard};
use crate::handle::{opt_text, shoal_container, text, Kind};
use crate::runtime::{block, target};
use container::{ParFile, WriteOptions, COLLECTOR_AUTO};
use std::ffi::{c_char, c_int};

/// How a container is opened, from a SIONlib-style mode string.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Mode {
    pub(crate) write: bool,
    pub(crate) key_value: bool,
    /// Tasks per collector (0: none; `COLLECTOR_AUTO`: chosen from the block size).
    pub(crate) collector_size: u32,
}

/// Parse `mode`: "w" or "r" (a "b" before or after is allowed, as SIONlib and fopen write
/// them), then options after commas, as SIONlib's: "keyval" (or "keyval=inline"): records
/// under keys; "collsize=N": collective I/O through a collector per N tasks ("collsize=-1",
/// "collsize=auto" or just "coll": as many as fill one block). `None` (EINVAL set) for
/// anything else.
pub(crate) fn parse_mode(mode: &str) -> Option<Mode> {
    let mut parts = mode.split(',').map(str::trim);
    let write = match parts.next().unwrap_or("") {
        "w" | "wb" | "bw" => true,
        "r" | "rb" | "br" => false,
        other => {
            fail(libc::EINVAL, format_args!("mode {mode:?}: starts with \"w\" (write) or \"r\" (read), not {other:?}"));
            return None;
        }
    };
    let mut m = Mode { write, ..Mode::default() };
    for opt in parts {
        match opt.split_once('=') {
            None if opt == "keyval" => m.key_value = true,
            Some(("keyval", "inline")) => m.key_value = true,
            None if opt == "coll" || opt == "collective" => m.collector_size = COLLECTOR_AUTO,
            Some(("collsize", "-1" | "auto")) => m.collector_size = COLLECTOR_AUTO,
            Some(("collsize", n)) if n.parse::<u32>().is_ok_and(|n| n >= 1) => {
                m.collector_size = n.parse::<u32>().unwrap_or(0);
            }
            _ => {
                fail(
                    libc::EINVAL,
                    format_args!("mode {mode:?}: unknown option {opt:?} (keyval, collsize=N, collsize=auto)"),
                );
                return None;
            }
        }
    }
    Some(m)
}

/// The number of physical files asked for; `None` (EINVAL set) below 1.
pub(crate) fn files(nfiles: c_int) -> Option<u32> {
    if nfiles < 1 {
        fail(libc::EINVAL, format_args!("{nfiles} physical files: at least 1"));
        return None;
    }
    Some(nfiles as u32)
}

/// Open the container `name` collectively: every task of `comm` calls it, with the same
/// `name`, `mode`, `nfiles`, `fs_block` and `config`.
///
/// * `mode` "w": create (or replace) it; each task's logical file gets chunks of
///   `chunksize` bytes (its own; rounded up to the block size), in `nfiles` physical files
///   (tasks split over them by rank, each file complete on its own: `name`, then
///   `name.000001`, …), chunks aligned to `fs_block` bytes (0: the file system's; on Shoal
///   the stripe size, which a non-zero value sets, a multiple of 4096 there).
/// * `mode` "r": open it for reading with as many tasks as wrote it; `chunksize`, `nfiles`
///   and `fs_block` are ignored (`shoal_container_get_info` tells them).
/// * Options after a comma, for writing (a reader learns them from the container):
///   "w,keyval": key-value records (`shoal_container_fwrite_key`, …);
///   "w,collsize=N": collective I/O (`shoal_container_coll_fwrite`, …) through one collector
///   per N consecutive tasks, their chunks packed together ("w,collsize=auto": as many
///   tasks as fill one block).
///
/// `name` `shoal://dir/c` is the Shoal path `/dir/c` (cluster: the configuration file
/// `config`, or `$SHOAL_CONFIG` when NULL); any other name is a Shoal path if `config` is
/// given, else a host path. `comm` is copied, and the library owns it from this call on,
/// also when it fails: it calls `comm->free(comm->user)` (if not NULL) at
/// `shoal_container_parclose` or before returning NULL.
///
/// Returns the task's handle, or NULL with errno set (EFAULT/EINVAL for bad arguments,
/// checked before any communication; otherwise the same error on every task).
#[no_mangle]
pub extern "C" fn shoal_container_paropen(
    name: *const c_char,
    mode: *const c_char,
    chunksize: u64,
    nfiles: c_int,
    fs_block: u64,
    comm: *const shoal_comm,
    config: *const c_char,
) -> *mut shoal_container {
    guard(std::ptr::null_mut(), || {
        if comm.is_null() {
            fail(libc::EFAULT, "paropen: the shoal_comm is NULL");
            return std::ptr::null_mut();
        }
        // Taken first: from here on every return path drops it, which frees it.
        // SAFETY: non-NULL, the caller's shoal_comm, read once.
        let comm = match CComm::new(unsafe { *comm }) {
            Ok(c) => c,
            Err(m) => {
                fail(libc::EINVAL, format_args!("paropen: {m}"));
                return std::ptr::null_mut();
            }
        };
        let (Some(name), Some(mode), Some(config)) =
            (text(name, "the container name"), text(mode, "the mode"), opt_text(config, "the configuration path"))
        else {
            return std::ptr::null_mut();
        };
        let Some(mode) = parse_mode(mode) else { return std::ptr::null_mut() };
        let write = mode.write;
        let opts = if write {
            let Some(nfiles) = files(nfiles) else { return std::ptr::null_mut() };
            if chunksize == 0 {
                fail(libc::EINVAL, "paropen: a chunk size of 0 bytes");
                return std::ptr::null_mut();
            }
            WriteOptions {
                chunk_size: chunksize,
                nfiles,
                fs_block,
                key_value: mode.key_value,
                collector_size: mode.collector_size,
            }
        } else {
            WriteOptions::default()
        };
        let Some((target, path)) = target(name, config) else { return std::ptr::null_mut() };
        let comm = Box::new(comm);
        let opened = block(async {
            if write {
                ParFile::create(comm, &target, &path, &opts).await
            } else {
                ParFile::open(comm, &target, &path).await
            }
        });
        opened.map_or(std::ptr::null_mut(), |f| shoal_container::new(Kind::Par(f)))
    })
}

/// Close a handle of `shoal_container_paropen`, collectively, and free it (whatever the
/// result). After writing, the container is complete and durable when this returns 0 on
/// any task. 0, or -1 with errno set; EINVAL (handle kept) for a serial handle, which
/// `shoal_container_close` closes.
#[no_mangle]
pub extern "C" fn shoal_container_parclose(h: *mut shoal_container) -> c_int {
    guard(-1, || {
        if h.is_null() {
            fail(libc::EFAULT, "parclose: the shoal_container is NULL");
            return -1;
        }
        // SAFETY: non-NULL, from an open call, not closed yet.
        if !matches!(unsafe { &(*h).kind }, Kind::Par(_)) {
            fail(libc::EINVAL, "parclose of a serial handle (close it with shoal_container_close)");
            return -1;
        }
        // SAFETY: as above; from here `h` is gone whatever the outcome.
        let Kind::Par(f) = unsafe { Box::from_raw(h) }.kind else { unreachable!() };
        block(f.close()).map_or(-1, |_| 0)
    })
}
