//! `--shrink-seconds`: the time a whole run may spend shrinking its failed generated cases,
//! shared by all of them (those of private environments too), so that an operator failing many
//! cases is still judged quickly. Each trial holds what it may wait before it starts and gives
//! back what it did not use, so that cases shrinking side by side never hold more than is left.
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

#[derive(Debug)]
pub struct ShrinkBudget {
    total: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    spent: Duration,
    held: Duration,
    /// Cases shrunk, and of those the ones the budget cut short.
    cases: usize,
    cut_short: usize,
}

impl ShrinkBudget {
    pub fn new(total: Duration) -> Self {
        Self {
            total,
            state: Mutex::default(),
        }
    }

    /// Shrinking is off (`--shrink-seconds 0`).
    pub fn is_off(&self) -> bool {
        self.total.is_zero()
    }

    pub fn total(&self) -> Duration {
        self.total
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds up to `want` of what is left for one trial (zero once nothing is left), until
    /// [`Self::spend`] settles it.
    pub fn hold(&self, want: Duration) -> Duration {
        let mut state = self.state();
        let left = self.total.saturating_sub(state.spent + state.held);
        let held = want.min(left);
        state.held += held;
        held
    }

    /// Settles a hold: `used` is spent (more than was held if the trial overran it), the rest of
    /// the hold is left for other trials.
    pub fn spend(&self, held: Duration, used: Duration) {
        let mut state = self.state();
        state.held = state.held.saturating_sub(held);
        state.spent += used;
    }

    /// Records a shrunk case, and whether the budget ran out before it was done.
    pub fn case_done(&self, cut_short: bool) {
        let mut state = self.state();
        state.cases += 1;
        state.cut_short += usize::from(cut_short);
    }

    /// The run summary's line: how much of the budget the shrunk cases spent, and how many it
    /// cut short; `None` when no case was shrunk.
    pub fn summary(&self) -> Option<String> {
        let state = self.state();
        if state.cases == 0 {
            return None;
        }
        let mut line = format!(
            "Shrinking: {} failed generated case(s) shrunk in {:.0} s of the run's {:.0} s (--shrink-seconds, shared by all)",
            state.cases,
            state.spent.as_secs_f64(),
            self.total.as_secs_f64()
        );
        if state.cut_short > 0 {
            line += &format!(
                "; it ran out: {} case(s) not shrunk to the end",
                state.cut_short
            );
        }
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn trials_side_by_side_never_hold_more_than_is_left() {
        let budget = ShrinkBudget::new(secs(60));
        assert_eq!(budget.hold(secs(40)), secs(40));
        assert_eq!(budget.hold(secs(40)), secs(20), "only what the first left");
        assert_eq!(budget.hold(secs(10)), Duration::ZERO, "nothing left");
        // The first trial settled early: what it did not use is there again.
        budget.spend(secs(40), secs(5));
        assert_eq!(budget.hold(secs(50)), secs(35));
    }

    #[test]
    fn an_overrun_is_spent_and_the_budget_stays_spent() {
        let budget = ShrinkBudget::new(secs(10));
        let held = budget.hold(secs(10));
        budget.spend(held, secs(12));
        assert_eq!(budget.hold(secs(1)), Duration::ZERO);
    }

    #[test]
    fn the_summary_says_what_was_spent_and_whether_it_ran_out() {
        let budget = ShrinkBudget::new(secs(60));
        assert_eq!(budget.summary(), None, "no case shrunk");
        let held = budget.hold(secs(30));
        budget.spend(held, secs(25));
        budget.case_done(false);
        assert_eq!(
            budget.summary().unwrap(),
            "Shrinking: 1 failed generated case(s) shrunk in 25 s of the run's 60 s (--shrink-seconds, shared by all)"
        );
        let held = budget.hold(secs(60));
        budget.spend(held, held);
        budget.case_done(true);
        budget.case_done(true);
        assert!(
            budget
                .summary()
                .unwrap()
                .ends_with("60 s of the run's 60 s (--shrink-seconds, shared by all); it ran out: 2 case(s) not shrunk to the end"),
            "{:?}",
            budget.summary()
        );
        assert!(ShrinkBudget::new(Duration::ZERO).is_off());
    }
}
