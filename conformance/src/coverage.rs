//! Rule coverage: which scenarios check each rule of the contract, which seeded variants break
//! it, or why it cannot be observed from outside the operator.
//!
//! Inputs: `features/rules.tsv` (the suite's own catalogue of the contract: one line per rule or
//! decision, `id<TAB>level<TAB>summary<TAB>unobservable`), the rule-id tags of the feature files'
//! scenarios, and [`crate::seeded::variants`]. Output: a Markdown table, kept between
//! [`BEGIN`] and [`END`] in `features/README.md` (`conformance coverage --write`), and the
//! report's per-rule `coverage` list ([`report_coverage`]).
//!
//! Everything but the `load`/`check`/`run` section at the end is pure.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use cucumber::gherkin;

use crate::attribution::Attribution;
use crate::features::feature_file;
use crate::report::model::{Level, RuleCoverage, RuleScenario, RuleVerdict, ScenarioResult};
use crate::rule_ids::is_rule_id;
use crate::seeded::Variant;

/// The catalogue, in the features folder.
pub const RULES_FILE: &str = "rules.tsv";
/// The README holding the generated table, in the features folder.
pub const README_FILE: &str = "README.md";
/// Opens the generated part of the README.
pub const BEGIN: &str = "<!-- coverage:begin -->";
/// Closes the generated part of the README.
pub const END: &str = "<!-- coverage:end -->";
/// The one-line hint printed when the check fails.
pub const UPDATE_HINT: &str = "run: cargo run -p conformance -- coverage --write";

// ---- the catalogue ----

/// One line of `rules.tsv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleEntry {
    pub id: String,
    pub level: Level,
    pub summary: String,
    /// Why the rule cannot be observed from outside the operator; `None` = it must have a scenario.
    pub unobservable: Option<String>,
}

/// A malformed `rules.tsv`.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("{RULES_FILE} line {line}: {message}")]
pub struct CatalogueError {
    pub line: usize,
    pub message: String,
}

/// Parses `rules.tsv`. Blank lines and lines starting with `#` are comments; the last field may
/// be missing (an editor stripped the trailing tab).
pub fn parse_rules(text: &str) -> Result<Vec<RuleEntry>, CatalogueError> {
    let mut entries: Vec<RuleEntry> = Vec::new();
    let mut seen = BTreeSet::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let error = |message: String| CatalogueError { line, message };
        if raw.trim().is_empty() || raw.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = raw.split('\t').collect();
        if !(3..=4).contains(&fields.len()) {
            return Err(error(format!(
                "expected 4 tab-separated fields (id, level, summary, unobservable), found {}",
                fields.len()
            )));
        }
        let id = fields[0].trim();
        if !is_rule_id(id) {
            return Err(error(format!(
                "{id:?} is not a rule id like R-KEY-4 or D-3"
            )));
        }
        let level = match fields[1].trim() {
            "core" => Level::Core,
            "extended" => Level::Extended,
            other => {
                return Err(error(format!(
                    "level {other:?} of {id} is neither core nor extended"
                )));
            }
        };
        let summary = fields[2].trim();
        if summary.is_empty() {
            return Err(error(format!("{id} has no summary")));
        }
        if !seen.insert(id.to_owned()) {
            return Err(error(format!("{id} is listed twice")));
        }
        let unobservable = fields
            .get(3)
            .map(|r| r.trim())
            .filter(|r| !r.is_empty())
            .map(str::to_owned);
        entries.push(RuleEntry {
            id: id.to_owned(),
            level,
            summary: summary.to_owned(),
            unobservable,
        });
    }
    Ok(entries)
}

/// A tag that claims to be a rule id (`R-…`, `D-…`), well-formed or not.
fn looks_like_rule(tag: &str) -> bool {
    tag.starts_with("R-") || tag.starts_with("D-")
}

// ---- the scenarios ----

/// A scenario with every tag cucumber evaluates for it (feature's, rule's, its own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaggedScenario {
    /// Feature file name, e.g. `cleanup.feature`.
    pub feature: String,
    pub line: usize,
    pub name: String,
    pub tags: Vec<String>,
}

impl TaggedScenario {
    /// `file.feature: Scenario name`.
    pub fn label(&self) -> String {
        format!("{}: {}", self.feature, self.name)
    }
}

/// The scenarios of parsed feature files, in file and line order.
pub fn scenarios(features: &[gherkin::Feature]) -> Vec<TaggedScenario> {
    let mut out = Vec::new();
    for feature in features {
        let file = feature_file(feature);
        for (rule, scenario) in crate::features::scenarios_with_rules(feature) {
            out.push(TaggedScenario {
                feature: file.clone(),
                line: scenario.position.line,
                name: scenario.name.clone(),
                tags: crate::features::all_tags(feature, rule, scenario),
            });
        }
    }
    out.sort_by(|a, b| (&a.feature, a.line).cmp(&(&b.feature, b.line)));
    out
}

// ---- the table ----

/// One rule's line of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub id: String,
    pub level: Level,
    pub summary: String,
    /// `file.feature: Scenario name`, in file and line order.
    pub scenarios: Vec<String>,
    /// Names of the seeded variants that break the rule.
    pub variants: Vec<String>,
    pub unobservable: Option<String>,
}

/// What is wrong with the coverage.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    #[error("{scenario}: tag @{tag} is not a rule in features/{RULES_FILE}")]
    UnknownTag { tag: String, scenario: String },
    #[error("seeded variant {variant} breaks {rule}, which is not a rule in features/{RULES_FILE}")]
    UnknownVariantRule { variant: String, rule: String },
    #[error(
        "{} rule(s) have neither a scenario nor an unobservable reason in features/{RULES_FILE}: {}",
        .0.len(),
        .0.join(", ")
    )]
    Uncovered(Vec<String>),
    #[error(
        "{} rule(s) have a scenario and also an unobservable reason in features/{RULES_FILE} (drop one): {}",
        .0.len(),
        .0.join(", ")
    )]
    ScenarioAndReason(Vec<String>),
}

/// The problems of one coverage table, all at once.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub struct CoverageError(pub Vec<Problem>);

impl fmt::Display for CoverageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// The table with what it could not place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coverage {
    pub rows: Vec<Row>,
    /// Seeded variants in all.
    pub variant_count: usize,
    /// Rule-like tags not in the catalogue, with their scenario's label.
    pub unknown_tags: Vec<(String, String)>,
    /// Rule ids of variants not in the catalogue, with the variant's name.
    pub unknown_variant_rules: Vec<(String, String)>,
}

impl Coverage {
    /// Maps rule → level → scenarios → seeded variants → reason; never fails, problems are
    /// kept for [`Coverage::problems`].
    pub fn new(rules: &[RuleEntry], scenarios: &[TaggedScenario], variants: &[Variant]) -> Self {
        let known: BTreeSet<&str> = rules.iter().map(|r| r.id.as_str()).collect();
        let mut by_rule: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        let mut unknown_tags = Vec::new();
        for scenario in scenarios {
            let mut tags: Vec<&str> = scenario.tags.iter().map(String::as_str).collect();
            tags.dedup();
            for tag in tags.into_iter().filter(|t| looks_like_rule(t)) {
                if known.contains(tag) {
                    let list = by_rule.entry(tag).or_default();
                    let label = scenario.label();
                    if !list.contains(&label) {
                        list.push(label);
                    }
                } else {
                    unknown_tags.push((tag.to_owned(), scenario.label()));
                }
            }
        }
        let mut unknown_variant_rules = Vec::new();
        for variant in variants {
            for rule in variant
                .breaks
                .iter()
                .filter(|r| !known.contains(r.as_str()))
            {
                unknown_variant_rules.push((rule.clone(), variant.name.clone()));
            }
        }
        let rows = rules
            .iter()
            .map(|rule| Row {
                id: rule.id.clone(),
                level: rule.level,
                summary: rule.summary.clone(),
                scenarios: by_rule.remove(rule.id.as_str()).unwrap_or_default(),
                variants: variants
                    .iter()
                    .filter(|v| v.breaks.contains(&rule.id))
                    .map(|v| v.name.clone())
                    .collect(),
                unobservable: rule.unobservable.clone(),
            })
            .collect();
        Coverage {
            rows,
            variant_count: variants.len(),
            unknown_tags,
            unknown_variant_rules,
        }
    }

    /// Rules with neither a scenario nor an unobservable reason.
    pub fn uncovered(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|r| r.scenarios.is_empty() && r.unobservable.is_none())
            .map(|r| r.id.clone())
            .collect()
    }

    pub fn problems(&self) -> Vec<Problem> {
        let mut problems: Vec<Problem> = self
            .unknown_tags
            .iter()
            .map(|(tag, scenario)| Problem::UnknownTag {
                tag: tag.clone(),
                scenario: scenario.clone(),
            })
            .collect();
        problems.extend(self.unknown_variant_rules.iter().map(|(rule, variant)| {
            Problem::UnknownVariantRule {
                variant: variant.clone(),
                rule: rule.clone(),
            }
        }));
        let uncovered = self.uncovered();
        if !uncovered.is_empty() {
            problems.push(Problem::Uncovered(uncovered));
        }
        let both: Vec<String> = self
            .rows
            .iter()
            .filter(|r| !r.scenarios.is_empty() && r.unobservable.is_some())
            .map(|r| r.id.clone())
            .collect();
        if !both.is_empty() {
            problems.push(Problem::ScenarioAndReason(both));
        }
        problems
    }

    /// `Ok` when every rule has exactly one of a scenario or a reason and every tag is known.
    pub fn check(&self) -> Result<(), CoverageError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(CoverageError(problems))
        }
    }

    /// `N rules, M with scenarios, K unobservable, V seeded variants` (+ uncovered count).
    pub fn summary(&self) -> String {
        let with_scenarios = self.rows.iter().filter(|r| !r.scenarios.is_empty()).count();
        let unobservable = self
            .rows
            .iter()
            .filter(|r| r.unobservable.is_some())
            .count();
        let mut text = format!(
            "{} rules, {with_scenarios} with scenarios, {unobservable} unobservable, {} seeded variants",
            self.rows.len(),
            self.variant_count
        );
        let uncovered = self.uncovered().len();
        if uncovered > 0 {
            let _ = write!(text, "; {uncovered} uncovered");
        }
        text
    }

    /// The generated part of the README: the summary line and the table.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "<!-- generated by `conformance coverage --write` from rules.tsv, the scenarios' tags and conformance/seeded/*.patch; do not edit -->"
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "**Coverage: {}.**", self.summary());
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| Rule | Level | Summary | Scenarios | Seeded variants | Not observable because |"
        );
        let _ = writeln!(out, "| --- | --- | --- | --- | --- | --- |");
        for row in &self.rows {
            let scenarios = if row.scenarios.is_empty() {
                if row.unobservable.is_some() {
                    "—".to_owned()
                } else {
                    "**uncovered**".to_owned()
                }
            } else {
                row.scenarios
                    .iter()
                    .map(|s| cell(s))
                    .collect::<Vec<_>>()
                    .join("<br>")
            };
            let variants = row
                .variants
                .iter()
                .map(|v| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                out,
                "| {} | {} | {} | {scenarios} | {variants} | {} |",
                row.id,
                level_name(row.level),
                cell(&row.summary),
                cell(row.unobservable.as_deref().unwrap_or(""))
            );
        }
        out
    }
}

/// Builds the table and fails with every problem at once.
pub fn build(
    rules: &[RuleEntry],
    scenarios: &[TaggedScenario],
    variants: &[Variant],
) -> Result<Coverage, CoverageError> {
    let coverage = Coverage::new(rules, scenarios, variants);
    coverage.check().map(|()| coverage)
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Core => "core",
        Level::Extended => "extended",
    }
}

/// Text safe inside a Markdown table cell (`<n>` would otherwise vanish as an HTML tag).
fn cell(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('|', "\\|")
        .replace('\n', " ")
}

// ---- the README ----

/// The text between the markers, if both are present in order.
pub fn generated_part(readme: &str) -> Option<&str> {
    let start = readme.find(BEGIN)? + BEGIN.len();
    let end = start + readme[start..].find(END)?;
    Some(&readme[start..end])
}

/// The README with `generated` between the markers (which must already be there).
pub fn splice(readme: &str, generated: &str) -> Option<String> {
    let start = readme.find(BEGIN)? + BEGIN.len();
    let end = start + readme[start..].find(END)?;
    Some(format!(
        "{}\n{}{}",
        &readme[..start],
        generated,
        &readme[end..]
    ))
}

/// Whether the README's generated part equals `generated` (as [`splice`] writes it).
pub fn is_up_to_date(readme: &str, generated: &str) -> bool {
    generated_part(readme).is_some_and(|part| part.strip_prefix('\n') == Some(generated))
}

// ---- the report ----

/// The report's per-rule view: for each catalogue rule its level, its verdict, the run's
/// results of the scenarios tagged with it (or whose failure is attributed to it) with what each
/// says of the rule, the variants that break it and why it is unobservable. `results` must have
/// been blamed ([`Attribution::blame`]).
pub fn report_coverage(
    rules: &[RuleEntry],
    results: &[ScenarioResult],
    variants: &[Variant],
    attribution: &Attribution,
) -> Vec<RuleCoverage> {
    rules
        .iter()
        .map(|rule| {
            let scenarios: Vec<RuleScenario> = results
                .iter()
                .filter(|r| r.rules.contains(&rule.id) || r.failed_rules.contains(&rule.id))
                .map(|r| RuleScenario {
                    feature: r.feature.clone(),
                    line: r.line,
                    status: r.status,
                    verdict: Some(attribution.verdict(r, &rule.id)),
                })
                .collect();
            RuleCoverage {
                rule: rule.id.clone(),
                level: rule.level,
                verdict: Some(RuleVerdict::combine(
                    scenarios.iter().filter_map(|s| s.verdict),
                )),
                scenarios,
                seeded_variants: variants
                    .iter()
                    .filter(|v| v.breaks.contains(&rule.id))
                    .map(|v| v.name.clone())
                    .collect(),
                unobservable: rule.unobservable.clone(),
            }
        })
        .collect()
}

/// Where a report's rule verdicts differ from what the suite's features and catalogue make of
/// its results (`verify-report`; reports from before verdicts existed are not checked).
pub fn verdict_problems(
    report: &crate::report::ConformanceReport,
    rules: &[RuleEntry],
    attribution: &Attribution,
) -> Vec<String> {
    let mut problems = Vec::new();
    // A report says something only about what it lists: every scenario of the features it
    // hashed has a result (run, or skipped with its reason), and the rules their verdicts.
    let listed: BTreeSet<(&str, usize)> = report
        .results
        .iter()
        .map(|r| (r.feature.as_str(), r.line))
        .collect();
    for (feature, line) in attribution.scenario_keys() {
        if !listed.contains(&(feature.as_str(), *line)) {
            problems.push(format!(
                "{feature}:{line}, a scenario of the suite's features, has no result in the report (every scenario is listed, run or skipped with its reason)"
            ));
        }
    }
    if report.coverage.is_empty() {
        problems.push("the report has no coverage section: no rule has a verdict".to_owned());
        return problems;
    }
    if report.coverage.iter().all(|r| r.verdict.is_none()) {
        problems.push("the coverage section gives no rule a verdict".to_owned());
        return problems;
    }
    let mut results = report.results.clone();
    for (ours, theirs) in results.iter_mut().zip(&report.results) {
        ours.failed_rules.retain(|rule| {
            ours.reason
                .as_deref()
                .is_some_and(|reason| crate::rule_ids::rules_named_in(reason).contains(rule))
        });
        attribution.blame(std::slice::from_mut(ours));
        let (mut expected, mut listed) = (ours.failed_rules.clone(), theirs.failed_rules.clone());
        expected.sort();
        listed.sort();
        if expected != listed {
            problems.push(format!(
                "{}:{} blames [{}] for its failure; its failing step and findings blame [{}]",
                theirs.feature,
                theirs.line,
                listed.join(", "),
                expected.join(", ")
            ));
        }
    }
    let expected = report_coverage(rules, &results, &[], attribution);
    let by_rule: BTreeMap<&str, &RuleCoverage> =
        expected.iter().map(|r| (r.rule.as_str(), r)).collect();
    for rule in &report.coverage {
        let Some(ours) = by_rule.get(rule.rule.as_str()) else {
            problems.push(format!("{} is not a rule of this suite", rule.rule));
            continue;
        };
        let verdicts = |c: &RuleCoverage| -> Vec<(String, usize, Option<RuleVerdict>)> {
            c.scenarios
                .iter()
                .map(|s| (s.feature.clone(), s.line, s.verdict))
                .collect()
        };
        if rule.verdict != ours.verdict || verdicts(rule) != verdicts(ours) {
            problems.push(format!(
                "the verdict of {} ({}) does not follow from the results ({})",
                rule.rule,
                rule.verdict.map_or("none", RuleVerdict::label),
                ours.verdict.map_or("none", RuleVerdict::label)
            ));
        }
    }
    problems
}

// ---- files and the command ----

/// The suite's own features folder.
pub fn default_features_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../features"))
}

/// Reads `rules.tsv` of a features folder.
pub fn load_rules(features_dir: &Path) -> anyhow::Result<Vec<RuleEntry>> {
    let path = features_dir.join(RULES_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_rules(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The coverage of a features folder against [`crate::seeded::variants`].
pub fn load(features_dir: &Path) -> anyhow::Result<Coverage> {
    let rules = load_rules(features_dir)?;
    let features = crate::features::parse_features(features_dir)?;
    Ok(Coverage::new(
        &rules,
        &scenarios(&features),
        crate::seeded::variants(),
    ))
}

/// Everything `coverage --check` rejects: the coverage's problems and a stale README.
pub fn check(features_dir: &Path) -> anyhow::Result<Vec<String>> {
    let coverage = load(features_dir)?;
    let mut problems: Vec<String> = coverage.problems().iter().map(|p| p.to_string()).collect();
    problems.extend(Attribution::load(features_dir)?.problems());
    problems.extend(crate::schedule::isolation_problems(
        &crate::features::parse_features(features_dir)?,
    ));
    let path = features_dir.join(README_FILE);
    let readme =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    if generated_part(&readme).is_none() {
        problems.push(format!(
            "{} lacks the markers {BEGIN} and {END}",
            path.display()
        ));
    } else if !is_up_to_date(&readme, &coverage.to_markdown()) {
        problems.push(format!(
            "the coverage table in {} is out of date",
            path.display()
        ));
    }
    Ok(problems)
}

/// The report's `coverage` list for a run over `features_dir`, after blaming each failure on
/// the rules of its failing step (`results` gain their `failed_rules`); empty (with a warning)
/// when the folder has no readable catalogue or features.
pub fn for_report(features_dir: &Path, results: &mut [ScenarioResult]) -> Vec<RuleCoverage> {
    let loaded = load_rules(features_dir)
        .and_then(|rules| Attribution::load(features_dir).map(|attribution| (rules, attribution)));
    match loaded {
        Ok((rules, attribution)) => {
            for problem in attribution.problems() {
                eprintln!("conformance: warning: {problem}");
            }
            attribution.blame(results);
            report_coverage(&rules, results, crate::seeded::variants(), &attribution)
        }
        Err(error) => {
            eprintln!("conformance: no rule coverage in the report: {error:#}");
            Vec::new()
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct CoverageArgs {
    /// Rewrite the generated part of features/README.md.
    #[arg(long)]
    pub write: bool,
    /// Fail when the README is out of date or a rule has neither a scenario nor a reason.
    #[arg(long)]
    pub check: bool,
    /// Folder with the feature files, rules.tsv and README.md.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../features"))]
    pub features: PathBuf,
}

/// `conformance coverage`: prints the table; `--write` updates the README; `--check` fails
/// (exit 1) on any problem.
pub fn run(args: &CoverageArgs) -> anyhow::Result<ExitCode> {
    let coverage = load(&args.features)?;
    let generated = coverage.to_markdown();
    print!("{generated}");
    if args.write {
        let path = args.features.join(README_FILE);
        let readme = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let updated = splice(&readme, &generated)
            .with_context(|| format!("{} lacks the markers {BEGIN} and {END}", path.display()))?;
        if updated != readme {
            std::fs::write(&path, updated)
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!("conformance: updated {}", path.display());
        }
    }
    if args.check {
        let problems = check(&args.features)?;
        if !problems.is_empty() {
            for problem in &problems {
                eprintln!("conformance: {problem}");
            }
            eprintln!("{UPDATE_HINT}");
            return Ok(ExitCode::FAILURE);
        }
    } else {
        for problem in coverage.problems() {
            eprintln!("conformance: warning: {problem}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::Status;
    use rstest::rstest;

    const RULES: &str = "# id\tlevel\tsummary\tunobservable\n\
        R-KEY-4\tcore\tOne create, zero deletes\t\n\
        \n\
        R-W-3\textended\tDeleted CR is a no-op\tnothing to see\n\
        D-3\tcore\tKeySecretNotOwned before any key call\n";

    /// A variant named `name` that breaks `rules` (comma-separated).
    fn variant(name: &str, rules: &str) -> Variant {
        Variant::parse(
            "test",
            &format!("# name: {name}\n# breaks: {rules}\ndiff --git a/x b/x\n"),
        )
        .expect("a variant")
    }

    fn variants() -> Vec<Variant> {
        vec![
            variant("key-rotated-on-restart", "R-KEY-4"),
            variant("unowned-key-secret-adopted", "R-KEY-4, D-3"),
        ]
    }

    fn rules() -> Vec<RuleEntry> {
        parse_rules(RULES).unwrap()
    }

    fn scenario(feature: &str, line: usize, name: &str, tags: &[&str]) -> TaggedScenario {
        TaggedScenario {
            feature: feature.to_owned(),
            line,
            name: name.to_owned(),
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
        }
    }

    fn covered() -> Vec<TaggedScenario> {
        vec![
            scenario("a.feature", 3, "Once", &["core", "R-KEY-4", "D-3"]),
            scenario("b.feature", 7, "Restart", &["serial", "R-KEY-4"]),
        ]
    }

    #[test]
    fn the_catalogue_parses_with_comments_and_a_missing_last_field() {
        let rules = rules();
        assert_eq!(rules.len(), 3);
        assert_eq!(
            rules[1],
            RuleEntry {
                id: "R-W-3".into(),
                level: Level::Extended,
                summary: "Deleted CR is a no-op".into(),
                unobservable: Some("nothing to see".into()),
            }
        );
        assert_eq!(rules[2].unobservable, None);
    }

    #[rstest]
    #[case("R-KEY-4\tmust\tx\t\n", "neither core nor extended")]
    #[case("R-KEY-4\tcore\n", "4 tab-separated fields")]
    #[case("R-KEY-4\tcore\t\t\n", "no summary")]
    #[case("KEY-4\tcore\tx\t\n", "not a rule id")]
    #[case("R-KEY-4\tcore\tx\t\nR-KEY-4\tcore\ty\t\n", "listed twice")]
    fn a_malformed_catalogue_names_the_line(#[case] text: &str, #[case] fragment: &str) {
        let error = parse_rules(text).unwrap_err();
        assert!(error.to_string().contains(fragment), "{error}");
        assert!(error.to_string().contains("rules.tsv line"), "{error}");
    }

    #[rstest]
    #[case("R-KEY-4", true)]
    #[case("R-CRED-15", true)]
    #[case("D-8", true)]
    #[case("PR", false)]
    #[case("R-KEY", false)]
    #[case("D-x", false)]
    #[case("core", false)]
    fn rule_ids(#[case] tag: &str, #[case] expected: bool) {
        assert_eq!(is_rule_id(tag), expected);
    }

    #[test]
    fn scenarios_carry_their_features_tags_and_file_name() {
        let text = "@tutorial\nFeature: f\n  @core @R-KEY-4\n  Scenario: s\n    Given a step\n\n  Rule: r\n    @D-3\n    Scenario: t\n      Given a step\n";
        let mut feature =
            gherkin::Feature::parse(text, gherkin::GherkinEnv::default()).expect("valid gherkin");
        feature.path = Some(PathBuf::from("/somewhere/a.feature"));
        let found = scenarios(&[feature]);
        assert_eq!(
            found,
            vec![
                scenario("a.feature", 4, "s", &["tutorial", "core", "R-KEY-4"]),
                scenario("a.feature", 9, "t", &["tutorial", "D-3"]),
            ]
        );
    }

    #[test]
    fn the_table_maps_rules_to_scenarios_variants_and_reasons() {
        let coverage = build(&rules(), &covered(), &variants()).unwrap();
        assert_eq!(
            coverage.rows[0].scenarios,
            vec!["a.feature: Once", "b.feature: Restart"]
        );
        assert_eq!(
            coverage.rows[0].variants,
            vec!["key-rotated-on-restart", "unowned-key-secret-adopted"]
        );
        assert_eq!(coverage.rows[1].scenarios, Vec::<String>::new());
        assert_eq!(
            coverage.rows[1].unobservable.as_deref(),
            Some("nothing to see")
        );
        assert_eq!(
            coverage.rows[2].variants,
            vec!["unowned-key-secret-adopted"]
        );
        assert_eq!(
            coverage.summary(),
            "3 rules, 2 with scenarios, 1 unobservable, 2 seeded variants"
        );
    }

    #[test]
    fn a_tag_outside_the_catalogue_is_an_error() {
        let mut scenarios = covered();
        scenarios.push(scenario(
            "c.feature",
            2,
            "Typo",
            &["R-KEY-44", "PR", "core"],
        ));
        let error = build(&rules(), &scenarios, &variants()).unwrap_err();
        assert_eq!(
            error.0,
            vec![Problem::UnknownTag {
                tag: "R-KEY-44".into(),
                scenario: "c.feature: Typo".into()
            }]
        );
        assert!(error.to_string().contains("@R-KEY-44"), "{error}");
    }

    #[test]
    fn every_uncovered_rule_is_listed_in_one_error() {
        let text = format!("{RULES}R-RL-2\textended\tBackoff doubles\t\n");
        let rules = parse_rules(&text).unwrap();
        let error = build(&rules, &[], &variants()).unwrap_err();
        assert_eq!(
            error.0,
            vec![Problem::Uncovered(vec![
                "R-KEY-4".into(),
                "D-3".into(),
                "R-RL-2".into()
            ])]
        );
        assert!(
            error.to_string().starts_with("3 rule(s) have neither"),
            "{error}"
        );
        assert!(
            error.to_string().contains("R-KEY-4, D-3, R-RL-2"),
            "{error}"
        );
    }

    #[test]
    fn a_rule_with_a_scenario_and_a_reason_is_an_error() {
        let mut scenarios = covered();
        scenarios.push(scenario("c.feature", 2, "Gone", &["R-W-3"]));
        let error = build(&rules(), &scenarios, &variants()).unwrap_err();
        assert_eq!(
            error.0,
            vec![Problem::ScenarioAndReason(vec!["R-W-3".into()])]
        );
    }

    #[test]
    fn a_variant_breaking_an_unknown_rule_is_an_error() {
        let odd = [variant("odd", "R-NOPE-1")];
        let error = build(&rules(), &covered(), &odd).unwrap_err();
        assert_eq!(
            error.0,
            vec![Problem::UnknownVariantRule {
                variant: "odd".into(),
                rule: "R-NOPE-1".into()
            }]
        );
    }

    #[test]
    fn the_markdown_escapes_cells_and_marks_uncovered_rules() {
        let mut scenarios = covered();
        scenarios[1].name = "Restart <case> | again".into();
        let mut rules = rules();
        rules.push(RuleEntry {
            id: "R-RES-1".into(),
            level: Level::Core,
            summary: "Deployment provisioner-<n>".into(),
            unobservable: None,
        });
        let markdown = Coverage::new(&rules, &scenarios, &variants()).to_markdown();
        assert!(
            markdown.contains("**Coverage: 4 rules, 2 with scenarios, 1 unobservable, 2 seeded variants; 1 uncovered.**"),
            "{markdown}"
        );
        assert!(markdown.contains(
            "| R-KEY-4 | core | One create, zero deletes | a.feature: Once<br>b.feature: Restart &lt;case&gt; \\| again | `key-rotated-on-restart`, `unowned-key-secret-adopted` |  |"
        ), "{markdown}");
        assert!(
            markdown
                .contains("| R-W-3 | extended | Deleted CR is a no-op | — |  | nothing to see |"),
            "{markdown}"
        );
        assert!(
            markdown.contains(
                "| R-RES-1 | core | Deployment provisioner-&lt;n&gt; | **uncovered** |  |  |"
            ),
            "{markdown}"
        );
    }

    #[rstest]
    #[case("intro\n<!-- coverage:begin -->\nold\n<!-- coverage:end -->\nafter\n")]
    #[case("intro\n<!-- coverage:begin --><!-- coverage:end -->\n")]
    fn the_readme_is_spliced_between_its_markers(#[case] readme: &str) {
        let generated = "| table |\n";
        assert!(!is_up_to_date(readme, generated));
        let updated = splice(readme, generated).unwrap();
        assert!(
            updated.starts_with("intro\n<!-- coverage:begin -->\n| table |\n<!-- coverage:end -->")
        );
        assert!(is_up_to_date(&updated, generated));
        assert_eq!(splice(&updated, generated).unwrap(), updated);
    }

    #[rstest]
    #[case("no markers\n")]
    #[case("<!-- coverage:end --> <!-- coverage:begin -->\n")]
    fn a_readme_without_markers_is_refused(#[case] readme: &str) {
        assert_eq!(splice(readme, "x"), None);
        assert!(!is_up_to_date(readme, "x"));
    }

    fn result(feature: &str, line: usize, rules: &[&str], status: Status) -> ScenarioResult {
        ScenarioResult {
            feature: feature.into(),
            scenario: "s".into(),
            line,
            level: Some(Level::Core),
            rules: rules.iter().map(|r| (*r).to_owned()).collect(),
            tags: vec![],
            status,
            flaky: false,
            attempts: 1,
            duration_ms: 0,
            reason: None,
            coderd_calls: None,
            diagnostics: None,
            failed_step: None,
            failed_rules: vec![],
        }
    }

    #[test]
    fn the_report_lists_each_rules_results_variants_and_reason() {
        let mut failed = result("b.feature", 7, &["R-KEY-4"], Status::Failed);
        failed.failed_rules = vec!["R-KEY-4".into()];
        let results = vec![
            result("a.feature", 3, &["R-KEY-4", "D-3"], Status::Passed),
            failed,
        ];
        let coverage = report_coverage(&rules(), &results, &variants(), &Attribution::default());
        assert_eq!(coverage.len(), 3);
        assert_eq!(coverage[0].rule, "R-KEY-4");
        assert_eq!(coverage[0].verdict, Some(RuleVerdict::Failed));
        assert_eq!(
            coverage[0].scenarios,
            vec![
                RuleScenario {
                    feature: "a.feature".into(),
                    line: 3,
                    status: Status::Passed,
                    verdict: Some(RuleVerdict::Passed),
                },
                RuleScenario {
                    feature: "b.feature".into(),
                    line: 7,
                    status: Status::Failed,
                    verdict: Some(RuleVerdict::Failed),
                },
            ]
        );
        assert_eq!(coverage[1].verdict, Some(RuleVerdict::NotRun));
        assert_eq!(coverage[2].verdict, Some(RuleVerdict::Passed));
        assert_eq!(coverage[0].seeded_variants.len(), 2);
        assert_eq!(coverage[1].scenarios, vec![]);
        assert_eq!(coverage[1].unobservable.as_deref(), Some("nothing to see"));
        assert_eq!(coverage[2].rule, "D-3");
        assert_eq!(coverage[2].scenarios.len(), 1);
        assert_eq!(coverage[2].level, Level::Core);
    }

    /// The attribution of one feature file `a.feature` holding `text`.
    fn attribution_of(text: &str) -> Attribution {
        let mut feature =
            gherkin::Feature::parse(text, gherkin::GherkinEnv::default()).expect("valid gherkin");
        feature.path = Some(PathBuf::from("a.feature"));
        Attribution::new(
            &[feature],
            &BTreeMap::from([("a.feature".to_owned(), text.to_owned())]),
        )
    }

    #[test]
    fn verify_recomputes_blame_and_verdicts_from_the_features() {
        let text = "Feature: f\n  @R-KEY-4 @D-3\n  Scenario: s\n    When x\n    # checks: D-3\n    Then y\n    # checks: R-KEY-4\n    Then z\n";
        let attribution = attribution_of(text);
        let mut failed = result("a.feature", 3, &["R-KEY-4", "D-3"], Status::Failed);
        failed.failed_step = Some(6);
        let mut results = vec![failed];
        attribution.blame(&mut results);
        assert_eq!(results[0].failed_rules, ["D-3"]);
        let mut report = crate::report::model::tests::report(results.clone());
        report.coverage = report_coverage(&rules(), &results, &variants(), &attribution);
        assert_eq!(report.coverage[0].verdict, Some(RuleVerdict::NotReached));
        assert_eq!(report.coverage[2].verdict, Some(RuleVerdict::Failed));
        assert_eq!(
            verdict_problems(&report, &rules(), &attribution),
            Vec::<String>::new()
        );
        // Blaming the other rule, with a coverage to match, is still caught.
        results[0].failed_rules = vec!["R-KEY-4".into()];
        report.coverage = report_coverage(&rules(), &results, &variants(), &attribution);
        report.results = results;
        let problems = verdict_problems(&report, &rules(), &attribution);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("a.feature:3 blames [R-KEY-4] for its failure; its failing step and findings blame [D-3]")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains(
                "the verdict of R-KEY-4 (failed) does not follow from the results (not reached)"
            )),
            "{problems:?}"
        );
    }

    #[test]
    fn verify_refuses_a_deleted_row_and_a_missing_coverage() {
        let text =
            "Feature: f\n  @D-3\n  Scenario: s\n    Then y\n  @D-3\n  Scenario: t\n    Then z\n";
        let attribution = attribution_of(text);
        // The failed scenario at line 6 was deleted from the report.
        let results = vec![result("a.feature", 3, &["D-3"], Status::Passed)];
        let mut report = crate::report::model::tests::report(results.clone());
        report.coverage = report_coverage(&rules(), &results, &variants(), &attribution);
        let problems = verdict_problems(&report, &rules(), &attribution);
        assert!(
            problems
                .iter()
                .any(|p| p
                    .starts_with("a.feature:6, a scenario of the suite's features, has no result")),
            "{problems:?}"
        );
        report.coverage.clear();
        let problems = verdict_problems(&report, &rules(), &attribution);
        assert!(
            problems.iter().any(|p| p.contains("no coverage section")),
            "{problems:?}"
        );
    }

    #[test]
    fn the_suites_catalogue_names_every_variants_rule() {
        let rules = load_rules(&default_features_dir()).unwrap();
        assert!(rules.len() >= 149, "{}", rules.len());
        let coverage = load(&default_features_dir()).unwrap();
        assert_eq!(coverage.unknown_variant_rules, vec![]);
        assert_eq!(coverage.unknown_tags, vec![]);
    }
}
