//! `shoal du` (docs/du.md): what a tree holds, added up from the per-directory usage the
//! servers keep (`Op::Usage`, `server/src/store/usage.rs`) instead of a walk of its files.
//!
//! Every server sends, page by page and all at the same time, one row per directory it
//! knows: the usage it holds of the directory (inodes whose parent it is, and their bytes)
//! and, for the directories whose inode it holds, their parent and whether the caller may
//! read them. The client sums each directory's usage over the servers, rebuilds the
//! directory tree from the parent pointers, and adds up the subtree of the path asked about
//! from the bottom. Reading the rows costs one record per directory per server, however
//! many files the directories hold.
//!
//! As `du`, a directory the caller may not read and search adds nothing but itself, and is
//! reported. Names are needed only for the directories reported (`depth`): they come from
//! listing the directories above them. The answer is not a snapshot: a change made while
//! the servers answer may or may not be in it.

use crate::client::{unexpected, Client, To};
use crate::error::{Error, Result};
use bytes::Bytes;
use shoal_placement::ServerState;
use shoal_proto::msg::{FileKind, Op, Reply};
use shoal_proto::usage::UsagePage;
use shoal_proto::{Errno, Ino, ServerId};
use std::collections::HashMap;

/// What a directory holds, itself not included; or the file (or link) asked about, as one
/// file of its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirUsage {
    /// The path asked about, joined with the directory's path below it.
    pub path: String,
    /// The directory's (or file's) inode number.
    pub ino: Ino,
    /// Depth below the path asked about (0: that path).
    pub depth: usize,
    /// Files and symbolic links in the tree, each counted once.
    pub files: u64,
    /// Directories in the tree.
    pub dirs: u64,
    /// Apparent size of those files and links, in bytes.
    pub bytes: u64,
    /// A directory (false: the path asked about is a file or a link).
    pub is_dir: bool,
}

impl DirUsage {
    /// Inodes in the tree, the directory itself included (`du --inodes`); 1 for a file.
    pub fn inodes(&self) -> u64 {
        self.files + self.dirs + u64::from(self.is_dir)
    }
}

/// The answer of [`Client::du`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DuReport {
    /// The directories down to the depth asked for, each before its parent (as `du`
    /// prints them), siblings by name; the path asked about is last.
    pub dirs: Vec<DirUsage>,
    /// Directories in the tree the caller may not read: their contents are not counted.
    pub unreadable: Vec<Ino>,
    /// Servers asked.
    pub servers: usize,
    /// Requests sent (usage pages and listings).
    pub requests: u64,
}

/// Deepest directory chain followed (a deeper one is not added up).
const DEPTH_MAX: usize = 4096;

/// What the servers said of one directory.
#[derive(Clone, Copy, Default)]
struct Row {
    parent: Option<Ino>,
    readable: Option<bool>,
    files: u64,
    dirs: u64,
    bytes: u64,
}

impl Client {
    /// What the tree at `path` holds, added up from the servers' per-directory usage, with
    /// the directories down to `depth` below it; see the module's documentation. A path
    /// that is not a directory (not followed when it is a symbolic link, as `du`) reports
    /// itself.
    pub async fn du(&self, path: &str, depth: usize) -> Result<DuReport> {
        self.du_inner(path, depth).await.map_err(|e| e.within(format_args!("du {path}")))
    }

    async fn du_inner(&self, path: &str, depth: usize) -> Result<DuReport> {
        let top = self.lstat(path).await?;
        let shown = if path.ends_with('/') && path.len() > 1 { path.trim_end_matches('/') } else { path };
        if top.kind != FileKind::Dir {
            let only = DirUsage {
                path: shown.to_string(),
                ino: top.ino,
                depth: 0,
                files: 1,
                dirs: 0,
                bytes: top.size,
                is_dir: false,
            };
            return Ok(DuReport { dirs: vec![only], ..Default::default() });
        }
        let servers: Vec<ServerId> =
            self.pool().map().servers.iter().filter(|s| s.state != ServerState::Out).map(|s| s.server_id()).collect();
        for &s in &servers {
            if !self.server_has(s, shoal_proto::hello::FEATURE_USAGE).await? {
                return Err(Error::new(
                    Errno::ENOTSUP,
                    format!("server {s} predates per-directory usage (protocol 13)"),
                ));
            }
        }
        let answers = futures::future::join_all(servers.iter().map(|&s| self.usage_on(s))).await;
        let mut report = DuReport { servers: servers.len(), ..Default::default() };
        let mut rows: HashMap<Ino, Row> = HashMap::new();
        for a in answers {
            let (pages, requests) = a?;
            report.requests += requests;
            for r in pages.into_iter().flat_map(|p| p.rows) {
                let row = rows.entry(r.dir).or_default();
                if r.parent.is_some() {
                    row.parent = r.parent;
                    row.readable = Some(r.readable);
                }
                row.files += r.files;
                row.dirs += r.dirs;
                row.bytes += r.bytes;
            }
        }
        let mut children: HashMap<Ino, Vec<Ino>> = HashMap::new();
        for (&dir, row) in &rows {
            if let Some(p) = row.parent.filter(|&p| p != dir) {
                children.entry(p).or_default().push(dir);
            }
        }
        let readable = |d: Ino| rows.get(&d).and_then(|r| r.readable).unwrap_or(true);
        if !readable(top.ino) {
            return Err(Error::new(Errno::EACCES, "cannot read the directory"));
        }
        // Depth-first from the top, each directory after its children (totals from below).
        let mut totals: HashMap<Ino, DirUsage> = HashMap::new();
        let mut depth_of: HashMap<Ino, usize> = HashMap::from([(top.ino, 0)]);
        let mut stack = vec![(top.ino, false)];
        while let Some((dir, done)) = stack.pop() {
            let d = depth_of[&dir];
            if !done {
                stack.push((dir, true));
                if !readable(dir) {
                    report.unreadable.push(dir);
                    continue;
                }
                if d >= DEPTH_MAX {
                    return Err(Error::new(Errno::ELOOP, format!("directories nested deeper than {DEPTH_MAX}")));
                }
                for &c in children.get(&dir).into_iter().flatten() {
                    // A directory seen twice (moved while the servers answered) counts once.
                    if depth_of.insert(c, d + 1).is_none() {
                        stack.push((c, false));
                    }
                }
                continue;
            }
            let row = rows.get(&dir).copied().unwrap_or_default();
            let mut t = DirUsage { path: String::new(), ino: dir, depth: d, files: 0, dirs: 0, bytes: 0, is_dir: true };
            if readable(dir) {
                (t.files, t.dirs, t.bytes) = (row.files, row.dirs, row.bytes);
                for c in children.get(&dir).into_iter().flatten() {
                    if let Some(ct) = totals.get(c).filter(|ct| ct.depth == d + 1) {
                        t.files += ct.files;
                        t.dirs += ct.dirs;
                        t.bytes += ct.bytes;
                    }
                }
            }
            totals.insert(dir, t);
        }
        report.unreadable.sort();
        // Names of the directories reported, from listings of those above them.
        let mut out = Vec::new();
        let mut todo = vec![(top.ino, shown.to_string(), false)];
        while let Some((dir, path, done)) = todo.pop() {
            let t = &totals[&dir];
            if done || t.depth >= depth || !readable(dir) || !children.contains_key(&dir) {
                out.push(DirUsage { path, ..t.clone() });
                continue;
            }
            todo.push((dir, path.clone(), true));
            let mut entries = match self.readdir_all(dir).await {
                Ok(e) => e,
                Err(e) if e.errno == Errno::ENOENT => Vec::new(),
                Err(e) => return Err(e),
            };
            report.requests += 1;
            entries.retain(|e| e.kind == FileKind::Dir && totals.get(&e.ino).is_some_and(|c| c.depth == t.depth + 1));
            // Pushed in reverse so that siblings come out by name.
            entries.sort_by(|a, b| b.name.cmp(&a.name));
            for e in entries {
                let p = if path == "/" { format!("/{}", e.name) } else { format!("{path}/{}", e.name) };
                todo.push((e.ino, p, false));
            }
        }
        report.dirs = out;
        Ok(report)
    }

    /// Every page of server `s`'s usage, and the requests it took.
    async fn usage_on(&self, s: ServerId) -> Result<(Vec<UsagePage>, u64)> {
        let (mut pages, mut requests, mut after) = (Vec::new(), 0, None);
        loop {
            requests += 1;
            let page = match self.call(To::Server(s), Op::Usage { after, limit: 0 }, Bytes::new()).await {
                Ok((Reply::Usage(p), _)) => p,
                Ok((other, _)) => return Err(unexpected(&other)),
                Err(e) => return Err(e.within(format_args!("server {s}"))),
            };
            let next = page.next;
            pages.push(page);
            match next {
                Some(n) if Some(n) != after => after = Some(n),
                _ => return Ok((pages, requests)),
            }
        }
    }
}
