//! The run's setup beyond the cluster: which CRDs are judged, what else is installed before the
//! operator starts (`--extra-manifests`), and how the setup is written into the report (the
//! operator command with its secrets masked, digests of every manifest set, the timeouts).
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};

use crate::manifests::ObjectRef;
use crate::report::model::{FeatureFile, ManifestSet, SetupTimeouts, files_digest, sha256_hex};
use crate::wait::Timeouts;

/// API group of the contract's CRDs.
pub const CRD_GROUP: &str = "coder.com";
/// What replaces a secret in a recorded command.
pub const MASK: &str = "***";

/// Word fragments that mark a flag or variable as secret.
const SECRET_WORDS: [&str; 8] = [
    "token",
    "secret",
    "password",
    "passwd",
    "apikey",
    "api-key",
    "api_key",
    "credential",
];

fn is_secret_name(name: &str) -> bool {
    let name = name.trim_start_matches('-').to_ascii_lowercase();
    SECRET_WORDS.iter().any(|word| name.contains(word))
}

/// `command` with secret values replaced by [`MASK`]: values of flags and variables whose name
/// mentions a token, secret, password, API key or credential (`--token=x`, `--token x`,
/// `CODER_TOKEN=x`), passwords in URLs (`https://user:x@host`) and bearer tokens.
pub fn mask_secrets(command: &str) -> String {
    let words: Vec<&str> = command.split(' ').collect();
    let mut masked = Vec::with_capacity(words.len());
    let mut mask_next = false;
    for word in words {
        if mask_next && !word.is_empty() {
            mask_next = false;
            if !word.starts_with('-') {
                masked.push(MASK.to_owned());
                continue;
            }
        }
        if word.eq_ignore_ascii_case("bearer") {
            mask_next = true;
            masked.push(word.to_owned());
            continue;
        }
        if let Some((name, _value)) = word.split_once('=')
            && is_secret_name(name.trim_start_matches(['\'', '"']))
        {
            masked.push(format!("{name}={MASK}"));
            continue;
        }
        if word.starts_with("--") && is_secret_name(word) {
            mask_next = true;
        }
        masked.push(mask_url_password(word));
    }
    masked.join(" ")
}

/// `scheme://user:password@host…` → `scheme://user:***@host…`.
fn mask_url_password(word: &str) -> String {
    let Some(scheme_end) = word.find("://") else {
        return word.to_owned();
    };
    let authority_start = scheme_end + 3;
    let authority_end = word[authority_start..]
        .find('/')
        .map_or(word.len(), |i| authority_start + i);
    let authority = &word[authority_start..authority_end];
    match authority.rfind('@').and_then(|at| {
        authority[..at]
            .find(':')
            .map(|colon| (authority_start + colon + 1, authority_start + at))
    }) {
        Some((from, to)) => format!("{}{MASK}{}", &word[..from], &word[to..]),
        None => word.to_owned(),
    }
}

/// The report's view of the run's deadlines.
pub fn timeouts(timeouts: &Timeouts, scale: Option<f64>) -> SetupTimeouts {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    SetupTimeouts {
        eventually_ms: ms(timeouts.eventually),
        hold_window_ms: ms(timeouts.hold_window),
        hold_window_measured: None,
        interval_ms: ms(timeouts.interval),
        reach_and_hold: timeouts.reach_and_hold,
        hold_observations: timeouts.hold_observations,
        timeout_scale: scale,
    }
}

/// The contract's CRDs as installed in the cluster (for an installed operator): each CRD's
/// sha256 is over the JSON of its `spec`, which is what judges the CRs.
pub async fn installed_crds(client: &kube::Client) -> anyhow::Result<ManifestSet> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut files: Vec<FeatureFile> = api
        .list(&ListParams::default())
        .await
        .context("listing the installed CRDs")?
        .items
        .into_iter()
        .filter(|crd| crd.spec.group == CRD_GROUP)
        .map(|crd| -> anyhow::Result<FeatureFile> {
            Ok(FeatureFile {
                path: crd.metadata.name.clone().unwrap_or_default(),
                sha256: sha256_hex(&serde_json::to_vec(&crd.spec)?),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(ManifestSet {
        source: "cluster".to_owned(),
        sha256: files_digest(&files),
        files,
    })
}

/// Applies `--extra-manifests` (CRDs and Namespaces first, CRDs awaited until Established) and
/// waits until every Deployment among them is available.
pub async fn apply_extra_manifests(
    client: &kube::Client,
    dir: &std::path::Path,
    timeout: Duration,
) -> anyhow::Result<Vec<ObjectRef>> {
    let applied = crate::manifests::apply_dir(client, dir, None)
        .await
        .with_context(|| format!("applying --extra-manifests {}", dir.display()))?;
    let deadline = Instant::now() + timeout;
    for object in applied.iter().filter(|o| o.kind == "Deployment") {
        let namespace = object.namespace.as_deref().unwrap_or("default");
        let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        loop {
            let deployment = api
                .get_opt(&object.name)
                .await
                .with_context(|| format!("reading {object}"))?;
            if deployment.as_ref().is_some_and(deployment_available) {
                break;
            }
            if Instant::now() >= deadline {
                bail!("{object} of --extra-manifests is not available within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(applied)
}

/// `Available=True`, or as many ready replicas as wanted.
fn deployment_available(deployment: &Deployment) -> bool {
    let Some(status) = &deployment.status else {
        return false;
    };
    let available = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Available" && c.status == "True");
    let wanted = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    available || status.ready_replicas.unwrap_or(0) >= wanted
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("./op run --verbose", "./op run --verbose")]
    #[case("./op --token=abc run", "./op --token=*** run")]
    #[case("./op --api-key abc run", "./op --api-key *** run")]
    #[case("./op --token --verbose", "./op --token --verbose")]
    #[case("CODER_SESSION_TOKEN=abc ./op", "CODER_SESSION_TOKEN=*** ./op")]
    #[case("DB_PASSWORD=x ./op", "DB_PASSWORD=*** ./op")]
    #[case(
        "./op --url https://me:pw@coder.example/api",
        "./op --url https://me:***@coder.example/api"
    )]
    #[case(
        "./op --url https://coder.example:8443/api",
        "./op --url https://coder.example:8443/api"
    )]
    #[case(
        "curl -H 'Authorization: Bearer abc' x",
        "curl -H 'Authorization: Bearer *** x"
    )]
    #[case(
        "./op --kubeconfig=/k --namespace=a",
        "./op --kubeconfig=/k --namespace=a"
    )]
    fn secrets_are_masked(#[case] command: &str, #[case] expected: &str) {
        assert_eq!(mask_secrets(command), expected);
    }

    #[rstest]
    #[case(Some(3), Some(3), vec![], true)]
    #[case(Some(3), Some(1), vec![], false)]
    #[case(Some(3), Some(0), vec![("Available", "True")], true)]
    #[case(None, None, vec![("Available", "False")], false)]
    fn deployments_count_as_available(
        #[case] replicas: Option<i32>,
        #[case] ready: Option<i32>,
        #[case] conditions: Vec<(&str, &str)>,
        #[case] expected: bool,
    ) {
        use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentSpec, DeploymentStatus};
        let deployment = Deployment {
            spec: Some(DeploymentSpec {
                replicas,
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                ready_replicas: ready,
                conditions: Some(
                    conditions
                        .into_iter()
                        .map(|(t, s)| DeploymentCondition {
                            type_: t.into(),
                            status: s.into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(deployment_available(&deployment), expected);
    }
}
