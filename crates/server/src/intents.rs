//! Intents and the recovery loop.
//!
//! An operation spanning servers writes an intent (`t` op-id) before its remote step and
//! deletes it in the batch that commits its local step. Whatever remains — because the
//! server crashed, or a peer could not be reached — is replayed here at start-up and then
//! every [`INTERVAL`]: each intent is handed to the step engine (`steps::engine::drive`),
//! which resumes it through the same code the live request ran — its remote steps sent
//! again (each applied at most once), then its finish. Mkdirs are rolled back (recovery
//! does not know the new directory's attributes), everything else is rolled forward
//! (see each operation's `resume` in `ops/namespace/`, and a truncate's in `ops/truncate.rs`).
//!
//! Pending object deletions (`g` records) are sent again. An unreachable peer leaves
//! the record for the next round. Intents that a live request is still driving (see
//! [`State::activate`]) are left alone.

use crate::error::{Fail, R};
use crate::state::State;
use crate::steps;
use crate::store::meta::{GcRecord, IntentRecord};
use shoal_proto::msg::{Op, Reply};
use shoal_proto::{Ino, ServerId};
use std::collections::BTreeMap;
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

/// Pin the entries of intents found at start-up, and freeze the moving halves of splits, so
/// that no request changes them before their replay resolves them. Interrupted truncates
/// get their new size now, before the server listens (`ops/truncate.rs`): from the first
/// request on, the file reads as truncated, never as its old size over cut objects.
pub fn pin_pending(st: &State, intents: &[(u64, IntentRecord)]) -> R<()> {
    for (op_id, rec) in intents {
        if let crate::store::meta::Intent::Truncate { ino, size, .. } = rec.intent {
            crate::ops::truncate::settle_now(st, *op_id, ino, size)?;
        }
        if let Some((dir, name, kind)) = rec.intent.pinned_entry() {
            st.locks.pin(dir, name, *op_id, kind);
        }
        // A split's moving half stays frozen until its replay finishes it.
        if let crate::store::meta::Intent::Split { dir, index, depth } = rec.intent {
            // (A directory removed since has nothing to freeze: the replay drops the intent.)
            let attrs = match st.parts.attrs(dir) {
                Some(a) => Some(a),
                None => st.meta.get_inode(dir)?,
            };
            if let Some(attrs) = attrs {
                st.parts.freeze(dir, index, depth, &attrs);
            }
        }
    }
    Ok(())
}

/// Most objects one deletion round asks of one server (keeps each request well inside the
/// frame limit: 12 bytes per object).
const GC_BATCH_OBJECTS: usize = 16_384;
/// How long the gc task lets deletions gather before a round.
const GC_GATHER: Duration = Duration::from_millis(50);

/// The gc task: delete the data objects of deleted files as `State::queue_gc` hands them
/// over. Whatever accumulated while a round ran goes in the next round, so under a burst of
/// unlinks each server gets one `PeerDeleteObjects` for many files instead of one per file.
/// A failed round leaves the `g` records to the recovery loop.
pub async fn gc_loop(st: Arc<State>) {
    loop {
        st.wait_for_gc().await;
        // Let a burst of unlinks gather: deleting objects is background work, and one round
        // for many files costs about what a round for one file costs.
        tokio::time::sleep(GC_GATHER).await;
        let files = st.take_gc_batch();
        if let Err(e) = delete_files_objects(&st, files).await {
            tracing::info!("deleting objects of unlinked files left for recovery: {e}");
        }
    }
}

/// Delete the objects of `files` (one request per server holding any, all servers at
/// once), then the `g` records of the files whose every server confirmed. The first error
/// is returned after the confirmed records are gone.
async fn delete_files_objects(st: &Arc<State>, mut files: Vec<(Ino, GcRecord)>) -> R<()> {
    let mut first_err = None;
    while !files.is_empty() {
        // Take files until the round holds GC_BATCH_OBJECTS objects (at least one file).
        let mut objects = 0;
        let mut take = 0;
        while take < files.len() && (take == 0 || objects + files[take].1.layout.servers.len() <= GC_BATCH_OBJECTS) {
            objects += files[take].1.layout.servers.len();
            take += 1;
        }
        let round: Vec<(Ino, GcRecord)> = files.drain(..take).collect();
        if let Err(e) = delete_round(st, round).await {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

async fn delete_round(st: &Arc<State>, files: Vec<(Ino, GcRecord)>) -> R<()> {
    let mut per_server: BTreeMap<ServerId, Vec<(Ino, u32)>> = BTreeMap::new();
    for (ino, rec) in &files {
        for (index, server) in rec.layout.servers.iter().enumerate() {
            per_server.entry(*server).or_default().push((*ino, index as u32));
        }
    }
    let results = futures::future::join_all(per_server.into_iter().map(|(server, objects)| async move {
        let r = if server == st.id {
            st.blocking(move |st| st.data.delete_objects(&objects)).await
        } else {
            st.peer(server, Op::PeerDeleteObjects { objects }).await.map(|_| ()).map_err(|e| Fail::peer(server, e))
        };
        (server, r)
    }))
    .await;
    let mut failed = Vec::new();
    let mut first_err = None;
    for (server, r) in results {
        if let Err(e) = r {
            failed.push(server);
            first_err.get_or_insert(e);
        }
    }
    let done: Vec<Ino> = files
        .iter()
        .filter(|(_, rec)| rec.layout.servers.iter().all(|s| !failed.contains(s)))
        .map(|(ino, _)| *ino)
        .collect();
    if !done.is_empty() {
        st.store(move |st| {
            let mut t = st.meta.txn();
            for ino in done {
                t.delete_gc(ino);
            }
            t.commit()
        })
        .await?;
    }
    first_err.map_or(Ok(()), Err)
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
        // Resume the intent from where it stands, through the same code the request that
        // wrote it ran (`steps::engine`).
        match steps::drive(st, op_id, &rec.intent, steps::Ctx::default()).await {
            Ok(reply) => {
                tracing::info!("recovery: resolved intent {op_id:#x}: {what}");
                // The client's retry of the request that wrote it gets this outcome.
                if let (Some((session, request)), Reply::Ok) = (rec.reply_to, &reply) {
                    st.keep_reply(session, request, reply);
                }
            }
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
    let due: Vec<(Ino, GcRecord)> =
        gcs.into_iter().filter(|(_, rec)| all || now - rec.created >= GC_GRACE_SECS).collect();
    if let Err(e) = delete_files_objects(st, due).await {
        tracing::debug!("recovery: objects of some deleted files not deleted yet: {e}");
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
