//! A connection's two halves, plain TCP or TLS (`[security] tls = true`), as one type each
//! so that the connection code (net.rs) is the same for both.
//!
//! An enum, not a boxed trait object: the plain path pays one predictable branch per
//! read or write call (into a buffer of up to 64 KiB), no allocation and no indirect call.
//! The TLS halves come from `tokio::io::split` (rustls keeps one state for both
//! directions); the plain ones are tokio's owned halves, as before TLS existed.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

pub enum ConnRead {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<TlsStream<TcpStream>>),
}

pub enum ConnWrite {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<TlsStream<TcpStream>>),
}

/// Split a plain connection.
pub fn plain(stream: TcpStream) -> (ConnRead, ConnWrite) {
    let (rd, wr) = stream.into_split();
    (ConnRead::Plain(rd), ConnWrite::Plain(wr))
}

/// Split a TLS connection (its handshake done).
pub fn tls(stream: TlsStream<TcpStream>) -> (ConnRead, ConnWrite) {
    let (rd, wr) = tokio::io::split(stream);
    (ConnRead::Tls(rd), ConnWrite::Tls(wr))
}

impl AsyncRead for ConnRead {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ConnRead::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ConnRead::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ConnWrite {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ConnWrite::Plain(w) => Pin::new(w).poll_write(cx, data),
            ConnWrite::Tls(w) => Pin::new(w).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ConnWrite::Plain(w) => Pin::new(w).poll_flush(cx),
            ConnWrite::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ConnWrite::Plain(w) => Pin::new(w).poll_shutdown(cx),
            ConnWrite::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}
