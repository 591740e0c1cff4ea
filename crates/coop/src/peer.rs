//! Asking another member: one connection per member, opened at the first question, with
//! any number of questions in flight on it (matched by request id).
//!
//! A member that cannot be reached, or does not answer in time, is left alone for
//! [`SHUN_FOR`]: the questions meant for it go to the servers at once. So a member killed
//! or hung in the middle of a job start costs each of the others one bounded wait, not
//! one per question.

use crate::wire::{self, Answer, Ask, Challenge, Hello, Welcome};
use bytes::Bytes;
use parking_lot::Mutex;
use shoal_auth::KeyRing;
use shoal_proto::frame::{Frame, FrameKind};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// How long a member that failed us is not asked.
pub const SHUN_FOR: Duration = Duration::from_secs(5);

/// Who this member is, as it presents itself to the others.
#[derive(Clone)]
pub struct Me {
    pub group: u64,
    pub rank: u32,
    pub keys: Option<KeyRing>,
}

/// Another member, as this one asks it.
pub struct Peer {
    addr: SocketAddr,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    shunned_until: Mutex<Option<Instant>>,
    /// Shared by all the peers of a member: until when some peer is shunned (so that trees
    /// are computed over the live members only while one is).
    any_shunned_until: Arc<Mutex<Option<Instant>>>,
}

/// Questions in flight on a connection, by request id: the reader task answers them.
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Frame>>>>;

struct Conn {
    out: mpsc::UnboundedSender<Vec<u8>>,
    pending: Pending,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl Peer {
    pub fn new(addr: SocketAddr, any_shunned_until: Arc<Mutex<Option<Instant>>>) -> Peer {
        Peer { addr, conn: tokio::sync::Mutex::new(None), shunned_until: Mutex::new(None), any_shunned_until }
    }

    /// Whether any peer sharing `any_shunned_until` may be shunned now.
    pub fn any_shunned(any_shunned_until: &Mutex<Option<Instant>>) -> bool {
        any_shunned_until.lock().is_some_and(|t| Instant::now() < t)
    }

    /// Whether this member is being left alone after a failure.
    pub fn shunned(&self) -> bool {
        self.shunned_until.lock().is_some_and(|t| Instant::now() < t)
    }

    fn shun(&self, why: &str) {
        tracing::info!("coop member {}: {why}; asking the servers instead for {SHUN_FOR:?}", self.addr);
        let until = Instant::now() + SHUN_FOR;
        *self.shunned_until.lock() = Some(until);
        *self.any_shunned_until.lock() = Some(until);
    }

    /// Ask `ask` and wait at most `wait` for the answer (and a piece's bytes). `Err`: the
    /// member could not be asked or did not answer in time (it is then shunned).
    pub async fn ask(&self, me: &Me, ask: &Ask, wait: Duration) -> Result<(Answer, Bytes), String> {
        let deadline = tokio::time::Instant::now() + wait;
        let conn = match tokio::time::timeout_at(deadline, self.connection(me)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                self.shun(&e);
                return Err(e);
            }
            Err(_) => {
                self.shun("no connection in time");
                return Err(format!("no connection to {} within {wait:?}", self.addr));
            }
        };
        let id = conn.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().insert(id, tx);
        let buf = wire::encoded(wire::OP_ASK, FrameKind::Request, id, ask, Bytes::new())?;
        if conn.out.send(buf).is_err() {
            conn.pending.lock().remove(&id);
            self.drop_conn(&conn).await;
            return Err("connection closed".into());
        }
        let f = match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(f)) => f,
            Ok(Err(_)) => {
                self.drop_conn(&conn).await;
                self.shun("connection lost");
                return Err(format!("connection to {} lost", self.addr));
            }
            Err(_) => {
                conn.pending.lock().remove(&id);
                self.shun("no answer in time");
                return Err(format!("{} did not answer within {wait:?}", self.addr));
            }
        };
        let answer: Answer = wire::body(&f, wire::OP_ANSWER)?;
        Ok((answer, f.data))
    }

    async fn drop_conn(&self, conn: &Arc<Conn>) {
        let mut slot = self.conn.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
    }

    /// The open connection, or a new one (handshake done).
    async fn connection(&self, me: &Me) -> Result<Arc<Conn>, String> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.closed.load(Ordering::SeqCst)) {
            return Ok(c.clone());
        }
        let c = Arc::new(self.connect(me).await?);
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn connect(&self, me: &Me) -> Result<Conn, String> {
        let addr = self.addr;
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (rd, mut wr) = stream.into_split();
        let mut rd = BufReader::new(rd);
        let bad = |e: String| format!("handshake with {addr}: {e}");
        let f = Frame::read_from(&mut rd).await.map_err(|e| bad(e.to_string()))?.ok_or_else(|| bad("closed".into()))?;
        let challenge: Challenge = wire::body(&f, wire::OP_CHALLENGE).map_err(bad)?;
        let nonce = wire::nonce();
        let epoch = me.keys.as_ref().map_or(0, |k| k.current().0);
        let tag = wire::hello_tag(me.keys.as_ref(), epoch, me.group, me.rank, &challenge.nonce, &nonce);
        let hello = Hello { group: me.group, rank: me.rank, nonce: nonce.clone(), epoch, tag };
        let buf = wire::encoded(wire::OP_HELLO, FrameKind::Request, 0, &hello, Bytes::new()).map_err(bad)?;
        wr.write_all(&buf).await.map_err(|e| bad(e.to_string()))?;
        let f = Frame::read_from(&mut rd)
            .await
            .map_err(|e| bad(e.to_string()))?
            .ok_or_else(|| bad("refused (another group, or no proof of the host key)".into()))?;
        let welcome: Welcome = wire::body(&f, wire::OP_WELCOME).map_err(bad)?;
        wire::welcome_ok(me.keys.as_ref(), epoch, &welcome, me.group, &challenge.nonce, &nonce).map_err(bad)?;

        let (out, writer) = wire::spawn_writer(wr);
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (pending2, closed2) = (pending.clone(), closed.clone());
        let reader = tokio::spawn(async move {
            while let Ok(Some(f)) = Frame::read_from(&mut rd).await {
                if let Some(tx) = pending2.lock().remove(&f.request_id) {
                    let _ = tx.send(f);
                }
            }
            closed2.store(true, Ordering::SeqCst);
            // Every question in flight fails now (its sender is dropped).
            pending2.lock().clear();
        });
        Ok(Conn { out, pending, next_id: AtomicU64::new(1), closed, reader, writer })
    }
}
