//! Settings of a [`Client`](crate::Client) and the flags of an open.

use shoal_proto::msg::{Cred, LayoutSpec};
use std::time::Duration;

/// How a [`Client`](crate::Client) behaves.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long one request may take (connecting included) before it fails with ETIMEDOUT.
    /// A dead server therefore gives an error, never a hang. Default 30 s.
    pub timeout: Duration,
    /// With replicas (`[cluster] replicas` ≥ 2): how long a request to a server that
    /// cannot be reached waits for its slot to fail over to a mirror, fetching the newest
    /// map as it waits (docs/failover.md). Zero: fail at once. Default 15 s, well above
    /// the detection delay (`[membership] down_after_ms`) plus the promotion.
    pub failover_wait: Duration,
    /// How long cached directory entries (positive and negative), attributes and symlink
    /// targets are trusted. Default 1 s; zero disables caching.
    pub cache_ttl: Duration,
    /// Who the requests are made as. Default: the calling process ([`Cred::current`]).
    pub cred: Cred,
    /// TCP connections per server (requests are pipelined on each). Default 2.
    pub connections_per_server: usize,
    /// Bits cleared from the permissions of new files and directories (`create_at`,
    /// `mkdir_at` and everything built on them). Default 0o022. Use 0 to pass modes through
    /// unchanged (a FUSE adapter does: the kernel has already applied the caller's umask).
    pub umask: u32,
    /// Most object pieces one read or write sends at the same time (also bounds the
    /// concurrency of `remove_all`, `statfs` and `fsync`). Default 16.
    pub max_in_flight: usize,
    /// Write-behind: bytes of one handle's writes that may still be on their way to the
    /// servers after `write` returned. A write returns once its requests are sent, so the
    /// caller prepares the next buffer while the servers store this one; a write that
    /// would pass the bound first waits for the oldest in flight. A failure is returned by
    /// the handle's next `write`, `flush`, `fsync`, `set_len` or `close`, which all
    /// wait for the writes in flight first (see [`File`](crate::File)). Writes larger than
    /// this, and writes in append mode, wait for their replies. Memory: up to this many
    /// bytes of copies per writing handle. Default 8 MiB; 0 makes every write wait.
    pub write_behind: usize,
    /// Readahead: how far ahead of a handle that reads forward the next pieces of the file
    /// are fetched (in requests of at most [`READAHEAD_CHUNK`](crate::READAHEAD_CHUNK)
    /// bytes, started before the reader asks), so that the servers' disks and the network
    /// work while the reader consumes. The window starts at twice the read size and
    /// doubles up to this bound; a read elsewhere drops it; writes through the handle, and
    /// `stat` finding the file changed, drop what was fetched. Memory: up to about this
    /// many bytes per reading handle. Default 8 MiB; 0 turns readahead off.
    pub readahead: usize,
    /// Directory leases: the term asked for. While the client holds a lease on a directory
    /// its server revokes it before anyone else's change of the directory's entries takes
    /// effect, so lookups of names learnt under it (also "no such name") and, after a
    /// complete listing, any lookup and the listing are answered without a request, and
    /// stay exact (not merely `cache_ttl` old). Servers grant at most their own limit
    /// (`shoald --lease-max-ms`, 5 s by default). Independent of `cache_ttl` (leases are
    /// never stale, so a client that caches nothing for a while may still hold them).
    /// Default 3 s; zero turns leases off (every lookup asks a server).
    pub dir_lease: Duration,
    /// Attribute leases (`shoal_proto::lease`, "Attribute leases"; needs `dir_lease`):
    /// the attributes of every inode this client is told of come with a lease from the
    /// inode's home server, which revokes it before another client's change of the inode,
    /// so `getattr` answers from memory, exactly, while it holds. Each lease costs the
    /// server a record for its term; the FUSE mount turns them on. Default off.
    pub attr_leases: bool,
    /// Resolve paths as the kernel does under a mount point of Shoal (for the preload
    /// library, which serves calls on paths below a FUSE mount): a walk that would leave
    /// Shoal's namespace — a symbolic link with an absolute target (the kernel follows it
    /// from the host's root), a target starting with `shoal:` (the native client reads it
    /// as a Shoal path, the kernel as a relative name; the mount's special files are such
    /// links), or `..` above Shoal's root (the kernel goes to the mount point's parent) —
    /// stops before any change with [`Errno::EREMOTE`](crate::Errno), so that the
    /// caller can hand the call to the kernel. Default off (links resolve inside Shoal,
    /// `..` stays at the root).
    pub host_paths: bool,
    /// Prove the host key from this ring rather than from the map's `host_key` file: for a
    /// server's HTTP service, which derives the ring from its cluster key and states, per
    /// request, the identity each HTTP request proved ([`Client::with_cred`](crate::Client::with_cred)).
    /// Default none.
    pub host_keys: Option<shoal_rpc::auth::PeerKeys>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(30),
            failover_wait: Duration::from_secs(15),
            cache_ttl: Duration::from_secs(1),
            cred: Cred::current(),
            connections_per_server: 2,
            umask: 0o022,
            max_in_flight: 16,
            write_behind: 8 << 20,
            readahead: 8 << 20,
            dir_lease: Duration::from_secs(3),
            attr_leases: false,
            host_paths: false,
            host_keys: None,
        }
    }
}

/// How to open a file, as the flags of open(2).
///
/// With none of `read`, `write` and `append` set the file is opened for reading.
/// `append` implies `write`.
#[derive(Clone, Debug, Default)]
pub struct OpenFlags {
    /// Allow reads (O_RDONLY / O_RDWR).
    pub read: bool,
    /// Allow writes (O_WRONLY / O_RDWR).
    pub write: bool,
    /// Every write goes to the current end of the file (O_APPEND).
    pub append: bool,
    /// Create the file if it does not exist (O_CREAT).
    pub create: bool,
    /// With `create`: fail with EEXIST if the name exists (O_EXCL).
    pub exclusive: bool,
    /// Cut an existing file to zero length (O_TRUNC).
    pub truncate: bool,
    /// Permission bits of a created file (before the umask); 0 means 0o644.
    pub perm: u32,
    /// Layout of a created file; unset fields come from the directory's default.
    pub layout: Option<LayoutSpec>,
}

impl OpenFlags {
    /// Open an existing file for reading.
    pub fn read_only() -> Self {
        OpenFlags { read: true, ..Default::default() }
    }

    /// Open an existing file for writing.
    pub fn write_only() -> Self {
        OpenFlags { write: true, ..Default::default() }
    }

    /// Open an existing file for reading and writing.
    pub fn read_write() -> Self {
        OpenFlags { read: true, write: true, ..Default::default() }
    }

    /// Translate the flags of open(2) (`O_RDONLY`, `O_WRONLY`, `O_RDWR`, `O_APPEND`,
    /// `O_CREAT`, `O_EXCL`, `O_TRUNC`; others are ignored) and the mode argument.
    pub fn from_libc(flags: i32, perm: u32) -> Self {
        let (read, write) = match flags & libc::O_ACCMODE {
            libc::O_WRONLY => (false, true),
            libc::O_RDWR => (true, true),
            _ => (true, false),
        };
        OpenFlags {
            read,
            write,
            append: flags & libc::O_APPEND != 0,
            create: flags & libc::O_CREAT != 0,
            exclusive: flags & libc::O_EXCL != 0,
            truncate: flags & libc::O_TRUNC != 0,
            perm,
            layout: None,
        }
    }

    /// Whether the handle may write (`write` or `append`).
    pub(crate) fn writes(&self) -> bool {
        self.write || self.append
    }

    /// Whether the handle may read (`read`, or nothing asked at all).
    pub(crate) fn reads(&self) -> bool {
        self.read || !(self.write || self.append)
    }

    /// The access(2) mask an open of an existing file needs.
    pub(crate) fn access_mask(&self) -> u32 {
        let mut mask = 0;
        if self.reads() {
            mask |= libc::R_OK as u32;
        }
        if self.writes() || self.truncate {
            mask |= libc::W_OK as u32;
        }
        mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_libc_translates_every_flag() {
        let f = OpenFlags::from_libc(libc::O_RDONLY, 0);
        assert!(f.read && !f.write && !f.create && !f.append && !f.truncate && !f.exclusive);
        assert_eq!(f.access_mask(), 4);
        let f = OpenFlags::from_libc(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o600);
        assert!(!f.read && f.write && f.create && f.truncate && !f.exclusive);
        assert_eq!(f.perm, 0o600);
        assert_eq!(f.access_mask(), 2);
        let f =
            OpenFlags::from_libc(libc::O_RDWR | libc::O_APPEND | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o644);
        assert!(f.read && f.write && f.append && f.create && f.exclusive && !f.truncate);
        assert_eq!(f.access_mask(), 6);
    }

    #[test]
    fn nothing_set_means_read() {
        let f = OpenFlags::default();
        assert!(f.reads() && !f.writes());
        let f = OpenFlags { append: true, ..Default::default() };
        assert!(f.writes() && !f.reads());
    }
}
