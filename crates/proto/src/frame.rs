//! Length-framed, checksummed messages on a byte stream (frame header version 2).
//!
//! ```text
//! offset size field
//!      0    4 magic       0x53484F4C ("SHOL"), little endian
//!      4    1 kind        0 = request, 1 = reply, 2 = notice (server to client, unasked)
//!      5    1 flags       bit 0: `data crc` is set (FLAG_DATA_CRC); other bits must be 0
//!      6    2 op code     Op::code (requests), Reply::code (replies), Notice::code; never 0
//!      8    8 request_id  chosen by the sender of the request, echoed in the reply (0 in a notice)
//!     16    4 body_len    bytes of MessagePack body that follow (1 ..= MAX_BODY)
//!     20    4 data_len    raw bulk bytes after the body (0 ..= MAX_DATA)
//!     24    4 data_crc    CRC32C of the data section (0 when flag bit 0 is clear)
//!     28    4 head_crc    CRC32C of bytes 0..28 followed by the body
//! ```
//! The header is written by hand (it is the product's own format); the body is
//! MessagePack (named fields), bounded by the frame's length so that a forged length can
//! never make the decoder allocate more than the frame holds. Lengths are checked before
//! anything is allocated; checksums once the frame's bytes are all there; the op code
//! against the body when the body is decoded.

use crate::msg::{Reply, Request};
use bytes::{BufMut, Bytes, BytesMut};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const MAGIC: u32 = 0x5348_4F4C;
pub const HEADER_LEN: usize = 32;
/// Header flag: the `data_crc` field holds the CRC32C of the data section.
pub const FLAG_DATA_CRC: u8 = 1;
/// Largest encoded message body (a ReadDir reply of READDIR_MAX long names fits).
pub const MAX_BODY: usize = 4 << 20;
/// Largest bulk data section: one read or write request moves at most this much.
pub const MAX_DATA: usize = 64 << 20;

/// A frame's buffer starts at this size (or the frame's, if smaller) and grows only when
/// it is full, to at most [`GROWTH`] times the bytes received so far. A header announcing
/// 64 MiB followed by nothing therefore costs 64 KiB, and memory held for a stalled frame
/// stays within a constant factor of what its sender really sent. The first step is large
/// enough for every metadata request, and a 1 MiB or 2 MiB write grows once, copying 64 KiB
/// (the rest is read straight into its final place, in as few reads as the socket allows).
pub const FIRST_STEP: usize = 64 << 10;
/// See [`FIRST_STEP`].
pub const GROWTH: usize = 32;

/// Make the C allocator keep the memory of freed frame buffers for the next frames.
///
/// Every frame is read into one fresh buffer of its size (a 1 MiB read or write is a 1 MiB
/// buffer). By default glibc serves such sizes with `mmap` at first and returns freed
/// memory at the top of a heap to the kernel, so buffer after buffer arrives as new pages:
/// a page fault and a kernel page clear per 4 KiB, on top of the copy from the socket (about
/// a third of a client's CPU per MiB read, measured). Raising the thresholds
/// (`M_MMAP_THRESHOLD` to 32 MiB, the most glibc accepts, `M_TRIM_THRESHOLD` to 256 MiB)
/// lets freed buffers be reused as they are. Process-wide: the `shoal` and `shoald`
/// binaries call it first thing; a program embedding the client may do the same. A no-op
/// on other C libraries.
pub fn keep_freed_frame_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request,
    Reply,
    /// A message a server sends on a client's connection without being asked
    /// (`lease::Notice`), only where the client negotiated `FEATURE_LEASES`.
    Notice,
}

/// Why a frame could not be decoded. Any of these closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:#010x} (not a Shoal peer, or the stream lost sync)")]
    BadMagic(u32),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("reserved header bits set")]
    Reserved,
    #[error(
        "frame without an operation code: a peer of protocol 4 or older (24-byte header), which this side \
         ({}..={}) does not speak",
        crate::hello::MIN_PROTOCOL_VERSION,
        crate::PROTOCOL_VERSION
    )]
    NoOpCode,
    #[error("CRC32C checksum mismatch over the {what} of request {request_id}: the header says {expected:#010x}, the bytes give {actual:#010x}")]
    Checksum { what: &'static str, request_id: u64, expected: u32, actual: u32 },
    #[error("operation code {header} in the header, but the body is a message of code {body}")]
    OpCode { header: u16, body: u16 },
    #[error("body length {0} out of bounds (1..={MAX_BODY})")]
    BodyLen(usize),
    #[error("data length {0} out of bounds (max {MAX_DATA})")]
    DataLen(usize),
    #[error("undecodable message body: {0}")]
    Body(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// One frame: header fields, the encoded body, and the raw data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    /// `Op::code` or `Reply::code` of the body.
    pub op_code: u16,
    pub request_id: u64,
    pub body: Bytes,
    pub data: Bytes,
    /// Whether the data section is checksummed: on by default; the sender clears it on a
    /// connection that did not negotiate `FEATURE_DATA_CRC`. A decoded frame says whether
    /// its sender set it (and then the checksum was verified, or handed to the caller to
    /// verify: [`Frame::read_deferring_data_crc`]).
    pub data_crc: bool,
}

/// Encode a message body: MessagePack with every struct a map keyed by field name and
/// every enum variant tagged by its name. The names are the tags: a peer ignores fields it
/// does not know and fills in missing optional ones, so a field or a message can be added
/// without breaking older peers (never rename one; see docs/protocol.md).
pub fn encode_body<T: Serialize>(msg: &T) -> Result<Bytes, FrameError> {
    let v = rmp_serde::to_vec_named(msg).map_err(|e| FrameError::Body(e.to_string()))?;
    if v.is_empty() || v.len() > MAX_BODY {
        return Err(FrameError::BodyLen(v.len()));
    }
    Ok(Bytes::from(v))
}

/// Decode a message body; never panics on arbitrary input, and never allocates more than
/// the body holds (serde caps preallocation by the input's length). Trailing bytes after
/// the message are an error, as a body is exactly one message.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let mut de = rmp_serde::Deserializer::from_read_ref(body);
    let msg = T::deserialize(&mut de).map_err(|e| FrameError::Body(e.to_string()))?;
    // The deserializer does not say where it stopped; asking it for one more value does:
    // only a clean end of input (no marker to read) means the message was all there was.
    match serde::de::IgnoredAny::deserialize(&mut de) {
        Err(rmp_serde::decode::Error::InvalidMarkerRead(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(msg),
        _ => Err(FrameError::Body("trailing bytes after the message".into())),
    }
}

struct Header {
    kind: FrameKind,
    data_crc: Option<u32>,
    op_code: u16,
    request_id: u64,
    body_len: usize,
    data_len: usize,
    head_crc: u32,
}

fn parse_header(h: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
    let magic = u32::from_le_bytes(h[0..4].try_into().unwrap());
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    let kind = match h[4] {
        0 => FrameKind::Request,
        1 => FrameKind::Reply,
        2 => FrameKind::Notice,
        k => return Err(FrameError::BadKind(k)),
    };
    if h[5] & !FLAG_DATA_CRC != 0 {
        return Err(FrameError::Reserved);
    }
    let op_code = u16::from_le_bytes(h[6..8].try_into().unwrap());
    if op_code == 0 {
        return Err(FrameError::NoOpCode);
    }
    let request_id = u64::from_le_bytes(h[8..16].try_into().unwrap());
    let body_len = u32::from_le_bytes(h[16..20].try_into().unwrap()) as usize;
    let data_len = u32::from_le_bytes(h[20..24].try_into().unwrap()) as usize;
    let data_crc = u32::from_le_bytes(h[24..28].try_into().unwrap());
    let head_crc = u32::from_le_bytes(h[28..32].try_into().unwrap());
    if body_len == 0 || body_len > MAX_BODY {
        return Err(FrameError::BodyLen(body_len));
    }
    if data_len > MAX_DATA {
        return Err(FrameError::DataLen(data_len));
    }
    let data_crc = if h[5] & FLAG_DATA_CRC != 0 {
        Some(data_crc)
    } else if data_crc != 0 {
        return Err(FrameError::Reserved);
    } else {
        None
    };
    Ok(Header { kind, data_crc, op_code, request_id, body_len, data_len, head_crc })
}

/// CRC32C of the header's first 28 bytes followed by the body: what `head_crc` holds.
fn head_crc(h: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&h[..HEADER_LEN - 4]), body)
}

impl FrameError {
    /// The error for a data section whose CRC32C is `actual` where the header announced
    /// `expected`: what the frame reader reports, and what a caller that checks a deferred
    /// data checksum itself ([`Frame::read_deferring_data_crc`]) reports too.
    pub fn data_checksum(request_id: u64, expected: u32, actual: u32) -> FrameError {
        FrameError::Checksum { what: "data", request_id, expected, actual }
    }
}

impl Header {
    /// Check both checksums of a frame whose bytes have all arrived.
    fn verify(&self, raw: &[u8; HEADER_LEN], body: &[u8], data: &[u8]) -> Result<(), FrameError> {
        self.verify_head(raw, body)?;
        if let Some(expected) = self.data_crc {
            let actual = crc32c::crc32c(data);
            if actual != expected {
                return Err(FrameError::data_checksum(self.request_id, expected, actual));
            }
        }
        Ok(())
    }

    /// Check the checksum of the header and the body.
    fn verify_head(&self, raw: &[u8; HEADER_LEN], body: &[u8]) -> Result<(), FrameError> {
        let actual = head_crc(raw, body);
        if actual != self.head_crc {
            return Err(FrameError::Checksum {
                what: "header and body",
                request_id: self.request_id,
                expected: self.head_crc,
                actual,
            });
        }
        Ok(())
    }

    fn frame(&self, body: Bytes, data: Bytes) -> Frame {
        Frame {
            kind: self.kind,
            op_code: self.op_code,
            request_id: self.request_id,
            body,
            data,
            data_crc: self.data_crc.is_some(),
        }
    }
}

impl Frame {
    pub fn request(request_id: u64, req: &Request, data: Bytes) -> Result<Frame, FrameError> {
        Frame::new(FrameKind::Request, req.op.code(), request_id, encode_body(req)?, data)
    }

    pub fn reply(request_id: u64, reply: &Reply, data: Bytes) -> Result<Frame, FrameError> {
        Frame::new(FrameKind::Reply, reply.code(), request_id, encode_body(reply)?, data)
    }

    /// A notice (request id 0: nothing answers it; its acknowledgement, if any, is a request
    /// of its own).
    pub fn notice(notice: &crate::lease::Notice) -> Result<Frame, FrameError> {
        let mut f = Frame::new(FrameKind::Notice, notice.code(), 0, encode_body(notice)?, Bytes::new())?;
        // No data section, so no data checksum, whatever the connection negotiated.
        f.data_crc = false;
        Ok(f)
    }

    fn new(kind: FrameKind, op_code: u16, request_id: u64, body: Bytes, data: Bytes) -> Result<Frame, FrameError> {
        if data.len() > MAX_DATA {
            return Err(FrameError::DataLen(data.len()));
        }
        Ok(Frame { kind, op_code, request_id, body, data, data_crc: true })
    }

    /// The header for this frame with `data_len` bytes of data whose checksum (if any) is
    /// `data_crc`.
    fn header(&self, data_len: usize, data_crc: Option<u32>) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4] = match self.kind {
            FrameKind::Request => 0,
            FrameKind::Reply => 1,
            FrameKind::Notice => 2,
        };
        h[5] = if data_crc.is_some() { FLAG_DATA_CRC } else { 0 };
        h[6..8].copy_from_slice(&self.op_code.to_le_bytes());
        h[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        h[16..20].copy_from_slice(&(self.body.len() as u32).to_le_bytes());
        h[20..24].copy_from_slice(&(data_len as u32).to_le_bytes());
        h[24..28].copy_from_slice(&data_crc.unwrap_or(0).to_le_bytes());
        let crc = head_crc(&h, &self.body);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        h
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.head());
        out.extend_from_slice(&self.data);
    }

    /// Decode one frame from the front of `buf`: `Ok(None)` if more bytes are needed,
    /// otherwise the frame (checksums verified) and how many bytes it used.
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let raw: &[u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().unwrap();
        let h = parse_header(raw)?;
        let total = HEADER_LEN + h.body_len + h.data_len;
        if buf.len() < total {
            return Ok(None);
        }
        let (body, data) = (&buf[HEADER_LEN..HEADER_LEN + h.body_len], &buf[HEADER_LEN + h.body_len..total]);
        h.verify(raw, body, data)?;
        Ok(Some((h.frame(Bytes::copy_from_slice(body), Bytes::copy_from_slice(data)), total)))
    }

    /// Read one frame and verify its checksums. `Ok(None)` on a clean end of stream before
    /// a header.
    pub async fn read_from<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, FrameError> {
        Ok(Frame::read_deferring_data_crc(r, None).await?.map(|(f, deferred)| {
            debug_assert!(deferred.is_none(), "nothing is deferred without an op code");
            f
        }))
    }

    /// Read one frame as [`Frame::read_from`] does, except for a request frame of operation
    /// `defer_op` (an op code, `None` for none) that carries a data checksum: its data
    /// section is NOT checked here, and the CRC32C its header announced comes back with it.
    /// Every other frame is checked whole, as by `read_from`.
    ///
    /// For a receiver that makes its own pass over those bytes anyway (the server computes
    /// the CRC32C of each block piece of a `Write` for its object checksums, and combines
    /// them into the section's): one pass instead of two. The caller must compare before it
    /// uses a byte of the data, and report a mismatch as [`FrameError::data_checksum`]. The
    /// header and body are checked here in every case, so the op code (which chose to
    /// defer) is the sender's, and `request_body` checks it against the body.
    pub async fn read_deferring_data_crc<R: AsyncRead + Unpin>(
        r: &mut R,
        defer_op: Option<u16>,
    ) -> Result<Option<(Frame, Option<u32>)>, FrameError> {
        let mut raw = [0u8; HEADER_LEN];
        match r.read_exact(&mut raw).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let h = parse_header(&raw)?;
        // One buffer for body and data (both are views into it), filled straight from the
        // stream: not zeroed first. It grows with what has arrived, never to what the header
        // merely announces (see FIRST_STEP and GROWTH).
        let total = h.body_len + h.data_len;
        let mut buf = BytesMut::with_capacity(total.min(FIRST_STEP));
        while buf.len() < total {
            if buf.len() == buf.capacity() {
                let target = total.min(buf.len() * GROWTH);
                buf.reserve(target - buf.len());
            }
            let want = (total - buf.len()).min(buf.capacity() - buf.len());
            if r.read_buf(&mut (&mut buf).limit(want)).await? == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
        }
        let deferred = match h.data_crc {
            Some(expected) if h.kind == FrameKind::Request && defer_op == Some(h.op_code) => {
                h.verify_head(&raw, &buf[..h.body_len])?;
                Some(expected)
            }
            _ => {
                h.verify(&raw, &buf[..h.body_len], &buf[h.body_len..])?;
                None
            }
        };
        let mut all = buf.freeze();
        let data = all.split_off(h.body_len);
        Ok(Some((h.frame(all, data), deferred)))
    }

    /// The header and body of a reply whose `data_len` bytes of data the sender writes
    /// itself after them (from a file, with `sendfile`), without a data checksum: the
    /// sender has not read the bytes (a connection without `FEATURE_DATA_CRC`).
    pub fn reply_head(request_id: u64, reply: &Reply, data_len: usize) -> Result<Vec<u8>, FrameError> {
        if data_len > MAX_DATA {
            return Err(FrameError::DataLen(data_len));
        }
        let f = Frame::new(FrameKind::Reply, reply.code(), request_id, encode_body(reply)?, Bytes::new())?;
        let mut head = Vec::with_capacity(HEADER_LEN + f.body.len());
        head.extend_from_slice(&f.header(data_len, None));
        head.extend_from_slice(&f.body);
        Ok(head)
    }

    /// The header and the body in one buffer: what goes on the wire before `data`. The data
    /// checksum (when `data_crc` is set) is computed here, over the data in memory.
    pub fn head(&self) -> Vec<u8> {
        let data_crc = self.data_crc.then(|| crc32c::crc32c(&self.data));
        let mut head = Vec::with_capacity(HEADER_LEN + self.body.len());
        head.extend_from_slice(&self.header(self.data.len(), data_crc));
        head.extend_from_slice(&self.body);
        head
    }

    /// Write the frame (header and body in one buffer, data straight from its own buffer).
    pub async fn write_to<W: AsyncWrite + Unpin>(&self, w: &mut W) -> Result<(), FrameError> {
        w.write_all(&self.head()).await?;
        if !self.data.is_empty() {
            w.write_all(&self.data).await?;
        }
        Ok(())
    }

    /// The request in the body; its operation must be the header's op code.
    pub fn request_body(&self) -> Result<Request, FrameError> {
        let req: Request = decode_body(&self.body)?;
        self.check_code(req.op.code())?;
        Ok(req)
    }

    /// The reply in the body; it must be of the header's op code.
    pub fn reply_body(&self) -> Result<Reply, FrameError> {
        let reply: Reply = decode_body(&self.body)?;
        self.check_code(reply.code())?;
        Ok(reply)
    }

    /// The notice in the body; it must be of the header's code.
    pub fn notice_body(&self) -> Result<crate::lease::Notice, FrameError> {
        let notice: crate::lease::Notice = decode_body(&self.body)?;
        self.check_code(notice.code())?;
        Ok(notice)
    }

    fn check_code(&self, body: u16) -> Result<(), FrameError> {
        if body != self.op_code {
            return Err(FrameError::OpCode { header: self.op_code, body });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Cred, Op};
    use proptest::prelude::*;

    fn sample() -> Vec<u8> {
        let req = Request {
            cred: Cred::root(),
            map_version: 3,
            op: Op::Lookup { dir: crate::ROOT_INO, name: "a".into(), lease: None },
        };
        let f = Frame::request(42, &req, Bytes::from_static(b"xyz")).unwrap();
        let mut v = Vec::new();
        f.encode_into(&mut v);
        v
    }

    #[test]
    fn round_trip_keeps_id_body_and_data() {
        let v = sample();
        let (f, n) = Frame::decode(&v).unwrap().unwrap();
        assert_eq!(n, v.len());
        assert_eq!(f.request_id, 42);
        assert_eq!(&f.data[..], b"xyz");
        assert!(matches!(f.request_body().unwrap().op, Op::Lookup { .. }));
    }

    #[test]
    fn head_then_data_is_the_encoding() {
        let req = Request {
            cred: Cred::root(),
            map_version: 3,
            op: Op::Lookup { dir: crate::ROOT_INO, name: "a".into(), lease: None },
        };
        let f = Frame::request(42, &req, Bytes::from_static(b"xyz")).unwrap();
        let mut v = f.head();
        v.extend_from_slice(&f.data);
        assert_eq!(v, sample());
    }

    #[test]
    fn a_reply_head_announces_the_data_that_follows() {
        let reply = Reply::Data;
        let mut v = Frame::reply_head(7, &reply, 5).unwrap();
        v.extend_from_slice(b"12345");
        let (f, n) = Frame::decode(&v).unwrap().unwrap();
        assert_eq!(n, v.len());
        assert_eq!(f.request_id, 7);
        assert_eq!(&f.data[..], b"12345");
        assert!(!f.data_crc, "a head for data sent from a file carries no data checksum");
        let mut whole = Frame::reply(7, &reply, Bytes::from_static(b"12345")).unwrap();
        whole.data_crc = false;
        assert_eq!(v[..HEADER_LEN + f.body.len()], whole.head()[..]);
        assert!(Frame::reply_head(7, &reply, MAX_DATA + 1).is_err());
    }

    #[tokio::test]
    async fn frames_are_read_whole_from_a_trickling_stream() {
        let req = Request {
            cred: Cred::root(),
            map_version: 3,
            op: Op::Lookup { dir: crate::ROOT_INO, name: "a".into(), lease: None },
        };
        let data: Bytes = (0..100_000u32).map(|i| i as u8).collect::<Vec<u8>>().into();
        let f = Frame::request(9, &req, data.clone()).unwrap();
        let mut wire = Vec::new();
        f.encode_into(&mut wire);
        f.encode_into(&mut wire);
        // A reader that hands out at most 777 bytes per read.
        let (mut a, mut b) = tokio::io::duplex(777);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            a.write_all(&wire).await.unwrap();
        });
        for _ in 0..2 {
            let got = Frame::read_from(&mut b).await.unwrap().unwrap();
            assert_eq!(got, f);
        }
        writer.await.unwrap();
        assert!(Frame::read_from(&mut b).await.unwrap().is_none());
    }

    /// Hands out at most `step` bytes per read from `wire`, and records the largest buffer
    /// offered relative to the bytes handed out before it.
    struct Recorder {
        wire: Vec<u8>,
        pos: usize,
        step: usize,
        reads: usize,
        /// (bytes handed out before the read, room offered by the read), per read.
        offers: Vec<(usize, usize)>,
    }

    impl tokio::io::AsyncRead for Recorder {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let (pos, room) = (self.pos, buf.remaining());
            self.offers.push((pos, room));
            self.reads += 1;
            let n = room.min(self.step).min(self.wire.len() - pos);
            buf.put_slice(&self.wire[pos..pos + n]);
            self.pos += n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    fn write_frame(data_len: usize) -> Frame {
        let req = Request {
            cred: Cred::root(),
            map_version: 3,
            op: Op::Write {
                ino: crate::ROOT_INO,
                index: 0,
                offset: 0,
                file_end: 0,
                inode_local: false,
                cap: None,
                copies: 1,
            },
        };
        let data: Bytes = (0..data_len).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
        Frame::request(5, &req, data).unwrap()
    }

    #[tokio::test]
    async fn a_frame_buffer_grows_only_with_the_bytes_that_arrived() {
        // A header announcing 64 MiB, then bytes trickling in 1 KiB at a time.
        let f = write_frame(MAX_DATA);
        let mut wire = Vec::new();
        f.encode_into(&mut wire);
        wire.truncate(HEADER_LEN + (300 << 10));
        let mut r = Recorder { wire, pos: 0, step: 1024, reads: 0, offers: Vec::new() };
        assert!(Frame::read_from(&mut r).await.is_err(), "the stream ends inside the frame");
        for &(arrived, room) in &r.offers[1..] {
            let body_arrived = arrived - HEADER_LEN;
            assert!(
                body_arrived + room <= FIRST_STEP.max(body_arrived * GROWTH),
                "{room} bytes of room offered after {body_arrived} bytes of the frame arrived"
            );
        }
    }

    #[tokio::test]
    async fn a_one_mebibyte_write_is_read_in_a_few_large_reads() {
        let f = write_frame(1 << 20);
        let mut wire = Vec::new();
        f.encode_into(&mut wire);
        let mut r = Recorder { wire, pos: 0, step: usize::MAX, reads: 0, offers: Vec::new() };
        let got = Frame::read_from(&mut r).await.unwrap().unwrap();
        assert_eq!(got, f);
        assert!(r.reads <= 3, "{} reads for one frame of 1 MiB", r.reads);
    }

    #[tokio::test]
    async fn a_deferred_data_checksum_is_left_to_the_caller_for_that_op_code_only() {
        let f = write_frame(100_000);
        let mut wire = Vec::new();
        f.encode_into(&mut wire);
        let n = wire.len();
        wire[n - 1] ^= 0x10; // the data section, damaged in transit
        let announced = u32::from_le_bytes(wire[24..28].try_into().unwrap());
        // Deferred: the frame comes back with what its header announced, for the caller to
        // compare with its own pass over the bytes.
        let (got, deferred) = Frame::read_deferring_data_crc(&mut &wire[..], Some(f.op_code)).await.unwrap().unwrap();
        assert_eq!(deferred, Some(announced));
        assert_eq!(announced, crc32c::crc32c(&f.data));
        assert_ne!(crc32c::crc32c(&got.data), announced, "the damage is there for the caller to find");
        // Not deferred (another op code, or none): checked here, as always.
        for other in [None, Some(f.op_code + 1)] {
            let e = Frame::read_deferring_data_crc(&mut &wire[..], other).await.unwrap_err();
            assert!(matches!(e, FrameError::Checksum { what: "data", request_id: 5, .. }), "{e}");
        }
        // The header and body are checked even when the data's checksum is deferred.
        let mut wire = Vec::new();
        f.encode_into(&mut wire);
        wire[HEADER_LEN + 2] ^= 1;
        let e = Frame::read_deferring_data_crc(&mut &wire[..], Some(f.op_code)).await.unwrap_err();
        assert!(matches!(e, FrameError::Checksum { what: "header and body", .. }), "{e}");
    }

    #[test]
    fn a_body_is_exactly_one_message() {
        let req = Request { cred: Cred::root(), map_version: 3, op: Op::StatFs };
        let mut body = encode_body(&req).unwrap().to_vec();
        assert_eq!(decode_body::<Request>(&body).unwrap(), req);
        body.push(0xc0);
        assert!(decode_body::<Request>(&body).is_err(), "a trailing nil is refused");
    }

    #[test]
    fn fields_and_variants_travel_by_name() {
        // The names are the tags that keep the format evolvable (docs/protocol.md).
        let req = Request { cred: Cred::root(), map_version: 3, op: Op::GetAttr { ino: crate::ROOT_INO } };
        let body = encode_body(&req).unwrap();
        for name in ["cred", "map_version", "op", "GetAttr", "ino"] {
            assert!(body.windows(name.len()).any(|w| w == name.as_bytes()), "{name} is not in the body");
        }
    }

    #[test]
    fn every_truncation_asks_for_more_bytes() {
        let v = sample();
        for cut in 0..v.len() {
            assert!(Frame::decode(&v[..cut]).unwrap().is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn every_flipped_bit_is_caught_by_a_checksum_or_a_header_check() {
        let v = sample();
        for i in 0..v.len() {
            for bit in 0..8 {
                let mut w = v.clone();
                w[i] ^= 1 << bit;
                match Frame::decode(&w) {
                    // A flipped length may ask for more bytes than the frame has.
                    Ok(None) => assert!((16..24).contains(&i), "byte {i} bit {bit}"),
                    Ok(Some(_)) => panic!("byte {i} bit {bit} flipped and the frame decoded"),
                    Err(FrameError::Checksum { what, .. }) => {
                        assert_eq!(what == "data", i >= v.len() - 3, "byte {i}: {what}")
                    }
                    Err(_) => assert!(i < HEADER_LEN, "byte {i} bit {bit}: not a checksum error"),
                }
            }
        }
    }

    #[test]
    fn without_the_data_checksum_only_header_and_body_are_covered() {
        let req = Request { cred: Cred::root(), map_version: 3, op: Op::StatFs };
        let mut f = Frame::request(1, &req, Bytes::from_static(b"xyz")).unwrap();
        f.data_crc = false;
        let mut v = Vec::new();
        f.encode_into(&mut v);
        assert_eq!(v[5] & FLAG_DATA_CRC, 0);
        assert_eq!(v[24..28], [0; 4]);
        let n = v.len();
        v[n - 1] ^= 1;
        let (got, _) = Frame::decode(&v).unwrap().unwrap();
        assert!(!got.data_crc);
        assert_eq!(&got.data[..], b"xy{");
    }

    #[test]
    fn the_op_code_must_match_the_body() {
        let v = sample();
        let (f, _) = Frame::decode(&v).unwrap().unwrap();
        assert_eq!(f.op_code, Op::Lookup { dir: crate::ROOT_INO, name: String::new(), lease: None }.code());
        assert_eq!(u16::from_le_bytes([v[6], v[7]]), f.op_code);
        let mut forged = f.clone();
        forged.op_code = Op::StatFs.code();
        let mut w = Vec::new();
        forged.encode_into(&mut w);
        let (back, _) = Frame::decode(&w).unwrap().unwrap();
        assert!(matches!(back.request_body(), Err(FrameError::OpCode { header: 25, body: 2 })));
        assert!(matches!(back.reply_body(), Err(FrameError::Body(_) | FrameError::OpCode { .. })));
    }

    #[test]
    fn a_header_of_protocol_4_or_older_is_named_as_such() {
        // Versions 1 to 4 had zeros where the op code is now.
        let mut v = sample();
        v[6..8].copy_from_slice(&[0, 0]);
        let e = Frame::decode(&v).unwrap_err();
        assert!(matches!(e, FrameError::NoOpCode));
        assert!(e.to_string().contains("protocol 4 or older"), "{e}");
    }

    #[test]
    fn oversized_lengths_are_rejected_before_allocating() {
        let mut v = sample();
        v[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Frame::decode(&v), Err(FrameError::BodyLen(_))));
        let mut v = sample();
        v[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Frame::decode(&v), Err(FrameError::DataLen(_))));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn decoder_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(Some((f, _))) = Frame::decode(&bytes) {
                let _ = f.request_body();
                let _ = f.reply_body();
            }
        }

        #[test]
        fn decoder_never_panics_on_mutated_frames(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
            let mut v = sample();
            for (i, b) in flips { let n = v.len(); v[i % n] = b; }
            if let Ok(Some((f, _))) = Frame::decode(&v) {
                let _ = f.request_body();
            }
        }

        #[test]
        fn random_op_codes_flags_and_checksums_are_refused(
            code in any::<u16>(), flags in any::<u8>(), data_crc in any::<u32>(), head_crc in any::<u32>()
        ) {
            let mut v = sample();
            let (good, _) = Frame::decode(&v).unwrap().unwrap();
            v[5] = flags;
            v[6..8].copy_from_slice(&code.to_le_bytes());
            v[24..28].copy_from_slice(&data_crc.to_le_bytes());
            v[28..32].copy_from_slice(&head_crc.to_le_bytes());
            match Frame::decode(&v) {
                Ok(Some((f, _))) => {
                    // Only a header whose checksums hold decodes, and then the body must
                    // still be of the header's op code.
                    prop_assert_eq!(head_crc, super::head_crc(&v, &good.body));
                    prop_assert_eq!(f.request_body().is_ok(), code == good.op_code);
                }
                Ok(None) => prop_assert!(false, "a whole frame asks for more bytes"),
                Err(_) => {}
            }
        }

        #[test]
        fn body_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_body::<Request>(&bytes);
            let _ = decode_body::<Reply>(&bytes);
        }
    }
}
