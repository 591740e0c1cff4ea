//! Metadata records as stored (formats 3 and 4 store values alike; format 4 changed the
//! entry keys, see `meta.rs`): their own types, separate from the wire types of
//! `shoal-proto`, so that a change to a message never changes what is on disk (and the
//! reverse), with explicit conversions to and from the records the server works with
//! ([`InodeRecord`], [`EntryRecord`], … in `meta.rs`, which hold wire types).
//!
//! A value is one byte, [`VALUE_PROTOBUF`], followed by the record as a Protocol Buffers
//! message (`prost`). Field numbers are the schema: a field is added under a new number
//! (older records lack it and read as its default; readers skip numbers they do not know),
//! never renumbered or reused. docs/formats.md gives every record field by field and the
//! rules for changing them. Extended attribute values are raw bytes (no leading byte), and
//! the `m` keys hold big-endian numbers.
//!
//! **Why Protocol Buffers and not MessagePack with names (format 2).** Every create writes
//! two inodes (the file and its directory) and an entry. With field names in every value an
//! inode took 191 bytes (format 1: 89; format 3: ~45), and on md-easy creates the bigger
//! memtable, the encoding and the decoding cost ~12 % of a server's CPU (`perf`). Field
//! numbers keep what names gave (old readers skip new fields, new readers default missing
//! ones) at a quarter of the size.
//!
//! Formats 1 and 2 are read only by the upgrade, through [`v1`] and [`v2`].

use crate::error::{Fail, R};
use crate::store::meta::{
    AppliedRecord, ChangeRecord, ConsumerRecord, EntryRecord, GcRecord, InodeRecord, Intent, IntentRecord,
    OrphanRecord, PartitionRecord, TupleEventRecord, TupleRecord,
};
use prost::Message;
use shoal_proto::msg::{DirEntry, FileKind, Layout, LayoutSpec, PlacementPolicy, Reply, Timestamp, REPLICAS_MAX};
use shoal_proto::tuple::{Tuple, TupleEventKind, Value};
use shoal_proto::{Ino, ServerId};

pub mod v1;
pub mod v2;

/// Version of the metadata format this code writes (under `m` "format"). Stores of formats
/// 1 to 4 are upgraded in place when opened (`store::upgrade`); newer ones are refused.
/// Format 4 = format 3's values with entries keyed in listing order (`E` keys), partition
/// records and the directory bitmap. Format 5 = format 4 with every inode pointing at its
/// parent directory and per-directory usage (`U` and `D` records, `store::usage`), whose
/// `U` values are merged (a store of format 5 needs the merge operator to open).
pub const FORMAT_VERSION: u32 = 5;
/// First byte of every record value of formats 3 to 5 (the value encoding did not change).
pub const VALUE_PROTOBUF: u8 = 3;
/// First byte of every format-2 record value (MessagePack follows).
pub const VALUE_MSGPACK: u8 = v2::VALUE;
/// First byte of every format-1 record value (bincode 1 follows).
pub const VALUE_BINCODE1: u8 = 1;
/// No record is larger than this (inodes with 1024-server layouts are ~5 KiB).
const RECORD_LIMIT: usize = 1 << 20;

/// A record the metadata store keeps: how it is stored, and the conversions.
pub trait Record: Sized {
    type Stored: Message + Default;
    fn to_stored(&self) -> Self::Stored;
    /// The record from its stored form; an error names what is missing or out of range.
    fn from_stored(s: Self::Stored) -> Result<Self, String>;
}

/// Encode a record: [`VALUE_PROTOBUF`] + the Protocol Buffers encoding of its stored form.
pub fn encode<T: Record>(v: &T) -> Vec<u8> {
    let stored = v.to_stored();
    let mut out = Vec::with_capacity(1 + stored.encoded_len());
    out.push(VALUE_PROTOBUF);
    // Into a Vec with the room reserved: encoding cannot fail.
    stored.encode(&mut out).expect("record encodes");
    out
}

/// Decode a value written by [`encode`]; any damage is EIO naming `what`, never a panic.
pub fn decode<T: Record>(what: &dyn std::fmt::Display, bytes: &[u8]) -> R<T> {
    match bytes.split_first() {
        Some((&VALUE_PROTOBUF, rest)) if rest.len() <= RECORD_LIMIT => T::Stored::decode(rest)
            .map_err(|e| e.to_string())
            .and_then(T::from_stored)
            .map_err(|e| Fail::corrupt(format!("{what} does not decode: {e}"))),
        Some((&VALUE_PROTOBUF, rest)) => Err(Fail::corrupt(format!("{what} is too large ({} bytes)", rest.len()))),
        Some((&b @ (VALUE_BINCODE1 | VALUE_MSGPACK), _)) => {
            Err(Fail::corrupt(format!("{what} is still in format {b} (not upgraded)")))
        }
        Some((v, _)) => Err(Fail::corrupt(format!("{what} has unknown value format {v}"))),
        None => Err(Fail::corrupt(format!("{what} is empty"))),
    }
}

// ---- The stored types (format 3). Field numbers are on disk: never renumber or reuse. ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Kind {
    File = 0,
    Dir = 1,
    Symlink = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Policy {
    Same = 0,
    Spread = 1,
    /// Stored since protocol 7 (load-aware placement); a server of before refuses the
    /// record with "unknown placement policy 2".
    Load = 2,
}

#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct Time {
    #[prost(int64, tag = "1")]
    pub secs: i64,
    #[prost(uint32, tag = "2")]
    pub nsecs: u32,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredLayout {
    #[prost(uint64, tag = "1")]
    pub stripe_size: u64,
    /// Server ids holding objects 0, 1, … (packed).
    #[prost(uint32, repeated, tag = "2")]
    pub servers: Vec<u32>,
    /// Copies the file wants of each object; written only when not 1, so records of files
    /// with one copy are byte for byte those of before (absent = 1).
    #[prost(uint32, optional, tag = "3")]
    pub replicas: Option<u32>,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredLayoutSpec {
    #[prost(uint64, optional, tag = "1")]
    pub stripe_size: Option<u64>,
    #[prost(uint32, optional, tag = "2")]
    pub stripe_count: Option<u32>,
    #[prost(uint32, optional, tag = "3")]
    pub first_server: Option<u32>,
    #[prost(enumeration = "Policy", optional, tag = "4")]
    pub policy: Option<i32>,
    #[prost(uint32, optional, tag = "5")]
    pub replicas: Option<u32>,
}

/// `i` ino.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Inode {
    #[prost(enumeration = "Kind", tag = "1")]
    pub kind: i32,
    #[prost(uint32, tag = "2")]
    pub perm: u32,
    #[prost(uint32, tag = "3")]
    pub uid: u32,
    #[prost(uint32, tag = "4")]
    pub gid: u32,
    #[prost(uint64, tag = "5")]
    pub size: u64,
    #[prost(uint32, tag = "6")]
    pub nlink: u32,
    #[prost(message, optional, tag = "7")]
    pub atime: Option<Time>,
    #[prost(message, optional, tag = "8")]
    pub mtime: Option<Time>,
    #[prost(message, optional, tag = "9")]
    pub ctime: Option<Time>,
    #[prost(message, optional, tag = "10")]
    pub layout: Option<StoredLayout>,
    #[prost(message, optional, tag = "11")]
    pub dir_default: Option<StoredLayoutSpec>,
    #[prost(uint64, optional, tag = "12")]
    pub parent: Option<u64>,
    #[prost(string, optional, tag = "13")]
    pub target: Option<String>,
    /// A directory's partition bitmap (packed little-endian words; empty = never split).
    #[prost(fixed64, repeated, tag = "14")]
    pub bitmap: Vec<u64>,
    /// Read-mostly (docs/loading.md); absent (false) in records written before it.
    #[prost(bool, tag = "15")]
    pub read_mostly: bool,
}

/// `E` dir-ino listing-key name (`e` dir-ino name before format 4).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Entry {
    #[prost(uint64, tag = "1")]
    pub ino: u64,
    #[prost(enumeration = "Kind", tag = "2")]
    pub kind: i32,
}

/// `P` dir-ino index: a partition of a split directory held by this server.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Partition {
    #[prost(uint32, tag = "1")]
    pub depth: u32,
    #[prost(bool, tag = "2")]
    pub sealed: bool,
    /// The directory's attributes (required).
    #[prost(message, optional, tag = "3")]
    pub dir: Option<Inode>,
}

/// An intent's directory entry step (mkdir, rmdir).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct NameIntent {
    #[prost(uint64, tag = "1")]
    pub dir: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(uint64, tag = "3")]
    pub ino: u64,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct LinkIntent {
    #[prost(uint64, tag = "1")]
    pub dir: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(uint64, tag = "3")]
    pub ino: u64,
    #[prost(enumeration = "Kind", tag = "4")]
    pub kind: i32,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct InoIntent {
    #[prost(uint64, tag = "1")]
    pub ino: u64,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct RenameIntent {
    #[prost(uint64, tag = "1")]
    pub src_dir: u64,
    #[prost(string, tag = "2")]
    pub src_name: String,
    #[prost(uint64, tag = "3")]
    pub dst_dir: u64,
    #[prost(string, tag = "4")]
    pub dst_name: String,
    #[prost(uint64, tag = "5")]
    pub ino: u64,
    #[prost(enumeration = "Kind", tag = "6")]
    pub kind: i32,
    #[prost(bool, tag = "7")]
    pub noreplace: bool,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct SetParentIntent {
    #[prost(uint64, tag = "1")]
    pub ino: u64,
    #[prost(uint64, tag = "2")]
    pub parent: u64,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct UnlinkKeepIntent {
    #[prost(uint64, tag = "1")]
    pub ino: u64,
    #[prost(uint64, tag = "2")]
    pub session: u64,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct SplitIntent {
    #[prost(uint64, tag = "1")]
    pub dir: u64,
    #[prost(uint32, tag = "2")]
    pub index: u32,
    #[prost(uint32, tag = "3")]
    pub depth: u32,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct TruncateIntent {
    #[prost(uint64, tag = "1")]
    pub ino: u64,
    #[prost(uint64, tag = "2")]
    pub size: u64,
    #[prost(bool, tag = "3")]
    pub sized: bool,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct DirIntent {
    #[prost(uint64, tag = "1")]
    pub dir: u64,
}

/// The operation of an intent (`t` op-id); see `meta::Intent`.
#[derive(Clone, PartialEq, Eq, prost::Oneof)]
pub enum IntentOp {
    #[prost(message, tag = "2")]
    Mkdir(NameIntent),
    #[prost(message, tag = "3")]
    Link(LinkIntent),
    #[prost(message, tag = "4")]
    Unlink(InoIntent),
    #[prost(message, tag = "5")]
    Rmdir(NameIntent),
    #[prost(message, tag = "6")]
    Rename(RenameIntent),
    #[prost(message, tag = "7")]
    SetParent(SetParentIntent),
    #[prost(message, tag = "8")]
    UnlinkKeep(UnlinkKeepIntent),
    #[prost(message, tag = "9")]
    Split(SplitIntent),
    #[prost(message, tag = "10")]
    PartitionAttr(DirIntent),
    #[prost(message, tag = "11")]
    Truncate(TruncateIntent),
}

/// `t` op-id.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredIntent {
    #[prost(int64, tag = "1")]
    pub created: i64,
    #[prost(oneof = "IntentOp", tags = "2, 3, 4, 5, 6, 7, 8, 9, 10, 11")]
    pub op: Option<IntentOp>,
    /// The client request it answers (`IntentRecord::reply_to`): session and request id, 0
    /// and 0 for none (and in records written before the field existed).
    #[prost(uint64, tag = "12")]
    pub reply_session: u64,
    #[prost(uint64, tag = "13")]
    pub reply_request: u64,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredDirEntry {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint64, tag = "2")]
    pub ino: u64,
    #[prost(enumeration = "Kind", tag = "3")]
    pub kind: i32,
}

/// `PeerRenameIn`'s reply: the entry the rename replaced, if any.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Replaced {
    #[prost(message, optional, tag = "1")]
    pub entry: Option<StoredDirEntry>,
}

/// An empty message (a reply that carries nothing).
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, Eq, prost::Oneof)]
pub enum StoredAppliedReply {
    /// `PeerMkdirObject`.
    #[prost(message, tag = "2")]
    Ok(Empty),
    /// `PeerLinkDelta`: the new link count.
    #[prost(uint32, tag = "3")]
    NLink(u32),
    /// `PeerRenameIn`.
    #[prost(message, tag = "4")]
    Replaced(Replaced),
}

/// `o` op-id.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Applied {
    #[prost(int64, tag = "1")]
    pub created: i64,
    #[prost(oneof = "StoredAppliedReply", tags = "2, 3, 4")]
    pub reply: Option<StoredAppliedReply>,
}

/// `g` ino.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Gc {
    #[prost(int64, tag = "1")]
    pub created: i64,
    #[prost(message, optional, tag = "2")]
    pub layout: Option<StoredLayout>,
}

/// `O` ino.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Orphan {
    #[prost(uint64, tag = "1")]
    pub session: u64,
    #[prost(int64, tag = "2")]
    pub since: i64,
}

/// One value of a tuple: `kind` says which of `int` and `bytes` holds it.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredValue {
    #[prost(enumeration = "ValueType", tag = "1")]
    pub kind: i32,
    #[prost(int64, tag = "2")]
    pub int: i64,
    #[prost(bytes = "vec", tag = "3")]
    pub bytes: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ValueType {
    Int = 0,
    /// UTF-8 text in `bytes`.
    Str = 1,
    Bytes = 2,
}

/// `T` space seq.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredTuple {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<StoredValue>,
    #[prost(uint32, tag = "2")]
    pub uid: u32,
}

/// `N` seq.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredTupleEvent {
    /// 0 written, 1 taken.
    #[prost(uint32, tag = "1")]
    pub taken: u32,
    #[prost(message, repeated, tag = "2")]
    pub values: Vec<StoredValue>,
    #[prost(uint32, tag = "3")]
    pub uid: u32,
    #[prost(message, optional, tag = "4")]
    pub at: Option<Time>,
}

/// Who may see a change event (`ChangeRecord::guard`).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredGuard {
    #[prost(uint32, tag = "1")]
    pub uid: u32,
    #[prost(uint32, tag = "2")]
    pub gid: u32,
    #[prost(uint32, tag = "3")]
    pub perm: u32,
    #[prost(enumeration = "Kind", tag = "4")]
    pub kind: i32,
}

/// `C` seq: a change event. `kind` is the event's position in `change::KINDS` (stable:
/// kinds are only ever added at the end).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredChange {
    #[prost(uint32, tag = "1")]
    pub kind: u32,
    #[prost(uint64, tag = "2")]
    pub ino: u64,
    #[prost(enumeration = "Kind", tag = "3")]
    pub file_kind: i32,
    #[prost(uint64, optional, tag = "4")]
    pub dir: Option<u64>,
    #[prost(string, optional, tag = "5")]
    pub name: Option<String>,
    #[prost(uint64, optional, tag = "6")]
    pub to_dir: Option<u64>,
    #[prost(string, optional, tag = "7")]
    pub to_name: Option<String>,
    #[prost(string, optional, tag = "8")]
    pub xattr: Option<String>,
    #[prost(uint32, tag = "9")]
    pub uid: u32,
    #[prost(message, optional, tag = "10")]
    pub at: Option<Time>,
    #[prost(message, optional, tag = "11")]
    pub guard: Option<StoredGuard>,
    #[prost(message, optional, tag = "12")]
    pub to_guard: Option<StoredGuard>,
}

/// `K` name: a change-log consumer.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct StoredConsumer {
    #[prost(uint64, tag = "1")]
    pub acked: u64,
    #[prost(int64, tag = "2")]
    pub since: i64,
}

// ---- Conversions between the stored types and the server's records (wire types). ----

fn kind_out(k: FileKind) -> i32 {
    (match k {
        FileKind::File => Kind::File,
        FileKind::Dir => Kind::Dir,
        FileKind::Symlink => Kind::Symlink,
    }) as i32
}

fn kind_in(k: i32) -> Result<FileKind, String> {
    match Kind::try_from(k).map_err(|_| format!("unknown kind {k}"))? {
        Kind::File => Ok(FileKind::File),
        Kind::Dir => Ok(FileKind::Dir),
        Kind::Symlink => Ok(FileKind::Symlink),
    }
}

fn time_out(t: Timestamp) -> Option<Time> {
    Some(Time { secs: t.secs, nsecs: t.nsecs })
}

fn time_in(t: Option<Time>, what: &str) -> Result<Timestamp, String> {
    let t = t.ok_or_else(|| format!("no {what}"))?;
    Ok(Timestamp { secs: t.secs, nsecs: t.nsecs })
}

fn layout_out(l: &Layout) -> StoredLayout {
    StoredLayout {
        stripe_size: l.stripe_size,
        servers: l.servers.iter().map(|s| s.0).collect(),
        replicas: (l.replicas != 1).then_some(l.replicas.into()),
    }
}

/// A stored replica count: 1 ..= `REPLICAS_MAX` (anything else was never written by this
/// code: a damaged record, `EIO`, rather than a count placement cannot honour).
fn replicas_in(r: u32) -> Result<u8, String> {
    u8::try_from(r)
        .ok()
        .filter(|r| (1..=REPLICAS_MAX).contains(r))
        .ok_or_else(|| format!("replica count {r} out of range 1 to {REPLICAS_MAX}"))
}

fn layout_in(l: StoredLayout) -> Result<Layout, String> {
    Ok(Layout {
        stripe_size: l.stripe_size,
        servers: l.servers.into_iter().map(ServerId).collect(),
        replicas: l.replicas.map(replicas_in).transpose()?.unwrap_or(1),
    })
}

fn spec_out(s: &LayoutSpec) -> StoredLayoutSpec {
    StoredLayoutSpec {
        stripe_size: s.stripe_size,
        stripe_count: s.stripe_count,
        first_server: s.first_server.map(|s| s.0),
        policy: s.policy.map(|p| {
            (match p {
                PlacementPolicy::Same => Policy::Same,
                PlacementPolicy::Spread => Policy::Spread,
                PlacementPolicy::Load => Policy::Load,
            }) as i32
        }),
        replicas: s.replicas.map(u32::from),
    }
}

fn spec_in(s: StoredLayoutSpec) -> Result<LayoutSpec, String> {
    let policy = match s.policy {
        None => None,
        Some(p) => Some(match Policy::try_from(p).map_err(|_| format!("unknown placement policy {p}"))? {
            Policy::Same => PlacementPolicy::Same,
            Policy::Spread => PlacementPolicy::Spread,
            Policy::Load => PlacementPolicy::Load,
        }),
    };
    Ok(LayoutSpec {
        stripe_size: s.stripe_size,
        stripe_count: s.stripe_count,
        first_server: s.first_server.map(ServerId),
        policy,
        replicas: s.replicas.map(replicas_in).transpose()?,
    })
}

impl Record for InodeRecord {
    type Stored = Inode;
    fn to_stored(&self) -> Inode {
        Inode {
            kind: kind_out(self.kind),
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            nlink: self.nlink,
            atime: time_out(self.atime),
            mtime: time_out(self.mtime),
            ctime: time_out(self.ctime),
            layout: self.layout.as_ref().map(layout_out),
            dir_default: self.dir_default.as_ref().map(spec_out),
            parent: self.parent.map(|p| p.0),
            target: self.target.clone(),
            bitmap: self.bitmap.clone(),
            read_mostly: self.read_mostly,
        }
    }
    fn from_stored(s: Inode) -> Result<InodeRecord, String> {
        Ok(InodeRecord {
            kind: kind_in(s.kind)?,
            perm: s.perm,
            uid: s.uid,
            gid: s.gid,
            size: s.size,
            nlink: s.nlink,
            atime: time_in(s.atime, "atime")?,
            mtime: time_in(s.mtime, "mtime")?,
            ctime: time_in(s.ctime, "ctime")?,
            layout: s.layout.map(layout_in).transpose()?,
            dir_default: s.dir_default.map(spec_in).transpose()?,
            parent: s.parent.map(Ino),
            target: s.target,
            bitmap: s.bitmap,
            read_mostly: s.read_mostly,
        })
    }
}

impl Record for PartitionRecord {
    type Stored = Partition;
    fn to_stored(&self) -> Partition {
        Partition { depth: self.depth, sealed: self.sealed, dir: Some(self.dir.to_stored()) }
    }
    fn from_stored(s: Partition) -> Result<PartitionRecord, String> {
        let dir = InodeRecord::from_stored(s.dir.ok_or("no directory attributes")?)?;
        Ok(PartitionRecord { depth: s.depth, sealed: s.sealed, dir })
    }
}

impl Record for EntryRecord {
    type Stored = Entry;
    fn to_stored(&self) -> Entry {
        Entry { ino: self.ino.0, kind: kind_out(self.kind) }
    }
    fn from_stored(s: Entry) -> Result<EntryRecord, String> {
        Ok(EntryRecord { ino: Ino(s.ino), kind: kind_in(s.kind)? })
    }
}

impl Record for IntentRecord {
    type Stored = StoredIntent;
    fn to_stored(&self) -> StoredIntent {
        let op = match self.intent.clone() {
            Intent::Mkdir { dir, name, ino } => IntentOp::Mkdir(NameIntent { dir: dir.0, name, ino: ino.0 }),
            Intent::Link { dir, name, ino, kind } => {
                IntentOp::Link(LinkIntent { dir: dir.0, name, ino: ino.0, kind: kind_out(kind) })
            }
            Intent::Unlink { ino } => IntentOp::Unlink(InoIntent { ino: ino.0 }),
            Intent::Rmdir { dir, name, ino } => IntentOp::Rmdir(NameIntent { dir: dir.0, name, ino: ino.0 }),
            Intent::Rename { src_dir, src_name, dst_dir, dst_name, ino, kind, noreplace } => {
                IntentOp::Rename(RenameIntent {
                    src_dir: src_dir.0,
                    src_name,
                    dst_dir: dst_dir.0,
                    dst_name,
                    ino: ino.0,
                    kind: kind_out(kind),
                    noreplace,
                })
            }
            Intent::SetParent { ino, parent } => IntentOp::SetParent(SetParentIntent { ino: ino.0, parent: parent.0 }),
            Intent::UnlinkKeep { ino, session } => IntentOp::UnlinkKeep(UnlinkKeepIntent { ino: ino.0, session }),
            Intent::Split { dir, index, depth } => IntentOp::Split(SplitIntent { dir: dir.0, index, depth }),
            Intent::PartitionAttr { dir } => IntentOp::PartitionAttr(DirIntent { dir: dir.0 }),
            Intent::Truncate { ino, size, sized } => IntentOp::Truncate(TruncateIntent { ino: ino.0, size, sized }),
        };
        let (reply_session, reply_request) = self.reply_to.unwrap_or((0, 0));
        StoredIntent { created: self.created, op: Some(op), reply_session, reply_request }
    }
    fn from_stored(s: StoredIntent) -> Result<IntentRecord, String> {
        let intent = match s.op.ok_or("no operation")? {
            IntentOp::Mkdir(i) => Intent::Mkdir { dir: Ino(i.dir), name: i.name, ino: Ino(i.ino) },
            IntentOp::Link(i) => {
                Intent::Link { dir: Ino(i.dir), name: i.name, ino: Ino(i.ino), kind: kind_in(i.kind)? }
            }
            IntentOp::Unlink(i) => Intent::Unlink { ino: Ino(i.ino) },
            IntentOp::Rmdir(i) => Intent::Rmdir { dir: Ino(i.dir), name: i.name, ino: Ino(i.ino) },
            IntentOp::Rename(i) => Intent::Rename {
                src_dir: Ino(i.src_dir),
                src_name: i.src_name,
                dst_dir: Ino(i.dst_dir),
                dst_name: i.dst_name,
                ino: Ino(i.ino),
                kind: kind_in(i.kind)?,
                noreplace: i.noreplace,
            },
            IntentOp::SetParent(i) => Intent::SetParent { ino: Ino(i.ino), parent: Ino(i.parent) },
            IntentOp::UnlinkKeep(i) => Intent::UnlinkKeep { ino: Ino(i.ino), session: i.session },
            IntentOp::Split(i) => Intent::Split { dir: Ino(i.dir), index: i.index, depth: i.depth },
            IntentOp::PartitionAttr(i) => Intent::PartitionAttr { dir: Ino(i.dir) },
            IntentOp::Truncate(i) => Intent::Truncate { ino: Ino(i.ino), size: i.size, sized: i.sized },
        };
        let reply_to = (s.reply_session != 0).then_some((s.reply_session, s.reply_request));
        Ok(IntentRecord { created: s.created, intent, reply_to })
    }
}

/// What an applied peer step answered: the only replies peer steps keep (`AppliedRecord`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppliedReply {
    /// `PeerMkdirObject`.
    Ok,
    /// `PeerLinkDelta`: the new link count.
    NLink { nlink: u32 },
    /// `PeerRenameIn`: the entry the rename replaced.
    Replaced { entry: Option<DirEntry> },
}

impl AppliedReply {
    /// The stored form of a peer step's reply; `None` for replies no peer step keeps.
    pub fn from_wire(r: &Reply) -> Option<AppliedReply> {
        Some(match r {
            Reply::Ok => AppliedReply::Ok,
            Reply::NLink(nlink) => AppliedReply::NLink { nlink: *nlink },
            Reply::Replaced(e) => AppliedReply::Replaced { entry: e.clone() },
            _ => return None,
        })
    }

    pub fn into_wire(self) -> Reply {
        match self {
            AppliedReply::Ok => Reply::Ok,
            AppliedReply::NLink { nlink } => Reply::NLink(nlink),
            AppliedReply::Replaced { entry } => Reply::Replaced(entry),
        }
    }
}

impl Record for AppliedRecord {
    type Stored = Applied;
    fn to_stored(&self) -> Applied {
        let reply = match &self.reply {
            AppliedReply::Ok => StoredAppliedReply::Ok(Empty {}),
            AppliedReply::NLink { nlink } => StoredAppliedReply::NLink(*nlink),
            AppliedReply::Replaced { entry } => StoredAppliedReply::Replaced(Replaced {
                entry: entry.as_ref().map(|e| StoredDirEntry {
                    name: e.name.clone(),
                    ino: e.ino.0,
                    kind: kind_out(e.kind),
                }),
            }),
        };
        Applied { created: self.created, reply: Some(reply) }
    }
    fn from_stored(s: Applied) -> Result<AppliedRecord, String> {
        let reply = match s.reply.ok_or("no reply")? {
            StoredAppliedReply::Ok(_) => AppliedReply::Ok,
            StoredAppliedReply::NLink(nlink) => AppliedReply::NLink { nlink },
            StoredAppliedReply::Replaced(r) => AppliedReply::Replaced {
                entry: match r.entry {
                    None => None,
                    Some(e) => Some(DirEntry { name: e.name, ino: Ino(e.ino), kind: kind_in(e.kind)? }),
                },
            },
        };
        Ok(AppliedRecord { created: s.created, reply })
    }
}

impl Record for GcRecord {
    type Stored = Gc;
    fn to_stored(&self) -> Gc {
        Gc { created: self.created, layout: Some(layout_out(&self.layout)) }
    }
    fn from_stored(s: Gc) -> Result<GcRecord, String> {
        Ok(GcRecord { created: s.created, layout: layout_in(s.layout.ok_or("no layout")?)? })
    }
}

impl Record for OrphanRecord {
    type Stored = Orphan;
    fn to_stored(&self) -> Orphan {
        Orphan { session: self.session, since: self.since }
    }
    fn from_stored(s: Orphan) -> Result<OrphanRecord, String> {
        Ok(OrphanRecord { session: s.session, since: s.since })
    }
}

fn values_out(t: &Tuple) -> Vec<StoredValue> {
    t.0.iter()
        .map(|v| match v {
            Value::Int(n) => StoredValue { kind: ValueType::Int as i32, int: *n, bytes: Vec::new() },
            Value::Str(s) => StoredValue { kind: ValueType::Str as i32, int: 0, bytes: s.as_bytes().to_vec() },
            Value::Bytes(b) => StoredValue { kind: ValueType::Bytes as i32, int: 0, bytes: b.clone() },
        })
        .collect()
}

fn values_in(values: Vec<StoredValue>) -> Result<Tuple, String> {
    let values = values
        .into_iter()
        .map(|v| match ValueType::try_from(v.kind).map_err(|_| format!("unknown value type {}", v.kind))? {
            ValueType::Int => Ok(Value::Int(v.int)),
            ValueType::Str => String::from_utf8(v.bytes).map(Value::Str).map_err(|_| "a string is not UTF-8".into()),
            ValueType::Bytes => Ok(Value::Bytes(v.bytes)),
        })
        .collect::<Result<Vec<Value>, String>>()?;
    if values.is_empty() {
        return Err("a tuple without fields".into());
    }
    Ok(Tuple(values))
}

impl Record for TupleRecord {
    type Stored = StoredTuple;
    fn to_stored(&self) -> StoredTuple {
        StoredTuple { values: values_out(&self.tuple), uid: self.uid }
    }
    fn from_stored(s: StoredTuple) -> Result<TupleRecord, String> {
        Ok(TupleRecord { tuple: values_in(s.values)?, uid: s.uid })
    }
}

impl Record for TupleEventRecord {
    type Stored = StoredTupleEvent;
    fn to_stored(&self) -> StoredTupleEvent {
        StoredTupleEvent {
            taken: (self.kind == TupleEventKind::Taken) as u32,
            values: values_out(&self.tuple),
            uid: self.uid,
            at: time_out(self.at),
        }
    }
    fn from_stored(s: StoredTupleEvent) -> Result<TupleEventRecord, String> {
        let kind = match s.taken {
            0 => TupleEventKind::Written,
            1 => TupleEventKind::Taken,
            n => return Err(format!("unknown event kind {n}")),
        };
        Ok(TupleEventRecord { kind, tuple: values_in(s.values)?, uid: s.uid, at: time_in(s.at, "time")? })
    }
}

fn guard_out(o: &crate::perm::Owner) -> StoredGuard {
    StoredGuard { uid: o.uid, gid: o.gid, perm: o.perm, kind: kind_out(o.kind) }
}

fn guard_in(g: StoredGuard) -> Result<crate::perm::Owner, String> {
    Ok(crate::perm::Owner { uid: g.uid, gid: g.gid, perm: g.perm, kind: kind_in(g.kind)? })
}

impl Record for ChangeRecord {
    type Stored = StoredChange;
    fn to_stored(&self) -> StoredChange {
        use shoal_proto::change::KINDS;
        let e = &self.event;
        StoredChange {
            kind: KINDS.iter().position(|k| *k == e.kind).expect("every kind is listed") as u32,
            ino: e.ino.0,
            file_kind: kind_out(e.file_kind),
            dir: e.dir.map(|d| d.0),
            name: e.name.clone(),
            to_dir: e.to_dir.map(|d| d.0),
            to_name: e.to_name.clone(),
            xattr: e.xattr.clone(),
            uid: e.uid,
            at: time_out(e.at),
            guard: Some(guard_out(&self.guard)),
            to_guard: self.to_guard.as_ref().map(guard_out),
        }
    }
    fn from_stored(s: StoredChange) -> Result<ChangeRecord, String> {
        let kind =
            *shoal_proto::change::KINDS.get(s.kind as usize).ok_or_else(|| format!("unknown event kind {}", s.kind))?;
        let event = shoal_proto::change::ChangeEvent {
            seq: 0,
            kind,
            ino: Ino(s.ino),
            file_kind: kind_in(s.file_kind)?,
            dir: s.dir.map(Ino),
            name: s.name,
            to_dir: s.to_dir.map(Ino),
            to_name: s.to_name,
            xattr: s.xattr,
            uid: s.uid,
            at: time_in(s.at, "time")?,
        };
        let guard = guard_in(s.guard.ok_or("no guard")?)?;
        let to_guard = s.to_guard.map(guard_in).transpose()?;
        Ok(ChangeRecord { event, guard, to_guard })
    }
}

impl Record for ConsumerRecord {
    type Stored = StoredConsumer;
    fn to_stored(&self) -> StoredConsumer {
        StoredConsumer { acked: self.acked, since: self.since }
    }
    fn from_stored(s: StoredConsumer) -> Result<ConsumerRecord, String> {
        Ok(ConsumerRecord { acked: s.acked, since: s.since })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn inode() -> InodeRecord {
        InodeRecord {
            kind: FileKind::File,
            perm: 0o644,
            uid: 1,
            gid: 2,
            size: 3,
            nlink: 1,
            atime: Timestamp { secs: 5, nsecs: 6 },
            mtime: Timestamp { secs: 5, nsecs: 6 },
            ctime: Timestamp { secs: 5, nsecs: 6 },
            layout: Some(Layout { stripe_size: 4096, servers: vec![ServerId(0), ServerId(2)], replicas: 1 }),
            dir_default: None,
            parent: None,
            target: None,
            bitmap: Vec::new(),
            read_mostly: false,
        }
    }

    /// Golden vectors: the bytes docs/formats.md shows. A change here is a format change:
    /// it needs a new format version and an upgrade, not a new vector.
    #[test]
    fn records_encode_to_the_documented_bytes() {
        let e = EntryRecord { ino: Ino(0x1234), kind: FileKind::Dir };
        // 03, field 1 (varint) 0x1234, field 2 (varint) 1 = Dir
        assert_eq!(hex(&encode(&e)), "0308b4241001");
        let o = OrphanRecord { session: 7, since: 1_700_000_000 };
        assert_eq!(hex(&encode(&o)), "0308071080e2cfaa06");
        let i = IntentRecord { created: 9, intent: Intent::Unlink { ino: Ino(5) }, reply_to: None };
        // created 9; field 4 (Unlink, length-delimited, 2 bytes): field 1 = 5
        assert_eq!(hex(&encode(&i)), "03080922020805");
        let a = AppliedRecord { created: 1, reply: AppliedReply::NLink { nlink: 2 } };
        assert_eq!(hex(&encode(&a)), "0308011802");
        let bytes = encode(&inode());
        // kind File (0) is the default and not written; perm 0o644, uid 1, gid 2, size 3,
        // nlink 1, three times {5, 6}, layout {4096, [0, 2] packed}; no dir_default, parent
        // or target.
        assert_eq!(hex(&bytes), "0310a40318012002280330013a04080510064204080510064a0408051006520708802012020002");
        assert_eq!(decode::<InodeRecord>(&"inode", &bytes).unwrap(), inode());
    }

    /// Golden vectors of a replica count: the file's (`Layout` field 3) and a directory
    /// default's (`LayoutSpec` field 5). One copy is not written (the vector above).
    #[test]
    fn replica_counts_encode_to_the_documented_bytes() {
        let mut file = inode();
        file.layout.as_mut().unwrap().replicas = 3;
        let bytes = encode(&file);
        // as above, but the layout is 9 bytes long and ends with field 3 (varint) = 3
        assert_eq!(hex(&bytes), "0310a40318012002280330013a04080510064204080510064a04080510065209088020120200021803");
        assert_eq!(decode::<InodeRecord>(&"inode", &bytes).unwrap(), file);
        let mut dir = inode();
        dir.kind = FileKind::Dir;
        dir.layout = None;
        dir.dir_default = Some(LayoutSpec { replicas: Some(2), ..LayoutSpec::default() });
        let bytes = encode(&dir);
        // kind Dir (08 01) first; then dir_default (field 11, 2 bytes): field 5 (varint) = 2
        assert!(hex(&bytes).starts_with("030801"), "{}", hex(&bytes));
        assert!(hex(&bytes).ends_with("5a022802"), "{}", hex(&bytes));
        assert_eq!(decode::<InodeRecord>(&"inode", &bytes).unwrap(), dir);
        // A count this code never writes is a damaged record, named, not a panic.
        let mut stored = file.to_stored();
        stored.layout.as_mut().unwrap().replicas = Some(9);
        let mut bad = vec![VALUE_PROTOBUF];
        bad.extend(stored.encode_to_vec());
        let e = decode::<InodeRecord>(&"inode 5", &bad).unwrap_err();
        assert!(format!("{e:?}").contains("replica count 9 out of range 1 to 3"), "{e:?}");
    }

    /// Golden vector of a partition record holding a directory inode with a bitmap (format 4).
    #[test]
    fn a_partition_record_and_a_bitmap_encode_to_the_documented_bytes() {
        let t = Timestamp { secs: 1, nsecs: 0 };
        let dir = InodeRecord {
            kind: FileKind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 2,
            atime: t,
            mtime: t,
            ctime: t,
            layout: None,
            dir_default: None,
            parent: Some(Ino(1)),
            target: None,
            bitmap: vec![5],
            read_mostly: false,
        };
        let p = PartitionRecord { depth: 2, sealed: true, dir };
        let bytes = encode(&p);
        // depth 2, sealed, dir (31 bytes): kind Dir, perm 0o755, nlink 2, times {1, 0},
        // parent 1, bitmap [5] (field 14, packed fixed64: 8 bytes little-endian).
        assert_eq!(hex(&bytes), "03080210011a1f080110ed0330023a020801420208014a020801600172080500000000000000");
        assert_eq!(decode::<PartitionRecord>(&"partition", &bytes).unwrap(), p);
        // A format-3 inode (no field 14) reads as never split.
        assert_eq!(decode::<InodeRecord>(&"inode", &encode(&inode())).unwrap().bitmap, Vec::<u64>::new());
        // A partition record without its directory's attributes is damage, not a default.
        assert!(decode::<PartitionRecord>(&"partition", &[VALUE_PROTOBUF, 0x08, 0x02]).is_err());
    }

    /// A format-2 inode (MessagePack with names: the bytes format 2's golden vector had)
    /// decodes to the same record.
    #[test]
    fn a_format_2_inode_decodes_as_documented() {
        let hexed = "028da46b696e64a446696c65a47065726dcd01a4a375696401a367696402a473697a6503a56e6c696e6b01\
             a56174696d6582a47365637305a56e7365637306a56d74696d6582a47365637305a56e7365637306\
             a56374696d6582a47365637305a56e7365637306a66c61796f757482ab7374726970655f73697a65cd1000\
             a773657276657273920002ab6469725f64656661756c74c0a6706172656e74c0a6746172676574c0"
            .replace(' ', "");
        let b: Vec<u8> =
            (0..hexed.len()).step_by(2).map(|i| u8::from_str_radix(&hexed[i..i + 2], 16).unwrap()).collect();
        assert_eq!(v2::inode(&b).unwrap(), inode());
        assert!(v2::inode(&b[..b.len() - 1]).is_err());
    }

    /// A format-1 inode, written out by hand from the layout in docs/formats.md, decodes.
    #[test]
    fn a_format_1_inode_decodes_as_documented() {
        let mut b = vec![VALUE_BINCODE1];
        b.extend(0u32.to_le_bytes()); // kind File
        for v in [0o644u32, 1, 2] {
            b.extend(v.to_le_bytes()); // perm, uid, gid
        }
        b.extend(3u64.to_le_bytes()); // size
        b.extend(1u32.to_le_bytes()); // nlink
        for _ in 0..3 {
            b.extend(5i64.to_le_bytes()); // secs
            b.extend(6u32.to_le_bytes()); // nsecs
        }
        b.push(1); // layout: Some
        b.extend(4096u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(2u32.to_le_bytes());
        b.extend([0, 0, 0]); // dir_default, parent, target: None
        assert_eq!(v1::inode(&b).unwrap(), inode());
        // Damage is an error, never a panic: a cut value, a trailing byte, a bad tag.
        assert!(v1::inode(&b[..b.len() - 1]).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(v1::inode(&long).is_err());
        b[1] = 7;
        assert!(v1::inode(&b).is_err());
    }

    proptest::proptest! {
        #[test]
        fn format_1_garbage_is_an_error_not_a_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96)) {
            let mut v = vec![VALUE_BINCODE1];
            v.extend(bytes);
            let _ = v1::inode(&v);
            let _ = v1::entry(&v);
            let _ = v1::intent(&v);
            let _ = v1::applied(&v);
            let _ = v1::gc(&v);
            let _ = v1::orphan(&v);
        }

        #[test]
        fn format_2_and_3_garbage_is_an_error_not_a_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96)) {
            let mut v = vec![VALUE_MSGPACK];
            v.extend(&bytes);
            let _ = v2::inode(&v);
            let _ = v2::entry(&v);
            let _ = v2::intent(&v);
            let _ = v2::applied(&v);
            let _ = v2::gc(&v);
            let _ = v2::orphan(&v);
            let mut v = vec![VALUE_PROTOBUF];
            v.extend(&bytes);
            let _ = decode::<InodeRecord>(&"inode", &v);
            let _ = decode::<EntryRecord>(&"entry", &v);
            let _ = decode::<IntentRecord>(&"intent", &v);
            let _ = decode::<AppliedRecord>(&"applied", &v);
            let _ = decode::<GcRecord>(&"gc", &v);
            let _ = decode::<OrphanRecord>(&"orphan", &v);
            let _ = decode::<PartitionRecord>(&"partition", &v);
            let _ = decode::<ChangeRecord>(&"change", &v);
            let _ = decode::<ConsumerRecord>(&"consumer", &v);
        }
    }

    #[test]
    fn change_and_consumer_records_round_trip() {
        use shoal_proto::change::{ChangeEvent, KINDS};
        let guard = crate::perm::Owner { uid: 1000, gid: 100, perm: 0o750, kind: FileKind::Dir };
        for kind in KINDS {
            let rec = ChangeRecord {
                event: ChangeEvent {
                    seq: 0,
                    kind,
                    ino: Ino(42),
                    file_kind: FileKind::File,
                    dir: Some(Ino(7)),
                    name: Some("a.h5".into()),
                    to_dir: Some(Ino(8)),
                    to_name: Some("b.h5".into()),
                    xattr: Some("user.tag".into()),
                    uid: 1000,
                    at: Timestamp { secs: 5, nsecs: 6 },
                },
                guard,
                to_guard: Some(guard),
            };
            assert_eq!(decode::<ChangeRecord>(&"change", &encode(&rec)).unwrap(), rec);
        }
        let c = ConsumerRecord { acked: 99, since: 1_700_000_000 };
        assert_eq!(decode::<ConsumerRecord>(&"consumer", &encode(&c)).unwrap(), c);
        // A change without its guard (who may see it) is refused, not shown to anyone.
        let mut bad = encode(&ConsumerRecord { acked: 1, since: 1 });
        bad.truncate(1);
        assert!(decode::<ChangeRecord>(&"change", &bad).is_err());
    }

    #[test]
    fn every_intent_and_applied_reply_round_trips() {
        let intents = [
            Intent::Mkdir { dir: Ino(1), name: "a".into(), ino: Ino(2) },
            Intent::Link { dir: Ino(1), name: "b".into(), ino: Ino(3), kind: FileKind::File },
            Intent::Unlink { ino: Ino(4) },
            Intent::Rmdir { dir: Ino(1), name: "c".into(), ino: Ino(5) },
            Intent::Rename {
                src_dir: Ino(1),
                src_name: "d".into(),
                dst_dir: Ino(6),
                dst_name: "e".into(),
                ino: Ino(7),
                kind: FileKind::Symlink,
                noreplace: true,
            },
            Intent::SetParent { ino: Ino(8), parent: Ino(9) },
            Intent::UnlinkKeep { ino: Ino(10), session: 11 },
        ];
        for intent in intents {
            let r = IntentRecord { created: -1, intent, reply_to: None };
            assert_eq!(decode::<IntentRecord>(&"intent", &encode(&r)).unwrap(), r);
            let r = IntentRecord { reply_to: Some((3, 1 << 40)), ..r };
            assert_eq!(decode::<IntentRecord>(&"intent", &encode(&r)).unwrap(), r);
        }
        let entry = DirEntry { name: "x".into(), ino: Ino(3), kind: FileKind::File };
        for reply in [Reply::Ok, Reply::NLink(4), Reply::Replaced(None), Reply::Replaced(Some(entry))] {
            let stored = AppliedReply::from_wire(&reply).unwrap();
            let r = AppliedRecord { created: 1, reply: stored };
            assert_eq!(decode::<AppliedRecord>(&"applied", &encode(&r)).unwrap().reply.into_wire(), reply);
        }
        assert_eq!(AppliedReply::from_wire(&Reply::Data), None);
    }
}
