//! [`Client`]: the connection pool, the cache, and the inode-level operations (each one
//! request to the server placement names, plus cache upkeep). Path-level operations are in
//! `path_ops.rs`, file I/O in `file.rs`.

use crate::attr_leases::AttrLeases;
use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::leases::{Fetch, Learnt, LeaseCache};
use crate::listing::{Page, Start};
use crate::open_files::{new_session, OpenFiles};
use crate::options::ClientOptions;
use crate::partitions::{too_many_redirects, Bitmaps, MAX_TRIES};
use crate::stat_ahead::{StatAhead, AHEAD_MAX, RENEW_WITHIN, SCAN_MAX};
use bytes::Bytes;
use futures::StreamExt;
use parking_lot::{Mutex, RwLock};
use shoal_placement::{ClusterMap, MapError, ServerState};
use shoal_proto::lease::{LeasedReply, Notice};
use shoal_proto::msg::{
    Attr, BatchOp, BatchReply, DirEntry, EntryOut, FileKind, LayoutSpec, Op, RenameFlags, Reply, ServerStatus,
    SetAttrs, BATCH_MAX, READDIR_MAX,
};
use shoal_proto::{Errno, Ino, ServerId};
use shoal_rpc::{CallError, Pool, PoolOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// State shared by a client and its clones (and by clients made with `with_cred`).
struct Shared {
    /// The connections; it follows each newer map (`Pool::set_map`).
    pool: Arc<Pool>,
    /// Every map this client has used, newest last. Append-only so that [`Client::map`]
    /// can hand out plain references.
    maps: Mutex<Vec<Arc<ClusterMap>>>,
    /// The config file the map came from (for reloading), if any.
    config: Option<PathBuf>,
    /// One reload at a time.
    reload: tokio::sync::Mutex<()>,
    /// Map fetches finished (`refresh_map`): a caller that waited for another's fetch uses
    /// its result instead of asking again.
    map_fetches: std::sync::atomic::AtomicU64,
    cache: Cache,
    /// This client instance's session id, sent in every connection's handshake: servers
    /// keep the files it removed while open for as long as it stays connected.
    session: u64,
    open_files: OpenFiles,
    /// Capabilities from `Create` replies, for the handle opened next (`caps.rs`).
    cap_stash: crate::caps::Stash,
    /// Directory leases held (`leases.rs`).
    leases: Arc<LeaseCache>,
    /// Partition bitmaps of split directories (`partitions.rs`).
    bitmaps: Bitmaps,
    /// Attribute leases held (`attr_leases.rs`).
    attr_leases: Arc<AttrLeases>,
    /// Runs of attribute asks per directory (`stat_ahead.rs`).
    stat_ahead: StatAhead,
    /// Told of every revocation before it is acknowledged (a FUSE mount drops what the
    /// kernel caches): [`Client::on_revoke`].
    on_revoke: RwLock<Option<RevokeHook>>,
}

/// What a revocation (or a lost connection) took away: leases on the entries of these
/// directories and on the attributes of these inodes. Handed to a [`Client::on_revoke`]
/// hook before the revocation is acknowledged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revoked {
    /// Directories whose entry leases went.
    pub dirs: Vec<Ino>,
    /// Inodes whose attribute leases went.
    pub inodes: Vec<Ino>,
}

/// A hook told of revocations: returns a future that completes once what depended on the
/// leases is dropped (the acknowledgement waits for it, see [`Client::on_revoke`]).
pub type RevokeHook =
    Arc<dyn Fn(Revoked) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// Handle to a Shoal cluster. Cheap to clone (clones share connections and cache),
/// `Send + Sync`. Every call is an `async fn`; [`BlockingClient`](crate::BlockingClient)
/// has blocking twins.
///
/// Connections are opened lazily, on the first request to each server, so calls must run
/// inside a tokio runtime (connection tasks are spawned on it).
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    opts: Arc<ClientOptions>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let map = self.map();
        f.debug_struct("Client")
            .field("cluster", &map.cluster.name)
            .field("map_version", &map.version())
            .field("servers", &map.servers.len())
            .field("uid", &self.opts.cred.uid)
            .finish()
    }
}

/// Where a request goes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum To {
    /// The home server of an inode (recomputed after a map reload).
    Home(Ino),
    /// A given server (a data object's).
    Server(ServerId),
    /// The server of the partition of directory `dir` holding names with hash `hash`
    /// (`name_hash(name)`; for a listing position `key`, `key.reverse_bits()`), by the
    /// bitmap this client knows (`partitions.rs`). A `Reply::Partitions` answer is merged
    /// and the request sent again.
    Entry { dir: Ino, hash: u64 },
}

impl To {
    /// Where a request about `dir/name` goes.
    pub(crate) fn entry(dir: Ino, name: &str) -> To {
        To::Entry { dir, hash: shoal_placement::name_hash(name) }
    }
}

/// Capacity of the whole file system, summed over the servers that answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Bytes of storage on all answering servers.
    pub capacity_bytes: u64,
    /// Bytes free on all answering servers.
    pub free_bytes: u64,
    /// Inodes stored on all answering servers.
    pub inodes: u64,
    /// Servers that answered.
    pub servers_up: usize,
    /// Servers in the map that take part in placement (not marked `out`).
    pub servers_total: usize,
}

/// The variant name of a reply, for messages.
fn reply_name(reply: &Reply) -> &'static str {
    match reply {
        Reply::Hello { .. } => "Hello",
        Reply::Ok => "Ok",
        Reply::Entry(_) => "Entry",
        Reply::Attr(_) => "Attr",
        Reply::DirEntries { .. } => "DirEntries",
        Reply::Link(_) => "Link",
        Reply::Xattr(_) => "Xattr",
        Reply::XattrNames(_) => "XattrNames",
        Reply::Data => "Data",
        Reply::DataList { .. } => "DataList",
        Reply::Written { .. } => "Written",
        Reply::NLink(_) => "NLink",
        Reply::Replaced(_) => "Replaced",
        Reply::StatFs(_) => "StatFs",
        Reply::Status(_) => "Status",
        Reply::StaleMap { .. } => "StaleMap",
        Reply::Batch(_) => "Batch",
        Reply::Error { .. } => "Error",
        Reply::Appended { .. } => "Appended",
        Reply::Scrub(_) => "Scrub",
        Reply::Opened { .. } => "Opened",
        Reply::Leased { .. } => "Leased",
        Reply::Partitions { .. } => "Partitions",
        Reply::UrlInfo(_) => "UrlInfo",
        Reply::Fetched { .. } => "Fetched",
        Reply::Load(_) => "Load",
        Reply::Replicated { .. } => "Replicated",
        Reply::Raft { .. } => "Raft",
        Reply::Map { .. } => "Map",
        Reply::Resync(_) => "Resync",
        Reply::ScrubRead { .. } => "ScrubRead",
        Reply::Found(_) => "Found",
        Reply::Tuple { .. } => "Tuple",
        Reply::TupleEvents(_) => "TupleEvents",
        Reply::Changes(_) => "Changes",
        Reply::Usage(_) => "Usage",
    }
}

/// Whether `op` changes no inode record (for attribute leases: `attr_leases.rs`).
pub(crate) fn reads_only(op: &Op) -> bool {
    matches!(
        op,
        Op::Hello { .. }
            | Op::Authenticate { .. }
            | Op::Lookup { .. }
            | Op::ReadDir { .. }
            | Op::GetAttr { .. }
            | Op::ReadLink { .. }
            | Op::Access { .. }
            | Op::GetXattr { .. }
            | Op::ListXattr { .. }
            | Op::Read { .. }
            | Op::ReadList { .. }
            | Op::UrlProbe { .. }
            | Op::FetchInto { .. }
            | Op::Fsync { .. }
            | Op::Open { .. }
            | Op::StatFs
            | Op::Status
            | Op::ScrubStart
            | Op::ScrubStatus
            | Op::LeaseAck { .. }
            | Op::ReleaseOrphan { .. }
            | Op::Changes { .. }
            | Op::ChangeAck { .. }
            | Op::Usage { .. }
    )
}

/// An unexpected reply variant: a protocol error, never a panic.
pub(crate) fn unexpected(reply: &Reply) -> Error {
    Error::new(Errno::EPROTO, format!("unexpected {} reply", reply_name(reply)))
}

fn map_error(e: MapError) -> Error {
    let errno = match &e {
        MapError::Read { source, .. } => Errno::from_io(source),
        MapError::Parse { .. } | MapError::Invalid { .. } => Errno::EINVAL,
    };
    let context = match e {
        MapError::Read { path, .. } => format!("cannot read cluster config {}", path.display()),
        other => other.to_string(),
    };
    Error::new(errno, context)
}

fn pool_options(opts: &ClientOptions, session: u64, notices: Option<shoal_rpc::NoticeSink>) -> PoolOptions {
    let mut features = shoal_proto::hello::default_features();
    if opts.attr_leases {
        features |= shoal_proto::hello::FEATURE_ATTR_LEASES & !shoal_proto::hello::features_off();
    }
    PoolOptions {
        features,
        timeout: opts.timeout,
        connections_per_server: opts.connections_per_server.max(1),
        client_name: format!("shoal-client pid {}", std::process::id()),
        session,
        notices,
        host_keys: opts.host_keys.clone(),
        ..PoolOptions::default()
    }
}

/// The term of the leases a client with `opts` asks for (zero: none).
fn lease_term(opts: &ClientOptions) -> std::time::Duration {
    opts.dir_lease
}

/// Where a client's connections hand servers' notices: a revocation drops the lease and
/// what the entry cache holds of the directory, then is acknowledged (from a task: this
/// runs on a connection's reader). Holds the client weakly (the pool it is in is the
/// client's).
fn notice_sink(shared: std::sync::Weak<Shared>) -> shoal_rpc::NoticeSink {
    shoal_rpc::NoticeSink(Arc::new(move |server, notice| {
        let Some(sh) = shared.upgrade() else { return };
        let inodes = match &notice {
            Some(Notice::Revoke { leases }) => sh.attr_leases.revoked(server, leases),
            None => sh.attr_leases.lost(server),
        };
        for &ino in &inodes {
            sh.cache.forget_attr(ino);
        }
        let (dirs, ids) = sh.leases.notice(server, notice);
        for &d in &dirs {
            sh.cache.forget_dir(d);
        }
        let hook = sh.on_revoke.read().clone();
        let told = hook.filter(|_| !dirs.is_empty() || !inodes.is_empty()).map(|h| h(Revoked { dirs, inodes }));
        if ids.is_empty() && told.is_none() {
            return;
        }
        let weak = Arc::downgrade(&sh);
        tokio::spawn(async move {
            if let Some(told) = told {
                told.await;
            }
            if ids.is_empty() {
                return;
            }
            let Some(sh) = weak.upgrade() else { return };
            let pool = sh.pool.clone();
            drop(sh);
            let op = Op::LeaseAck { ids };
            if let Err(e) = pool.request(server, &shoal_proto::msg::Cred::root(), op, Bytes::new()).await {
                // The server stops waiting when the leases run out.
                tracing::debug!("acknowledging a lease revocation to server {server}: {e}");
            }
        });
    }))
}

/// How long one server may take to answer `GetMap` before the next one is asked.
const MAP_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Times a request answered "stale map" is sent again after reloading the map found no
/// newer one.
const STALE_TRIES: u32 = 4;
/// At most this many rounds in all, even while every round learns a newer map (a map that
/// changes without end must not keep a call going forever).
const STALE_ROUNDS: u32 = 64;

/// How the pool fetches the newest map while it waits for a failover: the client's own
/// [`Client::refresh_map`] (one fetch shared by every waiting call). Holds the client
/// weakly (the pool it is in is the client's).
fn map_refresh(shared: std::sync::Weak<Shared>, opts: ClientOptions) -> shoal_rpc::MapRefresh {
    let opts = Arc::new(opts);
    Arc::new(move || {
        let client = shared.upgrade().map(|shared| Client { shared, opts: opts.clone() });
        Box::pin(async move {
            if let Some(c) = client {
                if let Err(e) = c.refresh_map().await {
                    tracing::debug!("fetching the cluster map during a failover: {e}");
                }
            }
        })
    })
}

/// Attributes carried by a create-like reply.
fn attr_in(reply: Reply) -> Result<std::result::Result<Attr, Ino>> {
    match reply {
        Reply::Attr(a) => Ok(Ok(a)),
        Reply::Entry(EntryOut { attr: Some(a), .. }) => Ok(Ok(a)),
        Reply::Entry(EntryOut { ino, attr: None, .. }) => Ok(Err(ino)),
        other => Err(unexpected(&other)),
    }
}

fn expect_ok(reply: Reply) -> Result<()> {
    match reply {
        Reply::Ok | Reply::Attr(_) => Ok(()),
        other => Err(unexpected(&other)),
    }
}

/// Whether `cred` may access a file with `attr` for `mask` (R_OK=4, W_OK=2, X_OK=1), by
/// the rules the servers apply. For skipping an `Access` request when the answer is
/// certainly yes (this client's `access`, the FUSE mount); a no must be confirmed by the
/// server (it may know supplementary groups or ACL-like rules this check does not).
pub fn may_access(attr: &Attr, cred: &shoal_proto::msg::Cred, mask: u32) -> bool {
    let mask = mask & 7;
    if cred.uid == 0 {
        return mask & 1 == 0 || attr.perm & 0o111 != 0 || attr.kind == FileKind::Dir;
    }
    let bits = if cred.uid == attr.uid {
        attr.perm >> 6
    } else if cred.in_group(attr.gid) {
        attr.perm >> 3
    } else {
        attr.perm
    } & 7;
    bits & mask == mask
}

impl Client {
    /// A client for the cluster described by `map`. Does no I/O: connections are made on
    /// first use (inside a tokio runtime). Without a config file the map cannot be
    /// reloaded; a stale-map answer then fails with ESTALE.
    pub fn new(map: ClusterMap, opts: ClientOptions) -> Client {
        Client::build(map, opts, None)
    }

    /// A client for the cluster described by the config file at `path` (see the README for
    /// its format). When a server answers that the client's map is stale, the file is read
    /// again and the request retried once.
    pub fn from_config(path: &Path, opts: ClientOptions) -> Result<Client> {
        let map = ClusterMap::load(path).map_err(map_error)?;
        Ok(Client::build(map, opts, Some(path.to_path_buf())))
    }

    fn build(map: ClusterMap, opts: ClientOptions, config: Option<PathBuf>) -> Client {
        let session = new_session();
        let term = lease_term(&opts);
        let shared = Arc::new_cyclic(|weak| {
            let notices = (!term.is_zero()).then(|| notice_sink(weak.clone()));
            let mut popts = pool_options(&opts, session, notices);
            popts.failover = (!opts.failover_wait.is_zero()).then(|| shoal_rpc::Failover {
                wait: opts.failover_wait,
                refresh: Some(map_refresh(weak.clone(), opts.clone())),
            });
            let pool = Pool::new(map.clone(), popts);
            Shared {
                pool: Arc::new(pool),
                maps: Mutex::new(vec![Arc::new(map)]),
                config,
                reload: tokio::sync::Mutex::new(()),
                map_fetches: std::sync::atomic::AtomicU64::new(0),
                cache: Cache::new(opts.cache_ttl),
                session,
                open_files: OpenFiles::default(),
                cap_stash: crate::caps::Stash::default(),
                leases: Arc::new(LeaseCache::new(term)),
                bitmaps: Bitmaps::default(),
                attr_leases: Arc::new(AttrLeases::new(opts.attr_leases && !term.is_zero())),
                stat_ahead: StatAhead::default(),
                on_revoke: RwLock::new(None),
            }
        });
        Client { shared, opts: Arc::new(opts) }
    }

    /// The cluster map in use (the newest, after a reload).
    pub fn map(&self) -> &ClusterMap {
        let maps = self.shared.maps.lock();
        let newest: *const ClusterMap = match maps.last() {
            Some(m) => Arc::as_ptr(m),
            None => unreachable!("a client always has a map"),
        };
        drop(maps);
        // SAFETY: `maps` is append-only and owned by `self.shared`, which lives at least as
        // long as `&self`; the map sits in an `Arc` allocation that never moves or is
        // freed while the vector holds it, so the reference stays valid for `&self`.
        unsafe { &*newest }
    }

    /// The options this client was made with.
    pub fn options(&self) -> &ClientOptions {
        &self.opts
    }

    /// The same client (same connections, same cache) acting as another identity. The
    /// cache is shared: see the [`cache`](crate#caching) notes on what that implies.
    pub fn with_cred(&self, cred: shoal_proto::msg::Cred) -> Client {
        let mut opts = (*self.opts).clone();
        opts.cred = cred;
        Client { shared: self.shared.clone(), opts: Arc::new(opts) }
    }

    /// Requests sent, bytes sent and bytes received per server, since the client was made.
    pub fn traffic(&self) -> HashMap<ServerId, (u64, u64, u64)> {
        self.shared.pool.traffic()
    }

    /// The home server of `ino` under the current map: it holds the inode and, for a
    /// directory, its entries.
    pub fn home_of(&self, ino: Ino) -> ServerId {
        self.pool().map().home_of(ino)
    }

    /// Call `hook` with every revocation of this client's leases (and every loss of a
    /// connection, which may have lost one), before the revocation is acknowledged: the
    /// change that revoked them waits until the future `hook` returns is done. The hook runs
    /// on a connection's reader, so it must only start the work and return at once.
    pub fn on_revoke(&self, hook: RevokeHook) {
        *self.shared.on_revoke.write() = Some(hook);
    }

    /// The attributes of `ino` under an attribute lease of this client, with the lease's
    /// end (`ClientOptions::attr_leases`): exact until then, unless this client changes
    /// the inode itself.
    pub fn leased_attr(&self, ino: Ino) -> Option<(Attr, Instant)> {
        self.shared.attr_leases.get(ino, Instant::now())
    }

    /// The attributes of `ino` as of when this client's last lease on them ran out (not
    /// revoked, not changed by this client since): a hint, not the truth (a FUSE mount
    /// answers a lookup with them, telling the kernel to ask again before it uses them).
    pub fn last_leased_attr(&self, ino: Ino) -> Option<Attr> {
        self.shared.attr_leases.last(ino)
    }

    /// What this client's lease on `dir` says `name` is (`Some(None)`: no such name), when
    /// a lease answers it.
    /// Like a lookup answered from the lease, it renews the lease when it is near its end.
    pub fn leased_name(&self, dir: Ino, name: &str) -> Option<Option<(Ino, FileKind)>> {
        self.leased_entry(dir, name, Instant::now())
    }

    /// When the lease on the attributes of `ino` ends, if one is held.
    pub fn attr_lease_end(&self, ino: Ino) -> Option<Instant> {
        self.shared.attr_leases.expires(ino, Instant::now())
    }

    /// Whether directory `dir` was marked read-mostly when this client last heard of it
    /// (docs/loading.md).
    pub fn is_read_mostly(&self, dir: Ino) -> bool {
        self.shared.leases.is_read_mostly(dir)
    }

    /// When the directory lease that answers lookups of `dir/name` ends, if one does.
    pub fn entry_lease_end(&self, dir: Ino, name: &str) -> Option<Instant> {
        self.shared.leases.answering(dir, name, Instant::now())
    }

    /// Forget every cached entry, attribute and symlink target.
    pub fn clear_cache(&self) {
        self.shared.cache.clear();
    }

    pub(crate) fn cache(&self) -> &Cache {
        &self.shared.cache
    }

    /// This client instance's session id (shared by clones and `with_cred` clients).
    pub(crate) fn session(&self) -> u64 {
        self.shared.session
    }

    pub(crate) fn open_files(&self) -> &OpenFiles {
        &self.shared.open_files
    }

    pub(crate) fn cap_stash(&self) -> &crate::caps::Stash {
        &self.shared.cap_stash
    }

    pub(crate) fn pool(&self) -> Arc<Pool> {
        self.shared.pool.clone()
    }

    /// Whether `server` agreed on the feature bit `feature` in `Hello` (connecting to it if
    /// need be): for operations older servers do not know.
    pub(crate) async fn server_has(&self, server: ServerId, feature: u64) -> Result<bool> {
        let pool = self.pool();
        pool.features(server).await.map(|f| f & feature != 0).map_err(|e| server_error(&pool, server, e))
    }

    pub(crate) fn max_in_flight(&self) -> usize {
        self.opts.max_in_flight.max(1)
    }

    // ---- requests ----

    /// Send `op` where `to` says. Server errors come back as their errno (no context) with
    /// the server's message as the detail; an unreachable server names itself in the
    /// context. A stale-map answer reloads the map (when the client has a config file) and
    /// retries once.
    pub(crate) async fn call(&self, to: To, op: Op, data: Bytes) -> Result<(Reply, Bytes)> {
        self.call_at(to, op, data).await.map(|(reply, data, _)| (reply, data))
    }

    /// As [`Client::call`], also naming the server that answered.
    pub(crate) async fn call_at(&self, to: To, op: Op, data: Bytes) -> Result<(Reply, Bytes, ServerId)> {
        // One line per request (`SHOAL_LOG=shoal_client::request=debug`): what a mount asks.
        tracing::debug!(target: "shoal_client::request", "{op:?}");
        if !self.shared.attr_leases.enabled() {
            let r = self.call_entries(to, op, data).await;
            if let Ok((reply, _, _)) = &r {
                self.shared.leases.note(reply);
            }
            return r;
        }
        // Nor does a change of an inode made here revoke this client's lease on it: the
        // lease is dropped around the request (`attr_leases.rs`).
        let changing = self.shared.attr_leases.begin(&op, |dir, name| self.named(dir, name));
        let sent = self.shared.attr_leases.sent();
        let mut r = self.call_entries(to, op, data).await;
        if let Ok((reply, _, _)) = &r {
            self.shared.leases.note(reply);
        }
        if let (Some(sent), Ok((reply, _, server))) = (sent, r.as_mut()) {
            self.shared.attr_leases.take(sent, *server, reply);
        }
        if let Some(changing) = changing {
            self.shared.attr_leases.end(changing, r.as_ref().ok().map(|(reply, _, _)| reply));
        }
        r
    }

    /// What this client knows `dir/name` to be, from a lease or the cache.
    fn named(&self, dir: Ino, name: &str) -> Option<Ino> {
        let now = Instant::now();
        match self.shared.leases.lookup(dir, name, now) {
            Some(known) => known.map(|(ino, _)| ino),
            None => self.cache().entry(dir, name, now).flatten().map(|(ino, _)| ino),
        }
    }

    async fn call_entries(&self, to: To, op: Op, data: Bytes) -> Result<(Reply, Bytes, ServerId)> {
        // A change of directory entries made here revokes no lease of this client: what its
        // leases know is brought up to date from the outcome (`leases.rs`).
        let Some(touch) = self.shared.leases.begin(&op) else { return self.call_placed(to, op, data).await };
        let kept = op.clone();
        let r = self.call_placed(to, op, data).await;
        self.shared.leases.end(touch, &kept, r.as_ref().map(|(reply, _, _)| reply).map_err(|e| e.errno));
        r
    }

    /// Send a request about a name of a possibly split directory: on `Reply::Partitions`
    /// (this client's bitmap was stale) learn the bitmap and send again, at most
    /// [`MAX_TRIES`] times in all.
    async fn call_placed(&self, to: To, op: Op, data: Bytes) -> Result<(Reply, Bytes, ServerId)> {
        let To::Entry { dir, .. } = to else { return Box::pin(self.call_routed(to, op, data)).await };
        for _ in 1..MAX_TRIES {
            match Box::pin(self.call_routed(to, op.clone(), data.clone())).await? {
                (Reply::Partitions { dir: d, bitmap }, _, _) => self.shared.bitmaps.learn(d, bitmap)?,
                answer => return Ok(answer),
            }
        }
        match Box::pin(self.call_routed(to, op, data)).await? {
            (Reply::Partitions { dir: d, bitmap }, _, _) => {
                self.shared.bitmaps.learn(d, bitmap)?;
                Err(too_many_redirects(dir))
            }
            answer => Ok(answer),
        }
    }

    async fn call_routed(&self, to: To, op: Op, data: Bytes) -> Result<(Reply, Bytes, ServerId)> {
        // Rounds that learnt no newer map, and rounds in all.
        let (mut stale, mut rounds) = (0, 0);
        let mut op = Some(op);
        loop {
            let pool = self.pool();
            let seen = pool.map().version();
            let server = self.target(&pool, to);
            let this = op.take().expect("kept for every attempt");
            // Kept for a retry when the map can be reloaded (from the config file or the servers).
            let again =
                (self.shared.config.is_some() && stale < STALE_TRIES && rounds < STALE_ROUNDS).then(|| this.clone());
            match pool.request(server, &self.opts.cred, this, data.clone()).await {
                Err(e) if e.errno() == Errno::ESTALE && again.is_some() => {
                    rounds += 1;
                    // The server that refused holds the newer map: ask it first (another
                    // server may not have applied it yet). Maps change in bursts (a failover,
                    // then a handback, a hand-off after a crash: several versions within
                    // 100 ms), so a round that learnt a newer map does not count against
                    // the tries.
                    let newer = self.reload_map(seen, Some(server)).await?;
                    if !newer {
                        stale += 1;
                    }
                    if !newer && stale == STALE_TRIES {
                        return Err(Error::new(
                            Errno::ESTALE,
                            format!(
                                "server {server} routes with a newer cluster map than version {} (no server gave a \
                                 newer one)",
                                pool.map().version()
                            ),
                        ));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20 * u64::from(stale.max(1)))).await;
                    op = again;
                }
                r => {
                    return r.map(|(reply, data)| (reply, data, server)).map_err(|e| server_error(&pool, server, e));
                }
            }
        }
    }

    /// The server `to` names under `pool`'s map and the bitmaps known.
    fn target(&self, pool: &Pool, to: To) -> ServerId {
        match to {
            To::Home(ino) => pool.map().home_of(ino),
            To::Server(s) => s,
            To::Entry { dir, hash } => self.shared.bitmaps.server_for(&pool.map(), dir, hash),
        }
    }

    /// The partition bitmap this client has learnt of directory `dir`, as
    /// `shoal_placement::Bitmap` words (`[1]`: partition 0 only, for a directory it never
    /// saw split), without a request. Requests about names of `dir` teach it: a server
    /// answering a misrouted one sends the current bitmap. [`Client::fetch_bitmap`] asks.
    pub fn dir_bitmap(&self, dir: Ino) -> Vec<u64> {
        self.shared.bitmaps.get(dir).into()
    }

    /// The partitions of directory `dir` as its servers hold them now: one `ReadDir` of at
    /// most one entry from the first listing key of each partition in turn (each reply
    /// names the partition holding that position and its depth, so the walk meets every
    /// partition once). Needs read permission on `dir`. What it finds is learnt for routing.
    pub async fn fetch_bitmap(&self, dir: Ino) -> Result<shoal_placement::Bitmap> {
        self.fetch_bitmap_inner(dir).await.map_err(|e| e.within(format_args!("partitions of directory {dir}")))
    }

    async fn fetch_bitmap_inner(&self, dir: Ino) -> Result<shoal_placement::Bitmap> {
        let mut found = shoal_placement::Bitmap::new();
        let mut key = Some(0u64);
        while let Some(k) = key {
            let page = self.readdir_one(dir, Start::From(k), 1, None).await?;
            // A server without split directories: one partition.
            let Some(part) = page.part else { return Ok(found) };
            found.insert(part.index).map_err(|e| Error::new(Errno::EPROTO, e.to_string()))?;
            key = shoal_placement::key_after(part.index, part.depth);
            if key.is_some_and(|next| next <= k) {
                return Err(Error::new(
                    Errno::EPROTO,
                    format!("a page of partition {} does not hold its start", part.index),
                ));
            }
        }
        self.shared.bitmaps.learn(dir, found.clone().into())?;
        Ok(found)
    }

    /// Re-read the config file and ask the servers after a call routed by map version
    /// `seen` got a stale-map answer. True if a newer map is now in use (by this call or a
    /// concurrent one).
    async fn reload_map(&self, seen: u64, ask_first: Option<ServerId>) -> Result<bool> {
        let _one = self.shared.reload.lock().await;
        let failed = self.pool();
        if failed.map().version() > seen {
            return Ok(true);
        }
        let mut newest: Option<ClusterMap> = None;
        if let Some(path) = &self.shared.config {
            let map = ClusterMap::load(path).map_err(map_error)?;
            if map.version() > failed.map().version() {
                newest = Some(map);
            }
        }
        // The servers hold the replicated map (docs/membership.md): it may be newer than
        // the file.
        if let Some(map) = self.fetch_map(&failed, ask_first).await {
            if map.version() > newest.as_ref().map_or(failed.map().version(), |m| m.version()) {
                newest = Some(map);
            }
        }
        self.shared.map_fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match newest {
            Some(map) => {
                self.install_map(&failed, map);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Ask the servers of the current map for the newest map they hold (`GetMap`): `first`
    /// (if given) before the others, then the first to answer wins; `None` if none answers.
    async fn fetch_map(&self, pool: &Arc<Pool>, first: Option<ServerId>) -> Option<ClusterMap> {
        let map = pool.map();
        let base = self.shared.config.as_deref().and_then(|p| p.parent()).unwrap_or(std::path::Path::new("."));
        let mut order: Vec<ServerId> = map
            .servers
            .iter()
            .filter(|s| s.state != shoal_placement::map::ServerState::Out)
            .map(|s| s.server_id())
            .filter(|&s| Some(s) != first)
            .collect();
        order.splice(0..0, first);
        for s in order {
            let op = Op::GetMap { known: map.version() };
            // Bounded: a frozen server must not hold up the search (a failover waits on it).
            let asked = tokio::time::timeout(MAP_FETCH_TIMEOUT, pool.request(s, &self.opts.cred, op, Bytes::new()));
            match asked.await.unwrap_or_else(|_| {
                Err(shoal_rpc::CallError::Transport {
                    errno: Errno::ETIMEDOUT,
                    reason: "no answer".into(),
                    refused: false,
                })
            }) {
                Ok((Reply::Map { toml, .. }, _)) => match ClusterMap::from_toml(&toml, base) {
                    Ok(m) => return Some(m),
                    Err(e) => tracing::warn!("server {s} sent a map this client cannot use: {e}"),
                },
                Ok(_) | Err(_) => continue,
            }
        }
        None
    }

    /// The newest cluster map `server` holds: (version, TOML, the group's leader, voters).
    pub async fn get_map(&self, server: ServerId) -> Result<(u64, String, Option<u32>, Vec<u32>)> {
        let known = self.map().version();
        match self.call(To::Server(server), Op::GetMap { known }, Bytes::new()).await {
            Ok((Reply::Map { version, toml, leader, voters }, _)) => Ok((version, toml, leader, voters)),
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => Err(e),
        }
        .map_err(|e| e.within(format_args!("map of server {server}")))
    }

    /// Change the cluster map through `server` (root only): compare-and-set against
    /// `expect_version`; returns the new version.
    pub async fn propose_map(&self, server: ServerId, expect_version: u64, toml: String) -> Result<u64> {
        match self.call(To::Server(server), Op::ProposeMap { expect_version, toml }, Bytes::new()).await {
            Ok((Reply::Map { version, .. }, _)) => Ok(version),
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => Err(e),
        }
        .map_err(|e| e.within(format_args!("map change through server {server}")))
    }

    /// Route by `map` from now on. The pool stays (`Pool::set_map`): connections to servers
    /// whose address did not change stay open, and with them the leases granted on them, so
    /// a map change that moves no server (one marked down and up again, say) costs no
    /// cached state.
    fn install_map(&self, pool: &Pool, map: ClusterMap) {
        tracing::info!("cluster map version {} -> {}", pool.map().version(), map.version());
        self.shared.maps.lock().push(Arc::new(map.clone()));
        pool.set_map(map);
    }

    /// Fetch the newest cluster map from the servers (and the config file) and route by it
    /// if it is newer; returns the version in use afterwards. For callers that saw a server
    /// fail (its slot may have moved). Cheap: one `GetMap` when nothing changed, and callers
    /// arriving while a fetch is under way share its result.
    pub async fn refresh_map(&self) -> Result<u64> {
        let seen = self.shared.map_fetches.load(std::sync::atomic::Ordering::SeqCst);
        let version = self.pool().map().version();
        {
            // Another caller's fetch finished while this one waited: use it.
            let _wait = self.shared.reload.lock().await;
            if self.shared.map_fetches.load(std::sync::atomic::Ordering::SeqCst) != seen {
                return Ok(self.pool().map().version());
            }
        }
        self.reload_map(version, None).await?;
        Ok(self.pool().map().version())
    }

    // ---- lookups ----

    /// Look up `dir/name` at home(dir); if the entry's server does not hold the inode, ask
    /// the inode's home for the attributes. Served from the cache when fresh.
    pub async fn lookup(&self, dir: Ino, name: &str) -> Result<Attr> {
        self.lookup_attr(dir, name, false)
            .await
            .map_err(|e| e.within(format_args!("lookup {name:?} in directory {dir}")))
    }

    pub(crate) async fn lookup_attr(&self, dir: Ino, name: &str, fresh: bool) -> Result<Attr> {
        match name {
            "." | "" => return self.getattr_with(dir, fresh).await,
            ".." => {
                let d = self.getattr_with(dir, fresh).await?;
                return self.getattr_with(d.parent.unwrap_or(dir), fresh).await;
            }
            _ => {}
        }
        let now = Instant::now();
        if !fresh {
            match self.cache().entry(dir, name, now) {
                Some(None) => return Err(Error::bare(Errno::ENOENT)),
                Some(Some((ino, _))) => {
                    if let Some(a) = self.cache().attr(ino, now) {
                        return Ok(a);
                    }
                }
                None => {}
            }
            match self.leased_entry(dir, name, now) {
                Some(None) => return Err(Error::bare(Errno::ENOENT)),
                // The name is exact; the attributes come from their own cache or server.
                Some(Some((ino, _))) => return self.getattr_with(ino, false).await,
                None => {}
            }
        }
        let e = self.lookup_rpc(dir, name).await?;
        match e.attr {
            Some(a) => Ok(a),
            None => self.getattr_fresh_inner(e.ino).await,
        }
    }

    /// The entry `dir/name`: `(ino, kind, attributes if known, served from the cache)`.
    /// A cached negative entry gives ENOENT with `false` in the second field of the error
    /// (not from a server); a server's answer gives `true`.
    pub(crate) async fn lookup_entry(
        &self,
        dir: Ino,
        name: &str,
        fresh: bool,
    ) -> std::result::Result<(Ino, FileKind, Option<Attr>, bool), (Error, bool)> {
        let now = Instant::now();
        if !fresh {
            match self.cache().entry(dir, name, now).or_else(|| self.leased_entry(dir, name, now)) {
                Some(None) => return Err((Error::bare(Errno::ENOENT), false)),
                Some(Some((ino, kind))) => return Ok((ino, kind, self.cache().attr(ino, now), true)),
                None => {}
            }
        }
        match self.lookup_rpc(dir, name).await {
            Ok(e) => Ok((e.ino, e.kind, e.attr, false)),
            Err(e) => Err((e, true)),
        }
    }

    /// What this client's lease on `dir` says of `name` (`None`: nothing), renewing the
    /// lease in the background when it is in use and near its end.
    fn leased_entry(&self, dir: Ino, name: &str, now: Instant) -> Option<crate::leases::Known> {
        let known = self.shared.leases.lookup(dir, name, now)?;
        if let Some(asking) = self.shared.leases.renewal(dir, name, now) {
            let (client, name) = (self.clone(), name.to_string());
            tokio::spawn(async move {
                let _ = client.lookup_leased(dir, &name, asking).await;
            });
        }
        Some(known)
    }

    /// Ask `dir`'s server for the listing with a lease, when a lease is worth having and
    /// the directory looks like one being filled (`leases.rs`, "How a lease is taken"):
    /// then answer `name` from it. `None`: ask for the name.
    async fn lookup_by_listing(&self, dir: Ino, name: &str) -> Option<Result<EntryOut>> {
        let now = Instant::now();
        if self.shared.leases.fetch(dir, now) != Fetch::Listing {
            return None;
        }
        let asking = self.shared.leases.ask(dir)?;
        // The listing of the partition holding the name (the whole directory unless split),
        // from its first position.
        let bitmap = self.shared.bitmaps.get(dir);
        let index = bitmap.partition_of(shoal_placement::name_hash(name));
        let first = shoal_placement::key_range(index, bitmap.depth_of(index)).0;
        let page = self.readdir_one(dir, Start::From(first), crate::leases::LISTING_MAX, Some(asking)).await;
        if page.is_err() {
            return None;
        }
        match self.shared.leases.lookup(dir, name, Instant::now())? {
            None => {
                self.cache().put_entry(dir, name, None, now);
                Some(Err(Error::bare(Errno::ENOENT)))
            }
            // The plain cache learns it too: it is asked before the lease, and may still hold
            // a negative entry that an older lookup put there.
            Some((ino, kind)) => {
                self.cache().put_entry(dir, name, Some((ino, kind)), now);
                Some(Ok(EntryOut { ino, kind, attr: self.cache().attr(ino, now), cap: None, attr_lease: None }))
            }
        }
    }

    /// `Lookup` asking for a lease (`asking`); takes the lease if granted.
    async fn lookup_leased(&self, dir: Ino, name: &str, asking: crate::leases::Asking) -> Result<EntryOut> {
        let op = Op::Lookup { dir, name: name.to_string(), lease: Some(asking.ask) };
        let mut server = self.home_of(dir);
        let (reply, grant) = match self.call_at(To::entry(dir, name), op, Bytes::new()).await {
            Ok((Reply::Leased { lease, reply: LeasedReply::Entry(e) }, _, s)) => {
                server = s;
                (Ok(e), Some(lease))
            }
            Ok((Reply::Leased { lease, reply: LeasedReply::Absent }, _, s)) => {
                server = s;
                (Err(Error::new(Errno::ENOENT, format!("no entry {name:?} in directory {dir}"))), Some(lease))
            }
            Ok((Reply::Entry(e), _, _)) => (Ok(e), None),
            Ok((other, _, _)) => return Err(unexpected(&other)),
            Err(e) => (Err(e), None),
        };
        let learnt = match &reply {
            Ok(e) => Some(Some((e.ino, e.kind))),
            Err(e) if e.errno == Errno::ENOENT => Some(None),
            Err(_) => None,
        };
        match learnt {
            Some(k) => self.shared.leases.install(asking, server, grant, Learnt::Name(name.to_string(), k)),
            None => drop(asking),
        }
        reply
    }

    async fn lookup_rpc(&self, dir: Ino, name: &str) -> Result<EntryOut> {
        if let Some(r) = self.lookup_by_listing(dir, name).await {
            return r;
        }
        let now = Instant::now();
        let r = match self.shared.leases.ask(dir) {
            Some(asking) => self.lookup_leased(dir, name, asking).await.map(|e| (Reply::Entry(e), Bytes::new())),
            None => {
                self.call(To::entry(dir, name), Op::Lookup { dir, name: name.to_string(), lease: None }, Bytes::new())
                    .await
            }
        };
        match r {
            Ok((Reply::Entry(e), _)) => {
                self.cache().put_entry(dir, name, Some((e.ino, e.kind)), now);
                if let Some(a) = &e.attr {
                    if a.ino != e.ino {
                        return Err(Error::new(Errno::EPROTO, "lookup reply carries another inode's attributes"));
                    }
                    self.cache().put_attr(a, now);
                }
                Ok(e)
            }
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => {
                if e.errno == Errno::ENOENT {
                    self.cache().put_entry(dir, name, None, now);
                }
                Err(e)
            }
        }
    }

    // ---- attributes ----

    /// Attributes of `ino`, from the cache if fresh, else from its home server.
    pub async fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.getattr_with(ino, false).await.map_err(|e| e.within(format_args!("getattr {ino}")))
    }

    /// Attributes of `ino` from its home server, bypassing the cache (and refreshing it).
    pub async fn getattr_fresh(&self, ino: Ino) -> Result<Attr> {
        self.getattr_fresh_inner(ino).await.map_err(|e| e.within(format_args!("getattr {ino}")))
    }

    pub(crate) async fn getattr_with(&self, ino: Ino, fresh: bool) -> Result<Attr> {
        // Attributes under a lease are exact: fresh without asking.
        if let Some((a, _)) = self.shared.attr_leases.get(ino, Instant::now()) {
            return Ok(a);
        }
        if !fresh {
            if let Some(a) = self.cache().attr(ino, Instant::now()) {
                return Ok(a);
            }
        }
        self.getattr_fresh_inner(ino).await
    }

    pub(crate) async fn getattr_fresh_inner(&self, ino: Ino) -> Result<Attr> {
        let now = Instant::now();
        if let Some((a, _)) = self.shared.attr_leases.get(ino, now) {
            return Ok(a);
        }
        match self.call(To::Home(ino), Op::GetAttr { ino }, Bytes::new()).await? {
            (Reply::Attr(a), _) => {
                self.cache().put_attr(&a, now);
                Ok(a)
            }
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// Change attributes (permissions, owner, size, times) of `ino` at its home server.
    pub async fn setattr(&self, ino: Ino, set: SetAttrs) -> Result<Attr> {
        self.setattr_inner(ino, set).await.map_err(|e| e.within(format_args!("setattr {ino}")))
    }

    pub(crate) async fn setattr_inner(&self, ino: Ino, set: SetAttrs) -> Result<Attr> {
        let now = Instant::now();
        match self.call(To::Home(ino), Op::SetAttr { ino, set }, Bytes::new()).await {
            Ok((Reply::Attr(a), _)) => {
                self.cache().put_attr(&a, now);
                Ok(a)
            }
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => {
                self.cache().forget_attr(ino);
                Err(e)
            }
        }
    }

    /// Raise the recorded size of `ino` to at least `size` (after writes to servers that do
    /// not hold the inode).
    pub(crate) async fn extend_size(&self, ino: Ino, size: u64) -> Result<()> {
        let r = self.call(To::Home(ino), Op::ExtendSize { ino, size }, Bytes::new()).await;
        self.cache().forget_attr(ino);
        expect_ok(r?.0)
    }

    // ---- namespace ----

    /// The attributes in a create-like reply, asking the inode's home if the reply has none.
    async fn attr_from(&self, reply: Reply) -> Result<Attr> {
        match attr_in(reply)? {
            Ok(a) => Ok(a),
            Err(ino) => self.getattr_fresh_inner(ino).await,
        }
    }

    /// Cache upkeep after `dir/name` came to name `attr` (by a request sent at `now`). The
    /// entry is dated when the reply came, so that a lookup's answer sent before this change
    /// was made, and arriving after it, cannot replace it (`Cache::put_entry`).
    fn entered(&self, dir: Ino, name: &str, attr: &Attr, now: Instant) {
        let c = self.cache();
        c.put_entry(dir, name, Some((attr.ino, attr.kind)), Instant::now());
        c.put_attr(attr, now);
        c.forget_attr(dir);
    }

    /// Create the regular file `dir/name` (permissions `perm & !umask`), or with
    /// `exclusive = false` also accept an existing file of that name. `layout` overrides
    /// the directory's default layout for a new file.
    pub async fn create_at(
        &self,
        dir: Ino,
        name: &str,
        perm: u32,
        exclusive: bool,
        layout: Option<LayoutSpec>,
    ) -> Result<Attr> {
        self.create_in(dir, name, perm, exclusive, layout)
            .await
            .map_err(|e| e.within(format_args!("create {name:?} in directory {dir}")))
    }

    pub(crate) async fn create_in(
        &self,
        dir: Ino,
        name: &str,
        perm: u32,
        exclusive: bool,
        layout: Option<LayoutSpec>,
    ) -> Result<Attr> {
        let now = Instant::now();
        let op = Op::Create { dir, name: name.to_string(), perm: perm & !self.opts.umask & 0o7777, exclusive, layout };
        let (mut reply, _) = self.call(To::entry(dir, name), op, Bytes::new()).await?;
        if let Reply::Entry(EntryOut { cap: cap @ Some(_), .. }) = &mut reply {
            self.cap_stash().put(cap.take().expect("matched Some"));
        }
        let a = self.attr_from(reply).await?;
        self.entered(dir, name, &a, now);
        Ok(a)
    }

    /// Make the directory `dir/name` (permissions `perm & !umask`).
    pub async fn mkdir_at(&self, dir: Ino, name: &str, perm: u32) -> Result<Attr> {
        self.mkdir_in(dir, name, perm).await.map_err(|e| e.within(format_args!("mkdir {name:?} in directory {dir}")))
    }

    pub(crate) async fn mkdir_in(&self, dir: Ino, name: &str, perm: u32) -> Result<Attr> {
        let now = Instant::now();
        let op = Op::Mkdir { dir, name: name.to_string(), perm: perm & !self.opts.umask & 0o7777 };
        let (reply, _) = self.call(To::entry(dir, name), op, Bytes::new()).await?;
        let a = self.attr_from(reply).await?;
        self.entered(dir, name, &a, now);
        Ok(a)
    }

    /// Make the symbolic link `dir/name` pointing to `target`.
    pub async fn symlink_at(&self, dir: Ino, name: &str, target: &str) -> Result<Attr> {
        self.symlink_in(dir, name, target)
            .await
            .map_err(|e| e.within(format_args!("symlink {name:?} in directory {dir}")))
    }

    pub(crate) async fn symlink_in(&self, dir: Ino, name: &str, target: &str) -> Result<Attr> {
        if target.is_empty() {
            return Err(Error::bare(Errno::ENOENT));
        }
        if target.len() > shoal_proto::msg::PATH_MAX {
            return Err(Error::bare(Errno::ENAMETOOLONG));
        }
        let now = Instant::now();
        let op = Op::Symlink { dir, name: name.to_string(), target: target.to_string() };
        let (reply, _) = self.call(To::entry(dir, name), op, Bytes::new()).await?;
        let a = self.attr_from(reply).await?;
        self.entered(dir, name, &a, now);
        self.cache().put_link(a.ino, target, now);
        Ok(a)
    }

    /// Make `dir/name` another name of `ino` (a hard link).
    pub async fn link_at(&self, ino: Ino, dir: Ino, name: &str) -> Result<Attr> {
        self.link_in(ino, dir, name)
            .await
            .map_err(|e| e.within(format_args!("link {ino} as {name:?} in directory {dir}")))
    }

    pub(crate) async fn link_in(&self, ino: Ino, dir: Ino, name: &str) -> Result<Attr> {
        let now = Instant::now();
        let op = Op::Link { ino, dir, name: name.to_string() };
        let (reply, _) = self.call(To::entry(dir, name), op, Bytes::new()).await?;
        let a = match attr_in(reply)? {
            Ok(a) => a,
            Err(_) => self.getattr_fresh_inner(ino).await?,
        };
        self.entered(dir, name, &a, now);
        Ok(a)
    }

    /// Remove the name `dir/name` of a file or symlink (the inode goes with its last name).
    pub async fn unlink_at(&self, dir: Ino, name: &str) -> Result<()> {
        self.remove_name(dir, name, false)
            .await
            .map_err(|e| e.within(format_args!("unlink {name:?} in directory {dir}")))
    }

    /// Remove the empty directory `dir/name`.
    pub async fn rmdir_at(&self, dir: Ino, name: &str) -> Result<()> {
        self.remove_name(dir, name, true).await.map_err(|e| e.within(format_args!("rmdir {name:?} in directory {dir}")))
    }

    pub(crate) async fn remove_name(&self, dir: Ino, name: &str, is_dir: bool) -> Result<()> {
        let now = Instant::now();
        let cached = self.cache().entry(dir, name, now);
        let known = cached.flatten();
        let op = if is_dir {
            Op::Rmdir { dir, name: name.to_string() }
        } else {
            let keep = self.keep_for(dir, name, cached).await;
            Op::Unlink { dir, name: name.to_string(), keep }
        };
        let keep = match &op {
            Op::Unlink { keep, .. } => *keep,
            _ => None,
        };
        let r = self.call(To::entry(dir, name), op, Bytes::new()).await;
        self.name_removed(dir, name, known.map(|k| k.0), r.as_ref().map(|_| ()).map_err(|e| e.errno), now);
        self.cache().forget_attr(dir);
        expect_ok(r?.0)?;
        self.kept(keep).await;
        Ok(())
    }

    /// Cache upkeep after a request to remove `dir/name`, sent at `asked`, answered
    /// `outcome`: the name is gone (or was already), or, after another failure, unknown.
    /// `known`: the inode the cache held for the name, whose attributes are now stale.
    fn name_removed(
        &self,
        dir: Ino,
        name: &str,
        known: Option<Ino>,
        outcome: std::result::Result<(), Errno>,
        asked: Instant,
    ) {
        let c = self.cache();
        match outcome {
            Ok(()) => c.put_entry(dir, name, None, Instant::now()),
            Err(errno) if errno == Errno::ENOENT => c.put_entry(dir, name, None, asked),
            Err(_) => c.forget_entry(dir, name),
        }
        if let Some(ino) = known {
            c.forget_ino(ino);
        }
    }

    // ---- batches: many operations in one request ----

    /// Create the regular files `dir/names[i]` as [`Client::create_at`] would, in one request
    /// per [`BATCH_MAX`] names (mdtest-style runs, tools that make many files at once). The
    /// outer error is the request's (unreachable server, …); each name has its own result,
    /// in order (EEXIST for one does not stop the others).
    pub async fn create_many_at(
        &self,
        dir: Ino,
        names: &[String],
        perm: u32,
        exclusive: bool,
    ) -> Result<Vec<Result<Attr>>> {
        let now = Instant::now();
        let perm = perm & !self.opts.umask & 0o7777;
        let ops = names.iter().map(|name| BatchOp::Create { dir, name: name.clone(), perm, exclusive, layout: None });
        let replies =
            self.call_batch(dir, ops).await.map_err(|e| e.within(format_args!("create in directory {dir}")))?;
        let mut out = Vec::with_capacity(replies.len());
        for (name, r) in names.iter().zip(replies) {
            let a = match r {
                Ok(reply) => self.attr_from(reply).await,
                Err(e) => Err(e),
            };
            if let Ok(a) = &a {
                self.entered(dir, name, a, now);
            }
            out.push(a.map_err(|e| e.within(format_args!("create {name:?} in directory {dir}"))));
        }
        Ok(out)
    }

    /// The attributes of `dir/name`, exact: from its attribute lease while one holds, else
    /// fetched with a fresh lease together with those of other names of `dir` whose leases
    /// ran out, as many as the run of such asks in `dir` calls for (`stat_ahead.rs`). For a
    /// caller that knows the name of the inode it needs the attributes of (the FUSE mount's
    /// `getattr` after a lookup answered from a directory lease).
    pub async fn lookup_ahead(&self, dir: Ino, name: &str) -> Result<Attr> {
        let now = Instant::now();
        if let Some(r) = self.leased_lookup(dir, name, now) {
            return r;
        }
        let mut names = vec![name.to_string()];
        let window = self.shared.stat_ahead.window(dir, now);
        if window > 1 && self.shared.attr_leases.enabled() {
            names.extend(self.ahead_of(dir, name, window - 1, now));
            if self.shared.stat_ahead.background(dir, window) {
                let client = self.clone();
                tokio::spawn(async move {
                    let now = Instant::now();
                    let next = client.ahead_of(dir, "", AHEAD_MAX, now);
                    if !next.is_empty() {
                        let _ = client.lookup_many(dir, &next).await;
                    }
                    client.shared.stat_ahead.background_done(dir);
                });
            }
        }
        let mut found = self.lookup_many(dir, &names).await?;
        found.swap_remove(0)
    }

    /// Up to `n` names of `dir` but `except` to fetch ahead (`stat_ahead.rs`).
    fn ahead_of(&self, dir: Ino, except: &str, n: usize, now: Instant) -> Vec<String> {
        self.shared.stat_ahead.pick(
            self.shared.leases.known_names(dir, except, SCAN_MAX, now),
            n,
            |ino| self.shared.attr_leases.ran_out(ino, now + RENEW_WITHIN),
            now,
        )
    }

    /// What leases say of `dir/name`, exactly: absent under the directory's lease, or the
    /// inode's attributes under its own (`None`: the servers must be asked).
    fn leased_lookup(&self, dir: Ino, name: &str, now: Instant) -> Option<Result<Attr>> {
        match self.shared.leases.lookup(dir, name, now)? {
            None => Some(Err(Error::bare(Errno::ENOENT))),
            Some((ino, _)) => self.shared.attr_leases.get(ino, now).map(|(a, _)| Ok(a)),
        }
    }

    /// Look up `dir/names[i]` as [`Client::lookup`] would, fresh: from leases where they
    /// answer exactly ([`Client::leased_lookup`]), the rest asked of the servers in one
    /// request per [`BATCH_MAX`] names; a result per name, in order.
    pub async fn lookup_many(&self, dir: Ino, names: &[String]) -> Result<Vec<Result<Attr>>> {
        let now = Instant::now();
        let leased: Vec<Option<Result<Attr>>> = names.iter().map(|n| self.leased_lookup(dir, n, now)).collect();
        let ask: Vec<String> = names.iter().zip(&leased).filter(|(_, l)| l.is_none()).map(|(n, _)| n.clone()).collect();
        let mut asked = match ask.is_empty() {
            true => Vec::new(),
            false => self.lookup_many_asking(dir, &ask, now).await?,
        }
        .into_iter();
        let out = names.iter().zip(leased).map(|(name, l)| match l {
            Some(r) => r.map_err(|e| e.within(format_args!("lookup {name:?} in directory {dir}"))),
            None => asked.next().expect("a reply per name asked"),
        });
        Ok(out.collect())
    }

    /// [`Client::lookup_many`] of names no lease answers: all asked of the servers.
    async fn lookup_many_asking(&self, dir: Ino, names: &[String], now: Instant) -> Result<Vec<Result<Attr>>> {
        let ops = names.iter().map(|name| BatchOp::Lookup { dir, name: name.clone() });
        let replies =
            self.call_batch(dir, ops).await.map_err(|e| e.within(format_args!("lookup in directory {dir}")))?;
        // Inodes that live on another server than their entries: asked for all at once.
        let remote = replies.iter().filter_map(|r| match r {
            Ok(Reply::Entry(e)) if e.attr.is_none() => Some(e.ino),
            _ => None,
        });
        let mut remote: HashMap<Ino, Result<Attr>> =
            futures::future::join_all(remote.map(|ino| async move { (ino, self.getattr_fresh_inner(ino).await) }))
                .await
                .into_iter()
                .collect();
        let mut out = Vec::with_capacity(replies.len());
        for (name, r) in names.iter().zip(replies) {
            let a = match r {
                Ok(Reply::Entry(e)) => {
                    self.cache().put_entry(dir, name, Some((e.ino, e.kind)), now);
                    match e.attr {
                        Some(a) if a.ino == e.ino => {
                            self.cache().put_attr(&a, now);
                            Ok(a)
                        }
                        Some(_) => Err(Error::new(Errno::EPROTO, "lookup reply carries another inode's attributes")),
                        None => match remote.remove(&e.ino) {
                            Some(r) => r,
                            None => self.getattr_fresh_inner(e.ino).await,
                        },
                    }
                }
                Ok(other) => Err(unexpected(&other)),
                Err(e) => {
                    if e.errno == Errno::ENOENT {
                        self.cache().put_entry(dir, name, None, now);
                    }
                    Err(e)
                }
            };
            out.push(a.map_err(|e| e.within(format_args!("lookup {name:?} in directory {dir}"))));
        }
        Ok(out)
    }

    /// Remove the names `dir/names[i]` of files or symlinks as [`Client::unlink_at`] would,
    /// in one request per [`BATCH_MAX`] names; a result per name, in order.
    pub async fn unlink_many_at(&self, dir: Ino, names: &[String]) -> Result<Vec<Result<()>>> {
        let now = Instant::now();
        let known: Vec<_> = names.iter().map(|name| self.cache().entry(dir, name, now).flatten()).collect();
        let ops = names.iter().map(|name| BatchOp::Unlink { dir, name: name.clone() });
        let replies = self.call_batch(dir, ops).await;
        self.cache().forget_attr(dir);
        let replies = match replies {
            Ok(r) => r,
            Err(e) => {
                // The whole request failed: as for each name alone with that error.
                for (name, k) in names.iter().zip(&known) {
                    self.name_removed(dir, name, k.map(|k| k.0), Err(e.errno), now);
                }
                return Err(e.within(format_args!("unlink in directory {dir}")));
            }
        };
        let mut out = Vec::with_capacity(replies.len());
        for ((name, k), r) in names.iter().zip(known).zip(replies) {
            self.name_removed(dir, name, k.map(|k| k.0), r.as_ref().map(|_| ()).map_err(|e| e.errno), now);
            out.push(r.and_then(expect_ok).map_err(|e| e.within(format_args!("unlink {name:?} in directory {dir}"))));
        }
        Ok(out)
    }

    /// Send `ops`, all for directory `dir`, to the servers of their names' partitions: one
    /// request per server and per [`BATCH_MAX`] operations, all in parallel; operations
    /// answered `Partitions` (a stale bitmap) are sent again, regrouped by the bitmap
    /// learnt, at most [`MAX_TRIES`] times in all. One result per operation, in the order
    /// of `ops` (a `Reply::Error` for an operation becomes its `Err`).
    async fn call_batch(&self, dir: Ino, ops: impl Iterator<Item = BatchOp>) -> Result<Vec<Result<Reply>>> {
        let ops: Vec<BatchOp> = ops.collect();
        let mut out: Vec<Option<Result<Reply>>> = (0..ops.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..ops.len()).collect();
        for _ in 0..MAX_TRIES {
            if pending.is_empty() {
                break;
            }
            let pool = self.pool();
            let requests = group_batch(&ops, &pending, |op| self.target(&pool, batch_to(op)));
            let answers: Vec<BatchAnswer> = futures::stream::iter(requests)
                .map(|idx| {
                    let chunk: Vec<BatchOp> = idx.iter().map(|&i| ops[i].clone()).collect();
                    let to = batch_to(&chunk[0]);
                    async move { (idx, self.call(to, Op::Batch { ops: chunk }, Bytes::new()).await) }
                })
                .buffer_unordered(self.max_in_flight())
                .collect()
                .await;
            pending.clear();
            for (idx, answer) in answers {
                let n = idx.len();
                match answer?.0 {
                    Reply::Batch(replies) if replies.len() == n => {
                        for (i, r) in idx.into_iter().zip(replies) {
                            match r {
                                BatchReply::Partitions { dir: d, bitmap } => {
                                    self.shared.bitmaps.learn(d, bitmap)?;
                                    pending.push(i);
                                }
                                r => {
                                    out[i] = Some(match r.into_reply() {
                                        Reply::Error { errno, .. } => Err(Error::bare(errno)),
                                        ok => Ok(ok),
                                    })
                                }
                            }
                        }
                    }
                    Reply::Batch(replies) => {
                        return Err(Error::new(
                            Errno::EPROTO,
                            format!("a batch of {n} operations answered with {} results", replies.len()),
                        ))
                    }
                    other => return Err(unexpected(&other)),
                }
            }
            pending.sort_unstable();
        }
        Ok(out.into_iter().map(|r| r.unwrap_or_else(|| Err(too_many_redirects(dir)))).collect())
    }

    /// Rename `src_dir/src_name` to `dst_dir/dst_name` (replacing a compatible target unless
    /// `flags.noreplace`; swapping both with `flags.exchange`).
    pub async fn rename_at(
        &self,
        src_dir: Ino,
        src_name: &str,
        dst_dir: Ino,
        dst_name: &str,
        flags: RenameFlags,
    ) -> Result<()> {
        self.rename_inner(src_dir, src_name, dst_dir, dst_name, flags).await.map_err(|e| {
            e.within(format_args!("rename {src_name:?} in directory {src_dir} to {dst_name:?} in directory {dst_dir}"))
        })
    }

    pub(crate) async fn rename_inner(
        &self,
        src_dir: Ino,
        src_name: &str,
        dst_dir: Ino,
        dst_name: &str,
        flags: RenameFlags,
    ) -> Result<()> {
        let now = Instant::now();
        let c = self.cache();
        let src = c.entry(src_dir, src_name, now).flatten();
        let dst_cached = c.entry(dst_dir, dst_name, now);
        let dst = dst_cached.flatten();
        let keep = match (flags.exchange || flags.noreplace, dst) {
            (true, _) | (false, Some((_, FileKind::Dir))) => None,
            (false, _) => self.keep_for(dst_dir, dst_name, dst_cached).await,
        };
        let op = Op::Rename {
            src_dir,
            src_name: src_name.to_string(),
            dst_dir,
            dst_name: dst_name.to_string(),
            flags,
            keep,
        };
        let r = self.call(To::entry(src_dir, src_name), op, Bytes::new()).await;
        c.forget_entry(src_dir, src_name);
        c.forget_entry(dst_dir, dst_name);
        for (ino, _) in src.iter().chain(dst.iter()) {
            c.forget_attr(*ino);
        }
        if let Some((ino, FileKind::Dir)) = dst {
            if !flags.exchange {
                c.forget_dir(ino);
            }
        }
        c.forget_attr(src_dir);
        c.forget_attr(dst_dir);
        expect_ok(r?.0)?;
        self.kept(keep).await;
        if !flags.exchange {
            let later = Instant::now();
            c.put_entry(src_dir, src_name, None, later);
            if let Some(moved) = src {
                c.put_entry(dst_dir, dst_name, Some(moved), later);
            }
        }
        Ok(())
    }

    /// All entries of directory `dir` (every page), in listing order (by the hash of the
    /// names: docs/protocol.md, "Listing order"; sort them to show them to people).
    pub async fn readdir_at(&self, dir: Ino) -> Result<Vec<DirEntry>> {
        self.readdir_all(dir).await.map_err(|e| e.within(format_args!("readdir {dir}")))
    }

    pub(crate) async fn readdir_all(&self, dir: Ino) -> Result<Vec<DirEntry>> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let (page, more) = self.readdir_page_inner(dir, after.take(), READDIR_MAX).await?;
            let last = page.last().map(|e| e.name.clone());
            all.extend(page);
            match last {
                Some(name) if more => after = Some(name),
                _ => return Ok(all),
            }
        }
    }

    /// One page of directory `dir`: at most `limit` entries with names after `after`, and
    /// whether more follow.
    pub async fn readdir_page(&self, dir: Ino, after: Option<String>, limit: u32) -> Result<(Vec<DirEntry>, bool)> {
        self.readdir_page_inner(dir, after, limit).await.map_err(|e| e.within(format_args!("readdir {dir}")))
    }

    /// A page in listing order (`listing.rs`): entries after `after` (from the start
    /// without), walking on from partition to partition of a split directory until the
    /// page has entries or the directory ends.
    async fn readdir_page_inner(&self, dir: Ino, after: Option<String>, limit: u32) -> Result<(Vec<DirEntry>, bool)> {
        let limit = limit.clamp(1, READDIR_MAX);
        // A complete listing held under a lease is the directory as it is now.
        if let Some(page) = self.shared.leases.listing(dir, after.as_deref(), limit as usize, Instant::now()) {
            return Ok(page);
        }
        // A lease is asked with the first page only (partition 0 from its start).
        let mut asking = if after.is_none() { self.shared.leases.ask(dir) } else { None };
        let start = after.map_or(Start::From(0), Start::After);
        crate::listing::walk(start, limit, |start, n| self.readdir_one(dir, start, n, asking.take())).await
    }

    /// One `ReadDir` from `start`, sent to the server of the partition holding it (as this
    /// client knows the bitmap), asking for a lease with `asking` (then taking it, and what
    /// the page teaches, when granted).
    async fn readdir_one(
        &self,
        dir: Ino,
        start: Start,
        limit: u32,
        asking: Option<crate::leases::Asking>,
    ) -> Result<Page> {
        let to = To::Entry { dir, hash: start.key().reverse_bits() };
        let (after, from) = match start {
            Start::After(name) => (Some(name), None),
            // Key 0 is the default: not sent, as before split directories.
            Start::From(k) => (None, (k != 0).then_some(k)),
        };
        let op = Op::ReadDir { dir, after, limit, lease: asking.as_ref().map(|a| a.ask), from };
        let (entries, more, part, grant, server) = match self.call_at(to, op, Bytes::new()).await? {
            (Reply::DirEntries { entries, more, part }, _, s) => (entries, more, part, None, s),
            (Reply::Leased { lease, reply: LeasedReply::DirEntries { entries, more, part } }, _, s) => {
                (entries, more, part, Some(lease), s)
            }
            (other, _, _) => return Err(unexpected(&other)),
        };
        if let Some(asking) = asking {
            self.shared.leases.install(asking, server, grant, Learnt::Listing(entries.clone(), more));
        }
        Ok(Page { entries, more, part })
    }

    /// The target of symlink `ino`.
    pub async fn readlink_at(&self, ino: Ino) -> Result<String> {
        self.readlink_with(ino, false).await.map_err(|e| e.within(format_args!("readlink {ino}")))
    }

    pub(crate) async fn readlink_with(&self, ino: Ino, fresh: bool) -> Result<String> {
        let now = Instant::now();
        if !fresh {
            if let Some(t) = self.cache().link(ino, now) {
                return Ok(t);
            }
        }
        match self.call(To::Home(ino), Op::ReadLink { ino }, Bytes::new()).await? {
            (Reply::Link(t), _) => {
                self.cache().put_link(ino, &t, now);
                Ok(t)
            }
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// Check access to `ino` as access(2) does (`mask` of R_OK=4, W_OK=2, X_OK=1; 0 =
    /// exists), always at the server.
    pub async fn access(&self, ino: Ino, mask: u32) -> Result<()> {
        self.access_inner(ino, mask).await.map_err(|e| e.within(format_args!("access {ino}")))
    }

    pub(crate) async fn access_inner(&self, ino: Ino, mask: u32) -> Result<()> {
        expect_ok(self.call(To::Home(ino), Op::Access { ino, mask }, Bytes::new()).await?.0)
    }

    /// Set the default layout of new files in directory `dir`.
    pub async fn set_dir_layout(&self, dir: Ino, spec: LayoutSpec) -> Result<()> {
        self.set_dir_layout_in(dir, spec).await.map_err(|e| e.within(format_args!("set layout of directory {dir}")))
    }

    pub(crate) async fn set_dir_layout_in(&self, dir: Ino, spec: LayoutSpec) -> Result<()> {
        let r = self.call(To::Home(dir), Op::SetDirLayout { ino: dir, spec }, Bytes::new()).await;
        self.cache().forget_attr(dir);
        expect_ok(r?.0)
    }

    /// Mark `ino` read-mostly (`on`) or clear the mark (docs/loading.md): entries created
    /// later in a read-mostly directory inherit it, and clients fetch such a directory's
    /// listing whole to answer look-ups in it. Owner or root only (EPERM); EOPNOTSUPP from
    /// a server that predates the mark. Returns the new attributes.
    pub async fn set_read_mostly_at(&self, ino: Ino, on: bool) -> Result<Attr> {
        self.set_read_mostly_in(ino, on).await.map_err(|e| e.within(format_args!("mark {ino} read-mostly")))
    }

    pub(crate) async fn set_read_mostly_in(&self, ino: Ino, on: bool) -> Result<Attr> {
        let home = self.home_of(ino);
        if !self.server_has(home, shoal_proto::hello::FEATURE_READ_MOSTLY).await? {
            return Err(Error::new(
                Errno::ENOTSUP,
                format!("server {home} does not keep read-mostly marks (it predates protocol 9)"),
            ));
        }
        let r = self.call(To::Home(ino), Op::SetReadMostly { ino, on }, Bytes::new()).await;
        self.cache().forget_attr(ino);
        match r?.0 {
            Reply::Attr(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    /// Set extended attribute `name` of `ino`. `create_only` fails with EEXIST if it exists,
    /// `replace_only` with ENODATA if it does not.
    pub async fn setxattr(
        &self,
        ino: Ino,
        name: &str,
        value: &[u8],
        create_only: bool,
        replace_only: bool,
    ) -> Result<()> {
        let op = Op::SetXattr { ino, name: name.to_string(), value: value.to_vec(), create_only, replace_only };
        let r = self.call(To::Home(ino), op, Bytes::new()).await;
        r.and_then(|(reply, _)| expect_ok(reply)).map_err(|e| e.within(format_args!("setxattr {name:?} of {ino}")))
    }

    /// The value of extended attribute `name` of `ino` (ENODATA if it has none).
    pub async fn getxattr(&self, ino: Ino, name: &str) -> Result<Vec<u8>> {
        let op = Op::GetXattr { ino, name: name.to_string() };
        match self.call(To::Home(ino), op, Bytes::new()).await {
            Ok((Reply::Xattr(v), _)) => Ok(v),
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => Err(e),
        }
        .map_err(|e| e.within(format_args!("getxattr {name:?} of {ino}")))
    }

    /// Names of the extended attributes of `ino`.
    pub async fn listxattr(&self, ino: Ino) -> Result<Vec<String>> {
        match self.call(To::Home(ino), Op::ListXattr { ino }, Bytes::new()).await {
            Ok((Reply::XattrNames(v), _)) => Ok(v),
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => Err(e),
        }
        .map_err(|e| e.within(format_args!("listxattr {ino}")))
    }

    /// Remove extended attribute `name` of `ino`.
    pub async fn removexattr(&self, ino: Ino, name: &str) -> Result<()> {
        let op = Op::RemoveXattr { ino, name: name.to_string() };
        let r = self.call(To::Home(ino), op, Bytes::new()).await;
        r.and_then(|(reply, _)| expect_ok(reply)).map_err(|e| e.within(format_args!("removexattr {name:?} of {ino}")))
    }

    // ---- whole cluster ----

    /// Capacity and free space summed over all servers that take part in placement.
    /// Servers that do not answer count as down; it is an error only if none answers.
    pub async fn statfs(&self) -> Result<StatFs> {
        let servers: Vec<ServerId> =
            self.pool().map().servers.iter().filter(|s| s.state != ServerState::Out).map(|s| s.server_id()).collect();
        let answers: Vec<Result<_>> = futures::stream::iter(servers.iter().copied())
            .map(|s| async move {
                match self.call(To::Server(s), Op::StatFs, Bytes::new()).await? {
                    (Reply::StatFs(out), _) => Ok(out),
                    (other, _) => Err(unexpected(&other)),
                }
            })
            .buffer_unordered(self.max_in_flight())
            .collect()
            .await;
        let mut total = StatFs { servers_total: servers.len(), ..Default::default() };
        let mut first_error = None;
        for a in answers {
            match a {
                Ok(out) => {
                    total.capacity_bytes += out.capacity_bytes;
                    total.free_bytes += out.free_bytes;
                    total.inodes += out.inodes;
                    total.servers_up += 1;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if total.servers_up == 0 => Err(e.within("statfs: no server answered")),
            _ => Ok(total),
        }
    }

    /// What one server reports about itself.
    pub async fn server_status(&self, server: ServerId) -> Result<ServerStatus> {
        match self.call(To::Server(server), Op::Status, Bytes::new()).await {
            Ok((Reply::Status(s), _)) => Ok(s),
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => Err(e),
        }
        .map_err(|e| e.within(format_args!("status of server {server}")))
    }

    /// The status of every server in the map (asked in parallel), in map order.
    pub async fn status_all(&self) -> Vec<(ServerId, Result<ServerStatus>)> {
        let servers: Vec<ServerId> = self.pool().map().servers.iter().map(|s| s.server_id()).collect();
        let answers = futures::future::join_all(servers.iter().map(|&s| self.server_status(s))).await;
        servers.into_iter().zip(answers).collect()
    }
}

/// The indexes of the operations one batch request carried, and its answer.
type BatchAnswer = (Vec<usize>, Result<(Reply, Bytes)>);

/// Where one operation of a batch goes.
fn batch_to(op: &BatchOp) -> To {
    match op {
        BatchOp::Create { dir, name, .. }
        | BatchOp::Mkdir { dir, name, .. }
        | BatchOp::Symlink { dir, name, .. }
        | BatchOp::Unlink { dir, name }
        | BatchOp::Rmdir { dir, name }
        | BatchOp::Lookup { dir, name } => To::entry(*dir, name),
        BatchOp::GetAttr { ino } => To::Home(*ino),
    }
}

/// The operations `pending` (indexes into `ops`, ascending) grouped by the server `server_of`
/// names, each group cut into requests of at most [`BATCH_MAX`]; indexes stay ascending
/// within a request, so results go back to the caller's order.
fn group_batch(ops: &[BatchOp], pending: &[usize], server_of: impl Fn(&BatchOp) -> ServerId) -> Vec<Vec<usize>> {
    let mut by_server: std::collections::BTreeMap<ServerId, Vec<usize>> = Default::default();
    for &i in pending {
        by_server.entry(server_of(&ops[i])).or_default().push(i);
    }
    by_server.into_values().flat_map(|idx| idx.chunks(BATCH_MAX).map(<[usize]>::to_vec).collect::<Vec<_>>()).collect()
}

/// Name an unreachable server in the error; hand other errnos on bare.
fn server_error(pool: &Pool, server: ServerId, e: CallError) -> Error {
    match (pool.map().server(server), e) {
        (None, e) => Error::new(e.errno(), format!("server {server} is not in the cluster map")),
        (Some(s), CallError::Transport { errno, reason, .. }) => {
            Error::new(errno, format!("server {server} ({}) unreachable", s.addr)).with_detail(reason)
        }
        // A message that only repeats the errno's text adds nothing.
        (Some(_), CallError::Server { errno, message }) if message.is_empty() || message == errno.description() => {
            Error::bare(errno)
        }
        (Some(_), CallError::Server { errno, message }) => {
            Error::bare(errno).with_detail(format!("server {server}: {message}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::msg::{Cred, Timestamp};

    /// A call's future is moved whole whenever it goes into a task or a `FuturesUnordered`;
    /// connecting (TLS, Hello, authentication) is boxed so that calls stay small (moving a
    /// connect-sized future per create was 10 % of a client's CPU, see `Pool::conn`). Was
    /// 6,016 bytes for `create_at`, 2,880 with connecting and the call boxed, 3,648 with
    /// directory leases.
    #[test]
    fn a_call_future_stays_small() {
        let map = ClusterMap::local(1, 1, std::path::Path::new("/tmp"));
        let client = Client::new(map, ClientOptions::default());
        let create = client.create_at(Ino(1), "x", 0o644, true, None);
        assert!(
            std::mem::size_of_val(&create) <= 4096,
            "create_at's future is {} bytes",
            std::mem::size_of_val(&create)
        );
        let lookup = client.lookup(Ino(1), "x");
        assert!(std::mem::size_of_val(&lookup) <= 4096, "lookup's future is {} bytes", std::mem::size_of_val(&lookup));
    }

    fn file(perm: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: Ino(7),
            kind: FileKind::File,
            perm,
            uid,
            gid,
            size: 0,
            nlink: 1,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            blocks_bytes: 0,
            layout: None,
            dir_default: None,
            parent: None,
            read_mostly: false,
        }
    }

    #[test]
    fn local_permission_rules() {
        let me = Cred { uid: 10, gid: 20, groups: vec![30] };
        assert!(may_access(&file(0o600, 10, 0), &me, 6));
        assert!(!may_access(&file(0o400, 10, 0), &me, 2));
        assert!(may_access(&file(0o040, 1, 30), &me, 4));
        assert!(!may_access(&file(0o604, 1, 30), &me, 4), "group bits apply, not other");
        assert!(may_access(&file(0o004, 1, 1), &me, 4));
        assert!(may_access(&file(0o000, 1, 1), &me, 0));
        assert!(may_access(&file(0o000, 1, 1), &Cred::root(), 6));
        assert!(!may_access(&file(0o600, 1, 1), &Cred::root(), 1));
        assert!(may_access(&file(0o100, 1, 1), &Cred::root(), 1), "root may execute when anyone may");
        let member = Cred { uid: 11, gid: 99, groups: vec![20] };
        assert!(may_access(&file(0o640, 10, 20), &member, 4) && !may_access(&file(0o640, 10, 20), &member, 2));
    }

    #[test]
    fn unexpected_replies_are_protocol_errors() {
        let e = unexpected(&Reply::Written { len: 3 });
        assert_eq!(e.errno, Errno::EPROTO);
        assert_eq!(e.context, "unexpected Written reply");
        assert!(expect_ok(Reply::Data).is_err());
        assert!(expect_ok(Reply::Ok).is_ok());
    }

    #[test]
    fn unreachable_servers_are_named() {
        let map = ClusterMap::local(2, 7400, Path::new("/tmp"));
        let pool = Pool::new(map, PoolOptions::default());
        let lost = CallError::Transport {
            errno: Errno::ENOTCONN,
            reason: "connection closed by the server".into(),
            refused: false,
        };
        let e = server_error(&pool, ServerId(1), lost).within("stat /a");
        assert_eq!(e.context, "stat /a: server s1 (127.0.0.1:7401) unreachable");
        assert_eq!(
            e.to_string(),
            "stat /a: server s1 (127.0.0.1:7401) unreachable: Transport endpoint is not connected (connection closed by the server)"
        );
        let refused = CallError::Server { errno: Errno::ENOTEMPTY, message: "directory 7 is not empty".into() };
        let e = server_error(&pool, ServerId(1), refused).within("rmdir /d");
        assert_eq!(e.context, "rmdir /d");
        assert_eq!(e.to_string(), "rmdir /d: Directory not empty (server s1: directory 7 is not empty)");
        let plain = CallError::Server { errno: Errno::ENOENT, message: Errno::ENOENT.description() };
        assert_eq!(server_error(&pool, ServerId(1), plain).to_string(), "No such file or directory");
    }

    #[test]
    fn batches_are_grouped_by_the_partition_server_of_each_name_in_the_callers_order() {
        let map = ClusterMap::local(4, 1, Path::new("/tmp"));
        let client = Client::new(map.clone(), ClientOptions::default());
        let dir = Ino(42);
        let names: Vec<String> = (0..3 * BATCH_MAX).map(|i| format!("n{i}")).collect();
        let ops: Vec<BatchOp> = names.iter().map(|n| BatchOp::Lookup { dir, name: n.clone() }).collect();
        let all: Vec<usize> = (0..ops.len()).collect();
        let pool = client.pool();
        // Unsplit (no bitmap known): everything to the home, in BATCH_MAX chunks, in order.
        let groups = group_batch(&ops, &all, |op| client.target(&pool, batch_to(op)));
        assert_eq!(groups.len(), 3);
        assert_eq!(groups.concat(), all);
        // Split in 4: each request holds names of one server only, none bigger than
        // BATCH_MAX, ascending, and every operation is in exactly one request.
        let mut b = shoal_placement::Bitmap::new();
        b.split(0).unwrap();
        b.split(0).unwrap();
        b.split(1).unwrap();
        client.shared.bitmaps.learn(dir, b.clone().into()).unwrap();
        assert_eq!(client.dir_bitmap(dir), Vec::<u64>::from(b.clone()));
        let groups = group_batch(&ops, &all, |op| client.target(&pool, batch_to(op)));
        let mut seen: Vec<usize> = Vec::new();
        let mut servers = std::collections::HashSet::new();
        for g in &groups {
            assert!(!g.is_empty() && g.len() <= BATCH_MAX);
            assert!(g.windows(2).all(|w| w[0] < w[1]));
            let server = map.entry_home(dir, &b, &names[g[0]]).1;
            assert!(g.iter().all(|&i| map.entry_home(dir, &b, &names[i]).1 == server));
            servers.insert(server);
            seen.extend(g);
        }
        seen.sort();
        assert_eq!(seen, all);
        assert_eq!(servers.len(), 4);
        // A retry round regroups only what is pending.
        let pending = vec![1, 5, 9];
        let groups = group_batch(&ops, &pending, |op| client.target(&pool, batch_to(op)));
        let mut again: Vec<usize> = groups.concat();
        again.sort();
        assert_eq!(again, pending);
        // A GetAttr goes to the inode's home.
        assert!(matches!(batch_to(&BatchOp::GetAttr { ino: Ino(7) }), To::Home(Ino(7))));
    }

    #[test]
    fn a_name_is_routed_by_the_learnt_bitmap() {
        let map = ClusterMap::local(4, 1, Path::new("/tmp"));
        let client = Client::new(map.clone(), ClientOptions::default());
        let pool = client.pool();
        let dir = Ino(1234);
        let name = (0..100)
            .map(|i| format!("x{i}"))
            .find(|n| {
                map.entry_home(
                    dir,
                    &{
                        let mut b = shoal_placement::Bitmap::new();
                        b.split(0).unwrap();
                        b
                    },
                    n,
                )
                .1 != map.home_of(dir)
            })
            .expect("some name moves");
        assert_eq!(client.target(&pool, To::entry(dir, &name)), map.home_of(dir), "unsplit: the home");
        let mut b = shoal_placement::Bitmap::new();
        b.split(0).unwrap();
        client.shared.bitmaps.learn(dir, b.clone().into()).unwrap();
        assert_eq!(client.target(&pool, To::entry(dir, &name)), map.entry_home(dir, &b, &name).1);
        assert_ne!(client.target(&pool, To::entry(dir, &name)), map.home_of(dir));
    }

    #[test]
    fn the_client_offers_split_directories_in_hello() {
        let opts = pool_options(&ClientOptions::default(), 1, None);
        assert_ne!(opts.features & shoal_proto::hello::FEATURE_PARTITIONS, 0);
    }

    #[test]
    fn config_errors_name_the_file() {
        let Err(e) = Client::from_config(Path::new("/nonexistent/cluster.toml"), ClientOptions::default()) else {
            panic!("loaded a missing file")
        };
        assert_eq!(e.errno, Errno::ENOENT);
        assert!(e.to_string().contains("/nonexistent/cluster.toml"), "{e}");
    }
}
