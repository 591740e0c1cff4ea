//! How many client connections a server takes, from its descriptor limit.
//!
//! Every connection is a descriptor. The server needs descriptors of its own that
//! clients must never be able to take: cached object files, RocksDB's files, connections to
//! its peers, the listener and the runtime's. A flood of clients used to take all of them,
//! so that writes failed with EMFILE; the connection limit keeps them back.

use std::time::Duration;

/// Object files the data store keeps open at most (its descriptor cache).
const OBJECT_FILES: u64 = 2 * crate::store::data::FD_CACHE as u64; // data and checksums
/// Files RocksDB keeps open at most (SST tables; see `store::meta`), plus its WAL, manifest
/// and logs.
const ROCKSDB_FILES: u64 = crate::store::meta::MAX_OPEN_FILES as u64 + 16;
/// Connections the accept loop may hold open just to refuse them with a reason.
pub const REFUSING: usize = 32;
/// Listener, epoll, eventfds, standard streams, object files a request holds after the cache
/// dropped them, and what else a process keeps open.
const MISC: u64 = 128;

/// Connection limits of a server.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Client and peer connections held at once; beyond it a new connection's `Hello` is
    /// refused (or, if some connections have not said `Hello` yet, the oldest of those is
    /// closed to make room).
    pub max_connections: usize,
    /// A connection that has not completed `Hello` within this time is closed.
    pub handshake_timeout: Duration,
    /// Peer servers' connections that may exceed `max_connections` (the peers' pools).
    pub peer_reserve: usize,
}

/// Raise the soft limit on open descriptors to the hard limit and return it.
pub fn raise_nofile() -> u64 {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read or write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 1024;
        }
        if rl.rlim_cur < rl.rlim_max {
            let raised = libc::rlimit { rlim_cur: rl.rlim_max, rlim_max: rl.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                rl.rlim_cur = rl.rlim_max;
            }
        }
    }
    rl.rlim_cur
}

/// Descriptors the server keeps for itself in a cluster of `servers` servers.
pub fn reserved(servers: usize) -> u64 {
    // Its pools hold 3 connections to each peer (2 for requests, 1 for the map group's
    // messages: `shoal_rpc::Pool`) and the peers' pools 3 to it.
    OBJECT_FILES + ROCKSDB_FILES + REFUSING as u64 + 6 * servers as u64 + MISC
}

/// The default connection limit for a descriptor limit of `nofile`: what is left after the
/// reserve, two descriptors per connection. At least 16, so that a badly configured
/// machine still serves a few clients (the log says why this is tight).
pub fn default_max_connections(nofile: u64, servers: usize) -> usize {
    (nofile.saturating_sub(reserved(servers)) / 2).clamp(16, 1 << 20) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_limit_leaves_the_reserve_and_two_descriptors_per_connection() {
        let r = reserved(4);
        assert_eq!(default_max_connections(r + 2000, 4), 1000);
        assert_eq!(default_max_connections(100, 4), 16);
        assert!(default_max_connections(1 << 20, 4) * 2 + r as usize <= 1 << 20);
    }
}
