//! `CoderControlPlane` (coder.com/v1alpha1): the parts a CoderProvisioner reads.
//!
//! This operator never writes control planes; the type exists so the provisioner can read the
//! status the control-plane operator (or a test) publishes, and so the CRD can be installed.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Coder control plane (coderd). Only `spec.image` is typed here; other spec fields are kept.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "coder.com",
    version = "v1alpha1",
    kind = "CoderControlPlane",
    plural = "codercontrolplanes",
    singular = "codercontrolplane",
    namespaced,
    status = "CoderControlPlaneStatus",
    doc = "CoderControlPlane is a Coder control plane (coderd) that CoderProvisioners connect to.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    // Raw form: a second `type_ = "string"` trips clippy's duplicated-attribute lint.
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".status.url"}"#,
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct CoderControlPlaneSpec {
    /// coderd image; also the default image of provisioner daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Status published for the control plane.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoderControlPlaneStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// URL at which coderd serves its API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Whether the operator token in `operatorTokenSecretRef` is usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_access_ready: Option<bool>,
    /// Secret holding the operator's coderd session token (data key default `token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_token_secret_ref: Option<OperatorTokenSecretRef>,
    /// `entitled`, `grace_period`, `not_entitled` or `unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_provisioner_daemons_entitlement: Option<String>,
    /// When the entitlement above was read from coderd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entitlements_last_checked: Option<Time>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Where the operator token lives. Both fields are optional in the schema so that a malformed
/// reference reaches the provisioner's gates (and a clear condition) instead of failing decoding.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct OperatorTokenSecretRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}
