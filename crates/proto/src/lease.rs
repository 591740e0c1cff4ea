//! Directory leases (docs/protocol.md, "Leases"; docs/architecture.md, "Leases").
//!
//! A client that negotiated [`crate::hello::FEATURE_LEASES`] may ask, in a `Lookup` or a
//! `ReadDir`, for a lease on the directory: while it holds one, it may answer lookups of the
//! names it learnt under it (including "no such name") and, after a complete listing, any
//! lookup and the listing itself, from its cache. The server grants by wrapping its answer
//! in [`crate::msg::Reply::Leased`], and revokes a lease before a change of the directory's
//! entries takes effect for anyone but the holder: it sends a [`Notice::Revoke`] on the
//! connection the lease was granted on and waits for the holder's `Op::LeaseAck`, or for the
//! lease to run out (plus a margin for clock drift), before it answers the change.
//!
//! A lease is keyed by (directory, partition): the partition index is 0 until directories
//! are split over servers (GIGA+); a lease then covers the names of one partition only.
//!
//! **Attribute leases.** A client that also negotiated [`crate::hello::FEATURE_ATTR_LEASES`]
//! gets, with the attributes of an inode whose home is the answering server, a lease on
//! those attributes (key [`LeaseKey::attrs`]): in `Reply::Leased` with
//! [`LeasedReply::Attr`] for `GetAttr` and `SetAttr`, in [`EntryOut::attr_lease`] for the
//! entry of a `Lookup`, `Create`, `Mkdir`, `Symlink` or `Link`. While it holds one, the
//! client may answer for the inode's attributes from its cache: the home server revokes it
//! (the same `Notice::Revoke` and `Op::LeaseAck`) before any change of the inode's record
//! by another session takes effect — a size or time raised by a write, a `SetAttr`, a link
//! count, a removal.

use crate::msg::{Attr, DirEntry, EntryOut};
use crate::Ino;
use serde::{Deserialize, Serialize};

/// What a lease covers: the entries of one partition of one directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseKey {
    /// The directory; for an attribute lease, the inode (of any kind).
    pub dir: Ino,
    /// GIGA+ partition index of the directory (0 while directories are not split; 0 for an
    /// attribute lease).
    pub partition: u32,
    /// An attribute lease: the key names the attributes of inode `dir`, not entries.
    #[serde(default, skip_serializing_if = "is_false")]
    pub attrs: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl LeaseKey {
    /// The key of a whole, unsplit directory.
    pub fn dir(dir: Ino) -> LeaseKey {
        LeaseKey { dir, partition: 0, attrs: false }
    }

    /// The key of the attributes of inode `ino`.
    pub fn attrs(ino: Ino) -> LeaseKey {
        LeaseKey { dir: ino, partition: 0, attrs: true }
    }
}

/// A lease asked for in a `Lookup` or `ReadDir` (its optional last field `lease`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAsk {
    /// How long the client would like it, in milliseconds (the server may give less).
    pub ms: u32,
}

/// A lease the server granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// Names the lease in a revocation and in the holder's acknowledgement. Unique within
    /// the server's run; a holder asking again while it holds one gets the same id back,
    /// extended.
    pub id: u64,
    pub key: LeaseKey,
    /// How long it holds, in milliseconds, counted by the holder from when it SENT the
    /// request (so the holder's expiry comes before the server's, whatever the delays).
    pub ms: u32,
    /// The depth of partition `key.partition` on the granting server: the lease covers the
    /// names whose hash has `key.partition` in its low `depth` bits (0: every name of an
    /// unsplit directory). A split of the partition revokes the lease first, so the depth
    /// holds as long as the lease does.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub depth: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The answer inside a [`crate::msg::Reply::Leased`]: what the request would have had
/// without a lease (a negative lookup is `Absent` instead of an `ENOENT` error).
// Made once per reply and moved a few times: boxing the entry would cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeasedReply {
    /// `Lookup`: the entry.
    Entry(EntryOut),
    /// `Lookup`: no such name.
    Absent,
    /// `ReadDir`: a page of entries; with `more: false` and no `after` in the request, the
    /// whole directory (partition), which the holder may then list and search locally.
    DirEntries {
        entries: Vec<DirEntry>,
        more: bool,
        /// As in `Reply::DirEntries`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        part: Option<crate::msg::PartRef>,
    },
    /// `GetAttr` or `SetAttr` under an attribute lease (the grant's key is
    /// [`LeaseKey::attrs`]): the attributes.
    Attr(Attr),
}

/// A reference to one lease in a revocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRef {
    pub id: u64,
    pub key: LeaseKey,
}

/// A message a server sends on a client's connection unasked (frame kind 2, "notice"):
/// only on a connection that negotiated `FEATURE_LEASES`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Notice {
    /// Stop answering from these leases now, then acknowledge with `Op::LeaseAck`.
    Revoke { leases: Vec<LeaseRef> },
}

impl Notice {
    /// This notice's code in the frame header (notices have codes of their own, like
    /// requests and replies; never 0, never reused).
    pub fn code(&self) -> u16 {
        match self {
            Notice::Revoke { .. } => 1,
        }
    }
}
