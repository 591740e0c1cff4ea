//! Fewer copies than the slot keeps: a file whose layout asks for fewer copies of its data
//! than the cluster keeps of every slot (`replicas = 1` for scratch data in a cluster of
//! `replicas = 2`, say: docs/replicas.md) has its objects' bytes sent only to as many of
//! the slot's mirrors as it wants copies besides the primary's. Mirrors past that count are
//! sent a mark instead (`ReplChange::Unkept`): they drop any bytes of the object and, if
//! ever served after a failover, answer `EIO` for it rather than the zeros a missing object
//! reads as (`DataStore::mark_unkept`).
//!
//! **Who is thinned.** A mirror's rank is its place in the map's mirror list of the slot
//! (`ClusterMap::mirrors_of`: the first is promoted first), counting from 1; a change of an
//! object whose file wants `copies` goes as a mark to the mirrors of rank `copies` and
//! above. Nothing is thinned
//! * while the slot is served from a copy after a failover (`served_by`): the copy keeps
//!   every object written meanwhile in full, on every mirror and on the slot's own server
//!   standing by (more copies than asked, never fewer: the server taking the slot back
//!   keeps them);
//! * to a slot's destination while it moves (`moving_to`): it is the slot's next primary
//!   and must hold every object.
//!
//! **Resync** (`resync.rs`) keeps what the marks mean: an object the primary holds only the
//! mark of is never shipped over the mirror's bytes (a slot's own server taking its slot back
//! from the copy that served it holds the one copy), and its mark goes to a mirror that has
//! nothing of it; a mark on a mirror that must hold every object is replaced by the bytes.
//!
//! **Invariant.** For every object of a file that wants `c` copies, the slot's primary and
//! its mirrors of rank below `c` hold its bytes, the others its mark or its bytes; a store
//! that holds the mark never answers with zeros for it.

use crate::state::State;
use bytes::Bytes;
use shoal_proto::msg::ReplChange;
use shoal_proto::ServerId;

/// `mirror`'s rank among the mirrors of this server's slot when its changes may be thinned
/// (see the module doc); `None` when it must be sent every object in full.
pub fn rank_of(st: &State, mirror: ServerId) -> Option<usize> {
    let map = st.map.get();
    let entry = map.server(st.id)?;
    if entry.served_by.is_some() || entry.moving_to == Some(mirror.0) || mirror == st.id {
        return None;
    }
    map.mirrors_of(st.id).iter().position(|&m| m == mirror).map(|p| p + 1)
}

/// The changes as a mirror of `rank` is to receive them: every write or cut of an object
/// whose file wants at most `rank` copies becomes its mark, without bytes. One change for
/// one, so that positions stay the log's.
pub fn thin(changes: Vec<ReplChange>, data: Vec<Bytes>, rank: usize) -> (Vec<ReplChange>, Vec<Bytes>) {
    changes
        .into_iter()
        .zip(data)
        .map(|(change, bytes)| match change {
            ReplChange::Write { ino, index, copies, .. } | ReplChange::Truncate { ino, index, copies, .. }
                if (copies as usize) <= rank =>
            {
                (ReplChange::Unkept { ino, index }, Bytes::new())
            }
            other => (other, bytes),
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::Ino;

    #[test]
    fn a_mirror_past_the_files_count_gets_marks_and_the_others_the_bytes() {
        let changes = vec![
            ReplChange::Write { ino: Ino(5), index: 0, offset: 0, len: 3, copies: 1 },
            ReplChange::Write { ino: Ino(6), index: 1, offset: 8, len: 2, copies: 2 },
            ReplChange::Truncate { ino: Ino(5), index: 0, len: 1, copies: 1 },
            ReplChange::Meta { len: 4 },
        ];
        let data =
            vec![Bytes::from_static(b"abc"), Bytes::from_static(b"de"), Bytes::new(), Bytes::from_static(b"meta")];
        let (first, bytes) = thin(changes.clone(), data.clone(), 1);
        assert_eq!(
            first,
            vec![
                ReplChange::Unkept { ino: Ino(5), index: 0 },
                changes[1].clone(),
                ReplChange::Unkept { ino: Ino(5), index: 0 },
                changes[3].clone(),
            ]
        );
        assert_eq!(bytes, vec![Bytes::new(), data[1].clone(), Bytes::new(), data[3].clone()]);
        // The second mirror of three copies: the file of two copies is not kept there either.
        let (second, bytes) = thin(changes.clone(), data.clone(), 2);
        assert!(matches!(second[1], ReplChange::Unkept { ino: Ino(6), index: 1 }));
        assert_eq!(bytes.iter().map(Bytes::len).sum::<usize>(), 4);
    }
}
