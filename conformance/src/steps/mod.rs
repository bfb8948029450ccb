//! Step definitions, grouped as the feature files use them. Helpers shared by several groups
//! (reading conditions, parsing docstrings) live here and are pure.
pub mod admission;
pub mod audit;
pub mod children;
pub mod coderd;
pub mod fixture;
pub mod generated;
pub mod leadership;
pub mod provisioner;
pub mod tutorial;
pub mod write_hold;

use anyhow::{Context as _, anyhow};
use cucumber::gherkin::Step;
use serde_json::Value;

/// A step's docstring as written between the quotes: the gherkin parser keeps the line break
/// after the opening and before the closing `"""`, which are not part of the text.
pub fn docstring(step: &Step) -> Option<String> {
    step.docstring.as_deref().map(|text| {
        let text = text.strip_prefix('\n').unwrap_or(text);
        text.strip_suffix('\n').unwrap_or(text).to_owned()
    })
}

/// The YAML docstring of a step, as JSON, with the run-time placeholders expanded
/// ([`children::expand`]).
pub fn docstring_yaml(
    world: &crate::world::ProvisionerWorld,
    step: &Step,
) -> anyhow::Result<Value> {
    let text = step
        .docstring
        .as_deref()
        .ok_or_else(|| anyhow!("step \"{}\" needs a docstring", step.value))?;
    serde_saphyr::from_str(&children::expand(world, text))
        .with_context(|| format!("the docstring of step \"{}\" is not valid YAML", step.value))
}

/// The rows of a step's data table (header row included), trimmed.
pub fn table_rows(step: &Step) -> anyhow::Result<Vec<Vec<String>>> {
    let table = step
        .table
        .as_ref()
        .ok_or_else(|| anyhow!("step \"{}\" needs a data table", step.value))?;
    Ok(table
        .rows
        .iter()
        .map(|row| row.iter().map(|cell| cell.trim().to_owned()).collect())
        .collect())
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` removes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

/// One `status.conditions[]` entry of a resource.
pub fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
}

/// Renders conditions as `Type=Status Reason` lines, for failure messages.
pub fn describe_conditions(object: &Value) -> String {
    let Some(conditions) = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
    else {
        return "no conditions".to_owned();
    };
    conditions
        .iter()
        .map(|c| {
            format!(
                "{}={} {}",
                c.get("type").and_then(Value::as_str).unwrap_or("?"),
                c.get("status").and_then(Value::as_str).unwrap_or("?"),
                c.get("reason").and_then(Value::as_str).unwrap_or(""),
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn str_at<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    #[rstest]
    #[case(json!({"a": 1, "b": {"c": 2}}), json!({"b": {"c": 3, "d": 4}}), json!({"a": 1, "b": {"c": 3, "d": 4}}))]
    #[case(json!({"a": 1, "b": 2}), json!({"a": null}), json!({"b": 2}))]
    #[case(json!({"a": [1, 2]}), json!({"a": [3]}), json!({"a": [3]}))]
    fn merge_follows_rfc7386(
        #[case] mut target: Value,
        #[case] patch: Value,
        #[case] expected: Value,
    ) {
        merge(&mut target, &patch);
        assert_eq!(target, expected);
    }

    #[test]
    fn conditions_are_found_and_described() {
        let cr = json!({"status": {"conditions": [
            {"type": "A", "status": "True", "reason": "Fine"},
            {"type": "B", "status": "False", "reason": "Broken"}]}});
        assert_eq!(
            condition(&cr, "B").and_then(|c| c["reason"].as_str()),
            Some("Broken")
        );
        assert!(condition(&cr, "C").is_none());
        assert_eq!(describe_conditions(&cr), "A=True Fine, B=False Broken");
    }
}
