//! The suite's feature files: parsed with cucumber's Gherkin parser, each scenario's tags as
//! cucumber evaluates them, and the files' hashes for the report.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use cucumber::gherkin;

use crate::report::model::{self, FeatureFile};

/// A scenario's tags with its feature's and rule's, as cucumber evaluates them.
/// A feature's scenarios, each with the Rule it sits in: the feature's own first, then each
/// Rule's.
pub(crate) fn scenarios_with_rules(
    feature: &gherkin::Feature,
) -> impl Iterator<Item = (Option<&gherkin::Rule>, &gherkin::Scenario)> {
    feature.scenarios.iter().map(|s| (None, s)).chain(
        feature
            .rules
            .iter()
            .flat_map(|r| r.scenarios.iter().map(move |s| (Some(r), s))),
    )
}

pub(crate) fn all_tags(
    feature: &gherkin::Feature,
    rule: Option<&gherkin::Rule>,
    scenario: &gherkin::Scenario,
) -> Vec<String> {
    feature
        .tags
        .iter()
        .chain(rule.iter().flat_map(|r| &r.tags))
        .chain(&scenario.tags)
        .cloned()
        .collect()
}

pub(crate) fn parse_features(dir: &Path) -> anyhow::Result<Vec<gherkin::Feature>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading the features folder {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "feature"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            gherkin::Feature::parse_path(p, gherkin::GherkinEnv::default())
                .map_err(|e| anyhow!("{}: {e}", p.display()))
        })
        .collect()
}

/// sha256 of every feature file, by file name.
pub fn feature_hashes(dir: &Path) -> anyhow::Result<Vec<FeatureFile>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "feature") {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            files.push(FeatureFile {
                path: name,
                sha256: model::sha256_hex(&bytes),
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The file name a feature is known by in results and reports.
pub fn feature_file(feature: &gherkin::Feature) -> String {
    feature
        .path
        .as_ref()
        .and_then(|p| p.file_name())
        .map_or_else(
            || feature.name.clone(),
            |n| n.to_string_lossy().into_owned(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suites_feature_files_parse() {
        let features = parse_features(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../features"
        )))
        .unwrap();
        assert!(!features.is_empty());
    }
}
