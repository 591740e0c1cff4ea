//! `lookup(dir, name)`: one entry, with the attributes when the inode is local.

use super::*;
use crate::error::R;
use crate::ops::*;
use crate::perm::{self, X_OK};
use crate::state::State;
use shoal_proto::msg::{Cred, EntryOut, PartRef, Reply};
use shoal_proto::Ino;
use std::sync::Arc;

/// The answer (an entry or, say, ENOENT) and the partition it comes from. The outer error
/// is a failure to route the name here (another server holds it, or a split took too long).
pub async fn lookup(st: &Arc<State>, cred: Cred, dir: Ino, name: String) -> R<(R<Reply>, PartRef)> {
    name_ok(&name)?;
    loop {
        let (part, generation) = route_read(st, dir, &name).await?;
        // A pinned name waits for the operation changing it (see `Locks::read_unpinned`).
        let answer = st
            .locks
            .read_unpinned(
                dir,
                || {
                    let (cred, name) = (cred.clone(), name.clone());
                    st.store(move |st| Ok(read(st, &cred, dir, &name)))
                },
                |_| vec![name.clone()],
            )
            .await?;
        // A split that began after the routing may have moved the name away meanwhile.
        if st.parts.generation() == generation {
            return Ok((answer, part));
        }
    }
}

fn read(st: &State, cred: &Cred, dir: Ino, name: &str) -> R<Reply> {
    let mut txn = st.meta.txn();
    let d = parent_of(st, &mut txn, dir)?;
    perm::check(cred, &d.owner(), X_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
    let e = txn.entry(dir, name)?.ok_or_else(|| no_entry(dir, name))?;
    let attr = if st.is_home(e.ino) { txn.inode(e.ino)?.cloned().map(|r| st.attr_of(e.ino, &r, true)) } else { None };
    Ok(Reply::Entry(EntryOut { ino: e.ino, kind: e.kind, attr, cap: None, attr_lease: None }))
}
