//! Local persistence: the metadata store (RocksDB), the data objects (plain files) and the
//! watch on free space.

pub mod checksums;
pub mod data;
pub mod meta;
pub mod space;
