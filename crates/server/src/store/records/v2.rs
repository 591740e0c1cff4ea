//! Format 2, read only by the upgrade: values were byte 2 + MessagePack of these types, every
//! struct a map keyed by field name and every enum variant tagged by its name
//! (`rmp_serde::to_vec_named`). Frozen: it describes stores already written (see
//! docs/formats.md, "Format 2").

use crate::store::meta::{AppliedRecord, EntryRecord, GcRecord, InodeRecord, Intent, IntentRecord, OrphanRecord};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use shoal_proto::msg::{DirEntry, FileKind, Layout, LayoutSpec, PlacementPolicy, Timestamp};
use shoal_proto::{Ino, ServerId};

/// First byte of every format-2 record value.
pub const VALUE: u8 = 2;

type D<T> = Result<T, String>;

fn dec<T: DeserializeOwned>(bytes: &[u8]) -> D<T> {
    match bytes.split_first() {
        Some((&VALUE, rest)) => rmp_serde::from_slice(rest).map_err(|e| e.to_string()),
        Some((b, _)) => Err(format!("value format {b}, not 2")),
        None => Err("empty value".into()),
    }
}

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

/// What an applied peer step answered.
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

fn kind(k: Kind) -> FileKind {
    match k {
        Kind::File => FileKind::File,
        Kind::Dir => FileKind::Dir,
        Kind::Symlink => FileKind::Symlink,
    }
}

fn time(t: Time) -> Timestamp {
    Timestamp { secs: t.secs, nsecs: t.nsecs }
}

fn layout(l: StoredLayout) -> Layout {
    // Formats 1 and 2 knew one copy only.
    Layout { stripe_size: l.stripe_size, servers: l.servers.into_iter().map(ServerId).collect(), replicas: 1 }
}

pub fn inode(bytes: &[u8]) -> D<InodeRecord> {
    let s: Inode = dec(bytes)?;
    Ok(InodeRecord {
        kind: kind(s.kind),
        perm: s.perm,
        uid: s.uid,
        gid: s.gid,
        size: s.size,
        nlink: s.nlink,
        atime: time(s.atime),
        mtime: time(s.mtime),
        ctime: time(s.ctime),
        layout: s.layout.map(layout),
        dir_default: s.dir_default.map(|d| LayoutSpec {
            stripe_size: d.stripe_size,
            stripe_count: d.stripe_count,
            first_server: d.first_server.map(ServerId),
            policy: d.policy.map(|p| match p {
                Policy::Same => PlacementPolicy::Same,
                Policy::Spread => PlacementPolicy::Spread,
            }),
            replicas: None,
        }),
        parent: s.parent.map(Ino),
        target: s.target,
        bitmap: Vec::new(),
        read_mostly: false,
    })
}

pub fn entry(bytes: &[u8]) -> D<EntryRecord> {
    let s: Entry = dec(bytes)?;
    Ok(EntryRecord { ino: Ino(s.ino), kind: kind(s.kind) })
}

pub fn intent(bytes: &[u8]) -> D<IntentRecord> {
    let s: StoredIntent = dec(bytes)?;
    let intent = match s.op {
        IntentOp::Mkdir { dir, name, ino } => Intent::Mkdir { dir: Ino(dir), name, ino: Ino(ino) },
        IntentOp::Link { dir, name, ino, kind: k } => {
            Intent::Link { dir: Ino(dir), name, ino: Ino(ino), kind: kind(k) }
        }
        IntentOp::Unlink { ino } => Intent::Unlink { ino: Ino(ino) },
        IntentOp::Rmdir { dir, name, ino } => Intent::Rmdir { dir: Ino(dir), name, ino: Ino(ino) },
        IntentOp::Rename { src_dir, src_name, dst_dir, dst_name, ino, kind: k, noreplace } => Intent::Rename {
            src_dir: Ino(src_dir),
            src_name,
            dst_dir: Ino(dst_dir),
            dst_name,
            ino: Ino(ino),
            kind: kind(k),
            noreplace,
        },
        IntentOp::SetParent { ino, parent } => Intent::SetParent { ino: Ino(ino), parent: Ino(parent) },
        IntentOp::UnlinkKeep { ino, session } => Intent::UnlinkKeep { ino: Ino(ino), session },
    };
    Ok(IntentRecord { created: s.created, intent, reply_to: None })
}

pub fn applied(bytes: &[u8]) -> D<AppliedRecord> {
    let s: Applied = dec(bytes)?;
    let reply = match s.reply {
        AppliedReply::Ok => super::AppliedReply::Ok,
        AppliedReply::NLink { nlink } => super::AppliedReply::NLink { nlink },
        AppliedReply::Replaced { entry } => super::AppliedReply::Replaced {
            entry: entry.map(|e| DirEntry { name: e.name, ino: Ino(e.ino), kind: kind(e.kind) }),
        },
    };
    Ok(AppliedRecord { created: s.created, reply })
}

pub fn gc(bytes: &[u8]) -> D<GcRecord> {
    let s: Gc = dec(bytes)?;
    Ok(GcRecord { created: s.created, layout: layout(s.layout) })
}

pub fn orphan(bytes: &[u8]) -> D<OrphanRecord> {
    let s: Orphan = dec(bytes)?;
    Ok(OrphanRecord { session: s.session, since: s.since })
}
