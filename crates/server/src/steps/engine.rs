//! The step engine: how an operation that spans servers runs, live and after a crash.
//!
//! Such an operation is
//!
//! 1. an **intent** (`t` op-id record), committed on the coordinating server before any
//!    remote step — in the same batch as any local change that must not happen without it
//!    (an unlink's removed entry) — with the entry it changes *pinned* (`locks.rs`);
//! 2. a list of **remote steps**, each one request to one peer, idempotent or deduplicated
//!    there by op id (`AppliedRecord`s): sending one twice changes nothing;
//! 3. a **finish**: one local batch that makes the local change and deletes the intent.
//!
//! The request that wrote the intent drives it through [`drive`]; the recovery loop
//! (`intents.rs`) drives every intent it finds through the same [`drive`], which resumes it
//! from its recorded progress: the intent exists, so the finish has not committed, and the
//! remote steps are simply sent again (each one applied at most once). Every operation's
//! logic therefore exists once, in its own file under `ops/namespace/` (`resume` there).
//!
//! Each run ends one of three ways ([`End`]): done (intent gone, the operation happened —
//! or, for a mkdir whose attributes recovery does not know, was rolled back), refused
//! (intent gone, nothing happened: a peer's clear answer such as ENOTEMPTY), or kept (the
//! outcome is unknown — a peer unreachable, timed out or failing — and the intent stays
//! for the next recovery round, with its entry still pinned).
//!
//! Failpoints (`failpoints.rs`) sit before and after every remote step ([`remote`]) and
//! after every finish ([`finish`]); crash tests stop a server at each of them.

use super::failpoints::{point, At};
use crate::error::{is_transport, Fail, R};
use crate::ops::namespace::{link, mkdir, rename, rmdir, split, unlink};
use crate::state::State;
use crate::store::meta::{InodeRecord, Intent};
use shoal_proto::msg::{Attr, Cred, KeepOpen, Op, Reply};
use shoal_proto::{Errno, ServerId};
use std::future::Future;
use std::sync::Arc;

/// What only the live request knows beyond the intent record. Recovery drives with
/// `Ctx::default()`.
#[derive(Default)]
pub struct Ctx {
    /// The caller, on whose behalf peer steps that check permissions are sent (root when
    /// recovery sends them: the checks were made when the intent was written).
    pub cred: Option<Cred>,
    /// The file the client has open under a name a rename replaces.
    pub keep: Option<KeepOpen>,
    /// A mkdir's new directory (recovery, without it, rolls the mkdir back).
    pub made: Option<InodeRecord>,
    /// A link's inode attributes as fetched before the intent, for the reply.
    pub attr: Option<Attr>,
}

/// How a run of an intent ended. (A reply is bigger than a failure; an `End` lives once per
/// cross-server operation, so it is not boxed.)
#[allow(clippy::large_enum_variant)]
pub enum End {
    /// The intent is gone and the operation complete (or rolled back): the reply.
    Done(Reply),
    /// The intent is gone and the operation did not happen: the error for the client.
    Refused(Fail),
    /// The outcome is not known yet: the intent stays for recovery (and its pin with it).
    Kept(Fail),
}

/// A peer's error after which the step must be sent again later: the outcome is unknown
/// (transport) or the peer failed internally (EIO) or was busy (EBUSY).
pub fn unknown(e: Errno) -> bool {
    is_transport(e) || e == Errno::EIO || e == Errno::EBUSY
}

/// Drive intent `op_id` to its end from wherever it stands, and unpin its entry unless it
/// is kept. The one entry point of live requests and recovery alike.
pub async fn drive(st: &Arc<State>, op_id: u64, intent: &Intent, ctx: Ctx) -> R<Reply> {
    match run(st, op_id, intent, ctx).await {
        End::Done(reply) => Ok(reply),
        End::Refused(f) | End::Kept(f) => Err(f),
    }
}

/// [`drive`], telling how it ended.
pub async fn run(st: &Arc<State>, op_id: u64, intent: &Intent, ctx: Ctx) -> End {
    let end = match intent {
        Intent::Mkdir { dir, name, ino } => mkdir::resume(st, op_id, *dir, name, *ino, ctx.made).await,
        Intent::Link { dir, name, ino, kind } => {
            let uid = ctx.cred.as_ref().map_or(crate::ops::changes::UNKNOWN_UID, |c| c.uid);
            link::resume(st, op_id, *dir, name, *ino, *kind, ctx.attr, uid).await
        }
        Intent::Unlink { ino } => unlink::resume(st, op_id, *ino, None).await,
        Intent::UnlinkKeep { ino, session } => unlink::resume(st, op_id, *ino, Some(*session)).await,
        Intent::Rmdir { dir, name, ino } => {
            let uid = ctx.cred.as_ref().map_or(crate::ops::changes::UNKNOWN_UID, |c| c.uid);
            rmdir::resume(st, op_id, *dir, name, *ino, uid).await
        }
        Intent::Rename { src_dir, src_name, dst_dir, dst_name, ino, kind, noreplace } => {
            let r = rename::Moving { src_dir: *src_dir, src_name, dst_dir: *dst_dir, dst_name, ino: *ino, kind: *kind };
            rename::resume(st, op_id, r, *noreplace, ctx.cred, ctx.keep).await
        }
        Intent::SetParent { ino, parent } => rename::resume_set_parent(st, op_id, *ino, *parent).await,
        Intent::Split { dir, index, depth } => split::resume(st, op_id, *dir, *index, *depth).await,
        Intent::PartitionAttr { dir } => split::resume_partition_attr(st, op_id, *dir).await,
        Intent::Truncate { ino, size, sized } => crate::ops::truncate::resume(st, op_id, *ino, *size, *sized).await,
    };
    let unpin = || {
        if let Some((dir, name, _)) = intent.pinned_entry() {
            st.locks.unpin(dir, name, op_id);
        }
    };
    if !matches!(end, End::Kept(_)) {
        unpin();
    }
    end
}

/// Remote step `step` of operation `op`: one request to `server` on behalf of `cred`, with
/// failpoints `op.step.before` and `op.step.after` around it.
pub async fn remote(
    st: &Arc<State>,
    op: &str,
    step: &str,
    server: ServerId,
    cred: Option<&Cred>,
    req: Op,
) -> Result<Reply, Errno> {
    // The intent (and whatever this step follows from) survives `kill -9` from here on, so
    // a crash at the `before` point finds it (`State::peer` would flush it anyway).
    st.meta.flush_wal_to_os().map_err(|f| f.errno)?;
    point(op, step, At::Before);
    let r = match cred {
        Some(c) => st.peer_as(server, c, req).await,
        None => st.peer(server, req).await,
    };
    if r.is_ok() {
        point(op, step, At::After);
    }
    r
}

/// The finishing batch of operation `op` (it deletes the intent), with failpoint
/// `op.finish.after` once it committed.
pub async fn finish<T>(op: &str, batch: impl Future<Output = R<T>>) -> R<T> {
    let r = batch.await;
    if r.is_ok() {
        point(op, "finish", At::After);
    }
    r
}
