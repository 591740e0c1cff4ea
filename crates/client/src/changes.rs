//! Following the change log (docs/changes.md): [`Client::watch_changes`] reads every
//! server's log at the same time (`Op::Changes`, long-polled, `server/src/ops/changes.rs`)
//! and hands out the events under one directory as paths, one at a time.
//!
//! Each server numbers its events; a watch keeps one cursor per server. Events of one
//! server come in its order; events of different servers interleave as they arrive. With a
//! consumer name the cursors are kept on the servers ([`ChangeWatch::ack`]): a consumer
//! that restarts continues after the last event it acknowledged, missing and repeating
//! nothing.
//!
//! Paths. An event names a directory and an entry, or only an inode. The watch keeps the
//! path of every directory under the watched one (listed once at the start, then kept
//! up to date from mkdir, rmdir and rename events) and of every file it saw named. A
//! directory it does not know is placed by walking up its parents; a file it does not know
//! is looked for under the watched directory (`find -inum`, a scan of the servers), once.
//! Events outside the watched directory are passed over.

use crate::client::{unexpected, Client, To};
use crate::error::{Error, Result};
use crate::find::FindOptions;
use bytes::Bytes;
use shoal_placement::ServerState;
use shoal_proto::change::{check_consumer, ChangeEvent, ChangeKind, ChangePage};
use shoal_proto::find::FindQuery;
use shoal_proto::msg::{FileKind, Op, Reply, Timestamp};
use shoal_proto::{Errno, Ino, ServerId};
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Longest wait of one request (the server's bound).
const WAIT_STEP: Duration = Duration::from_secs(10);
/// Files whose paths a watch remembers, at most; past it the memory starts again (a file
/// forgotten is looked for again when an event names only its inode).
const FILES_MAX: usize = 1 << 20;
/// Pages the pollers read ahead of the watch's consumer. Generous: a poller blocked on a
/// full channel would hand its page over after pages of other servers committed later,
/// and paths are resolved in the order pages are handed over (a rename seen too early
/// names the entries of the directory's earlier events by its new name).
const PAGES_AHEAD: usize = 256;
/// Deepest directory chain walked up to the watched directory.
const DEPTH_MAX: usize = 4096;
/// Kinds a recursive watch always reads: what keeps its directory paths right.
const TREE_KINDS: u32 = 0b110_0010; // mkdir, rmdir, rename (bits of `change::KINDS`)
/// Kinds that name a file: read too when inode events are wanted, so that a file's
/// `close` is placed by the `create` before it (the same server logs both, in order)
/// instead of by a search, which no longer finds a file renamed or removed since.
const NAMING_KINDS: u32 = 0b100_1101; // create, symlink, link, rename
/// Events that name only an inode.
const INODE_KINDS: u32 = 0b11_1000_0000; // setattr, xattr, close

/// Where a watch starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeStart {
    /// Events committed after the watch starts.
    Now,
    /// Every event the servers still keep.
    Oldest,
    /// After the last event this consumer acknowledged (a new consumer: from now on, and
    /// the servers keep the events it has not acknowledged).
    Consumer(String),
}

/// What to watch.
#[derive(Clone, Debug)]
pub struct ChangeWatchOptions {
    /// Kinds of events wanted (`ChangeKind::bit`s; `change::ALL_KINDS`).
    pub kinds: u32,
    /// The whole tree under the directory, not only its own entries.
    pub recursive: bool,
    /// A shell pattern the event's name (a pattern without `/`) or its path below the
    /// watched directory (with `/`) must match; a rename matches by either name.
    pub pattern: Option<String>,
    /// Where the watch starts.
    pub start: ChangeStart,
}

impl Default for ChangeWatchOptions {
    fn default() -> Self {
        ChangeWatchOptions {
            kinds: shoal_proto::change::ALL_KINDS,
            recursive: true,
            pattern: None,
            start: ChangeStart::Now,
        }
    }
}

/// One event, with paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The server that logged it.
    pub server: ServerId,
    /// Its number in that server's log.
    pub seq: u64,
    /// What happened.
    pub kind: ChangeKind,
    /// The path of what changed (a rename: its old path; `None` for a rename from outside
    /// the watched directory, the only event without it).
    pub path: Option<String>,
    /// A rename: the new path (`None` when it left the watched directory).
    pub to_path: Option<String>,
    /// The inode changed, made or unnamed, and its kind.
    pub ino: Ino,
    /// The kind of `ino`.
    pub file_kind: FileKind,
    /// An `Xattr` event: the attribute's name.
    pub xattr: Option<String>,
    /// Who made the change (`u32::MAX`: a step that recovery finished).
    pub uid: u32,
    /// When, by the server's clock.
    pub at: Timestamp,
}

impl Change {
    /// The path under the watched directory: `path`, or for a rename into it, `to_path`.
    pub fn any_path(&self) -> &str {
        self.path.as_deref().or(self.to_path.as_deref()).unwrap_or_default()
    }

    /// The event as one line: `KIND PATH`, `rename OLD -> NEW` (a side outside the watched
    /// directory is `(outside)`), `xattr PATH NAME`.
    pub fn line(&self) -> String {
        let path = self.path.as_deref().unwrap_or("(outside)");
        match (self.kind, &self.xattr) {
            (ChangeKind::Rename, _) => {
                format!("rename {path} -> {}", self.to_path.as_deref().unwrap_or("(outside)"))
            }
            (_, Some(x)) => format!("{} {path} {x}", self.kind.name()),
            (_, None) => format!("{} {path}", self.kind.name()),
        }
    }
}

/// What the pollers hand over: a page of a server's log, or why it could not be read.
type Polled = (ServerId, std::result::Result<ChangePage, Error>);

enum Item {
    Event(ServerId, ChangeEvent),
    /// Every event of the server up to this number has been looked at.
    Cursor(ServerId, u64),
}

/// A running watch; see the module documentation. Dropping it stops its requests.
pub struct ChangeWatch {
    client: Client,
    root: Ino,
    root_path: String,
    recursive: bool,
    kinds: u32,
    pattern: Option<(glob::Pattern, bool)>,
    consumer: Option<String>,
    rx: mpsc::Receiver<Polled>,
    pollers: Vec<tokio::task::JoinHandle<()>>,
    queue: VecDeque<Item>,
    /// Per server: the last event handed out or passed over, and the last acknowledged.
    handed: HashMap<ServerId, u64>,
    acked: HashMap<ServerId, u64>,
    dirs: HashMap<Ino, String>,
    files: HashMap<Ino, String>,
    /// Inodes known not to be under the watched directory.
    outside: HashSet<Ino>,
    lost: u64,
}

impl Drop for ChangeWatch {
    fn drop(&mut self) {
        for p in &self.pollers {
            p.abort();
        }
    }
}

impl Client {
    /// Watch the changes under directory `path`; see [`ChangeWatchOptions`].
    pub async fn watch_changes(&self, path: &str, opts: ChangeWatchOptions) -> Result<ChangeWatch> {
        self.watch_inner(path, opts).await.map_err(|e| e.within(format_args!("watch {path}")))
    }

    async fn watch_inner(&self, path: &str, opts: ChangeWatchOptions) -> Result<ChangeWatch> {
        if opts.kinds & shoal_proto::change::ALL_KINDS == 0 {
            return Err(Error::new(Errno::EINVAL, "a watch needs at least one kind of event"));
        }
        let consumer = match &opts.start {
            ChangeStart::Consumer(c) => {
                check_consumer(c).map_err(|e| Error::new(Errno::EINVAL, e))?;
                Some(c.clone())
            }
            _ => None,
        };
        let pattern = match &opts.pattern {
            None => None,
            Some(p) => Some((
                glob::Pattern::new(p).map_err(|e| Error::new(Errno::EINVAL, format!("pattern {p:?}: {e}")))?,
                p.contains('/'),
            )),
        };
        let root = self.stat(path).await?;
        if root.kind != FileKind::Dir {
            return Err(Error::new(Errno::ENOTDIR, "only a directory can be watched"));
        }
        let root_path = normalize(path);
        let servers: Vec<ServerId> =
            self.pool().map().servers.iter().filter(|s| s.state != ServerState::Out).map(|s| s.server_id()).collect();
        for &s in &servers {
            if !self.server_has(s, shoal_proto::hello::FEATURE_CHANGES).await? {
                return Err(Error::new(Errno::ENOTSUP, format!("server {s} predates the change log (protocol 12)")));
            }
        }
        let mut read_kinds = if opts.recursive { opts.kinds | TREE_KINDS } else { opts.kinds };
        if opts.kinds & INODE_KINDS != 0 {
            read_kinds |= NAMING_KINDS;
        }
        // Each server's first page now, so that nothing committed after this call returns
        // is missed; then a poller per server from where that page ended.
        let (tx, rx) = mpsc::channel(PAGES_AHEAD);
        let mut pollers = Vec::new();
        let mut handed = HashMap::new();
        let mut queue = VecDeque::new();
        let mut lost = 0;
        for &s in &servers {
            let after = match &opts.start {
                ChangeStart::Now | ChangeStart::Consumer(_) => None,
                ChangeStart::Oldest => Some(0),
            };
            let first = changes_page(self, s, after, consumer.clone(), read_kinds, Duration::ZERO).await?;
            // Where the watch starts on `s` (a cursor before events the page passed over is
            // safe: acknowledging it only hands those out again).
            handed.insert(s, first.events.first().map_or(first.next, |e| e.seq - 1));
            // Queued here, not sent: the channel is only read once this call returns, and
            // the pollers already running may have filled it.
            let next = first.next;
            lost += first.lost;
            queue.extend(first.events.into_iter().map(|e| Item::Event(s, e)));
            queue.push_back(Item::Cursor(s, next));
            pollers.push(tokio::spawn(poll(self.clone(), s, next, read_kinds, tx.clone())));
        }
        let mut dirs = HashMap::new();
        if opts.recursive {
            let q = FindQuery { kind: Some(FileKind::Dir), ..Default::default() };
            let (found, _) = self.find(&root_path, &q, FindOptions { min_depth: 1, ..Default::default() }).await?;
            dirs.extend(found.into_iter().map(|f| (f.attr.ino, f.path)));
        }
        let acked = handed.clone();
        Ok(ChangeWatch {
            client: self.clone(),
            root: root.ino,
            root_path,
            recursive: opts.recursive,
            kinds: opts.kinds,
            pattern,
            consumer,
            rx,
            pollers,
            queue,
            handed,
            acked,
            dirs,
            files: HashMap::new(),
            outside: HashSet::new(),
            lost,
        })
    }

    /// Remove consumer `name` from every server: its cursors go, and the logs no longer
    /// keep events for it.
    pub async fn forget_consumer(&self, name: &str) -> Result<()> {
        check_consumer(name).map_err(|e| Error::new(Errno::EINVAL, e))?;
        let servers: Vec<ServerId> =
            self.pool().map().servers.iter().filter(|s| s.state != ServerState::Out).map(|s| s.server_id()).collect();
        for s in servers {
            let op = Op::ChangeAck { consumer: name.to_string(), upto: 0, forget: true };
            match self.call(To::Server(s), op, Bytes::new()).await? {
                (Reply::Changes(_), _) => {}
                (other, _) => return Err(unexpected(&other)),
            }
        }
        Ok(())
    }
}

/// One request for server `s`'s events after `after` (`None`: from now, or from
/// `consumer`'s cursor).
async fn changes_page(
    client: &Client,
    s: ServerId,
    after: Option<u64>,
    consumer: Option<String>,
    kinds: u32,
    wait: Duration,
) -> Result<ChangePage> {
    let op = Op::Changes { after, consumer, kinds, limit: 0, wait_ms: wait.as_millis() as u32 };
    match client.call(To::Server(s), op, Bytes::new()).await {
        Ok((Reply::Changes(p), _)) => Ok(p),
        Ok((other, _)) => Err(unexpected(&other)),
        Err(e) => Err(e.within(format_args!("server {s}"))),
    }
}

/// Read server `s`'s log after `after` for as long as the watch lives. A server that cannot
/// be reached is asked again (it may be restarting or failing over); the watch is told.
async fn poll(client: Client, s: ServerId, mut after: u64, kinds: u32, tx: mpsc::Sender<Polled>) {
    let mut pause = Duration::from_millis(50);
    loop {
        match changes_page(&client, s, Some(after), None, kinds, WAIT_STEP).await {
            Ok(page) => {
                pause = Duration::from_millis(50);
                after = page.next;
                if tx.send((s, Ok(page))).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                if tx.send((s, Err(e))).await.is_err() {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

impl ChangeWatch {
    /// The next event, waiting up to `wait` for one (`None`: until there is one).
    /// `Ok(None)`: none in time. A server that cannot be read is retried in the background
    /// and does not end the watch (see [`ChangeWatch::unreachable`]).
    pub async fn next(&mut self, wait: Option<Duration>) -> Result<Option<Change>> {
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            while let Some(item) = self.queue.pop_front() {
                match item {
                    Item::Cursor(s, n) => {
                        let h = self.handed.entry(s).or_default();
                        *h = (*h).max(n);
                    }
                    Item::Event(s, e) => {
                        let seq = e.seq;
                        let change = self.place(s, e).await?;
                        let h = self.handed.entry(s).or_default();
                        *h = (*h).max(seq);
                        if change.is_some() {
                            return Ok(change);
                        }
                    }
                }
            }
            let polled = match deadline {
                None => self.rx.recv().await,
                Some(d) => match tokio::time::timeout_at(d, self.rx.recv()).await {
                    Ok(p) => p,
                    Err(_) => return Ok(None),
                },
            };
            let Some((s, page)) = polled else {
                return Err(Error::new(Errno::EIO, "the watch's requests stopped"));
            };
            match page {
                Ok(page) => {
                    self.lost += page.lost;
                    self.queue.extend(page.events.into_iter().map(|e| Item::Event(s, e)));
                    self.queue.push_back(Item::Cursor(s, page.next));
                }
                Err(e) => tracing::warn!("change log of server {s} unreadable for now: {e}"),
            }
        }
    }

    /// Keep, on every server, that every event handed out so far is handled: a watch
    /// started again with the same consumer continues after them. Only for a watch started
    /// with [`ChangeStart::Consumer`] (EINVAL otherwise).
    pub async fn ack(&mut self) -> Result<()> {
        let Some(name) = self.consumer.clone() else {
            return Err(Error::new(Errno::EINVAL, "only a consumer's watch keeps a cursor"));
        };
        let due: Vec<(ServerId, u64)> =
            self.handed.iter().filter(|(s, n)| self.acked.get(s) != Some(n)).map(|(s, n)| (*s, *n)).collect();
        for (s, upto) in due {
            let op = Op::ChangeAck { consumer: name.clone(), upto, forget: false };
            match self.client.call(To::Server(s), op, Bytes::new()).await {
                Ok((Reply::Changes(_), _)) => {
                    self.acked.insert(s, upto);
                }
                Ok((other, _)) => return Err(unexpected(&other)),
                Err(e) => return Err(e.within(format_args!("acknowledge on server {s}"))),
            }
        }
        Ok(())
    }

    /// Per server, the last event handed out or passed over (what [`ChangeWatch::ack`]
    /// would keep).
    pub fn cursors(&self) -> Vec<(ServerId, u64)> {
        let mut v: Vec<(ServerId, u64)> = self.handed.iter().map(|(s, n)| (*s, *n)).collect();
        v.sort();
        v
    }

    /// Events the servers dropped before this watch read them.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Whether events are waiting to be handed out without a request.
    pub fn has_pending(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Turn event `e` of server `s` into a [`Change`] if it is under the watched
    /// directory, of a kind wanted and matching the pattern; keep the paths known.
    async fn place(&mut self, s: ServerId, e: ChangeEvent) -> Result<Option<Change>> {
        let path = match (e.dir, &e.name) {
            (Some(dir), Some(name)) => self.dir_path(dir).await?.map(|d| join(&d, name)),
            _ if e.file_kind == FileKind::Dir => self.dir_path(e.ino).await?,
            _ => self.file_path(e.ino).await?,
        };
        let to_path = match (e.to_dir, &e.to_name) {
            (Some(dir), Some(name)) => self.dir_path(dir).await?.map(|d| join(&d, name)),
            _ => None,
        };
        self.learn(&e, path.as_deref(), to_path.as_deref());
        let wanted = self.kinds & e.kind.bit() != 0;
        // Under the watched directory before or (a rename into it) after.
        if path.is_none() && to_path.is_none() {
            return Ok(None);
        }
        let matches = [&path, &to_path].into_iter().flatten().any(|p| self.matches(p));
        if !wanted || !matches {
            return Ok(None);
        }
        Ok(Some(Change {
            server: s,
            seq: e.seq,
            kind: e.kind,
            path,
            to_path,
            ino: e.ino,
            file_kind: e.file_kind,
            xattr: e.xattr,
            uid: e.uid,
            at: e.at,
        }))
    }

    fn matches(&self, path: &str) -> bool {
        let Some((p, whole)) = &self.pattern else { return true };
        let opts = glob::MatchOptions { require_literal_separator: *whole, ..Default::default() };
        if *whole {
            let rel = path.strip_prefix(&self.root_path).unwrap_or(path).trim_start_matches('/');
            p.matches_with(rel, opts)
        } else {
            p.matches_with(path.rsplit('/').next().unwrap_or(path), opts)
        }
    }

    /// Keep the paths of directories and files up to date after event `e`.
    fn learn(&mut self, e: &ChangeEvent, path: Option<&str>, to_path: Option<&str>) {
        let is_dir = e.file_kind == FileKind::Dir;
        match e.kind {
            ChangeKind::Mkdir if self.recursive => {
                if let Some(p) = path {
                    self.dirs.insert(e.ino, p.to_string());
                }
            }
            ChangeKind::Rmdir => {
                self.dirs.remove(&e.ino);
            }
            ChangeKind::Create | ChangeKind::Symlink | ChangeKind::Link => {
                if let Some(p) = path {
                    if self.files.len() >= FILES_MAX {
                        self.files.clear();
                    }
                    self.files.insert(e.ino, p.to_string());
                }
            }
            ChangeKind::Unlink if path.is_some_and(|p| self.files.get(&e.ino).is_some_and(|f| f == p)) => {
                self.files.remove(&e.ino);
            }
            ChangeKind::Rename => {
                let map = if is_dir { &mut self.dirs } else { &mut self.files };
                match to_path {
                    Some(to) if !is_dir || self.recursive => {
                        map.insert(e.ino, to.to_string());
                        self.outside.remove(&e.ino);
                    }
                    _ => {
                        map.remove(&e.ino);
                    }
                }
                if is_dir {
                    if let Some(from) = path {
                        self.moved_below(from, to_path);
                    }
                }
            }
            _ => {}
        }
    }

    /// Directory `from` became `to` (`None`: left the watched directory): the paths below.
    fn moved_below(&mut self, from: &str, to: Option<&str>) {
        let prefix = format!("{from}/");
        for map in [&mut self.dirs, &mut self.files] {
            let below: Vec<Ino> = map.iter().filter(|(_, p)| p.starts_with(&prefix)).map(|(i, _)| *i).collect();
            for ino in below {
                match to {
                    Some(to) => {
                        let old = map[&ino].clone();
                        map.insert(ino, format!("{to}/{}", &old[prefix.len()..]));
                    }
                    None => {
                        map.remove(&ino);
                    }
                }
            }
        }
    }

    /// The path of directory `dir` if it is the watched one or (recursive watch) under it.
    async fn dir_path(&mut self, dir: Ino) -> Result<Option<String>> {
        if dir == self.root {
            return Ok(Some(self.root_path.clone()));
        }
        if !self.recursive || self.outside.contains(&dir) {
            return Ok(None);
        }
        if let Some(p) = self.dirs.get(&dir) {
            return Ok(Some(p.clone()));
        }
        // Walk up to a directory placed already, then name the ones below it.
        let mut chain = vec![dir];
        let mut top = None;
        while chain.len() < DEPTH_MAX {
            let at = *chain.last().expect("not empty");
            let parent = match self.client.getattr(at).await {
                Ok(a) => a.parent,
                Err(e) if e.errno == Errno::ENOENT => None,
                Err(e) => return Err(e),
            };
            let Some(parent) = parent else { break };
            if parent == self.root || self.dirs.contains_key(&parent) {
                top = Some(parent);
                break;
            }
            if self.outside.contains(&parent) {
                break;
            }
            chain.push(parent);
        }
        let Some(top) = top else {
            self.outside.extend(chain);
            return Ok(None);
        };
        let mut above = if top == self.root { self.root_path.clone() } else { self.dirs[&top].clone() };
        for &d in chain.iter().rev() {
            match self.named_below(&above, d, 1).await? {
                Some(p) => {
                    self.dirs.insert(d, p.clone());
                    above = p;
                }
                None => return Ok(None),
            }
        }
        Ok(Some(above))
    }

    /// The path of file `ino` under the watched directory, looked for once.
    async fn file_path(&mut self, ino: Ino) -> Result<Option<String>> {
        if let Some(p) = self.files.get(&ino) {
            return Ok(Some(p.clone()));
        }
        if self.outside.contains(&ino) {
            return Ok(None);
        }
        let depth = if self.recursive { usize::MAX } else { 1 };
        let root = self.root_path.clone();
        match self.named_below(&root, ino, depth).await? {
            Some(p) => {
                self.files.insert(ino, p.clone());
                Ok(Some(p))
            }
            None => {
                self.outside.insert(ino);
                Ok(None)
            }
        }
    }

    /// A path naming `ino` at most `depth` levels below directory `dir` (`find -inum`).
    async fn named_below(&self, dir: &str, ino: Ino, depth: usize) -> Result<Option<String>> {
        let q = FindQuery { inum: Some(ino), ..Default::default() };
        let opts = FindOptions { min_depth: 1, max_depth: Some(depth).filter(|d| *d != usize::MAX), page: 0 };
        match self.client.find(dir, &q, opts).await {
            Ok((found, _)) => Ok(found.into_iter().next().map(|f| f.path)),
            Err(e) if e.errno == Errno::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// `path` without a trailing `/` (the root stays `/`).
fn normalize(path: &str) -> String {
    let p = path.trim_end_matches('/');
    if p.is_empty() {
        "/".to_string()
    } else {
        p.to_string()
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::change::KINDS;

    #[test]
    fn tree_kinds_are_mkdir_rmdir_rename() {
        let want = ChangeKind::Mkdir.bit() | ChangeKind::Rmdir.bit() | ChangeKind::Rename.bit();
        assert_eq!(TREE_KINDS, want);
        let naming = ChangeKind::Create.bit() | ChangeKind::Symlink.bit() | ChangeKind::Link.bit();
        assert_eq!(NAMING_KINDS, naming | ChangeKind::Rename.bit());
        assert_eq!(INODE_KINDS, ChangeKind::Setattr.bit() | ChangeKind::Xattr.bit() | ChangeKind::Close.bit());
        assert_eq!(KINDS.len(), 10);
    }

    #[test]
    fn paths_join_and_normalize() {
        assert_eq!(normalize("/a/b/"), "/a/b");
        assert_eq!(normalize("/"), "/");
        assert_eq!(join("/", "x"), "/x");
        assert_eq!(join("/a", "x"), "/a/x");
    }
}
