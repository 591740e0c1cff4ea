//! Intents and the recovery loop.
//!
//! An operation spanning servers writes an intent (`t` op-id) before its remote step and
//! deletes it in the batch that commits its local step. Whatever remains — because the
//! server crashed, or a peer could not be reached — is replayed here at start-up and then
//! every [`INTERVAL`]:
//!
//! | intent | replay |
//! |---|---|
//! | `Mkdir` | roll back: `PeerRmdirObject` of the new directory, drop the intent |
//! | `Link` | roll forward: `PeerLinkDelta(+1)` (deduplicated by op id), then the entry — or, if the name was taken or the directory went, `PeerLinkDelta(−1)` |
//! | `Unlink` | roll forward: `PeerLinkDelta(−1)` (deduplicated) |
//! | `Rmdir` | `PeerRmdirObject`; on success remove the entry, on ENOTEMPTY just drop the intent |
//! | `Rename` | roll forward: `PeerRenameIn` again (deduplicated), then remove the source entry |
//! | `SetParent` | `PeerSetParent` again |
//!
//! and pending object deletions (`g` records) are sent again. An unreachable peer leaves
//! the record for the next round. Intents that a live request is still driving (see
//! [`State::activate`]) are left alone.

use crate::error::{is_transport, Fail, R};
use crate::ops::{delete_intent, namespace};
use crate::state::State;
use crate::store::meta::{GcRecord, Intent, IntentRecord};
use shoal_proto::msg::{DirEntry, Op, Reply};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time between recovery rounds.
pub const INTERVAL: Duration = Duration::from_secs(5);
/// How often old "applied" markers are pruned (besides at start-up).
const PRUNE_INTERVAL: Duration = Duration::from_secs(3600);
/// "Applied" markers older than this are deleted: a peer step resent after a day is not
/// expected (the sender's intent is long resolved).
pub const APPLIED_MAX_AGE_SECS: i64 = 24 * 3600;
/// A `g` record younger than this is left to the task that wrote it.
const GC_GRACE_SECS: i64 = 10;

/// Pin the entries of intents found at start-up, so that no request changes them before
/// their replay resolves them.
pub fn pin_pending(st: &State, intents: &[(u64, IntentRecord)]) {
    for (op_id, rec) in intents {
        if let Some((dir, name)) = rec.intent.pinned_entry() {
            st.locks.pin(dir, name, *op_id);
        }
    }
}

/// Delete a deleted file's data objects in the background; the `g` record goes when every
/// server holding one has confirmed.
pub fn spawn_gc(st: &Arc<State>, ino: Ino, rec: GcRecord) {
    let st = st.clone();
    tokio::spawn(async move {
        if let Err(e) = run_gc(&st, ino, &rec).await {
            tracing::info!("deleting objects of {ino} left for recovery: {e}");
        }
    });
}

async fn run_gc(st: &Arc<State>, ino: Ino, rec: &GcRecord) -> R<()> {
    for server in rec.servers() {
        if server == st.id {
            st.blocking(move |st| st.data.delete_all(ino)).await?;
        } else {
            st.peer(server, Op::PeerDeleteObjects { ino }).await.map_err(|e| Fail::peer(server, e))?;
        }
    }
    st.blocking(move |st| {
        let mut t = st.meta.txn();
        t.delete_gc(ino);
        t.commit()
    })
    .await
}

/// Run the recovery loop until the task is aborted. Also prunes old "applied" markers now
/// and then, so a long-running server does not accumulate them.
pub async fn recovery_loop(st: Arc<State>) {
    let mut first = true;
    let mut last_prune = Instant::now();
    loop {
        recover_once(&st, first).await;
        first = false;
        if last_prune.elapsed() >= PRUNE_INTERVAL {
            last_prune = Instant::now();
            let now = shoal_proto::msg::Timestamp::now().secs;
            match st.blocking(move |st| st.meta.prune_applied(now, APPLIED_MAX_AGE_SECS)).await {
                Ok(n) if n > 0 => tracing::info!("pruned {n} old applied markers"),
                Ok(_) => {}
                Err(e) => tracing::warn!("pruning applied markers: {e}"),
            }
        }
        tokio::time::sleep(INTERVAL).await;
    }
}

/// One round over all intents and pending deletions. At start-up (`all`), also young
/// records are handled.
pub async fn recover_once(st: &Arc<State>, all: bool) {
    let intents = match st.blocking(|st| st.meta.intents()).await {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!("recovery: cannot list intents: {e}");
            return;
        }
    };
    for (op_id, rec) in intents {
        let Some(_active) = st.activate(op_id) else { continue };
        // The live request may have finished between the listing and the claim.
        match st.blocking(move |st| st.meta.get_intent(op_id)).await {
            Ok(Some(_)) => {}
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("recovery: {e}");
                continue;
            }
        }
        let what = format!("{:?}", rec.intent);
        match replay(st, op_id, rec.intent).await {
            Ok(()) => tracing::info!("recovery: resolved intent {op_id:#x}: {what}"),
            // Said once loudly at start-up, then quietly every round.
            Err(e) if all => tracing::info!("recovery: intent {op_id:#x} ({what}) not resolved yet: {e}"),
            Err(e) => tracing::debug!("recovery: intent {op_id:#x} ({what}) not resolved yet: {e}"),
        }
    }
    let gcs = match st.blocking(|st| st.meta.gc_records()).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!("recovery: cannot list pending object deletions: {e}");
            return;
        }
    };
    let now = shoal_proto::msg::Timestamp::now().secs;
    for (ino, rec) in gcs {
        if !all && now - rec.created < GC_GRACE_SECS {
            continue;
        }
        if let Err(e) = run_gc(st, ino, &rec).await {
            tracing::debug!("recovery: objects of {ino} not deleted yet: {e}");
        }
    }
}

/// An error after which a replay must be tried again later (the outcome is unknown or the
/// peer failed internally).
fn retry_later(e: Errno) -> bool {
    is_transport(e) || e == Errno::EIO || e == Errno::EBUSY
}

async fn replay(st: &Arc<State>, op_id: u64, intent: Intent) -> R<()> {
    match intent {
        Intent::Mkdir { ino, .. } => namespace::rollback_mkdir(st, op_id, ino).await,
        Intent::Link { dir, name, ino, kind } => {
            let home = st.home(ino);
            match st.peer(home, Op::PeerLinkDelta { ino, delta: 1, op_id }).await {
                Ok(_) => {
                    let r = namespace::finish_link(st, op_id, dir, &name, ino, kind).await;
                    if r.is_ok() {
                        st.locks.unpin(dir, &name, op_id);
                    }
                    r.map(|_| ())
                }
                Err(e) if retry_later(e) => Err(Fail::peer(home, e)),
                Err(e) => {
                    // The inode is gone (or refuses links): the link cannot happen.
                    delete_intent(st, op_id).await?;
                    st.locks.unpin(dir, &name, op_id);
                    tracing::warn!("recovery: link of {ino} as {name:?} abandoned: server {home} answered {e}");
                    Ok(())
                }
            }
        }
        Intent::Unlink { ino } => namespace::finish_unlink(st, op_id, ino).await,
        Intent::Rmdir { dir, name, ino } => {
            let home = st.home(ino);
            match st.peer(home, Op::PeerRmdirObject { ino, op_id }).await {
                Ok(_) => {
                    namespace::finish_rmdir(st, op_id, dir, &name, ino).await?;
                    st.locks.unpin(dir, &name, op_id);
                    Ok(())
                }
                Err(e) if retry_later(e) => Err(Fail::peer(home, e)),
                Err(e) => {
                    // ENOTEMPTY (or not a directory): the rmdir did not happen.
                    delete_intent(st, op_id).await?;
                    st.locks.unpin(dir, &name, op_id);
                    tracing::info!("recovery: rmdir of {name:?} abandoned: server {home} answered {e}");
                    Ok(())
                }
            }
        }
        Intent::Rename { src_dir, src_name, dst_dir, dst_name, ino, kind, noreplace } => {
            let home = st.home(dst_dir);
            let entry = DirEntry { name: dst_name.clone(), ino, kind };
            match st.peer(home, Op::PeerRenameIn { dst_dir, dst_name, entry, noreplace, op_id }).await {
                Ok(Reply::Replaced(Some(old))) if old.ino == ino => {
                    delete_intent(st, op_id).await?;
                    st.locks.unpin(src_dir, &src_name, op_id);
                    Ok(())
                }
                Ok(_) => {
                    namespace::finish_rename_source(st, op_id, src_dir, &src_name, dst_dir, ino, kind).await?;
                    st.locks.unpin(src_dir, &src_name, op_id);
                    Ok(())
                }
                Err(e) if retry_later(e) => Err(Fail::peer(home, e)),
                Err(e) => {
                    delete_intent(st, op_id).await?;
                    st.locks.unpin(src_dir, &src_name, op_id);
                    tracing::warn!("recovery: rename of {src_name:?} abandoned: server {home} answered {e}");
                    Ok(())
                }
            }
        }
        Intent::SetParent { ino, parent } => namespace::finish_set_parent(st, op_id, ino, parent).await,
    }
}

#[cfg(test)]
mod tests {
    use crate::state::derive_op;

    #[test]
    fn derived_op_ids_differ_and_are_stable() {
        let a = derive_op(12345, 1);
        assert_eq!(a, derive_op(12345, 1));
        assert_ne!(a, derive_op(12345, 2));
        assert_ne!(a, 12345);
    }
}
