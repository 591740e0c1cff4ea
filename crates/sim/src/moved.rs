//! What a change of the server list moves: a server joining (appended to the map, weight
//! 1) or leaving (the last server marked `out`).
//!
//! * Inodes (and directory homes, which are inodes) follow `home_of`, weighted rendezvous:
//!   only the keys the joining server wins move, only the leaving server's keys move.
//!   Measured on [`INODE_SAMPLES`] random inode numbers.
//! * Partitions follow `partition_home`: the ring of servers in map order, from the
//!   directory's home. A change of the ring's length shifts most partitions of a split
//!   directory (partition `i` goes from `ring[(h + i) % N]` to `ring[(h + i) % (N ± 1)]`),
//!   so a map change moves most split directories' entries: that is the price of a client
//!   computing a partition's server from the bitmap alone, and why moving them is left to
//!   rebalancing.
//! * Data objects never move on a join (the layout is chosen at create and kept in the
//!   inode); on a leave the leaving server's objects must go elsewhere.

use crate::namespace::Placed;
use crate::{Moved, Shape};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_placement::rendezvous::score;
use shoal_placement::{ring_step, ClusterMap, ServerState};
use shoal_proto::{Ino, ServerId};

/// Random inode numbers on which the moved fraction of inodes is measured.
pub const INODE_SAMPLES: u64 = 1_000_000;

/// ln(10¹²). The chance that server X is a key's home given X's score `s` is
/// exp(−W_others / s) (each other server j scores below s with probability
/// exp(−w_j / s)); below `W_others / SKIP` that is under 10⁻¹², so `home_of` (O(servers))
/// only runs for the keys X might win: about SKIP / N of them.
const SKIP: f64 = 27.631;

/// How many of `samples` random keys have `x` as their home in `with_x` (which holds it):
/// the keys that move to `x` when it joins, or away from it when it leaves.
pub fn keys_won_by(with_x: &ClusterMap, x: ServerId, samples: u64, rng: &mut StdRng) -> u64 {
    let Some(xe) = with_x.server(x) else { return 0 };
    let others: f64 = with_x.placeable().filter(|s| s.id != x.0).map(|s| s.weight).sum();
    let threshold = others / SKIP;
    (0..samples)
        .filter(|_| {
            let key: u64 = rng.gen();
            score(key, x.0, xe.weight) >= threshold && with_x.home_of(Ino(key)) == x
        })
        .count() as u64
}

/// Fractions of the sampled directories' partitions and entries whose server differs
/// between `a` and `b`. A sampled directory's inode number is drawn at random (it is a
/// rendezvous key like any other), its home found in each map with `home_of`.
fn partitions_moved(a: &ClusterMap, b: &ClusterMap, placed: &Placed, rng: &mut StdRng) -> (f64, f64) {
    let (ra, rb) = (a.ring(), b.ring());
    let (mut parts, mut parts_moved, mut entries, mut entries_moved) = (0.0, 0.0, 0.0, 0.0);
    for d in &placed.sampled {
        let dir = Ino(rng.gen());
        let (ha, hb) = (a.home_of(dir), b.home_of(dir));
        let pa = ra.iter().position(|&s| s == ha).unwrap_or(0);
        let pb = rb.iter().position(|&s| s == hb).unwrap_or(0);
        for &(p, c) in &d.parts {
            parts += d.weight;
            entries += d.weight * c as f64;
            if ring_step(&ra, pa, p) != ring_step(&rb, pb, p) {
                parts_moved += d.weight;
                entries_moved += d.weight * c as f64;
            }
        }
    }
    (parts_moved / parts.max(1e-300), if entries > 0.0 { entries_moved / entries } else { 0.0 })
}

/// A server (id N, weight 1) appended to the map.
pub fn on_join(map: &ClusterMap, shape: &Shape, placed: &Placed) -> Moved {
    let n = map.servers.len() as u32;
    let mut after = map.clone();
    let mut entry = map.servers[0].clone();
    entry.id = n;
    entry.addr = format!("127.0.0.1:{}", 7000 + n);
    entry.weight = 1.0;
    after.servers.push(entry);
    let mut rng = StdRng::seed_from_u64(shape.seed ^ 0x4a4f_494e);
    let won = keys_won_by(&after, ServerId(n), INODE_SAMPLES, &mut rng);
    let (partitions, entries) = partitions_moved(map, &after, placed, &mut rng);
    let w: f64 = after.placeable().map(|s| s.weight).sum();
    Moved {
        change: "join".into(),
        server: n,
        inodes: won as f64 / INODE_SAMPLES as f64,
        inodes_expected: 1.0 / w,
        inode_samples: INODE_SAMPLES,
        partitions,
        entries,
        objects: 0.0,
    }
}

/// The last server of the map marked `out`.
pub fn on_leave(map: &ClusterMap, shape: &Shape, placed: &Placed) -> Moved {
    let last = map.servers.len() - 1;
    let x = map.servers[last].server_id();
    let mut after = map.clone();
    after.servers[last].state = ServerState::Out;
    let mut rng = StdRng::seed_from_u64(shape.seed ^ 0x4c45_4156);
    let lost = keys_won_by(map, x, INODE_SAMPLES, &mut rng);
    let (partitions, entries) =
        if after.placeable().next().is_some() { partitions_moved(map, &after, placed, &mut rng) } else { (1.0, 1.0) };
    let objects = &placed.loads[crate::namespace::KINDS.iter().position(|k| *k == "objects").unwrap_or(4)].1;
    let total: u64 = objects.iter().sum();
    let w: f64 = map.placeable().map(|s| s.weight).sum();
    Moved {
        change: "leave".into(),
        server: x.0,
        inodes: lost as f64 / INODE_SAMPLES as f64,
        inodes_expected: map.servers[last].weight / w,
        inode_samples: INODE_SAMPLES,
        partitions,
        entries,
        objects: if total > 0 { objects[last] as f64 / total as f64 } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortcut counts exactly what calling `home_of` on every key counts.
    #[test]
    fn skipping_low_scores_changes_no_count() {
        let map = ClusterMap::local(9, 7000, std::path::Path::new("/x"));
        for x in [0, 4, 8] {
            let fast = keys_won_by(&map, ServerId(x), 50_000, &mut StdRng::seed_from_u64(7));
            let mut rng = StdRng::seed_from_u64(7);
            let slow = (0..50_000).filter(|_| map.home_of(Ino(rng.gen())) == ServerId(x)).count() as u64;
            assert_eq!(fast, slow);
        }
    }
}
