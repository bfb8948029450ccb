//! `CoderProvisioner` (coder.com/v1alpha1): runs external provisioner daemons for a control plane.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, LocalObjectReference, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a set of external provisioner daemons.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "coder.com",
    version = "v1alpha1",
    kind = "CoderProvisioner",
    plural = "coderprovisioners",
    singular = "coderprovisioner",
    namespaced,
    status = "CoderProvisionerStatus",
    doc = "CoderProvisioner runs Coder external provisioner daemons that authenticate with a provisioner key the operator manages.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.readyReplicas"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CoderProvisionerSpec {
    /// The CoderControlPlane (same namespace) whose coderd the daemons connect to.
    pub control_plane_ref: ControlPlaneRef,
    /// Coder organization of the provisioner key; empty means `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub organization_name: Option<String>,
    /// The provisioner key in coderd and the Secret that stores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<ProvisionerKeySpec>,
    /// Number of daemon pods; 1 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Tags attached to the provisioner key (a change rotates the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
    /// Daemon image; defaults to the control plane's image, then `ghcr.io/coder/coder:latest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Arguments appended after `provisioner start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_args: Option<Vec<String>>,
    /// Environment variables appended after CODER_URL and CODER_PROVISIONER_DAEMON_KEY.
    /// Secrets named by a secretKeyRef need the label `coder.com/credential=true` and the
    /// annotation `coder.com/credential-destinations` listing the control plane's origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_env: Option<Vec<EnvVar>>,
    /// Resources of the daemon container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Pull secrets for the daemon image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Grace period for daemon pods; 600 when unset so running builds can finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub termination_grace_period_seconds: Option<i64>,
}

/// Reference to a CoderControlPlane in the same namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ControlPlaneRef {
    /// Name of the CoderControlPlane.
    pub name: String,
}

/// Provisioner key settings (contract §1 R-CRD-6 with decision D-4).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProvisionerKeySpec {
    /// Key name in coderd (stored lower-case); defaults to the CoderProvisioner name.
    /// At most 64 characters of letters, digits, '.', '_' and '-', starting with a letter or digit,
    /// and not one of coderd's reserved names built-in, user-auth, psk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"))]
    #[x_kube(validation = Rule::new("!(self.lowerAscii() in ['built-in', 'user-auth', 'psk'])").message("spec.key.name must not be one of coderd's reserved key names: built-in, user-auth, psk"))]
    pub name: Option<String>,
    /// Secret that receives the key; defaults to `<name>-provisioner-key`. Must not exist unless
    /// this CoderProvisioner created it. A Secret name (DNS-1123 subdomain), checked at admission
    /// so that a key is never created for a Secret the API server would refuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub secret_name: Option<String>,
    /// Data key inside the Secret; defaults to `key`. A Secret data key: letters, digits, '-',
    /// '_' and '.'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub secret_key: Option<String>,
}

/// Observed state of the provisioner, its key and its Deployment.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoderProvisionerStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// `Pending` or `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(
        default,
        rename = "organizationID",
        skip_serializing_if = "Option::is_none"
    )]
    pub organization_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub organization_name: Option<String>,
    #[serde(
        default,
        rename = "provisionerKeyID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provisioner_key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioner_key_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref_name: Option<String>,
    #[serde(
        default,
        rename = "controlPlaneURL",
        skip_serializing_if = "Option::is_none"
    )]
    pub control_plane_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
}

/// A data key inside a Secret of the same namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}
