//! Rule attribution: which rules each step of a scenario checks, so that a failure is blamed on
//! the rules of the step it happened in, never on every rule the scenario happens to carry.
//!
//! A step's rules come from a Gherkin comment directly above it (cucumber ignores comments; this
//! module reads the feature text itself):
//!
//! ```gherkin
//!   @R-RL-1 @R-RL-4 @core
//!   Scenario: …
//!     When coderd answers the next key request with 429
//!     # checks: R-RL-1
//!     Then the provisioner has condition "ProvisionerKeyReady" "False" with reason "RateLimited"
//!     # checks: R-RL-4
//!     And coderd saw exactly 1 POST on "provisionerkey"
//! ```
//!
//! A step without a marker checks every rule of its scenario when it is a `Then` step (an `And`
//! or `But` after a `Then` is one), and nothing when it is a `Given` or `When` step or a
//! `Background` step: a failure while setting up leaves the scenario's rules *not reached*,
//! not failed. The same holds in a scenario with one rule.
//!
//! Per scenario and rule, a run says ([`RuleVerdict`]): passed when the scenario passed, or when
//! it failed after every step checking the rule had passed; failed when it failed on a step
//! that checks the rule (or the after-scenario checks named the rule: a secret leak is R-SEC-14);
//! not reached when it failed or stopped before that; not run when it never started. A rule's
//! verdict combines its scenarios' ([`RuleVerdict::combine`]).
//!
//! [`Attribution::problems`] is the lint: every marker names rules of its scenario's tags and
//! sits directly above one of its steps, every rule of a scenario is checked by some step, and a
//! scenario with several rules says with at least one marker which step checks which.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context as _;
use cucumber::gherkin;

use crate::features::feature_file;
use crate::report::model::{RuleVerdict, ScenarioResult, Status};
use crate::rule_ids::{rule_tags, rules_named_in, step_failure};

/// Opens a marker comment: `# checks: R-RL-4, D-5`.
pub const MARKER: &str = "checks:";
/// The marker's list for a step that checks no rule (`# checks: none`): a precondition.
pub const NONE: &str = "none";

/// One step of a scenario (its background's first) and what it checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepChecks {
    pub line: usize,
    /// A `Then` step (or an `And`/`But` after one).
    pub then: bool,
    /// A step of the feature's (or rule's) `Background`.
    pub background: bool,
    /// The rules of its `# checks:` marker, if it has one.
    pub marker: Option<Vec<String>>,
}

impl StepChecks {
    /// The rules this step checks in a scenario with `rules`.
    pub fn checks(&self, rules: &[String]) -> Vec<String> {
        match (&self.marker, self.background, self.then) {
            (_, true, _) => Vec::new(),
            (Some(marked), false, _) => marked.clone(),
            (None, false, true) => rules.to_vec(),
            (None, false, false) => Vec::new(),
        }
    }
}

/// A scenario as written (an outline once), with its steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioSteps {
    pub feature: String,
    pub line: usize,
    pub name: String,
    /// Its rule ids, from every tag cucumber evaluates for it.
    pub rules: Vec<String>,
    pub steps: Vec<StepChecks>,
}

impl ScenarioSteps {
    fn label(&self) -> String {
        format!("{}:{} \"{}\"", self.feature, self.line, self.name)
    }

    /// The step at `line`, if it is one of this scenario's.
    fn step(&self, line: usize) -> Option<&StepChecks> {
        self.steps.iter().find(|s| s.line == line)
    }
}

/// What each step of each scenario checks, for a set of feature files.
#[derive(Clone, Debug, Default)]
pub struct Attribution {
    scenarios: Vec<ScenarioSteps>,
    /// `(feature file, line)` as the report keys results (one per Examples row of an outline)
    /// → index in `scenarios`.
    keys: BTreeMap<(String, usize), usize>,
    /// What is wrong with the markers, found while reading them.
    marker_problems: Vec<String>,
    /// The scenarios cucumber runs, keyed as results are (an outline's rows, not the outline).
    runnable: Vec<(String, usize)>,
}

impl Attribution {
    /// From parsed feature files (with their path set) and their text, by file name.
    pub fn new(features: &[gherkin::Feature], texts: &BTreeMap<String, String>) -> Self {
        let mut attribution = Attribution::default();
        for feature in features {
            let file = feature_file(feature);
            let mut markers = match texts.get(&file) {
                Some(text) => {
                    let (markers, problems) = parse_markers(text);
                    attribution
                        .marker_problems
                        .extend(problems.into_iter().map(|p| format!("{file}:{p}")));
                    markers
                }
                None => BTreeMap::new(),
            };
            let mut background = |steps: &[gherkin::Step]| -> Vec<StepChecks> {
                steps
                    .iter()
                    .map(|step| {
                        let line = step.position.line;
                        if let Some((at, _)) = markers.remove(&line) {
                            attribution.marker_problems.push(format!(
                                "{file}:{at}: a Background step checks nothing; move the marker to a scenario's step"
                            ));
                        }
                        StepChecks {
                            line,
                            then: step.ty == gherkin::StepType::Then,
                            background: true,
                            marker: None,
                        }
                    })
                    .collect()
            };
            let feature_background = feature
                .background
                .as_ref()
                .map(|b| background(&b.steps))
                .unwrap_or_default();
            let mut in_rules = Vec::new();
            for rule in &feature.rules {
                let rule_background = rule
                    .background
                    .as_ref()
                    .map(|b| background(&b.steps))
                    .unwrap_or_default();
                in_rules.push((rule, rule_background));
            }
            let all = feature.scenarios.iter().map(|s| (None, s, &[][..])).chain(
                in_rules.iter().flat_map(|(rule, rule_background)| {
                    rule.scenarios
                        .iter()
                        .map(move |s| (Some(*rule), s, rule_background.as_slice()))
                }),
            );
            for (rule, scenario, rule_background) in all {
                let tags = crate::features::all_tags(feature, rule, scenario);
                let mut steps: Vec<StepChecks> = feature_background.clone();
                steps.extend_from_slice(rule_background);
                steps.extend(scenario.steps.iter().map(|step| StepChecks {
                    line: step.position.line,
                    then: step.ty == gherkin::StepType::Then,
                    background: false,
                    marker: markers.remove(&step.position.line).map(|(_, rules)| rules),
                }));
                let index = attribution.scenarios.len();
                attribution.scenarios.push(ScenarioSteps {
                    feature: file.clone(),
                    line: scenario.position.line,
                    name: scenario.name.clone(),
                    rules: rule_tags(&tags),
                    steps,
                });
                attribution
                    .keys
                    .insert((file.clone(), scenario.position.line), index);
                if scenario.examples.is_empty() {
                    attribution
                        .runnable
                        .push((file.clone(), scenario.position.line));
                }
                // cucumber keys an Examples row by the `Examples:` line + 2 + its index.
                for examples in &scenario.examples {
                    let rows = examples.table.as_ref().map_or(0, |t| t.rows.len());
                    for id in 0..rows.saturating_sub(1) {
                        let key = (file.clone(), examples.position.line + id + 2);
                        attribution.runnable.push(key.clone());
                        attribution.keys.insert(key, index);
                    }
                }
            }
            for (at, _) in markers.into_values() {
                attribution.marker_problems.push(format!(
                    "{file}:{at}: a `# {MARKER}` marker must be directly above a step"
                ));
            }
        }
        attribution
    }

    /// The feature files of a folder.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let features = crate::features::parse_features(dir)?;
        let mut texts = BTreeMap::new();
        for feature in &features {
            if let Some(path) = &feature.path {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                texts.insert(feature_file(feature), text);
            }
        }
        Ok(Self::new(&features, &texts))
    }

    /// The feature files built into the binary.
    pub fn embedded() -> anyhow::Result<Self> {
        let mut features = Vec::new();
        let mut texts = BTreeMap::new();
        for (name, bytes) in crate::assets::folder(crate::assets::FEATURES_DIR) {
            if !name.ends_with(".feature") {
                continue;
            }
            let text =
                std::str::from_utf8(bytes).with_context(|| format!("{name} is not UTF-8"))?;
            let mut feature = gherkin::Feature::parse(text, gherkin::GherkinEnv::default())
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            feature.path = Some(name.into());
            texts.insert(name.to_owned(), text.to_owned());
            features.push(feature);
        }
        Ok(Self::new(&features, &texts))
    }

    /// Every scenario cucumber runs, as the report keys results: `(feature file, line)`, one per
    /// Examples row of an outline.
    pub fn scenario_keys(&self) -> impl Iterator<Item = &(String, usize)> {
        self.runnable.iter()
    }

    pub fn scenarios(&self) -> &[ScenarioSteps] {
        &self.scenarios
    }

    /// The scenario a result is about.
    pub fn scenario(&self, result: &ScenarioResult) -> Option<&ScenarioSteps> {
        self.keys
            .get(&(result.feature.clone(), result.line))
            .map(|&i| &self.scenarios[i])
    }

    /// The rules the failing step of `result` checks (none when it did not fail on a step).
    /// A step that checks several rules may name in its message, in parentheses, the ones its
    /// failure is about (a table row's rule): then only those.
    pub fn failing_step_checks(&self, result: &ScenarioResult) -> Vec<String> {
        let checks = match (result.status, result.failed_step, self.scenario(result)) {
            (Status::Failed, Some(line), Some(scenario)) => scenario
                .step(line)
                .map(|step| step.checks(&result.rules))
                .unwrap_or_default(),
            _ => return Vec::new(),
        };
        // Only the step's own message narrows: the after-hook's findings are blamed apart.
        let named = rules_named_in(step_failure(result.reason.as_deref().unwrap_or_default()));
        let narrowed: Vec<String> = checks
            .iter()
            .filter(|rule| named.contains(rule))
            .cloned()
            .collect();
        if narrowed.is_empty() {
            checks
        } else {
            narrowed
        }
    }

    /// Adds to each failed result's `failed_rules` the rules its failing step checks.
    pub fn blame(&self, results: &mut [ScenarioResult]) {
        for result in results.iter_mut() {
            for rule in self.failing_step_checks(result) {
                if !result.failed_rules.contains(&rule) {
                    result.failed_rules.push(rule);
                }
            }
        }
    }

    /// What `result` says of `rule` (see the module's documentation).
    pub fn verdict(&self, result: &ScenarioResult, rule: &str) -> RuleVerdict {
        match result.status {
            Status::Passed => RuleVerdict::Passed,
            Status::Skipped if result.does_not_apply() => RuleVerdict::NotApplicable,
            Status::Skipped if result.attempts == 0 => RuleVerdict::NotRun,
            Status::Skipped => RuleVerdict::NotReached,
            Status::Failed if result.failed_rules.iter().any(|r| r == rule) => RuleVerdict::Failed,
            Status::Failed => match result.failed_step {
                // Every step ran and passed; the after-scenario checks found something else.
                None if !result.failed_rules.is_empty() => RuleVerdict::Passed,
                // A hook failed before the steps, or for no rule: nothing to credit.
                None => RuleVerdict::NotReached,
                Some(failed_at) => {
                    let checking: Vec<usize> = self
                        .scenario(result)
                        .map(|scenario| {
                            scenario
                                .steps
                                .iter()
                                .filter(|s| s.checks(&result.rules).iter().any(|r| r == rule))
                                .map(|s| s.line)
                                .collect()
                        })
                        .unwrap_or_default();
                    // A step that checks every row and names the rules of the rows that failed
                    // (its blame narrowed) held for its other rules.
                    let held_at_failure = {
                        let checks = self.failing_step_checks(result);
                        !checks.is_empty()
                            && !checks.iter().any(|r| r == rule)
                            && self
                                .scenario(result)
                                .and_then(|s| s.step(failed_at))
                                .is_some_and(|s| s.checks(&result.rules).iter().any(|r| r == rule))
                    };
                    let held =
                        |line: usize| line < failed_at || (line == failed_at && held_at_failure);
                    if !checking.is_empty() && checking.iter().all(|&line| held(line)) {
                        RuleVerdict::Passed
                    } else {
                        RuleVerdict::NotReached
                    }
                }
            },
        }
    }

    /// The lint: misplaced or malformed markers, markers naming a rule their scenario does not
    /// carry, rules no step checks, and scenarios with several rules and no marker.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.marker_problems.clone();
        for scenario in &self.scenarios {
            let label = scenario.label();
            let mut checked = BTreeSet::new();
            for step in &scenario.steps {
                if let Some(marked) = &step.marker {
                    for rule in marked.iter().filter(|r| !scenario.rules.contains(r)) {
                        problems.push(format!(
                            "{}:{}: the marker names {rule}, which is not a tag of {label}",
                            scenario.feature, step.line
                        ));
                    }
                }
                checked.extend(step.checks(&scenario.rules));
            }
            let unchecked: Vec<&str> = scenario
                .rules
                .iter()
                .filter(|r| !checked.contains(*r))
                .map(String::as_str)
                .collect();
            if !unchecked.is_empty() {
                problems.push(format!(
                    "{label}: no step checks {} (mark a step `# {MARKER} …`)",
                    unchecked.join(", ")
                ));
            }
            if scenario.rules.len() > 1 && scenario.steps.iter().all(|s| s.marker.is_none()) {
                problems.push(format!(
                    "{label} has {} rules and no `# {MARKER}` marker saying which step checks which",
                    scenario.rules.len()
                ));
            }
        }
        problems
    }
}

/// Step line → (the marker's first line, the rules it names).
pub type Markers = BTreeMap<usize, (usize, Vec<String>)>;

/// The `# checks: …` markers of a feature file: step line → (marker's first line, rules), and
/// the problems found
/// (`line: message`). Several marker lines above one step add up; other comments between a
/// marker and its step are allowed, a blank line is not.
pub fn parse_markers(text: &str) -> (Markers, Vec<String>) {
    let mut markers = BTreeMap::new();
    let mut problems = Vec::new();
    let mut pending: Option<(usize, Vec<String>)> = None;
    let mut docstring: Option<&str> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if let Some(fence) = docstring {
            if trimmed.starts_with(fence) {
                docstring = None;
            }
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            let Some(list) = comment.trim_start().strip_prefix(MARKER) else {
                continue;
            };
            // `none`: a Then step that checks no rule of its scenario (a precondition).
            let none = list.trim() == NONE;
            let ids: Vec<String> = list
                .split([',', ' ', '\t'])
                .map(|id| id.trim().trim_start_matches('@'))
                .filter(|id| !id.is_empty() && !none)
                .map(str::to_owned)
                .collect();
            for id in ids.iter().filter(|id| !crate::rule_ids::is_rule_id(id)) {
                problems.push(format!("{line}: {id:?} in a marker is not a rule id"));
            }
            if ids.is_empty() && !none {
                problems.push(format!(
                    "{line}: the marker names no rule (`# {MARKER} {NONE}` for a step that checks none)"
                ));
            }
            pending.get_or_insert((line, Vec::new())).1.extend(ids);
            continue;
        }
        if trimmed.is_empty() {
            if let Some((at, _)) = pending.take() {
                problems.push(format!(
                    "{at}: a `# {MARKER}` marker must be directly above a step"
                ));
            }
            continue;
        }
        if let Some(marker) = pending.take() {
            markers.insert(line, marker);
        }
        if trimmed.starts_with("\"\"\"") {
            docstring = Some("\"\"\"");
        } else if trimmed.starts_with("```") {
            docstring = Some("```");
        }
    }
    if let Some((at, _)) = pending {
        problems.push(format!(
            "{at}: a `# {MARKER}` marker must be directly above a step"
        ));
    }
    (markers, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::Level;
    use rstest::rstest;

    const FEATURE: &str = "\
Feature: f

  Background:
    Given a Ready control plane

  @R-RL-1 @R-RL-4 @core
  Scenario: two rules
    Given a provisioner
    When coderd answers 429
    Then nothing else changed
    # checks: R-RL-1
    Then the condition is RateLimited
    # checks: R-RL-4
    And coderd saw 1 POST

  @R-KEY-4 @core
  Scenario: one rule
    Given a provisioner
    When it is applied
    Then one key is created

  @R-DEL-8 @R-DEL-2 @core
  Scenario Outline: outline <status>
    When the delete fails with <status>
    # checks: R-DEL-8
    Then the provisioner is gone
    # checks: R-DEL-2
    And the key is deleted

    Examples:
      | status |
      | 500    |
      | 503    |
";

    fn attribution(text: &str) -> Attribution {
        let mut feature =
            gherkin::Feature::parse(text, gherkin::GherkinEnv::default()).expect("valid gherkin");
        feature.path = Some("/x/a.feature".into());
        let texts = BTreeMap::from([("a.feature".to_owned(), text.to_owned())]);
        Attribution::new(&[feature], &texts)
    }

    fn failed_at(line: Option<usize>, scenario_line: usize, rules: &[&str]) -> ScenarioResult {
        ScenarioResult {
            feature: "a.feature".into(),
            scenario: "s".into(),
            line: scenario_line,
            level: Some(Level::Core),
            rules: rules.iter().map(|r| (*r).to_owned()).collect(),
            tags: vec![],
            status: Status::Failed,
            flaky: false,
            attempts: 1,
            duration_ms: 0,
            reason: None,
            coderd_calls: None,
            diagnostics: None,
            failed_step: line,
            failed_rules: vec![],
        }
    }

    const TWO: &[&str] = &["R-RL-1", "R-RL-4"];

    /// `(rule → verdict)` of a two-rule result after blame.
    fn judged(mut result: ScenarioResult) -> (Vec<String>, Vec<RuleVerdict>) {
        let attribution = attribution(FEATURE);
        attribution.blame(std::slice::from_mut(&mut result));
        let verdicts = result
            .rules
            .iter()
            .map(|rule| attribution.verdict(&result, rule))
            .collect();
        (result.failed_rules, verdicts)
    }

    #[test]
    fn a_failure_on_a_marked_step_blames_only_its_rules() {
        let (blamed, verdicts) = judged(failed_at(Some(14), 7, TWO));
        assert_eq!(blamed, ["R-RL-4"]);
        // R-RL-1's steps (the unmarked Then at 10, and 12) passed before the failure.
        assert_eq!(verdicts, [RuleVerdict::Passed, RuleVerdict::Failed]);
        let (blamed, verdicts) = judged(failed_at(Some(12), 7, TWO));
        assert_eq!(blamed, ["R-RL-1"]);
        // R-RL-4's step 14 never ran.
        assert_eq!(verdicts, [RuleVerdict::Failed, RuleVerdict::NotReached]);
    }

    /// A foreign operator whose CRD differs in one table row: only that row's rule fails.
    #[test]
    fn a_failure_naming_its_rules_blames_only_those() {
        let mut result = failed_at(Some(10), 7, TWO);
        result.reason =
            Some("spec.key.name has maxLength \"128\", expected \"64\" (R-RL-4)".into());
        let (blamed, verdicts) = judged(result.clone());
        assert_eq!(blamed, ["R-RL-4"]);
        // R-RL-1's other step (12) never ran.
        assert_eq!(verdicts, [RuleVerdict::NotReached, RuleVerdict::Failed]);
        // A rule the step does not check, named in passing, blames nothing of its own.
        result.reason = Some("see R-KEY-4 (R-KEY-4)".into());
        assert_eq!(judged(result).0, TWO);
    }

    /// A step that checks every row of its table and names the failing rows' rules credits the
    /// rules of the rows that held, when no later step checks them.
    #[test]
    fn a_multi_row_step_credits_the_rows_that_held() {
        const ROWS: &str = "\
Feature: f

  @R-CRD-4 @R-CRD-5 @core
  Scenario: rows
    # checks: R-CRD-4, R-CRD-5
    Then the CRD declares these spec fields:
      | field | rule    |
      | a     | R-CRD-4 |
      | b     | R-CRD-5 |
";
        let attribution = attribution(ROWS);
        let mut result = failed_at(Some(6), 4, &["R-CRD-4", "R-CRD-5"]);
        result.reason = Some("spec.b has type \"x\", expected \"y\" (R-CRD-5)".into());
        attribution.blame(std::slice::from_mut(&mut result));
        assert_eq!(result.failed_rules, ["R-CRD-5"]);
        assert_eq!(attribution.verdict(&result, "R-CRD-4"), RuleVerdict::Passed);
        assert_eq!(attribution.verdict(&result, "R-CRD-5"), RuleVerdict::Failed);
        // Without rows named, the step's failure is every rule's.
        result.reason = Some("the CRD could not be read".into());
        result.failed_rules.clear();
        attribution.blame(std::slice::from_mut(&mut result));
        assert_eq!(attribution.verdict(&result, "R-CRD-4"), RuleVerdict::Failed);
    }

    /// The step's own message names no rule; an after-hook finding naming one of the step's
    /// rules does not narrow the step's blame to it.
    #[test]
    fn after_hook_findings_do_not_narrow_the_failing_step() {
        let mut result = failed_at(Some(10), 7, TWO);
        result.reason = Some(
            "step \"Then nothing else changed\" failed: timed out; the After hook failed: after the scenario: x (R-RL-4)".into(),
        );
        assert_eq!(judged(result).0, TWO);
    }

    #[test]
    fn an_unmarked_then_step_checks_every_rule() {
        let (blamed, verdicts) = judged(failed_at(Some(10), 7, TWO));
        assert_eq!(blamed, TWO);
        assert_eq!(verdicts, [RuleVerdict::Failed, RuleVerdict::Failed]);
    }

    #[rstest]
    #[case::given(8)]
    #[case::when(9)]
    #[case::background(4)]
    fn a_failure_while_setting_up_leaves_the_rules_not_reached(#[case] line: usize) {
        let (blamed, verdicts) = judged(failed_at(Some(line), 7, TWO));
        assert_eq!(blamed, Vec::<String>::new());
        assert_eq!(verdicts, [RuleVerdict::NotReached, RuleVerdict::NotReached]);
    }

    #[rstest]
    #[case::then(20, RuleVerdict::Failed)]
    #[case::given(18, RuleVerdict::NotReached)]
    fn a_single_rule_scenario_blames_its_rule_from_then_steps(
        #[case] line: usize,
        #[case] expected: RuleVerdict,
    ) {
        let attribution = attribution(FEATURE);
        let mut result = failed_at(Some(line), 17, &["R-KEY-4"]);
        attribution.blame(std::slice::from_mut(&mut result));
        assert_eq!(attribution.verdict(&result, "R-KEY-4"), expected);
    }

    #[test]
    fn every_row_of_an_outline_finds_its_steps() {
        let attribution = attribution(FEATURE);
        for row in [32, 33] {
            let mut result = failed_at(Some(26), row, &["R-DEL-8", "R-DEL-2"]);
            attribution.blame(std::slice::from_mut(&mut result));
            assert_eq!(result.failed_rules, ["R-DEL-8"], "row {row}");
        }
    }

    #[test]
    fn after_hook_findings_blame_their_rule_and_credit_the_others() {
        let attribution = attribution(FEATURE);
        let mut result = failed_at(None, 7, TWO);
        result.failed_rules = vec!["R-SEC-14".into()];
        assert_eq!(
            attribution.verdict(&result, "R-SEC-14"),
            RuleVerdict::Failed
        );
        assert_eq!(attribution.verdict(&result, "R-RL-1"), RuleVerdict::Passed);
        result.failed_rules.clear();
        assert_eq!(
            attribution.verdict(&result, "R-RL-1"),
            RuleVerdict::NotReached
        );
    }

    #[rstest]
    #[case(Status::Passed, 1, RuleVerdict::Passed)]
    #[case(Status::Skipped, 0, RuleVerdict::NotRun)]
    #[case(Status::Skipped, 1, RuleVerdict::NotReached)]
    fn passed_and_skipped_scenarios(
        #[case] status: Status,
        #[case] attempts: usize,
        #[case] expected: RuleVerdict,
    ) {
        let mut result = failed_at(None, 7, TWO);
        result.status = status;
        result.attempts = attempts;
        assert_eq!(attribution(FEATURE).verdict(&result, "R-RL-4"), expected);
    }

    #[rstest]
    #[case(&[], RuleVerdict::NotRun)]
    #[case(&[RuleVerdict::NotRun, RuleVerdict::NotRun], RuleVerdict::NotRun)]
    #[case(&[RuleVerdict::Passed, RuleVerdict::Passed], RuleVerdict::Passed)]
    #[case(&[RuleVerdict::Passed, RuleVerdict::NotRun], RuleVerdict::NotReached)]
    #[case(&[RuleVerdict::Passed, RuleVerdict::NotReached], RuleVerdict::NotReached)]
    #[case(&[RuleVerdict::NotReached, RuleVerdict::Failed, RuleVerdict::Passed], RuleVerdict::Failed)]
    fn a_rules_verdict_combines_its_scenarios(
        #[case] verdicts: &[RuleVerdict],
        #[case] expected: RuleVerdict,
    ) {
        assert_eq!(RuleVerdict::combine(verdicts.iter().copied()), expected);
    }

    #[test]
    fn the_example_passes_the_lint() {
        assert_eq!(attribution(FEATURE).problems(), Vec::<String>::new());
    }

    #[rstest]
    #[case::foreign_rule(
        "  @R-A-1 @R-A-2\n  Scenario: s\n    # checks: R-A-3\n    Then x\n    # checks: R-A-1\n    Then y\n",
        "names R-A-3, which is not a tag"
    )]
    #[case::unchecked_rule(
        "  @R-A-1 @R-A-2\n  Scenario: s\n    # checks: R-A-1\n    Then x\n",
        "no step checks R-A-2"
    )]
    #[case::only_given_steps("  @R-A-1\n  Scenario: s\n    Given x\n", "no step checks R-A-1")]
    #[case::no_marker(
        "  @R-A-1 @R-A-2\n  Scenario: s\n    Then x\n",
        "has 2 rules and no `# checks:` marker"
    )]
    #[case::blank_line(
        "  @R-A-1\n  Scenario: s\n    # checks: R-A-1\n\n    Then x\n",
        "a.feature:4: a `# checks:` marker must be directly above a step"
    )]
    #[case::above_the_scenario(
        "  # checks: R-A-1\n  @R-A-1\n  Scenario: s\n    Then x\n",
        "a.feature:2: a `# checks:` marker must be directly above a step"
    )]
    #[case::not_an_id(
        "  @R-A-1\n  Scenario: s\n    # checks: R-A-1 oops\n    Then x\n",
        "\"oops\" in a marker is not a rule id"
    )]
    #[case::background(
        "  Background:\n    # checks: R-A-1\n    Given x\n\n  @R-A-1\n  Scenario: s\n    Then y\n",
        "a.feature:3: a Background step checks nothing"
    )]
    fn the_lint_names_each_problem(#[case] body: &str, #[case] problem: &str) {
        let problems = attribution(&format!("Feature: f\n{body}")).problems();
        assert!(
            problems.iter().any(|p| p.contains(problem)),
            "{problems:#?}"
        );
    }

    #[test]
    fn a_then_step_marked_none_checks_nothing() {
        let text = "Feature: f\n  @R-A-1 @R-A-2\n  Scenario: s\n    # checks: none\n    Then a precondition\n    # checks: R-A-1\n    Then x\n    Then y\n";
        let attribution = attribution(text);
        assert_eq!(attribution.problems(), Vec::<String>::new());
        let mut result = failed_at(Some(5), 3, &["R-A-1", "R-A-2"]);
        attribution.blame(std::slice::from_mut(&mut result));
        assert_eq!(result.failed_rules, Vec::<String>::new());
        assert_eq!(
            attribution.verdict(&result, "R-A-1"),
            RuleVerdict::NotReached
        );
    }

    #[test]
    fn markers_ignore_docstrings_and_add_up() {
        let text = "    Given a spec:\n      \"\"\"\n      # checks: R-A-1\n      \"\"\"\n    # checks: R-A-1,\n    # other comment\n    # checks: @D-2\n    Then x\n";
        let (markers, problems) = parse_markers(text);
        assert_eq!(problems, Vec::<String>::new());
        assert_eq!(
            markers,
            BTreeMap::from([(8, (5, vec!["R-A-1".to_owned(), "D-2".to_owned()]))])
        );
    }

    /// Every scenario cucumber runs (each Examples row of an outline) finds its steps, under the
    /// key the report gives its result.
    #[test]
    fn every_expanded_scenario_of_the_suite_finds_its_steps() {
        use cucumber::feature::Ext as _;
        let attribution = Attribution::embedded().unwrap();
        let mut rows = 0;
        for (name, bytes) in crate::assets::folder(crate::assets::FEATURES_DIR) {
            if !name.ends_with(".feature") {
                continue;
            }
            let text = std::str::from_utf8(bytes).unwrap();
            let mut feature =
                gherkin::Feature::parse(text, gherkin::GherkinEnv::default()).unwrap();
            feature.path = Some(name.into());
            for scenario in &feature.clone().expand_examples().unwrap().scenarios {
                let result = ScenarioResult {
                    feature: name.to_owned(),
                    line: scenario.position.line,
                    ..failed_at(None, 0, &[])
                };
                let found = attribution
                    .scenario(&result)
                    .unwrap_or_else(|| panic!("{name}:{} has no steps", result.line));
                let lines = |steps: &mut dyn Iterator<Item = usize>| steps.collect::<Vec<_>>();
                assert_eq!(
                    lines(&mut found.steps.iter().filter(|s| !s.background).map(|s| s.line)),
                    lines(&mut scenario.steps.iter().map(|s| s.position.line)),
                    "{name}:{}",
                    result.line
                );
                rows += 1;
            }
        }
        assert!(rows > attribution.scenarios().len(), "{rows}");
    }

    /// The lint over the suite's own feature files.
    #[test]
    fn the_suites_features_say_which_step_checks_which_rule() {
        let attribution = Attribution::embedded().unwrap();
        assert!(attribution.scenarios().len() > 100);
        let problems = attribution.problems();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
