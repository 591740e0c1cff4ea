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
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::watch;

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
    /// The collectives that some member has entered and not every member has.
    open: Mutex<Open>,
    /// The last finished collective: members that need its result wait for it here.
    done: watch::Sender<Arc<Done>>,
}

/// Collectives `first, first + 1, …` in entering order. A member that needs nothing from
/// the others (the non-roots of a gather, the root of a bcast or scatter) goes on without
/// waiting, so it may be several collectives ahead of the slowest member.
struct Open {
    first: u64,
    rounds: VecDeque<Round>,
}

/// What the members of one collective brought so far.
struct Round {
    arrived: usize,
    /// One slot per rank (gather, split, the root's bcast).
    slots: Vec<Option<Vec<u8>>>,
    /// The root's parts of a scatter.
    parts: Option<Vec<Vec<u8>>>,
}

impl Round {
    fn new(size: usize) -> Round {
        Round { arrived: 0, slots: vec![None; size], parts: None }
    }
}

/// A finished collective, shared by its members until each has taken its part.
///
/// Invariant: collective `k + 1` cannot finish before every member has left collective `k`
/// (it finishes when every member has entered it, and members enter collectives in order),
/// so `done` still holds `k` while any member waits for it.
struct Done {
    number: u64,
    slots: Mutex<Vec<Option<Vec<u8>>>>,
    /// The groups of a split, made once by the first member to ask.
    groups: OnceLock<Mutex<Vec<Option<LocalComm>>>>,
}

/// What a task brings to a collective.
enum Bring {
    Nothing,
    Slot(Vec<u8>),
    Parts(Vec<Vec<u8>>),
}

/// Tasks of one process: [`LocalComm::group`] makes `n` members, one per task (an OS
/// thread or an async task each).
///
/// With 100,000 async tasks, waking each task is what a collective costs: so every
/// operation is one round, and only the members that need the others' data wait (a gather
/// wakes its root only, a bcast or scatter all but its root).
pub struct LocalComm {
    rank: usize,
    /// Collectives this member has entered.
    entered: AtomicU64,
    shared: Arc<Shared>,
}

impl LocalComm {
    /// `n` members of one new group.
    pub fn group(n: usize) -> Vec<LocalComm> {
        let none = Arc::new(Done { number: u64::MAX, slots: Mutex::new(Vec::new()), groups: OnceLock::new() });
        let shared = Arc::new(Shared {
            size: n,
            open: Mutex::new(Open { first: 0, rounds: VecDeque::new() }),
            done: watch::channel(none).0,
        });
        (0..n).map(|rank| LocalComm { rank, entered: AtomicU64::new(0), shared: shared.clone() }).collect()
    }

    /// Enter the next collective with what this task brings; with `wait`, return it once
    /// every member has entered it (without, `None` at once). The last to enter finishes it.
    async fn round(&self, bring: Bring, wait: bool) -> Option<Arc<Done>> {
        let number = self.entered.fetch_add(1, Ordering::Relaxed);
        let mut finished = {
            let mut open = self.shared.open.lock();
            let at = (number - open.first) as usize;
            while open.rounds.len() <= at {
                open.rounds.push_back(Round::new(self.shared.size));
            }
            let r = &mut open.rounds[at];
            match bring {
                Bring::Nothing => {}
                Bring::Slot(d) => r.slots[self.rank] = Some(d),
                Bring::Parts(p) => r.parts = Some(p),
            }
            r.arrived += 1;
            if r.arrived == self.shared.size {
                // Collectives finish in order, so this one is the oldest open.
                debug_assert_eq!(at, 0);
                let r = open.rounds.pop_front().expect("the round just entered");
                open.first += 1;
                let slots = match r.parts {
                    Some(parts) => parts.into_iter().map(Some).collect(),
                    None => r.slots,
                };
                let done = Arc::new(Done { number, slots: Mutex::new(slots), groups: OnceLock::new() });
                self.shared.done.send_replace(done.clone());
                return wait.then_some(done);
            }
            if !wait {
                return None;
            }
            // Subscribed before the lock is let go: the finish cannot be missed.
            self.shared.done.subscribe()
        };
        let done = finished.wait_for(|d| d.number == number).await.expect("the sender lives in `shared`");
        Some(done.clone())
    }

    /// Enter and wait for the end (see [`LocalComm::round`]).
    async fn round_waited(&self, bring: Bring) -> Arc<Done> {
        self.round(bring, true).await.expect("a waited round returns its result")
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
            self.round_waited(Bring::Nothing).await;
            Ok(())
        })
    }

    fn bcast(&self, data: Vec<u8>, root: usize) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(async move {
            check_root(root, self.size())?;
            if self.rank == root {
                self.round(Bring::Slot(data.clone()), false).await;
                return Ok(data);
            }
            let done = self.round_waited(Bring::Nothing).await;
            let data = done.slots.lock()[root].clone().unwrap_or_default();
            Ok(data)
        })
    }

    fn gather(&self, data: Vec<u8>, root: usize) -> BoxFuture<'_, Result<Option<Vec<Vec<u8>>>>> {
        Box::pin(async move {
            check_root(root, self.size())?;
            let Some(done) = self.round(Bring::Slot(data), self.rank == root).await else {
                return Ok(None);
            };
            let all = std::mem::take(&mut *done.slots.lock());
            Ok(Some(all.into_iter().map(Option::unwrap_or_default).collect()))
        })
    }

    fn scatter(&self, parts: Vec<Vec<u8>>, root: usize) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(async move {
            check_root(root, self.size())?;
            if self.rank == root && parts.len() != self.size() {
                // Every member still enters the collective, so that none waits for ever.
                self.round(Bring::Nothing, false).await;
                return Err(Error::Comm(format!("scatter of {} parts to {} tasks", parts.len(), self.size())));
            }
            if self.rank == root {
                let mut parts = parts;
                let mine = std::mem::take(&mut parts[root]);
                self.round(Bring::Parts(parts), false).await;
                return Ok(mine);
            }
            let done = self.round_waited(Bring::Nothing).await;
            let mine = done.slots.lock().get_mut(self.rank).and_then(Option::take);
            mine.ok_or_else(|| Error::Comm("scatter: the root sent no parts".into()))
        })
    }

    fn split(&self, color: u64, key: u64) -> BoxFuture<'_, Result<Box<dyn Comm>>> {
        Box::pin(async move {
            let mut tag = color.to_le_bytes().to_vec();
            tag.extend_from_slice(&key.to_le_bytes());
            let done = self.round_waited(Bring::Slot(tag)).await;
            // The first member to get here sorts every (color, key, rank) and makes the
            // groups, once: a split of 100,000 tasks costs one sort, not one per task.
            let groups = done.groups.get_or_init(|| {
                let slots = done.slots.lock();
                let mut tags: Vec<(u64, u64, usize)> = slots
                    .iter()
                    .enumerate()
                    .map(|(r, s)| {
                        let b = s.as_deref().unwrap_or(&[0; 16]);
                        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
                        (word(0), word(8), r)
                    })
                    .collect();
                tags.sort_unstable();
                let mut groups: Vec<Option<LocalComm>> = (0..slots.len()).map(|_| None).collect();
                for same in tags.chunk_by(|a, b| a.0 == b.0) {
                    for (t, g) in same.iter().zip(LocalComm::group(same.len())) {
                        groups[t.2] = Some(g);
                    }
                }
                Mutex::new(groups)
            });
            let mine = groups.lock()[self.rank].take();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Members run many collectives back to back, some of which let members run ahead (the
    /// non-roots of a gather, the root of a bcast or scatter): each result must still be
    /// its own collective's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn collectives_in_a_row_never_mix() {
        const N: usize = 7;
        let tasks: Vec<_> = LocalComm::group(N)
            .into_iter()
            .map(|c| {
                tokio::spawn(async move {
                    let me = c.rank() as u8;
                    for round in 0..40u8 {
                        let root = round as usize % N;
                        let all = c.gather(vec![me, round], root).await.unwrap();
                        if c.rank() == root {
                            let want: Vec<Vec<u8>> = (0..N as u8).map(|r| vec![r, round]).collect();
                            assert_eq!(all.unwrap(), want);
                        } else {
                            assert!(all.is_none());
                        }
                        let b = c.bcast(vec![root as u8, round, me], root).await.unwrap();
                        assert_eq!(b, vec![root as u8, round, root as u8]);
                        let parts = (0..N as u8).map(|r| vec![r, round]).collect();
                        assert_eq!(c.scatter(parts, root).await.unwrap(), vec![me, round]);
                        if round % 5 == 0 {
                            c.barrier().await.unwrap();
                            // Even and odd ranks, ordered by descending rank.
                            let g = c.split(me as u64 % 2, 100 - me as u64).await.unwrap();
                            let mine: Vec<usize> = (0..N).filter(|r| r % 2 == me as usize % 2).rev().collect();
                            assert_eq!(g.size(), mine.len());
                            assert_eq!(mine[g.rank()], me as usize);
                            let sum = g.gather(vec![me], 0).await.unwrap();
                            if g.rank() == 0 {
                                let got: Vec<usize> = sum.unwrap().iter().map(|v| v[0] as usize).collect();
                                assert_eq!(got, mine);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_scatter_of_the_wrong_number_of_parts_fails_on_every_member() {
        let tasks: Vec<_> = LocalComm::group(3)
            .into_iter()
            .map(|c| tokio::spawn(async move { c.scatter(vec![vec![1]; 2], 0).await }))
            .collect();
        for t in tasks {
            assert!(t.await.unwrap().is_err());
        }
    }
}
