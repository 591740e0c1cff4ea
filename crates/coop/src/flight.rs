//! Questions in flight, shared: members asking a member the same thing at the same moment
//! (a job's processes start together) get one answer, asked upstream once.
//!
//! A flight leaves the table as it lands, before anyone sees its answer: whoever asks
//! after that starts a new one, so no answer is older than the question it answers.

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

pub struct Flights<K, V: Clone> {
    table: Arc<Mutex<HashMap<K, Shared<BoxFuture<'static, V>>>>>,
}

impl<K, V: Clone> Default for Flights<K, V> {
    fn default() -> Self {
        Flights { table: Arc::default() }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static, V: Clone + Send + Sync + 'static> Flights<K, V> {
    /// The answer to `key`: joined if a flight for it is under way, else from `work`.
    pub async fn join(&self, key: K, work: impl FnOnce() -> BoxFuture<'static, V>) -> V {
        let flight = {
            let mut table = self.table.lock();
            match table.get(&key) {
                Some(f) => f.clone(),
                None => {
                    let (table2, key2, work) = (self.table.clone(), key.clone(), work());
                    let f = async move {
                        let v = work.await;
                        table2.lock().remove(&key2);
                        v
                    }
                    .boxed()
                    .shared();
                    table.insert(key, f.clone());
                    f
                }
            }
        };
        flight.await
    }

    /// Flights under way.
    pub fn len(&self) -> usize {
        self.table.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_askers_share_one_flight_and_later_ones_start_another() {
        let flights: Arc<Flights<u32, u32>> = Arc::default();
        let runs = Arc::new(AtomicU32::new(0));
        let ask = |flights: Arc<Flights<u32, u32>>, runs: Arc<AtomicU32>| async move {
            flights
                .join(1, move || {
                    async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        runs.fetch_add(1, Ordering::SeqCst) + 100
                    }
                    .boxed()
                })
                .await
        };
        let all = futures::future::join_all((0..8).map(|_| ask(flights.clone(), runs.clone()))).await;
        assert_eq!(all, vec![100; 8]);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(flights.is_empty(), "landed flights leave the table");
        assert_eq!(ask(flights.clone(), runs.clone()).await, 101, "a later question is asked again");
    }
}
