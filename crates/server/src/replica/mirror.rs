//! A mirror: the copy this server keeps of another server's (a slot's) stores, kept up to
//! date by the slot's primary (`Op::PeerReplicate`, shipped by `ship.rs`).
//!
//! Kept under `<data_dir>/mirror-<slot>/` with the layout of a server's own data directory
//! (`meta/`, `objects/`), so that the mirror can be served as the slot itself once the
//! primary is gone. Changes are applied one batch at a time, in position order; each
//! metadata batch is written together with the position it brings the mirror to
//! (`key::REPLICA`), so a mirror that restarts knows how far it got. A batch that does not
//! follow the last one applied (a gap: this mirror missed changes, or the primary restarted
//! under a new incarnation) is refused with `in_sync: false`; the primary then stops waiting
//! for this mirror and resynchronises it (`resync.rs`): while that runs the mirror's
//! position says [`RESYNCING`] (its stores are a mix of old and new, following no
//! incarnation), until the primary names the position its stores have reached.

use crate::error::{Fail, R};
use crate::replies::Replies;
use crate::store::data::DataStore;
use crate::store::meta::{key, MetaStore};
use bytes::Bytes;
use shoal_proto::msg::{ReplChange, Reply, ResyncAnswer, ResyncQuery};
use shoal_proto::{Errno, ServerId};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct Mirror {
    pub slot: ServerId,
    pub dir: PathBuf,
    pub meta: Arc<MetaStore>,
    pub data: Arc<DataStore>,
    /// The primary's replies, kept for retries after a failover.
    pub replies: Arc<Replies>,
    /// (incarnation, last position applied); one batch applies at a time.
    position: tokio::sync::Mutex<(u64, u64)>,
}

/// Where the mirror of `slot` lives under a server's data directory.
pub fn dir_of(data_dir: &Path, slot: ServerId) -> PathBuf {
    data_dir.join(format!("mirror-{}", slot.0))
}

/// The position of a mirror being resynchronised: incarnation 0, which no primary draws (they
/// are odd), so no batch follows it; applied not 0, so it is not taken for a fresh mirror.
pub const RESYNCING: (u64, u64) = (0, u64::MAX);

fn encode_position(incarnation: u64, applied: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&incarnation.to_be_bytes());
    b[8..].copy_from_slice(&applied.to_be_bytes());
    b
}

impl Mirror {
    /// Open (creating if needed) the mirror of `slot` under `data_dir`. Blocks.
    pub fn open(data_dir: &Path, slot: ServerId) -> R<Mirror> {
        let dir = dir_of(data_dir, slot);
        let meta = MetaStore::open(&dir.join("meta")).map_err(|e| Fail::new(Errno::EIO, e))?;
        // Marked as the slot's store, in the current format: the mirror can be served as
        // the slot itself (`shoald --id SLOT --data-dir <mirror dir>`).
        crate::store::upgrade::check_and_upgrade(&meta, slot, &dir)
            .map_err(|e| Fail::new(Errno::EIO, e.to_string()))?;
        let data = DataStore::open(&dir.join("objects"))
            .map_err(|e| Fail::io(format_args!("object directories under {}", dir.display()), &e))?;
        // The copy's bytes are cold: written around the page cache (`store/direct.rs`).
        data.set_direct_writes(true);
        Mirror::over(slot, dir, Arc::new(meta), Arc::new(data), Arc::new(Replies::new()))
    }

    /// A mirror of `slot` over stores already open (a server's own, while it stands by to
    /// take its slot back: `rejoin.rs`), at the position they record. Blocks.
    pub fn over(
        slot: ServerId,
        dir: PathBuf,
        meta: Arc<MetaStore>,
        data: Arc<DataStore>,
        replies: Arc<Replies>,
    ) -> R<Mirror> {
        let position = match meta.get_raw(key::REPLICA)? {
            Some(v) if v.len() == 16 => {
                (u64::from_be_bytes(v[..8].try_into().unwrap()), u64::from_be_bytes(v[8..].try_into().unwrap()))
            }
            _ => (0, 0),
        };
        Ok(Mirror { slot, dir, meta, data, replies, position: tokio::sync::Mutex::new(position) })
    }

    /// The stores and the kept replies, to serve the slot from this copy (`failover.rs`).
    pub fn into_parts(self) -> (PathBuf, Arc<MetaStore>, Arc<DataStore>, Arc<Replies>) {
        // Served now: its writes are hot again.
        self.data.set_direct_writes(false);
        (self.dir, self.meta, self.data, self.replies)
    }

    /// (incarnation, last position applied).
    pub async fn position(&self) -> (u64, u64) {
        *self.position.lock().await
    }

    /// Apply `changes` (positions `first ..`) of the primary's `incarnation`, their bytes in
    /// `data` one after the other. Object changes run on a blocking thread.
    pub async fn apply(
        self: &Arc<Self>,
        incarnation: u64,
        first: u64,
        changes: Vec<ReplChange>,
        data: Bytes,
    ) -> R<Reply> {
        let mut pos = self.position.lock().await;
        let (inc, applied) = *pos;
        // A fresh mirror follows the first incarnation that starts at position 1; any other
        // change of incarnation, or a gap, means changes were missed.
        let fresh = inc == 0 && applied == 0 && first == 1;
        if !(fresh || inc == incarnation && first <= applied + 1) {
            return Ok(Reply::Replicated { incarnation: inc, applied, in_sync: false });
        }
        let need: usize = changes.iter().map(ReplChange::data_len).sum();
        if need != data.len() {
            return Err(Fail::new(
                Errno::EINVAL,
                format!("replication batch carries {} bytes for changes of {need}", data.len()),
            ));
        }
        // Changes already applied (a batch resent after a lost reply) are skipped.
        let skip = (applied + 1).saturating_sub(first) as usize;
        let last = first + changes.len() as u64 - 1;
        let done = if changes.iter().all(|c| matches!(c, ReplChange::Meta { .. } | ReplChange::Reply { .. })) {
            // Metadata only: RocksDB writes to its log buffer and memtable, which the primary
            // does on its async threads too (`State::store`); a hop to a blocking thread
            // would cost more than the write (two thread switches per batch, most of the
            // mirror's CPU per create: docs/benchmarks.md).
            self.apply_blocking(incarnation, first, skip, changes, data)
        } else {
            // Object writes wait on files.
            let me = self.clone();
            tokio::task::spawn_blocking(move || me.apply_blocking(incarnation, first, skip, changes, data))
                .await
                .map_err(|e| Fail::new(Errno::EIO, format!("replication task failed: {e}")))?
        };
        match done {
            Ok(()) => {
                *pos = (incarnation, last.max(applied));
                Ok(Reply::Replicated { incarnation, applied: pos.1, in_sync: true })
            }
            Err((upto, f)) => {
                // What was applied stays applied; the primary resends the rest.
                *pos = (incarnation, upto);
                Err(f)
            }
        }
    }

    fn apply_blocking(
        &self,
        incarnation: u64,
        first: u64,
        skip: usize,
        changes: Vec<ReplChange>,
        data: Bytes,
    ) -> Result<(), (u64, Fail)> {
        let mut at = 0usize;
        let mut upto = first.saturating_sub(1) + skip as u64;
        let last = (first + changes.len() as u64).saturating_sub(1);
        // The store must know the position it holds after a restart of this mirror (or of
        // its primary after a clean stop), so that it follows on without a resync. Each
        // metadata batch is written with a position: the batch's last one when only
        // cached replies follow it (they live in memory and die with the process anyway);
        // if object changes follow it, or there is none, the position is written after.
        let last_meta = changes.iter().rposition(|c| matches!(c, ReplChange::Meta { .. })).filter(|&k| k >= skip);
        let tail_from = last_meta.map_or(skip, |k| k + 1).min(changes.len());
        let tail_objects = changes[tail_from..].iter().any(|c| !matches!(c, ReplChange::Reply { .. }));
        for (k, change) in changes.into_iter().enumerate() {
            let bytes = data.slice(at..at + change.data_len());
            at += change.data_len();
            if k < skip {
                continue;
            }
            let position = first + k as u64;
            let recorded = if Some(k) == last_meta && !tail_objects { last } else { position };
            if let Err(f) = self.apply_one(change, &bytes, &encode_position(incarnation, recorded)) {
                return Err((upto, f));
            }
            upto = position;
        }
        if (last_meta.is_none() || tail_objects) && upto >= first + skip as u64 {
            // Object bytes written survive this process's death, as the store does.
            self.meta.put_raw(key::REPLICA, &encode_position(incarnation, upto)).map_err(|f| (upto, f))?;
        }
        // Applied changes survive this process's death too (one write of the log buffer).
        self.meta.flush_wal_to_os().map_err(|f| (upto, f))
    }

    /// Apply one change; a metadata batch is written together with `position`.
    fn apply_one(&self, change: ReplChange, bytes: &[u8], position: &[u8]) -> R<()> {
        match change {
            ReplChange::Meta { .. } => self.meta.apply_replicated(bytes, position),
            // An object this copy keeps only the mark of stays so (the store refuses it): bytes
            // written into it would read as zeros around them (`replica/thin.rs`). A cut to
            // nothing clears the mark.
            ReplChange::Write { ino, index, offset, .. } => {
                self.data.write(ino, index, offset, bytes, 1).or_else(|f| self.unless_unkept(ino, index, f))
            }
            ReplChange::Truncate { ino, index, len, .. } => {
                self.data.truncate(ino, index, len, 1).or_else(|f| self.unless_unkept(ino, index, f))
            }
            ReplChange::Delete { objects } => self.data.delete_objects(&objects),
            ReplChange::Unkept { ino, index } => self.data.mark_unkept(ino, index),
            ReplChange::Reply { session, request, reply } => {
                self.replies.keep(session, request, *reply);
                Ok(())
            }
        }
    }

    /// A change of an object that failed: done all the same if this copy keeps only the
    /// object's mark (nothing to apply), else the failure.
    fn unless_unkept(&self, ino: shoal_proto::Ino, index: u32, f: Fail) -> R<()> {
        if self.data.is_unkept(ino, index) {
            Ok(())
        } else {
            Err(f)
        }
    }

    /// Apply changes a resync sends (`Op::PeerResyncApply`), outside any incarnation: the
    /// position says [`RESYNCING`] first (durably, before any store changes), so a mirror
    /// that restarts half-way is known to hold a mix.
    pub async fn resync_apply(self: &Arc<Self>, changes: Vec<ReplChange>, data: Bytes) -> R<()> {
        let mut pos = self.position.lock().await;
        let need: usize = changes.iter().map(ReplChange::data_len).sum();
        if need != data.len() {
            return Err(Fail::new(
                Errno::EINVAL,
                format!("resync batch carries {} bytes for changes of {need}", data.len()),
            ));
        }
        let me = self.clone();
        let mark = *pos != RESYNCING;
        tokio::task::spawn_blocking(move || -> R<()> {
            let resyncing = encode_position(RESYNCING.0, RESYNCING.1);
            if mark {
                me.meta.put_raw(key::REPLICA, &resyncing)?;
                me.meta.flush_wal_to_os()?;
            }
            let mut at = 0usize;
            for change in changes {
                let n = change.data_len();
                me.apply_one(change, &data[at..at + n], &resyncing)?;
                at += n;
            }
            me.meta.flush_wal_to_os()
        })
        .await
        .map_err(|e| Fail::new(Errno::EIO, format!("resync task failed: {e}")))??;
        *pos = RESYNCING;
        Ok(())
    }

    /// The resync is over: the stores hold everything up to `applied` of `incarnation`
    /// (`Op::PeerResyncDone`); batches from `applied + 1` on follow.
    pub async fn resync_done(self: &Arc<Self>, incarnation: u64, applied: u64) -> R<Reply> {
        let mut pos = self.position.lock().await;
        let me = self.clone();
        tokio::task::spawn_blocking(move || -> R<()> {
            me.meta.put_raw(key::REPLICA, &encode_position(incarnation, applied))?;
            me.meta.flush_wal_to_os()
        })
        .await
        .map_err(|e| Fail::new(Errno::EIO, format!("resync task failed: {e}")))??;
        *pos = (incarnation, applied);
        tracing::info!(
            "mirror of server {}: resynchronised up to position {applied} of incarnation {incarnation:x}",
            self.slot
        );
        Ok(Reply::Replicated { incarnation, applied, in_sync: true })
    }

    /// Answer a primary's question about this copy (`Op::PeerResyncQuery`).
    pub async fn resync_query(self: &Arc<Self>, query: ResyncQuery) -> R<Reply> {
        let me = self.clone();
        let answer = tokio::task::spawn_blocking(move || -> R<ResyncAnswer> {
            Ok(match query {
                ResyncQuery::Keys { after, limit } => {
                    let (keys, more) = super::digest::keys(&me.meta, after.as_deref(), limit.clamp(1, 65536))?;
                    ResyncAnswer::Keys { keys, more }
                }
                ResyncQuery::Objects { bucket } => ResyncAnswer::Objects {
                    objects: super::digest::objects(&me.data, bucket)?
                        .into_iter()
                        .map(|(ino, index, digest, _)| (ino, index, digest))
                        .collect(),
                },
                ResyncQuery::Blocks { ino, index } => ResyncAnswer::Blocks { blocks: me.data.block_sums(ino, index)? },
            })
        })
        .await
        .map_err(|e| Fail::new(Errno::EIO, format!("resync task failed: {e}")))??;
        Ok(Reply::Resync(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::Ino;

    fn meta_batch(key: &[u8]) -> Bytes {
        let mut b = rocksdb::WriteBatch::default();
        b.put(key, b"v");
        Bytes::copy_from_slice(b.data())
    }

    /// The position a reopened mirror reports: the one its stores hold, whatever kind of
    /// change ended the last batch (a restart of the mirror, or of its primary after a
    /// clean stop, then follows on without a resync).
    #[tokio::test]
    async fn a_reopened_mirror_knows_the_position_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let slot = ServerId(7);
        let inc = 0x1234_5679;
        let reopen = |m: Arc<Mirror>| {
            drop(Arc::try_unwrap(m).ok().expect("no other holder"));
            Arc::new(Mirror::open(dir.path(), slot).unwrap())
        };
        let m = Arc::new(Mirror::open(dir.path(), slot).unwrap());
        // A batch ending with an object write (after its metadata).
        let (meta, data) = (meta_batch(b"ka"), Bytes::from_static(b"0123456789"));
        let changes = vec![
            ReplChange::Meta { len: meta.len() as u32 },
            ReplChange::Write { ino: Ino(9), index: 0, offset: 0, len: data.len() as u32, copies: 1 },
        ];
        let both = [meta.as_ref(), data.as_ref()].concat();
        m.apply(inc, 1, changes, Bytes::from(both)).await.unwrap();
        let m = reopen(m);
        assert_eq!(m.position().await, (inc, 2));
        // A batch ending with a cached reply after its metadata.
        let meta = meta_batch(b"kb");
        let changes = vec![
            ReplChange::Meta { len: meta.len() as u32 },
            ReplChange::Reply { session: 1, request: 2, reply: Box::new(Reply::Ok) },
        ];
        m.apply(inc, 3, changes, meta).await.unwrap();
        let m = reopen(m);
        assert_eq!(m.position().await, (inc, 4));
        // A batch of object changes only.
        let changes = vec![ReplChange::Truncate { ino: Ino(9), index: 0, len: 4, copies: 1 }];
        m.apply(inc, 5, changes, Bytes::new()).await.unwrap();
        let m = reopen(m);
        assert_eq!(m.position().await, (inc, 5));
        // The probe a primary sends at start changes nothing.
        m.apply(inc, 1, Vec::new(), Bytes::new()).await.unwrap();
        assert_eq!(reopen(m).position().await, (inc, 5));
    }

    /// A mark (an object of a file of fewer copies, `thin.rs`) drops the copy's bytes; later
    /// writes and cuts of the object apply as nothing, in order, so the copy never holds
    /// part of it; a cut to nothing clears the mark.
    #[tokio::test]
    async fn a_marked_object_takes_no_bytes_until_cut_to_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let m = Arc::new(Mirror::open(dir.path(), ServerId(3)).unwrap());
        let inc = 0x51;
        let (ino, data) = (Ino(9), Bytes::from_static(b"0123456789"));
        let write = |offset| ReplChange::Write { ino, index: 0, offset, len: data.len() as u32, copies: 2 };
        m.apply(inc, 1, vec![write(0)], data.clone()).await.unwrap();
        let changes = vec![
            ReplChange::Unkept { ino, index: 0 },
            write(100),
            ReplChange::Truncate { ino, index: 0, len: 5, copies: 1 },
        ];
        let reply = m.apply(inc, 2, changes, data.clone()).await.unwrap();
        assert_eq!(reply, Reply::Replicated { incarnation: inc, applied: 4, in_sync: true });
        assert!(m.data.is_unkept(ino, 0) && !m.data.path(ino, 0).exists());
        assert_eq!(m.data.read(ino, 0, 0, 10).unwrap_err().errno, Errno::EIO);
        let changes = vec![ReplChange::Truncate { ino, index: 0, len: 0, copies: 1 }, write(0)];
        m.apply(inc, 5, changes, data.clone()).await.unwrap();
        assert_eq!(&m.data.read(ino, 0, 0, 10).unwrap()[..], b"0123456789");
    }
}
