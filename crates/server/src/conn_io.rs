//! Buffered reading and writing for connections that hold memory only while bytes are
//! waiting: an idle connection (the common state of a client's pooled connections, and of
//! every connection of a flood) holds no buffer at all.
//!
//! tokio's `BufReader`/`BufWriter` allocate their buffer up front and keep it for the life
//! of the connection; at 256 KiB each (zeroed for the reader) a few thousand idle
//! connections held gigabytes, and the allocator kept that memory after they closed. Here
//! a buffer of [`CHUNK`] is taken when bytes arrive or replies are queued and given back as
//! soon as it is drained, so memory follows traffic, not connection count.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Size of a read or write buffer while in use: room for hundreds of small requests or
/// replies per system call. Reads at least this large bypass the buffer.
pub const CHUNK: usize = 64 << 10;

/// A buffered reader whose buffer exists only while it holds unread bytes.
pub struct LazyReader<R> {
    inner: R,
    /// Bytes read from `inner` and not yet handed out are `buf[pos..]`; an empty `Vec`
    /// (no allocation) whenever that range is empty.
    buf: Vec<u8>,
    pos: usize,
}

impl<R> LazyReader<R> {
    pub fn new(inner: R) -> LazyReader<R> {
        LazyReader { inner, buf: Vec::new(), pos: 0 }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LazyReader<R> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos == this.buf.len() {
            if out.remaining() >= CHUNK {
                // A large read (the data of a big frame): straight into the caller's buffer.
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            // Take a buffer for this read only; if nothing is there yet it is freed at once,
            // so a connection waiting for its next request holds none.
            let mut buf = Vec::with_capacity(CHUNK);
            let mut rb = ReadBuf::uninit(&mut buf.spare_capacity_mut()[..CHUNK]);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            // SAFETY: `ReadBuf` guarantees its first `filled().len()` bytes were initialised,
            // and they are the first `n` bytes of `buf`'s spare capacity.
            unsafe { buf.set_len(n) };
            this.buf = buf;
            this.pos = 0;
        }
        let n = out.remaining().min(this.buf.len() - this.pos);
        out.put_slice(&this.buf[this.pos..this.pos + n]);
        this.pos += n;
        if this.pos == this.buf.len() {
            this.buf = Vec::new();
            this.pos = 0;
        }
        Poll::Ready(Ok(()))
    }
}

/// A buffered writer whose buffer exists only between a write and the flush that sends it.
pub struct LazyWriter<W> {
    inner: W,
    /// Bytes accepted and not yet written are `buf[done..]`; an empty `Vec` (no allocation)
    /// after every complete flush.
    buf: Vec<u8>,
    done: usize,
}

impl<W> LazyWriter<W> {
    pub fn new(inner: W) -> LazyWriter<W> {
        LazyWriter { inner, buf: Vec::new(), done: 0 }
    }
}

impl<W: AsyncWrite + Unpin> LazyWriter<W> {
    /// Write out everything buffered, then free the buffer.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.done < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.done += n;
        }
        self.buf = Vec::new();
        self.done = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for LazyWriter<W> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.buf.len() + data.len() > CHUNK {
            ready!(this.poll_drain(cx))?;
        }
        if data.len() >= CHUNK {
            // Large data (a read reply's bytes): from the caller's buffer, no copy.
            return Pin::new(&mut this.inner).poll_write(cx, data);
        }
        if this.buf.capacity() == 0 {
            this.buf.reserve_exact(CHUNK);
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_pass_through_in_order_and_no_buffer_is_held_when_idle() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut w = LazyWriter::new(a);
        let mut r = LazyReader::new(b);
        let big: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        let mut expect = Vec::new();
        for i in 0..50u8 {
            w.write_all(&[i; 100]).await.unwrap();
            expect.extend_from_slice(&[i; 100]);
        }
        w.write_all(&big).await.unwrap();
        expect.extend_from_slice(&big);
        w.write_all(b"tail").await.unwrap();
        expect.extend_from_slice(b"tail");
        w.flush().await.unwrap();
        assert_eq!(w.buf.capacity(), 0, "the writer frees its buffer once flushed");

        let mut got = vec![0u8; expect.len()];
        let mut at = 0;
        for step in [24, 76, 5000, 200_000].iter().cycle() {
            if at == got.len() {
                break;
            }
            let end = (at + step).min(got.len());
            r.read_exact(&mut got[at..end]).await.unwrap();
            at = end;
        }
        assert!(got == expect);
        assert_eq!(r.buf.capacity(), 0, "the reader frees its buffer once drained");
        drop(w);
        assert_eq!(r.read(&mut [0u8; 10]).await.unwrap(), 0, "end of stream");
    }
}
