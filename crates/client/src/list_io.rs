//! List I/O (PVFS): many (file offset, length) pieces of one file read or written in one
//! call, with one request per server (`Op::ReadList`, `Op::WriteList`) instead of one per
//! piece.
//!
//! Reads use **data sieving**: pieces closer than [`SIEVE_GAP`] are read as one covering
//! extent (the hole between them travels too, and is dropped here), so a strided pattern
//! of small pieces costs a few large object reads on the servers instead of thousands of
//! small ones. Each extent is then split at stripe boundaries into object pieces, grouped
//! by the server holding each object, and each server's group goes in as few requests as
//! the frame limits allow (at most [`MAX_LIST_PIECES`] pieces and [`MAX_DATA`] bytes).
//!
//! Writes are not sieved (that would need a read-modify-write of the holes): each piece is
//! split at stripe boundaries and the object pieces are grouped by server the same way.
//! A server stores the pieces of one request in order; the requests to one server go one
//! after another, so of two overlapping pieces the later one in the list wins, as with
//! successive `write_at`s.

use crate::client::{unexpected, To};
use crate::error::{Error, Result};
use crate::file::{read_piece, split_pieces, write_piece, File};
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use shoal_placement::Piece;
use shoal_proto::frame::MAX_DATA;
use shoal_proto::hello::FEATURE_LIST_IO;
use shoal_proto::msg::{ObjectPiece, Op, Reply, MAX_LIST_PIECES};
use shoal_proto::{Errno, ServerId};
use std::collections::BTreeMap;

/// Pieces of a read whose gap is at most this many bytes are read as one extent.
pub const SIEVE_GAP: u64 = 64 << 10;

/// The object pieces bound for each server, grouped into requests within the frame limits.
/// Each object piece keeps a tag (`T`) saying where its bytes go or come from.
fn by_server<T>(layout_servers: &[ServerId], pieces: Vec<(Piece, T)>) -> BTreeMap<ServerId, Vec<Vec<(Piece, T)>>> {
    let mut out: BTreeMap<ServerId, Vec<Vec<(Piece, T)>>> = BTreeMap::new();
    let mut bytes: BTreeMap<ServerId, u64> = BTreeMap::new();
    for (p, tag) in pieces {
        let server = layout_servers[p.index as usize];
        let groups = out.entry(server).or_default();
        let used = bytes.entry(server).or_default();
        let full = groups.last().is_none_or(|g| g.len() >= MAX_LIST_PIECES || *used + p.len > MAX_DATA as u64);
        if full {
            groups.push(Vec::new());
            *used = 0;
        }
        *used += p.len;
        groups.last_mut().expect("a group was just pushed").push((p, tag));
    }
    out
}

/// A server's answer to one list read: the object pieces asked (each tagged with the extent
/// it fills), how many bytes each got, and those bytes back to back.
type Answer = (Vec<(Piece, usize)>, Vec<u32>, Bytes);

/// A server without list I/O (`FEATURE_LIST_IO`): the pieces of `group` read with one
/// `Read` each, as many at a time as the client allows, and put together as a list read's
/// answer.
async fn read_one_by_one(file: &File, group: Vec<(Piece, usize)>) -> Result<Answer> {
    let (client, cap, layout, ino) = (file.client(), file.holder(), file.layout(), file.ino());
    let reads: Vec<_> = group.iter().map(|(p, _)| read_piece(client, cap, layout, ino, *p)).collect();
    let parts: Vec<Bytes> = futures::stream::iter(reads).buffered(client.max_in_flight()).try_collect().await?;
    let lens = parts.iter().map(|b| b.len() as u32).collect();
    let mut data = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    for b in &parts {
        data.extend_from_slice(b);
    }
    Ok((group, lens, data.freeze()))
}

fn wire(p: &Piece) -> ObjectPiece {
    ObjectPiece { index: p.index, offset: p.object_offset, len: p.len as u32 }
}

/// The extents a sieved read covers: `(start, end, pieces)`, `pieces` being the indices of
/// the caller's pieces inside. `pieces`: (offset, len), none empty.
fn sieve(pieces: &[(u64, u64)]) -> Vec<(u64, u64, Vec<usize>)> {
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    order.sort_by_key(|&i| pieces[i].0);
    let mut out: Vec<(u64, u64, Vec<usize>)> = Vec::new();
    for i in order {
        let (off, len) = pieces[i];
        let end = off + len;
        match out.last_mut() {
            // Close enough to the previous extent, and the extent stays within one frame.
            Some((s, e, members)) if off <= e.saturating_add(SIEVE_GAP) && end.max(*e) - *s <= MAX_DATA as u64 => {
                *e = (*e).max(end);
                members.push(i);
            }
            _ => out.push((off, end, vec![i])),
        }
    }
    out
}

impl File {
    /// Read the pieces `(offset, len)` of the file, in one request per server (see the
    /// module documentation). Returns each piece's bytes, in the order asked; a piece past
    /// the end of the file is short (empty from the end on), holes read as zeros.
    pub async fn read_list(&self, pieces: &[(u64, usize)]) -> Result<Vec<Bytes>> {
        self.read_list_inner(pieces).await.map_err(|e| e.within(self.what("list read")))
    }

    async fn read_list_inner(&self, pieces: &[(u64, usize)]) -> Result<Vec<Bytes>> {
        let size = self.ready_for_list(false).await?;
        // Clamped to the size; empty pieces take no part.
        let clamped: Vec<(u64, u64)> =
            pieces.iter().map(|&(off, len)| (off, (len as u64).min(size.saturating_sub(off)))).collect();
        let wanted: Vec<usize> = (0..clamped.len()).filter(|&i| clamped[i].1 > 0).collect();
        let sub: Vec<(u64, u64)> = wanted.iter().map(|&i| clamped[i]).collect();
        let extents = sieve(&sub);
        // Every extent's object pieces, tagged with the extent they fill.
        let mut object_pieces = Vec::new();
        for (x, (start, end, _)) in extents.iter().enumerate() {
            for p in split_pieces(self.layout(), *start, end - start, MAX_DATA as u64) {
                object_pieces.push((p, x));
            }
        }
        let groups = by_server(&self.layout().servers, object_pieces);
        let requests: Vec<(ServerId, Vec<(Piece, usize)>)> =
            groups.into_iter().flat_map(|(s, gs)| gs.into_iter().map(move |g| (s, g))).collect();
        let (client, cap, ino) = (self.client(), self.holder(), self.ino());
        let answers: Vec<Answer> = futures::stream::iter(requests)
            .map(|(server, group)| async move {
                if !client.server_has(server, FEATURE_LIST_IO).await? {
                    return read_one_by_one(self, group).await;
                }
                let list: Vec<ObjectPiece> = group.iter().map(|(p, _)| wire(p)).collect();
                let call = |cap| {
                    let op = Op::ReadList { ino, pieces: list.clone(), cap };
                    client.call(To::Server(server), op, Bytes::new())
                };
                match cap.with(client, call).await {
                    Ok((Reply::DataList { lens }, data)) => {
                        let fits = lens.len() == group.len()
                            && lens.iter().zip(&group).all(|(&n, (p, _))| n as u64 <= p.len)
                            && lens.iter().map(|&n| n as usize).sum::<usize>() == data.len();
                        if !fits {
                            return Err(Error::new(
                                Errno::EPROTO,
                                format!("server {server} answered a list read badly"),
                            ));
                        }
                        Ok((group, lens, data))
                    }
                    Ok((other, _)) => Err(unexpected(&other)),
                    Err(e) => Err(e.within(format_args!("server {server}"))),
                }
            })
            .buffer_unordered(client.max_in_flight())
            .try_collect()
            .await?;
        // Scatter: each answer's pieces into their extents (zeros where short: holes).
        let mut buffers: Vec<BytesMut> = extents.iter().map(|(s, e, _)| BytesMut::zeroed((e - s) as usize)).collect();
        for (group, lens, data) in answers {
            let mut at = 0;
            for ((p, x), n) in group.iter().zip(lens) {
                let n = n as usize;
                let from = (p.file_offset - extents[*x].0) as usize;
                buffers[*x][from..from + n].copy_from_slice(&data[at..at + n]);
                at += n;
            }
        }
        let frozen: Vec<Bytes> = buffers.into_iter().map(BytesMut::freeze).collect();
        let mut out = vec![Bytes::new(); pieces.len()];
        for (x, (start, _, members)) in extents.iter().enumerate() {
            for &m in members {
                let (off, len) = sub[m];
                let from = (off - start) as usize;
                out[wanted[m]] = frozen[x].slice(from..from + len as usize);
            }
        }
        Ok(out)
    }

    /// Write each `(offset, data)` piece, in one request per server (see the module
    /// documentation); when it returns, the data is on the servers (not yet durable: see
    /// [`File::fsync`]) and the handle's size covers every piece.
    pub async fn write_list(&self, pieces: &[(u64, Bytes)]) -> Result<()> {
        self.write_list_inner(pieces).await.map_err(|e| e.within(self.what("list write")))
    }

    async fn write_list_inner(&self, pieces: &[(u64, Bytes)]) -> Result<()> {
        self.ready_for_list(true).await?;
        let mut end = 0u64;
        let mut object_pieces = Vec::new();
        for (off, data) in pieces.iter().filter(|(_, d)| !d.is_empty()) {
            let stop = off
                .checked_add(data.len() as u64)
                .ok_or_else(|| Error::new(Errno::EFBIG, "a piece ends past the largest offset"))?;
            end = end.max(stop);
            for p in split_pieces(self.layout(), *off, data.len() as u64, MAX_DATA as u64) {
                let from = (p.file_offset - off) as usize;
                object_pieces.push((p, data.slice(from..from + p.len as usize)));
            }
        }
        if object_pieces.is_empty() {
            return Ok(());
        }
        let groups = by_server(&self.layout().servers, object_pieces);
        let (client, cap, ino) = (self.client(), self.holder(), self.ino());
        let home = client.home_of(ino);
        let copies = self.layout().replicas;
        let reached_home = groups.contains_key(&home);
        futures::stream::iter(groups)
            .map(|(server, requests)| async move {
                // One request after another: the order of overlapping pieces is kept.
                if !client.server_has(server, FEATURE_LIST_IO).await? {
                    for (p, chunk) in requests.into_iter().flatten() {
                        write_piece(client, cap, ino, server, p, chunk, end, copies).await?;
                    }
                    return Ok(());
                }
                for group in requests {
                    let list: Vec<ObjectPiece> = group.iter().map(|(p, _)| wire(p)).collect();
                    let mut data = BytesMut::with_capacity(group.iter().map(|(p, _)| p.len as usize).sum());
                    for (_, d) in &group {
                        data.extend_from_slice(d);
                    }
                    let (data, total) = (data.freeze(), list.iter().map(|p| p.len).sum::<u32>());
                    let call = |cap| {
                        let op = Op::WriteList {
                            ino,
                            pieces: list.clone(),
                            file_end: end,
                            inode_local: server == home,
                            cap,
                            copies,
                        };
                        client.call(To::Server(server), op, data.clone())
                    };
                    match cap.with(client, call).await {
                        Ok((Reply::Written { len }, _)) if len == total => {}
                        Ok((Reply::Written { len }, _)) => {
                            return Err(Error::new(Errno::EIO, format!("server {server} wrote {len} of {total} bytes")))
                        }
                        Ok((other, _)) => return Err(unexpected(&other)),
                        Err(e) => return Err(e.within(format_args!("server {server}"))),
                    }
                }
                Ok(())
            })
            .buffer_unordered(client.max_in_flight())
            .try_collect::<Vec<()>>()
            .await?;
        self.wrote_to(end, reached_home);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sieving_joins_pieces_across_small_holes_only() {
        let pieces = [(0, 4096), (8192, 4096), (1 << 20, 10), (4096, 4096)];
        let x = sieve(&pieces);
        assert_eq!(x.len(), 2);
        assert_eq!((x[0].0, x[0].1), (0, 12288));
        assert_eq!(x[0].2, vec![0, 3, 1]);
        assert_eq!((x[1].0, x[1].1, x[1].2.clone()), (1 << 20, (1 << 20) + 10, vec![2]));
    }

    #[test]
    fn requests_stay_within_the_frame_limits() {
        let servers = [ServerId(0), ServerId(1)];
        let piece = |index, len| Piece { index, object_offset: 0, file_offset: 0, len };
        let many: Vec<(Piece, ())> = (0..MAX_LIST_PIECES + 5).map(|_| (piece(0, 1), ())).collect();
        let g = by_server(&servers, many);
        assert_eq!(g[&ServerId(0)].iter().map(Vec::len).collect::<Vec<_>>(), vec![MAX_LIST_PIECES, 5]);
        let big: Vec<(Piece, ())> = (0..3).map(|_| (piece(1, (MAX_DATA / 2) as u64), ())).collect();
        let g = by_server(&servers, big);
        assert_eq!(g[&ServerId(1)].iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 1]);
    }
}
