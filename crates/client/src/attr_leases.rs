//! Attribute leases held by this client (`shoal_proto::lease`, "Attribute leases";
//! docs/architecture.md, "Leases").
//!
//! A client that offers `FEATURE_ATTR_LEASES` (option `attr_leases`; the FUSE mount does)
//! gets, with the attributes of an inode from its home server, a lease on them: until the
//! lease runs out or is revoked, no other session changes the inode's record (the home
//! revokes first and waits for the acknowledgement), so the attributes kept here are exact
//! and a `stat`, or the attribute check of an `open`, needs no request.
//!
//! **This client's own changes** revoke none of its leases (the server knows the session),
//! so they are applied here: every request that may change an inode's record (see
//! [`touched`]) drops the leases on those inodes before it is sent and again when it is
//! answered, and while it is in flight no lease on them is taken. A reply granting a lease
//! is taken only if no revocation and no own change of the inode happened since its request
//! was sent ([`AttrLeases::sent`] notes when), so a reply that read the inode before a
//! change is never installed after it.
//!
//! Bounds: at most [`MAX_INODES`] leases; past it, expired ones are dropped, then new grants
//! are not kept (the server's record of them runs out on its own).

use parking_lot::Mutex;
use shoal_proto::lease::{LeaseGrant, LeaseRef, LeasedReply};
use shoal_proto::msg::{Attr, BatchOp, BatchReply, Op, Reply};
use shoal_proto::{Ino, ServerId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Leases kept at once.
pub(crate) const MAX_INODES: usize = 1 << 18;
/// Inodes remembered as changed while requests were in flight; past it, every reply in
/// flight is refused its lease (see `Inner::floor`).
const MAX_TOUCHED: usize = 1 << 16;

struct Held {
    id: u64,
    server: ServerId,
    expires: Instant,
    attr: Attr,
}

/// An inode changed by this client or revoked: what a reply in flight must not undo.
#[derive(Default)]
struct Touched {
    /// Own requests that may change it, in flight.
    inflight: u32,
    /// The epoch of its last change, revocation, or own request's start or end.
    epoch: u64,
}

#[derive(Default)]
struct Inner {
    held: HashMap<Ino, Held>,
    touched: HashMap<Ino, Touched>,
    /// Bumped by every revocation and own change.
    epoch: u64,
    /// Replies to requests sent before this epoch are refused their leases (set when
    /// `touched` overflowed and was cleared).
    floor: u64,
    /// Requests that may bring leases, in flight.
    asking: usize,
}

impl Inner {
    fn touch(&mut self, ino: Ino) {
        self.epoch += 1;
        self.held.remove(&ino);
        if self.touched.len() >= MAX_TOUCHED && !self.touched.contains_key(&ino) {
            self.touched.retain(|_, t| t.inflight > 0);
            if self.touched.len() >= MAX_TOUCHED / 2 {
                self.touched.clear();
            }
            self.floor = self.epoch;
        }
        self.touched.entry(ino).or_default().epoch = self.epoch;
    }
}

/// The attribute leases of one client.
pub(crate) struct AttrLeases {
    enabled: bool,
    inner: Mutex<Inner>,
}

/// A request that may bring leases is on its way (from [`AttrLeases::sent`]).
pub(crate) struct Sent {
    leases: Arc<AttrLeases>,
    epoch: u64,
    at: Instant,
}

impl Drop for Sent {
    fn drop(&mut self) {
        let mut inner = self.leases.inner.lock();
        inner.asking = inner.asking.saturating_sub(1);
        if inner.asking == 0 {
            // Nothing in flight can be refused any more because of these.
            inner.touched.retain(|_, t| t.inflight > 0);
        }
    }
}

/// The inodes an own request of this client changes, from [`AttrLeases::begin`].
pub(crate) struct Changing {
    inos: Vec<Ino>,
}

impl AttrLeases {
    pub(crate) fn new(enabled: bool) -> AttrLeases {
        AttrLeases { enabled, inner: Mutex::new(Inner::default()) }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// The attributes of `ino` and when their lease ends, if one is held.
    pub(crate) fn get(&self, ino: Ino, now: Instant) -> Option<(Attr, Instant)> {
        let inner = self.inner.lock();
        let h = inner.held.get(&ino)?;
        (h.expires > now).then(|| (h.attr.clone(), h.expires))
    }

    /// The attributes `ino` had when its last lease ended, if it ran out rather than being
    /// revoked or dropped by a change of this client: exact then, a hint now.
    pub(crate) fn last(&self, ino: Ino) -> Option<Attr> {
        self.inner.lock().held.get(&ino).map(|h| h.attr.clone())
    }

    /// When the lease on `ino` ends, if one is held.
    pub(crate) fn expires(&self, ino: Ino, now: Instant) -> Option<Instant> {
        self.inner.lock().held.get(&ino).map(|h| h.expires).filter(|e| *e > now)
    }

    /// For the stat-ahead: `None` while a lease on `ino` holds at `by`; else when it runs
    /// or ran out (`Some(None)`: none is remembered).
    pub(crate) fn ran_out(&self, ino: Ino, by: Instant) -> Option<Option<Instant>> {
        match self.inner.lock().held.get(&ino) {
            Some(h) if h.expires > by => None,
            Some(h) => Some(Some(h.expires)),
            None => Some(None),
        }
    }

    /// A request whose reply may carry leases is about to be sent.
    pub(crate) fn sent(self: &Arc<Self>) -> Option<Sent> {
        if !self.enabled {
            return None;
        }
        let mut inner = self.inner.lock();
        inner.asking += 1;
        Some(Sent { leases: self.clone(), epoch: inner.epoch, at: Instant::now() })
    }

    /// Take the leases `reply` grants (an answer from `server` to the request of `sent`),
    /// turning a leased `GetAttr`/`SetAttr` answer back into the plain `Reply::Attr` callers
    /// expect.
    pub(crate) fn take(&self, sent: Sent, server: ServerId, reply: &mut Reply) {
        let mut grants: Vec<(LeaseGrant, Attr)> = Vec::new();
        match reply {
            Reply::Leased { lease, reply: LeasedReply::Attr(a) } => {
                grants.push((*lease, a.clone()));
                *reply = Reply::Attr(a.clone());
            }
            Reply::Entry(e) | Reply::Leased { reply: LeasedReply::Entry(e), .. } => {
                if let (Some(g), Some(a)) = (e.attr_lease.take(), &e.attr) {
                    grants.push((g, a.clone()));
                }
            }
            Reply::Batch(replies) => {
                for r in replies {
                    if let BatchReply::Entry(e) = r {
                        if let (Some(g), Some(a)) = (e.attr_lease.take(), &e.attr) {
                            grants.push((g, a.clone()));
                        }
                    }
                }
            }
            _ => {}
        }
        if grants.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.inner.lock();
        for (g, attr) in grants {
            if !g.key.attrs || g.key.dir != attr.ino || sent.epoch < inner.floor {
                continue;
            }
            if inner.touched.get(&attr.ino).is_some_and(|t| t.inflight > 0 || t.epoch > sent.epoch) {
                continue;
            }
            let expires = sent.at + Duration::from_millis(g.ms as u64);
            if expires <= now {
                continue;
            }
            if inner.held.len() >= MAX_INODES && !inner.held.contains_key(&attr.ino) {
                inner.held.retain(|_, h| h.expires > now);
                if inner.held.len() >= MAX_INODES {
                    continue;
                }
            }
            inner.held.insert(attr.ino, Held { id: g.id, server, expires, attr });
        }
    }

    /// An own request that may change inodes is about to be sent: drop their leases and
    /// keep replies in flight from installing new ones until [`AttrLeases::end`].
    /// `named`: what the client knows a name to be (for the inode an unlink or rename
    /// removes or replaces).
    pub(crate) fn begin(&self, op: &Op, named: impl Fn(Ino, &str) -> Option<Ino>) -> Option<Changing> {
        if !self.enabled {
            return None;
        }
        let inos = touched(op, &named)?;
        let mut inner = self.inner.lock();
        match &inos {
            Some(inos) => {
                for &ino in inos {
                    inner.touch(ino);
                    if let Some(t) = inner.touched.get_mut(&ino) {
                        t.inflight += 1;
                    }
                }
            }
            None => {
                // A change this client cannot attribute: drop everything.
                inner.epoch += 1;
                inner.held.clear();
                inner.floor = inner.epoch;
            }
        }
        Some(Changing { inos: inos.unwrap_or_default() })
    }

    /// The request of [`AttrLeases::begin`] was answered (or failed): drop what a reply in
    /// flight may have installed meanwhile, and let leases on those inodes be taken again;
    /// also the inode `reply` says a rename replaced.
    pub(crate) fn end(&self, changing: Changing, reply: Option<&Reply>) {
        let mut inner = self.inner.lock();
        for ino in changing.inos {
            inner.touch(ino);
            if let Some(t) = inner.touched.get_mut(&ino) {
                t.inflight = t.inflight.saturating_sub(1);
            }
        }
        if let Some(Reply::Replaced(Some(e))) = reply {
            inner.touch(e.ino);
        }
    }

    /// Leases a server revoked: dropped. Returns the inodes.
    pub(crate) fn revoked(&self, server: ServerId, leases: &[LeaseRef]) -> Vec<Ino> {
        let mut inner = self.inner.lock();
        let mut inos = Vec::new();
        for r in leases.iter().filter(|r| r.key.attrs) {
            let ino = r.key.dir;
            if inner.held.get(&ino).is_some_and(|h| h.id == r.id && h.server == server) {
                inner.held.remove(&ino);
            }
            inner.touch(ino);
            inos.push(ino);
        }
        inos
    }

    /// A connection to `server` was lost (a revocation may have been lost with it): its
    /// leases go. Returns the inodes.
    pub(crate) fn lost(&self, server: ServerId) -> Vec<Ino> {
        let mut inner = self.inner.lock();
        let inos: Vec<Ino> = inner.held.iter().filter(|(_, h)| h.server == server).map(|(i, _)| *i).collect();
        for &ino in &inos {
            inner.touch(ino);
        }
        inos
    }
}

/// The inodes whose records `op` may change (`None` inside: it may change any, as far as
/// this client can tell); `None` outside: none. Names an unlink or rename removes or
/// replaces are resolved with `named`; one it cannot resolve is covered by `end` for a
/// rename (the reply names it) and by nothing for an unlink (its inode's link count may
/// then be stale under a lease of this client on another name of it until the lease ends;
/// the FUSE mount looks every name up before it unlinks it, so `named` knows it there).
#[allow(clippy::option_option)]
fn touched(op: &Op, named: &impl Fn(Ino, &str) -> Option<Ino>) -> Option<Option<Vec<Ino>>> {
    let named_too = |dir: Ino, name: &str| -> Vec<Ino> {
        let mut v = vec![dir];
        v.extend(named(dir, name));
        v
    };
    let inos = match op {
        Op::Create { dir, .. } | Op::Mkdir { dir, .. } | Op::Symlink { dir, .. } => vec![*dir],
        Op::Link { ino, dir, .. } => vec![*ino, *dir],
        Op::Unlink { dir, name, .. } | Op::Rmdir { dir, name } => named_too(*dir, name),
        Op::Rename { src_dir, src_name, dst_dir, dst_name, .. } => {
            let mut v = named_too(*src_dir, src_name);
            v.extend(named_too(*dst_dir, dst_name));
            v
        }
        Op::SetAttr { ino, .. }
        | Op::SetDirLayout { ino, .. }
        | Op::SetReadMostly { ino, .. }
        | Op::ExtendSize { ino, .. }
        | Op::SetXattr { ino, .. }
        | Op::RemoveXattr { ino, .. }
        | Op::Append { ino, .. }
        | Op::Write { ino, .. }
        | Op::WriteList { ino, .. } => vec![*ino],
        Op::Batch { ops } => {
            let mut v = Vec::new();
            for b in ops {
                match b {
                    BatchOp::Lookup { .. } | BatchOp::GetAttr { .. } => {}
                    BatchOp::Create { dir, .. } | BatchOp::Mkdir { dir, .. } | BatchOp::Symlink { dir, .. } => {
                        v.push(*dir)
                    }
                    BatchOp::Unlink { dir, name } | BatchOp::Rmdir { dir, name } => v.extend(named_too(*dir, name)),
                }
            }
            v
        }
        op if crate::client::reads_only(op) => return None,
        _ => return Some(None),
    };
    Some(Some(inos))
}
