//! Reverse read (`shoal import`, docs/import.md): the server itself fetches byte ranges of a
//! remote HTTP(S) file and writes them straight into the objects it holds, so that an
//! import moves every byte once, from the remote server to the server that keeps it, with
//! all servers of the file fetching at the same time.
//!
//! The client plans the import (`shoal_client::import`): it asks one server to probe the
//! URL (`UrlProbe`), creates the file, and sends each server of the layout `FetchInto`
//! requests naming the pieces of the remote file its objects hold. Nothing here changes the
//! file's size; the client sets it once every piece is stored.

use crate::error::{fail, Fail, R};
use crate::state::State;
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use shoal_proto::msg::{FetchPiece, Reply, UrlInfo, MAX_FETCH_PIECES};
use shoal_proto::{Errno, Ino};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Bytes gathered from the remote before each write to the object: large enough that a
/// write costs one hand-off to the blocking pool per MiB, small enough to bound memory at
/// `parallel` × this per request.
const WRITE_CHUNK: usize = 1 << 20;
/// Longest wait for the remote to connect, and for its next bytes once connected.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Most range requests one `FetchInto` runs at once.
const MAX_PARALLEL: u32 = 32;

/// One HTTP client per process: its connection pool is shared by every import, so the
/// range requests of one import reuse their connections to the remote.
fn http() -> R<&'static reqwest::Client> {
    static CLIENT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .read_timeout(READ_TIMEOUT)
                .user_agent(concat!("shoald/", env!("CARGO_PKG_VERSION"), " (shoal import)"))
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Fail::new(Errno::EIO, format!("cannot make an HTTP client: {e}")))
}

/// Whether this cluster lets its servers fetch `url`: an `http` or `https` URL that starts
/// with one of `[http] import_from` (any, when that list is empty).
fn check_url(st: &State, url: &str) -> R<reqwest::Url> {
    let parsed =
        reqwest::Url::parse(url).map_err(|e| Fail::new(Errno::EINVAL, format!("{url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return fail(Errno::EINVAL, format!("{url}: only http and https URLs can be imported"));
    }
    let allowed = &st.map.http.import_from;
    if !allowed.is_empty() && !allowed.iter().any(|prefix| url.starts_with(prefix.as_str())) {
        return fail(Errno::EACCES, format!("{url}: not below any [http] import_from prefix of this cluster"));
    }
    Ok(parsed)
}

/// What a failed exchange with the remote means for the caller.
fn remote_error(url: &reqwest::Url, e: reqwest::Error) -> Fail {
    // EIO, not ETIMEDOUT or ENOTCONN: those would say that *this* server cannot be reached,
    // and clients treat them so (retries, a server marked silent).
    let errno = Errno::EIO;
    // reqwest's Display of a connect error is "error sending request"; its sources say why.
    let mut why = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        why = format!("{why}: {s}");
        src = s.source();
    }
    Fail::new(errno, format!("{url}: {why}"))
}

/// An HTTP status the remote answered instead of the bytes asked for.
fn status_error(url: &reqwest::Url, status: reqwest::StatusCode) -> Fail {
    let errno = match status.as_u16() {
        404 | 410 => Errno::ENOENT,
        401 | 403 => Errno::EACCES,
        _ => Errno::EIO,
    };
    // (Not ESTALE, which clients take for a stale cluster map.)
    let what = if status.as_u16() == 412 { " (the remote file changed during the import)" } else { "" };
    Fail::new(errno, format!("{url}: the server answered {status}{what}"))
}

/// `UrlProbe`: one request for the first byte tells the size (from `Content-Range`) and
/// whether the remote serves ranges (it answers 206); a 200 answers neither but may carry
/// the size in `Content-Length`.
pub async fn probe(st: &Arc<State>, url: &str) -> R<Reply> {
    let url = check_url(st, url)?;
    let resp = http()?.get(url.clone()).header("Range", "bytes=0-0").send().await.map_err(|e| remote_error(&url, e))?;
    let status = resp.status();
    let headers = resp.headers();
    let etag = headers
        .get(reqwest::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .filter(|t| t.starts_with('"')) // a weak tag (W/"…") cannot guard ranges
        .map(str::to_string);
    let info = match status.as_u16() {
        206 => {
            let total = headers
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit_once('/'))
                .and_then(|(_, total)| total.trim().parse::<u64>().ok());
            UrlInfo { size: total, ranges: total.is_some(), etag }
        }
        // An empty file has no first byte: "bytes */0".
        416 => {
            let empty = headers.get(reqwest::header::CONTENT_RANGE).and_then(|v| v.to_str().ok()) == Some("bytes */0");
            if !empty {
                return Err(status_error(&url, status));
            }
            UrlInfo { size: Some(0), ranges: true, etag }
        }
        200 => UrlInfo { size: resp.content_length(), ranges: false, etag },
        _ => return Err(status_error(&url, status)),
    };
    Ok(Reply::UrlInfo(info))
}

/// `FetchInto`: fetch every piece (at most `parallel` at once) into object `index` of `ino`.
#[allow(clippy::too_many_arguments)]
pub async fn fetch_into(
    st: &Arc<State>,
    url: &str,
    ino: Ino,
    index: u32,
    pieces: Vec<FetchPiece>,
    parallel: u32,
    etag: Option<String>,
    copies: u8,
) -> R<Reply> {
    let url = check_url(st, url)?;
    if pieces.len() > MAX_FETCH_PIECES {
        return fail(Errno::EINVAL, format!("{} pieces in one fetch; at most {MAX_FETCH_PIECES}", pieces.len()));
    }
    if let Some(p) = pieces.iter().find(|p| p.len == 0 || p.file_offset.checked_add(p.len).is_none()) {
        return fail(Errno::EINVAL, format!("a fetch piece of {} bytes at {} is not a range", p.len, p.file_offset));
    }
    let parallel = parallel.clamp(1, MAX_PARALLEL) as usize;
    let total: u64 = futures::stream::iter(pieces)
        .map(|p| fetch_piece(st, &url, etag.as_deref(), ino, index, p, copies))
        .buffer_unordered(parallel)
        .try_fold(0u64, |sum, n| async move { Ok(sum + n) })
        .await?;
    Ok(Reply::Fetched { bytes: total })
}

/// Fetch one piece with a range request and write it into the object as it arrives.
async fn fetch_piece(
    st: &Arc<State>,
    url: &reqwest::Url,
    etag: Option<&str>,
    ino: Ino,
    index: u32,
    p: FetchPiece,
    copies: u8,
) -> R<u64> {
    let last = p.file_offset + p.len - 1;
    let mut req = http()?.get(url.clone()).header("Range", format!("bytes={}-{last}", p.file_offset));
    if let Some(tag) = etag {
        req = req.header("If-Match", tag);
    }
    let resp = req.send().await.map_err(|e| remote_error(url, e))?;
    let status = resp.status();
    if status.as_u16() != 206 {
        // A 200 is the whole file: the remote ignored the range, and its bytes from 0 are not
        // this piece's.
        return Err(status_error(url, status));
    }
    let expect = format!("bytes {}-{last}/", p.file_offset);
    let got = resp.headers().get(reqwest::header::CONTENT_RANGE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !got.starts_with(&expect) {
        return fail(Errno::EIO, format!("{url}: asked for bytes {}-{last}, the server sent {got:?}", p.file_offset));
    }
    let mut body = resp.bytes_stream();
    let mut buf = BytesMut::with_capacity(WRITE_CHUNK.min(p.len as usize));
    let mut stored = 0u64;
    loop {
        let next = body.next().await.transpose().map_err(|e| remote_error(url, e))?;
        let done = next.is_none();
        if let Some(bytes) = next {
            if stored + (buf.len() + bytes.len()) as u64 > p.len {
                return fail(Errno::EIO, format!("{url}: the server sent more than the {} bytes asked", p.len));
            }
            buf.extend_from_slice(&bytes);
        }
        if buf.len() >= WRITE_CHUNK || (done && !buf.is_empty()) {
            let chunk: Bytes = buf.split().freeze();
            let at = p.offset + stored;
            stored += chunk.len() as u64;
            st.blocking(move |st| st.data.write_with_crcs(ino, index, at, &chunk, None, copies)).await?;
        }
        if done {
            break;
        }
    }
    if stored != p.len {
        return fail(Errno::EIO, format!("{url}: the server sent {stored} of the {} bytes asked", p.len));
    }
    Ok(stored)
}
