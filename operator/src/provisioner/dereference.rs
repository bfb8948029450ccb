//! Reads everything a pass decides from (I/O only, no decisions): the objects a
//! CoderProvisioner names, and once the prerequisites passed, the entitlement reading.
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};

use crate::api::{CoderControlPlane, CoderProvisioner};
use crate::coderd::{CoderdClient, CoderdError, SecretString};

use super::credentials::{SecretMeta, credential_refs};
use super::entitlement_cache::EntitlementCache;
use super::gates::{self, EntitlementReading, EntitlementSource, token_secret_ref};
use super::names::Names;

/// The objects one pass works from. Absent objects are `None`; errors other than 404 abort.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub control_plane: Option<CoderControlPlane>,
    pub token_secret: Option<Secret>,
    /// Secrets named by `extraEnv` secretKeyRefs: only their labels and annotations.
    pub credential_secrets: BTreeMap<String, Option<SecretMeta>>,
    pub key_secret: Option<Secret>,
    pub deployment: Option<Deployment>,
}

/// The CR as the API server has it now, not the watch cache's copy (which can predate this
/// operator's own last status write); `None` when it is gone.
pub async fn live_provisioner(
    client: &Client,
    cached: &CoderProvisioner,
) -> kube::Result<Option<CoderProvisioner>> {
    let namespace = cached.metadata.namespace.as_deref().unwrap_or_default();
    let name = cached.metadata.name.as_deref().unwrap_or_default();
    Api::<CoderProvisioner>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
}

pub async fn control_plane(
    client: &Client,
    namespace: &str,
    name: &str,
) -> kube::Result<Option<CoderControlPlane>> {
    if name.trim().is_empty() {
        return Ok(None);
    }
    Api::<CoderControlPlane>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
}

/// The operator token Secret the control plane names, if any.
pub async fn token_secret(
    client: &Client,
    namespace: &str,
    control_plane: Option<&CoderControlPlane>,
) -> kube::Result<Option<Secret>> {
    match control_plane.and_then(token_secret_ref) {
        Some((name, _)) => {
            Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(&name)
                .await
        }
        None => Ok(None),
    }
}

pub async fn observe(
    client: &Client,
    cr: &CoderProvisioner,
    names: &Names,
) -> kube::Result<Observed> {
    let namespace = cr.metadata.namespace.as_deref().unwrap_or("default");
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let control_plane = control_plane(client, namespace, &cr.spec.control_plane_ref.name).await?;
    let token_secret = token_secret(client, namespace, control_plane.as_ref()).await?;
    let mut credential_secrets = BTreeMap::new();
    for credential in credential_refs(
        cr.spec.extra_env.as_deref().unwrap_or_default(),
        &names.key_secret,
    ) {
        let meta = secrets
            .get_metadata_opt(&credential.secret)
            .await?
            .map(|secret| SecretMeta {
                labels: secret.metadata.labels.unwrap_or_default(),
                annotations: secret.metadata.annotations.unwrap_or_default(),
            });
        credential_secrets.insert(credential.secret, meta);
    }
    let key_secret = secrets.get_opt(&names.key_secret).await?;
    let deployment = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(&names.workload)
        .await?;
    Ok(Observed {
        control_plane,
        token_secret,
        credential_secrets,
        key_secret,
        deployment,
    })
}

/// Gate 4's reading: the control plane's own when it is recent, else coderd's answer through the
/// shared cache (one request per coderd, token and window; R-ENT-1…3).
pub async fn entitlement(
    cache: &EntitlementCache,
    control_plane: &CoderControlPlane,
    url: &str,
    token: &SecretString,
    coderd: Result<&CoderdClient, &CoderdError>,
    now: Timestamp,
) -> EntitlementReading {
    match gates::entitlement_from_control_plane(control_plane, now) {
        EntitlementSource::Fresh(outcome) => EntitlementReading::ControlPlane(outcome),
        EntitlementSource::AskCoderd => EntitlementReading::Coderd(match coderd {
            Ok(client) => {
                cache
                    .reading(url, token, || async {
                        let entitlements = client.entitlements().await?;
                        Ok(entitlements.external_provisioner_daemons())
                    })
                    .await
            }
            Err(error) => Err(error.clone()),
        }),
    }
}
