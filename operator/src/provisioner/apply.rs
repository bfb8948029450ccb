//! Server-side apply of child objects and of the CR status (one field manager, forced, so manual
//! edits of managed fields are reverted; fields the operator does not set are left alone).
//!
//! Children are applied only when the cluster's copy differs, so steady-state passes and the
//! passes after a restart write nothing (see [`apply_unless_current`]). A child the pass saw
//! absent is created instead, so that the write fails if it exists by now (see [`write_object`]).
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::warn;

use super::context::Context;
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
pub async fn apply_unless_current<K>(ctx: &Context, object: &K, live: Option<&K>) -> kube::Result<K>
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
    write_object(ctx, &stamped, live).await
}

/// [`apply_unless_current`] after reading the cluster's copy (a read instead of a write).
pub async fn ensure<K>(ctx: &Context, object: &K) -> kube::Result<K>
where
    K: Child,
{
    let live = api_for(&ctx.client, object)
        .get_opt(object.meta().name.as_deref().unwrap_or_default())
        .await?;
    apply_unless_current(ctx, object, live.as_ref()).await
}

/// Writes `object` (name and namespace from its metadata) as this pass last saw it, `seen`, and
/// returns the object as stored; the API server refuses (409) a write computed from a copy that
/// changed since, a deposed leader's after a pause (R-HA-2) or one racing another writer's:
/// - seen present, a forced apply with the resourceVersion read;
/// - seen absent, a create (POST), refused when the object exists by now. Its fields then belong
///   to an `Update` entry of the operator's field manager, which later applies would not remove
///   (a dropped `extraEnv` entry would stay): they are moved into the manager's `Apply` entry at
///   once, and again before the next apply should that fail (see [`take_over_fields`]).
///
/// Each request is one of the operator's own writes (see `OwnWrites`).
pub async fn write_object<K>(ctx: &Context, object: &K, seen: Option<&K>) -> kube::Result<K>
where
    K: Child,
{
    let api = api_for(&ctx.client, object);
    let Some(seen) = seen else {
        let params = PostParams {
            field_manager: Some(ctx.field_manager.clone()),
            ..PostParams::default()
        };
        let created = ctx
            .own_writes
            .track(object, api.create(&params, object))
            .await?;
        // Moving the fields is a write too: a replica deposed while it created leaves it to the
        // new leader's next write of the object (R-HA-2).
        if let Err(fenced) = ctx.fence.check().await {
            warn!(error = %fenced, "not the leader: leaving the created object's fields as they are");
            return Ok(created);
        }
        return match take_over_fields(ctx, &api, &created).await {
            Ok(taken_over) => Ok(taken_over.unwrap_or(created)),
            Err(error) => {
                // The object is stored; the next write takes its fields over first.
                warn!(kind = K::kind(&()).as_ref(), name = created.name_any(), %error,
                    "could not move the created object's fields to the operator's apply");
                Ok(created)
            }
        };
    };
    let taken_over = take_over_fields(ctx, &api, seen).await?;
    let mut object = object.clone();
    object.meta_mut().resource_version = taken_over
        .as_ref()
        .unwrap_or(seen)
        .meta()
        .resource_version
        .clone();
    let name = object.meta().name.clone().unwrap_or_default();
    let params = PatchParams::apply(&ctx.field_manager).force();
    let applied = Patch::Apply(&object);
    ctx.own_writes
        .track(&object, api.patch(&name, &params, &applied))
        .await
}

/// Moves the fields of the operator's `Update` entries in `stored`'s managed fields into its
/// `Apply` entry (see [`upgraded_managed_fields`]), on the condition that `stored` is still at
/// the resourceVersion read (as `csaupgrade`'s patch does: a 409 otherwise). Returns the object
/// as stored after the move, `None` when there was nothing to move.
async fn take_over_fields<K>(ctx: &Context, api: &Api<K>, stored: &K) -> kube::Result<Option<K>>
where
    K: Child,
{
    let entries = stored.meta().managed_fields.as_deref().unwrap_or_default();
    let Some(upgraded) = upgraded_managed_fields(entries, &ctx.field_manager) else {
        return Ok(None);
    };
    let operations = serde_json::json!([
        {"op": "replace", "path": "/metadata/managedFields", "value": upgraded},
        {"op": "replace", "path": "/metadata/resourceVersion", "value": stored.meta().resource_version},
    ]);
    let patch: json_patch::Patch =
        serde_json::from_value(operations).map_err(kube::Error::SerdeError)?;
    let name = stored.meta().name.clone().unwrap_or_default();
    let patch = Patch::Json::<()>(patch);
    let params = PatchParams::default();
    ctx.own_writes
        .track(stored, api.patch(&name, &params, &patch))
        .await
        .map(Some)
}

/// `entries` with every `Update` entry of `manager` (on the object itself, not a subresource)
/// merged into its `Apply` entry, as client-go's `csaupgrade` does: into the existing `Apply`
/// entry, else into the first `Update` entry turned into one; the field sets are united.
/// `None` when `manager` has no such `Update` entry.
pub fn upgraded_managed_fields(
    entries: &[ManagedFieldsEntry],
    manager: &str,
) -> Option<Vec<ManagedFieldsEntry>> {
    let of = |entry: &ManagedFieldsEntry, operation: &str| {
        entry.manager.as_deref() == Some(manager)
            && entry.operation.as_deref() == Some(operation)
            && entry.subresource.as_deref().unwrap_or_default().is_empty()
    };
    let first_update = entries.iter().position(|entry| of(entry, "Update"))?;
    let target = entries
        .iter()
        .position(|entry| of(entry, "Apply"))
        .unwrap_or(first_update);
    let mut merged = entries[target].clone();
    merged.operation = Some("Apply".to_owned());
    for update in entries.iter().filter(|entry| of(entry, "Update")) {
        match (&mut merged.fields_v1, &update.fields_v1) {
            (Some(into), Some(from)) => unite(&mut into.0, &from.0),
            (into @ None, from) => into.clone_from(from),
            (Some(_), None) => {}
        }
    }
    Some(
        entries
            .iter()
            .enumerate()
            .filter_map(|(at, entry)| match at {
                _ if at == target => Some(merged.clone()),
                _ if of(entry, "Update") => None,
                _ => Some(entry.clone()),
            })
            .collect(),
    )
}

/// Adds the field set `from` to `into` (fieldsV1 trees: nested JSON objects).
fn unite(into: &mut Value, from: &Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        for (key, value) in from {
            match into.get_mut(key) {
                Some(existing) => unite(existing, value),
                None => {
                    into.insert(key.clone(), value.clone());
                }
            }
        }
    }
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

    fn entry(manager: &str, operation: &str, subresource: Option<&str>, fields: Value) -> Value {
        let mut entry = json!({"manager": manager, "operation": operation,
            "apiVersion": "apps/v1", "fieldsType": "FieldsV1", "fieldsV1": fields});
        if let Some(subresource) = subresource {
            entry["subresource"] = json!(subresource);
        }
        entry
    }

    fn upgraded(entries: &[Value]) -> Option<Value> {
        let entries: Vec<ManagedFieldsEntry> =
            serde_json::from_value(Value::Array(entries.to_vec())).expect("entries");
        upgraded_managed_fields(&entries, "op").map(|e| serde_json::to_value(e).expect("json"))
    }

    #[test]
    fn a_created_objects_update_entry_becomes_the_managers_apply_entry() {
        let fields = json!({"f:spec": {"f:replicas": {}}});
        let kept = entry(
            "kube-controller-manager",
            "Update",
            Some("status"),
            json!({"f:status": {}}),
        );
        let upgraded = upgraded(&[entry("op", "Update", None, fields.clone()), kept.clone()]);
        assert_eq!(
            upgraded,
            Some(json!([entry("op", "Apply", None, fields), kept]))
        );
    }

    #[test]
    fn update_entries_are_united_into_the_existing_apply_entry() {
        let upgraded = upgraded(&[
            entry(
                "other",
                "Update",
                None,
                json!({"f:metadata": {"f:labels": {"f:x": {}}}}),
            ),
            entry("op", "Apply", None, json!({"f:spec": {"f:replicas": {}}})),
            entry(
                "op",
                "Update",
                None,
                json!({"f:spec": {"f:template": {".": {}}}}),
            ),
            entry(
                "op",
                "Update",
                None,
                json!({"f:metadata": {"f:annotations": {}}, "f:spec": {"f:template": {"f:spec": {}}}}),
            ),
        ]);
        let united = json!({
            "f:spec": {"f:replicas": {}, "f:template": {".": {}, "f:spec": {}}},
            "f:metadata": {"f:annotations": {}},
        });
        assert_eq!(
            upgraded,
            Some(json!([
                entry(
                    "other",
                    "Update",
                    None,
                    json!({"f:metadata": {"f:labels": {"f:x": {}}}})
                ),
                entry("op", "Apply", None, united),
            ]))
        );
    }

    #[rstest]
    #[case::already_applied(entry("op", "Apply", None, json!({"f:spec": {}})))]
    #[case::other_managers(entry("other", "Update", None, json!({"f:spec": {}})))]
    #[case::a_subresource(entry("op", "Update", Some("status"), json!({"f:status": {}})))]
    fn nothing_to_upgrade(#[case] only: Value) {
        assert_eq!(upgraded(&[only]), None);
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
