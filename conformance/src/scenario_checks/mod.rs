//! Checks that hold at the end of every scenario, whatever its steps, each derived from the
//! contract's text: the [`oracle`] (a settled CR, its children and coderd's keys agree with its
//! spec), quiet (a settled CR costs no key request, no status write and no key change), no
//! abandoned key (R-KEY-25), Secrets the suite wrote stay its own (R-SEC-15), and no secret
//! where anyone can read it ([`leaks`], R-SEC-14). They read the scenario's [`ProvisionerWorld`];
//! the pure checks they apply live in [`crate::invariants`].
//!
//! Every finding ends with the rule it breaks in parentheses, so the report blames that rule.
pub mod leaks;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

use crate::invariants::oracle::{self, CoderdView, Surroundings};
use crate::invariants::recorder::Recorded;
use crate::invariants::{after_deletion_findings, journal_findings};
use crate::world::ProvisionerWorld;

/// The kinds a CoderProvisioner's children are, with their API group and version.
const CHILD_KINDS: [(&str, &str, &str, &str); 5] = [
    ("", "v1", "Secret", "secrets"),
    ("", "v1", "ServiceAccount", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles"),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
    ),
    ("apps", "v1", "Deployment", "deployments"),
];

/// The end-of-scenario findings (empty when everything holds).
pub async fn end_of_scenario(world: &ProvisionerWorld) -> Vec<String> {
    match checks(world).await {
        Ok(findings) => findings,
        Err(error) => vec![format!(
            "the end-of-scenario checks could not run: {error:#}"
        )],
    }
}

async fn checks(world: &ProvisionerWorld) -> anyhow::Result<Vec<String>> {
    let mut findings = suite_objects_untouched(world).await?;
    if world.settles_at_end {
        findings.extend(settle_once_coderd_answers(world).await?);
    }
    if !world.other_coderds.is_empty() {
        findings.extend(organizations_asked_elsewhere(world).await?);
    }
    if world.env.coderd.admin.is_some() && world.coderd.is_some() {
        let journal = world.journal().await?;
        findings.extend(journal_findings(&journal));
        findings.extend(rate_limited_without_429(world, &journal).await?);
        if let Some(deleted_at) = world
            .recorder
            .as_ref()
            .and_then(|r| r.read(Recorded::only_cr_deleted_at))
        {
            findings.extend(after_deletion_findings(&journal, deleted_at));
        }
    }
    let crs = list_provisioners(world).await?;
    let settled = settled_among(world, &crs).await;
    if settled.is_empty() {
        return Ok(findings);
    }
    for name in &settled {
        findings.extend(settled_findings(world, name).await?);
    }
    findings.extend(quiet_findings(world, &settled).await?);
    if settled.len() == crs.len() {
        findings.extend(abandoned_keys(world, &crs).await?);
    }
    Ok(findings)
}

/// R-RL-1 and R-KEY-18: `RateLimited` is the reason for a 429 only; another failure is
/// `ProvisionerKeyFailed`. A CR that showed it in a scenario none of whose requests coderd
/// answered 429 took another answer for one. A key's own lookup carries no token, so a 429 on
/// any key lookup of the run (the scenario's or not) counts as possibly the scenario's.
async fn rate_limited_without_429(
    world: &ProvisionerWorld,
    journal: &[fake_coderd::JournalEntry],
) -> anyhow::Result<Vec<String>> {
    let seen = world
        .recorder
        .as_ref()
        .is_some_and(|r| r.read(|seen| seen.rate_limited_seen));
    if !seen || journal.iter().any(|e| e.status == 429) {
        return Ok(Vec::new());
    }
    let lookup = crate::coderd_routes::route_template("daemon-key")?;
    let coderds = std::iter::once(&world.env.coderd).chain(&world.env.other_coderds);
    for coderd in coderds {
        if let Some(admin) = &coderd.admin
            && admin
                .journal()
                .await?
                .iter()
                .any(|e| e.status == 429 && e.route.as_deref() == Some(lookup))
        {
            return Ok(Vec::new());
        }
    }
    Ok(vec![
        "a CoderProvisioner showed ProvisionerKeyReady=False with reason RateLimited, but coderd answered none of the scenario's requests with 429 (R-RL-1, R-KEY-18)".to_owned(),
    ])
}

/// The longest a CR may wait for its next pass once coderd answers normally: R-RL-2's longest
/// backoff, then D-10's prompt outcome.
fn settle_deadline(world: &ProvisionerWorld) -> Duration {
    const LONGEST_BACKOFF: Duration = Duration::from_secs(120);
    LONGEST_BACKOFF.mul_f64(world.timeouts().scale) + world.timeouts().eventually / 3
}

/// Coderd answers normally from now on (the scenario's faults and global switches cleared);
/// every CR not being deleted must then settle within [`settle_deadline`], so that the oracle
/// asks coderd about each key Secret's key. Those that do not are findings against the rules
/// their status contradicts.
async fn settle_once_coderd_answers(world: &ProvisionerWorld) -> anyhow::Result<Vec<String>> {
    if world.env.coderd.admin.is_none() || world.coderd.is_none() {
        return Ok(Vec::new());
    }
    world.clear_scenario_faults().await?;
    if world.touched_global_coderd {
        world.restore_global_coderd().await?;
    }
    let started = tokio::time::Instant::now();
    let deadline = started + settle_deadline(world);
    loop {
        let unsettled: Vec<Value> = list_provisioners(world)
            .await?
            .into_iter()
            .filter(|cr| cr.pointer("/metadata/deletionTimestamp").is_none())
            .filter(|cr| !oracle::ready_for_its_spec(cr))
            .collect();
        if unsettled.is_empty() {
            return Ok(Vec::new());
        }
        if tokio::time::Instant::now() >= deadline {
            let seconds = started.elapsed().as_secs();
            // R-RL-2 bounds the wait only after a 429.
            let rate_limited = world.journal().await?.iter().any(|e| e.status == 429);
            return Ok(unsettled
                .iter()
                .map(|cr| {
                    let mut rules = oracle::unsettled_rules(cr);
                    if rate_limited {
                        rules.push("R-RL-2");
                    }
                    format!(
                        "CoderProvisioner {} did not settle within {seconds} s of coderd answering normally again, so its key Secret's key was never shown to authenticate ({})",
                        name_of(cr).unwrap_or_default(),
                        rules.join(", ")
                    )
                })
                .collect());
        }
        tokio::time::sleep(world.timeouts().interval).await;
    }
}

/// R-KEY-1 with several coderds: an organization is resolved on the coderd it is used on, so
/// no request of the scenario names, on one coderd, an organization id that only another coderd
/// holds (an id taken from a cache or identity keyed by less than the whole coderd).
async fn organizations_asked_elsewhere(world: &ProvisionerWorld) -> anyhow::Result<Vec<String>> {
    let mut coderds: Vec<(Option<usize>, &crate::world::Coderd)> = vec![(None, &world.env.coderd)];
    coderds.extend(
        world
            .other_coderds
            .iter()
            .map(|o| (Some(o.index), &world.env.other_coderds[o.index])),
    );
    let mut held: BTreeMap<Option<usize>, (String, BTreeSet<String>)> = BTreeMap::new();
    for (source, coderd) in coderds {
        let Some(admin) = &coderd.admin else {
            return Ok(Vec::new());
        };
        let ids = admin
            .organizations()
            .await?
            .into_iter()
            .map(|o| o.id.to_string())
            .collect();
        held.insert(source, (coderd.url.clone(), ids));
    }
    let mut found = BTreeSet::new();
    for (source, entry) in world.journal_by_coderd().await? {
        let Some((url, own)) = held.get(&source) else {
            continue;
        };
        let Some(id) = entry
            .path
            .strip_prefix("/api/v2/organizations/")
            .and_then(|rest| rest.split('/').next())
        else {
            continue;
        };
        if own.contains(id) {
            continue;
        }
        if let Some((elsewhere, _)) = held.values().find(|(_, ids)| ids.contains(id)) {
            found.insert(format!(
                "the operator sent {} {} to coderd {url}, naming organization {id}, which only coderd {elsewhere} holds (R-KEY-1)",
                entry.method, entry.path
            ));
        }
    }
    Ok(found.into_iter().collect())
}

fn name_of(object: &Value) -> Option<&str> {
    object.pointer("/metadata/name").and_then(Value::as_str)
}

pub async fn list_provisioners(world: &ProvisionerWorld) -> anyhow::Result<Vec<Value>> {
    world
        .provisioners()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|cr| Ok(serde_json::to_value(cr)?))
        .collect()
}

/// The names of the CRs, among `crs`, whose key is ready for their spec once each has settled
/// (D-15: unchanged for the tier's window). The end-of-scenario oracle judges those alone; a CR
/// still changing after D-10's prompt window, or no longer ready, is not judged here.
async fn settled_among(world: &ProvisionerWorld, crs: &[Value]) -> Vec<String> {
    let timeouts = crate::wait::Timeouts {
        eventually: prompt(world),
        ..*world.timeouts()
    };
    let mut settled = Vec::new();
    for name in crs
        .iter()
        .filter(|cr| cr.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|cr| oracle::ready_for_its_spec(cr))
        .filter_map(name_of)
    {
        let ready = |cr: &Value| {
            if oracle::ready_for_its_spec(cr) {
                Ok(())
            } else {
                Err("its key is no longer ready for its spec".to_owned())
            }
        };
        let waited = world
            .provisioner_settles(name, "the CR to settle", &timeouts, ready)
            .await;
        if waited.is_ok() {
            settled.push(name.to_owned());
        }
    }
    settled
}

/// How long a settled CR's world may take to catch up with its status (D-10's prompt outcome):
/// an operator that writes its status before its children is given that long.
fn prompt(world: &ProvisionerWorld) -> Duration {
    world.timeouts().eventually / 3
}

/// The oracle for one settled CR, polled until it holds or `prompt` passes; a CR that stops
/// being settled meanwhile (the operator is still at work) is not judged.
pub async fn settled_findings(world: &ProvisionerWorld, name: &str) -> anyhow::Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + prompt(world);
    loop {
        let Some(cr) = world.provisioners().get_opt(name).await? else {
            return Ok(Vec::new());
        };
        let cr = serde_json::to_value(cr)?;
        if !oracle::ready_for_its_spec(&cr) {
            return Ok(Vec::new());
        }
        let around = surroundings(world, &cr).await?;
        let found = oracle::world_findings(&cr, &around);
        if found.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(found
                .into_iter()
                .map(|f| format!("CoderProvisioner {name} (settled): {f}"))
                .collect());
        }
        tokio::time::sleep(world.timeouts().interval).await;
    }
}

async fn surroundings(world: &ProvisionerWorld, cr: &Value) -> anyhow::Result<Surroundings> {
    let control_plane = match cr
        .pointer("/spec/controlPlaneRef/name")
        .and_then(Value::as_str)
    {
        Some(name) if !name.is_empty() => world
            .control_planes()
            .get_opt(name)
            .await?
            .map(serde_json::to_value)
            .transpose()?,
        _ => None,
    };
    let mut objects = Vec::new();
    for (group, version, kind, plural) in CHILD_KINDS {
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> =
            Api::namespaced_with(world.client(), &world.namespace, &resource);
        for item in api.list(&ListParams::default()).await?.items {
            let mut item = serde_json::to_value(item)?;
            item["kind"] = Value::from(kind);
            objects.push(item);
        }
    }
    // The coderd the CR's status names: the fake, or another coderd of the same host.
    let at = world.coderd_at(
        cr.pointer("/status/controlPlaneURL")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    );
    let coderd = match at.admin.as_ref() {
        Some(admin) => Some(coderd_view(admin, cr).await?),
        None => None,
    };
    let secret_key_identity = match at.admin {
        Some(_) => key_identity(world, at, cr).await,
        None => None,
    };
    Ok(Surroundings {
        control_plane,
        objects,
        coderd,
        secret_key_identity,
    })
}

async fn coderd_view(admin: &fake_coderd::AdminClient, cr: &Value) -> anyhow::Result<CoderdView> {
    let mut organizations = BTreeMap::new();
    for organization in admin.organizations().await? {
        if organization.is_default {
            organizations.insert("default".to_owned(), organization.id.clone());
        }
        organizations.insert(organization.name.to_lowercase(), organization.id);
    }
    let recorded = cr
        .pointer("/status/organizationID")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let keys = if organizations.values().any(|id| id == recorded) {
        admin.keys(recorded).await?
    } else {
        Vec::new()
    };
    Ok(CoderdView {
        organizations,
        keys,
    })
}

/// Which key the plaintext in the CR's key Secret authenticates as, asked as a daemon asks
/// (`GET /api/v2/provisionerkeys/{key}`); `None` when there is no value to ask about (the
/// oracle reports the missing value itself).
async fn key_identity(
    world: &ProvisionerWorld,
    coderd: &crate::world::Coderd,
    cr: &Value,
) -> Option<Result<String, String>> {
    let name = cr.pointer("/status/secretRef/name")?.as_str()?;
    let data_key = cr.pointer("/status/secretRef/key")?.as_str()?;
    let secret = world.api::<Secret>().get_opt(name).await.ok()??;
    let value = secret.data?.get(data_key)?.0.clone();
    if value.is_empty() {
        return None;
    }
    world.saw_secret(&value);
    let key = String::from_utf8_lossy(&value).into_owned();
    Some(
        world
            .daemon_key_lookup_at(coderd, &key)
            .await
            .map(|answer| {
                answer
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            })
            .map_err(|error| format!("{error:#}")),
    )
}

/// What a quiet window compares: each settled CR's status and key value, and the scenario's key
/// requests.
#[derive(PartialEq)]
struct Snapshot {
    statuses: BTreeMap<String, Value>,
    key_values: BTreeMap<String, Option<Vec<u8>>>,
}

async fn snapshot(world: &ProvisionerWorld, names: &[String]) -> anyhow::Result<Snapshot> {
    let mut statuses = BTreeMap::new();
    let mut key_values = BTreeMap::new();
    for name in names {
        let Some(cr) = world.provisioners().get_opt(name).await? else {
            continue;
        };
        let cr = serde_json::to_value(cr)?;
        statuses.insert(name.clone(), cr.get("status").cloned().unwrap_or_default());
        let secret = cr
            .pointer("/status/secretRef/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let data_key = cr
            .pointer("/status/secretRef/key")
            .and_then(Value::as_str)
            .unwrap_or("key")
            .to_owned();
        let value = world
            .api::<Secret>()
            .get_opt(&secret)
            .await?
            .and_then(|s| s.data)
            .and_then(|d| d.get(&data_key).map(|v| v.0.clone()));
        key_values.insert(name.clone(), value);
    }
    Ok(Snapshot {
        statuses,
        key_values,
    })
}

async fn key_requests(world: &ProvisionerWorld) -> anyhow::Result<Vec<fake_coderd::JournalEntry>> {
    if world.env.coderd.admin.is_none() || world.coderd.is_none() {
        return Ok(Vec::new());
    }
    Ok(world
        .journal()
        .await?
        .into_iter()
        .filter(|e| crate::coderd_routes::is_key_request(e.route.as_deref()))
        .collect())
}

/// A settled CR stays quiet for a window at the end of the scenario: no key request (R-KEY-4),
/// no status write (R-ST-7), no new key value (R-SEC-5).
async fn quiet_findings(world: &ProvisionerWorld, names: &[String]) -> anyhow::Result<Vec<String>> {
    let window = world.env.observation_window.current() / 4;
    let before = snapshot(world, names).await?;
    let requests_before = key_requests(world).await?.len();
    tokio::time::sleep(window).await;
    let after = snapshot(world, names).await?;
    let requests = key_requests(world).await?;
    let mut found = Vec::new();
    let seconds = window.as_secs_f64();
    if requests.len() > requests_before {
        let new: Vec<String> = requests[requests_before..]
            .iter()
            .map(|e| format!("{} {} → {}", e.method, e.path, e.status))
            .collect();
        found.push(format!(
            "with every CoderProvisioner settled, the operator made key requests in the next {seconds:.0} s: {} (R-KEY-4)",
            new.join("; ")
        ));
    }
    for (name, status) in &before.statuses {
        match after.statuses.get(name) {
            Some(later) if without_readiness(later) != without_readiness(status) => {
                found.push(format!(
                    "CoderProvisioner {name} (settled): its status was written again within {seconds:.0} s with nothing changed (R-ST-7)"
                ));
            }
            _ => {}
        }
        if before.key_values.get(name) != after.key_values.get(name) {
            found.push(format!(
                "CoderProvisioner {name} (settled): its key Secret's value changed within {seconds:.0} s with nothing changed (R-SEC-5)"
            ));
        }
    }
    Ok(found)
}

/// A status without what follows the pods' readiness (phase, readyReplicas, DeploymentReady),
/// which may still move when the scenario ends.
fn without_readiness(status: &Value) -> Value {
    let mut status = status.clone();
    if let Some(fields) = status.as_object_mut() {
        fields.remove("phase");
        fields.remove("readyReplicas");
        if let Some(conditions) = fields.get_mut("conditions").and_then(Value::as_array_mut) {
            conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some("DeploymentReady"));
        }
    }
    status
}

/// R-KEY-25: once every CR is settled and none was deleted, every key in the scenario's own
/// organizations is one a CR records (scenarios that planted keys themselves are not judged).
pub async fn abandoned_keys(
    world: &ProvisionerWorld,
    crs: &[Value],
) -> anyhow::Result<Vec<String>> {
    let (Some(admin), Some(coderd)) = (world.env.coderd.admin.as_ref(), world.coderd.as_ref())
    else {
        return Ok(Vec::new());
    };
    let deleted = world
        .recorder
        .as_ref()
        .is_some_and(|r| r.read(|seen| !seen.deleted_provisioners.is_empty()));
    if coderd.organization_id.is_empty() || world.planted_keys || deleted {
        return Ok(Vec::new());
    }
    let recorded: BTreeSet<&str> = crs
        .iter()
        .filter_map(|cr| {
            cr.pointer("/status/provisionerKeyID")
                .and_then(Value::as_str)
        })
        .collect();
    // R-KEY-16: a rotation whose old-key delete failed rightly leaves that key behind; so does
    // one whose list before that delete failed (R-DEL-4: a delete by id starts with the list),
    // which names no key: then no key is held against the operator.
    let journal = world.journal().await?;
    if journal.iter().any(crate::invariants::is_failed_key_list) {
        return Ok(Vec::new());
    }
    let failed_deletes: BTreeSet<String> = journal
        .into_iter()
        .filter(|e| e.method == "DELETE" && !(200..300).contains(&e.status) && e.status != 404)
        .filter_map(|e| e.path.rsplit('/').next().map(str::to_owned))
        .collect();
    let mut organizations = vec![coderd.organization_id.clone()];
    organizations.extend(world.second_organization.iter().map(|(_, id)| id.clone()));
    let mut held = vec![(admin, world.env.coderd.url.as_str(), organizations)];
    for other in &world.other_coderds {
        let at = &world.env.other_coderds[other.index];
        if let Some(admin) = &at.admin {
            let ids = other
                .organizations
                .iter()
                .map(|(_, id)| id.clone())
                .collect();
            held.push((admin, at.url.as_str(), ids));
        }
    }
    let mut found = Vec::new();
    for (admin, url, organizations) in held {
        for organization in organizations {
            for key in admin.keys(&organization).await? {
                if !recorded.contains(key.id.as_str()) && !failed_deletes.contains(&key.name) {
                    found.push(format!(
                        "coderd {url} still holds key {:?} ({}) that no CoderProvisioner records, with every CoderProvisioner settled (R-KEY-25)",
                        key.name, key.id
                    ));
                }
            }
        }
    }
    Ok(found)
}

/// R-SEC-15: the Secrets the suite wrote (operator token, credentials, a Secret to be refused)
/// carry no field manager but the suite's own: the operator never writes a Secret it does not
/// control.
pub async fn suite_objects_untouched(world: &ProvisionerWorld) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    for (name, (uid, managers)) in &world.suite_secrets {
        let Some(secret) = world.api::<Secret>().get_opt(name).await? else {
            continue;
        };
        // Deleted and made again by someone else: another Secret of the same name.
        if secret.metadata.uid.as_ref() != Some(uid) {
            continue;
        }
        let writers: BTreeSet<String> = secret
            .metadata
            .managed_fields
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.manager)
            .filter(|manager| !managers.contains(manager))
            .collect();
        if !writers.is_empty() {
            found.push(format!(
                "Secret {name}, which the suite wrote, was also written by {writers:?} (R-SEC-15)"
            ));
        }
    }
    Ok(found)
}
