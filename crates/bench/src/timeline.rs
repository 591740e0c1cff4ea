//! Whether a phase's rate holds up to its end: every worker notes when its operations
//! complete (a [`Recorder`], sent to the driver as a [`Timeline`]), and the driver merges
//! the timelines of all workers into the rate of the first tenth and of the last tenth of
//! the phase's operations, in completion order ([`DecileRates`]).
//!
//! A worker keeps at most [`MARKS`] instants per phase, in an array allocated when the
//! phase starts: mark `j` is the instant its count of completed operations reached
//! `min((j + 1) × stride, expected)`, with the stride chosen so that the expected count fits.
//! Recording an operation is an atomic add and, once every `stride` operations, a clock
//! read and a store: no allocation, no lock. With 1,000 marks per worker a tenth of the
//! phase spans about 100 marks of each worker, so the rates are within about 1 % of those
//! of the exact completion times.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// Instants a worker keeps per phase, at most.
pub const MARKS: u64 = 1000;

/// The worker's side: shared by the threads or futures of one phase.
pub struct Recorder {
    stride: u64,
    expected: u64,
    done: AtomicU64,
    /// 0 = not reached (yet).
    marks: Box<[AtomicU64]>,
}

impl Recorder {
    /// A phase in which this worker expects `expected` operations (more are counted but
    /// not marked: the timeline covers the first `expected`).
    pub fn new(expected: u64) -> Recorder {
        let stride = expected.div_ceil(MARKS).max(1);
        let n = expected.div_ceil(stride) as usize;
        Recorder { stride, expected, done: AtomicU64::new(0), marks: (0..n).map(|_| AtomicU64::new(0)).collect() }
    }

    /// `count` more operations have just completed.
    pub fn record(&self, count: u64) {
        if count == 0 {
            return;
        }
        let c0 = self.done.fetch_add(count, Ordering::Relaxed);
        let c1 = (c0 + count).min(self.expected);
        if c0 >= c1 {
            return;
        }
        // Marks whose count lies in (c0, c1]: multiples of the stride, and the end.
        let first = c0 / self.stride; // mark j stands for count min((j+1)·stride, expected)
        let last = (c1 - 1) / self.stride;
        let reached_end_of_last = c1 == self.expected || c1.is_multiple_of(self.stride);
        let upto = if reached_end_of_last { last + 1 } else { last };
        if first >= upto {
            return;
        }
        let now = crate::clock::mono_ns().max(1);
        for m in &self.marks[first as usize..upto as usize] {
            m.store(now, Ordering::Relaxed);
        }
    }

    /// What was recorded: the marks reached, in order.
    pub fn finish(&self) -> Timeline {
        let ops = self.done.load(Ordering::Relaxed).min(self.expected);
        let mut marks_ns: Vec<u64> =
            self.marks.iter().map(|m| m.load(Ordering::Relaxed)).take_while(|&t| t != 0).collect();
        // Threads store their marks a moment after counting: keep the instants in order.
        for i in 1..marks_ns.len() {
            marks_ns[i] = marks_ns[i].max(marks_ns[i - 1]);
        }
        Timeline { stride: self.stride, ops, marks_ns }
    }
}

/// When one worker's operations of one phase completed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Operations per mark (the last mark may stand for fewer).
    pub stride: u64,
    /// Operations the marks cover.
    pub ops: u64,
    /// `marks_ns[j]`: CLOCK_MONOTONIC when the count reached `min((j + 1) × stride, ops)`.
    pub marks_ns: Vec<u64>,
}

impl Timeline {
    /// The same timeline on a clock `offset` ns ahead of this one (or behind).
    pub fn shifted(mut self, offset: i64) -> Timeline {
        for t in &mut self.marks_ns {
            *t = crate::link::shift(*t, offset);
        }
        self
    }

    /// (instant, operations completed at it) for each mark.
    fn events(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let stride = self.stride.max(1);
        self.marks_ns.iter().enumerate().map(move |(j, &t)| {
            let upto = ((j as u64 + 1) * stride).min(self.ops);
            (t, upto.saturating_sub(j as u64 * stride))
        })
    }
}

/// The rate of the first and of the last tenth of a phase's operations, all workers
/// together, by completion time: operations per second (transfers or items).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecileRates {
    /// The first 10 % of the operations over the time from the phase's start until the
    /// last of them completed.
    pub first_ops_s: f64,
    /// The last 10 % over the time from the completion of the 90 % before them until the
    /// last operation completed.
    pub last_ops_s: f64,
    /// `last_ops_s / first_ops_s`: 1 = the rate held to the end, 0.5 = it halved.
    pub last_over_first: f64,
}

impl DecileRates {
    /// From the phase's start (driver's clock) and every worker's timeline (on the same
    /// clock). `None` with fewer than 10 operations (a tenth would be less than one), or
    /// when a tenth took no measurable time (its rate would be infinite: all operations at
    /// the start).
    pub fn of(start_ns: u64, timelines: &[Timeline]) -> Option<DecileRates> {
        let mut events: Vec<(u64, u64)> = timelines.iter().flat_map(|t| t.events()).filter(|e| e.1 > 0).collect();
        events.sort_unstable();
        // Operations that completed at one instant (a batch, a page of a listing) are one
        // event: they count as spread over the time since the instant before.
        events.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1 += later.1;
            }
            same
        });
        let total: u64 = events.iter().map(|e| e.1).sum();
        if total < 10 {
            return None;
        }
        let tenth = total as f64 / 10.0;
        let t10 = instant_of(start_ns, &events, tenth);
        let t90 = instant_of(start_ns, &events, total as f64 - tenth);
        let end = events.last()?.0 as f64;
        let first = tenth / ((t10 - start_ns as f64) / 1e9);
        let last = tenth / ((end - t90) / 1e9);
        (first.is_finite() && last.is_finite() && first > 0.0 && last > 0.0).then(|| DecileRates {
            first_ops_s: first,
            last_ops_s: last,
            last_over_first: last / first,
        })
    }
}

/// The instant (ns, fractional) at which `x` operations had completed: the operations of
/// an event (a mark, or several at one instant) are taken to have completed evenly between
/// the event before it (or the start) and it.
fn instant_of(start_ns: u64, events: &[(u64, u64)], x: f64) -> f64 {
    let mut done = 0u64;
    let mut prev = start_ns as f64;
    for &(t, n) in events {
        let t = (t as f64).max(prev);
        if (done + n) as f64 >= x {
            let frac = (x - done as f64) / n as f64;
            return prev + frac * (t - prev);
        }
        done += n;
        prev = t;
    }
    prev
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeline of exact completion instants (stride 1).
    fn exact(times: &[u64]) -> Timeline {
        Timeline { stride: 1, ops: times.len() as u64, marks_ns: times.to_vec() }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn a_steady_phase_has_a_ratio_of_one() {
        // 100 operations, one every ms from the start at t = 0.
        let t: Vec<u64> = (1..=100).map(|i| i * 1_000_000).collect();
        let d = DecileRates::of(0, &[exact(&t)]).unwrap();
        assert!(close(d.first_ops_s, 1000.0), "{d:?}");
        assert!(close(d.last_ops_s, 1000.0), "{d:?}");
        assert!(close(d.last_over_first, 1.0), "{d:?}");
    }

    #[test]
    fn a_phase_that_slows_down_shows_it_in_the_last_tenth() {
        // First 90 operations 1 ms apart, the last 10 at 2 ms apart: the last tenth runs
        // at 500/s against 1000/s at the start.
        let mut t: Vec<u64> = (1..=90).map(|i| i * 1_000_000).collect();
        t.extend((1..=10).map(|i| 90_000_000 + i * 2_000_000));
        let d = DecileRates::of(0, &[exact(&t)]).unwrap();
        assert!(close(d.first_ops_s, 1000.0), "{d:?}");
        assert!(close(d.last_ops_s, 500.0), "{d:?}");
        assert!(close(d.last_over_first, 0.5), "{d:?}");
    }

    #[test]
    fn workers_are_merged_by_completion_time() {
        // Two workers, each an operation every 2 ms, interleaved: together 1000/s; the
        // phase started 5 ms before the first completion on this clock.
        let a: Vec<u64> = (0..50).map(|i| 5_000_000 + i * 2_000_000 + 1_000_000).collect();
        let b: Vec<u64> = (0..50).map(|i| 5_000_000 + i * 2_000_000 + 2_000_000).collect();
        let d = DecileRates::of(5_000_000, &[exact(&a), exact(&b)]).unwrap();
        assert!(close(d.first_ops_s, 1000.0), "{d:?}");
        assert!(close(d.last_ops_s, 1000.0), "{d:?}");
        // A worker that finishes early leaves the last tenth to the other one alone.
        let early: Vec<u64> = (1..=45).map(|i| i * 1_000_000).collect();
        let late: Vec<u64> = (1..=55).map(|i| i * 1_000_000).collect();
        let d = DecileRates::of(0, &[exact(&early), exact(&late)]).unwrap();
        // First 10 of 100: both workers, 2 per ms → 5 ms. Last 10: the late worker alone, 1 per ms.
        assert!(close(d.first_ops_s, 2000.0), "{d:?}");
        assert!(close(d.last_ops_s, 1000.0), "{d:?}");
        assert!(close(d.last_over_first, 0.5), "{d:?}");
    }

    #[test]
    fn fewer_than_ten_operations_have_no_deciles() {
        assert_eq!(DecileRates::of(0, &[exact(&[1, 2, 3, 4, 5, 6, 7, 8, 9])]), None);
        assert_eq!(DecileRates::of(0, &[]), None);
        assert_eq!(DecileRates::of(0, &[Timeline::default()]), None);
        // Ten operations: a tenth is one operation.
        let t: Vec<u64> = (1..=10).map(|i| i * 1000).collect();
        let d = DecileRates::of(0, &[exact(&t)]).unwrap();
        assert!(close(d.first_ops_s, 1e6) && close(d.last_ops_s, 1e6), "{d:?}");
    }

    #[test]
    fn operations_at_one_instant_count_as_spread_since_the_one_before() {
        // All at the start: both tenths took no time, no finite rate.
        assert_eq!(DecileRates::of(7, &[exact(&[7; 20])]), None);
        // All at one later instant (one batch, one page): 20 in 1 µs, at both ends.
        let d = DecileRates::of(0, &[exact(&[1000; 20])]).unwrap();
        assert!(close(d.first_ops_s, 2e7) && close(d.last_ops_s, 2e7), "{d:?}");
        assert!(close(d.last_over_first, 1.0), "{d:?}");
        // Batches of 10 from two workers: 10 at 1 ms, 10 at 2 ms (worker a), 10 more at
        // 2 ms and 10 at 4 ms (worker b). First tenth (4 ops): part of the 10 spread over
        // the first ms → 10,000/s. Last tenth: part of the 10 spread over the 2 ms before
        // 4 ms → 5,000/s.
        let a = exact(&[[1_000_000; 10], [2_000_000; 10]].concat());
        let b = exact(&[[2_000_000; 10], [4_000_000; 10]].concat());
        let d = DecileRates::of(0, &[a, b]).unwrap();
        assert!(close(d.first_ops_s, 10_000.0), "{d:?}");
        assert!(close(d.last_ops_s, 5000.0), "{d:?}");
        assert!(close(d.last_over_first, 0.5), "{d:?}");
    }

    #[test]
    fn coarse_marks_give_the_rates_of_exact_ones() {
        // 1,000,000 operations at a steady 1 per µs, then slower (1 per 2 µs) for the last
        // 100,000, through the recorder's marks (stride 1000).
        let rec = Recorder::new(1_000_000);
        assert_eq!(rec.stride, 1000);
        let mut t = 0u64;
        let mut times = Vec::new();
        for i in 0..1_000_000u64 {
            t += if i < 900_000 { 1000 } else { 2000 };
            if (i + 1) % 1000 == 0 {
                times.push(t);
            }
        }
        let tl = Timeline { stride: 1000, ops: 1_000_000, marks_ns: times };
        let d = DecileRates::of(0, &[tl]).unwrap();
        assert!(close(d.first_ops_s, 1e6), "{d:?}");
        assert!(close(d.last_ops_s, 5e5), "{d:?}");
    }

    #[test]
    fn the_recorder_marks_every_stride_and_the_end() {
        // 2,500 expected: stride 3, 834 marks (the last for 1 operation).
        let rec = Recorder::new(2500);
        assert_eq!((rec.stride, rec.marks.len()), (3, 834));
        rec.record(2);
        assert_eq!(rec.finish().marks_ns.len(), 0);
        rec.record(1);
        assert_eq!(rec.finish().marks_ns.len(), 1);
        // A batch of 10 crosses three strides at once (counts 6, 9, 12).
        rec.record(10);
        let tl = rec.finish();
        assert_eq!((tl.ops, tl.marks_ns.len()), (13, 4));
        assert!(tl.marks_ns.windows(2).all(|w| w[0] <= w[1]));
        rec.record(2487);
        let tl = rec.finish();
        assert_eq!((tl.ops, tl.marks_ns.len()), (2500, 834));
        assert_eq!(tl.events().map(|e| e.1).sum::<u64>(), 2500);
        // Operations past the expected count are not marked.
        rec.record(5);
        assert_eq!(rec.finish().ops, 2500);
        // Nothing expected: nothing to mark.
        let none = Recorder::new(0);
        none.record(3);
        assert_eq!(none.finish(), Timeline { stride: 1, ops: 0, marks_ns: vec![] });
        // Small phases are exact.
        let small = Recorder::new(7);
        for _ in 0..7 {
            small.record(1);
        }
        assert_eq!((small.stride, small.finish().marks_ns.len()), (1, 7));
    }

    #[test]
    fn recording_from_threads_counts_every_operation() {
        let rec = Recorder::new(40_000);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        rec.record(1);
                    }
                });
            }
        });
        let tl = rec.finish();
        assert_eq!((tl.ops, tl.marks_ns.len() as u64), (40_000, MARKS));
        assert_eq!(tl.events().map(|e| e.1).sum::<u64>(), 40_000);
    }
}
