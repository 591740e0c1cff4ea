//! The status page (`GET /` and `GET /status`) and the JSON it polls (`GET /api/status`):
//! the whole cluster as seen from this server (`status_view.rs`), plus what only this
//! server knows of itself (requests in flight, latencies). The page is one static file
//! embedded in the binary, so it works with no internet and no files beside shoald.

use super::Gateway;
use crate::status_view::{ClusterView, LocalView, OpLatency, Sampler};
use axum::extract::State as AxState;
use axum::response::{Html, IntoResponse};
use axum::{Json, Router};
use std::sync::Arc;

const PAGE: &str = include_str!("static/status.html");

/// The routes of this file. The sampler is theirs alone: it keeps the previous sample of
/// each server, from which rates are computed.
pub(crate) fn routes() -> Router<Arc<Gateway>> {
    let sampler = Arc::new(Sampler::new());
    Router::new()
        .route("/", axum::routing::get(page))
        .route("/status", axum::routing::get(page))
        .route("/api/status", axum::routing::get(move |gw: AxState<Arc<Gateway>>| api_status(gw, sampler.clone())))
}

async fn page() -> impl IntoResponse {
    Html(PAGE)
}

async fn api_status(AxState(gw): AxState<Arc<Gateway>>, sampler: Arc<Sampler>) -> Json<ClusterView> {
    let mut view = sampler.sample(&gw.client).await;
    let ops: Vec<&'static str> = crate::counters::OP_NAMES.to_vec();
    let mut latency: Vec<OpLatency> = gw
        .st
        .metrics
        .latency_sums(&ops)
        .into_iter()
        .filter(|(_, n, _)| *n > 0)
        .map(|(op, n, sum)| OpLatency { op: op.to_string(), count: n, mean_ms: sum * 1e3 / n as f64 })
        .collect();
    latency.sort_by(|a, b| b.mean_ms.total_cmp(&a.mean_ms));
    view.local = Some(LocalView { server: gw.st.id.to_string(), in_flight: gw.st.metrics.in_flight(), latency });
    Json(view)
}
