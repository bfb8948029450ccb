//! The status shape of the contract, which every observation of a CoderProvisioner keeps
//! (R-ST-1, R-ST-4, R-ST-9, R-CRD-12), whatever the scenario's steps (pure).
use serde_json::Value;

/// R-ST-9: condition types with their True reason and their False reasons.
/// `CredentialsReady`'s reasons are those of D-2.
const CONDITIONS: &[(&str, &[&str], &[&str])] = &[
    (
        "ControlPlaneReady",
        &["ControlPlaneAvailable"],
        &["ControlPlaneUnavailable"],
    ),
    (
        "OperatorAccessReady",
        &["OperatorAccessReady"],
        &[
            "OperatorAccessNotReady",
            "OperatorTokenSecretRefMissing",
            "OperatorTokenSecretRefInvalid",
            "OperatorTokenSecretUnavailable",
        ],
    ),
    (
        "ExternalProvisionersEntitled",
        &["Entitled"],
        &[
            "NotEntitled",
            "NotSupported",
            "Forbidden",
            "EntitlementsQueryFailed",
        ],
    ),
    (
        "ProvisionerKeyReady",
        &["ProvisionerKeyReady"],
        &["ProvisionerKeyFailed", "RateLimited"],
    ),
    (
        "ProvisionerKeySecretReady",
        &["SecretReady"],
        &["KeySecretNotOwned"],
    ),
    (
        "CredentialsReady",
        &["CredentialsValid"],
        &[
            "CredentialSecretNotFound",
            "CredentialLabelMissing",
            "CredentialDestinationMissing",
            "CredentialDestinationMismatch",
        ],
    ),
    (
        "DeploymentReady",
        &["MinimumReplicasReady"],
        &["NoReplicasReady"],
    ),
];

/// R-CRD-12: the status fields of the contract.
const STATUS_FIELDS: &[&str] = &[
    "observedGeneration",
    "readyReplicas",
    "phase",
    "conditions",
    "organizationID",
    "organizationName",
    "provisionerKeyID",
    "provisionerKeyName",
    "tagsHash",
    "controlPlaneRefName",
    "controlPlaneURL",
    "secretRef",
];

/// What in one observed CoderProvisioner breaks the status shape of the contract.
pub fn provisioner_invariants(cr: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let Some(status) = cr.get("status").and_then(Value::as_object) else {
        return found;
    };
    for field in status.keys() {
        if !STATUS_FIELDS.contains(&field.as_str()) {
            found.push(format!(
                "status has field {field:?}, which the contract does not define (R-CRD-12)"
            ));
        }
    }
    match status.get("phase").and_then(Value::as_str) {
        None | Some("Pending" | "Ready") => {}
        Some(other) => found.push(format!(
            "status.phase is {other:?}, not Pending or Ready (R-ST-1)"
        )),
    }
    let generation = cr.pointer("/metadata/generation").and_then(Value::as_i64);
    for condition in status
        .get("conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let text = |key: &str| {
            condition
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
        };
        let (kind, state, reason) = (text("type"), text("status"), text("reason"));
        match CONDITIONS.iter().find(|(name, _, _)| *name == kind) {
            None => found.push(format!(
                "condition type {kind:?} is not in the contract (R-ST-9)"
            )),
            Some((_, true_reasons, false_reasons)) => {
                let allowed = match state {
                    "True" => *true_reasons,
                    "False" => *false_reasons,
                    _ => &[],
                };
                if !allowed.contains(&reason) {
                    found.push(format!("condition {kind}={state} has reason {reason:?}, not one of {allowed:?} (R-ST-9)"));
                }
            }
        }
        let observed = condition.get("observedGeneration").and_then(Value::as_i64);
        if let (Some(observed), Some(generation)) = (observed, generation)
            && observed > generation
        {
            found.push(format!("condition {kind} observed generation {observed}, beyond metadata.generation {generation} (R-ST-4)"));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    fn cr(status: Value) -> Value {
        json!({"metadata": {"generation": 2}, "status": status})
    }

    #[rstest]
    #[case::healthy(json!({"phase": "Ready", "observedGeneration": 2, "conditions": [
        {"type": "DeploymentReady", "status": "True", "reason": "MinimumReplicasReady", "observedGeneration": 2},
        {"type": "ProvisionerKeyReady", "status": "False", "reason": "RateLimited"}]}), 0)]
    #[case::no_status(Value::Null, 0)]
    #[case::unknown_phase(json!({"phase": "Degraded"}), 1)]
    #[case::unknown_condition(json!({"conditions": [{"type": "Healthy", "status": "True", "reason": "Fine"}]}), 1)]
    #[case::false_reason_as_true(json!({"conditions": [{"type": "DeploymentReady", "status": "True", "reason": "NoReplicasReady"}]}), 1)]
    #[case::unknown_status_field(json!({"lastError": "boom"}), 1)]
    #[case::future_generation(json!({"conditions": [
        {"type": "DeploymentReady", "status": "True", "reason": "MinimumReplicasReady", "observedGeneration": 3}]}), 1)]
    fn status_shape_is_checked(#[case] status: Value, #[case] violations: usize) {
        let cr = if status.is_null() {
            json!({"metadata": {}})
        } else {
            cr(status)
        };
        assert_eq!(provisioner_invariants(&cr).len(), violations, "{cr}");
    }
}
