//! Reverse read (docs/import.md): a remote HTTP(S) file copied into Shoal by the servers
//! themselves. The client only plans: it has one server probe the URL (`UrlProbe`: size,
//! byte ranges, entity tag), creates the file, and sends each server of the layout
//! `FetchInto` requests naming the remote byte ranges its objects hold; every server then
//! fetches its ranges (several at once) and writes them into its objects. The bytes never
//! pass through the client, and all servers fetch at the same time.

use crate::client::{unexpected, To};
use crate::error::{Error, Result};
use crate::file::{split_pieces, File};
use crate::{Client, OpenFlags};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use shoal_placement::Piece;
use shoal_proto::hello::FEATURE_FETCH;
use shoal_proto::msg::{FetchPiece, Layout, LayoutSpec, Op, Reply, UrlInfo, MAX_FETCH_PIECES};
use shoal_proto::{Errno, ServerId};
use std::sync::atomic::{AtomicU64, Ordering};

/// Longest remote range one request for it asks for. Object pieces that continue each other
/// in the remote file (a file on one server, or a stripe larger than this) are merged up to
/// it, so a server asks for few large ranges rather than many small ones.
const RANGE_MAX: u64 = 8 << 20;
/// Remote bytes one `FetchInto` asks a server for. Each request must finish within the
/// client's call timeout (30 s by default), so this bounds how slow a remote may be: with
/// the default 4 ranges at once, about 1 MB/s per server.
const REQUEST_BYTES: u64 = 32 << 20;
/// `FetchInto` requests in flight per server, so that a server starts the next ranges while
/// the last of the previous request still arrive.
const REQUESTS_PER_SERVER: usize = 2;

/// How to import.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Layout of the new file; unset fields come from the directory's default.
    pub layout: Option<LayoutSpec>,
    /// Range requests each server runs at once. Default 4.
    pub parallel: u32,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions { layout: None, parallel: 4 }
    }
}

/// What an import did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportReport {
    /// Bytes stored (the file's size).
    pub bytes: u64,
    /// Servers that fetched.
    pub servers: usize,
}

/// The object pieces of a file of `size` bytes, merged where they continue each other in
/// both the object and the remote file, up to `RANGE_MAX` each, grouped by object.
fn plan(layout: &Layout, size: u64) -> Vec<(u32, Vec<FetchPiece>)> {
    let mut by_object: Vec<Vec<FetchPiece>> = vec![Vec::new(); layout.servers.len()];
    for Piece { index, object_offset, file_offset, len } in split_pieces(layout, 0, size, RANGE_MAX) {
        let pieces = &mut by_object[index as usize];
        match pieces.last_mut() {
            Some(last)
                if last.offset + last.len == object_offset
                    && last.file_offset + last.len == file_offset
                    && last.len + len <= RANGE_MAX =>
            {
                last.len += len
            }
            _ => pieces.push(FetchPiece { file_offset, offset: object_offset, len }),
        }
    }
    by_object.into_iter().enumerate().map(|(i, p)| (i as u32, p)).filter(|(_, p)| !p.is_empty()).collect()
}

/// Split one object's pieces into requests of about `REQUEST_BYTES`.
fn requests(pieces: Vec<FetchPiece>) -> Vec<Vec<FetchPiece>> {
    let mut out: Vec<Vec<FetchPiece>> = Vec::new();
    let mut bytes = 0;
    for p in pieces {
        let full = out.last().is_none_or(|r| r.len() >= MAX_FETCH_PIECES || bytes + p.len > REQUEST_BYTES);
        if full {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += p.len;
        out.last_mut().expect("a request was just pushed").push(p);
    }
    out
}

impl Client {
    /// Ask a server what it can learn of `url` (size, byte ranges, entity tag): the server
    /// fetches, not this process, so the answer is what the servers see from their network.
    pub async fn probe_url(&self, url: &str) -> Result<UrlInfo> {
        let server = self.fetching_server().await?;
        match self.call(To::Server(server), Op::UrlProbe { url: url.to_string() }, Bytes::new()).await {
            Ok((Reply::UrlInfo(info), _)) => Ok(info),
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => Err(e.within(format_args!("server {server}"))),
        }
    }

    /// A server to probe through: the first placeable one that knows `UrlProbe`.
    async fn fetching_server(&self) -> Result<ServerId> {
        let servers: Vec<ServerId> = self.map().placeable().map(|s| s.server_id()).collect();
        let mut last = None;
        for s in servers {
            match self.server_has(s, FEATURE_FETCH).await {
                Ok(true) => return Ok(s),
                Ok(false) => {}
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::new(Errno::ENOTSUP, "no server of this cluster can fetch URLs (import)")))
    }

    /// Copy the remote file at `url` into `dest` (created, or truncated if it exists), with
    /// every server of the new file's layout fetching the byte ranges its objects hold,
    /// straight from the remote (docs/import.md). `progress` is told the bytes stored so
    /// far and the total as requests complete. Durable when it returns, like a closed file.
    ///
    /// Fails with `ENOTSUP` when the remote does not serve byte ranges or does not say its
    /// size: such a file can only be read as one stream (`shoal import` then streams it
    /// through the client).
    pub async fn import_url(
        &self,
        url: &str,
        dest: &str,
        opts: &ImportOptions,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<ImportReport> {
        self.import_inner(url, dest, opts, progress).await.map_err(|e| e.within(format_args!("import {url}")))
    }

    async fn import_inner(
        &self,
        url: &str,
        dest: &str,
        opts: &ImportOptions,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<ImportReport> {
        let info = self.probe_url(url).await?;
        let size = match info.size {
            Some(size) if info.ranges => size,
            _ => {
                return Err(Error::new(
                    Errno::ENOTSUP,
                    "its server does not serve byte ranges of known size, so servers cannot fetch it in parallel",
                ))
            }
        };
        // Into a new file beside the destination, renamed over it at the end: the layout is
        // the one asked for (a truncated file would keep its old one), and a failed import
        // leaves an existing destination as it was.
        let dest = crate::pathname::normalize(dest).map_err(|e| Error::new(e, "not a valid path"))?;
        let (dir, name) = match (crate::pathname::parent(&dest), dest.rsplit('/').next()) {
            (Some(dir), Some(name)) if !name.is_empty() => (dir.to_string(), name.to_string()),
            _ => return Err(Error::new(Errno::EISDIR, "the destination is the root directory")),
        };
        let temp = crate::pathname::join(&dir, &format!(".{name}.import-{:016x}", rand::random::<u64>()));
        let flags =
            OpenFlags { write: true, create: true, exclusive: true, layout: opts.layout.clone(), ..Default::default() };
        let file = self.open(&temp, flags).await?;
        let fetched = self.fetch_all(url, &info.etag, size, file, opts, progress).await;
        let done = match fetched {
            Ok(servers) => self.rename(&temp, &dest).await.map(|()| servers),
            Err(e) => Err(e),
        };
        match done {
            Ok(servers) => Ok(ImportReport { bytes: size, servers }),
            Err(e) => {
                if let Err(u) = self.unlink(&temp).await {
                    tracing::warn!("import {url}: cannot remove the partial file {temp}: {u}");
                }
                Err(e)
            }
        }
    }

    /// Have every server of `file`'s layout fetch its pieces of `url`, then publish the size
    /// and close (durable). Returns the number of servers that fetched.
    async fn fetch_all(
        &self,
        url: &str,
        etag: &Option<String>,
        size: u64,
        file: File,
        opts: &ImportOptions,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<usize> {
        let plan = plan(file.layout(), size);
        for (index, _) in &plan {
            let server = file.layout().servers[*index as usize];
            if !self.server_has(server, FEATURE_FETCH).await? {
                return Err(Error::new(
                    Errno::ENOTSUP,
                    format!("server {server} cannot fetch URLs (an older version)"),
                ));
            }
        }
        let servers = plan.len();
        let done = AtomicU64::new(0);
        progress(0, size);
        let (done, file_ref) = (&done, &file);
        futures::future::try_join_all(plan.into_iter().map(|(index, pieces)| async move {
            let server = file_ref.layout().servers[index as usize];
            futures::stream::iter(requests(pieces))
                .map(|pieces| async move {
                    let bytes = fetch(file_ref, server, index, url, pieces, opts.parallel, etag.clone()).await?;
                    progress(done.fetch_add(bytes, Ordering::Relaxed) + bytes, size);
                    Ok::<_, Error>(())
                })
                .buffer_unordered(REQUESTS_PER_SERVER)
                .try_collect::<Vec<()>>()
                .await
        }))
        .await?;
        // The pieces went around the handle: publish the size, then close (durable on every
        // server of the layout, as after writes through the handle).
        file.wrote_to(size, false);
        file.close().await?;
        Ok(servers)
    }
}

/// One `FetchInto`: `server` fetches `pieces` of `url` into object `index`.
async fn fetch(
    file: &File,
    server: ServerId,
    index: u32,
    url: &str,
    pieces: Vec<FetchPiece>,
    parallel: u32,
    etag: Option<String>,
) -> Result<u64> {
    let want: u64 = pieces.iter().map(|p| p.len).sum();
    let (client, ino) = (file.client(), file.ino());
    let call = |cap| {
        let op = Op::FetchInto {
            url: url.to_string(),
            ino,
            index,
            pieces: pieces.clone(),
            parallel,
            etag: etag.clone(),
            cap,
            copies: file.layout().replicas,
        };
        client.call(To::Server(server), op, Bytes::new())
    };
    match file.holder().with(client, call).await {
        Ok((Reply::Fetched { bytes }, _)) if bytes == want => Ok(bytes),
        Ok((Reply::Fetched { bytes }, _)) => {
            Err(Error::new(Errno::EIO, format!("server {server} stored {bytes} of {want} bytes")))
        }
        Ok((other, _)) => Err(unexpected(&other)),
        Err(e) => Err(e.within(format_args!("server {server}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(file_offset: u64, offset: u64, len: u64) -> FetchPiece {
        FetchPiece { file_offset, offset, len }
    }

    #[test]
    fn a_plan_covers_the_file_once_with_ranges_merged_where_they_continue() {
        let one = Layout { stripe_size: 1 << 20, servers: vec![ServerId(2)], replicas: 1 };
        // One object: the file in ranges of RANGE_MAX, and the tail.
        let size = 20 << 20 | 5;
        let plan1 = plan(&one, size);
        assert_eq!(plan1.len(), 1);
        assert_eq!(
            plan1[0].1,
            vec![p(0, 0, 8 << 20), p(8 << 20, 8 << 20, 8 << 20), p(16 << 20, 16 << 20, (4 << 20) | 5)]
        );
        // Four objects: each stripe its own range (not continuing in the remote file).
        let four = Layout {
            stripe_size: 1 << 20,
            servers: vec![ServerId(0), ServerId(1), ServerId(2), ServerId(3)],
            replicas: 1,
        };
        let plan4 = plan(&four, 6 << 20);
        assert_eq!(plan4.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(plan4[0].1, vec![p(0, 0, 1 << 20), p(4 << 20, 1 << 20, 1 << 20)]);
        assert_eq!(plan4[3].1, vec![p(3 << 20, 0, 1 << 20)]);
        let total: u64 = plan4.iter().flat_map(|(_, ps)| ps).map(|p| p.len).sum();
        assert_eq!(total, 6 << 20);
        // An empty file: nothing to fetch.
        assert!(plan(&four, 0).is_empty());
    }

    #[test]
    fn requests_hold_about_request_bytes_each_and_every_piece_once() {
        let pieces: Vec<FetchPiece> = (0..40).map(|i| p(i * (4 << 20), i * (1 << 20), 1 << 20)).collect();
        let reqs = requests(pieces.clone());
        assert_eq!(reqs.len(), 2);
        assert!(reqs.iter().all(|r| r.iter().map(|p| p.len).sum::<u64>() <= REQUEST_BYTES));
        assert_eq!(reqs.concat(), pieces);
        assert!(requests(Vec::new()).is_empty());
    }
}
