//! The failure detector, run by whichever member leads the group: a server that is `up` in
//! the map and that the leader has not heard from for `[membership] down_after_ms` is
//! marked `down` by a map change.
//!
//! Heard means: a Raft message to it was answered (the leader's heartbeats reach voters and
//! learners alike every [`crate::HEARTBEAT_MS`]), anything the server reports through
//! [`crate::MapGroup::on_heard`] (replies on its peer connections), or a ping, which goes to
//! every server not otherwise heard from for [`PING_EVERY`].
//!
//! Refused means: a ping or Raft message found nothing listening at the server's address
//! (the connection was refused). A server unheard and refusing since
//! `[membership] refused_down_after_ms` ago is marked down without waiting for the whole
//! `down_after_ms`: a killed process is told apart from a slow or cut-off one, whose host
//! does not refuse (Ceph's "fast fail on connection refused"). This is most of a
//! failover's pause (docs/failover.md).
//!
//! Never marked `up` here: a server that comes back proposes that itself, once it has
//! caught up. Never more than a minority marked `down`: see [`to_mark_down`].
//!
//! A server away for `[membership] absent_after_ms` is marked `absent` ([`to_mark_absent`]):
//! mirror sets then skip it, and every slot it held a copy of gets a new mirror, so that a
//! server gone for good does not leave the cluster with one copy fewer until somebody runs
//! `shoal server remove`. It clears that itself when it serves again.

use crate::doc::MapDoc;
use crate::network::{RaftTransport, KIND_PING};
use parking_lot::Mutex;
use shoal_placement::map::ServerState;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a server not otherwise heard from is pinged.
pub const PING_EVERY: Duration = Duration::from_millis(500);

/// When each server was last heard from.
#[derive(Default)]
pub struct Heard {
    last: Mutex<HashMap<u32, Instant>>,
    /// Servers whose host refused a connection since they were last heard (by a message or a
    /// ping, not a [`Heard::reset`]), and when that first happened. Only servers in
    /// `answered`: one never heard from may still be starting (a new cluster's servers come
    /// up one after the other), and a refusal says nothing about its death.
    refused: Mutex<HashMap<u32, Instant>>,
    /// Servers this member has heard from at least once.
    answered: Mutex<std::collections::HashSet<u32>>,
}

impl Heard {
    pub fn heard(&self, server: u32) {
        self.last.lock().insert(server, Instant::now());
        self.refused.lock().remove(&server);
        self.answered.lock().insert(server);
    }

    /// `server`'s host refused a connection: nothing listens at its address now.
    pub fn refused(&self, server: u32) {
        if self.answered.lock().contains(&server) {
            self.refused.lock().entry(server).or_insert_with(Instant::now);
        }
    }

    /// How long `server` has been refusing connections, without a word from it since.
    fn refusing_for(&self, server: u32, now: Instant) -> Option<Duration> {
        self.refused.lock().get(&server).map(|t| now.saturating_duration_since(*t))
    }

    /// Forget the silences: as if every server had been heard just now. A member that has
    /// just become leader heard nothing as leader yet, and must give every server a full
    /// `down_after` (or `refused_down_after`) before judging it. Refusals are kept: they are
    /// what this member saw (its votes to a dead leader were refused), not an absence.
    pub fn reset(&self, servers: impl Iterator<Item = u32>) {
        let now = Instant::now();
        let mut last = self.last.lock();
        last.clear();
        last.extend(servers.map(|s| (s, now)));
    }

    fn silent_for(&self, server: u32, now: Instant) -> Duration {
        let mut last = self.last.lock();
        // Not in the table: a server added since the reset; its clock starts now.
        let t = *last.entry(server).or_insert(now);
        now.saturating_duration_since(t)
    }
}

/// The servers to mark `down` now: `up`, not `me`, unheard for `down_after`, or unheard and
/// refusing connections for `refused_down_after` (when that is not 0). None at all when
/// that would leave half or more of the map's servers (processes) down: a leader cut off from most of the
/// cluster sees all of them silent, and must not declare the majority dead. (Such a leader
/// could not commit the change anyway, having no quorum of voters; refusing here keeps the
/// rule independent of where the voters are, and says why in the log.)
pub fn to_mark_down(doc: &MapDoc, me: u32, heard: &Heard, now: Instant) -> Vec<u32> {
    let Ok(map) = doc.map() else { return Vec::new() };
    let after = Duration::from_millis(map.membership.down_after_ms);
    // With one copy nothing fails over, and a down mark changes nothing for clients: only
    // silence counts (a crashed server restarted within `down_after` is not flagged).
    let refused_after = match map.cluster.replicas {
        1 => Duration::ZERO,
        _ => Duration::from_millis(map.membership.refused_down_after_ms),
    };
    let dead = |id: u32| {
        let silent = heard.silent_for(id, now);
        silent >= after
            || (!refused_after.is_zero()
                && silent >= refused_after
                && heard.refusing_for(id, now).is_some_and(|r| r >= refused_after))
    };
    // A slot switching to another server (`moving_to`, server/src/moves.rs step 3) stops
    // answering on purpose while its process closes it and commits the switch, which takes
    // seconds when requests still hold its stores. Meanwhile it is judged by the process
    // serving it: while that lives, the move either commits or serves the slot there again.
    let judged = |s: &shoal_placement::ServerEntry| match s.moving_to {
        Some(_) => map.serving_process(s.server_id()).0,
        None => s.id,
    };
    let silent: Vec<u32> = map
        .servers
        .iter()
        .filter(|s| s.id != me && s.state == ServerState::Up && judged(s) != me && dead(judged(s)))
        .map(|s| s.id)
        .collect();
    if silent.is_empty() {
        return silent;
    }
    // Counted in processes, the slots' serving ones: a process serving several slots (its
    // own, slots living on it, copies it took over) is one server that died or is cut off.
    // Absent ones are not counted: they are gone, not cut off.
    let process = |id: u32| map.serving_process(shoal_proto::ServerId(id)).0;
    let down: std::collections::BTreeSet<u32> = map
        .servers
        .iter()
        .filter(|s| s.state == ServerState::Down)
        .map(|s| process(s.id))
        .chain(silent.iter().map(|&id| process(id)))
        .collect();
    let present = map.processes().filter(|p| !p.absent).count();
    if 2 * down.len() >= present {
        tracing::warn!(
            "servers {silent:?} are silent, but marking them down would leave {} of {present} servers down: \
             not marking (this leader is more likely cut off than they are dead)",
            down.len(),
        );
        return Vec::new();
    }
    silent
}

/// The document with `servers` marked down, as the next version.
pub fn marked_down(doc: &MapDoc, servers: &[u32]) -> Result<String, String> {
    let mut map = doc.map()?;
    for s in map.servers.iter_mut().filter(|s| servers.contains(&s.id)) {
        s.state = ServerState::Down;
    }
    map.cluster.version = doc.version + 1;
    Ok(map.to_toml())
}

/// The servers (processes) to mark `absent` now: away — down, or their slot served from a
/// copy while their own process has not come back to stand by (no `home`) — for
/// `[membership] absent_after_ms` (not 0) in a row as this leader saw it, with more than
/// one copy per slot. `away` holds since when each was first seen away; a server seen back
/// leaves it (a new leader starts with an empty table: its clock starts afresh).
///
/// Not measured by silence as `down` is: a slot served from a copy answers for its server
/// (the copy answers the detector's pings), so the map says whether its process is back.
pub fn to_mark_absent(doc: &MapDoc, away: &mut HashMap<u32, Instant>, now: Instant) -> Vec<u32> {
    let Ok(map) = doc.map() else { return Vec::new() };
    let after = Duration::from_millis(map.membership.absent_after_ms);
    let gone =
        |s: &shoal_placement::ServerEntry| s.state == ServerState::Down || (s.served_by.is_some() && s.home.is_none());
    let now_away: Vec<u32> = map.processes().filter(|s| gone(s)).map(|s| s.id).collect();
    away.retain(|id, _| now_away.contains(id));
    for id in &now_away {
        away.entry(*id).or_insert(now);
    }
    if after.is_zero() || map.cluster.replicas < 2 {
        return Vec::new();
    }
    map.processes()
        .filter(|s| !s.absent && away.get(&s.id).is_some_and(|t| now.saturating_duration_since(*t) >= after))
        .map(|s| s.id)
        .collect()
}

/// The document with `servers` marked absent, as the next version (their slots' and the
/// other slots' new mirrors `behind`: [`shoal_placement::ClusterMap::set_absent`]).
pub fn marked_absent(doc: &MapDoc, servers: &[u32]) -> Result<String, String> {
    let mut map = doc.map()?;
    for s in servers {
        map.set_absent(shoal_proto::ServerId(*s), true);
    }
    map.cluster.version = doc.version + 1;
    map.validate()?;
    Ok(map.to_toml())
}

/// Ping every `up` server other than `me` not heard from for [`PING_EVERY`].
pub fn ping_silent(doc: &MapDoc, me: u32, heard: &Arc<Heard>, transport: &Arc<dyn RaftTransport>) {
    let Ok(map) = doc.map() else { return };
    let now = Instant::now();
    for s in map.servers.iter().filter(|s| s.id != me && s.state != ServerState::Out) {
        if heard.silent_for(s.id, now) < PING_EVERY {
            continue;
        }
        let (heard, transport, id) = (heard.clone(), transport.clone(), s.id);
        tokio::spawn(async move {
            match transport.call(id, KIND_PING, Vec::new(), PING_EVERY).await {
                Ok(_) => heard.heard(id),
                Err(u) if u.refused => heard.refused(id),
                Err(_) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_placement::ClusterMap;
    use std::path::Path;

    fn doc(n: u32) -> MapDoc {
        MapDoc::new(ClusterMap::local(n, 7000, Path::new("/tmp")).to_toml()).unwrap()
    }

    fn replicated(n: u32) -> MapDoc {
        let mut m = ClusterMap::local(n, 7000, Path::new("/tmp"));
        m.cluster.replicas = 2;
        MapDoc::new(m.to_toml()).unwrap()
    }

    #[test]
    fn a_silent_minority_is_marked_down_a_silent_majority_is_not() {
        let d = doc(5);
        let heard = Heard::default();
        let long_ago = Instant::now();
        heard.reset(0..5);
        let later = long_ago + Duration::from_secs(10);
        // Everyone but 0 (the leader) and 1 silent: 3 of 5 would be down, a majority.
        heard.last.lock().insert(1, later);
        assert_eq!(to_mark_down(&d, 0, &heard, later), Vec::<u32>::new());
        // Two silent (3 and 4): a minority, marked.
        heard.last.lock().insert(2, later);
        assert_eq!(to_mark_down(&d, 0, &heard, later), vec![3, 4]);
        // With 4 already down, 2 and 3 silent would make 3 of 5 down: refused; 3 alone is fine.
        let mut m = d.map().unwrap();
        m.servers[4].state = ServerState::Down;
        let d2 = MapDoc::new(m.to_toml()).unwrap();
        heard.last.lock().insert(2, long_ago);
        assert_eq!(to_mark_down(&d2, 0, &heard, later), Vec::<u32>::new());
        heard.last.lock().insert(2, later);
        assert_eq!(to_mark_down(&d2, 0, &heard, later), vec![3]);
        // Heard recently: nothing to mark.
        assert_eq!(to_mark_down(&d, 0, &heard, long_ago), Vec::<u32>::new());
        let next = MapDoc::new(marked_down(&d, &[3]).unwrap()).unwrap();
        assert_eq!(next.version, 2);
        assert_eq!(next.map().unwrap().servers[3].state, ServerState::Down);
    }

    #[test]
    fn a_server_refusing_connections_is_marked_down_before_a_silent_one() {
        let d = replicated(5); // down_after 3000 ms, refused_down_after 1000 ms
        let heard = Heard::default();
        heard.reset(0..5);
        let t0 = Instant::now();
        // 3 refuses from 0.5 s on (killed); 4 is silent (frozen, or cut off).
        heard.refused.lock().insert(3, t0 + Duration::from_millis(500));
        // A server never heard from (still starting) refusing is not taken for dead.
        heard.refused(2);
        assert_eq!(heard.refusing_for(2, t0), None);
        assert_eq!(to_mark_down(&d, 0, &heard, t0 + Duration::from_millis(1400)), Vec::<u32>::new());
        assert_eq!(to_mark_down(&d, 0, &heard, t0 + Duration::from_millis(1500)), vec![3]);
        // 1 and 2 answer; 4 stays silent its full 3 s.
        heard.last.lock().insert(1, t0 + Duration::from_millis(2000));
        heard.last.lock().insert(2, t0 + Duration::from_millis(2000));
        assert_eq!(to_mark_down(&d, 0, &heard, t0 + Duration::from_millis(3000)), vec![3, 4]);
        // Heard again (restarted within the second): no longer refusing.
        heard.refused(3);
        heard.heard(3);
        assert_eq!(heard.refusing_for(3, Instant::now()), None);
        // Switched off: refusing counts like silence.
        let mut m = d.map().unwrap();
        m.membership.refused_down_after_ms = 0;
        let off = MapDoc::new(m.to_toml()).unwrap();
        let heard = Heard::default();
        heard.reset(0..5);
        heard.refused.lock().insert(3, t0);
        assert_eq!(to_mark_down(&off, 0, &heard, t0 + Duration::from_millis(2000)), Vec::<u32>::new());
        // And with one copy (nothing to fail over to).
        assert_eq!(to_mark_down(&doc(5), 0, &heard, t0 + Duration::from_millis(2000)), Vec::<u32>::new());
    }

    /// CI of stop 44: a slot whose switch took 2.9 s (requests held its stores) was marked
    /// down by its refused port after 1 s, and its move was lost to a failover.
    #[test]
    fn a_slot_switching_to_another_server_is_judged_by_the_process_serving_it() {
        let mut m = ClusterMap::local(3, 7000, Path::new("/tmp"));
        m.cluster.replicas = 2;
        m.add_spare_slots(6);
        let slot = m.servers.iter().find(|e| e.host == Some(1)).unwrap().id;
        m.servers.iter_mut().find(|e| e.id == slot).unwrap().moving_to = Some(2);
        let d = MapDoc::new(m.to_toml()).unwrap();
        let heard = Heard::default();
        let t0 = Instant::now();
        heard.reset(d.map().unwrap().servers.iter().map(|s| s.id));
        let all_but = |ids: &[u32], at: Instant| {
            for s in d.map().unwrap().servers.iter().filter(|s| !ids.contains(&s.id)) {
                heard.last.lock().insert(s.id, at);
            }
        };
        // The slot refuses and is silent for 5 s; its host answers: not marked.
        heard.answered.lock().insert(slot);
        heard.refused.lock().insert(slot, t0);
        let later = t0 + Duration::from_secs(5);
        all_but(&[slot], later);
        assert_eq!(to_mark_down(&d, 0, &heard, later), Vec::<u32>::new());
        // Its host silent as well: both are.
        all_but(&[slot, 1], later);
        heard.last.lock().insert(1, t0);
        let mut want = vec![1, slot];
        want.sort();
        assert_eq!(to_mark_down(&d, 0, &heard, later), want);
        // Not moving: judged by itself, as before.
        let mut still = d.map().unwrap();
        still.servers.iter_mut().find(|e| e.id == slot).unwrap().moving_to = None;
        let still = MapDoc::new(still.to_toml()).unwrap();
        heard.last.lock().insert(1, later);
        assert_eq!(to_mark_down(&still, 0, &heard, later), vec![slot]);
    }

    #[test]
    fn a_server_away_for_the_grace_period_is_marked_absent_and_one_back_is_not() {
        let mut m = ClusterMap::local(4, 7000, Path::new("/tmp"));
        m.cluster.replicas = 2;
        m.membership.absent_after_ms = 10_000;
        // 1 failed over to its mirror (2) and its process is not back; 3 is down.
        m.servers[1].served_by = Some(2);
        m.servers[1].member_at = Some("127.0.0.1:7001".into());
        m.servers[1].addr = "127.0.0.1:7100".into();
        m.servers[3].state = ServerState::Down;
        let d = MapDoc::new(m.to_toml()).unwrap();
        let (mut away, t0) = (HashMap::new(), Instant::now());
        assert!(to_mark_absent(&d, &mut away, t0).is_empty());
        assert!(to_mark_absent(&d, &mut away, t0 + Duration::from_millis(9_999)).is_empty());
        assert_eq!(to_mark_absent(&d, &mut away, t0 + Duration::from_secs(10)), vec![1, 3]);

        // 1's process came back and stands by (its home recorded): its clock stops, and
        // starts afresh if it goes away again.
        m.servers[1].home = Some("127.0.0.1:7001".into());
        let back = MapDoc::new(m.to_toml()).unwrap();
        assert_eq!(to_mark_absent(&back, &mut away, t0 + Duration::from_secs(11)), vec![3]);
        assert_eq!(to_mark_absent(&d, &mut away, t0 + Duration::from_secs(12)), vec![3]);
        assert_eq!(to_mark_absent(&d, &mut away, t0 + Duration::from_secs(22)), vec![1, 3]);

        let next = MapDoc::new(marked_absent(&d, &[1, 3]).unwrap()).unwrap();
        let map = next.map().unwrap();
        assert_eq!(next.version, 2);
        assert!(map.servers[1].absent && map.servers[3].absent && !map.servers[0].absent);
        assert_eq!(to_mark_absent(&next, &mut away, t0 + Duration::from_secs(30)), Vec::<u32>::new(), "once");

        // Off, and with one copy: never.
        m.membership.absent_after_ms = 0;
        let off = MapDoc::new(m.to_toml()).unwrap();
        assert!(to_mark_absent(&off, &mut HashMap::new(), t0 + Duration::from_secs(3600)).is_empty());
        let mut away = HashMap::new();
        let one = MapDoc::new({
            let mut m = ClusterMap::local(4, 7000, Path::new("/tmp"));
            m.servers[3].state = ServerState::Down;
            m.to_toml()
        })
        .unwrap();
        assert!(to_mark_absent(&one, &mut away, t0).is_empty());
        assert!(to_mark_absent(&one, &mut away, t0 + Duration::from_secs(3600)).is_empty());
    }
}
