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
//!
//! **Write-behind.** A write of at most [`ClientOptions::write_behind`](crate::ClientOptions)
//! bytes returns as soon as its requests are on their way (sent on the sockets, or queued
//! behind a full one): the caller prepares the next buffer while the servers store this
//! one. At most `write_behind` bytes of a handle's writes are in flight; a write that
//! would pass the bound, or that overlaps a write still in flight, first waits for the
//! oldest (or the overlapping) one. A failure of a write that has already returned is kept
//! and returned by the next `write`, `flush`, `fsync`, `set_len` or `close` on the
//! handle (whichever comes first), so it is never lost. `flush`, `fsync`, `close`,
//! `set_len` and `stat` wait for every write in flight first (`stat` leaves a failure to
//! the others: a FUSE mount calls it for the kernel's own attribute checks); a read waits
//! for the writes in flight that overlap it (a handle reads its own writes). A write-behind
//! write goes out on the caller's thread; the runtime only takes it over when a reply wakes
//! it (`detach.rs`), so a write wakes no other thread.
//!
//! **Gathering.** While a write-behind write of the handle is in flight (or when the caller
//! says more follows, [`File::write_bytes_at_then_more`]), a write that does not fill its
//! object piece is not sent: its bytes are held in a *cell* (an object piece of at most
//! [`GATHER_MAX`] bytes, `gather.rs`) with the writes that fall in the same cell after it,
//! in any order: the continuation of a write the kernel cut in two, the next small records
//! of a sequential writer, the interleaved records of several processes sharing a handle
//! (IOR-hard through a FUSE mount, where every process's descriptor is one handle). A cell
//! goes out as one request once its bytes are all there; otherwise its runs of bytes go
//! out, one request each, [`HOLD_FOR`] after it was started, or as soon as anything needs
//! them (a write in flight over them, a read of their range, `flush`, `fsync`, `stat`,
//! `set_len`, `append`, `close`, drop). The promise of write-behind ("on its way", a failure
//! reported by a later call) is unchanged; only "on its way" may now start up to
//! [`HOLD_FOR`] later. A handle whose cells keep holding a single write (random writes)
//! stops starting cells until a write lands next to one in flight.
//!
//! **Appends.** In append mode (and with [`File::append`]) the offset is chosen by the
//! inode's home server, where the size is authoritative, in the same step that stores the
//! data and raises the size (`Op::Append`): appends from any number of handles and clients
//! never overlap, and none is lost. They are not written behind (the caller learns where
//! the data went, or why it failed, from the reply).
//!
//! **Readahead.** A handle whose reads move forward (each starts at or a little after
//! where the previous one ended) gets the next pieces of the file fetched before it asks,
//! up to [`ClientOptions::readahead`](crate::ClientOptions) bytes ahead, in pieces of at
//! most [`READAHEAD_CHUNK`] bytes that never cross an object boundary (one request each).
//! The window starts at twice the read size and doubles with every forward read; a read
//! elsewhere drops it. Prefetched data belongs to the handle: a write or `set_len` through
//! the handle drops it, so does [`File::stat`] when the file changed, and a new open
//! starts with none (close-to-open: data written and closed by others is seen by the next
//! open). Prefetching stops at the size known to the handle.

use crate::caps::Holder;
use crate::client::{unexpected, Client, To};
use crate::error::{Error, Result};
use crate::gather::{cell_of, Cell};
use crate::options::OpenFlags;
use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use shoal_placement::{pieces, Piece};
use shoal_proto::cap::{Capability, RIGHT_READ, RIGHT_WRITE};
use shoal_proto::msg::{Attr, FileKind, Layout, Op, Reply, SetAttrs};
use shoal_proto::{Errno, Ino, ServerId};
use std::collections::VecDeque;
use std::io::SeekFrom;
use std::sync::Arc;

/// Largest piece of one read or write request.
pub const MAX_PIECE: u64 = 8 << 20;

/// Largest append made in one atomic step (one `Append` request); see [`File::append`].
pub const MAX_APPEND: u64 = MAX_PIECE;

/// Largest piece the readahead fetches with one request.
pub const READAHEAD_CHUNK: u64 = 1 << 20;

pub use crate::gather::GATHER_MAX;

/// Longest write-behind bytes are held in a gathering cell (see "Gathering").
pub const HOLD_FOR: std::time::Duration = std::time::Duration::from_millis(100);

/// Cells a handle holds at most; a write that would start one more sends the oldest.
const MAX_CELLS: usize = 32;

/// Times `stat` asks again when a `set_len` through the handle overtook its answer.
const STAT_TRIES: usize = 4;

/// Cells in a row that held a single write after which a handle starts no new cell
/// unless a write lands next to one in flight.
const LONELY_MAX: u32 = 4;

/// An open file. Clones share the handle (position, known size, unpublished size, writes
/// in flight, prefetched data), so several tasks can read and write disjoint ranges of one
/// file concurrently.
///
/// Call [`File::close`] when done writing: it waits for the writes in flight, makes the
/// data durable and publishes the size, and reports any write that failed after it had
/// returned. A handle dropped without `close` finishes its writes and publishes a pending
/// size in the background (if its runtime still runs) but does not sync, and nobody learns
/// of a failure.
#[derive(Clone)]
pub struct File {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    ino: Ino,
    /// The capability sent with every data operation (`caps.rs`).
    cap: Arc<Holder>,
    kind: FileKind,
    layout: Arc<Layout>,
    readable: bool,
    writable: bool,
    append: bool,
    state: Mutex<State>,
    /// Writes in flight, held and prefetched data. Locked before `state` when both are
    /// needed. Shared with the tasks that finish writes (they send what was held behind).
    io: Arc<Mutex<Io>>,
    /// Position for `read`/`write`/`seek`; held across the I/O so those run in order.
    cursor: tokio::sync::Mutex<u64>,
    /// Runtime to finish writes and publish a pending size on if the handle is dropped
    /// without `close`.
    runtime: Option<tokio::runtime::Handle>,
    /// Counted among the client's open files (a regular file, until `close` or drop of the
    /// last clone uncounts it): see `open_files.rs`.
    counted: std::sync::atomic::AtomicBool,
    /// Readahead turned off for this handle ([`File::set_readahead`]).
    no_readahead: std::sync::atomic::AtomicBool,
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
    /// Bumped by every `set_len`, the one change that may lower the size: attributes
    /// fetched from the server while it was bumped may predate it and are not applied.
    epoch: u64,
}

type Outcome<T> = std::result::Result<T, Error>;
type WriteFuture = Shared<BoxFuture<'static, Outcome<()>>>;
type ChunkFuture = Shared<BoxFuture<'static, Outcome<Bytes>>>;

/// A write whose requests are out (write-behind, or a write its caller waits for).
struct InFlight {
    id: u64,
    start: u64,
    end: u64,
    /// A piece went to the inode's home server, which raised the size itself.
    reached_home: bool,
    /// The caller waits for it and gets its outcome (a failure is not kept for later).
    awaited: bool,
    done: WriteFuture,
}

/// A prefetched piece `[start, end)` of the file (one request).
struct Chunk {
    start: u64,
    end: u64,
    data: ChunkFuture,
}

#[derive(Default)]
struct Io {
    /// Writes in flight, oldest first.
    writes: Vec<InFlight>,
    /// Bytes of the write-behind writes among them.
    write_bytes: u64,
    next_write: u64,
    /// The first failure of a write that had already returned, not reported yet.
    failed: Option<Error>,
    /// Write-behind bytes gathered and not sent yet (see "Gathering"), by cell, sorted; at
    /// most [`MAX_CELLS`] (their bytes join `write_bytes` when they are sent). Their bytes
    /// overlap no write in flight.
    cells: Vec<Cell>,
    /// Cells started so far (names them for their timers).
    holds: u64,
    /// Cells in a row that were sent holding a single write.
    lonely: u32,
    /// Where a forward reader is expected next (end of the last read).
    ra_next: u64,
    /// Length of the last read.
    ra_last: u64,
    /// Bytes to keep prefetched beyond the current read (0: not reading forward).
    ra_window: u64,
    /// Prefetched pieces, in file order, not overlapping.
    chunks: VecDeque<Chunk>,
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

/// The object pieces of `[from, to)` for readahead: split at object boundaries and at
/// multiples of [`READAHEAD_CHUNK`] in the file, so that the pieces of one file are the
/// same whatever the reads that asked for them.
fn ra_pieces(layout: &Layout, from: u64, to: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    for p in pieces(layout, from, to - from) {
        let mut done = 0;
        while done < p.len {
            let at = p.file_offset + done;
            let take = (p.len - done).min(READAHEAD_CHUNK - at % READAHEAD_CHUNK);
            out.push(Piece { index: p.index, object_offset: p.object_offset + done, file_offset: at, len: take });
            done += take;
        }
    }
    out
}

/// What sending a write needs, for the tasks that finish writes and the timers that end
/// holds. They hold this, not the handle (which `File::close` must find with no other
/// reference when it is the last).
#[derive(Clone)]
struct Sender {
    client: Client,
    cap: Arc<Holder>,
    layout: Arc<Layout>,
    ino: Ino,
    io: Arc<Mutex<Io>>,
}

impl Sender {
    /// Put the held bytes of the cells `which` picks among the writes in flight; the caller
    /// launches the returned writes once it has let go of the lock on `io`.
    fn release(&self, io: &mut Io, which: impl Fn(&Cell) -> bool) -> Vec<WriteFuture> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < io.cells.len() {
            if !which(&io.cells[i]) {
                i += 1;
                continue;
            }
            let cell = io.cells.remove(i);
            io.write_bytes += cell.held();
            for (start, data) in cell.into_writes() {
                out.push(self.push(io, start, data));
            }
        }
        out
    }

    /// Add a write-behind write of `data` at `start`, whose bytes `write_bytes` already
    /// counts, to the writes in flight. Nothing is sent until it is polled (launched).
    fn push(&self, io: &mut Io, start: u64, data: Bytes) -> WriteFuture {
        let end = start + data.len() as u64;
        let home = self.client.home_of(self.ino);
        let reached_home =
            pieces(&self.layout, start, end - start).iter().any(|p| self.layout.servers[p.index as usize] == home);
        let fut = write_pieces(self.client.clone(), self.cap.clone(), self.layout.clone(), self.ino, start, data);
        let done = fut.boxed().shared();
        let id = io.next_write;
        io.next_write += 1;
        io.writes.push(InFlight { id, start, end, reached_home, awaited: false, done: done.clone() });
        done
    }

    /// Send what cell `id` still holds after [`HOLD_FOR`].
    fn end_hold_later(&self, id: u64) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let me = self.clone();
        crate::detach::run(rt, async move {
            tokio::time::sleep(HOLD_FOR).await;
            let writes = {
                let mut io = me.io.lock();
                if let Some(c) = io.cells.iter().find(|c| c.id == id) {
                    io.lonely = if c.writes > 1 { 0 } else { io.lonely.saturating_add(1) };
                }
                me.release(&mut io, |c| c.id == id)
            };
            for w in writes {
                launch(w);
            }
        });
    }
}

/// What [`File::gather`] did with a write.
enum Gathered {
    /// Held, or sent behind: the caller's write is done; these writes (its parts that fill
    /// their cells, cells it completed) are to be launched.
    Taken(Vec<WriteFuture>),
    /// Left to the caller; these writes (held bytes it overlaps) are to be launched first.
    Left(Vec<WriteFuture>),
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

/// `[offset, offset+total)` out of prefetched pieces `(start, data)` that cover it, in
/// order. Bytes a piece's answer lacks (end of object, hole) are zeros. Slices a single
/// piece without copying.
fn from_chunks(offset: u64, total: usize, parts: Vec<(u64, Bytes)>) -> Bytes {
    let end = offset + total as u64;
    if let [(start, data)] = &parts[..] {
        if *start <= offset && start + data.len() as u64 >= end {
            return data.slice((offset - start) as usize..(end - start) as usize);
        }
    }
    let mut buf = BytesMut::zeroed(total);
    for (start, data) in parts {
        let from = start.max(offset);
        let to = (start + data.len() as u64).min(end);
        if from < to {
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - start) as usize..(to - start) as usize]);
        }
    }
    buf.freeze()
}

/// The capability rights a handle opened with `flags` needs.
pub(crate) fn rights_of(flags: &OpenFlags) -> u8 {
    (if flags.reads() { RIGHT_READ } else { 0 }) | (if flags.writes() { RIGHT_WRITE } else { 0 })
}

/// Say which object an error is about (and which server, unless the error already does).
fn on_object(e: Error, index: u32, server: ServerId) -> Error {
    if e.context.is_empty() {
        e.within(format_args!("object {index} on server {server}"))
    } else {
        e.within(format_args!("object {index}"))
    }
}

/// Read one object piece: its bytes (fewer at the end of the object, none for an object
/// nobody wrote yet).
pub(crate) async fn read_piece(client: &Client, cap: &Holder, layout: &Layout, ino: Ino, p: Piece) -> Result<Bytes> {
    let server = layout.servers[p.index as usize];
    let call = |cap| {
        let op = Op::Read { ino, index: p.index, offset: p.object_offset, len: p.len as u32, cap };
        client.call(To::Server(server), op, Bytes::new())
    };
    match cap.with(client, call).await {
        Ok((Reply::Data, data)) if data.len() as u64 <= p.len => Ok(data),
        Ok((Reply::Data, _)) => Err(Error::new(Errno::EPROTO, "a server answered more bytes than asked")),
        Ok((other, _)) => Err(unexpected(&other)),
        // An object nobody wrote to yet: a hole.
        Err(e) if e.errno == Errno::ENOENT => Ok(Bytes::new()),
        Err(e) => Err(on_object(e, p.index, server)),
    }
}

/// Write one object piece, `chunk`, of a write that ends at `end` in the file, to `server`
/// (which holds object `p.index`); `inode_local`: that server is the inode's home. `copies`:
/// the layout's replica count, which the server holding the object needs to keep them.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn write_piece(
    client: &Client,
    cap: &Holder,
    ino: Ino,
    server: ServerId,
    p: Piece,
    chunk: Bytes,
    end: u64,
    copies: u8,
) -> Result<()> {
    let inode_local = server == client.home_of(ino);
    let call = |cap| {
        let op = Op::Write { ino, index: p.index, offset: p.object_offset, file_end: end, inode_local, cap, copies };
        client.call(To::Server(server), op, chunk.clone())
    };
    match cap.with(client, call).await {
        Ok((Reply::Written { len }, _)) if len as u64 == p.len => Ok(()),
        Ok((Reply::Written { len }, _)) => {
            Err(Error::new(Errno::EIO, format!("server {server} wrote {len} of {} bytes of object {}", p.len, p.index)))
        }
        Ok((other, _)) => Err(unexpected(&other)),
        Err(e) => Err(on_object(e, p.index, server)),
    }
}

/// Start `fut` (a write-behind write, a readahead piece) now, on this thread, and let the
/// runtime finish it once a reply wakes it (`detach.rs`). Finishing matters even when
/// nobody awaits the outcome: a request that is half-way through opening a connection
/// holds that connection slot until it is polled again (`shoal_rpc::Pool`).
fn launch<T: Clone + Send + Sync + 'static>(fut: Shared<BoxFuture<'static, Outcome<T>>>) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => crate::detach::run(rt, async move {
            let _ = fut.await;
        }),
        Err(_) => {
            let _ = fut.now_or_never();
        }
    }
}

/// Send the pieces of a write of `data` at `offset` (ending at `end`) and wait for every
/// answer.
async fn write_pieces(
    client: Client,
    cap: Arc<Holder>,
    layout: Arc<Layout>,
    ino: Ino,
    offset: u64,
    data: Bytes,
) -> Result<()> {
    let len = data.len() as u64;
    let end = offset + len;
    let parts = split_pieces(&layout, offset, len, MAX_PIECE);
    let (client, cap, layout, data) = (&client, &*cap, &layout, &data);
    futures::stream::iter(parts)
        .map(|p| async move {
            let server: ServerId = layout.servers[p.index as usize];
            let start = (p.file_offset - offset) as usize;
            write_piece(client, cap, ino, server, p, data.slice(start..start + p.len as usize), end, layout.replicas)
                .await
        })
        .buffer_unordered(client.max_in_flight())
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

impl File {
    /// A handle on a file with attributes `attr` (already checked by the caller), with the
    /// capability a create just brought if there is one.
    pub(crate) fn open(client: Client, attr: Attr, flags: &OpenFlags) -> Result<File> {
        let cap = client.cap_stash().take(attr.ino, rights_of(flags));
        File::open_with_cap(client, attr, flags, cap)
    }

    /// As [`File::open`], with the capability the open brought (`None`: get one at the
    /// first data operation).
    pub(crate) fn open_with_cap(
        client: Client,
        attr: Attr,
        flags: &OpenFlags,
        cap: Option<(Capability, std::time::Instant)>,
    ) -> Result<File> {
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
            _ => Layout { stripe_size: 0, servers: Vec::new(), replicas: 1 },
        };
        let size = attr.size;
        let counted = attr.kind == FileKind::File;
        if counted {
            client.open_files().opened(attr.ino);
        }
        let cap = Arc::new(Holder::new(&client, attr.ino, rights_of(flags), cap));
        Ok(File {
            inner: Arc::new(Inner {
                client,
                ino: attr.ino,
                cap,
                kind: attr.kind,
                layout: Arc::new(layout),
                readable: flags.reads(),
                writable: flags.writes(),
                append: flags.append,
                state: Mutex::new(State { attr, size, server_size: size, pending: None, wrote: false, epoch: 0 }),
                io: Arc::new(Mutex::new(Io::default())),
                cursor: tokio::sync::Mutex::new(0),
                runtime: tokio::runtime::Handle::try_current().ok(),
                counted: std::sync::atomic::AtomicBool::new(counted),
                no_readahead: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// The file's inode number.
    pub fn ino(&self) -> Ino {
        self.inner.ino
    }

    /// Turn this handle's readahead on (the default, when the client has it) or off, as
    /// `posix_fadvise(RANDOM)` does: for a handle shared by readers of disjoint ranges
    /// (the tasks of a container), where reads that look sequential are not, and
    /// prefetching would fetch what another reader fetches again. Applies to all clones.
    pub fn set_readahead(&self, on: bool) {
        self.inner.no_readahead.store(!on, std::sync::atomic::Ordering::Relaxed);
        if !on {
            self.inner.io.lock().chunks.clear();
        }
    }

    /// Where the file's bytes live (empty for a directory).
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// Whether writes through this handle may return before the servers stored them
    /// (write-behind is on and the handle is not in append mode): a failure may then be
    /// reported by a later call, at the latest by `close`.
    pub fn writes_behind(&self) -> bool {
        self.inner.client.options().write_behind > 0 && self.inner.writable && !self.inner.append
    }

    /// The attributes as known to this handle, with the size raised by its own writes
    /// (including writes still in flight).
    pub fn attr(&self) -> Attr {
        let st = self.inner.state.lock();
        let mut a = st.attr.clone();
        a.size = st.size;
        a
    }

    pub(crate) fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The capability sent with this handle's data operations.
    pub(crate) fn holder(&self) -> &Holder {
        &self.inner.cap
    }

    /// Before a list read or write (`list_io.rs`): the handle may do it, its capability is
    /// at hand, and its own writes in flight have landed (a list read sees them, a list
    /// write lands after them). Returns the size as the handle knows it.
    pub(crate) async fn ready_for_list(&self, write: bool) -> Result<u64> {
        let inner = &*self.inner;
        if inner.kind == FileKind::Dir {
            return Err(Error::bare(Errno::EISDIR));
        }
        if (write && !inner.writable) || (!write && !inner.readable) {
            return Err(Error::bare(Errno::EBADF));
        }
        inner.cap.get(&inner.client).await?;
        self.wait_writes(None).await;
        Ok(inner.state.lock().size)
    }

    /// A list write reaching `end` finished; `reached_home`: a piece went to the inode's
    /// home server, which raised the size itself (else the size is published at flush).
    pub(crate) fn wrote_to(&self, end: u64, reached_home: bool) {
        let inner = &*self.inner;
        // Prefetched data may hold what the pieces replaced.
        inner.io.lock().chunks.clear();
        {
            let mut st = inner.state.lock();
            st.size = st.size.max(end);
            st.wrote = true;
            if reached_home {
                st.server_size = st.server_size.max(end);
            } else {
                st.pending = Some(st.pending.unwrap_or(0).max(end));
            }
        }
        inner.client.cache().forget_attr(inner.ino);
    }

    pub(crate) fn what(&self, op: &str) -> String {
        format!("{op} {}", self.inner.ino)
    }

    fn sender(&self) -> Sender {
        let inner = &*self.inner;
        Sender {
            client: inner.client.clone(),
            cap: inner.cap.clone(),
            layout: inner.layout.clone(),
            ino: inner.ino,
            io: inner.io.clone(),
        }
    }

    // ---------------------------------------------------------------- writes in flight

    /// Account for the writes in flight that have finished (each is polled once): sizes,
    /// and the failure of a write-behind write, kept for the next call to report.
    fn harvest(&self, io: &mut Io) {
        let mut i = 0;
        while i < io.writes.len() {
            let Some(outcome) = io.writes[i].done.clone().now_or_never() else {
                i += 1;
                continue;
            };
            let w = io.writes.remove(i);
            if !w.awaited {
                io.write_bytes -= w.end - w.start;
            }
            match outcome {
                Ok(()) => {
                    let mut st = self.inner.state.lock();
                    st.size = st.size.max(w.end);
                    if w.reached_home {
                        st.server_size = st.server_size.max(w.end);
                    } else {
                        // Published at flush (also updates mtime, which only the home server keeps).
                        st.pending = Some(st.pending.unwrap_or(0).max(w.end));
                    }
                }
                Err(e) if !w.awaited => {
                    if io.failed.is_none() {
                        io.failed = Some(e.within(format_args!(
                            "an earlier write at {} of {} bytes",
                            w.start,
                            w.end - w.start
                        )));
                    }
                }
                Err(_) => {} // its caller has it
            }
            self.inner.client.cache().forget_attr(self.inner.ino);
        }
    }

    /// Wait until the writes in flight now that overlap `range` (all of them if `None`)
    /// have finished.
    async fn wait_writes(&self, range: Option<(u64, u64)>) {
        let overlaps = |s: u64, e: u64| range.is_none_or(|(rs, re)| s < re && rs < e);
        let sender = self.sender();
        let (before, held) = {
            let mut io = self.inner.io.lock();
            // Held bytes in the range go now: they are among the writes to wait for.
            let held = sender.release(&mut io, |c| range.is_none_or(|(s, e)| c.overlaps(s, e)));
            (io.next_write, held)
        };
        for w in held {
            launch(w);
        }
        loop {
            let next = {
                let mut io = self.inner.io.lock();
                self.harvest(&mut io);
                io.writes.iter().find(|w| w.id < before && overlaps(w.start, w.end)).map(|w| w.done.clone())
            };
            match next {
                Some(done) => {
                    let _ = done.await;
                }
                None => return,
            }
        }
    }

    /// Wait for every write in flight; then the failure of one that had returned, if any.
    async fn settle(&self) -> Result<()> {
        self.wait_writes(None).await;
        match self.inner.io.lock().failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    // ---------------------------------------------------------------- reads

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
        // The capability first, here where the caller waits: the pieces below may run in
        // futures polled later (readahead, write-behind) and should find it ready.
        inner.cap.get(&inner.client).await?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        // This handle's own writes to the range first.
        self.wait_writes(Some((offset, offset.saturating_add(len as u64)))).await;
        let size = inner.state.lock().size;
        if offset >= size {
            return Ok(Bytes::new());
        }
        let total = (size - offset).min(len as u64);
        let ra = inner.client.options().readahead as u64;
        if ra == 0 || inner.no_readahead.load(std::sync::atomic::Ordering::Relaxed) {
            return self.read_direct(offset, total).await;
        }
        let plan = self.plan_read(&mut inner.io.lock(), offset, offset + total, size, ra);
        let Some((parts, fresh)) = plan else { return self.read_direct(offset, total).await };
        // Start the new requests now: they travel while earlier pieces are awaited, and
        // finish on the runtime even if no read ever wants them.
        for c in fresh {
            launch(c);
        }
        let mut got = Vec::with_capacity(parts.len());
        for (start, data) in parts {
            match data.clone().await {
                Ok(d) => got.push((start, d)),
                Err(e) => {
                    // Not kept: a later read asks again.
                    inner.io.lock().chunks.retain(|c| !c.data.ptr_eq(&data));
                    return Err(e);
                }
            }
        }
        Ok(from_chunks(offset, total as usize, got))
    }

    /// Decide how a read of `[offset, end)` is served: `None` to read it directly, or the
    /// prefetched pieces covering it and the pieces newly added to the window (to start).
    #[allow(clippy::type_complexity)]
    fn plan_read(
        &self,
        io: &mut Io,
        offset: u64,
        end: u64,
        size: u64,
        ra: u64,
    ) -> Option<(Vec<(u64, ChunkFuture)>, Vec<ChunkFuture>)> {
        let total = end - offset;
        let forward = offset >= io.ra_next && offset - io.ra_next <= io.ra_last.max(total);
        let covered = covers(&io.chunks, offset, end);
        if !forward && !covered {
            if io.ra_window > 0 && offset < io.ra_next && io.ra_next - offset <= io.ra_window + total {
                // A little behind the reader (concurrent reads of one handle finish out of
                // order): read it directly and keep the window.
                return None;
            }
            // A read elsewhere: no pattern (any longer).
            io.chunks.clear();
            io.ra_window = 0;
            io.ra_next = end;
            io.ra_last = total;
            return None;
        }
        io.ra_next = if forward { end } else { io.ra_next.max(end) };
        io.ra_last = total;
        let writing = !io.writes.is_empty() || !io.cells.is_empty();
        if !covered && (total > ra || writing || (end >= size && io.chunks.is_empty())) {
            // Too big to be worth splitting, or writes of this handle are in flight (what
            // would be fetched now could be older than they are), or a read to the end of
            // the file with nothing fetched (a small file read whole): nothing to prefetch.
            return None;
        }
        if forward {
            io.ra_window = if io.ra_window == 0 { (2 * total).max(READAHEAD_CHUNK) } else { io.ra_window * 2 }.min(ra);
        }
        // Pieces behind the reader are done with (those just behind may still be asked
        // for by a read that overtook another).
        while io.chunks.front().is_some_and(|c| c.end.saturating_add(total) <= offset) {
            io.chunks.pop_front();
        }
        let mut fresh = Vec::new();
        if !writing {
            // Up to a chunk boundary, so that no piece is fetched in two parts.
            let want =
                size.min(end.saturating_add(io.ra_window).div_ceil(READAHEAD_CHUNK).saturating_mul(READAHEAD_CHUNK));
            // At most this many pieces ahead of the read (requests in flight).
            let cap = self.inner.client.max_in_flight().max(4);
            let mut added: Vec<Chunk> = Vec::new();
            let mut at = offset;
            let mut i = 0;
            while at < want {
                // Skip what the window already holds.
                while i < io.chunks.len() && io.chunks[i].end <= at {
                    i += 1;
                }
                if i < io.chunks.len() && io.chunks[i].start <= at {
                    at = io.chunks[i].end;
                    continue;
                }
                let gap_end = if i < io.chunks.len() { io.chunks[i].start.min(want) } else { want };
                for p in ra_pieces(&self.inner.layout, at, gap_end) {
                    if p.file_offset >= end && io.chunks.len() + added.len() >= cap {
                        break;
                    }
                    let (client, layout, ino) = (self.inner.client.clone(), self.inner.layout.clone(), self.inner.ino);
                    let cap = self.inner.cap.clone();
                    let data = async move { read_piece(&client, &cap, &layout, ino, p).await }.boxed().shared();
                    fresh.push(data.clone());
                    added.push(Chunk { start: p.file_offset, end: p.file_offset + p.len, data });
                }
                at = gap_end;
                if io.chunks.len() + added.len() >= cap && at >= end {
                    break;
                }
            }
            if !added.is_empty() {
                let mut all: Vec<Chunk> = io.chunks.drain(..).chain(added).collect();
                all.sort_by_key(|c| c.start);
                io.chunks = all.into();
            }
        }
        if !covers(&io.chunks, offset, end) {
            return None;
        }
        let parts =
            io.chunks.iter().filter(|c| c.start < end && offset < c.end).map(|c| (c.start, c.data.clone())).collect();
        Some((parts, fresh))
    }

    /// Read `[offset, offset+total)` with one request per piece, all at once.
    async fn read_direct(&self, offset: u64, total: u64) -> Result<Bytes> {
        let inner = &*self.inner;
        let parts = split_pieces(&inner.layout, offset, total, MAX_PIECE);
        let (client, cap, layout, ino) = (&inner.client, &*inner.cap, &*inner.layout, inner.ino);
        let got: Vec<(Piece, Bytes)> = futures::stream::iter(parts)
            .map(|p| async move { read_piece(client, cap, layout, ino, p).await.map(|d| (p, d)) })
            .buffer_unordered(client.max_in_flight())
            .try_collect()
            .await?;
        assemble(offset, total as usize, got).map_err(|e| Error::new(e, "a server answered more bytes than asked"))
    }

    // ---------------------------------------------------------------- writes

    /// Write all of `data` at `offset` (in append mode: at the end of the file, as
    /// [`File::append`] does). Returns
    /// `data.len()`. With write-behind (see the module documentation) it may return before
    /// the servers have the data; a failure is then reported by a later call.
    pub async fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_bytes_at(offset, Bytes::copy_from_slice(data)).await
    }

    /// As [`File::write_at`], without copying `data`.
    pub async fn write_bytes_at(&self, offset: u64, data: Bytes) -> Result<usize> {
        self.write_inner(Some(offset), data, false).await.map(|(_, n)| n).map_err(|e| e.within(self.what("write")))
    }

    /// As [`File::write_bytes_at`], for a caller that knows the write continuing this one
    /// (at `offset + data.len()`) comes next: a FUSE mount given a direct write that the
    /// kernel cut at its page limit, whose few remaining bytes follow in a second request.
    /// Its bytes are then held for it (see "Gathering" in the module documentation) even
    /// when no other write of the handle is in flight.
    pub async fn write_bytes_at_then_more(&self, offset: u64, data: Bytes) -> Result<usize> {
        self.write_inner(Some(offset), data, true).await.map(|(_, n)| n).map_err(|e| e.within(self.what("write")))
    }

    /// Write; `offset` is ignored in append mode. Returns where the data went and its length.
    /// `more`: see [`File::write_bytes_at_then_more`].
    async fn write_inner(&self, offset: Option<u64>, data: Bytes, more: bool) -> Result<(u64, usize)> {
        let inner = &*self.inner;
        if inner.kind == FileKind::Dir {
            return Err(Error::bare(Errno::EISDIR));
        }
        if !inner.writable {
            return Err(Error::bare(Errno::EBADF));
        }
        // The capability first, here where the caller waits: the pieces below may run in
        // futures polled later (readahead, write-behind) and should find it ready.
        inner.cap.get(&inner.client).await?;
        let offset = match offset {
            Some(o) if !inner.append => o,
            _ => {
                // Reported as ending where the last piece ended (where the position goes).
                let n = data.len();
                let (_, end) = self.append_inner(data).await?;
                return Ok((end.saturating_sub(n as u64), n));
            }
        };
        if data.is_empty() {
            return Ok((offset, 0));
        }
        let len = data.len() as u64;
        let end = offset.checked_add(len).ok_or_else(|| Error::bare(Errno::EFBIG))?;
        let limit = inner.client.options().write_behind as u64;
        let behind = limit > 0 && !inner.append && len <= limit;
        // Held bytes are sent by a timer on the runtime.
        let gather = behind && tokio::runtime::Handle::try_current().is_ok();
        let home = inner.client.home_of(inner.ino);
        let reached_home =
            pieces(&inner.layout, offset, len).iter().any(|p| inner.layout.servers[p.index as usize] == home);
        let sender = self.sender();
        let mut data = Some(data);
        enum Step {
            /// Wait for this write in flight, then look again.
            Wait(WriteFuture),
            /// Taken (held or sent behind), or sent and to be awaited by the caller.
            Done(Option<WriteFuture>),
        }
        // Gather it if it may be; else wait for room, and for any write in flight to the
        // same bytes (their order at the servers would be anyone's guess); then go.
        let awaited = loop {
            let mut to_send = Vec::new();
            let step = {
                let mut io = inner.io.lock();
                self.harvest(&mut io);
                if let Some(e) = io.failed.take() {
                    return Err(e);
                }
                let gathered = if gather {
                    self.gather(&sender, &mut io, offset, &mut data, limit, more)
                } else {
                    // Held bytes it overlaps go first.
                    Gathered::Left(sender.release(&mut io, |c| c.overlaps(offset, end)))
                };
                let taken = match gathered {
                    Gathered::Taken(writes) => {
                        to_send = writes;
                        true
                    }
                    Gathered::Left(held) => {
                        to_send.extend(held);
                        false
                    }
                };
                let overlapping = io.writes.iter().find(|w| w.start < end && offset < w.end);
                let full = behind && io.write_bytes + len > limit;
                let busy = overlapping.or(if full { io.writes.iter().find(|w| !w.awaited) } else { None });
                match busy.filter(|_| !taken) {
                    Some(w) => Step::Wait(w.done.clone()),
                    None => {
                        let mut awaited = None;
                        if taken {
                        } else if behind {
                            io.write_bytes += len;
                            to_send.push(sender.push(&mut io, offset, data.take().unwrap_or_default()));
                        } else {
                            let fut = write_pieces(
                                inner.client.clone(),
                                inner.cap.clone(),
                                inner.layout.clone(),
                                inner.ino,
                                offset,
                                data.take().unwrap_or_default(),
                            );
                            let done = fut.boxed().shared();
                            let id = io.next_write;
                            io.next_write += 1;
                            let w =
                                InFlight { id, start: offset, end, reached_home, awaited: true, done: done.clone() };
                            io.writes.push(w);
                            awaited = Some(done);
                        }
                        // What was prefetched may be older than this write.
                        io.chunks.clear();
                        let mut st = inner.state.lock();
                        st.wrote = true;
                        if behind {
                            st.size = st.size.max(end);
                        }
                        Step::Done(awaited)
                    }
                }
            };
            // Sent now, on this thread, before returning; the runtime carries the rest
            // (pieces beyond max_in_flight, a connection still being opened) once woken.
            for w in to_send {
                launch(w);
            }
            match step {
                Step::Wait(busy) => {
                    let _ = busy.await;
                }
                Step::Done(awaited) => break awaited,
            }
        };
        inner.client.cache().forget_attr(inner.ino);
        let Some(done) = awaited else { return Ok((offset, len as usize)) };
        let r = done.await;
        self.harvest(&mut inner.io.lock());
        r.map(|()| (offset, len as usize))
    }

    /// Gather a write-behind write of `data` at `offset` (see "Gathering"): its parts go
    /// into the cells held, into new cells, or out at once (a part that fills its cell, or
    /// when no cell may be started); cells it completes go out. Left to the caller when
    /// it overlaps a write in flight or there is no room: held bytes it overlaps go first.
    fn gather(
        &self,
        sender: &Sender,
        io: &mut Io,
        offset: u64,
        data: &mut Option<Bytes>,
        limit: u64,
        more: bool,
    ) -> Gathered {
        let layout = &*self.inner.layout;
        let Some(len) = data.as_ref().map(|d| d.len() as u64) else { return Gathered::Left(Vec::new()) };
        let end = offset + len;
        // No room in flight: the writer waits for the oldest write, as without gathering.
        if io.write_bytes + len > limit || io.writes.iter().any(|w| w.start < end && offset < w.end) {
            return Gathered::Left(sender.release(io, |c| c.overlaps(offset, end)));
        }
        // A cell is worth starting while writes flow (one is in flight), or when the caller
        // says the continuation follows; not for a handle whose cells keep holding one
        // write each, unless this write continues one in flight.
        let next_to_one = io.writes.iter().any(|w| w.end == offset || w.start == end);
        let start_cells = more || (io.writes.iter().any(|w| !w.awaited) && (io.lonely < LONELY_MAX || next_to_one));
        // A write within one cell is passed on whole (a new cell may keep its buffer);
        // a longer one in slices.
        let within_one = cell_of(layout, offset).1 >= end;
        let mut whole = data.take();
        let bytes = if within_one { Bytes::new() } else { whole.take().unwrap_or_default() };
        let mut launch = Vec::new();
        let mut touched = Vec::new();
        let mut at = offset;
        while at < end {
            let (cs, ce) = cell_of(layout, at);
            let pe = ce.min(end);
            let part = match whole.take() {
                Some(w) => w,
                None => bytes.slice((at - offset) as usize..(pe - offset) as usize),
            };
            if let Some(c) = io.cells.iter_mut().find(|c| c.start == cs) {
                c.put(at, &part);
                touched.push(c.id);
            } else if (at == cs && pe == ce) || !start_cells {
                io.write_bytes += pe - at;
                launch.push(sender.push(io, at, part));
            } else {
                if io.cells.len() >= MAX_CELLS {
                    let oldest = io.cells.iter().map(|c| c.id).min().unwrap_or(0);
                    launch.extend(sender.release(io, |c| c.id == oldest));
                }
                io.holds += 1;
                let id = io.holds;
                let cell = Cell::new(id, cs, ce, at, part);
                let i = io.cells.partition_point(|c| c.start < cs);
                io.cells.insert(i, cell);
                touched.push(id);
                sender.end_hold_later(id);
            }
            at = pe;
        }
        // Cells this write completed go out whole.
        let done: Vec<u64> =
            io.cells.iter().filter(|c| touched.contains(&c.id) && c.complete()).map(|c| c.id).collect();
        if !done.is_empty() {
            if io.cells.iter().any(|c| done.contains(&c.id) && c.writes > 1) {
                io.lonely = 0;
            }
            launch.extend(sender.release(io, |c| done.contains(&c.id)));
        }
        Gathered::Taken(launch)
    }

    /// Append `data` at the end of the file, whatever the handle's mode (it must be open
    /// for writing), and return where it went. An append of up to [`MAX_APPEND`] bytes is
    /// atomic across clients: the inode's home server picks the offset and stores the data
    /// in one step, so appends of other handles and clients never overlap it or slip into
    /// it. A larger one is sent as several such appends, one after the other (another
    /// client's append may fall between them); the offset returned is then that of the
    /// first. The handle's writes that returned earlier are waited for and their size
    /// published first, so the data goes after them. Not written behind: when this returns,
    /// the data is stored and the size covers it, for every client.
    pub async fn append(&self, data: &[u8]) -> Result<u64> {
        self.append_bytes(Bytes::copy_from_slice(data)).await
    }

    /// As [`File::append`], without copying `data`.
    pub async fn append_bytes(&self, data: Bytes) -> Result<u64> {
        let inner = &*self.inner;
        let r = async {
            if inner.kind == FileKind::Dir {
                return Err(Error::bare(Errno::EISDIR));
            }
            if !inner.writable {
                return Err(Error::bare(Errno::EBADF));
            }
            self.append_inner(data).await
        };
        r.await.map(|(first, _)| first).map_err(|e| e.within(self.what("append to")))
    }

    /// Append in pieces of at most [`MAX_APPEND`] bytes; returns where the first piece
    /// went and where the last one ended. Every piece is one `Append` request to the
    /// inode's home server.
    async fn append_inner(&self, data: Bytes) -> Result<(u64, u64)> {
        let inner = &*self.inner;
        // Our own earlier writes first, and the size they reached published at the home
        // server: the end of the file is where the home server says.
        self.flush_inner().await?;
        if data.is_empty() {
            // Nothing to append: where it would have gone, as this handle knows it.
            let size = inner.state.lock().size;
            return Ok((size, size));
        }
        let mut first = None;
        let mut end = 0;
        let mut done = 0;
        while done < data.len() {
            let take = (data.len() - done).min(MAX_APPEND as usize);
            let piece = data.slice(done..done + take);
            let ino = inner.ino;
            let call = |cap| inner.client.call(To::Home(ino), Op::Append { ino, cap }, piece.clone());
            let r = inner.cap.with(&inner.client, call).await;
            inner.client.cache().forget_attr(ino);
            let r = r.map_err(|e| {
                // The home server answers for the servers it stores pieces on (EIO when one
                // of them does not answer): say which server placed the append.
                if e.context.is_empty() {
                    e.within(format_args!("append at server {}", inner.client.home_of(ino)))
                } else {
                    e
                }
            });
            let offset = match r? {
                (Reply::Appended { offset }, _) => offset,
                (other, _) => return Err(unexpected(&other)),
            };
            end = offset + take as u64;
            {
                // Prefetched data may end where the file ended before (short answers read
                // as zeros up to a piece's end): drop it.
                inner.io.lock().chunks.clear();
                let mut st = inner.state.lock();
                st.size = st.size.max(end);
                st.server_size = st.server_size.max(end);
                st.wrote = true;
            }
            first.get_or_insert(offset);
            done += take;
        }
        Ok((first.unwrap_or(end), end))
    }

    /// Read up to `len` bytes at the handle's position and advance it.
    pub async fn read(&self, len: usize) -> Result<Bytes> {
        let mut pos = self.inner.cursor.lock().await;
        let b = self.read_at(*pos, len).await?;
        *pos += b.len() as u64;
        Ok(b)
    }

    /// Write `data` at the handle's position (at the end in append mode, see
    /// [`File::append`]) and advance it past the data (in append mode, past the last piece
    /// of a write larger than [`MAX_APPEND`]).
    pub async fn write(&self, data: &[u8]) -> Result<usize> {
        let mut pos = self.inner.cursor.lock().await;
        let (at, n) = self
            .write_inner(Some(*pos), Bytes::copy_from_slice(data), false)
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

    /// Wait for the writes in flight (reporting a failure of any that had returned), then
    /// publish the size reached by writes that did not go to the inode's home server.
    pub async fn flush(&self) -> Result<()> {
        self.flush_inner().await.map_err(|e| e.within(self.what("flush")))
    }

    async fn flush_inner(&self) -> Result<()> {
        self.settle().await?;
        self.publish().await
    }

    /// Wait for the writes in flight and publish the size they reached, as
    /// [`File::flush`] does, but leave a failure of a write for the next `write`, `flush`,
    /// `fsync`, `set_len` or `close` to report. For a caller about to change the inode
    /// by other means (set its times, say) after the writes: a write or size publication
    /// landing later would stamp the modification time again.
    pub async fn drain(&self) -> Result<()> {
        self.wait_writes(None).await;
        self.publish().await.map_err(|e| e.within(self.what("flush")))
    }

    /// Publish the size reached by finished writes that did not go to the inode's server.
    async fn publish(&self) -> Result<()> {
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
        self.sync(false, false).await.map_err(|e| e.within(self.what("fsync")))
    }

    /// As [`File::fsync`], but servers may skip what is not needed to read the data back
    /// (fdatasync).
    pub async fn sync_data(&self) -> Result<()> {
        self.sync(true, false).await.map_err(|e| e.within(self.what("fdatasync")))
    }

    /// `closing`: the sync of a close (see [`File::close`]).
    async fn sync(&self, data_only: bool, closing: bool) -> Result<()> {
        self.flush_inner().await?;
        let inner = &*self.inner;
        let (client, cap) = (&inner.client, &*inner.cap);
        let ino = inner.ino;
        let home = client.home_of(ino);
        let mut servers = inner.layout.servers.clone();
        servers.push(home);
        servers.sort();
        servers.dedup();
        futures::stream::iter(servers)
            .map(|s| async move {
                let call = |cap| {
                    client.call(
                        To::Server(s),
                        Op::Fsync { ino, data_only, cap, closing: closing && s == home },
                        Bytes::new(),
                    )
                };
                match cap.with(client, call).await {
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
            let a = self
                .inner
                .client
                .setattr_inner(self.inner.ino, SetAttrs { size: Some(size), ..Default::default() })
                .await?;
            self.resized(a);
            Ok(())
        };
        r.await.map_err(|e: Error| e.within(self.what("set length of")))
    }

    /// The file's size was set (by [`File::set_len`], or by the caller by other means: a
    /// truncate by name as another user): take `a`, the attributes the server answered,
    /// as exact, over any answer still in flight that predates them.
    pub fn resized(&self, a: Attr) {
        let mut io = self.inner.io.lock();
        io.chunks.clear();
        let mut st = self.inner.state.lock();
        st.size = a.size;
        st.server_size = a.size;
        st.attr = a;
        st.epoch += 1;
    }

    /// Wait for the writes in flight and publish the size (as [`File::flush`], but a failure
    /// of a write is left for the next `write`, `flush`, `fsync`, `set_len` or `close` to
    /// report), then fetch the attributes from the server; the handle's size follows them.
    /// If the file changed (size or modification time) since the handle last knew, data
    /// it prefetched is dropped.
    pub async fn stat(&self) -> Result<Attr> {
        let r = async {
            self.wait_writes(None).await;
            self.publish().await?;
            for _ in 0..STAT_TRIES {
                let epoch = self.inner.state.lock().epoch;
                let a = self.inner.client.getattr_fresh_inner(self.inner.ino).await?;
                let mut io = self.inner.io.lock();
                let mut st = self.inner.state.lock();
                if st.epoch != epoch {
                    // A `set_len` through this handle finished while we asked: the answer
                    // may show the size from before it. The server has it now: ask again.
                    continue;
                }
                if a.size != st.size || a.mtime != st.attr.mtime {
                    io.chunks.clear();
                }
                st.server_size = a.size;
                // Writes that finished (or started) while we asked may have raised it further.
                let in_flight = io.writes.iter().map(|w| w.end).max().unwrap_or(0);
                st.size = a.size.max(st.pending.unwrap_or(0)).max(in_flight);
                st.attr = a;
                let mut out = st.attr.clone();
                out.size = st.size;
                return Ok(out);
            }
            // Truncated through this handle on every try: what the last one set is exact.
            Ok(self.attr())
        };
        r.await.map_err(|e: Error| e.within(self.what("stat")))
    }

    /// Close the handle: if it wrote anything, [`File::fsync`] (the durability promise:
    /// after `close` returns, the data survives a power loss and every client that opens
    /// the file sees it and its size), else [`File::flush`]. Either way it waits for the
    /// writes in flight and reports a failure of any of them.
    ///
    /// Closing the client's last handle on a file whose last name this client removed
    /// while it was open deletes the file (see `open_files.rs`).
    pub async fn close(self) -> Result<()> {
        let wrote = self.inner.state.lock().wrote;
        // A handle that wrote syncs on close, and tells the inode's home it closes (a
        // `Close` event in its change log: docs/changes.md).
        let r = if wrote {
            self.sync(false, true).await.map_err(|e| e.within(self.what("fsync")))
        } else {
            self.flush().await
        };
        // The last clone: uncount here (not in drop), so the release is done when close returns.
        if Arc::strong_count(&self.inner) == 1 && self.inner.counted.swap(false, std::sync::atomic::Ordering::AcqRel) {
            let client = &self.inner.client;
            if client.open_files().closed(self.inner.ino) {
                client.release_orphan(self.inner.ino).await;
            }
        }
        r
    }
}

/// Whether the pieces in `chunks` (sorted, not overlapping) cover `[offset, end)` with no gap.
fn covers(chunks: &VecDeque<Chunk>, offset: u64, end: u64) -> bool {
    let mut at = offset;
    for c in chunks {
        if c.end <= at {
            continue;
        }
        if c.start > at {
            return false;
        }
        at = c.end;
        if at >= end {
            return true;
        }
    }
    at >= end
}

impl Drop for Inner {
    fn drop(&mut self) {
        let writes = {
            let mut io = self.io.lock();
            // Held bytes go with the writes in flight.
            let sender = Sender {
                client: self.client.clone(),
                cap: self.cap.clone(),
                layout: self.layout.clone(),
                ino: self.ino,
                io: self.io.clone(),
            };
            let _ = sender.release(&mut io, |_| true); // awaited below, with the others
            std::mem::take(&mut io.writes)
        };
        let pending = self.state.get_mut().pending.take();
        let release = *self.counted.get_mut() && self.client.open_files().closed(self.ino);
        if writes.is_empty() && pending.is_none() && !release {
            return;
        }
        let Some(rt) = &self.runtime else { return };
        let (client, ino) = (self.client.clone(), self.ino);
        rt.spawn(async move {
            if release {
                // Nothing to publish on a file about to go; its writes finish first, so
                // none lands after the deletion.
                for w in writes {
                    let _ = w.done.await;
                }
                client.release_orphan(ino).await;
                return;
            }
            // Finish what is in flight, then publish the size it reached.
            let mut size = pending;
            for w in writes {
                if w.done.await.is_ok() && !w.reached_home {
                    size = Some(size.unwrap_or(0).max(w.end));
                }
            }
            if let Some(size) = size {
                if let Err(e) = client.extend_size(ino, size).await {
                    tracing::warn!("publishing the size of {ino} after its handle was dropped: {e}");
                }
            }
        });
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
        Layout { stripe_size: ss, servers: (0..n).map(ServerId).collect(), replicas: 1 }
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

    /// The FUSE mount and the bench spawn these calls on multi-thread runtimes.
    #[allow(dead_code)]
    fn calls_are_send(f: &File) {
        fn send<T: Send>(_: T) {}
        send(f.read_at(0, 1));
        send(f.read(1));
        send(f.write_at(0, b""));
        send(f.write(b""));
        send(f.append(b""));
        send(f.flush());
        send(f.drain());
        send(f.fsync());
        send(f.stat());
        send(f.set_len(0));
        send(f.clone().close());
    }

    #[test]
    fn readahead_pieces_sit_on_a_fixed_grid() {
        // 4 MiB stripes: pieces end at every MiB boundary, wherever the range starts.
        let l = layout(4 << 20, 2);
        let ps = ra_pieces(&l, 47_008, 5 << 20);
        assert_eq!(ps[0].file_offset, 47_008);
        assert_eq!(ps[0].len, (1 << 20) - 47_008);
        assert!(ps[1..].iter().all(|p| p.file_offset % READAHEAD_CHUNK == 0 && p.len == READAHEAD_CHUNK));
        assert_eq!(ps[3].index, 0);
        assert_eq!(ps[4].index, 1, "a piece never crosses into the next object");
        assert_eq!(ps[4].object_offset, 0);
        // Small stripes: one piece per stripe.
        let l = layout(64 << 10, 3);
        assert_eq!(ra_pieces(&l, 0, 1 << 20), pieces(&l, 0, 1 << 20));
    }

    fn chunk(start: u64, end: u64) -> Chunk {
        let data: BoxFuture<'static, Outcome<Bytes>> = Box::pin(async { Ok(Bytes::new()) });
        Chunk { start, end, data: data.shared() }
    }

    #[test]
    fn coverage_needs_every_byte() {
        let c: VecDeque<Chunk> = vec![chunk(0, 10), chunk(10, 20), chunk(30, 40)].into();
        assert!(covers(&c, 0, 20));
        assert!(covers(&c, 5, 15));
        assert!(covers(&c, 35, 40));
        assert!(!covers(&c, 15, 31), "a gap");
        assert!(!covers(&c, 35, 41), "past the last piece");
        assert!(!covers(&VecDeque::new(), 0, 1));
    }

    #[test]
    fn reads_from_chunks_slice_or_zero_fill() {
        let a = Bytes::from(vec![1u8; 100]);
        let out = from_chunks(10, 50, vec![(0, a.clone())]);
        assert_eq!(out.len(), 50);
        assert_eq!(out.as_ptr(), a[10..].as_ptr(), "one piece: no copy");
        // A short answer (hole, end of object) reads as zeros up to the piece's end.
        let out = from_chunks(90, 40, vec![(0, a.clone()), (100, Bytes::from(vec![2u8; 5]))]);
        assert_eq!(&out[..10], &[1u8; 10]);
        assert_eq!(&out[10..15], &[2u8; 5]);
        assert!(out[15..].iter().all(|&b| b == 0));
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
