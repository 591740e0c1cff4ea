//! The cluster map a server routes by, which the replicated map (`membership.rs`) replaces
//! while requests use it.
//!
//! Call sites read it as before (`st.map.home_of(ino)`, `st.map.version()`): the cell derefs
//! to the newest map. Each map installed is leaked (kept for the life of the process), so
//! that a reference taken before a change stays valid for as long as its request holds it,
//! without a lock on every read. Maps change rarely (a failure, an operator's command), and
//! a map is a few hundred bytes per server: a process that saw a thousand changes has spent
//! well under a megabyte on them.

use arc_swap::ArcSwap;
use shoal_placement::ClusterMap;
use std::ops::Deref;
use std::sync::Arc;

pub struct MapCell {
    current: ArcSwap<&'static ClusterMap>,
    /// Wakes requests that name a newer version than the server has (dispatch waits).
    changed: tokio::sync::watch::Sender<u64>,
}

impl MapCell {
    pub fn new(map: ClusterMap) -> MapCell {
        let version = map.version();
        MapCell {
            current: ArcSwap::from_pointee(Box::leak(Box::new(map))),
            changed: tokio::sync::watch::channel(version).0,
        }
    }

    /// The newest map.
    pub fn get(&self) -> &'static ClusterMap {
        **self.current.load()
    }

    /// Install `map` if it is newer than the current one; returns whether it was.
    pub fn set(&self, map: ClusterMap) -> bool {
        if map.version() <= self.get().version() {
            return false;
        }
        let version = map.version();
        self.current.store(Arc::new(Box::leak(Box::new(map))));
        self.changed.send_replace(version);
        true
    }

    /// Wait until the map is at least `version`, at most `wait`; returns whether it is.
    pub async fn wait_for(&self, version: u64, wait: std::time::Duration) -> bool {
        let mut rx = self.changed.subscribe();
        let reached = tokio::time::timeout(wait, rx.wait_for(|v| *v >= version)).await;
        matches!(reached, Ok(Ok(_)))
    }
}

impl Deref for MapCell {
    type Target = ClusterMap;

    fn deref(&self) -> &ClusterMap {
        self.get()
    }
}
