//! Polling with deadlines and consecutive observations, so that no step relies on a fixed sleep.
//!
//! Two shapes cover every assertion in the suite:
//! * [`eventually`]: poll until the expected state is observed `reach_and_hold` times in a row
//!   (a state that flickers past is not accepted), failing at the deadline with the last
//!   observation;
//! * [`stays`]: the expected state must hold at every observation over a window (at least
//!   `hold_observations` of them); the first contrary observation fails at once.
use std::future::Future;
use std::time::Duration;

use anyhow::bail;
use tokio::time::{Instant, sleep_until};

/// What one observation found: the value when the expected state holds, otherwise why not.
pub type Observation<T> = Result<T, String>;

/// How long and how often to look, per tier; scaled by `--timeout-scale`, or overridden by
/// `--wait-timeout`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeouts {
    /// Deadline for "eventually" assertions.
    pub eventually: Duration,
    /// Window for "stays"/"still"/"during" assertions.
    pub hold_window: Duration,
    /// Time between two observations.
    pub interval: Duration,
    /// Consecutive passing observations an "eventually" assertion needs.
    pub reach_and_hold: u32,
    /// Minimum number of observations in a "stays" assertion.
    pub hold_observations: u32,
    /// The user's `--timeout-scale` (1 when not given), for deadlines a scenario states itself.
    pub scale: f64,
}

/// Which environment the suite runs in; real clusters schedule pods and are slower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutProfile {
    /// Local kube-apiserver + etcd, readiness simulated.
    Local,
    /// kind, k3s or any kubeconfig.
    RealCluster,
}

impl Timeouts {
    pub fn for_profile(profile: TimeoutProfile) -> Self {
        let (eventually, hold_window, interval) = match profile {
            TimeoutProfile::Local => (
                Duration::from_secs(30),
                Duration::from_secs(8),
                Duration::from_millis(200),
            ),
            // Every 500 ms: on a real cluster the operator's reactions take seconds (90th
            // percentile 2–5 s on kind, 2 cores), and the polls of 16–28 scenarios at 200 ms were
            // API-server work the scenarios waited for (kind suite 423–440 s → 394 s with this and
            // etcd on tmpfs).
            TimeoutProfile::RealCluster => (
                Duration::from_secs(180),
                Duration::from_secs(20),
                Duration::from_millis(500),
            ),
        };
        Timeouts {
            eventually,
            hold_window,
            interval,
            reach_and_hold: 2,
            hold_observations: 3,
            scale: 1.0,
        }
    }

    /// A deadline the scenario states (`within 15 seconds`), scaled like every other one.
    pub fn stated(&self, seconds: u64) -> Self {
        Timeouts {
            eventually: Duration::from_secs(seconds).mul_f64(self.scale),
            ..*self
        }
    }

    /// The deadlines after a fault the operator met for `failing_for` is cleared. D-10 lets that
    /// outcome wait for the operator's error backoff, whose length the contract leaves to the
    /// implementation (R-KEY-18: "controller backoff"). A backoff that doubles from the fault's
    /// start (controller-runtime's, kube-runtime's), with up to R-RL-2's ±20 % jitter, next tries
    /// within 1.5 times the time spent failing plus 1.2 first delays after the clear: its n-th delay
    /// is at most 1.2·2ⁿ·b while the ones before it add up to at least 0.8·(2ⁿ−1)·b. The tier's
    /// deadline stays on top, for the pass itself.
    pub fn after_fault(&self, failing_for: Duration) -> Self {
        let backoff = failing_for.mul_f64(1.5) + FIRST_ERROR_DELAY.mul_f64(1.2 * self.scale);
        Timeouts {
            eventually: self.eventually + backoff,
            ..*self
        }
    }

    /// Applies the user's `--timeout-scale` (multiplies deadlines and windows) and
    /// `--wait-timeout` (replaces the "eventually" deadline).
    pub fn adjusted(
        self,
        scale: Option<f64>,
        wait_timeout: Option<Duration>,
    ) -> anyhow::Result<Self> {
        let mut adjusted = self;
        if let Some(scale) = scale {
            if !(scale.is_finite() && scale > 0.0) {
                bail!("--timeout-scale must be a positive number, got {scale}");
            }
            adjusted.eventually = self.eventually.mul_f64(scale);
            adjusted.hold_window = self.hold_window.mul_f64(scale);
            adjusted.scale = scale;
        }
        if let Some(timeout) = wait_timeout {
            if timeout.is_zero() {
                bail!("--wait-timeout must be greater than zero");
            }
            adjusted.eventually = timeout;
        }
        Ok(adjusted)
    }
}

/// The longest first delay of an error backoff [`Timeouts::after_fault`] allows for (5 s,
/// the reference operator's; client-go's workqueue rate limiter starts at 5 ms).
const FIRST_ERROR_DELAY: Duration = Duration::from_secs(5);

/// Reactions measured before a real cluster's observation window follows them.
pub const MIN_REACTIONS: usize = 10;
/// The window per second of the operator's 90th-percentile reaction. On the local tier the
/// window (8 s) is 17 times that percentile (0.47 s over 95 reactions, 2026-12-06, 2 cores, 16
/// scenarios at a time), so a real cluster whose operator answers as fast gets the same window.
pub const REACTION_FACTOR: f64 = 16.0;

/// Issue 39: how long a "stays"/"no"/"exactly" observation watches after an action. Constant on
/// the local tier. On a real cluster it follows the operator's reactions this run measured (from
/// an action to the first condition that answers it, in scenarios D-10 holds to a prompt outcome):
/// [`REACTION_FACTOR`] times their 90th percentile, never shorter than the local tier's window nor
/// longer than the tier's own, which holds until [`MIN_REACTIONS`] are measured. A slow cluster
/// keeps the long window; a window never shrinks below what the local tier watches.
#[derive(Debug)]
pub struct ObservationWindow {
    floor: Duration,
    ceiling: Duration,
    /// `None`: the window is constant (the local tier).
    reactions: Option<std::sync::Mutex<Vec<Duration>>>,
}

impl ObservationWindow {
    pub fn constant(window: Duration) -> Self {
        Self {
            floor: window,
            ceiling: window,
            reactions: None,
        }
    }

    /// Between `floor` (the local tier's window) and `ceiling` (the tier's).
    pub fn measured(floor: Duration, ceiling: Duration) -> Self {
        Self {
            floor: floor.min(ceiling),
            ceiling,
            reactions: Some(Default::default()),
        }
    }

    pub fn record(&self, reaction: Duration) {
        if let Some(reactions) = &self.reactions {
            reactions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(reaction);
        }
    }

    /// The window for an observation starting now.
    pub fn current(&self) -> Duration {
        match self.percentile_90() {
            Some(p90) => p90.mul_f64(REACTION_FACTOR).clamp(self.floor, self.ceiling),
            None => self.ceiling,
        }
    }

    /// The reactions' 90th percentile once [`MIN_REACTIONS`] are measured.
    fn percentile_90(&self) -> Option<Duration> {
        let mut reactions = self
            .reactions
            .as_ref()?
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if reactions.len() < MIN_REACTIONS {
            return None;
        }
        reactions.sort();
        Some(reactions[(reactions.len() * 9).div_ceil(10) - 1])
    }

    /// For the summary and the report: how the window was sized; `None` when constant.
    pub fn describe(&self) -> Option<String> {
        let count = self
            .reactions
            .as_ref()?
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len();
        let seconds = |d: Duration| format!("{:.1} s", d.as_secs_f64());
        Some(match self.percentile_90() {
            Some(p90) => format!(
                "{} at the end: {REACTION_FACTOR} × the 90th percentile ({}) of the operator's {count} measured reactions, within {}–{} ({} until {MIN_REACTIONS} were measured)",
                seconds(self.current()),
                seconds(p90),
                seconds(self.floor),
                seconds(self.ceiling),
                seconds(self.ceiling),
            ),
            None => format!(
                "{} throughout: {count} of the {MIN_REACTIONS} operator reactions it takes to size it were measured",
                seconds(self.ceiling)
            ),
        })
    }
}

/// A probe error that ends an [`eventually`] wait at once: the awaited state can no longer come
/// (say, the operator under test exited), so waiting out the deadline would only hide why.
#[derive(Debug)]
pub struct Hopeless(pub String);

impl std::fmt::Display for Hopeless {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Hopeless {}

/// How long an observed value has stood unchanged (pure: the caller says when it looked).
#[derive(Debug)]
pub struct Steady<V> {
    last: Option<(V, Instant)>,
}

impl<V> Default for Steady<V> {
    fn default() -> Self {
        Steady { last: None }
    }
}

impl<V: PartialEq> Steady<V> {
    /// Records `value` as seen at `now`; returns how long it has stood since it was first seen.
    pub fn observe(&mut self, value: V, now: Instant) -> Duration {
        match &self.last {
            Some((last, since)) if *last == value => now.saturating_duration_since(*since),
            _ => {
                self.last = Some((value, now));
                Duration::ZERO
            }
        }
    }
}

/// Counts consecutive passing observations (pure, so it is unit-tested without time).
#[derive(Debug, Default)]
pub struct Streak {
    current: u32,
}

impl Streak {
    /// Records one observation; returns the length of the current run of passes.
    pub fn observe(&mut self, passed: bool) -> u32 {
        self.current = if passed { self.current + 1 } else { 0 };
        self.current
    }
}

/// Polls `probe` until it reports the expected state `reach_and_hold` times in a row.
///
/// A probe error (e.g. an API hiccup) counts as "not yet" and is reported if the deadline passes;
/// a [`Hopeless`] one fails at once.
pub async fn eventually<T, F, Fut>(
    what: &str,
    timeouts: &Timeouts,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Observation<T>>>,
{
    let deadline = Instant::now() + timeouts.eventually;
    let mut streak = Streak::default();
    loop {
        let next = Instant::now() + timeouts.interval;
        let last = match probe().await {
            Ok(Ok(value)) => {
                if streak.observe(true) >= timeouts.reach_and_hold.max(1) {
                    return Ok(value);
                }
                None
            }
            Ok(Err(why)) => {
                streak.observe(false);
                Some(why)
            }
            Err(error) if error.is::<Hopeless>() => {
                bail!("gave up waiting for {what}: {error}")
            }
            Err(error) => {
                streak.observe(false);
                Some(format!("error while observing: {error:#}"))
            }
        };
        if next >= deadline {
            let last =
                last.unwrap_or_else(|| "the expected state was seen but did not hold".to_owned());
            bail!(
                "timed out after {:.1}s waiting for {what}; last observation: {last}",
                timeouts.eventually.as_secs_f64()
            );
        }
        sleep_until(next).await;
    }
}

/// Requires `probe` to report the expected state at every observation for `window`
/// (and for at least `hold_observations` observations); fails at the first contrary one.
pub async fn stays<T, F, Fut>(
    what: &str,
    timeouts: &Timeouts,
    window: Duration,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Observation<T>>>,
{
    let end = Instant::now() + window;
    let mut observations = 0u32;
    loop {
        let next = Instant::now() + timeouts.interval;
        let value = match probe().await {
            Ok(Ok(value)) => value,
            Ok(Err(why)) => {
                bail!("expected {what} to hold, but after {observations} good observations: {why}")
            }
            Err(error) => bail!("expected {what} to hold, but observing it failed: {error:#}"),
        };
        observations += 1;
        if observations >= timeouts.hold_observations.max(1) && Instant::now() >= end {
            return Ok(value);
        }
        sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use std::cell::Cell;

    fn fast() -> Timeouts {
        Timeouts {
            eventually: Duration::from_millis(300),
            hold_window: Duration::from_millis(50),
            interval: Duration::from_millis(10),
            reach_and_hold: 2,
            hold_observations: 3,
            scale: 1.0,
        }
    }

    /// The doubling backoff the allowance is sized for, at its worst: every delay 20 % short
    /// until the fault is cleared, then the next one 20 % long.
    #[rstest]
    #[case::failing_briefly(3.0)]
    #[case::failing_for_a_minute(60.0)]
    #[case::failing_for_ten_minutes(600.0)]
    fn after_a_fault_the_deadline_covers_a_doubling_backoffs_next_attempt(
        #[case] failing_for: f64,
    ) {
        let tier = Timeouts::for_profile(TimeoutProfile::Local);
        let first = FIRST_ERROR_DELAY.as_secs_f64();
        let (mut last_attempt, mut delay) = (0.0, first);
        while last_attempt + 0.8 * delay <= failing_for {
            last_attempt += 0.8 * delay;
            delay *= 2.0;
        }
        let next_attempt_after_clear = last_attempt + 1.2 * delay - failing_for;
        let after = tier.after_fault(Duration::from_secs_f64(failing_for));
        assert!(
            after.eventually.as_secs_f64()
                >= tier.eventually.as_secs_f64() + next_attempt_after_clear,
            "{after:?} against a next attempt {next_attempt_after_clear} s after the clear"
        );
        assert_eq!(
            after.hold_window, tier.hold_window,
            "only the deadline grows"
        );
    }

    #[rstest]
    #[case::too_few_measured(vec![0.1; MIN_REACTIONS - 1], 20.0)]
    #[case::as_fast_as_the_local_tier(vec![0.4; MIN_REACTIONS], 8.0)]
    #[case::follows_the_90th_percentile(vec![0.8; MIN_REACTIONS], 12.8)]
    #[case::one_slow_reaction_in_ten_is_not_the_percentile(
        [vec![0.8; MIN_REACTIONS - 1], vec![30.0]].concat(), 12.8)]
    #[case::two_are(
        [vec![0.8; MIN_REACTIONS - 2], vec![30.0, 30.0]].concat(), 20.0)]
    fn a_measured_window_follows_the_operators_reactions_within_its_bounds(
        #[case] reactions: Vec<f64>,
        #[case] window: f64,
    ) {
        let measured = ObservationWindow::measured(Duration::from_secs(8), Duration::from_secs(20));
        for reaction in reactions {
            measured.record(Duration::from_secs_f64(reaction));
        }
        assert!(
            (measured.current().as_secs_f64() - window).abs() < 1e-6,
            "{:?}",
            measured.describe()
        );
    }

    #[test]
    fn a_constant_window_ignores_reactions() {
        let constant = ObservationWindow::constant(Duration::from_secs(8));
        for _ in 0..MIN_REACTIONS {
            constant.record(Duration::from_secs(60));
        }
        assert_eq!(constant.current(), Duration::from_secs(8));
        assert_eq!(constant.describe(), None);
    }

    #[test]
    fn a_stated_deadline_follows_the_timeout_scale_but_not_the_tier() {
        let slow = Timeouts::for_profile(TimeoutProfile::RealCluster)
            .adjusted(Some(2.0), None)
            .unwrap();
        assert_eq!(slow.stated(15).eventually, Duration::from_secs(30));
        assert_eq!(slow.stated(15).interval, slow.interval);
    }

    #[test]
    fn a_steady_value_counts_from_when_it_was_first_seen() {
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        let mut steady = Steady::default();
        assert_eq!(steady.observe("a", at(0)), Duration::ZERO);
        assert_eq!(steady.observe("a", at(3)), Duration::from_secs(3));
        assert_eq!(
            steady.observe("b", at(4)),
            Duration::ZERO,
            "a change starts over"
        );
        assert_eq!(steady.observe("b", at(9)), Duration::from_secs(5));
        assert_eq!(
            steady.observe("a", at(10)),
            Duration::ZERO,
            "so does a change back"
        );
    }

    #[rstest]
    #[case(&[true, true], 2)]
    #[case(&[true, false, true], 1)]
    #[case(&[false], 0)]
    #[case(&[true, true, true, false], 0)]
    fn streak_counts_consecutive_passes(#[case] observations: &[bool], #[case] expected: u32) {
        let mut streak = Streak::default();
        let last = observations
            .iter()
            .map(|passed| streak.observe(*passed))
            .last();
        assert_eq!(last.unwrap_or(0), expected);
    }

    #[rstest]
    #[case(None, None, Duration::from_secs(30))]
    #[case(Some(2.0), None, Duration::from_secs(60))]
    #[case(Some(2.0), Some(Duration::from_secs(5)), Duration::from_secs(5))]
    fn timeouts_are_scaled_or_overridden(
        #[case] scale: Option<f64>,
        #[case] wait: Option<Duration>,
        #[case] expected: Duration,
    ) {
        let adjusted = Timeouts::for_profile(TimeoutProfile::Local)
            .adjusted(scale, wait)
            .unwrap();
        assert_eq!(adjusted.eventually, expected);
    }

    #[rstest]
    #[case(0.0)]
    #[case(-1.0)]
    #[case(f64::NAN)]
    fn bad_scales_are_rejected(#[case] scale: f64) {
        assert!(
            Timeouts::for_profile(TimeoutProfile::Local)
                .adjusted(Some(scale), None)
                .is_err()
        );
    }

    #[tokio::test]
    async fn eventually_needs_the_state_to_hold() {
        let calls = Cell::new(0u32);
        // Passes on every call after the second: needs two consecutive passes.
        let value = eventually("counter", &fast(), || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move { Ok(if n >= 3 { Ok(n) } else { Err(format!("n={n}")) }) }
        })
        .await
        .unwrap();
        assert_eq!(value, 4);
    }

    #[tokio::test]
    async fn eventually_times_out_with_the_last_observation() {
        let error = eventually::<(), _, _>("never", &fast(), || async {
            Ok(Err("still absent".to_owned()))
        })
        .await
        .unwrap_err();
        assert!(error.to_string().contains("still absent"), "{error}");
    }

    #[tokio::test]
    async fn a_hopeless_observation_ends_the_wait_at_once() {
        let calls = Cell::new(0u32);
        let error = eventually::<(), _, _>("ready", &fast(), || {
            calls.set(calls.get() + 1);
            async { Err(Hopeless("the operator exited".to_owned()).into()) }
        })
        .await
        .unwrap_err();
        assert!(error.to_string().contains("operator exited"), "{error}");
        assert_eq!(calls.get(), 1);
    }

    #[tokio::test]
    async fn a_flicker_does_not_satisfy_eventually() {
        let calls = Cell::new(0u32);
        let result = eventually("flicker", &fast(), || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                Ok(if n.is_multiple_of(2) {
                    Ok(())
                } else {
                    Err("odd".to_owned())
                })
            }
        })
        .await;
        assert!(result.is_err());
    }

    #[tokio::test]
    async fn stays_fails_at_the_first_contrary_observation() {
        let calls = Cell::new(0u32);
        let error = stays("stable", &fast(), Duration::from_millis(100), || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                Ok(if n < 3 {
                    Ok(())
                } else {
                    Err("changed".to_owned())
                })
            }
        })
        .await
        .unwrap_err();
        assert!(error.to_string().contains("changed"), "{error}");
        assert_eq!(calls.get(), 3);
    }
}
