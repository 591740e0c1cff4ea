//! Striping: from a layout spec to a concrete layout, and from a byte range of a file to
//! the pieces of data objects that hold it.

use crate::ClusterMap;
use shoal_proto::msg::{
    Layout, LayoutSpec, PlacementPolicy, REPLICAS_MAX, STRIPE_COUNT_MAX, STRIPE_SIZE_MAX, STRIPE_SIZE_MIN,
};
use shoal_proto::{Errno, Ino, ServerId};

/// Check a layout that a request asks for (a new file's, or a directory's default) against
/// the map: the stripe size in range, at most as many servers as can hold data
/// (`u32::MAX` = all of them; 0 or unset = the default), a first server that can hold data.
/// The message names the field and what is allowed. [`resolve_layout`] itself clamps the
/// count instead, because a directory default that was valid may outnumber the servers
/// after one is marked out, and files must still be creatable there.
pub fn check_spec(map: &ClusterMap, spec: &LayoutSpec) -> Result<(), String> {
    check_replicas(spec)?;
    if let Some(ss) = spec.stripe_size {
        if !(STRIPE_SIZE_MIN..=STRIPE_SIZE_MAX).contains(&ss) || !ss.is_multiple_of(STRIPE_SIZE_MIN) {
            return Err(format!("stripe size {ss} must be a multiple of 4096 between 4 KiB and 1 GiB"));
        }
    }
    let n = map.placeable().count();
    if let Some(c) = spec.stripe_count.filter(|&c| c != u32::MAX && c as usize > n) {
        return Err(format!("stripe count {c} is more than the {n} servers that can hold data"));
    }
    if let Some(f) = spec.first_server {
        if !map.placeable().any(|s| s.id == f.0) {
            return Err(format!("first server {f} is not a server of the cluster map that can hold data"));
        }
    }
    Ok(())
}

/// Check the replica count a request asks for: 1 ..= [`REPLICAS_MAX`], or unset (inherit).
/// A count above the cluster's (`[cluster] replicas`) is not an error: it is capped when a
/// file is created (see [`resolve_layout_by`]), so that a directory default stays valid
/// on a cluster that keeps fewer copies.
pub fn check_replicas(spec: &LayoutSpec) -> Result<(), String> {
    match spec.replicas {
        Some(r) if !(1..=REPLICAS_MAX).contains(&r) => Err(format!("replica count {r} must be 1 to {REPLICAS_MAX}")),
        _ => Ok(()),
    }
}

/// Decide the layout of a new file `ino` whose inode lives on `home`. `spec` is what the
/// request asked for; unset fields come from `dir_default`, then from the cluster defaults.
/// Without load information the `load` policy places as `spread` does. The replica count
/// comes the same way (request, directory default, cluster default) and is capped to the
/// cluster's replica count: metadata is always kept at the cluster's count, because a
/// file is reachable only through its ancestors' metadata, so more copies of its data than
/// of the directories above it would protect nothing.
pub fn resolve_layout(
    map: &ClusterMap,
    ino: Ino,
    home: ServerId,
    spec: Option<&LayoutSpec>,
    dir_default: Option<&LayoutSpec>,
) -> Result<Layout, Errno> {
    resolve_layout_by(map, ino, home, spec, dir_default, &|_| Vec::new())
}

/// [`resolve_layout`], where the `load` policy (without an explicit first server) takes the
/// servers `by_load(count)` names: `count` distinct placeable servers, least loaded first
/// (the server's load table decides; this crate does no I/O). Any other answer (none, too
/// few, a server that cannot hold data) falls back to `spread`, so a file can always be
/// created. The result is stored in the inode: reads never depend on load.
pub fn resolve_layout_by(
    map: &ClusterMap,
    ino: Ino,
    home: ServerId,
    spec: Option<&LayoutSpec>,
    dir_default: Option<&LayoutSpec>,
    by_load: &dyn Fn(u32) -> Vec<ServerId>,
) -> Result<Layout, Errno> {
    let pick = |f: &dyn Fn(&LayoutSpec) -> Option<u64>| spec.and_then(f).or_else(|| dir_default.and_then(f));
    let stripe_size = pick(&|s| s.stripe_size).unwrap_or(map.cluster.stripe_size);
    let replicas = pick(&|s| s.replicas.map(u64::from)).map(|r| r as u8).unwrap_or(map.cluster.replicas);
    if !(1..=REPLICAS_MAX).contains(&replicas) {
        return Err(Errno::EINVAL);
    }
    let replicas = replicas.min(map.cluster.replicas);
    if !(STRIPE_SIZE_MIN..=STRIPE_SIZE_MAX).contains(&stripe_size) || stripe_size % STRIPE_SIZE_MIN != 0 {
        return Err(Errno::EINVAL);
    }
    let n = map.placeable().count() as u32;
    let count = pick(&|s| s.stripe_count.filter(|&c| c != 0).map(u64::from))
        .map(|c| c as u32)
        .unwrap_or(if map.cluster.stripe_count == 0 { n } else { map.cluster.stripe_count });
    if count > STRIPE_COUNT_MAX && count != u32::MAX {
        return Err(Errno::EINVAL);
    }
    let count = count.min(n).max(1);
    let policy =
        spec.and_then(|s| s.policy).or_else(|| dir_default.and_then(|s| s.policy)).unwrap_or(map.cluster.policy);
    let first = spec
        .and_then(|s| s.first_server)
        .or_else(|| dir_default.and_then(|s| s.first_server))
        .filter(|f| map.placeable().any(|s| s.id == f.0));
    if let (PlacementPolicy::Load, None) = (policy, first) {
        let chosen = by_load(count);
        let distinct = chosen.iter().collect::<std::collections::HashSet<_>>().len() == chosen.len();
        if chosen.len() == count as usize && distinct && chosen.iter().all(|c| map.placeable().any(|s| s.id == c.0)) {
            return Ok(Layout { stripe_size, servers: chosen, replicas });
        }
    }
    let first = first.unwrap_or(match policy {
        PlacementPolicy::Same => home,
        PlacementPolicy::Spread | PlacementPolicy::Load => map.rank(ino.0 ^ 0xDA7A)[0],
    });
    Ok(Layout { stripe_size, servers: map.servers_from(first, count), replicas })
}

/// A contiguous part of a file range that lies in one data object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Which object (index into `Layout::servers`).
    pub index: u32,
    /// Offset inside that object.
    pub object_offset: u64,
    /// Offset in the file.
    pub file_offset: u64,
    pub len: u64,
}

/// Split `[offset, offset+len)` of a file into per-object pieces, in file order.
pub fn pieces(layout: &Layout, offset: u64, len: u64) -> Vec<Piece> {
    let ss = layout.stripe_size;
    let count = layout.servers.len() as u64;
    let mut out = Vec::new();
    let mut pos = offset;
    let end = offset.saturating_add(len);
    while pos < end {
        let stripe = pos / ss;
        let within = pos % ss;
        let take = (ss - within).min(end - pos);
        out.push(Piece {
            index: (stripe % count) as u32,
            object_offset: (stripe / count) * ss + within,
            file_offset: pos,
            len: take,
        });
        pos += take;
    }
    out
}

/// How long object `index` is when the file is `size` bytes long (for truncate).
pub fn object_len(layout: &Layout, index: u32, size: u64) -> u64 {
    let ss = layout.stripe_size;
    let count = layout.servers.len() as u64;
    let full_stripes = size / ss;
    let rest = size % ss;
    let idx = index as u64;
    // Stripes held by this object among the full ones: idx, idx+count, ...
    let mine = if full_stripes > idx { (full_stripes - idx).div_ceil(count) } else { 0 };
    let mut len = mine * ss;
    if rest > 0 && full_stripes % count == idx {
        len += rest;
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout(ss: u64, n: u32) -> Layout {
        Layout { stripe_size: ss, servers: (0..n).map(ServerId).collect(), replicas: 1 }
    }

    #[test]
    fn pieces_follow_the_round_robin() {
        let l = layout(4096, 3);
        let p = pieces(&l, 4000, 9000);
        assert_eq!(p[0], Piece { index: 0, object_offset: 4000, file_offset: 4000, len: 96 });
        assert_eq!(p[1], Piece { index: 1, object_offset: 0, file_offset: 4096, len: 4096 });
        assert_eq!(p[2], Piece { index: 2, object_offset: 0, file_offset: 8192, len: 4096 });
        assert_eq!(p[3], Piece { index: 0, object_offset: 4096, file_offset: 12288, len: 712 });
    }

    proptest! {
        #[test]
        fn object_lengths_add_up_to_the_file_size(ss_k in 1u64..8, n in 1u32..6, size in 0u64..200_000) {
            let l = layout(ss_k * 4096, n);
            let total: u64 = (0..n).map(|i| object_len(&l, i, size)).sum();
            prop_assert_eq!(total, size);
            // and the last byte's piece ends exactly at its object's length
            if size > 0 {
                let p = pieces(&l, size - 1, 1)[0];
                prop_assert_eq!(object_len(&l, p.index, size), p.object_offset + 1);
            }
        }

        #[test]
        fn pieces_cover_the_range_exactly(ss_k in 1u64..4, n in 1u32..5, off in 0u64..100_000, len in 0u64..100_000) {
            let l = layout(ss_k * 4096, n);
            let ps = pieces(&l, off, len);
            let mut pos = off;
            for p in &ps { prop_assert_eq!(p.file_offset, pos); prop_assert!(p.len > 0); pos += p.len; }
            prop_assert_eq!(pos, off + len);
        }
    }

    #[test]
    fn a_requested_layout_is_checked_against_the_servers() {
        let m = ClusterMap::local(4, 7000, std::path::Path::new("/tmp"));
        let spec = |c: u32| LayoutSpec { stripe_count: Some(c), ..Default::default() };
        assert_eq!(
            check_spec(&m, &spec(999)),
            Err("stripe count 999 is more than the 4 servers that can hold data".into())
        );
        assert!(check_spec(&m, &spec(5)).is_err());
        for ok in [0, 1, 4, u32::MAX] {
            check_spec(&m, &spec(ok)).unwrap();
        }
        let size = LayoutSpec { stripe_size: Some(1000), ..Default::default() };
        assert!(check_spec(&m, &size).unwrap_err().starts_with("stripe size 1000"));
        let first = LayoutSpec { first_server: Some(ServerId(9)), ..Default::default() };
        assert!(check_spec(&m, &first).unwrap_err().starts_with("first server s9"));
        let replicas = |r: u8| LayoutSpec { replicas: Some(r), ..Default::default() };
        assert_eq!(check_spec(&m, &replicas(0)), Err("replica count 0 must be 1 to 3".into()));
        assert_eq!(check_spec(&m, &replicas(4)), Err("replica count 4 must be 1 to 3".into()));
        // Above the cluster's count (1 here) is accepted: it is capped at create.
        for ok in 1..=3 {
            check_spec(&m, &replicas(ok)).unwrap();
        }
    }

    #[test]
    fn the_replica_count_comes_from_the_request_then_the_directory_then_the_cluster() {
        let mut m = ClusterMap::local(4, 7000, std::path::Path::new("/tmp"));
        m.cluster.replicas = 2;
        let spec = |r: Option<u8>| LayoutSpec { replicas: r, ..Default::default() };
        let resolve = |m: &ClusterMap, req: Option<u8>, dir: Option<u8>| {
            resolve_layout(m, Ino(7), ServerId(0), Some(&spec(req)), Some(&spec(dir))).map(|l| l.replicas)
        };
        assert_eq!(resolve(&m, None, None), Ok(2), "the cluster default");
        assert_eq!(resolve(&m, None, Some(1)), Ok(1), "the directory's default");
        assert_eq!(resolve(&m, Some(2), Some(1)), Ok(2), "the request before the directory");
        assert_eq!(resolve(&m, Some(1), None), Ok(1));
        // More than the cluster keeps of the metadata is capped to it, from either source.
        assert_eq!(resolve(&m, Some(3), None), Ok(2));
        assert_eq!(resolve(&m, None, Some(3)), Ok(2));
        m.cluster.replicas = 3;
        assert_eq!(resolve(&m, Some(3), None), Ok(3));
        // Out of range is EINVAL wherever it comes from.
        for bad in [0, 4, 255] {
            assert_eq!(resolve(&m, Some(bad), None), Err(Errno::EINVAL));
            assert_eq!(resolve(&m, None, Some(bad)), Err(Errno::EINVAL));
        }
        // The `load` policy's path carries the count too.
        let load = LayoutSpec { policy: Some(PlacementPolicy::Load), replicas: Some(2), ..Default::default() };
        let l = resolve_layout_by(&m, Ino(7), ServerId(0), Some(&load), None, &|n| (0..n).map(ServerId).collect());
        assert_eq!(l.unwrap().replicas, 2);
    }

    #[test]
    fn same_policy_puts_object_zero_on_the_home_server() {
        let m = ClusterMap::local(4, 7000, std::path::Path::new("/tmp"));
        let spec = LayoutSpec { stripe_count: Some(3), ..Default::default() };
        let l = resolve_layout(&m, Ino(99), ServerId(2), Some(&spec), None).unwrap();
        assert_eq!(l.servers, vec![ServerId(2), ServerId(3), ServerId(0)]);
        let all = LayoutSpec { stripe_count: Some(u32::MAX), ..Default::default() };
        assert_eq!(resolve_layout(&m, Ino(5), ServerId(1), Some(&all), None).unwrap().servers.len(), 4);
    }
}
