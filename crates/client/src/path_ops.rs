//! Path-level operations: resolution of `/a/b/c` through the entry cache, and every
//! operation that names a file by path.
//!
//! Resolution walks from the root one component at a time. `.` stays, `..` goes back to
//! the directory the walk came from (so after a followed symlink it is the parent of the
//! link's *target*, as in POSIX); `..` at the root stays at the root. Symlinks in the
//! middle of a path are always followed, the last component only when asked; relative
//! targets continue from the link's directory, absolute ones from Shoal's root. More than
//! [`MAX_SYMLINKS`] links in one resolution fail with ELOOP.
//!
//! If a server answers ENOENT or ENOTDIR where the walk relied on cached entries (another
//! client removed or replaced a directory), the operation is retried once with a walk that
//! asks the servers afresh.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::file::File;
use crate::options::OpenFlags;
use crate::pathname::{components, has_trailing_slash, join, normalize, split_last};
use futures::StreamExt;
use shoal_placement::map::AuthMode;
use shoal_proto::cap::Capability;
use shoal_proto::msg::{Attr, DirEntry, FileKind, LayoutSpec, RenameFlags, SetAttrs, TimeSet};
use shoal_proto::{Errno, Ino, ROOT_INO};
use std::collections::VecDeque;
use std::future::Future;
use std::time::Instant;

/// Most symlinks one path resolution follows (as Linux's MAXSYMLINKS).
pub const MAX_SYMLINKS: u32 = 40;

/// What a walk ended on.
#[derive(Clone, Debug)]
pub(crate) struct Found {
    pub ino: Ino,
    pub kind: FileKind,
    /// Attributes if the walk learnt them on the way (lookup replies carry them).
    pub attr: Option<Attr>,
}

/// A walk's error, and whether cached entries may be the cause (so a fresh walk may help).
type WalkErr = (Error, bool);

fn stale_errno(e: Errno) -> bool {
    e == Errno::ENOENT || e == Errno::ENOTDIR || e == Errno::ESTALE
}

impl Client {
    /// Walk `comps` from the root. `fresh` bypasses the cache for every component,
    /// `fresh_last` for the last only. Returns what was found and whether cached entries
    /// were used.
    async fn walk(
        &self,
        comps: &[&str],
        follow_last: bool,
        must_dir: bool,
        fresh: bool,
        fresh_last: bool,
    ) -> std::result::Result<(Found, bool), WalkErr> {
        let mut queue: VecDeque<String> = comps.iter().map(|c| c.to_string()).collect();
        let mut stack = vec![ROOT_INO];
        let mut cur = Found { ino: ROOT_INO, kind: FileKind::Dir, attr: None };
        let mut links = 0;
        let mut used_cache = false;
        while let Some(name) = queue.pop_front() {
            let dir = *stack.last().unwrap_or(&ROOT_INO);
            if name == "." || name == ".." {
                if name == ".." && stack.len() > 1 {
                    stack.pop();
                } else if name == ".." && self.options().host_paths {
                    return Err((Error::new(Errno::EREMOTE, "`..` leaves Shoal's root"), false));
                }
                cur = Found { ino: *stack.last().unwrap_or(&ROOT_INO), kind: FileKind::Dir, attr: None };
                continue;
            }
            let last = queue.is_empty();
            let (ino, kind, attr, cached) = match self.lookup_entry(dir, &name, fresh || (last && fresh_last)).await {
                Ok(x) => x,
                // A negative entry from the cache is an answer; a server's ENOENT in a
                // directory we reached through the cache may mean that directory is gone.
                Err((e, from_server)) => {
                    let stale = from_server && used_cache && self.maybe_stale(&e, dir).await;
                    return Err((e, stale));
                }
            };
            used_cache |= cached;
            match kind {
                FileKind::Dir => {
                    stack.push(ino);
                    cur = Found { ino, kind, attr };
                }
                FileKind::Symlink if !last || follow_last => {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err((Error::bare(Errno::ELOOP), false));
                    }
                    let target = self.readlink_with(ino, fresh).await.map_err(|e| (e, used_cache))?;
                    if target.is_empty() {
                        return Err((Error::bare(Errno::ENOENT), false));
                    }
                    if self.options().host_paths && (target.starts_with('/') || target.starts_with("shoal:")) {
                        return Err((Error::new(Errno::EREMOTE, format!("symbolic link to {target}")), false));
                    }
                    let tcomps = components(&target).map_err(|e| (Error::bare(e), false))?;
                    if crate::pathname::strip_scheme(&target).starts_with('/') {
                        stack.truncate(1);
                    }
                    for c in tcomps.iter().rev() {
                        queue.push_front(c.to_string());
                    }
                    cur = Found { ino: *stack.last().unwrap_or(&ROOT_INO), kind: FileKind::Dir, attr: None };
                }
                _ if !last => return Err((Error::bare(Errno::ENOTDIR), used_cache)),
                _ => cur = Found { ino, kind, attr },
            }
        }
        if must_dir && cur.kind != FileKind::Dir {
            return Err((Error::bare(Errno::ENOTDIR), used_cache));
        }
        Ok((cur, used_cache))
    }

    /// Whether error `e`, answered by a server about a name in directory `dir` that the
    /// client reached through cached entries, may come from a stale cache. ENOENT is
    /// ambiguous (no such name, or no such directory any more): it counts as stale only if
    /// the directory itself is gone, which one `GetAttr` tells, much cheaper than walking
    /// the whole path again for every name that really does not exist.
    async fn maybe_stale(&self, e: &Error, dir: Ino) -> bool {
        if e.errno != Errno::ENOENT {
            return stale_errno(e.errno);
        }
        if dir == ROOT_INO || !self.cache().enabled() {
            return false;
        }
        !matches!(self.getattr_fresh_inner(dir).await, Ok(a) if a.kind == FileKind::Dir)
    }

    /// Resolve `path` and run `f` on what it names, retrying once with a fresh walk if a
    /// stale cache entry may have caused an ENOENT/ENOTDIR. No context added.
    pub(crate) async fn on_target<T, F, Fut>(&self, path: &str, follow: bool, fresh_last: bool, f: F) -> Result<T>
    where
        F: Fn(Found, bool) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let comps = components(path)?;
        let must_dir = has_trailing_slash(path);
        let follow = follow || must_dir;
        let mut fresh = false;
        loop {
            let r = match self.walk(&comps, follow, must_dir, fresh, fresh_last).await {
                Ok((found, used)) => f(found, fresh).await.map_err(|e| (e, used)),
                Err(x) => Err(x),
            };
            match r {
                Err((e, true)) if !fresh && self.cache().enabled() && stale_errno(e.errno) => fresh = true,
                r => return r.map_err(|(e, _)| e),
            }
        }
    }

    /// Resolve the directory holding the last component of `path`: `(dir, name, used cache)`.
    /// `special` is the errno for a path without a usable last name (the root, `.`, `..`).
    async fn walk_parent<'p>(
        &self,
        path: &'p str,
        special: Errno,
        fresh: bool,
    ) -> std::result::Result<(Ino, &'p str, bool), WalkErr> {
        let (parent, last) = split_last(path).map_err(|e| (Error::bare(e), false))?;
        let name = match last {
            None | Some(".") | Some("..") => return Err((Error::bare(special), false)),
            Some(n) => n,
        };
        let (found, used) = self.walk(&parent, true, true, fresh, false).await?;
        Ok((found.ino, name, used))
    }

    /// Resolve the parent of `path` and run `f(dir, name)`, retrying once as `on_target`.
    pub(crate) async fn on_parent<T, F, Fut>(&self, path: &str, special: Errno, f: F) -> Result<T>
    where
        F: Fn(Ino, String) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut fresh = false;
        loop {
            let r = match self.walk_parent(path, special, fresh).await {
                Ok((dir, name, used)) => match f(dir, name.to_string()).await {
                    Ok(v) => Ok(v),
                    Err(e) => {
                        let stale = used && self.maybe_stale(&e, dir).await;
                        Err((e, stale))
                    }
                },
                Err(x) => Err(x),
            };
            match r {
                Err((e, true)) if !fresh && self.cache().enabled() && stale_errno(e.errno) => fresh = true,
                // A change is not refused on the cache's word alone: a missing directory on
                // the way may be a negative entry that a race with this client's own mkdir
                // left behind (a name made by a task that lost the race to another is known
                // to exist, and the cache can still say otherwise for a moment). Asking
                // afresh costs a walk only when the change would fail anyway.
                Err((e, false)) if !fresh && self.cache().enabled() && e.errno == Errno::ENOENT => fresh = true,
                r => return r.map_err(|(e, _)| e),
            }
        }
    }

    /// The attributes of what a walk found (from the walk, the cache, or the server).
    pub(crate) async fn attr_of(&self, found: Found, fresh: bool) -> Result<Attr> {
        match found.attr {
            Some(a) => Ok(a),
            None => self.getattr_with(found.ino, fresh).await,
        }
    }

    /// Resolve `path` to its attributes, following a final symlink if `follow_last`.
    pub async fn resolve(&self, path: &str, follow_last: bool) -> Result<Attr> {
        self.on_target(path, follow_last, false, |f, fresh| self.attr_of(f, fresh))
            .await
            .map_err(|e| e.within(format_args!("resolve {path}")))
    }

    /// Attributes of what `path` names (following symlinks).
    pub async fn stat(&self, path: &str) -> Result<Attr> {
        self.on_target(path, true, false, |f, fresh| self.attr_of(f, fresh))
            .await
            .map_err(|e| e.within(format_args!("stat {path}")))
    }

    /// Attributes of `path` itself (a final symlink is not followed).
    pub async fn lstat(&self, path: &str) -> Result<Attr> {
        self.on_target(path, false, false, |f, fresh| self.attr_of(f, fresh))
            .await
            .map_err(|e| e.within(format_args!("lstat {path}")))
    }

    /// Make directory `path` (permissions `perm & !umask`).
    pub async fn mkdir(&self, path: &str, perm: u32) -> Result<Attr> {
        self.on_parent(path, Errno::EEXIST, |dir, name| async move { self.mkdir_in(dir, &name, perm).await })
            .await
            .map_err(|e| e.within(format_args!("mkdir {path}")))
    }

    /// Make directory `path` and any missing parents, like `mkdir -p`: existing
    /// directories are fine; ENOTDIR if a component is not a directory (EEXIST if the last
    /// one is a file). The path is normalised lexically first (`a/../b` is `b`).
    pub async fn mkdir_all(&self, path: &str, perm: u32) -> Result<Attr> {
        self.mkdir_all_inner(path, perm).await.map_err(|e| e.within(format_args!("mkdir -p {path}")))
    }

    async fn mkdir_all_inner(&self, path: &str, perm: u32) -> Result<Attr> {
        let norm = normalize(path)?;
        let comps = components(&norm)?;
        let mut fresh = false;
        'attempt: loop {
            let mut dir = ROOT_INO;
            let mut used_cache = false;
            let mut prefix = String::from("/");
            let mut attr: Option<Attr> = None;
            for (i, name) in comps.iter().enumerate() {
                let last = i + 1 == comps.len();
                prefix = join(&prefix, name);
                let step: Result<Attr> = async {
                    match self.lookup_entry(dir, name, fresh).await {
                        Ok((ino, FileKind::Dir, a, cached)) => {
                            used_cache |= cached;
                            match a {
                                Some(a) => Ok(a),
                                None if last => self.getattr_with(ino, fresh).await,
                                // Only the inode number matters on the way.
                                None => Ok(dir_stub(ino)),
                            }
                        }
                        Ok((_, FileKind::Symlink, _, cached)) => {
                            used_cache |= cached;
                            let a = self.stat_inner(&prefix, fresh).await?;
                            if a.kind == FileKind::Dir {
                                Ok(a)
                            } else {
                                Err(Error::bare(if last { Errno::EEXIST } else { Errno::ENOTDIR }))
                            }
                        }
                        Ok((_, FileKind::File, _, _)) => {
                            Err(Error::bare(if last { Errno::EEXIST } else { Errno::ENOTDIR }))
                        }
                        Err((e, _)) if e.errno == Errno::ENOENT => match self.mkdir_in(dir, name, perm).await {
                            Ok(a) => Ok(a),
                            Err(e) if e.errno == Errno::EEXIST => {
                                // Made concurrently by someone else: take theirs.
                                let a = self.lookup_attr(dir, name, true).await?;
                                if a.kind == FileKind::Dir {
                                    Ok(a)
                                } else {
                                    Err(Error::bare(if last { Errno::EEXIST } else { Errno::ENOTDIR }))
                                }
                            }
                            Err(e) => Err(e),
                        },
                        Err((e, _)) => Err(e),
                    }
                }
                .await;
                match step {
                    Ok(a) => {
                        dir = a.ino;
                        attr = Some(a);
                    }
                    Err(e) if !fresh && used_cache && self.cache().enabled() && stale_errno(e.errno) => {
                        fresh = true;
                        continue 'attempt;
                    }
                    Err(e) => return Err(e.within(format_args!("at {prefix}"))),
                }
            }
            return match attr {
                Some(a) => Ok(a),
                None => self.getattr_with(ROOT_INO, fresh).await,
            };
        }
    }

    async fn stat_inner(&self, path: &str, fresh: bool) -> Result<Attr> {
        self.on_target(path, true, fresh, |f, fr| self.attr_of(f, fr || fresh)).await
    }

    /// Remove the empty directory `path`.
    pub async fn rmdir(&self, path: &str) -> Result<()> {
        self.on_parent(path, Errno::EBUSY, |dir, name| async move { self.remove_name(dir, &name, true).await })
            .await
            .map_err(|e| e.within(format_args!("rmdir {path}")))
    }

    /// Remove the file or symlink `path`.
    pub async fn unlink(&self, path: &str) -> Result<()> {
        self.on_parent(path, Errno::EISDIR, |dir, name| async move { self.remove_name(dir, &name, false).await })
            .await
            .map_err(|e| e.within(format_args!("unlink {path}")))
    }

    /// Remove `path` and, if it is a directory, everything below it (like `rm -r`; a
    /// symlink is removed, not followed). The files of a directory are removed
    /// concurrently, at most `max_in_flight` requests at a time; directories one after the
    /// other, depth first, so any depth works. Returns the number of names removed (`path`
    /// included). The root itself is never removed, only emptied. The first failure stops
    /// the removal and names the entry that could not be removed.
    pub async fn remove_all(&self, path: &str) -> Result<u64> {
        self.remove_all_inner(path).await.map_err(|e| e.within(format_args!("remove {path}")))
    }

    async fn remove_all_inner(&self, path: &str) -> Result<u64> {
        let found = self.on_target(path, false, true, |f, _| async move { Ok(f) }).await?;
        match found.kind {
            FileKind::Dir => {
                let n = self.remove_tree(found.ino, path).await?;
                if found.ino == ROOT_INO {
                    return Ok(n);
                }
                self.on_parent(path, Errno::EBUSY, |dir, name| async move { self.remove_name(dir, &name, true).await })
                    .await?;
                Ok(n + 1)
            }
            _ => {
                self.on_parent(
                    path,
                    Errno::EISDIR,
                    |dir, name| async move { self.remove_name(dir, &name, false).await },
                )
                .await?;
                Ok(1)
            }
        }
    }

    /// Remove everything in directory `top` (called `top_path` in errors); the number of
    /// names removed. Iterative, with an explicit stack of the directories being emptied
    /// (`top` at the bottom): recursion, even of boxed futures, nests one poll frame per
    /// level and overflows the thread's stack on trees a few thousand levels deep, leaving
    /// the removal half done. Invariant: once a level's `subdirs` is known, its directory
    /// holds no entries but those subdirectories and the one above it on the stack.
    async fn remove_tree(&self, top: Ino, top_path: &str) -> Result<u64> {
        struct Level {
            dir: Ino,
            /// Its name in the directory below it on the stack (`None` for `top`).
            name: Option<String>,
            /// Subdirectories still to remove; `None` until its files are removed.
            subdirs: Option<Vec<DirEntry>>,
        }
        // The path of the directory on top of the stack; built only for an error message.
        let path_of = |stack: &[Level]| {
            let mut p = top_path.trim_end_matches('/').to_string();
            for name in stack.iter().filter_map(|l| l.name.as_deref()) {
                p.push('/');
                p.push_str(name);
            }
            p
        };
        let mut n = 0;
        let mut stack = vec![Level { dir: top, name: None, subdirs: None }];
        while let Some(level) = stack.last_mut() {
            match &mut level.subdirs {
                None => match self.remove_files(level.dir).await {
                    Ok((k, subdirs)) => {
                        n += k;
                        level.subdirs = Some(subdirs);
                    }
                    Err((Some(name), e)) => {
                        return Err(e.within(format_args!("unlink {}/{name}", path_of(&stack))));
                    }
                    Err((None, e)) => return Err(e.within(format_args!("readdir {}", path_of(&stack)))),
                },
                Some(subdirs) => match subdirs.pop() {
                    Some(sub) => stack.push(Level { dir: sub.ino, name: Some(sub.name), subdirs: None }),
                    None => {
                        let done = stack.pop().expect("the loop saw a level");
                        let (Some(name), Some(below)) = (done.name, stack.last()) else { continue };
                        match self.remove_name(below.dir, &name, true).await {
                            Ok(()) => n += 1,
                            // Removed concurrently by someone else.
                            Err(e) if e.errno == Errno::ENOENT => {}
                            Err(e) => return Err(e.within(format_args!("rmdir {}/{name}", path_of(&stack)))),
                        }
                    }
                },
            }
        }
        Ok(n)
    }

    /// Remove every entry of directory `dir` that is not a directory, at most
    /// `max_in_flight` requests at a time; the number removed and the subdirectories left.
    /// A directory that is already gone has nothing. On failure, the name that could not
    /// be removed (`None`: the listing failed).
    async fn remove_files(&self, dir: Ino) -> std::result::Result<(u64, Vec<DirEntry>), (Option<String>, Error)> {
        let entries = match self.readdir_all(dir).await {
            Ok(e) => e,
            Err(e) if e.errno == Errno::ENOENT => return Ok((0, Vec::new())),
            Err(e) => return Err((None, e)),
        };
        let (subdirs, files): (Vec<DirEntry>, Vec<DirEntry>) =
            entries.into_iter().partition(|e| e.kind == FileKind::Dir);
        let results: Vec<std::result::Result<u64, (Option<String>, Error)>> = futures::stream::iter(files)
            .map(|e| async move {
                match self.remove_name(dir, &e.name, false).await {
                    Ok(()) => Ok(1),
                    // Removed concurrently by someone else.
                    Err(err) if err.errno == Errno::ENOENT => Ok(0),
                    Err(err) => Err((Some(e.name), err)),
                }
            })
            .buffer_unordered(self.max_in_flight())
            .collect()
            .await;
        let mut n = 0;
        for r in results {
            n += r?;
        }
        Ok((n, subdirs))
    }

    /// Rename `from` to `to` (replacing a compatible `to`, as rename(2)).
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_path(from, to, RenameFlags::default())
            .await
            .map_err(|e| e.within(format_args!("rename {from} to {to}")))
    }

    async fn rename_path(&self, from: &str, to: &str, flags: RenameFlags) -> Result<()> {
        let mut fresh = false;
        loop {
            let r = async {
                let (sd, sn, u1) = self.walk_parent(from, Errno::EBUSY, fresh).await?;
                let (dd, dn, u2) = self.walk_parent(to, Errno::EBUSY, fresh).await?;
                self.rename_inner(sd, sn, dd, dn, flags).await.map_err(|e| (e, u1 || u2))
            }
            .await;
            match r {
                Err((e, true)) if !fresh && self.cache().enabled() && stale_errno(e.errno) => fresh = true,
                r => return r.map_err(|(e, _)| e),
            }
        }
    }

    /// All entries of directory `path` (following symlinks to it).
    pub async fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.on_target(path, true, false, |f, _| async move {
            if f.kind != FileKind::Dir {
                return Err(Error::bare(Errno::ENOTDIR));
            }
            self.readdir_all(f.ino).await
        })
        .await
        .map_err(|e| e.within(format_args!("readdir {path}")))
    }

    /// Make a symlink at `link_path` pointing to `target` (taken as is; relative targets
    /// resolve against the link's directory, absolute ones from Shoal's root).
    pub async fn symlink(&self, target: &str, link_path: &str) -> Result<Attr> {
        self.on_parent(link_path, Errno::EEXIST, |dir, name| async move { self.symlink_in(dir, &name, target).await })
            .await
            .map_err(|e| e.within(format_args!("symlink {link_path} -> {target}")))
    }

    /// The target of symlink `path` (EINVAL if it is not a symlink).
    pub async fn readlink(&self, path: &str) -> Result<String> {
        self.on_target(path, false, false, |f, fresh| async move {
            if f.kind != FileKind::Symlink {
                return Err(Error::bare(Errno::EINVAL));
            }
            self.readlink_with(f.ino, fresh).await
        })
        .await
        .map_err(|e| e.within(format_args!("readlink {path}")))
    }

    /// Make `new_path` another name of the file `existing` (not following a final symlink,
    /// as link(2) on Linux).
    pub async fn link(&self, existing: &str, new_path: &str) -> Result<Attr> {
        self.link_path(existing, new_path).await.map_err(|e| e.within(format_args!("link {existing} as {new_path}")))
    }

    async fn link_path(&self, existing: &str, new_path: &str) -> Result<Attr> {
        let found = self.on_target(existing, false, false, |f, _| async move { Ok(f) }).await?;
        if found.kind == FileKind::Dir {
            return Err(Error::bare(Errno::EPERM));
        }
        self.on_parent(new_path, Errno::EEXIST, |dir, name| async move { self.link_in(found.ino, dir, &name).await })
            .await
    }

    async fn setattr_path(&self, path: &str, set: SetAttrs) -> Result<Attr> {
        self.on_target(path, true, false, |f, _| {
            let set = set.clone();
            async move { self.setattr_inner(f.ino, set).await }
        })
        .await
    }

    /// Set the permission bits (the low 12 bits of `perm`) of `path`.
    pub async fn chmod(&self, path: &str, perm: u32) -> Result<Attr> {
        self.setattr_path(path, SetAttrs { perm: Some(perm & 0o7777), ..Default::default() })
            .await
            .map_err(|e| e.within(format_args!("chmod {path}")))
    }

    /// Change the owner and/or group of `path`.
    pub async fn chown(&self, path: &str, uid: Option<u32>, gid: Option<u32>) -> Result<Attr> {
        self.setattr_path(path, SetAttrs { uid, gid, ..Default::default() })
            .await
            .map_err(|e| e.within(format_args!("chown {path}")))
    }

    /// Set the access and/or modification time of `path`.
    pub async fn utimens(&self, path: &str, atime: Option<TimeSet>, mtime: Option<TimeSet>) -> Result<Attr> {
        self.setattr_path(path, SetAttrs { atime, mtime, ..Default::default() })
            .await
            .map_err(|e| e.within(format_args!("utimens {path}")))
    }

    /// Cut or extend the file `path` to `size` bytes.
    pub async fn truncate(&self, path: &str, size: u64) -> Result<Attr> {
        self.setattr_path(path, SetAttrs { size: Some(size), ..Default::default() })
            .await
            .map_err(|e| e.within(format_args!("truncate {path}")))
    }

    /// Set the default layout of new files in the directory `path` (inherited by new
    /// subdirectories). A file's layout is fixed when it is created: for a file this fails
    /// with EEXIST (create it with a layout instead, [`Client::create`]).
    pub async fn set_layout(&self, path: &str, spec: LayoutSpec) -> Result<()> {
        self.on_target(path, true, false, |f, _| {
            let spec = spec.clone();
            async move {
                if f.kind != FileKind::Dir {
                    return Err(Error::new(Errno::EEXIST, "the layout of a file is fixed when it is created"));
                }
                self.set_dir_layout_in(f.ino, spec).await
            }
        })
        .await
        .map_err(|e| e.within(format_args!("set layout of {path}")))
    }

    /// Mark the file or directory `path` read-mostly (`on`) or clear the mark
    /// ([`Client::set_read_mostly_at`]); not recursive. Returns its new attributes.
    pub async fn set_read_mostly(&self, path: &str, on: bool) -> Result<Attr> {
        self.on_target(path, true, false, |f, _| async move { self.set_read_mostly_in(f.ino, on).await })
            .await
            .map_err(|e| e.within(format_args!("mark {path} read-mostly")))
    }

    // ---- opening files ----

    /// Open the file `path` (following symlinks).
    ///
    /// * `create`: make it if missing (permissions `perm` or 0o644, minus the umask; layout
    ///   from `layout`, else the directory's default); with `exclusive`, EEXIST if it exists.
    /// * An existing file is checked for read/write access (locally from fresh attributes
    ///   when they clearly allow it, else by the server). Directories open for reading only
    ///   (EISDIR for writing); their handle reads nothing.
    /// * `truncate`: cut an existing file to zero.
    ///
    /// The attributes (size) are fetched afresh: after another client's `close`, its data
    /// and size are visible (close-to-open consistency).
    pub async fn open(&self, path: &str, flags: OpenFlags) -> Result<File> {
        self.open_path(path, flags).await.map_err(|e| e.within(format_args!("open {path}")))
    }

    /// Create `path` (or truncate it if it exists) and open it for reading and writing.
    /// `layout` applies to a new file only.
    pub async fn create(&self, path: &str, perm: u32, layout: Option<LayoutSpec>) -> Result<File> {
        let flags =
            OpenFlags { read: true, write: true, create: true, truncate: true, perm, layout, ..Default::default() };
        self.open_path(path, flags).await.map_err(|e| e.within(format_args!("create {path}")))
    }

    async fn open_path(&self, path: &str, flags: OpenFlags) -> Result<File> {
        if flags.create {
            let flags = &flags;
            let made = self
                .on_parent(path, Errno::EISDIR, |dir, name| async move {
                    let perm = if flags.perm == 0 { 0o644 } else { flags.perm };
                    match self.create_in(dir, &name, perm, flags.exclusive, flags.layout.clone()).await {
                        Ok(a) => Ok(Some(a)),
                        // Something else has the name (a directory, a symlink): open it below.
                        Err(e) if e.errno == Errno::EEXIST && !flags.exclusive => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .await?;
            if let Some(attr) = made.filter(|a| a.kind != FileKind::Symlink) {
                return self.finish_open(attr, flags, true, None).await;
            }
        }
        let flags = &flags;
        let (attr, cap) = self
            .on_target(path, true, true, |f, _| async move {
                match f.attr {
                    // The entry's server holds the inode: attributes are fresh already; the
                    // capability comes at the first read or write.
                    Some(a) => Ok((a, None)),
                    None => self.open_fresh(f.ino, flags).await,
                }
            })
            .await?;
        self.finish_open(attr, flags, false, cap).await
    }

    /// Fresh attributes of `ino` from its home server, with a capability for `flags` when
    /// the cluster makes them: one `Open` (which checks the permissions), else one `GetAttr`.
    async fn open_fresh(&self, ino: Ino, flags: &OpenFlags) -> Result<(Attr, Option<(Capability, Instant)>)> {
        if self.map().security.auth != AuthMode::None {
            let at = Instant::now();
            if let Some((attr, cap)) = self.open_rpc(ino, crate::file::rights_of(flags), None).await? {
                return Ok((attr, cap.map(|c| (c, at))));
            }
        }
        Ok((self.getattr_fresh_inner(ino).await?, None))
    }

    /// Open the inode `ino` (attributes fetched afresh; no create).
    pub async fn open_ino(&self, ino: Ino, flags: OpenFlags) -> Result<File> {
        let r = async {
            let (attr, cap) = self.open_fresh(ino, &flags).await?;
            self.finish_open(attr, &flags, false, cap).await
        };
        r.await.map_err(|e: Error| e.within(format_args!("open {ino}")))
    }

    /// A handle on the file that `attr` describes, made without a request: for attributes
    /// that just came from a server, such as the reply to [`Client::create_at`] (a FUSE
    /// mount opens the file it created this way, so a create costs one request instead of
    /// two). Nothing is checked (the caller has checked access), nothing is truncated or
    /// created: only the access mode and `append` of `flags` are used. The handle's size
    /// starts at `attr.size`, so cached attributes would break close-to-open consistency;
    /// use [`Client::open_ino`] for those.
    pub fn open_with_attr(&self, attr: Attr, flags: OpenFlags) -> Result<File> {
        let ino = attr.ino;
        match attr.kind {
            FileKind::Dir if flags.writes() => Err(Error::bare(Errno::EISDIR)),
            FileKind::Symlink => Err(Error::bare(Errno::ELOOP)),
            _ => File::open(self.clone(), attr, &flags),
        }
        .map_err(|e: Error| e.within(format_args!("open {ino}")))
    }

    /// Checks and truncation common to every open. `created`: the attributes come from a
    /// create request, which may have made the file just now; its owner is not checked
    /// (an owner could grant itself the access anyway, and a new file opens whatever its
    /// mode, as with open(2)).
    /// `cap`: the capability an `Open` brought, after the server's permission check.
    async fn finish_open(
        &self,
        mut attr: Attr,
        flags: &OpenFlags,
        created: bool,
        cap: Option<(Capability, Instant)>,
    ) -> Result<File> {
        match attr.kind {
            FileKind::Dir if flags.writes() || flags.truncate => return Err(Error::bare(Errno::EISDIR)),
            FileKind::Dir => return File::open(self.clone(), attr, flags),
            FileKind::Symlink => return Err(Error::bare(Errno::ELOOP)),
            FileKind::File => {}
        }
        let cred = &self.options().cred;
        let mask = flags.access_mask();
        let skip = (created && attr.uid == cred.uid) || cap.is_some();
        if !skip && mask != 0 && !crate::client::may_access(&attr, cred, mask) {
            self.access_inner(attr.ino, mask).await?;
        }
        if flags.truncate && attr.size > 0 {
            attr = self.setattr_inner(attr.ino, SetAttrs { size: Some(0), ..Default::default() }).await?;
        }
        match cap {
            Some(cap) => File::open_with_cap(self.clone(), attr, flags, Some(cap)),
            None => File::open(self.clone(), attr, flags),
        }
    }
}

/// Attributes standing for a directory known only by number (never returned to callers).
pub(crate) fn dir_stub(ino: Ino) -> Attr {
    use shoal_proto::msg::Timestamp;
    Attr {
        ino,
        kind: FileKind::Dir,
        perm: 0,
        uid: 0,
        gid: 0,
        size: 0,
        nlink: 0,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        blocks_bytes: 0,
        layout: None,
        dir_default: None,
        parent: None,
        read_mostly: false,
    }
}
