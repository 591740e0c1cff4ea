//! Finishing, on the runtime, a future that was started on the caller's thread, without
//! waking a runtime thread before it has something to do.
//!
//! A write-behind write sends its requests on the thread that makes it and then only waits
//! for the replies. `tokio::spawn` of the rest from a thread outside the runtime (a FUSE
//! request thread) queues a task and wakes a runtime thread, which polls it once (it
//! registers its wakers) and sleeps again: two context switches per write, for nothing.
//! [`run`] polls the future once right here instead; the first wake-up (usually a reply,
//! read by a runtime thread) spawns it on that thread, where it runs next without waking
//! any other. The FUSE mount runs its requests the same way (`shoal_fuse`'s `ShoalFs::spawn`).

use futures::task::ArcWake;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Poll `fut` once on this thread (inside `rt`'s context); if it waits, the first wake-up
/// hands it to `rt`. Must be called within `rt`'s context (timers and sockets the future
/// creates belong to it).
pub(crate) fn run(rt: tokio::runtime::Handle, fut: impl Future<Output = ()> + Send + 'static) {
    let mut fut: Task = Box::pin(fut);
    let parked = Arc::new(Parked { state: Mutex::new(State::Polling), rt });
    let waker = futures::task::waker(parked.clone());
    if fut.as_mut().poll(&mut Context::from_waker(&waker)).is_ready() {
        return;
    }
    let mut st = parked.state.lock();
    match std::mem::replace(&mut *st, State::Gone) {
        // Woken while being polled: it can go on at once.
        State::Woken => {
            drop(st);
            parked.rt.spawn(fut);
        }
        _ => *st = State::Parked(fut),
    }
}

/// A future after its first poll, until something it waits for wakes it.
struct Parked {
    state: Mutex<State>,
    rt: tokio::runtime::Handle,
}

enum State {
    /// Being polled for the first time.
    Polling,
    /// Woken during that poll.
    Woken,
    /// Waiting; the first wake-up hands it to the runtime.
    Parked(Task),
    /// Handed to the runtime (its task's own waker is used from then on).
    Gone,
}

impl ArcWake for Parked {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        let fut = {
            let mut st = arc_self.state.lock();
            match std::mem::replace(&mut *st, State::Gone) {
                State::Parked(fut) => fut,
                State::Polling => {
                    *st = State::Woken;
                    return;
                }
                other => {
                    *st = other;
                    return;
                }
            }
        };
        arc_self.rt.spawn(fut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_parked_future_finishes_on_the_runtime_once_woken() {
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let d = done.clone();
        run(tokio::runtime::Handle::current(), async move {
            d.fetch_add(rx.await.unwrap() as usize, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 0, "it waits for the value");
        tx.send(7).unwrap();
        for _ in 0..200 {
            if done.load(Ordering::SeqCst) == 7 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("the future never finished");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_future_ready_at_once_runs_to_its_end_here() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        run(tokio::runtime::Handle::current(), async move {
            d.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }
}
