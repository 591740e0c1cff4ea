//! The metadata format version of a store, checked when it opens, and the in-place upgrade
//! of stores written in an older format.
//!
//! `m` "format" holds the version (big-endian `u32`). A new store gets
//! [`FORMAT_VERSION`]; a store of a newer version is refused (one line naming both
//! versions), so that no record is misread; a store of an older version is upgraded before
//! the server serves anything.
//!
//! **Crash safety of the upgrade.** Every record value starts with a byte saying how it is
//! encoded (1: bincode of format 1, 2: MessagePack of format 2), so each record tells by
//! itself whether it has been rewritten. The upgrade rewrites the records that still say 1,
//! in batches (each batch atomic), then syncs the log, and only then writes the new version
//! under `m` "format". An interrupted upgrade leaves the version at 1, so the server does
//! not serve; the next open carries on with the records still in format 1. No reader ever
//! sees a half-upgraded store: records are only read by the server once the version says 2.

use crate::error::{Fail, R};
use crate::store::meta::{key, MetaStore};
use crate::store::records::{encode, v1, FORMAT_VERSION, VALUE_BINCODE1, VALUE_MSGPACK};
use anyhow::{anyhow, bail};
use rocksdb::WriteBatch;
use shoal_proto::ServerId;
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
                upgrade_1_to_2(meta, dir).map_err(err)?;
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
}

/// The record kinds of format 1 whose values carry a format byte (`x` values are raw bytes
/// and `m` values big-endian numbers: unchanged between formats 1 and 2).
const TAGS: [u8; 6] = [key::INODE, key::ENTRY, key::INTENT, key::APPLIED, key::GC, key::ORPHAN];

/// A format-1 value of kind `tag` in format 2; `None` to drop it.
fn convert(tag: u8, v: &[u8]) -> Result<Option<Vec<u8>>, String> {
    Ok(Some(match tag {
        key::INODE => encode(&v1::inode(v)?),
        key::ENTRY => encode(&v1::entry(v)?),
        key::INTENT => encode(&v1::intent(v)?),
        key::APPLIED => match v1::applied(v) {
            Ok(a) => encode(&a),
            Err(_) => return Ok(None),
        },
        key::GC => encode(&v1::gc(v)?),
        key::ORPHAN => encode(&v1::orphan(v)?),
        _ => return Err(format!("no record kind {:?}", tag as char)),
    }))
}

/// Rewrite every format-1 record in format 2, then set the format version to 2 (see the
/// module comment for why an interruption anywhere is safe). Blocking.
pub fn upgrade_1_to_2(meta: &MetaStore, dir: &Path) -> R<Upgraded> {
    let start = Instant::now();
    tracing::info!("data directory {}: upgrading the metadata store from format 1 to {FORMAT_VERSION}", dir.display());
    let mut done = Upgraded::default();
    for tag in TAGS {
        let mut batch = WriteBatch::default();
        let mut n = 0u64;
        meta.scan(&[tag], None, |k, v| {
            match v.first() {
                Some(&VALUE_MSGPACK) => done.already += 1,
                Some(&VALUE_BINCODE1) => {
                    let what = || format!("record {:?} {}", tag as char, hex(&k[1..]));
                    match convert(tag, v)
                        .map_err(|e| Fail::corrupt(format!("{} does not decode in format 1: {e}", what())))?
                    {
                        Some(new) => {
                            batch.put(k, new);
                            n += 1;
                        }
                        None => {
                            tracing::warn!("dropping {}: it does not decode in format 1", what());
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
    tracing::info!(
        "data directory {}: metadata store upgraded to format {FORMAT_VERSION} in {:.1?}; records rewritten: {}",
        dir.display(),
        start.elapsed(),
        note.join(", ")
    );
    Ok(done)
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
    use crate::store::meta::{AppliedRecord, EntryRecord, GcRecord, InodeRecord, IntentRecord, OrphanRecord};
    use crate::store::records::{decode, Record};
    use shoal_proto::Errno;
    use std::path::PathBuf;

    fn fixture_dir() -> tempfile::TempDir {
        let archive = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cli/tests/fixtures/format-1.tar.gz");
        let dir = tempfile::tempdir().unwrap();
        let status =
            std::process::Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(dir.path()).status().unwrap();
        assert!(status.success(), "unpack {}", archive.display());
        dir
    }

    /// Every record of every kind under `tag` decodes as format 2; how many there are.
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
    fn format_1_records_are_not_read_before_the_upgrade_and_all_read_after_it() {
        let dir = fixture_dir();
        for id in 0..2u32 {
            let data: PathBuf = dir.path().join(format!("s{id}"));
            let meta = MetaStore::open(&data.join("meta")).unwrap();
            assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), 1u32.to_be_bytes());
            let mut first = None;
            meta.scan(&[key::INODE], None, |_, v| {
                first = Some(decode::<InodeRecord>(&"inode", v));
                Ok(false)
            })
            .unwrap();
            let e = first.expect("an inode").unwrap_err();
            assert_eq!(e.errno, Errno::EIO);
            assert!(e.message.contains("still in format 1"), "{}", e.message);
            check_and_upgrade(&meta, ServerId(id), &data).unwrap();
            assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), FORMAT_VERSION.to_be_bytes());
            assert!(decode_all(&meta) > 10, "server {id} holds records");
        }
    }

    /// An upgrade stopped part way (some records rewritten, the version still 1) resumes on
    /// the next open: the rewritten records are left alone, the rest rewritten, and the
    /// store reads exactly as an uninterrupted upgrade leaves it.
    #[test]
    fn an_interrupted_upgrade_resumes_and_ends_as_an_uninterrupted_one() {
        let whole = fixture_dir();
        let cut = fixture_dir();
        let whole_meta = MetaStore::open(&whole.path().join("s0/meta")).unwrap();
        upgrade_1_to_2(&whole_meta, whole.path()).unwrap();

        let meta = MetaStore::open(&cut.path().join("s0/meta")).unwrap();
        // The first half of the inodes and entries, as the first batches of an upgrade.
        let mut half = WriteBatch::default();
        for tag in [key::INODE, key::ENTRY] {
            let mut all = Vec::new();
            meta.scan(&[tag], None, |k, v| {
                all.push((k.to_vec(), v.to_vec()));
                Ok(true)
            })
            .unwrap();
            for (k, v) in &all[..all.len() / 2] {
                half.put(k, convert(tag, v).unwrap().unwrap());
            }
        }
        let rewritten_before = half.len() as u64;
        assert!(rewritten_before > 4);
        meta.write(half).unwrap();
        drop(meta);

        let meta = MetaStore::open(&cut.path().join("s0/meta")).unwrap();
        assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), 1u32.to_be_bytes(), "still format 1");
        let done = upgrade_1_to_2(&meta, cut.path()).unwrap();
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
        assert_eq!(dump(&meta), dump(&whole_meta));
        assert!(decode_all(&meta) > 10);
    }
}
