//! Free space on the file system of the data directory: which writes are still taken, and a
//! reserve file given back when the disk fills anyway.
//!
//! A server must stay up on a full disk, keep serving reads, and keep committing the
//! operations that free space (unlink, rmdir, truncate, rename over a file), whose RocksDB
//! log records need a little space themselves. Two measures (sizes from the file system's
//! capacity, see [`levels`]):
//!
//! * **Headroom.** Operations that consume space (data writes, creates, mkdirs, symlinks,
//!   links, extended attributes, size extensions) are refused with ENOSPC while fewer than
//!   `headroom` bytes would stay free after them ([`Space::check`]). The disk therefore never
//!   fills through this server, and whatever space is left serves the metadata of deletions.
//! * **Reserve.** A file of `reserve` bytes (`<data_dir>/reserve`) that the server deletes
//!   when free space falls below half the headroom all the same (other servers or programs
//!   on the same disk, the metadata of deletions, RocksDB's compactions), when a metadata
//!   write fails, and before opening the store on a nearly full disk (opening writes new
//!   MANIFEST, WAL and OPTIONS files). It is made again once `headroom + reserve` bytes are
//!   free ([`Space::upkeep`], every second).

use crate::error::{Fail, R};
use shoal_proto::Errno;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;
/// Room a new namespace record (create, mkdir, link, xattr) is counted as needing: far more
/// than its log record, so that when data writes of up to this size no longer fit, new names
/// are refused too and the file system looks uniformly full.
pub const RECORD_ROOM: u64 = 64 << 10;
/// Free space below which reopening the metadata store is not tried (it would fail and
/// leave the store closed, for reads too).
const OPEN_ROOM: u64 = 2 * MIB;

/// (headroom, reserve) for a file system of `capacity` bytes: 1 % and 0.4 % of it, at least
/// 8 MiB and 4 MiB (a 64 MiB test file system), at most 1 GiB and 64 MiB.
pub fn levels(capacity: u64) -> (u64, u64) {
    ((capacity / 100).clamp(8 * MIB, 1024 * MIB), (capacity / 256).clamp(4 * MIB, 64 * MIB))
}

/// Capacity and free bytes (for unprivileged users, as `df` shows) of the file system
/// holding `path`.
fn capacity_and_free(path: &Path) -> R<(u64, u64)> {
    let (capacity, free, _) =
        crate::ops::data::statvfs(path).map_err(|e| Fail::io(format_args!("statvfs {}", path.display()), &e))?;
    Ok((capacity, free))
}

pub struct Space {
    dir: PathBuf,
    reserve: PathBuf,
}

impl Space {
    pub fn new(data_dir: &Path) -> Space {
        Space { dir: data_dir.to_path_buf(), reserve: data_dir.join("reserve") }
    }

    /// ENOSPC unless `bytes` more can be written with the headroom still free.
    pub fn check(&self, bytes: u64) -> R<()> {
        let (capacity, free) = capacity_and_free(&self.dir)?;
        let (headroom, _) = levels(capacity);
        if free < headroom.saturating_add(bytes) {
            return Err(Fail::new(
                Errno::ENOSPC,
                format!(
                    "disk of {} is full: {} MiB free, {} MiB are kept for deletions",
                    self.dir.display(),
                    free / MIB,
                    headroom / MIB
                ),
            ));
        }
        Ok(())
    }

    /// Is there room to open the metadata store (new WAL, MANIFEST and OPTIONS files)?
    pub fn room_to_open(&self) -> bool {
        capacity_and_free(&self.dir).is_ok_and(|(_, free)| free >= OPEN_ROOM)
    }

    /// Delete the reserve file if there is one; true if it was there.
    pub fn release(&self) -> bool {
        match std::fs::remove_file(&self.reserve) {
            Ok(()) => {
                tracing::warn!("disk of {} nearly full: reserve file given back", self.dir.display());
                true
            }
            Err(_) => false,
        }
    }

    /// Before opening the store: give the reserve back if less than the headroom is free,
    /// so that RocksDB finds room for the files it writes when it opens.
    pub fn prepare_for_open(&self) {
        let _ = std::fs::remove_file(self.dir.join("reserve.tmp"));
        match capacity_and_free(&self.dir) {
            Ok((capacity, free)) if free < levels(capacity).0 => {
                self.release();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// Give the reserve back when free space fell below half the headroom; make it again
    /// when the headroom and the reserve are free. Blocking (writes up to 64 MiB).
    pub fn upkeep(&self) {
        let (capacity, free) = match capacity_and_free(&self.dir) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("{e}");
                return;
            }
        };
        let (headroom, reserve) = levels(capacity);
        let held = self.reserve.exists();
        if held && free < headroom / 2 {
            self.release();
        } else if !held && free >= headroom + reserve {
            if let Err(e) = self.make(reserve) {
                tracing::warn!("cannot make the reserve file {}: {e}", self.reserve.display());
            }
        }
    }

    /// Write the reserve file (zeros, so every file system allocates it; under a temporary
    /// name, so that a crash never leaves a short file taken for the reserve).
    fn make(&self, bytes: u64) -> std::io::Result<()> {
        let tmp = self.dir.join("reserve.tmp");
        let res = (|| {
            let mut f = File::create(&tmp)?;
            let chunk = vec![0u8; MIB as usize];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(MIB) as usize;
                f.write_all(&chunk[..n])?;
                left -= n as u64;
            }
            std::fs::rename(&tmp, &self.reserve)
        })();
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_scale_with_capacity_within_bounds() {
        assert_eq!(levels(64 * MIB), (8 * MIB, 4 * MIB));
        assert_eq!(levels(10_000 * MIB), (100 * MIB, 10_000 * MIB / 256));
        assert_eq!(levels(1 << 50), (1024 * MIB, 64 * MIB));
    }
}
