//! The control-plane fixture belongs to the suite: it plays the CoderControlPlane's own
//! operator (writes its status) so that provisioners can be judged alone. An operator under test
//! that also reconciles CoderControlPlanes (adds its finalizer, rewrites the status, creates a
//! coderd Deployment and Service owned by the control plane) destroys that fixture, and every
//! scenario would then fail far from the cause.
//!
//! [`FixtureGuard`] watches the suite's control planes during the run and reports the first
//! change made by anyone but the suite, as one message saying what happened and what to do. Who
//! wrote is read from `metadata.managedFields`: the suite's own field managers are learnt once,
//! before the operator starts, from a probe control plane written the way the fixture is.
//!
//! [`read_only_control_planes`] is the supported way to run such an operator unpatched
//! (`--control-plane-access read-only`): its RBAC, applied without write verbs on
//! codercontrolplanes, /status and /finalizers.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::crd_resources::control_plane_resource;
use crate::world::FIELD_MANAGER;

/// How often the guard looks.
const POLL: Duration = Duration::from_millis(500);
/// Resources of a control plane the read-only access removes write verbs from.
pub const CONTROL_PLANE_RESOURCES: [&str; 3] = [
    "codercontrolplanes",
    "codercontrolplanes/status",
    "codercontrolplanes/finalizers",
];
/// Verbs kept on them.
pub const READ_VERBS: [&str; 3] = ["get", "list", "watch"];
/// The contract's API group.
const GROUP: &str = "coder.com";

/// Kinds whose objects are looked at for owner references to a control plane.
fn child_resources() -> Vec<ApiResource> {
    [
        ("apps", "v1", "Deployment", "deployments"),
        ("apps", "v1", "StatefulSet", "statefulsets"),
        ("", "v1", "Service", "services"),
    ]
    .iter()
    .map(|(group, version, kind, plural)| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    })
    .collect()
}

/// What is wrong with one control plane: empty when only the suite wrote it, or when it is not
/// the suite's (no entry of [`FIELD_MANAGER`]: e.g. a real control plane given with
/// `--control-plane`). Pure.
pub fn inspect(control_plane: &Value, suite_managers: &BTreeSet<String>) -> Vec<String> {
    let entries = control_plane
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let manager = |e: &Value| e["manager"].as_str().unwrap_or("").to_owned();
    if !entries.iter().any(|e| manager(e) == FIELD_MANAGER) {
        return Vec::new();
    }
    let mut findings = Vec::new();
    for finalizer in control_plane
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        findings.push(format!("finalizer {finalizer:?} added"));
    }
    for entry in entries
        .iter()
        .filter(|e| !suite_managers.contains(&manager(e)))
    {
        let fields: Vec<String> = entry
            .pointer("/fieldsV1")
            .and_then(Value::as_object)
            .map(|m| {
                m.keys()
                    .map(|k| k.trim_start_matches("f:").to_owned())
                    .collect()
            })
            .unwrap_or_default();
        let what = if entry["subresource"].as_str() == Some("status") {
            "status rewritten"
        } else {
            "changed"
        };
        findings.push(format!(
            "{what} by field manager {:?} ({})",
            manager(entry),
            fields.join(", ")
        ));
    }
    findings
}

/// `(control plane uid → findings)` for objects owned by a control plane. Pure.
pub fn owned_children(objects: &[(String, Value)]) -> BTreeMap<String, Vec<String>> {
    let mut children: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (kind, object) in objects {
        for owner in object
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|o| o["kind"] == "CoderControlPlane")
        {
            let uid = owner["uid"].as_str().unwrap_or("").to_owned();
            let name = object.pointer("/metadata/name").and_then(Value::as_str);
            children
                .entry(uid)
                .or_default()
                .push(format!("{kind} {} created", name.unwrap_or("?")));
        }
    }
    children
}

/// How [`message`] begins, so that a report's `aborted` can be told apart from other stops.
const CHANGED_BY_OTHERS: &str = "someone other than the suite changed its control-plane fixture";

/// The one message of a run stopped for a changed fixture.
pub fn message(namespace: &str, name: &str, findings: &[String]) -> String {
    format!(
        "{CHANGED_BY_OTHERS} CoderControlPlane {namespace}/{name}: {}. \
         The suite plays the control plane's own operator, so results would be meaningless; the run is stopped. \
         If the operator under test also reconciles CoderControlPlanes, run it with --control-plane-access read-only \
         (its RBAC is applied without write verbs on codercontrolplanes, their status and finalizers, and the report says so), \
         or switch its CoderControlPlane controller off.",
        findings.join("; ")
    )
}

/// Whether a stopped run's reason (`aborted` in the report) is the guard's [`message`].
pub fn is_fixture_change(aborted: &str) -> bool {
    aborted.starts_with(CHANGED_BY_OTHERS)
}

/// The field managers the suite's fixture writes appear under: a probe control plane is written
/// as the fixture is (apply as [`FIELD_MANAGER`], then a merge patch of its status with the
/// admin client) in a scratch namespace, before the operator under test starts.
pub async fn suite_managers(client: &kube::Client) -> anyhow::Result<BTreeSet<String>> {
    let namespace = format!("conformance-guard-{:08x}", rand::random::<u32>());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let body = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(namespace.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &body)
        .await
        .context("creating the fixture guard's probe namespace")?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &control_plane_resource());
    let probe = async {
        let object = json!({
            "apiVersion": "coder.com/v1alpha1",
            "kind": "CoderControlPlane",
            "metadata": {"name": "probe", "namespace": namespace},
            "spec": {},
        });
        api.patch(
            "probe",
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await?;
        let written = api
            .patch_status(
                "probe",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Ready"}})),
            )
            .await?;
        anyhow::Ok(
            written
                .metadata
                .managed_fields
                .unwrap_or_default()
                .into_iter()
                .filter_map(|entry| entry.manager)
                .collect::<BTreeSet<String>>(),
        )
    }
    .await
    .context("writing the fixture guard's probe control plane");
    // Gone at once, unlike its namespace: an operator under test that writes control planes
    // would otherwise be reported for the probe instead of a scenario's fixture.
    let _ = api.delete("probe", &DeleteParams::default()).await;
    let _ = namespaces
        .delete(&namespace, &DeleteParams::background())
        .await;
    probe
}

/// Background watcher of the suite's control planes.
pub struct FixtureGuard {
    task: tokio::task::JoinHandle<()>,
    found: Arc<Mutex<Option<String>>>,
    notify: Arc<tokio::sync::Notify>,
}

impl FixtureGuard {
    pub fn start(client: kube::Client, suite_managers: BTreeSet<String>) -> Self {
        let found = Arc::new(Mutex::new(None));
        let notify = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn(watch(client, suite_managers, found.clone(), notify.clone()));
        Self {
            task,
            found,
            notify,
        }
    }

    /// The message, once a change was seen.
    pub fn finding(&self) -> Option<String> {
        self.found
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Resolves with the message when a change is seen (never, otherwise).
    pub async fn tampered(&self) -> String {
        loop {
            let notified = self.notify.notified();
            if let Some(message) = self.finding() {
                return message;
            }
            notified.await;
        }
    }
}

impl Drop for FixtureGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn watch(
    client: kube::Client,
    suite_managers: BTreeSet<String>,
    found: Arc<Mutex<Option<String>>>,
    notify: Arc<tokio::sync::Notify>,
) {
    let control_planes: Api<DynamicObject> =
        Api::all_with(client.clone(), &control_plane_resource());
    let kinds = child_resources();
    loop {
        tokio::time::sleep(POLL).await;
        let Ok(list) = control_planes.list(&ListParams::default()).await else {
            continue;
        };
        let mut children = Vec::new();
        for kind in &kinds {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), kind);
            if let Ok(objects) = api.list(&ListParams::default()).await {
                children.extend(
                    objects
                        .items
                        .into_iter()
                        .filter_map(|o| serde_json::to_value(o).ok())
                        .map(|o| (kind.kind.clone(), o)),
                );
            }
        }
        let owned = owned_children(&children);
        for control_plane in list.items {
            let Ok(value) = serde_json::to_value(&control_plane) else {
                continue;
            };
            let mut findings = inspect(&value, &suite_managers);
            let uid = control_plane.metadata.uid.clone().unwrap_or_default();
            let is_suites = !inspect_is_foreign(&value);
            if is_suites && let Some(children) = owned.get(&uid) {
                findings.extend(children.iter().cloned());
            }
            if !findings.is_empty() {
                let text = message(
                    control_plane.metadata.namespace.as_deref().unwrap_or(""),
                    control_plane.metadata.name.as_deref().unwrap_or(""),
                    &findings,
                );
                *found.lock().unwrap_or_else(PoisonError::into_inner) = Some(text);
                notify.notify_waiters();
                return;
            }
        }
    }
}

/// True for a control plane the suite did not write (no [`FIELD_MANAGER`] entry).
fn inspect_is_foreign(control_plane: &Value) -> bool {
    !control_plane
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|e| e["manager"] == FIELD_MANAGER)
}

/// RBAC objects (as JSON) with every write verb on codercontrolplanes, /status and /finalizers
/// removed: a rule naming them is split into one for its other resources (verbs kept) and one
/// for the control-plane resources with only get/list/watch. `*` resources in the group are
/// spelled out as the contract's resources. Objects other than (Cluster)Roles pass unchanged. Pure.
pub fn read_only_control_planes(objects: Vec<Value>) -> Vec<Value> {
    objects
        .into_iter()
        .map(|mut object| {
            let is_role = matches!(object["kind"].as_str(), Some("Role" | "ClusterRole"));
            if is_role && let Some(rules) = object.get("rules").and_then(Value::as_array) {
                let rules: Vec<Value> = rules.iter().flat_map(split_rule).collect();
                object["rules"] = Value::Array(rules);
            }
            object
        })
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

fn split_rule(rule: &Value) -> Vec<Value> {
    let groups = strings(&rule["apiGroups"]);
    let resources = strings(&rule["resources"]);
    let verbs = strings(&rule["verbs"]);
    let in_group = groups.iter().any(|g| g == GROUP || g == "*");
    let wildcard = resources.iter().any(|r| r == "*");
    let touched: Vec<&str> = CONTROL_PLANE_RESOURCES
        .iter()
        .copied()
        .filter(|c| wildcard || resources.iter().any(|r| r == c))
        .collect();
    if !in_group || touched.is_empty() {
        return vec![rule.clone()];
    }
    let mut out = Vec::new();
    let others: Vec<String> = if wildcard {
        // All resources of the group(s), minus the control plane's: spelled out for coder.com;
        // other groups of a "*" rule keep "*" in a rule of their own.
        let rest: Vec<String> = groups.iter().filter(|g| *g != GROUP).cloned().collect();
        if !rest.is_empty() {
            let mut kept = rule.clone();
            kept["apiGroups"] = json!(rest);
            out.push(kept);
        }
        [
            "coderprovisioners",
            "coderprovisioners/status",
            "coderprovisioners/finalizers",
        ]
        .iter()
        .map(|r| (*r).to_owned())
        .collect()
    } else {
        resources
            .iter()
            .filter(|r| !CONTROL_PLANE_RESOURCES.contains(&r.as_str()))
            .cloned()
            .collect()
    };
    if !others.is_empty() {
        let mut kept = rule.clone();
        if wildcard {
            kept["apiGroups"] = json!([GROUP]);
        }
        kept["resources"] = json!(others);
        out.push(kept);
    }
    let read: Vec<&str> = READ_VERBS
        .iter()
        .copied()
        .filter(|v| verbs.iter().any(|have| have == v || have == "*"))
        .collect();
    if !read.is_empty() {
        let mut limited = rule.clone();
        limited["apiGroups"] = json!([GROUP]);
        limited["resources"] = json!(touched);
        limited["verbs"] = json!(read);
        out.push(limited);
    }
    out
}

/// Writes `rbac_dir`'s objects through [`read_only_control_planes`] into
/// `<report_dir>/operator-rbac-read-only/rbac.yaml` (kept as evidence) and returns that folder.
pub fn write_read_only_rbac(
    rbac_dir: &std::path::Path,
    report_dir: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let objects = crate::manifests::read_dir(rbac_dir)?
        .into_iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let mut yaml = format!(
        "# Generated by `conformance run --control-plane-access read-only` from {}:\n\
         # write verbs on codercontrolplanes, /status and /finalizers removed.\n",
        rbac_dir.display()
    );
    for object in read_only_control_planes(objects) {
        yaml.push_str("---\n");
        yaml.push_str(&serde_saphyr::to_string(&object).context("rendering RBAC as YAML")?);
    }
    let dir = report_dir.join("operator-rbac-read-only");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("rbac.yaml");
    std::fs::write(&file, yaml).with_context(|| format!("writing {}", file.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn suite() -> BTreeSet<String> {
        [FIELD_MANAGER, "kube-rs"]
            .iter()
            .map(|m| (*m).to_owned())
            .collect()
    }

    fn control_plane(extra_entries: Value, finalizers: Value) -> Value {
        let mut entries = vec![
            json!({"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {}}}),
            json!({"manager": "kube-rs", "operation": "Update", "subresource": "status", "fieldsV1": {"f:status": {}}}),
        ];
        entries.extend(extra_entries.as_array().cloned().unwrap_or_default());
        json!({"metadata": {"name": "cp", "managedFields": entries, "finalizers": finalizers}})
    }

    #[rstest]
    #[case::untouched(json!([]), json!([]), &[])]
    #[case::finalizer(json!([{"manager": "manager", "operation": "Update", "fieldsV1": {"f:metadata": {}}}]), json!(["coder.com/coder-control-plane"]), &["finalizer \"coder.com/coder-control-plane\" added", "changed by field manager \"manager\" (metadata)"])]
    #[case::status(json!([{"manager": "manager", "operation": "Update", "subresource": "status", "fieldsV1": {"f:status": {}}}]), json!([]), &["status rewritten by field manager \"manager\" (status)"])]
    fn changes_by_others_are_named(
        #[case] entries: Value,
        #[case] finalizers: Value,
        #[case] expected: &[&str],
    ) {
        assert_eq!(
            inspect(&control_plane(entries, finalizers), &suite()),
            expected
        );
    }

    #[test]
    fn control_planes_the_suite_did_not_write_are_not_judged() {
        let real = json!({"metadata": {"managedFields": [{"manager": "coder-operator"}], "finalizers": ["x"]}});
        assert!(inspect(&real, &suite()).is_empty());
        assert!(inspect_is_foreign(&real));
    }

    #[test]
    fn children_owned_by_a_control_plane_are_found() {
        let owned = json!({"metadata": {"name": "coder", "ownerReferences": [{"kind": "CoderControlPlane", "uid": "u1"}]}});
        let other = json!({"metadata": {"name": "x", "ownerReferences": [{"kind": "CoderProvisioner", "uid": "u2"}]}});
        let found = owned_children(&[("Deployment".into(), owned), ("Deployment".into(), other)]);
        assert_eq!(
            found.get("u1"),
            Some(&vec!["Deployment coder created".to_owned()])
        );
        assert_eq!(found.len(), 1);
    }

    #[test]
    fn the_message_says_what_and_what_to_do() {
        let text = message("ns", "cp", &["finalizer \"f\" added".into()]);
        assert!(text.contains("ns/cp: finalizer \"f\" added"), "{text}");
        assert!(text.contains("--control-plane-access read-only"), "{text}");
        assert!(is_fixture_change(&text));
        assert!(!is_fixture_change("the operator exited"));
    }

    fn role(rules: Value) -> Value {
        json!({"kind": "ClusterRole", "metadata": {"name": "r"}, "rules": rules})
    }

    #[rstest]
    #[case::already_read_only(
        json!([{"apiGroups": ["coder.com"], "resources": ["codercontrolplanes"], "verbs": ["get", "list", "watch"]}]),
        json!([{"apiGroups": ["coder.com"], "resources": ["codercontrolplanes"], "verbs": ["get", "list", "watch"]}])
    )]
    #[case::split(
        json!([{"apiGroups": ["coder.com"], "resources": ["coderprovisioners", "codercontrolplanes", "codercontrolplanes/status"], "verbs": ["get", "watch", "update", "patch"]}]),
        json!([
            {"apiGroups": ["coder.com"], "resources": ["coderprovisioners"], "verbs": ["get", "watch", "update", "patch"]},
            {"apiGroups": ["coder.com"], "resources": ["codercontrolplanes", "codercontrolplanes/status"], "verbs": ["get", "watch"]}
        ])
    )]
    #[case::write_only_dropped(
        json!([{"apiGroups": ["coder.com"], "resources": ["codercontrolplanes/finalizers"], "verbs": ["update"]}]),
        json!([])
    )]
    #[case::wildcards(
        json!([{"apiGroups": ["coder.com"], "resources": ["*"], "verbs": ["*"]}]),
        json!([
            {"apiGroups": ["coder.com"], "resources": ["coderprovisioners", "coderprovisioners/status", "coderprovisioners/finalizers"], "verbs": ["*"]},
            {"apiGroups": ["coder.com"], "resources": ["codercontrolplanes", "codercontrolplanes/status", "codercontrolplanes/finalizers"], "verbs": ["get", "list", "watch"]}
        ])
    )]
    #[case::other_groups_untouched(
        json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}]),
        json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}])
    )]
    fn control_planes_become_read_only(#[case] rules: Value, #[case] expected: Value) {
        let out = read_only_control_planes(vec![role(rules), json!({"kind": "ServiceAccount"})]);
        assert_eq!(out[0]["rules"], expected);
        assert_eq!(out[1], json!({"kind": "ServiceAccount"}));
    }
}
