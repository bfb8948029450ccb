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
    let spec = docstring_yaml(step)?;
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
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        let Some(len) = rest[start..].find('}') else {
            break;
        };
        let inner = &rest[start + 1..start + len];
        match inner
            .split_once(" x ")
            .and_then(|(n, c)| Some((n.trim().parse::<usize>().ok()?, c.trim())))
        {
            Some((count, unit)) => {
                out.push_str(&rest[..start]);
                out.push_str(&unit.repeat(count));
            }
            None => out.push_str(&rest[..=start + len]),
        }
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    out
}

#[when("a provisioner is submitted with a spec of:")]
async fn submitted_expanded(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let mut expanded = step.clone();
    expanded.docstring = step.docstring.as_deref().map(expand_repeats);
    submitted(world, &expanded).await
}

#[when("the sample provisioner is submitted")]
async fn sample_submitted(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::expand_repeats;
    use rstest::rstest;

    #[rstest]
    #[case("name: {3 x a}", "name: aaa")]
    #[case("a: {2 x ab}-{1 x c}", "a: abab-c")]
    #[case("keep {this}", "keep {this}")]
    #[case("open { only", "open { only")]
    fn repeats_expand(#[case] text: &str, #[case] expected: &str) {
        assert_eq!(expand_repeats(text), expected);
    }
}
