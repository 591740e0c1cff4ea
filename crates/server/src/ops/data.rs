//! Data operations (at the server holding an object) and whole-server reports.

use super::*;
use crate::dispatch::Payload;
use crate::error::{fail, Fail, R};
use crate::state::{Contents, State};
use crate::store::meta::key;
use bytes::Bytes;
use shoal_proto::frame::MAX_DATA;
use shoal_proto::msg::{FileKind, Reply, ServerStatus, StatFsOut};
use shoal_proto::{Errno, Ino};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long counted contents are reused (counting walks the whole store).
const CONTENTS_TTL: Duration = Duration::from_secs(5);

/// A read: the part of the range the object holds, as a region of the object file that
/// the connection sends with `sendfile` (no copy through this process), or nothing.
/// Looking the region up costs no disk read (the descriptor is cached, the length comes
/// from `fstat`); the disk reads happen while the reply is sent, off the async threads.
pub async fn read(st: &Arc<State>, ino: Ino, index: u32, offset: u64, len: u32) -> R<(Reply, Payload)> {
    let len = (len as usize).min(MAX_DATA);
    Ok(match st.data.region(ino, index, offset, len)? {
        Some(r) => (Reply::Data, Payload::Region(r)),
        None => (Reply::Data, Payload::Bytes(Bytes::new())),
    })
}

pub async fn write(
    st: &Arc<State>,
    ino: Ino,
    index: u32,
    offset: u64,
    file_end: u64,
    inode_local: bool,
    data: Bytes,
) -> R<Reply> {
    let len = data.len() as u32;
    if !inode_local {
        st.blocking(move |st| st.data.write(ino, index, offset, &data)).await?;
        return Ok(Reply::Written { len });
    }
    // The inode is here too: write and raise the size under the inode's lock, checking first
    // that the file still exists (a write racing an unlink must not recreate an object
    // nobody will delete).
    st.require_home(ino)?;
    let _g = st.locks.lock(&[ino]).await;
    st.blocking(move |st| {
        let mut txn = st.meta.txn();
        let rec = txn.inode_mut(ino)?;
        if rec.kind != FileKind::File {
            return fail(Errno::EISDIR, format!("{ino} is not a regular file"));
        }
        st.data.write(ino, index, offset, &data)?;
        if file_end > rec.size {
            rec.size = file_end;
        }
        rec.touch(now());
        txn.commit()?;
        Ok(Reply::Written { len })
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
    }))
}
