//! `unlink(dir, name)`: the entry goes; the link count drops here or at the inode's home.

use super::*;
use crate::error::{fail, is_transport, Fail, R};
use crate::locks::Locks;
use crate::ops::*;
use crate::perm::{self, W_OK, X_OK};
use crate::state::State;
use crate::steps;
use crate::steps::engine::{self, Ctx, End};
use crate::store::meta::Intent;
use shoal_proto::change::ChangeKind;
use shoal_proto::msg::{Cred, FileKind, KeepOpen, Op, Reply};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

enum Unlinked {
    Local(Option<crate::store::meta::GcRecord>, Ino),
    /// (inode, session keeping it open)
    Remote(Ino, Option<u64>),
    /// The entry's inode is here but its stripe was busy: lock it too and run again.
    Relock(Ino),
}

/// `keep`: the client has a file open; if the name is that file's last, the file becomes
/// the client session's orphan (at its home, which may be another server) instead of going.
pub async fn unlink(st: &Arc<State>, cred: Cred, dir: Ino, name: String, keep: Option<KeepOpen>) -> R<Reply> {
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
        let (step, part) = {
            let (_g, part) = lock_entry(st, dir, &name, false, &inos, &[(dir, &name)], 0).await?;
            let (n2, cred, known) = (name.clone(), cred.clone(), known.clone());
            let step = st
                .store(move |st| {
                    let mut txn = st.meta.txn();
                    let now = now();
                    let d = parent_of(st, &mut txn, dir)?.owner();
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
                    txn.log_change(changes::entry(ChangeKind::Unlink, cred.uid, dir, d, &n2, e.ino, e.kind));
                    dir_changed(st, &mut txn, dir, now, 0)?;
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
                .await?;
            (step, part)
        };
        if let Step::Done(Unlinked::Local(..) | Unlinked::Remote(..)) = step {
            st.parts.removed(dir, part);
        }
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
                let intent = unlink_intent(ino, orphan_of);
                if let Err(e) = steps::drive(st, op_id, &intent, Ctx::default()).await {
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

/// Drive an `Unlink`/`UnlinkKeep` intent, written in the batch that removed the name (step
/// `unlink.nlink`: `PeerLinkDelta(−1)` at the inode's home, applied once per op id; finish:
/// the intent goes). Always rolled forward: the name is already gone.
pub async fn resume(st: &Arc<State>, op_id: u64, ino: Ino, orphan_of: Option<u64>) -> End {
    let home = st.home(ino);
    match engine::remote(
        st,
        "unlink",
        "nlink",
        home,
        None,
        Op::PeerLinkDelta {
            ino,
            delta: -1,
            op_id,
            orphan_of,
            session: crate::leases::Leases::caller().map(|c| c.session),
        },
    )
    .await
    {
        Ok(_) | Err(Errno::ENOENT) => {}
        Err(e) if is_transport(e) || e == Errno::EIO => return End::Kept(Fail::peer(home, e)),
        Err(e) => tracing::warn!("dropping a link of {ino}: server {home} answered {e}; giving up"),
    }
    match engine::finish("unlink", delete_intent(st, op_id)).await {
        Ok(()) => End::Done(Reply::Ok),
        Err(f) => End::Kept(f),
    }
}
