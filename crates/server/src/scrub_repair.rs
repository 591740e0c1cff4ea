//! `shoal scrub` repairs: damage the scrub finds in one copy of a slot's objects is
//! rewritten from another copy that verifies (docs/scrub.md, "Repair").
//!
//! With `[cluster] replicas >= 2` every slot's objects exist on its primary and on its
//! mirrors (`replica/`). A server scrubs both what it serves and the mirrors it keeps:
//!
//! * **Its own slot.** A block that fails its checksum is fetched from a mirror in sync
//!   (`Op::PeerScrubRead`), after the replication log is acknowledged up to its last
//!   change: the mirror then holds every change made to that block before it was found
//!   damaged. An object whose data file is gone or shorter than the mirror's copy gets its
//!   missing bytes from the mirror the same way, compared under the object's lock (no change
//!   to it can be appended meanwhile, so after the acknowledgement both copies must agree).
//!   The good bytes go back through the data store, which ships them to the mirrors as any
//!   write.
//! * **A mirror it keeps.** A damaged block, or a data file gone, is fetched from the slot's
//!   primary. The primary may be ahead of the mirror; its newer bytes are still right: the
//!   changes the mirror has yet to apply rewrite those bytes again in order, and end where
//!   the primary is.
//!
//! **Never from a bad copy**: the answering server reads through its data store, which
//! verifies every block against its checksum and refuses a damaged one (`EIO`).
//! **Never over a newer write**: a damaged block is replaced only if, under the object's
//! exclusive lock, it still fails its checksum (a client write covering the whole block
//! made it good meanwhile; a partial write into a damaged block fails and changes nothing),
//! and a missing object only while its data file is still missing.
//!
//! **No cycle of locks.** A primary holds its object's lock while it asks a mirror for the
//! object's size or bytes, and a mirror holds its copy's lock while it asks the primary:
//! when both scrubs meet on one object, each would wait for the other's lock. A mirror's
//! copy is therefore read without waiting for its lock (`EAGAIN` when busy, retried a few
//! times): the primary then gives up that comparison for this scrub and lets go.
//!
//! Everything here blocks: it runs on the scrub thread, which drives the peer calls through
//! the server's runtime.

use crate::dispatch::Payload;
use crate::error::{fail, R};
use crate::replica::log::MirrorState;
use crate::state::State;
use crate::store::checksums::BLOCK;
use crate::store::data::DataStore;
use bytes::Bytes;
use shoal_proto::msg::{Cred, Op, Reply};
use shoal_proto::{Errno, Ino, ServerId};
use std::sync::Arc;
use std::time::Duration;

/// Most bytes one `PeerScrubRead` answers (a missing object is copied in pieces this big).
pub const READ_MAX: u32 = 1 << 20;
/// Attempts at reading a copy whose object is busy, and the pause between them.
const BUSY_TRIES: u32 = 10;
const BUSY_PAUSE: Duration = Duration::from_millis(50);
/// How long a repair waits for a peer's answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a primary waits for its mirrors to acknowledge its log before it compares or
/// copies (a mirror that stalls is given up on after `OUT_OF_SYNC_AFTER`, well below).
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// `PeerScrubRead`: the size and verified bytes of an object in this server's copy of
/// `slot` (its own stores, or its mirror of `slot`).
pub async fn serve_read(
    st: &Arc<State>,
    slot: ServerId,
    ino: Ino,
    index: u32,
    offset: u64,
    len: u32,
) -> R<(Reply, Payload)> {
    if len > READ_MAX {
        return fail(Errno::EINVAL, format!("a scrub read of {len} bytes (at most {READ_MAX})"));
    }
    let mirror = if slot == st.id {
        None
    } else {
        match st.replica.mirror(slot) {
            Some(m) => Some(m),
            None => return fail(Errno::ENOENT, format!("server {} keeps no copy of server {slot}", st.id)),
        }
    };
    let st2 = st.clone();
    let got = tokio::task::spawn_blocking(move || {
        let store = match &mirror {
            Some(m) => &m.data,
            None => &st2.data,
        };
        store.read_copy(ino, index, offset, len as usize, mirror.is_none())
    })
    .await
    .map_err(|e| crate::error::Fail::new(Errno::EIO, format!("scrub read task failed: {e}")))??;
    Ok(match got {
        Some((size, bytes)) => (Reply::ScrubRead { exists: true, size }, Payload::Bytes(bytes)),
        None => (Reply::ScrubRead { exists: false, size: 0 }, Payload::none()),
    })
}

/// What became of a damaged block or a missing object.
pub enum Outcome {
    /// Rewritten from the copy on that server (`bytes` written).
    Repaired { from: ServerId, bytes: u64 },
    /// Gone by itself before the repair: rewritten whole by a client, cut or deleted.
    Settled,
}

/// The repairs of one scrub run, on the scrub thread.
pub struct Repairer<'a> {
    st: &'a State,
    rt: tokio::runtime::Handle,
}

impl<'a> Repairer<'a> {
    pub fn new(st: &'a State, rt: tokio::runtime::Handle) -> Repairer<'a> {
        Repairer { st, rt }
    }

    /// Up to `len` verified bytes at `offset` of the object in `from`'s copy of `slot`, and
    /// the object's size there; `None` if that copy has no such object.
    fn fetch(
        &self,
        from: ServerId,
        slot: ServerId,
        ino: Ino,
        index: u32,
        offset: u64,
        len: u32,
    ) -> Result<Option<(u64, Bytes)>, String> {
        let root = Cred::root();
        for attempt in 1.. {
            let op = Op::PeerScrubRead { slot, ino, index, offset, len };
            let call = self.st.pool.request(from, &root, op, Bytes::new());
            // The timer is made inside `block_on`, where the runtime's context is.
            let busy = match self.rt.block_on(async { tokio::time::timeout(CALL_TIMEOUT, call).await }) {
                Err(_) => return Err(format!("server {from} did not answer within {CALL_TIMEOUT:?}")),
                Ok(Err(e)) if e.errno() == Errno::EAGAIN => e.to_string(),
                Ok(Err(e)) => return Err(format!("server {from}: {e}")),
                Ok(Ok((Reply::ScrubRead { exists: true, size }, data))) => return Ok(Some((size, data))),
                Ok(Ok((Reply::ScrubRead { exists: false, .. }, _))) => return Ok(None),
                Ok(Ok((Reply::Error { errno: Errno::EAGAIN, message }, _))) => message,
                Ok(Ok((Reply::Error { message, .. }, _))) => return Err(format!("server {from}: {message}")),
                Ok(Ok((other, _))) => return Err(format!("server {from} answered {other:?}")),
            };
            if attempt >= BUSY_TRIES {
                return Err(format!("server {from}: {busy}"));
            }
            std::thread::sleep(BUSY_PAUSE);
        }
        unreachable!("the loop returns")
    }

    /// The servers holding another copy of `slot`: its mirrors in sync when it is this
    /// server's own (after waiting until they acknowledge everything logged so far), else
    /// the slot's primary. `Err` says why there is none.
    fn sources(&self, slot: ServerId) -> Result<Vec<ServerId>, String> {
        if slot != self.st.id {
            return Ok(vec![slot]);
        }
        let Some(log) = &self.st.replica.log else {
            return Err("no other copy to repair from (the cluster keeps one copy: replicas = 1)".into());
        };
        let last = log.last();
        if !matches!(
            self.rt.block_on(async { tokio::time::timeout(ACK_TIMEOUT, log.wait_acked(last)).await }),
            Ok(true)
        ) {
            return Err(format!("the mirrors did not acknowledge this server's changes within {ACK_TIMEOUT:?}"));
        }
        let in_sync: Vec<ServerId> =
            log.mirrors().into_iter().filter(|(_, p)| p.state == MirrorState::InSync).map(|(m, _)| m).collect();
        if in_sync.is_empty() {
            return Err("no mirror in sync to repair from (they need a resync first)".into());
        }
        Ok(in_sync)
    }

    /// Rewrite the damaged block at `offset` of object `index` of `ino` in `store` (this
    /// server's copy of `slot`) from a good copy elsewhere.
    pub fn repair_block(
        &self,
        store: &DataStore,
        slot: ServerId,
        ino: Ino,
        index: u32,
        offset: u64,
    ) -> Result<Outcome, String> {
        let mut why = Vec::new();
        for from in self.sources(slot)? {
            let good = match self.fetch(from, slot, ino, index, offset, BLOCK as u32) {
                Ok(Some((_, bytes))) => bytes,
                Ok(None) => {
                    why.push(format!("server {from} holds no such object"));
                    continue;
                }
                Err(e) => {
                    why.push(e);
                    continue;
                }
            };
            let held = store.lock_for_repair(ino, index);
            let fail = |f: crate::error::Fail| format!("writing the good copy from server {from}: {f}");
            match held.block_is_good(offset).map_err(fail)? {
                None | Some(true) => return Ok(Outcome::Settled),
                Some(false) => {}
            }
            // The block must be replaced whole (a partial write into a damaged block is
            // refused): beyond the end of the good copy, an object reads as zeros.
            let mut block = good.to_vec();
            let len = held.block_len(offset).map_err(fail)? as usize;
            if block.len() < len {
                block.resize(len, 0);
            }
            held.write(offset, &block).map_err(fail)?;
            return Ok(Outcome::Repaired { from, bytes: block.len() as u64 });
        }
        Err(why.join("; "))
    }

    /// Give an object of `store` (this server's copy of `slot`) the bytes it lacks: a data
    /// file gone (`lost`: only its checksum file is left), or, on the slot's own primary,
    /// a data file shorter than the mirror's copy. `Ok(None)`: nothing is missing.
    pub fn restore(
        &self,
        store: &DataStore,
        slot: ServerId,
        ino: Ino,
        index: u32,
        lost: bool,
    ) -> Result<Option<Outcome>, String> {
        let held = store.lock_for_repair(ino, index);
        let ours = held.size().map_err(|f| f.to_string())?;
        match ours {
            // Deleted meanwhile, or rewritten by a client since it was listed.
            None if !lost || !held.has_sums() => return Ok(None),
            Some(_) if lost => return Ok(None),
            _ => {}
        }
        // A mirror may lag behind its primary: only the primary compares sizes (under the
        // lock, after the acknowledgement, both copies must agree).
        if !lost && slot != self.st.id {
            return Ok(None);
        }
        let have = ours.unwrap_or(0);
        // A lost data file is damage whatever the copies say; a size that cannot be compared
        // (no copy reachable) is not.
        let mut missing = lost;
        let sources = match self.sources(slot) {
            Ok(s) => s,
            Err(e) if lost => return Err(e),
            Err(_) => return Ok(None),
        };
        let mut why = Vec::new();
        for from in sources {
            let size = match self.fetch(from, slot, ino, index, 0, 0) {
                Ok(Some((size, _))) => size,
                Ok(None) if !lost => return Ok(None), // the copy lacks it: not ours to fix here
                Ok(None) => {
                    why.push(format!("server {from} holds no such object"));
                    continue;
                }
                Err(e) => {
                    why.push(e);
                    continue;
                }
            };
            if size <= have {
                return Ok(None);
            }
            missing = true;
            // From the block the short file ends in: its checksum covers bytes now gone.
            match self.copy_range(&held, from, slot, ino, index, have / BLOCK * BLOCK, size) {
                Ok(bytes) => return Ok(Some(Outcome::Repaired { from, bytes })),
                Err(e) => why.push(e),
            }
        }
        if missing {
            Err(why.join("; "))
        } else {
            Ok(None)
        }
    }

    /// Copy `[start, end)` of the object from `from`'s copy into the held one, piece by
    /// piece; holes (all-zero pieces but the last, which sets the size) are left holes.
    #[allow(clippy::too_many_arguments)]
    fn copy_range(
        &self,
        held: &crate::store::data::RepairLock<'_>,
        from: ServerId,
        slot: ServerId,
        ino: Ino,
        index: u32,
        start: u64,
        end: u64,
    ) -> Result<u64, String> {
        let mut at = start;
        while at < end {
            let len = (end - at).min(READ_MAX as u64) as u32;
            let bytes = match self.fetch(from, slot, ino, index, at, len)? {
                Some((_, b)) if b.len() == len as usize => b,
                _ => return Err(format!("server {from}'s copy changed while it was copied")),
            };
            let last = at + len as u64 >= end;
            if last || bytes.iter().any(|&b| b != 0) {
                held.write(at, &bytes).map_err(|f| format!("writing the copy from server {from}: {f}"))?;
            }
            at += len as u64;
        }
        Ok(end - start)
    }
}
