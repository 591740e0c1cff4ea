//! Max, mean and min of a per-server count.

use crate::Spread;

pub fn spread(kind: &str, per_server: &[u64]) -> Spread {
    let total: u64 = per_server.iter().sum();
    let max = per_server.iter().copied().max().unwrap_or(0);
    let min = per_server.iter().copied().min().unwrap_or(0);
    let mean = total as f64 / per_server.len().max(1) as f64;
    Spread {
        kind: kind.to_string(),
        total,
        max,
        mean,
        min,
        max_over_mean: if mean > 0.0 { max as f64 / mean } else { 1.0 },
        max_over_min: if min > 0 {
            Some(max as f64 / min as f64)
        } else if max == 0 {
            Some(1.0)
        } else {
            None
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn spread_of_counts() {
        let s = super::spread("x", &[2, 4, 6]);
        assert_eq!((s.total, s.max, s.min, s.mean), (12, 6, 2, 4.0));
        assert_eq!((s.max_over_mean, s.max_over_min), (1.5, Some(3.0)));
        assert_eq!(super::spread("x", &[0, 1]).max_over_min, None);
        assert_eq!(super::spread("x", &[0, 0]).max_over_min, Some(1.0));
    }
}
