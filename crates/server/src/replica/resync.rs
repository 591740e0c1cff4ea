//! Resync: bringing a mirror that fell out of sync back into step with its primary without
//! copying the whole slot (docs/resync.md).
//!
//! Run by the primary's shipper (`ship.rs`) once a mirror is out of sync (it stalled, was
//! restarted, or the primary restarted under a new incarnation):
//!
//! 1. The mirror becomes `Resyncing` from `p0` = the next position of the log
//!    ([`ReplLog::start_resync`]): replies stop waiting for it, but the log keeps every change
//!    from `p0` on for it.
//! 2. Its stores are compared with the primary's and every difference is shipped
//!    (`Op::PeerResyncApply`): metadata key by key (value hashes, a page of keys at a time;
//!    keys the primary lacks are deleted), data object by object (a digest per object, then
//!    the CRC32C of each 64 KiB block of the objects whose digests differ; only differing
//!    blocks travel; objects the primary lacks are deleted). What is read on the primary is
//!    read as it is at that moment, so the copy holds everything up to `p0 - 1` and maybe
//!    some later changes.
//! 3. The mirror is told it holds position `p0 - 1` (`Op::PeerResyncDone`) and the shipper
//!    ships the log from `p0` on. Every change is absolute (a batch of puts and deletes, bytes
//!    at an offset, a cut, a deletion), so replaying in order the changes the copy may
//!    already hold leaves the stores as the primary's. Once the mirror has applied the last
//!    position it is `InSync` again ([`ReplLog::ack`]).
//!
//! Shipping is throttled with one request in flight, so that the foreground I/O of both
//! servers keeps most of its speed: at most [`RESYNC_MIB_PER_S`] MiB/s by default
//! (`shoald --resync-mb-s`), and at most [`RESYNC_BUSY_MIB_PER_S`] while a client read or
//! wrote file data on this server within the last [`BUSY_WINDOW`]
//! (`shoald --resync-busy-mb-s`): recovery yields to clients, and runs at full speed when
//! they are quiet. A resync that fails (the mirror
//! went away, an error) leaves the mirror out of sync; the shipper starts over later, and
//! the comparison makes the second attempt cheap for what the first already copied.

use super::digest::{self, KEYS_PER_PAGE};
use super::log::ReplLog;
use crate::error::{Fail, R};
use crate::state::State;
use crate::store::checksums::BLOCK;
use bytes::{Bytes, BytesMut};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use rocksdb::WriteBatch;
use shoal_proto::msg::{Cred, Op, ReplChange, Reply, ResyncAnswer, ResyncQuery};
use shoal_proto::{Errno, Ino, ServerId};
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most MiB per second a resync ships to one mirror (metadata values and data blocks)
/// unless `shoald --resync-mb-s` says otherwise.
pub const RESYNC_MIB_PER_S: u32 = 32;

/// Most MiB per second a resync ships to one mirror while clients read or write file data
/// on this server, unless `shoald --resync-busy-mb-s` says otherwise. A join on this
/// 2-core machine kept io-easy above 0.7× its quiet rate at 8 MiB/s and not reliably at 32
/// (docs/benchmarks.md, "A server joins").
pub const RESYNC_BUSY_MIB_PER_S: u32 = 8;

/// A client data request this recent makes the resync ship at its busy rate.
pub const BUSY_WINDOW: Duration = Duration::from_secs(1);

/// Bytes of changes gathered before one `PeerResyncApply` goes.
const APPLY_MAX_BYTES: usize = 4 << 20;

/// How long an answer from the mirror may take (comparing a bucket of large objects reads
/// their checksums).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// The `copies` of the writes and cuts a resync sends: they go straight to the mirror, never
/// through the shipper's thinning (the comparison decides what the mirror keeps), so the
/// count is not read; the most there is.
const RESYNC_COPIES: u8 = shoal_proto::msg::REPLICAS_MAX;

/// The throttle's unit: rates in KiB keep the bucket within `u32`.
const UNIT: u64 = 1024;

/// A token bucket of `mib_s` MiB per second, counted in [`UNIT`]s.
struct Bucket {
    limiter: DefaultDirectRateLimiter,
    /// A tenth of a second's worth: a larger burst would let a resync starting on an idle
    /// server take the disk from requests arriving right after.
    burst: u32,
}

impl Bucket {
    fn new(mib_s: u32) -> Bucket {
        let per_s = u32::try_from((u64::from(mib_s) << 20) / UNIT).unwrap_or(u32::MAX);
        let burst = (per_s / 10).max(1);
        let quota = Quota::per_second(NonZeroU32::new(per_s).unwrap_or(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
        Bucket { limiter: RateLimiter::direct(quota), burst }
    }

    /// Wait until `units` (at most the burst) may go.
    async fn wait(&self, units: u32) {
        // Within the bucket's size, so this only waits.
        let n = units.clamp(1, self.burst);
        let _ = self.limiter.until_n_ready(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)).await;
    }
}

/// Resync `mirror` of this server's slot. On success the mirror holds everything up to the
/// returned position (and is `Resyncing` in `log`, to be shipped the rest); on failure it is
/// left for the caller to mark out of sync.
pub async fn run(st: &Arc<State>, log: &ReplLog, mirror: ServerId) -> R<u64> {
    let before = log.start_resync(mirror);
    // The stores are compared, but the cached replies live in memory: they follow the
    // resync through the log, so that a copy promoted (or a server taking its slot back)
    // answers a retry of a request applied before the resync instead of applying it again.
    let replies = st.replies.snapshot();
    let kept = replies.len();
    for (session, request, reply) in replies {
        log.append(ReplChange::Reply { session, request, reply: Box::new(reply) }, Bytes::new());
    }
    let started = Instant::now();
    tracing::info!(
        "resyncing mirror {mirror} of server {} (from position {} of incarnation {:x}, with {kept} cached replies)",
        st.id,
        before + 1,
        log.incarnation
    );
    let total = st.blocking(|st| Ok(slot_bytes(st))).await?;
    let mut r = Resync::new(st, log, mirror, total);
    log.resync_progress(mirror, 0, total, 0);
    r.metadata().await?;
    r.objects().await?;
    r.send().await?;
    match r.call(Op::PeerResyncDone { slot: st.id, incarnation: log.incarnation, applied: before }).await? {
        Reply::Replicated { in_sync: true, .. } => {}
        other => return Err(Fail::new(Errno::EIO, format!("mirror {mirror} answered PeerResyncDone with {other:?}"))),
    }
    log.resync_progress(mirror, total, total, 0);
    tracing::info!(
        "mirror {mirror} of server {}: stores resynchronised in {:.1?} ({} of {} bytes shipped); shipping the log \
         from position {}",
        st.id,
        started.elapsed(),
        r.shipped,
        total,
        before + 1
    );
    Ok(before)
}

/// What the slot holds: its metadata's live size and its objects' sizes (the resync's
/// progress goes to this).
fn slot_bytes(st: &State) -> u64 {
    let meta = st.meta.property("rocksdb.estimate-live-data-size").unwrap_or(0);
    let data: u64 = st
        .data
        .list()
        .into_iter()
        .filter_map(|(ino, index)| std::fs::metadata(st.data.path(ino, index)).ok())
        .map(|m| m.len())
        .sum();
    meta + data
}

struct Resync<'a> {
    st: &'a Arc<State>,
    log: &'a ReplLog,
    mirror: ServerId,
    /// The throttle at the full rate, and at the busy rate (waited for too while clients
    /// are active); each with its burst in units, the most one wait may ask for.
    limiter: Bucket,
    busy_limiter: Bucket,
    /// Changes gathered for the next `PeerResyncApply`, and their bytes.
    changes: Vec<ReplChange>,
    data: Vec<Bytes>,
    pending: usize,
    /// The mirror's changes are thinned by the shipper (`thin::rank_of`): a mark of an
    /// object there is this primary's doing, not a copy to fill.
    thinned: bool,
    /// Bytes compared so far, of `total`; bytes shipped.
    done: u64,
    total: u64,
    shipped: u64,
}

impl<'a> Resync<'a> {
    fn new(st: &'a Arc<State>, log: &'a ReplLog, mirror: ServerId, total: u64) -> Resync<'a> {
        let options = st.failover.options.get();
        let mib_s = options.map_or(RESYNC_MIB_PER_S, |o| o.resync_mib_s).max(1);
        let busy_mib_s = options.map_or(RESYNC_BUSY_MIB_PER_S, |o| o.resync_busy_mib_s).clamp(1, mib_s);
        Resync {
            st,
            log,
            mirror,
            limiter: Bucket::new(mib_s),
            busy_limiter: Bucket::new(busy_mib_s),
            changes: Vec::new(),
            data: Vec::new(),
            pending: 0,
            thinned: super::thin::rank_of(st, mirror).is_some(),
            done: 0,
            total,
            shipped: 0,
        }
    }

    /// Ask the mirror (bounded by [`ANSWER_WITHIN`]).
    async fn call_with(&self, op: Op, payload: Bytes) -> R<Reply> {
        let root = Cred::root();
        let asked = crate::rejoin::pool_to(self.st, self.mirror).request(self.mirror, &root, op, payload);
        match tokio::time::timeout(ANSWER_WITHIN, asked).await {
            Ok(Ok((reply, _))) => Ok(reply),
            Ok(Err(e)) => Err(Fail::new(e.errno(), format!("mirror {}: {e}", self.mirror))),
            Err(_) => Err(Fail::new(
                Errno::ETIMEDOUT,
                format!("mirror {} did not answer within {ANSWER_WITHIN:?}", self.mirror),
            )),
        }
    }

    async fn call(&self, op: Op) -> R<Reply> {
        self.call_with(op, Bytes::new()).await
    }

    async fn query(&self, query: ResyncQuery) -> R<ResyncAnswer> {
        match self.call(Op::PeerResyncQuery { slot: self.st.id, query }).await? {
            Reply::Resync(a) => Ok(a),
            other => {
                Err(Fail::new(Errno::EIO, format!("mirror {} answered PeerResyncQuery with {other:?}", self.mirror)))
            }
        }
    }

    /// Gather a change for the mirror; sends once enough is gathered.
    async fn push(&mut self, change: ReplChange, data: Bytes) -> R<()> {
        self.pending += data.len();
        self.changes.push(change);
        self.data.push(data);
        if self.pending >= APPLY_MAX_BYTES {
            self.send().await?;
        }
        Ok(())
    }

    /// Send what was gathered, once the throttle lets its bytes through.
    async fn send(&mut self) -> R<()> {
        if self.changes.is_empty() {
            return Ok(());
        }
        // A burst at a time, judging each anew whether clients are active: a long wait at the
        // busy rate ends soon after they stop.
        let mut units = (self.pending as u64).div_ceil(UNIT);
        let chunk = self.limiter.burst.min(self.busy_limiter.burst);
        while units > 0 {
            let n = units.min(u64::from(chunk)) as u32;
            self.limiter.wait(n).await;
            if self.st.load.client_data_within(BUSY_WINDOW) {
                self.busy_limiter.wait(n).await;
            }
            units -= u64::from(n);
        }
        let mut payload = BytesMut::with_capacity(self.pending);
        for d in self.data.drain(..) {
            payload.extend_from_slice(&d);
        }
        let changes = std::mem::take(&mut self.changes);
        let sent = std::mem::take(&mut self.pending) as u64;
        match self.call_with(Op::PeerResyncApply { slot: self.st.id, changes }, payload.freeze()).await? {
            Reply::Ok => {}
            other => {
                return Err(Fail::new(
                    Errno::EIO,
                    format!("mirror {} answered PeerResyncApply with {other:?}", self.mirror),
                ))
            }
        }
        self.shipped += sent;
        self.log.resync_progress(self.mirror, self.done.min(self.total), self.total, sent);
        Ok(())
    }

    /// Count `n` more bytes compared.
    fn compared(&mut self, n: u64) {
        self.done += n;
        self.log.resync_progress(self.mirror, self.done.min(self.total), self.total, 0);
    }

    /// Compare the metadata key spaces a page of the mirror's keys at a time: every key of
    /// the primary in the page's range that the mirror lacks or holds with another value is
    /// put, every key of the mirror the primary lacks is deleted.
    async fn metadata(&mut self) -> R<()> {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let (theirs, more) =
                match self.query(ResyncQuery::Keys { after: after.clone(), limit: KEYS_PER_PAGE }).await? {
                    ResyncAnswer::Keys { keys, more } => (keys, more),
                    other => return Err(unexpected(self.mirror, &other)),
                };
            // The page covers (after, its last key]; the last page everything beyond.
            let upto = if more { theirs.last().map(|(k, _)| k.clone()) } else { None };
            let mut theirs: BTreeMap<Vec<u8>, u64> = theirs.into_iter().collect();
            let mut from = after.clone();
            loop {
                let (a, u) = (from.clone(), upto.clone());
                let (ours, exhausted) = self
                    .st
                    .blocking(move |st| digest::pairs(&st.meta, a.as_deref(), u.as_deref(), APPLY_MAX_BYTES))
                    .await?;
                let mut batch = WriteBatch::default();
                for (k, v) in &ours {
                    self.done += (k.len() + v.len()) as u64;
                    if theirs.remove(k) != Some(digest::value_hash(v)) {
                        batch.put(k, v);
                    }
                }
                self.ship_batch(batch).await?;
                self.compared(0);
                if exhausted {
                    break;
                }
                from = ours.last().map(|(k, _)| k.clone());
            }
            // What is left of the mirror's page, the primary does not have.
            if !theirs.is_empty() {
                let mut batch = WriteBatch::default();
                for k in theirs.keys() {
                    batch.delete(k);
                }
                self.ship_batch(batch).await?;
            }
            if !more {
                return Ok(());
            }
            after = upto;
        }
    }

    async fn ship_batch(&mut self, batch: WriteBatch) -> R<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let b = Bytes::copy_from_slice(batch.data());
        self.push(ReplChange::Meta { len: b.len() as u32 }, b).await
    }

    /// Compare the objects bucket by bucket, then the blocks of those that differ.
    async fn objects(&mut self) -> R<()> {
        for bucket in 0..=255u8 {
            let theirs: HashMap<(Ino, u32), u64> = match self.query(ResyncQuery::Objects { bucket }).await? {
                ResyncAnswer::Objects { objects } => objects.into_iter().map(|(i, x, d)| ((i, x), d)).collect(),
                other => return Err(unexpected(self.mirror, &other)),
            };
            let ours = self.st.blocking(move |st| digest::objects(&st.data, bucket)).await?;
            let mut gone: Vec<(Ino, u32)> =
                theirs.keys().filter(|k| ours.binary_search_by(|o| (o.0, o.1).cmp(k)).is_err()).copied().collect();
            for (ino, index, ours_digest, size) in ours {
                let their_digest = theirs.get(&(ino, index)).copied();
                match (ours_digest == digest::UNKEPT, their_digest) {
                    // The same, or both hold only the mark.
                    (_, Some(d)) if d == ours_digest => {}
                    // This copy keeps no bytes of it: the mirror keeps what it holds (the
                    // slot's own server taking its slot back holds the one copy), and one
                    // that holds nothing gets the mark, not zeros (`thin.rs`).
                    (true, Some(_)) => {}
                    (true, None) => self.push(ReplChange::Unkept { ino, index }, Bytes::new()).await?,
                    // The mirror holds only the mark: left so where the shipper thins this
                    // mirror's changes (it made the mark), replaced by the bytes where the
                    // mirror must hold every object (the slot's destination, its own server).
                    (false, Some(digest::UNKEPT)) if self.thinned => {}
                    (false, Some(digest::UNKEPT)) => {
                        self.push(ReplChange::Delete { objects: vec![(ino, index)] }, Bytes::new()).await?;
                        self.object(ino, index, false).await?;
                    }
                    (false, theirs) => self.object(ino, index, theirs.is_some()).await?,
                }
                self.compared(size);
            }
            if !gone.is_empty() {
                gone.sort();
                self.push(ReplChange::Delete { objects: gone }, Bytes::new()).await?;
            }
        }
        Ok(())
    }

    /// Ship the blocks of one object that differ on the mirror (it has one if `theirs`).
    async fn object(&mut self, ino: Ino, index: u32, theirs: bool) -> R<()> {
        let (their_size, their_crcs) = if theirs {
            match self.query(ResyncQuery::Blocks { ino, index }).await? {
                ResyncAnswer::Blocks { blocks } => blocks.unwrap_or_default(),
                other => return Err(unexpected(self.mirror, &other)),
            }
        } else {
            (0, Vec::new())
        };
        let Some((size, crcs)) = self.st.blocking(move |st| st.data.block_sums(ino, index)).await? else {
            // Deleted since it was listed: the log carries the deletion.
            return Ok(());
        };
        if their_size > size {
            self.push(ReplChange::Truncate { ino, index, len: size, copies: RESYNC_COPIES }, Bytes::new()).await?;
        }
        for (k, crc) in crcs.iter().enumerate() {
            // A block the mirror has the same (its last block compared as cut: a block
            // short of the primary's is padded with zeros in both checksums).
            let same = their_crcs.get(k) == Some(crc) && (their_size >= size || (k as u64 + 1) * BLOCK <= their_size);
            if same {
                continue;
            }
            let offset = k as u64 * BLOCK;
            let bytes = self.st.blocking(move |st| st.data.read(ino, index, offset, BLOCK as usize)).await?;
            if bytes.is_empty() {
                break;
            }
            let len = bytes.len() as u32;
            self.push(ReplChange::Write { ino, index, offset, len, copies: RESYNC_COPIES }, bytes).await?;
        }
        Ok(())
    }
}

fn unexpected(mirror: ServerId, answer: &ResyncAnswer) -> Fail {
    Fail::new(Errno::EIO, format!("mirror {mirror} answered a resync question with {answer:?}"))
}
