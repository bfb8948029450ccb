//! Steps on coderd: the calls the operator made (the fake's journal, filtered to the scenario's
//! own session token), the keys coderd holds, and scripted coderd behaviour. Faults are scoped
//! to the scenario's session token, so fault scenarios run concurrently; the entitlement answer
//! and unreachability are global to the fake and so only used in `@serial` scenarios.
use std::str::FromStr as _;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use cucumber::{given, then, when};
use fake_coderd::{Entitlement, FaultSpec, JournalEntry, routes};
use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;

use crate::coderd_routes::{is_daemon_key_fetch, is_key_request, route_template};
use crate::report::not_applicable::DOES_NOT_APPLY;
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

/// The count is reached and holds (a later extra call fails the step). The journal only grows,
/// so a count already past the expected one fails at once instead of at the deadline.
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
    wait::eventually(&what, world.timeouts(), || async {
        let journal = world.journal().await?;
        let (seen, observation) = count_verdict(&journal, &method, template, exact);
        if seen > expected {
            return Err(wait::Hopeless(format!(
                "saw {seen} already; calls: {}",
                describe(&journal)
            ))
            .into());
        }
        Ok(observation)
    })
    .await?;
    let window = world.observation_window();
    wait::stays(&what, world.timeouts(), window, || {
        count_observation(world, &method, template, exact)
    })
    .await
}

/// No request so far got that answer (e.g. no key create met a 409: nothing was left behind).
#[then(expr = "coderd answered no {word} on {string} with status {int}")]
async fn answered_none_with(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
    status: u16,
) -> anyhow::Result<()> {
    let template = route_template(&alias)?;
    let journal = world.journal().await?;
    let answered: Vec<&JournalEntry> = journal
        .iter()
        .filter(|e| {
            e.method.eq_ignore_ascii_case(&method)
                && e.route.as_deref() == Some(template)
                && e.status == status
        })
        .collect();
    if !answered.is_empty() {
        bail!(
            "{} {method} on {template} answered {status}: {}",
            answered.len(),
            describe(&journal)
        );
    }
    Ok(())
}

/// Some request got that answer (e.g. the fault injected for it was met).
#[then(expr = "coderd answered a {word} on {string} with status {int}")]
async fn answered_one_with(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
    status: u16,
) -> anyhow::Result<()> {
    let template = route_template(&alias)?;
    wait::eventually(
        &format!("a {method} on {template} answered {status}"),
        world.timeouts(),
        || async {
            let journal = world.journal().await?;
            let answered = requests_on(&journal, &method, template)
                .iter()
                .any(|e| e.status == status);
            Ok(if answered {
                Ok(())
            } else {
                Err(format!("calls: {}", describe(&journal)))
            })
        },
    )
    .await
}

/// One look at the journal: whether the number of `method` calls on `template` is acceptable.
pub(crate) async fn count_observation(
    world: &ProvisionerWorld,
    method: &str,
    template: &str,
    acceptable: impl Fn(usize) -> bool,
) -> anyhow::Result<wait::Observation<()>> {
    let journal = world.journal().await?;
    Ok(count_verdict(&journal, method, template, acceptable).1)
}

/// How many `method` calls on `template` the journal holds, and whether that count is acceptable.
fn count_verdict(
    journal: &[JournalEntry],
    method: &str,
    template: &str,
    acceptable: impl Fn(usize) -> bool,
) -> (usize, wait::Observation<()>) {
    let seen = count(journal, method, template);
    let observation = if acceptable(seen) {
        Ok(())
    } else {
        Err(format!("saw {seen}; calls: {}", describe(journal)))
    };
    (seen, observation)
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
/// "from now on": counted from this step. Either way the window must pass without such calls:
/// the tier's observation window, or a shorter one the scenario states ("for 3 seconds") where
/// the calls it looks for would come at once. "Key changes" are the creates and deletes among
/// the key requests (a deposed leader may still read; it may not write).
#[then(
    regex = r"^coderd sees no (provisioner key requests|provisioner key changes|requests) (since the last action|from now on) (?:during the observation window|for (\d+) seconds)$"
)]
async fn sees_nothing_new(
    world: &mut ProvisionerWorld,
    kind: String,
    baseline: String,
    stated_seconds: String,
) -> anyhow::Result<()> {
    let keys_only = kind.starts_with("provisioner key");
    let changes_only = kind.ends_with("changes");
    let start = match baseline.as_str() {
        "since the last action" => world.action_mark.ok_or_else(|| {
            anyhow!("\"since the last action\" needs an earlier When step in this scenario")
        })?,
        _ => world.journal().await?.len(),
    };
    let window = match stated_seconds.parse::<u64>().ok() {
        Some(seconds) => world.timeouts().stated(seconds).eventually,
        None if baseline == "from now on" => world.new_observation_window(),
        None => world.observation_window(),
    };
    wait::stays(
        &format!("no new {kind}"),
        world.timeouts(),
        window,
        || async {
            let journal = world.journal().await?;
            let new: Vec<JournalEntry> = journal
                .into_iter()
                .skip(start)
                // Daemon pods fetch their key's record whenever they start (a rollout on a
                // cluster with kubelets): not a request of the operator's.
                .filter(|e| !is_daemon_key_fetch(e.route.as_deref()))
                .filter(|e| !keys_only || is_key_request(e.route.as_deref()))
                .filter(|e| !changes_only || matches!(e.method.as_str(), "POST" | "DELETE"))
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

/// "No key request" in the contract's sense: no create, list or delete on the key routes.
#[then("coderd saw no provisioner key requests")]
async fn saw_no_key_requests(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let window = world.observation_window();
    wait::stays(
        "no provisioner key requests",
        world.timeouts(),
        window,
        || async {
            let journal = world.journal().await?;
            let keys: Vec<JournalEntry> = journal
                .into_iter()
                .filter(|e| is_key_request(e.route.as_deref()))
                .collect();
            Ok(if keys.is_empty() {
                Ok(())
            } else {
                Err(format!("key requests: {}", describe(&keys)))
            })
        },
    )
    .await
}

/// R-RL-2: waits for `count` requests (from the start of the scenario, or of its latest `When`
/// step), then checks the gaps between them: the first about `first` seconds, each next one
/// about double the one before, ±20 % jitter plus a little scheduling slack.
#[then(
    regex = r#"^coderd sees (\d+) (\w+) on "([^"]+)"(?: answered (\d+))?( since the last action)? spaced by a backoff doubling from (\d+) seconds$"#
)]
async fn backoff_spacing(
    world: &mut ProvisionerWorld,
    count: usize,
    method: String,
    alias: String,
    answered: String,
    since_action: String,
    first: u64,
) -> anyhow::Result<()> {
    let answered: Option<u16> = (!answered.is_empty())
        .then(|| answered.parse())
        .transpose()?;
    let template = route_template(&alias)?;
    let start = if since_action.is_empty() {
        0
    } else {
        world
            .action_mark
            .ok_or_else(|| anyhow!("\"since the last action\" needs an earlier When step"))?
    };
    let mut timeouts = *world.timeouts();
    // The n-th request comes after first·(2ⁿ⁻¹ − 1)·1.2 s at the latest.
    let span = Duration::from_secs(first) * ((1u32 << (count - 1)) - 1);
    timeouts.eventually = timeouts
        .eventually
        .max(span.mul_f64(1.2) + Duration::from_secs(10));
    let times = wait::eventually(
        &format!("{count} {method} on {template}"),
        &timeouts,
        || async {
            let journal = world.journal().await?;
            let matching: Vec<&JournalEntry> = journal
                .iter()
                .skip(start)
                .filter(|e| {
                    e.method.eq_ignore_ascii_case(&method)
                        && e.route.as_deref() == Some(template)
                        && answered.is_none_or(|status| e.status == status)
                })
                .collect();
            Ok(if matching.len() >= count {
                matching
                    .iter()
                    .take(count)
                    .map(|e| {
                        jiff::Timestamp::from_str(&e.at)
                            .map_err(|err| format!("journal time {:?}: {err}", e.at))
                    })
                    .collect::<Result<Vec<_>, _>>()
            } else {
                Err(format!("saw {}: {}", matching.len(), describe(&journal)))
            })
        },
    )
    .await?;
    let gaps: Vec<f64> = times
        .windows(2)
        .map(|pair| pair[1].duration_since(pair[0]).as_secs_f64())
        .collect();
    if let Some(problem) = backoff_problem(&gaps, first as f64) {
        bail!("{method} on {template} came {problem}");
    }
    Ok(())
}

/// Why `gaps` (seconds between consecutive requests) are not a doubling backoff from `first`
/// seconds with ±20 % jitter, or `None` when they are.
pub fn backoff_problem(gaps: &[f64], first: f64) -> Option<String> {
    // Jitter ±20 %, plus a second for watch and scheduling latency on a loaded machine; still
    // far from an immediate retry (≈0 s) and from a backoff that was not reset (≥ 8 s).
    const SLACK: f64 = 1.0;
    let rendered = gaps
        .iter()
        .map(|g| format!("{g:.1} s"))
        .collect::<Vec<_>>()
        .join(", ");
    for (n, gap) in gaps.iter().enumerate() {
        let nominal = first * f64::from(1u32 << n);
        let (low, high) = (nominal * 0.8 - SLACK, nominal * 1.2 + SLACK);
        if !(low..=high).contains(gap) {
            return Some(format!(
                "{rendered} apart; retry {} came after {gap:.1} s, expected {low:.1}–{high:.1} s",
                n + 1
            ));
        }
        if n > 0 && *gap <= gaps[n - 1] {
            return Some(format!("{rendered} apart; the wait did not grow"));
        }
    }
    None
}

#[then("coderd saw no requests")]
async fn saw_no_requests(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let window = world.observation_window();
    wait::stays("no coderd requests", world.timeouts(), window, || async {
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
    keys_named_in(world, &organization, name).await
}

async fn keys_named_in(
    world: &ProvisionerWorld,
    organization: &str,
    name: &str,
) -> anyhow::Result<Vec<fake_coderd::ProvisionerKey>> {
    let keys = world
        .admin()?
        .keys(organization)
        .await
        .context("listing the fake coderd's keys")?;
    Ok(keys.into_iter().filter(|k| k.name == name).collect())
}

/// The id of coderd's default organization, which every scenario shares.
pub async fn default_organization_id(world: &ProvisionerWorld) -> anyhow::Result<String> {
    world
        .admin()?
        .organizations()
        .await?
        .into_iter()
        .find(|o| o.is_default)
        .map(|o| o.id)
        .ok_or_else(|| anyhow!("coderd has no default organization"))
}

/// `{organization}` in the name stands for the scenario's organization's name.
#[then(
    regex = r#"^coderd holds exactly (\d+) provisioner key named "([^"]+)"( in the default organization)?$"#
)]
async fn holds_keys_named(
    world: &mut ProvisionerWorld,
    expected: usize,
    name: String,
    in_default: String,
) -> anyhow::Result<()> {
    let name = super::children::expand(world, &name);
    let organization = if in_default.is_empty() {
        world.scenario_coderd()?.organization.clone()
    } else {
        "default".to_owned()
    };
    wait::eventually(
        &format!("{expected} key(s) named {name}"),
        world.timeouts(),
        || async {
            let keys = keys_named_in(world, &organization, &name).await?;
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
    if world.env.coderd.admin.is_none() {
        // A real coderd (--coderd): its key list, asked with the control plane's operator token.
        return real_coderd_key_present(world, &key_id).await;
    }
    let organization = world.scenario_coderd()?.organization.clone();
    let keys = world.admin()?.keys(&organization).await?;
    Ok(keys.iter().any(|k| k.id == key_id))
}

/// Whether a real coderd still lists the key `key_id` in the organization of the scenario's
/// provisioner (`default` when its spec names none), asked as the existing control plane's
/// operator (the token of its `status.operatorTokenSecretRef`).
async fn real_coderd_key_present(world: &ProvisionerWorld, key_id: &str) -> anyhow::Result<bool> {
    let existing = world
        .env
        .existing_control_plane
        .as_ref()
        .ok_or_else(|| anyhow!("no fake coderd and no existing control plane"))?;
    let control_plane = world
        .control_planes()
        .get(&existing.name)
        .await
        .with_context(|| format!("reading the control plane {}", existing.name))?;
    let reference = &control_plane.data["status"]["operatorTokenSecretRef"];
    let (Some(secret), Some(data_key)) = (reference["name"].as_str(), reference["key"].as_str())
    else {
        bail!(
            "control plane {} names no operator token Secret in its status",
            existing.name
        );
    };
    let secrets: kube::Api<Secret> = world.api();
    let token = secrets
        .get(secret)
        .await
        .with_context(|| format!("reading the operator token Secret {secret}"))?
        .data
        .and_then(|d| {
            d.get(data_key)
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        })
        .ok_or_else(|| anyhow!("Secret {secret} has no data key {data_key:?}"))?;
    let organization = world
        .remembered
        .get("organizationName")
        .cloned()
        .unwrap_or_else(|| "default".to_owned());
    let url = format!(
        "{}/api/v2/organizations/{organization}/provisionerkeys",
        world.env.coderd.runner_url
    );
    let response = reqwest::Client::new()
        .get(&url)
        .header("Coder-Session-Token", token.trim())
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("GET {url} answered {status}");
    }
    let keys: Vec<Value> = response
        .json()
        .await
        .with_context(|| format!("the answer of GET {url}"))?;
    Ok(keys.iter().any(|k| k["id"].as_str() == Some(key_id)))
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
    let window = world.observation_window();
    wait::stays(
        "the recorded key to stay in coderd",
        world.timeouts(),
        window,
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
    key_under_authenticates(world, secret, "key".to_owned(), name).await
}

#[then(
    expr = "the key in Secret {string} under {string} authenticates to coderd as the key named {string}"
)]
async fn key_under_authenticates(
    world: &mut ProvisionerWorld,
    secret: String,
    data_key: String,
    name: String,
) -> anyhow::Result<()> {
    let key = authenticated_key(world, &secret, &data_key).await?;
    let actual = key.get("name").and_then(Value::as_str).unwrap_or_default();
    if actual != name {
        bail!("the key in Secret {secret} belongs to key {actual:?}, not {name:?}");
    }
    Ok(())
}

/// The key a daemon would run with is the one the status records: after races (two replicas,
/// a paused leader), a Secret and a record that disagree make the clean-up delete the wrong key.
#[then(expr = "the provisioner status records the key in Secret {string}")]
async fn status_records_secret_key(
    world: &mut ProvisionerWorld,
    secret: String,
) -> anyhow::Result<()> {
    let key = authenticated_key(world, &secret, "key").await?;
    let id = key
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    world
        .provisioner_eventually(
            &format!("status.provisionerKeyID to be {id}, the key in the Secret"),
            |cr| match cr
                .pointer("/status/provisionerKeyID")
                .and_then(Value::as_str)
            {
                Some(recorded) if recorded == id => Ok(()),
                recorded => Err(format!("status.provisionerKeyID is {recorded:?}")),
            },
        )
        .await
}

/// coderd's record of the key in `secret` under `data_key`, fetched as a provisioner daemon
/// would (`GET /api/v2/provisionerkeys/{key}` with `Coder-Provisioner-Daemon-Key`); an error when
/// coderd rejects it.
async fn authenticated_key(
    world: &ProvisionerWorld,
    secret: &str,
    data_key: &str,
) -> anyhow::Result<Value> {
    let secret = super::children::expand(world, secret);
    let api: kube::Api<Secret> = world.api();
    let key = wait::eventually(
        &format!("Secret {secret} with a value under {data_key:?}"),
        world.timeouts(),
        || async {
            let found = api.get_opt(&secret).await?;
            Ok(found
                .and_then(|s| s.data)
                .and_then(|d| d.get(data_key).map(|v| v.0.clone()))
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("no data key {data_key:?}")))
        },
    )
    .await?;
    world.saw_secret(&key);
    world
        .daemon_key_lookup(&String::from_utf8_lossy(&key))
        .await
        .with_context(|| format!("the key in Secret {secret}"))
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

/// Reported to the scenario's own user only, so scenarios that ask coderd at the same time keep
/// theirs (the operator keeps one reading per coderd and token).
#[given(expr = "coderd reports the external provisioner entitlement as {string}")]
async fn coderd_entitlement(world: &mut ProvisionerWorld, value: String) -> anyhow::Result<()> {
    let user = world.scenario_coderd()?.user.clone();
    world
        .admin()?
        .set_user_entitlement(&user, Some(entitlement(&value)?))
        .await
}

/// Faults hit only the requests made with the scenario's session token, so other scenarios
/// running at the same time see a healthy coderd.
async fn inject_scenario_fault(
    world: &mut ProvisionerWorld,
    fault: FaultSpec,
) -> anyhow::Result<()> {
    inject_scenario_fault_as_given(world, fault.sticky()).await
}

/// [`inject_scenario_fault`] for `fault` as given (a one-shot fault meets one request).
async fn inject_scenario_fault_as_given(
    world: &mut ProvisionerWorld,
    fault: FaultSpec,
) -> anyhow::Result<()> {
    world.mark_action().await?;
    world.fault_injected();
    let fault = scenario_scoped(world, fault)?;
    world.admin()?.inject_fault(fault).await
}

/// `fault` for the scenario's requests: those with its session token, and those authenticated
/// by a key of its organization, which carry no session token (the lookup of a new key's own
/// record on "daemon-key").
fn scenario_scoped(world: &ProvisionerWorld, fault: FaultSpec) -> anyhow::Result<FaultSpec> {
    let organization = world.scenario_coderd()?.organization_id.clone();
    scoped_to_keys_of(world, fault, &organization)
}

/// `fault` for the scenario's session token, and for requests authenticated by a key of
/// `organization_id` (one of the scenario's own organizations; none when empty).
pub(super) fn scoped_to_keys_of(
    world: &ProvisionerWorld,
    fault: FaultSpec,
    organization_id: &str,
) -> anyhow::Result<FaultSpec> {
    let coderd = world.scenario_coderd()?;
    let fault = fault.for_session_token_fingerprint(coderd.token_fingerprint.clone());
    Ok(if organization_id.is_empty() {
        fault
    } else {
        fault.or_key_of_organization(organization_id.to_owned())
    })
}

#[given(expr = "coderd answers every {word} on {string} with status {int}")]
#[when(expr = "coderd answers every {word} on {string} with status {int}")]
async fn coderd_fault(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
    status: u16,
) -> anyhow::Result<()> {
    let fault = FaultSpec::status(&method, route_template(&alias)?, status);
    inject_scenario_fault(world, fault).await
}

/// A one-shot fault: only the scenario's next such request gets the status.
#[given(expr = "coderd answers the next {word} on {string} with status {int}")]
#[when(expr = "coderd answers the next {word} on {string} with status {int}")]
async fn coderd_fault_once(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
    status: u16,
) -> anyhow::Result<()> {
    let fault = FaultSpec::status(&method, route_template(&alias)?, status);
    inject_scenario_fault_as_given(world, fault).await
}

/// A fault armed by the scenario's next successful key create: "the next GET on
/// \"provisionerkeys\" after a key create" is the list that learns a new key's id (D-12), not one an
/// operator makes before its create.
#[given(
    regex = r#"^coderd answers (the next|every) (\w+) on "([^"]+)" after a key create with status (\d+)$"#
)]
#[when(
    regex = r#"^coderd answers (the next|every) (\w+) on "([^"]+)" after a key create with status (\d+)$"#
)]
async fn coderd_fault_after_create(
    world: &mut ProvisionerWorld,
    which: String,
    method: String,
    alias: String,
    status: u16,
) -> anyhow::Result<()> {
    let fault = FaultSpec::status(&method, route_template(&alias)?, status)
        .after("POST", route_template("provisionerkeys")?);
    let fault = if which == "every" {
        fault.sticky()
    } else {
        fault
    };
    inject_scenario_fault_as_given(world, fault).await
}

/// coderd before PR #13629 wrote a second JSON object after an organization's 404 into the same
/// body (coderd-api.md §2.3); current coderd writes one. Every route the operator resolves an
/// organization on answers that legacy body, so a client that decodes error bodies strictly fails.
#[given("coderd answers an unknown organization with its legacy two-object body")]
async fn coderd_legacy_organization_body(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    for (method, route) in [
        ("GET", routes::ORGANIZATION),
        ("GET", routes::LIST_KEYS),
        ("POST", routes::CREATE_KEY),
        ("DELETE", routes::DELETE_KEY),
    ] {
        inject_scenario_fault(
            world,
            FaultSpec::legacy_organization_not_found(method, route),
        )
        .await?;
    }
    Ok(())
}

#[when(expr = "coderd delays its answers to every {word} on {string} by {int} seconds")]
async fn coderd_delay(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
    seconds: u64,
) -> anyhow::Result<()> {
    let delay = Duration::from_secs(seconds);
    let fault = FaultSpec::delay(&method, route_template(&alias)?, delay);
    world.longest_delay = world.longest_delay.max(Some(delay));
    inject_scenario_fault(world, fault).await
}

#[when("coderd answers normally again")]
async fn coderd_normal(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    world.clear_scenario_faults().await?;
    world.fault_cleared();
    Ok(())
}

#[when("coderd becomes unreachable")]
async fn coderd_unreachable(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    world.touched_global_coderd = true;
    world.fault_injected();
    world.admin()?.set_unreachable(true).await?;
    Ok(())
}

#[when("coderd becomes reachable again")]
async fn coderd_reachable(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.admin()?.set_unreachable(false).await?;
    world.mark_action().await?;
    world.fault_cleared();
    Ok(())
}

/// The journal's requests with `method` on the route `template`, in order.
fn requests_on<'a>(
    journal: &'a [JournalEntry],
    method: &str,
    template: &str,
) -> Vec<&'a JournalEntry> {
    journal
        .iter()
        .filter(|e| e.method.eq_ignore_ascii_case(method) && e.route.as_deref() == Some(template))
        .collect()
}

/// Whether a request carried `X-Coder-Bypass-Ratelimit: true`.
fn carried_bypass(entry: &JournalEntry) -> bool {
    entry
        .bypass_ratelimit
        .as_deref()
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
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
    let matching = requests_on(&journal, &method, template);
    if matching.is_empty() {
        bail!("coderd saw no {method} on {template}");
    }
    let without: Vec<String> = matching
        .iter()
        .filter(|e| !carried_bypass(e))
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

/// R-KEY-23: coderd answers 428 to a bypass header from anyone but an owner.
#[given("the operator's token is a template admin's, not an owner's")]
async fn operator_token_of_template_admin(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world
        .operator_user_becomes(fake_coderd::UserRole::TemplateAdmin)
        .await
}

/// R-KEY-23: each request coderd answered 428 (the bypass header from a user who may not
/// bypass) is followed by the same request without the header, which coderd did not refuse so.
#[then(
    expr = "every {word} on {string} answered 428 was repeated once without the rate-limit bypass header"
)]
async fn repeated_without_bypass(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
) -> anyhow::Result<()> {
    let template = route_template(&alias)?;
    let journal = world.journal().await?;
    let matching = requests_on(&journal, &method, template);
    let refused: Vec<usize> = (0..matching.len())
        .filter(|&i| matching[i].status == 428)
        .collect();
    if refused.is_empty() {
        bail!(
            "coderd answered no {method} on {template} with 428 ({} seen): the token may bypass the rate limit, or the header was never sent",
            matching.len()
        );
    }
    let mut problems = Vec::new();
    for i in refused {
        match matching.get(i + 1) {
            None => problems.push(format!(
                "{} {} answered 428 was not repeated",
                method, matching[i].path
            )),
            Some(next) if carried_bypass(next) || next.path != matching[i].path => {
                problems.push(format!(
                    "{} {} answered 428 was followed by {} {} (header {:?}, answered {})",
                    method,
                    matching[i].path,
                    next.method,
                    next.path,
                    next.bypass_ratelimit,
                    next.status
                ))
            }
            Some(_) => {}
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    Ok(())
}

#[given(expr = "a provisioner key named {string} already exists in the scenario's organization")]
async fn key_exists(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let organization = world.scenario_coderd()?.organization.clone();
    seed_key(world, &organization, &name).await
}

#[given(expr = "a provisioner key named {string} already exists in the second organization")]
async fn key_exists_in_second(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let organization = world.second_organization()?.0.clone();
    seed_key(world, &organization, &name).await
}

/// A key made by another client; the plaintext is dropped: nobody in the scenario may know it.
async fn seed_key(
    world: &mut ProvisionerWorld,
    organization: &str,
    name: &str,
) -> anyhow::Result<()> {
    world.planted_keys = true;
    world
        .admin()?
        .create_key_directly(organization, name, Default::default())
        .await
        .context("seeding a key in the fake coderd")?;
    Ok(())
}

#[given("the scenario has a second coderd organization")]
async fn second_organization(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let created = world
        .admin()?
        .add_organization(&format!("conf-{}-second", world.id))
        .await
        .context("creating a second coderd organization")?;
    world.second_organization = Some((created.name, created.id.to_string()));
    Ok(())
}

#[then(expr = "the second organization holds exactly {int} provisioner key named {string}")]
async fn second_holds_keys(
    world: &mut ProvisionerWorld,
    expected: usize,
    name: String,
) -> anyhow::Result<()> {
    let organization = world.second_organization()?.0.clone();
    let window = world.observation_window();
    wait::stays(
        &format!("{expected} key(s) named {name} in {organization}"),
        world.timeouts(),
        window,
        || async {
            let keys = world.admin()?.keys(&organization).await?;
            let seen = keys.iter().filter(|k| k.name == name).count();
            Ok(if seen == expected {
                Ok(())
            } else {
                Err(format!("found {seen}"))
            })
        },
    )
    .await
}

/// The key the status recorded, as coderd lists it.
async fn recorded_key(world: &ProvisionerWorld) -> anyhow::Result<fake_coderd::ProvisionerKey> {
    let key_id = world.remembered.get("provisionerKeyID").cloned().ok_or_else(|| {
        anyhow!("no earlier step recorded the provisioner key (\"the provisioner status records its provisioner key\")")
    })?;
    let organization = world.scenario_coderd()?.organization.clone();
    world
        .admin()?
        .keys(&organization)
        .await?
        .into_iter()
        .find(|k| k.id == key_id)
        .ok_or_else(|| anyhow!("coderd has no key with the recorded id"))
}

#[when("the recorded provisioner key is deleted in coderd by someone else")]
async fn recorded_key_deleted_elsewhere(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    let key = recorded_key(world).await?;
    let organization = world.scenario_coderd()?.organization.clone();
    world
        .admin()?
        .delete_key_directly(&organization, &key.id)
        .await
}

/// D-5: afterwards the recorded name names another key, so deleting by name and by id differ.
#[when("the recorded provisioner key is replaced in coderd by someone else's key of the same name")]
async fn recorded_key_replaced_elsewhere(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    world.planted_keys = true;
    let key = recorded_key(world).await?;
    let organization = world.scenario_coderd()?.organization.clone();
    let admin = world.admin()?;
    admin.delete_key_directly(&organization, &key.id).await?;
    admin
        .create_key_directly(&organization, &key.name, key.tags.clone())
        .await
        .context("creating the replacement key")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::backoff_problem;
    use rstest::rstest;

    #[rstest]
    #[case::nominal(&[2.0, 4.0, 8.0], true)]
    #[case::jitter_at_the_edges(&[1.6, 4.8, 6.4], true)]
    #[case::scheduling_slack(&[2.9, 4.3], true)]
    #[case::immediate_retry(&[0.1, 0.1, 0.1], false)]
    #[case::no_growth(&[2.0, 2.0], false)]
    #[case::never_reset(&[8.0], false)]
    #[case::too_slow(&[2.0, 9.0], false)]
    fn a_doubling_backoff_is_recognised(#[case] gaps: &[f64], #[case] ok: bool) {
        assert_eq!(backoff_problem(gaps, 2.0).is_none(), ok, "{gaps:?}");
    }
}

/// R-KEY-25 as a step (the after-hook checks the same once every CR is settled).
#[then("coderd holds no key of the scenario's organizations that no provisioner records")]
async fn no_abandoned_key(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let crs = crate::scenario_checks::list_provisioners(world).await?;
    let found = crate::scenario_checks::abandoned_keys(world, &crs).await?;
    if !found.is_empty() {
        bail!("{}", found.join("; "));
    }
    Ok(())
}

/// The two routes D-12 lets an operator learn a new key's id on: by listing the organization's
/// keys, or with the key itself (`GET /api/v2/provisionerkeys/{key}`).
fn id_routes() -> anyhow::Result<[&'static str; 2]> {
    Ok([
        route_template("provisionerkeys")?,
        route_template("daemon-key")?,
    ])
}

/// After the operator's first key create since `start`: the route of its first request on either
/// route of [`id_routes`], the one it learns the new key's id on (`Some(None)` while it has not
/// asked yet). `None` while no key was created.
fn id_route_used(
    journal: &[JournalEntry],
    start: usize,
) -> anyhow::Result<Option<Option<&'static str>>> {
    let create = route_template("provisionerkeys")?;
    let id_routes = id_routes()?;
    let mut since = journal.iter().skip(start);
    if !since
        .by_ref()
        .any(|e| e.method == "POST" && e.route.as_deref() == Some(create) && e.status < 300)
    {
        return Ok(None);
    }
    Ok(Some(since.filter(|e| e.method == "GET").find_map(|e| {
        id_routes
            .into_iter()
            .find(|route| e.route.as_deref() == Some(*route))
    })))
}

/// D-12: a new key's id may be learned by listing keys or with the key itself. A scenario that
/// faults one of the two routes tests only an implementation shown to use it: this step waits
/// until, after its key create since the last action, the operator asked for the id on one of
/// them (the first such request tells which), or recorded the id of the key in its Secret without
/// either; unless it used the scenario's route, the scenario is reported skipped with that
/// reason. (On clusters with kubelets a daemon pod's own fetch of its key, in the moment between
/// the create and the operator's list, would count as a use: the two cannot be told apart from
/// coderd's side.)
#[then(
    regex = r"^the operator learns its new key's id (with the key itself|by listing the organization's keys), or this scenario does not apply \(D-12\)$"
)]
async fn learns_new_key_id_on(world: &mut ProvisionerWorld, way: String) -> anyhow::Result<()> {
    let [list, daemon_key] = id_routes()?;
    let (wanted, other) = if way == "with the key itself" {
        (daemon_key, list)
    } else {
        (list, daemon_key)
    };
    let start = world.action_mark.unwrap_or(0);
    let world = &*world;
    let used = wait::eventually(
        "the operator to ask for its new key's id, or to record it without",
        world.timeouts(),
        || async {
            let journal = world.journal().await?;
            Ok(match id_route_used(&journal, start)? {
                None => Err("no key created since the last action".to_owned()),
                Some(Some(route)) => Ok(Some(route)),
                Some(None) => recorded_without_asking(world).await?.map(|()| None),
            })
        },
    )
    .await?;
    match used {
        Some(route) if route == wanted => Ok(()),
        Some(_) => bail!(
            "{DOES_NOT_APPLY}it asked for its new key's id with GET {other} (D-12 permits either \
             route), so the fault this scenario injects on GET {wanted} cannot reach it"
        ),
        None => bail!(
            "{DOES_NOT_APPLY}it recorded its new key's id without GET {wanted} (D-12), so the \
             fault this scenario injects on that route cannot reach it"
        ),
    }
}

/// `Ok` once the CR's status records the id of the key in its Secret (learned some way the
/// journal does not show), else why not yet.
async fn recorded_without_asking(
    world: &ProvisionerWorld,
) -> anyhow::Result<wait::Observation<()>> {
    let Some(cr) = world.provisioner_json().await? else {
        return Ok(Err("the CoderProvisioner does not exist".to_owned()));
    };
    let recorded = cr
        .pointer("/status/provisionerKeyID")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let secret = cr.pointer("/status/secretRef/name").and_then(Value::as_str);
    let data_key = cr
        .pointer("/status/secretRef/key")
        .and_then(Value::as_str)
        .unwrap_or("key");
    let (Some(secret), false) = (secret, recorded.is_empty()) else {
        return Ok(Err("no key id recorded yet, and not asked for".to_owned()));
    };
    let api: kube::Api<Secret> = world.api();
    let plaintext = api
        .get_opt(secret)
        .await?
        .and_then(|s| s.data)
        .and_then(|d| d.get(data_key).map(|v| v.0.clone()))
        .filter(|v| !v.is_empty());
    let Some(plaintext) = plaintext else {
        return Ok(Err(format!("Secret {secret} holds no key yet")));
    };
    world.saw_secret(&plaintext);
    let stored_id = world
        .daemon_key_lookup(&String::from_utf8_lossy(&plaintext))
        .await
        .ok()
        .and_then(|key| key.get("id").and_then(Value::as_str).map(str::to_owned));
    Ok(if stored_id.as_deref() == Some(recorded) {
        Ok(())
    } else {
        Err(format!(
            "status records key {recorded}, not yet the one in Secret {secret}"
        ))
    })
}
