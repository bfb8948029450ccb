//! Legal variants run together. Each legal variant must pass the whole suite (or every scenario
//! its change can reach), and one suite run per variant would cost one whole suite each. Legal
//! changes combine into a legal operator, so the variants that apply together and start the same
//! way are built as one operator, a *stack*, and run once. A stack that passes clears every
//! member; a stack that fails has each member re-run alone on the scenarios it failed, so that
//! the verdict still names the variant (and a failure no member shows alone is the
//! combination's, reported as the stack's).
use std::collections::BTreeSet;

use super::{Breakage, Variant};

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

    #[test]
    fn failed_scenarios_are_selected_by_their_exact_names() {
        let regex = Stack::name_regex(["A key (for 1.2)", "B", "A key (for 1.2)"].into_iter());
        assert_eq!(regex, r"^(A key \(for 1\.2\)|B)$");
        let compiled = regex::Regex::new(&regex).expect("compiles");
        assert!(compiled.is_match("B") && !compiled.is_match("BB"));
    }
}
