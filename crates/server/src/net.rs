//! Connections: the accept loop, and per connection a reader that spawns one task per
//! request and a writer that sends replies as they complete (out of order, matched by
//! request id).
//!
//! The first frame must be `Hello` with our protocol version. After that, any frame that
//! does not decode, or a reply frame from the client, closes that connection only (with a
//! warning naming the peer) — a confused or hostile client cannot take the server down.
//! In-flight requests per connection are bounded in number and in bytes, so one client
//! cannot make the server buffer without limit: the reader simply stops reading.

use crate::dispatch::{self, Payload};
use crate::state::State;
use crate::store::data::{send_region, Region};
use bytes::Bytes;
use shoal_proto::frame::{Frame, FrameError, FrameKind, HEADER_LEN};
use shoal_proto::msg::{Op, Reply, Request};
use shoal_proto::{Errno, PROTOCOL_VERSION};
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// Requests one connection may have in flight.
const MAX_IN_FLIGHT: usize = 256;
/// Request and reply bytes one connection may have in flight.
const MAX_IN_FLIGHT_BYTES: usize = 512 << 20;
const BUF_SIZE: usize = 256 * 1024;

/// Accept connections until `shutdown` completes; then close them all.
pub async fn accept_loop(st: Arc<State>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok((stream, addr)) => {
                    conns.spawn(serve_conn(st.clone(), stream, addr));
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

/// A reply ready to go: the frame, or the head of one whose data comes from a file.
enum Outgoing {
    Frame(Frame, Permits),
    /// Header and body, then `region` (sent with `sendfile` off the async threads).
    Region(Vec<u8>, Region, Permits),
}

/// What a request holds until its reply has been written.
struct Permits {
    _count: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
}

async fn send_now(wr: &mut BufWriter<OwnedWriteHalf>, request_id: u64, reply: &Reply) {
    if let Ok(f) = Frame::reply(request_id, reply, Bytes::new()) {
        let _ = f.write_to(wr).await;
        let _ = wr.flush().await;
    }
}

async fn serve_conn(st: Arc<State>, stream: TcpStream, addr: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(BUF_SIZE, rd);
    let mut wr = BufWriter::with_capacity(BUF_SIZE, wr);

    // Handshake.
    let first = match Frame::read_from(&mut rd).await {
        Ok(Some(f)) => f,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!("connection from {addr}: bad first frame, closing: {e}");
            return;
        }
    };
    if first.kind != FrameKind::Request {
        tracing::warn!("connection from {addr}: first frame is a reply, closing");
        return;
    }
    let (from_peer, session) = match first.request_body() {
        Ok(Request { op: Op::Hello { protocol_version, client, session }, .. }) => {
            if protocol_version != PROTOCOL_VERSION {
                let msg = format!(
                    "protocol version {protocol_version} not supported (this server speaks {PROTOCOL_VERSION})"
                );
                tracing::warn!("connection from {addr} ({client}): {msg}");
                send_now(&mut wr, first.request_id, &dispatch::refuse(Errno::EPROTO, msg)).await;
                return;
            }
            tracing::debug!("connection from {addr}: {client}");
            let from_peer = client.starts_with("shoald");
            st.counters.request("hello", from_peer);
            st.counters.received(first.body.len());
            let hello =
                Reply::Hello { protocol_version: PROTOCOL_VERSION, server: st.id, map_version: st.map.version() };
            send_now(&mut wr, first.request_id, &hello).await;
            // Other servers name themselves "shoald …" (see lib.rs); their requests count
            // as peer traffic.
            (from_peer, session)
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

    // While this connection lasts, the client session's orphans stay (orphans.rs).
    let _connected = st.sessions.connected(session);
    let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
    let reader = read_requests(st.clone(), &mut rd, tx, addr, from_peer);
    let writer = write_replies(st.clone(), wr, rx, addr);
    tokio::join!(reader, writer);
}

async fn read_requests(
    st: Arc<State>,
    rd: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
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
                Payload::Region(region) => match Frame::reply_head(request_id, &reply, region.len) {
                    Ok(head) => {
                        st.counters.sent(head.len() - HEADER_LEN + region.len);
                        let _ = tx.send(Outgoing::Region(head, region, permits));
                        return;
                    }
                    Err(e) => Err(e),
                },
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
async fn write_reply(st: &Arc<State>, wr: &mut BufWriter<OwnedWriteHalf>, out: Outgoing, addr: SocketAddr) -> bool {
    if let Err(e) = st.meta.flush_wal_to_os() {
        tracing::error!("connection from {addr}: cannot write the metadata log, closing: {e}");
        return false;
    }
    match out {
        Outgoing::Frame(f, _permits) => f.write_to(wr).await.is_ok(),
        Outgoing::Region(head, region, _permits) => {
            if wr.flush().await.is_err() {
                return false;
            }
            let sock: &tokio::net::TcpStream = wr.get_ref().as_ref();
            let dup = match sock.as_fd().try_clone_to_owned() {
                Ok(fd) => fd,
                Err(e) => {
                    tracing::warn!("connection from {addr}: cannot duplicate the socket: {e}");
                    return false;
                }
            };
            let sent = tokio::task::spawn_blocking(move || send_region(dup.as_fd(), &head, &region)).await;
            match sent {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    tracing::debug!("connection from {addr}: sending file data: {e}");
                    false
                }
                Err(e) => {
                    tracing::warn!("connection from {addr}: sending file data: {e}");
                    false
                }
            }
        }
    }
}

async fn write_replies(
    st: Arc<State>,
    mut wr: BufWriter<OwnedWriteHalf>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    addr: SocketAddr,
) {
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
