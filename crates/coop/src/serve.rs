//! Answering the other members: the handshake (`wire.rs`), then each question answered
//! as this member's own would be ([`crate::Inner::get`]: from its pieces, from its parent,
//! or from the servers), several at once.

use crate::wire::{self, Answer, Ask, Challenge, Hello, Welcome};
use crate::{Failure, Inner, Value};
use bytes::Bytes;
use shoal_proto::frame::{Frame, FrameKind};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// A member that connects has this long to prove itself.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(5);
/// Questions answered at once per connection (more wait for their turn).
const IN_FLIGHT: usize = 256;
/// The longest wait a question may ask for.
const MAX_WAIT: Duration = Duration::from_secs(60);

pub async fn accept_loop(listener: TcpListener, inner: Weak<Inner>) {
    loop {
        let Ok((stream, from)) = listener.accept().await else { continue };
        let Some(inner) = inner.upgrade() else { return };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            if let Err(e) = serve(stream, Arc::downgrade(&inner)).await {
                tracing::info!("coop: connection from {from}: {e}");
            }
        });
    }
}

async fn serve(stream: TcpStream, inner: Weak<Inner>) -> Result<(), String> {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let (group, keys) = match inner.upgrade() {
        Some(i) => (i.me.group, i.me.keys.clone()),
        None => return Ok(()),
    };
    let challenge = wire::nonce();
    let c = Challenge { nonce: challenge.clone() };
    let buf = wire::encoded(wire::OP_CHALLENGE, FrameKind::Request, 0, &c, Bytes::new())?;
    wr.write_all(&buf).await.map_err(|e| e.to_string())?;
    let f = match tokio::time::timeout(HANDSHAKE_WITHIN, Frame::read_from(&mut rd)).await {
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no hello within {HANDSHAKE_WITHIN:?}")),
    };
    let hello: Hello = wire::body(&f, wire::OP_HELLO)?;
    // Refused: the connection is closed without a word (the asker says why it thinks so).
    wire::hello_ok(keys.as_ref(), &hello, group, &challenge).map_err(|e| format!("refused: {e}"))?;
    let w = Welcome { tag: wire::welcome_tag(keys.as_ref(), hello.epoch, group, &challenge, &hello.nonce) };
    let buf = wire::encoded(wire::OP_WELCOME, FrameKind::Reply, 0, &w, Bytes::new())?;
    wr.write_all(&buf).await.map_err(|e| e.to_string())?;

    let (out, writer) = wire::spawn_writer(wr);
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let result = loop {
        let f = match Frame::read_from(&mut rd).await {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e.to_string()),
        };
        let ask: Ask = match wire::body(&f, wire::OP_ASK) {
            Ok(a) => a,
            Err(e) => break Err(format!("bad question: {e}")),
        };
        let Ok(slot) = slots.clone().acquire_owned().await else { break Ok(()) };
        let Some(inner) = inner.upgrade() else { break Ok(()) };
        let (out, id) = (out.clone(), f.request_id);
        tokio::spawn(async move {
            let wait = Duration::from_millis(ask.wait_ms.into()).min(MAX_WAIT);
            inner.stats.answered.fetch_add(1, Ordering::Relaxed);
            let got = inner.get(ask.key, wait).await;
            drop(inner);
            let (answer, data) = match got {
                Ok(Value::Attr(a)) => (Answer::Attr(a), Bytes::new()),
                Ok(Value::Listing(l)) => (Answer::Listing((*l).clone()), Bytes::new()),
                Ok(Value::Piece(b)) => (Answer::Piece, b),
                Err(Failure { errno, why }) => (Answer::Failed { errno: errno.0, why }, Bytes::new()),
            };
            let buf = wire::encoded(wire::OP_ANSWER, FrameKind::Reply, id, &answer, data).or_else(|e| {
                let failed =
                    Answer::Failed { errno: shoal_proto::Errno::EIO.0, why: format!("cannot encode the answer: {e}") };
                wire::encoded(wire::OP_ANSWER, FrameKind::Reply, id, &failed, Bytes::new())
            });
            if let Ok(buf) = buf {
                let _ = out.send(buf);
            }
            drop(slot);
        });
    };
    drop(out);
    let _ = writer.await;
    result
}
