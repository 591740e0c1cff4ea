//! Latency histogram: log-linear buckets (16 per power of two, about 6 % wide), small
//! enough to send from every worker to the parent and merge there.

use serde::{Deserialize, Serialize};

const SUB: u32 = 16;
const SUB_BITS: u32 = 4;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Histogram {
    /// Sparse (bucket, count) pairs, sorted by bucket.
    buckets: Vec<(u32, u64)>,
    #[serde(skip)]
    dense: Vec<u64>,
    pub count: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
}

fn bucket_of(ns: u64) -> u32 {
    if ns < SUB as u64 {
        return ns as u32;
    }
    let e = 63 - ns.leading_zeros(); // >= SUB_BITS
    let mant = ((ns >> (e - SUB_BITS)) & (SUB as u64 - 1)) as u32;
    (e - SUB_BITS + 1) * SUB + mant
}

/// Lower bound of a bucket, and its upper bound (exclusive).
fn bucket_range(b: u32) -> (u64, u64) {
    if b < SUB {
        return (b as u64, b as u64 + 1);
    }
    let e = b / SUB + SUB_BITS - 1;
    let mant = (b % SUB) as u64;
    let lo = (1u64 << e) + (mant << (e - SUB_BITS));
    (lo, lo + (1u64 << (e - SUB_BITS)))
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram::default()
    }

    pub fn record(&mut self, ns: u64) {
        let b = bucket_of(ns) as usize;
        if self.dense.len() <= b {
            self.dense.resize(b + 1, 0);
        }
        self.dense[b] += 1;
        self.count += 1;
        self.sum_ns += ns;
        self.max_ns = self.max_ns.max(ns);
    }

    /// Move the recorded counts into the sparse form that is serialised.
    pub fn seal(&mut self) {
        if self.dense.is_empty() {
            return;
        }
        let mut all: std::collections::BTreeMap<u32, u64> = self.buckets.drain(..).collect();
        for (b, c) in self.dense.drain(..).enumerate() {
            if c > 0 {
                *all.entry(b as u32).or_default() += c;
            }
        }
        self.buckets = all.into_iter().collect();
    }

    pub fn merge(&mut self, other: &Histogram) {
        self.seal();
        let mut o = other.clone();
        o.seal();
        let mut all: std::collections::BTreeMap<u32, u64> = self.buckets.drain(..).collect();
        for (b, c) in o.buckets {
            *all.entry(b).or_default() += c;
        }
        self.buckets = all.into_iter().collect();
        self.count += o.count;
        self.sum_ns += o.sum_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
    }

    /// The `q`-quantile (0..=1) in nanoseconds: the middle of the bucket that holds it
    /// (the exact maximum for q = 1).
    pub fn quantile(&self, q: f64) -> u64 {
        let mut h = self.clone();
        h.seal();
        if h.count == 0 {
            return 0;
        }
        if q >= 1.0 {
            return h.max_ns;
        }
        let want = ((q * h.count as f64).ceil() as u64).clamp(1, h.count);
        let mut seen = 0;
        for (b, c) in &h.buckets {
            seen += c;
            if seen >= want {
                let (lo, hi) = bucket_range(*b);
                return ((lo + hi - 1) / 2).min(h.max_ns);
            }
        }
        h.max_ns
    }

    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_once() {
        let mut last_hi = 0;
        for b in 0..600 {
            let (lo, hi) = bucket_range(b);
            assert_eq!(lo, last_hi, "bucket {b}");
            assert!(hi > lo);
            assert_eq!(bucket_of(lo), b);
            assert_eq!(bucket_of(hi - 1), b);
            last_hi = hi;
        }
    }

    #[test]
    fn quantiles_within_a_bucket() {
        let mut h = Histogram::new();
        for i in 1..=1000u64 {
            h.record(i * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.07, "{p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.07, "{p99}");
        assert_eq!(h.quantile(1.0), 1_000_000);
        let mut a = Histogram::new();
        a.record(5);
        let mut b = Histogram::new();
        b.record(7);
        b.seal();
        let json = serde_json::to_string(&b).unwrap();
        let b: Histogram = serde_json::from_str(&json).unwrap();
        a.merge(&b);
        assert_eq!(a.count, 2);
        assert_eq!(a.quantile(1.0), 7);
        assert_eq!(a.quantile(0.5), 5);
    }
}
