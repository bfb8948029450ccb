//! R-SEC-14: no secret the scenario knows appears where anyone can read it (the operator's log,
//! Events, the CR's status and annotations). The after-hook runs it with the violations the
//! scenario's observations found, and fails the scenario on a finding; `no secret … appears`
//! runs the leak search as a step.
use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams};
use serde_json::Value;

use crate::invariants::recorder::Recorded;
use crate::world::ProvisionerWorld;

/// Secret values shorter than this are not searched for (they would match by accident).
const MIN_SECRET_LEN: usize = 8;

/// Where each secret appears in the given texts, as `"<kind of secret> in <place>"`; the
/// secret itself never appears in the answer.
pub fn find_leaks(places: &[(String, String)], secrets: &[(String, String)]) -> Vec<String> {
    let mut leaks = Vec::new();
    for (kind, secret) in secrets {
        if secret.len() < MIN_SECRET_LEN {
            continue;
        }
        for (place, text) in places {
            if text.contains(secret.as_str()) {
                leaks.push(format!("{kind} appears in {place}"));
            }
        }
    }
    leaks.sort();
    leaks.dedup();
    leaks
}

/// The secrets the scenario knows, each with a description that is safe to print.
async fn known_secrets(world: &ProvisionerWorld) -> anyhow::Result<Vec<(String, String)>> {
    let mut secrets: Vec<(String, String)> = world
        .secret_values()
        .into_iter()
        .map(|value| ("a secret value the scenario used".to_owned(), value))
        .collect();
    let api: Api<Secret> = world.api();
    for secret in api
        .list(&ListParams::default())
        .await
        .context("listing Secrets")?
        .items
    {
        let name = secret.metadata.name.clone().unwrap_or_default();
        for (key, value) in secret.data.into_iter().flatten() {
            secrets.push((
                format!("the value of Secret {name} data.{key}"),
                String::from_utf8_lossy(&value.0).into_owned(),
            ));
        }
    }
    Ok(secrets)
}

/// The readable places a secret must never reach: the operator's log (when the suite can read
/// it), the namespace's Events, the CR's status and annotations.
async fn public_places(world: &ProvisionerWorld) -> anyhow::Result<Vec<(String, String)>> {
    let mut places = Vec::new();
    if let Some(log) = world.operator_log(None).await {
        places.push(("the operator's log".to_owned(), log));
    }
    let events: Api<Event> = world.api();
    for event in events
        .list(&ListParams::default())
        .await
        .context("listing Events")?
        .items
    {
        let name = event.metadata.name.clone().unwrap_or_default();
        places.push((format!("Event {name}"), serde_json::to_string(&event)?));
    }
    let provisioners = world
        .provisioners()
        .list(&ListParams::default())
        .await
        .context("listing CoderProvisioners")?;
    for cr in provisioners.items {
        let name = cr.metadata.name.clone().unwrap_or_default();
        let annotations = serde_json::to_string(&cr.metadata.annotations)?;
        places.push((
            format!("the annotations of CoderProvisioner {name}"),
            annotations,
        ));
        let status = cr
            .data
            .get("status")
            .map(Value::to_string)
            .unwrap_or_default();
        places.push((format!("the status of CoderProvisioner {name}"), status));
    }
    Ok(places)
}

/// R-SEC-14: every place where one of the scenario's secrets appears.
pub async fn leaks(world: &ProvisionerWorld) -> anyhow::Result<Vec<String>> {
    let secrets = known_secrets(world).await?;
    let places = public_places(world).await?;
    Ok(find_leaks(&places, &secrets))
}

/// What the after-hook reports: leaks and invariant violations seen during the scenario.
pub async fn findings(world: &ProvisionerWorld) -> Vec<String> {
    // Polls and the namespace watch see many of the same observations: one finding each.
    let mut observed = world
        .violations
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    if let Some(recorder) = &world.recorder {
        observed.extend(recorder.read(Recorded::violations));
    }
    let mut findings: Vec<String> = observed.into_iter().collect();
    match leaks(world).await {
        Ok(leaks) => findings.extend(
            leaks
                .into_iter()
                .map(|l| format!("secret leak (R-SEC-14): {l}")),
        ),
        Err(error) => findings.push(format!("the leak check could not run: {error:#}")),
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaks_name_the_place_and_never_the_secret() {
        let places = vec![
            (
                "the operator's log".to_owned(),
                "INFO token=s3cr3t-token-value".to_owned(),
            ),
            ("Event e1".to_owned(), "created key".to_owned()),
        ];
        let secrets = vec![
            (
                "the session token".to_owned(),
                "s3cr3t-token-value".to_owned(),
            ),
            ("a short value".to_owned(), "key".to_owned()),
        ];
        let leaks = find_leaks(&places, &secrets);
        assert_eq!(
            leaks,
            vec!["the session token appears in the operator's log"]
        );
        assert!(!leaks.concat().contains("s3cr3t"));
    }
}
