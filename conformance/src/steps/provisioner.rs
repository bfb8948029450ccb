//! Steps on the CoderProvisioner itself: applying the sample, changing and deleting it, and its
//! phase, conditions and status.
use std::path::Path;

use anyhow::{Context as _, anyhow, bail};
use cucumber::gherkin::Step;
use cucumber::{given, then, when};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::children::expand;
use super::{condition, describe_conditions, docstring_yaml, merge, str_at};
use crate::wait;
use crate::world::{CONTROL_PLANE, FIELD_MANAGER, ProvisionerWorld};

/// Path of the sample the tutorial applies, relative to the repository root.
pub const SAMPLE_PATH: &str = "config/samples/coder_v1alpha1_coderprovisioner.yaml";

/// The sample CR, moved into the scenario's namespace and organization.
pub fn sample(
    repo_root: &Path,
    namespace: &str,
    organization: Option<&str>,
) -> anyhow::Result<Value> {
    let path = repo_root.join(SAMPLE_PATH);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the sample {}", path.display()))?;
    let mut cr: Value =
        serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    merge(&mut cr, &json!({"metadata": {"namespace": namespace}}));
    if let Some(organization) = organization {
        merge(
            &mut cr,
            &json!({"spec": {"organizationName": organization}}),
        );
    }
    Ok(cr)
}

/// Applies the sample (renamed to `name` when given) with `patch` merged into it; the
/// scenario's provisioner becomes the sample unless it was renamed.
async fn apply_sample(
    world: &mut ProvisionerWorld,
    name: Option<&str>,
    patch: Option<Value>,
) -> anyhow::Result<()> {
    world.mark_action().await?;
    let organization = world.coderd.as_ref().map(|c| c.organization.clone());
    let mut cr = sample(
        &world.env.repo_root,
        &world.namespace,
        organization.as_deref(),
    )?;
    if let Some(patch) = patch {
        merge(&mut cr, &patch);
    }
    match name {
        Some(name) => merge(&mut cr, &json!({"metadata": {"name": name}})),
        None => {
            world.provisioner = str_at(&cr, "/metadata/name")
                .ok_or_else(|| anyhow!("the sample has no metadata.name"))?
                .to_owned()
        }
    }
    let name = str_at(&cr, "/metadata/name").unwrap_or_default().to_owned();
    world
        .provisioners()
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&cr),
        )
        .await
        .with_context(|| format!("applying CoderProvisioner {name}"))?;
    Ok(())
}

/// The annotation the background writer of `keep_annotating` rewrites: its value is the
/// number of writes before the current one (0, 1, 2, …).
pub const WRITER_ANNOTATION: &str = "conformance.coder.com/writer";

/// Another client writes the CR's annotations every 50 ms from now until the scenario ends, as
/// label and annotation controllers do: each write moves its resourceVersion.
fn keep_annotating(world: &mut ProvisionerWorld) {
    let api = world.provisioners();
    let name = world.provisioner.clone();
    let writer = tokio::spawn(async move {
        for n in 0u64.. {
            let patch = json!({"metadata": {"annotations": {WRITER_ANNOTATION: n.to_string()}}});
            // Failures (e.g. the CR is being deleted) only skip a write.
            let _ = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    world.background.push(writer.abort_handle());
}

#[when("the sample provisioner is applied while someone keeps annotating it")]
async fn applied_while_annotated(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    apply_sample(world, None, None).await?;
    keep_annotating(world);
    Ok(())
}

#[when("someone keeps annotating the provisioner")]
async fn someone_keeps_annotating(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    keep_annotating(world);
    Ok(())
}

#[given("the sample provisioner is applied")]
#[when("the sample provisioner is applied")]
async fn the_sample_is_applied(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    apply_sample(world, None, None).await
}

/// The sample with the docstring (YAML) merged into its spec.
#[given("the sample provisioner is applied with spec:")]
#[when("the sample provisioner is applied with spec:")]
async fn the_sample_is_applied_with(
    world: &mut ProvisionerWorld,
    step: &Step,
) -> anyhow::Result<()> {
    apply_sample(
        world,
        None,
        Some(json!({ "spec": docstring_yaml(world, step)? })),
    )
    .await
}

/// The sample under another name, as the scenario's provisioner (names at a length limit).
#[when(expr = "the sample provisioner is applied under the name {string}")]
async fn the_sample_is_applied_as(
    world: &mut ProvisionerWorld,
    name: String,
) -> anyhow::Result<()> {
    apply_sample(world, Some(&name), None).await?;
    world.provisioner = name;
    Ok(())
}

/// Another CR next to the scenario's provisioner: the sample named `name`, with the docstring
/// (placeholders expanded, so it can name the first provisioner's objects) merged into its spec.
#[when(expr = "a second provisioner {string} is applied with spec:")]
async fn second_provisioner_applied(
    world: &mut ProvisionerWorld,
    name: String,
    step: &Step,
) -> anyhow::Result<()> {
    let text = step
        .docstring
        .as_deref()
        .ok_or_else(|| anyhow!("step \"{}\" needs a docstring", step.value))?;
    let spec: Value = serde_saphyr::from_str(&expand(world, text))
        .with_context(|| format!("the docstring of step \"{}\" is not valid YAML", step.value))?;
    apply_sample(world, Some(&name), Some(json!({ "spec": spec }))).await
}

/// The sample carrying a finalizer of the suite's own, so that it stays visible while deleted
/// (R-DEL-11); the after-hook removes that finalizer whatever the outcome.
#[given(expr = "the sample provisioner is applied with the finalizer {string}")]
async fn the_sample_is_applied_held(
    world: &mut ProvisionerWorld,
    finalizer: String,
) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"finalizers": [finalizer]}});
    apply_sample(world, None, Some(patch)).await?;
    world.held.push(world.provisioner.clone());
    Ok(())
}

#[when(expr = "the finalizer {string} is removed from the provisioner")]
async fn finalizer_removed(world: &mut ProvisionerWorld, finalizer: String) -> anyhow::Result<()> {
    world.mark_action().await?;
    let cr = world
        .provisioner_json()
        .await?
        .ok_or_else(|| anyhow!("the CoderProvisioner does not exist"))?;
    let kept: Vec<&str> = cr
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|f| *f != finalizer)
        .collect();
    // The resourceVersion makes this a compare-and-swap: nobody else's finalizer is dropped.
    let patch = json!({"metadata": {
        "finalizers": kept,
        "resourceVersion": str_at(&cr, "/metadata/resourceVersion"),
    }});
    merge_patch(world, &patch)
        .await
        .with_context(|| format!("removing the finalizer {finalizer}"))?;
    Ok(())
}

/// JSON-merge-patches the scenario's CoderProvisioner; returns it as stored.
async fn merge_patch(world: &ProvisionerWorld, patch: &Value) -> kube::Result<DynamicObject> {
    world
        .provisioners()
        .patch(
            &world.provisioner,
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
}

/// After-hook: clears the finalizers of the CRs a step held, so namespace deletion can finish.
pub async fn release_held(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"finalizers": null}});
    for name in std::mem::take(&mut world.held) {
        match world
            .provisioners()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error).with_context(|| format!("CoderProvisioner {name}")),
        }
    }
    Ok(())
}

#[then(expr = "the provisioner keeps only the finalizer {string} during the observation window")]
async fn keeps_only_finalizer(
    world: &mut ProvisionerWorld,
    finalizer: String,
) -> anyhow::Result<()> {
    let what = format!("only the finalizer {finalizer}");
    let window = world.observation_window();
    world
        .provisioner_stays(&what, window, |cr| {
            let finalizers = cr
                .pointer("/metadata/finalizers")
                .cloned()
                .unwrap_or(Value::Null);
            if finalizers == json!([finalizer]) {
                Ok(())
            } else {
                Err(format!("finalizers: {finalizers}"))
            }
        })
        .await
}

#[given("the sample provisioner is Ready")]
async fn the_sample_is_ready(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    apply_sample(world, None, None).await?;
    becomes_ready(world).await
}

#[when("the provisioner spec is changed to:")]
async fn spec_changed(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    world.mark_action().await?;
    let patch = json!({ "spec": docstring_yaml(world, step)? });
    merge_patch(world, &patch)
        .await
        .context("changing the CoderProvisioner spec")?;
    Ok(())
}

#[when("the provisioner is deleted")]
async fn provisioner_deleted(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    world
        .provisioners()
        .delete(&world.provisioner, &DeleteParams::default())
        .await
        .context("deleting the CoderProvisioner")?;
    Ok(())
}

#[then("the provisioner is gone")]
async fn provisioner_gone(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    wait::eventually(
        "the CoderProvisioner to be gone (finalizer removed)",
        world.timeouts(),
        || async {
            Ok(match world.provisioner_json().await? {
                None => Ok(()),
                Some(cr) => Err(format!(
                    "it still exists with finalizers {}",
                    cr.pointer("/metadata/finalizers")
                        .cloned()
                        .unwrap_or(Value::Null)
                )),
            })
        },
    )
    .await
}

/// An update that changes nothing the operator acts on: it only causes reconciles (watch events
/// on the CR and on the control plane), which must not cause coderd calls or status writes.
#[when("the provisioner and its control plane receive unrelated updates")]
async fn unrelated_updates(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    let nudge = json!({"metadata": {"annotations": {"conformance.coder.com/nudge": world.id}}});
    let cr = merge_patch(world, &nudge)
        .await
        .context("annotating the CoderProvisioner")?;
    world
        .control_planes()
        .patch(
            CONTROL_PLANE,
            &PatchParams::default(),
            &Patch::Merge(&nudge),
        )
        .await
        .context("annotating the CoderControlPlane")?;
    let resource_version = cr.metadata.resource_version.unwrap_or_default();
    world
        .remembered
        .insert("resourceVersion".to_owned(), resource_version);
    Ok(())
}

#[then("the provisioner's status is not written again during the observation window")]
async fn status_not_written(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let expected = world
        .remembered
        .get("resourceVersion")
        .cloned()
        .ok_or_else(|| anyhow!("no earlier step remembered the CR's resourceVersion"))?;
    let what = "the CoderProvisioner's resourceVersion to stay unchanged";
    let window = world.observation_window();
    world
        .provisioner_stays(what, window, |cr| {
            let now = str_at(cr, "/metadata/resourceVersion").unwrap_or_default();
            if now == expected {
                Ok(())
            } else {
                Err(format!(
                    "resourceVersion moved from {expected} to {now} (status: {})",
                    describe_conditions(cr)
                ))
            }
        })
        .await
}

#[given("the operator is stopped")]
async fn operator_stopped(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.stop_operator().await
}

#[when("the operator is started")]
async fn operator_started(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    world.restart_operator().await
}

#[when("the operator is restarted")]
async fn operator_restarted(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    world.restart_operator().await
}

fn ready_observation(cr: &Value) -> Result<(), String> {
    let phase = str_at(cr, "/status/phase");
    let ready = cr
        .pointer("/status/readyReplicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if phase == Some("Ready") && ready >= 1 {
        Ok(())
    } else {
        Err(format!(
            "phase {phase:?}, readyReplicas {ready}, conditions: {}",
            describe_conditions(cr)
        ))
    }
}

#[then("the provisioner becomes Ready")]
async fn becomes_ready(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world
        .provisioner_promptly("the CoderProvisioner to be Ready", ready_observation)
        .await
}

/// For behaviour the contract allows a longer delay for (e.g. D-3's periodic re-check, ≤ 60 s):
/// the deadline is the longer of `seconds` (scaled by --timeout-scale via the hold window ratio)
/// and the tier's own.
#[then(expr = "the provisioner becomes Ready within {int} seconds")]
async fn becomes_ready_within(world: &mut ProvisionerWorld, seconds: u64) -> anyhow::Result<()> {
    let mut timeouts = *world.timeouts();
    timeouts.eventually = timeouts
        .eventually
        .max(std::time::Duration::from_secs(seconds));
    wait::eventually("the CoderProvisioner to be Ready", &timeouts, || async {
        Ok(match world.provisioner_json().await? {
            Some(cr) => ready_observation(&cr),
            None => Err(format!(
                "CoderProvisioner {} does not exist",
                world.provisioner
            )),
        })
    })
    .await
}

#[then("the provisioner is still Ready")]
async fn still_ready(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let window = world.observation_window();
    world
        .provisioner_stays(
            "the CoderProvisioner to stay Ready",
            window,
            ready_observation,
        )
        .await
}

#[then(expr = "the provisioner stays in phase {string} during the observation window")]
async fn stays_in_phase(world: &mut ProvisionerWorld, phase: String) -> anyhow::Result<()> {
    let what = format!("the CoderProvisioner to stay {phase}");
    // A phase that flickers leaves no trace, so this step watches a whole window of its own.
    let window = world.new_observation_window();
    world
        .provisioner_stays(&what, window, |cr| {
            let now = str_at(cr, "/status/phase");
            // A CR the operator has not touched yet has no phase: that is not Ready either.
            if now.unwrap_or("Pending") == phase {
                Ok(())
            } else {
                Err(format!(
                    "phase is {now:?}; conditions: {}",
                    describe_conditions(cr)
                ))
            }
        })
        .await
}

fn condition_observation(
    cr: &Value,
    kind: &str,
    status: &str,
    reason: Option<&str>,
) -> Result<Value, String> {
    match condition(cr, kind) {
        Some(found)
            if str_at(found, "/status") == Some(status)
                && reason.is_none_or(|reason| str_at(found, "/reason") == Some(reason)) =>
        {
            Ok(found.clone())
        }
        _ => Err(format!("conditions: {}", describe_conditions(cr))),
    }
}

#[then(expr = "the provisioner has condition {string} {string} with reason {string}")]
async fn has_condition_with_reason(
    world: &mut ProvisionerWorld,
    kind: String,
    status: String,
    reason: String,
) -> anyhow::Result<()> {
    expect_condition(world, &kind, &status, Some(&reason)).await
}

#[then(expr = "the provisioner {string} has condition {string} {string} with reason {string}")]
async fn named_has_condition_with_reason(
    world: &mut ProvisionerWorld,
    name: String,
    kind: String,
    status: String,
    reason: String,
) -> anyhow::Result<()> {
    let timeouts = *world.timeouts();
    expect_named_condition(world, &name, &kind, &status, &reason, &timeouts).await
}

async fn expect_named_condition(
    world: &ProvisionerWorld,
    name: &str,
    kind: &str,
    status: &str,
    reason: &str,
    timeouts: &wait::Timeouts,
) -> anyhow::Result<()> {
    let what = format!("{name}: condition {kind}={status} {reason}");
    world
        .provisioner_named_within(name, &what, timeouts, |cr| {
            condition_observation(cr, kind, status, Some(reason))
        })
        .await?;
    Ok(())
}

#[then(expr = "the provisioner has condition {string} {string}")]
async fn has_condition(
    world: &mut ProvisionerWorld,
    kind: String,
    status: String,
) -> anyhow::Result<()> {
    expect_condition(world, &kind, &status, None).await
}

async fn expect_condition(
    world: &mut ProvisionerWorld,
    kind: &str,
    status: &str,
    reason: Option<&str>,
) -> anyhow::Result<()> {
    let what = format!("condition {kind}={status} {}", reason.unwrap_or(""));
    let found = world
        .provisioner_promptly(&what, |cr| condition_observation(cr, kind, status, reason))
        .await?;
    world.condition_answered(kind);
    if let Some(message) = str_at(&found, "/message") {
        world
            .remembered
            .insert(format!("message:{kind}"), message.to_owned());
    }
    Ok(())
}

#[then(expr = "the {word} condition's message mentions {string}")]
async fn condition_message_mentions(
    world: &mut ProvisionerWorld,
    kind: String,
    text: String,
) -> anyhow::Result<()> {
    let message = remembered_message(world, &kind)?;
    if !message.contains(&text) {
        bail!("the {kind} message {message:?} does not mention {text:?}");
    }
    Ok(())
}

/// The message of the `kind` condition as the last condition step saw it.
fn remembered_message<'w>(world: &'w ProvisionerWorld, kind: &str) -> anyhow::Result<&'w String> {
    world
        .remembered
        .get(&format!("message:{kind}"))
        .ok_or_else(|| anyhow!("no earlier step observed a {kind} condition message"))
}

/// The exact message, for the rules that give one (R-RL-1).
#[then(expr = "the {word} condition's message is {string}")]
async fn condition_message_is(
    world: &mut ProvisionerWorld,
    kind: String,
    text: String,
) -> anyhow::Result<()> {
    let message = remembered_message(world, &kind)?;
    if *message != text {
        bail!("the {kind} message is {message:?}, not {text:?}");
    }
    Ok(())
}

#[then(expr = "the provisioner has no condition {string}")]
async fn has_no_condition(world: &mut ProvisionerWorld, kind: String) -> anyhow::Result<()> {
    let window = world.observation_window();
    world
        .provisioner_stays(
            &format!("no {kind} condition"),
            window,
            |cr| match condition(cr, &kind) {
                None => Ok(()),
                Some(found) => Err(format!("found {found}")),
            },
        )
        .await
}

/// A rule that says what a condition never is (D-15: judged on every version the namespace
/// watch saw since the scenario began, not only on those a poll met), optionally allowing one
/// reason.
#[then(
    regex = r#"^the provisioner never showed condition "(\w+)" "False"(?: with a reason other than "(\w+)")?$"#
)]
async fn never_showed_false(
    world: &mut ProvisionerWorld,
    kind: String,
    allowed: String,
) -> anyhow::Result<()> {
    let recorder = world
        .recorder
        .as_ref()
        .ok_or_else(|| anyhow!("the scenario has no namespace watch"))?;
    let shown: Vec<String> = recorder.read(|seen| {
        seen.false_conditions
            .iter()
            .filter(|(name, type_, reason)| {
                *name == world.provisioner && *type_ == kind && *reason != allowed
            })
            .map(|(_, _, reason)| reason.clone())
            .collect()
    });
    if !shown.is_empty() {
        bail!("the provisioner showed {kind}=False with reason(s) {shown:?}");
    }
    Ok(())
}

#[then("the provisioner carries the finalizer \"coder.com/provisioner-key-cleanup\"")]
async fn carries_finalizer(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world
        .provisioner_eventually("the key-cleanup finalizer", |cr| {
            let finalizers = cr
                .pointer("/metadata/finalizers")
                .cloned()
                .unwrap_or(Value::Null);
            let present = finalizers.as_array().is_some_and(|f| {
                f.iter()
                    .any(|v| v.as_str() == Some("coder.com/provisioner-key-cleanup"))
            });
            if present {
                Ok(())
            } else {
                Err(format!("finalizers: {finalizers}"))
            }
        })
        .await
}

/// R-ST-4: after a pass that reached the Deployment, the status and every condition carry the
/// CR's current generation.
#[then("the provisioner's status observes its current generation")]
async fn observes_generation(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world
        .provisioner_eventually("status.observedGeneration = metadata.generation", |cr| {
            let generation = cr.pointer("/metadata/generation").and_then(Value::as_i64);
            let observed = cr
                .pointer("/status/observedGeneration")
                .and_then(Value::as_i64);
            if observed != generation {
                return Err(format!(
                    "observedGeneration {observed:?}, generation {generation:?}"
                ));
            }
            let stale: Vec<String> = cr
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|c| c.get("observedGeneration").and_then(Value::as_i64) != generation)
                .map(|c| {
                    format!(
                        "{} observed {:?}",
                        str_at(c, "/type").unwrap_or("?"),
                        c.get("observedGeneration")
                    )
                })
                .collect();
            if stale.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "conditions behind generation {generation:?}: {}",
                    stale.join(", ")
                ))
            }
        })
        .await
}

/// A Warning Event about the CR with the given reason (core/v1 and events.k8s.io/v1 Events
/// are one resource, so either recorder is seen).
#[then(expr = "a Warning Event {string} is recorded for the provisioner")]
async fn warning_event(world: &mut ProvisionerWorld, reason: String) -> anyhow::Result<()> {
    let timeouts = *world.timeouts();
    await_warning_event(world, &reason, &timeouts).await
}

/// Events before effects: the Event that announces a delete exists while coderd still holds back
/// that DELETE's answer (a delay fault), looked for during half of a 4-second delay.
#[then(
    expr = "while coderd holds back the DELETE answer a Warning Event {string} is recorded for the provisioner"
)]
async fn warning_event_before_delete_answer(
    world: &mut ProvisionerWorld,
    reason: String,
) -> anyhow::Result<()> {
    await_key_delete(world).await?;
    let mut timeouts = *world.timeouts();
    timeouts.eventually = std::time::Duration::from_secs(2);
    await_warning_event(world, &reason, &timeouts).await
}

async fn await_warning_event(
    world: &ProvisionerWorld,
    reason: &str,
    timeouts: &wait::Timeouts,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Event;
    let api: kube::Api<Event> = world.api();
    let name = world.provisioner.clone();
    wait::eventually(&format!("a Warning Event {reason}"), timeouts, || async {
        let events = api.list(&Default::default()).await?.items;
        let found = events.iter().any(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some(reason)
                && e.involved_object.name.as_deref() == Some(name.as_str())
        });
        Ok(if found {
            Ok(())
        } else {
            let seen: Vec<String> = events
                .iter()
                .map(|e| {
                    format!(
                        "{} {}",
                        e.type_.as_deref().unwrap_or(""),
                        e.reason.as_deref().unwrap_or("")
                    )
                })
                .collect();
            Err(format!("events: {}", seen.join(", ")))
        })
    })
    .await
}

/// The `lastTransitionTime` of every condition, for "keep their last transition times". Waits
/// until the clock has moved past the latest of them, so that an implementation that stamps
/// every write with the current time cannot pass by writing within the same second.
#[then("the provisioner's conditions are remembered")]
async fn conditions_remembered(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let times = world
        .provisioner_eventually("conditions with transition times", |cr| {
            let times = transition_times(cr);
            if times.is_empty() {
                Err("no conditions".to_owned())
            } else {
                Ok(times)
            }
        })
        .await?;
    let latest = times
        .values()
        .filter_map(|t| t.parse::<jiff::Timestamp>().ok())
        .max()
        .ok_or_else(|| anyhow!("no condition has a valid lastTransitionTime: {times:?}"))?;
    let mut timeouts = *world.timeouts();
    timeouts.reach_and_hold = 1;
    wait::eventually(
        "the clock to pass the latest transition time",
        &timeouts,
        || async {
            let now = jiff::Timestamp::now();
            Ok(if now.as_second() > latest.as_second() {
                Ok(())
            } else {
                Err(format!("now {now}"))
            })
        },
    )
    .await?;
    world
        .remembered
        .insert("conditions".to_owned(), serde_json::to_string(&times)?);
    Ok(())
}

fn transition_times(cr: &Value) -> std::collections::BTreeMap<String, String> {
    cr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            (
                str_at(c, "/type").unwrap_or_default().to_owned(),
                str_at(c, "/lastTransitionTime")
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// metav1.Condition semantics: a condition whose status did not change keeps its
/// `lastTransitionTime` across later writes.
#[then("the provisioner's conditions keep their last transition times")]
async fn conditions_keep_times(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let remembered: std::collections::BTreeMap<String, String> =
        serde_json::from_str(world.remembered.get("conditions").ok_or_else(|| {
            anyhow!("no earlier \"the provisioner's conditions are remembered\"")
        })?)?;
    let window = world.observation_window();
    world
        .provisioner_stays("conditions to keep their transition times", window, |cr| {
            let now = transition_times(cr);
            let moved: Vec<String> = remembered
                .iter()
                .filter(|(kind, time)| now.get(*kind) != Some(*time))
                .map(|(kind, time)| format!("{kind}: {time} → {:?}", now.get(kind)))
                .collect();
            if moved.is_empty() {
                Ok(())
            } else {
                Err(moved.join(", "))
            }
        })
        .await
}

/// R-DEL-2: clean-up removes the finalizer only after coderd answered the delete. Needs a
/// delay fault on the DELETE (longer than the window below): once coderd has received the
/// DELETE, the CR must still exist with its finalizer while the answer is held back.
#[then(
    expr = "while coderd holds back the DELETE answer the provisioner keeps the finalizer {string}"
)]
async fn finalizer_kept_while_pending(
    world: &mut ProvisionerWorld,
    finalizer: String,
) -> anyhow::Result<()> {
    await_key_delete(world).await?;
    let window = std::time::Duration::from_secs(2);
    world
        .provisioner_stays(
            &format!("the finalizer {finalizer} while the DELETE is pending"),
            window,
            |cr| {
                let has = cr
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| f.iter().any(|v| v.as_str() == Some(finalizer.as_str())));
                if has {
                    Ok(())
                } else {
                    Err("the finalizer was removed before coderd answered".to_owned())
                }
            },
        )
        .await
}

/// Until coderd has received a key DELETE (its answer may still be held back by a delay fault).
async fn await_key_delete(world: &ProvisionerWorld) -> anyhow::Result<()> {
    let template = crate::coderd_routes::route_template("provisionerkey")?;
    wait::eventually(
        "coderd to receive the key DELETE",
        world.timeouts(),
        || async {
            let journal = world.journal().await?;
            Ok(
                if journal
                    .iter()
                    .any(|e| e.method == "DELETE" && e.route.as_deref() == Some(template))
                {
                    Ok(())
                } else {
                    Err("no DELETE yet".to_owned())
                },
            )
        },
    )
    .await
}

/// R-KEY-12: the status as an upgrade from an older operator leaves it: the key Secret is in
/// place, but no baseline of the key it holds.
#[when("the provisioner's recorded key fields are removed from its status")]
async fn key_fields_removed(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let patch = json!({"status": {
        "organizationID": null, "organizationName": null, "provisionerKeyID": null,
        "provisionerKeyName": null, "tagsHash": null, "controlPlaneRefName": null,
        "controlPlaneURL": null}});
    write_status_as_another_client(world, &patch)
        .await
        .context("removing the key fields from the status")
}

/// R-ST-2, R-ST-3: a status another client wrote (a stale replica, a human with kubectl) no
/// longer says what the Deployment reports.
#[when("another client writes the provisioner's status:")]
async fn status_written_by_another_client(
    world: &mut ProvisionerWorld,
    step: &Step,
) -> anyhow::Result<()> {
    let patch = json!({ "status": docstring_yaml(world, step)? });
    write_status_as_another_client(world, &patch)
        .await
        .context("writing the provisioner's status")
}

/// Merge-patches the CR's status subresource, as a write of the suite's (not the operator's).
async fn write_status_as_another_client(
    world: &mut ProvisionerWorld,
    patch: &serde_json::Value,
) -> anyhow::Result<()> {
    world.mark_action().await?;
    let written = world
        .provisioners()
        .patch_status(
            &world.provisioner,
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await?;
    if let Some(recorder) = &world.recorder {
        recorder.suite_wrote(written.metadata.resource_version);
    }
    Ok(())
}

/// R-SEC-14, as a step (the after-hook runs the same search after every scenario).
#[then("no secret of this scenario appears in the operator's log, the Events or the provisioner")]
async fn no_secret_appears(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let leaks = crate::scenario_checks::leaks::leaks(world).await?;
    if !leaks.is_empty() {
        bail!("{}", leaks.join("; "));
    }
    Ok(())
}

/// R-KEY-6/R-KEY-7: the key fields of the status, remembered for later steps (cleanup by id).
#[then("the provisioner status records its provisioner key")]
async fn status_records_key(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let (organization_id, key_id) = world
        .provisioner_eventually(
            "status.organizationID and status.provisionerKeyID",
            |cr| match (
                str_at(cr, "/status/organizationID"),
                str_at(cr, "/status/provisionerKeyID"),
            ) {
                (Some(org), Some(key)) if !org.is_empty() && !key.is_empty() => {
                    Ok((org.to_owned(), key.to_owned()))
                }
                _ => Err(format!(
                    "status: {}",
                    cr.get("status").cloned().unwrap_or(Value::Null)
                )),
            },
        )
        .await?;
    world
        .remembered
        .insert("organizationID".to_owned(), organization_id);
    world
        .remembered
        .insert("provisionerKeyID".to_owned(), key_id);
    Ok(())
}

/// Status fields compared with a table of `field | value`; `{url}` means the coderd URL,
/// `{organization}` the scenario's organization, `{organization id}` its id, and
/// `{default organization id}` the id of coderd's default organization.
const DEFAULT_ORG_ID: &str = "{default organization id}";

#[then("the provisioner status has:")]
async fn status_has(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let rows = super::table_rows(step)?;
    let organization = world
        .coderd
        .as_ref()
        .map(|c| (c.organization.clone(), c.organization_id.clone()));
    let default_organization_id = if rows
        .iter()
        .any(|row| row.contains(&DEFAULT_ORG_ID.to_owned()))
    {
        Some(super::coderd::default_organization_id(world).await?)
    } else {
        None
    };
    let expected: Vec<(String, String)> = rows
        .into_iter()
        .skip(1)
        .map(|row| {
            let field = row.first().cloned().unwrap_or_default();
            let value = row.get(1).cloned().unwrap_or_default();
            let value = match (value.as_str(), &organization) {
                ("{url}", _) => world.env.coderd.url.clone(),
                ("{organization}", Some((name, _))) => name.clone(),
                ("{organization id}", Some((_, id))) => id.clone(),
                (DEFAULT_ORG_ID, _) => default_organization_id.clone().unwrap_or_default(),
                _ => super::children::expand(world, &value),
            };
            (field, value)
        })
        .collect();
    world
        .provisioner_eventually("the status fields", |cr| {
            let mismatches: Vec<String> = expected
                .iter()
                .filter_map(|(field, value)| {
                    let pointer = format!("/status/{}", field.replace('.', "/"));
                    let actual = cr.pointer(&pointer).map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    });
                    (actual.as_deref() != Some(value.as_str()))
                        .then(|| format!("{field}: {actual:?} ≠ {value:?}"))
                })
                .collect();
            if mismatches.is_empty() {
                Ok(())
            } else {
                Err(mismatches.join("; "))
            }
        })
        .await
}
