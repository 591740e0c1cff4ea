//! [`File`]: an open file, and striped I/O.
//!
//! A read or write of a byte range is split into per-object pieces by the file's layout
//! ([`shoal_placement::pieces`], and no piece larger than [`MAX_PIECE`]); all pieces are
//! sent at once (at most [`ClientOptions::max_in_flight`](crate::ClientOptions) per call)
//! to the servers holding the objects, and the answers are put back together in order.
//!
//! **File size.** A write piece sent to the server that holds the inode carries the new
//! end of file and raises the recorded size in the same request. When no piece of a write
//! went there, the new end is remembered and published with one `ExtendSize` request at
//! [`File::flush`], [`File::fsync`] or [`File::close`]. Reads are clamped at the size known
//! to this handle (at open, raised by its own writes, refreshed by [`File::stat`]); parts
//! of that range no object holds (holes, short objects) read as zeros.

use crate::client::{unexpected, Client, To};
use crate::error::{Error, Result};
use crate::options::OpenFlags;
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use shoal_placement::{pieces, Piece};
use shoal_proto::msg::{Attr, FileKind, Layout, Op, Reply, SetAttrs};
use shoal_proto::{Errno, Ino, ServerId};
use std::io::SeekFrom;
use std::sync::Arc;

/// Largest piece of one read or write request.
pub const MAX_PIECE: u64 = 8 << 20;

/// An open file. Clones share the handle (position, known size, unpublished size), so
/// several tasks can read and write disjoint ranges of one file concurrently.
///
/// Call [`File::close`] when done writing: it makes the data durable and publishes the
/// size. A handle dropped without `close` publishes a pending size in the background (if
/// its runtime still runs) but does not sync.
#[derive(Clone)]
pub struct File {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    ino: Ino,
    kind: FileKind,
    layout: Layout,
    readable: bool,
    writable: bool,
    append: bool,
    state: Mutex<State>,
    /// Position for `read`/`write`/`seek`; held across the I/O so those run in order.
    cursor: tokio::sync::Mutex<u64>,
    /// Runtime to publish a pending size on if the handle is dropped without `close`.
    runtime: Option<tokio::runtime::Handle>,
}

struct State {
    attr: Attr,
    /// Size as this handle knows it (server's at open, raised by its writes).
    size: u64,
    /// Size the inode's home server is known to have recorded.
    server_size: u64,
    /// End of file to publish with ExtendSize (writes that did not reach the home server).
    pending: Option<u64>,
    /// Whether this handle wrote (so `close` must sync).
    wrote: bool,
}

/// Split `[offset, offset+len)` into object pieces of at most `max` bytes each.
pub(crate) fn split_pieces(layout: &Layout, offset: u64, len: u64, max: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    for p in pieces(layout, offset, len) {
        let mut done = 0;
        while done < p.len {
            let take = (p.len - done).min(max.max(1));
            out.push(Piece {
                index: p.index,
                object_offset: p.object_offset + done,
                file_offset: p.file_offset + done,
                len: take,
            });
            done += take;
        }
    }
    out
}

/// Put the answers to the pieces of a read of `[offset, offset+total)` together. Short
/// answers (end of object, holes) leave zeros. A single complete answer is returned as is.
pub(crate) fn assemble(offset: u64, total: usize, mut parts: Vec<(Piece, Bytes)>) -> std::result::Result<Bytes, Errno> {
    for (p, data) in &parts {
        let start = p.file_offset.checked_sub(offset).ok_or(Errno::EPROTO)?;
        if data.len() as u64 > p.len || start + p.len > total as u64 {
            return Err(Errno::EPROTO);
        }
    }
    if parts.len() == 1 && parts[0].0.file_offset == offset && parts[0].1.len() == total {
        return Ok(parts.pop().map(|(_, d)| d).unwrap_or_default());
    }
    let mut buf = BytesMut::zeroed(total);
    for (p, data) in parts {
        let start = (p.file_offset - offset) as usize;
        buf[start..start + data.len()].copy_from_slice(&data);
    }
    Ok(buf.freeze())
}

/// Say which object an error is about (and which server, unless the error already does).
fn on_object(e: Error, index: u32, server: ServerId) -> Error {
    if e.context.is_empty() {
        e.within(format_args!("object {index} on server {server}"))
    } else {
        e.within(format_args!("object {index}"))
    }
}

impl File {
    /// A handle on a file with attributes `attr` (already checked by the caller).
    pub(crate) fn open(client: Client, attr: Attr, flags: &OpenFlags) -> Result<File> {
        let layout = match (&attr.kind, &attr.layout) {
            (FileKind::File, Some(l)) => {
                if l.stripe_size == 0 || l.servers.is_empty() {
                    return Err(Error::new(Errno::EPROTO, format!("file {} has an empty layout", attr.ino)));
                }
                l.clone()
            }
            (FileKind::File, None) => {
                return Err(Error::new(Errno::EPROTO, format!("file {} has no layout", attr.ino)));
            }
            _ => Layout { stripe_size: 0, servers: Vec::new() },
        };
        let size = attr.size;
        Ok(File {
            inner: Arc::new(Inner {
                client,
                ino: attr.ino,
                kind: attr.kind,
                layout,
                readable: flags.reads(),
                writable: flags.writes(),
                append: flags.append,
                state: Mutex::new(State { attr, size, server_size: size, pending: None, wrote: false }),
                cursor: tokio::sync::Mutex::new(0),
                runtime: tokio::runtime::Handle::try_current().ok(),
            }),
        })
    }

    /// The file's inode number.
    pub fn ino(&self) -> Ino {
        self.inner.ino
    }

    /// Where the file's bytes live (empty for a directory).
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The attributes as known to this handle, with the size raised by its own writes.
    pub fn attr(&self) -> Attr {
        let st = self.inner.state.lock();
        let mut a = st.attr.clone();
        a.size = st.size;
        a
    }

    fn what(&self, op: &str) -> String {
        format!("{op} {}", self.inner.ino)
    }

    /// Read up to `len` bytes at `offset`: fewer only at the end of the file (as known to
    /// this handle). Holes read as zeros.
    pub async fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        self.read_inner(offset, len).await.map_err(|e| e.within(self.what("read")))
    }

    async fn read_inner(&self, offset: u64, len: usize) -> Result<Bytes> {
        let inner = &*self.inner;
        if inner.kind == FileKind::Dir {
            return Err(Error::bare(Errno::EISDIR));
        }
        if !inner.readable {
            return Err(Error::bare(Errno::EBADF));
        }
        let size = inner.state.lock().size;
        if offset >= size || len == 0 {
            return Ok(Bytes::new());
        }
        let total = (size - offset).min(len as u64);
        let parts = split_pieces(&inner.layout, offset, total, MAX_PIECE);
        let client = &inner.client;
        let ino = inner.ino;
        let got: Vec<(Piece, Bytes)> = futures::stream::iter(parts)
            .map(|p| async move {
                let server = inner.layout.servers[p.index as usize];
                let op = Op::Read { ino, index: p.index, offset: p.object_offset, len: p.len as u32 };
                match client.call(To::Server(server), op, Bytes::new()).await {
                    Ok((Reply::Data, data)) => Ok((p, data)),
                    Ok((other, _)) => Err(unexpected(&other)),
                    // An object nobody wrote to yet: a hole.
                    Err(e) if e.errno == Errno::ENOENT => Ok((p, Bytes::new())),
                    Err(e) => Err(on_object(e, p.index, server)),
                }
            })
            .buffer_unordered(client.max_in_flight())
            .try_collect()
            .await?;
        assemble(offset, total as usize, got).map_err(|e| Error::new(e, "a server answered more bytes than asked"))
    }

    /// Write all of `data` at `offset` (in append mode: at the end of the file). Returns
    /// `data.len()`.
    pub async fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_bytes_at(offset, Bytes::copy_from_slice(data)).await
    }

    /// As [`File::write_at`], without copying `data`.
    pub async fn write_bytes_at(&self, offset: u64, data: Bytes) -> Result<usize> {
        self.write_inner(Some(offset), data).await.map(|(_, n)| n).map_err(|e| e.within(self.what("write")))
    }

    /// Write; `offset` is ignored in append mode. Returns where the data went and its length.
    async fn write_inner(&self, offset: Option<u64>, data: Bytes) -> Result<(u64, usize)> {
        let inner = &*self.inner;
        if inner.kind == FileKind::Dir {
            return Err(Error::bare(Errno::EISDIR));
        }
        if !inner.writable {
            return Err(Error::bare(Errno::EBADF));
        }
        let offset = match offset {
            Some(o) if !inner.append => o,
            _ => {
                let a = inner.client.getattr_fresh_inner(inner.ino).await?;
                let mut st = inner.state.lock();
                st.server_size = st.server_size.max(a.size);
                st.size = st.size.max(a.size);
                st.attr = a;
                st.size
            }
        };
        if data.is_empty() {
            return Ok((offset, 0));
        }
        let len = data.len() as u64;
        let end = offset.checked_add(len).ok_or_else(|| Error::bare(Errno::EFBIG))?;
        let client = &inner.client;
        let ino = inner.ino;
        let home = client.home_of(ino);
        let parts = split_pieces(&inner.layout, offset, len, MAX_PIECE);
        let any_local = parts.iter().any(|p| inner.layout.servers[p.index as usize] == home);
        inner.state.lock().wrote = true;
        let data = &data;
        let written: Result<Vec<()>> = futures::stream::iter(parts)
            .map(|p| async move {
                let server: ServerId = inner.layout.servers[p.index as usize];
                let start = (p.file_offset - offset) as usize;
                let chunk = data.slice(start..start + p.len as usize);
                let op = Op::Write {
                    ino,
                    index: p.index,
                    offset: p.object_offset,
                    file_end: end,
                    inode_local: server == home,
                };
                match client.call(To::Server(server), op, chunk).await {
                    Ok((Reply::Written { len }, _)) if len as u64 == p.len => Ok(()),
                    Ok((Reply::Written { len }, _)) => Err(Error::new(
                        Errno::EIO,
                        format!("server {server} wrote {len} of {} bytes of object {}", p.len, p.index),
                    )),
                    Ok((other, _)) => Err(unexpected(&other)),
                    Err(e) => Err(on_object(e, p.index, server)),
                }
            })
            .buffer_unordered(client.max_in_flight())
            .try_collect()
            .await;
        client.cache().forget_attr(ino);
        written?;
        let mut st = inner.state.lock();
        st.size = st.size.max(end);
        if any_local {
            st.server_size = st.server_size.max(end);
        } else {
            // Published at flush (also updates mtime, which only the home server keeps).
            st.pending = Some(st.pending.unwrap_or(0).max(end));
        }
        Ok((offset, data.len()))
    }

    /// Read up to `len` bytes at the handle's position and advance it.
    pub async fn read(&self, len: usize) -> Result<Bytes> {
        let mut pos = self.inner.cursor.lock().await;
        let b = self.read_at(*pos, len).await?;
        *pos += b.len() as u64;
        Ok(b)
    }

    /// Write `data` at the handle's position (at the end in append mode) and advance it.
    pub async fn write(&self, data: &[u8]) -> Result<usize> {
        let mut pos = self.inner.cursor.lock().await;
        let (at, n) = self
            .write_inner(Some(*pos), Bytes::copy_from_slice(data))
            .await
            .map_err(|e| e.within(self.what("write")))?;
        *pos = at + n as u64;
        Ok(n)
    }

    /// Move the handle's position (`End` is relative to the size known to the handle).
    pub async fn seek(&self, to: SeekFrom) -> Result<u64> {
        let mut pos = self.inner.cursor.lock().await;
        let size = self.inner.state.lock().size;
        let new = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => pos.checked_add_signed(d),
            SeekFrom::End(d) => size.checked_add_signed(d),
        };
        match new {
            Some(n) => {
                *pos = n;
                Ok(n)
            }
            None => Err(Error::new(Errno::EINVAL, self.what("seek before the start of"))),
        }
    }

    /// Publish the size reached by writes that did not go to the inode's home server.
    pub async fn flush(&self) -> Result<()> {
        self.flush_inner().await.map_err(|e| e.within(self.what("flush")))
    }

    async fn flush_inner(&self) -> Result<()> {
        let inner = &*self.inner;
        let Some(size) = inner.state.lock().pending.take() else { return Ok(()) };
        match inner.client.extend_size(inner.ino, size).await {
            Ok(()) => {
                let mut st = inner.state.lock();
                st.server_size = st.server_size.max(size);
                Ok(())
            }
            Err(e) => {
                let mut st = inner.state.lock();
                st.pending = Some(st.pending.unwrap_or(0).max(size));
                Err(e)
            }
        }
    }

    /// Make the data and the size durable: flush, then every server of the layout syncs
    /// the file's object and the inode's home server syncs its metadata log, in parallel.
    pub async fn fsync(&self) -> Result<()> {
        self.sync(false).await.map_err(|e| e.within(self.what("fsync")))
    }

    /// As [`File::fsync`], but servers may skip what is not needed to read the data back
    /// (fdatasync).
    pub async fn sync_data(&self) -> Result<()> {
        self.sync(true).await.map_err(|e| e.within(self.what("fdatasync")))
    }

    async fn sync(&self, data_only: bool) -> Result<()> {
        self.flush_inner().await?;
        let inner = &*self.inner;
        let client = &inner.client;
        let ino = inner.ino;
        let home = client.home_of(ino);
        let mut servers = inner.layout.servers.clone();
        servers.push(home);
        servers.sort();
        servers.dedup();
        futures::stream::iter(servers)
            .map(|s| async move {
                match client.call(To::Server(s), Op::Fsync { ino, data_only }, Bytes::new()).await {
                    Ok((Reply::Ok, _)) => Ok(()),
                    Ok((other, _)) => Err(unexpected(&other)),
                    Err(e) => Err(e.within(format_args!("server {s}"))),
                }
            })
            .buffer_unordered(client.max_in_flight())
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// Cut or extend the file to `size` bytes (flushing first). EINVAL on a handle not
    /// open for writing.
    pub async fn set_len(&self, size: u64) -> Result<()> {
        let r = async {
            if !self.inner.writable {
                return Err(Error::bare(Errno::EINVAL));
            }
            self.flush_inner().await?;
            let a = self.inner.client.setattr_inner(self.inner.ino, SetAttrs { size: Some(size), ..Default::default() }).await?;
            let mut st = self.inner.state.lock();
            st.size = a.size;
            st.server_size = a.size;
            st.attr = a;
            Ok(())
        };
        r.await.map_err(|e: Error| e.within(self.what("set length of")))
    }

    /// Flush, then fetch the attributes from the server; the handle's size follows them.
    pub async fn stat(&self) -> Result<Attr> {
        let r = async {
            self.flush_inner().await?;
            let a = self.inner.client.getattr_fresh_inner(self.inner.ino).await?;
            let mut st = self.inner.state.lock();
            st.server_size = a.size;
            // Writes that finished while we asked may have raised it further.
            st.size = a.size.max(st.pending.unwrap_or(0));
            st.attr = a;
            let mut out = st.attr.clone();
            out.size = st.size;
            Ok(out)
        };
        r.await.map_err(|e: Error| e.within(self.what("stat")))
    }

    /// Close the handle: if it wrote anything, [`File::fsync`] (the durability promise:
    /// after `close` returns, the data survives a power loss and every client that opens
    /// the file sees it and its size).
    pub async fn close(self) -> Result<()> {
        let wrote = self.inner.state.lock().wrote;
        if wrote {
            self.fsync().await
        } else {
            self.flush().await
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let pending = self.state.get_mut().pending.take();
        if let (Some(size), Some(rt)) = (pending, &self.runtime) {
            let (client, ino) = (self.client.clone(), self.ino);
            rt.spawn(async move {
                if let Err(e) = client.extend_size(ino, size).await {
                    tracing::warn!("publishing the size of {ino} after its handle was dropped: {e}");
                }
            });
        }
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File").field("ino", &self.inner.ino).field("layout", &self.inner.layout).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(ss: u64, n: u32) -> Layout {
        Layout { stripe_size: ss, servers: (0..n).map(ServerId).collect() }
    }

    #[test]
    fn pieces_are_capped() {
        let l = layout(1 << 30, 2);
        let ps = split_pieces(&l, 100, 20 << 20, MAX_PIECE);
        assert_eq!(ps.len(), 3);
        assert!(ps.iter().all(|p| p.len <= MAX_PIECE && p.index == 0));
        assert_eq!(ps[1].file_offset, 100 + MAX_PIECE);
        assert_eq!(ps[1].object_offset, 100 + MAX_PIECE);
        assert_eq!(ps.iter().map(|p| p.len).sum::<u64>(), 20 << 20);
        // Small stripes are not merged or changed.
        let l = layout(4096, 3);
        assert_eq!(split_pieces(&l, 4000, 9000, MAX_PIECE), pieces(&l, 4000, 9000));
        assert!(split_pieces(&l, 10, 0, MAX_PIECE).is_empty());
    }

    #[test]
    fn assembly_zero_fills_short_answers() {
        let l = layout(4096, 3);
        let ps = split_pieces(&l, 4000, 9000, MAX_PIECE);
        // Every piece answered in full but out of order, except the second: short by half.
        let mut parts: Vec<(Piece, Bytes)> = ps
            .iter()
            .map(|p| {
                let n = if p.index == 1 { p.len as usize / 2 } else { p.len as usize };
                (*p, Bytes::from(vec![p.index as u8 + 1; n]))
            })
            .collect();
        parts.reverse();
        let out = assemble(4000, 9000, parts).unwrap();
        assert_eq!(out.len(), 9000);
        assert!(out[..96].iter().all(|&b| b == 1));
        assert!(out[96..96 + 2048].iter().all(|&b| b == 2));
        assert!(out[96 + 2048..96 + 4096].iter().all(|&b| b == 0), "short answer is zero-filled");
        assert!(out[96 + 4096..96 + 8192].iter().all(|&b| b == 3));
        assert!(out[96 + 8192..].iter().all(|&b| b == 1));
    }

    #[test]
    fn assembly_of_holes_and_single_pieces() {
        let l = layout(4096, 2);
        let ps = split_pieces(&l, 0, 8192, MAX_PIECE);
        let parts = ps.iter().map(|p| (*p, Bytes::new())).collect();
        assert_eq!(assemble(0, 8192, parts).unwrap(), Bytes::from(vec![0u8; 8192]));
        let whole = Bytes::from(vec![7u8; 100]);
        let p = split_pieces(&l, 50, 100, MAX_PIECE)[0];
        let out = assemble(50, 100, vec![(p, whole.clone())]).unwrap();
        assert_eq!(out.as_ptr(), whole.as_ptr(), "a complete single answer is not copied");
    }

    #[test]
    fn assembly_rejects_oversized_answers() {
        let l = layout(4096, 1);
        let p = split_pieces(&l, 0, 10, MAX_PIECE)[0];
        assert_eq!(assemble(0, 10, vec![(p, Bytes::from(vec![0u8; 11]))]), Err(Errno::EPROTO));
        let bad = Piece { index: 0, object_offset: 0, file_offset: 5, len: 10 };
        assert_eq!(assemble(0, 10, vec![(bad, Bytes::new())]), Err(Errno::EPROTO));
        let before = Piece { index: 0, object_offset: 0, file_offset: 0, len: 1 };
        assert_eq!(assemble(1, 10, vec![(before, Bytes::new())]), Err(Errno::EPROTO));
    }
}
