//! Blocking twins of every call, for code without an async runtime (the C ABI, Python,
//! scripts). A [`BlockingClient`] owns a small multi-thread tokio runtime (2 workers) and
//! runs each call to completion on it.
//!
//! Do not call these from inside an async task: blocking on a runtime from within a
//! runtime panics (use [`Client`] there).

use crate::changes::{Change, ChangeWatch, ChangeWatchOptions};
use crate::client::{Client, StatFs};
use crate::error::{Error, Result};
use crate::file::File;
use crate::options::{ClientOptions, OpenFlags};
use crate::tuples::{TupleWatch, WatchFrom};
use bytes::Bytes;
use shoal_placement::ClusterMap;
use shoal_proto::msg::{Attr, Cred, DirEntry, Layout, LayoutSpec, RenameFlags, ServerStatus, SetAttrs, TimeSet};
use shoal_proto::tuple::{Template, Trigger, Tuple, TupleEvent};
use shoal_proto::{Errno, Ino, ServerId};
use std::collections::HashMap;
use std::io::SeekFrom;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The runtime, shut down without blocking when the last handle goes (dropping a runtime
/// inside another runtime's task would otherwise panic).
struct Rt(Option<tokio::runtime::Runtime>);

impl Rt {
    fn new() -> Result<Arc<Rt>> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shoal-client")
            .enable_all()
            .build()
            .map(|rt| Arc::new(Rt(Some(rt))))
            .map_err(|e| Error::new(Errno::from_io(&e), format!("cannot start the client runtime: {e}")))
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        match &self.0 {
            Some(rt) => rt.block_on(f),
            None => unreachable!("the runtime lives until the last handle is dropped"),
        }
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A [`Client`] with blocking methods. Cheap to clone (clones share the runtime, the
/// connections and the cache).
#[derive(Clone)]
pub struct BlockingClient {
    rt: Arc<Rt>,
    client: Client,
}

impl std::fmt::Debug for BlockingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BlockingClient").field(&self.client).finish()
    }
}

/// Generates one blocking method per line: same name and arguments as the async method
/// of [`Client`], run to completion on the client's runtime.
macro_rules! twins {
    ($( fn $name:ident(&self $(, $arg:ident : $ty:ty)* ) -> $ret:ty; )*) => {
        $(
            #[doc = concat!("Blocking twin of [`Client::", stringify!($name), "`].")]
            pub fn $name(&self $(, $arg: $ty)*) -> $ret {
                self.rt.block_on(self.client.$name($($arg),*))
            }
        )*
    };
}

impl BlockingClient {
    /// A blocking client for the cluster described by `map` (starts its runtime; no I/O).
    pub fn new(map: ClusterMap, opts: ClientOptions) -> Result<BlockingClient> {
        Ok(BlockingClient { rt: Rt::new()?, client: Client::new(map, opts) })
    }

    /// A blocking client for the cluster described by the config file at `path`.
    pub fn from_config(path: &Path, opts: ClientOptions) -> Result<BlockingClient> {
        let client = Client::from_config(path, opts)?;
        Ok(BlockingClient { rt: Rt::new()?, client })
    }

    pub(crate) fn wrap(client: Client) -> Result<BlockingClient> {
        Ok(BlockingClient { rt: Rt::new()?, client })
    }

    /// The async client inside (shares connections and cache).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The cluster map in use.
    pub fn map(&self) -> &ClusterMap {
        self.client.map()
    }

    /// The options this client was made with.
    pub fn options(&self) -> &ClientOptions {
        self.client.options()
    }

    /// The same client acting as another identity (see [`Client::with_cred`]).
    pub fn with_cred(&self, cred: Cred) -> BlockingClient {
        BlockingClient { rt: self.rt.clone(), client: self.client.with_cred(cred) }
    }

    /// Requests, bytes sent and bytes received per server (see [`Client::traffic`]).
    pub fn traffic(&self) -> HashMap<ServerId, (u64, u64, u64)> {
        self.client.traffic()
    }

    /// The home server of `ino` (see [`Client::home_of`]).
    pub fn home_of(&self, ino: Ino) -> ServerId {
        self.client.home_of(ino)
    }

    /// The partition bitmap learnt of directory `dir` (see [`Client::dir_bitmap`]).
    pub fn dir_bitmap(&self, dir: Ino) -> Vec<u64> {
        self.client.dir_bitmap(dir)
    }

    /// Forget every cached entry, attribute and symlink target.
    pub fn clear_cache(&self) {
        self.client.clear_cache()
    }

    /// Blocking twin of [`Client::open`].
    pub fn open(&self, path: &str, flags: OpenFlags) -> Result<BlockingFile> {
        let f = self.rt.block_on(self.client.open(path, flags))?;
        Ok(BlockingFile { rt: self.rt.clone(), file: f })
    }

    /// Blocking twin of [`Client::create`].
    pub fn create(&self, path: &str, perm: u32, layout: Option<LayoutSpec>) -> Result<BlockingFile> {
        let f = self.rt.block_on(self.client.create(path, perm, layout))?;
        Ok(BlockingFile { rt: self.rt.clone(), file: f })
    }

    /// Blocking twin of [`Client::open_ino`].
    pub fn open_ino(&self, ino: Ino, flags: OpenFlags) -> Result<BlockingFile> {
        let f = self.rt.block_on(self.client.open_ino(ino, flags))?;
        Ok(BlockingFile { rt: self.rt.clone(), file: f })
    }

    /// Blocking twin of [`Client::open_with_attr`] (no request is made).
    pub fn open_with_attr(&self, attr: Attr, flags: OpenFlags) -> Result<BlockingFile> {
        // Inside the runtime, so the handle can publish a pending size if dropped unclosed.
        let f = self.rt.block_on(async { self.client.open_with_attr(attr, flags) })?;
        Ok(BlockingFile { rt: self.rt.clone(), file: f })
    }

    /// Blocking twin of [`Client::tuple_watch`]: follow the events (`kinds`:
    /// `WATCH_WRITTEN`, `WATCH_TAKEN`, or both) of tuples matching `template`, from `from`.
    pub fn tuple_watch(&self, template: &Template, kinds: u8, from: WatchFrom) -> Result<BlockingTupleWatch> {
        let watch = self.rt.block_on(self.client.tuple_watch(template, kinds, from))?;
        Ok(BlockingTupleWatch { rt: self.rt.clone(), watch })
    }

    /// Blocking twin of [`Client::watch_changes`]: follow the change log under directory
    /// `path` (docs/changes.md).
    pub fn watch_changes(&self, path: &str, opts: ChangeWatchOptions) -> Result<BlockingChangeWatch> {
        let watch = self.rt.block_on(self.client.watch_changes(path, opts))?;
        Ok(BlockingChangeWatch { rt: self.rt.clone(), watch })
    }

    twins! {
        // ---- the change log (docs/changes.md) ----
        fn forget_consumer(&self, name: &str) -> Result<()>;
        // ---- metadata queries (docs/find.md) ----
        fn find(&self, path: &str, query: &crate::FindQuery, opts: crate::FindOptions) -> Result<(Vec<crate::Found>, crate::FindStats)>;
        // ---- usage per directory (docs/du.md) ----
        fn du(&self, path: &str, depth: usize) -> Result<crate::DuReport>;
        // ---- the tuple space (docs/tuples.md) ----
        fn tuple_write(&self, tuple: &Tuple) -> Result<u64>;
        fn tuple_write_then(&self, tuple: &Tuple, then: Option<&Trigger>) -> Result<u64>;
        fn tuple_read(&self, template: &Template, wait: Option<Duration>) -> Result<Option<Tuple>>;
        fn tuple_read_newest(&self, template: &Template, wait: Option<Duration>) -> Result<Option<Tuple>>;
        fn tuple_take(&self, template: &Template, wait: Option<Duration>) -> Result<Option<Tuple>>;
        // ---- inode level ----
        fn lookup(&self, dir: Ino, name: &str) -> Result<Attr>;
        fn getattr(&self, ino: Ino) -> Result<Attr>;
        fn getattr_fresh(&self, ino: Ino) -> Result<Attr>;
        fn setattr(&self, ino: Ino, set: SetAttrs) -> Result<Attr>;
        fn create_at(&self, dir: Ino, name: &str, perm: u32, exclusive: bool, layout: Option<LayoutSpec>) -> Result<Attr>;
        fn mkdir_at(&self, dir: Ino, name: &str, perm: u32) -> Result<Attr>;
        fn symlink_at(&self, dir: Ino, name: &str, target: &str) -> Result<Attr>;
        fn link_at(&self, ino: Ino, dir: Ino, name: &str) -> Result<Attr>;
        fn unlink_at(&self, dir: Ino, name: &str) -> Result<()>;
        fn rmdir_at(&self, dir: Ino, name: &str) -> Result<()>;
        fn create_many_at(&self, dir: Ino, names: &[String], perm: u32, exclusive: bool) -> Result<Vec<Result<Attr>>>;
        fn lookup_many(&self, dir: Ino, names: &[String]) -> Result<Vec<Result<Attr>>>;
        fn unlink_many_at(&self, dir: Ino, names: &[String]) -> Result<Vec<Result<()>>>;
        fn rename_at(&self, src_dir: Ino, src_name: &str, dst_dir: Ino, dst_name: &str, flags: RenameFlags) -> Result<()>;
        fn readdir_at(&self, dir: Ino) -> Result<Vec<DirEntry>>;
        fn readdir_page(&self, dir: Ino, after: Option<String>, limit: u32) -> Result<(Vec<DirEntry>, bool)>;
        fn fetch_bitmap(&self, dir: Ino) -> Result<shoal_placement::Bitmap>;
        fn readlink_at(&self, ino: Ino) -> Result<String>;
        fn access(&self, ino: Ino, mask: u32) -> Result<()>;
        fn set_dir_layout(&self, dir: Ino, spec: LayoutSpec) -> Result<()>;
        fn set_read_mostly_at(&self, ino: Ino, on: bool) -> Result<Attr>;
        fn setxattr(&self, ino: Ino, name: &str, value: &[u8], create_only: bool, replace_only: bool) -> Result<()>;
        fn getxattr(&self, ino: Ino, name: &str) -> Result<Vec<u8>>;
        fn listxattr(&self, ino: Ino) -> Result<Vec<String>>;
        fn removexattr(&self, ino: Ino, name: &str) -> Result<()>;
        // ---- path level ----
        fn resolve(&self, path: &str, follow_last: bool) -> Result<Attr>;
        fn stat(&self, path: &str) -> Result<Attr>;
        fn lstat(&self, path: &str) -> Result<Attr>;
        fn mkdir(&self, path: &str, perm: u32) -> Result<Attr>;
        fn mkdir_all(&self, path: &str, perm: u32) -> Result<Attr>;
        fn rmdir(&self, path: &str) -> Result<()>;
        fn unlink(&self, path: &str) -> Result<()>;
        fn remove_all(&self, path: &str) -> Result<u64>;
        fn rename(&self, from: &str, to: &str) -> Result<()>;
        fn readdir(&self, path: &str) -> Result<Vec<DirEntry>>;
        fn symlink(&self, target: &str, link_path: &str) -> Result<Attr>;
        fn readlink(&self, path: &str) -> Result<String>;
        fn link(&self, existing: &str, new_path: &str) -> Result<Attr>;
        fn chmod(&self, path: &str, perm: u32) -> Result<Attr>;
        fn chown(&self, path: &str, uid: Option<u32>, gid: Option<u32>) -> Result<Attr>;
        fn utimens(&self, path: &str, atime: Option<TimeSet>, mtime: Option<TimeSet>) -> Result<Attr>;
        fn truncate(&self, path: &str, size: u64) -> Result<Attr>;
        fn set_layout(&self, path: &str, spec: LayoutSpec) -> Result<()>;
        fn set_read_mostly(&self, path: &str, on: bool) -> Result<Attr>;
        // ---- cluster ----
        fn statfs(&self) -> Result<StatFs>;
        fn server_status(&self, server: ServerId) -> Result<ServerStatus>;
        fn status_all(&self) -> Vec<(ServerId, Result<ServerStatus>)>;
    }
}

impl Client {
    /// A blocking twin of this client, sharing its connections and cache, with its own
    /// runtime (2 worker threads). Connections already opened stay served by the runtime
    /// that opened them, so keep that one running. Panics only if the OS refuses the
    /// runtime's threads; use [`BlockingClient::new`] to get that as an error.
    pub fn blocking(&self) -> BlockingClient {
        match BlockingClient::wrap(self.clone()) {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        }
    }
}

/// A running watch of the tuple space with blocking methods (see [`TupleWatch`]): events
/// in order, and a cursor to resume from with nothing missed or repeated.
pub struct BlockingTupleWatch {
    rt: Arc<Rt>,
    watch: TupleWatch,
}

impl BlockingTupleWatch {
    /// Blocking twin of [`TupleWatch::next`]: the next matching event, waiting up to
    /// `wait` (`None`: until there is one; zero: look once). `Ok(None)`: none in time.
    pub fn next(&mut self, wait: Option<Duration>) -> Result<Option<TupleEvent>> {
        self.rt.block_on(self.watch.next(wait))
    }

    /// Where this watch stands (see [`TupleWatch::cursor`]): give it back as
    /// `WatchFrom::After` to go on from here.
    pub fn cursor(&self) -> u64 {
        self.watch.cursor()
    }

    /// Events the server dropped from its log before this watch read them (see
    /// [`TupleWatch::lost`]).
    pub fn lost(&self) -> u64 {
        self.watch.lost()
    }
}

impl std::fmt::Debug for BlockingTupleWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingTupleWatch").field("cursor", &self.cursor()).field("lost", &self.lost()).finish()
    }
}

/// A running watch of the change log with blocking methods (see [`ChangeWatch`]): events
/// under a directory, as paths; with a consumer name, a place kept on the servers.
pub struct BlockingChangeWatch {
    rt: Arc<Rt>,
    watch: ChangeWatch,
}

impl BlockingChangeWatch {
    /// Blocking twin of [`ChangeWatch::next`]: the next event, waiting up to `wait`
    /// (`None`: until there is one). `Ok(None)`: none in time.
    pub fn next(&mut self, wait: Option<Duration>) -> Result<Option<Change>> {
        self.rt.block_on(self.watch.next(wait))
    }

    /// Blocking twin of [`ChangeWatch::ack`]: keep on the servers that every event handed
    /// out so far is handled (a consumer's watch only; EINVAL otherwise).
    pub fn ack(&mut self) -> Result<()> {
        self.rt.block_on(self.watch.ack())
    }

    /// Per server, the last event handed out or passed over (see [`ChangeWatch::cursors`]).
    pub fn cursors(&self) -> Vec<(ServerId, u64)> {
        self.watch.cursors()
    }

    /// Events the servers dropped before this watch read them (see [`ChangeWatch::lost`]).
    pub fn lost(&self) -> u64 {
        self.watch.lost()
    }

    /// Whether events are waiting to be handed out without a request (see
    /// [`ChangeWatch::has_pending`]).
    pub fn has_pending(&self) -> bool {
        self.watch.has_pending()
    }
}

impl std::fmt::Debug for BlockingChangeWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingChangeWatch").field("cursors", &self.cursors()).field("lost", &self.lost()).finish()
    }
}

/// An open file with blocking methods (and `std::io::Read`, `Write`, `Seek`).
#[derive(Clone)]
pub struct BlockingFile {
    rt: Arc<Rt>,
    file: File,
}

/// Generates blocking methods of [`BlockingFile`] from those of [`File`].
macro_rules! file_twins {
    ($( fn $name:ident(&self $(, $arg:ident : $ty:ty)* ) -> $ret:ty; )*) => {
        $(
            #[doc = concat!("Blocking twin of [`File::", stringify!($name), "`].")]
            pub fn $name(&self $(, $arg: $ty)*) -> $ret {
                self.rt.block_on(self.file.$name($($arg),*))
            }
        )*
    };
}

impl BlockingFile {
    /// The async handle inside (shares position and size with this one).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file's inode number.
    pub fn ino(&self) -> Ino {
        self.file.ino()
    }

    /// Where the file's bytes live.
    pub fn layout(&self) -> &Layout {
        self.file.layout()
    }

    /// The attributes as known to this handle.
    pub fn attr(&self) -> Attr {
        self.file.attr()
    }

    file_twins! {
        fn read_at(&self, offset: u64, len: usize) -> Result<Bytes>;
        fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize>;
        fn write_bytes_at(&self, offset: u64, data: Bytes) -> Result<usize>;
        fn read(&self, len: usize) -> Result<Bytes>;
        fn write(&self, data: &[u8]) -> Result<usize>;
        fn append(&self, data: &[u8]) -> Result<u64>;
        fn append_bytes(&self, data: Bytes) -> Result<u64>;
        fn seek(&self, to: SeekFrom) -> Result<u64>;
        fn flush(&self) -> Result<()>;
        fn drain(&self) -> Result<()>;
        fn fsync(&self) -> Result<()>;
        fn sync_data(&self) -> Result<()>;
        fn set_len(&self, size: u64) -> Result<()>;
        fn stat(&self) -> Result<Attr>;
    }

    /// Blocking twin of [`File::close`].
    pub fn close(self) -> Result<()> {
        self.rt.block_on(self.file.close())
    }
}

impl std::io::Read for BlockingFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let b = BlockingFile::read(self, buf.len())?;
        buf[..b.len()].copy_from_slice(&b);
        Ok(b.len())
    }
}

impl std::io::Write for BlockingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(BlockingFile::write(self, buf)?)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(BlockingFile::flush(self)?)
    }
}

impl std::io::Seek for BlockingFile {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        Ok(BlockingFile::seek(self, pos)?)
    }
}

impl std::fmt::Debug for BlockingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.file.fmt(f)
    }
}
