//! `shoal sim`: how Shoal's placement spreads a namespace over a cluster, and how much of it
//! a server joining or leaving moves, computed without servers.
//!
//! Everything is placed by the product's own functions (`shoal-placement`): directory homes
//! by the round-robin the servers use for new directories (`dir_ring_pos`), directory
//! partitions by the split policy (`should_split`), the partition bitmap (`Bitmap::split`)
//! and `ring_step` (the arithmetic of `ClusterMap::partition_home`), a file's inode on its
//! entry's partition server (the file-inode-with-its-entry rule), data objects by
//! `resolve_layout` and `object_len`, and inode homes on a map change by `home_of`.
//!
//! **What is sampled, and why that is enough** (see [`namespace`] and [`moved`]):
//! * Names are not enumerated. How a directory's n names fall into its partitions is drawn
//!   from the distribution a uniform name hash gives: at each split, Binomial(n, ½) names
//!   have the split bit set. That is the exact distribution of the counts that hashing n
//!   real names gives (`name_hash` is uniform in its low bits, tested in placement), at
//!   one draw per partition instead of one hash per name, so 10⁹ files cost as much as
//!   their partitions. Every directory and every partition is placed; none is skipped.
//! * Moved inodes are measured on 1,000,000 random inode numbers (rendezvous: each moves
//!   with probability w/W, independently), which gives the fraction within ±2/√(10⁶/N) of
//!   itself: ±2 % at 100 servers, ±20 % (of 0.01 %) at 10,000.
//! * Moved partitions are measured on up to 1,024 directories spread over the namespace,
//!   plus the root and the shared directory, each with all of its partitions.

pub mod moved;
pub mod namespace;
pub mod stats;

use serde::{Deserialize, Serialize};
use shoal_proto::msg::{STRIPE_SIZE_MAX, STRIPE_SIZE_MIN};

/// How many files each ordinary directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirSizes {
    /// Every directory has `files_per_dir` files.
    Fixed,
    /// Exponential with mean `files_per_dir`: many small directories, a few large ones.
    Exp,
    /// Pareto (α = 1.5) with mean `files_per_dir`: a heavy tail of huge directories.
    Pareto,
}

impl DirSizes {
    pub fn parse(s: &str) -> Result<DirSizes, String> {
        match s {
            "fixed" => Ok(DirSizes::Fixed),
            "exp" => Ok(DirSizes::Exp),
            "pareto" => Ok(DirSizes::Pareto),
            other => Err(format!("unknown directory size distribution {other:?} (expected fixed, exp or pareto)")),
        }
    }
}

/// The namespace to place: the root holds `dirs` directories of files and, if
/// `shared_files` > 0, one more directory shared by a job with that many files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    pub dirs: u64,
    pub files_per_dir: u64,
    pub dir_sizes: DirSizes,
    pub shared_files: u64,
    /// Bytes written to each file (0: no data object is written).
    pub file_size: u64,
    /// Objects per file; 0 = every server (as `stripe_count = 0` in the cluster map).
    pub stripe_count: u32,
    pub stripe_size: u64,
    /// Seed of the random draws (directory sizes, names' partitions, sampled inodes).
    pub seed: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            dirs: 10_000,
            files_per_dir: 100,
            dir_sizes: DirSizes::Fixed,
            shared_files: 1_000_000,
            file_size: 3901,
            stripe_count: 1,
            stripe_size: 1 << 20,
            seed: 1,
        }
    }
}

/// Bounds that keep a run within seconds and its figures meaningful.
pub const MAX_SERVERS: u32 = 100_000;
pub const MAX_DIRS: u64 = 100_000_000;
pub const MAX_FILES: u64 = 1_000_000_000_000;

impl Shape {
    /// One line naming the bad value and what is allowed.
    pub fn check(&self, servers: u32) -> Result<(), String> {
        if !(1..=MAX_SERVERS).contains(&servers) {
            return Err(format!("server count {servers} must be between 1 and {MAX_SERVERS}"));
        }
        if self.dirs > MAX_DIRS {
            return Err(format!("directory count {} is more than {MAX_DIRS}", self.dirs));
        }
        let files = (self.dirs as u128) * (self.files_per_dir as u128) + self.shared_files as u128;
        if files > MAX_FILES as u128 {
            return Err(format!("{files} files is more than {MAX_FILES}"));
        }
        if !(STRIPE_SIZE_MIN..=STRIPE_SIZE_MAX).contains(&self.stripe_size)
            || !self.stripe_size.is_multiple_of(STRIPE_SIZE_MIN)
        {
            return Err(format!("stripe size {} must be a multiple of 4096 between 4 KiB and 1 GiB", self.stripe_size));
        }
        if self.stripe_count > servers {
            return Err(format!(
                "stripe count {} is more than the {servers} servers (0 stripes over all of them)",
                self.stripe_count
            ));
        }
        Ok(())
    }
}

/// Spread of one kind of thing over the servers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub kind: String,
    pub total: u64,
    pub max: u64,
    pub mean: f64,
    pub min: u64,
    /// max / mean (1 = perfect; what the busiest server carries above its share).
    pub max_over_mean: f64,
    /// max / min (infinite when a server holds none: reported as null in JSON).
    pub max_over_min: Option<f64>,
}

/// What a change of the server list moves, as fractions of what exists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Moved {
    /// "join" (a server appended to the map) or "leave" (the last server marked out).
    pub change: String,
    pub server: u32,
    /// Inodes whose home (`home_of`, rendezvous) changes; directory homes included.
    pub inodes: f64,
    /// What rendezvous promises: the joining server's weight share, or the leaving one's.
    pub inodes_expected: f64,
    pub inode_samples: u64,
    /// Directory partitions whose server (`partition_home`, round-robin) changes.
    pub partitions: f64,
    /// Entries in those partitions (weighted by their entries).
    pub entries: f64,
    /// Data objects that must move: none on a join (a file's layout is fixed at create and
    /// stored in its inode), the leaving server's on a leave.
    pub objects: f64,
}

/// The result of one simulation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub servers: u32,
    pub shape: Shape,
    /// Files in the whole namespace (drawn directory sizes summed).
    pub files: u64,
    /// Directories, root included.
    pub directories: u64,
    pub split_entries: u64,
    pub target_depth: u32,
    /// Partitions of the shared directory (0 without one).
    pub shared_partitions: u32,
    pub spread: Vec<Spread>,
    pub moved: Vec<Moved>,
    pub seconds: f64,
    /// Per server, per kind (same order as `spread`), for plots; not in JSON.
    #[serde(skip)]
    pub per_server: Vec<Vec<u64>>,
}

/// Simulate `shape` on a map of `servers` equal servers. `progress(done, total)` is called
/// now and then (directories placed, then the two map changes).
pub fn run(shape: &Shape, servers: u32, progress: &mut dyn FnMut(u64, u64)) -> Result<Report, String> {
    shape.check(servers)?;
    let start = std::time::Instant::now();
    let map = namespace::sim_map(shape, servers);
    let placed = namespace::place(&map, shape, progress);
    let total = placed.total_steps;
    let moved = vec![moved::on_join(&map, shape, &placed), {
        progress(total - 1, total);
        moved::on_leave(&map, shape, &placed)
    }];
    progress(total, total);
    let spread: Vec<Spread> = placed.loads.iter().map(|(kind, v)| stats::spread(kind, v)).collect();
    Ok(Report {
        servers,
        shape: shape.clone(),
        files: placed.files,
        directories: placed.directories,
        split_entries: shoal_placement::SPLIT_ENTRIES,
        target_depth: shoal_placement::target_depth(servers),
        shared_partitions: placed.shared_partitions,
        spread,
        moved,
        seconds: start.elapsed().as_secs_f64(),
        per_server: placed.loads.into_iter().map(|(_, v)| v).collect(),
    })
}
