//! Connections: the accept loop, and per connection a reader that spawns one task per
//! request and a writer that sends replies as they complete (out of order, matched by
//! request id).
//!
//! The first frame must be `Hello` with our protocol version, within the handshake timeout.
//! After that, any frame that does not decode, or a reply frame from the client, closes that
//! connection only (with a warning naming the peer) — a confused or hostile client cannot
//! take the server down. In-flight requests per connection are bounded in number and in
//! bytes, so one client cannot make the server buffer without limit: the reader simply
//! stops reading.
//!
//! Connections are bounded too (`limits::ConnLimits`), so that clients can never take the
//! descriptors the server needs for its files. At the limit, a new connection first takes
//! the place of the oldest one that has not said `Hello` yet (a silent flood cannot lock
//! real clients out); if every connection is established, the newcomer's `Hello` is answered
//! with EAGAIN and "server N: connection limit L reached", and it is closed. Peers' `Hello`s
//! are still accepted, within a reserve of their own: a cross-server operation must not
//! fail because clients filled the server. An idle connection holds no buffer
//! (`conn_io`), only its task and socket: a few KiB.

use crate::conn_io::{LazyReader, LazyWriter};
use crate::dispatch::{self, Payload};
use crate::limits::{ConnLimits, REFUSING};
use crate::state::State;
use bytes::Bytes;
use parking_lot::Mutex;
use shoal_proto::frame::{Frame, FrameError, FrameKind};
use shoal_proto::msg::{Op, Reply, Request};
use shoal_proto::{Errno, PROTOCOL_VERSION};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinSet};

/// Requests one connection may have in flight.
const MAX_IN_FLIGHT: usize = 256;
/// Request and reply bytes one connection may have in flight.
const MAX_IN_FLIGHT_BYTES: usize = 512 << 20;
/// How long a connection being refused may take to send its `Hello` (bounded apart from
/// the handshake timeout: these connections hold descriptors from the reserve).
const REFUSE_WAIT: Duration = Duration::from_secs(2);
/// At most one log line per this interval for each kind of refusal.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Where a connection is in its life, as the accept loop sees it.
const HANDSHAKING: u8 = 0;
const ESTABLISHED: u8 = 1;
/// Closed by the accept loop to make room (set only from `HANDSHAKING`).
const EVICTED: u8 = 2;

type Reader = LazyReader<OwnedReadHalf>;
type Writer = LazyWriter<OwnedWriteHalf>;

/// What a connection was admitted with.
enum Slot {
    /// One of `max_connections`.
    Conn(OwnedSemaphorePermit),
    /// Over the limit: read its `Hello` only to say why it is refused (a peer may still get
    /// a place from the peers' reserve).
    Refusing(OwnedSemaphorePermit),
}

/// A warning that may recur thousands of times a second: logged at most once per
/// [`LOG_INTERVAL`], with the count of those left out.
struct RateLog {
    last: Mutex<(Option<Instant>, u64)>,
}

impl RateLog {
    fn new() -> RateLog {
        RateLog { last: Mutex::new((None, 0)) }
    }

    fn warn(&self, msg: impl FnOnce() -> String) {
        let mut g = self.last.lock();
        if g.0.is_some_and(|t| t.elapsed() < LOG_INTERVAL) {
            g.1 += 1;
            return;
        }
        let left_out = std::mem::take(&mut g.1);
        g.0 = Some(Instant::now());
        drop(g);
        if left_out > 0 {
            tracing::warn!("{} (and {left_out} more like it in the last {LOG_INTERVAL:?})", msg());
        } else {
            tracing::warn!("{}", msg());
        }
    }
}

/// What every connection shares.
struct Shared {
    limits: ConnLimits,
    /// Places for peers' connections beyond `max_connections`.
    peers: Arc<Semaphore>,
    refusals: RateLog,
    silent: RateLog,
    evictions: RateLog,
}

/// Accept connections until `shutdown` completes; then close them all.
pub async fn accept_loop(
    st: Arc<State>,
    listener: TcpListener,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    let shared = Arc::new(Shared {
        limits,
        peers: Arc::new(Semaphore::new(limits.peer_reserve)),
        refusals: RateLog::new(),
        silent: RateLog::new(),
        evictions: RateLog::new(),
    });
    let places = Arc::new(Semaphore::new(limits.max_connections));
    let refusing = Arc::new(Semaphore::new(REFUSING));
    // Connections admitted to a place, oldest first, that may still be handshaking (entries
    // of established or finished ones are dropped as they are met).
    let mut handshaking: VecDeque<(Arc<AtomicU8>, AbortHandle)> = VecDeque::new();
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok((stream, addr)) => {
                    let slot = match places.clone().try_acquire_owned() {
                        Ok(p) => Some(Slot::Conn(p)),
                        Err(_) => match make_room(&mut handshaking, &places, &shared, addr).await {
                            Some(p) => Some(Slot::Conn(p)),
                            None => refusing.clone().try_acquire_owned().ok().map(Slot::Refusing),
                        },
                    };
                    let Some(slot) = slot else {
                        shared.refusals.warn(|| format!(
                            "connection from {addr} closed unanswered: connection limit {} reached and {REFUSING} \
                             refusals already under way",
                            limits.max_connections
                        ));
                        continue; // dropping the stream closes it
                    };
                    let admitted = matches!(slot, Slot::Conn(_));
                    let state = Arc::new(AtomicU8::new(HANDSHAKING));
                    let handle = conns.spawn(serve_conn(st.clone(), shared.clone(), stream, addr, slot, state.clone()));
                    if admitted {
                        handshaking.push_back((state, handle));
                    }
                    prune(&mut handshaking, limits.max_connections);
                }
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Whether an entry of the handshaking queue is still handshaking.
fn still_handshaking((state, handle): &(Arc<AtomicU8>, AbortHandle)) -> bool {
    state.load(Ordering::Acquire) == HANDSHAKING && !handle.is_finished()
}

/// Drop the entries of connections that are past their handshake (bounds the queue).
fn prune(q: &mut VecDeque<(Arc<AtomicU8>, AbortHandle)>, max_connections: usize) {
    while q.front().is_some_and(|e| !still_handshaking(e)) {
        q.pop_front();
    }
    if q.len() > 2 * max_connections {
        q.retain(still_handshaking);
    }
}

/// At the limit: close the oldest connection that has not completed `Hello` and take its
/// place. `None` if every connection is established.
async fn make_room(
    q: &mut VecDeque<(Arc<AtomicU8>, AbortHandle)>,
    places: &Arc<Semaphore>,
    shared: &Shared,
    addr: SocketAddr,
) -> Option<OwnedSemaphorePermit> {
    while let Some((state, handle)) = q.pop_front() {
        // The connection moves itself to ESTABLISHED with the same compare-and-swap: exactly
        // one of the two wins, so an established connection is never closed here.
        if state.compare_exchange(HANDSHAKING, EVICTED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            handle.abort();
            shared.evictions.warn(|| {
                format!(
                    "connection limit {} reached: closed the oldest connection still without Hello to admit {addr}",
                    shared.limits.max_connections
                )
            });
            // The aborted task gives its place back when the runtime drops it, at once.
            return match tokio::time::timeout(Duration::from_secs(1), places.clone().acquire_owned()).await {
                Ok(Ok(p)) => Some(p),
                _ => None,
            };
        }
    }
    None
}

/// A reply ready to go.
enum Outgoing {
    Frame(Frame, Permits),
}

/// What a request holds until its reply has been written.
struct Permits {
    _count: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
}

async fn send_now(wr: &mut Writer, request_id: u64, reply: &Reply) {
    if let Ok(f) = Frame::reply(request_id, reply, Bytes::new()) {
        let _ = f.write_to(wr).await;
        let _ = wr.flush().await;
    }
}

async fn serve_conn(
    st: Arc<State>,
    shared: Arc<Shared>,
    stream: TcpStream,
    addr: SocketAddr,
    slot: Slot,
    state: Arc<AtomicU8>,
) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut rd = LazyReader::new(rd);
    let mut wr = LazyWriter::new(wr);

    // Handshake, within the timeout: a connection that says nothing holds a place (and a
    // descriptor) for that long at most.
    let wait = match slot {
        Slot::Conn(_) => shared.limits.handshake_timeout,
        Slot::Refusing(_) => shared.limits.handshake_timeout.min(REFUSE_WAIT),
    };
    let first = match tokio::time::timeout(wait, Frame::read_from(&mut rd)).await {
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            tracing::warn!("connection from {addr}: bad first frame, closing: {e}");
            return;
        }
        Err(_) => {
            shared.silent.warn(|| format!("connection from {addr}: no Hello within {wait:?}, closing"));
            return;
        }
    };
    if first.kind != FrameKind::Request {
        tracing::warn!("connection from {addr}: first frame is a reply, closing");
        return;
    }
    let (from_peer, client, session) = match first.request_body() {
        Ok(Request { op: Op::Hello { protocol_version, client, session }, .. }) => {
            if protocol_version != PROTOCOL_VERSION {
                let msg = format!(
                    "protocol version {protocol_version} not supported (this server speaks {PROTOCOL_VERSION})"
                );
                tracing::warn!("connection from {addr} ({client}): {msg}");
                send_now(&mut wr, first.request_id, &dispatch::refuse(Errno::EPROTO, msg)).await;
                return;
            }
            // Other servers name themselves "shoald …" (see lib.rs); their requests count
            // as peer traffic.
            (client.starts_with("shoald"), client, session)
        }
        Ok(_) => {
            tracing::warn!("connection from {addr}: first request is not Hello, closing");
            send_now(&mut wr, first.request_id, &dispatch::refuse(Errno::EPROTO, "the first request must be Hello"))
                .await;
            return;
        }
        Err(e) => {
            tracing::warn!("connection from {addr}: undecodable Hello, closing: {e}");
            return;
        }
    };

    // Admission: a place of our own, or a peer's place from the reserve, or a refusal.
    let _place = match slot {
        Slot::Conn(p) => {
            if state.compare_exchange(HANDSHAKING, ESTABLISHED, Ordering::AcqRel, Ordering::Acquire).is_err() {
                return; // closed by the accept loop to make room, just now
            }
            p
        }
        Slot::Refusing(r) => match from_peer.then(|| shared.peers.clone().try_acquire_owned().ok()).flatten() {
            Some(p) => {
                drop(r);
                p
            }
            None => {
                let msg = format!("server {}: connection limit {} reached", st.id, shared.limits.max_connections);
                shared.refusals.warn(|| format!("refused connection from {addr} ({client}): {msg}"));
                send_now(&mut wr, first.request_id, &dispatch::refuse(Errno::EAGAIN, msg)).await;
                let _ = wr.shutdown().await;
                return;
            }
        },
    };
    tracing::debug!("connection from {addr}: {client}");
    st.counters.request("hello", from_peer);
    st.counters.received(first.body.len());
    let hello = Reply::Hello { protocol_version: PROTOCOL_VERSION, server: st.id, map_version: st.map.version() };
    send_now(&mut wr, first.request_id, &hello).await;
    // While this connection lasts, the client session's orphans stay (orphans.rs).
    let _connected = st.sessions.connected(session);

    let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
    let reader = read_requests(st.clone(), &mut rd, tx, addr, from_peer);
    let writer = write_replies(st.clone(), wr, rx, addr);
    tokio::join!(reader, writer);
}

async fn read_requests(
    st: Arc<State>,
    rd: &mut Reader,
    tx: mpsc::UnboundedSender<Outgoing>,
    addr: SocketAddr,
    from_peer: bool,
) {
    let count = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let bytes = Arc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES));
    loop {
        let frame = match Frame::read_from(rd).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(FrameError::Io(e)) => {
                tracing::debug!("connection from {addr}: {e}");
                break;
            }
            Err(e) => {
                tracing::warn!("connection from {addr}: malformed frame, closing: {e}");
                break;
            }
        };
        if frame.kind != FrameKind::Request {
            tracing::warn!("connection from {addr}: got a reply frame from a client, closing");
            break;
        }
        let req = match frame.request_body() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("connection from {addr}: malformed request, closing: {e}");
                break;
            }
        };
        if tx.is_closed() {
            break; // the writer is gone (the socket failed)
        }
        // Budget: what the request brings, or what its reply will carry.
        let mut cost = frame.body.len() + frame.data.len();
        if let Op::Read { len, .. } = &req.op {
            cost = cost.max(*len as usize);
        }
        let cost = cost.clamp(1, MAX_IN_FLIGHT_BYTES) as u32;
        let (Ok(p_count), Ok(p_bytes)) =
            (count.clone().acquire_owned().await, bytes.clone().acquire_many_owned(cost).await)
        else {
            break;
        };
        st.counters.received(frame.body.len() + frame.data.len());
        let (st, tx) = (st.clone(), tx.clone());
        let request_id = frame.request_id;
        let data = frame.data;
        tokio::spawn(async move {
            let (reply, payload) = dispatch::handle(&st, req, data, from_peer).await;
            let permits = Permits { _count: p_count, _bytes: p_bytes };
            let encoded = match payload {
                Payload::Bytes(data) => Frame::reply(request_id, &reply, data),
            };
            let f = match encoded {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!("reply to {addr} does not encode: {e}");
                    let r = dispatch::refuse(Errno::EIO, format!("reply does not encode: {e}"));
                    match Frame::reply(request_id, &r, Bytes::new()) {
                        Ok(f) => f,
                        Err(_) => return,
                    }
                }
            };
            st.counters.sent(f.body.len() + f.data.len());
            let _ = tx.send(Outgoing::Frame(f, permits));
        });
    }
}

/// Write one reply, after handing the metadata commits it may depend on to the OS (the
/// group commit of `MetaStore`: a no-op when nothing is pending, one WAL write for a whole
/// burst of replies otherwise). A WAL that cannot be written closes the connection rather
/// than acknowledge what would not survive a crash.
///
/// A reply with data from a file is sent by a blocking task (the disk may have to be read
/// first) on a duplicate of the socket's descriptor, after everything buffered before it:
/// replies on one connection never interleave.
async fn write_reply(st: &Arc<State>, wr: &mut Writer, out: Outgoing, addr: SocketAddr) -> bool {
    if let Err(e) = st.meta.flush_wal_to_os() {
        tracing::error!("connection from {addr}: cannot write the metadata log, closing: {e}");
        return false;
    }
    match out {
        Outgoing::Frame(f, _permits) => f.write_to(wr).await.is_ok(),
    }
}

async fn write_replies(st: Arc<State>, mut wr: Writer, mut rx: mpsc::UnboundedReceiver<Outgoing>, addr: SocketAddr) {
    while let Some(out) = rx.recv().await {
        let mut ok = write_reply(&st, &mut wr, out, addr).await;
        // Write whatever else is ready, then flush once.
        while ok {
            match rx.try_recv() {
                Ok(out) => ok = write_reply(&st, &mut wr, out, addr).await,
                Err(_) => break,
            }
        }
        if !ok || wr.flush().await.is_err() {
            tracing::debug!("connection from {addr}: write failed, closing");
            break;
        }
    }
    let _ = wr.shutdown().await;
}
