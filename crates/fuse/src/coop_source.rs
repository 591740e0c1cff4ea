//! What this mount answers its coop group with (`crates/coop`, docs/loading.md,
//! "Cooperative reads"): its own client's view of the servers, exact under its leases.
//! Asked only as an object's designated reader, or when a member failed.

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use parking_lot::Mutex;
use shoal_client::{Client, File, OpenFlags};
use shoal_coop::wire::{Named, Version};
use shoal_coop::{Failure, Source, PIECE};
use shoal_proto::msg::Attr;
use shoal_proto::{Errno, Ino};
use std::collections::HashMap;
use std::sync::Arc;

/// Files kept open for reading pieces, at most (then all are closed and reopened as asked).
const OPEN_MAX: usize = 1024;

pub(crate) struct MountSource {
    /// The mount's client as root: members are mounts of the cluster (they proved the host
    /// key), and each checks its own users' permissions from the attributes it is given.
    client: Client,
    /// One open file per inode, at the version it was opened at: pieces of it are read
    /// with one open, not one per piece.
    open: Mutex<HashMap<Ino, (Version, Arc<File>)>>,
}

fn failure(e: shoal_client::Error) -> Failure {
    Failure::new(e.errno, e.to_string())
}

impl MountSource {
    pub(crate) fn new(client: Client) -> MountSource {
        MountSource { client, open: Mutex::new(HashMap::new()) }
    }

    /// An open file of `ino` at `version` (ESTALE if the file is at another now).
    async fn file_at(&self, ino: Ino, version: Version) -> Result<Arc<File>, Failure> {
        if let Some((v, f)) = self.open.lock().get(&ino) {
            if *v == version {
                return Ok(f.clone());
            }
        }
        let f = Arc::new(self.client.open_ino(ino, OpenFlags::read_only()).await.map_err(failure)?);
        let now = Version::of(&f.attr());
        if now != version {
            return Err(Failure::new(Errno::ESTALE, format!("inode {ino} is no longer at the version asked for")));
        }
        let mut open = self.open.lock();
        if open.len() >= OPEN_MAX {
            open.clear();
        }
        open.insert(ino, (version, f.clone()));
        Ok(f)
    }
}

impl Source for MountSource {
    fn attr(&self, ino: Ino) -> BoxFuture<'_, Result<Attr, Failure>> {
        async move { self.client.getattr_fresh(ino).await.map_err(failure) }.boxed()
    }

    fn listing(&self, dir: Ino) -> BoxFuture<'_, Result<Vec<Named>, Failure>> {
        async move {
            let entries = self.client.readdir_at(dir).await.map_err(failure)?;
            let names: Vec<String> = entries.into_iter().map(|e| e.name).collect();
            let attrs = self.client.lookup_many(dir, &names).await.map_err(failure)?;
            let mut out = Vec::with_capacity(names.len());
            for (name, a) in names.into_iter().zip(attrs) {
                match a {
                    Ok(attr) => out.push(Named { name, attr }),
                    // Removed since it was listed.
                    Err(e) if e.errno == Errno::ENOENT => {}
                    Err(e) => return Err(failure(e)),
                }
            }
            Ok(out)
        }
        .boxed()
    }

    fn entry(&self, dir: Ino, name: &str) -> BoxFuture<'_, Result<Attr, Failure>> {
        let name = name.to_string();
        async move { self.client.lookup(dir, &name).await.map_err(failure) }.boxed()
    }

    fn piece(&self, ino: Ino, version: Version, index: u64) -> BoxFuture<'_, Result<Bytes, Failure>> {
        async move {
            let f = self.file_at(ino, version).await?;
            let start = index.saturating_mul(PIECE);
            let len = PIECE.min(version.size.saturating_sub(start)) as usize;
            let bytes = f.read_at(start, len).await.map_err(failure)?;
            // Read while the file was at that version: the bytes are of it.
            let now = self.client.getattr_fresh(ino).await.map_err(failure)?;
            if Version::of(&now) != version {
                self.open.lock().remove(&ino);
                return Err(Failure::new(
                    Errno::ESTALE,
                    format!("inode {ino} changed while its piece {index} was read"),
                ));
            }
            Ok(bytes)
        }
        .boxed()
    }
}
