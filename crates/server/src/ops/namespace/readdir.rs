//! `readdir(dir)`: a page of entries of one partition, in listing order, from a position.

use super::*;
use crate::error::R;
use crate::ops::*;
use crate::partitions::{misrouted, range_of, Partitions, Placed};
use crate::perm::{self, R_OK};
use crate::state::State;
use crate::store::meta::ListStart;
use shoal_proto::msg::{Cred, PartRef, Reply, READDIR_MAX};
use shoal_proto::Ino;
use std::sync::Arc;

/// A page of `dir` starting strictly after the name `after`, or at listing key `from`
/// (docs/protocol.md, "Listing order"), holding entries of the partition here that holds
/// that position only; and that partition. A listing of a partition that is splitting
/// waits for the split; a position held by another server fails `misrouted`.
pub async fn readdir(
    st: &Arc<State>,
    cred: Cred,
    dir: Ino,
    after: Option<String>,
    from: Option<u64>,
    limit: u32,
) -> R<(Reply, PartRef)> {
    let limit = if limit == 0 { READDIR_MAX } else { limit.min(READDIR_MAX) } as usize;
    let position = match &after {
        Some(name) => shoal_placement::listing_key(shoal_placement::name_hash(name)),
        None => from.unwrap_or(0),
    };
    let home = st.is_home(dir);
    let deadline = Partitions::deadline();
    loop {
        let generation = st.parts.generation();
        let part = match st.parts.place_position(dir, home, position) {
            Placed::Elsewhere => return Err(misrouted(dir)),
            Placed::Frozen => {
                let frozen = || st.parts.place_position(dir, home, position) == Placed::Frozen;
                st.parts.wait_changed(dir, deadline, frozen).await?;
                continue;
            }
            Placed::Here(part) | Placed::Sealed(part) => part,
        };
        // A listing showing a pinned name waits for the operation changing it (see
        // `Locks::read_unpinned`).
        let reply = st
            .locks
            .read_unpinned(
                dir,
                || {
                    let (cred, after) = (cred.clone(), after.clone());
                    st.store(move |st| {
                        let mut txn = st.meta.txn();
                        let d = parent_of(st, &mut txn, dir)?;
                        perm::check(&cred, &d.owner(), R_OK).map_err(|e| denied(e, format_args!("directory {dir}")))?;
                        let start = match &after {
                            Some(name) => ListStart::After(name),
                            None => ListStart::From(position),
                        };
                        let (entries, more) = st.meta.list_entries(dir, start, range_of(part), limit)?;
                        Ok(Reply::DirEntries { entries, more, part: Some(part) })
                    })
                },
                |reply| match reply {
                    Reply::DirEntries { entries, .. } => entries.iter().map(|e| e.name.clone()).collect(),
                    _ => Vec::new(),
                },
            )
            .await?;
        // A split that began after the routing may have moved part of the range meanwhile.
        if st.parts.generation() == generation {
            return Ok((reply, part));
        }
    }
}
