//! The CRC32C of a write's bytes, computed once for two uses.
//!
//! A `Write`'s data section is checksummed twice over: on the wire (the frame header's data
//! CRC32C, `FEATURE_DATA_CRC`) and on disk (a CRC32C per 64 KiB block of the object,
//! `checksums.rs`). Both are derived here from one pass over the bytes: the CRC32C of each
//! *piece* of the write — the bytes cut at the object's block boundaries, given the write's
//! object offset — from which the data store builds the blocks' checksums, and which
//! combine (constant time per piece, `checksums::crc32c_combine`) into the CRC32C of the
//! whole section, which the connection compares with what the frame header announced
//! (`net.rs`). A second pass costs about 60–70 µs per MiB on the machine of
//! docs/benchmarks.md ("Cost of data checksums"), 7 % of a 1 MiB write's server CPU.

use crate::store::checksums::{crc32c_combine, BLOCK};

/// The CRC32C of each block piece of `len` bytes written at object offset `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PieceCrcs {
    offset: u64,
    len: usize,
    crcs: Vec<u32>,
}

impl PieceCrcs {
    /// One pass over `data`, to be written at object offset `offset`: piece 0 runs from
    /// `offset` to the next block boundary (or the end of `data`), each next piece is a
    /// whole block, the last one ends with `data`. Never overflows, whatever `offset` (the
    /// connection computes this before the data store refuses an offset out of range).
    pub fn compute(offset: u64, data: &[u8]) -> PieceCrcs {
        let mut crcs = Vec::with_capacity(data.len() / BLOCK as usize + 2);
        let mut rest = data;
        let mut room = (BLOCK - offset % BLOCK) as usize;
        while !rest.is_empty() {
            let (piece, tail) = rest.split_at(room.min(rest.len()));
            crcs.push(crc32c::crc32c(piece));
            rest = tail;
            room = BLOCK as usize;
        }
        PieceCrcs { offset, len: data.len(), crcs }
    }

    /// Whether these are the pieces of `len` bytes at `offset`.
    pub fn cover(&self, offset: u64, len: usize) -> bool {
        self.offset == offset && self.len == len
    }

    /// The CRC32C of each piece, in order.
    pub fn pieces(&self) -> &[u32] {
        &self.crcs
    }

    /// The CRC32C of all the bytes (what a frame header's data checksum holds), combined
    /// from the pieces' without reading a byte.
    pub fn whole(&self) -> u32 {
        let mut crc = 0; // CRC32C of nothing
        let mut room = (BLOCK - self.offset % BLOCK) as usize;
        let mut left = self.len;
        for &piece in &self.crcs {
            let n = room.min(left);
            crc = crc32c_combine(crc, piece, n as u64);
            left -= n;
            room = BLOCK as usize;
        }
        crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pieces_are_cut_at_the_object_block_boundaries() {
        let b = BLOCK as usize;
        let data: Vec<u8> = (0..3 * b).map(|i| (i % 253) as u8).collect();
        let p = PieceCrcs::compute(BLOCK - 10, &data);
        let want = [&data[..10], &data[10..10 + b], &data[10 + b..10 + 2 * b], &data[10 + 2 * b..]];
        assert_eq!(p.pieces(), want.map(crc32c::crc32c));
        assert_eq!(PieceCrcs::compute(0, &data).pieces().len(), 3);
        assert!(PieceCrcs::compute(7, &[]).pieces().is_empty());
        assert_eq!(PieceCrcs::compute(7, &[]).whole(), crc32c::crc32c(&[]));
        // Offsets near the top of the range do not overflow (refused later, by the store).
        assert_eq!(PieceCrcs::compute(u64::MAX, &data).whole(), crc32c::crc32c(&data));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn the_pieces_combine_into_the_crc_of_the_whole(
            offset in 0u64..(1 << 40), len in 0usize..(300 << 10), seed in any::<u8>()
        ) {
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed)).collect();
            let p = PieceCrcs::compute(offset, &data);
            prop_assert_eq!(p.whole(), crc32c::crc32c(&data));
            prop_assert!(p.cover(offset, len));
        }
    }
}
