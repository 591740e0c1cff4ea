//! The replication log of a primary: every change made to the slot's stores, in the order
//! it was made, kept in memory until every mirror in sync has applied it.
//!
//! **Where positions come from.** A change is appended by the code that makes it, while it
//! holds what orders it: a metadata batch under the store's commit lock (`MetaStore::write`),
//! an object write, cut or deletion under the object's lock (`DataStore`), a cached reply
//! right after the reply cache took it. So two changes to the same key or the same bytes get
//! positions in the order they were applied here, and a mirror that applies the log in
//! position order ends with the same stores.
//!
//! **Acknowledgement.** Each request records the last position it appended in its ticket
//! (`store::commits`), and its reply waits until every mirror in sync has applied at least
//! the last position appended when the reply is ready ([`ReplLog::wait_acked`]): a reply
//! never reveals a change that one server's death could undo. A mirror that makes no
//! progress for [`OUT_OF_SYNC_AFTER`] is dropped from the set (the primary goes on alone,
//! and says so in its log and status) until it has been resynchronised (`resync.rs`).
//!
//! **Resync.** A mirror being resynchronised is `Resyncing` from position `p0` on: replies
//! do not wait for it, but the log keeps every change from `p0` for it (at most
//! [`RESYNC_LOG_MAX`] bytes; beyond, it is dropped again and the resync starts over later),
//! so that once its stores have caught up with the primary's it is shipped the log from
//! `p0` and, the moment it has applied the last position, is `InSync` again.
//!
//! **A change travels with its reply** ([`ReplLog::hold`]). A client's request that changes
//! something is answered once per request id: a retry gets the cached reply (`replies.rs`),
//! which the mirrors keep too, appended right after the request's changes. A mirror that
//! held the changes but not the reply, promoted after its primary died before answering,
//! would apply the retry again (a rename that happened would fail with `ENOENT`). So the
//! positions a request appends are *held*, not shipped, until its reply is appended (or it
//! waits for the mirrors itself, before a step to another server: a request never waits
//! for its own held positions), and the shipper never sends a batch that ends between a
//! change and its reply. A hold older than [`HOLD_MAX`] is let go all the same: a request
//! blocked between its change and its reply (on a lock held by another request that waits
//! for the mirrors, say) must cost a short delay, never a deadlock.
//!
//! Invariant: `entries` holds positions `base .. next` (exclusive), and every position below
//! `base` has been applied by every mirror in sync or resyncing.

use bytes::Bytes;
use parking_lot::Mutex;
use shoal_proto::msg::ReplChange;
use shoal_proto::ServerId;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// A mirror that applies nothing for this long while changes wait is dropped from the set
/// the primary waits for (the bound on how long a mirror's death stalls the slot).
pub const OUT_OF_SYNC_AFTER: Duration = Duration::from_secs(3);

/// Most bytes one `PeerReplicate` carries (changes are never split: a larger write goes
/// alone).
pub const SHIP_MAX_BYTES: usize = 8 << 20;

/// Longest a request's changes are held back waiting for its reply (see the module doc).
pub const HOLD_MAX: Duration = Duration::from_millis(50);

/// Most bytes of changes the log keeps for mirrors being resynchronised: a resync that
/// takes so long that more changes pile up than this is abandoned (and started over later)
/// rather than let the primary's memory grow with it.
pub const RESYNC_LOG_MAX: usize = 256 << 20;

/// Longest a changing request's reply is delayed while changes pile up for a mirror being
/// resynchronised ([`ReplLog::resync_delay`]).
pub const RESYNC_SLOWDOWN_MAX: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorState {
    /// Applies every change; replies wait for it.
    InSync,
    /// Being brought up to date (`resync.rs`): not waited for, but the log keeps the
    /// changes from the resync's start for it.
    Resyncing,
    /// Missed changes: not waited for, shipped nothing until it is resynchronised.
    OutOfSync,
}

#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub state: MirrorState,
    /// Last position it applied (while in sync or resyncing).
    pub applied: u64,
    /// The running (or last) resync's bytes compared, of how many.
    pub resync_done: u64,
    pub resync_total: u64,
    /// Bytes every resync of it shipped so far, and the resyncs finished.
    pub resync_shipped: u64,
    pub resyncs: u64,
}

impl Progress {
    fn new(state: MirrorState) -> Progress {
        Progress { state, applied: 0, resync_done: 0, resync_total: 0, resync_shipped: 0, resyncs: 0 }
    }

    /// Whether the log keeps changes for it.
    fn follows(&self) -> bool {
        matches!(self.state, MirrorState::InSync | MirrorState::Resyncing)
    }
}

struct Inner {
    base: u64,
    next: u64,
    entries: VecDeque<(ReplChange, Bytes)>,
    /// Bytes held in `entries` (data and batches).
    bytes: usize,
    mirrors: BTreeMap<ServerId, Progress>,
    /// Positions not to be shipped yet: appended by a request whose reply is not appended
    /// yet, with its hold and when the hold began. Only positions `>= base`.
    held: BTreeMap<u64, (u64, Instant)>,
    /// The positions of each hold in `held`.
    holds: HashMap<u64, Vec<u64>>,
}

impl Inner {
    /// The last position that may be shipped: the one before the first position still
    /// held (holds past [`HOLD_MAX`] are let go here), or the last appended.
    fn shippable(&mut self) -> u64 {
        while let Some((&pos, &(hold, since))) = self.held.first_key_value() {
            if since.elapsed() < HOLD_MAX {
                return pos - 1;
            }
            self.release(hold);
        }
        self.next - 1
    }

    fn release(&mut self, hold: u64) {
        for pos in self.holds.remove(&hold).unwrap_or_default() {
            self.held.remove(&pos);
        }
    }

    /// When the oldest hold runs out.
    fn first_expiry(&self) -> Option<Instant> {
        self.held.values().map(|(_, since)| *since + HOLD_MAX).min()
    }
}

pub struct ReplLog {
    /// Drawn at each start of the primary: positions restart at 1 under a new one.
    pub incarnation: u64,
    inner: Mutex<Inner>,
    /// The last position appended, touched also when a hold is let go: wakes the shippers
    /// (a watch, not a `Notify`: a change appended between a shipper's check and its wait
    /// must not be missed).
    appended: tokio::sync::watch::Sender<u64>,
    /// The highest position every mirror in sync has applied (or the last appended, with
    /// none in sync).
    acked: tokio::sync::watch::Sender<u64>,
    /// Replies (and steps) waiting in [`ReplLog::wait_acked`] right now: a mirror is only
    /// given up on while someone waits for it (at start-up, the first changes may wait for
    /// a mirror that is still starting).
    waiting: std::sync::atomic::AtomicUsize,
    /// Set when the server stops serving ([`ReplLog::stop`]).
    stopped: tokio::sync::watch::Sender<bool>,
}

impl ReplLog {
    /// A new incarnation (drawn at random, odd), positions from 1: every mirror holding
    /// another incarnation is resynchronised.
    pub fn new(mirrors: &[ServerId]) -> ReplLog {
        Self::resume(mirrors, rand::random::<u64>() | 1, 0)
    }

    /// Go on with `incarnation` after position `last`, as a clean stop left it
    /// (`key::CLEAN_STOP`): a mirror that applied `last` follows on without a resync; one
    /// that applied less is told so by the first batch and resynchronised.
    pub fn resume(mirrors: &[ServerId], incarnation: u64, last: u64) -> ReplLog {
        let mirrors = mirrors.iter().map(|&m| (m, Progress::new(MirrorState::InSync))).collect();
        ReplLog {
            incarnation,
            inner: Mutex::new(Inner {
                base: last + 1,
                next: last + 1,
                entries: VecDeque::new(),
                bytes: 0,
                mirrors,
                held: BTreeMap::new(),
                holds: HashMap::new(),
            }),
            appended: tokio::sync::watch::channel(last).0,
            acked: tokio::sync::watch::channel(last).0,
            waiting: Default::default(),
            stopped: tokio::sync::watch::channel(false).0,
        }
    }

    /// The oldest position the log still keeps: at start, 1, or the one after a clean
    /// stop's last.
    pub fn base(&self) -> u64 {
        self.inner.lock().base
    }

    /// Append a change made just now (the caller holds what orders it); returns its
    /// position and records it for the current request's reply. Held back from the
    /// mirrors while the current request holds its changes for its reply
    /// ([`ReplLog::hold`]).
    pub fn append(&self, change: ReplChange, data: Bytes) -> u64 {
        let hold = crate::store::commits::current().map_or(0, |t| t.state().hold);
        let pos = {
            let mut g = self.inner.lock();
            let pos = g.next;
            g.next += 1;
            if g.mirrors.values().any(Progress::follows) {
                g.bytes += data.len();
                g.entries.push_back((change, data));
                if hold != 0 {
                    g.held.insert(pos, (hold, Instant::now()));
                    g.holds.entry(hold).or_default().push(pos);
                }
                if g.bytes > RESYNC_LOG_MAX && g.mirrors.values().any(|m| m.state == MirrorState::Resyncing) {
                    for (id, m) in g.mirrors.iter_mut().filter(|(_, m)| m.state == MirrorState::Resyncing) {
                        tracing::warn!(
                            "mirror {id}: more than {} MiB of changes piled up during its resync: \
                             abandoned, started over later",
                            RESYNC_LOG_MAX >> 20
                        );
                        m.state = MirrorState::OutOfSync;
                    }
                    self.trim(&mut g);
                }
                if !g.mirrors.values().any(|m| m.state == MirrorState::InSync) {
                    // Only mirrors being resynchronised: nobody to wait for.
                    self.acked.send_replace(pos);
                }
            } else {
                // Nobody to ship to: the log stays empty and everything counts as applied.
                g.base = g.next;
                self.acked.send_replace(pos);
            }
            pos
        };
        crate::store::commits::record_replicated(pos);
        self.appended.send_modify(|last| *last = (*last).max(pos));
        pos
    }

    /// The last position appended so far.
    pub fn last(&self) -> u64 {
        self.inner.lock().next - 1
    }

    /// A new hold: the changes the current request appends from now on are not shipped
    /// until [`ReplLog::release`] (or [`HOLD_MAX`]). The caller records it in the request's
    /// ticket (`commits::set_hold`) and releases it once the reply is appended.
    pub fn hold() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Let the changes of `hold` be shipped.
    pub fn release(&self, hold: u64) {
        let released = {
            let mut g = self.inner.lock();
            let had = g.holds.contains_key(&hold);
            g.release(hold);
            had
        };
        if released {
            self.appended.send_modify(|_| {});
        }
    }

    /// How long to delay the reply of a request that changed something, while a mirror is
    /// being resynchronised and the changes kept for it fill more than a quarter of
    /// [`RESYNC_LOG_MAX`]: from nothing there up to [`RESYNC_SLOWDOWN_MAX`] at the bound.
    ///
    /// Why: the resync ships the stores first and the changes made meanwhile after them,
    /// so writers faster than the resync fill the bound and abandon it, again at every
    /// try, and the mirror never catches up (measured: 4 writers at about 18 MB/s of
    /// changes against a 15 s resync). Slowing the writers in proportion, as RocksDB's
    /// delayed writes do, lets the resync finish; each request waits at most 100 ms.
    pub fn resync_delay(&self) -> Option<Duration> {
        let g = self.inner.lock();
        let start = RESYNC_LOG_MAX / 4;
        if g.bytes <= start || !g.mirrors.values().any(|m| m.state == MirrorState::Resyncing) {
            return None;
        }
        let fill = (g.bytes - start) as f64 / (RESYNC_LOG_MAX - start) as f64;
        Some(RESYNC_SLOWDOWN_MAX.mul_f64(fill.min(1.0)))
    }

    /// Wait until every mirror in sync has applied `pos` (true), or the log is stopped
    /// (false: the server stops serving, nothing will be applied any more, and what waited
    /// must not be acknowledged). The current request's own held changes are let go first:
    /// it would wait for itself.
    pub async fn wait_acked(&self, pos: u64) -> bool {
        use std::sync::atomic::Ordering;
        if let Some(hold) = crate::store::commits::current().map(|t| t.state().hold).filter(|&h| h != 0) {
            self.release(hold);
        }
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _w = Waiting(&self.waiting);
        let mut rx = self.acked.subscribe();
        let mut stopped = self.stopped.subscribe();
        tokio::select! {
            r = rx.wait_for(|&a| a >= pos) => r.is_ok(),
            _ = stopped.wait_for(|&s| s) => self.is_acked(pos),
        }
    }

    /// The server stops serving: whatever waits for the mirrors gives up (its reply or
    /// step is dropped), so that the state it holds is let go (`serve_on` opens the stores
    /// again: `rejoin.rs`).
    pub fn stop(&self) {
        self.stopped.send_replace(true);
    }

    /// Whether a reply or step is waiting for the mirrors.
    pub fn has_waiters(&self) -> bool {
        self.waiting.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Whether `pos` is applied everywhere it must be.
    pub fn is_acked(&self, pos: u64) -> bool {
        *self.acked.borrow() >= pos
    }

    /// The last position that may be shipped now (see [`ReplLog::hold`]).
    pub fn shippable(&self) -> u64 {
        self.inner.lock().shippable()
    }

    /// Wait until a change after `pos` may be shipped: appended, and not held (or held
    /// for longer than [`HOLD_MAX`]).
    pub async fn shippable_after(&self, pos: u64) {
        let mut rx = self.appended.subscribe();
        loop {
            rx.borrow_and_update();
            let expiry = {
                let mut g = self.inner.lock();
                if g.shippable() > pos {
                    return;
                }
                g.first_expiry()
            };
            match expiry {
                Some(at) => {
                    let _ = tokio::time::timeout_at(at.into(), rx.changed()).await;
                }
                None => {
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// The changes after `after` for one `PeerReplicate`: the position of the first, the
    /// changes and their bytes (at most [`SHIP_MAX_BYTES`], at least one change if one may
    /// be shipped: see [`ReplLog::shippable`]).
    pub fn take(&self, after: u64) -> (u64, Vec<ReplChange>, Vec<Bytes>) {
        let mut g = self.inner.lock();
        let upto = g.shippable();
        let first = after + 1;
        let mut changes = Vec::new();
        let mut data = Vec::new();
        let mut bytes = 0;
        if first >= g.base {
            for (c, d) in
                g.entries.iter().skip((first - g.base) as usize).take((upto + 1).saturating_sub(first) as usize)
            {
                if !changes.is_empty() && bytes + d.len() > SHIP_MAX_BYTES {
                    break;
                }
                bytes += d.len();
                changes.push(c.clone());
                data.push(d.clone());
            }
        }
        (first, changes, data)
    }

    /// A mirror applied everything up to `applied`. A mirror being resynchronised that has
    /// applied the last position appended is in sync from now on (under the lock that
    /// orders appends: the next change is waited for).
    pub fn ack(&self, mirror: ServerId, applied: u64) {
        let mut g = self.inner.lock();
        let last = g.next - 1;
        if let Some(p) = g.mirrors.get_mut(&mirror) {
            if p.follows() {
                p.applied = p.applied.max(applied);
            }
            if p.state == MirrorState::Resyncing && p.applied >= last {
                p.state = MirrorState::InSync;
                p.resyncs += 1;
                tracing::info!("mirror {mirror} is in sync again (position {last})");
            }
        }
        self.trim(&mut g);
    }

    /// Start resynchronising `mirror`: from now on the log keeps every change for it.
    /// Returns the position its stores must reach before it is shipped the log (`p0 - 1`:
    /// the last position appended so far).
    pub fn start_resync(&self, mirror: ServerId) -> u64 {
        let mut g = self.inner.lock();
        let last = g.next - 1;
        // Everything up to `last` is in the stores the resync copies from, so nothing older
        // is needed: entries before `p0` (held for mirrors in sync) stay as they are.
        if let Some(p) = g.mirrors.get_mut(&mirror) {
            p.state = MirrorState::Resyncing;
            p.applied = last;
            p.resync_done = 0;
            p.resync_total = 0;
        }
        if g.entries.is_empty() {
            g.base = g.next;
        }
        last
    }

    /// Progress of `mirror`'s resync: bytes compared (of `total`), and `shipped` more bytes
    /// sent.
    pub fn resync_progress(&self, mirror: ServerId, done: u64, total: u64, shipped: u64) {
        if let Some(p) = self.inner.lock().mirrors.get_mut(&mirror) {
            p.resync_done = done;
            p.resync_total = total;
            p.resync_shipped += shipped;
        }
    }

    /// Ship to `mirror` too (the slot's own server standing by, `rejoin.rs`): out of sync,
    /// to be resynchronised first. False if it is a mirror already.
    pub fn add_mirror(&self, mirror: ServerId) -> bool {
        let mut g = self.inner.lock();
        if g.mirrors.contains_key(&mirror) {
            return false;
        }
        g.mirrors.insert(mirror, Progress::new(MirrorState::OutOfSync));
        true
    }

    /// Stop shipping to `mirror` at all (the map no longer names it a mirror of the slot).
    pub fn remove_mirror(&self, mirror: ServerId) {
        let mut g = self.inner.lock();
        if g.mirrors.remove(&mirror).is_some() {
            self.trim(&mut g);
        }
    }

    /// Drop `mirror` from the set waited for: it missed changes.
    pub fn mark_out_of_sync(&self, mirror: ServerId) {
        let mut g = self.inner.lock();
        if let Some(p) = g.mirrors.get_mut(&mirror) {
            p.state = MirrorState::OutOfSync;
        }
        self.trim(&mut g);
    }

    /// Every mirror's progress (for the status and tests).
    pub fn mirrors(&self) -> BTreeMap<ServerId, Progress> {
        self.inner.lock().mirrors.clone()
    }

    /// Forget what every mirror in sync or resyncing has applied, and publish the new
    /// acknowledged position (what the mirrors in sync applied).
    fn trim(&self, g: &mut Inner) {
        let last = g.next - 1;
        let acked =
            g.mirrors.values().filter(|m| m.state == MirrorState::InSync).map(|m| m.applied).min().unwrap_or(last);
        let kept = g.mirrors.values().filter(|m| m.follows()).map(|m| m.applied).min().unwrap_or(last);
        while g.base <= kept {
            match g.entries.pop_front() {
                Some((_, d)) => {
                    g.bytes -= d.len();
                    g.base += 1;
                }
                None => {
                    g.base = kept + 1;
                    break;
                }
            }
        }
        // Holds of positions dropped unshipped (no mirror follows any more) are over.
        while let Some((&pos, &(hold, _))) = g.held.first_key_value() {
            if pos >= g.base {
                break;
            }
            g.release(hold);
        }
        self.acked.send_replace(acked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::Ino;

    fn write(n: u32) -> (ReplChange, Bytes) {
        (ReplChange::Write { ino: Ino(7), index: 0, offset: 0, len: n, copies: 1 }, Bytes::from(vec![1u8; n as usize]))
    }

    #[test]
    fn a_resumed_log_goes_on_after_the_clean_stop_position() {
        let m = ServerId(1);
        let log = ReplLog::resume(&[m], 0x77, 10);
        assert_eq!((log.incarnation, log.last(), log.base()), (0x77, 10, 11));
        assert!(log.is_acked(10) && !log.is_acked(11));
        assert_eq!(
            log.append(ReplChange::Truncate { ino: shoal_proto::Ino(1), index: 0, len: 0, copies: 1 }, Bytes::new()),
            11
        );
        // A mirror that holds position 10 is shipped 11; one that holds less finds nothing
        // (it is then resynchronised).
        let (first, changes, _) = log.take(10);
        assert_eq!((first, changes.len()), (11, 1));
        assert!(log.take(5).1.is_empty());
    }

    #[test]
    fn positions_are_consecutive_and_taken_in_order() {
        let log = ReplLog::new(&[ServerId(1)]);
        for n in 1..=3 {
            let (c, d) = write(n);
            assert_eq!(log.append(c, d), n as u64);
        }
        let (first, changes, data) = log.take(1);
        assert_eq!(first, 2);
        assert_eq!(changes.len(), 2);
        assert_eq!(data[0].len(), 2);
        assert!(!log.is_acked(1));
        log.ack(ServerId(1), 2);
        assert!(log.is_acked(2) && !log.is_acked(3));
        let (first, changes, _) = log.take(2);
        assert_eq!((first, changes.len()), (3, 1));
    }

    #[test]
    fn a_mirror_out_of_sync_is_not_waited_for() {
        let log = ReplLog::new(&[ServerId(1), ServerId(2)]);
        let (c, d) = write(4);
        let pos = log.append(c, d);
        log.ack(ServerId(1), pos);
        assert!(!log.is_acked(pos), "mirror 2 has not applied it");
        log.mark_out_of_sync(ServerId(2));
        assert!(log.is_acked(pos));
        log.mark_out_of_sync(ServerId(1));
        let (c, d) = write(4);
        let pos = log.append(c, d);
        assert!(log.is_acked(pos), "alone, the primary's own changes count as applied");
        assert_eq!(log.take(0).1.len(), 0, "nothing kept for nobody");
    }

    #[test]
    fn a_resyncing_mirror_is_not_waited_for_but_keeps_the_log_until_it_is_in_sync() {
        let log = ReplLog::new(&[ServerId(1)]);
        let (c, d) = write(4);
        log.append(c, d);
        log.mark_out_of_sync(ServerId(1));
        let before = log.start_resync(ServerId(1));
        assert_eq!(before, 1);
        let positions: Vec<u64> = (0..3)
            .map(|_| {
                let (c, d) = write(4);
                log.append(c, d)
            })
            .collect();
        assert!(log.is_acked(positions[2]), "replies do not wait for a resyncing mirror");
        let (first, changes, _) = log.take(before);
        assert_eq!((first, changes.len()), (2, 3), "the log from p0 is kept for it");
        log.ack(ServerId(1), 3);
        assert_eq!(log.mirrors()[&ServerId(1)].state, MirrorState::Resyncing, "one position to go");
        log.ack(ServerId(1), 4);
        assert_eq!(log.mirrors()[&ServerId(1)].state, MirrorState::InSync);
        assert_eq!(log.mirrors()[&ServerId(1)].resyncs, 1);
        let (c, d) = write(4);
        let pos = log.append(c, d);
        assert!(!log.is_acked(pos), "in sync again: waited for");
    }

    #[test]
    fn a_resync_is_abandoned_when_too_many_changes_pile_up() {
        let log = ReplLog::new(&[ServerId(1)]);
        log.mark_out_of_sync(ServerId(1));
        log.start_resync(ServerId(1));
        // One buffer shared by every change: the bound counts bytes held, not allocated.
        let (c, d) = write((RESYNC_LOG_MAX / 8) as u32 + 1);
        for _ in 0..8 {
            log.append(c.clone(), d.clone());
        }
        assert_eq!(log.mirrors()[&ServerId(1)].state, MirrorState::OutOfSync);
        assert_eq!(log.take(0).1.len(), 0, "its changes are dropped");
    }

    #[test]
    fn writers_are_slowed_while_changes_pile_up_for_a_resync() {
        let log = ReplLog::new(&[ServerId(1)]);
        let (c, d) = write((RESYNC_LOG_MAX / 8) as u32);
        log.append(c.clone(), d.clone());
        log.append(c.clone(), d.clone());
        log.append(c.clone(), d.clone());
        assert_eq!(log.resync_delay(), None, "in sync: the mirror's own acknowledgements pace the writers");
        log.mark_out_of_sync(ServerId(1));
        log.start_resync(ServerId(1));
        log.append(c.clone(), d.clone());
        assert_eq!(log.resync_delay(), None, "an eighth of the bound: no delay");
        log.append(c.clone(), d.clone());
        log.append(c.clone(), d.clone());
        let half = log.resync_delay().expect("three eighths: slowed");
        log.append(c.clone(), d.clone());
        log.append(c.clone(), d.clone());
        let more = log.resync_delay().expect("five eighths: slowed more");
        assert!(half < more && more <= RESYNC_SLOWDOWN_MAX, "{half:?} then {more:?}");
    }

    /// Append a change as a request holding `hold` (`ticket`) would.
    fn append_as(log: &ReplLog, ticket: &std::sync::Arc<crate::store::commits::Ticket>, n: u32) -> u64 {
        crate::store::commits::on_thread(Some(ticket.clone()), || {
            let (c, d) = write(n);
            log.append(c, d)
        })
    }

    #[test]
    fn a_requests_changes_are_shipped_only_with_its_reply() {
        let log = ReplLog::new(&[ServerId(1)]);
        let (c, d) = write(1);
        assert_eq!(log.append(c, d), 1);
        let ticket = crate::store::commits::Ticket::new(0);
        let hold = ReplLog::hold();
        ticket.set_hold(hold);
        assert_eq!(append_as(&log, &ticket, 2), 2);
        // Another request's change, behind the held one, waits with it.
        let (c, d) = write(3);
        assert_eq!(log.append(c, d), 3);
        assert_eq!(log.shippable(), 1);
        let (first, changes, _) = log.take(0);
        assert_eq!((first, changes.len()), (1, 1), "the batch ends before the held change");
        // The reply is appended under the hold too, then all of it goes at once.
        assert_eq!(append_as(&log, &ticket, 0), 4);
        assert_eq!(log.shippable(), 1);
        log.release(hold);
        assert_eq!(log.shippable(), 4);
        assert_eq!(log.take(1).1.len(), 3);
    }

    #[tokio::test]
    async fn a_stopped_log_lets_its_waiters_go_unacknowledged() {
        let log = std::sync::Arc::new(ReplLog::new(&[ServerId(1)]));
        let pos =
            log.append(ReplChange::Truncate { ino: shoal_proto::Ino(1), index: 0, len: 0, copies: 1 }, Bytes::new());
        let l = log.clone();
        let waiter = tokio::spawn(async move { l.wait_acked(pos).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the mirror has not applied it");
        log.stop();
        assert!(!waiter.await.unwrap(), "stopped, not acknowledged");
        log.ack(ServerId(1), pos);
        assert!(log.wait_acked(pos).await, "applied since");
    }

    #[test]
    fn a_hold_is_let_go_after_hold_max() {
        let log = ReplLog::new(&[ServerId(1)]);
        let ticket = crate::store::commits::Ticket::new(0);
        ticket.set_hold(ReplLog::hold());
        append_as(&log, &ticket, 1);
        assert_eq!(log.shippable(), 0);
        std::thread::sleep(HOLD_MAX + Duration::from_millis(10));
        assert_eq!(log.shippable(), 1, "a request stuck before its reply must not stall the slot");
    }

    #[tokio::test]
    async fn a_request_waiting_for_the_mirrors_lets_its_own_changes_go() {
        let log = std::sync::Arc::new(ReplLog::new(&[ServerId(1)]));
        let ticket = crate::store::commits::Ticket::new(0);
        ticket.set_hold(ReplLog::hold());
        let pos = append_as(&log, &ticket, 1);
        let (l, t) = (log.clone(), ticket.clone());
        // A shipper waiting for something to ship wakes when the request waits.
        let shipper = tokio::spawn(async move { l.shippable_after(0).await });
        let wait = crate::store::commits::scope(t, async { log.wait_acked(pos).await });
        assert!(tokio::time::timeout(Duration::from_millis(20), wait).await.is_err(), "no mirror applied it");
        assert_eq!(log.shippable(), pos);
        tokio::time::timeout(Duration::from_secs(1), shipper).await.unwrap().unwrap();
    }

    #[test]
    fn a_ship_is_bounded_but_never_empty() {
        let log = ReplLog::new(&[ServerId(1)]);
        for _ in 0..3 {
            let (c, d) = write(5 << 20);
            log.append(c, d);
        }
        let (_, changes, _) = log.take(0);
        assert_eq!(changes.len(), 1, "two 5 MiB writes exceed one ship");
    }
}
