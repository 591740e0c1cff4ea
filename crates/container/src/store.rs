//! The physical files of a container, on Shoal (the native client) or in any POSIX
//! directory (a local disk, a FUSE mount, another parallel file system).
//!
//! Tasks of one process share one open handle per physical file ([`Opened`]): opening is a
//! metadata request, and a container of 100,000 tasks in a few processes must cost a few
//! opens, not 100,000. Handles take concurrent reads and writes of disjoint ranges.

use crate::error::{Error, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use shoal_client::{Client, LayoutSpec, OpenFlags};
use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::{Arc, Weak};

/// Where a container's physical files live.
#[derive(Clone)]
pub enum Target {
    /// A POSIX directory: paths are the host's.
    Posix,
    /// Shoal: paths are Shoal paths, reached through this client.
    Shoal(Client),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Posix => f.write_str("posix"),
            // A cluster is named by its first server's address.
            Target::Shoal(c) => write!(f, "shoal@{}", c.map().servers.first().map_or("", |s| s.addr.as_str())),
        }
    }
}

/// How a new physical file is placed on Shoal.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    /// This file's number and how many the container has: with several, file `f` lives on
    /// one server, `f` modulo the servers (each physical file's metadata and data on its
    /// own server), else it is striped over all servers.
    pub file_number: u32,
    pub nfiles: u32,
    /// Stripe size asked for (0: the directory's default).
    pub stripe_size: u64,
}

/// One open physical file.
///
/// The client's futures are boxed: every task of a container holds one of these calls in
/// its own future, and 100,000 tasks carrying the client's largest future inline cost
/// hundreds of megabytes (measured: 5.3 KB per task before, most of the open's time spent
/// zeroing fresh pages).
pub enum PhysFile {
    Posix { path: String, file: std::fs::File },
    Shoal { path: String, file: shoal_client::File },
}

impl PhysFile {
    /// Create (or truncate) `path` for writing and reading.
    pub async fn create(target: &Target, path: &str, place: Placement) -> Result<PhysFile> {
        match target {
            Target::Posix => {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
                    .map_err(|e| Error::io(path, e))?;
                Ok(PhysFile::Posix { path: path.to_string(), file })
            }
            Target::Shoal(client) => {
                let servers = client.map().servers.len() as u32;
                let mut spec = LayoutSpec {
                    stripe_size: (place.stripe_size != 0).then_some(place.stripe_size),
                    ..LayoutSpec::default()
                };
                if place.nfiles > 1 && servers > 0 {
                    spec.stripe_count = Some(1);
                    spec.first_server =
                        Some(shoal_client::ServerId(client.map().servers[(place.file_number % servers) as usize].id));
                } else {
                    spec.stripe_count = Some(u32::MAX);
                }
                let flags = OpenFlags {
                    read: true,
                    write: true,
                    create: true,
                    truncate: true,
                    perm: 0o644,
                    layout: Some(spec),
                    ..Default::default()
                };
                let file = Box::pin(client.open(path, flags)).await.map_err(|e| Error::shoal(path, e))?;
                Ok(PhysFile::Shoal { path: path.to_string(), file })
            }
        }
    }

    /// Open `path`: for reading, or also for writing.
    pub async fn open(target: &Target, path: &str, write: bool) -> Result<PhysFile> {
        match target {
            Target::Posix => {
                let file =
                    std::fs::OpenOptions::new().read(true).write(write).open(path).map_err(|e| Error::io(path, e))?;
                Ok(PhysFile::Posix { path: path.to_string(), file })
            }
            Target::Shoal(client) => {
                let flags = if write { OpenFlags::read_write() } else { OpenFlags::read_only() };
                let file = Box::pin(client.open(path, flags)).await.map_err(|e| Error::shoal(path, e))?;
                // The handle is shared by the tasks of this process, each reading its own
                // chunks: readahead would mistake their reads for one stream (measured:
                // 4 MiB per task read at half the rate of files with it on).
                file.set_readahead(false);
                Ok(PhysFile::Shoal { path: path.to_string(), file })
            }
        }
    }

    pub fn path(&self) -> &str {
        match self {
            PhysFile::Posix { path, .. } | PhysFile::Shoal { path, .. } => path,
        }
    }

    /// The block size chunks are aligned to: the stripe size on Shoal, the file system's
    /// preferred I/O size (`st_blksize`) elsewhere.
    pub fn fs_block(&self) -> Result<u64> {
        match self {
            PhysFile::Posix { path, file } => Ok(file.metadata().map_err(|e| Error::io(path, e))?.blksize().max(512)),
            PhysFile::Shoal { file, .. } => Ok(file.layout().stripe_size),
        }
    }

    /// Servers the file is striped over (1 outside Shoal).
    pub fn stripe_count(&self) -> u64 {
        match self {
            PhysFile::Posix { .. } => 1,
            PhysFile::Shoal { file, .. } => file.layout().servers.len().max(1) as u64,
        }
    }

    pub async fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        match self {
            PhysFile::Posix { path, file } => {
                blocking_io(data.len(), || file.write_all_at(data, offset)).map_err(|e| Error::io(path, e))
            }
            PhysFile::Shoal { path, file } => {
                Box::pin(file.write_bytes_at(offset, Bytes::copy_from_slice(data)))
                    .await
                    .map_err(|e| Error::shoal(path, e))?;
                Ok(())
            }
        }
    }

    /// Up to `len` bytes at `offset`: fewer only at the end of the file (holes read as zeros).
    pub async fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        match self {
            PhysFile::Posix { .. } => {
                let mut buf = vec![0; len];
                let got = self.read_into(offset, &mut buf).await?;
                buf.truncate(got);
                Ok(buf)
            }
            PhysFile::Shoal { path, file } => {
                let mut out = Vec::with_capacity(len);
                while out.len() < len {
                    let b = Box::pin(file.read_at(offset + out.len() as u64, len - out.len()))
                        .await
                        .map_err(|e| Error::shoal(path, e))?;
                    if b.is_empty() {
                        break;
                    }
                    out.extend_from_slice(&b);
                }
                Ok(out)
            }
        }
    }

    /// Fill `buf` from `offset`; returns the bytes read (fewer only at the end of the file).
    /// On Shoal the client's buffers are copied straight into `buf`, once.
    pub async fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        match self {
            PhysFile::Shoal { path, file } => {
                let mut got = 0;
                while got < buf.len() {
                    let b = Box::pin(file.read_at(offset + got as u64, buf.len() - got))
                        .await
                        .map_err(|e| Error::shoal(path, e))?;
                    if b.is_empty() {
                        break;
                    }
                    buf[got..got + b.len()].copy_from_slice(&b);
                    got += b.len();
                }
                Ok(got)
            }
            PhysFile::Posix { path, file } => blocking_io(buf.len(), || {
                let mut got = 0;
                while got < buf.len() {
                    match file.read_at(&mut buf[got..], offset + got as u64) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(got)
            })
            .map_err(|e| Error::io(path, e)),
        }
    }

    /// Its size now.
    pub async fn len(&self) -> Result<u64> {
        match self {
            PhysFile::Posix { path, file } => Ok(file.metadata().map_err(|e| Error::io(path, e))?.len()),
            PhysFile::Shoal { path, file } => Ok(Box::pin(file.stat()).await.map_err(|e| Error::shoal(path, e))?.size),
        }
    }

    /// Wait until this handle's writes have reached the file system (written behind on
    /// Shoal), without asking for durability.
    pub async fn drain(&self) -> Result<()> {
        match self {
            PhysFile::Posix { .. } => Ok(()),
            PhysFile::Shoal { path, file } => Box::pin(file.drain()).await.map_err(|e| Error::shoal(path, e)),
        }
    }

    /// Make what was written durable.
    pub async fn sync(&self) -> Result<()> {
        match self {
            PhysFile::Posix { path, file } => {
                blocking_io(usize::MAX, || file.sync_all()).map_err(|e| Error::io(path, e))
            }
            PhysFile::Shoal { path, file } => Box::pin(file.fsync()).await.map_err(|e| Error::shoal(path, e)),
        }
    }
}

/// POSIX calls moving at least this many bytes (and fsync) tell the runtime that they
/// block (`block_in_place`: its other tasks move to another thread meanwhile), so that
/// tasks' large reads and writes proceed in parallel; smaller ones just run, where the
/// hand-off would cost more than the call (100,000 tasks writing 64 bytes each).
const BLOCKING_FROM: usize = 64 << 10;

/// Run the blocking call `op`, which moves `bytes` (`usize::MAX` for fsync): see
/// [`BLOCKING_FROM`]. Outside a multi-threaded runtime it just runs.
fn blocking_io<T>(bytes: usize, op: impl FnOnce() -> T) -> T {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if bytes >= BLOCKING_FROM && multi {
        tokio::task::block_in_place(op)
    } else {
        op()
    }
}

/// The physical files open in this process, shared by its tasks (weakly: a file closes
/// when its last task lets go).
#[derive(Default)]
pub struct Opened {
    files: Mutex<HashMap<String, Weak<PhysFile>>>,
}

impl Opened {
    /// The process-wide table.
    pub fn global() -> &'static Opened {
        static OPENED: std::sync::OnceLock<Opened> = std::sync::OnceLock::new();
        OPENED.get_or_init(Opened::default)
    }

    /// The open handle on `path` (as `kind`, `write`), opening it if no task here has.
    /// Concurrent callers may both open; one handle wins, which is harmless.
    pub async fn get(&self, target: &Target, path: &str, write: bool) -> Result<Arc<PhysFile>> {
        let key = format!("{target:?}:{write}:{path}");
        if let Some(f) = self.files.lock().get(&key).and_then(Weak::upgrade) {
            return Ok(f);
        }
        let f = Arc::new(PhysFile::open(target, path, write).await?);
        let mut files = self.files.lock();
        if let Some(existing) = files.get(&key).and_then(Weak::upgrade) {
            return Ok(existing);
        }
        files.retain(|_, w| w.strong_count() > 0);
        files.insert(key, Arc::downgrade(&f));
        Ok(f)
    }

    /// Share `file` (just created by this process) under its path.
    pub fn put(&self, target: &Target, file: PhysFile) -> Arc<PhysFile> {
        let key = format!("{target:?}:true:{}", file.path());
        let f = Arc::new(file);
        self.files.lock().insert(key, Arc::downgrade(&f));
        f
    }
}
