//! Collective open and close (SIONlib's `paropen`/`parclose`): every task of a [`Comm`]
//! calls them together; reads and writes in between are each task's own.
//!
//! **Open for writing.** Rank 0 gathers every task's chunk size, creates the physical
//! files (one per I/O group: tasks `[f·n/k, (f+1)·n/k)` go to file `f` of `k`), writes
//! each file's header and hands every task its place (scatter). Each task then opens its
//! physical file (once per process, `store::Opened`).
//!
//! **Close after writing.** Each file's tasks gather how full each of their chunks is at
//! the file's first task, which makes the file's data durable, then writes its tail and
//! trailer and makes them durable; then all tasks wait for one another. A container is
//! readable only once every task has closed it: until then its files have no trailer.
//!
//! **Open for reading.** Rank 0 reads the metadata of every physical file and hands each
//! task its chunks. The number of tasks must be the container's (else use
//! `mapped::open_mapped`).

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::format::{Header, TaskSlot, Trailer, FLAG_COALESCED, FLAG_KEY_VALUE};
use crate::logical::{Chunks, Logical};
use crate::meta::{physical_name, read_meta, FileMeta};
use crate::store::{Opened, PhysFile, Placement, Target};
use crate::wire::{Dec, Enc};
use shoal_client::{STRIPE_SIZE_MAX, STRIPE_SIZE_MIN};
use std::sync::Arc;

/// How tasks are split over physical files: `nfiles` contiguous groups by rank.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub ntasks: u64,
    pub nfiles: u32,
}

impl Plan {
    /// First rank of file `f`.
    pub fn first_of(&self, f: u32) -> u64 {
        (f as u128 * self.ntasks as u128 / self.nfiles as u128) as u64
    }

    /// The file holding `rank`, and its index among that file's tasks.
    pub fn place_of(&self, rank: u64) -> (u32, u64) {
        // The largest f with first_of(f) <= rank.
        let mut f = ((rank as u128 * self.nfiles as u128) / self.ntasks.max(1) as u128) as u32;
        while f + 1 < self.nfiles && self.first_of(f + 1) <= rank {
            f += 1;
        }
        while f > 0 && self.first_of(f) > rank {
            f -= 1;
        }
        (f, rank - self.first_of(f))
    }
}

/// Options of a collective open for writing. The same on every task but `chunk_size`.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// This task's chunk: at least the most it writes in one piece (`ensure_free_space`),
    /// rounded up to the block size.
    pub chunk_size: u64,
    /// Physical files: 1, or more for large task counts (each file complete on its own; on
    /// Shoal each on its own server).
    pub nfiles: u32,
    /// Block size chunks are aligned to; 0: the file system's (on Shoal, the stripe size,
    /// which a non-zero value also sets).
    pub fs_block: u64,
    /// Key-value records instead of a byte stream (`kv.rs`).
    pub key_value: bool,
    /// Coalescing I/O (`coalesce.rs`): groups of this many consecutive tasks share one
    /// collector, their chunks packed without alignment gaps; 0 or 1: none;
    /// [`COLLECTOR_AUTO`]: as many tasks as fill one block with their chunks.
    pub collector_size: u32,
}

/// [`WriteOptions::collector_size`]: choose the group size from the block size and the
/// chunks (the largest chunk of a file's tasks, so that a group's chunks fill about one
/// block: small chunks then cost little more than their bytes on disk).
pub const COLLECTOR_AUTO: u32 = u32::MAX;

impl Default for WriteOptions {
    fn default() -> WriteOptions {
        WriteOptions { chunk_size: 1 << 20, nfiles: 1, fs_block: 0, key_value: false, collector_size: 0 }
    }
}

/// One task's share of an open container: its logical file, and the group it closes with.
pub struct ParFile {
    comm: Box<dyn Comm>,
    name: String,
    pub(crate) logical: Logical,
    pub(crate) info: TaskInfo,
    /// Coalescing I/O: the task's collector group (its first task is the collector).
    pub(crate) group: Option<Box<dyn Comm>>,
    /// Files this process created (rank 0), kept open until the close.
    _created: Vec<Arc<PhysFile>>,
    closed: bool,
}

/// What a task learns at open.
#[derive(Clone, Debug)]
pub struct TaskInfo {
    pub rank: u64,
    pub ntasks: u64,
    pub file_number: u32,
    pub nfiles: u32,
    /// Index among the tasks of its physical file.
    pub index: u64,
    pub fs_block: u64,
    pub flags: u32,
    /// Tasks per collector group (0: no coalescing).
    pub collector_size: u32,
}

/// Coalescing I/O: split the tasks into their collector groups (collectively; `None`
/// without coalescing, then nothing is exchanged).
async fn collector_group(comm: &dyn Comm, info: &TaskInfo) -> Result<Option<Box<dyn Comm>>> {
    if info.collector_size <= 1 {
        return Ok(None);
    }
    let color = ((info.file_number as u64) << 40) | (info.index / info.collector_size as u64);
    Ok(Some(comm.split(color, info.index).await?))
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// What rank 0 sends each task: its place, or why the open failed (every task then fails).
fn verdict(r: Result<Vec<u8>>) -> Vec<u8> {
    match r {
        Ok(mut b) => {
            b.insert(0, 1);
            b
        }
        Err(e) => {
            let mut b = vec![0];
            b.extend_from_slice(e.to_string().as_bytes());
            b
        }
    }
}

fn take_verdict(b: Vec<u8>, what: &str) -> Result<Vec<u8>> {
    match b.split_first() {
        Some((1, rest)) => Ok(rest.to_vec()),
        Some((_, msg)) => Err(Error::Comm(format!("{what} failed on rank 0: {}", String::from_utf8_lossy(msg)))),
        None => Err(Error::Comm(format!("{what}: rank 0 sent nothing"))),
    }
}

impl ParFile {
    /// Open the container `name` for writing, collectively (creating or replacing it).
    pub async fn create(comm: Box<dyn Comm>, target: &Target, name: &str, opts: &WriteOptions) -> Result<ParFile> {
        let n = comm.size() as u64;
        let mut ask = Enc::default();
        ask.u64(opts.chunk_size).u32(opts.nfiles).u64(opts.fs_block).u32(opts.key_value as u32);
        ask.u32(if opts.collector_size > 1 { opts.collector_size } else { 0 });
        let asks = comm.gather(ask.done(), 0).await?;
        let mut created = Vec::new();
        let parts = match asks {
            Some(asks) => match Box::pin(plan_create(target, name, n, &asks, &mut created)).await {
                Ok(parts) => parts,
                Err(e) => {
                    let v = verdict(Err(e));
                    (0..n).map(|_| v.clone()).collect()
                }
            },
            None => Vec::new(),
        };
        let mine = take_verdict(comm.scatter(parts, 0).await?, &format!("create {name}"))?;
        let mut d = Dec::new(&mine);
        let info = TaskInfo {
            rank: comm.rank() as u64,
            ntasks: n,
            file_number: d.u32()?,
            nfiles: d.u32()?,
            index: d.u64()?,
            fs_block: d.u64()?,
            flags: d.u32()?,
            collector_size: d.u32()?,
        };
        let chunks = Chunks {
            data_start: d.u64()?,
            block_len: d.u64()?,
            slot: TaskSlot { rank: info.rank, chunk_off: d.u64()?, chunk_len: d.u64()? },
            used: Vec::new(),
        };
        let file = Box::pin(Opened::global().get(target, &physical_name(name, info.file_number), true)).await?;
        let group = collector_group(&*comm, &info).await?;
        Ok(ParFile {
            comm,
            name: name.to_string(),
            logical: Logical::new(file, chunks, true, info.flags & FLAG_KEY_VALUE != 0),
            info,
            group,
            _created: created,
            closed: false,
        })
    }

    /// Open the container `name` for reading, collectively; as many tasks as it holds.
    pub async fn open(comm: Box<dyn Comm>, target: &Target, name: &str) -> Result<ParFile> {
        let n = comm.size() as u64;
        let parts = if comm.rank() == 0 {
            match Box::pin(plan_open(target, name, n)).await {
                Ok(parts) => parts,
                Err(e) => {
                    let v = verdict(Err(e));
                    (0..n).map(|_| v.clone()).collect()
                }
            }
        } else {
            Vec::new()
        };
        let mine = take_verdict(comm.scatter(parts, 0).await?, &format!("open {name}"))?;
        let (info, chunks) = decode_reader(&mine, comm.rank() as u64, n)?;
        let file = Box::pin(Opened::global().get(target, &physical_name(name, info.file_number), false)).await?;
        let group = collector_group(&*comm, &info).await?;
        Ok(ParFile {
            comm,
            name: name.to_string(),
            logical: Logical::new(file, chunks, false, info.flags & FLAG_KEY_VALUE != 0),
            info,
            group,
            _created: Vec::new(),
            closed: false,
        })
    }

    pub fn info(&self) -> &TaskInfo {
        &self.info
    }

    /// The container's name (its first physical file).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This task's logical file.
    pub fn logical(&mut self) -> &mut Logical {
        &mut self.logical
    }

    /// Close collectively. After writing: every file's tail and trailer are written and
    /// durable when this returns on any task.
    pub async fn close(mut self) -> Result<()> {
        self.closed = true;
        if !self.logical.is_writing() {
            return self.comm.barrier().await;
        }
        let drained = self.logical.file.drain().await;
        // With one physical file its tasks are all the tasks: no split, and the broadcast
        // of the file's status is the end of the close for everyone.
        let several = self.info.nfiles > 1;
        let split;
        let group: &dyn Comm = if several {
            split = self.comm.split(self.info.file_number as u64, self.info.index).await?;
            &*split
        } else {
            &*self.comm
        };
        let mut e = Enc::default();
        e.u32(drained.is_ok() as u32).u64s(&self.logical.chunks.used);
        let all = group.gather(e.done(), 0).await?;
        let status = match all {
            Some(all) => verdict(Box::pin(self.finish_file(all)).await.map(|_| Vec::new())),
            None => Vec::new(),
        };
        let status = take_verdict(group.bcast(status, 0).await?, &format!("close {}", self.name));
        if several {
            self.comm.barrier().await?;
        }
        drained?;
        status.map(|_| ())
    }

    /// At a file's first task: its tail and trailer, from every task's chunk use.
    async fn finish_file(&self, all: Vec<Vec<u8>>) -> Result<()> {
        let mut used = Vec::with_capacity(all.len());
        for b in &all {
            let mut d = Dec::new(b);
            if d.u32()? != 1 {
                return Err(Error::Comm("a task's writes did not reach the file system".into()));
            }
            let mut u = d.u64s()?;
            // A chunk moved to but never written to is not kept.
            while u.last() == Some(&0) {
                u.pop();
            }
            used.push(u);
        }
        let c = &self.logical.chunks;
        let nblocks = used.iter().map(Vec::len).max().unwrap_or(0) as u64;
        let info = &self.info;
        let map = if info.file_number == 0 && info.nfiles > 1 {
            let plan = Plan { ntasks: info.ntasks, nfiles: info.nfiles };
            (0..info.ntasks).map(|r| plan.place_of(r)).collect()
        } else {
            Vec::new()
        };
        let tail = crate::format::Tail { nblocks, used, map }.encode();
        let tail_at = c.data_start + nblocks * c.block_len;
        let file = &self.logical.file;
        file.sync().await?;
        file.write_at(tail_at, &tail).await?;
        file.write_at(tail_at + tail.len() as u64, &Trailer { tail_at, tail_len: tail.len() as u64 }.encode()).await?;
        file.sync().await
    }
}

impl Drop for ParFile {
    fn drop(&mut self) {
        if !self.closed && self.logical.is_writing() {
            // Not closed collectively: the container stays unreadable (no trailer).
            tracing::warn!("{} dropped without a collective close: it has no trailer and cannot be read", self.name);
        }
    }
}

/// Rank 0 at a create: check the tasks agree, create the physical files, write their
/// headers; every task's place.
async fn plan_create(
    target: &Target,
    name: &str,
    n: u64,
    asks: &[Vec<u8>],
    created: &mut Vec<Arc<PhysFile>>,
) -> Result<Vec<Vec<u8>>> {
    let mut chunk = Vec::with_capacity(asks.len());
    let mut common = None;
    for (r, a) in asks.iter().enumerate() {
        let mut d = Dec::new(a);
        let size = d.u64()?;
        let these = (d.u32()?, d.u64()?, d.u32()?, d.u32()?);
        if size == 0 {
            return Err(Error::Usage(format!("rank {r} asked for a chunk of 0 bytes")));
        }
        match common {
            None => common = Some(these),
            Some(c) if c != these => {
                return Err(Error::Usage(format!(
                    "rank {r} opens with other options (files, block size or mode) than rank 0"
                )))
            }
            _ => {}
        }
        chunk.push(size);
    }
    let (nfiles, fs_block_asked, kv, mut collector_size) = common.unwrap_or((1, 0, 0, 0));
    if nfiles == 0 || nfiles as u64 > n.max(1) {
        return Err(Error::Usage(format!("{nfiles} physical files for {n} tasks")));
    }
    if fs_block_asked != 0 && (fs_block_asked % 512 != 0) {
        return Err(Error::Usage(format!("block size {fs_block_asked} is not a multiple of 512")));
    }
    let flags = if kv != 0 { FLAG_KEY_VALUE } else { 0 } | if collector_size > 1 { FLAG_COALESCED } else { 0 };
    let plan = Plan { ntasks: n, nfiles };
    let mut parts = vec![Vec::new(); n as usize];
    let stripe_size = match target {
        Target::Shoal(c) if fs_block_asked == 0 && collector_size <= 1 => {
            chunk_stripe(&chunk, c.map().cluster.stripe_size)
        }
        _ => fs_block_asked,
    };
    for f in 0..nfiles {
        let path = physical_name(name, f);
        let file = PhysFile::create(target, &path, Placement { file_number: f, nfiles, stripe_size }).await?;
        let fs_block = if stripe_size != 0 { stripe_size } else { file.fs_block()? };
        let (first, end) = (plan.first_of(f), if f + 1 == nfiles { n } else { plan.first_of(f + 1) });
        if collector_size == COLLECTOR_AUTO {
            // Decided once, on file 0 (the largest file: files differ by one task at most).
            let largest = chunk[first as usize..end as usize].iter().copied().max().unwrap_or(1);
            collector_size = (fs_block / largest).clamp(2, (end - first).max(2)) as u32;
        }
        let tasks = slots(first, end, &chunk[first as usize..end as usize], fs_block, collector_size)?;
        // A block spans whole rounds of the file's servers (on Shoal; 1 elsewhere): a task's
        // chunk of every block then falls on the same server as in the first block, so
        // each task's chunks stay on one server (the padding is a hole). Not with
        // collectors, whose groups each fill their own stripes.
        let round = if collector_size > 1 { fs_block } else { fs_block * file.stripe_count() };
        let block_len = tasks.last().map_or(0, |t| round_up(t.chunk_off + t.chunk_len, round));
        let data_start = round_up(Header::encoded_len(tasks.len()), fs_block);
        let header =
            Header { flags, collector_size, fs_block, file_number: f, nfiles, ntasks: n, data_start, block_len, tasks };
        file.write_at(0, &header.encode()).await?;
        for (i, t) in header.tasks.iter().enumerate() {
            let mut e = Enc::default();
            e.u32(f).u32(nfiles).u64(i as u64).u64(fs_block).u32(flags).u32(collector_size);
            e.u64(data_start).u64(header.block_len).u64(t.chunk_off).u64(t.chunk_len);
            parts[t.rank as usize] = verdict(Ok(e.done()));
        }
        created.push(Opened::global().put(target, file));
    }
    Ok(parts)
}

/// On Shoal, without a block size asked for and without collectors: stripes at least as
/// large as the largest chunk (a multiple of 4 KiB), so that each task's chunk of a block
/// is in one stripe, on one server; 0 (the directory's stripe size) when the cluster's
/// default stripe already holds every chunk.
fn chunk_stripe(chunk: &[u64], default: u64) -> u64 {
    let largest = chunk.iter().copied().max().unwrap_or(1).next_multiple_of(STRIPE_SIZE_MIN);
    if largest <= default {
        return 0;
    }
    largest.min(STRIPE_SIZE_MAX)
}

/// The chunks of ranks `first..end` (one file) in a block: each aligned to `fs_block`, or
/// with coalescing packed within each group of `collector_size` and each group aligned.
fn slots(first: u64, end: u64, chunk: &[u64], fs_block: u64, collector_size: u32) -> Result<Vec<TaskSlot>> {
    let too_big = || Error::Usage("the chunks of one block add up past 2^64 bytes".into());
    let mut tasks = Vec::with_capacity((end - first) as usize);
    let mut off = 0u64;
    for (i, r) in (first..end).enumerate() {
        let len = if collector_size > 1 {
            if i % collector_size as usize == 0 {
                off = off.checked_next_multiple_of(fs_block).ok_or_else(too_big)?;
            }
            chunk[i]
        } else {
            chunk[i].checked_next_multiple_of(fs_block).ok_or_else(too_big)?
        };
        tasks.push(TaskSlot { rank: r, chunk_off: off, chunk_len: len });
        off = off.checked_add(len).ok_or_else(too_big)?;
    }
    off.checked_next_multiple_of(fs_block).ok_or_else(too_big)?;
    Ok(tasks)
}

/// Rank 0 at an open for reading: every physical file's metadata; every task's chunks.
async fn plan_open(target: &Target, name: &str, n: u64) -> Result<Vec<Vec<u8>>> {
    let metas = read_all_meta(target, name).await?;
    let ntasks = metas[0].header.ntasks;
    if ntasks != n {
        return Err(Error::Usage(format!(
            "{name} holds {ntasks} logical files and was opened by {n} tasks (open it with {ntasks}, or with a mapped open)"
        )));
    }
    let mut parts = vec![Vec::new(); n as usize];
    for m in &metas {
        for (i, t) in m.header.tasks.iter().enumerate() {
            parts[t.rank as usize] = verdict(Ok(encode_reader(m, i)));
        }
    }
    if let Some(r) = parts.iter().position(Vec::is_empty) {
        let what = crate::error::Corrupt::Field(crate::error::Where::Header, "task list (a rank is in no file)");
        return Err(Error::corrupt(physical_name(name, 0), what)).inspect_err(|_| tracing::debug!("rank {r} missing"));
    }
    Ok(parts)
}

/// Every physical file's metadata, file 0 first, checked to agree with one another.
pub async fn read_all_meta(target: &Target, name: &str) -> Result<Vec<FileMeta>> {
    let first = read_meta(&PhysFile::open(target, name, false).await?).await?;
    let nfiles = first.header.nfiles;
    let mut metas = vec![first];
    for f in 1..nfiles {
        let path = physical_name(name, f);
        let m = read_meta(&PhysFile::open(target, &path, false).await?).await?;
        if m.header.file_number != f || m.header.nfiles != nfiles || m.header.ntasks != metas[0].header.ntasks {
            return Err(Error::corrupt(
                &path,
                crate::error::Corrupt::Field(crate::error::Where::Header, "file number (another container's file?)"),
            ));
        }
        metas.push(m);
    }
    Ok(metas)
}

/// Task `i` of file `m`, as a reader needs it.
pub(crate) fn encode_reader(m: &FileMeta, i: usize) -> Vec<u8> {
    let h = &m.header;
    let t = h.tasks[i];
    let mut e = Enc::default();
    e.u32(h.file_number).u32(h.nfiles).u64(i as u64).u64(h.fs_block).u32(h.flags).u32(h.collector_size);
    e.u64(h.data_start).u64(h.block_len).u64(t.rank).u64(t.chunk_off).u64(t.chunk_len);
    e.u64s(&m.tail.used[i]);
    e.done()
}

pub(crate) fn decode_reader(b: &[u8], _me: u64, ntasks: u64) -> Result<(TaskInfo, Chunks)> {
    let mut d = Dec::new(b);
    let (file_number, nfiles, index, fs_block, flags) = (d.u32()?, d.u32()?, d.u64()?, d.u64()?, d.u32()?);
    let collector_size = d.u32()?;
    let (data_start, block_len) = (d.u64()?, d.u64()?);
    let slot = TaskSlot { rank: d.u64()?, chunk_off: d.u64()?, chunk_len: d.u64()? };
    let used = d.u64s()?;
    let info = TaskInfo { rank: slot.rank, ntasks, file_number, nfiles, index, fs_block, flags, collector_size };
    Ok((info, Chunks { slot, data_start, block_len, used }))
}

/// A task's share of a container opened by another number of tasks than wrote it (SIONlib's
/// mapped open, m:n, for reading): each task names the logical files it wants, any set,
/// overlapping or empty, and reads each as its own `Logical`.
pub struct MappedFile {
    comm: Box<dyn Comm>,
    ntasks: u64,
    files: Vec<(u64, Logical)>,
}

impl MappedFile {
    /// Open `name` collectively, this task reading the logical files `ranks`.
    pub async fn open(comm: Box<dyn Comm>, target: &Target, name: &str, ranks: &[u64]) -> Result<MappedFile> {
        let mut e = Enc::default();
        e.u64s(ranks);
        let parts = match comm.gather(e.done(), 0).await? {
            Some(asks) => match Box::pin(plan_mapped(target, name, &asks)).await {
                Ok(parts) => parts,
                Err(err) => {
                    let v = verdict(Err(err));
                    vec![v; asks.len()]
                }
            },
            None => Vec::new(),
        };
        let mine = take_verdict(comm.scatter(parts, 0).await?, &format!("open {name}"))?;
        let mut d = Dec::new(&mine);
        let ntasks = d.u64()?;
        let mut files = Vec::new();
        for _ in 0..d.u64()? {
            let (info, chunks) = decode_reader(d.bytes()?, 0, ntasks)?;
            let file = Box::pin(Opened::global().get(target, &physical_name(name, info.file_number), false)).await?;
            let kv = info.flags & FLAG_KEY_VALUE != 0;
            files.push((info.rank, Logical::new(file, chunks, false, kv)));
        }
        Ok(MappedFile { comm, ntasks, files })
    }

    /// Logical files in the container (tasks that wrote it).
    pub fn ntasks_written(&self) -> u64 {
        self.ntasks
    }

    /// The logical files this task opened, in the order it named them.
    pub fn ranks(&self) -> Vec<u64> {
        self.files.iter().map(|(r, _)| *r).collect()
    }

    /// The logical file of `rank` (one this task named).
    pub fn logical(&mut self, rank: u64) -> Result<&mut Logical> {
        self.files
            .iter_mut()
            .find(|(r, _)| *r == rank)
            .map(|(_, l)| l)
            .ok_or_else(|| Error::Usage(format!("rank {rank} was not among the logical files this task opened")))
    }

    /// Close collectively.
    pub async fn close(self) -> Result<()> {
        self.comm.barrier().await
    }
}

/// Rank 0 at a mapped open: every task's logical files.
async fn plan_mapped(target: &Target, name: &str, asks: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
    let metas = read_all_meta(target, name).await?;
    let ntasks = metas[0].header.ntasks;
    let mut where_is = vec![None; ntasks as usize];
    for (f, m) in metas.iter().enumerate() {
        for (i, t) in m.header.tasks.iter().enumerate() {
            where_is[t.rank as usize] = Some((f, i));
        }
    }
    let mut parts = Vec::with_capacity(asks.len());
    for (task, a) in asks.iter().enumerate() {
        let ranks = Dec::new(a).u64s()?;
        let mut e = Enc::default();
        e.u64(ntasks).u64(ranks.len() as u64);
        for r in ranks {
            let (f, i) = where_is.get(r as usize).copied().flatten().ok_or_else(|| {
                Error::Usage(format!("task {task} asked for logical file {r}; {name} holds {ntasks}"))
            })?;
            e.bytes(&encode_reader(&metas[f], i));
        }
        parts.push(verdict(Ok(e.done())));
    }
    Ok(parts)
}
