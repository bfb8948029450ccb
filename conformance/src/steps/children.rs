//! Steps on the objects the operator creates (Deployment, ServiceAccount, Role, RoleBinding,
//! key Secret) and on Secrets and quotas the scenario prepares around them.
use std::collections::BTreeMap;

use anyhow::{Context as _, anyhow, bail};
use cucumber::gherkin::Step;
use cucumber::{given, then, when};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, ResourceQuota, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::{docstring_yaml, merge, table_rows};
use crate::wait::{self, Observation};
use crate::world::{FIELD_MANAGER, ProvisionerWorld};

/// A ResourceQuota of 0 for `kind` in the scenario namespace refuses new objects of that kind
/// (existing ones stay): its name and the quota resource that counts the kind.
fn refusing_quota(kind: &str) -> anyhow::Result<(String, &'static str)> {
    let resource = match kind {
        "ServiceAccounts" => "count/serviceaccounts",
        "Roles" => "count/roles.rbac.authorization.k8s.io",
        "RoleBindings" => "count/rolebindings.rbac.authorization.k8s.io",
        "Secrets" => "secrets",
        other => bail!(
            "no quota known to refuse new {other:?} (ServiceAccounts, Roles, RoleBindings or Secrets)"
        ),
    };
    Ok((
        format!("conformance-refuse-{}", kind.to_ascii_lowercase()),
        resource,
    ))
}

fn deployment_name(world: &ProvisionerWorld) -> String {
    format!("provisioner-{}", world.provisioner)
}

fn key_secret_name(world: &ProvisionerWorld) -> String {
    format!("{}-provisioner-key", world.provisioner)
}

/// Replaces the run-time placeholders of feature-file text: `{provisioner}` (the CR name),
/// `{url}` and `{origin}` (the coderd URL the control plane publishes), `{authority}` (its
/// host and port), `{other origin}` (the same coderd under another origin, see [`other_origin`]),
/// `{organization}` and `{second organization}` (the scenario's coderd organizations).
pub fn expand(world: &ProvisionerWorld, text: &str) -> String {
    let url = &world.env.coderd.url;
    let authority = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let mut text = text
        .replace("{provisioner}", &world.provisioner)
        .replace("{url}", url)
        .replace("{origin}", url)
        .replace("{authority}", authority)
        .replace("{other origin}", &other_origin(url));
    if let Some(coderd) = &world.coderd {
        text = text.replace("{organization}", &coderd.organization);
    }
    if let Some((second, _)) = &world.second_organization {
        text = text.replace("{second organization}", second);
    }
    text
}

/// `url` with a host that reaches the same server but is another origin (R-CRED-10 compares
/// hosts as written): `127.0.0.1` ↔ `localhost` (local tier), `<service>.<namespace>.svc` ↔
/// `….svc.cluster.local` (the in-cluster fake on kind and k3s, whose cluster domain is the
/// default), any other name as an absolute name with a trailing dot.
pub fn other_origin(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return url.to_owned();
    };
    let host = parsed.host_str().unwrap_or_default().to_owned();
    let other = match host.as_str() {
        "127.0.0.1" => "localhost".to_owned(),
        "localhost" => "127.0.0.1".to_owned(),
        name if name.ends_with(".svc.cluster.local") => {
            name.trim_end_matches(".cluster.local").to_owned()
        }
        name if name.ends_with(".svc") => format!("{name}.cluster.local"),
        name if name.ends_with('.') => name.trim_end_matches('.').to_owned(),
        name => format!("{name}."),
    };
    if parsed.set_host(Some(&other)).is_err() {
        return url.to_owned();
    }
    // `Url` always writes a path; the control plane's URL had none (or its own).
    let mut text = parsed.to_string();
    if !url.ends_with('/') && text.ends_with('/') {
        text.pop();
    }
    text
}

fn resource_for(kind: &str) -> anyhow::Result<ApiResource> {
    let (group, version, plural) = match kind {
        "Deployment" => ("apps", "v1", "deployments"),
        "ServiceAccount" => ("", "v1", "serviceaccounts"),
        "Secret" => ("", "v1", "secrets"),
        "Role" => ("rbac.authorization.k8s.io", "v1", "roles"),
        "RoleBinding" => ("rbac.authorization.k8s.io", "v1", "rolebindings"),
        other => {
            bail!("unknown kind {other:?} (Deployment, ServiceAccount, Secret, Role, RoleBinding)")
        }
    };
    Ok(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        plural,
    ))
}

/// The value at a JSON pointer of a child equals the docstring (YAML), eventually.
#[then(expr = "the {word} {string} has at {string}:")]
async fn child_has_at(
    world: &mut ProvisionerWorld,
    kind: String,
    name: String,
    pointer: String,
    step: &Step,
) -> anyhow::Result<()> {
    let name = expand(world, &name);
    let expected: Value =
        serde_saphyr::from_str(&expand(world, &super::docstring(step).unwrap_or_default()))
            .context("the docstring is not valid YAML")?;
    let world = &*world;
    world
        .children_promptly(
            &format!("{kind} {name} at {pointer}"),
            world.timeouts(),
            || async {
                Ok(match object(world, &kind, &name).await? {
                    None => Err(format!("{kind} {name} does not exist")),
                    Some(found) => match found.pointer(&pointer) {
                        Some(actual) if *actual == expected => Ok(()),
                        actual => Err(format!(
                            "{pointer} is {}, expected {expected}",
                            actual.unwrap_or(&Value::Null)
                        )),
                    },
                })
            },
        )
        .await
}

/// A manual edit of a child (JSON merge patch with the docstring, as a user's `kubectl edit`).
#[when(expr = "the {word} {string} is changed to:")]
async fn child_changed(
    world: &mut ProvisionerWorld,
    kind: String,
    name: String,
    step: &Step,
) -> anyhow::Result<()> {
    world.mark_action().await?;
    let name = expand(world, &name);
    let patch = docstring_yaml(world, step)?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(world.client(), &world.namespace, &resource_for(&kind)?);
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("editing {kind} {name}"))?;
    Ok(())
}

const STANDARD_LABELS: [&str; 3] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
];

/// R-POD-2: the selector and the pod template labels are exactly the three standard labels
/// (managed-by's value is the implementation's own, D-6).
#[then("the provisioner Deployment selects its pods by exactly the standard labels")]
async fn selects_by_standard_labels(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let world = &*world;
    world
        .children_promptly(
            "the Deployment's selector and pod labels",
            world.timeouts(),
            || async {
                let Some(found) = object(world, "Deployment", &deployment_name(world)).await?
                else {
                    return Ok(Err("the Deployment does not exist".to_owned()));
                };
                Ok(standard_labels_problem(&found, &world.provisioner).map_or(Ok(()), Err))
            },
        )
        .await
}

fn standard_labels_problem(deployment: &Value, instance: &str) -> Option<String> {
    let selector = deployment
        .pointer("/spec/selector/matchLabels")
        .cloned()
        .unwrap_or(Value::Null);
    let template = deployment
        .pointer("/spec/template/metadata/labels")
        .cloned()
        .unwrap_or(Value::Null);
    let keys = |labels: &Value| -> Vec<String> {
        let mut keys: Vec<String> = labels
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    };
    let mut expected_keys: Vec<String> = STANDARD_LABELS.iter().map(|k| (*k).to_owned()).collect();
    expected_keys.sort();
    if keys(&selector) != expected_keys {
        return Some(format!("selector.matchLabels is {selector}"));
    }
    if template != selector {
        return Some(format!(
            "pod template labels {template} differ from the selector {selector}"
        ));
    }
    let label = |key: &str| {
        selector
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    if label("app.kubernetes.io/name") != "coder-provisioner"
        || label("app.kubernetes.io/instance") != instance
        || label("app.kubernetes.io/managed-by").is_empty()
    {
        return Some(format!("selector.matchLabels is {selector}"));
    }
    None
}

/// R-POD-7.
#[then(expr = "the provisioner pod template has exactly one container, named {string}")]
async fn one_container(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let world = &*world;
    world
        .children_promptly("one container", world.timeouts(), || async {
            let names: Vec<String> = deployment(world)
                .await?
                .and_then(|d| d.spec)
                .and_then(|s| s.template.spec)
                .map(|s| s.containers.into_iter().map(|c| c.name).collect())
                .unwrap_or_default();
            Ok(if names == [name.clone()] {
                Ok(())
            } else {
                Err(format!("containers: {names:?}"))
            })
        })
        .await
}

/// R-RES-2, R-RES-4, D-6: the children of every CR in the namespace have names and
/// `app.kubernetes.io/instance` labels of at most 63 characters, distinct across CRs.
#[then(
    "the children of the two provisioners have distinct names and labels of at most 63 characters"
)]
async fn long_name_children(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let world = &*world;
    world
        .children_promptly("short, distinct child names", world.timeouts(), || async {
            let mut problems = Vec::new();
            let mut instances: BTreeMap<String, String> = BTreeMap::new();
            let mut owners = std::collections::BTreeSet::new();
            for kind in ["Deployment", "ServiceAccount", "Role", "RoleBinding"] {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(world.client(), &world.namespace, &resource_for(kind)?);
                for item in api.list(&Default::default()).await?.items {
                    let Some(owner) = item
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .find(|r| r.controller == Some(true))
                    else {
                        continue;
                    };
                    owners.insert((kind, owner.uid.clone()));
                    let name = item.metadata.name.clone().unwrap_or_default();
                    let instance = item
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("app.kubernetes.io/instance"))
                        .cloned()
                        .unwrap_or_default();
                    if name.len() > 63 {
                        problems.push(format!("{kind} {name} has {} characters", name.len()));
                    }
                    if instance.is_empty() || instance.len() > 63 {
                        problems.push(format!("{kind} {name} has instance label {instance:?}"));
                    }
                    if let Some(other) = instances.insert(instance.clone(), owner.uid.clone())
                        && other != owner.uid
                    {
                        problems.push(format!(
                            "two provisioners share the instance label {instance}"
                        ));
                    }
                }
            }
            // Two provisioners mapped to one child name would leave one of them without that child.
            if owners.len() < 8 {
                problems.push(format!(
                    "{} of the 8 children (4 kinds × 2 provisioners) exist",
                    owners.len()
                ));
            }
            Ok(if problems.is_empty() {
                Ok(())
            } else {
                Err(problems.join("; "))
            })
        })
        .await
}

async fn object(world: &ProvisionerWorld, kind: &str, name: &str) -> anyhow::Result<Option<Value>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(world.client(), &world.namespace, &resource_for(kind)?);
    Ok(api
        .get_opt(name)
        .await?
        .map(serde_json::to_value)
        .transpose()?)
}

/// R-RES-1/3/4, D-6: the object exists, the CR is its controller, and it carries the labels;
/// R-SEC-3: the key Secret's reference also blocks the owner's deletion.
fn owned_observation(
    kind: &str,
    object: &Value,
    provisioner_uid: &str,
    instance: &str,
) -> Observation<()> {
    let owner = object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .and_then(|refs| {
            refs.iter()
                .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        });
    let field =
        |owner: &Value, key: &str| owner.get(key).and_then(Value::as_str).map(str::to_owned);
    match owner {
        Some(owner) if field(owner, "uid").as_deref() != Some(provisioner_uid) => {
            return Err(format!("controlled by {owner}, not the CoderProvisioner"));
        }
        Some(owner)
            if field(owner, "apiVersion").as_deref() != Some("coder.com/v1alpha1")
                || field(owner, "kind").as_deref() != Some("CoderProvisioner")
                || field(owner, "name").as_deref() != Some(instance) =>
        {
            return Err(format!(
                "the controller reference {owner} does not name the CoderProvisioner"
            ));
        }
        Some(owner)
            if kind == "Secret"
                && owner.get("blockOwnerDeletion").and_then(Value::as_bool) != Some(true) =>
        {
            return Err(format!(
                "the controller reference {owner} lacks blockOwnerDeletion: true"
            ));
        }
        Some(_) => {}
        None => return Err("no controller ownerReference".to_owned()),
    }
    let label = |key: &str| {
        object
            .pointer(&format!("/metadata/labels/{}", key.replace('/', "~1")))
            .and_then(Value::as_str)
    };
    if label("app.kubernetes.io/name") != Some("coder-provisioner") {
        return Err(format!(
            "label app.kubernetes.io/name is {:?}",
            label("app.kubernetes.io/name")
        ));
    }
    if label("app.kubernetes.io/instance") != Some(instance) {
        return Err(format!(
            "label app.kubernetes.io/instance is {:?}",
            label("app.kubernetes.io/instance")
        ));
    }
    if label("app.kubernetes.io/managed-by").is_none_or(str::is_empty) {
        return Err("label app.kubernetes.io/managed-by is missing or empty".to_owned());
    }
    Ok(())
}

#[then("these objects exist, controlled by the provisioner:")]
async fn objects_exist(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let wanted: Vec<(String, String)> = table_rows(step)?
        .into_iter()
        .skip(1)
        .map(|row| {
            (
                row.first().cloned().unwrap_or_default(),
                expand(world, row.get(1).map_or("", String::as_str)),
            )
        })
        .collect();
    let world = &*world;
    world
        .children_promptly("the child objects", world.timeouts(), || async {
            let cr = world
                .provisioner_json()
                .await?
                .ok_or_else(|| anyhow!("the CoderProvisioner is gone"))?;
            let uid = cr
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let mut problems = Vec::new();
            for (kind, name) in &wanted {
                match object(world, kind, name).await? {
                    None => problems.push(format!("{kind} {name} is missing")),
                    Some(found) => {
                        if let Err(why) = owned_observation(kind, &found, &uid, &world.provisioner)
                        {
                            problems.push(format!("{kind} {name}: {why}"));
                        }
                    }
                }
            }
            Ok(if problems.is_empty() {
                Ok(())
            } else {
                Err(problems.join("; "))
            })
        })
        .await
}

/// R-DEL-12: the ownerReferences let Kubernetes' garbage collector remove the children once
/// the CR is gone (needs a cluster with the garbage collector: the local tier runs it).
#[then("the provisioner's children are removed by garbage collection")]
async fn children_collected(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let children = [
        ("Deployment", format!("provisioner-{}", world.provisioner)),
        (
            "ServiceAccount",
            format!("{}-provisioner", world.provisioner),
        ),
        ("Role", format!("provisioner-{}", world.provisioner)),
        ("RoleBinding", format!("provisioner-{}", world.provisioner)),
        ("Secret", key_secret_name(world)),
    ];
    // The garbage collector learns a new CRD's owners from discovery, which it re-reads only
    // every 30 s, so on a freshly started cluster collection can take that long and more.
    let mut timeouts = *world.timeouts();
    timeouts.eventually = timeouts.eventually.max(std::time::Duration::from_secs(90));
    let world = &*world;
    let children = &children;
    // The garbage collector's work, not the operator's: no settle watch.
    wait::eventually(
        "the children to be garbage-collected",
        &timeouts,
        || async move {
            let mut left = Vec::new();
            for (kind, name) in children {
                if object(world, kind, name).await?.is_some() {
                    left.push(format!("{kind} {name}"));
                }
            }
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(format!("still present: {}", left.join(", ")))
            })
        },
    )
    .await
}

#[then(expr = "no {word} named {string} exists during the observation window")]
async fn no_object(world: &mut ProvisionerWorld, kind: String, name: String) -> anyhow::Result<()> {
    let name = expand(world, &name);
    let window = world.observation_window();
    wait::stays(
        &format!("no {kind} {name}"),
        world.timeouts(),
        window,
        || async {
            Ok(match object(world, &kind, &name).await? {
                None => Ok(()),
                Some(_) => Err(format!("{kind} {name} exists")),
            })
        },
    )
    .await
}

/// D-1: a closed gate writes no child of any kind. The Deployment, ServiceAccount, Role and
/// RoleBinding are looked for by their contract names (R-RES-1), every kind also by controller
/// reference (a child under another name is a child too); a Secret only by controller reference,
/// since a refused Secret of the key Secret's name exists on purpose.
#[then("no child object of the provisioner exists during the observation window")]
async fn no_child(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let window = world.observation_window();
    let world = &*world;
    let named = [
        ("Deployment", deployment_name(world)),
        (
            "ServiceAccount",
            format!("{}-provisioner", world.provisioner),
        ),
        ("Role", deployment_name(world)),
        ("RoleBinding", deployment_name(world)),
    ];
    wait::stays("no child object", world.timeouts(), window, || async {
        let uid = world
            .provisioner_json()
            .await?
            .and_then(|cr| super::str_at(&cr, "/metadata/uid").map(str::to_owned))
            .unwrap_or_default();
        let mut found = Vec::new();
        for (kind, name) in &named {
            if object(world, kind, name).await?.is_some() {
                found.push(format!("{kind} {name}"));
            }
        }
        for kind in [
            "Deployment",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Secret",
        ] {
            let api: Api<DynamicObject> =
                Api::namespaced_with(world.client(), &world.namespace, &resource_for(kind)?);
            for item in api.list(&Default::default()).await?.items {
                let controlled = item
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|r| r.controller == Some(true) && !uid.is_empty() && r.uid == uid);
                let name = item.metadata.name.unwrap_or_default();
                if controlled && !found.contains(&format!("{kind} {name}")) {
                    found.push(format!("{kind} {name}"));
                }
            }
        }
        Ok(if found.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the provisioner's children exist: {}",
                found.join(", ")
            ))
        })
    })
    .await
}

async fn deployment(world: &ProvisionerWorld) -> anyhow::Result<Option<Deployment>> {
    let api: Api<Deployment> = world.api();
    Ok(api.get_opt(&deployment_name(world)).await?)
}

/// Polls the Deployment's single container until `check` accepts it.
async fn container_eventually(
    world: &ProvisionerWorld,
    what: &str,
    check: impl Fn(&Container) -> Observation<()>,
) -> anyhow::Result<()> {
    let check = &check;
    world
        .children_promptly(what, world.timeouts(), || async move {
            let Some(found) = deployment(world).await? else {
                return Ok(Err(format!(
                    "Deployment {} does not exist",
                    deployment_name(world)
                )));
            };
            let containers = found
                .spec
                .and_then(|s| s.template.spec)
                .map(|s| s.containers)
                .unwrap_or_default();
            Ok(match containers.as_slice() {
                [container] => check(container),
                other => Err(format!(
                    "the pod has {} containers, expected exactly one",
                    other.len()
                )),
            })
        })
        .await
}

fn json_list(text: &str) -> anyhow::Result<Vec<String>> {
    serde_json::from_str(text).with_context(|| format!("{text:?} is not a JSON list of strings"))
}

#[then(expr = "the provisioner container's command is {string}")]
async fn container_command(world: &mut ProvisionerWorld, expected: String) -> anyhow::Result<()> {
    let expected = json_list(&expected)?;
    container_eventually(world, &format!("command {expected:?}"), |c| {
        let actual = c.command.clone().unwrap_or_default();
        if actual == expected {
            Ok(())
        } else {
            Err(format!("command is {actual:?}"))
        }
    })
    .await
}

#[then(expr = "the provisioner container's args are {string}")]
async fn container_args(world: &mut ProvisionerWorld, expected: String) -> anyhow::Result<()> {
    let expected = json_list(&expected)?;
    container_eventually(world, &format!("args {expected:?}"), |c| {
        let actual = c.args.clone().unwrap_or_default();
        if actual == expected {
            Ok(())
        } else {
            Err(format!("args are {actual:?}"))
        }
    })
    .await
}

#[then(expr = "the provisioner container's image is {string}")]
async fn container_image(world: &mut ProvisionerWorld, expected: String) -> anyhow::Result<()> {
    container_eventually(world, &format!("image {expected}"), |c| {
        if c.image.as_deref() == Some(expected.as_str()) {
            Ok(())
        } else {
            Err(format!("image is {:?}", c.image))
        }
    })
    .await
}

/// R-POD-11…R-POD-14: the whole env list, in order. `{url}` is the coderd URL; a `secret`
/// cell `name/key` means `valueFrom.secretKeyRef`.
#[then("the provisioner container's env is:")]
async fn container_env(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let expected: Vec<Value> = table_rows(step)?
        .into_iter()
        .skip(1)
        .map(|row| {
            let cell = |i: usize| row.get(i).map(|c| expand(world, c)).unwrap_or_default();
            let (name, value, secret) = (cell(0), cell(1), cell(2));
            match secret.split_once('/') {
                Some((secret, key)) => json!({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}),
                None => json!({"name": name, "value": value}),
            }
        })
        .collect();
    container_eventually(world, "the container env", |c| {
        let actual: Vec<Value> = c
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
            .map(normalise_env)
            .collect();
        if actual == expected {
            Ok(())
        } else {
            Err(format!("env is {}", Value::Array(actual)))
        }
    })
    .await
}

/// Drops defaulted fields the API server adds (`optional`) so tables stay readable.
fn normalise_env(mut env: Value) -> Value {
    if let Some(reference) = env
        .pointer_mut("/valueFrom/secretKeyRef")
        .and_then(Value::as_object_mut)
    {
        reference.remove("optional");
    }
    env
}

#[then(expr = "the provisioner container has no env var {string}")]
async fn container_lacks_env(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    container_eventually(world, &format!("no env var {name}"), |c| {
        let env = c.env.clone().unwrap_or_default();
        if env.iter().any(|e| e.name == name) {
            Err(format!("{name} is set"))
        } else {
            Ok(())
        }
    })
    .await
}

#[then("the provisioner container's resources are:")]
async fn container_resources(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let expected = docstring_yaml(world, step)?;
    container_eventually(world, "the container resources", |c| {
        let actual =
            serde_json::to_value(c.resources.clone().unwrap_or_default()).unwrap_or(Value::Null);
        if quantities_equal(&actual, &expected) {
            Ok(())
        } else {
            Err(format!("resources are {actual}"))
        }
    })
    .await
}

/// Compares resource maps as strings (YAML may give `1` where the API server returns `"1"`).
fn quantities_equal(actual: &Value, expected: &Value) -> bool {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            a.len() == e.len()
                && e.iter()
                    .all(|(k, v)| a.get(k).is_some_and(|av| quantities_equal(av, v)))
        }
        (a, e) => scalar(a) == scalar(e),
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[then(expr = "the provisioner Deployment has {int} replica(s)")]
async fn deployment_replicas(world: &mut ProvisionerWorld, expected: i32) -> anyhow::Result<()> {
    let world = &*world;
    world
        .children_promptly(
            &format!("{expected} replicas"),
            world.timeouts(),
            || async {
                let replicas = deployment(world)
                    .await?
                    .and_then(|d| d.spec)
                    .and_then(|s| s.replicas);
                Ok(if replicas == Some(expected) {
                    Ok(())
                } else {
                    Err(format!("replicas are {replicas:?}"))
                })
            },
        )
        .await
}

#[then(expr = "the provisioner pod template uses ServiceAccount {string}")]
async fn pod_service_account(world: &mut ProvisionerWorld, expected: String) -> anyhow::Result<()> {
    let expected = expand(world, &expected);
    let world = &*world;
    world
        .children_promptly(
            &format!("serviceAccountName {expected}"),
            world.timeouts(),
            || async {
                let actual = deployment(world)
                    .await?
                    .and_then(|d| d.spec)
                    .and_then(|s| s.template.spec)
                    .and_then(|s| s.service_account_name);
                Ok(if actual.as_deref() == Some(expected.as_str()) {
                    Ok(())
                } else {
                    Err(format!("it is {actual:?}"))
                })
            },
        )
        .await
}

/// Every field of the docstring (YAML) is in the Deployment's pod spec with the same value;
/// fields the docstring does not name are not looked at.
#[then("the provisioner pod spec has:")]
async fn pod_spec_has(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let expected = docstring_yaml(world, step)?;
    let world = &*world;
    world
        .children_promptly("the pod spec fields", world.timeouts(), || async {
            let actual = deployment(world)
                .await?
                .and_then(|d| d.spec)
                .and_then(|s| s.template.spec)
                .map(serde_json::to_value)
                .transpose()?
                .unwrap_or(Value::Null);
            Ok(contains(&actual, &expected, "spec.template.spec"))
        })
        .await
}

/// Whether `actual` holds every field of `expected` (lists item by item, same length;
/// scalars compared as text), naming the first difference.
fn contains(actual: &Value, expected: &Value, path: &str) -> Observation<()> {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => e.iter().try_for_each(|(key, want)| {
            contains(
                a.get(key).unwrap_or(&Value::Null),
                want,
                &format!("{path}.{key}"),
            )
        }),
        (Value::Array(a), Value::Array(e)) if a.len() == e.len() => a
            .iter()
            .zip(e)
            .enumerate()
            .try_for_each(|(i, (have, want))| contains(have, want, &format!("{path}[{i}]"))),
        (a, e) if !a.is_object() && !a.is_array() && scalar(a) == scalar(e) => Ok(()),
        (a, e) => Err(format!("{path} is {a}, expected {e}")),
    }
}

async fn pod_template(world: &ProvisionerWorld) -> anyhow::Result<Option<String>> {
    Ok(deployment(world)
        .await?
        .and_then(|d| d.spec)
        .map(|s| serde_json::to_string(&s.template))
        .transpose()?)
}

#[then("the provisioner pod template is remembered")]
async fn remember_template(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let template = world
        .children_promptly(
            "the Deployment's pod template",
            world.timeouts(),
            || async {
                Ok(pod_template(world)
                    .await?
                    .ok_or_else(|| "no Deployment yet".to_owned()))
            },
        )
        .await?;
    world.remembered.insert("podTemplate".to_owned(), template);
    // "stays unchanged" compares the whole spec (R-CRED-8 names replicas too), as it is now.
    let spec = deployment_spec(world).await?.unwrap_or_default();
    world.remembered.insert("deploymentSpec".to_owned(), spec);
    Ok(())
}

#[then("the provisioner pod template changes")]
async fn template_changes(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let before = remembered(world, "podTemplate")?;
    world
        .children_promptly(
            "the pod template to change (pods roll)",
            world.timeouts(),
            || async {
                Ok(match pod_template(world).await? {
                    Some(now) if now != before => Ok(()),
                    _ => Err("the pod template is unchanged".to_owned()),
                })
            },
        )
        .await
}

async fn deployment_spec(world: &ProvisionerWorld) -> anyhow::Result<Option<String>> {
    Ok(deployment(world)
        .await?
        .and_then(|d| d.spec)
        .map(|s| serde_json::to_string(&s))
        .transpose()?)
}

#[then("the provisioner Deployment stays unchanged during the observation window")]
async fn deployment_unchanged(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let before = remembered(world, "deploymentSpec")?;
    let window = world.observation_window();
    let world = &*world;
    wait::stays(
        "the Deployment to keep its spec",
        world.timeouts(),
        window,
        || async {
            Ok(match deployment_spec(world).await? {
                Some(now) if now == before => Ok(()),
                Some(now) => Err(format!("the Deployment's spec changed to {now}")),
                None => Err("the Deployment is gone".to_owned()),
            })
        },
    )
    .await
}

fn remembered(world: &ProvisionerWorld, key: &str) -> anyhow::Result<String> {
    world
        .remembered
        .get(key)
        .cloned()
        .ok_or_else(|| anyhow!("no earlier step remembered {key}"))
}

/// R-RBAC-1: the Role's rules, one table row per rule (comma-separated lists).
#[then(expr = "the Role {string} has exactly these rules:")]
async fn role_rules(world: &mut ProvisionerWorld, name: String, step: &Step) -> anyhow::Result<()> {
    let name = expand(world, &name);
    // Comma-separated; `""` is the core API group.
    let split = |cell: &str| -> Vec<String> {
        cell.split(',')
            .map(|s| s.trim().trim_matches('"').to_owned())
            .collect()
    };
    let expected: Vec<(Vec<String>, Vec<String>, Vec<String>)> = table_rows(step)?
        .into_iter()
        .skip(1)
        .map(|row| {
            let cell = |i: usize| row.get(i).map(String::as_str).unwrap_or("");
            (split(cell(0)), split(cell(1)), split(cell(2)))
        })
        .collect();
    let world = &*world;
    world
        .children_promptly(
            &format!("the rules of Role {name}"),
            world.timeouts(),
            || async {
                let api: Api<Role> = world.api();
                let Some(role) = api.get_opt(&name).await? else {
                    return Ok(Err(format!("Role {name} does not exist")));
                };
                let actual: Vec<(Vec<String>, Vec<String>, Vec<String>)> = role
                    .rules
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| {
                        (
                            r.api_groups.unwrap_or_default(),
                            r.resources.unwrap_or_default(),
                            r.verbs,
                        )
                    })
                    .collect();
                Ok(if actual == expected {
                    Ok(())
                } else {
                    Err(format!("rules are {actual:?}"))
                })
            },
        )
        .await
}

#[then(expr = "the RoleBinding {string} binds Role {string} to ServiceAccount {string}")]
async fn role_binding(
    world: &mut ProvisionerWorld,
    name: String,
    role: String,
    account: String,
) -> anyhow::Result<()> {
    let (name, role, account) = (
        expand(world, &name),
        expand(world, &role),
        expand(world, &account),
    );
    let world = &*world;
    world
        .children_promptly(&format!("RoleBinding {name}"), world.timeouts(), || async {
            let api: Api<RoleBinding> = world.api();
            let Some(binding) = api.get_opt(&name).await? else {
                return Ok(Err(format!("RoleBinding {name} does not exist")));
            };
            let role_ok = binding.role_ref.kind == "Role"
                && binding.role_ref.name == role
                && binding.role_ref.api_group == "rbac.authorization.k8s.io";
            let subjects = binding.subjects.unwrap_or_default();
            let subject_ok = matches!(subjects.as_slice(), [s] if s.kind == "ServiceAccount"
            && s.name == account && s.namespace.as_deref() == Some(world.namespace.as_str()));
            Ok(if role_ok && subject_ok {
                Ok(())
            } else {
                Err(format!(
                    "roleRef {:?}, subjects {subjects:?}",
                    binding.role_ref
                ))
            })
        })
        .await
}

/// R-RES-6: asked of the API server with SubjectAccessReviews for the operator's own
/// ServiceAccount (known when the suite started the operator), in the scenario's namespace.
/// A table row names a resource (`resource[.group][/subresource]`) and the verbs it needs;
/// `update or patch` is satisfied by either.
#[then("the operator's ServiceAccount may, in the provisioner's namespace:")]
async fn operator_may(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let (namespace, name) = world.operator_service_account().await?;
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let api: Api<SubjectAccessReview> = Api::all(world.client());
    let allowed = |resource: String, group: String, subresource: String, verb: String| {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.clone()),
                groups: Some(vec![
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{namespace}"),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(world.namespace.clone()),
                    group: Some(group),
                    resource: Some(resource),
                    subresource: (!subresource.is_empty()).then_some(subresource),
                    verb: Some(verb),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api = api.clone();
        async move {
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .context("asking a SubjectAccessReview")?;
            anyhow::Ok(answer.status.is_some_and(|s| s.allowed))
        }
    };
    let mut denied = Vec::new();
    for row in table_rows(step)?.into_iter().skip(1) {
        let [target, verbs] = row.as_slice() else {
            bail!("each row needs a resource and its verbs, got {row:?}");
        };
        let (qualified, subresource) = target.split_once('/').unwrap_or((target, ""));
        let (resource, group) = qualified.split_once('.').unwrap_or((qualified, ""));
        for needed in verbs.split(',').map(str::trim) {
            let mut any = false;
            for verb in needed.split(" or ").map(str::trim) {
                any |= allowed(
                    resource.to_owned(),
                    group.to_owned(),
                    subresource.to_owned(),
                    verb.to_owned(),
                )
                .await?;
            }
            if !any {
                denied.push(format!("{needed} {target}"));
            }
        }
    }
    if !denied.is_empty() {
        bail!("{user} may not {}", denied.join(", "));
    }
    Ok(())
}

// ---- Secrets ----

/// Reads a Secret; its values join the secrets the after-scenario leak check looks for (a key
/// rotated away later is still a secret that must not appear anywhere).
async fn secret(world: &ProvisionerWorld, name: &str) -> anyhow::Result<Option<Secret>> {
    let api: Api<Secret> = world.api();
    let found = api.get_opt(name).await?;
    for value in found
        .iter()
        .flat_map(|s| s.data.iter().flat_map(|d| d.values()))
    {
        world.saw_secret(&value.0);
    }
    Ok(found)
}

/// A digest of everything R-SEC-10 says must stay unchanged (data, labels, annotations,
/// ownerReferences); values never leave this function.
fn secret_digest(secret: &Secret) -> String {
    let view = json!({
        "data": secret.data,
        "labels": secret.metadata.labels,
        "annotations": secret.metadata.annotations,
        "ownerReferences": secret.metadata.owner_references,
        "type": secret.type_,
    });
    hex::encode(Sha256::digest(view.to_string().as_bytes()))
}

#[given(expr = "a Secret {string} that the provisioner does not own")]
async fn foreign_secret(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let name = expand(world, &name);
    create_foreign_secret(world, &name, json!([])).await
}

/// A Secret someone else made under `name`, with `owners` as its owner references; remembers its
/// digest ("is left unchanged") and its field managers (R-SEC-15).
async fn create_foreign_secret(
    world: &mut ProvisionerWorld,
    name: &str,
    owners: Value,
) -> anyhow::Result<()> {
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "labels": {"team": "someone-else"}, "ownerReferences": owners},
        "type": "Opaque",
        "stringData": {"key": "not-a-provisioner-key"},
    });
    let created = world
        .api::<Secret>()
        .create(&PostParams::default(), &serde_json::from_value(secret)?)
        .await
        .with_context(|| format!("creating Secret {name}"))?;
    world
        .remembered
        .insert(format!("secret:{name}"), secret_digest(&created));
    world.suite_wrote_secret(&created);
    Ok(())
}

/// R-SEC-8 in every ownership shape: no owner, the provisioner itself without the controller
/// flag, or another kind of controller. The Secret is made while the CR waits at a closed gate,
/// so that it can name the CR's uid.
#[when(expr = "a Secret {string} owned {string} is created")]
async fn secret_owned(
    world: &mut ProvisionerWorld,
    name: String,
    shape: String,
) -> anyhow::Result<()> {
    let name = expand(world, &name);
    let provisioner_uid = || async {
        world
            .provisioner_json()
            .await?
            .and_then(|cr| super::str_at(&cr, "/metadata/uid").map(str::to_owned))
            .ok_or_else(|| {
                anyhow!("the provisioner must exist before a Secret can name it as owner")
            })
    };
    let owners = match shape.as_str() {
        "by nobody" => json!([]),
        "by the provisioner without being its controller" => json!([{
            "apiVersion": "coder.com/v1alpha1", "kind": "CoderProvisioner",
            "name": world.provisioner, "uid": provisioner_uid().await?,
        }]),
        "by a ConfigMap as its controller" => {
            let api: Api<k8s_openapi::api::core::v1::ConfigMap> = world.api();
            let owner = api
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "secret-owner"}}))?,
                )
                .await
                .context("creating the ConfigMap that owns the Secret")?;
            json!([{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "secret-owner",
                "uid": owner.metadata.uid, "controller": true, "blockOwnerDeletion": true,
            }])
        }
        other => bail!("unknown ownership shape {other:?}"),
    };
    create_foreign_secret(world, &name, owners).await
}

#[then(expr = "the Secret {string} is left unchanged")]
async fn secret_unchanged(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let name = expand(world, &name);
    let before = remembered(world, &format!("secret:{name}"))?;
    let window = world.observation_window();
    let world = &*world;
    wait::stays(
        &format!("Secret {name} to stay unchanged"),
        world.timeouts(),
        window,
        || async {
            Ok(match secret(world, &name).await? {
                Some(now) if secret_digest(&now) == before => Ok(()),
                Some(_) => {
                    Err("its data, labels, annotations or ownerReferences changed".to_owned())
                }
                None => Err("it was deleted".to_owned()),
            })
        },
    )
    .await
}

#[when(expr = "the Secret {string} is deleted")]
async fn secret_deleted(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    world.mark_action().await?;
    let name = expand(world, &name);
    let api: Api<Secret> = world.api();
    api.delete(&name, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting Secret {name}"))?;
    Ok(())
}

#[when("the provisioner key Secret is deleted")]
async fn key_secret_deleted(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let name = key_secret_name(world);
    secret_deleted(world, name).await
}

/// R-KEY-10: "or its value emptied": the Secret stays, its key's value is the empty string.
#[when("the provisioner key Secret is emptied")]
async fn key_secret_emptied(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.mark_action().await?;
    let name = key_secret_name(world);
    world
        .api::<Secret>()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"key": ""}})),
        )
        .await
        .with_context(|| format!("emptying Secret {name}"))?;
    Ok(())
}

/// R-SEC-2/3/5: an Opaque Secret controlled by the CR with a non-empty key under `key`;
/// remembers a digest of the value so a later step can tell whether it was rewritten.
#[then(expr = "the Secret {string} holds a provisioner key")]
async fn secret_holds_key(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let name = expand(world, &name);
    let digest = world
        .children_promptly(
            &format!("Secret {name} with a key"),
            world.timeouts(),
            || async {
                let Some(found) = secret(world, &name).await? else {
                    return Ok(Err(format!("Secret {name} does not exist")));
                };
                let value = found
                    .data
                    .as_ref()
                    .and_then(|d| d.get("key"))
                    .map(|v| v.0.clone())
                    .unwrap_or_default();
                Ok(if found.type_.as_deref() != Some("Opaque") {
                    Err(format!("type is {:?}", found.type_))
                } else if value.is_empty() {
                    Err("data.key is empty".to_owned())
                } else {
                    Ok(hex::encode(Sha256::digest(&value)))
                })
            },
        )
        .await?;
    world.remembered.insert(format!("key:{name}"), digest);
    Ok(())
}

fn key_digest(found: &Secret) -> Option<String> {
    let value = found.data.as_ref()?.get("key")?;
    (!value.0.is_empty()).then(|| hex::encode(Sha256::digest(&value.0)))
}

/// The key value differs from the one remembered by "holds a provisioner key" (R-KEY-10/13).
#[then(expr = "the Secret {string} gets a new provisioner key")]
async fn secret_key_new(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let name = expand(world, &name);
    let previous = remembered(world, &format!("key:{name}"))?;
    let digest = world
        .children_promptly(
            &format!("a new key in Secret {name}"),
            world.timeouts(),
            || async {
                Ok(
                    match secret(world, &name).await?.as_ref().and_then(key_digest) {
                        Some(now) if now != previous => Ok(now),
                        Some(_) => Err("it still holds the previous key".to_owned()),
                        None => Err("it does not exist or holds no key".to_owned()),
                    },
                )
            },
        )
        .await?;
    world.remembered.insert(format!("key:{name}"), digest);
    Ok(())
}

#[then(expr = "the Secret {string} keeps its provisioner key")]
async fn secret_key_kept(world: &mut ProvisionerWorld, name: String) -> anyhow::Result<()> {
    let name = expand(world, &name);
    let previous = remembered(world, &format!("key:{name}"))?;
    let window = world.observation_window();
    let world = &*world;
    wait::stays(
        &format!("Secret {name} to keep its key"),
        world.timeouts(),
        window,
        || async {
            Ok(
                match secret(world, &name).await?.as_ref().and_then(key_digest) {
                    Some(now) if now == previous => Ok(()),
                    _ => Err("its key changed or vanished".to_owned()),
                },
            )
        },
    )
    .await
}

/// A Secret referenced by `extraEnv` (R-CRED-*): metadata from the docstring (placeholders as
/// in [`expand`]), one data key `value`.
#[given(expr = "a credential Secret {string} with metadata:")]
async fn credential_secret(
    world: &mut ProvisionerWorld,
    name: String,
    step: &Step,
) -> anyhow::Result<()> {
    let metadata: Value =
        serde_saphyr::from_str(&expand(world, step.docstring.as_deref().unwrap_or("{}")))
            .context("the docstring is not valid YAML")?;
    let mut secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "stringData": {"value": format!("proxy-password-{}", world.id)},
    });
    merge(&mut secret, &json!({ "metadata": metadata }));
    let api: Api<Secret> = world.api();
    let written = api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .with_context(|| format!("writing Secret {name}"))?;
    world.suite_wrote_secret(&written);
    Ok(())
}

#[when(expr = "the credential Secret {string} metadata is changed to:")]
async fn credential_secret_changed(
    world: &mut ProvisionerWorld,
    name: String,
    step: &Step,
) -> anyhow::Result<()> {
    world.mark_action().await?;
    let metadata: Value =
        serde_saphyr::from_str(&expand(world, step.docstring.as_deref().unwrap_or("{}")))
            .context("the docstring is not valid YAML")?;
    let api: Api<Secret> = world.api();
    let written = api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": metadata })),
        )
        .await
        .with_context(|| format!("changing Secret {name}"))?;
    world.suite_wrote_secret(&written);
    Ok(())
}

// ---- the forbidden Role of the PR ----

/// An object-count quota of zero Roles: the API server refuses the operator's Role with 403
/// Forbidden whatever the operator's own RBAC, which forces the retries the PR is about.
#[given(expr = "the namespace refuses new {word}")]
async fn refuse_new(world: &mut ProvisionerWorld, kind: String) -> anyhow::Result<()> {
    world.fault_injected();
    let (name, resource) = refusing_quota(&kind)?;
    let hard = BTreeMap::from([(resource.to_owned(), json!("0"))]);
    let quota = json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": name},
        "spec": {"hard": hard},
    });
    let api: Api<ResourceQuota> = world.api();
    api.create(&PostParams::default(), &serde_json::from_value(quota)?)
        .await
        .context("creating the ResourceQuota")?;
    // Quota admission enforces `status.hard`, which the quota controller fills in; write it
    // directly so enforcement does not depend on that controller running.
    let status = json!({"status": {"hard": hard, "used": {resource: "0"}}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("writing the ResourceQuota status")?;
    Ok(())
}

/// A pod quota: the ReplicaSet controller starts only `pods` of the provisioner's replicas (the
/// local tier's readiness stand-in caps its ready replicas at the quota too).
#[given(expr = "the namespace allows only {int} pod(s)")]
async fn pod_quota(world: &mut ProvisionerWorld, pods: u32) -> anyhow::Result<()> {
    let hard = BTreeMap::from([("pods".to_owned(), json!(pods.to_string()))]);
    let quota = json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "conformance-pods"},
        "spec": {"hard": hard},
    });
    let api: Api<ResourceQuota> = world.api();
    api.create(&PostParams::default(), &serde_json::from_value(quota)?)
        .await
        .context("creating the pod ResourceQuota")?;
    // As for the refusing quotas: admission enforces `status.hard`, written here at once.
    let status = json!({"status": {"hard": hard, "used": {"pods": "0"}}});
    api.patch_status(
        "conformance-pods",
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await
    .context("writing the pod ResourceQuota status")?;
    Ok(())
}

#[when(expr = "the namespace accepts new {word} again")]
async fn accept_new(world: &mut ProvisionerWorld, kind: String) -> anyhow::Result<()> {
    world.mark_action().await?;
    let (name, _) = refusing_quota(&kind)?;
    let api: Api<ResourceQuota> = world.api();
    api.delete(&name, &DeleteParams::default())
        .await
        .context("deleting the ResourceQuota")?;
    world.fault_cleared();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(json!({"limits": {"cpu": "1"}}), json!({"limits": {"cpu": 1}}), true)]
    #[case(json!({"limits": {"cpu": "1"}}), json!({"limits": {"cpu": "2"}}), false)]
    #[case(json!({"limits": {"cpu": "1"}, "requests": {}}), json!({"limits": {"cpu": "1"}}), false)]
    fn quantities_compare_as_strings(
        #[case] actual: Value,
        #[case] expected: Value,
        #[case] equal: bool,
    ) {
        assert_eq!(quantities_equal(&actual, &expected), equal);
    }

    fn labelled(owner_uid: &str) -> Value {
        json!({"metadata": {
            "ownerReferences": [{"apiVersion": "coder.com/v1alpha1", "kind": "CoderProvisioner",
                                 "name": "p", "uid": owner_uid, "controller": true}],
            "labels": {"app.kubernetes.io/name": "coder-provisioner", "app.kubernetes.io/instance": "p",
                       "app.kubernetes.io/managed-by": "anyone"}}})
    }

    #[rstest]
    #[case(json!({"a": 1, "b": [{"name": "x"}]}), json!({"b": [{"name": "x"}]}), true)]
    #[case(json!({"a": "30"}), json!({"a": 30}), true)]
    #[case(json!({"a": 1}), json!({"a": 2}), false)]
    #[case(json!({"b": [{"name": "x"}, {"name": "y"}]}), json!({"b": [{"name": "x"}]}), false)]
    #[case(json!({}), json!({"a": 1}), false)]
    #[case(json!({"a": {"b": 1}}), json!({"a": "x"}), false)]
    fn pod_spec_fields_are_contained(
        #[case] actual: Value,
        #[case] expected: Value,
        #[case] ok: bool,
    ) {
        assert_eq!(contains(&actual, &expected, "spec").is_ok(), ok);
    }

    #[rstest]
    #[case("http://127.0.0.1:3000", "http://localhost:3000")]
    #[case("http://localhost:3000", "http://127.0.0.1:3000")]
    #[case(
        "http://fake-coderd.coder-fake.svc:3000",
        "http://fake-coderd.coder-fake.svc.cluster.local:3000"
    )]
    #[case(
        "http://fake-coderd.coder-fake.svc.cluster.local:3000",
        "http://fake-coderd.coder-fake.svc:3000"
    )]
    #[case("https://coder.example.com", "https://coder.example.com.")]
    #[case("https://coder.example.com/", "https://coder.example.com./")]
    fn the_other_origin_reaches_the_same_server_under_another_host(
        #[case] url: &str,
        #[case] other: &str,
    ) {
        assert_eq!(other_origin(url), other);
    }

    #[rstest]
    #[case("Deployment", labelled("u1"), true)]
    #[case("Deployment", labelled("u2"), false)]
    #[case("Deployment", json!({"metadata": {}}), false)]
    #[case("Secret", labelled("u1"), false)]
    #[case("Secret", blocking(labelled("u1")), true)]
    fn ownership_and_labels_are_checked(
        #[case] kind: &str,
        #[case] object: Value,
        #[case] ok: bool,
    ) {
        assert_eq!(owned_observation(kind, &object, "u1", "p").is_ok(), ok);
    }

    fn blocking(mut object: Value) -> Value {
        object["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = json!(true);
        object
    }

    #[rstest]
    #[case(json!({"spec": {"selector": {"matchLabels": standard()}, "template": {"metadata": {"labels": standard()}}}}), true)]
    #[case(json!({"spec": {"selector": {"matchLabels": {"app.kubernetes.io/instance": "p"}},
                            "template": {"metadata": {"labels": {"app.kubernetes.io/instance": "p"}}}}}), false)]
    #[case(json!({"spec": {"selector": {"matchLabels": standard()},
                            "template": {"metadata": {"labels": {"extra": "x"}}}}}), false)]
    fn pods_are_selected_by_exactly_the_standard_labels(
        #[case] deployment: Value,
        #[case] ok: bool,
    ) {
        assert_eq!(standard_labels_problem(&deployment, "p").is_none(), ok);
    }

    fn standard() -> Value {
        json!({"app.kubernetes.io/name": "coder-provisioner", "app.kubernetes.io/instance": "p",
               "app.kubernetes.io/managed-by": "anyone"})
    }
}

/// R-SEC-15 as a step (the after-hook checks the same after every scenario).
#[then("no Secret the suite wrote was written by anyone else")]
async fn suite_secrets_untouched(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let found = crate::scenario_checks::suite_objects_untouched(world).await?;
    if !found.is_empty() {
        bail!("{}", found.join("; "));
    }
    Ok(())
}
