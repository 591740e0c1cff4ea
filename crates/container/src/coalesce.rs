//! Coalescing I/O (SIONlib's `fwrite_coll`/`fread_coll`): with many tasks writing a little
//! each, the first task of each collector group does the group's I/O. Tasks of a group have
//! their chunks packed one after the other (no alignment gaps, so 1 KiB per task costs
//! 1 KiB on disk, not a block), and when they write in step the collector writes the
//! group's pieces of a block as one contiguous write instead of one small write per task.
//!
//! Both calls are collective over the container's tasks (each group exchanges within
//! itself); a task with nothing to write passes an empty slice. Positions and chunk use
//! are each task's own, as with `write`/`read`; only the I/O moves to the collector.

use crate::error::{Error, Result};
use crate::par::ParFile;
use crate::wire::{Dec, Enc};

/// Pieces `(offset, data)` merged where one ends exactly where the next starts.
fn merge(mut pieces: Vec<(u64, Vec<u8>)>) -> Vec<(u64, Vec<u8>)> {
    pieces.sort_by_key(|p| p.0);
    let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
    for (off, data) in pieces {
        match out.last_mut() {
            Some((o, d)) if *o + d.len() as u64 == off => d.extend_from_slice(&data),
            _ => out.push((off, data)),
        }
    }
    out
}

/// Runs `(offset, len)` covering the requests, merged where they touch or overlap.
fn runs(mut wanted: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    wanted.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (off, len) in wanted {
        match out.last_mut() {
            Some((o, l)) if off <= *o + *l => *l = (*l).max(off + len - *o),
            _ => out.push((off, len)),
        }
    }
    out
}

impl ParFile {
    /// Write `data` (collectively: every task calls it). Without coalescing, each task
    /// writes its own.
    pub async fn fwrite_coll(&mut self, data: &[u8]) -> Result<()> {
        let Some(group) = &self.group else { return self.logical.write(data).await };
        let mut e = Enc::default();
        let pieces = self.logical.plan_write(data.len() as u64)?;
        e.u64(pieces.len() as u64);
        let mut at = 0usize;
        for (off, n) in pieces {
            e.u64(off).bytes(&data[at..at + n as usize]);
            at += n as usize;
        }
        let status = match group.gather(e.done(), 0).await? {
            Some(all) => {
                let r: Result<()> = async {
                    let mut pieces = Vec::new();
                    for b in &all {
                        let mut d = Dec::new(b);
                        for _ in 0..d.u64()? {
                            let off = d.u64()?;
                            pieces.push((off, d.bytes()?.to_vec()));
                        }
                    }
                    for (off, run) in merge(pieces) {
                        self.logical.file.write_at(off, &run).await?;
                    }
                    Ok(())
                }
                .await;
                vec![r.is_ok() as u8]
                    .into_iter()
                    .chain(r.err().map(|e| e.to_string()).unwrap_or_default().into_bytes())
                    .collect()
            }
            None => Vec::new(),
        };
        let status = group.bcast(status, 0).await?;
        match status.split_first() {
            Some((1, _)) => Ok(()),
            Some((_, m)) => Err(Error::Comm(format!("the collector's write failed: {}", String::from_utf8_lossy(m)))),
            None => Err(Error::Comm("the collector sent nothing".into())),
        }
    }

    /// Read up to `buf.len()` bytes (collectively: every task calls it); returns how many.
    pub async fn fread_coll(&mut self, buf: &mut [u8]) -> Result<usize> {
        let Some(group) = &self.group else { return self.logical.read(buf).await };
        let pieces = self.logical.plan_read(buf.len() as u64);
        let mut e = Enc::default();
        e.u64(pieces.len() as u64);
        for &(off, n) in &pieces {
            e.u64(off).u64(n);
        }
        let parts = match group.gather(e.done(), 0).await? {
            Some(all) => match self.collect_reads(&all).await {
                Ok(parts) => parts,
                Err(err) => {
                    let mut msg = vec![0];
                    msg.extend_from_slice(err.to_string().as_bytes());
                    vec![msg; all.len()]
                }
            },
            None => Vec::new(),
        };
        let mine = group.scatter(parts, 0).await?;
        match mine.split_first() {
            Some((1, data)) => {
                let n = data.len().min(buf.len());
                buf[..n].copy_from_slice(&data[..n]);
                if n as u64 != pieces.iter().map(|p| p.1).sum::<u64>() {
                    return Err(self.logical.cut_short());
                }
                Ok(n)
            }
            Some((_, m)) => Err(Error::Comm(format!("the collector's read failed: {}", String::from_utf8_lossy(m)))),
            None => Err(Error::Comm("the collector sent nothing".into())),
        }
    }

    /// At the collector: read the runs covering every task's pieces; each task's bytes.
    async fn collect_reads(&self, all: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        let mut asked = Vec::with_capacity(all.len());
        for b in all {
            let mut d = Dec::new(b);
            let n = d.u64()?;
            let mut ps = Vec::new();
            for _ in 0..n {
                ps.push((d.u64()?, d.u64()?));
            }
            asked.push(ps);
        }
        let mut read = Vec::new();
        for (off, len) in runs(asked.iter().flatten().copied().collect()) {
            read.push((off, self.logical.file.read_at(off, len as usize).await?));
        }
        Ok(asked
            .iter()
            .map(|ps| {
                let mut out = vec![1u8];
                for &(off, n) in ps {
                    // The run holding this piece (runs are sorted and disjoint).
                    let i = read.partition_point(|(o, _)| *o <= off) - 1;
                    let (o, data) = &read[i];
                    let from = (off - o) as usize;
                    let to = (from + n as usize).min(data.len());
                    out.extend_from_slice(&data[from.min(to)..to]);
                }
                out
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_pieces_merge_and_others_do_not() {
        let m = merge(vec![(10, vec![2; 5]), (0, vec![1; 10]), (20, vec![3; 1])]);
        assert_eq!(m, vec![(0, [vec![1; 10], vec![2; 5]].concat()), (20, vec![3])]);
        assert_eq!(runs(vec![(10, 5), (0, 10), (12, 10), (30, 1)]), vec![(0, 22), (30, 1)]);
    }
}
