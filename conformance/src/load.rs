//! Concurrency that follows the machine: how busy the CPUs are, sampled from `/proc/stat`, so
//! that a run starts its next scenario (and the seeded stage its next suite run) only while the
//! CPUs have room. A run is wait-bound (its scenarios mostly wait for the operator), so up to
//! the limit more at once cost nothing; on a machine that is saturated (other suite runs, a
//! build) each scenario's waits stretch towards their deadlines instead, and starting fewer is
//! what keeps verdicts honest.
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Busier than this (the share of all CPUs over the last `BUSY_SPAN`), a scenario waits to
/// start: the CPUs are saturated, and another scenario would only stretch everyone's waits.
pub const SCENARIO_START_LIMIT: f64 = 0.97;
/// Busier than this, a seeded-bugs suite run waits to start: each starts a control plane and an
/// operator, a burst of work a busy machine would stretch across the runs already going.
pub const RUN_START_LIMIT: f64 = 0.9;
/// How far back the busy share looks: a wait-bound run's CPU use comes in bursts of a second or
/// two (a control plane's start, a burst of reconciles), which holding starts back only
/// lengthens (on 2 cores, above 90 % over 0.5 s held a one-worker operator's run 147 starts,
/// 881 s in all, and it took 164 s; with no start held, 144 s). A machine kept busy by other
/// work stays busy over the span.
const BUSY_SPAN: Duration = Duration::from_secs(5);
/// The longest a start waits for room: past it, it starts anyway (the machine may stay busy
/// with work that is not the suite's).
const LONGEST_WAIT: Duration = Duration::from_secs(20);
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// The last sample's busy share, in thousandths; `None` until sampling runs (or without
/// `/proc/stat`).
static BUSY_PER_MILLE: OnceLock<AtomicU32> = OnceLock::new();
static STARTS_HELD: AtomicU64 = AtomicU64::new(0);
static MILLIS_HELD: AtomicU64 = AtomicU64::new(0);

/// (busy, total) jiffies of all CPUs since boot.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(stat.lines().next()?)
}

/// The `cpu` line of `/proc/stat`: idle and iowait are not busy.
fn parse_cpu_line(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let values: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = values.iter().sum();
    let idle = values.get(3)? + values.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// Starts sampling (once per process); without `/proc/stat` nothing adapts.
pub fn start_sampling() {
    let Some(first) = cpu_jiffies() else {
        return;
    };
    let busy = BUSY_PER_MILLE.get_or_init(|| AtomicU32::new(0));
    let kept = (BUSY_SPAN.as_millis() / SAMPLE_EVERY.as_millis()) as usize + 1;
    tokio::spawn(async move {
        let mut samples = std::collections::VecDeque::from([first]);
        loop {
            tokio::time::sleep(SAMPLE_EVERY).await;
            let Some(now) = cpu_jiffies() else { return };
            samples.push_back(now);
            if samples.len() > kept {
                samples.pop_front();
            }
            if let Some(share) = busy_per_mille(&samples) {
                busy.store(share, Ordering::Relaxed);
            }
        }
    });
}

/// The busy share, in thousandths, from the oldest sample to the newest.
fn busy_per_mille(samples: &std::collections::VecDeque<(u64, u64)>) -> Option<u32> {
    let (oldest, newest) = (samples.front()?, samples.back()?);
    let (busy, total) = (newest.0 - oldest.0, newest.1 - oldest.1);
    (busy * 1000)
        .checked_div(total)
        .map(|share| u32::try_from(share).unwrap_or(1000))
}

fn busy() -> Option<f64> {
    BUSY_PER_MILLE
        .get()
        .map(|b| f64::from(b.load(Ordering::Relaxed)) / 1000.0)
}

/// Waits while the CPUs are busier than `limit` and `running()` (at least `floor`, which always
/// start: a saturated machine still makes progress) already run, for at most `LONGEST_WAIT`.
pub async fn room_for_another(running: impl Fn() -> usize, floor: usize, limit: f64) {
    let started = tokio::time::Instant::now();
    let mut held = false;
    while running() >= floor
        && busy().is_some_and(|b| b > limit)
        && started.elapsed() < LONGEST_WAIT
    {
        held = true;
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    if held {
        STARTS_HELD.fetch_add(1, Ordering::Relaxed);
        MILLIS_HELD.fetch_add(
            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// How many starts waited for room, and how long in all.
pub fn held() -> (u64, Duration) {
    (
        STARTS_HELD.load(Ordering::Relaxed),
        Duration::from_millis(MILLIS_HELD.load(Ordering::Relaxed)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_and_iowait_are_not_busy() {
        assert_eq!(
            parse_cpu_line("cpu  100 5 50 800 40 3 2 0 0 0"),
            Some((160, 1000))
        );
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(parse_cpu_line("intr 1 2"), None);
    }

    #[test]
    fn the_busy_share_spans_every_kept_sample() {
        // A burst in the last half second does not make a mostly idle span busy.
        let samples = [(0, 0), (10, 100), (20, 200), (120, 300)].into();
        assert_eq!(busy_per_mille(&samples), Some(400));
        assert_eq!(busy_per_mille(&[(5, 50)].into()), None);
        assert_eq!(busy_per_mille(&Default::default()), None);
    }
}
