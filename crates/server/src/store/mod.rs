//! Local persistence: the metadata store (RocksDB) and the data objects (plain files).

pub mod data;
pub mod meta;
