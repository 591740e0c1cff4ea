//! The change log (docs/changes.md): `Changes` reads this server's events after a cursor,
//! `ChangeAck` keeps a consumer's cursor; and the events the namespace and inode
//! operations log (`entry`, `rename`, `inode`).
//!
//! Records (`store/meta.rs`): `C` seq holds an event, numbered from 1 without gap in
//! commit order by `MetaStore::commit`, in the batch of the change it records: the log
//! holds exactly what was committed, across `kill -9`, and is mirrored with the rest of the
//! store. `K` name holds a consumer's last acknowledged event.
//!
//! Invariants: the log keeps every event after the oldest consumer's cursor, up to
//! [`KEPT_MAX`], and at least the newest [`KEPT`]; older ones are dropped, 1,024 numbers at
//! a time ([`prune`]). A page is read only after the commits it shows reached the OS
//! (`flush_wal_to_os`), so an event a watcher saw is never lost to a crash and its number
//! never given to another event.

use crate::error::{Fail, R};
use crate::perm::{self, Owner, R_OK};
use crate::state::State;
use crate::store::meta::{decode, encode, key, ChangeRecord, ConsumerRecord, InodeRecord, MetaStore};
use rocksdb::WriteBatch;
use shoal_proto::change::{check_consumer, ChangeEvent, ChangeKind, ChangePage};
use shoal_proto::msg::{Cred, FileKind, Reply, Timestamp};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;
use std::time::Duration;

/// Longest wait of one request (a client waiting longer sends another).
pub const WAIT_MAX: Duration = Duration::from_secs(10);
/// Events kept whatever the consumers: live watchers catch up from these.
pub const KEPT: u64 = 65_536;
/// Events kept at most for consumers that lag (about 150 MB of records): beyond, a lagging
/// consumer loses the oldest and is told how many (`ChangePage::lost`).
pub const KEPT_MAX: u64 = 1 << 20;
/// Events one answer holds, at most.
pub const EVENTS_MAX: u32 = 1024;
/// Events one request looks at, at most (shown or not).
const SCAN_MAX: u64 = 50_000;

/// An event on entry `name` of directory `dir` (whose owner and mode are `guard`), naming
/// inode `ino` of kind `file_kind`.
pub fn entry(
    kind: ChangeKind,
    uid: u32,
    dir: Ino,
    guard: Owner,
    name: &str,
    ino: Ino,
    file_kind: FileKind,
) -> ChangeRecord {
    ChangeRecord {
        event: ChangeEvent {
            seq: 0,
            kind,
            ino,
            file_kind,
            dir: Some(dir),
            name: Some(name.to_string()),
            to_dir: None,
            to_name: None,
            xattr: None,
            uid,
            at: Timestamp::now(),
        },
        guard,
        to_guard: None,
    }
}

/// A rename of `ino` from `dir`/`name` to `to_dir`/`to_name`; `to_guard`: the target
/// directory's owner and mode, when known here.
#[allow(clippy::too_many_arguments)]
pub fn rename(
    uid: u32,
    dir: Ino,
    guard: Owner,
    name: &str,
    to_dir: Ino,
    to_guard: Option<Owner>,
    to_name: &str,
    ino: Ino,
    file_kind: FileKind,
) -> ChangeRecord {
    let mut c = entry(ChangeKind::Rename, uid, dir, guard, name, ino, file_kind);
    c.event.to_dir = Some(to_dir);
    c.event.to_name = Some(to_name.to_string());
    c.to_guard = to_guard;
    c
}

/// Who made a change that a step finished without its caller (recovery).
pub const UNKNOWN_UID: u32 = u32::MAX;

/// An event on inode `ino` itself (attributes `rec` after the change); a directory's
/// event names its parent.
pub fn inode(kind: ChangeKind, uid: u32, ino: Ino, rec: &InodeRecord, xattr: Option<&str>) -> ChangeRecord {
    ChangeRecord {
        event: ChangeEvent {
            seq: 0,
            kind,
            ino,
            file_kind: rec.kind,
            dir: if rec.kind == FileKind::Dir { rec.parent } else { None },
            name: None,
            to_dir: None,
            to_name: None,
            xattr: xattr.map(str::to_string),
            uid,
            at: Timestamp::now(),
        },
        guard: rec.owner(),
        to_guard: None,
    }
}

/// Whether `cred` may see event `c`: root, anyone; an entry event, who may list its
/// directory (both, for a rename between two); an inode event, the inode's owner and who
/// may read it.
pub fn visible(cred: &Cred, c: &ChangeRecord) -> bool {
    if cred.uid == 0 {
        return true;
    }
    let lists = |o: &Owner| perm::allowed(cred, o, R_OK);
    if c.event.name.is_some() {
        lists(&c.guard) && c.to_guard.as_ref().is_none_or(lists)
    } else {
        cred.uid == c.guard.uid || perm::allowed(cred, &c.guard, R_OK)
    }
}

/// Add to `batch` (which logs events `first ..= last`) the deletion of the events the log
/// no longer keeps, when `first ..= last` holds a multiple of 1,024. Under the store's
/// `wal_lock`.
pub fn prune(meta: &MetaStore, batch: &mut WriteBatch, first: u64, last: u64) -> R<()> {
    if (first - 1) / 1024 == last / 1024 || last <= KEPT {
        return Ok(());
    }
    // The oldest event a consumer still needs: the one after the lowest cursor.
    let mut needed = u64::MAX;
    meta.scan(&[key::CONSUMER], None, |k, v| {
        let c: ConsumerRecord = decode(&format_args!("consumer {k:x?}"), v)?;
        needed = needed.min(c.acked + 1);
        Ok(true)
    })?;
    let keep_from = needed.min(last - KEPT + 1).max(last.saturating_sub(KEPT_MAX) + 1);
    batch.delete_range(key::change(0), key::change(keep_from));
    Ok(())
}

/// `Op::Changes`.
pub async fn changes(
    st: &Arc<State>,
    cred: Cred,
    after: Option<u64>,
    consumer: Option<String>,
    kinds: u32,
    limit: u32,
    wait_ms: u32,
) -> R<Reply> {
    let limit = if limit == 0 { EVENTS_MAX } else { limit.min(EVENTS_MAX) } as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms as u64).min(WAIT_MAX);
    let mut after = match (after, consumer) {
        (Some(a), _) => a,
        (None, None) => st.meta.last_change()?,
        (None, Some(name)) => {
            check_consumer(&name).map_err(|e| Fail::new(Errno::EINVAL, e))?;
            let uid = cred.uid;
            st.blocking(move |st| cursor_of(st, uid, &name)).await?
        }
    };
    let cred = Arc::new(cred);
    loop {
        // Subscribed before looking, so an event committed after the look wakes this wait.
        let mut changed = st.meta.change_signal();
        let c = cred.clone();
        let (page, more) = st.blocking(move |st| events_after(st, &c, kinds, after, limit)).await?;
        if !page.events.is_empty() || page.lost > 0 || tokio::time::Instant::now() >= deadline {
            return Ok(Reply::Changes(page));
        }
        after = page.next;
        if more {
            continue; // nothing shown in a full scan: look at the next ones at once
        }
        if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
            return Ok(Reply::Changes(ChangePage { events: Vec::new(), next: after, lost: 0 }));
        }
    }
}

/// Where consumer `name` of user `uid` continues; a new consumer is registered at the end
/// of the log, so the log keeps everything from now on for it. Consumers are per user: one
/// user cannot move or remove another's cursor.
fn cursor_of(st: &State, uid: u32, name: &str) -> R<u64> {
    if let Some(v) = st.meta.get_raw(&key::consumer(uid, name))? {
        let c: ConsumerRecord = decode(&format_args!("consumer {name:?}"), &v)?;
        return Ok(c.acked);
    }
    let last = st.meta.last_change()?;
    put_consumer(st, uid, name, last)?;
    Ok(last)
}

fn put_consumer(st: &State, uid: u32, name: &str, acked: u64) -> R<()> {
    let rec = ConsumerRecord { acked, since: Timestamp::now().secs };
    st.meta.put_raw(&key::consumer(uid, name), &encode(&rec))
}

/// `Op::ChangeAck`.
pub async fn ack(st: &Arc<State>, cred: Cred, consumer: String, upto: u64, forget: bool) -> R<Reply> {
    check_consumer(&consumer).map_err(|e| Fail::new(Errno::EINVAL, e))?;
    let next = st
        .blocking(move |st| {
            if forget {
                let mut b = WriteBatch::default();
                b.delete(key::consumer(cred.uid, &consumer));
                st.meta.write(b)?;
                return Ok(0);
            }
            // A cursor beyond the log's end (a consumer of a store that lost its tail)
            // is kept at the end.
            let upto = upto.min(st.meta.last_change()?);
            put_consumer(st, cred.uid, &consumer, upto)?;
            Ok(upto)
        })
        .await?;
    Ok(Reply::Changes(ChangePage { events: Vec::new(), next, lost: 0 }))
}

/// Up to `limit` events after `after` of the `kinds` wanted that `cred` may see, and
/// whether events are left after the page.
fn events_after(st: &State, cred: &Cred, kinds: u32, after: u64, limit: usize) -> R<(ChangePage, bool)> {
    // Everything committed so far reaches the OS before it is shown (module invariants).
    st.meta.flush_wal_to_os()?;
    let last = st.meta.last_change()?;
    // A cursor past the end (a log that lost its tail with its disk): from the end.
    if after >= last {
        return Ok((ChangePage { events: Vec::new(), next: last, lost: 0 }, false));
    }
    let mut page = ChangePage { events: Vec::new(), next: after, lost: 0 };
    let mut scanned = 0;
    let mut first = true;
    st.meta.scan(&[key::CHANGE], Some(&key::change(after + 1)), |k, v| {
        let Some(seq) = key::number(k) else { return Ok(true) };
        if first {
            page.lost = seq - (after + 1);
            first = false;
        }
        let mut c: ChangeRecord = decode(&format_args!("change event {seq}"), v)?;
        page.next = seq;
        scanned += 1;
        if kinds & c.event.kind.bit() != 0 && visible(cred, &c) {
            c.event.seq = seq;
            page.events.push(c.event);
        }
        Ok(page.events.len() < limit && scanned < SCAN_MAX)
    })?;
    let more = page.next < last;
    Ok((page, more))
}

/// Log an event of kind `kind` on local inode `ino` in a batch of its own (for a change
/// whose own batch could not carry it). An inode that is gone logs nothing.
pub async fn log_inode(st: &Arc<State>, kind: ChangeKind, uid: u32, ino: Ino, xattr: Option<String>) -> R<()> {
    st.blocking(move |st| {
        let mut txn = st.meta.txn();
        let Some(rec) = txn.inode(ino)?.cloned() else { return Ok(()) };
        txn.log_change(inode(kind, uid, ino, &rec, xattr.as_deref()));
        txn.commit()
    })
    .await
}

/// A handle that wrote `ino` is being closed (`Fsync` with `closing`): the inode's home
/// logs a `Close` event. Other servers of the layout have nothing to log.
pub async fn closed(st: &Arc<State>, uid: u32, ino: Ino) -> R<()> {
    if !st.is_home(ino) {
        return Ok(());
    }
    log_inode(st, ChangeKind::Close, uid, ino, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u64) -> ChangeRecord {
        let owner = Owner { uid: 0, gid: 0, perm: 0o755, kind: FileKind::Dir };
        entry(ChangeKind::Create, 0, Ino(1), owner, &format!("f{n}"), Ino(100 + n), FileKind::File)
    }

    fn kept(m: &MetaStore) -> Vec<u64> {
        let mut v = Vec::new();
        m.scan(&[key::CHANGE], None, |k, _| {
            v.push(key::number(k).unwrap());
            Ok(true)
        })
        .unwrap();
        v
    }

    /// Numbers follow commits without gap, across a reopen of the store; the log keeps the
    /// newest `KEPT`, and everything after a consumer's cursor.
    #[test]
    fn events_are_numbered_without_gap_and_pruned_past_what_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta");
        {
            let m = MetaStore::open(&path).unwrap();
            m.write_changes(WriteBatch::default(), vec![event(1), event(2)]).unwrap();
            assert_eq!(m.last_change().unwrap(), 2);
        }
        let m = MetaStore::open(&path).unwrap();
        assert_eq!(m.last_change().unwrap(), 2, "read back after a restart");
        // A consumer at 100 holds the log from 101 on, even past KEPT.
        let c = ConsumerRecord { acked: 100, since: 0 };
        m.put_raw(&key::consumer(1000, "slow"), &encode(&c)).unwrap();
        let total = KEPT + 3000;
        for n in 3..=total {
            m.write_changes(WriteBatch::default(), vec![event(n)]).unwrap();
        }
        let k = kept(&m);
        assert_eq!(*k.last().unwrap(), total);
        assert!(k.windows(2).all(|w| w[1] == w[0] + 1), "no gap");
        assert_eq!(k[0], 101, "kept from the consumer's cursor");
        // Without it, the newest KEPT (give or take the 1,024 of a pruning step).
        m.put_raw(&key::consumer(1000, "slow"), &encode(&ConsumerRecord { acked: total, since: 0 })).unwrap();
        for n in total + 1..=total + 1024 {
            m.write_changes(WriteBatch::default(), vec![event(n)]).unwrap();
        }
        let k = kept(&m);
        let len = k.len() as u64;
        assert!((KEPT..KEPT + 1024).contains(&len), "{len} kept");
        let rec: ChangeRecord = decode(&"change", &m.get_raw(&key::change(total)).unwrap().unwrap()).unwrap();
        assert_eq!(rec.event.name.as_deref(), Some(format!("f{total}").as_str()));
    }
}
