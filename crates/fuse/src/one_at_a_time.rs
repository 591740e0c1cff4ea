//! One caller at a time per key, for work whose first run makes the others' free.
//!
//! The processes of a job start together: each opens and lists the same read-mostly
//! directories at the same moment (docs/loading.md). Run concurrently, each would ask the
//! servers for the directory's attributes and its entries' attributes; run one after the
//! other, the first installs the leases and the rest are answered from them without a
//! request. So the mount holds a read-mostly directory's lock while it fetches for it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use tokio::sync::OwnedMutexGuard;

/// Past this many keys, those no one holds or waits for are dropped (a key's lock lives only
/// while someone holds or waits for it, so the map stays as small as the work in flight).
const PRUNE_AT: usize = 1024;

#[derive(Default)]
pub(crate) struct OneAtATime {
    locks: Mutex<HashMap<u64, Weak<tokio::sync::Mutex<()>>>>,
}

impl OneAtATime {
    /// Wait until no one else holds `key`, and hold it until the guard is dropped.
    pub(crate) async fn hold(&self, key: u64) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock();
            if locks.len() >= PRUNE_AT {
                locks.retain(|_, w| w.strong_count() > 0);
            }
            match locks.get(&key).and_then(Weak::upgrade) {
                Some(l) => l,
                None => {
                    let l = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(key, Arc::downgrade(&l));
                    l
                }
            }
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_holder_per_key_and_unheld_keys_are_dropped() {
        let o = Arc::new(OneAtATime::default());
        let g = o.hold(1).await;
        // Another key is free; the same key waits until the guard goes.
        drop(o.hold(2).await);
        let o2 = o.clone();
        let waiter = tokio::spawn(async move { drop(o2.hold(1).await) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(g);
        tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        for k in 0..PRUNE_AT as u64 + 10 {
            drop(o.hold(k).await);
        }
        assert!(o.locks.lock().len() <= PRUNE_AT, "unheld keys pruned");
    }
}
