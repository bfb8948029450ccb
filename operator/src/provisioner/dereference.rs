//! Reads everything a CoderProvisioner names (I/O only, no decisions).
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::api::{CoderControlPlane, CoderProvisioner};

use super::credentials::{SecretMeta, credential_refs};
use super::gates::token_secret_ref;
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
