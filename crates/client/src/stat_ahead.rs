//! Stat-ahead (as Lustre's statahead): a caller that asks for the attributes of names of
//! one directory, one after another, whose attribute leases ran out (`attr_leases.rs`) —
//! `mdtest`'s stat phase after a long create phase, `ls -l` again a while later — gets the
//! attributes of other such names of the directory fetched with them, in one batched
//! lookup per server, each with a fresh attribute lease, so that the following asks are
//! answered from memory.
//!
//! How many names go with one ask grows with the run of asks: 1 for the first in a
//! directory, then twice as many at each further ask within [`RUN_GAP`] of the last, up to
//! [`AHEAD_MAX`]; at full window an ask also starts the fetch of the next window in the
//! background (one at a time per directory), so that a fast scan finds it done. A single `stat` in a huge directory fetches one name, not a batch; a scan
//! of a thousand names costs about ten batched requests per server. The candidates are the
//! names that the directory's lease knows to exist and whose inodes hold no attribute
//! lease here, or one that runs out within [`RENEW_WITHIN`] (`LeaseCache::known_names`, at
//! most [`SCAN_MAX`] looked at), those whose leases ran out (or run out) first going first:
//! the order the caller will ask in is unknown, and programs that stat what they made
//! (mdtest, a build, a checkpoint check) go in the order they made it, which is the order
//! the leases were granted in. Why leases about to run out too: such a program catches up
//! with the front of expiring leases (the kernel serves the names behind it from its
//! cache), and fetching only those already gone would fetch a handful at a time, at the
//! pace they expire: the pace they were made at.

use parking_lot::Mutex;
use shoal_proto::Ino;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Most names fetched with one ask (one batch per server: `BATCH_MAX` or less).
pub(crate) const AHEAD_MAX: usize = 128;
/// Asks in one directory further apart than this start a new run.
pub(crate) const RUN_GAP: Duration = Duration::from_secs(1);
/// Names whose attribute leases run out within this are fetched ahead too (renewed).
pub(crate) const RENEW_WITHIN: Duration = Duration::from_secs(2);
/// Names of a directory looked at for candidates, at most.
pub(crate) const SCAN_MAX: usize = 16384;
/// Directories with a run remembered (past it, all runs are forgotten).
const MAX_DIRS: usize = 4096;

struct Run {
    window: usize,
    last: Instant,
}

#[derive(Default)]
pub(crate) struct StatAhead {
    runs: Mutex<HashMap<Ino, Run>>,
    /// Inodes fetched ahead lately, and when: not fetched ahead again within
    /// [`RENEW_WITHIN`]. A fetched name whose attributes come without a lease (its inode
    /// lives on another server than its name, or changed meanwhile) would otherwise stay a
    /// candidate, and being the oldest, fill every window.
    fetched: Mutex<HashMap<Ino, Instant>>,
    /// Directories with a fetch in the background on its way (at most one each).
    behind: Mutex<std::collections::HashSet<Ino>>,
}

/// Inodes remembered in `StatAhead::fetched` (past it, those older than `RENEW_WITHIN` are
/// dropped, then all).
const MAX_FETCHED: usize = 1 << 16;

impl StatAhead {
    /// An ask of attributes in `dir` at `now`: how many names to fetch with it (itself
    /// included).
    pub(crate) fn window(&self, dir: Ino, now: Instant) -> usize {
        let mut runs = self.runs.lock();
        if runs.len() >= MAX_DIRS && !runs.contains_key(&dir) {
            runs.clear();
        }
        let run = runs.entry(dir).or_insert(Run { window: 0, last: now });
        run.window =
            if run.window == 0 || now.duration_since(run.last) > RUN_GAP { 1 } else { (run.window * 2).min(AHEAD_MAX) };
        run.last = now;
        run.window
    }
}

impl StatAhead {
    /// Whether to start a fetch of the next window in the background along with an ask of
    /// window `window` in `dir` (a run at full window, and none on its way there); if so,
    /// [`StatAhead::background_done`] must follow.
    pub(crate) fn background(&self, dir: Ino, window: usize) -> bool {
        window >= AHEAD_MAX && self.behind.lock().insert(dir)
    }

    pub(crate) fn background_done(&self, dir: Ino) {
        self.behind.lock().remove(&dir);
    }

    /// Up to `n` of `candidates` to fetch with an ask: those whose attribute lease does not
    /// hold (`ran_out` is `Some`: when it ran out, or `None` if never held), longest ago
    /// first.
    /// Names fetched ahead within [`RENEW_WITHIN`] before `now` are left out.
    pub(crate) fn pick(
        &self,
        candidates: Vec<(String, Ino)>,
        n: usize,
        ran_out: impl Fn(Ino) -> Option<Option<Instant>>,
        now: Instant,
    ) -> Vec<String> {
        let mut fetched = self.fetched.lock();
        let lately = |ino: &Ino| fetched.get(ino).is_some_and(|t| now.saturating_duration_since(*t) < RENEW_WITHIN);
        let mut out: Vec<(Option<Instant>, String, Ino)> = candidates
            .into_iter()
            .filter(|(_, ino)| !lately(ino))
            .filter_map(|(name, ino)| ran_out(ino).map(|t| (t, name, ino)))
            .collect();
        if out.len() > n {
            out.select_nth_unstable_by(n, |a, b| a.0.cmp(&b.0));
            out.truncate(n);
        }
        if fetched.len() + out.len() > MAX_FETCHED {
            fetched.retain(|_, t| now.saturating_duration_since(*t) < RENEW_WITHIN);
            if fetched.len() + out.len() > MAX_FETCHED {
                fetched.clear();
            }
        }
        out.into_iter()
            .map(|(_, name, ino)| {
                fetched.insert(ino, now);
                name
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_double_within_a_run_and_restart_after_a_gap() {
        let s = StatAhead::default();
        let t = Instant::now();
        let d = Ino(7);
        let w: Vec<usize> = (0..10).map(|i| s.window(d, t + Duration::from_millis(i))).collect();
        assert_eq!(w, [1, 2, 4, 8, 16, 32, 64, 128, 128, 128]);
        assert_eq!(s.window(Ino(8), t), 1, "another directory has its own run");
        assert_eq!(s.window(d, t + RUN_GAP * 3), 1, "a pause starts a new run");
    }

    #[test]
    fn candidates_whose_leases_ran_out_longest_ago_go_first() {
        let t = Instant::now();
        let c: Vec<(String, Ino)> = (1..=5).map(|i| (format!("n{i}"), Ino(i))).collect();
        // n1 holds a lease; n2 ran out last; n3 never held one; n4, n5 ran out earlier.
        let ran_out = |ino: Ino| match ino.0 {
            1 => None,
            2 => Some(Some(t + Duration::from_secs(9))),
            3 => Some(None),
            4 => Some(Some(t + Duration::from_secs(2))),
            _ => Some(Some(t + Duration::from_secs(1))),
        };
        let s = StatAhead::default();
        let mut got = s.pick(c.clone(), 3, ran_out, t);
        got.sort();
        assert_eq!(got, ["n3", "n4", "n5"]);
        // Fetched but still without a lease: not picked again soon, but later.
        assert_eq!(s.pick(c.clone(), 3, ran_out, t + Duration::from_millis(10)), ["n2"]);
        assert_eq!(s.pick(c, 1, ran_out, t + RENEW_WITHIN * 2), ["n3"]);
    }
}
