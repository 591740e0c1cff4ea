//! `PeerRenameIn`: the destination half of a cross-server rename.

use super::rename::{check_target, replace_target, Ren};
use super::*;
use crate::error::{fail, is_transport, Fail, R};
use crate::locks::Pin;
use crate::ops::*;
use crate::partitions::{misrouted, Placed};
use crate::perm::{self, W_OK, X_OK};
use crate::state::{derive_op, State};
use crate::steps::engine;
use crate::store::meta::{EntryRecord, Intent};
use shoal_proto::msg::{Cred, DirEntry, FileKind, KeepOpen, Op, RenameFlags, Reply};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

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
            // The destination name must be here, and not in the middle of a split or in a
            // directory being removed (then the coordinator backs off and retries, as for a
            // pinned name).
            let part = match st.parts.place(dst_dir, st.is_home(dst_dir), shoal_placement::name_hash(&dst_name)) {
                Placed::Here(part) => part,
                Placed::Elsewhere => return Err(misrouted(dst_dir)),
                Placed::Frozen | Placed::Sealed(_) => {
                    return Err(Fail::new(
                        Errno::EBUSY,
                        format!("directory {dst_dir}: the partition of {dst_name:?} is splitting or sealed"),
                    ))
                }
            };
            let (d1, c1, k1) = (dst_name.clone(), cred.clone(), known.clone());
            let step = st
                .store(move |st| -> R<Ren<(Reply, After)>> {
                    let (dst_name, cred, known) = (d1, c1, k1);
                    if let Some(a) = st.meta.get_applied(op_id)? {
                        return Ok(Step::Done((a.reply.into_wire(), After::default())).into());
                    }
                    let mut txn = st.meta.txn();
                    let now = now();
                    let dd = parent_of(st, &mut txn, dst_dir)?.owner();
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
                        dir_changed(st, &mut txn, dst_dir, now, 1)?;
                    }
                    dir_changed(st, &mut txn, dst_dir, now, 0)?;
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
                    super::split::after_insert(st, dst_dir, part);
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
                    st.locks.pin(dst_dir, &dst_name, rop, Pin::Reads);
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
            if let Err(e) = finish_rmdir(st, rop, dst_dir, &dst_name, tino, None).await {
                tracing::warn!("removing the entry of removed directory {tino}: {e}");
            }
        }
        st.locks.unpin(dst_dir, &dst_name, rop);
    }
    result
}
