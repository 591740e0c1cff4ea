//! Steps servers ask of each other (the remote halves of operations spanning servers).
//! They are trusted — the coordinator checked permissions — and each is idempotent or
//! deduplicated by its op id, because a coordinator's recovery may send it again.
//! (`PeerRenameIn` lives with rename in `namespace.rs`.)

use super::*;
use crate::error::{fail, Fail, R};
use crate::store::meta::InodeRecord;
use shoal_proto::msg::{Attr, FileKind, Reply};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

/// Create a directory object (its inode; entries come later). Applied at most once per
/// op id, so a delayed duplicate cannot resurrect a rolled-back mkdir.
pub async fn mkdir_object(st: &Arc<State>, attr: Attr, op_id: u64) -> R<Reply> {
    let ino = attr.ino;
    st.require_home(ino)?;
    if attr.kind != FileKind::Dir {
        return fail(Errno::EINVAL, format!("PeerMkdirObject for {ino}, which is not a directory"));
    }
    let _g = st.locks.lock(&[ino]).await;
    st.store(move |st| {
        if let Some(a) = st.meta.get_applied(op_id)? {
            return Ok(a.reply.into_wire());
        }
        let mut txn = st.meta.txn();
        match txn.inode(ino)? {
            Some(r) if r.kind == FileKind::Dir => return Ok(Reply::Ok),
            Some(_) => return fail(Errno::EEXIST, format!("inode {ino} exists and is not a directory")),
            None => {}
        }
        txn.put_inode(ino, InodeRecord::from_attr(&attr))?;
        txn.put_applied(op_id, &Reply::Ok, now().secs)?;
        txn.commit()?;
        Ok(Reply::Ok)
    })
    .await
}

/// Remove a directory object if it has no entries (ENOTEMPTY otherwise); absent is success.
pub async fn rmdir_object(st: &Arc<State>, ino: Ino) -> R<Reply> {
    st.require_home(ino)?;
    if st.parts.is_split(ino) {
        return crate::ops::namespace::split::remove_split_dir(st, ino).await;
    }
    let _g = st.locks.lock(&[ino]).await;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        match txn.inode(ino)? {
            None => return Ok(Reply::Ok),
            Some(r) if r.kind != FileKind::Dir => return fail(Errno::ENOTDIR, format!("{ino} is not a directory")),
            Some(_) => {}
        }
        if st.meta.has_entries(ino)? {
            return fail(Errno::ENOTEMPTY, format!("directory {ino} is not empty"));
        }
        txn.remove_inode(ino)?;
        txn.commit()?;
        Ok(Reply::Ok)
    })
    .await
}

/// Add `delta` to a link count (at most once per op id); at zero the inode goes, and its
/// data objects after it — or, with `orphan_of`, it stays as that client session's orphan.
pub async fn link_delta(st: &Arc<State>, ino: Ino, delta: i32, op_id: u64, orphan_of: Option<u64>) -> R<Reply> {
    st.require_home(ino)?;
    let _g = st.locks.lock(&[ino]).await;
    let (reply, gc) = st
        .store(move |st| {
            if let Some(a) = st.meta.get_applied(op_id)? {
                return Ok((a.reply.into_wire(), None));
            }
            let mut txn = st.meta.txn();
            let now = now();
            let rec = txn.inode(ino)?.ok_or_else(|| Fail::new(Errno::ENOENT, format!("inode {ino} does not exist")))?;
            if rec.kind == FileKind::Dir {
                return fail(Errno::EPERM, format!("{ino} is a directory; its link count is not changed by links"));
            }
            if rec.nlink == 0 && delta > 0 {
                // An orphan (open, no name left): as Linux, no new name for it.
                return fail(Errno::ENOENT, format!("{ino} has no name left (removed while open)"));
            }
            let n = rec.nlink as i64 + delta as i64;
            if n > u32::MAX as i64 {
                return fail(Errno::EMLINK, format!("{ino} has too many links"));
            }
            let n = n.max(0) as u32;
            let mut gc = None;
            if n == 0 {
                // drop_link removes the inode (and queues its objects) when the count hits 0.
                let r = txn.inode_mut(ino)?;
                r.nlink = 1;
                gc = drop_link(&mut txn, ino, now, orphan_of)?;
            } else {
                let r = txn.inode_mut(ino)?;
                r.nlink = n;
                r.ctime = now;
            }
            let reply = Reply::NLink(n);
            txn.put_applied(op_id, &reply, now.secs)?;
            txn.commit()?;
            Ok((reply, gc))
        })
        .await?;
    if let Some(g) = gc {
        st.queue_gc(ino, g);
    }
    Ok(reply)
}

pub async fn set_parent(st: &Arc<State>, ino: Ino, parent: Ino) -> R<Reply> {
    st.require_home(ino)?;
    let _g = st.locks.lock(&[ino]).await;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        // Any kind: a directory's `..`, and the directory a file's usage counts in.
        let r = txn.inode_mut(ino)?;
        if r.parent != Some(parent) {
            r.parent = Some(parent);
            r.ctime = now();
            txn.commit()?;
        }
        Ok(Reply::Ok)
    })
    .await
}

pub async fn delete_objects(st: &Arc<State>, objects: Vec<(Ino, u32)>) -> R<Reply> {
    st.blocking(move |st| st.data.delete_objects(&objects).map(|_| Reply::Ok)).await
}

pub async fn truncate_object(st: &Arc<State>, ino: Ino, index: u32, len: u64, copies: u8) -> R<Reply> {
    st.blocking(move |st| st.data.truncate(ino, index, len, copies).map(|_| Reply::Ok)).await
}
