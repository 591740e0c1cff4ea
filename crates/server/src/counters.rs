//! Monotonic counters of what the server has served, reported by `Status`.
//!
//! Updated on every request from many tasks at once, so they are plain atomics; the
//! per-operation counts live in a map built once from the known operation names (no lock on
//! the hot path). `shoal bench` reads them before and after a run and takes differences.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Every [`shoal_proto::msg::Op::name`]. An operation missing here is still counted (in a
/// locked side map), just more slowly.
pub(crate) const OP_NAMES: &[&str] = &[
    "hello",
    "batch",
    "lookup",
    "create",
    "mkdir",
    "symlink",
    "link",
    "unlink",
    "rmdir",
    "rename",
    "readdir",
    "getattr",
    "setattr",
    "setdirlayout",
    "setreadmostly",
    "readlink",
    "access",
    "extendsize",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "read",
    "write",
    "append",
    "fsync",
    "statfs",
    "status",
    "peer_mkdir_object",
    "peer_rmdir_object",
    "peer_link_delta",
    "peer_rename_in",
    "peer_set_parent",
    "peer_delete_objects",
    "peer_truncate_object",
    "peer_split_in",
    "peer_add_partition",
    "peer_partitions",
    "peer_seal_partitions",
    "peer_partition_attr",
    MISROUTED,
];

/// Not an operation: requests answered `Partitions` because the sender routed a name of a
/// split directory with a stale bitmap (`ops/namespace/split.rs`).
pub const MISROUTED: &str = "misrouted";

#[derive(Default)]
pub struct Counters {
    client_requests: AtomicU64,
    peer_requests: AtomicU64,
    peer_requests_sent: AtomicU64,
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    errors: AtomicU64,
    ops: HashMap<&'static str, AtomicU64>,
    other_ops: Mutex<HashMap<String, u64>>,
}

impl Counters {
    pub fn new() -> Counters {
        Counters { ops: OP_NAMES.iter().map(|&n| (n, AtomicU64::new(0))).collect(), ..Default::default() }
    }

    /// A request arrived: `from_peer` if another server sent it.
    pub fn request(&self, op: &str, from_peer: bool) {
        if from_peer {
            self.peer_requests.fetch_add(1, Relaxed);
        } else {
            self.client_requests.fetch_add(1, Relaxed);
        }
        match self.ops.get(op) {
            Some(c) => {
                c.fetch_add(1, Relaxed);
            }
            None => *self.other_ops.lock().entry(op.to_string()).or_default() += 1,
        }
    }

    /// An operation arrived inside a batch: counted by name, not as a request (the batch
    /// was the request).
    pub fn batched(&self, op: &str) {
        if let Some(c) = self.ops.get(op) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// A request was answered `Partitions` (counted under [`MISROUTED`]).
    pub fn misrouted(&self) {
        self.batched(MISROUTED);
    }

    pub fn peer_sent(&self) {
        self.peer_requests_sent.fetch_add(1, Relaxed);
    }

    pub fn received(&self, bytes: usize) {
        self.bytes_received.fetch_add(bytes as u64, Relaxed);
    }

    pub fn sent(&self, bytes: usize) {
        self.bytes_sent.fetch_add(bytes as u64, Relaxed);
    }

    pub fn error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }

    /// The wire form: per-operation counts (those seen at least once) sorted by name.
    pub fn snapshot(&self) -> shoal_proto::msg::Counters {
        let mut ops: Vec<(String, u64)> = self
            .ops
            .iter()
            .map(|(n, c)| (n.to_string(), c.load(Relaxed)))
            .chain(self.other_ops.lock().iter().map(|(n, c)| (n.clone(), *c)))
            .filter(|(_, c)| *c > 0)
            .collect();
        ops.sort();
        shoal_proto::msg::Counters {
            client_requests: self.client_requests.load(Relaxed),
            peer_requests: self.peer_requests.load(Relaxed),
            peer_requests_sent: self.peer_requests_sent.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            errors: self.errors.load(Relaxed),
            cpu_ns: process_cpu_ns(),
            ops,
        }
    }
}

/// CPU time (user + system) of this process so far, in nanoseconds.
fn process_cpu_ns() -> u64 {
    // SAFETY: getrusage only writes into the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(ru.ru_utime) + ns(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_sorted_and_split_by_origin() {
        let c = Counters::new();
        c.request("write", false);
        c.request("lookup", false);
        c.request("lookup", false);
        c.request("peer_link_delta", true);
        c.request("future_op", false);
        c.error();
        let s = c.snapshot();
        assert_eq!(s.client_requests, 4);
        assert_eq!(s.peer_requests, 1);
        assert_eq!(s.errors, 1);
        let names: Vec<&str> = s.ops.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["future_op", "lookup", "peer_link_delta", "write"]);
        assert_eq!(s.ops[1].1, 2);
    }
}
