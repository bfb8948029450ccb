//! The local control plane with the real binaries (built or cached by scripts/k8s-binaries.sh):
//! it serves a ready API with RBAC enforced, kubectl works with its kubeconfig, garbage
//! collection and namespace deletion happen, and dropping it leaves no process or file behind.
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::eventually_equals;
use conformance::cluster::children::is_alive;
use conformance::cluster::in_cluster::InClusterOperator;
use conformance::cluster::kubeconfig::client_from_file;
use conformance::cluster::local::{LocalControlPlane, LocalOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

mod common;

fn config_map(name: &str, owner: Option<&ConfigMap>) -> anyhow::Result<ConfigMap> {
    let mut value = json!({ "metadata": { "name": name } });
    if let Some(owner) = owner {
        value["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": owner.metadata.name,
            "uid": owner.metadata.uid,
        }]);
    }
    Ok(serde_json::from_value(value)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_control_plane_behaves_like_a_cluster_and_leaves_nothing_behind() -> anyhow::Result<()>
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plane = LocalControlPlane::start(LocalOptions::default()).await?;
    eprintln!(
        "local control plane cold start: {:?}",
        plane.startup_duration()
    );
    assert!(plane.has_controller_manager());
    let pids = plane.child_pids();
    assert_eq!(
        pids.len(),
        3,
        "etcd, kube-apiserver, kube-controller-manager"
    );
    let dir = plane.dir().to_path_buf();
    let admin = plane.admin_client().await?;

    // /readyz answers ok.
    let readyz = admin
        .request_text(http::Request::get("/readyz").body(Vec::new())?)
        .await?;
    assert_eq!(readyz.trim(), "ok");

    // RBAC is enforced: an authenticated user without bindings is forbidden.
    let nobody = client_from_file(&plane.user_kubeconfig("nobody", &[])?).await?;
    match Api::<Namespace>::all(nobody)
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => bail!("a user without rights listed namespaces: {other:?}"),
    }

    // The real kubectl works with the generated kubeconfig.
    let output = tokio::process::Command::new(plane.kubectl())
        .arg("--kubeconfig")
        .arg(plane.kubeconfig_path())
        .args(["get", "namespaces", "-o", "name"])
        .output()
        .await
        .context("running kubectl")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("namespace/kube-system"), "{stdout}");

    // Garbage collection: a dependent disappears after its owner is deleted.
    let gc_started = Instant::now();
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let owner = config_maps
        .create(&PostParams::default(), &config_map("owner", None)?)
        .await?;
    config_maps
        .create(
            &PostParams::default(),
            &config_map("dependent", Some(&owner))?,
        )
        .await?;
    config_maps
        .delete("owner", &DeleteParams::background())
        .await?;
    eventually_equals(
        "the dependent ConfigMap is garbage-collected (exists)",
        false,
        || {
            let api = config_maps.clone();
            async move { Ok(api.get_opt("dependent").await?.is_some()) }
        },
    )
    .await?;

    eprintln!("garbage collection took {:?}", gc_started.elapsed());

    // Namespace deletion finishes (the namespace controller empties it).
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "doomed"}}))?,
        )
        .await?;
    Api::<ConfigMap>::namespaced(admin.clone(), "doomed")
        .create(&PostParams::default(), &config_map("content", None)?)
        .await?;
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await?;
    eventually_equals("the deleted namespace disappears (exists)", false, || {
        let api = namespaces.clone();
        async move { Ok(api.get_opt("doomed").await?.is_some()) }
    })
    .await?;

    // Dropping stops every process and removes the scratch folder.
    drop(admin);
    let stopping = Instant::now();
    drop(plane);
    eprintln!("local control plane stop: {:?}", stopping.elapsed());
    for pid in &pids {
        assert!(!is_alive(*pid), "child {pid} still alive after drop");
    }
    let children = std::process::Command::new("pgrep")
        .args(["-l", "-P", &std::process::id().to_string()])
        .output()
        .context("running pgrep")?;
    let listed = String::from_utf8_lossy(&children.stdout);
    for name in ["etcd", "kube-apiserver", "kube-controller"] {
        assert!(!listed.contains(name), "{name} survived the drop: {listed}");
    }
    assert!(!dir.exists(), "{} was not removed", dir.display());
    Ok(())
}

/// `--operator installed --operator-deployment NS/NAME`: the suite reads the operator's Deployment
/// (identity, pod selector, replicas to restore) and stops it by scaling to 0. No kubelet runs
/// here, so no pod exists and a stop returns once the scale is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installed_operator_is_read_from_its_deployment_and_scaled_to_zero() -> anyhow::Result<()>
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plane = LocalControlPlane::start(LocalOptions::default()).await?;
    let admin = plane.admin_client().await?;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "vendor-system" } }))?,
        )
        .await?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "vendor-system");
    let labels = json!({ "app": "vendor-operator" });
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "vendor-operator" },
                "spec": {
                    "replicas": 2,
                    "selector": { "matchLabels": labels },
                    "template": {
                        "metadata": { "labels": labels },
                        "spec": {
                            "serviceAccountName": "vendor",
                            "containers": [{ "name": "manager", "image": "vendor:1" }],
                        },
                    },
                },
            }))?,
        )
        .await?;

    let operator = InClusterOperator::from_live(&admin, "vendor-system/vendor-operator").await?;
    assert_eq!(
        (
            operator.namespace.as_str(),
            operator.deployment.as_str(),
            operator.service_account.as_str(),
            operator.selector.as_str(),
            operator.replicas,
        ),
        (
            "vendor-system",
            "vendor-operator",
            "vendor",
            "app=vendor-operator",
            2
        )
    );
    operator.stop(&admin, Duration::from_secs(30)).await?;
    let scaled = deployments.get("vendor-operator").await?;
    assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(0));
    assert_eq!(operator.logs(&admin, Some(10)).await?, "", "no pod, no log");

    let missing = InClusterOperator::from_live(&admin, "vendor-system/absent")
        .await
        .expect_err("no such Deployment");
    assert!(
        format!("{missing:#}").contains("does not exist"),
        "{missing:#}"
    );
    let malformed = InClusterOperator::from_live(&admin, "vendor-operator")
        .await
        .expect_err("no namespace");
    assert!(
        format!("{malformed:#}").contains("NAMESPACE/NAME"),
        "{malformed:#}"
    );
    Ok(())
}
