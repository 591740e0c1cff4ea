//! One native client per served mount, made at the first call that needs it, with its own
//! tokio runtime (this library's copy of tokio: a program's own runtime, if it has one,
//! is a different one, so blocking on ours from its threads is fine).
//!
//! The client is made as the process's user (`Cred::current`, authenticated as any native
//! client: the host key for root, the identity helper otherwise; docs/security.md), with
//! the mount's consistency settings: names and attributes trusted for 1 s (the mount's
//! `attr_timeout`/`entry_timeout`), directory leases, write-behind and readahead as the
//! native client. The umask is the process's (applied by the interceptors, as the kernel
//! does). Paths resolve as the kernel's (`host_paths`). It is checked with one request
//! (the root's attributes); a cluster that cannot be reached, or refuses this user, is
//! left to the kernel for the rest of the process (with `SHOAL_PRELOAD_DEBUG=1` saying why).
//!
//! **Who drives the connections.** By default the runtime is a current-thread one: the
//! program thread that waits in a call drives the client's sockets itself, so a reply
//! wakes the thread that waits for it, with no hand-over between threads (which cost a
//! create about 20 µs of CPU on two cores). A ticker thread drives it between calls
//! (`start_ticker`): without pause for a while after reads and writes (writes behind and
//! readahead go on while the program works: with only the calls driving, streaming
//! writes ran at an eighth of the speed), else every 10 ms (a lease revocation is
//! acknowledged within that). Several program threads in calls at once share it: one
//! drives, the others are woken by it. `SHOAL_PRELOAD_THREADS=N` gives the runtime N
//! threads of its own instead.
//!
//! **fork.** The runtime's threads do not exist in a child, and its connections and
//! locks may be in any state: the child forgets the client without dropping it
//! ([`forget_after_fork`]) and makes a new one at its first call.

use crate::guard::{Out, Res};
use crate::mounts::Mount;
use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use shoal_client::{Client, ClientOptions, Cred};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A mount's client and the runtime its connections live on.
pub struct Cluster {
    pub client: Client,
    pub cred: Cred,
    rt: tokio::runtime::Runtime,
}

impl Cluster {
    /// Run `f` to completion on the runtime (from a program thread; never from one of
    /// the runtime's own threads, which never reach the interceptors' native paths).
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Run `f` in the background.
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(&self, f: F) {
        self.rt.spawn(f);
    }
}

struct Slot {
    cluster: ArcSwapOption<Cluster>,
    /// The cluster could not be used: the kernel takes this mount's calls.
    failed: AtomicBool,
}

static SLOTS: OnceLock<Vec<Slot>> = OnceLock::new();
/// Held while a client is made, so that threads racing for it make one.
static MAKING: Mutex<()> = Mutex::new(());

fn slots() -> &'static [Slot] {
    SLOTS.get_or_init(|| {
        crate::mounts::all()
            .iter()
            .map(|_| Slot { cluster: ArcSwapOption::empty(), failed: AtomicBool::new(false) })
            .collect()
    })
}

/// The client of mount `m`, made if needed; `Out::Kernel` if it cannot be used.
pub fn of(m: &Mount) -> Res<Arc<Cluster>> {
    let slot = slots().get(m.index).ok_or(Out::Kernel)?;
    if let Some(c) = slot.cluster.load_full() {
        return Ok(c);
    }
    if slot.failed.load(Ordering::Relaxed) {
        return Err(Out::Kernel);
    }
    let _making = MAKING.lock();
    if let Some(c) = slot.cluster.load_full() {
        return Ok(c);
    }
    match make(m) {
        Ok(c) => {
            let c = Arc::new(c);
            start_ticker(&c);
            slot.cluster.store(Some(c.clone()));
            Ok(c)
        }
        Err(why) => {
            crate::debug::say(&format!("{}: {why}; its calls go to the kernel", m.dir));
            slot.failed.store(true, Ordering::Relaxed);
            Err(Out::Kernel)
        }
    }
}

/// How often the ticker drives the runtime when no program thread is in a call.
const TICK: Duration = Duration::from_millis(10);

fn make(m: &Mount) -> Result<Cluster, String> {
    let s = crate::settings::get();
    let mut builder = if s.threads == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(s.threads);
        b
    };
    let rt = builder
        .max_blocking_threads(4)
        .thread_name("shoal-preload")
        .on_thread_start(crate::guard::mark_internal_thread)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let defaults = ClientOptions::default();
    let cred = Cred::current();
    let opts = ClientOptions {
        cache_ttl: s.cache_ttl,
        cred: cred.clone(),
        umask: 0,
        host_paths: true,
        // Attributes under leases: a `stat` of an unchanged file is answered in-process.
        attr_leases: true,
        write_behind: s.write_behind.unwrap_or(defaults.write_behind),
        readahead: s.readahead.unwrap_or(defaults.readahead),
        ..defaults
    };
    let client = Client::from_config(&m.config, opts).map_err(|e| format!("{e}"))?;
    rt.block_on(client.getattr(shoal_client::ROOT_INO))
        .map_err(|e| format!("cannot use the cluster of {}: {e}", m.config.display()))?;
    Ok(Cluster { client, cred, rt })
}

/// How long after a read or write the ticker keeps driving the runtime without pause.
const BUSY: Duration = Duration::from_millis(50);

/// Until when (ns since [`epoch`]) the ticker drives without pause.
static BUSY_UNTIL: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// A read or write was just made: its writes behind and the readahead it started need
/// the runtime driven after the call returns (see [`start_ticker`]).
pub fn data_activity() {
    BUSY_UNTIL.store(now_ns() + BUSY.as_nanos() as u64, Ordering::Relaxed);
}

/// With a current-thread runtime, what drives it between calls. For [`BUSY`] after a read
/// or write, without pause: write-behind and readahead requests go on while the program
/// prepares its next buffer (a program thread that makes a call meanwhile is woken by this
/// thread, as with runtime threads of its own). Otherwise every [`TICK`], briefly: lease
/// revocations to acknowledge, lease renewals, closes in the background. A program thread
/// in a call with the runtime free drives it itself. Ends when the cluster goes.
fn start_ticker(c: &Arc<Cluster>) {
    if crate::settings::get().threads != 0 {
        return;
    }
    let weak = Arc::downgrade(c);
    let spawned = std::thread::Builder::new().name("shoal-preload-tick".into()).spawn(move || {
        crate::guard::mark_internal_thread();
        loop {
            let left = BUSY_UNTIL.load(Ordering::Relaxed).saturating_sub(now_ns());
            if left == 0 {
                std::thread::sleep(TICK);
            }
            let Some(c) = weak.upgrade() else { return };
            if left == 0 {
                c.rt.block_on(tokio::task::yield_now());
            } else {
                // The timer is made inside the runtime (`sleep` needs its context).
                let pause = Duration::from_nanos(left).min(TICK);
                c.rt.block_on(async move { tokio::time::sleep(pause).await });
            }
        }
    });
    if let Err(e) = spawned {
        crate::debug::warn(&format!("cannot start the ticker thread ({e}): background work waits for calls"));
    }
}

/// In a child after fork: forget every client without dropping it (its runtime's
/// threads are gone; dropping would wait for them) and let the next call make new ones.
pub fn forget_after_fork() {
    if MAKING.is_locked() {
        // SAFETY: the thread that held it does not exist in this process.
        unsafe { MAKING.force_unlock() };
    }
    for slot in slots() {
        std::mem::forget(slot.cluster.swap(None));
    }
}
