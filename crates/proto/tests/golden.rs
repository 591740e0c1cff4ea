//! Golden vectors: for every `Op`, `Reply`, `BatchOp` and `BatchReply` variant, for the
//! `Hello` exchange and for whole frames, bytes committed in `golden/vectors.hex` that must
//! decode to the sample below and re-encode to the same bytes. An accidental change to the
//! format (a renamed field, a changed type, a moved header byte) fails here.
//!
//! A variant without a vector fails too: the variants are listed from serde's own
//! description of each enum, not by hand. `SHOAL_BLESS=1 cargo test -p shoal-proto --test
//! golden` rewrites the file from the samples; allowed only for additive changes (a new
//! variant, a new optional field that old vectors still decode to), never to make a
//! changed encoding pass (docs/protocol.md, "Golden vectors").

use bytes::Bytes;
use serde::de::{Deserialize, Deserializer, Visitor};
use serde::Serialize;
use shoal_proto::cap::{Capability, RIGHT_READ, RIGHT_WRITE};
use shoal_proto::frame::{decode_body, encode_body, Frame, FrameKind};
use shoal_proto::hello::{FEATURE_DATA_CRC, MIN_PROTOCOL_VERSION};
use shoal_proto::lease::{LeaseAsk, LeaseGrant, LeaseKey, LeaseRef, LeasedReply, Notice};
use shoal_proto::msg::*;
use shoal_proto::{Errno, Ino, ServerId, PROTOCOL_VERSION};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

// ---- the samples: one per variant, with every field set to something recognisable ----

fn ts(secs: i64) -> Timestamp {
    Timestamp { secs, nsecs: 123_456_789 }
}

fn spec() -> LayoutSpec {
    LayoutSpec {
        stripe_size: Some(1 << 20),
        stripe_count: Some(2),
        first_server: Some(ServerId(1)),
        policy: Some(PlacementPolicy::Spread),
        replicas: None,
    }
}

fn attr() -> Attr {
    Attr {
        ino: Ino(0x0001_0000_0000_002a),
        kind: FileKind::File,
        perm: 0o644,
        uid: 1000,
        gid: 100,
        size: 5000,
        nlink: 1,
        atime: ts(1_700_000_000),
        mtime: ts(1_700_000_001),
        ctime: ts(1_700_000_002),
        blocks_bytes: 8192,
        layout: Some(Layout { stripe_size: 65536, servers: vec![ServerId(0), ServerId(1)], replicas: 1 }),
        dir_default: None,
        parent: None,
        read_mostly: false,
    }
}

fn capability() -> Capability {
    Capability {
        ino: Ino(0x0001_0000_0000_002a),
        rights: RIGHT_READ,
        issued: 1_700_000_000,
        expires: 1_700_000_600,
        epoch: 2,
        tag: (0..32).collect(),
    }
}

fn dir_attr() -> Attr {
    Attr {
        kind: FileKind::Dir,
        perm: 0o1755,
        layout: None,
        dir_default: Some(LayoutSpec { policy: Some(PlacementPolicy::Same), ..LayoutSpec::default() }),
        parent: Some(Ino(1)),
        ..attr()
    }
}

fn entry() -> EntryOut {
    EntryOut { ino: Ino(42), kind: FileKind::File, attr: Some(attr()), cap: None, attr_lease: None }
}

fn dirent() -> DirEntry {
    DirEntry { name: "b.txt".into(), ino: Ino(43), kind: FileKind::Symlink }
}

const DIR: Ino = Ino(1);
const FILE: Ino = Ino(42);

fn ops() -> Vec<Op> {
    let keep = Some(KeepOpen { ino: FILE, session: 0xfeed });
    vec![
        Op::Hello {
            client: "shoal-client pid 7".into(),
            session: 0x5e55_10a0,
            min_version: 5,
            max_version: 5,
            features: FEATURE_DATA_CRC,
            auth: None,
        },
        Op::Lookup { dir: DIR, name: "a".into(), lease: None },
        Op::Create { dir: DIR, name: "f".into(), perm: 0o600, exclusive: true, layout: Some(spec()) },
        Op::Mkdir { dir: DIR, name: "d".into(), perm: 0o755 },
        Op::Symlink { dir: DIR, name: "l".into(), target: "../t".into() },
        Op::Link { ino: FILE, dir: DIR, name: "hard".into() },
        Op::Unlink { dir: DIR, name: "f".into(), keep },
        Op::Rmdir { dir: DIR, name: "d".into() },
        Op::Rename {
            src_dir: DIR,
            src_name: "x".into(),
            dst_dir: Ino(2),
            dst_name: "y".into(),
            flags: RenameFlags { noreplace: true, exchange: false },
            keep,
        },
        Op::ReadDir { dir: DIR, after: Some("m".into()), limit: 4096, lease: None, from: None },
        Op::GetAttr { ino: FILE },
        Op::SetAttr {
            ino: FILE,
            set: SetAttrs {
                perm: Some(0o640),
                uid: Some(1),
                gid: None,
                size: Some(10),
                atime: Some(TimeSet::Now),
                mtime: Some(TimeSet::At(ts(5))),
            },
        },
        Op::SetDirLayout { ino: DIR, spec: spec() },
        Op::SetReadMostly { ino: DIR, on: true },
        Op::Find {
            query: shoal_proto::find::FindQuery {
                name: Some("*.h5".into()),
                kind: Some(FileKind::File),
                size: Some(shoal_proto::find::SizeTest { cmp: shoal_proto::find::Cmp::More, n: 1, unit: 1 << 20 }),
                xattr: Some("user.tag".into()),
                ..Default::default()
            },
            after: Some(vec![b'E', 1, 2]),
            limit: 4096,
        },
        Op::TupleWrite {
            tuple: tuple(),
            then: Some(shoal_proto::tuple::Trigger { count: template(), reaches: 4, write: tuple() }),
        },
        Op::TupleRead { template: template(), take: true, newest: false, wait_ms: 5000 },
        Op::TupleWatch {
            template: template(),
            kinds: shoal_proto::tuple::WATCH_WRITTEN | shoal_proto::tuple::WATCH_TAKEN,
            after: Some(41),
            limit: 100,
            wait_ms: 10_000,
        },
        Op::Changes {
            after: Some(41),
            consumer: Some("robinhood".into()),
            kinds: shoal_proto::change::ALL_KINDS,
            limit: 1024,
            wait_ms: 10_000,
        },
        Op::ChangeAck { consumer: "robinhood".into(), upto: 41, forget: false },
        Op::Usage { after: Some(DIR), limit: 16_384 },
        Op::ReadLink { ino: FILE },
        Op::Access { ino: FILE, mask: 6 },
        Op::ExtendSize { ino: FILE, size: 1 << 33 },
        Op::SetXattr {
            ino: FILE,
            name: "user.k".into(),
            value: vec![0, 1, 2, 255],
            create_only: true,
            replace_only: false,
        },
        Op::GetXattr { ino: FILE, name: "user.k".into() },
        Op::ListXattr { ino: FILE },
        Op::RemoveXattr { ino: FILE, name: "user.k".into() },
        Op::Read { ino: FILE, index: 1, offset: 1 << 20, len: 65536, cap: None },
        Op::Write { ino: FILE, index: 0, offset: 4096, file_end: 8192, inode_local: true, cap: None, copies: 1 },
        Op::Fsync { ino: FILE, data_only: true, cap: None, closing: false },
        Op::ReadList { ino: FILE, pieces: list_pieces(), cap: None },
        Op::WriteList { ino: FILE, pieces: list_pieces(), file_end: 1 << 21, inode_local: false, cap: None, copies: 1 },
        Op::Batch { ops: batch_ops() },
        Op::StatFs,
        Op::Status,
        Op::PeerMkdirObject { attr: dir_attr(), op_id: 77 },
        Op::PeerRmdirObject { ino: Ino(9), op_id: 78 },
        Op::PeerLinkDelta { ino: FILE, delta: -1, op_id: 79, orphan_of: Some(0xfeed), session: None },
        Op::PeerRenameIn {
            dst_dir: Ino(2),
            dst_name: "y".into(),
            entry: dirent(),
            noreplace: false,
            op_id: 80,
            keep: None,
        },
        Op::PeerSetParent { ino: Ino(9), parent: Ino(2) },
        Op::PeerDeleteObjects { objects: vec![(FILE, 0), (Ino(43), 3)] },
        Op::PeerTruncateObject { ino: FILE, index: 2, len: 100, copies: 1 },
        Op::Append { ino: FILE, cap: None },
        Op::ReleaseOrphan { ino: FILE, session: 0xfeed },
        Op::ScrubStart,
        Op::ScrubStatus,
        Op::Authenticate {
            epoch: 2,
            proof: Some(vec![0xa5; 32]),
            credential: Some(shoal_proto::auth::UserCredential {
                uid: 1000,
                gid: 100,
                groups: vec![100, 27],
                expires: 1_700_000_060,
                epoch: 2,
                tag: vec![0x5a; 32],
            }),
        },
        Op::Open { ino: FILE, rights: RIGHT_READ | RIGHT_WRITE, renew: Some(capability()) },
        Op::PeerMoveLock { op_id: 81, hold: true },
        Op::LeaseAck { ids: vec![7, 1 << 40] },
        Op::PeerSplitIn {
            dir: DIR,
            index: 5,
            depth: 3,
            attr: dir_attr(),
            entries: vec![dirent()],
            op_id: 0x0102_0304_0506_0708,
        },
        Op::PeerAddPartition { dir: DIR, index: 5 },
        Op::PeerPartitions { dir: DIR },
        Op::PeerSealPartitions { dir: DIR, seal: true, drop: false },
        Op::PeerPartitionAttr { attr: dir_attr() },
        Op::PeerLoad { load: load_report() },
        Op::UrlProbe { url: "https://data.example.org/f.h5".into() },
        Op::PeerRaft { kind: 1, payload: vec![0x91, 0x2a] },
        Op::GetMap { known: 3 },
        Op::ProposeMap { expect_version: 4, toml: "[cluster]\nversion = 5\n".into() },
        Op::PeerScrubRead { slot: ServerId(1), ino: FILE, index: 2, offset: 1 << 16, len: 1 << 20 },
        Op::FetchInto {
            url: "https://data.example.org/f.h5".into(),
            ino: FILE,
            index: 1,
            pieces: vec![FetchPiece { file_offset: 1 << 20, offset: 0, len: 1 << 20 }],
            parallel: 4,
            etag: Some("\"v1\"".into()),
            cap: None,
            copies: 1,
        },
        Op::PeerReplicate {
            slot: ServerId(2),
            incarnation: 0x0a0b_0c0d_0e0f_1011,
            first: 17,
            changes: vec![
                ReplChange::Meta { len: 120 },
                ReplChange::Write { ino: FILE, index: 1, offset: 1 << 20, len: 4096, copies: 1 },
                ReplChange::Truncate { ino: FILE, index: 0, len: 100, copies: 1 },
                ReplChange::Delete { objects: vec![(FILE, 0), (FILE, 1)] },
                ReplChange::Reply { session: 7, request: 9, reply: Box::new(Reply::Written { len: 4096 }) },
            ],
        },
        Op::PeerResyncQuery {
            slot: ServerId(2),
            query: ResyncQuery::Keys { after: Some(b"i\x01".to_vec()), limit: 4096 },
        },
        Op::PeerResyncApply {
            slot: ServerId(2),
            changes: vec![
                ReplChange::Meta { len: 64 },
                ReplChange::Write { ino: FILE, index: 1, offset: 65536, len: 65536, copies: 1 },
            ],
        },
        Op::PeerResyncDone { slot: ServerId(2), incarnation: 0x0a0b_0c0d_0e0f_1011, applied: 40 },
    ]
}

fn batch_ops() -> Vec<BatchOp> {
    vec![
        BatchOp::Lookup { dir: DIR, name: "a".into() },
        BatchOp::Create { dir: DIR, name: "f".into(), perm: 0o644, exclusive: false, layout: None },
        BatchOp::Mkdir { dir: DIR, name: "d".into(), perm: 0o700 },
        BatchOp::Symlink { dir: DIR, name: "l".into(), target: "/abs".into() },
        BatchOp::Unlink { dir: DIR, name: "f".into() },
        BatchOp::Rmdir { dir: DIR, name: "d".into() },
        BatchOp::GetAttr { ino: FILE },
    ]
}

fn batch_replies() -> Vec<BatchReply> {
    vec![
        BatchReply::Ok,
        BatchReply::Entry(entry()),
        BatchReply::Attr(attr()),
        BatchReply::Error { errno: Errno::EEXIST, message: "f exists".into() },
        BatchReply::Partitions { dir: DIR, bitmap: vec![0b11] },
    ]
}

fn replies() -> Vec<Reply> {
    vec![
        Reply::Hello {
            protocol_version: 5,
            server: ServerId(1),
            map_version: 3,
            features: FEATURE_DATA_CRC,
            auth: None,
        },
        Reply::Ok,
        Reply::Entry(EntryOut { ino: Ino(44), kind: FileKind::Dir, attr: None, cap: None, attr_lease: None }),
        Reply::Attr(dir_attr()),
        Reply::DirEntries { entries: vec![dirent()], more: true, part: None },
        Reply::Link("../t".into()),
        Reply::Xattr(vec![9, 8, 7]),
        Reply::XattrNames(vec!["user.a".into(), "user.b".into()]),
        Reply::Data,
        Reply::DataList { lens: vec![4096, 100] },
        Reply::Load(load_report()),
        Reply::UrlInfo(UrlInfo { size: Some(1 << 30), ranges: true, etag: Some("\"v1\"".into()) }),
        Reply::Fetched { bytes: 1 << 20 },
        Reply::Replicated { incarnation: 0x0a0b_0c0d_0e0f_1011, applied: 21, in_sync: true },
        Reply::Resync(ResyncAnswer::Keys { keys: vec![(b"i\x02".to_vec(), 0x1122_3344_5566_7788)], more: true }),
        Reply::Raft { payload: vec![0xc0] },
        Reply::Map { version: 4, toml: "[cluster]\nversion = 4\n".into(), leader: Some(1), voters: vec![0, 1, 2] },
        Reply::ScrubRead { exists: true, size: 3 << 16 },
        Reply::Found(shoal_proto::find::FindPage {
            found: vec![shoal_proto::find::FoundEntry {
                dir: DIR,
                name: "a.h5".into(),
                ino: FILE,
                kind: FileKind::File,
                attr: None,
            }],
            dirs: vec![shoal_proto::find::FoundDir { dir: Ino(1), name: "d".into(), ino: DIR }],
            scanned: 12,
            next: None,
        }),
        Reply::Tuple { tuple: Some(tuple()), seq: 42 },
        Reply::TupleEvents(shoal_proto::tuple::TupleEvents {
            events: vec![shoal_proto::tuple::TupleEvent {
                seq: 42,
                kind: shoal_proto::tuple::TupleEventKind::Taken,
                tuple: tuple(),
                uid: 1000,
                at: ts(1_700_000_000),
            }],
            next: 42,
            lost: 0,
        }),
        Reply::Changes(shoal_proto::change::ChangePage {
            events: vec![shoal_proto::change::ChangeEvent {
                seq: 42,
                kind: shoal_proto::change::ChangeKind::Rename,
                ino: FILE,
                file_kind: FileKind::File,
                dir: Some(DIR),
                name: Some("a".into()),
                to_dir: Some(Ino(1)),
                to_name: Some("b".into()),
                xattr: None,
                uid: 1000,
                at: ts(1_700_000_000),
            }],
            next: 42,
            lost: 3,
        }),
        Reply::Usage(shoal_proto::usage::UsagePage {
            rows: vec![shoal_proto::usage::UsageRow {
                dir: DIR,
                parent: Some(Ino(1)),
                readable: true,
                files: 3,
                dirs: 1,
                bytes: 1 << 20,
            }],
            next: Some(DIR),
        }),
        Reply::Written { len: 4096 },
        Reply::NLink(2),
        Reply::Replaced(Some(dirent())),
        Reply::StatFs(StatFsOut { capacity_bytes: 1 << 40, free_bytes: 1 << 39, inodes: 12 }),
        Reply::Status(ServerStatus {
            id: Some(ServerId(0)),
            map_version: 3,
            uptime_secs: 60,
            capacity_bytes: 1 << 40,
            free_bytes: 1 << 39,
            used_bytes: 1 << 20,
            inodes: 12,
            entries: 11,
            data_objects: 5,
            pending_intents: 0,
            counters: Counters {
                client_requests: 100,
                peer_requests: 10,
                peer_requests_sent: 9,
                bytes_received: 1000,
                bytes_sent: 2000,
                errors: 1,
                cpu_ns: 123_456,
                ops: vec![("create".into(), 4), ("lookup".into(), 6)],
            },
            mirrors: vec![],
        }),
        // The batch as committed before `BatchReply::Partitions` existed (its own vector
        // covers that variant), so that adding a variant does not change this vector.
        Reply::Batch(batch_replies().into_iter().filter(|b| !matches!(b, BatchReply::Partitions { .. })).collect()),
        Reply::StaleMap { current: 4 },
        Reply::Error { errno: Errno::ENOENT, message: "no such entry \"a\" in directory 1".into() },
        Reply::Appended { offset: 1 << 32 },
        Reply::Scrub(shoal_proto::msg::ScrubStatus {
            started: true,
            done: false,
            objects_total: 10,
            bytes_total: 1 << 20,
            objects: 4,
            bytes: 65536,
            records: 12,
            errors: vec![shoal_proto::msg::ScrubError {
                kind: "object".into(),
                name: "objects/2a/42.0".into(),
                offset: Some(65536),
                message: "block at offset 65536 fails its checksum".into(),
                repaired: true,
            }],
            errors_unlisted: 0,
            elapsed_ms: 1500,
            failure: None,
            blocks: 17,
            corrupt: 1,
            repaired: 1,
            unrepairable: 0,
        }),
        Reply::Opened { attr: attr(), cap: Some(capability()) },
        Reply::Leased { lease: grant(), reply: LeasedReply::Absent },
        Reply::Partitions { dir: DIR, bitmap: vec![0b1011, 1 << 63] },
    ]
}

fn grant() -> LeaseGrant {
    LeaseGrant { id: 0x1ea5e, key: LeaseKey { dir: DIR, partition: 0, attrs: false }, ms: 3000, depth: 0 }
}

/// Notices: one sample per variant.
fn notices() -> Vec<Notice> {
    vec![Notice::Revoke {
        leases: vec![
            LeaseRef { id: 0x1ea5e, key: LeaseKey { dir: DIR, partition: 0, attrs: false } },
            LeaseRef { id: 9, key: LeaseKey { dir: Ino(77), partition: 3, attrs: false } },
        ],
    }]
}

fn request(op: Op) -> Request {
    Request { cred: Cred { uid: 1000, gid: 100, groups: vec![10, 20] }, map_version: 3, op }
}

/// What a vector is, and how to check bytes against it.
enum Sample {
    Request(Request),
    Reply(Reply),
    BatchOp(BatchOp),
    BatchReply(BatchReply),
    Notice(Notice),
    /// A whole frame: (frame, whether it is a request).
    Frame(Frame),
}

impl Sample {
    fn encode(&self) -> Vec<u8> {
        match self {
            Sample::Request(m) => encode_body(m).unwrap().to_vec(),
            Sample::Reply(m) => encode_body(m).unwrap().to_vec(),
            Sample::BatchOp(m) => encode_body(m).unwrap().to_vec(),
            Sample::BatchReply(m) => encode_body(m).unwrap().to_vec(),
            Sample::Notice(m) => encode_body(m).unwrap().to_vec(),
            Sample::Frame(f) => {
                let mut v = Vec::new();
                f.encode_into(&mut v);
                v
            }
        }
    }

    /// Decode `bytes`, compare with the sample, re-encode and compare with `bytes`.
    fn check(&self, bytes: &[u8]) -> Result<(), String> {
        fn again<T: serde::de::DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(
            bytes: &[u8],
            want: &T,
        ) -> Result<(), String> {
            let got: T = decode_body(bytes).map_err(|e| format!("does not decode: {e}"))?;
            if &got != want {
                return Err(format!("decodes to {got:?}, not the sample {want:?}"));
            }
            let re = encode_body(&got).unwrap();
            if re[..] != *bytes {
                return Err(format!("re-encodes differently: {}", hex(&re)));
            }
            Ok(())
        }
        match self {
            Sample::Request(m) => again(bytes, m),
            Sample::Reply(m) => again(bytes, m),
            Sample::BatchOp(m) => again(bytes, m),
            Sample::BatchReply(m) => again(bytes, m),
            Sample::Notice(m) => again(bytes, m),
            Sample::Frame(want) => {
                let (got, used) =
                    Frame::decode(bytes).map_err(|e| format!("frame does not decode: {e}"))?.ok_or("frame is short")?;
                if used != bytes.len() || &got != want {
                    return Err(format!("frame decodes to {got:?}, not {want:?}"));
                }
                // Through the message types and back: the same bytes.
                let mut rebuilt = match got.kind {
                    FrameKind::Request => {
                        Frame::request(got.request_id, &got.request_body().unwrap(), got.data.clone())
                    }
                    FrameKind::Reply => Frame::reply(got.request_id, &got.reply_body().unwrap(), got.data.clone()),
                    FrameKind::Notice => Frame::notice(&got.notice_body().unwrap()),
                }
                .unwrap();
                rebuilt.data_crc = got.data_crc;
                let mut re = Vec::new();
                rebuilt.encode_into(&mut re);
                if re != bytes {
                    return Err(format!("frame re-encodes differently: {}", hex(&re)));
                }
                Ok(())
            }
        }
    }
}

fn list_pieces() -> Vec<ObjectPiece> {
    vec![ObjectPiece { index: 0, offset: 0, len: 4096 }, ObjectPiece { index: 2, offset: 1 << 20, len: 4096 }]
}

fn samples() -> Vec<(String, Sample)> {
    let mut v = Vec::new();
    for op in ops() {
        v.push((format!("Op.{}", variant_name(&op)), Sample::Request(request(op))));
    }
    for r in replies() {
        v.push((format!("Reply.{}", variant_name(&r)), Sample::Reply(r)));
    }
    for b in batch_ops() {
        v.push((format!("BatchOp.{}", variant_name(&b)), Sample::BatchOp(b)));
    }
    for b in batch_replies() {
        v.push((format!("BatchReply.{}", variant_name(&b)), Sample::BatchReply(b)));
    }
    for n in notices() {
        v.push((format!("Notice.{}", variant_name(&n)), Sample::Notice(n)));
    }
    // Replica counts (docs/replicas.md): optional fields, left out when 1, so the vectors
    // above are those of before; here with other counts.
    let replicated = |op: Op| Sample::Request(request(op));
    v.push((
        "Op.Write+copies".into(),
        replicated(Op::Write { ino: FILE, index: 0, offset: 0, file_end: 8, inode_local: false, cap: None, copies: 3 }),
    ));
    v.push((
        "Op.WriteList+copies".into(),
        replicated(Op::WriteList {
            ino: FILE,
            pieces: list_pieces(),
            file_end: 1 << 21,
            inode_local: false,
            cap: None,
            copies: 2,
        }),
    ));
    v.push((
        "Op.PeerTruncateObject+copies".into(),
        replicated(Op::PeerTruncateObject { ino: FILE, index: 1, len: 7, copies: 2 }),
    ));
    // Read-mostly (protocol 9): left out when false, so the vectors above are those of before.
    v.push(("Reply.Attr+read_mostly".into(), Sample::Reply(Reply::Attr(Attr { read_mostly: true, ..dir_attr() }))));
    v.push((
        "Op.SetDirLayout+replicas".into(),
        replicated(Op::SetDirLayout { ino: DIR, spec: LayoutSpec { replicas: Some(2), ..spec() } }),
    ));
    // Files of fewer copies than the slot (docs/replicas.md): the counts a primary's changes
    // carry, and the mark a mirror past the count gets instead.
    v.push((
        "Op.PeerReplicate+copies".into(),
        replicated(Op::PeerReplicate {
            slot: ServerId(2),
            incarnation: 0x0a0b_0c0d_0e0f_1011,
            first: 17,
            changes: vec![
                ReplChange::Write { ino: FILE, index: 1, offset: 0, len: 4096, copies: 2 },
                ReplChange::Truncate { ino: FILE, index: 1, len: 10, copies: 2 },
                ReplChange::Unkept { ino: FILE, index: 0 },
            ],
        }),
    ));
    let mut three = attr();
    three.layout.as_mut().unwrap().replicas = 3;
    v.push(("Reply.Attr+replicas".into(), Sample::Reply(Reply::Attr(three))));
    // Resync (docs/resync.md): the other questions and answers, and a status with mirrors.
    let query = |q: ResyncQuery| Sample::Request(request(Op::PeerResyncQuery { slot: ServerId(2), query: q }));
    v.push(("Op.PeerResyncQuery+objects".into(), query(ResyncQuery::Objects { bucket: 0x2a })));
    v.push(("Op.PeerResyncQuery+blocks".into(), query(ResyncQuery::Blocks { ino: FILE, index: 3 })));
    v.push((
        "Reply.Resync+objects".into(),
        Sample::Reply(Reply::Resync(ResyncAnswer::Objects { objects: vec![(FILE, 0, 0x99)] })),
    ));
    v.push((
        "Reply.Resync+blocks".into(),
        Sample::Reply(Reply::Resync(ResyncAnswer::Blocks { blocks: Some((70_000, vec![0xdead_beef, 0x0102_0304])) })),
    ));
    v.push(("Reply.Resync+no_object".into(), Sample::Reply(Reply::Resync(ResyncAnswer::Blocks { blocks: None }))));
    v.push((
        "Reply.Status+mirrors".into(),
        Sample::Reply(Reply::Status(ServerStatus {
            id: Some(ServerId(0)),
            mirrors: vec![MirrorStatus {
                server: ServerId(1),
                state: MirrorSync::Resyncing,
                applied: 40,
                resync_done_bytes: 1 << 20,
                resync_total_bytes: 1 << 30,
                resync_shipped_bytes: 65536,
                resyncs: 1,
            }],
            ..Default::default()
        })),
    ));
    // Leases: the optional `lease` field of Lookup and ReadDir, and every kind of leased answer.
    let ask = Some(LeaseAsk { ms: 3000 });
    v.push(("Op.Lookup+lease".into(), Sample::Request(request(Op::Lookup { dir: DIR, name: "a".into(), lease: ask }))));
    v.push((
        "Op.ReadDir+lease".into(),
        Sample::Request(request(Op::ReadDir { dir: DIR, after: None, limit: 1024, lease: ask, from: None })),
    ));
    // Split directories: a listing that starts at a partition's first position, and a page
    // that says which partition it came from.
    v.push((
        "Op.ReadDir+from".into(),
        Sample::Request(request(Op::ReadDir { dir: DIR, after: None, limit: 1024, lease: None, from: Some(1 << 62) })),
    ));
    v.push((
        "LeaseGrant+depth".into(),
        Sample::Reply(Reply::Leased {
            lease: LeaseGrant { id: 9, key: LeaseKey { dir: DIR, partition: 5, attrs: false }, ms: 3000, depth: 3 },
            reply: LeasedReply::Absent,
        }),
    ));
    v.push((
        "Reply.DirEntries+part".into(),
        Sample::Reply(Reply::DirEntries {
            entries: vec![dirent()],
            more: false,
            part: Some(PartRef { index: 5, depth: 3 }),
        }),
    ));
    // Every answer a lease comes with, inside `Reply::Leased` (named by the inner variant).
    for r in [
        LeasedReply::Entry(entry()),
        LeasedReply::Absent,
        LeasedReply::DirEntries { entries: vec![dirent()], more: false, part: None },
        LeasedReply::Attr(attr()),
    ] {
        v.push((
            format!("LeasedReply.{}", variant_name(&r)),
            Sample::Reply(Reply::Leased { lease: grant(), reply: r }),
        ));
    }
    // Attribute leases: a leased `GetAttr` answer, an entry carrying its attribute lease,
    // and the revocation of one.
    let attr_grant = LeaseGrant { id: 11, key: LeaseKey::attrs(Ino(42)), ms: 5000, depth: 0 };
    v.push((
        "Op.PeerLinkDelta+session".into(),
        Sample::Request(request(Op::PeerLinkDelta {
            ino: FILE,
            delta: -1,
            op_id: 79,
            orphan_of: None,
            session: Some(0x5e55_10a0),
        })),
    ));
    v.push((
        "Reply.Leased+attrs".into(),
        Sample::Reply(Reply::Leased { lease: attr_grant, reply: LeasedReply::Attr(attr()) }),
    ));
    v.push((
        "Reply.Entry+attr_lease".into(),
        Sample::Reply(Reply::Entry(EntryOut { attr_lease: Some(attr_grant), ..entry() })),
    ));
    v.push((
        "Notice.Revoke+attrs".into(),
        Sample::Notice(Notice::Revoke { leases: vec![LeaseRef { id: 11, key: LeaseKey::attrs(Ino(42)) }] }),
    ));
    // The Hello exchange, as frames (this build's range), and frames with data both ways.
    let hello = Op::Hello {
        client: "shoal-client pid 7".into(),
        session: 0x5e55_10a0,
        min_version: MIN_PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        features: FEATURE_DATA_CRC,
        auth: None,
    };
    // The same with authentication: a host's claim, the server's proof, the host's proof.
    let hello_auth = Op::Hello {
        client: "shoal-client pid 7".into(),
        session: 0x5e55_10a0,
        min_version: MIN_PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        features: FEATURE_DATA_CRC,
        auth: Some(shoal_proto::auth::HelloAuth {
            role: shoal_proto::auth::Role::Host,
            nonce: (0..32).collect(),
            epoch: 2,
        }),
    };
    let frames = [
        ("Frame.HelloRequest", Frame::request(0, &request(hello), Bytes::new())),
        (
            "Frame.HelloReply",
            Frame::reply(
                0,
                &Reply::Hello {
                    protocol_version: PROTOCOL_VERSION,
                    server: ServerId(1),
                    map_version: 3,
                    features: FEATURE_DATA_CRC,
                    auth: None,
                },
                Bytes::new(),
            ),
        ),
        ("Frame.HelloAuthRequest", Frame::request(0, &request(hello_auth), Bytes::new())),
        (
            "Frame.HelloAuthReply",
            Frame::reply(
                0,
                &Reply::Hello {
                    protocol_version: PROTOCOL_VERSION,
                    server: ServerId(1),
                    map_version: 3,
                    features: FEATURE_DATA_CRC,
                    auth: Some(shoal_proto::auth::ServerProof {
                        nonce: (32..64).collect(),
                        epoch: 2,
                        proof: vec![0xc3; 32],
                    }),
                },
                Bytes::new(),
            ),
        ),
        (
            "Frame.AuthenticateRequest",
            Frame::request(
                0,
                &request(Op::Authenticate { epoch: 2, proof: Some(vec![0x3c; 32]), credential: None }),
                Bytes::new(),
            ),
        ),
        (
            "Frame.WriteRequest",
            Frame::request(
                0x0102_0304_0506_0708,
                &request(Op::Write {
                    ino: FILE,
                    index: 0,
                    offset: 0,
                    file_end: 11,
                    inode_local: true,
                    cap: None,
                    copies: 1,
                }),
                Bytes::from_static(b"hello world"),
            ),
        ),
        ("Frame.ReadReply", Frame::reply(9, &Reply::Data, Bytes::from_static(b"some bytes"))),
    ];
    for (name, f) in frames {
        v.push((name.into(), Sample::Frame(f.unwrap())));
    }
    v.push(("Frame.NoticeRevoke".into(), Sample::Frame(Frame::notice(&notices()[0]).unwrap())));
    let mut plain = Frame::reply(10, &Reply::Data, Bytes::from_static(b"no data checksum")).unwrap();
    plain.data_crc = false;
    v.push(("Frame.ReadReplyWithoutDataCrc".into(), Sample::Frame(plain)));
    v
}

// ---- names of variants: from the encoding, and from serde's description of the enum ----

/// The variant name a message is tagged with: a unit variant is its name as a string, any
/// other a one-entry map from its name.
fn variant_name<T: Serialize>(m: &T) -> String {
    let b = encode_body(m).unwrap();
    let s = if b[0] == 0x81 { &b[1..] } else { &b[..] };
    let (len, at) = match s[0] {
        m @ 0xa0..=0xbf => ((m & 0x1f) as usize, 1),
        0xd9 => (s[1] as usize, 2),
        m => panic!("not a variant tag: {m:#x}"),
    };
    String::from_utf8(s[at..at + len].to_vec()).unwrap()
}

/// Asks a type to deserialize itself and records the variant names it declares.
struct VariantsOf;

#[derive(Debug)]
struct Found(&'static [&'static str]);

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}
impl std::error::Error for Found {}
impl serde::de::Error for Found {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Found(&[])
    }
}

impl<'de> Deserializer<'de> for VariantsOf {
    type Error = Found;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Found> {
        Err(Found(&[]))
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Found> {
        Err(Found(variants))
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

fn variants<T: Deserialize<'static>>() -> BTreeSet<String> {
    match T::deserialize(VariantsOf) {
        Err(Found(v)) => v.iter().map(|s| s.to_string()).collect(),
        Ok(_) => unreachable!(),
    }
}

// ---- the file ----

fn path() -> PathBuf {
    // CARGO_MANIFEST_DIR as cargo sets it when it runs the test, not as it was when the test
    // was built: checkouts sharing one target directory (CI's fresh clones) may run a binary
    // built from another checkout, whose folder may be gone.
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    dir.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR"))).join("tests/golden/vectors.hex")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn load() -> BTreeMap<String, Vec<u8>> {
    let text = std::fs::read_to_string(path()).unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, hex) = l.split_once(' ').expect("`name hex` lines");
            (name.to_string(), unhex(hex.trim()))
        })
        .collect()
}

#[test]
fn every_message_matches_its_golden_vector() {
    let samples = samples();
    if std::env::var("SHOAL_BLESS").as_deref() == Ok("1") {
        let mut out = String::from(
            "# Golden vectors of the Shoal wire protocol: `name hex`, one per message variant and\n\
             # frame (crates/proto/tests/golden.rs). Rewritten by SHOAL_BLESS=1, for additive\n\
             # changes only (docs/protocol.md, \"Golden vectors\").\n",
        );
        for (name, s) in &samples {
            out += &format!("{name} {}\n", hex(&s.encode()));
        }
        std::fs::create_dir_all(path().parent().unwrap()).unwrap();
        std::fs::write(path(), out).unwrap();
        return;
    }
    let file = load();
    let mut failures = Vec::new();
    for (name, s) in &samples {
        match file.get(name) {
            None => failures.push(format!(
                "{name}: no golden vector (a new message? SHOAL_BLESS=1 adds it, if the change is additive)"
            )),
            Some(bytes) => {
                if let Err(e) = s.check(bytes) {
                    failures.push(format!("{name}: {e}"));
                }
                if s.encode() != *bytes {
                    failures.push(format!("{name}: the sample now encodes as {}", hex(&s.encode())));
                }
            }
        }
    }
    let known: BTreeSet<&String> = samples.iter().map(|(n, _)| n).collect();
    for name in file.keys().filter(|n| !known.contains(n)) {
        failures.push(format!("{name}: a vector without a sample (a message was removed or renamed?)"));
    }
    assert!(failures.is_empty(), "golden vectors differ:\n{}", failures.join("\n"));
}

#[test]
fn every_variant_has_a_sample_and_a_distinct_op_code() {
    let names: BTreeSet<String> = samples().into_iter().map(|(n, _)| n).collect();
    for (prefix, all) in [
        ("Op", variants::<Op>()),
        ("Reply", variants::<Reply>()),
        ("BatchOp", variants::<BatchOp>()),
        ("BatchReply", variants::<BatchReply>()),
        ("Notice", variants::<Notice>()),
        ("LeasedReply", variants::<LeasedReply>()),
    ] {
        assert!(!all.is_empty());
        for v in all {
            assert!(names.contains(&format!("{prefix}.{v}")), "{prefix}::{v} has no golden sample");
        }
    }
    let op_codes: BTreeSet<u16> = ops().iter().map(Op::code).collect();
    assert_eq!(op_codes.len(), ops().len(), "two ops share a code");
    assert!(!op_codes.contains(&0));
    let reply_codes: BTreeSet<u16> = replies().iter().map(Reply::code).collect();
    assert_eq!(reply_codes.len(), replies().len(), "two replies share a code");
    assert!(!reply_codes.contains(&0));
}

// ---- evolvability: what later and earlier versions send still decodes ----

/// `Op::Create` as a later version might send it: a field this version does not know.
#[derive(Serialize)]
enum LaterOp {
    Create { dir: Ino, name: String, perm: u32, exclusive: bool, layout: Option<LayoutSpec>, capability: Vec<u8> },
    Hello { client: String, session: u64, min_version: u32, max_version: u32, features: u64, ticket: Option<String> },
}

/// A request of a later version, with a field this version does not know.
#[derive(Serialize)]
struct LaterRequest {
    cred: Cred,
    map_version: u64,
    op: LaterOp,
    trace: u64,
}

/// `Op::Create` without its optional `layout` (as a field added later is missing from an
/// earlier sender's messages).
#[derive(Serialize)]
enum EarlierOp {
    Create { dir: Ino, name: String, perm: u32, exclusive: bool },
}

#[derive(Serialize)]
struct EarlierRequest {
    cred: Cred,
    map_version: u64,
    op: EarlierOp,
}

#[test]
fn unknown_fields_are_ignored_and_missing_optional_ones_are_none() {
    let cred = Cred { uid: 1, gid: 2, groups: vec![] };
    let later = LaterRequest {
        cred: cred.clone(),
        map_version: 3,
        op: LaterOp::Create {
            dir: DIR,
            name: "f".into(),
            perm: 0o644,
            exclusive: true,
            layout: Some(spec()),
            capability: vec![1, 2, 3],
        },
        trace: 99,
    };
    let got: Request = decode_body(&rmp_serde::to_vec_named(&later).unwrap()).unwrap();
    let want = Op::Create { dir: DIR, name: "f".into(), perm: 0o644, exclusive: true, layout: Some(spec()) };
    assert_eq!(got, Request { cred: cred.clone(), map_version: 3, op: want });

    let earlier = EarlierRequest {
        cred: cred.clone(),
        map_version: 3,
        op: EarlierOp::Create { dir: DIR, name: "f".into(), perm: 0o644, exclusive: true },
    };
    let got: Request = decode_body(&rmp_serde::to_vec_named(&earlier).unwrap()).unwrap();
    let want = Op::Create { dir: DIR, name: "f".into(), perm: 0o644, exclusive: true, layout: None };
    assert_eq!(got.op, want);

    // A later client's Hello, with a field of its own, is still understood.
    let hello = LaterRequest {
        cred,
        map_version: 0,
        op: LaterOp::Hello {
            client: "later".into(),
            session: 1,
            min_version: 5,
            max_version: 9,
            features: u64::MAX,
            ticket: Some("token".into()),
        },
        trace: 0,
    };
    let got: Request = decode_body(&rmp_serde::to_vec_named(&hello).unwrap()).unwrap();
    assert!(matches!(got.op, Op::Hello { max_version: 9, features: u64::MAX, .. }), "{got:?}");
}

fn load_report() -> LoadReport {
    LoadReport {
        server: ServerId(2),
        queue_depth: 3,
        bytes_in_per_s: 100 << 20,
        bytes_out_per_s: 5 << 20,
        peak_bytes_per_s: 400 << 20,
        latency_us: 1500,
        capacity_bytes: 1 << 40,
        free_bytes: 1 << 39,
        full: false,
    }
}

fn tuple() -> shoal_proto::tuple::Tuple {
    use shoal_proto::tuple::Value;
    shoal_proto::tuple::Tuple(vec![Value::Str("ckpt".into()), Value::Int(-7), Value::Bytes(vec![0, 255])])
}

fn template() -> shoal_proto::tuple::Template {
    use shoal_proto::tuple::{Field, Value, ValueKind};
    shoal_proto::tuple::Template(vec![Field::Is(Value::Str("ckpt".into())), Field::AnyOf(ValueKind::Int), Field::Any])
}
