//! `mkdir(dir, name)`: local, or across servers (intent → `PeerMkdirObject` → entry).

use super::*;
use crate::error::{is_transport, Fail, R};
use crate::locks::Pin;
use crate::ops::*;
use crate::state::{derive_op, State};
use crate::steps;
use crate::steps::engine::{self, unknown, Ctx, End};
use crate::store::meta::{EntryRecord, Intent};
use shoal_proto::change::ChangeKind;
use shoal_proto::msg::{Cred, FileKind, Op, Reply};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

pub async fn mkdir(st: &Arc<State>, cred: Cred, dir: Ino, name: String, perm: u32) -> R<Reply> {
    name_ok(&name)?;
    let op_id = st.new_op_id();
    let _active = st.activate(op_id);
    let (g, part) = lock_entry(st, dir, &name, true, &[dir], &[(dir, &name)], 0).await?;
    let n2 = name.clone();
    let (ino, rec, local) = st
        .store(move |st| {
            let mut txn = st.meta.txn();
            let now = now();
            let parent = parent_of(st, &mut txn, dir)?;
            may_change(&cred, dir, &parent)?;
            if txn.entry(dir, &n2)?.is_some() {
                return Err(exists(dir, &n2));
            }
            let ino = st.alloc_ino(st.next_dir_home(dir))?;
            let (gid, perm) = inherit(&cred, &parent, perm, FileKind::Dir);
            let mut rec = new_inode(FileKind::Dir, perm, cred.uid, gid, now);
            rec.parent = Some(dir);
            rec.dir_default = parent.dir_default.clone();
            rec.read_mostly = parent.read_mostly;
            let local = st.is_home(ino);
            if local {
                txn.put_inode(ino, rec.clone())?;
                txn.put_entry(dir, &n2, EntryRecord { ino, kind: FileKind::Dir });
                txn.log_change(changes::entry(
                    ChangeKind::Mkdir,
                    cred.uid,
                    dir,
                    parent.owner(),
                    &n2,
                    ino,
                    FileKind::Dir,
                ));
                dir_changed(st, &mut txn, dir, now, 1)?;
            } else {
                txn.put_intent(op_id, Intent::Mkdir { dir, name: n2, ino }, now.secs);
            }
            txn.commit()?;
            Ok((ino, rec, local))
        })
        .await?;
    if local {
        drop(g);
        split::after_insert(st, dir, part);
        return Ok(entry_reply(ino, &rec));
    }
    st.locks.pin(dir, &name, op_id, Pin::Writes);
    drop(g);
    let intent = Intent::Mkdir { dir, name, ino };
    steps::drive(st, op_id, &intent, Ctx { made: Some(rec), ..Ctx::default() }).await
}

/// Drive a `Mkdir` intent (step `mkdir.object`: `PeerMkdirObject` on the new directory's
/// home; finish: the entry and the parent's link count). Only the request that made the
/// directory knows its attributes (`made`); without them (recovery) the mkdir is rolled
/// back: the object, if it was made, is removed and the intent dropped.
pub async fn resume(st: &Arc<State>, op_id: u64, dir: Ino, name: &str, ino: Ino, made: Option<InodeRecord>) -> End {
    let Some(rec) = made else {
        return match rollback(st, op_id, ino).await {
            Ok(()) => End::Done(Reply::Ok),
            Err(f) => End::Kept(f),
        };
    };
    let uid = rec.uid;
    let home = st.home(ino);
    match engine::remote(st, "mkdir", "object", home, None, Op::PeerMkdirObject { attr: rec.to_attr(ino, 0), op_id })
        .await
    {
        Ok(_) => {}
        // Outcome unknown: the intent stays and recovery removes the object if it exists.
        Err(e) if unknown(e) => return End::Kept(Fail::peer(home, e)),
        Err(e) => {
            return match delete_intent(st, op_id).await {
                Ok(()) => End::Refused(Fail::peer(home, e)),
                Err(f) => End::Kept(f),
            }
        }
    }
    let committed = engine::finish("mkdir", async {
        let _g = st.locks.lock(&[dir]).await;
        let n2 = name.to_string();
        st.store(move |st| {
            let mut txn = st.meta.txn();
            let now = now();
            // The parent may have been removed while the object was being made.
            let Ok(parent) = parent_of(st, &mut txn, dir) else { return Ok(false) };
            txn.put_entry(dir, &n2, EntryRecord { ino, kind: FileKind::Dir });
            // The new directory's owner made it.
            txn.log_change(changes::entry(ChangeKind::Mkdir, uid, dir, parent.owner(), &n2, ino, FileKind::Dir));
            dir_changed(st, &mut txn, dir, now, 1)?;
            txn.delete_intent(op_id);
            txn.commit()?;
            Ok(true)
        })
        .await
    })
    .await;
    match committed {
        Ok(true) => {
            if let Ok((part, _)) = route_read(st, dir, name).await {
                split::after_insert(st, dir, part);
            }
            End::Done(entry_reply(ino, &rec))
        }
        Ok(false) => {
            let gone = Fail::new(Errno::ENOENT, format!("directory {dir} was removed"));
            match rollback(st, op_id, ino).await {
                Ok(()) => End::Refused(gone),
                Err(e) => {
                    tracing::info!("rollback of mkdir {name:?} left for recovery: {e}");
                    End::Kept(gone)
                }
            }
        }
        // The intent stays: recovery rolls the mkdir back.
        Err(e) => End::Kept(e),
    }
}

/// Undo a mkdir whose entry was not committed (step `mkdir.rollback`: `PeerRmdirObject`),
/// then drop the intent.
async fn rollback(st: &Arc<State>, op_id: u64, ino: Ino) -> R<()> {
    let home = st.home(ino);
    match engine::remote(st, "mkdir", "rollback", home, None, Op::PeerRmdirObject { ino, op_id: derive_op(op_id, 1) })
        .await
    {
        Ok(_) => {}
        Err(e) if is_transport(e) || e == Errno::EIO => return Err(Fail::peer(home, e)),
        Err(e) => tracing::warn!("rolling back mkdir of {ino}: server {home} answered {e}; dropping the intent"),
    }
    delete_intent(st, op_id).await
}
