//! GIGA+ partitions of a directory: which partitions exist (the [`Bitmap`]), which one holds
//! a name ([`Bitmap::partition_of`]), and how a partition splits ([`split_child`],
//! [`moves_on_split`]).
//!
//! Numbering (radix order): partition `i` at depth `d` holds the names whose hash has its
//! low `d` bits equal to `i`. Partition 0 (depth 0) holds every name of an unsplit
//! directory. Splitting partition `i` at depth `d` creates partition `i | 1 << d` at depth
//! `d + 1` and moves to it the names whose hash has bit `d` set; `i` itself goes to depth
//! `d + 1`. So a partition's index never changes, the depth of every partition can be read
//! off the bitmap alone ([`Bitmap::depth_of`]), and two bitmaps of the same directory are
//! reconciled by their union ([`Bitmap::merge`]): partitions are only ever added.
//!
//! Depth limit: [`MAX_DEPTH`] = 20, so at most 2^20 = 1,048,576 partitions and a bitmap of
//! at most 128 KiB. The split policy (`split_policy.rs`) stops far below that for any
//! realistic cluster (depth 18 = 262,144 partitions for 10,000 servers); the limit only
//! bounds what a corrupt or hostile bitmap, or a pile of colliding names, could cost.

use serde::{Deserialize, Serialize};

/// Deepest a partition can be: indexes are below `1 << MAX_DEPTH`.
pub const MAX_DEPTH: u32 = 20;

/// The partition created when partition `index` splits at `depth` (`index`'s depth before
/// the split). `None` if `index` cannot be at that depth (its index has bits at or above
/// `depth`) or the split would pass [`MAX_DEPTH`].
pub fn split_child(index: u32, depth: u32) -> Option<u32> {
    if depth >= MAX_DEPTH || index >> depth != 0 {
        return None;
    }
    Some(index | 1 << depth)
}

/// Whether a name with hash `hash`, in a partition splitting at `depth`, moves to the new
/// partition ([`split_child`]): its bit `depth` is set. About half the names move.
pub fn moves_on_split(hash: u64, depth: u32) -> bool {
    hash >> depth & 1 == 1
}

/// Depth a partition has when it is created: the number of bits of its index (partition
/// 0: 0; 1: 1; 2 and 3: 2; 4 to 7: 3; …).
pub fn birth_depth(index: u32) -> u32 {
    32 - index.leading_zeros()
}

/// Where a name sorts in a listing of its directory, and in the server's store: its hash
/// with the bits reversed. Partition `index` at depth `d` (names whose hash has `index` in
/// its low `d` bits) is then one contiguous range of listing keys ([`key_range`]), and a
/// split cuts a range into its lower and upper halves (the moving names are the upper
/// half). A listing that walks listing keys upwards therefore meets every name exactly
/// once however the directory splits meanwhile: a position never moves.
pub fn listing_key(hash: u64) -> u64 {
    hash.reverse_bits()
}

/// The listing keys of partition `index` at `depth`: first and last, inclusive.
pub fn key_range(index: u32, depth: u32) -> (u64, u64) {
    if depth == 0 {
        return (0, u64::MAX);
    }
    let lo = u64::from(index).reverse_bits();
    (lo, lo | u64::MAX >> depth)
}

/// The first listing key after partition `index` at `depth`: where a listing goes on once
/// it has been through that partition. `None` after the last one.
pub fn key_after(index: u32, depth: u32) -> Option<u64> {
    key_range(index, depth).1.checked_add(1)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    #[error("partition {0} does not exist")]
    NoSuchPartition(u32),
    #[error("partition {0} is at the depth limit {MAX_DEPTH}")]
    AtDepthLimit(u32),
}

/// Which partitions of a directory exist. Bit `i` set = partition `i` exists; partition 0
/// always does. Stored as 64-bit words up to the highest partition, trailing zero words
/// trimmed (so equal sets compare and serialise equal): 8 bytes for a directory with up to
/// 64 partitions, at most 2^20 bits = 128 KiB at [`MAX_DEPTH`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<u64>", into = "Vec<u64>")]
pub struct Bitmap {
    words: Vec<u64>,
}

impl Default for Bitmap {
    fn default() -> Self {
        Bitmap::new()
    }
}

impl Bitmap {
    /// An unsplit directory: partition 0 only.
    pub fn new() -> Bitmap {
        Bitmap { words: vec![1] }
    }

    pub fn contains(&self, index: u32) -> bool {
        self.words.get((index / 64) as usize).is_some_and(|w| w >> (index % 64) & 1 == 1)
    }

    /// Number of partitions.
    pub fn len(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// Never: partition 0 always exists (here for clippy's `len` convention).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The existing partitions, in index order.
    pub fn partitions(&self) -> impl Iterator<Item = u32> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(wi, &w)| (0..64u32).filter(move |b| w >> b & 1 == 1).map(move |b| wi as u32 * 64 + b))
    }

    /// The depth of existing partition `index`: its birth depth plus one per split since,
    /// which are exactly its children present in the bitmap (a partition splits at
    /// increasing depths, one child per split).
    pub fn depth_of(&self, index: u32) -> u32 {
        let mut d = birth_depth(index);
        while d < MAX_DEPTH && self.contains(index | 1 << d) {
            d += 1;
        }
        d
    }

    /// The partition that holds names with hash `hash`: the deepest existing partition
    /// whose index equals the hash's low bits. Walks from partition 0 down the splits
    /// (at most [`MAX_DEPTH`] steps).
    pub fn partition_of(&self, hash: u64) -> u32 {
        let (mut index, mut depth) = (0u32, 0u32);
        while let Some(child) = split_child(index, depth) {
            if !self.contains(child) {
                break;
            }
            if moves_on_split(hash, depth) {
                index = child;
            }
            depth += 1;
        }
        index
    }

    /// Record the split of existing partition `index` (at its current depth); returns the new
    /// partition's index.
    pub fn split(&mut self, index: u32) -> Result<u32, SplitError> {
        if !self.contains(index) {
            return Err(SplitError::NoSuchPartition(index));
        }
        let child = split_child(index, self.depth_of(index)).ok_or(SplitError::AtDepthLimit(index))?;
        let w = (child / 64) as usize;
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (child % 64);
        Ok(child)
    }

    /// Record that partition `index` exists (learnt from the server that made it). Its
    /// ancestors exist already wherever the split protocol is followed; this does not check.
    pub fn insert(&mut self, index: u32) -> Result<(), SplitError> {
        if index >> MAX_DEPTH != 0 {
            return Err(SplitError::AtDepthLimit(index));
        }
        let w = (index / 64) as usize;
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (index % 64);
        Ok(())
    }

    /// Add the partitions `other` knows of (a client learning a newer bitmap of the same
    /// directory from a reply). Bitmaps only grow, so the union is the newer view.
    pub fn merge(&mut self, other: &Bitmap) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }
}

impl From<Bitmap> for Vec<u64> {
    fn from(b: Bitmap) -> Vec<u64> {
        b.words
    }
}

impl TryFrom<Vec<u64>> for Bitmap {
    type Error = String;
    /// A stored or received bitmap is checked, not trusted: partition 0 present, nothing
    /// past the depth limit, and every partition's parent present (a partition `i` with
    /// top bit `k` comes from the split of `i` without that bit).
    fn try_from(mut words: Vec<u64>) -> Result<Bitmap, String> {
        while words.len() > 1 && words.last() == Some(&0) {
            words.pop();
        }
        if words.len() > (1usize << MAX_DEPTH) / 64 {
            return Err(format!("partition bitmap of {} words is past the depth limit {MAX_DEPTH}", words.len()));
        }
        let b = Bitmap { words };
        if !b.contains(0) {
            return Err("partition bitmap without partition 0".into());
        }
        if let Some(orphan) = b.partitions().find(|&i| i != 0 && !b.contains(i & !(1 << (birth_depth(i) - 1)))) {
            return Err(format!("partition bitmap has partition {orphan} without the partition it split from"));
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_follow_the_radix_order() {
        let mut b = Bitmap::new();
        assert_eq!(b.partition_of(u64::MAX), 0);
        assert_eq!(b.split(0), Ok(1)); // 0 at depth 0 → 1
        assert_eq!(b.split(0), Ok(2)); // 0 at depth 1 → 2
        assert_eq!(b.split(1), Ok(3)); // 1 at depth 1 → 3
        assert_eq!(b.split(2), Ok(6)); // 2 at depth 2 → 6
        assert_eq!(b.partitions().collect::<Vec<_>>(), vec![0, 1, 2, 3, 6]);
        assert_eq!([0, 1, 2, 3, 6].map(|i| b.depth_of(i)), [2, 2, 3, 2, 3]);
        // Low bits 0b010 → 2, 0b110 → 6, 0b100 → 0 (0 is at depth 2), 0b11 → 3.
        assert_eq!(b.partition_of(0b010), 2);
        assert_eq!(b.partition_of(0b110), 6);
        assert_eq!(b.partition_of(0b100), 0);
        assert_eq!(b.partition_of(0b1011), 3);
        assert_eq!(b.split(5), Err(SplitError::NoSuchPartition(5)));
        assert_eq!(split_child(3, 1), None, "partition 3 is born at depth 2");
    }

    #[test]
    fn a_partition_is_one_range_of_listing_keys() {
        assert_eq!(key_range(0, 0), (0, u64::MAX));
        assert_eq!(key_range(0, 1), (0, u64::MAX >> 1));
        assert_eq!(key_range(1, 1), (1 << 63, u64::MAX));
        assert_eq!(key_after(1, 1), None);
        assert_eq!(key_after(0, 1), Some(1 << 63));
        // Partition 5 at depth 3: low bits 101 -> top bits 101.
        assert_eq!(key_range(5, 3), (0b101 << 61, (0b101 << 61) | u64::MAX >> 3));
    }

    #[test]
    fn the_depth_limit_bounds_the_partitions() {
        let mut b = Bitmap::new();
        for _ in 0..MAX_DEPTH {
            b.split(0).unwrap();
        }
        assert_eq!(b.depth_of(0), MAX_DEPTH);
        assert_eq!(b.split(0), Err(SplitError::AtDepthLimit(0)));
        assert!(Vec::<u64>::from(b).len() <= (1 << MAX_DEPTH) / 64);
    }

    #[test]
    fn a_bitmap_is_checked_when_decoded() {
        assert!(Bitmap::try_from(vec![0b10]).unwrap_err().contains("partition 0"));
        // Partition 3 comes from the split of 1, which is missing.
        assert!(Bitmap::try_from(vec![0b1001]).unwrap_err().contains("partition 3"));
        assert_eq!(Bitmap::try_from(vec![1, 0, 0]).unwrap(), Bitmap::new());
        assert!(Bitmap::try_from(vec![1; (1 << MAX_DEPTH) / 64 + 1]).is_err());
    }

    /// Split a random sequence of partitions.
    fn grown(choices: &[u32]) -> Bitmap {
        let mut b = Bitmap::new();
        for c in choices {
            let parts: Vec<u32> = b.partitions().collect();
            let _ = b.split(parts[*c as usize % parts.len()]);
        }
        b
    }

    proptest! {
        /// The partition a name maps to exists and its index is the hash's low bits at its depth.
        #[test]
        fn partition_of_is_the_deepest_matching_partition(choices in proptest::collection::vec(any::<u32>(), 0..60), hashes in proptest::collection::vec(any::<u64>(), 1..50)) {
            let b = grown(&choices);
            for h in hashes {
                let p = b.partition_of(h);
                prop_assert!(b.contains(p));
                let d = b.depth_of(p);
                prop_assert_eq!(h & ((1u64 << d) - 1), p as u64);
            }
        }

        /// A name's listing key is inside its partition's range, and the partitions' ranges
        /// tile the whole key space.
        #[test]
        fn a_name_sorts_inside_its_partitions_range(choices in proptest::collection::vec(any::<u32>(), 0..60), hashes in proptest::collection::vec(any::<u64>(), 1..50)) {
            let b = grown(&choices);
            for h in hashes {
                let p = b.partition_of(h);
                let (lo, hi) = key_range(p, b.depth_of(p));
                prop_assert!((lo..=hi).contains(&listing_key(h)));
            }
            let mut ranges: Vec<(u64, u64)> = b.partitions().map(|p| key_range(p, b.depth_of(p))).collect();
            ranges.sort();
            prop_assert_eq!(ranges[0].0, 0);
            prop_assert_eq!(ranges.last().unwrap().1, u64::MAX);
            for w in ranges.windows(2) {
                prop_assert_eq!(w[0].1 + 1, w[1].0);
            }
        }

        /// A split moves exactly the names with bit `depth` set, to the new partition, and no
        /// other name changes partition.
        #[test]
        fn a_split_moves_only_the_names_with_the_depth_bit(choices in proptest::collection::vec(any::<u32>(), 0..40), pick in any::<u32>(), hashes in proptest::collection::vec(any::<u64>(), 1..80)) {
            let before = grown(&choices);
            let parts: Vec<u32> = before.partitions().collect();
            let victim = parts[pick as usize % parts.len()];
            let depth = before.depth_of(victim);
            let mut after = before.clone();
            let child = after.split(victim).unwrap();
            for h in hashes {
                let (a, b) = (before.partition_of(h), after.partition_of(h));
                if a == victim && moves_on_split(h, depth) {
                    prop_assert_eq!(b, child);
                } else {
                    prop_assert_eq!(a, b);
                }
            }
        }

        /// Serialising and merging keep the set; a merged view is a superset of both.
        #[test]
        fn bitmaps_round_trip_and_merge(a in proptest::collection::vec(any::<u32>(), 0..40), b in proptest::collection::vec(any::<u32>(), 0..40)) {
            let (x, y) = (grown(&a), grown(&b));
            let back = Bitmap::try_from(Vec::<u64>::from(x.clone())).unwrap();
            prop_assert_eq!(&back, &x);
            let mut m = x.clone();
            m.merge(&y);
            prop_assert!(x.partitions().chain(y.partitions()).all(|p| m.contains(p)));
            prop_assert_eq!(m.len() as usize, m.partitions().count());
        }
    }
}
