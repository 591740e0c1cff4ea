//! Per-block checksums of data objects: a CRC32C of every 64 KiB block of an object, kept in
//! a sidecar file beside it (`<ino>.<index>.crc`), so that a flipped bit on disk reads as
//! `EIO` naming the object and the block, never as silent wrong bytes.
//!
//! **Why a sidecar file** (rather than a trailer in the object or RocksDB): objects are
//! written with `pwrite` at their object offset and stay sparse, so a trailer would have to
//! move whenever the object grows; RocksDB would put a metadata commit (and its WAL write)
//! on every data write and tie the data path to the metadata store's health (a full or
//! failed RocksDB would stop data writes). A sidecar is written with one `pwrite` of the
//! entries a write touches, next to the data, with the same durability (page cache, synced
//! by `Fsync`), and is deleted with the object.
//!
//! **The sidecar** (all numbers little-endian): a 16-byte header — `SHOALCRC`, format
//! version (u32, 1), block size (u32, 65536) — then one 16-byte entry per block, entry `k`
//! at byte `16 + 16 k`. An entry is `crc: u32, prev: u32, state: u8 (1 settled, 2 pending),
//! 3 zero bytes, check: u32` where `check` is the CRC32C of the entry's first 12 bytes (so a
//! damaged entry is told from a damaged block). Sixteen zero bytes (also what a sparse
//! sidecar reads as beyond what was written) mean *hole*: a block never written, which
//! holds zeros. A block's checksum covers all 64 KiB, the bytes past the end of the object
//! counting as zeros, so growing an object never changes the checksum of a block before it.
//!
//! **The crash invariant.** Every block's bytes match its entry: `settled` → `crc`;
//! `pending` → `crc` (the new contents) **or** `prev` (the contents before); hole → the
//! checksum of 64 KiB of zeros. A write keeps it across `kill -9` at any instant by writing,
//! under the object's lock, (1) the touched entries as `pending { crc: new, prev: old }`,
//! (2) the data, (3) later (lazily, see `sums_cache.rs`), the entries as
//! `settled { crc: new }`. Killed before (2) completes, a block holds the old bytes (accepted
//! through `prev`) or the new ones (accepted through `crc`); killed after, the new ones.
//! `pwrite` of an entry never tears: 16-byte entries at 16-byte offsets never straddle a
//! page, and the kernel copies a page at a time. One case remains: a data `pwrite`
//! interrupted by the kill *inside* a block leaves that block part old and part new (page by
//! page), matching neither; the write was never acknowledged, so any mix is a legal outcome
//! (as on a local file system). A running server settles an object's pending entries at
//! `Fsync`, eviction from its cache, truncation and scrub, so a pending entry met when an
//! object is first opened is a leftover of a server that stopped with entries unsettled (a
//! kill, or a stop between those points): it is settled then ([`Sidecar::settle`]) to the
//! checksum the block's bytes have, with a warning if they matched neither. Power loss
//! without `fsync` may lose either file's pages independently, as it may lose the data
//! itself; `Fsync` syncs both (the data first).

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Bytes covered by one checksum.
pub const BLOCK: u64 = 64 << 10;
/// Bytes of the sidecar's header, and of each entry.
pub const HEADER_LEN: u64 = 16;
pub const ENTRY_LEN: u64 = 16;
const MAGIC: &[u8; 8] = b"SHOALCRC";
/// Version of the sidecar format.
pub const FORMAT: u32 = 1;
const SETTLED: u8 = 1;
const PENDING: u8 = 2;

/// CRC-32C polynomial, bit-reversed (as the register shifts right).
const POLY: u32 = 0x82f6_3b78;

/// `a * b mod P` in GF(2)[x], bit-reversed representation (`1 << 31` is x^0), as zlib's
/// `multmodp`.
fn multmodp(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
}

/// Tables for `n` in `0..=BLOCK`, computed once (512 KiB, a few milliseconds):
/// `zeros[n]` = CRC32C of `n` zero bytes, `shift[n]` = x^(8n) mod P.
struct Tables {
    zeros: Vec<u32>,
    shift: Vec<u32>,
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let n = BLOCK as usize + 1;
        let (mut zeros, mut shift) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut z, mut x) = (0u32, 1u32 << 31);
        for _ in 0..n {
            zeros.push(z);
            shift.push(x);
            z = crc32c::crc32c_append(z, &[0]);
            x = multmodp(x, 1 << 23); // times x^8
        }
        Tables { zeros, shift }
    })
}

/// CRC32C of `n` zero bytes (`n` at most [`BLOCK`]).
fn zeros_crc(n: u64) -> u32 {
    tables().zeros[n as usize]
}

/// CRC32C of `A` followed by `n` zero bytes, from `crc` = CRC32C of `A`, in constant time:
/// zlib's `crc32_combine(crc, crc(zeros(n)), n)` with the power of x from a table (the
/// `crc32c` crate's combine squares matrices, tens of microseconds per call).
fn extend_with_zeros(crc: u32, n: u64) -> u32 {
    let t = tables();
    multmodp(t.shift[n as usize], crc) ^ t.zeros[n as usize]
}

/// CRC32C of `A` followed by `B`, from `a` = CRC32C of `A` and `b` = CRC32C of `B` whose
/// length is `len_b` (at most [`BLOCK`]), in constant time (zlib's `crc32_combine`, with the
/// power of x from the table).
pub fn crc32c_combine(a: u32, b: u32, len_b: u64) -> u32 {
    multmodp(tables().shift[len_b as usize], a) ^ b
}

/// Checksum of a block whose first bytes are `bytes` (at most [`BLOCK`]) and the rest zeros.
pub fn block_crc(bytes: &[u8]) -> u32 {
    debug_assert!(bytes.len() as u64 <= BLOCK);
    padded_crc(crc32c::crc32c(bytes), bytes.len() as u64)
}

/// Checksum of a block whose first `len` bytes have the CRC32C `crc` and the rest are zeros,
/// in constant time.
pub fn padded_crc(crc: u32, len: u64) -> u32 {
    debug_assert!(len <= BLOCK);
    extend_with_zeros(crc, BLOCK - len)
}

/// Checksum of a block of zeros (what a hole holds).
pub fn zero_block_crc() -> u32 {
    zeros_crc(BLOCK)
}

/// The checksum of a block after `piece` is written at `pos` in it, from the checksum
/// `old` of the block before, where the block held zeros at `[pos, pos + piece.len())`
/// (a hole, or past the end of the object). CRC32C is affine over GF(2): for blocks of equal
/// length, `crc(a ^ b) = crc(a) ^ crc(b) ^ crc(zeros)`, and the new block is the old one XOR
/// the piece placed at `pos` in zeros. Constant time, from the piece's own CRC32C
/// (`piece_crc`, of its `len` bytes), which the caller computes without holding any lock.
pub fn with_piece(old: u32, pos: u64, piece_crc: u32, len: u64) -> u32 {
    debug_assert!(pos + len <= BLOCK);
    // CRC32C of `pos` zeros followed by the piece.
    let head = crc32c_combine(zeros_crc(pos), piece_crc, len);
    let placed = extend_with_zeros(head, BLOCK - pos - len);
    old ^ placed ^ zero_block_crc()
}

/// What the sidecar says about one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Never written: zeros.
    Hole,
    Settled(u32),
    /// A write was under way: the block holds its new bytes (`new`) or the old (`old`).
    Pending {
        new: u32,
        old: u32,
    },
}

impl Entry {
    pub fn encode(self) -> [u8; ENTRY_LEN as usize] {
        let (crc, prev, state) = match self {
            Entry::Hole => return [0; ENTRY_LEN as usize],
            Entry::Settled(c) => (c, 0, SETTLED),
            Entry::Pending { new, old } => (new, old, PENDING),
        };
        let mut b = [0u8; ENTRY_LEN as usize];
        b[0..4].copy_from_slice(&crc.to_le_bytes());
        b[4..8].copy_from_slice(&prev.to_le_bytes());
        b[8] = state;
        let check = crc32c::crc32c(&b[..12]);
        b[12..16].copy_from_slice(&check.to_le_bytes());
        b
    }

    /// An entry as stored; `Err` says how it is damaged.
    pub fn decode(b: &[u8]) -> Result<Entry, String> {
        if b.iter().all(|&x| x == 0) {
            return Ok(Entry::Hole);
        }
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if crc32c::crc32c(&b[..12]) != word(12) {
            return Err("its checksum entry is damaged".into());
        }
        match b[8] {
            SETTLED => Ok(Entry::Settled(word(0))),
            PENDING => Ok(Entry::Pending { new: word(0), old: word(4) }),
            s => Err(format!("its checksum entry has unknown state {s}")),
        }
    }

    /// Do bytes with checksum `crc` satisfy this entry?
    pub fn accepts(self, crc: u32) -> bool {
        match self {
            Entry::Hole => crc == zero_block_crc(),
            Entry::Settled(c) => crc == c,
            Entry::Pending { new, old } => crc == new || crc == old,
        }
    }

    /// The checksum the block has, when the entry alone says (not for pending entries).
    pub fn known(self) -> Option<u32> {
        match self {
            Entry::Hole => Some(zero_block_crc()),
            Entry::Settled(c) => Some(c),
            Entry::Pending { .. } => None,
        }
    }

    /// A short description for error messages.
    pub fn describe(self) -> String {
        match self {
            Entry::Hole => format!("none written, expected zeros ({:08x})", zero_block_crc()),
            Entry::Settled(c) => format!("{c:08x}"),
            Entry::Pending { new, old } => format!("{new:08x} or {old:08x}"),
        }
    }
}

/// The sidecar file of one object.
pub struct Sidecar {
    file: File,
    path: PathBuf,
}

fn header() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    h[12..16].copy_from_slice(&(BLOCK as u32).to_le_bytes());
    h
}

fn entry_offset(block: u64) -> u64 {
    HEADER_LEN + block * ENTRY_LEN
}

/// Read as much of `buf` as the file holds at `offset`; returns the count (short at the end).
pub fn read_full_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl Sidecar {
    /// Start an empty sidecar (every block a hole) at `path`, replacing any left there.
    pub fn create(path: &Path) -> std::io::Result<Sidecar> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(0o600).open(path)?;
        file.write_all_at(&header(), 0)?;
        Ok(Sidecar { file, path: path.to_path_buf() })
    }

    /// Open the sidecar at `path`; `None` if there is none (an object written before
    /// checksums existed, see [`Sidecar::build`]) or it has no complete header (killed while
    /// creating it, before the object's first byte was written).
    pub fn open(path: &Path) -> std::io::Result<Option<Sidecar>> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut h = [0u8; HEADER_LEN as usize];
        if read_full_at(&file, &mut h, 0)? < h.len() {
            return Ok(None);
        }
        if h != header() {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("{}: not a checksum file of format {FORMAT} with {BLOCK}-byte blocks", path.display()),
            ));
        }
        Ok(Some(Sidecar { file, path: path.to_path_buf() }))
    }

    /// Compute the checksums of every block `data` holds now and install them atomically at
    /// `path` (written beside it, synced, renamed): the upgrade of an object written before
    /// checksums existed. Its bytes are taken as they are: nothing recorded says otherwise.
    pub fn build(path: &Path, data: &File) -> std::io::Result<Sidecar> {
        let tmp = path.with_extension(format!("crc.tmp{:x}", rand::random::<u32>()));
        let result = (|| {
            let s = Sidecar::create(&tmp)?;
            let size = data.metadata()?.len();
            let mut buf = vec![0u8; BLOCK as usize];
            let mut entries = Vec::new();
            let mut first = 0;
            for k in 0..size.div_ceil(BLOCK) {
                let n = read_full_at(data, &mut buf, k * BLOCK)?;
                entries.push(Entry::Settled(block_crc(&buf[..n])));
                if entries.len() == 1024 {
                    s.write(first, &entries)?;
                    first = k + 1;
                    entries.clear();
                }
            }
            s.write(first, &entries)?;
            s.file.sync_all()?;
            std::fs::rename(&tmp, path)?;
            Ok(Sidecar { file: s.file, path: path.to_path_buf() })
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Entries of blocks `first .. first + n` (holes beyond the end of the file), each
    /// `Err` with a reason if damaged.
    pub fn read(&self, first: u64, n: u64) -> std::io::Result<Vec<Result<Entry, String>>> {
        let mut buf = vec![0u8; (n * ENTRY_LEN) as usize];
        read_full_at(&self.file, &mut buf, entry_offset(first))?;
        Ok(buf.chunks_exact(ENTRY_LEN as usize).map(Entry::decode).collect())
    }

    /// Write the entries of blocks `first ..` in one `pwrite`.
    pub fn write(&self, first: u64, entries: &[Entry]) -> std::io::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(entries.len() * ENTRY_LEN as usize);
        for e in entries {
            buf.extend_from_slice(&e.encode());
        }
        self.file.write_all_at(&buf, entry_offset(first))
    }

    /// Number of entries the file holds (blocks beyond are holes).
    pub fn blocks(&self) -> std::io::Result<u64> {
        Ok(self.file.metadata()?.len().saturating_sub(HEADER_LEN) / ENTRY_LEN)
    }

    /// Keep the entries of the first `n` blocks only.
    pub fn cut(&self, n: u64) -> std::io::Result<()> {
        if self.blocks()? > n {
            self.file.set_len(entry_offset(n))?;
        }
        Ok(())
    }

    pub fn sync(&self, data_only: bool) -> std::io::Result<()> {
        if data_only {
            self.file.sync_data()
        } else {
            self.file.sync_all()
        }
    }

    /// Settle the entries a killed server left pending (see the crash invariant above): each
    /// becomes `settled` with the checksum `data`'s block has now. Returns the blocks whose
    /// bytes matched neither checksum (a data write torn by the kill), which are logged.
    pub fn settle(&self, data: &File, object: &Path) -> std::io::Result<Vec<u64>> {
        let n = self.blocks()?;
        let mut torn = Vec::new();
        let mut buf = vec![0u8; BLOCK as usize];
        const CHUNK: u64 = 4096;
        let mut first = 0;
        while first < n {
            let count = CHUNK.min(n - first);
            for (i, e) in self.read(first, count)?.into_iter().enumerate() {
                let Ok(Entry::Pending { new, old }) = e else { continue };
                let k = first + i as u64;
                let got = read_full_at(data, &mut buf, k * BLOCK)?;
                let crc = block_crc(&buf[..got]);
                if crc != new && crc != old {
                    tracing::warn!(
                        "{}: block at offset {} was being written when the server stopped and holds \
                         part of that (unacknowledged) write; keeping it as it is",
                        object.display(),
                        k * BLOCK
                    );
                    torn.push(k);
                }
                self.write(k, &[Entry::Settled(crc)])?;
            }
            first += count;
        }
        Ok(torn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_checksums_pad_with_zeros() {
        let mut full = vec![0u8; BLOCK as usize];
        full[..5].copy_from_slice(b"hello");
        assert_eq!(block_crc(b"hello"), crc32c::crc32c(&full));
        assert_eq!(block_crc(&[]), crc32c::crc32c(&vec![0u8; BLOCK as usize]));
        assert_eq!(zero_block_crc(), block_crc(&[]));
        // The values docs/formats.md gives.
        assert_eq!(zero_block_crc(), 0x72c0_c4a4);
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        for n in [0u64, 1, 7, 4096, 65_535, BLOCK] {
            let mut v = b"abc".to_vec();
            v.resize(3 + n as usize, 0);
            assert_eq!(extend_with_zeros(crc32c::crc32c(b"abc"), n), crc32c::crc32c(&v), "{n}");
        }
    }

    #[test]
    fn a_piece_written_into_zeros_updates_the_checksum_without_the_block() {
        let mut block = vec![0u8; BLOCK as usize];
        block[..1000].fill(7);
        let old = block_crc(&block);
        let piece: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
        block[5000..8000].copy_from_slice(&piece);
        assert_eq!(with_piece(old, 5000, crc32c::crc32c(&piece), 3000), block_crc(&block));
        // At the very end of the block, and from an empty (hole) block.
        let mut b2 = vec![0u8; BLOCK as usize];
        b2[BLOCK as usize - 3..].copy_from_slice(b"end");
        assert_eq!(with_piece(zero_block_crc(), BLOCK - 3, crc32c::crc32c(b"end"), 3), block_crc(&b2));
        assert_eq!(with_piece(zero_block_crc(), 0, crc32c::crc32c(&piece), 3000), block_crc(&piece));
        assert_eq!(padded_crc(crc32c::crc32c(&piece), 3000), block_crc(&piece));
    }

    #[test]
    fn entries_round_trip_and_damage_is_told() {
        for e in [Entry::Hole, Entry::Settled(0), Entry::Settled(0xdead_beef), Entry::Pending { new: 1, old: 2 }] {
            assert_eq!(Entry::decode(&e.encode()), Ok(e));
        }
        let mut b = Entry::Settled(42).encode();
        b[1] ^= 0x10;
        assert!(Entry::decode(&b).is_err());
        assert!(Entry::Pending { new: 1, old: 2 }.accepts(2));
        assert!(!Entry::Settled(1).accepts(2));
        assert!(Entry::Hole.accepts(zero_block_crc()));
    }

    #[test]
    fn sidecars_are_sparse_cut_and_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.crc");
        assert!(Sidecar::open(&p).unwrap().is_none());
        let s = Sidecar::create(&p).unwrap();
        s.write(10, &[Entry::Settled(5), Entry::Settled(6)]).unwrap();
        let got = s.read(9, 4).unwrap();
        assert_eq!(got, vec![Ok(Entry::Hole), Ok(Entry::Settled(5)), Ok(Entry::Settled(6)), Ok(Entry::Hole)]);
        assert_eq!(s.blocks().unwrap(), 12);
        s.cut(11).unwrap();
        assert_eq!(s.read(10, 2).unwrap(), vec![Ok(Entry::Settled(5)), Ok(Entry::Hole)]);
        // A file with no complete header is no sidecar; a wrong header is an error.
        std::fs::write(&p, b"SHOAL").unwrap();
        assert!(Sidecar::open(&p).unwrap().is_none());
        std::fs::write(&p, [1u8; 16]).unwrap();
        assert!(Sidecar::open(&p).is_err());
        // Built from an object's bytes: one settled entry per block, the last one padded.
        let data_path = dir.path().join("obj");
        let bytes: Vec<u8> = (0..150_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&data_path, &bytes).unwrap();
        let s = Sidecar::build(&p, &File::open(&data_path).unwrap()).unwrap();
        assert_eq!(s.blocks().unwrap(), 3);
        let e = s.read(0, 3).unwrap();
        assert_eq!(e[2], Ok(Entry::Settled(block_crc(&bytes[2 * BLOCK as usize..]))));
        assert!(Sidecar::open(&p).unwrap().is_some());
    }

    #[test]
    fn pending_entries_settle_to_what_the_block_holds() {
        let dir = tempfile::tempdir().unwrap();
        let data_path = dir.path().join("obj");
        let mut bytes = vec![1u8; 2 * BLOCK as usize];
        std::fs::write(&data_path, &bytes).unwrap();
        let s = Sidecar::create(&dir.path().join("obj.crc")).unwrap();
        let old = block_crc(&bytes[..BLOCK as usize]);
        // Block 0: the new bytes never landed (old matches). Block 1: torn.
        s.write(0, &[Entry::Pending { new: 77, old }, Entry::Pending { new: 78, old: 79 }]).unwrap();
        let data = File::open(&data_path).unwrap();
        assert_eq!(s.settle(&data, &data_path).unwrap(), vec![1]);
        bytes.truncate(BLOCK as usize);
        assert_eq!(
            s.read(0, 2).unwrap(),
            vec![Ok(Entry::Settled(old)), Ok(Entry::Settled(block_crc(&vec![1u8; BLOCK as usize])))]
        );
    }
}
