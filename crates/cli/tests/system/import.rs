//! Reverse read (`shoal import`) on real servers from an HTTP server this test starts on
//! 127.0.0.1: the servers fetch byte ranges in parallel into their objects; a remote without
//! ranges is streamed through the client; a remote file that changes during the import, a
//! missing one, an unreachable one and a URL outside `[http] import_from` fail with one line.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use shoal_client::OpenFlags;
use shoal_testkit::{pattern, Cluster};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The remote: one file with an entity tag, served with or without byte ranges.
struct Remote {
    body: Mutex<(Vec<u8>, String)>,
    ranges: bool,
    /// Replace the file (new bytes, new tag) once the first range has been served.
    change_after_first_range: AtomicBool,
    range_requests: AtomicU64,
}

async fn serve_file(State(r): State<Arc<Remote>>, headers: HeaderMap) -> Response {
    let (body, tag) = r.body.lock().unwrap().clone();
    let range = headers.get("range").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("bytes="));
    let Some(range) = range.filter(|_| r.ranges) else {
        return (StatusCode::OK, [("etag", tag)], body).into_response();
    };
    if headers.get("if-match").is_some_and(|m| m.to_str().ok() != Some(tag.as_str())) {
        return StatusCode::PRECONDITION_FAILED.into_response();
    }
    let (a, b) = range.split_once('-').unwrap();
    let a: usize = a.parse().unwrap();
    if a >= body.len() {
        return (StatusCode::RANGE_NOT_SATISFIABLE, [("content-range", format!("bytes */{}", body.len()))])
            .into_response();
    }
    let b: usize = b.parse::<usize>().unwrap().min(body.len() - 1);
    r.range_requests.fetch_add(1, Ordering::Relaxed);
    if r.change_after_first_range.swap(false, Ordering::Relaxed) {
        *r.body.lock().unwrap() = (pattern(99, 0, body.len()), "\"v2\"".into());
    }
    let cr = format!("bytes {a}-{b}/{}", body.len());
    (StatusCode::PARTIAL_CONTENT, [("content-range", cr), ("etag", tag)], body[a..=b].to_vec()).into_response()
}

/// Start the remote on a loopback port (its own thread and runtime); returns its base URL.
fn start_remote(r: Arc<Remote>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let app = axum::Router::new().route("/file", axum::routing::get(serve_file)).with_state(r);
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    url
}

fn remote(size: usize, ranges: bool) -> Arc<Remote> {
    Arc::new(Remote {
        body: Mutex::new((pattern(5, 0, size), "\"v1\"".into())),
        ranges,
        change_after_first_range: AtomicBool::new(false),
        range_requests: AtomicU64::new(0),
    })
}

fn read_all(cluster: &Cluster, path: &str) -> Vec<u8> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = cluster.client();
        let f = fs.open(path, OpenFlags::read_only()).await.unwrap();
        let size = f.attr().size as usize;
        f.read_at(0, size).await.unwrap().to_vec()
    })
}

#[test]
fn servers_fetch_ranges_in_parallel_into_a_striped_file() {
    let cluster = Cluster::start(4);
    let size = (40 << 20) + 123;
    let r = remote(size, true);
    let url = format!("{}/file", start_remote(r.clone()));
    let (code, out, err) = cluster.shoal(&["import", &url, "shoal://big", "-c", "-1", "-S", "1M", "--json", "-q"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["bytes"], size as u64);
    assert_eq!(v["how"], "4 servers fetching", "{v}");
    // 1 MiB stripes over 4 servers: one range per stripe, and the probe's.
    assert_eq!(r.range_requests.load(Ordering::Relaxed), 41 + 1);
    assert!(read_all(&cluster, "/big") == pattern(5, 0, size), "the imported bytes differ");

    // Again over the same name: replaced by a new file with the directory's layout (one
    // server), which fetches in ranges of 8 MiB; no temporary file is left beside it.
    r.range_requests.store(0, Ordering::Relaxed);
    let (code, out, err) = cluster.shoal(&["import", &url, "shoal://big", "--json", "-q"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"1 servers fetching\""), "{out}");
    assert_eq!(r.range_requests.load(Ordering::Relaxed), 6 + 1);
    assert!(read_all(&cluster, "/big") == pattern(5, 0, size));
    let (code, out, _) = cluster.shoal(&["ls", "-a", "shoal://"]);
    assert_eq!(code, 0);
    assert_eq!(out.split_whitespace().filter(|n| n.contains("import")).count(), 0, "{out}");
}

#[test]
fn empty_unranged_changed_missing_and_unreachable_remotes() {
    let cluster = Cluster::start(2);
    // Empty: a file of size 0.
    let url = format!("{}/file", start_remote(remote(0, true)));
    let (code, _, err) = cluster.shoal(&["import", &url, "shoal://empty", "-q"]);
    assert_eq!(code, 0, "{err}");
    assert!(read_all(&cluster, "/empty").is_empty());

    // No byte ranges: streamed through the client, with a note.
    let size = 3 << 20;
    let url = format!("{}/file", start_remote(remote(size, false)));
    let (code, out, err) = cluster.shoal(&["import", &url, "shoal://plain"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("does not serve byte ranges") && err.contains("streaming it through this client"), "{err}");
    assert!(out.contains("one stream"), "{out}");
    assert!(read_all(&cluster, "/plain") == pattern(5, 0, size));

    // Changed during the import: the ranges after the first are refused (If-Match), and the
    // import fails instead of mixing two versions.
    let r = remote(8 << 20, true);
    r.change_after_first_range.store(true, Ordering::Relaxed);
    let url = format!("{}/file", start_remote(r));
    let (code, _, err) = cluster.shoal(&["import", &url, "shoal://changed", "-c", "-1", "-q"]);
    assert_eq!(code, 1);
    assert!(err.contains("changed during the import"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // Nothing left of it: neither the destination nor the partial file.
    let (_, out, _) = cluster.shoal(&["ls", "-a", "shoal://"]);
    assert!(!out.contains("changed"), "{out}");

    // Missing: 404, named.
    let url = format!("{}/nothing", start_remote(remote(10, true)));
    let (code, _, err) = cluster.shoal(&["import", &url, "shoal://missing", "-q"]);
    assert_eq!(code, 1);
    assert!(err.contains("404"), "{err}");

    // Unreachable: a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (code, _, err) = cluster.shoal(&["import", &format!("http://127.0.0.1:{port}/x"), "shoal://x", "-q"]);
    assert_eq!(code, 1);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");

    // Not a URL the servers fetch; a destination that is not in Shoal.
    let (code, _, err) = cluster.shoal(&["import", "file:///etc/passwd", "shoal://p", "-q"]);
    assert_eq!(code, 1);
    assert!(err.contains("only http and https URLs"), "{err}");
    let (code, _, err) = cluster.shoal(&["import", "http://127.0.0.1:1/x", "/tmp/x"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn import_from_limits_what_servers_fetch() {
    let cluster = Cluster::start_with(1, |m| m.http.import_from = vec!["http://127.0.0.1:1/allowed/".into()]);
    let url = format!("{}/file", start_remote(remote(10, true)));
    let (code, _, err) = cluster.shoal(&["import", &url, "shoal://f", "-q"]);
    assert_eq!(code, 1);
    assert!(err.contains("not below any [http] import_from prefix"), "{err}");
}
