//! Shoal attributes as the kernel shows them for a file on the mount (`struct stat`,
//! `struct statx`), field by field as the FUSE mount reports them (crates/fuse's
//! `convert::file_attr`): the mount's device number, the Shoal inode number, the stripe
//! size as preferred I/O size, the servers' allocated bytes (or the size when they do not
//! say) in 512-byte blocks.

use crate::mounts::Mount;
use shoal_client::{Attr, FileKind, Timestamp};

fn mode(a: &Attr) -> u32 {
    let kind = match a.kind {
        FileKind::File => libc::S_IFREG,
        FileKind::Dir => libc::S_IFDIR,
        FileKind::Symlink => libc::S_IFLNK,
    };
    kind | (a.perm & 0o7777)
}

fn blksize(a: &Attr) -> u32 {
    match &a.layout {
        Some(l) if a.kind == FileKind::File => l.stripe_size.clamp(4096, 4 << 20) as u32,
        _ => 4096,
    }
}

fn blocks(a: &Attr) -> u64 {
    let allocated = if a.blocks_bytes > 0 || a.kind != FileKind::File { a.blocks_bytes } else { a.size };
    allocated.div_ceil(512)
}

/// Times as the kernel holds them (nanoseconds below 1e9).
fn time(t: Timestamp) -> (i64, i64) {
    (t.secs, i64::from(t.nsecs.min(999_999_999)))
}

pub fn fill_stat(m: &Mount, a: &Attr, st: &mut libc::stat64) {
    // SAFETY: stat64 is plain data; zero is a valid value of every field.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = m.dev;
    st.st_ino = a.ino.0;
    st.st_mode = mode(a);
    st.st_nlink = u64::from(a.nlink);
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_size = a.size as i64;
    st.st_blksize = i64::from(blksize(a));
    st.st_blocks = blocks(a) as i64;
    (st.st_atime, st.st_atime_nsec) = time(a.atime);
    (st.st_mtime, st.st_mtime_nsec) = time(a.mtime);
    (st.st_ctime, st.st_ctime_nsec) = time(a.ctime);
}

fn stx_time(t: Timestamp) -> libc::statx_timestamp {
    let (s, ns) = time(t);
    // SAFETY: plain data; the padding field must be zero.
    let mut out: libc::statx_timestamp = unsafe { std::mem::zeroed() };
    out.tv_sec = s;
    out.tv_nsec = ns as u32;
    out
}

pub fn fill_statx(m: &Mount, a: &Attr, stx: &mut libc::statx) {
    // SAFETY: statx is plain data; zero is a valid value of every field.
    *stx = unsafe { std::mem::zeroed() };
    stx.stx_mask = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID;
    stx.stx_blksize = blksize(a);
    stx.stx_nlink = a.nlink;
    stx.stx_uid = a.uid;
    stx.stx_gid = a.gid;
    stx.stx_mode = mode(a) as u16;
    stx.stx_ino = a.ino.0;
    stx.stx_size = a.size;
    stx.stx_blocks = blocks(a);
    stx.stx_atime = stx_time(a.atime);
    stx.stx_mtime = stx_time(a.mtime);
    stx.stx_ctime = stx_time(a.ctime);
    stx.stx_dev_major = m.dev_major;
    stx.stx_dev_minor = m.dev_minor;
    stx.stx_mnt_id = m.mnt_id;
}

/// A `timespec` of `utimensat` as a change to make (`None`: leave as is).
pub fn time_set(t: &libc::timespec) -> Result<Option<shoal_client::TimeSet>, i32> {
    match t.tv_nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(shoal_client::TimeSet::Now)),
        ns if (0..1_000_000_000).contains(&ns) => {
            Ok(Some(shoal_client::TimeSet::At(Timestamp { secs: t.tv_sec, nsecs: ns as u32 })))
        }
        _ => Err(libc::EINVAL),
    }
}

/// A `timeval` (utimes) as a `timespec`.
pub fn timespec_of(tv: &libc::timeval) -> Result<libc::timespec, i32> {
    if !(0..1_000_000).contains(&tv.tv_usec) {
        return Err(libc::EINVAL);
    }
    Ok(libc::timespec { tv_sec: tv.tv_sec, tv_nsec: tv.tv_usec * 1000 })
}
