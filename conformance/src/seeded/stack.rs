//! Legal variants run together. Each legal variant must pass the whole suite (or every scenario
//! its change can reach), and one suite run per variant would cost one whole suite each. Legal
//! changes combine into a legal operator, so the variants that apply together and start the same
//! way are built as one operator, a *stack*, and run once. A stack that passes clears every
//! member; a stack that fails has each member re-run alone on the scenarios it failed, so that
//! the verdict still names the variant (and a failure no member shows alone is the
//! combination's, reported as the stack's).
use std::collections::BTreeSet;

use super::{
    Breakage, RunOutcome, Variant, Verdict, legal_verdict, problem_list, scenario_problems,
};

/// Legal variants built and run as one operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// The members' changes as one variant: their diffs one after another (`git apply` takes a
    /// file patched twice in one input), the start commands of the member that sets them.
    pub combined: Variant,
    pub members: Vec<Variant>,
}

impl Stack {
    /// A stack of one runs the variant as it is.
    pub fn alone(variant: &Variant) -> Self {
        Self {
            combined: variant.clone(),
            members: vec![variant.clone()],
        }
    }

    /// The stack of `members` (≥ 1), the `number`th of the run.
    pub fn of(members: Vec<Variant>, number: usize) -> Self {
        if let [only] = members.as_slice() {
            return Self::alone(only);
        }
        let names: Vec<&str> = members.iter().map(|v| v.name.as_str()).collect();
        let permits: BTreeSet<String> = members.iter().flat_map(|v| v.permits.clone()).collect();
        let first =
            |field: fn(&Variant) -> &Option<String>| members.iter().find_map(|v| field(v).clone());
        let combined = Variant {
            name: format!("stack-{number}"),
            breakage: Breakage::Legal,
            breaks: Vec::new(),
            consequences: Vec::new(),
            scenarios: members[0].scenarios.clone(),
            permits: permits.into_iter().collect(),
            operator_cmd: first(|v| &v.operator_cmd),
            replica_cmd: first(|v| &v.replica_cmd),
            has_diff: members.iter().any(|v| v.has_diff),
            origin: format!("the stack of {}", names.join(", ")),
            patch: members.iter().map(|v| diff_of(&v.patch)).collect(),
        };
        Self { combined, members }
    }

    /// Whether `candidate` may run in this stack, as far as its header tells: the same scenarios
    /// (a variant whose author narrowed them runs only with its like), and no start command other
    /// than one a member already gives. Whether its diff applies on top is the caller's check.
    pub fn may_take(&self, candidate: &Variant) -> bool {
        let agrees = |field: fn(&Variant) -> &Option<String>| match field(candidate) {
            None => true,
            Some(line) => self
                .members
                .iter()
                .all(|m| field(m).as_ref().is_none_or(|own| own == line)),
        };
        self.members[0].scenarios == candidate.scenarios
            && agrees(|v| &v.operator_cmd)
            && agrees(|v| &v.replica_cmd)
    }

    /// The stack with `candidate` added (it keeps this stack's number).
    pub fn with(&self, candidate: &Variant, number: usize) -> Self {
        let mut members = self.members.clone();
        members.push(candidate.clone());
        Self::of(members, number)
    }

    /// A regex for `run --name` selecting exactly the scenarios named (outline rows share
    /// their outline's name, so all of its rows run).
    pub fn name_regex<'a>(names: impl Iterator<Item = &'a str>) -> String {
        let names: BTreeSet<String> = names.map(regex::escape).collect();
        format!("^({})$", names.into_iter().collect::<Vec<_>>().join("|"))
    }
}

/// A failure of a legal stack that none of its members shows alone. The members' changes
/// together make a legal operator too, so it is a false failure of the suite like any other,
/// named by the stack and its members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackOnly {
    pub stack: String,
    pub members: Vec<String>,
    /// What failed together and in no member alone.
    pub problems: String,
}

impl std::fmt::Display for StackOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.stack, self.members.join(", "))
    }
}

/// What a failed stack's run (`together`) and its members' runs `alone` (each on the scenarios
/// the stack failed) show: the stack's failures that no member shows alone, if any. When the
/// stack failed as a whole (stopped, nothing passed) rather than on scenarios, that is its own
/// failure once every member passes alone. A member run that ended in an error proves nothing,
/// and its error is its verdict.
pub fn stack_only(
    stack: &Stack,
    together: &RunOutcome,
    alone: &[&RunOutcome],
) -> Option<StackOnly> {
    let RunOutcome::Report {
        failed, skipped, ..
    } = together
    else {
        return None;
    };
    let mut failed_alone = BTreeSet::new();
    for outcome in alone {
        let RunOutcome::Report {
            failed, skipped, ..
        } = outcome
        else {
            return None;
        };
        failed_alone.extend(scenario_problems(failed, skipped).map(|(s, _)| s.name.as_str()));
    }
    let only_together: Vec<String> = scenario_problems(failed, skipped)
        .filter(|(scenario, _)| !failed_alone.contains(scenario.name.as_str()))
        .map(|(_, problem)| problem)
        .collect();
    let problems = if only_together.is_empty() {
        let every_member_passes = alone
            .iter()
            .all(|outcome| matches!(legal_verdict(outcome), Verdict::Passed { .. }));
        match legal_verdict(together) {
            Verdict::FalselyFailed(problems) if every_member_passes => problems,
            _ => return None,
        }
    } else {
        problem_list(only_together)
    };
    Some(StackOnly {
        stack: stack.combined.name.clone(),
        members: stack.members.iter().map(|m| m.name.clone()).collect(),
        problems,
    })
}

/// The line CI reads about the legal variants: how many passed, alone or in their stacks (a
/// member of a stack that failed passes when it passes alone where the stack failed), and the
/// false failures only a stack shows, each named.
pub fn legal_summary(verdicts: &[&(Variant, Verdict)], stack_only: &[StackOnly]) -> String {
    let passed = verdicts
        .iter()
        .filter(|(_, verdict)| matches!(verdict, Verdict::Passed { .. }))
        .count();
    let falsely = verdicts
        .iter()
        .filter(|(_, verdict)| matches!(verdict, Verdict::FalselyFailed(_)))
        .count();
    let errors = verdicts.len() - passed - falsely;
    let mut line = format!(
        "legal variants: {passed} of {} passed alone or in their stacks",
        verdicts.len()
    );
    let others: Vec<String> = [(falsely, "falsely failed alone"), (errors, "with an error")]
        .into_iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, what)| format!("{count} {what}"))
        .collect();
    if !others.is_empty() {
        line.push_str(&format!(" ({})", others.join(", ")));
    }
    match stack_only {
        [] => line.push_str("; 0 stack-only false failures"),
        failures => line.push_str(&format!(
            "; {} stack-only false failure(s): {}",
            failures.len(),
            failures
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )),
    }
    line
}

/// The diff part of a patch file: from its first `diff --git` on (empty for a header-only one).
fn diff_of(patch: &str) -> &str {
    patch.find("diff --git").map_or("", |start| &patch[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIFF: &str = "diff --git a/operator/src/x.rs b/operator/src/x.rs\n--- a/operator/src/x.rs\n+++ b/operator/src/x.rs\n@@ -1 +1 @@\n-a\n+b\n";

    fn legal(name: &str, extra: &str, diff: bool) -> Variant {
        let text = format!(
            "# name: {name}\n# permits: D-13\n{extra}{}",
            if diff { DIFF } else { "" }
        );
        Variant::parse(name, &text).expect("parses")
    }

    #[test]
    fn a_stack_joins_the_diffs_and_takes_the_one_start_command() {
        let plain = legal("plain", "", true);
        let started = legal(
            "started",
            "# operator-cmd: {operator} run --log-format json\n",
            false,
        );
        let stack = Stack::of(vec![plain.clone(), started.clone()], 2);
        assert_eq!(stack.combined.name, "stack-2");
        assert_eq!(
            stack.combined.patch, DIFF,
            "headers dropped, the one diff kept"
        );
        assert_eq!(
            stack.combined.operator_cmd.as_deref(),
            Some("{operator} run --log-format json")
        );
        assert!(stack.combined.has_diff && stack.combined.is_legal());
        assert_eq!(stack.combined.origin, "the stack of plain, started");
        assert_eq!(
            Stack::of(vec![plain.clone()], 1).combined,
            plain,
            "one member runs as itself"
        );
    }

    #[test]
    fn other_start_commands_and_other_scenarios_do_not_stack() {
        let json = legal(
            "json",
            "# operator-cmd: {operator} run --log-format json\n",
            false,
        );
        let stack = Stack::alone(&json);
        assert!(stack.may_take(&legal("plain", "", true)));
        assert!(stack.may_take(&legal(
            "same",
            "# operator-cmd: {operator} run --log-format json\n",
            false
        )));
        assert!(!stack.may_take(&legal(
            "other",
            "# operator-cmd: {operator} run --field-manager x\n",
            false
        )));
        assert!(!stack.may_take(&legal("narrow", "# scenarios: @leader-election\n", true)));
        assert!(
            stack.may_take(&legal(
                "replica",
                "# replica-cmd: {operator} run --leader-election=true\n",
                false
            )),
            "a replica command alone does not contradict an operator command"
        );
    }

    fn run(passed: &[usize], failed: &[usize], aborted: Option<&str>) -> RunOutcome {
        let scenarios = |lines: &[usize]| {
            lines
                .iter()
                .map(|line| super::super::ScenarioRef {
                    feature: "f.feature".into(),
                    line: *line,
                    name: format!("s{line}"),
                    reason: Some(format!("step {line} failed")),
                    failed_rules: vec!["R-ST-4".into()],
                })
                .collect()
        };
        RunOutcome::Report {
            passed: scenarios(passed),
            failed: scenarios(failed),
            skipped: Vec::new(),
            aborted: aborted.map(str::to_owned),
        }
    }

    fn pair() -> Stack {
        Stack::of(vec![legal("a", "", true), legal("b", "", true)], 3)
    }

    #[test]
    fn a_failure_no_member_shows_alone_is_the_stacks_own() {
        let together = run(&[1], &[2, 3], None);
        let found = stack_only(
            &pair(),
            &together,
            &[&run(&[3], &[2], None), &run(&[2, 3], &[], None)],
        )
        .expect("s3 fails only together");
        assert_eq!(found.to_string(), "stack-3 (a, b)");
        assert!(
            found.problems.contains("\"s3\" failed on R-ST-4")
                && !found.problems.contains("\"s2\""),
            "{}",
            found.problems
        );
        let each_passes = run(&[2, 3], &[], None);
        let found = stack_only(&pair(), &together, &[&each_passes, &each_passes])
            .expect("both fail only together");
        assert!(found.problems.contains("\"s2\"") && found.problems.contains("\"s3\""));
    }

    #[test]
    fn a_failure_a_member_shows_alone_is_that_members() {
        let together = run(&[1], &[2], None);
        assert_eq!(
            stack_only(
                &pair(),
                &together,
                &[&run(&[], &[2], None), &run(&[2], &[], None)]
            ),
            None
        );
        let error = RunOutcome::Error("the build failed".into());
        assert_eq!(
            stack_only(&pair(), &together, &[&error, &run(&[2], &[], None)]),
            None,
            "a member that could not be run proves nothing"
        );
    }

    #[test]
    fn a_stack_stopped_as_a_whole_fails_on_its_own_when_each_member_passes() {
        let together = run(&[1], &[], Some("the operator exited"));
        let passes = run(&[1, 2], &[], None);
        let found = stack_only(&pair(), &together, &[&passes, &passes]).expect("stack-only");
        assert!(
            found
                .problems
                .contains("the run was stopped: the operator exited")
        );
        let fails = run(&[1], &[2], None);
        assert_eq!(stack_only(&pair(), &together, &[&passes, &fails]), None);
    }

    #[test]
    fn the_summary_counts_stack_only_failures_and_names_them() {
        let passed = Verdict::Passed {
            passed: 3,
            skipped: 0,
        };
        let verdicts = [
            (legal("a", "", true), passed.clone()),
            (legal("b", "", true), passed.clone()),
            (
                legal("c", "", true),
                Verdict::FalselyFailed("s2 failed".into()),
            ),
        ];
        let all: Vec<&(Variant, Verdict)> = verdicts.iter().collect();
        let failure = StackOnly {
            stack: "stack-3".into(),
            members: vec!["a".into(), "b".into()],
            problems: "s3 failed".into(),
        };
        assert_eq!(
            legal_summary(&all, std::slice::from_ref(&failure)),
            "legal variants: 2 of 3 passed alone or in their stacks (1 falsely failed alone); 1 stack-only false failure(s): stack-3 (a, b)"
        );
        assert_eq!(
            legal_summary(&all[..2], &[]),
            "legal variants: 2 of 2 passed alone or in their stacks; 0 stack-only false failures"
        );
        let errored = [(legal("d", "", true), Verdict::Error("no build".into()))];
        assert_eq!(
            legal_summary(
                &errored.iter().collect::<Vec<_>>(),
                &[failure.clone(), failure]
            ),
            "legal variants: 0 of 1 passed alone or in their stacks (1 with an error); 2 stack-only false failure(s): stack-3 (a, b); stack-3 (a, b)"
        );
    }

    #[test]
    fn failed_scenarios_are_selected_by_their_exact_names() {
        let regex = Stack::name_regex(["A key (for 1.2)", "B", "A key (for 1.2)"].into_iter());
        assert_eq!(regex, r"^(A key \(for 1\.2\)|B)$");
        let compiled = regex::Regex::new(&regex).expect("compiles");
        assert!(compiled.is_match("B") && !compiled.is_match("BB"));
    }
}
