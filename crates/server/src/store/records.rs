//! Metadata records as stored (format 2): their own types, separate from the wire types of
//! `shoal-proto`, so that a change to a message never changes what is on disk (and the
//! reverse), with explicit conversions to and from the records the server works with
//! ([`InodeRecord`], [`EntryRecord`], … in `meta.rs`, which hold wire types).
//!
//! A value is one byte, [`VALUE_MSGPACK`], followed by the record in MessagePack with every
//! struct a map keyed by field name and every enum variant tagged by its name
//! (`rmp_serde::to_vec_named`). Names are the schema: a field is added with
//! `#[serde(default)]` (older records lack it), never renamed or reused; fields a reader does
//! not know are skipped. docs/formats.md gives every record byte by byte and the rules for
//! changing them. Extended attribute values are raw bytes (no leading byte), and the `m`
//! keys hold big-endian numbers.
//!
//! Format 1 (values: byte 1 + bincode 1 of the records of that time) is read only by the
//! upgrade, through [`v1`].

use crate::error::{Fail, R};
use crate::store::meta::{AppliedRecord, EntryRecord, GcRecord, InodeRecord, Intent, IntentRecord, OrphanRecord};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use shoal_proto::msg::{DirEntry, FileKind, Layout, LayoutSpec, PlacementPolicy, Reply, Timestamp};
use shoal_proto::{Ino, ServerId};

/// Version of the metadata format this code writes (under `m` "format"). Format 1 stores
/// are upgraded in place when opened (`store::upgrade`); newer ones are refused.
pub const FORMAT_VERSION: u32 = 2;
/// First byte of every format-2 record value.
pub const VALUE_MSGPACK: u8 = 2;
/// First byte of every format-1 record value (bincode 1 follows).
pub const VALUE_BINCODE1: u8 = 1;
/// No record is larger than this (inodes with 1024-server layouts are ~10 KiB).
const RECORD_LIMIT: usize = 1 << 20;

/// A record the metadata store keeps: how it is stored, and the conversions.
pub trait Record: Sized {
    type Stored: Serialize + DeserializeOwned;
    fn to_stored(&self) -> Self::Stored;
    fn from_stored(s: Self::Stored) -> Self;
}

/// Encode a record: [`VALUE_MSGPACK`] + MessagePack with named fields.
pub fn encode<T: Record>(v: &T) -> Vec<u8> {
    let mut out = vec![VALUE_MSGPACK];
    // Plain structs with string keys into a Vec: serialising cannot fail.
    rmp_serde::encode::write_named(&mut out, &v.to_stored()).expect("record serialises");
    out
}

/// Decode a value written by [`encode`]; any damage is EIO naming `what`, never a panic.
pub fn decode<T: Record>(what: &dyn std::fmt::Display, bytes: &[u8]) -> R<T> {
    match bytes.split_first() {
        Some((&VALUE_MSGPACK, rest)) if rest.len() <= RECORD_LIMIT => rmp_serde::from_slice::<T::Stored>(rest)
            .map(T::from_stored)
            .map_err(|e| Fail::corrupt(format!("{what} does not decode: {e}"))),
        Some((&VALUE_MSGPACK, rest)) => Err(Fail::corrupt(format!("{what} is too large ({} bytes)", rest.len()))),
        Some((&VALUE_BINCODE1, _)) => Err(Fail::corrupt(format!("{what} is still in format 1 (not upgraded)"))),
        Some((v, _)) => Err(Fail::corrupt(format!("{what} has unknown value format {v}"))),
        None => Err(Fail::corrupt(format!("{what} is empty"))),
    }
}

// ---- The stored types (format 2). Field and variant names are on disk: never rename. ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Time {
    pub secs: i64,
    pub nsecs: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLayout {
    pub stripe_size: u64,
    /// Server ids holding objects 0, 1, …
    pub servers: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Policy {
    Same,
    Spread,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLayoutSpec {
    pub stripe_size: Option<u64>,
    pub stripe_count: Option<u32>,
    pub first_server: Option<u32>,
    pub policy: Option<Policy>,
}

/// `i` ino.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub kind: Kind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub layout: Option<StoredLayout>,
    pub dir_default: Option<StoredLayoutSpec>,
    pub parent: Option<u64>,
    pub target: Option<String>,
}

/// `e` dir-ino name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub ino: u64,
    pub kind: Kind,
}

/// The operation of an intent (`t` op-id); see `meta::Intent`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IntentOp {
    Mkdir { dir: u64, name: String, ino: u64 },
    Link { dir: u64, name: String, ino: u64, kind: Kind },
    Unlink { ino: u64 },
    Rmdir { dir: u64, name: String, ino: u64 },
    Rename { src_dir: u64, src_name: String, dst_dir: u64, dst_name: String, ino: u64, kind: Kind, noreplace: bool },
    SetParent { ino: u64, parent: u64 },
    UnlinkKeep { ino: u64, session: u64 },
}

/// `t` op-id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredIntent {
    pub created: i64,
    pub op: IntentOp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredDirEntry {
    pub name: String,
    pub ino: u64,
    pub kind: Kind,
}

/// What an applied peer step answered: the only replies peer steps keep.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AppliedReply {
    /// `PeerMkdirObject`.
    Ok,
    /// `PeerLinkDelta`: the new link count.
    NLink { nlink: u32 },
    /// `PeerRenameIn`: the entry the rename replaced.
    Replaced { entry: Option<StoredDirEntry> },
}

/// `o` op-id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub created: i64,
    pub reply: AppliedReply,
}

/// `g` ino.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gc {
    pub created: i64,
    pub layout: StoredLayout,
}

/// `O` ino.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    pub session: u64,
    pub since: i64,
}

// ---- Conversions between the stored types and the server's records (wire types). ----

impl From<FileKind> for Kind {
    fn from(k: FileKind) -> Kind {
        match k {
            FileKind::File => Kind::File,
            FileKind::Dir => Kind::Dir,
            FileKind::Symlink => Kind::Symlink,
        }
    }
}

impl From<Kind> for FileKind {
    fn from(k: Kind) -> FileKind {
        match k {
            Kind::File => FileKind::File,
            Kind::Dir => FileKind::Dir,
            Kind::Symlink => FileKind::Symlink,
        }
    }
}

impl From<Timestamp> for Time {
    fn from(t: Timestamp) -> Time {
        Time { secs: t.secs, nsecs: t.nsecs }
    }
}

impl From<Time> for Timestamp {
    fn from(t: Time) -> Timestamp {
        Timestamp { secs: t.secs, nsecs: t.nsecs }
    }
}

impl From<&Layout> for StoredLayout {
    fn from(l: &Layout) -> StoredLayout {
        StoredLayout { stripe_size: l.stripe_size, servers: l.servers.iter().map(|s| s.0).collect() }
    }
}

impl From<StoredLayout> for Layout {
    fn from(l: StoredLayout) -> Layout {
        Layout { stripe_size: l.stripe_size, servers: l.servers.into_iter().map(ServerId).collect() }
    }
}

impl From<PlacementPolicy> for Policy {
    fn from(p: PlacementPolicy) -> Policy {
        match p {
            PlacementPolicy::Same => Policy::Same,
            PlacementPolicy::Spread => Policy::Spread,
        }
    }
}

impl From<Policy> for PlacementPolicy {
    fn from(p: Policy) -> PlacementPolicy {
        match p {
            Policy::Same => PlacementPolicy::Same,
            Policy::Spread => PlacementPolicy::Spread,
        }
    }
}

impl From<&LayoutSpec> for StoredLayoutSpec {
    fn from(s: &LayoutSpec) -> StoredLayoutSpec {
        StoredLayoutSpec {
            stripe_size: s.stripe_size,
            stripe_count: s.stripe_count,
            first_server: s.first_server.map(|s| s.0),
            policy: s.policy.map(Policy::from),
        }
    }
}

impl From<StoredLayoutSpec> for LayoutSpec {
    fn from(s: StoredLayoutSpec) -> LayoutSpec {
        LayoutSpec {
            stripe_size: s.stripe_size,
            stripe_count: s.stripe_count,
            first_server: s.first_server.map(ServerId),
            policy: s.policy.map(PlacementPolicy::from),
        }
    }
}

impl Record for InodeRecord {
    type Stored = Inode;
    fn to_stored(&self) -> Inode {
        Inode {
            kind: self.kind.into(),
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            nlink: self.nlink,
            atime: self.atime.into(),
            mtime: self.mtime.into(),
            ctime: self.ctime.into(),
            layout: self.layout.as_ref().map(StoredLayout::from),
            dir_default: self.dir_default.as_ref().map(StoredLayoutSpec::from),
            parent: self.parent.map(|p| p.0),
            target: self.target.clone(),
        }
    }
    fn from_stored(s: Inode) -> InodeRecord {
        InodeRecord {
            kind: s.kind.into(),
            perm: s.perm,
            uid: s.uid,
            gid: s.gid,
            size: s.size,
            nlink: s.nlink,
            atime: s.atime.into(),
            mtime: s.mtime.into(),
            ctime: s.ctime.into(),
            layout: s.layout.map(Layout::from),
            dir_default: s.dir_default.map(LayoutSpec::from),
            parent: s.parent.map(Ino),
            target: s.target,
        }
    }
}

impl Record for EntryRecord {
    type Stored = Entry;
    fn to_stored(&self) -> Entry {
        Entry { ino: self.ino.0, kind: self.kind.into() }
    }
    fn from_stored(s: Entry) -> EntryRecord {
        EntryRecord { ino: Ino(s.ino), kind: s.kind.into() }
    }
}

impl From<&Intent> for IntentOp {
    fn from(i: &Intent) -> IntentOp {
        match i.clone() {
            Intent::Mkdir { dir, name, ino } => IntentOp::Mkdir { dir: dir.0, name, ino: ino.0 },
            Intent::Link { dir, name, ino, kind } => IntentOp::Link { dir: dir.0, name, ino: ino.0, kind: kind.into() },
            Intent::Unlink { ino } => IntentOp::Unlink { ino: ino.0 },
            Intent::Rmdir { dir, name, ino } => IntentOp::Rmdir { dir: dir.0, name, ino: ino.0 },
            Intent::Rename { src_dir, src_name, dst_dir, dst_name, ino, kind, noreplace } => IntentOp::Rename {
                src_dir: src_dir.0,
                src_name,
                dst_dir: dst_dir.0,
                dst_name,
                ino: ino.0,
                kind: kind.into(),
                noreplace,
            },
            Intent::SetParent { ino, parent } => IntentOp::SetParent { ino: ino.0, parent: parent.0 },
            Intent::UnlinkKeep { ino, session } => IntentOp::UnlinkKeep { ino: ino.0, session },
        }
    }
}

impl From<IntentOp> for Intent {
    fn from(i: IntentOp) -> Intent {
        match i {
            IntentOp::Mkdir { dir, name, ino } => Intent::Mkdir { dir: Ino(dir), name, ino: Ino(ino) },
            IntentOp::Link { dir, name, ino, kind } => {
                Intent::Link { dir: Ino(dir), name, ino: Ino(ino), kind: kind.into() }
            }
            IntentOp::Unlink { ino } => Intent::Unlink { ino: Ino(ino) },
            IntentOp::Rmdir { dir, name, ino } => Intent::Rmdir { dir: Ino(dir), name, ino: Ino(ino) },
            IntentOp::Rename { src_dir, src_name, dst_dir, dst_name, ino, kind, noreplace } => Intent::Rename {
                src_dir: Ino(src_dir),
                src_name,
                dst_dir: Ino(dst_dir),
                dst_name,
                ino: Ino(ino),
                kind: kind.into(),
                noreplace,
            },
            IntentOp::SetParent { ino, parent } => Intent::SetParent { ino: Ino(ino), parent: Ino(parent) },
            IntentOp::UnlinkKeep { ino, session } => Intent::UnlinkKeep { ino: Ino(ino), session },
        }
    }
}

impl Record for IntentRecord {
    type Stored = StoredIntent;
    fn to_stored(&self) -> StoredIntent {
        StoredIntent { created: self.created, op: (&self.intent).into() }
    }
    fn from_stored(s: StoredIntent) -> IntentRecord {
        IntentRecord { created: s.created, intent: s.op.into() }
    }
}

impl AppliedReply {
    /// The stored form of a peer step's reply; `None` for replies no peer step keeps.
    pub fn from_wire(r: &Reply) -> Option<AppliedReply> {
        Some(match r {
            Reply::Ok => AppliedReply::Ok,
            Reply::NLink(nlink) => AppliedReply::NLink { nlink: *nlink },
            Reply::Replaced(e) => AppliedReply::Replaced {
                entry: e.as_ref().map(|e| StoredDirEntry { name: e.name.clone(), ino: e.ino.0, kind: e.kind.into() }),
            },
            _ => return None,
        })
    }

    pub fn into_wire(self) -> Reply {
        match self {
            AppliedReply::Ok => Reply::Ok,
            AppliedReply::NLink { nlink } => Reply::NLink(nlink),
            AppliedReply::Replaced { entry } => {
                Reply::Replaced(entry.map(|e| DirEntry { name: e.name, ino: Ino(e.ino), kind: e.kind.into() }))
            }
        }
    }
}

impl Record for AppliedRecord {
    type Stored = Applied;
    fn to_stored(&self) -> Applied {
        Applied { created: self.created, reply: self.reply.clone() }
    }
    fn from_stored(s: Applied) -> AppliedRecord {
        AppliedRecord { created: s.created, reply: s.reply }
    }
}

impl Record for GcRecord {
    type Stored = Gc;
    fn to_stored(&self) -> Gc {
        Gc { created: self.created, layout: (&self.layout).into() }
    }
    fn from_stored(s: Gc) -> GcRecord {
        GcRecord { created: s.created, layout: s.layout.into() }
    }
}

impl Record for OrphanRecord {
    type Stored = Orphan;
    fn to_stored(&self) -> Orphan {
        Orphan { session: self.session, since: self.since }
    }
    fn from_stored(s: Orphan) -> OrphanRecord {
        OrphanRecord { session: s.session, since: s.since }
    }
}

/// Format 1, read-only: values were byte 1 + bincode 1 (fixed-width little-endian integers,
/// `u64` lengths, `u8` option and bool tags, `u32` variant indexes) of the records of that
/// time, which held wire types. Frozen: it describes stores already written (see
/// docs/formats.md, "Format 1").
pub mod v1 {
    use super::*;

    /// A cursor over a format-1 value (after its leading byte).
    struct Rd<'a> {
        b: &'a [u8],
    }

    type D<T> = Result<T, String>;

    impl<'a> Rd<'a> {
        fn take(&mut self, n: usize) -> D<&'a [u8]> {
            if self.b.len() < n {
                return Err(format!("ends early ({} bytes left, {n} needed)", self.b.len()));
            }
            let (h, t) = self.b.split_at(n);
            self.b = t;
            Ok(h)
        }
        fn u8(&mut self) -> D<u8> {
            Ok(self.take(1)?[0])
        }
        fn u32(&mut self) -> D<u32> {
            Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
        }
        fn u64(&mut self) -> D<u64> {
            Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
        }
        fn i64(&mut self) -> D<i64> {
            Ok(self.u64()? as i64)
        }
        fn bool(&mut self) -> D<bool> {
            match self.u8()? {
                0 => Ok(false),
                1 => Ok(true),
                b => Err(format!("bool byte {b}")),
            }
        }
        fn len(&mut self) -> D<usize> {
            let n = self.u64()?;
            if n > self.b.len() as u64 {
                return Err(format!("length {n} beyond the value"));
            }
            Ok(n as usize)
        }
        fn string(&mut self) -> D<String> {
            let n = self.len()?;
            String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "string is not UTF-8".to_string())
        }
        fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> D<T>) -> D<Option<T>> {
            match self.u8()? {
                0 => Ok(None),
                1 => Ok(Some(f(self)?)),
                b => Err(format!("option tag {b}")),
            }
        }
        fn ino(&mut self) -> D<Ino> {
            Ok(Ino(self.u64()?))
        }
        fn kind(&mut self) -> D<FileKind> {
            match self.u32()? {
                0 => Ok(FileKind::File),
                1 => Ok(FileKind::Dir),
                2 => Ok(FileKind::Symlink),
                v => Err(format!("file kind {v}")),
            }
        }
        fn time(&mut self) -> D<Timestamp> {
            Ok(Timestamp { secs: self.i64()?, nsecs: self.u32()? })
        }
        fn layout(&mut self) -> D<Layout> {
            let stripe_size = self.u64()?;
            let n = self.u64()?;
            if n > self.b.len() as u64 / 4 {
                return Err(format!("{n} servers beyond the value"));
            }
            let servers = (0..n).map(|_| self.u32().map(ServerId)).collect::<D<_>>()?;
            Ok(Layout { stripe_size, servers })
        }
        fn spec(&mut self) -> D<LayoutSpec> {
            Ok(LayoutSpec {
                stripe_size: self.opt(Self::u64)?,
                stripe_count: self.opt(Self::u32)?,
                first_server: self.opt(|r| r.u32().map(ServerId))?,
                policy: self.opt(|r| match r.u32()? {
                    0 => Ok(PlacementPolicy::Same),
                    1 => Ok(PlacementPolicy::Spread),
                    v => Err(format!("placement policy {v}")),
                })?,
            })
        }
        fn done<T>(self, v: T) -> D<T> {
            match self.b.len() {
                0 => Ok(v),
                n => Err(format!("{n} bytes after the record")),
            }
        }
    }

    /// Decode a format-1 value (leading byte included) with `f`.
    fn decode<T>(bytes: &[u8], f: impl FnOnce(&mut Rd) -> D<T>) -> D<T> {
        match bytes.split_first() {
            Some((&VALUE_BINCODE1, rest)) => {
                let mut r = Rd { b: rest };
                let v = f(&mut r)?;
                r.done(v)
            }
            Some((b, _)) => Err(format!("value format byte {b}, not 1")),
            None => Err("empty value".into()),
        }
    }

    pub fn inode(bytes: &[u8]) -> D<InodeRecord> {
        decode(bytes, |r| {
            Ok(InodeRecord {
                kind: r.kind()?,
                perm: r.u32()?,
                uid: r.u32()?,
                gid: r.u32()?,
                size: r.u64()?,
                nlink: r.u32()?,
                atime: r.time()?,
                mtime: r.time()?,
                ctime: r.time()?,
                layout: r.opt(Rd::layout)?,
                dir_default: r.opt(Rd::spec)?,
                parent: r.opt(Rd::ino)?,
                target: r.opt(Rd::string)?,
            })
        })
    }

    pub fn entry(bytes: &[u8]) -> D<EntryRecord> {
        decode(bytes, |r| Ok(EntryRecord { ino: r.ino()?, kind: r.kind()? }))
    }

    pub fn intent(bytes: &[u8]) -> D<IntentRecord> {
        decode(bytes, |r| {
            let created = r.i64()?;
            let intent = match r.u32()? {
                0 => Intent::Mkdir { dir: r.ino()?, name: r.string()?, ino: r.ino()? },
                1 => Intent::Link { dir: r.ino()?, name: r.string()?, ino: r.ino()?, kind: r.kind()? },
                2 => Intent::Unlink { ino: r.ino()? },
                3 => Intent::Rmdir { dir: r.ino()?, name: r.string()?, ino: r.ino()? },
                4 => Intent::Rename {
                    src_dir: r.ino()?,
                    src_name: r.string()?,
                    dst_dir: r.ino()?,
                    dst_name: r.string()?,
                    ino: r.ino()?,
                    kind: r.kind()?,
                    noreplace: r.bool()?,
                },
                5 => Intent::SetParent { ino: r.ino()?, parent: r.ino()? },
                6 => Intent::UnlinkKeep { ino: r.ino()?, session: r.u64()? },
                v => return Err(format!("intent variant {v}")),
            };
            Ok(IntentRecord { created, intent })
        })
    }

    /// `Reply` variant indexes of format 1 for the replies peer steps kept.
    const REPLY_OK: u32 = 1;
    const REPLY_NLINK: u32 = 10;
    const REPLY_REPLACED: u32 = 11;

    pub fn applied(bytes: &[u8]) -> D<AppliedRecord> {
        decode(bytes, |r| {
            let created = r.i64()?;
            let reply = match r.u32()? {
                REPLY_OK => AppliedReply::Ok,
                REPLY_NLINK => AppliedReply::NLink { nlink: r.u32()? },
                REPLY_REPLACED => AppliedReply::Replaced {
                    entry: r
                        .opt(|r| Ok(StoredDirEntry { name: r.string()?, ino: r.u64()?, kind: r.kind()?.into() }))?,
                },
                v => return Err(format!("reply variant {v}, which no peer step keeps")),
            };
            Ok(AppliedRecord { created, reply })
        })
    }

    pub fn gc(bytes: &[u8]) -> D<GcRecord> {
        decode(bytes, |r| Ok(GcRecord { created: r.i64()?, layout: r.layout()? }))
    }

    pub fn orphan(bytes: &[u8]) -> D<OrphanRecord> {
        decode(bytes, |r| Ok(OrphanRecord { session: r.u64()?, since: r.i64()? }))
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
            layout: Some(Layout { stripe_size: 4096, servers: vec![ServerId(0), ServerId(2)] }),
            dir_default: None,
            parent: None,
            target: None,
        }
    }

    /// Golden vectors: the bytes docs/formats.md shows. A change here is a format change:
    /// it needs a new format version and an upgrade, not a new vector.
    #[test]
    fn records_encode_to_the_documented_bytes() {
        let e = EntryRecord { ino: Ino(0x1234), kind: FileKind::Dir };
        // 02, map of 2: "ino": 0x1234 (uint16), "kind": "Dir"
        assert_eq!(hex(&encode(&e)), "0282a3696e6fcd1234a46b696e64a3446972");
        let o = OrphanRecord { session: 7, since: 1_700_000_000 };
        assert_eq!(hex(&encode(&o)), "0282a773657373696f6e07a573696e6365ce6553f100");
        let i = IntentRecord { created: 9, intent: Intent::Unlink { ino: Ino(5) } };
        assert_eq!(hex(&encode(&i)), "0282a76372656174656409a26f7081a6556e6c696e6b81a3696e6f05");
        let a = AppliedRecord { created: 1, reply: AppliedReply::NLink { nlink: 2 } };
        assert_eq!(hex(&encode(&a)), "0282a76372656174656401a57265706c7981a54e4c696e6b81a56e6c696e6b02");
        let bytes = encode(&inode());
        assert_eq!(
            hex(&bytes),
            "028da46b696e64a446696c65a47065726dcd01a4a375696401a367696402a473697a6503a56e6c696e6b01\
             a56174696d6582a473656373 05a56e7365637306a56d74696d6582a47365637305a56e7365637306\
             a56374696d6582a47365637305a56e7365637306a66c61796f757482ab7374726970655f73697a65cd1000\
             a773657276657273920002ab6469725f64656661756c74c0a6706172656e74c0a6746172676574c0"
                .replace(' ', "")
        );
        assert_eq!(decode::<InodeRecord>(&"inode", &bytes).unwrap(), inode());
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
            let r = IntentRecord { created: -1, intent };
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
