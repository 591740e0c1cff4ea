//! The generic communication interface: the few collective operations the container
//! needs, so that it runs under any parallel runtime (SIONlib's "generic API"). The tasks
//! of a container are the members of one [`Comm`]; every member calls each collective
//! operation, in the same order.
//!
//! Adapters: [`LocalComm`] for tasks inside one process (threads, or async tasks: 100,000
//! of them cost no thread each), and the C API's callback table, through which MPI (or any
//! other runtime) plugs in (`crates/container-capi`).

use crate::error::{Error, Result};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::Barrier;

/// The collective operations of a group of tasks. Payloads are bytes; the container
/// encodes what it exchanges.
pub trait Comm: Send + Sync {
    /// This task's number in the group, from 0.
    fn rank(&self) -> usize;
    /// Tasks in the group.
    fn size(&self) -> usize;
    /// Wait until every task of the group has called it.
    fn barrier(&self) -> BoxFuture<'_, Result<()>>;
    /// `root`'s `data` to every task (what others pass is ignored).
    fn bcast(&self, data: Vec<u8>, root: usize) -> BoxFuture<'_, Result<Vec<u8>>>;
    /// Every task's `data`, in rank order, at `root` (`None` elsewhere).
    fn gather(&self, data: Vec<u8>, root: usize) -> BoxFuture<'_, Result<Option<Vec<Vec<u8>>>>>;
    /// `root`'s `parts[i]` to task `i` (`parts` is read at `root` only; it must hold
    /// [`Comm::size`] parts).
    fn scatter(&self, parts: Vec<Vec<u8>>, root: usize) -> BoxFuture<'_, Result<Vec<u8>>>;
    /// Groups of the tasks that pass the same `color`, ordered by `key` then rank.
    fn split(&self, color: u64, key: u64) -> BoxFuture<'_, Result<Box<dyn Comm>>>;
}

/// What the members of one [`LocalComm`] group share.
struct Shared {
    size: usize,
    barrier: Barrier,
    /// One slot per rank, filled by gather/bcast/scatter/split in turn.
    slots: Mutex<Vec<Option<Vec<u8>>>>,
    /// Results of a `split` for the members that asked, built by the last to arrive.
    groups: Mutex<Vec<Option<LocalComm>>>,
}

/// Tasks of one process: [`LocalComm::group`] makes `n` members, one per task (an OS
/// thread or an async task each).
#[derive(Clone)]
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
}

impl LocalComm {
    /// `n` members of one new group.
    pub fn group(n: usize) -> Vec<LocalComm> {
        let shared = Arc::new(Shared {
            size: n,
            barrier: Barrier::new(n.max(1)),
            slots: Mutex::new(vec![None; n]),
            groups: Mutex::new((0..n).map(|_| None).collect()),
        });
        (0..n).map(|rank| LocalComm { rank, shared: shared.clone() }).collect()
    }

    /// Put this task's `data` in its slot, wait for all, let `read` see every slot, and wait
    /// again before the slots are reused (so that two collectives never mix).
    async fn exchange<T>(&self, data: Option<Vec<u8>>, read: impl FnOnce(&mut Vec<Option<Vec<u8>>>) -> T) -> T {
        if let Some(d) = data {
            self.shared.slots.lock()[self.rank] = Some(d);
        }
        self.shared.barrier.wait().await;
        let out = read(&mut self.shared.slots.lock());
        if self.shared.barrier.wait().await.is_leader() {
            self.shared.slots.lock().iter_mut().for_each(|s| *s = None);
        }
        self.shared.barrier.wait().await;
        out
    }
}

impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn barrier(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.shared.barrier.wait().await;
            Ok(())
        })
    }

    fn bcast(&self, data: Vec<u8>, root: usize) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(async move {
            check_root(root, self.size())?;
            let mine = (self.rank == root).then_some(data);
            Ok(self.exchange(mine, |slots| slots[root].clone().unwrap_or_default()).await)
        })
    }

    fn gather(&self, data: Vec<u8>, root: usize) -> BoxFuture<'_, Result<Option<Vec<Vec<u8>>>>> {
        Box::pin(async move {
            check_root(root, self.size())?;
            let me = self.rank;
            let all = self
                .exchange(Some(data), |slots| {
                    (me == root).then(|| slots.iter_mut().map(|s| s.take().unwrap_or_default()).collect())
                })
                .await;
            Ok(all)
        })
    }

    fn scatter(&self, parts: Vec<Vec<u8>>, root: usize) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(async move {
            check_root(root, self.size())?;
            if self.rank == root && parts.len() != self.size() {
                return Err(Error::Comm(format!("scatter of {} parts to {} tasks", parts.len(), self.size())));
            }
            // The root lays every part in its slot; each task takes its own.
            if self.rank == root {
                let mut slots = self.shared.slots.lock();
                for (s, p) in slots.iter_mut().zip(parts) {
                    *s = Some(p);
                }
            }
            let me = self.rank;
            Ok(self.exchange(None, |slots| slots[me].take().unwrap_or_default()).await)
        })
    }

    fn split(&self, color: u64, key: u64) -> BoxFuture<'_, Result<Box<dyn Comm>>> {
        Box::pin(async move {
            let mut tag = color.to_le_bytes().to_vec();
            tag.extend_from_slice(&key.to_le_bytes());
            let me = self.rank;
            self.shared.slots.lock()[me] = Some(tag);
            // One task (the barrier's leader) sorts every (color, key) and makes the groups,
            // once: a split of 100,000 tasks costs one sort, not one per task.
            if self.shared.barrier.wait().await.is_leader() {
                let mut slots = self.shared.slots.lock();
                let mut tags: Vec<(u64, u64, usize)> = slots
                    .iter_mut()
                    .enumerate()
                    .map(|(r, s)| {
                        let b = s.take().unwrap_or_default();
                        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
                        (word(0), word(8), r)
                    })
                    .collect();
                drop(slots);
                tags.sort_unstable();
                let mut groups = self.shared.groups.lock();
                for same in tags.chunk_by(|a, b| a.0 == b.0) {
                    for (t, g) in same.iter().zip(LocalComm::group(same.len())) {
                        groups[t.2] = Some(g);
                    }
                }
            }
            self.shared.barrier.wait().await;
            // Taken before this task's next collective, whose split would refill the slot.
            let mine = self.shared.groups.lock()[me].take();
            mine.map(|g| Box::new(g) as Box<dyn Comm>).ok_or_else(|| Error::Comm("split: no group was made".into()))
        })
    }
}

fn check_root(root: usize, size: usize) -> Result<()> {
    if root >= size {
        return Err(Error::Comm(format!("root {root} of a group of {size}")));
    }
    Ok(())
}
