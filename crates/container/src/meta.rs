//! Reading the metadata of a physical file (header, tail, trailer), with every
//! inconsistency reported against the file and block it is in.

use crate::error::{Corrupt, Error, Result, Where};
use crate::format::{Header, Tail, Trailer, TRAILER_LEN};
use crate::store::PhysFile;

/// Name of physical file `f` of the container `path`: the container's own name for file 0,
/// then `path.000001`, `path.000002`, … (as SIONlib names them).
pub fn physical_name(path: &str, f: u32) -> String {
    if f == 0 {
        path.to_string()
    } else {
        format!("{path}.{f:06}")
    }
}

/// What a closed physical file says of itself.
#[derive(Clone, Debug)]
pub struct FileMeta {
    pub path: String,
    pub header: Header,
    pub tail: Tail,
    /// The file's length.
    pub len: u64,
}

/// Read and check the header of `file` (all of it).
pub async fn read_header(file: &PhysFile) -> Result<Header> {
    let path = file.path();
    let first = file.read_at(0, Header::FIXED_LEN).await?;
    if first.len() < Header::FIXED_LEN {
        return Err(Error::corrupt(
            path,
            if first.is_empty() { Corrupt::Short(Where::Header) } else { short_or_magic(&first) },
        ));
    }
    let n = Header::tasks_in(&first).map_err(|c| Error::corrupt(path, c))?;
    let len = Header::encoded_len(n as usize);
    let bytes = file.read_at(0, len as usize).await?;
    if (bytes.len() as u64) < len {
        return Err(Error::corrupt(path, Corrupt::Short(Where::Header)));
    }
    Header::decode(&bytes).map_err(|c| Error::corrupt(path, c))
}

/// A header too short to read: cut short, unless it is not even a container.
fn short_or_magic(first: &[u8]) -> Corrupt {
    let m = &crate::format::HEADER_MAGIC[..first.len().min(8)];
    if &first[..m.len()] == m {
        Corrupt::Short(Where::Header)
    } else {
        Corrupt::Magic(Where::Header)
    }
}

/// Read and check the whole metadata of a closed physical file.
pub async fn read_meta(file: &PhysFile) -> Result<FileMeta> {
    let path = file.path().to_string();
    let bad = |c| Error::corrupt(&path, c);
    let header = read_header(file).await?;
    let len = file.len().await?;
    if len < header.data_start + TRAILER_LEN {
        return Err(bad(Corrupt::NotClosed));
    }
    let trailer = Trailer::decode(&file.read_at(len - TRAILER_LEN, TRAILER_LEN as usize).await?).map_err(bad)?;
    let end = trailer.tail_at.checked_add(trailer.tail_len).and_then(|e| e.checked_add(TRAILER_LEN));
    if end != Some(len) || trailer.tail_at < header.data_start || trailer.tail_len > (1 << 40) {
        return Err(bad(Corrupt::Field(Where::Trailer, "tail position")));
    }
    let bytes = file.read_at(trailer.tail_at, trailer.tail_len as usize).await?;
    if (bytes.len() as u64) < trailer.tail_len {
        return Err(bad(Corrupt::Short(Where::Tail)));
    }
    let tail = Tail::decode(&bytes, &header).map_err(bad)?;
    let blocks_end = tail.nblocks.checked_mul(header.block_len).and_then(|b| b.checked_add(header.data_start));
    if blocks_end != Some(trailer.tail_at) {
        return Err(bad(Corrupt::Field(Where::Tail, "block count (the tail is not where the blocks end)")));
    }
    Ok(FileMeta { path, header, tail, len })
}
