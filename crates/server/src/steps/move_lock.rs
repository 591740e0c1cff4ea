//! The cluster's directory-move lock (Linux's per-filesystem `s_vfs_rename_mutex`, held by
//! one server).
//!
//! A rename that moves a directory to another parent first checks that the destination is
//! not inside the directory (EINVAL, rename(2)), by walking parent pointers up to the root
//! across servers. Two such moves running at once on different servers could each pass
//! that check against the tree before the other one — `A` into `B/…` and `B` into `A/…` —
//! and together cut both off from the root in a loop. So every such move takes this lock
//! before its check and gives it back once the move, parent pointer included, is complete
//! (`ops/namespace/rename.rs`): under it, the tree the check walks is the tree the move
//! changes. The lock lives on the home server of the root directory, which hands it to
//! one operation (op id) at a time through `PeerMoveLock`, steps `move_lock.take` and
//! `move_lock.give` of the step engine.
//!
//! Limits: a holder that dies (or whose move is left to recovery because a peer could not
//! be reached) keeps the lock until [`HOLD_MAX`] has passed, after which the next mover
//! takes it over; the lock is in memory, so a restart of its server frees it. A move
//! completed by recovery after that runs without it.

use crate::error::{Fail, R};
use crate::state::State;
use crate::steps::engine;
use parking_lot::Mutex;
use shoal_proto::msg::{Op, Reply};
use shoal_proto::{Errno, ServerId, ROOT_INO};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long a holder may keep the lock before the next mover takes it over.
pub const HOLD_MAX: Duration = Duration::from_secs(30);
/// How long a mover waits for the lock before EBUSY (within the peer timeout of 10 s).
const WAIT: Duration = Duration::from_secs(8);

/// The lock, as held by the root's home server.
#[derive(Default)]
pub struct MoveLock {
    holder: Mutex<Option<(u64, Instant)>>,
    freed: Notify,
}

impl MoveLock {
    /// Give the lock to `op_id` once it is free (at once if `op_id` holds it already).
    async fn take(&self, op_id: u64) -> R<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut h = self.holder.lock();
                match *h {
                    Some((o, _)) if o == op_id => return Ok(()),
                    Some((o, since)) if since.elapsed() < HOLD_MAX => {
                        let _ = o;
                    }
                    Some((o, _)) => {
                        tracing::warn!("directory-move lock held by {o:#x} for over {HOLD_MAX:?}: taken over");
                        *h = Some((op_id, Instant::now()));
                        return Ok(());
                    }
                    None => {
                        *h = Some((op_id, Instant::now()));
                        return Ok(());
                    }
                }
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(Fail::new(Errno::EBUSY, "other directories are being moved; try again"));
            }
        }
    }

    /// Free the lock if `op_id` holds it.
    fn give(&self, op_id: u64) {
        let mut h = self.holder.lock();
        if matches!(*h, Some((o, _)) if o == op_id) {
            *h = None;
            self.freed.notify_waiters();
        }
    }
}

/// `PeerMoveLock` at the root's home: take or give back the lock for `op_id`.
pub async fn peer(st: &Arc<State>, op_id: u64, hold: bool) -> R<Reply> {
    if !st.is_home(ROOT_INO) {
        return Err(Fail::new(Errno::EINVAL, "the directory-move lock is held by the root directory's home server"));
    }
    if hold {
        st.move_lock.take(op_id).await?;
    } else {
        st.move_lock.give(op_id);
    }
    Ok(Reply::Ok)
}

/// The lock, held by a rename; give it back with [`give`].
pub struct Held {
    op_id: u64,
}

fn server(st: &State) -> ServerId {
    st.home(ROOT_INO)
}

/// Take the lock for a directory move (waits while another move holds it).
pub async fn take(st: &Arc<State>) -> R<Held> {
    let op_id = st.new_op_id();
    let home = server(st);
    match engine::remote(st, "move_lock", "take", home, None, Op::PeerMoveLock { op_id, hold: true }).await {
        Ok(_) => Ok(Held { op_id }),
        Err(e) => Err(Fail::peer(home, e)),
    }
}

/// Give the lock back (a failure only delays the next mover until [`HOLD_MAX`]).
pub async fn give(st: &Arc<State>, held: Held) {
    let home = server(st);
    let op = Op::PeerMoveLock { op_id: held.op_id, hold: false };
    if let Err(e) = engine::remote(st, "move_lock", "give", home, None, op).await {
        tracing::warn!("giving back the directory-move lock on server {home}: {e}");
    }
}
