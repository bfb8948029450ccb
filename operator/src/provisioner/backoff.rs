//! Requeue delays: rate-limit backoff (contract §11) and per-CR attempt counters.
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

const RATE_LIMIT_BASE: Duration = Duration::from_secs(2);
const MIN_DELAY: Duration = Duration::from_secs(1);
/// Upper bound of every computed delay (R-RL-2).
pub const MAX_DELAY: Duration = Duration::from_secs(120);
/// Relative jitter: ±20 % (R-RL-2).
pub const JITTER: f64 = 0.2;

/// Delay before the `attempt`-th consecutive retry (1-based): `base · 2^(attempt-1)`, scaled by
/// `1 + jitter` (`jitter` in `[-JITTER, JITTER]`), clamped to `[1 s, 2 min]`.
pub fn exponential_delay(base: Duration, attempt: u32, jitter: f64) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    let nominal = base.as_secs_f64() * f64::from(1_u32 << doublings);
    let jittered = nominal * (1.0 + jitter.clamp(-JITTER, JITTER));
    Duration::from_secs_f64(jittered).clamp(MIN_DELAY, MAX_DELAY)
}

/// Requeue delay after the `attempt`-th consecutive 429: exponential from 2 s (R-RL-2), and never
/// later than coderd's `Retry-After`. coderd sends the length of its limiter window there (60 s),
/// after which the limit has certainly reset, so waiting longer gains nothing; using it as a
/// lower bound instead would turn the contract's 2 s, 4 s, … sequence into 60 s waits.
pub fn rate_limit_delay(attempt: u32, retry_after: Option<Duration>, jitter: f64) -> Duration {
    let backoff = exponential_delay(RATE_LIMIT_BASE, attempt, jitter);
    retry_after.map_or(backoff, |window| {
        backoff.min(window.clamp(MIN_DELAY, MAX_DELAY))
    })
}

/// A uniformly random jitter in `[-JITTER, JITTER]`.
pub fn random_jitter() -> f64 {
    rand::random_range(-JITTER..=JITTER)
}

/// Consecutive-attempt counters keyed by object (`namespace/name`).
#[derive(Debug, Default)]
pub struct AttemptCounters(Mutex<HashMap<String, u32>>);

impl AttemptCounters {
    /// Counts one more attempt and returns the new count (1 for the first).
    pub fn bump(&self, key: &str) -> u32 {
        let mut counters = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counters.entry(key.to_owned()).or_default();
        *count = count.saturating_add(1);
        *count
    }

    pub fn reset(&self, key: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

/// Per-object "not before" instants for coderd key calls.
///
/// The controller re-runs a CR on every change to it, including the status write that reports a
/// 429 or a key failure, so a requeue delay alone would be skipped by that immediate re-run. The
/// key step consults this before calling coderd and waits out the remaining time instead.
#[derive(Debug, Default)]
pub struct HoldOff(Mutex<HashMap<String, Instant>>);

impl HoldOff {
    pub fn hold(&self, key: &str, until: Instant) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_owned(), until);
    }

    /// Time left before `key` may call coderd again, if any.
    pub fn remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        let holds = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        holds
            .get(key)
            .and_then(|until| until.checked_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    pub fn clear(&self, key: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::first(1, 0.0, 2.0)]
    #[case::second(2, 0.0, 4.0)]
    #[case::third(3, 0.0, 8.0)]
    #[case::first_low_jitter(1, -0.2, 1.6)]
    #[case::second_high_jitter(2, 0.2, 4.8)]
    #[case::capped(12, 0.0, 120.0)]
    #[case::capped_with_jitter(30, 0.2, 120.0)]
    #[case::jitter_is_clamped(1, -5.0, 1.6)]
    fn rate_limit_backoff_doubles_with_bounded_jitter(
        #[case] attempt: u32,
        #[case] jitter: f64,
        #[case] secs: f64,
    ) {
        let delay = rate_limit_delay(attempt, None, jitter);
        assert!(
            (delay.as_secs_f64() - secs).abs() < 1e-6,
            "{delay:?} != {secs}"
        );
    }

    #[test]
    fn second_retry_is_always_longer_than_first() {
        assert!(rate_limit_delay(2, None, -JITTER) > rate_limit_delay(1, None, JITTER));
    }

    #[rstest]
    #[case::early_attempts_keep_the_contract_sequence(1, 60, 2.0)]
    #[case::second_attempt(2, 60, 4.0)]
    #[case::window_caps_late_attempts(7, 60, 60.0)]
    #[case::tiny_window_still_waits_a_second(3, 0, 1.0)]
    #[case::huge_window_is_capped(12, 3600, 120.0)]
    fn retry_after_is_an_upper_bound(
        #[case] attempt: u32,
        #[case] retry_after: u64,
        #[case] secs: f64,
    ) {
        let delay = rate_limit_delay(attempt, Some(Duration::from_secs(retry_after)), 0.0);
        assert!(
            (delay.as_secs_f64() - secs).abs() < 1e-6,
            "{delay:?} != {secs}"
        );
    }

    #[test]
    fn counters_count_per_object_and_reset() {
        let counters = AttemptCounters::default();
        assert_eq!(counters.bump("ns/a"), 1);
        assert_eq!(counters.bump("ns/a"), 2);
        assert_eq!(counters.bump("ns/b"), 1);
        counters.reset("ns/a");
        assert_eq!(counters.bump("ns/a"), 1);
    }

    #[test]
    fn hold_off_reports_the_time_left_until_it_expires() {
        let holds = HoldOff::default();
        let now = Instant::now();
        assert_eq!(holds.remaining("ns/a", now), None);
        holds.hold("ns/a", now + Duration::from_secs(2));
        assert_eq!(holds.remaining("ns/a", now), Some(Duration::from_secs(2)));
        assert_eq!(holds.remaining("ns/a", now + Duration::from_secs(2)), None);
        assert_eq!(holds.remaining("ns/b", now), None);
        holds.clear("ns/a");
        assert_eq!(holds.remaining("ns/a", now), None);
    }

    #[test]
    fn random_jitter_stays_in_range() {
        for _ in 0..1000 {
            assert!((-JITTER..=JITTER).contains(&random_jitter()));
        }
    }
}
