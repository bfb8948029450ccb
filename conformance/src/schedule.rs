//! The order in which cucumber starts scenarios: those tagged `@serial`, then `@slow` and
//! `@generated`, first.
//!
//! A `@slow` scenario waits out the operator's own retry schedule (a requeue of tens of seconds, a
//! backoff), so it lasts several times as long as the others, and so does a generated case.
//! Started last, it would end the run alone while the other slots sit idle; started first, it
//! overlaps the short ones. The `@serial` scenarios, one at a time in their private
//! environments, are the run's longest chain, so they start before everything else (without a private environment cucumber runs them
//! first anyway). cucumber starts scenarios in the order it parses them, so the parser puts the
//! features with such scenarios first and, in each feature, those scenarios first.
use std::path::Path;

use cucumber::gherkin::{Feature, Scenario};
use cucumber::parser::{self, Parser};
use futures::stream;

const SLOW: &str = "slow";
const SERIAL: &str = "serial";
/// The generated cases settle twice, some through a fault each time: among the longest.
const GENERATED: &str = "generated";

/// cucumber's own parser, with the features reordered by [`slow_first`].
#[derive(Debug, Default)]
pub struct SlowFirst {
    basic: parser::Basic,
    /// The scratch folder of the embedded features, whose files are shown as `features/…`.
    embedded: Option<std::path::PathBuf>,
}

impl SlowFirst {
    /// Names the features read from `dir` (the embedded ones, written to a scratch folder that
    /// is gone after the run) `features/<file>` wherever cucumber prints where a step is
    /// defined: the file the user has in the repository.
    pub fn showing_embedded_as_features(dir: &Path) -> Self {
        Self {
            basic: parser::Basic::default(),
            embedded: Some(dir.to_path_buf()),
        }
    }
}

impl<I: AsRef<Path>> Parser<I> for SlowFirst {
    type Cli = <parser::Basic as Parser<I>>::Cli;
    type Output = stream::Iter<std::vec::IntoIter<parser::Result<Feature>>>;

    fn parse(self, input: I, cli: Self::Cli) -> Self::Output {
        // The basic parser reads every file before it answers: its stream is a ready list.
        let (features, errors): (Vec<_>, Vec<_>) = self
            .basic
            .parse(input, cli)
            .into_inner()
            .partition(Result::is_ok);
        let mut features: Vec<Feature> = features.into_iter().filter_map(Result::ok).collect();
        if let Some(dir) = &self.embedded {
            for feature in &mut features {
                let shown = feature
                    .path
                    .as_deref()
                    .and_then(|path| path.strip_prefix(dir).ok())
                    .map(|file| Path::new(crate::assets::FEATURES_DIR).join(file));
                if shown.is_some() {
                    feature.path = shown;
                }
            }
        }
        slow_first(&mut features);
        stream::iter(
            features
                .into_iter()
                .map(Ok)
                .chain(errors)
                .collect::<Vec<_>>(),
        )
    }
}

/// 0 for a `@serial` scenario, 1 for a `@slow` or `@generated` one, 2 for the others.
fn start_rank(tags: &[String], scenario: &Scenario) -> u8 {
    let has = |tag: &str| tags.iter().chain(&scenario.tags).any(|t| t == tag);
    if has(SERIAL) {
        0
    } else if has(SLOW) || has(GENERATED) {
        1
    } else {
        2
    }
}

/// Stable reorder: in every feature its `@serial` scenarios first, then its `@slow` ones, and
/// the features by their first scenario's rank; the rest keep their order. (The suite's
/// features use no `Rule:` blocks.)
pub fn slow_first(features: &mut [Feature]) {
    for feature in features.iter_mut() {
        let tags = &feature.tags;
        feature.scenarios.sort_by_key(|s| start_rank(tags, s));
    }
    features.sort_by_key(|f| {
        f.scenarios
            .iter()
            .map(|s| start_rank(&f.tags, s))
            .min()
            .unwrap_or(2)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str, text: &str) -> Feature {
        Feature::parse(text, cucumber::gherkin::GherkinEnv::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn names(features: &[Feature]) -> Vec<Vec<String>> {
        features
            .iter()
            .map(|f| {
                std::iter::once(f.name.clone())
                    .chain(f.scenarios.iter().map(|s| s.name.clone()))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn serial_then_slow_scenarios_and_their_features_come_first() {
        let quick = parse(
            "quick",
            "Feature: quick\n  Scenario: a\n    Given x\n  Scenario: b\n    Given x\n",
        );
        let mixed = parse(
            "mixed",
            "Feature: mixed\n  Scenario: c\n    Given x\n  @slow\n  Scenario: d\n    Given x\n  Scenario: e\n    Given x\n  @slow\n  Scenario: f\n    Given x\n",
        );
        let serial = parse(
            "serial",
            "Feature: serial\n  Scenario: g\n    Given x\n  @serial\n  Scenario: h\n    Given x\n",
        );
        let mut features = vec![quick, mixed, serial];
        slow_first(&mut features);
        assert_eq!(
            names(&features),
            vec![
                vec!["serial", "h", "g"],
                vec!["mixed", "d", "f", "c", "e"],
                vec!["quick", "a", "b"]
            ]
        );
    }
}

/// Fault delays from this long on hold a reconcile worker for a third of the local tier's
/// deadline or more: with one worker (controller-runtime's default) the scenarios beside would
/// wait for it and fail for a reason not theirs.
pub const STARVING_DELAY_SECONDS: u64 = 10;

/// A step that measures the spacing of the operator's own retries (R-RL-2, R-RL-3).
const TIMED_RETRIES_STEP: &str = "spaced by a backoff doubling";

/// The isolation lint: a scenario whose fault holds coderd's answers for
/// [`STARVING_DELAY_SECONDS`] or longer runs `@serial`, alone, so that its delay can only cost
/// its own verdict; so does one that times the operator's retries (`TIMED_RETRIES_STEP`),
/// which other scenarios' passes queued before them on a shared operator would delay.
pub fn isolation_problems(features: &[Feature]) -> Vec<String> {
    let mut problems = Vec::new();
    for feature in features {
        for (rule, scenario) in crate::features::scenarios_with_rules(feature) {
            let serial = crate::features::all_tags(feature, rule, scenario)
                .iter()
                .any(|t| t == "serial");
            let longest = scenario
                .steps
                .iter()
                .filter_map(|s| delay_seconds(&s.value))
                .max();
            if !serial
                && let Some(step) = scenario
                    .steps
                    .iter()
                    .find(|s| s.value.contains(TIMED_RETRIES_STEP))
            {
                problems.push(format!(
                    "{}:{} \"{}\" times the operator's retries (\"{}\") but is not @serial: a worker busy with other scenarios' passes would stretch them",
                    feature.path.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                    scenario.position.line,
                    scenario.name,
                    step.value
                ));
            }
            if let Some(seconds) = longest.filter(|s| *s >= STARVING_DELAY_SECONDS)
                && !serial
            {
                problems.push(format!(
                    "{}:{} \"{}\" delays coderd's answers by {seconds} s but is not @serial: it would hold the workers of an operator beside other scenarios",
                    feature.path.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                    scenario.position.line,
                    scenario.name
                ));
            }
        }
    }
    problems
}

/// The delay of a "coderd delays its answers to … by N seconds" step.
fn delay_seconds(step: &str) -> Option<u64> {
    let rest = step.strip_prefix("coderd delays its answers")?;
    let (_, after) = rest.rsplit_once(" by ")?;
    after.strip_suffix(" seconds")?.trim().parse().ok()
}

#[cfg(test)]
mod isolation_tests {
    use super::*;

    fn feature(text: &str) -> Feature {
        Feature::parse(text, cucumber::gherkin::GherkinEnv::default()).expect("feature")
    }

    #[test]
    fn a_long_delay_needs_serial() {
        let long = feature(
            "Feature: f\n  Scenario: s\n    When coderd delays its answers to every GET on \"entitlements\" by 60 seconds\n",
        );
        assert_eq!(isolation_problems(&[long]).len(), 1);
        let serial = feature(
            "Feature: f\n  @serial\n  Scenario: s\n    When coderd delays its answers to every GET on \"entitlements\" by 60 seconds\n",
        );
        assert!(isolation_problems(&[serial]).is_empty());
        let short = feature(
            "Feature: f\n  Scenario: s\n    When coderd delays its answers to every DELETE on \"provisionerkey\" by 4 seconds\n",
        );
        assert!(isolation_problems(&[short]).is_empty());
        let timed = feature(
            "Feature: f\n  Scenario: s\n    Then coderd sees 3 POST on \"provisionerkeys\" spaced by a backoff doubling from 2 seconds\n",
        );
        assert_eq!(isolation_problems(&[timed]).len(), 1);
    }
}
