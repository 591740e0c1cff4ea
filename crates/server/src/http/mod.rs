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

/// HTTP connections one server serves at once, apart from the native protocol's
/// (`limits::ConnLimits`): a flood of HTTP clients cannot take the descriptors that native
/// clients and peers need (issue 51: 19,900 slowloris connections took 19,944 of 20,000).
pub(crate) const HTTP_CONNECTIONS: usize = 1024;

/// How long a client has to send a request's headers, counted from when the connection is
/// ready for a request (so it also bounds an idle keep-alive connection): a client that
/// trickles its headers, or says nothing, holds a connection this long at most.
pub(crate) const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serve HTTP/1.1 on `listener` until the task is aborted: at most [`HTTP_CONNECTIONS`]
/// connections (those beyond are closed at once, counted in a rate-limited warning), each
/// with [`HEADER_TIMEOUT`]. hyper's own connection builder rather than `axum::serve`,
/// which sets neither.
pub(crate) async fn serve(gw: Arc<Gateway>, listener: TcpListener) {
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!("HTTP on {addr} (at most {HTTP_CONNECTIONS} connections, {HEADER_TIMEOUT:?} for headers)");
    let app = router(gw);
    let places = Arc::new(tokio::sync::Semaphore::new(HTTP_CONNECTIONS));
    let refusals = crate::net::RateLog::new();
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let Ok(place) = places.clone().try_acquire_owned() else {
                        refusals.warn(|| {
                            format!("HTTP connection from {peer} closed: {HTTP_CONNECTIONS} HTTP connections are open")
                        });
                        continue; // dropping the stream closes it
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app.clone());
                    conns.spawn(async move {
                        let _place = place;
                        let _ = stream.set_nodelay(true);
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(HEADER_TIMEOUT)
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                        // A client that goes away or times out ends its connection only.
                        let _ = conn.await;
                    });
                }
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!("HTTP accept on {addr}: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}
