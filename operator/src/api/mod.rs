//! The CRD types (`CoderProvisioner`, `CoderControlPlane`), condition vocabulary and CRD YAML.
mod conditions;
mod control_plane;
mod provisioner;

pub use conditions::*;
pub use control_plane::*;
pub use provisioner::*;

use kube::CustomResourceExt;

/// The committed CRD manifests: (file name under `config/crd/`, YAML).
pub fn crd_files() -> Vec<(&'static str, String)> {
    vec![
        (
            "coder.com_codercontrolplanes.yaml",
            to_yaml(&CoderControlPlane::crd()),
        ),
        (
            "coder.com_coderprovisioners.yaml",
            to_yaml(&CoderProvisioner::crd()),
        ),
    ]
}

/// Both CRDs as one multi-document YAML stream (deterministic; what `crd` prints).
pub fn crds_yaml() -> String {
    crd_files()
        .into_iter()
        .map(|(_, yaml)| yaml)
        .collect::<Vec<_>>()
        .join("")
}

fn to_yaml(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> String {
    // Serializing a typed CRD cannot fail (no maps with non-string keys); fall back to JSON,
    // which is valid YAML, rather than panicking if the serializer ever disagrees.
    let body = serde_saphyr::to_string(crd)
        .unwrap_or_else(|_| serde_json::to_string_pretty(crd).unwrap_or_default());
    format!("---\n{body}")
}
