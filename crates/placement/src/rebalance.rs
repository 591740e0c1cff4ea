//! Which slots to move so that every server holds its share (`shoal server add`,
//! `shoal server rebalance`, `shoal server drain`; docs/membership.md, "Moving slots").
//!
//! Slots move whole. A plan moves as few slots as it can: first every slot living on a
//! server being drained (`draining`), its own slot last, each to the server holding the
//! fewest; then, one at a time, a slot without a process of its own (`host`) from the
//! server holding the most to the one holding the fewest, until no two servers differ by
//! more than one slot (16 slots on 4 servers, a fifth joins: 3 slots, 19 % of the data
//! when slots are even). A server's own slot moves only when the server is drained.

use crate::map::{ClusterMap, ServerState};
use shoal_proto::ServerId;

/// One move of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub slot: ServerId,
    pub from: ServerId,
    pub to: ServerId,
}

/// The moves that empty the servers being drained and even out the slots over the servers
/// that are up, in the order to make them. Slots already moving count where they go;
/// servers down, out, being drained, absent or whose slot a copy serves take nothing.
pub fn plan(map: &ClusterMap) -> Vec<Move> {
    // Destinations: servers running as themselves (not one whose slot a copy serves, which
    // is dead or standing by, nor one gone for long).
    let servers: Vec<ServerId> = map
        .processes()
        .filter(|p| p.state == ServerState::Up && !p.draining && !p.absent && p.served_by.is_none())
        .map(|p| p.server_id())
        .collect();
    if servers.is_empty() {
        return Vec::new();
    }
    // Where each slot lives once the moves under way are done. A server added to a running
    // cluster has an entry of its own that holds nothing (`placed = false`): not counted.
    let mut on: Vec<(ServerId, ServerId)> = map
        .servers
        .iter()
        .filter(|e| e.placed)
        .map(|e| (e.server_id(), e.moving_to.map_or_else(|| map.process_of(e.server_id()), ServerId)))
        .collect();
    let count = |on: &[(ServerId, ServerId)], p: ServerId| on.iter().filter(|(_, h)| *h == p).count();
    let fewest_of =
        |on: &[(ServerId, ServerId)]| *servers.iter().min_by_key(|&&p| (count(on, p), p.0)).expect("a server");
    let mut moves = Vec::new();
    // Draining: every slot living on a drained server, the server's own (placed or not) last.
    let drained: Vec<ServerId> = map.processes().filter(|p| p.draining).map(|p| p.server_id()).collect();
    for d in drained {
        let mut leaving: Vec<ServerId> =
            map.slots_on(d).into_iter().filter(|&s| map.server(s).is_some_and(|e| e.moving_to.is_none())).collect();
        leaving.sort_by_key(|&s| (s == d, s.0));
        for slot in leaving {
            let to = fewest_of(&on);
            match on.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, h)) => *h = to,
                None => on.push((slot, to)),
            }
            moves.push(Move { slot, from: d, to });
        }
    }
    if servers.len() < 2 {
        return moves;
    }
    loop {
        let most = *servers.iter().max_by_key(|&&p| (count(&on, p), std::cmp::Reverse(p.0))).expect("two servers");
        let fewest = fewest_of(&on);
        if count(&on, most) <= count(&on, fewest) + 1 {
            return moves;
        }
        // The highest-numbered slot living there without being its own or already moving.
        let movable = on.iter_mut().rev().find(|(slot, h)| {
            *h == most && *slot != most && map.server(*slot).is_some_and(|e| e.moving_to.is_none() && e.host.is_some())
        });
        let Some((slot, h)) = movable else { return moves };
        *h = fewest;
        moves.push(Move { slot: *slot, from: most, to: fewest });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::ServerEntry;
    use std::path::Path;

    fn joined(map: &mut ClusterMap, id: u32) {
        let mut e: ServerEntry = map.servers[0].clone();
        e.id = id;
        e.addr = format!("127.0.0.1:{}", 9000 + id);
        e.data_dir = None;
        e.placed = false;
        map.servers.push(e);
        map.validate().unwrap();
    }

    #[test]
    fn a_fifth_server_takes_three_of_sixteen_slots_one_from_each_of_three_servers() {
        let mut map = ClusterMap::local_with_slots(4, 16, 7000, Path::new("/d"));
        map.validate().unwrap();
        assert!(plan(&map).is_empty(), "an even cluster needs no move");
        joined(&mut map, 100);
        let moves = plan(&map);
        assert_eq!(moves.len(), 3, "{moves:?}");
        assert!(moves.iter().all(|m| m.to == ServerId(100)));
        let mut from: Vec<u32> = moves.iter().map(|m| m.from.0).collect();
        from.sort();
        from.dedup();
        assert_eq!(from.len(), 3, "one slot from each of three servers: {moves:?}");
        assert!(moves.iter().all(|m| m.slot.0 >= 4), "own slots never move: {moves:?}");
    }

    #[test]
    fn moves_under_way_count_where_they_go_and_down_servers_take_nothing() {
        let mut map = ClusterMap::local_with_slots(2, 8, 7000, Path::new("/d"));
        joined(&mut map, 9);
        let first = plan(&map);
        assert_eq!(first.len(), 2, "{first:?}");
        let e = map.servers.iter_mut().find(|e| e.id == first[0].slot.0).unwrap();
        e.moving_to = Some(9);
        assert_eq!(plan(&map).len(), 1);
        map.servers.iter_mut().find(|e| e.id == 9).unwrap().state = ServerState::Down;
        assert!(plan(&map).iter().all(|m| m.to != ServerId(9)));
        // Up in the map but served from a copy (its process dead or standing by), or absent.
        let nine = map.servers.iter_mut().find(|e| e.id == 9).unwrap();
        nine.state = ServerState::Up;
        nine.served_by = Some(0);
        assert!(plan(&map).iter().all(|m| m.to != ServerId(9)));
        let nine = map.servers.iter_mut().find(|e| e.id == 9).unwrap();
        nine.served_by = None;
        nine.absent = true;
        assert!(plan(&map).iter().all(|m| m.to != ServerId(9)));
        map.servers.iter_mut().find(|e| e.id == 9).unwrap().absent = false;
        assert!(plan(&map).iter().any(|m| m.to == ServerId(9)), "and one back takes slots again");
    }

    #[test]
    fn a_drained_server_moves_every_slot_it_holds_its_own_last_to_the_servers_holding_fewest() {
        let mut map = ClusterMap::local_with_slots(4, 8, 7000, Path::new("/d"));
        map.servers.iter_mut().find(|e| e.id == 1).unwrap().draining = true;
        map.validate().unwrap();
        let on_1 = map.slots_on(ServerId(1));
        assert_eq!(on_1.len(), 2, "{on_1:?}");
        let moves = plan(&map);
        let drained: Vec<&Move> = moves.iter().filter(|m| m.from == ServerId(1)).collect();
        assert_eq!(drained.len(), 2, "{moves:?}");
        assert_eq!(drained.last().unwrap().slot, ServerId(1), "its own slot moves last: {moves:?}");
        assert!(moves.iter().all(|m| m.to != ServerId(1)), "nothing moves to a drained server: {moves:?}");
        let mut to: Vec<u32> = drained.iter().map(|m| m.to.0).collect();
        to.dedup();
        assert_eq!(to.len(), 2, "spread over the others: {moves:?}");
    }

    #[test]
    fn a_cluster_without_spare_slots_has_nothing_to_move() {
        let mut map = ClusterMap::local(4, 7000, Path::new("/d"));
        joined(&mut map, 4);
        assert!(plan(&map).is_empty());
    }
}
