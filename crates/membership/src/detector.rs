//! The failure detector, run by whichever member leads the group: a server that is `up` in
//! the map and that the leader has not heard from for `[membership] down_after_ms` is
//! marked `down` by a map change.
//!
//! Heard means: a Raft message to it was answered (the leader's heartbeats reach voters and
//! learners alike every [`crate::HEARTBEAT_MS`]), anything the server reports through
//! [`crate::MapGroup::on_heard`] (replies on its peer connections), or a ping, which goes to
//! every server not otherwise heard from for [`PING_EVERY`].
//!
//! Never marked `up` here: a server that comes back proposes that itself, once it has
//! caught up. Never more than a minority marked `down`: see [`to_mark_down`].

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
}

impl Heard {
    pub fn heard(&self, server: u32) {
        self.last.lock().insert(server, Instant::now());
    }

    /// Forget everything: as if every server had been heard just now. A member that has
    /// just become leader heard nothing as leader yet, and must give every server a full
    /// `down_after` before judging it.
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

/// The servers to mark `down` now: `up`, not `me`, unheard for `down_after`. None at all when
/// that would leave a majority of the map's servers down: a leader cut off from most of the
/// cluster sees all of them silent, and must not declare the majority dead. (Such a leader
/// could not commit the change anyway, having no quorum of voters; refusing here keeps the
/// rule independent of where the voters are, and says why in the log.)
pub fn to_mark_down(doc: &MapDoc, me: u32, heard: &Heard, now: Instant) -> Vec<u32> {
    let Ok(map) = doc.map() else { return Vec::new() };
    let after = Duration::from_millis(map.membership.down_after_ms);
    let silent: Vec<u32> = map
        .servers
        .iter()
        .filter(|s| s.id != me && s.state == ServerState::Up && heard.silent_for(s.id, now) >= after)
        .map(|s| s.id)
        .collect();
    if silent.is_empty() {
        return silent;
    }
    let already = map.servers.iter().filter(|s| s.state == ServerState::Down).count();
    if 2 * (already + silent.len()) >= map.servers.len() {
        tracing::warn!(
            "servers {silent:?} are silent, but marking them down would leave {} of {} servers down: \
             not marking (this leader is more likely cut off than they are dead)",
            already + silent.len(),
            map.servers.len()
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
            if transport.call(id, KIND_PING, Vec::new(), PING_EVERY).await.is_ok() {
                heard.heard(id);
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
}
