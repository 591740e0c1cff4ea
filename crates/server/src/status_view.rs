//! The cluster as the status page (`GET /api/status`) and `shoal top` show it: every
//! server's health, capacity and contents, and its rates (requests, bytes, errors, CPU and
//! each operation per second) computed from two samples of the counters `Status` reports.
//!
//! One [`Sampler`] keeps the previous sample of each server, so that both views compute
//! rates the same way: over at least [`MIN_INTERVAL`] (a page and a terminal polling the
//! same server at once must not turn rates into the noise of a few milliseconds).

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shoal_client::Client;
use shoal_proto::msg::{Counters, ServerStatus};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Shortest interval rates are computed over; polls closer together see the last rates.
pub const MIN_INTERVAL: Duration = Duration::from_millis(900);
/// How many operations `busiest` lists.
pub const BUSIEST: usize = 8;

/// The whole cluster at one moment.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClusterView {
    pub map_version: u64,
    /// Milliseconds since the Unix epoch when the sample was taken.
    pub sampled_at_ms: u64,
    pub servers_up: usize,
    pub servers_total: usize,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub servers: Vec<ServerView>,
    /// The operations with the highest rate over all servers (by total count while no
    /// rate is known yet), at most [`BUSIEST`].
    pub busiest: Vec<OpRate>,
    /// What only the answering server knows of itself (the HTTP view; empty in `shoal top`).
    #[serde(default)]
    pub local: Option<LocalView>,
}

/// One server: up with its figures, or down with the reason.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ServerView {
    pub id: u32,
    /// `s<id>`, as every tool names servers.
    pub name: String,
    pub addr: String,
    pub http: Option<String>,
    pub up: bool,
    pub error: Option<String>,
    pub uptime_secs: u64,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
    pub entries: u64,
    pub data_objects: u64,
    pub pending_intents: u64,
    pub client_requests: u64,
    pub peer_requests: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub errors: u64,
    pub rates: Rates,
    /// Every operation served so far with its rate, busiest first.
    pub ops: Vec<OpRate>,
    /// The mirrors of its slot and how far each has got (docs/resync.md).
    #[serde(default)]
    pub mirrors: Vec<shoal_proto::msg::MirrorStatus>,
}

/// Per-second rates of one server between two samples (zero until two exist).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Rates {
    pub requests_per_s: f64,
    pub bytes_in_per_s: f64,
    pub bytes_out_per_s: f64,
    pub errors_per_s: f64,
    /// CPU time the server used per second of wall time, in percent of one core.
    pub cpu_percent: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OpRate {
    pub op: String,
    pub total: u64,
    pub per_s: f64,
}

/// The answering server's own figures, which `Status` does not carry.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LocalView {
    pub server: String,
    /// Requests being handled now (its queue depth).
    pub in_flight: i64,
    /// Mean latency of each operation it has timed, slowest first.
    pub latency: Vec<OpLatency>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OpLatency {
    pub op: String,
    pub count: u64,
    pub mean_ms: f64,
}

/// The previous sample of a server and the rates computed when it was taken.
struct Prev {
    at: Instant,
    counters: Counters,
    rates: Rates,
    ops: HashMap<String, f64>,
}

/// Takes samples of the cluster and remembers the last one of each server (for rates).
#[derive(Default)]
pub struct Sampler {
    prev: Mutex<HashMap<u32, Prev>>,
}

impl Sampler {
    pub fn new() -> Sampler {
        Sampler::default()
    }

    /// Ask every server of `client`'s map for its status (in parallel) and build the view.
    pub async fn sample(&self, client: &Client) -> ClusterView {
        let all = client.status_all().await;
        let map = client.map();
        let now = Instant::now();
        let mut view = ClusterView {
            map_version: map.version(),
            sampled_at_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64,
            servers_total: all.len(),
            ..Default::default()
        };
        let mut busiest: HashMap<String, OpRate> = HashMap::new();
        for (id, r) in all {
            let entry = map.server(id);
            let mut s = ServerView {
                id: id.0,
                name: id.to_string(),
                addr: entry.map(|e| e.addr.clone()).unwrap_or_default(),
                http: entry.and_then(|e| e.http.clone()),
                ..Default::default()
            };
            match r {
                Ok(st) => {
                    self.fill(&mut s, &st, now);
                    view.servers_up += 1;
                    view.capacity_bytes += s.capacity_bytes;
                    view.free_bytes += s.free_bytes;
                    for o in &s.ops {
                        let b = busiest
                            .entry(o.op.clone())
                            .or_insert_with(|| OpRate { op: o.op.clone(), ..Default::default() });
                        b.total += o.total;
                        b.per_s += o.per_s;
                    }
                }
                Err(e) => s.error = Some(e.to_string()),
            }
            view.servers.push(s);
        }
        let mut busiest: Vec<OpRate> = busiest.into_values().collect();
        sort_busiest(&mut busiest);
        busiest.truncate(BUSIEST);
        view.busiest = busiest;
        view
    }

    fn fill(&self, s: &mut ServerView, st: &ServerStatus, now: Instant) {
        let c = &st.counters;
        s.up = true;
        s.uptime_secs = st.uptime_secs;
        s.capacity_bytes = st.capacity_bytes;
        s.free_bytes = st.free_bytes;
        s.used_bytes = st.used_bytes;
        s.inodes = st.inodes;
        s.entries = st.entries;
        s.data_objects = st.data_objects;
        s.pending_intents = st.pending_intents;
        s.client_requests = c.client_requests;
        s.peer_requests = c.peer_requests;
        s.bytes_received = c.bytes_received;
        s.bytes_sent = c.bytes_sent;
        s.errors = c.errors;
        s.mirrors = st.mirrors.clone();
        let mut prev = self.prev.lock();
        let fresh = match prev.get(&s.id) {
            // A restarted server's counters start again from zero: no rate across that.
            Some(p) if now.duration_since(p.at) < MIN_INTERVAL && c.client_requests >= p.counters.client_requests => {
                None
            }
            Some(p) if c.client_requests >= p.counters.client_requests => {
                let secs = now.duration_since(p.at).as_secs_f64();
                let per_s = |new: u64, old: u64| new.saturating_sub(old) as f64 / secs;
                let old_ops: HashMap<&str, u64> = p.counters.ops.iter().map(|(n, v)| (n.as_str(), *v)).collect();
                let rates = Rates {
                    requests_per_s: per_s(
                        c.client_requests + c.peer_requests,
                        p.counters.client_requests + p.counters.peer_requests,
                    ),
                    bytes_in_per_s: per_s(c.bytes_received, p.counters.bytes_received),
                    bytes_out_per_s: per_s(c.bytes_sent, p.counters.bytes_sent),
                    errors_per_s: per_s(c.errors, p.counters.errors),
                    cpu_percent: per_s(c.cpu_ns, p.counters.cpu_ns) / 1e7,
                };
                let ops = c
                    .ops
                    .iter()
                    .map(|(n, v)| (n.clone(), per_s(*v, old_ops.get(n.as_str()).copied().unwrap_or(0))))
                    .collect();
                Some(Prev { at: now, counters: c.clone(), rates, ops })
            }
            _ => Some(Prev { at: now, counters: c.clone(), rates: Rates::default(), ops: HashMap::new() }),
        };
        if let Some(p) = fresh {
            prev.insert(s.id, p);
        }
        let p = &prev[&s.id];
        s.rates = p.rates.clone();
        s.ops = c
            .ops
            .iter()
            .map(|(n, v)| OpRate { op: n.clone(), total: *v, per_s: p.ops.get(n).copied().unwrap_or(0.0) })
            .collect();
        sort_busiest(&mut s.ops);
    }
}

/// Highest rate first, then highest total, then by name (a stable order for a table).
fn sort_busiest(ops: &mut [OpRate]) {
    ops.sort_by(|a, b| b.per_s.total_cmp(&a.per_s).then(b.total.cmp(&a.total)).then(a.op.cmp(&b.op)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busiest_sorts_by_rate_then_total_then_name() {
        let r = |op: &str, total, per_s| OpRate { op: op.into(), total, per_s };
        let mut v = vec![r("a", 5, 0.0), r("b", 1, 2.0), r("c", 9, 0.0), r("d", 5, 0.0)];
        sort_busiest(&mut v);
        let names: Vec<&str> = v.iter().map(|o| o.op.as_str()).collect();
        assert_eq!(names, ["b", "c", "a", "d"]);
    }
}
