//! Directory leases held by this client (docs/architecture.md, "Leases").
//!
//! While the client holds a lease on a directory, the directory's server tells it before
//! any other client's change of the directory's entries takes effect (a revocation notice,
//! acknowledged once the lease is dropped here), so what the client learnt under the lease
//! stays true until then: lookups of those names, including "no such name", are answered
//! here without a request, and after a complete listing (a `ReadDir` from the start that
//! needed one page) so are lookups of any name and the listing itself. A lease runs out on
//! its own after its term, counted from when its request was sent (before the server's
//! count begins, so this side always stops first).
//!
//! Changes made by this client do not revoke its own leases (the server knows the session):
//! each namespace request is bracketed by [`LeaseCache::begin`] and [`LeaseCache::end`],
//! which apply its outcome to what the lease knows, or drop the lease when the outcome is
//! unknown (a lost reply, a server failure). A lease reply is only taken when no change of
//! this client to that directory and no revocation of it happened while it was on its way
//! (its `epoch`), so a reply read before a change can never be installed after it.
//!
//! How a lease is taken: a lookup the lease cannot answer asks the server with `Lookup` and
//! a lease request (one request, as without leases). Once a name was found missing in a
//! directory (it is being filled: a create follows a negative lookup), the next lookup the
//! lease cannot answer asks for the listing instead (`ReadDir` from the start, up to
//! [`LISTING_MAX`] entries): complete, it answers every later lookup. A lease in use is
//! renewed in the background when a third of its term is left, so a directory being
//! filled by this client keeps its complete listing (its own creates add to it).
//!
//! Read-mostly directories (docs/loading.md): a directory whose attributes this client saw
//! marked read-mostly (`Attr::read_mostly`, noted from every reply by [`LeaseCache::note`])
//! is fetched whole at its first unanswered lookup, not name by name: a library or module
//! search over many such directories then costs one `ReadDir` per directory per lease,
//! and every look-up after it, "no such name" included, is answered here. The
//! subdirectories listed in a read-mostly directory are presumed read-mostly too (they
//! inherit the mark) until their own attributes say otherwise.
//!
//! Bounds: at most [`MAX_DIRS`] directories tracked, [`MAX_NAMES`] names over all leases;
//! past them, nothing more is learnt (a lease that cannot learn a change is dropped).
//!
//! Split directories (docs/architecture.md, "Split directories"): a lease covers one
//! partition (its grant's `key.partition` at `depth`: the names whose hash has that index in
//! its low `depth` bits), so a directory may hold several, one per partition asked about
//! (overlapping ones replace each other). A lookup is answered only by the lease covering
//! its name, a negative one only when that lease holds its partition's complete listing.
//! Whole listings are answered from a lease only for an unsplit directory (a lease at depth
//! 0): a split directory's listing always asks its servers. Names are kept in listing
//! order (listing key, then name), the order servers list in, so that a listing answered
//! here and one continued at a server after the lease ends page the same way.

use parking_lot::Mutex;
use shoal_placement::{listing_key, name_hash};
use shoal_proto::lease::{LeaseAsk, LeaseGrant, LeaseRef, Notice};
use shoal_proto::msg::{BatchOp, DirEntry, FileKind, Op, PartRef, Reply};
use shoal_proto::{Errno, Ino, ServerId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Directories tracked at once (leases held, or changes and lease requests in flight).
pub(crate) const MAX_DIRS: usize = 4096;
/// Names remembered over all leases (a change that would pass it drops its lease).
pub(crate) const MAX_NAMES: usize = 1 << 20;
/// Entries asked for when a lookup finds no lease: a directory listed whole in one page of
/// this many becomes answerable locally for every name.
pub(crate) const LISTING_MAX: u32 = 1024;

/// What a lease says about one name: `Some((ino, kind))`, or `None` (no such name).
pub(crate) type Known = Option<(Ino, FileKind)>;

/// Where a name sorts in a listing (and in `Held::names`).
type Pos = (u64, String);

fn pos(name: &str) -> Pos {
    (listing_key(name_hash(name)), name.to_string())
}

/// Whether partition `part` holds names with hash `hash`.
fn covers(part: PartRef, hash: u64) -> bool {
    part.depth == 0 || part.depth >= 64 || hash & ((1u64 << part.depth) - 1) == u64::from(part.index)
}

/// Whether two partitions share names (one is the other or an ancestor of it).
fn overlap(a: PartRef, b: PartRef) -> bool {
    let d = a.depth.min(b.depth).min(32);
    d == 0 || (a.index ^ b.index) & ((1u64 << d) - 1) as u32 == 0
}

struct Held {
    id: u64,
    server: ServerId,
    expires: Instant,
    /// The term the server granted (it may be shorter than the one asked): renewals are
    /// due when a third of it is left.
    term: Duration,
    /// The partition the lease covers (index 0 at depth 0: the whole directory).
    part: PartRef,
    /// Every name of the partition is in `names` (absent ones are absent).
    complete: bool,
    names: BTreeMap<Pos, Known>,
}

#[derive(Default)]
struct DirState {
    /// Namespace requests of this client on the directory in flight.
    inflight: u32,
    /// The names those requests change, with how many requests change each. A lease does
    /// not answer for them: until the reply is applied (`end`), what it knows of such a
    /// name may already be wrong (another task of this client that made the name and got
    /// EEXIST would otherwise be told by the lease that the name does not exist).
    changing: HashMap<String, u32>,
    /// Lease requests on their way.
    asking: u32,
    /// Bumped by every change of this client and every revocation: a lease reply is taken
    /// only if it did not move while the reply was on its way.
    epoch: u64,
    /// At most one per partition; none overlapping another.
    leases: Vec<Held>,
    /// The server refused a lease (the directory is busy): ask for none until then.
    refused_until: Option<Instant>,
    /// A lookup found a name missing here: the next unanswered lookup fetches the listing.
    negative: bool,
    /// The listing did not fit in one page: lookups ask for names, not listings, until then.
    big_until: Option<Instant>,
    /// A renewal is on its way.
    renewing: bool,
}

/// How to ask the server for what a lease cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fetch {
    /// `Lookup` of the name, with a lease request.
    Name,
    /// `ReadDir` from the start (up to [`LISTING_MAX`]), with a lease request.
    Listing,
}

impl DirState {
    fn idle(&self, now: Instant) -> bool {
        self.inflight == 0
            && self.asking == 0
            && self.leases.iter().all(|l| l.expires <= now)
            && self.refused_until.is_none_or(|r| r <= now)
            && self.big_until.is_none_or(|r| r <= now)
    }

    fn names(&self) -> usize {
        self.leases.iter().map(|l| l.names.len()).sum()
    }

    /// The live lease covering names with `hash`.
    fn covering(&self, hash: u64, now: Instant) -> Option<&Held> {
        self.leases.iter().find(|l| l.expires > now && covers(l.part, hash))
    }
}

struct Inner {
    dirs: HashMap<Ino, DirState>,
    /// Names held by all leases (bounded by [`MAX_NAMES`]).
    names: usize,
}

impl Inner {
    /// Drop `dir`'s state when it holds nothing worth keeping.
    fn settle(&mut self, dir: Ino, now: Instant) {
        if let Some(s) = self.dirs.get_mut(&dir) {
            let before = s.names();
            s.leases.retain(|l| l.expires > now);
            self.names -= before - s.names();
            if s.idle(now) {
                self.dirs.remove(&dir);
            }
        }
    }

    /// Drop the leases of `dir` that `doomed` picks.
    fn drop_leases(&mut self, dir: Ino, doomed: impl Fn(&Held) -> bool) {
        if let Some(s) = self.dirs.get_mut(&dir) {
            let before = s.names();
            s.leases.retain(|l| !doomed(l));
            self.names -= before - s.names();
        }
    }
}

/// The leases of one client (shared by its clones).
pub(crate) struct LeaseCache {
    /// Term asked for; zero: leases are off.
    ask: Duration,
    inner: Mutex<Inner>,
    /// Directories last seen marked read-mostly, at most [`MAX_DIRS`] (when full, the set
    /// starts again: forgetting a mark only costs the name-by-name fetch until it is seen
    /// again). A mark seen cleared is removed.
    read_mostly: Mutex<std::collections::HashSet<Ino>>,
}

/// A lease request on its way (from [`LeaseCache::ask`]): hand it to [`LeaseCache::install`]
/// with the reply, or drop it.
pub(crate) struct Asking {
    cache: Arc<LeaseCache>,
    dir: Ino,
    epoch: u64,
    sent: Instant,
    pub(crate) ask: LeaseAsk,
}

impl Drop for Asking {
    fn drop(&mut self) {
        let mut inner = self.cache.inner.lock();
        if let Some(s) = inner.dirs.get_mut(&self.dir) {
            s.asking = s.asking.saturating_sub(1);
            s.renewing = false;
        }
        inner.settle(self.dir, Instant::now());
    }
}

/// What a lease reply taught.
pub(crate) enum Learnt {
    Name(String, Known),
    /// A page from the start: the whole directory when `more` is false.
    Listing(Vec<DirEntry>, bool),
}

/// The names a namespace request changes, from [`LeaseCache::begin`].
pub(crate) struct Touch {
    names: Vec<(Ino, String)>,
}

impl LeaseCache {
    pub(crate) fn new(ask: Duration) -> LeaseCache {
        LeaseCache {
            ask,
            inner: Mutex::new(Inner { dirs: HashMap::new(), names: 0 }),
            read_mostly: Mutex::new(Default::default()),
        }
    }

    /// Learn which directories are read-mostly from the attributes a reply carries.
    pub(crate) fn note(&self, reply: &Reply) {
        use shoal_proto::lease::LeasedReply;
        let attr = match reply {
            Reply::Attr(a) | Reply::Opened { attr: a, .. } => Some(a),
            Reply::Entry(e) | Reply::Leased { reply: LeasedReply::Entry(e), .. } => e.attr.as_ref(),
            Reply::Leased { reply: LeasedReply::Attr(a), .. } => Some(a),
            _ => None,
        };
        if let Some(a) = attr.filter(|a| a.kind == FileKind::Dir) {
            self.note_attr(a.ino, a.read_mostly);
        }
    }

    /// Directory `dir` is (`on`) or is not read-mostly.
    pub(crate) fn note_attr(&self, dir: Ino, on: bool) {
        let mut set = self.read_mostly.lock();
        if !on {
            set.remove(&dir);
            return;
        }
        if set.len() >= MAX_DIRS && !set.contains(&dir) {
            set.clear();
        }
        set.insert(dir);
    }

    /// Whether `dir` was last seen marked read-mostly.
    pub(crate) fn is_read_mostly(&self, dir: Ino) -> bool {
        self.read_mostly.lock().contains(&dir)
    }

    pub(crate) fn enabled(&self) -> bool {
        !self.ask.is_zero()
    }

    /// What the lease on `dir` says about `name`: `None` when it says nothing (no lease,
    /// expired, or a name it did not learn).
    pub(crate) fn lookup(&self, dir: Ino, name: &str, now: Instant) -> Option<Known> {
        let inner = self.inner.lock();
        let p = pos(name);
        let s = inner.dirs.get(&dir)?;
        if s.changing.contains_key(name) {
            return None;
        }
        let l = s.covering(p.0.reverse_bits(), now)?;
        match l.names.get(&p) {
            Some(k) => Some(*k),
            None if l.complete => Some(None),
            None => None,
        }
    }

    /// Names of `dir` that a lease held now knows to exist, other than `except`, with
    /// their inodes: at most `limit` (the stat-ahead's candidates: `stat_ahead.rs`).
    pub(crate) fn known_names(&self, dir: Ino, except: &str, limit: usize, now: Instant) -> Vec<(String, Ino)> {
        let inner = self.inner.lock();
        let Some(d) = inner.dirs.get(&dir) else { return Vec::new() };
        d.leases
            .iter()
            .filter(|l| l.expires > now)
            .flat_map(|l| l.names.iter())
            .filter_map(|((_, name), known)| known.filter(|_| name != except).map(|(ino, _)| (name.clone(), ino)))
            .take(limit)
            .collect()
    }

    /// When the lease that answers lookups of `dir/name` (found or not) ends, if one does.
    pub(crate) fn answering(&self, dir: Ino, name: &str, now: Instant) -> Option<Instant> {
        let inner = self.inner.lock();
        let p = pos(name);
        let s = inner.dirs.get(&dir)?;
        if s.changing.contains_key(name) {
            return None;
        }
        let l = s.covering(p.0.reverse_bits(), now)?;
        (l.complete || l.names.contains_key(&p)).then_some(l.expires)
    }

    /// The whole directory, if a lease holds its complete listing (an unsplit directory
    /// only): entries after the name `after` in listing order, at most `limit` (0: all),
    /// and whether more follow.
    pub(crate) fn listing(
        &self,
        dir: Ino,
        after: Option<&str>,
        limit: usize,
        now: Instant,
    ) -> Option<(Vec<DirEntry>, bool)> {
        let inner = self.inner.lock();
        let l = inner.dirs.get(&dir)?.leases.iter().find(|l| l.expires > now && l.complete && l.part.depth == 0)?;
        let range = match after {
            Some(a) => l.names.range((std::ops::Bound::Excluded(pos(a)), std::ops::Bound::Unbounded)),
            None => l.names.range(..),
        };
        let mut present = range.filter_map(|((_, n), k)| k.map(|(ino, kind)| DirEntry { name: n.clone(), ino, kind }));
        let limit = if limit == 0 { usize::MAX } else { limit };
        let page: Vec<DirEntry> = present.by_ref().take(limit).collect();
        let more = present.next().is_some();
        Some((page, more))
    }

    /// A renewal of the lease covering `dir/name`, when one is due: the lease is in use
    /// (this lookup was answered from it) and a third of its term or less is left.
    pub(crate) fn renewal(self: &Arc<Self>, dir: Ino, name: &str, now: Instant) -> Option<Asking> {
        {
            let mut inner = self.inner.lock();
            let s = inner.dirs.get_mut(&dir)?;
            let l = s.covering(name_hash(name), now)?;
            // Against the granted term, not the asked one: a server that grants less than
            // asked would otherwise see a renewal after every lookup the lease answers.
            if s.renewing || l.expires > now + l.term / 3 {
                return None;
            }
            s.renewing = true;
        }
        let asking = self.ask(dir);
        if asking.is_none() {
            if let Some(s) = self.inner.lock().dirs.get_mut(&dir) {
                s.renewing = false;
            }
        }
        asking
    }

    /// How to ask for what the lease on `dir` could not answer: the listing once a name
    /// was found missing there, or at once in a read-mostly directory, unless it was too
    /// big for one page lately.
    pub(crate) fn fetch(&self, dir: Ino, now: Instant) -> Fetch {
        let read_mostly = self.is_read_mostly(dir);
        let inner = self.inner.lock();
        match inner.dirs.get(&dir) {
            Some(s) if s.big_until.is_some_and(|b| b > now) => Fetch::Name,
            Some(s) if s.negative => Fetch::Listing,
            _ if read_mostly => Fetch::Listing,
            _ => Fetch::Name,
        }
    }

    /// A lease to ask for with a request on `dir`, unless leases are off, the server
    /// refused one lately, or too many directories are tracked.
    pub(crate) fn ask(self: &Arc<Self>, dir: Ino) -> Option<Asking> {
        if !self.enabled() {
            return None;
        }
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if inner.dirs.len() >= MAX_DIRS && !inner.dirs.contains_key(&dir) {
            let all: Vec<Ino> = inner.dirs.keys().copied().collect();
            for d in all {
                inner.settle(d, now);
            }
            if inner.dirs.len() >= MAX_DIRS {
                return None;
            }
        }
        let s = inner.dirs.entry(dir).or_default();
        if s.refused_until.is_some_and(|r| r > now) {
            s.renewing = false;
            return None;
        }
        s.asking += 1;
        let ms = self.ask.as_millis().min(u32::MAX as u128) as u32;
        Some(Asking { cache: self.clone(), dir, epoch: s.epoch, sent: now, ask: LeaseAsk { ms } })
    }

    /// The reply to a request that asked for a lease came: take the lease it grants (if the
    /// directory did not change meanwhile), or note that none was granted.
    pub(crate) fn install(&self, asking: Asking, server: ServerId, grant: Option<LeaseGrant>, learnt: Learnt) {
        let now = Instant::now();
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let Some(s) = inner.dirs.get_mut(&asking.dir) else { return };
        if let Learnt::Name(_, None) = &learnt {
            s.negative = true;
        }
        let Some(grant) = grant else {
            // Busy (or full, or leases off there): plain requests for one lease term.
            s.refused_until = Some(now + self.ask);
            return;
        };
        if grant.key.dir != asking.dir {
            return;
        }
        let term = Duration::from_millis(grant.ms as u64);
        let expires = asking.sent + term;
        if expires <= now {
            return;
        }
        let part = PartRef { index: grant.key.partition, depth: grant.depth };
        if s.epoch != asking.epoch || s.inflight > 0 {
            // The reply may have crossed a change of this client or a revocation: nothing
            // is learnt from it. A renewal of the lease held (same id: no other client's
            // change came between, it would have revoked it) still extends it; this
            // client's own changes are applied to it as they are answered.
            if let Some(l) = s.leases.iter_mut().find(|l| l.id == grant.id && l.server == server && l.part == part) {
                if l.expires > now {
                    l.expires = l.expires.max(expires);
                    l.term = term;
                }
            }
            return;
        }
        let held =
            s.leases.iter().position(|l| l.id == grant.id && l.server == server && l.part == part && l.expires > now);
        let at = match held {
            Some(at) => at,
            None => {
                // A lease on a partition replaces those it overlaps (the same partition
                // before a split, or its parent).
                let before = s.names();
                s.leases.retain(|l| !overlap(l.part, part));
                inner.names -= before - s.names();
                s.leases.push(Held {
                    id: grant.id,
                    server,
                    expires,
                    term,
                    part,
                    complete: false,
                    names: BTreeMap::new(),
                });
                s.leases.len() - 1
            }
        };
        let room = MAX_NAMES.saturating_sub(inner.names);
        let l = &mut s.leases[at];
        l.expires = l.expires.max(expires);
        l.term = term;
        let before = l.names.len();
        match learnt {
            Learnt::Name(name, known) => {
                if room > 0 && covers(part, name_hash(&name)) {
                    l.names.insert(pos(&name), known);
                }
            }
            // A page from the partition's first position: all of it when `more` is false.
            Learnt::Listing(entries, more) => {
                // The subdirectories of a read-mostly directory are presumed read-mostly
                // (they inherit the mark when made): a search walking into them lists
                // each at once. A wrong presumption costs a listing instead of a look-up;
                // their attributes, once seen, say for sure.
                if self.is_read_mostly(asking.dir) {
                    for e in entries.iter().filter(|e| e.kind == FileKind::Dir) {
                        self.note_attr(e.ino, true);
                    }
                }
                let entries = entries.into_iter().filter(|e| covers(part, name_hash(&e.name)));
                if !more && entries.clone().count() <= room + before {
                    l.names = entries.map(|e| (pos(&e.name), Some((e.ino, e.kind)))).collect();
                    l.complete = true;
                } else {
                    if more {
                        s.big_until = Some(now + self.ask);
                    }
                    for e in entries.take(room) {
                        l.names.insert(pos(&e.name), Some((e.ino, e.kind)));
                    }
                }
            }
        }
        let after = l.names.len();
        inner.names = inner.names + after - before;
    }

    /// A namespace request of this client is about to be sent: the names it changes, for
    /// [`LeaseCache::end`]; `None` for requests that change no entry.
    pub(crate) fn begin(&self, op: &Op) -> Option<Touch> {
        if !self.enabled() {
            return None;
        }
        let names = changed_names(op);
        if names.is_empty() {
            return None;
        }
        let mut inner = self.inner.lock();
        for (dir, name) in &names {
            let s = inner.dirs.entry(*dir).or_default();
            s.inflight += 1;
            *s.changing.entry(name.clone()).or_default() += 1;
            s.epoch += 1;
        }
        Some(Touch { names })
    }

    /// The request of `touch` was answered `reply`: apply its outcome to the leases.
    pub(crate) fn end(&self, touch: Touch, op: &Op, reply: Result<&Reply, Errno>) {
        let outcomes = outcomes(op, reply, &touch.names);
        let now = Instant::now();
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        for ((dir, name), outcome) in touch.names.iter().zip(outcomes) {
            let Some(s) = inner.dirs.get_mut(dir) else { continue };
            s.inflight = s.inflight.saturating_sub(1);
            if let Some(n) = s.changing.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    s.changing.remove(name);
                }
            }
            s.epoch += 1;
            let full = inner.names >= MAX_NAMES;
            let p = pos(name);
            let hash = p.0.reverse_bits();
            match (outcome, s.leases.iter_mut().find(|l| covers(l.part, hash))) {
                (_, None) | (Outcome::Unchanged, _) => {}
                (Outcome::Now(k), Some(l)) => {
                    if l.names.insert(p, k).is_none() {
                        inner.names += 1;
                        if full {
                            inner.drop_leases(*dir, |l| covers(l.part, hash));
                        }
                    }
                }
                (Outcome::Unknown, Some(_)) => inner.drop_leases(*dir, |l| covers(l.part, hash)),
            }
            inner.settle(*dir, now);
        }
    }

    /// A server's notice (`None`: a connection to it was lost): the leases it revokes are
    /// dropped. Returns the directories whose leases went (the caller drops what else it
    /// cached of them) and the lease ids to acknowledge.
    pub(crate) fn notice(&self, server: ServerId, notice: Option<Notice>) -> (Vec<Ino>, Vec<u64>) {
        let mut revoked = Vec::new();
        let mut dropped = Vec::new();
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        match notice {
            Some(Notice::Revoke { leases }) => {
                for LeaseRef { id, key } in leases {
                    revoked.push(id);
                    if let Some(s) = inner.dirs.get_mut(&key.dir) {
                        // Also a reply granting this lease that is still on its way is void.
                        s.epoch += 1;
                        inner.drop_leases(key.dir, |l| l.id == id && l.server == server);
                    }
                    dropped.push(key.dir);
                }
            }
            // A revocation may have been lost with the connection: the server's leases go
            // (the server waits for them to run out).
            None => {
                let held: Vec<Ino> = inner
                    .dirs
                    .iter()
                    .filter(|(_, s)| s.leases.iter().any(|l| l.server == server))
                    .map(|(d, _)| *d)
                    .collect();
                for d in held {
                    if let Some(s) = inner.dirs.get_mut(&d) {
                        s.epoch += 1;
                    }
                    inner.drop_leases(d, |l| l.server == server);
                    dropped.push(d);
                }
            }
        }
        (dropped, revoked)
    }
}

/// What became of one name a request touched.
enum Outcome {
    /// The request changed nothing there (it was refused).
    Unchanged,
    /// The name now names this (or nothing).
    Now(Known),
    /// Cannot tell: drop the lease.
    Unknown,
}

/// The (directory, name) pairs whose entries `op` changes.
fn changed_names(op: &Op) -> Vec<(Ino, String)> {
    match op {
        Op::Create { dir, name, .. }
        | Op::Mkdir { dir, name, .. }
        | Op::Symlink { dir, name, .. }
        | Op::Link { dir, name, .. }
        | Op::Unlink { dir, name, .. }
        | Op::Rmdir { dir, name } => vec![(*dir, name.clone())],
        Op::Rename { src_dir, src_name, dst_dir, dst_name, .. } => {
            vec![(*src_dir, src_name.clone()), (*dst_dir, dst_name.clone())]
        }
        Op::Batch { ops } => ops
            .iter()
            .filter_map(|b| match b {
                BatchOp::Create { dir, name, .. }
                | BatchOp::Mkdir { dir, name, .. }
                | BatchOp::Symlink { dir, name, .. }
                | BatchOp::Unlink { dir, name }
                | BatchOp::Rmdir { dir, name } => Some((*dir, name.clone())),
                BatchOp::Lookup { .. } | BatchOp::GetAttr { .. } => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Errors after which the request certainly changed nothing (the server refused it).
fn refused(errno: Errno) -> bool {
    [
        Errno::EEXIST,
        Errno::ENOTEMPTY,
        Errno::EACCES,
        Errno::EPERM,
        Errno::ENOTDIR,
        Errno::EISDIR,
        Errno::EINVAL,
        Errno::ENAMETOOLONG,
        Errno::ENOSPC,
        Errno::EXDEV,
        Errno::ELOOP,
        Errno::ESTALE,
    ]
    .contains(&errno)
}

/// The outcome of `op` for each of `names` (as `changed_names` listed them).
fn outcomes(op: &Op, reply: Result<&Reply, Errno>, names: &[(Ino, String)]) -> Vec<Outcome> {
    let one = |op: &Op, r: Result<&Reply, Errno>| -> Outcome {
        match (op, r) {
            (_, Err(e)) if refused(e) => Outcome::Unchanged,
            // Sent to a server not holding the name's partition: nothing happened (the
            // request goes again, and is accounted for then).
            (_, Ok(Reply::Partitions { .. })) => Outcome::Unchanged,
            (Op::Unlink { .. } | Op::Rmdir { .. }, Err(Errno::ENOENT)) => Outcome::Now(None),
            (_, Err(Errno::ENOENT)) => Outcome::Unchanged,
            (_, Err(_)) => Outcome::Unknown,
            (Op::Unlink { .. } | Op::Rmdir { .. }, Ok(_)) => Outcome::Now(None),
            (_, Ok(Reply::Entry(e))) => Outcome::Now(Some((e.ino, e.kind))),
            (_, Ok(Reply::Attr(a))) => Outcome::Now(Some((a.ino, a.kind))),
            _ => Outcome::Unknown,
        }
    };
    match op {
        Op::Rename { flags, .. } => match reply {
            Err(e) if refused(e) || e == Errno::ENOENT => vec![Outcome::Unchanged, Outcome::Unchanged],
            // Where the moved name now points is not in the reply.
            Ok(_) if !flags.exchange => vec![Outcome::Now(None), Outcome::Unknown],
            _ => vec![Outcome::Unknown, Outcome::Unknown],
        },
        Op::Batch { ops } => {
            let changing = ops.iter().filter(|b| !matches!(b, BatchOp::Lookup { .. } | BatchOp::GetAttr { .. }));
            match reply {
                Ok(Reply::Batch(results)) if results.len() == ops.len() => ops
                    .iter()
                    .zip(results)
                    .filter(|(b, _)| !matches!(b, BatchOp::Lookup { .. } | BatchOp::GetAttr { .. }))
                    .map(|(b, r)| {
                        let r = r.clone().into_reply();
                        match r {
                            Reply::Error { errno, .. } => one(&b.clone().into_op(), Err(errno)),
                            ok => one(&b.clone().into_op(), Ok(&ok)),
                        }
                    })
                    .collect(),
                _ => changing.map(|_| Outcome::Unknown).collect(),
            }
        }
        op => names.iter().map(|_| one(op, reply)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::lease::LeaseKey;

    const DIR: Ino = Ino(40);

    fn cache() -> Arc<LeaseCache> {
        Arc::new(LeaseCache::new(Duration::from_secs(30)))
    }

    fn grant(id: u64, index: u32, depth: u32) -> Option<LeaseGrant> {
        Some(LeaseGrant { id, key: LeaseKey { dir: DIR, partition: index, attrs: false }, ms: 30_000, depth })
    }

    fn entry(name: &str, ino: u64) -> DirEntry {
        DirEntry { name: name.to_string(), ino: Ino(ino), kind: FileKind::File }
    }

    /// Names with hash bit 0 clear (partition 0 at depth 1) and set (partition 1).
    fn halves() -> (Vec<String>, Vec<String>) {
        let all: Vec<String> = (0..40).map(|i| format!("n{i}")).collect();
        all.into_iter().partition(|n| name_hash(n) & 1 == 0)
    }

    /// Install the complete listing `names` of partition `index` at `depth` as lease `id`.
    fn listing(c: &Arc<LeaseCache>, id: u64, index: u32, depth: u32, names: &[String]) {
        let asking = c.ask(DIR).unwrap();
        let entries = names.iter().enumerate().map(|(i, n)| entry(n, 100 + i as u64)).collect();
        c.install(asking, ServerId(index), grant(id, index, depth), Learnt::Listing(entries, false));
    }

    #[test]
    fn an_unsplit_directory_s_lease_answers_every_name_and_the_listing() {
        let c = cache();
        let (even, odd) = halves();
        listing(&c, 1, 0, 0, &even);
        let now = Instant::now();
        assert!(matches!(c.lookup(DIR, &even[0], now), Some(Some(_))));
        assert_eq!(c.lookup(DIR, &odd[0], now), Some(None), "complete: absent names are absent");
        let (page, more) = c.listing(DIR, None, 0, now).unwrap();
        assert!(!more);
        assert_eq!(page.len(), even.len());
        let keys: Vec<Pos> = page.iter().map(|e| pos(&e.name)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "listing order, as servers list");
        // Pages continue after a name, in the same order.
        let (first, more) = c.listing(DIR, None, 3, now).unwrap();
        assert!(more);
        let (rest, _) = c.listing(DIR, Some(&first[2].name), 0, now).unwrap();
        assert_eq!(first.len() + rest.len(), page.len());
        assert_eq!(rest[0].name, page[3].name);
    }

    /// Tasks of one client making the same name: those answered EEXIST before the one that
    /// made it hears back must not be told by the lease that the name does not exist.
    #[test]
    fn a_name_being_changed_by_this_client_is_not_answered_from_the_lease() {
        let c = cache();
        let (even, odd) = halves();
        listing(&c, 1, 0, 0, &even);
        let now = Instant::now();
        assert_eq!(c.lookup(DIR, &odd[0], now), Some(None));
        let mkdir = |name: &str| Op::Mkdir { dir: DIR, name: name.to_string(), perm: 0o755 };
        let (winner, loser) = (c.begin(&mkdir(&odd[0])).unwrap(), c.begin(&mkdir(&odd[0])).unwrap());
        assert_eq!(c.lookup(DIR, &odd[0], now), None, "a change in flight: ask the server");
        assert_eq!(c.answering(DIR, &odd[0], now), None);
        assert_eq!(c.lookup(DIR, &odd[1], now), Some(None), "other names are still answered");
        c.end(loser, &mkdir(&odd[0]), Err(Errno::EEXIST));
        assert_eq!(c.lookup(DIR, &odd[0], now), None, "the winner's reply is still on its way");
        let made = Reply::Attr(crate::path_ops::dir_stub(Ino(77)));
        c.end(winner, &mkdir(&odd[0]), Ok(&made));
        assert_eq!(c.lookup(DIR, &odd[0], now), Some(Some((Ino(77), FileKind::Dir))));
    }

    #[test]
    fn a_partition_s_lease_answers_only_the_names_of_its_partition() {
        let c = cache();
        let (even, odd) = halves();
        listing(&c, 7, 1, 1, &odd);
        let now = Instant::now();
        assert!(matches!(c.lookup(DIR, &odd[0], now), Some(Some(_))));
        assert_eq!(c.lookup(DIR, &format!("{}x", odd[0]), now).is_some(), name_hash(&format!("{}x", odd[0])) & 1 == 1);
        for n in &even {
            assert_eq!(c.lookup(DIR, n, now), None, "{n} is in the other partition: ask its server");
        }
        assert!(c.listing(DIR, None, 0, now).is_none(), "no whole listing of a split directory from leases");
        // A second partition's lease sits beside the first.
        listing(&c, 8, 0, 1, &even);
        assert!(matches!(c.lookup(DIR, &even[0], now), Some(Some(_))));
        assert!(matches!(c.lookup(DIR, &odd[0], now), Some(Some(_))));
        // Revoking one leaves the other.
        c.notice(
            ServerId(1),
            Some(Notice::Revoke {
                leases: vec![LeaseRef { id: 7, key: LeaseKey { dir: DIR, partition: 1, attrs: false } }],
            }),
        );
        assert_eq!(c.lookup(DIR, &odd[0], now), None);
        assert!(matches!(c.lookup(DIR, &even[0], now), Some(Some(_))));
        // A lease on an overlapping partition (the whole directory) replaces it.
        listing(&c, 9, 0, 0, &even);
        assert_eq!(c.inner.lock().dirs[&DIR].leases.len(), 1);
    }

    #[test]
    fn a_misrouted_request_changes_nothing_a_lease_knows() {
        let c = cache();
        let (even, _) = halves();
        listing(&c, 1, 0, 0, &even);
        let op = Op::Unlink { dir: DIR, name: even[0].clone(), keep: None };
        let touch = c.begin(&op).unwrap();
        c.end(touch, &op, Ok(&Reply::Partitions { dir: DIR, bitmap: vec![0b11] }));
        assert!(matches!(c.lookup(DIR, &even[0], Instant::now()), Some(Some(_))), "the lease is kept, the name too");
    }

    /// Servers cap the term (5 s by default) below what a mount may ask (60 s): a renewal is
    /// due a third of the granted term before the end, not after every answered lookup.
    #[test]
    fn a_renewal_is_due_by_the_term_granted_not_the_term_asked() {
        let c = Arc::new(LeaseCache::new(Duration::from_secs(60)));
        let (even, odd) = halves();
        let asking = c.ask(DIR).unwrap();
        let short = LeaseGrant { ms: 6_000, ..grant(1, 0, 0).unwrap() };
        let entries = even.iter().enumerate().map(|(i, n)| entry(n, 100 + i as u64)).collect();
        c.install(asking, ServerId(0), Some(short), Learnt::Listing(entries, false));
        let now = Instant::now();
        assert_eq!(c.lookup(DIR, &odd[0], now), Some(None));
        assert!(c.renewal(DIR, &odd[0], now).is_none(), "6 s granted, all of it left: no renewal yet");
        let late = now + Duration::from_millis(4_500);
        let renewal = c.renewal(DIR, &odd[0], late).expect("under a third of the term left: renew");
        assert!(c.renewal(DIR, &odd[0], late).is_none(), "one renewal on its way at a time");
        drop(renewal);
    }

    #[test]
    fn a_renewal_that_crossed_an_own_change_extends_the_lease_but_teaches_nothing() {
        let c = cache();
        let (even, _) = halves();
        listing(&c, 1, 0, 0, &even);
        let before = c.inner.lock().dirs[&DIR].leases[0].expires;
        // The renewal is sent; then this client creates a name while it is on its way.
        let renewal = c.ask(DIR).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let op = Op::Create { dir: DIR, name: "fresh".into(), perm: 0o644, exclusive: true, layout: None };
        let _touch = c.begin(&op).unwrap();
        // The reply read the directory before the create: "fresh" absent.
        c.install(renewal, ServerId(0), grant(1, 0, 0), Learnt::Name("fresh".into(), None));
        {
            let inner = c.inner.lock();
            let l = &inner.dirs[&DIR].leases[0];
            assert!(l.expires > before, "same lease id: extended");
            assert!(!l.names.contains_key(&pos("fresh")), "nothing learnt from a reply that crossed a change");
        }
        // A grant under another id (the lease was revoked and granted anew) extends nothing.
        let c = cache();
        listing(&c, 1, 0, 0, &even);
        let before = c.inner.lock().dirs[&DIR].leases[0].expires;
        let renewal = c.ask(DIR).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let _touch = c.begin(&op).unwrap();
        c.install(renewal, ServerId(0), grant(2, 0, 0), Learnt::Name("fresh".into(), None));
        assert_eq!(c.inner.lock().dirs[&DIR].leases[0].expires, before);
    }

    #[test]
    fn partitions_cover_and_overlap_by_their_low_bits() {
        assert!(covers(PartRef { index: 0, depth: 0 }, 0xdead));
        assert!(covers(PartRef { index: 1, depth: 1 }, 0b101));
        assert!(!covers(PartRef { index: 1, depth: 1 }, 0b100));
        assert!(covers(PartRef { index: 0b10, depth: 2 }, 0b110));
        assert!(overlap(PartRef { index: 0, depth: 0 }, PartRef { index: 3, depth: 2 }));
        assert!(overlap(PartRef { index: 1, depth: 1 }, PartRef { index: 3, depth: 2 }));
        assert!(!overlap(PartRef { index: 0, depth: 1 }, PartRef { index: 3, depth: 2 }));
        assert!(!overlap(PartRef { index: 1, depth: 2 }, PartRef { index: 3, depth: 2 }));
    }
}
