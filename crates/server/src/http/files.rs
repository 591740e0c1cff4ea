//! The file system over HTTP under `/fs/` (docs/http.md): GET and HEAD of files (ranges,
//! validators, conditional requests) and directories (listings), PUT of files (streamed)
//! and directories, DELETE.
//!
//! Every request goes through the gateway's native client acting as the request's
//! identity (`identity.rs`): a GET reads several stripe-sized pieces ahead at once, each
//! of which the client splits over the servers holding it, so one HTTP stream pulls from
//! every server of the file in parallel; a PUT hands the body on in pieces as it arrives,
//! so no body is ever held whole.

use super::errors::HttpError;
use super::identity::who;
use super::ranges::{self, Multipart, RangeRequest};
use super::{listing, Gateway};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt, TryStreamExt};
use shoal_client::{Attr, Client, Errno, File, FileKind, OpenFlags};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Where the file system starts in the URL space.
pub(crate) const PREFIX: &str = "/fs";

/// Bounds of the piece a GET reads (or a PUT writes) in one call: one stripe row (the
/// stripe size times the stripe count) so that each call keeps every server of the file
/// busy, but at least 1 MiB (few calls for narrow files) and at most 16 MiB (memory per
/// stream stays bounded: [`READ_DEPTH`] pieces).
const PIECE_MIN: u64 = 1 << 20;
const PIECE_MAX: u64 = 16 << 20;
/// Pieces a GET reads ahead of the one it sends.
const READ_DEPTH: usize = 4;

/// The routes of this module (merged into the service's router).
pub(crate) fn routes() -> axum::Router<Arc<Gateway>> {
    axum::Router::new()
        .route(PREFIX, axum::routing::any(fs))
        .route("/fs/", axum::routing::any(fs))
        .route("/fs/{*path}", axum::routing::any(fs))
}

/// A request's path as a Shoal path, and whether the URL ended in `/`.
pub(crate) struct Target {
    pub path: String,
    pub slash: bool,
}

/// The Shoal path of a URL path under `/fs` (still percent-encoded). Refuses what could
/// name something other than what it spells: `..`, a NUL, an encoded `/` inside a name,
/// bytes that are not UTF-8 once decoded.
pub(crate) fn target(raw: &str) -> Result<Target, HttpError> {
    let rest = raw.strip_prefix(PREFIX).unwrap_or(raw);
    let mut names = Vec::new();
    for seg in rest.split('/') {
        let name = percent_encoding::percent_decode_str(seg)
            .decode_utf8()
            .map_err(|_| HttpError::bad_request(format!("path {raw} is not UTF-8 once decoded")))?;
        match &*name {
            "" | "." => {}
            ".." => return Err(HttpError::bad_request(format!("path {raw} contains `..`"))),
            n if n.contains(['\0', '/']) => {
                return Err(HttpError::bad_request(format!("path {raw} has a NUL or an encoded `/` in a name")))
            }
            n => names.push(n.to_string()),
        }
    }
    Ok(Target { path: format!("/{}", names.join("/")), slash: rest.is_empty() || rest.ends_with('/') })
}

async fn fs(State(gw): State<Arc<Gateway>>, method: Method, uri: Uri, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let t = target(uri.path())?;
        let write = method == Method::PUT || method == Method::DELETE;
        let cred = who(&gw, &headers, write)?;
        let client = gw.client.with_cred(cred);
        match method {
            Method::GET | Method::HEAD => get(&client, &uri, &t, &headers, method == Method::HEAD).await,
            Method::PUT => put(&client, &t, body).await,
            Method::DELETE => delete(&client, &t).await,
            _ => {
                let mut r = HttpError::new(StatusCode::METHOD_NOT_ALLOWED, format!("{method} is not served under /fs"))
                    .into_response();
                r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD, PUT, DELETE"));
                Ok(r)
            }
        }
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

fn piece_of(f: &File) -> u64 {
    let l = f.layout();
    (l.stripe_size * l.servers.len().max(1) as u64).clamp(PIECE_MIN, PIECE_MAX)
}

fn system_time(a: &Attr) -> SystemTime {
    let t = a.mtime;
    if t.secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(t.secs as u64, t.nsecs)
    } else {
        SystemTime::UNIX_EPOCH
    }
}

/// A strong validator: the inode, the size and the modification time to the nanosecond
/// change with every write that a reader could see.
fn etag(a: &Attr) -> String {
    format!("\"{:x}-{:x}-{:x}.{:x}\"", a.ino.0, a.size, a.mtime.secs, a.mtime.nsecs)
}

fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// Whether an `If-None-Match` value matches `tag` (weak comparison, RFC 9110 §13.1.2).
fn none_match(value: &str, tag: &str) -> bool {
    value.split(',').map(str::trim).any(|v| v == "*" || v.trim_start_matches("W/") == tag)
}

/// Whether the representation has not changed since the `If-Modified-Since` date.
fn not_modified_since(value: &str, mtime: SystemTime) -> bool {
    match httpdate::parse_http_date(value) {
        // HTTP dates have whole seconds.
        Ok(since) => {
            mtime.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
                <= since.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
        }
        Err(_) => false,
    }
}

/// Whether `If-Range` lets the `Range` header apply: its entity tag equals the current one
/// (strong comparison), or its date is exactly the current Last-Modified.
fn if_range_holds(value: &str, tag: &str, last_modified: &str) -> bool {
    let v = value.trim();
    if v.starts_with('"') || v.starts_with("W/") {
        v == tag
    } else {
        v == last_modified
    }
}

async fn get(client: &Client, uri: &Uri, t: &Target, headers: &HeaderMap, head: bool) -> Result<Response, HttpError> {
    let f = client.open(&t.path, OpenFlags::read_only()).await?;
    let a = f.attr();
    if a.kind == FileKind::Dir {
        if !t.slash {
            // Relative links in a listing resolve against the directory only with the slash.
            let to = match uri.query() {
                Some(q) => format!("{}/?{q}", uri.path()),
                None => format!("{}/", uri.path()),
            };
            return Ok((StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, hv(&to))], format!("301: see {to}\n"))
                .into_response());
        }
        return listing::respond(client, &t.path, a.ino, uri, headers, head).await;
    }
    let tag = etag(&a);
    let mtime = system_time(&a);
    let last_modified = httpdate::fmt_http_date(mtime);
    let mut h = HeaderMap::new();
    h.insert(header::ETAG, hv(&tag));
    h.insert(header::LAST_MODIFIED, hv(&last_modified));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let text = |n: header::HeaderName| headers.get(n).and_then(|v| v.to_str().ok());
    let unchanged = match text(header::IF_NONE_MATCH) {
        Some(v) => none_match(v, &tag),
        None => text(header::IF_MODIFIED_SINCE).is_some_and(|v| not_modified_since(v, mtime)),
    };
    if unchanged {
        return Ok((StatusCode::NOT_MODIFIED, h).into_response());
    }
    let size = a.size;
    let content_type = "application/octet-stream";
    let wanted = match text(header::RANGE) {
        Some(r) if text(header::IF_RANGE).is_none_or(|v| if_range_holds(v, &tag, &last_modified)) => {
            ranges::parse(r, size)
        }
        _ => RangeRequest::Whole,
    };
    f.set_readahead(false);
    let piece = piece_of(&f);
    let (status, len, body): (StatusCode, u64, Body) = match wanted {
        RangeRequest::Unsatisfiable => {
            h.insert(header::CONTENT_RANGE, hv(&format!("bytes */{size}")));
            let e = HttpError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                format!("no range within the {size} bytes of {}", t.path),
            );
            let mut r = e.into_response();
            r.headers_mut().extend(h);
            return Ok(r);
        }
        RangeRequest::Whole => {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            (StatusCode::OK, size, Body::from_stream(read_stream(f, 0, size, piece)))
        }
        RangeRequest::Ranges(r) if r.len() == 1 => {
            let (s, e) = r[0];
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            h.insert(header::CONTENT_RANGE, hv(&format!("bytes {s}-{}/{size}", e - 1)));
            (StatusCode::PARTIAL_CONTENT, e - s, Body::from_stream(read_stream(f, s, e, piece)))
        }
        RangeRequest::Ranges(r) => {
            let m = Multipart::new(&r, size, content_type);
            h.insert(header::CONTENT_TYPE, hv(&format!("multipart/byteranges; boundary={}", m.boundary)));
            let len = m.body_len(&r);
            let parts = r.into_iter().zip(m.heads).map(move |((s, e), head)| {
                futures::stream::once(async move { Ok(head) }).chain(read_stream(f.clone(), s, e, piece)).boxed()
            });
            let all = futures::stream::iter(parts).flatten().chain(futures::stream::once(async move { Ok(m.tail) }));
            (StatusCode::PARTIAL_CONTENT, len, Body::from_stream(all))
        }
    };
    h.insert(header::CONTENT_LENGTH, hv(&len.to_string()));
    if head {
        return Ok((status, h).into_response());
    }
    Ok((status, h, body).into_response())
}

/// The bytes `start..end` of `f`, read [`READ_DEPTH`] pieces ahead. A file that shrank
/// under the reader ends the stream with an error, so the connection is cut rather than a
/// body shorter than its Content-Length being passed off as whole.
fn read_stream(f: File, start: u64, end: u64, piece: u64) -> impl Stream<Item = std::io::Result<Bytes>> + Send {
    futures::stream::iter((start..end).step_by(piece as usize))
        .map(move |off| {
            let f = f.clone();
            let want = piece.min(end - off) as usize;
            async move {
                let got = f.read_at(off, want).await.map_err(std::io::Error::other)?;
                if got.len() < want {
                    return Err(std::io::Error::other(format!("file shrank while read: {} bytes at {off}", got.len())));
                }
                Ok(got)
            }
        })
        .buffered(READ_DEPTH)
}

async fn put(client: &Client, t: &Target, body: Body) -> Result<Response, HttpError> {
    if t.slash {
        let mut data = body.into_data_stream();
        if let Some(chunk) = data.next().await {
            if !chunk.map_err(|e| HttpError::bad_request(format!("request body: {e}")))?.is_empty() {
                return Err(HttpError::bad_request("a PUT of a directory (URL ending in /) takes no body"));
            }
        }
        client.mkdir(&t.path, 0o755).await?;
        return Ok((StatusCode::CREATED, format!("201 Created: directory {}\n", t.path)).into_response());
    }
    let existed = match client.lstat(&t.path).await {
        Ok(a) if a.kind == FileKind::Dir => {
            return Err(HttpError::new(StatusCode::CONFLICT, format!("{} is a directory", t.path)))
        }
        Ok(_) => true,
        Err(e) if e.errno == Errno::ENOENT => false,
        Err(e) => return Err(e.into()),
    };
    // The file takes its directory's default layout (no layout of its own asked for).
    let f = client.create(&t.path, 0o644, None).await?;
    let piece = piece_of(&f) as usize;
    let written = match copy_body(&f, body, piece).await {
        Ok(n) => n,
        Err(e) => {
            // A body broken off leaves no half file behind where there was none.
            let _ = f.close().await;
            if !existed {
                let _ = client.unlink(&t.path).await;
            }
            return Err(e);
        }
    };
    f.close().await?;
    if existed {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Ok((StatusCode::CREATED, format!("201 Created: {} ({written} bytes)\n", t.path)).into_response())
    }
}

/// Write the request body into `f` in pieces of `piece` bytes as it arrives (the client's
/// write-behind keeps several in flight); the bytes written.
async fn copy_body(f: &File, body: Body, piece: usize) -> Result<u64, HttpError> {
    let mut data = body.into_data_stream().map_err(|e| HttpError::bad_request(format!("request body broken off: {e}")));
    let mut buf = BytesMut::with_capacity(piece);
    let mut off = 0u64;
    while let Some(chunk) = data.next().await {
        let mut chunk = chunk?;
        while !chunk.is_empty() {
            let take = (piece - buf.len()).min(chunk.len());
            buf.extend_from_slice(&chunk.split_to(take));
            if buf.len() == piece {
                let full = buf.split().freeze();
                f.write_bytes_at(off, full).await?;
                off += piece as u64;
                buf.reserve(piece);
            }
        }
    }
    if !buf.is_empty() {
        let n = buf.len() as u64;
        f.write_bytes_at(off, buf.freeze()).await?;
        off += n;
    }
    Ok(off)
}

async fn delete(client: &Client, t: &Target) -> Result<Response, HttpError> {
    if t.path == "/" {
        return Err(HttpError::new(StatusCode::CONFLICT, "the root directory cannot be removed"));
    }
    let a = client.lstat(&t.path).await?;
    if a.kind == FileKind::Dir {
        client.rmdir(&t.path).await?;
    } else {
        client.unlink(&t.path).await?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_paths_become_shoal_paths_or_are_refused() {
        let ok = |raw: &str| target(raw).map(|t| (t.path, t.slash)).map_err(|e| e.status);
        assert_eq!(ok("/fs"), Ok(("/".into(), true)));
        assert_eq!(ok("/fs/"), Ok(("/".into(), true)));
        assert_eq!(ok("/fs/a/b"), Ok(("/a/b".into(), false)));
        assert_eq!(ok("/fs/a//./b/"), Ok(("/a/b".into(), true)));
        assert_eq!(ok("/fs/with%20space/%C3%A9"), Ok(("/with space/é".into(), false)));
        assert_eq!(ok("/fs/a/../b"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(ok("/fs/a/%2e%2e/b"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(ok("/fs/a%00b"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(ok("/fs/a%2Fb"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(ok("/fs/%FF"), Err(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn validators() {
        assert!(none_match("\"a\", \"b\"", "\"b\""));
        assert!(none_match("*", "\"b\""));
        assert!(none_match("W/\"b\"", "\"b\""));
        assert!(!none_match("\"a\"", "\"b\""));
        assert!(if_range_holds("\"b\"", "\"b\"", "x"));
        assert!(!if_range_holds("W/\"b\"", "\"b\"", "x"));
        assert!(if_range_holds("Sun, 06 Nov 1994 08:49:37 GMT", "\"b\"", "Sun, 06 Nov 1994 08:49:37 GMT"));
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(784111777);
        assert!(not_modified_since("Sun, 06 Nov 1994 08:49:37 GMT", t));
        assert!(!not_modified_since("Sun, 06 Nov 1994 08:49:36 GMT", t));
        assert!(!not_modified_since("yesterday", t));
    }
}
