//! `shoal scrub` on a server: a background task that verifies every block of every data
//! object held here against its checksum (`store::checksums`), in its own stores and in the
//! mirror copies it keeps, and decodes every metadata record, while the server keeps
//! serving. Damage found in an object is repaired from another copy when there is one
//! (`scrub_repair.rs`); the status counts what was found, repaired and left unrepairable.
//!
//! The task runs on a thread of its own and is throttled by a duty cycle: after each step
//! (1 MiB of object data, or 1,000 records) it sleeps as long as the step took, so it
//! takes at most about half of one core and of the disk's time, whatever the hardware. Each
//! step holds the object's lock only for its own blocks (writes wait at most one step) and
//! each batch of records its own RocksDB iterator. Objects written before checksums
//! existed get them as the scrub opens them (as at any first access).

use crate::error::R;
use crate::scrub_repair::{Outcome, Repairer};
use crate::state::State;
use crate::store::checksums::BLOCK;
use crate::store::data::{BadBlock, DataStore};
use crate::store::meta;
use crate::store::meta::key::{self, Kind};
use parking_lot::Mutex;
use shoal_proto::msg::{Reply, ScrubError, ScrubStatus, SCRUB_ERRORS_MAX};
use shoal_proto::{Ino, ServerId};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Blocks of 64 KiB verified per step.
const STEP_BLOCKS: u64 = 16;
/// Records decoded per step.
const STEP_RECORDS: usize = 1000;

/// The scrub of this server: its status, shared with the task.
#[derive(Default)]
pub struct Scrub {
    status: Mutex<ScrubStatus>,
    began: Mutex<Option<Instant>>,
}

impl Scrub {
    fn snapshot(&self) -> ScrubStatus {
        let mut s = self.status.lock().clone();
        if let (Some(t), false) = (*self.began.lock(), s.done) {
            s.elapsed_ms = t.elapsed().as_millis() as u64;
        }
        s
    }

    fn update(&self, f: impl FnOnce(&mut ScrubStatus)) {
        f(&mut self.status.lock());
    }

    /// Count damage found and what its repair came to, and list it.
    fn finding(&self, mut e: ScrubError, repair: Result<Outcome, String>) {
        match repair {
            Ok(Outcome::Repaired { from, bytes }) => {
                e.message = format!("{}; repaired from server {from}'s copy ({bytes} bytes)", e.message);
                e.repaired = true;
            }
            Ok(Outcome::Settled) => {
                e.message = format!("{}; rewritten, cut or deleted meanwhile: nothing left to repair", e.message);
                e.repaired = true;
            }
            Err(why) => e.message = format!("{}; not repaired: {why}", e.message),
        }
        self.update(|s| {
            s.corrupt += 1;
            if e.repaired {
                s.repaired += 1;
            } else {
                s.unrepairable += 1;
            }
        });
        self.error(e);
    }

    fn error(&self, e: ScrubError) {
        tracing::error!(
            "scrub: {} {}{}: {}",
            e.kind,
            e.name,
            e.offset.map(|o| format!(" at offset {o}")).unwrap_or_default(),
            e.message
        );
        self.update(|s| {
            if s.errors.len() < SCRUB_ERRORS_MAX {
                s.errors.push(e);
            } else {
                s.errors_unlisted += 1;
            }
        });
    }
}

/// `ScrubStart`: start the task unless one is running; answer the status. A scrub reads
/// every object of the server: an administrative operation, not for any user (issue 51).
pub async fn start(st: &Arc<State>, cred: &shoal_proto::msg::Cred) -> R<Reply> {
    if !st.map.get().security.is_admin(cred) {
        return crate::error::fail(
            shoal_proto::Errno::EPERM,
            format!(
                "uid {} may not start a scrub: only root (on a host with the host key) or a member of security.admin_gid may",
                cred.uid
            ),
        );
    }
    let starting = {
        let mut s = st.scrub.status.lock();
        if s.started && !s.done {
            false
        } else {
            *s = ScrubStatus { started: true, ..ScrubStatus::default() };
            *st.scrub.began.lock() = Some(Instant::now());
            true
        }
    };
    if starting {
        let st2 = st.clone();
        // The repairs' peer calls run on the server's runtime, driven from the scrub thread.
        let rt = tokio::runtime::Handle::current();
        let spawned = std::thread::Builder::new().name("scrub".into()).spawn(move || {
            // A bug in the scrub must end it with a failure, not leave `shoal scrub`
            // polling a scrub that never finishes.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&st2, rt)));
            if ran.is_err() {
                st2.scrub.update(|s| {
                    s.done = true;
                    s.failure = Some("the scrub stopped on an internal error (see the server's log)".into());
                });
            }
        });
        if let Err(e) = spawned {
            st.scrub.update(|s| {
                s.done = true;
                s.failure = Some(format!("cannot start the scrub thread: {e}"));
            });
        }
    }
    Ok(Reply::Scrub(st.scrub.snapshot()))
}

/// `ScrubStatus`.
pub async fn status(st: &Arc<State>) -> R<Reply> {
    Ok(Reply::Scrub(st.scrub.snapshot()))
}

/// Sleep as long as the step that began at `t` took (the duty cycle), then start the next.
fn pause(t: &mut Instant) {
    std::thread::sleep(t.elapsed().min(Duration::from_millis(500)));
    *t = Instant::now();
}

/// One copy of a slot's objects held here: this server's own, or a mirror it keeps.
struct Copy<'a> {
    slot: ServerId,
    store: &'a DataStore,
    objects: Vec<(Ino, u32)>,
    /// Objects whose data file is gone (`DataStore::list_lost`).
    lost: Vec<(Ino, u32)>,
}

fn run(st: &State, rt: tokio::runtime::Handle) {
    let sc = &st.scrub;
    tracing::info!("scrub started");
    let repairer = Repairer::new(st, rt);
    // What there is to do, for the progress bar: this server's objects and its mirrors'.
    let mirrors: Vec<_> =
        st.replica.mirror_slots().into_iter().filter_map(|s| st.replica.mirror(s).map(|m| (s, m))).collect();
    let stores = std::iter::once((st.id, &st.data)).chain(mirrors.iter().map(|(s, m)| (*s, &m.data)));
    let copies: Vec<Copy> =
        stores.map(|(slot, store)| Copy { slot, store, objects: store.list(), lost: store.list_lost() }).collect();
    let bytes_total: u64 = copies
        .iter()
        .flat_map(|c| c.objects.iter().map(move |&(ino, index)| c.store.path(ino, index)))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    sc.update(|s| {
        s.objects_total = copies.iter().map(|c| (c.objects.len() + c.lost.len()) as u64).sum();
        s.bytes_total = bytes_total;
    });
    if let Err(e) = scrub_records(st) {
        sc.update(|s| s.failure = Some(format!("metadata store: {e}")));
    }
    let mut t = Instant::now();
    for c in &copies {
        for &(ino, index) in &c.objects {
            let found =
                c.store.scrub_object(ino, index, STEP_BLOCKS, |n| sc.update(|s| s.bytes += n), || pause(&mut t));
            match found {
                Ok((size, bad)) => {
                    sc.update(|s| s.blocks += size.div_ceil(BLOCK));
                    for b in bad {
                        let found = object_error(b.clone());
                        sc.finding(found, repairer.repair_block(c.store, c.slot, ino, index, b.offset));
                    }
                }
                Err(f) => sc.finding(
                    ScrubError {
                        kind: "object".into(),
                        name: c.store.path(ino, index).display().to_string(),
                        offset: None,
                        message: f.to_string(),
                        repaired: false,
                    },
                    Err("the object could not be read".into()),
                ),
            }
            // A data file cut short is told by the other copy's size (only where that
            // comparison is sound: on the slot's primary, `scrub_repair.rs`).
            if c.slot == st.id && st.replica.log.is_some() {
                match repairer.restore(c.store, c.slot, ino, index, false) {
                    Ok(None) => {}
                    res => sc.finding(
                        missing(c.store, ino, index, "its data file is shorter than its copies"),
                        res.map(Option::unwrap),
                    ),
                }
            }
            sc.update(|s| s.objects += 1);
        }
        for &(ino, index) in &c.lost {
            match repairer.restore(c.store, c.slot, ino, index, true) {
                Ok(None) => {}
                res => sc.finding(
                    missing(c.store, ino, index, "its data file is gone (its checksum file is still there)"),
                    res.map(Option::unwrap),
                ),
            }
            sc.update(|s| s.objects += 1);
            pause(&mut t);
        }
    }
    let elapsed = sc.began.lock().map(|t| t.elapsed().as_millis() as u64).unwrap_or(0);
    sc.update(|s| {
        s.done = true;
        s.elapsed_ms = elapsed;
    });
    let s = sc.snapshot();
    tracing::info!(
        "scrub done: {} objects, {} blocks, {} bytes, {} records; {} damaged, {} repaired, {} unrepairable",
        s.objects,
        s.blocks,
        s.bytes,
        s.records,
        s.corrupt,
        s.repaired,
        s.unrepairable
    );
}

/// A finding for bytes missing from an object.
fn missing(store: &DataStore, ino: Ino, index: u32, what: &str) -> ScrubError {
    ScrubError {
        kind: "object".into(),
        name: store.path(ino, index).display().to_string(),
        offset: None,
        message: what.into(),
        repaired: false,
    }
}

fn object_error(b: BadBlock) -> ScrubError {
    ScrubError {
        kind: "object".into(),
        name: b.path.display().to_string(),
        offset: Some(b.offset),
        message: b.reason,
        repaired: false,
    }
}

/// Decode every record of the metadata store, [`STEP_RECORDS`] per iterator.
fn scrub_records(st: &State) -> R<()> {
    let mut from: Option<Vec<u8>> = None;
    let mut t = Instant::now();
    loop {
        let mut last = None;
        let mut n = 0;
        st.meta.scan(&[], from.as_deref(), |k, v| {
            if let Err(message) = check_record(k, v) {
                let e =
                    ScrubError { kind: "record".into(), name: printable(k), offset: None, message, repaired: false };
                st.scrub.finding(e, Err("records are not repaired by the scrub".into()));
            }
            n += 1;
            last = Some(k.to_vec());
            Ok(n < STEP_RECORDS)
        })?;
        st.scrub.update(|s| s.records += n as u64);
        let Some(mut k) = last else { return Ok(()) };
        if n < STEP_RECORDS {
            return Ok(());
        }
        k.push(0); // the next key after `k`
        from = Some(k);
        pause(&mut t);
    }
}

/// Does this record decode as what its key says it is? The one place the scrub decodes
/// records: it follows the store's own types and decode function.
fn check_record(k: &[u8], v: &[u8]) -> Result<(), String> {
    fn dec<T: crate::store::records::Record>(k: &[u8], v: &[u8]) -> Result<(), String> {
        crate::store::records::decode::<T>(&printable(k), v).map(|_| ()).map_err(|f| f.message)
    }
    let number = |what: &str| key::number(k).map(|_| ()).ok_or_else(|| format!("{what} key of the wrong length"));
    let bytes = |want: usize| match v.len() == want {
        true => Ok(()),
        false => Err(format!("{} bytes where {want} are expected", v.len())),
    };
    let Some(kind) = key::kind_of(k) else { return Err("key of no known kind".into()) };
    // Exhaustive: a new kind of record does not compile until the scrub knows it.
    match kind {
        Kind::Inode => number("inode").and_then(|()| dec::<meta::InodeRecord>(k, v)),
        Kind::Entry if k.len() > key::ENTRY_HEAD => dec::<meta::EntryRecord>(k, v),
        Kind::Entry => Err("entry key of the wrong length".into()),
        // Rewritten by the upgrade at start (store::upgrade): none is left in a running store.
        Kind::EntryV3 => Err("an entry in format 3's layout, which the upgrade should have rewritten".into()),
        Kind::Partition => match key::partition_parts(k) {
            Some(_) => dec::<meta::PartitionRecord>(k, v),
            None => Err("partition key of the wrong length".into()),
        },
        Kind::Xattr if k.len() > 9 => Ok(()), // raw bytes: any value is valid
        Kind::Xattr => Err("xattr key without a name".into()),
        Kind::Intent => number("intent").and_then(|()| dec::<meta::IntentRecord>(k, v)),
        Kind::Applied => number("applied marker").and_then(|()| dec::<meta::AppliedRecord>(k, v)),
        Kind::Gc => number("gc").and_then(|()| dec::<meta::GcRecord>(k, v)),
        Kind::Orphan => number("orphan").and_then(|()| dec::<meta::OrphanRecord>(k, v)),
        Kind::Tuple if k.len() == 17 => dec::<meta::TupleRecord>(k, v),
        Kind::Tuple => Err("tuple key of the wrong length".into()),
        Kind::TupleEvent => number("tuple event").and_then(|()| dec::<meta::TupleEventRecord>(k, v)),
        Kind::Change => number("change event").and_then(|()| dec::<meta::ChangeRecord>(k, v)),
        Kind::Consumer if k.len() > 5 => dec::<meta::ConsumerRecord>(k, v),
        Kind::Consumer => Err("consumer key of the wrong length".into()),
        Kind::Usage => number("usage").and_then(|()| dec::<meta::Usage>(k, v)),
        Kind::DirIndex if v.is_empty() => number("directory index"),
        Kind::DirIndex => Err(format!("directory index with a {}-byte value", v.len())),
        // The store's format and owner: a u32 each (store::upgrade).
        Kind::Format | Kind::Server => bytes(4),
        // A mirror's replication position, a clean stop's end of log: incarnation and
        // position, a u64 each (replica::mirror, replica::record_clean_stop).
        Kind::Replica | Kind::CleanStop => bytes(16),
    }
}

/// A key as text: printable ASCII as is, other bytes as `\xNN`.
fn printable(k: &[u8]) -> String {
    k.iter()
        .flat_map(|&b| if b.is_ascii_graphic() { vec![b as char] } else { format!("\\x{b:02x}").chars().collect() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::Ino;

    #[test]
    fn records_are_checked_by_their_key_kind() {
        let entry = meta::encode(&meta::EntryRecord { ino: Ino(5), kind: shoal_proto::msg::FileKind::File });
        let mut k = key::entry(Ino(1), "a");
        assert_eq!(check_record(&k, &entry), Ok(()));
        // An entry's bytes under an inode key do not decode as an inode.
        assert!(check_record(&key::inode(Ino(5)), &entry).is_err());
        assert!(check_record(&k, &[1, 2]).is_err());
        k[0] = b'?';
        assert!(check_record(&k, &entry).is_err());
        assert_eq!(check_record(key::FORMAT, &1u32.to_be_bytes()), Ok(()));
        // A format-3 entry key (name order) has no place in a format-4 store.
        let mut old = vec![key::ENTRY_V3, 0, 0, 0, 0, 0, 0, 0, 1];
        old.push(b'a');
        assert!(check_record(&old, &entry).is_err());
        // Partition records: a partition under its key, not an entry or a short key.
        let t = shoal_proto::msg::Timestamp { secs: 1, nsecs: 0 };
        let dir = meta::InodeRecord {
            kind: shoal_proto::msg::FileKind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 2,
            atime: t,
            mtime: t,
            ctime: t,
            layout: None,
            dir_default: None,
            parent: None,
            target: None,
            bitmap: vec![3],
            read_mostly: false,
        };
        let part = meta::encode(&meta::PartitionRecord { depth: 1, sealed: false, dir });
        assert_eq!(check_record(&key::partition(Ino(1), 1), &part), Ok(()));
        assert!(check_record(&key::partition(Ino(1), 1), &entry).is_err());
        assert!(check_record(&key::partition(Ino(1), 1)[..12], &part).is_err());
        assert_eq!(printable(&[b'e', 0, 0x41]), "e\\x00A");
    }

    /// Issue 51: after a `kill -9` with replicas 2 the scrub called a healthy server DAMAGED
    /// over its replication position (`mreplica`), a kind of record it did not know.
    #[test]
    fn the_replication_records_are_known_and_checked() {
        let position = [7u8; 16];
        assert_eq!(check_record(key::REPLICA, &position), Ok(()));
        assert_eq!(check_record(key::CLEAN_STOP, &position), Ok(()));
        assert_eq!(check_record(key::SERVER, &3u32.to_be_bytes()), Ok(()));
        assert!(check_record(key::REPLICA, &position[..8]).unwrap_err().contains("8 bytes where 16"));
        assert_eq!(check_record(b"mystery", b""), Err("key of no known kind".into()));
    }

    /// Every key constant of the store's `key` module (a one-byte tag or a whole `m…` key)
    /// has a kind, so the scrub's exhaustive match covers every record the server writes.
    /// Read from the source: a constant added without a kind fails here.
    #[test]
    fn every_kind_of_record_the_store_writes_has_a_kind() {
        let src = include_str!("store/meta.rs");
        let module = &src[src.find("pub mod key {").expect("the key module")..];
        let module = &module[..module.find("\n}\n").expect("its end")];
        let mut seen = 0;
        for line in module.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("pub const ") else { continue };
            let (name, value) = rest.split_once(" = ").expect("pub const NAME: T = VALUE;");
            let value = value.trim_end_matches(';');
            let key: Vec<u8> = if let Some(c) = value.strip_prefix("b'").and_then(|v| v.strip_suffix('\'')) {
                c.as_bytes().to_vec()
            } else if let Some(s) = value.strip_prefix("b\"").and_then(|v| v.strip_suffix('"')) {
                s.as_bytes().to_vec()
            } else {
                continue; // a length (ENTRY_HEAD), not a key
            };
            let mut sample = key.clone();
            if sample.len() == 1 {
                sample.extend_from_slice(&[0; 8]);
            }
            assert!(key::kind_of(&sample).is_some(), "{name} ({value}) has no key::Kind: teach the scrub");
            seen += 1;
        }
        assert!(seen >= 19, "only {seen} key constants found: did the module's layout change?");
    }
}
