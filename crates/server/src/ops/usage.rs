//! `Usage` (docs/du.md): one page of this server's per-directory usage (`store::usage`),
//! joined with the directories whose inodes it holds.
//!
//! The page walks the `D` (directories held here) and `U` (usage held here) records
//! together in directory order from where the previous one stopped. For a directory held
//! here the row gives its parent and whether the caller may read and search it; its counts
//! go only to a caller who may (as `du` counts only what it can list). A directory known
//! here only by its usage is shown to a caller who may read and search it, judged from its
//! attributes held here (a partition's copy) or asked of its home; root sees everything.

use crate::error::R;
use crate::ops::find::directory;
use crate::perm::{allowed, is_root, Owner, R_OK, X_OK};
use crate::state::State;
use crate::store::meta::{decode, key, Usage};
use futures::StreamExt;
use shoal_proto::msg::{Cred, Reply};
use shoal_proto::usage::{UsagePage, UsageRow, USAGE_PAGE_MAX};
use shoal_proto::Ino;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Homes asked at once for the attributes of directories known here only by their usage.
const ASK_AT_ONCE: usize = 32;

/// What this server knows of one directory.
#[derive(Default)]
struct Known {
    /// Its inode is here: its parent and its owner.
    held: Option<(Ino, Owner)>,
    usage: Usage,
}

pub async fn usage(st: &Arc<State>, cred: Cred, after: Option<Ino>, limit: u32) -> R<Reply> {
    let limit = if limit == 0 { USAGE_PAGE_MAX } else { limit.min(USAGE_PAGE_MAX) } as usize;
    let c2 = cred.clone();
    let (known, next) = st.blocking(move |st| scan(st, after, limit)).await?;
    let mut rows = Vec::with_capacity(known.len());
    let mut ask = Vec::new();
    for (dir, k) in known {
        let (held, shown) = match k.held {
            Some((parent, owner)) => (Some(parent), allowed(&c2, &owner, R_OK | X_OK)),
            None if k.usage.is_zero() => continue,
            None => {
                if !is_root(&c2) {
                    ask.push((rows.len(), dir));
                }
                (None, true)
            }
        };
        rows.push(row(dir, held, shown, &k.usage));
    }
    // Directories known here only by their usage, for a caller other than root: shown only
    // when their attributes, held here or at their home, let the caller read them.
    let verdicts: Vec<(usize, bool)> = futures::stream::iter(ask)
        .map(|(at, dir)| {
            let cred = &cred;
            async move { (at, may_read(st, cred, dir).await) }
        })
        .buffer_unordered(ASK_AT_ONCE)
        .collect()
        .await;
    let hidden: std::collections::HashSet<usize> = verdicts.into_iter().filter(|v| !v.1).map(|v| v.0).collect();
    let rows = rows.into_iter().enumerate().filter(|(i, _)| !hidden.contains(i)).map(|(_, r)| r).collect();
    Ok(Reply::Usage(UsagePage { rows, next }))
}

/// A row: the counts only for a caller who may read the directory.
fn row(dir: Ino, parent: Option<Ino>, shown: bool, u: &Usage) -> UsageRow {
    let n = |v: i64| if shown { v.max(0) as u64 } else { 0 };
    UsageRow { dir, parent, readable: parent.is_some() && shown, files: n(u.files), dirs: n(u.dirs), bytes: n(u.bytes) }
}

async fn may_read(st: &Arc<State>, cred: &Cred, dir: Ino) -> bool {
    let s2 = st.clone();
    let here = st.blocking(move |_| Ok(directory(&s2, dir))).await.ok().flatten();
    let owner = match here {
        Some(rec) => rec.owner(),
        None => match st.getattr(dir).await {
            Ok(a) => Owner { uid: a.uid, gid: a.gid, perm: a.perm, kind: a.kind },
            // Gone since (its usage is what is left of it), or unreachable: not shown.
            Err(_) => return false,
        },
    };
    allowed(cred, &owner, R_OK | X_OK)
}

/// The directories after `after` that this server holds the inode or usage of, at most
/// `limit`, in order, and where the next page starts.
fn scan(st: &State, after: Option<Ino>, limit: usize) -> R<(BTreeMap<Ino, Known>, Option<Ino>)> {
    let from = match after {
        None => 0,
        Some(Ino(u64::MAX)) => return Ok((BTreeMap::new(), None)),
        Some(a) => a.0 + 1,
    };
    let mut known: BTreeMap<Ino, Known> = BTreeMap::new();
    // Each scan stops after `limit` records; rows past the first one to stop may be
    // missing the other's half, so the page ends there.
    let mut end: Option<Ino> = None;
    let mut held = 0;
    st.meta.scan(&[key::DIR_INDEX], Some(&key::dir_index(Ino(from))), |k, _| {
        let Some(dir) = key::number(k).map(Ino) else { return Ok(true) };
        if held == limit {
            end = Some(end.map_or(dir, |e: Ino| e.min(dir)));
            return Ok(false);
        }
        held += 1;
        known.entry(dir).or_default();
        Ok(true)
    })?;
    let mut counted = 0;
    st.meta.scan(&[key::USAGE], Some(&key::usage(Ino(from))), |k, v| {
        let Some(dir) = key::number(k).map(Ino) else { return Ok(true) };
        if counted == limit || end.is_some_and(|e| dir >= e) {
            end = Some(end.map_or(dir, |e: Ino| e.min(dir)));
            return Ok(false);
        }
        counted += 1;
        known.entry(dir).or_default().usage = decode(&format_args!("usage of {dir}"), v)?;
        Ok(true)
    })?;
    // Keep what comes before the end, at most `limit` rows.
    if let Some(e) = end {
        known.retain(|d, _| *d < e);
    }
    while known.len() > limit {
        let last = *known.keys().next_back().expect("not empty");
        known.remove(&last);
        end = Some(last);
    }
    for (dir, k) in known.iter_mut() {
        if let Some(rec) = st.meta.get_inode(*dir)? {
            k.held = Some((rec.parent.unwrap_or(*dir), rec.owner()));
        }
    }
    // The next page starts after the last row given (`end` itself is not given).
    let next = end.map(|_| known.keys().next_back().copied().unwrap_or(Ino(from.saturating_sub(1))));
    Ok((known, next))
}
