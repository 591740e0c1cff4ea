//! Each request's metadata commits, so that its reply can be tied to their fate when the
//! metadata log cannot be written (a full disk).
//!
//! Every request a connection receives runs with a [`Ticket`] ([`scope`]); the metadata store
//! records in it the RocksDB sequence number of each batch the request commits, and marks
//! it when the store refused it because an earlier log write had failed. Before its reply is
//! sent, the connection's writer calls [`settle`]:
//!
//! * Normally the group commit (`MetaStore::flush_wal_to_os`) succeeds in the generation the
//!   request started in: everything the request committed or read had reached the OS, and
//!   the reply goes out ([`Settled::Send`]).
//! * If the log write failed, RocksDB's memtable still holds commits whose log records never
//!   reached the file. The store is closed and reopened (`MetaStore::reopen`, at once, with
//!   the reserve file given back for room), which replays the log exactly as far as it was
//!   written; RocksDB's last sequence number after the replay says which commits survived.
//!   `settle` waits for that (bounded by [`REOPEN_WAIT`]), then: a request with a commit
//!   beyond it is answered with the failure's errno, ENOSPC ([`Settled::Lost`]); a request
//!   whose commits all survived gets its reply; a request that committed nothing (a read, a
//!   stat, or a write the failed store refused) is run again on the reopened store
//!   ([`Settled::Rerun`]), because what it read may have been one of the lost commits.
//!
//! So no reply ever reveals a lost commit, and only requests whose own effects were lost
//! see an error.

use super::meta::MetaStore;
use crate::error::Fail;
use parking_lot::Mutex;
use shoal_proto::Errno;
use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How long a reply waits for the metadata store to reopen after a failed log write. The
/// reopen needs about 2 MiB free, which the reserve file gives back; past this bound the
/// reply says the store is unavailable.
pub const REOPEN_WAIT: Duration = Duration::from_secs(10);

/// What one request committed to the metadata store.
#[derive(Debug)]
pub struct Ticket {
    state: Mutex<TicketState>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct TicketState {
    /// Store generation (see `MetaStore::generation`) when the request started.
    pub start_gen: u64,
    /// Whether the request committed anything; if so, the generation and last sequence
    /// number of its latest commit.
    pub committed: bool,
    pub gen: u64,
    pub last_seq: u64,
    /// A commit of an earlier generation was lost.
    pub lost: bool,
    /// The store refused a write or read because an earlier log write had failed.
    pub refused: bool,
    /// The last position the request appended to the replication log (`replica::log`), 0
    /// if none.
    pub replicated: u64,
    /// The hold its appended changes are held back under until its reply is appended
    /// (`ReplLog::hold`), 0 if none.
    pub hold: u64,
    /// The client request whose reply the intents it writes stand for (session, request
    /// id; 0 for none): see `IntentRecord::reply_to`.
    pub reply_session: u64,
    pub reply_request: u64,
}

impl TicketState {
    /// The request the intents written under this ticket answer, if any.
    pub fn reply_to(&self) -> Option<(u64, u64)> {
        (self.reply_session != 0).then_some((self.reply_session, self.reply_request))
    }
}

impl Ticket {
    pub fn new(start_gen: u64) -> Arc<Ticket> {
        Arc::new(Ticket { state: Mutex::new(TicketState { start_gen, ..Default::default() }) })
    }

    pub fn state(&self) -> TicketState {
        *self.state.lock()
    }

    /// Hold the request's changes back from the mirrors under `hold` (`ReplLog::hold`).
    pub fn set_hold(&self, hold: u64) {
        self.state.lock().hold = hold;
    }

    /// The intents the request writes answer client request (`session`, `request`):
    /// recovery keeps the reply it finishes one with under that name
    /// (`IntentRecord::reply_to`).
    pub fn set_reply_to(&self, session: u64, request: u64) {
        let mut s = self.state.lock();
        s.reply_session = session;
        s.reply_request = request;
    }
}

tokio::task_local! {
    static TICKET: Arc<Ticket>;
}

thread_local! {
    /// The ticket of the request a blocking task (`State::blocking`) works for.
    static BLOCKING_TICKET: RefCell<Option<Arc<Ticket>>> = const { RefCell::new(None) };
}

/// Run a request's handling with `ticket` as its ticket.
pub async fn scope<F: Future>(ticket: Arc<Ticket>, f: F) -> F::Output {
    TICKET.scope(ticket, f).await
}

/// The ticket of the request being handled on this task or blocking thread, if any
/// (background tasks have none).
pub fn current() -> Option<Arc<Ticket>> {
    TICKET.try_with(|t| t.clone()).ok().or_else(|| BLOCKING_TICKET.with(|t| t.borrow().clone()))
}

/// Run blocking work `f` on this thread for the request holding `ticket`.
pub fn on_thread<T>(ticket: Option<Arc<Ticket>>, f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            BLOCKING_TICKET.with(|t| *t.borrow_mut() = None);
        }
    }
    BLOCKING_TICKET.with(|t| *t.borrow_mut() = ticket);
    let _reset = Reset;
    f()
}

/// Record a commit (generation `gen`, last sequence number `seq`) for the current request.
pub fn record(meta: &MetaStore, gen: u64, seq: u64) {
    let Some(t) = current() else { return };
    let mut s = t.state.lock();
    if s.committed && s.gen != gen {
        // The earlier generation has ended (a reopen): its fate is known.
        if meta.lost_in(s.gen, s.last_seq) != Some(false) {
            s.lost = true;
        }
        s.last_seq = 0;
    }
    s.committed = true;
    s.gen = gen;
    s.last_seq = s.last_seq.max(seq);
}

/// Record that the current request appended position `pos` to the replication log.
pub fn record_replicated(pos: u64) {
    if let Some(t) = current() {
        let mut s = t.state.lock();
        s.replicated = s.replicated.max(pos);
    }
}

/// Note that the store refused the current request because of an earlier failed log write.
pub fn refused() {
    if let Some(t) = current() {
        t.state.lock().refused = true;
    }
}

/// What to do with a reply.
#[derive(Debug)]
pub enum Settled {
    /// Send it: everything it depends on reached the OS (or survived the reopen).
    Send,
    /// A commit of the request was lost: answer with this error instead.
    Lost(Fail),
    /// The request committed nothing but may have read lost commits, or was refused by the
    /// failed store: run it again (the store is open again).
    Rerun,
    /// The store did not reopen within [`REOPEN_WAIT`]: answer with this error.
    Unavailable(Fail),
}

/// The fate of a reply whose request holds `ticket`: see the module comment. Performs the
/// group commit; waits only after a failed log write.
pub async fn settle(meta: &MetaStore, ticket: &Ticket) -> Settled {
    let deadline = tokio::time::Instant::now() + REOPEN_WAIT;
    loop {
        let flushed = meta.flush_wal_to_os().is_ok();
        let gen = meta.generation();
        let t = ticket.state();
        if t.committed {
            let fate = if t.gen < gen { meta.lost_in(t.gen, t.last_seq) } else { flushed.then_some(false) };
            match fate {
                Some(false) if !t.lost => return Settled::Send,
                Some(_) => return Settled::Lost(lost(meta)),
                None if t.lost => return Settled::Lost(lost(meta)),
                None => {}
            }
        } else if flushed && t.start_gen == gen && !t.refused {
            return Settled::Send;
        } else if meta.failure().is_none() {
            return Settled::Rerun;
        }
        // The store is failed: wait for it to reopen.
        if !meta.wait_healthy(deadline).await {
            let cause = meta.failure_text();
            let (errno, what) = if t.committed {
                (meta.failure().unwrap_or(Errno::EIO), "this operation may not have been committed")
            } else {
                (Errno::EIO, "the request cannot be answered")
            };
            return Settled::Unavailable(Fail::new(
                errno,
                format!("metadata store not reopened within {REOPEN_WAIT:?} after its log could not be written ({cause}): {what}"),
            ));
        }
    }
}

fn lost(meta: &MetaStore) -> Fail {
    let (errno, cause) = meta.last_failure();
    Fail::new(
        errno,
        format!("not committed: the metadata log could not be written ({cause}); retry when space is free"),
    )
}
