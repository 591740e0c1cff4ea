//! Request and reply messages. Client operations and server-to-server (peer) operations
//! share one enum so that one codec, one dispatcher and one set of counters serve both.
//!
//! Bulk data (the payload of [`Op::Write`], the bytes answering [`Op::Read`]) is not part of
//! these messages: it travels as the raw data section of the frame.

use crate::cap::Capability;
use crate::{Errno, Ino, ServerId};
use serde::{Deserialize, Serialize};

/// Longest file name a directory entry may have (as on Linux).
pub const NAME_MAX: usize = 255;
/// Longest symlink target and longest path the client accepts.
pub const PATH_MAX: usize = 4096;
/// Most entries one `ReadDir` reply carries.
pub const READDIR_MAX: u32 = 4096;
/// Most operations one `Batch` request carries.
pub const BATCH_MAX: usize = 1024;
/// Most extended attribute value bytes.
pub const XATTR_VALUE_MAX: usize = 65536;
/// Most servers a layout may stripe over.
pub const STRIPE_COUNT_MAX: u32 = 1024;
/// Largest stripe size (and smallest is 4 KiB, a multiple of 4 KiB is required).
pub const STRIPE_SIZE_MAX: u64 = 1 << 30;
pub const STRIPE_SIZE_MIN: u64 = 4096;
/// Most copies of a file's data (and of the cluster's metadata) a layout may ask for; the
/// least is 1 (docs/replicas.md).
pub const REPLICAS_MAX: u8 = 3;

/// The replica count of a layout, a `copies` field or a cluster that says nothing: one copy,
/// as before replication existed. Fields holding it are left out of the encoding, so a
/// message or record with one copy is byte for byte what older code sent and reads.
pub fn one_copy() -> u8 {
    1
}

/// Whether `n` is the default replica count (see [`one_copy`]); for `skip_serializing_if`.
pub fn is_one_copy(n: &u8) -> bool {
    *n == 1
}

/// Who is asking. Servers check permissions against these (the cluster trusts its clients
/// to report them honestly, as NFS with AUTH_SYS does; see docs/architecture.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn root() -> Cred {
        Cred { uid: 0, gid: 0, groups: Vec::new() }
    }

    /// The credentials of the calling process, with all its supplementary groups (Linux
    /// allows up to 65,536; the protocol carries them all, see docs/protocol.md).
    pub fn current() -> Cred {
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Cred { uid, gid, groups: supplementary_groups() }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The calling process's supplementary groups, however many. getgroups(2) fails (EINVAL)
/// when the buffer is too small rather than filling part of it, so the count is asked
/// first; the list can grow between the two calls (another thread's setgroups), hence the
/// loop.
fn supplementary_groups() -> Vec<u32> {
    loop {
        // SAFETY: with size 0 getgroups only returns the count and writes nothing.
        let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        if count <= 0 {
            return Vec::new();
        }
        let mut groups = vec![0 as libc::gid_t; count as usize];
        // SAFETY: the buffer holds `count` entries, the size passed.
        let n = unsafe { libc::getgroups(count, groups.as_mut_ptr()) };
        if n >= 0 {
            groups.truncate(n as usize);
            return groups;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
}

/// Seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp {
    pub secs: i64,
    pub nsecs: u32,
}

impl Timestamp {
    pub fn now() -> Timestamp {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timestamp { secs: d.as_secs() as i64, nsecs: d.subsec_nanos() }
    }
}

/// Where a file's bytes live: fixed at create. Stripe `k` (bytes `k*stripe_size ..`) is
/// held by object `k % servers.len()` on server `servers[k % servers.len()]`, at object
/// offset `(k / servers.len()) * stripe_size`. One object per server per file (PVFS).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub stripe_size: u64,
    /// The servers holding objects 0, 1, …; its length is the stripe count.
    pub servers: Vec<ServerId>,
    /// How many copies of each object the file wants (1 ..= [`REPLICAS_MAX`]), resolved at
    /// create: the request, the parent's default, the cluster default, capped to the
    /// cluster's replica count. Absent (older peers and records) means 1.
    #[serde(default = "one_copy", skip_serializing_if = "is_one_copy")]
    pub replicas: u8,
}

/// What a user asks for when creating a file or setting a directory default. Unset fields
/// are inherited (from the parent directory's default, then from the cluster defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutSpec {
    pub stripe_size: Option<u64>,
    /// 0 or `None` means inherit; `u32::MAX` means "all servers".
    pub stripe_count: Option<u32>,
    pub first_server: Option<ServerId>,
    pub policy: Option<PlacementPolicy>,
    /// Copies of each data object, 1 ..= [`REPLICAS_MAX`]; `None` inherits. More than the
    /// cluster keeps (`[cluster] replicas`) is capped to it when a file is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u8>,
}

/// Where the data objects of a new file go (FPFS-S vs FPFS-R).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PlacementPolicy {
    /// Object 0 on the inode's home server: create, stat, write and unlink of a small file
    /// touch one server.
    Same,
    /// Objects start at a server chosen by hashing the inode number: spreads load.
    Spread,
    /// Objects go to the least-loaded servers the creating server knows of (queue depth,
    /// bandwidth in use, latency, free space; exchanged by `PeerLoad`). Added in protocol 7:
    /// a server of before cannot decode it (docs/architecture.md, "Load-aware placement").
    Load,
}

/// Inode attributes, as returned by every call that names a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits and set-id/sticky bits (the low 12 bits of st_mode).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Bytes allocated on disk (sum over objects when known; 0 otherwise).
    pub blocks_bytes: u64,
    /// Regular files: where the data lives. Directories: `None` (see `dir_default`).
    pub layout: Option<Layout>,
    /// Directories: the default layout spec for new files (inherited by subdirectories).
    pub dir_default: Option<LayoutSpec>,
    /// Directories: the parent directory (root's parent is itself).
    pub parent: Option<Ino>,
    /// Read-mostly (docs/loading.md): set explicitly (`Op::SetReadMostly`) on a file or a
    /// directory, inherited by what is created in a read-mostly directory. Clients cache
    /// a read-mostly directory's whole listing under its lease and answer look-ups in it,
    /// "no such name" included, from that listing. Added in protocol 9; absent = false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_mostly: bool,
}

/// For `skip_serializing_if`: a `false` flag is left out of the body.
fn is_false(b: &bool) -> bool {
    !*b
}

/// A piece of a list read or write: `len` bytes at `offset` in object `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectPiece {
    pub index: u32,
    pub offset: u64,
    pub len: u32,
}

/// A piece of a `FetchInto`: the remote file's bytes `file_offset .. file_offset + len`,
/// stored at `offset` in the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchPiece {
    pub file_offset: u64,
    pub offset: u64,
    pub len: u64,
}

/// Most pieces in one `FetchInto`.
pub const MAX_FETCH_PIECES: usize = 1 << 12;

/// What a server learnt of a URL (`UrlProbe`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlInfo {
    /// The size of the remote file, when its server said.
    pub size: Option<u64>,
    /// Whether its server answers byte ranges (`206 Partial Content`).
    pub ranges: bool,
    /// Its strong entity tag, if it gave one (weak ones cannot guard ranges).
    pub etag: Option<String>,
}

/// Most pieces in one `ReadList` or `WriteList`.
pub const MAX_LIST_PIECES: usize = 1 << 16;

/// A directory entry joined with what the entry's server knows of the inode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryOut {
    pub ino: Ino,
    pub kind: FileKind,
    /// Present when the inode lives on the same server as the entry (the common case for
    /// files under the `same` policy); otherwise the client asks the inode's home server.
    pub attr: Option<Attr>,
    /// In a `Create` reply from the inode's home server (cluster with keys): a read-write
    /// capability of the file (`cap.rs`), so that a create-and-write needs no `Open`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<Capability>,
    /// A lease on `attr` (`lease.rs`, "Attribute leases"), for a client that negotiated
    /// `FEATURE_ATTR_LEASES`, when the inode's home answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attr_lease: Option<crate::lease::LeaseGrant>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub ino: Ino,
    pub kind: FileKind,
}

/// Fields to change in a `SetAttr`; `None` leaves a field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttrs {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFlags {
    /// Fail with EEXIST if the target exists (RENAME_NOREPLACE).
    pub noreplace: bool,
    /// Swap source and target atomically (RENAME_EXCHANGE).
    pub exchange: bool,
}

/// Carried by an unlink or rename from a client that has file `ino` open: if the name
/// removed is `ino`'s last, the inode's home keeps it as an *orphan* of client `session`
/// (no name, link count 0, data and attributes intact) until that session sends
/// [`Op::ReleaseOrphan`] or stays disconnected for the server's grace period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepOpen {
    pub ino: Ino,
    pub session: u64,
}

/// How a server is doing: capacity, contents and what it has served.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub id: Option<ServerId>,
    pub map_version: u64,
    pub uptime_secs: u64,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
    pub entries: u64,
    pub data_objects: u64,
    pub pending_intents: u64,
    pub counters: Counters,
    /// The mirrors of this server's slot and how far each has got (docs/resync.md); empty
    /// without replication (and from servers before it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<MirrorStatus>,
}

/// Whether a mirror follows its primary (`ServerStatus::mirrors`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MirrorSync {
    /// Applies every change; replies wait for it.
    InSync,
    /// Being brought up to date (docs/resync.md); replies do not wait for it.
    Resyncing,
    /// Missed changes and is not being resynchronised right now (unreachable, or a
    /// resync failed and is retried).
    OutOfSync,
}

/// One mirror of a primary's slot, as the primary sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorStatus {
    /// The server keeping the copy.
    pub server: ServerId,
    pub state: MirrorSync,
    /// Last position of the primary's replication log it applied.
    pub applied: u64,
    /// The running (or last) resync: bytes of the slot compared so far, of how many.
    pub resync_done_bytes: u64,
    pub resync_total_bytes: u64,
    /// Bytes all resyncs of this mirror shipped since the primary started (what a resync
    /// copied, as opposed to what it compared).
    pub resync_shipped_bytes: u64,
    /// Resyncs of this mirror finished since the primary started.
    pub resyncs: u64,
}

/// Monotonic counters a server keeps since it started; `shoal bench` takes differences.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Requests received from clients (not from other servers).
    pub client_requests: u64,
    /// Requests received from other servers.
    pub peer_requests: u64,
    /// Requests this server sent to other servers.
    pub peer_requests_sent: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub errors: u64,
    /// CPU time (user + system) the server process has used, in nanoseconds: with the
    /// request counts, what one operation costs the servers regardless of what else runs
    /// on the machine.
    pub cpu_ns: u64,
    /// Per-operation counts, by [`Op::name`].
    pub ops: Vec<(String, u64)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFsOut {
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub inodes: u64,
}

/// A request: who asks, which cluster map they route by, and what they want.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub cred: Cred,
    /// The map version the sender routed with. A server with a newer map answers
    /// `Reply::StaleMap` instead of acting (see docs/protocol.md).
    pub map_version: u64,
    pub op: Op,
}

/// Every operation. Client operations go to the server that owns the directory (entry),
/// the inode (`ino`'s home server) or the data object; `Peer*` operations are sent only by
/// servers to each other as steps of operations that span servers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// First frame on every connection. Must stay decodable by every later version: fields
    /// may only be added, as optional ones (see `hello.rs`). Versions 1 to 4 had a single
    /// `protocol_version` here; it is gone (their frames cannot be read by version 5 anyway).
    Hello {
        client: String,
        /// Random id of the client instance (0 for servers): owns the orphans its unlinks
        /// leave (see [`KeepOpen`]); a server reclaims them once no connection of this
        /// session has been open for its grace period. Also the client id of the reply
        /// cache: (session, request id) names a request across reconnections.
        session: u64,
        /// Oldest protocol version the sender speaks.
        min_version: u32,
        /// Newest protocol version the sender speaks.
        max_version: u32,
        /// `FEATURE_*` bits (`hello.rs`) the sender supports; unknown bits are ignored.
        features: u64,
        /// The role the sender claims and its nonce (`auth.rs`); absent under `auth = "none"`
        /// and from connectors that prove nothing (they may then do nothing but `Hello`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        auth: Option<crate::auth::HelloAuth>,
    },

    // ---- namespace: sent to the home server of `dir` ----
    Lookup {
        dir: Ino,
        name: String,
        /// Ask for a lease on the directory (`lease.rs`; granted only on a connection with
        /// `FEATURE_LEASES`): the answer then comes as `Reply::Leased`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease: Option<crate::lease::LeaseAsk>,
    },
    Create {
        dir: Ino,
        name: String,
        perm: u32,
        exclusive: bool,
        layout: Option<LayoutSpec>,
    },
    Mkdir {
        dir: Ino,
        name: String,
        perm: u32,
    },
    Symlink {
        dir: Ino,
        name: String,
        target: String,
    },
    /// Make `dir/name` a new name of `ino`.
    Link {
        ino: Ino,
        dir: Ino,
        name: String,
    },
    Unlink {
        dir: Ino,
        name: String,
        /// The sender has this file open: if the name is its last, keep it as an orphan.
        keep: Option<KeepOpen>,
    },
    Rmdir {
        dir: Ino,
        name: String,
    },
    /// Sent to the home server of `src_dir`, which coordinates.
    Rename {
        src_dir: Ino,
        src_name: String,
        dst_dir: Ino,
        dst_name: String,
        flags: RenameFlags,
        /// The sender has the target open: if it loses its last name, keep it as an orphan.
        keep: Option<KeepOpen>,
    },
    /// A page of at most `limit` entries, in *listing order* (docs/protocol.md, "Listing
    /// order"): by the bit-reversed hash of the name (`shoal_placement::listing_key`), then by
    /// name. The page starts strictly after the name `after`, or, without one, at the first
    /// entry whose listing key is at least `from` (0 without it). It holds entries of one
    /// partition only (the one holding that position on the answering server), and its
    /// reply says which, so that a client pages through a split directory partition by
    /// partition; a position in a partition held elsewhere is answered `Partitions`.
    ReadDir {
        dir: Ino,
        after: Option<String>,
        limit: u32,
        /// Ask for a lease on the directory, as for `Lookup`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease: Option<crate::lease::LeaseAsk>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<u64>,
    },

    // ---- inodes: sent to the home server of `ino` ----
    GetAttr {
        ino: Ino,
    },
    SetAttr {
        ino: Ino,
        set: SetAttrs,
    },
    /// Set a directory's default layout for new files.
    SetDirLayout {
        ino: Ino,
        spec: LayoutSpec,
    },
    /// Mark a file or directory read-mostly, or clear the mark (protocol 9,
    /// `FEATURE_READ_MOSTLY`). Owner or root only. Not recursive: the CLI walks a tree.
    SetReadMostly {
        ino: Ino,
        on: bool,
    },
    /// A metadata query over the entries this server holds (protocol 10, `FEATURE_FIND`;
    /// docs/find.md): a page of those that match `query` and that the caller may see (read
    /// and search permission on their directory), with every directory entry the caller
    /// may see, from `after` (a previous page's `next`) on. Answered `Reply::Found`.
    Find {
        query: crate::find::FindQuery,
        after: Option<Vec<u8>>,
        limit: u32,
    },
    /// Store a tuple on this server (protocol 11, `FEATURE_TUPLES`; docs/tuples.md), the
    /// home of its first field's hash. Answered `Reply::Tuple { tuple: None, seq }`, `seq`
    /// the event that recorded it. With `then`, the trigger's tuple is written too when its
    /// condition holds, in the same step (`tuple::Trigger`).
    TupleWrite {
        tuple: crate::tuple::Tuple,
        then: Option<crate::tuple::Trigger>,
    },
    /// The oldest (with `newest`, the newest) tuple here matching `template`, taken away
    /// when `take`; when there is none, waits up to `wait_ms` (at most 10 s) for one.
    /// Answered `Reply::Tuple`, with `tuple: None` when none came in time.
    TupleRead {
        template: crate::tuple::Template,
        take: bool,
        newest: bool,
        wait_ms: u32,
    },
    /// The events of this server's tuple log after `after` (`None`: from now on) whose
    /// kind is in `kinds` (`tuple::WATCH_*` bits) and whose tuple matches `template`, at
    /// most `limit`; when there is none, waits up to `wait_ms` (at most 10 s). Answered
    /// `Reply::TupleEvents`.
    TupleWatch {
        template: crate::tuple::Template,
        kinds: u8,
        after: Option<u64>,
        limit: u32,
        wait_ms: u32,
    },
    /// The events of this server's change log (protocol 12, `FEATURE_CHANGES`;
    /// docs/changes.md) after `after`, or, when `after` is `None`, after the cursor
    /// `consumer` acknowledged (`None` or a new consumer: from now on), of the kinds in
    /// `kinds` (`change::ChangeKind::bit`) and that the caller may see, at most `limit`;
    /// when there is none, waits up to `wait_ms` (at most 10 s). Answered
    /// `Reply::Changes`.
    Changes {
        after: Option<u64>,
        consumer: Option<String>,
        kinds: u32,
        limit: u32,
        wait_ms: u32,
    },
    /// Consumer `consumer` has handled every event up to `upto` of this server's change
    /// log: kept durably, it is where the consumer continues, and the log keeps what it has
    /// not handled. `forget`: remove the consumer instead. Answered `Reply::Changes` with
    /// no events and `next` the cursor kept (0 once forgotten).
    ChangeAck {
        consumer: String,
        upto: u64,
        #[serde(default, skip_serializing_if = "is_false")]
        forget: bool,
    },
    /// A page of this server's per-directory usage (protocol 13, `FEATURE_USAGE`;
    /// docs/du.md): the directories after `after` (`None`: from the first) that it holds
    /// usage of or the inode of, at most `limit`. Answered `Reply::Usage`.
    Usage {
        after: Option<Ino>,
        limit: u32,
    },
    ReadLink {
        ino: Ino,
    },
    /// Check access as access(2) does: `mask` of R_OK=4, W_OK=2, X_OK=1 (0 = exists).
    Access {
        ino: Ino,
        mask: u32,
    },
    /// Raise the recorded size to at least `size` (after writes to other servers), and
    /// update mtime.
    ExtendSize {
        ino: Ino,
        size: u64,
    },
    SetXattr {
        ino: Ino,
        name: String,
        value: Vec<u8>,
        create_only: bool,
        replace_only: bool,
    },
    GetXattr {
        ino: Ino,
        name: String,
    },
    ListXattr {
        ino: Ino,
    },
    RemoveXattr {
        ino: Ino,
        name: String,
    },

    // ---- data: sent to the server holding object `index` of `ino` ----
    /// Reply carries the bytes in the frame's data section (short at end of object).
    Read {
        ino: Ino,
        index: u32,
        offset: u64,
        len: u32,
        /// The capability the inode's home server gave at open (`cap.rs`); checked by the
        /// server holding the object when the cluster runs with keys.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<Capability>,
    },
    /// The bytes are the frame's data section. If `inode_local` the server also holds the
    /// inode and raises its size to `file_end` (so a small-file write is one request).
    Write {
        ino: Ino,
        index: u32,
        offset: u64,
        file_end: u64,
        inode_local: bool,
        /// The capability the inode's home server gave at open (`cap.rs`); checked by the
        /// server holding the object when the cluster runs with keys.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<Capability>,
        /// How many copies of the object the file wants (its layout's `replicas`), so that
        /// the server holding it can keep them (docs/replicas.md); absent means 1.
        #[serde(default = "one_copy", skip_serializing_if = "is_one_copy")]
        copies: u8,
    },
    /// List I/O (PVFS): many pieces of objects of `ino` on this server in one request. The
    /// reply (`DataList`) carries each piece's bytes back to back in the data section, each
    /// short at the end of its object (none for an object nobody wrote).
    ReadList {
        ino: Ino,
        pieces: Vec<ObjectPiece>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<Capability>,
    },
    /// List I/O: the data section holds the bytes of every piece, in order (its length is
    /// the sum of the pieces' lengths). `file_end` and `inode_local` as in `Write`. Answered
    /// `Written` with the total length; the pieces are stored in order, so a later piece
    /// overlapping an earlier one wins.
    WriteList {
        ino: Ino,
        pieces: Vec<ObjectPiece>,
        file_end: u64,
        inode_local: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<Capability>,
        /// How many copies of the object the file wants (its layout's `replicas`), so that
        /// the server holding it can keep them (docs/replicas.md); absent means 1.
        #[serde(default = "one_copy", skip_serializing_if = "is_one_copy")]
        copies: u8,
    },
    /// Reverse read (`shoal import`, docs/import.md): the server asks the HTTP(S) server of
    /// `url` for its size and whether it serves byte ranges. Answered `UrlInfo`.
    UrlProbe {
        url: String,
    },
    /// Reverse read: the server fetches byte ranges of `url` itself and writes each straight
    /// into its object `index` of `ino`: piece `p` is the file's bytes
    /// `p.file_offset .. + p.len`, stored at `p.offset` in the object. At most `parallel`
    /// range requests run at once. With `etag`, every range request carries `If-Match`, so
    /// that a remote file that changes during the import fails it (`EIO`, saying so) instead of
    /// mixing two versions. Does not change the file's size (the client sets it at the end).
    /// Answered `Fetched` with the bytes stored.
    FetchInto {
        url: String,
        ino: Ino,
        index: u32,
        pieces: Vec<FetchPiece>,
        parallel: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        etag: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<Capability>,
        /// How many copies of the object the file wants (its layout's `replicas`), so that
        /// the server holding it can keep them (docs/replicas.md); absent means 1.
        #[serde(default = "one_copy", skip_serializing_if = "is_one_copy")]
        copies: u8,
    },
    /// Make the objects of `ino` on this server, and this server's metadata log, durable.
    Fsync {
        ino: Ino,
        data_only: bool,
        /// The capability the inode's home server gave at open (`cap.rs`); checked by the
        /// server holding the object when the cluster runs with keys.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<Capability>,
        /// The sync of a handle that wrote and is being closed (protocol 12): the inode's
        /// home logs a `Close` change event.
        #[serde(default, skip_serializing_if = "is_false")]
        closing: bool,
    },

    /// Several namespace operations in one request (many creates, stats or unlinks), each
    /// addressed to this server as it would be alone; at most [`BATCH_MAX`]. The server runs
    /// them one after the other and answers `Reply::Batch` with one result each, in order:
    /// one failing does not stop the others. No data section either way.
    Batch {
        ops: Vec<BatchOp>,
    },

    // ---- whole server ----
    StatFs,
    Status,

    // ---- server to server ----
    /// Create the directory object (inode + empty entry set) on its home server.
    PeerMkdirObject {
        attr: Attr,
        op_id: u64,
    },
    /// Remove a directory object if it is empty (ENOTEMPTY otherwise). Idempotent.
    PeerRmdirObject {
        ino: Ino,
        op_id: u64,
    },
    /// Add `delta` to an inode's link count; at zero the inode and its objects go.
    /// Applied at most once per `op_id`.
    PeerLinkDelta {
        ino: Ino,
        delta: i32,
        op_id: u64,
        /// At zero, keep the inode as an orphan of this client session instead of deleting it.
        orphan_of: Option<u64>,
        /// The client session whose request this step carries out, when known: the inode's
        /// home treats the change as that session's (its attribute lease on the inode is not
        /// revoked: the client drops it itself, `lease.rs`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<u64>,
    },
    /// Insert (or replace) `dst_dir/dst_name` with `entry` as the second step of a rename
    /// coordinated by the source directory's server. Applied at most once per `op_id`.
    PeerRenameIn {
        dst_dir: Ino,
        dst_name: String,
        entry: DirEntry,
        noreplace: bool,
        op_id: u64,
        /// As in `Rename`: the client session that has the replaced target open.
        keep: Option<KeepOpen>,
    },
    /// Set a moved inode's parent pointer (a directory's `..`; for every kind, the directory
    /// its usage counts in, protocol 13).
    PeerSetParent {
        ino: Ino,
        parent: Ino,
    },
    /// Delete these data objects (file, object index) held by this server: the objects of
    /// deleted files, many files per request. Idempotent.
    PeerDeleteObjects {
        objects: Vec<(Ino, u32)>,
    },
    /// Cut this server's object `index` of `ino` to `len` bytes. Idempotent.
    PeerTruncateObject {
        ino: Ino,
        index: u32,
        len: u64,
        /// How many copies of the object the file wants (its layout's `replicas`), so that
        /// the server holding it can keep them (docs/replicas.md); absent means 1.
        #[serde(default = "one_copy", skip_serializing_if = "is_one_copy")]
        copies: u8,
    },

    // ---- added after version 3 shipped: kept last so the earlier variants keep their codes ----
    /// Append the data section to the end of `ino`'s file, atomically: sent to the inode's
    /// home server, which (under the inode's lock) takes the recorded size as the offset,
    /// stores every piece of the range (on itself, and with `Write`s to the servers holding
    /// the other objects), then raises the size, and answers `Appended { offset }`. Appends
    /// from any number of clients therefore never overlap, and one that was answered is
    /// complete. At most `MAX_DATA` bytes.
    Append {
        ino: Ino,
        /// The capability the inode's home server gave at open (`cap.rs`); checked by the
        /// server holding the object when the cluster runs with keys.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<Capability>,
    },
    /// Sent to the home server of `ino` at the last close of a file this client session
    /// kept open after removing its last name: delete the orphan inode and its objects.
    /// Nothing happens unless `ino` is an orphan of `session` (idempotent).
    ReleaseOrphan {
        ino: Ino,
        session: u64,
    },
    /// Start verifying every data object block and every metadata record this server
    /// holds, in the background (`shoal scrub`); answers `Scrub` with the status. A scrub
    /// already running is left to run (and its status answered).
    ScrubStart,
    /// How the current or last scrub is doing: answers `Scrub`.
    ScrubStatus,
    /// Second frame of a connection whose `Hello` claimed a role: the connector's proof
    /// (`proof`, a tag under the key of its role at `epoch`, for peers and hosts) or a
    /// user's `credential`. Answered `Ok`, or an error after which the server closes.
    Authenticate {
        epoch: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proof: Option<Vec<u8>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credential: Option<crate::auth::UserCredential>,
    },
    /// Sent to the home server of `ino` to open it (or renew the capability of a handle):
    /// checks that the sender may have `rights` (`cap::RIGHT_*`) as access(2) would and
    /// answers `Opened` with fresh attributes and a capability. With `renew`, a capability
    /// of this inode with those rights that this server's keys still verify (expired or
    /// not, within one lifetime past its expiry), the permission check is skipped: an open
    /// handle keeps the access it was opened with, as with open(2).
    Open {
        ino: Ino,
        rights: u8,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        renew: Option<Capability>,
    },
    /// Server to the root directory's home server: take (`hold`) or give back the
    /// cluster's directory-move lock for operation `op_id`, which serialises moves of
    /// directories to other parents so that no two can form a loop (docs/architecture.md).
    /// Taking waits while another operation holds it (EBUSY after a few seconds); taking it
    /// again, or giving back a lock not held, changes nothing. Answered `Ok`.
    PeerMoveLock {
        op_id: u64,
        hold: bool,
    },
    /// The holder of these leases stopped answering from them (after a `Notice::Revoke`,
    /// or to give them up): the server forgets them and lets waiting changes go on.
    /// Answered `Ok`; unknown ids are ignored.
    LeaseAck {
        ids: Vec<u64>,
    },
    /// Second step of the split of a directory partition (docs/architecture.md, "Split
    /// directories"): sent by the server of the partition that splits to the server of the
    /// new partition `index` (at `depth`), with the entries that move to it and the
    /// directory's attributes (for permission checks and inheritance there). Stores them
    /// in one batch. Applied at most once per `op_id`: a resent step never overwrites what
    /// the new partition's server changed since. Answered `Ok`.
    PeerSplitIn {
        dir: Ino,
        index: u32,
        depth: u32,
        attr: Attr,
        entries: Vec<DirEntry>,
        op_id: u64,
    },
    /// Sent to the home server of `dir`: partition `index` of the directory exists (a
    /// split created it). The home adds it to the directory's bitmap (idempotent) and
    /// answers `Partitions`.
    PeerAddPartition {
        dir: Ino,
        index: u32,
    },
    /// Sent to the home server of `dir`: answer the directory's partition bitmap
    /// (`Partitions`), so that a server answering a misrouted request can say where to go.
    PeerPartitions {
        dir: Ino,
    },
    /// Sent by the home server of a split directory being removed to every other server
    /// holding one of its partitions: with `seal`, fail with ENOTEMPTY if any of the
    /// directory's entries is here, otherwise seal its partitions (names cannot be added;
    /// adding waits for the outcome) and answer `Ok`; without `seal`, unseal them. With
    /// `drop` (the directory is gone), delete the partitions. Idempotent.
    PeerSealPartitions {
        dir: Ino,
        seal: bool,
        drop: bool,
    },
    /// Sent by the home server of a split directory to every other server holding one of
    /// its partitions after its attributes changed (mode, owner, default layout): the copy
    /// those servers check permissions and inheritance against. Idempotent.
    PeerPartitionAttr {
        attr: Attr,
    },
    /// Server to server, every few hundred milliseconds (`server/src/load.rs`): the
    /// sender's load; answered `Load` with the receiver's, so one round trip tells each
    /// the other's. Sent only to servers that agreed on `FEATURE_LOAD` in `Hello`.
    PeerLoad {
        load: LoadReport,
    },
    /// Server to server: a message of the replicated cluster map's Raft group
    /// (`crates/membership`, docs/membership.md): `kind` says which (append, vote, snapshot,
    /// forwarded proposal, ping) and `payload` is the group's own encoding of it. Answered
    /// `Reply::Raft`, or an error when the receiver's group cannot take it. Sent only to
    /// servers that agreed on `FEATURE_MEMBERSHIP`. Added in protocol 8.
    PeerRaft {
        kind: u8,
        payload: Vec<u8>,
    },
    /// Anyone: the newest cluster map the server has applied. `known` is the version the
    /// sender holds (informational: the answer is the same). Answered `Reply::Map`. Added in
    /// protocol 8.
    GetMap {
        known: u64,
    },
    /// Root only (`shoal map set`): change the cluster map through its group, if it is still
    /// at `expect_version` (`toml` must declare `expect_version + 1`). Answered `Map` with
    /// the new map, `EAGAIN` when the map moved on (the message names the version), or the
    /// reason. Added in protocol 8.
    ProposeMap {
        expect_version: u64,
        toml: String,
    },
    /// Primary to mirror (`server/src/replica/`): the changes the primary of `slot` made,
    /// in the order it made them, positions `first ..` of its replication log under its
    /// current `incarnation` (drawn at each start). The bytes each change carries (a
    /// metadata batch, a write's data) follow one another in the frame's data, in the
    /// order of the changes. Answered `Replicated` with the last position the mirror has
    /// applied; a mirror that has not applied `first - 1` of this incarnation applies
    /// nothing and says so (`in_sync: false`).
    PeerReplicate {
        slot: ServerId,
        incarnation: u64,
        first: u64,
        changes: Vec<ReplChange>,
    },
    /// Primary to mirror, during a resync (docs/resync.md): what the mirror of `slot` holds,
    /// as digests to compare with the primary's own. Answered `Reply::Resync`. Added in
    /// protocol 8.
    PeerResyncQuery {
        slot: ServerId,
        query: ResyncQuery,
    },
    /// Primary to mirror, during a resync: changes that bring the mirror of `slot` closer to
    /// the primary's stores, outside the replication log's positions (the bytes in the
    /// frame's data as for `PeerReplicate`). The mirror marks itself as resyncing first: it
    /// follows no incarnation until `PeerResyncDone`. Answered `Ok`. Added in protocol 8.
    PeerResyncApply {
        slot: ServerId,
        changes: Vec<ReplChange>,
    },
    /// Primary to mirror: the mirror of `slot` now holds everything up to position
    /// `applied` of `incarnation` (and maybe later changes, which the primary ships again),
    /// so it follows the stream from `applied + 1`. Answered `Replicated`. Added in
    /// protocol 8.
    PeerResyncDone {
        slot: ServerId,
        incarnation: u64,
        applied: u64,
    },
    /// Server to server (`shoal scrub` repair, `server/src/scrub_repair.rs`): up to `len`
    /// bytes at `offset` of object `index` of `ino` in the copy of `slot` the receiver
    /// holds (its own stores when `slot` is its own id, else its mirror of `slot`), verified
    /// against their checksums first: a damaged block is refused with `EIO`, never served
    /// as a repair. Answered `ScrubRead` with the object's size (the bytes in the data
    /// section), or `exists: false`. Added in protocol 8.
    PeerScrubRead {
        slot: ServerId,
        ino: Ino,
        index: u32,
        offset: u64,
        len: u32,
    },
}

/// What a primary asks a mirror during a resync (`Op::PeerResyncQuery`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResyncQuery {
    /// Metadata keys after `after` (from the first without it), in key order, at most
    /// `limit` of them, each with the 64-bit XXH3 of its value.
    Keys { after: Option<Vec<u8>>, limit: u32 },
    /// Every data object of bucket `bucket` (the low byte of the file's inode number),
    /// each with a digest of its size and block checksums.
    Objects { bucket: u8 },
    /// One object's size and the CRC32C of each of its blocks.
    Blocks { ino: Ino, index: u32 },
}

/// A mirror's answer to a [`ResyncQuery`] (`Reply::Resync`), variant for variant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResyncAnswer {
    /// `more`: keys beyond the last one listed exist.
    Keys { keys: Vec<(Vec<u8>, u64)>, more: bool },
    /// (file, object index, digest), sorted.
    Objects { objects: Vec<(Ino, u32, u64)> },
    /// `None`: no such object.
    Blocks { blocks: Option<(u64, Vec<u32>)> },
}

/// One change a primary made to its slot's stores, as shipped to its mirrors
/// (`Op::PeerReplicate`). `len` bytes of the frame's data belong to each change that has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplChange {
    /// A RocksDB write batch exactly as the primary committed it (its `data()` bytes).
    Meta { len: u32 },
    /// Bytes written into object `index` of `ino` at `offset`. `copies`: how many copies
    /// of the object its file wants (the request's `copies`), which the primary's shipper
    /// reads to keep fewer copies than the slot has mirrors (`replica/thin.rs`); a mirror
    /// applies the bytes whatever it says.
    Write {
        ino: Ino,
        index: u32,
        offset: u64,
        len: u32,
        #[serde(default = "one_copy", skip_serializing_if = "is_one_copy")]
        copies: u8,
    },
    /// Object `index` of `ino` cut (or extended) to `len` bytes; `copies` as in `Write`.
    Truncate {
        ino: Ino,
        index: u32,
        len: u64,
        #[serde(default = "one_copy", skip_serializing_if = "is_one_copy")]
        copies: u8,
    },
    /// Objects deleted (and the marks of those kept elsewhere: `Unkept`).
    Delete { objects: Vec<(Ino, u32)> },
    /// Object `index` of `ino` is kept by fewer copies than the slot has, and not by this
    /// mirror: it drops any bytes of it and keeps a mark instead, so that, served after a
    /// failover, it answers `EIO` for the object rather than zeros (docs/replicas.md,
    /// "Fewer copies than the cluster's"). What a `Write` or `Truncate` of such an object
    /// becomes on its way to a mirror past the file's count.
    Unkept { ino: Ino, index: u32 },
    /// The reply the primary cached for request `request` of client `session` (so that a
    /// retry after a failover is answered, not applied twice).
    Reply { session: u64, request: u64, reply: Box<Reply> },
}

impl ReplChange {
    /// How many bytes of the frame's data this change carries.
    pub fn data_len(&self) -> usize {
        match self {
            ReplChange::Meta { len } | ReplChange::Write { len, .. } => *len as usize,
            _ => 0,
        }
    }
}

/// How busy a server is and how much room it has: what load-aware placement
/// ([`PlacementPolicy::Load`]) chooses servers by.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadReport {
    pub server: ServerId,
    /// Requests being served right now (its queue depth).
    pub queue_depth: u32,
    /// Recent (exponentially weighted) rate of bytes received and sent.
    pub bytes_in_per_s: u64,
    pub bytes_out_per_s: u64,
    /// The highest rate of bytes in plus out the server has shown (decaying slowly): the
    /// bandwidth the current rates are measured against.
    pub peak_bytes_per_s: u64,
    /// Recent (exponentially weighted) service time of a request, in microseconds.
    pub latency_us: u64,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    /// Refusing writes for lack of space (or nearly so): never chosen for new files.
    pub full: bool,
}

impl Op {
    /// Short stable name for counters and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Hello { .. } => "hello",
            Op::Lookup { .. } => "lookup",
            Op::Create { .. } => "create",
            Op::Mkdir { .. } => "mkdir",
            Op::Symlink { .. } => "symlink",
            Op::Link { .. } => "link",
            Op::Unlink { .. } => "unlink",
            Op::Rmdir { .. } => "rmdir",
            Op::Rename { .. } => "rename",
            Op::ReadDir { .. } => "readdir",
            Op::GetAttr { .. } => "getattr",
            Op::SetAttr { .. } => "setattr",
            Op::SetDirLayout { .. } => "setdirlayout",
            Op::SetReadMostly { .. } => "setreadmostly",
            Op::Find { .. } => "find",
            Op::TupleWrite { .. } => "tuplewrite",
            Op::TupleRead { take: false, .. } => "tupleread",
            Op::TupleRead { take: true, .. } => "tupletake",
            Op::TupleWatch { .. } => "tuplewatch",
            Op::Changes { .. } => "changes",
            Op::ChangeAck { .. } => "changeack",
            Op::Usage { .. } => "usage",
            Op::ReadLink { .. } => "readlink",
            Op::Access { .. } => "access",
            Op::ExtendSize { .. } => "extendsize",
            Op::SetXattr { .. } => "setxattr",
            Op::GetXattr { .. } => "getxattr",
            Op::ListXattr { .. } => "listxattr",
            Op::RemoveXattr { .. } => "removexattr",
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::ReadList { .. } => "read_list",
            Op::WriteList { .. } => "write_list",
            Op::Fsync { .. } => "fsync",
            Op::UrlProbe { .. } => "url_probe",
            Op::FetchInto { .. } => "fetch_into",
            Op::Batch { .. } => "batch",
            Op::StatFs => "statfs",
            Op::Status => "status",
            Op::PeerMkdirObject { .. } => "peer_mkdir_object",
            Op::PeerRmdirObject { .. } => "peer_rmdir_object",
            Op::PeerLinkDelta { .. } => "peer_link_delta",
            Op::PeerRenameIn { .. } => "peer_rename_in",
            Op::PeerSetParent { .. } => "peer_set_parent",
            Op::PeerDeleteObjects { .. } => "peer_delete_objects",
            Op::PeerTruncateObject { .. } => "peer_truncate_object",
            Op::Append { .. } => "append",
            Op::ReleaseOrphan { .. } => "release_orphan",
            Op::ScrubStart => "scrub_start",
            Op::ScrubStatus => "scrub_status",
            Op::Authenticate { .. } => "authenticate",
            Op::Open { .. } => "open",
            Op::PeerMoveLock { .. } => "peer_move_lock",
            Op::LeaseAck { .. } => "lease_ack",
            Op::PeerSplitIn { .. } => "peer_split_in",
            Op::PeerAddPartition { .. } => "peer_add_partition",
            Op::PeerPartitions { .. } => "peer_partitions",
            Op::PeerSealPartitions { .. } => "peer_seal_partitions",
            Op::PeerPartitionAttr { .. } => "peer_partition_attr",
            Op::PeerLoad { .. } => "peer_load",
            Op::PeerReplicate { .. } => "peer_replicate",
            Op::PeerRaft { .. } => "peer_raft",
            Op::GetMap { .. } => "get_map",
            Op::ProposeMap { .. } => "propose_map",
            Op::PeerResyncQuery { .. } => "peer_resync_query",
            Op::PeerResyncApply { .. } => "peer_resync_apply",
            Op::PeerResyncDone { .. } => "peer_resync_done",
            Op::PeerScrubRead { .. } => "peer_scrub_read",
        }
    }

    /// True for operations only servers send to each other.
    pub fn is_peer(&self) -> bool {
        self.name().starts_with("peer_")
    }
}

/// An operation inside a [`Op::Batch`]: the same fields as the `Op` of that name. A type of
/// its own, not `Op`, so that a batch cannot hold a batch (a decoder facing nested
/// batches would recurse as deep as the frame is long).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOp {
    Lookup { dir: Ino, name: String },
    Create { dir: Ino, name: String, perm: u32, exclusive: bool, layout: Option<LayoutSpec> },
    Mkdir { dir: Ino, name: String, perm: u32 },
    Symlink { dir: Ino, name: String, target: String },
    Unlink { dir: Ino, name: String },
    Rmdir { dir: Ino, name: String },
    GetAttr { ino: Ino },
}

impl BatchOp {
    /// The operation this stands for.
    pub fn into_op(self) -> Op {
        match self {
            BatchOp::Lookup { dir, name } => Op::Lookup { dir, name, lease: None },
            BatchOp::Create { dir, name, perm, exclusive, layout } => Op::Create { dir, name, perm, exclusive, layout },
            BatchOp::Mkdir { dir, name, perm } => Op::Mkdir { dir, name, perm },
            BatchOp::Symlink { dir, name, target } => Op::Symlink { dir, name, target },
            BatchOp::Unlink { dir, name } => Op::Unlink { dir, name, keep: None },
            BatchOp::Rmdir { dir, name } => Op::Rmdir { dir, name },
            BatchOp::GetAttr { ino } => Op::GetAttr { ino },
        }
    }
}

/// The result of one operation of a batch: what `Reply` would have said alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchReply {
    Ok,
    Entry(EntryOut),
    Attr(Attr),
    Error {
        errno: Errno,
        message: String,
    },
    /// As `Reply::Partitions`: the operation's name is in a partition held elsewhere.
    Partitions {
        dir: Ino,
        bitmap: Vec<u64>,
    },
}

impl BatchReply {
    /// The reply of one operation as it travels in a batch; a reply of a kind no batched
    /// operation gives becomes EPROTO.
    pub fn from_reply(r: Reply) -> BatchReply {
        match r {
            Reply::Ok => BatchReply::Ok,
            Reply::Entry(e) => BatchReply::Entry(e),
            Reply::Attr(a) => BatchReply::Attr(a),
            Reply::Error { errno, message } => BatchReply::Error { errno, message },
            Reply::Partitions { dir, bitmap } => BatchReply::Partitions { dir, bitmap },
            other => {
                BatchReply::Error { errno: Errno::EPROTO, message: format!("unexpected reply in a batch: {other:?}") }
            }
        }
    }

    /// Back to the `Reply` the operation would have had alone.
    pub fn into_reply(self) -> Reply {
        match self {
            BatchReply::Ok => Reply::Ok,
            BatchReply::Entry(e) => Reply::Entry(e),
            BatchReply::Attr(a) => Reply::Attr(a),
            BatchReply::Error { errno, message } => Reply::Error { errno, message },
            BatchReply::Partitions { dir, bitmap } => Reply::Partitions { dir, bitmap },
        }
    }
}

/// A reply. Errors carry an errno and a human sentence naming the cause.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Answer to `Hello`: the version both sides speak from now on (the highest in both
    /// ranges) and the features both support.
    Hello {
        protocol_version: u32,
        server: ServerId,
        map_version: u64,
        features: u64,
        /// The server's nonce and proof, when the `Hello` claimed a role (`auth.rs`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        auth: Option<crate::auth::ServerProof>,
    },
    Ok,
    Entry(EntryOut),
    Attr(Attr),
    DirEntries {
        entries: Vec<DirEntry>,
        more: bool,
        /// The partition the page comes from, at its depth on the answering server (every
        /// server of protocol 4 with split directories sets it): `more: false` ends that
        /// partition, and the listing goes on at the next partition's first position.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        part: Option<PartRef>,
    },
    Link(String),
    Xattr(Vec<u8>),
    XattrNames(Vec<String>),
    /// Answer to `Read`: the bytes are in the data section.
    Data,
    /// Answer to `ReadList`: how many bytes each piece got (at most its length), in order;
    /// the data section holds them back to back.
    DataList {
        lens: Vec<u32>,
    },
    Written {
        len: u32,
    },
    /// `PeerLinkDelta`: the new link count.
    NLink(u32),
    /// `PeerRenameIn`: the entry the rename replaced, which the coordinator must unlink.
    Replaced(Option<DirEntry>),
    StatFs(StatFsOut),
    Status(ServerStatus),
    /// Answer to `Batch`: one result per operation, in order.
    Batch(Vec<BatchReply>),
    /// The sender routed with an older cluster map; reload the map and retry.
    StaleMap {
        current: u64,
    },
    Error {
        errno: Errno,
        message: String,
    },
    /// Answer to `Append`: where the bytes went (the file's size before them).
    Appended {
        offset: u64,
    },
    /// Answer to `UrlProbe`.
    UrlInfo(UrlInfo),
    /// Answer to `FetchInto`: the bytes fetched and stored.
    Fetched {
        bytes: u64,
    },
    /// Answer to `ScrubStart` and `ScrubStatus`.
    Scrub(ScrubStatus),
    /// Answer to `Open`: the inode's attributes and, when the cluster runs with keys and
    /// the inode is a regular file, its capability.
    Opened {
        attr: Attr,
        cap: Option<Capability>,
    },
    /// Answer to a `Lookup` or `ReadDir` that asked for a lease, when the server grants
    /// one: the lease and the answer (`lease.rs`).
    Leased {
        lease: crate::lease::LeaseGrant,
        reply: crate::lease::LeasedReply,
    },
    /// The partition bitmap of directory `dir` (`shoal_placement::Bitmap` words): the answer
    /// to a request for a name, or a listing position, in a partition this server does not
    /// hold (the sender's bitmap is stale: merge and route again; docs/protocol.md, "Split
    /// directories"), and to `PeerAddPartition` and `PeerPartitions`.
    Partitions {
        dir: Ino,
        bitmap: Vec<u64>,
    },
    /// Answer to `PeerLoad`: the answering server's load.
    Load(LoadReport),
    /// Answer to `PeerReplicate`: the last position of the primary's `incarnation` the
    /// mirror has applied, and whether it holds everything up to it (false: it needs a
    /// resync before it can follow the stream).
    Replicated {
        incarnation: u64,
        applied: u64,
        in_sync: bool,
    },
    /// Answer to `PeerRaft`: the receiving group's answer, in its own encoding.
    Raft {
        payload: Vec<u8>,
    },
    /// Answer to `GetMap`: the server's newest map, its version and TOML text.
    Map {
        version: u64,
        toml: String,
        /// The group's leader as this server knows it, and its voters.
        leader: Option<u32>,
        voters: Vec<u32>,
    },
    /// Answer to `PeerResyncQuery`.
    Resync(ResyncAnswer),
    /// Answer to `PeerScrubRead`: whether the object exists in that copy and its size;
    /// the verified bytes asked for (those below `size`) are in the data section.
    ScrubRead {
        exists: bool,
        size: u64,
    },
    /// Answer to `Find`.
    Found(crate::find::FindPage),
    /// Answer to `TupleWrite` (`tuple` None, `seq` the event recording it) and `TupleRead`
    /// (the tuple read or taken, None when none came in time; `seq` its write's event).
    Tuple {
        tuple: Option<crate::tuple::Tuple>,
        seq: u64,
    },
    /// Answer to `TupleWatch`.
    TupleEvents(crate::tuple::TupleEvents),
    /// Answer to `Changes` and `ChangeAck`.
    Changes(crate::change::ChangePage),
    /// Answer to `Usage`.
    Usage(crate::usage::UsagePage),
}

/// One partition of a split directory: `index` at `depth` holds the names whose hash has
/// `index` in its low `depth` bits (`shoal_placement::partition`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRef {
    pub index: u32,
    pub depth: u32,
}

/// Progress and findings of a server's scrub (`shoal scrub`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubStatus {
    /// A scrub has been started since the server started.
    pub started: bool,
    /// It has finished (every object and record visited, or stopped by an error).
    pub done: bool,
    /// Objects and their bytes found when the scrub began (what the progress goes to).
    pub objects_total: u64,
    pub bytes_total: u64,
    /// Verified so far.
    pub objects: u64,
    pub bytes: u64,
    pub records: u64,
    /// Damaged blocks and records found (at most [`SCRUB_ERRORS_MAX`] listed).
    pub errors: Vec<ScrubError>,
    /// Errors found beyond those listed.
    pub errors_unlisted: u64,
    /// Milliseconds since it began (until it ended, once done).
    pub elapsed_ms: u64,
    /// Why the scrub stopped early, if it did (it could not list or read the store).
    pub failure: Option<String>,
    /// Blocks of 64 KiB verified (in the server's own objects and in its mirrors' copies).
    #[serde(default)]
    pub blocks: u64,
    /// Damage found: blocks that fail their checksum, object bytes missing (a data file
    /// gone or cut short), records that do not decode.
    #[serde(default)]
    pub corrupt: u64,
    /// Of `corrupt`, repaired from a good copy on another server (replicas >= 2).
    #[serde(default)]
    pub repaired: u64,
    /// Of `corrupt`, left as found: no good copy to repair from.
    #[serde(default)]
    pub unrepairable: u64,
}

/// Most errors a scrub status lists.
pub const SCRUB_ERRORS_MAX: usize = 1000;

/// One damaged thing a scrub found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubError {
    /// "object" (a data object's block) or "record" (a metadata record).
    pub kind: String,
    /// The object file's path on the server, or the record's key (printable, escaped).
    pub name: String,
    /// Offset of the damaged block in the object file.
    pub offset: Option<u64>,
    pub message: String,
    /// Repaired from a good copy (`message` names it); false: still damaged.
    #[serde(default)]
    pub repaired: bool,
}

impl Reply {
    pub fn error(errno: Errno, message: impl Into<String>) -> Reply {
        Reply::Error { errno, message: message.into() }
    }
}

/// Check a single path component: not empty, not `.`/`..`, no `/` or NUL, at most NAME_MAX bytes.
pub fn check_name(name: &str) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Errno::EINVAL);
    }
    Ok(())
}
