//! What the server keeps in memory about the checksums of an open object, so that a write
//! costs one system call on the checksum file instead of four (measured on io-hard: a 47 KB
//! write made 9 more system calls than before checksums, `docs/benchmarks.md`):
//!
//! * **the entries** of the blocks used recently (read from the sidecar once, then kept):
//!   a write or read no longer `pread`s them;
//! * **the object's length**: a write or read no longer `fstat`s the object (every change
//!   of length goes through the data store, under the object's lock);
//! * **where each cached block may hold bytes**: up to [`SPANS`] spans of the block outside
//!   which it holds zeros. A write that fills zeros (most of io-hard: pieces of 47,008
//!   bytes landing beside each other) then derives its checksum without asking the file
//!   system where its holes are (`SEEK_DATA`/`SEEK_HOLE` and a read);
//! * **which entries are settled only here** (*lazy settling*): after a write the sidecar
//!   still says `pending { new, old }` and the block holds `new`, which is a state the
//!   crash invariant allows (`checksums.rs`); the entry is written `settled` later, in one
//!   `pwrite` per run of blocks, by [`Sums::flush`]: at `Fsync` (after the data is synced,
//!   so a settled entry on disk never describes bytes that a power loss could take back),
//!   when the object leaves the descriptor cache, before a truncation, before `shoal scrub`
//!   checks it, and when the cache of entries is full. A server killed meanwhile leaves
//!   them pending, and they are settled from the bytes when the object is next opened, as
//!   any entry a crash leaves pending.
//!
//! The entries kept here are the truth for reads and writes; those on disk are checked by
//! `shoal scrub` (which flushes first). An entry loaded as damaged or pending is not kept.
//! Every method is called with the object's lock held (shared or exclusive) and this
//! structure behind the object's own mutex.

use crate::store::checksums::{Entry, Sidecar, BLOCK};
use std::collections::{BTreeSet, HashMap};

/// Most entries kept per object (64 MiB of object): beyond, they are flushed and dropped,
/// so the memory an object can hold is bounded (about 40 bytes per entry).
pub const CACHED_BLOCKS: usize = 1024;
/// Spans of bytes tracked per block; more are merged into their hull (which may only make
/// a later write check the file for zeros, never skip a check it needs).
pub const SPANS: usize = 2;

/// Bytes of a block that may be non-zero: every byte outside these spans (offsets within
/// the block, `[start, end)`) is zero. `None` entries are unused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Spans([Option<(u32, u32)>; SPANS]);

impl Spans {
    const NONE: Spans = Spans([None; SPANS]);
    const ALL: Spans = Spans([Some((0, BLOCK as u32)), None]);

    fn overlaps(&self, from: u32, to: u32) -> bool {
        self.0.iter().flatten().any(|&(s, e)| s < to && from < e)
    }

    fn add(&mut self, from: u32, to: u32) {
        let (mut s, mut e) = (from, to);
        // Absorb every span that touches the new one.
        for slot in self.0.iter_mut() {
            if let Some((a, b)) = *slot {
                if a <= e && s <= b {
                    s = s.min(a);
                    e = e.max(b);
                    *slot = None;
                }
            }
        }
        if let Some(free) = self.0.iter_mut().find(|x| x.is_none()) {
            *free = Some((s, e));
            return;
        }
        // No room: merge everything into one span (an over-approximation is safe).
        let lo = self.0.iter().flatten().map(|x| x.0).min().unwrap_or(s).min(s);
        let hi = self.0.iter().flatten().map(|x| x.1).max().unwrap_or(e).max(e);
        *self = Spans::NONE;
        self.0[0] = Some((lo, hi));
    }
}

#[derive(Clone, Copy, Debug)]
struct Cached {
    /// Never pending: `Hole` or `Settled`.
    entry: Entry,
    spans: Spans,
}

/// The in-memory view of one object's checksums (see the module comment).
pub struct Sums {
    /// Length of the object's data file.
    pub size: u64,
    /// Entries the sidecar holds (its length): the blocks beyond are holes, known without
    /// reading it (most writes append).
    stored: u64,
    cached: HashMap<u64, Cached>,
    /// Blocks whose entry is settled here but still pending in the sidecar.
    unsettled: BTreeSet<u64>,
}

impl Sums {
    /// For an object of `size` bytes whose sidecar holds `stored` entries.
    pub fn new(size: u64, stored: u64) -> Sums {
        Sums { size, stored, cached: HashMap::new(), unsettled: BTreeSet::new() }
    }

    /// The sidecar now holds entries up to block `end` (exclusive) at least.
    pub fn stored_up_to(&mut self, end: u64) {
        self.stored = self.stored.max(end);
    }

    /// Are the entries of blocks `first .. first + n` all in memory (a hit of this cache)?
    pub fn holds(&self, first: u64, n: u64) -> bool {
        (first..first + n).all(|k| self.cached.contains_key(&k))
    }

    /// Entries of blocks `first .. first + n`, from memory, reading the sidecar once for
    /// the range if any is missing. Damaged entries are `Err` with the reason.
    pub fn entries(&mut self, side: &Sidecar, first: u64, n: u64) -> std::io::Result<Vec<Result<Entry, String>>> {
        if self.holds(first, n) {
            return Ok((first..first + n).map(|k| Ok(self.cached[&k].entry)).collect());
        }
        // Room for the range first: the cache is never cut while the range is gathered.
        if self.cached.len() + n as usize > CACHED_BLOCKS {
            self.flush(side)?;
            self.cached.clear();
        }
        let keep = n as usize <= CACHED_BLOCKS;
        // Read only the blocks missing here that the sidecar holds (beyond its end every
        // block is a hole).
        let missing = |k: &u64| !self.cached.contains_key(k);
        let lo = (first..first + n).find(missing).unwrap_or(first);
        let hi = (first..first + n).rev().find(missing).map_or(first, |k| k + 1).min(self.stored);
        let mut read = if lo < hi { side.read(lo, hi - lo)?.into_iter() } else { Vec::new().into_iter() };
        let mut out = Vec::with_capacity(n as usize);
        for k in first..first + n {
            let e = if k >= lo && k < hi { read.next().unwrap_or(Ok(Entry::Hole)) } else { Ok(Entry::Hole) };
            if let Some(c) = self.cached.get(&k) {
                // Kept here: newer than the sidecar (lazy settling).
                out.push(Ok(c.entry));
                continue;
            }
            if let (true, Ok(entry @ (Entry::Hole | Entry::Settled(_)))) = (keep, &e) {
                // A hole was never written: zeros. Otherwise where the bytes are is unknown.
                let spans = if *entry == Entry::Hole { Spans::NONE } else { Spans::ALL };
                self.cached.insert(k, Cached { entry: *entry, spans });
            }
            out.push(e);
        }
        Ok(out)
    }

    /// May block `k` hold a non-zero byte in `[from, to)` (offsets within the block)? True
    /// when unknown.
    pub fn may_hold_data(&self, k: u64, from: u64, to: u64) -> bool {
        match self.cached.get(&k) {
            Some(c) => c.spans.overlaps(from as u32, to as u32),
            None => true,
        }
    }

    /// Block `k` now holds its old bytes with `[from, to)` replaced (`replaced_all`: every
    /// byte it held was replaced, the rest is zeros), and its checksum is `crc`; the sidecar
    /// says `pending { crc, old }` until [`Sums::flush`].
    pub fn wrote(
        &mut self,
        side: &Sidecar,
        k: u64,
        crc: u32,
        from: u64,
        to: u64,
        replaced_all: bool,
    ) -> std::io::Result<()> {
        let mut spans = match self.cached.get(&k) {
            Some(c) if !replaced_all => c.spans,
            Some(_) => Spans::NONE,
            None if replaced_all => Spans::NONE,
            None => Spans::ALL,
        };
        spans.add(from as u32, to as u32);
        // Cached first (which may flush and forget the others), then unsettled: every
        // unsettled block is cached.
        self.insert(side, k, Cached { entry: Entry::Settled(crc), spans })?;
        self.unsettled.insert(k);
        Ok(())
    }

    fn insert(&mut self, side: &Sidecar, k: u64, c: Cached) -> std::io::Result<()> {
        if self.cached.len() >= CACHED_BLOCKS && !self.cached.contains_key(&k) {
            self.flush(side)?;
            self.cached.clear();
        }
        self.cached.insert(k, c);
        Ok(())
    }

    /// Write the entries settled only here as `settled` in the sidecar, one `pwrite` per
    /// run of consecutive blocks.
    pub fn flush(&mut self, side: &Sidecar) -> std::io::Result<()> {
        let mut run: Vec<Entry> = Vec::new();
        let mut start = 0;
        for &k in &self.unsettled {
            if !run.is_empty() && k != start + run.len() as u64 {
                side.write(start, &run)?;
                run.clear();
            }
            if run.is_empty() {
                start = k;
            }
            run.push(self.cached[&k].entry);
        }
        side.write(start, &run)?;
        self.unsettled.clear();
        Ok(())
    }

    /// Forget every entry (after [`Sums::flush`], or when the sidecar was rewritten), so
    /// they are read from the sidecar again; it now holds `stored` entries.
    pub fn forget(&mut self, stored: u64) {
        debug_assert!(self.unsettled.is_empty());
        self.cached.clear();
        self.stored = stored;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::checksums::Sidecar;

    #[test]
    fn spans_say_where_a_block_may_hold_bytes() {
        let mut s = Spans::NONE;
        assert!(!s.overlaps(0, BLOCK as u32));
        s.add(100, 200);
        s.add(300, 400);
        assert!(!s.overlaps(200, 300) && !s.overlaps(0, 100) && !s.overlaps(400, 500));
        assert!(s.overlaps(150, 160) && s.overlaps(399, 1000));
        // Touching spans merge; a third disjoint one merges all into the hull.
        s.add(200, 250);
        assert_eq!(s.0, [Some((100, 250)), Some((300, 400))]);
        s.add(600, 700);
        assert_eq!(s.0, [Some((100, 700)), None]);
        assert!(s.overlaps(260, 290));
        assert!(Spans::ALL.overlaps(5, 6));
    }

    #[test]
    fn lazily_settled_entries_reach_the_sidecar_at_flush_in_runs() {
        let dir = tempfile::tempdir().unwrap();
        let side = Sidecar::create(&dir.path().join("x.crc")).unwrap();
        side.write(3, &[Entry::Settled(9)]).unwrap();
        let mut m = Sums::new(0, 4);
        assert_eq!(m.entries(&side, 2, 3).unwrap(), vec![Ok(Entry::Hole), Ok(Entry::Settled(9)), Ok(Entry::Hole)]);
        assert!(!m.may_hold_data(2, 0, BLOCK) && m.may_hold_data(3, 0, 1) && m.may_hold_data(7, 0, 1));
        // What a write does: pending on disk, settled here.
        for (k, crc) in [(2, 20), (3, 30), (5, 50)] {
            side.write(k, &[Entry::Pending { new: crc, old: 1 }]).unwrap();
            m.stored_up_to(k + 1);
            m.wrote(&side, k, crc, 10, 20, false).unwrap();
        }
        assert!(!m.may_hold_data(2, 20, 100) && m.may_hold_data(2, 15, 16) && m.may_hold_data(3, 30, 40));
        assert_eq!(m.entries(&side, 2, 2).unwrap(), vec![Ok(Entry::Settled(20)), Ok(Entry::Settled(30))]);
        assert_eq!(side.read(5, 1).unwrap(), vec![Ok(Entry::Pending { new: 50, old: 1 })]);
        assert!(!m.unsettled.is_empty());
        m.flush(&side).unwrap();
        assert!(m.unsettled.is_empty());
        assert_eq!(
            side.read(2, 4).unwrap(),
            vec![Ok(Entry::Settled(20)), Ok(Entry::Settled(30)), Ok(Entry::Hole), Ok(Entry::Settled(50))]
        );
    }

    #[test]
    fn a_full_cache_flushes_before_it_forgets() {
        let dir = tempfile::tempdir().unwrap();
        let side = Sidecar::create(&dir.path().join("x.crc")).unwrap();
        let mut m = Sums::new(0, 0);
        for k in 0..CACHED_BLOCKS as u64 + 10 {
            side.write(k, &[Entry::Pending { new: k as u32, old: 0 }]).unwrap();
            m.stored_up_to(k + 1);
            m.wrote(&side, k, k as u32, 0, BLOCK, true).unwrap();
        }
        assert!(m.cached.len() <= CACHED_BLOCKS);
        assert_eq!(side.read(0, 1).unwrap(), vec![Ok(Entry::Settled(0))]);
        m.flush(&side).unwrap();
        assert!(side.read(0, CACHED_BLOCKS as u64 + 10).unwrap().iter().all(|e| matches!(e, Ok(Entry::Settled(_)))));
    }
}
