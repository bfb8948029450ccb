//! The reference operator, located (or built) by `OperatorCommand::reference()`, runs on a local
//! control plane with nothing but the rights in `config/rbac/` and reconciles: its first pass on
//! a CoderProvisioner adds the cleanup finalizer (R-PRE-1).
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use conformance::cluster::local::{LocalControlPlane, LocalOptions};
use conformance::implementation::{OperatorCommand, OperatorProcess, OperatorUnderTest};
use conformance::manifests::{self, ApplyOptions};
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};

const DEADLINE: Duration = Duration::from_secs(60);
const FINALIZER: &str = "coder.com/provisioner-key-cleanup";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_operator_reconciles_with_only_its_rbac() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let plane = LocalControlPlane::start(LocalOptions::default()).await?;
    let admin = plane.admin_client().await?;
    manifests::install_crds(&admin, &repo.join("config/crd")).await?;
    let mut operator = OperatorProcess::start(
        &admin,
        plane.endpoint(),
        OperatorUnderTest::new(OperatorCommand::reference().await?),
    )
    .await?;
    assert_eq!(
        operator.service_account(),
        ("coder-system", "coder-provisioner-operator")
    );

    let sample = ApplyOptions {
        namespace: Some("coder".to_owned()),
        ..ApplyOptions::default()
    };
    manifests::apply_yaml_str(
        &admin,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: coder}\n",
        &sample,
    )
    .await?;
    let provisioner =
        std::fs::read_to_string(repo.join("config/samples/coder_v1alpha1_coderprovisioner.yaml"))?;
    manifests::apply_yaml_str(&admin, &provisioner, &sample).await?;

    let api: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        "coder",
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "coder.com",
            "v1alpha1",
            "CoderProvisioner",
        )),
    );
    let deadline = Instant::now() + DEADLINE;
    loop {
        let cr = api.get("coderprovisioner-sample").await?;
        if cr
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
        {
            break;
        }
        if !operator.is_running() || Instant::now() >= deadline {
            bail!("no finalizer; operator log:\n{}", operator.log_tail(40));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(operator.is_running(), "{}", operator.log_tail(40));
    operator.stop().await;
    Ok(())
}
