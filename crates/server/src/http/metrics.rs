//! `GET /metrics`: this server's metrics in the OpenMetrics text format, for Prometheus
//! (docs/metrics.md lists each one).
//!
//! Two registries make one answer: the one `metrics.rs` updates on every request
//! (latencies, errors by errno, requests in flight), and one built here per scrape from
//! what the server counts anyway (`counters.rs`, the stores, the caches, the disk). The
//! second costs nothing between scrapes, which is why it is not kept up to date.

use super::Gateway;
use crate::state::State;
use axum::extract::State as AxState;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;

/// The content type of the OpenMetrics text format (what Prometheus asks for first).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The routes of this file.
pub(crate) fn routes() -> Router<Arc<Gateway>> {
    Router::new().route("/metrics", axum::routing::get(metrics))
}

async fn metrics(AxState(gw): AxState<Arc<Gateway>>) -> Response {
    match render(&gw.st).await {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("metrics: {e}\n")).into_response(),
    }
}

/// A counter whose value is `v` (a counter made for one scrape).
fn counter(v: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(v);
    c
}

fn gauge(v: u64) -> Gauge {
    let g = Gauge::default();
    g.set(v.min(i64::MAX as u64) as i64);
    g
}

/// The text of `GET /metrics` for server `st`.
pub(crate) async fn render(st: &Arc<State>) -> anyhow::Result<String> {
    let status = match crate::ops::data::status(st).await {
        Ok(shoal_proto::msg::Reply::Status(s)) => s,
        Ok(_) => anyhow::bail!("the status handler gave no status"),
        Err(f) => anyhow::bail!("{f}"),
    };
    let c = &status.counters;
    let mut r = Registry::with_prefix("shoal");

    let ops = Family::<[(&'static str, String); 1], Counter>::default();
    for (op, n) in &c.ops {
        ops.get_or_create(&[("op", op.clone())]).inc_by(*n);
    }
    r.register("operations", "Operations served, by name (those inside batches included)", ops);
    let origin = Family::<[(&'static str, &'static str); 1], Counter>::default();
    origin.get_or_create(&[("from", "client")]).inc_by(c.client_requests);
    origin.get_or_create(&[("from", "peer")]).inc_by(c.peer_requests);
    r.register("requests", "Requests received (a batch counts once), from clients or other servers", origin);
    r.register("peer_requests_sent", "Requests this server sent to other servers", counter(c.peer_requests_sent));
    r.register_with_unit("received", "Bytes of requests received", Unit::Bytes, counter(c.bytes_received));
    r.register_with_unit("sent", "Bytes of replies sent", Unit::Bytes, counter(c.bytes_sent));
    r.register("failed_requests", "Requests and batched operations answered with an error", counter(c.errors));
    r.register_with_unit("cpu", "CPU time (user + system) of the server process", Unit::Seconds, {
        let g = Counter::<f64>::default();
        g.inc_by(c.cpu_ns as f64 / 1e9);
        g
    });
    r.register_with_unit("uptime", "Time since the server started", Unit::Seconds, gauge(status.uptime_secs));
    r.register("map_version", "Version of the cluster map the server holds", gauge(status.map_version));

    r.register_with_unit(
        "capacity",
        "Size of the data directory's file system",
        Unit::Bytes,
        gauge(status.capacity_bytes),
    );
    r.register_with_unit(
        "free",
        "Bytes free for the server on that file system",
        Unit::Bytes,
        gauge(status.free_bytes),
    );
    r.register_with_unit("used", "Bytes used on that file system", Unit::Bytes, gauge(status.used_bytes));
    r.register("inodes", "Inode records held (files, directories, symlinks homed here)", gauge(status.inodes));
    r.register("entries", "Directory entries held", gauge(status.entries));
    r.register("data_objects", "Data objects (stripes of files) held", gauge(status.data_objects));
    r.register("pending_intents", "Cross-server operations not finished yet", gauge(status.pending_intents));

    let rocks = Family::<[(&'static str, &'static str); 1], Gauge>::default();
    for (name, prop) in [
        ("estimate_keys", "rocksdb.estimate-num-keys"),
        ("memtable_bytes", "rocksdb.cur-size-all-mem-tables"),
        ("block_cache_bytes", "rocksdb.block-cache-usage"),
        ("sst_bytes", "rocksdb.total-sst-files-size"),
        ("live_data_bytes", "rocksdb.estimate-live-data-size"),
    ] {
        if let Some(v) = st.meta.property(prop) {
            rocks.get_or_create(&[("stat", name)]).set(v.min(i64::MAX as u64) as i64);
        }
    }
    r.register("metadata_store", "Statistics of the metadata store (RocksDB properties)", rocks);

    let hits = Family::<[(&'static str, &'static str); 1], Counter>::default();
    let misses = Family::<[(&'static str, &'static str); 1], Counter>::default();
    for (cache, hm) in
        [("object_files", &st.data.fd_cache), ("checksums", &st.data.sums_cache), ("replies", &st.replies.stats)]
    {
        let (h, m) = hm.get();
        hits.get_or_create(&[("cache", cache)]).inc_by(h);
        misses.get_or_create(&[("cache", cache)]).inc_by(m);
    }
    r.register("cache_hits", "Lookups a cache answered (replies: retries answered without applying again)", hits);
    r.register("cache_misses", "Lookups a cache could not answer", misses);

    let mut text = String::new();
    encode_registry(&mut text, st.metrics.registry())?;
    encode_registry(&mut text, &r)?;
    encode_eof(&mut text)?;
    Ok(text)
}
