//! Files this client has open, so that removing the last name of one keeps it usable until
//! its last handle closes (POSIX), as on a local file system.
//!
//! Every [`File`](crate::File) handle on a regular file counts here from open to drop. An
//! unlink or rename over a name that is one of these files carries
//! `KeepOpen { ino, session }`: if the name was the file's last, the inode's home server
//! keeps it as an orphan of this client's session (no name, link count 0, data intact)
//! instead of deleting it. The last handle's close (or drop) then sends `ReleaseOrphan`,
//! and the server deletes the file. If the client dies first, the server deletes it once
//! the session has had no connection to it for its grace period (docs/architecture.md).

use crate::cache::EntryHit;
use crate::client::{Client, To};
use bytes::Bytes;
use parking_lot::Mutex;
use shoal_proto::msg::{KeepOpen, Op};
use shoal_proto::Ino;
use std::collections::HashMap;

/// A random id for this client instance (never 0, which servers send).
pub(crate) fn new_session() -> u64 {
    rand::random::<u64>() | 1
}

#[derive(Default)]
pub(crate) struct OpenFiles {
    /// ino → (handles, whether a name of it was removed while open)
    map: Mutex<HashMap<Ino, (usize, bool)>>,
}

impl OpenFiles {
    pub(crate) fn opened(&self, ino: Ino) {
        self.map.lock().entry(ino).or_default().0 += 1;
    }

    /// One handle fewer; true if it was the last and the file may be an orphan to release.
    pub(crate) fn closed(&self, ino: Ino) -> bool {
        let mut m = self.map.lock();
        let Some(e) = m.get_mut(&ino) else { return false };
        e.0 -= 1;
        if e.0 > 0 {
            return false;
        }
        m.remove(&ino).is_some_and(|(_, orphaned)| orphaned)
    }

    fn is_empty(&self) -> bool {
        self.map.lock().is_empty()
    }

    fn is_open(&self, ino: Ino) -> bool {
        self.map.lock().contains_key(&ino)
    }

    fn mark_orphaned(&self, ino: Ino) {
        if let Some(e) = self.map.lock().get_mut(&ino) {
            e.1 = true;
        }
    }
}

impl Client {
    /// What to say in an unlink or rename that removes `dir/name`: `KeepOpen` if the name is
    /// (as far as the cache or a lookup tells) a file this client has open. `cached`: what
    /// the cache holds for the name (`Some(None)`: known not to exist). Costs nothing when
    /// no file is open; a lookup when one is and the name is not cached.
    pub(crate) async fn keep_for(&self, dir: Ino, name: &str, cached: EntryHit) -> Option<KeepOpen> {
        let open = self.open_files();
        if open.is_empty() {
            return None;
        }
        let ino = match cached {
            Some(Some((ino, _))) => ino,
            Some(None) => return None,
            None => self.lookup(dir, name).await.ok()?.ino,
        };
        if !open.is_open(ino) {
            return None;
        }
        // From now on the file may be an orphan (also if the reply is lost): its last close
        // releases it, which does nothing if it is not one.
        open.mark_orphaned(ino);
        Some(KeepOpen { ino, session: self.session() })
    }

    /// After an unlink or rename that carried `keep` succeeded: the attributes of the file
    /// are fetched afresh (link count 0 if the name was its last), which also opens a
    /// connection to its home server if there was none: an orphan stays while its session
    /// is connected there.
    pub(crate) async fn kept(&self, keep: Option<KeepOpen>) {
        let Some(k) = keep else { return };
        if let Err(e) = self.getattr_fresh_inner(k.ino).await {
            tracing::debug!("attributes of {} after removing a name of it while open: {e}", k.ino);
        }
    }

    /// The last handle on `ino` closed and a name of it was removed while it was open:
    /// have its home server delete it if it is an orphan of this session.
    pub(crate) async fn release_orphan(&self, ino: Ino) {
        let op = Op::ReleaseOrphan { ino, session: self.session() };
        if let Err(e) = self.call(To::Home(ino), op, Bytes::new()).await {
            tracing::warn!("releasing {ino}, removed while open: {e} (its server deletes it after a grace period)");
        }
    }
}
