//! Connections: the accept loop, and per connection a reader that spawns one task per
//! request and a writer that sends replies as they complete (out of order, matched by
//! request id).
//!
//! The first frame must be `Hello` with a range of protocol versions that meets ours, within
//! the handshake timeout; it also settles the connection's features (data checksums) and
//! names the client session, under which replies of state-changing requests are cached
//! (`replies.rs`: a retried request is applied once). After that, any frame that does not
//! decode or fails its checksum, or a reply frame from the client, closes that connection
//! only (with a warning naming the peer; a checksum failure is also answered with EIO
//! naming it) — a confused or hostile client cannot take the server down. In-flight requests per connection are bounded in number and in
//! bytes, so one client cannot make the server buffer without limit: the reader simply
//! stops reading.
//!
//! Connections are bounded too (`limits::ConnLimits`), so that clients can never take the
//! descriptors the server needs for its files. A connection is *established* once it has
//! said `Hello` and, where keys are required, authenticated; both within the one handshake
//! timeout, or it is closed (one that says `Hello` and proves nothing is closed at that
//! deadline too). At the limit, a new connection first takes the place of the oldest one
//! not established yet (a flood that is silent, or says `Hello` and stops, cannot lock real
//! clients out); if every connection is established, the newcomer's `Hello` is answered
//! with EAGAIN and "server N: connection limit L reached", and it is closed. Peers' `Hello`s
//! are still accepted, within a reserve of their own: a cross-server operation must not
//! fail because clients filled the server. An idle connection holds no buffer
//! (`conn_io`), only its task and socket: a few KiB.

use crate::conn_io::{LazyReader, LazyWriter};
use crate::dispatch::{self, Payload};
use crate::error::Fail;
use crate::limits::{ConnLimits, REFUSING};
use crate::state::State;
use crate::store::commits::{self, Settled, Ticket};
use crate::store::write_crcs::PieceCrcs;
use crate::tls_conn::{self, ConnRead, ConnWrite};
use bytes::Bytes;
use parking_lot::Mutex;
use shoal_proto::frame::{Frame, FrameError, FrameKind};
use shoal_proto::hello::{
    negotiate, server_features, FEATURE_ATTR_LEASES, FEATURE_DATA_CRC, FEATURE_LEASES, FEATURE_PARTITIONS,
};
use shoal_proto::msg::{Op, Reply, Request};
use shoal_proto::{Errno, Ino};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
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

type Reader = LazyReader<ConnRead>;
type Writer = LazyWriter<ConnWrite>;

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
pub(crate) struct RateLog {
    last: Mutex<(Option<Instant>, u64)>,
}

impl RateLog {
    pub(crate) fn new() -> RateLog {
        RateLog { last: Mutex::new((None, 0)) }
    }

    pub(crate) fn warn(&self, msg: impl FnOnce() -> String) {
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
    /// Under `[security] tls`: every connection must be TLS.
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Connections refused for speaking plain TCP to a TLS server, or the reverse.
    mismatched: RateLog,
}

/// Accept connections until `shutdown` completes; then close them all.
pub async fn accept_loop(
    st: Arc<State>,
    listener: TcpListener,
    limits: ConnLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let shared = Arc::new(Shared {
        limits,
        peers: Arc::new(Semaphore::new(limits.peer_reserve)),
        refusals: RateLog::new(),
        silent: RateLog::new(),
        evictions: RateLog::new(),
        tls,
        mismatched: RateLog::new(),
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

/// What the reader hands the writer: a reply to settle and send, or the very last frame
/// (an error answering a frame that failed its checksum; the connection closes after it).
enum Outgoing {
    Reply(Box<Pending>),
    Last(Frame),
    /// A notice to the client (a lease revocation, `leases.rs`).
    Notice(Frame),
}

/// A reply ready to go, and what it takes to settle it (`store::commits`).
struct Pending {
    reply: Encoded,
    ticket: Arc<Ticket>,
    /// The request, to run again if a failed metadata log write leaves its reply in doubt.
    redo: Redo,
    permits: Permits,
}

enum Encoded {
    Frame(Frame),
}

struct Redo {
    request_id: u64,
    req: Request,
    data: Bytes,
    /// For a `Write` that came with a data checksum: the CRC32C of its block pieces, which
    /// verified it (see `read_requests`) and which the data store reuses.
    crcs: Option<PieceCrcs>,
    from_peer: bool,
    /// Refused by the connection's authentication (`auth.rs`): answered with this, not run.
    refused: Option<(Errno, String)>,
    /// Where lease revocations for this connection go (`FEATURE_LEASES` negotiated).
    notices: Option<crate::leases::NoticeSink>,
}

/// Times a request is run again after failed log writes before its reply says the store is
/// unavailable (each run waits at most `commits::REOPEN_WAIT` for the store).
const MAX_RERUNS: u32 = 3;

/// What a request holds until its reply has been written.
struct Permits {
    _count: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
}

/// Handle a request with a fresh ticket, and encode its reply. A state-changing request of a
/// client session runs once per request id (`replies.rs`): a retry gets the first reply.
async fn run_request(st: &Arc<State>, redo: &Redo, conn: ConnInfo) -> (Encoded, Arc<Ticket>) {
    let ticket = Ticket::new(st.meta.generation());
    if let Some((errno, why)) = &redo.refused {
        let reply = dispatch::refuse(*errno, format!("server {}: {why}", st.id));
        return (encode_reply(st, redo.request_id, &reply, Payload::none(), conn), ticket);
    }
    // Boxed: the future of an operation holds every operation's state inline (many KiB);
    // moved by value through the reply cache, the ticket scope and `tokio::spawn`, it cost
    // a `memcpy` of that size at each step (14 % of a server's CPU on md-easy creates,
    // measured with `perf`). Behind a box, each step moves a pointer.
    let handle = Box::pin(dispatch::handle(st, redo.req.clone(), redo.data.clone(), redo.crcs.clone(), redo.from_peer));
    // The caller, for directory leases: who may be granted one, whose change it is; the
    // reply waits for the revocations its commits started (`leases::scope`).
    // Attribute leases: the ticket is taken before the request reads the inode (a `GetAttr`
    // first waits out revocations of the inode's attributes), and the grants are made on the
    // reply (`Leases::grant_attrs`).
    let attr_leases = match (conn.attr_leases, st.meta.leases()) {
        (true, Some(l)) if redo.notices.is_some() => {
            let ticket = match &redo.req.op {
                Op::GetAttr { ino } => l.before_read(shoal_proto::lease::LeaseKey::attrs(*ino)).await,
                _ => l.ticket_now(),
            };
            Some((l.clone(), ticket))
        }
        _ => None,
    };
    // A peer's step carried out for a client's request counts as that client's change (its
    // own attribute lease is not revoked: it drops it itself).
    let session = match &redo.req.op {
        Op::PeerLinkDelta { session: Some(s), .. } if conn.from_peer => *s,
        _ => conn.session,
    };
    let caller = crate::leases::Caller {
        session,
        sink: redo.notices.clone(),
        partitions: conn.partitions,
        commits: attr_leases.as_ref().map(|_| Default::default()),
    };
    let (mut reply, payload) = if conn.session != 0 && crate::replies::changes_state(&redo.req.op) {
        let (session, request) = (conn.session, redo.request_id);
        // The request's changes reach the mirrors only with its reply (`replica::log`,
        // "A change travels with its reply"); let go however the request ends.
        let hold = st.replica.log.as_ref().map(|log| {
            let hold = crate::replica::log::ReplLog::hold();
            ticket.set_hold(hold);
            ReleaseOnDrop { log: log.clone(), hold }
        });
        // Operations whose intents, finished by recovery, end in the request's own reply
        // (`Reply::Ok`): that reply is kept for a retry (`intents::recover_once`).
        if matches!(redo.req.op, Op::Rename { .. } | Op::Unlink { .. } | Op::Rmdir { .. }) {
            ticket.set_reply_to(session, request);
        }
        let once = Box::pin(async move {
            let (reply, payload) = st.replies.once(session, request, handle).await;
            // The mirrors keep the reply too, after the changes it reports.
            st.ship_reply(session, request, &reply);
            drop(hold);
            (reply, payload)
        });
        commits::scope(ticket.clone(), Box::pin(crate::leases::scope(caller.clone(), once))).await
    } else {
        commits::scope(ticket.clone(), Box::pin(crate::leases::scope(caller.clone(), handle))).await
    };
    if let Some((leases, read)) = attr_leases {
        leases.grant_attrs(&mut reply, read, &caller, |ino| st.is_home(ino));
    }
    (encode_reply(st, redo.request_id, &reply, payload, conn), ticket)
}

/// Lets a request's changes go to the mirrors when dropped (`ReplLog::hold`).
struct ReleaseOnDrop {
    log: Arc<crate::replica::log::ReplLog>,
    hold: u64,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.log.release(self.hold);
    }
}

/// Wait until what the reply depends on is held by every mirror in sync (`replica`): a
/// reply that changed nothing waits for everything logged before it, as it may show it.
/// Not for replies that show nothing of this server's own slot: those a server standing by
/// answers (`rejoin::answers_in_standby`). Waiting there makes cycles:
/// * a mirror's answer to its primary would chain the servers' logs (each primary waiting
///   for a mirror that waits for its own mirror);
/// * the map group's messages would wait for a mirror that is down, and the primary goes
///   on without that mirror only once the group commits its consent. Replies to the
///   group's votes and appends were held for minutes (seen in the 10-minute kills run:
///   two voters, both running, each answering the other at once, neither hearing the
///   answer; docs/testing.md).
///
/// False when the server stopped first: the reply must not go (what it acknowledges may
/// not be on the mirrors).
async fn replica_settle(st: &State, redo: &Redo, ticket: &Ticket) -> bool {
    crate::rejoin::answers_in_standby(&redo.req.op) || st.replica.settle(ticket.state().replicated).await
}

fn encode_reply(st: &State, request_id: u64, reply: &Reply, payload: Payload, conn: ConnInfo) -> Encoded {
    let addr = conn.addr;
    let encoded = match payload {
        Payload::Bytes(data) => Frame::reply(request_id, reply, data).map(|mut f| {
            f.data_crc = conn.data_crc;
            f
        }),
    };
    let f = match encoded {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("reply to {addr} does not encode: {e}");
            error_frame(request_id, Fail::new(Errno::EIO, format!("reply does not encode: {e}")))
        }
    };
    if !matches!(reply, Reply::Load(_)) {
        st.counters.sent(f.body.len() + f.data.len());
    }
    Encoded::Frame(f)
}

fn error_frame(request_id: u64, f: Fail) -> Frame {
    let r = f.into_reply();
    Frame::reply(request_id, &r, Bytes::new()).unwrap_or_else(|_| {
        // An error reply is a number and a line of text: it always encodes.
        Frame::reply(request_id, &dispatch::refuse(Errno::EIO, "error"), Bytes::new()).expect("error reply encodes")
    })
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

    // Handshake (TLS, if on, then Hello), within the timeout: a connection that says
    // nothing holds a place (and a descriptor) for that long at most.
    let wait = match slot {
        Slot::Conn(_) => shared.limits.handshake_timeout,
        Slot::Refusing(_) => shared.limits.handshake_timeout.min(REFUSE_WAIT),
    };
    let deadline = tokio::time::Instant::now() + wait;
    let Some((rd, wr)) = open_stream(&st, &shared, stream, addr, deadline).await else { return };
    let mut rd = LazyReader::new(rd);
    let mut wr = LazyWriter::new(wr);
    let first = match tokio::time::timeout_at(deadline, Frame::read_from(&mut rd)).await {
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
    let (from_peer, client, session, agreed, claim) = match first.request_body() {
        Ok(Request { op: Op::Hello { client, session, min_version, max_version, features, auth }, .. }) => {
            let agreed = match negotiate(min_version, max_version, features, server_features()) {
                Ok(a) => a,
                Err(msg) => {
                    tracing::warn!("connection from {addr} ({client}): {msg}, closing");
                    send_now(&mut wr, first.request_id, &dispatch::refuse(Errno::EPROTO, msg)).await;
                    let _ = wr.shutdown().await;
                    return;
                }
            };
            // Other servers name themselves "shoald …" (see lib.rs); their requests count
            // as peer traffic.
            (client.starts_with("shoald"), client, session, agreed, auth)
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

    // Admission: a place of our own, or a peer's place from the reserve, or a refusal. A
    // place of our own stays evictable (HANDSHAKING) until the connection has authenticated:
    // one that says `Hello` and then nothing must not hold it (issue 51).
    let _place = match slot {
        Slot::Conn(p) => p,
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
    // Timed up to its reply (the guard is dropped there, not with the connection).
    let timed = st.metrics.request("hello");
    st.counters.received(first.body.len());
    let (proof, challenge) = match crate::auth::answer_hello(&st, claim) {
        Ok(crate::auth::HelloAnswer::Settled(a)) => (None, Err(a)),
        Ok(crate::auth::HelloAnswer::Challenge(proof, ch)) => (Some(proof), Ok(ch)),
        Err(msg) => {
            tracing::warn!("connection from {addr} ({client}): {msg}, closing");
            send_now(&mut wr, first.request_id, &dispatch::refuse(Errno::EPROTO, msg)).await;
            let _ = wr.shutdown().await;
            return;
        }
    };
    let hello = Reply::Hello {
        protocol_version: agreed.version,
        server: st.id,
        map_version: st.map.version(),
        features: agreed.features,
        auth: proof,
    };
    send_now(&mut wr, first.request_id, &hello).await;
    drop(timed);
    // `Hello` and `Authenticate` together within the one handshake timeout.
    let auth = match challenge {
        Err(settled) => settled,
        Ok(ch) => match authenticate(&st, &mut rd, &mut wr, &ch, addr, &client, deadline).await {
            Some(a) => a,
            None => return,
        },
    };
    // A connection that proved nothing (no key claim where keys are required) may only
    // repeat `Hello`: it stays a handshaking one, evictable, and is closed at the deadline.
    let unproven = auth == crate::auth::ConnAuth::Unauthenticated;
    if !unproven && state.compare_exchange(HANDSHAKING, ESTABLISHED, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return; // closed by the accept loop to make room, just now
    }
    // Under authentication only a proven peer is one; without it, the name says so.
    let from_peer = if auth == crate::auth::ConnAuth::Open { from_peer } else { auth.is_peer() };
    let conn = ConnInfo {
        addr,
        from_peer,
        session,
        data_crc: agreed.features & FEATURE_DATA_CRC != 0,
        leases: agreed.features & FEATURE_LEASES != 0,
        attr_leases: agreed.features & FEATURE_LEASES != 0 && agreed.features & FEATURE_ATTR_LEASES != 0,
        partitions: from_peer || agreed.features & FEATURE_PARTITIONS != 0,
        counts_copies: agreed.version >= COPIES_SINCE,
    };
    // While this connection lasts, the client session's orphans stay (orphans.rs).
    let _connected = st.sessions.connected(session);

    let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
    let reader = read_requests(st.clone(), &mut rd, tx, conn, auth);
    let writer = write_replies(st.clone(), wr, rx, conn);
    if unproven {
        if tokio::time::timeout_at(deadline, async { tokio::join!(reader, writer) }).await.is_err() {
            shared.silent.warn(|| {
                format!("connection from {addr} ({client}): not authenticated within the handshake timeout, closing")
            });
        }
    } else {
        tokio::join!(reader, writer);
    }
}

/// Read and check the `Authenticate` that must follow a `Hello` claiming a role, by
/// `deadline` (the handshake's), and answer it. The connection's role, or `None` when it is refused (logged, told
/// why, and to be closed).
async fn authenticate(
    st: &State,
    rd: &mut Reader,
    wr: &mut Writer,
    ch: &crate::auth::Challenge,
    addr: SocketAddr,
    client: &str,
    deadline: tokio::time::Instant,
) -> Option<crate::auth::ConnAuth> {
    let role = ch.role().name();
    let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
    let (id, verdict) = match tokio::time::timeout_at(deadline, Frame::read_from(rd)).await {
        Ok(Ok(Some(f))) if f.kind == FrameKind::Request => match f.request_body() {
            Ok(req) => (f.request_id, crate::auth::check(st, ch, req.op)),
            Err(e) => (f.request_id, Err(format!("sent an undecodable Authenticate: {e}"))),
        },
        Ok(Ok(Some(f))) => (f.request_id, Err("sent a reply frame where Authenticate was due".into())),
        Ok(Ok(None)) => (0, Err("closed the connection before authenticating".into())),
        Ok(Err(e)) => (0, Err(format!("sent a bad frame where Authenticate was due: {e}"))),
        Err(_) => (0, Err(format!("sent no Authenticate within {wait:?}"))),
    };
    match verdict {
        Ok(a) => {
            send_now(wr, id, &Reply::Ok).await;
            tracing::debug!("connection from {addr} ({client}) authenticated as {a:?}");
            Some(a)
        }
        Err(why) => {
            // Rare and worth seeing (a server with the wrong cluster key, a forged
            // credential), hence a warning each time; the connection closes after it.
            tracing::warn!("connection from {addr} ({client}) claiming to be a {role}: {why}; refused");
            let msg = format!("server {}: authentication as a {role} refused: {why}", st.id);
            send_now(wr, id, &dispatch::refuse(Errno::EACCES, msg)).await;
            let _ = wr.shutdown().await;
            None
        }
    }
}

/// What a connection settled in its `Hello`.
#[derive(Clone, Copy)]
struct ConnInfo {
    addr: SocketAddr,
    /// Sent by another server.
    from_peer: bool,
    /// The client session: with the request id, the name of a request in the reply cache.
    session: u64,
    /// Data sections of replies carry a CRC32C (`FEATURE_DATA_CRC` negotiated).
    data_crc: bool,
    /// The client takes directory leases and their revocation notices (`FEATURE_LEASES`).
    leases: bool,
    /// The client asks for attribute leases (`FEATURE_ATTR_LEASES`, with `FEATURE_LEASES`).
    attr_leases: bool,
    /// The sender routes names of split directories itself (`FEATURE_PARTITIONS`, or a peer).
    partitions: bool,
    /// The sender's requests say how many copies a file wants (protocol 7 and later): of an
    /// older one, a request's absent count means "not said", not one copy.
    counts_copies: bool,
}

/// The protocol version from which requests changing an object carry the file's count of
/// copies (docs/protocol.md, version history).
const COPIES_SINCE: u32 = 7;

/// A request from a sender that cannot say how many copies a file wants: every copy the
/// cluster keeps, since a file of fewer copies than the cluster's has mirrors thinned to
/// marks (`replica/thin.rs`), and an absent count read as one would keep a file of two
/// copies once.
fn assume_every_copy(op: &mut Op) {
    if let Op::Write { copies, .. }
    | Op::WriteList { copies, .. }
    | Op::FetchInto { copies, .. }
    | Op::PeerTruncateObject { copies, .. } = op
    {
        *copies = shoal_proto::msg::REPLICAS_MAX;
    }
}

/// The connection's halves once its first byte says which protocol it speaks: TLS (a
/// handshake record) or Shoal frames in the clear. `None` (closed) when that does not match
/// this server's `[security] tls`, when the TLS handshake fails, or at `deadline`. A plain
/// client of a TLS server is told so in a plain reply to its `Hello` (a one-line error
/// instead of a closed connection); a TLS client of a plain server sees the connection
/// closed during its handshake, which it reports as such (shoal_rpc::tls).
async fn open_stream(
    st: &State,
    shared: &Shared,
    stream: TcpStream,
    addr: SocketAddr,
    deadline: tokio::time::Instant,
) -> Option<(ConnRead, ConnWrite)> {
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        Ok(_) => return None, // closed, or failed, before saying anything
        Err(_) => {
            shared.silent.warn(|| format!("connection from {addr}: no Hello within the handshake timeout, closing"));
            return None;
        }
    }
    let starts_tls = first[0] == shoal_rpc::tls::HANDSHAKE_RECORD;
    match &shared.tls {
        None if starts_tls => {
            shared.mismatched.warn(|| {
                format!("connection from {addr} starts a TLS handshake, but this server runs without TLS; closing")
            });
            None
        }
        None => Some(tls_conn::plain(stream)),
        // Boxed: the handshake's state (rustls's buffers) is large, and inline it would make
        // every connection's task, plain ones included, that much larger for its whole life
        // (measured in connections.rs: 77 KiB per idle connection instead of a few).
        Some(acceptor) if starts_tls => {
            match tokio::time::timeout_at(deadline, Box::pin(acceptor.accept(stream))).await {
                Ok(Ok(s)) => Some(tls_conn::tls(s)),
                Ok(Err(e)) => {
                    shared.mismatched.warn(|| format!("connection from {addr}: TLS handshake failed: {e}"));
                    None
                }
                Err(_) => {
                    shared.silent.warn(|| format!("connection from {addr}: TLS handshake not done in time, closing"));
                    None
                }
            }
        }
        Some(_) => {
            let (rd, wr) = tls_conn::plain(stream);
            let (mut rd, mut wr) = (LazyReader::new(rd), LazyWriter::new(wr));
            let msg = format!(
                "server {}: requires TLS; set tls = true under [security] in the cluster map, with the cluster's CA \
                 certificate as tls_ca",
                st.id
            );
            shared.mismatched.warn(|| format!("connection from {addr} without TLS refused"));
            // Its Hello, to answer it; never longer than a refusal may take.
            let until = deadline.min(tokio::time::Instant::now() + REFUSE_WAIT);
            if let Ok(Ok(Some(f))) = tokio::time::timeout_at(until, Frame::read_from(&mut rd)).await {
                send_now(&mut wr, f.request_id, &dispatch::refuse(Errno::EPROTO, msg)).await;
                let _ = wr.shutdown().await;
            }
            None
        }
    }
}

async fn read_requests(
    st: Arc<State>,
    rd: &mut Reader,
    tx: mpsc::UnboundedSender<Outgoing>,
    conn: ConnInfo,
    auth: crate::auth::ConnAuth,
) {
    let ConnInfo { addr, from_peer, .. } = conn;
    let count = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let bytes = Arc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES));
    let write_code =
        Op::Write { ino: Ino(0), index: 0, offset: 0, file_end: 0, inode_local: false, cap: None, copies: 1 }.code();
    // Revocation notices go through the writer, between replies. Held weakly: a lease
    // outliving its connection must not keep the writer (and the socket) alive.
    let notices = conn.leases.then(|| {
        let weak = tx.downgrade();
        crate::leases::NoticeSink(Arc::new(move |f: Frame| {
            weak.upgrade().is_some_and(|tx| tx.send(Outgoing::Notice(f)).is_ok())
        }))
    });
    loop {
        // A `Write`'s data checksum is left to us (`deferred`): checked below, from the
        // CRC32C of its block pieces, which the data store needs anyway (one pass over the
        // bytes instead of two). Every other frame is checked whole by the frame reader.
        let (frame, deferred) = match Frame::read_deferring_data_crc(rd, Some(write_code)).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(FrameError::Io(e)) => {
                tracing::debug!("connection from {addr}: {e}");
                break;
            }
            Err(e @ FrameError::Checksum { request_id, .. }) => {
                reject_corrupt_frame(&st, addr, request_id, &e, &tx);
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
        let mut req = match frame.request_body() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("connection from {addr}: malformed request, closing: {e}");
                break;
            }
        };
        if !conn.counts_copies {
            assume_every_copy(&mut req.op);
        }
        // Invariant: no byte of a data section is written before its wire CRC is verified.
        // A `Write` whose data fails its checksum is refused here, before it is dispatched
        // (so before its capability, its space or its object is even looked at), exactly
        // as the frame reader refuses any other frame: EIO, and the connection closes.
        let crcs = match deferred {
            None => None,
            Some(expected) => {
                // The header's op code is a Write's and `request_body` checked the body
                // against it; the offset only decides where the pieces are cut, and any cut
                // combines into the CRC32C of the whole section.
                let offset = match req.op {
                    Op::Write { offset, .. } => offset,
                    _ => 0,
                };
                let crcs = PieceCrcs::compute(offset, &frame.data);
                let actual = crcs.whole();
                if actual != expected {
                    let e = FrameError::data_checksum(frame.request_id, expected, actual);
                    reject_corrupt_frame(&st, addr, frame.request_id, &e, &tx);
                    break;
                }
                Some(crcs)
            }
        };
        if tx.is_closed() {
            break; // the writer is gone (the socket failed)
        }
        // Budget: what the request brings, or what its reply will carry.
        let mut cost = frame.body.len() + frame.data.len();
        match &req.op {
            Op::Read { len, .. } => cost = cost.max(*len as usize),
            Op::ReadList { pieces, .. } => cost = cost.max(pieces.iter().map(|p| p.len as usize).sum()),
            _ => {}
        }
        let cost = cost.clamp(1, MAX_IN_FLIGHT_BYTES) as u32;
        let (Ok(p_count), Ok(p_bytes)) =
            (count.clone().acquire_owned().await, bytes.clone().acquire_many_owned(cost).await)
        else {
            break;
        };
        // The load exchange is not the workload's traffic (`load.rs`).
        if !matches!(req.op, Op::PeerLoad { .. }) {
            st.counters.received(frame.body.len() + frame.data.len());
        }
        let (st, tx) = (st.clone(), tx.clone());
        // Before anything runs: peer-only requests from non-peers are refused, a user's
        // requests take the identity it proved.
        let refused = auth.admit(&mut req, addr).err();
        let redo = Redo {
            request_id: frame.request_id,
            req,
            data: frame.data,
            crcs,
            from_peer,
            refused,
            notices: notices.clone(),
        };
        tokio::spawn(async move {
            let (reply, ticket) = run_request(&st, &redo, conn).await;
            // Wait for the mirrors here, in the request's own task, not in the connection's
            // writer: lease revocations go out through the writer, and one queued behind a
            // reply waiting for the mirrors waited out the whole lease term (measured: a
            // 3 s stall per run of two writers sharing a directory).
            if !replica_settle(&st, &redo, &ticket).await {
                return;
            }
            let permits = Permits { _count: p_count, _bytes: p_bytes };
            let _ = tx.send(Outgoing::Reply(Box::new(Pending { reply, ticket, redo, permits })));
        });
    }
}

/// A request frame that failed a checksum (`e`), corrupted in transit or by a broken sender:
/// say so to the request's caller (`request_id`, the header's, best effort) with EIO, as
/// the last reply, and log it; the caller closes the connection, as the stream cannot be
/// trusted any more.
fn reject_corrupt_frame(
    st: &State,
    addr: SocketAddr,
    request_id: u64,
    e: &FrameError,
    tx: &mpsc::UnboundedSender<Outgoing>,
) {
    tracing::warn!("connection from {addr}: {e}; closing the connection");
    let r = dispatch::refuse(Errno::EIO, format!("server {}: request frame rejected: {e}", st.id));
    if let Ok(f) = Frame::reply(request_id, &r, Bytes::new()) {
        let _ = tx.send(Outgoing::Last(f));
    }
}

/// Write one reply, once what it depends on is settled (`store::commits::settle`): normally
/// the group commit of `MetaStore` (a no-op when nothing is pending, one WAL write for a
/// whole burst of replies otherwise), so that nothing is acknowledged before it would
/// survive a crash. After a failed log write, a request whose commit was lost is answered
/// with the failure's errno (ENOSPC), and one that committed nothing is run again on the
/// reopened store.
///
/// A reply with data from a file is sent by a blocking task (the disk may have to be read
/// first) on a duplicate of the socket's descriptor, after everything buffered before it:
/// replies on one connection never interleave.
async fn write_reply(st: &Arc<State>, wr: &mut Writer, out: Outgoing, conn: ConnInfo) -> bool {
    let addr = conn.addr;
    let Pending { mut reply, mut ticket, redo, permits: _permits } = match out {
        Outgoing::Reply(p) => *p,
        Outgoing::Last(f) => {
            let _ = f.write_to(wr).await;
            return false;
        }
        Outgoing::Notice(f) => return f.write_to(wr).await.is_ok(),
    };
    let mut reruns = 0;
    loop {
        match commits::settle(&st.meta, &ticket).await {
            Settled::Send => {
                // Normally settled already by the request's task; a rerun was not.
                replica_settle(st, &redo, &ticket).await;
                break;
            }
            Settled::Lost(f) | Settled::Unavailable(f) => {
                tracing::warn!("connection from {addr}: {} answered with: {f}", redo.req.op.name());
                // The cached reply (if any) claimed an effect that was lost: a retry must
                // run the request again, not be told it succeeded.
                st.replies.forget(conn.session, redo.request_id);
                reply = Encoded::Frame(error_frame(redo.request_id, f));
                break;
            }
            Settled::Rerun if reruns < MAX_RERUNS => {
                reruns += 1;
                tracing::debug!("connection from {addr}: {} run again after a failed log write", redo.req.op.name());
                st.replies.forget(conn.session, redo.request_id);
                // Boxed: inline, the whole dispatch and reply-cache future would sit in every
                // connection's task for its lifetime (~68 KiB per idle connection, measured).
                (reply, ticket) = Box::pin(run_request(st, &redo, conn)).await;
            }
            Settled::Rerun => {
                let f = Fail::new(
                    Errno::EIO,
                    format!("the metadata log could not be written {MAX_RERUNS} times while this request ran"),
                );
                reply = Encoded::Frame(error_frame(redo.request_id, f));
                break;
            }
        }
    }
    match reply {
        Encoded::Frame(f) => f.write_to(wr).await.is_ok(),
    }
}

async fn write_replies(st: Arc<State>, mut wr: Writer, mut rx: mpsc::UnboundedReceiver<Outgoing>, conn: ConnInfo) {
    let addr = conn.addr;
    while let Some(out) = rx.recv().await {
        let mut ok = write_reply(&st, &mut wr, out, conn).await;
        // Write whatever else is ready, then flush once.
        while ok {
            match rx.try_recv() {
                Ok(out) => ok = write_reply(&st, &mut wr, out, conn).await,
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
