//! `lookup(dir, name)`: one entry, with the attributes when the inode is local.

use super::*;
use crate::error::R;
use crate::ops::*;
use crate::perm::{self, X_OK};
use crate::state::State;
use shoal_proto::msg::{Cred, EntryOut, Reply};
use shoal_proto::Ino;
use std::sync::Arc;

pub async fn lookup(st: &Arc<State>, cred: Cred, dir: Ino, name: String) -> R<Reply> {
    st.require_home(dir)?;
    name_ok(&name)?;
    // A pinned name waits for the operation changing it (see `Locks::read_unpinned`).
    st.locks
        .read_unpinned(
            dir,
            || {
                let (cred, name) = (cred.clone(), name.clone());
                st.store(move |st| Ok(read(st, &cred, dir, &name)))
            },
            |_| vec![name.clone()],
        )
        .await?
}

fn read(st: &State, cred: &Cred, dir: Ino, name: &str) -> R<Reply> {
    let mut txn = st.meta.txn();
    let d = txn.dir(dir)?;
    perm::check(cred, &d.owner(), X_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
    let e = txn.entry(dir, name)?.ok_or_else(|| no_entry(dir, name))?;
    let attr = if st.is_home(e.ino) { txn.inode(e.ino)?.cloned().map(|r| st.attr_of(e.ino, &r, true)) } else { None };
    Ok(Reply::Entry(EntryOut { ino: e.ino, kind: e.kind, attr, cap: None }))
}
