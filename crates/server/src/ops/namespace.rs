//! Namespace operations, run at the home server of the directory named in the request.
//!
//! Single-server cases (the common ones: a file's inode sits with its entry) are one locked
//! check and one RocksDB batch. Cases that span servers follow the intent pattern of
//! docs/architecture.md: write an intent (pinning the entry), perform the remote step
//! without holding locks, then commit the local change and delete the intent in one batch.
//! The `finish_*` functions are the second halves, shared with the recovery loop.

use super::*;
use crate::error::{fail, is_transport, Fail, R};
use crate::locks::Locks;
use crate::perm::{self, R_OK, S_ISGID, W_OK, X_OK};
use crate::state::{derive_op, State};
use crate::store::meta::{EntryRecord, InodeRecord, Intent, Txn};
use shoal_proto::cap::{RIGHT_READ, RIGHT_WRITE};
use shoal_proto::msg::{
    Cred, DirEntry, EntryOut, FileKind, KeepOpen, LayoutSpec, Op, RenameFlags, Reply, PATH_MAX, READDIR_MAX,
};
use shoal_proto::{Errno, Ino, ROOT_INO};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a check-lock-recheck loop may find its snapshot outdated before giving up.
const ATTEMPTS: usize = 16;
/// How long `PeerRenameIn` waits for a pinned destination name before answering EBUSY
/// (the coordinator then backs off and retries; see `rename_cross`).
const RENAME_IN_PIN_WAIT: Duration = Duration::from_millis(20);

fn entry_reply(ino: Ino, rec: &InodeRecord) -> Reply {
    Reply::Entry(EntryOut { ino, kind: rec.kind, attr: Some(rec.to_attr(ino, 0)), cap: None })
}

fn no_entry(dir: Ino, name: &str) -> Fail {
    Fail::new(Errno::ENOENT, format!("no entry {name:?} in directory {dir}"))
}

fn exists(dir: Ino, name: &str) -> Fail {
    Fail::new(Errno::EEXIST, format!("{name:?} already exists in directory {dir}"))
}

fn busy() -> Fail {
    Fail::new(Errno::EBUSY, "the directory kept changing during the operation; try again")
}

/// Group and mode of a new inode in `parent`: a set-group-id directory passes on its group
/// (and, to subdirectories, the bit itself); a non-member cannot create a set-group-id file.
fn inherit(cred: &Cred, parent: &InodeRecord, perm: u32, kind: FileKind) -> (u32, u32) {
    let mut perm = perm & 0o7777;
    let gid = if parent.perm & S_ISGID != 0 {
        if kind == FileKind::Dir {
            perm |= S_ISGID;
        }
        parent.gid
    } else {
        cred.gid
    };
    if kind != FileKind::Dir && perm & S_ISGID != 0 && cred.uid != 0 && !cred.in_group(gid) {
        perm &= !S_ISGID;
    }
    (gid, perm)
}

fn new_inode(kind: FileKind, perm: u32, uid: u32, gid: u32, now: shoal_proto::msg::Timestamp) -> InodeRecord {
    InodeRecord {
        kind,
        perm,
        uid,
        gid,
        size: 0,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        atime: now,
        mtime: now,
        ctime: now,
        layout: None,
        dir_default: None,
        parent: None,
        target: None,
    }
}

/// Check W+X on a directory for a change of its entries.
fn may_change(cred: &Cred, dir: Ino, rec: &InodeRecord) -> R<()> {
    perm::check(cred, &rec.owner(), W_OK | X_OK).map_err(|e| denied(e, format_args!("directory {dir}")))
}

// ---------------------------------------------------------------------------------------
// lookup, readdir

pub async fn lookup(st: &Arc<State>, cred: Cred, dir: Ino, name: String) -> R<Reply> {
    st.require_home(dir)?;
    name_ok(&name)?;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let d = txn.dir(dir)?;
        perm::check(&cred, &d.owner(), X_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
        let e = txn.entry(dir, &name)?.ok_or_else(|| no_entry(dir, &name))?;
        let attr =
            if st.is_home(e.ino) { txn.inode(e.ino)?.cloned().map(|r| st.attr_of(e.ino, &r, true)) } else { None };
        Ok(Reply::Entry(EntryOut { ino: e.ino, kind: e.kind, attr, cap: None }))
    })
    .await
}

pub async fn readdir(st: &Arc<State>, cred: Cred, dir: Ino, after: Option<String>, limit: u32) -> R<Reply> {
    st.require_home(dir)?;
    let limit = if limit == 0 { READDIR_MAX } else { limit.min(READDIR_MAX) } as usize;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let d = txn.dir(dir)?;
        perm::check(&cred, &d.owner(), R_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
        let (entries, more) = st.meta.list_entries(dir, after.as_deref(), limit)?;
        Ok(Reply::DirEntries { entries, more })
    })
    .await
}

// ---------------------------------------------------------------------------------------
// create, symlink

enum Made {
    New(Ino, InodeRecord),
    Existing(EntryRecord, Option<InodeRecord>),
}

pub async fn create(
    st: &Arc<State>,
    cred: Cred,
    dir: Ino,
    name: String,
    perm: u32,
    exclusive: bool,
    layout: Option<LayoutSpec>,
) -> R<Reply> {
    st.require_home(dir)?;
    name_ok(&name)?;
    // A layout the request asks for must fit the cluster (more servers than there are is
    // refused, not quietly cut down to what exists).
    if let Some(spec) = &layout {
        shoal_placement::check_spec(&st.map, spec).map_err(|m| Fail::new(Errno::EINVAL, m))?;
    }
    let made = {
        let _g = st.locks.lock_names(&[dir], &[(dir, &name)], 0).await?;
        let name = name.clone();
        st.store(move |st| {
            let mut txn = st.meta.txn();
            let now = now();
            let parent = txn.dir(dir)?.clone();
            perm::check(&cred, &parent.owner(), X_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
            if let Some(e) = txn.entry(dir, &name)? {
                if exclusive {
                    return Err(exists(dir, &name));
                }
                if e.kind == FileKind::Dir {
                    return fail(Errno::EISDIR, format!("{name:?} in directory {dir} is a directory"));
                }
                let rec = if st.is_home(e.ino) { txn.inode(e.ino)?.cloned() } else { None };
                return Ok(Made::Existing(e, rec));
            }
            may_change(&cred, dir, &parent)?;
            let ino = st.alloc_ino(st.id)?;
            let layout =
                shoal_placement::resolve_layout(&st.map, ino, st.id, layout.as_ref(), parent.dir_default.as_ref())
                    .map_err(|e| {
                        Fail::new(
                            e,
                            "invalid layout (stripe size must be a multiple of 4 KiB up to 1 GiB, count up to 1024)",
                        )
                    })?;
            let (gid, perm) = inherit(&cred, &parent, perm, FileKind::File);
            let mut rec = new_inode(FileKind::File, perm, cred.uid, gid, now);
            rec.layout = Some(layout);
            txn.put_inode(ino, rec.clone());
            txn.put_entry(dir, &name, EntryRecord { ino, kind: FileKind::File });
            txn.inode_mut(dir)?.touch(now);
            txn.commit()?;
            Ok(Made::New(ino, rec))
        })
        .await?
    };
    match made {
        // The creator may read and write what it just made, whatever its mode (open(2)):
        // the reply carries the capability, so a create-and-write needs no `Open`.
        Made::New(ino, rec) => Ok(Reply::Entry(EntryOut {
            ino,
            kind: rec.kind,
            attr: Some(rec.to_attr(ino, 0)),
            cap: crate::caps::issue(st, ino, RIGHT_READ | RIGHT_WRITE),
        })),
        Made::Existing(e, Some(rec)) => Ok(Reply::Entry(EntryOut {
            ino: e.ino,
            kind: e.kind,
            attr: Some(st.attr_of(e.ino, &rec, false)),
            cap: None,
        })),
        Made::Existing(e, None) => {
            // The inode lives elsewhere (a hard link or a renamed file): ask its home, and
            // if that fails let the client ask.
            let attr = st.getattr(e.ino).await.ok();
            Ok(Reply::Entry(EntryOut { ino: e.ino, kind: e.kind, attr, cap: None }))
        }
    }
}

pub async fn symlink(st: &Arc<State>, cred: Cred, dir: Ino, name: String, target: String) -> R<Reply> {
    st.require_home(dir)?;
    name_ok(&name)?;
    if target.len() > PATH_MAX {
        return fail(
            Errno::ENAMETOOLONG,
            format!("symlink target of {} bytes is longer than {PATH_MAX}", target.len()),
        );
    }
    if target.is_empty() || target.contains('\0') {
        return fail(Errno::ENOENT, "symlink target is empty or contains NUL");
    }
    let _g = st.locks.lock_names(&[dir], &[(dir, &name)], 0).await?;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let now = now();
        let parent = txn.dir(dir)?.clone();
        may_change(&cred, dir, &parent)?;
        if txn.entry(dir, &name)?.is_some() {
            return Err(exists(dir, &name));
        }
        let ino = st.alloc_ino(st.id)?;
        let (gid, _) = inherit(&cred, &parent, 0o777, FileKind::Symlink);
        let mut rec = new_inode(FileKind::Symlink, 0o777, cred.uid, gid, now);
        rec.size = target.len() as u64;
        rec.target = Some(target);
        txn.put_inode(ino, rec.clone());
        txn.put_entry(dir, &name, EntryRecord { ino, kind: FileKind::Symlink });
        txn.inode_mut(dir)?.touch(now);
        txn.commit()?;
        Ok(entry_reply(ino, &rec))
    })
    .await
}

// ---------------------------------------------------------------------------------------
// mkdir

pub async fn mkdir(st: &Arc<State>, cred: Cred, dir: Ino, name: String, perm: u32) -> R<Reply> {
    st.require_home(dir)?;
    name_ok(&name)?;
    let op_id = st.new_op_id();
    let _active = st.activate(op_id);
    let g = st.locks.lock_names(&[dir], &[(dir, &name)], 0).await?;
    let n2 = name.clone();
    let (ino, rec, local) = st
        .store(move |st| {
            let mut txn = st.meta.txn();
            let now = now();
            let parent = txn.dir(dir)?.clone();
            may_change(&cred, dir, &parent)?;
            if txn.entry(dir, &n2)?.is_some() {
                return Err(exists(dir, &n2));
            }
            let ino = st.alloc_ino(st.next_dir_home(dir))?;
            let (gid, perm) = inherit(&cred, &parent, perm, FileKind::Dir);
            let mut rec = new_inode(FileKind::Dir, perm, cred.uid, gid, now);
            rec.parent = Some(dir);
            rec.dir_default = parent.dir_default.clone();
            let local = st.is_home(ino);
            if local {
                txn.put_inode(ino, rec.clone());
                txn.put_entry(dir, &n2, EntryRecord { ino, kind: FileKind::Dir });
                dir_nlink_inc(&mut txn, dir)?;
                txn.inode_mut(dir)?.touch(now);
            } else {
                txn.put_intent(op_id, Intent::Mkdir { dir, name: n2, ino }, now.secs);
            }
            txn.commit()?;
            Ok((ino, rec, local))
        })
        .await?;
    if local {
        return Ok(entry_reply(ino, &rec));
    }
    st.locks.pin(dir, &name, op_id);
    drop(g);
    let home = st.home(ino);
    let res = st.peer(home, Op::PeerMkdirObject { attr: rec.to_attr(ino, 0), op_id }).await;
    let out = match res {
        Ok(_) => {
            let committed = {
                let _g = st.locks.lock(&[dir]).await;
                let n2 = name.clone();
                st.store(move |st| {
                    let mut txn = st.meta.txn();
                    let now = now();
                    // The parent may have been removed while the object was being made.
                    if txn.inode(dir)?.is_none() {
                        return Ok(false);
                    }
                    txn.put_entry(dir, &n2, EntryRecord { ino, kind: FileKind::Dir });
                    dir_nlink_inc(&mut txn, dir)?;
                    txn.inode_mut(dir)?.touch(now);
                    txn.delete_intent(op_id);
                    txn.commit()?;
                    Ok(true)
                })
                .await
            };
            match committed {
                Ok(true) => Ok(entry_reply(ino, &rec)),
                Ok(false) => {
                    if let Err(e) = rollback_mkdir(st, op_id, ino).await {
                        tracing::info!("rollback of mkdir {name:?} left for recovery: {e}");
                    }
                    Err(Fail::new(Errno::ENOENT, format!("directory {dir} was removed")))
                }
                // The intent stays: recovery rolls the mkdir back.
                Err(e) => Err(e),
            }
        }
        // Outcome unknown: the intent stays and recovery removes the object if it exists.
        Err(e) if is_transport(e) => Err(Fail::peer(home, e)),
        Err(e) => {
            delete_intent(st, op_id).await?;
            Err(Fail::peer(home, e))
        }
    };
    st.locks.unpin(dir, &name, op_id);
    out
}

/// Undo a mkdir whose entry was not committed: remove the directory object, drop the intent.
pub async fn rollback_mkdir(st: &Arc<State>, op_id: u64, ino: Ino) -> R<()> {
    let home = st.home(ino);
    match st.peer(home, Op::PeerRmdirObject { ino, op_id: derive_op(op_id, 1) }).await {
        Ok(_) => {}
        Err(e) if is_transport(e) || e == Errno::EIO => return Err(Fail::peer(home, e)),
        Err(e) => tracing::warn!("rolling back mkdir of {ino}: server {home} answered {e}; dropping the intent"),
    }
    delete_intent(st, op_id).await
}

// ---------------------------------------------------------------------------------------
// link

pub async fn link(st: &Arc<State>, cred: Cred, ino: Ino, dir: Ino, name: String) -> R<Reply> {
    st.require_home(dir)?;
    name_ok(&name)?;
    if st.is_home(ino) {
        let _g = st.locks.lock_names(&[dir, ino], &[(dir, &name)], 0).await?;
        return st
            .store(move |st| {
                let mut txn = st.meta.txn();
                let now = now();
                let parent = txn.dir(dir)?.clone();
                may_change(&cred, dir, &parent)?;
                if txn.entry(dir, &name)?.is_some() {
                    return Err(exists(dir, &name));
                }
                let rec = txn.inode_mut(ino)?;
                if rec.kind == FileKind::Dir {
                    return fail(Errno::EPERM, format!("{ino} is a directory; directories cannot be hard-linked"));
                }
                if rec.nlink == u32::MAX {
                    return fail(Errno::EMLINK, format!("{ino} has too many links"));
                }
                if rec.nlink == 0 {
                    // An orphan (open, no name left): as Linux, no new name for it.
                    return fail(Errno::ENOENT, format!("{ino} has no name left (removed while open)"));
                }
                rec.nlink += 1;
                rec.ctime = now;
                let rec = rec.clone();
                txn.put_entry(dir, &name, EntryRecord { ino, kind: rec.kind });
                txn.inode_mut(dir)?.touch(now);
                txn.commit()?;
                Ok(Reply::Entry(EntryOut { ino, kind: rec.kind, attr: Some(rec.to_attr(ino, 0)), cap: None }))
            })
            .await;
    }

    // The inode lives elsewhere: learn its kind (refusing directories early), then
    // intent → PeerLinkDelta(+1) → entry.
    let mut attr = st.getattr(ino).await?;
    if attr.kind == FileKind::Dir {
        return fail(Errno::EPERM, format!("{ino} is a directory; directories cannot be hard-linked"));
    }
    let kind = attr.kind;
    let op_id = st.new_op_id();
    let _active = st.activate(op_id);
    {
        let _g = st.locks.lock_names(&[dir], &[(dir, &name)], 0).await?;
        let n2 = name.clone();
        st.store(move |st| {
            let mut txn = st.meta.txn();
            let parent = txn.dir(dir)?.clone();
            may_change(&cred, dir, &parent)?;
            if txn.entry(dir, &n2)?.is_some() {
                return Err(exists(dir, &n2));
            }
            txn.put_intent(op_id, Intent::Link { dir, name: n2, ino, kind }, now().secs);
            txn.commit()
        })
        .await?;
        st.locks.pin(dir, &name, op_id);
    }
    let home = st.home(ino);
    match st.peer(home, Op::PeerLinkDelta { ino, delta: 1, op_id, orphan_of: None }).await {
        Ok(reply) => {
            let committed = finish_link(st, op_id, dir, &name, ino, kind).await;
            st.locks.unpin(dir, &name, op_id);
            if !committed? {
                return fail(Errno::ENOENT, format!("directory {dir} was removed or {name:?} was taken"));
            }
            if let Reply::NLink(n) = reply {
                attr.nlink = n;
            }
            attr.ctime = now();
            Ok(Reply::Entry(EntryOut { ino, kind, attr: Some(attr), cap: None }))
        }
        Err(e) if is_transport(e) => Err(Fail::peer(home, e)), // intent and pin stay: rolled forward
        Err(e) => {
            let r = delete_intent(st, op_id).await;
            st.locks.unpin(dir, &name, op_id);
            r?;
            Err(Fail::peer(home, e))
        }
    }
}

/// Second half of a cross-server link, after `PeerLinkDelta(+1)` succeeded: commit the entry,
/// or, if the directory went away or the name was taken, take the link back. Returns whether
/// the entry was committed. The caller unpins.
pub async fn finish_link(st: &Arc<State>, op_id: u64, dir: Ino, name: &str, ino: Ino, kind: FileKind) -> R<bool> {
    let committed = {
        let _g = st.locks.lock_names(&[dir], &[(dir, name)], op_id).await?;
        let name = name.to_string();
        st.store(move |st| {
            let mut txn = st.meta.txn();
            let now = now();
            let usable = matches!(txn.inode(dir)?, Some(r) if r.kind == FileKind::Dir);
            if !usable || txn.entry(dir, &name)?.is_some() {
                return Ok(false);
            }
            txn.put_entry(dir, &name, EntryRecord { ino, kind });
            txn.inode_mut(dir)?.touch(now);
            txn.delete_intent(op_id);
            txn.commit()?;
            Ok(true)
        })
        .await?
    };
    if !committed {
        let home = st.home(ino);
        match st.peer(home, Op::PeerLinkDelta { ino, delta: -1, op_id: derive_op(op_id, 1), orphan_of: None }).await {
            Ok(_) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(Fail::peer(home, e)),
        }
        delete_intent(st, op_id).await?;
    }
    Ok(committed)
}

// ---------------------------------------------------------------------------------------
// unlink

enum Unlinked {
    Local(Option<crate::store::meta::GcRecord>, Ino),
    /// (inode, session keeping it open)
    Remote(Ino, Option<u64>),
    /// The entry's inode is here but its stripe was busy: lock it too and run again.
    Relock(Ino),
}

/// Inodes whose stripes an unlink-like step locks: the directory, and the entry's inode if
/// it is expected here.
fn stripe_set(st: &State, dir: Ino, child: Option<Ino>) -> Vec<Ino> {
    let mut inos = vec![dir];
    inos.extend(child.filter(|&c| st.is_home(c)));
    inos
}

/// `keep`: the client has a file open; if the name is that file's last, the file becomes
/// the client session's orphan (at its home, which may be another server) instead of going.
pub async fn unlink(st: &Arc<State>, cred: Cred, dir: Ino, name: String, keep: Option<KeepOpen>) -> R<Reply> {
    st.require_home(dir)?;
    name_ok(&name)?;
    let mut known = Known::new();
    // The entry's inode as last seen; its stripe is locked with the directory's. The first
    // attempt locks only the directory and takes the inode's stripe with try_lock (one
    // storage round trip in the common case).
    let mut expect: Option<Ino> = None;
    for _ in 0..ATTEMPTS {
        let inos = stripe_set(st, dir, expect);
        let op_id = st.new_op_id();
        let active = st.activate(op_id);
        let step = {
            let _g = st.locks.lock_names(&inos, &[(dir, &name)], 0).await?;
            let (n2, cred, known) = (name.clone(), cred.clone(), known.clone());
            st.store(move |st| {
                let mut txn = st.meta.txn();
                let now = now();
                let d = txn.dir(dir)?.owner();
                perm::check(&cred, &d, W_OK | X_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
                let e = txn.entry(dir, &n2)?.ok_or_else(|| no_entry(dir, &n2))?;
                if e.kind == FileKind::Dir {
                    return fail(Errno::EISDIR, format!("{n2:?} in directory {dir} is a directory"));
                }
                let local = st.is_home(e.ino);
                let _child = if local && !Locks::covers(&inos, e.ino) {
                    match st.locks.try_lock(e.ino) {
                        Some(g) => Some(g),
                        None => return Ok(Step::Done(Unlinked::Relock(e.ino))),
                    }
                } else {
                    None
                };
                if perm::sticky_needs_owner(&cred, &d) {
                    let o = owner_or_need!(st, &mut txn, &known, e.ino);
                    if !perm::sticky_allows(&cred, &d, o.uid) {
                        return fail(Errno::EPERM, format!("directory {dir} is sticky and {n2:?} is not yours"));
                    }
                }
                txn.delete_entry(dir, &n2);
                txn.inode_mut(dir)?.touch(now);
                let orphan_of = keeper(keep, e.ino);
                let out = if local {
                    Unlinked::Local(drop_link(&mut txn, e.ino, now, orphan_of)?, e.ino)
                } else {
                    txn.put_intent(op_id, unlink_intent(e.ino, orphan_of), now.secs);
                    Unlinked::Remote(e.ino, orphan_of)
                };
                txn.commit()?;
                Ok(Step::Done(out))
            })
            .await?
        };
        match step {
            Step::Done(Unlinked::Local(gc, ino)) => {
                if let Some(g) = gc {
                    st.queue_gc(ino, g);
                }
                return Ok(Reply::Ok);
            }
            Step::Done(Unlinked::Remote(ino, orphan_of)) => {
                // The name is gone (committed); the link count drop is rolled forward by
                // recovery if the inode's home cannot be reached now.
                if let Err(e) = finish_unlink(st, op_id, ino, orphan_of).await {
                    tracing::info!("link count drop of {ino} left for recovery: {e}");
                }
                drop(active);
                return Ok(Reply::Ok);
            }
            Step::Done(Unlinked::Relock(ino)) => expect = Some(ino),
            Step::Need(ino) => fetch_owner(st, &mut known, ino).await?,
            Step::Retry => {}
        }
    }
    Err(busy())
}

/// The session that keeps the entry's inode `ino` open, if `keep` names that inode (the
/// client's idea of which file the name was may be stale: then the file is not its).
pub fn keeper(keep: Option<KeepOpen>, ino: Ino) -> Option<u64> {
    keep.filter(|k| k.ino == ino).map(|k| k.session)
}

/// The intent of a link count drop on another server.
pub fn unlink_intent(ino: Ino, orphan_of: Option<u64>) -> Intent {
    match orphan_of {
        Some(session) => Intent::UnlinkKeep { ino, session },
        None => Intent::Unlink { ino },
    }
}

/// Drop one link of a remote inode (an `Unlink`/`UnlinkKeep` intent) and delete the intent.
pub async fn finish_unlink(st: &Arc<State>, op_id: u64, ino: Ino, orphan_of: Option<u64>) -> R<()> {
    let home = st.home(ino);
    match st.peer(home, Op::PeerLinkDelta { ino, delta: -1, op_id, orphan_of }).await {
        Ok(_) | Err(Errno::ENOENT) => {}
        Err(e) if is_transport(e) || e == Errno::EIO => return Err(Fail::peer(home, e)),
        Err(e) => tracing::warn!("dropping a link of {ino}: server {home} answered {e}; giving up"),
    }
    delete_intent(st, op_id).await
}

/// Set a remote directory's parent pointer (a `SetParent` intent) and delete the intent.
pub async fn finish_set_parent(st: &Arc<State>, op_id: u64, ino: Ino, parent: Ino) -> R<()> {
    let home = st.home(ino);
    match st.peer(home, Op::PeerSetParent { ino, parent }).await {
        Ok(_) | Err(Errno::ENOENT) => {}
        Err(e) if is_transport(e) || e == Errno::EIO => return Err(Fail::peer(home, e)),
        Err(e) => tracing::warn!("setting the parent of {ino}: server {home} answered {e}; giving up"),
    }
    delete_intent(st, op_id).await
}

// ---------------------------------------------------------------------------------------
// rmdir

enum Removed {
    Local,
    /// The directory object lives elsewhere; an Rmdir intent was written.
    Remote(Ino),
    Relock(Ino),
}

pub async fn rmdir(st: &Arc<State>, cred: Cred, dir: Ino, name: String) -> R<Reply> {
    st.require_home(dir)?;
    name_ok(&name)?;
    let mut known = Known::new();
    let mut expect: Option<Ino> = None;
    for _ in 0..ATTEMPTS {
        let inos = stripe_set(st, dir, expect);
        let op_id = st.new_op_id();
        let _active = st.activate(op_id);
        let g = st.locks.lock_names(&inos, &[(dir, &name)], 0).await?;
        let (n2, c2, k2) = (name.clone(), cred.clone(), known.clone());
        let step = st
            .store(move |st| {
                let (cred, known) = (c2, k2);
                let mut txn = st.meta.txn();
                let now = now();
                let d = txn.dir(dir)?.owner();
                perm::check(&cred, &d, W_OK | X_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
                let e = txn.entry(dir, &n2)?.ok_or_else(|| no_entry(dir, &n2))?;
                if e.kind != FileKind::Dir {
                    return fail(Errno::ENOTDIR, format!("{n2:?} in directory {dir} is not a directory"));
                }
                let local = st.is_home(e.ino);
                let _child = if local && !Locks::covers(&inos, e.ino) {
                    match st.locks.try_lock(e.ino) {
                        Some(g) => Some(g),
                        None => return Ok(Step::Done(Removed::Relock(e.ino))),
                    }
                } else {
                    None
                };
                if perm::sticky_needs_owner(&cred, &d) {
                    let o = owner_or_need!(st, &mut txn, &known, e.ino);
                    if !perm::sticky_allows(&cred, &d, o.uid) {
                        return fail(Errno::EPERM, format!("directory {dir} is sticky and {n2:?} is not yours"));
                    }
                }
                if local {
                    if st.meta.has_entries(e.ino)? {
                        return fail(Errno::ENOTEMPTY, format!("directory {n2:?} is not empty"));
                    }
                    txn.remove_inode(e.ino)?;
                    txn.delete_entry(dir, &n2);
                    dir_nlink_dec(&mut txn, dir)?;
                    txn.inode_mut(dir)?.touch(now);
                    txn.commit()?;
                    Ok(Step::Done(Removed::Local))
                } else {
                    txn.put_intent(op_id, Intent::Rmdir { dir, name: n2, ino: e.ino }, now.secs);
                    txn.commit()?;
                    Ok(Step::Done(Removed::Remote(e.ino)))
                }
            })
            .await?;
        match step {
            Step::Done(Removed::Local) => return Ok(Reply::Ok),
            Step::Done(Removed::Remote(child)) => {
                st.locks.pin(dir, &name, op_id);
                drop(g);
                let home = st.home(child);
                return match st.peer(home, Op::PeerRmdirObject { ino: child, op_id }).await {
                    Ok(_) => {
                        let r = finish_rmdir(st, op_id, dir, &name, child).await;
                        st.locks.unpin(dir, &name, op_id);
                        r.map(|_| Reply::Ok)
                    }
                    Err(e) if is_transport(e) => Err(Fail::peer(home, e)), // recovery retries
                    Err(e) => {
                        let r = delete_intent(st, op_id).await;
                        st.locks.unpin(dir, &name, op_id);
                        r?;
                        Err(Fail::peer(home, e))
                    }
                };
            }
            Step::Done(Removed::Relock(ino)) => expect = Some(ino),
            Step::Need(ino) => {
                drop(g);
                fetch_owner(st, &mut known, ino).await?
            }
            Step::Retry => {}
        }
    }
    Err(busy())
}

/// Second half of removing a remote directory object: the entry `dir/name` goes if it still
/// names `ino` (with the parent's link count), and the intent with it. The caller unpins.
pub async fn finish_rmdir(st: &Arc<State>, op_id: u64, dir: Ino, name: &str, ino: Ino) -> R<()> {
    let _g = st.locks.lock_names(&[dir], &[(dir, name)], op_id).await?;
    let name = name.to_string();
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let now = now();
        if txn.entry(dir, &name)?.is_some_and(|e| e.ino == ino) {
            txn.delete_entry(dir, &name);
            if txn.inode(dir)?.is_some() {
                dir_nlink_dec(&mut txn, dir)?;
                txn.inode_mut(dir)?.touch(now);
            }
        }
        txn.delete_intent(op_id);
        txn.commit()
    })
    .await
}

// ---------------------------------------------------------------------------------------
// rename

/// EINVAL if `moving` is `start` or one of its ancestors (a directory cannot move into its
/// own subtree). Walks parent pointers up to the root, asking other servers for theirs.
async fn check_not_ancestor(st: &Arc<State>, moving: Ino, start: Ino) -> R<()> {
    let mut cur = start;
    for _ in 0..4096 {
        if cur == moving {
            return fail(Errno::EINVAL, format!("cannot move directory {moving} into its own subtree"));
        }
        if cur == ROOT_INO {
            return Ok(());
        }
        let parent = st.getattr(cur).await?.parent.unwrap_or(ROOT_INO);
        if parent == cur {
            return Ok(());
        }
        cur = parent;
    }
    fail(Errno::ELOOP, format!("directory {start} is nested too deeply (or its parents loop)"))
}

/// What a locked rename (or rename-in) step needs before it can commit.
enum Ren<T> {
    Step(Step<T>),
    /// The replaced target is an empty-to-be directory homed elsewhere: remove it first.
    RmdirTarget(Ino),
}

impl<T> From<Step<T>> for Ren<T> {
    fn from(s: Step<T>) -> Self {
        Ren::Step(s)
    }
}

/// Take out the target `t` of a rename into `dst_dir` (not an exchange): an empty directory
/// goes (locally, or — already — remotely through `rmdir_done`), a file loses a link (and
/// becomes an orphan of the session in `keep` if that is its last and `keep` names it).
#[allow(clippy::too_many_arguments)]
fn replace_target(
    st: &State,
    txn: &mut Txn<'_>,
    after: &mut After,
    dst_dir: Ino,
    t: EntryRecord,
    rmdir_done: Option<(Ino, u64)>,
    unlink_op: u64,
    now: shoal_proto::msg::Timestamp,
    keep: Option<KeepOpen>,
) -> R<Option<Ino>> {
    if t.kind == FileKind::Dir {
        if st.is_home(t.ino) {
            if st.meta.has_entries(t.ino)? {
                return fail(Errno::ENOTEMPTY, format!("target directory {} is not empty", t.ino));
            }
            txn.remove_inode(t.ino)?;
        } else {
            match rmdir_done {
                Some((ino, rop)) if ino == t.ino => txn.delete_intent(rop),
                _ => return Ok(Some(t.ino)),
            }
        }
        dir_nlink_dec(txn, dst_dir)?;
    } else if st.is_home(t.ino) {
        if let Some(g) = drop_link(txn, t.ino, now, keeper(keep, t.ino))? {
            after.gc.push((t.ino, g));
        }
    } else {
        let orphan_of = keeper(keep, t.ino);
        txn.put_intent(unlink_op, unlink_intent(t.ino, orphan_of), now.secs);
        after.unlinks.push((unlink_op, t.ino, orphan_of));
    }
    Ok(None)
}

/// Point a moved directory at its new parent: in place if its inode is here, else through a
/// `SetParent` intent acted on after the commit.
fn set_parent(
    st: &State,
    txn: &mut Txn<'_>,
    after: &mut After,
    ino: Ino,
    parent: Ino,
    op: u64,
    now: shoal_proto::msg::Timestamp,
) -> R<()> {
    if st.is_home(ino) {
        if txn.inode(ino)?.is_some() {
            let r = txn.inode_mut(ino)?;
            r.parent = Some(parent);
            r.ctime = now;
        }
    } else {
        txn.put_intent(op, Intent::SetParent { ino, parent }, now.secs);
        after.set_parents.push((op, ino, parent));
    }
    Ok(())
}

/// The checks a rename makes on an existing target `t` for source `se`.
fn check_target(se: &EntryRecord, t: &EntryRecord, flags: RenameFlags, dir: Ino, name: &str) -> R<()> {
    if flags.noreplace {
        return Err(exists(dir, name));
    }
    if !flags.exchange {
        if se.kind == FileKind::Dir && t.kind != FileKind::Dir {
            return fail(Errno::ENOTDIR, format!("cannot replace non-directory {name:?} with a directory"));
        }
        if se.kind != FileKind::Dir && t.kind == FileKind::Dir {
            return fail(Errno::EISDIR, format!("cannot replace directory {name:?} with a non-directory"));
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub async fn rename(
    st: &Arc<State>,
    cred: Cred,
    src_dir: Ino,
    src_name: String,
    dst_dir: Ino,
    dst_name: String,
    flags: RenameFlags,
    keep: Option<KeepOpen>,
) -> R<Reply> {
    st.require_home(src_dir)?;
    name_ok(&src_name)?;
    name_ok(&dst_name)?;
    if flags.exchange && flags.noreplace {
        return fail(Errno::EINVAL, "RENAME_EXCHANGE and RENAME_NOREPLACE together");
    }
    let same_server = st.is_home(dst_dir);
    if flags.exchange && !same_server {
        return fail(Errno::EXDEV, "exchanging entries of directories on different servers is not supported");
    }
    if same_server {
        rename_local(st, cred, src_dir, src_name, dst_dir, dst_name, flags, keep).await
    } else {
        rename_cross(st, cred, src_dir, src_name, dst_dir, dst_name, flags.noreplace, keep).await
    }
}

#[allow(clippy::too_many_arguments)]
async fn rename_local(
    st: &Arc<State>,
    cred: Cred,
    src_dir: Ino,
    src_name: String,
    dst_dir: Ino,
    dst_name: String,
    flags: RenameFlags,
    keep: Option<KeepOpen>,
) -> R<Reply> {
    let op_id = st.new_op_id();
    let mut known = Known::new();
    // Set once the replaced remote target directory has been removed: (its ino, the op id
    // of the Rmdir intent, which also owns the pins of both names).
    let mut rmdir_done: Option<(Ino, u64)> = None;
    let result = async {
        for _ in 0..ATTEMPTS {
            let (s1, d1) = (src_name.clone(), dst_name.clone());
            let (se, te) =
                st.store(move |st| Ok((st.meta.get_entry(src_dir, &s1)?, st.meta.get_entry(dst_dir, &d1)?))).await?;
            let se = se.ok_or_else(|| no_entry(src_dir, &src_name))?;
            if (src_dir == dst_dir && src_name == dst_name) || te.is_some_and(|t| t.ino == se.ino) {
                // Same entry, or two names of one file: nothing to do (POSIX).
                return Ok(Reply::Ok);
            }
            if src_dir != dst_dir {
                if se.kind == FileKind::Dir {
                    check_not_ancestor(st, se.ino, dst_dir).await?;
                }
                if let Some(t) = te.filter(|t| flags.exchange && t.kind == FileKind::Dir) {
                    check_not_ancestor(st, t.ino, src_dir).await?;
                }
            }
            let mut inos = vec![src_dir, dst_dir];
            inos.extend([Some(se.ino), te.map(|t| t.ino)].into_iter().flatten().filter(|&i| st.is_home(i)));
            let owner = rmdir_done.map_or(0, |(_, rop)| rop);
            let g = st.locks.lock_names(&inos, &[(src_dir, &src_name), (dst_dir, &dst_name)], owner).await?;
            let (s1, d1, c1, k1) = (src_name.clone(), dst_name.clone(), cred.clone(), known.clone());
            let (snap_s, snap_t) = (se.ino, te.map(|t| t.ino));
            let step = st
                .store(move |st| -> R<Ren<After>> {
                    let (src_name, dst_name, cred, known) = (s1, d1, c1, k1);
                    let mut txn = st.meta.txn();
                    let now = now();
                    let sd = txn.dir(src_dir)?.owner();
                    let dd = txn.dir(dst_dir)?.owner();
                    perm::check(&cred, &sd, W_OK | X_OK).map_err(|e| denied(e, format_args!("directory {src_dir}")))?;
                    perm::check(&cred, &dd, W_OK | X_OK).map_err(|e| denied(e, format_args!("directory {dst_dir}")))?;
                    let se = txn.entry(src_dir, &src_name)?.ok_or_else(|| no_entry(src_dir, &src_name))?;
                    let te = txn.entry(dst_dir, &dst_name)?;
                    if se.ino != snap_s || te.map(|t| t.ino) != snap_t {
                        return Ok(Step::Retry.into());
                    }
                    if te.is_some_and(|t| t.ino == se.ino) {
                        return Ok(Step::Done(After::default()).into());
                    }
                    if flags.exchange && te.is_none() {
                        return Err(no_entry(dst_dir, &dst_name));
                    }
                    if let Some(t) = &te {
                        check_target(&se, t, flags, dst_dir, &dst_name)?;
                    }
                    if perm::sticky_needs_owner(&cred, &sd) {
                        let o = owner_or_need!(st, &mut txn, &known, se.ino);
                        if !perm::sticky_allows(&cred, &sd, o.uid) {
                            return fail(
                                Errno::EPERM,
                                format!("directory {src_dir} is sticky and {src_name:?} is not yours"),
                            );
                        }
                    }
                    if let Some(t) = te {
                        if perm::sticky_needs_owner(&cred, &dd) {
                            let o = owner_or_need!(st, &mut txn, &known, t.ino);
                            if !perm::sticky_allows(&cred, &dd, o.uid) {
                                return fail(
                                    Errno::EPERM,
                                    format!("directory {dst_dir} is sticky and {dst_name:?} is not yours"),
                                );
                            }
                        }
                    }
                    // A directory moving to another parent has its ".." rewritten: that needs
                    // write permission on it.
                    if src_dir != dst_dir && cred.uid != 0 {
                        let moving = [Some(se), te.filter(|_| flags.exchange)];
                        for m in moving.into_iter().flatten().filter(|m| m.kind == FileKind::Dir) {
                            let o = owner_or_need!(st, &mut txn, &known, m.ino);
                            perm::check(&cred, &o, W_OK).map_err(|e| denied(e, format_args!("directory {}", m.ino)))?;
                        }
                    }
                    let mut after = After::default();
                    if let (Some(t), false) = (te, flags.exchange) {
                        if let Some(need) = replace_target(
                            st,
                            &mut txn,
                            &mut after,
                            dst_dir,
                            t,
                            rmdir_done,
                            derive_op(op_id, 2),
                            now,
                            keep,
                        )? {
                            return Ok(Ren::RmdirTarget(need));
                        }
                    }
                    txn.delete_entry(src_dir, &src_name);
                    txn.put_entry(dst_dir, &dst_name, se);
                    if flags.exchange {
                        if let Some(t) = te {
                            txn.put_entry(src_dir, &src_name, t);
                        }
                    }
                    if src_dir != dst_dir {
                        if se.kind == FileKind::Dir {
                            dir_nlink_dec(&mut txn, src_dir)?;
                            dir_nlink_inc(&mut txn, dst_dir)?;
                            set_parent(st, &mut txn, &mut after, se.ino, dst_dir, derive_op(op_id, 3), now)?;
                        }
                        if let Some(t) = te.filter(|t| flags.exchange && t.kind == FileKind::Dir) {
                            dir_nlink_dec(&mut txn, dst_dir)?;
                            dir_nlink_inc(&mut txn, src_dir)?;
                            set_parent(st, &mut txn, &mut after, t.ino, src_dir, derive_op(op_id, 4), now)?;
                        }
                    }
                    // ctime of the moved inodes (when held here).
                    let moved = [Some(se), te.filter(|_| flags.exchange)];
                    for m in moved.into_iter().flatten() {
                        if st.is_home(m.ino) && txn.inode(m.ino)?.is_some() {
                            txn.inode_mut(m.ino)?.ctime = now;
                        }
                    }
                    txn.inode_mut(src_dir)?.touch(now);
                    txn.inode_mut(dst_dir)?.touch(now);
                    txn.commit()?;
                    Ok(Step::Done(after).into())
                })
                .await?;
            match step {
                Ren::Step(Step::Done(after)) => {
                    drop(g);
                    after.run(st).await;
                    return Ok(Reply::Ok);
                }
                Ren::Step(Step::Retry) => {}
                Ren::Step(Step::Need(ino)) => {
                    drop(g);
                    fetch_owner(st, &mut known, ino).await?;
                }
                Ren::RmdirTarget(tino) => {
                    // Remove the (remote) target directory before committing, holding both
                    // names pinned; its Rmdir intent is deleted by the rename's commit.
                    let rop = derive_op(op_id, 5);
                    let (d1, pinned_dst) = (dst_name.clone(), dst_name.clone());
                    st.store(move |st| {
                        let mut txn = st.meta.txn();
                        txn.put_intent(rop, Intent::Rmdir { dir: dst_dir, name: d1, ino: tino }, now().secs);
                        txn.commit()
                    })
                    .await?;
                    st.locks.pin(src_dir, &src_name, rop);
                    st.locks.pin(dst_dir, &pinned_dst, rop);
                    drop(g);
                    rmdir_done = Some((tino, rop));
                    let home = st.home(tino);
                    match st.peer(home, Op::PeerRmdirObject { ino: tino, op_id: rop }).await {
                        Ok(_) => {}
                        Err(e) if is_transport(e) => {
                            // Recovery finishes the rmdir (removing the target entry).
                            st.locks.unpin(src_dir, &src_name, rop);
                            rmdir_done = None;
                            return Err(Fail::peer(home, e));
                        }
                        Err(e) => {
                            rmdir_done = None;
                            let r = delete_intent(st, rop).await;
                            st.locks.unpin(src_dir, &src_name, rop);
                            st.locks.unpin(dst_dir, &dst_name, rop);
                            r?;
                            return Err(Fail::peer(home, e));
                        }
                    }
                }
            }
        }
        Err(busy())
    }
    .await;
    if let Some((tino, rop)) = rmdir_done {
        if result.is_err() {
            // The target directory is gone but the rename did not commit: remove its entry.
            if let Err(e) = finish_rmdir(st, rop, dst_dir, &dst_name, tino).await {
                tracing::warn!("removing the entry of removed directory {tino}: {e}");
            }
        }
        st.locks.unpin(src_dir, &src_name, rop);
        st.locks.unpin(dst_dir, &dst_name, rop);
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn rename_cross(
    st: &Arc<State>,
    cred: Cred,
    src_dir: Ino,
    src_name: String,
    dst_dir: Ino,
    dst_name: String,
    noreplace: bool,
    keep: Option<KeepOpen>,
) -> R<Reply> {
    let mut known = Known::new();
    let deadline = Instant::now() + crate::locks::PIN_WAIT;
    let mut attempts = 0;
    loop {
        attempts += 1;
        if attempts > ATTEMPTS * 8 {
            return Err(busy());
        }
        let s1 = src_name.clone();
        let se = st.store(move |st| st.meta.get_entry(src_dir, &s1)).await?;
        let se = se.ok_or_else(|| no_entry(src_dir, &src_name))?;
        if se.kind == FileKind::Dir {
            check_not_ancestor(st, se.ino, dst_dir).await?;
        }
        let op_id = st.new_op_id();
        let _active = st.activate(op_id);
        let mut inos = vec![src_dir];
        inos.extend(Some(se.ino).filter(|&i| st.is_home(i)));
        let g = st.locks.lock_names(&inos, &[(src_dir, &src_name)], 0).await?;
        let (s1, d1, c1, k1) = (src_name.clone(), dst_name.clone(), cred.clone(), known.clone());
        let snap = se.ino;
        let step = st
            .store(move |st| {
                let (src_name, dst_name, cred, known) = (s1, d1, c1, k1);
                let mut txn = st.meta.txn();
                let sd = txn.dir(src_dir)?.owner();
                perm::check(&cred, &sd, W_OK | X_OK).map_err(|e| denied(e, format_args!("directory {src_dir}")))?;
                let se = txn.entry(src_dir, &src_name)?.ok_or_else(|| no_entry(src_dir, &src_name))?;
                if se.ino != snap {
                    return Ok(Step::Retry);
                }
                if perm::sticky_needs_owner(&cred, &sd) {
                    let o = owner_or_need!(st, &mut txn, &known, se.ino);
                    if !perm::sticky_allows(&cred, &sd, o.uid) {
                        return fail(
                            Errno::EPERM,
                            format!("directory {src_dir} is sticky and {src_name:?} is not yours"),
                        );
                    }
                }
                if se.kind == FileKind::Dir && cred.uid != 0 {
                    let o = owner_or_need!(st, &mut txn, &known, se.ino);
                    perm::check(&cred, &o, W_OK).map_err(|e| denied(e, format_args!("directory {}", se.ino)))?;
                }
                let intent =
                    Intent::Rename { src_dir, src_name, dst_dir, dst_name, ino: se.ino, kind: se.kind, noreplace };
                txn.put_intent(op_id, intent, now().secs);
                txn.commit()?;
                Ok(Step::Done(se))
            })
            .await?;
        let se = match step {
            Step::Done(se) => se,
            Step::Need(ino) => {
                drop(g);
                fetch_owner(st, &mut known, ino).await?;
                continue;
            }
            Step::Retry => continue,
        };
        st.locks.pin(src_dir, &src_name, op_id);
        drop(g);
        let home = st.home(dst_dir);
        let entry = DirEntry { name: dst_name.clone(), ino: se.ino, kind: se.kind };
        let op = Op::PeerRenameIn { dst_dir, dst_name: dst_name.clone(), entry, noreplace, op_id, keep };
        return match st.peer_as(home, &cred, op).await {
            Ok(Reply::Replaced(Some(old))) if old.ino == se.ino => {
                // Both names were links of one file: nothing to do (POSIX).
                let r = delete_intent(st, op_id).await;
                st.locks.unpin(src_dir, &src_name, op_id);
                r.map(|_| Reply::Ok)
            }
            Ok(_) => {
                let r = finish_rename_source(st, op_id, src_dir, &src_name, dst_dir, se.ino, se.kind).await;
                st.locks.unpin(src_dir, &src_name, op_id);
                r.map(|_| Reply::Ok)
            }
            Err(e) if is_transport(e) => Err(Fail::peer(home, e)), // rolled forward by recovery
            Err(e) => {
                let r = delete_intent(st, op_id).await;
                st.locks.unpin(src_dir, &src_name, op_id);
                r?;
                if e == Errno::EBUSY && Instant::now() < deadline {
                    // The destination name is pinned on its server — possibly by a rename
                    // waiting for *our* pinned name. Back off for a random moment and retry.
                    let ms = rand::random::<u64>() % (5 * attempts.min(20) as u64 + 5) + 1;
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    continue;
                }
                Err(Fail::peer(home, e))
            }
        };
    }
}

/// Second half of a cross-server rename, once the destination entry is in place: remove the
/// source entry (if it still names `ino`), adjust the source directory, delete the intent,
/// and repoint a moved directory's parent. The caller unpins.
pub async fn finish_rename_source(
    st: &Arc<State>,
    op_id: u64,
    src_dir: Ino,
    src_name: &str,
    dst_dir: Ino,
    ino: Ino,
    kind: FileKind,
) -> R<()> {
    let mut inos = vec![src_dir];
    inos.extend(Some(ino).filter(|&i| st.is_home(i)));
    let after = {
        let _g = st.locks.lock_names(&inos, &[(src_dir, src_name)], op_id).await?;
        let name = src_name.to_string();
        st.store(move |st| {
            let mut txn = st.meta.txn();
            let now = now();
            let mut after = After::default();
            if txn.entry(src_dir, &name)?.is_some_and(|e| e.ino == ino) {
                txn.delete_entry(src_dir, &name);
                if txn.inode(src_dir)?.is_some() {
                    if kind == FileKind::Dir {
                        dir_nlink_dec(&mut txn, src_dir)?;
                    }
                    txn.inode_mut(src_dir)?.touch(now);
                }
                if kind == FileKind::Dir {
                    set_parent(st, &mut txn, &mut after, ino, dst_dir, derive_op(op_id, 3), now)?;
                }
            }
            txn.delete_intent(op_id);
            txn.commit()?;
            Ok(after)
        })
        .await?
    };
    after.run(st).await;
    Ok(())
}

/// `PeerRenameIn` at the destination directory's home: put `dst_dir/dst_name` → `entry`,
/// replacing (and taking out) an existing target under the rules of rename. Applied at most
/// once per `op_id`; answers with the replaced entry.
#[allow(clippy::too_many_arguments)]
pub async fn peer_rename_in(
    st: &Arc<State>,
    cred: Cred,
    dst_dir: Ino,
    dst_name: String,
    entry: DirEntry,
    noreplace: bool,
    op_id: u64,
    keep: Option<KeepOpen>,
) -> R<Reply> {
    st.require_home(dst_dir)?;
    name_ok(&dst_name)?;
    if let Some(a) = st.store(move |st| st.meta.get_applied(op_id)).await? {
        return Ok(a.reply.into_wire());
    }
    let se = EntryRecord { ino: entry.ino, kind: entry.kind };
    let flags = RenameFlags { noreplace, exchange: false };
    let mut known = Known::new();
    let mut rmdir_done: Option<(Ino, u64)> = None;
    let result = async {
        for _ in 0..ATTEMPTS {
            let d1 = dst_name.clone();
            let snap = st.store(move |st| st.meta.get_entry(dst_dir, &d1)).await?.map(|e| e.ino);
            let mut inos = vec![dst_dir];
            inos.extend(snap.filter(|&i| st.is_home(i)));
            let owner = rmdir_done.map_or(0, |(_, rop)| rop);
            let g = st.locks.lock_names_within(&inos, &[(dst_dir, &dst_name)], owner, RENAME_IN_PIN_WAIT).await?;
            let (d1, c1, k1) = (dst_name.clone(), cred.clone(), known.clone());
            let step = st
                .store(move |st| -> R<Ren<(Reply, After)>> {
                    let (dst_name, cred, known) = (d1, c1, k1);
                    if let Some(a) = st.meta.get_applied(op_id)? {
                        return Ok(Step::Done((a.reply.into_wire(), After::default())).into());
                    }
                    let mut txn = st.meta.txn();
                    let now = now();
                    let dd = txn.dir(dst_dir)?.owner();
                    perm::check(&cred, &dd, W_OK | X_OK).map_err(|e| denied(e, format_args!("directory {dst_dir}")))?;
                    let te = txn.entry(dst_dir, &dst_name)?;
                    if te.map(|t| t.ino) != snap {
                        return Ok(Step::Retry.into());
                    }
                    let as_dirent = |t: EntryRecord| DirEntry { name: dst_name.clone(), ino: t.ino, kind: t.kind };
                    if let Some(t) = te.filter(|t| t.ino == se.ino) {
                        return Ok(Step::Done((Reply::Replaced(Some(as_dirent(t))), After::default())).into());
                    }
                    let mut after = After::default();
                    if let Some(t) = te {
                        check_target(&se, &t, flags, dst_dir, &dst_name)?;
                        if perm::sticky_needs_owner(&cred, &dd) {
                            let o = owner_or_need!(st, &mut txn, &known, t.ino);
                            if !perm::sticky_allows(&cred, &dd, o.uid) {
                                return fail(
                                    Errno::EPERM,
                                    format!("directory {dst_dir} is sticky and {dst_name:?} is not yours"),
                                );
                            }
                        }
                        if let Some(need) = replace_target(
                            st,
                            &mut txn,
                            &mut after,
                            dst_dir,
                            t,
                            rmdir_done,
                            derive_op(op_id, 2),
                            now,
                            keep,
                        )? {
                            return Ok(Ren::RmdirTarget(need));
                        }
                    }
                    txn.put_entry(dst_dir, &dst_name, se);
                    if se.kind == FileKind::Dir {
                        dir_nlink_inc(&mut txn, dst_dir)?;
                    }
                    txn.inode_mut(dst_dir)?.touch(now);
                    let reply = Reply::Replaced(te.map(as_dirent));
                    txn.put_applied(op_id, &reply, now.secs)?;
                    txn.commit()?;
                    Ok(Step::Done((reply, after)).into())
                })
                .await?;
            match step {
                Ren::Step(Step::Done((reply, after))) => {
                    drop(g);
                    after.run(st).await;
                    return Ok(reply);
                }
                Ren::Step(Step::Retry) => {}
                Ren::Step(Step::Need(ino)) => {
                    drop(g);
                    fetch_owner(st, &mut known, ino).await?;
                }
                Ren::RmdirTarget(tino) => {
                    let rop = derive_op(op_id, 5);
                    let d1 = dst_name.clone();
                    st.store(move |st| {
                        let mut txn = st.meta.txn();
                        txn.put_intent(rop, Intent::Rmdir { dir: dst_dir, name: d1, ino: tino }, now().secs);
                        txn.commit()
                    })
                    .await?;
                    st.locks.pin(dst_dir, &dst_name, rop);
                    drop(g);
                    rmdir_done = Some((tino, rop));
                    let home = st.home(tino);
                    match st.peer(home, Op::PeerRmdirObject { ino: tino, op_id: rop }).await {
                        Ok(_) => {}
                        Err(e) if is_transport(e) => {
                            rmdir_done = None; // recovery finishes it
                            return Err(Fail::peer(home, e));
                        }
                        Err(e) => {
                            rmdir_done = None;
                            let r = delete_intent(st, rop).await;
                            st.locks.unpin(dst_dir, &dst_name, rop);
                            r?;
                            return Err(Fail::peer(home, e));
                        }
                    }
                }
            }
        }
        Err(busy())
    }
    .await;
    if let Some((tino, rop)) = rmdir_done {
        if result.is_err() {
            if let Err(e) = finish_rmdir(st, rop, dst_dir, &dst_name, tino).await {
                tracing::warn!("removing the entry of removed directory {tino}: {e}");
            }
        }
        st.locks.unpin(dst_dir, &dst_name, rop);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setgid_directories_pass_on_their_group() {
        let t = shoal_proto::msg::Timestamp::default();
        let mut parent = new_inode(FileKind::Dir, 0o2775, 0, 50, t);
        let alice = Cred { uid: 1000, gid: 1000, groups: vec![] };
        assert_eq!(inherit(&alice, &parent, 0o755, FileKind::Dir), (50, 0o2755));
        // a file may not keep setgid for a group its creator is not in
        assert_eq!(inherit(&alice, &parent, 0o2755, FileKind::File), (50, 0o755));
        parent.perm = 0o755;
        assert_eq!(inherit(&alice, &parent, 0o40755, FileKind::File), (1000, 0o755));
    }
}
