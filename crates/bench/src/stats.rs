//! Order statistics over call latencies.

use std::time::Duration;

/// The nearest-rank `p`-th percentile (0 < p ≤ 100): the smallest value that at least `p`% of
/// the values do not exceed. `None` for no values.
pub fn percentile(values: &[Duration], p: f64) -> Option<Duration> {
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

/// The median; the mean of the two middle values for an even count. `None` for no values.
pub fn median(values: &[Duration]) -> Option<Duration> {
    let mut sorted = values.to_vec();
    sorted.sort();
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v = ms(&[50, 10, 40, 20, 30, 60, 70, 80, 90, 100]);
        assert_eq!(percentile(&v, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&v, 95.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&v, 90.0), Some(Duration::from_millis(90)));
        assert_eq!(percentile(&v, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&v, 1.0), Some(Duration::from_millis(10)));
        let eight = ms(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(percentile(&eight, 50.0), Some(Duration::from_millis(4)));
        assert_eq!(percentile(&eight, 95.0), Some(Duration::from_millis(8)));
        assert_eq!(percentile(&ms(&[7]), 95.0), Some(Duration::from_millis(7)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&ms(&[30, 10, 20])), Some(Duration::from_millis(20)));
        assert_eq!(median(&ms(&[40, 10, 20, 30])), Some(Duration::from_millis(25)));
        assert_eq!(median(&[]), None);
    }
}
