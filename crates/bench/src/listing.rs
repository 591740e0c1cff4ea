//! The md `list` phase's check: a listing of a benchmark directory holds every name the
//! benchmark made there exactly once, and nothing else.
//!
//! Who lists what (mdtest has no listing phase; this follows IO500's `find`, which reads
//! every directory of the tree once): with a directory per process each rank lists its own
//! directory; in a shared directory rank 0 alone lists it, once, and checks every rank's
//! names, so each entry is listed exactly once in the phase (as `ls` of a job's output
//! directory would), and the phase's rate is entries listed per second.

use crate::spec::{md_item_name, md_subdir_name, PhaseKind};
use anyhow::{bail, Result};
use std::ops::Range;

/// What the benchmark has made in its md directories so far (the phases run in the same
/// order on every rank, so every rank knows what the others made).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contents {
    /// The files `f.R.I` (create, until unlink).
    pub files: bool,
    /// The directories `dir.R.I` (mkdir, until rmdir).
    pub dirs: bool,
}

impl Contents {
    /// After a phase of `kind` has completed.
    pub fn after(&mut self, kind: PhaseKind) {
        match kind {
            PhaseKind::Create => self.files = true,
            PhaseKind::Unlink => self.files = false,
            PhaseKind::Mkdir => self.dirs = true,
            PhaseKind::Rmdir => self.dirs = false,
            _ => {}
        }
    }
}

/// The names expected in one listing, one bit each, ticked as the listing shows them.
pub struct Checklist {
    dir: String,
    ranks: Range<u64>,
    per_rank: u64,
    /// Bit `(rank − ranks.start) × per_rank + i` for item `i` of `rank`; `None` when that
    /// kind of item is not expected at all.
    files: Option<Vec<u64>>,
    dirs: Option<Vec<u64>>,
}

impl Checklist {
    /// `dir` (for messages) should hold items `0..per_rank` of every rank in `ranks`:
    /// files and directories as `contents` says.
    pub fn new(dir: &str, ranks: Range<u64>, per_rank: u64, contents: Contents) -> Checklist {
        let bits = (ranks.end.saturating_sub(ranks.start) * per_rank).div_ceil(64) as usize;
        Checklist {
            dir: dir.to_string(),
            ranks,
            per_rank,
            files: contents.files.then(|| vec![0; bits]),
            dirs: contents.dirs.then(|| vec![0; bits]),
        }
    }

    /// Names the listing should show.
    pub fn expected(&self) -> u64 {
        let each = (self.ranks.end.saturating_sub(self.ranks.start)) * self.per_rank;
        each * (self.files.is_some() as u64 + self.dirs.is_some() as u64)
    }

    /// The listing showed `name`: an error if the benchmark did not make it here, or if it
    /// was shown before.
    pub fn see(&mut self, name: &str) -> Result<()> {
        let (set, what) = if let Some(rest) = name.strip_prefix("f.") {
            (self.files.as_mut(), rest)
        } else if let Some(rest) = name.strip_prefix("dir.") {
            (self.dirs.as_mut(), rest)
        } else {
            (None, "")
        };
        let bit = match (set.is_some(), parse_item(what)) {
            (true, Some((rank, i))) if self.ranks.contains(&rank) && i < self.per_rank => {
                (rank - self.ranks.start) * self.per_rank + i
            }
            _ => bail!("the listing of {} shows {name:?}, which the benchmark did not make there", self.dir),
        };
        let set = set.expect("checked");
        let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
        if set[word] & mask != 0 {
            bail!("the listing of {} shows {name:?} twice", self.dir);
        }
        set[word] |= mask;
        Ok(())
    }

    /// After the whole listing: an error naming the first name it did not show, if any.
    pub fn finish(&self) -> Result<()> {
        let n = (self.ranks.end.saturating_sub(self.ranks.start)) * self.per_rank;
        for (set, name) in [(&self.files, md_item_name as fn(u64, u64) -> String), (&self.dirs, md_subdir_name)] {
            let Some(set) = set else { continue };
            let seen: u64 = set.iter().map(|w| w.count_ones() as u64).sum();
            if seen == n {
                continue;
            }
            let first = (0..n).find(|&b| set[(b / 64) as usize] & (1 << (b % 64)) == 0).expect("one is missing");
            let (rank, i) = (self.ranks.start + first / self.per_rank, first % self.per_rank);
            bail!(
                "the listing of {} misses {} of the {n} names the benchmark made there (the first: {:?})",
                self.dir,
                n - seen,
                name(rank, i)
            );
        }
        Ok(())
    }
}

/// "R.I" as written by [`md_item_name`]: two decimal numbers without sign or leading zeros.
fn parse_item(s: &str) -> Option<(u64, u64)> {
    let (r, i) = s.split_once('.')?;
    let num = |x: &str| {
        let canonical = !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()) && (x == "0" || !x.starts_with('0'));
        if canonical {
            x.parse::<u64>().ok()
        } else {
            None
        }
    };
    Some((num(r)?, num(i)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILES: Contents = Contents { files: true, dirs: false };

    #[test]
    fn every_name_once_passes() {
        let mut c = Checklist::new("/x", 0..3, 100, Contents { files: true, dirs: true });
        assert_eq!(c.expected(), 600);
        for r in (0..3).rev() {
            for i in 0..100 {
                c.see(&md_item_name(r, i)).unwrap();
                c.see(&md_subdir_name(r, i)).unwrap();
            }
        }
        c.finish().unwrap();
    }

    #[test]
    fn a_name_shown_twice_fails() {
        let mut c = Checklist::new("/x", 0..2, 5, FILES);
        c.see("f.1.3").unwrap();
        let e = c.see("f.1.3").unwrap_err().to_string();
        assert!(e.contains("\"f.1.3\" twice"), "{e}");
    }

    #[test]
    fn a_missing_name_fails_naming_the_first() {
        let mut c = Checklist::new("/d.00001", 1..2, 4, FILES);
        c.see("f.1.0").unwrap();
        c.see("f.1.3").unwrap();
        let e = c.finish().unwrap_err().to_string();
        assert!(e.contains("misses 2 of the 4 names") && e.contains("\"f.1.1\""), "{e}");
    }

    #[test]
    fn a_name_the_benchmark_did_not_make_fails() {
        let mut c = Checklist::new("/x", 1..2, 4, FILES);
        for bad in ["f.0.1", "f.1.4", "f.1.01", "f.+1.1", "f.1", "zz", "dir.1.0", "f.1.1.1"] {
            let e = c.see(bad).unwrap_err().to_string();
            assert!(e.contains("did not make there"), "{bad}: {e}");
        }
        // Nothing expected: an empty listing passes, any name fails.
        let mut none = Checklist::new("/x", 0..4, 10, Contents::default());
        assert_eq!(none.expected(), 0);
        none.finish().unwrap();
        assert!(none.see("f.0.0").is_err());
    }

    #[test]
    fn contents_follow_the_phases() {
        let mut c = Contents::default();
        for (k, want) in [
            (PhaseKind::Mkdir, (false, true)),
            (PhaseKind::Create, (true, true)),
            (PhaseKind::List, (true, true)),
            (PhaseKind::Stat, (true, true)),
            (PhaseKind::Unlink, (false, true)),
            (PhaseKind::Rmdir, (false, false)),
        ] {
            c.after(k);
            assert_eq!((c.files, c.dirs), want, "{k:?}");
        }
    }
}
