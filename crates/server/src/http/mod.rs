//! The HTTP service of a server (docs/http.md): on the port the map's `http` names, beside
//! the binary protocol's. It serves the file system to any HTTP tool and this server's
//! metrics and status page.
//!
//! Any server answers for any path: file requests go through `Gateway::client`, a native
//! client inside this process that resolves paths and reads and writes stripes on every
//! server of a file in parallel, exactly as a program using the native API would. It proves
//! the host key (derived from this server's cluster key), so that it may state, per request,
//! the identity that request proved (a token, or the anonymous identity of `[http]`).

mod errors;
mod files;
mod identity;
mod listing;
mod metrics;
mod ranges;
mod status_page;

use crate::state::State;
use axum::Router;
use shoal_client::{Client, ClientOptions};
use shoal_placement::map::HttpSettings;
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpListener;

/// What every HTTP handler shares.
pub(crate) struct Gateway {
    pub st: Arc<State>,
    /// The native client file requests go through, acting as root; handlers use
    /// `client.with_cred(...)` for the identity of each request.
    pub client: Client,
    pub settings: HttpSettings,
}

impl Gateway {
    /// The gateway of server `st`, whose cluster map file is `config` (its client reloads
    /// the map from there when servers answer that it is stale).
    pub fn new(st: Arc<State>, config: &Path) -> anyhow::Result<Gateway> {
        let keys = {
            let st = Arc::downgrade(&st);
            shoal_rpc::auth::PeerKeys(Arc::new(move || {
                st.upgrade().and_then(|st| st.key_ring()).map(|ring| Arc::new(ring.host_ring()))
            }))
        };
        let opts = ClientOptions {
            host_keys: Some(keys),
            // The gateway is a shared service: a change made through one server's port must
            // show at once through another's, so it caches only under leases.
            cache_ttl: std::time::Duration::ZERO,
            // Paths arrive with their modes decided by the request, not a process umask.
            umask: 0,
            ..ClientOptions::default()
        };
        let client = Client::from_config(config, opts).map_err(|e| anyhow::anyhow!("HTTP gateway client: {e}"))?;
        Ok(Gateway { settings: st.map.http.clone(), st, client })
    }
}

/// Every route of the HTTP service.
fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/health", axum::routing::get(health))
        .merge(files::routes())
        .merge(metrics::routes())
        .merge(status_page::routes())
        .with_state(gw)
}

/// `GET /health`: 200 and one line while the server serves (for load balancers and scripts).
async fn health(axum::extract::State(gw): axum::extract::State<Arc<Gateway>>) -> String {
    format!("shoald {} serving, map version {}\n", gw.st.id, gw.st.map.version())
}

/// Serve HTTP on `listener` until the task is aborted.
pub(crate) async fn serve(gw: Arc<Gateway>, listener: TcpListener) {
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!("HTTP on {addr}");
    if let Err(e) = axum::serve(listener, router(gw)).await {
        tracing::warn!("HTTP service on {addr} stopped: {e}");
    }
}
