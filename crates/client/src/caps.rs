//! Per-open capabilities on the client side (docs/security.md, "Capabilities").
//!
//! An open regular file's handle holds the capability the inode's home server gave it (in
//! the reply to `Create` or `Open`) and sends it with every `Read`, `Write`, `Append` and
//! `Fsync`. It is renewed transparently: before it is due (three quarters of its lifetime
//! after it arrived, measured on this host's clock, so clock skew between hosts does not
//! matter), and once more when a server refuses it as expired or made with a retired key
//! epoch, after which the operation is retried. A handle therefore never sees an error
//! from capabilities as long as the user still may open the file, however long it is kept.
//!
//! A cluster configured with `auth = "none"` makes no capabilities; neither does a server
//! that does not know `Open` (it answers ENOSYS): the handle then sends none.

use crate::client::{unexpected, Client, To};
use crate::error::{Error, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use shoal_placement::map::AuthMode;
use shoal_proto::cap::{is_renewable, Capability};
use shoal_proto::msg::{Attr, Op, Reply};
use shoal_proto::{Errno, Ino};
use std::collections::VecDeque;
use std::future::Future;
use std::time::{Duration, Instant};

/// Capabilities from `Create` replies kept for the `File::open` that usually follows
/// (a FUSE create, `Client::create`): a few, newest last, each taken once.
const STASH_LEN: usize = 64;

/// Capabilities that arrived with a create and wait for their handle.
#[derive(Default)]
pub(crate) struct Stash {
    recent: Mutex<VecDeque<(Capability, Instant)>>,
}

impl Stash {
    pub(crate) fn put(&self, cap: Capability) {
        let mut r = self.recent.lock();
        if r.len() == STASH_LEN {
            r.pop_front();
        }
        r.push_back((cap, Instant::now()));
    }

    /// The newest stashed capability of `ino` allowing `rights`, removed from the stash.
    pub(crate) fn take(&self, ino: Ino, rights: u8) -> Option<(Capability, Instant)> {
        let mut r = self.recent.lock();
        let i = r.iter().rposition(|(c, _)| c.ino == ino && c.allows(rights))?;
        r.remove(i)
    }
}

#[derive(Clone)]
enum Slot {
    /// None yet: ask the home server at the first operation that needs one.
    Unknown,
    /// The cluster makes none (auth = "none", or a server without `Open`).
    Unneeded,
    Have(Capability, Instant),
}

/// The capability of one open file (shared by the clones of a handle).
pub(crate) struct Holder {
    ino: Ino,
    /// `cap::RIGHT_*` the handle was opened with.
    rights: u8,
    slot: Mutex<Slot>,
}

/// Whether a capability that arrived at `got` is still good to send without renewing:
/// within the first three quarters of its lifetime.
fn fresh(cap: &Capability, got: Instant) -> bool {
    got.elapsed() < Duration::from_millis(cap.lifetime_secs().saturating_mul(750))
}

impl Holder {
    /// The holder of a new handle, starting with `cap` if the open brought one.
    pub(crate) fn new(client: &Client, ino: Ino, rights: u8, cap: Option<(Capability, Instant)>) -> Holder {
        let slot = match cap {
            Some((c, at)) => Slot::Have(c, at),
            None if client.map().security.auth == AuthMode::None => Slot::Unneeded,
            None => Slot::Unknown,
        };
        Holder { ino, rights, slot: Mutex::new(slot) }
    }

    /// The capability to send now (renewed first if due); `None` when none is needed.
    pub(crate) async fn get(&self, client: &Client) -> Result<Option<Capability>> {
        match self.slot.lock().clone() {
            Slot::Unneeded => return Ok(None),
            Slot::Have(c, at) if fresh(&c, at) => return Ok(Some(c)),
            _ => {}
        }
        self.renew(client, None).await
    }

    /// Get a new capability from the inode's home, unless another task already replaced
    /// `stale` (or, with `None`, unless the one held is fresh by now).
    ///
    /// No lock is held across the request: the pieces of a read or write run in futures
    /// that may be polled once and then left until their caller needs them (readahead,
    /// write-behind), and one of them holding a lock would stall the others. Concurrent
    /// renewals therefore each send an `Open` (harmless, and rare: the handle's reads and
    /// writes call [`Holder::get`] before they split into pieces, so the pieces find a
    /// fresh capability).
    async fn renew(&self, client: &Client, stale: Option<&Capability>) -> Result<Option<Capability>> {
        let old = match self.slot.lock().clone() {
            Slot::Unneeded => return Ok(None),
            Slot::Have(c, at) if stale.map_or(fresh(&c, at), |s| *s != c) => return Ok(Some(c)),
            Slot::Have(c, _) => Some(c),
            Slot::Unknown => None,
        };
        let got = Instant::now();
        let (slot, cap) = match client.open_rpc(self.ino, self.rights, old).await? {
            Some((_, Some(c))) => (Slot::Have(c.clone(), got), Some(c)),
            Some((_, None)) | None => (Slot::Unneeded, None),
        };
        *self.slot.lock() = slot;
        Ok(cap)
    }

    /// Run `op` with the capability to send; if a server refuses it as one that only needs
    /// renewing (expired, retired key epoch), renew it and run `op` once more.
    pub(crate) async fn with<T, F, Fut>(&self, client: &Client, op: F) -> Result<T>
    where
        F: Fn(Option<Capability>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let cap = self.get(client).await?;
        match op(cap.clone()).await {
            Err(e) if e.errno == Errno::EACCES && is_renewable(&e.detail) && cap.is_some() => {
                let cap = self.renew(client, cap.as_ref()).await?;
                op(cap).await
            }
            r => r,
        }
    }
}

impl Client {
    /// `Op::Open` at the home of `ino`: fresh attributes and a capability with `rights`
    /// (`renew`: the one held, which spares the permission check). `None` if the server
    /// does not know `Open` (then no server checks capabilities either).
    pub(crate) async fn open_rpc(
        &self,
        ino: Ino,
        rights: u8,
        renew: Option<Capability>,
    ) -> Result<Option<(Attr, Option<Capability>)>> {
        let now = Instant::now();
        match self.call(To::Home(ino), Op::Open { ino, rights, renew }, Bytes::new()).await {
            Ok((Reply::Opened { attr, cap }, _)) => {
                if attr.ino != ino || cap.as_ref().is_some_and(|c| c.ino != ino) {
                    return Err(Error::new(Errno::EPROTO, "open reply names another inode"));
                }
                self.cache().put_attr(&attr, now);
                Ok(Some((attr, cap)))
            }
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) if e.errno == Errno::ENOSYS => Ok(None),
            Err(e) => Err(e),
        }
    }
}
