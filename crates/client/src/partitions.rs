//! The partition bitmaps of split directories this client has learnt (docs/architecture.md,
//! "Split directories"), and where they send a request about a name.
//!
//! A directory's entries may be split over servers by the hash of their names (GIGA+). The
//! client routes a request about `dir/name` to `ClusterMap::entry_home(dir, bitmap, name)`
//! with the bitmap it has cached for `dir`; none cached means unsplit (partition 0, on
//! `home_of(dir)`). A server that does not hold the name's partition answers
//! `Reply::Partitions` with the directory's current bitmap: the client merges it here and
//! sends again. Because a split registers the new partition at the directory's home before
//! the old server stops serving the moved names, the second try is right; [`MAX_TRIES`]
//! bounds the loop anyway, so that a server bug cannot make a client spin.
//!
//! Invariants: bitmaps only grow (learning one is [`Bitmap::merge`]), so an older answer
//! can never undo a newer one; only split directories are kept (an unsplit one is the
//! default), and at most [`MAX_SPLIT_DIRS`] of them: past that everything is forgotten
//! (as `cache.rs` does), which costs at most one extra request per directory to relearn.

use crate::error::{Error, Result};
use parking_lot::RwLock;
use shoal_placement::{Bitmap, ClusterMap};
use shoal_proto::{Errno, Ino, ServerId};
use std::collections::HashMap;

/// Split directories whose bitmaps are remembered at once (a bitmap is 8 bytes up to 64
/// partitions; a client may touch millions of directories, but few of them are split).
pub(crate) const MAX_SPLIT_DIRS: usize = 1 << 16;

/// Sends of one request about a name before giving up with EIO: the design needs 2 (the
/// stale try and the right one); the margin covers splits that happen in between.
pub(crate) const MAX_TRIES: u32 = 4;

/// The bitmaps learnt, by directory.
pub(crate) struct Bitmaps {
    limit: usize,
    dirs: RwLock<HashMap<Ino, Bitmap>>,
}

impl Default for Bitmaps {
    fn default() -> Self {
        Bitmaps::with_limit(MAX_SPLIT_DIRS)
    }
}

impl Bitmaps {
    pub(crate) fn with_limit(limit: usize) -> Bitmaps {
        Bitmaps { limit: limit.max(1), dirs: RwLock::new(HashMap::new()) }
    }

    /// The bitmap known for `dir` (partition 0 only when none is).
    pub(crate) fn get(&self, dir: Ino) -> Bitmap {
        self.dirs.read().get(&dir).cloned().unwrap_or_default()
    }

    /// The server holding the names of `dir` whose hash is `hash`, as far as this client
    /// knows (for a listing position `key`, `hash` is `key.reverse_bits()`).
    pub(crate) fn server_for(&self, map: &ClusterMap, dir: Ino, hash: u64) -> ServerId {
        match self.dirs.read().get(&dir) {
            None => map.home_of(dir),
            Some(b) => map.partition_home(dir, b.partition_of(hash)),
        }
    }

    /// Merge the bitmap a server sent for `dir` (`Reply::Partitions`). A bitmap that does
    /// not decode (no partition 0, a partition without its parent, past the depth limit)
    /// is a protocol error naming the directory.
    pub(crate) fn learn(&self, dir: Ino, words: Vec<u64>) -> Result<()> {
        let got = Bitmap::try_from(words)
            .map_err(|e| Error::new(Errno::EPROTO, format!("partition bitmap of directory {dir}: {e}")))?;
        if got.len() <= 1 {
            return Ok(());
        }
        let mut dirs = self.dirs.write();
        if dirs.len() >= self.limit && !dirs.contains_key(&dir) {
            dirs.clear();
        }
        dirs.entry(dir).or_default().merge(&got);
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.dirs.read().len()
    }
}

/// The error after [`MAX_TRIES`] sends of a request about `dir` were each answered with
/// another bitmap.
pub(crate) fn too_many_redirects(dir: Ino) -> Error {
    Error::new(
        Errno::EIO,
        format!("directory {dir}: servers kept answering with a newer partition bitmap after {MAX_TRIES} tries"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_placement::name_hash;
    use std::path::Path;

    #[test]
    fn an_unknown_directory_routes_to_its_home() {
        let map = ClusterMap::local(4, 1, Path::new("/tmp"));
        let b = Bitmaps::default();
        for d in 1..50u64 {
            assert_eq!(b.server_for(&map, Ino(d), name_hash("x")), map.home_of(Ino(d)));
        }
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn a_learnt_bitmap_routes_each_name_to_its_partition_server() {
        let map = ClusterMap::local(4, 1, Path::new("/tmp"));
        let b = Bitmaps::default();
        let dir = Ino(77);
        let mut full = Bitmap::new();
        full.split(0).unwrap();
        full.split(0).unwrap();
        full.split(1).unwrap();
        b.learn(dir, full.clone().into()).unwrap();
        let mut servers = std::collections::HashSet::new();
        for i in 0..200 {
            let name = format!("f{i}");
            let want = map.entry_home(dir, &full, &name).1;
            assert_eq!(b.server_for(&map, dir, name_hash(&name)), want, "{name}");
            servers.insert(want);
        }
        assert_eq!(servers.len(), 4, "4 partitions on 4 servers");
    }

    #[test]
    fn bitmaps_only_grow() {
        let b = Bitmaps::default();
        let dir = Ino(5);
        let mut two = Bitmap::new();
        two.split(0).unwrap();
        let mut four = two.clone();
        four.split(0).unwrap();
        four.split(1).unwrap();
        b.learn(dir, four.clone().into()).unwrap();
        b.learn(dir, two.into()).unwrap();
        assert_eq!(b.get(dir), four, "an older answer does not shrink the bitmap");
        b.learn(dir, Bitmap::new().into()).unwrap();
        assert_eq!(b.get(dir), four);
    }

    #[test]
    fn unsplit_directories_are_not_kept_and_the_cache_is_bounded() {
        let b = Bitmaps::with_limit(3);
        b.learn(Ino(1), Bitmap::new().into()).unwrap();
        assert_eq!(b.len(), 0);
        let mut two = Bitmap::new();
        two.split(0).unwrap();
        for d in 1..=3 {
            b.learn(Ino(d), two.clone().into()).unwrap();
        }
        assert_eq!(b.len(), 3);
        b.learn(Ino(4), two.clone().into()).unwrap();
        assert!(b.len() <= 3, "past the bound, older entries go");
        assert_eq!(b.get(Ino(4)), two);
    }

    #[test]
    fn a_corrupt_bitmap_is_a_protocol_error_naming_the_directory() {
        let b = Bitmaps::default();
        let e = b.learn(Ino(9), vec![0b10]).unwrap_err();
        assert_eq!(e.errno, Errno::EPROTO);
        assert!(e.to_string().contains(&format!("directory {}", Ino(9))), "{e}");
    }
}
