//! The scenarios that caught each built-in variant in the last whole `seeded-bugs` run
//! (`conformance/seeded/catches.tsv`, rewritten by `seeded-bugs --write-catches`).
//!
//! A variant runs on those first; only when they no longer catch it (the operator, the
//! features or the variant changed) does it run on every scenario of its rules, so a stale
//! record costs time, never a verdict. The unbroken operator runs on the recorded scenarios,
//! and again on any other scenario that caught a variant: a catch counts only on a scenario
//! the unbroken operator passed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;

/// The file, relative to the repository root.
pub const FILE: &str = "conformance/seeded/catches.tsv";

const RECORDED: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/seeded/catches.tsv"));

const HEADER: &str = "\
# The scenarios that caught each variant of conformance/seeded in the last whole run, and how long
# its run took, written by `conformance seeded-bugs --write-catches`: `variant<TAB>seconds<TAB>scenario
# name`. seeded-bugs runs a variant on these first (the longest runs start first) and on all its
# scenarios only when they no longer catch it.
";

/// At most this many scenarios are recorded per variant: one is enough to catch it.
const PER_VARIANT: usize = 2;

/// What caught one variant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catch {
    /// Its run's wall time (the order in which variants start).
    pub seconds: u64,
    pub scenarios: Vec<String>,
}

/// variant name → its catch.
pub type Catches = BTreeMap<String, Catch>;

/// The recorded catches built into this binary.
pub fn recorded() -> Catches {
    parse(RECORDED)
}

pub fn parse(text: &str) -> Catches {
    let mut catches = Catches::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let mut columns = line.splitn(3, '\t');
        let (Some(variant), Some(seconds), Some(scenario)) =
            (columns.next(), columns.next(), columns.next())
        else {
            continue;
        };
        let catch = catches.entry(variant.to_owned()).or_default();
        catch.seconds = seconds.parse().unwrap_or_default();
        catch.scenarios.push(scenario.to_owned());
    }
    catches
}

pub fn render(catches: &Catches) -> String {
    let mut text = HEADER.to_owned();
    for (variant, catch) in catches {
        for scenario in &catch.scenarios {
            text.push_str(&format!("{variant}\t{}\t{scenario}\n", catch.seconds));
        }
    }
    text
}

/// Records this run's catches in the file under `repo`, keeping the record of the variants this
/// run did not catch or did not run, and dropping those of variants that no longer exist
/// (`known`).
pub fn write(repo: &Path, caught: &Catches, known: &[&str]) -> anyhow::Result<()> {
    let path = repo.join(FILE);
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let mut catches = parse(&old);
    catches.retain(|variant, _| known.contains(&variant.as_str()));
    for (variant, catch) in caught {
        let mut catch = catch.clone();
        catch.scenarios.sort();
        catch.scenarios.dedup();
        catch.scenarios.truncate(PER_VARIANT);
        catches.insert(variant.clone(), catch);
    }
    std::fs::write(&path, render(&catches)).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPDATE: &str = "rename or remove its lines, or run `cargo run -p conformance -- seeded-bugs --write-catches`";

    #[test]
    fn a_rendered_record_reads_back() {
        let catch = |seconds, names: &[&str]| Catch {
            seconds,
            scenarios: names.iter().map(|n| n.to_string()).collect(),
        };
        let mut catches = Catches::new();
        catches.insert("a-variant".into(), catch(12, &["One scenario", "Two"]));
        catches.insert("b".into(), catch(0, &["Three:\twith a tab"]));
        assert_eq!(parse(&render(&catches)), catches);
    }

    /// A record naming a variant or a scenario that no longer exists would make that variant run
    /// twice; `seeded-bugs --write-catches` brings it up to date.
    #[test]
    fn the_record_names_built_in_variants_and_existing_scenarios() {
        let variants: Vec<String> = super::super::variants()
            .iter()
            .map(|v| v.name.clone())
            .collect();
        let features = crate::features::parse_features(&crate::paths::repo_root().join("features"))
            .expect("the features parse");
        // An outline's rows are named with their values in place of `<column>`.
        let scenarios: Vec<regex::Regex> = crate::coverage::scenarios(&features)
            .into_iter()
            .map(|s| {
                let pattern = regex::escape(&s.name);
                let rows = regex::Regex::new("<[^>]+>")
                    .unwrap()
                    .replace_all(&pattern, ".+");
                regex::Regex::new(&format!("^{rows}$")).unwrap()
            })
            .collect();
        for (
            variant,
            Catch {
                scenarios: names, ..
            },
        ) in recorded()
        {
            assert!(
                variants.contains(&variant),
                "{FILE} names {variant}, which is no built-in variant: {UPDATE}"
            );
            for name in names {
                assert!(
                    scenarios.iter().any(|s| s.is_match(&name)),
                    "{FILE}: {variant} was caught by \"{name}\", which no feature has now: {UPDATE}"
                );
            }
        }
    }
}
