//! Where the suite gets a Kubernetes API from.
//!
//! - [`binaries`]: the pinned etcd / kube-apiserver / kube-controller-manager / kubectl binaries.
//! - [`local`]: a throw-away control plane (etcd + kube-apiserver + GC/namespace controllers)
//!   on loopback, with RBAC on and no kubelets.
//! - [`identity`]: ServiceAccount kubeconfigs, so an operator runs with only its declared RBAC.
//! - [`kubeconfig`] and [`pki`]: the pure parts (rendering kubeconfigs, generating certificates).
//! - [`children`]: child processes that never outlive the suite.
//! - [`in_cluster`]: an operator running in the cluster as a Deployment (kind, k3s, installed).
pub mod binaries;
pub mod children;
pub mod identity;
pub mod images;
pub mod in_cluster;
pub mod k3s;
pub mod kind;
pub mod kubeconfig;
pub mod local;
pub mod pki;

/// A real cluster the suite started, whichever tier; dropping it tears it down unless kept.
pub enum StartedCluster {
    Kind(Box<kind::KindCluster>),
    K3s(Box<k3s::K3sCluster>),
}

impl StartedCluster {
    pub fn provisioned(&self) -> &kind::ProvisionedCluster {
        match self {
            Self::Kind(cluster) => cluster.provisioned(),
            Self::K3s(cluster) => cluster.provisioned(),
        }
    }
}
