//! Metadata queries (`shoal find`, docs/find.md): every server scans the entries it holds
//! (`Op::Find`, `server/src/ops/find.rs`) at the same time, and the client assembles paths.
//!
//! Each server pages through its store and answers the entries that match and the
//! directories the caller may see. The client then:
//!
//! 1. finishes the tests of the entries whose inode lives on another server (directories,
//!    most of them: they are placed round-robin) by asking for their attributes;
//! 2. names each entry by walking up the directories the servers returned to the path
//!    asked about. An entry that does not lead there (another part of the tree) or whose way
//!    up passes a directory the caller may not see is not reported, so the answer is what
//!    `find` run by the caller would print;
//! 3. sorts the answer by path.
//!
//! The answer is not a snapshot: an entry created, removed or renamed while the servers
//! scan may or may not be in it, as with `find` on a tree being changed.

use crate::client::{unexpected, Client, To};
use crate::error::{Error, Result};
use bytes::Bytes;
use futures::StreamExt;
use shoal_placement::ServerState;
use shoal_proto::find::{FindPage, FindQuery, FoundDir, FoundEntry};
use shoal_proto::msg::{Attr, Op, Reply};
use shoal_proto::{Errno, Ino, ServerId};
use std::collections::HashMap;

/// A path that matched, with its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The path asked about, joined with the entry's path below it.
    pub path: String,
    /// The entry's attributes, as the query saw them.
    pub attr: Attr,
}

/// Limits on depth, as find's `-mindepth`/`-maxdepth` (the path asked about is depth 0).
#[derive(Clone, Copy, Debug, Default)]
pub struct FindOptions {
    /// Report nothing shallower than this.
    pub min_depth: usize,
    /// Report nothing deeper than this (`None`: no limit).
    pub max_depth: Option<usize>,
    /// Matches a server returns per request (0: the server's default and most, 8192).
    pub page: u32,
}

/// What a query cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FindStats {
    /// Servers that took part.
    pub servers: usize,
    /// Requests sent to the servers (pages and attributes).
    pub requests: u64,
    /// Entries the servers looked at.
    pub scanned: u64,
}

/// One server's whole answer: matches, directories, entries scanned, requests sent.
type ServerAnswer = (Vec<FoundEntry>, Vec<FoundDir>, u64, u64);

/// Deepest directory chain followed up to the path asked about (a deeper one, or a loop
/// seen while directories are being renamed, is not reported).
const DEPTH_MAX: usize = 4096;

impl Client {
    /// Every entry at or under `path` that matches `query` and that the caller may see, by
    /// path; see the module's documentation.
    pub async fn find(&self, path: &str, query: &FindQuery, opts: FindOptions) -> Result<(Vec<Found>, FindStats)> {
        self.find_inner(path, query, opts).await.map_err(|e| e.within(format_args!("find {path}")))
    }

    async fn find_inner(&self, path: &str, query: &FindQuery, opts: FindOptions) -> Result<(Vec<Found>, FindStats)> {
        let pattern = query.pattern().map_err(|e| Error::new(Errno::EINVAL, e))?;
        let root = self.stat(path).await?;
        let servers: Vec<ServerId> =
            self.pool().map().servers.iter().filter(|s| s.state != ServerState::Out).map(|s| s.server_id()).collect();
        for &s in &servers {
            if !self.server_has(s, shoal_proto::hello::FEATURE_FIND).await? {
                return Err(Error::new(Errno::ENOTSUP, format!("server {s} predates metadata queries (protocol 10)")));
            }
        }
        let mut stats = FindStats { servers: servers.len(), ..Default::default() };
        let pages: Vec<Result<ServerAnswer>> =
            futures::future::join_all(servers.iter().map(|&s| self.find_on(s, query, opts.page))).await;
        let mut entries = Vec::new();
        let mut up: HashMap<Ino, (Ino, String)> = HashMap::new();
        for p in pages {
            let (found, dirs, scanned, requests) = p?;
            stats.scanned += scanned;
            stats.requests += requests;
            entries.extend(found);
            up.extend(dirs.into_iter().map(|d| (d.ino, (d.dir, d.name))));
        }
        let mut names = Namer { root: root.ino, up: &up, memo: HashMap::new() };
        // Where each entry is, first (no request is spent on one that is not reported).
        let placed: Vec<(String, usize, FoundEntry)> = entries
            .into_iter()
            .filter_map(|e| {
                let (dir_path, depth) = names.path_of(e.dir)?;
                let depth = depth + 1;
                let ok = depth >= opts.min_depth && opts.max_depth.is_none_or(|m| depth <= m);
                ok.then(|| (join(&dir_path, &e.name), depth, e))
            })
            .collect();
        // Inodes held elsewhere than their entry: their attributes, and the tests left.
        stats.requests += placed.iter().filter(|p| p.2.attr.is_none()).count() as u64;
        let finished: Vec<Option<Found>> = futures::stream::iter(placed)
            .map(|(rel, _, e)| async move {
                match e.attr {
                    Some(a) => Ok(Some(Found { path: rel, attr: a })),
                    None => self.finish(query, rel, e.ino).await,
                }
            })
            .buffered(self.max_in_flight())
            .collect::<Vec<Result<Option<Found>>>>()
            .await
            .into_iter()
            .collect::<Result<_>>()?;
        let mut out: Vec<Found> = finished.into_iter().flatten().collect();
        // The path asked about itself (depth 0), as find reports it.
        let base = path.trim_end_matches('/').rsplit('/').next().unwrap_or("").to_string();
        if opts.min_depth == 0
            && query.matches_name(pattern.as_ref(), if base.is_empty() { "/" } else { &base }, root.kind, root.ino)
            && query.matches_attr(&root)
            && self.xattr_passes(query, root.ino).await?
        {
            out.push(Found { path: String::new(), attr: root });
        }
        let prefix = if path.ends_with('/') && path.len() > 1 { path.trim_end_matches('/') } else { path };
        for f in &mut out {
            f.path = match (f.path.is_empty(), prefix) {
                (true, _) => prefix.to_string(),
                (false, "/") => format!("/{}", f.path),
                (false, p) => format!("{p}/{}", f.path),
            };
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok((out, stats))
    }

    /// Every page of server `s`'s answer: matches, directories, entries scanned, requests.
    async fn find_on(&self, s: ServerId, query: &FindQuery, limit: u32) -> Result<ServerAnswer> {
        let (mut found, mut dirs, mut scanned, mut requests) = (Vec::new(), Vec::new(), 0, 0);
        let mut after = None;
        loop {
            let op = Op::Find { query: query.clone(), after, limit };
            requests += 1;
            let page: FindPage = match self.call(To::Server(s), op, Bytes::new()).await {
                Ok((Reply::Found(p), _)) => p,
                Ok((other, _)) => return Err(unexpected(&other)),
                Err(e) => return Err(e.within(format_args!("server {s}"))),
            };
            scanned += page.scanned;
            found.extend(page.found);
            dirs.extend(page.dirs);
            match page.next {
                Some(n) => after = Some(n),
                None => return Ok((found, dirs, scanned, requests)),
            }
        }
    }

    /// The tests a server could not make for `ino` (held elsewhere): `None` if it fails
    /// them or is gone.
    async fn finish(&self, query: &FindQuery, path: String, ino: Ino) -> Result<Option<Found>> {
        let a = match self.getattr_fresh(ino).await {
            Ok(a) => a,
            // Removed since the scan.
            Err(e) if e.errno == Errno::ENOENT || e.errno == Errno::ESTALE => return Ok(None),
            Err(e) => return Err(e),
        };
        if !query.matches_attr(&a) || !self.xattr_passes(query, ino).await? {
            return Ok(None);
        }
        Ok(Some(Found { path, attr: a }))
    }

    async fn xattr_passes(&self, query: &FindQuery, ino: Ino) -> Result<bool> {
        let Some(name) = &query.xattr else { return Ok(true) };
        match self.getxattr(ino, name).await {
            Ok(v) => Ok(query.xattr_holds(Some(&v))),
            Err(e) if e.errno == Errno::ENODATA || e.errno == Errno::ENOENT => Ok(query.xattr_holds(None)),
            Err(e) => Err(e),
        }
    }
}

/// Paths of directories relative to the root of the query, from the directory entries the
/// servers returned (`up`: a directory's inode to its parent and name).
struct Namer<'a> {
    root: Ino,
    up: &'a HashMap<Ino, (Ino, String)>,
    memo: HashMap<Ino, Option<(String, usize)>>,
}

impl Namer<'_> {
    /// `dir`'s path below the root and its depth (the root: "" at 0); `None` when `dir` is
    /// not under the root or its way up passes a directory the caller may not see.
    fn path_of(&mut self, dir: Ino) -> Option<(String, usize)> {
        // Walk up to the root or to a directory already named, then name the way down.
        let mut chain = Vec::new();
        let mut at = dir;
        let known = loop {
            if at == self.root {
                break Some((String::new(), 0));
            }
            if let Some(k) = self.memo.get(&at) {
                break k.clone();
            }
            if chain.len() >= DEPTH_MAX {
                break None;
            }
            match self.up.get(&at) {
                Some((parent, _)) if *parent != at => {
                    chain.push(at);
                    at = *parent;
                }
                _ => break None,
            }
        };
        let mut named = known;
        for d in chain.into_iter().rev() {
            named = named.map(|(p, depth)| (join(&p, &self.up[&d].1), depth + 1));
            self.memo.insert(d, named.clone());
        }
        named
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_named_up_to_the_root_and_not_beyond() {
        let mut up = HashMap::new();
        up.insert(Ino(2), (Ino(1), "a".to_string()));
        up.insert(Ino(3), (Ino(2), "b".to_string()));
        up.insert(Ino(4), (Ino(1), "elsewhere".to_string()));
        // 6's parent 5 was not returned (the caller may not see it).
        up.insert(Ino(6), (Ino(5), "hidden".to_string()));
        // A loop, as a rename in flight may show.
        up.insert(Ino(7), (Ino(8), "x".to_string()));
        up.insert(Ino(8), (Ino(7), "y".to_string()));
        let mut n = Namer { root: Ino(2), up: &up, memo: HashMap::new() };
        assert_eq!(n.path_of(Ino(2)), Some((String::new(), 0)));
        assert_eq!(n.path_of(Ino(3)), Some(("b".to_string(), 1)));
        assert_eq!(n.path_of(Ino(4)), None, "not under the root");
        assert_eq!(n.path_of(Ino(6)), None);
        assert_eq!(n.path_of(Ino(7)), None);
        let mut n = Namer { root: Ino(1), up: &up, memo: HashMap::new() };
        assert_eq!(n.path_of(Ino(3)), Some(("a/b".to_string(), 2)));
        assert_eq!(n.path_of(Ino(3)), Some(("a/b".to_string(), 2)), "again, from the memo");
    }
}
