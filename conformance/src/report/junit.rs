//! Adds each scenario's rule ids and diagnostics folder to cucumber's `junit.xml`.
//!
//! cucumber's JUnit writer names a test case `[Rule: …: ]Scenario: <name>: <path>:<line>:<col>`
//! and offers no way to attach properties, so this pass rewrites the finished file: each
//! `<testcase>` whose feature file and line match a result gets a `<properties>` child (as
//! Jenkins, GitLab and pytest's `record_property` read it) with `rules`, `level` and, for a
//! failure, `failed_rules` (the rules it is attributed to), `failed_step` (the failing step's
//! line) and `diagnostics` (the bundle, relative to the report folder). A skipped case's
//! `<skipped/>` gets the reason as its `message`.
use super::model::{Level, ScenarioResult, Status};

/// `xml` with a `<properties>` element in every test case that matches one of `results`.
pub fn annotate(xml: &str, results: &[ScenarioResult]) -> String {
    let mut out = String::with_capacity(xml.len() + results.len() * 128);
    let mut rest = xml;
    while let Some(start) = rest.find("<testcase") {
        out.push_str(&rest[..start]);
        let tag_len = start_tag_len(&rest[start..]);
        let tag = &rest[start..start + tag_len];
        rest = &rest[start + tag_len..];
        let result = attribute(tag, "name")
            .and_then(|name| feature_and_line(&name))
            .and_then(|(file, line)| results.iter().find(|r| r.line == line && r.feature == file));
        let skip_reason = result
            .filter(|r| r.status == Status::Skipped)
            .and_then(|r| r.reason.as_deref());
        let properties = result.map(properties);
        match (properties, tag.strip_suffix("/>")) {
            (None, _) => out.push_str(tag),
            (Some(properties), Some(open)) => {
                out.push_str(open.trim_end());
                out.push('>');
                out.push_str(&properties);
                out.push_str("</testcase>");
            }
            (Some(properties), None) => {
                out.push_str(tag);
                out.push_str(&properties);
                // cucumber writes a bare `<skipped/>`: the reason is the report's.
                if let (Some(reason), Some(after)) = (skip_reason, rest.strip_prefix("<skipped/>"))
                {
                    out.push_str(&format!(r#"<skipped message="{}"/>"#, escape(reason)));
                    rest = after;
                }
            }
        }
    }
    out.push_str(rest);
    out
}

/// [`annotate`] on a file, in place; each of `strip` (the folder the embedded features were
/// written to, as cucumber may show it) is removed from case and suite names, in order.
pub fn annotate_file(
    path: &std::path::Path,
    results: &[ScenarioResult],
    strip: &[String],
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut xml =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    for prefix in strip.iter().filter(|p| !p.is_empty()) {
        xml = xml.replace(prefix.as_str(), "");
    }
    std::fs::write(path, annotate(&xml, results))
        .with_context(|| format!("writing {}", path.display()))
}

fn properties(result: &ScenarioResult) -> String {
    let mut list = vec![("rules", result.rules.join(" "))];
    if let Some(level) = result.level {
        let level = match level {
            Level::Core => "core",
            Level::Extended => "extended",
        };
        list.push(("level", level.to_owned()));
    }
    if !result.failed_rules.is_empty() {
        list.push(("failed_rules", result.failed_rules.join(" ")));
    }
    if let Some(line) = result.failed_step {
        list.push(("failed_step", line.to_string()));
    }
    if let Some(diagnostics) = &result.diagnostics {
        list.push(("diagnostics", diagnostics.clone()));
    }
    let body: String = list
        .iter()
        .map(|(name, value)| format!(r#"<property name="{name}" value="{}"/>"#, escape(value)))
        .collect();
    format!("<properties>{body}</properties>")
}

/// Length of the start tag at the beginning of `text` (up to and including its `>`; quotes
/// respected), or all of `text` when it is cut short.
fn start_tag_len(text: &str) -> usize {
    let mut quote = None;
    for (index, c) in text.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(open), _) if c == open => quote = None,
            (None, '>') => return index + 1,
            _ => {}
        }
    }
    text.len()
}

/// The unescaped value of attribute `name` in a start tag.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let needle = format!(" {name}=");
    let at = tag.find(&needle)? + needle.len();
    let quote = tag[at..].chars().next()?;
    let value = &tag[at + 1..];
    let end = value.find(quote)?;
    Some(unescape(&value[..end]))
}

/// `(feature file name, line)` from a case name ending in `<path>:<line>:<col>`.
fn feature_and_line(name: &str) -> Option<(String, usize)> {
    let mut parts = name.rsplitn(3, ':');
    let _column: usize = parts.next()?.trim().parse().ok()?;
    let line: usize = parts.next()?.trim().parse().ok()?;
    let path = parts.next()?;
    let file = path.rsplit(['/', ' ']).next()?;
    file.ends_with(".feature").then(|| (file.to_owned(), line))
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn result(feature: &str, line: usize, diagnostics: Option<&str>) -> ScenarioResult {
        ScenarioResult {
            feature: feature.into(),
            scenario: "s".into(),
            line,
            level: Some(Level::Core),
            rules: vec!["R-KEY-4".into(), "D-5".into()],
            tags: vec![],
            status: Status::Failed,
            flaky: false,
            attempts: 1,
            duration_ms: 1,
            reason: None,
            coderd_calls: None,
            diagnostics: diagnostics.map(str::to_owned),
            failed_step: None,
            failed_rules: vec![],
        }
    }

    #[rstest]
    #[case("Scenario: Key &quot;a&gt;b&quot;: /tmp/x/features/crd.feature:12:3", Some(("crd.feature", 12)))]
    #[case("Rule: r: Scenario: s: features/key_secret.feature:7:5", Some(("key_secret.feature", 7)))]
    #[case("Scenario: s: crd.feature:7:5", Some(("crd.feature", 7)))]
    #[case("Scenario: no position", None)]
    fn case_names_give_file_and_line(#[case] name: &str, #[case] expected: Option<(&str, usize)>) {
        assert_eq!(
            feature_and_line(&unescape(name)),
            expected.map(|(f, l)| (f.to_owned(), l))
        );
    }

    #[test]
    fn matching_cases_get_rules_and_diagnostics() {
        let xml = concat!(
            r#"<testsuites><testsuite name="Feature: a"><testcase name="Scenario: x &gt; y: /t/features/crd.feature:12:3" time="1.0">"#,
            r#"<failure type="Step Panicked" message="m"/></testcase>"#,
            r#"<testcase name="Scenario: ok: /t/features/crd.feature:20:3" time="0.5"/>"#,
            r#"<testcase name="Scenario: other: /t/features/rbac.feature:20:3" time="0.5"/>"#,
            "</testsuite></testsuites>"
        );
        let mut failed = result("crd.feature", 12, Some("diagnostics/crd-12-x"));
        failed.failed_rules = vec!["D-5".into()];
        failed.failed_step = Some(15);
        let results = [failed, result("crd.feature", 20, None)];
        let annotated = annotate(xml, &results);
        assert!(annotated.contains(
            r#"time="1.0"><properties><property name="rules" value="R-KEY-4 D-5"/><property name="level" value="core"/><property name="failed_rules" value="D-5"/><property name="failed_step" value="15"/><property name="diagnostics" value="diagnostics/crd-12-x"/></properties><failure"#
        ), "{annotated}");
        assert!(annotated.contains(
            r#"time="0.5"><properties><property name="rules" value="R-KEY-4 D-5"/><property name="level" value="core"/></properties></testcase>"#
        ), "{annotated}");
        assert!(
            annotated.contains(r#"rbac.feature:20:3" time="0.5"/>"#),
            "{annotated}"
        );
    }

    #[test]
    fn a_skipped_case_says_why() {
        let xml = r#"<testcase name="Scenario: s: /t/features/rate_limit.feature:49:3" time="0"><skipped/><system-out/></testcase>"#;
        let mut skipped = result("rate_limit.feature", 49, None);
        skipped.status = Status::Skipped;
        skipped.reason = Some("does not apply to this implementation: it lists <keys>".into());
        assert_eq!(
            annotate(xml, &[skipped]),
            r#"<testcase name="Scenario: s: /t/features/rate_limit.feature:49:3" time="0"><properties><property name="rules" value="R-KEY-4 D-5"/><property name="level" value="core"/></properties><skipped message="does not apply to this implementation: it lists &lt;keys&gt;"/><system-out/></testcase>"#
        );
    }

    #[test]
    fn a_file_without_cases_is_unchanged() {
        let xml = r#"<?xml version="1.0"?><testsuites/>"#;
        assert_eq!(annotate(xml, &[result("a.feature", 1, None)]), xml);
    }
}
