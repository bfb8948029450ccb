//! Steps on coderd: the calls the operator made (the fake's journal, filtered to the scenario's
//! own session token), the keys coderd holds, and scripted coderd behaviour (entitlement,
//! faults, unreachability), which is global to the fake and so only used in `@serial` scenarios.
use anyhow::{Context as _, anyhow, bail};
use cucumber::{given, then, when};
use fake_coderd::{Entitlement, FaultSpec, JournalEntry};
use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;

use super::{is_key_request, route_template};
use crate::wait;
use crate::world::ProvisionerWorld;

fn count(entries: &[JournalEntry], method: &str, template: &str) -> usize {
    entries
        .iter()
        .filter(|e| e.method.eq_ignore_ascii_case(method) && e.route.as_deref() == Some(template))
        .count()
}

fn describe(entries: &[JournalEntry]) -> String {
    if entries.is_empty() {
        return "none".to_owned();
    }
    entries
        .iter()
        .map(|e| format!("{} {} → {}", e.method, e.path, e.status))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The count is reached and holds (a later extra call fails the step).
#[then(expr = "coderd saw exactly {int} {word} on {string}")]
async fn saw_exactly(
    world: &mut ProvisionerWorld,
    expected: usize,
    method: String,
    alias: String,
) -> anyhow::Result<()> {
    let template = route_template(&alias)?;
    let what = format!("exactly {expected} {method} on {template}");
    let exact = |seen| seen == expected;
    wait::eventually(&what, world.timeouts(), || {
        count_observation(world, &method, template, exact)
    })
    .await?;
    wait::still(&what, world.timeouts(), || {
        count_observation(world, &method, template, exact)
    })
    .await
}

/// One look at the journal: whether the number of `method` calls on `template` is acceptable.
async fn count_observation(
    world: &ProvisionerWorld,
    method: &str,
    template: &str,
    acceptable: impl Fn(usize) -> bool,
) -> anyhow::Result<wait::Observation<()>> {
    let journal = world.journal().await?;
    let seen = count(&journal, method, template);
    Ok(if acceptable(seen) {
        Ok(())
    } else {
        Err(format!("saw {seen}; calls: {}", describe(&journal)))
    })
}

#[then(expr = "coderd saw at least {int} {word} on {string}")]
async fn saw_at_least(
    world: &mut ProvisionerWorld,
    minimum: usize,
    method: String,
    alias: String,
) -> anyhow::Result<()> {
    let template = route_template(&alias)?;
    wait::eventually(
        &format!("at least {minimum} {method} on {template}"),
        world.timeouts(),
        || count_observation(world, &method, template, |seen| seen >= minimum),
    )
    .await
}

#[then(expr = "coderd saw no {word} on {string}")]
async fn saw_none(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
) -> anyhow::Result<()> {
    saw_exactly(world, 0, method, alias).await
}

/// "since the last action": counted from the start of the latest `When` step;
/// "from now on": counted from this step. Either way the window must pass without such calls.
#[then(
    regex = r"^coderd sees no (provisioner key requests|requests) (since the last action|from now on) during the observation window$"
)]
async fn sees_nothing_new(
    world: &mut ProvisionerWorld,
    kind: String,
    baseline: String,
) -> anyhow::Result<()> {
    let keys_only = kind.starts_with("provisioner key");
    let start = match baseline.as_str() {
        "since the last action" => world.action_mark.ok_or_else(|| {
            anyhow!("\"since the last action\" needs an earlier When step in this scenario")
        })?,
        _ => world.journal().await?.len(),
    };
    let window = world.timeouts().hold_window;
    wait::stays(
        &format!("no new {kind}"),
        world.timeouts(),
        window,
        || async {
            let journal = world.journal().await?;
            let new: Vec<JournalEntry> = journal
                .into_iter()
                .skip(start)
                .filter(|e| !keys_only || is_key_request(e.route.as_deref()))
                .collect();
            Ok(if new.is_empty() {
                Ok(())
            } else {
                Err(format!("new calls: {}", describe(&new)))
            })
        },
    )
    .await
}

#[then("coderd saw no requests")]
async fn saw_no_requests(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    wait::still("no coderd requests", world.timeouts(), || async {
        let journal = world.journal().await?;
        Ok(if journal.is_empty() {
            Ok(())
        } else {
            Err(format!("calls: {}", describe(&journal)))
        })
    })
    .await
}

/// Every request the scenario's operator made carried its session token (R-PRE-10): the
/// journal is filtered by that token, so a request without it would be invisible here; this
/// step checks that the organization's key requests all came with the token.
#[then("every provisioner key request carried the operator token")]
async fn key_requests_carry_token(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let coderd = world.scenario_coderd()?;
    let organization_id = coderd.organization_id.clone();
    let fingerprint = coderd.token_fingerprint.clone();
    let all = world.admin()?.journal().await?;
    let foreign: Vec<JournalEntry> = all
        .into_iter()
        .filter(|e| is_key_request(e.route.as_deref()) && e.path.contains(&organization_id))
        .filter(|e| e.session_token_fingerprint.as_deref() != Some(fingerprint.as_str()))
        .collect();
    if !foreign.is_empty() {
        bail!(
            "key requests without the operator token: {}",
            describe(&foreign)
        );
    }
    Ok(())
}

async fn keys_named(
    world: &ProvisionerWorld,
    name: &str,
) -> anyhow::Result<Vec<fake_coderd::ProvisionerKey>> {
    let organization = world.scenario_coderd()?.organization.clone();
    let keys = world
        .admin()?
        .keys(&organization)
        .await
        .context("listing the fake coderd's keys")?;
    Ok(keys.into_iter().filter(|k| k.name == name).collect())
}

#[then(expr = "coderd holds exactly {int} provisioner key named {string}")]
async fn holds_keys_named(
    world: &mut ProvisionerWorld,
    expected: usize,
    name: String,
) -> anyhow::Result<()> {
    wait::eventually(
        &format!("{expected} key(s) named {name}"),
        world.timeouts(),
        || async {
            let keys = keys_named(world, &name).await?;
            Ok(if keys.len() == expected {
                Ok(())
            } else {
                Err(format!("found {}", keys.len()))
            })
        },
    )
    .await
}

#[then(expr = "coderd holds a provisioner key named {string} with tags:")]
async fn key_has_tags(
    world: &mut ProvisionerWorld,
    name: String,
    step: &cucumber::gherkin::Step,
) -> anyhow::Result<()> {
    let expected: std::collections::BTreeMap<String, String> = super::table_rows(step)?
        .into_iter()
        .skip(1)
        .map(|row| {
            (
                row.first().cloned().unwrap_or_default(),
                row.get(1).cloned().unwrap_or_default(),
            )
        })
        .collect();
    wait::eventually(
        &format!("key {name} with tags {expected:?}"),
        world.timeouts(),
        || async {
            let keys = keys_named(world, &name).await?;
            Ok(match keys.as_slice() {
                [key] if key.tags == expected => Ok(()),
                [key] => Err(format!("tags are {:?}", key.tags)),
                other => Err(format!("{} keys with that name", other.len())),
            })
        },
    )
    .await
}

async fn recorded_key_present(world: &ProvisionerWorld) -> anyhow::Result<bool> {
    let key_id = world
        .remembered
        .get("provisionerKeyID")
        .cloned()
        .ok_or_else(|| anyhow!("no earlier step recorded the provisioner key (\"the provisioner status records its provisioner key\")"))?;
    let organization = world.scenario_coderd()?.organization.clone();
    let keys = world.admin()?.keys(&organization).await?;
    Ok(keys.iter().any(|k| k.id == key_id))
}

#[then("the recorded provisioner key no longer exists in coderd")]
async fn recorded_key_gone(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    wait::eventually(
        "the recorded key to be deleted in coderd",
        world.timeouts(),
        || async {
            Ok(if recorded_key_present(world).await? {
                Err("it still exists".to_owned())
            } else {
                Ok(())
            })
        },
    )
    .await
}

#[then("the recorded provisioner key still exists in coderd")]
async fn recorded_key_kept(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    wait::still(
        "the recorded key to stay in coderd",
        world.timeouts(),
        || async {
            Ok(if recorded_key_present(world).await? {
                Ok(())
            } else {
                Err("it was deleted".to_owned())
            })
        },
    )
    .await
}

/// End to end: the plaintext in the key Secret authenticates as a provisioner daemon would
/// (`GET /api/v2/provisionerkeys/{key}` with `Coder-Provisioner-Daemon-Key`).
#[then(expr = "the key in Secret {string} authenticates to coderd as the key named {string}")]
async fn key_authenticates(
    world: &mut ProvisionerWorld,
    secret: String,
    name: String,
) -> anyhow::Result<()> {
    let secret = super::children::expand(world, &secret);
    let api: kube::Api<Secret> = world.api();
    let found = api
        .get(&secret)
        .await
        .with_context(|| format!("reading Secret {secret}"))?;
    let key = found
        .data
        .as_ref()
        .and_then(|d| d.get("key"))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .ok_or_else(|| anyhow!("Secret {secret} has no data key \"key\""))?;
    let url = format!(
        "{}/api/v2/provisionerkeys/{key}",
        world.env.coderd.runner_url
    );
    let response = reqwest::Client::new()
        .get(url)
        .header("Coder-Provisioner-Daemon-Key", &key)
        .send()
        .await
        // The error would carry the URL (and so the key): report only the kind of failure.
        .map_err(|e| {
            anyhow!(
                "the daemon-key request failed ({})",
                if e.is_connect() { "connect" } else { "request" }
            )
        })?;
    let status = response.status();
    if !status.is_success() {
        bail!("coderd rejected the key in Secret {secret} with {status}");
    }
    let body: Value = response
        .json()
        .await
        .map_err(|_| anyhow!("coderd's key answer is not JSON"))?;
    let actual = body.get("name").and_then(Value::as_str).unwrap_or_default();
    if actual != name {
        bail!("the key in Secret {secret} belongs to key {actual:?}, not {name:?}");
    }
    Ok(())
}

fn entitlement(value: &str) -> anyhow::Result<Entitlement> {
    Ok(match value {
        "entitled" => Entitlement::Entitled,
        "grace_period" => Entitlement::GracePeriod,
        "not_entitled" => Entitlement::NotEntitled,
        "absent" => Entitlement::Absent,
        other => {
            bail!("unknown entitlement {other:?} (entitled, grace_period, not_entitled, absent)")
        }
    })
}

#[given(expr = "coderd reports the external provisioner entitlement as {string}")]
async fn coderd_entitlement(world: &mut ProvisionerWorld, value: String) -> anyhow::Result<()> {
    world.touched_global_coderd = true;
    world.admin()?.set_entitlement(entitlement(&value)?).await?;
    Ok(())
}

#[given(expr = "coderd answers every {word} on {string} with status {int}")]
#[when(expr = "coderd answers every {word} on {string} with status {int}")]
async fn coderd_fault(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
    status: u16,
) -> anyhow::Result<()> {
    world.mark_action().await?;
    world.touched_global_coderd = true;
    let fault = FaultSpec::status(&method, route_template(&alias)?, status).sticky();
    world.admin()?.inject_fault(fault).await?;
    Ok(())
}

#[when("coderd answers normally again")]
async fn coderd_normal(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    world.admin()?.clear_faults().await?;
    Ok(())
}

#[when("coderd becomes unreachable")]
async fn coderd_unreachable(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    world.touched_global_coderd = true;
    world.admin()?.set_unreachable(true).await?;
    Ok(())
}

#[when("coderd becomes reachable again")]
async fn coderd_reachable(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.admin()?.set_unreachable(false).await?;
    world.mark_action().await?;
    Ok(())
}

/// R-KEY-23: the owner's bypass header on key requests (the fake journals its value).
#[then(expr = "every {word} on {string} carried the rate-limit bypass header")]
async fn bypass_header(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
) -> anyhow::Result<()> {
    let template = route_template(&alias)?;
    let journal = world.journal().await?;
    let matching: Vec<&JournalEntry> = journal
        .iter()
        .filter(|e| e.method.eq_ignore_ascii_case(&method) && e.route.as_deref() == Some(template))
        .collect();
    if matching.is_empty() {
        bail!("coderd saw no {method} on {template}");
    }
    let without: Vec<String> = matching
        .iter()
        .filter(|e| {
            !e.bypass_ratelimit
                .as_deref()
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        })
        .map(|e| format!("{} {} (header {:?})", e.method, e.path, e.bypass_ratelimit))
        .collect();
    if !without.is_empty() {
        bail!(
            "requests without X-Coder-Bypass-Ratelimit: true: {}",
            without.join("; ")
        );
    }
    Ok(())
}

#[given(expr = "a provisioner key named {string} already exists in the scenario's organization")]
async fn key_exists(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let organization = world.scenario_coderd()?.organization.clone();
    // The plaintext is dropped: nobody in the scenario may know it.
    world
        .admin()?
        .create_key_directly(&organization, &name, Default::default())
        .await
        .context("seeding a key in the fake coderd")?;
    Ok(())
}

/// Puts the fake's global switches back after a scenario that changed them.
pub async fn restore_global_coderd(world: &ProvisionerWorld) -> anyhow::Result<()> {
    let admin = world.admin()?;
    admin.clear_faults().await?;
    admin.set_unreachable(false).await?;
    admin.set_rate_limit(None).await?;
    admin.set_entitlement(Entitlement::Entitled).await?;
    Ok(())
}
