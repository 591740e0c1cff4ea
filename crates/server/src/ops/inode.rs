//! Inode operations, run at the inode's home server: attributes, symlink targets, access
//! checks, size publication and extended attributes.

use super::*;
use crate::error::{fail, Fail, R};
use crate::ops::changes;
use crate::perm::{self, W_OK};
use crate::state::State;
use crate::store::meta::{InodeRecord, Intent};
use shoal_placement::resolve_layout;
use shoal_proto::change::ChangeKind;
use shoal_proto::msg::{Cred, FileKind, LayoutSpec, Reply, SetAttrs, TimeSet, Timestamp, XATTR_VALUE_MAX};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

/// Most extended attributes one inode may carry (bounds a `ListXattr` reply).
const XATTRS_MAX: usize = 1024;
/// Longest attribute name (Linux's XATTR_NAME_MAX).
const XATTR_NAME_MAX: usize = 255;

/// The attribute holding file capabilities, dropped when a file's size is changed.
pub(crate) const CAPS_XATTR: &str = "security.capability";

fn no_inode(ino: Ino) -> Fail {
    Fail::new(Errno::ENOENT, format!("inode {ino} does not exist"))
}

fn load(st: &State, ino: Ino) -> R<InodeRecord> {
    st.meta.get_inode(ino)?.ok_or_else(|| no_inode(ino))
}

pub async fn getattr(st: &Arc<State>, ino: Ino) -> R<Reply> {
    st.require_home(ino)?;
    st.store(move |st| {
        let rec = load(st, ino)?;
        Ok(Reply::Attr(st.attr_of(ino, &rec, true)))
    })
    .await
}

/// The record after applying `set` for `cred`, or why not (nothing is applied then).
/// POSIX/Linux rules: chown by root (the owner may change the group to one of its own, and
/// a chown of a non-directory clears set-user-id and, with group execute, set-group-id),
/// chmod by the owner or root, truncate with write permission, explicit times by the owner,
/// "now" by the owner or a writer. Any change sets ctime.
pub fn apply_setattr(cred: &Cred, rec: &InodeRecord, set: &SetAttrs, now: Timestamp) -> R<InodeRecord> {
    let mut n = rec.clone();
    let o = rec.owner();
    let mut changed = false;
    if set.uid.is_some() || set.gid.is_some() {
        perm::chown(cred, &o, set.uid, set.gid).map_err(|e| {
            Fail::new(e, "only root may change a file's owner; its owner may change the group to one of its own groups")
        })?;
        if let Some(u) = set.uid {
            n.uid = u;
        }
        if let Some(g) = set.gid {
            n.gid = g;
        }
        n.perm = perm::mode_after_chown(n.perm, n.kind);
        changed = true;
    }
    if let Some(p) = set.perm {
        let against = perm::Owner { gid: n.gid, ..o };
        n.perm =
            perm::chmod(cred, &against, p).map_err(|e| Fail::new(e, "only the owner or root may change the mode"))?;
        changed = true;
    }
    if let Some(size) = set.size {
        match rec.kind {
            FileKind::File => {}
            FileKind::Dir => return fail(Errno::EISDIR, "cannot truncate a directory"),
            FileKind::Symlink => return fail(Errno::EINVAL, "cannot truncate a symbolic link"),
        }
        perm::check(cred, &o, W_OK).map_err(|e| denied(e, "file (truncate needs write permission)"))?;
        if size > i64::MAX as u64 {
            return fail(Errno::EFBIG, format!("size {size} is larger than the largest file"));
        }
        n.size = size;
        n.mtime = now;
        n.perm = perm::mode_after_write(cred, n.perm, n.gid);
        changed = true;
    }
    if set.atime.is_some() || set.mtime.is_some() {
        let explicit = matches!(set.atime, Some(TimeSet::At(_))) || matches!(set.mtime, Some(TimeSet::At(_)));
        perm::set_times(cred, &o, explicit).map_err(|e| match e {
            Errno::EPERM => Fail::new(e, "only the owner or root may set explicit times"),
            _ => denied(e, "file (setting times to now needs write permission)"),
        })?;
        let pick = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(ts) => ts,
        };
        if let Some(t) = set.atime {
            n.atime = pick(t);
        }
        if let Some(t) = set.mtime {
            n.mtime = pick(t);
        }
        changed = true;
    }
    if changed {
        n.ctime = now;
    }
    Ok(n)
}

/// A size change drops file capabilities, whoever makes it (Linux's `file_remove_privs`),
/// in the same batch as the size.
fn drop_caps_on_size_change(txn: &mut crate::store::meta::Txn<'_>, ino: Ino, set: &SetAttrs) {
    if set.size.is_some() {
        txn.delete_xattr(ino, CAPS_XATTR);
    }
}

/// Times a shrinking `setattr` cuts the objects again because the inode changed meanwhile,
/// before it commits the size over those changes and finishes the cut as recovery would.
const SETATTR_ATTEMPTS: u32 = 8;

/// Change attributes. A shrinking truncate (`truncate.rs`) cuts the objects under an intent
/// first (on other servers too) and commits the size after, so the bytes beyond the new end
/// are gone before the size says so; if it is interrupted, the new size is committed and
/// the cut finished by recovery, so the file never reads as its old size over cut objects.
/// No lock is held while the objects are cut (`locks.rs`: never across a call to another
/// server); instead the change commits only if the inode is still the one the cut was made
/// for. If a write at the inode's home (which changes the record under the same lock), a
/// size publication or another setattr came between, the attributes are computed again
/// from the new record and the objects cut again, so that no byte written beyond the new
/// end before the commit survives it. A file whose earlier truncate left a cut pending has
/// it finished first (`truncate::finish_pending`): an extension must not show old bytes.
pub async fn setattr(st: &Arc<State>, cred: Cred, ino: Ino, set: SetAttrs) -> R<Reply> {
    st.require_home(ino)?;
    super::truncate::finish_pending(st, ino).await?;
    // A split directory's partitions elsewhere check permissions against copies of its
    // attributes: an intent written with the change has them refreshed.
    let split = st.parts.is_split(ino);
    let op_id = st.new_op_id();
    let _active = st.activate(op_id);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (cred2, set2) = (cred.clone(), set.clone());
        let planned = {
            let _g = st.locks.lock(&[ino]).await;
            st.store(move |st| {
                let rec = load(st, ino)?;
                let new = apply_setattr(&cred2, &rec, &set2, now())?;
                match (set2.size, &rec.layout) {
                    (Some(size), Some(layout)) if size < rec.size => Ok(Err((rec.clone(), new, layout.clone(), size))),
                    (size, _) => {
                        if size.is_some_and(|s| s > rec.size) {
                            // A longer file is a promise of space (its hole reads as zeros).
                            st.space.check(crate::store::space::RECORD_ROOM)?;
                        }
                        let mut txn = st.meta.txn();
                        txn.put_inode(ino, new.clone())?;
                        txn.log_change(changes::inode(ChangeKind::Setattr, cred2.uid, ino, &new, None));
                        drop_caps_on_size_change(&mut txn, ino, &set2);
                        if attempt > 1 {
                            // An earlier attempt's shrink intent: this change supersedes it
                            // (left, recovery would cut what is written after this).
                            txn.delete_intent(op_id);
                        }
                        if split {
                            txn.put_intent(op_id, Intent::PartitionAttr { dir: ino }, now().secs);
                        }
                        txn.commit()?;
                        Ok(Ok(Reply::Attr(st.attr_of(ino, &new, true))))
                    }
                }
            })
            .await?
        };
        let (old, new, layout, size) = match planned {
            Ok(reply) => {
                if split {
                    crate::steps::drive(st, op_id, &Intent::PartitionAttr { dir: ino }, Default::default()).await?;
                }
                return Ok(reply);
            }
            Err(shrink) => shrink,
        };
        if let Some(reply) = super::truncate::shrink(st, op_id, ino, old, new, layout, cred.uid).await? {
            return Ok(reply);
        }
        if attempt == SETATTR_ATTEMPTS {
            // The file kept changing: commit the size over the changes, then finish the cut
            // (its event is logged after the cut, in a batch of its own).
            let reply = super::truncate::force(st, op_id, ino, size).await?;
            changes::log_inode(st, ChangeKind::Setattr, cred.uid, ino, None).await?;
            return Ok(reply);
        }
    }
}

pub async fn set_dir_layout(st: &Arc<State>, cred: Cred, ino: Ino, spec: LayoutSpec) -> R<Reply> {
    st.require_home(ino)?;
    if let Some(f) = spec.first_server {
        if st.map.server(f).is_none() {
            return fail(Errno::EINVAL, format!("server {f} is not in the cluster map"));
        }
    }
    shoal_placement::check_spec(&st.map, &spec).map_err(|m| Fail::new(Errno::EINVAL, m))?;
    // Validate by resolving for a made-up file.
    resolve_layout(&st.map, Ino(2), st.id, Some(&spec), None).map_err(|e| {
        Fail::new(e, "invalid layout (stripe size must be a multiple of 4 KiB up to 1 GiB, count up to 1024)")
    })?;
    change_owned(st, cred, ino, "set a directory's layout", move |rec| {
        if rec.kind != FileKind::Dir {
            return fail(Errno::ENOTDIR, format!("{ino} is not a directory"));
        }
        rec.dir_default = if spec == LayoutSpec::default() { None } else { Some(spec) };
        Ok(())
    })
    .await
}

/// Mark `ino` read-mostly or clear the mark (docs/loading.md). Entries created later in a
/// read-mostly directory inherit it; those already there keep theirs (`shoal readmostly
/// -r` walks a tree). The change reaches every client through the attribute and directory
/// leases the ctime change revokes, like any other attribute change.
pub async fn set_read_mostly(st: &Arc<State>, cred: Cred, ino: Ino, on: bool) -> R<Reply> {
    st.require_home(ino)?;
    change_owned(st, cred, ino, "mark a file read-mostly", move |rec| {
        rec.read_mostly = on;
        Ok(())
    })
    .await
}

/// Apply `change` to `ino`'s record if `cred` is its owner or root (`what` names the
/// change in the EPERM message), bump its ctime and commit; on a split directory, pass
/// the new attributes to its partitions (`Intent::PartitionAttr`).
async fn change_owned(
    st: &Arc<State>,
    cred: Cred,
    ino: Ino,
    what: &'static str,
    change: impl FnOnce(&mut InodeRecord) -> R<()> + Send + 'static,
) -> R<Reply> {
    let split = st.parts.is_split(ino);
    let op_id = st.new_op_id();
    let _active = st.activate(op_id);
    let _g = st.locks.lock(&[ino]).await;
    let reply = st
        .store(move |st| {
            let mut txn = st.meta.txn();
            if split {
                txn.put_intent(op_id, Intent::PartitionAttr { dir: ino }, now().secs);
            }
            let rec = txn.inode_mut(ino)?;
            if !perm::is_owner_or_root(&cred, &rec.owner()) {
                return fail(Errno::EPERM, format!("only the owner or root may {what}"));
            }
            change(rec)?;
            rec.ctime = now();
            let rec = rec.clone();
            txn.commit()?;
            Ok(Reply::Attr(rec.to_attr(ino, 0)))
        })
        .await?;
    drop(_g);
    if split {
        crate::steps::drive(st, op_id, &Intent::PartitionAttr { dir: ino }, Default::default()).await?;
    }
    Ok(reply)
}

pub async fn readlink(st: &Arc<State>, ino: Ino) -> R<Reply> {
    st.require_home(ino)?;
    st.store(move |st| {
        let rec = load(st, ino)?;
        match (rec.kind, rec.target) {
            (FileKind::Symlink, Some(t)) => Ok(Reply::Link(t)),
            (FileKind::Symlink, None) => Err(Fail::corrupt(format!("symlink {ino} has no target"))),
            _ => fail(Errno::EINVAL, format!("{ino} is not a symbolic link")),
        }
    })
    .await
}

pub async fn access(st: &Arc<State>, cred: Cred, ino: Ino, mask: u32) -> R<Reply> {
    st.require_home(ino)?;
    if mask & !7 != 0 {
        return fail(Errno::EINVAL, format!("access mask {mask:#o} has unknown bits"));
    }
    st.store(move |st| {
        let rec = load(st, ino)?;
        if mask != 0 {
            perm::check(&cred, &rec.owner(), mask).map_err(|e| denied(e, ino))?;
        }
        Ok(Reply::Ok)
    })
    .await
}

/// Publish a size reached by writes to other servers (at fsync/close). Allowed to writers
/// and to the owner (who may have created the file read-only and still holds it open for
/// writing, as `cp -p` of a read-only file does).
pub async fn extend_size(st: &Arc<State>, cred: Cred, ino: Ino, size: u64) -> R<Reply> {
    st.require_home(ino)?;
    super::truncate::finish_pending(st, ino).await?;
    let _g = st.locks.lock(&[ino]).await;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let rec = txn.inode_mut(ino)?;
        match rec.kind {
            FileKind::File => {}
            FileKind::Dir => return fail(Errno::EISDIR, format!("{ino} is a directory")),
            FileKind::Symlink => return fail(Errno::EINVAL, format!("{ino} is a symbolic link")),
        }
        let o = rec.owner();
        if !perm::is_owner_or_root(&cred, &o) && !perm::allowed(&cred, &o, W_OK) {
            return Err(denied(Errno::EACCES, ino));
        }
        if size > rec.size {
            rec.size = size;
        }
        rec.touch(now());
        let rec = rec.clone();
        txn.commit()?;
        Ok(Reply::Attr(rec.to_attr(ino, 0)))
    })
    .await
}

fn xattr_name_ok(name: &str) -> R<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return fail(Errno::ERANGE, format!("attribute name of {} bytes (1..=255 allowed)", name.len()));
    }
    Ok(())
}

fn xattr_denied(e: Errno, name: &str) -> Fail {
    match e {
        Errno::ENOTSUP => {
            Fail::new(e, format!("attribute namespace of {name:?} is not supported (user., trusted., security. are)"))
        }
        Errno::ENODATA => Fail::new(e, format!("no attribute {name:?}")),
        _ => Fail::new(e, format!("not allowed to access attribute {name:?}")),
    }
}

pub async fn set_xattr(
    st: &Arc<State>,
    cred: Cred,
    ino: Ino,
    name: String,
    value: Vec<u8>,
    create_only: bool,
    replace_only: bool,
) -> R<Reply> {
    st.require_home(ino)?;
    xattr_name_ok(&name)?;
    if value.len() > XATTR_VALUE_MAX {
        return fail(
            Errno(libc::E2BIG),
            format!("attribute value of {} bytes (at most {XATTR_VALUE_MAX})", value.len()),
        );
    }
    if create_only && replace_only {
        return fail(Errno::EINVAL, "XATTR_CREATE and XATTR_REPLACE together");
    }
    let _g = st.locks.lock(&[ino]).await;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let rec = txn.inode(ino)?.ok_or_else(|| no_inode(ino))?;
        perm::xattr_access(&cred, &rec.owner(), &name, true).map_err(|e| xattr_denied(e, &name))?;
        let exists = st.meta.get_xattr(ino, &name)?.is_some();
        if create_only && exists {
            return fail(Errno::EEXIST, format!("attribute {name:?} exists"));
        }
        if replace_only && !exists {
            return fail(Errno::ENODATA, format!("no attribute {name:?}"));
        }
        if !exists && st.meta.list_xattrs(ino)?.len() >= XATTRS_MAX {
            return fail(Errno::ENOSPC, format!("{ino} already has {XATTRS_MAX} attributes"));
        }
        txn.put_xattr(ino, &name, &value);
        let rec = txn.inode_mut(ino)?;
        rec.ctime = now();
        let c = changes::inode(ChangeKind::Xattr, cred.uid, ino, rec, Some(&name));
        txn.log_change(c);
        txn.commit()?;
        Ok(Reply::Ok)
    })
    .await
}

pub async fn get_xattr(st: &Arc<State>, cred: Cred, ino: Ino, name: String) -> R<Reply> {
    st.require_home(ino)?;
    xattr_name_ok(&name)?;
    st.store(move |st| {
        let rec = load(st, ino)?;
        perm::xattr_access(&cred, &rec.owner(), &name, false).map_err(|e| xattr_denied(e, &name))?;
        match st.meta.get_xattr(ino, &name)? {
            Some(v) => Ok(Reply::Xattr(v)),
            None => Err(xattr_denied(Errno::ENODATA, &name)),
        }
    })
    .await
}

pub async fn list_xattr(st: &Arc<State>, cred: Cred, ino: Ino) -> R<Reply> {
    st.require_home(ino)?;
    st.store(move |st| {
        load(st, ino)?;
        let names = st.meta.list_xattrs(ino)?.into_iter().filter(|n| perm::xattr_visible(&cred, n)).collect();
        Ok(Reply::XattrNames(names))
    })
    .await
}

pub async fn remove_xattr(st: &Arc<State>, cred: Cred, ino: Ino, name: String) -> R<Reply> {
    st.require_home(ino)?;
    xattr_name_ok(&name)?;
    let _g = st.locks.lock(&[ino]).await;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let rec = txn.inode(ino)?.ok_or_else(|| no_inode(ino))?;
        perm::xattr_access(&cred, &rec.owner(), &name, true).map_err(|e| xattr_denied(e, &name))?;
        if st.meta.get_xattr(ino, &name)?.is_none() {
            return Err(xattr_denied(Errno::ENODATA, &name));
        }
        txn.delete_xattr(ino, &name);
        let rec = txn.inode_mut(ino)?;
        rec.ctime = now();
        let c = changes::inode(ChangeKind::Xattr, cred.uid, ino, rec, Some(&name));
        txn.log_change(c);
        txn.commit()?;
        Ok(Reply::Ok)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(uid: u32, perm: u32) -> InodeRecord {
        let t = Timestamp { secs: 1, nsecs: 0 };
        InodeRecord {
            kind: FileKind::File,
            perm,
            uid,
            gid: uid,
            size: 100,
            nlink: 1,
            atime: t,
            mtime: t,
            ctime: t,
            layout: None,
            dir_default: None,
            parent: None,
            target: None,
            bitmap: Vec::new(),
            read_mostly: false,
        }
    }

    #[test]
    fn setattr_rules() {
        let now = Timestamp { secs: 50, nsecs: 0 };
        let alice = Cred { uid: 1000, gid: 1000, groups: vec![] };
        let eve = Cred { uid: 1002, gid: 1002, groups: vec![] };
        let f = file(1000, 0o6755);
        // chown by root clears set-id bits of a group-executable file
        let n = apply_setattr(&Cred::root(), &f, &SetAttrs { uid: Some(5), ..Default::default() }, now).unwrap();
        assert_eq!((n.uid, n.perm, n.ctime), (5, 0o755, now));
        assert_eq!(
            apply_setattr(&alice, &f, &SetAttrs { uid: Some(5), ..Default::default() }, now).unwrap_err().errno,
            Errno::EPERM
        );
        assert_eq!(
            apply_setattr(&eve, &f, &SetAttrs { perm: Some(0o777), ..Default::default() }, now).unwrap_err().errno,
            Errno::EPERM
        );
        let n = apply_setattr(&alice, &f, &SetAttrs { size: Some(10), ..Default::default() }, now).unwrap();
        assert_eq!((n.size, n.mtime), (10, now));
        assert_eq!(
            apply_setattr(&eve, &f, &SetAttrs { size: Some(10), ..Default::default() }, now).unwrap_err().errno,
            Errno::EACCES
        );
        let at = Some(TimeSet::At(Timestamp { secs: 7, nsecs: 1 }));
        assert_eq!(
            apply_setattr(&eve, &f, &SetAttrs { mtime: at, ..Default::default() }, now).unwrap_err().errno,
            Errno::EPERM
        );
        let n =
            apply_setattr(&alice, &f, &SetAttrs { mtime: at, atime: Some(TimeSet::Now), ..Default::default() }, now)
                .unwrap();
        assert_eq!((n.mtime.secs, n.atime), (7, now));
        let mut d = file(1000, 0o755);
        d.kind = FileKind::Dir;
        assert_eq!(
            apply_setattr(&alice, &d, &SetAttrs { size: Some(0), ..Default::default() }, now).unwrap_err().errno,
            Errno::EISDIR
        );
        // nothing asked, nothing changed
        assert_eq!(apply_setattr(&alice, &f, &SetAttrs::default(), now).unwrap(), f);
    }

    #[test]
    fn size_changes_by_non_root_clear_set_id_bits() {
        let now = Timestamp { secs: 50, nsecs: 0 };
        let size = SetAttrs { size: Some(1), ..Default::default() };
        let bob = Cred { uid: 1001, gid: 1001, groups: vec![] };
        let group = Cred { uid: 1001, gid: 1001, groups: vec![1000] };
        // set-group-ID with group execute goes for anyone without CAP_FSETID
        let n = apply_setattr(&bob, &file(1000, 0o6777), &size, now).unwrap();
        assert_eq!(n.perm, 0o777);
        // without group execute it stays for a member of the file's group only
        assert_eq!(apply_setattr(&group, &file(1000, 0o6666), &size, now).unwrap().perm, 0o2666);
        assert_eq!(apply_setattr(&bob, &file(1000, 0o6666), &size, now).unwrap().perm, 0o666);
        // root keeps them
        assert_eq!(apply_setattr(&Cred::root(), &file(1000, 0o6777), &size, now).unwrap().perm, 0o6777);
    }
}
