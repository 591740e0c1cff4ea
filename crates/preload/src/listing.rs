//! A directory being listed through a served descriptor or `DIR` stream: `.` and `..`
//! first, then the entries in the order the servers list them (by name hash), fetched a
//! page of 1,024 at a time as the reader gets there and kept, so that an entry's index is
//! its position (`telldir`/`seekdir`, `getdents64`'s `d_off`, `lseek` on the descriptor):
//! the same layout as the FUSE mount's listing. Going back to 0 (`rewinddir`, `lseek(fd,
//! 0, SEEK_SET)`) starts a fresh listing, which sees the directory as it is then.
//!
//! `d_type` is the entry's kind, except for symbolic links: DT_UNKNOWN, because a link
//! may stand for one of the mount's special files (a FIFO, a socket: see
//! `crates/fuse/src/fs.rs`), which only its target tells; a reader that needs the type
//! asks `lstat`, which the library answers as the mount does.

use crate::cluster::Cluster;
use crate::guard::Res;
use shoal_client::{FileKind, Ino};

const PAGE: u32 = 1024;

pub struct Entry {
    pub name: String,
    pub ino: u64,
    pub dtype: u8,
}

pub struct Listing {
    dir: Ino,
    parent: u64,
    entries: Vec<Entry>,
    after: Option<String>,
    more: bool,
}

impl Listing {
    /// The listing of directory `dir` whose parent is `parent` (itself for Shoal's root).
    pub fn new(dir: Ino, parent: u64) -> Listing {
        let mut l = Listing { dir, parent, entries: Vec::new(), after: None, more: true };
        l.restart();
        l
    }

    pub fn parent(&self) -> u64 {
        self.parent
    }

    fn restart(&mut self) {
        self.entries = vec![
            Entry { name: ".".into(), ino: self.dir.0, dtype: libc::DT_DIR },
            Entry { name: "..".into(), ino: self.parent, dtype: libc::DT_DIR },
        ];
        self.after = None;
        self.more = true;
    }

    /// The entry at `index`, fetching pages until it is there or the directory ends;
    /// at index 0, a fresh listing.
    pub fn get(&mut self, cluster: &Cluster, index: u64) -> Res<Option<&Entry>> {
        if index == 0 && self.entries.len() > 2 {
            self.restart();
        }
        let index = index as usize;
        while index >= self.entries.len() && self.more {
            let (page, more) = cluster.block_on(cluster.client.readdir_page(self.dir, self.after.clone(), PAGE))?;
            self.more = more && !page.is_empty();
            if let Some(last) = page.last() {
                self.after = Some(last.name.clone());
            }
            self.entries.extend(page.into_iter().map(|d| Entry {
                dtype: match d.kind {
                    FileKind::File => libc::DT_REG,
                    FileKind::Dir => libc::DT_DIR,
                    FileKind::Symlink => libc::DT_UNKNOWN,
                },
                name: d.name,
                ino: d.ino.0,
            }));
        }
        Ok(self.entries.get(index))
    }
}
