//! Data objects: one local file per (file, object index) held by this server, at
//! `<data_dir>/objects/<ino & 0xff, 2 hex digits>/<ino, 16 hex digits>.<index>`, with the
//! CRC32C of each of its 64 KiB blocks in `<…>.<index>.crc` beside it (`checksums.rs`
//! describes that file and the crash invariant it keeps).
//!
//! Objects are written with `pwrite` at their object offset, so holes stay sparse and
//! objects beyond 4 GiB need nothing special; a missing object or a read beyond its end
//! reads as nothing (the client zero-fills up to the file size). Every read verifies the
//! checksums of the blocks it touches and fails with `EIO` naming the object file and the
//! block's offset when one does not match, so damaged bytes are never served. Open
//! descriptors are cached (up to [`FD_CACHE`] objects) because reopening per request would
//! dominate small reads and writes. Objects written since their last sync are remembered so
//! that `Fsync` knows what to `fdatasync` without scanning directories. All functions block.
//!
//! Reads, writes, truncations and deletions of one object are serialised by a lock striped
//! over objects ([`LOCK_STRIPES`]): a reader must never see a block between its data write
//! and its checksum write. Objects written before checksums existed have no `.crc` file; it
//! is computed from their bytes the first time the object is opened (see [`DataStore::open_object`]).

use crate::error::{Fail, R};
use crate::store::checksums::{self, block_crc, read_full_at, Entry, Sidecar, BLOCK};
use crate::store::sums_cache::Sums;
use crate::store::write_crcs::PieceCrcs;
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use shoal_proto::Errno;
use shoal_proto::Ino;
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most objects kept open (each holds two descriptors: the data and its checksums).
pub const FD_CACHE: usize = 512;
/// Locks serialising the operations on one object (striped: objects share them).
pub const LOCK_STRIPES: usize = 1024;
/// Files remembered as written-but-not-synced before the store syncs the whole file system
/// instead (bounds the memory a client that never calls fsync can make us hold).
const DIRTY_MAX: usize = 100_000;
/// Streaming writes start the disk writing every this many bytes of an object (see
/// [`start_writeback`]).
const WRITEBACK_CHUNK: u64 = 8 << 20;

/// An open object: its data file, its checksums, and what is kept in memory about them
/// (`sums_cache.rs`: cached entries, the length, entries settled lazily).
pub struct Object {
    pub data: File,
    pub sums: Sidecar,
    pub path: PathBuf,
    mem: Mutex<Sums>,
    /// The same file opened for writes around the page cache (`direct.rs`), once a store
    /// that writes so wrote to it; `None` inside if its file system refuses.
    direct: std::sync::OnceLock<Option<File>>,
}

struct FdCache {
    map: HashMap<(u64, u32), (Arc<Object>, u64)>,
    tick: u64,
}

pub struct DataStore {
    root: PathBuf,
    fds: Mutex<FdCache>,
    dirty: Mutex<HashMap<u64, Vec<u32>>>,
    locks: Box<[RwLock<()>]>,
    /// Lookups of open objects in the descriptor cache (`GET /metrics`).
    pub fd_cache: crate::metrics::HitMiss,
    /// Lookups of checksum entries in the objects' caches (`sums_cache.rs`).
    pub sums_cache: crate::metrics::HitMiss,
    /// The primary's replication log (`replica::log`): every write, cut and deletion is
    /// appended to it under the object's lock, so mirrors apply them in the same order.
    repl: std::sync::OnceLock<Arc<crate::replica::log::ReplLog>>,
    /// Write around the page cache where aligned (`direct.rs`): set for a mirror's copy,
    /// whose bytes are cold, and cleared when the copy is promoted to serve its slot.
    direct: std::sync::atomic::AtomicBool,
}

/// A block whose bytes do not match its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadBlock {
    pub path: PathBuf,
    pub offset: u64,
    pub reason: String,
}

impl BadBlock {
    fn fail(&self) -> Fail {
        Fail::new(Errno::EIO, format!("{}: block at offset {} {}", self.path.display(), self.offset, self.reason))
    }
}

impl DataStore {
    /// Open the object directory `root`, creating it and its 256 buckets.
    pub fn open(root: &Path) -> std::io::Result<DataStore> {
        for b in 0..256 {
            std::fs::create_dir_all(root.join(format!("{b:02x}")))?;
        }
        Ok(DataStore {
            root: root.to_path_buf(),
            fds: Mutex::new(FdCache { map: HashMap::new(), tick: 0 }),
            dirty: Mutex::new(HashMap::new()),
            locks: (0..LOCK_STRIPES).map(|_| RwLock::new(())).collect(),
            fd_cache: Default::default(),
            sums_cache: Default::default(),
            repl: std::sync::OnceLock::new(),
            direct: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Write objects around the page cache where aligned (a mirror's copy), or through it.
    pub fn set_direct_writes(&self, on: bool) {
        self.direct.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Ship every change from now on to the mirrors through `log` (once, at start).
    pub fn set_replication(&self, log: Arc<crate::replica::log::ReplLog>) {
        let _ = self.repl.set(log);
    }

    /// Append a change made under the object's lock to the replication log, if any.
    fn replicate(&self, change: shoal_proto::msg::ReplChange, data: impl FnOnce() -> Bytes) {
        if let Some(log) = self.repl.get() {
            log.append(change, data());
        }
    }

    fn bucket(&self, ino: Ino) -> PathBuf {
        self.root.join(format!("{:02x}", ino.0 & 0xff))
    }

    pub fn path(&self, ino: Ino, index: u32) -> PathBuf {
        self.bucket(ino).join(format!("{:016x}.{index}", ino.0))
    }

    /// The checksum file of an object.
    pub fn sums_path(&self, ino: Ino, index: u32) -> PathBuf {
        self.bucket(ino).join(format!("{:016x}.{index}.crc", ino.0))
    }

    /// The mark of an object this store keeps no bytes of ([`DataStore::mark_unkept`]).
    pub fn unkept_path(&self, ino: Ino, index: u32) -> PathBuf {
        self.bucket(ino).join(format!("{:016x}.{index}{UNKEPT_SUFFIX}", ino.0))
    }

    /// Whether this store keeps no bytes of the object, only its mark (one `stat`).
    pub fn is_unkept(&self, ino: Ino, index: u32) -> bool {
        std::fs::symlink_metadata(self.unkept_path(ino, index)).is_ok()
    }

    /// Keep no bytes of object `index` of `ino`, only a mark saying so: a mirror past the
    /// count of copies the object's file wants (`ReplChange::Unkept`, `replica/thin.rs`).
    /// Served after a failover, the store answers `EIO` for the object rather than the
    /// zeros a missing object reads as. The mark is made before the bytes go: a crash in
    /// between leaves both, and the mark wins (every open checks it first). Blocks.
    pub fn mark_unkept(&self, ino: Ino, index: u32) -> R<()> {
        let _g = self.lock(ino, index).write();
        let mark = self.unkept_path(ino, index);
        if std::fs::symlink_metadata(&mark).is_err() {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&mark)
                .map_err(|e| Fail::io(format_args!("mark {}", mark.display()), &e))?;
        }
        self.fds.lock().map.remove(&(ino.0, index));
        if let Some(indices) = self.dirty.lock().get_mut(&ino.0) {
            indices.retain(|&i| i != index);
        }
        for p in [self.path(ino, index), self.sums_path(ino, index)] {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Fail::io(format_args!("drop {}", p.display()), &e)),
            }
        }
        Ok(())
    }

    /// The answer to any use of an object this store holds only the mark of.
    fn unkept_fail(&self, ino: Ino, index: u32) -> Fail {
        Fail::new(
            Errno::EIO,
            format!(
                "object {ino}.{index} has no copy on this server: its file keeps fewer copies than the cluster, \
                 and the server holding them is away (docs/replicas.md)"
            ),
        )
    }

    fn lock(&self, ino: Ino, index: u32) -> &RwLock<()> {
        let h = (ino.0 ^ (index as u64).rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.locks[(h >> 32) as usize % LOCK_STRIPES]
    }

    /// The open object, from the cache or freshly opened; `None` if it does not exist and
    /// `create` is false. The caller holds the object's lock (shared or exclusive), so no
    /// write or delete of it runs meanwhile.
    ///
    /// Opening settles the checksums a killed server left pending, and gives an object
    /// without checksums (written before they existed) its checksum file, computed from its
    /// bytes: the upgrade of old stores happens lazily, object by object, at the first
    /// access (or `shoal scrub`), not at start-up, so a large store starts at once.
    fn open_object(&self, ino: Ino, index: u32, create: bool) -> R<Option<Arc<Object>>> {
        {
            let mut c = self.fds.lock();
            c.tick += 1;
            let tick = c.tick;
            if let Some((f, t)) = c.map.get_mut(&(ino.0, index)) {
                *t = tick;
                self.fd_cache.hit();
                return Ok(Some(f.clone()));
            }
        }
        self.fd_cache.miss();
        if self.is_unkept(ino, index) {
            return Err(self.unkept_fail(ino, index));
        }
        let path = self.path(ino, index);
        let sums_path = self.sums_path(ino, index);
        let open = |create: bool| OpenOptions::new().read(true).write(true).create(create).mode(0o600).open(&path);
        let (data, fresh) = match open(false) {
            Ok(f) => (f, false),
            Err(e) if e.kind() == ErrorKind::NotFound && create => {
                // The checksums first: an object file never exists with bytes but without
                // them (a crash in between leaves a checksum file alone, replaced here next
                // time).
                Sidecar::create(&sums_path)
                    .map_err(|e| Fail::io(format_args!("create checksums {}", sums_path.display()), &e))?;
                let f = open(true).map_err(|e| Fail::io(format_args!("create object {}", path.display()), &e))?;
                (f, true)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Fail::io(format_args!("open object {}", path.display()), &e)),
        };
        let sums_err = |e: std::io::Error| Fail::io(format_args!("checksums {}", sums_path.display()), &e);
        let sums = match Sidecar::open(&sums_path).map_err(sums_err)? {
            Some(s) => {
                if !fresh {
                    s.settle(&data, &path).map_err(sums_err)?;
                }
                s
            }
            None => {
                let s = Sidecar::build(&sums_path, &data).map_err(sums_err)?;
                tracing::info!("{}: written before checksums existed; checksums computed", path.display());
                s
            }
        };
        let (size, stored) = if fresh {
            (0, 0)
        } else {
            let size = data.metadata().map_err(|e| Fail::io(format_args!("stat {}", path.display()), &e))?.len();
            (size, sums.blocks().map_err(sums_err)?)
        };
        let obj = Arc::new(Object {
            data,
            sums,
            path,
            mem: Mutex::new(Sums::new(size, stored)),
            direct: std::sync::OnceLock::new(),
        });
        let victims = {
            let mut c = self.fds.lock();
            let tick = c.tick;
            c.map.insert((ino.0, index), (obj.clone(), tick));
            if c.map.len() > FD_CACHE {
                // The least recently used eighth, evicted in one go below.
                let mut ticks: Vec<u64> = c.map.values().map(|(_, t)| *t).collect();
                let (_, cut, _) = ticks.select_nth_unstable(FD_CACHE / 8);
                let cut = *cut;
                c.map.iter().filter(|(_, (_, t))| *t <= cut).map(|(k, (o, _))| (*k, o.clone())).collect()
            } else {
                Vec::new()
            }
        };
        for ((i, x), o) in victims {
            self.evict(Ino(i), x, &o);
        }
        Ok(Some(obj))
    }

    /// Drop object `o` (`ino`, `index`) from the descriptor cache, writing the entries it
    /// settled lazily first. Only under the object's lock, taken without waiting: whoever
    /// holds an object from the cache holds its lock (the caller holds one of its own, maybe
    /// the same stripe), and an object in use stays cached (the cache exceeds its bound by
    /// at most the objects in use).
    fn evict(&self, ino: Ino, index: u32, o: &Arc<Object>) {
        let Some(_g) = self.lock(ino, index).try_write() else { return };
        if let Err(e) = o.mem.lock().flush(&o.sums) {
            // Left pending on disk: settled from the bytes when the object is next opened.
            tracing::warn!("settle checksums {}: {e}", o.sums.path().display());
        }
        let mut c = self.fds.lock();
        if c.map.get(&(ino.0, index)).is_some_and(|(x, _)| Arc::ptr_eq(x, o)) {
            c.map.remove(&(ino.0, index));
        }
    }

    /// Drop an object from the descriptor cache without writing anything (after a failed
    /// write or truncation: what is kept in memory may no longer describe the files, and
    /// the next open settles the pending entries from the bytes). Under the object's
    /// exclusive lock.
    fn uncache(&self, ino: Ino, index: u32) {
        self.fds.lock().map.remove(&(ino.0, index));
    }

    /// Read up to `len` bytes at `offset`, verified against their checksums; shorter at the
    /// end of the object, empty if the object does not exist. The whole blocks the range
    /// touches are read (a checksum covers a block) and the range is handed out of them
    /// without another copy. A block that does not match fails the read with `EIO` naming
    /// the object file and the block's offset (and is logged by the dispatcher).
    pub fn read(&self, ino: Ino, index: u32, offset: u64, len: usize) -> R<Bytes> {
        let _g = self.lock(ino, index).read();
        let Some(obj) = self.open_object(ino, index, false)? else { return Ok(Bytes::new()) };
        self.read_open(&obj, offset, len)
    }

    /// [`DataStore::read`] of an object opened under its lock.
    fn read_open(&self, obj: &Object, offset: u64, len: usize) -> R<Bytes> {
        let size = obj.mem.lock().size;
        if offset >= size || len == 0 {
            return Ok(Bytes::new());
        }
        let end = size.min(offset.saturating_add(len as u64));
        let first = offset / BLOCK;
        let last = (end - 1) / BLOCK;
        let from = first * BLOCK;
        let upto = size.min((last + 1) * BLOCK);
        // Read into fresh memory without zeroing it first (up to 8 MiB per read).
        let mut buf = Vec::with_capacity((upto - from) as usize);
        let got = pread_uninit(&obj.data, buf.spare_capacity_mut(), from)
            .map_err(|e| Fail::io(format_args!("read {}", obj.path.display()), &e))?;
        // SAFETY: the kernel wrote the first `got` bytes.
        unsafe { buf.set_len(got) };
        let n = buf.len().div_ceil(BLOCK as usize) as u64;
        let entries = {
            let mut mem = obj.mem.lock();
            self.sums_cache.record(mem.holds(first, n));
            mem.entries(&obj.sums, first, n)
        };
        self.verify(obj, first, &buf, entries).map_err(|b| b.fail())?;
        let start = (offset - from) as usize;
        let stop = ((end - from) as usize).min(buf.len());
        Ok(Bytes::from(buf).slice(start.min(stop)..stop))
    }

    /// Check the blocks `first ..` whose bytes are `buf` (all but the last complete)
    /// against `entries` (theirs, from [`Sums::entries`] or the sidecar).
    fn verify(
        &self,
        obj: &Object,
        first: u64,
        buf: &[u8],
        entries: std::io::Result<Vec<Result<Entry, String>>>,
    ) -> Result<(), BadBlock> {
        let entries = entries.map_err(|e| BadBlock {
            path: obj.path.clone(),
            offset: first * BLOCK,
            reason: format!("has unreadable checksums ({}: {e})", obj.sums.path().display()),
        })?;
        for (i, (chunk, entry)) in buf.chunks(BLOCK as usize).zip(entries).enumerate() {
            let offset = (first + i as u64) * BLOCK;
            let bad = |reason: String| BadBlock { path: obj.path.clone(), offset, reason };
            let entry = entry.map_err(|r| bad(format!("cannot be checked: {r} ({})", obj.sums.path().display())))?;
            let crc = block_crc(chunk);
            if !entry.accepts(crc) {
                return Err(bad(format!("fails its checksum (stored {}, computed {crc:08x})", entry.describe())));
            }
        }
        Ok(())
    }

    /// Check the blocks `first ..` whose bytes are `buf` against the entries in the sidecar.
    fn verify_stored(&self, obj: &Object, first: u64, buf: &[u8]) -> Result<(), BadBlock> {
        let n = buf.len().div_ceil(BLOCK as usize) as u64;
        self.verify(obj, first, buf, obj.sums.read(first, n))
    }

    /// Write `data` at `offset`, creating the object if needed, and update the checksums
    /// of the blocks it touches: pending (new and old) in the sidecar before the data,
    /// settled in memory after, and in the sidecar later (lazily, `sums_cache.rs`; the crash
    /// invariant of `checksums.rs` holds at every instant).
    ///
    /// `copies` is how many copies of the object its file wants (the layout's `replicas`,
    /// carried by the request). This store keeps one, on this server; the change goes into
    /// the replication log with the count, and the shipper sends mirrors past it a mark
    /// instead of the bytes (`replica/thin.rs`). An object this store holds only the mark
    /// of is refused (`EIO`): writing into it would make it read as zeros around the write.
    pub fn write(&self, ino: Ino, index: u32, offset: u64, data: &[u8], copies: u8) -> R<()> {
        self.write_with_crcs(ino, index, offset, data, None, copies)
    }

    /// [`DataStore::write`], with the CRC32C of the write's block pieces when the caller has
    /// them already (`crcs`, from [`PieceCrcs::compute`] over the same bytes: the connection
    /// computed them to verify the frame's data checksum, `net.rs`); computed here otherwise.
    pub fn write_with_crcs(
        &self,
        ino: Ino,
        index: u32,
        offset: u64,
        data: &[u8],
        crcs: Option<&PieceCrcs>,
        copies: u8,
    ) -> R<()> {
        let end = offset.saturating_add(data.len() as u64);
        if end > i64::MAX as u64 {
            return Err(Fail::new(Errno::EFBIG, format!("write at {offset} beyond the largest object size")));
        }
        // The CRC32C of the piece of `data` in each block it touches, before taking the lock:
        // the one pass over the bytes (made by the connection for a `Write` that arrived
        // with a data checksum). Under the lock only constant-time combinations remain (but
        // for a block that must be read and patched), so writes to one object wait less for
        // each other.
        let computed;
        let piece_crcs = match crcs {
            Some(c) if c.cover(offset, data.len()) => c.pieces(),
            _ => {
                computed = PieceCrcs::compute(offset, data);
                computed.pieces()
            }
        };
        let _g = self.lock(ino, index).write();
        self.write_locked(ino, index, offset, data, piece_crcs, copies)
    }

    /// The part of [`DataStore::write_with_crcs`] made under the object's exclusive lock
    /// (held by the caller), with the CRC32C of the write's block pieces.
    fn write_locked(&self, ino: Ino, index: u32, offset: u64, data: &[u8], piece_crcs: &[u32], copies: u8) -> R<()> {
        let end = offset + data.len() as u64;
        let obj = self
            .open_object(ino, index, true)?
            .ok_or_else(|| Fail::new(Errno::EIO, format!("object {ino}.{index} could not be created")))?;
        if data.is_empty() {
            return Ok(());
        }
        let sums_err = |e: std::io::Error| Fail::io(format_args!("checksums {}", obj.sums.path().display()), &e);
        let mut mem = obj.mem.lock();
        let size = mem.size;
        let first = offset / BLOCK;
        let last = (end - 1) / BLOCK;
        // One piece per block touched (`PieceCrcs::compute` cuts at the block boundaries).
        debug_assert_eq!(piece_crcs.len() as u64, last - first + 1);
        self.sums_cache.record(mem.holds(first, last - first + 1));
        let stored = mem.entries(&obj.sums, first, last - first + 1).map_err(sums_err)?;
        let mut pending = Vec::with_capacity(stored.len());
        let mut scratch = Vec::new();
        for ((k, entry), &piece_crc) in (first..=last).zip(stored).zip(piece_crcs) {
            let (new, old) = self.block_update(&obj, &mem, k, entry, size, offset, data, piece_crc, &mut scratch)?;
            pending.push(Entry::Pending { new, old });
        }
        obj.sums.write(first, &pending).map_err(sums_err)?;
        mem.stored_up_to(last + 1);
        let direct = match self.direct.load(std::sync::atomic::Ordering::Relaxed) {
            true => obj.direct.get_or_init(|| crate::store::direct::open(&obj.path)).as_ref(),
            false => None,
        };
        // The aligned part around the page cache (a mirror's copy), the rest through it.
        let wrote = direct.map_or(Ok(0), |f| crate::store::direct::write_aligned(f, data, offset)).and_then(|n| {
            obj.data.write_all_at(&data[n..], offset + n as u64)?;
            Ok(n)
        });
        let went_direct = match wrote {
            Ok(n) => n > 0,
            Err(e) => {
                // Part of the data may have landed: settle every pending entry to what its
                // block holds now, so that none reads as damaged, and forget what memory says.
                let _ = obj.sums.settle(&obj.data, &obj.path);
                drop(mem);
                self.uncache(ino, index);
                return Err(Fail::io(format_args!("write {}", obj.path.display()), &e));
            }
        };
        let mut recorded = Ok(());
        for (k, e) in (first..=last).zip(&pending) {
            let Entry::Pending { new, .. } = *e else { unreachable!("built pending above") };
            let bs = k * BLOCK;
            let (ws, we) = (offset.max(bs), end.min(bs + BLOCK));
            let replaced_all = ws == bs && we >= size.clamp(bs, bs + BLOCK);
            recorded = recorded.and_then(|()| mem.wrote(&obj.sums, k, new, ws - bs, we - bs, replaced_all));
        }
        mem.size = mem.size.max(end);
        drop(mem);
        self.mark_dirty(ino, index); // the bytes landed, whatever follows
        if let Err(e) = recorded {
            // Memory could not take the new entries (a flush to make room failed): it no
            // longer describes the object, whose sidecar says pending (valid for the new
            // bytes); the next open settles them from the bytes.
            self.uncache(ino, index);
            return Err(sums_err(e));
        }
        if !went_direct {
            start_writeback(&obj.data, offset, end);
        }
        let len = data.len() as u32;
        self.replicate(shoal_proto::msg::ReplChange::Write { ino, index, offset, len, copies }, || {
            Bytes::copy_from_slice(data)
        });
        Ok(())
    }

    /// The (new, old) checksums of block `k` for a write of `data` at `offset` to an object
    /// of `size` bytes whose entry for `k` is `entry`. Three cases, cheapest first:
    /// the write covers every byte the block holds (checksum of the new bytes alone); the
    /// bytes it replaces are zeros (a hole, or past the end: the new checksum follows from
    /// the stored one, see [`checksums::with_piece`], and the rest of the block is not
    /// read; memory says so for the blocks it has seen written, see [`Sums::may_hold_data`],
    /// else the file system is asked where its holes are); otherwise the block is read,
    /// checked against its entry (a damaged block is not silently blessed by a partial
    /// write: `EIO`), and patched.
    #[allow(clippy::too_many_arguments)]
    fn block_update(
        &self,
        obj: &Object,
        mem: &Sums,
        k: u64,
        entry: Result<Entry, String>,
        size: u64,
        offset: u64,
        data: &[u8],
        piece_crc: u32,
        scratch: &mut Vec<u8>,
    ) -> R<(u32, u32)> {
        let bs = k * BLOCK;
        let ws = offset.max(bs);
        let we = (offset + data.len() as u64).min(bs + BLOCK);
        let piece = &data[(ws - offset) as usize..(we - offset) as usize];
        let held = size.clamp(bs, bs + BLOCK); // the block holds bytes [bs, held)
        let known = entry.as_ref().ok().and_then(|e| e.known());
        if ws == bs && we >= held {
            // Every byte the block holds is replaced; what follows the piece is zeros.
            let new = checksums::padded_crc(piece_crc, piece.len() as u64);
            return Ok((new, known.unwrap_or(new)));
        }
        let io = |e: std::io::Error| Fail::io(format_args!("read {}", obj.path.display()), &e);
        if let Some(old) = known {
            // The bytes to be replaced, where the object holds any.
            let to = we.min(held);
            if to <= ws
                || !mem.may_hold_data(k, ws - bs, to - bs)
                || range_is_zeros(&obj.data, ws, to, scratch).map_err(io)?
            {
                return Ok((checksums::with_piece(old, ws - bs, piece_crc, piece.len() as u64), old));
            }
        }
        scratch.clear();
        scratch.resize(BLOCK as usize, 0);
        let got = read_full_at(&obj.data, &mut scratch[..(held - bs) as usize], bs).map_err(io)?;
        scratch[got..].fill(0);
        self.verify(obj, k, &scratch[..got], Ok(vec![entry])).map_err(|b| b.fail())?;
        let old = block_crc(&scratch[..got]);
        scratch[(ws - bs) as usize..(we - bs) as usize].copy_from_slice(piece);
        Ok((block_crc(scratch), old))
    }

    fn mark_dirty(&self, ino: Ino, index: u32) {
        let overflow = {
            let mut d = self.dirty.lock();
            let v = d.entry(ino.0).or_default();
            if !v.contains(&index) {
                v.push(index);
            }
            if d.len() > DIRTY_MAX {
                d.clear();
                true
            } else {
                false
            }
        };
        if overflow {
            // Everything written so far becomes durable at once; nothing is forgotten.
            if let Err(e) = self.syncfs() {
                tracing::warn!("syncfs {}: {e}", self.root.display());
            }
        }
    }

    /// Shorten object `index` to `len` bytes if it is longer (a missing object stays missing:
    /// it reads as zeros anyway). The checksums follow the crash invariant: the blocks that
    /// change (the one cut in the middle, those dropped) are pending before the cut, the
    /// cut block settled and the dropped entries removed after. `copies` as in
    /// [`DataStore::write`]: the replication layer cuts the other copies. An object this
    /// store holds only the mark of may be cut to nothing (its bytes are zeros from now on,
    /// wherever they were kept: the mark goes), not to any other length (`EIO`).
    pub fn truncate(&self, ino: Ino, index: u32, len: u64, copies: u8) -> R<()> {
        let _g = self.lock(ino, index).write();
        if len == 0 && self.is_unkept(ino, index) {
            let mark = self.unkept_path(ino, index);
            std::fs::remove_file(&mark).map_err(|e| Fail::io(format_args!("drop {}", mark.display()), &e))?;
            self.replicate(shoal_proto::msg::ReplChange::Truncate { ino, index, len, copies }, Bytes::new);
            return Ok(());
        }
        let Some(obj) = self.open_object(ino, index, false)? else { return Ok(()) };
        let mut mem = obj.mem.lock();
        if mem.size <= len {
            return Ok(());
        }
        // The truncation works on the sidecar: bring it up to date and forget the entries
        // kept in memory (they change below). On failure, memory may not describe the files
        // any more: the object leaves the cache.
        let sums_err = |e: std::io::Error| Fail::io(format_args!("checksums {}", obj.sums.path().display()), &e);
        let res = mem.flush(&obj.sums).map_err(sums_err);
        let res = res.and_then(|()| self.truncate_stored(&obj, mem.size, len));
        let res = res.and_then(|()| obj.sums.blocks().map_err(sums_err));
        match res {
            Ok(stored) => {
                mem.forget(stored);
                mem.size = len;
            }
            Err(_) => {
                drop(mem);
                self.uncache(ino, index);
            }
        }
        let res = res.map(|_| ());
        if res.is_ok() {
            self.mark_dirty(ino, index);
            self.replicate(shoal_proto::msg::ReplChange::Truncate { ino, index, len, copies }, Bytes::new);
        }
        res
    }

    /// The truncation of `obj` from `cur` bytes to `len` (shorter), on the sidecar.
    fn truncate_stored(&self, obj: &Object, cur: u64, len: u64) -> R<()> {
        let sums_err = |e: std::io::Error| Fail::io(format_args!("checksums {}", obj.sums.path().display()), &e);
        let first = len / BLOCK; // the first block that changes
        let last = (cur - 1) / BLOCK;
        let stored = obj.sums.read(first, last - first + 1).map_err(sums_err)?;
        let mut pending = Vec::with_capacity(stored.len());
        let mut cut_block = None;
        for (k, entry) in (first..=last).zip(stored) {
            let bs = k * BLOCK;
            let new = if bs < len {
                // Cut in the middle: keep its first bytes, checked first.
                let mut buf = vec![0u8; (cur.min(bs + BLOCK) - bs) as usize];
                let got = read_full_at(&obj.data, &mut buf, bs)
                    .map_err(|e| Fail::io(format_args!("read {}", obj.path.display()), &e))?;
                buf.truncate(got);
                self.verify_stored(obj, k, &buf).map_err(|b| b.fail())?;
                let new = block_crc(&buf[..((len - bs) as usize).min(got)]);
                cut_block = Some(new);
                new
            } else {
                checksums::zero_block_crc()
            };
            let old = entry.ok().and_then(|e| e.known()).unwrap_or(new);
            pending.push(Entry::Pending { new, old });
        }
        obj.sums.write(first, &pending).map_err(sums_err)?;
        obj.data.set_len(len).map_err(|e| Fail::io(format_args!("truncate {}", obj.path.display()), &e))?;
        if let Some(new) = cut_block {
            obj.sums.write(first, &[Entry::Settled(new)]).map_err(sums_err)?;
        }
        obj.sums.cut(len.div_ceil(BLOCK)).map_err(sums_err)?;
        Ok(())
    }

    /// Delete the given objects (file, object index) held here, with their checksums;
    /// missing ones are fine (idempotent). Open descriptors and pending syncs of those files
    /// are dropped.
    pub fn delete_objects(&self, objects: &[(Ino, u32)]) -> R<()> {
        let files: HashSet<u64> = objects.iter().map(|(ino, _)| ino.0).collect();
        self.dirty.lock().retain(|i, _| !files.contains(i));
        for &(ino, index) in objects {
            // Under the object's lock: no read or write has it open meanwhile, so the
            // cache cannot keep (or get back) a descriptor of a deleted file.
            let _g = self.lock(ino, index).write();
            self.fds.lock().map.remove(&(ino.0, index));
            // The data first: a crash in between leaves a checksum file alone, which the
            // next delete (the gc record is still there) or create replaces.
            for p in [self.path(ino, index), self.sums_path(ino, index), self.unkept_path(ino, index)] {
                match std::fs::remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(Fail::io(format_args!("delete object {}", p.display()), &e)),
                }
            }
        }
        // After every deletion, as one change (the objects' locks are released: a mirror
        // deleting them later than a write that recreates one cannot happen, since a file's
        // objects are deleted only once no name and no open handle is left).
        self.replicate(shoal_proto::msg::ReplChange::Delete { objects: objects.to_vec() }, Bytes::new);
        Ok(())
    }

    /// `fdatasync` (or `fsync` when `!data_only`) every object of `ino` written since its
    /// last sync, and its checksums.
    pub fn sync(&self, ino: Ino, data_only: bool) -> R<()> {
        let Some(indices) = self.dirty.lock().remove(&ino.0) else { return Ok(()) };
        for (n, &index) in indices.iter().enumerate() {
            let res = {
                let _g = self.lock(ino, index).read();
                match self.open_object(ino, index, false) {
                    // The data first: an entry settled on disk then describes durable bytes
                    // (`sums_cache.rs`).
                    Ok(Some(o)) => if data_only { o.data.sync_data() } else { o.data.sync_all() }
                        .and_then(|()| o.mem.lock().flush(&o.sums))
                        .and_then(|()| o.sums.sync(data_only))
                        .map_err(|e| Fail::io(format_args!("sync {}", o.path.display()), &e)),
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = res {
                // Still dirty: a retried fsync must try again.
                self.dirty.lock().entry(ino.0).or_default().extend_from_slice(&indices[n..]);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Bytes allocated on disk by the given objects of `ino` (missing ones count 0).
    pub fn allocated(&self, ino: Ino, indices: impl Iterator<Item = u32>) -> u64 {
        indices.filter_map(|i| std::fs::metadata(self.path(ino, i)).ok()).map(|m| m.blocks() * 512).sum()
    }

    /// Every object held here (a walk of the 256 buckets; checksum files are not objects).
    pub fn list(&self) -> Vec<(Ino, u32)> {
        (0..=255u8).flat_map(|b| self.list_bucket(b)).collect()
    }

    /// The objects of bucket `b` (files whose inode number's low byte is `b`), unsorted.
    pub fn list_bucket(&self, b: u8) -> Vec<(Ino, u32)> {
        self.scan_bucket(b).0
    }

    /// The objects of bucket `b` and the marks of those kept elsewhere
    /// ([`DataStore::mark_unkept`]), unsorted.
    pub fn scan_bucket(&self, b: u8) -> (Vec<ObjectId>, Vec<ObjectId>) {
        let (mut objects, mut marks) = (Vec::new(), Vec::new());
        let Ok(rd) = std::fs::read_dir(self.root.join(format!("{b:02x}"))) else { return (objects, marks) };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            match name.strip_suffix(UNKEPT_SUFFIX) {
                Some(object) => marks.extend(parse_object_name(object)),
                None => objects.extend(parse_object_name(name)),
            }
        }
        (objects, marks)
    }

    /// An object's size and the CRC32C of each of its blocks (as [`block_crc`] computes
    /// them: a short last block padded with zeros), `None` if it does not exist: what a
    /// resync compares (`replica/resync.rs`). Taken from the checksums kept with the object;
    /// a block whose entry does not say (a write was under way when a server died, or the
    /// entry is damaged) is read and computed.
    pub fn block_sums(&self, ino: Ino, index: u32) -> R<Option<(u64, Vec<u32>)>> {
        let _g = self.lock(ino, index).read();
        let Some(obj) = self.open_object(ino, index, false)? else { return Ok(None) };
        let mut mem = obj.mem.lock();
        let size = mem.size;
        let n = size.div_ceil(BLOCK);
        if n == 0 {
            return Ok(Some((0, Vec::new())));
        }
        let entries = mem
            .entries(&obj.sums, 0, n)
            .map_err(|e| Fail::io(format_args!("checksums {}", obj.sums.path().display()), &e))?;
        drop(mem);
        let mut buf = Vec::new();
        let mut sums = Vec::with_capacity(n as usize);
        for (k, e) in entries.into_iter().enumerate() {
            match e.ok().and_then(Entry::known) {
                Some(crc) => sums.push(crc),
                None => {
                    let from = k as u64 * BLOCK;
                    buf.resize((size.min(from + BLOCK) - from) as usize, 0);
                    let got = read_full_at(&obj.data, &mut buf, from)
                        .map_err(|e| Fail::io(format_args!("read {}", obj.path.display()), &e))?;
                    sums.push(block_crc(&buf[..got]));
                }
            }
        }
        Ok(Some((size, sums)))
    }

    /// Number of object files (an O(n) directory walk: for status reports).
    pub fn count(&self) -> u64 {
        self.list().len() as u64
    }

    /// Verify every block of one object (for `shoal scrub`), in steps of `step` blocks each
    /// under the object's lock, calling `progress(bytes)` after each and `pause()` between.
    /// Opening it settles or computes its checksums as any access does. Returns the object's
    /// size and the damaged blocks found (each with the object file and offset).
    pub fn scrub_object(
        &self,
        ino: Ino,
        index: u32,
        step: u64,
        mut progress: impl FnMut(u64),
        mut pause: impl FnMut(),
    ) -> R<(u64, Vec<BadBlock>)> {
        let mut bad = Vec::new();
        let mut k = 0;
        let mut buf = Vec::new();
        loop {
            let (size, done) = {
                let _g = self.lock(ino, index).read();
                let Some(obj) = self.open_object(ino, index, false)? else { return Ok((0, bad)) };
                // The sidecar is what is checked: entries settled only in memory first.
                let size = {
                    let mut mem = obj.mem.lock();
                    mem.flush(&obj.sums)
                        .map_err(|e| Fail::io(format_args!("checksums {}", obj.sums.path().display()), &e))?;
                    mem.size
                };
                let blocks = size.div_ceil(BLOCK);
                if k >= blocks {
                    return Ok((size, bad));
                }
                let n = step.min(blocks - k);
                let from = k * BLOCK;
                let upto = size.min((k + n) * BLOCK);
                buf.resize((upto - from) as usize, 0);
                let got = read_full_at(&obj.data, &mut buf, from)
                    .map_err(|e| Fail::io(format_args!("read {}", obj.path.display()), &e))?;
                // Block by block, so that one damaged block does not hide the next.
                for (i, chunk) in buf[..got].chunks(BLOCK as usize).enumerate() {
                    if let Err(b) = self.verify_stored(&obj, k + i as u64, chunk) {
                        bad.push(b);
                    }
                }
                // Blocks the data file no longer reaches (cut short from under the store):
                // their bytes are gone, and a read of them would fail its checksum.
                let reached = (got as u64).div_ceil(BLOCK);
                for b in k + reached..k + n {
                    let reason = format!("is missing (the data file ends at {})", from + got as u64);
                    bad.push(BadBlock { path: obj.path.clone(), offset: b * BLOCK, reason });
                }
                k += n;
                (size, got as u64)
            };
            let _ = size;
            progress(done);
            pause();
        }
    }

    /// Objects whose data file is gone while their checksum file is still there (for
    /// `shoal scrub`): bytes lost from under the store, which read as nothing. A deletion
    /// removes the data file first; one cut short by a crash leaves the same trace, and
    /// the gc record left behind deletes the checksum file again.
    pub fn list_lost(&self) -> Vec<(Ino, u32)> {
        let mut out = Vec::new();
        for b in 0..256 {
            let Ok(rd) = std::fs::read_dir(self.root.join(format!("{b:02x}"))) else { continue };
            for e in rd.flatten() {
                let name = e.file_name();
                let Some(o) = name.to_str().and_then(|n| n.strip_suffix(".crc")).and_then(parse_object_name) else {
                    continue;
                };
                if !self.path(o.0, o.1).exists() {
                    out.push(o);
                }
            }
        }
        out
    }

    /// The object's size and up to `len` of its bytes at `offset`, verified (a damaged
    /// block fails with `EIO`, naming it), under one lock so that both describe the same
    /// state; `None` if the object does not exist. What `shoal scrub` repairs from.
    /// `wait: false` answers `EAGAIN` instead of waiting for the object's lock (a mirror's
    /// copy: see `scrub_repair.rs` on why waiting there could close a cycle of locks).
    pub fn read_copy(&self, ino: Ino, index: u32, offset: u64, len: usize, wait: bool) -> R<Option<(u64, Bytes)>> {
        let lock = self.lock(ino, index);
        let _g = match lock.try_read() {
            Some(g) => g,
            None if wait => lock.read(),
            None => return Err(Fail::new(Errno::EAGAIN, format!("object {ino}.{index} is busy"))),
        };
        let Some(obj) = self.open_object(ino, index, false)? else { return Ok(None) };
        let size = obj.mem.lock().size;
        Ok(Some((size, self.read_open(&obj, offset, len)?)))
    }

    /// Hold object `index` of `ino` for a repair (`scrub_repair.rs`): its exclusive lock,
    /// so that what the repair checks (still damaged? still missing?) is what it writes
    /// over, and no write of a client lands in between to be overwritten with older bytes.
    pub fn lock_for_repair(&self, ino: Ino, index: u32) -> RepairLock<'_> {
        RepairLock { store: self, ino, index, _g: self.lock(ino, index).write() }
    }

    /// Flush every dirty page of the file system holding the objects.
    pub fn syncfs(&self) -> std::io::Result<()> {
        let d = File::open(&self.root)?;
        use std::os::fd::AsRawFd;
        // SAFETY: syncfs on a valid open descriptor.
        if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// An object held under its exclusive lock for a repair ([`DataStore::lock_for_repair`]).
pub struct RepairLock<'a> {
    store: &'a DataStore,
    ino: Ino,
    index: u32,
    _g: parking_lot::RwLockWriteGuard<'a, ()>,
}

impl RepairLock<'_> {
    /// The object's size; `None` when its data file does not exist.
    pub fn size(&self) -> R<Option<u64>> {
        if !self.store.path(self.ino, self.index).exists() {
            // A descriptor cached before the file went would still read the old bytes,
            // and a repair would write into a file nobody can open again.
            self.store.uncache(self.ino, self.index);
            return Ok(None);
        }
        Ok(self.store.open_object(self.ino, self.index, false)?.map(|o| o.mem.lock().size))
    }

    /// Whether the checksum file is there (an object whose data file alone is gone was
    /// lost, not deleted: [`DataStore::list_lost`]).
    pub fn has_sums(&self) -> bool {
        self.store.sums_path(self.ino, self.index).exists()
    }

    /// Whether the block at `offset` (a multiple of 64 KiB) matches its checksum; `None`
    /// when the object no longer holds it (deleted or cut meanwhile).
    pub fn block_is_good(&self, offset: u64) -> R<Option<bool>> {
        let Some(obj) = self.store.open_object(self.ino, self.index, false)? else { return Ok(None) };
        let mut mem = obj.mem.lock();
        if offset >= mem.size {
            return Ok(None);
        }
        let k = offset / BLOCK;
        let mut buf = vec![0u8; (mem.size.min(offset + BLOCK) - offset) as usize];
        let got = read_full_at(&obj.data, &mut buf, offset)
            .map_err(|e| Fail::io(format_args!("read {}", obj.path.display()), &e))?;
        if got < buf.len() {
            // The data file ends before the size the store knows: bytes are gone.
            return Ok(Some(false));
        }
        let entries = mem.entries(&obj.sums, k, 1);
        drop(mem);
        Ok(Some(self.store.verify(&obj, k, &buf, entries).is_ok()))
    }

    /// The size the block at `offset` holds now (what a repair of it must cover).
    pub fn block_len(&self, offset: u64) -> R<u64> {
        let size = self.size()?.unwrap_or(0);
        Ok(size.min(offset + BLOCK).saturating_sub(offset))
    }

    /// Write `data` at `offset` as [`DataStore::write`] does (creating the object, and a
    /// fresh checksum file in place of a lone one; shipped to the mirrors on a primary).
    /// A write covering all a damaged block holds replaces it without reading it.
    pub fn write(&self, offset: u64, data: &[u8]) -> R<()> {
        if !self.store.path(self.ino, self.index).exists() {
            self.store.uncache(self.ino, self.index);
        }
        let crcs = PieceCrcs::compute(offset, data);
        // The file's count of copies is not known here: shipped to every mirror as it is
        // (one that holds only the object's mark keeps it: `replica/mirror.rs`).
        let copies = shoal_proto::msg::REPLICAS_MAX;
        self.store.write_locked(self.ino, self.index, offset, data, crcs.pieces(), copies)
    }
}

/// Does the file hold only zeros in `[from, to)`? Holes are found with `SEEK_DATA` /
/// `SEEK_HOLE` and not read: reading a hole would fill the page cache with zero pages (and
/// read the file's extent tree), which cost a write into a hole more than the write itself
/// (measured on io-hard). Only the data inside the range is read and checked.
fn range_is_zeros(f: &File, from: u64, to: u64, scratch: &mut Vec<u8>) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    let mut at = from;
    while at < to {
        // SAFETY: lseek on a valid descriptor.
        let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            // ENXIO: no data at or after `at`.
            return if e.raw_os_error() == Some(libc::ENXIO) { Ok(true) } else { Err(e) };
        }
        let data = data as u64;
        if data >= to {
            return Ok(true);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let end = (hole as u64).min(to).max(data + 1);
        scratch.resize((end - data) as usize, 0);
        let got = read_full_at(f, scratch, data)?;
        // OR of every byte (no early exit, so it vectorises): zero iff all are zeros.
        if scratch[..got].iter().fold(0u8, |a, &b| a | b) != 0 {
            return Ok(false);
        }
        if got < scratch.len() {
            return Ok(true); // the file ends here
        }
        at = end;
    }
    Ok(true)
}

/// `pread` into uninitialised memory until it is full or the file ends; returns the bytes read.
fn pread_uninit(f: &File, buf: &mut [std::mem::MaybeUninit<u8>], offset: u64) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the kernel writes at most `len - done` bytes into memory we own.
        let n = unsafe {
            libc::pread(
                f.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n > 0 => done += n as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(done)
}

/// The (file, object index) an object file's name stands for (`<16 hex digits>.<index>`);
/// `None` for anything else (checksum files, temporary files).
/// An object: its file and its index in the file.
pub type ObjectId = (Ino, u32);

/// How the mark of an object kept elsewhere is named: the object's name and this.
const UNKEPT_SUFFIX: &str = ".unkept";

pub fn parse_object_name(name: &str) -> Option<(Ino, u32)> {
    let (ino, index) = name.split_once('.')?;
    if ino.len() != 16 || !index.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((Ino(u64::from_str_radix(ino, 16).ok()?), index.parse().ok()?))
}

/// When a write `[offset, end)` completes an aligned [`WRITEBACK_CHUNK`] of the object, ask
/// the kernel to start writing the completed chunks to disk now, without waiting
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`).
///
/// Why: a file written in one stream and then fsynced at close (IOR with `-e`, checkpoints)
/// otherwise leaves all its bytes dirty in the page cache until the close, which then waits
/// for the whole file to reach the disk; the kernel's own background writeback starts only
/// past `dirty_background_ratio` of memory (gigabytes here). Starting each chunk's
/// writeback as soon as it is complete overlaps the disk with the network, and the close
/// waits only for the last chunks. Small and random writes rarely complete a chunk and pay
/// nothing. Measured with `shoal bench io -F -t 1M -b 512M -e` (4 servers, 2 processes) in
/// the commit that added it. This is a hint: a failure changes nothing (fsync still
/// reports errors), so it is ignored.
fn start_writeback(f: &File, offset: u64, end: u64) {
    use std::os::fd::AsRawFd;
    let first_chunk_end = offset / WRITEBACK_CHUNK * WRITEBACK_CHUNK + WRITEBACK_CHUNK;
    if end < first_chunk_end {
        return;
    }
    // The completed chunks: from the start of the chunk the write began in to the last
    // chunk boundary it reached.
    let from = offset / WRITEBACK_CHUNK * WRITEBACK_CHUNK;
    let to = end / WRITEBACK_CHUNK * WRITEBACK_CHUNK;
    unsafe {
        libc::sync_file_range(
            f.as_raw_fd(),
            from as libc::off64_t,
            (to - from) as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rd(d: &DataStore, ino: Ino, index: u32, offset: u64, len: usize) -> Vec<u8> {
        d.read(ino, index, offset, len).unwrap().to_vec()
    }

    /// An object this store keeps only the mark of (a mirror past its file's count of
    /// copies): its bytes are gone, reads, writes and cuts to a length are `EIO` (never the
    /// zeros of a missing object), also after the store is opened again; a cut to nothing or
    /// a deletion clears the mark, after which the object is written and read as any other.
    #[test]
    fn a_marked_object_is_refused_until_cut_to_nothing_or_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        let (ino, other) = (Ino(0x2a), Ino(0x12a));
        d.write(ino, 0, 0, b"kept elsewhere", 1).unwrap();
        d.write(ino, 1, 0, b"kept here", 2).unwrap();
        d.write(other, 0, 0, b"other", 1).unwrap();
        d.mark_unkept(ino, 0).unwrap();
        d.mark_unkept(other, 0).unwrap();
        d.mark_unkept(other, 0).unwrap(); // again: nothing changes
        assert!(!d.path(ino, 0).exists() && !d.sums_path(ino, 0).exists(), "its bytes and checksums are gone");
        let (mut objects, mut marks) = d.scan_bucket(0x2a);
        objects.sort();
        marks.sort();
        assert_eq!(objects, vec![(ino, 1)]);
        assert_eq!(marks, vec![(ino, 0), (other, 0)]);
        let d = DataStore::open(dir.path()).unwrap();
        for e in [
            d.read(ino, 0, 0, 10).map(|_| ()).unwrap_err(),
            d.write(ino, 0, 100, b"x", 1).unwrap_err(),
            d.truncate(ino, 0, 5, 1).unwrap_err(),
        ] {
            assert_eq!(e.errno, Errno::EIO);
            assert!(e.to_string().contains("has no copy on this server"), "{e}");
        }
        assert_eq!(rd(&d, ino, 1, 0, 100), b"kept here");
        d.truncate(ino, 0, 0, 1).unwrap();
        assert!(!d.is_unkept(ino, 0));
        assert_eq!(rd(&d, ino, 0, 0, 10), b"");
        d.write(ino, 0, 0, b"again", 1).unwrap();
        assert_eq!(rd(&d, ino, 0, 0, 10), b"again");
        d.delete_objects(&[(other, 0)]).unwrap();
        assert!(!d.is_unkept(other, 0));
        assert_eq!(d.scan_bucket(0x2a).1, Vec::<(Ino, u32)>::new());
    }

    /// A crash between the mark and the removal of the bytes leaves both: the mark wins.
    #[test]
    fn a_mark_beside_left_over_bytes_wins() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        let ino = Ino(7);
        d.write(ino, 0, 0, b"stale", 1).unwrap();
        std::fs::write(d.unkept_path(ino, 0), b"").unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        assert_eq!(d.read(ino, 0, 0, 5).unwrap_err().errno, Errno::EIO);
        let listed = crate::replica::digest::objects(&d, 7).unwrap();
        assert_eq!(listed, vec![(ino, 0, crate::replica::digest::UNKEPT, 0)]);
    }

    /// A mirror's store writes the aligned part of each write around the page cache: what
    /// reads back, and the checksums a scrub verifies, are the same as through the cache,
    /// for aligned, unaligned and overlapping writes, and after the store stops writing so.
    #[test]
    fn direct_writes_read_back_and_verify() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        d.set_direct_writes(true);
        let ino = Ino(42);
        let mut model = vec![0u8; 0];
        let mut put = |d: &DataStore, offset: usize, len: usize, seed: u8| {
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            d.write(ino, 0, offset as u64, &data, 2).unwrap();
            if model.len() < offset + len {
                model.resize(offset + len, 0);
            }
            model[offset..offset + len].copy_from_slice(&data);
            model.clone()
        };
        put(&d, 0, 3 * 4096 + 100, 1); // aligned part direct, tail cached
        put(&d, 5000, 9000, 2); // unaligned: through the cache
        put(&d, 8192, 2 * 65536, 3); // aligned again, over cached pages
        let m = put(&d, 200_000, 70_000, 4); // past the end, leaving a hole
        d.set_direct_writes(false);
        let m2 = put(&d, 4096, 4096, 5);
        assert_ne!(m, m2);
        assert_eq!(rd(&d, ino, 0, 0, m2.len()), m2);
        let (size, bad) = d.scrub_object(ino, 0, 3, |_| {}, || {}).unwrap();
        assert_eq!(size, m2.len() as u64);
        assert!(bad.is_empty(), "{bad:?}");
    }

    #[test]
    fn objects_read_write_truncate_delete() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        let ino = Ino(0xabcd_0012);
        assert!(rd(&d, ino, 0, 0, 10).is_empty());
        d.write(ino, 1, 5, b"hello", 1).unwrap();
        assert!(d.path(ino, 1).ends_with("12/00000000abcd0012.1"));
        assert!(d.sums_path(ino, 1).ends_with("12/00000000abcd0012.1.crc"));
        assert_eq!(rd(&d, ino, 1, 0, 100), b"\0\0\0\0\0hello");
        // beyond 4 GiB, sparse
        d.write(ino, 1, 5 << 30, b"far", 1).unwrap();
        assert_eq!(rd(&d, ino, 1, (5 << 30) - 1, 10), b"\0far");
        d.sync(ino, true).unwrap();
        d.truncate(ino, 1, 7, 1).unwrap();
        assert_eq!(rd(&d, ino, 1, 0, 100), b"\0\0\0\0\0he");
        d.truncate(ino, 3, 0, 1).unwrap(); // missing: fine
        assert_eq!(d.count(), 1);
        assert_eq!(d.list(), vec![(ino, 1)]);
        d.delete_objects(&[(ino, 0), (ino, 1), (ino, 2)]).unwrap();
        assert!(rd(&d, ino, 1, 0, 100).is_empty());
        assert!(!d.sums_path(ino, 1).exists());
        assert_eq!(d.count(), 0);
        d.delete_objects(&[(ino, 1)]).unwrap();
    }

    /// A model of the object (a plain vector) checked against the store, block checksums
    /// included (scrub finds nothing), after each kind of change.
    fn check_clean(d: &DataStore, ino: Ino, model: &[u8]) {
        assert_eq!(rd(d, ino, 0, 0, model.len() + 10), model);
        let (size, bad) = d.scrub_object(ino, 0, 3, |_| {}, || {}).unwrap();
        assert_eq!(size, model.len() as u64);
        assert!(bad.is_empty(), "{bad:?}");
    }

    fn put(model: &mut Vec<u8>, offset: usize, data: &[u8]) {
        if model.len() < offset + data.len() {
            model.resize(offset + data.len(), 0);
        }
        model[offset..offset + data.len()].copy_from_slice(data);
    }

    #[test]
    fn checksums_follow_partial_writes_holes_extension_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        let ino = Ino(0x51);
        let b = BLOCK as usize;
        let mut model = Vec::new();
        let pat =
            |n: usize, seed: u8| -> Vec<u8> { (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect() };
        let steps: Vec<(usize, Vec<u8>)> = vec![
            (100, pat(1000, 1)),        // partial first block, after zeros
            (1100, pat(500, 2)),        // append within the block
            (50, pat(100, 3)),          // overwrite across existing bytes
            (b - 10, pat(30, 4)),       // across a block boundary
            (5 * b + 7, pat(3 * b, 5)), // far: leaves holes, spans blocks
            (2 * b + 100, pat(10, 6)),  // into a hole below the end
            (0, pat(b, 7)),             // a whole block
            (8 * b, pat(1, 8)),         // extend by one byte at a block start
        ];
        for (off, data) in steps {
            d.write(ino, 0, off as u64, &data, 1).unwrap();
            put(&mut model, off, &data);
            check_clean(&d, ino, &model);
        }
        // Unaligned reads return exactly their range.
        assert_eq!(rd(&d, ino, 0, (b - 20) as u64, 50), model[b - 20..b + 30]);
        // Truncate to mid-block, then extend over the cut: the bytes after the cut are zeros.
        for len in [5 * b + 1000, 3 * b, 3 * b - 1, 10] {
            d.truncate(ino, 0, len as u64, 1).unwrap();
            model.truncate(len);
            check_clean(&d, ino, &model);
        }
        d.write(ino, 0, 20, b"xy", 1).unwrap();
        put(&mut model, 20, b"xy");
        check_clean(&d, ino, &model);
        d.write(ino, 0, (2 * b) as u64, b"z", 1).unwrap();
        put(&mut model, 2 * b, b"z");
        check_clean(&d, ino, &model);
    }

    #[test]
    fn a_flipped_byte_fails_reads_of_its_block_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        let ino = Ino(0x52);
        let b = BLOCK as usize;
        let body: Vec<u8> = (0..3 * b + 500).map(|i| (i % 251) as u8).collect();
        d.write(ino, 0, 0, &body, 1).unwrap();
        let path = d.path(ino, 0);
        let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, (b + 1234) as u64).unwrap();
        f.write_all_at(&[byte[0] ^ 0x04], (b + 1234) as u64).unwrap();
        let e = d.read(ino, 0, (b + 10) as u64, 10).unwrap_err();
        assert_eq!(e.errno, Errno::EIO);
        assert!(e.message.contains(&path.display().to_string()) && e.message.contains(&format!("offset {b}")), "{e}");
        assert_eq!(rd(&d, ino, 0, 0, b), body[..b]);
        assert_eq!(rd(&d, ino, 0, 2 * b as u64, 2 * b), body[2 * b..]);
        // A partial write does not bless the damaged block; scrub names it, and only it.
        assert_eq!(d.write(ino, 0, (b + 5) as u64, b"q", 1).unwrap_err().errno, Errno::EIO);
        let (_, bad) = d.scrub_object(ino, 0, 2, |_| {}, || {}).unwrap();
        assert_eq!(bad.iter().map(|x| (x.path.clone(), x.offset)).collect::<Vec<_>>(), vec![(path, b as u64)]);
        // Rewriting the whole block repairs it.
        d.write(ino, 0, b as u64, &body[b..2 * b], 1).unwrap();
        check_clean(&d, ino, &body);
    }

    #[test]
    fn objects_without_checksums_get_them_at_first_access() {
        let dir = tempfile::tempdir().unwrap();
        let ino = Ino(0x53);
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        {
            let d = DataStore::open(dir.path()).unwrap();
            std::fs::write(d.path(ino, 0), &body).unwrap();
            assert!(!d.sums_path(ino, 0).exists());
        }
        let d = DataStore::open(dir.path()).unwrap();
        assert_eq!(rd(&d, ino, 0, 1000, 10), body[1000..1010]);
        assert!(d.sums_path(ino, 0).exists());
        check_clean(&d, ino, &body);
    }

    #[test]
    fn entries_left_pending_by_a_killed_server_settle_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let ino = Ino(0x54);
        let b = BLOCK as usize;
        let old: Vec<u8> = vec![3u8; 2 * b];
        let new: Vec<u8> = vec![9u8; 2 * b];
        {
            let d = DataStore::open(dir.path()).unwrap();
            d.write(ino, 0, 0, &old, 1).unwrap();
            // What a server killed between steps (1) and (3) of a write leaves: entries pending,
            // block 0 with the new bytes, block 1 still old.
            let s = Sidecar::open(&d.sums_path(ino, 0)).unwrap().unwrap();
            let e = Entry::Pending { new: block_crc(&new[..b]), old: block_crc(&old[..b]) };
            s.write(0, &[e, e]).unwrap();
            std::fs::OpenOptions::new().write(true).open(d.path(ino, 0)).unwrap().write_all_at(&new[..b], 0).unwrap();
        }
        let d = DataStore::open(dir.path()).unwrap();
        let mut expect = new[..b].to_vec();
        expect.extend_from_slice(&old[b..]);
        check_clean(&d, ino, &expect);
        let s = Sidecar::open(&d.sums_path(ino, 0)).unwrap().unwrap();
        assert!(s.read(0, 2).unwrap().iter().all(|e| matches!(e, Ok(Entry::Settled(_)))));
    }

    /// (read, write) system calls made so far by the calling thread (`/proc/thread-self/io`).
    fn syscalls() -> (u64, u64) {
        // One `read` into a buffer large enough, so that what this costs is constant.
        let mut buf = [0u8; 4096];
        let n = std::io::Read::read(&mut File::open("/proc/thread-self/io").unwrap(), &mut buf).unwrap();
        let io = std::str::from_utf8(&buf[..n]).unwrap();
        let field = |name: &str| io.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim().parse::<u64>().unwrap();
        (field("syscr:"), field("syscw:"))
    }

    #[test]
    fn a_write_costs_one_write_to_the_checksum_file_and_no_reads_once_the_object_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        let ino = Ino(0x55);
        // io-hard's pattern: 47,008-byte pieces side by side, some landing in a hole below
        // the end (the piece after was written first), most inside blocks written before.
        let piece = |i: u64| -> Vec<u8> { (0..47_008u64).map(|j| (i * 7 + j % 251) as u8).collect() };
        let mut model = Vec::new();
        d.write(ino, 0, 0, &piece(0), 1).unwrap();
        put(&mut model, 0, &piece(0));
        for i in [2u64, 1, 3, 5, 4, 6, 7] {
            let off = i * 47_008;
            let (c0, c1) = (syscalls(), syscalls()); // what reading the counters costs
            let before = syscalls();
            d.write(ino, 0, off, &piece(i), 1).unwrap();
            let after = syscalls();
            let cost = (c1.0 - c0.0, c1.1 - c0.1);
            let after = (after.0 - cost.0, after.1 - cost.1);
            // One `pwrite` of the pending entries, one of the data; no read (the entries, the
            // length and where the blocks hold bytes are known).
            assert_eq!((after.0 - before.0, after.1 - before.1), (0, 2), "piece {i}");
            put(&mut model, off as usize, &piece(i));
        }
        check_clean(&d, ino, &model);
    }

    #[test]
    fn entries_settled_in_memory_reach_the_checksum_file_at_fsync_and_survive_a_kill_before() {
        let dir = tempfile::tempdir().unwrap();
        let ino = Ino(0x56);
        let b = BLOCK as usize;
        let body: Vec<u8> = (0..3 * b + 77).map(|i| (i % 239) as u8).collect();
        {
            let d = DataStore::open(dir.path()).unwrap();
            d.write(ino, 0, 0, &body, 1).unwrap();
            d.write(ino, 0, 100, b"again", 1).unwrap();
            // Not synced: the checksum file still says pending (new or old), which the block
            // satisfies; dropping the store here is what `kill -9` leaves.
            let s = Sidecar::open(&d.sums_path(ino, 0)).unwrap().unwrap();
            assert!(s.read(0, 4).unwrap().iter().all(|e| matches!(e, Ok(Entry::Pending { .. }))));
        }
        let mut expect = body.clone();
        put(&mut expect, 100, b"again");
        let d = DataStore::open(dir.path()).unwrap();
        check_clean(&d, ino, &expect);
        d.write(ino, 0, 5, b"x", 1).unwrap();
        put(&mut expect, 5, b"x");
        d.sync(ino, true).unwrap();
        let s = Sidecar::open(&d.sums_path(ino, 0)).unwrap().unwrap();
        let e = s.read(0, 4).unwrap();
        assert_eq!(e[0], Ok(Entry::Settled(block_crc(&expect[..b]))));
        assert!(e.iter().all(|e| matches!(e, Ok(Entry::Settled(_)))), "{e:?}");
        check_clean(&d, ino, &expect);
    }

    #[test]
    fn object_names_parse_and_checksum_files_are_not_objects() {
        assert_eq!(parse_object_name("00000000abcd0012.3"), Some((Ino(0xabcd_0012), 3)));
        assert_eq!(parse_object_name("00000000abcd0012.3.crc"), None);
        assert_eq!(parse_object_name("00000000abcd0012.3.crc.tmp1f"), None);
        assert_eq!(parse_object_name("x.3"), None);
    }

    #[test]
    fn cache_eviction_keeps_working() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        for i in 0..(FD_CACHE as u64 + 300) {
            d.write(Ino(i + 2), 0, 0, &i.to_le_bytes(), 1).unwrap();
        }
        for i in 0..(FD_CACHE as u64 + 300) {
            assert_eq!(rd(&d, Ino(i + 2), 0, 0, 8), i.to_le_bytes());
        }
        assert!(d.fds.lock().map.len() <= FD_CACHE);
    }
}
