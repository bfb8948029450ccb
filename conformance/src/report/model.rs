//! The conformance report (YAML) and its verification. Pure: no I/O besides what callers pass in.
use std::collections::BTreeMap;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Identifies the document format; `verify-report` refuses other values.
pub const SCHEMA: &str = "coder-provisioner-conformance/report/v1";

/// Conformance level of a scenario (contract D-7), from its `@core`/`@extended` tag.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Core,
    Extended,
}

impl Level {
    pub fn from_tags<'a>(tags: impl IntoIterator<Item = &'a String>) -> Option<Level> {
        let mut level = None;
        for tag in tags {
            match tag.as_str() {
                "core" => return Some(Level::Core),
                "extended" => level = Some(Level::Extended),
                _ => {}
            }
        }
        level
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed,
    Skipped,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ScenarioResult {
    /// Feature file name, e.g. `key_lifecycle.feature`.
    pub feature: String,
    pub scenario: String,
    pub line: usize,
    pub level: Option<Level>,
    /// Contract rule ids (`R-KEY-4`, …) from the scenario's tags.
    pub rules: Vec<String>,
    pub tags: Vec<String>,
    pub status: Status,
    /// Passed only after at least one retry (`--retry`).
    pub flaky: bool,
    pub attempts: usize,
    pub duration_ms: u64,
    /// Why it was skipped, or the failing step and its error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// coderd requests made with the scenario's operator token (fake coderd only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coderd_calls: Option<BTreeMap<String, usize>>,
    /// Folder of the diagnostics bundle written for a failure, relative to the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<String>,
    /// Line (in the feature file) of the step the scenario failed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<usize>,
    /// The rules the failure is attributed to: those the failing step checks (its `# checks:`
    /// marker, see [`crate::attribution`]) and those named by the after-scenario checks' findings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_rules: Vec<String>,
}

impl ScenarioResult {
    /// Skipped because the scenario does not apply to this implementation (D-12).
    pub fn does_not_apply(&self) -> bool {
        self.status == Status::Skipped
            && self.reason.as_deref().is_some_and(|reason| {
                reason.starts_with(crate::report::not_applicable::DOES_NOT_APPLY)
            })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Implementation {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub contact: String,
    /// `reference`, `command` or `installed`.
    pub mode: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FeatureFile {
    pub path: String,
    pub sha256: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Suite {
    pub version: String,
    /// The git commit the suite was built from (`unknown` outside git).
    #[serde(default)]
    pub git_commit: String,
    /// Which feature files ran: `embedded` (built into the binary) or the `--features` folder.
    #[serde(default)]
    pub features_source: String,
    pub features: Vec<FeatureFile>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Environment {
    /// `local`, `kubeconfig`, …
    pub tier: String,
    /// `fake` or `real`.
    pub coderd: String,
    /// What the suite plays itself instead of the real thing (contract D-8), said plainly.
    pub simulated: Vec<String>,
}

/// A set of manifests the run applied (CRDs, RBAC, extra manifests), as it was applied.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ManifestSet {
    /// `embedded` (built into the suite), a folder, or `cluster` (found installed).
    pub source: String,
    /// sha256 over the `sha256  name` lines of `files`, sorted by name (`sha256sum` format).
    pub sha256: String,
    /// Each file (or, from the cluster, each object's spec) with its sha256.
    pub files: Vec<FeatureFile>,
}

/// Deadlines of the run's waits, after `--timeout-scale` and `--wait-timeout`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SetupTimeouts {
    pub eventually_ms: u64,
    pub hold_window_ms: u64,
    /// On a real cluster, how the observation window followed the operator's measured reactions
    /// (`hold_window_ms` is then its upper bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_window_measured: Option<String>,
    pub interval_ms: u64,
    pub reach_and_hold: u32,
    pub hold_observations: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_scale: Option<f64>,
}

/// How the run was set up: enough to repeat it, and to see any hand-made change.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Setup {
    /// `reference`, `command`, `installed` or `installed (config/manager)`.
    pub mode: String,
    /// The command the suite ran as the operator, secrets masked (none when installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_command: Option<String>,
    /// The RBAC the started operator ran under (none when installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbac: Option<ManifestSet>,
    /// The CRDs the run judged.
    pub crds: ManifestSet,
    /// `--extra-manifests`, applied before the operator started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_manifests: Option<ManifestSet>,
    /// `read-write`, or `read-only` when the operator's RBAC was stripped of write verbs on
    /// codercontrolplanes (`--control-plane-access read-only`).
    pub control_plane_access: String,
    pub tier: String,
    pub timeouts: SetupTimeouts,
    pub retries: usize,
    pub concurrency: usize,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
    /// Every skip, those that do not apply included.
    pub skipped: usize,
    pub flaky: usize,
    /// Skips because the scenario does not apply to the implementation (D-12): they neither
    /// prove nor deny conformance.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_applicable: usize,
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

impl Tally {
    /// Skips that deny a claim: the scenario applied, but nothing proved it.
    pub fn unproven(&self) -> usize {
        self.skipped - self.not_applicable
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub core: Tally,
    pub extended: Tally,
    /// Scenarios without a level tag (a suite defect, listed so it is not hidden).
    pub unlevelled: Tally,
    /// Core conformance: at least one Core scenario ran, and none failed or was skipped.
    pub core_conformant: bool,
    pub extended_conformant: bool,
}

/// What a run says of a rule, or of a rule in one scenario (see [`crate::attribution`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum RuleVerdict {
    /// Every scenario checking it passed (in one scenario: every step checking it passed).
    Passed,
    /// A scenario failed on a step that checks it.
    Failed,
    /// A scenario checking it failed or stopped before all its steps checking it ran, and none
    /// failed on one; or only some of its scenarios ran.
    NotReached,
    /// None of its scenarios ran (none selected, none started, or it has none).
    NotRun,
    /// The scenario does not apply to this implementation (D-12: it injects a fault on a route
    /// the implementation does not use): it says nothing of the rule, for or against.
    NotApplicable,
}

impl RuleVerdict {
    /// The rule's verdict from its scenarios' verdicts: failed if any failed, passed if all
    /// passed, not run if none ran (or there are none), not reached otherwise.
    pub fn combine(verdicts: impl IntoIterator<Item = RuleVerdict>) -> RuleVerdict {
        let (mut any, mut all_passed, mut all_not_run) = (false, true, true);
        for verdict in verdicts {
            if verdict == RuleVerdict::NotApplicable {
                continue;
            }
            if verdict == RuleVerdict::Failed {
                return RuleVerdict::Failed;
            }
            any = true;
            all_passed &= verdict == RuleVerdict::Passed;
            all_not_run &= verdict == RuleVerdict::NotRun;
        }
        match (any, all_passed, all_not_run) {
            (false, _, _) | (true, _, true) => RuleVerdict::NotRun,
            (true, true, _) => RuleVerdict::Passed,
            _ => RuleVerdict::NotReached,
        }
    }

    /// `passed`, `failed`, `not reached`, `not run`.
    pub fn label(self) -> &'static str {
        match self {
            RuleVerdict::Passed => "passed",
            RuleVerdict::Failed => "failed",
            RuleVerdict::NotReached => "not reached",
            RuleVerdict::NotRun => "not run",
            RuleVerdict::NotApplicable => "not applicable",
        }
    }
}

/// A scenario of the run that checks a rule, as the rule's coverage lists it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RuleScenario {
    pub feature: String,
    pub line: usize,
    pub status: Status,
    /// What the scenario says of this rule (absent in reports of suites before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<RuleVerdict>,
}

/// One rule of the suite's catalogue (`features/rules.tsv`) and how this run covered it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RuleCoverage {
    /// `R-KEY-4`, `D-3`, …
    pub rule: String,
    pub level: Level,
    /// Passed, failed, not reached or not run, from the scenarios' verdicts (absent in reports
    /// of suites before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<RuleVerdict>,
    /// This run's results of the scenarios tagged with the rule, and of any other whose
    /// failure is attributed to it (empty: none, or unobservable).
    pub scenarios: Vec<RuleScenario>,
    /// Seeded variants of the reference operator that break the rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeded_variants: Vec<String>,
    /// Why the rule cannot be observed from outside the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unobservable: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ConformanceReport {
    pub schema: String,
    pub implementation: Implementation,
    pub suite: Suite,
    pub environment: Environment,
    /// Absent in reports of suites before it existed; `verify-report` then says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<Setup>,
    /// Why the run was stopped before its end (e.g. the control-plane fixture was changed by
    /// someone else); such a report claims no conformance and does not verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
    pub started_at: String,
    pub duration_ms: u64,
    pub summary: Summary,
    pub results: Vec<ScenarioResult>,
    /// Per rule of the catalogue: level, scenario results, seeded variants, reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coverage: Vec<RuleCoverage>,
    /// sha256 over the JSON of this document with this field empty: editing a result without
    /// recomputing it is detected by `verify-report`.
    pub digest: String,
}

pub fn summarise(results: &[ScenarioResult]) -> Summary {
    let mut core = Tally::default();
    let mut extended = Tally::default();
    let mut unlevelled = Tally::default();
    for result in results {
        let tally = match result.level {
            Some(Level::Core) => &mut core,
            Some(Level::Extended) => &mut extended,
            None => &mut unlevelled,
        };
        match result.status {
            Status::Passed => tally.passed += 1,
            Status::Failed => tally.failed += 1,
            Status::Skipped => {
                tally.skipped += 1;
                tally.not_applicable += usize::from(result.does_not_apply());
            }
        }
        if result.flaky {
            tally.flaky += 1;
        }
    }
    let conformant = |t: &Tally| t.passed > 0 && t.failed == 0 && t.unproven() == 0;
    Summary {
        core_conformant: conformant(&core),
        extended_conformant: conformant(&core) && conformant(&extended),
        core,
        extended,
        unlevelled,
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl ConformanceReport {
    /// The summary of the results; no conformance claim for a stopped run.
    pub fn expected_summary(&self) -> Summary {
        let mut summary = summarise(&self.results);
        if self.aborted.is_some() {
            summary.core_conformant = false;
            summary.extended_conformant = false;
        }
        summary
    }

    /// The digest of the report's content (everything but the digest field).
    pub fn compute_digest(&self) -> anyhow::Result<String> {
        let mut unsigned = self.clone();
        unsigned.digest = String::new();
        Ok(sha256_hex(&serde_json::to_vec(&unsigned)?))
    }

    /// Fills in the summary and the digest.
    pub fn seal(mut self) -> anyhow::Result<Self> {
        self.summary = self.expected_summary();
        self.digest = self.compute_digest()?;
        Ok(self)
    }

    pub fn to_yaml(&self) -> anyhow::Result<String> {
        serde_saphyr::to_string(self).context("serialising the conformance report")
    }

    pub fn from_yaml(text: &str) -> anyhow::Result<Self> {
        serde_saphyr::from_str(text)
            .context("the file is not a conformance report (schema mismatch)")
    }
}

/// Claims a caller of `verify-report` requires beyond validity (CI requires its kind run's).
#[derive(Clone, Debug, Default)]
pub struct Requirements {
    pub tier: Option<String>,
    pub nothing_simulated: bool,
    pub core: bool,
}

/// What the report lacks of the required claims (empty = all met).
pub fn unmet_requirements(report: &ConformanceReport, required: &Requirements) -> Vec<String> {
    let mut unmet = Vec::new();
    if let Some(tier) = &required.tier
        && &report.environment.tier != tier
    {
        unmet.push(format!(
            "the run was on tier {:?}, not {tier:?}",
            report.environment.tier
        ));
    }
    if required.nothing_simulated && !report.environment.simulated.is_empty() {
        unmet.push(format!(
            "the suite simulated: {}",
            report.environment.simulated.join("; ")
        ));
    }
    if required.core && !report.summary.core_conformant {
        unmet.push("no Core conformance claim".to_owned());
    }
    unmet
}

/// Checks a report against the suite's own feature files (`path → sha256`); returns the list
/// of problems (empty = valid).
pub fn verify(
    report: &ConformanceReport,
    suite_features: &[FeatureFile],
) -> anyhow::Result<Vec<String>> {
    if report.schema != SCHEMA {
        bail!(
            "unknown report schema {:?} (expected {SCHEMA})",
            report.schema
        );
    }
    let mut problems = Vec::new();
    match report.compute_digest() {
        Ok(digest) if digest == report.digest => {}
        Ok(_) => problems.push(
            "the digest does not match the content: the report was edited after the run".to_owned(),
        ),
        Err(error) => problems.push(format!("cannot compute the digest: {error:#}")),
    }
    let reported: BTreeMap<&str, &str> = report
        .suite
        .features
        .iter()
        .map(|f| (f.path.as_str(), f.sha256.as_str()))
        .collect();
    let ours: BTreeMap<&str, &str> = suite_features
        .iter()
        .map(|f| (f.path.as_str(), f.sha256.as_str()))
        .collect();
    for (path, hash) in &ours {
        match reported.get(path) {
            None => problems.push(format!(
                "feature {path} of this suite is missing from the report"
            )),
            Some(theirs) if theirs != hash => problems.push(format!(
                "feature {path} differs from this suite's (sha256 {theirs} ≠ {hash})"
            )),
            Some(_) => {}
        }
    }
    for path in reported.keys().filter(|p| !ours.contains_key(*p)) {
        problems.push(format!(
            "feature {path} in the report is not part of this suite"
        ));
    }
    if let Some(reason) = &report.aborted {
        problems.push(format!("the run was stopped before its end: {reason}"));
    }
    let summary = report.expected_summary();
    if summary != report.summary {
        problems.push("the summary does not match the listed results".to_owned());
    }
    for result in &report.results {
        if result.status == Status::Skipped && result.reason.as_deref().is_none_or(str::is_empty) {
            problems.push(format!(
                "{} ({}) is skipped without a reason",
                result.scenario, result.feature
            ));
        }
    }
    let statuses: BTreeMap<(&str, usize), Status> = report
        .results
        .iter()
        .map(|r| ((r.feature.as_str(), r.line), r.status))
        .collect();
    for rule in &report.coverage {
        for scenario in &rule.scenarios {
            match statuses.get(&(scenario.feature.as_str(), scenario.line)) {
                Some(status) if *status == scenario.status => {}
                _ => problems.push(format!(
                    "the coverage of {} lists {}:{} as {:?}, which the results do not",
                    rule.rule, scenario.feature, scenario.line, scenario.status
                )),
            }
        }
    }
    problems.extend(verdict_problems(report));
    problems.extend(setup_problems(report));
    if report.summary.core_conformant && (summary.core.failed > 0 || summary.core.unproven() > 0) {
        problems.push(
            "claims Core conformance although a Core scenario failed or was skipped".to_owned(),
        );
    }
    Ok(problems)
}

/// Whether a scenario's verdict on `rule` agrees with its result: a pass passes every rule, a
/// scenario that never started runs none, a stopped one reaches none, and a failure fails
/// exactly the rules it is attributed to (the others passed before it or were not reached).
fn verdict_agrees(result: &ScenarioResult, rule: &str, verdict: RuleVerdict) -> bool {
    match result.status {
        Status::Passed => verdict == RuleVerdict::Passed,
        Status::Skipped if result.does_not_apply() => verdict == RuleVerdict::NotApplicable,
        Status::Skipped if result.attempts == 0 => verdict == RuleVerdict::NotRun,
        Status::Skipped => verdict == RuleVerdict::NotReached,
        Status::Failed if result.failed_rules.iter().any(|r| r == rule) => {
            verdict == RuleVerdict::Failed
        }
        Status::Failed => matches!(verdict, RuleVerdict::Passed | RuleVerdict::NotReached),
    }
}

/// The rule verdicts against the results (the checks that need no feature file; `verify-report`
/// also recomputes them from the features, see [`crate::coverage::verdict_problems`]).
fn verdict_problems(report: &ConformanceReport) -> Vec<String> {
    let mut problems = Vec::new();
    if report.coverage.iter().all(|r| r.verdict.is_none()) {
        return problems;
    }
    let results: BTreeMap<(&str, usize), &ScenarioResult> = report
        .results
        .iter()
        .map(|r| ((r.feature.as_str(), r.line), r))
        .collect();
    for rule in &report.coverage {
        let mut verdicts = Vec::new();
        for scenario in &rule.scenarios {
            let Some(verdict) = scenario.verdict else {
                problems.push(format!(
                    "the coverage of {} lists {}:{} without its verdict",
                    rule.rule, scenario.feature, scenario.line
                ));
                continue;
            };
            verdicts.push(verdict);
            if let Some(result) = results.get(&(scenario.feature.as_str(), scenario.line))
                && !verdict_agrees(result, &rule.rule, verdict)
            {
                problems.push(format!(
                    "the coverage of {} says {}:{} {}, which its result does not",
                    rule.rule,
                    scenario.feature,
                    scenario.line,
                    verdict.label()
                ));
            }
        }
        let expected = RuleVerdict::combine(verdicts);
        if rule.verdict != Some(expected) {
            problems.push(format!(
                "{} is {}, but its scenarios say {}",
                rule.rule,
                rule.verdict.map_or("without a verdict", RuleVerdict::label),
                expected.label()
            ));
        }
    }
    let listed: BTreeMap<&str, &RuleCoverage> = report
        .coverage
        .iter()
        .map(|r| (r.rule.as_str(), r))
        .collect();
    for result in &report.results {
        for rule in &result.failed_rules {
            // A rule outside the catalogue has no coverage entry to say it.
            let unsaid = listed.get(rule.as_str()).is_some_and(|coverage| {
                !coverage.scenarios.iter().any(|s| {
                    s.feature == result.feature
                        && s.line == result.line
                        && s.verdict == Some(RuleVerdict::Failed)
                })
            });
            if unsaid {
                problems.push(format!(
                    "{}:{} failed on {rule}, which the coverage does not say",
                    result.feature, result.line
                ));
            }
        }
    }
    problems
}

/// sha256 over `sha256  name` lines, sorted by name: the digest of a [`ManifestSet`].
pub fn files_digest(files: &[FeatureFile]) -> String {
    let mut sorted: Vec<&FeatureFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let listing: String = sorted
        .iter()
        .map(|f| format!("{}  {}\n", f.sha256, f.path))
        .collect();
    sha256_hex(listing.as_bytes())
}

/// What a report must say about its setup and the suite that made it.
fn setup_problems(report: &ConformanceReport) -> Vec<String> {
    let mut problems = Vec::new();
    let mut require = |present: bool, field: &str| {
        if !present {
            problems.push(format!("the report does not record {field}"));
        }
    };
    require(!report.suite.git_commit.is_empty(), "suite.git_commit");
    require(
        !report.suite.features_source.is_empty(),
        "suite.features_source",
    );
    let Some(setup) = &report.setup else {
        require(false, "its setup (setup:)");
        return problems;
    };
    require(!setup.mode.is_empty(), "setup.mode");
    require(!setup.tier.is_empty(), "setup.tier");
    require(
        !setup.control_plane_access.is_empty(),
        "setup.control_plane_access",
    );
    require(setup.timeouts.eventually_ms > 0, "setup.timeouts");
    require(setup.concurrency > 0, "setup.concurrency");
    let started = matches!(setup.mode.as_str(), "reference" | "command");
    require(
        !started || setup.operator_command.is_some(),
        "setup.operator_command",
    );
    require(!started || setup.rbac.is_some(), "setup.rbac");
    let mut mismatched = Vec::new();
    let sets = [
        Some(("crds", &setup.crds)),
        setup.rbac.as_ref().map(|r| ("rbac", r)),
    ]
    .into_iter()
    .chain([setup
        .extra_manifests
        .as_ref()
        .map(|e| ("extra_manifests", e))])
    .flatten();
    for (name, set) in sets {
        require(!set.source.is_empty(), &format!("setup.{name}.source"));
        if set.sha256 != files_digest(&set.files) {
            mismatched.push(format!(
                "setup.{name}.sha256 does not match its files' digests"
            ));
        }
    }
    problems.extend(mismatched);
    problems
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rstest::rstest;

    pub(crate) fn result(level: Option<Level>, status: Status) -> ScenarioResult {
        ScenarioResult {
            feature: "a.feature".into(),
            scenario: "s".into(),
            line: 3,
            level,
            rules: vec!["R-KEY-4".into()],
            tags: vec!["core".into()],
            status,
            flaky: false,
            attempts: 1,
            duration_ms: 1200,
            reason: (status == Status::Skipped).then(|| "needs fault injection".into()),
            coderd_calls: None,
            diagnostics: None,
            failed_step: (status == Status::Failed).then_some(5),
            failed_rules: if status == Status::Failed {
                vec!["R-KEY-4".into()]
            } else {
                vec![]
            },
        }
    }

    /// What a result built by [`result`] says of its rule.
    fn verdict_of(result: &ScenarioResult) -> RuleVerdict {
        match result.status {
            Status::Passed => RuleVerdict::Passed,
            Status::Failed => RuleVerdict::Failed,
            Status::Skipped if result.attempts == 0 => RuleVerdict::NotRun,
            Status::Skipped => RuleVerdict::NotReached,
        }
    }

    #[test]
    fn required_claims_are_checked_one_by_one() {
        let mut report = report(vec![]);
        report.summary.core_conformant = true;
        let all = Requirements {
            tier: Some("kind".into()),
            nothing_simulated: true,
            core: true,
        };
        assert_eq!(
            unmet_requirements(&report, &all),
            vec![r#"the run was on tier "local", not "kind""#.to_owned()]
        );
        report.environment.tier = "kind".into();
        assert!(unmet_requirements(&report, &all).is_empty());
        report.environment.simulated = vec!["Deployment readiness".into()];
        report.summary.core_conformant = false;
        assert_eq!(
            unmet_requirements(&report, &all),
            vec![
                "the suite simulated: Deployment readiness".to_owned(),
                "no Core conformance claim".to_owned()
            ]
        );
        assert!(unmet_requirements(&report, &Requirements::default()).is_empty());
    }

    /// A sealed report of `results` (summary and digest computed).
    pub(crate) fn report(results: Vec<ScenarioResult>) -> ConformanceReport {
        ConformanceReport {
            schema: SCHEMA.into(),
            implementation: Implementation {
                name: "ref".into(),
                version: "0.1.0".into(),
                mode: "reference".into(),
                ..Default::default()
            },
            suite: Suite {
                version: "0.1.0".into(),
                git_commit: "unknown".into(),
                features_source: "embedded".into(),
                features: features(),
            },
            environment: Environment {
                tier: "local".into(),
                coderd: "fake".into(),
                simulated: vec![],
            },
            setup: Some(setup()),
            aborted: None,
            started_at: "2026-11-29T19:00:00Z".into(),
            duration_ms: 5000,
            summary: summarise(&[]),
            coverage: vec![RuleCoverage {
                rule: "R-KEY-4".into(),
                level: Level::Core,
                verdict: Some(RuleVerdict::combine(results.iter().map(verdict_of))),
                scenarios: results
                    .iter()
                    .map(|r| RuleScenario {
                        feature: r.feature.clone(),
                        line: r.line,
                        status: r.status,
                        verdict: Some(verdict_of(r)),
                    })
                    .collect(),
                seeded_variants: vec!["key-rotated-on-restart".into()],
                unobservable: None,
            }],
            results,
            digest: String::new(),
        }
        .seal()
        .unwrap()
    }

    fn setup() -> Setup {
        let files = features();
        let set = ManifestSet {
            source: "embedded".into(),
            sha256: files_digest(&files),
            files,
        };
        Setup {
            mode: "reference".into(),
            operator_command: Some("coder-provisioner-operator run".into()),
            rbac: Some(set.clone()),
            crds: set,
            extra_manifests: None,
            control_plane_access: "read-write".into(),
            tier: "local".into(),
            timeouts: SetupTimeouts {
                eventually_ms: 30_000,
                hold_window_ms: 8_000,
                hold_window_measured: None,
                interval_ms: 200,
                reach_and_hold: 2,
                hold_observations: 3,
                timeout_scale: None,
            },
            retries: 0,
            concurrency: 2,
        }
    }

    #[rstest]
    #[case::no_setup(|r: &mut ConformanceReport| r.setup = None, "its setup")]
    #[case::no_commit(|r: &mut ConformanceReport| r.suite.git_commit.clear(), "suite.git_commit")]
    #[case::no_feature_source(|r: &mut ConformanceReport| r.suite.features_source.clear(), "suite.features_source")]
    #[case::no_command(|r: &mut ConformanceReport| r.setup.as_mut().unwrap().operator_command = None, "setup.operator_command")]
    #[case::no_rbac(|r: &mut ConformanceReport| r.setup.as_mut().unwrap().rbac = None, "setup.rbac")]
    #[case::no_tier(|r: &mut ConformanceReport| r.setup.as_mut().unwrap().tier.clear(), "setup.tier")]
    #[case::no_timeouts(|r: &mut ConformanceReport| r.setup.as_mut().unwrap().timeouts.eventually_ms = 0, "setup.timeouts")]
    #[case::crd_digest(|r: &mut ConformanceReport| r.setup.as_mut().unwrap().crds.files[0].sha256 = "0".into(), "setup.crds.sha256")]
    fn verify_requires_the_setup(#[case] edit: fn(&mut ConformanceReport), #[case] problem: &str) {
        let mut edited = report(vec![result(Some(Level::Core), Status::Passed)]);
        edit(&mut edited);
        let problems = verify(&edited.seal().unwrap(), &features()).unwrap();
        assert!(problems.iter().any(|p| p.contains(problem)), "{problems:?}");
    }

    #[test]
    fn a_stopped_run_claims_nothing_and_does_not_verify() {
        let mut stopped = report(vec![result(Some(Level::Core), Status::Passed)]);
        stopped.aborted = Some("fixture changed".into());
        let stopped = stopped.seal().unwrap();
        assert!(!stopped.summary.core_conformant);
        let problems = verify(&stopped, &features()).unwrap();
        assert_eq!(
            problems,
            ["the run was stopped before its end: fixture changed"]
        );
    }

    #[test]
    fn an_installed_operator_needs_no_command_or_rbac() {
        let mut installed = report(vec![result(Some(Level::Core), Status::Passed)]);
        let setup = installed.setup.as_mut().unwrap();
        setup.mode = "installed".into();
        setup.operator_command = None;
        setup.rbac = None;
        let problems = verify(&installed.seal().unwrap(), &features()).unwrap();
        assert_eq!(problems, Vec::<String>::new());
    }

    fn features() -> Vec<FeatureFile> {
        vec![FeatureFile {
            path: "a.feature".into(),
            sha256: sha256_hex(b"Feature: a"),
        }]
    }

    /// Skipped as not applying to the implementation (D-12).
    fn not_applying(level: Level) -> ScenarioResult {
        ScenarioResult {
            reason: Some(format!(
                "{}it lists keys (D-12)",
                crate::report::not_applicable::DOES_NOT_APPLY
            )),
            ..result(Some(level), Status::Skipped)
        }
    }

    #[test]
    fn a_scenario_that_does_not_apply_neither_proves_nor_denies_a_rule() {
        use RuleVerdict::*;
        assert_eq!(RuleVerdict::combine([Passed, NotApplicable]), Passed);
        assert_eq!(RuleVerdict::combine([NotApplicable]), NotRun);
        assert_eq!(RuleVerdict::combine([Failed, NotApplicable]), Failed);
        let summary = summarise(&[
            result(Some(Level::Core), Status::Passed),
            not_applying(Level::Extended),
            result(Some(Level::Extended), Status::Passed),
        ]);
        assert!(summary.extended_conformant);
        assert_eq!((summary.extended.skipped, summary.extended.not_applicable), (1, 1));
    }

    #[rstest]
    #[case(vec![result(Some(Level::Core), Status::Passed)], true)]
    #[case(vec![result(Some(Level::Core), Status::Passed), result(Some(Level::Core), Status::Skipped)], false)]
    #[case(vec![result(Some(Level::Core), Status::Failed)], false)]
    #[case(vec![result(Some(Level::Extended), Status::Passed)], false)]
    #[case(vec![result(Some(Level::Core), Status::Passed), not_applying(Level::Core)], true)]
    fn core_conformance_means_no_core_failure_or_skip(
        #[case] results: Vec<ScenarioResult>,
        #[case] conformant: bool,
    ) {
        assert_eq!(summarise(&results).core_conformant, conformant);
    }

    #[test]
    fn a_sealed_report_verifies_after_a_yaml_round_trip() {
        let sealed = report(vec![result(Some(Level::Core), Status::Passed)]);
        let reparsed = ConformanceReport::from_yaml(&sealed.to_yaml().unwrap()).unwrap();
        assert_eq!(
            verify(&reparsed, &features()).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn an_edited_result_is_detected() {
        let sealed = report(vec![result(Some(Level::Core), Status::Failed)]);
        let edited = sealed
            .to_yaml()
            .unwrap()
            .replace("status: failed", "status: passed");
        let problems =
            verify(&ConformanceReport::from_yaml(&edited).unwrap(), &features()).unwrap();
        assert!(
            problems.iter().any(|p| p.contains("digest")),
            "{problems:?}"
        );
    }

    #[test]
    fn an_edited_coverage_is_detected() {
        let sealed = report(vec![result(Some(Level::Core), Status::Failed)]);
        let yaml = sealed.to_yaml().unwrap();
        assert!(yaml.contains("coverage:"), "{yaml}");
        let mut edited = ConformanceReport::from_yaml(&yaml).unwrap();
        edited.coverage[0].scenarios[0].status = Status::Passed;
        let problems = verify(&edited, &features()).unwrap();
        assert!(
            problems.iter().any(|p| p.contains("digest")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("coverage of R-KEY-4")),
            "{problems:?}"
        );
    }

    #[rstest]
    #[case::rule_verdict(|r: &mut ConformanceReport| r.coverage[0].verdict = Some(RuleVerdict::Passed), "R-KEY-4 is passed, but its scenarios say failed")]
    #[case::scenario_verdict(|r: &mut ConformanceReport| r.coverage[0].scenarios[0].verdict = Some(RuleVerdict::NotReached), "says a.feature:3 not reached, which its result does not")]
    #[case::blame_dropped(|r: &mut ConformanceReport| r.results[0].failed_rules.clear(), "says a.feature:3 failed, which its result does not")]
    #[case::blame_unsaid(|r: &mut ConformanceReport| r.coverage[0].scenarios.clear(), "a.feature:3 failed on R-KEY-4, which the coverage does not say")]
    #[case::verdict_missing(|r: &mut ConformanceReport| r.coverage[0].scenarios[0].verdict = None, "lists a.feature:3 without its verdict")]
    fn verdicts_that_do_not_follow_from_the_results_are_detected(
        #[case] edit: fn(&mut ConformanceReport),
        #[case] problem: &str,
    ) {
        let mut edited = report(vec![result(Some(Level::Core), Status::Failed)]);
        assert_eq!(edited.coverage[0].verdict, Some(RuleVerdict::Failed));
        edit(&mut edited);
        let problems = verify(&edited.seal().unwrap(), &features()).unwrap();
        assert!(problems.iter().any(|p| p.contains(problem)), "{problems:?}");
    }

    #[test]
    fn verdicts_and_blame_survive_a_yaml_round_trip() {
        let sealed = report(vec![
            result(Some(Level::Core), Status::Failed),
            ScenarioResult {
                line: 9,
                ..result(Some(Level::Core), Status::Passed)
            },
        ]);
        let yaml = sealed.to_yaml().unwrap();
        for text in [
            "failed_step: 5",
            "failed_rules:\n  - R-KEY-4",
            "verdict: failed",
            "verdict: passed",
        ] {
            assert!(yaml.contains(text), "{text:?} in {yaml}");
        }
        let reparsed = ConformanceReport::from_yaml(&yaml).unwrap();
        assert_eq!(reparsed, sealed);
        assert_eq!(
            verify(&reparsed, &features()).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_report_from_before_verdicts_still_verifies() {
        let mut old = report(vec![result(Some(Level::Core), Status::Failed)]);
        old.coverage[0].verdict = None;
        old.coverage[0].scenarios[0].verdict = None;
        old.results[0].failed_step = None;
        old.results[0].failed_rules.clear();
        let yaml = old.seal().unwrap().to_yaml().unwrap();
        for absent in ["verdict", "failed_step", "failed_rules"] {
            assert!(!yaml.contains(absent), "{absent} in {yaml}");
        }
        let reparsed = ConformanceReport::from_yaml(&yaml).unwrap();
        assert_eq!(
            verify(&reparsed, &features()).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_report_without_coverage_still_verifies() {
        let mut sealed = report(vec![result(Some(Level::Core), Status::Passed)]);
        sealed.coverage.clear();
        let sealed = sealed.seal().unwrap();
        let yaml = sealed.to_yaml().unwrap();
        assert!(!yaml.contains("coverage:"), "{yaml}");
        let reparsed = ConformanceReport::from_yaml(&yaml).unwrap();
        assert_eq!(
            verify(&reparsed, &features()).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_changed_feature_file_is_detected() {
        let sealed = report(vec![result(Some(Level::Core), Status::Passed)]);
        let ours = vec![FeatureFile {
            path: "a.feature".into(),
            sha256: sha256_hex(b"Feature: changed"),
        }];
        let problems = verify(&sealed, &ours).unwrap();
        assert!(
            problems.iter().any(|p| p.contains("differs")),
            "{problems:?}"
        );
    }

    #[rstest]
    #[case(&["R-KEY-4", "core"], Some(Level::Core))]
    #[case(&["extended"], Some(Level::Extended))]
    #[case(&["serial"], None)]
    fn levels_come_from_tags(#[case] tags: &[&str], #[case] level: Option<Level>) {
        let tags: Vec<String> = tags.iter().map(|t| (*t).to_owned()).collect();
        assert_eq!(Level::from_tags(&tags), level);
    }
}
