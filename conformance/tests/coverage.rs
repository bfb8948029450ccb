//! The rule coverage table in features/README.md is current, and every rule of
//! features/rules.tsv has a scenario or a reason why it cannot be observed, and the scenarios'
//! `# checks:` markers pass the attribution lint (`coverage --check`, as a library call).
use conformance::coverage::{self, UPDATE_HINT};

#[test]
fn every_rule_is_covered_and_the_readme_table_is_current() {
    let features = coverage::default_features_dir();
    let problems = coverage::check(&features).expect("reading the catalogue and the features");
    let uncovered = coverage::load(&features)
        .expect("reading the catalogue and the features")
        .uncovered();
    if !uncovered.is_empty() {
        eprintln!("uncovered rules ({}):", uncovered.len());
        for rule in &uncovered {
            eprintln!("  {rule}");
        }
    }
    assert!(
        problems.is_empty(),
        "the rule coverage check failed:\n  {}\n\
         UPDATE: add a scenario tagged with each uncovered rule id under features/, or a reason in \
         the unobservable column of features/rules.tsv; mark with `# checks: <rule ids>` (directly \
         above the step) which step of a scenario with several rules checks which; then regenerate \
         the table in features/README.md ({UPDATE_HINT})",
        problems.join("\n  ")
    );
}
