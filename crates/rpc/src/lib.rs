//! Pipelined request/reply connections to Shoal servers.
//!
//! One TCP connection carries many requests at once: a writer task sends frames as callers
//! submit them, a reader task matches replies to callers by request id, so replies may come
//! back in any order. [`Pool`] keeps connections per server of a cluster map, reconnects
//! after failures, and bounds every call with a timeout so a dead server turns into an
//! error, never a hang.
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

use bytes::Bytes;
use parking_lot::Mutex;
use shoal_placement::ClusterMap;
use shoal_proto::frame::{Frame, FrameKind};
use shoal_proto::msg::{Cred, Op, Reply, Request};
use shoal_proto::{Errno, ServerId, PROTOCOL_VERSION};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
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
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions { timeout: Duration::from_secs(30), connections_per_server: 2, client_name: "shoal-client".into() }
    }
}

type Waiter = oneshot::Sender<Result<Frame, Errno>>;

/// One pipelined connection.
struct Conn {
    tx: mpsc::UnboundedSender<(Frame, Waiter)>,
    broken: Arc<AtomicBool>,
}

impl Conn {
    async fn open(addr: &str, client_name: &str, map_version: u64) -> Result<(Conn, ServerId), Errno> {
        let stream = TcpStream::connect(addr).await.map_err(|e| {
            tracing::debug!("connect {addr}: {e}");
            Errno::ENOTCONN
        })?;
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        // Handshake before anything else.
        let hello = Request {
            cred: Cred::root(),
            map_version,
            op: Op::Hello { protocol_version: PROTOCOL_VERSION, client: client_name.to_string() },
        };
        let f = Frame::request(0, &hello, Bytes::new()).map_err(|_| Errno::EPROTO)?;
        f.write_to(&mut wr).await.map_err(|_| Errno::ENOTCONN)?;
        let reply = Frame::read_from(&mut rd).await.map_err(|_| Errno::EPROTO)?.ok_or(Errno::ENOTCONN)?;
        let server = match reply.reply_body().map_err(|_| Errno::EPROTO)? {
            Reply::Hello { protocol_version, server, .. } if protocol_version == PROTOCOL_VERSION => server,
            Reply::Hello { .. } => return Err(Errno::EPROTO),
            Reply::Error { errno, .. } => return Err(errno),
            _ => return Err(Errno::EPROTO),
        };

        let broken = Arc::new(AtomicBool::new(false));
        let pending: Arc<Mutex<HashMap<u64, Waiter>>> = Arc::new(Mutex::new(HashMap::new()));
        let (tx, mut rx) = mpsc::unbounded_channel::<(Frame, Waiter)>();

        // Writer: register the waiter before the bytes leave, so the reply always finds it.
        let (p, b) = (pending.clone(), broken.clone());
        tokio::spawn(async move {
            let mut wr = tokio::io::BufWriter::with_capacity(256 * 1024, wr);
            use tokio::io::AsyncWriteExt;
            while let Some((frame, waiter)) = rx.recv().await {
                p.lock().insert(frame.request_id, waiter);
                let mut ok = frame.write_to(&mut wr).await.is_ok();
                // Batch frames that are already queued into one flush.
                while ok {
                    match rx.try_recv() {
                        Ok((frame, waiter)) => {
                            p.lock().insert(frame.request_id, waiter);
                            ok = frame.write_to(&mut wr).await.is_ok();
                        }
                        Err(_) => break,
                    }
                }
                if !ok || wr.flush().await.is_err() {
                    break;
                }
            }
            b.store(true, Ordering::SeqCst);
            for (_, w) in p.lock().drain() {
                let _ = w.send(Err(Errno::ENOTCONN));
            }
        });

        // Reader: hand each reply to its waiter.
        let (p, b) = (pending, broken.clone());
        tokio::spawn(async move {
            let mut rd = tokio::io::BufReader::with_capacity(256 * 1024, rd);
            loop {
                match Frame::read_from(&mut rd).await {
                    Ok(Some(f)) if f.kind == FrameKind::Reply => {
                        if let Some(w) = p.lock().remove(&f.request_id) {
                            let _ = w.send(Ok(f));
                        }
                    }
                    Ok(Some(_)) | Ok(None) | Err(_) => break,
                }
            }
            b.store(true, Ordering::SeqCst);
            for (_, w) in p.lock().drain() {
                let _ = w.send(Err(Errno::ENOTCONN));
            }
        });
        Ok((Conn { tx, broken }, server))
    }
}

/// Connections to every server of a cluster map.
pub struct Pool {
    map: ClusterMap,
    opts: PoolOptions,
    next_id: AtomicU64,
    rr: AtomicU64,
    conns: Mutex<HashMap<(ServerId, usize), Arc<Conn>>>,
    /// Serialises connection set-up per slot so a burst of calls opens one connection.
    connecting: Mutex<HashMap<(ServerId, usize), Arc<tokio::sync::Mutex<()>>>>,
    stats: Mutex<HashMap<ServerId, (u64, u64, u64)>>,
}

impl Pool {
    pub fn new(map: ClusterMap, opts: PoolOptions) -> Pool {
        Pool {
            map,
            opts,
            next_id: AtomicU64::new(1),
            rr: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            connecting: Mutex::new(HashMap::new()),
            stats: Mutex::new(HashMap::new()),
        }
    }

    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    pub fn options(&self) -> &PoolOptions {
        &self.opts
    }

    /// Requests sent, bytes sent and bytes received per server by this pool.
    pub fn traffic(&self) -> HashMap<ServerId, (u64, u64, u64)> {
        self.stats.lock().clone()
    }

    async fn conn(&self, server: ServerId) -> Result<Arc<Conn>, Errno> {
        let slot = (self.rr.fetch_add(1, Ordering::Relaxed) as usize) % self.opts.connections_per_server.max(1);
        let key = (server, slot);
        if let Some(c) = self.conns.lock().get(&key) {
            if !c.broken.load(Ordering::SeqCst) {
                return Ok(c.clone());
            }
        }
        let gate = self.connecting.lock().entry(key).or_default().clone();
        let _g = gate.lock().await;
        if let Some(c) = self.conns.lock().get(&key) {
            if !c.broken.load(Ordering::SeqCst) {
                return Ok(c.clone());
            }
        }
        let entry = self.map.server(server).ok_or(Errno::EIO)?;
        let (conn, id) = Conn::open(&entry.addr, &self.opts.client_name, self.map.version()).await?;
        if id != server {
            tracing::warn!("{} answered as {id}, the map says {server}", entry.addr);
            return Err(Errno::EIO);
        }
        let conn = Arc::new(conn);
        self.conns.lock().insert(key, conn.clone());
        Ok(conn)
    }

    /// Send `op` (with `data` as the bulk section) to `server` and wait for the reply.
    /// Server-side errors come back as `Err(errno)`; an unreachable server as ENOTCONN
    /// (immediately) or ETIMEDOUT (after the pool's timeout).
    pub async fn call(&self, server: ServerId, cred: &Cred, op: Op, data: Bytes) -> Result<(Reply, Bytes), Errno> {
        match tokio::time::timeout(self.opts.timeout, self.call_inner(server, cred, op, data)).await {
            Ok(r) => r,
            Err(_) => Err(Errno::ETIMEDOUT),
        }
    }

    async fn call_inner(&self, server: ServerId, cred: &Cred, op: Op, data: Bytes) -> Result<(Reply, Bytes), Errno> {
        let req = Request { cred: cred.clone(), map_version: self.map.version(), op };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame::request(id, &req, data).map_err(|_| Errno::EINVAL)?;
        let sent = (frame.body.len() + frame.data.len()) as u64;
        let conn = self.conn(server).await?;
        let (tx, rx) = oneshot::channel();
        conn.tx.send((frame, tx)).map_err(|_| Errno::ENOTCONN)?;
        let reply = rx.await.map_err(|_| Errno::ENOTCONN)??;
        {
            let mut s = self.stats.lock();
            let e = s.entry(server).or_default();
            e.0 += 1;
            e.1 += sent;
            e.2 += (reply.body.len() + reply.data.len()) as u64;
        }
        let body = reply.reply_body().map_err(|_| Errno::EPROTO)?;
        match body {
            Reply::Error { errno, .. } => Err(errno),
            Reply::StaleMap { .. } => Err(Errno::ESTALE),
            other => Ok((other, reply.data)),
        }
    }
}
