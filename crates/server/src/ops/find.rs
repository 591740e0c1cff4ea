//! `Find` (docs/find.md): one page of a metadata query over the directory entries this
//! server holds.
//!
//! The scan walks the `E` records in key order (directory, listing key, name) from where the
//! previous page stopped, so the client pages through the whole store with `next` and every
//! server of the cluster scans its own share at the same time. For each entry:
//!
//! * **Visibility.** The caller sees an entry only with read and search permission on its
//!   directory, checked against the directory's attributes held here (the inode at its
//!   home, the copy in a partition record elsewhere). Ancestors are not checked here, as
//!   for every request naming an inode (docs/security.md); the client only reports the
//!   entries it can reach from the path it asked about through directories the caller
//!   could see, so a user's answer is the one `find` would give them.
//! * **Directories** the caller may see are all returned in `dirs` (matching or not): the
//!   client builds paths from them.
//! * **Tests.** Name and kind first; then, when the inode is held here, its attributes and
//!   the extended attribute. An entry whose inode lives on another server (a directory
//!   placed elsewhere, a hard link) that passes the name tests is returned without
//!   attributes, and the client finishes its tests.
//!
//! A page stops after [`SCAN_MAX`] entries or `limit` matches, so one request holds the
//! blocking pool briefly however big the store is.

use crate::error::{Fail, R};
use crate::perm::{allowed, R_OK, X_OK};
use crate::state::State;
use crate::store::meta::{decode, key, EntryRecord, InodeRecord, PartitionRecord};
use shoal_proto::find::{FindPage, FindQuery, FoundDir, FoundEntry};
use shoal_proto::msg::{Cred, FileKind, Reply};
use shoal_proto::{Errno, Ino};
use std::collections::HashMap;
use std::sync::Arc;

/// Entries one page looks at, at most.
pub const SCAN_MAX: u64 = 50_000;
/// Matches one page returns, at most (and by default): a page stays well inside a frame.
pub const FOUND_MAX: u32 = 8192;

pub async fn find(st: &Arc<State>, cred: Cred, query: FindQuery, after: Option<Vec<u8>>, limit: u32) -> R<Reply> {
    let pattern = query.pattern().map_err(|e| Fail::new(Errno::EINVAL, e))?;
    if after.as_ref().is_some_and(|k| k.first() != Some(&key::ENTRY)) {
        return Err(Fail::new(Errno::EINVAL, "find: the page to continue from is not an entry key"));
    }
    let limit = if limit == 0 { FOUND_MAX } else { limit.min(FOUND_MAX) } as usize;
    st.blocking(move |st| {
        let mut page = FindPage::default();
        let mut dirs: HashMap<Ino, Option<InodeRecord>> = HashMap::new();
        // The first key after `after` (a key followed by a zero byte).
        let start = after.map(|mut k| {
            k.push(0);
            k
        });
        let mut last: Option<Vec<u8>> = None;
        let mut complete = true;
        st.meta.scan(&[key::ENTRY], start.as_deref(), |k, v| {
            if page.scanned >= SCAN_MAX || page.found.len() >= limit {
                complete = false;
                return Ok(false);
            }
            page.scanned += 1;
            last = Some(k.to_vec());
            let Some(dir) = key::entry_dir(k) else { return Ok(true) };
            let Some((_, name)) = key::entry_parts(k) else { return Ok(true) };
            let Ok(name) = std::str::from_utf8(name) else { return Ok(true) };
            let attrs = dirs.entry(dir).or_insert_with(|| directory(st, dir));
            let visible = attrs.as_ref().is_some_and(|d| allowed(&cred, &d.owner(), R_OK | X_OK));
            if !visible {
                return Ok(true);
            }
            let e: EntryRecord = decode(&format_args!("entry {name:?} of {dir}"), v)?;
            if e.kind == FileKind::Dir {
                page.dirs.push(FoundDir { dir, name: name.to_string(), ino: e.ino });
            }
            if !query.matches_name(pattern.as_ref(), name, e.kind, e.ino) {
                return Ok(true);
            }
            let found = |attr| FoundEntry { dir, name: name.to_string(), ino: e.ino, kind: e.kind, attr };
            match st.meta.get_inode(e.ino)? {
                // Not here: the client fetches the attributes and finishes the tests.
                None => page.found.push(found(None)),
                Some(rec) => {
                    let a = st.attr_of(e.ino, &rec, false);
                    let xattr = match &query.xattr {
                        Some(x) => st.meta.get_xattr(e.ino, x)?,
                        None => None,
                    };
                    if query.matches_attr(&a) && query.xattr_holds(xattr.as_deref()) {
                        page.found.push(found(Some(a)));
                    }
                }
            }
            Ok(true)
        })?;
        page.next = if complete { None } else { last };
        Ok(Reply::Found(page))
    })
    .await
}

/// The attributes of directory `dir` held here: its inode at its home, else the copy kept
/// with a partition of it (`None`: neither, and its entries are shown to nobody).
pub(crate) fn directory(st: &State, dir: Ino) -> Option<InodeRecord> {
    if let Ok(Some(rec)) = st.meta.get_inode(dir) {
        return Some(rec);
    }
    let mut copy = None;
    let _ = st.meta.scan(&key::partition_prefix(dir), None, |_, v| {
        copy = decode::<PartitionRecord>(&format_args!("a partition of {dir}"), v).ok().map(|p| p.dir);
        Ok(false)
    });
    copy
}
