//! Order statistics over call latencies, the spread of repeated runs, and least-squares slopes.

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

/// The median and range of one figure over repeated runs: `median [min–max]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values`, NaNs left out; `None` when none is left.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Some(Self { median, min: sorted[0], max: sorted[n - 1] })
    }

    /// `12.3`, or `12.3 [10.1–14.0]` when the runs differ; `decimals` digits after the point.
    pub fn display(&self, decimals: usize) -> String {
        if self.min == self.max {
            format!("{:.decimals$}", self.median)
        } else {
            format!("{:.d$} [{:.d$}–{:.d$}]", self.median, self.min, self.max, d = decimals)
        }
    }
}

/// The least-squares slope of `y` over `x`; `None` for fewer than two points or all `x` equal.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    // Equal x compared exactly: their mean may round, leaving a tiny spread that is not there.
    if points.len() < 2 || points.iter().all(|p| p.0 == points[0].0) {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
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

    #[test]
    fn spreads_skip_nan_and_show_the_range_only_when_runs_differ() {
        let s = Spread::of(&[3.0, f64::NAN, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(s, Spread { median: 2.5, min: 1.0, max: 10.0 });
        assert_eq!(s.display(1), "2.5 [1.0–10.0]");
        assert_eq!(Spread::of(&[4.0]).unwrap().display(0), "4");
        assert_eq!(Spread::of(&[f64::NAN]), None);
    }

    #[test]
    fn slopes() {
        assert_eq!(slope(&[(1.0, 3.0), (2.0, 5.0), (3.0, 7.0)]), Some(2.0));
        assert_eq!(slope(&[(1.0, 3.0), (3.0, 3.0)]), Some(0.0));
        assert_eq!(slope(&[(1.0, 3.0)]), None);
        assert_eq!(slope(&[(2.0, 3.0), (2.0, 9.0)]), None);
        assert_eq!(slope(&[(0.7, 3.0); 8]), None, "a mean that rounds is still no spread");
    }
}
