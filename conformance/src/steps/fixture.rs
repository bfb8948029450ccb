//! The control-plane fixture and its variations (prerequisites, entitlement).
//!
//! "A Ready control plane with operator access" is what the tutorial's prerequisites ask for:
//! a CoderControlPlane whose status (written through the /status subresource, as its own
//! operator would) says phase Ready, the fake coderd's URL, operator access ready, the operator
//! token Secret, and a fresh `entitled` entitlement check.
use anyhow::{Context as _, bail};
use cucumber::gherkin::Step;
use cucumber::{given, when};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::{docstring_yaml, str_at};
use crate::world::{CONTROL_PLANE, FIELD_MANAGER, OPERATOR_TOKEN_SECRET, ProvisionerWorld};

/// RFC 3339 "now" with second precision, as Kubernetes `metav1.Time` is written; truncated,
/// never rounded up, so the stamp is never in the future.
pub fn now_rfc3339() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// Creates the fixture control plane (or checks the existing one given with `--control-plane`).
pub async fn ready_control_plane(
    world: &mut ProvisionerWorld,
    organization: Option<&str>,
) -> anyhow::Result<()> {
    if let Some(existing) = world.env.existing_control_plane.clone() {
        return check_existing_control_plane(world, &existing.name).await;
    }
    world.create_scenario_coderd(organization).await?;
    world.write_operator_token_secret().await?;
    let url = world.env.coderd.url.clone();
    create_ready_control_plane(world, CONTROL_PLANE, OPERATOR_TOKEN_SECRET, &url).await
}

/// A CoderControlPlane `name` whose status (written through /status, as its own operator would)
/// says Ready, the coderd URL `url`, operator access through `token_secret`, and a fresh
/// `entitled` check.
async fn create_ready_control_plane(
    world: &ProvisionerWorld,
    name: &str,
    token_secret: &str,
    url: &str,
) -> anyhow::Result<()> {
    let control_plane = json!({
        "apiVersion": "coder.com/v1alpha1",
        "kind": "CoderControlPlane",
        "metadata": {"name": name, "namespace": world.namespace},
        "spec": match &world.env.daemon_image {
            Some(image) => json!({"image": image}),
            None => json!({}),
        },
    });
    let api = world.control_planes();
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&control_plane),
    )
    .await
    .with_context(|| format!("creating the CoderControlPlane {name}"))?;
    let status = json!({"status": {
        "phase": "Ready",
        "url": url,
        "operatorAccessReady": true,
        "operatorTokenSecretRef": {"name": token_secret, "key": "token"},
        "externalProvisionerDaemonsEntitlement": "entitled",
        "entitlementsLastChecked": now_rfc3339(),
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("writing the CoderControlPlane {name}'s status"))?;
    Ok(())
}

async fn check_existing_control_plane(world: &ProvisionerWorld, name: &str) -> anyhow::Result<()> {
    let control_plane = world
        .control_planes()
        .get_opt(name)
        .await?
        .with_context(|| format!("--control-plane {}/{name} does not exist", world.namespace))?;
    let control_plane = serde_json::to_value(control_plane)?;
    let phase = str_at(&control_plane, "/status/phase");
    let access = control_plane
        .pointer("/status/operatorAccessReady")
        .and_then(Value::as_bool);
    if phase != Some("Ready") || access != Some(true) {
        bail!(
            "control plane {name} is not usable: phase {phase:?}, operatorAccessReady {access:?}"
        );
    }
    Ok(())
}

pub async fn patch_control_plane_status(
    world: &ProvisionerWorld,
    patch: &Value,
) -> anyhow::Result<()> {
    patch_named_control_plane_status(world, CONTROL_PLANE, patch).await
}

/// JSON merge patch of the status of the scenario's control plane `name`.
pub async fn patch_named_control_plane_status(
    world: &ProvisionerWorld,
    name: &str,
    patch: &Value,
) -> anyhow::Result<()> {
    world
        .control_planes()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .with_context(|| format!("writing the CoderControlPlane {name}'s status"))?;
    Ok(())
}

/// A second control plane beside the fixture, Ready, with an operator token of its own (another
/// owner in the fake coderd): faults scoped to the scenario's token do not reach it.
#[given(expr = "a second Ready control plane {string} with its own operator token")]
async fn a_second_ready_control_plane(
    world: &mut ProvisionerWorld,
    name: String,
) -> anyhow::Result<()> {
    if world.env.existing_control_plane.is_some() {
        bail!("a second control plane needs the suite's own fixture (not --control-plane)");
    }
    let token = world
        .admin()?
        .add_user(
            &format!("conf-{}-{name}", world.id),
            fake_coderd::UserRole::Owner,
        )
        .await
        .context("creating the second control plane's coderd owner")?;
    world.knows_operator_token(&token);
    let secret_name = format!("{name}-operator-token");
    world.write_token_secret(&secret_name, &token).await?;
    let url = world.env.coderd.url.clone();
    create_ready_control_plane(world, &name, &secret_name, &url).await
}

/// The name of the control plane of other coderd `index`: `coderd-b-control-plane`, `-c-`, ….
pub fn other_control_plane_name(index: usize) -> String {
    let letter = char::from(b'b' + u8::try_from(index).unwrap_or(0));
    format!("coderd-{letter}-control-plane")
}

/// The scenario on another coderd of the same host (issue 38's environment shapes), made once:
/// its organizations under the same names as on the fake (other ids: every coderd numbers its
/// own), an owner user, and a Ready control plane `coderd-<n>-control-plane` publishing that
/// coderd's URL, with the owner's token. Returns the control plane's name.
pub async fn other_coderd_control_plane(
    world: &mut ProvisionerWorld,
    index: usize,
) -> anyhow::Result<String> {
    if let Some(made) = world.other_coderds.iter().find(|o| o.index == index) {
        return Ok(made.control_plane.clone());
    }
    let coderd = world
        .env
        .other_coderds
        .get(index)
        .with_context(|| format!("this tier has no other coderd number {}", index + 1))?;
    let (url, admin) = (
        coderd.url.clone(),
        coderd
            .admin
            .clone()
            .context("another coderd without an admin API")?,
    );
    let mut names = vec![world.scenario_coderd()?.organization.clone()];
    names.extend(
        world
            .second_organization
            .iter()
            .map(|(name, _)| name.clone()),
    );
    let mut organizations = Vec::new();
    for name in names {
        let made = admin
            .add_organization(&name)
            .await
            .with_context(|| format!("creating organization {name} on another coderd"))?;
        organizations.push((made.name, made.id.to_string()));
    }
    let token = admin
        .add_user(&format!("conf-{}", world.id), fake_coderd::UserRole::Owner)
        .await
        .context("creating the scenario's owner on another coderd")?;
    // The fixture control plane's token is an owner's there too, as for a coderd that moved to
    // this URL: the fixture's URL may move here.
    let mut moved = fake_coderd::SeedUser::new(
        &format!("conf-{}-moved", world.id),
        fake_coderd::UserRole::Owner,
    );
    moved.token = Some(world.scenario_coderd()?.session_token().to_owned());
    admin
        .add_user_with(&moved)
        .await
        .context("giving another coderd the fixture's operator token")?;
    world.knows_operator_token(&token);
    let control_plane = other_control_plane_name(index);
    let secret_name = format!("{control_plane}-operator-token");
    world.write_token_secret(&secret_name, &token).await?;
    create_ready_control_plane(world, &control_plane, &secret_name, &url).await?;
    world.other_coderds.push(crate::world::OtherScenarioCoderd {
        index,
        control_plane: control_plane.clone(),
        organizations,
        token_fingerprint: fake_coderd::fingerprint(&token),
    });
    Ok(control_plane)
}

#[given("a Ready control plane with operator access")]
async fn a_ready_control_plane(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    ready_control_plane(world, None).await
}

/// Changes the control plane's status with a YAML merge patch (`null` removes a field).
#[given("the control plane status is changed to:")]
#[when("the control plane status is changed to:")]
async fn control_plane_status_changed(
    world: &mut ProvisionerWorld,
    step: &Step,
) -> anyhow::Result<()> {
    world.mark_action().await?;
    let text = super::children::expand(world, step.docstring.as_deref().unwrap_or_default());
    let patch: Value = serde_saphyr::from_str(&text).context("the docstring is not valid YAML")?;
    patch_control_plane_status(world, &json!({ "status": patch })).await
}

#[given("the control plane's spec is changed to:")]
async fn control_plane_spec_changed(
    world: &mut ProvisionerWorld,
    step: &Step,
) -> anyhow::Result<()> {
    let spec = docstring_yaml(world, step)?;
    patch_control_plane_spec(world, spec).await
}

/// On real clusters the fixture gives the control plane the stub daemon image (so provisioner
/// pods can start); scenarios about the default image remove it again. A no-op on the local tier.
#[given("the control plane's spec has no image")]
async fn control_plane_without_image(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    patch_control_plane_spec(world, json!({ "image": null })).await
}

/// JSON merge patch of the fixture control plane's spec.
async fn patch_control_plane_spec(world: &ProvisionerWorld, spec: Value) -> anyhow::Result<()> {
    world
        .control_planes()
        .patch(
            CONTROL_PLANE,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .context("changing the CoderControlPlane spec")?;
    Ok(())
}

#[given("the control plane's entitlement check is older than two minutes")]
async fn stale_entitlement(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    stale_entitlement_saying(world, "unknown".to_owned()).await
}

/// R-ENT-3: a check at least two minutes old is not trusted, whatever it said.
#[given(expr = "the control plane's {string} entitlement check is older than two minutes")]
async fn stale_entitlement_saying(
    world: &mut ProvisionerWorld,
    value: String,
) -> anyhow::Result<()> {
    let patch = json!({"status": {
        "externalProvisionerDaemonsEntitlement": value,
        "entitlementsLastChecked": "2020-01-01T00:00:00Z",
    }});
    patch_control_plane_status(world, &patch).await
}

#[given("the operator token Secret does not exist")]
async fn no_operator_token_secret(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let api: Api<Secret> = world.api();
    api.delete(OPERATOR_TOKEN_SECRET, &DeleteParams::default())
        .await
        .context("deleting the operator token Secret")?;
    Ok(())
}

/// R-PRE-9's other shapes: the token Secret is there, but its `token` key is missing or empty.
#[given(expr = "the operator token Secret holds {word} token")]
async fn operator_token_shape(world: &mut ProvisionerWorld, shape: String) -> anyhow::Result<()> {
    let data = match shape.as_str() {
        "no" => json!({"token": null, "other": "bm90LWEtdG9rZW4="}),
        "an-empty" => json!({"token": ""}),
        other => bail!("unknown token shape {other:?} (no, an-empty)"),
    };
    let written = world
        .api::<Secret>()
        .patch(
            OPERATOR_TOKEN_SECRET,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "data": data })),
        )
        .await
        .context("rewriting the operator token Secret")?;
    world.suite_wrote_secret(&written);
    Ok(())
}

#[when("the operator token Secret is deleted")]
async fn operator_token_deleted(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    no_operator_token_secret(world).await
}

#[when("the control plane is deleted")]
async fn control_plane_deleted(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    world
        .control_planes()
        .delete(CONTROL_PLANE, &DeleteParams::default())
        .await
        .context("deleting the CoderControlPlane")?;
    Ok(())
}

#[given("no control plane exists")]
async fn no_control_plane(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    // Nothing to create; the step states the precondition and checks it.
    if world
        .control_planes()
        .get_opt(CONTROL_PLANE)
        .await?
        .is_some()
    {
        bail!(
            "a CoderControlPlane {CONTROL_PLANE} already exists in {}",
            world.namespace
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_second_precision_utc() {
        let now = super::now_rfc3339();
        assert!(now.ends_with('Z') && !now.contains('.'), "{now}");
    }
}
