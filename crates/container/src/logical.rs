//! One task's logical file: a byte stream laid over its chunks, one per block.
//!
//! Writes fill the current chunk and go on in the task's chunk of the next block, which
//! every task computes on its own (block `b` starts at `data_start + b * block_len`): a
//! container grows without any communication. Reads follow the same chunks, each up to the
//! bytes written in it.

use crate::error::{Error, Result};
use crate::format::TaskSlot;
use crate::store::PhysFile;
use std::sync::Arc;

/// Where a task's chunks are, and how full each is.
#[derive(Clone, Debug)]
pub struct Chunks {
    pub slot: TaskSlot,
    pub data_start: u64,
    pub block_len: u64,
    /// Bytes used in each chunk reached so far, one per block.
    pub used: Vec<u64>,
}

impl Chunks {
    /// Where chunk `block` of this task starts in its physical file.
    pub fn chunk_at(&self, block: u64) -> u64 {
        self.data_start + block * self.block_len + self.slot.chunk_off
    }

    /// Bytes of the logical file (every chunk's used bytes).
    pub fn len(&self) -> u64 {
        self.used.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A logical file open for reading or writing, with a position (chunk, offset in it).
pub struct Logical {
    pub(crate) file: Arc<PhysFile>,
    pub(crate) chunks: Chunks,
    block: u64,
    pos: u64,
    write: bool,
    /// Records instead of a plain stream (`kv.rs`).
    pub(crate) key_value: bool,
    pub(crate) kv: crate::kv::KvIndex,
}

impl Logical {
    pub(crate) fn new(file: Arc<PhysFile>, chunks: Chunks, write: bool, key_value: bool) -> Logical {
        let mut l = Logical { file, chunks, block: 0, pos: 0, write, key_value, kv: Default::default() };
        if write && l.chunks.used.is_empty() {
            l.chunks.used.push(0);
        }
        l
    }

    pub fn is_writing(&self) -> bool {
        self.write
    }

    /// Where this task's chunks are and how full.
    pub fn chunks(&self) -> &Chunks {
        &self.chunks
    }

    /// The current position: chunk (block number) and offset in it.
    pub fn position(&self) -> (u64, u64) {
        (self.block, self.pos)
    }

    fn chunk_len(&self) -> u64 {
        self.chunks.slot.chunk_len
    }

    /// Write all of `data` from the current position, going on into the next chunks as
    /// each fills.
    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        let mut at = 0;
        for (offset, n) in self.plan_write(data.len() as u64)? {
            self.file.write_at(offset, &data[at..at + n as usize]).await?;
            at += n as usize;
        }
        Ok(())
    }

    /// Where the next `len` bytes written go, as (offset in the physical file, length)
    /// pieces, one per chunk; the position moves past them as if they were written (the
    /// caller writes them, or has a collector write them: `coalesce.rs`).
    pub(crate) fn plan_write(&mut self, mut len: u64) -> Result<Vec<(u64, u64)>> {
        if !self.write {
            return Err(Error::Usage("the container is open for reading".into()));
        }
        let mut pieces = Vec::new();
        while len > 0 {
            let room = self.chunk_len() - self.pos;
            if room == 0 {
                self.next_chunk();
                continue;
            }
            let n = room.min(len);
            pieces.push((self.chunks.chunk_at(self.block) + self.pos, n));
            self.pos += n;
            let used = &mut self.chunks.used[self.block as usize];
            *used = (*used).max(self.pos);
            len -= n;
        }
        Ok(pieces)
    }

    /// Make sure the next `n` bytes fit in the current chunk, moving to the next chunk if
    /// they do not (the rest of this one stays unused). `n` larger than a chunk is an error.
    pub fn ensure_free_space(&mut self, n: u64) -> Result<()> {
        if !self.write {
            return Err(Error::Usage("the container is open for reading".into()));
        }
        if n > self.chunk_len() {
            return Err(Error::Usage(format!("{n} bytes cannot fit in a chunk of {}", self.chunk_len())));
        }
        if self.chunk_len() - self.pos < n {
            self.next_chunk();
        }
        Ok(())
    }

    fn next_chunk(&mut self) {
        self.block += 1;
        self.pos = 0;
        if self.chunks.used.len() as u64 <= self.block {
            self.chunks.used.resize(self.block as usize + 1, 0);
        }
    }

    /// Read up to `buf.len()` bytes from the current position, across chunks; 0 at the end.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let mut got = 0;
        for (offset, n) in self.plan_read(buf.len() as u64) {
            if self.file.read_into(offset, &mut buf[got..got + n as usize]).await? < n as usize {
                return Err(self.cut_short());
            }
            got += n as usize;
        }
        Ok(got)
    }

    /// Where the next (up to) `len` bytes read come from, as pieces of the physical file;
    /// the position moves past them.
    pub(crate) fn plan_read(&mut self, mut len: u64) -> Vec<(u64, u64)> {
        let mut pieces = Vec::new();
        while len > 0 {
            let avail = self.bytes_avail_in_chunk();
            if avail == 0 {
                if self.block + 1 >= self.chunks.used.len() as u64 {
                    break;
                }
                self.block += 1;
                self.pos = 0;
                continue;
            }
            let n = avail.min(len);
            pieces.push((self.chunks.chunk_at(self.block) + self.pos, n));
            self.pos += n;
            len -= n;
        }
        pieces
    }

    /// The error for data missing from the physical file.
    pub(crate) fn cut_short(&self) -> Error {
        Error::Io {
            path: self.file.path().to_string(),
            errno: libc::EIO,
            message: format!(
                "rank {}: chunk {} ends early: the physical file is cut short",
                self.chunks.slot.rank, self.block
            ),
        }
    }

    /// The rest of the logical file from the current position.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>> {
        let left = self.chunks.len() - self.logical_offset();
        let mut buf = vec![0; left as usize];
        let n = self.read(&mut buf).await?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Bytes left to read in the current chunk (to write: room left in it).
    pub fn bytes_avail_in_chunk(&self) -> u64 {
        if self.write {
            return self.chunk_len() - self.pos;
        }
        self.chunks.used.get(self.block as usize).map_or(0, |u| u.saturating_sub(self.pos))
    }

    /// At the end of the logical file (reading): nothing left in this chunk or after it.
    pub fn feof(&self) -> bool {
        let used = &self.chunks.used;
        let rest: u64 = used.iter().skip(self.block as usize + 1).sum();
        self.bytes_avail_in_chunk() == 0 && rest == 0
    }

    /// Go to offset `pos` of chunk `block`. Reading: within what was written; writing:
    /// within the chunk (a later block is reached by writing or by seeking to it).
    pub fn seek(&mut self, block: u64, pos: u64) -> Result<()> {
        let limit = if self.write {
            self.chunk_len()
        } else {
            *self.chunks.used.get(block as usize).ok_or_else(|| {
                Error::Usage(format!("chunk {block} does not exist (the task wrote {})", self.chunks.used.len()))
            })?
        };
        if pos > limit {
            return Err(Error::Usage(format!("offset {pos} is past the end of chunk {block} ({limit} bytes)")));
        }
        self.block = block;
        self.pos = pos;
        if self.write && self.chunks.used.len() as u64 <= block {
            self.chunks.used.resize(block as usize + 1, 0);
        }
        Ok(())
    }

    /// The position as an offset in the logical file.
    pub fn logical_offset(&self) -> u64 {
        self.chunks.used.iter().take(self.block as usize).sum::<u64>() + self.pos
    }

    /// Go to `offset` of the logical file (reading).
    pub fn seek_logical(&mut self, offset: u64) -> Result<()> {
        let used = &self.chunks.used;
        let mut start = 0;
        for (b, &u) in used.iter().enumerate() {
            let last = b + 1 == used.len();
            if offset < start + u || (last && offset == start + u) {
                self.block = b as u64;
                self.pos = offset - start;
                return Ok(());
            }
            start += u;
        }
        if offset == 0 {
            self.block = 0;
            self.pos = 0;
            return Ok(());
        }
        Err(Error::Usage(format!("offset {offset} is past the end of the logical file ({start} bytes)")))
    }
}
