//! Placement by computation: the cluster map (which servers exist, where, how heavy) and the
//! pure functions over it that tell every client and server where a directory, an inode or
//! a data object lives. No lookup service: any two parties with the same map version agree.
//!
//! ```
//! use shoal_placement::ClusterMap;
//! let map = ClusterMap::local(4, 7400, std::path::Path::new("/tmp/x"));
//! let home = map.home_of(shoal_proto::ROOT_INO);
//! assert!(map.server(home).is_some());
//! ```

pub mod map;
pub mod rendezvous;
pub mod stripe;

pub use map::{ClusterDefaults, ClusterMap, MapError, ServerEntry, ServerState};
pub use stripe::{check_spec, object_len, pieces, resolve_layout, Piece};
