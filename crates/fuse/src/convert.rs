//! Translations between Shoal's types and the kernel's: attributes, times, error numbers,
//! names and the caller's identity.

use fuser::{FileAttr, FileType, INodeNo};
use shoal_client::{Attr, Cred, FileKind, Layout, LayoutSpec, PlacementPolicy, Timestamp};
use std::ffi::OsStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
    }
}

pub(crate) fn system_time(t: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nsecs.min(999_999_999)));
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs()) + nanos
    }
}

/// A time the kernel sent (setattr). fuser 0.18.0 builds times before 1970 as
/// `EPOCH - (|secs|, nsecs)` instead of `EPOCH - |secs| + nsecs`; this undoes that.
pub(crate) fn kernel_timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp { secs: d.as_secs() as i64, nsecs: d.subsec_nanos() },
        Err(e) => Timestamp { secs: -(e.duration().as_secs() as i64), nsecs: e.duration().subsec_nanos() },
    }
}

#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp { secs: d.as_secs() as i64, nsecs: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let (mut secs, mut nsecs) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsecs > 0 {
                secs -= 1;
                nsecs = 1_000_000_000 - nsecs;
            }
            Timestamp { secs, nsecs }
        }
    }
}

/// The preferred I/O size reported in `st_blksize`: the stripe size (so `cp` and friends
/// move whole stripes), between 4 KiB and 4 MiB.
fn blksize(a: &Attr) -> u32 {
    match &a.layout {
        Some(l) if a.kind == FileKind::File => l.stripe_size.clamp(4096, 4 << 20) as u32,
        _ => 4096,
    }
}

pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    // Servers report the bytes their objects occupy when they know them; otherwise say
    // the file is fully allocated (tools then do not take it for a sparse file).
    let allocated = if a.blocks_bytes > 0 || a.kind != FileKind::File { a.blocks_bytes } else { a.size };
    let mtime = system_time(a.mtime);
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: allocated.div_ceil(512),
        atime: system_time(a.atime),
        mtime,
        ctime: system_time(a.ctime),
        crtime: mtime,
        kind: kind(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: blksize(a),
        flags: 0,
    }
}

/// Whether the kernel should see this server error as an I/O error: the server could not
/// be reached, timed out, or answered something this client cannot use.
fn is_transport(code: i32) -> bool {
    matches!(
        code,
        libc::ETIMEDOUT
            | libc::ENOTCONN
            | libc::ECONNREFUSED
            | libc::ECONNRESET
            | libc::ECONNABORTED
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::EPIPE
            | libc::ESHUTDOWN
            | libc::EPROTO
    )
}

/// The errno handed to the kernel for a client error. Unreachable or timed-out servers
/// become EIO; ENOSYS (which would make the kernel stop sending that request for good)
/// becomes EOPNOTSUPP.
pub(crate) fn errno(e: &shoal_client::Error) -> fuser::Errno {
    let code = e.errno.0;
    let code = if is_transport(code) || code <= 0 {
        crate::warn_limited(&format!("{e}"));
        libc::EIO
    } else if code == libc::ENOSYS {
        libc::EOPNOTSUPP
    } else {
        tracing::debug!("{e}");
        code
    };
    fuser::Errno::from_i32(code)
}

pub(crate) fn raw(code: i32) -> fuser::Errno {
    fuser::Errno::from_i32(code)
}

/// A name from the kernel as Shoal takes it: UTF-8, at most 255 bytes.
pub(crate) fn name(n: &OsStr) -> Result<String, fuser::Errno> {
    let s = n.to_str().ok_or(fuser::Errno::from_i32(libc::EINVAL))?;
    if s.len() > shoal_proto::msg::NAME_MAX {
        return Err(fuser::Errno::from_i32(libc::ENAMETOOLONG));
    }
    Ok(s.to_string())
}

/// Supplementary groups of the calling thread, from `/proc/<tid>/status`. Empty when the
/// caller is gone or unknown (pid 0: a request the kernel makes on its own).
pub(crate) fn groups_of(pid: u32) -> Vec<u32> {
    if pid == 0 {
        return Vec::new();
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return Vec::new() };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default()
}

/// The identity a request is made as. Root's groups do not matter (root passes every
/// check), so /proc is not read for it.
pub(crate) fn cred(uid: u32, gid: u32, pid: u32) -> Cred {
    let groups = if uid == 0 { Vec::new() } else { groups_of(pid) };
    Cred { uid, gid, groups }
}

/// The client's local permission check (true only when certainly allowed; a no is asked
/// of the server), under the name the handlers use.
pub(crate) use shoal_client::may_access;

/// The read-only `shoal.layout` attribute of a file: its stripe layout.
pub(crate) fn layout_text(l: &Layout) -> String {
    let servers: Vec<String> = l.servers.iter().map(|s| s.0.to_string()).collect();
    format!("stripe_size={} stripe_count={} servers={}", l.stripe_size, l.servers.len(), servers.join(","))
}

/// `shoal.layout` of a directory: the default new files get (unset fields are inherited).
pub(crate) fn dir_default_text(spec: Option<&LayoutSpec>) -> String {
    let spec = spec.cloned().unwrap_or_default();
    let size = spec.stripe_size.map(|s| s.to_string()).unwrap_or_else(|| "inherit".into());
    let count = match spec.stripe_count {
        None | Some(0) => "inherit".to_string(),
        Some(u32::MAX) => "all".to_string(),
        Some(n) => n.to_string(),
    };
    let first = spec.first_server.map(|s| s.0.to_string()).unwrap_or_else(|| "any".into());
    let policy = match spec.policy {
        None => "inherit",
        Some(PlacementPolicy::Same) => "same",
        Some(PlacementPolicy::Spread) => "spread",
        Some(PlacementPolicy::Load) => "load",
    };
    format!("stripe_size={size} stripe_count={count} first_server={first} policy={policy}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_client::{Ino, ServerId};

    #[test]
    fn times_round_trip_including_before_1970() {
        for t in [
            Timestamp { secs: 0, nsecs: 0 },
            Timestamp { secs: 1_700_000_000, nsecs: 123_456_789 },
            Timestamp { secs: -1, nsecs: 500_000_000 },
            Timestamp { secs: -86_400 * 365, nsecs: 1 },
            Timestamp { secs: 4_102_444_800, nsecs: 999_999_999 },
        ] {
            assert_eq!(timestamp(system_time(t)), t, "{t:?}");
        }
    }

    #[test]
    fn kernel_times_before_1970() {
        // What fuser 0.18.0 hands over for tv_sec = -1, tv_nsec = 5.
        let from_fuser = UNIX_EPOCH - Duration::new(1, 5);
        assert_eq!(kernel_timestamp(from_fuser), Timestamp { secs: -1, nsecs: 5 });
        assert_eq!(kernel_timestamp(UNIX_EPOCH + Duration::new(7, 9)), Timestamp { secs: 7, nsecs: 9 });
    }

    #[test]
    fn attributes_and_layout_text() {
        let a = Attr {
            ino: Ino(42),
            kind: FileKind::File,
            perm: 0o4755,
            uid: 1,
            gid: 2,
            size: 5000,
            nlink: 1,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            blocks_bytes: 0,
            layout: Some(Layout { stripe_size: 1 << 20, servers: vec![ServerId(2), ServerId(0)], replicas: 1 }),
            dir_default: None,
            parent: None,
            read_mostly: false,
        };
        let f = file_attr(&a);
        assert_eq!(f.ino, INodeNo(42));
        assert_eq!(f.perm, 0o4755);
        assert_eq!(f.blocks, 10);
        assert_eq!(f.blksize, 1 << 20);
        assert_eq!(layout_text(a.layout.as_ref().unwrap()), "stripe_size=1048576 stripe_count=2 servers=2,0");
        assert_eq!(dir_default_text(None), "stripe_size=inherit stripe_count=inherit first_server=any policy=inherit");
    }

    #[test]
    fn groups_of_this_process() {
        let g = groups_of(std::process::id());
        let mut n = vec![0 as libc::gid_t; 256];
        let k = unsafe { libc::getgroups(n.len() as i32, n.as_mut_ptr()) };
        n.truncate(k.max(0) as usize);
        assert_eq!(g, n);
        assert!(groups_of(0).is_empty());
    }
}
