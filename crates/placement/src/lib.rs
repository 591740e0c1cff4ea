//! Placement by computation: the cluster map (which servers exist, where, how heavy) and the
//! pure functions over it that tell every client and server where a directory, an inode or
//! a data object lives. No lookup service: any two parties with the same map version agree.
//!
//! Directories split over servers as they grow (GIGA+): [`name_hash`] gives a name's hash,
//! a directory's [`Bitmap`] says which partitions exist and [`Bitmap::partition_of`] which
//! one holds a hash, [`ClusterMap::partition_home`] where that partition lives
//! ([`ClusterMap::entry_home`] does all three), and [`should_split`] when a partition
//! splits ([`Bitmap::split`], [`moves_on_split`] says which names move).
//!
//! ```
//! use shoal_placement::ClusterMap;
//! let map = ClusterMap::local(4, 7400, std::path::Path::new("/tmp/x"));
//! let home = map.home_of(shoal_proto::ROOT_INO);
//! assert!(map.server(home).is_some());
//! ```

pub mod map;
pub mod name_hash;
pub mod partition;
pub mod partition_home;
pub mod rebalance;
pub mod rendezvous;
pub mod split_policy;
pub mod stripe;

pub use map::{ClusterDefaults, ClusterMap, MapError, ServerEntry, ServerState};
pub use name_hash::{bytes_hash, name_hash};
pub use partition::{
    birth_depth, key_after, key_range, listing_key, moves_on_split, split_child, Bitmap, SplitError, MAX_DEPTH,
};
pub use partition_home::{dir_ring_pos, ring_step};
pub use split_policy::{should_split, target_depth, SPLIT_ENTRIES};
pub use stripe::{check_replicas, check_spec, object_len, pieces, resolve_layout, resolve_layout_by, Piece};
