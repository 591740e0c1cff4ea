//! Splitting a directory partition (GIGA+), and the peer steps of split directories
//! (docs/architecture.md, "Split directories"; `partitions.rs` for what a server holds).
//!
//! A split of partition `p` at depth `d` held here, to new partition `c = p | 1 << d` on
//! `partition_home(dir, c)`, is an operation on the step engine:
//!
//! 1. intent `Split { dir, index: p, depth: d }`, and the moving half of `p` (the names with
//!    hash bit `d`) frozen — both with the directory's stripe locked, so no mutation of this
//!    server is between its placement check and its commit;
//! 2. step `split.in`: `PeerSplitIn` hands the moving entries and the directory's attributes
//!    to the new partition's server (applied at most once per op id there, so a step resent
//!    after a crash never overwrites what that server changed since);
//! 3. step `split.register`: `PeerAddPartition` adds `c` to the bitmap on the directory's
//!    home — before this server stops answering for the moved names, so that anyone sent
//!    away from here (with the home's bitmap) finds them at the first try;
//! 4. finish: the moved entries go, `p` is one deeper, the intent goes, the freeze ends.
//!
//! Always rolled forward (nothing to undo once step 2 may have happened). Moved entries keep
//! their inodes where they are: an inode number says where its inode lives and never
//! changes, so only entries made after the split have their inode with them.

use crate::error::{fail, Fail, R};
use crate::ops::*;
use crate::partitions::{range_of, Placed};
use crate::state::{derive_op, State};
use crate::steps;
use crate::steps::engine::{self, unknown, Ctx, End};
use crate::store::meta::{EntryRecord, InodeRecord, Intent, PartitionRecord};
use shoal_placement::{key_range, should_split, split_child, Bitmap, SPLIT_ENTRIES};
use shoal_proto::msg::{Attr, DirEntry, FileKind, Op, PartRef, Reply};
use shoal_proto::{Errno, Ino, ServerId};
use std::sync::Arc;

/// Placeable servers: the split policy's cluster size.
fn servers(st: &State) -> u32 {
    st.map.placeable().count() as u32
}

/// An entry was added to partition `part` of `dir` here (and committed): count it, and split
/// the partition in the background if the policy says so. Cheap when the partition is at
/// its target depth (nothing to count).
pub fn after_insert(st: &Arc<State>, dir: Ino, part: PartRef) {
    let n = servers(st);
    if part.depth >= shoal_placement::target_depth(n) {
        return;
    }
    let range = range_of(part);
    let count = match st.parts.inserted(dir, part, || st.meta.count_entries(dir, range, SPLIT_ENTRIES)) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("counting the entries of directory {dir}: {e}");
            return;
        }
    };
    if !should_split(count, part.depth, n) || !st.parts.claim_split(dir) {
        return;
    }
    let st = st.clone();
    tokio::spawn(async move {
        if let Err(e) = start(&st, dir, part).await {
            tracing::info!("split of directory {dir} partition {} not done: {e}", part.index);
        }
        st.parts.release_split(dir);
    });
}

/// The directory's attributes here: its inode on the home, the partition records' copy
/// elsewhere.
pub fn dir_attrs(st: &State, txn: &mut crate::store::meta::Txn<'_>, dir: Ino) -> R<InodeRecord> {
    if st.is_home(dir) {
        return Ok(txn.dir(dir)?.clone());
    }
    st.parts.attrs(dir).ok_or_else(|| crate::partitions::misrouted(dir))
}

/// Start splitting `part` of `dir` if it is still due: the intent and the freeze, then the
/// steps.
async fn start(st: &Arc<State>, dir: Ino, part: PartRef) -> R<()> {
    let op_id = st.new_op_id();
    let _active = st.activate(op_id);
    {
        let _g = st.locks.lock(&[dir]).await;
        // Still as it was, still due, and nothing in flight on the names that would move.
        let hash_of_part = u64::from(part.index);
        if st.parts.place(dir, st.is_home(dir), hash_of_part) != Placed::Here(part) {
            return Ok(());
        }
        let moving = |name: &str| {
            let h = shoal_placement::name_hash(name);
            crate::partitions::Partitions::in_part(h, part) && shoal_placement::moves_on_split(h, part.depth)
        };
        if st.locks.pinned_names(dir).iter().any(|n| moving(n)) {
            return Ok(());
        }
        let (index, depth) = (part.index, part.depth);
        let n = servers(st);
        let attrs = st
            .store(move |st| {
                let count = st.meta.count_entries(dir, range_of(part), SPLIT_ENTRIES)?;
                if !should_split(count, depth, n) {
                    return Ok(None);
                }
                let mut txn = st.meta.txn();
                let attrs = dir_attrs(st, &mut txn, dir)?;
                txn.put_intent(op_id, Intent::Split { dir, index, depth }, now().secs);
                txn.commit()?;
                Ok(Some(attrs))
            })
            .await?;
        let Some(attrs) = attrs else { return Ok(()) };
        st.parts.freeze(dir, index, depth, &attrs);
    }
    steps::drive(st, op_id, &Intent::Split { dir, index: part.index, depth: part.depth }, Ctx::default())
        .await
        .map(|_| ())
}

/// Drive a `Split` intent (module doc). The moving half is frozen already: by [`start`],
/// or at start-up for an intent found then (`intents::pin_pending`).
pub async fn resume(st: &Arc<State>, op_id: u64, dir: Ino, index: u32, depth: u32) -> End {
    let Some(child) = split_child(index, depth) else {
        // Cannot be written by `start`; drop it rather than retry forever.
        st.parts.unfreeze(dir);
        return match delete_intent(st, op_id).await {
            Ok(()) => End::Refused(Fail::corrupt(format!("split intent of {dir} partition {index} at depth {depth}"))),
            Err(f) => End::Kept(f),
        };
    };
    let target = st.map.partition_home(dir, child);
    let moved = PartRef { index: child, depth: depth + 1 };
    let local = target == st.id;
    let gathered = st
        .store(move |st| {
            let mut txn = st.meta.txn();
            let attrs = dir_attrs(st, &mut txn, dir)?;
            let entries = if local { Vec::new() } else { st.meta.entries_in(dir, range_of(moved))? };
            Ok((attrs, entries))
        })
        .await;
    let (attrs, entries) = match gathered {
        Ok(g) => g,
        // The directory is gone (removed meanwhile): nothing to split.
        Err(f) if f.errno == Errno::ENOENT => {
            st.parts.unfreeze(dir);
            return match delete_intent(st, op_id).await {
                Ok(()) => End::Refused(f),
                Err(f) => End::Kept(f),
            };
        }
        Err(f) => return End::Kept(f),
    };
    if !local {
        let step = Op::PeerSplitIn {
            dir,
            index: child,
            depth: depth + 1,
            attr: attrs.to_attr(dir, 0),
            entries,
            op_id: derive_op(op_id, 1),
        };
        match engine::remote(st, "split", "in", target, None, step).await {
            Ok(_) => {}
            Err(e) if unknown(e) => return End::Kept(Fail::peer(target, e)),
            // A clear refusal (no room, say): the new partition was not made, nothing moved.
            Err(e) => {
                st.parts.unfreeze(dir);
                return match delete_intent(st, op_id).await {
                    Ok(()) => End::Refused(Fail::peer(target, e)),
                    Err(f) => End::Kept(f),
                };
            }
        }
    }
    let home = st.home(dir);
    if let Err(e) =
        engine::remote(st, "split", "register", home, None, Op::PeerAddPartition { dir, index: child }).await
    {
        // The new partition may hold entries already: only forward from here.
        return End::Kept(Fail::peer(home, e));
    }
    let finished = engine::finish("split", async {
        let _g = st.locks.lock(&[dir]).await;
        let a2 = attrs.clone();
        st.store(move |st| {
            let mut txn = st.meta.txn();
            txn.reshaping();
            if !local {
                for e in st.meta.entries_in(dir, range_of(moved))? {
                    txn.delete_entry(dir, &e.name);
                }
            }
            let sealed = txn.partition(dir, index)?.is_some_and(|p| p.sealed);
            txn.put_partition(dir, index, &PartitionRecord { depth: depth + 1, sealed, dir: a2.clone() });
            if local {
                txn.put_partition(dir, child, &PartitionRecord { depth: depth + 1, sealed, dir: a2 });
            }
            txn.delete_intent(op_id);
            txn.commit()
        })
        .await?;
        if local {
            st.parts.add(dir, child, depth + 1, &attrs);
        }
        st.parts.split_done(dir, index, depth);
        // A lease granted from now on must name the new depth: a read routed before
        // `split_done` (with the old, wider partition) may not be granted one.
        if let Some(leases) = st.meta.leases() {
            drop(leases.reshaping(&[shoal_proto::lease::LeaseKey::dir(dir)]));
        }
        Ok(())
    })
    .await;
    match finished {
        Ok(()) => {
            tracing::debug!("directory {dir}: partition {index} split at depth {depth}, {child} on server {target}");
            End::Done(Reply::Ok)
        }
        Err(f) => End::Kept(f),
    }
}

/// `PeerSplitIn`: partition `index` of `dir` at `depth`, with `entries`, is now held here.
pub async fn split_in(
    st: &Arc<State>,
    dir: Ino,
    index: u32,
    depth: u32,
    attr: Attr,
    entries: Vec<DirEntry>,
    op_id: u64,
) -> R<Reply> {
    if attr.ino != dir || attr.kind != FileKind::Dir {
        return fail(Errno::EINVAL, format!("PeerSplitIn of {dir} with the attributes of {}", attr.ino));
    }
    let (lo, hi) = key_range(index, depth);
    if let Some(e) = entries.iter().find(|e| {
        let k = shoal_placement::listing_key(shoal_placement::name_hash(&e.name));
        k < lo || k > hi
    }) {
        return fail(Errno::EINVAL, format!("PeerSplitIn of {dir} partition {index}: {:?} is not in it", e.name));
    }
    let attrs = InodeRecord::from_attr(&attr);
    let a2 = attrs.clone();
    st.store(move |st| {
        if st.meta.get_applied(op_id)?.is_some() {
            return Ok(());
        }
        let mut txn = st.meta.txn();
        txn.reshaping();
        txn.put_partition(dir, index, &PartitionRecord { depth, sealed: false, dir: a2 });
        for e in &entries {
            txn.put_entry(dir, &e.name, EntryRecord { ino: e.ino, kind: e.kind });
        }
        txn.put_applied(op_id, &Reply::Ok, now().secs)?;
        txn.commit()
    })
    .await?;
    // The receiving side's failpoint: the partition is stored, the coordinator not told.
    crate::steps::failpoints::point("split_in", "commit", crate::steps::failpoints::At::After);
    st.parts.add(dir, index, depth, &attrs);
    Ok(Reply::Ok)
}

/// Send step `op` of operation `op_name` about name `name` of directory `dir` to the server
/// holding the name's partition: this one when it holds it, otherwise the one the bitmap
/// learnt of `dir` says (unsplit when none), learning from `Partitions` answers — at most 4
/// tries (the second is right unless the directory keeps splitting). Returns the server
/// last asked and its answer.
pub async fn send_to_entry(
    st: &Arc<State>,
    op_name: &str,
    step: &str,
    dir: Ino,
    name: &str,
    cred: Option<&shoal_proto::msg::Cred>,
    op: Op,
) -> (ServerId, Result<Reply, Errno>) {
    let hash = shoal_placement::name_hash(name);
    let mut server = st.id;
    for _ in 0..4 {
        server = match st.parts.place(dir, st.is_home(dir), hash) {
            Placed::Elsewhere => st.map.entry_home(dir, &st.parts.learnt(dir), name).1,
            _ => st.id,
        };
        match engine::remote(st, op_name, step, server, cred, op.clone()).await {
            Ok(Reply::Partitions { dir: d, bitmap }) => st.parts.learn(d, bitmap),
            other => return (server, other),
        }
    }
    (server, Err(Errno::EIO))
}

/// The bitmap of `dir`, homed here, as stored in its inode (an unsplit directory: partition
/// 0 only).
fn bitmap_of(rec: &InodeRecord) -> R<Bitmap> {
    if rec.bitmap.is_empty() {
        return Ok(Bitmap::new());
    }
    Bitmap::try_from(rec.bitmap.clone()).map_err(|e| Fail::corrupt(format!("partition bitmap: {e}")))
}

/// `PeerAddPartition`: partition `index` of `dir` (homed here) exists.
pub async fn add_partition(st: &Arc<State>, dir: Ino, index: u32) -> R<Reply> {
    st.require_home(dir)?;
    let _g = st.locks.lock(&[dir]).await;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let rec = txn.dir(dir)?.clone();
        let mut bitmap = bitmap_of(&rec)?;
        if !bitmap.contains(index) {
            bitmap.insert(index).map_err(|e| Fail::new(Errno::EINVAL, format!("directory {dir}: {e}")))?;
            txn.inode_mut(dir)?.bitmap = bitmap.clone().into();
            txn.commit()?;
        }
        Ok(Reply::Partitions { dir, bitmap: bitmap.into() })
    })
    .await
}

/// `PeerPartitions`: the bitmap of `dir`, homed here.
pub async fn partitions(st: &Arc<State>, dir: Ino) -> R<Reply> {
    st.require_home(dir)?;
    st.store(move |st| {
        let mut txn = st.meta.txn();
        let bitmap = bitmap_of(txn.dir(dir)?)?;
        Ok(Reply::Partitions { dir, bitmap: bitmap.into() })
    })
    .await
}

/// The answer to a request misrouted for `dir`: the home's bitmap, asked of the home when
/// that is another server. Counted (`Status`: `misrouted`).
pub async fn misrouted_reply(st: &Arc<State>, dir: Ino) -> Reply {
    st.counters.misrouted();
    // A client of before split directories could not decode the answer: tell it why instead.
    if crate::leases::Leases::caller().is_some_and(|c| !c.partitions) {
        return Fail::new(
            Errno::ENOTSUP,
            format!("directory {dir} is split over servers, which this client does not support (protocol 6 with FEATURE_PARTITIONS needed)"),
        )
        .into_reply();
    }
    let home = st.home(dir);
    let r = if home == st.id {
        partitions(st, dir).await
    } else {
        match st.peer(home, Op::PeerPartitions { dir }).await {
            Ok(r @ Reply::Partitions { .. }) => Ok(r),
            Ok(other) => Err(Fail::new(Errno::EIO, format!("server {home} answered PeerPartitions with {other:?}"))),
            Err(e) => Err(Fail::peer(home, e)),
        }
    };
    r.unwrap_or_else(Fail::into_reply)
}

/// The servers other than this one holding partitions of `dir` (homed here), by its bitmap.
async fn partition_servers(st: &Arc<State>, dir: Ino) -> R<Vec<ServerId>> {
    let bitmap = st.store(move |st| bitmap_of(st.meta.txn().dir(dir)?)).await?;
    let mut servers: Vec<ServerId> =
        bitmap.partitions().map(|i| st.map.partition_home(dir, i)).filter(|&s| s != st.id).collect();
    servers.sort_unstable();
    servers.dedup();
    Ok(servers)
}

/// Remove split directory `dir` (homed here) if it is empty everywhere: seal its partitions
/// on the other servers (each refuses with ENOTEMPTY if it holds an entry), check this
/// server's, remove the inode and this server's partition records in one batch, then drop
/// the others' partitions. ENOTEMPTY unseals what was sealed. Sent again after a crash (the
/// parent's `Rmdir` intent is rolled forward), every step is idempotent.
pub async fn remove_split_dir(st: &Arc<State>, dir: Ino) -> R<Reply> {
    let servers = partition_servers(st, dir).await?;
    let seal = |seal: bool, drop: bool| Op::PeerSealPartitions { dir, seal, drop };
    let mut sealed = Vec::new();
    let mut refusal = None;
    for &s in &servers {
        match st.peer(s, seal(true, false)).await {
            Ok(_) => sealed.push(s),
            Err(e) => {
                refusal = Some(Fail::peer(s, e));
                break;
            }
        }
    }
    if refusal.is_none() {
        let removed = {
            let _g = st.locks.lock(&[dir]).await;
            let pinned = !st.locks.pinned_names(dir).is_empty();
            st.store(move |st| {
                if pinned || st.meta.has_entries(dir)? {
                    return fail(Errno::ENOTEMPTY, format!("directory {dir} is not empty"));
                }
                let mut txn = st.meta.txn();
                if txn.inode(dir)?.is_some() {
                    txn.remove_inode(dir)?;
                }
                for (index, _) in st.parts.parts_of(dir) {
                    txn.delete_partition(dir, index);
                }
                txn.commit()
            })
            .await
        };
        match removed {
            Ok(()) => {
                st.parts.drop_dir(dir);
                for &s in &servers {
                    if let Err(e) = st.peer(s, seal(false, true)).await {
                        // Left sealed there (names wait, then EBUSY) until the parent's
                        // intent sends the removal again.
                        return Err(Fail::peer(s, e));
                    }
                }
                return Ok(Reply::Ok);
            }
            Err(f) => refusal = Some(f),
        }
    }
    for s in sealed {
        if let Err(e) = st.peer(s, seal(false, false)).await {
            tracing::warn!("unsealing directory {dir} on server {s}: {e}");
        }
    }
    Err(refusal.unwrap_or_else(|| Fail::new(Errno::EIO, "rmdir of a split directory")))
}

/// `PeerSealPartitions` (module doc of `remove_split_dir`).
pub async fn seal(st: &Arc<State>, dir: Ino, seal: bool, drop: bool) -> R<Reply> {
    let _g = st.locks.lock(&[dir]).await;
    let parts = st.parts.parts_of(dir);
    if drop {
        st.store(move |st| {
            if st.meta.has_entries(dir)? {
                return fail(Errno::ENOTEMPTY, format!("directory {dir} is not empty here"));
            }
            let mut txn = st.meta.txn();
            for (index, _) in &parts {
                txn.delete_partition(dir, *index);
            }
            txn.commit()
        })
        .await?;
        st.parts.drop_dir(dir);
        return Ok(Reply::Ok);
    }
    if seal && !st.locks.pinned_names(dir).is_empty() {
        return fail(Errno::ENOTEMPTY, format!("directory {dir}: a name is being added here"));
    }
    st.store(move |st| {
        if seal && st.meta.has_entries(dir)? {
            return fail(Errno::ENOTEMPTY, format!("directory {dir} is not empty"));
        }
        let mut txn = st.meta.txn();
        for (index, _) in &parts {
            if let Some(mut p) = txn.partition(dir, *index)? {
                p.sealed = seal;
                txn.put_partition(dir, *index, &p);
            }
        }
        txn.commit()
    })
    .await?;
    st.parts.set_sealed(dir, seal);
    Ok(Reply::Ok)
}

/// `PeerPartitionAttr`: the directory's attributes changed on its home.
pub async fn partition_attr(st: &Arc<State>, attr: Attr) -> R<Reply> {
    let dir = attr.ino;
    let _g = st.locks.lock(&[dir]).await;
    let rec = InodeRecord::from_attr(&attr);
    let parts = st.parts.parts_of(dir);
    let r2 = rec.clone();
    st.store(move |st| {
        let mut txn = st.meta.txn();
        for (index, _) in &parts {
            if let Some(mut p) = txn.partition(dir, *index)? {
                p.dir = r2.clone();
                txn.put_partition(dir, *index, &p);
            }
        }
        txn.commit()
    })
    .await?;
    st.parts.set_attrs(dir, &rec);
    Ok(Reply::Ok)
}

/// Send split directory `dir`'s new attributes (homed here) to the other servers holding its
/// partitions (after a setattr committed here; the `PartitionAttr` intent written with it
/// makes recovery send them again if this does not get through).
pub async fn resume_partition_attr(st: &Arc<State>, op_id: u64, dir: Ino) -> End {
    let attr = match st.store(move |st| Ok(st.meta.txn().inode(dir)?.cloned())).await {
        Ok(Some(rec)) => rec.to_attr(dir, 0),
        Ok(None) => {
            return match delete_intent(st, op_id).await {
                Ok(()) => End::Done(Reply::Ok),
                Err(f) => End::Kept(f),
            }
        }
        Err(f) => return End::Kept(f),
    };
    let servers = match partition_servers(st, dir).await {
        Ok(s) => s,
        Err(f) => return End::Kept(f),
    };
    for s in servers {
        if let Err(e) =
            engine::remote(st, "setattr", "partitions", s, None, Op::PeerPartitionAttr { attr: attr.clone() }).await
        {
            return End::Kept(Fail::peer(s, e));
        }
    }
    match engine::finish("setattr", delete_intent(st, op_id)).await {
        Ok(()) => End::Done(Reply::Ok),
        Err(f) => End::Kept(f),
    }
}
