//! The contract oracle: what a settled CoderProvisioner and its children must look like, derived
//! from the contract's text and the CR's own spec, never from the reference operator's code.
//!
//! Pure functions over JSON objects, so every rule they encode is unit-tested on fixtures. They
//! judge *settled* states only (D-15: a status that stood unchanged for the tier's window after
//! the operator's last reaction; the callers decide what stood), since between two settled states
//! an implementation may write any intermediate status (D-13):
//! * [`settled_state_findings`] hold between a settled CR's readiness fields (R-ST-2, R-ST-5)
//!   and, when its key is [`ready_for_its_spec`], between its status and its spec (R-KEY-6,
//!   R-SEC-6, R-ST-8);
//! * [`world_findings`] hold at the end of a scenario for a settled CR, between the CR, its
//!   control plane, its children and coderd's keys (R-KEY-3/5/6, R-SEC-2/3/4, R-RES-1/3/4,
//!   R-RBAC-1/2/3, R-POD-1…16).
//!
//! A finding is a sentence ending with the rule it breaks in parentheses, which is how the report
//! blames it ([`crate::rule_ids::rules_named_in`]).
use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The condition types of the contract (R-ST-6) in gate order (D-1).
pub const CONDITION_TYPES: [&str; 7] = [
    "ControlPlaneReady",
    "OperatorAccessReady",
    "CredentialsReady",
    "ExternalProvisionersEntitled",
    "ProvisionerKeySecretReady",
    "ProvisionerKeyReady",
    "DeploymentReady",
];

/// R-POD-8's last fallback.
const DEFAULT_IMAGE: &str = "ghcr.io/coder/coder:latest";
/// R-RES-2 / D-6: Kubernetes label values and most child names.
const MAX_NAME: usize = 63;
/// D-4: coderd's limit on key names.
const MAX_KEY_NAME: usize = 64;

fn text<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer).and_then(Value::as_str)
}

/// A spec string, with the contract's "empty means default" (R-CRD-5, R-CRD-6, R-KEY-2).
fn given<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    text(object, pointer).filter(|value| !value.is_empty())
}

fn condition<'a>(cr: &'a Value, kind: &str) -> Option<&'a Value> {
    cr.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
}

fn condition_status<'a>(cr: &'a Value, kind: &str) -> Option<&'a str> {
    condition(cr, kind)
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
}

/// A status that says the key is in place for the current spec: the key and its Secret are
/// ready, no gate is False (DeploymentReady only reports pod readiness, so it may be False with
/// 0 replicas), and the status observes the current generation (it describes this spec, not an
/// earlier one). Only such a status, once settled, is held to its spec (R-KEY-6: "after a
/// successful create"). It says nothing of time: a status may show this shape for a moment
/// between two writes of one pass.
pub fn ready_for_its_spec(cr: &Value) -> bool {
    let generation = cr.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = cr
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    generation.is_some()
        && observed == generation
        && condition_status(cr, "ProvisionerKeyReady") == Some("True")
        && condition_status(cr, "ProvisionerKeySecretReady") == Some("True")
        && CONDITION_TYPES[..6]
            .iter()
            .all(|kind| condition_status(cr, kind) != Some("False"))
}

/// What a settled state keeps unchanged (D-15): the spec it answers (its generation) and its
/// status.
pub fn state_fingerprint(cr: &Value) -> String {
    format!(
        "{} {}",
        cr.pointer("/metadata/generation").unwrap_or(&Value::Null),
        cr.get("status").unwrap_or(&Value::Null)
    )
}

/// Whether the CR shows `ProvisionerKeyReady=False` with reason `RateLimited` (R-RL-1).
pub fn shows_rate_limited(cr: &Value) -> bool {
    condition(cr, "ProvisionerKeyReady").is_some_and(|c| {
        c.get("status").and_then(Value::as_str) == Some("False")
            && c.get("reason").and_then(Value::as_str) == Some("RateLimited")
    })
}

/// The rule an unsettled CR's status contradicts first, in D-1's gate order (a later stage's
/// shortfall follows from an earlier one's, so only the root is blamed): its key Secret not
/// ready (R-SEC-7, the ownership gate comes before the key), its key not ready (R-KEY-20), the
/// generation not observed (R-ST-4). A condition shown `False` is the root before one that is
/// only absent (a pass that stopped at the key sets no Secret condition). Only for a CR that
/// should have settled (a valid spec, a healthy coderd); another gate's `False` names no rule
/// here.
pub fn unsettled_rules(cr: &Value) -> Vec<&'static str> {
    const STAGES: [(&str, &str); 2] = [
        ("ProvisionerKeySecretReady", "R-SEC-7"),
        ("ProvisionerKeyReady", "R-KEY-20"),
    ];
    let generation = cr.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = cr
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    let first = |shown: fn(Option<&str>) -> bool| {
        STAGES
            .iter()
            .find(|(kind, _)| shown(condition_status(cr, kind)))
            .map(|(_, rule)| *rule)
    };
    let root = first(|status| status == Some("False"))
        .or_else(|| first(|status| status != Some("True")))
        .or((generation.is_none() || observed != generation).then_some("R-ST-4"));
    root.into_iter().collect()
}

/// FNV-1a 32 over `bytes`, as 8 lowercase hex digits (R-ST-8).
pub fn fnv1a_hex(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:08x}")
}

/// R-ST-8: tags sorted by key, each fed as key, a zero byte, value, a zero byte.
pub fn tags_hash(tags: &BTreeMap<String, String>) -> String {
    let mut bytes = Vec::new();
    for (key, value) in tags {
        bytes.extend_from_slice(key.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
    }
    fnv1a_hex(&bytes)
}

/// What the contract derives from a CR's spec (and its control plane, when known).
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    pub name: String,
    pub uid: String,
    /// R-CRD-5 / R-KEY-1: as the spec gives it, or `default`.
    pub organization: String,
    /// R-KEY-2 / D-4: lower-cased; `None` when the default name must be shortened (only its
    /// properties are normative then).
    pub key_name: Option<String>,
    /// R-SEC-1: `None` when the default name must be shortened.
    pub secret_name: Option<String>,
    pub secret_key: String,
    pub tags: BTreeMap<String, String>,
    pub control_plane: String,
}

impl Expected {
    pub fn of(cr: &Value) -> Expected {
        let name = text(cr, "/metadata/name").unwrap_or_default().to_owned();
        let key_name = given(cr, "/spec/key/name").unwrap_or(&name).to_lowercase();
        let default_secret = format!("{name}-provisioner-key");
        let secret_name = match given(cr, "/spec/key/secretName") {
            Some(explicit) => Some(explicit.to_owned()),
            None => (default_secret.len() <= 253).then_some(default_secret),
        };
        let tags = cr
            .pointer("/spec/tags")
            .and_then(Value::as_object)
            .map(|tags| {
                tags.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        Expected {
            uid: text(cr, "/metadata/uid").unwrap_or_default().to_owned(),
            organization: given(cr, "/spec/organizationName")
                .unwrap_or("default")
                .to_owned(),
            key_name: (key_name.len() <= MAX_KEY_NAME).then_some(key_name),
            secret_name,
            secret_key: given(cr, "/spec/key/secretKey").unwrap_or("key").to_owned(),
            tags,
            control_plane: text(cr, "/spec/controlPlaneRef/name")
                .unwrap_or_default()
                .to_owned(),
            name,
        }
    }

    /// The child name of `kind` with the rule that gives it: R-RES-1's when it fits in 63
    /// characters. `None` past that (and for a key Secret whose default name must be shortened):
    /// D-6 makes shortening normative only in its properties (at most 63 characters,
    /// deterministic, distinct for distinct CR names), not R-RES-2's exact prefix and hash.
    fn child_name(&self, kind: &str) -> Option<(String, &'static str)> {
        let (prefix, suffix, rule) = match kind {
            "Secret" => return self.secret_name.clone().map(|name| (name, "R-SEC-1")),
            "ServiceAccount" => ("", "-provisioner", "R-RBAC-3"),
            _ => ("provisioner-", "", "R-RES-1"),
        };
        let full = format!("{prefix}{}{suffix}", self.name);
        (full.len() <= MAX_NAME).then_some((full, rule))
    }
}

/// Checks of a settled CR's status (D-15): readiness is reported consistently (R-ST-2, R-ST-5)
/// and, when its key is [`ready_for_its_spec`], its status records what its spec asks for.
pub fn settled_state_findings(cr: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let Some(status) = cr.get("status").filter(|s| s.is_object()) else {
        return found;
    };
    let ready_replicas = status
        .get("readyReplicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    match status.get("phase").and_then(Value::as_str) {
        Some("Ready") if ready_replicas < 1 => found.push(format!(
            "status.phase is Ready with readyReplicas {ready_replicas} (R-ST-2)"
        )),
        Some("Pending") if ready_replicas >= 1 => found.push(format!(
            "status.phase is Pending with readyReplicas {ready_replicas} (R-ST-2)"
        )),
        _ => {}
    }
    if let Some(deployment_ready) = condition_status(cr, "DeploymentReady") {
        let expected = if ready_replicas >= 1 { "True" } else { "False" };
        if deployment_ready != expected {
            found.push(format!(
                "DeploymentReady is {deployment_ready} with readyReplicas {ready_replicas} (R-ST-5)"
            ));
        }
    }
    if ready_for_its_spec(cr) {
        found.extend(settled_status_findings(cr, &Expected::of(cr)));
    }
    found
}

/// R-KEY-6, R-SEC-6, R-ST-8: the status of a settled CR against its spec.
fn settled_status_findings(cr: &Value, expected: &Expected) -> Vec<String> {
    let mut found = Vec::new();
    let status = |field: &str| text(cr, &format!("/status/{field}"));
    let organization = status("organizationName").unwrap_or_default();
    if !organization.eq_ignore_ascii_case(&expected.organization) {
        found.push(format!(
            "status.organizationName is {organization:?} while the spec asks for {:?} (R-KEY-6)",
            expected.organization
        ));
    }
    let key_name = status("provisionerKeyName").unwrap_or_default();
    match &expected.key_name {
        Some(wanted) if key_name != wanted => found.push(format!(
            "status.provisionerKeyName is {key_name:?}, not the effective key name {wanted:?} (R-KEY-6)"
        )),
        None if key_name.is_empty() || key_name.len() > MAX_KEY_NAME => found.push(format!(
            "status.provisionerKeyName is {key_name:?}: a shortened name must have 1 to {MAX_KEY_NAME} characters (R-CRD-13)"
        )),
        _ => {}
    }
    for field in ["organizationID", "provisionerKeyID"] {
        if status(field).is_none_or(str::is_empty) {
            found.push(format!(
                "status.{field} is empty on a CR whose key is ready (R-KEY-6)"
            ));
        }
    }
    let ref_name = status("controlPlaneRefName").unwrap_or_default();
    if ref_name != expected.control_plane {
        found.push(format!(
            "status.controlPlaneRefName is {ref_name:?}, not spec.controlPlaneRef.name {:?} (R-KEY-6)",
            expected.control_plane
        ));
    }
    let secret_ref = cr
        .pointer("/status/secretRef")
        .cloned()
        .unwrap_or(Value::Null);
    let ref_secret = text(&secret_ref, "/name").unwrap_or_default();
    let ref_key = text(&secret_ref, "/key").unwrap_or_default();
    let name_ok = match &expected.secret_name {
        Some(wanted) => ref_secret == wanted,
        None => !ref_secret.is_empty() && ref_secret.len() <= 253,
    };
    if !name_ok || ref_key != expected.secret_key {
        found.push(format!(
            "status.secretRef is {secret_ref}, not the Secret {:?} and data key {:?} the spec asks for (R-SEC-6)",
            expected.secret_name.as_deref().unwrap_or("<shortened>"),
            expected.secret_key
        ));
    }
    let hash = status("tagsHash").unwrap_or_default();
    let wanted = tags_hash(&expected.tags);
    if hash != wanted {
        found.push(format!(
            "status.tagsHash is {hash:?}, not {wanted:?} for the spec's tags (R-ST-8)"
        ));
    }
    found
}

/// coderd as the oracle sees it: the organizations' ids by name and the keys it holds.
#[derive(Clone, Debug, Default)]
pub struct CoderdView {
    /// Organization name (lower-cased) → id.
    pub organizations: BTreeMap<String, String>,
    /// Keys of the organizations the scenario uses.
    pub keys: Vec<fake_coderd::ProvisionerKey>,
}

/// Everything in the CR's namespace the oracle compares it with, read at one moment.
#[derive(Clone, Debug, Default)]
pub struct Surroundings {
    pub control_plane: Option<Value>,
    /// Secrets, ServiceAccounts, Roles, RoleBindings and Deployments of the namespace, each with
    /// its `kind`.
    pub objects: Vec<Value>,
    /// `None` against a real coderd.
    pub coderd: Option<CoderdView>,
    /// The id of the key the plaintext in the key Secret authenticates as (a daemon's lookup),
    /// or why it does not.
    pub secret_key_identity: Option<Result<String, String>>,
}

fn kind_of(object: &Value) -> &str {
    text(object, "/kind").unwrap_or_default()
}

/// The objects of `kind` whose controller reference names the CR.
fn controlled<'a>(objects: &'a [Value], kind: &str, uid: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|o| kind_of(o) == kind)
        .filter(|o| {
            o.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|r| {
                    r.get("controller").and_then(Value::as_bool) == Some(true)
                        && text(r, "/uid") == Some(uid)
                })
        })
        .collect()
}

/// The end-of-scenario oracle for a [`settled`] CR: status against the control plane and coderd,
/// and every child against the spec.
pub fn world_findings(cr: &Value, around: &Surroundings) -> Vec<String> {
    let expected = Expected::of(cr);
    let mut found = Vec::new();
    let status = |field: &str| text(cr, &format!("/status/{field}")).unwrap_or_default();
    let url = around
        .control_plane
        .as_ref()
        .and_then(|cp| text(cp, "/status/url"))
        .unwrap_or_default();
    if status("controlPlaneURL") != url {
        found.push(format!(
            "status.controlPlaneURL is {:?}, not the control plane's status.url {url:?} (R-KEY-6)",
            status("controlPlaneURL")
        ));
    }
    if let Some(coderd) = &around.coderd {
        found.extend(coderd_findings(cr, &expected, coderd));
    }
    match &around.secret_key_identity {
        Some(Ok(id)) if id != status("provisionerKeyID") => found.push(format!(
            "the key Secret holds the plaintext of key {id}, not of the recorded key {} (R-KEY-5)",
            status("provisionerKeyID")
        )),
        Some(Err(why)) => found.push(format!(
            "the key Secret's value does not authenticate to coderd: {why} (R-KEY-5)"
        )),
        _ => {}
    }
    found.extend(children_findings(cr, &expected, around));
    found
}

fn coderd_findings(cr: &Value, expected: &Expected, coderd: &CoderdView) -> Vec<String> {
    let mut found = Vec::new();
    let status = |field: &str| text(cr, &format!("/status/{field}")).unwrap_or_default();
    let organization_id = status("organizationID");
    match coderd
        .organizations
        .get(&expected.organization.to_lowercase())
    {
        Some(id) if id != organization_id => found.push(format!(
            "status.organizationID is {organization_id:?}, but coderd's organization {:?} has id {id} (R-KEY-6)",
            expected.organization
        )),
        _ => {}
    }
    let key_id = status("provisionerKeyID");
    let Some(key) = coderd.keys.iter().find(|k| k.id == key_id) else {
        found.push(format!(
            "coderd holds no key with the recorded id {key_id:?} (R-KEY-6)"
        ));
        return found;
    };
    if key.organization != organization_id {
        found.push(format!(
            "the recorded key {key_id} is in organization {}, not the recorded {organization_id} (R-KEY-6)",
            key.organization
        ));
    }
    if key.name != status("provisionerKeyName") {
        found.push(format!(
            "the recorded key {key_id} is named {:?} in coderd, not {:?} as recorded (R-KEY-6)",
            key.name,
            status("provisionerKeyName")
        ));
    }
    if key.tags != expected.tags {
        found.push(format!(
            "the recorded key {key_id} carries tags {:?}, not the spec's {:?} (R-KEY-3, R-KEY-13)",
            key.tags, expected.tags
        ));
    }
    found
}

/// R-RES-3/4 and D-6 for one child (R-SEC-3 adds `blockOwnerDeletion` for the key Secret).
fn ownership_findings(kind: &str, object: &Value, expected: &Expected) -> Vec<String> {
    let name = text(object, "/metadata/name").unwrap_or_default();
    let mut found = Vec::new();
    let (owner_rule, label_rule) = if kind == "Secret" {
        ("R-SEC-3", "R-SEC-4")
    } else {
        ("R-RES-3", "R-RES-4")
    };
    let owner = object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|r| text(r, "/uid") == Some(expected.uid.as_str()));
    if let Some(owner) = owner {
        let wrong = text(owner, "/apiVersion") != Some("coder.com/v1alpha1")
            || text(owner, "/kind") != Some("CoderProvisioner")
            || text(owner, "/name") != Some(expected.name.as_str());
        if wrong {
            found.push(format!(
                "{kind} {name}'s owner reference {owner} does not name the CoderProvisioner ({owner_rule})"
            ));
        }
        if kind == "Secret"
            && owner.get("blockOwnerDeletion").and_then(Value::as_bool) != Some(true)
        {
            found.push(format!(
                "{kind} {name}'s controller reference lacks blockOwnerDeletion: true (R-SEC-3)"
            ));
        }
    }
    let label = |key: &str| {
        object
            .pointer("/metadata/labels")
            .and_then(|labels| labels.get(key))
            .and_then(Value::as_str)
    };
    if label("app.kubernetes.io/name") != Some("coder-provisioner") {
        found.push(format!(
            "{kind} {name} has label app.kubernetes.io/name {:?}, not \"coder-provisioner\" ({label_rule})",
            label("app.kubernetes.io/name")
        ));
    }
    let instance = label("app.kubernetes.io/instance").unwrap_or_default();
    let instance_ok = if expected.name.len() <= MAX_NAME {
        instance == expected.name
    } else {
        !instance.is_empty() && instance.len() <= MAX_NAME
    };
    if !instance_ok {
        found.push(format!(
            "{kind} {name} has label app.kubernetes.io/instance {instance:?} for CoderProvisioner {} ({label_rule})",
            expected.name
        ));
    }
    if label("app.kubernetes.io/managed-by").is_none_or(str::is_empty) {
        found.push(format!(
            "{kind} {name} lacks a non-empty app.kubernetes.io/managed-by label ({label_rule})"
        ));
    }
    found
}

/// The one child of `kind` the CR controls, or a finding (none, several, or a wrong name).
fn the_child<'a>(
    around: &'a Surroundings,
    kind: &str,
    expected: &Expected,
    found: &mut Vec<String>,
) -> Option<&'a Value> {
    let rule = match kind {
        "Secret" => "R-SEC-1",
        "ServiceAccount" => "R-RBAC-3",
        _ => "R-RES-1",
    };
    let children = controlled(&around.objects, kind, &expected.uid);
    let wanted = expected.child_name(kind);
    let child = match (children.as_slice(), &wanted) {
        ([], _) => None,
        ([only], _) => Some(*only),
        (several, Some((wanted, _))) => several
            .iter()
            .find(|c| text(c, "/metadata/name") == Some(wanted.as_str()))
            .copied(),
        (several, None) => Some(several[0]),
    };
    let Some(child) = child else {
        found.push(format!(
            "no {kind}{} controlled by CoderProvisioner {} ({rule})",
            wanted.map(|(w, _)| format!(" {w}")).unwrap_or_default(),
            expected.name
        ));
        return None;
    };
    let name = text(child, "/metadata/name").unwrap_or_default();
    match &wanted {
        Some((wanted, naming_rule)) if name != wanted => found.push(format!(
            "the {kind} controlled by CoderProvisioner {} is named {name:?}, not {wanted:?} ({naming_rule})",
            expected.name
        )),
        None if name.len() > if kind == "Secret" { 253 } else { MAX_NAME } => found.push(format!(
            "the {kind} controlled by CoderProvisioner {} is named {name:?}, over the limit (R-RES-2)",
            expected.name
        )),
        _ => {}
    }
    if kind != "Secret" && children.len() > 1 {
        found.push(format!(
            "CoderProvisioner {} controls {} {kind}s (R-RES-1)",
            expected.name,
            children.len()
        ));
    }
    found.extend(ownership_findings(kind, child, expected));
    Some(child)
}

fn children_findings(cr: &Value, expected: &Expected, around: &Surroundings) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(secret) = the_child(around, "Secret", expected, &mut found) {
        if text(secret, "/type").unwrap_or("Opaque") != "Opaque" {
            found.push(format!(
                "the key Secret has type {:?}, not Opaque (R-SEC-2)",
                text(secret, "/type")
            ));
        }
        let has_value = secret
            .pointer(&format!(
                "/data/{}",
                expected.secret_key.replace('~', "~0").replace('/', "~1")
            ))
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty());
        if !has_value {
            found.push(format!(
                "the key Secret has no value under {:?} (R-KEY-5)",
                expected.secret_key
            ));
        }
    }
    let account = the_child(around, "ServiceAccount", expected, &mut found);
    let account_name = account
        .and_then(|a| text(a, "/metadata/name"))
        .unwrap_or_default();
    if let Some(role) = the_child(around, "Role", expected, &mut found) {
        let wanted = json!([{
            "apiGroups": [""],
            "resources": ["pods", "persistentvolumeclaims"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }]);
        if !same_rules(role.get("rules").unwrap_or(&Value::Null), &wanted) {
            found.push(format!(
                "Role {} has rules {}, not exactly the contract's one rule (R-RBAC-1)",
                text(role, "/metadata/name").unwrap_or_default(),
                role.get("rules").unwrap_or(&Value::Null)
            ));
        }
        if let Some(binding) = the_child(around, "RoleBinding", expected, &mut found) {
            let role_name = text(role, "/metadata/name").unwrap_or_default();
            let role_ref = binding.get("roleRef").cloned().unwrap_or(Value::Null);
            let subjects = binding.get("subjects").cloned().unwrap_or(Value::Null);
            let wanted_ref =
                json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name});
            let wanted_subjects = json!([{"kind": "ServiceAccount", "name": account_name, "namespace": text(cr, "/metadata/namespace")}]);
            if role_ref != wanted_ref || subjects != wanted_subjects {
                found.push(format!(
                    "RoleBinding {} binds {role_ref} to {subjects}, not Role {role_name} to ServiceAccount {account_name} (R-RBAC-2)",
                    text(binding, "/metadata/name").unwrap_or_default()
                ));
            }
        }
    }
    if let Some(deployment) = the_child(around, "Deployment", expected, &mut found) {
        found.extend(deployment_findings(
            cr,
            expected,
            deployment,
            account_name,
            around.control_plane.as_ref(),
        ));
    }
    found
}

/// R-RBAC-1: the same rules, whatever the order of the lists inside each rule.
fn same_rules(actual: &Value, wanted: &Value) -> bool {
    let normalise = |rules: &Value| -> Vec<BTreeMap<String, Vec<String>>> {
        rules
            .as_array()
            .into_iter()
            .flatten()
            .map(|rule| {
                rule.as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(key, list)| {
                        let mut items: Vec<String> = list
                            .as_array()?
                            .iter()
                            .map(|v| v.as_str().unwrap_or_default().to_owned())
                            .collect();
                        items.sort();
                        (!items.is_empty()).then(|| (key.clone(), items))
                    })
                    .collect()
            })
            .collect()
    };
    normalise(actual) == normalise(wanted)
}

fn deployment_findings(
    cr: &Value,
    expected: &Expected,
    deployment: &Value,
    account: &str,
    control_plane: Option<&Value>,
) -> Vec<String> {
    let mut found = Vec::new();
    let name = text(deployment, "/metadata/name")
        .unwrap_or_default()
        .to_owned();
    let mut problem =
        |rule: &str, what: String| found.push(format!("Deployment {name}: {what} ({rule})"));
    let replicas = cr
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let actual_replicas = deployment
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    if actual_replicas != replicas {
        problem(
            "R-POD-1",
            format!("spec.replicas is {actual_replicas}, the CR asks for {replicas}"),
        );
    }
    let labels = deployment
        .pointer("/spec/template/metadata/labels")
        .cloned()
        .unwrap_or(Value::Null);
    let selector = deployment
        .pointer("/spec/selector/matchLabels")
        .cloned()
        .unwrap_or(Value::Null);
    let standard = |labels: &Value| {
        labels.as_object().is_some_and(|l| {
            l.len() == 3
                && l.get("app.kubernetes.io/name").and_then(Value::as_str)
                    == Some("coder-provisioner")
                && l.get("app.kubernetes.io/instance").is_some()
                && l.get("app.kubernetes.io/managed-by").is_some()
        })
    };
    if !standard(&labels) || selector != labels {
        problem(
            "R-POD-2",
            format!(
                "selector {selector} and pod labels {labels} are not both exactly the three standard labels"
            ),
        );
    }
    let pod = deployment
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or(Value::Null);
    let pod_account = text(&pod, "/serviceAccountName").unwrap_or_default();
    if pod_account != account {
        problem(
            "R-POD-4",
            format!(
                "serviceAccountName is {pod_account:?}, not the provisioner's ServiceAccount {account:?}"
            ),
        );
    }
    let pull = |v: Option<&Value>| {
        v.filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
            .cloned()
            .unwrap_or(json!([]))
    };
    let wanted_pull = pull(cr.pointer("/spec/imagePullSecrets"));
    let actual_pull = pull(pod.get("imagePullSecrets"));
    if actual_pull != wanted_pull {
        problem(
            "R-POD-5",
            format!("imagePullSecrets are {actual_pull}, the CR asks for {wanted_pull}"),
        );
    }
    let grace = cr
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(600);
    let actual_grace = pod
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    if actual_grace != grace {
        problem(
            "R-POD-6",
            format!("terminationGracePeriodSeconds is {actual_grace}, not {grace}"),
        );
    }
    let containers = pod
        .get("containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let [container] = containers.as_slice() else {
        problem(
            "R-POD-7",
            format!("{} containers, not exactly one", containers.len()),
        );
        return found;
    };
    if text(container, "/name") != Some("provisioner") {
        problem(
            "R-POD-7",
            format!(
                "the container is named {:?}, not \"provisioner\"",
                text(container, "/name")
            ),
        );
    }
    let image = given(cr, "/spec/image")
        .or_else(|| control_plane.and_then(|cp| given(cp, "/spec/image")))
        .unwrap_or(DEFAULT_IMAGE);
    if text(container, "/image") != Some(image) {
        problem(
            "R-POD-8",
            format!(
                "the image is {:?}, not {image:?}",
                text(container, "/image")
            ),
        );
    }
    if container.get("command") != Some(&json!(["coder"])) {
        problem(
            "R-POD-9",
            format!(
                "the command is {}, not [\"coder\"]",
                container.get("command").unwrap_or(&Value::Null)
            ),
        );
    }
    let mut args = vec![json!("provisioner"), json!("start")];
    args.extend(
        cr.pointer("/spec/extraArgs")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    );
    let actual_args = container.get("args").cloned().unwrap_or(json!([]));
    if actual_args != Value::Array(args.clone()) {
        problem(
            "R-POD-10",
            format!("the args are {actual_args}, not {}", Value::Array(args)),
        );
    }
    let env = container
        .get("env")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let url = control_plane
        .and_then(|cp| text(cp, "/status/url"))
        .unwrap_or_default();
    let first = env.first().map(without_defaults);
    if first != Some(json!({"name": "CODER_URL", "value": url})) {
        problem(
            "R-POD-11",
            format!(
                "the first env var is {}, not CODER_URL={url}",
                first.unwrap_or(Value::Null)
            ),
        );
    }
    let secret_name = text(cr, "/status/secretRef/name").unwrap_or_default();
    let wanted_key = json!({"name": "CODER_PROVISIONER_DAEMON_KEY", "valueFrom": {"secretKeyRef": {"name": secret_name, "key": expected.secret_key}}});
    let second = env.get(1).map(without_defaults);
    if second.as_ref() != Some(&wanted_key) {
        problem(
            "R-POD-12",
            format!(
                "the second env var is {}, not {wanted_key}",
                second.unwrap_or(Value::Null)
            ),
        );
    }
    let extra: Vec<Value> = cr
        .pointer("/spec/extraEnv")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let rest: Vec<Value> = env.iter().skip(2).map(without_defaults).collect();
    let wanted_rest: Vec<Value> = extra.iter().map(without_defaults).collect();
    if rest != wanted_rest {
        problem(
            "R-POD-13",
            format!(
                "the env after the first two is {}, not spec.extraEnv {}",
                Value::Array(rest),
                Value::Array(wanted_rest)
            ),
        );
    }
    let injected = |name: &str| {
        env.iter().skip(2).any(|e| text(e, "/name") == Some(name))
            && !extra.iter().any(|e| text(e, "/name") == Some(name))
    };
    let extra_args: Vec<&str> = cr
        .pointer("/spec/extraArgs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let arg_injected = |prefix: &str| {
        actual_args
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|a| a.starts_with(prefix) && !extra_args.contains(&a))
    };
    if injected("CODER_ORGANIZATION") || arg_injected("--org") {
        problem(
            "R-POD-14",
            "the operator injects an organization into the daemon".to_owned(),
        );
    }
    if injected("CODER_PROVISIONERD_TAGS") || arg_injected("--tag") {
        problem(
            "R-POD-15",
            "the operator injects tags into the daemon".to_owned(),
        );
    }
    let resources = cr.pointer("/spec/resources").cloned().unwrap_or(json!({}));
    let actual_resources = container.get("resources").cloned().unwrap_or(json!({}));
    if !same_quantities(
        &without_empty(&actual_resources),
        &without_empty(&resources),
    ) {
        problem(
            "R-POD-16",
            format!("resources are {actual_resources}, the CR asks for {resources}"),
        );
    }
    found
}

/// Drops what the API server adds by default to an env entry (`optional: false` absent vs set).
fn without_defaults(entry: &Value) -> Value {
    let mut entry = entry.clone();
    for reference in ["secretKeyRef", "configMapKeyRef"] {
        if let Some(object) = entry
            .pointer_mut(&format!("/valueFrom/{reference}"))
            .and_then(Value::as_object_mut)
            && object.get("optional") != Some(&json!(true))
        {
            object.remove("optional");
        }
    }
    if let Some(field) = entry
        .pointer_mut("/valueFrom/fieldRef")
        .and_then(Value::as_object_mut)
        && field.get("apiVersion") == Some(&json!("v1"))
    {
        field.remove("apiVersion");
    }
    if let Some(field) = entry
        .pointer_mut("/valueFrom/resourceFieldRef")
        .and_then(Value::as_object_mut)
        && field
            .get("divisor")
            .is_some_and(|d| d == &json!("0") || d == &json!(0))
    {
        field.remove("divisor");
    }
    // The API server drops an empty value (`omitempty`): `value: ""` and no value are one.
    if let Some(object) = entry.as_object_mut()
        && object.get("value") == Some(&json!(""))
    {
        object.remove("value");
    }
    entry
}

/// Removes empty maps (`limits: {}` means no limits).
fn without_empty(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.as_object().is_some_and(|o| o.is_empty()) && !v.is_null())
                .map(|(k, v)| (k.clone(), without_empty(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Resource maps compared by quantity value (`0.5` = `500m`, `1Gi` = `1024Mi`).
fn same_quantities(actual: &Value, wanted: &Value) -> bool {
    match (actual, wanted) {
        (Value::Object(a), Value::Object(w)) => {
            a.len() == w.len()
                && w.iter()
                    .all(|(k, v)| a.get(k).is_some_and(|av| same_quantities(av, v)))
        }
        (a, w) => {
            let (a, w) = (scalar(a), scalar(w));
            a == w
                || matches!((quantity(&a), quantity(&w)), (Some(x), Some(y)) if (x - y).abs() <= 1e-9 * x.abs().max(1.0))
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A Kubernetes quantity as a number (the suffixes scenarios use).
fn quantity(text: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 11] = [
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("u", 1e-6),
        ("n", 1e-9),
    ];
    let (number, factor) = SUFFIXES
        .iter()
        .find_map(|(suffix, factor)| text.strip_suffix(suffix).map(|n| (n, *factor)))
        .unwrap_or((text, 1.0));
    number.parse::<f64>().ok().map(|n| n * factor)
}

#[cfg(test)]
mod tests;
