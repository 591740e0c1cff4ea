//! Per-directory usage (docs/du.md): for each directory, the inodes this server holds whose
//! parent it is (files and directories apart) and the bytes of those files, kept under
//! `U` dir; and the index of the directories whose inodes this server holds (`D` dir, no
//! value), so that `Op::Usage` reads one record per directory instead of one per inode.
//!
//! **How it stays exact.** Every change to an inode record goes through [`Txn::commit`]
//! (`meta.rs`), which compares each changed inode's record before and after and adds the
//! difference to the usage of its parent (old and new, when it moved) in the same batch:
//! usage is never ahead of or behind the inodes it counts, across crashes too. The
//! difference is a RocksDB merge operand ([`merge`]) rather than a read-modify-write, so
//! two commits counting into the same directory (two creates under their own inode locks)
//! cannot lose each other's update, and the batch needs no read of the record.
//!
//! **What counts.** An inode counts in its parent pointer's directory: a file is counted
//! once, in the directory it was created in or last renamed into, however many names it
//! has (`du` counts a file of several links once, too); a file with no name left (open
//! after its unlink) counts nowhere; the root has no parent. Bytes are the apparent size
//! (`stat`'s `st_size`), of files and symbolic links.
//!
//! [`Txn::commit`]: crate::store::meta::Txn::commit

use crate::store::meta::InodeRecord;
use crate::store::records::{Record, VALUE_PROTOBUF};
use prost::Message;
use shoal_proto::msg::FileKind;
use shoal_proto::Ino;

/// The usage of one directory held here (`U` dir), or a difference to add to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub files: i64,
    pub dirs: i64,
    pub bytes: i64,
}

impl Usage {
    pub fn is_zero(&self) -> bool {
        *self == Usage::default()
    }

    fn add(&mut self, o: &Usage) {
        self.files = self.files.saturating_add(o.files);
        self.dirs = self.dirs.saturating_add(o.dirs);
        self.bytes = self.bytes.saturating_add(o.bytes);
    }

    fn negated(&self) -> Usage {
        Usage { files: -self.files, dirs: -self.dirs, bytes: -self.bytes }
    }
}

/// Stored form of [`Usage`] (one format byte, then this message).
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct StoredUsage {
    #[prost(sint64, tag = "1")]
    pub files: i64,
    #[prost(sint64, tag = "2")]
    pub dirs: i64,
    #[prost(sint64, tag = "3")]
    pub bytes: i64,
}

impl Record for Usage {
    type Stored = StoredUsage;
    fn to_stored(&self) -> StoredUsage {
        StoredUsage { files: self.files, dirs: self.dirs, bytes: self.bytes }
    }
    fn from_stored(s: StoredUsage) -> Result<Usage, String> {
        Ok(Usage { files: s.files, dirs: s.dirs, bytes: s.bytes })
    }
}

/// What inode `ino` adds to its parent's usage, and which parent that is (`None`: it
/// counts nowhere).
pub fn counted(ino: Ino, rec: &InodeRecord) -> Option<(Ino, Usage)> {
    let parent = rec.parent.filter(|&p| p != ino)?;
    match rec.kind {
        FileKind::Dir => Some((parent, Usage { dirs: 1, ..Default::default() })),
        _ if rec.nlink == 0 => None,
        _ => Some((parent, Usage { files: 1, dirs: 0, bytes: rec.size.min(i64::MAX as u64) as i64 })),
    }
}

/// The differences to add to directories' usage when inode `ino`'s record goes from
/// `before` to `after` (`None`: absent), at most two (the old parent and the new one).
pub fn differences(ino: Ino, before: Option<&InodeRecord>, after: Option<&InodeRecord>) -> Vec<(Ino, Usage)> {
    let old = before.and_then(|r| counted(ino, r));
    let new = after.and_then(|r| counted(ino, r));
    if old == new {
        return Vec::new();
    }
    match (old, new) {
        (Some((p, o)), Some((q, n))) if p == q => {
            let mut d = n;
            d.add(&o.negated());
            vec![(p, d)]
        }
        (old, new) => old.map(|(p, o)| (p, o.negated())).into_iter().chain(new).collect(),
    }
}

/// The name RocksDB records for the merge operator: a store written with usage records
/// cannot be opened without it.
pub const MERGE_NAME: &str = "shoal.usage.v1";

/// RocksDB's merge of `U` records: the sum of the existing value and every operand. Only
/// `U` keys are ever merged. A value that does not decode (a damaged record) adds nothing,
/// with a warning: failing the merge would fail RocksDB's compactions, which stops every
/// write to the store, for the sake of a counter.
pub fn merge(key: &[u8], existing: Option<&[u8]>, operands: &rocksdb::MergeOperands) -> Option<Vec<u8>> {
    let mut sum = Usage::default();
    for v in existing.into_iter().chain(operands) {
        match decoded(v) {
            Some(u) => sum.add(&u),
            None => tracing::warn!("usage record {key:02x?}: a value of {} bytes does not decode; left out", v.len()),
        }
    }
    Some(crate::store::records::encode(&sum))
}

fn decoded(v: &[u8]) -> Option<Usage> {
    match v.split_first()? {
        (&VALUE_PROTOBUF, rest) => Usage::from_stored(StoredUsage::decode(rest).ok()?).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::namespace::new_inode;
    use shoal_proto::msg::Timestamp;

    fn file(parent: u64, size: u64) -> InodeRecord {
        let mut r = new_inode(FileKind::File, 0o644, 0, 0, Timestamp::default());
        r.parent = Some(Ino(parent));
        r.size = size;
        r
    }

    #[test]
    fn a_changed_inode_moves_its_usage_between_parents() {
        let ino = Ino(50);
        let f = file(7, 100);
        assert_eq!(differences(ino, None, Some(&f)), vec![(Ino(7), Usage { files: 1, dirs: 0, bytes: 100 })]);
        assert_eq!(differences(ino, Some(&f), None), vec![(Ino(7), Usage { files: -1, dirs: 0, bytes: -100 })]);
        let grown = file(7, 250);
        assert_eq!(differences(ino, Some(&f), Some(&grown)), vec![(Ino(7), Usage { files: 0, dirs: 0, bytes: 150 })]);
        let moved = file(8, 100);
        assert_eq!(
            differences(ino, Some(&f), Some(&moved)),
            vec![
                (Ino(7), Usage { files: -1, dirs: 0, bytes: -100 }),
                (Ino(8), Usage { files: 1, dirs: 0, bytes: 100 })
            ]
        );
        let mut touched = f.clone();
        touched.mtime = Timestamp { secs: 9, nsecs: 0 };
        assert!(differences(ino, Some(&f), Some(&touched)).is_empty());
        // An unlinked file still open counts nowhere; the root counts nowhere.
        let mut orphan = f.clone();
        orphan.nlink = 0;
        assert_eq!(
            differences(ino, Some(&f), Some(&orphan)),
            vec![(Ino(7), Usage { files: -1, dirs: 0, bytes: -100 })]
        );
        let mut root = new_inode(FileKind::Dir, 0o755, 0, 0, Timestamp::default());
        root.parent = Some(Ino(1));
        assert!(counted(Ino(1), &root).is_none());
        root.parent = Some(Ino(3));
        assert_eq!(counted(Ino(1), &root), Some((Ino(3), Usage { files: 0, dirs: 1, bytes: 0 })));
    }

    #[test]
    fn merges_add_up_in_the_store_and_survive_a_reopen() {
        use crate::store::meta::{key, MetaStore};
        let dir = tempfile::tempdir().unwrap();
        let meta = MetaStore::open(dir.path()).unwrap();
        for (ino, size) in [(10, 5), (11, 7), (12, 0)] {
            let mut t = meta.txn();
            t.put_inode(Ino(ino), file(3, size)).unwrap();
            t.commit().unwrap();
        }
        let mut t = meta.txn();
        t.remove_inode(Ino(11)).unwrap();
        t.commit().unwrap();
        assert_eq!(meta.get_usage(Ino(3)).unwrap(), Usage { files: 2, dirs: 0, bytes: 5 });
        drop(meta);
        let meta = MetaStore::open(dir.path()).unwrap();
        assert_eq!(meta.get_usage(Ino(3)).unwrap(), Usage { files: 2, dirs: 0, bytes: 5 });
        assert_eq!(meta.get_usage(Ino(4)).unwrap(), Usage::default());
        // A damaged value is an error on read, not a panic.
        meta.put_raw(&key::usage(Ino(5)), b"\x03\xff\xff").unwrap();
        assert!(meta.get_usage(Ino(5)).is_err());
    }
}
