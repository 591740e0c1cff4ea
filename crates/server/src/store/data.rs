//! Data objects: one local file per (file, object index) held by this server, at
//! `<data_dir>/objects/<ino & 0xff, 2 hex digits>/<ino, 16 hex digits>.<index>`.
//!
//! Objects are written with `pwrite` at their object offset, so holes stay sparse and
//! objects beyond 4 GiB need nothing special; a missing object or a read beyond its end
//! reads as nothing (the client zero-fills up to the file size). Open descriptors are
//! cached (up to [`FD_CACHE`]) because reopening per request would dominate small reads and
//! writes. Objects written since their last sync are remembered so that `Fsync` knows what
//! to `fdatasync` without scanning directories. All functions block.

use crate::error::{Fail, R};
use parking_lot::Mutex;
use shoal_proto::Errno;
use shoal_proto::Ino;
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most open object files kept.
pub const FD_CACHE: usize = 1024;
/// Files remembered as written-but-not-synced before the store syncs the whole file system
/// instead (bounds the memory a client that never calls fsync can make us hold).
const DIRTY_MAX: usize = 100_000;
/// Streaming writes start the disk writing every this many bytes of an object (see
/// [`start_writeback`]).
const WRITEBACK_CHUNK: u64 = 8 << 20;

struct FdCache {
    map: HashMap<(u64, u32), (Arc<File>, u64)>,
    tick: u64,
}

pub struct DataStore {
    root: PathBuf,
    fds: Mutex<FdCache>,
    dirty: Mutex<HashMap<u64, Vec<u32>>>,
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
        })
    }

    fn bucket(&self, ino: Ino) -> PathBuf {
        self.root.join(format!("{:02x}", ino.0 & 0xff))
    }

    pub fn path(&self, ino: Ino, index: u32) -> PathBuf {
        self.bucket(ino).join(format!("{:016x}.{index}", ino.0))
    }

    /// An open descriptor for the object, from the cache or freshly opened. `None` if it does
    /// not exist and `create` is false.
    fn fd(&self, ino: Ino, index: u32, create: bool) -> R<Option<Arc<File>>> {
        let mut c = self.fds.lock();
        c.tick += 1;
        let tick = c.tick;
        if let Some((f, t)) = c.map.get_mut(&(ino.0, index)) {
            *t = tick;
            return Ok(Some(f.clone()));
        }
        // Opened under the lock so that a concurrent delete cannot slip between the open and
        // the insertion and leave a descriptor of an unlinked file in the cache.
        let path = self.path(ino, index);
        let f = match OpenOptions::new().read(true).write(true).create(create).mode(0o600).open(&path) {
            Ok(f) => Arc::new(f),
            Err(e) if e.kind() == ErrorKind::NotFound && !create => return Ok(None),
            Err(e) => return Err(Fail::io(format_args!("open object {}", path.display()), &e)),
        };
        if c.map.len() >= FD_CACHE {
            // Evict the least recently used eighth in one go.
            let mut ticks: Vec<u64> = c.map.values().map(|(_, t)| *t).collect();
            let k = FD_CACHE / 8;
            let (_, cut, _) = ticks.select_nth_unstable(k);
            let cut = *cut;
            c.map.retain(|_, (_, t)| *t > cut);
        }
        c.map.insert((ino.0, index), (f.clone(), tick));
        Ok(Some(f))
    }

    /// Read up to `len` bytes at `offset`; shorter at the end of the object, empty if the
    /// object does not exist. (Requests are answered from [`DataStore::region`] without
    /// copying; this is for checking what a test wrote.)
    #[cfg(test)]
    pub fn read(&self, ino: Ino, index: u32, offset: u64, len: usize) -> R<Vec<u8>> {
        let Some(f) = self.fd(ino, index, false)? else { return Ok(Vec::new()) };
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match f.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(Fail::io(format_args!("read object {ino}.{index}"), &e)),
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// The part of `[offset, offset+len)` that object `index` of `ino` holds, to be sent
    /// from the file itself ([`send_region`]); `None` if the object does not exist or ends
    /// before `offset`. Asks the kernel to start reading the range from disk now, so that
    /// several requests' disk reads overlap before they are sent in turn.
    pub fn region(&self, ino: Ino, index: u32, offset: u64, len: usize) -> R<Option<Region>> {
        let Some(f) = self.fd(ino, index, false)? else { return Ok(None) };
        let size = f.metadata().map_err(|e| Fail::io(format_args!("stat object {ino}.{index}"), &e))?.len();
        if offset >= size || len == 0 {
            return Ok(None);
        }
        let len = (size - offset).min(len as u64) as usize;
        use std::os::fd::AsRawFd;
        // SAFETY: advice on a valid open descriptor; failure only loses the hint.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_WILLNEED);
        }
        Ok(Some(Region { file: f, offset, len }))
    }

    /// Write `data` at `offset`, creating the object if needed.
    pub fn write(&self, ino: Ino, index: u32, offset: u64, data: &[u8]) -> R<()> {
        let end = offset.saturating_add(data.len() as u64);
        if end > i64::MAX as u64 {
            return Err(Fail::new(Errno::EFBIG, format!("write at {offset} beyond the largest object size")));
        }
        let f = self
            .fd(ino, index, true)?
            .ok_or_else(|| Fail::new(Errno::EIO, format!("object {ino}.{index} could not be created")))?;
        f.write_all_at(data, offset).map_err(|e| Fail::io(format_args!("write object {ino}.{index}"), &e))?;
        self.mark_dirty(ino, index);
        start_writeback(&f, offset, end);
        Ok(())
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
    /// it reads as zeros anyway).
    pub fn truncate(&self, ino: Ino, index: u32, len: u64) -> R<()> {
        let Some(f) = self.fd(ino, index, false)? else { return Ok(()) };
        let cur = f.metadata().map_err(|e| Fail::io(format_args!("stat object {ino}.{index}"), &e))?.len();
        if cur > len {
            f.set_len(len).map_err(|e| Fail::io(format_args!("truncate object {ino}.{index}"), &e))?;
            self.mark_dirty(ino, index);
        }
        Ok(())
    }

    /// Delete the given objects (file, object index) held here; missing ones are fine
    /// (idempotent). Open descriptors and pending syncs of those files are dropped.
    pub fn delete_objects(&self, objects: &[(Ino, u32)]) -> R<()> {
        let files: HashSet<u64> = objects.iter().map(|(ino, _)| ino.0).collect();
        self.fds.lock().map.retain(|(i, _), _| !files.contains(i));
        self.dirty.lock().retain(|i, _| !files.contains(i));
        let mut result = Ok(());
        for &(ino, index) in objects {
            let p = self.path(ino, index);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => {
                    result = Err(Fail::io(format_args!("delete object {}", p.display()), &e));
                    break;
                }
            }
        }
        // A read may have opened (and cached) an object between the purge above and its
        // removal: that descriptor would serve the deleted bytes for as long as it is cached.
        self.fds.lock().map.retain(|(i, _), _| !files.contains(i));
        result
    }

    /// `fdatasync` (or `fsync` when `!data_only`) every object of `ino` written since its last sync.
    pub fn sync(&self, ino: Ino, data_only: bool) -> R<()> {
        let Some(indices) = self.dirty.lock().remove(&ino.0) else { return Ok(()) };
        for (n, &index) in indices.iter().enumerate() {
            let res = match self.fd(ino, index, false) {
                Ok(Some(f)) => if data_only { f.sync_data() } else { f.sync_all() }
                    .map_err(|e| Fail::io(format_args!("sync object {ino}.{index}"), &e)),
                Ok(None) => Ok(()),
                Err(e) => Err(e),
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

    /// Number of object files (an O(n) directory walk: for status reports).
    pub fn count(&self) -> u64 {
        (0..256)
            .filter_map(|b| std::fs::read_dir(self.root.join(format!("{b:02x}"))).ok())
            .map(|rd| rd.count() as u64)
            .sum()
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

/// Bytes of an object file to send as the data of a reply (see [`DataStore::region`]).
pub struct Region {
    pub file: Arc<File>,
    pub offset: u64,
    pub len: usize,
}

/// How long a blocked send may make no progress before the connection is given up.
const SEND_STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// Wait until `fd` takes more bytes (it is non-blocking), for at most [`SEND_STALL`].
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

fn wait_writable(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    let start = std::time::Instant::now();
    loop {
        let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, 1000) };
        if r > 0 {
            if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 && p.revents & libc::POLLOUT == 0 {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            return Ok(());
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e);
            }
        }
        if start.elapsed() > SEND_STALL {
            return Err(ErrorKind::TimedOut.into());
        }
    }
}

/// Run `call`, a system call on the non-blocking socket `fd` that returns a count or -1,
/// until it succeeds: wait in `poll` while the socket is full, retry when interrupted.
fn on_nonblocking(fd: std::os::fd::RawFd, mut call: impl FnMut() -> isize) -> std::io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            ErrorKind::WouldBlock => wait_writable(fd)?,
            ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}

/// Write all of `buf` to the non-blocking socket `fd`.
fn write_all_fd(fd: std::os::fd::RawFd, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: writing from a valid slice to a descriptor we hold.
        let n = on_nonblocking(fd, || unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) })?;
        buf = &buf[n..];
    }
    Ok(())
}

/// Send `head` and then the `region` of an object file over the non-blocking socket
/// `sock` (blocks: run it off the async threads). The file's pages go to the socket
/// without being copied through this process (`sendfile`). If the file got shorter since
/// [`DataStore::region`] measured it, the missing bytes are sent as zeros, so the frame
/// keeps the length its header announced.
pub fn send_region(sock: std::os::fd::BorrowedFd<'_>, head: &[u8], region: &Region) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    write_all_fd(fd, head)?;
    let mut off = region.offset as libc::off_t;
    let mut left = region.len;
    while left > 0 {
        // SAFETY: both descriptors are valid for the call; `off` is ours.
        let n = on_nonblocking(fd, || unsafe { libc::sendfile(fd, region.file.as_raw_fd(), &mut off, left) })?;
        if n == 0 {
            // The file ends early: zeros for the rest.
            static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
            while left > 0 {
                let k = left.min(ZEROS.len());
                write_all_fd(fd, &ZEROS[..k])?;
                left -= k;
            }
            break;
        }
        left -= n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_read_write_truncate_delete() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        let ino = Ino(0xabcd_0012);
        assert!(d.read(ino, 0, 0, 10).unwrap().is_empty());
        d.write(ino, 1, 5, b"hello").unwrap();
        assert!(d.path(ino, 1).ends_with("12/00000000abcd0012.1"));
        assert_eq!(d.read(ino, 1, 0, 100).unwrap(), b"\0\0\0\0\0hello");
        // beyond 4 GiB, sparse
        d.write(ino, 1, 5 << 30, b"far").unwrap();
        assert_eq!(d.read(ino, 1, (5 << 30) - 1, 10).unwrap(), b"\0far");
        d.sync(ino, true).unwrap();
        d.truncate(ino, 1, 7).unwrap();
        assert_eq!(d.read(ino, 1, 0, 100).unwrap(), b"\0\0\0\0\0he");
        d.truncate(ino, 3, 0).unwrap(); // missing: fine
        assert_eq!(d.count(), 1);
        d.delete_objects(&[(ino, 0), (ino, 1), (ino, 2)]).unwrap();
        assert!(d.read(ino, 1, 0, 100).unwrap().is_empty());
        assert_eq!(d.count(), 0);
        d.delete_objects(&[(ino, 1)]).unwrap();
    }

    #[test]
    fn regions_are_sent_from_the_file_and_padded_if_it_shrank() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        let ino = Ino(0x77);
        assert!(d.region(ino, 0, 0, 10).unwrap().is_none(), "missing object");
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        d.write(ino, 0, 0, &body).unwrap();
        assert!(d.region(ino, 0, 200_000, 10).unwrap().is_none(), "beyond the end");
        let r = d.region(ino, 0, 1000, 1 << 20).unwrap().unwrap();
        assert_eq!((r.offset, r.len), (1000, 199_000));
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        // The receiver takes exactly `n` bytes when asked: sent pages are shared with the
        // file until then (a truncation would zero them in the socket buffer too).
        let (ask, asked) = std::sync::mpsc::channel::<usize>();
        let (give, given) = std::sync::mpsc::channel::<Vec<u8>>();
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut b = b;
            for n in asked {
                let mut got = vec![0u8; n];
                b.read_exact(&mut got).unwrap();
                give.send(got).unwrap();
            }
        });
        use std::os::fd::AsFd;
        ask.send(4 + 199_000).unwrap();
        send_region(a.as_fd(), b"HEAD", &r).unwrap();
        let got = given.recv().unwrap();
        assert_eq!(&got[..4], b"HEAD");
        assert!(got[4..] == body[1000..]);
        // The object shrinks under a measured region: the rest is zeros.
        let r2 = d.region(ino, 0, 0, 300).unwrap().unwrap();
        d.truncate(ino, 0, 100).unwrap();
        ask.send(300).unwrap();
        send_region(a.as_fd(), b"", &r2).unwrap();
        let tail = given.recv().unwrap();
        assert!(tail[..100] == body[..100]);
        assert!(tail[100..].iter().all(|&b| b == 0));
        drop(ask);
        reader.join().unwrap();
    }

    #[test]
    fn cache_eviction_keeps_working() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path()).unwrap();
        for i in 0..(FD_CACHE as u64 + 300) {
            d.write(Ino(i + 2), 0, 0, &i.to_le_bytes()).unwrap();
        }
        for i in 0..(FD_CACHE as u64 + 300) {
            assert_eq!(d.read(Ino(i + 2), 0, 0, 8).unwrap(), i.to_le_bytes());
        }
        assert!(d.fds.lock().map.len() <= FD_CACHE);
    }
}
