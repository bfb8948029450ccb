//! The order in which cucumber starts scenarios: those tagged `@slow` first.
//!
//! A `@slow` scenario waits out the operator's own retry schedule (a requeue of tens of seconds, a
//! backoff), so it lasts several times as long as the others. Started last, it would end the run
//! alone while the other slots sit idle; started first, it overlaps the short ones. cucumber starts
//! scenarios in the order it parses them (the `@serial` ones before all others), so the parser
//! puts the features with `@slow` scenarios first and, in each feature, those scenarios first.
use std::path::Path;

use cucumber::gherkin::{Feature, Scenario};
use cucumber::parser::{self, Parser};
use futures::stream;

const SLOW: &str = "slow";

/// cucumber's own parser, with the features reordered by [`slow_first`].
#[derive(Debug, Default)]
pub struct SlowFirst(parser::Basic);

impl<I: AsRef<Path>> Parser<I> for SlowFirst {
    type Cli = <parser::Basic as Parser<I>>::Cli;
    type Output = stream::Iter<std::vec::IntoIter<parser::Result<Feature>>>;

    fn parse(self, input: I, cli: Self::Cli) -> Self::Output {
        // The basic parser reads every file before it answers: its stream is a ready list.
        let (features, errors): (Vec<_>, Vec<_>) = self
            .0
            .parse(input, cli)
            .into_inner()
            .partition(Result::is_ok);
        let mut features: Vec<Feature> = features.into_iter().filter_map(Result::ok).collect();
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

fn is_slow(tags: &[String], scenario: &Scenario) -> bool {
    tags.iter().chain(&scenario.tags).any(|t| t == SLOW)
}

/// Stable reorder: features with a `@slow` scenario first, and in every feature its `@slow`
/// scenarios first; the rest keep their order. (The suite's features use no `Rule:` blocks.)
pub fn slow_first(features: &mut [Feature]) {
    for feature in features.iter_mut() {
        let tags = &feature.tags;
        feature.scenarios.sort_by_key(|s| !is_slow(tags, s));
    }
    features.sort_by_key(|f| !f.scenarios.iter().any(|s| is_slow(&f.tags, s)));
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
    fn slow_scenarios_and_their_features_come_first() {
        let quick = parse(
            "quick",
            "Feature: quick\n  Scenario: a\n    Given x\n  Scenario: b\n    Given x\n",
        );
        let mixed = parse(
            "mixed",
            "Feature: mixed\n  Scenario: c\n    Given x\n  @slow\n  Scenario: d\n    Given x\n  Scenario: e\n    Given x\n  @slow\n  Scenario: f\n    Given x\n",
        );
        let mut features = vec![quick, mixed];
        slow_first(&mut features);
        assert_eq!(
            names(&features),
            vec![vec!["mixed", "d", "f", "c", "e"], vec!["quick", "a", "b"]]
        );
    }
}
