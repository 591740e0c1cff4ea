//! Place a whole namespace on a map and count, per server, what each holds.
//!
//! The namespace is created as a job would: the root's home server makes the directories
//! one after the other (the `turn`-th goes to `dir_ring_pos(root, turn)`, as
//! `State::next_dir_home` does), the shared directory last; then the files arrive. A
//! directory's partitions are what the split policy makes of its names while they arrive:
//! a partition splits once it has held `SPLIT_ENTRIES` names (creates only ever add), so
//! the subtree of partition `i` at depth `d` split iff `should_split(names in it, d, N)`.
//! Which names have the split bit set is drawn, Binomial(n, ½), as a uniform hash gives.

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use rand_distr::{Binomial, Distribution, Exp, Pareto};
use shoal_placement::{
    dir_ring_pos, object_len, resolve_layout, ring_step, should_split, Bitmap, ClusterMap, ServerState,
};
use shoal_proto::{Ino, ServerId, ROOT_INO};

use crate::{DirSizes, Shape};

/// The kinds counted per server, in report order.
pub const KINDS: [&str; 6] = ["directories", "partitions", "entries", "inodes", "objects", "data bytes"];

/// Indexes into [`Placed::loads`].
const DIRS: usize = 0;
const PARTS: usize = 1;
const ENTRIES: usize = 2;
const INODES: usize = 3;
const OBJECTS: usize = 4;
const BYTES: usize = 5;

/// Directories (besides the root and the shared one) kept, with their partitions, for
/// measuring what a map change moves.
pub const DIR_SAMPLE: u64 = 1024;

/// A directory kept for [`crate::moved`]: its partitions and their entries, and how many
/// directories of the namespace it stands for.
pub struct SampledDir {
    pub parts: Vec<(u32, u64)>,
    pub weight: f64,
}

pub struct Placed {
    /// Per kind ([`KINDS`]), per server id.
    pub loads: Vec<(String, Vec<u64>)>,
    pub files: u64,
    pub directories: u64,
    pub shared_partitions: u32,
    pub sampled: Vec<SampledDir>,
    /// For progress: directories to place, plus the two map changes.
    pub total_steps: u64,
}

/// `servers` equal servers, ids 0.. in map order, with the shape's stripe defaults.
pub fn sim_map(shape: &Shape, servers: u32) -> ClusterMap {
    let mut map = ClusterMap::local(servers, 7000, std::path::Path::new("/nonexistent"));
    map.cluster.stripe_count = shape.stripe_count;
    map.cluster.stripe_size = shape.stripe_size;
    map
}

/// A draw of Binomial(n, ½): how many of n names have a given hash bit set. Up to 4,096
/// names, exactly that: the set bits of n random bits (a few words, and most partitions
/// are that small); beyond, rand_distr's sampler.
fn half_binomial(n: u64, rng: &mut StdRng) -> u64 {
    if n > 4096 {
        return Binomial::new(n, 0.5).map(|b| b.sample(rng)).unwrap_or(n / 2);
    }
    let mut left = n;
    let mut set = 0u64;
    while left > 0 {
        let take = left.min(64);
        let bits = rng.next_u64() & (u64::MAX >> (64 - take));
        set += u64::from(bits.count_ones());
        left -= take;
    }
    set
}

struct Walk {
    ring: Vec<ServerId>,
    servers: u32,
    loads: Vec<Vec<u64>>,
    /// File inodes per server: with the `same` policy a file's layout depends only on it.
    files_on: Vec<u64>,
    rng: StdRng,
    parts: Vec<(u32, u64)>,
}

impl Walk {
    /// Grow the partitions of a directory that receives `count` names into the subtree of
    /// partition `index` at `depth`, recording the final partitions in `self.parts`.
    fn grow(&mut self, bitmap: &mut Bitmap, index: u32, depth: u32, count: u64) {
        if should_split(count, depth, self.servers) {
            if let Ok(child) = bitmap.split(index) {
                let moved = half_binomial(count, &mut self.rng);
                self.grow(bitmap, child, depth + 1, moved);
                self.grow(bitmap, index, depth + 1, count - moved);
                return;
            }
        }
        self.parts.push((index, count));
    }

    /// Place a directory whose home is at ring position `pos`, holding `names` entries
    /// (files when `files`, else subdirectories whose inodes are elsewhere).
    fn dir(&mut self, pos: usize, names: u64, files: bool) {
        let home = self.ring[pos].0 as usize;
        self.loads[DIRS][home] += 1;
        self.loads[INODES][home] += 1;
        self.parts.clear();
        let mut bitmap = Bitmap::new();
        self.grow(&mut bitmap, 0, 0, names);
        debug_assert_eq!(bitmap.len() as usize, self.parts.len());
        for i in 0..self.parts.len() {
            let (p, c) = self.parts[i];
            // ring_step(ring, pos, p) is ClusterMap::partition_home(dir, p) for a directory
            // homed at ring[pos]; a file's inode sits on its entry's partition server.
            let s = ring_step(&self.ring, pos, p).0 as usize;
            self.loads[PARTS][s] += 1;
            self.loads[ENTRIES][s] += c;
            if files {
                self.loads[INODES][s] += c;
                self.files_on[s] += c;
            }
        }
    }
}

/// Place the namespace of `shape` on `map`.
pub fn place(map: &ClusterMap, shape: &Shape, progress: &mut dyn FnMut(u64, u64)) -> Placed {
    let n = map.placeable().count();
    let mut w = Walk {
        ring: map.ring(),
        servers: n as u32,
        loads: vec![vec![0u64; map.servers.len()]; KINDS.len()],
        files_on: vec![0; map.servers.len()],
        rng: StdRng::seed_from_u64(shape.seed),
        parts: Vec::new(),
    };
    let shared = u64::from(shape.shared_files > 0);
    let total_steps = shape.dirs + 3;
    let mut sampled = Vec::new();

    // The root: its home by rendezvous, its entries the directories.
    let root_home = map.home_of(ROOT_INO);
    let root_pos = w.ring.iter().position(|&s| s == root_home).unwrap_or(0);
    w.dir(root_pos, shape.dirs + shared, false);
    sampled.push(SampledDir { parts: w.parts.clone(), weight: 1.0 });

    let f = shape.files_per_dir as f64;
    let exp = Exp::new(1.0 / f.max(1e-9)).ok();
    let pareto = Pareto::new((f / 3.0).max(1e-9), 1.5).ok();
    let stride = shape.dirs.div_ceil(DIR_SAMPLE).max(1);
    let weight = shape.dirs as f64 / shape.dirs.div_ceil(stride).max(1) as f64;
    let mut files = 0u64;
    for turn in 0..shape.dirs {
        let names = match (shape.dir_sizes, exp, pareto) {
            (DirSizes::Exp, Some(e), _) => e.sample(&mut w.rng).round() as u64,
            (DirSizes::Pareto, _, Some(p)) => p.sample(&mut w.rng).round() as u64,
            _ => shape.files_per_dir,
        };
        files += names;
        w.dir(dir_ring_pos(ROOT_INO, turn, n), names, true);
        if turn % stride == 0 {
            sampled.push(SampledDir { parts: w.parts.clone(), weight });
        }
        if turn % 65_536 == 0 {
            progress(turn, total_steps);
        }
    }
    let mut shared_partitions = 0;
    if shared == 1 {
        w.dir(dir_ring_pos(ROOT_INO, shape.dirs, n), shape.shared_files, true);
        files += shape.shared_files;
        shared_partitions = w.parts.len() as u32;
        sampled.push(SampledDir { parts: w.parts.clone(), weight: 1.0 });
    }
    progress(shape.dirs + 1, total_steps);

    // Data objects: with the `same` policy a file's layout starts at its inode's home, so
    // all files homed on one server share a layout; each of its objects that holds data
    // (object_len > 0) is one object on that layout's server.
    for (home, &count) in w.files_on.iter().enumerate() {
        if count == 0 || map.servers[home].state == ServerState::Out {
            continue;
        }
        let Ok(layout) = resolve_layout(map, Ino(home as u64 + 2), ServerId(home as u32), None, None) else {
            continue;
        };
        for (i, s) in layout.servers.iter().enumerate() {
            let len = object_len(&layout, i as u32, shape.file_size);
            if len > 0 {
                w.loads[OBJECTS][s.0 as usize] += count;
                w.loads[BYTES][s.0 as usize] += count * len;
            }
        }
    }
    Placed {
        loads: KINDS.iter().map(|k| k.to_string()).zip(w.loads).collect(),
        files,
        directories: 1 + shape.dirs + shared,
        shared_partitions,
        sampled,
        total_steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_placement::{name_hash, Bitmap};

    /// The partition counts drawn per split have the spread that hashing real names gives:
    /// 65,536 real names through `partition_of` on a 4-partition bitmap land within the
    /// binomial's bounds, as the draws do.
    #[test]
    fn drawn_partition_counts_match_real_names() {
        let mut b = Bitmap::new();
        for p in [0, 0, 1] {
            b.split(p).unwrap();
        }
        let mut real = [0u64; 4];
        for i in 0..65_536 {
            real[b.partition_of(name_hash(&format!("file.{i}"))) as usize] += 1;
        }
        let map = sim_map(&Shape::default(), 4);
        let shape = Shape { dirs: 0, shared_files: 65_536, ..Shape::default() };
        let placed = place(&map, &shape, &mut |_, _| {});
        let drawn = &placed.loads[ENTRIES].1;
        // 4 servers, 4 partitions each holding ~16,384 (σ ≈ 111): both within 5σ.
        for c in real.iter().chain(drawn.iter().filter(|&&c| c > 100)) {
            assert!((16_384 - 555..16_384 + 555).contains(c), "real {real:?} drawn {drawn:?}");
        }
    }

    #[test]
    fn every_file_and_directory_is_placed_once() {
        let shape = Shape { dirs: 1000, files_per_dir: 50, dir_sizes: DirSizes::Exp, ..Shape::default() };
        let map = sim_map(&shape, 7);
        let p = place(&map, &shape, &mut |_, _| {});
        let sum = |k: usize| p.loads[k].1.iter().sum::<u64>();
        assert_eq!(sum(DIRS), 1002);
        assert_eq!(sum(INODES), p.files + 1002);
        assert_eq!(sum(ENTRIES), p.files + 1001);
        assert_eq!(sum(OBJECTS), p.files, "one object per 3,901-byte file");
        assert_eq!(sum(BYTES), p.files * 3901);
        assert!(sum(PARTS) > 1002, "the shared directory split");
    }
}
