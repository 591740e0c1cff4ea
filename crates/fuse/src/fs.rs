//! The FUSE file system: every kernel request becomes a future that makes the matching
//! Shoal client call as the requesting uid/gid and answers the kernel when it is done. It
//! starts on the thread that read the request (which answers at once what needs no server,
//! and sends what does); a future that waits for a server goes on as a task on the tokio
//! runtime, so slow requests never hold up others (see `ShoalFs::spawn`).
//!
//! **Requests per operation** (counted by the servers; `docs/mount.md` has the table):
//! a create is the kernel's lookup of the new name plus the create (the file is opened
//! from the create's reply); an unlink is the kernel's lookup (unless its entry is cached)
//! plus the unlink. The kernel's permission checks on a directory after a change made here
//! are answered from the mount's own copy of the directory's attributes (`dircache.rs`);
//! a flush with nothing to publish and the release of a file that wrote nothing cost none.
//!
//! **Open files.** All descriptors of one inode on this mount share one client
//! [`File`] (opened read-write as root; each open is checked against the caller's
//! identity first). The handle knows the size its own writes reached before that size is
//! published to the servers (at flush), so every descriptor, `stat` and mmap on this mount
//! sees the same size. The last release closes it (durable, see `sync_close`).
//!
//! **Unlinking an open file.** POSIX lets a process keep using a file after its last name
//! is gone. The client (which counts the files it has open) tells the server so in the
//! unlink or rename, and the server keeps the inode as an orphan, with no name and link
//! count 0, until the mount's last descriptor closes (see `shoal_client`'s
//! `open_files.rs`): the directory no longer holds the name, so it can be removed at once.
//!
//! **Special files.** Shoal's servers know regular files, directories and symbolic links.
//! A FIFO, socket or device node made on the mount (mknod, mkfifo, bind of a Unix socket)
//! is stored as a symbolic link whose target is `shoal:special:<kind>:<rdev>` and shown
//! to the kernel as what it stands for; its permission bits, owner and times are the
//! inode's own. The native client and `shoal ls` see the symlink.

use crate::convert::{self, errno, file_attr, raw};
use crate::dircache::DirCache;
use crate::kernel_cache::KernelCache;
use crate::one_at_a_time::OneAtATime;
use crate::options::MountOptions;
use bytes::{Bytes, BytesMut};
use fuser::{
    AccessFlags, CopyFileRangeFlags, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags as KOpenFlags, RenameFlags as KRenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use shoal_client::{Attr, Client, Cred, Error, File, FileKind, Ino, OpenFlags, RenameFlags, SetAttrs, TimeSet};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

/// Extended attribute answered by the mount itself: a file's stripe layout, a directory's
/// default layout. Read-only.
pub(crate) const LAYOUT_XATTR: &str = "shoal.layout";

/// Target prefix of the symlinks that stand for special files.
pub(crate) const SPECIAL_PREFIX: &str = "shoal:special:";

/// A special file stored as a symlink: its type and device number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Special {
    kind: FileType,
    rdev: u32,
}

/// The symlink target standing for a special file of `mode` (S_IFMT bits) and `rdev`.
pub(crate) fn special_target(mode: u32, rdev: u32) -> Option<String> {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "sock",
        libc::S_IFCHR => "chr",
        libc::S_IFBLK => "blk",
        _ => return None,
    };
    Some(format!("{SPECIAL_PREFIX}{kind}:{rdev}"))
}

pub(crate) fn parse_special(target: &str) -> Option<Special> {
    let rest = target.strip_prefix(SPECIAL_PREFIX)?;
    let (kind, rdev) = rest.split_once(':')?;
    let kind = match kind {
        "fifo" => FileType::NamedPipe,
        "sock" => FileType::Socket,
        "chr" => FileType::CharDevice,
        "blk" => FileType::BlockDevice,
        _ => return None,
    };
    Some(Special { kind, rdev: rdev.parse().ok()? })
}

/// Bound on the remembered symlink kinds (cleared when passed).
const SPECIALS_MAX: usize = 1 << 20;

/// The attribute holding file capabilities.
const CAPS_XATTR: &str = "security.capability";

/// Entries asked of a server per readdir page.
const READDIR_PAGE: u32 = 1024;

/// Bytes of zeros written at once for hole punching and zero ranges.
const ZERO_CHUNK: usize = 1 << 20;
static ZEROS: [u8; ZERO_CHUNK] = [0; ZERO_CHUNK];

/// Most bytes one copy_file_range request copies (the kernel asks again for the rest).
const COPY_MAX: u64 = 64 << 20;
const COPY_CHUNK: u64 = 4 << 20;

/// One open inode: the shared client handle and what must happen at its last close.
pub(crate) struct Node {
    file: File,
    /// Descriptors (FUSE file handles) using it; changed under `Shared::nodes`' lock.
    opens: AtomicUsize,
    /// Largest size this mount told the kernel; a read short of it refreshes the handle.
    size_hint: AtomicU64,
}

#[derive(Clone)]
struct Fh {
    node: Arc<Node>,
    /// Opened with O_APPEND: every write goes to the end of the file as the servers know
    /// it, whatever offset the kernel sends (see [`Shared::write`]).
    append: bool,
    /// Read-only descriptor of a read-mostly file on a mount in a coop group: its reads are
    /// pieces asked of the group, at the version the file was opened at.
    coop: bool,
}

/// A directory being listed: pages fetched so far, `.` and `..` first.
struct DirStream {
    ino: Ino,
    cred: Cred,
    entries: Vec<(String, u64, FileType)>,
    after: Option<String>,
    more: bool,
    parent: u64,
    /// Marked read-mostly when opened: its entries' attributes are fetched one listing at
    /// a time (`one_at_a_time.rs`).
    read_mostly: bool,
    /// Read-mostly and listed through the coop group: every entry's attributes, by name
    /// (READDIRPLUS answers from them).
    coop_attrs: HashMap<String, Attr>,
    /// READDIRPLUS: attributes fetched for entries (by index) that did not fit in the
    /// kernel's last buffer, kept for its next call (which asks for them at once).
    plus: HashMap<usize, PlusEntry>,
}

/// What READDIRPLUS tells the kernel of one entry: its attributes and how long the kernel
/// may keep the name and them, from when they were fetched.
struct PlusEntry {
    attr: fuser::FileAttr,
    ttl: Duration,
    fetched: Instant,
}

/// Entries whose attributes READDIRPLUS fetches in one batch (one request per server).
const PLUS_BATCH: usize = 128;

/// State shared by the request tasks.
/// A file's version as far as its attributes tell: size, mtime and ctime.
type Version = (u64, i64, u32, i64, u32);

pub(crate) struct Shared {
    /// The client as root (umask 0); requests are made with `with_cred` of the caller.
    pub(crate) root: Client,
    pub(crate) opts: MountOptions,
    /// What `shoal mount --metrics` serves (`metrics.rs`).
    pub(crate) metrics: Arc<crate::metrics::MountMetrics>,
    nodes: Mutex<HashMap<u64, Arc<Node>>>,
    fhs: Mutex<HashMap<u64, Fh>>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirStream>>>>,
    /// What each symlink inode seen so far stands for (a symlink's target never changes).
    specials: Mutex<HashMap<u64, Option<Special>>>,
    /// Size and mtime last given to the kernel, per inode: an open that finds them
    /// changed (another client wrote) makes the kernel drop its cached attributes.
    told: Mutex<HashMap<u64, (u64, i64, u32)>>,
    /// Read-mostly files (docs/loading.md): the size, mtime and ctime each was opened at
    /// last. The kernel's pages of the file were read since that open, so they are of that
    /// version or newer; an open that finds the same version lets the kernel keep them
    /// (`FOPEN_KEEP_CACHE`), any other open drops them, as every open of other files does.
    /// The same for read-mostly directories and the kernel's cached listing of them.
    opened_version: Mutex<HashMap<u64, Version>>,
    /// Inodes known to have no `security.capability` attribute, and since when. The kernel
    /// asks for it before every write (to drop capabilities on write); this answers from
    /// memory for `attr_timeout`, as for other attributes.
    no_caps: Mutex<HashMap<u64, std::time::Instant>>,
    /// The name each inode was last given to the kernel under: when the kernel asks for
    /// its attributes (`getattr`) after their lease ran out, they are fetched by name with
    /// the client's stat-ahead (`Client::lookup_ahead`). At most [`SPECIALS_MAX`] (then
    /// forgotten all at once).
    walked: Mutex<HashMap<u64, (u64, String)>>,
    /// Read-mostly directories being opened or listed: one fetch at a time each, so that the
    /// processes of a job starting together ask the servers once (`one_at_a_time.rs`).
    read_mostly_fetch: OneAtATime,
    /// Directory attributes, so that the kernel's permission checks after a change made
    /// through this mount cost no request (see `dircache.rs`).
    dir_attrs: DirCache,
    /// This mount's member of its coop group, if it is in one (`coop=`): read-mostly
    /// inodes' attributes, listings and pieces are asked of the group (docs/loading.md).
    pub(crate) coop: std::sync::OnceLock<shoal_coop::Coop>,
    /// Inodes seen marked read-mostly (in any attributes given to the kernel): the ones the
    /// coop group is asked about. At most [`SPECIALS_MAX`] (then forgotten all at once).
    read_mostly_seen: Mutex<std::collections::HashSet<u64>>,
    /// Read-only descriptors of read-mostly files opened through the coop group: the file's
    /// attributes at the open, no server open (its reads are pieces asked of the group).
    coop_handles: Mutex<HashMap<u64, Attr>>,
    /// Set once the session exists: lets the mount invalidate the kernel's caches.
    pub(crate) notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// How long the kernel may keep names and attributes, under leases; their invalidation
    /// when a lease is revoked (`kernel_cache.rs`).
    kernel: Arc<KernelCache>,
    next_fh: AtomicU64,
    inflight: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Counts a request task from spawn to end (also when it panics).
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Who made a request.
#[derive(Clone, Copy)]
struct Who {
    uid: u32,
    gid: u32,
    pid: u32,
}

impl Who {
    fn of(req: &Request) -> Who {
        Who { uid: req.uid(), gid: req.gid(), pid: req.pid() }
    }

    /// The caller of a request that changes a file's contents, when it must drop the
    /// file's set-ID bits (no CAP_FSETID: not root); see `Shared::drop_privs`.
    fn of_writer(req: &Request) -> Option<Who> {
        (req.uid() != 0).then(|| Who::of(req))
    }
}

type Res<T> = std::result::Result<T, fuser::Errno>;

fn e(err: Error) -> fuser::Errno {
    errno(&err)
}

/// Bytes `offset..offset + len` of file `a` (at its version) from the coop group's pieces.
/// `dir`: the directory the file was found in (see `shoal_coop::wire::Key`).
async fn coop_read(
    coop: &shoal_coop::Coop,
    a: &Attr,
    dir: Option<Ino>,
    offset: u64,
    len: u64,
) -> Result<Bytes, shoal_coop::Failure> {
    let version = shoal_coop::wire::Version::of(a);
    let end = offset.saturating_add(len).min(a.size);
    if offset >= end {
        return Ok(Bytes::new());
    }
    let (first, last) = (offset / shoal_coop::PIECE, (end - 1) / shoal_coop::PIECE);
    let pieces = futures::future::try_join_all((first..=last).map(|i| coop.piece(a.ino, version, i, dir))).await?;
    let mut out = bytes::BytesMut::with_capacity((end - offset) as usize);
    for (i, p) in (first..=last).zip(pieces) {
        let base = i * shoal_coop::PIECE;
        let from = offset.saturating_sub(base).min(p.len() as u64) as usize;
        let to = (end - base).min(p.len() as u64) as usize;
        out.extend_from_slice(&p[from..to.max(from)]);
    }
    Ok(out.freeze())
}

/// A coop group's failure as a client error (its errno, its reason).
fn coop_error(f: shoal_coop::Failure) -> Error {
    Error::new(f.errno, f.why)
}

impl Shared {
    pub(crate) fn new(root: Client, opts: MountOptions) -> Arc<Shared> {
        let dir_attrs = DirCache::new(opts.attr_timeout);
        let notifier = Arc::new(std::sync::OnceLock::new());
        let kernel = Arc::new(KernelCache::new(opts.entry_timeout, opts.attr_timeout, opts.negative_timeout));
        if !opts.dir_lease.is_zero() {
            kernel.start(&root, notifier.clone());
        }
        Arc::new(Shared {
            root,
            opts,
            metrics: Default::default(),
            nodes: Mutex::new(HashMap::new()),
            fhs: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            specials: Mutex::new(HashMap::new()),
            told: Mutex::new(HashMap::new()),
            opened_version: Mutex::new(HashMap::new()),
            no_caps: Mutex::new(HashMap::new()),
            walked: Mutex::new(HashMap::new()),
            read_mostly_fetch: OneAtATime::default(),
            coop: std::sync::OnceLock::new(),
            read_mostly_seen: Mutex::new(std::collections::HashSet::new()),
            coop_handles: Mutex::new(HashMap::new()),
            dir_attrs,
            notifier,
            kernel,
            next_fh: AtomicU64::new(1),
            inflight: AtomicUsize::new(0),
            idle: tokio::sync::Notify::new(),
        })
    }

    fn user(&self, who: Who) -> Client {
        self.root.with_cred(convert::cred(who.uid, who.gid, who.pid))
    }

    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    fn node(&self, ino: u64) -> Option<Arc<Node>> {
        self.nodes.lock().get(&ino).cloned()
    }

    fn fh(&self, fh: FileHandle) -> Res<Arc<Node>> {
        self.fhs.lock().get(&fh.0).map(|f| f.node.clone()).ok_or(raw(libc::EBADF))
    }

    /// Attributes as this mount knows them: for an open file, with the size its shared
    /// handle reached (writes not yet published).
    fn merged(&self, mut a: Attr) -> Attr {
        if let Some(n) = self.node(a.ino.0) {
            a.size = a.size.max(n.file.attr().size);
            n.size_hint.fetch_max(a.size, Ordering::Relaxed);
        }
        a
    }

    fn remember_special(&self, ino: u64, s: Option<Special>) {
        let mut m = self.specials.lock();
        if m.len() >= SPECIALS_MAX {
            m.clear();
        }
        m.insert(ino, s);
    }

    /// What a symlink inode stands for (None for a real symlink or another kind).
    async fn special_of(&self, ino: Ino, kind: FileKind) -> Option<Special> {
        if kind != FileKind::Symlink {
            return None;
        }
        if let Some(s) = self.specials.lock().get(&ino.0) {
            return *s;
        }
        let s = match self.root.readlink_at(ino).await {
            Ok(t) => parse_special(&t),
            Err(_) => return None,
        };
        self.remember_special(ino.0, s);
        s
    }

    /// The attributes the kernel gets for `a`.
    /// The coop group, when `ino` is read-mostly and this mount is in a group.
    fn coop_for(&self, ino: u64) -> Option<&shoal_coop::Coop> {
        let coop = self.coop.get()?;
        (self.root.is_read_mostly(Ino(ino)) || self.read_mostly_seen.lock().contains(&ino)).then_some(coop)
    }

    /// The coop group, for a look-up of `dir/name` outside read-mostly trees that this
    /// mount's leases do not answer: the directory's reader answers it from its own leases
    /// or the servers, exactly, so the path down to a read-mostly tree is walked once per
    /// job, not once per node (docs/loading.md). Only while the kernel checks search
    /// permission itself (`default_permissions`): the reader looks up as root.
    fn path_coop(&self, dir: u64, name: &str) -> Option<&shoal_coop::Coop> {
        let coop = self.coop.get()?;
        (self.opts.default_permissions && self.root.entry_lease_end(Ino(dir), name).is_none()).then_some(coop)
    }

    /// Remember whether `a` is marked read-mostly (see `read_mostly_seen`).
    fn note_read_mostly(&self, a: &Attr) {
        if self.coop.get().is_none() {
            return;
        }
        let mut seen = self.read_mostly_seen.lock();
        if !a.read_mostly {
            seen.remove(&a.ino.0);
            return;
        }
        if seen.len() >= SPECIALS_MAX {
            seen.clear();
        }
        seen.insert(a.ino.0);
    }

    /// `dir/name` from the coop group's listing of read-mostly directory `dir`.
    async fn coop_lookup(&self, coop: &shoal_coop::Coop, dir: u64, name: &str) -> Result<Attr, Error> {
        let listing = coop.listing(Ino(dir)).await.map_err(coop_error)?;
        for n in listing.iter() {
            self.note_read_mostly(&n.attr);
        }
        match listing.iter().find(|n| n.name == name) {
            Some(n) => Ok(n.attr.clone()),
            None => Err(Error::new(shoal_client::Errno::ENOENT, format!("lookup {name:?} in directory {dir}"))),
        }
    }

    async fn present(&self, a: Attr) -> fuser::FileAttr {
        self.note_read_mostly(&a);
        let special = self.special_of(a.ino, a.kind).await;
        let a = self.merged(a);
        if a.kind == FileKind::File {
            let mut told = self.told.lock();
            if told.len() >= SPECIALS_MAX {
                told.clear();
            }
            told.insert(a.ino.0, (a.size, a.mtime.secs, a.mtime.nsecs));
        }
        let mut f = file_attr(&a);
        if let Some(s) = special {
            f.kind = s.kind;
            f.rdev = s.rdev;
            f.size = 0;
            f.blocks = 0;
        }
        f
    }

    /// The shared handle of `ino`, opening it if this is the first descriptor. A handle
    /// that already existed is refreshed (close-to-open: the size and attributes another
    /// client published are seen by every open).
    async fn acquire(&self, ino: Ino) -> Result<Arc<Node>, Error> {
        let existing = {
            let map = self.nodes.lock();
            map.get(&ino.0).map(|n| {
                n.opens.fetch_add(1, Ordering::AcqRel);
                n.clone()
            })
        };
        if let Some(n) = existing {
            // Under an attribute lease this asks nobody (the leased attributes are exact).
            if let Err(err) = n.file.stat().await {
                self.drop_open(&n, ino).await;
                return Err(err);
            }
            return Ok(n);
        }
        // Attributes under a lease are exact: the handle is made from them without a
        // request; its capability is fetched when it first reads or writes (a file opened
        // and closed without I/O costs the servers nothing).
        let file = match self.root.leased_attr(ino) {
            Some((attr, _)) if attr.kind == FileKind::File => {
                self.root.open_with_attr(attr, OpenFlags::read_write())?
            }
            _ => self.root.open_ino(ino, OpenFlags::read_write()).await?,
        };
        let mut map = self.nodes.lock();
        if let Some(n) = map.get(&ino.0) {
            n.opens.fetch_add(1, Ordering::AcqRel);
            return Ok(n.clone());
        }
        let size = file.attr().size;
        let n = Arc::new(Node { file, opens: AtomicUsize::new(1), size_hint: AtomicU64::new(size) });
        map.insert(ino.0, n.clone());
        Ok(n)
    }

    /// The shared handle of a file this mount has just created, made from the attributes
    /// in the create reply (fresh from the server), so the open costs no request.
    fn acquire_created(&self, a: &Attr) -> Result<Arc<Node>, Error> {
        let mut map = self.nodes.lock();
        if let Some(n) = map.get(&a.ino.0) {
            n.opens.fetch_add(1, Ordering::AcqRel);
            return Ok(n.clone());
        }
        let file = self.root.open_with_attr(a.clone(), OpenFlags::read_write())?;
        let n = Arc::new(Node { file, opens: AtomicUsize::new(1), size_hint: AtomicU64::new(a.size) });
        map.insert(a.ino.0, n.clone());
        Ok(n)
    }

    /// Remember that `ino` has no `security.capability` attribute (as of now).
    fn no_caps_known(&self, ino: u64) {
        if self.opts.attr_timeout.is_zero() {
            return;
        }
        let mut m = self.no_caps.lock();
        if m.len() >= SPECIALS_MAX {
            m.clear();
        }
        m.insert(ino, std::time::Instant::now());
    }

    /// Undo one `acquire` (an open that failed after it).
    async fn drop_open(&self, node: &Arc<Node>, ino: Ino) {
        if self.release_node(node, ino) {
            if let Err(err) = self.finish_node(node.clone()).await {
                tracing::warn!("closing {ino} after a failed open: {err}");
            }
        }
    }

    /// One descriptor fewer; true at the last, when the node has left the table (the
    /// caller closes the handle).
    fn release_node(&self, node: &Arc<Node>, ino: Ino) -> bool {
        let mut map = self.nodes.lock();
        if node.opens.fetch_sub(1, Ordering::AcqRel) != 1 {
            return false;
        }
        if map.get(&ino.0).is_some_and(|n| Arc::ptr_eq(n, node)) {
            map.remove(&ino.0);
        }
        true
    }

    /// Close a node's handle (durable if it wrote and `sync_close`). The client deletes a
    /// file whose last name was removed while open when its last handle goes: within
    /// `close` when this was the last reference, else when the handle is dropped.
    async fn finish_node(&self, node: Arc<Node>) -> Result<(), Error> {
        let file = match Arc::try_unwrap(node) {
            Ok(n) => n.file,
            Err(n) => n.file.clone(),
        };
        if self.opts.sync_close {
            file.close().await
        } else {
            file.flush().await
        }
    }

    /// Close every handle still open (the kernel went away without releasing them).
    pub(crate) async fn close_all(&self) {
        let nodes: Vec<Arc<Node>> = self.nodes.lock().drain().map(|(_, n)| n).collect();
        self.fhs.lock().clear();
        for n in nodes {
            if let Err(err) = self.finish_node(n).await {
                tracing::warn!("closing a file at unmount: {err}");
            }
        }
    }

    /// Wait until no request task runs (or `limit` passes).
    pub(crate) async fn drain(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.idle.notified();
            if self.inflight.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!("{} requests still running at unmount", self.inflight.load(Ordering::Acquire));
                return;
            }
        }
    }

    /// How long the kernel may keep the attributes of `ino` (`kernel_cache.rs`).
    fn ttl_attr(&self, ino: u64) -> Duration {
        self.kernel.attr_ttl(&self.root, ino)
    }

    fn fopen_flags(&self) -> FopenFlags {
        let mut f = FopenFlags::empty();
        if self.opts.keep_cache {
            f |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        if self.opts.direct_io {
            f |= FopenFlags::FOPEN_DIRECT_IO;
        }
        f
    }

    /// Answer the kernel with the entry `parent/name` naming `a`, for as long as leases allow
    /// (`kernel_cache.rs`).
    async fn reply_entry(&self, reply: ReplyEntry, parent: u64, name: &str, a: &Attr) {
        self.walked_through(a.ino.0, parent, name);
        let f = self.present(a.clone()).await;
        let entry = self.kernel.entry_ttl(&self.root, parent, name, false);
        reply.entry_with_ttls(&self.ttl_attr(a.ino.0), &entry, &f, Generation(0));
    }

    // ---- the operations, as async functions returning results ----

    async fn getattr(&self, who: Who, ino: u64) -> Res<Attr> {
        if let Some(n) = self.node(ino) {
            let a = n.file.stat().await.map_err(e)?;
            n.size_hint.fetch_max(a.size, Ordering::Relaxed);
            return Ok(a);
        }
        // Read-mostly on a mount in a coop group: asked of the group (before the servers
        // are asked any other way).
        if let Some(coop) = self.coop_for(ino) {
            return coop.attr(Ino(ino), self.found_in(ino)).await.map_err(|f| e(coop_error(f)));
        }
        // An inode the kernel was given by name without attributes: by name, with the
        // names around it (`Client::lookup_ahead`).
        let walked = self.walked.lock().get(&ino).cloned();
        if let Some((dir, name)) = walked {
            if self.root.attr_lease_end(Ino(ino)).is_none() {
                if let Ok(a) = self.user(who).lookup_ahead(Ino(dir), &name).await {
                    if a.ino.0 == ino {
                        return Ok(a);
                    }
                }
            }
        }
        self.user(who).getattr_fresh(Ino(ino)).await.map_err(e)
    }

    /// The directory the kernel last found `ino` in, if known (`walked`): its coop
    /// questions go to that directory's reader (`shoal_coop::wire::Key`).
    fn found_in(&self, ino: u64) -> Option<Ino> {
        self.walked.lock().get(&ino).map(|(dir, _)| Ino(*dir))
    }

    /// Remember that the kernel knows `ino` as `dir/name` (see `walked`).
    fn walked_through(&self, ino: u64, dir: u64, name: &str) {
        let mut w = self.walked.lock();
        if w.len() >= SPECIALS_MAX {
            w.clear();
        }
        w.insert(ino, (dir, name.to_string()));
    }

    #[allow(clippy::too_many_arguments)]
    async fn setattr(
        &self,
        who: Who,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Res<Attr> {
        let time = |t: TimeOrNow| match t {
            TimeOrNow::Now => TimeSet::Now,
            TimeOrNow::SpecificTime(t) => TimeSet::At(convert::kernel_timestamp(t)),
        };
        let user = self.user(who);
        let ino_n = Ino(ino);
        let node = self.node(ino);
        let mut rest = SetAttrs {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size: None,
            atime: atime.map(time),
            mtime: mtime.map(time),
        };
        let mut out = None;
        if let Some(size) = size {
            match (fh.and_then(|f| self.fh(f).ok()), &node) {
                // ftruncate: the descriptor was opened for writing (the kernel checked), so
                // no permission check applies, as on a local file system.
                (Some(n), _) => {
                    n.file.set_len(size).await.map_err(e)?;
                    // The handle truncates as root: the caller's set-ID bits are dropped
                    // here (the server dropped the capabilities with the size).
                    self.drop_privs(&n, (who.uid != 0).then_some(who), false).await?;
                    // The kernel learns the new size from this reply: a read short of the
                    // old one is no sign of another client's write.
                    n.size_hint.store(size, Ordering::Relaxed);
                    out = Some(n.file.attr());
                }
                // truncate by name while the file is open here: publish what the handle
                // wrote, cut as the caller, then let the handle learn the new size.
                (None, Some(n)) => {
                    n.file.flush().await.map_err(e)?;
                    let set = SetAttrs { size: Some(size), ..Default::default() };
                    let a = user.setattr(ino_n, set).await.map_err(e)?;
                    n.file.resized(a);
                    n.size_hint.store(size, Ordering::Relaxed);
                    out = Some(n.file.attr());
                }
                (None, None) => rest.size = Some(size),
            }
        }
        if rest != SetAttrs::default() {
            if let Some(n) = &node {
                // The handle's writes (and the size they publish, which stamps the mtime)
                // land before this change, as they did before write(2) returned.
                n.file.drain().await.map_err(e)?;
            }
            let a = match user.setattr(ino_n, rest.clone()).await {
                Ok(a) => a,
                // The kernel clears set-user/group-ID bits itself on a write or truncate by
                // a user who may not chmod (ATTR_FORCE); clearing them is always allowed.
                Err(err) if err.errno.0 == libc::EPERM && self.only_clears_setid(ino_n, &rest).await => {
                    self.root.setattr(ino_n, rest).await.map_err(e)?
                }
                Err(err) => return Err(e(err)),
            };
            out = Some(a);
        }
        let a = match out {
            Some(a) => a,
            None => user.getattr_fresh(ino_n).await.map_err(e)?,
        };
        if let Some(n) = &node {
            if size.is_none() {
                // Keep the handle's idea of mode and times current.
                let _ = n.file.stat().await;
            }
        }
        Ok(self.merged(a))
    }

    async fn only_clears_setid(&self, ino: Ino, set: &SetAttrs) -> bool {
        let Some(new) = set.perm else { return false };
        if set.uid.is_some() || set.gid.is_some() || set.size.is_some() || set.atime.is_some() || set.mtime.is_some() {
            return false;
        }
        let Ok(old) = self.root.getattr_fresh(ino).await else { return false };
        let setid = libc::S_ISUID | libc::S_ISGID;
        new & !setid == old.perm & !setid && new & !old.perm == 0 && new != old.perm
    }

    async fn open(&self, who: Who, ino: u64, flags: i32) -> Res<(u64, FopenFlags)> {
        let acc = flags & libc::O_ACCMODE;
        let mut mask = 0;
        if acc != libc::O_WRONLY {
            mask |= 4;
        }
        if acc != libc::O_RDONLY {
            mask |= 2;
        }
        if flags & libc::O_TRUNC != 0 {
            mask |= 2;
        }
        let cred = convert::cred(who.uid, who.gid, who.pid);
        if let Some(fh) = self.coop_open(ino, flags, &cred, mask).await {
            return Ok(fh);
        }
        let node = self.acquire(Ino(ino)).await.map_err(e)?;
        let attr = node.file.attr();
        if !convert::may_access(&attr, &cred, mask) {
            if let Err(err) = self.root.with_cred(cred).access(Ino(ino), mask).await {
                self.drop_open(&node, Ino(ino)).await;
                return Err(e(err));
            }
        }
        node.size_hint.fetch_max(attr.size, Ordering::Relaxed);
        // Close-to-open: if another client changed the file since the kernel was told its
        // size and mtime, make the kernel fetch them again (it does not on open by itself).
        let now = (attr.size, attr.mtime.secs, attr.mtime.nsecs);
        let stale = self.told.lock().get(&ino).is_some_and(|t| *t != now);
        if stale {
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(INodeNo(ino), -1, 0);
            }
        }
        let mut ff = self.open_flags_for(&node.file, flags);
        if attr.read_mostly && self.same_version_as_last_open(&attr) && acc == libc::O_RDONLY {
            ff |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        let fh = self.new_fh();
        let coop = acc == libc::O_RDONLY && attr.read_mostly && self.coop.get().is_some();
        self.fhs.lock().insert(fh, Fh { node, append: flags & libc::O_APPEND != 0, coop });
        Ok((fh, ff))
    }

    /// A read-only open of a read-mostly file through the coop group: its attributes from
    /// the group (as they are now: close-to-open), no server open. `None`: open it as usual.
    async fn coop_open(&self, ino: u64, flags: i32, cred: &Cred, mask: u32) -> Option<(u64, FopenFlags)> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_TRUNC | libc::O_APPEND) != 0 {
            return None;
        }
        let coop = self.coop_for(ino)?;
        let a = coop.attr(Ino(ino), self.found_in(ino)).await.ok()?;
        if a.kind != FileKind::File || !a.read_mostly || !convert::may_access(&a, cred, mask) {
            return None;
        }
        let mut ff = self.fopen_flags() | FopenFlags::FOPEN_NOFLUSH;
        if self.same_version_as_last_open(&a) {
            ff |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        let fh = self.new_fh();
        self.coop_handles.lock().insert(fh, a);
        Some((fh, ff))
    }

    /// A coop descriptor (`coop_open`) made an ordinary one, with a server open, for what
    /// the group cannot serve.
    async fn coop_to_node(&self, fh: FileHandle) -> Res<()> {
        let Some(a) = self.coop_handles.lock().get(&fh.0).cloned() else { return Ok(()) };
        let node = self.acquire(a.ino).await.map_err(e)?;
        self.coop_handles.lock().remove(&fh.0);
        self.fhs.lock().insert(fh.0, Fh { node, append: false, coop: false });
        Ok(())
    }

    /// Whether read-mostly file or directory `a` is opened at the version it was last opened at (and
    /// note this version for the next open).
    fn same_version_as_last_open(&self, a: &Attr) -> bool {
        let v: Version = (a.size, a.mtime.secs, a.mtime.nsecs, a.ctime.secs, a.ctime.nsecs);
        let mut seen = self.opened_version.lock();
        if seen.len() >= SPECIALS_MAX && !seen.contains_key(&a.ino.0) {
            seen.clear();
        }
        seen.insert(a.ino.0, v) == Some(v)
    }

    /// What the kernel is told about a new descriptor of `file` opened with `flags`.
    ///
    /// The kernel sends FLUSH at every `close`; the mount uses it to publish a size that
    /// writes to servers other than the inode's left pending (close-to-open). It can be
    /// skipped (`FOPEN_NOFLUSH`) when closing the descriptor has nothing to publish:
    /// * read-only descriptors (the kernel keeps the locks and drops them itself);
    /// * write-only descriptors of a file whose data all lives on the inode's server
    ///   (the default layout): every write carries the new size to the inode there, and a
    ///   write-only descriptor cannot be mapped, so there are no pages of its own to write
    ///   back. (Read-write descriptors keep FLUSH: their shared mappings are written back
    ///   at close.) With the write-back cache the kernel ignores the flag and flushes.
    ///   Not with the client's write-behind either: its writes may still be in flight,
    ///   and FLUSH is where close(2) waits for them and learns of a failure.
    fn open_flags_for(&self, file: &File, flags: i32) -> FopenFlags {
        let mut ff = self.fopen_flags();
        let skip = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => true,
            libc::O_WRONLY if file.writes_behind() => false,
            libc::O_WRONLY => {
                let home = self.root.home_of(file.ino());
                file.layout().servers.iter().all(|s| *s == home)
            }
            _ => false,
        };
        if skip {
            ff |= FopenFlags::FOPEN_NOFLUSH;
        }
        // O_APPEND: the kernel would place the data in its page cache at the end of the
        // file as this mount knows it, which is not where the servers put it when other
        // clients append too; without the cache, every write goes straight to the mount,
        // which appends it at the servers (and nothing stale is cached at the wrong place).
        if flags & libc::O_APPEND != 0 {
            ff |= FopenFlags::FOPEN_DIRECT_IO;
        }
        // Write-only descriptors bypass the page cache too, unless the kernel's write-back
        // cache was asked for. Through the cache the kernel cuts every write that starts
        // inside a page in two: the partial first page goes alone (it may not keep a page
        // locked that it has not read), the rest in a second request. That doubles the
        // requests of unaligned writes, e.g. IOR's 47,008-byte transfers (2.03 server writes
        // each, docs/benchmarks.md). Direct, each write is one request of any alignment, up
        // to `max_write`. The cache gives a write-only descriptor nothing: it cannot be mapped
        // or read, and without the write-back cache every write goes through at once anyway.
        // Other descriptors of the file on this mount keep their cached pages until they
        // reopen it (close-to-open, as between clients: docs/mount.md).
        if flags & libc::O_ACCMODE == libc::O_WRONLY && !self.opts.writeback_cache {
            ff |= FopenFlags::FOPEN_DIRECT_IO;
        }
        ff
    }

    async fn create(&self, who: Who, parent: u64, name: String, mode: u32, flags: i32) -> Res<(Attr, u64, FopenFlags)> {
        let user = self.user(who);
        match user.create_at(Ino(parent), &name, mode & 0o7777, true, None).await {
            Ok(a) => {
                self.dir_attrs.changed(parent, 0);
                // A new file has no extended attributes: the kernel's capability check
                // before each write is answered from memory.
                self.no_caps_known(a.ino.0);
                // A new file opens whatever its mode (open(2) with O_CREAT).
                let node = self.acquire_created(&a).map_err(e)?;
                let ff = self.open_flags_for(&node.file, flags);
                let fh = self.new_fh();
                self.fhs.lock().insert(fh, Fh { node, append: flags & libc::O_APPEND != 0, coop: false });
                Ok((a, fh, ff))
            }
            Err(err) if err.errno.0 == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                // Made by someone else since the kernel looked: open it like any file.
                let a = user.lookup(Ino(parent), &name).await.map_err(e)?;
                match a.kind {
                    FileKind::File => {}
                    FileKind::Dir => return Err(raw(libc::EISDIR)),
                    FileKind::Symlink => return Err(raw(libc::EEXIST)),
                }
                let (fh, ff) = self.open(who, a.ino.0, flags).await?;
                if flags & libc::O_TRUNC != 0 {
                    if let Ok(n) = self.fh(FileHandle(fh)) {
                        n.file.set_len(0).await.map_err(e)?;
                        self.drop_privs(&n, (who.uid != 0).then_some(who), false).await?;
                    }
                }
                let a = self.getattr(who, a.ino.0).await?;
                Ok((a, fh, ff))
            }
            Err(err) => Err(e(err)),
        }
    }

    async fn read(&self, fh: FileHandle, offset: u64, size: u32) -> Res<Bytes> {
        let coop_handle = self.coop_handles.lock().get(&fh.0).cloned();
        if let (Some(a), Some(coop)) = (coop_handle, self.coop.get()) {
            if let Ok(data) = coop_read(coop, &a, self.found_in(a.ino.0), offset, size as u64).await {
                self.metrics.read(data.len());
                return Ok(data);
            }
            // The group cannot serve it (the file changed, members gone): the servers.
            self.coop_to_node(fh).await?;
        }
        let by_coop = self.fhs.lock().get(&fh.0).is_some_and(|f| f.coop);
        let n = self.fh(fh)?;
        if let (true, Some(coop)) = (by_coop, self.coop.get()) {
            // Any failure of the group (the file changed, a member gone): the servers.
            if let Ok(data) =
                coop_read(coop, &n.file.attr(), self.found_in(n.file.attr().ino.0), offset, size as u64).await
            {
                self.metrics.read(data.len());
                return Ok(data);
            }
        }
        let want = size as usize;
        let data = n.file.read_at(offset, want).await.map_err(e)?;
        if data.len() < want && n.size_hint.load(Ordering::Relaxed) > n.file.attr().size {
            // The kernel was told of a larger size (another client wrote): refresh and retry.
            n.file.stat().await.map_err(e)?;
            let data = n.file.read_at(offset, want).await.map_err(e)?;
            self.metrics.read(data.len());
            return Ok(data);
        }
        self.metrics.read(data.len());
        Ok(data)
    }

    /// A write. On a descriptor opened with O_APPEND (or with `append`: the kernel says the
    /// descriptor has it now) the kernel's `offset` is its own idea of the size, stale as
    /// soon as another client appends: it is ignored, and the inode's home server places
    /// the data at the end in one atomic step (`File::append_bytes`). Each request is one
    /// atomic append, so a write(2) of up to `max_write` bytes is (the kernel splits larger
    /// ones). Writes of pages from the page cache (`from_cache`: mmap, write-back cache)
    /// are positional whatever descriptor the kernel picked to send them. `more`: the
    /// kernel's next request continues this one (`File::write_bytes_at_then_more`).
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        fh: FileHandle,
        offset: u64,
        data: Bytes,
        append: bool,
        from_cache: bool,
        more: bool,
        kill: Option<Who>,
    ) -> Res<u32> {
        let f = self.fhs.lock().get(&fh.0).cloned().ok_or(raw(libc::EBADF))?;
        let n = f.node;
        self.drop_privs(&n, kill, true).await?;
        let len = data.len() as u64;
        let at = if (f.append || append) && !from_cache {
            n.file.append_bytes(data).await.map_err(e)?
        } else if more {
            n.file.write_bytes_at_then_more(offset, data).await.map_err(e)?;
            offset
        } else {
            n.file.write_bytes_at(offset, data).await.map_err(e)?;
            offset
        };
        n.size_hint.fetch_max(at + len, Ordering::Relaxed);
        self.metrics.written(len as usize);
        Ok(len as u32)
    }

    /// Drop a file's privileges before its contents change, as Linux does for local files
    /// (`file_remove_privs`): set-user-ID, and set-group-ID when the group may execute or
    /// the writer is not in the file's group, for a writer without CAP_FSETID (`kill`,
    /// in Shoal's model a non-root caller); `security.capability` whoever writes (`caps`).
    ///
    /// Why here and not in the kernel: with FUSE_HANDLE_KILLPRIV_V2 the kernel leaves this
    /// to the file system, and in exchange stops asking for `security.capability` before
    /// every write — a third of the FUSE requests of a 47,008-byte write (docs/benchmarks.md).
    /// Why here and not on the inode's server: writes go to the data servers, which know
    /// nothing of modes or attributes; size changes (truncate) are handled on the inode's
    /// server, under its lock, in the same batch as the size. For writes, the mount decides
    /// from what it knows, so that the common write costs no request: the mode its handle
    /// last saw (refreshed at open, stat and setattr — the kernel itself decided from its
    /// cached mode) and the `no_caps` record, trusted for `attr_timeout` as before. Only a
    /// file with set-ID bits, or one whose capabilities are not known to be absent, costs
    /// a request; after a change the kernel is told to forget the attributes it cached.
    async fn drop_privs(&self, n: &Node, kill: Option<Who>, caps: bool) -> Res<()> {
        let ino = n.file.ino();
        let a = n.file.attr();
        if a.kind != FileKind::File {
            return Ok(());
        }
        let mut changed = false;
        if let Some(who) = kill.filter(|w| w.uid != 0 && a.perm & (libc::S_ISUID | libc::S_ISGID) != 0) {
            let mut perm = a.perm & !libc::S_ISUID;
            if perm & libc::S_IXGRP != 0 || !convert::cred(who.uid, who.gid, who.pid).in_group(a.gid) {
                perm &= !libc::S_ISGID;
            }
            if perm != a.perm {
                let set = SetAttrs { perm: Some(perm), ..Default::default() };
                self.root.setattr(ino, set).await.map_err(e)?;
                n.file.stat().await.map_err(e)?;
                changed = true;
            }
        }
        let known = self.no_caps.lock().get(&ino.0).is_some_and(|t| t.elapsed() < self.opts.attr_timeout);
        if caps && !known {
            match self.root.getxattr(ino, CAPS_XATTR).await {
                Ok(_) => {
                    self.xattr_changed(ino.0);
                    match self.root.removexattr(ino, CAPS_XATTR).await {
                        Err(err) if err.errno.0 != libc::ENODATA => return Err(e(err)),
                        _ => changed = true,
                    }
                }
                Err(err) if err.errno.0 == libc::ENODATA => {}
                Err(err) => return Err(e(err)),
            }
            self.no_caps_known(ino.0);
        }
        if changed {
            if let Some(notifier) = self.notifier.get() {
                let _ = notifier.inval_inode(INodeNo(ino.0), -1, 0);
            }
        }
        Ok(())
    }

    async fn fallocate(&self, kill: Option<Who>, fh: FileHandle, offset: u64, length: u64, mode: i32) -> Res<()> {
        let n = self.fh(fh)?;
        self.drop_privs(&n, kill, true).await?;
        let end = offset.checked_add(length).ok_or(raw(libc::EFBIG))?;
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let rest = mode & !libc::FALLOC_FL_KEEP_SIZE;
        let size = n.file.stat().await.map_err(e)?.size;
        match rest {
            // Reserve: Shoal does not reserve space, it only makes the size cover the range.
            0 => {
                if !keep && end > size {
                    n.file.set_len(end).await.map_err(e)?;
                }
            }
            libc::FALLOC_FL_PUNCH_HOLE if keep => {
                self.write_zeros(&n.file, offset, end.min(size)).await?;
            }
            libc::FALLOC_FL_ZERO_RANGE => {
                self.write_zeros(&n.file, offset, if keep { end.min(size) } else { end.min(size.max(offset)) }).await?;
                if !keep && end > size {
                    n.file.set_len(end).await.map_err(e)?;
                }
            }
            _ => return Err(raw(libc::EOPNOTSUPP)),
        }
        n.size_hint.fetch_max(n.file.attr().size, Ordering::Relaxed);
        Ok(())
    }

    async fn write_zeros(&self, file: &File, from: u64, to: u64) -> Res<()> {
        let mut at = from;
        while at < to {
            let len = ((to - at) as usize).min(ZERO_CHUNK);
            file.write_bytes_at(at, Bytes::from_static(&ZEROS[..len])).await.map_err(e)?;
            at += len as u64;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn copy_range(
        &self,
        kill: Option<Who>,
        fh_in: FileHandle,
        off_in: u64,
        fh_out: FileHandle,
        off_out: u64,
        len: u64,
    ) -> Res<u32> {
        // A source opened through the coop group is read from the servers here.
        self.coop_to_node(fh_in).await?;
        let src = self.fh(fh_in)?;
        let dst = self.fh(fh_out)?;
        self.drop_privs(&dst, kill, true).await?;
        let total = len.min(COPY_MAX);
        let mut done = 0u64;
        while done < total {
            let want = (total - done).min(COPY_CHUNK) as usize;
            let data = src.file.read_at(off_in + done, want).await.map_err(e)?;
            if data.is_empty() {
                break;
            }
            let got = data.len() as u64;
            dst.file.write_bytes_at(off_out + done, data).await.map_err(e)?;
            done += got;
            if (got as usize) < want {
                break;
            }
        }
        dst.size_hint.fetch_max(off_out + done, Ordering::Relaxed);
        Ok(done as u32)
    }

    /// Open directory `ino` for listing: the handle, and what the kernel may cache. A
    /// read-mostly directory's listing is kept by the kernel (`FOPEN_CACHE_DIR`) from one
    /// open to the next while the directory stays at the version of its last open
    /// (`FOPEN_KEEP_CACHE`); any other version drops it, so a listing after a change made
    /// anywhere shows it (close-to-open, as for files).
    async fn opendir(&self, who: Who, ino: u64) -> Res<(u64, FopenFlags)> {
        let cred = convert::cred(who.uid, who.gid, who.pid);
        let user = self.root.with_cred(cred.clone());
        let held = match self.root.is_read_mostly(Ino(ino)) {
            true => Some(self.read_mostly_fetch.hold(ino).await),
            false => None,
        };
        let asked = Instant::now();
        let a = match self.coop_for(ino) {
            Some(coop) => coop.attr(Ino(ino), self.found_in(ino)).await.map_err(coop_error),
            None => user.getattr_fresh(Ino(ino)).await,
        }
        .map_err(e)?;
        drop(held);
        self.dir_attrs.fetched(&a, asked, None);
        if a.kind != FileKind::Dir {
            return Err(raw(libc::ENOTDIR));
        }
        if !convert::may_access(&a, &cred, 4) {
            user.access(Ino(ino), 4).await.map_err(e)?;
        }
        let fh = self.new_fh();
        let stream = DirStream {
            ino: Ino(ino),
            cred,
            entries: Vec::new(),
            after: None,
            more: true,
            parent: a.parent.map(|p| p.0).unwrap_or(ino),
            read_mostly: a.read_mostly,
            coop_attrs: HashMap::new(),
            plus: HashMap::new(),
        };
        self.dirs.lock().insert(fh, Arc::new(tokio::sync::Mutex::new(stream)));
        let mut ff = FopenFlags::empty();
        if a.read_mostly {
            ff |= FopenFlags::FOPEN_CACHE_DIR;
            if self.same_version_as_last_open(&a) {
                ff |= FopenFlags::FOPEN_KEEP_CACHE;
            }
        }
        Ok((fh, ff))
    }

    /// The listing open as `fh`.
    fn dir_stream(&self, fh: FileHandle) -> Res<Arc<tokio::sync::Mutex<DirStream>>> {
        self.dirs.lock().get(&fh.0).cloned().ok_or(raw(libc::EBADF))
    }

    /// A listing asked for from offset 0 starts afresh: a `rewinddir` sees the directory
    /// as it is now.
    fn restart_at(s: &mut DirStream, offset: u64) {
        if offset == 0 || s.entries.is_empty() {
            s.entries = vec![(".".into(), s.ino.0, FileType::Directory), ("..".into(), s.parent, FileType::Directory)];
            s.after = None;
            s.more = true;
            s.plus.clear();
            s.coop_attrs.clear();
        }
    }

    /// Make entry `idx` of `s` loaded if the directory has that many (pages fetched as the
    /// reader gets there).
    async fn load_entry(&self, client: &Client, s: &mut DirStream, idx: usize) -> Res<()> {
        // Read-mostly: one listing at a time; the next is answered from the one it cached.
        let _held = match s.read_mostly && idx >= s.entries.len() && s.more {
            true => Some(self.read_mostly_fetch.hold(s.ino.0).await),
            false => None,
        };
        // Through the coop group: the whole listing at once, with its entries' attributes.
        if let (true, true, Some(coop)) = (idx >= s.entries.len() && s.more, s.after.is_none(), self.coop_for(s.ino.0))
        {
            let listing = coop.listing(s.ino).await.map_err(|f| e(coop_error(f)))?;
            let kinds =
                futures::future::join_all(listing.iter().map(|n| self.special_of(n.attr.ino, n.attr.kind))).await;
            for (n, sp) in listing.iter().zip(kinds) {
                self.note_read_mostly(&n.attr);
                let kind = sp.map(|x| x.kind).unwrap_or_else(|| convert::kind(n.attr.kind));
                s.entries.push((n.name.clone(), n.attr.ino.0, kind));
                s.coop_attrs.insert(n.name.clone(), n.attr.clone());
            }
            s.more = false;
            return Ok(());
        }
        while idx >= s.entries.len() && s.more {
            let (page, more) = client.readdir_page(s.ino, s.after.clone(), READDIR_PAGE).await.map_err(e)?;
            s.more = more && !page.is_empty();
            if let Some(last) = page.last() {
                s.after = Some(last.name.clone());
            }
            // Symlinks may stand for special files: find out (in parallel, once per inode)
            // so that d_type is right.
            let kinds = futures::future::join_all(page.iter().map(|d| self.special_of(d.ino, d.kind))).await;
            let entries = page.into_iter().zip(kinds).map(|(d, sp)| {
                let kind = sp.map(|x| x.kind).unwrap_or_else(|| convert::kind(d.kind));
                (d.name, d.ino.0, kind)
            });
            s.entries.extend(entries);
        }
        Ok(())
    }

    async fn readdir(&self, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let stream = match self.dir_stream(fh) {
            Ok(s) => s,
            Err(err) => return reply.error(err),
        };
        let mut s = stream.lock().await;
        Self::restart_at(&mut s, offset);
        let client = self.root.with_cred(s.cred.clone());
        let mut idx = offset as usize;
        loop {
            if let Err(err) = self.load_entry(&client, &mut s, idx).await {
                return reply.error(err);
            }
            let Some((name, ino, kind)) = s.entries.get(idx) else { break };
            if reply.add(INodeNo(*ino), idx as u64 + 1, *kind, name) {
                break;
            }
            idx += 1;
        }
        reply.ok();
    }

    /// READDIRPLUS (the kernel asks for it for the first page of a listing, and for the
    /// rest when the reader also looks the names up, as `ls -l` does): the entries with
    /// their attributes, fetched a batch of [`PLUS_BATCH`] names at a time with one lookup
    /// request per server (`Client::lookup_many`) instead of one LOOKUP and one server
    /// request per name. The kernel keeps each name and its attributes for the shorter of
    /// the entry's and the attributes' lifetimes (`kernel_cache.rs`: a directory lease's
    /// rest, else `entry_timeout`/`attr_timeout`), counted from when they were fetched.
    /// An entry removed since the listing is left out; one whose attributes could not be
    /// fetched (no search permission on the directory, a server down) is listed with node
    /// id 0, which the kernel lists without caching anything for it.
    async fn readdirplus(&self, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let stream = match self.dir_stream(fh) {
            Ok(s) => s,
            Err(err) => return reply.error(err),
        };
        let mut s = stream.lock().await;
        Self::restart_at(&mut s, offset);
        let client = self.root.with_cred(s.cred.clone());
        let mut idx = offset as usize;
        loop {
            if let Err(err) = self.load_entry(&client, &mut s, idx).await {
                return reply.error(err);
            }
            if idx >= s.entries.len() {
                break;
            }
            if !s.plus.contains_key(&idx) {
                self.fetch_plus(&client, &mut s, idx).await;
            }
            let Some(p) = s.plus.remove(&idx) else {
                idx += 1; // removed since it was listed
                continue;
            };
            let ttl = p.ttl.saturating_sub(p.fetched.elapsed());
            let name = &s.entries[idx].0;
            if reply.add(p.attr.ino, idx as u64 + 1, name, &ttl, &p.attr, Generation(0)) {
                s.plus.insert(idx, p);
                break;
            }
            idx += 1;
        }
        reply.ok();
    }

    /// Fetch the attributes of the entries of `s` from `first` on (up to [`PLUS_BATCH`]
    /// of those loaded) into `s.plus`.
    async fn fetch_plus(&self, client: &Client, s: &mut DirStream, first: usize) {
        let end = (first + PLUS_BATCH).min(s.entries.len());
        let asked = Instant::now();
        // `.` and `..` are never cached by the kernel from a listing: node id 0.
        let mut names = Vec::new();
        for i in first..end {
            if i < 2 {
                s.plus.insert(i, self.plus_uncached(s.entries[i].2, asked));
            } else {
                names.push((i, s.entries[i].0.clone()));
            }
        }
        if names.is_empty() {
            return;
        }
        let just_names: Vec<String> = names.iter().map(|(_, n)| n.clone()).collect();
        // Read-mostly: one fetch at a time; the next is answered from the leases it left.
        let _held = match s.read_mostly && s.coop_attrs.is_empty() {
            true => Some(self.read_mostly_fetch.hold(s.ino.0).await),
            false => None,
        };
        let found: Vec<Result<Attr, i32>> = if !s.coop_attrs.is_empty() {
            just_names.iter().map(|n| s.coop_attrs.get(n).cloned().ok_or(libc::ENOENT)).collect()
        } else {
            match client.lookup_many(s.ino, &just_names).await {
                Ok(found) => found.into_iter().map(|r| r.map_err(|err| err.errno.0)).collect(),
                Err(err) => vec![Err(err.errno.0); names.len()],
            }
        };
        for ((i, name), r) in names.into_iter().zip(found) {
            let entry = match r {
                Ok(a) => {
                    self.dir_attrs.fetched(&a, asked, Some((s.ino.0, &name)));
                    let ttl = self.kernel.entry_ttl(&self.root, s.ino.0, &name, false).min(self.ttl_attr(a.ino.0));
                    self.walked_through(a.ino.0, s.ino.0, &name);
                    PlusEntry { attr: self.present(a).await, ttl, fetched: asked }
                }
                Err(libc::ENOENT) => continue,
                Err(_) => self.plus_uncached(s.entries[i].2, asked),
            };
            s.plus.insert(i, entry);
        }
    }

    /// A READDIRPLUS entry the kernel lists but caches nothing of (node id 0).
    fn plus_uncached(&self, kind: FileType, fetched: Instant) -> PlusEntry {
        let mut attr = file_attr(&self.root_stub());
        attr.ino = INodeNo(0);
        attr.kind = kind;
        PlusEntry { attr, ttl: Duration::ZERO, fetched }
    }

    async fn getxattr(&self, who: Who, ino: u64, name: String) -> Res<Vec<u8>> {
        if name == LAYOUT_XATTR {
            let a = self.user(who).getattr(Ino(ino)).await.map_err(e)?;
            return Ok(match (&a.kind, &a.layout) {
                (FileKind::File, Some(l)) => convert::layout_text(l),
                (FileKind::Dir, _) => convert::dir_default_text(a.dir_default.as_ref()),
                _ => return Err(raw(libc::ENODATA)),
            }
            .into_bytes());
        }
        if name.starts_with("system.posix_acl_") {
            return Err(raw(libc::ENODATA));
        }
        let caps = name == CAPS_XATTR;
        if caps {
            let fresh = self.no_caps.lock().get(&ino).is_some_and(|t| t.elapsed() < self.opts.attr_timeout);
            if fresh {
                return Err(raw(libc::ENODATA));
            }
        }
        let r = self.user(who).getxattr(Ino(ino), &name).await;
        if caps && r.as_ref().is_err_and(|err| err.errno.0 == libc::ENODATA) {
            self.no_caps_known(ino);
        }
        r.map_err(e)
    }

    fn xattr_changed(&self, ino: u64) {
        self.no_caps.lock().remove(&ino);
    }

    async fn listxattr(&self, who: Who, ino: u64) -> Res<Vec<u8>> {
        let names = self.user(who).listxattr(Ino(ino)).await.map_err(e)?;
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
        }
        Ok(out)
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, data: Res<Vec<u8>>) {
    match data {
        Err(err) => reply.error(err),
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(raw(libc::ERANGE)),
        Ok(v) => reply.data(&v),
    }
}

/// A request's future, boxed so that moving it (into a task) copies a pointer.
type Task = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// A request's future after its first poll, until something it waits for wakes it.
struct Parked {
    state: Mutex<ParkState>,
    rt: tokio::runtime::Handle,
}

enum ParkState {
    /// Being polled for the first time.
    Polling,
    /// Woken during that poll.
    Woken,
    /// Waiting; the first wake-up hands it to the runtime.
    Parked(Task),
    /// Handed to the runtime (its task's own waker is used from then on).
    Gone,
}

impl futures::task::ArcWake for Parked {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        let fut = {
            let mut st = arc_self.state.lock();
            match std::mem::replace(&mut *st, ParkState::Gone) {
                ParkState::Parked(fut) => fut,
                ParkState::Polling => {
                    *st = ParkState::Woken;
                    return;
                }
                other => {
                    *st = other;
                    return;
                }
            }
        };
        // Usually on the runtime thread that read the reply: the task runs there next.
        arc_self.rt.spawn(fut);
    }
}

/// The `fuser` file system: runs each request as a future (see `ShoalFs::spawn`).
pub(crate) struct ShoalFs {
    rt: tokio::runtime::Handle,
    sh: Arc<Shared>,
    /// Most bytes the kernel puts in one WRITE request (see [`write_request_max`]).
    write_max: u64,
}

/// Most pages in one FUSE request when the kernel does not say (Linux before 6.13, which
/// has no `max_pages_limit` setting, never allows more).
const FUSE_MAX_PAGES: u64 = 256;

/// Most bytes the kernel puts in one WRITE request: `max_write`, and at most as many pages
/// as one request may carry (the kernel's `fs.fuse.max_pages_limit`, 256 by default, caps
/// what the mount asks for).
fn write_request_max(max_write: u32) -> u64 {
    let pages = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(FUSE_MAX_PAGES);
    (max_write as u64).min(pages * 4096)
}

/// Whether a direct write of `len` bytes looks like a part of a larger `write(2)` that the
/// kernel cut, the rest following in the next request: the kernel cuts at `write_max`, and
/// a buffer that does not start on a page boundary spans one page more than its length
/// fills, so a 1 MiB write from it arrives as 1 MiB minus the buffer's offset in its first
/// page, then that offset (`fuse_get_user_pages` in Linux's `fs/fuse/file.c`; seen with
/// `malloc`ed buffers: Python's, the benchmark's `Vec`s); a 4 MiB one as that, three
/// requests of 1 MiB (each crossing a stripe boundary), then the offset.
fn cut_at_page_limit(len: u64, write_max: u64) -> bool {
    len <= write_max && len + 4096 > write_max
}

impl ShoalFs {
    pub(crate) fn new(rt: tokio::runtime::Handle, sh: Arc<Shared>) -> ShoalFs {
        let write_max = write_request_max(sh.opts.max_write);
        ShoalFs { rt, sh, write_max }
    }

    /// Run a request: its future is first polled right here, on the thread that read the
    /// request from the kernel. Most requests either finish in that poll (answered from
    /// memory: a flush with no size to publish, a cached directory's attributes) or send
    /// their request to a server in it (the client writes to the socket on this thread) and
    /// then wait for the reply. A waiting future is parked; whoever wakes it — the runtime
    /// thread that reads the server's reply — hands it to the runtime, where it goes on
    /// and answers the kernel. A request therefore costs one wake-up of a runtime thread
    /// (the reply), not three (hand-off, send, reply), and no request waits for another.
    fn spawn<F, Fut>(&self, op: &'static str, f: F)
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.sh.inflight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(self.sh.clone());
        let timed = self.sh.metrics.request(op);
        let inner = f(self.sh.clone());
        let mut fut: Task = Box::pin(async move {
            let _guard = guard;
            let _timed = timed;
            inner.await;
        });
        let parked = Arc::new(Parked { state: Mutex::new(ParkState::Polling), rt: self.rt.clone() });
        let waker = futures::task::waker(parked.clone());
        let polled = {
            // Inside the runtime's context: the client may start timers or connections.
            let _rt = self.rt.enter();
            let mut cx = Context::from_waker(&waker);
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(&mut cx)))
        };
        match polled {
            Ok(Poll::Ready(())) => {}
            Ok(Poll::Pending) => {
                let mut st = parked.state.lock();
                match std::mem::replace(&mut *st, ParkState::Gone) {
                    // Woken while being polled: it can go on at once.
                    ParkState::Woken => {
                        drop(st);
                        self.rt.spawn(fut);
                    }
                    _ => *st = ParkState::Parked(fut),
                }
            }
            // As a panicking task would: the dropped reply answers EIO.
            Err(_) => tracing::error!("a request handler panicked"),
        }
    }

    fn read_only(&self) -> bool {
        self.sh.opts.read_only
    }
}

macro_rules! name_or_reply {
    ($n:expr, $reply:ident) => {
        match convert::name($n) {
            Ok(n) => n,
            Err(err) => return $reply.error(err),
        }
    };
}

impl Filesystem for ShoalFs {
    fn init(&mut self, _req: &Request, cfg: &mut KernelConfig) -> std::io::Result<()> {
        let o = &self.sh.opts;
        if let Err(nearest) = cfg.set_max_write(o.max_write) {
            let _ = cfg.set_max_write(nearest);
        }
        if let Err(nearest) = cfg.set_max_readahead(o.max_readahead.max(4096)) {
            let _ = cfg.set_max_readahead(nearest);
        }
        let _ = cfg.set_max_background(o.max_background);
        let mut wanted =
            vec![InitFlags::FUSE_PARALLEL_DIROPS, InitFlags::FUSE_ASYNC_DIO, InitFlags::FUSE_CACHE_SYMLINKS];
        if o.readdirplus {
            // The kernel decides per listing (`_AUTO`): the first page, and the rest when
            // the reader looks names up too (`ls -l`, `find -type`), not for `ls` alone.
            wanted.push(InitFlags::FUSE_DO_READDIRPLUS);
            wanted.push(InitFlags::FUSE_READDIRPLUS_AUTO);
        }
        if o.keep_cache {
            wanted.push(InitFlags::FUSE_AUTO_INVAL_DATA);
        }
        if o.writeback_cache {
            wanted.push(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        // The mount drops set-ID bits and capabilities itself (see `Shared::drop_privs`), so
        // the kernel need not ask for `security.capability` before every write.
        wanted.push(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        for cap in wanted {
            if cfg.add_capabilities(cap).is_err() {
                tracing::info!("the kernel does not offer {cap:?}");
            }
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name_or_reply!(name, reply);
        let who = Who::of(req);
        let busy = self.sh.kernel.busy(parent.0, 0);
        self.spawn("lookup", move |sh| async move {
            let _busy = busy;
            // A name the directory lease answers, whose attribute lease ran out: the kernel
            // gets the name for the rest of the directory lease and the last leased
            // attributes with no lifetime, so it asks again (`getattr`) before it uses them
            // for a `stat` or a permission check, while an unlink or a path walk through
            // the name costs no server request.
            let leased = sh.root.leased_name(Ino(parent.0), &name);
            sh.metrics.cache("leased_names", leased.is_some());
            if let Some(Some((ino, _))) = leased {
                if sh.root.attr_lease_end(ino).is_none() {
                    if let Some(a) = sh.root.last_leased_attr(ino) {
                        let entry = sh.kernel.entry_ttl(&sh.root, parent.0, &name, false);
                        sh.walked_through(ino.0, parent.0, &name);
                        let f = sh.present(a).await;
                        return reply.entry_with_ttls(&Duration::ZERO, &entry, &f, Generation(0));
                    }
                }
            }
            let asked = Instant::now();
            let found = match (sh.coop_for(parent.0), sh.path_coop(parent.0, &name)) {
                (Some(coop), _) => sh.coop_lookup(coop, parent.0, &name).await,
                (None, Some(coop)) => coop.entry(Ino(parent.0), &name).await.map_err(coop_error),
                (None, None) => sh.user(who).lookup(Ino(parent.0), &name).await,
            };
            match found {
                Ok(a) => {
                    sh.dir_attrs.fetched(&a, asked, Some((parent.0, &name)));
                    sh.reply_entry(reply, parent.0, &name, &a).await
                }
                Err(err) if err.errno.0 == libc::ENOENT => {
                    // A negative entry (node id 0), for as long as a lease says the name is
                    // absent, else for negative_timeout; none when that is zero.
                    let ttl = sh.kernel.entry_ttl(&sh.root, parent.0, &name, true);
                    if ttl.is_zero() {
                        return reply.error(e(err));
                    }
                    let mut none = file_attr(&sh.root_stub());
                    none.ino = INodeNo(0);
                    reply.entry_with_ttls(&Duration::ZERO, &ttl, &none, Generation(0));
                }
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        // A directory's attributes are usually asked for by the kernel's permission check
        // after a change made here; answered on this thread, with what is left of their
        // lifetime (a directory is never special, never an open file: nothing to merge).
        let cached = self.sh.dir_attrs.get(ino.0);
        self.sh.metrics.cache("dir_attrs", cached.is_some());
        if let Some((a, left)) = cached {
            self.sh.metrics.answered("getattr");
            return reply.attr(&left, &file_attr(&a));
        }
        let who = Who::of(req);
        self.spawn("getattr", move |sh| async move {
            let asked = Instant::now();
            match sh.getattr(who, ino.0).await {
                Ok(a) => {
                    sh.dir_attrs.fetched(&a, asked, None);
                    reply.attr(&sh.ttl_attr(ino.0), &sh.present(a).await)
                }
                Err(err) => reply.error(err),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let who = Who::of(req);
        self.spawn("setattr", move |sh| async move {
            let r = sh.setattr(who, ino.0, mode, uid, gid, size, atime, mtime, fh).await;
            // A directory's attributes changed: the next getattr asks the server.
            sh.dir_attrs.forget(ino.0);
            match r {
                Ok(a) => reply.attr(&sh.ttl_attr(ino.0), &sh.present(a).await),
                Err(err) => reply.error(err),
            }
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let who = Who::of(req);
        self.spawn("readlink", move |sh| async move {
            match sh.user(who).readlink_at(Ino(ino.0)).await {
                Ok(t) => reply.data(t.as_bytes()),
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(name, reply);
        let who = Who::of(req);
        let busy = self.sh.kernel.busy(parent.0, 0);
        self.spawn("mknod", move |sh| async move {
            let _busy = busy;
            let user = sh.user(who);
            let dir = Ino(parent.0);
            let perm = mode & 0o7777;
            let r = match special_target(mode, rdev) {
                None if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 => {
                    let r = user.create_at(dir, &name, perm, true, None).await;
                    if r.is_ok() {
                        sh.dir_attrs.changed(parent.0, 0);
                    }
                    r
                }
                None => return reply.error(raw(libc::EINVAL)),
                Some(target) => match user.symlink_at(dir, &name, &target).await {
                    Ok(a) => {
                        sh.dir_attrs.changed(parent.0, 0);
                        sh.remember_special(a.ino.0, parse_special(&target));
                        let set = SetAttrs { perm: Some(perm), ..Default::default() };
                        match user.setattr(a.ino, set).await {
                            Ok(a) => Ok(a),
                            Err(err) => {
                                let _ = sh.root.unlink_at(dir, &name).await;
                                Err(err)
                            }
                        }
                    }
                    Err(err) => Err(err),
                },
            };
            match r {
                Ok(a) => sh.reply_entry(reply, parent.0, &name, &a).await,
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(name, reply);
        let who = Who::of(req);
        let busy = self.sh.kernel.busy(parent.0, 0);
        self.spawn("mkdir", move |sh| async move {
            let _busy = busy;
            let asked = Instant::now();
            match sh.user(who).mkdir_at(Ino(parent.0), &name, mode & 0o7777).await {
                Ok(a) => {
                    sh.dir_attrs.changed(parent.0, 1);
                    sh.dir_attrs.fetched(&a, asked, Some((parent.0, &name)));
                    sh.reply_entry(reply, parent.0, &name, &a).await
                }
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(name, reply);
        let who = Who::of(req);
        let busy = self.sh.kernel.busy(parent.0, 0);
        self.spawn("unlink", move |sh| async move {
            let _busy = busy;
            let r = sh.user(who).unlink_at(Ino(parent.0), &name).await;
            if r.is_ok() {
                sh.dir_attrs.changed(parent.0, 0);
            }
            match r {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(name, reply);
        let who = Who::of(req);
        let busy = self.sh.kernel.busy(parent.0, 0);
        self.spawn("rmdir", move |sh| async move {
            let _busy = busy;
            match sh.user(who).rmdir_at(Ino(parent.0), &name).await {
                Ok(()) => {
                    sh.dir_attrs.changed(parent.0, -1);
                    sh.dir_attrs.removed(parent.0, &name);
                    reply.ok()
                }
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(link_name, reply);
        let Some(target) = target.to_str().map(str::to_string) else { return reply.error(raw(libc::EINVAL)) };
        if target.starts_with(SPECIAL_PREFIX) {
            // Reserved for special files (see the module notes).
            return reply.error(raw(libc::EINVAL));
        }
        let who = Who::of(req);
        let busy = self.sh.kernel.busy(parent.0, 0);
        self.spawn("symlink", move |sh| async move {
            let _busy = busy;
            match sh.user(who).symlink_at(Ino(parent.0), &name, &target).await {
                Ok(a) => {
                    sh.dir_attrs.changed(parent.0, 0);
                    sh.reply_entry(reply, parent.0, &name, &a).await
                }
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: KRenameFlags,
        reply: ReplyEmpty,
    ) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(name, reply);
        let newname = name_or_reply!(newname, reply);
        if flags.contains(KRenameFlags::RENAME_WHITEOUT) {
            return reply.error(raw(libc::EINVAL));
        }
        let rf = RenameFlags {
            noreplace: flags.contains(KRenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(KRenameFlags::RENAME_EXCHANGE),
        };
        let who = Who::of(req);
        let busy = self.sh.kernel.busy(parent.0, newparent.0);
        self.spawn("rename", move |sh| async move {
            let _busy = busy;
            let (src, dst) = (Ino(parent.0), Ino(newparent.0));
            let r = sh.user(who).rename_at(src, &name, dst, &newname, rf).await;
            // Both directories changed, and a moved or replaced directory with them (link
            // counts, parent): start afresh, whatever the outcome (a failure across servers
            // may have done part of it).
            sh.dir_attrs.clear();
            match r {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(newname, reply);
        let who = Who::of(req);
        let busy = self.sh.kernel.busy(newparent.0, 0);
        self.spawn("link", move |sh| async move {
            let _busy = busy;
            match sh.user(who).link_at(Ino(ino.0), Ino(newparent.0), &name).await {
                Ok(a) => {
                    sh.dir_attrs.changed(newparent.0, 0);
                    sh.reply_entry(reply, newparent.0, &name, &a).await
                }
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: KOpenFlags, reply: ReplyOpen) {
        let flags = flags.0;
        if self.read_only() && (flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0) {
            return reply.error(raw(libc::EROFS));
        }
        let who = Who::of(req);
        self.spawn("open", move |sh| async move {
            match sh.open(who, ino.0, flags).await {
                Ok((fh, ff)) => reply.opened(FileHandle(fh), ff),
                Err(err) => reply.error(err),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: KOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn("read", move |sh| async move {
            match sh.read(fh, offset, size).await {
                Ok(d) => reply.data(&d),
                Err(err) => reply.error(err),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: KOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        // The kernel passes the descriptor's flags with each write: an O_APPEND set with
        // fcntl after the open shows here.
        let append = flags.0 & libc::O_APPEND != 0;
        let from_cache = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        // Held for the few bytes that follow (one request to the servers, not two), see
        // `cut_at_page_limit`; room for them is made now, so they are appended in place.
        let more = !from_cache && cut_at_page_limit(data.len() as u64, self.write_max);
        let data = {
            let mut buf = BytesMut::with_capacity(data.len().next_multiple_of(4096));
            buf.extend_from_slice(data);
            buf.freeze()
        };
        // Set by the kernel for a writer without CAP_FSETID (FUSE_HANDLE_KILLPRIV_V2).
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID).then(|| Who::of(req));
        self.spawn("write", move |sh| async move {
            match sh.write(fh, offset, data, append, from_cache, more, kill).await {
                Ok(n) => reply.written(n),
                Err(err) => reply.error(err),
            }
        });
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        self.spawn("flush", move |sh| async move {
            // Opened read-only through the coop group: nothing was written through it.
            if sh.coop_handles.lock().contains_key(&fh.0) {
                return reply.ok();
            }
            let r = match sh.fh(fh) {
                Ok(n) => n.file.flush().await.map_err(e),
                Err(err) => Err(err),
            };
            match r {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(err),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: KOpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if self.sh.coop_handles.lock().remove(&fh.0).is_some() {
            return reply.ok();
        }
        let Some(f) = self.sh.fhs.lock().remove(&fh.0) else { return reply.error(raw(libc::EBADF)) };
        let last = self.sh.release_node(&f.node, Ino(ino.0));
        self.spawn("release", move |sh| async move {
            let r = if last { sh.finish_node(f.node).await } else { Ok(()) };
            match r {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.spawn("fsync", move |sh| async move {
            // Opened read-only through the coop group: nothing was written through it.
            if sh.coop_handles.lock().contains_key(&fh.0) {
                return reply.ok();
            }
            let r = match sh.fh(fh) {
                Ok(n) if datasync => n.file.sync_data().await.map_err(e),
                Ok(n) => n.file.fsync().await.map_err(e),
                Err(err) => Err(err),
            };
            match r {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(err),
            }
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: KOpenFlags, reply: ReplyOpen) {
        let who = Who::of(req);
        self.spawn("opendir", move |sh| async move {
            match sh.opendir(who, ino.0).await {
                Ok((fh, ff)) => reply.opened(FileHandle(fh), ff),
                Err(err) => reply.error(err),
            }
        });
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        let busy = self.sh.kernel.busy(ino.0, 0);
        self.spawn("readdir", move |sh| async move {
            let _busy = busy;
            sh.readdir(fh, offset, reply).await
        });
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        let busy = self.sh.kernel.busy(ino.0, 0);
        self.spawn("readdirplus", move |sh| async move {
            let _busy = busy;
            sh.readdirplus(fh, offset, reply).await
        });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: KOpenFlags, reply: ReplyEmpty) {
        self.sh.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Metadata operations are durable against a server crash when they return.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn("statfs", move |sh| async move {
            match sh.root.statfs().await {
                Ok(s) => {
                    // One block size for both fields: IOR and mdtest compute the size as
                    // f_blocks × f_bsize, df as f_blocks × f_frsize, and a larger f_bsize
                    // made the first 256 times too big. (The I/O size hint for programs is
                    // st_blksize, the stripe size, from getattr.)
                    const BLOCK: u64 = 4096;
                    let blocks = s.capacity_bytes / BLOCK;
                    let bfree = s.free_bytes / BLOCK;
                    // Inodes are not a fixed resource: report one free per free 4 KiB.
                    let ffree = bfree;
                    reply.statfs(blocks, bfree, bfree, s.inodes + ffree, ffree, BLOCK as u32, 255, BLOCK as u32);
                }
                Err(err) => reply.error(e(err)),
            }
        });
    }

    /// No ioctl is implemented: ENOTTY ("not a terminal / no such control"), what a plain
    /// file gives `isatty()` (Python runs it on every open) and what callers probing for a
    /// feature expect. Overridden because fuser's default logs a warning for each call.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(raw(libc::ENOTTY));
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(name, reply);
        if name.starts_with("shoal.") {
            return reply.error(raw(libc::EPERM));
        }
        if name.starts_with("system.posix_acl_") {
            return reply.error(raw(libc::EOPNOTSUPP));
        }
        let value = value.to_vec();
        let who = Who::of(req);
        self.spawn("setxattr", move |sh| async move {
            let create = flags & libc::XATTR_CREATE != 0;
            let replace = flags & libc::XATTR_REPLACE != 0;
            sh.xattr_changed(ino.0);
            let r = sh.user(who).setxattr(Ino(ino.0), &name, &value, create, replace).await;
            sh.dir_attrs.forget(ino.0);
            match r {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name_or_reply!(name, reply);
        let who = Who::of(req);
        self.spawn("getxattr", move |sh| async move {
            let r = sh.getxattr(who, ino.0, name).await;
            xattr_reply(reply, size, r);
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let who = Who::of(req);
        self.spawn("listxattr", move |sh| async move {
            let r = sh.listxattr(who, ino.0).await;
            xattr_reply(reply, size, r);
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(name, reply);
        if name.starts_with("shoal.") {
            return reply.error(raw(libc::EPERM));
        }
        let who = Who::of(req);
        self.spawn("removexattr", move |sh| async move {
            sh.xattr_changed(ino.0);
            let r = sh.user(who).removexattr(Ino(ino.0), &name).await;
            sh.dir_attrs.forget(ino.0);
            match r {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let mask = mask.bits() as u32;
        if self.read_only() && mask & 2 != 0 {
            return reply.error(raw(libc::EROFS));
        }
        let who = Who::of(req);
        self.spawn("access", move |sh| async move {
            match sh.user(who).access(Ino(ino.0), mask).await {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(e(err)),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let name = name_or_reply!(name, reply);
        let who = Who::of(req);
        let busy = self.sh.kernel.busy(parent.0, 0);
        self.spawn("create", move |sh| async move {
            let _busy = busy;
            match sh.create(who, parent.0, name.clone(), mode, flags).await {
                Ok((a, fh, ff)) => {
                    // One lifetime for the name and the attributes: the shorter one.
                    let ttl = sh.kernel.entry_ttl(&sh.root, parent.0, &name, false).min(sh.ttl_attr(a.ino.0));
                    let f = sh.present(a).await;
                    reply.created(&ttl, &f, Generation(0), FileHandle(fh), ff)
                }
                Err(err) => reply.error(err),
            }
        });
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let kill = Who::of_writer(req);
        self.spawn("fallocate", move |sh| async move {
            match sh.fallocate(kill, fh, offset, length, mode).await {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(err),
            }
        });
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        if self.read_only() {
            return reply.error(raw(libc::EROFS));
        }
        let kill = Who::of_writer(req);
        self.spawn("copy_file_range", move |sh| async move {
            match sh.copy_range(kill, fh_in, offset_in, fh_out, offset_out, len).await {
                Ok(n) => reply.written(n),
                Err(err) => reply.error(err),
            }
        });
    }
}

impl Shared {
    /// Attributes to fill a negative entry with (only `ino = 0` matters to the kernel).
    fn root_stub(&self) -> Attr {
        Attr {
            ino: Ino(0),
            kind: FileKind::File,
            perm: 0,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 0,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
            blocks_bytes: 0,
            layout: None,
            dir_default: None,
            parent: None,
            read_mostly: false,
        }
    }
}
