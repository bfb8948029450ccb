//! Scenarios that do not apply to the implementation under test are skipped in cucumber's own
//! outputs too.
//!
//! A step cannot skip its scenario in cucumber: a step that finds its scenario does not apply
//! (D-12) fails with an error opening with [`DOES_NOT_APPLY`]. [`SkipNotApplicable`] sits in front
//! of the terminal, JUnit and JSON writers and turns that failure into a skipped step, so that
//! `junit.xml` has `<skipped/>` and cucumber's summary counts a skip, as the conformance report
//! does (its collector reads the failure itself, for the reason).
use cucumber::event::{self, RetryableScenario, Scenario, Step, StepError};
use cucumber::{Event, World, Writer, parser, writer};

/// Opens the error of a step that found its scenario does not apply to the implementation under
/// test (e.g. a fault on a coderd route it does not use, D-12): the scenario is reported skipped
/// with that reason, and fails nothing.
pub const DOES_NOT_APPLY: &str = "does not apply to this implementation: ";

/// Why the scenario does not apply, when `error` says it does not (its first line from
/// [`DOES_NOT_APPLY`] on).
pub fn reason(error: &StepError) -> Option<String> {
    let message = error.to_string();
    let at = message.find(DOES_NOT_APPLY)?;
    Some(message[at..].lines().next().unwrap_or_default().to_owned())
}

/// A writer that hands `Wr` every event, a failure that says the scenario does not apply as a
/// skipped step.
#[derive(Clone, Debug)]
pub struct SkipNotApplicable<Wr>(pub Wr);

fn skip_not_applicable<W>(event: event::Cucumber<W>) -> event::Cucumber<W> {
    use event::{Cucumber, Feature, Rule};
    match event {
        Cucumber::Feature(feature, Feature::Scenario(scenario, retryable)) => Cucumber::Feature(
            feature,
            Feature::Scenario(scenario, skipped_if_not_applicable(retryable)),
        ),
        Cucumber::Feature(feature, Feature::Rule(rule, Rule::Scenario(scenario, retryable))) => {
            Cucumber::Feature(
                feature,
                Feature::Rule(
                    rule,
                    Rule::Scenario(scenario, skipped_if_not_applicable(retryable)),
                ),
            )
        }
        other => other,
    }
}

fn skipped_if_not_applicable<W>(retryable: RetryableScenario<W>) -> RetryableScenario<W> {
    let RetryableScenario { event, retries } = retryable;
    let event = match event {
        Scenario::Step(step, Step::Failed(_, _, _, error)) if reason(&error).is_some() => {
            Scenario::Step(step, Step::Skipped)
        }
        Scenario::Background(step, Step::Failed(_, _, _, error)) if reason(&error).is_some() => {
            Scenario::Background(step, Step::Skipped)
        }
        other => other,
    };
    RetryableScenario { event, retries }
}

impl<W: World, Wr: Writer<W>> Writer<W> for SkipNotApplicable<Wr> {
    type Cli = Wr::Cli;

    async fn handle_event(
        &mut self,
        event: parser::Result<Event<event::Cucumber<W>>>,
        cli: &Self::Cli,
    ) {
        let event = event.map(|event| event.map(skip_not_applicable));
        self.0.handle_event(event, cli).await;
    }
}

impl<W: World, Wr: writer::Arbitrary<W, Val>, Val> writer::Arbitrary<W, Val>
    for SkipNotApplicable<Wr>
{
    async fn write(&mut self, value: Val) {
        self.0.write(value).await;
    }
}

impl<W: World, Wr: writer::Stats<W>> writer::Stats<W> for SkipNotApplicable<Wr> {
    fn passed_steps(&self) -> usize {
        self.0.passed_steps()
    }

    fn skipped_steps(&self) -> usize {
        self.0.skipped_steps()
    }

    fn failed_steps(&self) -> usize {
        self.0.failed_steps()
    }

    fn retried_steps(&self) -> usize {
        self.0.retried_steps()
    }

    fn parsing_errors(&self) -> usize {
        self.0.parsing_errors()
    }

    fn hook_errors(&self) -> usize {
        self.0.hook_errors()
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use cucumber::event::{Cucumber, Scenario, Step, StepError};
    use cucumber::gherkin::{self, GherkinEnv};
    use cucumber::{Event, Writer as _, WriterExt as _, writer};

    use super::*;

    #[derive(Debug, Default, cucumber::World)]
    struct TestWorld;

    /// An output both writers write to and the test reads.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Shared {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// cucumber's summary and `junit.xml` of one feature whose two scenarios' only step fails
    /// with `errors`, in order.
    async fn outputs(errors: [&str; 2]) -> (String, String) {
        let text = "Feature: f\n  Scenario: a\n    Then a step\n\n  Scenario: b\n    Then a step\n";
        let mut feature = gherkin::Feature::parse(text, GherkinEnv::default()).unwrap();
        feature.path = Some("features/f.feature".into());
        let (terminal, junit) = (Shared::default(), Shared::default());
        let mut writer = SkipNotApplicable(
            writer::Basic::raw(terminal.clone(), writer::Coloring::Never, 0)
                .summarized()
                .tee::<TestWorld, _>(writer::JUnit::for_tee(junit.clone(), 0)),
        );
        let feature = Arc::new(feature);
        let mut events = vec![
            Cucumber::Started,
            Cucumber::feature_started(feature.clone()),
        ];
        for (scenario, error) in feature.scenarios.iter().zip(errors) {
            let scenario = Arc::new(scenario.clone());
            let step = Arc::new(scenario.steps[0].clone());
            let error = StepError::Panic(Arc::new(error.to_owned()));
            for event in [
                Scenario::Started,
                Scenario::Step(step.clone().into(), Step::Started),
                Scenario::Step(step.into(), Step::Failed(None, None, None, error)),
                Scenario::Finished,
            ] {
                events.push(Cucumber::scenario(
                    feature.clone(),
                    None::<Arc<gherkin::Rule>>,
                    scenario.clone(),
                    event.with_retries(None),
                ));
            }
        }
        events.extend([Cucumber::feature_finished(feature), Cucumber::Finished]);
        for event in events {
            writer
                .handle_event(Ok(Event::new(event)), &Default::default())
                .await;
        }
        (terminal.text(), junit.text())
    }

    #[tokio::test]
    async fn a_scenario_that_does_not_apply_is_skipped_in_junit_and_in_cucumbers_summary() {
        let (summary, junit) = outputs([
            &format!("{DOES_NOT_APPLY}it learns key ids by listing (D-12)"),
            "a real failure",
        ])
        .await;
        assert!(
            summary.contains("2 scenarios (1 skipped, 1 failed)"),
            "{summary}"
        );
        assert!(
            junit.contains(r#"tests="2" errors="0" failures="1""#),
            "{junit}"
        );
        let case = |name: &str| {
            let at = junit.find(&format!("Scenario: {name}:")).unwrap();
            let end = at + junit[at..].find("</testcase>").unwrap();
            junit[at..end].to_owned()
        };
        assert!(case("a").contains("<skipped"), "{junit}");
        assert!(!case("a").contains("<failure"), "{junit}");
        assert!(case("b").contains("<failure"), "{junit}");
    }

    #[test]
    fn the_reason_is_the_line_from_the_marker_on() {
        let error = StepError::Panic(Arc::new(format!(
            "step: {DOES_NOT_APPLY}no audit log\nmore"
        )));
        assert_eq!(
            reason(&error).as_deref(),
            Some(&*format!("{DOES_NOT_APPLY}no audit log"))
        );
        assert_eq!(reason(&StepError::Panic(Arc::new("boom".to_owned()))), None);
    }
}
