//! The API resources of the contract's two kinds, for dynamic clients and watches.
use kube::core::{ApiResource, GroupVersionKind};

/// CoderProvisioner (`coder.com/v1alpha1`, `coderprovisioners`).
pub fn provisioner_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coder.com", "v1alpha1", "CoderProvisioner"),
        "coderprovisioners",
    )
}

/// CoderControlPlane (`coder.com/v1alpha1`, `codercontrolplanes`).
pub fn control_plane_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coder.com", "v1alpha1", "CoderControlPlane"),
        "codercontrolplanes",
    )
}
