//! Namespace operations, run at the home server of the directory named in the request.
//!
//! One file per operation. Single-server cases (the common ones: a file's inode sits with
//! its entry) are one locked check and one RocksDB batch. Cases that span servers write an
//! intent (pinning the entry) and hand it to the step engine (`crate::steps`), which runs
//! the operation's `resume` — its remote steps, without holding locks, then the finishing
//! batch that deletes the intent. The recovery loop drives leftover intents through the
//! same `resume`, so each operation's cross-server logic exists once.

mod create;
pub(crate) mod link;
mod lookup;
pub(crate) mod mkdir;
mod readdir;
pub(crate) mod rename;
mod rename_in;
pub(crate) mod rmdir;
pub(crate) mod split;
mod symlink;
pub(crate) mod unlink;

pub use create::create;
pub use link::link;
pub use lookup::lookup;
pub use mkdir::mkdir;
pub use readdir::readdir;
pub use rename::rename;
pub use rename_in::peer_rename_in;
pub use rmdir::{finish_rmdir, rmdir};
pub use symlink::symlink;
pub use unlink::{keeper, unlink, unlink_intent};

use super::*;
use crate::error::{Fail, R};
use crate::locks::Guard;
use crate::partitions::{misrouted, Partitions, Placed};
use crate::perm::{self, S_ISGID, W_OK, X_OK};
use crate::state::State;
use crate::store::meta::{InodeRecord, Txn};
use shoal_proto::msg::{Cred, EntryOut, FileKind, PartRef, Reply, Timestamp};
use shoal_proto::{Errno, Ino};
use std::time::Duration;

/// How often a check-lock-recheck loop may find its snapshot outdated before giving up.
pub(super) const ATTEMPTS: usize = 16;
/// How long `PeerRenameIn` waits for a pinned destination name before answering EBUSY
/// (the coordinator then backs off and retries; see `rename_cross`).
pub(super) const RENAME_IN_PIN_WAIT: Duration = Duration::from_millis(20);

pub(super) fn entry_reply(ino: Ino, rec: &InodeRecord) -> Reply {
    Reply::Entry(EntryOut { ino, kind: rec.kind, attr: Some(rec.to_attr(ino, 0)), cap: None, attr_lease: None })
}

pub(super) fn no_entry(dir: Ino, name: &str) -> Fail {
    Fail::new(Errno::ENOENT, format!("no entry {name:?} in directory {dir}"))
}

pub(super) fn exists(dir: Ino, name: &str) -> Fail {
    Fail::new(Errno::EEXIST, format!("{name:?} already exists in directory {dir}"))
}

pub(super) fn busy() -> Fail {
    Fail::new(Errno::EBUSY, "the directory kept changing during the operation; try again")
}

/// Group and mode of a new inode in `parent`: a set-group-id directory passes on its group
/// (and, to subdirectories, the bit itself); a non-member cannot create a set-group-id file.
pub(super) fn inherit(cred: &Cred, parent: &InodeRecord, perm: u32, kind: FileKind) -> (u32, u32) {
    let mut perm = perm & 0o7777;
    let gid = if parent.perm & S_ISGID != 0 {
        if kind == FileKind::Dir {
            perm |= S_ISGID;
        }
        parent.gid
    } else {
        cred.gid
    };
    if kind != FileKind::Dir && perm & S_ISGID != 0 && cred.uid != 0 && !cred.in_group(gid) {
        perm &= !S_ISGID;
    }
    (gid, perm)
}

pub(crate) fn new_inode(
    kind: FileKind,
    perm: u32,
    uid: u32,
    gid: u32,
    now: shoal_proto::msg::Timestamp,
) -> InodeRecord {
    InodeRecord {
        kind,
        perm,
        uid,
        gid,
        size: 0,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        atime: now,
        mtime: now,
        ctime: now,
        layout: None,
        dir_default: None,
        parent: None,
        target: None,
        bitmap: Vec::new(),
        read_mostly: false,
    }
}

/// Check W+X on a directory for a change of its entries.
pub(super) fn may_change(cred: &Cred, dir: Ino, rec: &InodeRecord) -> R<()> {
    perm::check(cred, &rec.owner(), W_OK | X_OK).map_err(|e| denied(e, format_args!("directory {dir}")))
}

/// Lock `inos`' stripes once `names` are free of other operations' pins
/// (`Locks::lock_names`), with `name` of `dir` routed to its partition here
/// (`partitions.rs`): the partition. A name in the moving half of a partition splitting here,
/// or (when `adding` it) in a sealed partition, waits for that to end (at most the pin wait,
/// then EBUSY); a name held by another server fails `misrouted`.
pub(super) async fn lock_entry<'a>(
    st: &'a State,
    dir: Ino,
    name: &str,
    adding: bool,
    inos: &[Ino],
    names: &[(Ino, &str)],
    owner: u64,
) -> R<(Guard<'a>, PartRef)> {
    let hash = shoal_placement::name_hash(name);
    let home = st.is_home(dir);
    let deadline = Partitions::deadline();
    let blocked = |p: Placed| matches!(p, Placed::Frozen) || (adding && matches!(p, Placed::Sealed(_)));
    loop {
        let g = st.locks.lock_names(inos, names, owner).await?;
        match st.parts.place(dir, home, hash) {
            Placed::Elsewhere => return Err(misrouted(dir)),
            p if blocked(p) => {
                drop(g);
                st.parts.wait_changed(dir, deadline, || blocked(st.parts.place(dir, home, hash))).await?;
            }
            Placed::Here(part) | Placed::Sealed(part) => return Ok((g, part)),
            Placed::Frozen => unreachable!("a frozen name is blocked"),
        }
    }
}

/// Route a read of `name` of `dir` (a lookup): the partition here holding it and the
/// partitions' generation to compare after the read (`partitions.rs`). Waits for a split of
/// the name's half; a name held by another server fails `misrouted`.
pub(super) async fn route_read(st: &State, dir: Ino, name: &str) -> R<(PartRef, u64)> {
    let hash = shoal_placement::name_hash(name);
    let home = st.is_home(dir);
    let deadline = Partitions::deadline();
    loop {
        let gen = st.parts.generation();
        match st.parts.place(dir, home, hash) {
            Placed::Elsewhere => return Err(misrouted(dir)),
            Placed::Frozen => {
                st.parts.wait_changed(dir, deadline, || st.parts.place(dir, home, hash) == Placed::Frozen).await?
            }
            Placed::Here(part) | Placed::Sealed(part) => return Ok((part, gen)),
        }
    }
}

/// The directory's own record follows a change of its entries made here: its times, and its
/// link count by `subdirs` (+1 or -1 for a subdirectory made or removed). Only on the
/// directory's home: a partition of a split directory on another server has no inode to
/// change (docs/architecture.md, "Split directories": the times are the home's, the link
/// count is reported as 1).
pub(super) fn dir_changed(st: &State, txn: &mut Txn<'_>, dir: Ino, now: Timestamp, subdirs: i32) -> R<()> {
    if !st.is_home(dir) {
        return Ok(());
    }
    if subdirs > 0 {
        dir_nlink_inc(txn, dir)?;
    } else if subdirs < 0 {
        dir_nlink_dec(txn, dir)?;
    }
    txn.inode_mut(dir)?.touch(now);
    Ok(())
}

/// The attributes of directory `dir` to check a change or a read of its entries here against
/// (its inode on the home, the partitions' copy elsewhere).
pub(super) fn parent_of(st: &State, txn: &mut Txn<'_>, dir: Ino) -> R<InodeRecord> {
    split::dir_attrs(st, txn, dir)
}

/// Inodes whose stripes an unlink-like step locks: the directory, and the entry's inode if
/// it is expected here.
pub(super) fn stripe_set(st: &State, dir: Ino, child: Option<Ino>) -> Vec<Ino> {
    let mut inos = vec![dir];
    inos.extend(child.filter(|&c| st.is_home(c)));
    inos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setgid_directories_pass_on_their_group() {
        let t = shoal_proto::msg::Timestamp::default();
        let mut parent = new_inode(FileKind::Dir, 0o2775, 0, 50, t);
        let alice = Cred { uid: 1000, gid: 1000, groups: vec![] };
        assert_eq!(inherit(&alice, &parent, 0o755, FileKind::Dir), (50, 0o2755));
        // a file may not keep setgid for a group its creator is not in
        assert_eq!(inherit(&alice, &parent, 0o2755, FileKind::File), (50, 0o755));
        parent.perm = 0o755;
        assert_eq!(inherit(&alice, &parent, 0o40755, FileKind::File), (1000, 0o755));
    }
}
