//! `rmdir(dir, name)`: local, or across servers (intent → `PeerRmdirObject` → entry goes).

use super::*;
use crate::error::{fail, Fail, R};
use crate::locks::{Locks, Pin};
use crate::ops::*;
use crate::perm::{self, W_OK, X_OK};
use crate::state::State;
use crate::steps;
use crate::steps::engine::{self, unknown, Ctx, End};
use crate::store::meta::Intent;
use shoal_proto::change::ChangeKind;
use shoal_proto::msg::{Cred, FileKind, Op, Reply};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

enum Removed {
    Local,
    /// The directory object lives elsewhere; an Rmdir intent was written.
    Remote(Ino),
    Relock(Ino),
}

pub async fn rmdir(st: &Arc<State>, cred: Cred, dir: Ino, name: String) -> R<Reply> {
    name_ok(&name)?;
    let mut known = Known::new();
    let mut expect: Option<Ino> = None;
    for _ in 0..ATTEMPTS {
        let inos = stripe_set(st, dir, expect);
        let op_id = st.new_op_id();
        let _active = st.activate(op_id);
        let (g, part) = lock_entry(st, dir, &name, false, &inos, &[(dir, &name)], 0).await?;
        let (n2, c2, k2) = (name.clone(), cred.clone(), known.clone());
        let step = st
            .store(move |st| {
                let (cred, known) = (c2, k2);
                let mut txn = st.meta.txn();
                let now = now();
                let d = parent_of(st, &mut txn, dir)?.owner();
                perm::check(&cred, &d, W_OK | X_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
                let e = txn.entry(dir, &n2)?.ok_or_else(|| no_entry(dir, &n2))?;
                if e.kind != FileKind::Dir {
                    return fail(Errno::ENOTDIR, format!("{n2:?} in directory {dir} is not a directory"));
                }
                // A split directory is removed through its home's `PeerRmdirObject` even when
                // that is this server: its partitions on other servers are sealed first.
                let local = st.is_home(e.ino) && !st.parts.is_split(e.ino);
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
                    txn.log_change(changes::entry(ChangeKind::Rmdir, cred.uid, dir, d, &n2, e.ino, FileKind::Dir));
                    dir_changed(st, &mut txn, dir, now, -1)?;
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
            Step::Done(Removed::Local) => {
                st.parts.removed(dir, part);
                return Ok(Reply::Ok);
            }
            Step::Done(Removed::Remote(child)) => {
                st.locks.pin(dir, &name, op_id, Pin::Reads);
                drop(g);
                let intent = Intent::Rmdir { dir, name: name.clone(), ino: child };
                return steps::drive(st, op_id, &intent, Ctx { cred: Some(cred.clone()), ..Ctx::default() }).await;
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

/// Drive an `Rmdir` intent (step `rmdir.object`: `PeerRmdirObject` at the directory's home,
/// which refuses with ENOTEMPTY; finish: the entry goes).
pub async fn resume(st: &Arc<State>, op_id: u64, dir: Ino, name: &str, ino: Ino, uid: u32) -> End {
    let home = st.home(ino);
    match engine::remote(st, "rmdir", "object", home, None, Op::PeerRmdirObject { ino, op_id }).await {
        Ok(_) => match engine::finish("rmdir", finish_rmdir(st, op_id, dir, name, ino, Some(uid))).await {
            Ok(()) => End::Done(Reply::Ok),
            Err(f) => End::Kept(f),
        },
        Err(e) if unknown(e) => End::Kept(Fail::peer(home, e)),
        // ENOTEMPTY (or not a directory): the rmdir did not happen.
        Err(e) => match delete_intent(st, op_id).await {
            Ok(()) => End::Refused(Fail::peer(home, e)),
            Err(f) => End::Kept(f),
        },
    }
}

/// Second half of removing a remote directory object: the entry `dir/name` goes if it still
/// names `ino` (with the parent's link count), and the intent with it. The caller unpins.
/// `uid`: who removes it, for the change log (`None`: not logged, a rename replacing the
/// directory logs the rename).
pub async fn finish_rmdir(st: &Arc<State>, op_id: u64, dir: Ino, name: &str, ino: Ino, uid: Option<u32>) -> R<()> {
    let _g = st.locks.lock_names(&[dir], &[(dir, name)], op_id).await?;
    let name = name.to_string();
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let now = now();
        if txn.entry(dir, &name)?.is_some_and(|e| e.ino == ino) {
            txn.delete_entry(dir, &name);
            if let Some(uid) = uid {
                let guard = parent_of(st, &mut txn, dir).map_or(NOBODY, |d| d.owner());
                txn.log_change(changes::entry(ChangeKind::Rmdir, uid, dir, guard, &name, ino, FileKind::Dir));
            }
            if !st.is_home(dir) || txn.inode(dir)?.is_some() {
                dir_changed(st, &mut txn, dir, now, -1)?;
            }
        }
        txn.delete_intent(op_id);
        txn.commit()
    })
    .await
}
