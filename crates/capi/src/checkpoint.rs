//! Micro-checkpointing (docs/checkpoint.md): `shoal_checkpoint_open`, `_save`,
//! `_is_committed`, `_latest`, `_load`, `_free`, over `shoal_client::MicroCheckpoint`.
//! Each task saves its part of checkpoint N when it is ready; the servers commit N when its
//! last part arrives, and no task waits for another.

use crate::client::{client, shoal_client, text};
use crate::error::{fail, guard, status};
use crate::file::bytes_of;
use crate::meta::byte_slots;
use crate::tuples::wait_of;
use ::shoal_client::{Client, MicroCheckpoint, OpenFlags};
use std::ffi::{c_char, c_int, c_void};

/// One job's checkpoints (`shoal_checkpoint_open`), freed with `shoal_checkpoint_free`.
#[allow(non_camel_case_types)]
pub struct shoal_checkpoint {
    ckpt: MicroCheckpoint,
    client: Client,
    rt: tokio::runtime::Handle,
}

impl shoal_checkpoint {
    fn block<T>(&self, fut: impl std::future::Future<Output = ::shoal_client::Result<T>>) -> Option<T> {
        crate::error::block(&self.rt, fut)
    }
}

fn checkpoint<'a>(k: *const shoal_checkpoint) -> Option<&'a shoal_checkpoint> {
    if k.is_null() {
        fail(libc::EFAULT, "the shoal_checkpoint is NULL");
        return None;
    }
    // SAFETY: a non-NULL handle comes from `shoal_checkpoint_open` and is not freed yet.
    Some(unsafe { &*k })
}

/// The checkpoints of job `name` (any text), of `parts` parts each (one per task), kept as
/// files `DIR/N.PART` in `dir` (made if missing, with its parents). Every task of the job
/// opens it with the same arguments. NULL on failure (EINVAL: an empty name, 0 parts).
/// Free it with `shoal_checkpoint_free` before disconnecting.
#[no_mangle]
pub extern "C" fn shoal_checkpoint_open(
    c: *const shoal_client,
    name: *const c_char,
    dir: *const c_char,
    parts: u32,
) -> *mut shoal_checkpoint {
    guard(std::ptr::null_mut(), || {
        let (Some(c), Some(name), Some(dir)) = (client(c), text(name, "the name"), text(dir, "the directory")) else {
            return std::ptr::null_mut();
        };
        let Some(ckpt) = c.block(MicroCheckpoint::open(&c.client, name, dir, parts)) else {
            return std::ptr::null_mut();
        };
        Box::into_raw(Box::new(shoal_checkpoint { ckpt, client: c.client.clone(), rt: c.rt.handle().clone() }))
    })
}

/// Save part `part` (0 to parts - 1) of checkpoint `n`: the `len` bytes at `data` are
/// written to its file and made durable, then recorded; the part that completes `n`
/// commits it. Saving a part again replaces it. 0 or -1 (EINVAL: no such part).
#[no_mangle]
pub extern "C" fn shoal_checkpoint_save(
    k: *const shoal_checkpoint,
    n: u64,
    part: u32,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(-1, || {
        let (Some(k), Some(data)) = (checkpoint(k), bytes_of(data, len)) else { return -1 };
        status(k.block(k.ckpt.save(n, part, data)))
    })
}

/// Whether checkpoint `n` is committed (every part saved), waiting up to `timeout_ms` for
/// it (`SHOAL_WAIT_FOREVER`: until it is; 0: look once). 1, 0, or -1.
#[no_mangle]
pub extern "C" fn shoal_checkpoint_is_committed(k: *const shoal_checkpoint, n: u64, timeout_ms: i64) -> c_int {
    guard(-1, || {
        let Some(k) = checkpoint(k) else { return -1 };
        let Some(wait) = wait_of(timeout_ms) else { return -1 };
        match k.block(k.ckpt.is_committed(n, wait)) {
            Some(true) => 1,
            Some(false) => 0,
            None => -1,
        }
    })
}

/// The newest committed checkpoint, where a restart starts from, into `n`. 1 (`*n` set),
/// 0 (none is committed yet; `*n` untouched) or -1.
#[no_mangle]
pub extern "C" fn shoal_checkpoint_latest(k: *const shoal_checkpoint, n: *mut u64) -> c_int {
    guard(-1, || {
        let Some(k) = checkpoint(k) else { return -1 };
        if n.is_null() {
            fail(libc::EFAULT, "the uint64_t to fill is NULL");
            return -1;
        }
        match k.block(k.ckpt.latest()) {
            Some(Some(latest)) => {
                // SAFETY: `n` is non-NULL and points at the caller's uint64_t.
                unsafe { *n = latest };
                1
            }
            Some(None) => 0,
            None => -1,
        }
    })
}

/// Part `part` of checkpoint `n`, as saved, into `buf` of `len` bytes. Returns its length,
/// or -1 (ENOENT: never saved; ERANGE: `buf` too small, nothing copied). A `len` of 0 asks
/// for the length only (`buf` may be NULL), without reading the part.
#[no_mangle]
pub extern "C" fn shoal_checkpoint_load(
    k: *const shoal_checkpoint,
    n: u64,
    part: u32,
    buf: *mut c_void,
    len: usize,
) -> isize {
    guard(-1, || {
        let Some(k) = checkpoint(k) else { return -1 };
        let Some(buf) = byte_slots(buf, len) else { return -1 };
        if len == 0 {
            let path = k.ckpt.part_path(n, part);
            let size = k.block(async {
                let f = k.client.open(&path, OpenFlags::read_only()).await?;
                let size = f.attr().size;
                f.close().await?;
                Ok(size)
            });
            return size.map_or(-1, |s| s as isize);
        }
        let Some(data) = k.block(k.ckpt.load(n, part)) else { return -1 };
        buf.give_or_fail(&data)
    })
}

/// Free `k` (NULL: nothing). Returns 0.
#[no_mangle]
pub extern "C" fn shoal_checkpoint_free(k: *mut shoal_checkpoint) -> c_int {
    guard(-1, || {
        if !k.is_null() {
            // SAFETY: `k` came from `shoal_checkpoint_open` and is freed once, here.
            drop(unsafe { Box::from_raw(k) });
        }
        0
    })
}
