//! Directory listings (docs/http.md, "Listings"): an HTML page of links for browsers, JSON
//! for programs (`Accept: application/json` or `?format=json`). Entries are sorted by
//! name (the servers list them in hash order), with size, kind and modification time.

use super::errors::HttpError;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use shoal_client::{Client, FileKind, Ino};
use std::fmt::Write;

/// Characters escaped in a link's path segment (RFC 3986 pchar, minus what HTML needs).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'&')
    .add(b'\'');

#[derive(serde::Serialize)]
struct Entry {
    name: String,
    kind: &'static str,
    size: u64,
    /// Unix seconds.
    mtime: i64,
    mode: String,
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
    }
}

fn wants_json(uri: &Uri, headers: &HeaderMap) -> bool {
    let by_query = uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "format=json"));
    let by_accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json") && !v.contains("text/html"));
    by_query || by_accept
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The listing of directory `path` (inode `ino`).
pub(crate) async fn respond(
    client: &Client,
    path: &str,
    ino: Ino,
    uri: &Uri,
    headers: &HeaderMap,
    head: bool,
) -> Result<Response, HttpError> {
    let mut names: Vec<String> = client.readdir(path).await?.into_iter().map(|e| e.name).collect();
    names.sort();
    // One batch of lookups for the sizes and times rather than a request per entry.
    let attrs = client.lookup_many(ino, &names).await?;
    let entries: Vec<Entry> = names
        .into_iter()
        .zip(attrs)
        // An entry removed between the listing and the lookup is left out.
        .filter_map(|(name, a)| {
            let a = a.ok()?;
            Some(Entry {
                name,
                kind: kind_name(a.kind),
                size: a.size,
                mtime: a.mtime.secs,
                mode: format!("{:o}", a.perm),
            })
        })
        .collect();
    let (ctype, body) = if wants_json(uri, headers) {
        let v = serde_json::json!({ "path": path, "entries": entries });
        ("application/json", format!("{v}\n"))
    } else {
        ("text/html; charset=utf-8", html(path, &entries))
    };
    let h = [(header::CONTENT_TYPE, HeaderValue::from_static(ctype))];
    if head {
        let len = [(header::CONTENT_LENGTH, HeaderValue::from(body.len()))];
        return Ok((StatusCode::OK, h, len).into_response());
    }
    Ok((StatusCode::OK, h, body).into_response())
}

fn html(path: &str, entries: &[Entry]) -> String {
    let title = html_escape(path);
    let mut s = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Shoal {title}</title>\
<style>body{{font-family:sans-serif}}td{{padding:0 1em}}td.n{{text-align:right}}</style></head>\n\
<body><h1>Index of {title}</h1>\n<table>\n<tr><th>Name</th><th>Size</th><th>Modified (UTC)</th><th>Mode</th></tr>\n"
    );
    if path != "/" {
        s.push_str("<tr><td><a href=\"../\">../</a></td><td></td><td></td><td></td></tr>\n");
    }
    for e in entries {
        let slash = if e.kind == "dir" { "/" } else { "" };
        let href = format!("{}{slash}", utf8_percent_encode(&e.name, SEGMENT));
        let when = if e.mtime >= 0 {
            httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(e.mtime as u64))
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "<tr><td><a href=\"{}\">{}{slash}</a></td><td class=\"n\">{}</td><td>{when}</td><td>{}</td></tr>",
            html_escape(&href),
            html_escape(&e.name),
            if e.kind == "dir" { String::new() } else { e.size.to_string() },
            e.mode
        );
    }
    s.push_str("</table></body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_in_text_and_links() {
        let e = Entry { name: "a <b>&\"c\" d#?".into(), kind: "file", size: 3, mtime: 0, mode: "644".into() };
        let page = html("/x", &[e]);
        assert!(page.contains("href=\"a%20%3Cb%3E%26%22c%22%20d%23%3F\""), "{page}");
        assert!(page.contains(">a &lt;b&gt;&amp;&quot;c&quot; d#?</a>"), "{page}");
        assert!(page.contains("href=\"../\""));
    }
}
