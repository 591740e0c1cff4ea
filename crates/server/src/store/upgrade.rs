//! The metadata format version of a store, checked when it opens, and the in-place upgrade
//! of stores written in an older format.
//!
//! `m` "format" holds the version (big-endian `u32`). A new store gets
//! [`FORMAT_VERSION`]; a store of a newer version is refused (one line naming both
//! versions), so that no record is misread; a store of an older version is upgraded before
//! the server serves anything.
//!
//! **Crash safety of the upgrade.** Every record value starts with a byte saying how it is
//! encoded (1: bincode of format 1, 2: MessagePack of format 2, 3: Protocol Buffers of
//! format 3), so each record tells by itself whether it has been rewritten. The upgrade
//! rewrites the records that still say 1 or 2, in batches (each batch atomic), then syncs
//! the log, and only then writes the new version under `m` "format". An interrupted upgrade
//! leaves the old version, so the server does not serve; the next open carries on with the
//! records not yet rewritten. No reader ever sees a half-upgraded store: records are only
//! read by the server once the version is the current one.

use crate::error::{Fail, R};
use crate::store::meta::{key, MetaStore};
use crate::store::records::{encode, v1, v2, FORMAT_VERSION, VALUE_BINCODE1, VALUE_MSGPACK, VALUE_PROTOBUF};
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
}

/// The record kinds whose values carry a format byte (`x` values are raw bytes and `m`
/// values big-endian numbers: the same in every format).
const TAGS: [u8; 6] = [key::INODE, key::ENTRY, key::INTENT, key::APPLIED, key::GC, key::ORPHAN];

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
        key::ENTRY => re(from, v, v1::entry, v2::entry)?,
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

/// Rewrite every record of an older format (the store says `found`) in the current one,
/// then set the format version (see the module comment for why an interruption anywhere is
/// safe). Blocking.
pub fn upgrade(meta: &MetaStore, found: u32, dir: &Path) -> R<Upgraded> {
    let start = Instant::now();
    tracing::info!(
        "data directory {}: upgrading the metadata store from format {found} to {FORMAT_VERSION}",
        dir.display()
    );
    let mut done = Upgraded::default();
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

    /// The fixtures: stores of every older format (`tests/fixtures/README.md`).
    const OLDER: [u32; 2] = [1, 2];

    fn fixture_dir(format: u32) -> tempfile::TempDir {
        let archive =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../cli/tests/fixtures/format-{format}.tar.gz"));
        let dir = tempfile::tempdir().unwrap();
        let status =
            std::process::Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(dir.path()).status().unwrap();
        assert!(status.success(), "unpack {}", archive.display());
        dir
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
                let mut first = None;
                meta.scan(&[key::INODE], None, |_, v| {
                    first = Some(decode::<InodeRecord>(&"inode", v));
                    Ok(false)
                })
                .unwrap();
                let e = first.expect("an inode").unwrap_err();
                assert_eq!(e.errno, Errno::EIO);
                assert!(e.message.contains(&format!("still in format {format}")), "{}", e.message);
                check_and_upgrade(&meta, ServerId(id), &data).unwrap();
                assert_eq!(meta.get_raw(key::FORMAT).unwrap().unwrap(), FORMAT_VERSION.to_be_bytes());
                assert!(decode_all(&meta) > 10, "format {format}: server {id} holds records");
            }
        }
    }

    /// An upgrade stopped part way (some records rewritten, the version still the old one)
    /// resumes on the next open: the rewritten records are left alone, the rest rewritten,
    /// and the store reads exactly as an uninterrupted upgrade leaves it.
    #[test]
    fn an_interrupted_upgrade_resumes_and_ends_as_an_uninterrupted_one() {
        for format in OLDER {
            let whole = fixture_dir(format);
            let cut = fixture_dir(format);
            let whole_meta = MetaStore::open(&whole.path().join("s0/meta")).unwrap();
            upgrade(&whole_meta, format, whole.path()).unwrap();

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
}
