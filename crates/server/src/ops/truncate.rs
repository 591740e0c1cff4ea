//! A shrinking truncate, crash-safe: its objects are cut (on whichever servers hold them)
//! under an intent, and a file never shows the old size over cut objects.
//!
//! The live request (`inode::setattr` → [`shrink`]):
//!
//! 1. commits a `Truncate { ino, size, sized: false }` intent (the inode keeps its old size);
//! 2. cuts every object to its share of `size` (failpoints `truncate.cut.before|after`);
//! 3. commits the new size and deletes the intent in one batch, if the inode is still the
//!    record the cut was made for (`truncate.finish.after`); otherwise it plans again.
//!
//! Whenever that sequence stops between 1 and 3 — the server killed, a peer unreachable —
//! the outcome is decided for the new size: the size is committed at once ([`settle`]: at
//! start-up before the server listens, in `intents::pin_pending`; or by the request whose
//! cut failed) and the intent becomes `sized: true`. A reader then sees the new size, and
//! reads stop there, so the zeros of a half-done cut are never inside the file.
//!
//! **Invariant while a `sized` intent is pending** (the file is in [`PendingCuts`]): bytes
//! beyond the committed size may still be old data, so nothing may extend the file until
//! the cut is done — every request that could ([`finish_pending`]: setattr, size
//! publication, writes and appends at the home, opens for writing) first drives the cut to
//! its end, or fails if it cannot. An extension after it therefore shows zeros past the
//! truncated size, as POSIX requires. The recovery loop drives the cut too (`resume`, from
//! `steps::engine`), with the same code.
//!
//! The cut is idempotent (`DataStore::truncate` only shortens), so resending it after a
//! crash is safe.

use super::inode::CAPS_XATTR;
use super::now;
use crate::error::{fail, Fail, R};
use crate::state::State;
use crate::steps::engine::{self, End};
use crate::steps::failpoints::{point, At};
use crate::store::meta::{InodeRecord, Intent, IntentRecord};
use futures::future::join_all;
use parking_lot::Mutex;
use shoal_placement::object_len;
use shoal_proto::change::ChangeKind;
use shoal_proto::msg::{Layout, Op, Reply};
use shoal_proto::{Errno, Ino};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a request waits for another task (the recovery loop, another request) that is
/// finishing the same pending cut before it gives up with EAGAIN. Longer than one peer
/// timeout, so a cut that succeeds is waited for.
const WAIT_FOR_OTHER: Duration = Duration::from_secs(20);
/// How often a waiting request looks again.
const POLL: Duration = Duration::from_millis(20);

/// Files whose size is committed smaller while objects beyond it may still hold old
/// bytes: ino → op id of the `sized` `Truncate` intent. Kept in memory, rebuilt at
/// start-up from the intents (`intents::pin_pending`).
#[derive(Default)]
pub struct PendingCuts(Mutex<HashMap<Ino, u64>>);

impl PendingCuts {
    fn insert(&self, ino: Ino, op_id: u64) {
        self.0.lock().insert(ino, op_id);
    }

    fn get(&self, ino: Ino) -> Option<u64> {
        self.0.lock().get(&ino).copied()
    }

    /// Forget `ino`'s pending cut if it is still `op_id`'s (a newer one stays).
    fn remove(&self, ino: Ino, op_id: u64) {
        let mut m = self.0.lock();
        if m.get(&ino) == Some(&op_id) {
            m.remove(&ino);
        }
    }
}

/// Cut every object of a file to its share of `size`, on whichever server holds it.
async fn cut_objects(st: &Arc<State>, ino: Ino, layout: &Layout, size: u64) -> R<()> {
    let cuts = layout.servers.iter().enumerate().map(|(i, &server)| {
        let index = i as u32;
        let len = object_len(layout, index, size);
        let copies = layout.replicas;
        async move {
            if server == st.id {
                st.blocking(move |st| st.data.truncate(ino, index, len, copies)).await
            } else {
                st.peer(server, Op::PeerTruncateObject { ino, index, len, copies })
                    .await
                    .map(|_| ())
                    .map_err(|e| Fail::peer(server, e))
            }
        }
    });
    join_all(cuts).await.into_iter().collect::<R<Vec<()>>>().map(|_| ())
}

/// The cut with its failpoints; the intent is made durable against `kill -9` first.
async fn cut(st: &Arc<State>, ino: Ino, layout: &Layout, size: u64) -> R<()> {
    st.meta.flush_wal_to_os()?;
    point("truncate", "cut", At::Before);
    cut_objects(st, ino, layout, size).await?;
    point("truncate", "cut", At::After);
    Ok(())
}

/// One attempt of the live shrink of `ino` from record `old` to `new` (`new.size` smaller),
/// run by `setattr` under op id `op_id` (which the caller holds active). `Ok(None)`: the
/// inode changed while the objects were cut; the caller plans again (the intent stays and
/// is overwritten by the next attempt). On a failed cut the new size is committed and the
/// rest of the cut left to recovery before the error is returned.
pub async fn shrink(
    st: &Arc<State>,
    op_id: u64,
    ino: Ino,
    old: InodeRecord,
    new: InodeRecord,
    layout: Layout,
    uid: u32,
) -> R<Option<Reply>> {
    let size = new.size;
    st.store(move |st| {
        let mut t = st.meta.txn();
        t.put_intent(op_id, Intent::Truncate { ino, size, sized: false }, now().secs);
        t.commit()
    })
    .await?;
    if let Err(e) = cut(st, ino, &layout, size).await {
        // Some objects may be cut already: under the old size they would read as zeros.
        settle(st, op_id, ino, size).await?;
        return Err(e);
    }
    let _g = st.locks.lock(&[ino]).await;
    let done = st
        .store(move |st| {
            if st.meta.get_inode(ino)?.as_ref() != Some(&old) {
                return Ok(None);
            }
            let mut txn = st.meta.txn();
            txn.put_inode(ino, new.clone())?;
            txn.log_change(crate::ops::changes::inode(ChangeKind::Setattr, uid, ino, &new, None));
            txn.delete_xattr(ino, CAPS_XATTR);
            txn.delete_intent(op_id);
            txn.commit()?;
            Ok(Some(Reply::Attr(st.attr_of(ino, &new, true))))
        })
        .await?;
    if done.is_some() {
        point("truncate", "finish", At::After);
    }
    Ok(done)
}

/// The shrink of a file that kept changing under [`shrink`]: the size is committed now
/// (after those changes) and the cut finished as recovery would. Returns the attributes.
pub async fn force(st: &Arc<State>, op_id: u64, ino: Ino, size: u64) -> R<Reply> {
    settle(st, op_id, ino, size).await?;
    match resume(st, op_id, ino, size, true).await {
        End::Done(_) => {}
        End::Refused(f) | End::Kept(f) => return Err(f),
    }
    st.store(move |st| {
        let rec = st.meta.get_inode(ino)?.ok_or_else(|| Fail::new(Errno::ENOENT, format!("{ino} was removed")))?;
        Ok(Reply::Attr(st.attr_of(ino, &rec, true)))
    })
    .await
}

/// Commit size `size` for `ino` (never growing it) and mark intent `op_id` `sized`, in one
/// batch, and remember the pending cut. `false` if the inode is gone (the intent is deleted
/// with nothing to cut: a removed file's objects are deleted whole). Synchronous, for
/// start-up; requests use [`settle`].
pub fn settle_now(st: &State, op_id: u64, ino: Ino, size: u64) -> R<bool> {
    let mut txn = st.meta.txn();
    if txn.inode(ino)?.is_none() {
        txn.delete_intent(op_id);
        txn.commit()?;
        return Ok(false);
    }
    let t = now();
    let rec = txn.inode_mut(ino)?;
    if rec.size > size {
        rec.size = size;
        rec.mtime = t;
        rec.ctime = t;
        // A size change drops file capabilities (as `setattr` does).
        txn.delete_xattr(ino, CAPS_XATTR);
    }
    txn.put_intent(op_id, Intent::Truncate { ino, size, sized: true }, t.secs);
    txn.commit()?;
    st.cuts.insert(ino, op_id);
    Ok(true)
}

/// [`settle_now`] under the inode's lock, off the runtime.
async fn settle(st: &Arc<State>, op_id: u64, ino: Ino, size: u64) -> R<bool> {
    let _g = st.locks.lock(&[ino]).await;
    st.store(move |st| settle_now(st, op_id, ino, size)).await
}

/// Drive a `Truncate` intent to its end (recovery, [`finish_pending`], [`force`]): commit
/// the size if that has not happened, cut, then delete the intent.
pub async fn resume(st: &Arc<State>, op_id: u64, ino: Ino, size: u64, sized: bool) -> End {
    if !sized {
        match settle(st, op_id, ino, size).await {
            Ok(true) => {}
            Ok(false) => return End::Done(Reply::Ok),
            Err(e) => return End::Kept(e),
        }
    }
    let layout = match st.store(move |st| Ok(st.meta.get_inode(ino)?.and_then(|r| r.layout))).await {
        Ok(l) => l,
        Err(e) => return End::Kept(e),
    };
    // A file without a layout has no objects; a removed one has its objects deleted whole.
    if let Some(layout) = layout {
        if let Err(e) = cut(st, ino, &layout, size).await {
            return End::Kept(e);
        }
    }
    match engine::finish("truncate", super::delete_intent(st, op_id)).await {
        Ok(()) => {
            st.cuts.remove(ino, op_id);
            End::Done(Reply::Ok)
        }
        Err(e) => End::Kept(e),
    }
}

/// Before anything may extend `ino`: finish its pending cut, if it has one (see the module
/// doc). Fails with the cut's error if a server holding one of its objects cannot be
/// reached, or EAGAIN if another task keeps finishing it for longer than [`WAIT_FOR_OTHER`].
pub async fn finish_pending(st: &Arc<State>, ino: Ino) -> R<()> {
    let deadline = Instant::now() + WAIT_FOR_OTHER;
    loop {
        let Some(op_id) = st.cuts.get(ino) else { return Ok(()) };
        if let Some(_active) = st.activate(op_id) {
            let size = match st.blocking(move |st| st.meta.get_intent(op_id)).await? {
                Some(IntentRecord { intent: Intent::Truncate { size, .. }, .. }) => size,
                // Finished by whoever held it before us.
                _ => {
                    st.cuts.remove(ino, op_id);
                    continue;
                }
            };
            match resume(st, op_id, ino, size, true).await {
                End::Done(_) => continue,
                End::Refused(f) | End::Kept(f) => {
                    return fail(
                        f.errno,
                        format!("{ino} cannot change until its truncation to {size} is finished: {}", f.message),
                    )
                }
            }
        }
        if Instant::now() >= deadline {
            return fail(Errno::EAGAIN, format!("{ino} is still being truncated by another task"));
        }
        tokio::time::sleep(POLL).await;
    }
}
