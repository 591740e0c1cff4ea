//! The metadata store: directory entries, inodes, extended attributes, intents and markers
//! in one RocksDB database (`<data_dir>/meta`).
//!
//! Keys (big-endian numbers, so that the entries of one directory, the attributes of one
//! inode, … are contiguous and sorted):
//!
//! | key | value |
//! |---|---|
//! | `i` ino | [`InodeRecord`] |
//! | `E` dir-ino listing-key name | [`EntryRecord`]; listing key = `listing_key(name_hash(name))` |
//! | `P` dir-ino index | [`PartitionRecord`]: a partition of a split directory held here |
//! | `x` ino name | extended attribute value (raw bytes) |
//! | `t` op-id | [`IntentRecord`]: an operation spanning servers, for recovery |
//! | `o` op-id | [`AppliedRecord`]: a peer step applied, and what it answered |
//! | `g` ino | [`GcRecord`]: data objects of a deleted file still to delete |
//! | `O` ino | [`OrphanRecord`]: a file with no name left that a client has open |
//! | `U` dir | [`Usage`]: inodes here whose parent is `dir`, and their bytes (`store::usage`) |
//! | `D` dir | nothing: the inode of directory `dir` is held here (`store::usage`) |
//! | `m` "format" / `m` "server" | metadata format version / owning server id (big-endian `u32`) |
//!
//! The records here hold wire types and are what the server works with; what is stored is
//! their own types in `records/` (one format byte, then a Protocol Buffers message),
//! converted on every read and write. docs/formats.md describes every record byte by byte;
//! `upgrade.rs` brings a store of an older format up to date when it is opened.
//!
//! **When a write is safe.** Writes are neither synced nor handed to the OS one by one:
//! RocksDB runs with `manual_wal_flush`, so a commit lands in the memtable and in RocksDB's
//! WAL buffer. [`MetaStore::flush_wal_to_os`] hands everything committed so far to the OS
//! in one `write` (then it survives `kill -9`); the connection layer calls it before it
//! sends any reply, and [`State::peer_as`](crate::state::State) before any request to
//! another server, so nothing is acknowledged or acted on elsewhere before it would survive
//! the death of this process. One flush covers every commit of a burst of pipelined
//! requests (group commit). [`MetaStore::sync_wal`] makes it durable against power loss
//! (every second, and on `Fsync`). Functions here block only briefly (memtable and block
//! cache) except the scans and syncs, which callers run through `State::blocking`.
//!
//! **When the log cannot be written** (a full disk): RocksDB stops taking writes after a
//! failed WAL write and does not resume by itself (measured with RocksDB 7.8: the WAL writer
//! keeps answering "Seen error"), and its memtable still holds the commits whose log records
//! never reached the file, so reads would see them. The store then refuses every write and
//! flush with the errno of the failure (ENOSPC) and asks the server's upkeep for
//! [`MetaStore::reopen`] at once; the reopen replays the WAL exactly as far as it was
//! written (whole records: a torn tail is dropped) and starts a new *generation*. Each
//! commit's RocksDB sequence number is recorded in the committing request's ticket
//! (`store::commits`), and [`MetaStore::lost_in`] tells from the last sequence number after
//! the replay which commits were lost; no reply that depends on a lost commit is sent.

use super::commits;
pub use super::usage::Usage;
use crate::error::{Fail, R};
use crate::locks::Pin;
use crate::store::records::AppliedReply;
pub use crate::store::records::{decode, encode, Record};
use parking_lot::{MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard};
use rocksdb::{BlockBasedOptions, Cache, Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions, DB};
use shoal_proto::msg::{Attr, DirEntry, FileKind, Layout, LayoutSpec, Reply, Timestamp};
use shoal_proto::{Errno, Ino};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Key construction and parsing.
pub mod key {
    use shoal_proto::Ino;

    pub const INODE: u8 = b'i';
    /// Entries in listing order (format 4): `E` dir listing-key name.
    pub const ENTRY: u8 = b'E';
    /// Entries in name order (formats 1 to 3): `e` dir name. Read only by the upgrade.
    pub const ENTRY_V3: u8 = b'e';
    pub const PARTITION: u8 = b'P';
    pub const XATTR: u8 = b'x';
    pub const INTENT: u8 = b't';
    pub const APPLIED: u8 = b'o';
    pub const GC: u8 = b'g';
    pub const ORPHAN: u8 = b'O';
    /// The tuple space (docs/tuples.md): `T` space seq, a tuple stored by the hash of its
    /// first field (`space`) and the event that wrote it (`seq`), so a space's tuples sort
    /// oldest first.
    pub const TUPLE: u8 = b'T';
    /// `N` seq: the tuple log, every tuple written or taken, numbered from 1 without gap.
    pub const TUPLE_EVENT: u8 = b'N';
    /// `C` seq: the change log (docs/changes.md), every namespace and data event committed
    /// here, numbered from 1 without gap in commit order (`MetaStore::commit`).
    pub const CHANGE: u8 = b'C';
    /// `K` uid name: a consumer of the change log (user `uid`'s consumer `name`) and the
    /// last event it acknowledged.
    pub const CONSUMER: u8 = b'K';
    /// `U` dir: per-directory usage (`store::usage`), kept by merges.
    pub const USAGE: u8 = b'U';
    /// `D` dir: the directories whose inodes are held here (no value).
    pub const DIR_INDEX: u8 = b'D';
    pub const FORMAT: &[u8] = b"mformat";
    pub const SERVER: &[u8] = b"mserver";
    /// In a mirror's store (`replica::mirror`): the primary incarnation and the last
    /// position of its replication log applied, written with each applied batch.
    pub const REPLICA: &[u8] = b"mreplica";
    /// In a server's own store, only from a clean stop to the next start: the incarnation
    /// of its replication log and the last position, which every mirror in sync had
    /// applied (`replica::Replication::open` continues from there, so that those mirrors
    /// need no resync). Written and deleted without replication (`MetaStore::write_local`).
    pub const CLEAN_STOP: &[u8] = b"mstopped";

    /// Every kind of record this store holds, one per constant above. The scrub checks a
    /// record by its kind with an exhaustive match, so a kind added here must be taught to
    /// it; a test reads this module's constants and checks each has a kind.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Kind {
        Inode,
        Entry,
        EntryV3,
        Partition,
        Xattr,
        Intent,
        Applied,
        Gc,
        Orphan,
        Tuple,
        TupleEvent,
        Change,
        Consumer,
        Usage,
        DirIndex,
        Format,
        Server,
        Replica,
        CleanStop,
    }

    /// The kind of record key `k` is, by its whole key (the `m…` records) or its tag byte.
    pub fn kind_of(k: &[u8]) -> Option<Kind> {
        Some(match k {
            _ if k == FORMAT => Kind::Format,
            _ if k == SERVER => Kind::Server,
            _ if k == REPLICA => Kind::Replica,
            _ if k == CLEAN_STOP => Kind::CleanStop,
            [INODE, ..] => Kind::Inode,
            [ENTRY, ..] => Kind::Entry,
            [ENTRY_V3, ..] => Kind::EntryV3,
            [PARTITION, ..] => Kind::Partition,
            [XATTR, ..] => Kind::Xattr,
            [INTENT, ..] => Kind::Intent,
            [APPLIED, ..] => Kind::Applied,
            [GC, ..] => Kind::Gc,
            [ORPHAN, ..] => Kind::Orphan,
            [TUPLE, ..] => Kind::Tuple,
            [TUPLE_EVENT, ..] => Kind::TupleEvent,
            [CHANGE, ..] => Kind::Change,
            [CONSUMER, ..] => Kind::Consumer,
            [USAGE, ..] => Kind::Usage,
            [DIR_INDEX, ..] => Kind::DirIndex,
            _ => return None,
        })
    }

    fn tagged(tag: u8, n: u64) -> [u8; 9] {
        let mut k = [0u8; 9];
        k[0] = tag;
        k[1..].copy_from_slice(&n.to_be_bytes());
        k
    }

    fn tagged_name(tag: u8, n: u64, name: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(9 + name.len());
        k.extend_from_slice(&tagged(tag, n));
        k.extend_from_slice(name.as_bytes());
        k
    }

    pub fn inode(ino: Ino) -> [u8; 9] {
        tagged(INODE, ino.0)
    }
    /// Length of an entry key before the name: tag, dir, listing key.
    pub const ENTRY_HEAD: usize = 17;

    /// The listing key of a name: where its entry sorts in its directory (and in a listing),
    /// and which partition of a split directory holds it (`shoal_placement::key_range`).
    pub fn listing_key_of(name: &str) -> u64 {
        shoal_placement::listing_key(shoal_placement::name_hash(name))
    }

    /// `E` dir listing-key name: a directory's entries sort by `(listing key, name)`, the
    /// listing order, so that each partition of a split directory is one key range.
    pub fn entry(dir: Ino, name: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(ENTRY_HEAD + name.len());
        k.extend_from_slice(&entry_at(dir, listing_key_of(name)));
        k.extend_from_slice(name.as_bytes());
        k
    }
    /// All entries of `dir` start with this.
    pub fn entry_prefix(dir: Ino) -> [u8; 9] {
        tagged(ENTRY, dir.0)
    }
    /// Where the entries of `dir` with listing key `lk` (or more) start.
    pub fn entry_at(dir: Ino, lk: u64) -> [u8; ENTRY_HEAD] {
        let mut k = [0u8; ENTRY_HEAD];
        k[..9].copy_from_slice(&tagged(ENTRY, dir.0));
        k[9..].copy_from_slice(&lk.to_be_bytes());
        k
    }
    /// The listing key and name of an `E` key.
    pub fn entry_parts(key: &[u8]) -> Option<(u64, &[u8])> {
        if key.len() <= ENTRY_HEAD || key[0] != ENTRY {
            return None;
        }
        Some((u64::from_be_bytes(key[9..ENTRY_HEAD].try_into().ok()?), &key[ENTRY_HEAD..]))
    }
    /// `P` dir index: partition `index` of split directory `dir`.
    pub fn partition(dir: Ino, index: u32) -> [u8; 13] {
        let mut k = [0u8; 13];
        k[..9].copy_from_slice(&tagged(PARTITION, dir.0));
        k[9..].copy_from_slice(&index.to_be_bytes());
        k
    }
    /// Where the partitions of `dir` held here start (`P` dir).
    pub fn partition_prefix(dir: Ino) -> [u8; 9] {
        tagged(PARTITION, dir.0)
    }
    /// The directory of an `E` key.
    pub fn entry_dir(key: &[u8]) -> Option<Ino> {
        if key.len() <= ENTRY_HEAD || key[0] != ENTRY {
            return None;
        }
        Some(Ino(u64::from_be_bytes(key[1..9].try_into().ok()?)))
    }
    /// The directory and index of a `P` key.
    pub fn partition_parts(key: &[u8]) -> Option<(Ino, u32)> {
        if key.len() != 13 || key[0] != PARTITION {
            return None;
        }
        Some((Ino(u64::from_be_bytes(key[1..9].try_into().ok()?)), u32::from_be_bytes(key[9..13].try_into().ok()?)))
    }
    pub fn xattr(ino: Ino, name: &str) -> Vec<u8> {
        tagged_name(XATTR, ino.0, name)
    }
    pub fn xattr_prefix(ino: Ino) -> [u8; 9] {
        tagged(XATTR, ino.0)
    }
    pub fn intent(op_id: u64) -> [u8; 9] {
        tagged(INTENT, op_id)
    }
    pub fn applied(op_id: u64) -> [u8; 9] {
        tagged(APPLIED, op_id)
    }
    pub fn gc(ino: Ino) -> [u8; 9] {
        tagged(GC, ino.0)
    }
    pub fn tuple(space: u64, seq: u64) -> [u8; 17] {
        let mut k = [0u8; 17];
        k[..9].copy_from_slice(&tagged(TUPLE, space));
        k[9..].copy_from_slice(&seq.to_be_bytes());
        k
    }
    pub fn tuple_prefix(space: u64) -> [u8; 9] {
        tagged(TUPLE, space)
    }
    pub fn tuple_event(seq: u64) -> [u8; 9] {
        tagged(TUPLE_EVENT, seq)
    }
    pub fn orphan(ino: Ino) -> [u8; 9] {
        tagged(ORPHAN, ino.0)
    }
    pub fn usage(dir: Ino) -> [u8; 9] {
        tagged(USAGE, dir.0)
    }
    pub fn dir_index(dir: Ino) -> [u8; 9] {
        tagged(DIR_INDEX, dir.0)
    }
    pub fn change(seq: u64) -> [u8; 9] {
        tagged(CHANGE, seq)
    }
    pub fn consumer(uid: u32, name: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(5 + name.len());
        k.push(CONSUMER);
        k.extend_from_slice(&uid.to_be_bytes());
        k.extend_from_slice(name.as_bytes());
        k
    }

    /// The number in a 9-byte tagged key.
    pub fn number(key: &[u8]) -> Option<u64> {
        if key.len() != 9 {
            return None;
        }
        Some(u64::from_be_bytes(key[1..9].try_into().ok()?))
    }

    /// The name part of an `x` key (or a format-3 `e` key) under `prefix`.
    pub fn name_after<'a>(key: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
        key.strip_prefix(prefix)
    }

    /// The smallest key greater than every key starting with `prefix` (the exclusive upper
    /// bound of a prefix scan). `None` if no such key exists (prefix all 0xff).
    pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
        let mut end = prefix.to_vec();
        while let Some(last) = end.pop() {
            if last < 0xff {
                end.push(last + 1);
                return Some(end);
            }
        }
        None
    }
}

/// An inode: the attributes of [`Attr`] (minus the inode number, which is the key, and the
/// allocation size, which the object files know) plus a symlink's target. Stored as
/// `records::Inode`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeRecord {
    pub kind: FileKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub layout: Option<Layout>,
    pub dir_default: Option<LayoutSpec>,
    pub parent: Option<Ino>,
    pub target: Option<String>,
    /// A directory's partition bitmap (`shoal_placement::Bitmap` words) on its home server:
    /// every partition whose split has been registered. Empty = never split (partition 0
    /// only). Not part of [`Attr`]: clients learn it from `Partitions` replies.
    pub bitmap: Vec<u64>,
    /// Read-mostly (docs/loading.md): set by `Op::SetReadMostly`, inherited by entries
    /// created in a read-mostly directory. Format 3 field 15, absent = false.
    pub read_mostly: bool,
}

impl InodeRecord {
    pub fn to_attr(&self, ino: Ino, blocks_bytes: u64) -> Attr {
        Attr {
            ino,
            kind: self.kind,
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            nlink: self.nlink,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            blocks_bytes,
            layout: self.layout.clone(),
            dir_default: self.dir_default.clone(),
            parent: self.parent,
            read_mostly: self.read_mostly,
        }
    }

    /// The record a peer asks us to hold (`PeerMkdirObject`).
    pub fn from_attr(a: &Attr) -> InodeRecord {
        InodeRecord {
            kind: a.kind,
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            nlink: a.nlink,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            layout: a.layout.clone(),
            dir_default: a.dir_default.clone(),
            parent: a.parent,
            target: None,
            bitmap: Vec::new(),
            read_mostly: a.read_mostly,
        }
    }

    pub fn owner(&self) -> crate::perm::Owner {
        crate::perm::Owner { uid: self.uid, gid: self.gid, perm: self.perm, kind: self.kind }
    }

    /// mtime and ctime to `now` (a directory whose entries changed, a written file).
    pub fn touch(&mut self, now: Timestamp) {
        self.mtime = now;
        self.ctime = now;
    }
}

/// A directory entry, stored under `E` dir listing-key name as `records::Entry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryRecord {
    pub ino: Ino,
    pub kind: FileKind,
}

/// A partition of a split directory held by this server, stored under `P` dir index as
/// `records::Partition`. Partition `index` at `depth` holds the names whose hash has `index`
/// in its low `depth` bits: the entries of listing keys `shoal_placement::key_range(index,
/// depth)`. An unsplit directory has none (its home holds partition 0 at depth 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionRecord {
    pub depth: u32,
    /// Names cannot be added (a removal of the directory is under way).
    pub sealed: bool,
    /// A copy of the directory's attributes, for permission checks and inheritance on a
    /// server that is not the directory's home.
    pub dir: InodeRecord,
}

/// Where a page of a listing starts (see [`MetaStore::list_entries`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStart<'n> {
    /// Strictly after the entry `name` would have: position `(listing_key_of(name), name)`.
    After(&'n str),
    /// At the first entry whose listing key is at least this.
    From(u64),
}

/// An operation that spans servers, written before its remote step and deleted in the batch
/// that commits its local step. See `intents.rs` for what recovery does with each. Stored
/// as `records::IntentOp`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Intent {
    /// A directory object was (maybe) created on `home(ino)`; its entry `dir/name` is not
    /// committed. Rolled back.
    Mkdir { dir: Ino, name: String, ino: Ino },
    /// `dir/name` → `ino` (homed elsewhere) whose link count is being raised. Rolled forward.
    Link { dir: Ino, name: String, ino: Ino, kind: FileKind },
    /// A name of `ino` (homed elsewhere) was removed; its link count must drop. Rolled forward.
    Unlink { ino: Ino },
    /// Directory object `ino` (homed elsewhere) is being removed; then entry `dir/name` goes.
    Rmdir { dir: Ino, name: String, ino: Ino },
    /// Cross-server rename coordinated here: `dst_dir/dst_name` is being set on its home
    /// server, then `src_dir/src_name` goes. Rolled forward.
    Rename { src_dir: Ino, src_name: String, dst_dir: Ino, dst_name: String, ino: Ino, kind: FileKind, noreplace: bool },
    /// A moved directory's parent pointer (homed elsewhere) must become `parent`.
    SetParent { ino: Ino, parent: Ino },
    /// As `Unlink`, for a name removed by client `session`, which has `ino` open: at a link
    /// count of zero the inode becomes that session's orphan. Rolled forward.
    UnlinkKeep { ino: Ino, session: u64 },
    /// Partition `index` of directory `dir`, at `depth`, is splitting (`ops/namespace/split.rs`):
    /// its moving half is frozen until the intent is resolved. Rolled forward.
    Split { dir: Ino, index: u32, depth: u32 },
    /// Split directory `dir`'s attributes changed on its home: the copies on the servers of
    /// its other partitions are to be refreshed. Rolled forward.
    PartitionAttr { dir: Ino },
    /// A shrinking truncate of file `ino` to `size` (`ops/truncate.rs`): its objects beyond
    /// `size` are being cut. `sized`: the inode's size is already `size` (committed at
    /// start-up after a crash, or when a cut failed), so nothing may extend the file until
    /// the cut is done. Rolled forward.
    Truncate { ino: Ino, size: u64, sized: bool },
}

impl Intent {
    /// The entry this intent keeps pinned until it is resolved (see `locks.rs`).
    pub fn pinned_entry(&self) -> Option<(Ino, &str, Pin)> {
        match self {
            Intent::Mkdir { dir, name, .. } | Intent::Link { dir, name, .. } => Some((*dir, name, Pin::Writes)),
            Intent::Rmdir { dir, name, .. } => Some((*dir, name, Pin::Reads)),
            Intent::Rename { src_dir, src_name, .. } => Some((*src_dir, src_name, Pin::Reads)),
            Intent::Unlink { .. }
            | Intent::SetParent { .. }
            | Intent::UnlinkKeep { .. }
            | Intent::Split { .. }
            | Intent::PartitionAttr { .. }
            | Intent::Truncate { .. } => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntentRecord {
    /// Seconds since the epoch when written.
    pub created: i64,
    pub intent: Intent,
    /// The client request (session, request id) whose reply this intent's outcome is, if
    /// the request said so (`commits::Ticket::set_reply_to`): recovery keeps the reply it
    /// finishes with under that name, so that the client's retry (its first reply lost with
    /// a server that died, and the slot failed over) is answered, not applied again.
    pub reply_to: Option<(u64, u64)>,
}

/// A peer step applied at most once: what it answered, for a resent request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedRecord {
    pub created: i64,
    pub reply: AppliedReply,
}

/// Data objects of a deleted file still to be deleted (on this and other servers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcRecord {
    pub created: i64,
    pub layout: Layout,
}

/// A file inode with no name left, kept because client `session` still has it open (the
/// inode record stays under `i` with link count 0; its objects stay). Deleted with the inode
/// at the session's `ReleaseOrphan`, or by the reclaim loop once the session has had no
/// connection to this server for the grace period (see `orphans.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrphanRecord {
    pub session: u64,
    /// Seconds since the epoch when the last name went.
    pub since: i64,
}

/// A tuple of the tuple space (`T` key), and who wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TupleRecord {
    pub tuple: shoal_proto::tuple::Tuple,
    pub uid: u32,
}

/// An event of the tuple log (`N` key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TupleEventRecord {
    pub kind: shoal_proto::tuple::TupleEventKind,
    pub tuple: shoal_proto::tuple::Tuple,
    pub uid: u32,
    pub at: Timestamp,
}

/// Block cache of the metadata store: inodes and entries of a few million files.
const META_BLOCK_CACHE_BYTES: usize = 256 << 20;
/// SST files RocksDB keeps open (its default is all of them): part of the descriptors a
/// server keeps back from client connections (`limits`). 512 tables of 64 MiB are 32 GiB of
/// metadata; beyond that RocksDB reopens tables as needed.
pub const MAX_OPEN_FILES: i32 = 512;

/// An event of the change log (`C` key): the event as watchers get it (its `seq` is the
/// key's), and who may see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeRecord {
    pub event: shoal_proto::change::ChangeEvent,
    /// The owner and mode deciding who may see the event (`ops::changes::visible`): the
    /// directory of an entry event, the inode of an inode event.
    pub guard: crate::perm::Owner,
    /// A rename into another directory: that directory's, when the server knew it.
    pub to_guard: Option<crate::perm::Owner>,
}

/// A consumer of the change log (`K` key): the last event it acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerRecord {
    pub acked: u64,
    /// When it acknowledged last (seconds since the epoch).
    pub since: i64,
}

/// The RocksDB database.
pub struct MetaStore {
    /// `None` only while [`MetaStore::reopen`] could not open it again.
    db: RwLock<Option<DB>>,
    path: PathBuf,
    opts: Options,
    wopts: WriteOptions,
    /// RocksDB sequence number of the last commit, and the highest one known to have reached
    /// the OS: a flush is only needed when the second lags the first.
    committed: AtomicU64,
    flushed: AtomicU64,
    /// Held by every call that touches the WAL (commit, flush, sync) and by `reopen`. Commits
    /// one at a time, so that the sequence number read after a commit is its own; one
    /// flusher at a time, so the others find their commits covered when they get it. And no
    /// call reaches RocksDB's WAL writer once one has failed (`failed` is checked under it):
    /// its writer asserts (aborting the process in Debian's build) when written, flushed or
    /// synced again after an error, and RocksDB itself lets a concurrent commit or sync
    /// through between a failed flush and its marking the database stopped (seen on a full
    /// tmpfs: "Assertion `sync_without_flush_called_' failed").
    wal_lock: Mutex<()>,
    /// 0, or the errno of a failed write or WAL flush: the store takes no writes until
    /// reopened (see the module comment). Calling RocksDB's write or flush again on a WAL
    /// that failed would only repeat the failure.
    failed: AtomicI32,
    /// Errno and text of the last failure (kept after the reopen, for the replies it costs).
    last_failure: Mutex<(Errno, String)>,
    /// Number of reopens so far; `recovered[g]` is the last sequence number the reopen that
    /// ended generation `g` found in the log: commits of `g` beyond it were lost.
    generation: AtomicU64,
    recovered: Mutex<Vec<u64>>,
    /// Tells waiters that the generation changed (the store reopened).
    reopened: tokio::sync::watch::Sender<u64>,
    /// Wakes the server's upkeep to reopen the store at once after a failure.
    reopen_wanted: tokio::sync::Notify,
    /// The server's directory leases: every commit that changes a directory's entries
    /// revokes them first (`Txn::commit`, the one hook of `leases.rs`). Unset in tools and
    /// store tests, which hold no leases.
    leases: std::sync::OnceLock<std::sync::Arc<crate::leases::Leases>>,
    /// The primary's replication log (`replica::log`): every committed batch is appended
    /// to it, under `wal_lock`, so mirrors apply batches in commit order. Unset without
    /// mirrors, in tools and in a mirror's own store.
    repl: std::sync::OnceLock<std::sync::Arc<crate::replica::log::ReplLog>>,
    /// The number of the last change event committed (`None`: not known, read from the
    /// last `C` key at the next commit with events: after opening, a reopen, or a batch
    /// applied from a primary). Changed under `wal_lock` only, so numbers follow commit
    /// order and have no gap.
    last_change: Mutex<Option<u64>>,
    /// The number of the last change event committed, for watchers waiting for one.
    changed: tokio::sync::watch::Sender<u64>,
}

impl MetaStore {
    /// An integer property of RocksDB (`rocksdb.estimate-num-keys`, ...), for metrics;
    /// `None` when unknown or while the store is closed.
    pub fn property(&self, name: &str) -> Option<u64> {
        self.db.read().as_ref().and_then(|db| db.property_int_value(name).ok().flatten())
    }

    /// Open (creating if missing) the database at `path`.
    pub fn open(path: &Path) -> Result<MetaStore, String> {
        let opts = Self::options();
        let db = Self::open_db(&opts, path)?;
        let mut wopts = WriteOptions::default();
        // Power-loss durability comes from sync_wal (every second and on fsync).
        wopts.set_sync(false);
        let seq = db.latest_sequence_number();
        Ok(MetaStore {
            db: RwLock::new(Some(db)),
            path: path.to_path_buf(),
            opts,
            wopts,
            committed: AtomicU64::new(seq),
            flushed: AtomicU64::new(seq),
            wal_lock: Mutex::new(()),
            failed: AtomicI32::new(0),
            last_failure: Mutex::new((Errno::EIO, String::new())),
            generation: AtomicU64::new(0),
            recovered: Mutex::new(Vec::new()),
            reopened: tokio::sync::watch::channel(0).0,
            reopen_wanted: tokio::sync::Notify::new(),
            leases: std::sync::OnceLock::new(),
            repl: std::sync::OnceLock::new(),
            last_change: Mutex::new(None),
            changed: tokio::sync::watch::channel(0).0,
        })
    }

    /// Hang the server's leases on this store's commits (once, at start).
    pub fn set_leases(&self, leases: std::sync::Arc<crate::leases::Leases>) {
        let _ = self.leases.set(leases);
    }

    /// Ship every commit from now on to the mirrors through `log` (once, at start).
    pub fn set_replication(&self, log: std::sync::Arc<crate::replica::log::ReplLog>) {
        let _ = self.repl.set(log);
    }

    /// The server's directory leases (`None` in tools and store tests).
    pub fn leases(&self) -> Option<&std::sync::Arc<crate::leases::Leases>> {
        self.leases.get()
    }

    fn open_db(opts: &Options, path: &Path) -> Result<DB, String> {
        DB::open(opts, path).map_err(|e| format!("cannot open metadata store {}: {e}", path.display()))
    }

    fn options() -> Options {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_keep_log_file_num(4);
        // RocksDB's info log (`meta/LOG`) keeps only the start-up header. Its writer aborts the
        // process (an assertion in the library's build) on the first message written after a
        // failed write, and on a full disk the message reporting the failure is that message.
        // Errors reach our own log through the statuses RocksDB returns.
        opts.set_log_level(rocksdb::LogLevel::Header);
        // A MANIFEST is preallocated in blocks of this size (4 MiB by default): opening the
        // store on a nearly full disk would spend all the room on it and then fail to write
        // the OPTIONS file (seen on a full 64 MiB tmpfs).
        opts.set_manifest_preallocation_size(64 << 10);
        opts.set_max_background_jobs(2);
        opts.set_bytes_per_sync(1 << 20);
        opts.set_max_open_files(MAX_OPEN_FILES);
        // Group commit: see the module comment and flush_wal_to_os.
        opts.set_manual_wal_flush(true);
        // Most lookups on the create path miss (a new name, a fresh inode number): bloom
        // filters answer those without walking the memtable's skip list or reading SST
        // blocks. Measured with perf under `shoal bench md`: memtable Gets were a third of
        // the store's time.
        opts.set_memtable_whole_key_filtering(true);
        opts.set_memtable_prefix_bloom_ratio(0.05);
        let mut table = BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        table.set_whole_key_filtering(true);
        table.set_block_cache(&Cache::new_lru_cache(META_BLOCK_CACHE_BYTES));
        opts.set_block_based_table_factory(&table);
        opts.set_merge_operator_associative(super::usage::MERGE_NAME, super::usage::merge);
        opts
    }

    /// The open database (reads and writes share it; only `reopen` replaces it). Taken
    /// recursively so that a scan's callback may read again without waiting for a reopen
    /// queued behind the scan.
    fn db(&self) -> R<MappedRwLockReadGuard<'_, DB>> {
        RwLockReadGuard::try_map(self.db.read_recursive(), |d| d.as_ref()).map_err(|_| {
            commits::refused();
            Fail::new(Errno::EIO, format!("metadata store {} is closed after a failed write", self.path.display()))
        })
    }

    /// The failure that stopped writes, if any.
    pub fn failure(&self) -> Option<Errno> {
        match self.failed.load(Ordering::Acquire) {
            0 => None,
            e => Some(Errno(e)),
        }
    }

    /// Errno and text of the last failure (also after the store reopened).
    pub fn last_failure(&self) -> (Errno, String) {
        self.last_failure.lock().clone()
    }

    pub fn failure_text(&self) -> String {
        self.last_failure.lock().1.clone()
    }

    fn check_writable(&self) -> R<()> {
        match self.failure() {
            None => Ok(()),
            Some(e) => {
                commits::refused();
                Err(Fail::new(
                    e,
                    format!(
                        "metadata store takes no writes since its log could not be written ({e}); it resumes when space is free"
                    ),
                ))
            }
        }
    }

    /// Remember that a write or flush failed: no more writes or flushes until `reopen`,
    /// which the server's upkeep is asked for at once.
    fn note_failure(&self, f: &Fail) {
        if self.failed.compare_exchange(0, f.errno.0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            *self.last_failure.lock() = (f.errno, f.to_string());
            tracing::error!("metadata store stops taking writes: {f}");
            self.reopen_wanted.notify_one();
        }
    }

    /// Completes when a failure asks for a reopen (see `note_failure`).
    pub async fn reopen_wanted(&self) {
        self.reopen_wanted.notified().await
    }

    /// Number of reopens so far: commits of an older generation have a known fate.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the commit with last sequence number `seq` of generation `gen` was lost:
    /// `None` while `gen` is the current generation (not decided yet).
    pub fn lost_in(&self, gen: u64, seq: u64) -> Option<bool> {
        self.recovered.lock().get(gen as usize).map(|&r| seq > r)
    }

    /// Wait until the store takes writes (false if it does not by `deadline`).
    pub async fn wait_healthy(&self, deadline: tokio::time::Instant) -> bool {
        let mut rx = self.reopened.subscribe();
        tokio::time::timeout_at(deadline, async {
            while self.failure().is_some() {
                self.reopen_wanted.notify_one();
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
        .is_ok()
            && self.failure().is_none()
    }

    /// After a failed write: close the database and open it again, which starts a new WAL
    /// after replaying what reached the OS (whole records; commits beyond were never
    /// acknowledged and are gone) and a new generation. Needs a little free space (new WAL,
    /// MANIFEST, OPTIONS files). A no-op while healthy. Blocking.
    pub fn reopen(&self) -> R<()> {
        if self.failure().is_none() {
            return Ok(());
        }
        let _g = self.wal_lock.lock();
        let mut db = self.db.write();
        // Closing first: RocksDB's LOCK file allows one open database per directory.
        *db = None;
        match Self::open_db(&self.opts, &self.path) {
            Ok(d) => {
                // Everything in the new database is in its log or its tables.
                let seq = d.latest_sequence_number();
                *db = Some(d);
                self.recovered.lock().push(seq);
                self.committed.store(seq, Ordering::Release);
                self.flushed.store(seq, Ordering::Release);
                *self.last_change.lock() = None;
                let gen = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                self.failed.store(0, Ordering::Release);
                self.reopened.send_replace(gen);
                tracing::info!(
                    "metadata store {} reopened at sequence {seq}; it takes writes again",
                    self.path.display()
                );
                Ok(())
            }
            Err(e) => Err(Fail::new(Errno::EIO, e)),
        }
    }

    /// Apply a batch a primary committed (its `data()` bytes) and, in the same batch, the
    /// replication position it brings this mirror to. Not shipped further.
    pub fn apply_replicated(&self, batch: &[u8], position: &[u8]) -> R<()> {
        let mut b = WriteBatch::from_data(batch);
        b.put(key::REPLICA, position);
        let _w = self.wal_lock.lock();
        *self.last_change.lock() = None;
        self.commit_locked(b, Vec::new(), true)
    }

    pub fn get_raw(&self, key: &[u8]) -> R<Option<Vec<u8>>> {
        Ok(self.db()?.get(key)?)
    }

    pub fn put_raw(&self, key: &[u8], value: &[u8]) -> R<()> {
        let mut b = WriteBatch::default();
        b.put(key, value);
        self.write(b)
    }

    fn get_decoded<T: Record>(&self, key: &[u8], what: &dyn std::fmt::Display) -> R<Option<T>> {
        match self.db()?.get_pinned(key)? {
            Some(v) => Ok(Some(decode(what, &v)?)),
            None => Ok(None),
        }
    }

    pub fn get_inode(&self, ino: Ino) -> R<Option<InodeRecord>> {
        self.get_decoded(&key::inode(ino), &format_args!("inode {ino}"))
    }

    /// The usage of `dir` held here (zero when there is none).
    pub fn get_usage(&self, dir: Ino) -> R<Usage> {
        Ok(self.get_decoded(&key::usage(dir), &format_args!("usage of {dir}"))?.unwrap_or_default())
    }

    pub fn get_entry(&self, dir: Ino, name: &str) -> R<Option<EntryRecord>> {
        self.get_decoded(&key::entry(dir, name), &format_args!("entry {name:?} of {dir}"))
    }

    pub fn get_applied(&self, op_id: u64) -> R<Option<AppliedRecord>> {
        self.get_decoded(&key::applied(op_id), &format_args!("applied marker {op_id:#x}"))
    }

    pub fn get_intent(&self, op_id: u64) -> R<Option<IntentRecord>> {
        self.get_decoded(&key::intent(op_id), &format_args!("intent {op_id:#x}"))
    }

    pub fn get_xattr(&self, ino: Ino, name: &str) -> R<Option<Vec<u8>>> {
        Ok(self.db()?.get(key::xattr(ino, name))?)
    }

    /// Iterate keys starting with `prefix`, from `start` (inclusive; defaults to the prefix).
    /// The callback returns `false` to stop.
    pub fn scan(&self, prefix: &[u8], start: Option<&[u8]>, mut f: impl FnMut(&[u8], &[u8]) -> R<bool>) -> R<()> {
        let mut ro = ReadOptions::default();
        if let Some(end) = key::prefix_end(prefix) {
            ro.set_iterate_upper_bound(end);
        }
        let from = start.unwrap_or(prefix);
        let db = self.db()?;
        for item in db.iterator_opt(IteratorMode::From(from, Direction::Forward), ro) {
            let (k, v) = item?;
            if !k.starts_with(prefix) {
                break;
            }
            if !f(&k, &v)? {
                break;
            }
        }
        Ok(())
    }

    /// The last key starting with `prefix`, if any.
    pub fn last_under(&self, prefix: &[u8]) -> R<Option<Vec<u8>>> {
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(prefix.to_vec());
        if let Some(end) = key::prefix_end(prefix) {
            ro.set_iterate_upper_bound(end);
        }
        let db = self.db()?;
        let last = match db.iterator_opt(IteratorMode::End, ro).next() {
            Some(item) => {
                let (k, _) = item?;
                k.starts_with(prefix).then(|| k.to_vec())
            }
            None => None,
        };
        Ok(last)
    }

    /// Does directory `dir` have any entry?
    pub fn has_entries(&self, dir: Ino) -> R<bool> {
        let mut any = false;
        self.scan(&key::entry_prefix(dir), None, |_, _| {
            any = true;
            Ok(false)
        })?;
        Ok(any)
    }

    /// Iterate keys from `from` (inclusive) up to `until` (exclusive; `None`: to the end).
    /// The callback returns `false` to stop.
    fn scan_between(&self, from: &[u8], until: Option<Vec<u8>>, mut f: impl FnMut(&[u8], &[u8]) -> R<bool>) -> R<()> {
        let mut ro = ReadOptions::default();
        if let Some(end) = until {
            if from >= end.as_slice() {
                return Ok(());
            }
            ro.set_iterate_upper_bound(end);
        }
        let db = self.db()?;
        for item in db.iterator_opt(IteratorMode::From(from, Direction::Forward), ro) {
            let (k, v) = item?;
            if !f(&k, &v)? {
                break;
            }
        }
        Ok(())
    }

    /// The keys of `dir`'s entries whose listing keys lie in `range` (inclusive) from
    /// `start` on: the first key to read and the exclusive end.
    fn entry_bounds(dir: Ino, start: ListStart<'_>, range: (u64, u64)) -> (Vec<u8>, Option<Vec<u8>>) {
        let (lo, hi) = range;
        let low = key::entry_at(dir, lo).to_vec();
        let from = match start {
            ListStart::After(name) => {
                // The first key after `name`'s: its key followed by a zero byte.
                let mut k = key::entry(dir, name);
                k.push(0);
                k.max(low)
            }
            ListStart::From(k) => key::entry_at(dir, k.max(lo)).to_vec(),
        };
        let until = match hi.checked_add(1) {
            Some(next) => Some(key::entry_at(dir, next).to_vec()),
            None => key::prefix_end(&key::entry_prefix(dir)),
        };
        (from, until)
    }

    /// An `E` key and its value as a listing entry.
    fn dir_entry(dir: Ino, k: &[u8], v: &[u8]) -> R<DirEntry> {
        let (_, name) = key::entry_parts(k).ok_or_else(|| Fail::corrupt(format!("entry key of {dir} is too short")))?;
        let name = std::str::from_utf8(name)
            .map_err(|_| Fail::corrupt(format!("entry name in directory {dir} is not UTF-8")))?
            .to_string();
        let e: EntryRecord = decode(&format_args!("entry {name:?} of {dir}"), v)?;
        Ok(DirEntry { name, ino: e.ino, kind: e.kind })
    }

    /// Up to `limit` entries of `dir` in listing order (by listing key, then name) whose
    /// listing keys lie in `range` (inclusive; `(0, u64::MAX)` = all), from `start` on; and
    /// whether more entries follow inside `range`. A partition `(i, d)` of a split directory
    /// is `range = shoal_placement::key_range(i, d)`.
    pub fn list_entries(
        &self,
        dir: Ino,
        start: ListStart<'_>,
        range: (u64, u64),
        limit: usize,
    ) -> R<(Vec<DirEntry>, bool)> {
        let (from, until) = Self::entry_bounds(dir, start, range);
        let mut out = Vec::new();
        let mut more = false;
        self.scan_between(&from, until, |k, v| {
            if out.len() >= limit {
                more = true;
                return Ok(false);
            }
            out.push(Self::dir_entry(dir, k, v)?);
            Ok(true)
        })?;
        Ok((out, more))
    }

    /// How many entries of `dir` have listing keys in `range`, counting no further than
    /// `max` (the answer is then `max`): what a split decision needs, without a full scan.
    pub fn count_entries(&self, dir: Ino, range: (u64, u64), max: u64) -> R<u64> {
        if max == 0 {
            return Ok(0);
        }
        let (from, until) = Self::entry_bounds(dir, ListStart::From(range.0), range);
        let mut n = 0u64;
        self.scan_between(&from, until, |_, _| {
            n += 1;
            Ok(n < max)
        })?;
        Ok(n)
    }

    /// Every entry of `dir` with a listing key in `range`, in listing order (the entries a
    /// split moves). Blocking, O(entries).
    pub fn entries_in(&self, dir: Ino, range: (u64, u64)) -> R<Vec<DirEntry>> {
        let (from, until) = Self::entry_bounds(dir, ListStart::From(range.0), range);
        let mut out = Vec::new();
        self.scan_between(&from, until, |k, v| {
            out.push(Self::dir_entry(dir, k, v)?);
            Ok(true)
        })?;
        Ok(out)
    }

    pub fn get_partition(&self, dir: Ino, index: u32) -> R<Option<PartitionRecord>> {
        self.get_decoded(&key::partition(dir, index), &format_args!("partition {index} of {dir}"))
    }

    /// Every partition record on this server, by directory then index (for loading at
    /// start-up).
    pub fn partitions(&self) -> R<Vec<(Ino, u32, PartitionRecord)>> {
        let mut out = Vec::new();
        self.scan(&[key::PARTITION], None, |k, v| {
            let (dir, index) =
                key::partition_parts(k).ok_or_else(|| Fail::corrupt("partition key of the wrong length"))?;
            out.push((dir, index, decode(&format_args!("partition {index} of {dir}"), v)?));
            Ok(true)
        })?;
        Ok(out)
    }

    /// Names of `ino`'s extended attributes.
    pub fn list_xattrs(&self, ino: Ino) -> R<Vec<String>> {
        let prefix = key::xattr_prefix(ino);
        let mut out = Vec::new();
        self.scan(&prefix, None, |k, _| {
            let name = key::name_after(k, &prefix).unwrap_or_default();
            match std::str::from_utf8(name) {
                Ok(n) => out.push(n.to_string()),
                Err(_) => return Err(Fail::corrupt(format!("xattr name of {ino} is not UTF-8"))),
            }
            Ok(true)
        })?;
        Ok(out)
    }

    /// All intents, oldest op first (by key order).
    pub fn intents(&self) -> R<Vec<(u64, IntentRecord)>> {
        let mut out = Vec::new();
        self.scan(&[key::INTENT], None, |k, v| {
            let id = key::number(k).ok_or_else(|| Fail::corrupt("intent key of the wrong length"))?;
            out.push((id, decode(&format_args!("intent {id:#x}"), v)?));
            Ok(true)
        })?;
        Ok(out)
    }

    /// All pending object deletions.
    pub fn gc_records(&self) -> R<Vec<(Ino, GcRecord)>> {
        let mut out = Vec::new();
        self.scan(&[key::GC], None, |k, v| {
            let ino = Ino(key::number(k).ok_or_else(|| Fail::corrupt("gc key of the wrong length"))?);
            out.push((ino, decode(&format_args!("gc record {ino}"), v)?));
            Ok(true)
        })?;
        Ok(out)
    }

    pub fn get_orphan(&self, ino: Ino) -> R<Option<OrphanRecord>> {
        self.get_decoded(&key::orphan(ino), &format_args!("orphan record {ino}"))
    }

    /// All orphans (open files without a name).
    pub fn orphans(&self) -> R<Vec<(Ino, OrphanRecord)>> {
        let mut out = Vec::new();
        self.scan(&[key::ORPHAN], None, |k, v| {
            let ino = Ino(key::number(k).ok_or_else(|| Fail::corrupt("orphan key of the wrong length"))?);
            out.push((ino, decode(&format_args!("orphan record {ino}"), v)?));
            Ok(true)
        })?;
        Ok(out)
    }

    /// Number of keys with tag `tag` (an O(n) scan: for status reports).
    pub fn count(&self, tag: u8) -> R<u64> {
        let mut n = 0u64;
        self.scan(&[tag], None, |_, _| {
            n += 1;
            Ok(true)
        })?;
        Ok(n)
    }

    /// Delete "applied" markers older than `max_age_secs`; returns how many went. A resent
    /// peer step older than that is not expected (the sender's intent is long resolved).
    pub fn prune_applied(&self, now_secs: i64, max_age_secs: i64) -> R<usize> {
        let mut batch = WriteBatch::default();
        let mut n = 0;
        self.scan(&[key::APPLIED], None, |k, v| {
            // An undecodable marker is useless: drop it too.
            let old = decode::<AppliedRecord>(&"applied marker", v).map(|a| a.created < now_secs - max_age_secs);
            if old.unwrap_or(true) {
                batch.delete(k);
                n += 1;
            }
            Ok(true)
        })?;
        if n > 0 {
            self.write(batch)?;
        }
        Ok(n)
    }

    pub fn write(&self, batch: WriteBatch) -> R<()> {
        self.commit(batch, Vec::new(), true)
    }

    /// Write `batch` with the change events `changes`, numbered next in this server's log.
    pub fn write_changes(&self, batch: WriteBatch, changes: Vec<ChangeRecord>) -> R<()> {
        self.commit(batch, changes, true)
    }

    /// The number of the last change event committed here (0: none).
    pub fn last_change(&self) -> R<u64> {
        let _w = self.wal_lock.lock();
        self.last_change_locked()
    }

    /// Subscribe to the number of the last change event: changes when one is committed.
    pub fn change_signal(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// [`MetaStore::last_change`], under `wal_lock`.
    fn last_change_locked(&self) -> R<u64> {
        let mut last = self.last_change.lock();
        if let Some(n) = *last {
            return Ok(n);
        }
        let n = self.last_under(&[key::CHANGE])?.and_then(|k| key::number(&k)).unwrap_or(0);
        *last = Some(n);
        Ok(n)
    }

    /// Put or (`None`) delete `key` on this server only, never shipped to mirrors: records
    /// about this copy itself (`key::CLEAN_STOP`).
    pub fn put_local(&self, key: &[u8], value: Option<&[u8]>) -> R<()> {
        let mut b = WriteBatch::default();
        match value {
            Some(v) => b.put(key, v),
            None => b.delete(key),
        }
        self.commit(b, Vec::new(), false)
    }

    fn commit(&self, batch: WriteBatch, changes: Vec<ChangeRecord>, replicate: bool) -> R<()> {
        let _w = self.wal_lock.lock();
        self.commit_locked(batch, changes, replicate)
    }

    /// Write `batch` and its change events; the caller holds `wal_lock`.
    fn commit_locked(&self, mut batch: WriteBatch, changes: Vec<ChangeRecord>, replicate: bool) -> R<()> {
        self.check_writable()?;
        // The events are numbered here, under `wal_lock`, so that a watcher that has read
        // event n has seen every event committed before it (the numbers follow commit order).
        let mut last_event = None;
        if !changes.is_empty() {
            let first = self.last_change_locked()? + 1;
            for (i, c) in changes.iter().enumerate() {
                batch.put(key::change(first + i as u64), encode(c));
            }
            let last = first + changes.len() as u64 - 1;
            crate::ops::changes::prune(self, &mut batch, first, last)?;
            last_event = Some(last);
        }
        let db = self.db()?;
        // The batch as committed, for the mirrors (a copy: RocksDB takes the batch).
        let shipped = self.repl.get().filter(|_| replicate).map(|_| bytes::Bytes::copy_from_slice(batch.data()));
        if let Err(e) = db.write_opt(batch, &self.wopts) {
            let f = Fail::from(e);
            self.note_failure(&f);
            *self.last_change.lock() = None;
            return Err(f);
        }
        if let Some(last) = last_event {
            *self.last_change.lock() = Some(last);
            self.changed.send_replace(last);
        }
        // Ours: commits are serialised by `wal_lock`. The generation cannot change while
        // `db` is held (a reopen takes the lock exclusively).
        let seq = db.latest_sequence_number();
        self.committed.fetch_max(seq, Ordering::AcqRel);
        commits::record(self, self.generation(), seq);
        if let (Some(log), Some(b)) = (self.repl.get(), shipped) {
            log.append(shoal_proto::msg::ReplChange::Meta { len: b.len() as u32 }, b);
        }
        Ok(())
    }

    /// Hand every commit made so far to the OS (one `write` of the WAL buffer, no sync):
    /// from then on it survives `kill -9` of this process. Cheap when nothing is pending.
    pub fn flush_wal_to_os(&self) -> R<()> {
        let target = self.committed.load(Ordering::Acquire);
        if self.flushed.load(Ordering::Acquire) >= target && self.failure().is_none() {
            return Ok(());
        }
        let _g = self.wal_lock.lock();
        self.check_writable()?;
        if self.flushed.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        self.flush(false)
    }

    /// Make every write so far durable against power loss. Commits and flushes wait for the
    /// disk sync (once a second): see `wal_lock` for why nothing may run beside it.
    pub fn sync_wal(&self) -> R<()> {
        let _g = self.wal_lock.lock();
        self.check_writable()?;
        self.flush(true)
    }

    /// Flush (and sync) the WAL buffer. Under `wal_lock`, on a store that takes writes.
    fn flush(&self, sync: bool) -> R<()> {
        // Everything counted here finished its write before the flush starts.
        let upto = self.committed.load(Ordering::Acquire);
        if let Err(e) = self.db()?.flush_wal(sync) {
            let f = Fail::from(e);
            self.note_failure(&f);
            return Err(f);
        }
        self.flushed.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// A read-modify-write transaction over this store.
    pub fn txn(&self) -> Txn<'_> {
        Txn {
            meta: self,
            batch: WriteBatch::default(),
            inodes: HashMap::new(),
            originals: HashMap::new(),
            entries: HashMap::new(),
            partitions: HashMap::new(),
            changed_dirs: Vec::new(),
            reshaping: false,
            changes: Vec::new(),
        }
    }
}

/// A set of changes committed as one atomic RocksDB batch. Inodes and entries read through
/// the transaction are cached and changed in place, so a handler touching the same record
/// twice (a rename within one directory) sees its own changes; the batch is written by
/// [`Txn::commit`]. Callers hold the stripe locks of every inode they change.
pub struct Txn<'a> {
    pub meta: &'a MetaStore,
    batch: WriteBatch,
    /// Loaded inodes: `Some(rec)` present, `None` absent; the bool marks changed ones.
    inodes: HashMap<Ino, (Option<InodeRecord>, bool)>,
    /// What each changed inode was before this transaction changed it, kept when it is
    /// first changed: the commit counts the difference into the usage of its parents.
    originals: HashMap<Ino, Option<InodeRecord>>,
    entries: HashMap<(Ino, String), Option<EntryRecord>>,
    partitions: HashMap<(Ino, u32), Option<PartitionRecord>>,
    /// Directories whose entries this batch changes: their leases are revoked at commit.
    changed_dirs: Vec<Ino>,
    /// The batch moves entries between servers (a split): see [`Txn::reshaping`].
    reshaping: bool,
    /// Change events to log with the batch (`ops::changes`).
    changes: Vec<ChangeRecord>,
}

impl<'a> Txn<'a> {
    fn load(&mut self, ino: Ino) -> R<&mut (Option<InodeRecord>, bool)> {
        if !self.inodes.contains_key(&ino) {
            let rec = self.meta.get_inode(ino)?;
            self.inodes.insert(ino, (rec, false));
        }
        Ok(self.inodes.get_mut(&ino).expect("just inserted"))
    }

    /// The inode, if it exists.
    pub fn inode(&mut self, ino: Ino) -> R<Option<&InodeRecord>> {
        Ok(self.load(ino)?.0.as_ref())
    }

    /// The inode, to change (ENOENT if absent).
    pub fn inode_mut(&mut self, ino: Ino) -> R<&mut InodeRecord> {
        self.keep_original(ino)?;
        let slot = self.load(ino)?;
        match slot.0.as_mut() {
            Some(rec) => {
                slot.1 = true;
                Ok(rec)
            }
            None => Err(Fail::new(Errno::ENOENT, format!("inode {ino} does not exist"))),
        }
    }

    /// Remember what `ino` is before this transaction first changes it.
    fn keep_original(&mut self, ino: Ino) -> R<()> {
        if !self.originals.contains_key(&ino) {
            let rec = self.load(ino)?.0.clone();
            self.originals.insert(ino, rec);
        }
        Ok(())
    }

    /// A directory that must exist (ENOENT) and be one (ENOTDIR).
    pub fn dir(&mut self, ino: Ino) -> R<&InodeRecord> {
        match self.inode(ino)? {
            None => Err(Fail::new(Errno::ENOENT, format!("directory {ino} does not exist"))),
            Some(r) if r.kind != FileKind::Dir => Err(Fail::new(Errno::ENOTDIR, format!("{ino} is not a directory"))),
            Some(r) => Ok(r),
        }
    }

    /// Write inode `ino` whole (a new one, or a replacement). Reads what it was, for the
    /// usage of its parents (a bloom filter answers for a new inode number).
    pub fn put_inode(&mut self, ino: Ino, rec: InodeRecord) -> R<()> {
        self.keep_original(ino)?;
        self.inodes.insert(ino, (Some(rec), true));
        Ok(())
    }

    /// Delete an inode and its extended attributes; returns what it was.
    pub fn remove_inode(&mut self, ino: Ino) -> R<Option<InodeRecord>> {
        self.keep_original(ino)?;
        let old = self.load(ino)?.0.take();
        self.inodes.insert(ino, (None, true));
        let mut keys = Vec::new();
        self.meta.scan(&key::xattr_prefix(ino), None, |k, _| {
            keys.push(k.to_vec());
            Ok(true)
        })?;
        for k in keys {
            self.batch.delete(k);
        }
        Ok(old)
    }

    pub fn entry(&mut self, dir: Ino, name: &str) -> R<Option<EntryRecord>> {
        if let Some(e) = self.entries.get(&(dir, name.to_string())) {
            return Ok(*e);
        }
        let e = self.meta.get_entry(dir, name)?;
        self.entries.insert((dir, name.to_string()), e);
        Ok(e)
    }

    /// This batch moves entries between servers without changing the directory (a split):
    /// leases are revoked, but granted again at once (`Leases::reshaping`).
    pub fn reshaping(&mut self) {
        self.reshaping = true;
    }

    /// Note that `dir`'s entries change (see `changed_dirs`).
    fn entries_change(&mut self, dir: Ino) {
        if !self.changed_dirs.contains(&dir) {
            self.changed_dirs.push(dir);
        }
    }

    pub fn put_entry(&mut self, dir: Ino, name: &str, e: EntryRecord) {
        self.entries_change(dir);
        self.batch.put(key::entry(dir, name), encode(&e));
        self.entries.insert((dir, name.to_string()), Some(e));
    }

    pub fn delete_entry(&mut self, dir: Ino, name: &str) {
        self.entries_change(dir);
        self.batch.delete(key::entry(dir, name));
        self.entries.insert((dir, name.to_string()), None);
    }

    /// Partition `index` of split directory `dir`, if this server holds it (as changed by
    /// this transaction so far).
    pub fn partition(&mut self, dir: Ino, index: u32) -> R<Option<PartitionRecord>> {
        if let Some(p) = self.partitions.get(&(dir, index)) {
            return Ok(p.clone());
        }
        let p = self.meta.get_partition(dir, index)?;
        self.partitions.insert((dir, index), p.clone());
        Ok(p)
    }

    pub fn put_partition(&mut self, dir: Ino, index: u32, rec: &PartitionRecord) {
        self.batch.put(key::partition(dir, index), encode(rec));
        self.partitions.insert((dir, index), Some(rec.clone()));
    }

    pub fn delete_partition(&mut self, dir: Ino, index: u32) {
        self.batch.delete(key::partition(dir, index));
        self.partitions.insert((dir, index), None);
    }

    pub fn put_xattr(&mut self, ino: Ino, name: &str, value: &[u8]) {
        self.batch.put(key::xattr(ino, name), value);
    }

    pub fn delete_xattr(&mut self, ino: Ino, name: &str) {
        self.batch.delete(key::xattr(ino, name));
    }

    pub fn put_intent(&mut self, op_id: u64, intent: Intent, now_secs: i64) {
        let reply_to = super::commits::current().and_then(|t| t.state().reply_to());
        self.batch.put(key::intent(op_id), encode(&IntentRecord { created: now_secs, intent, reply_to }));
    }

    pub fn delete_intent(&mut self, op_id: u64) {
        self.batch.delete(key::intent(op_id));
    }

    /// Remember what peer step `op_id` answered. Only the replies of peer steps can be kept
    /// (`AppliedReply`); anything else is a bug, refused with EIO rather than stored.
    pub fn put_applied(&mut self, op_id: u64, reply: &Reply, now_secs: i64) -> R<()> {
        let reply = AppliedReply::from_wire(reply)
            .ok_or_else(|| Fail::new(Errno::EIO, format!("reply {reply:?} of peer step {op_id:#x} cannot be kept")))?;
        self.batch.put(key::applied(op_id), encode(&AppliedRecord { created: now_secs, reply }));
        Ok(())
    }

    pub fn put_gc(&mut self, ino: Ino, rec: &GcRecord) {
        self.batch.put(key::gc(ino), encode(rec));
    }

    pub fn delete_gc(&mut self, ino: Ino) {
        self.batch.delete(key::gc(ino));
    }

    pub fn put_orphan(&mut self, ino: Ino, rec: &OrphanRecord) {
        self.batch.put(key::orphan(ino), encode(rec));
    }

    /// Log change event `c` with this batch.
    pub fn log_change(&mut self, c: ChangeRecord) {
        self.changes.push(c);
    }

    pub fn delete_orphan(&mut self, ino: Ino) {
        self.batch.delete(key::orphan(ino));
    }

    /// Write everything as one batch.
    pub fn commit(mut self) -> R<()> {
        let mut changed_inodes = Vec::new();
        for (ino, (rec, dirty)) in self.inodes.drain() {
            if !dirty {
                continue;
            }
            changed_inodes.push(ino);
            let before = self.originals.get(&ino).and_then(|o| o.as_ref());
            for (dir, d) in super::usage::differences(ino, before, rec.as_ref()) {
                self.batch.merge(key::usage(dir), encode(&d));
            }
            let is_dir = |r: Option<&InodeRecord>| r.is_some_and(|r| r.kind == FileKind::Dir);
            match (is_dir(before), is_dir(rec.as_ref())) {
                (false, true) => self.batch.put(key::dir_index(ino), []),
                (true, false) => self.batch.delete(key::dir_index(ino)),
                _ => {}
            }
            match rec {
                Some(r) => self.batch.put(key::inode(ino), encode(&r)),
                None => self.batch.delete(key::inode(ino)),
            }
        }
        if self.batch.is_empty() && self.changes.is_empty() {
            return Ok(());
        }
        // Leases on the changed directories are revoked before the batch is written, and no
        // new one is granted on them until it is (`_changing`); the request's reply waits
        // for the holders (`leases::scope`). Revoking a change that then fails to commit
        // costs the holders a refetch, nothing more.
        // So are attribute leases on the inodes whose records it writes.
        let _changing = match self.meta.leases() {
            Some(l) if !self.changed_dirs.is_empty() || !changed_inodes.is_empty() => {
                use shoal_proto::lease::LeaseKey;
                let dirs = self.changed_dirs.iter().map(|d| LeaseKey::dir(*d));
                let keys: Vec<_> = dirs.chain(changed_inodes.iter().map(|i| LeaseKey::attrs(*i))).collect();
                Some(if self.reshaping { l.reshaping(&keys) } else { l.changing(&keys) })
            }
            _ => None,
        };
        self.meta.write_changes(std::mem::take(&mut self.batch), std::mem::take(&mut self.changes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(kind: FileKind) -> InodeRecord {
        let t = Timestamp { secs: 5, nsecs: 6 };
        InodeRecord {
            kind,
            perm: 0o755,
            uid: 1,
            gid: 2,
            size: 3,
            nlink: 1,
            atime: t,
            mtime: t,
            ctime: t,
            layout: Some(Layout {
                stripe_size: 4096,
                servers: vec![shoal_proto::ServerId(0), shoal_proto::ServerId(2)],
                replicas: 1,
            }),
            dir_default: None,
            parent: None,
            target: Some("x".into()),
            bitmap: vec![0b1011],
            read_mostly: false,
        }
    }

    fn file(ino: u64) -> EntryRecord {
        EntryRecord { ino: Ino(ino), kind: FileKind::File }
    }

    /// A store with entries `f0` … `f{n-1}` in directory 10, and their names in listing order.
    fn store_with(n: usize) -> (tempfile::TempDir, MetaStore, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let m = MetaStore::open(&dir.path().join("meta")).unwrap();
        let mut t = m.txn();
        let mut names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            t.put_entry(Ino(10), name, file(100 + i as u64));
        }
        // Neighbours that no listing of directory 10 may show.
        t.put_entry(Ino(9), "zz", file(1));
        t.put_entry(Ino(11), "aa", file(2));
        t.commit().unwrap();
        names.sort_by_key(|n| (key::listing_key_of(n), n.clone()));
        (dir, m, names)
    }

    fn names(entries: &[DirEntry]) -> Vec<String> {
        entries.iter().map(|e| e.name.clone()).collect()
    }

    #[test]
    fn keys_have_the_documented_shape() {
        assert_eq!(key::inode(Ino(0x0102)), [b'i', 0, 0, 0, 0, 0, 0, 1, 2]);
        let lk = shoal_placement::listing_key(shoal_placement::name_hash("ab")).to_be_bytes();
        let mut want = vec![b'E', 0, 0, 0, 0, 0, 0, 0, 1];
        want.extend_from_slice(&lk);
        want.extend_from_slice(b"ab");
        assert_eq!(key::entry(Ino(1), "ab"), want);
        assert_eq!(key::entry_parts(&want), Some((u64::from_be_bytes(lk), &b"ab"[..])));
        assert_eq!(key::partition(Ino(0x0102), 0x0304), [b'P', 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4]);
        assert_eq!(key::partition_parts(&key::partition(Ino(7), 9)), Some((Ino(7), 9)));
        assert_eq!(&key::xattr(Ino(1), "user.a")[..9], &key::xattr_prefix(Ino(1)));
        assert_eq!(key::number(&key::intent(0xdead_beef)), Some(0xdead_beef));
        assert_eq!(key::number(b"short"), None);
        assert_eq!(key::prefix_end(&[b'e', 0, 0xff]), Some(vec![b'e', 1]));
        assert_eq!(key::prefix_end(&[0xff, 0xff]), None);
    }

    proptest! {
        #[test]
        fn entry_keys_sort_by_directory_then_listing_order(a in any::<u64>(), b in any::<u64>(), n in "[a-z]{1,8}", m in "[a-z]{1,8}") {
            let (ka, kb) = (key::entry(Ino(a), &n), key::entry(Ino(b), &m));
            let want = (a, key::listing_key_of(&n), n.as_bytes()).cmp(&(b, key::listing_key_of(&m), m.as_bytes()));
            prop_assert_eq!(ka.cmp(&kb), want);
            prop_assert!(ka.starts_with(&key::entry_prefix(Ino(a))));
        }

        #[test]
        fn decoding_garbage_is_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode::<InodeRecord>(&"x", &bytes);
            let _ = decode::<IntentRecord>(&"x", &bytes);
        }
    }

    #[test]
    fn records_round_trip() {
        let r = rec(FileKind::File);
        assert_eq!(decode::<InodeRecord>(&"r", &encode(&r)).unwrap(), r);
        let i = IntentRecord { created: 9, intent: Intent::Unlink { ino: Ino(7) }, reply_to: None };
        assert_eq!(decode::<IntentRecord>(&"i", &encode(&i)).unwrap(), i);
        let t = IntentRecord {
            created: 9,
            intent: Intent::Truncate { ino: Ino(7), size: 4097, sized: true },
            reply_to: None,
        };
        assert_eq!(decode::<IntentRecord>(&"i", &encode(&t)).unwrap(), t);
        let mut bad = encode(&r);
        bad[0] = 9;
        assert_eq!(decode::<InodeRecord>(&"r", &bad).unwrap_err().errno, Errno::EIO);
    }

    #[test]
    fn txn_batches_and_scans() {
        let dir = tempfile::tempdir().unwrap();
        let m = MetaStore::open(&dir.path().join("meta")).unwrap();
        let mut t = m.txn();
        t.put_inode(Ino(10), rec(FileKind::Dir)).unwrap();
        for name in ["b", "a", "c"] {
            t.put_entry(Ino(10), name, EntryRecord { ino: Ino(20), kind: FileKind::File });
        }
        t.put_entry(Ino(11), "z", EntryRecord { ino: Ino(21), kind: FileKind::File });
        t.put_xattr(Ino(10), "user.k", b"v");
        t.inode_mut(Ino(10)).unwrap().nlink = 7;
        assert_eq!(t.entry(Ino(10), "a").unwrap().unwrap().ino, Ino(20));
        t.commit().unwrap();
        assert_eq!(m.get_inode(Ino(10)).unwrap().unwrap().nlink, 7);
        let (listed, more) = m.list_entries(Ino(10), ListStart::From(0), (0, u64::MAX), 10).unwrap();
        let mut want = vec!["a", "b", "c"];
        want.sort_by_key(|n| key::listing_key_of(n));
        assert_eq!(names(&listed), want);
        assert!(!more);
        let (listed, more) = m.list_entries(Ino(10), ListStart::After(want[0]), (0, u64::MAX), 1).unwrap();
        assert_eq!(names(&listed), [want[1]]);
        assert!(more);
        assert!(m.has_entries(Ino(11)).unwrap());
        assert!(!m.has_entries(Ino(12)).unwrap());
        assert_eq!(m.list_xattrs(Ino(10)).unwrap(), ["user.k"]);
        let mut t = m.txn();
        t.remove_inode(Ino(10)).unwrap();
        t.commit().unwrap();
        assert!(m.get_inode(Ino(10)).unwrap().is_none());
        assert!(m.list_xattrs(Ino(10)).unwrap().is_empty());
        assert_eq!(m.count(key::ENTRY).unwrap(), 4);
    }

    #[test]
    fn a_listing_pages_through_a_directory_in_listing_order_each_entry_once() {
        let (_d, m, want) = store_with(50);
        let all = (0, u64::MAX);
        let (listed, more) = m.list_entries(Ino(10), ListStart::From(0), all, 1000).unwrap();
        assert_eq!(names(&listed), want);
        assert!(!more);
        assert_eq!(listed[3].ino, Ino(100 + want[3][1..].parse::<u64>().unwrap()));
        // Pages of 7, each going on strictly after the last name of the one before.
        let mut paged = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..20 {
            let start = after.as_deref().map_or(ListStart::From(0), ListStart::After);
            let (page, more) = m.list_entries(Ino(10), start, all, 7).unwrap();
            paged.extend(names(&page));
            after = page.last().map(|e| e.name.clone());
            if !more {
                break;
            }
        }
        assert_eq!(paged, want);
        // After a name that is not (or no longer) there: from where it would be.
        let gone = "no-such-name";
        let lk = key::listing_key_of(gone);
        let (page, _) = m.list_entries(Ino(10), ListStart::After(gone), all, 1000).unwrap();
        let expect: Vec<_> = want.iter().filter(|n| key::listing_key_of(n) > lk).cloned().collect();
        assert_eq!(names(&page), expect);
        // An empty directory, and one whose listing limit is 0.
        assert_eq!(m.list_entries(Ino(12), ListStart::From(0), all, 10).unwrap(), (vec![], false));
        assert_eq!(m.list_entries(Ino(10), ListStart::From(0), all, 0).unwrap(), (vec![], true));
    }

    #[test]
    fn a_listing_stays_inside_its_range_and_starts_where_asked() {
        let (_d, m, want) = store_with(64);
        let lks: Vec<u64> = want.iter().map(|n| key::listing_key_of(n)).collect();
        // The two halves of a depth-1 split, and a depth-2 partition.
        for (index, depth) in [(0u32, 1u32), (1, 1), (2, 2), (3, 2)] {
            let range = shoal_placement::key_range(index, depth);
            let inside: Vec<_> =
                want.iter().zip(&lks).filter(|(_, &k)| range.0 <= k && k <= range.1).map(|(n, _)| n.clone()).collect();
            assert!(!inside.is_empty() && inside.len() < want.len(), "partition {index}/{depth}");
            let (page, more) = m.list_entries(Ino(10), ListStart::From(0), range, 1000).unwrap();
            assert_eq!(names(&page), inside, "partition {index}/{depth}");
            assert!(!more);
            // `more` says whether entries follow inside the range, not after it.
            let (page, more) = m.list_entries(Ino(10), ListStart::From(0), range, inside.len() - 1).unwrap();
            assert_eq!(page.len(), inside.len() - 1);
            assert!(more);
            let (page, more) =
                m.list_entries(Ino(10), ListStart::After(&inside[inside.len() - 1]), range, 1000).unwrap();
            assert!(page.is_empty() && !more);
            assert_eq!(m.count_entries(Ino(10), range, u64::MAX).unwrap(), inside.len() as u64);
            assert_eq!(names(&m.entries_in(Ino(10), range).unwrap()), inside);
        }
        // `From(k)`: the first entry whose listing key is at least k.
        let k = lks[20];
        let (page, _) = m.list_entries(Ino(10), ListStart::From(k), (0, u64::MAX), 1000).unwrap();
        assert_eq!(names(&page), want[20..]);
        let (page, _) = m.list_entries(Ino(10), ListStart::From(k + 1), (0, u64::MAX), 1000).unwrap();
        assert_eq!(names(&page), want[21..]);
        // A start below the range begins at the range; one above it lists nothing.
        let range = (lks[10], lks[30]);
        let (page, _) = m.list_entries(Ino(10), ListStart::From(0), range, 1000).unwrap();
        assert_eq!(names(&page), want[10..=30]);
        let (page, _) = m.list_entries(Ino(10), ListStart::After(&want[2]), range, 1000).unwrap();
        assert_eq!(names(&page), want[10..=30]);
        let (page, more) = m.list_entries(Ino(10), ListStart::After(&want[40]), range, 1000).unwrap();
        assert!(page.is_empty() && !more);
    }

    #[test]
    fn counting_entries_stops_at_its_maximum() {
        let (_d, m, _) = store_with(30);
        let all = (0, u64::MAX);
        assert_eq!(m.count_entries(Ino(10), all, u64::MAX).unwrap(), 30);
        assert_eq!(m.count_entries(Ino(10), all, 30).unwrap(), 30);
        assert_eq!(m.count_entries(Ino(10), all, 7).unwrap(), 7);
        assert_eq!(m.count_entries(Ino(10), all, 0).unwrap(), 0);
        assert_eq!(m.count_entries(Ino(12), all, 10).unwrap(), 0);
        assert_eq!(m.entries_in(Ino(10), all).unwrap().len(), 30);
        assert!(m.has_entries(Ino(10)).unwrap());
        assert!(!m.has_entries(Ino(12)).unwrap());
    }

    #[test]
    fn partition_records_round_trip_through_a_transaction_and_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let m = MetaStore::open(&dir.path().join("meta")).unwrap();
        let p = |depth, sealed| PartitionRecord { depth, sealed, dir: rec(FileKind::Dir) };
        let mut t = m.txn();
        assert_eq!(t.partition(Ino(10), 1).unwrap(), None);
        t.put_partition(Ino(10), 1, &p(1, false));
        t.put_partition(Ino(10), 0, &p(1, false));
        t.put_partition(Ino(9), 6, &p(3, true));
        // A transaction sees its own changes.
        assert_eq!(t.partition(Ino(10), 1).unwrap(), Some(p(1, false)));
        t.commit().unwrap();
        assert_eq!(m.get_partition(Ino(10), 1).unwrap(), Some(p(1, false)));
        assert_eq!(
            m.partitions().unwrap(),
            vec![(Ino(9), 6, p(3, true)), (Ino(10), 0, p(1, false)), (Ino(10), 1, p(1, false))]
        );
        let mut t = m.txn();
        t.delete_partition(Ino(10), 1);
        assert_eq!(t.partition(Ino(10), 1).unwrap(), None);
        t.put_partition(Ino(10), 0, &p(2, true));
        t.commit().unwrap();
        assert_eq!(m.partitions().unwrap(), vec![(Ino(9), 6, p(3, true)), (Ino(10), 0, p(2, true))]);
        // The directory bitmap is stored with the inode.
        let mut t = m.txn();
        t.put_inode(Ino(10), rec(FileKind::Dir)).unwrap();
        t.commit().unwrap();
        assert_eq!(m.get_inode(Ino(10)).unwrap().unwrap().bitmap, vec![0b1011]);
    }
}
