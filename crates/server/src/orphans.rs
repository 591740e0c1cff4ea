//! Orphans: files that lost their last name while a client had them open (POSIX lets a
//! process keep using such a file until it closes it).
//!
//! The client says so in the unlink or rename (`KeepOpen`: the inode and its session id);
//! the inode's home then, in the batch that drops the last link, keeps the inode (link
//! count 0, data objects untouched) and writes an `O` record naming the owning session
//! instead of deleting it (`ops::drop_link`). The name is gone at once, so the directory
//! can be removed; the file is still read, written and stat'ed by inode number.
//!
//! An orphan goes, through the usual deletion path (`g` record, gc loop), when
//! * its session sends `ReleaseOrphan` (the client's last handle on it closed), or
//! * its session has had no connection to this server for the grace period (the client
//!   died or lost touch): the reclaim loop. A server that starts counts every session as
//!   disconnected since its start, so orphans left from before a restart go one grace
//!   period after it unless their client reconnects.

use crate::error::R;
use crate::ops::{delete_inode, now};
use crate::state::State;
use parking_lot::Mutex;
use shoal_proto::msg::Reply;
use shoal_proto::Ino;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default time an orphan outlives the last connection of its session (`--orphan-grace`).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);

/// Client sessions and their connections to this server.
pub struct Sessions {
    started: Instant,
    /// session → (open connections, when the last one closed)
    map: Mutex<HashMap<u64, (usize, Instant)>>,
}

/// One open connection of a session; dropping it records the disconnection.
pub struct Connected<'a> {
    sessions: &'a Sessions,
    session: u64,
}

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        let mut m = self.sessions.map.lock();
        if let Some(e) = m.get_mut(&self.session) {
            e.0 -= 1;
            e.1 = Instant::now();
        }
    }
}

impl Sessions {
    pub fn new() -> Sessions {
        Sessions { started: Instant::now(), map: Mutex::new(HashMap::new()) }
    }

    /// A connection of `session` opened (session 0 — servers — is not tracked).
    pub fn connected(&self, session: u64) -> Option<Connected<'_>> {
        if session == 0 {
            return None;
        }
        self.map.lock().entry(session).or_insert((0, Instant::now())).0 += 1;
        Some(Connected { sessions: self, session })
    }

    /// How long `session` has had no connection here (`None`: it has one now). A session
    /// never seen counts as disconnected since the server started.
    pub fn disconnected_for(&self, session: u64) -> Option<Duration> {
        match self.map.lock().get(&session) {
            Some((0, since)) => Some(since.elapsed()),
            Some(_) => None,
            None => Some(self.started.elapsed()),
        }
    }

    /// Forget sessions without connections for longer than `age` (their orphans are gone).
    fn prune(&self, age: Duration) {
        self.map.lock().retain(|_, (n, since)| *n > 0 || since.elapsed() < age);
    }
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::new()
    }
}

/// `ReleaseOrphan`: the last handle of `session` on `ino` closed.
pub async fn release(st: &Arc<State>, ino: Ino, session: u64) -> R<Reply> {
    st.require_home(ino)?;
    delete_orphan(st, ino, session).await?;
    Ok(Reply::Ok)
}

/// Delete orphan `ino` and queue its objects for deletion, if it is still an orphan of
/// `session`; otherwise nothing happens (released already, or never orphaned because
/// another name remained). Returns whether it deleted.
async fn delete_orphan(st: &Arc<State>, ino: Ino, session: u64) -> R<bool> {
    let _g = st.locks.lock(&[ino]).await;
    let gc = st
        .store(move |st| {
            match st.meta.get_orphan(ino)? {
                Some(o) if o.session == session => {}
                _ => return Ok(None),
            }
            let mut txn = st.meta.txn();
            txn.delete_orphan(ino);
            let gc = delete_inode(&mut txn, ino, now())?;
            txn.commit()?;
            Ok(Some(gc))
        })
        .await?;
    match gc {
        Some(g) => {
            if let Some(g) = g {
                st.queue_gc(ino, g);
            }
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Reclaim the orphans of sessions that have been disconnected for `grace`; checks a few
/// times per grace period (at most every 5 s).
pub async fn reclaim_loop(st: Arc<State>, grace: Duration) {
    let every = (grace / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        tokio::time::sleep(every).await;
        let orphans = match st.blocking(|st| st.meta.orphans()).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("listing orphans: {e}");
                continue;
            }
        };
        for (ino, o) in orphans {
            // Connected now, or not yet for long enough: keep it.
            if st.sessions.disconnected_for(o.session).is_none_or(|d| d < grace) {
                continue;
            }
            match delete_orphan(&st, ino, o.session).await {
                Ok(true) => tracing::info!(
                    "deleted {ino}, removed while open by client session {:#x}, which has been gone for {}s",
                    o.session,
                    grace.as_secs_f64()
                ),
                Ok(false) => {}
                Err(e) => tracing::warn!("deleting orphan {ino}: {e}"),
            }
        }
        st.sessions.prune(grace * 2);
    }
}
