//! The bytes a benchmark writes: every 8-byte word holds `seed ^ offset-of-the-word`
//! (IOR's "offset" data packet), so a reader can check any range without knowing who
//! wrote it, and filling a buffer costs about as much as `memset`.

/// The word stored at the 8-aligned file offset `word_off`.
#[inline]
fn word(seed: u64, word_off: u64) -> u64 {
    seed ^ word_off
}

/// Fill `buf` with the pattern of the file range starting at `off`.
pub fn fill(buf: &mut [u8], seed: u64, off: u64) {
    let mut pos = 0usize;
    let mut o = off;
    // Unaligned head, byte by byte.
    while pos < buf.len() && o & 7 != 0 {
        buf[pos] = (word(seed, o & !7) >> (8 * (o % 8))) as u8;
        pos += 1;
        o += 1;
    }
    let mut chunks = buf[pos..].chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&word(seed, o).to_le_bytes());
        o += 8;
    }
    let rest = chunks.into_remainder();
    for b in rest.iter_mut() {
        *b = (word(seed, o & !7) >> (8 * (o % 8))) as u8;
        o += 1;
    }
}

/// A buffer of `len` bytes holding the pattern at `off`.
pub fn make(len: usize, seed: u64, off: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(&mut v, seed, off);
    v
}

/// Whether `data` is the pattern of the file range starting at `off`. `scratch` is reused
/// between calls to avoid allocating.
pub fn check(data: &[u8], seed: u64, off: u64, scratch: &mut Vec<u8>) -> bool {
    scratch.resize(data.len(), 0);
    fill(scratch, seed, off);
    scratch[..] == data[..]
}

/// The seed of the pattern of one file: the run's seed mixed with a file number, so two
/// files of one run never hold the same bytes.
pub fn file_seed(run_seed: u64, file: u64) -> u64 {
    let mut z = run_seed ^ file.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_agree_with_the_whole() {
        let whole = make(1000, 7, 3);
        for (a, b) in [(0usize, 1000usize), (5, 17), (13, 999), (8, 16), (1, 2)] {
            let part = make(b - a, 7, 3 + a as u64);
            assert_eq!(&whole[a..b], &part[..], "{a}..{b}");
        }
        let mut scratch = Vec::new();
        assert!(check(&whole[10..100], 7, 13, &mut scratch));
        assert!(!check(&whole[10..100], 7, 14, &mut scratch));
        assert!(!check(&whole[10..100], 8, 13, &mut scratch));
        assert_ne!(file_seed(1, 0), file_seed(1, 1));
    }
}
