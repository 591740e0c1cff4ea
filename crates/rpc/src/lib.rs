//! Pipelined request/reply connections to Shoal servers.
//!
//! One TCP connection carries many requests at once: a writer task sends frames as callers
//! submit them, a reader task matches replies to callers by request id, so replies may come
//! back in any order. [`Pool`] keeps connections per server of a cluster map, reconnects
//! after failures, and bounds every call with a timeout so a dead server turns into an
//! error, never a hang. A server that let a call time out without saying anything at all
//! is *silent*: calls to it fail at once (see [`Pool::request`]) until it is heard from
//! again or one timeout has passed, so callers that can only ask one after another (the
//! kernel does so for lookups of one name) are not each held for a whole timeout.
//!
//! Every request has an id unique within the process (one counter for all pools), so with
//! the session sent in `Hello` it names the request on every connection. A call whose
//! connection is lost before its reply comes is sent once more, with the same id, on a new
//! connection (when the pool has a session): the server's reply cache answers it with the
//! first reply if the first copy was applied, so a retried create or append is applied once.
//!
//! ```no_run
//! # async fn f() -> Result<(), shoal_proto::Errno> {
//! use shoal_rpc::{Pool, PoolOptions};
//! use shoal_proto::msg::{Cred, Op};
//! let map = shoal_placement::ClusterMap::load("cluster.toml".as_ref()).unwrap();
//! let pool = Pool::new(map, PoolOptions::default());
//! let server = pool.map().home_of(shoal_proto::ROOT_INO);
//! let (reply, _data) = pool.call(server, &Cred::current(), Op::StatFs, bytes::Bytes::new()).await?;
//! # Ok(()) }
//! ```

pub mod auth;
pub mod tls;
pub mod tls_certs;

use bytes::Bytes;
use parking_lot::Mutex;
use shoal_placement::ClusterMap;
use shoal_proto::frame::{Frame, FrameKind};
use shoal_proto::hello::{check_answer, default_features, FEATURE_DATA_CRC, FEATURE_LEASES, MIN_PROTOCOL_VERSION};
use shoal_proto::lease::Notice;
use shoal_proto::msg::{Cred, Op, Reply, Request};
use shoal_proto::{Errno, ServerId, PROTOCOL_VERSION};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// Settings for a [`Pool`].
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// How long one call may take, connect included, before it fails with ETIMEDOUT.
    pub timeout: Duration,
    /// TCP connections per server (requests are spread over them round-robin).
    pub connections_per_server: usize,
    /// Name sent in the handshake (shows in server logs).
    pub client_name: String,
    /// Session id sent in the handshake: a random id per client instance (0 for servers),
    /// the owner of the orphans its unlinks leave (see `Op::ReleaseOrphan`), and the
    /// client id of the servers' reply cache. With a session, a call whose connection is
    /// lost is resent once on a new connection (the server applies it once).
    pub session: u64,
    /// `FEATURE_*` bits offered in `Hello` (default: all this build knows, less the data
    /// checksum under `SHOAL_DATA_CRC=off`).
    pub features: u64,
    /// Set by servers: connect as a peer, proving this cluster key ring. Without it the pool
    /// proves the host key when it can read it, else asks the identity helper (`auth.rs`).
    pub peer_keys: Option<auth::PeerKeys>,
    /// Prove the host key from this ring instead of reading the map's `host_key` file (a
    /// server's HTTP service, which derives the host ring from its cluster key and acts
    /// for the users its requests prove). Ignored when `peer_keys` is set.
    pub host_keys: Option<auth::PeerKeys>,
    /// Where notices (frames a server sends unasked: lease revocations) go, with the id of
    /// the server that sent them; `None` in place of a notice when such a connection ends
    /// (a notice may have been lost with it). Called on the connection's reader task: it
    /// must not block. Only connections that negotiated `FEATURE_LEASES` receive notices.
    pub notices: Option<NoticeSink>,
    /// With replicas (`[cluster] replicas` ≥ 2): how a call to a server that cannot be
    /// reached waits for the slot to fail over to a mirror (`Failover`). `None`: such a call
    /// fails at once, as with a single copy.
    pub failover: Option<Failover>,
}

/// How calls ride out a failover: a call whose server cannot be reached (connection refused
/// or lost, no answer in time) is sent again, same request id, for up to `wait`, each time
/// after `refresh` (which brings a newer map into the pool, if there is one: the slot's new
/// address). The same id lets the new primary's reply cache (the mirror's copy of the old
/// primary's) answer a request the old primary applied but could not answer.
#[derive(Clone)]
pub struct Failover {
    pub wait: Duration,
    pub refresh: Option<MapRefresh>,
}

impl std::fmt::Debug for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failover").field("wait", &self.wait).finish()
    }
}

/// Fetches the newest cluster map and installs it with [`Pool::set_map`].
pub type MapRefresh = Arc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// Longest pause between two attempts during a failover.
const FAILOVER_PAUSE_MAX: Duration = Duration::from_millis(400);

/// A receiver of servers' notices (see [`PoolOptions::notices`]).
#[derive(Clone)]
pub struct NoticeSink(pub Arc<dyn Fn(ServerId, Option<Notice>) + Send + Sync>);

impl std::fmt::Debug for NoticeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoticeSink")
    }
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            timeout: Duration::from_secs(30),
            connections_per_server: 2,
            client_name: "shoal-client".into(),
            session: 0,
            features: default_features(),
            peer_keys: None,
            host_keys: None,
            notices: None,
            failover: None,
        }
    }
}

/// Why a call failed: the errno callers match on, and a sentence for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The server answered with an error: its errno and the message it wrote.
    Server { errno: Errno, message: String },
    /// The server could not be asked or did not answer: ENOTCONN (refused, connection
    /// closed), ETIMEDOUT (no answer in time), EPROTO (it sent what this side cannot
    /// decode), with what happened ("connection closed by the server").
    /// `refused`: the server's host refused the connection, so nothing listens at its
    /// address (the process is dead or not started yet), which a silent or slow server never
    /// causes; the failure detector takes it as evidence of death sooner than silence.
    Transport { errno: Errno, reason: String, refused: bool },
}

impl CallError {
    pub fn errno(&self) -> Errno {
        match self {
            CallError::Server { errno, .. } | CallError::Transport { errno, .. } => *errno,
        }
    }

    /// See `refused` of [`CallError::Transport`].
    pub fn is_refused(&self) -> bool {
        matches!(self, CallError::Transport { refused: true, .. })
    }

    fn transport(errno: Errno, reason: impl Into<String>) -> CallError {
        CallError::Transport { errno, reason: reason.into(), refused: false }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Server { errno, message } => write!(f, "{message} ({errno})"),
            CallError::Transport { errno, reason, .. } => write!(f, "{reason} ({errno})"),
        }
    }
}

impl std::error::Error for CallError {}

type Waiter = oneshot::Sender<Result<Frame, CallError>>;
type Pending = Arc<Mutex<HashMap<u64, Waiter>>>;

/// What a pool has heard from one server (shared with the readers of its connections).
struct Liveness {
    /// Frames received from the server, ever. A call that times out while this stays the
    /// same heard nothing at all from the server during its whole wait.
    heard: AtomicU64,
    /// While non-zero: the server is silent, and calls to it fail at once until this many
    /// milliseconds after `epoch` (or until a frame from it clears it).
    silent_until_ms: AtomicU64,
    epoch: Instant,
}

impl Liveness {
    fn new() -> Liveness {
        Liveness { heard: AtomicU64::new(0), silent_until_ms: AtomicU64::new(0), epoch: Instant::now() }
    }

    /// A frame came from the server: it is not silent.
    fn heard_from(&self) {
        self.heard.fetch_add(1, Ordering::Relaxed);
        if self.silent_until_ms.load(Ordering::Relaxed) != 0 {
            self.silent_until_ms.store(0, Ordering::Relaxed);
        }
    }

    fn heard(&self) -> u64 {
        self.heard.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn set_silent_for(&self, d: Duration) {
        self.silent_until_ms.store((self.now_ms() + d.as_millis() as u64).max(1), Ordering::Relaxed);
    }

    fn is_silent(&self) -> bool {
        let until = self.silent_until_ms.load(Ordering::Relaxed);
        until != 0 && self.now_ms() < until
    }
}

/// Removes a call's waiter from its connection's `pending` when the call ends without a
/// reply (it timed out, or its future was dropped), so waiters never pile up for replies
/// that will not come.
struct Registered {
    pending: Pending,
    id: u64,
    /// False once the reply arrived (the reader removed the waiter itself).
    armed: bool,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.armed {
            self.pending.lock().remove(&self.id);
        }
    }
}

/// One pipelined connection.
///
/// **Sending.** A caller writes its frame to the socket itself, on its own thread (a
/// non-blocking write), instead of handing it to a writer task: a hand-off wakes another
/// thread, and on a FUSE mount or a busy client that wake-up costs more CPU than the write.
/// Only what the socket does not take at once (it is full) is queued, in order, and a
/// flusher task writes the queue as the socket drains; while anything is queued, later
/// frames queue behind it, so frames never interleave.
///
/// **Receiving.** A reader task hands each reply to its caller by request id.
struct Conn {
    out: Arc<Outbox>,
    pending: Pending,
    broken: Arc<AtomicBool>,
    /// Data sections sent on this connection carry a CRC32C (negotiated in `Hello`).
    data_crc: bool,
    /// The feature bits both sides agreed on in `Hello` (`shoal_proto::hello`).
    features: u64,
}

/// The sending side of a connection. The socket is shut down for writing when the last
/// holder (the connection, or a flusher with work left) lets go of it.
struct Outbox {
    wr: Sink,
    queue: Mutex<Queue>,
    /// Where flusher tasks run (the runtime the connection was opened on).
    rt: tokio::runtime::Handle,
}

/// Where a connection's frames go.
enum Sink {
    /// Plain TCP: written by the caller itself (see [`Conn`]).
    Plain(OwnedWriteHalf),
    /// TLS: the bytes must go through rustls, which needs a stream it can wait on, so
    /// frames (head and data, together so they never interleave) go to a writer task
    /// that owns the TLS stream's sending half and flushes when it has nothing more.
    Tls(mpsc::UnboundedSender<[Bytes; 2]>),
}

#[derive(Default)]
struct Queue {
    bufs: VecDeque<Bytes>,
    /// A flusher task is writing `bufs` (it runs until they are all written).
    flushing: bool,
}

/// Write as much of `bufs` as the socket takes without blocking; the written bytes leave
/// `bufs`. `Ok(true)`: all written; `Ok(false)`: the socket is full.
fn write_now(wr: &OwnedWriteHalf, bufs: &mut VecDeque<Bytes>) -> std::io::Result<bool> {
    loop {
        while bufs.front().is_some_and(|b| b.is_empty()) {
            bufs.pop_front();
        }
        if bufs.is_empty() {
            return Ok(true);
        }
        let mut slices = [std::io::IoSlice::new(&[]); 16];
        let mut count = 0;
        for (slot, b) in slices.iter_mut().zip(bufs.iter()) {
            *slot = std::io::IoSlice::new(b);
            count += 1;
        }
        let mut n = match wr.try_write_vectored(&slices[..count]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while n > 0 {
            let Some(front) = bufs.front_mut() else { break };
            let k = n.min(front.len());
            let _ = front.split_to(k);
            n -= k;
            if front.is_empty() {
                bufs.pop_front();
            }
        }
    }
}

/// Fail every call waiting on a broken connection with `err`.
fn fail_all(broken: &AtomicBool, pending: &Pending, err: CallError) {
    broken.store(true, Ordering::SeqCst);
    for (_, w) in pending.lock().drain() {
        let _ = w.send(Err(err.clone()));
    }
}

/// Why reading the handshake or a reply failed: a connection that broke or closed is
/// ENOTCONN (the server went away: killed, restarted), a frame that does not decode is a
/// protocol error.
pub(crate) fn read_error(e: shoal_proto::frame::FrameError, during: &str) -> CallError {
    match e {
        shoal_proto::frame::FrameError::Io(e) => {
            CallError::transport(Errno::ENOTCONN, format!("connection lost{during}: {e}"))
        }
        e @ shoal_proto::frame::FrameError::Checksum { .. } => {
            CallError::transport(Errno::EIO, format!("frame corrupted{during}, connection closed: {e}"))
        }
        other => CallError::transport(Errno::EPROTO, format!("undecodable frame{during}: {other}")),
    }
}

impl Conn {
    /// Connect to `addr` and shake hands; every frame read from the server (the handshake
    /// included) is counted in `live`.
    async fn open(
        addr: &str,
        opts: &PoolOptions,
        map: &ClusterMap,
        live: Arc<Liveness>,
        tls: Option<&ClientTls>,
    ) -> Result<(Conn, ServerId), CallError> {
        // Who this side claims to be, decided before connecting (a process that can prove
        // nothing still connects: the error comes from the helper it cannot reach).
        let claim = auth::Claim::new(map, opts.peer_keys.as_ref(), opts.host_keys.as_ref())?;
        let stream = TcpStream::connect(addr).await.map_err(|e| {
            tracing::debug!("connect {addr}: {e}");
            CallError::Transport {
                errno: Errno::ENOTCONN,
                reason: format!("cannot connect: {e}"),
                refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
            }
        })?;
        let _ = stream.set_nodelay(true);
        let Some(tls) = tls else {
            let (rd, wr) = stream.into_split();
            return Conn::start(rd, wr, addr, opts, map, claim, live).await;
        };
        let name = tls::server_name(addr).map_err(|m| CallError::transport(Errno::EINVAL, m))?;
        let stream = tokio_rustls::TlsConnector::from(tls.config.clone()).connect(name, stream).await.map_err(|e| {
            tracing::debug!("TLS handshake with {addr}: {e}");
            let errno = if tls::is_tls_error(&e) { Errno::EPROTO } else { Errno::ENOTCONN };
            CallError::transport(errno, tls::describe_handshake_error(&e, &tls.security))
        })?;
        let (rd, wr) = tokio::io::split(stream);
        Conn::start(rd, wr, addr, opts, map, claim, live).await
    }

    /// Shake hands on a connected stream (its reading and writing halves), then start its
    /// reader, and for TLS its writer.
    async fn start<R, W>(
        mut rd: R,
        mut wr: W,
        addr: &str,
        opts: &PoolOptions,
        map: &ClusterMap,
        claim: Option<auth::Claim>,
        live: Arc<Liveness>,
    ) -> Result<(Conn, ServerId), CallError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static + IntoSink,
    {
        // Handshake before anything else. Leases only with somewhere to deliver revocations.
        let offered = if opts.notices.is_some() { opts.features } else { opts.features & !FEATURE_LEASES };
        let hello = Request {
            cred: Cred::root(),
            map_version: map.version(),
            op: Op::Hello {
                client: opts.client_name.clone(),
                session: opts.session,
                min_version: MIN_PROTOCOL_VERSION,
                max_version: PROTOCOL_VERSION,
                features: offered,
                auth: claim.as_ref().map(|c| c.hello()),
            },
        };
        let f = Frame::request(0, &hello, Bytes::new())
            .map_err(|e| CallError::transport(Errno::EPROTO, format!("cannot encode the handshake: {e}")))?;
        f.write_to(&mut wr).await.map_err(|e| read_error(e, " during the handshake"))?;
        wr.flush().await.map_err(|e| read_error(e.into(), " during the handshake"))?;
        let reply =
            Frame::read_from(&mut rd).await.map_err(|e| read_error(e, " during the handshake"))?.ok_or_else(|| {
                CallError::transport(Errno::ENOTCONN, "connection closed by the server during the handshake")
            })?;
        live.heard_from();
        let body = reply.reply_body().map_err(|e| read_error(e, " in the handshake reply"))?;
        let (server, agreed) = match body {
            Reply::Hello { protocol_version, server, features, auth, .. } => {
                let agreed = match check_answer(protocol_version, features, offered) {
                    Ok(agreed) => agreed,
                    Err(m) => return Err(CallError::transport(Errno::EPROTO, m)),
                };
                if let Some(claim) = &claim {
                    claim.finish(&mut rd, &mut wr, server, addr, auth).await?;
                }
                (server, agreed)
            }
            Reply::Error { errno, message } => return Err(CallError::Server { errno, message }),
            _ => return Err(CallError::transport(Errno::EPROTO, "unexpected reply to the handshake")),
        };
        tracing::trace!("connected to {addr}");

        let broken = Arc::new(AtomicBool::new(false));
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let wr = wr.into_sink(&pending, &broken);
        let out = Arc::new(Outbox { wr, queue: Mutex::new(Queue::default()), rt: tokio::runtime::Handle::current() });

        // Reader: hand each reply to its waiter, each notice to the pool's sink.
        let (p, b) = (pending.clone(), broken.clone());
        let notices = (agreed.features & FEATURE_LEASES != 0).then(|| opts.notices.clone()).flatten();
        tokio::spawn(async move {
            let mut rd = tokio::io::BufReader::with_capacity(256 * 1024, rd);
            let why = loop {
                match Frame::read_from(&mut rd).await {
                    Ok(Some(f)) if f.kind == FrameKind::Reply => {
                        // Also a reply nobody waits for any more (its call timed out) says
                        // the server is alive.
                        live.heard_from();
                        if let Some(w) = p.lock().remove(&f.request_id) {
                            let _ = w.send(Ok(f));
                        }
                    }
                    Ok(Some(f)) if f.kind == FrameKind::Notice => {
                        live.heard_from();
                        let Some(sink) = &notices else {
                            break CallError::transport(Errno::EPROTO, "the server sent a notice unasked for");
                        };
                        match f.notice_body() {
                            Ok(n) => (sink.0)(server, Some(n)),
                            Err(e) => break read_error(e, " in a notice"),
                        }
                    }
                    Ok(Some(_)) => break CallError::transport(Errno::EPROTO, "the server sent a request frame"),
                    Ok(None) => break CallError::transport(Errno::ENOTCONN, "connection closed by the server"),
                    Err(e) => break read_error(e, ""),
                };
            };
            tracing::debug!("connection to a server ends: {why}");
            if let Some(sink) = &notices {
                (sink.0)(server, None);
            }
            fail_all(&b, &p, why);
        });
        let data_crc = agreed.features & FEATURE_DATA_CRC != 0;
        Ok((Conn { out, pending, broken, data_crc, features: agreed.features }, server))
    }

    /// Send `frame`; its reply (or ENOTCONN if the connection breaks first) goes to
    /// `waiter`. Err if the connection is already broken.
    fn send(&self, mut frame: Frame, waiter: Waiter) -> Result<(), CallError> {
        let id = frame.request_id;
        frame.data_crc = self.data_crc;
        // Registered before the bytes leave, so the reply always finds it.
        self.pending.lock().insert(id, waiter);
        // The reader marks the connection broken before failing the waiters: a waiter
        // registered after that would wait for nothing.
        if self.broken.load(Ordering::SeqCst) {
            self.pending.lock().remove(&id);
            return Err(CallError::transport(Errno::ENOTCONN, "connection closed"));
        }
        let head = Bytes::from(frame.head());
        let wr = match &self.out.wr {
            Sink::Plain(wr) => wr,
            Sink::Tls(tx) => {
                return tx.send([head, frame.data]).map_err(|_| {
                    self.pending.lock().remove(&id);
                    CallError::transport(Errno::ENOTCONN, "connection closed")
                });
            }
        };
        let mut q = self.out.queue.lock();
        q.bufs.push_back(head);
        q.bufs.push_back(frame.data);
        if q.flushing {
            // Frames ahead of this one are still queued: the flusher writes it after them.
            return Ok(());
        }
        match write_now(wr, &mut q.bufs) {
            Ok(true) => Ok(()),
            Ok(false) => {
                q.flushing = true;
                drop(q);
                let out = self.out.clone();
                let (p, b) = (self.pending.clone(), self.broken.clone());
                self.out.rt.spawn(async move {
                    if let Err(e) = flush(&out).await {
                        fail_all(&b, &p, CallError::transport(Errno::ENOTCONN, format!("connection lost: {e}")));
                    }
                });
                Ok(())
            }
            Err(e) => {
                tracing::debug!("writing to a server: {e}");
                q.bufs.clear();
                drop(q);
                let err = CallError::transport(Errno::ENOTCONN, format!("connection lost: {e}"));
                fail_all(&self.broken, &self.pending, err.clone());
                Err(err)
            }
        }
    }
}

/// The sending half of a connected stream, made into a [`Sink`] once the handshake is done.
trait IntoSink {
    fn into_sink(self, pending: &Pending, broken: &Arc<AtomicBool>) -> Sink;
}

impl IntoSink for OwnedWriteHalf {
    fn into_sink(self, _: &Pending, _: &Arc<AtomicBool>) -> Sink {
        Sink::Plain(self)
    }
}

type TlsWriteHalf = tokio::io::WriteHalf<tokio_rustls::client::TlsStream<TcpStream>>;

impl IntoSink for TlsWriteHalf {
    /// Start the writer task of a TLS connection: it writes frames in the order they were
    /// sent, coalesced (each `write` into rustls becomes a record and a system call, so the
    /// small heads are buffered), flushes when nothing more is waiting, and closes the TLS
    /// session when the connection is dropped.
    fn into_sink(self, pending: &Pending, broken: &Arc<AtomicBool>) -> Sink {
        let (tx, mut rx) = mpsc::unbounded_channel::<[Bytes; 2]>();
        let (p, b) = (pending.clone(), broken.clone());
        let mut wr = tokio::io::BufWriter::with_capacity(64 << 10, self);
        tokio::spawn(async move {
            let r: std::io::Result<()> = async {
                while let Some(mut frame) = rx.recv().await {
                    loop {
                        for part in &frame {
                            wr.write_all(part).await?;
                        }
                        match rx.try_recv() {
                            Ok(next) => frame = next,
                            Err(_) => break,
                        }
                    }
                    wr.flush().await?;
                }
                wr.shutdown().await
            }
            .await;
            if let Err(e) = r {
                tracing::debug!("writing to a server: {e}");
                fail_all(&b, &p, CallError::transport(Errno::ENOTCONN, format!("connection lost: {e}")));
            }
        });
        Sink::Tls(tx)
    }
}

/// A pool's TLS settings (`[security] tls = true`).
#[derive(Clone)]
struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    security: shoal_placement::map::Security,
}

/// Write the queue of `out` until it is empty, waiting for the socket to drain.
async fn flush(out: &Outbox) -> std::io::Result<()> {
    let Sink::Plain(wr) = &out.wr else {
        return Err(std::io::Error::other("a TLS connection has its own writer"));
    };
    loop {
        wr.writable().await?;
        let mut q = out.queue.lock();
        match write_now(wr, &mut q.bufs) {
            Ok(true) => {
                q.flushing = false;
                return Ok(());
            }
            Ok(false) => {}
            Err(e) => {
                q.bufs.clear();
                q.flushing = false;
                return Err(e);
            }
        }
    }
}

/// Request ids: one counter for every pool of the process, so that an id names one request
/// of a client session even across pools (a client replaces its pool when it reloads the
/// cluster map) and connections (the servers' reply cache keys on it).
static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// One connection slot: a server and the index of one of its `connections_per_server`.
type Slot = (ServerId, usize);

/// Connections to every server of a cluster map.
pub struct Pool {
    /// The map connections follow; replaced by [`Pool::set_map`] when the cluster's map
    /// changes (docs/membership.md).
    map: parking_lot::RwLock<Arc<ClusterMap>>,
    opts: PoolOptions,
    rr: AtomicU64,
    /// Shared with the tasks that open connections (`conn`).
    conns: Arc<Mutex<HashMap<Slot, Arc<Conn>>>>,
    /// Serialises connection set-up per slot so a burst of calls opens one connection.
    connecting: Mutex<HashMap<Slot, Arc<tokio::sync::Mutex<()>>>>,
    stats: Mutex<HashMap<ServerId, (u64, u64, u64)>>,
    /// Per server of the map: what was heard from it (grows when a new map adds servers).
    liveness: parking_lot::RwLock<HashMap<ServerId, Arc<Liveness>>>,
    /// Under `[security] tls`: the client configuration, read from the CA file at the first
    /// connection (a missing file fails every call with a message naming it).
    tls: std::sync::OnceLock<Result<ClientTls, String>>,
    /// Set once by [`Pool::close`]: every call fails at once from then on.
    closed: tokio::sync::watch::Sender<bool>,
}

impl Pool {
    pub fn new(map: ClusterMap, opts: PoolOptions) -> Pool {
        let liveness = map.servers.iter().map(|s| (ServerId(s.id), Arc::new(Liveness::new()))).collect();
        Pool {
            liveness: parking_lot::RwLock::new(liveness),
            map: parking_lot::RwLock::new(Arc::new(map)),
            opts,
            rr: AtomicU64::new(0),
            conns: Arc::new(Mutex::new(HashMap::new())),
            connecting: Mutex::new(HashMap::new()),
            stats: Mutex::new(HashMap::new()),
            tls: std::sync::OnceLock::new(),
            closed: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Close the pool for good: calls under way (waiting for a reply, or for a failover)
    /// fail now with ENOTCONN, and so does every later call. What a server does with its
    /// pool when it stops: a request still running would otherwise wait out a peer's
    /// failover (15 s) and hold the server's stores open meanwhile, so that a copy of the
    /// same slot promoted again in this process could not open them (seen: a slot left
    /// unserved after a handback, docs/testing.md).
    pub fn close(&self) {
        self.closed.send_replace(true);
        let gone: Vec<Arc<Conn>> = self.conns.lock().drain().map(|(_, c)| c).collect();
        for c in gone {
            fail_all(&c.broken, &c.pending, Self::closed_error());
        }
    }

    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    fn closed_error() -> CallError {
        CallError::transport(Errno::ENOTCONN, "this side is shutting down (its connections are closed)")
    }

    /// The TLS settings connections use, `None` without `[security] tls`.
    fn tls(&self) -> Result<Option<&ClientTls>, CallError> {
        let map = self.map();
        if !map.security.tls {
            return Ok(None);
        }
        let t = self.tls.get_or_init(|| {
            let security = map.security.clone();
            tls::client_config(&security).map(|config| ClientTls { config, security })
        });
        t.as_ref().map(Some).map_err(|m| CallError::transport(Errno::EINVAL, m.clone()))
    }

    /// The map this pool routes by now.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.map.read().clone()
    }

    /// Follow a newer map: requests name its version from now on, servers it adds become
    /// reachable, and connections to a server whose address changed are dropped, so that the
    /// next call connects to the new address. A map not newer than the current one is
    /// ignored (maps only move forward).
    pub fn set_map(&self, map: ClusterMap) {
        let mut cur = self.map.write();
        if map.version() <= cur.version() {
            return;
        }
        let moved: Vec<ServerId> = map
            .servers
            .iter()
            .filter(|s| cur.server(s.server_id()).is_some_and(|old| old.addr != s.addr))
            .map(|s| s.server_id())
            .collect();
        {
            let mut live = self.liveness.write();
            for s in &map.servers {
                live.entry(s.server_id()).or_insert_with(|| Arc::new(Liveness::new()));
            }
        }
        *cur = Arc::new(map);
        drop(cur);
        if !moved.is_empty() {
            {
                // A moved server starts afresh: not silent, and calls waiting on the old
                // address (a frozen server's) fail now, so that a failover retries them.
                let mut live = self.liveness.write();
                for s in &moved {
                    live.insert(*s, Arc::new(Liveness::new()));
                }
            }
            let gone: Vec<Arc<Conn>> = {
                let mut conns = self.conns.lock();
                let keys: Vec<_> = conns.keys().filter(|(server, _)| moved.contains(server)).copied().collect();
                keys.into_iter().filter_map(|k| conns.remove(&k)).collect()
            };
            for c in gone {
                fail_all(&c.broken, &c.pending, CallError::transport(Errno::ENOTCONN, "the server moved (a new map)"));
            }
        }
    }

    fn liveness_of(&self, server: ServerId) -> Result<Arc<Liveness>, CallError> {
        self.liveness
            .read()
            .get(&server)
            .cloned()
            .ok_or_else(|| CallError::transport(Errno::EIO, "not in the cluster map"))
    }

    pub fn options(&self) -> &PoolOptions {
        &self.opts
    }

    /// Requests sent, bytes sent and bytes received per server by this pool.
    pub fn traffic(&self) -> HashMap<ServerId, (u64, u64, u64)> {
        self.stats.lock().clone()
    }

    /// A connection to `server`: one of `connections_per_server` in turn, or for the map
    /// group's messages (`raft`) one of their own. Why their own: a server reads a
    /// connection's requests only while the connection has budget left (`MAX_IN_FLIGHT` in
    /// the server's `net.rs`), and requests whose replies wait for the group (a primary
    /// waiting for the consent to go on without a mirror) can hold all of it; the group's
    /// heartbeats and appends queued behind them would then never be read, and the group
    /// never commit that consent (seen: a map group stalled for minutes, docs/testing.md).
    async fn conn(&self, server: ServerId, live: &Arc<Liveness>, raft: bool) -> Result<Arc<Conn>, CallError> {
        let spread = self.opts.connections_per_server.max(1);
        let slot = match raft {
            true => spread,
            false => (self.rr.fetch_add(1, Ordering::Relaxed) as usize) % spread,
        };
        let key = (server, slot);
        if self.is_closed() {
            return Err(Self::closed_error());
        }
        if let Some(c) = self.conns.lock().get(&key) {
            if !c.broken.load(Ordering::SeqCst) {
                return Ok(c.clone());
            }
        }
        let gate = self.connecting.lock().entry(key).or_default().clone();
        let map = self.map();
        let entry = map.server(server).ok_or_else(|| CallError::transport(Errno::EIO, "not in the cluster map"))?;
        let (addr, opts, live, conns) = (entry.addr.clone(), self.opts.clone(), live.clone(), self.conns.clone());
        let tls = self.tls()?.cloned();
        let closed = self.closed.subscribe();
        // Opened by a task of its own, bounded by the pool's timeout, which the caller
        // awaits: a caller that gives up (the map group's calls give up after 150 ms) does
        // not cancel the opening half way, so that a connection slower to open than one
        // call's patience still opens for the calls after it (seen: a server that resumed
        // from a pause never heard from the group's leader again, every attempt cut off
        // before authenticating).
        let open = tokio::spawn(async move {
            let _g = gate.lock_owned().await;
            if let Some(c) = conns.lock().get(&key) {
                if !c.broken.load(Ordering::SeqCst) {
                    return Ok(c.clone());
                }
            }
            // Boxed: connecting (TCP, TLS handshake, Hello, authentication) is a large
            // state machine; inline, it made every request's future as large, and moving
            // those futures (into a task, through `FuturesUnordered`) cost a `memcpy` of that
            // size per call: 10 % of a client's CPU on md-easy creates (`perf`).
            let opening = Box::pin(Conn::open(&addr, &opts, &map, live, tls.as_ref()));
            let (conn, id) = match tokio::time::timeout(opts.timeout, opening).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(CallError::transport(
                        Errno::ETIMEDOUT,
                        format!("connecting to {addr}: no answer within {:?}", opts.timeout),
                    ))
                }
            };
            if id != server {
                tracing::warn!("{addr} answered as {id}, the map says {server}");
                return Err(CallError::transport(Errno::EIO, format!("{addr} answered as server {id}")));
            }
            let conn = Arc::new(conn);
            let mut conns = conns.lock();
            // Closed while this one opened: `close` did not see it, so it is not kept.
            if *closed.borrow() {
                return Err(Pool::closed_error());
            }
            conns.insert(key, conn.clone());
            Ok(conn)
        });
        open.await.map_err(|e| CallError::transport(Errno::EIO, format!("connecting to server {server}: {e}")))?
    }

    /// The feature bits `server` agreed on in `Hello` (connecting to it if need be): what a
    /// caller checks before sending an operation that older servers do not know.
    pub async fn features(&self, server: ServerId) -> Result<u64, CallError> {
        let live = self.liveness_of(server)?;
        match tokio::time::timeout(self.opts.timeout, self.conn(server, &live, false)).await {
            Ok(conn) => Ok(conn?.features),
            Err(_) => Err(CallError::transport(Errno::ETIMEDOUT, format!("no answer within {:?}", self.opts.timeout))),
        }
    }

    /// Send `op` (with `data` as the bulk section) to `server` and wait for the reply.
    /// Server-side errors come back as `Err(errno)`; an unreachable server as ENOTCONN
    /// (immediately) or ETIMEDOUT (after the pool's timeout, or at once while the server is
    /// silent). [`Pool::request`] says more.
    pub async fn call(&self, server: ServerId, cred: &Cred, op: Op, data: Bytes) -> Result<(Reply, Bytes), Errno> {
        self.request(server, cred, op, data).await.map_err(|e| e.errno())
    }

    /// As [`Pool::call`], with the server's message (or what happened to the connection)
    /// in the error.
    ///
    /// Each call is bounded by the pool's timeout, connecting and handshake included. A
    /// call that times out while nothing at all came from the server (no reply to any
    /// call, on any connection) marks the server *silent* for one timeout: calls to it
    /// then fail at once with ETIMEDOUT instead of each waiting a whole timeout, until the
    /// server is heard again (a late reply clears the mark) or the timeout has passed
    /// (then one call tries again). Without this, callers that must ask one after another —
    /// the kernel sends lookups of one name in one directory one at a time — would wait
    /// k × timeout for a frozen server.
    pub async fn request(
        &self,
        server: ServerId,
        cred: &Cred,
        op: Op,
        data: Bytes,
    ) -> Result<(Reply, Bytes), CallError> {
        if self.is_closed() {
            return Err(Self::closed_error());
        }
        let req = Request { cred: cred.clone(), map_version: self.map.read().version(), op };
        let id = NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed);
        match self.request_once(server, &req, &data, id).await {
            Err(e) if self.fails_over(&req.op, &e) => Box::pin(self.fail_over(server, req, data, id, e)).await,
            r => r,
        }
    }

    /// Whether a call that failed with `e` waits for a failover (see [`Failover`]): with
    /// replicas, or with slots that move between servers (a move is a short failover, with
    /// one copy too: docs/membership.md, "Moving slots"), for an unreachable server, and not
    /// for the messages that have their own retries (the map group's, replication, map
    /// fetches).
    fn fails_over(&self, op: &Op, e: &CallError) -> bool {
        let map = self.map();
        self.opts.failover.is_some()
            && (map.cluster.replicas >= 2 || map.servers.iter().any(|s| s.host.is_some()))
            && matches!(e, CallError::Transport { errno, .. } if *errno == Errno::ENOTCONN || *errno == Errno::ETIMEDOUT)
            && !matches!(
                op,
                Op::GetMap { .. }
                    | Op::ProposeMap { .. }
                    | Op::PeerRaft { .. }
                    | Op::PeerReplicate { .. }
                    | Op::Hello { .. }
            )
    }

    /// Send request `id` again until it is answered or the failover wait is over; each
    /// attempt names the newest map.
    async fn fail_over(
        &self,
        server: ServerId,
        mut req: Request,
        data: Bytes,
        id: u64,
        first: CallError,
    ) -> Result<(Reply, Bytes), CallError> {
        let Some(failover) = self.opts.failover.clone() else { return Err(first) };
        let deadline = Instant::now() + failover.wait;
        tracing::info!("server {server}: {first}; waiting up to {:?} for a failover", failover.wait);
        let mut last = first;
        let mut pause = Duration::from_millis(50);
        let mut closed = self.closed.subscribe();
        while Instant::now() < deadline {
            if let Some(refresh) = &failover.refresh {
                refresh().await;
            }
            let wait = tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            tokio::select! {
                _ = wait => {}
                _ = closed.wait_for(|c| *c) => return Err(Self::closed_error()),
            }
            pause = (pause * 2).min(FAILOVER_PAUSE_MAX);
            req.map_version = self.map().version();
            match self.request_once(server, &req, &data, id).await {
                Err(e) if self.fails_over(&req.op, &e) => last = e,
                // The slot's new server routes by a newer map than this pool got so far
                // (the move and the fetch crossed): fetch again, same request id.
                Err(e @ CallError::Server { errno: Errno::ESTALE, .. }) => last = e,
                r => return r,
            }
        }
        Err(last)
    }

    /// One attempt at request `id`, bounded by the pool's timeout.
    async fn request_once(
        &self,
        server: ServerId,
        req: &Request,
        data: &Bytes,
        id: u64,
    ) -> Result<(Reply, Bytes), CallError> {
        let live = self.liveness_of(server)?;
        let live = &live;
        // The map group's messages are exempt: they carry their own short timeouts, and a
        // server that was frozen (SIGSTOP, a stall) must get the leader's heartbeats the
        // moment it runs again, not a whole pool timeout later (it would stay unheard, and the
        // group unable to commit the changes that failover and consent wait for).
        if live.is_silent() && !matches!(req.op, Op::PeerRaft { .. }) {
            return Err(CallError::transport(
                Errno::ETIMEDOUT,
                format!("not answering (a call got no answer within {:?})", self.opts.timeout),
            ));
        }
        let heard = live.heard();
        // Boxed for the same reason as connecting (`conn`): every client operation's future
        // holds this one, and is moved whole into tasks and `FuturesUnordered`.
        match tokio::time::timeout(self.opts.timeout, Box::pin(self.call_inner(server, live, req, data.clone(), id)))
            .await
        {
            Ok(r) => r,
            Err(_) => {
                if live.heard() == heard {
                    live.set_silent_for(self.opts.timeout);
                }
                Err(CallError::transport(Errno::ETIMEDOUT, format!("no answer within {:?}", self.opts.timeout)))
            }
        }
    }

    async fn call_inner(
        &self,
        server: ServerId,
        live: &Arc<Liveness>,
        req: &Request,
        data: Bytes,
        id: u64,
    ) -> Result<(Reply, Bytes), CallError> {
        let version = req.map_version;
        let frame = Frame::request(id, req, data)
            .map_err(|e| CallError::transport(Errno::EINVAL, format!("cannot encode the request: {e}")))?;
        let sent = (frame.body.len() + frame.data.len()) as u64;
        let raft = matches!(req.op, Op::PeerRaft { .. });
        let conn = self.conn(server, live, raft).await?;
        let reply = match exchange(conn, frame.clone()).await {
            // The connection was lost with the request sent or about to be: send it again,
            // same id, on a new connection; the server's reply cache (keyed by session and
            // id) applies it once. Without a session there is no cache: no retry. If no new
            // connection can be made, the first error says what happened.
            Err(e) if self.opts.session != 0 && e.errno() == Errno::ENOTCONN => {
                match self.conn(server, live, raft).await {
                    Ok(conn) => {
                        tracing::debug!("request {id} to server {server}: {e}; sent again on a new connection");
                        exchange(conn, frame).await?
                    }
                    Err(_) => return Err(e),
                }
            }
            r => r?,
        };
        {
            let mut s = self.stats.lock();
            let e = s.entry(server).or_default();
            e.0 += 1;
            e.1 += sent;
            e.2 += (reply.body.len() + reply.data.len()) as u64;
        }
        let body = reply.reply_body().map_err(|e| read_error(e, " in a reply"))?;
        match body {
            Reply::Error { errno, message } => Err(CallError::Server { errno, message }),
            Reply::StaleMap { current } => Err(CallError::Server {
                errno: Errno::ESTALE,
                message: format!("the server routes with cluster map version {current}, this side {version}"),
            }),
            other => Ok((other, reply.data)),
        }
    }
}

/// Send `frame` on `conn` and wait for its reply.
async fn exchange(conn: Arc<Conn>, frame: Frame) -> Result<Frame, CallError> {
    let id = frame.request_id;
    let (tx, rx) = oneshot::channel();
    conn.send(frame, tx)?;
    // From here until the reply, dropping this call (its timeout) unregisters it.
    let mut registered = Registered { pending: conn.pending.clone(), id, armed: true };
    drop(conn);
    let reply = rx.await.map_err(|_| CallError::transport(Errno::ENOTCONN, "connection closed"))??;
    // The reader (or `fail_all`) removed the waiter when it handed over the answer.
    registered.armed = false;
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::msg::StatFsOut;
    use tokio::net::TcpListener;

    /// A one-server map without authentication: the fake servers below prove nothing.
    fn open_map(port: u16) -> ClusterMap {
        let mut map = ClusterMap::local(1, port, std::path::Path::new("/tmp"));
        map.security.auth = shoal_placement::map::AuthMode::None;
        map
    }

    /// The fake servers' side of the handshake: read the `Hello`, answer it as server 0
    /// with no features and no authentication.
    async fn answer_hello_plainly(rd: &mut tokio::net::tcp::OwnedReadHalf, wr: &mut tokio::net::tcp::OwnedWriteHalf) {
        let hello = Frame::read_from(rd).await.unwrap().unwrap();
        let r = Reply::Hello {
            protocol_version: PROTOCOL_VERSION,
            server: ServerId(0),
            map_version: 1,
            features: 0,
            auth: None,
        };
        Frame::reply(hello.request_id, &r, Bytes::new()).unwrap().write_to(wr).await.unwrap();
    }

    /// A server that answers the handshake, then (after `stall`, so that the client's
    /// socket fills up) answers every request with `Written { len }` of its data and
    /// checks that the data is the byte pattern the test sends.
    async fn fake_server(listener: TcpListener, stall: Duration) {
        let (sock, _) = listener.accept().await.unwrap();
        let (mut rd, mut wr) = sock.into_split();
        answer_hello_plainly(&mut rd, &mut wr).await;
        tokio::time::sleep(stall).await;
        while let Some(f) = Frame::read_from(&mut rd).await.unwrap() {
            let seed = f.data.first().copied().unwrap_or(0);
            let intact = f.data.iter().enumerate().all(|(i, &b)| b == seed.wrapping_add(i as u8));
            let reply =
                if intact { Reply::Written { len: f.data.len() as u32 } } else { Reply::StatFs(StatFsOut::default()) };
            Frame::reply(f.request_id, &reply, Bytes::new()).unwrap().write_to(&mut wr).await.unwrap();
        }
    }

    fn pattern(seed: u8, len: usize) -> Bytes {
        (0..len).map(|i| seed.wrapping_add(i as u8)).collect::<Vec<u8>>().into()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_queued_behind_a_full_socket_arrive_whole_and_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(fake_server(listener, Duration::from_millis(300)));
        let map = open_map(port);
        let opts = PoolOptions { connections_per_server: 1, ..PoolOptions::default() };
        let pool = Arc::new(Pool::new(map, opts));
        // Much more than a socket buffer holds, from many callers at once, mixed with
        // small frames: most of it is queued while the server does not read.
        let calls = (0..24u8).map(|i| {
            let pool = pool.clone();
            let len = if i % 3 == 0 { 10 } else { 3 << 20 };
            tokio::spawn(async move {
                let (reply, _) = pool.call(ServerId(0), &Cred::root(), Op::StatFs, pattern(i, len)).await.unwrap();
                (len, reply)
            })
        });
        for c in calls.collect::<Vec<_>>() {
            let (len, reply) = c.await.unwrap();
            assert!(matches!(reply, Reply::Written { len: n } if n as usize == len), "{reply:?}");
        }
        assert_eq!(pool.traffic()[&ServerId(0)].0, 24);
    }

    /// A server that answers the handshake, then reads requests and answers none of them
    /// until `thaw` fires (as a process stopped with SIGSTOP), then answers each (also the
    /// ones read before) with `StatFs`.
    async fn frozen_server(listener: TcpListener, thaw: oneshot::Receiver<()>) {
        let (sock, _) = listener.accept().await.unwrap();
        let (mut rd, mut wr) = sock.into_split();
        answer_hello_plainly(&mut rd, &mut wr).await;
        let mut unanswered = Vec::new();
        let mut thaw = std::pin::pin!(thaw);
        loop {
            tokio::select! {
                _ = &mut thaw => break,
                f = Frame::read_from(&mut rd) => match f.unwrap() {
                    Some(f) => unanswered.push(f.request_id),
                    None => return,
                },
            }
        }
        let answer = Reply::StatFs(StatFsOut::default());
        for id in unanswered {
            Frame::reply(id, &answer, Bytes::new()).unwrap().write_to(&mut wr).await.unwrap();
        }
        while let Some(f) = Frame::read_from(&mut rd).await.unwrap() {
            Frame::reply(f.request_id, &answer, Bytes::new()).unwrap().write_to(&mut wr).await.unwrap();
        }
    }

    fn pending_waiters(pool: &Pool) -> usize {
        pool.conns.lock().values().map(|c| c.pending.lock().len()).sum()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timed_out_calls_leave_no_waiters_behind() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (_thaw, frozen) = oneshot::channel();
        tokio::spawn(frozen_server(listener, frozen));
        let map = open_map(port);
        let opts =
            PoolOptions { connections_per_server: 1, timeout: Duration::from_millis(300), ..PoolOptions::default() };
        let pool = Arc::new(Pool::new(map, opts));
        let calls: Vec<_> = (0..100)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.call(ServerId(0), &Cred::root(), Op::StatFs, Bytes::new()).await })
            })
            .collect();
        for c in calls {
            assert_eq!(c.await.unwrap().unwrap_err(), Errno::ETIMEDOUT);
        }
        assert_eq!(pool.conns.lock().len(), 1, "the calls went out on one connection");
        assert_eq!(pending_waiters(&pool), 0, "waiters of timed-out calls are still registered");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_server_fails_later_calls_at_once_until_it_answers_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (thaw, frozen) = oneshot::channel();
        tokio::spawn(frozen_server(listener, frozen));
        let map = open_map(port);
        let timeout = Duration::from_millis(500);
        let pool = Pool::new(map, PoolOptions { connections_per_server: 1, timeout, ..PoolOptions::default() });
        let root = Cred::root();
        let call = || pool.request(ServerId(0), &root, Op::StatFs, Bytes::new());

        // This call opens the connection: the handshake's answer is a sign of life, so
        // its timeout does not make the server silent yet.
        assert_eq!(call().await.unwrap_err().errno(), Errno::ETIMEDOUT);
        let t = Instant::now();
        let first = call().await.unwrap_err();
        assert_eq!(first.errno(), Errno::ETIMEDOUT, "{first}");
        assert!(t.elapsed() >= timeout, "the first call waits its timeout: {:?}", t.elapsed());
        // Ten more, one after another, as the kernel sends lookups of one name: each fails
        // at once instead of waiting a timeout of its own.
        let t = Instant::now();
        for _ in 0..10 {
            let e = call().await.unwrap_err();
            assert_eq!(e.errno(), Errno::ETIMEDOUT, "{e}");
            assert!(e.to_string().contains("not answering"), "{e}");
        }
        assert!(t.elapsed() < timeout, "later calls waited: {:?}", t.elapsed());
        // The server answers again (also the call that timed out): calls go through.
        thaw.send(()).unwrap();
        let t = Instant::now();
        loop {
            match call().await {
                Ok((reply, _)) => {
                    assert!(matches!(reply, Reply::StatFs(_)), "{reply:?}");
                    break;
                }
                Err(e) => assert!(t.elapsed() < Duration::from_secs(5), "still failing after the thaw: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(t.elapsed() < timeout, "the late reply did not end the silence: {:?}", t.elapsed());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_server_killed_during_the_handshake_is_a_lost_connection_not_a_protocol_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            // Wait for the hello (its first byte: `readable` may report a new socket ready
            // before anything came), leave it unread and reset the connection, as the
            // kernel does for a process killed with unread input.
            let mut first = [0u8; 1];
            sock.peek(&mut first).await.unwrap();
            // Zero linger resets at once; nothing blocks on drop.
            #[allow(deprecated)]
            sock.set_linger(Some(Duration::ZERO)).unwrap();
            drop(sock);
        });
        let pool = Pool::new(open_map(port), PoolOptions::default());
        let e = pool.request(ServerId(0), &Cred::root(), Op::StatFs, Bytes::new()).await.unwrap_err();
        assert_eq!(e.errno(), Errno::ENOTCONN, "{e}");
        assert!(e.to_string().contains("connection lost during the handshake"), "{e}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_server_error_keeps_its_message() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            let (mut rd, mut wr) = sock.into_split();
            answer_hello_plainly(&mut rd, &mut wr).await;
            let f = Frame::read_from(&mut rd).await.unwrap().unwrap();
            let r = Reply::Error { errno: Errno::ENOTEMPTY, message: "directory 7 is not empty".into() };
            Frame::reply(f.request_id, &r, Bytes::new()).unwrap().write_to(&mut wr).await.unwrap();
        });
        let pool = Pool::new(open_map(port), PoolOptions::default());
        let e = pool.request(ServerId(0), &Cred::root(), Op::StatFs, Bytes::new()).await.unwrap_err();
        assert_eq!(e, CallError::Server { errno: Errno::ENOTEMPTY, message: "directory 7 is not empty".into() });
    }

    /// Answer a Hello on `sock` (with the data checksum); the Hello's session.
    async fn accept_hello(sock: &mut TcpStream) -> u64 {
        let hello = Frame::read_from(sock).await.unwrap().unwrap();
        let Op::Hello { session, .. } = hello.request_body().unwrap().op else { panic!("not a Hello") };
        let r = Reply::Hello {
            protocol_version: PROTOCOL_VERSION,
            server: ServerId(0),
            map_version: 1,
            features: 1,
            auth: None,
        };
        Frame::reply(hello.request_id, &r, Bytes::new()).unwrap().write_to(sock).await.unwrap();
        session
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_call_lost_with_its_connection_is_sent_again_under_the_same_id() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            // First connection: read the request, then drop the connection unanswered.
            let (mut sock, _) = listener.accept().await.unwrap();
            let s1 = accept_hello(&mut sock).await;
            let first = Frame::read_from(&mut sock).await.unwrap().unwrap();
            drop(sock);
            // Second connection: the same request under the same id; answer it.
            let (mut sock, _) = listener.accept().await.unwrap();
            let s2 = accept_hello(&mut sock).await;
            let again = Frame::read_from(&mut sock).await.unwrap().unwrap();
            Frame::reply(again.request_id, &Reply::Appended { offset: 0 }, Bytes::new())
                .unwrap()
                .write_to(&mut sock)
                .await
                .unwrap();
            (s1, s2, first, again)
        });
        let opts = PoolOptions { connections_per_server: 1, session: 77, ..PoolOptions::default() };
        let pool = Pool::new(open_map(port), opts);
        let op = Op::Append { ino: shoal_proto::ROOT_INO, cap: None };
        let (reply, _) = pool.request(ServerId(0), &Cred::root(), op, Bytes::from_static(b"abc")).await.unwrap();
        assert_eq!(reply, Reply::Appended { offset: 0 });
        let (s1, s2, first, again) = server.await.unwrap();
        assert_eq!((s1, s2), (77, 77), "the client id is the session, on every connection");
        assert_eq!(again.request_id, first.request_id, "the request keeps its id");
        assert_eq!((again.body, again.data), (first.body, first.data));
        // The next call has an id of its own (unique within the process).
        assert_ne!(NEXT_REQUEST_ID.load(Ordering::Relaxed), first.request_id);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_refused_hello_is_reported_in_one_line_naming_both_ranges() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let hello = Frame::read_from(&mut sock).await.unwrap().unwrap();
            let Op::Hello { min_version, max_version, .. } = hello.request_body().unwrap().op else { panic!() };
            let r = Reply::Error {
                errno: Errno::EPROTO,
                message: format!("client speaks protocol {min_version}..={max_version}, this server 9..=9"),
            };
            Frame::reply(hello.request_id, &r, Bytes::new()).unwrap().write_to(&mut sock).await.unwrap();
        });
        let pool = Pool::new(open_map(port), PoolOptions::default());
        let e = pool.request(ServerId(0), &Cred::root(), Op::StatFs, Bytes::new()).await.unwrap_err();
        assert_eq!(e.errno(), Errno::EPROTO);
        let line = e.to_string();
        assert_eq!(
            line,
            format!("client speaks protocol {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}, this server 9..=9 (EPROTO)")
                .replace("(EPROTO)", &format!("({})", Errno::EPROTO))
        );
        assert!(!line.contains('\n'));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_dead_server_fails_calls_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let pool = Pool::new(open_map(port), PoolOptions::default());
        let r = pool.call(ServerId(0), &Cred::root(), Op::StatFs, Bytes::new()).await;
        assert_eq!(r.unwrap_err(), Errno::ENOTCONN);
    }

    /// A server that answers the handshake and then reads requests without ever replying.
    async fn silent_server(listener: TcpListener) {
        let (sock, _) = listener.accept().await.unwrap();
        let (mut rd, mut wr) = sock.into_split();
        answer_hello_plainly(&mut rd, &mut wr).await;
        while let Ok(Some(_)) = Frame::read_from(&mut rd).await {}
    }

    #[tokio::test(flavor = "current_thread")]
    async fn closing_the_pool_fails_a_call_waiting_for_its_reply_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(silent_server(listener));
        let opts = PoolOptions { timeout: Duration::from_secs(30), ..PoolOptions::default() };
        let pool = Arc::new(Pool::new(open_map(port), opts));
        let call = tokio::spawn({
            let pool = pool.clone();
            async move { pool.request(ServerId(0), &Cred::root(), Op::StatFs, Bytes::new()).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        pool.close();
        let e = tokio::time::timeout(Duration::from_secs(2), call).await.expect("the call ends").unwrap().unwrap_err();
        assert_eq!(e.errno(), Errno::ENOTCONN, "{e}");
        assert!(e.to_string().contains("shutting down"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(1));
        // And every later call, without trying to connect.
        let later = pool.request(ServerId(0), &Cred::root(), Op::StatFs, Bytes::new()).await.unwrap_err();
        assert!(later.to_string().contains("shutting down"), "{later}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn closing_the_pool_ends_a_wait_for_a_failover() {
        // Nothing listens there: the call waits for a failover (replicas = 2).
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let mut map = open_map(port);
        map.cluster.replicas = 2;
        let failover = Some(Failover { wait: Duration::from_secs(30), refresh: None });
        let pool = Arc::new(Pool::new(map, PoolOptions { failover, ..PoolOptions::default() }));
        let call = tokio::spawn({
            let pool = pool.clone();
            async move { pool.request(ServerId(0), &Cred::root(), Op::StatFs, Bytes::new()).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!call.is_finished(), "the call waits for a failover");
        let started = Instant::now();
        pool.close();
        let e = tokio::time::timeout(Duration::from_secs(2), call).await.expect("the call ends").unwrap().unwrap_err();
        assert!(e.to_string().contains("shutting down"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
