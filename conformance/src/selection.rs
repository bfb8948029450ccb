//! Scenario selection: which scenarios a run executes (`--tags`, `--name`, and what the
//! environment allows), the skip reason reported for each of the others, and `run --list`.
use cucumber::gherkin;
use cucumber::gherkin::tagexpr::TagOperation;
use cucumber::tag::Ext as _;
use regex::Regex;

use crate::features::all_tags;
use crate::features::feature_file;

/// Start of the skip reason of a scenario outside `--tags`/`--name`.
pub(crate) const NOT_SELECTED: &str = "not selected by";
/// Skip reason of a selected scenario the run never started: `--fail-fast` stops starting
/// scenarios at the first failure (running ones finish), and an aborted run stops at once.
pub(crate) const NOT_STARTED: &str =
    "not started: the run stopped early (--fail-fast after a failure, or the run was aborted)";

/// What this run can execute; scenarios outside it are reported skipped with the reason.
#[derive(Clone, Debug)]
pub struct Selection {
    pub tags: Option<TagOperation>,
    pub name: Option<Regex>,
    pub real_coderd: bool,
    pub operator_installed: bool,
    /// The suite can start leader-elected replicas of the operator (it starts the operator
    /// itself and knows a replica's command).
    pub replicas: bool,
    /// The suite reads the API server's audit log (only when it started the API server).
    pub audit_log: bool,
    /// The fake coderd answers 428 to a bypass header the token may not use (coder/coder PR
    /// #22049; not `--coderd-version v2.30.0`).
    pub coderd_answers_428: bool,
}

impl Selection {
    /// `None` = run it; `Some(reason)` = skip it.
    pub fn skip_reason(&self, tags: &[String], name: &str) -> Option<String> {
        if let Some(expression) = &self.tags
            && !expression.eval(tags.iter())
        {
            return Some(format!("{NOT_SELECTED} --tags"));
        }
        if let Some(regex) = &self.name
            && !regex.is_match(name)
        {
            return Some(format!("{NOT_SELECTED} --name"));
        }
        let has = |tag: &str| tags.iter().any(|t| t == tag);
        if self.real_coderd && (has("fake-coderd") || has("fault-injection")) {
            return Some("needs the fake coderd (journal, fault injection, entitlement switches); --coderd points at a real coderd".to_owned());
        }
        if self.operator_installed && has("operator-restart") {
            return Some(
                "restarts the operator, which --operator installed allows only with --operator-deployment".to_owned(),
            );
        }
        if !self.replicas && has("leader-election") {
            return Some(
                "runs two leader-elected replicas of the operator: the suite starts them only for an operator it starts \
                 itself (not on kind, k3s or --operator installed), and for --operator-cmd only with --replica-cmd"
                    .to_owned(),
            );
        }
        if self.operator_installed && has("operator-identity") {
            return Some(
                "needs the operator's ServiceAccount, unknown with --operator installed without --operator-deployment".to_owned(),
            );
        }
        if self.operator_installed && has("operator-log") {
            return Some(
                "searches the operator's log for secrets, which the suite cannot read with --operator installed without --operator-deployment \
                 (the after-scenario leak checks still search the Events and the provisioners)"
                    .to_owned(),
            );
        }
        if !self.audit_log && has("api-audit") {
            return Some(
                "counts the operator's API requests in the API server's audit log, which the suite reads only on the local tier (where it starts kube-apiserver)".to_owned(),
            );
        }
        if !self.coderd_answers_428 && has("coderd-428") {
            return Some(
                "needs coderd's 428 answer to a rate-limit bypass the token may not use, which coderd sends since \
                 coder/coder PR #22049; the fake models v2.30.0 (--coderd-version), which never sends it"
                    .to_owned(),
            );
        }
        None
    }
}

pub(crate) fn list(features: &[gherkin::Feature], selection: &Selection) {
    for feature in features {
        let file = feature_file(feature);
        for (rule, scenario) in crate::features::scenarios_with_rules(feature) {
            let tags = all_tags(feature, rule, scenario);
            let tag_text = tags
                .iter()
                .map(|t| format!("@{t}"))
                .collect::<Vec<_>>()
                .join(" ");
            let note = selection
                .skip_reason(&tags, &scenario.name)
                .map(|r| format!("  (skipped: {r})"))
                .unwrap_or_default();
            println!(
                "{file}:{}  {}  [{tag_text}]{note}",
                scenario.position.line, scenario.name
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn tags(list: &[&str]) -> Vec<String> {
        list.iter().map(|t| (*t).to_owned()).collect()
    }

    #[rstest]
    #[case(Some("@core"), false, false, true, &["core"], None)]
    #[case(Some("@core"), false, false, true, &["extended"], Some("--tags"))]
    #[case(None, true, false, true, &["core", "fake-coderd"], Some("fake coderd"))]
    #[case(None, false, true, true, &["core", "operator-restart"], Some("installed"))]
    #[case(None, false, true, true, &["core"], None)]
    #[case(None, false, false, false, &["extended", "api-audit"], Some("audit log"))]
    #[case(None, false, false, true, &["extended", "api-audit"], None)]
    #[case(None, false, true, true, &["extended", "leader-election"], Some("--replica-cmd"))]
    #[case(None, false, false, true, &["extended", "leader-election"], None)]
    #[case(None, false, false, false, &["extended", "coderd-428"], Some("v2.30.0"))]
    #[case(None, false, false, true, &["extended", "coderd-428"], None)]
    fn skips_carry_their_reason(
        #[case] expression: Option<&str>,
        #[case] real_coderd: bool,
        #[case] installed: bool,
        #[case] audit_log: bool,
        #[case] scenario_tags: &[&str],
        #[case] reason: Option<&str>,
    ) {
        let selection = Selection {
            tags: expression.map(|e| e.parse().unwrap()),
            name: None,
            real_coderd,
            operator_installed: installed,
            replicas: !installed,
            audit_log,
            // The cases without an audit log stand for the older release too.
            coderd_answers_428: audit_log,
        };
        let skip = selection.skip_reason(&tags(scenario_tags), "s");
        match reason {
            None => assert_eq!(skip, None),
            Some(fragment) => assert!(
                skip.as_deref().is_some_and(|s| s.contains(fragment)),
                "{skip:?}"
            ),
        }
    }
}
