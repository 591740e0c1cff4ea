//! Object writes that go around the page cache (`O_DIRECT`), for the copies a mirror keeps
//! (docs/architecture.md, "Redundancy").
//!
//! Why: a mirror's copy is cold. It is read only after a failover, by a resync's comparison
//! (from the checksums, not the bytes) or by a scrub, so caching its pages buys nothing and
//! costs the mirror's host a copy of every byte into the page cache plus the write-back
//! work later, on the cores and memory that serve its own slot. Measured on the 2-core VM
//! of docs/benchmarks.md: 1 GiB written with `dd bs=1M` took 2.3 s through the page cache
//! and 1.2 s with `oflag=direct`, and the mirror's buffered writes were most of the CPU a
//! replicated write cost (the "Targets of issue 16" sections there).
//!
//! Only the part of a write that starts on a [`ALIGN`] boundary and spans whole units of it
//! goes direct; a tail shorter than that is written through the page cache as before (the
//! kernel keeps the two coherent: a direct write first writes back and drops the cached
//! pages it covers). A file system that refuses `O_DIRECT` (tmpfs) gets buffered writes.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Alignment of offsets, lengths and memory for direct writes: the page size, which every
/// Linux file system and block device accepts (logical blocks are 512 B or 4 KiB).
pub const ALIGN: usize = 4096;

/// Largest piece written from the per-thread aligned buffer at once.
const CHUNK: usize = 8 << 20;

/// The object file at `path` opened for direct writes; `None` if its file system refuses
/// them (the caller then writes through the page cache).
pub fn open(path: &Path) -> Option<File> {
    match OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::debug!("{}: no direct writes ({e}); writing through the page cache", path.display());
            None
        }
    }
}

/// Write the aligned leading part of `data` at `offset` through `file` (opened by [`open`]):
/// everything but a tail shorter than [`ALIGN`], when `offset` is aligned. Returns how many
/// bytes it wrote: 0 when nothing qualifies or the kernel refuses the direct write
/// (`EINVAL`: the caller writes it all through the page cache).
pub fn write_aligned(file: &File, data: &[u8], offset: u64) -> io::Result<usize> {
    let whole = data.len() / ALIGN * ALIGN;
    if !offset.is_multiple_of(ALIGN as u64) || whole == 0 {
        return Ok(0);
    }
    let mut done = 0;
    while done < whole {
        let n = (whole - done).min(CHUNK);
        let piece = &data[done..done + n];
        let wrote = if (piece.as_ptr() as usize).is_multiple_of(ALIGN) {
            file.write_all_at(piece, offset + done as u64)
        } else {
            // The bytes come from the network at any address: copy them into memory the
            // device can take.
            with_aligned(n, |buf| {
                buf.copy_from_slice(piece);
                file.write_all_at(buf, offset + done as u64)
            })
        };
        match wrote {
            Ok(()) => done += n,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && done == 0 => return Ok(0),
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// A buffer aligned to [`ALIGN`], reused by the thread (mirrors apply on blocking threads,
/// one batch at a time, so each keeps at most [`CHUNK`] bytes).
struct Aligned {
    ptr: *mut u8,
    cap: usize,
}

impl Aligned {
    fn layout(cap: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(cap, ALIGN).expect("aligned buffer layout")
    }

    /// The first `len` bytes, grown (never shrunk) to hold them.
    fn get(&mut self, len: usize) -> &mut [u8] {
        if len > self.cap {
            self.release();
            let cap = len.next_multiple_of(ALIGN);
            // SAFETY: the layout has a non-zero size (len > cap >= 0).
            let ptr = unsafe { std::alloc::alloc(Self::layout(cap)) };
            if ptr.is_null() {
                std::alloc::handle_alloc_error(Self::layout(cap));
            }
            self.ptr = ptr;
            self.cap = cap;
        }
        // SAFETY: `ptr` holds `cap >= len` bytes owned by this buffer; u8 has no invalid
        // values, and every caller overwrites the slice before reading it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }

    fn release(&mut self) {
        if self.cap > 0 {
            // SAFETY: allocated in `get` with this very layout.
            unsafe { std::alloc::dealloc(self.ptr, Self::layout(self.cap)) };
            self.cap = 0;
        }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        self.release();
    }
}

thread_local! {
    static BUFFER: RefCell<Aligned> = const { RefCell::new(Aligned { ptr: std::ptr::null_mut(), cap: 0 }) };
}

fn with_aligned<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    BUFFER.with(|b| f(b.borrow_mut().get(len)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn writes_the_aligned_part_and_leaves_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("obj");
        let plain = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).unwrap();
        let data: Vec<u8> = (0..3 * ALIGN + 100).map(|i| (i * 7 + 3) as u8).collect();
        let Some(direct) = open(&path) else { return }; // a file system without O_DIRECT
                                                        // Misaligned memory on purpose: the copy into aligned memory is taken.
        let n = write_aligned(&direct, &data[1..], 0).unwrap();
        assert_eq!(n, 3 * ALIGN);
        plain.write_all_at(&data[1 + n..], n as u64).unwrap();
        let mut back = vec![0u8; data.len() - 1];
        plain.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, data[1..]);
        // An unaligned offset, or less than one unit: nothing goes direct.
        assert_eq!(write_aligned(&direct, &data, 100).unwrap(), 0);
        assert_eq!(write_aligned(&direct, &data[..ALIGN - 1], 0).unwrap(), 0);
    }
}
