//! The suite's infrastructure on a real local control plane: manifests (apply, dry run, CRDs,
//! delete), the operator process (ServiceAccount identity, logs, restart, kill) and the
//! readiness simulator (contract D-8).
use std::path::{Path, PathBuf};

use anyhow::Context;
use common::eventually_equals;
use conformance::cluster::children::is_alive;
use conformance::cluster::local::{LocalControlPlane, LocalOptions};
use conformance::implementation::{OperatorCommand, OperatorProcess, OperatorUnderTest};
use conformance::kubelet::{ReadinessSimulator, WatchScope};
use conformance::manifests::{self, ApplyOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

mod common;

const NAMESPACE: &str = "tools";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infrastructure_works_on_a_local_control_plane() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plane = LocalControlPlane::start(LocalOptions::default()).await?;
    let admin = plane.admin_client().await?;
    check_manifests(&admin).await.context("manifests")?;
    check_operator_process(&plane, &admin)
        .await
        .context("operator process")?;
    check_readiness_simulator(&admin)
        .await
        .context("readiness simulator")?;
    Ok(())
}

async fn check_manifests(admin: &kube::Client) -> anyhow::Result<()> {
    let crds = manifests::install_crds(admin, &fixtures().join("crds")).await?;
    assert_eq!(crds, ["widgets.example.com"]);

    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("objects.yaml"),
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n---\n\
             apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: small}}\nspec: {{size: 3}}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings}}\ndata: {{a: b}}\n"
        ),
    )?;
    let applied = manifests::apply_dir(admin, dir.path(), Some(NAMESPACE)).await?;
    let shown: Vec<String> = applied.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "Namespace tools",
            "Widget tools/small",
            "ConfigMap tools/settings"
        ]
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        NAMESPACE,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget")),
    );
    assert_eq!(widgets.get("small").await?.data["spec"]["size"], 3);

    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let dry_run = ApplyOptions {
        namespace: Some(NAMESPACE.to_owned()),
        dry_run: true,
        ..ApplyOptions::default()
    };
    manifests::apply_yaml_str(
        admin,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ghost}\n",
        &dry_run,
    )
    .await?;
    assert!(
        config_maps.get_opt("ghost").await?.is_none(),
        "a dry run stored an object"
    );
    let too_big =
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: big}\nspec: {size: 11}\n";
    let error = manifests::apply_yaml_str(admin, too_big, &dry_run)
        .await
        .expect_err("schema violation accepted");
    assert!(
        format!("{error:#}").contains("applying Widget tools/big (server-side dry run)"),
        "{error:#}"
    );

    manifests::delete_dir(admin, dir.path(), Some(NAMESPACE)).await?;
    assert!(config_maps.get_opt("settings").await?.is_none());
    // Deleting again is fine: the objects are already gone.
    manifests::delete_dir(admin, dir.path(), Some(NAMESPACE)).await?;
    // The namespace itself is deleted by the controller manager; recreate it for what follows.
    eventually_equals("the namespace is gone (exists)", false, || {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
        async move { Ok(api.get_opt(NAMESPACE).await?.is_some()) }
    })
    .await?;
    manifests::apply_yaml_str(
        admin,
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n"),
        &ApplyOptions::default(),
    )
    .await?;
    Ok(())
}

async fn check_operator_process(
    plane: &LocalControlPlane,
    admin: &kube::Client,
) -> anyhow::Result<()> {
    let script = r#""$KUBECTL" auth whoami -o jsonpath='{.status.userInfo.username}'; echo
echo "configmaps=$("$KUBECTL" auth can-i list configmaps -A)"
echo "secrets=$("$KUBECTL" auth can-i list secrets -A)"
echo "watch=$WATCH_NAMESPACE"
exec sleep 600"#;
    let mut spec = OperatorUnderTest::new(OperatorCommand::from_shell(script)?);
    spec.rbac_dir = fixtures().join("rbac");
    spec.namespace = "op-system".to_owned();
    spec.watch_namespace = Some(NAMESPACE.to_owned());
    spec.extra_env = vec![("KUBECTL".to_owned(), plane.kubectl().display().to_string())];
    let mut operator = OperatorProcess::start(admin, plane.endpoint(), spec).await?;
    assert_eq!(operator.service_account(), ("op-system", "test-operator"));

    let log_has = |operator: &OperatorProcess, text: &str, times: usize| {
        operator.full_log().matches(text).count() >= times
    };
    eventually_equals("the operator prints its watch namespace", true, || async {
        Ok(log_has(&operator, "watch=tools", 1))
    })
    .await
    .with_context(|| format!("log:\n{}", operator.full_log()))?;
    let log = operator.full_log();
    assert!(
        log.contains("system:serviceaccount:op-system:test-operator"),
        "{log}"
    );
    assert!(
        log.contains("configmaps=yes"),
        "only the RBAC folder's rights: {log}"
    );
    assert!(
        log.contains("secrets=no"),
        "only the RBAC folder's rights: {log}"
    );
    assert!(
        operator.log_tail(1).contains("watch=tools"),
        "{}",
        operator.log_tail(1)
    );
    assert!(operator.is_running());

    let first_pid = operator.pid().context("pid")?;
    operator.restart().await?;
    assert!(
        !is_alive(first_pid),
        "the first process survived the restart"
    );
    assert_eq!(operator.starts(), 2);
    eventually_equals(
        "the restarted operator prints its watch namespace again",
        true,
        || async { Ok(log_has(&operator, "watch=tools", 2)) },
    )
    .await
    .with_context(|| format!("log:\n{}", operator.full_log()))?;
    assert!(operator.full_log().contains("=== start #2"));

    let second_pid = operator.pid().context("pid")?;
    operator.kill().await;
    assert!(!operator.is_running());
    assert!(!is_alive(second_pid));
    Ok(())
}

fn deployment(name: &str, replicas: i32, secret: &str) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "serviceAccountName": "runner",
                    "containers": [{
                        "name": "provisioner",
                        "image": "ghcr.io/coder/coder:latest",
                        "command": ["coder"],
                        "env": [{ "name": "KEY", "valueFrom": { "secretKeyRef": { "name": secret, "key": "key" } } }],
                    }],
                },
            },
        },
    }))?)
}

/// (ready replicas, status is for the current generation, Available condition status).
async fn ready_replicas(api: &Api<Deployment>, name: &str) -> anyhow::Result<(i32, bool, String)> {
    let d = api.get(name).await?;
    let status = d.status.unwrap_or_default();
    let current = status.observed_generation == d.metadata.generation;
    let available = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Available")
        .map(|c| c.status.clone())
        .unwrap_or_default();
    // The API server drops zero counts, so absent means 0.
    Ok((status.ready_replicas.unwrap_or(0), current, available))
}

fn state(ready: i32, available: &str) -> (i32, bool, String) {
    (ready, true, available.to_owned())
}

async fn check_readiness_simulator(admin: &kube::Client) -> anyhow::Result<()> {
    // A cluster with a Node has kubelets: the simulator refuses to run there.
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "real-node"}}))?,
        )
        .await?;
    let refused = ReadinessSimulator::start(admin.clone(), WatchScope::AllNamespaces).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("Nodes")));
    nodes.delete("real-node", &DeleteParams::default()).await?;

    let simulator = ReadinessSimulator::start(
        admin.clone(),
        WatchScope::Namespaces(vec![NAMESPACE.to_owned()]),
    )
    .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "runner"}}))?,
        )
        .await?;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let secret = |name: &str| -> anyhow::Result<Secret> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": name}, "stringData": {"key": "v"}}),
        )?)
    };
    secrets
        .create(&PostParams::default(), &secret("present")?)
        .await?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NAMESPACE);

    deployments
        .create(
            &PostParams::default(),
            &deployment("healthy", 2, "present")?,
        )
        .await?;
    eventually_equals("2 ready replicas", state(2, "True"), || {
        ready_replicas(&deployments, "healthy")
    })
    .await?;

    // A new generation (scale) is observed and reported.
    deployments
        .patch(
            "healthy",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await?;
    eventually_equals(
        "3 ready replicas at the new generation",
        state(3, "True"),
        || ready_replicas(&deployments, "healthy"),
    )
    .await?;

    // Pods that would need a missing Secret never become ready, until the Secret appears.
    deployments
        .create(&PostParams::default(), &deployment("waiting", 1, "later")?)
        .await?;
    eventually_equals(
        "the blocked Deployment reports 0 ready",
        state(0, "False"),
        || ready_replicas(&deployments, "waiting"),
    )
    .await?;
    secrets
        .create(&PostParams::default(), &secret("later")?)
        .await?;
    eventually_equals(
        "the unblocked Deployment becomes ready",
        state(1, "True"),
        || ready_replicas(&deployments, "waiting"),
    )
    .await?;
    assert!(simulator.patches() >= 4, "patches: {}", simulator.patches());
    simulator.stop().await;
    Ok(())
}
