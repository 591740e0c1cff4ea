//! Shoal's wire protocol: the identifiers every component shares, the request and reply
//! messages, and the frame codec that carries them over TCP.
//!
//! A frame is a fixed 32-byte header (operation code, CRC32C checksums), a MessagePack-encoded message body (named fields) and, for reads and
//! writes, the bulk data as raw bytes after the body (never re-encoded). Every length is
//! bounded by [`frame::MAX_BODY`] and [`frame::MAX_DATA`]; a decoder error closes the
//! connection. `docs/protocol.md` describes the format byte by byte.
//!
//! ```
//! use shoal_proto::{frame::{Frame, FrameKind}, msg::{Request, Op, Cred}};
//! let req = Request { cred: Cred::root(), map_version: 1, op: Op::StatFs };
//! let frame = Frame::request(7, &req, bytes::Bytes::new()).unwrap();
//! let mut buf = Vec::new();
//! frame.encode_into(&mut buf);
//! let (back, used) = Frame::decode(&buf).unwrap().unwrap();
//! assert_eq!(used, buf.len());
//! assert_eq!(back.kind, FrameKind::Request);
//! assert_eq!(back.request_id, 7);
//! ```

pub mod auth;
pub mod cap;
pub mod change;
pub mod errno;
pub mod find;
pub mod frame;
pub mod hello;
pub mod ids;
pub mod lease;
pub mod msg;
pub mod opcode;
pub mod tuple;
pub mod usage;

pub use errno::Errno;
pub use ids::{Ino, ServerId, ROOT_INO};

/// Newest version of the wire protocol this build speaks; `Hello` negotiates a version in
/// both peers' ranges (`hello::MIN_PROTOCOL_VERSION ..= PROTOCOL_VERSION`). Bump on any
/// change to [`msg`] or [`frame`] (additive ones included, so peers can tell).
pub const PROTOCOL_VERSION: u32 = 13;
