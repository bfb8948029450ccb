//! Server-side apply of child objects and of the CR status (one field manager, forced, so manual
//! edits of managed fields are reverted; fields the operator does not set are left alone).
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{CoderProvisioner, CoderProvisionerStatus};

/// Applies `object` (name and namespace from its metadata) and returns the object as stored.
pub async fn apply<K>(client: &Client, field_manager: &str, object: &K) -> kube::Result<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let meta = object.meta();
    let api: Api<K> = Api::namespaced(
        client.clone(),
        meta.namespace.as_deref().unwrap_or("default"),
    );
    let name = meta.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(object),
    )
    .await
}

/// Applies the whole status through the `/status` subresource.
pub async fn apply_status(
    client: &Client,
    field_manager: &str,
    cr: &CoderProvisioner,
    status: &CoderProvisionerStatus,
) -> kube::Result<CoderProvisioner> {
    let api: Api<CoderProvisioner> = Api::namespaced(
        client.clone(),
        cr.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let patch = serde_json::json!({
        "apiVersion": "coder.com/v1alpha1",
        "kind": "CoderProvisioner",
        "status": status,
    });
    let name = cr.metadata.name.clone().unwrap_or_default();
    api.patch_status(
        &name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&patch),
    )
    .await
}
