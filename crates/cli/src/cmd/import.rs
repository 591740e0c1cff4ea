//! `shoal import URL shoal://DEST` (reverse read: the servers fetch the remote file's byte
//! ranges in parallel, straight into the objects each holds) and `shoal export shoal://SRC
//! URL` (a streamed HTTP `PUT` of a Shoal file). docs/import.md.

use super::{shoal_path, usage, Ctx};
use crate::fmt::parse_size;
use anyhow::{anyhow, Context, Result};
use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use shoal_client::{Client, Errno, ImportOptions, LayoutSpec, OpenFlags};
use std::time::Instant;

#[derive(Args)]
pub struct ImportArgs {
    /// The remote file: an http:// or https:// URL the servers can reach.
    url: String,
    /// Where it goes: shoal://dir/name (created, or replaced if it exists).
    dest: String,
    /// Stripe size of the new file (e.g. 1M); default: the directory's.
    #[arg(short = 'S', long = "stripe-size", value_parser = parse_size)]
    stripe_size: Option<u64>,
    /// Servers to stripe it over (-1 = all, so that all fetch at once); default: the directory's.
    #[arg(short = 'c', long = "stripe-count", allow_negative_numbers = true)]
    stripe_count: Option<i64>,
    /// Byte-range requests each server runs at once.
    #[arg(short = 'p', long, default_value_t = 4)]
    parallel: u32,
    /// Never show a progress bar.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ExportArgs {
    /// The Shoal file: shoal://dir/name.
    src: String,
    /// Where to PUT it: an http:// or https:// URL (another Shoal's /fs/ path with a token,
    /// a presigned object-store URL, a WebDAV server).
    url: String,
    /// An extra request header, "Name: value" (repeatable), e.g. "Authorization: Bearer T".
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// Never show a progress bar.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

fn bar(total: u64, quiet: bool) -> ProgressBar {
    let bar = if quiet || total < (32 << 20) { ProgressBar::hidden() } else { ProgressBar::new(total) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn stripe_count(c: Option<i64>) -> Result<Option<u32>> {
    match c {
        None => Ok(None),
        Some(-1) => Ok(Some(u32::MAX)),
        Some(c) if c >= 1 && c <= u32::MAX as i64 => Ok(Some(c as u32)),
        Some(c) => Err(usage(format!("stripe count {c} must be -1 (all servers) or at least 1"))),
    }
}

fn report(json: bool, what: &str, from: &str, to: &str, bytes: u64, secs: f64, how: &str) {
    let rate = bytes as f64 / (1 << 20) as f64 / secs.max(1e-9);
    if json {
        let v =
            serde_json::json!({"from": from, "to": to, "bytes": bytes, "seconds": secs, "mib_per_s": rate, "how": how});
        println!("{v}");
    } else {
        println!(
            "{what} {} in {secs:.2} s ({rate:.0} MiB/s, {how})",
            crate::fmt::human_bytes(bytes).trim(),
            what = what
        );
    }
}

pub async fn import(ctx: &Ctx, a: ImportArgs) -> Result<()> {
    let dest = shoal_path(&a.dest).ok_or_else(|| usage(format!("{}: the destination must be shoal://…", a.dest)))?;
    if a.parallel == 0 {
        return Err(usage("--parallel must be at least 1"));
    }
    let layout = match (a.stripe_size, stripe_count(a.stripe_count)?) {
        (None, None) => None,
        (size, count) => Some(LayoutSpec { stripe_size: size, stripe_count: count, ..Default::default() }),
    };
    let client = ctx.client()?;
    let opts = ImportOptions { layout: layout.clone(), parallel: a.parallel };
    let started = Instant::now();
    let bar = std::sync::Mutex::new(None::<ProgressBar>);
    let progress = |done: u64, total: u64| {
        let mut b = bar.lock().unwrap_or_else(|e| e.into_inner());
        b.get_or_insert_with(|| self::bar(total, a.quiet)).set_position(done);
    };
    let r = client.import_url(&a.url, &dest, &opts, &progress).await;
    if let Some(b) = bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
        b.finish_and_clear();
    }
    match r {
        Ok(rep) => {
            let how = format!("{} servers fetching", rep.servers);
            report(a.json, "imported", &a.url, &a.dest, rep.bytes, started.elapsed().as_secs_f64(), &how);
            Ok(())
        }
        Err(e) if e.errno == Errno::ENOTSUP => {
            if !a.quiet && !a.json {
                eprintln!("shoal: note: {e}; streaming it through this client instead");
            }
            let bytes = stream_in(&client, &a.url, &dest, layout, a.quiet).await?;
            report(a.json, "imported", &a.url, &a.dest, bytes, started.elapsed().as_secs_f64(), "one stream");
            Ok(())
        }
        Err(e) => Err(anyhow!(e)),
    }
}

/// A remote file that can only be read as one stream: this process GETs it and writes it
/// through the native client (write-behind keeps the servers busy while the next bytes
/// arrive).
async fn stream_in(client: &Client, url: &str, dest: &str, layout: Option<LayoutSpec>, quiet: bool) -> Result<u64> {
    let resp = reqwest::get(url).await.with_context(|| format!("cannot fetch {url}"))?;
    if !resp.status().is_success() {
        return Err(anyhow!("cannot fetch {url}: the server answered {}", resp.status()));
    }
    let bar = bar(resp.content_length().unwrap_or(0), quiet);
    let flags = OpenFlags { write: true, create: true, truncate: true, layout, ..Default::default() };
    let file = client.open(dest, flags).await?;
    let mut body = resp.bytes_stream();
    let mut at = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.with_context(|| format!("reading {url}"))?;
        file.write_at(at, &chunk).await?;
        at += chunk.len() as u64;
        bar.set_position(at);
    }
    file.close().await?;
    bar.finish_and_clear();
    Ok(at)
}

pub async fn export(ctx: &Ctx, a: ExportArgs) -> Result<()> {
    let src = shoal_path(&a.src).ok_or_else(|| usage(format!("{}: the source must be shoal://…", a.src)))?;
    let mut headers = reqwest::header::HeaderMap::new();
    for h in &a.headers {
        let (name, value) = h.split_once(':').ok_or_else(|| usage(format!("header {h:?} must be \"Name: value\"")))?;
        let name = reqwest::header::HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| usage(format!("{:?} is not a header name", name.trim())))?;
        let value = reqwest::header::HeaderValue::from_str(value.trim())
            .map_err(|_| usage(format!("the value of header {name} is not valid")))?;
        headers.append(name, value);
    }
    let client = ctx.client()?;
    let file = client.open(&src, OpenFlags::read_only()).await?;
    let size = file.attr().size;
    let bar = bar(size, a.quiet);
    let started = Instant::now();
    // Reads of 16 MiB: several stripes, so every server of the file sends at once while the
    // previous piece is on the wire.
    const PIECE: u64 = 16 << 20;
    let (file_ref, bar_ref) = (std::sync::Arc::new(file), bar.clone());
    let body = futures::stream::iter((0..size.div_ceil(PIECE)).map(move |i| {
        let file = file_ref.clone();
        async move { file.read_at(i * PIECE, PIECE.min(size - i * PIECE) as usize).await }
    }))
    .buffered(2)
    .inspect(move |r| {
        if let Ok(b) = r {
            bar_ref.inc(b.len() as u64);
        }
    });
    let resp = reqwest::Client::new()
        .put(&a.url)
        .headers(headers)
        .header(reqwest::header::CONTENT_LENGTH, size)
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .with_context(|| format!("cannot PUT to {}", a.url))?;
    bar.finish_and_clear();
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        return Err(anyhow!("{}: the server answered {status}: {}", a.url, text.trim()));
    }
    report(a.json, "exported", &a.src, &a.url, size, started.elapsed().as_secs_f64(), "one stream");
    Ok(())
}
