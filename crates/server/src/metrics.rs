//! What a server measures for Prometheus (`GET /metrics`, docs/metrics.md) beyond the
//! counts `counters.rs` keeps: the latency of every request by operation, errors by errno,
//! the requests in flight, and the hit counts of the server's caches.
//!
//! Why `prometheus-client` (the Prometheus project's own crate) and not the `metrics`
//! facade: its registries are values, not process globals, so each server of a process
//! (`tests/cluster.rs` runs several) has its own, and it encodes the OpenMetrics text
//! format itself. The hot path pays one histogram lookup (a read lock and a hash of the
//! operation name) and two atomic adds per request ([`Metrics::request`]); everything the
//! server already counts or can compute (per-operation counts, bytes, store sizes, space)
//! is turned into metrics only when scraped (`http/metrics.rs`), at no cost per request.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use shoal_proto::Errno;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The label set of per-operation metrics: `op` is [`shoal_proto::msg::Op::name`].
pub type OpLabel = [(&'static str, &'static str); 1];
/// The label set of errors: the errno's number and its C library text.
pub type ErrnoLabel = [(&'static str, String); 2];

fn latency_histogram() -> Histogram {
    // 20 µs (a cached stat on a fast machine) to about 40 s (a large fsync on a slow disk),
    // doubling: 22 buckets keep the relative error of any quantile under a factor of two.
    Histogram::new(exponential_buckets(20e-6, 2.0, 22))
}

/// Hits and misses of one cache. Plain atomics: caches count from many threads at once.
#[derive(Debug, Default)]
pub struct HitMiss {
    hits: AtomicU64,
    misses: AtomicU64,
}

impl HitMiss {
    pub fn hit(&self) {
        self.hits.fetch_add(1, Relaxed);
    }

    pub fn miss(&self) {
        self.misses.fetch_add(1, Relaxed);
    }

    pub fn record(&self, hit: bool) {
        if hit {
            self.hit()
        } else {
            self.miss()
        }
    }

    /// (hits, misses) so far.
    pub fn get(&self) -> (u64, u64) {
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }
}

/// The metrics a server updates as it works; registered in its own [`Registry`].
pub struct Metrics {
    registry: Registry,
    latency: Family<OpLabel, Histogram, fn() -> Histogram>,
    errors: Family<ErrnoLabel, Counter>,
    in_flight: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("shoal");
        let latency = Family::<OpLabel, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let errors = Family::<ErrnoLabel, Counter>::default();
        let in_flight = Gauge::default();
        registry.register_with_unit(
            "request_duration",
            "Time from a request's arrival to its reply, by operation (a batch counts once, as batch)",
            prometheus_client::registry::Unit::Seconds,
            latency.clone(),
        );
        registry.register("errors", "Operations answered with an error, by errno", errors.clone());
        registry.register(
            "requests_in_flight",
            "Requests being handled now: the server's queue depth",
            in_flight.clone(),
        );
        Metrics { registry, latency, errors, in_flight }
    }

    /// A request of operation `op` arrived: it is in flight until the returned guard drops,
    /// which records its latency.
    #[must_use = "the request is timed until the guard drops"]
    pub fn request(&self, op: &'static str) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight { m: self, op, start: Instant::now() }
    }

    /// An operation was answered with `errno`.
    pub fn error(&self, errno: Errno) {
        self.errors.get_or_create(&[("errno", errno.code().to_string()), ("text", errno.description())]).inc();
    }

    /// The registered metrics (encoded by `http/metrics.rs` with those computed per scrape).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// Per operation: (requests timed, total seconds), for the status page's latencies.
    pub fn latency_sums(&self, ops: &[&'static str]) -> Vec<(&'static str, u64, f64)> {
        // A histogram's count and sum are not readable through prometheus-client's API
        // except by encoding; the status page needs only the means, so this asks the
        // text encoder for the family and reads `_count` and `_sum` back.
        let mut text = String::new();
        let mut r = Registry::default();
        r.register("d", "", self.latency.clone());
        if prometheus_client::encoding::text::encode_registry(&mut text, &r).is_err() {
            return Vec::new();
        }
        ops.iter()
            .map(|&op| {
                let find = |suffix: &str| {
                    let head = format!("d{suffix}{{op=\"{op}\"}} ");
                    text.lines().find_map(|l| l.strip_prefix(head.as_str())).and_then(|v| v.parse::<f64>().ok())
                };
                (op, find("_count").unwrap_or(0.0) as u64, find("_sum").unwrap_or(0.0))
            })
            .collect()
    }
}

/// A request being handled (see [`Metrics::request`]).
pub struct InFlight<'a> {
    m: &'a Metrics,
    op: &'static str,
    start: Instant,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.m.in_flight.dec();
        self.m.latency.get_or_create(&[("op", self.op)]).observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_in_flight_until_its_guard_drops_and_then_timed() {
        let m = Metrics::new();
        let g = m.request("lookup");
        assert_eq!(m.in_flight(), 1);
        drop(g);
        assert_eq!(m.in_flight(), 0);
        let sums = m.latency_sums(&["lookup", "create"]);
        assert_eq!(sums[0].0, "lookup");
        assert_eq!(sums[0].1, 1);
        assert!(sums[0].2 >= 0.0);
        assert_eq!(sums[1].1, 0);
        m.error(Errno::ENOENT);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, m.registry()).unwrap();
        assert!(text.contains("shoal_errors_total{errno=\"2\",text=\"No such file or directory\"} 1"), "{text}");
        assert!(text.contains("shoal_request_duration_seconds_count{op=\"lookup\"} 1"), "{text}");
    }
}
