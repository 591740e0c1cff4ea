//! The serial API: a plain program opens a whole container (global view: every task's
//! logical file, the metadata) or one task's logical file (local view), and writes a
//! container for many tasks from one process.

use crate::comm::LocalComm;
use crate::error::{Error, Result};
use crate::logical::{Chunks, Logical};
use crate::meta::{physical_name, read_meta, FileMeta};
use crate::par::{read_all_meta, ParFile, WriteOptions};
use crate::store::{PhysFile, Target};
use std::sync::Arc;

/// A closed container opened whole, for reading.
pub struct Container {
    target: Target,
    name: String,
    metas: Vec<FileMeta>,
    /// Per rank: (physical file, index in it).
    ranks: Vec<(u32, usize)>,
}

/// Where one task's logical file lies (`sion_get_locations`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub rank: u64,
    /// Its physical file (number and name).
    pub file_number: u32,
    pub path: String,
    /// Bytes reserved per chunk, and each chunk's start in the physical file.
    pub chunk_len: u64,
    pub chunk_starts: Vec<u64>,
    /// Bytes written in each chunk.
    pub used: Vec<u64>,
}

impl Container {
    /// Read the metadata of every physical file of `name`.
    pub async fn open(target: &Target, name: &str) -> Result<Container> {
        let metas = read_all_meta(target, name).await?;
        let n = metas[0].header.ntasks;
        let mut ranks = vec![None; n as usize];
        for m in &metas {
            for (i, t) in m.header.tasks.iter().enumerate() {
                ranks[t.rank as usize] = Some((m.header.file_number, i));
            }
        }
        let ranks = ranks
            .into_iter()
            .enumerate()
            .map(|(r, p)| {
                p.ok_or_else(|| {
                    Error::corrupt(
                        name,
                        crate::error::Corrupt::Field(crate::error::Where::Header, "task list (a rank is in no file)"),
                    )
                    .with_rank(r)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Container { target: target.clone(), name: name.to_string(), metas, ranks })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Logical files (the tasks that wrote it).
    pub fn ntasks(&self) -> u64 {
        self.ranks.len() as u64
    }

    pub fn nfiles(&self) -> u32 {
        self.metas.len() as u32
    }

    /// The metadata of each physical file, file 0 first.
    pub fn files(&self) -> &[FileMeta] {
        &self.metas
    }

    /// Whether the logical files hold key-value records.
    pub fn key_value(&self) -> bool {
        self.metas[0].header.flags & crate::format::FLAG_KEY_VALUE != 0
    }

    fn chunks_of(&self, rank: u64) -> Result<(&FileMeta, Chunks)> {
        let &(f, i) = self
            .ranks
            .get(rank as usize)
            .ok_or_else(|| Error::Usage(format!("{}: no rank {rank} (it holds {})", self.name, self.ranks.len())))?;
        let m = &self.metas[f as usize];
        let h = &m.header;
        Ok((
            m,
            Chunks { slot: h.tasks[i], data_start: h.data_start, block_len: h.block_len, used: m.tail.used[i].clone() },
        ))
    }

    /// Where `rank`'s logical file lies.
    pub fn location(&self, rank: u64) -> Result<Location> {
        let (m, c) = self.chunks_of(rank)?;
        Ok(Location {
            rank,
            file_number: m.header.file_number,
            path: m.path.clone(),
            chunk_len: c.slot.chunk_len,
            chunk_starts: (0..c.used.len() as u64).map(|b| c.chunk_at(b)).collect(),
            used: c.used.clone(),
        })
    }

    /// `rank`'s logical file, for reading from its start.
    pub async fn reader(&self, rank: u64) -> Result<Logical> {
        let (m, c) = self.chunks_of(rank)?;
        let file = PhysFile::open(&self.target, &m.path, false).await?;
        Ok(Logical::new(Arc::new(file), c, false, self.key_value()))
    }

    /// All of `rank`'s logical file.
    pub async fn read_all(&self, rank: u64) -> Result<Vec<u8>> {
        self.reader(rank).await?.read_to_end().await
    }
}

impl Error {
    fn with_rank(self, r: usize) -> Error {
        match self {
            Error::Corrupt { path, what } => Error::Corrupt { path: format!("{path} (rank {r})"), what },
            e => e,
        }
    }
}

/// One task's logical file of a closed container, reading only the metadata it needs
/// (`sion_open_rank`): file 0's, and the task's own file's.
pub async fn open_rank(target: &Target, name: &str, rank: u64) -> Result<Logical> {
    let first = read_meta(&PhysFile::open(target, name, false).await?).await?;
    let (f, _) = if first.header.nfiles > 1 {
        *first.tail.map.get(rank as usize).ok_or_else(|| no_rank(name, rank, first.header.ntasks))?
    } else {
        (0, 0)
    };
    let meta =
        if f == 0 { first } else { read_meta(&PhysFile::open(target, &physical_name(name, f), false).await?).await? };
    let h = &meta.header;
    let i = h.tasks.iter().position(|t| t.rank == rank).ok_or_else(|| no_rank(name, rank, h.ntasks))?;
    let chunks =
        Chunks { slot: h.tasks[i], data_start: h.data_start, block_len: h.block_len, used: meta.tail.used[i].clone() };
    let file = PhysFile::open(target, &meta.path, false).await?;
    let kv = h.flags & crate::format::FLAG_KEY_VALUE != 0;
    Ok(Logical::new(Arc::new(file), chunks, false, kv))
}

fn no_rank(name: &str, rank: u64, n: u64) -> Error {
    Error::Usage(format!("{name}: no rank {rank} (it holds {n})"))
}

/// A container for `chunk_sizes.len()` tasks written from one program (`sion_open` for
/// writing): every task's logical file at hand, closed together.
pub struct SerialWriter {
    tasks: Vec<ParFile>,
}

impl SerialWriter {
    /// Create `name` with one task per entry of `chunk_sizes` (`opts.chunk_size` unused).
    pub async fn create(target: &Target, name: &str, chunk_sizes: &[u64], opts: &WriteOptions) -> Result<SerialWriter> {
        let opens = LocalComm::group(chunk_sizes.len()).into_iter().zip(chunk_sizes).map(|(comm, &size)| {
            let opts = WriteOptions { chunk_size: size, ..opts.clone() };
            async move { ParFile::create(Box::new(comm), target, name, &opts).await }
        });
        let tasks = futures::future::join_all(opens).await.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(SerialWriter { tasks })
    }

    /// Task `rank`'s logical file.
    pub fn task(&mut self, rank: u64) -> Result<&mut Logical> {
        let n = self.tasks.len();
        self.tasks
            .get_mut(rank as usize)
            .map(|t| &mut t.logical)
            .ok_or_else(|| Error::Usage(format!("no rank {rank} (the container has {n} tasks)")))
    }

    /// Close the container (all tasks at once).
    pub async fn close(self) -> Result<()> {
        let closes = self.tasks.into_iter().map(ParFile::close);
        futures::future::join_all(closes).await.into_iter().collect::<Result<Vec<_>>>().map(|_| ())
    }
}
