//! Local persistence: the metadata store (RocksDB), its stored records and their upgrade,
//! the data objects (plain files) and the watch on free space.

pub mod checksums;
pub mod commits;
pub mod data;
pub mod direct;
pub mod meta;
pub mod records;
pub mod space;
pub mod sums_cache;
pub mod upgrade;
pub mod usage;
pub mod write_crcs;
