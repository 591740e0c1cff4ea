//! Directory leases: which client sessions may answer lookups and listings of a directory
//! from their caches, and their revocation when its entries change (docs/architecture.md,
//! "Leases"; messages in `shoal_proto::lease`).
//!
//! **Granting.** A `Lookup` or `ReadDir` that asks for a lease, on a connection that
//! negotiated `FEATURE_LEASES`, gets one unless the directory is being changed or was
//! changed under other holders' feet very recently (then leases would only be revoked
//! again: no grant for one lease period), or the table is full. [`Leases::before_read`]
//! is taken before the handler reads the store and [`Leases::grant`] after: a change that
//! committed in between (its generation is newer than the ticket) refuses the grant, so no
//! lease is ever granted on a state older than the last change.
//!
//! **Revoking.** One hook: `store::meta::Txn::commit` names the directories whose entries
//! the batch changes and calls [`Leases::changing`] before writing it. Every holder of those
//! directories but the session making the change (which updates its own cache from the
//! reply) is removed from the table and sent a `Notice::Revoke` on the connection it got
//! the lease on. The change's reply is held (`scope`) until each of them acknowledged
//! (`Op::LeaseAck`) or its lease ran out, plus [`MARGIN`]; so is every lookup and listing
//! of the directory on this server meanwhile ([`Leases::before_read`]). Hence when any
//! client can learn of the change — from its reply or from this server — no cache answers
//! from the state before it. A holder that cannot be told (connection gone, process
//! stopped) delays the change by at most the rest of its lease plus the margin.
//!
//! **Bounds.** At most [`MAX_HOLDERS`] leases at once (expired ones are swept when the table
//! fills; beyond, no lease is granted), each at most `lease_max` long; a change waits at
//! most `lease_max` plus the margin.

use parking_lot::Mutex;
use shoal_proto::frame::Frame;
use shoal_proto::lease::{LeaseAsk, LeaseGrant, LeaseKey, LeaseRef, Notice};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Most leases held at once (about 100 bytes each).
pub const MAX_HOLDERS: usize = 1 << 16;
/// Added to a lease's term on the server's side: the holder counts its lease from when it
/// sent the request (before the server granted it), so its expiry comes first anyway; this
/// covers the two clocks running at slightly different rates.
pub const MARGIN: Duration = Duration::from_millis(100);
/// Default longest lease (`shoald --lease-max-ms`).
pub const DEFAULT_MAX: Duration = Duration::from_secs(5);

/// How to reach the connection a lease was granted on: hands a notice frame to its writer.
/// False when the connection is gone.
#[derive(Clone)]
pub struct NoticeSink(pub Arc<dyn Fn(Frame) -> bool + Send + Sync>);

/// Who sends the request being handled: set around each request by `net.rs` ([`scope`]).
#[derive(Clone)]
pub struct Caller {
    pub session: u64,
    /// Present when the connection negotiated `FEATURE_LEASES`.
    pub sink: Option<NoticeSink>,
    /// The connection negotiated `FEATURE_PARTITIONS` (or is a peer's): it can take
    /// `Reply::Partitions`.
    pub partitions: bool,
    /// For a caller that takes attribute leases: the clock values of the commits this
    /// request made ([`Leases::grant_attrs`] may grant on the state they wrote).
    pub commits: Option<Arc<Mutex<Vec<u64>>>>,
}

/// Revocations a request's commits started, which its reply waits for.
type Started = Arc<Mutex<Vec<Arc<Revocation>>>>;

/// What a request's commits need to know of it: its caller, and where to put the
/// revocations they start.
#[derive(Clone)]
pub struct Context {
    caller: Caller,
    started: Started,
}

tokio::task_local! {
    static CONTEXT: Context;
}

std::thread_local! {
    /// The request's context on a blocking thread (`State::blocking`), where task-locals
    /// are not seen.
    static ON_THREAD: std::cell::RefCell<Option<Context>> = const { std::cell::RefCell::new(None) };
}

/// The context of the request being handled, to carry to a blocking thread.
pub fn current() -> Option<Context> {
    CONTEXT.try_with(|c| c.clone()).ok().or_else(|| ON_THREAD.with(|t| t.borrow().clone()))
}

/// Run `f` on this (blocking) thread as part of the request of `ctx`.
pub fn on_thread<T>(ctx: Option<Context>, f: impl FnOnce() -> T) -> T {
    let old = ON_THREAD.with(|t| std::mem::replace(&mut *t.borrow_mut(), ctx));
    let out = f();
    ON_THREAD.with(|t| *t.borrow_mut() = old);
    out
}

/// Run `fut` (one request's handling) as `caller`; then wait for the revocations its
/// commits started before handing back its result (the reply).
pub async fn scope<T>(caller: Caller, fut: impl std::future::Future<Output = T>) -> T {
    let started: Started = Default::default();
    let out = CONTEXT.scope(Context { caller, started: started.clone() }, fut).await;
    let started = std::mem::take(&mut *started.lock());
    for r in started {
        r.wait().await;
    }
    out
}

struct Holder {
    id: u64,
    session: u64,
    /// When the server stops counting it (the holder's own expiry plus [`MARGIN`]).
    expires: Instant,
    sink: NoticeSink,
    /// The partition the lease was granted on (what the holder knows it by).
    part: shoal_proto::msg::PartRef,
    /// The table's clock when it was first granted: any other session's change after that
    /// removed it from the table.
    since: u64,
}

#[derive(Default)]
struct KeyState {
    /// At most one per session (a holder asking again extends its lease).
    holders: Vec<Holder>,
    /// Value of the table's clock at the last change of these entries.
    gen: u64,
    /// Commits in progress on these entries (between `changing` and the write's end).
    changing: u32,
    /// Revocations not finished yet: reads of these entries wait for them.
    pending: Vec<Arc<Revocation>>,
    /// No lease is granted before this (the entries changed under other holders).
    quiet_until: Option<Instant>,
}

impl KeyState {
    fn idle(&self, now: Instant) -> bool {
        self.holders.is_empty()
            && self.changing == 0
            && self.pending.iter().all(|r| r.finished())
            && self.quiet_until.is_none_or(|q| q <= now)
    }
}

struct Table {
    keys: HashMap<LeaseKey, KeyState>,
    holders: usize,
    /// Counts changes; a key's `gen` is its value at the key's last change.
    clock: u64,
    /// For keys without a state in `keys`: the largest `gen` of the states forgotten, per
    /// bucket of key hashes ([`bucket`]): what an absent key's generation may have been.
    /// Buckets, not one number, so that a change elsewhere does not refuse this key's grant.
    swept: Vec<u64>,
    /// Lease id → the revocation waiting for its acknowledgement.
    revoking: HashMap<u64, Arc<Revocation>>,
    /// Lease id → the key it is held on, for every holder in `keys` (a give-up finds its
    /// lease without scanning the table).
    by_id: HashMap<u64, LeaseKey>,
}

/// Buckets of [`Table::swept`].
const BUCKETS: usize = 4096;

fn bucket(k: &LeaseKey) -> usize {
    let h = (k.dir.0 ^ (k.partition as u64).rotate_left(32) ^ (k.attrs as u64).rotate_right(1))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 52) as usize % BUCKETS
}

impl Table {
    fn new() -> Table {
        Table {
            keys: HashMap::new(),
            holders: 0,
            clock: 0,
            swept: vec![0; BUCKETS],
            revoking: HashMap::new(),
            by_id: HashMap::new(),
        }
    }

    /// The generation of `key`'s entries (of their bucket, if forgotten).
    fn gen(&self, key: &LeaseKey) -> u64 {
        self.keys.get(key).map_or(self.swept[bucket(key)], |s| s.gen)
    }

    /// Forget `key`'s state, keeping its generation in its bucket.
    fn forget(&mut self, key: &LeaseKey) {
        if let Some(s) = self.keys.remove(key) {
            let b = &mut self.swept[bucket(key)];
            *b = (*b).max(s.gen);
        }
    }
}

/// The leases of one server.
pub struct Leases {
    /// Longest lease granted; zero: none.
    max: Duration,
    table: Mutex<Table>,
    next_id: std::sync::atomic::AtomicU64,
}

/// A change waiting for holders to let go of their leases.
pub struct Revocation {
    /// Lease id → when it runs out on the server's side.
    waiting: Mutex<HashMap<u64, Instant>>,
    acked: tokio::sync::Notify,
}

impl Revocation {
    fn finished(&self) -> bool {
        let now = Instant::now();
        let mut w = self.waiting.lock();
        w.retain(|_, exp| *exp > now);
        w.is_empty()
    }

    /// Until every lease it waits for is acknowledged or has run out.
    pub async fn wait(&self) {
        loop {
            let notified = self.acked.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let now = Instant::now();
                let mut w = self.waiting.lock();
                w.retain(|_, exp| *exp > now);
                match w.values().min() {
                    None => return,
                    Some(e) => *e,
                }
            };
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }
}

/// What [`Leases::before_read`] hands to [`Leases::grant`].
#[derive(Clone, Copy, Debug)]
pub struct ReadTicket {
    clock: u64,
}

/// Held by a commit from [`Leases::changing`] until its batch is written: while it lives,
/// no lease on those entries is granted.
pub struct Changing<'a> {
    leases: &'a Leases,
    keys: Vec<LeaseKey>,
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        let mut guard = self.leases.table.lock();
        let t = &mut *guard;
        let now = Instant::now();
        for k in &self.keys {
            if let Some(s) = t.keys.get_mut(k) {
                s.changing = s.changing.saturating_sub(1);
                // Nothing left to remember but the generation: forget the key (its
                // generation lives on in its bucket of `swept`), so the table holds only leased keys.
                if s.idle(now) {
                    t.forget(k);
                }
            }
        }
    }
}

impl Leases {
    pub fn new(max: Duration) -> Leases {
        Leases { max, table: Mutex::new(Table::new()), next_id: std::sync::atomic::AtomicU64::new(1) }
    }

    /// The caller of the request being handled, if it may hold leases.
    pub fn caller() -> Option<Caller> {
        current().map(|c| c.caller)
    }

    /// Before a lookup or listing of `key` reads the store: wait for the revocations of
    /// changes to it (so nobody reads a change while a holder may still answer from before
    /// it), and take a ticket for [`Leases::grant`].
    pub async fn before_read(&self, key: LeaseKey) -> ReadTicket {
        loop {
            let pending = {
                let mut t = self.table.lock();
                let pending = t.keys.get_mut(&key).and_then(|s| {
                    s.pending.retain(|r| !r.finished());
                    s.pending.first().cloned()
                });
                match pending {
                    None => return ReadTicket { clock: t.clock },
                    Some(p) => p,
                }
            };
            pending.wait().await;
        }
    }

    /// A lease on `key` for the caller, if the entries did not change since `ticket`, none
    /// is being changed or revoked, and the table has room.
    /// The grant names `part` (the partition of the answer, on this server) as what it
    /// covers; the table keeps leases by directory (`key`, partition 0), so that any change of
    /// the directory's entries here revokes them all.
    pub fn grant(
        &self,
        key: LeaseKey,
        ticket: ReadTicket,
        ask: Option<LeaseAsk>,
        part: shoal_proto::msg::PartRef,
    ) -> Option<LeaseGrant> {
        let ask = ask?;
        let granted = LeaseKey { partition: part.index, ..key };
        if self.max.is_zero() || ask.ms == 0 {
            return None;
        }
        let caller = Leases::caller()?;
        let sink = caller.sink?;
        let ms = (ask.ms as u64).min(self.max.as_millis() as u64) as u32;
        let now = Instant::now();
        let expires = now + Duration::from_millis(ms as u64) + MARGIN;
        let mut guard = self.table.lock();
        let t = &mut *guard;
        // The caller held a live lease here since before the ticket: extended whatever
        // changed since. Any other session's change after its grant would have revoked it
        // (removed it from the table), so only the caller's own changes can have happened,
        // which it applies to its lease itself (it learns nothing from a reply that crossed
        // one of them). Without this, a client filling a directory could never renew its
        // lease while its own creates are in flight.
        if let Some(h) = t.keys.get_mut(&key).and_then(|s| s.holders.iter_mut().find(|h| h.session == caller.session)) {
            if h.expires > now && h.since <= ticket.clock {
                h.expires = h.expires.max(expires);
                h.sink = sink;
                h.part = part;
                return Some(LeaseGrant { id: h.id, key: granted, ms, depth: part.depth });
            }
        }
        let gen = t.gen(&key);
        if gen > ticket.clock {
            return None;
        }
        if let Some(s) = t.keys.get(&key) {
            if s.changing > 0 || !s.pending.iter().all(|r| r.finished()) || s.quiet_until.is_some_and(|q| q > now) {
                return None;
            }
        }
        if t.holders >= MAX_HOLDERS {
            sweep(t, now);
            if t.holders >= MAX_HOLDERS {
                return None;
            }
        }
        let s = t.keys.entry(key).or_default();
        s.gen = gen;
        if let Some(h) = s.holders.iter_mut().find(|h| h.session == caller.session) {
            h.expires = h.expires.max(expires);
            h.sink = sink;
            h.part = part;
            return Some(LeaseGrant { id: h.id, key: granted, ms, depth: part.depth });
        }
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        s.holders.push(Holder { id, session: caller.session, expires, sink, part, since: t.clock });
        t.holders += 1;
        t.by_id.insert(id, key);
        Some(LeaseGrant { id, key: granted, ms, depth: part.depth })
    }

    /// A ticket for the state as of now, without waiting for revocations (a request that
    /// hands out attributes it did not read under [`Leases::before_read`]: see
    /// [`Leases::grant_attrs`]).
    pub fn ticket_now(&self) -> ReadTicket {
        ReadTicket { clock: self.table.lock().clock }
    }

    /// Attribute leases (`shoal_proto::lease`, "Attribute leases") on the attributes `reply`
    /// carries of inodes whose home is this server (`home`), for a caller that asked for
    /// them: a `Reply::Attr` becomes `Reply::Leased` with `LeasedReply::Attr`, an entry gets
    /// its `attr_lease`. A lease is granted only if the inode's record did not change since
    /// `ticket` (taken before the request read it), or last changed by this request's own
    /// commits (`caller.commits`: the attributes in the reply are those it wrote), and no
    /// change or revocation of it is in progress.
    pub fn grant_attrs(
        &self,
        reply: &mut shoal_proto::msg::Reply,
        ticket: ReadTicket,
        caller: &Caller,
        home: impl Fn(shoal_proto::Ino) -> bool,
    ) {
        use shoal_proto::lease::LeasedReply;
        use shoal_proto::msg::Reply;
        let own: Vec<u64> = caller.commits.as_ref().map(|c| c.lock().clone()).unwrap_or_default();
        let grant = |ino| if home(ino) { self.grant_attr(ino, ticket, &own, caller) } else { None };
        match reply {
            Reply::Attr(a) => {
                if let Some(lease) = grant(a.ino) {
                    *reply = Reply::Leased { lease, reply: LeasedReply::Attr(a.clone()) };
                }
            }
            Reply::Entry(e) | Reply::Leased { reply: LeasedReply::Entry(e), .. } => {
                if let Some(a) = &e.attr {
                    e.attr_lease = grant(a.ino);
                }
            }
            // A batch of lookups (the client's stat-ahead): every entry found with its
            // inode here, as a single lookup would be.
            Reply::Batch(replies) => {
                for r in replies {
                    if let shoal_proto::msg::BatchReply::Entry(e) = r {
                        if let Some(a) = &e.attr {
                            e.attr_lease = grant(a.ino);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn grant_attr(
        &self,
        ino: shoal_proto::Ino,
        ticket: ReadTicket,
        own: &[u64],
        caller: &Caller,
    ) -> Option<LeaseGrant> {
        if self.max.is_zero() {
            return None;
        }
        let sink = caller.sink.clone()?;
        let key = LeaseKey::attrs(ino);
        let ms = self.max.as_millis().min(u32::MAX as u128) as u32;
        let now = Instant::now();
        let expires = now + Duration::from_millis(ms as u64) + MARGIN;
        let mut guard = self.table.lock();
        let t = &mut *guard;
        let gen = t.gen(&key);
        if gen > ticket.clock && !own.contains(&gen) {
            return None;
        }
        if let Some(s) = t.keys.get(&key) {
            if s.changing > 0 || !s.pending.iter().all(|r| r.finished()) || s.quiet_until.is_some_and(|q| q > now) {
                return None;
            }
        }
        if t.holders >= MAX_HOLDERS {
            sweep(t, now);
            if t.holders >= MAX_HOLDERS {
                return None;
            }
        }
        let part = shoal_proto::msg::PartRef { index: 0, depth: 0 };
        let s = t.keys.entry(key).or_default();
        s.gen = gen;
        if let Some(h) = s.holders.iter_mut().find(|h| h.session == caller.session) {
            h.expires = h.expires.max(expires);
            h.sink = sink;
            return Some(LeaseGrant { id: h.id, key, ms, depth: 0 });
        }
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        s.holders.push(Holder { id, session: caller.session, expires, sink, part, since: t.clock });
        t.holders += 1;
        t.by_id.insert(id, key);
        Some(LeaseGrant { id, key, ms, depth: 0 })
    }

    /// The entries of `keys` are about to change (a commit, `Txn::commit`): no lease on them
    /// is granted until the returned guard is dropped (after the write); every holder but
    /// the caller's session is revoked, and the request's reply waits for them (`scope`).
    pub fn changing(&self, keys: &[LeaseKey]) -> Changing<'_> {
        self.revoke(keys, true)
    }

    /// As [`Leases::changing`] for a change that moves entries between servers rather than
    /// changing the directory (a split, `ops/namespace/split.rs`): holders are revoked (what
    /// they hold names the old partition), but this is no contention on the directory, so
    /// leases are granted again at once.
    pub fn reshaping(&self, keys: &[LeaseKey]) -> Changing<'_> {
        self.revoke(keys, false)
    }

    /// Revoke the holders of `keys`; `contended`: the entries change under other holders'
    /// feet, so no lease is handed out on them for a lease period.
    fn revoke(&self, keys: &[LeaseKey], contended: bool) -> Changing<'_> {
        let session = Leases::caller().map_or(0, |c| c.session);
        let now = Instant::now();
        let mut notices: Vec<(NoticeSink, LeaseRef)> = Vec::new();
        let revocation = Arc::new(Revocation { waiting: Mutex::new(HashMap::new()), acked: Default::default() });
        {
            let mut guard = self.table.lock();
            let t = &mut *guard;
            t.clock += 1;
            let clock = t.clock;
            for &key in keys {
                let s = t.keys.entry(key).or_default();
                s.gen = clock;
                s.changing += 1;
                if s.holders.is_empty() {
                    continue;
                }
                let mut others = false;
                let mut kept = Vec::new();
                for h in s.holders.drain(..) {
                    if h.session == session && session != 0 {
                        kept.push(h);
                        continue;
                    }
                    t.by_id.remove(&h.id);
                    t.holders -= 1;
                    if h.expires > now {
                        others = true;
                        revocation.waiting.lock().insert(h.id, h.expires);
                        let held = LeaseKey { partition: h.part.index, ..key };
                        notices.push((h.sink, LeaseRef { id: h.id, key: held }));
                    }
                }
                s.holders = kept;
                if others {
                    // Others' leases were in the way: do not hand them out again at once
                    // (a shared directory being written would revoke them at every change).
                    if contended {
                        s.quiet_until = Some(now + self.max);
                    }
                    s.pending.push(revocation.clone());
                }
            }
            for (_, r) in &notices {
                t.revoking.insert(r.id, revocation.clone());
            }
            if let Some(commits) = current().and_then(|c| c.caller.commits) {
                commits.lock().push(clock);
            }
        }
        for (sink, r) in notices {
            let delivered = Frame::notice(&Notice::Revoke { leases: vec![r] }).map(|f| (sink.0)(f)).unwrap_or(false);
            if !delivered {
                tracing::debug!("lease {} on {:?}: its connection is gone; waiting for it to run out", r.id, r.key);
            }
        }
        if !revocation.waiting.lock().is_empty() {
            if let Some(ctx) = current() {
                ctx.started.lock().push(revocation.clone());
            }
        }
        Changing { leases: self, keys: keys.to_vec() }
    }

    /// The holder acknowledged these leases' revocation (or gave them up).
    pub fn ack(&self, ids: &[u64]) {
        let mut t = self.table.lock();
        for id in ids {
            if let Some(r) = t.revoking.remove(id) {
                r.waiting.lock().remove(id);
                r.acked.notify_waiters();
                continue;
            }
            // Given up while not revoked: drop it (only the session holding it can).
            let session = Leases::caller().map_or(0, |c| c.session);
            let Some(key) = t.by_id.get(id).copied() else { continue };
            if let Some(s) = t.keys.get_mut(&key) {
                let before = s.holders.len();
                s.holders.retain(|h| !(h.id == *id && h.session == session));
                if s.holders.len() < before {
                    t.holders -= before - s.holders.len();
                    t.by_id.remove(id);
                }
            }
        }
        let now = Instant::now();
        t.revoking.retain(|_, r| !r.finished());
        if t.keys.len() > MAX_HOLDERS {
            sweep(&mut t, now);
        }
    }

    /// Leases held now (for tests and status).
    pub fn held(&self) -> usize {
        let now = Instant::now();
        self.table.lock().keys.values().map(|s| s.holders.iter().filter(|h| h.expires > now).count()).sum()
    }
}

/// Drop expired holders and key states with nothing left to remember.
fn sweep(t: &mut Table, now: Instant) {
    let mut idle = Vec::new();
    let mut gone = Vec::new();
    for (k, s) in t.keys.iter_mut() {
        s.holders.retain(|h| {
            let live = h.expires > now;
            if !live {
                gone.push(h.id);
            }
            live
        });
        if s.idle(now) {
            idle.push(*k);
        }
    }
    for id in gone {
        t.by_id.remove(&id);
    }
    for k in idle {
        t.forget(&k);
    }
    t.holders = t.keys.values().map(|s| s.holders.len()).sum();
    t.revoking.retain(|_, r| !r.finished());
}

/// `Lookup`: the handler's answer, after the revocations of changes to the directory are
/// through; when it asks for a lease and gets one, wrapped in `Reply::Leased` (a missing
/// name then answers `Absent` rather than ENOENT). The lease covers the partition the name
/// is in on this server (all of an unsplit directory); this server's changes to any entry
/// of the directory revoke it.
pub async fn lookup(
    st: &Arc<crate::state::State>,
    cred: shoal_proto::msg::Cred,
    dir: shoal_proto::Ino,
    name: String,
    ask: Option<LeaseAsk>,
) -> crate::error::R<shoal_proto::msg::Reply> {
    use shoal_proto::lease::LeasedReply;
    use shoal_proto::msg::Reply;
    let Some(leases) = st.meta.leases().cloned() else {
        return crate::ops::namespace::lookup(st, cred, dir, name).await?.0;
    };
    let key = LeaseKey::dir(dir);
    let ticket = leases.before_read(key).await;
    let (answer, part) = crate::ops::namespace::lookup(st, cred, dir, name).await?;
    match answer {
        Ok(Reply::Entry(e)) => Ok(match leases.grant(key, ticket, ask, part) {
            Some(lease) => Reply::Leased { lease, reply: LeasedReply::Entry(e) },
            None => Reply::Entry(e),
        }),
        Err(f) if f.errno == shoal_proto::Errno::ENOENT => match leases.grant(key, ticket, ask, part) {
            Some(lease) => Ok(Reply::Leased { lease, reply: LeasedReply::Absent }),
            None => Err(f),
        },
        other => other,
    }
}

/// `ReadDir`: as [`lookup`].
pub async fn readdir(
    st: &Arc<crate::state::State>,
    cred: shoal_proto::msg::Cred,
    dir: shoal_proto::Ino,
    after: Option<String>,
    from: Option<u64>,
    limit: u32,
    ask: Option<LeaseAsk>,
) -> crate::error::R<shoal_proto::msg::Reply> {
    use shoal_proto::lease::LeasedReply;
    use shoal_proto::msg::Reply;
    let Some(leases) = st.meta.leases().cloned() else {
        return Ok(crate::ops::namespace::readdir(st, cred, dir, after, from, limit).await?.0);
    };
    let key = LeaseKey::dir(dir);
    let ticket = leases.before_read(key).await;
    match crate::ops::namespace::readdir(st, cred, dir, after, from, limit).await? {
        (Reply::DirEntries { entries, more, part }, p) => Ok(match leases.grant(key, ticket, ask, p) {
            Some(lease) => Reply::Leased { lease, reply: LeasedReply::DirEntries { entries, more, part } },
            None => Reply::DirEntries { entries, more, part },
        }),
        (other, _) => Ok(other),
    }
}

/// `LeaseAck`.
pub fn ack(st: &crate::state::State, ids: &[u64]) -> shoal_proto::msg::Reply {
    if let Some(l) = st.meta.leases() {
        l.ack(ids);
    }
    shoal_proto::msg::Reply::Ok
}
