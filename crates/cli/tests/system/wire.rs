//! The wire protocol on real servers, over raw connections: `Hello` negotiates versions and
//! features (a newer client is served, a too-old one refused naming both ranges), frames
//! that fail their checksum are refused with EIO and close the connection (a `Write` whose
//! data fails it changes nothing in the object), read replies
//! carry a data checksum only where it was negotiated, and a state-changing request resent
//! under the same (session, request id) is applied once.

use bytes::Bytes;
use shoal_proto::frame::{Frame, FrameKind, HEADER_LEN};
use shoal_proto::hello::{FEATURE_DATA_CRC, MIN_PROTOCOL_VERSION};
use shoal_proto::msg::{Cred, Op, Reply, Request};
use shoal_proto::{Errno, Ino, PROTOCOL_VERSION, ROOT_INO};
use shoal_testkit::{Cluster, RawHost};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A raw connection to a server (reads bounded by a timeout: never hangs).
struct Raw {
    s: TcpStream,
}

impl Raw {
    fn connect(addr: &str) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw { s }
    }

    /// Connect to server 0 of `cluster` and say `Hello` with this range and these features,
    /// proving the host key (as root's tools do) when the server accepts the range; the
    /// answer to the `Hello`.
    fn hello(cluster: &Cluster, session: u64, min_version: u32, max_version: u32, features: u64) -> (Raw, Reply) {
        let host = RawHost::new(&cluster.config);
        let mut c = Raw::connect(&cluster.addr(0));
        let auth = Some(host.hello());
        let op = Op::Hello { client: "wire test".into(), session, min_version, max_version, features, auth };
        c.send(0, op, Bytes::new());
        let reply = c.recv().expect("an answer to Hello").reply_body().unwrap();
        if let Reply::Hello { .. } = reply {
            let (ok, _) = c.call(0, host.authenticate(&reply), Bytes::new());
            assert_eq!(ok, Reply::Ok, "authenticated");
        }
        (c, reply)
    }

    /// A connection of client `session` that speaks this build's protocol with `features`.
    fn open(cluster: &Cluster, session: u64, features: u64) -> Raw {
        let (c, reply) = Raw::hello(cluster, session, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, features);
        assert!(matches!(reply, Reply::Hello { .. }), "{reply:?}");
        c
    }

    fn frame(id: u64, op: Op, data: Bytes) -> Frame {
        Frame::request(id, &Request { cred: Cred::root(), map_version: 0, op }, data).unwrap()
    }

    fn send(&mut self, id: u64, op: Op, data: Bytes) {
        self.send_bytes(&Raw::encode(Raw::frame(id, op, data)));
    }

    fn encode(f: Frame) -> Vec<u8> {
        let mut v = Vec::new();
        f.encode_into(&mut v);
        v
    }

    fn send_bytes(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// The next frame, or `None` if the server closed the connection.
    fn recv(&mut self) -> Option<Frame> {
        let mut wire = vec![0u8; HEADER_LEN];
        if self.s.read_exact(&mut wire).is_err() {
            return None;
        }
        let body_len = u32::from_le_bytes(wire[16..20].try_into().unwrap()) as usize;
        let data_len = u32::from_le_bytes(wire[20..24].try_into().unwrap()) as usize;
        wire.resize(HEADER_LEN + body_len + data_len, 0);
        self.s.read_exact(&mut wire[HEADER_LEN..]).ok()?;
        let (f, _) = Frame::decode(&wire).expect("the server's frame decodes").expect("whole");
        assert_eq!(f.kind, FrameKind::Reply);
        Some(f)
    }

    /// Send `op` as request `id` and return the reply.
    fn call(&mut self, id: u64, op: Op, data: Bytes) -> (Reply, Frame) {
        self.send(id, op, data);
        let f = self.recv().expect("a reply");
        assert_eq!(f.request_id, id);
        (f.reply_body().unwrap(), f)
    }

    fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 64];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn session() -> u64 {
    rand_session(std::process::id() as u64)
}

fn rand_session(seed: u64) -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    (t ^ seed.rotate_left(32)) | 1
}

fn create(name: &str) -> Op {
    Op::Create { dir: ROOT_INO, name: name.into(), perm: 0o644, exclusive: true, layout: None }
}

fn ino_of(reply: &Reply) -> Ino {
    match reply {
        Reply::Entry(e) => e.ino,
        other => panic!("not an entry: {other:?}"),
    }
}

/// The capability a create reply carries (the cluster runs with keys).
fn cap_of(reply: &Reply) -> Option<shoal_proto::cap::Capability> {
    match reply {
        Reply::Entry(e) => e.cap.clone(),
        other => panic!("not an entry: {other:?}"),
    }
}

#[test]
fn a_newer_client_is_served_at_this_version_with_the_common_features() {
    let c = Cluster::start(1);
    let unknown_feature = 1u64 << 40;
    let (mut raw, reply) =
        Raw::hello(&c, 0, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION + 1, FEATURE_DATA_CRC | unknown_feature);
    match reply {
        Reply::Hello { protocol_version, features, .. } => {
            assert_eq!(protocol_version, PROTOCOL_VERSION);
            assert_eq!(features, FEATURE_DATA_CRC, "unknown bits are dropped, common ones kept");
        }
        other => panic!("{other:?}"),
    }
    let (reply, _) = raw.call(1, Op::GetAttr { ino: ROOT_INO }, Bytes::new());
    assert!(matches!(reply, Reply::Attr(_)), "{reply:?}");
}

#[test]
fn a_too_old_client_is_refused_naming_both_ranges_and_closed() {
    let c = Cluster::start(1);
    let (mut raw, reply) = Raw::hello(&c, 0, 3, 4, FEATURE_DATA_CRC);
    let want = format!("client speaks protocol 3..=4, this server {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}");
    match reply {
        Reply::Error { errno, message } => {
            assert_eq!(errno, Errno::EPROTO);
            assert!(message.contains(&want), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(raw.closed_by_server());
    assert!(c.log(0).contains(&want), "the refusal is logged:\n{}", c.log(0));
}

#[test]
fn a_frame_failing_its_checksum_is_answered_eio_and_closes_the_connection() {
    let c = Cluster::start(1);
    for (what, flip_from_end) in [("header and body", None), ("data", Some(1usize))] {
        let mut raw = Raw::open(&c, 0, FEATURE_DATA_CRC);
        let name = format!("never-{}", what.len());
        let mut wire = match flip_from_end {
            // A write's data section, one bit flipped in transit.
            Some(_) => Raw::encode(Raw::frame(
                7,
                Op::Write { ino: ROOT_INO, index: 0, offset: 0, file_end: 0, inode_local: false, cap: None, copies: 1 },
                Bytes::from_static(b"some bytes"),
            )),
            None => Raw::encode(Raw::frame(7, create(&name), Bytes::new())),
        };
        let at = match flip_from_end {
            Some(k) => wire.len() - k,
            None => HEADER_LEN + 3, // in the body
        };
        wire[at] ^= 0x10;
        raw.send_bytes(&wire);
        let f = raw.recv().expect("an answer naming the checksum");
        assert_eq!(f.request_id, 7);
        match f.reply_body().unwrap() {
            Reply::Error { errno, message } => {
                assert_eq!(errno, Errno::EIO);
                assert!(message.contains("CRC32C checksum mismatch") && message.contains(what), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(raw.closed_by_server(), "the connection is closed");
        let mut check = Raw::open(&c, 0, FEATURE_DATA_CRC);
        let (reply, _) = check.call(1, Op::Lookup { dir: ROOT_INO, name, lease: None }, Bytes::new());
        assert!(matches!(reply, Reply::Error { errno: Errno::ENOENT, .. }), "nothing was applied: {reply:?}");
    }
    assert!(c.log(0).contains("CRC32C checksum mismatch"), "logged:\n{}", c.log(0));
}

/// The object file of object 0 of `ino` on server 0, and its checksum file, as the server
/// names them (docs/formats.md).
fn object_files(c: &Cluster, ino: Ino) -> [std::path::PathBuf; 2] {
    let dir = c.map.servers[0].data_dir.clone().unwrap().join("objects").join(format!("{:02x}", ino.0 & 0xff));
    [dir.join(format!("{:016x}.0", ino.0)), dir.join(format!("{:016x}.0.crc", ino.0))]
}

#[test]
fn a_write_whose_data_fails_its_checksum_changes_nothing_in_the_object() {
    // The server verifies a Write's data checksum from the CRC32C of the pieces its object
    // checksums need (one pass over the bytes): a damaged piece, wherever it lies, must be
    // caught before anything is written.
    let c = Cluster::start(1);
    let mut raw = Raw::open(&c, 0, FEATURE_DATA_CRC);
    let made = raw.call(1, create("f"), Bytes::new()).0;
    let (ino, cap) = (ino_of(&made), cap_of(&made));
    let old: Bytes = (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
    let write = |offset: u64, len: usize| Op::Write {
        ino,
        index: 0,
        offset,
        file_end: offset + len as u64,
        inode_local: true,
        cap: cap.clone(),
        copies: 1,
    };
    assert!(matches!(raw.call(2, write(0, old.len()), old.clone()).0, Reply::Written { .. }));
    let fsync = Op::Fsync { ino, data_only: false, cap: cap.clone(), closing: false };
    assert_eq!(raw.call(3, fsync, Bytes::new()).0, Reply::Ok);
    let files = object_files(&c, ino);
    let before = files.clone().map(|p| std::fs::read(&p).unwrap());
    assert!(before.iter().all(|b| !b.is_empty()), "{files:?}");

    // 150,000 new bytes at an offset that is not a block boundary: pieces of 100 bytes,
    // 64 KiB, 64 KiB and 18,928 bytes. One bit is flipped in transit in the first, a middle
    // and the last piece in turn.
    let (offset, new) = (65_436u64, Bytes::from(vec![0xa5u8; 150_000]));
    for (id, at) in [(10u64, 50usize), (11, 100 + 70_000), (12, new.len() - 1)] {
        let mut raw = Raw::open(&c, 0, FEATURE_DATA_CRC);
        let mut wire = Raw::encode(Raw::frame(id, write(offset, new.len()), new.clone()));
        let n = wire.len();
        wire[n - new.len() + at] ^= 0x08;
        raw.send_bytes(&wire);
        let f = raw.recv().expect("an answer naming the checksum");
        assert_eq!(f.request_id, id);
        match f.reply_body().unwrap() {
            Reply::Error { errno, message } => {
                assert_eq!(errno, Errno::EIO);
                assert!(message.contains("CRC32C checksum mismatch over the data"), "{message}");
            }
            other => panic!("a damaged write at byte {at} was answered {other:?}"),
        }
        assert!(raw.closed_by_server(), "the connection is closed");
        let after = files.clone().map(|p| std::fs::read(&p).unwrap());
        assert!(after == before, "damaged at byte {at}: the object or its checksums changed");
        let mut check = Raw::open(&c, 0, FEATURE_DATA_CRC);
        let read = Op::Read { ino, index: 0, offset: 0, len: 1 << 20, cap: cap.clone() };
        let (reply, f) = check.call(1, read, Bytes::new());
        assert_eq!(reply, Reply::Data);
        assert!(f.data == old, "damaged at byte {at}: the old bytes read back");
    }
    assert!(c.log(0).contains("CRC32C checksum mismatch over the data of request 12"), "logged:\n{}", c.log(0));

    // The same write undamaged is applied: the refusals above were the checksum's.
    assert!(matches!(raw.call(20, write(offset, new.len()), new.clone()).0, Reply::Written { .. }));
    let read = Op::Read { ino, index: 0, offset: 0, len: 1 << 20, cap: cap.clone() };
    let (_, f) = raw.call(21, read, Bytes::new());
    let mut want = old.to_vec();
    want[offset as usize..offset as usize + new.len()].copy_from_slice(&new);
    assert!(f.data == want, "the undamaged write reads back");
}

#[test]
fn read_replies_carry_a_data_checksum_only_where_it_was_negotiated() {
    let c = Cluster::start(1);
    let mut raw = Raw::open(&c, 0, FEATURE_DATA_CRC);
    let made = raw.call(1, create("f"), Bytes::new()).0;
    let (ino, cap) = (ino_of(&made), cap_of(&made));
    let bytes: Bytes = (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
    let write = Op::Write {
        ino,
        index: 0,
        offset: 0,
        file_end: bytes.len() as u64,
        inode_local: true,
        cap: cap.clone(),
        copies: 1,
    };
    let (reply, _) = raw.call(2, write, bytes.clone());
    assert!(matches!(reply, Reply::Written { .. }), "{reply:?}");
    for features in [FEATURE_DATA_CRC, 0] {
        let mut raw = Raw::open(&c, 0, features);
        let (reply, f) =
            raw.call(3, Op::Read { ino, index: 0, offset: 0, len: 1 << 20, cap: cap.clone() }, Bytes::new());
        assert_eq!(reply, Reply::Data);
        assert_eq!(f.data, bytes);
        assert_eq!(f.data_crc, features != 0, "features {features:#x}");
    }
    // A client that turns the data checksum off (SHOAL_DATA_CRC=off) is served, and reads
    // the same bytes.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .env_remove("SHOAL_CONFIG")
        .env("SHOAL_DATA_CRC", "off")
        .arg("--config")
        .arg(c.path().join("cluster.toml"))
        .args(["cat", "/f"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout == bytes, "read back through a client without data checksums");
}

#[test]
fn a_request_resent_under_the_same_ids_is_applied_once() {
    let c = Cluster::start(1);
    let me = session();

    // An exclusive create, sent twice on two connections as a client retrying after a lost
    // connection does: the same answer both times, and one file.
    let mut first = Raw::open(&c, me, FEATURE_DATA_CRC);
    let (r1, f1) = first.call(100, create("once"), Bytes::new());
    drop(first);
    let mut second = Raw::open(&c, me, FEATURE_DATA_CRC);
    let (r2, f2) = second.call(100, create("once"), Bytes::new());
    assert!(matches!(r1, Reply::Entry(_)), "{r1:?}");
    assert_eq!(r2, r1, "the duplicate gets the first reply");
    assert_eq!(f2.body, f1.body);
    // Another request id is another request: applied, and refused as the name exists.
    let (r3, _) = second.call(101, create("once"), Bytes::new());
    assert!(matches!(r3, Reply::Error { errno: Errno::EEXIST, .. }), "{r3:?}");
    // The same request id from another client is another request too.
    let mut other = Raw::open(&c, me + 2, FEATURE_DATA_CRC);
    let (r4, _) = other.call(100, create("once"), Bytes::new());
    assert!(matches!(r4, Reply::Error { errno: Errno::EEXIST, .. }), "{r4:?}");

    // An append, twice under the same ids: one append; under a new id: a second one.
    let (ino, cap) = (ino_of(&r1), cap_of(&r1));
    let append = || Op::Append { ino, cap: cap.clone() };
    let (a1, _) = second.call(200, append(), Bytes::from_static(b"abc"));
    let mut third = Raw::open(&c, me, FEATURE_DATA_CRC);
    let (a2, _) = third.call(200, append(), Bytes::from_static(b"abc"));
    assert_eq!(a1, Reply::Appended { offset: 0 });
    assert_eq!(a2, a1);
    let (a3, _) = third.call(201, append(), Bytes::from_static(b"abc"));
    assert_eq!(a3, Reply::Appended { offset: 3 });
    match third.call(202, Op::GetAttr { ino }, Bytes::new()).0 {
        Reply::Attr(a) => assert_eq!(a.size, 6, "two appends of 3 bytes, not three"),
        other => panic!("{other:?}"),
    }

    // Duplicates in flight at once (pipelined on one connection) wait for the first.
    let mut fourth = Raw::open(&c, me, FEATURE_DATA_CRC);
    let frame = Raw::encode(Raw::frame(300, append(), Bytes::from_static(b"xyz")));
    let twice = [frame.clone(), frame].concat();
    fourth.send_bytes(&twice);
    let (b1, b2) = (fourth.recv().unwrap().reply_body().unwrap(), fourth.recv().unwrap().reply_body().unwrap());
    assert_eq!(b1, Reply::Appended { offset: 6 });
    assert_eq!(b2, b1);
    match fourth.call(301, Op::GetAttr { ino }, Bytes::new()).0 {
        Reply::Attr(a) => assert_eq!(a.size, 9),
        other => panic!("{other:?}"),
    }
}
