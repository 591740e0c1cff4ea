//! The hash of a directory entry's name, which decides the partition (and so the server)
//! the entry is stored on once its directory has split.
//!
//! **Stable forever.** Entries already stored are found again only if every client and
//! server, of every version, computes the same value for the same name: changing this
//! function would lose every entry of every split directory. The golden test below pins
//! a few values so that no change (of the algorithm, of the seed, of a crate upgrade that
//! changed its output) can happen silently.
//!
//! XXH3-64 with seed 0 (from `xxhash-rust`): a published, versioned algorithm whose output
//! is specified, fast on short names (a few ns), and uniform in its low bits, which are the
//! ones GIGA+ partitioning uses. It is not keyed: a user who picks names that collide in
//! their low bits can only crowd one partition of their own directory, which then keeps
//! splitting up to the depth limit (`partition::MAX_DEPTH`) and no further.

/// The 64-bit hash of an entry name (the bytes as given; no normalisation).
pub fn name_hash(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

/// The same hash over any bytes: where a tuple is kept (`Value::key_bytes` of its first
/// field, docs/tuples.md). Stable forever, as [`name_hash`].
pub fn bytes_hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These values are part of the on-disk contract: if this test fails, the change would
    /// make existing entries of split directories unreachable. Do not update the numbers.
    #[test]
    fn name_hash_golden_values_never_change() {
        assert_eq!(name_hash(""), 0x2d06_8005_38d3_94c2);
        assert_eq!(name_hash("a"), 0xe6c6_32b6_1e96_4e1f);
        assert_eq!(name_hash("file.0"), GOLDEN_FILE_0);
        assert_eq!(name_hash("mdtest_tree.0/file.mdtest.3.12345"), GOLDEN_MDTEST);
    }

    const GOLDEN_FILE_0: u64 = 0x4443_22eb_09bd_0d1d;
    const GOLDEN_MDTEST: u64 = 0x799a_0160_16c7_677a;

    #[test]
    fn the_low_bits_are_uniform_over_sequential_names() {
        // GIGA+ uses the low bits: 64 buckets of 64,000 sequential names each get about 1,000.
        let mut buckets = [0u32; 64];
        for i in 0..64_000 {
            buckets[(name_hash(&format!("file.{i}")) & 63) as usize] += 1;
        }
        for b in buckets {
            assert!((850..1150).contains(&b), "{buckets:?}");
        }
    }
}
