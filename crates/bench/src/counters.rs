//! The servers' own counters around a phase: snapshots from `status_all()` before and after,
//! their difference per server, and the figures FPFS uses (requests and bytes per
//! operation, per server, and the max/min and max/mean load across servers).
//!
//! The snapshots themselves cost one `status` request per server (and a `hello` on a new
//! connection); those two operations are left out of every request count. Their bytes
//! (a few hundred per server per snapshot) cannot be told apart and stay in the byte counts.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use shoal_client::Client;
use shoal_proto::msg::Counters;
use std::collections::BTreeMap;

/// Operations that measuring itself causes.
pub const EXCLUDED_OPS: [&str; 2] = ["status", "hello"];

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub servers: Vec<(u32, Option<Counters>)>,
}

/// Read every server's counters. A server that does not answer is recorded as missing.
pub async fn snapshot(client: &Client) -> Result<Snapshot> {
    let all = client.status_all().await;
    Ok(Snapshot { servers: all.into_iter().map(|(id, r)| (id.0, r.ok().map(|s| s.counters))).collect() })
}

/// What one server did during a phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerDelta {
    pub server: u32,
    /// Requests from clients and from other servers (status and hello left out).
    pub client_requests: u64,
    pub peer_requests: u64,
    /// Requests this server sent to its peers.
    pub peer_requests_sent: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// CPU time the server process used, in nanoseconds.
    #[serde(default)]
    pub cpu_ns: u64,
    /// Requests by operation (status and hello left out).
    pub ops: BTreeMap<String, u64>,
    /// False if the server did not answer one of the snapshots (its figures are zero).
    pub answered: bool,
}

impl ServerDelta {
    pub fn requests(&self) -> u64 {
        self.client_requests + self.peer_requests
    }
}

fn ops_map(c: &Counters) -> BTreeMap<String, u64> {
    c.ops.iter().map(|(n, v)| (n.clone(), *v)).collect()
}

/// Per-server differences between two snapshots.
pub fn diff(before: &Snapshot, after: &Snapshot) -> Vec<ServerDelta> {
    let mut out = Vec::new();
    for (id, a) in &after.servers {
        let b = before.servers.iter().find(|(i, _)| i == id).and_then(|(_, c)| c.as_ref());
        let (Some(a), Some(b)) = (a.as_ref(), b) else {
            out.push(ServerDelta { server: *id, answered: false, ..Default::default() });
            continue;
        };
        let (ao, bo) = (ops_map(a), ops_map(b));
        let mut ops = BTreeMap::new();
        let mut excluded = 0u64;
        for (name, v) in &ao {
            let d = v.saturating_sub(*bo.get(name).unwrap_or(&0));
            if EXCLUDED_OPS.contains(&name.as_str()) {
                excluded += d;
            } else if d > 0 {
                ops.insert(name.clone(), d);
            }
        }
        out.push(ServerDelta {
            server: *id,
            client_requests: a.client_requests.saturating_sub(b.client_requests).saturating_sub(excluded),
            peer_requests: a.peer_requests.saturating_sub(b.peer_requests),
            peer_requests_sent: a.peer_requests_sent.saturating_sub(b.peer_requests_sent),
            bytes_received: a.bytes_received.saturating_sub(b.bytes_received),
            bytes_sent: a.bytes_sent.saturating_sub(b.bytes_sent),
            cpu_ns: a.cpu_ns.saturating_sub(b.cpu_ns),
            ops,
            answered: true,
        });
    }
    out
}

/// The servers' view of one phase, normalised by the phase's operations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerSummary {
    pub per_server: Vec<ServerDelta>,
    /// What the figures are divided by: transfers (I/O) or items (metadata).
    pub phase_ops: u64,
    /// All servers together, per operation of the phase.
    pub client_requests_per_op: f64,
    pub peer_requests_per_op: f64,
    pub bytes_received_per_op: f64,
    pub bytes_sent_per_op: f64,
    /// CPU microseconds all servers together used per operation.
    #[serde(default)]
    pub cpu_us_per_op: f64,
    /// Requests per phase operation, by server operation name (`create`, `lookup`, …).
    pub ops_per_op: BTreeMap<String, f64>,
    /// Load balance over the servers that answered, load = requests handled (client +
    /// peer). `None` when the least loaded server handled none.
    pub requests_max_min: Option<f64>,
    pub requests_max_mean: Option<f64>,
    /// The same with load = bytes received + sent.
    pub bytes_max_min: Option<f64>,
    pub bytes_max_mean: Option<f64>,
}

fn balance(loads: &[u64]) -> (Option<f64>, Option<f64>) {
    if loads.is_empty() {
        return (None, None);
    }
    let max = *loads.iter().max().unwrap() as f64;
    let min = *loads.iter().min().unwrap() as f64;
    let mean = loads.iter().sum::<u64>() as f64 / loads.len() as f64;
    (if min > 0.0 { Some(max / min) } else { None }, if mean > 0.0 { Some(max / mean) } else { None })
}

pub fn summarize(per_server: Vec<ServerDelta>, phase_ops: u64) -> ServerSummary {
    let ops = phase_ops.max(1) as f64;
    let answered: Vec<&ServerDelta> = per_server.iter().filter(|d| d.answered).collect();
    let sum = |f: &dyn Fn(&ServerDelta) -> u64| answered.iter().map(|d| f(d)).sum::<u64>() as f64;
    let mut ops_per_op = BTreeMap::new();
    for d in &answered {
        for (name, v) in &d.ops {
            *ops_per_op.entry(name.clone()).or_insert(0.0) += *v as f64 / ops;
        }
    }
    let reqs: Vec<u64> = answered.iter().map(|d| d.requests()).collect();
    let bytes: Vec<u64> = answered.iter().map(|d| d.bytes_received + d.bytes_sent).collect();
    let (requests_max_min, requests_max_mean) = balance(&reqs);
    let (bytes_max_min, bytes_max_mean) = balance(&bytes);
    ServerSummary {
        phase_ops,
        client_requests_per_op: sum(&|d| d.client_requests) / ops,
        peer_requests_per_op: sum(&|d| d.peer_requests) / ops,
        bytes_received_per_op: sum(&|d| d.bytes_received) / ops,
        cpu_us_per_op: sum(&|d| d.cpu_ns) / ops / 1e3,
        bytes_sent_per_op: sum(&|d| d.bytes_sent) / ops,
        ops_per_op,
        requests_max_min,
        requests_max_mean,
        bytes_max_min,
        bytes_max_mean,
        per_server,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(client: u64, peer: u64, rx: u64, ops: &[(&str, u64)]) -> Counters {
        Counters {
            client_requests: client,
            peer_requests: peer,
            peer_requests_sent: 0,
            bytes_received: rx,
            bytes_sent: rx / 2,
            errors: 0,
            cpu_ns: 0,
            ops: ops.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn differences_leave_out_measuring() {
        let before = Snapshot {
            servers: vec![
                (0, Some(counters(10, 0, 1000, &[("status", 3), ("hello", 1), ("lookup", 6)]))),
                (1, Some(counters(5, 0, 500, &[("status", 3), ("hello", 1), ("lookup", 1)]))),
                (2, None),
            ],
        };
        let after = Snapshot {
            servers: vec![
                (0, Some(counters(111, 4, 3000, &[("status", 4), ("hello", 1), ("lookup", 6), ("create", 100)]))),
                (1, Some(counters(56, 0, 1500, &[("status", 4), ("hello", 1), ("lookup", 1), ("create", 50)]))),
                (2, Some(counters(1, 0, 10, &[("status", 1)]))),
            ],
        };
        let d = diff(&before, &after);
        assert_eq!(d[0].client_requests, 100);
        assert_eq!(d[0].peer_requests, 4);
        assert_eq!(d[0].ops.get("create"), Some(&100));
        assert!(!d[0].ops.contains_key("status") && !d[0].ops.contains_key("lookup"));
        assert_eq!(d[1].client_requests, 50);
        assert!(!d[2].answered);
        let s = summarize(d, 150);
        assert!((s.client_requests_per_op - 1.0).abs() < 1e-9);
        assert!((s.ops_per_op["create"] - 1.0).abs() < 1e-9);
        assert!((s.requests_max_min.unwrap() - 104.0 / 50.0).abs() < 1e-9);
        assert!((s.requests_max_mean.unwrap() - 104.0 / 77.0).abs() < 1e-9);
    }
}
