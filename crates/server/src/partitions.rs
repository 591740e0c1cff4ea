//! Split directories on this server: which partitions of which directories it holds, which
//! one a name belongs to, and the state of a split in progress (docs/architecture.md,
//! "Split directories").
//!
//! **What is held.** A directory starts as one partition (0, depth 0) on its home, with no
//! partition record: [`Partitions::place`] answers "here" for every name of a directory
//! homed here that has no record. Once split, every server holding partition `i` of the
//! directory has a record `P(dir, i)` (`store::meta`) with the partition's depth, whether
//! it is sealed (the directory is being removed) and a copy of the directory's attributes
//! (permission checks and inheritance happen where the entry is). This module keeps all
//! of them in memory ([`Partitions::load`] at start-up), so routing a name costs a hash and
//! a map lookup, and nothing for directories that never split.
//!
//! **A name's partition.** Partition `i` at depth `d` holds the names whose hash has `i` in
//! its low `d` bits. A server holds a name iff one of its partitions of the directory
//! matches; otherwise the sender's bitmap was stale and the request is answered
//! `Reply::Partitions` with the home's bitmap ([`misrouted`]; `dispatch.rs`).
//!
//! **Splits in progress.** While partition `p` (depth `d`) splits, the names that move (hash
//! bit `d` set) are *frozen*: [`Partitions::place`] answers [`Placed::Frozen`] and the
//! request waits for the split to finish, then is routed again (and, the names having
//! moved, answered `Partitions`). A freeze starts and ends with the directory's stripe lock
//! held (`ops/namespace/split.rs`), and a mutation checks its placement with that lock held,
//! so no mutation is between its check and its commit when a freeze starts or ends. Reads
//! (lookups, listings) take no stripe lock; they compare the [`Partitions::generation`]
//! before and after reading, which every freeze and unfreeze increments, and read again if
//! it moved.

use crate::error::{Fail, R};
use crate::locks::PIN_WAIT;
use crate::store::meta::InodeRecord;
use parking_lot::{Mutex, RwLock};
use shoal_placement::{key_range, Bitmap};
use shoal_proto::msg::PartRef;
use shoal_proto::{Errno, Ino};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Notify;

/// Most directories whose entry counts are tracked for the split policy (small directories
/// below their target depth); beyond, the table is cleared and counts are taken again.
const MAX_COUNTED: usize = 1 << 17;
/// Most bitmaps of other servers' directories remembered (for routing peer steps).
const MAX_LEARNT: usize = 1 << 14;

/// One partition held here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub depth: u32,
    /// The directory is being removed: names may not be added (they wait).
    pub sealed: bool,
}

/// The partitions of one split directory held here.
#[derive(Clone, Debug)]
struct Held {
    parts: BTreeMap<u32, Part>,
    /// A split of partition (index, depth) is running: its moving half is frozen.
    frozen: Option<(u32, u32)>,
    /// The directory's attributes (a copy, except on the home, where the inode is read).
    attrs: InodeRecord,
}

/// Where a name (or a listing position) of a directory is, seen from this server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// In this partition, held here.
    Here(PartRef),
    /// In the moving half of a partition splitting here: wait for the split.
    Frozen,
    /// In a sealed partition (the directory is being removed): adding names waits.
    Sealed(PartRef),
    /// Not here: the sender's bitmap is stale.
    Elsewhere,
}

#[derive(Default)]
pub struct Partitions {
    held: RwLock<HashMap<Ino, Held>>,
    /// Bumped at every freeze and unfreeze (see the module doc).
    generation: AtomicU64,
    /// Woken at every unfreeze and unseal.
    changed: Notify,
    /// Entries per (directory, partition) below the target depth, for the split policy:
    /// counted once with a bounded scan, then kept up to date by inserts and removals.
    counts: Mutex<HashMap<(Ino, u32), u64>>,
    /// Directories with a split task running here (one at a time per directory).
    splitting: Mutex<HashSet<Ino>>,
    /// Bitmaps of directories learnt from `Partitions` answers, for steps this server sends
    /// about names in other servers' directories (a rename's destination).
    learnt: Mutex<HashMap<Ino, Bitmap>>,
}

/// The failure that `dispatch.rs` answers with `Reply::Partitions` for `dir`.
pub fn misrouted(dir: Ino) -> Fail {
    let mut f = Fail::new(Errno::ESTALE, format!("directory {dir}: the name is in a partition held by another server"));
    f.misrouted = Some(dir);
    f
}

fn matches(hash: u64, index: u32, depth: u32) -> bool {
    depth == 0 || hash & ((1u64 << depth) - 1) == u64::from(index)
}

impl Partitions {
    /// Does a name with hash `hash` belong to partition `part`?
    pub fn in_part(hash: u64, part: PartRef) -> bool {
        matches(hash, part.index, part.depth)
    }

    /// The partitions recorded in the store (at start-up).
    pub fn load(records: Vec<(Ino, u32, crate::store::meta::PartitionRecord)>) -> Partitions {
        let p = Partitions::default();
        {
            let mut held = p.held.write();
            for (dir, index, rec) in records {
                let h = held.entry(dir).or_insert_with(|| Held {
                    parts: BTreeMap::new(),
                    frozen: None,
                    attrs: rec.dir.clone(),
                });
                h.parts.insert(index, Part { depth: rec.depth, sealed: rec.sealed });
            }
        }
        p
    }

    /// Is `dir` split (this server holds a partition record of it)?
    pub fn is_split(&self, dir: Ino) -> bool {
        self.held.read().contains_key(&dir)
    }

    /// The value to compare before and after a read (module doc).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Where the name with hash `hash` of `dir` is. `home`: this server is `dir`'s home.
    pub fn place(&self, dir: Ino, home: bool, hash: u64) -> Placed {
        let held = self.held.read();
        let Some(h) = held.get(&dir) else {
            return if home { Placed::Here(PartRef { index: 0, depth: 0 }) } else { Placed::Elsewhere };
        };
        if let Some((fi, fd)) = h.frozen {
            if matches(hash, fi, fd) && shoal_placement::moves_on_split(hash, fd) {
                return Placed::Frozen;
            }
        }
        for (&index, part) in &h.parts {
            if matches(hash, index, part.depth) {
                let r = PartRef { index, depth: part.depth };
                return if part.sealed { Placed::Sealed(r) } else { Placed::Here(r) };
            }
        }
        Placed::Elsewhere
    }

    /// Where the listing position `key` (a listing key, `shoal_placement::listing_key`) of
    /// `dir` is: the hash with that listing key is `key.reverse_bits()`. A listing of a
    /// partition that is splitting waits for the split, as a whole (its moved half would
    /// otherwise be listed from here and from the new partition).
    pub fn place_position(&self, dir: Ino, home: bool, key: u64) -> Placed {
        let hash = key.reverse_bits();
        let held = self.held.read();
        if let Some((fi, fd)) = held.get(&dir).and_then(|h| h.frozen) {
            if matches(hash, fi, fd) {
                return Placed::Frozen;
            }
        }
        drop(held);
        match self.place(dir, home, hash) {
            Placed::Sealed(r) => Placed::Here(r),
            other => other,
        }
    }

    /// The directory's attributes as this server knows them when it is not the home (the
    /// copy in its partition records), `None` if it holds no partition of `dir`.
    pub fn attrs(&self, dir: Ino) -> Option<InodeRecord> {
        self.held.read().get(&dir).map(|h| h.attrs.clone())
    }

    /// Wait (at most `PIN_WAIT` from `deadline`'s start) for a split or seal to end; EBUSY
    /// after. Call with no lock held, after `place` answered `Frozen` or `Sealed`; the
    /// caller routes again afterwards.
    pub async fn wait_changed(&self, dir: Ino, deadline: tokio::time::Instant, still: impl Fn() -> bool) -> R<()> {
        let notified = self.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !still() {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Err(Fail::new(
                Errno::EBUSY,
                format!("directory {dir}: its partition has been splitting or sealed for {} s", PIN_WAIT.as_secs()),
            ));
        }
        Ok(())
    }

    /// A new deadline for [`Partitions::wait_changed`].
    pub fn deadline() -> tokio::time::Instant {
        tokio::time::Instant::now() + PIN_WAIT
    }

    /// Freeze the moving half of partition (index, depth) of `dir` for a split. The home of
    /// an unsplit directory gets its implicit partition 0 recorded here (the split's finish
    /// writes its record). Call with the directory's stripe locked.
    pub fn freeze(&self, dir: Ino, index: u32, depth: u32, attrs: &InodeRecord) {
        let mut held = self.held.write();
        let h = held.entry(dir).or_insert_with(|| Held { parts: BTreeMap::new(), frozen: None, attrs: attrs.clone() });
        // Partition 0 of a directory that never split has no record yet (nor, after a
        // restart, until the split's finish writes it).
        h.parts.entry(index).or_insert(Part { depth, sealed: false });
        h.frozen = Some((index, depth));
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The split of (index, depth) committed: the partition is one deeper and nothing is
    /// frozen. Call with the directory's stripe locked.
    pub fn split_done(&self, dir: Ino, index: u32, depth: u32) {
        {
            let mut held = self.held.write();
            if let Some(h) = held.get_mut(&dir) {
                if let Some(p) = h.parts.get_mut(&index) {
                    p.depth = p.depth.max(depth + 1);
                }
                h.frozen = None;
            }
        }
        self.counts.lock().retain(|(d, _), _| *d != dir);
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// End a freeze without a split (the split could not be made). A directory that had
    /// never split is whole on its home again, with no partition record.
    pub fn unfreeze(&self, dir: Ino) {
        {
            let mut held = self.held.write();
            if let Some(h) = held.get_mut(&dir) {
                h.frozen = None;
                if h.parts.len() == 1 && h.parts.get(&0) == Some(&Part { depth: 0, sealed: false }) {
                    held.remove(&dir);
                }
            }
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Partition (index, depth) of `dir` arrived here (`PeerSplitIn`).
    pub fn add(&self, dir: Ino, index: u32, depth: u32, attrs: &InodeRecord) {
        let mut held = self.held.write();
        let h = held.entry(dir).or_insert_with(|| Held { parts: BTreeMap::new(), frozen: None, attrs: attrs.clone() });
        h.parts.entry(index).or_insert(Part { depth, sealed: false });
    }

    /// New attributes of `dir` (`PeerPartitionAttr`, or a setattr at the home).
    pub fn set_attrs(&self, dir: Ino, attrs: &InodeRecord) {
        if let Some(h) = self.held.write().get_mut(&dir) {
            h.attrs = attrs.clone();
        }
    }

    /// Seal or unseal every partition of `dir` held here.
    pub fn set_sealed(&self, dir: Ino, sealed: bool) {
        if let Some(h) = self.held.write().get_mut(&dir) {
            for p in h.parts.values_mut() {
                p.sealed = sealed;
            }
        }
        if !sealed {
            self.changed.notify_waiters();
        }
    }

    /// `dir` is gone: forget its partitions.
    pub fn drop_dir(&self, dir: Ino) {
        self.held.write().remove(&dir);
        self.counts.lock().retain(|(d, _), _| *d != dir);
        self.learnt.lock().remove(&dir);
        self.changed.notify_waiters();
    }

    /// The partitions of `dir` held here, with their depths.
    pub fn parts_of(&self, dir: Ino) -> Vec<(u32, Part)> {
        self.held.read().get(&dir).map(|h| h.parts.iter().map(|(&i, &p)| (i, p)).collect()).unwrap_or_default()
    }

    /// An entry was added to partition `part` of `dir`: its count after the insert, if the
    /// partition is tracked; `count` (a bounded count from the store) seeds an untracked one.
    pub fn inserted(&self, dir: Ino, part: PartRef, count: impl FnOnce() -> R<u64>) -> R<u64> {
        let key = (dir, part.index);
        if let Some(c) = self.counts.lock().get_mut(&key) {
            *c += 1;
            return Ok(*c);
        }
        let c = count()?;
        let mut counts = self.counts.lock();
        if counts.len() >= MAX_COUNTED {
            counts.clear();
        }
        counts.insert(key, c);
        Ok(c)
    }

    /// An entry was removed from partition `part` of `dir`.
    pub fn removed(&self, dir: Ino, part: PartRef) {
        if let Some(c) = self.counts.lock().get_mut(&(dir, part.index)) {
            *c = c.saturating_sub(1);
        }
    }

    /// Claim `dir` for a split task (false if one runs already).
    pub fn claim_split(&self, dir: Ino) -> bool {
        self.splitting.lock().insert(dir)
    }

    pub fn release_split(&self, dir: Ino) {
        self.splitting.lock().remove(&dir);
    }

    /// The bitmap this server routes names of `dir` with when it sends a step about them
    /// (unsplit unless learnt).
    pub fn learnt(&self, dir: Ino) -> Bitmap {
        self.learnt.lock().get(&dir).cloned().unwrap_or_default()
    }

    /// Merge a bitmap of `dir` from a `Partitions` answer.
    pub fn learn(&self, dir: Ino, words: Vec<u64>) {
        let Ok(b) = Bitmap::try_from(words) else { return };
        let mut learnt = self.learnt.lock();
        if learnt.len() >= MAX_LEARNT {
            learnt.clear();
        }
        learnt.entry(dir).or_default().merge(&b);
    }
}

/// The listing-key range of `part`.
pub fn range_of(part: PartRef) -> (u64, u64) {
    key_range(part.index, part.depth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::msg::{FileKind, Timestamp};

    fn attrs() -> InodeRecord {
        crate::ops::namespace::new_inode(FileKind::Dir, 0o755, 0, 0, Timestamp::default())
    }

    #[test]
    fn an_unsplit_directory_is_whole_on_its_home() {
        let p = Partitions::default();
        assert_eq!(p.place(Ino(7), true, 12345), Placed::Here(PartRef { index: 0, depth: 0 }));
        assert_eq!(p.place(Ino(7), false, 12345), Placed::Elsewhere);
    }

    #[test]
    fn a_split_freezes_the_moving_half_then_moves_it() {
        let p = Partitions::default();
        let d = Ino(7);
        let g0 = p.generation();
        p.freeze(d, 0, 0, &attrs());
        assert_ne!(p.generation(), g0);
        // Bit 0 set: moves to partition 1, frozen meanwhile; bit 0 clear: stays.
        assert_eq!(p.place(d, true, 0b1), Placed::Frozen);
        assert_eq!(p.place(d, true, 0b10), Placed::Here(PartRef { index: 0, depth: 0 }));
        assert_eq!(p.place_position(d, true, 0), Placed::Frozen, "a listing of a splitting partition waits");
        p.split_done(d, 0, 0);
        assert_eq!(p.place(d, true, 0b1), Placed::Elsewhere);
        assert_eq!(p.place(d, true, 0b10), Placed::Here(PartRef { index: 0, depth: 1 }));
        // The new partition's server.
        let q = Partitions::default();
        q.add(d, 1, 1, &attrs());
        assert_eq!(q.place(d, false, 0b1), Placed::Here(PartRef { index: 1, depth: 1 }));
        assert_eq!(q.place(d, false, 0b10), Placed::Elsewhere);
        q.set_sealed(d, true);
        assert_eq!(q.place(d, false, 0b11), Placed::Sealed(PartRef { index: 1, depth: 1 }));
    }

    #[test]
    fn counts_are_seeded_once_then_followed() {
        let p = Partitions::default();
        let part = PartRef { index: 0, depth: 0 };
        assert_eq!(p.inserted(Ino(3), part, || Ok(10)).unwrap(), 10);
        assert_eq!(p.inserted(Ino(3), part, || panic!("counted again")).unwrap(), 11);
        p.removed(Ino(3), part);
        assert_eq!(p.inserted(Ino(3), part, || panic!("counted again")).unwrap(), 11);
    }
}
