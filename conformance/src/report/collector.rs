//! A cucumber [`Writer`] that records each scenario's outcome for the conformance report,
//! teed next to the terminal, JUnit and JSON writers.
use crate::features::feature_file;
use crate::rule_ids::{rule_tags, rules_named_in};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use cucumber::event::{self, Retries};
use cucumber::{Event, Writer, cli, gherkin, parser};

use super::model::{Level, ScenarioResult, Status};

/// Identifies a scenario across events: feature file and line.
pub type ScenarioKey = (String, usize);

/// Outcomes gathered during a run; shared with the after-hook (coderd calls, diagnostics).
#[derive(Debug, Default)]
pub struct Outcomes {
    pub results: BTreeMap<ScenarioKey, ScenarioResult>,
    /// Scenarios started and not finished yet, with their start.
    started: BTreeMap<ScenarioKey, SystemTime>,
    /// Set by the after-hook, which may run before the (normalised) events reach the writer.
    extras: BTreeMap<ScenarioKey, Extras>,
}

/// Per-scenario facts only the after-hook knows.
#[derive(Debug, Default)]
struct Extras {
    coderd_calls: Option<BTreeMap<String, usize>>,
    diagnostics: Option<String>,
}

impl Outcomes {
    /// Adds a scenario that did not run, with the reason; its start (a `Started` event)
    /// replaces the entry.
    pub fn skipped(
        &mut self,
        feature: &gherkin::Feature,
        scenario: &gherkin::Scenario,
        reason: String,
    ) {
        let mut result = new_result(feature, scenario);
        result.status = Status::Skipped;
        result.attempts = 0;
        result.reason = Some(reason);
        self.results.insert(key(feature, scenario), result);
    }

    /// Records what the after-hook learnt (coderd call counts, diagnostics folder); a retry's
    /// facts replace the earlier attempt's.
    pub fn set_extras(
        &mut self,
        key: ScenarioKey,
        coderd_calls: Option<BTreeMap<String, usize>>,
        diagnostics: Option<String>,
    ) {
        self.extras.insert(
            key,
            Extras {
                coderd_calls,
                diagnostics,
            },
        );
    }

    /// The results in feature/line order, with the after-hook's facts merged in. A scenario
    /// the run was stopped in (see `aborted` in the report) did not pass, whatever its steps so
    /// far did: it is skipped, unless a step had already failed.
    pub fn into_results(&mut self) -> Vec<ScenarioResult> {
        let mut extras = std::mem::take(&mut self.extras);
        let unfinished = std::mem::take(&mut self.started);
        std::mem::take(&mut self.results)
            .into_iter()
            .map(|(key, mut result)| {
                if let Some(extra) = extras.remove(&key) {
                    result.coderd_calls = extra.coderd_calls;
                    result.diagnostics = extra.diagnostics;
                }
                if unfinished.contains_key(&key) && result.status == Status::Passed {
                    result.status = Status::Skipped;
                    result.reason =
                        Some("not finished: the run was stopped before its end".to_owned());
                }
                result
            })
            .collect()
    }

    fn annotate(&mut self, key: &ScenarioKey, update: impl FnOnce(&mut ScenarioResult)) {
        if let Some(result) = self.results.get_mut(key) {
            update(result);
        }
    }
}

pub fn key(feature: &gherkin::Feature, scenario: &gherkin::Scenario) -> ScenarioKey {
    (feature_file(feature), scenario.position.line)
}

fn new_result(feature: &gherkin::Feature, scenario: &gherkin::Scenario) -> ScenarioResult {
    let tags: Vec<String> = feature.tags.iter().chain(&scenario.tags).cloned().collect();
    ScenarioResult {
        feature: feature_file(feature),
        scenario: scenario.name.clone(),
        line: scenario.position.line,
        level: Level::from_tags(&tags),
        rules: rule_tags(&tags),
        tags,
        status: Status::Passed,
        flaky: false,
        attempts: 1,
        duration_ms: 0,
        reason: None,
        coderd_calls: None,
        diagnostics: None,
        failed_step: None,
        failed_rules: Vec::new(),
    }
}

/// The writer; cheap to clone, all clones share the outcomes.
#[derive(Clone, Debug, Default)]
pub struct Collector {
    pub outcomes: Arc<Mutex<Outcomes>>,
}

impl Collector {
    fn record<W>(
        &self,
        feature: &gherkin::Feature,
        scenario: &gherkin::Scenario,
        event: &event::Scenario<W>,
        retries: Option<Retries>,
        at: SystemTime,
    ) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        let key = key(feature, scenario);
        let attempt = retries.map_or(0, |r| r.current);
        match event {
            event::Scenario::Started => {
                outcomes.started.insert(key.clone(), at);
                let mut result = new_result(feature, scenario);
                result.attempts = attempt + 1;
                outcomes.results.insert(key, result);
            }
            event::Scenario::Step(step, event::Step::Failed(_, _, _, error))
            | event::Scenario::Background(step, event::Step::Failed(_, _, _, error)) => {
                // A step that found the scenario does not apply to this implementation (D-12):
                // skipped with that reason, not failed.
                if let Some(why) = super::not_applicable::reason(error) {
                    outcomes.annotate(&key, |r| {
                        r.status = Status::Skipped;
                        r.reason = Some(why);
                    });
                    return;
                }
                let reason = format!(
                    "step \"{} {}\" failed: {error}",
                    step.keyword.trim(),
                    step.value
                );
                // A step without a definition, or with two, is the suite's defect (D-13): it
                // fails the scenario but blames none of the rules the step would have checked.
                let suite_defect = matches!(
                    error,
                    event::StepError::NotFound | event::StepError::AmbiguousMatch(_)
                );
                let line = (!suite_defect).then_some(step.position.line);
                outcomes.annotate(&key, |r| {
                    r.status = Status::Failed;
                    r.reason = Some(reason);
                    r.failed_step = line;
                });
            }
            event::Scenario::Step(step, event::Step::Skipped)
            | event::Scenario::Background(step, event::Step::Skipped) => {
                // cucumber skips a step no definition matches: a suite defect, never silent.
                let reason = format!(
                    "step \"{} {}\" has no definition",
                    step.keyword.trim(),
                    step.value
                );
                outcomes.annotate(&key, |r| {
                    if r.status == Status::Passed {
                        r.status = Status::Skipped;
                        r.reason = Some(reason);
                    }
                });
            }
            event::Scenario::Hook(kind, event::Hook::Failed(_, info)) => {
                let message = info
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| info.downcast_ref::<&str>().copied())
                    .unwrap_or("no message");
                let reason = format!("the {kind:?} hook failed: {message}");
                // The after-hook's findings name the rule each breaks (a leak is R-SEC-14).
                let named = if matches!(kind, event::HookType::After) {
                    rules_named_in(message)
                } else {
                    Vec::new()
                };
                outcomes.annotate(&key, |r| {
                    r.status = Status::Failed;
                    // A step's failure stays first: the hook's findings come after it.
                    r.reason = Some(match r.reason.take() {
                        Some(step) if r.failed_step.is_some() => format!("{step}; {reason}"),
                        _ => reason,
                    });
                    for rule in named {
                        if !r.failed_rules.contains(&rule) {
                            r.failed_rules.push(rule);
                        }
                    }
                });
            }
            event::Scenario::Finished => {
                let started = outcomes.started.remove(&key).unwrap_or(at);
                let elapsed = at.duration_since(started).unwrap_or_default();
                outcomes.annotate(&key, |r| {
                    r.duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
                    r.flaky = r.status == Status::Passed && attempt > 0;
                });
            }
            _ => {}
        }
    }
}

impl<W: cucumber::World> Writer<W> for Collector {
    type Cli = cli::Empty;

    async fn handle_event(
        &mut self,
        event: parser::Result<Event<event::Cucumber<W>>>,
        _: &Self::Cli,
    ) {
        let Ok(Event { value, at, .. }) = event else {
            return;
        };
        if let event::Cucumber::Feature(feature, event) = value {
            let (scenario, retryable) = match event {
                event::Feature::Scenario(scenario, retryable) => (scenario, retryable),
                event::Feature::Rule(_, event::Rule::Scenario(scenario, retryable)) => {
                    (scenario, retryable)
                }
                _ => return,
            };
            self.record(&feature, &scenario, &retryable.event, retryable.retries, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cucumber::event::{Cucumber, Retries, Scenario, Step, StepError};
    use cucumber::gherkin::GherkinEnv;
    use cucumber::{Event, Writer as _, cli, gherkin};

    use super::*;

    #[derive(Debug, Default, cucumber::World)]
    struct TestWorld;

    fn feature() -> (gherkin::Feature, gherkin::Scenario, gherkin::Step) {
        let text = "Feature: f\n  @core @R-KEY-4 @D-3\n  Scenario: s\n    Given a step\n";
        let feature = gherkin::Feature::parse(text, GherkinEnv::default()).expect("valid gherkin");
        let scenario = feature.scenarios[0].clone();
        let step = scenario.steps[0].clone();
        (feature, scenario, step)
    }

    async fn send(
        collector: &mut Collector,
        scenario_event: Scenario<TestWorld>,
        attempt: usize,
        left: usize,
    ) {
        let (feature, scenario, _) = feature();
        let retries = Some(Retries {
            current: attempt,
            left,
        });
        let event = Cucumber::scenario(
            Arc::new(feature),
            None::<Arc<gherkin::Rule>>,
            Arc::new(scenario),
            scenario_event.with_retries(retries),
        );
        collector
            .handle_event(Ok(Event::new(event)), &cli::Empty)
            .await;
    }

    fn failed(step: &gherkin::Step) -> Scenario<TestWorld> {
        let error = StepError::Panic(Arc::new("boom".to_owned()));
        Scenario::Step(
            Arc::new(step.clone()).into(),
            Step::Failed(None, None, None, error),
        )
    }

    #[tokio::test]
    async fn a_scenario_passing_on_a_retry_is_flaky() {
        let (_, _, step) = feature();
        let mut collector = Collector::default();
        send(&mut collector, Scenario::Started, 0, 1).await;
        send(&mut collector, failed(&step), 0, 1).await;
        send(&mut collector, Scenario::Finished, 0, 1).await;
        send(&mut collector, Scenario::Started, 1, 0).await;
        send(&mut collector, Scenario::Finished, 1, 0).await;
        let results = collector.outcomes.lock().unwrap().into_results();
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].status, Status::Passed);
        assert!(results[0].flaky);
        assert_eq!(results[0].attempts, 2);
        assert_eq!(results[0].level, Some(Level::Core));
        assert_eq!(
            results[0].rules,
            vec!["R-KEY-4".to_owned(), "D-3".to_owned()]
        );
    }

    #[tokio::test]
    async fn a_scenario_the_run_stopped_in_did_not_pass() {
        let mut collector = Collector::default();
        send(&mut collector, Scenario::Started, 0, 0).await;
        let results = collector.outcomes.lock().unwrap().into_results();
        assert_eq!(results[0].status, Status::Skipped);
        assert_eq!(
            results[0].reason.as_deref(),
            Some("not finished: the run was stopped before its end")
        );
    }

    #[tokio::test]
    async fn a_scenario_entered_as_not_started_is_replaced_once_it_starts() {
        let (feature, scenario, _) = feature();
        let mut collector = Collector::default();
        let enter = |collector: &Collector| {
            collector.outcomes.lock().unwrap().skipped(
                &feature,
                &scenario,
                "not started".to_owned(),
            );
        };
        enter(&collector);
        let results = collector.outcomes.lock().unwrap().into_results();
        assert_eq!(
            (results[0].status, results[0].reason.as_deref()),
            (Status::Skipped, Some("not started"))
        );
        enter(&collector);
        send(&mut collector, Scenario::Started, 0, 0).await;
        send(&mut collector, Scenario::Finished, 0, 0).await;
        let results = collector.outcomes.lock().unwrap().into_results();
        assert_eq!(results.len(), 1);
        assert_eq!(
            (results[0].status, results[0].reason.as_deref()),
            (Status::Passed, None)
        );
    }

    #[tokio::test]
    async fn the_failing_step_and_the_after_hooks_rules_are_recorded() {
        let (_, _, step) = feature();
        let mut collector = Collector::default();
        send(&mut collector, Scenario::Started, 0, 0).await;
        send(&mut collector, failed(&step), 0, 0).await;
        let finding: Arc<dyn std::any::Any + Send> = Arc::new(
            "after the scenario: secret leak (R-SEC-14): the session token appears in Event e; status.phase is \"X\", not Pending or Ready (R-ST-1)".to_owned(),
        );
        send(
            &mut collector,
            Scenario::Hook(event::HookType::After, event::Hook::Failed(None, finding)),
            0,
            0,
        )
        .await;
        send(&mut collector, Scenario::Finished, 0, 0).await;
        let results = collector.outcomes.lock().unwrap().into_results();
        assert_eq!(results[0].failed_step, Some(4));
        assert_eq!(results[0].failed_rules, ["R-SEC-14", "R-ST-1"]);
        let reason = results[0].reason.as_deref().unwrap();
        assert!(
            reason.starts_with("step \"Given a step\" failed") && reason.contains("After hook"),
            "{reason}"
        );
        assert!(
            !crate::rule_ids::step_failure(reason).contains("R-SEC-14"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn a_scenario_that_does_not_apply_is_skipped_with_its_reason_and_counted_so() {
        let (_, _, step) = feature();
        let mut collector = Collector::default();
        let error = StepError::Panic(Arc::new(format!(
            "{}it records key ids by listing (D-12)",
            crate::report::not_applicable::DOES_NOT_APPLY
        )));
        send(&mut collector, Scenario::Started, 0, 0).await;
        let failed = Scenario::Step(Arc::new(step).into(), Step::Failed(None, None, None, error));
        send(&mut collector, failed, 0, 0).await;
        send(&mut collector, Scenario::Finished, 0, 0).await;
        let results = collector.outcomes.lock().unwrap().into_results();
        assert_eq!(results[0].status, Status::Skipped);
        assert_eq!(
            results[0].reason.as_deref(),
            Some("does not apply to this implementation: it records key ids by listing (D-12)")
        );
        let summary = crate::report::model::summarise(&results);
        assert_eq!(
            (
                summary.core.passed,
                summary.core.failed,
                summary.core.skipped
            ),
            (0, 0, 1)
        );
    }

    #[tokio::test]
    async fn a_failing_step_fails_the_scenario_with_its_text() {
        let (_, _, step) = feature();
        let mut collector = Collector::default();
        send(&mut collector, Scenario::Started, 0, 0).await;
        send(&mut collector, failed(&step), 0, 0).await;
        send(&mut collector, Scenario::Finished, 0, 0).await;
        let results = collector.outcomes.lock().unwrap().into_results();
        assert_eq!(results[0].status, Status::Failed);
        assert!(!results[0].flaky);
        assert!(
            results[0]
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("a step")),
            "{:?}",
            results[0].reason
        );
    }
}
