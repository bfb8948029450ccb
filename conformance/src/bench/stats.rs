//! Latency summaries: nearest-rank percentiles over per-CR durations.
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// p50, p95 and max of a set of durations, in milliseconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: Option<u64>,
    pub p95_ms: Option<u64>,
    pub max_ms: Option<u64>,
}

impl Latency {
    pub fn of(durations: &[Duration]) -> Self {
        let mut millis: Vec<u64> = durations.iter().map(|d| millis(*d)).collect();
        millis.sort_unstable();
        Self {
            samples: millis.len(),
            p50_ms: percentile(&millis, 50.0),
            p95_ms: percentile(&millis, 95.0),
            max_ms: millis.last().copied(),
        }
    }
}

/// Nearest-rank percentile of an ascending slice: the smallest value with at least `p` % of the
/// samples at or below it. `None` for no samples.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// Whole milliseconds, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `numerator / denominator`, `None` when there is nothing to divide by.
pub fn per(numerator: u64, denominator: usize) -> Option<f64> {
    (denominator > 0).then(|| numerator as f64 / denominator as f64)
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case(&[], 50.0, None)]
    #[case(&[7], 50.0, Some(7))]
    #[case(&[7], 95.0, Some(7))]
    #[case(&[1, 2, 3, 4], 50.0, Some(2))]
    #[case(&[1, 2, 3, 4], 95.0, Some(4))]
    #[case(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 50.0, Some(5))]
    #[case(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 95.0, Some(10))]
    #[case(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90.0, Some(9))]
    #[case(&[1, 2, 3], 0.0, Some(1))]
    #[case(&[1, 2, 3], 100.0, Some(3))]
    fn nearest_rank_percentiles(
        #[case] sorted: &[u64],
        #[case] p: f64,
        #[case] expected: Option<u64>,
    ) {
        assert_eq!(percentile(sorted, p), expected);
    }

    #[test]
    fn latency_sorts_its_samples() {
        let durations: Vec<Duration> = [30, 10, 20, 40]
            .into_iter()
            .map(Duration::from_millis)
            .collect();
        let latency = Latency::of(&durations);
        assert_eq!(
            latency,
            Latency {
                samples: 4,
                p50_ms: Some(20),
                p95_ms: Some(40),
                max_ms: Some(40)
            }
        );
        assert_eq!(Latency::of(&[]), Latency::default());
    }

    #[test]
    fn ratios_need_a_denominator() {
        assert_eq!(per(5, 2), Some(2.5));
        assert_eq!(per(5, 0), None);
    }
}
