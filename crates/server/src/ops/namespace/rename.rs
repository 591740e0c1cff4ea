//! `rename`: one batch on one server, or across servers (intent → `PeerRenameIn` → source goes).

use super::*;
use crate::error::{fail, is_transport, Fail, R};
use crate::locks::Pin;
use crate::ops::*;
use crate::partitions::Placed;
use crate::perm::{self, W_OK, X_OK};
use crate::state::{derive_op, State};
use crate::steps::engine::{self, unknown, Ctx, End};
use crate::steps::move_lock;
use crate::store::meta::{EntryRecord, Intent, Txn};
use shoal_proto::msg::{Cred, DirEntry, FileKind, KeepOpen, Op, RenameFlags, Reply};
use shoal_proto::{Errno, Ino, ROOT_INO};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
pub(super) enum Ren<T> {
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
pub(super) fn replace_target(
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
        // A split target directory is removed through its home's `PeerRmdirObject`, which
        // checks every partition (even when that home is this server).
        if st.is_home(t.ino) && !st.parts.is_split(t.ino) {
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
        dir_changed(st, txn, dst_dir, now, -1)?;
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

/// Point a moved inode at its new parent (a directory's `..`, and for every inode the
/// directory its usage counts in, `store::usage`): in place if its inode is here, else
/// through a `SetParent` intent acted on after the commit.
pub(super) fn set_parent(
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
pub(super) fn check_target(se: &EntryRecord, t: &EntryRecord, flags: RenameFlags, dir: Ino, name: &str) -> R<()> {
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
    name_ok(&src_name)?;
    name_ok(&dst_name)?;
    if flags.exchange && flags.noreplace {
        return fail(Errno::EINVAL, "RENAME_EXCHANGE and RENAME_NOREPLACE together");
    }
    // The source name must be here (the client routed by it); the destination's partition
    // may be here or on another server.
    route_read(st, src_dir, &src_name).await?;
    // A directory moving to another parent takes the cluster's directory-move lock before
    // its "not into its own subtree" check and keeps it until the move is complete
    // (`steps::move_lock`); the rename takes it when it finds it moves a directory.
    let mut moving = None;
    let dst_hash = shoal_placement::name_hash(&dst_name);
    let mut r = Err(busy());
    for _ in 0..ATTEMPTS {
        let same_server = st.parts.place(dst_dir, st.is_home(dst_dir), dst_hash) != Placed::Elsewhere;
        if flags.exchange && !same_server {
            r = fail(Errno::EXDEV, "exchanging entries of directories on different servers is not supported");
            break;
        }
        let (c, s, d) = (cred.clone(), src_name.clone(), dst_name.clone());
        r = if same_server {
            rename_local(st, c, src_dir, s, dst_dir, d, flags, keep, &mut moving).await
        } else {
            rename_cross(st, c, src_dir, s, dst_dir, d, flags.noreplace, keep, &mut moving).await
        };
        // The destination's partition moved away (a split) while deciding: decide again.
        if !matches!(&r, Err(f) if f.message == DESTINATION_MOVED) {
            break;
        }
    }
    if let Some(held) = moving {
        move_lock::give(st, held).await;
    }
    r
}

/// The error `rename_local` ends with when the destination name's partition is no longer
/// here; `rename` then goes the cross-server way.
const DESTINATION_MOVED: &str = "the destination name's partition moved to another server";

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
    moving: &mut Option<move_lock::Held>,
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
                let moves_dir =
                    se.kind == FileKind::Dir || te.is_some_and(|t| flags.exchange && t.kind == FileKind::Dir);
                if moves_dir && moving.is_none() {
                    *moving = Some(move_lock::take(st).await?);
                }
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
            let names = [(src_dir, src_name.as_str()), (dst_dir, dst_name.as_str())];
            let (g, src_part) = lock_entry(st, src_dir, &src_name, false, &inos, &names, owner).await?;
            let dst_part = match st.parts.place(dst_dir, st.is_home(dst_dir), shoal_placement::name_hash(&dst_name)) {
                Placed::Here(p) => p,
                Placed::Elsewhere => return Err(Fail::new(Errno::EAGAIN, DESTINATION_MOVED)),
                _ => {
                    drop(g);
                    let still = || {
                        let p = st.parts.place(dst_dir, st.is_home(dst_dir), shoal_placement::name_hash(&dst_name));
                        matches!(p, Placed::Frozen | Placed::Sealed(_))
                    };
                    st.parts.wait_changed(dst_dir, crate::partitions::Partitions::deadline(), still).await?;
                    continue;
                }
            };
            let (s1, d1, c1, k1) = (src_name.clone(), dst_name.clone(), cred.clone(), known.clone());
            let (snap_s, snap_t) = (se.ino, te.map(|t| t.ino));
            let step = st
                .store(move |st| -> R<Ren<After>> {
                    let (src_name, dst_name, cred, known) = (s1, d1, c1, k1);
                    let mut txn = st.meta.txn();
                    let now = now();
                    let sd = parent_of(st, &mut txn, src_dir)?.owner();
                    let dd = parent_of(st, &mut txn, dst_dir)?.owner();
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
                    let (sd, dd) = (sd, Some(dd));
                    txn.log_change(changes::rename(
                        cred.uid, src_dir, sd, &src_name, dst_dir, dd, &dst_name, se.ino, se.kind,
                    ));
                    if flags.exchange {
                        if let Some(t) = te {
                            txn.put_entry(src_dir, &src_name, t);
                            let back = changes::rename(
                                cred.uid,
                                dst_dir,
                                dd.unwrap_or(sd),
                                &dst_name,
                                src_dir,
                                Some(sd),
                                &src_name,
                                t.ino,
                                t.kind,
                            );
                            txn.log_change(back);
                        }
                    }
                    if src_dir != dst_dir {
                        if se.kind == FileKind::Dir {
                            dir_changed(st, &mut txn, src_dir, now, -1)?;
                            dir_changed(st, &mut txn, dst_dir, now, 1)?;
                        }
                        set_parent(st, &mut txn, &mut after, se.ino, dst_dir, derive_op(op_id, 3), now)?;
                        if let Some(t) = te.filter(|_| flags.exchange) {
                            if t.kind == FileKind::Dir {
                                dir_changed(st, &mut txn, dst_dir, now, -1)?;
                                dir_changed(st, &mut txn, src_dir, now, 1)?;
                            }
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
                    dir_changed(st, &mut txn, src_dir, now, 0)?;
                    dir_changed(st, &mut txn, dst_dir, now, 0)?;
                    txn.commit()?;
                    Ok(Step::Done(after).into())
                })
                .await?;
            match step {
                Ren::Step(Step::Done(after)) => {
                    drop(g);
                    after.run(st).await;
                    if (src_dir, src_name.as_str()) != (dst_dir, dst_name.as_str()) && !flags.exchange {
                        st.parts.removed(src_dir, src_part);
                        super::split::after_insert(st, dst_dir, dst_part);
                    }
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
                    st.locks.pin(src_dir, &src_name, rop, Pin::Reads);
                    st.locks.pin(dst_dir, &pinned_dst, rop, Pin::Reads);
                    drop(g);
                    rmdir_done = Some((tino, rop));
                    let home = st.home(tino);
                    match engine::remote(
                        st,
                        "rename",
                        "rmdir_target",
                        home,
                        None,
                        Op::PeerRmdirObject { ino: tino, op_id: rop },
                    )
                    .await
                    {
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
            if let Err(e) = finish_rmdir(st, rop, dst_dir, &dst_name, tino, None).await {
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
    moving: &mut Option<move_lock::Held>,
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
            if moving.is_none() {
                *moving = Some(move_lock::take(st).await?);
            }
            check_not_ancestor(st, se.ino, dst_dir).await?;
        }
        let op_id = st.new_op_id();
        let _active = st.activate(op_id);
        let mut inos = vec![src_dir];
        inos.extend(Some(se.ino).filter(|&i| st.is_home(i)));
        let (g, _) = lock_entry(st, src_dir, &src_name, false, &inos, &[(src_dir, &src_name)], 0).await?;
        let (s1, d1, c1, k1) = (src_name.clone(), dst_name.clone(), cred.clone(), known.clone());
        let snap = se.ino;
        let step = st
            .store(move |st| {
                let (src_name, dst_name, cred, known) = (s1, d1, c1, k1);
                let mut txn = st.meta.txn();
                let sd = parent_of(st, &mut txn, src_dir)?.owner();
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
        st.locks.pin(src_dir, &src_name, op_id, Pin::Reads);
        drop(g);
        let intent = Intent::Rename {
            src_dir,
            src_name: src_name.clone(),
            dst_dir,
            dst_name: dst_name.clone(),
            ino: se.ino,
            kind: se.kind,
            noreplace,
        };
        let ctx = Ctx { cred: Some(cred.clone()), keep, ..Ctx::default() };
        return match engine::run(st, op_id, &intent, ctx).await {
            End::Done(reply) => Ok(reply),
            End::Refused(f) if f.errno == Errno::EBUSY && Instant::now() < deadline => {
                // The destination name is pinned on its server — possibly by a rename
                // waiting for *our* pinned name. Back off for a random moment and retry.
                let ms = rand::random::<u64>() % (5 * attempts.min(20) as u64 + 5) + 1;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                continue;
            }
            End::Refused(f) | End::Kept(f) => Err(f),
        };
    }
}

/// What a cross-server rename moves: `src_dir/src_name` → `dst_dir/dst_name`, naming `ino`.
pub struct Moving<'a> {
    pub src_dir: Ino,
    pub src_name: &'a str,
    pub dst_dir: Ino,
    pub dst_name: &'a str,
    pub ino: Ino,
    pub kind: FileKind,
}

/// Drive a `Rename` intent (step `rename.target`: `PeerRenameIn` at the destination
/// directory's home, applied once per op id, which checks the caller's permissions there
/// and takes out a replaced target; finish: the source entry goes). A clear refusal there
/// (EEXIST, EACCES, EBUSY for a pinned destination name, …) ends the rename undone.
/// `cred`/`keep`: the caller and the file it has open, known to the live request only
/// (recovery sends as root, and a target it replaces is deleted even if it was open).
pub async fn resume(
    st: &Arc<State>,
    op_id: u64,
    m: Moving<'_>,
    noreplace: bool,
    cred: Option<Cred>,
    keep: Option<KeepOpen>,
) -> End {
    let entry = DirEntry { name: m.dst_name.to_string(), ino: m.ino, kind: m.kind };
    let op = Op::PeerRenameIn { dst_dir: m.dst_dir, dst_name: m.dst_name.to_string(), entry, noreplace, op_id, keep };
    let (home, answer) =
        super::split::send_to_entry(st, "rename", "target", m.dst_dir, m.dst_name, cred.as_ref(), op).await;
    let finished = match answer {
        // Both names were links of one file: nothing to do (POSIX).
        Ok(Reply::Replaced(Some(old))) if old.ino == m.ino => engine::finish("rename", delete_intent(st, op_id)).await,
        Ok(_) => {
            let uid = cred.as_ref().map_or(changes::UNKNOWN_UID, |c| c.uid);
            let fin = finish_rename_source(st, op_id, &m, uid);
            engine::finish("rename", fin).await
        }
        Err(e) if e != Errno::EBUSY && unknown(e) => return End::Kept(Fail::peer(home, e)),
        Err(e) => {
            return match delete_intent(st, op_id).await {
                Ok(()) => End::Refused(Fail::peer(home, e)),
                Err(f) => End::Kept(f),
            }
        }
    };
    match finished {
        Ok(()) => End::Done(Reply::Ok),
        Err(f) => End::Kept(f),
    }
}

/// Second half of a cross-server rename, once the destination entry is in place: remove the
/// source entry (if it still names `ino`), adjust the source directory, delete the intent,
/// and repoint a moved directory's parent. The caller unpins. `uid`: who renames, for the
/// change log (the destination's directory is not known here: its event has no `to_guard`).
pub async fn finish_rename_source(st: &Arc<State>, op_id: u64, m: &Moving<'_>, uid: u32) -> R<()> {
    let (src_dir, src_name, dst_dir, ino, kind) = (m.src_dir, m.src_name, m.dst_dir, m.ino, m.kind);
    let dst_name = m.dst_name.to_string();
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
                let guard = parent_of(st, &mut txn, src_dir).map_or(NOBODY, |d| d.owner());
                txn.log_change(changes::rename(uid, src_dir, guard, &name, dst_dir, None, &dst_name, ino, kind));
                if !st.is_home(src_dir) || txn.inode(src_dir)?.is_some() {
                    if kind == FileKind::Dir {
                        dir_changed(st, &mut txn, src_dir, now, -1)?;
                    }
                    dir_changed(st, &mut txn, src_dir, now, 0)?;
                }
                set_parent(st, &mut txn, &mut after, ino, dst_dir, derive_op(op_id, 3), now)?;
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

/// Drive a `SetParent` intent: a moved directory's parent pointer on its (other) home
/// (step `set_parent.parent`: `PeerSetParent`, idempotent; finish: the intent goes).
pub async fn resume_set_parent(st: &Arc<State>, op_id: u64, ino: Ino, parent: Ino) -> End {
    let home = st.home(ino);
    match engine::remote(st, "set_parent", "parent", home, None, Op::PeerSetParent { ino, parent }).await {
        Ok(_) | Err(Errno::ENOENT) => {}
        Err(e) if is_transport(e) || e == Errno::EIO => return End::Kept(Fail::peer(home, e)),
        Err(e) => tracing::warn!("setting the parent of {ino}: server {home} answered {e}; giving up"),
    }
    match engine::finish("set_parent", delete_intent(st, op_id)).await {
        Ok(()) => End::Done(Reply::Ok),
        Err(f) => End::Kept(f),
    }
}
