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
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

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
    /// the owner of the orphans its unlinks leave (see `Op::ReleaseOrphan`).
    pub session: u64,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            timeout: Duration::from_secs(30),
            connections_per_server: 2,
            client_name: "shoal-client".into(),
            session: 0,
        }
    }
}

type Waiter = oneshot::Sender<Result<Frame, Errno>>;
type Pending = Arc<Mutex<HashMap<u64, Waiter>>>;

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
}

/// The sending side of a connection. The socket is shut down for writing when the last
/// holder (the connection, or a flusher with work left) lets go of it.
struct Outbox {
    wr: OwnedWriteHalf,
    queue: Mutex<Queue>,
    /// Where flusher tasks run (the runtime the connection was opened on).
    rt: tokio::runtime::Handle,
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

/// Fail every call waiting on a broken connection.
fn fail_all(broken: &AtomicBool, pending: &Pending) {
    broken.store(true, Ordering::SeqCst);
    for (_, w) in pending.lock().drain() {
        let _ = w.send(Err(Errno::ENOTCONN));
    }
}

impl Conn {
    async fn open(addr: &str, opts: &PoolOptions, map_version: u64) -> Result<(Conn, ServerId), Errno> {
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
            op: Op::Hello {
                protocol_version: PROTOCOL_VERSION,
                client: opts.client_name.clone(),
                session: opts.session,
            },
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
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let out = Arc::new(Outbox { wr, queue: Mutex::new(Queue::default()), rt: tokio::runtime::Handle::current() });

        // Reader: hand each reply to its waiter.
        let (p, b) = (pending.clone(), broken.clone());
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
            fail_all(&b, &p);
        });
        Ok((Conn { out, pending, broken }, server))
    }

    /// Send `frame`; its reply (or ENOTCONN if the connection breaks first) goes to
    /// `waiter`. Err if the connection is already broken.
    fn send(&self, frame: Frame, waiter: Waiter) -> Result<(), Errno> {
        let id = frame.request_id;
        // Registered before the bytes leave, so the reply always finds it.
        self.pending.lock().insert(id, waiter);
        // The reader marks the connection broken before failing the waiters: a waiter
        // registered after that would wait for nothing.
        if self.broken.load(Ordering::SeqCst) {
            self.pending.lock().remove(&id);
            return Err(Errno::ENOTCONN);
        }
        let head = Bytes::from(frame.head());
        let mut q = self.out.queue.lock();
        q.bufs.push_back(head);
        q.bufs.push_back(frame.data);
        if q.flushing {
            // Frames ahead of this one are still queued: the flusher writes it after them.
            return Ok(());
        }
        match write_now(&self.out.wr, &mut q.bufs) {
            Ok(true) => Ok(()),
            Ok(false) => {
                q.flushing = true;
                drop(q);
                let out = self.out.clone();
                let (p, b) = (self.pending.clone(), self.broken.clone());
                self.out.rt.spawn(async move {
                    if flush(&out).await.is_err() {
                        fail_all(&b, &p);
                    }
                });
                Ok(())
            }
            Err(e) => {
                tracing::debug!("writing to a server: {e}");
                q.bufs.clear();
                drop(q);
                fail_all(&self.broken, &self.pending);
                Err(Errno::ENOTCONN)
            }
        }
    }
}

/// Write the queue of `out` until it is empty, waiting for the socket to drain.
async fn flush(out: &Outbox) -> std::io::Result<()> {
    loop {
        out.wr.writable().await?;
        let mut q = out.queue.lock();
        match write_now(&out.wr, &mut q.bufs) {
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
        let (conn, id) = Conn::open(&entry.addr, &self.opts, self.map.version()).await?;
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
        conn.send(frame, tx)?;
        drop(conn);
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

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::msg::StatFsOut;
    use tokio::net::TcpListener;

    /// A server that answers the handshake, then (after `stall`, so that the client's
    /// socket fills up) answers every request with `Written { len }` of its data and
    /// checks that the data is the byte pattern the test sends.
    async fn fake_server(listener: TcpListener, stall: Duration) {
        let (sock, _) = listener.accept().await.unwrap();
        let (mut rd, mut wr) = sock.into_split();
        let hello = Frame::read_from(&mut rd).await.unwrap().unwrap();
        let r = Reply::Hello { protocol_version: PROTOCOL_VERSION, server: ServerId(0), map_version: 1 };
        Frame::reply(hello.request_id, &r, Bytes::new()).unwrap().write_to(&mut wr).await.unwrap();
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
        let map = ClusterMap::local(1, port, std::path::Path::new("/tmp"));
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

    #[tokio::test(flavor = "current_thread")]
    async fn a_dead_server_fails_calls_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let pool = Pool::new(ClusterMap::local(1, port, std::path::Path::new("/tmp")), PoolOptions::default());
        let r = pool.call(ServerId(0), &Cred::root(), Op::StatFs, Bytes::new()).await;
        assert_eq!(r.unwrap_err(), Errno::ENOTCONN);
    }
}
