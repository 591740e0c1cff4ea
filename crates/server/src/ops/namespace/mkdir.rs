//! `mkdir(dir, name)`: local, or across servers (intent → `PeerMkdirObject` → entry).

use super::*;
use crate::error::{is_transport, Fail, R};
use crate::ops::*;
use crate::state::{derive_op, State};
use crate::store::meta::{EntryRecord, Intent};
use shoal_proto::msg::{Cred, FileKind, Op, Reply};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

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
