//! The metadata format version of a store, checked when it opens, and the in-place upgrade
//! of stores written in an older format.
//!
//! `m` "format" holds the version (big-endian `u32`). A new store gets
//! [`FORMAT_VERSION`]; a store of a newer version is refused (one line naming both
//! versions), so that no record is misread; a store of an older version is upgraded before
//! the server serves anything.
//!
//! The upgrade has two steps, each done in batches (each batch atomic):
//!
//! 1. From format 1 or 2: every record value is rewritten in the value encoding of format 3
//!    (unchanged in format 4).
//! 2. From formats 1 to 3: every entry moves from its format-3 key (`e` dir name, name
//!    order) to its format-4 key (`E` dir listing-key name, listing order): the old key is
//!    deleted and the new one written in the same batch.
//! 3. From formats 1 to 4: every file and symbolic link held here with no parent pointer
//!    gets the directory of a name of it held here, and the per-directory usage
//!    (`store::usage`) is counted from every inode: any `U` and `D` record left by an
//!    interrupted upgrade is deleted first and the counts written whole, so this step is
//!    done again from the start when it was interrupted. A file whose every name is held
//!    by another server (renamed into a directory placed elsewhere, or linked there and
//!    unlinked here) cannot be placed by this server alone: it counts nowhere until it is
//!    renamed (docs/du.md).
//!
//! **Crash safety of the upgrade.** Every record value starts with a byte saying how it is
//! encoded (1: bincode of format 1, 2: MessagePack of format 2, 3: Protocol Buffers of
//! formats 3 and 4), so each record tells by itself whether step 1 has rewritten it; and an
//! entry is, at every instant, under exactly one of its two keys, whose tag tells whether
//! step 2 has moved it. Step 2 starts only once step 1 has rewritten every value, so it
//! moves values already in the new encoding (it checks). Once both are done the upgrade
//! syncs the log, and only then writes the new version under `m` "format". An interrupted
//! upgrade leaves the old version, so the server does not serve; the next open carries on
//! with the records not yet rewritten and the entries not yet moved. No reader ever sees a
//! half-upgraded store: records are only read by the server once the version is the
//! current one.

use crate::error::{Fail, R};
use crate::store::meta::{key, MetaStore};
use crate::store::records::{encode, v1, v2, FORMAT_VERSION, VALUE_BINCODE1, VALUE_MSGPACK, VALUE_PROTOBUF};
use anyhow::{anyhow, bail};
use rocksdb::WriteBatch;
use shoal_proto::{Ino, ServerId};
use std::path::Path;
use std::time::Instant;

/// Records rewritten per batch.
const BATCH: usize = 1024;

/// Check (or, on a new store, write) the format version and owning server id, upgrading an
/// older store in place, so that a data directory from another server or a newer release
/// is refused rather than misread. `dir` names the data directory in messages.
pub fn check_and_upgrade(meta: &MetaStore, id: ServerId, dir: &Path) -> anyhow::Result<()> {
    let err = |e: Fail| anyhow!("data directory {}: {e}", dir.display());
    match meta.get_raw(key::FORMAT).map_err(err)? {
        None => {
            meta.put_raw(key::FORMAT, &FORMAT_VERSION.to_be_bytes()).map_err(err)?;
            meta.put_raw(key::SERVER, &id.0.to_be_bytes()).map_err(err)?;
            Ok(())
        }
        Some(v) => {
            let found = match <[u8; 4]>::try_from(v.as_slice()) {
                Ok(b) => u32::from_be_bytes(b),
                Err(_) => bail!("data directory {}: metadata format key is damaged ({} bytes)", dir.display(), v.len()),
            };
            if found > FORMAT_VERSION {
                bail!(
                    "data directory {} has metadata format {found}, newer than format {FORMAT_VERSION} that this shoald reads; run a newer shoald",
                    dir.display()
                );
            }
            if found < 1 {
                bail!("data directory {} has unknown metadata format {found}", dir.display());
            }
            if let Some(owner) = meta.get_raw(key::SERVER).map_err(err)? {
                let owner = <[u8; 4]>::try_from(owner.as_slice()).ok().map(u32::from_be_bytes);
                if owner != Some(id.0) {
                    bail!(
                        "data directory {} belongs to server {}, not {id}",
                        dir.display(),
                        owner.map_or("?".to_string(), |o| format!("s{o}"))
                    );
                }
            }
            if found < FORMAT_VERSION {
                upgrade(meta, found, dir).map_err(err)?;
            }
            Ok(())
        }
    }
}

/// What an upgrade did, per record kind.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Upgraded {
    /// Records rewritten, by key tag.
    pub rewritten: Vec<(char, u64)>,
    /// Records already in the new format (an earlier upgrade was interrupted).
    pub already: u64,
    /// Applied markers dropped because they did not decode (they only deduplicate resent
    /// peer steps, and old ones are pruned anyway).
    pub dropped: u64,
    /// Entries moved from their format-3 key to their format-4 key.
    pub moved: u64,
    /// Entries found under their format-4 key (an earlier upgrade was interrupted).
    pub moved_before: u64,
    /// Files given the directory of one of their names as parent (step 3).
    pub parents_set: u64,
    /// Directories whose usage step 3 counted.
    pub usage_dirs: u64,
}

/// The record kinds of formats 1 and 2 whose values carry a format byte (`x` values are raw
/// bytes and `m` values big-endian numbers: the same in every format). Entries are still
/// under their format-3 keys while values are rewritten (step 2 moves them after).
const TAGS: [u8; 6] = [key::INODE, key::ENTRY_V3, key::INTENT, key::APPLIED, key::GC, key::ORPHAN];

/// A decoder of one record kind in one older format.
type Decoder<T> = fn(&[u8]) -> Result<T, String>;

/// A value of kind `tag` in format `from` (1 or 2), in the current format; `None` to drop it.
fn convert(tag: u8, from: u8, v: &[u8]) -> Result<Option<Vec<u8>>, String> {
    if from != VALUE_BINCODE1 && from != VALUE_MSGPACK {
        return Err(format!("no value format {from} to upgrade from"));
    }
    // The record decoded by the decoder of its format, encoded in the current one.
    fn re<T: crate::store::records::Record>(
        from: u8,
        v: &[u8],
        f1: Decoder<T>,
        f2: Decoder<T>,
    ) -> Result<Vec<u8>, String> {
        Ok(encode(&if from == VALUE_BINCODE1 { f1(v)? } else { f2(v)? }))
    }
    Ok(Some(match tag {
        key::INODE => re(from, v, v1::inode, v2::inode)?,
        key::ENTRY_V3 => re(from, v, v1::entry, v2::entry)?,
        key::INTENT => re(from, v, v1::intent, v2::intent)?,
        key::APPLIED => match re(from, v, v1::applied, v2::applied) {
            Ok(a) => a,
            Err(_) => return Ok(None),
        },
        key::GC => re(from, v, v1::gc, v2::gc)?,
        key::ORPHAN => re(from, v, v1::orphan, v2::orphan)?,
        _ => return Err(format!("no record kind {:?}", tag as char)),
    }))
}

/// Bring a store of an older format (the store says `found`) to the current one: rewrite
/// every value of format 1 or 2, move every entry to its format-4 key, then set the format
/// version (see the module comment for why an interruption anywhere is safe). Blocking.
pub fn upgrade(meta: &MetaStore, found: u32, dir: &Path) -> R<Upgraded> {
    let start = Instant::now();
    tracing::info!(
        "data directory {}: upgrading the metadata store from format {found} to {FORMAT_VERSION}",
        dir.display()
    );
    let mut done = Upgraded::default();
    if found < 3 {
        rewrite_values(meta, &mut done)?;
    }
    if found < 4 {
        done.moved_before = meta.count(key::ENTRY)?;
        done.moved = move_entries(meta, BATCH, None)?;
    }
    count_usage(meta, &mut done)?;
    // Every rewritten record is durable before the version says they all are.
    meta.sync_wal()?;
    meta.put_raw(key::FORMAT, &FORMAT_VERSION.to_be_bytes())?;
    meta.sync_wal()?;
    let mut note: Vec<String> = done.rewritten.iter().map(|(t, n)| format!("{n} {t:?}")).collect();
    if done.already > 0 {
        note.push(format!("{} left from an interrupted upgrade", done.already));
    }
    if done.dropped > 0 {
        note.push(format!("{} undecodable applied markers dropped", done.dropped));
    }
    if found < 4 {
        note.push(format!("{} entries moved to listing order", done.moved));
    }
    note.push(format!("{} files given their parent, usage of {} directories", done.parents_set, done.usage_dirs));
    if done.moved_before > 0 {
        note.push(format!("{} entries moved by an interrupted upgrade", done.moved_before));
    }
    tracing::info!(
        "data directory {}: metadata store upgraded to format {FORMAT_VERSION} in {:.1?}; records rewritten: {}",
        dir.display(),
        start.elapsed(),
        note.join(", ")
    );
    Ok(done)
}

/// Step 1: rewrite every value of format 1 or 2 in the current value encoding.
fn rewrite_values(meta: &MetaStore, done: &mut Upgraded) -> R<()> {
    for tag in TAGS {
        let mut batch = WriteBatch::default();
        let mut n = 0u64;
        meta.scan(&[tag], None, |k, v| {
            match v.first() {
                Some(&VALUE_PROTOBUF) => done.already += 1,
                Some(&from @ (VALUE_BINCODE1 | VALUE_MSGPACK)) => {
                    let what = || format!("record {:?} {}", tag as char, hex(&k[1..]));
                    match convert(tag, from, v)
                        .map_err(|e| Fail::corrupt(format!("{} does not decode in format {from}: {e}", what())))?
                    {
                        Some(new) => {
                            batch.put(k, new);
                            n += 1;
                        }
                        None => {
                            tracing::warn!("dropping {}: it does not decode in format {from}", what());
                            batch.delete(k);
                            done.dropped += 1;
                        }
                    }
                    if batch.len() >= BATCH {
                        meta.write(std::mem::take(&mut batch))?;
                    }
                }
                Some(b) => {
                    return Err(Fail::corrupt(format!(
                        "record {:?} {} has unknown value format {b}",
                        tag as char,
                        hex(&k[1..])
                    )))
                }
                None => return Err(Fail::corrupt(format!("record {:?} {} is empty", tag as char, hex(&k[1..])))),
            }
            Ok(true)
        })?;
        if !batch.is_empty() {
            meta.write(batch)?;
        }
        done.rewritten.push((tag as char, n));
    }
    Ok(())
}

/// The format-4 key of the entry under format-3 key `old` (`e` dir name).
fn moved_entry_key(old: &[u8]) -> Result<Vec<u8>, String> {
    let dir = old.get(..9).and_then(key::number).ok_or("key too short")?;
    let name = std::str::from_utf8(&old[9..]).map_err(|_| "name is not UTF-8")?;
    if name.is_empty() {
        return Err("empty name".into());
    }
    Ok(key::entry(Ino(dir), name))
}

/// Step 2: move every entry still under its format-3 key to its format-4 key, `batch`
/// entries per atomic batch (the old key deleted, the new one written), and return how
/// many moved. `stop_after` batches: a test's interruption.
fn move_entries(meta: &MetaStore, batch: usize, stop_after: Option<usize>) -> R<u64> {
    let mut b = WriteBatch::default();
    let (mut in_batch, mut batches, mut moved) = (0usize, 0usize, 0u64);
    let mut stopped = false;
    // The scan reads a snapshot of the `e` keys; the `E` keys written meanwhile sort
    // before them and are not seen.
    meta.scan(&[key::ENTRY_V3], None, |k, v| {
        let what = || format!("entry key {}", hex(k));
        let new = moved_entry_key(k).map_err(|e| Fail::corrupt(format!("{}: {e}", what())))?;
        if v.first() != Some(&VALUE_PROTOBUF) {
            return Err(Fail::corrupt(format!("{} has a value not in format 3 after the rewrite", what())));
        }
        b.delete(k);
        b.put(new, v);
        in_batch += 1;
        moved += 1;
        if in_batch >= batch {
            meta.write(std::mem::take(&mut b))?;
            in_batch = 0;
            batches += 1;
            if stop_after == Some(batches) {
                stopped = true;
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    if !stopped && !b.is_empty() {
        meta.write(b)?;
    }
    Ok(moved)
}

/// Step 3: parent pointers of files, then the per-directory usage counted from scratch.
fn count_usage(meta: &MetaStore, done: &mut Upgraded) -> R<()> {
    use crate::store::meta::{decode, EntryRecord, InodeRecord};
    use shoal_proto::msg::FileKind;
    use std::collections::{BTreeMap, HashSet};
    // Parents: the directory of the first name of each file held here.
    let mut given = HashSet::new();
    let mut b = WriteBatch::default();
    meta.scan(&[key::ENTRY], None, |k, v| {
        let Some(dir) = key::entry_dir(k) else { return Ok(true) };
        let e: EntryRecord = decode(&format_args!("entry {}", hex(k)), v)?;
        if e.kind == FileKind::Dir || given.contains(&e.ino) {
            return Ok(true);
        }
        if let Some(mut rec) = meta.get_inode(e.ino)? {
            if rec.parent.is_none() {
                rec.parent = Some(dir);
                b.put(key::inode(e.ino), encode(&rec));
                given.insert(e.ino);
                if b.len() >= BATCH {
                    meta.write(std::mem::take(&mut b))?;
                }
            }
        }
        Ok(true)
    })?;
    if !b.is_empty() {
        meta.write(std::mem::take(&mut b))?;
    }
    done.parents_set = given.len() as u64;
    // Usage, from every inode; what an interrupted run wrote goes first.
    for tag in [key::USAGE, key::DIR_INDEX] {
        b.delete_range(vec![tag], vec![tag + 1]);
    }
    meta.write(std::mem::take(&mut b))?;
    let mut usage: BTreeMap<Ino, crate::store::meta::Usage> = BTreeMap::new();
    meta.scan(&[key::INODE], None, |k, v| {
        let Some(ino) = key::number(k).map(Ino) else { return Ok(true) };
        let rec: InodeRecord = decode(&format_args!("inode {ino}"), v)?;
        for (dir, d) in crate::store::usage::differences(ino, None, Some(&rec)) {
            let u = usage.entry(dir).or_default();
            (u.files, u.dirs, u.bytes) = (u.files + d.files, u.dirs + d.dirs, u.bytes + d.bytes);
        }
        if rec.kind == FileKind::Dir {
            b.put(key::dir_index(ino), []);
            if b.len() >= BATCH {
                meta.write(std::mem::take(&mut b))?;
            }
        }
        Ok(true)
    })?;
    done.usage_dirs = usage.len() as u64;
    for (dir, u) in usage {
        b.put(key::usage(dir), encode(&u));
        if b.len() >= BATCH {
            meta.write(std::mem::take(&mut b))?;
        }
    }
    if !b.is_empty() {
        meta.write(b)?;
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The metadata format version recorded in the store under `meta_dir` (`None` for a store
/// that has none yet), read without taking the store's lock for writing: for tests and
/// tools, while no server has the store open.
pub fn stored_format(meta_dir: &Path) -> Result<Option<u32>, String> {
    let db = rocksdb::DB::open_for_read_only(&rocksdb::Options::default(), meta_dir, false)
        .map_err(|e| format!("cannot open metadata store {}: {e}", meta_dir.display()))?;
    match db.get(key::FORMAT).map_err(|e| e.to_string())? {
        None => Ok(None),
        Some(v) => <[u8; 4]>::try_from(v.as_slice())
            .map(|b| Some(u32::from_be_bytes(b)))
            .map_err(|_| format!("format key of {} has {} bytes", meta_dir.display(), v.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::meta::{
        AppliedRecord, EntryRecord, GcRecord, InodeRecord, IntentRecord, ListStart, OrphanRecord,
    };
    use crate::store::records::{decode, Record};
    use shoal_proto::Errno;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    /// The fixtures: stores of every older format (`tests/fixtures/README.md`).
    const OLDER: [u32; 4] = [1, 2, 3, 4];

    /// The entries under format-3 keys (`e` dir name), by directory.
    fn v3_entries(meta: &MetaStore) -> BTreeMap<Ino, Vec<String>> {
        let mut out: BTreeMap<Ino, Vec<String>> = BTreeMap::new();
        meta.scan(&[key::ENTRY_V3], None, |k, _| {
            let dir = Ino(key::number(&k[..9]).unwrap());
            out.entry(dir).or_default().push(String::from_utf8(k[9..].to_vec()).unwrap());
            Ok(true)
        })
        .unwrap();
        out
    }

    /// Every entry of `before` is found by a lookup and listed exactly once, in listing
    /// order, and no entry is left under a format-3 key.
    fn entries_are_found_and_listed_once(meta: &MetaStore, before: &BTreeMap<Ino, Vec<String>>, what: &str) {
        assert!(v3_entries(meta).is_empty(), "{what}: entries left under format-3 keys");
        let mut total = 0;
        for (dir, names) in before {
            for name in names {
                assert!(meta.get_entry(*dir, name).unwrap().is_some(), "{what}: lookup of {name:?} in {dir}");
            }
            let (listed, more) = meta.list_entries(*dir, ListStart::From(0), (0, u64::MAX), usize::MAX).unwrap();
            assert!(!more);
            let positions: Vec<_> = listed.iter().map(|e| (key::listing_key_of(&e.name), e.name.clone())).collect();
            let mut sorted = positions.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(positions, sorted, "{what}: {dir} lists in listing order, each name once");
            let mut got: Vec<_> = listed.into_iter().map(|e| e.name).collect();
            got.sort();
            let mut want = names.clone();
            want.sort();
            assert_eq!(got, want, "{what}: entries of {dir}");
            total += names.len() as u64;
        }
        assert_eq!(meta.count(key::ENTRY).unwrap(), total, "{what}: no entry doubled");
    }

    fn fixture_dir(format: u32) -> tempfile::TempDir {
        // The package's folder as cargo gives it at run time (see crates/cli/tests/common).
        let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from);
        let dir = dir.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf());
        let archive = dir.join(format!("../cli/tests/fixtures/format-{format}.tar.gz"));
        let dir = tempfile::tempdir().unwrap();
        let status =
            std::process::Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(dir.path()).status().unwrap();
        assert!(status.success(), "unpack {}", archive.display());
        dir
    }

    /// Every file held here with a name here points at a directory, and the usage records
    /// are exactly what the inodes add up to, with a `D` record per directory held here.
    fn usage_is_counted_from_the_inodes(meta: &MetaStore, what: &str) {
        use crate::store::meta::{EntryRecord, Usage};
        use std::collections::BTreeMap;
        let mut want: BTreeMap<Ino, Usage> = BTreeMap::new();
        let mut dirs = 0;
        meta.scan(&[key::INODE], None, |k, v| {
            let ino = Ino(key::number(k).unwrap());
            let rec: InodeRecord = decode(&"inode", v).unwrap();
            dirs += u64::from(rec.kind == shoal_proto::msg::FileKind::Dir);
            for (d, u) in crate::store::usage::differences(ino, None, Some(&rec)) {
                let w = want.entry(d).or_default();
                (w.files, w.dirs, w.bytes) = (w.files + u.files, w.dirs + u.dirs, w.bytes + u.bytes);
            }
            Ok(true)
        })
        .unwrap();
        let mut got = BTreeMap::new();
        meta.scan(&[key::USAGE], None, |k, v| {
            got.insert(Ino(key::number(k).unwrap()), decode::<Usage>(&"usage", v).unwrap());
            Ok(true)
        })
        .unwrap();
        assert_eq!(got, want, "{what}: usage records");
        assert_eq!(meta.count(key::DIR_INDEX).unwrap(), dirs, "{what}: directory index");
        meta.scan(&[key::ENTRY], None, |_, v| {
            let e: EntryRecord = decode(&"entry", v).unwrap();
            if let Some(rec) = meta.get_inode(e.ino).unwrap() {
                assert!(rec.parent.is_some(), "{what}: inode {} held here has no parent", e.ino);
            }
            Ok(true)
        })
        .unwrap();
    }

    /// Every record of every kind decodes in the current format; how many there are.
    fn decode_all(meta: &MetaStore) -> u64 {
        fn check<T: Record>(meta: &MetaStore, tag: u8) -> u64 {
            let mut n = 0;
            meta.scan(&[tag], None, |k, v| {
                decode::<T>(&format_args!("{:?}", k), v).unwrap();
                n += 1;
                Ok(true)
            })
            .unwrap();
            n
        }
        check::<InodeRecord>(meta, key::INODE)
            + check::<EntryRecord>(meta, key::ENTRY)
            + check::<IntentRecord>(meta, key::INTENT)
            + check::<AppliedRecord>(meta, key::APPLIED)
            + check::<GcRecord>(meta, key::GC)
            + check::<OrphanRecord>(meta, key::ORPHAN)
    }

    #[test]
    fn a_store_of_a_newer_format_is_refused_naming_both_versions() {
        let dir = tempfile::tempdir().unwrap();
        let meta = MetaStore::open(&dir.path().join("meta")).unwrap();
        check_and_upgrade(&meta, ServerId(0), dir.path()).unwrap();
        meta.put_raw(key::FORMAT, &(FORMAT_VERSION + 1).to_be_bytes()).unwrap();
        let e = check_and_upgrade(&meta, ServerId(0), dir.path()).unwrap_err().to_string();
        assert!(e.contains(&format!("format {}", FORMAT_VERSION + 1)), "{e}");
        assert!(e.contains(&format!("format {FORMAT_VERSION}")), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
        // Refused without a change: the version is still the newer one.
        assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), (FORMAT_VERSION + 1).to_be_bytes());
    }

    #[test]
    fn a_new_store_gets_the_current_format_and_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        let meta = MetaStore::open(&dir.path().join("meta")).unwrap();
        check_and_upgrade(&meta, ServerId(3), dir.path()).unwrap();
        assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), FORMAT_VERSION.to_be_bytes());
        let e = check_and_upgrade(&meta, ServerId(4), dir.path()).unwrap_err().to_string();
        assert!(e.contains("belongs to server s3, not s4"), "{e}");
    }

    #[test]
    fn older_records_are_not_read_before_the_upgrade_and_all_read_after_it() {
        for format in OLDER {
            let dir = fixture_dir(format);
            for id in 0..2u32 {
                let data: PathBuf = dir.path().join(format!("s{id}"));
                let meta = MetaStore::open(&data.join("meta")).unwrap();
                assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), format.to_be_bytes());
                if format < 3 {
                    let mut first = None;
                    meta.scan(&[key::INODE], None, |_, v| {
                        first = Some(decode::<InodeRecord>(&"inode", v));
                        Ok(false)
                    })
                    .unwrap();
                    let e = first.expect("an inode").unwrap_err();
                    assert_eq!(e.errno, Errno::EIO);
                    assert!(e.message.contains(&format!("still in format {format}")), "{}", e.message);
                }
                // Entries under their format-3 keys are not where this code looks for them.
                let before = v3_entries(&meta);
                if format < 4 {
                    assert!(
                        before.values().map(Vec::len).sum::<usize>() > 3,
                        "format {format}: server {id} has entries"
                    );
                    let (dir0, names) = before.iter().next().unwrap();
                    assert_eq!(meta.get_entry(*dir0, &names[0]).unwrap(), None);
                }
                assert_eq!(meta.count(key::USAGE).unwrap(), 0, "format {format} has no usage");
                check_and_upgrade(&meta, ServerId(id), &data).unwrap();
                assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), FORMAT_VERSION.to_be_bytes());
                assert!(decode_all(&meta) > 10, "format {format}: server {id} holds records");
                if format < 4 {
                    entries_are_found_and_listed_once(&meta, &before, &format!("format {format}, server {id}"));
                }
                usage_is_counted_from_the_inodes(&meta, &format!("format {format}, server {id}"));
            }
        }
    }

    /// An upgrade stopped part way (some records rewritten, the version still the old one)
    /// resumes on the next open: the rewritten records are left alone, the rest rewritten,
    /// and the store reads exactly as an uninterrupted upgrade leaves it.
    #[test]
    fn an_interrupted_upgrade_resumes_and_ends_as_an_uninterrupted_one() {
        for format in [1, 2] {
            let whole = fixture_dir(format);
            let cut = fixture_dir(format);
            let whole_meta = MetaStore::open(&whole.path().join("s0/meta")).unwrap();
            upgrade(&whole_meta, format, whole.path()).unwrap();

            let meta = MetaStore::open(&cut.path().join("s0/meta")).unwrap();
            // The first half of the inodes and entries, as the first batches of an upgrade.
            let mut half = WriteBatch::default();
            for tag in [key::INODE, key::ENTRY_V3] {
                let mut all = Vec::new();
                meta.scan(&[tag], None, |k, v| {
                    all.push((k.to_vec(), v.to_vec()));
                    Ok(true)
                })
                .unwrap();
                for (k, v) in &all[..all.len() / 2] {
                    half.put(k, convert(tag, format as u8, v).unwrap().unwrap());
                }
            }
            let rewritten_before = half.len() as u64;
            assert!(rewritten_before > 4);
            meta.write(half).unwrap();
            drop(meta);

            let meta = MetaStore::open(&cut.path().join("s0/meta")).unwrap();
            assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), format.to_be_bytes(), "still the old format");
            let done = upgrade(&meta, format, cut.path()).unwrap();
            assert_eq!(done.already, rewritten_before);
            assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), FORMAT_VERSION.to_be_bytes());
            let dump = |m: &MetaStore| {
                let mut out = Vec::new();
                m.scan(&[], None, |k, v| {
                    out.push((k.to_vec(), v.to_vec()));
                    Ok(true)
                })
                .unwrap();
                out
            };
            assert_eq!(dump(&meta), dump(&whole_meta), "format {format}");
            assert!(decode_all(&meta) > 10);
        }
    }

    /// The whole store, key by key.
    fn dump(m: &MetaStore) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        m.scan(&[], None, |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(true)
        })
        .unwrap();
        out
    }

    /// An upgrade stopped in the middle of moving the entries to their format-4 keys (some
    /// batches written, the version still the old one) resumes on the next open: no entry
    /// is lost or doubled, and the store ends exactly as an uninterrupted upgrade leaves it.
    #[test]
    fn an_upgrade_interrupted_while_moving_entries_resumes_and_loses_or_doubles_nothing() {
        for format in OLDER.into_iter().filter(|&f| f < 4) {
            let whole = fixture_dir(format);
            let cut = fixture_dir(format);
            let whole_meta = MetaStore::open(&whole.path().join("s0/meta")).unwrap();
            upgrade(&whole_meta, format, whole.path()).unwrap();

            let meta = MetaStore::open(&cut.path().join("s0/meta")).unwrap();
            let before = v3_entries(&meta);
            let total: usize = before.values().map(Vec::len).sum();
            assert!(total >= 8, "format {format}: {total} entries");
            // The upgrade's own steps, stopped after three batches of two entries.
            let mut done = Upgraded::default();
            if format < 3 {
                rewrite_values(&meta, &mut done).unwrap();
            }
            assert_eq!(move_entries(&meta, 2, Some(3)).unwrap(), 6);
            assert_eq!(meta.count(key::ENTRY).unwrap(), 6, "moved so far");
            assert_eq!(meta.count(key::ENTRY_V3).unwrap(), total as u64 - 6, "still to move");
            drop(meta);

            let meta = MetaStore::open(&cut.path().join("s0/meta")).unwrap();
            assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), format.to_be_bytes(), "still the old format");
            let done = upgrade(&meta, format, cut.path()).unwrap();
            assert_eq!((done.moved_before, done.moved), (6, total as u64 - 6));
            assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), FORMAT_VERSION.to_be_bytes());
            entries_are_found_and_listed_once(&meta, &before, &format!("format {format}"));
            assert_eq!(dump(&meta), dump(&whole_meta), "format {format}");
        }
    }

    /// An upgrade stopped while counting usage (some `U` and `D` records written, some
    /// parents given) counts again from the start on the next open, and ends exactly as an
    /// uninterrupted upgrade: nothing counted twice.
    #[test]
    fn an_upgrade_interrupted_while_counting_usage_counts_again_and_ends_as_an_uninterrupted_one() {
        let whole = fixture_dir(4);
        let cut = fixture_dir(4);
        let whole_meta = MetaStore::open(&whole.path().join("s0/meta")).unwrap();
        upgrade(&whole_meta, 4, whole.path()).unwrap();
        let meta = MetaStore::open(&cut.path().join("s0/meta")).unwrap();
        // What an interrupted count leaves: the first parents given, partial usage, a stray
        // directory index.
        let mut first = None;
        meta.scan(&[key::ENTRY], None, |_, v| {
            let e: crate::store::meta::EntryRecord = decode(&"entry", v).unwrap();
            if e.kind != shoal_proto::msg::FileKind::Dir && meta.get_inode(e.ino).unwrap().is_some() {
                first = Some(e.ino);
                return Ok(false);
            }
            Ok(true)
        })
        .unwrap();
        let mut half = WriteBatch::default();
        let ino = first.expect("a file held with its name");
        let mut rec = meta.get_inode(ino).unwrap().unwrap();
        let dir = whole_meta.get_inode(ino).unwrap().unwrap().parent.expect("given a parent");
        rec.parent = Some(dir);
        half.put(key::inode(ino), encode(&rec));
        half.put(key::usage(dir), encode(&crate::store::meta::Usage { files: 5, dirs: 1, bytes: 99 }));
        half.put(key::dir_index(Ino(0xdead)), []);
        meta.write(half).unwrap();
        drop(meta);
        let meta = MetaStore::open(&cut.path().join("s0/meta")).unwrap();
        assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), 4u32.to_be_bytes(), "still the old format");
        upgrade(&meta, 4, cut.path()).unwrap();
        usage_is_counted_from_the_inodes(&meta, "resumed");
        assert_eq!(dump(&meta), dump(&whole_meta));
    }
}
