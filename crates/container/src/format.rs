//! The container format, byte by byte (docs/container-format.md says the same in prose).
//!
//! Every physical file of a container is complete on its own:
//!
//! ```text
//! [0, data_start)                  header (metadata block 1), padded to the block size
//! [data_start, tail_at)            blocks of chunks: block b at data_start + b * block_len;
//!                                  task i's chunk of block b at + chunk_off[i], chunk_len[i] long
//! [tail_at, tail_at + tail_len)    tail (metadata block 2): chunks used and bytes per chunk,
//!                                  and in file 0 of a multi-file container the task map
//! [end - 32, end)                  trailer: where the tail is
//! ```
//!
//! All integers are little-endian. The header is written when the container is opened
//! (everything in it is known then); the tail and the trailer when it is closed. Each of
//! the three ends with a CRC32C of what precedes it in the block, so a reader tells a
//! container that was never closed (no trailer), one cut short (the tail or header runs
//! past the end) and one with flipped bits (a checksum differs) apart, and says which.

use crate::error::{Corrupt, Where};

/// First bytes of a header.
pub const HEADER_MAGIC: &[u8; 8] = b"SHOALCTR";
/// First bytes of a tail.
pub const TAIL_MAGIC: &[u8; 8] = b"SHOALEND";
/// First bytes of a trailer.
pub const TRAILER_MAGIC: &[u8; 8] = b"SHOALTRL";
/// The format this library writes; it reads this one only.
pub const FORMAT_VERSION: u32 = 1;
/// Length of the trailer at the end of every physical file.
pub const TRAILER_LEN: u64 = 32;

/// Header flag: the logical files hold key-value records (`kv.rs`).
pub const FLAG_KEY_VALUE: u32 = 1;
/// Header flag: chunks are packed per collector group (coalescing I/O, `coalesce.rs`).
pub const FLAG_COALESCED: u32 = 2;

/// Metadata block 1 of one physical file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub flags: u32,
    /// Coalescing I/O: tasks per collector group (consecutive in the file; their chunks
    /// packed, each group's start aligned to `fs_block`); 0 without.
    pub collector_size: u32,
    /// The file system block size chunks were aligned to.
    pub fs_block: u64,
    pub file_number: u32,
    pub nfiles: u32,
    /// Tasks of the whole container (over all its physical files).
    pub ntasks: u64,
    /// Where block 0 starts (a multiple of `fs_block`).
    pub data_start: u64,
    /// Bytes from one block to the next.
    pub block_len: u64,
    /// The tasks of this file, in their order within a block.
    pub tasks: Vec<TaskSlot>,
}

/// One task's place in every block of its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskSlot {
    /// The task's rank in the container (its logical file's number).
    pub rank: u64,
    /// Where its chunk starts within a block.
    pub chunk_off: u64,
    /// Bytes of its chunk.
    pub chunk_len: u64,
}

/// Bytes of a header's fixed part (before the task slots) and of one slot.
const HEADER_FIXED: usize = 8 + 4 + 4 + 4 + 8 + 4 + 4 + 8 + 8 + 8 + 8;
const SLOT_LEN: usize = 24;

impl Header {
    /// Encoded length, checksum included (`data_start` must leave room for it).
    pub fn encoded_len(ntasks_here: usize) -> u64 {
        (HEADER_FIXED + SLOT_LEN * ntasks_here + 4) as u64
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Header::encoded_len(self.tasks.len()) as usize);
        b.extend_from_slice(HEADER_MAGIC);
        put32(&mut b, FORMAT_VERSION);
        put32(&mut b, self.flags);
        put32(&mut b, self.collector_size);
        put64(&mut b, self.fs_block);
        put32(&mut b, self.file_number);
        put32(&mut b, self.nfiles);
        put64(&mut b, self.ntasks);
        put64(&mut b, self.data_start);
        put64(&mut b, self.block_len);
        put64(&mut b, self.tasks.len() as u64);
        for t in &self.tasks {
            put64(&mut b, t.rank);
            put64(&mut b, t.chunk_off);
            put64(&mut b, t.chunk_len);
        }
        seal(b)
    }

    /// The fixed part's task count, from the first [`HEADER_FIXED`] bytes, to know how much
    /// more to read.
    pub fn tasks_in(first: &[u8]) -> Result<u64, Corrupt> {
        let mut r = Reader::new(first, Where::Header);
        r.magic(HEADER_MAGIC)?;
        r.version()?;
        r.skip(4 + 4 + 8 + 4 + 4 + 8 + 8 + 8)?;
        let n = r.u64()?;
        if n > (u32::MAX as u64) {
            return Err(Corrupt::Field(Where::Header, "task count"));
        }
        Ok(n)
    }

    /// Bytes to read first: enough for [`Header::tasks_in`].
    pub const FIXED_LEN: usize = HEADER_FIXED;

    pub fn decode(bytes: &[u8]) -> Result<Header, Corrupt> {
        let body = unseal(bytes, Where::Header)?;
        let mut r = Reader::new(body, Where::Header);
        r.magic(HEADER_MAGIC)?;
        r.version()?;
        let flags = r.u32()?;
        let collector_size = r.u32()?;
        let fs_block = r.u64()?;
        let file_number = r.u32()?;
        let nfiles = r.u32()?;
        let ntasks = r.u64()?;
        let data_start = r.u64()?;
        let block_len = r.u64()?;
        let n = r.u64()? as usize;
        let mut tasks = Vec::with_capacity(n.min(body.len() / SLOT_LEN));
        for _ in 0..n {
            tasks.push(TaskSlot { rank: r.u64()?, chunk_off: r.u64()?, chunk_len: r.u64()? });
        }
        r.end()?;
        let h = Header { flags, collector_size, fs_block, file_number, nfiles, ntasks, data_start, block_len, tasks };
        h.check()?;
        Ok(h)
    }

    /// What a reader relies on: chunks inside their block, blocks after the header.
    fn check(&self) -> Result<(), Corrupt> {
        let bad = |what| Err(Corrupt::Field(Where::Header, what));
        if self.fs_block == 0 || self.nfiles == 0 || self.file_number >= self.nfiles {
            return bad("block size or file number");
        }
        if self.data_start < Header::encoded_len(self.tasks.len()) {
            return bad("data start");
        }
        for t in &self.tasks {
            if t.rank >= self.ntasks || t.chunk_off.checked_add(t.chunk_len).is_none_or(|e| e > self.block_len) {
                return bad("task slot");
            }
        }
        Ok(())
    }
}

/// Metadata block 2 of one physical file, written at close.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tail {
    /// Blocks written in this file (the longest task's).
    pub nblocks: u64,
    /// Per task of the header, in its order: bytes used in each of its chunks (one entry
    /// per block it reached).
    pub used: Vec<Vec<u64>>,
    /// File 0 of a multi-file container: per rank, the physical file holding its logical
    /// file and its index among that file's tasks. Empty otherwise.
    pub map: Vec<(u32, u64)>,
}

impl Tail {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(TAIL_MAGIC);
        put64(&mut b, self.nblocks);
        put64(&mut b, self.used.len() as u64);
        for chunks in &self.used {
            put64(&mut b, chunks.len() as u64);
            for &u in chunks {
                put64(&mut b, u);
            }
        }
        put64(&mut b, self.map.len() as u64);
        for &(file, index) in &self.map {
            put32(&mut b, file);
            put64(&mut b, index);
        }
        seal(b)
    }

    pub fn decode(bytes: &[u8], header: &Header) -> Result<Tail, Corrupt> {
        let body = unseal(bytes, Where::Tail)?;
        let mut r = Reader::new(body, Where::Tail);
        r.magic(TAIL_MAGIC)?;
        let nblocks = r.u64()?;
        let n = r.u64()? as usize;
        if n != header.tasks.len() {
            return Err(Corrupt::Field(Where::Tail, "task count (differs from the header's)"));
        }
        let mut used = Vec::with_capacity(n);
        for t in &header.tasks {
            let k = r.u64()?;
            if k > nblocks {
                return Err(Corrupt::Field(Where::Tail, "chunk count"));
            }
            let mut chunks = Vec::with_capacity(k as usize);
            for _ in 0..k {
                let u = r.u64()?;
                if u > t.chunk_len {
                    return Err(Corrupt::Field(Where::Tail, "bytes used in a chunk"));
                }
                chunks.push(u);
            }
            used.push(chunks);
        }
        let m = r.u64()? as usize;
        if m != 0 && m as u64 != header.ntasks {
            return Err(Corrupt::Field(Where::Tail, "task map length"));
        }
        let mut map = Vec::with_capacity(m.min(body.len() / 12));
        for _ in 0..m {
            let file = r.u32()?;
            let index = r.u64()?;
            if file >= header.nfiles {
                return Err(Corrupt::Field(Where::Tail, "task map"));
            }
            map.push((file, index));
        }
        r.end()?;
        Ok(Tail { nblocks, used, map })
    }
}

/// The last [`TRAILER_LEN`] bytes of a physical file: where its tail is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trailer {
    pub tail_at: u64,
    pub tail_len: u64,
}

impl Trailer {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(TRAILER_LEN as usize);
        b.extend_from_slice(TRAILER_MAGIC);
        put64(&mut b, self.tail_at);
        put64(&mut b, self.tail_len);
        let mut b = seal(b);
        put32(&mut b, 0);
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Trailer, Corrupt> {
        if bytes.len() != TRAILER_LEN as usize || &bytes[..8] != TRAILER_MAGIC {
            return Err(Corrupt::NotClosed);
        }
        let body = unseal(&bytes[..28], Where::Trailer)?;
        let mut r = Reader::new(body, Where::Trailer);
        r.magic(TRAILER_MAGIC)?;
        Ok(Trailer { tail_at: r.u64()?, tail_len: r.u64()? })
    }
}

fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// `b` followed by its CRC32C.
fn seal(mut b: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&b);
    put32(&mut b, crc);
    b
}

/// The bytes before a block's CRC32C, if it matches.
fn unseal(bytes: &[u8], at: Where) -> Result<&[u8], Corrupt> {
    if bytes.len() < 4 {
        return Err(Corrupt::Short(at));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err(Corrupt::Checksum(at));
    }
    Ok(body)
}

/// Reads fields off a block, failing (never panicking) when it runs out.
struct Reader<'a> {
    b: &'a [u8],
    at: Where,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8], at: Where) -> Reader<'a> {
        Reader { b, at }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Corrupt> {
        if self.b.len() < n {
            return Err(Corrupt::Short(self.at));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn skip(&mut self, n: usize) -> Result<(), Corrupt> {
        self.take(n).map(|_| ())
    }

    fn u32(&mut self) -> Result<u32, Corrupt> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, Corrupt> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn magic(&mut self, m: &[u8; 8]) -> Result<(), Corrupt> {
        if self.take(8)? != m {
            return Err(Corrupt::Magic(self.at));
        }
        Ok(())
    }

    fn version(&mut self) -> Result<(), Corrupt> {
        match self.u32()? {
            FORMAT_VERSION => Ok(()),
            v => Err(Corrupt::Version(v)),
        }
    }

    fn end(&self) -> Result<(), Corrupt> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(Corrupt::Field(self.at, "length (bytes left over)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> Header {
        Header {
            flags: FLAG_KEY_VALUE,
            collector_size: 0,
            fs_block: 4096,
            file_number: 0,
            nfiles: 2,
            ntasks: 3,
            data_start: 4096,
            block_len: 12288,
            tasks: vec![
                TaskSlot { rank: 0, chunk_off: 0, chunk_len: 4096 },
                TaskSlot { rank: 2, chunk_off: 4096, chunk_len: 8192 },
            ],
        }
    }

    #[test]
    fn blocks_round_trip() {
        let h = header();
        let enc = h.encode();
        assert_eq!(enc.len() as u64, Header::encoded_len(2));
        assert_eq!(Header::tasks_in(&enc[..Header::FIXED_LEN]).unwrap(), 2);
        assert_eq!(Header::decode(&enc).unwrap(), h);
        let t = Tail { nblocks: 2, used: vec![vec![4096, 10], vec![7]], map: vec![(0, 0), (1, 0), (0, 1)] };
        assert_eq!(Tail::decode(&t.encode(), &h).unwrap(), t);
        let tr = Trailer { tail_at: 40960, tail_len: 99 };
        let enc = tr.encode();
        assert_eq!(enc.len() as u64, TRAILER_LEN);
        assert_eq!(Trailer::decode(&enc).unwrap(), tr);
    }

    #[test]
    fn a_flipped_bit_is_a_checksum_error_naming_the_block() {
        let mut enc = header().encode();
        enc[20] ^= 4;
        assert_eq!(Header::decode(&enc), Err(Corrupt::Checksum(Where::Header)));
        let mut tr = Trailer { tail_at: 1, tail_len: 2 }.encode();
        tr[9] ^= 1;
        assert_eq!(Trailer::decode(&tr), Err(Corrupt::Checksum(Where::Trailer)));
    }

    proptest! {
        /// Decoders never panic on any bytes, and never accept a block whose checksum fails.
        #[test]
        fn decoders_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Header::decode(&bytes);
            let _ = Header::tasks_in(&bytes);
            let _ = Tail::decode(&bytes, &header());
            let _ = Trailer::decode(&bytes);
        }

        /// Any single flipped bit of an encoded header or tail is caught.
        #[test]
        fn every_single_bit_flip_is_caught(bit in 0usize..(8 * 100)) {
            let h = header();
            let mut enc = h.encode();
            let bit = bit % (enc.len() * 8);
            enc[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Header::decode(&enc).is_err());
            let t = Tail { nblocks: 1, used: vec![vec![1], vec![2]], map: vec![] };
            let mut enc = t.encode();
            let bit = bit % (enc.len() * 8);
            enc[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Tail::decode(&enc, &h).is_err());
        }
    }
}
