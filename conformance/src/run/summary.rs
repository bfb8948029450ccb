//! The summary a run prints on the terminal: the tallies, the real skips with their reasons,
//! what was simulated, the rules' verdicts and the conformance claims.
use std::path::Path;

use crate::paths::{HTML_REPORT_FILE, REPORT_FILE};
use crate::report::model::{self, ConformanceReport};
use crate::selection::{NOT_SELECTED, NOT_STARTED};

pub(super) fn print_summary(report: &ConformanceReport, report_dir: &Path, pace: &Pace) {
    println!();
    for line in summary_lines(report) {
        println!("{line}");
    }
    println!("{}", pace.line());
    if let Some(window) = &pace.window {
        println!("Window:   observations after an action watched {window}");
    }
    if let Some(shrinking) = &pace.shrinking {
        println!("{shrinking}");
    }
    println!(
        "Reports in {}: junit.xml, cucumber.json, {REPORT_FILE}, {HTML_REPORT_FILE}",
        report_dir.display()
    );
}

/// How the run used the machine: how many scenarios ran at once, and how busy the CPUs were
/// (this process and the processes it started and waited for: the control planes, fake
/// coderds and operators), so that a slow run says whether it waited or computed.
pub(super) struct Pace {
    pub scenarios: usize,
    pub wall: std::time::Duration,
    pub limit: usize,
    /// With the concurrency adapting to the CPUs: how many starts waited for room, how long in
    /// all; `None` when `--pin-concurrency` pinned it.
    pub held: Option<(u64, std::time::Duration)>,
    /// The private environments, if any.
    pub private: Option<PrivateLanes>,
    /// How a measured observation window was sized (real clusters); `None` when constant.
    pub window: Option<String>,
    /// What shrinking failed generated cases spent of the run's budget; `None` when none was.
    pub shrinking: Option<String>,
}

impl Pace {
    pub(super) fn line(&self) -> String {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let cpu = cpu_seconds();
        let wall = self.wall.as_secs_f64();
        let lanes = match self.private {
            Some(PrivateLanes {
                serial,
                environments,
                others,
            }) => format!(
                "; the {serial} @serial ones one at a time in {environments} private environment(s) beside them, and {others} others there once those were done"
            ),
            None => "; any @serial ones alone".to_owned(),
        };
        let limit = match self.held {
            Some((0, _)) => format!("limit {}, never held back by busy CPUs", self.limit),
            Some((starts, waited)) => format!(
                "limit {}, {starts} starts held back {:.0} s in all while the CPUs were busy",
                self.limit,
                waited.as_secs_f64()
            ),
            None => format!("pinned to {} by --pin-concurrency", self.limit),
        };
        format!(
            "Pace:     {} scenarios in {wall:.0} s, up to {} at once ({limit}{lanes}); CPU used by the suite and the processes it started {cpu:.0} s of {:.0} s on {cpus} cores ({:.0} %)",
            self.scenarios,
            crate::world::peak_running(),
            wall * cpus as f64,
            100.0 * cpu / (wall * cpus as f64).max(f64::EPSILON)
        )
    }
}

/// The `@serial` scenarios, the private environments they ran in, and the other scenarios
/// that ran there once they were done.
pub(super) struct PrivateLanes {
    pub serial: usize,
    pub environments: usize,
    pub others: usize,
}

/// User and system CPU seconds of this process and its waited-for children.
fn cpu_seconds() -> f64 {
    let seconds = |who| {
        // SAFETY: getrusage only writes the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(who, &mut usage) } != 0 {
            return 0.0;
        }
        let time = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        time(usage.ru_utime) + time(usage.ru_stime)
    };
    seconds(libc::RUSAGE_SELF) + seconds(libc::RUSAGE_CHILDREN)
}

/// Skipped because this run left the scenario out (a filter, or --fail-fast stopping early),
/// not because the environment lacks something it needs.
pub(crate) fn left_out_by_the_run(result: &model::ScenarioResult) -> bool {
    result.status == model::Status::Skipped
        && result
            .reason
            .as_deref()
            .is_some_and(|reason| reason.starts_with(NOT_SELECTED) || reason == NOT_STARTED)
}

/// The claim for one level. A run that left scenarios out is partial: it neither claims nor
/// denies conformance unless a scenario it ran failed. A skip this run could not avoid (the tier
/// lacks what the scenario needs) denies it, saying so: nothing failed, but nothing proves it.
fn claim(conformant: bool, failed: usize, skipped: usize, left_out: usize) -> String {
    if conformant {
        "yes".to_owned()
    } else if failed > 0 {
        "no".to_owned()
    } else if left_out == 0 && skipped > 0 {
        format!("no ({skipped} scenarios skipped, each with its reason above; none failed)")
    } else if left_out == 0 {
        "no".to_owned()
    } else {
        format!("not claimed (a partial run: {left_out} scenarios not run)")
    }
}

/// The terminal summary: per level the tally, with the scenarios the run left out counted apart
/// from skips, each real skip with its reason, what was simulated, and each level's claim.
fn summary_lines(report: &ConformanceReport) -> Vec<String> {
    let left_out = |level: model::Level| {
        report
            .results
            .iter()
            .filter(|r| r.level == Some(level) && left_out_by_the_run(r))
            .count()
    };
    let (core_left_out, extended_left_out) = (
        left_out(model::Level::Core),
        left_out(model::Level::Extended),
    );
    let tally = |t: &model::Tally, left_out: usize| {
        let mut line = format!(
            "{} passed, {} failed, {} skipped, {} flaky",
            t.passed,
            t.failed,
            t.skipped.saturating_sub(left_out),
            t.flaky
        );
        if t.not_applicable > 0 {
            line += &format!(" ({} of them not applying to it, D-12)", t.not_applicable);
        }
        if left_out > 0 {
            line += &format!("; {left_out} not run");
        }
        line
    };
    let summary = &report.summary;
    let mut lines = vec![
        format!("Core:     {}", tally(&summary.core, core_left_out)),
        format!("Extended: {}", tally(&summary.extended, extended_left_out)),
    ];
    let (left_out, skipped): (Vec<_>, Vec<_>) = report
        .results
        .iter()
        .filter(|r| r.status == model::Status::Skipped)
        .partition(|r| left_out_by_the_run(r));
    let not_started = left_out
        .iter()
        .filter(|r| r.reason.as_deref() == Some(NOT_STARTED))
        .count();
    if !left_out.is_empty() {
        lines.push(format!(
            "  not run: {} not selected by --tags/--name, {not_started} not started before the run stopped (listed in the report)",
            left_out.len() - not_started
        ));
    }
    lines.extend(skipped.iter().map(|result| {
        format!(
            "  skipped {}:{} \"{}\": {}",
            result.feature,
            result.line,
            result.scenario,
            result.reason.as_deref().unwrap_or("")
        )
    }));
    // Each failure with its diagnostics: printed while 16 scenarios ran at once, the after-hook's
    // "diagnostics for …" line may sit far from the failure it belongs to.
    lines.extend(
        report
            .results
            .iter()
            .filter(|r| r.status == model::Status::Failed)
            .map(|result| {
                let mut line = format!(
                    "  failed {}:{} \"{}\"",
                    result.feature, result.line, result.scenario
                );
                if let Some(folder) = &result.diagnostics {
                    line += &format!(": diagnostics in {folder}/");
                }
                line
            }),
    );
    lines.extend(
        report
            .environment
            .simulated
            .iter()
            .map(|note| format!("Simulated: {note}")),
    );
    lines.extend(rule_lines(&report.coverage));
    lines.push(format!(
        "Core conformance: {}",
        claim(
            summary.core_conformant,
            summary.core.failed,
            summary.core.unproven() - core_left_out,
            core_left_out
        )
    ));
    lines.push(format!(
        "Extended conformance: {}",
        claim(
            summary.extended_conformant,
            summary.core.failed + summary.extended.failed,
            summary.core.unproven() + summary.extended.unproven() - core_left_out - extended_left_out,
            core_left_out + extended_left_out
        )
    ));
    lines
}

/// The rules' verdicts: a count of each, the rules without a scenario apart, and each failed
/// rule with the scenarios that failed on it (nothing for a report without verdicts).
fn rule_lines(coverage: &[model::RuleCoverage]) -> Vec<String> {
    use model::RuleVerdict;
    if coverage.iter().all(|r| r.verdict.is_none()) {
        return Vec::new();
    }
    let (observable, unobservable): (Vec<_>, Vec<_>) =
        coverage.iter().partition(|r| r.unobservable.is_none());
    let count = |verdict: RuleVerdict| {
        observable
            .iter()
            .filter(|r| r.verdict == Some(verdict))
            .count()
    };
    let mut lines = vec![format!(
        "Rules:    {} passed, {} failed, {} not reached, {} not run; {} not observable",
        count(RuleVerdict::Passed),
        count(RuleVerdict::Failed),
        count(RuleVerdict::NotReached),
        count(RuleVerdict::NotRun),
        unobservable.len()
    )];
    for rule in coverage
        .iter()
        .filter(|r| r.verdict == Some(RuleVerdict::Failed))
    {
        let at: Vec<String> = rule
            .scenarios
            .iter()
            .filter(|s| s.verdict == Some(RuleVerdict::Failed))
            .map(|s| format!("{}:{}", s.feature, s.line))
            .collect();
        lines.push(format!("  failed {}: {}", rule.rule, at.join(", ")));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skipped(level: model::Level, reason: &str) -> model::ScenarioResult {
        model::ScenarioResult {
            reason: Some(reason.to_owned()),
            ..crate::report::model::tests::result(Some(level), model::Status::Skipped)
        }
    }

    fn ran(level: model::Level, status: model::Status) -> model::ScenarioResult {
        crate::report::model::tests::result(Some(level), status)
    }

    fn summary_of(results: Vec<model::ScenarioResult>) -> Vec<String> {
        summary_lines(&crate::report::model::tests::report(results))
    }

    fn line<'a>(lines: &'a [String], start: &str) -> &'a str {
        lines
            .iter()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line {start:?} in {lines:#?}"))
    }

    #[test]
    fn a_filtered_run_claims_nothing_and_counts_its_filtered_scenarios_apart() {
        use model::{Level, Status};
        let not_selected = format!("{NOT_SELECTED} --tags");
        let lines = summary_of(vec![
            ran(Level::Core, Status::Passed),
            skipped(Level::Core, &not_selected),
            skipped(Level::Core, &not_selected),
            skipped(Level::Extended, &not_selected),
        ]);
        assert_eq!(
            line(&lines, "Core:"),
            "Core:     1 passed, 0 failed, 0 skipped, 0 flaky; 2 not run"
        );
        assert_eq!(
            line(&lines, "Core conformance:"),
            "Core conformance: not claimed (a partial run: 2 scenarios not run)"
        );
        assert_eq!(
            line(&lines, "Extended conformance:"),
            "Extended conformance: not claimed (a partial run: 3 scenarios not run)"
        );
        assert!(
            !lines.iter().any(|l| l.starts_with("  skipped ")),
            "a filtered scenario is not listed as a skip: {lines:#?}"
        );
    }

    #[test]
    fn scenarios_fail_fast_never_started_keep_the_run_from_claiming() {
        use model::{Level, Status};
        // An Extended failure stopped the run before the remaining Core scenario started.
        let lines = summary_of(vec![
            ran(Level::Core, Status::Passed),
            ran(Level::Extended, Status::Failed),
            skipped(Level::Core, NOT_STARTED),
        ]);
        assert_eq!(
            line(&lines, "Core conformance:"),
            "Core conformance: not claimed (a partial run: 1 scenarios not run)"
        );
        assert_eq!(
            line(&lines, "Extended conformance:"),
            "Extended conformance: no"
        );
        assert!(line(&lines, "  not run:").contains("1 not started before the run stopped"));
    }

    #[test]
    fn a_failure_or_a_real_skip_denies_the_claim_and_a_full_pass_makes_it() {
        use model::{Level, Status};
        let failed = summary_of(vec![
            ran(Level::Core, Status::Failed),
            skipped(Level::Core, &format!("{NOT_SELECTED} --name")),
        ]);
        assert_eq!(line(&failed, "Core conformance:"), "Core conformance: no");
        let gap = summary_of(vec![
            ran(Level::Core, Status::Passed),
            skipped(Level::Core, "needs the fake coderd"),
        ]);
        assert_eq!(
            line(&gap, "Core conformance:"),
            "Core conformance: no (1 scenarios skipped, each with its reason above; none failed)"
        );
        assert!(line(&gap, "  skipped ").ends_with(": needs the fake coderd"));
        let full = summary_of(vec![
            ran(Level::Core, Status::Passed),
            ran(Level::Extended, Status::Passed),
        ]);
        assert_eq!(line(&full, "Core conformance:"), "Core conformance: yes");
        assert_eq!(
            line(&full, "Extended conformance:"),
            "Extended conformance: yes"
        );
    }

    #[test]
    fn a_scenario_that_does_not_apply_is_counted_and_listed_as_skipped() {
        use model::{Level, Status};
        let reason = format!(
            "{}it records key ids by listing (D-12)",
            crate::report::not_applicable::DOES_NOT_APPLY
        );
        let lines = summary_of(vec![
            ran(Level::Extended, Status::Passed),
            skipped(Level::Extended, &reason),
        ]);
        assert_eq!(
            line(&lines, "Extended:"),
            "Extended: 1 passed, 0 failed, 1 skipped, 0 flaky (1 of them not applying to it, D-12)"
        );
        assert!(line(&lines, "  skipped ").ends_with(&reason), "{lines:#?}");
        assert_eq!(
            line(&lines, "Extended conformance:"),
            "Extended conformance: no",
            "no Core scenario ran; a skip that does not apply denies nothing"
        );
        assert!(
            !lines.iter().any(|l| l.starts_with("  failed ")),
            "{lines:#?}"
        );
    }

    #[test]
    fn the_rules_verdicts_are_counted_and_failed_rules_named() {
        use model::{Level, Status};
        let failed = summary_of(vec![ran(Level::Core, Status::Failed)]);
        assert_eq!(
            line(&failed, "Rules:"),
            "Rules:    0 passed, 1 failed, 0 not reached, 0 not run; 0 not observable"
        );
        assert_eq!(
            line(&failed, "  failed R-"),
            "  failed R-KEY-4: a.feature:3"
        );
        let passed = summary_of(vec![ran(Level::Core, Status::Passed)]);
        assert_eq!(
            line(&passed, "Rules:"),
            "Rules:    1 passed, 0 failed, 0 not reached, 0 not run; 0 not observable"
        );
        let mut old = crate::report::model::tests::report(vec![ran(Level::Core, Status::Passed)]);
        old.coverage[0].verdict = None;
        assert!(!summary_lines(&old).iter().any(|l| l.starts_with("Rules:")));
    }

    #[test]
    fn each_failed_scenario_is_listed_with_its_diagnostics() {
        use model::{Level, Status};
        let mut failed = ran(Level::Core, Status::Failed);
        failed.diagnostics = Some("diagnostics/a-3-x".to_owned());
        let lines = summary_of(vec![failed.clone(), ran(Level::Core, Status::Passed)]);
        let listed: Vec<_> = lines
            .iter()
            .filter(|l| l.starts_with("  failed ") && !l.starts_with("  failed R-"))
            .collect();
        assert_eq!(
            listed,
            [&format!(
                "  failed {}:{} \"{}\": diagnostics in diagnostics/a-3-x/",
                failed.feature, failed.line, failed.scenario
            )]
        );
    }
}
