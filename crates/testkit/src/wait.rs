//! Waiting on conditions instead of sleeping for fixed times: a test that waits for what it
//! needs is as fast as the machine allows and, on a loaded machine, still correct; a test
//! that sleeps is slow on a quiet machine and wrong on a busy one.

use std::time::{Duration, Instant};

/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(20);

/// Wait until `cond` holds, looking every 20 ms; panics naming `what` (and how long it
/// waited) if it still does not hold after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(POLL);
    }
}

/// Wait until `probe` returns `Some`, looking every 20 ms, and return its value; panics
/// naming `what` if it still returns `None` after `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(start.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn returns_once_the_condition_holds() {
        let calls = Cell::new(0);
        wait_until(Duration::from_secs(5), "the third look", || {
            calls.set(calls.get() + 1);
            calls.get() == 3
        });
        assert_eq!(calls.get(), 3);
        let n = Cell::new(0);
        let got = wait_for(Duration::from_secs(5), "a value", || {
            n.set(n.get() + 1);
            (n.get() == 2).then_some("ready")
        });
        assert_eq!(got, "ready");
    }

    #[test]
    #[should_panic(expected = "waited 50ms for something that never happens")]
    fn names_what_it_waited_for() {
        wait_until(Duration::from_millis(50), "something that never happens", || false);
    }
}
