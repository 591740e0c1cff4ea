//! `link(ino, dir, name)`: local, or across servers (intent → `PeerLinkDelta(+1)` → entry).

use super::*;
use crate::error::{fail, Fail, R};
use crate::locks::Pin;
use crate::ops::*;
use crate::state::{derive_op, State};
use crate::steps;
use crate::steps::engine::{self, unknown, Ctx, End};
use crate::store::meta::{EntryRecord, Intent};
use shoal_proto::change::ChangeKind;
use shoal_proto::msg::{Attr, Cred, EntryOut, FileKind, Op, Reply};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

pub async fn link(st: &Arc<State>, cred: Cred, ino: Ino, dir: Ino, name: String) -> R<Reply> {
    name_ok(&name)?;
    if st.is_home(ino) {
        let (g, part) = lock_entry(st, dir, &name, true, &[dir, ino], &[(dir, &name)], 0).await?;
        let reply = st
            .store(move |st| {
                let mut txn = st.meta.txn();
                let now = now();
                let parent = parent_of(st, &mut txn, dir)?;
                may_change(&cred, dir, &parent)?;
                if txn.entry(dir, &name)?.is_some() {
                    return Err(exists(dir, &name));
                }
                let rec = txn.inode_mut(ino)?;
                if rec.kind == FileKind::Dir {
                    return fail(Errno::EPERM, format!("{ino} is a directory; directories cannot be hard-linked"));
                }
                may_hardlink(&cred, ino, &rec.owner())?;
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
                txn.log_change(changes::entry(ChangeKind::Link, cred.uid, dir, parent.owner(), &name, ino, rec.kind));
                dir_changed(st, &mut txn, dir, now, 0)?;
                txn.commit()?;
                Ok(Reply::Entry(EntryOut {
                    ino,
                    kind: rec.kind,
                    attr: Some(rec.to_attr(ino, 0)),
                    cap: None,
                    attr_lease: None,
                }))
            })
            .await?;
        drop(g);
        split::after_insert(st, dir, part);
        return Ok(reply);
    }

    // The inode lives elsewhere: learn its kind (refusing directories early), then
    // intent → PeerLinkDelta(+1) → entry.
    let attr = st.getattr(ino).await?;
    if attr.kind == FileKind::Dir {
        return fail(Errno::EPERM, format!("{ino} is a directory; directories cannot be hard-linked"));
    }
    may_hardlink(&cred, ino, &crate::perm::Owner { uid: attr.uid, gid: attr.gid, perm: attr.perm, kind: attr.kind })?;
    let kind = attr.kind;
    let op_id = st.new_op_id();
    let _active = st.activate(op_id);
    {
        let (_g, _) = lock_entry(st, dir, &name, true, &[dir], &[(dir, &name)], 0).await?;
        let (n2, c2) = (name.clone(), cred.clone());
        st.store(move |st| {
            let mut txn = st.meta.txn();
            let parent = parent_of(st, &mut txn, dir)?;
            may_change(&c2, dir, &parent)?;
            if txn.entry(dir, &n2)?.is_some() {
                return Err(exists(dir, &n2));
            }
            txn.put_intent(op_id, Intent::Link { dir, name: n2, ino, kind }, now().secs);
            txn.commit()
        })
        .await?;
        st.locks.pin(dir, &name, op_id, Pin::Writes);
    }
    let intent = Intent::Link { dir, name, ino, kind };
    steps::drive(st, op_id, &intent, Ctx { attr: Some(attr), cred: Some(cred), ..Ctx::default() }).await
}

/// [`crate::perm::may_hardlink`] as the request's error, naming the inode.
fn may_hardlink(cred: &Cred, ino: Ino, o: &crate::perm::Owner) -> R<()> {
    crate::perm::may_hardlink(cred, o).map_err(|e| {
        Fail::new(
            e,
            format!(
                "uid {} may not hard-link {ino} (owned by uid {}, mode {:o}): only its owner, or a user who may read and write a plain file (protected_hardlinks)",
                cred.uid, o.uid, o.perm
            ),
        )
    })
}

/// Drive a `Link` intent (step `link.nlink`: `PeerLinkDelta(+1)` at the inode's home, applied
/// once per op id; finish: the entry). If the directory went away or the name was taken
/// meanwhile, the link is taken back (step `link.undo`) and the link refused. `attr`: the
/// inode's attributes the request fetched, for its reply.
#[allow(clippy::too_many_arguments)] // the intent's fields, and what only the live request knows
pub async fn resume(
    st: &Arc<State>,
    op_id: u64,
    dir: Ino,
    name: &str,
    ino: Ino,
    kind: FileKind,
    attr: Option<Attr>,
    uid: u32,
) -> End {
    let home = st.home(ino);
    let reply = match engine::remote(
        st,
        "link",
        "nlink",
        home,
        None,
        Op::PeerLinkDelta {
            ino,
            delta: 1,
            op_id,
            orphan_of: None,
            session: crate::leases::Leases::caller().map(|c| c.session),
        },
    )
    .await
    {
        Ok(reply) => reply,
        Err(e) if unknown(e) => return End::Kept(Fail::peer(home, e)),
        Err(e) => {
            // The inode is gone (or refuses links): the link cannot happen.
            return match delete_intent(st, op_id).await {
                Ok(()) => End::Refused(Fail::peer(home, e)),
                Err(f) => End::Kept(f),
            };
        }
    };
    match finish(st, op_id, dir, name, ino, kind, uid).await {
        Ok(true) => {}
        Ok(false) => {
            return End::Refused(Fail::new(Errno::ENOENT, format!("directory {dir} was removed or {name:?} was taken")))
        }
        Err(f) => return End::Kept(f),
    }
    let Some(mut attr) = attr else { return End::Done(Reply::Ok) };
    if let Reply::NLink(n) = reply {
        attr.nlink = n;
    }
    attr.ctime = now();
    End::Done(Reply::Entry(EntryOut { ino, kind, attr: Some(attr), cap: None, attr_lease: None }))
}

/// Finish of a cross-server link, after `PeerLinkDelta(+1)` succeeded: commit the entry,
/// or, if the directory went away or the name was taken, take the link back. Returns whether
/// the entry was committed.
async fn finish(st: &Arc<State>, op_id: u64, dir: Ino, name: &str, ino: Ino, kind: FileKind, uid: u32) -> R<bool> {
    let committed = engine::finish("link", async {
        let _g = st.locks.lock_names(&[dir], &[(dir, name)], op_id).await?;
        let name = name.to_string();
        st.store(move |st| {
            let mut txn = st.meta.txn();
            let now = now();
            let parent = match parent_of(st, &mut txn, dir) {
                Ok(r) if r.kind == FileKind::Dir => r,
                _ => return Ok(false),
            };
            if txn.entry(dir, &name)?.is_some() {
                return Ok(false);
            }
            txn.put_entry(dir, &name, EntryRecord { ino, kind });
            txn.log_change(changes::entry(ChangeKind::Link, uid, dir, parent.owner(), &name, ino, kind));
            dir_changed(st, &mut txn, dir, now, 0)?;
            txn.delete_intent(op_id);
            txn.commit()?;
            Ok(true)
        })
        .await
    })
    .await?;
    if committed {
        if let Ok((part, _)) = route_read(st, dir, name).await {
            split::after_insert(st, dir, part);
        }
    }
    if !committed {
        let home = st.home(ino);
        let undo = Op::PeerLinkDelta { ino, delta: -1, op_id: derive_op(op_id, 1), orphan_of: None, session: None };
        match engine::remote(st, "link", "undo", home, None, undo).await {
            Ok(_) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(Fail::peer(home, e)),
        }
        delete_intent(st, op_id).await?;
    }
    Ok(committed)
}
