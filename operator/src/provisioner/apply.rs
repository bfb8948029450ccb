//! Server-side apply of child objects and of the CR status (one field manager, forced, so manual
//! edits of managed fields are reverted; fields the operator does not set are left alone).
//!
//! Children are applied only when the cluster's copy differs, so steady-state passes and the
//! passes after a restart write nothing (see [`apply_unless_current`]).
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{CoderProvisioner, CoderProvisionerStatus};

/// What a namespaced child object needs to be read, compared and applied.
pub trait Child:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Serialize
    + DeserializeOwned
    + Clone
    + Debug
{
}

impl<K> Child for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug
{
}

/// Annotation on every applied child: a hash of the child as the operator applied it.
pub const APPLIED_HASH_ANNOTATION: &str = "coder.com/applied-hash";

/// FNV-1a, 64 bit (stable across builds, unlike std's hasher).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `object` with [`APPLIED_HASH_ANNOTATION`] set to the hash of its serialization (k8s-openapi
/// writes fields in a fixed order and maps sorted, so equal objects hash equally).
pub fn stamped<K: Resource + Serialize + Clone>(object: &K) -> serde_json::Result<K> {
    let hash = format!("{:016x}", fnv1a64(&serde_json::to_vec(object)?));
    let mut stamped = object.clone();
    stamped
        .meta_mut()
        .annotations
        .get_or_insert_default()
        .insert(APPLIED_HASH_ANNOTATION.to_owned(), hash);
    Ok(stamped)
}

/// Whether `live` holds every field of `desired` with the same value: objects key by key (an
/// empty desired value also matches an absent one, since the server drops empties), arrays item
/// by item with equal lengths (an item added to a list the operator sets is an edit), scalars
/// equal. Fields only `live` has are ignored, as server-side apply leaves them alone too.
pub fn holds(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(live), Value::Object(desired)) => {
            desired.iter().all(|(key, want)| match live.get(key) {
                Some(have) => holds(have, want),
                None => is_empty(want),
            })
        }
        (Value::Array(live), Value::Array(desired)) => {
            live.len() == desired.len() && live.iter().zip(desired).all(|(h, w)| holds(h, w))
        }
        (live, desired) => live == desired,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.is_empty(),
        _ => false,
    }
}

/// Applies `object` unless `live` (the cluster's copy) already matches it; returns the object as
/// stored. It matches when it carries the applied hash of exactly this object, so a field the
/// operator stopped setting (which an apply would remove) is noticed, and holds every field of it
/// (see [`holds`]), so a manual edit or removal of a managed field is reverted (R-RES-5). A false
/// mismatch (a value the server normalises) only costs the apply that would have happened anyway.
pub async fn apply_unless_current<K>(
    client: &Client,
    field_manager: &str,
    object: &K,
    live: Option<&K>,
) -> kube::Result<K>
where
    K: Child,
{
    let stamped = stamped(object).map_err(kube::Error::SerdeError)?;
    if let Some(live) = live {
        let (have, want) = (serde_json::to_value(live), serde_json::to_value(&stamped));
        if holds(
            &have.map_err(kube::Error::SerdeError)?,
            &want.map_err(kube::Error::SerdeError)?,
        ) {
            return Ok(live.clone());
        }
    }
    write_object(client, field_manager, &stamped, live).await
}

/// [`apply_unless_current`] after reading the cluster's copy (a read instead of a write).
pub async fn ensure<K>(client: &Client, field_manager: &str, object: &K) -> kube::Result<K>
where
    K: Child,
{
    let live = api_for(client, object)
        .get_opt(object.meta().name.as_deref().unwrap_or_default())
        .await?;
    apply_unless_current(client, field_manager, object, live.as_ref()).await
}

/// Applies `object` (name and namespace from its metadata) as this pass last saw it, `seen`, and
/// returns the object as stored: with the resourceVersion read, so the API server refuses (409)
/// a write computed from a copy that changed since, a deposed leader's after a pause (R-HA-2) or
/// one racing another writer's. Where the pass saw no object the apply creates it without a
/// precondition: a POST would be refused when one exists by now, but the fields it sets would
/// then belong to an Update manager that later applies could not remove (a dropped `extraEnv`
/// entry would stay).
pub async fn write_object<K>(
    client: &Client,
    field_manager: &str,
    object: &K,
    seen: Option<&K>,
) -> kube::Result<K>
where
    K: Child,
{
    let mut object = object.clone();
    object.meta_mut().resource_version = seen.and_then(|seen| seen.meta().resource_version.clone());
    let name = object.meta().name.clone().unwrap_or_default();
    api_for(client, &object)
        .patch(
            &name,
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(&object),
        )
        .await
}

/// A server-side dry-run of a forced apply (`dryRun=All`): the API server validates and admits the
/// object (a ResourceQuota included) as it would for the real write, and stores nothing.
pub async fn dry_run_apply<K>(client: &Client, field_manager: &str, object: &K) -> kube::Result<K>
where
    K: Child,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let mut params = PatchParams::apply(field_manager).force();
    params.dry_run = true;
    api_for(client, object)
        .patch(&name, &params, &Patch::Apply(object))
        .await
}

/// The API of `object`'s kind in `object`'s namespace.
fn api_for<K>(client: &Client, object: &K) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    Api::namespaced(
        client.clone(),
        object.meta().namespace.as_deref().unwrap_or("default"),
    )
}

/// Applies the whole status through the `/status` subresource, on the condition that the CR is
/// still at `resource_version` (optimistic concurrency: a write computed from an older copy
/// fails with 409 Conflict instead of overwriting what it never saw).
pub async fn apply_status(
    client: &Client,
    field_manager: &str,
    cr: &CoderProvisioner,
    status: &CoderProvisionerStatus,
    resource_version: Option<&str>,
) -> kube::Result<CoderProvisioner> {
    let api = api_for(client, cr);
    let patch = serde_json::json!({
        "apiVersion": "coder.com/v1alpha1",
        "kind": "CoderProvisioner",
        "metadata": {"resourceVersion": resource_version},
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

/// Adds `finalizer` to the CR's finalizers, on the condition that they are still those read (a
/// `test` operation, as kube-runtime's `finalizer` does: other writers' edits elsewhere in the CR
/// do not stop it, a finalizer added or removed meanwhile does).
pub async fn add_finalizer(
    client: &Client,
    cr: &CoderProvisioner,
    finalizer: &str,
) -> kube::Result<CoderProvisioner> {
    let operations = if cr.metadata.finalizers.is_none() {
        serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ])
    } else {
        serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": cr.finalizers()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])
    };
    let patch: json_patch::Patch =
        serde_json::from_value(operations).map_err(kube::Error::SerdeError)?;
    let name = cr.metadata.name.clone().unwrap_or_default();
    api_for(client, cr)
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use rstest::rstest;
    use serde_json::json;

    use super::*;
    use crate::provisioner::fixtures;

    fn desired() -> Deployment {
        stamped(&fixtures::load::<Deployment>(
            "children/sample_deployment.yaml",
        ))
        .expect("stamps")
    }

    /// The server's copy after a pass applied `desired()`.
    fn live() -> Value {
        let mut live: Deployment = fixtures::load("children/sample_deployment_live.yaml");
        let hash =
            desired().metadata.annotations.expect("annotations")[APPLIED_HASH_ANNOTATION].clone();
        live.metadata
            .annotations
            .get_or_insert_default()
            .insert(APPLIED_HASH_ANNOTATION.to_owned(), hash);
        serde_json::to_value(live).expect("serializes")
    }

    fn matches_desired(live: &Value) -> bool {
        holds(live, &serde_json::to_value(desired()).expect("serializes"))
    }

    #[test]
    fn the_hash_is_deterministic_and_follows_every_change() {
        let hash = |deployment: &Deployment| {
            stamped(deployment)
                .expect("stamps")
                .metadata
                .annotations
                .expect("annotations")[APPLIED_HASH_ANNOTATION]
                .clone()
        };
        let sample: Deployment = fixtures::load("children/sample_deployment.yaml");
        assert_eq!(hash(&sample), hash(&sample.clone()));
        assert_eq!(hash(&sample).len(), 16);
        let mut scaled = sample.clone();
        scaled.spec.as_mut().expect("spec").replicas = Some(2);
        assert_ne!(hash(&sample), hash(&scaled));
    }

    #[test]
    fn the_server_copy_of_an_applied_child_matches_despite_defaults_status_and_metadata() {
        assert!(matches_desired(&live()));
    }

    #[rstest]
    #[case::replicas_edited("/spec/replicas", json!(3))]
    #[case::image_edited("/spec/template/spec/containers/0/image", json!("evil:1"))]
    #[case::label_edited("/metadata/labels/app.kubernetes.io~1instance", json!("other"))]
    #[case::hash_of_an_older_desired_object(
        "/metadata/annotations/coder.com~1applied-hash",
        json!("0000000000000000")
    )]
    #[case::env_entry_added(
        "/spec/template/spec/containers/0/env/2",
        json!({"name": "EXTRA", "value": "1"})
    )]
    fn an_edited_copy_does_not_match(#[case] pointer: &str, #[case] value: Value) {
        let mut live = live();
        let (parent, last) = pointer.rsplit_once('/').expect("pointer");
        let last = last.replace("~1", "/");
        match live.pointer_mut(parent).expect("parent exists") {
            Value::Array(items) => items.push(value),
            Value::Object(fields) => {
                fields.insert(last, value);
            }
            other => panic!("cannot set {pointer} under {other}"),
        }
        assert!(!matches_desired(&live));
    }

    #[rstest]
    #[case::template_annotation_removed("/spec/template/metadata/annotations")]
    #[case::managed_label_removed("/metadata/labels")]
    #[case::owner_removed("/metadata/ownerReferences")]
    fn a_copy_missing_a_managed_field_does_not_match(#[case] pointer: &str) {
        let mut live = live();
        let (parent, last) = pointer.rsplit_once('/').expect("pointer");
        let parent = live
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .expect("parent object");
        parent.remove(last).expect("field existed");
        assert!(!matches_desired(&live));
    }

    #[rstest]
    #[case::field_only_others_set(json!({"a": 1, "b": 2}), json!({"a": 1}), true)]
    #[case::empty_list_the_server_dropped(json!({"a": 1}), json!({"a": 1, "env": []}), true)]
    #[case::empty_map_the_server_dropped(json!({}), json!({"annotations": {}}), true)]
    #[case::defaulted_fields_inside_list_items(json!([{"n": 1, "d": 0}]), json!([{"n": 1}]), true)]
    #[case::missing_value(json!({}), json!({"a": 1}), false)]
    #[case::list_shorter(json!([1]), json!([1, 2]), false)]
    #[case::list_longer(json!([1, 2]), json!([1]), false)]
    #[case::list_reordered(json!([2, 1]), json!([1, 2]), false)]
    #[case::different_type(json!("1"), json!(1), false)]
    fn holds_cases(#[case] live: Value, #[case] desired: Value, #[case] expected: bool) {
        assert_eq!(holds(&live, &desired), expected);
    }
}
