//! The mount's metrics (`shoal mount --metrics ADDR`, docs/metrics.md): every FUSE request
//! by callback with its latency, requests in flight, bytes read and written, and
//! how often the mount's own caches answered without asking a server.
//!
//! `prometheus-client` for the same reasons as the servers (`shoal-server`'s `metrics.rs`):
//! a registry per mount, no process globals, the text format encoded by the crate. The
//! endpoint is a small axum listener on the mount's runtime.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Instant;

type Label = [(&'static str, &'static str); 1];

fn latency_histogram() -> Histogram {
    // 10 µs (a callback answered from memory) to about 40 s, doubling.
    Histogram::new(exponential_buckets(10e-6, 2.0, 23))
}

/// What a mount counts; one per mount.
pub struct MountMetrics {
    registry: Registry,
    latency: Family<Label, Histogram, fn() -> Histogram>,
    in_flight: Gauge,
    read: Counter,
    written: Counter,
    hits: Family<Label, Counter>,
    misses: Family<Label, Counter>,
}

impl Default for MountMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MountMetrics {
    pub fn new() -> MountMetrics {
        let mut registry = Registry::with_prefix("shoal_fuse");
        let latency = Family::<Label, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let m = MountMetrics {
            latency,
            in_flight: Gauge::default(),
            read: Counter::default(),
            written: Counter::default(),
            hits: Family::default(),
            misses: Family::default(),
            registry: Registry::default(),
        };
        registry.register_with_unit(
            "request_duration",
            "Time from a FUSE request's arrival to its reply, by callback",
            Unit::Seconds,
            m.latency.clone(),
        );
        registry.register("requests_in_flight", "FUSE requests being handled now", m.in_flight.clone());
        registry.register_with_unit("read", "Bytes returned to reads", Unit::Bytes, m.read.clone());
        registry.register_with_unit("written", "Bytes accepted from writes", Unit::Bytes, m.written.clone());
        registry.register(
            "cache_hits",
            "Requests the mount answered from its caches (dir_attrs: directory attributes; leased_names: names under a directory lease)",
            m.hits.clone(),
        );
        registry.register("cache_misses", "Requests that had to ask the servers", m.misses.clone());
        MountMetrics { registry, ..m }
    }

    /// A request of callback `op` arrived: in flight and timed until the guard drops.
    #[must_use = "the request is timed until the guard drops"]
    pub fn request(self: &Arc<Self>, op: &'static str) -> Timed {
        self.in_flight.inc();
        Timed { m: self.clone(), op, start: Instant::now() }
    }

    /// A callback answered at once, on the kernel's thread (from a cache).
    pub fn answered(&self, op: &'static str) {
        self.latency.get_or_create(&[("op", op)]).observe(0.0);
    }

    pub fn read(&self, bytes: usize) {
        self.read.inc_by(bytes as u64);
    }

    pub fn written(&self, bytes: usize) {
        self.written.inc_by(bytes as u64);
    }

    /// A lookup in cache `cache` found what it wanted (`hit`) or not.
    pub fn cache(&self, cache: &'static str, hit: bool) {
        let family = if hit { &self.hits } else { &self.misses };
        family.get_or_create(&[("cache", cache)]).inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// A FUSE request being handled (see [`MountMetrics::request`]).
pub struct Timed {
    m: Arc<MountMetrics>,
    op: &'static str,
    start: Instant,
}

impl Drop for Timed {
    fn drop(&mut self) {
        self.m.in_flight.dec();
        self.m.latency.get_or_create(&[("op", self.op)]).observe(self.start.elapsed().as_secs_f64());
    }
}

/// Serve `GET /metrics` of `m` on `listener` until the task is aborted.
pub async fn serve(m: Arc<MountMetrics>, listener: tokio::net::TcpListener) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let m = m.clone();
            async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
                    m.render(),
                )
            }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::warn!("metrics listener stopped: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_bytes_and_cache_lookups_show_in_the_text() {
        let m = Arc::new(MountMetrics::new());
        drop(m.request("read"));
        m.answered("getattr");
        m.read(100);
        m.cache("dir_attrs", true);
        let t = m.render();
        assert!(t.contains("shoal_fuse_request_duration_seconds_count{op=\"read\"} 1"), "{t}");
        assert!(t.contains("shoal_fuse_read_bytes_total 100"), "{t}");
        assert!(t.contains("shoal_fuse_cache_hits_total{cache=\"dir_attrs\"} 1"), "{t}");
        assert!(t.contains("shoal_fuse_requests_in_flight 0"), "{t}");
    }
}
