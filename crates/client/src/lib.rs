//! Shoal's native client library.
//!
//! A [`Client`] computes from the cluster map which server holds what (the home server of
//! an inode, the servers of a file's data objects; see `docs/architecture.md`) and talks to
//! that server directly over pipelined connections. It keeps a short-lived cache of
//! directory entries and attributes so that path walks and storms of identical lookups cost
//! (almost) no requests, and it stripes reads and writes over all servers of a file at
//! once.
//!
//! Every call is an `async fn` on [`Client`] and has a blocking twin of the same name on
//! [`BlockingClient`]. There are two levels:
//!
//! * **inode level** (`lookup`, `create_at`, `readdir_at`, …): what a FUSE adapter needs;
//!   one request to one server in the common case; `create_many_at`, `lookup_many` and
//!   `unlink_many_at` send many names of one directory in one batch request;
//! * **path level** (`stat`, `mkdir_all`, `open`, `remove_all`, …): absolute Shoal paths
//!   (`/a/b`, also `shoal://a/b`), resolved from the root through the cache; see
//!   [`pathname`] for the path syntax.
//!
//! Errors are an [`Error`]: an errno to match on plus a context naming the operation and
//! path (`mkdir /a/b: No such file or directory`), and for a server that cannot be reached,
//! which server.
//!
//! ```no_run
//! # async fn demo() -> shoal_client::Result<()> {
//! use shoal_client::{Client, ClientOptions, OpenFlags};
//! let client = Client::from_config("cluster.toml".as_ref(), ClientOptions::default())?;
//! client.mkdir_all("/data/run1", 0o755).await?;
//! let f = client.create("/data/run1/out.bin", 0o644, None).await?;
//! f.write_at(0, b"hello shoal").await?;
//! f.close().await?; // durable, and visible with its size to every later open
//! let f = client.open("shoal://data/run1/out.bin", OpenFlags::read_only()).await?;
//! assert_eq!(&f.read_at(0, 5).await?[..], b"hello");
//! # Ok(()) }
//! ```
//!
//! # Caching
//!
//! Directory entries (including negative ones: "no such name"), attributes and symlink
//! targets are cached for [`ClientOptions::cache_ttl`] (1 s by default; zero turns the
//! cache off). Mutations made through the client update the cache; changes by other
//! clients show once entries expire, except that opening a file always fetches its size
//! afresh (close-to-open consistency). If a server reports a cached directory gone, the
//! operation is retried once with a fresh walk. Clients made with [`Client::with_cred`]
//! share the cache: attributes are keyed by inode and carry no permission decision, but a
//! cached lookup is not re-checked for search permission on its directory until it
//! expires (as the kernel's dentry cache).
//!
//! # Split directories
//!
//! A big directory's entries are split over servers by the hash of their names. The client
//! learns each split directory's partition bitmap from the servers' answers and sends every
//! request about a name to the server of its partition (at most two requests with a stale
//! bitmap); [`Client::dir_bitmap`] is what it learnt, [`Client::fetch_bitmap`] asks. Listings
//! ([`Client::readdir_page`], [`Client::readdir_at`]) come in *listing order* — by the hash
//! of the names, not by name — and list every entry exactly once even while the directory
//! splits; sort them to show them to people.
//!
//! # Durability
//!
//! [`File::close`] (and [`File::fsync`]) make written data and the file size durable on
//! every server involved before returning; metadata operations are durable against a
//! server crash when they return. See "Durability promise" in `docs/architecture.md`.
//!
//! # Map changes
//!
//! A client made with [`Client::from_config`] reloads the config file when a server
//! answers that the client routes with an old map version, and retries the request once.

#![warn(missing_docs)]

mod attr_leases;
mod blocking;
mod cache;
mod caps;
mod changes;
mod checkpoint;
mod client;
mod detach;
mod error;
mod file;
mod file_tuples;
mod find;
mod gather;
mod import;
mod leases;
mod list_io;
mod listing;
mod open_files;
mod options;
mod partitions;
mod path_ops;
pub mod pathname;
mod scrub;
mod stat_ahead;
mod tuples;
mod usage;

pub use blocking::{BlockingChangeWatch, BlockingClient, BlockingFile, BlockingTupleWatch};
pub use changes::{Change, ChangeStart, ChangeWatch, ChangeWatchOptions};
pub use checkpoint::MicroCheckpoint;
pub use client::{may_access, Client, RevokeHook, Revoked, StatFs};
pub use error::{Error, Result};
pub use file::{File, GATHER_MAX, HOLD_FOR, MAX_APPEND, MAX_PIECE, READAHEAD_CHUNK};
pub use file_tuples::{file_tuple, FILE_FIELDS, FILE_TUPLE};
pub use find::{FindOptions, FindStats, Found};
pub use import::{ImportOptions, ImportReport};
pub use list_io::SIEVE_GAP;
pub use options::{ClientOptions, OpenFlags};
pub use path_ops::MAX_SYMLINKS;
pub use shoal_placement::{Bitmap, ClusterMap};
/// The change log's events (docs/changes.md).
pub use shoal_proto::change::{parse_kinds, ChangeKind, ALL_KINDS};
/// Metadata queries' tests and find(1)-style parsing of them (docs/find.md).
pub use shoal_proto::find::{parse_kind, parse_number, AgeTest, Cmp, FindQuery, PermTest, SizeTest, TimeField};
pub use shoal_proto::msg::{
    Attr, Cred, DirEntry, FileKind, Layout, LayoutSpec, PlacementPolicy, RenameFlags, ScrubError, ScrubStatus,
    ServerStatus, SetAttrs, StatFsOut, TimeSet, Timestamp, UrlInfo, REPLICAS_MAX, STRIPE_SIZE_MAX, STRIPE_SIZE_MIN,
};
/// The tuple space's values, tuples and templates (docs/tuples.md).
pub use shoal_proto::tuple::{
    Field, Template, Trigger, Tuple, TupleEvent, TupleEventKind, Value, ValueKind, WATCH_TAKEN, WATCH_WRITTEN,
};
pub use shoal_proto::{Errno, Ino, ServerId, ROOT_INO};
pub use tuples::{TupleWatch, WatchFrom};
pub use usage::{DirUsage, DuReport};

#[cfg(test)]
mod tests {
    use super::*;

    fn is_send<T: Send>(_: &T) {}
    fn is_sync<T: Send + Sync>() {}

    #[test]
    fn handles_and_futures_are_send() {
        is_sync::<Client>();
        is_sync::<File>();
        is_sync::<BlockingClient>();
        is_sync::<BlockingFile>();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let _g = rt.enter();
        let c = Client::new(ClusterMap::local(2, 1, "/tmp".as_ref()), ClientOptions::default());
        is_send(&c.stat("/a"));
        is_send(&c.mkdir_all("/a/b", 0o755));
        is_send(&c.remove_all("/a"));
        is_send(&c.open("/a", OpenFlags::read_only()));
        is_send(&c.rename("/a", "/b"));
        is_send(&c.statfs());
        is_send(&c.status_all());
        is_send(&c.lookup(ROOT_INO, "a"));
    }
}
