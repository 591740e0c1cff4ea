//! The peers' protocol: Shoal's frames (`shoal_proto::frame`: a checksummed header, a
//! MessagePack body, a raw data section) carrying the messages below.
//!
//! A connection starts with a handshake in which each side proves it holds the cluster's
//! host key (as every client host does), so that only mounts of the cluster are answered,
//! and only by them:
//!
//! 1. the answering member sends a [`Challenge`] (a fresh nonce);
//! 2. the asking member sends a [`Hello`]: the group's identity, its rank, a nonce of its
//!    own, and a tag over all of them and the challenge;
//! 3. the answering member checks it and sends a [`Welcome`] tagged over both nonces (or
//!    closes the connection); the asking member checks that in turn.
//!
//! Then [`Ask`]s and their [`Answer`]s, matched by request id, any number in flight. A
//! piece's bytes travel in the data section of its answer's frame. Without keys (a cluster
//! with `auth = "none"`) the tags are empty and not checked, as on the servers.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use shoal_auth::KeyRing;
use shoal_proto::frame::{decode_body, encode_body, Frame, FrameError, FrameKind};
use shoal_proto::msg::Attr;
use shoal_proto::Ino;

pub const OP_CHALLENGE: u16 = 1;
pub const OP_HELLO: u16 = 2;
pub const OP_WELCOME: u16 = 3;
pub const OP_ASK: u16 = 4;
pub const OP_ANSWER: u16 = 5;

/// Bytes of a piece: the unit a file's data is read, kept and passed on in.
pub const PIECE: u64 = 1 << 20;

const ASK_LABEL: &str = "shoal coop hello";
const ANSWER_LABEL: &str = "shoal coop welcome";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Challenge {
    pub nonce: Vec<u8>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hello {
    pub group: u64,
    pub rank: u32,
    pub nonce: Vec<u8>,
    /// The host key's epoch the tag was made with.
    pub epoch: u32,
    pub tag: Vec<u8>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Welcome {
    pub tag: Vec<u8>,
}

/// A file's version: what an open checks (close-to-open). A piece is asked for and kept
/// by version, so a piece of one version is never served for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Version {
    pub size: u64,
    /// Seconds and nanoseconds.
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
}

impl Version {
    pub fn of(a: &Attr) -> Version {
        Version { size: a.size, mtime: (a.mtime.secs, a.mtime.nsecs), ctime: (a.ctime.secs, a.ctime.nsecs) }
    }
}

/// What is asked of a member.
///
/// `dir`, where the asker knows it: the directory the inode was found in. The designated
/// reader of that directory's listing is then also the one of the inode's attributes and of
/// its first piece: listing the directory left it holding leases on the entries'
/// attributes, so it answers them, and checks a small file's version, without a request.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Key {
    /// An inode's attributes, as they are now.
    Attr { ino: Ino, dir: Option<Ino> },
    /// A directory's entries with their attributes, as they are now.
    Listing { dir: Ino },
    /// The attributes of `dir/name`, as it is now (ENOENT when there is no such name): a
    /// look-up in a directory that is not read-mostly (the path down to a read-mostly tree).
    Entry { dir: Ino, name: String },
    /// Bytes `index * PIECE ..` of file `ino` at `version` (fewer at its end).
    Piece { ino: Ino, version: Version, index: u64, dir: Option<Ino> },
}

impl Key {
    /// The hash that picks the object's designated reader: a directory's listing, its
    /// entries' attributes and their first pieces have one (see `dir`); the other pieces of
    /// a file are spread over the members.
    pub fn hash(&self) -> u64 {
        const WHOLE: u64 = u64::MAX;
        let (ino, salt) = match self {
            Key::Attr { dir: Some(dir), .. } | Key::Listing { dir } | Key::Entry { dir, .. } => (dir.0, WHOLE),
            Key::Piece { dir: Some(dir), index: 0, .. } => (dir.0, WHOLE),
            Key::Attr { ino, dir: None } => (ino.0, WHOLE),
            Key::Piece { ino, index, .. } => (ino.0, *index),
        };
        xxhash_rust::xxh3::xxh3_64(&[ino.to_le_bytes(), salt.to_le_bytes()].concat())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ask {
    pub key: Key,
    /// How long the asker waits, in milliseconds: a member passing the question on gives
    /// its own parent less, so that it can still answer from the servers in time.
    pub wait_ms: u32,
}

/// An entry of a listing, with its attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Named {
    pub name: String,
    pub attr: Attr,
}

/// The answer to an [`Ask`]; a piece's bytes are in the frame's data section.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Answer {
    Attr(Attr),
    Listing(Vec<Named>),
    Piece,
    Failed { errno: i32, why: String },
}

pub fn frame<T: Serialize>(op: u16, kind: FrameKind, id: u64, msg: &T, data: Bytes) -> Result<Frame, FrameError> {
    Ok(Frame { kind, op_code: op, request_id: id, body: encode_body(msg)?, data, data_crc: true })
}

/// A message as the bytes of its frame, ready to be written.
pub fn encoded<T: Serialize>(op: u16, kind: FrameKind, id: u64, msg: &T, data: Bytes) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    frame(op, kind, id, msg, data).map_err(|e| e.to_string())?.encode_into(&mut buf);
    Ok(buf)
}

/// A task writing the frames sent to the returned channel to `wr`, in order, until the
/// channel closes or a write fails.
pub fn spawn_writer(
    mut wr: tokio::net::tcp::OwnedWriteHalf,
) -> (tokio::sync::mpsc::UnboundedSender<Vec<u8>>, tokio::task::JoinHandle<()>) {
    use tokio::io::AsyncWriteExt;
    let (out, mut queue) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let task = tokio::spawn(async move {
        while let Some(buf) = queue.recv().await {
            if wr.write_all(&buf).await.is_err() {
                return;
            }
        }
    });
    (out, task)
}

/// The body of `f`, which must be of operation `op`.
pub fn body<T: serde::de::DeserializeOwned>(f: &Frame, op: u16) -> Result<T, String> {
    if f.op_code != op {
        return Err(format!("expected message {op}, got {}", f.op_code));
    }
    decode_body(&f.body).map_err(|e| e.to_string())
}

pub fn nonce() -> Vec<u8> {
    use rand::RngCore;
    let mut n = vec![0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

/// The asking member's tag (step 2).
pub fn hello_tag(keys: Option<&KeyRing>, epoch: u32, group: u64, rank: u32, challenge: &[u8], nonce: &[u8]) -> Vec<u8> {
    let Some(secret) = keys.and_then(|k| k.get(epoch)) else { return Vec::new() };
    let key = shoal_auth::derive(secret, "coop");
    shoal_auth::tag(&key, ASK_LABEL, &[&group.to_le_bytes(), &rank.to_le_bytes(), challenge, nonce]).to_vec()
}

/// Whether a [`Hello`] answers `challenge` for `group` (always, without keys).
pub fn hello_ok(keys: Option<&KeyRing>, h: &Hello, group: u64, challenge: &[u8]) -> Result<(), String> {
    if h.group != group {
        return Err(format!("member of another group ({:x}, this one is {group:x})", h.group));
    }
    let Some(keys) = keys else { return Ok(()) };
    let Some(secret) = keys.get(h.epoch) else {
        return Err(format!("tagged with host key epoch {}, which this mount does not hold", h.epoch));
    };
    let key = shoal_auth::derive(secret, "coop");
    let parts: [&[u8]; 4] = [&h.group.to_le_bytes(), &h.rank.to_le_bytes(), challenge, &h.nonce];
    match shoal_auth::verify(&key, ASK_LABEL, &parts, &h.tag) {
        true => Ok(()),
        false => Err("its proof of the host key is wrong".into()),
    }
}

/// The answering member's tag (step 3).
pub fn welcome_tag(keys: Option<&KeyRing>, epoch: u32, group: u64, challenge: &[u8], nonce: &[u8]) -> Vec<u8> {
    let Some(secret) = keys.and_then(|k| k.get(epoch)) else { return Vec::new() };
    let key = shoal_auth::derive(secret, "coop");
    shoal_auth::tag(&key, ANSWER_LABEL, &[&group.to_le_bytes(), challenge, nonce]).to_vec()
}

pub fn welcome_ok(
    keys: Option<&KeyRing>,
    epoch: u32,
    w: &Welcome,
    group: u64,
    challenge: &[u8],
    nonce: &[u8],
) -> Result<(), String> {
    let Some(secret) = keys.and_then(|k| k.get(epoch)) else { return Ok(()) };
    let key = shoal_auth::derive(secret, "coop");
    match shoal_auth::verify(&key, ANSWER_LABEL, &[&group.to_le_bytes(), challenge, nonce], &w.tag) {
        true => Ok(()),
        false => Err("the member's proof of the host key is wrong".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shoal_auth::KeyKind;

    proptest! {
        /// Whatever bytes arrive from the network, decoding gives a frame and message or an
        /// error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic_the_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(Some((f, _))) = Frame::decode(&bytes) {
                let _ = body::<Ask>(&f, f.op_code);
                let _ = body::<Answer>(&f, f.op_code);
                let _ = body::<Hello>(&f, f.op_code);
            }
            for op in [OP_CHALLENGE, OP_HELLO, OP_WELCOME, OP_ASK, OP_ANSWER] {
                let f = Frame { kind: FrameKind::Request, op_code: op, request_id: 1, body: Bytes::from(bytes.clone()), data: Bytes::new(), data_crc: false };
                let _ = body::<Ask>(&f, op);
                let _ = body::<Answer>(&f, op);
                let _ = body::<Hello>(&f, op);
                let _ = body::<Welcome>(&f, op);
                let _ = body::<Challenge>(&f, op);
            }
        }
    }

    #[test]
    fn a_hello_verifies_only_for_its_group_challenge_and_key() {
        let ring = KeyRing::generate(KeyKind::Host);
        let (epoch, _) = ring.current();
        let (challenge, nonce) = (nonce(), nonce());
        let tag = hello_tag(Some(&ring), epoch, 7, 3, &challenge, &nonce);
        let h = Hello { group: 7, rank: 3, nonce: nonce.clone(), epoch, tag };
        assert!(hello_ok(Some(&ring), &h, 7, &challenge).is_ok());
        assert!(hello_ok(Some(&ring), &h, 8, &challenge).unwrap_err().contains("another group"));
        assert!(hello_ok(Some(&ring), &h, 7, &super::nonce()).unwrap_err().contains("wrong"));
        let other = KeyRing::generate(KeyKind::Host);
        let e = hello_ok(Some(&other), &h, 7, &challenge).unwrap_err();
        assert!(e.contains("wrong") || e.contains("epoch"), "{e}");
        // A rank changed in flight breaks the tag.
        let forged = Hello { rank: 4, ..h.clone() };
        assert!(hello_ok(Some(&ring), &forged, 7, &challenge).is_err());
        let w = Welcome { tag: welcome_tag(Some(&ring), epoch, 7, &challenge, &nonce) };
        assert!(welcome_ok(Some(&ring), epoch, &w, 7, &challenge, &nonce).is_ok());
        assert!(welcome_ok(Some(&ring), epoch, &w, 7, &challenge, &super::nonce()).is_err());
        // Without keys, nothing is checked but the group.
        assert!(hello_ok(None, &h, 7, &super::nonce()).is_ok());
    }

    #[test]
    fn messages_go_through_frames_and_pieces_of_a_file_spread() {
        let ask = Ask { key: Key::Listing { dir: Ino(5) }, wait_ms: 1500 };
        let f = frame(OP_ASK, FrameKind::Request, 9, &ask, Bytes::new()).unwrap();
        let mut buf = Vec::new();
        f.encode_into(&mut buf);
        let (back, used) = Frame::decode(&buf).unwrap().unwrap();
        assert_eq!(used, buf.len());
        let got: Ask = body(&back, OP_ASK).unwrap();
        assert_eq!((got.key, got.wait_ms, back.request_id), (ask.key, 1500, 9));
        assert!(body::<Ask>(&back, OP_HELLO).is_err());
        let v = Version { size: 10 << 20, mtime: (1, 2), ctime: (1, 2) };
        let roots: std::collections::HashSet<u64> =
            (0..10).map(|i| Key::Piece { ino: Ino(1), version: v, index: i, dir: None }.hash() % 4).collect();
        assert!(roots.len() > 1, "a file's pieces have several designated readers");
    }

    #[test]
    fn a_directory_s_listing_entries_and_first_pieces_share_a_reader() {
        let (dir, file) = (Some(Ino(5)), Ino(9));
        let v = Version { size: 3 << 20, mtime: (1, 2), ctime: (1, 2) };
        let listing = Key::Listing { dir: Ino(5) }.hash();
        assert_eq!(Key::Attr { ino: file, dir }.hash(), listing);
        assert_eq!(Key::Piece { ino: file, version: v, index: 0, dir }.hash(), listing);
        assert_eq!(Key::Entry { dir: Ino(5), name: "libc.so.6".into() }.hash(), listing);
        assert_ne!(Key::Piece { ino: file, version: v, index: 1, dir }.hash(), listing);
        assert_ne!(Key::Attr { ino: file, dir: None }.hash(), listing);
    }
}
