//! `symlink(dir, name, target)`: entry and inode in one batch.

use super::*;
use crate::error::{fail, R};
use crate::ops::*;
use crate::state::State;
use crate::store::meta::EntryRecord;
use shoal_proto::change::ChangeKind;
use shoal_proto::msg::{Cred, FileKind, Reply, PATH_MAX};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

pub async fn symlink(st: &Arc<State>, cred: Cred, dir: Ino, name: String, target: String) -> R<Reply> {
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
    let (g, part) = lock_entry(st, dir, &name, true, &[dir], &[(dir, &name)], 0).await?;
    let reply = st
        .store(move |st| {
            let mut txn = st.meta.txn();
            let now = now();
            let parent = parent_of(st, &mut txn, dir)?;
            may_change(&cred, dir, &parent)?;
            if txn.entry(dir, &name)?.is_some() {
                return Err(exists(dir, &name));
            }
            let ino = st.alloc_ino(st.id)?;
            let (gid, _) = inherit(&cred, &parent, 0o777, FileKind::Symlink);
            let mut rec = new_inode(FileKind::Symlink, 0o777, cred.uid, gid, now);
            rec.size = target.len() as u64;
            rec.target = Some(target);
            rec.read_mostly = parent.read_mostly;
            rec.parent = Some(dir);
            txn.put_inode(ino, rec.clone())?;
            txn.put_entry(dir, &name, EntryRecord { ino, kind: FileKind::Symlink });
            txn.log_change(changes::entry(
                ChangeKind::Symlink,
                cred.uid,
                dir,
                parent.owner(),
                &name,
                ino,
                FileKind::Symlink,
            ));
            dir_changed(st, &mut txn, dir, now, 0)?;
            txn.commit()?;
            Ok(entry_reply(ino, &rec))
        })
        .await?;
    drop(g);
    split::after_insert(st, dir, part);
    Ok(reply)
}
