//! How busy this server is, how busy the others said they are, and the choice of servers
//! for a new file under the `load` placement policy (docs/architecture.md, "Load-aware
//! placement"). Also the throttle that slows one server on purpose (`shoald --throttle`),
//! a test and benchmark tool.
//!
//! * **Own load** ([`Load::report`]): requests being served (`queue_depth`, counted by
//!   [`Load::begin`] in `dispatch.rs`), exponentially weighted rates of bytes in and out
//!   (from the `Status` counters, sampled at each exchange), the highest rate shown so far
//!   (decaying slowly: what the server can do, the yardstick of the current rate), the
//!   weighted service time of data requests, and free space (`full` when writes would soon
//!   be refused, `store/space.rs`).
//! * **Exchange** ([`exchange_loop`]): every [`EXCHANGE_INTERVAL`] each server sends its
//!   report to every other server (`Op::PeerLoad`), which answers with its own: one round
//!   trip per pair and interval tells both sides. Only peers that agreed on `FEATURE_LOAD`
//!   are asked, so older servers are never sent a request they cannot decode; their load
//!   stays unknown. The exchange is not counted in the request and byte counters, so that
//!   the costs tests and `shoal bench` measure stay those of the workload.
//! * **Staleness**: a report older than [`STALE_AFTER`] (a server down, slow or of an older
//!   version) counts as unknown, and an unknown server scores as the busiest known one:
//!   chosen only when it is no worse than the rest.
//! * **Choice** ([`choose`]): power of two choices over the eligible servers (placeable,
//!   not full), weighted by the map's weights, the lower score wins and ties go either way
//!   at random. Creates on many servers at once therefore spread over the good servers
//!   instead of all landing on the single idlest one (herding), and the worst server is
//!   never picked while another is left. Each choice also charges the chosen server here
//!   with one more expected writer (decaying within about a second, by when its own
//!   report shows the writer), so a burst of creates on this server spreads too.

use crate::state::State;
use bytes::Bytes;
use governor::{Quota, RateLimiter};
use parking_lot::Mutex;
use rand::Rng;
use shoal_placement::ClusterMap;
use shoal_proto::hello::FEATURE_LOAD;
use shoal_proto::msg::{Cred, LoadReport, Op, Reply};
use shoal_proto::ServerId;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often each server sends its load to the others.
pub(crate) const EXCHANGE_INTERVAL: Duration = Duration::from_millis(300);
/// A report older than this is treated as unknown.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(2);
/// Longest wait for one peer's answer: a slow peer must not hold up the next round.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(1);
/// Weight of a new sample in the rate and latency averages.
const ALPHA: f64 = 0.3;
/// Per exchange interval, how much of the highest rate seen is kept (a server that was
/// fast once but is slow now is believed slow within a minute or so).
const PEAK_DECAY: f64 = 0.995;
/// A rate below this is never the yardstick (an idle server has shown nothing yet).
const PEAK_FLOOR: f64 = (1 << 20) as f64;
/// Half-life of a charge (the expected writer of a file just placed).
const CHARGE_HALF_LIFE: Duration = Duration::from_secs(1);
/// Bucket unit of the throttle: 1 KiB, so that 64 MiB requests fit a `u32` cell count.
const THROTTLE_UNIT: u64 = 1024;

/// The server's load and what it has heard of the others'. Shared by every request
/// (`begin`), the exchange and creates (`choose_for`).
pub struct Load {
    me: ServerId,
    in_flight: AtomicU32,
    /// When a client last read or wrote file data here, in ms since `born` (0: never). A
    /// resync ships at its busy rate while this is recent (`replica/resync.rs`).
    client_data_ms: AtomicU64,
    born: Instant,
    inner: Mutex<Inner>,
    throttle: Option<Throttle>,
}

#[derive(Default)]
struct Inner {
    /// Weighted service time of data requests, µs.
    latency_us: f64,
    rates: Option<Rates>,
    /// Free space as last sampled: (capacity, free, full).
    space: (u64, u64, bool),
    peers: HashMap<ServerId, (LoadReport, Instant)>,
    /// Writers this server sent to each server by placing files there: (amount, when).
    charges: HashMap<ServerId, (f64, Instant)>,
}

struct Rates {
    at: Instant,
    bytes_in: u64,
    bytes_out: u64,
    in_ps: f64,
    out_ps: f64,
    peak: f64,
}

/// A token bucket over the bytes of data reads and writes (`shoald --throttle`).
struct Throttle {
    bucket: RateLimiter<
        governor::state::NotKeyed,
        governor::state::InMemoryState,
        governor::clock::DefaultClock,
        governor::middleware::NoOpMiddleware,
    >,
    /// Largest number of units one wait may ask for (the bucket's size: 50 ms worth).
    burst: u32,
}

/// Marks a request as in progress (queue depth) and, for data requests, measures how long
/// it took.
pub struct InFlight<'a> {
    load: &'a Load,
    started: Option<Instant>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.load.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some(t) = self.started {
            let us = t.elapsed().as_micros() as f64;
            let mut g = self.load.inner.lock();
            g.latency_us = if g.latency_us == 0.0 { us } else { g.latency_us + ALPHA * (us - g.latency_us) };
        }
    }
}

/// Bytes a data request moves (what the throttle and the service time are about); `None`
/// for other requests.
pub(crate) fn data_bytes(op: &Op, data: &Bytes) -> Option<u64> {
    match op {
        Op::Write { .. } | Op::WriteList { .. } | Op::Append { .. } => Some(data.len() as u64),
        Op::Read { len, .. } => Some(u64::from(*len)),
        Op::ReadList { pieces, .. } => Some(pieces.iter().map(|p| u64::from(p.len)).sum()),
        _ => None,
    }
}

impl Load {
    /// `throttle_mb_s`: limit data reads and writes to that many MB/s (10^6 bytes).
    pub fn new(me: ServerId, throttle_mb_s: Option<f64>) -> Load {
        let throttle = throttle_mb_s.map(|mb| {
            let per_s = ((mb * 1e6) / THROTTLE_UNIT as f64).round().clamp(1.0, u32::MAX as f64) as u32;
            // A bucket of 50 ms worth (at least 64 KiB): a deeper one fills while the
            // server is idle and lets the next burst through at full speed. Larger
            // requests wait for it in several turns (`throttle`).
            let burst = (per_s / 20).max(64);
            let quota = Quota::per_second(NonZeroU32::new(per_s).unwrap_or(NonZeroU32::MIN))
                .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
            let bucket = RateLimiter::direct(quota);
            // Start empty: a full bucket would let the first second's worth through at
            // full speed, and short benchmarks would not see the limit.
            let _ = bucket.check_n(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
            Throttle { bucket, burst }
        });
        Load {
            me,
            in_flight: AtomicU32::new(0),
            client_data_ms: AtomicU64::new(0),
            born: Instant::now(),
            inner: Mutex::new(Inner::default()),
            throttle,
        }
    }

    /// A client (not another server) reads or writes file data here now.
    pub fn client_data(&self) {
        // +1: 0 means "never".
        let ms = self.born.elapsed().as_millis() as u64 + 1;
        self.client_data_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether a client read or wrote file data here within `window`.
    pub fn client_data_within(&self, window: Duration) -> bool {
        let at = self.client_data_ms.load(Ordering::Relaxed);
        at != 0 && (self.born.elapsed().as_millis() as u64 + 1).saturating_sub(at) <= window.as_millis() as u64
    }

    /// A request starts; `data` when it moves file bytes (its service time is measured).
    pub fn begin(&self, data: bool) -> InFlight<'_> {
        // SeqCst: a slot changing hands reads the count after holding new requests
        // (`quiesce.rs`), and a request checks the hold after counting itself.
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight { load: self, started: data.then(Instant::now) }
    }

    /// Requests being served now (see [`Load::begin`]).
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Wait until the throttle (if any) lets `bytes` of data through.
    pub async fn throttle(&self, bytes: u64) {
        let Some(t) = &self.throttle else { return };
        let mut units = bytes.div_ceil(THROTTLE_UNIT).max(1);
        while units > 0 {
            let n = units.min(u64::from(t.burst)) as u32;
            // `n` is within the bucket's size, so this only waits.
            let _ = t.bucket.until_n_ready(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)).await;
            units -= u64::from(n);
        }
    }

    /// Take a new sample of this server's counters (`bytes_in`, `bytes_out`: received and
    /// sent so far) and free space, and answer the resulting report.
    pub fn sample(&self, bytes_in: u64, bytes_out: u64, capacity: u64, free: u64, full: bool) -> LoadReport {
        let now = Instant::now();
        let mut g = self.inner.lock();
        g.space = (capacity, free, full);
        g.rates = Some(match g.rates.take() {
            None => Rates { at: now, bytes_in, bytes_out, in_ps: 0.0, out_ps: 0.0, peak: 0.0 },
            Some(r) => {
                let dt = now.duration_since(r.at).as_secs_f64().max(1e-3);
                let in_now = bytes_in.saturating_sub(r.bytes_in) as f64 / dt;
                let out_now = bytes_out.saturating_sub(r.bytes_out) as f64 / dt;
                let in_ps = r.in_ps + ALPHA * (in_now - r.in_ps);
                let out_ps = r.out_ps + ALPHA * (out_now - r.out_ps);
                let peak = (r.peak * PEAK_DECAY).max(in_now + out_now);
                Rates { at: now, bytes_in, bytes_out, in_ps, out_ps, peak }
            }
        });
        self.report_locked(&g)
    }

    /// This server's load as last sampled.
    pub fn report(&self) -> LoadReport {
        self.report_locked(&self.inner.lock())
    }

    fn report_locked(&self, g: &Inner) -> LoadReport {
        let (in_ps, out_ps, peak) = g.rates.as_ref().map_or((0.0, 0.0, 0.0), |r| (r.in_ps, r.out_ps, r.peak));
        LoadReport {
            server: self.me,
            queue_depth: self.in_flight.load(Ordering::Relaxed),
            bytes_in_per_s: in_ps as u64,
            bytes_out_per_s: out_ps as u64,
            peak_bytes_per_s: peak as u64,
            latency_us: g.latency_us as u64,
            capacity_bytes: g.space.0,
            free_bytes: g.space.1,
            full: g.space.2,
        }
    }

    /// A peer's report arrived (its `PeerLoad`, or the answer to ours).
    pub fn heard(&self, r: LoadReport) {
        if r.server == self.me {
            return;
        }
        self.inner.lock().peers.insert(r.server, (r, Instant::now()));
    }

    /// Every server's latest report with its age (this server's own: age zero), for the
    /// metrics and the status page.
    pub fn snapshot(&self) -> Vec<(LoadReport, Duration)> {
        let g = self.inner.lock();
        let mut out = vec![(self.report_locked(&g), Duration::ZERO)];
        out.extend(g.peers.values().map(|(r, at)| (r.clone(), at.elapsed())));
        out.sort_by_key(|(r, _)| r.server);
        out
    }

    /// `count` distinct servers of `map` for the objects of a new file, least loaded first
    /// (see [`choose`]); charges each with the file's writer. Empty when no server is
    /// eligible (every one full): the caller then places by hash, and the write is refused
    /// with ENOSPC where it lands, as without this policy.
    pub fn choose_for(&self, map: &ClusterMap, count: u32) -> Vec<ServerId> {
        let now = Instant::now();
        let mut g = self.inner.lock();
        let own = self.report_locked(&g);
        let cands: Vec<Candidate> = map
            .servers
            .iter()
            .map(|s| {
                let id = s.server_id();
                let report = if id == self.me {
                    Some(own.clone())
                } else {
                    g.peers.get(&id).filter(|(_, at)| now.duration_since(*at) < STALE_AFTER).map(|(r, _)| r.clone())
                };
                let charge = g.charges.get(&id).map_or(0.0, |&(c, at)| decayed(c, now.duration_since(at)));
                Candidate {
                    id,
                    weight: s.weight,
                    placeable: s.state != shoal_placement::map::ServerState::Out,
                    report,
                    charge,
                }
            })
            .collect();
        let chosen = choose(&cands, count, &mut rand::thread_rng());
        tracing::debug!("load placement chose {chosen:?} from {cands:?}");
        for id in &chosen {
            let c = g.charges.get(id).map_or(0.0, |&(c, at)| decayed(c, now.duration_since(at)));
            g.charges.insert(*id, (c + 1.0, now));
        }
        chosen
    }
}

fn decayed(c: f64, age: Duration) -> f64 {
    c * 0.5f64.powf(age.as_secs_f64() / CHARGE_HALF_LIFE.as_secs_f64())
}

/// A server as [`choose`] sees it.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub id: ServerId,
    pub weight: f64,
    /// Not `out` in the map.
    pub placeable: bool,
    /// Its latest report, `None` when unknown or stale.
    pub report: Option<LoadReport>,
    /// Writers this server sent there recently, not yet visible in its report.
    pub charge: f64,
}

/// How loaded a server is, lower is better: `(1 + queue) × (1 + utilisation) × latency ×
/// space ÷ weight`, where queue is its queue depth plus the charge, utilisation its byte
/// rate over the highest it has shown, latency its service time relative to the fastest
/// server's (`ref_latency_us`; a server slowed to a quarter takes four times as long per
/// request), and space grows steeply as the disk fills (`1 + 8·used⁴`: barely counts at
/// half full, 4.2× at 90 %).
pub(crate) fn score(r: &LoadReport, charge: f64, weight: f64, ref_latency_us: f64) -> f64 {
    let queue = f64::from(r.queue_depth) + charge;
    let peak = (r.peak_bytes_per_s as f64).max(PEAK_FLOOR);
    let util = ((r.bytes_in_per_s + r.bytes_out_per_s) as f64 / peak).min(2.0);
    let latency = (r.latency_us as f64).max(ref_latency_us) / ref_latency_us;
    let used = if r.capacity_bytes == 0 { 0.0 } else { 1.0 - r.free_bytes as f64 / r.capacity_bytes as f64 };
    let space = 1.0 + 8.0 * used.clamp(0.0, 1.0).powi(4);
    (1.0 + queue) * (1.0 + util) * latency * space / weight.max(1e-6)
}

/// Choose `count` distinct servers among `cands` (fewer if fewer are eligible; none is
/// eligible when it is `out`, reported full, or has weight 0). Each pick draws two
/// eligible servers by weight, without replacement, and keeps the one with the lower
/// [`score`] (ties at random); the pick then counts as one more writer on it for the next
/// picks of the same file. Unknown servers score as the worst known one.
pub(crate) fn choose(cands: &[Candidate], count: u32, rng: &mut impl Rng) -> Vec<ServerId> {
    let mut left: Vec<Candidate> = cands
        .iter()
        .filter(|c| c.placeable && c.weight > 0.0 && !c.report.as_ref().is_some_and(|r| r.full))
        .cloned()
        .collect();
    let ref_latency =
        left.iter().filter_map(|c| c.report.as_ref()).map(|r| r.latency_us).filter(|&l| l > 0).min().unwrap_or(1)
            as f64;
    let scored = |c: &Candidate, worst: f64| match &c.report {
        Some(r) => score(r, c.charge, c.weight, ref_latency.max(100.0)),
        None => worst,
    };
    let mut out = Vec::new();
    while out.len() < count as usize && !left.is_empty() {
        let worst = left
            .iter()
            .filter(|c| c.report.is_some())
            .map(|c| scored(c, 0.0))
            .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))))
            .unwrap_or(1.0);
        // Eligible servers have a positive weight, so there is a first draw.
        let Some(a) = pick_weighted(&left, None, rng) else { break };
        let i = match pick_weighted(&left, Some(a), rng) {
            None => a,
            Some(b) => {
                let (sa, sb) = (scored(&left[a], worst), scored(&left[b], worst));
                if sa < sb || (sa == sb && rng.gen_bool(0.5)) {
                    a
                } else {
                    b
                }
            }
        };
        let c = left.swap_remove(i);
        out.push(c.id);
    }
    out
}

/// An index of `cands` drawn with probability proportional to weight, other than `not`;
/// `None` when there is no other.
fn pick_weighted(cands: &[Candidate], not: Option<usize>, rng: &mut impl Rng) -> Option<usize> {
    let total: f64 = cands.iter().enumerate().filter(|(i, _)| Some(*i) != not).map(|(_, c)| c.weight).sum();
    if total <= 0.0 {
        return None;
    }
    let mut x = rng.gen_range(0.0..total);
    let mut last = None;
    for (i, c) in cands.iter().enumerate() {
        if Some(i) == not {
            continue;
        }
        last = Some(i);
        if x < c.weight {
            return Some(i);
        }
        x -= c.weight;
    }
    last
}

/// Sample this server's load and exchange it with every other server, every
/// [`EXCHANGE_INTERVAL`], until aborted.
pub(crate) async fn exchange_loop(st: Arc<State>) {
    let mut tick = tokio::time::interval(EXCHANGE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let c = st.counters.snapshot();
        let (capacity, free) = match crate::ops::data::statvfs(&st.data_dir) {
            Ok((capacity, free, _)) => (capacity, free),
            Err(_) => (0, 0),
        };
        // Full before the space check refuses writes: twice its headroom.
        let full = capacity > 0 && free < 2 * crate::store::space::levels(capacity).0;
        let own = st.load.sample(c.bytes_received, c.bytes_sent, capacity, free, full);
        let peers: Vec<ServerId> = st.map.placeable().map(|s| s.server_id()).filter(|&s| s != st.id).collect();
        let asks = peers.into_iter().map(|peer| {
            let (st, own) = (st.clone(), own.clone());
            async move {
                let ask = async {
                    let features = st.pool.features(peer).await.ok()?;
                    if features & FEATURE_LOAD == 0 {
                        return None;
                    }
                    match st.pool.call(peer, &Cred::root(), Op::PeerLoad { load: own }, Bytes::new()).await {
                        Ok((Reply::Load(r), _)) if r.server == peer => Some(r),
                        _ => None,
                    }
                };
                if let Ok(Some(r)) = tokio::time::timeout(EXCHANGE_TIMEOUT, ask).await {
                    st.load.heard(r);
                }
            }
        });
        futures::future::join_all(asks).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    fn report(id: u32, queue: u32, latency_us: u64, full: bool) -> LoadReport {
        LoadReport {
            server: ServerId(id),
            queue_depth: queue,
            bytes_in_per_s: 0,
            bytes_out_per_s: 0,
            peak_bytes_per_s: 0,
            latency_us,
            capacity_bytes: 1 << 30,
            free_bytes: 1 << 29,
            full,
        }
    }

    fn cand(id: u32, r: Option<LoadReport>, placeable: bool) -> Candidate {
        Candidate { id: ServerId(id), weight: 1.0, placeable, report: r, charge: 0.0 }
    }

    #[test]
    fn a_slow_server_is_never_chosen_for_one_object_while_others_are_left() {
        let cands: Vec<Candidate> = (0..4)
            .map(|i| {
                cand(i, Some(report(i, if i == 2 { 6 } else { 1 }, if i == 2 { 8000 } else { 2000 }, false)), true)
            })
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut hits = [0u32; 4];
        for _ in 0..4000 {
            let c = choose(&cands, 1, &mut rng);
            hits[c[0].0 as usize] += 1;
        }
        assert_eq!(hits[2], 0, "{hits:?}");
        for i in [0, 1, 3] {
            assert!(hits[i] > 1000, "equal servers share the files: {hits:?}");
        }
    }

    #[test]
    fn a_stripe_over_every_server_still_takes_all_of_them() {
        let cands: Vec<Candidate> = (0..4).map(|i| cand(i, Some(report(i, i, 1000, false)), true)).collect();
        let mut c = choose(&cands, 4, &mut rand::rngs::StdRng::seed_from_u64(3));
        c.sort();
        assert_eq!(c, (0..4).map(ServerId).collect::<Vec<_>>());
    }

    #[test]
    fn the_throttle_holds_the_rate() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let load = Load::new(ServerId(0), Some(20.0));
        let t = Instant::now();
        rt.block_on(async {
            for _ in 0..5 {
                load.throttle(2_000_000).await;
            }
        });
        // 10 MB at 20 MB/s from an empty bucket: half a second.
        let took = t.elapsed().as_secs_f64();
        assert!((0.4..1.5).contains(&took), "took {took} s");
    }

    proptest! {
        /// Never a full server, never an `out` one, never the same one twice; as many as
        /// asked when enough are eligible; and among equals, every one gets a fair share.
        #[test]
        fn choices_respect_full_and_out_and_spread_among_equals(
            states in proptest::collection::vec((0u32..8, 0u64..20_000, any::<bool>(), any::<bool>(), any::<bool>()), 1..12),
            count in 1u32..6,
            seed in any::<u64>(),
        ) {
            let cands: Vec<Candidate> = states
                .iter()
                .enumerate()
                .map(|(i, &(q, lat, full, out, known))| {
                    cand(i as u32, known.then(|| report(i as u32, q, lat, full)), !out)
                })
                .collect();
            let eligible: Vec<ServerId> = cands
                .iter()
                .filter(|c| c.placeable && !c.report.as_ref().is_some_and(|r| r.full))
                .map(|c| c.id)
                .collect();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let chosen = choose(&cands, count, &mut rng);
            prop_assert_eq!(chosen.len(), eligible.len().min(count as usize));
            let mut seen = std::collections::HashSet::new();
            for id in &chosen {
                prop_assert!(eligible.contains(id), "{id} is full or out");
                prop_assert!(seen.insert(*id), "{id} chosen twice");
            }

            // The same servers, all equally loaded: each eligible one gets about its share.
            let equal: Vec<Candidate> = cands
                .iter()
                .map(|c| Candidate { report: c.report.as_ref().map(|r| report(r.server.0, 1, 1000, r.full)), ..c.clone() })
                .map(|c| Candidate { report: c.report.clone().or_else(|| Some(report(c.id.0, 1, 1000, false))), ..c })
                .collect();
            let eligible_eq: Vec<ServerId> = equal
                .iter()
                .filter(|c| c.placeable && !c.report.as_ref().is_some_and(|r| r.full))
                .map(|c| c.id)
                .collect();
            if eligible_eq.len() >= 2 {
                let draws = 400 * eligible_eq.len();
                let mut hits: HashMap<ServerId, usize> = HashMap::new();
                for _ in 0..draws {
                    *hits.entry(choose(&equal, 1, &mut rng)[0]).or_default() += 1;
                }
                for id in &eligible_eq {
                    let h = hits.get(id).copied().unwrap_or(0);
                    prop_assert!(h > 250 && h < 550, "{id} got {h} of {draws}: {hits:?}");
                }
            }
        }
    }
}
