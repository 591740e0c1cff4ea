//! What a running server shares between its connections and background tasks.

use crate::counters::Counters;
use crate::error::{fail, Fail, R};
use crate::locks::Locks;
use crate::store::data::DataStore;
use crate::store::meta::{GcRecord, InodeRecord, MetaStore};
use crate::store::space::Space;
use bytes::Bytes;
use parking_lot::Mutex;
use shoal_placement::rendezvous::mix64;
use shoal_placement::ClusterMap;
use shoal_proto::msg::{Attr, Cred, FileKind, Op, Reply};
use shoal_proto::{Errno, Ino, ServerId, ROOT_INO};
use shoal_rpc::Pool;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Contents counted for `Status`/`StatFs`, cached briefly because counting walks everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct Contents {
    pub inodes: u64,
    pub entries: u64,
    pub objects: u64,
    pub intents: u64,
}

pub struct State {
    pub id: ServerId,
    /// The newest cluster map (replaced when the replicated map changes: `membership.rs`).
    pub map: crate::map_cell::MapCell,
    /// This server's member of the replicated map's group (set once at start).
    pub membership: std::sync::OnceLock<shoal_membership::MapGroup>,
    pub data_dir: PathBuf,
    /// Shared (`Arc`) with the mirror of this slot while the server stands by to take its
    /// slot back after a failover (`rejoin.rs`): the mirror path writes into these stores.
    pub meta: Arc<MetaStore>,
    pub data: Arc<DataStore>,
    /// Free space on the data directory's disk: what is refused when it is nearly full.
    pub space: Space,
    pub locks: Locks,
    /// The cluster's directory-move lock, used when this server is the root's home.
    pub move_lock: crate::steps::move_lock::MoveLock,
    /// Op ids of cross-server operations some task is driving right now; the recovery loop
    /// leaves their intents alone.
    active: Arc<Mutex<HashSet<u64>>>,
    /// Connections to the other servers, as root.
    pub pool: Pool,
    pub counters: Counters,
    /// Latencies, errors by errno, requests in flight (`metrics.rs`, `GET /metrics`).
    pub metrics: crate::metrics::Metrics,
    pub started: Instant,
    pub contents: Mutex<Option<(Instant, Contents)>>,
    /// Deleted files whose objects the gc task is to delete (their `g` records are already
    /// committed; see `intents::gc_loop`), and its wake-up.
    gc_queue: Mutex<Vec<(Ino, GcRecord)>>,
    gc_wake: tokio::sync::Notify,
    /// Round-robin counter of `next_dir_home`.
    dir_turn: AtomicU64,
    /// Client sessions connected here: whose orphans may be reclaimed (`orphans.rs`).
    pub sessions: crate::orphans::Sessions,
    /// The cluster key ring (`[security] cluster_key`); `None` when the map says
    /// `auth = "none"`. What servers prove to each other and key capabilities with.
    /// Replaced whole by [`State::reload_keys`] (SIGHUP), so a rotation needs no restart.
    keys: parking_lot::RwLock<Option<Arc<shoal_auth::KeyRing>>>,
    /// Replies of state-changing requests by (session, request id): a retry is applied once.
    pub replies: Arc<crate::replies::Replies>,
    /// The background verification of this server's objects and records (`scrub.rs`).
    pub scrub: crate::scrub::Scrub,
    /// The partitions of split directories held here (`partitions.rs`).
    pub parts: crate::partitions::Partitions,
    /// This server's load, the others' as heard, and the throttle (`load.rs`).
    pub load: crate::load::Load,
    /// Its replication log and the mirrors it keeps (`replica/`).
    pub replica: crate::replica::Replication,
    /// Failover (`failover.rs`): for a slot served from a mirror copy, the server whose
    /// process serves it; the slots this process serves that way; how it was started (to
    /// start those the same way).
    pub failover: crate::failover::Failover,
    /// Standing by to take this server's slot back after a failover, and handing a slot
    /// served here back to its own server (`rejoin.rs`).
    pub rejoin: crate::rejoin::Rejoin,
    /// New requests held while the slot changes hands (`quiesce.rs`).
    pub quiesce: crate::quiesce::Quiesce,
    /// Set to a reason when this server must stop serving (its slot failed over while it
    /// was away, or its host process stops): the accept loop ends on it.
    pub stop: tokio::sync::watch::Sender<Option<String>>,
    /// Files whose size is committed smaller while their objects are still to be cut
    /// (`ops/truncate.rs`): nothing extends them until the cut is done.
    pub cuts: crate::ops::truncate::PendingCuts,
    /// The tuple space's lock and change signal (`ops/tuples.rs`).
    pub tuples: crate::ops::tuples::TupleSpace,
}

/// Times a peer call answered "stale map" is sent again, each after waiting up to
/// [`PEER_STALE_WAIT`] for this server's map to move on.
const PEER_STALE_TRIES: u32 = 5;
const PEER_STALE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Marks an op id as driven by the holder; dropping releases it to the recovery loop.
pub struct ActiveOp {
    set: Arc<Mutex<HashSet<u64>>>,
    op_id: u64,
}

impl Drop for ActiveOp {
    fn drop(&mut self) {
        self.set.lock().remove(&self.op_id);
    }
}

/// A second op id derived from `op_id` for a sub-step (so that each step's "applied"
/// marker and intent key is distinct, and the same after a restart).
pub fn derive_op(op_id: u64, step: u64) -> u64 {
    mix64(op_id ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1
}

impl State {
    // Every part of a server's state, each made by `Server::open`: a struct of them would
    // only restate this list.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: ServerId,
        map: ClusterMap,
        data_dir: PathBuf,
        meta: Arc<MetaStore>,
        data: Arc<DataStore>,
        space: Space,
        pool: Pool,
        keys: Option<shoal_auth::KeyRing>,
    ) -> State {
        State {
            id,
            map: crate::map_cell::MapCell::new(map),
            membership: std::sync::OnceLock::new(),
            data_dir,
            meta,
            data,
            space,
            locks: Locks::new(),
            move_lock: Default::default(),
            active: Arc::new(Mutex::new(HashSet::new())),
            pool,
            counters: Counters::new(),
            metrics: crate::metrics::Metrics::new(),
            started: Instant::now(),
            contents: Mutex::new(None),
            gc_queue: Mutex::new(Vec::new()),
            gc_wake: tokio::sync::Notify::new(),
            dir_turn: AtomicU64::new(0),
            sessions: crate::orphans::Sessions::new(),
            keys: parking_lot::RwLock::new(keys.map(Arc::new)),
            replies: Arc::new(crate::replies::Replies::new()),
            scrub: Default::default(),
            parts: Default::default(),
            load: crate::load::Load::new(id, None),
            replica: Default::default(),
            failover: Default::default(),
            rejoin: Default::default(),
            quiesce: Default::default(),
            stop: tokio::sync::watch::channel(None).0,
            cuts: Default::default(),
            tuples: Default::default(),
        }
    }

    /// Stop serving, for `reason` (said once in the log and by `serve`).
    pub fn stop_serving(&self, reason: String) {
        self.stop.send_if_modified(|r| {
            if r.is_some() {
                return false;
            }
            tracing::error!("server {}: {reason}", self.id);
            *r = Some(reason);
            true
        });
    }

    /// Hand a deleted file's objects to the gc task (after the commit that wrote its `g`
    /// record). Deletions are batched: one request per server for many files.
    pub fn queue_gc(&self, ino: Ino, rec: GcRecord) {
        self.gc_queue.lock().push((ino, rec));
        self.gc_wake.notify_one();
    }

    /// Wait until deletions are queued.
    pub async fn wait_for_gc(&self) {
        while self.gc_queue.lock().is_empty() {
            self.gc_wake.notified().await;
        }
    }

    /// Take every queued deletion.
    pub fn take_gc_batch(&self) -> Vec<(Ino, GcRecord)> {
        std::mem::take(&mut *self.gc_queue.lock())
    }

    /// Run a metadata step in place, on the async thread that handles the request.
    ///
    /// Why not `spawn_blocking`: a metadata step touches RocksDB's memtable and appends to
    /// its WAL buffer (see `MetaStore`: the WAL reaches the OS once per burst of replies,
    /// not per commit), a few microseconds of work. Handing it to the blocking pool cost
    /// two thread wake-ups per request and halved create and stat rates in `shoal bench md`
    /// (measured: 15k → 31k creates/s with 16 in flight, 4 servers on 2 cores). Work that
    /// waits on files (data objects, fsync, full scans) still goes through [`State::blocking`].
    pub async fn store<T, F>(self: &Arc<Self>, f: F) -> R<T>
    where
        F: FnOnce(&State) -> R<T>,
    {
        f(self)
    }

    /// Run blocking work (file I/O, fsync, full scans of the store) off the async threads.
    pub async fn blocking<T, F>(self: &Arc<Self>, f: F) -> R<T>
    where
        T: Send + 'static,
        F: FnOnce(&State) -> R<T> + Send + 'static,
    {
        let st = self.clone();
        // Commits made there count for the request being handled (store::commits).
        let ticket = crate::store::commits::current();
        // And the revocations of directory leases they start (leases.rs).
        let leases = crate::leases::current();
        let run = move || crate::leases::on_thread(leases, || crate::store::commits::on_thread(ticket, || f(&st)));
        match tokio::task::spawn_blocking(run).await {
            Ok(r) => r,
            Err(e) => fail(Errno::EIO, format!("internal error in a storage task: {e}")),
        }
    }

    pub fn home(&self, ino: Ino) -> ServerId {
        self.map.home_of(ino)
    }

    pub fn is_home(&self, ino: Ino) -> bool {
        self.home(ino) == self.id
    }

    /// ESTALE unless this server is the home of `ino` (the sender's map disagrees with ours).
    pub fn require_home(&self, ino: Ino) -> R<()> {
        let home = self.home(ino);
        if home == self.id {
            Ok(())
        } else {
            fail(Errno::ESTALE, format!("inode {ino} belongs to server {home}, not {}", self.id))
        }
    }

    /// The cluster key ring as it is now (`None` under `auth = "none"`). Callers keep the
    /// `Arc` for one exchange, so a reload never changes keys in the middle of one.
    pub fn key_ring(&self) -> Option<Arc<shoal_auth::KeyRing>> {
        self.keys.read().clone()
    }

    /// Read the cluster key file again (after `shoal keygen --rotate` or `--retire`): new
    /// epochs sign from now on, epochs still in the file keep verifying. A file that does not
    /// load leaves the current ring in place (the error says why). Returns the epochs held.
    pub fn reload_keys(&self) -> anyhow::Result<Vec<u32>> {
        if self.keys.read().is_none() {
            anyhow::bail!("authentication is off (auth = \"none\"): no keys to reload");
        }
        let ring = shoal_auth::KeyRing::load(&self.map.security.cluster_key, shoal_auth::KeyKind::Cluster)?;
        let epochs = ring.epochs();
        *self.keys.write() = Some(Arc::new(ring));
        Ok(epochs)
    }

    pub fn new_op_id(&self) -> u64 {
        // Random and nonzero: op ids only need to be unique per cluster.
        rand::random::<u64>() | 1
    }

    /// Claim `op_id` for the calling task; `None` if another task drives it.
    pub fn activate(&self, op_id: u64) -> Option<ActiveOp> {
        if self.active.lock().insert(op_id) {
            Some(ActiveOp { set: self.active.clone(), op_id })
        } else {
            None
        }
    }

    /// A fresh inode number homed on `home`: nonzero, not the root, unused here. Files get
    /// one homed here (they sit with their entry); directories one homed on the server
    /// [`State::next_dir_home`] picks. Random candidates are drawn until one ranks `home`
    /// first (about as many draws as there are servers).
    pub fn alloc_ino(&self, home: ServerId) -> R<Ino> {
        for _ in 0..100_000 {
            let n: u64 = rand::random();
            if n <= ROOT_INO.0 {
                continue;
            }
            let ino = Ino(n);
            if self.home(ino) != home {
                continue;
            }
            if home == self.id && self.meta.get_inode(ino)?.is_some() {
                continue;
            }
            return Ok(ino);
        }
        fail(Errno::EIO, format!("no inode number homed on {home} found (is it marked out in the map?)"))
    }

    /// The server a new subdirectory of `parent` goes to: the placeable servers in map order,
    /// round-robin from a start that depends on the parent. Consecutive directories (the
    /// per-rank directories of a job, a tree being unpacked) land on different servers, so
    /// their entries and creates spread evenly; random placement put two ranks' directories
    /// on the same server a quarter of the time with 4 servers. Weights are not used here:
    /// they steer data, and a directory's own metadata is small.
    pub fn next_dir_home(&self, parent: Ino) -> ServerId {
        let ring: Vec<ServerId> = self.map.placeable().map(|s| s.server_id()).collect();
        if ring.is_empty() {
            return self.id;
        }
        let turn = self.dir_turn.fetch_add(1, Ordering::Relaxed);
        ring[shoal_placement::dir_ring_pos(parent, turn, ring.len())]
    }

    /// Attributes as replies carry them. For a file whose objects all live here, the
    /// allocated size is summed from the object files (`du`); otherwise it is unknown (0).
    /// Blocking when `with_blocks`.
    pub fn attr_of(&self, ino: Ino, rec: &InodeRecord, with_blocks: bool) -> Attr {
        let mut blocks = 0;
        if with_blocks && rec.kind == FileKind::File {
            if let Some(l) = &rec.layout {
                if l.servers.iter().all(|&s| s == self.id) {
                    blocks = self.data.allocated(ino, 0..l.servers.len() as u32);
                }
            }
        }
        let mut attr = rec.to_attr(ino, blocks);
        // A split directory's subdirectories are counted by no single server: report the
        // "unknown" link count 1, as file systems do that cannot count them (`find` then
        // makes no leaf assumption).
        if rec.kind == FileKind::Dir && self.parts.is_split(ino) {
            attr.nlink = 1;
        }
        attr
    }

    /// Hand the reply of client request (`session`, `request`) to the mirrors, which keep it
    /// after the changes it reports (a retry after a failover is answered, not applied
    /// again).
    pub fn ship_reply(&self, session: u64, request: u64, reply: &shoal_proto::msg::Reply) {
        if let Some(log) = &self.replica.log {
            if !matches!(reply, shoal_proto::msg::Reply::StaleMap { .. }) {
                let change = shoal_proto::msg::ReplChange::Reply { session, request, reply: Box::new(reply.clone()) };
                log.append(change, Bytes::new());
            }
        }
    }

    /// Keep `reply` as the answer to client request (`session`, `request`), here and on the
    /// mirrors: recovery finished what the request started (`intents.rs`).
    pub fn keep_reply(&self, session: u64, request: u64, reply: shoal_proto::msg::Reply) {
        self.ship_reply(session, request, &reply);
        self.replies.keep(session, request, reply);
    }

    /// Send a peer operation as root. A step addressed to this server itself runs in place.
    pub async fn peer(self: &Arc<Self>, server: ServerId, op: Op) -> Result<Reply, Errno> {
        self.peer_as(server, &Cred::root(), op).await
    }

    /// Send a peer operation on behalf of `cred` (the target checks permissions with it).
    pub async fn peer_as(self: &Arc<Self>, server: ServerId, cred: &Cred, op: Op) -> Result<Reply, Errno> {
        if server == self.id {
            let req = shoal_proto::msg::Request { cred: cred.clone(), map_version: 0, op };
            let (reply, _) = crate::dispatch::handle_boxed(self.clone(), req, Bytes::new(), true).await;
            return match reply {
                Reply::Error { errno, .. } => Err(errno),
                other => Ok(other),
            };
        }
        // What this step follows from must survive our death before another server acts on
        // it (see MetaStore::flush_wal_to_os).
        if let Err(e) = self.meta.flush_wal_to_os() {
            tracing::error!("cannot write the metadata log before a step on server {server}: {e}");
            return Err(e.errno);
        }
        // ... and so must it survive ours: held by every mirror in sync.
        if !self.replica.settle(crate::store::commits::current().map_or(0, |t| t.state().replicated)).await {
            return Err(shoal_proto::Errno::EIO);
        }
        self.counters.peer_sent();
        self.peer_call(server, cred, op, Bytes::new()).await
    }

    /// Send a `Write` of `data` to another server (an append's pieces on objects held
    /// elsewhere, see `ops::data::append`). Unlike [`State::peer_as`] it does not write the
    /// metadata log out first: what the peer does (store bytes) depends on no metadata of
    /// ours, and the append publishes its size only after every piece is acknowledged.
    pub async fn peer_write(self: &Arc<Self>, server: ServerId, op: Op, data: Bytes) -> Result<Reply, Errno> {
        self.counters.peer_sent();
        self.peer_call(server, &Cred::root(), op, data).await
    }

    /// One call to another server. Callers act on the errno alone, so a failure of the
    /// connection itself (unreachable, timed out, or refused during the handshake: a key
    /// that does not verify) is logged here with its reason, which the errno cannot carry.
    async fn peer_call(&self, server: ServerId, cred: &Cred, op: Op, data: Bytes) -> Result<Reply, Errno> {
        let name = op.name();
        let mut stale = 0;
        loop {
            let seen = self.map.version();
            let r = self.pool.request(server, cred, op.clone(), data.clone()).await;
            // The peer routes by a newer map than this server's (a failover or a handback
            // just changed it): that map is on its way here through the group; wait for it
            // and send again (the target is a slot, the same under either map).
            if matches!(&r, Err(shoal_rpc::CallError::Server { errno: Errno::ESTALE, .. })) && stale < PEER_STALE_TRIES
            {
                stale += 1;
                self.map.wait_for(seen + 1, PEER_STALE_WAIT).await;
                continue;
            }
            return self.peer_outcome(server, name, r);
        }
    }

    fn peer_outcome(
        &self,
        server: ServerId,
        name: &str,
        r: Result<(Reply, Bytes), shoal_rpc::CallError>,
    ) -> Result<Reply, Errno> {
        match r {
            Ok((reply, _)) => Ok(reply),
            Err(e) => {
                // A refused handshake is a configuration fault worth a warning; an
                // unreachable peer is reported by whoever waits on it.
                if let shoal_rpc::CallError::Transport { errno, .. } = &e {
                    if matches!(*errno, Errno::EACCES | Errno::EPERM) {
                        tracing::warn!("{name} to server {server}: {e}");
                    } else {
                        tracing::debug!("{name} to server {server}: {e}");
                    }
                }
                Err(e.errno())
            }
        }
    }

    /// Attributes of any inode: from the local store or from its home server.
    pub async fn getattr(self: &Arc<Self>, ino: Ino) -> R<Attr> {
        if self.is_home(ino) {
            return self
                .store(move |st| match st.meta.get_inode(ino)? {
                    Some(r) => Ok(r.to_attr(ino, 0)),
                    None => fail(Errno::ENOENT, format!("inode {ino} does not exist")),
                })
                .await;
        }
        let home = self.home(ino);
        match self.peer(home, Op::GetAttr { ino }).await {
            Ok(Reply::Attr(a)) => Ok(a),
            Ok(other) => fail(Errno::EIO, format!("server {home} answered GetAttr with {other:?}")),
            Err(e) => Err(Fail::peer(home, e)),
        }
    }
}
