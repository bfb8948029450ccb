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

/// R-CRD-3 fixes what plain `kubectl get <resource>` prints: the columns of the Table the API
/// server returns whose priority is 0 (priority 1 shows only with `-o wide`). Each expected row
/// (name, type, jsonPath, the last from the CRD since a Table does not carry it) must be among
/// them; other columns, wide ones and short names are the implementation's to add.
#[then(expr = "`kubectl get {word}` shows, among its columns:")]
async fn plain_get_columns(
    world: &mut ProvisionerWorld,
    resource: String,
    step: &Step,
) -> anyhow::Result<()> {
    let crd = crd_of_resource(world, &resource).await?;
    let crd_name = crd.metadata.name.clone().unwrap_or_default();
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == "v1alpha1")
        .ok_or_else(|| anyhow!("CRD {crd_name} has no version v1alpha1"))?;
    let path = format!(
        "/apis/{}/{}/namespaces/{}/{}",
        crd.spec.group, version.name, world.namespace, crd.spec.names.plural
    );
    let request = http::Request::get(&path)
        .header(
            http::header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        )
        .body(Vec::new())
        .context("building the Table request")?;
    let table: Value = world
        .client()
        .request(request)
        .await
        .with_context(|| format!("GET {path} as a Table, as kubectl get asks"))?;
    let json_paths: Vec<(String, String)> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.json_path.clone()))
        .collect();
    let shown = plain_columns(&table, &json_paths);
    let expected: Vec<Vec<String>> = super::table_rows(step)?.into_iter().skip(1).collect();
    let missing = missing_columns(&expected, &shown);
    if !missing.is_empty() {
        bail!(
            "kubectl get {resource} does not show {} among its columns {}",
            Value::from(missing.iter().map(|c| c.join(" ")).collect::<Vec<_>>()),
            Value::from(shown.iter().map(|c| c.join(" ")).collect::<Vec<_>>())
        );
    }
    Ok(())
}

/// The CRD whose plural, singular, kind or short names answer `resource`, as kubectl resolves it.
async fn crd_of_resource(
    world: &ProvisionerWorld,
    resource: &str,
) -> anyhow::Result<CustomResourceDefinition> {
    let api: Api<CustomResourceDefinition> = Api::all(world.client());
    let mut found: Vec<CustomResourceDefinition> = api
        .list(&Default::default())
        .await
        .context("listing the CRDs")?
        .items
        .into_iter()
        .filter(|crd| {
            let names = &crd.spec.names;
            std::iter::once(&names.plural)
                .chain(&names.singular)
                .chain(names.short_names.iter().flatten())
                .any(|name| name == resource)
                || names.kind.eq_ignore_ascii_case(resource)
        })
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!("no CRD names the resource {resource:?}"),
        _ => bail!("{} CRDs name the resource {resource:?}", found.len()),
    }
}

/// The columns of an API server Table (`meta.k8s.io/v1`) that plain `kubectl get` prints
/// (priority 0), as `[name, type, jsonPath]`, the jsonPath from `json_paths` (the CRD's printer
/// columns by name; empty for a column the CRD does not declare, such as `Name`).
fn plain_columns(table: &Value, json_paths: &[(String, String)]) -> Vec<[String; 3]> {
    let text = |column: &Value, field: &str| {
        column
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    table
        .get("columnDefinitions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|column| column.get("priority").and_then(Value::as_i64).unwrap_or(0) == 0)
        .map(|column| {
            let name = text(column, "name");
            let json_path = json_paths
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, path)| path.clone())
                .unwrap_or_default();
            [name, text(column, "type"), json_path]
        })
        .collect()
}

/// The expected `[name, type, jsonPath]` rows not among `shown`. kubectl prints a column's name
/// in capitals, so names compare without case.
fn missing_columns<'a>(expected: &'a [Vec<String>], shown: &[[String; 3]]) -> Vec<&'a Vec<String>> {
    expected
        .iter()
        .filter(|row| {
            !shown.iter().any(|column| {
                row.len() == 3
                    && column[0].eq_ignore_ascii_case(&row[0])
                    && column[1] == row[1]
                    && column[2] == row[2]
            })
        })
        .collect()
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
    use super::{expand_repeats, field_problem, field_schema, missing_columns, plain_columns};
    use serde_json::json;

    /// R-CRD-3 as a correct operator may meet it: a wide column and an extra plain one beside the
    /// three it names (a whole-list comparison failed such an operator).
    #[test]
    fn the_columns_plain_kubectl_get_prints_are_the_priority_0_ones() {
        let table = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "rows": [],
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Phase", "type": "string", "priority": 0},
            {"name": "Replicas", "type": "integer"},
            {"name": "Key", "type": "string", "priority": 1},
            {"name": "Control Plane", "type": "string", "priority": 0},
            {"name": "Age", "type": "date", "priority": 0},
        ]});
        let paths: Vec<(String, String)> = [
            ("Phase", ".status.phase"),
            ("Replicas", ".status.readyReplicas"),
            ("Key", ".status.provisionerKeyName"),
            ("Control Plane", ".spec.controlPlaneRef.name"),
            ("Age", ".metadata.creationTimestamp"),
        ]
        .map(|(n, p)| (n.to_owned(), p.to_owned()))
        .into();
        let shown = plain_columns(&table, &paths);
        let names: Vec<&str> = shown.iter().map(|c| c[0].as_str()).collect();
        assert_eq!(names, ["Name", "Phase", "Replicas", "Control Plane", "Age"]);
        let row = |cells: [&str; 3]| cells.map(str::to_owned).to_vec();
        let rule = [
            row(["Phase", "string", ".status.phase"]),
            row(["Replicas", "integer", ".status.readyReplicas"]),
            row(["Age", "date", ".metadata.creationTimestamp"]),
        ];
        assert!(missing_columns(&rule, &shown).is_empty());
        let wide_only = [row(["Key", "string", ".status.provisionerKeyName"])];
        assert_eq!(missing_columns(&wide_only, &shown), [&wide_only[0]]);
        let other_path = [row(["Replicas", "integer", ".spec.replicas"])];
        assert_eq!(missing_columns(&other_path, &shown), [&other_path[0]]);
        let capitals = [row(["PHASE", "string", ".status.phase"])];
        assert!(missing_columns(&capitals, &shown).is_empty());
    }

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
