//! The CRDs and what the API server admits (issue 2): schema validation gives the user a clear
//! message before any operator sees a bad CoderProvisioner.
use anyhow::{Context as _, anyhow, bail};
use cucumber::gherkin::Step;
use cucumber::{then, when};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

use super::{docstring_yaml, merge};
use crate::wait;
use crate::world::ProvisionerWorld;

#[then(expr = "the CRD {string} is Established")]
async fn crd_established(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(world.client());
    wait::eventually(
        &format!("CRD {name} to be Established"),
        world.timeouts(),
        || async {
            let Some(crd) = api.get_opt(&name).await? else {
                return Ok(Err(format!("CRD {name} is not installed")));
            };
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(if established {
                Ok(())
            } else {
                Err("not Established".to_owned())
            })
        },
    )
    .await
}

/// Submits a CoderProvisioner named `admission-check` with the docstring as its whole spec
/// (dry run: admission runs, nothing is stored, no operator is involved).
#[when("a provisioner is submitted with spec:")]
async fn submitted(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    world.mark_action().await?;
    let spec = docstring_yaml(world, step)?;
    let mut cr = json!({
        "apiVersion": "coder.com/v1alpha1",
        "kind": "CoderProvisioner",
        "metadata": {"name": "admission-check", "namespace": world.namespace},
    });
    if !spec.is_null() {
        merge(&mut cr, &json!({ "spec": spec }));
    }
    let object = serde_json::from_value(cr).context("building the CoderProvisioner")?;
    submit_dry_run(world, &object, "submitting the CoderProvisioner").await
}

/// Creates `object` with server-side dry-run and records the API server's verdict.
async fn submit_dry_run(
    world: &mut ProvisionerWorld,
    object: &DynamicObject,
    what: &'static str,
) -> anyhow::Result<()> {
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    world.last_admission = Some(match world.provisioners().create(&params, object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(other) => return Err(other).context(what),
    });
    Ok(())
}

/// A spec string with `{n x c}` expanded to `n` copies of `c` (e.g. `{65 x a}`), so long values
/// stay readable in the feature file.
pub fn expand_repeats(text: &str) -> String {
    static REPEAT: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\{\s*(\d+) x ([^{}]+?)\s*\}").expect("a valid pattern")
    });
    REPEAT
        .replace_all(text, |captures: &regex::Captures<'_>| {
            let count: usize = captures[1].parse().unwrap_or(0);
            captures[2].repeat(count)
        })
        .into_owned()
}

#[when("a provisioner is submitted with a spec of:")]
async fn submitted_expanded(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let mut expanded = step.clone();
    expanded.docstring = step.docstring.as_deref().map(expand_repeats);
    submitted(world, &expanded).await
}

#[when("the sample provisioner is submitted")]
async fn sample_submitted(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    let cr = super::provisioner::sample(&world.env.repo_root, &world.namespace, None)?;
    let object = serde_json::from_value(cr).context("the sample is not a Kubernetes object")?;
    submit_dry_run(world, &object, "submitting the sample").await
}

fn admission(world: &ProvisionerWorld) -> anyhow::Result<&Result<(), String>> {
    world
        .last_admission
        .as_ref()
        .ok_or_else(|| anyhow!("no CoderProvisioner was submitted yet"))
}

#[then("the API server accepts it")]
async fn accepted(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    match admission(world)? {
        Ok(()) => Ok(()),
        Err(message) => bail!("the API server rejected it: {message}"),
    }
}

/// Each table cell must appear in the rejection message (what the user reads in kubectl).
#[then("the API server rejects it with a message mentioning:")]
async fn rejected(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let message = match admission(world)? {
        Ok(()) => bail!("the API server accepted it"),
        Err(message) => message.clone(),
    };
    let missing: Vec<String> = super::table_rows(step)?
        .into_iter()
        .filter_map(|row| row.into_iter().next())
        .filter(|text| !message.contains(text.as_str()))
        .collect();
    if !missing.is_empty() {
        bail!("the rejection {message:?} does not mention {missing:?}");
    }
    Ok(())
}

/// Printer columns (R-CRD-3) as the CRD declares them.
#[then(expr = "the CRD {string} shows the columns:")]
async fn printer_columns(
    world: &mut ProvisionerWorld,
    name: String,
    step: &Step,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(world.client());
    let crd = api
        .get(&name)
        .await
        .with_context(|| format!("reading CRD {name}"))?;
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == "v1alpha1")
        .ok_or_else(|| anyhow!("CRD {name} has no version v1alpha1"))?;
    let actual: Vec<Vec<String>> = version
        .additional_printer_columns
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|c| vec![c.name, c.type_, c.json_path])
        .collect();
    let expected: Vec<Vec<String>> = super::table_rows(step)?.into_iter().skip(1).collect();
    if actual != expected {
        bail!(
            "CRD {name} has columns {}",
            Value::from(actual.iter().map(|c| c.join(" ")).collect::<Vec<_>>())
        );
    }
    Ok(())
}

/// The OpenAPI schema of the CRD's v1alpha1 version.
async fn crd_schema(world: &ProvisionerWorld, name: &str) -> anyhow::Result<Value> {
    let api: Api<CustomResourceDefinition> = Api::all(world.client());
    let crd = api
        .get(name)
        .await
        .with_context(|| format!("reading CRD {name}"))?;
    let version = crd
        .spec
        .versions
        .into_iter()
        .find(|v| v.name == "v1alpha1")
        .ok_or_else(|| anyhow!("CRD {name} has no version v1alpha1"))?;
    let schema = version
        .schema
        .and_then(|s| s.open_api_v3_schema)
        .ok_or_else(|| anyhow!("CRD {name} has no schema"))?;
    Ok(serde_json::to_value(schema)?)
}

/// The schema of a dotted field path under `spec` or `status` (`key.name` → properties.key.properties.name).
pub fn field_schema<'a>(root: &'a Value, top: &str, path: &str) -> Option<&'a Value> {
    std::iter::once(top)
        .chain(path.split('.'))
        .try_fold(root, |schema, field| schema.get("properties")?.get(field))
}

/// Why a field's schema is not `expected_type` with `max_length` (empty: none), if it is not.
pub fn field_problem(
    schema: Option<&Value>,
    expected_type: &str,
    max_length: &str,
) -> Option<String> {
    let Some(schema) = schema else {
        return Some("is not declared".to_owned());
    };
    let actual_type = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if actual_type != expected_type {
        return Some(format!(
            "has type {actual_type:?}, expected {expected_type:?}"
        ));
    }
    let actual_max = schema
        .get("maxLength")
        .map(Value::to_string)
        .unwrap_or_default();
    (actual_max != max_length)
        .then(|| format!("has maxLength {actual_max:?}, expected {max_length:?}"))
}

/// R-CRD-4…R-CRD-10, D-4: each row's field is declared with that type and maxLength; a problem
/// names the row's rule, so that only that rule is blamed.
#[then(expr = "the CRD {string} declares these spec fields:")]
async fn declares_spec_fields(
    world: &mut ProvisionerWorld,
    name: String,
    step: &Step,
) -> anyhow::Result<()> {
    let schema = crd_schema(world, &name).await?;
    let problems: Vec<String> = super::table_rows(step)?
        .into_iter()
        .skip(1)
        .filter_map(|row| {
            let [field, kind, max, rule] = row.as_slice() else {
                return Some(format!(
                    "row {row:?} needs a field, a type, a maxLength and a rule"
                ));
            };
            field_problem(field_schema(&schema, "spec", field), kind, max)
                .map(|problem| format!("spec.{field} {problem} ({rule})"))
        })
        .collect();
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    Ok(())
}

/// R-CRD-11: no credential field (older versions had `spec.bootstrap`).
#[then(expr = "the CRD {string} declares no spec field {string}")]
async fn declares_no_spec_field(
    world: &mut ProvisionerWorld,
    name: String,
    field: String,
) -> anyhow::Result<()> {
    let schema = crd_schema(world, &name).await?;
    if field_schema(&schema, "spec", &field).is_some() {
        bail!("spec.{field} is declared");
    }
    if schema.pointer("/properties/spec/x-kubernetes-preserve-unknown-fields")
        == Some(&Value::Bool(true))
    {
        bail!("spec keeps unknown fields, so spec.{field} would be stored");
    }
    Ok(())
}

/// R-CRD-12: the status declares exactly the rows' fields, each with its type.
#[then(expr = "the CRD {string} declares exactly these status fields:")]
async fn declares_status_fields(
    world: &mut ProvisionerWorld,
    name: String,
    step: &Step,
) -> anyhow::Result<()> {
    let schema = crd_schema(world, &name).await?;
    let rows: Vec<(String, String)> = super::table_rows(step)?
        .into_iter()
        .skip(1)
        .filter_map(|row| Some((row.first()?.clone(), row.get(1)?.clone())))
        .collect();
    let mut problems: Vec<String> = rows
        .iter()
        .filter_map(|(field, kind)| {
            field_problem(field_schema(&schema, "status", field), kind, "")
                .map(|problem| format!("status.{field} {problem}"))
        })
        .collect();
    let declared = schema
        .pointer("/properties/status/properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    problems.extend(
        declared
            .into_iter()
            .filter(|field| !rows.iter().any(|(expected, _)| expected == field))
            .map(|field| format!("status.{field} is declared but not in the contract")),
    );
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{expand_repeats, field_problem, field_schema};
    use serde_json::json;

    #[test]
    fn fields_are_found_by_dotted_path_with_type_and_limit() {
        let schema = json!({"properties": {"spec": {"properties": {
            "key": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 64}}},
            "tags": {"type": "object"}}}}});
        assert_eq!(
            field_problem(field_schema(&schema, "spec", "key.name"), "string", "64"),
            None
        );
        assert!(
            field_problem(field_schema(&schema, "spec", "key.name"), "string", "128").is_some()
        );
        assert!(field_problem(field_schema(&schema, "spec", "tags"), "string", "").is_some());
        assert!(field_problem(field_schema(&schema, "spec", "image"), "string", "").is_some());
    }
    use rstest::rstest;

    #[rstest]
    #[case("name: {3 x a}", "name: aaa")]
    #[case("a: {2 x ab}-{1 x c}", "a: abab-c")]
    #[case("keep {this}", "keep {this}")]
    #[case("open { only", "open { only")]
    #[case("key: {secretName: {3 x s}}", "key: {secretName: sss}")]
    fn repeats_expand(#[case] text: &str, #[case] expected: &str) {
        assert_eq!(expand_repeats(text), expected);
    }
}
