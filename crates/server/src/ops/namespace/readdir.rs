//! `readdir(dir)`: a page of entries after a given name, in listing order (`store::meta`).

use crate::error::R;
use crate::ops::*;
use crate::perm::{self, R_OK};
use crate::state::State;
use crate::store::meta::ListStart;
use shoal_proto::msg::{Cred, Reply, READDIR_MAX};
use shoal_proto::Ino;
use std::sync::Arc;

pub async fn readdir(st: &Arc<State>, cred: Cred, dir: Ino, after: Option<String>, limit: u32) -> R<Reply> {
    st.require_home(dir)?;
    let limit = if limit == 0 { READDIR_MAX } else { limit.min(READDIR_MAX) } as usize;
    // A listing showing a pinned name waits for the operation changing it (see
    // `Locks::read_unpinned`).
    st.locks
        .read_unpinned(
            dir,
            || {
                let (cred, after) = (cred.clone(), after.clone());
                st.store(move |st| {
                    let mut txn = st.meta.txn();
                    let d = txn.dir(dir)?;
                    perm::check(&cred, &d.owner(), R_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
                    let start = match after.as_deref() {
                        Some(name) => ListStart::After(name),
                        None => ListStart::From(0),
                    };
                    let (entries, more) = st.meta.list_entries(dir, start, (0, u64::MAX), limit)?;
                    Ok(Reply::DirEntries { entries, more, part: None })
                })
            },
            |reply| match reply {
                Reply::DirEntries { entries, .. } => entries.iter().map(|e| e.name.clone()).collect(),
                _ => Vec::new(),
            },
        )
        .await
}
