//! `shoald`: the one kind of Shoal server. It holds directory objects (a directory's inode
//! and its entries), file inodes and data objects, and answers every request a client or
//! another server sends it. See docs/architecture.md for the design; in short:
//!
//! * `net` accepts connections, reads frames and writes replies; every request runs in its
//!   own task, so one connection carries many requests at once.
//! * `dispatch` routes each operation to its handler in `ops` and counts it.
//! * `store::meta` is the RocksDB metadata store, `store::data` the object files.
//! * `steps` runs operations that span servers (intent → remote steps → finish) for live
//!   requests and for `intents`, the recovery loop that completes (or rolls back) what a
//!   crash interrupted; its failpoints let tests crash a server at any step.
//! * `locks` serialises changes to one directory or inode; `perm` decides who may do what.
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! let opts = shoal_server::ServerOptions {
//!     config: "cluster.toml".into(), id: 0, data_dir: None, listen: None, http_listen: None,
//!     max_connections: 0, handshake_timeout: std::time::Duration::from_secs(10),
//!     orphan_grace: shoal_server::DEFAULT_ORPHAN_GRACE,
//!     lease_max: shoal_server::leases::DEFAULT_MAX, throttle_mb_s: None,
//!     resync_mib_s: shoal_server::RESYNC_MIB_PER_S,
//!     resync_busy_mib_s: shoal_server::RESYNC_BUSY_MIB_PER_S,
//! };
//! shoal_server::run(opts).await // until SIGINT or SIGTERM
//! # }
//! ```

mod auth;
mod caps;
mod conn_io;
mod counters;
mod dispatch;
mod error;
mod failover;
mod http;
mod intents;
pub mod leases;
mod limits;
pub mod load;
mod locks;
mod map_cell;
pub mod membership;
mod metrics;
mod moves;
mod net;
mod ops;
mod orphans;
mod partitions;
mod perm;
mod quiesce;
mod rejoin;
mod replica;
pub use replica::resync::{RESYNC_BUSY_MIB_PER_S, RESYNC_MIB_PER_S};
mod replies;
mod scrub;
mod scrub_repair;
mod state;
pub mod status_view;
mod steps;
mod store;
mod tls_conn;

pub use steps::failpoints::configure as configure_failpoints;

pub use store::records::FORMAT_VERSION;
pub use store::upgrade::stored_format;

use anyhow::{anyhow, Context};
use shoal_placement::ClusterMap;
use shoal_proto::msg::FileKind;
use shoal_proto::{ServerId, ROOT_INO};
use shoal_rpc::{Pool, PoolOptions};
use state::State;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::data::DataStore;
use store::meta::{InodeRecord, MetaStore};
use store::space::Space;
use tokio::net::TcpListener;

/// How a server is started (the `shoald` command line).
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The cluster map (TOML).
    pub config: PathBuf,
    /// This server's id in the map.
    pub id: u32,
    /// Overrides the map entry's `data_dir`.
    pub data_dir: Option<PathBuf>,
    /// Overrides the address to listen on (default: the map entry's `addr`).
    pub listen: Option<String>,
    /// Overrides the address of the HTTP service (default: the map entry's `http`; none
    /// when neither is set).
    pub http_listen: Option<String>,
    /// Connections held at once; 0 = derived from the descriptor limit (see `limits`).
    pub max_connections: usize,
    /// A connection that has not completed `Hello` within this time is closed.
    pub handshake_timeout: Duration,
    /// How long a file removed while open (an orphan) outlives the last connection of the
    /// client that has it open; see `orphans.rs`.
    pub orphan_grace: Duration,
    /// Longest directory lease granted to a client (`leases.rs`); zero grants none. A
    /// change waits at most this (plus a margin) for a holder that does not answer.
    pub lease_max: Duration,
    /// Limit this server's data reads and writes to this many MB/s (`shoald --throttle`:
    /// a tool for tests and benchmarks of load-aware placement, `load.rs`).
    pub throttle_mb_s: Option<f64>,
    /// Most MiB per second a resync ships to one mirror (`shoald --resync-mb-s`; default
    /// [`RESYNC_MIB_PER_S`]): a move, a new mirror or a returning server is
    /// copied at this rate, so that foreground I/O keeps most of its speed.
    pub resync_mib_s: u32,
    /// The same while clients read or write file data on this server (`shoald
    /// --resync-busy-mb-s`; default [`RESYNC_BUSY_MIB_PER_S`], at most `resync_mib_s`):
    /// recovery yields to the clients.
    pub resync_busy_mib_s: u32,
}

pub use orphans::DEFAULT_GRACE as DEFAULT_ORPHAN_GRACE;

/// Timeout of a call to another server. Shorter than a client's, so that a client waiting
/// on an operation that spans servers hears about an unreachable peer before giving up.
const PEER_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval of the background WAL sync (the power-loss window for metadata).
const WAL_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Under `[security] tls`: the acceptor of TLS connections, from the server certificate
/// and key the map names (a missing or unreadable file is a one-line start-up error).
fn load_tls(map: &ClusterMap, config: &std::path::Path) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
    if !map.security.tls {
        return Ok(None);
    }
    let cfg = shoal_rpc::tls::server_config(&map.security)
        .map_err(|m| anyhow!("{m} (make the TLS files with `shoal keygen --config {}`)", config.display()))?;
    Ok(Some(tokio_rustls::TlsAcceptor::from(cfg)))
}

/// The data directory holds names of files in 0700 directories and private xattr values
/// (the metadata store) and every file's bytes: no other user of the host may enter it.
/// A directory made by an older version (0755) is tightened to 0700, with a warning; what
/// the server creates inside is 0600/0700 by shoald's umask.
fn keep_private(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make data directory {} private (mode 0700)", dir.display()))?;
        tracing::warn!(
            "data directory {} was mode {:04o}, open to other users of this host: now 0700",
            dir.display(),
            mode & 0o7777
        );
    }
    Ok(())
}

/// The cluster key ring the map's `[security]` table names, or `None` under `auth = "none"`
/// (said once in the log, since such a server trusts whoever reaches its port).
fn load_cluster_key(map: &ClusterMap, config: &std::path::Path) -> anyhow::Result<Option<shoal_auth::KeyRing>> {
    match map.security.auth {
        shoal_placement::map::AuthMode::None => {
            tracing::warn!(
                "authentication is off (auth = \"none\" in {}): anyone who reaches this server's port is trusted",
                config.display()
            );
            Ok(None)
        }
        shoal_placement::map::AuthMode::Keys => {
            shoal_auth::KeyRing::load(&map.security.cluster_key, shoal_auth::KeyKind::Cluster).map(Some).map_err(|e| {
                anyhow!(
                    "{e} (make the keys with `shoal keygen --config {}`, or set auth = \"none\" under [security] to run without authentication)",
                    config.display()
                )
            })
        }
    }
}

/// A server whose stores are open, ready to serve on a listener.
pub struct Server {
    state: Arc<State>,
    listen: String,
    /// Where the HTTP service listens, if anywhere.
    http_listen: Option<String>,
    /// The HTTP address this server's entry in the map file gives (a failover drops it from
    /// the replicated map; `rejoin::restore_http` puts it back).
    advertised_http: Option<String>,
    /// The cluster map file (the HTTP gateway's client reloads it).
    config: PathBuf,
    limits: limits::ConnLimits,
    orphan_grace: Duration,
    /// Under `[security] tls`: the TLS configuration of accepted connections.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Server {
    /// Load the map, open (creating if needed) the data directory, create the root
    /// directory if this server is its home, and prune old markers. Does not listen yet.
    pub async fn open(opts: &ServerOptions) -> anyhow::Result<Server> {
        Self::open_as(opts, rejoin::Mode::Primary { replies: None }, None).await
    }

    /// [`Server::open`] as the slot's primary or standing by to take it back (`rejoin.rs`).
    /// `known`: the newest map this process saw before (opened again), if newer than the file.
    async fn open_as(opts: &ServerOptions, mode: rejoin::Mode, known: Option<ClusterMap>) -> anyhow::Result<Server> {
        let standby = matches!(mode, rejoin::Mode::Standby { .. });
        // The process's first start (not opened again after standing by or a handback).
        let first_start = matches!(mode, rejoin::Mode::Primary { replies: None }) && known.is_none();
        let file = ClusterMap::load(&opts.config).map_err(|e| anyhow!("{e}"))?;
        // Where this server lives (its address, data and HTTP port) is the file's entry: a
        // newer map may name the address of a copy serving its slot.
        let entry = file
            .server(ServerId(opts.id))
            .ok_or_else(|| anyhow!("server id {} is not in cluster config {}", opts.id, opts.config.display()))?
            .clone();
        let map = match known {
            Some(k) if k.version() > file.version() => k,
            _ => file,
        };
        refuse_if_retired(&map, ServerId(opts.id))?;
        let data_dir = opts.data_dir.clone().or(entry.data_dir.clone()).ok_or_else(|| {
            anyhow!(
                "no data directory for server {}: give --data-dir or set data_dir in {}",
                opts.id,
                opts.config.display()
            )
        })?;
        let listen = opts.listen.clone().unwrap_or(entry.addr.clone());
        let http_listen = opts.http_listen.clone().or(entry.http.clone());
        let id = ServerId(opts.id);
        let keys = load_cluster_key(&map, &opts.config)?;
        let tls = load_tls(&map, &opts.config)?;
        let limits = conn_limits(opts, map.servers.len());
        let dd = data_dir.clone();
        let lease_max = opts.lease_max;
        let (meta, data, space, fresh) =
            tokio::task::spawn_blocking(move || -> anyhow::Result<(MetaStore, DataStore, Space, bool)> {
                std::fs::create_dir_all(&dd)
                    .with_context(|| format!("cannot create data directory {}", dd.display()))?;
                keep_private(&dd)?;
                // On a nearly full disk, opening the store needs the reserve's space.
                let space = Space::new(&dd);
                space.prepare_for_open();
                let meta = MetaStore::open(&dd.join("meta")).map_err(|e| anyhow!(e))?;
                meta.set_leases(Arc::new(leases::Leases::new(lease_max)));
                // A store without its format record was made just now (a new server, or one
                // whose disk was wiped): see `replica::refuse_empty_over_mirrors`.
                let fresh = meta.get_raw(store::meta::key::FORMAT).map_err(|e| anyhow!("{e}"))?.is_none();
                store::upgrade::check_and_upgrade(&meta, id, &dd)?;
                let data = DataStore::open(&dd.join("objects"))
                    .with_context(|| format!("cannot create object directories under {}", dd.display()))?;
                // Writes acknowledged before a restart were only in the page cache; make them
                // durable now, since the dirty-object list that fsync relies on starts empty.
                if let Err(e) = data.syncfs() {
                    tracing::warn!("syncfs {}: {e}", dd.display());
                }
                space.upkeep();
                Ok((meta, data, space, fresh))
            })
            .await
            .map_err(|e| anyhow!("start-up task failed: {e}"))??;

        let state_cell: Arc<std::sync::OnceLock<std::sync::Weak<State>>> = Arc::default();
        let pool = peer_pool(map.clone(), id, &state_cell);
        let parts = partitions::Partitions::load(meta.partitions().map_err(|e| anyhow!("{e}"))?);
        let home = entry.addr.clone();
        let mut state = State::new(id, map, data_dir, Arc::new(meta), Arc::new(data), space, pool, keys);
        state.parts = parts;
        state.load = load::Load::new(id, opts.throttle_mb_s);
        state.rejoin = rejoin::Rejoin::new(&mode, home, state_cell.clone());
        if let rejoin::Mode::Primary { replies: Some(r) } = mode {
            state.replies = r;
        }
        state.replica = if standby {
            replica::Replication::open_standby(&state).await
        } else {
            replica::Replication::open(&state).await
        }
        .map_err(|e| anyhow!("{e}"))?;
        let _ = state.failover.options.set(opts.clone());
        if let Some(mb) = opts.throttle_mb_s {
            tracing::warn!("data reads and writes throttled to {mb} MB/s (--throttle)");
        }
        let state = Arc::new(state);
        let _ = state_cell.set(Arc::downgrade(&state));
        if fresh && !standby {
            replica::refuse_empty_over_mirrors(&state).await?;
        }
        let may_hand_off = first_start && !fresh && state.replica.crashed;
        // No promotion of another slot until this server knows whether it serves.
        state.failover.held.store(may_hand_off, std::sync::atomic::Ordering::SeqCst);
        membership::start(&state, state_cell.clone(), &opts.config, &state.data_dir).await?;
        membership::catch_up_at_start(&state, &opts.config).await;
        refuse_if_retired(state.map.get(), id)?;
        if may_hand_off && state.stop.borrow().is_none() {
            rejoin::hand_off_hosted(&state, &failover::map_base(&state)).await;
            let handing_off = rejoin::mirror_to_hand_off(&state).await;
            if handing_off.is_none() {
                // Serving: promote what the map wants promoted here, held back meanwhile.
                state.failover.held.store(false, std::sync::atomic::Ordering::SeqCst);
                failover::on_map(&state);
            }
            if let Some(mirror) = handing_off {
                let until = Instant::now() + rejoin::HAND_OFF_WITHIN;
                rejoin::reopen_as(
                    &state,
                    rejoin::Mode::Standby { hand_off: Some(until) },
                    format!(
                        "server {id}: started after a crash; its stores may hold a change it never acknowledged, so \
                         its mirror {mirror}, which holds every acknowledged one and their replies, is to serve the \
                         slot: standing by to take it back"
                    ),
                );
            }
        }
        if !may_hand_off {
            // Act on the map this process opens with (it may follow no newer one for a
            // while): stand by if the slot failed over, serve again the copies served here
            // before the process opened again (those stop with it: `failover.rs`).
            failover::on_map(&state);
        }
        let advertised_http = entry.http.clone();
        let server = move |state| Server {
            state,
            listen,
            http_listen,
            advertised_http,
            config: opts.config.clone(),
            limits,
            orphan_grace: opts.orphan_grace,
            tls,
        };
        if standby || state.stop.borrow().is_some() {
            // Its stores are out of date (or it is to stand by: the map says its slot is
            // served from a copy): nothing is created, replayed or pruned on them.
            return Ok(server(state));
        }

        let st = state.clone();
        let pending = state
            .blocking(move |st| {
                make_root_if_home(st)?;
                let pruned = st.meta.prune_applied(now_secs(), intents::APPLIED_MAX_AGE_SECS)?;
                if pruned > 0 {
                    tracing::info!("pruned {pruned} old applied markers");
                }
                st.meta.intents()
            })
            .await
            .map_err(|e| anyhow!("{e}"))?;
        if !pending.is_empty() {
            tracing::info!("{} intents to replay", pending.len());
        }
        intents::pin_pending(&st, &pending).map_err(|e| anyhow!("{e}"))?;
        Ok(server(state))
    }

    /// A server for `slot` over the stores of the mirror `host` kept of it (`failover.rs`),
    /// routing by `map` (the map that moves the slot to `host`). Its replies cache is the
    /// mirror's copy of the old primary's, so a retried request is still applied once.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn open_promoted(
        host: &Arc<State>,
        slot: ServerId,
        opts: &ServerOptions,
        map: ClusterMap,
        data_dir: PathBuf,
        meta: Arc<MetaStore>,
        data: Arc<DataStore>,
        replies: Arc<replies::Replies>,
    ) -> anyhow::Result<Server> {
        let keys = load_cluster_key(&map, &opts.config)?;
        let tls = load_tls(&map, &opts.config)?;
        let limits = conn_limits(opts, map.servers.len());
        meta.set_leases(Arc::new(leases::Leases::new(opts.lease_max)));
        let space = Space::new(&data_dir);
        let state_cell: Arc<std::sync::OnceLock<std::sync::Weak<State>>> = Arc::default();
        let pool = peer_pool(map.clone(), slot, &state_cell);
        let parts = partitions::Partitions::load(meta.partitions().map_err(|e| anyhow!("{e}"))?);
        let mut state = State::new(slot, map, data_dir, meta, data, space, pool, keys);
        state.parts = parts;
        state.replies = replies;
        state.failover = failover::Failover::promoted_on(host.id);
        state.rejoin = rejoin::Rejoin::new(&rejoin::Mode::Primary { replies: None }, String::new(), state_cell.clone());
        let _ = state.failover.options.set(opts.clone());
        state.replica = replica::Replication::open_promoted(&state);
        let state = Arc::new(state);
        let _ = state_cell.set(Arc::downgrade(&state));
        if let Some(group) = host.membership.get() {
            let _ = state.membership.set(group.clone());
        }
        let pending = state
            .blocking(|st| {
                make_root_if_home(st)?;
                st.meta.intents()
            })
            .await
            .map_err(|e| anyhow!("{e}"))?;
        intents::pin_pending(&state, &pending).map_err(|e| anyhow!("{e}"))?;
        Ok(Server {
            listen: String::new(),
            http_listen: None,
            advertised_http: None,
            config: opts.config.clone(),
            limits,
            orphan_grace: opts.orphan_grace,
            tls,
            state,
        })
    }

    /// The server's shared state.
    pub(crate) fn state(&self) -> Arc<State> {
        self.state.clone()
    }

    /// Close the stores without serving (a promotion that did not happen).
    pub(crate) async fn close(self) {
        let st = self.state;
        st.pool.close();
        let _ = st.blocking(|st| st.meta.sync_wal()).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut st = st;
        while let Err(s) = Arc::try_unwrap(st) {
            if Instant::now() >= deadline {
                tracing::warn!("a store stays open: something still holds it");
                return;
            }
            st = s;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The address this server listens on unless told otherwise.
    pub fn listen_addr(&self) -> &str {
        &self.listen
    }

    pub fn id(&self) -> ServerId {
        self.state.id
    }

    /// Bind the listen address.
    pub async fn bind(&self) -> anyhow::Result<TcpListener> {
        TcpListener::bind(&self.listen).await.with_context(|| format!("cannot listen on {}", self.listen))
    }

    /// Serve on `listener` until `shutdown` completes, then stop background work, sync the
    /// metadata log and close the stores.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let st = self.state;
        let http = match &self.http_listen {
            Some(at) => {
                let l = TcpListener::bind(at).await.with_context(|| format!("cannot listen for HTTP on {at}"))?;
                let gw = Arc::new(http::Gateway::new(st.clone(), &self.config)?);
                Some(tokio::spawn(http::serve(gw, l)))
            }
            None => None,
        };
        let addr: Option<SocketAddr> = listener.local_addr().ok();
        eprintln!("shoald {} listening on {}", st.id, addr.map_or(self.listen.clone(), |a| a.to_string()));
        tracing::info!("server {} serving (map version {})", st.id, st.map.version());
        match st.key_ring() {
            Some(ring) => tracing::info!("cluster key epochs {:?} (signing with {})", ring.epochs(), ring.current().0),
            None => tracing::warn!("serving without authentication"),
        }

        let wal = tokio::spawn(wal_sync_loop(st.clone()));
        // Standing by, the stores are out of date: nothing is recovered, collected or
        // reclaimed on them (the copy serving the slot does it).
        // Nor on stores that stopped serving before they began (a hand-off after a crash:
        // `rejoin::mirror_to_hand_off`), and nothing is shipped from them.
        let active = !st.rejoin.standby && st.stop.borrow().is_none();
        let recovery = tokio::spawn(run_if(active, intents::recovery_loop(st.clone())));
        let gc = tokio::spawn(run_if(active, intents::gc_loop(st.clone())));
        let reclaim = tokio::spawn(run_if(active, orphans::reclaim_loop(st.clone(), self.orphan_grace)));
        let reload = tokio::spawn(reload_keys_on_sighup(st.clone()));
        let load_exchange = tokio::spawn(load::exchange_loop(st.clone()));
        if let Some(http) = self.advertised_http.clone().filter(|_| active) {
            tokio::spawn(rejoin::restore_http(st.clone(), http));
        }
        if active {
            // The slot's own server standing by is shipped by `ship::home_loop` (`rejoin.rs`).
            replica::start_shippers(&st);
        }
        if self.tls.is_some() {
            tracing::info!("every connection is TLS 1.3");
        }
        // Also ends when the server must stop serving (`State::stop_serving`).
        let mut stopped = st.stop.subscribe();
        let shutdown = async move {
            tokio::select! {
                _ = shutdown => {}
                _ = stopped.wait_for(|r| r.is_some()) => {}
            }
        };
        net::accept_loop(st.clone(), listener, self.limits, self.tls, shutdown).await;
        let stop_reason = st.stop.borrow().clone();
        tracing::info!("server {} shutting down", st.id);
        // Slots served here from mirror copies stop with this process.
        st.stop.send_if_modified(|r| {
            let was = r.is_none();
            r.get_or_insert_with(|| "shutting down".into());
            was
        });
        for h in st.failover.take_served() {
            let _ = h.await;
        }
        if let Some(http) = http {
            http.abort();
            let _ = http.await;
        }
        wal.abort();
        recovery.abort();
        gc.abort();
        reclaim.abort();
        reload.abort();
        load_exchange.abort();
        // A clean stop lets the mirrors take what is left first (bounded), so that the next
        // start can go on with this incarnation (`Replication::record_clean_stop`).
        let clean = stop_reason.is_none() && st.failover.host.is_none();
        if let (true, Some(log)) = (clean, &st.replica.log) {
            let _ = tokio::time::timeout(CLEAN_STOP_WAIT, log.wait_acked(log.last())).await;
        }
        // A copy handing its slot back: the slot's own server must hold every change first.
        if st.rejoin.handing_back.load(std::sync::atomic::Ordering::SeqCst) && rejoin::drain_for_handback(&st).await {
            st.rejoin.handed_back.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        // A drained server's own slot moving away (`moves.rs`): retire this process while
        // its member of the group still runs, or serve the slot again.
        let own_move = (*st.rejoin.handing_to.lock()).filter(|_| st.failover.host.is_none());
        let retired = match own_move {
            Some(to) => {
                let drained = st.rejoin.handed_back.load(std::sync::atomic::Ordering::SeqCst);
                let retired = moves::switch_own(&st, to, drained).await;
                if !retired {
                    tracing::warn!("server {}: not moved to server {to}: serving it again", st.id);
                    let again = rejoin::Mode::Primary { replies: Some(st.replies.clone()) };
                    *st.rejoin.next.lock() = Some((again, (*st.map.get()).clone()));
                }
                retired
            }
            None => false,
        };
        replica::stop_shippers(&st);
        rejoin::stop_home_shipper(&st);
        // Nothing is shipped any more: requests waiting for the mirrors give up (their
        // replies are not sent), and let the state go.
        if let Some(log) = &st.replica.log {
            log.stop();
        }
        // This process's member of the map group stops with it (a promoted slot shares its
        // host's), so that the server can open again in this process (`rejoin.rs`).
        if st.failover.host.is_none() {
            if let Some(group) = st.membership.get() {
                group.shutdown().await;
            }
        }
        let _ = load_exchange.await;
        let _ = reload.await;
        let _ = reclaim.await;
        let _ = wal.await;
        let _ = recovery.await;
        let _ = gc.await;
        // Requests still running cannot reply any more (`replica_settle`): their calls to
        // other servers fail now rather than wait out a failover, so that they let the
        // state go (a copy of a slot promoted again in this process opens the same stores).
        st.pool.close();
        rejoin::close_home_pool(&st);
        if let Err(e) = st.blocking(|st| st.meta.sync_wal()).await {
            tracing::warn!("final WAL sync: {e}");
        }
        // Requests still running hold the state; give them a moment so the database closes
        // cleanly (and a restart in the same process can open it again).
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut st = st;
        loop {
            match Arc::try_unwrap(st) {
                Ok(state) => {
                    // Nothing runs any more: nothing can append after the position recorded.
                    if clean {
                        if let Err(e) = state.replica.record_clean_stop(&state.meta) {
                            tracing::warn!(
                                "recording the clean stop: {e} (the mirrors are resynced at the next start)"
                            );
                        }
                    }
                    drop(state);
                    break;
                }
                Err(s) if Instant::now() < deadline => {
                    st = s;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(_) => {
                    tracing::warn!("requests still running at shutdown; the store closes when they end");
                    break;
                }
            }
        }
        match stop_reason {
            Some(_) if retired => Ok(()),
            Some(reason) => Err(anyhow!(reason)),
            None => Ok(()),
        }
    }
}

/// A server that was drained or removed (its entry is a slot living on another server) has
/// nothing to serve: its own stores are out of date, and serving them would show an old
/// copy of a slot that lives elsewhere.
fn refuse_if_retired(map: &ClusterMap, id: ServerId) -> anyhow::Result<()> {
    match map.server(id).and_then(|e| e.host) {
        Some(h) => Err(anyhow!(
            "server {id} was drained or removed from the cluster (map version {}): its slot lives on server {h} now, \
             so this server has nothing to serve (its data directory is no longer used); add it again as a new \
             server with `shoal server add`",
            map.version()
        )),
        None => Ok(()),
    }
}

/// How long a clean stop waits for the mirrors to apply the last changes.
const CLEAN_STOP_WAIT: Duration = Duration::from_secs(5);

/// Timeout of a call to another server that cannot be reached, while its slot may fail over
/// to a mirror (`failover.rs`): detection, election and promotion fit well inside.
const PEER_FAILOVER_WAIT: Duration = Duration::from_secs(15);

/// The pool of connections to the other servers, as server `id`, proving the cluster key
/// of the state `state_cell` will hold. Newer maps come through the group (`membership`).
pub(crate) fn peer_pool(
    map: ClusterMap,
    id: ServerId,
    state_cell: &Arc<std::sync::OnceLock<std::sync::Weak<State>>>,
) -> Pool {
    let state = state_cell.clone();
    Pool::new(
        map,
        PoolOptions {
            timeout: PEER_TIMEOUT,
            connections_per_server: 2,
            client_name: format!("shoald {id}"),
            session: 0,
            // Prove the cluster key to peers: the ring the state holds now (reloaded on
            // SIGHUP), read at each new connection.
            peer_keys: Some(shoal_rpc::auth::PeerKeys(Arc::new(move || {
                state.get().and_then(std::sync::Weak::upgrade).and_then(|st: Arc<State>| st.key_ring())
            }))),
            failover: Some(shoal_rpc::Failover { wait: PEER_FAILOVER_WAIT, refresh: None }),
            ..PoolOptions::default()
        },
    )
}

/// Raise the descriptor limit and decide how many connections to take.
fn conn_limits(opts: &ServerOptions, servers: usize) -> limits::ConnLimits {
    let nofile = limits::raise_nofile();
    let fits = limits::default_max_connections(nofile, servers);
    let max_connections = match opts.max_connections {
        0 => fits,
        n => {
            if n > fits {
                tracing::warn!(
                    "{n} connections may not fit in {nofile} descriptors with {} kept for files; \
                     at most {fits} are safe (raise `ulimit -n`)",
                    limits::reserved(servers)
                );
            }
            n
        }
    };
    tracing::info!(
        "up to {max_connections} connections (descriptor limit {nofile}), handshake timeout {:?}",
        opts.handshake_timeout
    );
    limits::ConnLimits { max_connections, handshake_timeout: opts.handshake_timeout, peer_reserve: 3 * servers }
}

fn now_secs() -> i64 {
    shoal_proto::msg::Timestamp::now().secs
}

/// Every second: sync the metadata log, keep the reserve file (see `store::space`), and
/// after a failed metadata write give the reserve back and reopen the store, so that it
/// takes writes again as soon as there is room.
async fn wal_sync_loop(st: Arc<State>) {
    loop {
        // A failed metadata write asks for the reopen at once: replies wait for it.
        tokio::select! {
            _ = tokio::time::sleep(WAL_SYNC_INTERVAL) => {}
            _ = st.meta.reopen_wanted() => {}
        }
        let r = st
            .blocking(|st| {
                st.space.upkeep();
                if st.meta.failure().is_some() {
                    st.space.release();
                    if !st.space.room_to_open() {
                        return Ok(());
                    }
                    st.meta.reopen()
                } else {
                    st.meta.sync_wal()
                }
            })
            .await;
        if let Err(e) = r {
            tracing::warn!("metadata log upkeep: {e}");
        }
    }
}

/// `work` unless `run` is false (then nothing).
async fn run_if(run: bool, work: impl Future<Output = ()>) {
    if run {
        work.await
    }
}

/// Open the stores, listen, and serve until `shutdown` completes.
pub async fn serve(opts: ServerOptions, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    serve_on(opts, None, shutdown).await
}

/// Like [`serve`], on a listener the caller bound (tests bind port 0 and put the address in
/// the map before starting).
pub async fn serve_with_listener(
    opts: ServerOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    serve_on(opts, Some(listener), shutdown).await
}

/// Serve until `shutdown` completes; open the stores again, at the same address, whenever
/// the server is to stand by for its slot or to take it back (`rejoin.rs`).
async fn serve_on(
    opts: ServerOptions,
    mut listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    use futures::future::{FusedFuture, FutureExt};
    let shutdown = shutdown.fuse();
    tokio::pin!(shutdown);
    let mut mode = rejoin::Mode::Primary { replies: None };
    let mut known = None;
    let mut at: Option<SocketAddr> = None;
    loop {
        let server = Server::open_as(&opts, mode, known.take()).await?;
        let l = match (listener.take(), at) {
            (Some(l), _) => l,
            (None, Some(a)) => TcpListener::bind(a).await.with_context(|| format!("cannot listen on {a} again"))?,
            (None, None) => server.bind().await?,
        };
        at = l.local_addr().ok();
        // Not the state itself: its stores must close when it stops.
        let next = server.state().rejoin.next.clone();
        let state = Arc::downgrade(&server.state());
        let served = server.serve(l, shutdown.as_mut()).await;
        let next = next.lock().take();
        match next {
            Some((m, map)) if !shutdown.is_terminated() => {
                mode = m;
                known = Some(map);
            }
            _ => return served,
        }
        // The stores close when the last task holding the state ends (a request waiting on
        // another server, say): only then can they be opened again.
        let since = Instant::now();
        while state.strong_count() > 0 {
            if since.elapsed() > REOPEN_WAIT {
                anyhow::bail!(
                    "the stores stayed in use for {REOPEN_WAIT:?} after serving stopped: cannot open them again"
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Make the root directory, on the slot that is its home, if it does not exist yet (a new
/// cluster: its first start, or the first serving of the slot living on another server
/// that placement made the root's home).
fn make_root_if_home(st: &State) -> crate::error::R<()> {
    if st.is_home(ROOT_INO) && st.meta.get_inode(ROOT_INO)?.is_none() {
        let now = shoal_proto::msg::Timestamp::now();
        let root = InodeRecord {
            kind: FileKind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 2,
            atime: now,
            mtime: now,
            ctime: now,
            layout: None,
            dir_default: None,
            parent: Some(ROOT_INO),
            target: None,
            bitmap: Vec::new(),
            read_mostly: false,
        };
        let mut t = st.meta.txn();
        t.put_inode(ROOT_INO, root)?;
        t.commit()?;
        tracing::info!("created the root directory");
    }
    Ok(())
}

/// Longest wait for the stores to close before they are opened again (`serve_on`): a
/// request may wait out a peer's failover (15 s) first.
const REOPEN_WAIT: Duration = Duration::from_secs(60);

/// Serve until SIGINT or SIGTERM.
pub async fn run(opts: ServerOptions) -> anyhow::Result<()> {
    serve(opts, shutdown_signal()).await
}

/// Reload the cluster key file on every SIGHUP (key rotation without a restart).
async fn reload_keys_on_sighup(st: Arc<State>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
    while hup.recv().await.is_some() {
        match st.reload_keys() {
            Ok(epochs) => tracing::info!("reloaded the cluster key: epochs {epochs:?}"),
            Err(e) => tracing::warn!("SIGHUP: cluster key not reloaded, the current one stays: {e}"),
        }
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {},
                _ = i.recv() => {},
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
