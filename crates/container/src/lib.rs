//! Task-local I/O containers (SIONlib, docs/containers.md): the logical files of many tasks
//! in a few physical files, opened and closed collectively, written and read by each task
//! on its own in between. On Shoal through the native client, or in any POSIX directory.
//!
//! Layout of the crate: `format.rs` (the bytes on disk), `meta.rs` (reading and checking
//! them), `store.rs` (physical files on Shoal or POSIX), `comm.rs` (the collective
//! operations, and the in-process adapter), `logical.rs` (one task's byte stream over its
//! chunks), `par.rs` (collective open and close), `serial.rs` (the serial API).

pub mod coalesce;
pub mod comm;
pub mod error;
pub mod format;
pub mod kv;
pub mod logical;
pub mod meta;
pub mod par;
pub mod serial;
pub mod store;
mod wire;

pub use comm::{Comm, LocalComm};
pub use error::{Corrupt, Error, Result, Where};
pub use logical::{Chunks, Logical};
pub use par::{MappedFile, ParFile, Plan, TaskInfo, WriteOptions, COLLECTOR_AUTO};
pub use serial::{open_rank, Container, Location, SerialWriter};
pub use store::Target;
