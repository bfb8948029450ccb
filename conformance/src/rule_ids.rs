//! How the contract's rule ids are written in tags and in messages: `R-<GROUP>-<n>` and `D-<n>`,
//! a failure naming the rules it breaks in parentheses, and the step's part of a reason.

/// `R-<GROUP>-<n>` or `D-<n>`: the tags that name rules (`@PR`, `@core`, … do not).
pub fn is_rule_id(tag: &str) -> bool {
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(n) = tag.strip_prefix("D-") {
        return number(n);
    }
    tag.strip_prefix("R-")
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(group, n)| {
            !group.is_empty() && group.bytes().all(|b| b.is_ascii_uppercase()) && number(n)
        })
}

/// The rule ids a message names in parentheses, alone or as a comma-separated list, as the
/// after-scenario checks write them: `secret leak (R-SEC-14): …`, `… (R-KEY-3, R-KEY-13)`.
pub fn rules_named_in(message: &str) -> Vec<String> {
    let mut rules: Vec<String> = Vec::new();
    for piece in message.split('(').skip(1) {
        let Some((inside, _)) = piece.split_once(')') else {
            continue;
        };
        let ids: Vec<&str> = inside.split(',').map(str::trim).collect();
        if !ids.iter().all(|id| is_rule_id(id)) {
            continue;
        }
        for id in ids {
            if !rules.iter().any(|r| r == id) {
                rules.push(id.to_owned());
            }
        }
    }
    rules
}

/// The part of a scenario's reason that its failing step wrote, without the after-hook's
/// findings appended to it.
pub fn step_failure(reason: &str) -> &str {
    match reason.find("; the After hook failed: ") {
        Some(at) => &reason[..at],
        None => reason,
    }
}

/// The tags that name contract rules (`R-KEY-4`, `D-5`, `PR-…`), in order.
pub fn rule_tags(tags: &[String]) -> Vec<String> {
    tags.iter()
        .filter(|t| t.starts_with("R-") || t.starts_with("PR-") || t.starts_with("D-"))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case("secret leak (R-SEC-14): x (R-SEC-14)", &["R-SEC-14"])]
    #[case("condition type \"X\" is not in the contract (R-ST-9) (a note)", &["R-ST-9"])]
    #[case("the leak check could not run: (timeout)", &[])]
    #[case("key carries tags {} (R-KEY-3, R-KEY-13); (R-ST-8)", &["R-KEY-3", "R-KEY-13", "R-ST-8"])]
    #[case("(R-KEY-3, see below)", &[])]
    fn rules_named_in_findings(#[case] message: &str, #[case] rules: &[&str]) {
        assert_eq!(rules_named_in(message), rules);
    }
}
