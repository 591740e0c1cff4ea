//! Where a directory's partitions live: partition `i` of directory `dir` is on the
//! placeable servers in map order, starting at `home_of(dir)`'s position, advanced by `i`
//! (GIGA+'s round-robin). Partition 0 is therefore on the directory's home with its inode,
//! the first N partitions are on N different servers, and a client computes the server of
//! any name from the directory's inode number and bitmap alone.
//!
//! A change of the server list moves many partitions (the ring shifts), unlike rendezvous
//! placement of inodes: moving them is rebalancing (a later issue); `shoal sim` reports how
//! many.

use crate::partition::Bitmap;
use crate::{name_hash, ClusterMap};
use shoal_proto::{Ino, ServerId};

/// Partition `index` of a directory whose home is at position `start` of `ring` (the
/// placeable servers in map order, as [`ClusterMap::ring`] returns them). The arithmetic
/// of [`ClusterMap::partition_home`], for callers that place many partitions of one
/// directory (or many directories whose home they know) without recomputing the ring.
pub fn ring_step(ring: &[ServerId], start: usize, index: u32) -> ServerId {
    ring[(start + index as usize % ring.len()) % ring.len()]
}

impl ClusterMap {
    /// The placeable servers in map order: the ring that partitions, stripes
    /// ([`ClusterMap::servers_from`]) and new directories' homes walk.
    pub fn ring(&self) -> Vec<ServerId> {
        self.placeable().map(|s| s.server_id()).collect()
    }

    /// The server holding partition `index` of directory `dir`.
    pub fn partition_home(&self, dir: Ino, index: u32) -> ServerId {
        let ring = self.ring();
        if ring.is_empty() {
            return ServerId(0);
        }
        let home = self.home_of(dir);
        let start = ring.iter().position(|&s| s == home).unwrap_or(0);
        ring_step(&ring, start, index)
    }

    /// Where the entry `name` of directory `dir` is, given the directory's partition
    /// `bitmap`: its partition and that partition's server. A file's inode (and, with the
    /// `same` policy, its first data object) is created on the same server, so that create,
    /// lookup and unlink are one request to one server.
    pub fn entry_home(&self, dir: Ino, bitmap: &Bitmap, name: &str) -> (u32, ServerId) {
        let p = bitmap.partition_of(name_hash(name));
        (p, self.partition_home(dir, p))
    }
}

/// Position in a ring of `len` servers where the next subdirectory of `parent` goes, for
/// the `turn`-th subdirectory the creating server makes: round-robin from a start that
/// depends on the parent, so consecutive directories land on different servers
/// (`State::next_dir_home` in the server; `shoal sim` places its directories with it).
pub fn dir_ring_pos(parent: Ino, turn: u64, len: usize) -> usize {
    (crate::rendezvous::mix64(parent.0).wrapping_add(turn) % len.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::ServerState;
    use std::path::Path;

    #[test]
    fn the_first_partitions_are_on_different_servers_starting_at_the_home() {
        let m = ClusterMap::local(5, 7000, Path::new("/tmp"));
        for d in 0..200u64 {
            let dir = Ino(d * 7919 + 3);
            assert_eq!(m.partition_home(dir, 0), m.home_of(dir));
            let first: std::collections::HashSet<ServerId> = (0..5).map(|i| m.partition_home(dir, i)).collect();
            assert_eq!(first.len(), 5);
            assert_eq!(m.partition_home(dir, 7), m.partition_home(dir, 2));
        }
    }

    #[test]
    fn servers_marked_out_hold_no_partition() {
        let mut m = ClusterMap::local(4, 7000, Path::new("/tmp"));
        m.servers[1].state = ServerState::Out;
        for i in 0..64 {
            assert_ne!(m.partition_home(Ino(42), i), ServerId(1));
        }
        assert_eq!(m.ring(), vec![ServerId(0), ServerId(2), ServerId(3)]);
    }

    #[test]
    fn an_entry_is_on_its_partitions_server() {
        let m = ClusterMap::local(4, 7000, Path::new("/tmp"));
        let mut b = Bitmap::new();
        assert_eq!(m.entry_home(Ino(9), &b, "x"), (0, m.home_of(Ino(9))));
        b.split(0).unwrap();
        b.split(0).unwrap();
        b.split(1).unwrap();
        let mut seen = std::collections::HashSet::new();
        for i in 0..100 {
            let name = format!("f{i}");
            let (p, s) = m.entry_home(Ino(9), &b, &name);
            assert_eq!(p, b.partition_of(name_hash(&name)));
            assert_eq!(s, m.partition_home(Ino(9), p));
            seen.insert(s);
        }
        assert_eq!(seen.len(), 4, "4 partitions, 4 servers");
    }
}
