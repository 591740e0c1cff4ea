//! When a directory partition splits: one pure function, [`should_split`], that the server
//! holding a partition asks after each insert, and that `shoal sim` uses to grow its
//! directories, so the two cannot disagree.
//!
//! A partition at depth `d` splits when it holds [`SPLIT_ENTRIES`] entries or more and `d`
//! is below [`target_depth`] of the number of placeable servers. Three properties follow:
//!
//! * **Small directories never split.** Below 32 entries a directory is one partition on
//!   its home server: `ls` is one request and nothing ever moves (most directories of a
//!   file system are this small).
//! * **A big directory ends balanced.** Partitions are placed round-robin
//!   (`ClusterMap::partition_home`): with 2^d partitions over N servers each server holds
//!   ⌊2^d/N⌋ or ⌈2^d/N⌉ of them, and at full depth every partition holds 2^-d of the names.
//!   For N a power of two, d = log2 N gives exactly one partition per server. Otherwise
//!   the ⌈⌉/⌊⌋ step must be small: [`target_depth`] goes deep enough that every server gets
//!   at least 20 partitions (ratio ≤ 21/20 = 1.05), leaving the rest of the 1.1
//!   budget to the hash's own noise (±1/√(entries per server)). E.g. N = 3: depth 6,
//!   64 partitions, 22/21/21; N = 10,000: depth 18, 262,144 partitions, 27 or 26 per server.
//! * **Partitions stay bounded.** At most 2^target_depth ≤ 40 N partitions per directory
//!   (and never past `partition::MAX_DEPTH`), and no more than about 2 n / 32 for a
//!   directory of n entries, since only partitions of ≥ 32 entries split.
//!
//! Why 32 and not GIGA+'s 8,000: the target is md-hard (4,000 creates into one
//! directory on 4 servers) with per-server load max/min ≤ 1.1 over the *create* phase too.
//! With threshold T the directory reaches its 4 partitions after about 2T creates, the home
//! server having taken 1.5T of them; over M creates the ratio is then about
//! 1 + 6T/(M − 2T): 1.05 for T = 32, 1.10 for T = 64 (before hash noise). A split of a
//! 32-entry partition moves 16 entries: cheap enough to do early.

use crate::partition::MAX_DEPTH;

/// A partition with this many entries or more splits (if below the target depth).
pub const SPLIT_ENTRIES: u64 = 32;

/// Fewest partitions per server that [`target_depth`] aims for when the server count does
/// not divide a power of two: ⌈⌉/⌊⌋ = 21/20 = 1.05.
pub const MIN_PARTITIONS_PER_SERVER: u64 = 20;

/// The depth at which a directory's partitions stop splitting on a cluster of `servers`
/// placeable servers: the smallest `d` such that 2^d partitions placed round-robin give
/// every server the same number, or at least [`MIN_PARTITIONS_PER_SERVER`]; at most
/// `MAX_DEPTH`. One server: 0 (nothing to spread over).
pub fn target_depth(servers: u32) -> u32 {
    let n = u64::from(servers.max(1));
    (0..MAX_DEPTH)
        .find(|&d| {
            let p = 1u64 << d;
            p >= n && (p.is_multiple_of(n) || p / n >= MIN_PARTITIONS_PER_SERVER)
        })
        .unwrap_or(MAX_DEPTH)
}

/// Whether a partition at `depth` holding `entries` entries should split, on a cluster of
/// `servers` placeable servers.
pub fn should_split(entries: u64, depth: u32, servers: u32) -> bool {
    entries >= SPLIT_ENTRIES && depth < target_depth(servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_depth_gives_every_server_an_even_share() {
        assert_eq!([1, 2, 4, 8, 1024].map(target_depth), [0, 1, 2, 3, 10]);
        assert_eq!([3, 5, 10, 100, 1000, 10_000].map(target_depth), [6, 7, 8, 11, 15, 18]);
        for n in 1..3000u32 {
            let p = 1u64 << target_depth(n);
            let (lo, hi) = (p / n as u64, p.div_ceil(n as u64));
            assert!(lo >= 1 && hi as f64 / lo as f64 <= 1.05, "{n} servers: {p} partitions");
            assert!(p <= 40 * n as u64, "{n} servers: {p} partitions");
        }
        assert_eq!(target_depth(u32::MAX), MAX_DEPTH);
    }

    #[test]
    fn small_directories_never_split_and_deep_ones_stop() {
        assert!(!should_split(SPLIT_ENTRIES - 1, 0, 4));
        assert!(should_split(SPLIT_ENTRIES, 0, 4));
        assert!(should_split(1_000_000, 1, 4));
        assert!(!should_split(1_000_000, 2, 4), "4 partitions on 4 servers are enough");
        assert!(!should_split(1_000_000, 0, 1), "one server: nothing to spread over");
        assert!(should_split(1_000_000, 5, 3));
        assert!(!should_split(1_000_000, 6, 3));
    }
}
