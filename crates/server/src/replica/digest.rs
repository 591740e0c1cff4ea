//! Digests of a slot's stores, what a resync compares (`resync.rs`): the primary computes
//! them over its own stores, the mirror over its copy (`Op::PeerResyncQuery`), and only
//! what differs is shipped.
//!
//! * **Metadata**: every key with the 64-bit XXH3 of its value, in key order, a page at a
//!   time. The mirror's replication position (`key::REPLICA`) is its own and never
//!   compared.
//! * **Data**: per bucket (the 256 object directories), every object with a digest of its
//!   size and block checksums; per object, the size and the CRC32C of each 64 KiB block,
//!   read from the checksums kept with the object (`store/checksums.rs`), so comparing
//!   costs no read of the data. An empty object and a missing one are the same to a
//!   reader (both read as nothing) and are not compared. The mark of an object the store
//!   keeps no bytes of (its file keeps fewer copies, `thin.rs`) is listed as [`UNKEPT`].

use crate::error::R;
use crate::store::data::DataStore;
use crate::store::meta::{key, MetaStore};
use shoal_proto::Ino;
use xxhash_rust::xxh3::xxh3_64;

/// A page of keys with their values' hashes, and whether more follow.
pub type KeyPage = (Vec<(Vec<u8>, u64)>, bool);

/// Keys with their values, and whether the range was exhausted.
pub type PairPage = (Vec<(Vec<u8>, Vec<u8>)>, bool);

/// Metadata keys per page of a `ResyncQuery::Keys` answer.
pub const KEYS_PER_PAGE: u32 = 4096;

/// The hash a value is compared by.
pub fn value_hash(v: &[u8]) -> u64 {
    xxh3_64(v)
}

/// Up to `limit` keys after `after` (from the first without it) with their values' hashes,
/// and whether more follow. Blocks.
pub fn keys(meta: &MetaStore, after: Option<&[u8]>, limit: u32) -> R<KeyPage> {
    let mut out = Vec::new();
    let mut more = false;
    meta.scan(&[], after, |k, v| {
        if Some(k) == after || k == key::REPLICA || k == key::CLEAN_STOP {
            return Ok(true);
        }
        if out.len() >= limit as usize {
            more = true;
            return Ok(false);
        }
        out.push((k.to_vec(), value_hash(v)));
        Ok(true)
    })?;
    Ok((out, more))
}

/// Keys and values after `after` up to `upto` (inclusive; to the end without it), at most
/// `max_bytes` of them (at least one pair), and whether the range was exhausted. The
/// replication position is left out. Blocks.
pub fn pairs(meta: &MetaStore, after: Option<&[u8]>, upto: Option<&[u8]>, max_bytes: usize) -> R<PairPage> {
    let mut out = Vec::new();
    let mut bytes = 0;
    let mut exhausted = true;
    meta.scan(&[], after, |k, v| {
        if Some(k) == after || k == key::REPLICA || k == key::CLEAN_STOP {
            return Ok(true);
        }
        if upto.is_some_and(|u| k > u) {
            return Ok(false);
        }
        if !out.is_empty() && bytes + k.len() + v.len() > max_bytes {
            exhausted = false;
            return Ok(false);
        }
        bytes += k.len() + v.len();
        out.push((k.to_vec(), v.to_vec()));
        Ok(true)
    })?;
    Ok((out, exhausted))
}

/// The digest of an object's size and block checksums.
pub fn object_digest(size: u64, crcs: &[u32]) -> u64 {
    let mut b = Vec::with_capacity(8 + 4 * crcs.len());
    b.extend_from_slice(&size.to_le_bytes());
    for c in crcs {
        b.extend_from_slice(&c.to_le_bytes());
    }
    xxh3_64(&b)
}

/// The digest an object stands for whose store keeps only its mark (no bytes: its file
/// keeps fewer copies than the slot, `DataStore::mark_unkept`). No digest of a size and
/// checksums is this value but by a 1 in 2^64 chance.
pub const UNKEPT: u64 = u64::MAX;

/// Every non-empty object of bucket `b` with its digest and size, and every mark of an
/// object kept elsewhere with [`UNKEPT`] and size 0 (an object with both, left by a crash,
/// is its mark), sorted. Blocks.
pub fn objects(data: &DataStore, b: u8) -> R<Vec<(Ino, u32, u64, u64)>> {
    let (list, marks) = data.scan_bucket(b);
    let marked: std::collections::HashSet<(Ino, u32)> = marks.iter().copied().collect();
    let mut out = Vec::with_capacity(list.len() + marks.len());
    for (ino, index) in list.into_iter().filter(|o| !marked.contains(o)) {
        // Deleted or marked since it was listed: nothing to compare (the log carries it).
        match data.block_sums(ino, index) {
            Ok(Some((size, crcs))) if size > 0 => out.push((ino, index, object_digest(size, &crcs), size)),
            Ok(_) => {}
            Err(_) if data.is_unkept(ino, index) => {}
            Err(e) => return Err(e),
        }
    }
    out.extend(marks.into_iter().map(|(ino, index)| (ino, index, UNKEPT, 0)));
    out.sort();
    Ok(out)
}
