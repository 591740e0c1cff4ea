//! The group's storage in its own RocksDB database (`<data_dir>/raft/`): the log, the vote,
//! the committed id, the state machine (the map document and the last applied id) and the
//! latest snapshot, under one-byte key prefixes.
//!
//! Durability: openraft may act on a vote or a log entry as soon as it was handed over
//! (grant a vote, acknowledge an append to the leader), so both are written with `sync`
//! before the call returns (the append's callback fires after the synced write). The state
//! machine is written without `sync`: after a crash it is rebuilt by applying the log again
//! from the last applied id that did reach the disk.

// openraft's storage traits fix the error type (`StorageError`, large by its design); our helpers
// return it as the traits do.
#![allow(clippy::result_large_err)]

use crate::doc::{self, ApplyResult, Command, MapDoc};
use crate::TypeConfig;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use rocksdb::{Direction, IteratorMode, WriteBatch, WriteOptions, DB};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;

type NodeId = u64;
type Node = openraft::EmptyNode;
type SErr = StorageError<NodeId>;

/// Log entries: `l` + index (big endian, so that keys sort by index).
const LOG: u8 = b'l';
/// The first key after every log key.
const LOG_END: [u8; 1] = [LOG + 1];
const VOTE: &[u8] = b"v";
const COMMITTED: &[u8] = b"c";
const PURGED: &[u8] = b"p";
const APPLIED: &[u8] = b"sa";
const MEMBERSHIP: &[u8] = b"sm";
/// The document, present once a `Replace` was applied (before that the map file the
/// server was started with is the document: see [`StateMachine::open`]).
const DOC: &[u8] = b"sd";
const SNAPSHOT: &[u8] = b"ss";

fn log_key(index: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = LOG;
    k[1..].copy_from_slice(&index.to_be_bytes());
    k
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Our own types and openraft's serialise without fail (no maps with non-string keys).
    rmp_serde::to_vec_named(v).expect("a Raft record serialises")
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, AnyError> {
    rmp_serde::from_slice(bytes).map_err(|e| AnyError::new(&e))
}

fn synced() -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(true);
    o
}

/// Open (or create) the group's database.
pub fn open_db(dir: &Path) -> anyhow::Result<Arc<DB>> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    // The group writes a few records per map change: small buffers, one log file.
    opts.set_write_buffer_size(1 << 20);
    opts.set_keep_log_file_num(2);
    DB::open(&opts, dir)
        .map(Arc::new)
        .map_err(|e| anyhow::anyhow!("cannot open the map group's store {}: {e}", dir.display()))
}

fn get<T: DeserializeOwned>(db: &DB, key: &[u8]) -> Result<Option<T>, AnyError> {
    match db.get(key).map_err(|e| AnyError::new(&e))? {
        Some(v) => decode(&v).map(Some),
        None => Ok(None),
    }
}

/// The log and the vote.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
}

impl LogStore {
    pub fn new(db: Arc<DB>) -> LogStore {
        LogStore { db }
    }

    fn put_synced(&self, key: &[u8], value: Vec<u8>) -> Result<(), rocksdb::Error> {
        self.db.put_opt(key, value, &synced())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        for item in self.db.iterator(IteratorMode::From(&log_key(start), Direction::Forward)) {
            let (k, v) = item.map_err(|e| StorageIOError::read_logs(AnyError::new(&e)))?;
            if k.first() != Some(&LOG) {
                break;
            }
            let index = u64::from_be_bytes(k[1..9].try_into().expect("log keys are 9 bytes"));
            if !range.contains(&index) {
                break;
            }
            out.push(decode(&v).map_err(|e| StorageIOError::read_log_at_index(index, e))?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let purged: Option<LogId<NodeId>> = get(&self.db, PURGED).map_err(StorageIOError::read_logs)?;
        let mut last = purged;
        if let Some(item) = self.db.iterator(IteratorMode::From(&LOG_END, Direction::Reverse)).next() {
            let (k, v) = item.map_err(|e| StorageIOError::read_logs(AnyError::new(&e)))?;
            if k.first() == Some(&LOG) {
                let e: Entry<TypeConfig> = decode(&v).map_err(StorageIOError::read_logs)?;
                last = Some(e.log_id);
            }
        }
        Ok(LogState { last_purged_log_id: purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SErr> {
        self.put_synced(VOTE, encode(vote)).map_err(|e| StorageIOError::write_vote(AnyError::new(&e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SErr> {
        get(&self.db, VOTE).map_err(|e| StorageIOError::read_vote(e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), SErr> {
        self.put_synced(COMMITTED, encode(&committed)).map_err(|e| StorageIOError::write(AnyError::new(&e)).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, SErr> {
        Ok(get::<Option<LogId<NodeId>>>(&self.db, COMMITTED).map_err(StorageIOError::read)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut batch = WriteBatch::default();
        for e in entries {
            batch.put(log_key(e.log_id.index), encode(&e));
        }
        // Synced before the callback: the entries are on disk when openraft is told so.
        let res = self.db.write_opt(batch, &synced());
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(AnyError::new(&e)).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let mut batch = WriteBatch::default();
        batch.delete_range(&log_key(log_id.index)[..], &LOG_END[..]);
        self.db.write_opt(batch, &synced()).map_err(|e| StorageIOError::write_logs(AnyError::new(&e)).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let mut batch = WriteBatch::default();
        // The purged id first in the same batch: the log never has a hole below it.
        batch.put(PURGED, encode(&log_id));
        batch.delete_range(&log_key(0)[..], &log_key(log_id.index + 1)[..]);
        self.db.write_opt(batch, &synced()).map_err(|e| StorageIOError::write_logs(AnyError::new(&e)).into())
    }
}

/// What the state machine holds in memory (and in the database under `s*`).
#[derive(Clone)]
struct Applied {
    last: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
    doc: Arc<MapDoc>,
    /// Whether `doc` came through the group (a `Replace` or a snapshot holding one) rather
    /// than from the map file this process was started with.
    replaced: bool,
}

/// The state machine: the map document.
pub struct StateMachine {
    db: Arc<DB>,
    state: Applied,
    tx: watch::Sender<Arc<MapDoc>>,
}

impl StateMachine {
    /// The state machine as last stored, and a receiver of every document it applies.
    ///
    /// Until the group applies its first `Replace`, the document is `initial` (the map file
    /// the server was started with): a cluster whose map never changed through the group
    /// behaves as before the group existed, restarts with an edited file included.
    pub fn open(db: Arc<DB>, initial: MapDoc) -> anyhow::Result<(StateMachine, watch::Receiver<Arc<MapDoc>>)> {
        let read = |k| -> anyhow::Result<_> { Ok(db.get(k)?) };
        let last = match read(APPLIED)? {
            Some(v) => decode(&v).map_err(|e| anyhow::anyhow!("the map group's applied id: {e}"))?,
            None => None,
        };
        let membership = match read(MEMBERSHIP)? {
            Some(v) => decode(&v).map_err(|e| anyhow::anyhow!("the map group's membership: {e}"))?,
            None => StoredMembership::default(),
        };
        let (doc, replaced) = match read(DOC)? {
            Some(v) => (decode::<MapDoc>(&v).map_err(|e| anyhow::anyhow!("the map group's document: {e}"))?, true),
            None => (initial, false),
        };
        let doc = Arc::new(doc);
        let (tx, rx) = watch::channel(doc.clone());
        Ok((StateMachine { db, state: Applied { last, membership, doc, replaced }, tx }, rx))
    }

    /// Store what is applied (not synced: the log is, see the module docs).
    fn persist(&self) -> Result<(), SErr> {
        let mut batch = WriteBatch::default();
        batch.put(APPLIED, encode(&self.state.last));
        batch.put(MEMBERSHIP, encode(&self.state.membership));
        if self.state.replaced {
            batch.put(DOC, encode(&*self.state.doc));
        }
        self.db.write(batch).map_err(|e| StorageIOError::write_state_machine(AnyError::new(&e)).into())
    }

    fn publish(&self, doc: Arc<MapDoc>) {
        // `send_replace`: the value is stored even while no one watches.
        self.tx.send_replace(doc);
    }
}

/// A snapshot's contents: the document if one came through the group.
type SnapshotBody = Option<MapDoc>;

/// Builds a snapshot of the state as it was when the builder was made.
pub struct Builder {
    db: Arc<DB>,
    state: Applied,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let body: SnapshotBody = self.state.replaced.then(|| (*self.state.doc).clone());
        let data = encode(&body);
        let id = match &self.state.last {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, self.state.doc.version),
            None => format!("0-0-{}", self.state.doc.version),
        };
        let meta = SnapshotMeta {
            last_log_id: self.state.last,
            last_membership: self.state.membership.clone(),
            snapshot_id: id,
        };
        self.db
            .put(SNAPSHOT, encode(&(&meta, &data)))
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e)))?;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, Node>), SErr> {
        Ok((self.state.last, self.state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let before = self.state.doc.clone();
        let mut out = Vec::new();
        for e in entries {
            self.state.last = Some(e.log_id);
            out.push(match e.payload {
                EntryPayload::Blank => ApplyResult::NotACommand,
                EntryPayload::Membership(m) => {
                    self.state.membership = StoredMembership::new(Some(e.log_id), m);
                    ApplyResult::NotACommand
                }
                EntryPayload::Normal(Command::Replace { expect_version, toml }) => {
                    match doc::replace(&self.state.doc, expect_version, &toml) {
                        Ok(new) => {
                            let version = new.version;
                            self.state.doc = Arc::new(new);
                            self.state.replaced = true;
                            ApplyResult::Applied { version }
                        }
                        Err(why) => why,
                    }
                }
            });
        }
        self.persist()?;
        if !Arc::ptr_eq(&before, &self.state.doc) {
            self.publish(self.state.doc.clone());
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Builder {
        Builder { db: self.db.clone(), state: self.state.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let data = snapshot.into_inner();
        let body: SnapshotBody = decode(&data).map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), e))?;
        self.state.last = meta.last_log_id;
        self.state.membership = meta.last_membership.clone();
        if let Some(doc) = body {
            self.state.doc = Arc::new(doc);
            self.state.replaced = true;
            self.publish(self.state.doc.clone());
        }
        self.persist()?;
        self.db
            .put(SNAPSHOT, encode(&(meta, &data)))
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e)).into())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        let stored: Option<(SnapshotMeta<NodeId, Node>, Vec<u8>)> =
            get(&self.db, SNAPSHOT).map_err(|e| StorageIOError::read_snapshot(None, e))?;
        Ok(stored.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}
