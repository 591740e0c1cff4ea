//! Fault injector for history tests: from a seed, at random intervals, one fault at a time —
//! `kill -9` of a random server and its restart after a random delay, a `SIGSTOP`/`SIGCONT`
//! pause, and (with a [`NetLab`]) the isolation of one or two servers, then healing.
//!
//! One fault at a time keeps every episode undoable in order (a server is never restarted
//! while its host is cut off: its start-up could not be seen from here) and the log easy to
//! read. The seed is printed at the start and taken from `SHOAL_FAULT_SEED` when set, so a
//! failing run can be repeated (the faults' choices repeat; their timing against the
//! workers' operations, as in any Jepsen run, only roughly).

use crate::history::{assert_clean, check, CheckOptions, Outcome, Recorder, Workload};
use crate::netns::NetLab;
use crate::Cluster;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use shoal_client::{BlockingClient, ClientOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Which faults, how often, how long.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    pub kill: bool,
    pub pause: bool,
    /// Needs a lab.
    pub partition: bool,
    /// Most servers isolated at once (1 or 2).
    pub max_isolated: usize,
    /// Quiet time between faults, milliseconds (low, high).
    pub gap_ms: (u64, u64),
    /// How long a fault lasts, milliseconds (low, high).
    pub hold_ms: (u64, u64),
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            kill: true,
            pause: true,
            partition: false,
            max_isolated: 1,
            gap_ms: (500, 2500),
            hold_ms: hold_ms_from_env().unwrap_or((300, 3000)),
        }
    }
}

/// `SHOAL_FAULT_HOLD_MS=LOW-HIGH`: how long faults last, for runs longer than CI's (pauses
/// beyond the failure detector's bound: docs/testing.md).
fn hold_ms_from_env() -> Option<(u64, u64)> {
    let s = std::env::var("SHOAL_FAULT_HOLD_MS").ok()?;
    let parsed = s.split_once('-').and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
    match parsed {
        Some((lo, hi)) if lo <= hi => Some((lo, hi)),
        _ => panic!("SHOAL_FAULT_HOLD_MS={s:?} is not LOW-HIGH in milliseconds"),
    }
}

/// The seed: `SHOAL_FAULT_SEED` if set, else drawn; printed either way.
pub fn seed_from_env() -> u64 {
    let seed = match std::env::var("SHOAL_FAULT_SEED") {
        Ok(s) => s.parse::<u64>().unwrap_or_else(|_| panic!("SHOAL_FAULT_SEED={s:?} is not a number")),
        Err(_) => rand::random(),
    };
    eprintln!("fault seed: {seed} (repeat with SHOAL_FAULT_SEED={seed})");
    seed
}

/// What the injector did, with times in seconds since `start` (the history's start, so
/// that faults and operations line up).
pub struct FaultLog {
    start: Instant,
    lines: Mutex<Vec<String>>,
}

impl FaultLog {
    pub fn new(start: Instant) -> FaultLog {
        FaultLog { start, lines: Mutex::new(Vec::new()) }
    }

    fn note(&self, what: String) {
        let line = format!("[{:8.3}] {what}", self.start.elapsed().as_secs_f64());
        self.lines.lock().unwrap().push(line);
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The log as one text (for failure messages).
    pub fn text(&self) -> String {
        let mut s = String::from("faults:\n");
        for l in self.lines() {
            s.push_str("  ");
            s.push_str(&l);
            s.push('\n');
        }
        s
    }

    /// How many faults of a kind ("kill", "pause", "isolate") were injected.
    pub fn count(&self, kind: &str) -> usize {
        self.lines().iter().filter(|l| l.contains(&format!("] {kind} "))).count()
    }
}

/// Sleep `d` in short steps; false if `stop` was raised meanwhile.
fn nap(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20).min(end - Instant::now()));
    }
    true
}

/// Inject faults into `cluster` until `stop` is raised; on return every server is running,
/// none paused, no host isolated.
pub fn run(
    cluster: &mut Cluster,
    lab: Option<&NetLab>,
    cfg: &FaultConfig,
    seed: u64,
    stop: &AtomicBool,
    log: &FaultLog,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = cluster.map.servers.len() as u32;
    let mut kinds = Vec::new();
    if cfg.kill {
        kinds.push("kill");
    }
    if cfg.pause {
        kinds.push("pause");
    }
    if cfg.partition {
        assert!(lab.is_some(), "partition faults need a NetLab");
        kinds.push("isolate");
    }
    assert!(!kinds.is_empty(), "no fault kind chosen");
    // Rounds of every kind in a random order, so a short run still has each kind.
    let mut round: Vec<&str> = Vec::new();
    loop {
        if round.is_empty() {
            round = kinds.clone();
            round.shuffle(&mut rng);
        }
        let kind = round.pop().expect("refilled above");
        if !nap(Duration::from_millis(rng.gen_range(cfg.gap_ms.0..=cfg.gap_ms.1)), stop) {
            return;
        }
        // The fault always runs its full course once begun, so that it is undone.
        let hold = Duration::from_millis(rng.gen_range(cfg.hold_ms.0..=cfg.hold_ms.1));
        match kind {
            "kill" => {
                let id = rng.gen_range(0..n);
                log.note(format!("kill -9 server {id} (restart in {hold:?})"));
                cluster.kill9(id);
                std::thread::sleep(hold);
                cluster.restart(id);
                log.note(format!("restarted server {id}"));
            }
            "pause" => {
                let id = rng.gen_range(0..n);
                log.note(format!("pause server {id} (SIGSTOP for {hold:?})"));
                cluster.signal(id, libc::SIGSTOP);
                std::thread::sleep(hold);
                cluster.signal(id, libc::SIGCONT);
                log.note(format!("resumed server {id}"));
            }
            _ => {
                let lab = lab.expect("checked above");
                let k = rng.gen_range(1..=cfg.max_isolated.clamp(1, n as usize)) as u32;
                let mut hosts: Vec<usize> = Vec::new();
                while hosts.len() < k as usize {
                    let h = rng.gen_range(0..n) as usize;
                    if !hosts.contains(&h) {
                        hosts.push(h);
                    }
                }
                log.note(format!("isolate servers {hosts:?} (for {hold:?})"));
                lab.isolate(&hosts);
                std::thread::sleep(hold);
                lab.heal();
                log.note("healed".to_string());
            }
        }
    }
}

/// A worker's client: a short timeout (a paused server costs each call at most this), no
/// caching (every read asks the servers: what is checked is what they keep), every write
/// waited for.
fn worker_options(c: &Cluster) -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(2),
        cache_ttl: Duration::ZERO,
        dir_lease: Duration::ZERO,
        write_behind: 0,
        readahead: 0,
        ..c.options()
    }
}

/// The last warnings and errors of every server's log (the map group's own chatter left
/// out), for failure messages.
fn warnings(cluster: &Cluster) -> String {
    let mut s = String::new();
    for id in 0..cluster.map.servers.len() as u32 {
        let log = cluster.log(id);
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                (l.contains(" WARN ") || l.contains(" ERROR ") || l.starts_with("shoald")) && !l.contains("openraft")
            })
            .collect();
        s.push_str(&format!("---- server {id}: last warnings\n"));
        for l in &lines[lines.len().saturating_sub(40)..] {
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

/// Run `workload` against `cluster` with faults for `secs`, read the final state and check.
pub fn run_history(
    cluster: &mut Cluster,
    lab: Option<&NetLab>,
    cfg: &FaultConfig,
    secs: Duration,
    opts: &CheckOptions,
) {
    let workload = Workload::default();
    let setup = BlockingClient::from_config(&cluster.config, cluster.options()).unwrap();
    workload.setup(&setup);
    let seed = seed_from_env();
    let clients: Vec<BlockingClient> = (0..workload.workers)
        .map(|_| BlockingClient::from_config(&cluster.config, worker_options(cluster)).unwrap())
        .collect();
    let rec = Recorder::default();
    let log = FaultLog::new(rec.started());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for (w, client) in clients.iter().enumerate() {
            let (workload, rec, stop) = (&workload, &rec, &stop);
            s.spawn(move || workload.run_worker(w as u32, client, rec, seed, stop));
        }
        let (log, stop, target) = (&log, &stop, &mut *cluster);
        let injector = s.spawn(move || run(target, lab, cfg, seed, stop, log));
        std::thread::sleep(secs);
        stop.store(true, Ordering::Relaxed);
        if let Err(p) = injector.join() {
            eprintln!("{}", log.text());
            std::panic::resume_unwind(p);
        }
    });
    let events = rec.events();
    eprintln!("{}; {}", crate::history::summary(&events), log.text().replace('\n', " | "));
    // Every server is up again; a restarted one may still be replaying intents, so the
    // final read is retried for a while before it counts as a failure.
    let reader = BlockingClient::from_config(
        &cluster.config,
        ClientOptions { cache_ttl: Duration::ZERO, dir_lease: Duration::ZERO, ..cluster.options() },
    )
    .unwrap();
    // Recovery finishes what the faults interrupted (the intents of operations spanning
    // servers, replayed by a restarted server or retried once its peer is back): the final
    // state is what the servers hold once none has an intent pending (waited for at most
    // 30 s; what is still pending then is checked as it is).
    let settled = Instant::now() + Duration::from_secs(30);
    while Instant::now() < settled {
        let pending: u64 = reader.status_all().into_iter().map(|(_, r)| r.map_or(1, |s| s.pending_intents)).sum();
        if pending == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut fin = workload.final_state(&reader, &events);
    for _ in 0..10 {
        if fin.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        fin = workload.final_state(&reader, &events);
    }
    let fin = fin.unwrap_or_else(|e| panic!("reading the final state: {e}\n{}{}", log.text(), warnings(cluster)));
    let violations = check(&events, &fin, opts);
    assert_clean(&violations, &events, &format!("seed {seed}\n{}{}", log.text(), warnings(cluster)));
    let ok = events.iter().filter(|e| matches!(e.outcome, Outcome::Ok(_))).count();
    assert!(ok >= 50, "only {ok} operations succeeded: the run checked too little\n{}", log.text());
    if secs >= Duration::from_secs(15) {
        let kinds = [("kill", cfg.kill), ("pause", cfg.pause), ("isolate", cfg.partition)];
        for (kind, on) in kinds {
            assert!(!on || log.count(kind) > 0, "no {kind} fault in {secs:?}\n{}", log.text());
        }
    }
}
