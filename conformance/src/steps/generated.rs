//! Steps of the generated cases ([`crate::cases`]): apply the case of a seed, let it settle,
//! hold it to the contract oracle, change it once, and count its key requests against what the
//! change can justify. Every failure names the seed and the case.
use anyhow::{Context as _, anyhow};
use cucumber::{then, when};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::cases::{self, Case, Change};
use crate::invariants::oracle;
use crate::wait;
use crate::world::{CONTROL_PLANE, FIELD_MANAGER, ProvisionerWorld};

/// The seed, case and change of the scenario, kept for later steps and failure messages.
pub struct Generated {
    pub seed: u64,
    pub case: Case,
    pub change: Option<Change>,
}

impl Generated {
    pub fn describe(&self) -> String {
        cases::describe(self.seed, &self.case, self.change.as_ref())
    }
}

/// The second control plane of the generated scenarios' Background.
const SECOND_CONTROL_PLANE: &str = "other-control-plane";

fn context(world: &ProvisionerWorld) -> anyhow::Result<cases::Context> {
    let own = world.scenario_coderd()?.organization.clone();
    let (second, _) = world.second_organization()?.clone();
    Ok(cases::Context {
        organizations: [own, second],
        control_planes: [CONTROL_PLANE.to_owned(), SECOND_CONTROL_PLANE.to_owned()],
    })
}

fn generated(world: &ProvisionerWorld) -> anyhow::Result<&Generated> {
    world.generated.as_ref().ok_or_else(|| {
        anyhow!("no generated case: start with \"a provisioner generated from seed …\"")
    })
}

#[when(expr = "the provisioner generated from seed {int} is applied")]
async fn generated_applied(world: &mut ProvisionerWorld, seed: u64) -> anyhow::Result<()> {
    world.mark_action().await?;
    let case = cases::case(seed, &context(world)?);
    let cr = json!({
        "apiVersion": "coder.com/v1alpha1",
        "kind": "CoderProvisioner",
        "metadata": {"name": case.name, "namespace": world.namespace},
        "spec": case.spec,
    });
    let long_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(5);
    let status = case.entitlement.status_patch(
        &super::fixture::now_rfc3339(),
        &jiff::Timestamp::from_second(long_ago.as_second())?.to_string(),
    );
    super::fixture::patch_control_plane_status(world, &status).await?;
    if let Some(image) = &case.control_plane_image {
        world
            .control_planes()
            .patch(
                CONTROL_PLANE,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"image": image}})),
            )
            .await
            .context("setting the control plane's image")?;
    }
    world.provisioner = case.name.clone();
    world.generated = Some(Generated {
        seed,
        case,
        change: None,
    });
    world
        .provisioners()
        .patch(
            &world.provisioner,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&cr),
        )
        .await
        .with_context(|| {
            format!(
                "applying the {}",
                generated(world)
                    .map(Generated::describe)
                    .unwrap_or_default()
            )
        })?;
    Ok(())
}

#[when("the generated provisioner's spec is changed as its seed says")]
async fn generated_changed(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    let context = context(world)?;
    let generated = world
        .generated
        .as_mut()
        .ok_or_else(|| anyhow!("no generated case"))?;
    let change = cases::change(generated.seed, &generated.case, &context);
    let patch = json!({"spec": change.patch});
    generated.change = Some(change);
    world
        .provisioners()
        .patch(
            &world.provisioner,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .context("changing the generated provisioner")?;
    Ok(())
}

/// Settled: every gate passed, the key and its Secret ready, the current generation observed.
/// Then the oracle's findings on that state (children, coderd's key) are handed to the
/// after-hook, which blames each on the rule it names, as it does with its own.
#[then("the generated provisioner settles")]
async fn generated_settles(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let described = generated(world)?.describe();
    world
        .provisioner_eventually("the generated provisioner to settle", |cr| {
            if oracle::settled(cr) {
                Ok(())
            } else {
                Err(format!(
                    "not settled: generation {}, observed {}; conditions: {}",
                    cr.pointer("/metadata/generation").unwrap_or(&Value::Null),
                    cr.pointer("/status/observedGeneration")
                        .unwrap_or(&Value::Null),
                    super::describe_conditions(cr)
                ))
            }
        })
        .await
        .with_context(|| described.clone())?;
    let findings = crate::invariants::settled_findings(world, &world.provisioner).await?;
    world
        .violations
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend(
            findings
                .into_iter()
                .map(|f| format!("at generation {}: {f}", world.generation())),
        );
    Ok(())
}

/// R-KEY-3, R-KEY-4, R-KEY-13…15: one create for the case; a change that may rotate the key at
/// most one more, and each extra key's predecessor deleted; any other change no key request.
#[then("coderd saw only the key requests the generated change justifies")]
async fn generated_key_budget(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let described = generated(world)?.describe();
    let may_rotate = generated(world)?
        .change
        .as_ref()
        .is_some_and(|c| c.may_rotate);
    let window = world.observation_window();
    let creates = super::route_template("provisionerkeys")?;
    let deletes = super::route_template("provisionerkey")?;
    let world = &*world;
    wait::stays("the key requests within budget", world.timeouts(), window, || async {
        let journal = world.journal().await?;
        let count = |method: &str, route: &str| {
            journal
                .iter()
                .filter(|e| e.method == method && e.route.as_deref() == Some(route) && (200..300).contains(&e.status))
                .count()
        };
        let (posts, removed) = (count("POST", creates), count("DELETE", deletes));
        let within = if may_rotate {
            (1..=2).contains(&posts) && removed == posts - 1
        } else {
            posts == 1 && removed == 0
        };
        Ok(if within {
            Ok(())
        } else {
            Err(format!(
                "{posts} key creates and {removed} key deletes answered 2xx, for a change that {} the key",
                if may_rotate { "may replace" } else { "must not touch" }
            ))
        })
    })
    .await
    .with_context(|| described)
}

/// R-ENT-1: a control plane whose recent check says `entitled` or `grace_period` settles the
/// entitlement; the operator asks coderd nothing about it (the second control plane's check is
/// fresh and `entitled` too).
#[then("coderd saw no entitlements request when the control plane's recent check settles it")]
async fn generated_entitlement_budget(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let generated = generated(world)?;
    if !generated.case.entitlement.settles() {
        return Ok(());
    }
    let described = generated.describe();
    let window = world.observation_window();
    let route = super::route_template("entitlements")?;
    let world = &*world;
    wait::stays(
        "no entitlements request",
        world.timeouts(),
        window,
        || async {
            let asked = world
                .journal()
                .await?
                .iter()
                .filter(|e| e.route.as_deref() == Some(route))
                .count();
            Ok(if asked == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{asked} GET {route} though the control plane's recent check settles it"
                ))
            })
        },
    )
    .await
    .with_context(|| described)
}
