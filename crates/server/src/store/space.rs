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
//!   The check asks the file system (`statvfs`) only when it may matter: a `statvfs` per
//!   create was 4 % of a server's CPU on md-easy creates (`perf`). A sample of the free
//!   space is reused for [`SAMPLE_AGE`] while, after subtracting everything this server
//!   admitted since, more than [`FAR_FROM_FULL`] bytes beyond the headroom stay free; closer
//!   to the limit every check asks the file system, as before. What this misses is another
//!   writer on the same disk consuming more than `FAR_FROM_FULL` within `SAMPLE_AGE`
//!   (1.3 GB/s), and the reserve below covers that too.
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
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Room a new namespace record (create, mkdir, link, xattr) is counted as needing: far more
/// than its log record, so that when data writes of up to this size no longer fit, new names
/// are refused too and the file system looks uniformly full.
pub const RECORD_ROOM: u64 = 64 << 10;
/// Free space below which reopening the metadata store is not tried (it would fail and
/// leave the store closed, for reads too).
const OPEN_ROOM: u64 = 2 * MIB;

/// How long a sample of the free space stands in for `statvfs` (see the module comment).
const SAMPLE_AGE: Duration = Duration::from_millis(50);
/// Free bytes beyond the headroom (after what was admitted since the sample) above which a
/// sample may stand in for `statvfs`.
const FAR_FROM_FULL: u64 = 64 * MIB;

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
    sample: parking_lot::Mutex<Option<Sample>>,
}

/// The file system's free space when last asked, and what was admitted since.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    headroom: u64,
    free: u64,
    admitted: u64,
}

impl Sample {
    /// Admit `bytes` without asking the file system, if the sample is fresh and far from
    /// the limit even after them.
    fn admit(&mut self, bytes: u64) -> bool {
        let left = self.free.saturating_sub(self.admitted).saturating_sub(bytes);
        if self.at.elapsed() < SAMPLE_AGE && left >= self.headroom.saturating_add(FAR_FROM_FULL) {
            self.admitted += bytes;
            return true;
        }
        false
    }
}

impl Space {
    pub fn new(data_dir: &Path) -> Space {
        Space { dir: data_dir.to_path_buf(), reserve: data_dir.join("reserve"), sample: Default::default() }
    }

    /// ENOSPC unless `bytes` more can be written with the headroom still free.
    pub fn check(&self, bytes: u64) -> R<()> {
        if self.sample.lock().as_mut().is_some_and(|s| s.admit(bytes)) {
            return Ok(());
        }
        let (capacity, free) = capacity_and_free(&self.dir)?;
        let (headroom, _) = levels(capacity);
        *self.sample.lock() = Some(Sample { at: Instant::now(), headroom, free, admitted: bytes });
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
    fn a_sample_admits_only_far_from_the_limit_and_counts_what_it_admits() {
        let headroom = 8 * MIB;
        let mut s = Sample { at: Instant::now(), headroom, free: headroom + FAR_FROM_FULL + 10 * MIB, admitted: 0 };
        let admitted = (0..100).take_while(|_| s.admit(MIB)).count();
        assert_eq!(admitted, 10, "the sample admits what stays beyond headroom + FAR_FROM_FULL, no more");
        let mut old = Sample { at: Instant::now() - SAMPLE_AGE, admitted: 0, ..s };
        assert!(!old.admit(1), "an old sample admits nothing");
    }

    #[test]
    fn a_check_beyond_the_free_space_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let space = Space::new(dir.path());
        let (_, free) = capacity_and_free(dir.path()).unwrap();
        assert!(space.check(1).is_ok());
        assert_eq!(space.check(free).unwrap_err().errno, Errno::ENOSPC);
    }

    #[test]
    fn levels_scale_with_capacity_within_bounds() {
        assert_eq!(levels(64 * MIB), (8 * MIB, 4 * MIB));
        assert_eq!(levels(10_000 * MIB), (100 * MIB, 10_000 * MIB / 256));
        assert_eq!(levels(1 << 50), (1024 * MIB, 64 * MIB));
    }
}
