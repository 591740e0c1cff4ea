//! Stage-in and stage-out of a formation: every rank copies its share of a tree between the
//! global file system and the formation's Shoal, in parallel.
//!
//! Every rank walks the same source (nobody changes it while the job stages) and deals the
//! work with the same deterministic rule ([`deal`]), so the ranks agree on who copies what
//! without talking. Rank 0 first makes the directories, symlinks and the files that several
//! ranks write a range of; after a barrier, each rank copies its pieces; after another, each
//! checks the sizes of the files whose first piece it copied.

use super::formation::Shared;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use shoal_client::{Client, Errno, FileKind, OpenFlags};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes per read/write call: several stripes, so every server works at once.
const CHUNK: usize = 16 << 20;

/// One thing in the tree, by its path relative to the tree's root ("" is the root).
#[derive(Clone, Debug)]
pub struct Entry {
    pub rel: String,
    pub kind: FileKind,
    pub size: u64,
    pub perm: u32,
    /// Symlink target.
    pub target: String,
}

/// A range of one file that one rank copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub entry: usize,
    pub offset: u64,
    pub len: u64,
}

/// Which direction.
pub enum Way {
    /// Local (global file system) → Shoal.
    In { src: PathBuf, dst: String },
    /// Shoal → local.
    Out { src: String, dst: PathBuf },
}

fn join_shoal(root: &str, rel: &str) -> String {
    match (root.trim_end_matches('/'), rel) {
        ("", "") => "/".into(),
        (r, "") => r.into(),
        (r, rel) => format!("{r}/{rel}"),
    }
}

fn join_local(root: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// The local tree under `root` (a file alone is a tree of one), directories before their
/// contents, names in order.
pub fn walk_local(root: &Path) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        let p = join_local(root, &rel);
        let m = std::fs::symlink_metadata(&p).with_context(|| format!("cannot access {}", p.display()))?;
        let perm = m.mode() & 0o7777;
        if m.file_type().is_symlink() {
            let target = std::fs::read_link(&p).with_context(|| format!("cannot read link {}", p.display()))?;
            out.push(Entry { rel, kind: FileKind::Symlink, size: 0, perm, target: target.to_string_lossy().into() });
        } else if m.is_dir() {
            let mut names = Vec::new();
            for e in std::fs::read_dir(&p).with_context(|| format!("cannot list {}", p.display()))? {
                names.push(
                    e.with_context(|| format!("cannot list {}", p.display()))?
                        .file_name()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
            names.sort_unstable_by(|a, b| b.cmp(a));
            todo.extend(names.into_iter().map(|n| if rel.is_empty() { n } else { format!("{rel}/{n}") }));
            out.push(Entry { rel, kind: FileKind::Dir, size: 0, perm, target: String::new() });
        } else if m.is_file() {
            out.push(Entry { rel, kind: FileKind::File, size: m.len(), perm, target: String::new() });
        } else {
            bail!("{} is neither a file, a directory nor a symlink", p.display());
        }
    }
    Ok(out)
}

/// The Shoal tree under `root`, in the same order as [`walk_local`].
pub async fn walk_shoal(client: &Client, root: &str) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        let p = join_shoal(root, &rel);
        let a = client.lstat(&p).await.with_context(|| format!("cannot access shoal:/{p}"))?;
        let mut e = Entry { rel: rel.clone(), kind: a.kind, size: a.size, perm: a.perm, target: String::new() };
        match a.kind {
            FileKind::Dir => {
                let mut names: Vec<String> = client
                    .readdir(&p)
                    .await
                    .with_context(|| format!("cannot list shoal:/{p}"))?
                    .into_iter()
                    .map(|d| d.name)
                    .collect();
                names.sort_unstable_by(|a, b| b.cmp(a));
                todo.extend(names.into_iter().map(|n| if rel.is_empty() { n } else { format!("{rel}/{n}") }));
                e.size = 0;
            }
            FileKind::Symlink => e.target = client.readlink(&p).await?,
            _ => {}
        }
        out.push(e);
    }
    Ok(out)
}

/// Deal the files' bytes over `ranks`: a file larger than `split` is cut into pieces of
/// `split` bytes, and the pieces (whole files and cuts, largest first) go one by one to the
/// rank with the fewest bytes so far (ties: lowest rank). Deterministic: every rank computes
/// the same answer from the same list. Empty files are pieces of length 0 (someone creates
/// them).
pub fn deal(entries: &[Entry], ranks: u32, split: u64) -> Vec<Vec<Piece>> {
    let split = split.max(1);
    let mut pieces = Vec::new();
    for (i, e) in entries.iter().enumerate().filter(|(_, e)| e.kind == FileKind::File) {
        if e.size <= split {
            pieces.push(Piece { entry: i, offset: 0, len: e.size });
        } else {
            let mut off = 0;
            while off < e.size {
                let len = split.min(e.size - off);
                pieces.push(Piece { entry: i, offset: off, len });
                off += len;
            }
        }
    }
    pieces.sort_by(|a, b| b.len.cmp(&a.len).then(a.entry.cmp(&b.entry)).then(a.offset.cmp(&b.offset)));
    let mut load = vec![(0u64, 0usize); ranks as usize];
    let mut out = vec![Vec::new(); ranks as usize];
    for p in pieces {
        let r = (0..ranks as usize).min_by_key(|&r| (load[r], r)).expect("at least one rank");
        load[r].0 += p.len;
        load[r].1 += 1;
        out[r].push(p);
    }
    out
}

/// Files cut into several pieces: rank 0 makes them before anyone writes a range.
fn is_split(e: &Entry, split: u64) -> bool {
    e.kind == FileKind::File && e.size > split.max(1)
}

/// What one rank staged.
pub struct Summary {
    pub files: usize,
    pub dirs: usize,
    pub bytes: u64,
    pub secs: f64,
}

/// Run this rank's part of a stage (in or out) from start to the size check, with the
/// barriers between the steps. `label` names the phases ("stage-in", "stage-out").
pub async fn stage(client: &Client, shared: &Shared, way: &Way, split: u64, label: &str) -> Result<Summary> {
    let start = Instant::now();
    let entries = match way {
        Way::In { src, .. } => {
            let s = src.clone();
            tokio::task::spawn_blocking(move || walk_local(&s)).await??
        }
        Way::Out { src, .. } => walk_shoal(client, src).await?,
    };
    let total: u64 = entries.iter().map(|e| e.size).sum();
    let shares = deal(&entries, shared.size, split);
    let mine = &shares[shared.rank as usize];
    if shared.rank == 0 {
        prepare(client, way, &entries, split).await?;
    }
    blocking_barrier(shared, &format!("{label}-prepared")).await?;

    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reporter = tokio::spawn(report_progress(
        shared.progress_dir(),
        shared.rank,
        shared.size,
        total,
        done.clone(),
        stop.clone(),
        label.to_string(),
    ));
    let result = async {
        for p in mine {
            let e = &entries[p.entry];
            copy_piece(client, way, e, *p, is_split(e, split), &done)
                .await
                .with_context(|| format!("cannot {label} {}", show(way, e)))?;
        }
        Ok::<(), anyhow::Error>(())
    }
    .await;
    // Publish the last count before the barrier, so rank 0's bar ends at the total.
    stop.store(true, Ordering::Relaxed);
    let _ = reporter.await;
    result?;
    blocking_barrier(shared, &format!("{label}-copied")).await?;
    // Sizes, by the rank that copied each file's first piece.
    for p in mine.iter().filter(|p| p.offset == 0) {
        let e = &entries[p.entry];
        let got = match way {
            Way::In { dst, .. } => {
                client.stat(&join_shoal(dst, &e.rel)).await.map(|a| a.size).map_err(anyhow::Error::from)
            }
            Way::Out { dst, .. } => {
                std::fs::metadata(join_local(dst, &e.rel)).map(|m| m.len()).map_err(anyhow::Error::from)
            }
        }
        .with_context(|| format!("cannot check {}", show(way, e)))?;
        if got != e.size {
            bail!("{label} of {}: {} bytes arrived, the source has {}", show(way, e), got, e.size);
        }
    }
    let files = entries.iter().filter(|e| e.kind == FileKind::File).count();
    let dirs = entries.iter().filter(|e| e.kind == FileKind::Dir).count();
    Ok(Summary { files, dirs, bytes: total, secs: start.elapsed().as_secs_f64() })
}

async fn blocking_barrier(shared: &Shared, phase: &str) -> Result<()> {
    // The barrier polls the file system: off the async workers.
    tokio::task::block_in_place(|| shared.barrier(phase))
}

fn show(way: &Way, e: &Entry) -> String {
    match way {
        Way::In { src, .. } => join_local(src, &e.rel).display().to_string(),
        Way::Out { src, .. } => format!("shoal:/{}", join_shoal(src, &e.rel)),
    }
}

/// Rank 0, before anyone copies: directories (in order, parents first), symlinks, and the
/// files several ranks write into (a local one at its full size, so ranges can land in
/// any order).
async fn prepare(client: &Client, way: &Way, entries: &[Entry], split: u64) -> Result<()> {
    for e in entries {
        match (way, e.kind) {
            (Way::In { dst, .. }, FileKind::Dir) => {
                let p = join_shoal(dst, &e.rel);
                match client.mkdir_all(&p, e.perm).await {
                    Ok(_) => {}
                    Err(err) if err.errno == Errno::EEXIST => {}
                    Err(err) => {
                        return Err(anyhow::Error::from(err).context(format!("cannot create directory shoal:/{p}")))
                    }
                }
            }
            (Way::In { dst, .. }, FileKind::Symlink) => {
                let p = join_shoal(dst, &e.rel);
                client.symlink(&e.target, &p).await.with_context(|| format!("cannot create symlink shoal:/{p}"))?;
            }
            (Way::In { dst, .. }, FileKind::File) if is_split(e, split) => {
                let p = join_shoal(dst, &e.rel);
                client
                    .create(&p, e.perm, None)
                    .await?
                    .close()
                    .await
                    .with_context(|| format!("cannot create shoal:/{p}"))?;
            }
            (Way::Out { dst, .. }, FileKind::Dir) => {
                let p = join_local(dst, &e.rel);
                std::fs::create_dir_all(&p).with_context(|| format!("cannot create directory {}", p.display()))?;
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(e.perm | 0o700));
            }
            (Way::Out { dst, .. }, FileKind::Symlink) => {
                let p = join_local(dst, &e.rel);
                std::os::unix::fs::symlink(&e.target, &p)
                    .with_context(|| format!("cannot create symlink {}", p.display()))?;
            }
            (Way::Out { dst, .. }, FileKind::File) if is_split(e, split) => {
                let p = join_local(dst, &e.rel);
                let f = std::fs::File::create(&p).with_context(|| format!("cannot create {}", p.display()))?;
                f.set_len(e.size).with_context(|| format!("cannot size {}", p.display()))?;
                let _ = f.set_permissions(std::fs::Permissions::from_mode(e.perm));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Copy one piece. A whole file is created by its copier; a range goes into the file rank 0
/// made.
async fn copy_piece(client: &Client, way: &Way, e: &Entry, p: Piece, split: bool, done: &AtomicU64) -> Result<()> {
    match way {
        Way::In { src, dst } => {
            let spath = join_local(src, &e.rel);
            let dpath = join_shoal(dst, &e.rel);
            let f = Arc::new(std::fs::File::open(&spath).with_context(|| format!("cannot open {}", spath.display()))?);
            let out = if split {
                client.open(&dpath, OpenFlags::write_only()).await?
            } else {
                client.create(&dpath, e.perm, None).await?
            };
            let mut off = p.offset;
            let end = p.offset + p.len;
            while off < end {
                let len = CHUNK.min((end - off) as usize);
                let f = f.clone();
                let data = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
                    let mut buf = vec![0u8; len];
                    f.read_exact_at(&mut buf, off)?;
                    Ok(buf)
                })
                .await?
                .with_context(|| format!("cannot read {} at {off}", spath.display()))?;
                out.write_at(off, &data).await?;
                off += len as u64;
                done.fetch_add(len as u64, Ordering::Relaxed);
            }
            out.close().await?;
        }
        Way::Out { src, dst } => {
            let spath = join_shoal(src, &e.rel);
            let dpath = join_local(dst, &e.rel);
            let input = client.open(&spath, OpenFlags::read_only()).await?;
            let f = if split {
                std::fs::OpenOptions::new().write(true).open(&dpath)
            } else {
                std::fs::File::create(&dpath)
            }
            .with_context(|| format!("cannot open {}", dpath.display()))?;
            if !split {
                let _ = f.set_permissions(std::fs::Permissions::from_mode(e.perm));
            }
            let f = Arc::new(f);
            let mut off = p.offset;
            let end = p.offset + p.len;
            while off < end {
                let len = CHUNK.min((end - off) as usize);
                let data = input.read_at(off, len).await?;
                if data.len() != len {
                    bail!("shoal:/{spath} ended at {} bytes, {} were listed", off + data.len() as u64, e.size);
                }
                let f2 = f.clone();
                tokio::task::spawn_blocking(move || f2.write_all_at(&data, off))
                    .await?
                    .with_context(|| format!("cannot write {}", dpath.display()))?;
                off += len as u64;
                done.fetch_add(len as u64, Ordering::Relaxed);
            }
            // The data must be on the global file system before the servers go away.
            let f2 = f.clone();
            tokio::task::spawn_blocking(move || f2.sync_all())
                .await?
                .with_context(|| format!("cannot sync {}", dpath.display()))?;
        }
    }
    Ok(())
}

/// Publish this rank's byte count to `dir/<rank>` twice a second until `stop`; rank 0 also
/// draws one bar over the sum of every rank's count (on a terminal; hidden otherwise).
async fn report_progress(
    dir: PathBuf,
    rank: u32,
    size: u32,
    total: u64,
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    label: String,
) {
    let _ = std::fs::create_dir_all(&dir);
    let bar = if rank == 0 && total > 0 { ProgressBar::new(total) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{prefix} {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(format!("{label} ({size} ranks)"));
    loop {
        let finished = stop.load(Ordering::Relaxed);
        let _ = super::formation::write_atomic(
            &dir.join(rank.to_string()),
            done.load(Ordering::Relaxed).to_string().as_bytes(),
        );
        if rank == 0 {
            let sum: u64 = (0..size)
                .filter_map(|r| std::fs::read_to_string(dir.join(r.to_string())).ok())
                .filter_map(|s| s.trim().parse::<u64>().ok())
                .sum();
            bar.set_position(sum.min(total));
        }
        if finished {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bar.finish_and_clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(rel: &str, size: u64) -> Entry {
        Entry { rel: rel.into(), kind: FileKind::File, size, perm: 0o644, target: String::new() }
    }

    #[test]
    fn deal_covers_every_byte_once_and_balances() {
        let entries = vec![
            Entry { rel: String::new(), kind: FileKind::Dir, size: 0, perm: 0o755, target: String::new() },
            file("a", 10),
            file("big", 1000),
            file("empty", 0),
            file("b", 300),
        ];
        let shares = deal(&entries, 4, 256);
        let mut all: Vec<Piece> = shares.iter().flatten().copied().collect();
        all.sort_by_key(|p| (p.entry, p.offset));
        // big: 4 pieces of 256, 256, 256, 232; b: 256 + 44; a whole; empty once.
        let big: Vec<(u64, u64)> = all.iter().filter(|p| p.entry == 2).map(|p| (p.offset, p.len)).collect();
        assert_eq!(big, vec![(0, 256), (256, 256), (512, 256), (768, 232)]);
        assert_eq!(all.iter().filter(|p| p.entry == 3).count(), 1);
        assert_eq!(all.iter().map(|p| p.len).sum::<u64>(), 1310);
        let loads: Vec<u64> = shares.iter().map(|s| s.iter().map(|p| p.len).sum()).collect();
        assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 256, "{loads:?}");
        // The same on every rank.
        assert_eq!(deal(&entries, 4, 256), shares);
    }
}
