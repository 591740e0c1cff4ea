//! Data operations (at the server holding an object) and whole-server reports.

use super::*;
use crate::dispatch::Payload;
use crate::error::{fail, Fail, R};
use crate::state::{Contents, State};
use crate::store::meta::key;
use crate::store::write_crcs::PieceCrcs;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use shoal_placement::pieces;
use shoal_proto::frame::MAX_DATA;
use shoal_proto::msg::{FileKind, Op, Reply, ServerStatus, StatFsOut};
use shoal_proto::msg::{ObjectPiece, MAX_LIST_PIECES};
use shoal_proto::{Errno, Ino};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long counted contents are reused (counting walks the whole store).
const CONTENTS_TTL: Duration = Duration::from_secs(5);

/// A read: the part of the range the object holds, read into memory and verified against
/// its block checksums (`store::data`), or nothing. Runs off the async threads (the disk may
/// have to be read). A damaged block fails the read with `EIO` naming the object file and
/// the block's offset; the dispatcher logs it.
pub async fn read(st: &Arc<State>, ino: Ino, index: u32, offset: u64, len: u32) -> R<(Reply, Payload)> {
    let len = (len as usize).min(MAX_DATA);
    let bytes = st.blocking(move |st| st.data.read(ino, index, offset, len)).await?;
    Ok((Reply::Data, Payload::Bytes(bytes)))
}

/// Check a list of pieces: not too many, their total within one frame's data. Returns it.
fn list_total(pieces: &[ObjectPiece]) -> R<usize> {
    if pieces.is_empty() || pieces.len() > MAX_LIST_PIECES {
        return fail(Errno::EINVAL, format!("a list of {} pieces (1 to {MAX_LIST_PIECES})", pieces.len()));
    }
    let total: u64 = pieces.iter().map(|p| p.len as u64).sum();
    if total > MAX_DATA as u64 {
        return fail(Errno::EINVAL, format!("a list of {total} bytes (at most {MAX_DATA} in one request)"));
    }
    Ok(total as usize)
}

/// List I/O: the pieces of objects of `ino` stored here, in one reply (`DataList`: each
/// piece's length, the bytes back to back). One blocking task reads them all in order.
pub async fn read_list(st: &Arc<State>, ino: Ino, pieces: Vec<ObjectPiece>) -> R<(Reply, Payload)> {
    let total = list_total(&pieces)?;
    st.blocking(move |st| {
        let mut lens = Vec::with_capacity(pieces.len());
        let mut out = bytes::BytesMut::with_capacity(total);
        for p in &pieces {
            let b = st.data.read(ino, p.index, p.offset, p.len as usize)?;
            lens.push(b.len() as u32);
            out.extend_from_slice(&b);
        }
        Ok((Reply::DataList { lens }, Payload::Bytes(out.freeze())))
    })
    .await
}

/// List I/O: store each piece of `data` (the pieces' bytes back to back) in its object, in
/// order; with `inode_local` raise the size to `file_end` under the inode's lock, as a
/// `Write` does, in the same transaction.
pub async fn write_list(
    st: &Arc<State>,
    ino: Ino,
    pieces: Vec<ObjectPiece>,
    file_end: u64,
    inode_local: bool,
    data: Bytes,
    copies: u8,
) -> R<Reply> {
    let total = list_total(&pieces)?;
    if total != data.len() {
        return fail(Errno::EINVAL, format!("a list of {total} bytes sent with {} bytes of data", data.len()));
    }
    let store = move |st: &State| -> R<()> {
        let mut at = 0;
        for p in &pieces {
            let len = p.len as usize;
            st.data.write_with_crcs(ino, p.index, p.offset, &data[at..at + len], None, copies)?;
            at += len;
        }
        Ok(())
    };
    store_objects(st, ino, file_end, inode_local, total as u32, store).await
}

/// A write of `data` at `offset` in object `index` of `ino`; `crcs`: the CRC32C of its block
/// pieces, when the connection computed them already (see `store::write_crcs`); `copies`:
/// how many copies the file wants, for the data store (`DataStore::write`).
#[allow(clippy::too_many_arguments)]
pub async fn write(
    st: &Arc<State>,
    ino: Ino,
    index: u32,
    offset: u64,
    file_end: u64,
    inode_local: bool,
    data: Bytes,
    crcs: Option<PieceCrcs>,
    copies: u8,
) -> R<Reply> {
    let len = data.len() as u32;
    let store = move |st: &State| st.data.write_with_crcs(ino, index, offset, &data, crcs.as_ref(), copies);
    store_objects(st, ino, file_end, inode_local, len, store).await
}

/// Run `store` (writes to objects of `ino` here, `len` bytes in all). With `inode_local` the
/// inode is here too: store and raise the size to `file_end` under the inode's lock, checking
/// first that the file still exists (a write racing an unlink must not recreate an object
/// nobody will delete).
async fn store_objects(
    st: &Arc<State>,
    ino: Ino,
    file_end: u64,
    inode_local: bool,
    len: u32,
    store: impl FnOnce(&State) -> R<()> + Send + 'static,
) -> R<Reply> {
    if !inode_local {
        st.blocking(move |st| store(st)).await?;
        return Ok(Reply::Written { len });
    }
    st.require_home(ino)?;
    super::truncate::finish_pending(st, ino).await?;
    let _g = st.locks.lock(&[ino]).await;
    st.blocking(move |st| {
        let mut txn = st.meta.txn();
        let rec = txn.inode_mut(ino)?;
        if rec.kind != FileKind::File {
            return fail(Errno::EISDIR, format!("{ino} is not a regular file"));
        }
        store(st)?;
        if file_end > rec.size {
            rec.size = file_end;
        }
        rec.touch(now());
        txn.commit()?;
        Ok(Reply::Written { len })
    })
    .await
}

/// Most pieces of one append stored at once (on this server and on the others).
const APPEND_PIECES_IN_FLIGHT: usize = 16;

/// An append (`O_APPEND`), at the inode's home server, where the size is authoritative.
///
/// Under the inode's lock — which every change of the size takes (a `Write` that reaches
/// the home, `ExtendSize`, `SetAttr`, another append) — the offset is the recorded size,
/// every piece of `[offset, offset + len)` is stored (here, or with a `Write` to the server
/// holding its object), and only then is the size raised. So appends from any number of
/// clients get disjoint ranges one after the other, and an acknowledged append is complete:
/// a reader that sees the new size sees the bytes (no window of zeros, as reserving the
/// range first and letting the client store the pieces would leave, and no range of zeros
/// left in the file for good when that client died before storing them). A failure leaves
/// the size as it was; pieces already stored lie beyond the end, unseen, and the next
/// append writes over them.
///
/// Why the data goes through the home rather than from the client to each object's server:
/// the offset is only known here, and the pieces must be stored before the size is
/// raised, so the append is one request for the client whatever the layout. Data on other
/// servers crosses the network twice; appends are usually small records.
///
/// The lock is held across the `Write`s to other servers, an exception to the rule in
/// `locks.rs`: a `Write` with `inode_local = false` takes no lock at its server, so nothing
/// there waits for us; a server that does not answer holds the lock for at most the peer
/// timeout, and the append fails with EIO.
pub async fn append(st: &Arc<State>, ino: Ino, data: Bytes) -> R<Reply> {
    st.require_home(ino)?;
    super::truncate::finish_pending(st, ino).await?;
    let _g = st.locks.lock(&[ino]).await;
    let (offset, layout) = st
        .store(move |st| {
            let rec = st
                .meta
                .get_inode(ino)?
                .ok_or_else(|| Fail::new(Errno::ENOENT, format!("inode {ino} does not exist")))?;
            match (rec.kind, rec.layout) {
                (FileKind::File, Some(l)) if l.stripe_size > 0 && !l.servers.is_empty() => Ok((rec.size, l)),
                (FileKind::File, _) => fail(Errno::EIO, format!("file {ino} has no valid layout")),
                (FileKind::Dir, _) => fail(Errno::EISDIR, format!("{ino} is a directory")),
                (FileKind::Symlink, _) => fail(Errno::EINVAL, format!("{ino} is a symbolic link")),
            }
        })
        .await?;
    let len = data.len() as u64;
    let end = offset
        .checked_add(len)
        .filter(|&e| e <= i64::MAX as u64)
        .ok_or_else(|| Fail::new(Errno::EFBIG, format!("append at {offset} beyond the largest file size")))?;
    if len == 0 {
        return Ok(Reply::Appended { offset });
    }
    // The pieces stored on other servers are `Write`s like a client's, checked there like
    // a client's: this server, which holds the cluster key, vouches for them with a
    // capability of its own (the client's was checked on arrival).
    let cap = crate::caps::issue(st, ino, shoal_proto::cap::RIGHT_WRITE);
    // The inode is here, so its layout says how many copies the pieces need: the append's
    // request carries no count of its own that could disagree.
    let copies = layout.replicas;
    let (data, layout, cap) = (&data, &layout, &cap);
    futures::stream::iter(pieces(layout, offset, len))
        .map(|p| async move {
            let server = layout.servers[p.index as usize];
            let start = (p.file_offset - offset) as usize;
            let chunk = data.slice(start..start + p.len as usize);
            if server == st.id {
                return st.blocking(move |st| st.data.write(ino, p.index, p.object_offset, &chunk, copies)).await;
            }
            let op = Op::Write {
                ino,
                index: p.index,
                offset: p.object_offset,
                file_end: end,
                inode_local: false,
                cap: cap.clone(),
                copies,
            };
            match st.peer_write(server, op, chunk).await {
                Ok(Reply::Written { len }) if len as u64 == p.len => Ok(()),
                Ok(other) => fail(Errno::EIO, format!("server {server} answered an append's piece with {other:?}")),
                Err(e) => Err(Fail::peer(server, e)),
            }
        })
        .buffer_unordered(APPEND_PIECES_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let rec = txn.inode_mut(ino)?;
        // Nothing moved the size since it was read (the lock), but never lower it.
        rec.size = rec.size.max(end);
        rec.touch(now());
        txn.commit()?;
        Ok(Reply::Appended { offset })
    })
    .await
}

pub async fn fsync(st: &Arc<State>, ino: Ino, data_only: bool) -> R<Reply> {
    st.blocking(move |st| {
        st.data.sync(ino, data_only)?;
        st.meta.sync_wal()?;
        Ok(Reply::Ok)
    })
    .await
}

/// Capacity, free and used bytes of the file system holding `path`.
pub fn statvfs(path: &Path) -> std::io::Result<(u64, u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: statvfs fills the zeroed struct; the path is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = s.f_frsize as u64;
    let capacity = s.f_blocks as u64 * frsize;
    let free = s.f_bavail as u64 * frsize;
    let used = (s.f_blocks as u64).saturating_sub(s.f_bfree as u64) * frsize;
    Ok((capacity, free, used))
}

/// Counts of what the server holds. Inodes, entries and objects are cached for a few
/// seconds (counting walks everything); pending intents are few and always counted afresh,
/// since tools watch them drain after a failure.
async fn contents(st: &Arc<State>) -> R<Contents> {
    let cached = match *st.contents.lock() {
        Some((at, c)) if at.elapsed() < CONTENTS_TTL => Some(c),
        _ => None,
    };
    let mut c = match cached {
        Some(c) => c,
        None => {
            let c = st
                .blocking(|st| {
                    Ok(Contents {
                        inodes: st.meta.count(key::INODE)?,
                        entries: st.meta.count(key::ENTRY)?,
                        objects: st.data.count(),
                        intents: 0,
                    })
                })
                .await?;
            *st.contents.lock() = Some((Instant::now(), c));
            c
        }
    };
    c.intents = st.blocking(|st| st.meta.count(key::INTENT)).await?;
    Ok(c)
}

pub async fn statfs(st: &Arc<State>) -> R<Reply> {
    let dir = st.data_dir.clone();
    let (capacity, free, _) = st
        .blocking(move |_| statvfs(&dir).map_err(|e| Fail::io(format_args!("statvfs {}", dir.display()), &e)))
        .await?;
    let c = contents(st).await?;
    Ok(Reply::StatFs(StatFsOut { capacity_bytes: capacity, free_bytes: free, inodes: c.inodes }))
}

pub async fn status(st: &Arc<State>) -> R<Reply> {
    let dir = st.data_dir.clone();
    let (capacity, free, used) = st
        .blocking(move |_| statvfs(&dir).map_err(|e| Fail::io(format_args!("statvfs {}", dir.display()), &e)))
        .await?;
    let c = contents(st).await?;
    Ok(Reply::Status(ServerStatus {
        id: Some(st.id),
        map_version: st.map.version(),
        uptime_secs: st.started.elapsed().as_secs(),
        capacity_bytes: capacity,
        free_bytes: free,
        used_bytes: used,
        inodes: c.inodes,
        entries: c.entries,
        data_objects: c.objects,
        pending_intents: c.intents,
        counters: st.counters.snapshot(),
        mirrors: crate::replica::mirror_status(st),
    }))
}
