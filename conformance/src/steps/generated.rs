//! Steps of the generated cases ([`crate::cases`]): apply the case of a seed, let it settle,
//! hold it to the contract oracle, change it once, and count its key requests against what the
//! change can justify. Every failure names the seed and the case.
use anyhow::{Context as _, anyhow};
use cucumber::{then, when};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::cases::{self, Case, CaseFault, FaultAnswer, FaultRoute, Generated, Phase};
use crate::coderd_routes::route_template;
use crate::invariants::oracle;
use crate::wait;
use crate::world::{CONTROL_PLANE, FIELD_MANAGER, ProvisionerWorld};

/// The second control plane of the generated scenarios' Background.
const SECOND_CONTROL_PLANE: &str = "other-control-plane";

fn context(world: &ProvisionerWorld) -> anyhow::Result<cases::Context> {
    let own = world.scenario_coderd()?.organization.clone();
    let (second, _) = world.second_organization()?.clone();
    Ok(cases::Context {
        organizations: [own, second],
        control_planes: [CONTROL_PLANE.to_owned(), SECOND_CONTROL_PLANE.to_owned()],
        other_control_planes: [0, 1].map(super::fixture::other_control_plane_name),
        other_urls: [0, 1].map(|index| {
            world
                .env
                .other_coderds
                .get(index)
                .map(|c| c.url.clone())
                .unwrap_or_default()
        }),
    })
}

fn generated(world: &ProvisionerWorld) -> anyhow::Result<&Generated> {
    world.generated.as_ref().ok_or_else(|| {
        anyhow!("no generated case: start with \"a provisioner generated from seed …\"")
    })
}

/// Applies `case` as the CoderProvisioner `name`, after giving its control plane the
/// entitlement check and image the case says (the fixture's own image when it says none).
async fn apply_case(world: &ProvisionerWorld, case: &Case, name: &str) -> anyhow::Result<()> {
    let control_plane = case
        .spec
        .pointer("/controlPlaneRef/name")
        .and_then(Value::as_str)
        .unwrap_or(CONTROL_PLANE);
    let long_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(5);
    let status = case.entitlement.status_patch(
        &super::fixture::now_rfc3339(),
        &jiff::Timestamp::from_second(long_ago.as_second())?.to_string(),
    );
    super::fixture::patch_named_control_plane_status(world, control_plane, &status).await?;
    let image = case
        .control_plane_image
        .as_ref()
        .or(world.env.daemon_image.as_ref());
    world
        .control_planes()
        .patch(
            control_plane,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"image": image}})),
        )
        .await
        .context("setting the control plane's image")?;
    let cr = json!({
        "apiVersion": "coder.com/v1alpha1",
        "kind": "CoderProvisioner",
        "metadata": {"name": name, "namespace": world.namespace},
        "spec": case.spec,
    });
    world
        .provisioners()
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&cr),
        )
        .await?;
    Ok(())
}

#[when(expr = "the provisioner generated from seed {int} is applied")]
async fn generated_applied(world: &mut ProvisionerWorld, seed: u64) -> anyhow::Result<()> {
    world.mark_action().await?;
    let case = cases::case(seed, &context(world)?);
    for index in case.shape.other_coderds() {
        super::fixture::other_coderd_control_plane(world, *index).await?;
    }
    world.provisioner = case.name.clone();
    let described = cases::describe(seed, &case, None);
    let mut admission_findings = Vec::new();
    if let Some(past) = &case.past_limit {
        let past_case = Case {
            spec: past.spec.clone(),
            ..case.clone()
        };
        let answer = apply_case(world, &past_case, &case.name).await;
        match answer {
            Ok(()) => admission_findings.push(format!(
                "the API server admitted a CoderProvisioner with {}",
                past.what
            )),
            Err(error) if refused_as_invalid(&error) => {}
            Err(error) => {
                return Err(
                    error.context(format!("applying the case past its limit, {}", past.what))
                );
            }
        }
    }
    inject_case_fault(world, &case, Phase::FirstCreate).await?;
    match apply_case(world, &case, &case.name).await {
        Ok(()) => {}
        // Every generated spec is one the contract admits: a refusal is the CRD's mistake.
        Err(error) if refused_as_invalid(&error) => admission_findings.push(format!(
            "the API server refused the case, whose every value is within the contract's limits \
             ({}): {error:#}",
            limits_of(&format!("{error:#}"))
        )),
        Err(error) => return Err(error.context(format!("applying the {described}"))),
    }
    world.generated = Some(Generated {
        seed,
        case,
        change: None,
        admission_findings,
        key_before_change: None,
    });
    Ok(())
}

/// Which coderd a control plane of the scenario publishes: `None` the fake, `Some(i)` other
/// coderd `i`.
fn coderd_of_control_plane(name: &str) -> Option<usize> {
    (0..2).find(|index| super::fixture::other_control_plane_name(*index) == name)
}

/// Where the case's fault goes in `phase`, route by route: on the coderd the CR works with then;
/// when its change moves it to another coderd, the old key's list and delete at the old one and
/// the rest at the new one, so that every route is faulted once, as on one coderd (R-RL-2's
/// backoff doubles with each 429 in a row: more would outlast the case's deadline).
fn fault_targets(case: &Case, change: Option<&cases::Change>) -> Vec<(Option<usize>, FaultRoute)> {
    let control_plane = |spec: &Value| {
        spec.pointer("/controlPlaneRef/name")
            .and_then(Value::as_str)
            .map(coderd_of_control_plane)
            .unwrap_or(None)
    };
    let from = control_plane(&case.spec);
    let to = match change {
        Some(change) if change.control_plane_url.is_some() => Some(0),
        Some(change) if change.patch.get("controlPlaneRef").is_some() => {
            control_plane(&change.patch)
        }
        _ => from,
    };
    cases::FAULT_ROUTES
        .into_iter()
        .map(|route| match route {
            FaultRoute::KeyList | FaultRoute::KeyDelete => (from, route),
            _ => (to, route),
        })
        .collect()
}

/// Injects the case's fault when its phase begins: on each of its routes, once, for the
/// scenario's requests only, on the coderd [`fault_targets`] names (with the token the CR uses
/// there and the scenario's organizations there). A key's own lookup carries no session token: a
/// fault reaches it by the key's organization, so only when that is one of the scenario's own
/// (the default organization is shared with the scenarios beside it).
async fn inject_case_fault(
    world: &mut ProvisionerWorld,
    case: &Case,
    phase: Phase,
) -> anyhow::Result<()> {
    let Some(fault) = case.fault.filter(|f| f.phase == phase) else {
        return Ok(());
    };
    let change = match phase {
        Phase::Change => world.generated.as_ref().and_then(|g| g.change.clone()),
        Phase::FirstCreate => None,
    };
    if fault.answer == FaultAnswer::Slow {
        let delay = std::time::Duration::from_secs(2);
        world.longest_delay = world.longest_delay.max(Some(delay));
    }
    let own = world.scenario_coderd()?;
    let key_organization = change
        .as_ref()
        .and_then(|c| c.patch.get("organizationName").cloned())
        .or_else(|| case.spec.get("organizationName").cloned())
        .and_then(|name| name.as_str().map(str::to_owned));
    let routes: Vec<FaultRoute> = fault.routes().collect();
    for (at, route) in fault_targets(case, change.as_ref()) {
        if !routes.contains(&route) {
            continue;
        }
        // The coderd's admin, the token the CR sends there, the scenario's organizations there.
        let (admin, fingerprint, organizations) = match at {
            None => (
                world.admin()?.clone(),
                own.token_fingerprint.clone(),
                vec![
                    (own.organization.clone(), own.organization_id.clone()),
                    world.second_organization()?.clone(),
                ],
            ),
            Some(index) => {
                let Some(other) = world.other_coderds.iter().find(|o| o.index == index) else {
                    continue;
                };
                // A control plane whose URL moved there still sends the fixture's token.
                let fingerprint = if case.shape == cases::Shape::UrlMovesToOtherPort {
                    own.token_fingerprint.clone()
                } else {
                    other.token_fingerprint.clone()
                };
                (
                    world.env.other_coderds[index]
                        .admin
                        .clone()
                        .context("another coderd without an admin API")?,
                    fingerprint,
                    other.organizations.clone(),
                )
            }
        };
        let (method, alias) = route.request();
        let template = route_template(alias)?;
        let spec = match fault.answer {
            FaultAnswer::Status(status) => fake_coderd::FaultSpec::status(method, template, status),
            FaultAnswer::Reset => fake_coderd::FaultSpec::reset(method, template),
            FaultAnswer::Slow => {
                fake_coderd::FaultSpec::delay(method, template, std::time::Duration::from_secs(2))
            }
        };
        let organization = match route {
            FaultRoute::KeyLookup => match key_organization
                .as_ref()
                .and_then(|name| organizations.iter().find(|(n, _)| n == name))
            {
                Some((_, id)) => id.clone(),
                None => continue,
            },
            _ => organizations[0].1.clone(),
        };
        let mut spec = spec.times(1).for_session_token_fingerprint(fingerprint);
        if !organization.is_empty() {
            spec = spec.or_key_of_organization(organization);
        }
        admin.inject_fault(spec).await?;
    }
    Ok(())
}

/// How long a case may take to settle: each faulted request adds a retry. Other faults are
/// retried after the controller's backoff, which the contract leaves to the implementation
/// (R-KEY-18): three times the tier's deadline. 429s are retried after R-RL-2's backoff, which
/// doubles with each 429 in a row: at least the longest waits it allows, then the tier's deadline.
fn settle_timeouts(world: &ProvisionerWorld, fault: Option<CaseFault>) -> wait::Timeouts {
    let usual = *world.timeouts();
    let Some(fault) = fault else {
        return usual;
    };
    let backoff = match fault.answer {
        FaultAnswer::Status(429) => longest_rate_limit_backoff(fault.routes().count()),
        _ => std::time::Duration::ZERO,
    };
    wait::Timeouts {
        eventually: (usual.eventually * 3).max(usual.eventually + backoff.mul_f64(usual.scale)),
        ..usual
    }
}

/// R-RL-2's longest waits after `in_a_row` 429s in a row: 3 s, then 6 s, then doubling with
/// +20 % jitter, never above 2 minutes (a case faults each route once: five in a row at most).
fn longest_rate_limit_backoff(in_a_row: usize) -> std::time::Duration {
    let seconds: f64 = (0..in_a_row)
        .map(|n| match n {
            0 => 3.0,
            1 => 6.0,
            n => (f64::from(1u32 << (n + 1)) * 1.2).min(120.0),
        })
        .sum();
    std::time::Duration::from_secs_f64(seconds)
}

/// The rules that set the limits of the fields a refusal names: D-4 the key name's and the
/// replicas', R-CRD-6 the key Secret's name and data key; both when it names neither.
fn limits_of(refusal: &str) -> &'static str {
    let names = |fields: &[&str]| fields.iter().any(|f| refusal.contains(f));
    match (
        names(&["key.name", "replicas"]),
        names(&["secretName", "secretKey"]),
    ) {
        (true, false) => "D-4",
        (false, true) => "R-CRD-6",
        _ => "D-4, R-CRD-6",
    }
}

/// Whether the API server refused a write as invalid: 422, or 400/403 from a validating webhook.
fn refused_as_invalid(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<kube::Error>(),
        Some(kube::Error::Api(status)) if [400, 403, 422].contains(&status.code)
    )
}

/// D-4, R-CRD-6: a case within the limits is admitted, and its value past an admission limit
/// (when it sits on one) is refused.
#[then(
    "the API server admitted the generated provisioner at its limit and refused it past the limit"
)]
async fn generated_admission(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let generated = generated(world)?;
    if generated.admission_findings.is_empty() {
        return Ok(());
    }
    Err(with_case(
        anyhow!("{}", generated.admission_findings.join("; ")),
        &generated.describe(),
    ))
}

#[when("the generated provisioner or its control plane is changed as its seed says")]
async fn generated_changed(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    let context = context(world)?;
    let recorded = world.provisioner_json().await?.map(|cr| {
        ["controlPlaneURL", "organizationID", "provisionerKeyID"].map(|field| {
            cr.pointer(&format!("/status/{field}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        })
    });
    let generated = world
        .generated
        .as_mut()
        .ok_or_else(|| anyhow!("no generated case"))?;
    generated.key_before_change = recorded;
    let change = cases::change(generated.seed, &generated.case, &context);
    let patch = json!({"spec": change.patch});
    generated.change = Some(change);
    let case = generated.case.clone();
    let moved_url = generated
        .change
        .as_ref()
        .and_then(|c| c.control_plane_url.clone());
    inject_case_fault(world, &case, Phase::Change).await?;
    if let Some(url) = moved_url {
        return super::fixture::patch_control_plane_status(world, &json!({"status": {"url": url}}))
            .await;
    }
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

/// A generated case's failure: the check that failed first (its whole chain: a step's error shows
/// only its outermost message), then the case and its seed, so that it can be replayed.
fn with_case(error: anyhow::Error, described: &str) -> anyhow::Error {
    anyhow::anyhow!("{error:#}; {described}")
}

/// Settled: every gate passed, the key and its Secret ready, the current generation observed.
/// Then the oracle's findings on that state (children, coderd's key) are handed to the
/// after-hook, which blames each on the rule it names, as it does with its own.
#[then("the generated provisioner settles")]
async fn generated_settles(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let described = generated(world)?.describe();
    let timeouts = settle_timeouts(world, generated(world)?.case.fault);
    // A moved control plane URL changes no generation: the pass that saw it records it.
    let moved_url = generated(world)?
        .change
        .as_ref()
        .and_then(|c| c.control_plane_url.clone());
    world
        .provisioner_settles(
            &world.provisioner,
            "the generated provisioner to settle",
            &timeouts,
            |cr| {
                let recorded = cr
                    .pointer("/status/controlPlaneURL")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                match &moved_url {
                    Some(url) if recorded != url => {
                        return Err(format!(
                            "status.controlPlaneURL is {recorded:?}, not the control plane's new URL {url} (R-KEY-15)"
                        ));
                    }
                    _ => {}
                }
                if oracle::ready_for_its_spec(cr) {
                    Ok(())
                } else {
                    Err(format!(
                        "its key not ready for its spec: generation {}, observed {}; conditions: {} ({})",
                        cr.pointer("/metadata/generation").unwrap_or(&Value::Null),
                        cr.pointer("/status/observedGeneration")
                            .unwrap_or(&Value::Null),
                        super::describe_conditions(cr),
                        oracle::unsettled_rules(cr).join(", ")
                    ))
                }
            },
        )
        .await
        .map_err(|error| with_case(error, &described))?;
    // A fault armed for the first create that the operator never met ends with that phase.
    if generated(world)?.change.is_none() {
        world.clear_scenario_faults().await?;
    }
    let findings = crate::scenario_checks::settled_findings(world, &world.provisioner).await?;
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
/// most one more, and each extra key's predecessor deleted; any other change no key request. A
/// fault the case met changes none of that: it is no spec change.
#[then("coderd saw only the key requests the generated change justifies")]
async fn generated_key_budget(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let described = generated(world)?.describe();
    let may_rotate = generated(world)?
        .change
        .as_ref()
        .is_some_and(|c| c.may_rotate);
    // A fault is no spec change: it justifies no key request (R-KEY-4).
    let extra = usize::from(may_rotate);
    let window = world.observation_window();
    let creates = route_template("provisionerkeys")?;
    let deletes = route_template("provisionerkey")?;
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
        // R-KEY-16: a rotation whose list before the old key's delete failed may leave that key.
        let leftover = usize::from(may_rotate && journal.iter().any(crate::invariants::is_failed_key_list));
        let within = (1..=1 + extra).contains(&posts)
            && removed < posts
            && removed + 1 + leftover >= posts;
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
    .map_err(|error| with_case(error, &described))
}

/// R-KEY-15: a change of organization or control plane that replaced the key deleted the old
/// one where it was applied: in its organization, on its coderd (the fake or another one of the
/// same host). R-KEY-16 spares a rotation whose list before that delete failed on that coderd,
/// or whose delete failed there other than with a 429 (D-9), whatever the cause (e.g. the new
/// control plane's token, which the old coderd refuses); the case's faults give a delete only a
/// 429 or a late answer, both retried. A failure at the new coderd spares nothing: the old key
/// is not there.
#[then("the key the change replaced is gone from where it was applied")]
async fn generated_old_key_gone(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let generated = generated(world)?;
    let (Some(change), Some([url, organization, old_key])) =
        (&generated.change, &generated.key_before_change)
    else {
        return Ok(());
    };
    let moved = change.patch.get("organizationName").is_some()
        || change.patch.get("controlPlaneRef").is_some()
        || change.control_plane_url.is_some();
    if !moved || old_key.is_empty() {
        return Ok(());
    }
    let described = generated.describe();
    let now = world
        .provisioner_json()
        .await?
        .and_then(|cr| {
            cr.pointer("/status/provisionerKeyID")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_default();
    if now == *old_key {
        return Ok(());
    }
    // The old key's coderd: None the fake, Some(i) other coderd i.
    let old_coderd = world
        .env
        .other_coderds
        .iter()
        .position(|c| c.url == url.trim_end_matches('/'));
    let spared = world.journal_by_coderd().await?.iter().any(|(at, e)| {
        *at == old_coderd
            && (crate::invariants::is_failed_key_list(e)
                || (e.method == "DELETE"
                    && !(200..300).contains(&e.status)
                    && ![404, 429].contains(&e.status)))
    });
    if spared {
        return Ok(());
    }
    let Some(admin) = world.coderd_at(url).admin.clone() else {
        return Ok(());
    };
    let (url, organization, old_key) = (url.clone(), organization.clone(), old_key.clone());
    let timeouts = *world.timeouts();
    wait::eventually("the old key deleted", &timeouts, || async {
        let held = admin.keys(&organization).await.unwrap_or_default();
        Ok(match held.iter().find(|k| k.id == old_key) {
            None => Ok(()),
            Some(key) => Err(format!(
                "coderd {url} still holds the key {:?} ({old_key}) the CR recorded before {} changed, with the new key recorded (R-KEY-15)",
                key.name, change.what
            )),
        })
    })
    .await
    .map_err(|error| with_case(error, &described))
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
    let route = route_template("entitlements")?;
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
    .map_err(|error| with_case(error, &described))
}

/// What one shrinking trial showed.
enum Trial {
    /// The smaller case fails too: it did not settle, or the oracle found something.
    Fails,
    Passes,
    /// The run's shrinking budget ran out before the trial could tell.
    Undecided,
}

/// Whether `case`, applied as trial `number` (fresh names: [`cases::for_trial`]), settles and
/// satisfies the oracle, before and (when the scenario got that far) after its seed's change.
/// It waits only as long as it could hold of the run's shrinking budget.
async fn trial(
    world: &ProvisionerWorld,
    context: &cases::Context,
    seed: u64,
    case: &Case,
    number: usize,
    with_change: bool,
) -> anyhow::Result<Trial> {
    // A moved control plane URL stays moved: trials only try the first phase then.
    let change = cases::change(seed, case, context);
    let phases = if with_change && change.control_plane_url.is_none() {
        2
    } else {
        1
    };
    // A third of the tier's deadline: a case that settles settles in seconds, and one that
    // does not (an operator churning its key) should not spend the whole budget on one trial.
    let usual = world.timeouts().eventually / 3;
    let budget = &world.env.shrink_budget;
    let held = budget.hold(usual * phases);
    if held.is_zero() {
        return Ok(Trial::Undecided);
    }
    let started = tokio::time::Instant::now();
    let outcome = try_trial(
        world,
        &cases::for_trial(case, number),
        &cases::change_for_trial(&change, number),
        phases,
        started + held,
    )
    .await;
    budget.spend(held, started.elapsed());
    outcome
}

async fn try_trial(
    world: &ProvisionerWorld,
    case: &Case,
    change: &cases::Change,
    phases: u32,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Trial> {
    let name = &case.name;
    apply_case(world, case, name).await?;
    for phase in 0..phases {
        if phase == 1 {
            world
                .provisioners()
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": change.patch})),
                )
                .await?;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let usual = world.timeouts().eventually / 3;
        let timeouts = wait::Timeouts {
            eventually: left.min(usual),
            ..*world.timeouts()
        };
        let settled = world
            .provisioner_settles(name, "the trial to settle", &timeouts, |cr| {
                if oracle::ready_for_its_spec(cr) {
                    Ok(())
                } else {
                    Err("its key not ready for its spec".to_owned())
                }
            })
            .await;
        match settled {
            Err(_) if left < usual => return Ok(Trial::Undecided),
            Err(_) => return Ok(Trial::Fails),
            Ok(()) => {}
        }
        if !crate::scenario_checks::settled_findings(world, name)
            .await?
            .is_empty()
        {
            return Ok(Trial::Fails);
        }
    }
    Ok(Trial::Passes)
}

/// After a generated case failed: the smallest case one-step simplifications of it reach that
/// still fails to settle or to satisfy the oracle ([`cases::simpler`], greedily, each trial a
/// new CR with fresh names in the scenario's namespace), within what is left of the run's
/// shrinking budget (`--shrink-seconds`, shared by every failed case). `None` when shrinking is
/// off, or no simpler case fails.
pub async fn shrink(world: &ProvisionerWorld) -> Option<String> {
    let budget = &world.env.shrink_budget;
    let generated = world.generated.as_ref()?;
    if budget.is_off() {
        return None;
    }
    let context = context(world).ok()?;
    let with_change = generated.change.is_some();
    let mut smallest = generated.case.clone();
    // The trial that showed it, as applied.
    let mut smallest_trial = None;
    let mut trials = 0;
    let mut stopped = None;
    let mut ran_out = false;
    'smaller: loop {
        for candidate in cases::simpler(&smallest) {
            trials += 1;
            let outcome = trial(
                world,
                &context,
                generated.seed,
                &candidate,
                trials,
                with_change,
            )
            .await;
            match outcome {
                Ok(Trial::Fails) => {
                    smallest_trial = Some((trials, cases::for_trial(&candidate, trials)));
                    smallest = candidate;
                    continue 'smaller;
                }
                Ok(Trial::Passes) => {}
                Ok(Trial::Undecided) => {
                    ran_out = true;
                    stopped = Some(format!(
                        "the run's {} s shrinking budget ran out",
                        budget.total().as_secs()
                    ));
                    break 'smaller;
                }
                Err(error) => {
                    stopped = Some(format!("trial {trials} could not run: {error:#}"));
                    break 'smaller;
                }
            }
        }
        break;
    }
    budget.case_done(ran_out);
    let Some((number, shown)) = smallest_trial else {
        return stopped.map(|why| format!("no smaller failing case found ({why})"));
    };
    let change = with_change.then(|| {
        let change = cases::change(generated.seed, &smallest, &context);
        cases::change_for_trial(&change, number)
    });
    Some(format!(
        "smallest failing case found in {trials} trials{}: {}",
        stopped
            .map(|why| format!(" (not the smallest possible: {why})"))
            .unwrap_or_default(),
        cases::describe(generated.seed, &shown, change.as_ref())
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refusal_is_blamed_on_the_rule_of_the_field_it_names() {
        let refusal = |field: &str| {
            format!(
                "ApiError: CoderProvisioner.coder.com \"g\" is invalid: {field}: Too long (422)"
            )
        };
        assert_eq!(super::limits_of(&refusal("spec.key.name")), "D-4");
        assert_eq!(super::limits_of(&refusal("spec.replicas")), "D-4");
        assert_eq!(super::limits_of(&refusal("spec.key.secretName")), "R-CRD-6");
        assert_eq!(super::limits_of(&refusal("spec.key.secretKey")), "R-CRD-6");
        assert_eq!(super::limits_of("denied by a webhook"), "D-4, R-CRD-6");
    }

    /// R-RL-2 allows up to 76.2 s of backoff for a case's five 429s in a row: a legal one-worker
    /// operator failed the old flat deadline (3 × 30 s) once its own queue's latency was added.
    #[test]
    fn a_case_waits_out_the_longest_backoff_r_rl_2_allows() {
        let seconds = |n| super::longest_rate_limit_backoff(n).as_secs_f64();
        assert_eq!(seconds(0), 0.0);
        assert_eq!(seconds(1), 3.0);
        assert_eq!(seconds(2), 9.0);
        assert!((seconds(5) - 76.2).abs() < 1e-9, "{}", seconds(5));
        assert!(
            (seconds(9) - (76.2 + 76.8 + 120.0 * 3.0)).abs() < 1e-9,
            "{}",
            seconds(9)
        );
    }
}
