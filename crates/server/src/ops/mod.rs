//! Operation handlers, grouped by what they act on: the namespace (directory entries, at the
//! directory's home), inodes (at the inode's home), data objects, and the steps servers ask
//! of each other. Shared here: the pattern for checks that need a remote inode's owner, and
//! the work left after a commit.

pub mod changes;
pub mod data;
pub mod fetch;
pub mod find;
pub mod inode;
pub mod namespace;
pub mod peer;
pub mod truncate;
pub mod tuples;
pub mod usage;

use crate::error::{Fail, R};
use crate::perm::Owner;
use crate::state::State;
use crate::store::meta::{GcRecord, InodeRecord, OrphanRecord, Txn};
use shoal_proto::msg::{check_name, FileKind, Timestamp};
use shoal_proto::{Errno, Ino};
use std::collections::HashMap;
use std::sync::Arc;

pub fn now() -> Timestamp {
    Timestamp::now()
}

/// A name as a path component must be (ENAMETOOLONG / EINVAL).
pub fn name_ok(name: &str) -> R<()> {
    check_name(name).map_err(|e| match e {
        Errno::ENAMETOOLONG => Fail::new(e, format!("name of {} bytes is longer than 255", name.len())),
        _ => Fail::new(e, format!("{name:?} is not a valid file name")),
    })
}

/// Attach what was denied to a permission error.
pub fn denied(e: Errno, what: impl std::fmt::Display) -> Fail {
    Fail::new(e, format!("permission denied on {what}"))
}

/// Outcome of a locked step that may need information it cannot get while holding locks.
pub enum Step<T> {
    Done(T),
    /// The owner of this inode (homed elsewhere) is needed: fetch it and run again.
    Need(Ino),
    /// What was read before locking changed: read again and run again.
    Retry,
}

/// Owners of remote inodes fetched for a check (sticky directories, moved directories).
pub type Known = HashMap<Ino, Owner>;

/// Stand-in owner of an inode that no longer exists: matches nobody but root.
pub const NOBODY: Owner = Owner { uid: u32::MAX, gid: u32::MAX, perm: 0, kind: FileKind::File };

/// The owner of `ino`, if known here (local inode, or fetched earlier). `None`: fetch it.
pub fn owner_of(st: &State, txn: &mut Txn<'_>, known: &Known, ino: Ino) -> R<Option<Owner>> {
    if let Some(o) = known.get(&ino) {
        return Ok(Some(*o));
    }
    if st.is_home(ino) {
        return Ok(Some(txn.inode(ino)?.map(InodeRecord::owner).unwrap_or(NOBODY)));
    }
    Ok(None)
}

/// Fetch the owner of a remote inode into `known` (an inode that vanished owns nothing).
pub async fn fetch_owner(st: &Arc<State>, known: &mut Known, ino: Ino) -> R<()> {
    let o = match st.getattr(ino).await {
        Ok(a) => Owner { uid: a.uid, gid: a.gid, perm: a.perm, kind: a.kind },
        Err(f) if f.errno == Errno::ENOENT => NOBODY,
        Err(f) => return Err(f),
    };
    known.insert(ino, o);
    Ok(())
}

/// `owner_of`, returning `Step::Need` from the enclosing function when unknown.
macro_rules! owner_or_need {
    ($st:expr, $txn:expr, $known:expr, $ino:expr) => {
        match $crate::ops::owner_of($st, $txn, $known, $ino)? {
            Some(o) => o,
            None => return Ok($crate::ops::Step::Need($ino).into()),
        }
    };
}
pub(crate) use owner_or_need;

/// Remove one name of a local inode: link count −1, and at zero the inode, its attributes
/// and (through a durable gc record) its data objects. Returns the gc record to act on
/// after the commit. An inode that is already gone is fine.
///
/// `orphan_of`: the client session that removes the name has the file open. At zero the
/// file then stays, without a name and with link count 0, as that session's orphan (an
/// `O` record in the same batch) until it is released (`orphans.rs`).
pub fn drop_link(txn: &mut Txn<'_>, ino: Ino, now: Timestamp, orphan_of: Option<u64>) -> R<Option<GcRecord>> {
    let Some(rec) = txn.inode(ino)? else { return Ok(None) };
    if rec.nlink > 1 && rec.kind != FileKind::Dir {
        let r = txn.inode_mut(ino)?;
        r.nlink -= 1;
        r.ctime = now;
        return Ok(None);
    }
    if let (Some(session), FileKind::File) = (orphan_of, rec.kind) {
        let r = txn.inode_mut(ino)?;
        r.nlink = 0;
        r.ctime = now;
        txn.put_orphan(ino, &OrphanRecord { session, since: now.secs });
        return Ok(None);
    }
    delete_inode(txn, ino, now)
}

/// Delete a local inode now (its last name is gone, or it was an orphan), its attributes
/// and, through a durable gc record returned to act on after the commit, its data objects.
pub fn delete_inode(txn: &mut Txn<'_>, ino: Ino, now: Timestamp) -> R<Option<GcRecord>> {
    let old = txn.remove_inode(ino)?;
    match old.and_then(|r| r.layout) {
        Some(layout) => {
            let g = GcRecord { created: now.secs, layout };
            txn.put_gc(ino, &g);
            Ok(Some(g))
        }
        None => Ok(None),
    }
}

/// Link count of a directory +1 (a subdirectory arrived).
pub fn dir_nlink_inc(txn: &mut Txn<'_>, dir: Ino) -> R<()> {
    let d = txn.inode_mut(dir)?;
    d.nlink = d.nlink.saturating_add(1);
    Ok(())
}

/// Link count of a directory −1 (a subdirectory left); never below 2.
pub fn dir_nlink_dec(txn: &mut Txn<'_>, dir: Ino) -> R<()> {
    let d = txn.inode_mut(dir)?;
    d.nlink = d.nlink.saturating_sub(1).max(2);
    Ok(())
}

/// Work that follows a commit: object deletions, link count drops and parent pointer updates
/// on other servers, each covered by a durable record written in the commit (so a failure
/// here only delays it until the recovery loop).
#[derive(Default)]
pub struct After {
    pub gc: Vec<(Ino, GcRecord)>,
    /// (op id of an `Unlink`/`UnlinkKeep` intent, inode, session keeping it open)
    pub unlinks: Vec<(u64, Ino, Option<u64>)>,
    /// (op id of a `SetParent` intent, inode, new parent)
    pub set_parents: Vec<(u64, Ino, Ino)>,
}

impl After {
    pub async fn run(self, st: &Arc<State>) {
        for (ino, g) in self.gc {
            st.queue_gc(ino, g);
        }
        for (op_id, ino, keep) in self.unlinks {
            if let Some(_a) = st.activate(op_id) {
                let intent = namespace::unlink_intent(ino, keep);
                if let Err(e) = Box::pin(crate::steps::drive(st, op_id, &intent, Default::default())).await {
                    tracing::info!("link count drop of {ino} left for recovery: {e}");
                }
            }
        }
        for (op_id, ino, parent) in self.set_parents {
            if let Some(_a) = st.activate(op_id) {
                let intent = crate::store::meta::Intent::SetParent { ino, parent };
                if let Err(e) = Box::pin(crate::steps::drive(st, op_id, &intent, Default::default())).await {
                    tracing::info!("parent update of {ino} left for recovery: {e}");
                }
            }
        }
    }
}

/// Delete an intent (after its remote step failed for good, or was undone).
pub async fn delete_intent(st: &Arc<State>, op_id: u64) -> R<()> {
    st.store(move |st| {
        let mut t = st.meta.txn();
        t.delete_intent(op_id);
        t.commit()
    })
    .await
}
